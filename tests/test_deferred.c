/* SPDX-License-Identifier: MIT
 * Trace stacks read when they are asked for (MS_LOAD_DEFER_STACKS, lib/snapshot/deferred.c):
 * for every fixture, the time index's states of a deferred read equal an eager read's at every
 * moment asked (blocks, sizes, entries and each block's stack, frame by frame), whatever the
 * order of the moments; every entry's stack read later equals the eager one, filled in any order
 * and in pieces. Hand-made files: the read falls back to an eager one when a frame's memo entry
 * is stored again; a file changed after the read is refused with a clear error, a file renamed
 * over is still the one read; standard input and the snapshot cache never defer; a window of the
 * trace (--range) leaves the stacks before its end for later, and has none after it. The places
 * of the records left for later keep across the array's growths, and no record is taken for one
 * that was never noted. The classifier's scan of the records left for later (without interning)
 * sees each run's frames, and fails as a fill fails on a run changed under the same identity.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/cache.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"
#include "snapshot/deferred.h"

static const unsigned EAGER = MS_LOAD_NO_FREE_STACKS;
static const unsigned LATER = MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS;

static ms_snapshot_t *load(const char *path, unsigned flags) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load_ex(path, flags, &s, &eb), MS_OK, "%s: %s", path, eb.msg);
  return s;
}

static ms_timeline_t *index_of(const ms_snapshot_t *s) {
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, &cfg, &tl, &eb), MS_OK, "%s", eb.msg);
  return tl;
}

/* Stack sa of a and sb of b have the same frames (both none alike). */
static bool same_stack(const ms_snapshot_t *a, uint32_t sa, const ms_snapshot_t *b, uint32_t sb) {
  if (sa == MS_SNAP_NO_STACK || sb == MS_SNAP_NO_STACK) return sa == sb;
  const ms_snap_stack_t *x = &a->stacks[sa], *y = &b->stacks[sb];
  if (x->nframes != y->nframes) return false;
  for (uint32_t k = 0; k < x->nframes; k++)
    if (ms_snap_frame_index(a, x->first + k) != ms_snap_frame_index(b, y->first + k)) return false;
  return true;
}

static void same_state(const ms_timeline_t *ta, const ms_timeline_t *tb, size_t dev, size_t step,
                       const char *what) {
  ms_tl_state_t a, b;
  ms_timeline_state_init(&a);
  ms_timeline_state_init(&b);
  cr_assert_eq(ms_timeline_state_at(ta, dev, step, &a), MS_OK);
  cr_assert_eq(ms_timeline_state_at(tb, dev, step, &b), MS_OK, "%s: step %zu", what, step);
  cr_assert_eq(a.nblocks, b.nblocks, "%s: step %zu", what, step);
  cr_assert_eq(a.nsegments, b.nsegments, "%s: step %zu", what, step);
  cr_assert(memcmp(a.totals, b.totals, sizeof a.totals) == 0, "%s: step %zu", what, step);
  for (size_t i = 0; i < a.nblocks; i++) {
    const ms_tl_block_t *x = &a.blocks[i], *y = &b.blocks[i];
    cr_assert(x->address == y->address && x->size == y->size &&
                  x->alloc_entry == y->alloc_entry && x->free_entry == y->free_entry,
              "%s: step %zu block %zu", what, step, i);
    cr_assert(same_stack(ms_timeline_snapshot(ta), x->stack, ms_timeline_snapshot(tb), y->stack),
              "%s: step %zu block %zu (alloc entry %lld): stacks differ", what, step, i,
              (long long)x->alloc_entry);
  }
  ms_timeline_state_release(&a);
  ms_timeline_state_release(&b);
}

/* Every entry's stack of b (deferred, filled by now) is a's. */
static void same_entries(const ms_snapshot_t *a, const ms_snapshot_t *b, const char *what) {
  cr_assert_eq(a->ntrace, b->ntrace);
  for (size_t i = 0; i < a->ntrace; i++)
    cr_assert(same_stack(a, a->trace[i].stack, b, b->trace[i].stack), "%s: entry %zu", what, i);
}

Test(deferred, fixtures_states_and_entries, .timeout = 600) {
  static char paths[32][4096];
  size_t n = th_fixture_pickles(paths, 32);
  if (n == 0) cr_skip_test("no fixtures");
  size_t deferred = 0;
  for (size_t f = 0; f < n; f++) {
    ms_snapshot_t *a = load(paths[f], EAGER), *b = load(paths[f], LATER);
    deferred += ms__snapshot_has_deferred(b);
    ms_timeline_t *ta = index_of(a), *tb = index_of(b);
    cr_assert_eq(ms_timeline_ndevices(ta), ms_timeline_ndevices(tb));
    for (size_t d = 0; d < ms_timeline_ndevices(ta); d++) {
      size_t ne = ms_timeline_nentries(ta, d);
      ms_tl_peak_t pa, pr;
      cr_assert_eq(ms_timeline_peak(ta, d, MS_TL_ALLOCATED, 0, ne, &pa), MS_OK);
      cr_assert_eq(ms_timeline_peak(ta, d, MS_TL_RESERVED, 0, ne, &pr), MS_OK);
      /* the moments a report asks, late ones first, then a walk forwards from the start */
      const size_t steps[] = {ne, pa.step, pr.step, ne / 2, ne / 3, 0};
      for (size_t k = 0; k < sizeof steps / sizeof *steps; k++)
        same_state(ta, tb, d, steps[k], paths[f]);
      ms_tl_state_t sa, sb;
      ms_timeline_state_init(&sa);
      ms_timeline_state_init(&sb);
      cr_assert_eq(ms_timeline_state_at(ta, d, 0, &sa), MS_OK);
      cr_assert_eq(ms_timeline_state_at(tb, d, 0, &sb), MS_OK);
      for (size_t s = 0; s < ne && s < 400; s++) {
        cr_assert_eq(ms_timeline_state_advance(ta, &sa), MS_OK);
        cr_assert_eq(ms_timeline_state_advance(tb, &sb), MS_OK);
        cr_assert_eq(sa.nblocks, sb.nblocks);
        for (size_t i = 0; i < sa.nblocks; i++)
          cr_assert(same_stack(a, sa.blocks[i].stack, b, sb.blocks[i].stack),
                    "%s: advanced to %zu, block %zu", paths[f], s + 1, i);
      }
      ms_timeline_state_release(&sa);
      ms_timeline_state_release(&sb);
    }
    /* the rest, in pieces and backwards */
    size_t *idx = malloc((b->ntrace ? b->ntrace : 1) * sizeof *idx);
    for (size_t i = 0; i < b->ntrace; i++) idx[i] = b->ntrace - 1 - i;
    ms_errbuf_t eb = {{0}};
    for (size_t at = 0; at < b->ntrace; at += 7) {
      size_t k = b->ntrace - at < 7 ? b->ntrace - at : 7;
      cr_assert_eq(ms__snapshot_fill_stacks(b, idx + at, k, &eb), MS_OK, "%s", eb.msg);
    }
    cr_assert(!ms__snapshot_has_deferred(b));
    same_entries(a, b, paths[f]);
    free(idx);
    ms_timeline_destroy(ta);
    ms_timeline_destroy(tb);
    ms_snapshot_free(a);
    ms_snapshot_free(b);
  }
  cr_assert(deferred > 0, "no fixture left a stack for later");
}

/* ---- hand-made files ------------------------------------------------------------------------ */

/* Two allocs of device 0 in Python's shape: the first (0x1000) meets its frame dict (memo 15)
 * in its list, so its stack is read at once; the second's list (0x2000) is two gets of that
 * frame, which the entry loop reads whole: its stack is left for later. `extra` goes into the
 * second entry before its SETITEMS (after its frames). Memo: 0 root, 1 "segments", 2 [],
 * 3 "device_traces", 4 [], 5 [] (device 0), 6 the first entry, 7 "action", 8 "alloc", 9 "addr",
 * 10 "size", 11 "stream", 12 "time_us", 13 "frames", 14 its list, 15 the frame, 16 "name",
 * 17 "f", 18 "other_key"; the second entry is 19, its list 20. */
static size_t two_allocs(char *out, const char *extra, size_t elen) {
  static const char head[] =
      TH_PICKLE_FIRST_ALLOC
      "\x8c\x09" "other_key\x94K\x00"
      "u"
      "}\x94(h\x07h\x08h\x09\x8a\x02\x00\x20h\x0aK\x20h\x0bK\x00h\x0cK\x06"
      "h\x0d]\x94(h\x0fj\x0f\x00\x00\x00" "e";
  size_t n = sizeof head - 1;
  memcpy(out, head, n);
  memcpy(out + n, extra, elen);
  n += elen;
  static const char tail[] = "u" "e" "a" "u.";
  memcpy(out + n, tail, sizeof tail - 1);
  return n + sizeof tail - 1;
}

/* the second entry's run in two_allocs' bytes (its gets of memo 15, then APPENDS): its offset */
static const char second_run[] = "h\x0fj\x0f\x00\x00\x00" "e";
static size_t second_run_at(const char *buf, size_t n) {
  for (size_t i = n - sizeof second_run + 1; i-- > 0;)
    if (memcmp(buf + i, second_run, sizeof second_run - 1) == 0) return i;
  cr_assert_fail("no run");
  return 0;
}

/* two_allocs with the second entry's list made of ngets gets of the frame (LONG_BINGET, 5 bytes
 * each) in one run; out holds 5 * ngets + 512 bytes. */
static size_t two_allocs_long(char *out, size_t ngets) {
  char base[1024];
  size_t n = two_allocs(base, "", 0), at = second_run_at(base, n);
  memcpy(out, base, at);
  size_t w = at;
  for (size_t k = 0; k < ngets; k++) memcpy(out + w, "j\x0f\x00\x00\x00", 5), w += 5;
  size_t rest = n - (at + sizeof second_run - 2); /* from its APPENDS on */
  memcpy(out + w, base + at + sizeof second_run - 2, rest);
  return w + rest;
}

static void write_two(const char *path, const char *extra, size_t elen) {
  char buf[1024];
  size_t n = two_allocs(buf, extra, elen);
  cr_assert_eq(th_write_file(path, buf, n), 0);
}

Test(deferred, a_hand_made_file) {
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/two.pickle", dir);
  write_two(path, "", 0);
  ms_snapshot_t *a = load(path, EAGER), *b = load(path, LATER);
  cr_assert_eq(b->ntrace, 2);
  cr_assert_neq(b->trace[0].stack, MS_SNAP_NO_STACK, "met in its list: read at once");
  cr_assert_eq(b->trace[1].stack, MS_SNAP_NO_STACK, "left for later");
  cr_assert(b->trace[1].present & MS_TRACE_HAS_FRAMES);
  cr_assert(ms__snapshot_has_deferred(b));
  size_t want[] = {1, 1, 0, 99};
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapshot_fill_stacks(b, want, 4, &eb), MS_OK, "%s", eb.msg);
  cr_assert(!ms__snapshot_has_deferred(b));
  cr_assert_eq(b->stacks[b->trace[1].stack].nframes, 2);
  same_entries(a, b, path);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  th_rmdir(dir);
  free(dir);
}

Test(deferred, a_frame_stored_again_reads_in_full) {
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/again.pickle", dir);
  /* other_key = "x", BINPUT 15: the frame's memo entry now holds a string */
  write_two(path, "h\x12\x8c\x01xq\x0f", 7);
  ms_snapshot_t *a = load(path, EAGER), *b = load(path, LATER);
  cr_assert(!ms__snapshot_defers(b), "read again in full");
  TH_ASSERT_SNAP_EQ(a, b);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  th_rmdir(dir);
  free(dir);
}

/* The first fixture whose read leaves stacks for later, copied to path. */
static void copy_a_deferring_fixture(const char *path) {
  static char paths[32][4096];
  size_t n = th_fixture_pickles(paths, 32);
  for (size_t f = 0; f < n; f++) {
    ms_snapshot_t *b = load(paths[f], LATER);
    bool later = ms__snapshot_has_deferred(b);
    ms_snapshot_free(b);
    if (!later) continue;
    FILE *in = fopen(paths[f], "rb"), *out = fopen(path, "wb");
    cr_assert(in && out);
    char buf[65536];
    size_t k;
    while ((k = fread(buf, 1, sizeof buf, in)) > 0) cr_assert_eq(fwrite(buf, 1, k, out), k);
    fclose(in);
    cr_assert_eq(fclose(out), 0);
    return;
  }
  cr_skip_test("no fixture leaves stacks for later");
}

Test(deferred, a_changed_file_is_refused) {
  char *dir = th_tmpdir(), path[4200], other[4200];
  snprintf(path, sizeof path, "%s/copy.pickle", dir);
  copy_a_deferring_fixture(path);
  ms_snapshot_t *b = load(path, LATER);
  ms_timeline_t *tl = index_of(b);
  size_t dev = 0;
  ms_tl_peak_t p = {0};
  for (; dev < ms_timeline_ndevices(tl); dev++) {
    size_t ne = ms_timeline_nentries(tl, dev);
    if (ne && ms_timeline_peak(tl, dev, MS_TL_ALLOCATED, 0, ne, &p) == MS_OK && p.step) break;
  }
  cr_assert_lt(dev, ms_timeline_ndevices(tl));
  /* the same bytes written again: its times moved */
  struct timespec ts[2] = {{0, UTIME_OMIT}, {1000000000, 0}};
  cr_assert_eq(utimensat(AT_FDCWD, path, ts, 0), 0);
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  cr_assert_eq(ms_timeline_state_at(tl, dev, p.step, &st), MS_EIO);
  ms_timeline_state_release(&st);
  ms_timeline_destroy(tl);
  ms_snapshot_free(b);

  /* the message */
  ms_errbuf_t eb = {{0}};
  snprintf(other, sizeof other, "%s/two.pickle", dir);
  write_two(other, "", 0);
  b = load(other, LATER);
  cr_assert_eq(utimensat(AT_FDCWD, other, ts, 0), 0);
  size_t one = 1;
  cr_assert_eq(ms__snapshot_fill_stacks(b, &one, 1, &eb), MS_EIO);
  cr_assert_str_eq(eb.msg, "the file changed since it was read: the stacks of its trace cannot be "
                           "read (run the command again)");
  cr_assert(ms__snapshot_has_deferred(b), "nothing read");
  ms_snapshot_free(b);

  /* another file renamed over it: the one read is still read */
  b = load(other, LATER);
  write_two(path, "h\x12K\x07", 4);
  cr_assert_eq(rename(path, other), 0);
  cr_assert_eq(ms__snapshot_fill_stacks(b, &one, 1, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(b->stacks[b->trace[1].stack].nframes, 2);
  ms_snapshot_free(b);
  th_rmdir(dir);
  free(dir);
}

Test(deferred, never_from_stdin_or_the_cache) {
  char *dir = th_tmpdir(), path[4200], cache[4200];
  snprintf(path, sizeof path, "%s/two.pickle", dir);
  snprintf(cache, sizeof cache, "%s/cache", dir);
  write_two(path, "", 0);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  /* the cache stores (and gives) the snapshot read in full, and a second load is a hit */
  ms_cache_options_t co = {cache, 0, false};
  ms_cache_outcome oc;
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(ms_cache_load(path, LATER, &co, &s, &oc, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(oc, k == 0 ? MS_CACHE_STORED : MS_CACHE_HIT);
    cr_assert(!ms__snapshot_defers(s));
    cr_assert_neq(s->trace[1].stack, MS_SNAP_NO_STACK);
    ms_snapshot_free(s);
  }
  th_rmdir(cache);
  /* standard input is read once, as it comes */
  int fd = open(path, O_RDONLY), saved = dup(0);
  cr_assert(fd >= 0 && saved >= 0);
  cr_assert_eq(dup2(fd, 0), 0);
  int rc = ms_snapshot_load_ex("-", LATER, &s, &eb);
  dup2(saved, 0);
  close(saved);
  close(fd);
  cr_assert_eq(rc, MS_OK, "%s", eb.msg);
  cr_assert(!ms__snapshot_defers(s));
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

/* ---- the commands that read so -------------------------------------------------------------- */

TestSuite(deferred_cli, .init = th_cache_setup, .fini = th_cache_teardown, .timeout = 600);

/* Each command without the cache (its stacks read when asked for) prints what it prints through
 * the cache's first run (which reads every stack, to store them), for every fixture: those that
 * show moments, and those that classify every allocation (categories, sources, compare). */
Test(deferred_cli, the_same_answers_as_a_full_read) {
  static char paths[32][4096];
  size_t n = th_fixture_pickles(paths, 32);
  if (n == 0) cr_skip_test("no fixtures");
  static const char *const cmds[][6] = {
      {"timeline", NULL},
      {"timeline", "--json", NULL},
      {"timeline", "--steps", NULL},
      {"top", "--by", "stack", "--at", "peak", NULL},
      {"top", "--by", "frame", "--at", "peak-reserved", "--json"},
      {"top", "--by", "file", "--at", "end", NULL},
      {"memory", "--at", "peak", "--folded", NULL},
      {"memory", "--at", "peak", "--json", "-o", "-"},
      {"segments", "--at", "peak", "--folded", NULL},
      /* the categories: every allocation's frames read from the file again */
      {"top", "--by", "category", "--at", "peak", NULL},
      {"top", "--by", "source", "--json", NULL},
      {"timeline", "--by", "category", "--json", NULL},
      {"compare", "@", "--json", NULL},
      {"compare", "--at", "1", "--at", "end", NULL},
      {"check", "--limit", "peak_allocated<=1KiB", "--limit", "peak_activation<=1KiB"},
  };
  const char *const off[] = {"MEMSNAP_CACHE=0", NULL};
  for (size_t f = 0; f < n; f++) {
    for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
      const char *args[10];
      size_t k = 0;
      args[k++] = cmds[c][0];
      args[k++] = paths[f];
      for (size_t j = 1; j < 6 && cmds[c][j]; j++) /* "@": the file again */
        args[k++] = strcmp(cmds[c][j], "@") == 0 ? paths[f] : cmds[c][j];
      args[k] = NULL;
      th_run_t a = th_run(th_cache_tmp, NULL, off, args);
      th_run_t b = th_run(th_cache_tmp, NULL, NULL, args); /* the cache's first run */
      cr_assert_eq(a.status, b.status, "%s %s", paths[f], cmds[c][0]);
      cr_assert_str_eq(a.out, b.out, "%s: %s (option %zu)", paths[f], cmds[c][0], c);
      cr_assert_str_eq(a.err, b.err, "%s: %s (option %zu)", paths[f], cmds[c][0], c);
      th_run_free(&a);
      th_run_free(&b);
    }
  }
  cr_assert_gt(th_dir_count(th_cache_dir()), 0, "the cache was used");
}

/* What a scan (ms__snapshot_scan_deferred) was shown: its frames, each one of the snapshot's. */
typedef struct scan_seen_s {
  const ms_snapshot_t *s;
  size_t records, frames;
} scan_seen_t;

static int count_frames(void *ctx, size_t rec, const uint32_t *fr, uint32_t n) {
  scan_seen_t *c = ctx;
  cr_assert_lt(rec, c->s->ntrace);
  cr_assert_gt(n, 0);
  for (uint32_t k = 0; k < n; k++)
    cr_assert_lt(fr[k], c->s->nframes);
  c->records++;
  c->frames += n;
  return MS_OK;
}

/* A run whose bytes changed under the same identity (the file removed, so its change time no
 * longer counts, then written through a descriptor opened before, its modification time put
 * back): every byte of the run and the APPENDS after it, each replaced by hostile values, and
 * the file cut at each of them. The fill reads some stack or says the frames are not those read
 * (MS_EFORMAT), or that the file changed (MS_EIO), and never crashes or reads out of bounds; the
 * classifier's scan of the same run (ms__snapshot_scan_deferred) answers as the fill does. */
Test(deferred, a_run_changed_under_the_same_identity) {
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/two.pickle", dir);
  char buf[1024];
  size_t n = two_allocs(buf, "", 0), at = second_run_at(buf, n);
  static const unsigned char hostile[] = {0x00, 'X', 'h', 'j', 'e', 0xff, 0x0e};
  size_t outcomes[3] = {0, 0, 0}; /* read, MS_EFORMAT, MS_EIO */
  for (size_t k = 0; k < sizeof second_run; k++) {
    for (size_t v = 0; v <= sizeof hostile; v++) { /* the last: the file cut at k */
      cr_assert_eq(th_write_file(path, buf, n), 0);
      int fd = open(path, O_RDWR);
      cr_assert(fd >= 0);
      struct stat st;
      cr_assert_eq(fstat(fd, &st), 0);
      ms_snapshot_t *b = load(path, LATER);
      cr_assert(ms__snapshot_has_deferred(b));
      cr_assert_eq(unlink(path), 0);
      if (v < sizeof hostile)
        cr_assert_eq(pwrite(fd, &hostile[v], 1, (off_t)(at + k)), 1);
      else
        cr_assert_eq(ftruncate(fd, (off_t)(at + k)), 0);
      struct timespec ts[2] = {st.st_atim, st.st_mtim};
      cr_assert_eq(futimens(fd, ts), 0);
      size_t one = 1;
      scan_seen_t seen = {b, 0, 0};
      ms_errbuf_t eb = {{0}};
      /* the classifier's scan first (it reads the run without interning it), then a fill */
      int sc = ms__snapshot_scan_deferred(b, count_frames, &seen, &eb);
      cr_assert(sc == MS_OK || sc == MS_EFORMAT || sc == MS_EIO, "scan: byte %zu value %zu: %d", k,
                v, sc);
      if (sc == MS_EFORMAT)
        cr_assert(strstr(eb.msg, "are no longer those read: the file changed"), "%s", eb.msg);
      cr_assert(ms__snapshot_has_deferred(b), "a scan reads nothing into the snapshot");
      eb.msg[0] = 0;
      int rc = ms__snapshot_fill_stacks(b, &one, 1, &eb);
      cr_assert(rc == MS_OK || rc == MS_EFORMAT || rc == MS_EIO, "byte %zu value %zu: %d", k, v,
                rc);
      cr_assert_eq(sc, rc, "the scan and the fill agree: byte %zu value %zu", k, v);
      if (v == sizeof hostile) cr_assert_eq(rc, MS_EIO, "cut at %zu: %s", k, eb.msg);
      if (rc == MS_EFORMAT)
        cr_assert(strstr(eb.msg, "are no longer those read: the file changed"), "%s", eb.msg);
      if (rc == MS_OK) cr_assert_lt(b->trace[1].stack, b->nstacks);
      outcomes[rc == MS_OK ? 0 : rc == MS_EFORMAT ? 1 : 2]++;
      close(fd);
      ms_snapshot_free(b);
    }
  }
  cr_assert(outcomes[0] > 0 && outcomes[1] > 0 && outcomes[2] > 0, "%zu %zu %zu", outcomes[0],
            outcomes[1], outcomes[2]);
  th_rmdir(dir);
  free(dir);
}

/* Runs longer than one read for a run: read again whole, up to the longest run the entry loop
 * takes (26,000 five-byte gets); a longer one is read by the general path, its stack at once. */
Test(deferred, long_runs) {
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/long.pickle", dir);
  static const size_t lens[] = {1, 409, 410, 4000, 26000, 65536};
  char *buf = malloc(5 * 65536 + 512);
  for (size_t i = 0; i < sizeof lens / sizeof *lens; i++) {
    size_t n = two_allocs_long(buf, lens[i]);
    cr_assert_eq(th_write_file(path, buf, n), 0);
    ms_snapshot_t *a = load(path, EAGER), *b = load(path, LATER);
    cr_assert_eq(ms__snapshot_has_deferred(b), lens[i] < 65536, "%zu gets", lens[i]);
    size_t one = 1;
    ms_errbuf_t eb = {{0}};
    scan_seen_t seen = {b, 0, 0};
    cr_assert_eq(ms__snapshot_scan_deferred(b, count_frames, &seen, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(seen.records, lens[i] < 65536 ? 1 : 0, "%zu gets", lens[i]);
    cr_assert_eq(seen.frames, lens[i] < 65536 ? lens[i] : 0, "%zu gets", lens[i]);
    cr_assert_eq(ms__snapshot_fill_stacks(b, &one, 1, &eb), MS_OK, "%zu gets: %s", lens[i], eb.msg);
    cr_assert_eq(b->stacks[b->trace[1].stack].nframes, lens[i]);
    same_entries(a, b, path);
    ms_snapshot_free(a);
    ms_snapshot_free(b);
  }
  free(buf);
  th_rmdir(dir);
  free(dir);
}

/* A window (ms_snapshot_load_window) defers the allocs before its end: the states up to its end
 * equal an eager window's, for every fixture and windows of entries and of times. */
Test(deferred, windows) {
  static char paths[32][4096];
  size_t n = th_fixture_pickles(paths, 32);
  if (n == 0) cr_skip_test("no fixtures");
  size_t deferred = 0;
  for (size_t f = 0; f < n; f++) {
    ms_snapshot_t *full = load(paths[f], 0);
    size_t nt = full->ntrace;
    int64_t t_mid = nt ? full->trace[nt / 2].time_us : 0;
    ms_snapshot_free(full);
    const ms_load_window_t w[] = {{MS_LOAD_WINDOW_ENTRIES, nt / 3, 0},
                                  {MS_LOAD_WINDOW_TIMES, 0, t_mid}};
    for (size_t k = 0; k < sizeof w / sizeof *w; k++) {
      ms_snapshot_t *a = NULL, *b = NULL;
      ms_errbuf_t ea = {{0}}, eb = {{0}};
      int ra = ms_snapshot_load_window(paths[f], EAGER, &w[k], &a, &ea);
      int rb = ms_snapshot_load_window(paths[f], LATER, &w[k], &b, &eb);
      cr_assert_eq(ra, rb, "%s window %zu: '%s' / '%s'", paths[f], k, ea.msg, eb.msg);
      if (ra != MS_OK) continue;
      deferred += ms__snapshot_has_deferred(b);
      ms_timeline_t *ta = index_of(a), *tb = index_of(b);
      for (size_t d = 0; d < ms_timeline_ndevices(ta); d++) {
        size_t ne = ms_timeline_nentries(ta, d);
        size_t end = k == 0 ? (nt / 3 + 1 < ne ? nt / 3 + 1 : ne) : ne / 2;
        ms_tl_peak_t p;
        cr_assert_eq(ms_timeline_peak(ta, d, MS_TL_ALLOCATED, 0, end, &p), MS_OK);
        const size_t steps[] = {end, p.step, end / 2, 0};
        for (size_t i = 0; i < sizeof steps / sizeof *steps; i++)
          same_state(ta, tb, d, steps[i], paths[f]);
      }
      ms_timeline_destroy(ta);
      ms_timeline_destroy(tb);
      ms_snapshot_free(a);
      ms_snapshot_free(b);
    }
  }
  cr_assert(deferred > 0, "no window left a stack for later");
}

/* ---- the places of the records left for later ----------------------------------------------- */

/* Record rec's offset as ms__defer_locs_note kept it (+ 1), 0 when it was not noted. */
static uint64_t noted_at(const ms__defer_locs_t *l, size_t rec) {
  if (rec >= l->cap || !l->off[rec]) return 0;
  return l->base[rec / MS__DEFER_BLOCK] + l->off[rec];
}

/* Records noted in their order, across growths of the arrays, with gaps of whole blocks and a
 * record noted again: each keeps its place, the others read as not noted, and only the blocks up
 * to the last record noted are set (the room past them stays untouched). */
Test(deferred, places_kept_across_growths) {
  static const size_t recs[] = {0,     1,     4095,   4096,   9000,   65535,
                                65536, 65537, 300000, 300001, 1000000};
  const size_t n = sizeof recs / sizeof recs[0];
  ms__defer_locs_t l;
  memset(&l, 0, sizeof l);
  for (size_t i = 0; i < n; i++) {
    cr_assert(ms__defer_locs_note(&l, recs[i], 1000 + 100 * (uint64_t)recs[i]), "record %zu",
              recs[i]);
    cr_assert_eq(l.cap % MS__DEFER_BLOCK, 0);
    cr_assert_eq(l.cap, (recs[i] / MS__DEFER_BLOCK + 1) * MS__DEFER_BLOCK, "record %zu", recs[i]);
    cr_assert_geq(l.room, l.cap);
  }
  cr_assert_eq(l.n, n);
  cr_assert(ms__defer_locs_note(&l, 9000, 1000 + 100 * 9000), "noted again");
  cr_assert_eq(l.n, n, "a record noted again is counted once");
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(noted_at(&l, recs[i]), 1001 + 100 * (uint64_t)recs[i], "record %zu", recs[i]);
  static const size_t none[] = {2, 4094, 8191, 65534, 100000, 299999, 1000001, 5000000};
  for (size_t i = 0; i < sizeof none / sizeof none[0]; i++)
    cr_assert_eq(noted_at(&l, none[i]), 0, "record %zu was never noted", none[i]);
  /* a record too far from its block's first (4 GiB on) is refused: its stack is read now */
  cr_assert(!ms__defer_locs_note(&l, 1000002, 1000 + 100 * 1000000 + ((uint64_t)1 << 32)));
  cr_assert(!ms__defer_locs_note(&l, 1000003, 999), "before its block's first");
  cr_assert_eq(noted_at(&l, 1000002), 0);
  cr_assert_eq(l.n, n);
  ms__defer_locs_free(&l);
  cr_assert_null(l.off);
  cr_assert_eq(l.cap + l.room + l.n, 0);
}
