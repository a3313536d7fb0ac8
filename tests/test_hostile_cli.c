/* SPDX-License-Identifier: MIT
 * Hostile but readable snapshots through the CLI (issue #35 items 7, 8, 9): built here, written
 * as memsnap msgpack and as a PyTorch pickle, then given to `memsnap`. Under `make test
 * SANITIZE=1` a signed overflow in the command aborts it (UBSan), which these tests see as a
 * failed run; in every build they check the printed numbers.
 *  - stats (text, --summary, --json) sums sizes of up to 2^64 - 1 exactly (it summed in int64_t:
 *    the release build printed "allocated": -2 or 0);
 *  - stats refuses to draw a segment of 2^64 - 1 bytes, naming the file and the limit (it asked
 *    for about 7 TB and said "out of memory");
 *  - timeline and top format a time of -2^63 (the formatter negated it);
 *  - `memsnap run` on a full disk names the snapshot's path once (item 15).
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "model/snapbuild.h"

typedef struct blk_s {
  uint64_t size, requested;
  ms_block_state state;
} blk_t;

/* One segment at addr tiled by blks, and (when ntr) a one-device trace of allocs at the
 * allocated blocks, with times. */
static ms_snapshot_t *build(uint64_t addr, const blk_t *blks, size_t n, const int64_t *times,
                            size_t ntr) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = addr;
  g.stack = MS_SNAP_NO_STACK;
  g.is_large = true;
  g.present = MS_SEG_HAS_SEGMENT_TYPE;
  g.first_block = 0;
  uint64_t at = addr;
  for (size_t i = 0; i < n; i++) {
    ms_snap_block_t bl;
    memset(&bl, 0, sizeof bl);
    bl.address = at;
    bl.size = blks[i].size;
    bl.requested_size = blks[i].requested;
    bl.state = blks[i].state;
    bl.state_name = ms_block_state_name(bl.state);
    bl.stack = MS_SNAP_NO_STACK;
    bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
    cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
    g.total_size += bl.size;
    at += bl.size;
  }
  g.nblocks = (uint32_t)n;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  at = addr;
  for (size_t i = 0; i < n && d.ntrace < ntr; i++) {
    if (blks[i].state == MS_BLOCK_ACTIVE_ALLOCATED) {
      ms_snap_trace_t t;
      memset(&t, 0, sizeof t);
      t.action = MS_TRACE_ALLOC;
      t.addr = at;
      t.size = blks[i].size;
      t.time_us = times[d.ntrace];
      t.present = MS_TRACE_HAS_TIME;
      t.stack = MS_SNAP_NO_STACK;
      cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
      d.ntrace++;
    }
    at += blks[i].size;
  }
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

/* Writes s (then freed) as NAME.msgpack and NAME.pickle in th_workdir. */
static void write_both(ms_snapshot_t *s, const char *name) {
  char p[400];
  ms_errbuf_t eb = {{0}};
  snprintf(p, sizeof p, "%s/%s.msgpack", th_workdir, name);
  cr_assert_eq(ms_snapshot_write_file(s, p, NULL, &eb), MS_OK, "%s", eb.msg);
  snprintf(p, sizeof p, "%s/%s.pickle", th_workdir, name);
  cr_assert_eq(ms_pickle_write_file(s, p, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
}

TestSuite(hostile_cli, .init = th_workdir_setup, .fini = th_workdir_teardown, .timeout = 120);

#define E63 ((uint64_t)1 << 63)

/* Two 512-byte blocks whose requested sizes are 2^63 each (allocated: 2^64, past int64_t) and one
 * of 2^64 - 1 (internal free: 512 - (2^64 - 1), negative), in a segment too small to draw. */
Test(hostile_cli, stats_sums_past_int64_exactly) {
  const blk_t blks[] = {{512, E63, MS_BLOCK_ACTIVE_ALLOCATED},
                        {512, E63, MS_BLOCK_ACTIVE_ALLOCATED},
                        {512, UINT64_MAX, MS_BLOCK_ACTIVE_ALLOCATED},
                        {1536, 0, MS_BLOCK_INACTIVE}};
  write_both(build(0x7f0000000000, blks, 4, NULL, 0), "sums");
  static const char *const files[] = {"sums.msgpack", "sums.pickle"};
  for (int f = 0; f < 2; f++) {
    th_run_t r = TH_RUN("stats", files[f], "--json");
    cr_expect_eq(r.status, 0, "%s: %s", files[f], r.err);
    /* 2^63 + 2^63 + 2^64 - 1 = 2^65 - 1; internal 3 x 512 - that */
    cr_expect(strstr(r.out, "\"allocated\": 36893488147419103231"), "%s: %s", files[f], r.out);
    cr_expect(strstr(r.out, "\"free_internal\": -36893488147419101695"), "%s: %s", files[f],
              r.out);
    cr_expect(strstr(r.out, "\"total_allocated\": 36893488147419103231"), "%s", r.out);
    cr_expect(strstr(r.out, "\"total_reserved\": 3072,"), "%s", r.out);
    th_run_free(&r);
    r = TH_RUN("stats", files[f]);
    cr_expect_eq(r.status, 0, "%s: %s", files[f], r.err);
    cr_expect(strstr(r.out, "total_allocated: 32.0EiB\n"), "%s: %s", files[f], r.out);
    /* 1.5 KiB external + (1.5 KiB - (2^65 - 1)) internal, as Python sums them */
    cr_expect(strstr(r.out, "total_free: -32.0EiB (100.0% internal)"), "%s: %s", files[f], r.out);
    th_run_free(&r);
    r = TH_RUN("stats", files[f], "--summary");
    cr_expect_eq(r.status, 0, "%s: %s", files[f], r.err);
    cr_expect(strstr(r.out, "requested memory"), "%s", r.out);
    cr_expect(strstr(r.out, "32.0EiB"), "%s: %s", files[f], r.out);
    th_run_free(&r);
  }
}

/* A segment of 2^64 - 1 bytes (one free block): the map would take 2^64 / 20 MiB pages. */
Test(hostile_cli, stats_refuses_a_segment_too_large_to_draw) {
  const blk_t blks[] = {{UINT64_MAX, 0, MS_BLOCK_INACTIVE}};
  write_both(build(0, blks, 1, NULL, 0), "huge");
  th_run_t r = TH_RUN("stats", "huge.msgpack");
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, "memsnap: error: 'huge.msgpack': the segment at 0x0 is 16.0EiB "
                          "(18446744073709551615 bytes): stats draws a segment of 16.0TiB at "
                          "most"),
            "%s", r.err);
  th_run_free(&r);
  r = TH_RUN("stats", "huge.pickle", "--json"); /* --json draws nothing: exact numbers */
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "\"total_size\": 18446744073709551615"), "%s", r.out);
  cr_expect(strstr(r.out, "\"total_free_external\": 18446744073709551615"), "%s", r.out);
  th_run_free(&r);
}

/* stats with several files (cli/ranks.c) printed sizes of 2^63 bytes and more through int64_t:
 * "-1.0B" for a segment of 2^64 - 1 bytes. */
Test(hostile_cli, stats_of_several_files_prints_huge_sizes_unsigned) {
  const blk_t blks[] = {{UINT64_MAX, 0, MS_BLOCK_INACTIVE}};
  write_both(build(0, blks, 1, NULL, 0), "huge");
  th_run_t r = TH_RUN("stats", "huge.msgpack", "huge.pickle");
  cr_expect_eq(r.status, 0, "%s", r.err);
  cr_expect(strstr(r.out, "16.0EiB"), "%s", r.out);
  cr_expect_null(strstr(r.out, "-1.0B"), "%s", r.out);
  th_run_free(&r);
}

/* An alloc at time -2^63: the peak's moment is printed as t=, not negated. */
Test(hostile_cli, times_of_int64_min_are_printed) {
  const blk_t blks[] = {{1 << 20, 1 << 20, MS_BLOCK_ACTIVE_ALLOCATED},
                        {1 << 20, 1 << 20, MS_BLOCK_ACTIVE_ALLOCATED}};
  const int64_t times[] = {INT64_MIN, INT64_MAX};
  write_both(build(0x7f0000000000, blks, 2, times, 2), "times");
  static const char *const files[] = {"times.msgpack", "times.pickle"};
  for (int f = 0; f < 2; f++) {
    th_run_t r = TH_RUN("timeline", files[f]);
    cr_expect_eq(r.status, 0, "%s: %s", files[f], r.err);
    /* -2^63 us = -9223372036854.775808 s: floor -9223372036855 s and 224192 us (the negation
     * printed "294247-01-10 04:00:53.1775808") */
    cr_expect(strstr(r.out, "first entry: -290308-12-21 19:59:05.224192 UTC "
                            "(t=-9223372036854775808)\n"),
              "%s: %s", files[f], r.out);
    cr_expect(strstr(r.out, "duration: 18446744073709."), "%s: %s", files[f], r.out);
    th_run_free(&r);
    r = TH_RUN("top", files[f], "--at", "0");
    cr_expect_eq(r.status, 0, "%s: %s", files[f], r.err);
    cr_expect(strstr(r.out, "t=-9223372036854775808"), "%s: %s", files[f], r.out);
    th_run_free(&r);
  }
}

/* `memsnap run` on a full disk: the warning names the snapshot's path once (issue #35 item 15:
 * "cannot write 'P': cannot write 'P': No space left on device"). */
Test(hostile_cli, run_on_a_full_disk_names_the_path_once) {
  char small[400], pattern[500], filler[500];
  snprintf(small, sizeof small, "%s/small", th_workdir);
  cr_assert_eq(mkdir(small, 0755), 0);
  if (mount("tmpfs", small, "tmpfs", 0, "size=64k") != 0) {
    printf("SKIP run_on_a_full_disk_names_the_path_once: cannot mount a small tmpfs (%s)\n",
           strerror(errno));
    rmdir(small);
    return;
  }
  snprintf(filler, sizeof filler, "%s/filler", small);
  int fd = open(filler, O_WRONLY | O_CREAT, 0644);
  static const char page[4096];
  while (fd >= 0 && write(fd, page, sizeof page) == (ssize_t)sizeof page) continue;
  if (fd >= 0) close(fd);
  snprintf(pattern, sizeof pattern, "%s/s-%%n.msgpack", small);
  /* ASan's link-order check would refuse the interposer ahead of it (tests/test_run.c) */
  const char *old = getenv("ASAN_OPTIONS");
  char asan[1024];
  snprintf(asan, sizeof asan, "%s%sverify_asan_link_order=0", old && *old ? old : "",
           old && *old ? ":" : "");
  setenv("ASAN_OPTIONS", asan, 1);
  th_run_t r = TH_RUN("run", "-o", pattern, "--", MS_TEST_BINARY_DIR "/tests/run/run_app", "basic");
  if (old) setenv("ASAN_OPTIONS", old, 1);
  else unsetenv("ASAN_OPTIONS");
  char path[600];
  snprintf(path, sizeof path, "'%s/s-0.msgpack'", small);
  const char *w = strstr(r.err, path);
  cr_expect(w, "no warning naming %s: %s", path, r.err);
  cr_expect(strstr(r.err, "No space left on device"), "%s", r.err);
  if (w) cr_expect_null(strstr(w + 1, path), "the path is said twice: %s", r.err);
  th_run_free(&r);
  cr_expect_eq(umount(small), 0);
  rmdir(small);
}
