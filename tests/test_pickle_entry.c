/* SPDX-License-Identifier: MIT
 * The reader's loop that takes a kept trace's entry whole (lib/snapshot/pickle_entry.c) against
 * the general path (ms__pickle_fast off): the same snapshot, bit for bit, or the same error, word
 * for word, for every fixture and load option, for windows of the trace, for the small fixtures
 * cut anywhere or with bytes flipped, and for a table of hand-made entries that the loop takes
 * or leaves (keys in any order, values of the wrong type or range, a key met twice, puts of
 * another index, frames not interned yet, what a read leaving out stacks decides).
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "common/internal.h"

static const unsigned load_flags[] = {0, MS_LOAD_NO_FREE_STACKS, MS_LOAD_NO_TRACE_STACKS,
                                      MS_LOAD_NO_TRACE_STACKS | MS_LOAD_NO_FREE_STACKS};

static size_t fixtures(char paths[][4096], size_t cap) {
  size_t n = th_fixture_pickles(paths, cap);
  if (n == 0) cr_skip_test("no fixtures");
  return n;
}

/* Both snapshots equal in every table and field (th_snapshot_diff). */
static void same_snapshots(const ms_snapshot_t *a, const ms_snapshot_t *b, const char *what) {
  char why[512];
  cr_assert(th_snapshot_diff(a, b, why, sizeof why) == 0, "%s: snapshots differ: %s", what, why);
}

/* Reads bytes with flags with the entry loop and without it: the same code and message, or
 * equal snapshots. *whole: the entries the loop took. @return the code. */
static int same_with_and_without(const char *bytes, size_t len, unsigned flags, const char *what,
                                  size_t *whole) {
  ms_snapshot_t *a = NULL, *b = NULL;
  ms_errbuf_t ea = {{0}}, eb = {{0}};
  bool saved = ms__pickle_fast;
  ms__pickle_fast = true;
  int ra = th_pickle_read_mem(bytes, len, flags, &a, &ea);
  size_t took = ms__pickle_last_whole;
  ms__pickle_fast = false;
  int rb = th_pickle_read_mem(bytes, len, flags, &b, &eb);
  ms__pickle_fast = saved;
  if (whole) *whole = took;
  cr_assert_eq(ra, rb, "%s (flags %u): with the loop %d '%s', without %d '%s'", what, flags, ra,
               ea.msg, rb, eb.msg);
  if (ra != MS_OK) {
    cr_assert_str_eq(ea.msg, eb.msg, "%s (flags %u)", what, flags);
    return ra;
  }
  same_snapshots(a, b, what);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  return ra;
}

Test(pickle_entry, fixtures_every_load_option, .timeout = 300) {
  static char paths[32][4096];
  size_t n = fixtures(paths, 32);
  for (size_t i = 0; i < n; i++) {
    size_t len = 0, whole = 0;
    char *data = th_read_file(paths[i], &len);
    cr_assert(data, "%s", paths[i]);
    for (size_t f = 0; f < sizeof load_flags / sizeof *load_flags; f++) {
      int rc = same_with_and_without(data, len, load_flags[f], paths[i], &whole);
      /* a read that leaves out stacks may need the file again in full: the same answer */
      cr_assert(rc == MS_OK || (load_flags[f] && rc == MS_EUNSUPPORTED), "%s: %d", paths[i], rc);
    }
    free(data);
  }
}

/* th_cut_and_flip's case: read both ways, with or without the frees' stacks in turn. */
static void cut_or_flipped(void *ctx, const char *bytes, size_t n, const char *what, size_t k) {
  (void)ctx;
  (void)same_with_and_without(bytes, n, k % 2 ? 0 : MS_LOAD_NO_FREE_STACKS, what, NULL);
}

Test(pickle_entry, fixtures_cut_and_flipped, .timeout = 600) {
  static char paths[32][4096];
  size_t n = fixtures(paths, 32);
  for (size_t i = 0; i < n; i++) {
    size_t len = 0;
    char *data = th_read_file(paths[i], &len);
    cr_assert(data, "%s", paths[i]);
    /* the small ones: cut everywhere, and bytes flipped */
    if (len <= 64 << 10) th_cut_and_flip(data, len, paths[i], cut_or_flipped, NULL);
    free(data);
  }
}

/* Windows of the trace (ms_snapshot_load_window), which leave out the stacks of the entries
 * after them: the same snapshot either way. */
Test(pickle_entry, fixtures_windows, .timeout = 300) {
  static char paths[32][4096];
  size_t n = fixtures(paths, 32);
  for (size_t i = 0; i < n; i++) {
    ms_snapshot_t *full = NULL;
    ms_errbuf_t e0 = {{0}};
    cr_assert_eq(ms_snapshot_load(paths[i], &full, &e0), MS_OK, "%s: %s", paths[i], e0.msg);
    size_t ntrace = full->ntrace;
    int64_t t_mid = ntrace ? full->trace[ntrace / 2].time_us : 0;
    ms_snapshot_free(full);
    const ms_load_window_t w[] = {{MS_LOAD_WINDOW_ENTRIES, 0, 0},
                                  {MS_LOAD_WINDOW_ENTRIES, ntrace / 3, 0},
                                  {MS_LOAD_WINDOW_TIMES, 0, t_mid}};
    for (size_t k = 0; k < sizeof w / sizeof *w; k++) {
      ms_snapshot_t *a = NULL, *b = NULL;
      ms_errbuf_t ea = {{0}}, eb = {{0}};
      bool saved = ms__pickle_fast;
      ms__pickle_fast = true;
      int ra = ms_snapshot_load_window(paths[i], MS_LOAD_NO_FREE_STACKS, &w[k], &a, &ea);
      ms__pickle_fast = false;
      int rb = ms_snapshot_load_window(paths[i], MS_LOAD_NO_FREE_STACKS, &w[k], &b, &eb);
      ms__pickle_fast = saved;
      cr_assert_eq(ra, rb, "%s window %zu: %d '%s' / %d '%s'", paths[i], k, ra, ea.msg, rb, eb.msg);
      if (ra == MS_OK) same_snapshots(a, b, paths[i]);
      else cr_assert_str_eq(ea.msg, eb.msg);
      ms_snapshot_free(a);
      ms_snapshot_free(b);
    }
  }
}

/* A snapshot of two trace entries (device 0), Python's shape: the first names every string the
 * second may get from the memo, the second is {BODY} (the bytes between its dict's MEMOIZE and
 * MARK... SETITEMS are BODY's). Memo:
 *   0 root, 1 "segments", 2 [], 3 "device_traces", 4 [], 5 [] (device 0), 6 first entry,
 *   7 "action", 8 "alloc", 9 "addr", 10 "size", 11 "stream", 12 "time_us", 13 "frames",
 *   14 the first entry's frames list, 15 frame dict, 16 "name", 17 "f", 18 "other_key" (a key
 *   the trace ignores, given each of the next strings in turn), 19 "free_completed",
 *   20 "compile_context", 21 "N/A", 22 "pool_id", 23 "device_free", 24 "category",
 *   25 "user_metadata", 26 "x"; the second entry's dict is 27 when memoized. */
static size_t build_pair_ex(char *out, const char *body, size_t blen, bool split) {
  static const char head[] =
      TH_PICKLE_FIRST_ALLOC
      "\x8c\x09" "other_key\x94\x8c\x0e" "free_completed\x94"
      "h\x12\x8c\x0f" "compile_context\x94" "h\x12\x8c\x03N/A\x94"
      "h\x12\x8c\x07" "pool_id\x94" "h\x12\x8c\x0b" "device_free\x94"
      "h\x12\x8c\x08" "category\x94" "h\x12\x8c\x0d" "user_metadata\x94"
      "h\x12\x8c\x01x\x94"
      "u";
  size_t n = sizeof head - 1;
  memcpy(out, head, n);
  /* split: a middle entry whose frames list (memo 27) is made of gets only, then the second
   * entry in a batch of its own, so that the middle one is stored (its objects freed, its list
   * kept in the memo) before the second is read */
  static const char middle[] = "}(h\x07h\x08h\x09\x8a\x02\x00\x20h\x0d]\x94(h\x0f" "eu" "e(";
  if (split) memcpy(out + n, middle, sizeof middle - 1), n += sizeof middle - 1;
  out[n++] = '}';
  memcpy(out + n, body, blen);
  n += blen;
  static const char tail[] = "e" "a" "u.";
  memcpy(out + n, tail, sizeof tail - 1);
  return n + sizeof tail - 1;
}

static size_t build_pair(char *out, const char *body, size_t blen) {
  return build_pair_ex(out, body, blen, false);
}

#define BIN(s) s, sizeof(s) - 1
/* the second entry's frames list: two gets of the frame dict, memoized */
#define FR "h\x0d]\x94(h\x0fj\x0f\x00\x00\x00" "e"
/* a free_completed of 0x1000 (16 bytes), the frames last, as PyTorch writes it */
#define FREE "h\x07h\x13h\x09\x8a\x02\x00\x10h\x0aK\x10h\x0bK\x00h\x0cK\x06"

Test(pickle_entry, entries_as_the_general_path) {
  static const struct {
    const char *body;
    size_t len;
    int rc;     /* MS_OK: read; else the code both paths give (flags 0) */
    bool whole; /* the loop takes it (flags 0) */
  } t[] = {
      /* PyTorch's shape, memoized (Python) or not (other writers) */
      {BIN("\x94(" FREE FR "u"), MS_OK, true},
      {BIN("(" FREE FR "u"), MS_OK, true},
      /* the frames before the address (what a read leaving out stacks decides on then), an
       * action after the frames (left to the general path), keys twice */
      {BIN("\x94(h\x07h\x13" FR "h\x09\x8a\x02\x00\x10h\x0aK\x10h\x0bK\x00h\x0cK\x06u"), MS_OK,
       true},
      {BIN("\x94(" FR FREE "u"), MS_OK, false},
      {BIN("\x94(h\x0d]\x94(h\x0f" "eh\x07h\x08u"), MS_OK, false},
      {BIN("\x94(" FREE FREE FR "u"), MS_OK, false},
      {BIN("\x94(" FREE "h\x09\x8a\x02\x00\x20h\x0aK\x20" FR "u"), MS_OK, true},
      {BIN("\x94(" FREE FR FR "u"), MS_OK, false},
      /* BINPUT and LONG_BINPUT of the next index; of another */
      {BIN("q\x1b(" FREE FR "u"), MS_OK, true},
      {BIN("r\x1b\x00\x00\x00(" FREE FR "u"), MS_OK, true},
      {BIN("q\x05(" FREE FR "u"), MS_OK, false},
      /* extra fields: a compile context, a category, user metadata, an unknown action */
      {BIN("\x94(" FREE "h\x14h\x15h\x18h\x1ah\x19h\x1a" FR "u"), MS_OK, true},
      {BIN("\x94(h\x07h\x1a" FR "u"), MS_OK, true},
      /* no frames; an empty frames list; an empty dict */
      {BIN("\x94(" FREE "u"), MS_OK, true},
      {BIN("\x94(" FREE "h\x0d]\x94u"), MS_OK, false},
      {BIN("\x94"), MS_OK, false},
      /* unknown keys with any scalar; device_free for an address */
      {BIN("\x94(h\x12N" "h\x12\x88h\x12\x89h\x12h\x1ah\x12J\xff\xff\xff\xff" FREE "u"), MS_OK, true},
      {BIN("\x94(h\x07h\x08h\x17\x8a\x01\x05" FR "u"), MS_OK, true},
      /* integers of every width, a stream's negative handle, an address of 2^63 and over */
      {BIN("\x94(" FREE "h\x0bJ\xff\xff\xff\xff" "h\x09\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00" FR "u"),
       MS_OK, false},
      {BIN("\x94(" FREE "h\x09\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x0aM\xff\xff" "h\x0c\x8a\x08\xff\xff\xff\xff\xff\xff\xff\x7f" FR "u"),
       MS_OK, true},
      {BIN("\x94(" FREE "h\x0a\x8a\x00" FR "u"), MS_OK, false},
      /* wrong types and ranges: the general path's messages */
      {BIN("\x94(" FREE "h\x0ah\x1a" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x0aJ\xff\xff\xff\xff" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x0cN" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(h\x07K\x01" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(h\x07h\x08h\x16N" FR "u"), MS_EFORMAT, false},
      /* strings met for the first time: values of the extra fields (PyTorch's "N/A" of every
       * entry) and of keys the trace ignores, memoized or not, before and after the frames */
      {BIN("\x94(" FREE "h\x14\x8c\x03N/A\x94" FR "h\x19\x8c\x00\x94h\x18\x8c\x01" "cu"), MS_OK,
       true},
      {BIN("\x94(" FREE "h\x12\x8c\x02xyh\x14\x8c\x01q\x94" FR "u"), MS_OK, true},
      /* ... named twice; a key's and an action's first string; BINUNICODE: the general path */
      {BIN("\x94(" FREE "h\x14\x8c\x01q\x94h\x14h\x15" FR "u"), MS_OK, false},
      {BIN("\x94(\x8c\x01k\x94K\x01" FREE FR "u"), MS_OK, false},
      {BIN("\x94(h\x07\x8c\x05" "alloc\x94" FR "u"), MS_OK, false},
      {BIN("\x94(" FREE "h\x14X\x01\x00\x00\x00q" FR "u"), MS_OK, false},
      /* a string that is not UTF-8; a put of another index after a string */
      {BIN("\x94(" FREE "h\x14\x8c\x02\xc3\x28" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x14\x8c\x01qq\x03" FR "u"), MS_OK, false},
      /* a frame dict met for the first time in its list; a get of a string as a frame */
      {BIN("\x94(" FREE "h\x0d]\x94(h\x0f}\x94(h\x10h\x11ue" "u"), MS_OK, false},
      {BIN("\x94(" FREE "h\x0d]\x94(h\x0fh\x11" "eu"), MS_EFORMAT, false},
      /* an odd number of items, a get never stored, a container as a value */
      {BIN("\x94(" FREE "h\x0du"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x63" FR "u"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x12h\x0e" FR "u"), MS_OK, false},
      /* a key that is no string */
      {BIN("\x94(K\x01K\x02" FREE FR "u"), MS_OK, false},
      /* the batch that stores the entries: the entry twice (through the memo), an int */
      {BIN("\x94(" FREE FR "uh\x1b"), MS_EFORMAT, true},
      {BIN("\x94(" FREE FR "uK\x01"), MS_EFORMAT, true},
      /* the frames as a get of the first entry's list (a free naming its alloc's), which the
       * split cases below free first; a get of a string or of a frame dict instead */
      {BIN("\x94(" FREE "h\x0dj\x0e\x00\x00\x00u"), MS_OK, true},
      {BIN("\x94(" FREE "h\x0dh\x0eu"), MS_OK, true},
      {BIN("\x94(" FREE "h\x0dh\x11u"), MS_EFORMAT, false},
      {BIN("\x94(" FREE "h\x0dh\x0fu"), MS_EFORMAT, false},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    char buf[2048], what[64];
    size_t n = build_pair(buf, t[i].body, t[i].len), whole = 0;
    snprintf(what, sizeof what, "case %zu", i);
    int rc = same_with_and_without(buf, n, 0, what, &whole);
    cr_assert_eq(rc, t[i].rc, "case %zu: %d", i, rc);
    cr_assert_eq(whole, t[i].whole ? 1u : 0u, "case %zu: %zu entries taken whole", i, whole);
    for (size_t f = 1; f < sizeof load_flags / sizeof *load_flags; f++)
      (void)same_with_and_without(buf, n, load_flags[f], what, NULL);
    for (size_t at = 1; at < n; at++) { /* and cut anywhere */
      snprintf(what, sizeof what, "case %zu cut at %zu", i, at);
      (void)same_with_and_without(buf, at, MS_LOAD_NO_FREE_STACKS, what, NULL);
    }
    /* and after the first entry was stored in a batch of its own */
    n = build_pair_ex(buf, t[i].body, t[i].len, true);
    snprintf(what, sizeof what, "case %zu split", i);
    for (size_t f = 0; f < sizeof load_flags / sizeof *load_flags; f++)
      (void)same_with_and_without(buf, n, load_flags[f], what, NULL);
  }
}

/* An entry naming the frames list of one whose objects were freed (as a free names its alloc's):
 * the list made again from the memo, by the entry loop as by the general path. */
Test(pickle_entry, frames_got_after_their_entry_was_freed) {
  char buf[2048];
  size_t n = build_pair_ex(buf, BIN("\x94(" FREE "h\x0dh\x1bu"), true), whole = 0;
  for (size_t f = 0; f < sizeof load_flags / sizeof *load_flags; f++) {
    int rc = same_with_and_without(buf, n, load_flags[f], "split", &whole);
    if (load_flags[f] & MS_LOAD_NO_TRACE_STACKS) continue; /* whatever both ways say */
    cr_assert_eq(rc, MS_OK, "flags %u: %d", load_flags[f], rc);
    cr_assert_eq(whole, 2u, "flags %u: %zu", load_flags[f], whole); /* the middle one too */
    cr_assert_eq(ms__pickle_last_revived, 1u, "flags %u: %zu", load_flags[f],
                 ms__pickle_last_revived);
  }
}

/* Windows of the trace on hand-made entries: whether a stack is left out depends on the entry's
 * index, which a window finds from the record's place, so a frames list got from the memo by an
 * alloc (as well as by a free) is decided the same way by both paths. */
Test(pickle_entry, windows_of_entries_as_the_general_path) {
  static const struct {
    const char *body;
    size_t len;
  } t[] = {
      {BIN("\x94(h\x07h\x08h\x09\x8a\x02\x00\x20h\x0aK\x10h\x0dh\x0eu")}, /* alloc, got */
      {BIN("\x94(" FREE "h\x0dh\x0eu")},                                     /* free, got */
      {BIN("\x94(h\x07h\x08h\x09\x8a\x02\x00\x20h\x0aK\x10" FR "u")},         /* alloc, own */
      {BIN("\x94(" FREE FR "u")},                                               /* free, own */
  };
  char *dir = th_tmpdir(), path[4200];
  snprintf(path, sizeof path, "%s/pair.pickle", dir);
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    for (int split = 0; split < 2; split++) {
      char buf[2048];
      size_t n = build_pair_ex(buf, t[i].body, t[i].len, split);
      FILE *fp = fopen(path, "wb");
      cr_assert(fp && fwrite(buf, 1, n, fp) == n && fclose(fp) == 0);
      const ms_load_window_t w[] = {{MS_LOAD_WINDOW_ENTRIES, 0, 0},
                                    {MS_LOAD_WINDOW_ENTRIES, 1, 0},
                                    {MS_LOAD_WINDOW_TIMES, 0, 5}};
      for (size_t k = 0; k < sizeof w / sizeof *w; k++) {
        for (unsigned fl = 0; fl < 2; fl++) {
          unsigned flags = fl ? MS_LOAD_NO_FREE_STACKS : 0;
          ms_snapshot_t *a = NULL, *b = NULL;
          ms_errbuf_t ea = {{0}}, eb = {{0}};
          bool saved = ms__pickle_fast;
          ms__pickle_fast = true;
          int ra = ms_snapshot_load_window(path, flags, &w[k], &a, &ea);
          ms__pickle_fast = false;
          int rb = ms_snapshot_load_window(path, flags, &w[k], &b, &eb);
          ms__pickle_fast = saved;
          cr_assert_eq(ra, rb, "case %zu split %d window %zu flags %u: %d '%s' / %d '%s'", i,
                       split, k, flags, ra, ea.msg, rb, eb.msg);
          if (ra == MS_OK) same_snapshots(a, b, "window");
          else cr_assert_str_eq(ea.msg, eb.msg);
          ms_snapshot_free(a);
          ms_snapshot_free(b);
        }
      }
    }
  }
  unlink(path);
  th_rmdir(dir);
  free(dir);
}
