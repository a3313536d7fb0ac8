/* SPDX-License-Identifier: MIT
 * Benchmark of allocation history (issue #3 §7): the extra cost per allocation of recording the
 * state and the trace with stacks of depth 32, against the same loop with recording off in the
 * same run, for both unwinders; and the cost of the captures alone as baselines.
 *
 * The allocation is made at the bottom of a deliberately deep call chain (32 noinline frames), so
 * that every capture really walks 32 frames. Each loop is a malloc + free pair of a cached block
 * (the allocator's hit path); recording is "all" with context "alloc": the malloc captures one
 * stack, and the alloc, free_requested and free_completed entries go into the ring buffer (which
 * wraps). Each figure is the median over REPS repetitions, each of which runs every variant
 * back to back (differences are taken within a repetition).
 *
 * Prints (ns):
 *   history_off_pair_ns     malloc + free with recording off (the baseline of the two below)
 *   backtrace32_ns          one backtrace(3) capture of 32 frames alone (ms__capture_backtrace)
 *   history_bt_alloc_ns     extra per allocation with backtrace(3) stacks (target: backtrace32_ns
 *                           + 300)
 *   fp32_ns                 one frame-pointer capture of 32 frames alone
 *   history_fp_alloc_ns     extra per allocation with the frame-pointer unwinder (target: 150)
 *   history_bt_overhead_ns  history_bt_alloc_ns - backtrace32_ns: what recording adds to the
 *                           unwind (target: <= 300)
 *   intern32_10k_ns         interning one of 10,000 distinct 32-frame stacks, looked up in random
 *   intern32_100k_ns        order (and of 100,000): targets 100, 500 (docs/dev/measurements.md,
 *                           "Interning stacks")
 *   intern32_10k_2threads_ns  the 10,000 case from two threads at once, wall time per lookup of
 *                           each thread (equal to intern32_10k_ns when the 16 lock stripes keep the
 *                           threads from waiting on each other)
 * Built with -fno-omit-frame-pointer (bench/CMakeLists.txt); the library always is.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "history/history_internal.h"
#include "memsnap/allocator.h"
#include "memsnap/history.h"

#define DEPTH 32
#define REPS 7
#define ITERS_BT 20000
#define ITERS_FAST 400000

static ms_allocator_t *al;
static volatile uintptr_t sink;

typedef enum { OP_PAIR, OP_BT, OP_FP } op_t;

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

__attribute__((noinline)) static void leaf(op_t op, int iters) {
  uintptr_t pcs[DEPTH];
  for (int i = 0; i < iters; i++) {
    if (op == OP_PAIR) {
      ms_devptr_t p = 0;
      if (ms_allocator_malloc(al, 1000, 0, &p) != MS_OK || ms_allocator_free(al, p) != MS_OK) {
        fprintf(stderr, "bench_history: allocation failed\n");
        exit(1);
      }
      sink = p;
    } else if (op == OP_BT) {
      sink = ms__capture_backtrace(pcs, DEPTH, 0) + pcs[DEPTH - 1];
    } else {
      sink = ms__capture_fp(pcs, DEPTH, 0) + pcs[DEPTH - 1];
    }
  }
  __asm__ volatile("" ::: "memory");
}

/* d frames of recursion, then the leaf. */
__attribute__((noinline)) static void chain(int d, op_t op, int iters) {
  if (d > 0)
    chain(d - 1, op, iters);
  else
    leaf(op, iters);
  __asm__ volatile("" ::: "memory");
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

/* Time per iteration (ns) of one run. */
static double run_once(op_t op, int iters) {
  double t0 = now_ns();
  chain(DEPTH, op, iters);
  return (now_ns() - t0) / iters;
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return v[n / 2];
}

/* Interning cost with `distinct` different 32-frame stacks (shared outer frames, differing
 * inner ones), all first inserted, then looked up in a pseudo-random order; the per-thread
 * last-stack cache never hits. Median of REPS passes of 1,000,000 lookups. */
typedef struct intern_job_s {
  ms__stacktab_t *t;
  uint32_t distinct;
  uint32_t seed;
  int lookups;
} intern_job_t;

static void fill_stack(uintptr_t *pcs, uint32_t i) {
  for (int k = 0; k < DEPTH; k++) pcs[k] = 0x400000 + (uintptr_t)k * 0x40;
  pcs[0] = 0x500000 + (uintptr_t)(i % 1000) * 8;
  pcs[1] = 0x600000 + (uintptr_t)(i / 1000) * 8;
}

static void *intern_lookups(void *arg) {
  intern_job_t *j = arg;
  uintptr_t pcs[DEPTH];
  fill_stack(pcs, 0);
  uint32_t x = j->seed;
  for (int n = 0; n < j->lookups; n++) {
    x = x * 1664525u + 1013904223u;
    uint32_t i = (x >> 8) % j->distinct;
    pcs[0] = 0x500000 + (uintptr_t)(i % 1000) * 8;
    pcs[1] = 0x600000 + (uintptr_t)(i / 1000) * 8;
    sink = ms__stacktab_intern(j->t, pcs, DEPTH);
  }
  return NULL;
}

/* Interning cost with `distinct` different 32-frame stacks (shared outer frames, differing
 * inner ones), all first inserted, then looked up in a pseudo-random order by `threads` threads
 * at once; the per-thread last-stack cache never hits. Median of REPS passes of 1,000,000 lookups
 * per thread; wall time per lookup of one thread. */
static double measure_intern(uint32_t distinct, int threads) {
  ms__stacktab_t *t;
  if (ms__stacktab_create(&t) != MS_OK) exit(1);
  uintptr_t pcs[DEPTH];
  for (uint32_t i = 0; i < distinct; i++) {
    fill_stack(pcs, i);
    sink = ms__stacktab_intern(t, pcs, DEPTH);
  }
  double r[REPS];
  const int lookups = 1000000;
  for (int rep = 0; rep < REPS; rep++) {
    intern_job_t jobs[2];
    pthread_t th[2];
    double t0 = now_ns();
    for (int k = 0; k < threads; k++) {
      jobs[k] = (intern_job_t){t, distinct, 12345u + (uint32_t)k * 7919u, lookups};
      if (k == 0) continue;
      if (pthread_create(&th[k], NULL, intern_lookups, &jobs[k]) != 0) exit(1);
    }
    intern_lookups(&jobs[0]);
    for (int k = 1; k < threads; k++) pthread_join(th[k], NULL);
    r[rep] = (now_ns() - t0) / lookups;
  }
  qsort(r, REPS, sizeof *r, cmp_double);
  ms__stacktab_destroy(t);
  return r[REPS / 2];
}

static void record(ms_history_record en, ms_unwinder uw) {
  ms_history_config_t c;
  ms_history_config_init(&c);
  c.enabled = en;
  c.context = en == MS_HISTORY_OFF ? MS_CONTEXT_NONE : MS_CONTEXT_ALLOC;
  c.max_entries = 4096;
  c.max_frames = DEPTH;
  c.unwinder = uw;
  ms_errbuf_t eb;
  if (ms_allocator_record_history(al, &c, &eb) != MS_OK) {
    fprintf(stderr, "bench_history: %s\n", eb.msg);
    exit(1);
  }
}

int main(void) {
  ms_backend_t *be = NULL;
  ms_errbuf_t eb;
  if (ms_backend_open("sim", &be, &eb) != MS_OK) {
    fprintf(stderr, "bench_history: %s\n", eb.msg);
    return 1;
  }
  ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
  if (ms_allocator_create(&ac, &al, &eb) != MS_OK) {
    fprintf(stderr, "bench_history: %s\n", eb.msg);
    return 1;
  }
  ms__backtrace_init();

  /* Warm-up of every path (caches, the ring, the thread's frame-chain end). */
  record(MS_HISTORY_ALL, MS_UNWIND_FRAME_POINTER);
  (void)run_once(OP_PAIR, ITERS_BT);
  record(MS_HISTORY_ALL, MS_UNWIND_BACKTRACE);
  (void)run_once(OP_PAIR, ITERS_BT / 10);
  record(MS_HISTORY_OFF, MS_UNWIND_BACKTRACE);
  (void)run_once(OP_PAIR, ITERS_FAST);

  /* Each repetition measures every variant back to back, so that the machine's load (these are
   * shared machines) hits the baseline and the variant alike; differences are taken per
   * repetition, then the median. */
  double off[REPS], bt32[REPS], fp32[REPS], bt_extra[REPS], bt_over[REPS], fp_extra[REPS];
  for (int r = 0; r < REPS; r++) {
    record(MS_HISTORY_OFF, MS_UNWIND_BACKTRACE);
    double o1 = run_once(OP_PAIR, ITERS_FAST);
    bt32[r] = run_once(OP_BT, ITERS_BT);
    record(MS_HISTORY_ALL, MS_UNWIND_BACKTRACE);
    double b = run_once(OP_PAIR, ITERS_BT);
    record(MS_HISTORY_ALL, MS_UNWIND_FRAME_POINTER);
    double f = run_once(OP_PAIR, ITERS_FAST);
    fp32[r] = run_once(OP_FP, ITERS_FAST);
    record(MS_HISTORY_OFF, MS_UNWIND_BACKTRACE);
    double o2 = run_once(OP_PAIR, ITERS_FAST);
    off[r] = (o1 + o2) / 2;
    bt_extra[r] = b - off[r];
    bt_over[r] = b - off[r] - bt32[r];
    fp_extra[r] = f - off[r];
  }
  ms__fp_stats_t fs;
  ms__fp_stats(&fs);
  fprintf(stderr, "bench_history: fp walks %llu (fallbacks %llu)\n",
          (unsigned long long)fs.walks, (unsigned long long)fs.fallbacks);
  printf("history_off_pair_ns %.1f\n", median(off, REPS));
  printf("backtrace32_ns %.1f\n", median(bt32, REPS));
  printf("history_bt_alloc_ns %.1f\n", median(bt_extra, REPS));
  printf("history_bt_overhead_ns %.1f\n", median(bt_over, REPS));
  printf("fp32_ns %.1f\n", median(fp32, REPS));
  printf("history_fp_alloc_ns %.1f\n", median(fp_extra, REPS));

  printf("intern32_10k_ns %.1f\n", measure_intern(10000, 1));
  printf("intern32_100k_ns %.1f\n", measure_intern(100000, 1));
  printf("intern32_10k_2threads_ns %.1f\n", measure_intern(10000, 2));

  ms_allocator_destroy(al);
  ms_backend_destroy(be);
  return 0;
}
