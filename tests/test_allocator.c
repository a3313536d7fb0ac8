/* SPDX-License-Identifier: MIT
 * Tests for the caching allocator on the sim backend, case by case from
 * docs/pytorch-allocator.md: rounding and segment sizes ("Sizes and rounding"), best fit per
 * stream and the oversize rules ("Best fit and the oversize rules"), splitting and merging,
 * record_stream deferral ("Freeing and events"), release_available_cached_blocks, the OOM chain's
 * order through the sim call log ("Malloc and its fallback chain"), the OOM message and
 * observers, memory fraction and GC ("The OOM path and releases"), private pools ("Private pools
 * and CUDA graphs"), history hooks ("Trace entries") and the snapshot walk ("Snapshot fields").
 * Every test ends with the invariant checker and a leak check of the backend. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "memsnap/allocator.h"
#include "model/snapbuild.h"
#include "alloc/types.h"

#define KiB ((size_t)1 << 10)
#define MiB ((size_t)1 << 20)
#define GiB ((size_t)1 << 30)

typedef struct env_s {
  ms_backend_t *b;
  ms_allocator_t *a;
} env_t;

static void env_open(env_t *e, const char *conf, size_t capacity) {
  ms_sim_config_t sc = {.capacity = capacity, .log_capacity = 4096};
  cr_assert_eq(ms_backend_sim_create(&sc, &e->b), MS_OK);
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb;
  cr_assert_eq(ms_alloc_config_parse(&c, conf ? conf : "", &eb), MS_OK, "%s", eb.msg);
  ms_allocator_config_t ac = {.backend = e->b, .device = 0, .alloc = &c};
  cr_assert_eq(ms_allocator_create(&ac, &e->a, &eb), MS_OK, "%s", eb.msg);
}

static void check(env_t *e) {
  ms_errbuf_t eb;
  int r = ms__allocator_check(e->a, &eb);
  cr_assert_eq(r, MS_OK, "invariant: %s", eb.msg);
}

/* Destroys the allocator and checks that the device holds nothing any more, unless `leaked`
 * allocations are still live on purpose. */
static void env_close(env_t *e) {
  check(e);
  ms_allocator_destroy(e->a);
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(e->b, 0, &c), MS_OK);
  cr_assert_eq(c.live_allocations, 0, "segments leaked on the device");
  cr_assert_eq(c.used_bytes, 0);
  ms_backend_destroy(e->b);
}

static int64_t stat(env_t *e, const char *key) {
  ms_stats_t st = MS_STATS_INIT;
  cr_assert_eq(ms_allocator_get_stats(e->a, &st), MS_OK);
  int64_t v = -12345;
  cr_assert_eq(ms_stats_get(&st, key, &v), MS_OK, "key %s", key);
  return v;
}

static ms_devptr_t xmalloc(env_t *e, size_t n, ms_stream_t s) {
  ms_devptr_t p = 0;
  int r = ms_allocator_malloc(e->a, n, s, &p);
  cr_assert_eq(r, MS_OK, "malloc(%zu) = %s", n, ms_err_name(r));
  cr_assert_neq(p, 0);
  return p;
}

static void xfree(env_t *e, ms_devptr_t p) { cr_assert_eq(ms_allocator_free(e->a, p), MS_OK); }

static ms_stream_t new_stream(env_t *e) {
  const ms_backend_ops_t *o = ms_backend_ops(e->b);
  ms_stream_t s;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s), MS_OK);
  return s;
}

/* The sequence of sim ops (as names joined by spaces) logged since the last clear, skipping
 * mem_info and event_create/destroy (bookkeeping). */
static void log_ops(env_t *e, char *dst, size_t cap) {
  static ms_sim_call_t log[4096];
  size_t n = 0;
  cr_assert_eq(ms_sim_get_log(e->b, log, 4096, &n), MS_OK);
  dst[0] = 0;
  for (size_t i = 0; i < n; i++) {
    if (log[i].op == MS_SIM_OP_EVENT_CREATE || log[i].op == MS_SIM_OP_EVENT_DESTROY) continue;
    char item[64];
    snprintf(item, sizeof item, "%s%s%s", dst[0] ? " " : "", ms_sim_op_name(log[i].op),
             log[i].result == MS_EOOM ? "!" : "");
    strncat(dst, item, cap - strlen(dst) - 1);
  }
}

/* ---- sizes -------------------------------------------------------------------------------- */

typedef struct size_case_s {
  size_t request, block_d0, seg_d0, block_d4, seg_d4;
} size_case_t;

/* "Sizes and rounding"'s worked examples: rounded size and segment size, divisions 0 and 4. */
static const size_case_t size_cases[] = {
    {1, 512, 2 * MiB, 512, 2 * MiB},
    {513, 1024, 2 * MiB, 1024, 2 * MiB},
    {1048576, 1048576, 2 * MiB, 1048576, 2 * MiB},
    {1048577, 1049088, 20 * MiB, 1310720, 20 * MiB},
    {5000000, 5000192, 20 * MiB, 5242880, 20 * MiB},
    {10485761, 10486272, 12 * MiB, 12582912, 12 * MiB},
    {123456789, 123457024, 123731968, 134217728, 128 * MiB},
};

Test(allocator, rounding_and_segment_sizes_match_the_spec_table) {
  for (int d = 0; d < 2; d++) {
    for (size_t i = 0; i < sizeof size_cases / sizeof size_cases[0]; i++) {
      const size_case_t *c = &size_cases[i];
      env_t e;
      env_open(&e, d ? "roundup_power2_divisions:4" : "", 0);
      ms_devptr_t p = xmalloc(&e, c->request, 0);
      size_t block = d ? c->block_d4 : c->block_d0, seg = d ? c->seg_d4 : c->seg_d0;
      /* large-pool blocks keep a remainder of <= 1 MiB: the block is then the whole segment */
      size_t expect_block = block <= MiB || seg - block > MiB ? block : seg;
      cr_assert_eq(stat(&e, "allocated_bytes.all.current"), (int64_t)expect_block,
                   "request %zu d=%d", c->request, d * 4);
      cr_assert_eq(stat(&e, "reserved_bytes.all.current"), (int64_t)seg, "request %zu", c->request);
      cr_assert_eq(stat(&e, "requested_bytes.all.current"), (int64_t)c->request);
      const char *pool = block <= MiB ? "allocation.small_pool.current"
                                      : "allocation.large_pool.current";
      cr_assert_eq(stat(&e, pool), 1, "pool of %zu", c->request);
      xfree(&e, p);
      cr_assert_eq(stat(&e, "allocated_bytes.all.current"), 0);
      cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
      env_close(&e);
    }
  }
}

Test(allocator, size_zero_and_absurd_sizes) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_devptr_t p = 99;
  cr_assert_eq(ms_allocator_malloc(e.a, 0, 0, &p), MS_OK);
  cr_assert_eq(p, 0);
  cr_assert_eq(ms_allocator_free(e.a, 0), MS_OK);
  p = 99;
  cr_assert_eq(ms_allocator_malloc(e.a, (size_t)1 << 60, 0, &p), MS_EOOM);
  cr_assert_eq(p, 99, "out-param untouched");
  char msg[256];
  ms_allocator_last_oom_message(e.a, msg, sizeof msg);
  cr_assert_str_eq(msg, "memsnap: device out of memory. Tried to allocate more than 1EB memory.");
  cr_assert_eq(stat(&e, "num_ooms"), 0, "PyTorch's 1 EiB check is not a counted OOM");
  cr_assert_eq(ms_allocator_malloc(e.a, 100 * GiB, 0, &p), MS_EOOM, "beyond the 80 GiB device");
  cr_assert_eq(stat(&e, "num_ooms"), 1);
  cr_assert_eq(ms_allocator_free(e.a, MS_SIM_BASE_ADDRESS + 512), MS_EINVAL);
  env_close(&e);
}

/* ---- best fit, split, merge --------------------------------------------------------------- */

Test(allocator, small_pool_splits_at_512_and_merges_back) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_devptr_t a = xmalloc(&e, 1000, 0);
  ms_devptr_t b = xmalloc(&e, 512, 0);
  ms_devptr_t c = xmalloc(&e, 4096, 0);
  cr_assert_eq(a, MS_SIM_BASE_ADDRESS, "low part of the segment");
  cr_assert_eq(b, a + 1024);
  cr_assert_eq(c, b + 512);
  cr_assert_eq(stat(&e, "segment.all.current"), 1);
  cr_assert_eq(stat(&e, "inactive_split.small_pool.current"), 1);
  cr_assert_eq(stat(&e, "inactive_split_bytes.small_pool.current"),
               (int64_t)(2 * MiB - 1024 - 512 - 4096));
  xfree(&e, b);
  cr_assert_eq(stat(&e, "inactive_split.all.current"), 2, "a hole between two live blocks");
  ms_devptr_t d = xmalloc(&e, 300, 0);
  cr_assert_eq(d, b, "best fit: the 512-byte hole, not the big remainder");
  xfree(&e, d);
  xfree(&e, a);
  cr_assert_eq(stat(&e, "inactive_split.all.current"), 2);
  cr_assert_eq(stat(&e, "inactive_split_bytes.all.current"), (int64_t)(2 * MiB - 4096));
  xfree(&e, c);
  cr_assert_eq(stat(&e, "inactive_split.all.current"), 0, "everything merged into one block");
  cr_assert_eq(stat(&e, "inactive_split_bytes.all.current"), 0);
  ms__alloc_counts_t n;
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.blocks, 1);
  cr_assert_eq(n.free_blocks, 1);
  check(&e);
  env_close(&e);
}

Test(allocator, large_pool_splits_only_above_1mib_remainder) {
  env_t e;
  env_open(&e, NULL, 0);
  /* 19 MiB from a 20 MiB segment: remainder exactly 1 MiB -> not split */
  ms_devptr_t a = xmalloc(&e, 19 * MiB, 0);
  cr_assert_eq(stat(&e, "allocated_bytes.all.current"), (int64_t)(20 * MiB));
  cr_assert_eq(stat(&e, "requested_bytes.all.current"), (int64_t)(19 * MiB));
  xfree(&e, a);
  /* 19 MiB - 512: remainder 1 MiB + 512 > 1 MiB -> split */
  a = xmalloc(&e, 19 * MiB - 512, 0);
  cr_assert_eq(stat(&e, "allocated_bytes.all.current"), (int64_t)(19 * MiB - 512));
  cr_assert_eq(stat(&e, "segment.all.current"), 1, "the cached segment was reused");
  ms_devptr_t b = xmalloc(&e, 1 * MiB + 1, 0);
  cr_assert_eq(b, a + 19 * MiB - 512, "the remainder serves the next large request");
  cr_assert_eq(stat(&e, "allocated_bytes.large_pool.current"), (int64_t)(20 * MiB),
               "and takes the whole remainder (no split below 1 MiB left)");
  xfree(&e, a);
  xfree(&e, b);
  env_close(&e);
}

Test(allocator, best_fit_lowest_address_and_never_across_streams) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_stream_t s1 = new_stream(&e);
  ms_devptr_t p[6];
  for (int i = 0; i < 6; i++) p[i] = xmalloc(&e, 4 * KiB, 0);
  xfree(&e, p[1]);
  xfree(&e, p[3]);
  ms_devptr_t q = xmalloc(&e, 4 * KiB, 0);
  cr_assert_eq(q, p[1], "ties in size: lowest address wins");
  ms_devptr_t r = xmalloc(&e, 4 * KiB, s1);
  cr_assert_eq(stat(&e, "segment.all.current"), 2, "stream 1 gets its own segment");
  cr_assert(r < p[0] || r >= p[0] + 2 * MiB);
  xfree(&e, r);
  ms_devptr_t t = xmalloc(&e, 4 * KiB, 0);
  cr_assert_eq(t, p[3], "a block freed on stream 1 is not reused on stream 0");
  xfree(&e, q);
  xfree(&e, t);
  for (int i = 0; i < 6; i++)
    if (i != 1 && i != 3) xfree(&e, p[i]);
  env_close(&e);
}

/* The free set (lib/block_pool.c: per-stream sets, size classes, a treap per class) against a
 * brute-force reference: after random inserts, erases, in-place shrinks (a split's remainder) and
 * replacements (a freed block absorbing a free neighbour) of blocks on three streams, with sizes
 * from 512 B to beyond the last class (32 TiB), many equal sizes and sizes on class boundaries,
 * best fit and lower_bound give exactly the lowest (stream, size, address) key, and the ordered
 * walks visit every block in key order (ms__pool_is_valid). */
typedef struct ref_key_s {
  ms_stream_t stream;
  size_t size;
  uintptr_t ptr;
} ref_key_t;

static bool ref_less(ref_key_t x, ref_key_t y) {
  if (x.stream != y.stream) return x.stream < y.stream;
  if (x.size != y.size) return x.size < y.size;
  return x.ptr < y.ptr;
}

static uint64_t pool_rng = 0x2545f4914f6cdd1dULL;
static uint64_t pool_rnd(void) {
  pool_rng ^= pool_rng << 13;
  pool_rng ^= pool_rng >> 7;
  pool_rng ^= pool_rng << 17;
  return pool_rng;
}

static size_t pool_rnd_size(void) {
  switch (pool_rnd() % 8) {
  case 0: return 4 * KiB; /* many equal sizes */
  case 1: return (size_t)512 << (pool_rnd() % 38); /* powers of two: class boundaries */
  case 2: return ((size_t)512 << (pool_rnd() % 38)) - 512; /* just below them */
  case 3: return ((size_t)1 << 45) + 512 * (pool_rnd() % 1000); /* the last class */
  default: return 512 * (1 + pool_rnd() % ((size_t)1 << (pool_rnd() % 30)));
  }
}

/* The first in-set block with key >= (stream, size, 0), restricted to stream when `same`. */
static ms__block_t *ref_lower_bound(ms__block_t *blocks, size_t n, ms_stream_t stream,
                                    size_t size, bool same) {
  ms__block_t *best = NULL;
  ref_key_t q = {stream, size, 0};
  for (size_t i = 0; i < n; i++) {
    ms__block_t *b = &blocks[i];
    ref_key_t k = {b->stream, b->size, b->ptr};
    if (!b->in_set || ref_less(k, q) || (same && b->stream != stream)) continue;
    if (!best || ref_less(k, (ref_key_t){best->stream, best->size, best->ptr})) best = b;
  }
  return best;
}

/* Where the reference test places block i: 16 MiB apart, so that keys never tie. */
static uintptr_t ref_base(const ms__block_t *blocks, const ms__block_t *b) {
  return ((uintptr_t)1 << 50) + (uintptr_t)(b - blocks) * 16 * MiB;
}

Test(allocator, free_set_matches_a_sorted_reference) {
  enum { NB = 2000, OPS = 20000 };
  static const ms_stream_t streams[3] = {7, 3, 1000};
  ms__pool_t p;
  ms__pool_init(&p, false, NULL);
  for (int i = 0; i < 3; i++) cr_assert_eq(ms__pool_reserve(&p, streams[i]), MS_OK);
  cr_assert_eq(ms__pool_reserve(&p, 3), MS_OK, "reserving twice is harmless");
  ms__block_t *blocks = calloc(NB, sizeof *blocks);
  cr_assert(blocks != NULL);
  for (size_t i = 0; i < NB; i++) blocks[i].pool = &p;
  size_t in = 0;
  for (int op = 0; op < OPS; op++) {
    ms__block_t *b = &blocks[pool_rnd() % NB];
    uint64_t r = pool_rnd() % 6;
    uintptr_t base = ref_base(blocks, b);
    if (b->in_set && r == 0 && b->size > 512 && b->ptr - base < 8 * MiB) { /* a remainder */
      size_t lim = b->size < 4 * MiB ? b->size : 4 * MiB;
      ms__pool_shrink_front(&p, b, 512 * (1 + pool_rnd() % (lim / 512 - 1)));
    } else if (b->in_set && r == 1) { /* a freed block absorbs b */
      ms__block_t *nb = &blocks[pool_rnd() % NB];
      if (nb->in_set) continue;
      nb->ptr = ref_base(blocks, nb) + 512 * (pool_rnd() % 64);
      nb->stream = b->stream;
      nb->size = b->size + 512 * (pool_rnd() % 2 ? 1 + pool_rnd() % 64 : pool_rnd() % 100000);
      ms__pool_replace(&p, b, nb);
      cr_assert(nb->in_set && !b->in_set);
    } else if (b->in_set && r < 4) {
      ms__pool_erase(&p, b);
      in--;
    } else if (!b->in_set) {
      b->ptr = base + (pool_rnd() % 64) * 512;
      b->stream = streams[pool_rnd() % 3];
      b->size = pool_rnd_size();
      ms__pool_insert(&p, b);
      in++;
    }
    cr_assert_eq(p.nblocks, in);
    if (op % 97 != 0) continue;
    cr_assert(ms__pool_is_valid(&p), "after op %d", op);
    for (int k = 0; k < 8; k++) {
      ms_stream_t s = k == 7 ? 5 : streams[pool_rnd() % 3]; /* 5: a stream without a set */
      size_t size = k == 0 ? 0 : pool_rnd_size() + (k == 1 ? 1 : 0);
      ms__block_t *want = ref_lower_bound(blocks, NB, s, size, true);
      cr_assert_eq(ms__pool_find(&p, s, size), want, "find(%lu, %zu) at op %d",
                   (unsigned long)s, size, op);
      want = ref_lower_bound(blocks, NB, s, size, false);
      cr_assert_eq(ms__pool_lower_bound(&p, s, size), want, "lower_bound(%lu, %zu) at op %d",
                   (unsigned long)s, size, op);
    }
  }
  /* drain in key order through the walks */
  while (p.nblocks) {
    ms__block_t *f = ms__pool_first(&p);
    cr_assert_eq(f, ref_lower_bound(blocks, NB, 0, 0, false));
    ms__pool_erase(&p, f);
  }
  cr_assert(ms__pool_first(&p) == NULL && ms__pool_last(&p) == NULL);
  cr_assert(ms__pool_is_valid(&p));
  /* a stream's set lives as long as the pool has segments on it */
  ms__pool_unreserve(&p, 3);
  cr_assert_eq(p.nsets, 3, "stream 3 was reserved twice");
  ms__pool_unreserve(&p, 3);
  cr_assert_eq(p.nsets, 2);
  cr_assert(ms__pool_find(&p, 3, 512) == NULL && ms__pool_is_valid(&p));
  ms__pool_unreserve(&p, 7);
  ms__pool_unreserve(&p, 1000);
  cr_assert_eq(p.nsets, 0);
  cr_assert_eq(ms__pool_reserve(&p, 9), MS_OK);
  ms__pool_fini(&p);
  ms__pool_unreserve(&p, 9); /* after fini: nothing */
  cr_assert_eq(p.nsets, 0);
  free(blocks);
}

/* ---- oversize rules and release_available_cached_blocks -------------------------------------- */

Test(allocator, oversize_blocks_are_not_split_nor_handed_to_small_requests) {
  env_t e;
  env_open(&e, "max_split_size_mb:40", 0);
  cr_assert_eq(stat(&e, "max_split_size"), (int64_t)(40 * MiB));
  ms_devptr_t big = xmalloc(&e, 50 * MiB, 0);
  cr_assert_eq(stat(&e, "oversize_allocations.current"), 1);
  cr_assert_eq(stat(&e, "oversize_segments.current"), 1);
  xfree(&e, big);
  cr_assert_eq(stat(&e, "oversize_allocations.current"), 0);
  /* a 12 MiB request may not take the cached 50 MiB oversize block */
  ms_devptr_t m = xmalloc(&e, 12 * MiB, 0);
  cr_assert_neq(m, big);
  cr_assert_eq(stat(&e, "segment.all.current"), 2);
  /* 45 MiB >= max_split: may take the 50 MiB block (50 < 45 + 20), unsplit */
  ms_devptr_t n = xmalloc(&e, 45 * MiB, 0);
  cr_assert_eq(n, big);
  cr_assert_eq(stat(&e, "allocated_bytes.all.current"), (int64_t)(62 * MiB));
  xfree(&e, n);
  /* 41 MiB may take the 50 MiB block too (50 < 41 + 20) */
  ms_devptr_t o = xmalloc(&e, 41 * MiB, 0);
  cr_assert_eq(o, big);
  xfree(&e, o);
  xfree(&e, m);
  env_close(&e);
}

Test(allocator, max_non_split_rounding_limits_oversize_reuse) {
  env_t e;
  env_open(&e, "max_split_size_mb:40,max_non_split_rounding_mb:20", 0);
  ms_devptr_t big = xmalloc(&e, 80 * MiB, 0);
  xfree(&e, big);
  ms_devptr_t p = xmalloc(&e, 60 * MiB, 0);
  cr_assert_neq(p, big, "80 >= 60 + 20: the cached 80 MiB block is refused");
  ms_devptr_t q = xmalloc(&e, 61 * MiB, 0);
  cr_assert_eq(q, big, "80 < 61 + 20: accepted");
  xfree(&e, p);
  xfree(&e, q);
  env_close(&e);
}

Test(allocator, release_available_cached_blocks_frees_oversize_largest_first) {
  env_t e;
  env_open(&e, "max_split_size_mb:20", 200 * MiB);
  ms_devptr_t a = xmalloc(&e, 30 * MiB, 0), b = xmalloc(&e, 40 * MiB, 0);
  ms_devptr_t c = xmalloc(&e, 50 * MiB, 0), d = xmalloc(&e, 60 * MiB, 0);
  xfree(&e, a);
  xfree(&e, b);
  xfree(&e, c);
  xfree(&e, d);
  cr_assert_eq(stat(&e, "reserved_bytes.all.current"), (int64_t)(180 * MiB));
  ms_sim_clear_log(e.b);
  /* 100 MiB: no cached block is big enough (nor within 100 + 20); the device has 20 MiB left.
   * release_available frees from the largest down (60, 50) until >= 100 MiB, then retries. */
  ms_devptr_t p = xmalloc(&e, 100 * MiB, 0);
  char ops[512];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "malloc! free free malloc");
  static ms_sim_call_t log[16];
  size_t n;
  ms_sim_get_log(e.b, log, 16, &n);
  cr_assert_eq(log[1].addr, d, "largest first");
  cr_assert_eq(log[2].addr, c);
  cr_assert_eq(stat(&e, "num_alloc_retries"), 0);
  cr_assert_eq(stat(&e, "segment.all.current"), 3);
  xfree(&e, p);
  env_close(&e);
}

Test(allocator, release_available_is_a_noop_without_max_split_size) {
  env_t e;
  env_open(&e, NULL, 100 * MiB);
  ms_devptr_t a = xmalloc(&e, 30 * MiB, 0), b = xmalloc(&e, 40 * MiB, 0);
  xfree(&e, a);
  xfree(&e, b);
  ms_sim_clear_log(e.b);
  ms_devptr_t p = xmalloc(&e, 50 * MiB, 0);
  char ops[512];
  log_ops(&e, ops, sizeof ops);
  /* device malloc fails; release_available does nothing; sync + free everything; retry */
  cr_assert_str_eq(ops, "malloc! free free malloc");
  cr_assert_eq(stat(&e, "num_alloc_retries"), 1);
  cr_assert_eq(stat(&e, "num_sync_all_streams"), 1);
  xfree(&e, p);
  env_close(&e);
}

/* ---- the OOM chain ------------------------------------------------------------------------ */

static int cb_calls;
static bool cb_free_one(void *arg) {
  env_t *e = arg;
  cb_calls++;
  (void)e;
  return false;
}

typedef struct obs_s {
  env_t *e;
  int calls;
  int device;
  size_t alloc_size, total, free_bytes;
  int64_t ooms_seen;
} obs_t;

static void observer(void *arg, int device, size_t alloc_size, size_t total, size_t free_bytes) {
  obs_t *o = arg;
  o->calls++;
  o->device = device;
  o->alloc_size = alloc_size;
  o->total = total;
  o->free_bytes = free_bytes;
  /* outside the lock: calling the allocator must not deadlock */
  o->ooms_seen = stat(o->e, "num_ooms");
}

Test(allocator, oom_chain_order_message_and_observers, .timeout = 20) {
  env_t e;
  env_open(&e, "max_split_size_mb:20", 100 * MiB);
  ms_stream_t s1 = new_stream(&e);
  obs_t o = {.e = &e};
  cr_assert_eq(ms_allocator_attach_oom_observer(e.a, observer, &o), MS_OK);
  cr_assert_eq(ms_allocator_add_free_memory_callback(e.a, cb_free_one, &e), MS_OK);
  ms_devptr_t keep = xmalloc(&e, 30 * MiB, 0);   /* live, 30 MiB */
  ms_devptr_t ov = xmalloc(&e, 24 * MiB, 0);     /* oversize, cached after free */
  ms_devptr_t pend = xmalloc(&e, 4 * MiB, 0);    /* 20 MiB segment, pending on s1 */
  ms_devptr_t small = xmalloc(&e, 1000, 0);      /* 2 MiB small segment, cached */
  cr_assert_eq(ms_allocator_record_stream(e.a, pend, s1), MS_OK);
  xfree(&e, ov);
  xfree(&e, pend);
  xfree(&e, small);
  cr_assert_eq(stat(&e, "reserved_bytes.all.current"), (int64_t)(76 * MiB));
  cr_assert_eq(stat(&e, "active.all.current"), 2, "keep + the pending block");
  ms_sim_clear_log(e.b);
  ms_sim_reset_counters(e.b, 0);
  ms_devptr_t p = 5;
  cb_calls = 0;
  /* 90 MiB can never fit in 100 MiB with 30 MiB live */
  cr_assert_eq(ms_allocator_malloc(e.a, 90 * MiB, 0, &p), MS_EOOM);
  cr_assert_eq(p, 5);
  char ops[512];
  log_ops(&e, ops, sizeof ops);
  /* query of the pending event (not done) at malloc start; device malloc fails; release_available
   * frees the 24 MiB oversize segment, which is not enough (24 < 90 MiB), so no malloc; release
   * everything: synchronize the event (the pending block merges with its remainder), free the
   * 20 MiB and 2 MiB segments (large pool first); retry fails; OOM message. */
  cr_assert_str_eq(ops,
                   "event_query malloc! free event_synchronize free free malloc! mem_info");
  cr_assert_eq(cb_calls, 1, "free-memory callbacks run once, before any device call");
  cr_assert_eq(stat(&e, "num_ooms"), 1);
  cr_assert_eq(stat(&e, "num_alloc_retries"), 1);
  cr_assert_eq(stat(&e, "num_sync_all_streams"), 1);
  cr_assert_eq(stat(&e, "reserved_bytes.all.current"), (int64_t)(30 * MiB));
  cr_assert_eq(o.calls, 1);
  cr_assert_eq(o.device, 0);
  cr_assert_eq(o.alloc_size, 90 * MiB);
  cr_assert_eq(o.total, 100 * MiB);
  cr_assert_eq(o.free_bytes, 70 * MiB);
  cr_assert_eq(o.ooms_seen, 1, "observers run after num_ooms is counted");
  char msg[1024];
  size_t len = ms_allocator_last_oom_message(e.a, msg, sizeof msg);
  cr_assert_eq(len, strlen(msg));
  cr_assert_str_eq(msg,
                   "memsnap: device out of memory. Tried to allocate 90.00 MiB. GPU 0 has a total "
                   "capacity of 100.00 MiB of which 70.00 MiB is free. Of the allocated memory "
                   "30.00 MiB is allocated by memsnap, and 0 bytes is reserved by memsnap but "
                   "unallocated. If reserved but unallocated memory is large try setting "
                   "MEMSNAP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                   "docs/allocator.md (\"Out of memory\") for MEMSNAP_ALLOC_CONF.");
  char small_buf[10];
  cr_assert_eq(ms_allocator_last_oom_message(e.a, small_buf, sizeof small_buf), len);
  cr_assert_str_eq(small_buf, "memsnap: ");
  xfree(&e, keep);
  env_close(&e);
}

Test(allocator, oom_hint_names_expandable_segments_even_when_on) {
  /* PyTorch >= 2.2 prints the hint whatever the setting (issue #173049). */
  env_t e;
  env_open(&e, "expandable_segments:True", 64 * MiB);
  ms_devptr_t p = 0;
  cr_assert_eq(ms_allocator_malloc(e.a, 100 * MiB, 0, &p), MS_EOOM);
  cr_assert_eq(p, 0, "the out-parameter is untouched");
  char msg[1024];
  ms_allocator_last_oom_message(e.a, msg, sizeof msg);
  const char *tail = " If reserved but unallocated memory is large try setting "
                     "MEMSNAP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                     "docs/allocator.md (\"Out of memory\") for MEMSNAP_ALLOC_CONF.";
  cr_assert(strlen(msg) > strlen(tail) && !strcmp(msg + strlen(msg) - strlen(tail), tail), "%s",
            msg);
  cr_assert(!strncmp(msg, "memsnap: device out of memory. Tried to allocate ", 49), "%s", msg);
  env_close(&e);
}

Test(allocator, oom_message_reports_fraction_and_unallocated) {
  env_t e;
  env_open(&e, NULL, 100 * MiB);
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_set_memory_fraction(e.a, 1.5, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "invalid fraction:1.5. Please set within [0, 1].");
  cr_assert_eq(ms_allocator_set_memory_fraction(e.a, 0.5, &eb), MS_OK);
  ms_devptr_t a = xmalloc(&e, 1000, 0); /* 2 MiB small segment, split */
  ms_devptr_t b = xmalloc(&e, 30 * MiB, 0);
  ms_sim_clear_log(e.b);
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(e.a, 30 * MiB, 0, &p), MS_EOOM);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "mem_info", "the fraction refuses without calling the device");
  char msg[1024];
  ms_allocator_last_oom_message(e.a, msg, sizeof msg);
  cr_assert_str_eq(msg,
                   "memsnap: device out of memory. Tried to allocate 30.00 MiB. GPU 0 has a total "
                   "capacity of 100.00 MiB of which 68.00 MiB is free. 50.00 MiB allowed; Of the "
                   "allocated memory 30.00 MiB is allocated by memsnap, and 2.00 MiB is reserved "
                   "by memsnap but unallocated. If reserved but unallocated memory is large try "
                   "setting MEMSNAP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  "
                   "See docs/allocator.md (\"Out of memory\") for MEMSNAP_ALLOC_CONF.");
  xfree(&e, a);
  xfree(&e, b);
  env_close(&e);
}

Test(allocator, tried_to_allocate_shows_the_segment_size) {
  env_t e;
  env_open(&e, NULL, 10 * MiB);
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(e.a, 2 * MiB, 0, &p), MS_EOOM, "needs a 20 MiB segment");
  char msg[1024];
  ms_allocator_last_oom_message(e.a, msg, sizeof msg);
  cr_assert(strstr(msg, "Tried to allocate 20.00 MiB. GPU 0 has a total capacity of 10.00 MiB of "
                        "which 10.00 MiB is free.") != NULL,
            "%s", msg);
  env_close(&e);
}

Test(allocator, fault_injection_goes_through_the_retry) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_devptr_t a = xmalloc(&e, 100, 0);
  xfree(&e, a);
  ms_sim_fail_nth_malloc(e.b, 0, 1);
  ms_sim_clear_log(e.b);
  ms_devptr_t p = xmalloc(&e, 30 * MiB, 0);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "malloc! free malloc", "the cached small segment is released, then retry");
  cr_assert_eq(stat(&e, "num_alloc_retries"), 1);
  xfree(&e, p);
  env_close(&e);
}

/* Issue #189504, kept faithfully: after the final release the pool is not searched again, so a
 * block returned by synchronize_and_free_events does not serve the request. */
Test(allocator, no_research_after_release_all_quirk) {
  env_t e;
  env_open(&e, NULL, 20 * MiB);
  ms_stream_t s1 = new_stream(&e);
  ms_devptr_t a = xmalloc(&e, 10 * MiB, 0); /* 10 MiB segment (exact), all the capacity but 10 */
  ms_devptr_t b = xmalloc(&e, 10 * MiB, 0);
  cr_assert_eq(ms_allocator_record_stream(e.a, a, s1), MS_OK);
  xfree(&e, a); /* pending on s1 */
  ms_devptr_t p;
  /* the 10 MiB block becomes free during release_cached_blocks, whose whole segment is then
   * returned to the device: the retry's device malloc succeeds */
  cr_assert_eq(ms_allocator_malloc(e.a, 10 * MiB, 0, &p), MS_OK);
  cr_assert_eq(stat(&e, "num_alloc_retries"), 1);
  xfree(&e, p);
  xfree(&e, b);
  /* now a split segment: the freed block cannot be returned and the pool is not re-searched */
  env_close(&e);
  env_open(&e, NULL, 24 * MiB);
  s1 = new_stream(&e);
  ms_devptr_t x = xmalloc(&e, 3 * MiB, 0); /* 20 MiB segment split: x + 17 MiB free */
  ms_devptr_t y = xmalloc(&e, 17 * MiB, 0);
  cr_assert_eq(y, x + 3 * MiB);
  cr_assert_eq(ms_allocator_record_stream(e.a, x, s1), MS_OK);
  xfree(&e, x); /* pending on s1; y keeps the segment split */
  cr_assert_eq(ms_allocator_malloc(e.a, 3 * MiB, 0, &p), MS_EOOM,
               "the freed 3 MiB block would fit, but PyTorch does not search again");
  cr_assert_eq(ms_allocator_malloc(e.a, 3 * MiB, 0, &p), MS_OK, "the immediate retry succeeds");
  cr_assert_eq(p, x);
  xfree(&e, p);
  xfree(&e, y);
  env_close(&e);
}

/* ---- record_stream ----------------------------------------------------------------------- */

Test(allocator, record_stream_defers_reuse_until_events_complete) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_stream_t s1 = new_stream(&e), s2 = new_stream(&e);
  ms_devptr_t a = xmalloc(&e, 8 * KiB, 0);
  cr_assert_eq(ms_allocator_record_stream(e.a, a, 0), MS_OK, "own stream ignored");
  cr_assert_eq(ms_allocator_record_stream(e.a, a, s1), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(e.a, a, s2), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(e.a, a, s2), MS_OK, "a set: once per stream");
  cr_assert_eq(ms_allocator_record_stream(e.a, 12345, s1), MS_EINVAL);
  xfree(&e, a);
  ms__alloc_counts_t n;
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.pending_blocks, 1);
  cr_assert_eq(n.outstanding_events, 2);
  cr_assert_eq(stat(&e, "allocated_bytes.all.current"), 0, "allocated drops at free");
  cr_assert_eq(stat(&e, "active_bytes.all.current"), (int64_t)(8 * KiB), "active waits");
  ms_devptr_t b = xmalloc(&e, 8 * KiB, 0);
  cr_assert_neq(b, a, "not reused while s1 and s2 have not reached the free");
  ms_sim_stream_complete(e.b, 0, s1);
  ms_devptr_t c = xmalloc(&e, 8 * KiB, 0);
  cr_assert_neq(c, a, "s2 is still running");
  ms_sim_stream_complete(e.b, 0, s2);
  ms_devptr_t d = xmalloc(&e, 8 * KiB, 0);
  cr_assert_eq(d, a, "both events done: reused at the next malloc");
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.pending_blocks, 0);
  cr_assert_eq(n.outstanding_events, 0);
  xfree(&e, b);
  xfree(&e, c);
  xfree(&e, d);
  ms_sim_counters_t sc;
  ms_sim_get_counters(e.b, 0, &sc);
  cr_assert_eq(sc.event_creates, 2, "events come from a recycled pool");
  env_close(&e);
}

Test(allocator, empty_cache_forces_pending_frees) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_stream_t s1 = new_stream(&e);
  ms_devptr_t a = xmalloc(&e, 8 * KiB, 0);
  ms_allocator_record_stream(e.a, a, s1);
  xfree(&e, a);
  ms_sim_clear_log(e.b);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "event_synchronize free");
  cr_assert_eq(stat(&e, "reserved_bytes.all.current"), 0);
  cr_assert_eq(stat(&e, "num_device_free"), 1);
  env_close(&e);
}

Test(allocator, empty_cache_keeps_split_segments) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_devptr_t a = xmalloc(&e, 8 * KiB, 0), b = xmalloc(&e, 30 * MiB, 0);
  ms_devptr_t c = xmalloc(&e, 5 * MiB, 0);
  xfree(&e, b);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  cr_assert_eq(stat(&e, "segment.all.current"), 2, "only the unsplit 30 MiB segment goes");
  cr_assert_eq(stat(&e, "inactive_split_bytes.all.current"),
               (int64_t)(2 * MiB - 8 * KiB + 15 * MiB));
  xfree(&e, a);
  xfree(&e, c);
  env_close(&e);
}

/* ---- memory fraction and garbage collection ("The OOM path and releases") -------------------- */

Test(allocator, garbage_collection_frees_old_cached_segments) {
  env_t e;
  env_open(&e, "garbage_collection_threshold:0.6", 100 * MiB);
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_set_memory_fraction(e.a, 0.8, &eb), MS_OK); /* 80 MiB allowed */
  /* each get_free_block call on the large pool ticks its GC clock */
  ms_devptr_t c1 = xmalloc(&e, 30 * MiB, 0), c2 = xmalloc(&e, 32 * MiB, 0);
  ms_devptr_t k = xmalloc(&e, 12 * MiB, 0); /* clock 3 */
  xfree(&e, c1);                            /* cached at clock 3 */
  xfree(&e, k);
  for (int i = 0; i < 3; i++) {
    ms_devptr_t t = xmalloc(&e, 12 * MiB, 0); /* hits k; clock 4, 5, 6 */
    cr_assert_eq(t, k);
    xfree(&e, t);
  }
  xfree(&e, c2); /* cached at clock 6 */
  ms_sim_clear_log(e.b);
  /* 34 MiB: no cached block fits; 74 MiB held > 0.6 * 80 = 48 MiB: target 26 MiB. Ages (clock 7):
   * k 1, c1 4, c2 1; average 2: only c1 is old enough, and its 30 MiB suffice. */
  ms_devptr_t p = xmalloc(&e, 34 * MiB, 0);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "free malloc");
  static ms_sim_call_t log[8];
  size_t n;
  ms_sim_get_log(e.b, log, 8, &n);
  cr_assert_eq(log[0].addr, c1, "the oldest cached segment, not the first in size order");
  cr_assert_eq(stat(&e, "num_alloc_retries"), 0);
  xfree(&e, p);
  env_close(&e);
}

Test(allocator, gc_is_inert_without_a_fraction) {
  env_t e;
  env_open(&e, "garbage_collection_threshold:0.1", 0);
  ms_devptr_t a = xmalloc(&e, 30 * MiB, 0);
  xfree(&e, a);
  ms_sim_clear_log(e.b);
  ms_devptr_t p = xmalloc(&e, 40 * MiB, 0);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "malloc", "issue #106660: no fraction, no GC");
  xfree(&e, p);
  env_close(&e);
}

/* ---- private pools ("Private pools and CUDA graphs") ----------------------------------------- */

static bool only_stream(void *arg, ms_stream_t s) { return s == *(ms_stream_t *)arg; }

Test(allocator, private_pool_isolation_and_release) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_stream_t cap = new_stream(&e);
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_gt(id.first, 0);
  cr_assert_eq(id.second, 0);
  ms_pool_id_t mp = ms_pool_id_new(false);
  cr_assert_eq(mp.first, 0);
  cr_assert_gt(mp.second, 0);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, (ms_pool_id_t){0, 0}, NULL, NULL),
               MS_EINVAL);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, id, only_stream, &cap), MS_OK);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, id, only_stream, &cap), MS_ESTATE,
               "already recording to mempool_id");
  ms_devptr_t g1 = xmalloc(&e, 64 * KiB, cap);
  ms_devptr_t d1 = xmalloc(&e, 64 * KiB, 0); /* filter says no: default pool */
  cr_assert_eq(stat(&e, "segment.all.current"), 2);
  ms__alloc_counts_t n;
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.private_pools, 1);
  xfree(&e, g1);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, id), MS_OK);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, id), MS_ESTATE);
  /* the private pool's cached memory is never handed to default allocations */
  ms_devptr_t d2 = xmalloc(&e, 64 * KiB, cap);
  cr_assert(d2 < g1 || d2 >= g1 + 2 * MiB, "private block reused outside the pool");
  cr_assert_eq(stat(&e, "segment.all.current"), 3);
  /* empty_cache does not return a live (unreleased) pool's segments */
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  xfree(&e, d1);
  xfree(&e, d2);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  cr_assert_eq(stat(&e, "segment.all.current"), 1, "the private segment stays");
  cr_assert_eq(ms_allocator_release_pool(e.a, id), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(e.a, id), MS_ENOTFOUND);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  cr_assert_eq(stat(&e, "segment.all.current"), 0);
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.private_pools, 0, "freed once it holds no segment");
  env_close(&e);
}

Test(allocator, private_pool_routing_is_lifo_and_skips_release_all) {
  env_t e;
  env_open(&e, NULL, 30 * MiB);
  ms_pool_id_t p1 = ms_pool_id_new(false), p2 = ms_pool_id_new(false);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, p1, NULL, NULL), MS_OK);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, p2, NULL, NULL), MS_OK);
  ms_devptr_t a = xmalloc(&e, 1 * KiB, 0);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, p2), MS_OK);
  ms_devptr_t b = xmalloc(&e, 1 * KiB, 0);
  cr_assert(b < a || b >= a + 2 * MiB, "p2 routed first, then p1: separate segments");
  xfree(&e, a);
  ms_devptr_t c = xmalloc(&e, 20 * MiB, 0); /* 20 MiB from p1 */
  ms_devptr_t d;
  ms_sim_clear_log(e.b);
  cr_assert_eq(ms_allocator_malloc(e.a, 20 * MiB, 0, &d), MS_EOOM);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, "malloc! mem_info", "no release-all while a routing is active (#159674)");
  char msg[1024];
  ms_allocator_last_oom_message(e.a, msg, sizeof msg);
  cr_assert(strstr(msg, "with 4.00 MiB allocated in private pools (e.g., CUDA Graphs), ") != NULL,
            "%s", msg);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, p1), MS_OK);
  xfree(&e, b);
  xfree(&e, c);
  cr_assert_eq(ms_allocator_release_pool(e.a, p1), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(e.a, p2), MS_OK);
  cr_assert_eq(ms_allocator_empty_pool_cache(e.a, p2), MS_OK);
  ms__alloc_counts_t n;
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.private_pools, 1, "only p2 was emptied");
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  ms__allocator_counts(e.a, &n);
  cr_assert_eq(n.private_pools, 0);
  env_close(&e);
}

/* ---- statistics --------------------------------------------------------------------------- */

Test(allocator, stats_peaks_resets_and_version_check) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_devptr_t a = xmalloc(&e, 3 * MiB, 0);
  ms_devptr_t b = xmalloc(&e, 3 * MiB, 0);
  xfree(&e, a);
  cr_assert_eq(stat(&e, "allocated_bytes.all.peak"), (int64_t)(6 * MiB));
  cr_assert_eq(stat(&e, "allocated_bytes.large_pool.allocated"), (int64_t)(6 * MiB));
  cr_assert_eq(stat(&e, "allocated_bytes.large_pool.freed"), (int64_t)(3 * MiB));
  cr_assert_eq(stat(&e, "allocation.all.current"), 1);
  cr_assert_eq(stat(&e, "num_device_alloc"), 1);
  ms_allocator_reset_peak(e.a);
  cr_assert_eq(stat(&e, "allocated_bytes.all.peak"), (int64_t)(3 * MiB));
  ms_allocator_reset_accumulated(e.a);
  cr_assert_eq(stat(&e, "allocated_bytes.all.allocated"), 0);
  cr_assert_eq(stat(&e, "num_device_alloc"), 0);
  cr_assert_eq(stat(&e, "allocated_bytes.all.current"), (int64_t)(3 * MiB));
  ms_stats_t st = MS_STATS_INIT;
  st.version = 999;
  cr_assert_eq(ms_allocator_get_stats(e.a, &st), MS_EVERSION);
  char *text = NULL;
  cr_assert_eq(ms_allocator_memory_summary(e.a, false, &text), MS_OK);
  cr_assert(strstr(text, "PyTorch CUDA memory summary, device ID 0") != NULL);
  cr_assert(strstr(text, "| Allocated memory      |   3072 KiB |   3072 KiB |      0 B   |"
                         "      0 B   |") != NULL,
            "%s", text);
  ms_stats_text_free(text);
  xfree(&e, b);
  env_close(&e);
}

/* ---- configuration ---------------------------------------------------------------------- */

Test(allocator, bad_environment_configuration_fails_creation) {
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_sim_create(NULL, &b), MS_OK);
  setenv("MEMSNAP_ALLOC_CONF", "max_split_size_mb:5", 1);
  ms_allocator_config_t ac = {.backend = b};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&ac, &a, &eb), MS_ECONFIG);
  cr_assert_null(a);
  cr_assert(strstr(eb.msg, "MEMSNAP_ALLOC_CONF") != NULL, "%s", eb.msg);
  cr_assert(strstr(eb.msg, "max_split_size_mb") != NULL, "%s", eb.msg);
  setenv("MEMSNAP_ALLOC_CONF", "max_split_size_mb:64", 1);
  cr_assert_eq(ms_allocator_create(&ac, &a, &eb), MS_OK);
  ms_alloc_config_t c;
  ms_allocator_get_config(a, &c);
  cr_assert_eq(c.max_split_size, 64 * MiB);
  ms_allocator_destroy(a);
  unsetenv("MEMSNAP_ALLOC_CONF");
  ac.device = 3;
  cr_assert_eq(ms_allocator_create(&ac, &a, &eb), MS_ENODEVICE);
  cr_assert_str_eq(eb.msg, "backend 'sim' has no device 3 (it has 1)");
  ac.backend = NULL;
  cr_assert_eq(ms_allocator_create(&ac, &a, &eb), MS_EINVAL);
  ms_backend_destroy(b);
}

/* ---- history hooks and the snapshot walk ------------------------------------------------- */

typedef struct rec_s {
  int n;
  ms__trace_rec_t r[64];
  uint32_t next_ctx;
} rec_t;

static uint32_t hook_gather(void *ctx) { return ++((rec_t *)ctx)->next_ctx; }
static void hook_trace(void *ctx, const ms__trace_rec_t *r) {
  rec_t *t = ctx;
  if (t->n < 64) t->r[t->n++] = *r;
}

Test(allocator, trace_hooks_follow_pytorch_points) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_stream_t s1 = new_stream(&e);
  rec_t rec = {0};
  ms__alloc_hooks_t h = {.ctx = &rec, .context_level = MS__CTX_ALL, .trace_enabled = 1,
                         .gather = hook_gather, .trace = hook_trace};
  ms__allocator_set_hooks(e.a, &h);
  cr_assert_eq(ms__allocator_get_hooks(e.a), &h);
  ms_devptr_t a = xmalloc(&e, 1000, 0);               /* ctx 1 */
  ms_allocator_record_stream(e.a, a, s1);
  xfree(&e, a);                                       /* ctx 2 */
  ms_sim_stream_complete(e.b, 0, s1);
  ms_devptr_t b = xmalloc(&e, 1000, 0);               /* ctx 3: free_completed, then alloc */
  xfree(&e, b);                                       /* ctx 4 */
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK); /* ctx 5 */
  static const ms_trace_action want[] = {
      MS_TRACE_SEGMENT_ALLOC, MS_TRACE_ALLOC,          MS_TRACE_FREE_REQUESTED,
      MS_TRACE_FREE_COMPLETED, MS_TRACE_ALLOC,         MS_TRACE_FREE_REQUESTED,
      MS_TRACE_FREE_COMPLETED, MS_TRACE_SEGMENT_FREE};
  cr_assert_eq(rec.n, 8);
  for (int i = 0; i < 8; i++) cr_assert_eq(rec.r[i].action, want[i], "entry %d", i);
  cr_assert_eq(rec.r[0].size, 2 * MiB);
  cr_assert_eq(rec.r[0].ctx, 1);
  cr_assert_eq(rec.r[1].size, 1000, "alloc records the user's size");
  cr_assert_eq(rec.r[1].addr, a);
  cr_assert_eq(rec.r[2].ctx, 2, "free_requested: the free's context");
  cr_assert_eq(rec.r[3].ctx, 3, "deferred free_completed: the context of the malloc that ran it");
  cr_assert_eq(rec.r[3].addr, a);
  cr_assert_eq(rec.r[7].ctx, 5);
  cr_assert_eq(rec.r[7].addr, MS_SIM_BASE_ADDRESS);
  /* level ALLOC: no gather at free, contexts fall back to the allocation's */
  rec.n = 0;
  h.context_level = MS__CTX_ALLOC;
  ms_devptr_t c = xmalloc(&e, 1000, 0); /* ctx 6 */
  xfree(&e, c);
  cr_assert_eq(rec.r[2].action, MS_TRACE_FREE_REQUESTED);
  cr_assert_eq(rec.r[2].ctx, 6);
  cr_assert_eq(rec.r[3].action, MS_TRACE_FREE_COMPLETED);
  cr_assert_eq(rec.r[3].ctx, 6);
  /* level STATE: contexts kept on blocks, not in trace entries */
  rec.n = 0;
  h.context_level = MS__CTX_STATE;
  ms_devptr_t d = xmalloc(&e, 1000, 0);
  cr_assert_eq(rec.r[0].action, MS_TRACE_ALLOC);
  cr_assert_eq(rec.r[0].ctx, 0);
  ms_devptr_t p;
  ms_sim_set_capacity(e.b, 0, 4 * MiB);
  rec.n = 0;
  cr_assert_eq(ms_allocator_malloc(e.a, 3 * MiB, 0, &p), MS_EOOM);
  cr_assert_eq(rec.r[rec.n - 1].action, MS_TRACE_OOM);
  cr_assert_eq(rec.r[rec.n - 1].addr, 2 * MiB, "oom: addr is the device's free bytes");
  cr_assert_eq(rec.r[rec.n - 1].size, 3 * MiB, "oom: the rounded request");
  xfree(&e, d);
  ms__allocator_set_hooks(e.a, NULL);
  env_close(&e);
}

/* Makes a one-frame stack named "ctx<N>" in the builder; ctx_stacks[N] = its index. */
static uint32_t ctx_stacks[16];
static int ctx_stack(void *arg, uint32_t ctx, uint32_t *stack) {
  ms__snapbuild_t *b = arg;
  char name[16];
  int n = snprintf(name, sizeof name, "ctx%u", ctx);
  uint32_t f;
  int r = ms__snapbuild_frame(b, name, (size_t)n, "t.c", 3, ctx, &f);
  if (r == MS_OK) r = ms__snapbuild_stack(b, &f, 1, stack);
  if (r != MS_OK) return r;
  if (ctx < 16) ctx_stacks[ctx] = *stack;
  return MS_OK;
}

Test(allocator, snapshot_walk_lists_segments_by_address) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_stream_t s1 = new_stream(&e);
  rec_t rec = {0};
  ms__alloc_hooks_t h = {.ctx = &rec, .context_level = MS__CTX_STATE, .trace_enabled = 1,
                         .gather = hook_gather, .trace = hook_trace};
  ms__allocator_set_hooks(e.a, &h);
  ms_devptr_t big = xmalloc(&e, 30 * MiB, 0); /* ctx 1, segment 1 */
  ms_devptr_t a = xmalloc(&e, 1000, 0);       /* ctx 2, small segment */
  ms_devptr_t b = xmalloc(&e, 3000, 0);       /* ctx 3 */
  ms_devptr_t c = xmalloc(&e, 512, 0);        /* ctx 4 */
  ms_allocator_record_stream(e.a, b, s1);
  xfree(&e, b);
  xfree(&e, c);
  (void)big;
  ms__snapbuild_t sb;
  ms__snapbuild_init(&sb);
  ms__alloc_snapinfo_t info;
  cr_assert_eq(ms__allocator_snapshot(e.a, &sb, ctx_stack, &sb, &info), MS_OK);
  cr_assert_eq(info.device, 0);
  cr_assert_eq(info.capacity, 80 * GiB);
  cr_assert_eq(info.nstats, MS_STATS_NKEYS);
  cr_assert_eq(sb.segments.len, 2);
  const ms_snap_segment_t *s0 = &sb.segments.ptr[0], *sm = &sb.segments.ptr[1];
  cr_assert_eq(s0->address, big, "sorted by address");
  cr_assert(s0->is_large);
  cr_assert_eq(s0->nblocks, 1);
  cr_assert_eq(s0->stack, ctx_stacks[1]);
  cr_assert_not(sm->is_large);
  cr_assert_eq(sm->nblocks, 3);
  const ms_snap_block_t *bl = &sb.blocks.ptr[sm->first_block];
  cr_assert_eq(bl[0].state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_eq(bl[0].address, a);
  cr_assert_eq(bl[0].requested_size, 1000);
  cr_assert_eq(bl[0].stack, ctx_stacks[2]);
  cr_assert_eq(bl[1].state, MS_BLOCK_ACTIVE_PENDING_FREE);
  cr_assert_str_eq(bl[1].state_name, "active_pending_free");
  cr_assert_eq(bl[1].stack, ctx_stacks[3]);
  cr_assert_eq(bl[2].state, MS_BLOCK_INACTIVE);
  cr_assert_eq(bl[2].size, 2 * MiB - 1024 - 3072);
  cr_assert_eq(bl[2].stack, MS_SNAP_NO_STACK);
  cr_assert_eq(sm->allocated_size, 1024);
  cr_assert_eq(sm->active_size, 1024 + 3072);
  cr_assert_eq(sm->requested_size, 4000);
  cr_assert_eq(sm->stack, ctx_stacks[2], "the segment's stack is its first malloc's");
  cr_assert_eq(rec.r[rec.n - 1].action, MS_TRACE_SNAPSHOT);
  cr_assert_eq(rec.r[rec.n - 1].size, 30 * MiB + 4096);
  cr_assert_eq(ms__allocator_snapshot_settings(e.a, &sb), MS_OK);
  ms_snapshot_t *snap = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms__snapbuild_finish(&sb, &snap, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(snap->nsettings_top, 9);
  cr_assert_str_eq(snap->settings[0].key, "PYTORCH_CUDA_ALLOC_CONF");
  cr_assert_str_eq(ms_snap_stack_frame(snap, snap->segments[1].stack, 0)->name, "ctx2");
  cr_assert_eq(snap->settings[1].i, -1, "max_split_size unlimited reads -1");
  bool found = false;
  for (size_t i = 0; i < snap->nstats; i++)
    if (strcmp(snap->stats[i].key, "active.all.current") == 0) {
      cr_assert_eq(snap->stats[i].i, 3);
      found = true;
    }
  cr_assert(found);
  ms_snapshot_free(snap);
  ms__snapbuild_release(&sb);
  ms__allocator_set_hooks(e.a, NULL);
  ms_sim_stream_complete(e.b, 0, s1);
  ms_allocator_empty_cache(e.a);
  xfree(&e, a);
  xfree(&e, big);
  env_close(&e);
}

/* ---- caching disabled ("Malloc and its fallback chain", top-level wrapper) ------------------- */

static void caching_disabled_case(env_t *e) {
  ms_stream_t s1 = new_stream(e);
  ms_sim_clear_log(e->b);
  ms_sim_reset_counters(e->b, 0);
  ms_devptr_t p = xmalloc(e, 1000, 0);
  ms_devptr_t q = xmalloc(e, 1000, s1);
  cr_assert_eq(ms_allocator_record_stream(e->a, p, s1), MS_OK, "a no-op, as PyTorch's");
  xfree(e, p);
  ms_devptr_t r = xmalloc(e, 1000, 0); /* not served from a cache: one more device malloc */
  xfree(e, q);
  xfree(e, r);
  ms_devptr_t z = 7;
  cr_assert_eq(ms_allocator_malloc(e->a, 0, 0, &z), MS_OK);
  cr_assert_eq(z, 0);
  char ops[256];
  log_ops(e, ops, sizeof ops);
  cr_assert_str_eq(ops, "malloc malloc device_synchronize free malloc device_synchronize free "
                        "device_synchronize free");
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(e->b, 0, &c), MS_OK);
  cr_assert_eq(c.mallocs, 3);
  cr_assert_eq(c.frees, 3);
  cr_assert_eq(c.live_allocations, 0, "nothing cached");
  /* no statistics, as PyTorch's uncached path */
  cr_assert_eq(stat(e, "num_device_alloc"), 0);
  cr_assert_eq(stat(e, "allocation.all.peak"), 0);
  cr_assert_eq(stat(e, "reserved_bytes.all.peak"), 0);
  /* an OOM is the backend's, without the chain, message or observers */
  ms_sim_clear_log(e->b);
  ms_devptr_t big = 5;
  cr_assert_eq(ms_allocator_malloc(e->a, 200 * MiB, 0, &big), MS_EOOM);
  cr_assert_eq(big, 5);
  log_ops(e, ops, sizeof ops);
  cr_assert_str_eq(ops, "malloc!");
  cr_assert_eq(stat(e, "num_ooms"), 0);
  char msg[64];
  cr_assert_eq(ms_allocator_last_oom_message(e->a, msg, sizeof msg), 0);
  cr_assert_eq(ms_allocator_free(e->a, 0), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(e->a), MS_OK);
}

Test(allocator, caching_disabled_by_config_is_plain_malloc_and_free) {
  ms_sim_config_t sc = {.capacity = 100 * MiB, .log_capacity = 4096};
  env_t e;
  cr_assert_eq(ms_backend_sim_create(&sc, &e.b), MS_OK);
  ms_allocator_config_t ac = {.backend = e.b, .no_caching = true};
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&ac, &e.a, &eb), MS_OK, "%s", eb.msg);
  caching_disabled_case(&e);
  env_close(&e);
}

Test(allocator, caching_disabled_by_environment) {
  static const char *const truthy[] = {"1", "true", "YES", "On"};
  static const char *const falsy[] = {"0", "false", "no", "off", "", "2"};
  ms_sim_config_t sc = {.capacity = 100 * MiB, .log_capacity = 4096};
  for (size_t i = 0; i < sizeof truthy / sizeof *truthy; i++) {
    setenv("MEMSNAP_NO_CACHING", truthy[i], 1);
    env_t e;
    cr_assert_eq(ms_backend_sim_create(&sc, &e.b), MS_OK);
    ms_allocator_config_t ac = {.backend = e.b}; /* alloc NULL: the environment counts */
    cr_assert_eq(ms_allocator_create(&ac, &e.a, NULL), MS_OK);
    caching_disabled_case(&e);
    env_close(&e);
    /* given settings (as replay gives) are not switched by the environment */
    env_open(&e, NULL, 100 * MiB);
    xfree(&e, xmalloc(&e, 1000, 0));
    cr_assert_eq(stat(&e, "num_device_alloc"), 1);
    cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
    env_close(&e);
  }
  for (size_t i = 0; i < sizeof falsy / sizeof *falsy; i++) {
    setenv("MEMSNAP_NO_CACHING", falsy[i], 1);
    env_t e;
    cr_assert_eq(ms_backend_sim_create(&sc, &e.b), MS_OK);
    ms_allocator_config_t ac = {.backend = e.b};
    cr_assert_eq(ms_allocator_create(&ac, &e.a, NULL), MS_OK);
    xfree(&e, xmalloc(&e, 1000, 0));
    ms_sim_reset_counters(e.b, 0);
    xfree(&e, xmalloc(&e, 1000, 0));
    ms_sim_counters_t c;
    cr_assert_eq(ms_sim_get_counters(e.b, 0, &c), MS_OK);
    cr_assert_eq(c.mallocs + c.frees, 0, "'%s' keeps caching on", falsy[i]);
    cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
    env_close(&e);
  }
  unsetenv("MEMSNAP_NO_CACHING");
}

/* ---- MemPool options: no_split, use_on_oom ("Private pools and CUDA graphs") ----------------- */

Test(allocator, no_split_pool_hands_out_whole_blocks) {
  env_t e;
  env_open(&e, NULL, 0);
  ms_pool_id_t ns = ms_pool_id_new(false), plain = ms_pool_id_new(false);
  ms_pool_options_t o = {.no_split = true};
  cr_assert_eq(ms_allocator_set_pool_options(e.a, (ms_pool_id_t){0, 0}, &o), MS_EINVAL);
  cr_assert_eq(ms_allocator_set_pool_options(e.a, ns, NULL), MS_EINVAL);
  cr_assert_eq(ms_allocator_set_pool_options(e.a, ns, &o), MS_OK); /* before the pool exists */
  /* the same requests in each pool: 1000 B twice (small), 4 MiB twice (large, 20 MiB segment) */
  static const struct {
    size_t size;
    int64_t segments_plain, segments_ns;
  } steps[] = {{1000, 1, 1}, {1000, 1, 2}, {4 * MiB, 2, 3}, {4 * MiB, 2, 4}};
  ms_devptr_t kept[2][4];
  for (int which = 0; which < 2; which++) {
    ms_pool_id_t id = which ? ns : plain;
    cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, id, NULL, NULL), MS_OK);
    int64_t seg0 = stat(&e, "segment.all.current");
    for (int i = 0; i < 4; i++) {
      kept[which][i] = xmalloc(&e, steps[i].size, 0);
      int64_t want = which ? steps[i].segments_ns : steps[i].segments_plain;
      cr_assert_eq(stat(&e, "segment.all.current") - seg0, want, "pool %d step %d", which, i);
    }
    cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, id), MS_OK);
    check(&e);
  }
  /* no_split: every block is its whole segment */
  cr_assert_eq(stat(&e, "allocated_bytes.all.current"),
               (int64_t)(2 * 1024 + 2 * 4 * MiB) + (int64_t)(2 * 2 * MiB + 2 * 20 * MiB));
  cr_assert_eq(stat(&e, "inactive_split.all.current"), 2, "only the plain pool's remainders");
  /* the option can be taken back: later allocations of the pool split again */
  for (int i = 0; i < 4; i++) xfree(&e, kept[1][i]);
  o.no_split = false;
  cr_assert_eq(ms_allocator_set_pool_options(e.a, ns, &o), MS_OK);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, ns, NULL, NULL), MS_OK);
  ms_devptr_t x = xmalloc(&e, 1000, 0);
  cr_assert_eq(stat(&e, "inactive_split.all.current"), 3);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, ns), MS_OK);
  xfree(&e, x);
  for (int i = 0; i < 4; i++) xfree(&e, kept[0][i]);
  cr_assert_eq(ms_allocator_release_pool(e.a, ns), MS_OK); /* begun twice: two references */
  cr_assert_eq(ms_allocator_release_pool(e.a, ns), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(e.a, plain), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  cr_assert_eq(stat(&e, "segment.all.current"), 0);
  env_close(&e);
}

/* A default-pool malloc of 1000 B on a full device that holds: a 2 MiB small segment cached in
 * MemPool u, a live 20 MiB block, and a cached 24 MiB oversize segment (max_split_size 20 MiB)
 * that release_available_cached_blocks would free. */
static void use_on_oom_case(bool use_on_oom, const char *want_ops, bool want_from_pool) {
  env_t e;
  env_open(&e, "max_split_size_mb:20", 46 * MiB);
  ms_pool_id_t u = ms_pool_id_new(false);
  ms_pool_options_t o = {.use_on_oom = use_on_oom};
  cr_assert_eq(ms_allocator_set_pool_options(e.a, u, &o), MS_OK);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, u, NULL, NULL), MS_OK);
  ms_devptr_t in_u = xmalloc(&e, 1000, 0);
  xfree(&e, in_u);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, u), MS_OK);
  ms_devptr_t live = xmalloc(&e, 20 * MiB, 0);
  xfree(&e, xmalloc(&e, 24 * MiB, 0));
  cr_assert_eq(stat(&e, "reserved_bytes.all.current"), (int64_t)(46 * MiB));
  ms_sim_clear_log(e.b);
  ms_devptr_t p = xmalloc(&e, 1000, 0);
  char ops[256];
  log_ops(&e, ops, sizeof ops);
  cr_assert_str_eq(ops, want_ops);
  cr_assert_eq(p == in_u, want_from_pool);
  check(&e);
  if (want_from_pool) {
    cr_assert_eq(stat(&e, "num_alloc_retries"), 0);
    cr_assert_eq(stat(&e, "reserved_bytes.all.current"), (int64_t)(46 * MiB), "nothing released");
    /* a malloc routed to a private pool never takes the fallback (u's remainder would fit) */
    ms_pool_id_t v = ms_pool_id_new(false);
    cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, v, NULL, NULL), MS_OK);
    ms_devptr_t q = 5;
    ms_sim_clear_log(e.b);
    cr_assert_eq(ms_allocator_malloc(e.a, 1000, 0, &q), MS_EOOM);
    cr_assert_eq(q, 5);
    log_ops(&e, ops, sizeof ops);
    cr_assert_str_eq(ops, "malloc! mem_info");
    cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, v), MS_OK);
    cr_assert_eq(ms_allocator_release_pool(e.a, v), MS_OK);
  }
  xfree(&e, p); /* back to u when it came from there */
  xfree(&e, live);
  cr_assert_eq(ms_allocator_release_pool(e.a, u), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  cr_assert_eq(stat(&e, "segment.all.current"), 0);
  env_close(&e);
}

Test(allocator, use_on_oom_pool_is_tried_after_the_device_malloc_before_releasing) {
  /* with use_on_oom: the device malloc fails, u's cached block serves; nothing is released */
  use_on_oom_case(true, "malloc!", true);
  /* without: release_available_cached_blocks frees the oversize segment and retries */
  use_on_oom_case(false, "malloc! free malloc", false);
}

Test(allocator, use_on_oom_pools_in_id_order_and_released_ones_skipped) {
  env_t e;
  env_open(&e, NULL, 6 * MiB);
  ms_pool_id_t u1 = ms_pool_id_new(false), u2 = ms_pool_id_new(false);
  ms_pool_options_t o = {.use_on_oom = true};
  /* options set in reverse id order: the fallback still tries u1 first */
  cr_assert_eq(ms_allocator_set_pool_options(e.a, u2, &o), MS_OK);
  cr_assert_eq(ms_allocator_set_pool_options(e.a, u1, &o), MS_OK);
  ms_devptr_t cached[2];
  ms_pool_id_t ids[2] = {u2, u1};
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(ms_allocator_begin_allocate_to_pool(e.a, ids[i], NULL, NULL), MS_OK);
    cached[i] = xmalloc(&e, 1000, 0);
    xfree(&e, cached[i]);
    cr_assert_eq(ms_allocator_end_allocate_to_pool(e.a, ids[i]), MS_OK);
  }
  ms_devptr_t live = xmalloc(&e, 1 * MiB, 0); /* the third 2 MiB segment fills the device */
  ms_devptr_t fill = xmalloc(&e, 1 * MiB, 0);
  ms_devptr_t a1 = xmalloc(&e, 1000, 0);
  cr_assert_eq(a1, cached[1], "u1 (lower id) first");
  /* u1 still has a free remainder; release u1: the next fallback skips it for u2 */
  cr_assert_eq(ms_allocator_release_pool(e.a, u1), MS_OK);
  ms_devptr_t a2 = xmalloc(&e, 1000, 0);
  cr_assert_eq(a2, cached[0], "released u1 skipped, u2 served");
  /* all options false: the id is forgotten, no fallback any more */
  o.use_on_oom = false;
  cr_assert_eq(ms_allocator_set_pool_options(e.a, u2, &o), MS_OK);
  ms_devptr_t z = 9;
  cr_assert_eq(ms_allocator_malloc(e.a, 1000, 0, &z), MS_EOOM);
  cr_assert_eq(z, 9);
  check(&e);
  xfree(&e, a1);
  xfree(&e, a2);
  xfree(&e, live);
  xfree(&e, fill);
  cr_assert_eq(ms_allocator_release_pool(e.a, u2), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(e.a), MS_OK);
  cr_assert_eq(stat(&e, "segment.all.current"), 0);
  env_close(&e);
}
