/* SPDX-License-Identifier: MIT
 * memsnap CUDA samples: the few kernels the samples launch, behind plain C launchers.
 *
 * The kernels exist so that the samples do real work on the memory the allocator hands out: each
 * one writes or reads every element it is given, so a wrong pointer or a block reused too early
 * shows up as a wrong checksum (or a CUDA error), not as silence. kernels.cu is compiled by nvcc;
 * the samples themselves are C11 and call only these launchers and the CUDA runtime API.
 *
 * Every launcher enqueues on `stream` and returns cudaGetLastError() of the launch (it does not
 * synchronise). Sizes are element counts. Launchers may be called while `stream` is being
 * captured into a CUDA graph.
 */
#ifndef MEMSNAP_SAMPLES_CUDA_KERNELS_H
#define MEMSNAP_SAMPLES_CUDA_KERNELS_H

#include <stddef.h>

#include <cuda_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

/* p[i] = base + step * (i % 1024), for i < n. */
cudaError_t ms_sample_fill(float *p, size_t n, float base, float step, cudaStream_t stream);

/* y[i] = a * x[i] + y[i], for i < n (x and y may not overlap). */
cudaError_t ms_sample_axpy(float *y, const float *x, float a, size_t n, cudaStream_t stream);

/* y[i] = max(x[i], 0) * scale, for i < n: a stand-in for an activation layer. */
cudaError_t ms_sample_relu_scale(float *y, const float *x, float scale, size_t n,
                                 cudaStream_t stream);

/* *out += sum of x[0..n), accumulated in double. *out must be device memory that the caller has
 * zeroed (or wants added to). */
cudaError_t ms_sample_sum(const float *x, size_t n, double *out, cudaStream_t stream);

#ifdef __cplusplus
}
#endif

#endif /* MEMSNAP_SAMPLES_CUDA_KERNELS_H */
