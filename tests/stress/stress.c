/* SPDX-License-Identifier: MIT
 * Deterministic multi-threaded stress of the caching allocator (mimalloc's test-stress pattern).
 *
 *   stress [SCALE [THREADS]]     SCALE: thousands of operations per thread (default 50),
 *                                THREADS: default 2
 *
 * Each thread runs its own xorshift sequence of malloc (log-uniform sizes on its own streams and
 * the shared default stream), free, record_stream onto another thread's stream, empty_cache and
 * get_stats, and hands some of its live blocks to the next thread, which frees them (cross-thread
 * frees). The device is small enough that OOMs happen; an OOM observer reads the statistics from
 * inside the callback (it runs outside the allocator's lock). At the end every block is freed and
 * the invariant checker and the device's counters must show a clean state. Exit status 0 = pass.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "memsnap/allocator.h"

#define MAX_THREADS 16
#define LIVE 256
#define HANDOFF 64

static ms_backend_t *backend;
static ms_allocator_t *alloc;
static int nthreads = 2;
static long ops_per_thread = 50000;
static ms_stream_t streams[MAX_THREADS];
static atomic_long oom_count, observer_calls;

typedef struct handoff_s {
  pthread_mutex_t mu;
  ms_devptr_t ptr[HANDOFF];
  int n;
} handoff_t;
static handoff_t handoff[MAX_THREADS];

static int failures;
#define FAIL(...)                                   \
  do {                                              \
    fprintf(stderr, "stress: error: " __VA_ARGS__); \
    fputc('\n', stderr);                            \
    __atomic_add_fetch(&failures, 1, __ATOMIC_SEQ_CST); \
  } while (0)

static uint64_t next(uint64_t *s) {
  *s ^= *s << 13;
  *s ^= *s >> 7;
  *s ^= *s << 17;
  return *s;
}

static size_t rnd_size(uint64_t *s) {
  unsigned bits = 9 + (unsigned)(next(s) % 16); /* 512 B .. 16 MiB */
  size_t base = (size_t)1 << bits;
  return base + (size_t)(next(s) % base);
}

static void observer(void *arg, int device, size_t alloc_size, size_t total, size_t free_bytes) {
  (void)arg;
  (void)device;
  (void)alloc_size;
  (void)free_bytes;
  ms_stats_t st = MS_STATS_INIT;
  if (ms_allocator_get_stats(alloc, &st) != MS_OK) FAIL("get_stats in the observer");
  if (st.num_ooms < 1 || total == 0) FAIL("observer saw num_ooms %lld", (long long)st.num_ooms);
  atomic_fetch_add(&observer_calls, 1);
}

static void *worker(void *arg) {
  int id = (int)(intptr_t)arg;
  uint64_t seed = 0x9e3779b97f4a7c15ULL * (uint64_t)(id + 1);
  ms_devptr_t live[LIVE];
  int nlive = 0;
  for (long i = 0; i < ops_per_thread; i++) {
    unsigned op = (unsigned)(next(&seed) % 100);
    if (op < 48 && nlive < LIVE) {
      ms_stream_t s = next(&seed) & 1 ? streams[id] : 0;
      ms_devptr_t p = 0;
      int r = ms_allocator_malloc(alloc, rnd_size(&seed), s, &p);
      if (r == MS_OK) live[nlive++] = p;
      else if (r == MS_EOOM) atomic_fetch_add(&oom_count, 1);
      else FAIL("malloc: %s", ms_err_name(r));
    } else if (op < 90 && nlive) {
      int k = (int)(next(&seed) % (uint64_t)nlive);
      if (ms_allocator_free(alloc, live[k]) != MS_OK) FAIL("free");
      live[k] = live[--nlive];
    } else if (op < 94 && nlive) {
      int other = (int)(next(&seed) % (uint64_t)nthreads);
      if (ms_allocator_record_stream(alloc, live[next(&seed) % (uint64_t)nlive], streams[other]))
        FAIL("record_stream");
    } else if (op < 96) {
      ms_sim_stream_complete(backend, 0, streams[next(&seed) % (uint64_t)nthreads]);
    } else if (op < 97) {
      if (ms_allocator_empty_cache(alloc) != MS_OK) FAIL("empty_cache");
    } else if (op < 98) {
      ms_stats_t st = MS_STATS_INIT;
      if (ms_allocator_get_stats(alloc, &st) != MS_OK) FAIL("get_stats");
      if (st.allocated_bytes[MS_STAT_ALL].current > st.reserved_bytes[MS_STAT_ALL].current)
        FAIL("allocated > reserved");
    } else if (nlive) {
      /* hand a block to the next thread, and free what others handed us */
      handoff_t *h = &handoff[(id + 1) % nthreads];
      pthread_mutex_lock(&h->mu);
      if (h->n < HANDOFF) {
        h->ptr[h->n++] = live[--nlive];
      }
      pthread_mutex_unlock(&h->mu);
      handoff_t *mine = &handoff[id];
      pthread_mutex_lock(&mine->mu);
      while (mine->n)
        if (ms_allocator_free(alloc, mine->ptr[--mine->n]) != MS_OK) FAIL("cross-thread free");
      pthread_mutex_unlock(&mine->mu);
    }
  }
  while (nlive)
    if (ms_allocator_free(alloc, live[--nlive]) != MS_OK) FAIL("final free");
  return NULL;
}

int main(int argc, char **argv) {
  if (argc > 1) ops_per_thread = atol(argv[1]) * 1000;
  if (argc > 2) nthreads = atoi(argv[2]);
  if (ops_per_thread <= 0 || nthreads < 1 || nthreads > MAX_THREADS) {
    fprintf(stderr, "usage: stress [SCALE [THREADS]]\n");
    return 2;
  }
  ms_sim_config_t sc = {.capacity = (size_t)768 << 20};
  ms_errbuf_t eb;
  if (ms_backend_sim_create(&sc, &backend) != MS_OK) return 1;
  ms_allocator_config_t ac = {.backend = backend};
  if (ms_allocator_create(&ac, &alloc, &eb) != MS_OK) {
    fprintf(stderr, "stress: error: %s\n", eb.msg);
    return 1;
  }
  if (ms_allocator_attach_oom_observer(alloc, observer, NULL) != MS_OK) return 1;
  const ms_backend_ops_t *o = ms_backend_ops(backend);
  pthread_t th[MAX_THREADS];
  for (int i = 0; i < nthreads; i++) {
    if (o->stream_create(o->ctx, 0, &streams[i]) != MS_OK) return 1;
    pthread_mutex_init(&handoff[i].mu, NULL);
  }
  for (int i = 0; i < nthreads; i++) pthread_create(&th[i], NULL, worker, (void *)(intptr_t)i);
  for (int i = 0; i < nthreads; i++) pthread_join(th[i], NULL);
  for (int i = 0; i < nthreads; i++)
    while (handoff[i].n) ms_allocator_free(alloc, handoff[i].ptr[--handoff[i].n]);
  if (ms__allocator_check(alloc, &eb) != MS_OK) FAIL("invariant: %s", eb.msg);
  if (ms_allocator_empty_cache(alloc) != MS_OK) FAIL("empty_cache");
  ms_stats_t st = MS_STATS_INIT;
  ms_allocator_get_stats(alloc, &st);
  if (st.reserved_bytes[MS_STAT_ALL].current || st.active[MS_STAT_ALL].current)
    FAIL("state left: reserved %lld active %lld", (long long)st.reserved_bytes[0].current,
         (long long)st.active[0].current);
  if (st.num_ooms != atomic_load(&oom_count) || atomic_load(&observer_calls) != st.num_ooms)
    FAIL("num_ooms %lld, seen %ld, observer %ld", (long long)st.num_ooms, atomic_load(&oom_count),
         atomic_load(&observer_calls));
  if (ms__allocator_check(alloc, &eb) != MS_OK) FAIL("invariant: %s", eb.msg);
  ms_allocator_destroy(alloc);
  ms_sim_counters_t c;
  ms_sim_get_counters(backend, 0, &c);
  if (c.live_allocations) FAIL("%zu segments left on the device", c.live_allocations);
  ms_backend_destroy(backend);
  printf("stress: %d threads x %ld ops: %lld device mallocs, %lld OOMs, %s\n", nthreads,
         ops_per_thread, (long long)st.num_device_alloc, (long long)st.num_ooms,
         failures ? "FAILED" : "ok");
  return failures ? 1 : 0;
}
