/* SPDX-License-Identifier: MIT
 * Tests of memsnap/compare.h and `memsnap compare` / `memsnap check` (issue #28): built training
 * runs with ProfilerStep#N annotations, a leak of a fixed size per step from a known line, the
 * change by source between two and four steps in both formats, the gate's limits and every exit
 * code of `check`, and reserved memory that a fresh-start replay makes independent of the pool's
 * history.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/vec.h"
#include "helpers.h"
#include "memsnap/compare.h"
#include "memsnap/pickle.h"
#include "memsnap/replay.h"
#include "memsnap/serialize.h"
#include "model/snapbuild.h"

#define MIB (1ull << 20)
#define T0 1777000000000000ll
#define BASE 0x7f0000000000ull

/* ---- a builder of runs: pre-existing segments, allocs and frees at given addresses ---------- */

typedef struct tb_blk_s {
  uint64_t addr, size;
  uint32_t stack;
  bool live;
} tb_blk_t;

typedef struct tb_s {
  ms__snapbuild_t b;
  MS_VEC(tb_blk_t) blk;
  uint64_t seg_addr[4], seg_size[4];
  int nseg;
  int device; /* the device of the segments and the trace (the lower ones are empty) */
  int64_t t;
} tb_t;

static void tb_init(tb_t *tb) {
  memset(tb, 0, sizeof *tb);
  ms__snapbuild_init(&tb->b);
  tb->b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  tb->b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_ANNOTATIONS;
}

/* A Python stack of one user frame: FUNC at /home/u/train.py:LINE. */
static uint32_t tb_stack(tb_t *tb, const char *fn, int line) {
  uint32_t fr, st;
  const char *file = "/home/u/train.py";
  cr_assert_eq(ms__snapbuild_frame(&tb->b, fn, strlen(fn), file, strlen(file), line, &fr), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&tb->b, &fr, 1, &st), MS_OK);
  return st;
}

static void tb_trace(tb_t *tb, ms_trace_action act, uint64_t addr, uint64_t size, uint32_t st) {
  ms_snap_trace_t e;
  memset(&e, 0, sizeof e);
  e.action = (uint8_t)act;
  e.addr = addr;
  e.size = size;
  e.stack = st;
  e.time_us = T0 + tb->t++;
  e.present = MS_TRACE_HAS_TIME | (st != MS_SNAP_NO_STACK ? MS_TRACE_HAS_FRAMES : 0);
  cr_assert_eq(ms__snapbuild_add_trace(&tb->b, &e), MS_OK);
}

static void tb_alloc(tb_t *tb, uint64_t addr, uint64_t size, uint32_t st, bool traced) {
  tb_blk_t x = {addr, size, st, true};
  cr_assert_eq(MS_VEC_PUSH(&tb->blk, x), 0);
  if (traced) tb_trace(tb, MS_TRACE_ALLOC, addr, size, st);
}

static void tb_free(tb_t *tb, uint64_t addr) {
  for (size_t i = 0; i < tb->blk.len; i++)
    if (tb->blk.ptr[i].addr == addr && tb->blk.ptr[i].live) {
      tb->blk.ptr[i].live = false;
      tb_trace(tb, MS_TRACE_FREE_REQUESTED, addr, tb->blk.ptr[i].size, MS_SNAP_NO_STACK);
      tb_trace(tb, MS_TRACE_FREE_COMPLETED, addr, tb->blk.ptr[i].size, MS_SNAP_NO_STACK);
      return;
    }
  cr_assert_fail("no live block at %llx", (unsigned long long)addr);
}

static void tb_mark(tb_t *tb, int64_t step, const char *stage) {
  static char names[64][32];
  snprintf(names[step], sizeof names[0], "ProfilerStep#%lld", (long long)step);
  ms_snap_annotation_t a = {names[step], stage, 0, T0 + tb->t++};
  cr_assert_eq(MS_VEC_PUSH(&tb->b.annotations, a), 0);
}

static int tb_blk_cmp(const void *a, const void *b) {
  const tb_blk_t *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static void tb_block(tb_t *tb, uint64_t addr, uint64_t size, bool live, uint32_t st) {
  ms_snap_block_t bl;
  memset(&bl, 0, sizeof bl);
  bl.address = addr;
  bl.size = size;
  bl.requested_size = live ? size : 0;
  bl.state = live ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
  bl.state_name = live ? "active_allocated" : "inactive";
  bl.stack = st;
  bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  cr_assert_eq(ms__snapbuild_add_block(&tb->b, &bl), MS_OK);
}

/* The end state: each segment tiled by its live blocks and free gaps. */
static ms_snapshot_t *tb_finish(tb_t *tb) {
  qsort(tb->blk.ptr, tb->blk.len, sizeof *tb->blk.ptr, tb_blk_cmp);
  for (int s = 0; s < tb->nseg; s++) {
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.address = tb->seg_addr[s];
    g.total_size = tb->seg_size[s];
    g.is_large = true;
    g.device = tb->device;
    g.stack = MS_SNAP_NO_STACK;
    g.first_block = (uint32_t)tb->b.blocks.len;
    uint64_t at = g.address, end = g.address + g.total_size;
    for (size_t i = 0; i < tb->blk.len; i++) {
      const tb_blk_t *x = &tb->blk.ptr[i];
      if (!x->live || x->addr < g.address || x->addr >= end) continue;
      if (x->addr > at) tb_block(tb, at, x->addr - at, false, MS_SNAP_NO_STACK);
      tb_block(tb, x->addr, x->size, true, x->stack);
      g.allocated_size += x->size;
      at = x->addr + x->size;
    }
    if (at < end) tb_block(tb, at, end - at, false, MS_SNAP_NO_STACK);
    g.active_size = g.requested_size = g.allocated_size;
    g.nblocks = (uint32_t)(tb->b.blocks.len - g.first_block);
    g.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE;
    cr_assert_eq(ms__snapbuild_add_segment(&tb->b, &g), MS_OK);
  }
  for (int k = 0; k <= tb->device; k++) {
    ms_snap_device_t d;
    memset(&d, 0, sizeof d);
    d.ntrace = k == tb->device ? (uint32_t)tb->b.trace.len : 0;
    cr_assert_eq(ms__snapbuild_add_device(&tb->b, &d), MS_OK);
  }
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&tb->b, &s, &eb), MS_OK, "%s", eb.msg);
  MS_VEC_FREE(&tb->blk);
  return s;
}

/* A training run of `steps` steps in one 256 MiB segment: a 16 MiB parameter alive before the
 * trace; per step (ProfilerStep#N) a 4 MiB activation (line 30, freed in the step), a 2 MiB
 * gradient (line 50, freed by the next step) and `leak` bytes (line 40) that are never freed. */
static ms_snapshot_t *build_run_on(int device, int steps, uint64_t leak) {
  tb_t tb;
  tb_init(&tb);
  tb.device = device;
  tb.seg_addr[0] = BASE;
  tb.seg_size[0] = 256 * MIB;
  tb.nseg = 1;
  uint32_t act = tb_stack(&tb, "forward", 30), lk = tb_stack(&tb, "remember", 40),
           grad = tb_stack(&tb, "backward", 50), par = tb_stack(&tb, "init", 10);
  tb_alloc(&tb, BASE, 16 * MIB, par, false);
  uint64_t next = BASE + 16 * MIB, prev_grad = 0;
  for (int s = 1; s <= steps; s++) {
    tb_mark(&tb, s, "START");
    uint64_t a = next;
    tb_alloc(&tb, a, 4 * MIB, act, true);
    next += 4 * MIB;
    if (prev_grad) tb_free(&tb, prev_grad);
    if (leak) {
      tb_alloc(&tb, next, leak, lk, true);
      next += leak;
    }
    tb_alloc(&tb, next, 2 * MIB, grad, true);
    prev_grad = next;
    next += 2 * MIB;
    tb_free(&tb, a);
    tb_mark(&tb, s, "END");
  }
  return tb_finish(&tb);
}

static ms_snapshot_t *build_run(int steps, uint64_t leak) {
  return build_run_on(0, steps, leak);
}

/* The end state of build_run(2, 0) without its trace: a parameter and a gradient. */
static ms_snapshot_t *build_no_trace(void) {
  tb_t tb;
  tb_init(&tb);
  tb.seg_addr[0] = BASE;
  tb.seg_size[0] = 256 * MIB;
  tb.nseg = 1;
  tb_alloc(&tb, BASE, 16 * MIB, tb_stack(&tb, "init", 10), false);
  tb_alloc(&tb, BASE + 20 * MIB, 2 * MIB, tb_stack(&tb, "backward", 50), false);
  return tb_finish(&tb);
}

static const ms_compare_row_t *row_of(const ms_compare_t *c, const char *needle) {
  for (size_t i = 0; i < c->nsource; i++)
    if (strstr(c->by_source[i].key, needle)) return &c->by_source[i];
  return NULL;
}

/* ---- comparison ------------------------------------------------------------------------------ */

Test(compare, leak_of_fixed_size_per_step_is_named_with_its_size) {
  ms_snapshot_t *s = build_run(6, 3 * MIB);
  ms_compare_t *c = NULL;
  ms_errbuf_t eb = {{0}};
  ms_compare_options_t o;
  ms_compare_options_init(&o);
  o.has_moment[0] = o.has_moment[1] = true;
  o.moment[0] = (ms_tl_moment_t){MS_TL_MOMENT_ENTRY, -1};
  o.moment[1] = (ms_tl_moment_t){MS_TL_MOMENT_END, 0};
  cr_assert_eq(ms_compare_run(s, s, &o, &c, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(c->steps, 6);
  cr_assert_eq(c->nleaks, 1, "suspects: %zu", c->nleaks);
  const ms_compare_leak_t *l = &c->leaks[0];
  cr_expect(strstr(l->source, "train.py:40 remember"), "%s", l->source);
  cr_expect_eq(l->per_step, 3 * MIB);
  cr_expect_eq(l->blocks_per_step, 1);
  cr_expect_eq(l->first_step, 1);
  cr_expect_eq(l->last_step, 6);
  cr_expect_eq(l->nsteps, 6);
  cr_expect_eq(l->total, 18 * MIB);
  /* the change from before the trace to the end: the leak, the last gradient */
  cr_expect_eq(c->side[1].allocated - c->side[0].allocated, 18 * MIB + 2 * MIB);
  const ms_compare_row_t *r = row_of(c, "train.py:40");
  cr_assert(r);
  cr_expect_eq(r->change, (int64_t)(18 * MIB));
  cr_expect_eq(r->before, 0);
  r = row_of(c, "train.py:50");
  cr_assert(r);
  cr_expect_eq(r->change, (int64_t)(2 * MIB));
  cr_expect_eq(c->by_source[0].change, (int64_t)(18 * MIB), "largest first");
  cr_expect_eq(c->leaks_step, c->side[1].nentries);
  ms_compare_free(c);
  /* by default (each side at its peak) the leaks are still looked for at AFTER's end */
  cr_assert_eq(ms_compare_run(s, s, NULL, &c, &eb), MS_OK, "%s", eb.msg);
  cr_expect_lt(c->side[1].step, c->side[1].nentries, "the peak is not the end");
  cr_expect_eq(c->leaks_step, c->side[1].nentries);
  cr_expect_eq(c->nleaks, 1);
  cr_expect_eq(c->nleaks ? c->leaks[0].per_step : 0, 3 * MIB);
  ms_compare_free(c);
  /* at a moment given for AFTER (the end of step 3), the steps that ended by then */
  o.moment[1] = (ms_tl_moment_t){MS_TL_MOMENT_STEP, 3};
  cr_assert_eq(ms_compare_run(s, s, &o, &c, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(c->steps, 3);
  cr_expect_eq(c->nleaks, 1);
  cr_expect_eq(c->nleaks ? c->leaks[0].total : 0, 9 * MIB);
  cr_expect_eq(c->nleaks ? c->leaks[0].last_step : 0, 3);
  ms_compare_free(c);
  o.moment[1] = (ms_tl_moment_t){MS_TL_MOMENT_END, 0};
  /* no leak: the activations and gradients are not suspects */
  ms_snapshot_t *clean = build_run(6, 0);
  cr_assert_eq(ms_compare_run(clean, clean, &o, &c, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(c->steps, 6);
  cr_expect_eq(c->nleaks, 0);
  ms_compare_free(c);
  ms_snapshot_free(clean);
  ms_snapshot_free(s);
}

static ms_snapshot_t *reload(const ms_snapshot_t *s, const char *dir, const char *name, bool pickle) {
  char path[512];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  ms_errbuf_t eb = {{0}};
  if (pickle) cr_assert_eq(ms_pickle_write_file(s, path, &eb), MS_OK, "%s", eb.msg);
  else cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_t *r = NULL;
  cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_OK, "%s", eb.msg);
  return r;
}

Test(compare, known_growth_between_two_runs_in_both_formats) {
  ms_snapshot_t *two = build_run(2, 1 * MIB), *four = build_run(4, 1 * MIB);
  char *dir = th_tmpdir();
  for (int pickle = 0; pickle < 2; pickle++) {
    ms_snapshot_t *a = reload(two, dir, pickle ? "a.pickle" : "a.msnap", pickle);
    ms_snapshot_t *b = reload(four, dir, pickle ? "b.pickle" : "b.msnap", pickle);
    ms_compare_options_t o;
    ms_compare_options_init(&o);
    o.has_moment[0] = o.has_moment[1] = true;
    o.moment[0] = o.moment[1] = (ms_tl_moment_t){MS_TL_MOMENT_END, 0};
    ms_compare_t *c = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_compare_run(a, b, &o, &c, &eb), MS_OK, "%s", eb.msg);
    /* end: parameter 16 + leaks (2 or 4) + the last gradient 2 */
    cr_expect_eq(c->side[0].allocated, 20 * MIB);
    cr_expect_eq(c->side[1].allocated, 22 * MIB);
    cr_expect_eq(c->side[0].reserved, 256 * MIB);
    cr_expect_eq(c->side[1].reserved, 256 * MIB);
    cr_expect_eq(c->side[0].segments, 1);
    cr_expect_eq(c->side[0].blocks, 4);
    cr_expect_eq(c->side[1].blocks, 6);
    /* peak: the parameter, the leaks so far, the last gradient and the activation, and in the
     * step the new gradient before the old one is freed */
    cr_expect_eq(c->side[0].peak_allocated, (16 + 2 + 4 + 2 + 2) * MIB - 2 * MIB);
    cr_expect_eq(c->side[1].peak_allocated, (16 + 4 + 4 + 2) * MIB);
    cr_expect_eq(c->nsource_all, 1, "only the leak's line changed");
    const ms_compare_row_t *r = row_of(c, "train.py:40 remember");
    cr_assert(r, "%s", c->nsource ? c->by_source[0].key : "none");
    cr_expect_eq(r->before, 2 * MIB);
    cr_expect_eq(r->after, 4 * MIB);
    cr_expect_eq(r->change, (int64_t)(2 * MIB));
    cr_expect_eq(r->blocks_after - r->blocks_before, 2);
    int64_t cats = 0;
    for (int k = 0; k < MS_CAT_COUNT; k++) cats += c->by_category[k].change;
    cr_expect_eq(cats, (int64_t)(2 * MIB), "the categories add up to the change");
    cr_expect_eq(c->nsettings, 0);
    cr_expect_eq(c->nleaks, 1);
    cr_expect_eq(c->leaks[0].per_step, 1 * MIB);
    cr_expect_eq(c->leaks[0].nsteps, 4);
    ms_compare_free(c);
    ms_snapshot_free(a);
    ms_snapshot_free(b);
  }
  th_rmdir(dir);
  free(dir);
  ms_snapshot_free(two);
  ms_snapshot_free(four);
}

Test(compare, hostile_sides_are_refused_with_a_reason) {
  ms_snapshot_t *s = build_run(2, 0);
  ms_compare_options_t o;
  ms_compare_options_init(&o);
  o.device = 3;
  ms_compare_t *c = NULL;
  ms_errbuf_t eb = {{0}};
  cr_expect_eq(ms_compare_run(s, s, &o, &c, &eb), MS_EINVAL);
  cr_expect(strstr(eb.msg, "BEFORE has no device 3"), "%s", eb.msg);
  cr_expect_null(c);
  ms_compare_free(c);
  ms_snapshot_free(s);
}

/* x and y say the same: sides, rows by source and category, settings, leak suspects. */
static void expect_same_comparison(const ms_compare_t *x, const ms_compare_t *y) {
  for (int k = 0; k < 2; k++)
    cr_expect(memcmp(&x->side[k], &y->side[k], sizeof x->side[k]) == 0, "side %d", k);
  cr_assert_eq(x->nsource_all, y->nsource_all);
  cr_assert_eq(x->nsource, y->nsource);
  for (size_t i = 0; i < x->nsource; i++) {
    cr_expect_str_eq(x->by_source[i].key, y->by_source[i].key);
    cr_expect_eq(x->by_source[i].change, y->by_source[i].change);
    cr_expect_eq(x->by_source[i].blocks_after, y->by_source[i].blocks_after);
  }
  for (int k = 0; k < MS_CAT_COUNT; k++)
    cr_expect_eq(x->by_category[k].change, y->by_category[k].change, "%d", k);
  cr_expect_eq(x->nsettings, y->nsettings);
  cr_expect_eq(x->nsettings_same, y->nsettings_same);
  cr_assert_eq(x->nleaks, y->nleaks);
  for (size_t i = 0; i < x->nleaks; i++)
    cr_expect_eq(x->leaks[i].per_step, y->leaks[i].per_step);
  cr_expect_eq(x->steps, y->steps);
}

/* One side at a time (each snapshot freed once added) gives what ms_compare_run gives on both. */
Test(compare, one_side_at_a_time_equals_both_at_once) {
  ms_snapshot_t *two = build_run(2, 1 * MIB), *four = build_run(4, 1 * MIB);
  ms_compare_t *whole = NULL, *parts = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_compare_run(two, four, NULL, &whole, &eb), MS_OK, "%s", eb.msg);
  ms_compare_build_t *b = NULL;
  cr_assert_eq(ms_compare_begin(NULL, &b), MS_OK);
  cr_assert_eq(ms_compare_add(b, two, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(two); /* BEFORE is not read again */
  cr_assert_eq(ms_compare_add(b, four, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_compare_add(b, four, &eb), MS_EINVAL, "a third side");
  cr_assert_eq(ms_compare_finish(b, &parts), MS_OK);
  expect_same_comparison(whole, parts);
  cr_expect_eq(parts->side[1].peak_allocated, (16 + 4 + 4 + 2) * MIB);
  cr_expect_eq(parts->nleaks, 1);
  ms_compare_free(whole);
  ms_compare_free(parts);
  /* one side only: finish refuses (and frees); a side the options do not fit names itself */
  cr_assert_eq(ms_compare_begin(NULL, &b), MS_OK);
  cr_assert_eq(ms_compare_add(b, four, &eb), MS_OK, "%s", eb.msg);
  parts = NULL;
  cr_expect_eq(ms_compare_finish(b, &parts), MS_EINVAL);
  cr_expect_null(parts);
  ms_compare_options_t o;
  ms_compare_options_init(&o);
  o.device = 3;
  cr_assert_eq(ms_compare_begin(&o, &b), MS_OK);
  cr_expect_eq(ms_compare_add(b, four, &eb), MS_EINVAL);
  cr_expect(strstr(eb.msg, "BEFORE has no device 3"), "%s", eb.msg);
  ms_compare_build_free(b);
  ms_snapshot_free(four);
}

/* The sides added by two threads at once (ms_compare_add_side, as `compare` reads two files), or
 * AFTER before BEFORE, give ms_compare_run's comparison; a side added twice or a third side is
 * refused, and a failed side leaves the comparison unfinishable. */
typedef struct side_job_s {
  ms_compare_build_t *b;
  int k;
  const ms_snapshot_t *s;
  int rc;
  ms_errbuf_t eb;
} side_job_t;

static void *side_job_main(void *arg) {
  side_job_t *j = arg;
  j->rc = ms_compare_add_side(j->b, j->k, j->s, NULL, &j->eb);
  return NULL;
}


Test(compare, two_threads_add_the_sides_at_once) {
  ms_snapshot_t *two = build_run(2, 1 * MIB), *four = build_run(4, 1 * MIB);
  ms_compare_t *whole = NULL, *c = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_compare_run(two, four, NULL, &whole, &eb), MS_OK, "%s", eb.msg);
  for (int round = 0; round < 8; round++) {
    ms_compare_build_t *b = NULL;
    cr_assert_eq(ms_compare_begin(NULL, &b), MS_OK);
    side_job_t j[2] = {{b, 1, four, -1, {{0}}}, {b, 0, two, -1, {{0}}}};
    pthread_t th[2];
    for (int t = 0; t < 2; t++)
      cr_assert_eq(pthread_create(&th[t], NULL, side_job_main, &j[t]), 0);
    for (int t = 0; t < 2; t++) {
      pthread_join(th[t], NULL);
      cr_assert_eq(j[t].rc, MS_OK, "%s", j[t].eb.msg);
    }
    cr_assert_eq(ms_compare_finish(b, &c), MS_OK);
    expect_same_comparison(whole, c);
    cr_expect_eq(c->nleaks, 1);
    ms_compare_free(c);
  }
  /* AFTER first, then BEFORE through ms_compare_add: the first side not added */
  ms_compare_build_t *b = NULL;
  cr_assert_eq(ms_compare_begin(NULL, &b), MS_OK);
  cr_assert_eq(ms_compare_add_side(b, 1, four, NULL, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(ms_compare_add_side(b, 1, four, NULL, &eb), MS_EINVAL, "AFTER twice");
  cr_expect_eq(ms_compare_add_side(b, 2, four, NULL, &eb), MS_EINVAL, "a side 2");
  cr_expect_eq(ms_compare_add_side(b, -1, four, NULL, &eb), MS_EINVAL, "a side -1");
  cr_assert_eq(ms_compare_add(b, two, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(ms_compare_add(b, two, &eb), MS_EINVAL, "a third side");
  cr_assert_eq(ms_compare_finish(b, &c), MS_OK);
  expect_same_comparison(whole, c);
  ms_compare_free(c);
  /* a failed side does not stop the other (being added on another thread); finish refuses */
  ms_compare_options_t o;
  ms_compare_options_init(&o);
  o.device = 3;
  cr_assert_eq(ms_compare_begin(&o, &b), MS_OK);
  cr_expect_eq(ms_compare_add_side(b, 1, four, NULL, &eb), MS_EINVAL);
  cr_expect(strstr(eb.msg, "AFTER has no device 3"), "%s", eb.msg);
  cr_expect_eq(ms_compare_add_side(b, 0, two, NULL, &eb), MS_EINVAL);
  cr_expect(strstr(eb.msg, "BEFORE has no device 3"), "%s", eb.msg);
  c = NULL;
  cr_expect_eq(ms_compare_finish(b, &c), MS_EINVAL);
  cr_expect_null(c);
  ms_compare_free(whole);
  ms_snapshot_free(two);
  ms_snapshot_free(four);
}

/* A side given its time index (as the command gets it from the snapshot cache) gives the same
 * comparison; the index stays the caller's; another snapshot's index is refused. */
Test(compare, a_given_index_gives_the_same) {
  ms_snapshot_t *two = build_run(2, 1 * MIB), *four = build_run(4, 1 * MIB);
  ms_compare_t *whole = NULL, *given = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_compare_run(two, four, NULL, &whole, &eb), MS_OK, "%s", eb.msg);
  ms_timeline_t *tl2 = NULL, *tl4 = NULL;
  cr_assert_eq(ms_timeline_create(two, NULL, &tl2, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_timeline_create(four, NULL, &tl4, &eb), MS_OK, "%s", eb.msg);
  ms_compare_build_t *b = NULL;
  cr_assert_eq(ms_compare_begin(NULL, &b), MS_OK);
  cr_assert_eq(ms_compare_add_indexed(b, two, tl4, &eb), MS_EINVAL);
  cr_expect_str_eq(eb.msg, "BEFORE: the time index is another snapshot's");
  cr_assert_eq(ms_compare_add_indexed(b, two, tl2, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_compare_add_indexed(b, four, tl4, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_compare_finish(b, &given), MS_OK);
  cr_expect_eq(ms_timeline_nentries(tl4, 0), given->side[1].nentries, "the index is still alive");
  expect_same_comparison(whole, given);
  cr_expect_eq(given->nleaks, 1);
  ms_compare_free(whole);
  ms_compare_free(given);
  ms_timeline_destroy(tl2);
  ms_timeline_destroy(tl4);
  ms_snapshot_free(two);
  ms_snapshot_free(four);
}

/* ---- the gate -------------------------------------------------------------------------------- */

Test(gate, limits_absolute_and_relative_with_units) {
  ms_gate_limit_t l;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_gate_limit_parse("peak_allocated<=20GiB", &l, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(l.figure, MS_FIG_PEAK_ALLOCATED);
  cr_expect_eq(l.op, MS_GATE_LE);
  cr_expect(!l.relative);
  cr_expect_eq(l.value, 20ll << 30);
  const struct { const char *t; int64_t v; bool rel, pct; ms_gate_op op; } ok[] = {
      {"peak_reserved<=+5%", 500, true, true, MS_GATE_LE},
      {"peak_reserved <= -2.5%", -250, true, true, MS_GATE_LE},
      {"peak_reserved<+512MiB", 512ll << 20, true, false, MS_GATE_LT},
      {"final_allocated>=1.5G", 3ll << 29, false, false, MS_GATE_GE},
      {"device_mallocs>3", 3, false, false, MS_GATE_GT},
      {"peak_requested<=4K", 4096, false, false, MS_GATE_LE},
      {"peak_requested<=4KiB", 4096, false, false, MS_GATE_LE},
      {"peak_requested<=7M", 7ll << 20, false, false, MS_GATE_LE},
      {"peak_activation<=100B", 100, false, false, MS_GATE_LE},
  };
  for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
    cr_assert_eq(ms_gate_limit_parse(ok[i].t, &l, &eb), MS_OK, "%s: %s", ok[i].t, eb.msg);
    cr_expect_eq(l.value, ok[i].v, "%s", ok[i].t);
    cr_expect_eq(l.relative, ok[i].rel, "%s", ok[i].t);
    cr_expect_eq(l.percent, ok[i].pct, "%s", ok[i].t);
    cr_expect_eq(l.op, ok[i].op, "%s", ok[i].t);
  }
  const struct { const char *t; int err; const char *msg; } bad[] = {
      {"peak_foo<=1G", MS_ENOTFOUND, "unknown figure 'peak_foo'"},
      {"peak_allocated", MS_EINVAL, "is not FIGURE<=VALUE"},
      {"peak_allocated=1G", MS_EINVAL, "is not FIGURE<=VALUE"},
      {"<=1G", MS_EINVAL, "names no figure"},
      {"peak_allocated<=", MS_EINVAL, "no value"},
      {"peak_allocated<=1Q", MS_EINVAL, "unexpected 'Q'"},
      {"peak_allocated<=5%", MS_EINVAL, "a percentage is relative"},
      {"peak_allocated<=G", MS_EINVAL, "expected a number"},
      {"peak_allocated<=1.", MS_EINVAL, "expected digits after the point"},
      {"peak_allocated<=99999999999T", MS_EINVAL, "too large"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_expect_eq(ms_gate_limit_parse(bad[i].t, &l, &eb), bad[i].err, "%s", bad[i].t);
    cr_expect(strstr(eb.msg, bad[i].msg), "%s: %s", bad[i].t, eb.msg);
  }
  uint64_t bound;
  cr_assert_eq(ms_gate_limit_parse("peak_reserved<=+5%", &l, NULL), MS_OK);
  cr_expect(ms_gate_holds(&l, 105, 100, &bound));
  cr_expect_eq(bound, 105);
  cr_expect(!ms_gate_holds(&l, 106, 100, &bound));
  cr_assert_eq(ms_gate_limit_parse("peak_reserved<+1K", &l, NULL), MS_OK);
  cr_expect(!ms_gate_holds(&l, 2048, 1024, &bound));
  cr_expect(ms_gate_holds(&l, 2047, 1024, &bound));
  cr_assert_eq(ms_gate_limit_parse("peak_reserved<=-200%", &l, NULL), MS_OK);
  cr_expect(ms_gate_holds(&l, 0, 100, &bound) && bound == 0, "a bound below 0 is 0");
  for (int f = 0; f < MS_FIG_COUNT; f++)
    if (f >= MS_FIG_CATEGORY0) {
      char want[64];
      snprintf(want, sizeof want, "peak_%s", ms_category_name((ms_category)(f - MS_FIG_CATEGORY0)));
      cr_expect_str_eq(ms_gate_figure_name((ms_gate_figure)f), want);
    }
}

Test(gate, recorded_figures_of_a_built_run) {
  ms_snapshot_t *s = build_run(4, 1 * MIB);
  ms_gate_figures_t f;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_gate_figures(s, NULL, &f, &eb), MS_OK, "%s", eb.msg);
  cr_expect(!f.replayed);
  cr_expect_eq(f.value[MS_FIG_PEAK_ALLOCATED], 26 * MIB);
  cr_expect_eq(f.value[MS_FIG_PEAK_RESERVED], 256 * MIB);
  cr_expect_eq(f.value[MS_FIG_FINAL_ALLOCATED], 22 * MIB);
  cr_expect_eq(f.value[MS_FIG_DEVICE_MALLOCS], 0);
  cr_expect_eq(f.value[MS_FIG_OOMS], 0);
  cr_expect(!f.known[MS_FIG_ALLOC_RETRIES], "a pickle-like run records no retries");
  uint64_t cats = 0;
  for (int k = 0; k < MS_CAT_COUNT; k++) {
    cr_expect(f.known[MS_FIG_CATEGORY0 + k]);
    cats += f.value[MS_FIG_CATEGORY0 + k] ? 1 : 0;
  }
  cr_expect(cats > 0);
  ms_snapshot_free(s);
}

/* Two traces of the same work (a 4 MiB parameter alive, then 8 MiB allocated and freed) from
 * different pool histories: A's pool holds one 64 MiB segment, B's also a cached 32 MiB one.
 * Recorded peak reserved: 64 MiB and 96 MiB. From a fresh allocator both reserve one 20 MiB
 * segment (PyTorch's kLargeBuffer for requests under 10 MiB), which both requests share. */
static ms_snapshot_t *build_history(bool cached) {
  tb_t tb;
  tb_init(&tb);
  tb.seg_addr[0] = BASE;
  tb.seg_size[0] = 64 * MIB;
  tb.nseg = 1;
  if (cached) {
    tb.seg_addr[1] = BASE + 256 * MIB;
    tb.seg_size[1] = 32 * MIB;
    tb.nseg = 2;
  }
  uint32_t par = tb_stack(&tb, "init", 10), work = tb_stack(&tb, "forward", 30);
  tb_alloc(&tb, BASE, 4 * MIB, par, false);
  uint64_t at = cached ? BASE + 256 * MIB : BASE + 4 * MIB; /* best fit: the smaller free block */
  tb_alloc(&tb, at, 8 * MIB, work, true);
  tb_free(&tb, at);
  return tb_finish(&tb);
}

Test(gate, fresh_start_replay_makes_reserved_reproducible) {
  ms_snapshot_t *a = build_history(false), *b = build_history(true);
  ms_gate_figures_t fa, fb;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_gate_figures(a, NULL, &fa, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_gate_figures(b, NULL, &fb, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(fa.value[MS_FIG_PEAK_RESERVED], 64 * MIB);
  cr_expect_eq(fb.value[MS_FIG_PEAK_RESERVED], 96 * MIB);
  cr_expect_eq(fa.value[MS_FIG_PEAK_ALLOCATED], 12 * MIB);
  cr_expect_eq(fb.value[MS_FIG_PEAK_ALLOCATED], 12 * MIB);
  ms_gate_options_t o;
  ms_gate_options_init(&o);
  o.replay = true;
  cr_assert_eq(ms_gate_figures(a, &o, &fa, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_gate_figures(b, &o, &fb, &eb), MS_OK, "%s", eb.msg);
  cr_expect(fa.replayed && fb.replayed);
  cr_expect_eq(fa.value[MS_FIG_PEAK_RESERVED], 20 * MIB);
  cr_expect_eq(fb.value[MS_FIG_PEAK_RESERVED], 20 * MIB);
  cr_expect_eq(fa.value[MS_FIG_PEAK_ALLOCATED], 12 * MIB);
  cr_expect_eq(fb.value[MS_FIG_PEAK_ALLOCATED], 12 * MIB);
  cr_expect_eq(fa.value[MS_FIG_DEVICE_MALLOCS], 0, "the start state's segment is not counted");
  /* without fresh_start the what-if keeps the recorded pool, and the difference */
  ms_replay_options_t ro;
  ms_replay_options_init(&ro);
  ro.whatif = true;
  ms_replay_report_t *ra = NULL, *rb = NULL;
  cr_assert_eq(ms_replay_run(a, &ro, &ra, &eb), MS_OK);
  cr_assert_eq(ms_replay_run(b, &ro, &rb, &eb), MS_OK);
  cr_expect_eq(ra->devices[0].replayed.peak_reserved, 64 * MIB);
  cr_expect_eq(rb->devices[0].replayed.peak_reserved, 96 * MIB);
  ms_replay_report_free(ra);
  ms_replay_report_free(rb);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
}

/* ---- the commands ---------------------------------------------------------------------------- */

static int run_cmd(const char *cmd, char *out, size_t cap) {
  const char *bin = getenv("MEMSNAP_BIN");
  char line[4096];
  snprintf(line, sizeof line, "%s %s 2>&1", bin && *bin ? bin : "memsnap", cmd);
  FILE *p = popen(line, "r");
  cr_assert(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(gate, check_exit_codes_and_lines) {
  char *dir = th_tmpdir();
  ms_snapshot_t *two = build_run(2, 1 * MIB), *four = build_run(4, 1 * MIB);
  ms_snapshot_t *a = reload(two, dir, "two.pickle", true), *b = reload(four, dir, "four.msnap", false);
  char cmd[2048], out[16384];
  /* 0: every limit holds */
  snprintf(cmd, sizeof cmd, "check %s/four.msnap --limit 'peak_allocated<=26MiB' --limit "
           "'ooms<=0' --limit 'peak_reserved<=+0%%' --baseline %s/two.pickle", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "ok   peak_allocated: 26.0MiB, limit 26.0MiB"), "%s", out);
  cr_expect(strstr(out, "0 of 3 limits broken"), "%s", out);
  /* 1: broken, with the sources that grew most */
  snprintf(cmd, sizeof cmd, "check %s/four.msnap --baseline %s/two.pickle --limit "
           "'peak_allocated<=+1MiB' --limit 'final_allocated<25M'", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "FAIL peak_allocated: 26.0MiB, limit 25.0MiB (peak_allocated<=+1MiB, "
                        "baseline 24.0MiB); sources that grew most: +2.0MiB "),
            "%s", out);
  cr_expect(strstr(out, "train.py:40 remember"), "%s", out);
  cr_expect(strstr(out, "ok   final_allocated: 22.0MiB"), "%s", out);
  snprintf(cmd, sizeof cmd, "check %s/four.msnap --limit 'peak_allocated<=20MiB' --json", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "\"figure\": \"peak_allocated\", \"value\": 27262976, \"bound\": 20971520"),
            "%s", out);
  /* 2: usage errors */
  const char *usage[] = {"--limit 'peak_foo<=1G'", "--limit 'peak_allocated<=1Q'",
                         "--limit 'peak_allocated<=+5%'", "", "--limit 'peak_allocated'"};
  const char *msg[] = {"unknown figure 'peak_foo'", "unexpected 'Q'", "needs --baseline",
                       "no --limit given", "is not FIGURE<=VALUE"};
  for (size_t i = 0; i < sizeof usage / sizeof *usage; i++) {
    snprintf(cmd, sizeof cmd, "check %s/four.msnap %s", dir, usage[i]);
    cr_expect_eq(run_cmd(cmd, out, sizeof out), 2, "%s: %s", usage[i], out);
    cr_expect(strstr(out, msg[i]), "%s: %s", usage[i], out);
  }
  /* 1: a figure the snapshot cannot tell, a file that cannot be read */
  snprintf(cmd, sizeof cmd, "check %s/four.msnap --limit 'alloc_retries<=0'", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "alloc_retries is not known"), "%s", out);
  snprintf(cmd, sizeof cmd, "check %s/four.msnap --limit 'alloc_retries<=0' --replay", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  snprintf(cmd, sizeof cmd, "check %s/missing.msnap --limit 'ooms<=0'", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  /* compare: the report, and a device one side lacks */
  snprintf(cmd, sizeof cmd, "compare %s/two.pickle %s/four.msnap --at end", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "  allocated                   20.0MiB      22.0MiB      +2.0MiB\n"), "%s", out);
  cr_expect(strstr(out, "leak suspects: 1 (over 4 steps: allocations made in each step and still "
                        "alive at AFTER's end)"), "%s", out);
  cr_expect(strstr(out, "  1.0MiB per step (1 block) in steps 1..4 (4 steps, 4.0MiB alive)"), "%s", out);
  snprintf(cmd, sizeof cmd, "compare %s/two.pickle %s/four.msnap --device 2", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "BEFORE has no device 2"), "%s", out);
  snprintf(cmd, sizeof cmd, "compare %s/two.pickle %s/four.msnap --json", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "{\"command\": \"compare\", \"view\": \"report\", \"before\": {"), "%s", out);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  ms_snapshot_free(two);
  ms_snapshot_free(four);
  th_rmdir(dir);
  free(dir);
}

static void save(const ms_snapshot_t *s, const char *dir, const char *name) {
  ms_snapshot_free(reload(s, dir, name, false));
}

Test(gate, hostile_sides_on_the_command_line) {
  char *dir = th_tmpdir();
  ms_snapshot_t *run = build_run(2, 0), *bare = build_no_trace(), *dev1 = build_run_on(1, 2, 0);
  save(run, dir, "run.msnap");
  save(bare, dir, "bare.msnap");
  save(dev1, dir, "dev1.msnap");
  char cmd[2048], out[16384];
  /* one side without a trace: compared at its end state, said so; no moment of it exists */
  snprintf(cmd, sizeof cmd, "compare %s/bare.msnap %s/run.msnap", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "bare.msnap' has no allocation trace on device 0: its peaks are its end "
                        "state's"), "%s", out);
  cr_expect(strstr(out, "bare.msnap, device 0, the end state (no trace)\n"), "%s", out);
  cr_expect(strstr(out, "  peak allocated              18.0MiB      22.0MiB      +4.0MiB\n"), "%s", out);
  snprintf(cmd, sizeof cmd, "compare %s/bare.msnap %s/run.msnap --at peak", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "BEFORE has no allocation trace on device 0: only its end state can be "
                        "compared"), "%s", out);
  /* mismatched devices: each side's own device, with a warning */
  snprintf(cmd, sizeof cmd, "compare %s/run.msnap %s/dev1.msnap", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "warning: comparing device 0 of "), "%s", out);
  cr_expect(strstr(out, "with device 1 of "), "%s", out);
  snprintf(cmd, sizeof cmd, "compare %s/run.msnap %s/dev1.msnap --device 1", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "BEFORE has no device 1 (no trace and no segments on it)"), "%s", out);
  /* check: a figure a snapshot without trace cannot tell */
  snprintf(cmd, sizeof cmd, "check %s/bare.msnap --limit 'peak_allocated<=1G'", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "peak_allocated is not known: device 0 has no allocation trace"), "%s", out);
  snprintf(cmd, sizeof cmd, "check %s/bare.msnap --limit 'final_allocated<=18MiB'", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  snprintf(cmd, sizeof cmd, "check %s/run.msnap --baseline %s/bare.msnap --limit "
           "'peak_allocated<=+5%%'", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "bare.msnap': peak_allocated is not known"), "%s", out);
  snprintf(cmd, sizeof cmd, "check %s/bare.msnap --limit 'final_allocated<=1G' --replay", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "--replay needs one"), "%s", out);
  ms_snapshot_free(run);
  ms_snapshot_free(bare);
  ms_snapshot_free(dev1);
  th_rmdir(dir);
  free(dir);
}

Test(compare, directories_pair_ranks_and_name_the_one_that_stands_out) {
  char *dir = th_tmpdir();
  char a[600], b[600];
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  cr_assert_eq(mkdir(a, 0700), 0);
  cr_assert_eq(mkdir(b, 0700), 0);
  ms_snapshot_t *same = build_run(4, 1 * MIB), *more = build_run(4, 3 * MIB);
  for (int r = 0; r < 4; r++) {
    char name[64];
    snprintf(name, sizeof name, "a/rank%d.msnap", r);
    save(same, dir, name);
    snprintf(name, sizeof name, "b/rank%d.msnap", r);
    save(r == 2 ? more : same, dir, name);
  }
  save(same, dir, "b/rank9.msnap");
  char cmd[2048], out[16384];
  snprintf(cmd, sizeof cmd, "compare %s %s", a, b);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "rank9.msnap' has no file of the same name in the other directory"), "%s", out);
  /* rank 2: 16 + 4 x 3 leaked + 4 + 2 = 34 MiB at its peak, 8 MiB more than the others */
  cr_expect(strstr(out, "rank2.msnap                        26.0MiB       34.0MiB        8.0MiB"),
            "%s", out);
  cr_expect(strstr(out, "train.py:40 remember  <- stands out"), "%s", out);
  cr_expect(!strstr(out, "rank1.msnap                        26.0MiB       26.0MiB          0.0B  "
                         "        0.0B  -  <- stands out"), "%s", out);
  cr_expect(strstr(out, "from them: 1 rank\n"), "%s", out);
  snprintf(cmd, sizeof cmd, "compare %s %s --json", a, b);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "\"change\": 8388608"), "%s", out);
  cr_expect(strstr(out, "\"stands_out\": true"), "%s", out);
  ms_snapshot_free(same);
  ms_snapshot_free(more);
  th_rmdir(dir);
  free(dir);
}

/* dir/bad.pickle: a pickle's protocol header, then bytes no snapshot has. */
static void save_bad_pickle(const char *dir) {
  char path[600];
  snprintf(path, sizeof path, "%s/bad.pickle", dir);
  static const char bad[] = "\x80\x02not a pickle at all";
  cr_assert_eq(th_write_file(path, bad, sizeof bad - 1), 0);
}

/* Runs `cmd --jobs 1`, `cmd --jobs 2` (and cmd alone when with_default): each exits rc and prints
 * expect, and all print the same bytes. out receives the --jobs 2 run's output. */
static void expect_jobs_alike(const char *cmd, bool with_default, int rc, const char *expect,
                              char *out, size_t cap) {
  static const char *const jobs[3] = {" --jobs 2", " --jobs 1", ""};
  char line[2100], *first = malloc(cap);
  cr_assert(first);
  for (int j = 0; j < (with_default ? 3 : 2); j++) {
    char *o = j ? first : out;
    snprintf(line, sizeof line, "%s%s", cmd, jobs[j]);
    cr_expect_eq(run_cmd(line, o, cap), rc, "%s: %s", line, o);
    cr_expect(strstr(o, expect), "%s: %s", line, o);
    if (j) cr_expect_str_eq(o, out, "%s", line);
  }
  free(first);
}

/* Two files read at once (--jobs 2, each on a thread) or one after the other (--jobs 1) print
 * the same, byte for byte, with the same exit code: reports, the graphs' outputs, warnings, and
 * errors, where BEFORE's error alone is printed when both fail (read in turn, AFTER is not read
 * then). */
Test(compare, two_files_at_once_or_in_turn_print_the_same) {
  char *dir = th_tmpdir();
  ms_snapshot_t *run = build_run(2, 0), *four = build_run(4, 1 * MIB), *bare = build_no_trace(),
                *dev1 = build_run_on(1, 2, 0);
  save(run, dir, "run.msnap");
  ms_snapshot_free(reload(four, dir, "four.pickle", true));
  save(bare, dir, "bare.msnap");
  save(dev1, dir, "dev1.msnap");
  save_bad_pickle(dir);
  static const struct {
    const char *before, *after, *opts, *expect;
    int rc;
  } cases[] = {
      {"run.msnap", "four.pickle", "", "leak suspects", 0},
      {"run.msnap", "four.pickle", "--json", "\"leaks\"", 0},
      {"bare.msnap", "run.msnap", "", "has no allocation trace on device 0", 0},
      {"run.msnap", "dev1.msnap", "", "warning: comparing device 0 of ", 0},
      {"run.msnap", "dev1.msnap", "--device 1", "BEFORE has no device 1", 1},
      {"four.pickle", "bare.msnap", "--at peak", "AFTER has no allocation trace", 1},
      {"bad.pickle", "run.msnap", "", "bad.pickle", 1},
      {"run.msnap", "bad.pickle", "", "bad.pickle", 1},
      {"bad.pickle", "missing.msnap", "", "bad.pickle", 1},
      {"missing.msnap", "bad.pickle", "", "missing.msnap", 1},
      {"run.msnap", "four.pickle", "--segments --json", "\"only_after\"", 0},
      {"run.msnap", "four.pickle", "--stacks --folded --at peak", "train.py", 0},
      {"run.msnap", "bad.pickle", "--stacks --folded", "bad.pickle", 1},
  };
  char cmd[2048], out[65536];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(cmd, sizeof cmd, "compare --no-cache %s/%s %s/%s %s", dir, cases[i].before, dir,
             cases[i].after, cases[i].opts);
    expect_jobs_alike(cmd, true, cases[i].rc, cases[i].expect, out, sizeof out);
    if (strcmp(cases[i].after, "missing.msnap") == 0) /* both fail: only BEFORE's error */
      cr_expect(!strstr(out, "missing.msnap"), "%s", out);
  }
  /* --jobs: a number, and not for one file at two moments */
  snprintf(cmd, sizeof cmd, "compare %s/run.msnap %s/four.pickle --jobs 0", dir, dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "option '--jobs' needs a number from 1 to 1024, not '0'"), "%s", out);
  snprintf(cmd, sizeof cmd, "compare %s/run.msnap --at 3 --at end --jobs 2", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "--jobs applies to two files or directories"), "%s", out);
  ms_snapshot_free(run);
  ms_snapshot_free(four);
  ms_snapshot_free(bare);
  ms_snapshot_free(dev1);
  th_rmdir(dir);
  free(dir);
}

/* check reads SNAP and its baseline at once (--jobs 2) or in turn (--jobs 1) with the same output
 * and exit status: limits that hold and that break (with their sources), --replay, and a failure
 * on either side (SNAP's error alone when both fail). --jobs needs --baseline. */
Test(gate, check_reads_snap_and_baseline_at_once_or_in_turn_the_same) {
  char *dir = th_tmpdir();
  ms_snapshot_t *two = build_run(2, 1 * MIB), *four = build_run(4, 1 * MIB),
                *bare = build_no_trace();
  ms_snapshot_free(reload(two, dir, "two.pickle", true));
  save(four, dir, "four.msnap");
  save(bare, dir, "bare.msnap");
  save_bad_pickle(dir);
  static const struct {
    const char *snap, *base, *limits, *expect;
    int rc;
  } cases[] = {
      {"four.msnap", "two.pickle", "--limit 'peak_allocated<=+10%'", "0 of 1 limit broken", 0},
      {"four.msnap", "two.pickle", "--limit 'peak_allocated<=+1MiB' --json", "\"holds\": false", 1},
      {"four.msnap", "two.pickle", "--limit 'peak_reserved<=-50%' --replay",
       "(replayed from a fresh allocator): 1 of 1 limit broken", 1},
      {"four.msnap", "bare.msnap", "--limit 'peak_allocated<=+5%'", "is not known", 1},
      {"bad.pickle", "two.pickle", "--limit 'ooms<=+0'", "bad.pickle", 1},
      {"four.msnap", "bad.pickle", "--limit 'ooms<=+0'", "bad.pickle", 1},
      {"missing.msnap", "bad.pickle", "--limit 'ooms<=+0'", "missing.msnap", 1},
  };
  char cmd[2048], out[65536];
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    snprintf(cmd, sizeof cmd, "check --no-cache %s/%s --baseline %s/%s %s", dir, cases[i].snap, dir,
             cases[i].base, cases[i].limits);
    expect_jobs_alike(cmd, false, cases[i].rc, cases[i].expect, out, sizeof out);
  }
  cr_expect(!strstr(out, "bad.pickle"), "only SNAP's error: %s", out);
  snprintf(cmd, sizeof cmd, "check %s/four.msnap --limit 'ooms<=0' --jobs 2", dir);
  cr_expect_eq(run_cmd(cmd, out, sizeof out), 2, "%s", out);
  cr_expect(strstr(out, "--jobs applies to --baseline"), "%s", out);
  ms_snapshot_free(two);
  ms_snapshot_free(four);
  ms_snapshot_free(bare);
  th_rmdir(dir);
  free(dir);
}
