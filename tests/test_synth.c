/* SPDX-License-Identifier: MIT
 * Tests of the benchmarks' synthetic snapshot (bench/synth.h, gen_snapshot): its trace is a
 * consistent history that the time index can undo (every free matches a live block, every block
 * lies in a live segment, segments never overlap, segment frees release empty segments), its end
 * state is the snapshot's segments and blocks, stacks have the promised depths, blocks carry the
 * stack of the alloc that made them, and it is deterministic for a seed.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/pickle.h"
#include "synth.h"

typedef struct range_s {
  uint64_t addr, size;
  uint32_t stack;
} range_t;

typedef struct ranges_s {
  range_t *p;
  size_t n, cap;
} ranges_t;

static size_t rfind(const ranges_t *r, uint64_t addr) {
  for (size_t i = 0; i < r->n; i++)
    if (r->p[i].addr == addr) return i;
  return SIZE_MAX;
}

static void radd(ranges_t *r, range_t x) {
  if (r->n == r->cap) {
    r->cap = r->cap ? 2 * r->cap : 256;
    r->p = realloc(r->p, r->cap * sizeof *r->p);
    cr_assert(r->p);
  }
  r->p[r->n++] = x;
}

static void rdel(ranges_t *r, size_t i) {
  r->p[i] = r->p[--r->n];
}

Test(synth, consistent_history_and_end_state) {
  synth_opts_t o = {3, 100000, 4, 0};
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(synth_workload(&o, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(s->ndevices, 1);
  cr_assert_geq(s->ntrace, 100000);
  cr_assert_leq(s->ntrace, 102000);
  ranges_t segs = {0}, live = {0}, pending = {0};
  bool streams[8] = {false};
  int64_t prev_time = 0;
  for (size_t i = 0; i < s->ntrace; i++) {
    const ms_snap_trace_t *e = &s->trace[i];
    cr_assert_gt(e->time_us, prev_time, "entry %zu: times increase", i);
    prev_time = e->time_us;
    uint32_t depth = ms_snap_stack_depth(s, e->stack);
    cr_assert(depth >= 25 && depth <= 53, "entry %zu: %u frames", i, depth);
    if (ms_snap_trace_stream(e) < 8) streams[ms_snap_trace_stream(e)] = true;
    size_t k;
    switch (e->action) {
    case MS_TRACE_SEGMENT_ALLOC:
      for (size_t j = 0; j < segs.n; j++)
        cr_assert(e->addr >= segs.p[j].addr + segs.p[j].size || segs.p[j].addr >= e->addr + e->size,
                  "entry %zu: segments overlap", i);
      radd(&segs, (range_t){e->addr, e->size, e->stack});
      break;
    case MS_TRACE_SEGMENT_FREE:
      k = rfind(&segs, e->addr);
      cr_assert_neq(k, SIZE_MAX, "entry %zu: free of an unknown segment", i);
      cr_assert_eq(segs.p[k].size, e->size);
      for (size_t j = 0; j < live.n; j++)
        cr_assert(live.p[j].addr - e->addr >= e->size, "entry %zu: segment still in use", i);
      rdel(&segs, k);
      break;
    case MS_TRACE_ALLOC: {
      cr_assert_eq(rfind(&live, e->addr), SIZE_MAX, "entry %zu: address already live", i);
      bool inside = false;
      for (size_t j = 0; j < segs.n && !inside; j++)
        inside = e->addr >= segs.p[j].addr && e->addr + e->size <= segs.p[j].addr + segs.p[j].size;
      cr_assert(inside, "entry %zu: allocation outside every segment", i);
      radd(&live, (range_t){e->addr, e->size, e->stack});
      break;
    }
    case MS_TRACE_FREE_REQUESTED:
      k = rfind(&live, e->addr);
      cr_assert_neq(k, SIZE_MAX, "entry %zu: free of an unknown block", i);
      cr_assert_eq(live.p[k].size, e->size, "entry %zu", i);
      radd(&pending, (range_t){e->addr, e->size, 0});
      break;
    case MS_TRACE_FREE_COMPLETED:
      k = rfind(&pending, e->addr);
      cr_assert_neq(k, SIZE_MAX, "entry %zu: completion without a request", i);
      rdel(&pending, k);
      rdel(&live, rfind(&live, e->addr));
      break;
    case MS_TRACE_SNAPSHOT:
      cr_assert_eq(i, s->ntrace - 1, "the snapshot entry comes last");
      break;
    default:
      cr_assert_fail("entry %zu: unexpected action %s", i, ms_trace_action_name(e->action));
    }
  }
  cr_assert(streams[0] && streams[1] && streams[2] && streams[3], "four streams used");
  /* the end state is the snapshot's */
  cr_assert_eq(segs.n, s->nsegments);
  size_t nlive = 0;
  for (size_t g = 0; g < s->nsegments; g++) {
    const ms_snap_segment_t *seg = &s->segments[g];
    size_t k = rfind(&segs, seg->address);
    cr_assert_neq(k, SIZE_MAX, "segment %zu not in the trace", g);
    cr_assert_eq(segs.p[k].size, seg->total_size);
    cr_assert_eq(seg->stack, segs.p[k].stack, "segment %zu: its segment_alloc's stack", g);
    for (uint32_t j = 0; j < seg->nblocks; j++) {
      const ms_snap_block_t *blk = &s->blocks[seg->first_block + j];
      if (blk->state != MS_BLOCK_ACTIVE_ALLOCATED) {
        cr_assert_eq(blk->stack, MS_SNAP_NO_STACK);
        continue;
      }
      nlive++;
      size_t l = rfind(&live, blk->address);
      cr_assert_neq(l, SIZE_MAX, "block at %#lx not live in the trace",
                    (unsigned long)blk->address);
      cr_assert_eq(live.p[l].size, blk->requested_size, "the alloc's size is the requested one");
      cr_assert_eq(blk->stack, live.p[l].stack, "a block carries its alloc's stack");
    }
  }
  cr_assert_eq(nlive, live.n);
  cr_assert_eq(pending.n, 0);
  free(segs.p);
  free(live.p);
  free(pending.p);
  ms_snapshot_free(s);
}

typedef struct buf_s {
  char *p;
  size_t n, cap;
} buf_t;

static int buf_write(void *ctx, const char *b, size_t len) {
  buf_t *k = ctx;
  if (k->n + len > k->cap) {
    k->cap = (k->n + len) * 2;
    k->p = realloc(k->p, k->cap);
    cr_assert(k->p);
  }
  memcpy(k->p + k->n, b, len);
  k->n += len;
  return MS_OK;
}

static buf_t pickled(uint64_t seed) {
  synth_opts_t o = {seed, 20000, 2, 0};
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(synth_workload(&o, &s, &eb), MS_OK, "%s", eb.msg);
  buf_t k = {0};
  ms_sink_t sink = {buf_write, &k};
  cr_assert_eq(ms_pickle_write(s, &sink, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  return k;
}

Test(synth, deterministic_for_a_seed) {
  buf_t a = pickled(5), b = pickled(5), c = pickled(6);
  cr_assert_eq(a.n, b.n);
  cr_assert(memcmp(a.p, b.p, a.n) == 0, "same seed, same bytes");
  cr_assert(a.n != c.n || memcmp(a.p, c.p, a.n) != 0, "another seed, another file");
  /* about SYNTH_BYTES_PER_ENTRY bytes per entry */
  cr_assert(a.n > 20000 * SYNTH_BYTES_PER_ENTRY * 0.9 && a.n < 20000 * SYNTH_BYTES_PER_ENTRY * 1.1,
            "%zu bytes", a.n);
  free(a.p);
  free(b.p);
  free(c.p);
}

/* code_paths: every entry has a stack, and they come from at most 2 x code_paths distinct ones
 * (the history is the workload's as without: stacks are given after it ran). */
Test(synth, code_paths_repeat_stacks) {
  synth_opts_t o = {5, 20000, 2, 50};
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(synth_workload(&o, &s, &eb), MS_OK, "%s", eb.msg);
  uint8_t *seen = calloc(s->nstacks + 1, 1);
  cr_assert_not_null(seen);
  size_t distinct = 0;
  for (size_t i = 0; i < s->ntrace; i++) {
    uint32_t st = s->trace[i].stack;
    cr_assert_neq(st, MS_SNAP_NO_STACK, "entry %zu has no stack", i);
    cr_assert_lt(st, s->nstacks);
    if (!seen[st]) distinct++;
    seen[st] = 1;
  }
  cr_assert_leq(distinct, 100, "%zu distinct stacks from 50 + 50 code paths", distinct);
  cr_assert_gt(distinct, 50, "only %zu distinct stacks", distinct);
  free(seen);
  ms_snapshot_free(s);
}
