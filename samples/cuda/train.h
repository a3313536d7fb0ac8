/* SPDX-License-Identifier: MIT
 * memsnap CUDA samples: a training-like loop, shared by the cuda_train sample and bench_cuda.
 *
 * One step is a forward pass through `layers` layers (each allocates its activation and writes
 * relu(previous) * scale into it), a loss (a reduction of the last activation into a device
 * double), a backward pass in reverse order (each layer allocates a gradient, derives it from its
 * activation, updates its persistent parameters with it, and frees the gradient and the
 * activation) and a workspace whose size changes from step to step. The batch size cycles
 * through three values, so block sizes drift as in real training and the cache is exercised
 * with splits, reuse and fragmentation.
 *
 * The loss is checked on the host: the input is positive, so it equals
 * scale^layers * sum(input) exactly up to float rounding; a block handed out twice, or memory
 * that the kernels did not really write and read, shows up as a wrong loss.
 *
 * Memory comes from a train_mem_t: either memsnap's caching allocator or plain
 * cudaMalloc/cudaFree (the baseline of bench_cuda).
 */
#ifndef MEMSNAP_SAMPLES_CUDA_TRAIN_H
#define MEMSNAP_SAMPLES_CUDA_TRAIN_H

#include <stdbool.h>
#include <stddef.h>

#include <cuda_runtime_api.h>

#include "memsnap/allocator.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Where device memory comes from. alloc/free return cudaSuccess or an error. */
typedef struct train_mem_s {
  cudaError_t (*alloc)(void *ctx, size_t size, cudaStream_t stream, void **out);
  cudaError_t (*free)(void *ctx, void *ptr);
  void *ctx;
} train_mem_t;

/* A train_mem_t over memsnap's allocator a (MS_EOOM becomes cudaErrorMemoryAllocation). */
train_mem_t train_mem_memsnap(ms_allocator_t *a);
/* A train_mem_t over cudaMalloc/cudaFree. */
train_mem_t train_mem_cuda(void);

typedef struct train_s train_t;

typedef struct train_config_s {
  int layers;          /* default 8 */
  size_t width;        /* elements per sample and layer; default 65536 (256 KiB per sample) */
  size_t batch;        /* samples in the largest batch; default 16 (4 MiB activations) */
  cudaStream_t stream; /* where every kernel runs; default 0 */
} train_config_t;

/* Creates the model: its persistent parameters are allocated from mem (one per layer).
 * cfg may be NULL (the defaults). @return cudaSuccess or the first CUDA error. */
cudaError_t train_create(const train_config_t *cfg, train_mem_t mem, train_t **out);
/* Runs one step (number step, which decides the batch size), waits for it and checks the loss.
 * *loss_ok = whether the loss matched the host's value. @return cudaSuccess or the CUDA error
 * (cudaErrorMemoryAllocation when the memory ran out). */
cudaError_t train_step(train_t *t, int step, bool *loss_ok);
/* Frees the parameters and t. */
void train_destroy(train_t *t);

#ifdef __cplusplus
}
#endif

#endif /* MEMSNAP_SAMPLES_CUDA_TRAIN_H */
