/* SPDX-License-Identifier: MIT
 * run_cublas: a small cuBLAS program that knows nothing of memsnap, for `memsnap run` on a GPU
 * (tests/run/gpu.sh, docs/gpu.md): three N x N matrices with cudaMalloc, SGEMM through cuBLAS
 * (which allocates its own workspace), then, with "oom", a request larger than the device.
 *   run_cublas N [oom]
 * Exit status 0, or 1 with the failing call and its error on stderr.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

static int fail(const char *what, int code) {
  fprintf(stderr, "run_cublas: %s failed: %d\n", what, code);
  return 1;
}

__attribute__((noinline)) static cudaError_t cublas_alloc_matrix(float **p, size_t n) {
  return cudaMalloc((void **)p, n * n * sizeof(float));
}

int main(int argc, char **argv) {
  size_t n = argc > 1 ? (size_t)atol(argv[1]) : 1024;
  float *a, *b, *c;
  cudaError_t e;
  if ((e = cublas_alloc_matrix(&a, n)) || (e = cublas_alloc_matrix(&b, n)) ||
      (e = cublas_alloc_matrix(&c, n)))
    return fail("cudaMalloc", e);
  if ((e = cudaMemset(a, 0, n * n * sizeof(float))) ||
      (e = cudaMemset(b, 0, n * n * sizeof(float))))
    return fail("cudaMemset", e);
  cublasHandle_t h;
  cublasStatus_t s = cublasCreate(&h);
  if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasCreate", (int)s);
  const float one = 1.0f, zero = 0.0f;
  for (int i = 0; i < 10; i++) {
    s = cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, (int)n, (int)n, (int)n, &one, a, (int)n, b, (int)n,
                    &zero, c, (int)n);
    if (s != CUBLAS_STATUS_SUCCESS) return fail("cublasSgemm", (int)s);
  }
  if ((e = cudaDeviceSynchronize())) return fail("cudaDeviceSynchronize", e);
  if (argc > 2 && strcmp(argv[2], "oom") == 0) {
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    void *big = NULL;
    e = cudaMalloc(&big, tot + ((size_t)1 << 30));
    printf("oom request: %d (%s)\n", (int)e, cudaGetErrorName(e));
    cudaGetLastError();
  }
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  printf("sgemm %zu done\n", n);
  return 0;
}
