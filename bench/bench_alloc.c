/* SPDX-License-Identifier: MIT
 * Allocator fast-path benchmark (issue #2, §7), on the sim backend with history off, against glibc
 * malloc/free measured in the same run with the same sequences:
 *   alloc_hit_pair_ns / glibc_hit_pair_ns      malloc+free of one 4 KiB block, warm cache;
 *   alloc_churn_pair_ns / glibc_churn_pair_ns  4,096 live blocks, sizes log-uniform in
 *                                              [512 B, 32 MiB]: free a random live block and
 *                                              allocate a new one, one stream.
 * Every figure is the median of 7 repetitions after a warm-up pass. Prints "metric value" lines.
 *
 * Time is the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not wall time: on the shared 2-core
 * machines these run on, other jobs steal the CPU for whole scheduler slices, which wall time
 * would charge to whichever loop was running. Both allocators are measured the same way.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "memsnap/allocator.h"

#define REPS 7
#define HIT_ITERS 2000000
#define LIVE 4096
#define CHURN_STEPS 20000

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

static uint64_t rng = 0x9e3779b97f4a7c15ULL;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

/* log-uniform in [512, 32 MiB] */
static size_t rnd_size(void) {
  double u = (double)(next() >> 11) / 9007199254740992.0;
  double lo = 9.0, hi = 25.0; /* log2 */
  return (size_t)__builtin_exp2(lo + u * (hi - lo));
}

static volatile uintptr_t sink;

static void die(const char *what) {
  fprintf(stderr, "bench_alloc: error: %s\n", what);
  exit(1);
}

int main(void) {
  ms_backend_t *b = NULL;
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  if (ms_backend_sim_create(NULL, &b) != MS_OK) die("sim backend");
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  ms_allocator_config_t ac = {.backend = b, .alloc = &conf};
  if (ms_allocator_create(&ac, &a, &eb) != MS_OK) die(eb.msg);

  double t[REPS];
  /* ---- hit pair ---- */
  ms_devptr_t p;
  for (int i = 0; i < 1000; i++) {
    if (ms_allocator_malloc(a, 4096, 0, &p) != MS_OK) die("malloc");
    ms_allocator_free(a, p);
  }
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < HIT_ITERS; i++) {
      if (ms_allocator_malloc(a, 4096, 0, &p) != MS_OK) die("malloc");
      ms_allocator_free(a, p);
    }
    t[r] = (now_ns() - t0) / HIT_ITERS;
  }
  printf("alloc_hit_pair_ns %.2f\n", median(t, REPS));
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < HIT_ITERS; i++) {
      void *q = malloc(4096);
      sink = (uintptr_t)q;
      free(q);
    }
    t[r] = (now_ns() - t0) / HIT_ITERS;
  }
  printf("glibc_hit_pair_ns %.2f\n", median(t, REPS));

  /* ---- churn: one precomputed sequence for both allocators ---- */
  size_t *sizes = malloc(sizeof *sizes * (LIVE + CHURN_STEPS));
  uint32_t *slots = malloc(sizeof *slots * CHURN_STEPS);
  ms_devptr_t *dlive = malloc(sizeof *dlive * LIVE);
  void **hlive = malloc(sizeof *hlive * LIVE);
  if (!sizes || !slots || !dlive || !hlive) die("host memory");
  for (size_t i = 0; i < LIVE + CHURN_STEPS; i++) sizes[i] = rnd_size();
  for (size_t i = 0; i < CHURN_STEPS; i++) slots[i] = (uint32_t)(next() % LIVE);

  for (int i = 0; i < LIVE; i++)
    if (ms_allocator_malloc(a, sizes[i], 0, &dlive[i]) != MS_OK) die("churn prefill");
  for (int r = -1; r < REPS; r++) { /* r = -1: warm-up */
    double t0 = now_ns();
    for (size_t i = 0; i < CHURN_STEPS; i++) {
      uint32_t k = slots[i];
      ms_allocator_free(a, dlive[k]);
      if (ms_allocator_malloc(a, sizes[LIVE + i], 0, &dlive[k]) != MS_OK) die("churn malloc");
    }
    if (r >= 0) t[r] = (now_ns() - t0) / CHURN_STEPS;
  }
  printf("alloc_churn_pair_ns %.2f\n", median(t, REPS));
  ms_stats_t st = MS_STATS_INIT;
  ms_allocator_get_stats(a, &st);
  fprintf(stderr, "bench_alloc: churn: %lld segments, %.1f GiB reserved, %lld device mallocs\n",
          (long long)st.segment[0].current, (double)st.reserved_bytes[0].current / (1 << 30),
          (long long)st.num_device_alloc);
  for (int i = 0; i < LIVE; i++) ms_allocator_free(a, dlive[i]);

  for (int i = 0; i < LIVE; i++) hlive[i] = malloc(sizes[i]);
  for (int r = -1; r < REPS; r++) {
    double t0 = now_ns();
    for (size_t i = 0; i < CHURN_STEPS; i++) {
      uint32_t k = slots[i];
      free(hlive[k]);
      hlive[k] = malloc(sizes[LIVE + i]);
      sink = (uintptr_t)hlive[k];
    }
    if (r >= 0) t[r] = (now_ns() - t0) / CHURN_STEPS;
  }
  printf("glibc_churn_pair_ns %.2f\n", median(t, REPS));
  for (int i = 0; i < LIVE; i++) free(hlive[i]);

  free(sizes);
  free(slots);
  free(dlive);
  free(hlive);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
  return 0;
}
