/* SPDX-License-Identifier: MIT
 * memsnap CUDA samples: the training-like loop of train.h.
 *
 * The layer functions are separate, non-static functions so that the stacks recorded with each
 * allocation (history on) name them: forward_layer, backward_layer, loss_of, workspace_for.
 */
#include "train.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "kernels.h"

#define TRAIN_MAX_LAYERS 64
#define TRAIN_SCALE 0.5f
#define TRAIN_LR 1e-3f

struct train_s {
  train_config_t cfg;
  train_mem_t mem;
  float *params[TRAIN_MAX_LAYERS];
  float *acts[TRAIN_MAX_LAYERS + 1];
};

static cudaError_t memsnap_alloc(void *ctx, size_t size, cudaStream_t stream, void **out) {
  ms_devptr_t p = 0;
  int r = ms_allocator_malloc(ctx, size, (ms_stream_t)(uintptr_t)stream, &p);
  if (r == MS_EOOM) return cudaErrorMemoryAllocation;
  if (r != MS_OK) return cudaErrorUnknown;
  *out = (void *)p;
  return cudaSuccess;
}

static cudaError_t memsnap_free(void *ctx, void *ptr) {
  return ms_allocator_free(ctx, (ms_devptr_t)ptr) == MS_OK ? cudaSuccess : cudaErrorInvalidValue;
}

train_mem_t train_mem_memsnap(ms_allocator_t *a) {
  return (train_mem_t){.alloc = memsnap_alloc, .free = memsnap_free, .ctx = a};
}

static cudaError_t cuda_alloc(void *ctx, size_t size, cudaStream_t stream, void **out) {
  (void)ctx;
  (void)stream;
  return cudaMalloc(out, size);
}

static cudaError_t cuda_free(void *ctx, void *ptr) {
  (void)ctx;
  return cudaFree(ptr);
}

train_mem_t train_mem_cuda(void) {
  return (train_mem_t){.alloc = cuda_alloc, .free = cuda_free, .ctx = NULL};
}

#define TRY(call)                      \
  do {                                 \
    cudaError_t e_ = (call);           \
    if (e_ != cudaSuccess) return e_;  \
  } while (0)

cudaError_t train_create(const train_config_t *cfg, train_mem_t mem, train_t **out) {
  train_t *t = calloc(1, sizeof *t);
  if (!t) return cudaErrorMemoryAllocation;
  t->cfg = cfg ? *cfg : (train_config_t){0};
  if (t->cfg.layers <= 0) t->cfg.layers = 8;
  if (t->cfg.layers > TRAIN_MAX_LAYERS) t->cfg.layers = TRAIN_MAX_LAYERS;
  if (!t->cfg.width) t->cfg.width = 65536;
  if (!t->cfg.batch) t->cfg.batch = 16;
  t->mem = mem;
  for (int l = 0; l < t->cfg.layers; l++) {
    cudaError_t e = mem.alloc(mem.ctx, t->cfg.width * sizeof(float), t->cfg.stream,
                              (void **)&t->params[l]);
    if (e == cudaSuccess)
      e = ms_sample_fill(t->params[l], t->cfg.width, 0.0f, 0.0f, t->cfg.stream);
    if (e != cudaSuccess) {
      train_destroy(t);
      return e;
    }
  }
  *out = t;
  return cudaSuccess;
}

void train_destroy(train_t *t) {
  if (!t) return;
  (void)cudaStreamSynchronize(t->cfg.stream);
  for (int l = 0; l < t->cfg.layers; l++)
    if (t->params[l]) (void)t->mem.free(t->mem.ctx, t->params[l]);
  free(t);
}

/* The batch of step n: batch, batch*2/3, batch*5/6 in turn (sizes drift as in real training). */
static size_t batch_of(const train_t *t, int step) {
  static const int num[3] = {6, 4, 5};
  size_t b = t->cfg.batch * (size_t)num[step % 3] / 6;
  return b ? b : 1;
}

cudaError_t forward_layer(train_t *t, int l, size_t n) {
  TRY(t->mem.alloc(t->mem.ctx, n * sizeof(float), t->cfg.stream, (void **)&t->acts[l + 1]));
  return ms_sample_relu_scale(t->acts[l + 1], t->acts[l], TRAIN_SCALE, n, t->cfg.stream);
}

cudaError_t loss_of(train_t *t, size_t n, double *host_loss) {
  double *d = NULL;
  TRY(t->mem.alloc(t->mem.ctx, sizeof(double), t->cfg.stream, (void **)&d));
  cudaError_t e = cudaMemsetAsync(d, 0, sizeof(double), t->cfg.stream);
  if (e == cudaSuccess) e = ms_sample_sum(t->acts[t->cfg.layers], n, d, t->cfg.stream);
  if (e == cudaSuccess)
    e = cudaMemcpyAsync(host_loss, d, sizeof(double), cudaMemcpyDeviceToHost, t->cfg.stream);
  if (e == cudaSuccess) e = cudaStreamSynchronize(t->cfg.stream);
  cudaError_t f = t->mem.free(t->mem.ctx, d);
  return e != cudaSuccess ? e : f;
}

cudaError_t backward_layer(train_t *t, int l, size_t n) {
  float *grad = NULL;
  TRY(t->mem.alloc(t->mem.ctx, n * sizeof(float), t->cfg.stream, (void **)&grad));
  cudaError_t e = ms_sample_relu_scale(grad, t->acts[l + 1], 1.0f, n, t->cfg.stream);
  /* The update reads the first `width` elements of the gradient (one sample's worth). */
  if (e == cudaSuccess)
    e = ms_sample_axpy(t->params[l], grad, -TRAIN_LR, n < t->cfg.width ? n : t->cfg.width,
                       t->cfg.stream);
  cudaError_t f = t->mem.free(t->mem.ctx, grad);
  cudaError_t g = t->mem.free(t->mem.ctx, t->acts[l + 1]);
  t->acts[l + 1] = NULL;
  return e != cudaSuccess ? e : f != cudaSuccess ? f : g;
}

cudaError_t workspace_for(train_t *t, int step) {
  /* 1 to 7 MiB, a different size every step (like a library's scratch space). */
  size_t size = ((size_t)1 + (size_t)(step * 5 % 7)) << 20;
  void *w = NULL;
  TRY(t->mem.alloc(t->mem.ctx, size, t->cfg.stream, &w));
  cudaError_t e = cudaMemsetAsync(w, 0, size, t->cfg.stream);
  cudaError_t f = t->mem.free(t->mem.ctx, w);
  return e != cudaSuccess ? e : f;
}

cudaError_t train_step(train_t *t, int step, bool *loss_ok) {
  size_t n = batch_of(t, step) * t->cfg.width;
  const float base = 1.0f, inc = 1.0f / 1024.0f;
  cudaError_t e = t->mem.alloc(t->mem.ctx, n * sizeof(float), t->cfg.stream, (void **)&t->acts[0]);
  if (e != cudaSuccess) return e;
  e = ms_sample_fill(t->acts[0], n, base, inc, t->cfg.stream);
  for (int l = 0; e == cudaSuccess && l < t->cfg.layers; l++) e = forward_layer(t, l, n);
  double loss = 0.0;
  if (e == cudaSuccess) e = workspace_for(t, step);
  if (e == cudaSuccess) e = loss_of(t, n, &loss);
  for (int l = t->cfg.layers - 1; l >= 0; l--) {
    if (e == cudaSuccess) e = backward_layer(t, l, n);
    if (t->acts[l + 1]) { /* after an error: free what is left */
      (void)t->mem.free(t->mem.ctx, t->acts[l + 1]);
      t->acts[l + 1] = NULL;
    }
  }
  (void)t->mem.free(t->mem.ctx, t->acts[0]);
  t->acts[0] = NULL;
  if (e != cudaSuccess) return e;
  /* sum(input) = (n / 1024) full periods of sum_{k<1024} (base + inc k), plus the tail. */
  double period = 1024.0 * base + inc * (1023.0 * 1024.0 / 2.0), want = 0.0;
  size_t full = n / 1024, rest = n % 1024;
  want = (double)full * period + (double)rest * base + inc * ((double)rest * (rest - 1) / 2.0);
  want *= pow(TRAIN_SCALE, t->cfg.layers);
  *loss_ok = fabs(loss - want) <= 1e-5 * want;
  if (!*loss_ok) fprintf(stderr, "train: step %d: loss %.9g, expected %.9g\n", step, loss, want);
  return cudaSuccess;
}
