/* SPDX-License-Identifier: MIT
 * Helpers shared by the benchmarks: wall and process-CPU clocks, the median of a few runs (they
 * sort their argument), a command run as a child process (its CPU seconds, wall seconds and peak
 * RSS), and work done in a child process (a synthetic file written: its memory goes with it; fresh
 * memory faulted in, the floor of a command that holds that much).
 */
#ifndef MEMSNAP_BENCH_UTIL_H
#define MEMSNAP_BENCH_UTIL_H

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

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

/* Prints "memsnap: error: PROGRAM: WHAT: MSG" on stderr and exits 1. */
static inline void bench_die(const char *what, const char *msg) {
#ifdef _GNU_SOURCE
  const char *prog = program_invocation_short_name;
#else
  const char *prog = "bench";
#endif
  fprintf(stderr, "memsnap: error: %s: %s: %s\n", prog, what, msg);
  exit(1);
}

/* One run of a child process: CPU seconds (user + system, every thread), wall seconds, peak
 * resident set in KiB. */
typedef struct bench_child_s {
  double cpu, wall;
  long rss_kb;
} bench_child_t;

/* Waits for child pid (started at wall time w0) into *r; @return 0 when it exited 0, else -1. */
static inline int bench_wait_status(pid_t pid, double w0, bench_child_t *r) {
  int st;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) != pid) return -1;
  r->wall = now_s() - w0;
  r->rss_kb = ru.ru_maxrss;
  r->cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
           (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
  return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -1;
}

/* Waits for child pid (started at wall time w0); dies naming what unless it exits 0. */
static inline bench_child_t bench_wait(pid_t pid, double w0, const char *what) {
  bench_child_t r = {0, 0, 0};
  if (bench_wait_status(pid, w0, &r) != 0) bench_die(what, "the child process failed");
  return r;
}

/* Runs argv (argv[0]: the program, looked up in PATH when it has no '/'; NULL-terminated) with
 * stdout to /dev/null, its times and peak RSS into *r. @return 0 when it exited 0, else -1. */
static inline int bench_try_run(const char *const *argv, bench_child_t *r) {
  fflush(stdout); /* the child must not write what this process has buffered */
  double w0 = now_s();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0 || dup2(fd, 1) < 0) _exit(127);
    execvp(argv[0], (char *const *)argv);
    _exit(127);
  }
  return bench_wait_status(pid, w0, r);
}

/* bench_try_run that dies when the command cannot run or exits non-zero. */
static inline bench_child_t bench_run(const char *const *argv) {
  bench_child_t r = {0, 0, 0};
  if (bench_try_run(argv, &r) != 0) bench_die(argv[1] ? argv[1] : argv[0], "the command failed");
  return r;
}

/* The memsnap command under test: $MEMSNAP_BIN (bench/run.sh sets it). */
static inline const char *bench_memsnap(void) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) bench_die("MEMSNAP_BIN", "not set (run through bench/run.sh)");
  return bin;
}

/* `memsnap ARGS...` (args NULL-terminated, at most 14) as a child process. */
static inline bench_child_t bench_run_memsnap(const char *const *args) {
  const char *argv[16] = {bench_memsnap()};
  for (int i = 0; args[i] && i < 14; i++) argv[i + 1] = args[i];
  return bench_run(argv);
}

/* reps (at most 16) runs of `memsnap ARGS...`: the median CPU and wall seconds, the largest peak
 * RSS. */
static inline bench_child_t bench_run_memsnap_median(const char *const *args, int reps) {
  double c[16], w[16];
  long rss = 0;
  if (reps > 16) reps = 16;
  for (int i = 0; i < reps; i++) {
    bench_child_t r = bench_run_memsnap(args);
    c[i] = r.cpu;
    w[i] = r.wall;
    if (r.rss_kb > rss) rss = r.rss_kb;
  }
  bench_child_t m = {median(c, reps), median(w, reps), rss};
  return m;
}

/* reps (at most 16) runs each of `memsnap A...` and `memsnap B...`, alternating (A, B, A, B, ...):
 * their medians into *ma and *mb (as bench_run_memsnap_median gives them), and the median of the
 * reps ratios B / A of the runs side by side into *ratio. For a ratio of two commands on a shared
 * machine: a slow spell then weighs on both, not on one command's runs only. */
static inline void bench_run_memsnap_pairs(const char *const *a, const char *const *b, int reps,
                                           bench_child_t *ma, bench_child_t *mb, double *ratio) {
  double ca[16], wa[16], cb[16], wb[16], q[16];
  long ra = 0, rb = 0;
  if (reps > 16) reps = 16;
  for (int i = 0; i < reps; i++) {
    bench_child_t x = bench_run_memsnap(a), y = bench_run_memsnap(b);
    ca[i] = x.cpu, wa[i] = x.wall, cb[i] = y.cpu, wb[i] = y.wall;
    q[i] = x.cpu > 0 ? y.cpu / x.cpu : 0.0;
    if (x.rss_kb > ra) ra = x.rss_kb;
    if (y.rss_kb > rb) rb = y.rss_kb;
  }
  *ma = (bench_child_t){median(ca, reps), median(wa, reps), ra};
  *mb = (bench_child_t){median(cb, reps), median(wb, reps), rb};
  *ratio = median(q, reps);
}

/* Runs fn(ctx) in a child process, whose memory goes with it (fn dies with bench_die on failure;
 * what it prints on stdout is the benchmark's); dies naming what when the child fails. */
static inline bench_child_t bench_in_child(void (*fn)(void *ctx), void *ctx, const char *what) {
  fflush(stdout);
  double w0 = now_s();
  pid_t pid = fork();
  if (pid < 0) bench_die("fork", strerror(errno));
  if (pid == 0) {
    fn(ctx);
    fflush(stdout);
    _exit(0);
  }
  return bench_wait(pid, w0, what);
}

static inline void bench_touch_fn(void *ctx) {
  size_t bytes = *(const size_t *)ctx;
  volatile char *m = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) bench_die("mmap", strerror(errno));
#ifdef MADV_HUGEPAGE
  (void)madvise((void *)m, bytes, MADV_HUGEPAGE);
#endif
  for (size_t i = 0; i < bytes; i += 4096)
    m[i] = 1;
}

/* A child process that does nothing but fault in `bytes` of fresh anonymous memory, one write a
 * page, with the huge-page advice memsnap's large arrays have (lib/common/bigmem.c): the share of
 * a command holding that much that goes to the kernel, and in a virtual machine to the host,
 * giving it zeroed pages. */
static inline bench_child_t bench_touch(size_t bytes) {
  return bench_in_child(bench_touch_fn, &bytes, "touching fresh memory");
}

#endif /* MEMSNAP_BENCH_UTIL_H */
