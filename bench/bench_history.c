/* SPDX-License-Identifier: MIT
 * Benchmark of allocation history (issue #3 §7): the extra cost per allocation of recording the
 * state and the trace with stacks of depth 32, against the same loop with recording off in the
 * same run, for both unwinders; and the cost of the captures alone as baselines.
 *
 * The allocation is made at the bottom of a deliberately deep call chain (32 noinline frames), so
 * that every capture really walks 32 frames. Each loop is a malloc + free pair of a cached block
 * (the allocator's hit path); recording is "all" with context "alloc": the malloc captures one
 * stack, and the alloc, free_requested and free_completed entries go into the ring buffer (which
 * wraps). Each figure is the median of REPS runs of ITERS pairs.
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
 * Built with -fno-omit-frame-pointer (bench/CMakeLists.txt); the library always is.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "history_internal.h"
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

/* Median over REPS of the time per iteration (ns). */
static double measure(op_t op, int iters) {
  double t[REPS];
  chain(DEPTH, op, iters / 10 + 1); /* warm-up: caches, the ring, the thread's frame-chain end */
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    chain(DEPTH, op, iters);
    t[r] = (now_ns() - t0) / iters;
  }
  qsort(t, REPS, sizeof *t, cmp_double);
  return t[REPS / 2];
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

  /* Interleave the baseline with each recording mode, so drift affects both alike. */
  double off1 = measure(OP_PAIR, ITERS_FAST);
  double bt32 = measure(OP_BT, ITERS_BT);
  record(MS_HISTORY_ALL, MS_UNWIND_BACKTRACE);
  double bt_pair = measure(OP_PAIR, ITERS_BT);
  record(MS_HISTORY_OFF, MS_UNWIND_BACKTRACE);
  double off2 = measure(OP_PAIR, ITERS_FAST);
  double fp32 = measure(OP_FP, ITERS_FAST);
  record(MS_HISTORY_ALL, MS_UNWIND_FRAME_POINTER);
  double fp_pair = measure(OP_PAIR, ITERS_FAST);
  record(MS_HISTORY_OFF, MS_UNWIND_BACKTRACE);
  double off3 = measure(OP_PAIR, ITERS_FAST);

  ms__fp_stats_t fs;
  ms__fp_stats(&fs);
  fprintf(stderr, "bench_history: off %.1f/%.1f/%.1f ns, bt pair %.1f ns, fp pair %.1f ns, "
                  "fp walks %llu (fallbacks %llu)\n",
          off1, off2, off3, bt_pair, fp_pair, (unsigned long long)fs.walks,
          (unsigned long long)fs.fallbacks);
  double off_bt = (off1 + off2) / 2, off_fp = (off2 + off3) / 2;
  printf("history_off_pair_ns %.1f\n", off_fp);
  printf("backtrace32_ns %.1f\n", bt32);
  printf("history_bt_alloc_ns %.1f\n", bt_pair - off_bt);
  printf("history_bt_overhead_ns %.1f\n", bt_pair - off_bt - bt32);
  printf("fp32_ns %.1f\n", fp32);
  printf("history_fp_alloc_ns %.1f\n", fp_pair - off_fp);

  ms_allocator_destroy(al);
  ms_backend_destroy(be);
  return 0;
}
