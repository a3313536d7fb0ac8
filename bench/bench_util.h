/* SPDX-License-Identifier: MIT
 * Timing helpers shared by the benchmarks: wall and process-CPU clocks, and the median of a few
 * runs (they sort their argument).
 */
#ifndef MEMSNAP_BENCH_UTIL_H
#define MEMSNAP_BENCH_UTIL_H

#include <stdlib.h>
#include <time.h>

/* Monotonic wall-clock seconds. */
static inline double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* CPU seconds of this process (all threads). */
static inline double cpu_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static inline int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* The median of v[0..n) (v is sorted in place). */
static inline double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

#endif /* MEMSNAP_BENCH_UTIL_H */
