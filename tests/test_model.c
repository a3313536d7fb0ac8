/* SPDX-License-Identifier: MIT
 * Model-based test of the caching allocator (issue #2, §6): random operations (malloc of
 * log-uniform sizes on several streams, free, record_stream, completion of stream work,
 * empty_cache, begin/end of private-pool routing and pool release, injected device failures)
 * over several configurations, at least 100,000 operations in all. After EVERY operation:
 *  - ms__allocator_check: blocks tile each segment exactly, no two free neighbours stay unmerged,
 *    no block is in two places (free set / pointer map / pending), free sets are ordered, and every
 *    statistic's current value equals its recomputation from the state;
 *  - the test's own model: the live allocations (address, size) never overlap, each lies inside
 *    the device's window, allocation.all.current and the sum of requested sizes match, and an
 *    OOM leaves the out-parameter untouched with a message. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "memsnap/allocator.h"

#define MiB ((size_t)1 << 20)
#define MAX_LIVE 384
#define NSTREAMS 3

typedef struct live_s {
  ms_devptr_t ptr;
  size_t size;
  ms_stream_t stream;
} live_t;

typedef struct model_s {
  ms_backend_t *b;
  ms_allocator_t *a;
  ms_stream_t streams[NSTREAMS];
  live_t live[MAX_LIVE];
  size_t nlive;
  uint64_t rng;
  ms_pool_id_t routing; /* (0,0) when no routing */
  ms_stream_t routed_stream;
  ms_pool_id_t to_release[64];
  size_t nrelease;
  uint64_t ooms, mallocs;
} model_t;

static uint64_t rnd(model_t *m) {
  m->rng ^= m->rng << 13;
  m->rng ^= m->rng >> 7;
  m->rng ^= m->rng << 17;
  return m->rng;
}

/* log-uniform in [1, 64 MiB], plus exact boundary sizes now and then */
static size_t rnd_size(model_t *m) {
  static const size_t edges[] = {512, 513, 1048576, 1048577, 10485760, 10485761, 20971520};
  if (rnd(m) % 16 == 0) return edges[rnd(m) % (sizeof edges / sizeof edges[0])];
  double u = (double)(rnd(m) >> 11) / 9007199254740992.0;
  size_t s = (size_t)__builtin_exp(u * __builtin_log(64.0 * (double)MiB));
  return s ? s : 1;
}

static bool filter_stream(void *arg, ms_stream_t s) { return s == *(ms_stream_t *)arg; }

static void model_check(model_t *m, const char *op, int step) {
  ms_errbuf_t eb;
  int r = ms__allocator_check(m->a, &eb);
  cr_assert_eq(r, MS_OK, "after %s (step %d): %s", op, step, eb.msg);
  ms_stats_t st = MS_STATS_INIT;
  cr_assert_eq(ms_allocator_get_stats(m->a, &st), MS_OK);
  cr_assert_eq(st.allocation[MS_STAT_ALL].current, (int64_t)m->nlive, "after %s (step %d)", op,
               step);
  int64_t sum = 0;
  for (size_t i = 0; i < m->nlive; i++) sum += (int64_t)m->live[i].size;
  cr_assert_geq(st.requested_bytes[MS_STAT_ALL].current, sum, "after %s (step %d)", op, step);
  cr_assert_geq(st.allocated_bytes[MS_STAT_ALL].current, sum);
  cr_assert_geq(st.reserved_bytes[MS_STAT_ALL].current, st.active_bytes[MS_STAT_ALL].current);
  cr_assert_geq(st.active_bytes[MS_STAT_ALL].current, st.allocated_bytes[MS_STAT_ALL].current);
}

static void model_malloc(model_t *m, int step) {
  if (m->nlive == MAX_LIVE) return;
  size_t size = rnd_size(m);
  ms_stream_t s = m->streams[rnd(m) % NSTREAMS];
  ms_devptr_t p = 0xdead;
  m->mallocs++;
  int r = ms_allocator_malloc(m->a, size, s, &p);
  if (r == MS_EOOM) {
    m->ooms++;
    cr_assert_eq(p, 0xdead, "out-param untouched on OOM");
    char msg[64];
    cr_assert_gt(ms_allocator_last_oom_message(m->a, msg, sizeof msg), 0);
    return;
  }
  cr_assert_eq(r, MS_OK, "malloc(%zu) step %d: %s", size, step, ms_err_name(r));
  cr_assert_eq(p % 512, 0, "addresses are 512-byte aligned");
  cr_assert_geq(p, MS_SIM_BASE_ADDRESS);
  cr_assert_lt(p, MS_SIM_BASE_ADDRESS + MS_SIM_DEVICE_STRIDE);
  for (size_t i = 0; i < m->nlive; i++) {
    const live_t *l = &m->live[i];
    cr_assert(p + size <= l->ptr || l->ptr + l->size <= p,
              "step %d: [%#zx,+%zu) overlaps live [%#zx,+%zu)", step, (size_t)p, size,
              (size_t)l->ptr, l->size);
  }
  m->live[m->nlive++] = (live_t){p, size, s};
}

static void model_free(model_t *m) {
  if (!m->nlive) return;
  size_t i = rnd(m) % m->nlive;
  cr_assert_eq(ms_allocator_free(m->a, m->live[i].ptr), MS_OK);
  m->live[i] = m->live[--m->nlive];
}

static void model_step(model_t *m, int step) {
  unsigned op = (unsigned)(rnd(m) % 100);
  const char *name;
  if (op < 45) {
    name = "malloc";
    model_malloc(m, step);
  } else if (op < 85) {
    name = "free";
    model_free(m);
  } else if (op < 91) {
    name = "record_stream";
    if (m->nlive) {
      live_t *l = &m->live[rnd(m) % m->nlive];
      cr_assert_eq(ms_allocator_record_stream(m->a, l->ptr, m->streams[rnd(m) % NSTREAMS]), MS_OK);
    }
  } else if (op < 95) {
    name = "complete";
    ms_sim_stream_complete(m->b, 0, m->streams[rnd(m) % NSTREAMS]);
  } else if (op < 96) {
    name = "empty_cache";
    cr_assert_eq(ms_allocator_empty_cache(m->a), MS_OK);
  } else if (op < 98) {
    name = "pool";
    if (m->routing.first == 0 && m->routing.second == 0) {
      m->routing = ms_pool_id_new(rnd(m) & 1);
      m->routed_stream = m->streams[rnd(m) % NSTREAMS];
      cr_assert_eq(ms_allocator_begin_allocate_to_pool(m->a, m->routing, filter_stream,
                                                       &m->routed_stream),
                   MS_OK);
    } else {
      cr_assert_eq(ms_allocator_end_allocate_to_pool(m->a, m->routing), MS_OK);
      if (m->nrelease < 64) m->to_release[m->nrelease++] = m->routing;
      else cr_assert_eq(ms_allocator_release_pool(m->a, m->routing), MS_OK);
      m->routing = (ms_pool_id_t){0, 0};
    }
  } else if (op < 99) {
    name = "release_pool";
    if (m->nrelease) {
      size_t i = rnd(m) % m->nrelease;
      cr_assert_eq(ms_allocator_release_pool(m->a, m->to_release[i]), MS_OK);
      m->to_release[i] = m->to_release[--m->nrelease];
    }
  } else {
    name = "fail_next_device_malloc";
    ms_sim_fail_nth_malloc(m->b, 0, 1 + rnd(m) % 3);
  }
  model_check(m, name, step);
}

static void run_model(const char *conf, double fraction, size_t capacity, int steps,
                      uint64_t seed, bool expect_ooms) {
  model_t *m = calloc(1, sizeof *m);
  cr_assert_not_null(m);
  ms_sim_config_t sc = {.capacity = capacity};
  cr_assert_eq(ms_backend_sim_create(&sc, &m->b), MS_OK);
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb;
  cr_assert_eq(ms_alloc_config_parse(&c, conf, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_config_t ac = {.backend = m->b, .alloc = &c};
  cr_assert_eq(ms_allocator_create(&ac, &m->a, &eb), MS_OK, "%s", eb.msg);
  if (fraction < 1.0) cr_assert_eq(ms_allocator_set_memory_fraction(m->a, fraction, &eb), MS_OK);
  const ms_backend_ops_t *o = ms_backend_ops(m->b);
  m->streams[0] = 0;
  for (int i = 1; i < NSTREAMS; i++)
    cr_assert_eq(o->stream_create(o->ctx, 0, &m->streams[i]), MS_OK);
  m->rng = seed;
  for (int i = 0; i < steps; i++) model_step(m, i);
  /* wind down: everything freed, routing ended, pools released, cache emptied -> device empty */
  while (m->nlive) model_free(m);
  if (m->routing.first || m->routing.second) {
    cr_assert_eq(ms_allocator_end_allocate_to_pool(m->a, m->routing), MS_OK);
    cr_assert_eq(ms_allocator_release_pool(m->a, m->routing), MS_OK);
  }
  for (size_t i = 0; i < m->nrelease; i++)
    cr_assert_eq(ms_allocator_release_pool(m->a, m->to_release[i]), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(m->a), MS_OK);
  model_check(m, "wind down", steps);
  ms_stats_t st = MS_STATS_INIT;
  cr_assert_eq(ms_allocator_get_stats(m->a, &st), MS_OK);
  ms__alloc_counts_t cn;
  ms__allocator_counts(m->a, &cn);
  cr_assert_eq(st.reserved_bytes[MS_STAT_ALL].current, 0,
               "every segment returned: %zu segments, %zu blocks, %zu free, %zu pending, %zu pools",
               cn.segments, cn.blocks, cn.free_blocks, cn.pending_blocks, cn.private_pools);
  cr_assert_eq(st.active[MS_STAT_ALL].current, 0);
  cr_assert_gt(st.num_device_alloc, 10);
  ms_sim_counters_t sc2;
  cr_assert_eq(ms_sim_get_counters(m->b, 0, &sc2), MS_OK);
  cr_assert_eq(sc2.live_allocations, 0);
  cr_assert_eq(cn.private_pools, 0, "released pools disappear once empty");
  cr_assert_gt(m->mallocs, (uint64_t)steps / 3);
  if (expect_ooms) cr_assert_gt(m->ooms, 0, "the OOM chain was exercised");
  cr_assert_eq((int64_t)m->ooms, st.num_ooms);
  ms_allocator_destroy(m->a);
  ms_backend_destroy(m->b);
  free(m);
}

/* 5 configurations x 24,000 operations = 120,000 operations, each followed by the full check. */
Test(model, defaults, .timeout = 120) {
  run_model("", 1.0, (size_t)4 << 30, 24000, 0x9e3779b97f4a7c15ULL, false);
}
Test(model, max_split_size, .timeout = 120) {
  run_model("max_split_size_mb:40,max_non_split_rounding_mb:30", 1.0, (size_t)3 << 30, 24000,
            0x1234567887654321ULL, false);
}
Test(model, roundup_divisions, .timeout = 120) {
  run_model("roundup_power2_divisions:[1:2,8:4,>:8]", 1.0, (size_t)4 << 30, 24000,
            0xfeedfacecafebeefULL, false);
}
Test(model, gc_and_fraction, .timeout = 120) {
  run_model("garbage_collection_threshold:0.6", 0.8, (size_t)3 << 30, 24000, 0x0badc0de0badc0deULL,
            true);
}
Test(model, tight_device_and_large_segments, .timeout = 120) {
  run_model("large_segment_size_mb:12,max_split_size_mb:24", 1.0, (size_t)1 << 30, 24000,
            0x5555aaaa5555aaaaULL, true);
}
