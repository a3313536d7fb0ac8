/* SPDX-License-Identifier: MIT
 * memsnap CUDA sample 3 (issue #6): a CUDA graph captured into a private memory pool, then
 * replayed many times.
 *
 *   cuda_graph [--replays 1000] [--out snapshots]
 *
 * The allocations made while the stream is captured are routed to a private pool (PyTorch's
 * beginAllocateToPool; docs/pytorch-allocator.md, "Private pools and CUDA graphs"): the graph bakes
 * their addresses in, so the pool keeps that memory for as long as the graph may be replayed, even
 * across empty_cache. OUT/graph-pool.msgpack shows the pool's segments (segment_pool_id != (0,0))
 * next to the default pool's; OUT/graph-released.msgpack is taken after the graph is destroyed and
 * the pool released.
 */
#include <stdio.h>

#include "common.h"
#include "kernels.h"

#define N (1u << 20) /* elements per buffer (4 MiB) */

static bool only_stream(void *arg, ms_stream_t s) { return s == *(const ms_stream_t *)arg; }

static float *alloc_f(ms_allocator_t *a, size_t n, cudaStream_t s) {
  ms_devptr_t p;
  SAMPLE_MS(ms_allocator_malloc(a, n * sizeof(float), (ms_stream_t)(uintptr_t)s, &p));
  return (float *)p;
}

/* The work captured into the graph: y = relu(x) * 0.5; x += 2 y; out += sum(x). Its temporaries
 * come from the allocator, which routes them to the private pool while capturing. */
void captured_step(ms_allocator_t *a, cudaStream_t s, float *x, double *sum) {
  float *y = alloc_f(a, N, s);
  float *tmp = alloc_f(a, N / 4, s);
  SAMPLE_CK(ms_sample_relu_scale(y, x, 0.5f, N, s));
  SAMPLE_CK(ms_sample_fill(tmp, N / 4, 0.0f, 0.0f, s));
  SAMPLE_CK(ms_sample_axpy(x, y, 2.0f, N, s));
  SAMPLE_CK(ms_sample_sum(x, N, sum, s));
  /* Freed during the capture: the blocks stay in the private pool (the graph still uses them). */
  SAMPLE_MS(ms_allocator_free(a, (ms_devptr_t)tmp));
  SAMPLE_MS(ms_allocator_free(a, (ms_devptr_t)y));
}

int main(int argc, char **argv) {
  long replays = 1000;
  const char *out = "snapshots";
  const sample_opt_t opts[] = {
      {"replays", "number of graph replays (default 1000)", &replays, NULL},
      {"out", "directory for the snapshot files (default snapshots)", NULL, &out},
  };
  sample_parse(argc, argv, "Capture kernels into a CUDA graph with a private pool, replay it.",
               opts, sizeof opts / sizeof opts[0]);
  ms_backend_t *backend;
  ms_allocator_t *a;
  sample_open(sample_prog, &backend, &a);
  sample_record_history(a);

  cudaStream_t s;
  SAMPLE_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  ms_stream_t ms_s = (ms_stream_t)(uintptr_t)s;
  /* Inputs and outputs live in the default pool, outside the graph. */
  float *x = alloc_f(a, N, s);
  ms_devptr_t sum_p;
  SAMPLE_MS(ms_allocator_malloc(a, sizeof(double), ms_s, &sum_p));
  double *sum = (double *)sum_p;
  SAMPLE_CK(ms_sample_fill(x, N, 1.0f, 0.0f, s));
  SAMPLE_CK(cudaMemsetAsync(sum, 0, sizeof(double), s));
  captured_step(a, s, x, sum); /* warm-up, eagerly, as before any capture */
  SAMPLE_CK(cudaStreamSynchronize(s));

  ms_pool_id_t pool = ms_pool_id_new(true);
  SAMPLE_MS(ms_allocator_begin_allocate_to_pool(a, pool, only_stream, &ms_s));
  /* Global mode, as torch.cuda.graph's default: any synchronizing or freeing call made by the
   * allocator during the capture (from any thread) would invalidate it, and cudaStreamEndCapture
   * would fail. */
  SAMPLE_CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
  captured_step(a, s, x, sum);
  cudaGraph_t g;
  SAMPLE_CK(cudaStreamEndCapture(s, &g));
  SAMPLE_MS(ms_allocator_end_allocate_to_pool(a, pool));
  cudaGraphExec_t ge;
  SAMPLE_CK(cudaGraphInstantiate(&ge, g, 0));

  /* Reset the state, then replay: x doubles... x_k = x_{k-1} * (1 + 2*0.5) = 2^k for positive x;
   * keep it finite by replaying from x = 1 in rounds of 10. */
  double want = 0.0, got = 0.0;
  for (long done = 0; done < replays;) {
    SAMPLE_CK(ms_sample_fill(x, N, 1.0f, 0.0f, s));
    SAMPLE_CK(cudaMemsetAsync(sum, 0, sizeof(double), s));
    long k = replays - done < 10 ? replays - done : 10;
    for (long i = 0; i < k; i++) SAMPLE_CK(cudaGraphLaunch(ge, s));
    done += k;
    want = 0.0;
    for (long i = 1; i <= k; i++) want += (double)N * (double)(1L << i);
  }
  SAMPLE_CK(cudaMemcpyAsync(&got, sum, sizeof got, cudaMemcpyDeviceToHost, s));
  SAMPLE_CK(cudaStreamSynchronize(s));
  printf("%ld replays, last round's sum %.6g (expected %.6g)\n", replays, got, want);
  int bad = replays > 0 && got != want;

  SAMPLE_MS(ms_allocator_empty_cache(a)); /* the pool's memory stays: the graph may replay */
  sample_write_snapshot(a, out, "graph-pool.msgpack");

  SAMPLE_CK(cudaGraphExecDestroy(ge));
  SAMPLE_CK(cudaGraphDestroy(g));
  SAMPLE_MS(ms_allocator_release_pool(a, pool));
  SAMPLE_MS(ms_allocator_empty_cache(a));
  sample_write_snapshot(a, out, "graph-released.msgpack");

  SAMPLE_MS(ms_allocator_free(a, (ms_devptr_t)x));
  SAMPLE_MS(ms_allocator_free(a, sum_p));
  SAMPLE_MS(ms_allocator_empty_cache(a));
  ms_stats_t st = MS_STATS_INIT;
  SAMPLE_MS(ms_allocator_get_stats(a, &st));
  if (st.reserved_bytes[MS_STAT_ALL].current != 0 || st.segment[MS_STAT_ALL].current != 0) {
    fprintf(stderr, "%s: error: leak: %lld bytes in %lld segments still reserved after the pool "
                    "was released and everything freed\n",
            sample_prog, (long long)st.reserved_bytes[MS_STAT_ALL].current,
            (long long)st.segment[MS_STAT_ALL].current);
    bad = 1;
  }
  printf("no leak: nothing reserved after release_pool + empty_cache (%lld device allocations, "
         "%lld frees)\n",
         (long long)st.num_device_alloc, (long long)st.num_device_free);
  SAMPLE_CK(cudaStreamDestroy(s));
  ms_allocator_destroy(a);
  ms_backend_destroy(backend);
  if (bad) {
    fprintf(stderr, "%s: error: the replays computed a wrong sum, or memory leaked\n",
            sample_prog);
    return 1;
  }
  return 0;
}
