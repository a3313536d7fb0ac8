/* SPDX-License-Identifier: MIT
 * Benchmark: `memsnap flamegraph` on a generated folded-stack file of 200,000 lines with stacks
 * about 26 frames deep (issue #5 §7), run as a user runs it (fork/exec), median of 3 runs.
 *
 *   flamegraph_200k_s        wall time of `memsnap flamegraph IN -o OUT.svg` (target <= 1.0 s;
 *                            flamegraph.pl took 26 s and inferno 1.8 s on such a file,
 *                            docs/dev/measurements.md, "Flame-graph inputs and SVG size")
 *   flamegraph_200k_peak_mb  peak RSS of that process in MiB (target <= 300; flamegraph.pl
 *                            1.4 GB, inferno 291 MB)
 *   flamegraph_200k_cpu_s    user + system CPU time of that process (less sensitive than the wall
 *                            time to the load of a shared machine)
 *   flamegraph_200k_input_mb size of the generated input, flamegraph_200k_svg_kb of the output
 *
 * The input mimics the reference's "wide" file: CUDA-like frame names from a pool of 4,000
 * (about 45 characters), a 30% chance of a fresh stack and otherwise a shared prefix of random
 * length, depths 14 to 38, byte weights from 512 B to 1 GiB. It is generated with a fixed seed,
 * so every run measures the same file.
 * The program is $MEMSNAP_BIN (bench/run.sh sets it) or bin/memsnap next to this benchmark.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define LINES 200000
#define POOL 4000
#define RUNS 3

static uint64_t rng_state = 0x9e3779b97f4a7c15ULL;
static uint64_t rng(void) {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

static int generate(const char *path, double *mb) {
  static const char *const ns[] = {"torch::autograd", "at::native", "c10::cuda",
                                   "torch::nn::functional", "at::_ops::aten", "caffe2::detail",
                                   "torch::jit::interpreter", "at::cuda::blas"};
  static const char *const ops[] = {"forward_impl", "backward_kernel", "evaluate_function",
                                    "call_boxed", "launch_kernel_async", "allocate_tensor",
                                    "apply_inplace", "run_graph_task"};
  char (*pool)[64] = malloc(POOL * sizeof *pool);
  if (!pool) return -1;
  for (int i = 0; i < POOL; i++)
    snprintf(pool[i], sizeof pool[i], "%s::%s_%d", ns[i % 8], ops[(i / 8) % 8], i);
  FILE *fp = fopen(path, "w");
  if (!fp) {
    free(pool);
    return -1;
  }
  int stack[64], depth = 0;
  for (int line = 0; line < LINES; line++) {
    int fresh = depth == 0 || rng() % 10 < 3;
    int keep = fresh ? 0 : 1 + (int)(rng() % (uint64_t)(depth - 1));
    depth = 14 + (int)(rng() % 25);
    if (keep > depth - 1) keep = depth - 1;
    if (keep == 0) stack[0] = (int)(rng() % 4); /* a few roots */
    for (int d = keep ? keep : 1; d < depth; d++) stack[d] = (int)(rng() % POOL);
    for (int d = 0; d < depth; d++) {
      if (d) fputc(';', fp);
      if (d == 0) fprintf(fp, "python:train_%d.py:main", stack[0]);
      else if (d == depth - 1)
        fputs(rng() % 2 ? "cudaMalloc" : "c10::cuda::CUDACachingAllocator::malloc", fp);
      else fputs(pool[stack[d]], fp);
    }
    fprintf(fp, " %llu\n", (unsigned long long)(512ULL << (rng() % 22)));
  }
  free(pool);
  if (fclose(fp) != 0) return -1;
  struct stat st;
  if (stat(path, &st) != 0) return -1;
  *mb = (double)st.st_size / (1024.0 * 1024.0);
  return 0;
}

static double now(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Runs argv; @return 0 and the wall time, CPU time and peak RSS (KiB), or -1. */
static int run(char *const argv[], double *secs, double *cpu, long *maxrss_kb) {
  double t0 = now();
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    execv(argv[0], argv);
    _exit(127);
  }
  int status;
  struct rusage ru;
  if (wait4(pid, &status, 0, &ru) != pid) return -1;
  *secs = now() - t0;
  *maxrss_kb = ru.ru_maxrss;
  *cpu = (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
  return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -1;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(void) {
  char bin[4096];
  const char *env = getenv("MEMSNAP_BIN");
  if (env && *env) {
    snprintf(bin, sizeof bin, "%s", env);
  } else {
    ssize_t n = readlink("/proc/self/exe", bin, sizeof bin - 16);
    if (n < 0) return 1;
    bin[n] = 0;
    char *slash = strrchr(bin, '/');
    strcpy(slash ? slash + 1 : bin, "memsnap");
  }
  if (access(bin, X_OK) != 0) {
    fprintf(stderr, "bench_flamegraph: error: memsnap not found at %s\n", bin);
    return 1;
  }
  char dir[] = "/tmp/bench_flamegraph.XXXXXX";
  if (!mkdtemp(dir)) return 1;
  char in[4200], out[4200];
  snprintf(in, sizeof in, "%s/200k.folded", dir);
  snprintf(out, sizeof out, "%s/200k.svg", dir);
  double mb = 0;
  if (generate(in, &mb) != 0) {
    fprintf(stderr, "bench_flamegraph: error: cannot write %s: %s\n", in, strerror(errno));
    return 1;
  }
  char *argv[] = {bin, "flamegraph", in, "-o", out, "--title", "200k stacks", NULL};
  double secs[RUNS], cpu[RUNS];
  long rss[RUNS];
  for (int i = 0; i < RUNS; i++) {
    if (run(argv, &secs[i], &cpu[i], &rss[i]) != 0) {
      fprintf(stderr, "bench_flamegraph: error: a memsnap run failed\n");
      return 1;
    }
    fprintf(stderr, "run %d: %.3f s wall, %.3f s CPU, %.1f MiB\n", i + 1, secs[i], cpu[i],
            (double)rss[i] / 1024.0);
  }
  double r[RUNS];
  for (int i = 0; i < RUNS; i++) r[i] = (double)rss[i] / 1024.0;
  qsort(secs, RUNS, sizeof *secs, cmp_double);
  qsort(cpu, RUNS, sizeof *cpu, cmp_double);
  qsort(r, RUNS, sizeof *r, cmp_double);
  struct stat st;
  double svg_kb = stat(out, &st) == 0 ? (double)st.st_size / 1024.0 : 0;
  printf("flamegraph_200k_s %.4f\n", secs[RUNS / 2]);
  printf("flamegraph_200k_peak_mb %.1f\n", r[RUNS / 2]);
  printf("flamegraph_200k_cpu_s %.4f\n", cpu[RUNS / 2]);
  printf("flamegraph_200k_input_mb %.1f\n", mb);
  printf("flamegraph_200k_svg_kb %.1f\n", svg_kb);
  unlink(in);
  unlink(out);
  rmdir(dir);
  return 0;
}
