/* SPDX-License-Identifier: MIT
 * Benchmark of the cuda backend (issue #6 §5): what a cache hit of memsnap's allocator costs on a
 * real GPU against the driver's own allocation paths, measured in one run.
 *
 * Metrics (medians of REPS repetitions; each repetition times a batch of pairs):
 *   cuda_hit_pair_ns              memsnap malloc+free of 1 MiB, served from the cache
 *   cuda_malloc_pair_ns           cudaMalloc+cudaFree of 1 MiB (baseline)
 *   cuda_malloc_async_pair_ns     cudaMallocAsync+cudaFreeAsync of 1 MiB on a stream, from the
 *                                 device's default memory pool (the driver's own cache)
 *   cuda_hit_speedup_vs_malloc    cuda_malloc_pair_ns / cuda_hit_pair_ns   (target >= 1000)
 *   cuda_hit_speedup_vs_async     cuda_malloc_async_pair_ns / cuda_hit_pair_ns (target > 1)
 *   cuda_train_step_memsnap_ms    one step of the training-like sample (samples/cuda/train.h)
 *                                 with memsnap's allocator
 *   cuda_train_step_cudamalloc_ms the same step with plain cudaMalloc/cudaFree
 *   cuda_train_step_speedup       cudamalloc / memsnap
 *
 * Exit status: 0 when every metric was measured; 77 ("skipped") when no NVIDIA GPU is present on
 * the machine (gpu_present.h; stderr says why, stdout is empty), which bench/run.sh reports as a
 * visible SKIP line so that `make bench` works on any machine; 1 when a GPU is present but the
 * benchmark could not measure (the backend does not open, a CUDA call fails, a wrong result):
 * then nothing was measured and nothing may be reported as if it had been.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu_present.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "train.h"

#define REPS 9
#define PAIR_SIZE ((size_t)1 << 20)

static double now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
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

static void die_cuda(cudaError_t e, const char *what) {
  if (e == cudaSuccess) return;
  fprintf(stderr, "bench_cuda: error: %s: %s: %s\n", what, cudaGetErrorName(e),
          cudaGetErrorString(e));
  exit(1);
}

static void die_ms(int r, const char *what) {
  if (r == MS_OK) return;
  fprintf(stderr, "bench_cuda: error: %s: %s\n", what, ms_strerror(r));
  exit(1);
}

/* Nanoseconds per memsnap malloc+free pair that hits the cache. */
static double hit_pair_ns(ms_allocator_t *a, int iters) {
  ms_devptr_t p;
  die_ms(ms_allocator_malloc(a, PAIR_SIZE, 0, &p), "warm-up malloc");
  die_ms(ms_allocator_free(a, p), "warm-up free");
  double t[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < iters; i++) {
      if (ms_allocator_malloc(a, PAIR_SIZE, 0, &p) != MS_OK) die_ms(MS_EBACKEND, "malloc");
      ms_allocator_free(a, p);
    }
    t[r] = (now_ns() - t0) / iters;
  }
  return median(t, REPS);
}

static double cuda_pair_ns(int iters) {
  void *p;
  die_cuda(cudaMalloc(&p, PAIR_SIZE), "warm-up cudaMalloc");
  die_cuda(cudaFree(p), "warm-up cudaFree");
  double t[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < iters; i++) {
      die_cuda(cudaMalloc(&p, PAIR_SIZE), "cudaMalloc");
      die_cuda(cudaFree(p), "cudaFree");
    }
    t[r] = (now_ns() - t0) / iters;
  }
  return median(t, REPS);
}

static double async_pair_ns(cudaStream_t s, int iters) {
  void *p;
  die_cuda(cudaMallocAsync(&p, PAIR_SIZE, s), "warm-up cudaMallocAsync");
  die_cuda(cudaFreeAsync(p, s), "warm-up cudaFreeAsync");
  die_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
  double t[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    for (int i = 0; i < iters; i++) {
      die_cuda(cudaMallocAsync(&p, PAIR_SIZE, s), "cudaMallocAsync");
      die_cuda(cudaFreeAsync(p, s), "cudaFreeAsync");
    }
    die_cuda(cudaStreamSynchronize(s), "cudaStreamSynchronize");
    t[r] = (now_ns() - t0) / iters;
  }
  return median(t, REPS);
}

/* Milliseconds per training step (after warm-up steps), median over REPS steps. */
static double train_step_ms(train_mem_t mem, cudaStream_t s) {
  train_t *t;
  train_config_t cfg = {.layers = 8, .width = 65536, .batch = 16, .stream = s};
  die_cuda(train_create(&cfg, mem, &t), "train_create");
  bool ok = false;
  for (int i = 0; i < 3; i++) die_cuda(train_step(t, i, &ok), "train_step (warm-up)");
  double v[REPS];
  for (int r = 0; r < REPS; r++) {
    double t0 = now_ns();
    die_cuda(train_step(t, 3 + r, &ok), "train_step");
    v[r] = (now_ns() - t0) / 1e6;
    if (!ok) {
      fprintf(stderr, "bench_cuda: error: the training step computed a wrong loss\n");
      exit(1);
    }
  }
  train_destroy(t);
  return median(v, REPS);
}

int main(void) {
  ms_backend_t *b = NULL;
  ms_errbuf_t eb;
  int r = ms_backend_open("cuda", &b, &eb);
  if (r != MS_OK) {
    char why[256];
    if (!ms_gpu_present(why, sizeof why)) {
      fprintf(stderr, "bench_cuda: SKIP: %s (%s)\n", eb.msg, why);
      return 77;
    }
    fprintf(stderr, "bench_cuda: error: a GPU is present (%s) but the cuda backend does not open: "
                    "%s: nothing measured\n",
            why, eb.msg);
    return 1;
  }
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = NULL};
  ms_allocator_t *a = NULL;
  die_ms(ms_allocator_create(&cfg, &a, &eb), "ms_allocator_create");
  cudaStream_t s;
  die_cuda(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
  struct cudaDeviceProp prop;
  int drv = 0, rt = 0;
  die_cuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  die_cuda(cudaDriverGetVersion(&drv), "cudaDriverGetVersion");
  die_cuda(cudaRuntimeGetVersion(&rt), "cudaRuntimeGetVersion");
  fprintf(stderr, "bench_cuda: %s, driver %d, runtime %d\n", prop.name, drv, rt);

  double hit = hit_pair_ns(a, 200000);
  double cm = cuda_pair_ns(500);
  double ca = async_pair_ns(s, 20000);
  printf("cuda_hit_pair_ns %.3f\n", hit);
  printf("cuda_malloc_pair_ns %.3f\n", cm);
  printf("cuda_malloc_async_pair_ns %.3f\n", ca);
  printf("cuda_hit_speedup_vs_malloc %.1f\n", cm / hit);
  printf("cuda_hit_speedup_vs_async %.2f\n", ca / hit);

  double step_ms = train_step_ms(train_mem_memsnap(a), s);
  double base_ms = train_step_ms(train_mem_cuda(), s);
  printf("cuda_train_step_memsnap_ms %.4f\n", step_ms);
  printf("cuda_train_step_cudamalloc_ms %.4f\n", base_ms);
  printf("cuda_train_step_speedup %.2f\n", base_ms / step_ms);

  die_cuda(cudaStreamDestroy(s), "cudaStreamDestroy");
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
  return 0;
}
