/* SPDX-License-Identifier: MIT
 * Tests of the pickle reader's freeing of the objects that nothing can name again
 * (lib/snapshot/pickle_retire.c, issue #33): every file reads to the same model, or fails with
 * the same message, with the objects freed (ms__pickle_recycle, the default) and kept; a long
 * trace holds a bounded number of objects; a frames list named again after its entry was freed
 * comes back as it was, and so do the paths of messages about it.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "helpers.h"
#include "memsnap/pickle.h"
#include "model/snapbuild.h"

typedef th_bytes_t pk_t;

/* ---- reading both ways ----------------------------------------------------------------------- */

typedef struct both_s {
  int rc;
  char msg[512];
  ms_snapshot_t *s;
  size_t objs, revived;
} both_t;

static both_t read_one(const pk_t *k, unsigned flags, bool recycle) {
  both_t b = {0};
  ms_errbuf_t eb;
  bool saved = ms__pickle_recycle;
  ms__pickle_recycle = recycle;
  b.rc = th_pickle_read_mem(k->p, k->n, flags, &b.s, &eb);
  ms__pickle_recycle = saved;
  snprintf(b.msg, sizeof b.msg, "%s", b.rc == MS_OK ? "" : eb.msg);
  b.objs = ms__pickle_last_objs;
  b.revived = ms__pickle_last_revived;
  return b;
}

/* The same trace (records, stacks and their frames) in a and b. */
static void eq_trace(const ms_snapshot_t *a, const ms_snapshot_t *b) {
  cr_assert_eq(a->ntrace, b->ntrace);
  cr_assert_eq(a->nstacks, b->nstacks);
  cr_assert_eq(a->nframes, b->nframes);
  for (size_t i = 0; i < a->ntrace; i++) {
    const ms_snap_trace_t *x = &a->trace[i], *y = &b->trace[i];
    cr_assert_eq(x->action, y->action, "entry %zu", i);
    cr_assert_eq(x->addr, y->addr, "entry %zu", i);
    cr_assert_eq(x->size, y->size, "entry %zu", i);
    cr_assert_eq(x->present, y->present, "entry %zu", i);
    cr_assert_eq(x->stack, y->stack, "entry %zu", i);
  }
  for (size_t i = 0; i < a->nstacks; i++) {
    size_t n = ms_snap_stack_depth(a, (uint32_t)i);
    cr_assert_eq(n, ms_snap_stack_depth(b, (uint32_t)i));
    for (size_t j = 0; j < n; j++)
      cr_assert_eq(ms_snap_stack_frame(a, (uint32_t)i, j)->line,
                   ms_snap_stack_frame(b, (uint32_t)i, j)->line);
  }
}

/* Reads k with flags both ways: the same answer. @return the answer with the objects freed (its
 * snapshot the caller's). */
static both_t read_both(const pk_t *k, unsigned flags) {
  both_t on = read_one(k, flags, true), off = read_one(k, flags, false);
  cr_assert_eq(on.rc, off.rc, "freed: %s (%s); kept: %s (%s)", ms_err_name(on.rc), on.msg,
               ms_err_name(off.rc), off.msg);
  cr_assert_str_eq(on.msg, off.msg);
  cr_assert_eq(off.revived, 0);
  if (on.rc == MS_OK) eq_trace(on.s, off.s);
  ms_snapshot_free(off.s);
  return on;
}

static const unsigned every_flags[] = {0, MS_LOAD_NO_TRACE_STACKS, MS_LOAD_NO_FREE_STACKS};

/* ---- files written op by op ------------------------------------------------------------------ */

/* A file with one device list whose entries come one batch each (MARK entry APPENDS), so that
 * each entry is freed before the next one is read. Memo entry 0 is the one frame dict, met in
 * the first entry's frames list. */
typedef struct tf_s {
  pk_t k;
  uint32_t memo; /* the memo's length */
} tf_t;

static void tf_begin(tf_t *t) {
  memset(t, 0, sizeof *t);
  th_bytes_sink_write(&t->k, "\x80\x04}(", 4);
  th_pickle_str(&t->k, "segments");
  th_bytes_sink_write(&t->k, "]", 1);
  th_pickle_str(&t->k, "device_traces");
  th_bytes_sink_write(&t->k, "](]", 3); /* device_traces, MARK, the device's list */
}

static void tf_get(tf_t *t, uint32_t idx) {
  th_bytes_sink_write(&t->k, "j", 1);
  th_bytes_put_le(&t->k, idx, 4);
}

/* The fields of an entry before its frames, in its dict's SETITEMS. */
static void tf_fields(tf_t *t, const char *action, int64_t addr) {
  th_pickle_str(&t->k, "action");
  th_pickle_str(&t->k, action);
  th_pickle_str(&t->k, "addr");
  th_pickle_int(&t->k, addr);
  th_pickle_str(&t->k, "size");
  th_pickle_int(&t->k, 512);
  th_pickle_str(&t->k, "frames");
}

/* A new frames list of n frames, memoized when put: @return its memo index. The file's first
 * frame makes the frame dict (memo entry 0); every other frame is a get of it. */
static uint32_t tf_list(tf_t *t, int n, bool put) {
  th_bytes_sink_write(&t->k, "]", 1);
  uint32_t at = UINT32_MAX;
  if (put) {
    th_bytes_sink_write(&t->k, "\x94", 1);
    at = t->memo++;
  }
  th_bytes_sink_write(&t->k, "(", 1);
  for (int i = 0; i < n; i++) {
    if (t->memo > 0) {
      tf_get(t, 0);
      continue;
    }
    th_bytes_sink_write(&t->k, "}\x94(", 3);
    t->memo++;
    th_pickle_str(&t->k, "name");
    th_pickle_str(&t->k, "f");
    th_pickle_str(&t->k, "filename");
    th_pickle_str(&t->k, "a.py");
    th_pickle_str(&t->k, "line");
    th_pickle_int(&t->k, 7);
    th_bytes_sink_write(&t->k, "u", 1);
  }
  th_bytes_sink_write(&t->k, "e", 1);
  return at;
}

/* One entry in its own batch; frames: a new list of `n` frames (memoized when put), or, when
 * get >= 0, memo entry get. @return the new list's memo index. */
static uint32_t tf_entry(tf_t *t, const char *action, int64_t addr, int n, bool put, int64_t get) {
  th_bytes_sink_write(&t->k, "(}(", 3);
  tf_fields(t, action, addr);
  uint32_t at = UINT32_MAX;
  if (get >= 0)
    tf_get(t, (uint32_t)get);
  else
    at = tf_list(t, n, put);
  th_bytes_sink_write(&t->k, "ue", 2); /* the entry, the batch */
  return at;
}

static void tf_end(tf_t *t) {
  th_bytes_sink_write(&t->k, "eu.", 3); /* device_traces, root */
}

/* The shape of the start of every file here: entry 0 makes the frame dict (memo 0) in a list
 * that is not memoized. */
static void tf_start(tf_t *t) {
  tf_begin(t);
  tf_entry(t, "alloc", 4096, 1, false, -1);
  cr_assert_eq(t->memo, 1u);
}

/* ---- tests ----------------------------------------------------------------------------------- */

Test(pickle_retire, shared_frames_list_named_after_its_entry_was_freed) {
  /* PyTorch's shape without memoized entries: an alloc's list, memo-got again by its
   * free_requested and free_completed, each read after the entry before it was freed */
  tf_t t;
  tf_start(&t);
  uint32_t fl = tf_entry(&t, "alloc", 8192, 2, true, -1);
  tf_entry(&t, "free_requested", 8192, 0, false, fl);
  tf_entry(&t, "free_completed", 8192, 0, false, fl);
  tf_entry(&t, "alloc", 12288, 3, true, -1); /* one that nothing names again */
  tf_end(&t);
  for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
    both_t b = read_both(&t.k, every_flags[f]);
    cr_assert_eq(b.rc, MS_OK, "%s", b.msg);
    cr_assert_eq(b.s->ntrace, 5);
    /* made again for each get: the entry that took it freed it again */
    cr_assert_eq(b.revived, 2, "flags %u", every_flags[f]);
    if (every_flags[f] == 0) {
      cr_assert_eq(b.s->trace[2].stack, b.s->trace[1].stack);
      cr_assert_eq(b.s->trace[3].stack, b.s->trace[1].stack);
      cr_assert_eq(ms_snap_stack_depth(b.s, b.s->trace[1].stack), 2);
      cr_assert_eq(ms_snap_stack_depth(b.s, b.s->trace[4].stack), 3);
    }
    ms_snapshot_free(b.s);
  }
  free(t.k.p);
}

Test(pickle_retire, memoized_entry_dict_fetched_again) {
  /* a memoized entry is never freed: fetched again and stored twice, it is refused by its path */
  tf_t t;
  tf_start(&t);
  th_bytes_sink_write(&t.k, "(}\x94(", 4);
  uint32_t e = t.memo++;
  tf_fields(&t, "alloc", 8192);
  tf_list(&t, 1, true);
  th_bytes_sink_write(&t.k, "ue", 2);
  tf_entry(&t, "alloc", 12288, 1, true, -1);
  th_bytes_sink_write(&t.k, "(", 1);
  tf_get(&t, e);
  th_bytes_sink_write(&t.k, "e", 1);
  tf_end(&t);
  for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
    both_t b = read_both(&t.k, every_flags[f]);
    cr_assert_eq(b.rc, MS_EFORMAT);
    cr_assert(strstr(b.msg, ": device_traces[0][1]: the same dict is stored twice (shared through "
                            "the memo)"),
              "%s", b.msg);
  }
  /* fetched again into a place of its own (an unknown key of the root): the file reads */
  tf_t u;
  tf_start(&u);
  th_bytes_sink_write(&u.k, "(}\x94(", 4);
  e = u.memo++;
  tf_fields(&u, "alloc", 8192);
  tf_list(&u, 1, true);
  th_bytes_sink_write(&u.k, "ue", 2);
  th_bytes_sink_write(&u.k, "e", 1); /* device_traces */
  th_pickle_str(&u.k, "again");
  tf_get(&u, e);
  th_bytes_sink_write(&u.k, "u.", 2);
  both_t b = read_both(&u.k, 0);
  cr_assert_eq(b.rc, MS_OK, "%s", b.msg);
  cr_assert_eq(b.s->ntrace, 2);
  ms_snapshot_free(b.s);
  free(t.k.p);
  free(u.k.p);
}

Test(pickle_retire, errors_in_recycled_and_revived_containers) {
  /* an entry that takes a freed entry's object: its path is its own */
  tf_t t;
  tf_start(&t);
  for (int i = 0; i < 4; i++)
    tf_entry(&t, "alloc", 8192 * (i + 2), 1, true, -1);
  th_bytes_sink_write(&t.k, "(}(", 3);
  th_pickle_str(&t.k, "size");
  th_pickle_str(&t.k, "big");
  th_bytes_sink_write(&t.k, "ue", 2);
  tf_end(&t);
  both_t b = read_both(&t.k, 0);
  cr_assert_eq(b.rc, MS_EFORMAT);
  cr_assert(strstr(b.msg, ": device_traces[0][5].size: expected int, got str"), "%s", b.msg);
  free(t.k.p);

  /* a freed list named again and modified: the path of the list, through its freed entry */
  for (int shape = 0; shape < 3; shape++) {
    tf_t u;
    tf_start(&u);
    tf_entry(&u, "alloc", 8192, 1, false, -1);
    uint32_t fl = tf_entry(&u, "alloc", 12288, 2, true, -1);
    tf_entry(&u, "free_requested", 12288, 0, false, fl);
    if (shape == 0) { /* APPENDS into it */
      tf_get(&u, fl);
      th_bytes_sink_write(&u.k, "(", 1);
      tf_get(&u, 0);
      th_bytes_sink_write(&u.k, "e", 1);
    } else if (shape == 1) { /* a dict made as its next item, with a bad frame field */
      tf_get(&u, fl);
      th_bytes_sink_write(&u.k, "}(", 2);
      th_pickle_str(&u.k, "name");
      th_pickle_int(&u.k, 1);
      th_bytes_sink_write(&u.k, "u", 1);
    } else { /* stored as a block's frames after the trace: a place of another role */
      th_bytes_sink_write(&u.k, "(", 1);
      th_bytes_sink_write(&u.k, "}(", 2);
      th_pickle_str(&u.k, "frames");
      tf_get(&u, fl);
      th_pickle_str(&u.k, "action");
      th_pickle_int(&u.k, 3);
      th_bytes_sink_write(&u.k, "ue", 2);
    }
    tf_end(&u);
    static const char *const want[] = {
        ": device_traces[0][2].frames: modified after it was used (shared through the memo)",
        ": device_traces[0][2].frames[2].name: expected str, got int",
        ": device_traces[0][4].action: expected str, got int",
    };
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t c = read_both(&u.k, every_flags[f]);
      /* a list left out (MS_LOAD_NO_TRACE_STACKS) cannot be a kept entry's frames */
      bool left_out = shape == 2 && every_flags[f] == MS_LOAD_NO_TRACE_STACKS;
      cr_assert_eq(c.rc, left_out ? MS_EUNSUPPORTED : MS_EFORMAT, "shape %d: %s", shape, c.msg);
      cr_assert(strstr(c.msg, left_out ? ": device_traces[0][4].frames: needs a stack that was "
                                         "left out, so the trace's stacks cannot be skipped"
                                       : want[shape]),
                "shape %d: %s", shape, c.msg);
      cr_assert_eq(c.revived, 2, "shape %d", shape); /* for entry 3, then for the error */
    }
    free(u.k.p);
  }
}

/* A memsnap snapshot of n trace entries on one device, each alloc's stack its own (two frames of
 * 300); with share, the allocs come first and then their frees, each with its alloc's stack as
 * PyTorch records a block's frees (the writer memo-gets the alloc's list, long after its entry). */
static ms_snapshot_t *long_trace(size_t n, bool share) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  uint32_t fr[300];
  for (int i = 0; i < 300; i++)
    cr_assert_eq(ms__snapbuild_frame(&b, "f", 1, "m.py", 4, i, &fr[i]), MS_OK);
  uint32_t *st = calloc(n, sizeof *st);
  cr_assert_not_null(st);
  for (size_t i = 0; i < n; i++) {
    bool is_free = share && i >= n / 2;
    size_t block = is_free ? i - n / 2 : i;
    ms_snap_trace_t t = {0};
    const char *an = is_free ? "free_completed" : "alloc";
    t.action = (uint8_t)ms_trace_action_parse(an);
    ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
    x.action_name = an;
    t.addr = 0x10000 + block * 512;
    t.size = 512;
    if (!is_free) {
      uint32_t two[2] = {fr[i % 300], fr[(i / 300) % 300]};
      cr_assert_eq(ms__snapbuild_stack(&b, two, 2, &st[i]), MS_OK);
    }
    t.stack = st[block];
    cr_assert_eq(ms__snapbuild_trace_extra(&b, &t, &x), MS_OK);
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  free(st);
  ms_snap_device_t dev = {0};
  dev.ntrace = (uint32_t)n;
  cr_assert_eq(ms__snapbuild_add_device(&b, &dev), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

Test(pickle_retire, objects_stay_bounded_on_a_long_trace, .timeout = 120) {
  for (int share = 0; share < 2; share++) {
    const size_t n = 20000;
    ms_snapshot_t *s = long_trace(n, share);
    pk_t k = {0};
    ms_sink_t sink = {th_bytes_sink_write, &k};
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_pickle_write(s, &sink, &eb), MS_OK, "%s", eb.msg);
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t off = read_one(&k, every_flags[f], false);
      cr_assert_eq(off.rc, MS_OK, "%s", off.msg);
      cr_assert_geq(off.objs, 3 * n / 2, "share %d flags %u: %zu objects", share, every_flags[f],
                    off.objs);
      ms_snapshot_free(off.s);
      both_t on = read_both(&k, every_flags[f]);
      cr_assert_eq(on.rc, MS_OK, "%s", on.msg);
      cr_assert_eq(on.s->ntrace, n);
      /* a batch of the writer's (1000 entries, each with its list and, for a list made again,
       * the entry behind it), the frame dicts with the lists and entries they were first met in:
       * a list made again is freed with the entry that takes it */
      size_t bound = 3 * 1000 + 3 * 300 + 64;
      cr_assert_leq(on.objs, bound, "share %d flags %u: %zu objects, %zu lists revived", share,
                    every_flags[f], on.objs, on.revived);
      if (share)
        cr_assert_gt(on.revived, n / 4, "%zu", on.revived);
      else
        cr_assert_eq(on.revived, 0);
      ms_snapshot_free(on.s);
    }
    free(k.p);
    ms_snapshot_free(s);
  }
}

Test(pickle_retire, fixtures_read_the_same_both_ways, .timeout = 300) {
  /* (cranberrii's and wedsonlin's traces name some frames lists again after their entries went
   * into the memo: their objects are made again) */
  static const char *const names[] = {
      "a0kuma_adamw_small",    "jogregoire_diffusion_tiny",
      "maphsge_select_n_4dev", "yiyi_flexgen_oom_legacy",
      "cranberrii_ftcourse",   "wedsonlin_cs336_medium_1024_training"};
  for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), names[i]);
    size_t len = 0;
    char *p = th_read_text(path, &len);
    if (!p) {
      printf("SKIP: PyTorch fixture %s not found (set MEMSNAP_TORCH_FIXTURES)\n", path);
      fflush(stdout);
      cr_skip_test("fixture %s not found", path);
    }
    pk_t k = {p, len, len};
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t b = read_both(&k, every_flags[f]);
      cr_assert_eq(b.rc, MS_OK, "%s: %s", names[i], b.msg);
      if (i >= 4) cr_assert_gt(b.revived, 0, "%s flags %u", names[i], every_flags[f]);
      ms_snapshot_free(b.s);
    }
    free(p);
  }
}

/* ---- entries that the memo names (Python's files) -------------------------------------------- */

/* An entry whose dict is memoized (MEMOIZE: Python's pickler puts every container), in the
 * batch open: frames a new list of n frames (memoized), or, when get >= 0, memo entry get.
 * *dict: its dict's memo index. @return its new list's memo index (UINT32_MAX: got). */
static uint32_t tf_pentry(tf_t *t, const char *action, int64_t addr, int n, int64_t get,
                          uint32_t *dict) {
  th_bytes_sink_write(&t->k, "}\x94(", 3);
  uint32_t d = t->memo++;
  if (dict) *dict = d;
  tf_fields(t, action, addr);
  uint32_t at = UINT32_MAX;
  if (get >= 0)
    tf_get(t, (uint32_t)get);
  else
    at = tf_list(t, n, true);
  th_bytes_sink_write(&t->k, "u", 1);
  return at;
}

/* A batch of the device list's entries (MARK ... APPENDS): its entries are freed at its end. */
static void tf_batch(tf_t *t) {
  th_bytes_sink_write(&t->k, "(", 1);
}

static void tf_batch_end(tf_t *t) {
  th_bytes_sink_write(&t->k, "e", 1);
}

Test(pickle_retire, python_entries_go_into_the_memo_with_their_lists) {
  /* PyTorch's shape in Python's files: an alloc with its list; a free_requested with its own,
   * which the free_completed after it takes (in its batch, or in the next one); a free long after
   * the alloc that takes the alloc's list */
  for (int shape = 0; shape < 2; shape++) {
    tf_t t;
    tf_start(&t);
    tf_batch(&t);
    uint32_t fa = tf_pentry(&t, "alloc", 8192, 2, -1, NULL);
    tf_batch_end(&t);
    tf_batch(&t);
    uint32_t f1 = tf_pentry(&t, "free_requested", 8192, 3, -1, NULL);
    if (shape == 1) {
      tf_batch_end(&t);
      tf_batch(&t);
    }
    tf_pentry(&t, "free_completed", 8192, 0, f1, NULL);
    tf_batch_end(&t);
    tf_batch(&t);
    tf_pentry(&t, "free_completed", 8192, 0, fa, NULL);
    tf_batch_end(&t);
    tf_end(&t);
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t b = read_both(&t.k, every_flags[f]);
      cr_assert_eq(b.rc, MS_OK, "shape %d flags %u: %s", shape, every_flags[f], b.msg);
      cr_assert_eq(b.s->ntrace, 5);
      /* made again: the alloc's list for the last entry; the free_requested's for the
       * free_completed of the next batch */
      cr_assert_eq(b.revived, shape == 0 ? 1u : 2u, "shape %d flags %u", shape, every_flags[f]);
      if (every_flags[f] == 0) {
        cr_assert_eq(ms_snap_stack_depth(b.s, b.s->trace[1].stack), 2);
        cr_assert_eq(ms_snap_stack_depth(b.s, b.s->trace[2].stack), 3);
        cr_assert_eq(b.s->trace[3].stack, b.s->trace[2].stack);
        cr_assert_eq(b.s->trace[4].stack, b.s->trace[1].stack);
      }
      ms_snapshot_free(b.s);
    }
    free(t.k.p);
  }
}

Test(pickle_retire, python_entry_named_again_after_it_was_freed) {
  /* stored again into the device list: refused by the path of the entry made again, whether it
   * went with its list (entry 1) or alone (entry 2, whose frames are entry 1's list) */
  for (int alone = 0; alone < 2; alone++) {
    tf_t t;
    tf_start(&t);
    uint32_t d1, d2;
    tf_batch(&t);
    uint32_t fl = tf_pentry(&t, "free_requested", 8192, 2, -1, &d1);
    tf_pentry(&t, "free_completed", 8192, 0, fl, &d2);
    tf_batch_end(&t);
    tf_batch(&t);
    tf_pentry(&t, "alloc", 12288, 1, -1, NULL);
    tf_batch_end(&t);
    tf_batch(&t);
    tf_get(&t, alone ? d2 : d1);
    tf_batch_end(&t);
    tf_end(&t);
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t b = read_both(&t.k, every_flags[f]);
      cr_assert_eq(b.rc, MS_EFORMAT, "alone %d: %s", alone, b.msg);
      cr_assert(strstr(b.msg, alone ? ": device_traces[0][2]: the same dict is stored twice "
                                      "(shared through the memo)"
                                    : ": device_traces[0][1]: the same dict is stored twice "
                                      "(shared through the memo)"),
                "alone %d: %s", alone, b.msg);
      cr_assert_eq(b.revived, 1, "alone %d flags %u", alone, every_flags[f]);
    }
    free(t.k.p);
  }
  /* into a place of its own (an unknown key of an entry), then its list named by a later entry:
   * made again once, and the list the memo holds is the one made again with it */
  tf_t u;
  tf_start(&u);
  uint32_t d;
  tf_batch(&u);
  uint32_t fl = tf_pentry(&u, "alloc", 8192, 2, -1, &d);
  tf_batch_end(&u);
  tf_batch(&u);
  th_bytes_sink_write(&u.k, "}(", 2);
  th_pickle_str(&u.k, "seen");
  tf_get(&u, d);
  tf_fields(&u, "free_completed", 8192);
  tf_get(&u, fl);
  th_bytes_sink_write(&u.k, "u", 1);
  tf_batch_end(&u);
  tf_end(&u);
  for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
    both_t b = read_both(&u.k, every_flags[f]);
    cr_assert_eq(b.rc, MS_OK, "%s", b.msg);
    cr_assert_eq(b.s->ntrace, 3);
    cr_assert_eq(b.revived, 1, "flags %u", every_flags[f]);
    if (every_flags[f] == 0) cr_assert_eq(b.s->trace[2].stack, b.s->trace[1].stack);
    ms_snapshot_free(b.s);
  }
  free(u.k.p);
}

Test(pickle_retire, memo_entries_stored_again_over_freed_entries) {
  /* the memo entry of a freed entry (which = 0) or of its list (1) stored again with 77: the
   * entry and list made again by a get of the other do not take it back, and a get of it gives
   * 77 (the next entry's size) */
  for (int which = 0; which < 2; which++) {
    tf_t t;
    tf_start(&t);
    uint32_t d;
    tf_batch(&t);
    uint32_t fl = tf_pentry(&t, "alloc", 8192, 2, -1, &d);
    tf_batch_end(&t);
    tf_batch(&t);
    th_bytes_sink_write(&t.k, "}(", 2);
    tf_fields(&t, "alloc", 12288);
    tf_list(&t, 1, false);
    th_pickle_str(&t.k, "padding");
    th_bytes_sink_write(&t.k, "KMr", 3); /* 77, LONG_BINPUT */
    th_bytes_put_le(&t.k, which ? fl : d, 4);
    th_bytes_sink_write(&t.k, "u", 1);
    tf_batch_end(&t);
    tf_batch(&t);
    th_bytes_sink_write(&t.k, "}(", 2);
    th_pickle_str(&t.k, "seen");
    tf_get(&t, which ? d : fl); /* makes both again */
    th_pickle_str(&t.k, "action");
    th_pickle_str(&t.k, "free_completed");
    th_pickle_str(&t.k, "addr");
    th_pickle_int(&t.k, 8192);
    th_pickle_str(&t.k, "size");
    tf_get(&t, which ? fl : d);
    th_bytes_sink_write(&t.k, "u", 1);
    tf_batch_end(&t);
    tf_end(&t);
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t b = read_both(&t.k, every_flags[f]);
      cr_assert_eq(b.rc, MS_OK, "which %d: %s", which, b.msg);
      cr_assert_eq(b.s->ntrace, 4);
      cr_assert_eq(b.s->trace[3].size, 77, "which %d flags %u", which, every_flags[f]);
      cr_assert_eq(b.revived, 1, "which %d flags %u", which, every_flags[f]);
      ms_snapshot_free(b.s);
    }
    free(t.k.p);
  }
}

Test(pickle_retire, python_entries_far_from_their_lists_in_the_memo_stay) {
  /* an entry whose list's memo index is not within 255 after its own (300 integers memoized
   * between them; or both put over earlier entries, the list below the entry): the memo could not
   * find one from the other, so both stay, and later gets of both find them */
  for (int shape = 0; shape < 2; shape++) {
    tf_t t;
    tf_start(&t);
    uint32_t d, fl;
    tf_batch(&t);
    if (shape == 0) {
      th_bytes_sink_write(&t.k, "}\x94(", 3);
      d = t.memo++;
      th_pickle_str(&t.k, "padding");
      th_bytes_sink_write(&t.k, "](", 2);
      for (int i = 0; i < 300; i++) {
        th_bytes_sink_write(&t.k, "K\x01\x94", 3);
        t.memo++;
      }
      th_bytes_sink_write(&t.k, "e", 1);
      tf_fields(&t, "alloc", 8192);
      fl = tf_list(&t, 2, true);
      th_bytes_sink_write(&t.k, "u", 1);
    } else {
      uint32_t m = t.memo; /* ten integers in an entry of its own */
      th_bytes_sink_write(&t.k, "}(", 2);
      tf_fields(&t, "alloc", 4096 * 3);
      tf_list(&t, 1, false);
      th_pickle_str(&t.k, "padding");
      th_bytes_sink_write(&t.k, "](", 2);
      for (int i = 0; i < 10; i++) {
        th_bytes_sink_write(&t.k, "K\x01\x94", 3);
        t.memo++;
      }
      th_bytes_sink_write(&t.k, "eu", 2);
      d = m + 9, fl = m;
      th_bytes_sink_write(&t.k, "}r", 2); /* LONG_BINPUT over the last integer */
      th_bytes_put_le(&t.k, d, 4);
      th_bytes_sink_write(&t.k, "(", 1);
      tf_fields(&t, "alloc", 8192);
      th_bytes_sink_write(&t.k, "]r", 2); /* over the first */
      th_bytes_put_le(&t.k, fl, 4);
      th_bytes_sink_write(&t.k, "(", 1);
      tf_get(&t, 0);
      tf_get(&t, 0);
      th_bytes_sink_write(&t.k, "eu", 2);
    }
    tf_batch_end(&t);
    tf_batch(&t);
    th_bytes_sink_write(&t.k, "}(", 2);
    th_pickle_str(&t.k, "seen");
    tf_get(&t, d);
    tf_fields(&t, "free_completed", 8192);
    tf_get(&t, fl);
    th_bytes_sink_write(&t.k, "u", 1);
    tf_batch_end(&t);
    tf_end(&t);
    for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
      both_t b = read_both(&t.k, every_flags[f]);
      cr_assert_eq(b.rc, MS_OK, "shape %d: %s", shape, b.msg);
      size_t n = b.s->ntrace;
      cr_assert_eq(n, shape == 0 ? 3u : 4u);
      cr_assert_eq(b.revived, 0, "shape %d flags %u", shape, every_flags[f]);
      if (every_flags[f] == 0) {
        cr_assert_eq(b.s->trace[n - 1].stack, b.s->trace[n - 2].stack);
        cr_assert_eq(ms_snap_stack_depth(b.s, b.s->trace[n - 1].stack), 2);
      }
      ms_snapshot_free(b.s);
    }
    free(t.k.p);
  }
}

Test(pickle_retire, python_objects_stay_bounded_on_a_long_trace, .timeout = 120) {
  /* 3,000 blocks, each an alloc, a free_requested and a free_completed that takes the
   * free_requested's list, every container memoized, in batches of 100 entries */
  const size_t n = 3000, batch = 100;
  tf_t t;
  tf_start(&t);
  size_t in_batch = 0, straddles = 0;
  tf_batch(&t);
  for (size_t i = 0; i < n; i++) {
    for (int k = 0; k < 3; k++) {
      if (in_batch == batch) {
        tf_batch_end(&t);
        tf_batch(&t);
        in_batch = 0;
      }
      static uint32_t fr;
      int64_t addr = 8192 + (int64_t)i * 512;
      if (k == 0)
        tf_pentry(&t, "alloc", addr, 2, -1, NULL);
      else if (k == 1)
        fr = tf_pentry(&t, "free_requested", addr, 1, -1, NULL);
      else
        tf_pentry(&t, "free_completed", addr, 0, fr, NULL);
      straddles += k == 2 && in_batch == 0;
      in_batch++;
    }
  }
  tf_batch_end(&t);
  tf_end(&t);
  for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
    both_t off = read_one(&t.k, every_flags[f], false);
    cr_assert_eq(off.rc, MS_OK, "%s", off.msg);
    cr_assert_geq(off.objs, 5 * n, "flags %u: %zu objects", every_flags[f], off.objs);
    ms_snapshot_free(off.s);
    both_t on = read_both(&t.k, every_flags[f]);
    cr_assert_eq(on.rc, MS_OK, "%s", on.msg);
    cr_assert_eq(on.s->ntrace, 3 * n + 1);
    /* a batch's entries and lists, the first entry's, and the frame dict */
    cr_assert_leq(on.objs, 2 * batch + 8, "flags %u: %zu objects", every_flags[f], on.objs);
    /* a free_completed that begins a batch makes its free_requested's list again */
    cr_assert_eq(on.revived, straddles, "flags %u", every_flags[f]);
    ms_snapshot_free(on.s);
  }
  free(t.k.p);
}

/* ---- the frame cache of a run of gets (pickle_frames.c) -------------------------------------- */

/* A frame dict of `line`, memoized (MEMOIZE) or put at memo index `at` (LONG_BINPUT). */
static void tf_frame(tf_t *t, int64_t line, int64_t at) {
  th_bytes_sink_write(&t->k, "}", 1);
  if (at < 0) {
    th_bytes_sink_write(&t->k, "\x94", 1);
    t->memo++;
  } else {
    th_bytes_sink_write(&t->k, "r", 1);
    th_bytes_put_le(&t->k, (uint64_t)at, 4);
  }
  th_bytes_sink_write(&t->k, "(", 1);
  th_pickle_str(&t->k, "name");
  th_pickle_str(&t->k, "f");
  th_pickle_str(&t->k, "filename");
  th_pickle_str(&t->k, "a.py");
  th_pickle_str(&t->k, "line");
  th_pickle_int(&t->k, line);
  th_bytes_sink_write(&t->k, "u", 1);
}

/* An entry (in its own batch) whose frames list is a run of gets of the memo indices idx. */
static void tf_run_entry(tf_t *t, int64_t addr, const uint32_t *idx, size_t n) {
  th_bytes_sink_write(&t->k, "(}(", 3);
  tf_fields(t, "alloc", addr);
  th_bytes_sink_write(&t->k, "](", 2);
  for (size_t i = 0; i < n; i++) tf_get(t, idx[i]);
  th_bytes_sink_write(&t->k, "eue", 3);
}

/* The lines of entry i's frames, in order, are want[0..n). */
static void tf_expect_lines(const ms_snapshot_t *s, size_t i, const int64_t *want, size_t n) {
  uint32_t st = s->trace[i].stack;
  cr_assert_eq(ms_snap_stack_depth(s, st), n, "entry %zu", i);
  for (size_t j = 0; j < n; j++)
    cr_assert_eq(ms_snap_stack_frame(s, st, j)->line, want[j], "entry %zu frame %zu", i, j);
}

Test(pickle_frames, a_frame_replaced_in_the_memo_is_not_named_by_the_cache) {
  /* memo 0: the frame of line 7, named by a run of gets (the cache takes it), then replaced by
   * a frame of line 9 put at the same index: a later run names the new one */
  tf_t t;
  tf_start(&t);
  static const uint32_t zeros[3] = {0, 0, 0};
  tf_run_entry(&t, 8192, zeros, 3);
  th_bytes_sink_write(&t.k, "(}(", 3);
  tf_fields(&t, "alloc", 12288);
  th_bytes_sink_write(&t.k, "](", 2);
  tf_frame(&t, 9, 0);
  th_bytes_sink_write(&t.k, "eue", 3);
  tf_run_entry(&t, 16384, zeros, 2);
  tf_end(&t);
  for (size_t f = 0; f < sizeof every_flags / sizeof every_flags[0]; f++) {
    both_t b = read_both(&t.k, every_flags[f]);
    cr_assert_eq(b.rc, MS_OK, "%s", b.msg);
    cr_assert_eq(b.s->ntrace, 4);
    if (every_flags[f] == 0) {
      tf_expect_lines(b.s, 1, (const int64_t[]){7, 7, 7}, 3);
      tf_expect_lines(b.s, 2, (const int64_t[]){9}, 1);
      tf_expect_lines(b.s, 3, (const int64_t[]){9, 9}, 2);
    }
    ms_snapshot_free(b.s);
  }
  free(t.k.p);

  /* replaced by a string: the run fails as a list of gets read one by one fails */
  for (int shape = 0; shape < 2; shape++) {
    tf_t u;
    tf_start(&u);
    tf_run_entry(&u, 8192, zeros, 3);
    th_bytes_sink_write(&u.k, "(}(", 3);
    th_pickle_str(&u.k, "action");
    th_pickle_str(&u.k, "alloc");
    th_bytes_sink_write(&u.k, "q\x00", 2); /* BINPUT 0: the string */
    th_bytes_sink_write(&u.k, "ue", 2);
    if (shape == 0) {
      tf_run_entry(&u, 16384, zeros, 2);
    } else { /* the same frames, appended one get at a time (APPEND) */
      th_bytes_sink_write(&u.k, "(}(", 3);
      tf_fields(&u, "alloc", 16384);
      th_bytes_sink_write(&u.k, "]", 1);
      for (int i = 0; i < 2; i++) {
        tf_get(&u, 0);
        th_bytes_sink_write(&u.k, "a", 1);
      }
      th_bytes_sink_write(&u.k, "ue", 2);
    }
    tf_end(&u);
    both_t c = read_both(&u.k, 0);
    cr_assert_eq(c.rc, MS_EFORMAT, "shape %d: %s", shape, c.msg);
    cr_assert(strstr(c.msg, ": device_traces[0][3].frames[0]: expected dict, got str"),
              "shape %d: %s", shape, c.msg);
    free(u.k.p);
  }
}

Test(pickle_frames, frames_whose_memo_indices_share_a_cache_slot) {
  /* memo 0: the frame of line 7; 8,191 integers memoized in an entry's unknown key; memo 8,192
   * (0 + the cache's 8,192 slots): the frame of line 9. Runs that alternate them. */
  tf_t t;
  tf_start(&t);
  th_bytes_sink_write(&t.k, "(}(", 3);
  tf_fields(&t, "alloc", 8192);
  th_bytes_sink_write(&t.k, "](", 2);
  tf_get(&t, 0);
  th_bytes_sink_write(&t.k, "e", 1);
  th_pickle_str(&t.k, "padding");
  th_bytes_sink_write(&t.k, "](", 2);
  for (int i = 0; i < 8191; i++) {
    th_bytes_sink_write(&t.k, "K\x01\x94", 3);
    t.memo++;
  }
  th_bytes_sink_write(&t.k, "eue", 3);
  cr_assert_eq(t.memo, 8192u);
  th_bytes_sink_write(&t.k, "(}(", 3);
  tf_fields(&t, "alloc", 12288);
  th_bytes_sink_write(&t.k, "](", 2);
  tf_frame(&t, 9, -1);
  th_bytes_sink_write(&t.k, "eue", 3);
  tf_run_entry(&t, 16384, (const uint32_t[]){0, 8192, 0, 8192, 8192, 0}, 6);
  tf_run_entry(&t, 20480, (const uint32_t[]){8192, 0}, 2);
  tf_end(&t);
  both_t b = read_both(&t.k, 0);
  cr_assert_eq(b.rc, MS_OK, "%s", b.msg);
  cr_assert_eq(b.s->ntrace, 5);
  tf_expect_lines(b.s, 1, (const int64_t[]){7}, 1);
  tf_expect_lines(b.s, 2, (const int64_t[]){9}, 1);
  tf_expect_lines(b.s, 3, (const int64_t[]){7, 9, 7, 9, 9, 7}, 6);
  tf_expect_lines(b.s, 4, (const int64_t[]){9, 7}, 2);
  ms_snapshot_free(b.s);
  free(t.k.p);
}
