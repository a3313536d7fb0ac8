/* SPDX-License-Identifier: MIT
 * The pickle reader over a mapped file (ms__pickle_read_fd, what ms_snapshot_load uses for a
 * regular file) against the same reader over a copy in memory (a source that hands the bytes
 * over): the same snapshot, bit for bit, for every fixture and load option, with windows small
 * enough that every fixture crosses several; and the same error, word for word, for prefixes of
 * a file cut anywhere, around window boundaries above all. Also the reader's shortcut for the
 * skipped trace's frames lists (MS_LOAD_NO_TRACE) on hand-made pickles: it drops what the
 * general path drops and fails where it fails. And a file that shrank while it was read fails
 * with a plain message where its next window would be mapped.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "common/internal.h"

static const unsigned load_flags[] = {0, MS_LOAD_NO_TRACE, MS_LOAD_NO_FREE_STACKS,
                                      MS_LOAD_NO_TRACE_STACKS};

/* The snapshot as memsnap's own format: equal bytes, equal snapshots. */
static th_memsink_t encode(const ms_snapshot_t *s) {
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {{0}};
  /* the writer refuses a snapshot read without (the stacks of) its trace, for its users' sake;
   * a copy that does not say so is written as it stands */
  ms_snapshot_t shown = *s;
  shown.present &= ~(uint32_t)(MS_SNAP_TRACE_SKIPPED | MS_SNAP_TRACE_STACKS_SKIPPED);
  cr_assert_eq(ms_snapshot_write(&shown, NULL, &sink, &eb), MS_OK, "%s", eb.msg);
  return m;
}

/* The fixtures' paths (*.pickle), or skips the test when there are none. */
static size_t fixtures(char paths[][4096], size_t cap) {
  size_t n = th_fixture_pickles(paths, cap);
  if (n == 0) cr_skip_test("no fixtures");
  return n;
}

/* Loads path (mapped) and its bytes (in memory) with flags; both succeed with equal snapshots,
 * or fail with the same code and message (the load's names the file first). */
static void same_both_ways(const char *path, const char *data, size_t len, unsigned flags) {
  ms_snapshot_t *a = NULL, *b = NULL;
  ms_errbuf_t ea = {{0}}, ebm = {{0}};
  int ra = ms_snapshot_load_ex(path, flags, &a, &ea);
  int rb = th_pickle_read_mem(data, len, flags, &b, &ebm);
  if (rb == MS_EUNSUPPORTED && flags) { /* the load reads such a file again in full */
    rb = th_pickle_read_mem(data, len, 0, &b, &ebm);
  }
  cr_assert_eq(ra, rb, "%s (%zu bytes, flags %u): mapped %d '%s', in memory %d '%s'", path, len,
               flags, ra, ea.msg, rb, ebm.msg);
  if (ra != MS_OK) {
    char want[sizeof ea.msg + 64];
    snprintf(want, sizeof want, "'%s': %s", path, ebm.msg);
    cr_assert_str_eq(ea.msg, want, "%s, %zu bytes, flags %u", path, len, flags);
    return;
  }
  th_memsink_t ma = encode(a), mb = encode(b);
  cr_assert_eq(ma.len, mb.len, "%s flags %u: %zu vs %zu bytes", path, flags, ma.len, mb.len);
  cr_assert(memcmp(ma.data, mb.data, ma.len) == 0, "%s flags %u: snapshots differ", path, flags);
  th_memsink_free(&ma);
  th_memsink_free(&mb);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

Test(pickle_map, fixtures_same_as_in_memory, .timeout = 300) {
  static char paths[32][4096];
  size_t n = fixtures(paths, 32);
  size_t windows[] = {0, 1, (size_t)300 << 10}; /* 0: the default; 1: the smallest (256 KiB) */
  size_t saved = ms__pickle_map_window;
  for (size_t w = 0; w < sizeof windows / sizeof *windows; w++) {
    ms__pickle_map_window = windows[w] ? windows[w] : saved;
    for (size_t i = 0; i < n; i++) {
      size_t len = 0;
      char *data = th_read_file(paths[i], &len);
      cr_assert(data, "%s", paths[i]);
      for (size_t f = 0; f < sizeof load_flags / sizeof *load_flags; f++)
        same_both_ways(paths[i], data, len, load_flags[f]);
      free(data);
    }
  }
  ms__pickle_map_window = saved;
}

/* The largest fixture's path (by its size on disk) and size; skips the test without fixtures. */
static const char *largest_fixture(size_t *size) {
  static char paths[32][4096];
  size_t n = fixtures(paths, 32), best = 0;
  *size = 0;
  for (size_t i = 0; i < n; i++) {
    struct stat st;
    if (stat(paths[i], &st) == 0 && (size_t)st.st_size > *size) {
      best = i;
      *size = (size_t)st.st_size;
    }
  }
  return paths[best];
}

/* Prefixes of the largest fixture cut around every window boundary (and at a stride between),
 * with the smallest windows: the same error as the reader over the same bytes in memory. */
Test(pickle_map, cut_files_same_error, .timeout = 300) {
  size_t size = 0, len = 0;
  const char *path = largest_fixture(&size);
  char *data = th_read_file(path, &len);
  cr_assert(data);
  char *dir = th_tmpdir();
  char cut[4096];
  snprintf(cut, sizeof cut, "%s/cut.pickle", dir);
  size_t saved = ms__pickle_map_window;
  ms__pickle_map_window = 1; /* 256 KiB windows */
  const size_t win = (size_t)256 << 10, page = 4096;
  for (size_t at = 1; at < len; at += len / 40 + 1) {
    /* each window's end, a page before and after it, and a stride through the file */
    size_t wend = (at / win + 1) * win;
    size_t cuts[] = {at, wend - 1, wend, wend + 1, wend - page, wend + page + 3};
    for (size_t c = 0; c < sizeof cuts / sizeof *cuts; c++) {
      if (cuts[c] < 64 || cuts[c] >= len) continue; /* shorter: not told to be a pickle */
      cr_assert_eq(th_write_file(cut, data, cuts[c]), 0);
      for (size_t f = 0; f < 2; f++) same_both_ways(cut, data, cuts[c], load_flags[f]);
    }
  }
  ms__pickle_map_window = saved;
  th_rmdir(dir);
  free(dir);
  free(data);
}

/* ---- the skipped frames lists' shortcut ------------------------------------------------------ */

/* A protocol 4 snapshot: {"segments": [], "device_traces": [[entry]]} whose one entry is
 * {"action": "alloc", "frames": [FRAMES]} (FRAMES: the bytes of the frames list, after its
 * EMPTY_LIST), memoizing the strings; the frame dict sits in the memo at index 6. */
static size_t build(char *out, const char *frames, size_t flen) {
  static const char head[] =
      "\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0d" "device_traces\x94]\x94]\x94}\x94(\x8c\x06"
      "action\x94\x8c\x05" "alloc\x94\x8c\x06" "frames\x94]\x94";
  size_t n = sizeof head - 1;
  memcpy(out, head, n);
  memcpy(out + n, frames, flen);
  n += flen;
  static const char tail[] = "u" "a" "a" "u.";
  memcpy(out + n, tail, sizeof tail - 1);
  return n + sizeof tail - 1;
}

/* Reads a hand-made pickle with MS_LOAD_NO_TRACE from a file (mapped) and from memory: the
 * same answer; @return its code, and the message in msg. */
static int skip_read(const char *bytes, size_t len, char *msg, size_t cap) {
  char *dir = th_tmpdir();
  char path[4096];
  snprintf(path, sizeof path, "%s/h.pickle", dir);
  cr_assert_eq(th_write_file(path, bytes, len), 0);
  same_both_ways(path, bytes, len, MS_LOAD_NO_TRACE);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = th_pickle_read_mem(bytes, len, MS_LOAD_NO_TRACE, &s, &eb);
  snprintf(msg, cap, "%s", eb.msg);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
  return rc;
}

#define BIN(s) (s), sizeof(s) - 1

Test(pickle_map, skipped_frames_lists) {
  static const struct {
    const char *frames;
    size_t len;
    int rc;
    const char *msg; /* NULL: read */
  } t[] = {
      /* gets of stored entries, BINGET and LONG_BINGET mixed, then APPENDS: dropped */
      {BIN("(h\x02j\x03\x00\x00\x00h\x04" "e"), MS_OK, NULL},
      /* an entry never stored */
      {BIN("(h\x02h\x63" "e"), MS_EFORMAT,
       "offset 72: BINGET 99: memo entry 99 was never stored"},
      {BIN("(h\x02j\x00\x01\x00\x00" "e"), MS_EFORMAT,
       "offset 72: LONG_BINGET 256: memo entry 256 was never stored"},
      /* the run ends with another opcode: the general path goes on */
      {BIN("(h\x02h\x03" "0e"), MS_OK, NULL},
      /* APPENDS without its MARK's values, and one whole APPEND */
      {BIN("h\x02" "a"), MS_OK, NULL},
      /* a get at the end of the input */
      {BIN("(h"), MS_ETRUNCATED, NULL},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    char buf[512], msg[512];
    size_t n = build(buf, t[i].frames, t[i].len);
    if (t[i].rc == MS_ETRUNCATED) n -= 5; /* cut right after the frames' bytes */
    int rc = skip_read(buf, n, msg, sizeof msg);
    cr_assert_eq(rc, t[i].rc, "case %zu: %d '%s'", i, rc, msg);
    if (t[i].msg) cr_assert_str_eq(msg, t[i].msg, "case %zu", i);
  }
}

/* A file that is shorter than it was when the read began (another process cut it): the window
 * that would reach past its end is not mapped, and the read fails with a plain message (the
 * read's start is given a size larger than the file's, as if the file had since shrunk). */
Test(pickle_map, file_shrank) {
  size_t best_len = 0;
  const char *path = largest_fixture(&best_len);
  FILE *fp = fopen(path, "rb");
  cr_assert(fp);
  size_t saved = ms__pickle_map_window;
  ms__pickle_map_window = 1; /* 256 KiB windows: the first one fits, a later one does not */
  uint64_t claimed = (uint64_t)best_len + ((uint64_t)1 << 20);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms__pickle_read_fd(fileno(fp), claimed, 0, &s, &eb, NULL);
  ms__pickle_map_window = saved;
  fclose(fp);
  cr_assert_eq(rc, MS_EIO, "%d '%s'", rc, eb.msg);
  cr_assert_null(s);
  char want[200];
  snprintf(want, sizeof want,
           ": read error: the file shrank while it was read (it had %llu bytes when the read "
           "began)",
           (unsigned long long)claimed);
  cr_assert(strncmp(eb.msg, "offset ", 7) == 0 && strstr(eb.msg, want) != NULL, "'%s'",
            eb.msg);
}

/* ---- the skipped trace's entries read in one loop (pickle_skim.c) ----------------------------- */

/* Reads bytes with MS_LOAD_NO_TRACE with the entry loop and without it: the same code and
 * message, or equal snapshots. @return the code. */
static int same_with_and_without_skim(const char *bytes, size_t len, const char *what) {
  ms_snapshot_t *a = NULL, *b = NULL;
  ms_errbuf_t ea = {{0}}, eb = {{0}};
  bool saved = ms__pickle_skim;
  ms__pickle_skim = true;
  int ra = th_pickle_read_mem(bytes, len, MS_LOAD_NO_TRACE, &a, &ea);
  ms__pickle_skim = false;
  int rb = th_pickle_read_mem(bytes, len, MS_LOAD_NO_TRACE, &b, &eb);
  ms__pickle_skim = saved;
  cr_assert_eq(ra, rb, "%s: with the loop %d '%s', without %d '%s'", what, ra, ea.msg, rb, eb.msg);
  if (ra != MS_OK) {
    cr_assert_str_eq(ea.msg, eb.msg, "%s", what);
    return ra;
  }
  /* the snapshots as memsnap's format: equal bytes, or the same refusal (a flipped byte may
   * make a snapshot the writer refuses) */
  th_memsink_t m[2];
  ms_errbuf_t we[2] = {{{0}}, {{0}}};
  int wr[2];
  const ms_snapshot_t *s[2] = {a, b};
  for (int i = 0; i < 2; i++) {
    ms_sink_t sink;
    th_memsink_init(&sink, &m[i]);
    ms_snapshot_t shown = *s[i];
    shown.present &= ~(uint32_t)(MS_SNAP_TRACE_SKIPPED | MS_SNAP_TRACE_STACKS_SKIPPED);
    wr[i] = ms_snapshot_write(&shown, NULL, &sink, &we[i]);
  }
  cr_assert_eq(wr[0], wr[1], "%s: written %d '%s' and %d '%s'", what, wr[0], we[0].msg, wr[1],
               we[1].msg);
  if (wr[0] == MS_OK)
    cr_assert(m[0].len == m[1].len && memcmp(m[0].data, m[1].data, m[0].len) == 0,
              "%s: snapshots differ", what);
  else
    cr_assert_str_eq(we[0].msg, we[1].msg, "%s", what);
  th_memsink_free(&m[0]);
  th_memsink_free(&m[1]);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  return ra;
}

/* th_cut_and_flip's case: read with and without the entry loop. */
static void skim_cut_or_flipped(void *ctx, const char *bytes, size_t n, const char *what,
                                size_t k) {
  (void)ctx, (void)k;
  (void)same_with_and_without_skim(bytes, n, what);
}

Test(pickle_map, skim_fixtures_cut_and_flipped, .timeout = 300) {
  static char paths[32][4096];
  size_t n = fixtures(paths, 32);
  for (size_t i = 0; i < n; i++) {
    size_t len = 0;
    char *data = th_read_file(paths[i], &len);
    cr_assert(data, "%s", paths[i]);
    cr_assert_eq(same_with_and_without_skim(data, len, paths[i]), MS_OK, "%s", paths[i]);
    /* the small ones: cut everywhere, and bytes flipped */
    if (len <= 64 << 10) th_cut_and_flip(data, len, paths[i], skim_cut_or_flipped, NULL);
    free(data);
  }
}

/* A snapshot whose one trace entry is {BODY} (the bytes between its MARK and SETITEMS), after a
 * first entry that memoizes: 7 "action", 8 "alloc", 9 "frames", 10 a frames list (skipped),
 * 11 a frame dict (its items dropped), 12 a tuple (1, [])... see below. */
static size_t build_entry(char *out, const char *body, size_t blen) {
  static const char head[] =
      "\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0d" "device_traces\x94]\x94]\x94(}\x94(\x8c\x06"
      "action\x94\x8c\x05" "alloc\x94\x8c\x06" "frames\x94]\x94(}\x94(\x8c\x04name\x94\x8c\x01"
      "f\x94" "ue" "u}\x94(";
  size_t n = sizeof head - 1;
  memcpy(out, head, n);
  memcpy(out + n, body, blen);
  n += blen;
  static const char tail[] = "u" "e" "a" "u.";
  memcpy(out + n, tail, sizeof tail - 1);
  return n + sizeof tail - 1;
}

Test(pickle_map, skim_entries_as_the_general_path) {
  /* memo: 0 root, 1 "segments", 2 [], 3 "device_traces", 4 [], 5 [] (device 0), 6 first entry,
   * 7 "action", 8 "alloc", 9 "frames", 10 frames list, 11 frame dict, 12 "name", 13 "f",
   * 14 the second entry */
  static const struct {
    const char *body;
    size_t len;
    int rc; /* MS_OK: read; else the code both paths give */
  } t[] = {
      /* PyTorch's shape: keys by get, scalars, a memoized string, a frames list of gets */
      {BIN("h\x07h\x08h\x09]\x94(h\x0bh\x0bj\x0b\x00\x00\x00" "e"), MS_OK},
      {BIN("h\x07" "K\x05h\x08M\x05\x06h\x09J\x01\x02\x03\x04h\x0c" "G\x3f\xf0\x00\x00\x00\x00\x00\x00"),
       MS_OK},
      {BIN("h\x07N\x8c\x01xN\x8c\x02yy\x94h\x0d\x88\x8c\x01z"), MS_OK},
      {BIN("h\x07\x8a\x00h\x08\x8a\x03\x01\x02\x83h\x09\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x01"),
       MS_OK},
      /* an empty frames list, and one with an empty batch */
      {BIN("h\x09]\x94"), MS_OK},
      {BIN("h\x09](e"), MS_OK},
      /* BINPUT of the next index, and of another */
      {BIN("h\x07\x8c\x01xq\x0fh\x08h\x0f"), MS_OK},
      {BIN("h\x07\x8c\x01xq\x05"), MS_OK},
      /* a get of what this entry memoized */
      {BIN("h\x07\x8c\x01x\x94h\x08h\x0f"), MS_OK},
      /* keys Python cannot hash: a skipped list, a dict object */
      {BIN("h\x0ah\x07"), MS_EFORMAT},
      {BIN("h\x0bh\x07"), MS_EFORMAT},
      /* a list as a key, an odd number of items, a get never stored, a string not UTF-8 */
      {BIN("](eh\x07"), MS_EFORMAT},
      {BIN("h\x07h\x08h\x09"), MS_EFORMAT},
      {BIN("h\x07h\x63"), MS_EFORMAT},
      {BIN("h\x07\x8c\x02\xc3\x28"), MS_EFORMAT},
      /* another string form, and a frame dict as a value */
      {BIN("h\x07X\x01\x00\x00\x00x"), MS_OK},
      {BIN("h\x07h\x0b"), MS_OK},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    char buf[1024], what[64];
    size_t n = build_entry(buf, t[i].body, t[i].len);
    snprintf(what, sizeof what, "case %zu", i);
    int rc = same_with_and_without_skim(buf, n, what);
    cr_assert_eq(rc, t[i].rc, "case %zu: %d", i, rc);
    for (size_t at = 1; at < n; at++) { /* and cut anywhere */
      snprintf(what, sizeof what, "case %zu cut at %zu", i, at);
      (void)same_with_and_without_skim(buf, at, what);
    }
  }
}
