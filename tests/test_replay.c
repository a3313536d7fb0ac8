/* SPDX-License-Identifier: MIT
 * Tests of `memsnap replay` (lib/replay.c, cli/cmd-replay.c; docs/replay.md):
 *  - --check passes on every replayable PyTorch fixture, and the shared fixtures that are not
 *    replayable say why;
 *  - the check can fail: the allocator with a wrong tie-break, split threshold or rounding
 *    (ms__alloc_test_mutation) fails on at least one fixture, and a tampered trace fails at the
 *    tampered entry with both sides named;
 *  - traces recorded by memsnap's own recorder on the sim device (complete by construction, or cut
 *    by a small ring buffer) replay with PASS under several configurations: record_stream deferred
 *    frees, several streams, max_split_size_mb, roundup_power2_divisions, OOM retries and
 *    empty_cache bursts with a small device;
 *  - what-if: a fragmenting workload needs less with max_split_size_mb, and --min-capacity's
 *    answer has no OOM while 2 MiB less has one;
 *  - the command line: exit codes, JSON, the sweep table.
 * Fixtures come from $MEMSNAP_TORCH_FIXTURES or MS_TEST_FIXTURES_DEFAULT (SKIP when absent).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "alloc/alloc_internal.h"
#include "memsnap/allocator.h"
#include "memsnap/history.h"
#include "memsnap/replay.h"
#include "memsnap/serialize.h"
#include "memsnap/stats.h"

#define MiB ((size_t)1 << 20)

static const char *fixtures_dir(void) {
  const char *d = getenv("MEMSNAP_TORCH_FIXTURES");
  return d && *d ? d : MS_TEST_FIXTURES_DEFAULT;
}

static const char *const replayable[] = {"a0kuma_adamw_small", "cranberrii_ftcourse",
                                         "maphsge_select_n_4dev",
                                         "wedsonlin_cs336_medium_1024_training"};
#define NREPLAYABLE (sizeof replayable / sizeof *replayable)

/* Loads a fixture, or skips the test with a visible SKIP line. */
static ms_snapshot_t *load_fixture(const char *name) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.pickle", fixtures_dir(), name);
  struct stat st;
  if (stat(path, &st) != 0)
    cr_skip_test("SKIP: PyTorch fixtures not found in %s (set MEMSNAP_TORCH_FIXTURES)",
                 fixtures_dir());
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s: %s", name, eb.msg);
  return s;
}

static ms_replay_report_t *check(const ms_snapshot_t *s, size_t capacity) {
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.capacity = capacity;
  ms_replay_report_t *rep = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
  return rep;
}

/* ---- the shared fixtures ------------------------------------------------------------------- */

Test(replay, fixtures_pass, .timeout = 60) {
  static const size_t allocs[NREPLAYABLE] = {18, 3505, 1497, 7591};
  for (size_t i = 0; i < NREPLAYABLE; i++) {
    ms_snapshot_t *s = load_fixture(replayable[i]);
    ms_replay_report_t *rep = check(s, 0);
    cr_assert_geq(rep->ndevices, 1);
    const ms_replay_device_t *d = &rep->devices[0];
    cr_expect_eq(d->verdict, MS_REPLAY_PASS, "%s: %s: %s", replayable[i],
                 ms_replay_verdict_name(d->verdict), d->reason);
    cr_expect_eq(d->allocs, allocs[i], "%s: %zu allocs", replayable[i], d->allocs);
    cr_expect_eq(d->mid_run, i != 0, "%s", replayable[i]);
    ms_replay_report_free(rep);
    ms_snapshot_free(s);
  }
}

Test(replay, fixture_start_states, .timeout = 60) {
  /* docs/replay.md, "Results on the shared fixtures": start segments; wedsonlin's 438 blocks
   * freed in the trace are inferred. */
  struct { const char *name; size_t segs, inferred; } t[] = {
      {"a0kuma_adamw_small", 0, 0},
      {"cranberrii_ftcourse", 63, 0},
      {"maphsge_select_n_4dev", 69, 0},
      {"wedsonlin_cs336_medium_1024_training", 234, 438},
  };
  for (size_t i = 0; i < sizeof t / sizeof *t; i++) {
    ms_snapshot_t *s = load_fixture(t[i].name);
    ms_replay_report_t *rep = check(s, 0);
    cr_expect_eq(rep->devices[0].start_segments, t[i].segs, "%s: %zu", t[i].name,
                 rep->devices[0].start_segments);
    cr_expect_eq(rep->devices[0].inferred, t[i].inferred, "%s: %zu", t[i].name,
                 rep->devices[0].inferred);
    cr_expect_leq(rep->devices[0].ambiguous, rep->devices[0].inferred);
    ms_replay_report_free(rep);
    ms_snapshot_free(s);
  }
}

Test(replay, maphsge_other_devices_unreplayable, .timeout = 30) {
  ms_snapshot_t *s = load_fixture("maphsge_select_n_4dev");
  ms_replay_report_t *rep = check(s, 0);
  cr_assert_eq(rep->ndevices, 4);
  for (size_t d = 1; d < 4; d++) {
    cr_expect_eq(rep->devices[d].verdict, MS_REPLAY_UNREPLAYABLE);
    cr_expect(strncmp(rep->devices[d].reason, "no trace entries (", 18) == 0, "%s", rep->devices[d].reason);
  }
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

Test(replay, short_traces_unreplayable, .timeout = 30) {
  static const char *const names[] = {"jogregoire_diffusion_tiny", "yiyi_flexgen_oom_legacy",
                                      "yiyi_flexgen_1.3b_legacy_a"};
  for (size_t i = 0; i < 3; i++) {
    ms_snapshot_t *s = load_fixture(names[i]);
    ms_replay_report_t *rep = check(s, 0);
    cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_UNREPLAYABLE, "%s", names[i]);
    cr_expect_str_eq(rep->devices[0].reason, "no alloc/free history (1 trace entry)", "%s",
                     names[i]);
    ms_replay_report_free(rep);
    ms_snapshot_free(s);
  }
}

/* ---- the check can fail --------------------------------------------------------------------- */

static size_t failures_with_mutation(int mutation, char *which, size_t cap) {
  size_t fails = 0;
  which[0] = 0;
  for (size_t i = 0; i < NREPLAYABLE; i++) {
    ms_snapshot_t *s = load_fixture(replayable[i]);
    ms__alloc_test_mutation = mutation;
    ms_replay_report_t *rep = check(s, 0);
    ms__alloc_test_mutation = MS__MUT_NONE;
    if (rep->devices[0].verdict == MS_REPLAY_FAIL) {
      fails++;
      size_t n = strlen(which);
      snprintf(which + n, cap - n, "%s%s", n ? ", " : "", replayable[i]);
      cr_expect_neq(rep->devices[0].expected[0], 0);
      cr_expect_neq(rep->devices[0].actual[0], 0);
    }
    ms_replay_report_free(rep);
    ms_snapshot_free(s);
  }
  return fails;
}

Test(replay, wrong_tie_break_is_caught, .timeout = 60) {
  char which[512];
  size_t n = failures_with_mutation(MS__MUT_TIEBREAK_HIGH, which, sizeof which);
  cr_expect_geq(n, 1, "highest-address tie-break passed every fixture");
  cr_log_info("highest-address tie-break fails on %zu fixture(s): %s", n, which);
}

Test(replay, wrong_rounding_is_caught, .timeout = 60) {
  char which[512];
  size_t n = failures_with_mutation(MS__MUT_ROUND_1024, which, sizeof which);
  cr_expect_geq(n, 1, "1024-byte rounding passed every fixture");
  cr_log_info("1024-byte rounding fails on %zu fixture(s): %s", n, which);
}

Test(replay, wrong_split_threshold_on_constructed_trace, .timeout = 30) {
  /* Split at >= 1 MiB instead of > 1 MiB: no fixture has a remainder of exactly 1 MiB, so a
   * recorded trace with one proves the check catches it. Recorded with the right rule. */
  ms_backend_t *be;
  ms_allocator_t *al;
  ms_sim_config_t sc = {.capacity = 1024 * MiB};
  cr_assert_eq(ms_backend_sim_create(&sc, &be), MS_OK);
  ms_allocator_config_t ac = {.backend = be};
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&ac, &al, &eb), MS_OK);
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.context = MS_CONTEXT_NONE;
  cr_assert_eq(ms_allocator_record_history(al, &hc, &eb), MS_OK);
  ms_devptr_t p, q, r2;
  cr_assert_eq(ms_allocator_malloc(al, 12 * MiB, 0, &p), MS_OK); /* segment of 12 MiB */
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  cr_assert_eq(ms_allocator_malloc(al, 11 * MiB, 0, &q), MS_OK); /* remainder exactly 1 MiB */
  cr_assert_eq(ms_allocator_malloc(al, 3 * MiB, 0, &r2), MS_OK);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms_allocator_snapshot(&al, 1, &s, &eb), MS_OK);
  ms_replay_report_t *rep = check(s, 0);
  cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_PASS, "%s", rep->devices[0].reason);
  ms_replay_report_free(rep);
  ms__alloc_test_mutation = MS__MUT_SPLIT_GE;
  rep = check(s, 0);
  ms__alloc_test_mutation = MS__MUT_NONE;
  cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_FAIL, "split at >= 1 MiB was not caught");
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
  ms_allocator_destroy(al);
  ms_backend_destroy(be);
}

Test(replay, tampered_trace_fails_at_the_entry, .timeout = 30) {
  ms_snapshot_t *s = load_fixture("a0kuma_adamw_small");
  /* Move the 10th alloc by 512 bytes. */
  size_t seen = 0, at = 0;
  for (size_t i = 0; i < s->ntrace; i++) {
    if (s->trace[i].action == MS_TRACE_ALLOC && ++seen == 10) {
      at = i;
      s->trace[i].addr += 512;
      break;
    }
  }
  cr_assert_eq(seen, 10);
  ms_replay_report_t *rep = check(s, 0);
  const ms_replay_device_t *d = &rep->devices[0];
  cr_expect_eq(d->verdict, MS_REPLAY_FAIL);
  cr_expect_eq(d->mismatch_entry, (int64_t)at);
  char want[128];
  snprintf(want, sizeof want, "alloc 0x%" PRIx64 " %" PRIu64 " B", s->trace[at].addr,
           s->trace[at].size);
  cr_expect_str_eq(d->expected, want);
  snprintf(want, sizeof want, "alloc 0x%" PRIx64 " %" PRIu64 " B", s->trace[at].addr - 512,
           s->trace[at].size);
  cr_expect_str_eq(d->actual, want);
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

/* ---- traces recorded by memsnap on the sim device -------------------------------------------- */

typedef struct rec_s {
  ms_backend_t *be;
  ms_allocator_t *al;
  ms_stream_t streams[4];
} rec_t;

static void rec_open(rec_t *r, const char *conf, size_t capacity, size_t max_entries) {
  memset(r, 0, sizeof *r);
  ms_sim_config_t sc = {.capacity = capacity};
  cr_assert_eq(ms_backend_sim_create(&sc, &r->be), MS_OK);
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb;
  cr_assert_eq(ms_alloc_config_parse(&c, conf, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_config_t ac = {.backend = r->be, .alloc = &c};
  cr_assert_eq(ms_allocator_create(&ac, &r->al, &eb), MS_OK, "%s", eb.msg);
  const ms_backend_ops_t *ops = ms_backend_ops(r->be);
  for (int i = 1; i < 4; i++) cr_assert_eq(ops->stream_create(ops->ctx, 0, &r->streams[i]), MS_OK);
  ms_history_config_t hc;
  ms_history_config_init(&hc);
  hc.context = MS_CONTEXT_NONE;
  hc.max_entries = max_entries;
  cr_assert_eq(ms_allocator_record_history(r->al, &hc, &eb), MS_OK, "%s", eb.msg);
}

static ms_snapshot_t *rec_close(rec_t *r) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_snapshot(&r->al, 1, &s, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_destroy(r->al);
  ms_backend_destroy(r->be);
  return s;
}

static uint64_t rng_next(uint64_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 7;
  *x ^= *x << 17;
  return *x;
}

/* A training-like mix: small and large sizes, drifting, frees in random order; optional streams,
 * record_stream, empty_cache. OOMs are tolerated (they are part of the trace). */
typedef struct wl_s {
  int ops;
  int streams;          /* streams used: 1..4 */
  bool record_stream;   /* some blocks used on another stream, events completed later */
  bool empty_cache;     /* occasional empty_cache */
  size_t max_size;
  uint64_t seed;
} wl_t;

static void workload(rec_t *r, const wl_t *w) {
  enum { LIVE = 64 };
  ms_devptr_t live[LIVE] = {0};
  uint64_t x = w->seed;
  for (int op = 0; op < w->ops; op++) {
    int slot = (int)(rng_next(&x) % LIVE);
    if (live[slot]) {
      cr_assert_eq(ms_allocator_free(r->al, live[slot]), MS_OK);
      live[slot] = 0;
    } else {
      uint64_t k = rng_next(&x);
      size_t size = (k & 1) ? (size_t)(k >> 8) % (512 * 1024) + 1 : (size_t)(k >> 8) % w->max_size + 1;
      ms_stream_t st = r->streams[(k >> 4) % (uint64_t)w->streams];
      ms_devptr_t p = 0;
      int e = ms_allocator_malloc(r->al, size, st, &p);
      cr_assert(e == MS_OK || e == MS_EOOM, "malloc: %d", e);
      if (e == MS_OK) {
        live[slot] = p;
        if (w->record_stream && (k >> 20) % 4 == 0) {
          ms_stream_t other = r->streams[((k >> 4) + 1) % 4];
          cr_assert_eq(ms_allocator_record_stream(r->al, p, other), MS_OK);
        }
      }
    }
    if (w->record_stream && op % 7 == 0) {
      int s = (int)(rng_next(&x) % 4);
      cr_assert_eq(ms_sim_stream_complete(r->be, 0, r->streams[s]), MS_OK);
    }
    if (w->empty_cache && op % 97 == 96) cr_assert_eq(ms_allocator_empty_cache(r->al), MS_OK);
  }
}

static void expect_pass(const ms_snapshot_t *s, const char *what, bool allow_inconclusive) {
  ms_replay_report_t *rep = check(s, 0);
  const ms_replay_device_t *d = &rep->devices[0];
  bool ok = d->verdict == MS_REPLAY_PASS ||
            (allow_inconclusive && d->verdict == MS_REPLAY_INCONCLUSIVE);
  cr_expect(ok, "%s: %s: %s", what, ms_replay_verdict_name(d->verdict), d->reason);
  cr_expect_gt(d->allocs, 0, "%s", what);
  ms_replay_report_free(rep);
}

static size_t count_action(const ms_snapshot_t *s, ms_trace_action a) {
  size_t n = 0;
  for (size_t i = 0; i < s->ntrace; i++) n += s->trace[i].action == a;
  return n;
}

Test(replay, synthetic_default, .timeout = 60) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB * 64, 1000000);
  wl_t w = {.ops = 4000, .streams = 1, .max_size = 48 * MiB, .seed = 1};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  expect_pass(s, "default settings", false);
  ms_snapshot_free(s);
}

Test(replay, synthetic_streams_and_record_stream, .timeout = 60) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB * 64, 1000000);
  wl_t w = {.ops = 4000, .streams = 4, .record_stream = true, .max_size = 30 * MiB, .seed = 2};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  /* Deferred frees: some free_completed come later than their free_requested. */
  size_t deferred = 0;
  for (size_t i = 0; i + 1 < s->ntrace; i++)
    if (s->trace[i].action == MS_TRACE_FREE_REQUESTED &&
        !(s->trace[i + 1].action == MS_TRACE_FREE_COMPLETED && s->trace[i + 1].addr == s->trace[i].addr))
      deferred++;
  cr_expect_gt(deferred, 10);
  expect_pass(s, "streams + record_stream", false);
  ms_snapshot_free(s);
}

Test(replay, synthetic_max_split_size, .timeout = 60) {
  rec_t r;
  rec_open(&r, "max_split_size_mb:40", 1024 * MiB * 64, 1000000);
  wl_t w = {.ops = 4000, .streams = 2, .max_size = 120 * MiB, .seed = 3};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  expect_pass(s, "max_split_size_mb:40", false);
  ms_snapshot_free(s);
}

Test(replay, synthetic_roundup_power2_divisions, .timeout = 60) {
  rec_t r;
  rec_open(&r, "roundup_power2_divisions:[1:4,2:8,>:2]", 1024 * MiB * 64, 1000000);
  wl_t w = {.ops = 4000, .streams = 1, .max_size = 40 * MiB, .seed = 4};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  expect_pass(s, "roundup_power2_divisions", false);
  ms_snapshot_free(s);
}

Test(replay, synthetic_oom_retries_with_capacity, .timeout = 60) {
  rec_t r;
  rec_open(&r, "", 400 * MiB, 1000000);
  wl_t w = {.ops = 5000, .streams = 2, .empty_cache = true, .max_size = 64 * MiB, .seed = 5};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  cr_expect_gt(count_action(s, MS_TRACE_SEGMENT_FREE), 10);
  cr_expect_gt(count_action(s, MS_TRACE_OOM), 0);
  /* Without a capacity: OOM-path bursts taken from the trace as triggers. */
  expect_pass(s, "OOM retries, bursts from the trace", false);
  /* With the recorded capacity: the allocator predicts every burst itself. */
  ms_replay_report_t *rep = check(s, 400 * MiB);
  cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_PASS, "capacity 400 MiB: %s",
               rep->devices[0].reason);
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

Test(replay, synthetic_mid_run_ring_buffer, .timeout = 60) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB * 64, 3000);
  wl_t w = {.ops = 8000, .streams = 2, .max_size = 48 * MiB, .seed = 6};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  cr_assert_gt(s->devices[0].trace_dropped, 0);
  ms_replay_report_t *rep = check(s, 0);
  const ms_replay_device_t *d = &rep->devices[0];
  cr_expect(d->mid_run);
  cr_expect(d->verdict == MS_REPLAY_PASS || d->verdict == MS_REPLAY_INCONCLUSIVE, "%s: %s",
            ms_replay_verdict_name(d->verdict), d->reason);
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

Test(replay, private_pools_unreplayable, .timeout = 30) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB, 1000);
  ms_pool_id_t id = ms_pool_id_new(false);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(r.al, id, NULL, NULL), MS_OK);
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(r.al, 4096, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(r.al, id), MS_OK);
  ms_snapshot_t *s = rec_close(&r);
  ms_replay_report_t *rep = check(s, 0);
  cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_UNREPLAYABLE);
  cr_expect(strstr(rep->devices[0].reason, "private pools") != NULL, "%s", rep->devices[0].reason);
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

/* A snapshot whose segments' blocks do not tile them cannot give a start state (fuzz_consumers
 * found an allocator assertion behind one): unreplayable with the reason, for every kind of run. */
Test(replay, segment_blocks_that_do_not_tile_unreplayable, .timeout = 30) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB, 1000);
  ms_devptr_t p[3];
  for (int k = 0; k < 3; k++) cr_assert_eq(ms_allocator_malloc(r.al, 3 * MiB, 0, &p[k]), MS_OK);
  cr_assert_eq(ms_allocator_free(r.al, p[1]), MS_OK);
  ms_snapshot_t *s = rec_close(&r);
  cr_assert_gt(s->nsegments, 0);
  ms_snap_segment_t *g = &s->segments[0];
  cr_assert_gt(g->nblocks, 1);
  static const char *const want[] = {"does not follow the one before", "its blocks cover"};
  for (int mode = 0; mode < 2; mode++) {
    ms_snap_block_t *b = &s->blocks[g->first_block + (mode ? g->nblocks - 1 : 0)];
    uint64_t keep = b->size;
    b->size -= 512; /* mode 0: a gap after the first block; mode 1: the end is not covered */
    ms_replay_report_t *rep = check(s, 0);
    cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_UNREPLAYABLE);
    cr_expect(strstr(rep->devices[0].reason, "is inconsistent") &&
                  strstr(rep->devices[0].reason, want[mode]),
              "%s", rep->devices[0].reason);
    ms_replay_report_free(rep);
    size_t cap = 0;
    ms_errbuf_t eb = {{0}};
    cr_expect_neq(ms_replay_min_capacity(s, 0, "max_split_size_mb:20,roundup_power2_divisions:4",
                                         &cap, &eb),
                  MS_OK);
    b->size = keep;
  }
  ms_snapshot_free(s);
}

/* ---- what-if ---------------------------------------------------------------------------------- */

/* Fragmenting workload: sizes drift upward (the batch grows), each step frees the previous
 * step's tensors but keeps a small long-lived one between them. */
static ms_snapshot_t *fragmenting_trace(void) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB * 64, 1000000);
  ms_devptr_t keep[64];
  size_t nkeep = 0;
  for (int step = 0; step < 24; step++) {
    ms_devptr_t big[4];
    for (int i = 0; i < 4; i++)
      cr_assert_eq(ms_allocator_malloc(r.al, (size_t)(30 + step) * MiB + 4096 * (size_t)i, 0,
                                       &big[i]), MS_OK);
    if (nkeep < 64) cr_assert_eq(ms_allocator_malloc(r.al, 3 * MiB, 0, &keep[nkeep++]), MS_OK);
    for (int i = 0; i < 4; i++) cr_assert_eq(ms_allocator_free(r.al, big[i]), MS_OK);
  }
  return rec_close(&r);
}

static ms_replay_usage_t whatif(const ms_snapshot_t *s, const char *conf, size_t capacity) {
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = conf;
  o.capacity = capacity;
  ms_replay_report_t *rep = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
  ms_replay_usage_t u = rep->devices[0].replayed;
  cr_assert(u.valid);
  cr_expect(rep->devices[0].recorded.valid);
  ms_replay_report_free(rep);
  return u;
}

Test(replay, whatif_recorded_settings_match_recorded_run, .timeout = 30) {
  ms_snapshot_t *s = fragmenting_trace();
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  ms_replay_report_t *rep = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK);
  const ms_replay_device_t *d = &rep->devices[0];
  cr_expect_eq(d->replayed.peak_reserved, d->recorded.peak_reserved);
  cr_expect_eq(d->replayed.peak_allocated, d->recorded.peak_allocated);
  cr_expect_eq(d->replayed.device_mallocs, count_action(s, MS_TRACE_SEGMENT_ALLOC));
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

/* A what-if from a start state recorded without max_split_size (fuzz_consumers found it): a
 * 124 MiB segment on stream 7 in which a 12 MiB block came and went. Under max_split_size_mb:20
 * that segment's cached rest is oversize and split, a 14 MiB malloc may not take it, and when no
 * new segment fits, release_available_cached_blocks chose it: the allocator stopped on its
 * assertion (a split block cannot be released). Now it is passed over: the smallest capacity is
 * found, and a capacity just under it is an OOM, not a crash. The snapshot is the fuzzer's input
 * as the reader gives it: two segments whose blocks the file did not list. */
static ms_snapshot_t *split_oversize_snapshot(void) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  const uint64_t A = 0x7f0000000000, B = 0x7f0001400000;
  static const struct {
    uint8_t action;
    uint64_t addr, size, stream;
  } tr[] = {{MS_TRACE_ALLOC, A, 1024, 0},
            {MS_TRACE_ALLOC, A + 0x400, 512, 0},
            {MS_TRACE_ALLOC, A + 0x600, 512, 0},
            {MS_TRACE_FREE_REQUESTED, A + 0x600, 512, 0},
            {MS_TRACE_FREE_COMPLETED, A + 0x600, 512, 0},
            {MS_TRACE_ALLOC, B, 12598016, 7},
            {MS_TRACE_FREE_COMPLETED, B, 12582912, 7}};
  for (size_t k = 0; k < sizeof tr / sizeof tr[0]; k++) {
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.action = tr[k].action;
    t.addr = tr[k].addr;
    t.size = tr[k].size;
    t.time_us = (int64_t)k + 1;
    t.stack = MS_SNAP_NO_STACK;
    t.present = MS_TRACE_HAS_TIME | MS_TRACE_HAS_STREAM;
    ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
    x.stream = tr[k].stream;
    cr_assert_eq(ms__snapbuild_trace_extra(&b, &t, &x), MS_OK);
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  static const struct {
    uint64_t addr, size, stream;
    bool large;
  } sg[] = {{A, 2 * MiB, 0, false}, {B, 124 * MiB, 7, true}};
  for (size_t k = 0; k < 2; k++) {
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.address = sg[k].addr;
    g.total_size = sg[k].size;
    g.stream = sg[k].stream;
    g.is_large = sg[k].large;
    g.stack = MS_SNAP_NO_STACK;
    cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = sizeof tr / sizeof tr[0];
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

Test(replay, whatif_smaller_max_split_passes_over_split_oversize_blocks, .timeout = 30) {
  ms_snapshot_t *s = split_oversize_snapshot();
  ms_errbuf_t eb = {{0}};
  static const char conf[] = "max_split_size_mb:20,roundup_power2_divisions:4";
  size_t cap = 0;
  cr_assert_eq(ms_replay_min_capacity(s, 0, conf, &cap, &eb), MS_OK, "%s", eb.msg);
  for (int k = 0; k < 2; k++) {
    ms_replay_options_t o;
    ms_replay_options_init(&o);
    o.whatif = true;
    o.config = conf;
    o.capacity = k ? cap - 2 * MiB : cap;
    ms_replay_report_t *rep = NULL;
    cr_assert_eq(ms_replay_run(s, &o, &rep, &eb), MS_OK, "%s", eb.msg);
    const ms_replay_usage_t *u = &rep->devices[0].replayed;
    cr_assert(u->valid);
    if (k == 0) cr_expect_eq(u->ooms, 0, "at the smallest capacity, %zu", cap);
    else cr_expect_geq(u->ooms + (u->start_short > 0), 1, "under it");
    ms_replay_report_free(rep);
  }
  ms_snapshot_free(s);
}

/* Oversize blocks split for small requests: each step a 100 MiB tensor is freed, a 30 MiB one
 * kept, and 100 MiB needed again. Without max_split_size_mb the 30 MiB one splits the cached
 * 100 MiB segment and every step needs a new one; with it, oversize segments stay whole. */
static ms_snapshot_t *oversize_trace(void) {
  rec_t r;
  rec_open(&r, "", 1024 * MiB * 64, 1000000);
  ms_devptr_t x, y, z;
  for (int step = 0; step < 6; step++) {
    cr_assert_eq(ms_allocator_malloc(r.al, 100 * MiB, 0, &x), MS_OK);
    cr_assert_eq(ms_allocator_free(r.al, x), MS_OK);
    cr_assert_eq(ms_allocator_malloc(r.al, 30 * MiB, 0, &y), MS_OK);
    cr_assert_eq(ms_allocator_malloc(r.al, 100 * MiB, 0, &z), MS_OK);
    cr_assert_eq(ms_allocator_free(r.al, z), MS_OK);
  }
  return rec_close(&r);
}

Test(replay, whatif_max_split_size_lowers_fragmentation, .timeout = 30) {
  ms_snapshot_t *s = oversize_trace();
  ms_replay_usage_t base = whatif(s, "", 0), mss = whatif(s, "max_split_size_mb:64", 0);
  cr_expect_lt(mss.peak_reserved, base.peak_reserved, "%" PRIu64 " vs %" PRIu64,
               mss.peak_reserved, base.peak_reserved);
  cr_expect_eq(mss.peak_allocated, base.peak_allocated);
  ms_snapshot_free(s);
}

Test(replay, whatif_capacity_ooms_are_reported, .timeout = 30) {
  ms_snapshot_t *s = fragmenting_trace();
  ms_replay_usage_t u = whatif(s, "", 200 * MiB);
  cr_expect_gt(u.ooms, 0);
  cr_expect_geq(u.first_oom_index, 0);
  cr_expect(strstr(u.oom_message, "out of memory") != NULL, "%s", u.oom_message);
  cr_expect_gt(u.alloc_retries, 0);
  ms_snapshot_free(s);
}

Test(replay, min_capacity_is_tight, .timeout = 60) {
  ms_snapshot_t *s = fragmenting_trace();
  size_t cap = 0;
  ms_errbuf_t eb;
  cr_assert_eq(ms_replay_min_capacity(s, 0, "", &cap, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(cap % (2 * MiB), 0);
  cr_expect_eq(whatif(s, "", cap).ooms, 0, "OOM at the minimum %zu", cap);
  cr_expect_gt(whatif(s, "", cap - 2 * MiB).ooms, 0, "no OOM below the minimum %zu", cap);
  ms_snapshot_free(s);
}

Test(replay, bad_config_is_an_error, .timeout = 10) {
  ms_snapshot_t *s = fragmenting_trace();
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = true;
  o.config = "max_split_size_mb:1";
  ms_replay_report_t *rep = (ms_replay_report_t *)0x1;
  ms_errbuf_t eb;
  cr_expect_eq(ms_replay_run(s, &o, &rep, &eb), MS_ECONFIG);
  cr_expect_eq(rep, (ms_replay_report_t *)0x1, "out-parameter touched on failure");
  cr_expect(strstr(eb.msg, "max_split_size_mb") != NULL, "%s", eb.msg);
  ms_snapshot_free(s);
}

/* ---- the command line ---------------------------------------------------------------------------- */

static int run_cli(const char *args, char *out, size_t cap) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || access(bin, X_OK) != 0) cr_skip_test("SKIP: MEMSNAP_BIN not set (run through ctest)");
  char cmd[8192];
  snprintf(cmd, sizeof cmd, "%s replay %s 2>&1", bin, args);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  size_t n = fread(out, 1, cap - 1, p);
  out[n] = 0;
  int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(replay, cli_check_exit_codes_and_json, .timeout = 60) {
  char path[4096], args[8192];
  static char out[1 << 16];
  ms_snapshot_free(load_fixture("a0kuma_adamw_small"));
  snprintf(path, sizeof path, "%s/a0kuma_adamw_small.pickle", fixtures_dir());
  snprintf(args, sizeof args, "'%s' --check", path);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "device 0: PASS  18 allocs replayed (35 trace entries); start: empty\n"),
            "%s", out);
  snprintf(args, sizeof args, "'%s' --check --json", path);
  cr_expect_eq(run_cli(args, out, sizeof out), 0);
  cr_expect(strstr(out, "\"pass\": true") && strstr(out, "\"verdict\": \"PASS\""), "%s", out);
  snprintf(path, sizeof path, "%s/jogregoire_diffusion_tiny.pickle", fixtures_dir());
  snprintf(args, sizeof args, "'%s' --check", path);
  cr_expect_eq(run_cli(args, out, sizeof out), 1, "%s", out);
  cr_expect(strstr(out, "not replayable: no alloc/free history"), "%s", out);
  cr_expect_eq(run_cli("x.pickle", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("x.pickle --check --config a", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("x.pickle --sweep 'nokey'", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("x.pickle --config 'max_split_size_mb:1'", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("x.pickle --check --capacity 12Q", out, sizeof out), 2, "%s", out);
  cr_expect_eq(run_cli("/nonexistent.pickle --check", out, sizeof out), 1, "%s", out);
}

Test(replay, cli_sweep_table, .timeout = 60) {
  char path[4096], args[8192];
  static char out[1 << 16];
  ms_snapshot_free(load_fixture("cranberrii_ftcourse"));
  snprintf(path, sizeof path, "%s/cranberrii_ftcourse.pickle", fixtures_dir());
  snprintf(args, sizeof args, "'%s' --sweep 'max_split_size_mb=64,256;garbage_collection_threshold=0.5'", path);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "(recorded: PyTorch)"), "%s", out);
  cr_expect(strstr(out, "max_split_size_mb:64,garbage_collection_threshold:0.5"), "%s", out);
  cr_expect(strstr(out, "max_split_size_mb:256,garbage_collection_threshold:0.5"), "%s", out);
  snprintf(args, sizeof args, "'%s' --sweep 'max_split_size_mb=64,256' --json", path);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  cr_expect(strstr(out, "\"mode\": \"whatif\"") && strstr(out, "\"peak_reserved\""), "%s", out);
}

/* ---- expandable segments ---------------------------------------------------------------------- */

Test(replay, synthetic_expandable_segments, .timeout = 60) {
  rec_t r;
  rec_open(&r, "expandable_segments:True", 1024 * MiB * 64, 1000000);
  wl_t w = {.ops = 4000, .streams = 2, .empty_cache = true, .max_size = 48 * MiB, .seed = 7};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  cr_expect_gt(count_action(s, MS_TRACE_SEGMENT_MAP), 10);
  cr_expect_gt(count_action(s, MS_TRACE_SEGMENT_UNMAP), 5);
  cr_expect_eq(count_action(s, MS_TRACE_SEGMENT_ALLOC), 0);
  expect_pass(s, "expandable segments", false);
  ms_snapshot_free(s);
}

Test(replay, synthetic_expandable_oom_with_capacity, .timeout = 60) {
  rec_t r;
  rec_open(&r, "expandable_segments:True", 300 * MiB, 1000000);
  wl_t w = {.ops = 4000, .streams = 1, .max_size = 64 * MiB, .seed = 8};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  cr_expect_gt(count_action(s, MS_TRACE_OOM), 0);
  cr_expect_gt(count_action(s, MS_TRACE_SEGMENT_UNMAP), 0);
  expect_pass(s, "expandable segments, OOM retries", false);
  ms_replay_report_t *rep = check(s, 300 * MiB);
  cr_expect_eq(rep->devices[0].verdict, MS_REPLAY_PASS, "capacity 300 MiB: %s",
               rep->devices[0].reason);
  ms_replay_report_free(rep);
  ms_snapshot_free(s);
}

Test(replay, whatif_expandable_lowers_peak_reserved, .timeout = 30) {
  ms_snapshot_t *s = fragmenting_trace();
  ms_replay_usage_t off = whatif(s, "expandable_segments:False", 0);
  ms_replay_usage_t on = whatif(s, "expandable_segments:True", 0);
  cr_expect_lt(on.peak_reserved, off.peak_reserved, "%" PRIu64 " vs %" PRIu64, on.peak_reserved,
               off.peak_reserved);
  /* Expandable blocks split at 512 B, so allocated (rounded block) bytes can only shrink. */
  cr_expect_leq(on.peak_allocated, off.peak_allocated);
  ms_snapshot_free(s);
}

/* Allocator-level rules of expandable segments (docs/pytorch-allocator.md, "Expandable
 * segments"). */
typedef struct es_fix_s {
  ms_backend_t *be;
  ms_allocator_t *al;
} es_fix_t;

static void es_open(es_fix_t *f, size_t capacity) {
  ms_sim_config_t sc = {.capacity = capacity};
  cr_assert_eq(ms_backend_sim_create(&sc, &f->be), MS_OK);
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb;
  cr_assert_eq(ms_alloc_config_parse(&c, "expandable_segments:True", &eb), MS_OK);
  ms_allocator_config_t ac = {.backend = f->be, .alloc = &c};
  cr_assert_eq(ms_allocator_create(&ac, &f->al, &eb), MS_OK, "%s", eb.msg);
}

static void es_check(es_fix_t *f) {
  ms_errbuf_t eb;
  cr_assert_eq(ms__allocator_check(f->al, &eb), MS_OK, "%s", eb.msg);
}

static int64_t es_stat(es_fix_t *f, const char *name) {
  ms_stats_t st = MS_STATS_INIT;
  cr_assert_eq(ms_allocator_get_stats(f->al, &st), MS_OK);
  int64_t v = 0;
  cr_assert_eq(ms_stats_get(&st, name, &v), MS_OK, "%s", name);
  return v;
}

Test(expandable, pages_mapped_on_demand_and_stats, .timeout = 10) {
  es_fix_t f;
  es_open(&f, 1024 * MiB);
  ms_devptr_t a, b, c;
  cr_assert_eq(ms_allocator_malloc(f.al, 1000, 0, &a), MS_OK);          /* small: one 2 MiB page */
  cr_assert_eq(ms_allocator_malloc(f.al, 30 * MiB, 0, &b), MS_OK);      /* large: two 20 MiB pages */
  cr_assert_eq(ms_allocator_malloc(f.al, 5 * MiB, 0, &c), MS_OK);       /* fits the 10 MiB left */
  cr_expect_eq(c, b + 30 * MiB, "split at 512 B granularity, not 1 MiB");
  cr_expect_eq(es_stat(&f, "reserved_bytes.all.current"), (int64_t)(2 * MiB + 40 * MiB));
  cr_expect_eq(es_stat(&f, "segment.all.current"), 0);
  cr_expect_eq(es_stat(&f, "num_device_alloc"), 2);
  cr_expect_eq(es_stat(&f, "inactive_split.all.current"), 0);
  ms_sim_counters_t sc;
  cr_assert_eq(ms_sim_get_counters(f.be, 0, &sc), MS_OK);
  cr_expect_eq(sc.va_reserves, 2);
  cr_expect_eq(sc.mem_maps, 3, "one map (one physical allocation) per page, as PyTorch");
  cr_expect_eq(sc.used_bytes, 42 * MiB);
  es_check(&f);
  /* Growing: 25 MiB more needs one page, mapped right after the first two (one segment). */
  ms_devptr_t d;
  cr_assert_eq(ms_allocator_malloc(f.al, 25 * MiB, 0, &d), MS_OK);
  cr_expect_eq(d, c + 5 * MiB);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_snapshot(&f.al, 1, &s, &eb), MS_OK);
  size_t large = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    cr_expect(s->segments[i].is_expandable);
    if (s->segments[i].is_large) {
      large++;
      cr_expect_eq(s->segments[i].total_size, 60 * MiB);
    }
  }
  cr_expect_eq(large, 1);
  ms_snapshot_free(s);
  es_check(&f);
  /* Release: whole free pages are unmapped; a range left empty is returned. */
  cr_assert_eq(ms_allocator_free(f.al, b), MS_OK);
  cr_assert_eq(ms_allocator_free(f.al, c), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(f.al), MS_OK);
  es_check(&f);
  cr_expect_eq(es_stat(&f, "reserved_bytes.large_pool.current"), (int64_t)(40 * MiB),
               "pages under the live 25 MiB block stay mapped");
  cr_assert_eq(ms_allocator_free(f.al, d), MS_OK);
  cr_assert_eq(ms_allocator_free(f.al, a), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(f.al), MS_OK);
  es_check(&f);
  cr_expect_eq(es_stat(&f, "reserved_bytes.all.current"), 0);
  cr_assert_eq(ms_sim_get_counters(f.be, 0, &sc), MS_OK);
  cr_expect_eq(sc.used_bytes, 0);
  cr_expect_eq(sc.va_releases, 2);
  ms_allocator_destroy(f.al);
  ms_backend_destroy(f.be);
}

Test(expandable, oom_when_pages_cannot_be_mapped, .timeout = 10) {
  es_fix_t f;
  es_open(&f, 60 * MiB);
  ms_devptr_t a, b;
  cr_assert_eq(ms_allocator_malloc(f.al, 50 * MiB, 0, &a), MS_OK); /* 3 pages = 60 MiB */
  cr_expect_eq(ms_allocator_malloc(f.al, 20 * MiB, 0, &b), MS_EOOM);
  char msg[1024];
  cr_expect_gt(ms_allocator_last_oom_message(f.al, msg, sizeof msg), 0);
  cr_expect_eq(es_stat(&f, "num_ooms"), 1);
  es_check(&f);
  cr_assert_eq(ms_allocator_free(f.al, a), MS_OK);
  cr_assert_eq(ms_allocator_malloc(f.al, 20 * MiB, 0, &b), MS_OK);
  cr_expect_eq(b, a, "the cached pages are reused from the start of the range");
  es_check(&f);
  ms_allocator_destroy(f.al);
  ms_backend_destroy(f.be);
}

static bool es_stream7(void *arg, ms_stream_t s) {
  (void)arg;
  return s == 7;
}

/* Private pools (CUDA graphs) use expandable segments too, as PyTorch's do; the pool is freed
 * once its pages are unmapped and its ranges returned. */
Test(expandable, private_pools_map_pages_too, .timeout = 10) {
  es_fix_t f;
  es_open(&f, 1024 * MiB);
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(f.al, id, es_stream7, NULL), MS_OK);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(f.al, 30 * MiB, 7, &p), MS_OK);
  cr_assert_eq(ms_allocator_malloc(f.al, 1000, 7, &q), MS_OK);
  ms_sim_counters_t sc;
  cr_assert_eq(ms_sim_get_counters(f.be, 0, &sc), MS_OK);
  cr_expect_eq(sc.mallocs, 0, "no device segment: pages");
  cr_expect_eq(sc.mem_maps, 3);
  cr_expect_eq(es_stat(&f, "reserved_bytes.all.current"), (int64_t)(42 * MiB));
  cr_expect_eq(es_stat(&f, "segment.all.current"), 0);
  es_check(&f);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_snapshot(&f.al, 1, &s, &eb), MS_OK);
  cr_assert_eq(s->nsegments, 2);
  for (size_t i = 0; i < s->nsegments; i++) {
    cr_expect(s->segments[i].is_expandable);
    cr_expect_eq(s->segments[i].pool_id[0], id.first, "reported in the private pool");
    cr_expect_eq(s->segments[i].pool_id[1], id.second);
  }
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(f.al, p), MS_OK);
  cr_assert_eq(ms_allocator_free(f.al, q), MS_OK);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(f.al, id), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(f.al, id), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(f.al), MS_OK);
  cr_assert_eq(ms_sim_get_counters(f.be, 0, &sc), MS_OK);
  cr_expect_eq(sc.used_bytes, 0);
  cr_expect_eq(sc.va_releases, sc.va_reserves, "every range returned");
  cr_expect_eq(es_stat(&f, "reserved_bytes.all.current"), 0);
  es_check(&f);
  ms_allocator_destroy(f.al);
  ms_backend_destroy(f.be);
}

/* ---- hostile traces ----------------------------------------------------------------------------- */

/* Every kind of damage a file can carry (wrong actions, addresses, sizes, streams; segments and
 * blocks that contradict the trace) must give a verdict, never a crash, a hang or an error
 * other than the documented ones. Each damage is undone before the next. */
static void damage_run(ms_snapshot_t *s, uint64_t seed, int rounds) {
  uint64_t x = seed;
  for (int round = 0; round < rounds; round++) {
    uint64_t k = rng_next(&x);
    int what = (int)(k % 6);
    size_t i = s->ntrace ? (size_t)(rng_next(&x) % s->ntrace) : 0;
    size_t j = s->nblocks ? (size_t)(rng_next(&x) % s->nblocks) : 0;
    size_t g = s->nsegments ? (size_t)(rng_next(&x) % s->nsegments) : 0;
    uint64_t r = rng_next(&x);
    static const uint64_t sizes[] = {0, 1, 511, 512, 1048576, (uint64_t)1 << 40, (uint64_t)1 << 62,
                                     UINT64_MAX};
    static const ms_snap_trace_extra_t on_stream[3] = {{NULL, "", "", {0, 0}, "", 0},
                                                       {NULL, "", "", {0, 0}, "", 1},
                                                       {NULL, "", "", {0, 0}, "", 2}};
    ms_snap_trace_t saved_t = s->ntrace ? s->trace[i] : (ms_snap_trace_t){0};
    ms_snap_block_t saved_b = s->nblocks ? s->blocks[j] : (ms_snap_block_t){0};
    ms_snap_segment_t saved_g = s->nsegments ? s->segments[g] : (ms_snap_segment_t){0};
    switch (what) {
    case 0: if (s->ntrace) s->trace[i].action = (ms_trace_action)(r % MS_TRACE_ACTION_COUNT); break;
    case 1: if (s->ntrace) s->trace[i].addr += (r % 2 ? 512 : (uint64_t)-512) * (r % 7); break;
    case 2: if (s->ntrace) s->trace[i].size = sizes[r % 8]; break;
    case 3:
      if (s->ntrace) s->trace[i].extra = &on_stream[r % 3];
      break; /* its other extras go */
    case 4: if (s->nblocks) s->blocks[j].size = sizes[r % 8]; break;
    case 5: if (s->nsegments) s->segments[g].address += (r % 2 ? 1 : -1) * (uint64_t)(2 * MiB); break;
    }
    ms_replay_options_t o;
    ms_replay_options_init(&o);
    o.whatif = round % 8 == 0;
    ms_replay_report_t *rep = NULL;
    ms_errbuf_t eb;
    int rc = ms_replay_run(s, &o, &rep, &eb);
    cr_assert_eq(rc, MS_OK, "round %d (damage %d): %s", round, what, eb.msg);
    for (size_t d = 0; d < rep->ndevices; d++)
      cr_assert(rep->devices[d].verdict <= MS_REPLAY_UNREPLAYABLE);
    ms_replay_report_free(rep);
    if (s->ntrace) s->trace[i] = saved_t;
    if (s->nblocks) s->blocks[j] = saved_b;
    if (s->nsegments) s->segments[g] = saved_g;
  }
}

Test(replay, hostile_fixture_damage, .timeout = 120) {
  ms_snapshot_t *s = load_fixture("a0kuma_adamw_small");
  damage_run(s, 11, 400);
  ms_snapshot_free(s);
}

Test(replay, hostile_synthetic_damage, .timeout = 120) {
  rec_t r;
  rec_open(&r, "expandable_segments:True", 200 * MiB, 1000000);
  wl_t w = {.ops = 300, .streams = 2, .empty_cache = true, .max_size = 40 * MiB, .seed = 12};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  damage_run(s, 13, 300);
  ms_snapshot_free(s);
}

/* record_stream frees on a full device under max_split_size_mb: the classification of each run of
 * free_completed entries (process_events's or the OOM path's synchronization) reads the entries
 * around it, the pending set and the device's total; damaged, they must still give a verdict. */
Test(replay, hostile_record_stream_full_device_damage, .timeout = 120) {
  rec_t r;
  rec_open(&r, "max_split_size_mb:40", 200 * MiB, 1000000);
  wl_t w = {.ops = 400, .streams = 4, .record_stream = true, .max_size = 48 * MiB, .seed = 14};
  workload(&r, &w);
  ms_snapshot_t *s = rec_close(&r);
  damage_run(s, 15, 300);
  ms_snapshot_free(s);
}

Test(replay, hostile_truncated_traces, .timeout = 120) {
  /* Every prefix of a trace (a ring buffer cut anywhere at the end) gives a verdict. */
  ms_snapshot_t *s = load_fixture("a0kuma_adamw_small");
  size_t n = s->devices[0].ntrace;
  for (size_t k = 0; k <= n; k++) {
    s->devices[0].ntrace = (uint32_t)k;
    ms_replay_report_t *rep = check(s, 0);
    cr_assert(rep->devices[0].verdict <= MS_REPLAY_UNREPLAYABLE);
    ms_replay_report_free(rep);
    /* and every suffix (a ring buffer that dropped the beginning) */
    s->devices[0].ntrace = (uint32_t)(n - k);
    s->devices[0].first_trace = (uint32_t)k;
    rep = check(s, 0);
    cr_assert(rep->devices[0].verdict <= MS_REPLAY_UNREPLAYABLE);
    ms_replay_report_free(rep);
    s->devices[0].first_trace = 0;
  }
  s->devices[0].ntrace = (uint32_t)n;
  ms_snapshot_free(s);
}

/* ---- the values of --capacity and --sweep (lib/replay/values.c; issue #16 items 23, 25) -------- */

Test(replay, parse_capacity_exact_values_and_errors) {
  static const struct {
    const char *s;
    uint64_t v;
  } good[] = {{"16", 16},
              {"1.5G", 3ull << 29},
              {"24GiB", 24ull << 30},
              {"8000M", 8000ull << 20},
              {"4k", 4096},
              {"2TB", 2ull << 40},
              {"123b", 123},
              {"0.5K", 512},
              {"9007199254740993", 9007199254740993ull}, /* 2^53 + 1: exact, not rounded */
              {"18446744073709551615", 18446744073709551615ull},
              {"16777215T", 16777215ull << 40}};
  for (size_t i = 0; i < sizeof good / sizeof *good; i++) {
    size_t v = 0;
    ms_errbuf_t eb = {{0}};
    cr_expect_eq(ms_replay_parse_capacity(good[i].s, &v, &eb), MS_OK, "%s: %s", good[i].s, eb.msg);
    cr_expect_eq((uint64_t)v, good[i].v, "%s: %zu", good[i].s, v);
  }
  static const struct {
    const char *s;
    int rc;
    const char *msg;
  } bad[] = {
      {"0x10", MS_EINVAL, "expected digits with an optional K, M, G or T at offset 1"},
      {"1e3", MS_EINVAL, "expected digits with an optional K, M, G or T at offset 1"},
      {"inf", MS_EINVAL, "expected digits with an optional K, M, G or T at offset 0"},
      {"1.", MS_EINVAL, "expected a digit after the point at offset 2"},
      {"16Q", MS_EINVAL, "expected digits with an optional K, M, G or T at offset 2"},
      {"1 G", MS_EINVAL, "expected digits with an optional K, M, G or T at offset 1"},
      {"", MS_EINVAL, "expected digits with an optional K, M, G or T at offset 0"},
      {"0", MS_EINVAL, "0 is less than one byte"},
      /* a fraction of a byte was 0 bytes, which --capacity takes as "unlimited" */
      {"0.1", MS_EINVAL, "0.1 is less than one byte"},
      {"18446744073709551616", MS_ELIMIT, "18446744073709551616 is 2^64 bytes or more"},
      {"16777216T", MS_ELIMIT, "16777216T is 2^64 bytes or more"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    size_t v = 77;
    ms_errbuf_t eb = {{0}};
    cr_expect_eq(ms_replay_parse_capacity(bad[i].s, &v, &eb), bad[i].rc, "%s", bad[i].s);
    cr_expect_str_eq(eb.msg, bad[i].msg);
    cr_expect_eq(v, 77, "%s: out-parameter set on failure", bad[i].s);
  }
}

Test(replay, sweep_parse_combinations_and_errors) {
  ms_replay_sweep_t sw = {0, NULL};
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_replay_sweep_parse(" a=1,2; b=[x:1,>:2],y ;", &sw, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(sw.n, 4);
  static const char *const want[] = {"a:1,b:[x:1,>:2]", "a:1,b:y ", "a:2,b:[x:1,>:2]", "a:2,b:y "};
  for (size_t i = 0; i < 4; i++) cr_expect_str_eq(sw.configs[i], want[i]);
  ms_replay_sweep_release(&sw);
  cr_expect(sw.n == 0 && sw.configs == NULL);
  /* a combination is as long as it needs: nothing is cut at 255 bytes */
  char spec[1100], key[300];
  memset(key, 'k', 299);
  key[299] = 0;
  snprintf(spec, sizeof spec, "%s=1,2", key);
  cr_assert_eq(ms_replay_sweep_parse(spec, &sw, &eb), MS_OK, "%s", eb.msg);
  cr_expect_eq(strlen(sw.configs[1]), 301);
  ms_replay_sweep_release(&sw);
  static const struct {
    const char *s;
    int rc;
    const char *msg;
  } bad[] = {
      {"nokey", MS_EINVAL, "expected 'key=v1,v2;key2=v3,...'"},
      {"=1", MS_EINVAL, "expected 'key=v1,v2;key2=v3,...'"},
      {"a=1,,2", MS_EINVAL, "expected 'key=v1,v2;key2=v3,...'"},
      {" ; ", MS_EINVAL, "expected 'key=v1,v2;key2=v3,...'"},
      {"a=1;a=2", MS_EINVAL, "key 'a' appears twice (list its values once: a=a,b)"},
      {"a=[1;b=2", MS_EINVAL, "unbalanced brackets"},
      {"a=1],2", MS_EINVAL, "unbalanced brackets"},
      {"a=1;b=1;c=1;d=1;e=1;f=1;g=1;h=1;i=1", MS_ELIMIT, "more than 8 keys"},
      {"a=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33",
       MS_ELIMIT, "more than 32 values for 'a'"},
      {"a=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17;b=1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16",
       MS_ELIMIT, "272 combinations (at most 256)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
    ms_replay_sweep_t s = {5, NULL};
    cr_expect_eq(ms_replay_sweep_parse(bad[i].s, &s, &eb), bad[i].rc, "%s", bad[i].s);
    cr_expect_str_eq(eb.msg, bad[i].msg);
    cr_expect(s.n == 5 && s.configs == NULL, "%s: out-parameter set on failure", bad[i].s);
  }
  char big[1100];
  memset(big, 'a', 1024);
  big[1024] = 0;
  cr_expect_eq(ms_replay_sweep_parse(big, &sw, &eb), MS_ELIMIT);
  cr_expect_str_eq(eb.msg, "1024 bytes (at most 1023)");
}

/* --config is replayed whole: it was cut at 255 bytes, and the cut string refused or replayed */
Test(replay, cli_long_config_not_truncated, .timeout = 60) {
  char path[4096], args[8192], conf[400] = "";
  static char out[1 << 16];
  ms_snapshot_free(load_fixture("a0kuma_adamw_small"));
  snprintf(path, sizeof path, "%s/a0kuma_adamw_small.pickle", fixtures_dir());
  for (int i = 0; i < 10; i++) strcat(conf, "expandable_segments:False,");
  strcat(conf, "expandable_segments:True");
  snprintf(args, sizeof args, "'%s' --config '%s'", path, conf);
  cr_expect_eq(run_cli(args, out, sizeof out), 0, "%s", out);
  char want[512];
  snprintf(want, sizeof want, "recorded (PyTorch)   %s\n", conf);
  cr_expect(strstr(out, want) != NULL, "%s", out);
}
