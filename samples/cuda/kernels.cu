/* SPDX-License-Identifier: MIT
 * memsnap CUDA samples: kernels and their C launchers (see kernels.h for the contracts).
 *
 * Grid-stride loops keep the launch shape independent of n; the grid is capped so a launch stays
 * cheap to capture into a graph. ms_sample_sum reduces in shared memory per block and adds one
 * double per block with atomicAdd (sm_60 and later).
 */
#include "kernels.h"

namespace {

constexpr int kThreads = 256;
constexpr int kMaxBlocks = 1024;

int grid_for(size_t n) {
  size_t blocks = (n + kThreads - 1) / kThreads;
  if (blocks < 1) blocks = 1;
  if (blocks > static_cast<size_t>(kMaxBlocks)) blocks = kMaxBlocks;
  return static_cast<int>(blocks);
}

__global__ void fill_kernel(float *p, size_t n, float base, float step) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    p[i] = base + step * static_cast<float>(i % 1024);
}

__global__ void axpy_kernel(float *y, const float *x, float a, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = a * x[i] + y[i];
}

__global__ void relu_scale_kernel(float *y, const float *x, float scale, size_t n) {
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    y[i] = fmaxf(x[i], 0.0f) * scale;
}

__global__ void sum_kernel(const float *x, size_t n, double *out) {
  __shared__ double part[kThreads];
  double acc = 0.0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    acc += static_cast<double>(x[i]);
  part[threadIdx.x] = acc;
  __syncthreads();
  for (int s = kThreads / 2; s > 0; s >>= 1) {
    if (static_cast<int>(threadIdx.x) < s) part[threadIdx.x] += part[threadIdx.x + s];
    __syncthreads();
  }
  if (threadIdx.x == 0) atomicAdd(out, part[0]);
}

}  // namespace

extern "C" cudaError_t ms_sample_fill(float *p, size_t n, float base, float step,
                                      cudaStream_t stream) {
  fill_kernel<<<grid_for(n), kThreads, 0, stream>>>(p, n, base, step);
  return cudaGetLastError();
}

extern "C" cudaError_t ms_sample_axpy(float *y, const float *x, float a, size_t n,
                                      cudaStream_t stream) {
  axpy_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, a, n);
  return cudaGetLastError();
}

extern "C" cudaError_t ms_sample_relu_scale(float *y, const float *x, float scale, size_t n,
                                            cudaStream_t stream) {
  relu_scale_kernel<<<grid_for(n), kThreads, 0, stream>>>(y, x, scale, n);
  return cudaGetLastError();
}

extern "C" cudaError_t ms_sample_sum(const float *x, size_t n, double *out, cudaStream_t stream) {
  sum_kernel<<<grid_for(n), kThreads, 0, stream>>>(x, n, out);
  return cudaGetLastError();
}
