/* SPDX-License-Identifier: MIT
 * Benchmark: the `memsnap` program on the largest PyTorch fixture
 * (wedsonlin_cs336_medium_1024_training.pickle, 3.7 MB, 234 segments, 22k trace entries), whole
 * process (fork/exec, as a user runs it), median of several runs.
 *
 *   cli_segments_largest_s         `memsnap segments FILE -o OUT.svg` (issue #5 §7; target <= 0.1
 * s; PyTorch's _memory_viz.py + flamegraph.pl take 1-2.3 s) cli_segments_largest_folded_s  the same
 * with --folded (no SVG): loading + the view cli_stats_largest_s            `memsnap stats FILE`:
 * loading + the segment map
 *   *_cpu_s                        the same runs' user + system CPU time (median), which a
 *                                  loaded machine inflates less than wall time
 *
 * The program is $MEMSNAP_BIN (bench/run.sh sets it) or bin/memsnap next to this benchmark; the
 * fixtures are $MEMSNAP_TORCH_FIXTURES or the configured default. Without fixtures it prints a
 * note on stderr and no metric.
 */
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef MS_BENCH_FIXTURES_DEFAULT
#define MS_BENCH_FIXTURES_DEFAULT "../shared/fixtures/torch"
#endif

#define BENCH_RUNS 9

static double bench_now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs argv with stdout/stderr to /dev/null; @return wall seconds, or -1 on failure; *cpu gets
 * the child's user + system CPU seconds (less sensitive to a loaded machine than wall time). */
static double bench_run(char *const *argv, double *cpu) {
  double t0 = bench_now();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    int null = open("/dev/null", O_WRONLY);
    if (null >= 0) {
      dup2(null, 1);
      dup2(null, 2);
    }
    execv(argv[0], argv);
    _exit(127);
  }
  int st = 0;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  double wall = bench_now() - t0;
  *cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
  return wall;
}

static int bench_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* Median wall time of BENCH_RUNS runs (after one warm-up run), and in *cpu the median CPU time;
 * -1 if any run failed. */
static double bench_median(char *const *argv, double *cpu) {
  double t[BENCH_RUNS], c[BENCH_RUNS];
  if (bench_run(argv, &c[0]) < 0) return -1;
  for (int i = 0; i < BENCH_RUNS; i++)
    if ((t[i] = bench_run(argv, &c[i])) < 0) return -1;
  qsort(t, BENCH_RUNS, sizeof *t, bench_cmp);
  qsort(c, BENCH_RUNS, sizeof *c, bench_cmp);
  *cpu = c[BENCH_RUNS / 2];
  return t[BENCH_RUNS / 2];
}

int main(void) {
  char bin[PATH_MAX];
  const char *env = getenv("MEMSNAP_BIN");
  if (env && *env) {
    snprintf(bin, sizeof bin, "%s", env);
  } else {
    ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 16);
    if (n <= 0) return 1;
    bin[n] = 0;
    char *slash = strrchr(bin, '/');
    strcpy(slash ? slash + 1 : bin, "memsnap");
  }
  const char *fx = getenv("MEMSNAP_TORCH_FIXTURES");
  if (!fx || !*fx) fx = MS_BENCH_FIXTURES_DEFAULT;
  char in[PATH_MAX];
  snprintf(in, sizeof in, "%s/wedsonlin_cs336_medium_1024_training.pickle", fx);
  if (access(in, R_OK) != 0) {
    fprintf(stderr, "bench_cli: SKIP: fixture %s not found (set MEMSNAP_TORCH_FIXTURES)\n", in);
    return 0;
  }
  if (access(bin, X_OK) != 0) {
    fprintf(stderr, "bench_cli: error: memsnap not found at %s\n", bin);
    return 1;
  }
  const char *dir = getenv("MS_BENCH_OUT");
  char out_svg[PATH_MAX], out_folded[PATH_MAX];
  snprintf(out_svg, sizeof out_svg, "%s/bench_cli_segments.svg", dir && *dir ? dir : "/tmp");
  snprintf(out_folded, sizeof out_folded, "%s/bench_cli_segments.folded",
           dir && *dir ? dir : "/tmp");

  char *seg_svg[] = {bin, "segments", in, "-o", out_svg, NULL};
  char *seg_folded[] = {bin, "segments", in, "--folded", "-o", out_folded, NULL};
  char *stats[] = {bin, "stats", in, NULL};
  double ac, bc, cc;
  double a = bench_median(seg_svg, &ac), b = bench_median(seg_folded, &bc),
         c = bench_median(stats, &cc);
  if (a < 0 || b < 0 || c < 0) {
    fprintf(stderr, "bench_cli: error: a memsnap run failed\n");
    return 1;
  }
  printf("cli_segments_largest_s %.4f\n", a);
  printf("cli_segments_largest_folded_s %.4f\n", b);
  printf("cli_stats_largest_s %.4f\n", c);
  printf("cli_segments_largest_cpu_s %.4f\n", ac);
  printf("cli_segments_largest_folded_cpu_s %.4f\n", bc);
  printf("cli_stats_largest_cpu_s %.4f\n", cc);
  unlink(out_svg);
  unlink(out_folded);
  return 0;
}
