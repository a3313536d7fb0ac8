/* SPDX-License-Identifier: MIT
 * Tests for the time index and the viewer's timeline data (memsnap/timeline.h, issue #12):
 * properties on every PyTorch fixture and on traces recorded by memsnap's own allocator under
 * several configurations (the state at the last step is the snapshot's; one entry forwards from
 * step N is step N + 1; a trace recorded from the start begins empty), inconsistent traces give
 * the documented error with the entry number, hostile inputs do not crash, and the viewer's data
 * equals PyTorch's own output (expected/NAME.timeline.0.json.gz) on every fixture. Without an
 * index: every `oom` entry with the reserved bytes at it (all at once as one at a time), and the
 * entries of a time span (by binary search on ordered times, as a pass finds them). The states at
 * many steps in one pass equal those one at a time, and a segment's blocks in chunks behave as
 * one sorted array under random inserts, removals, splits, joins and reloads.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/cache.h"
#include "memsnap/config.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"

static const char *const fixtures[] = {
    "jogregoire_diffusion_tiny", "a0kuma_adamw_small",    "yiyi_flexgen_oom_legacy",
    "yiyi_flexgen_1.3b_legacy_a", "maphsge_select_n_4dev", "cranberrii_ftcourse",
    "wedsonlin_cs336_medium_1024_training",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)

static ms_snapshot_t *load_fixture(const char *name) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), name);
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fclose(f);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s: %s", path, eb.msg);
  return s;
}

/* ---- state comparison ---------------------------------------------------------------------- */

static int state_diff(const ms_tl_state_t *a, const ms_tl_state_t *b, char *why, size_t cap) {
  if (a->nsegments != b->nsegments) {
    snprintf(why, cap, "nsegments %zu != %zu", a->nsegments, b->nsegments);
    return 1;
  }
  for (size_t i = 0; i < a->nsegments; i++) {
    const ms_tl_segment_t *x = &a->segments[i], *y = &b->segments[i];
    if (x->address != y->address || x->size != y->size || x->is_expandable != y->is_expandable ||
        x->stream != y->stream) {
      snprintf(why, cap, "segment %zu: 0x%" PRIx64 "+%" PRIu64 " != 0x%" PRIx64 "+%" PRIu64, i,
               x->address, x->size, y->address, y->size);
      return 1;
    }
  }
  if (a->nblocks != b->nblocks) {
    snprintf(why, cap, "nblocks %zu != %zu", a->nblocks, b->nblocks);
    return 1;
  }
  for (size_t i = 0; i < a->nblocks; i++) {
    const ms_tl_block_t *x = &a->blocks[i], *y = &b->blocks[i];
    if (x->address != y->address || x->size != y->size ||
        x->requested_size != y->requested_size || x->state != y->state ||
        x->alloc_entry != y->alloc_entry || x->flags != y->flags ||
        x->snap_block != y->snap_block || x->stack != y->stack) {
      snprintf(why, cap,
               "block %zu: 0x%" PRIx64 " %" PRIu64 "/%" PRIu64 " st%d e%" PRId64 " f%u != 0x%" PRIx64
               " %" PRIu64 "/%" PRIu64 " st%d e%" PRId64 " f%u",
               i, x->address, x->size, x->requested_size, (int)x->state, x->alloc_entry, x->flags,
               y->address, y->size, y->requested_size, (int)y->state, y->alloc_entry, y->flags);
      return 1;
    }
  }
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    if (a->totals[m] != b->totals[m]) {
      snprintf(why, cap, "%s %" PRIu64 " != %" PRIu64, ms_tl_metric_name((ms_tl_metric)m),
               a->totals[m], b->totals[m]);
      return 1;
    }
  return 0;
}

/* The totals recomputed from a state's blocks and segments. */
static void state_totals(const ms_tl_state_t *s, uint64_t t[MS_TL_METRIC_COUNT]) {
  memset(t, 0, sizeof(uint64_t) * MS_TL_METRIC_COUNT);
  for (size_t i = 0; i < s->nsegments; i++) t[MS_TL_RESERVED] += s->segments[i].size;
  for (size_t i = 0; i < s->nblocks; i++) {
    const ms_tl_block_t *b = &s->blocks[i];
    if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) t[MS_TL_ALLOCATED] += b->size;
    t[MS_TL_ACTIVE] += b->size;
    t[MS_TL_REQUESTED] += b->requested_size;
  }
}

/* The end state must be the snapshot's segments and live blocks of that device. */
static void check_end_is_snapshot(const ms_snapshot_t *s, const ms_timeline_t *tl, size_t dev) {
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  cr_assert_eq(ms_timeline_state_at(tl, dev, ms_timeline_nentries(tl, dev), &st), MS_OK);
  size_t nseg = 0, nlive = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->device != (int64_t)dev) continue;
    nseg++;
    bool found = false;
    for (size_t k = 0; k < st.nsegments && !found; k++)
      found = st.segments[k].address == g->address && st.segments[k].size == g->total_size;
    cr_assert(found, "device %zu: segment 0x%" PRIx64 " missing at the end", dev, g->address);
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const ms_snap_block_t *b = &s->blocks[g->first_block + k];
      if (b->state != MS_BLOCK_ACTIVE_ALLOCATED && b->state != MS_BLOCK_ACTIVE_PENDING_FREE)
        continue;
      nlive++;
      bool bf = false;
      for (size_t j = 0; j < st.nblocks && !bf; j++)
        bf = st.blocks[j].address == b->address && st.blocks[j].size == b->size &&
             st.blocks[j].state == b->state;
      cr_assert(bf, "device %zu: block 0x%" PRIx64 " missing at the end", dev, b->address);
    }
  }
  cr_assert_eq(st.nsegments, nseg);
  cr_assert_eq(st.nblocks, nlive);
  ms_timeline_state_release(&st);
}

/* Walks the whole trace forwards from step 0 with ms_timeline_state_advance and compares with
 * the index at every step (totals) and at sampled steps (the whole state). */
static void check_forward(const ms_timeline_t *tl, size_t dev, size_t sample_every) {
  size_t n = ms_timeline_nentries(tl, dev);
  ms_tl_state_t fwd, at;
  ms_timeline_state_init(&fwd);
  ms_timeline_state_init(&at);
  cr_assert_eq(ms_timeline_state_at(tl, dev, 0, &fwd), MS_OK);
  char why[512];
  for (size_t s = 0; s <= n; s++) {
    uint64_t t[MS_TL_METRIC_COUNT];
    state_totals(&fwd, t);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
      cr_assert_eq(t[m], fwd.totals[m], "dev %zu step %zu: %s recomputed %" PRIu64 " kept %" PRIu64,
                   dev, s, ms_tl_metric_name((ms_tl_metric)m), t[m], fwd.totals[m]);
      cr_assert_eq(ms_timeline_series(tl, dev, (ms_tl_metric)m)[s], t[m],
                   "dev %zu step %zu: series of %s", dev, s, ms_tl_metric_name((ms_tl_metric)m));
    }
    /* blocks lie inside their segments, without overlap */
    size_t k = 0;
    for (size_t i = 0; i < fwd.nsegments; i++) {
      const ms_tl_segment_t *g = &fwd.segments[i];
      if (i) cr_assert(fwd.segments[i - 1].address + fwd.segments[i - 1].size <= g->address);
      uint64_t at_addr = g->address;
      while (k < fwd.nblocks && fwd.blocks[k].address < g->address + g->size) {
        cr_assert(fwd.blocks[k].address >= at_addr, "dev %zu step %zu: blocks overlap", dev, s);
        at_addr = fwd.blocks[k].address + fwd.blocks[k].size;
        cr_assert(at_addr <= g->address + g->size, "dev %zu step %zu: block past segment", dev,
                  s);
        k++;
      }
    }
    cr_assert_eq(k, fwd.nblocks, "dev %zu step %zu: a block outside every segment", dev, s);
    if (s % sample_every == 0 || s == n || s + 1 == n) {
      cr_assert_eq(ms_timeline_state_at(tl, dev, s, &at), MS_OK);
      cr_assert_eq(state_diff(&fwd, &at, why, sizeof why), 0,
                   "dev %zu: step %zu forwards != step %zu of the index: %s", dev, s, s, why);
    }
    if (s < n) cr_assert_eq(ms_timeline_state_advance(tl, &fwd), MS_OK, "advance at %zu", s);
  }
  ms_timeline_state_release(&fwd);
  ms_timeline_state_release(&at);
}

static void check_snapshot(const ms_snapshot_t *s, size_t k) {
  ms_timeline_t *tl = NULL;
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  cfg.checkpoint_every = (uint32_t)k;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, &cfg, &tl, &eb), MS_OK, "%s", eb.msg);
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    check_end_is_snapshot(s, tl, d);
    size_t n = ms_timeline_nentries(tl, d);
    check_forward(tl, d, n > 3000 ? n / 1500 : 1);
    /* the materialised snapshot has the state's totals */
    ms_tl_peak_t p;
    cr_assert_eq(ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p), MS_OK);
    ms_snapshot_t *at = NULL;
    cr_assert_eq(ms_timeline_snapshot_at(tl, d, p.step, NULL, &at), MS_OK);
    uint64_t alloc = 0, reserved = 0;
    for (size_t i = 0; i < at->nsegments; i++) {
      reserved += at->segments[i].total_size;
      alloc += at->segments[i].allocated_size;
      uint64_t sum = 0;
      for (uint32_t b = 0; b < at->segments[i].nblocks; b++)
        sum += at->blocks[at->segments[i].first_block + b].size;
      cr_assert_eq(sum, at->segments[i].total_size, "blocks fill their segment");
    }
    cr_assert_eq(alloc, p.bytes);
    cr_assert_eq(reserved, ms_timeline_series(tl, d, MS_TL_RESERVED)[p.step]);
    ms_snapshot_free(at);
  }
  ms_timeline_destroy(tl);
}

TestSuite(timeline, .timeout = 300);

Test(timeline, fixtures_properties) {
  size_t done = 0;
  for (size_t i = 0; i < NFIX; i++) {
    ms_snapshot_t *s = load_fixture(fixtures[i]);
    if (!s) continue;
    check_snapshot(s, 64);
    ms_snapshot_free(s);
    done++;
  }
  if (!done) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
}

/* The frames of stack sa of a equal those of stack sb of b. */
static bool same_frames(const ms_snapshot_t *a, uint32_t sa, const ms_snapshot_t *b, uint32_t sb) {
  uint32_t n = ms_snap_stack_depth(a, sa);
  if (ms_snap_stack_depth(b, sb) != n || (sa == MS_SNAP_NO_STACK) != (sb == MS_SNAP_NO_STACK))
    return false;
  for (uint32_t k = 0; k < n; k++) {
    const ms_snap_frame_t *x = ms_snap_stack_frame(a, sa, k), *y = ms_snap_stack_frame(b, sb, k);
    if (strcmp(x->name, y->name) || strcmp(x->filename, y->filename) || x->line != y->line)
      return false;
  }
  return true;
}

Test(timeline, index_needs_no_free_requested_stacks) {
  /* MS_LOAD_NO_FREE_STACKS (what `timeline`, `top` and the views at a moment read) leaves out
   * only stacks the index never uses: at every step of every device of every fixture, the same
   * blocks and segments with the same frames as from a full read */
  size_t done = 0;
  for (size_t i = 0; i < NFIX; i++) {
    ms_snapshot_t *a = load_fixture(fixtures[i]), *b = NULL;
    if (!a) continue;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[i]);
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS, &b, &eb), MS_OK, "%s", eb.msg);
    cr_assert(b->present & MS_SNAP_TRACE_STACKS_SKIPPED);
    size_t dropped = 0;
    for (size_t k = 0; k < b->ntrace; k++)
      if (b->trace[k].stack == MS_SNAP_NO_STACK && a->trace[k].stack != MS_SNAP_NO_STACK) {
        cr_assert(a->trace[k].action == MS_TRACE_FREE_REQUESTED ||
                      a->trace[k].action == MS_TRACE_FREE_COMPLETED,
                  "%s: entry %zu", fixtures[i], k);
        dropped++;
      }
    ms_timeline_t *ta = NULL, *tb = NULL;
    int ra = ms_timeline_create(a, NULL, &ta, &eb), rb = ms_timeline_create(b, NULL, &tb, &eb);
    cr_assert_eq(ra, rb, "%s", fixtures[i]);
    for (size_t d = 0; ra == MS_OK && d < ms_timeline_ndevices(ta); d++) {
      size_t n = ms_timeline_nentries(ta, d);
      cr_assert_eq(ms_timeline_nentries(tb, d), n);
      ms_tl_state_t x, y;
      ms_timeline_state_init(&x);
      ms_timeline_state_init(&y);
      cr_assert_eq(ms_timeline_state_at(ta, d, 0, &x), MS_OK);
      cr_assert_eq(ms_timeline_state_at(tb, d, 0, &y), MS_OK);
      for (size_t st = 0; st <= n; st++) {
        cr_assert_eq(x.nblocks, y.nblocks, "%s dev %zu step %zu", fixtures[i], d, st);
        cr_assert_eq(x.nsegments, y.nsegments, "%s dev %zu step %zu", fixtures[i], d, st);
        for (int m = 0; m < MS_TL_METRIC_COUNT; m++) cr_assert_eq(x.totals[m], y.totals[m]);
        /* the frames of every block and segment: every step of small traces, every 61st of
         * long ones (and the last), so that the suite stays quick under the sanitizers */
        if (n < 5000 || st % 61 == 0 || st == n) {
          for (size_t k = 0; k < x.nblocks; k++)
            cr_assert(x.blocks[k].address == y.blocks[k].address &&
                          x.blocks[k].size == y.blocks[k].size &&
                          x.blocks[k].state == y.blocks[k].state &&
                          same_frames(a, x.blocks[k].stack, b, y.blocks[k].stack),
                      "%s dev %zu step %zu block %zu", fixtures[i], d, st, k);
          for (size_t k = 0; k < x.nsegments; k++)
            cr_assert(x.segments[k].address == y.segments[k].address &&
                          same_frames(a, x.segments[k].stack, b, y.segments[k].stack),
                      "%s dev %zu step %zu segment %zu", fixtures[i], d, st, k);
        }
        if (st < n) {
          cr_assert_eq(ms_timeline_state_advance(ta, &x), MS_OK);
          cr_assert_eq(ms_timeline_state_advance(tb, &y), MS_OK);
        }
      }
      ms_timeline_state_release(&x);
      ms_timeline_state_release(&y);
    }
    printf("%s: %zu free stacks left out\n", fixtures[i], dropped);
    ms_timeline_destroy(ta);
    ms_timeline_destroy(tb);
    ms_snapshot_free(a);
    ms_snapshot_free(b);
    done++;
  }
  if (!done) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
}

/* ---- traces recorded by memsnap's allocator ------------------------------------------------ */

static ms_snapshot_t *record_run(const char *conf, size_t max_entries, uint64_t seed, int nops,
                                 bool start_recording_late) {
  ms_sim_config_t sc = {.ndevices = 1, .capacity = (size_t)8 << 30};
  ms_backend_t *be = NULL;
  cr_assert_eq(ms_backend_sim_create(&sc, &be), MS_OK);
  ms_alloc_config_t ac;
  ms_alloc_config_init(&ac);
  ms_errbuf_t eb = {{0}};
  if (conf) cr_assert_eq(ms_alloc_config_parse(&ac, conf, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_config_t cfg = {.backend = be, .device = 0, .alloc = &ac};
  ms_allocator_t *a = NULL;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.context = MS_CONTEXT_NONE;
  hc.max_entries = max_entries ? max_entries : (size_t)1 << 20;
  ms_devptr_t live[256] = {0};
  uint64_t x = seed;
  for (int op = 0; op < nops; op++) {
    if (op == (start_recording_late ? nops / 3 : 0))
      cr_assert_eq(ms_allocator_record_history(a, &hc, &eb), MS_OK, "%s", eb.msg);
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    unsigned r = (unsigned)(x >> 33);
    int slot = (int)(r % 256);
    if (r % 97 == 0) {
      cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
    } else if (live[slot]) {
      cr_assert_eq(ms_allocator_free(a, live[slot]), MS_OK);
      live[slot] = 0;
    } else {
      size_t size;
      switch (r % 5) {
      case 0: size = 1 + (x >> 40) % 4096; break;
      case 1: size = 1 + (x >> 40) % (1 << 20); break;
      case 2: size = ((size_t)1 << 20) + (x >> 40) % ((size_t)9 << 20); break;
      case 3: size = ((size_t)10 << 20) + (x >> 40) % ((size_t)60 << 20); break;
      default: size = 512 * (1 + (x >> 50) % 8); break;
      }
      ms_stream_t stream = (r / 7) % 3 == 0 ? 5 : 0;
      cr_assert_eq(ms_allocator_malloc(a, size, stream, &live[slot]), MS_OK);
    }
  }
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_allocator_snapshot(&a, 1, &s, &eb), MS_OK, "%s", eb.msg);
  for (int i = 0; i < 256; i++)
    if (live[i]) cr_assert_eq(ms_allocator_free(a, live[i]), MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(be);
  return s;
}

static void check_recorded(const char *conf, size_t max_entries, bool from_start, bool late) {
  for (uint64_t seed = 1; seed <= 3; seed++) {
    ms_snapshot_t *s = record_run(conf, max_entries, seed, 3000, late);
    cr_assert(s->ndevices >= 1 && s->devices[0].ntrace > 100, "a trace was recorded");
    check_snapshot(s, seed == 1 ? 16 : 1024);
    if (from_start) {
      ms_timeline_t *tl = NULL;
      ms_errbuf_t eb = {{0}};
      cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
      ms_tl_state_t st;
      ms_timeline_state_init(&st);
      cr_assert_eq(ms_timeline_state_at(tl, 0, 0, &st), MS_OK);
      cr_assert_eq(st.nsegments, 0, "%s: %zu segments before the first entry", conf, st.nsegments);
      cr_assert_eq(st.nblocks, 0);
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
        cr_assert_eq(ms_timeline_series(tl, 0, (ms_tl_metric)m)[0], 0);
      ms_timeline_state_release(&st);
      ms_timeline_destroy(tl);
    }
    ms_snapshot_free(s);
  }
}

Test(timeline, recorded_default) { check_recorded(NULL, 0, true, false); }
Test(timeline, recorded_expandable) { check_recorded("expandable_segments:True", 0, true, false); }
Test(timeline, recorded_max_split) {
  check_recorded("max_split_size_mb:40,roundup_power2_divisions:4", 0, true, false);
}
Test(timeline, recorded_ring_buffer_wrapped) { check_recorded(NULL, 500, false, false); }
Test(timeline, recorded_expandable_wrapped) {
  check_recorded("expandable_segments:True", 700, false, false);
}
Test(timeline, recorded_late_start) { check_recorded(NULL, 0, false, true); }

/* ms_timeline_states_at: the states of one pass are ms_timeline_state_at's, step by step. */
typedef struct states_check_s {
  const ms_timeline_t *tl;
  size_t dev, calls, stop_at; /* stop_at: the call that fails (SIZE_MAX: none) */
  const size_t *steps;
  size_t last_k;
} states_check_t;

static int states_check_visit(void *arg, size_t k, const ms_tl_state_t *st) {
  states_check_t *c = arg;
  cr_assert(c->calls == 0 ? true : k < c->last_k, "newest first");
  c->last_k = k;
  if (c->calls++ == c->stop_at) return MS_ENOMEM;
  ms_tl_state_t one;
  ms_timeline_state_init(&one);
  cr_assert_eq(ms_timeline_state_at(c->tl, c->dev, c->steps[k], &one), MS_OK);
  char why[256];
  cr_assert_eq(state_diff(st, &one, why, sizeof why), 0, "step %zu: %s", c->steps[k], why);
  cr_assert_eq(st->step, c->steps[k]);
  ms_timeline_state_release(&one);
  return MS_OK;
}

Test(timeline, states_in_one_pass_as_one_at_a_time) {
  static const char *confs[] = {NULL, "expandable_segments:True"};
  for (int ci = 0; ci < 2; ci++) {
    ms_snapshot_t *s = record_run(confs[ci], 0, 7 + (uint64_t)ci, 3000, false);
    ms_timeline_config_t cfg;
    ms_timeline_config_init(&cfg);
    cfg.checkpoint_every = 64;
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_timeline_create(s, &cfg, &tl, &eb), MS_OK, "%s", eb.msg);
    size_t n = ms_timeline_nentries(tl, 0), steps[40];
    uint64_t x = 99;
    for (size_t k = 0; k < 40; k++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      steps[k] = k == 0 ? 0 : k == 39 ? n : (size_t)(x >> 33) % (n + 1);
    }
    steps[20] = steps[21];          /* a step asked twice */
    for (size_t i = 1; i < 40; i++) /* sorted */
      for (size_t j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
        size_t t = steps[j];
        steps[j] = steps[j - 1];
        steps[j - 1] = t;
      }
    states_check_t c = {tl, 0, 0, SIZE_MAX, steps, 0};
    cr_assert_eq(ms_timeline_states_at(tl, 0, steps, 40, states_check_visit, &c), MS_OK);
    cr_expect_eq(c.calls, 40);
    states_check_t stop = {tl, 0, 0, 5, steps, 0}; /* the visitor's code ends the pass */
    cr_expect_eq(ms_timeline_states_at(tl, 0, steps, 40, states_check_visit, &stop), MS_ENOMEM);
    cr_expect_eq(stop.calls, 6);
    states_check_t none = {tl, 0, 0, SIZE_MAX, steps, 0};
    cr_expect_eq(ms_timeline_states_at(tl, 0, steps, 0, states_check_visit, &none), MS_OK);
    cr_expect_eq(none.calls, 0);
    size_t bad[2] = {5, 4}, past[1] = {n + 1};
    cr_expect_eq(ms_timeline_states_at(tl, 0, bad, 2, states_check_visit, &none), MS_EINVAL);
    cr_expect_eq(ms_timeline_states_at(tl, 0, past, 1, states_check_visit, &none), MS_EINVAL);
    cr_expect_eq(ms_timeline_states_at(tl, 1, steps, 1, states_check_visit, &none), MS_EINVAL);
    cr_expect_eq(ms_timeline_states_at(tl, 0, steps, 1, NULL, &none), MS_EINVAL);
    cr_expect_eq(ms_timeline_states_at(tl, 0, NULL, 1, states_check_visit, &none), MS_EINVAL);
    cr_expect_eq(none.calls, 0);
    ms_timeline_destroy(tl);
    ms_snapshot_free(s);
  }
}

/* ---- inconsistent and hostile traces ------------------------------------------------------- */

typedef struct tr_s {
  ms_trace_action a;
  uint64_t addr, size;
} tr_t;

/* A snapshot with one device: segments (address, size), live blocks (address, size), a trace. */
static ms_snapshot_t *build(const uint64_t (*segs)[2], size_t nsegs, const uint64_t (*blks)[2],
                            size_t nblks, const tr_t *tr, size_t ntr) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  for (size_t i = 0; i < nsegs; i++) {
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.address = segs[i][0];
    g.total_size = segs[i][1];
    g.stack = MS_SNAP_NO_STACK;
    g.first_block = (uint32_t)b.blocks.len;
    uint64_t at = g.address, end = g.address + g.total_size;
    for (size_t k = 0; k < nblks; k++) {
      if (blks[k][0] < g.address || blks[k][0] >= end) continue;
      ms_snap_block_t bl;
      memset(&bl, 0, sizeof bl);
      bl.stack = MS_SNAP_NO_STACK;
      bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
      bl.state_name = "inactive";
      if (blks[k][0] > at) {
        bl.address = at;
        bl.size = blks[k][0] - at;
        cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
      }
      bl.address = blks[k][0];
      bl.size = bl.requested_size = blks[k][1];
      bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
      bl.state_name = "active_allocated";
      cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
      at = blks[k][0] + blks[k][1];
    }
    if (at < end) {
      ms_snap_block_t bl;
      memset(&bl, 0, sizeof bl);
      bl.stack = MS_SNAP_NO_STACK;
      bl.address = at;
      bl.size = end - at;
      bl.state_name = "inactive";
      bl.present = MS_BLOCK_HAS_ADDRESS;
      cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
    }
    g.nblocks = (uint32_t)(b.blocks.len - g.first_block);
    cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.first_trace = 0;
  for (size_t i = 0; i < ntr; i++) {
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.action = (uint8_t)tr[i].a;
    t.addr = tr[i].addr;
    t.size = tr[i].size;
    t.stack = MS_SNAP_NO_STACK;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  d.ntrace = (uint32_t)ntr;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static void expect_error(ms_snapshot_t *s, const char *text) {
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_timeline_create(s, NULL, &tl, &eb);
  cr_assert_eq(rc, MS_EFORMAT, "expected an error containing '%s', got %d", text, rc);
  cr_assert(strstr(eb.msg, text), "'%s' does not contain '%s'", eb.msg, text);
  cr_assert_null(tl);
  ms_snapshot_free(s);
}

#define SEG(...) ((const uint64_t[][2]){__VA_ARGS__})
#define TR(...) ((const tr_t[]){__VA_ARGS__})
#define MiB ((uint64_t)1 << 20)

/* A device with an empty trace (the model's trace table is then NULL): indexed, drawn and
 * replayed without pointer arithmetic on NULL, and the viewer's data, whose summarized band then
 * has no point, without memcpy from NULL: both undefined behaviour that UBSan reported
 * (tests/fuzz/fuzz_consumers.c, issue #16 item 25; `make test SANITIZE=1` checks them here). */
Test(timeline, device_with_an_empty_trace) {
  ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 1024}), 1, NULL, 0);
  cr_assert_null(s->trace);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(ms_timeline_ndevices(tl), 1);
  cr_expect_eq(ms_timeline_nentries(tl, 0), 0);
  ms_snapshot_t *at = NULL;
  cr_assert_eq(ms_timeline_snapshot_at(tl, 0, 0, NULL, &at), MS_OK);
  cr_expect_eq(at->nsegments, 1);
  ms_snapshot_free(at);
  ms_timeline_destroy(tl);
  ms_tlv_t v;
  cr_assert_eq(ms_tlv_compute(s, 0, false, 8, 0, SIZE_MAX, NULL, &v), MS_OK);
  /* the snapshot's live block (a ghost: no alloc in the trace), then the summarized band */
  cr_assert_eq(v.nseries, 2, "%zu series", v.nseries);
  cr_expect(v.series[0].ghost && v.series[0].size == 1024);
  cr_expect_eq(v.series[1].elem, -1);
  ms_tlv_release(&v);
  ms_snapshot_free(s);
}

/* The viewer's data is exact int64_t: a size, or memory alive at once, of 2^62 bytes or more is
 * MS_ELIMIT, never a sum past int64_t. The fuzzer's input (issue #16 item 25) allocated
 * 9151314448198139911 bytes with 612208075472731497 alive: signed overflow in the running total,
 * which UBSan reported (`make test SANITIZE=1` checks it here). Totals beyond 2^53, which the
 * page cannot sum in doubles, stay allowed (view::max_at_time_too_large_to_compute). */
Test(timeline, viewer_refuses_sizes_past_int64) {
  const uint64_t L = ((uint64_t)1 << 62) - 1, H = (uint64_t)1 << 61;
  struct {
    const char *what;
    bool segments;
    size_t max_entries;
    tr_t tr[3];
    size_t ntr;
    uint64_t seg_size; /* the snapshot's one segment (its blocks free) */
    int rc;
    int64_t max_size; /* when MS_OK */
  } cases[] = {
      {"one alloc of 2^62 - 1", false, SIZE_MAX, {{MS_TRACE_ALLOC, 0x1000, L}}, 1, 2 * MiB, MS_OK,
       (int64_t)L},
      {"one alloc of 2^62", false, SIZE_MAX, {{MS_TRACE_ALLOC, 0x1000, L + 1}}, 1, 2 * MiB,
       MS_ELIMIT, 0},
      {"the fuzzer's: 2^63 and more alive", false, SIZE_MAX,
       {{MS_TRACE_ALLOC, 0x1000, 612208075472731497u},
        {MS_TRACE_ALLOC, 0x2000, 9151314448198139911u}},
       2, 2 * MiB, MS_ELIMIT, 0},
      {"two of 2^61 + 1 alive at once, drawn", false, SIZE_MAX,
       {{MS_TRACE_ALLOC, 0x1000, H + 1}, {MS_TRACE_ALLOC, 0x2000, H + 1}}, 2, 2 * MiB, MS_ELIMIT,
       0},
      {"two of 2^62 - 1 one after the other", false, SIZE_MAX,
       {{MS_TRACE_ALLOC, 0x1000, L}, {MS_TRACE_FREE_COMPLETED, 0x1000, L},
        {MS_TRACE_ALLOC, 0x2000, L}},
       3, 2 * MiB, MS_OK, (int64_t)L},
      {"three of 2^61 + 1, two in the summarized band", false, 1,
       {{MS_TRACE_ALLOC, 0x1000, H + 1}, {MS_TRACE_ALLOC, 0x2000, H + 1},
        {MS_TRACE_ALLOC, 0x3000, H + 1}},
       3, 2 * MiB, MS_ELIMIT, 0},
      {"a free of a block allocated before the trace, of 2^62", false, SIZE_MAX,
       {{MS_TRACE_FREE_COMPLETED, 0x1000, L + 1}}, 1, 2 * MiB, MS_ELIMIT, 0},
      {"a segment of 2^62 + 2 MiB, segment timeline", true, SIZE_MAX, {{MS_TRACE_ALLOC, 0, 512}},
       1, L + 1 + 2 * MiB, MS_ELIMIT, 0},
      {"the same segment, memory timeline (its blocks are free)", false, SIZE_MAX,
       {{MS_TRACE_ALLOC, 0x1000, 512}}, 1, L + 1 + 2 * MiB, MS_OK, 512},
  };
  for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
    const uint64_t seg[1][2] = {{(uint64_t)1 << 40, cases[k].seg_size}};
    ms_snapshot_t *s = build(seg, 1, NULL, 0, cases[k].tr, cases[k].ntr);
    ms_tlv_t v;
    int rc = ms_tlv_compute(s, 0, cases[k].segments, cases[k].max_entries, 0, SIZE_MAX, NULL, &v);
    cr_expect_eq(rc, cases[k].rc, "%s: %d", cases[k].what, rc);
    if (rc == MS_OK) {
      cr_expect_eq(v.max_size, cases[k].max_size, "%s: %" PRId64, cases[k].what, v.max_size);
      ms_tlv_release(&v);
    }
    ms_snapshot_free(s);
  }
}

Test(timeline, consistent_small_trace) {
  /* segment 2 MiB at 0x100000: alloc a (kept), alloc b, free b */
  ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 1024}), 1,
                           TR({MS_TRACE_SEGMENT_ALLOC, 0x100000, 2 * MiB},
                              {MS_TRACE_ALLOC, 0x100000, 1000},
                              {MS_TRACE_ALLOC, 0x100400, 700},
                              {MS_TRACE_FREE_REQUESTED, 0x100400, 700},
                              {MS_TRACE_FREE_COMPLETED, 0x100400, 700}),
                           5);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  const uint64_t *al = ms_timeline_series(tl, 0, MS_TL_ALLOCATED);
  const uint64_t *rq = ms_timeline_series(tl, 0, MS_TL_REQUESTED);
  const uint64_t *ac = ms_timeline_series(tl, 0, MS_TL_ACTIVE);
  const uint64_t *rs = ms_timeline_series(tl, 0, MS_TL_RESERVED);
  /* steps 0..5 */
  uint64_t ea[] = {0, 0, 1024, 1024 + 1024, 1024, 1024};
  uint64_t eac[] = {0, 0, 1024, 2048, 2048, 1024};
  uint64_t er[] = {0, 0, 1024, 1024 + 700, 1024 + 700, 1024};
  for (int i = 0; i < 6; i++) {
    cr_assert_eq(al[i], ea[i], "allocated at step %d: %" PRIu64, i, al[i]);
    cr_assert_eq(ac[i], eac[i], "active at step %d: %" PRIu64, i, ac[i]);
    cr_assert_eq(rq[i], er[i], "requested at step %d: %" PRIu64, i, rq[i]);
    cr_assert_eq(rs[i], i == 0 ? 0 : 2 * MiB);
  }
  ms_tl_peak_t p;
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 0, SIZE_MAX, &p), MS_OK);
  cr_assert_eq(p.step, 3);
  cr_assert_eq(p.entry, 2);
  cr_assert_eq(p.bytes, 2048);
  /* the block of b was inferred: 700 rounded to 512 B */
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  cr_assert_eq(ms_timeline_state_at(tl, 0, 4, &st), MS_OK);
  cr_assert_eq(st.nblocks, 2);
  cr_assert_eq(st.blocks[1].size, 1024);
  cr_assert_eq(st.blocks[1].state, MS_BLOCK_ACTIVE_PENDING_FREE);
  cr_assert(st.blocks[1].flags & MS_TL_BLOCK_SIZE_INFERRED);
  cr_assert_eq(st.blocks[1].alloc_entry, 2);
  cr_assert(st.blocks[0].flags & MS_TL_BLOCK_FROM_SNAPSHOT);
  cr_assert_eq(st.blocks[0].alloc_entry, 1);
  ms_timeline_state_release(&st);
  /* moments */
  ms_tl_moment_t m;
  size_t step;
  cr_assert_eq(ms_tl_moment_parse("peak", &m, &eb), MS_OK);
  cr_assert_eq(ms_timeline_moment_step(tl, 0, &m, 0, SIZE_MAX, &step, &eb), MS_OK);
  cr_assert_eq(step, 3);
  cr_assert_eq(ms_tl_moment_parse("2", &m, &eb), MS_OK);
  cr_assert_eq(ms_timeline_moment_step(tl, 0, &m, 0, SIZE_MAX, &step, &eb), MS_OK);
  cr_assert_eq(step, 3);
  cr_assert_eq(ms_tl_moment_parse("-1", &m, &eb), MS_OK);
  cr_assert_eq(ms_timeline_moment_step(tl, 0, &m, 0, SIZE_MAX, &step, &eb), MS_OK);
  cr_assert_eq(step, 0);
  cr_assert_eq(ms_tl_moment_parse("5", &m, &eb), MS_OK);
  cr_assert_eq(ms_timeline_moment_step(tl, 0, &m, 0, SIZE_MAX, &step, &eb), MS_EINVAL);
  cr_assert(strstr(eb.msg, "entry 5 is past the trace of device 0 (5 entries)"), "%s", eb.msg);
  cr_assert_eq(ms_timeline_moment_step(tl, 0, &(ms_tl_moment_t){MS_TL_MOMENT_TIME, 5}, 0,
                                       SIZE_MAX, &step, &eb),
               MS_EINVAL);
  cr_assert(strstr(eb.msg, "has no times"), "%s", eb.msg);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

Test(timeline, moment_syntax) {
  ms_tl_moment_t m;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_tl_moment_parse("peak-reserved", &m, &eb), MS_OK);
  cr_assert_eq(m.kind, MS_TL_MOMENT_PEAK_RESERVED);
  cr_assert_eq(ms_tl_moment_parse("end", &m, &eb), MS_OK);
  cr_assert_eq(m.kind, MS_TL_MOMENT_END);
  cr_assert_eq(ms_tl_moment_parse("t=1700000000123456", &m, &eb), MS_OK);
  cr_assert_eq(m.kind, MS_TL_MOMENT_TIME);
  cr_assert_eq(m.value, 1700000000123456);
  cr_assert_eq(ms_tl_moment_parse("1700000000123456us", &m, &eb), MS_OK);
  cr_assert_eq(m.kind, MS_TL_MOMENT_TIME);
  cr_assert_eq(m.value, 1700000000123456);
  cr_assert_eq(ms_tl_moment_parse("123", &m, &eb), MS_OK);
  cr_assert_eq(m.kind, MS_TL_MOMENT_ENTRY);
  cr_assert_eq(m.value, 123);
  const char *bad[] = {"", "pea", "-2", "12x", "us", "t=", "t=abc", "99999999999999999999999", "1.5"};
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    cr_assert_eq(ms_tl_moment_parse(bad[i], &m, &eb), MS_EINVAL, "'%s'", bad[i]);
    cr_assert(strstr(eb.msg, "invalid moment"), "%s", eb.msg);
  }
}

Test(timeline, error_alloc_not_live_later) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, NULL, 0,
                     TR({MS_TRACE_ALLOC, 0x100000, 1000}), 1),
               "inconsistent trace: device 0, trace entry 0 (alloc 0x100000, 1000 bytes): its "
               "block is not live later");
}

Test(timeline, error_free_outside_segments) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, NULL, 0,
                     TR({MS_TRACE_ALLOC, 0x100000, 512}, {MS_TRACE_FREE_COMPLETED, 0x100000, 512},
                        {MS_TRACE_FREE_COMPLETED, 0x900000, 512}),
                     3),
               "trace entry 2 (free_completed 0x900000, 512 bytes): no segment holds it");
}

Test(timeline, error_free_inside_live_block) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 4096}), 1,
                     TR({MS_TRACE_FREE_COMPLETED, 0x100200, 512}), 1),
               "trace entry 0 (free_completed 0x100200, 512 bytes): the address lies inside a "
               "live block");
}

Test(timeline, error_double_free) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 4096}), 1,
                     TR({MS_TRACE_FREE_COMPLETED, 0x100000, 512}), 1),
               "trace entry 0 (free_completed 0x100000, 512 bytes): a block is live at that "
               "address later");
}

Test(timeline, error_overlapping_segments) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, NULL, 0,
                     TR({MS_TRACE_SEGMENT_FREE, 0x200000, 2 * MiB}), 1),
               "trace entry 0 (segment_free 0x200000, 2097152 bytes): the segment overlaps "
               "another segment");
}

Test(timeline, error_segment_alloc_with_live_blocks) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 512}), 1,
                     TR({MS_TRACE_SEGMENT_ALLOC, 0x100000, 2 * MiB}), 1),
               "trace entry 0 (segment_alloc 0x100000, 2097152 bytes): live blocks precede "
               "their segment");
}

Test(timeline, error_map_outside_segment) {
  expect_error(build(SEG({0x100000, 2 * MiB}), 1, NULL, 0,
                     TR({MS_TRACE_SEGMENT_MAP, 0x400000, 2 * MiB}), 1),
               "trace entry 0 (segment_map 0x400000, 2097152 bytes): no segment holds the range");
}

Test(timeline, expandable_map_unmap_and_state_before) {
  /* an expandable range: map 2 MiB, map 2 more, alloc, free, unmap the upper 2 MiB */
  ms_snapshot_t *s = build(SEG({0x1000000, 2 * MiB}), 1, NULL, 0,
                           TR({MS_TRACE_SEGMENT_MAP, 0x1000000, 2 * MiB},
                              {MS_TRACE_SEGMENT_MAP, 0x1200000, 2 * MiB},
                              {MS_TRACE_ALLOC, 0x1000000, 3 * MiB},
                              {MS_TRACE_FREE_REQUESTED, 0x1000000, 3 * MiB},
                              {MS_TRACE_FREE_COMPLETED, 0x1000000, 3 * MiB},
                              {MS_TRACE_SEGMENT_UNMAP, 0x1200000, 2 * MiB}),
                           6);
  s->segments[0].is_expandable = true;
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  const uint64_t *rs = ms_timeline_series(tl, 0, MS_TL_RESERVED);
  uint64_t er[] = {0, 2 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 4 * MiB, 2 * MiB};
  for (int i = 0; i < 7; i++) cr_assert_eq(rs[i], er[i], "reserved at step %d", i);
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  cr_assert_eq(ms_timeline_state_at(tl, 0, 3, &st), MS_OK);
  cr_assert_eq(st.nsegments, 1, "adjacent mapped ranges form one segment");
  cr_assert_eq(st.segments[0].size, 4 * MiB);
  cr_assert_eq(st.nblocks, 1);
  cr_assert_eq(st.blocks[0].size, 4 * MiB, "a large block takes a remainder of <= 1 MiB");
  ms_timeline_state_release(&st);
  ms_timeline_destroy(tl);
  check_snapshot(s, 1);
  ms_snapshot_free(s);
}

/* ---- oom entries without an index ------------------------------------------------------------ */

/* ms_snapshot_ooms' entries equal ms_snapshot_oom_at's, k by k, field by field. */
static void expect_ooms_as_one_at_a_time(const ms_snapshot_t *s, size_t dev,
                                         const ms_tl_ooms_t *all) {
  cr_assert_eq(all->n, ms_snapshot_oom_count(s, dev));
  for (size_t k = 0; k < all->n; k++) {
    ms_tl_oom_t o;
    memset(&o, 0xa5, sizeof o);
    cr_assert_eq(ms_snapshot_oom_at(s, dev, k, &o), MS_OK);
    const ms_tl_oom_t *a = &all->ooms[k];
    cr_assert(a->entry == o.entry && a->request == o.request && a->stream == o.stream &&
                  a->pool_id[0] == o.pool_id[0] && a->pool_id[1] == o.pool_id[1] &&
                  a->has_device_free == o.has_device_free && a->device_free == o.device_free &&
                  a->has_reserved == o.has_reserved && a->reserved == o.reserved,
              "oom %zu", k);
  }
  ms_tl_oom_t o;
  cr_assert_eq(ms_snapshot_oom_at(s, dev, all->n, &o), MS_EINVAL, "no oom %zu", all->n);
}

/* The reserved bytes at each oom entry: the end state's segments (22 MiB here) with the segment
 * entries after the entry undone; unknown before a point where the trace frees more than it
 * holds. The capacity comes from the first entry whose device_free and reserved add up to more
 * than 0. */
Test(timeline, ooms_with_the_reserved_bytes_at_each) {
  static const struct {
    const char *name;
    tr_t tr[10];
    size_t ntr;
    size_t n;
    size_t entry[4];
    int64_t reserved_mib[4]; /* -1: unknown */
    uint64_t capacity_mib;   /* 0: unknown */
  } cases[] = {
      {"segments allocated and freed between them",
       {{MS_TRACE_OOM, 0, 100},
        {MS_TRACE_SEGMENT_ALLOC, 0x100000, 2 * MiB},
        {MS_TRACE_OOM, 1 * MiB, 200},
        {MS_TRACE_SEGMENT_ALLOC, 0x2000000, 4 * MiB},
        {MS_TRACE_OOM, 3 * MiB, 300},
        {MS_TRACE_SEGMENT_FREE, 0x2000000, 4 * MiB},
        {MS_TRACE_SEGMENT_ALLOC, 0x800000, 20 * MiB},
        {MS_TRACE_OOM, 5 * MiB, 400}},
       8,
       4,
       {0, 2, 4, 7},
       {0, 2, 6, 22},
       3},
      {"mapped and unmapped ranges count as segments",
       {{MS_TRACE_SEGMENT_MAP, 0x100000, 2 * MiB},
        {MS_TRACE_OOM, 8 * MiB, 100},
        {MS_TRACE_SEGMENT_UNMAP, 0x4000000, 6 * MiB},
        {MS_TRACE_OOM, 2 * MiB, 100}},
       4,
       2,
       {1, 3},
       {28, 22},
       36},
      {"a trace that frees more than it held: unknown before that point",
       {{MS_TRACE_OOM, 1 * MiB, 100},
        {MS_TRACE_SEGMENT_ALLOC, 0x4000000, 64 * MiB},
        {MS_TRACE_OOM, 1 * MiB, 100},
        {MS_TRACE_SEGMENT_ALLOC, 0x100000, 2 * MiB},
        {MS_TRACE_OOM, 1 * MiB, 100}},
       5,
       3,
       {0, 2, 4},
       {-1, 20, 22},
       21},
      {"no oom entry", {{MS_TRACE_SEGMENT_ALLOC, 0x100000, 2 * MiB}}, 1, 0, {0}, {0}, 0},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}, {0x800000, 20 * MiB}), 2, NULL, 0,
                             cases[c].tr, cases[c].ntr);
    ms_tl_ooms_t all;
    cr_assert_eq(ms_snapshot_ooms(s, 0, &all), MS_OK, "%s", cases[c].name);
    cr_assert_eq(all.n, cases[c].n, "%s", cases[c].name);
    for (size_t k = 0; k < all.n; k++) {
      const ms_tl_oom_t *o = &all.ooms[k];
      cr_assert_eq(o->entry, cases[c].entry[k], "%s: oom %zu", cases[c].name, k);
      cr_assert_eq(o->request, cases[c].tr[o->entry].size, "%s: oom %zu", cases[c].name, k);
      cr_assert(o->has_device_free, "%s: oom %zu", cases[c].name, k);
      cr_assert_eq(o->device_free, cases[c].tr[o->entry].addr, "%s: oom %zu", cases[c].name, k);
      cr_assert_eq(o->has_reserved, cases[c].reserved_mib[k] >= 0, "%s: oom %zu", cases[c].name, k);
      if (o->has_reserved)
        cr_assert_eq(o->reserved, (uint64_t)cases[c].reserved_mib[k] * MiB, "%s: oom %zu",
                     cases[c].name, k);
    }
    expect_ooms_as_one_at_a_time(s, 0, &all);
    uint64_t cap = 1;
    ms_tl_oom_t first;
    ms_capacity_source src = ms_snapshot_capacity(s, 0, &cap, &first);
    cr_assert_eq(src, cases[c].capacity_mib ? MS_CAPACITY_INFERRED : MS_CAPACITY_UNKNOWN, "%s",
                 cases[c].name);
    cr_assert_eq(cap, cases[c].capacity_mib * MiB, "%s", cases[c].name);
    ms_tl_ooms_release(&all);
    cr_assert_null(all.ooms);
    cr_assert_eq(all.n, 0);
    ms_snapshot_free(s);
  }
}

/* Many oom entries among many segment entries: all of them, as one at a time gives them; a device
 * the snapshot does not list has none; no snapshot is an error. */
Test(timeline, many_ooms_as_one_at_a_time) {
  enum { N = 3000 };
  tr_t *tr = calloc(N, sizeof *tr);
  cr_assert(tr);
  uint64_t seed = 42;
  for (size_t i = 0; i < N; i++) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    unsigned r = (unsigned)(seed >> 33) % 8;
    uint64_t addr = 0x10000000 + (uint64_t)(i % 64) * 0x1000000;
    if (r < 3)
      tr[i] = (tr_t){MS_TRACE_OOM, (seed >> 20) % (64 * MiB), 1 + (seed >> 40) % MiB};
    else if (r < 5)
      tr[i] = (tr_t){MS_TRACE_SEGMENT_ALLOC, addr, 2 * MiB};
    else if (r < 7)
      tr[i] = (tr_t){MS_TRACE_SEGMENT_FREE, addr, 2 * MiB};
    else
      tr[i] = (tr_t){MS_TRACE_ALLOC, addr, 512};
  }
  ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}, {0x800000, 20 * MiB}), 2, NULL, 0, tr, N);
  ms_tl_ooms_t all;
  cr_assert_eq(ms_snapshot_ooms(s, 0, &all), MS_OK);
  cr_assert_gt(all.n, N / 4);
  expect_ooms_as_one_at_a_time(s, 0, &all);
  ms_tl_ooms_release(&all);
  cr_assert_eq(ms_snapshot_ooms(s, 7, &all), MS_OK, "a device not listed");
  cr_assert_eq(all.n, 0);
  cr_assert_null(all.ooms);
  cr_assert_eq(ms_snapshot_ooms(NULL, 0, &all), MS_EINVAL);
  cr_assert_eq(ms_snapshot_ooms(s, 0, NULL), MS_EINVAL);
  ms_snapshot_free(s);
  free(tr);
}

/* ---- entries by time ------------------------------------------------------------------------ */

/* The entries with t0 <= time <= t1 as a pass over the trace finds them (the first and one past
 * the last; none inside: where they would be, after the last entry before t0). */
static bool time_range_by_scan(const int64_t *t, size_t n, int64_t t0, int64_t t1, size_t *from,
                               size_t *to) {
  size_t first = SIZE_MAX, last = 0, at = 0;
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    if (t[i] < 0) continue;
    any = true;
    if (t[i] < t0) at = i + 1;
    if (t[i] < t0 || t[i] > t1) continue;
    if (first == SIZE_MAX) first = i;
    last = i;
  }
  *from = first == SIZE_MAX ? at : first;
  *to = first == SIZE_MAX ? at : last + 1;
  return any;
}

/* ms_timeline_time_range gives what a pass over the trace gives, for traces whose times never
 * decrease (found by binary search), with repeated times, with an entry without a time (-1), out
 * of order, and for windows before, after, between and across entries, empty and reversed. */
Test(timeline, entries_by_time_as_a_pass_finds_them) {
  static const struct {
    const char *name;
    int64_t t[8];
    size_t n;
  } traces[] = {
      {"increasing", {10, 20, 30, 40, 50}, 5},
      {"repeated times", {10, 20, 20, 20, 30, 30, 40}, 7},
      {"one entry", {25}, 1},
      {"an entry without a time", {10, 20, -1, 30, 40}, 5},
      {"out of order", {10, 30, 20, 40, 35, 50}, 6},
      {"no times", {-1, -1}, 2},
  };
  static const int64_t wins[][2] = {{0, 5},   {0, 10},  {10, 10}, {15, 25}, {20, 20},
                                    {20, 30}, {21, 29}, {35, 35}, {40, 60}, {51, 90},
                                    {30, 20}, {0, 100}, {25, 25}, {-5, 0}};
  for (size_t k = 0; k < sizeof traces / sizeof traces[0]; k++) {
    tr_t tr[8]; /* `oom` entries: events, no segment needed */
    for (size_t i = 0; i < traces[k].n; i++) tr[i] = (tr_t){MS_TRACE_OOM, 0, 512};
    ms_snapshot_t *s = build(NULL, 0, NULL, 0, tr, traces[k].n);
    for (size_t i = 0; i < traces[k].n; i++) { /* their times (-1: none) */
      ms_snap_trace_t *e = (ms_snap_trace_t *)&s->trace[i];
      if (traces[k].t[i] >= 0) e->present |= MS_TRACE_HAS_TIME;
      e->time_us = traces[k].t[i] >= 0 ? traces[k].t[i] : 0;
    }
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s: %s", traces[k].name, eb.msg);
    for (int rep = 0; rep < 2; rep++) /* the first call learns the order, the second uses it */
      for (size_t w = 0; w < sizeof wins / sizeof wins[0]; w++) {
        size_t ef = 0, et = 0, f = 99, t = 99;
        bool any = time_range_by_scan(traces[k].t, traces[k].n, wins[w][0], wins[w][1], &ef, &et);
        int rc = ms_timeline_time_range(tl, 0, wins[w][0], wins[w][1], &f, &t, &eb);
        if (!any) {
          cr_assert_eq(rc, MS_EINVAL, "%s", traces[k].name);
          cr_assert_str_eq(eb.msg, "the trace of device 0 has no times");
          continue;
        }
        cr_assert_eq(rc, MS_OK, "%s [%" PRId64 ", %" PRId64 "]", traces[k].name, wins[w][0],
                     wins[w][1]);
        cr_assert(f == ef && t == et,
                  "%s [%" PRId64 ", %" PRId64 "]: entries %zu to %zu, a pass finds %zu to %zu",
                  traces[k].name, wins[w][0], wins[w][1], f, t, ef, et);
      }
    ms_timeline_destroy(tl);
    ms_snapshot_free(s);
  }
}

Test(timeline, hostile_random_traces) {
  /* random traces over a few segments: the index either accepts them (and then every property
   * holds) or reports an inconsistency with its entry number; it never crashes */
  static const ms_trace_action acts[] = {
      MS_TRACE_ALLOC,         MS_TRACE_FREE_REQUESTED, MS_TRACE_FREE_COMPLETED,
      MS_TRACE_SEGMENT_ALLOC, MS_TRACE_SEGMENT_FREE,   MS_TRACE_SEGMENT_MAP,
      MS_TRACE_SEGMENT_UNMAP, MS_TRACE_OOM,            MS_TRACE_SNAPSHOT};
  uint64_t x = 42;
  int accepted = 0, refused = 0;
  for (int round = 0; round < 400; round++) {
    tr_t tr[12];
    size_t n = 1 + round % 12;
    for (size_t i = 0; i < n; i++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      tr[i].a = acts[(x >> 33) % (sizeof acts / sizeof *acts)];
      uint64_t slots[] = {0x100000, 0x100200, 0x100400, 0x300000, 0x200000, 0, UINT64_MAX - 100};
      tr[i].addr = slots[(x >> 40) % 7];
      uint64_t sizes[] = {0, 512, 700, 2 * MiB, 4 * MiB, UINT64_MAX};
      tr[i].size = sizes[(x >> 50) % 6];
    }
    ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}, {0x300000, 2 * MiB}), 2,
                             SEG({0x100400, 512}), round % 2, tr, n);
    if (round % 3 == 0) s->segments[1].is_expandable = true;
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    int rc = ms_timeline_create(s, NULL, &tl, &eb);
    if (rc == MS_OK) {
      accepted++;
      ms_timeline_destroy(tl);
      check_snapshot(s, 1);
    } else {
      refused++;
      cr_assert_eq(rc, MS_EFORMAT, "%s", eb.msg);
      cr_assert(strstr(eb.msg, "inconsistent trace: device 0, trace entry ") ||
                    strstr(eb.msg, "device 0: "),
                "%s", eb.msg);
    }
    ms_snapshot_free(s);
  }
  cr_assert(accepted > 10 && refused > 10, "accepted %d refused %d", accepted, refused);
}

Test(timeline, hostile_synthetic_snapshots) {
  for (uint64_t seed = 1; seed <= 20; seed++) {
    th_synth_opts_t o = {.nsegments = 6, .blocks_per_segment = 5, .nframes = 8, .nstacks = 4,
                         .ntrace = 40, .history = (int)(seed % 2), .seed = seed};
    ms_snapshot_t *s = th_synth(&o);
    cr_assert_not_null(s);
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    int rc = ms_timeline_create(s, NULL, &tl, &eb);
    cr_assert(rc == MS_OK || rc == MS_EFORMAT || rc == MS_ELIMIT, "rc %d: %s", rc, eb.msg);
    if (rc == MS_OK) {
      for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
        ms_snapshot_t *at = NULL;
        cr_assert_eq(ms_timeline_snapshot_at(tl, d, 0, NULL, &at), MS_OK);
        ms_snapshot_free(at);
      }
      ms_timeline_destroy(tl);
    }
    ms_snapshot_free(s);
  }
}

/* ---- the viewer's data against PyTorch's ---------------------------------------------------- */

/* The text of a top-level key's value in a JSON object, without whitespace outside strings. */
static char *json_value(const char *doc, const char *key) {
  char pat[128];
  snprintf(pat, sizeof pat, "\"%s\":", key);
  const char *p = doc;
  int depth = 0;
  bool in_str = false;
  for (; *p; p++) {
    if (in_str) {
      if (*p == '\\' && p[1])
        p++;
      else if (*p == '"')
        in_str = false;
      continue;
    }
    if (*p == '{' || *p == '[') depth++;
    if (*p == '}' || *p == ']') depth--;
    if (*p == '"') {
      if (depth == 1 && strncmp(p, pat, strlen(pat)) == 0) break;
      in_str = true;
    }
  }
  if (!*p) return NULL;
  p += strlen(pat);
  size_t cap = strlen(p) + 1, n = 0;
  char *out = malloc(cap);
  int d = 0;
  in_str = false;
  for (; *p; p++) {
    char c = *p;
    if (in_str) {
      out[n++] = c;
      if (c == '\\' && p[1])
        out[n++] = *++p;
      else if (c == '"')
        in_str = false;
      continue;
    }
    if (c == ' ' || c == '\n' || c == '\t' || c == '\r') continue;
    if (d == 0 && (c == ',' || c == '}')) break;
    if (c == '"') in_str = true;
    if (c == '{' || c == '[') d++;
    if (c == '}' || c == ']') d--;
    out[n++] = c;
  }
  out[n] = 0;
  return out;
}

static char *gunzip_file(const char *path) {
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "gzip -dc '%s' 2>/dev/null", path);
  FILE *f = popen(cmd, "r");
  if (!f) return NULL;
  size_t cap = 1 << 20, n = 0;
  char *buf = malloc(cap);
  size_t got;
  while ((got = fread(buf + n, 1, cap - n - 1, f)) > 0) {
    n += got;
    if (cap - n < 2) buf = realloc(buf, cap *= 2);
  }
  buf[n] = 0;
  if (pclose(f) != 0 || n == 0) {
    free(buf);
    return NULL;
  }
  return buf;
}

static void compare_viewer(const char *name, bool segments, size_t max_entries) {
  char path[1200];
  snprintf(path, sizeof path, "%s/expected/%s.%s.0.json.gz", th_fixture_dir(), name,
           segments ? "segment-timeline" : "timeline");
  char *exp = gunzip_file(path);
  cr_assert_not_null(exp, "cannot read %s", path);
  ms_snapshot_t *s = load_fixture(name);
  size_t def = 99;
  cr_assert(ms_tl_viewer_devices(s, NULL, 0, &def) > 0);
  cr_assert_eq(def, 0);
  ms_tlv_t v;
  cr_assert_eq(ms_tlv_compute(s, def, segments, max_entries, 0, SIZE_MAX, NULL, &v), MS_OK);
  ms_sink_t sink;
  th_memsink_t m;
  th_memsink_init(&sink, &m);
  cr_assert_eq(ms_tlv_write_json(&v, &sink), MS_OK);
  cr_assert_eq(sink.write(sink.ctx, "", 1), MS_OK);
  const char *keys[] = {"device", "max_size", "elements_length", "max_at_time",
                        "allocations_over_time"};
  for (size_t k = 0; k < sizeof keys / sizeof *keys; k++) {
    char *a = json_value(exp, keys[k]), *b = json_value(m.data, keys[k]);
    cr_assert(a && b, "%s: key %s", name, keys[k]);
    if (strcmp(a, b) != 0) {
      size_t i = 0;
      while (a[i] && a[i] == b[i]) i++;
      cr_assert_fail("%s %s: %s differs at %zu: expected ...%.80s got ...%.80s", name,
                     segments ? "segments" : "blocks", keys[k], i, a + (i > 40 ? i - 40 : 0),
                     b + (i > 40 ? i - 40 : 0));
    }
    free(a);
    free(b);
  }
  th_memsink_free(&m);
  ms_tlv_release(&v);
  ms_snapshot_free(s);
  free(exp);
}

Test(timeline, viewer_data_matches_pytorch) {
  size_t done = 0;
  for (size_t i = 0; i < NFIX; i++) {
    ms_snapshot_t *s = load_fixture(fixtures[i]);
    if (!s) continue;
    ms_snapshot_free(s);
    /* the expected files were made with MemoryViz's default max_entries (15000); no fixture has
     * more elements, so 15000 and "no limit" give the same data */
    compare_viewer(fixtures[i], false, 15000);
    compare_viewer(fixtures[i], true, 15000);
    compare_viewer(fixtures[i], false, SIZE_MAX);
    compare_viewer(fixtures[i], true, SIZE_MAX);
    done++;
  }
  if (!done) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
}

Test(timeline, viewer_summarized_band) {
  /* with max_entries 2 on a fixture, the largest two are drawn and the band carries the rest:
   * max_at_time is unchanged (the totals do not depend on what is drawn) */
  ms_snapshot_t *s = load_fixture("a0kuma_adamw_small");
  if (!s) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  ms_tlv_t all, few;
  cr_assert_eq(ms_tlv_compute(s, 0, false, SIZE_MAX, 0, SIZE_MAX, NULL, &all), MS_OK);
  cr_assert_eq(ms_tlv_compute(s, 0, false, 2, 0, SIZE_MAX, NULL, &few), MS_OK);
  cr_assert_eq(few.nseries, 3, "two drawn and the band");
  cr_assert_eq(few.series[2].elem, -1);
  cr_assert_eq(few.elements_length, all.elements_length);
  /* fewer slides (3-step animations) happen, so max_at_time may be shorter; its maximum is the
   * same peak */
  int64_t ma = 0, mb = 0;
  for (size_t i = 0; i < all.ntimesteps; i++) ma = all.max_at_time[i] > ma ? all.max_at_time[i] : ma;
  for (size_t i = 0; i < few.ntimesteps; i++) mb = few.max_at_time[i] > mb ? few.max_at_time[i] : mb;
  cr_assert_eq(ma, mb);
  ms_tlv_release(&all);
  ms_tlv_release(&few);
  ms_snapshot_free(s);
}

/* ---- the commands (the built binary, through tests/helpers.c's th_run) --------------------- */

#include <unistd.h>

static char fx_path[1024];
static const char *fx(const char *name) {
  snprintf(fx_path, sizeof fx_path, "%s/%s.pickle", th_fixture_dir(), name);
  return fx_path;
}
static bool have_fixtures(void) {
  return access(fx("a0kuma_adamw_small"), R_OK) == 0;
}

/* Writes s (then freed) in the suite's directory as name; returns the path (static storage, one
 * at a time). */
static const char *write_in_dir(ms_snapshot_t *s, const char *name) {
  static char path[400];
  snprintf(path, sizeof path, "%s/%s", th_workdir, name);
  char why[512];
  cr_assert_eq(th_write_snapshot(s, th_workdir, name, why, sizeof why), 0, "%s", why);
  ms_snapshot_free(s);
  return path;
}

TestSuite(timeline_cli, .init = th_workdir_setup, .fini = th_workdir_teardown, .timeout = 300);

Test(timeline_cli, json_equals_pytorch) {
  if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  const char *names[] = {"a0kuma_adamw_small", "maphsge_select_n_4dev"};
  for (size_t i = 0; i < 2; i++) {
    for (int seg = 0; seg < 2; seg++) {
      char epath[1200];
      snprintf(epath, sizeof epath, "%s/expected/%s.%s.0.json.gz", th_fixture_dir(), names[i],
               seg ? "segment-timeline" : "timeline");
      char *exp = gunzip_file(epath);
      cr_assert_not_null(exp);
      th_run_t r = seg ? TH_RUN("timeline", fx(names[i]), "--viewer-data", "--segments", "--max-entries",
                          "15000")
                    : TH_RUN("timeline", fx(names[i]), "--viewer-data");
      cr_assert_eq(r.status, 0, "%s", r.err);
      cr_assert_str_empty(r.err);
      const char *keys[] = {"device", "max_size", "elements_length", "max_at_time",
                            "allocations_over_time"};
      for (size_t k = 0; k < 5; k++) {
        char *a = json_value(exp, keys[k]), *b = json_value(r.out, keys[k]);
        cr_assert(a && b && strcmp(a, b) == 0, "%s %s differs", names[i], keys[k]);
        free(a);
        free(b);
      }
      free(exp);
      th_run_free(&r);
    }
  }
}

Test(timeline_cli, json_range_and_device) {
  if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  th_run_t all = TH_RUN("timeline", fx("a0kuma_adamw_small"), "--viewer-data");
  th_run_t part = TH_RUN("timeline", fx("a0kuma_adamw_small"), "--viewer-data", "--range", "0:9");
  cr_assert_eq(all.status, 0);
  cr_assert_eq(part.status, 0, "%s", part.err);
  char *a = json_value(all.out, "max_at_time"), *b = json_value(part.out, "max_at_time");
  cr_assert(strlen(b) < strlen(a), "the range draws fewer timesteps");
  free(a);
  free(b);
  /* a device the viewer does not list */
  th_run_t r = TH_RUN("timeline", fx("maphsge_select_n_4dev"), "--viewer-data", "--device", "3");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "device 3 has no trace and no segments"), "%s", r.err);
  cr_assert_str_empty(r.out);
  th_run_free(&r);
  th_run_free(&all);
  th_run_free(&part);
}

Test(timeline_cli, nothing_to_show) {
  /* a snapshot with neither a trace nor segments: the viewer cannot show it */
  const char *path = write_in_dir(build(NULL, 0, NULL, 0, NULL, 0), "empty.memsnap");
  const char *forms[][3] = {{"--viewer-data", NULL, NULL}, {"--json", NULL, NULL},
                            {NULL, NULL, NULL}};
  for (int i = 0; i < 3; i++) {
    th_run_t r = forms[i][0] ? TH_RUN("timeline", path, forms[i][0]) : TH_RUN("timeline", path);
    cr_assert_eq(r.status, 1);
    cr_assert(strstr(r.err, "memsnap: error: '") &&
                  strstr(r.err, "empty.memsnap': no device has a trace or segments"),
              "%s", r.err);
    cr_assert_str_empty(r.out);
    th_run_free(&r);
  }
}

Test(timeline_cli, usage_errors) {
  const char *p = fx("a0kuma_adamw_small");
  struct {
    const char *args[6];
    const char *msg;
  } cases[] = {
      {{"timeline", NULL}, "missing FILE"},
      {{"timeline", p, "--max-entries", "x", NULL}, "option '--max-entries' needs a number"},
      {{"timeline", p, "--segments", NULL}, "need '--viewer-data'"},
      {{"timeline", p, "--viewer-data", "--json", NULL}, "exclude each other"},
      {{"timeline", p, "--viewer-data", "--steps", NULL}, "does not apply to '--viewer-data'"},
      {{"timeline", p, "--range", "5:2", NULL}, "option '--range' needs A:B"},
      {{"timeline", p, "--device", "-1", NULL}, "option '--device' needs a device number"},
      {{"stats", p, "--at", "bogus", NULL}, "invalid moment 'bogus'"},
      {{"memory", p, "--pool", "3", NULL}, "option '--pool' needs A,B"},
      {{"top", p, "--by", "color", NULL},
       "option '--by' needs source, category, stack, frame, file or size"},
      {{"top", p, "-n", "ten", NULL}, "option '-n' needs a number"},
      {{"compare", p, "--at", "peak", NULL}, "missing AFTER (or two --at moments of one FILE)"},
      {{"compare", p, "--at", "1", "--at", "2"}, NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    if (!cases[i].msg) continue;
    th_run_t r = th_run(th_workdir, NULL, NULL, cases[i].args);
    cr_assert_eq(r.status, 2, "case %zu: status %d: %s", i, r.status, r.err);
    cr_assert(strstr(r.err, cases[i].msg), "case %zu: %s", i, r.err);
    cr_assert(strstr(r.err, "Run 'memsnap "), "case %zu: %s", i, r.err);
    th_run_free(&r);
  }
  th_run_t h = TH_RUN("timeline", "--help");
  cr_assert_eq(h.status, 0);
  cr_assert(strncmp(h.out, "usage: memsnap timeline FILE", 28) == 0);
  th_run_free(&h);
  h = TH_RUN("top", "--help");
  cr_assert_eq(h.status, 0);
  cr_assert(strncmp(h.out, "usage: memsnap top FILE", 23) == 0);
  th_run_free(&h);
}

Test(timeline_cli, text_peaks) {
  if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  th_run_t r = TH_RUN("timeline", fx("a0kuma_adamw_small"));
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "device 0: 35 trace entries\n"), "%s", r.out);
  cr_assert(strstr(r.out, "  peak allocated: 207.7MiB (217764352 bytes)\n"
                          "    after entry 30 (alloc), 2026-04-28 08:43:50.760652 UTC "
                          "(t=1777365830760652)\n"),
            "%s", r.out);
  cr_assert(strstr(r.out, "  peak reserved: 222.0MiB (232783872 bytes)\n"
                          "    after entry 28 (segment_alloc)"),
            "%s", r.out);
  cr_assert(strstr(r.out, "    allocated  169.5MiB (177760256 bytes)\n"), "%s", r.out);
  cr_assert(strstr(r.out, "    reserved   222.0MiB (232783872 bytes)\n"), "%s", r.out);
  th_run_free(&r);
  /* --range: the peak within the first 20 entries */
  r = TH_RUN("timeline", fx("a0kuma_adamw_small"), "--range", "0:19");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "showing entries 0 to 19"), "%s", r.out);
  cr_assert_null(strstr(r.out, "after entry 30"), "%s", r.out);
  th_run_free(&r);
}

Test(timeline_cli, top_at_peak) {
  if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  th_run_t r = TH_RUN("top", fx("a0kuma_adamw_small"), "--json", "-n", "2");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "{\"device\": 0, \"moment\": \"peak\", \"entry\": 30, \"time_us\": "
                          "1777365830760652, \"by\": \"source\", \"total_bytes\": 217764352"),
            "%s", r.out);
  char *g = json_value(r.out, "groups");
  cr_assert_not_null(g);
  size_t n = 0;
  for (char *p = g; (p = strstr(p, "\"bytes\":")); p++) n++;
  cr_assert_eq(n, 2, "-n 2 gives two groups");
  free(g);
  th_run_free(&r);
  /* by size at the end: the sizes of the live blocks */
  r = TH_RUN("top", fx("a0kuma_adamw_small"), "--at", "end", "--by", "size", "-n", "0");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "allocated: 169.5MiB (177760256 bytes) in 13 blocks"), "%s", r.out);
  th_run_free(&r);
  r = TH_RUN("top", fx("a0kuma_adamw_small"), "--at", "-1");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "before entry 0") && strstr(r.out, "(no allocated block at that moment)"),
            "%s", r.out);
  th_run_free(&r);
}

Test(timeline_cli, at_for_views) {
  if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  const char *p = fx("a0kuma_adamw_small");
  th_run_t r = TH_RUN("stats", p, "--at", "-1");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "segments: 0\ntotal_reserved: 0.0B\n"), "the trace starts empty: %s",
            r.out);
  th_run_free(&r);
  r = TH_RUN("stats", p, "--at", "peak");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "segments: 7\ntotal_reserved: 222.0MiB\ntotal_allocated: 207.7MiB\n"),
            "%s", r.out);
  th_run_free(&r);
  r = TH_RUN("stats", p, "--at", "end");
  th_run_t plain = TH_RUN("stats", p);
  cr_assert_str_eq(r.out, plain.out, "the end is the snapshot itself");
  th_run_free(&r);
  th_run_free(&plain);
  r = TH_RUN("memory", p, "--at", "peak", "-o", "peak.svg");
  cr_assert_eq(r.status, 0, "%s", r.err);
  char svg[400];
  snprintf(svg, sizeof svg, "%s/peak.svg", th_workdir);
  cr_assert_eq(access(svg, R_OK), 0);
  th_run_free(&r);
  r = TH_RUN("segments", p, "--at", "999", "-o", "bad.svg");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "--at 999: entry 999 is past the trace of device 0 (35 entries)"), "%s",
            r.err);
  snprintf(svg, sizeof svg, "%s/bad.svg", th_workdir);
  cr_assert_neq(access(svg, F_OK), 0, "no output after a failure");
  th_run_free(&r);
  r = TH_RUN("trace", p, "--at", "2");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "Device 0 ----------------\n3 entries\n"), "%s", r.out);
  th_run_free(&r);
  r = TH_RUN("compare", p, "--at", "-1", "--at", "end", "--segments");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "only_before = []\nonly_after = [1402"), "%s", r.out);
  th_run_free(&r);
}

Test(timeline_cli, filters_matching_nothing) {
  if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  const char *p = fx("a0kuma_adamw_small");
  th_run_t r = TH_RUN("stats", p, "--stream", "7");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "a0kuma_adamw_small.pickle': no segment matches --stream 7"), "%s",
            r.err);
  th_run_free(&r);
  r = TH_RUN("memory", p, "--at", "peak", "--pool", "1,2", "--folded");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "no segment of device 0 matches --pool 1,2 at that moment"), "%s",
            r.err);
  th_run_free(&r);
  r = TH_RUN("timeline", p, "--stream", "9");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "no segment matches the filter"), "%s", r.err);
  th_run_free(&r);
  r = TH_RUN("stats", p, "--stream", "0");
  th_run_t plain = TH_RUN("stats", p);
  cr_assert_eq(r.status, 0);
  cr_assert_str_eq(r.out, plain.out, "every segment is on stream 0");
  th_run_free(&r);
  th_run_free(&plain);
}

Test(timeline, filters_split_the_totals) {
  /* a run on streams 0 and 5: the totals of each stream add up to the totals of all, at every
   * step, and a filtered index still holds every segment in its states */
  ms_snapshot_t *s = record_run(NULL, 0, 9, 3000, false);
  ms_timeline_t *all = NULL, *s0 = NULL, *s5 = NULL, *pool = NULL;
  ms_timeline_config_t cfg;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &all, &eb), MS_OK, "%s", eb.msg);
  ms_timeline_config_init(&cfg);
  cfg.filter.has_stream = true;
  cfg.filter.stream = 0;
  cr_assert_eq(ms_timeline_create(s, &cfg, &s0, &eb), MS_OK, "%s", eb.msg);
  cfg.filter.stream = 5;
  cr_assert_eq(ms_timeline_create(s, &cfg, &s5, &eb), MS_OK, "%s", eb.msg);
  ms_timeline_config_init(&cfg);
  cfg.filter.has_pool = true; /* the default pool holds everything here */
  cr_assert_eq(ms_timeline_create(s, &cfg, &pool, &eb), MS_OK, "%s", eb.msg);
  size_t n = ms_timeline_nentries(all, 0);
  bool both = false;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    const uint64_t *a = ms_timeline_series(all, 0, (ms_tl_metric)m);
    const uint64_t *x = ms_timeline_series(s0, 0, (ms_tl_metric)m);
    const uint64_t *y = ms_timeline_series(s5, 0, (ms_tl_metric)m);
    const uint64_t *p = ms_timeline_series(pool, 0, (ms_tl_metric)m);
    for (size_t st = 0; st <= n; st++) {
      cr_assert_eq(x[st] + y[st], a[st], "%s at step %zu", ms_tl_metric_name((ms_tl_metric)m), st);
      cr_assert_eq(p[st], a[st]);
      both = both || (x[st] > 0 && y[st] > 0);
    }
  }
  cr_assert(both, "both streams hold memory at some step");
  ms_tl_peak_t p5;
  cr_assert_eq(ms_timeline_peak(s5, 0, MS_TL_ALLOCATED, 0, SIZE_MAX, &p5), MS_OK);
  ms_tl_filter_t f = {.has_stream = true, .stream = 5};
  ms_snapshot_t *at = NULL;
  cr_assert_eq(ms_timeline_snapshot_at(s5, 0, p5.step, &f, &at), MS_OK);
  uint64_t alloc = 0;
  for (size_t i = 0; i < at->nsegments; i++) {
    cr_assert_eq(at->segments[i].stream, 5);
    alloc += at->segments[i].allocated_size;
  }
  cr_assert_eq(alloc, p5.bytes, "the materialised stream holds the stream's peak");
  ms_snapshot_free(at);
  ms_timeline_destroy(all);
  ms_timeline_destroy(s0);
  ms_timeline_destroy(s5);
  ms_timeline_destroy(pool);
  ms_snapshot_free(s);
}

/* A snapshot whose viewer data cannot be computed (a size of 2^62 bytes) gets a clear error and
 * exit status 1 from `timeline --viewer-data` and from `view`, and no output. */
Test(timeline_cli, viewer_data_past_int64_is_an_error) {
  const uint64_t E = (uint64_t)1 << 62;
  const uint64_t seg[1][2] = {{(uint64_t)1 << 40, 2 * MiB}};
  const tr_t tr[] = {{MS_TRACE_ALLOC, 0x1000, E}};
  const char *path = write_in_dir(build(seg, 1, NULL, 0, tr, 1), "huge.msgpack");
  th_run_t r = TH_RUN("timeline", path, "--viewer-data");
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect_str_eq(r.out, "");
  cr_expect(strstr(r.err, "huge.msgpack': device 0: cannot compute the timeline: more than 2^32 "
                          "elements, or a size or the memory alive at once of 2^62 bytes (4 EiB) "
                          "or more, which no device has"),
            "%s", r.err);
  th_run_free(&r);
  r = TH_RUN("view", path, "-o", "v.html");
  cr_expect_eq(r.status, 1, "%s", r.err);
  cr_expect(strstr(r.err, "device 0: the memory timeline holds more than 2^32 elements, or a size "
                          "or the memory alive at once of 2^62 bytes (4 EiB) or more"),
            "%s", r.err);
  cr_expect_neq(access("v.html", F_OK), 0);
  th_run_free(&r);
}

/* `trace`'s TOTAL MEM is exact as Python's int: sizes of a hostile trace summing past int64_t
 * (the fuzzer's 612208075472731497 + 9151314448198139911 was signed overflow, reported by UBSan)
 * are summed in 128 bits and printed as _format_size prints a float; a size of 2^63 or more is
 * printed positive, as Python prints it. */
Test(timeline_cli, trace_total_past_int64) {
  const uint64_t seg[1][2] = {{(uint64_t)1 << 40, 2 * MiB}};
  const tr_t tr[] = {{MS_TRACE_ALLOC, 0x1000, 612208075472731497u},
                     {MS_TRACE_ALLOC, 0x2000, 9151314448198139911u},
                     {MS_TRACE_ALLOC, 0x3000, 18446744073709551615u}};
  const char *path = write_in_dir(build(seg, 1, NULL, 0, tr, 3), "sum.msgpack");
  th_run_t r = TH_RUN("trace", path);
  cr_expect_eq(r.status, 0, "%s", r.err);
  /* what Python's _format_size prints for each, and for their sum, 28210266597380423023 */
  cr_expect(strstr(r.out, "a = MEM[4096:543.8PiB]\n") && strstr(r.out, "b = MEM[8192:7.9EiB]\n") &&
                strstr(r.out, "c = MEM[12288:16.0EiB]\n") && strstr(r.out, "TOTAL MEM: 24.5EiB"),
            "%s", r.out);
  th_run_free(&r);
}

/* ---- totals, peaks and series without stored series (issue #33) ---------------------------- */

/* A built index keeps no series: the peaks over any range, the totals at any step and the series
 * made on demand must equal the series the old index kept, which check_forward ties to a forward
 * walk of the states. Here a second index of the same snapshot makes its series first (ref), and
 * the first one (tl) answers by walking, and must still hold no series afterwards. */
#include <pthread.h>

#include "timeline/internal.h"

static uint64_t tt_rand(uint64_t *x) {
  *x = *x * 6364136223846793005ull + 1442695040888963407ull;
  return *x >> 33;
}

/* The peak of v over [from, to] as the old index found it: the first step of the highest value. */
static void tt_scan_peak(const uint64_t *v, size_t from, size_t to, uint64_t *bytes, size_t *step) {
  size_t best = from;
  for (size_t s = from + 1; s <= to; s++)
    if (v[s] > v[best]) best = s;
  *bytes = v[best];
  *step = best;
}

static void tt_check_range(const ms_timeline_t *tl, const ms_timeline_t *ref, size_t d, size_t from,
                           size_t to, const char *what) {
  ms_tl_peak_t all[MS_TL_METRIC_COUNT];
  cr_assert_eq(ms_timeline_peaks(tl, d, from, to, all), MS_OK);
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    const uint64_t *v = ms_timeline_series(ref, d, (ms_tl_metric)m);
    uint64_t bytes;
    size_t step;
    size_t n = ms_timeline_nentries(tl, d);
    tt_scan_peak(v, from, to > n ? n : to, &bytes, &step); /* the query clamps to */
    ms_tl_peak_t p, q;
    cr_assert_eq(ms_timeline_peak(tl, d, (ms_tl_metric)m, from, to, &p), MS_OK);
    cr_assert_eq(ms_timeline_peak(ref, d, (ms_tl_metric)m, from, to, &q), MS_OK);
    cr_assert(p.bytes == bytes && p.step == step && all[m].bytes == bytes && all[m].step == step,
              "%s: dev %zu %s [%zu, %zu]: peak %" PRIu64 "@%zu (all: %" PRIu64
              "@%zu), series %" PRIu64 "@%zu",
              what, d, ms_tl_metric_name((ms_tl_metric)m), from, to, p.bytes, p.step, all[m].bytes,
              all[m].step, bytes, step);
    cr_assert(memcmp(&p, &q, sizeof p) == 0 && memcmp(&p, &all[m], sizeof p) == 0);
  }
}

/* ms_timeline_walk's visits: each step once, newest first, with the reference's totals. */
typedef struct tt_walk_s {
  const ms_timeline_t *ref;
  size_t dev, next, visits;
  bool bad;
} tt_walk_t;

static void tt_walk_visit(void *arg, size_t step, const uint64_t totals[MS_TL_METRIC_COUNT]) {
  tt_walk_t *k = arg;
  if (step != k->next) k->bad = true;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    if (totals[m] != ms_timeline_series(k->ref, k->dev, (ms_tl_metric)m)[step]) k->bad = true;
  k->next = step - 1;
  k->visits++;
}

static void tt_check_walk(const ms_timeline_t *tl, const ms_timeline_t *ref, size_t d, size_t from,
                          size_t to) {
  size_t n = ms_timeline_nentries(tl, d), top = to > n ? n : to;
  tt_walk_t k = {ref, d, top, 0, false};
  cr_assert_eq(ms_timeline_walk(tl, d, from, to, tt_walk_visit, &k), MS_OK);
  cr_assert(!k.bad && k.visits == top - from + 1, "dev %zu: walk [%zu, %zu]: %zu visits", d, from,
            to, k.visits);
}

static void tt_check_index(const ms_snapshot_t *s, const ms_timeline_config_t *cfg,
                           const char *what) {
  ms_timeline_t *tl = NULL, *ref = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, cfg, &tl, &eb), MS_OK, "%s: %s", what, eb.msg);
  cr_assert_eq(ms_timeline_create(s, cfg, &ref, &eb), MS_OK, "%s: %s", what, eb.msg);
  uint64_t x = 12345;
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    size_t n = ms_timeline_nentries(tl, d);
    tt_check_range(tl, ref, d, 0, n, what);
    tt_check_range(tl, ref, d, 0, SIZE_MAX, what); /* clamped */
    tt_check_range(tl, ref, d, n, n, what);
    tt_check_range(tl, ref, d, 0, 0, what);
    for (int k = 0; k < 40; k++) { /* short ranges, long ones, ranges across checkpoints */
      size_t a = (size_t)(tt_rand(&x) % (n + 1)), b = (size_t)(tt_rand(&x) % (n + 1));
      size_t len = (size_t)(tt_rand(&x) % 8);
      if (k % 3 == 0) b = a + len > n ? n : a + len;
      tt_check_range(tl, ref, d, a < b ? a : b, a < b ? b : a, what);
      if (k % 8 == 0) tt_check_walk(tl, ref, d, a < b ? a : b, a < b ? b : a);
    }
    tt_check_walk(tl, ref, d, 0, SIZE_MAX);
    size_t every = n > 4000 ? n / 2000 : 1;
    for (size_t st = 0; st <= n; st += st + every > n && st < n ? n - st : every) {
      uint64_t t[MS_TL_METRIC_COUNT];
      cr_assert_eq(ms_timeline_totals_at(tl, d, st, t), MS_OK);
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
        cr_assert_eq(t[m], ms_timeline_series(ref, d, (ms_tl_metric)m)[st],
                     "%s: dev %zu step %zu %s", what, d, st, ms_tl_metric_name((ms_tl_metric)m));
      cr_assert_eq(ms_timeline_totals_at(ref, d, st, t), MS_OK);
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
        cr_assert_eq(t[m], ms_timeline_series(ref, d, (ms_tl_metric)m)[st]);
    }
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) /* none of that made a series */
      cr_assert_null(tl->dev[d].series[m], "%s: dev %zu made the %s series", what, d,
                     ms_tl_metric_name((ms_tl_metric)m));
  }
  /* made on demand, they are the reference's */
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++)
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
      const uint64_t *a = ms_timeline_series(tl, d, (ms_tl_metric)m);
      cr_assert_not_null(a);
      cr_assert_eq(a, ms_timeline_series(tl, d, (ms_tl_metric)m), "made once, then kept");
      cr_assert_arr_eq(a, ms_timeline_series(ref, d, (ms_tl_metric)m),
                       (ms_timeline_nentries(tl, d) + 1) * sizeof *a);
    }
  ms_timeline_destroy(tl);
  ms_timeline_destroy(ref);
}

TestSuite(timeline_totals, .timeout = 300);

Test(timeline_totals, fixtures) {
  size_t done = 0;
  for (size_t i = 0; i < NFIX; i++) {
    ms_snapshot_t *s = load_fixture(fixtures[i]);
    if (!s) continue;
    ms_timeline_config_t cfg;
    ms_timeline_config_init(&cfg);
    tt_check_index(s, NULL, fixtures[i]);
    cfg.checkpoint_every = 16; /* many checkpoints: ranges start and end between them */
    tt_check_index(s, &cfg, fixtures[i]);
    /* a filter: the default pool, and the stream of the first segment */
    cfg.filter.has_pool = true;
    tt_check_index(s, &cfg, fixtures[i]);
    if (s->nsegments) {
      cfg.filter.has_pool = false;
      cfg.filter.has_stream = true;
      cfg.filter.stream = s->segments[0].stream;
      tt_check_index(s, &cfg, fixtures[i]);
    }
    ms_snapshot_free(s);
    done++;
  }
  if (!done) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
}

Test(timeline_totals, recorded_traces) {
  static const char *const confs[] = {NULL, "expandable_segments:True", "max_split_size_mb:20"};
  for (size_t c = 0; c < sizeof confs / sizeof *confs; c++) {
    ms_snapshot_t *s = record_run(confs[c], c == 1 ? 700 : 0, c + 7, 3000, false);
    ms_timeline_config_t cfg;
    ms_timeline_config_init(&cfg);
    cfg.checkpoint_every = 64;
    tt_check_index(s, &cfg, confs[c] ? confs[c] : "default");
    cfg.filter.has_stream = true;
    cfg.filter.stream = 5;
    tt_check_index(s, &cfg, "stream 5");
    ms_snapshot_free(s);
  }
}

/* Blocks that grow once the build has seen their whole life: a 3.5 MiB request in a 4 MiB
 * segment takes the whole segment (the rest, 0.5 MiB, is too small to split off), so the totals
 * of the build pass are not the final ones, and the index's peaks come from a second walk. */
Test(timeline_totals, block_growth) {
  ms_snapshot_t *s = build(SEG({0x1000000, 4 * MiB}, {0x2000000, 2 * MiB}), 2,
                           SEG({0x2000000, 1024}), 1,
                           TR({MS_TRACE_SEGMENT_ALLOC, 0x1000000, 4 * MiB},
                              {MS_TRACE_ALLOC, 0x1000000, 3 * MiB + MiB / 2},
                              {MS_TRACE_ALLOC, 0x2000000, 1000},
                              {MS_TRACE_FREE_REQUESTED, 0x1000000, 3 * MiB + MiB / 2},
                              {MS_TRACE_FREE_COMPLETED, 0x1000000, 3 * MiB + MiB / 2},
                              {MS_TRACE_ALLOC, 0x1000000, 2 * MiB + 1},
                              {MS_TRACE_FREE_REQUESTED, 0x1000000, 2 * MiB + 1},
                              {MS_TRACE_FREE_COMPLETED, 0x1000000, 2 * MiB + 1}),
                           8);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  ms_tl_peak_t p;
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 0, SIZE_MAX, &p), MS_OK);
  cr_assert_eq(p.bytes, 4 * MiB + 1024, "the grown block counts whole: %" PRIu64, p.bytes);
  cr_assert_eq(p.step, 3);
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ACTIVE, 4, 8, &p), MS_OK);
  cr_assert_eq(p.bytes, 4 * MiB + 1024);
  cr_assert_eq(p.step, 4, "pending free until step 5");
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_REQUESTED, 0, 8, &p), MS_OK);
  cr_assert_eq(p.bytes, 3 * MiB + MiB / 2 + 1024);
  uint64_t t[MS_TL_METRIC_COUNT];
  cr_assert_eq(ms_timeline_totals_at(tl, 0, 3, t), MS_OK);
  cr_assert_eq(t[MS_TL_ALLOCATED], 4 * MiB + 1024);
  cr_assert_eq(t[MS_TL_RESERVED], 6 * MiB);
  ms_timeline_destroy(tl);
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  cfg.checkpoint_every = 1; /* a checkpoint at every step: their totals carry the growth */
  tt_check_index(s, &cfg, "growth");
  tt_check_index(s, NULL, "growth");
  ms_snapshot_free(s);
}

/* Growth of each kind of block (lib/timeline/grow.c): one born before the trace and allocated at
 * its first step (its growth counts from step 0, as allocated until its free_requested), one
 * pending free when the trace begins (no free_requested: active only), one whose alloc is in the
 * trace. Each 3.5 MiB request takes its whole 4 MiB segment. With checkpoints at every step and
 * with the default, and under a filter that counts none of them: their sizes grow all the same,
 * the totals stay 0. */
/* Block sizes the index cannot keep in its 4-byte unit of 512 bytes are kept exactly (tl_bbig_t):
 * one not a multiple of 512 (a block grown to an odd segment's end: a hand-made or damaged
 * trace) and one of 3 TiB (past the unit's 2 TiB), built and read back from the cache. */
Test(timeline_totals, block_sizes_past_the_unit) {
  const uint64_t odd = 4 * MiB + 100, huge = (uint64_t)3 << 40, big_at = (uint64_t)1 << 44;
  ms_snapshot_t *s =
      build(SEG({0x1000000, odd}, {big_at, huge}), 2, NULL, 0,
            TR({MS_TRACE_ALLOC, 0x1000000, odd - 50}, {MS_TRACE_ALLOC, big_at, huge},
               {MS_TRACE_FREE_REQUESTED, 0x1000000, odd - 50},
               {MS_TRACE_FREE_COMPLETED, 0x1000000, odd - 50},
               {MS_TRACE_FREE_REQUESTED, big_at, huge}, {MS_TRACE_FREE_COMPLETED, big_at, huge}),
            6);
  const uint64_t allocated[7] = {0, odd, odd + huge, huge, huge, 0, 0};
  const uint64_t active[7] = {0, odd, odd + huge, odd + huge, huge, huge, 0};
  ms_timeline_t *tl = NULL, *back = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  const tl_dev_t *d = &tl->dev[0];
  cr_assert_eq(d->bsize[0], TL_BSIZE_BIG, "not a multiple of 512: kept aside");
  cr_assert_eq(d->bsize[1], TL_BSIZE_BIG, "3 TiB: kept aside");
  cr_assert_eq(tl_bsize(d, 0), odd, "the alloc's block grew to the segment's end");
  cr_assert_eq(tl_bsize(d, 3), odd);
  cr_assert_eq(tl_bsize(d, 1), huge);
  cr_assert_eq(tl_bsize(d, 5), huge);
  ms_cache_key_t key = {0x77, 1234, 0};
  void *buf;
  size_t len;
  cr_assert_eq(ms_cache_index_encode(tl, &key, &buf, &len), MS_OK);
  cr_assert_eq(ms_cache_index_decode(buf, len, &key, true, s, NULL, &back, &eb), MS_OK, "%s",
               eb.msg);
  free(buf);
  const ms_timeline_t *both[2] = {tl, back};
  for (int k = 0; k < 2; k++) {
    for (size_t st = 0; st <= 6; st++) {
      uint64_t t[MS_TL_METRIC_COUNT];
      cr_assert_eq(ms_timeline_totals_at(both[k], 0, st, t), MS_OK);
      cr_assert_eq(t[MS_TL_ALLOCATED], allocated[st], "%s step %zu: %" PRIu64,
                   k ? "read back" : "built", st, t[MS_TL_ALLOCATED]);
      cr_assert_eq(t[MS_TL_ACTIVE], active[st], "%s step %zu", k ? "read back" : "built", st);
      cr_assert_eq(t[MS_TL_RESERVED], odd + huge);
    }
    ms_tl_state_t st;
    ms_timeline_state_init(&st);
    cr_assert_eq(ms_timeline_state_at(both[k], 0, 3, &st), MS_OK);
    cr_assert_eq(st.nblocks, 2);
    cr_assert_eq(st.blocks[0].size, odd);
    cr_assert_eq(st.blocks[0].state, MS_BLOCK_ACTIVE_PENDING_FREE);
    cr_assert_eq(st.blocks[1].size, huge);
    cr_assert_eq(st.blocks[1].state, MS_BLOCK_ACTIVE_ALLOCATED);
    ms_timeline_state_release(&st);
  }
  ms_timeline_destroy(back);
  ms_timeline_destroy(tl);
  tt_check_index(s, NULL, "sizes past the unit");
  ms_snapshot_free(s);
}

Test(timeline_totals, block_growth_kinds) {
  const uint64_t req = 3 * MiB + MiB / 2;
  ms_snapshot_t *s = build(
      SEG({0x1000000, 4 * MiB}, {0x2000000, 4 * MiB}, {0x3000000, 4 * MiB}), 3, NULL, 0,
      TR({MS_TRACE_FREE_REQUESTED, 0x1000000, req}, {MS_TRACE_FREE_COMPLETED, 0x2000000, req},
         {MS_TRACE_ALLOC, 0x3000000, req}, {MS_TRACE_FREE_COMPLETED, 0x1000000, req},
         {MS_TRACE_FREE_REQUESTED, 0x3000000, req}, {MS_TRACE_FREE_COMPLETED, 0x3000000, req}),
      6);
  static const uint64_t allocated[7] = {4, 0, 0, 4, 4, 0, 0}, active[7] = {8, 8, 4, 8, 4, 4, 0};
  ms_timeline_config_t cfg;
  for (int every = 0; every < 2; every++) {
    ms_timeline_config_init(&cfg);
    if (every) cfg.checkpoint_every = 1;
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_timeline_create(s, &cfg, &tl, &eb), MS_OK, "%s", eb.msg);
    for (size_t st = 0; st <= 6; st++) {
      uint64_t t[MS_TL_METRIC_COUNT];
      cr_assert_eq(ms_timeline_totals_at(tl, 0, st, t), MS_OK);
      cr_assert_eq(t[MS_TL_ALLOCATED], allocated[st] * MiB, "step %zu: %" PRIu64, st,
                   t[MS_TL_ALLOCATED]);
      cr_assert_eq(t[MS_TL_ACTIVE], active[st] * MiB, "step %zu: %" PRIu64, st, t[MS_TL_ACTIVE]);
      cr_assert_eq(t[MS_TL_RESERVED], 12 * MiB);
    }
    ms_tl_peak_t p;
    cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 0, SIZE_MAX, &p), MS_OK);
    cr_assert_eq(p.bytes, 4 * MiB);
    cr_assert_eq(p.step, 0);
    cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ACTIVE, 1, SIZE_MAX, &p), MS_OK);
    cr_assert_eq(p.bytes, 8 * MiB);
    cr_assert_eq(p.step, 1);
    cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ACTIVE, 4, SIZE_MAX, &p), MS_OK);
    cr_assert_eq(p.bytes, 4 * MiB);
    cr_assert_eq(p.step, 4);
    ms_tl_state_t st;
    ms_timeline_state_init(&st);
    cr_assert_eq(ms_timeline_state_at(tl, 0, 0, &st), MS_OK);
    cr_assert_eq(st.nblocks, 2);
    for (size_t k = 0; k < st.nblocks; k++) {
      cr_assert_eq(st.blocks[k].size, 4 * MiB, "block %zu grew to its segment", k);
      cr_assert_eq(st.blocks[k].alloc_entry, -1);
    }
    cr_assert_eq(st.blocks[0].state, MS_BLOCK_ACTIVE_ALLOCATED);
    cr_assert_eq(st.blocks[1].state, MS_BLOCK_ACTIVE_PENDING_FREE);
    cr_assert_eq(ms_timeline_state_at(tl, 0, 3, &st), MS_OK);
    cr_assert_eq(st.nblocks, 2);
    cr_assert_eq(st.blocks[1].size, 4 * MiB);
    cr_assert_eq(st.blocks[1].alloc_entry, 2);
    ms_timeline_state_release(&st);
    ms_timeline_destroy(tl);
    tt_check_index(s, &cfg, "growth kinds");
  }
  ms_timeline_config_init(&cfg);
  cfg.filter.has_stream = true;
  cfg.filter.stream = 5;
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, &cfg, &tl, &eb), MS_OK, "%s", eb.msg);
  for (size_t st = 0; st <= 6; st++) {
    uint64_t t[MS_TL_METRIC_COUNT];
    cr_assert_eq(ms_timeline_totals_at(tl, 0, st, t), MS_OK);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
      cr_assert_eq(t[m], 0, "step %zu: %s %" PRIu64, st, ms_tl_metric_name((ms_tl_metric)m), t[m]);
  }
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  cr_assert_eq(ms_timeline_state_at(tl, 0, 0, &st), MS_OK);
  cr_assert_eq(st.nblocks, 2);
  cr_assert_eq(st.blocks[0].size, 4 * MiB, "sizes grow outside the filter too");
  ms_timeline_state_release(&st);
  ms_timeline_destroy(tl);
  tt_check_index(s, &cfg, "growth kinds, filtered");
  ms_snapshot_free(s);
}

Test(timeline_totals, empty_trace_and_devices) {
  ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 1024}), 1, NULL, 0);
  tt_check_index(s, NULL, "empty trace");
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  uint64_t t[MS_TL_METRIC_COUNT];
  cr_assert_eq(ms_timeline_totals_at(tl, 0, 0, t), MS_OK);
  cr_assert_eq(t[MS_TL_RESERVED], 2 * MiB);
  cr_assert_eq(t[MS_TL_ALLOCATED], 1024);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

typedef struct tt_thread_s {
  const ms_timeline_t *tl;
  const uint64_t *got[8][MS_TL_METRIC_COUNT];
  int peak_rc; /* the first failure of a peak query (checked by the main thread) */
  size_t ndev;
  pthread_barrier_t *go;
} tt_thread_t;

static void *tt_thread(void *arg) {
  tt_thread_t *t = arg;
  pthread_barrier_wait(t->go);
  for (size_t d = 0; d < t->ndev; d++)
    for (int m = MS_TL_METRIC_COUNT; m-- > 0;) {
      ms_tl_peak_t p;
      int rc = ms_timeline_peak(t->tl, d, (ms_tl_metric)m, 0, 5, &p);
      if (rc != MS_OK && t->peak_rc == MS_OK) t->peak_rc = rc;
      t->got[d][m] = ms_timeline_series(t->tl, d, (ms_tl_metric)m);
    }
  return NULL;
}

/* Several threads ask one index for its series at once: each is made once, all get the same
 * array, equal to a series made alone. */
Test(timeline_totals, series_from_threads) {
  ms_snapshot_t *s = load_fixture("maphsge_select_n_4dev");
  if (!s) s = record_run(NULL, 0, 3, 3000, false);
  ms_timeline_t *tl = NULL, *ref = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_timeline_create(s, NULL, &ref, &eb), MS_OK, "%s", eb.msg);
  enum { NT = 6 };
  pthread_t th[NT];
  tt_thread_t arg[NT];
  pthread_barrier_t go;
  pthread_barrier_init(&go, NULL, NT);
  size_t ndev = ms_timeline_ndevices(tl) < 8 ? ms_timeline_ndevices(tl) : 8;
  for (int i = 0; i < NT; i++) {
    memset(&arg[i], 0, sizeof arg[i]);
    arg[i].tl = tl;
    arg[i].ndev = ndev;
    arg[i].go = &go;
    cr_assert_eq(pthread_create(&th[i], NULL, tt_thread, &arg[i]), 0);
  }
  for (int i = 0; i < NT; i++) pthread_join(th[i], NULL);
  pthread_barrier_destroy(&go);
  for (int i = 0; i < NT; i++) cr_assert_eq(arg[i].peak_rc, MS_OK);
  for (size_t d = 0; d < ndev; d++)
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
      const uint64_t *r = ms_timeline_series(ref, d, (ms_tl_metric)m);
      cr_assert_not_null(arg[0].got[d][m]);
      for (int i = 1; i < NT; i++) cr_assert_eq(arg[i].got[d][m], arg[0].got[d][m]);
      cr_assert_arr_eq(arg[0].got[d][m], r, (ms_timeline_nentries(tl, d) + 1) * sizeof *r);
    }
  ms_timeline_destroy(tl);
  ms_timeline_destroy(ref);
  ms_snapshot_free(s);
}

Test(timeline_totals, hostile_queries) {
  ms_snapshot_t *s = build(SEG({0x100000, 2 * MiB}), 1, SEG({0x100000, 1024}), 1,
                           TR({MS_TRACE_ALLOC, 0x100000, 1000}), 1);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  size_t nd = ms_timeline_ndevices(tl);
  ms_tl_peak_t p, keep[MS_TL_METRIC_COUNT];
  memset(keep, 0x5a, sizeof keep);
  uint64_t t[MS_TL_METRIC_COUNT] = {7, 7, 7, 7};
  cr_assert_eq(ms_timeline_peak(tl, nd, MS_TL_ALLOCATED, 0, 1, &p), MS_EINVAL);
  cr_assert_eq(ms_timeline_peak(tl, SIZE_MAX, MS_TL_ALLOCATED, 0, 1, &p), MS_EINVAL);
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_METRIC_COUNT, 0, 1, &p), MS_EINVAL);
  cr_assert_eq(ms_timeline_peak(tl, 0, (ms_tl_metric)-1, 0, 1, &p), MS_EINVAL);
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 1, 0, &p), MS_EINVAL);
  cr_assert_eq(ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 5, SIZE_MAX, &p), MS_EINVAL, "from > n");
  cr_assert_eq(ms_timeline_peaks(tl, 0, 1, 0, keep), MS_EINVAL);
  cr_assert_eq(ms_timeline_peaks(tl, nd, 0, 1, keep), MS_EINVAL);
  cr_assert_eq(ms_timeline_peaks(tl, 0, 0, 1, NULL), MS_EINVAL);
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    cr_assert_eq(keep[m].bytes, 0x5a5a5a5a5a5a5a5aull, "untouched on failure");
  cr_assert_eq(ms_timeline_totals_at(tl, 0, 2, t), MS_EINVAL);
  cr_assert_eq(ms_timeline_totals_at(tl, nd, 0, t), MS_EINVAL);
  cr_assert_eq(ms_timeline_totals_at(tl, 0, 0, NULL), MS_EINVAL);
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) cr_assert_eq(t[m], 7, "untouched on failure");
  tt_walk_t k = {tl, 0, 0, 0, false};
  cr_assert_eq(ms_timeline_walk(tl, nd, 0, 1, tt_walk_visit, &k), MS_EINVAL);
  cr_assert_eq(ms_timeline_walk(tl, 0, 1, 0, tt_walk_visit, &k), MS_EINVAL);
  cr_assert_eq(ms_timeline_walk(tl, 0, 2, SIZE_MAX, tt_walk_visit, &k), MS_EINVAL);
  cr_assert_eq(ms_timeline_walk(tl, 0, 0, 1, NULL, &k), MS_EINVAL);
  cr_assert_eq(k.visits, 0);
  cr_assert_null(ms_timeline_series(tl, nd, MS_TL_ALLOCATED));
  cr_assert_null(ms_timeline_series(tl, 0, MS_TL_METRIC_COUNT));
  cr_assert_eq(ms_timeline_totals_at(tl, 0, 1, t), MS_OK);
  cr_assert_eq(t[MS_TL_ALLOCATED], 1024);
  cr_assert_eq(ms_timeline_totals_at(tl, 0, 0, t), MS_OK);
  cr_assert_eq(t[MS_TL_ALLOCATED], 0);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

/* ---- a segment's blocks in chunks (timeline/blocks.c) -------------------------------------- */

static void blks_check(const tl_blks_t *v, const uint64_t *ref, size_t n) {
  cr_assert_eq(v->len, n);
  size_t k = 0;
  for (size_t i = 0; i < v->nch; i++) {
    const tl_bchunk_t *c = v->ch[i];
    cr_assert(c->n > 0 && c->n <= c->cap && c->cap <= TL_BLK_CHUNK, "chunk %zu: %u of %u", i, c->n,
              c->cap);
    for (uint32_t j = 0; j < c->n; j++, k++) {
      cr_assert(k < n && c->b[j].address == ref[k], "block %zu", k);
      cr_assert_eq(c->b[j].requested_size, ref[k] * 3, "a block moves whole");
    }
  }
  cr_assert_eq(k, n);
}

/* The first place of ref[0..n) at or above a. */
static size_t blks_ref_lower(const uint64_t *ref, size_t n, uint64_t a) {
  size_t k = 0;
  while (k < n && ref[k] < a)
    k++;
  return k;
}

Test(timeline, blocks_in_chunks_as_in_one_sorted_array) {
  enum { MAXN = 3000 };
  uint64_t *ref = malloc(MAXN * sizeof *ref), x = 5;
  ms_tl_block_t *flat = malloc(MAXN * sizeof *flat);
  cr_assert(ref && flat);
  size_t n = 0, most_chunks = 0;
  tl_blks_t v;
  memset(&v, 0, sizeof v);
  for (int op = 0; op < 30000; op++) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    uint64_t r = x >> 20, a = 16 * (r % 4096);
    size_t at = blks_ref_lower(ref, n, a);
    bool grow = op < 12000 ? r % 5 != 0 : op < 20000 ? r % 2 == 0 : r % 5 == 0;
    if ((r >> 12) % 97 == 0) { /* split at a, check both halves, join them again */
      tl_blks_t tail;
      memset(&tail, 0, sizeof tail);
      cr_assert_eq(ms__tl_blk_split(&v, tl_blk_lower(&v, a), &tail), MS_OK);
      blks_check(&v, ref, at);
      blks_check(&tail, ref + at, n - at);
      cr_assert_eq(ms__tl_blk_append(&v, &tail), MS_OK);
      ms__tl_blk_free(&tail);
    } else if ((r >> 12) % 89 == 0) { /* copied out and loaded into another */
      cr_assert_eq(ms__tl_blk_copy(&v, flat), n);
      tl_blks_t w;
      memset(&w, 0, sizeof w);
      cr_assert_eq(ms__tl_blk_load(&w, flat, n), MS_OK);
      ms__tl_blk_free(&v);
      v = w;
    } else if (grow && n < MAXN && (at == n || ref[at] != a)) {
      ms_tl_block_t b;
      memset(&b, 0, sizeof b);
      b.address = a;
      b.size = 16;
      b.requested_size = a * 3;
      cr_assert_eq(ms__tl_blk_insert(&v, tl_blk_lower(&v, a), &b), MS_OK);
      memmove(ref + at + 1, ref + at, (n - at) * sizeof *ref);
      ref[at] = a;
      n++;
    } else if (!grow && n > 0) {
      at = at < n ? at : n - 1;
      tl_bpos_t p = tl_blk_lower(&v, ref[at]);
      cr_assert_eq(tl_blk_at(&v, p)->address, ref[at]);
      ms__tl_blk_remove(&v, p);
      memmove(ref + at, ref + at + 1, (n - at - 1) * sizeof *ref);
      n--;
    }
    /* the place of a: the block there and the one before, as in the sorted array */
    tl_bpos_t p = tl_blk_lower(&v, a);
    size_t k = blks_ref_lower(ref, n, a);
    const ms_tl_block_t *at_p = tl_blk_at(&v, p), *before = tl_blk_before(&v, p);
    cr_assert(k < n ? at_p && at_p->address == ref[k] : at_p == NULL, "op %d", op);
    cr_assert(k > 0 ? before && before->address == ref[k - 1] : before == NULL, "op %d", op);
    if (op % 101 == 0) blks_check(&v, ref, n);
    if (v.nch > most_chunks) most_chunks = v.nch;
  }
  blks_check(&v, ref, n);
  cr_expect_gt(most_chunks, 10, "full chunks split (%zu chunks at most)", most_chunks);
  ms__tl_blk_free(&v);
  cr_assert_eq(v.nch, 0);
  free(ref);
  free(flat);
}

/* ---- the devices built on threads ------------------------------------------------------------ */

/* A snapshot of ndev devices, each its own allocator's recorded run of nops random operations
 * (record_run's mix, without empty_cache: every device's trace stays long). */
static ms_snapshot_t *record_devices(size_t ndev, const int *nops) {
  ms_sim_config_t sc = {.ndevices = (int)ndev, .capacity = (size_t)8 << 30};
  ms_backend_t *be = NULL;
  cr_assert_eq(ms_backend_sim_create(&sc, &be), MS_OK);
  ms_alloc_config_t ac;
  ms_alloc_config_init(&ac);
  ms_errbuf_t eb = {{0}};
  ms_allocator_t *a[4] = {NULL};
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.context = MS_CONTEXT_NONE;
  hc.max_entries = (size_t)1 << 20;
  ms_devptr_t live[4][256] = {{0}};
  for (size_t d = 0; d < ndev; d++) {
    ms_allocator_config_t cfg = {.backend = be, .device = (int)d, .alloc = &ac};
    cr_assert_eq(ms_allocator_create(&cfg, &a[d], &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(ms_allocator_record_history(a[d], &hc, &eb), MS_OK, "%s", eb.msg);
    uint64_t x = 77 + d;
    for (int op = 0; op < nops[d]; op++) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      unsigned r = (unsigned)(x >> 33);
      int slot = (int)(r % 256);
      if (live[d][slot]) {
        cr_assert_eq(ms_allocator_free(a[d], live[d][slot]), MS_OK);
        live[d][slot] = 0;
      } else {
        size_t size = r % 3 == 0 ? 1 + (x >> 40) % (1 << 20) : 512 * (1 + (x >> 50) % 8);
        cr_assert_eq(ms_allocator_malloc(a[d], size, 0, &live[d][slot]), MS_OK);
      }
    }
  }
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_allocator_snapshot(a, ndev, &s, &eb), MS_OK, "%s", eb.msg);
  for (size_t d = 0; d < ndev; d++) {
    for (int i = 0; i < 256; i++)
      if (live[d][i]) cr_assert_eq(ms_allocator_free(a[d], live[d][i]), MS_OK);
    ms_allocator_destroy(a[d]);
  }
  ms_backend_destroy(be);
  return s;
}

static ms_timeline_t *build_with_threads(const ms_snapshot_t *s, size_t threads, size_t budget,
                                         int *rc, ms_errbuf_t *eb) {
  ms_timeline_t *tl = NULL;
  cr_assert_eq(ms__tl_alloc(s, NULL, &tl, eb), MS_OK);
  *rc = ms__tl_build(tl, threads, budget, eb);
  return tl;
}

Test(timeline, devices_on_threads_as_on_one) {
  /* three devices past TL_PAR_MIN entries and a small one: built on 1, 2 and 4 threads, and on 4
   * threads with a memory budget of one build at a time (the others wait), every device's
   * pairing, block sizes, checkpoints, peaks and states at 40 steps are the same */
  const int nops[4] = {60000, 45000, 3000, 52000};
  ms_snapshot_t *s = record_devices(4, nops);
  cr_assert_eq(s->ndevices, 4);
  size_t big = 0;
  for (size_t d = 0; d < 4; d++)
    big += s->devices[d].ntrace >= TL_PAR_MIN;
  cr_assert_eq(big, 3, "three devices are large enough for threads of their own");
  ms_errbuf_t eb = {{0}};
  int rc;
  ms_timeline_t *one = build_with_threads(s, 1, 0, &rc, &eb);
  cr_assert_eq(rc, MS_OK, "%s", eb.msg);
  static const size_t runs[3][2] = {{2, 0}, {4, 0}, {4, 1}}; /* threads, budget */
  for (size_t run = 0; run < 3; run++) {
    size_t threads = runs[run][0];
    ms_timeline_t *tl = build_with_threads(s, threads, runs[run][1], &rc, &eb);
    cr_assert_eq(rc, MS_OK, "%s", eb.msg);
    for (size_t d = 0; d < 4; d++) {
      const tl_dev_t *x = &one->dev[d], *y = &tl->dev[d];
      size_t n = x->n;
      cr_assert_eq(y->n, n);
      cr_assert(memcmp(x->pair, y->pair, n * sizeof *x->pair) == 0, "dev %zu pairs", d);
      for (size_t i = 0; i < n; i++)
        cr_assert_eq(tl_bsize(x, i), tl_bsize(y, i), "dev %zu entry %zu's size", d, i);
      cr_assert_eq(x->ckpts.len, y->ckpts.len, "dev %zu checkpoints", d);
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
        ms_tl_peak_t p, q;
        cr_assert_eq(ms_timeline_peak(one, d, (ms_tl_metric)m, 0, n, &p), MS_OK);
        cr_assert_eq(ms_timeline_peak(tl, d, (ms_tl_metric)m, 0, n, &q), MS_OK);
        cr_assert(p.bytes == q.bytes && p.step == q.step, "dev %zu %s", d,
                  ms_tl_metric_name((ms_tl_metric)m));
      }
      ms_tl_state_t a, b;
      ms_timeline_state_init(&a);
      ms_timeline_state_init(&b);
      for (size_t k = 0; k <= 40; k++) {
        size_t step = n * k / 40;
        cr_assert_eq(ms_timeline_state_at(one, d, step, &a), MS_OK);
        cr_assert_eq(ms_timeline_state_at(tl, d, step, &b), MS_OK);
        char why[256];
        cr_assert(!state_diff(&a, &b, why, sizeof why), "%zu threads, dev %zu step %zu: %s",
                  threads, d, step, why);
      }
      ms_timeline_state_release(&a);
      ms_timeline_state_release(&b);
    }
    ms_timeline_destroy(tl);
  }
  ms_timeline_destroy(one);

  /* devices 3 and 1 broken (an allocation where no segment is): on any number of threads the
   * error names device 1, as one thread building the devices in order reports it */
  static const size_t broken[2] = {3, 1};
  for (size_t i = 0; i < 2; i++) {
    size_t d = broken[i];
    ms_snap_trace_t *tr = s->trace + s->devices[d].first_trace;
    size_t k = s->devices[d].ntrace / 2;
    while (k < s->devices[d].ntrace && tr[k].action != MS_TRACE_ALLOC)
      k++;
    cr_assert_lt(k, s->devices[d].ntrace);
    tr[k].addr = 0x10;
  }
  char first[sizeof eb.msg];
  for (size_t threads = 1; threads <= 4; threads++) {
    memset(&eb, 0, sizeof eb);
    ms_timeline_t *tl = build_with_threads(s, threads, threads == 3 ? 1 : 0, &rc, &eb);
    cr_assert_eq(rc, MS_EFORMAT, "%zu threads", threads);
    cr_assert(strstr(eb.msg, ": device 1, trace entry ") != NULL, "%zu threads: %s", threads,
              eb.msg);
    if (threads == 1) memcpy(first, eb.msg, sizeof first);
    cr_assert_str_eq(eb.msg, first, "%zu threads", threads);
    ms_timeline_destroy(tl);
  }
  ms_timeline_t *tl = NULL;
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_EFORMAT);
  cr_assert_str_eq(eb.msg, first);
  cr_assert_null(tl);
  ms_snapshot_free(s);
}
