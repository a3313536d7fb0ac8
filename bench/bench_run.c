/* SPDX-License-Identifier: MIT
 * bench_run: what `memsnap run --observe` adds to one cudaMalloc + cudaFree pair (issue #18),
 * against the fake CUDA runtime (tests/run/fakecudart), whose pair costs about 100 ns.
 *
 * Each of 7 repetitions runs run_app_bench (tests/run/run_app.c, `bench N`) four times back to
 * back: bare, then under `memsnap run` without stacks, with frame-pointer stacks and with
 * backtrace(3) stacks; the differences are taken within a repetition and the medians printed:
 *   run_bare_pair_ns                  the fake runtime's pair, no interposer
 *   run_observe_overhead_ns           added per pair, stacks off          (target <= 300)
 *   run_observe_fp_overhead_ns        added per pair, frame-pointer stacks
 *   run_observe_bt_overhead_ns        added per pair, backtrace(3) stacks
 *   run_backtrace_ns                  one backtrace(3) at the interposer's depth (the mean of
 *                                     what the bare and the backtrace runs measured)
 *   run_observe_bt_minus_backtrace_ns the bt overhead minus that           (target <= 300)
 *   run_bare_async_pair_ns            the fake runtime's cudaMallocAsync + cudaFreeAsync pair on a
 *                                     stream, no interposer
 *   run_observe_async_overhead_ns     added per async pair, stacks off: the fake runtime has no
 *                                     cudaStreamGetDevice, so this shows whether the failed lookup
 *                                     is cached (issue #35 item 12)
 * The first 1000 pairs of each run are not timed (the recorder starts at the first call).
 */
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

extern char **environ;

#define REPS 7
#define PAIRS "300000"

static int cmp_d(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

static double median(double *v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_d);
  return v[n / 2];
}

/* Runs argv, reads "key value" lines from its stdout. */
static int run_one(char *const argv[], double *pair, double *bt, double *async) {
  int fds[2];
  if (pipe(fds) != 0) return -1;
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
  posix_spawn_file_actions_addclose(&fa, fds[0]);
  pid_t pid;
  int rc = posix_spawn(&pid, argv[0], &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  close(fds[1]);
  if (rc != 0) {
    close(fds[0]);
    return -1;
  }
  FILE *f = fdopen(fds[0], "r");
  char line[256];
  while (fgets(line, sizeof line, f)) {
    double v;
    if (sscanf(line, "ns_per_pair %lf", &v) == 1) *pair = v;
    if (sscanf(line, "ns_backtrace %lf", &v) == 1) *bt = v;
    if (sscanf(line, "ns_per_async_pair %lf", &v) == 1) *async = v;
  }
  fclose(f);
  int st;
  if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) return -1;
  return 0;
}

int main(void) {
  const char *memsnap = getenv("MEMSNAP_BIN");
  char app[4096], dir[] = "/tmp/bench_run.XXXXXX", pattern[4200];
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  if (!memsnap || n <= 0 || !mkdtemp(dir)) {
    fprintf(stderr, "bench_run: needs MEMSNAP_BIN (bench/run.sh sets it)\n");
    return 1;
  }
  self[n] = 0;
  *strrchr(self, '/') = 0;
  snprintf(app, sizeof app, "%s/run_app_bench", self);
  snprintf(pattern, sizeof pattern, "%s/s.msgpack", dir);
  char *bare[] = {app, "bench", PAIRS, NULL};
  char *nost[] = {(char *)memsnap, "run", "--quiet", "--no-stacks", "-o", pattern, "--", app,
                  "bench",         PAIRS, NULL};
  char *fp[] = {(char *)memsnap, "run", "--quiet", "--unwind", "fp",  "-o",
                pattern,         "--",  app,       "bench",    PAIRS, NULL};
  char *btv[] = {(char *)memsnap, "run", "--quiet", "--unwind", "backtrace", "-o",
                 pattern,         "--",  app,       "bench",    PAIRS,       NULL};
  double b[REPS], o[REPS], f[REPS], t[REPS], bts[REPS], tmb[REPS], ab[REPS], ao[REPS];
  for (int r = 0; r < REPS; r++) {
    double pb = 0, po = 0, pf = 0, pt = 0, bt = 0, bt2 = 0, x = 0, qb = 0, qo = 0;
    if (run_one(bare, &pb, &bt, &qb) || run_one(nost, &po, &x, &qo) || run_one(fp, &pf, &x, &x) ||
        run_one(btv, &pt, &bt2, &x)) {
      fprintf(stderr, "bench_run: a run of %s failed\n", app);
      return 1;
    }
    b[r] = pb;
    o[r] = po - pb;
    f[r] = pf - pb;
    t[r] = pt - pb;
    bt = (bt + bt2) / 2; /* measured in both processes: the unwinder's cost moves between runs */
    bts[r] = bt;
    tmb[r] = pt - pb - bt;
    ab[r] = qb;
    ao[r] = qo - qb;
  }
  unlink(pattern);
  rmdir(dir);
  printf("run_bare_pair_ns %.1f\n", median(b, REPS));
  printf("run_observe_overhead_ns %.1f\n", median(o, REPS));
  printf("run_observe_fp_overhead_ns %.1f\n", median(f, REPS));
  printf("run_observe_bt_overhead_ns %.1f\n", median(t, REPS));
  printf("run_backtrace_ns %.1f\n", median(bts, REPS));
  printf("run_observe_bt_minus_backtrace_ns %.1f\n", median(tmb, REPS));
  printf("run_bare_async_pair_ns %.1f\n", median(ab, REPS));
  printf("run_observe_async_overhead_ns %.1f\n", median(ao, REPS));
  return 0;
}
