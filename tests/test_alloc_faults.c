/* SPDX-License-Identifier: MIT
 * The allocator's failure paths (issue #15), on any machine: a backend that wraps the simulated
 * device and makes chosen operations fail ("the nth call of op from now returns err"), and that
 * can report a capture under way, a granularity, and per-thread stream keys. The same paths are
 * driven through the real cuda backend by tests/test_cuda_fake.c where a CUDA Toolkit is found;
 * these tests keep them covered in builds without one.
 *
 * Each test checks the error that reaches the caller and the books (statistics and the sim's own
 * count of live device memory).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/allocator.h"
#include "memsnap/backend.h"

#define MiB ((size_t)1 << 20)

/* ---- the faulty backend ------------------------------------------------------------------- */

enum fop { F_MALLOC, F_FREE, F_EV_RECORD, F_EV_QUERY, F_EV_SYNC, F_DEV_SYNC, F_MAP, F_UNMAP, F_N };

typedef struct faulty_s {
  ms_backend_t *sim;
  const ms_backend_ops_t *s;
  pthread_mutex_t mu;
  unsigned countdown[F_N]; /* 0: no rule; n: the nth call from now fails */
  unsigned times[F_N];     /* ... and so many calls in a row */
  int err[F_N];
  unsigned calls[F_N];
  bool capturing;     /* stream_capture_info says so for every stream */
  size_t granularity; /* mem_granularity's answer (0: the op is absent) */
} faulty_t;

static faulty_t F;

static int faulty_hit(enum fop op) {
  pthread_mutex_lock(&F.mu);
  F.calls[op]++;
  int r = MS_OK;
  if (F.countdown[op] > 1) {
    F.countdown[op]--;
  } else if (F.countdown[op] == 1) {
    r = F.err[op];
    if (--F.times[op] == 0) F.countdown[op] = 0;
  }
  pthread_mutex_unlock(&F.mu);
  return r;
}

static void fail_nth(enum fop op, unsigned nth, int err, unsigned times) {
  pthread_mutex_lock(&F.mu);
  F.countdown[op] = nth;
  F.times[op] = times;
  F.err[op] = err;
  pthread_mutex_unlock(&F.mu);
}

#define WRAP(op, call)                                                                             \
  do {                                                                                             \
    int r_ = faulty_hit(op);                                                                       \
    return r_ != MS_OK ? r_ : (call);                                                              \
  } while (0)

static int f_count(void *c, int *n) {
  (void)c;
  return F.s->device_count(F.s->ctx, n);
}
static int f_malloc(void *c, int d, size_t sz, ms_stream_t st, ms_devptr_t *o) {
  (void)c;
  WRAP(F_MALLOC, F.s->malloc(F.s->ctx, d, sz, st, o));
}
static int f_free(void *c, int d, ms_devptr_t p) {
  (void)c;
  WRAP(F_FREE, F.s->free(F.s->ctx, d, p));
}
static int f_mem_info(void *c, int d, size_t *f, size_t *t) {
  (void)c;
  return F.s->mem_info(F.s->ctx, d, f, t);
}
static int f_stream_create(void *c, int d, ms_stream_t *o) {
  (void)c;
  return F.s->stream_create(F.s->ctx, d, o);
}
static int f_stream_destroy(void *c, int d, ms_stream_t s) {
  (void)c;
  return F.s->stream_destroy(F.s->ctx, d, s);
}
static int f_event_create(void *c, int d, ms_event_t *o) {
  (void)c;
  return F.s->event_create(F.s->ctx, d, o);
}
static int f_event_record(void *c, int d, ms_event_t e, ms_stream_t s) {
  (void)c;
  WRAP(F_EV_RECORD, F.s->event_record(F.s->ctx, d, e, s));
}
static int f_event_query(void *c, int d, ms_event_t e, bool *done) {
  (void)c;
  WRAP(F_EV_QUERY, F.s->event_query(F.s->ctx, d, e, done));
}
static int f_event_sync(void *c, int d, ms_event_t e) {
  (void)c;
  WRAP(F_EV_SYNC, F.s->event_synchronize(F.s->ctx, d, e));
}
static int f_event_destroy(void *c, int d, ms_event_t e) {
  (void)c;
  return F.s->event_destroy(F.s->ctx, d, e);
}
static int f_dev_sync(void *c, int d) {
  (void)c;
  WRAP(F_DEV_SYNC, F.s->device_synchronize(F.s->ctx, d));
}
static int f_va_reserve(void *c, int d, size_t sz, ms_devptr_t *o) {
  (void)c;
  return F.s->va_reserve(F.s->ctx, d, sz, o);
}
static int f_va_release(void *c, int d, ms_devptr_t p, size_t sz) {
  (void)c;
  return F.s->va_release(F.s->ctx, d, p, sz);
}
static int f_map(void *c, int d, ms_devptr_t p, size_t sz) {
  (void)c;
  WRAP(F_MAP, F.s->mem_map(F.s->ctx, d, p, sz));
}
static int f_unmap(void *c, int d, ms_devptr_t p, size_t sz) {
  (void)c;
  WRAP(F_UNMAP, F.s->mem_unmap(F.s->ctx, d, p, sz));
}
static int f_capture(void *c, int d, ms_stream_t s, bool *cap, uint64_t *id) {
  (void)c, (void)d, (void)s;
  *cap = F.capturing;
  *id = F.capturing ? 42 : 0;
  return MS_OK;
}
static int f_granularity(void *c, int d, size_t *g) {
  (void)c, (void)d;
  *g = F.granularity;
  return MS_OK;
}
/* Handle 1000 + k names "the per-thread stream" of whoever calls: key 2000 + (thread's k). */
static __thread int my_thread_stream;
static int f_stream_key(void *c, int d, ms_stream_t s, ms_stream_t *key) {
  (void)c, (void)d;
  *key = s == 1000 ? (ms_stream_t)(2000 + my_thread_stream) : s;
  return MS_OK;
}

static ms_backend_t *faulty_open(size_t capacity, bool with_granularity) {
  memset(&F, 0, sizeof F);
  pthread_mutex_init(&F.mu, NULL);
  ms_sim_config_t sc = {.capacity = capacity, .auto_complete_events = false};
  cr_assert_eq(ms_backend_sim_create(&sc, &F.sim), MS_OK);
  F.s = ms_backend_ops(F.sim);
  F.granularity = 2 * MiB;
  ms_backend_ops_t ops = {
      .name = "faulty",
      .device_count = f_count,
      .malloc = f_malloc,
      .free = f_free,
      .mem_info = f_mem_info,
      .stream_create = f_stream_create,
      .stream_destroy = f_stream_destroy,
      .event_create = f_event_create,
      .event_record = f_event_record,
      .event_query = f_event_query,
      .event_synchronize = f_event_sync,
      .event_destroy = f_event_destroy,
      .device_synchronize = f_dev_sync,
      .va_reserve = f_va_reserve,
      .va_release = f_va_release,
      .mem_map = f_map,
      .mem_unmap = f_unmap,
      .stream_capture_info = f_capture,
      .stream_key = f_stream_key,
      .mem_granularity = with_granularity ? f_granularity : NULL,
  };
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_create(&ops, &b), MS_OK);
  ms_stream_t s1, s2; /* streams 1 and 2 of the sim */
  cr_assert_eq(F.s->stream_create(F.s->ctx, 0, &s1), MS_OK);
  cr_assert_eq(F.s->stream_create(F.s->ctx, 0, &s2), MS_OK);
  cr_assert(s1 == 1 && s2 == 2);
  return b;
}

static void faulty_close(ms_backend_t *b) {
  ms_backend_destroy(b);
  ms_backend_destroy(F.sim);
  pthread_mutex_destroy(&F.mu);
}

static ms_allocator_t *alloc_on(ms_backend_t *b, bool expandable) {
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  conf.expandable_segments = expandable;
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = &conf};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  return a;
}

static ms_stats_t st(ms_allocator_t *a) {
  ms_stats_t s = MS_STATS_INIT;
  cr_assert_eq(ms_allocator_get_stats(a, &s), MS_OK);
  return s;
}
#define RESERVED(a) (st(a).reserved_bytes[MS_STAT_ALL].current)
#define ACTIVE(a) (st(a).active_bytes[MS_STAT_ALL].current)

static ms_sim_counters_t simc(void) {
  ms_sim_counters_t c;
  cr_assert_eq(ms_sim_get_counters(F.sim, 0, &c), MS_OK);
  return c;
}

static void quiet(const char *msg, void *arg) {
  (void)msg, (void)arg;
}
static void setup(void) {
  ms_set_output(quiet, NULL);
}
static void teardown(void) {
  ms_set_output(NULL, NULL);
}
TestSuite(alloc_faults, .init = setup, .fini = teardown, .timeout = 30);

/* ---- the tests ---------------------------------------------------------------------------- */

Test(alloc_faults, a_failed_free_stays_on_the_books) {
  ms_backend_t *b = faulty_open(1024 * MiB, true);
  ms_allocator_t *a = alloc_on(b, false);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  fail_nth(F_FREE, 1, MS_EBACKEND, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  cr_assert_eq(RESERVED(a), (int64_t)(30 * MiB));
  cr_assert_eq(st(a).segment[MS_STAT_ALL].current, 1);
  cr_assert_eq(st(a).num_device_free, 0);
  cr_assert_eq(simc().live_allocations, 1);
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &q), MS_OK);
  cr_assert_eq(q, p, "still usable");
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  /* On the OOM path: an error, not an OOM. */
  fail_nth(F_FREE, 1, MS_EBACKEND, 1);
  cr_assert_eq(ms_allocator_malloc(a, 1000 * MiB, 0, &q), MS_EBACKEND);
  cr_assert_eq(st(a).num_ooms, 0);
  cr_assert_eq(RESERVED(a), (int64_t)(30 * MiB));
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(simc().live_allocations, 0);
  ms_allocator_destroy(a);
  faulty_close(b);
}

Test(alloc_faults, a_failed_event_record_keeps_the_block_pending_and_is_retried) {
  ms_backend_t *b = faulty_open(1024 * MiB, true);
  ms_allocator_t *a = alloc_on(b, false);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, 2), MS_OK);
  fail_nth(F_EV_RECORD, 1, MS_EBACKEND, 1);
  cr_assert_eq(ms_allocator_free(a, p), MS_EBACKEND);
  cr_assert_eq(simc().device_syncs, 0, "no synchronization instead");
  cr_assert_eq(ACTIVE(a), (int64_t)(4 * MiB), "pending");
  unsigned before = F.calls[F_EV_RECORD];
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1, &q), MS_OK);
  cr_assert_neq(q, p, "a pending block was reused");
  cr_assert_eq(F.calls[F_EV_RECORD], before + 1, "the record is retried");
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_sim_stream_complete(F.sim, 0, 2), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1, &q), MS_OK);
  cr_assert_eq(ACTIVE(a), (int64_t)(4 * MiB), "the event completed: p is free");
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  ms_allocator_destroy(a);
  faulty_close(b);
}

Test(alloc_faults, failed_event_query_and_synchronize_are_returned_and_keep_the_block) {
  ms_backend_t *b = faulty_open(1024 * MiB, true);
  ms_allocator_t *a = alloc_on(b, false);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, 2), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  fail_nth(F_EV_QUERY, 1, MS_EBACKEND, 1);
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1, &q), MS_EBACKEND);
  cr_assert_eq(ACTIVE(a), (int64_t)(4 * MiB));
  fail_nth(F_EV_SYNC, 1, MS_EBACKEND, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  cr_assert_eq(ACTIVE(a), (int64_t)(4 * MiB), "still pending");
  cr_assert_eq(RESERVED(a), (int64_t)(20 * MiB), "its 20 MiB segment stays");
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(ACTIVE(a), 0);
  cr_assert_eq(RESERVED(a), 0);
  ms_allocator_destroy(a);
  faulty_close(b);
}

Test(alloc_faults, expandable_map_failures_are_oom_only_when_out_of_memory) {
  ms_backend_t *b = faulty_open(1024 * MiB, true);
  ms_allocator_t *a = alloc_on(b, true);
  ms_devptr_t p = 0xbeef;
  fail_nth(F_MAP, 2, MS_EBACKEND, 1); /* the second page of three */
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &p), MS_EBACKEND);
  cr_assert_eq(p, 0xbeef);
  cr_assert_eq(st(a).num_ooms, 0);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(simc().used_bytes, 0, "the first page is unmapped again");
  fail_nth(F_MAP, 1, MS_EOOM, 2); /* the map and its retry after the release */
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &p), MS_EOOM);
  cr_assert_eq(st(a).num_ooms, 1);
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &p), MS_OK);
  cr_assert_eq(simc().mem_maps - simc().mem_unmaps, 3, "three 20 MiB pages, one map each");
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  /* A failed unmap keeps the pages; a later release returns them. */
  fail_nth(F_UNMAP, 2, MS_EBACKEND, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  cr_assert_eq(RESERVED(a), (int64_t)(40 * MiB), "the first page went, two stay");
  cr_assert_eq(simc().used_bytes, 40 * MiB);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(simc().used_bytes, 0);
  ms_allocator_destroy(a);
  faulty_close(b);
}

Test(alloc_faults, page_sizes_must_be_multiples_of_the_granularity) {
  ms_backend_t *b = faulty_open(1024 * MiB, true);
  F.granularity = 8 * MiB;
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  conf.expandable_segments = true;
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = &conf};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_ECONFIG);
  cr_assert(strstr(eb.msg, "granularity (8388608 bytes)") != NULL, "%s", eb.msg);
  conf.expandable_segments = false;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_destroy(a);
  faulty_close(b);
}

/* A backend without mem_granularity maps multiples of 2 MiB: an odd large_segment_size_mb with
 * expandable segments is refused at creation, with the reason. Before, the allocator was created
 * and every large malloc failed with MS_EINVAL (found by tests/fuzz/fuzz_alloc_conf.c). */
Test(alloc_faults, odd_large_segment_size_refused_without_granularity_op) {
  ms_sim_config_t sc = {1, 64 * MiB, false, true, 0};
  ms_backend_t *b = NULL;
  cr_assert_eq(ms_backend_sim_create(&sc, &b), MS_OK);
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_alloc_config_parse(&conf, "expandable_segments:True,large_segment_size_mb:31", &eb),
               MS_OK);
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = &conf};
  ms_allocator_t *a = NULL;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_ECONFIG);
  cr_expect_str_eq(eb.msg, "expandable_segments: the page sizes (2097152 and large_segment_size "
                           "32505856 bytes) must be multiples of device 0's allocation granularity "
                           "(2097152 bytes)");
  /* a multiple of 2 MiB: created, and a large malloc works */
  ms_alloc_config_init(&conf);
  cr_assert_eq(ms_alloc_config_parse(&conf, "expandable_segments:True,large_segment_size_mb:32", &eb),
               MS_OK);
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  ms_devptr_t p = 0;
  cr_expect_eq(ms_allocator_malloc(a, 10 * MiB - 1, 0, &p), MS_OK);
  cr_expect_eq(ms_allocator_free(a, p), MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

static bool stream9(void *arg, ms_stream_t s) {
  (void)arg;
  return s == 9;
}

Test(alloc_faults, nothing_is_released_while_a_capture_is_under_way) {
  ms_backend_t *b = faulty_open(64 * MiB, true);
  ms_allocator_t *a = alloc_on(b, false);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  /* A capture the backend reports (no routing): empty_cache and an OOM release nothing. */
  F.capturing = true;
  ms_sim_counters_t c0 = simc();
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &q), MS_EOOM);
  ms_sim_counters_t c1 = simc();
  cr_assert_eq(c1.frees, c0.frees);
  cr_assert_eq(c1.device_syncs, c0.device_syncs);
  cr_assert_eq(c1.event_syncs, c0.event_syncs);
  cr_assert_eq(RESERVED(a), (int64_t)(30 * MiB));
  F.capturing = false;
  /* A routing (an announced capture) is enough, whatever the backend says. */
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(a, id, stream9, NULL), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(simc().frees, c0.frees);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(a, id), MS_OK);
  /* After it, the same request releases the cache and succeeds. */
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &q), MS_OK);
  cr_assert_eq(simc().frees, c0.frees + 1);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  ms_allocator_destroy(a);
  faulty_close(b);
}

static bool callback_empties(void *arg) {
  return ms_allocator_empty_cache((ms_allocator_t *)arg) == MS_OK;
}

Test(alloc_faults, a_free_memory_callback_may_call_back_into_the_allocator, .timeout = 10) {
  ms_backend_t *b = faulty_open(64 * MiB, true);
  ms_allocator_t *a = alloc_on(b, false);
  cr_assert_eq(ms_allocator_add_free_memory_callback(a, callback_empties, a), MS_OK);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 40 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &q), MS_OK, "deadlocked or failed");
  cr_assert_eq(simc().live_allocations, 1);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  ms_allocator_destroy(a);
  faulty_close(b);
}

typedef struct keyed_s {
  ms_allocator_t *a;
  ms_devptr_t got;
} keyed_t;

static void *other_thread(void *arg) {
  keyed_t *k = arg;
  my_thread_stream = 2;
  if (ms_allocator_malloc(k->a, 4 * MiB, 1000, &k->got) == MS_OK)
    (void)ms_allocator_free(k->a, k->got);
  return NULL;
}

Test(alloc_faults, pools_are_keyed_by_the_backends_stream_key) {
  ms_backend_t *b = faulty_open(1024 * MiB, true);
  ms_allocator_t *a = alloc_on(b, false);
  my_thread_stream = 1;
  ms_devptr_t mine, again;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1000, &mine), MS_OK);
  cr_assert_eq(ms_allocator_free(a, mine), MS_OK);
  keyed_t k = {.a = a};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, other_thread, &k), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_neq(k.got, 0);
  cr_assert_neq(k.got, mine, "the same handle on another thread is another stream");
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 1000, &again), MS_OK);
  cr_assert_eq(again, mine);
  cr_assert_eq(ms_allocator_free(a, again), MS_OK);
  ms_allocator_destroy(a);
  faulty_close(b);
}
