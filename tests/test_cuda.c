/* SPDX-License-Identifier: MIT
 * Tests for the cuda backend (lib/backend/cuda.c, issue #6) and for the allocator on it.
 *
 * One test always runs: opening "cuda" either works (a GPU is present) or fails with
 * MS_ENODEVICE and the text "no CUDA device: <cudaGetErrorString> (<cudaGetErrorName> from
 * cudaGetDeviceCount)", never a crash. Every other test needs a real device. A test skips (with a
 * visible "SKIP: no CUDA device ..." line) ONLY when no NVIDIA GPU is present on the machine, as
 * the kernel driver says (samples/cuda/gpu_present.h); with a GPU present, a backend that cannot
 * open (driver too old for the runtime, no context entry points ...), a device without virtual
 * memory management or any failing call is a FAILURE with its reason. MEMSNAP_REQUIRE_GPU=1
 * makes every test behave as if a GPU were present (scripts/gpu-verify.sh).
 *
 * With a device, the tests check the backend's contract (backend.h) on the real runtime: OOM is
 * MS_EOOM with the error state cleared, other CUDA errors are reported with their name and text,
 * the current device is restored, events on two streams, capture status, virtual memory; then the
 * allocator on the real device: the invariants of the sim model at a smaller scale (no two live
 * blocks overlap, each block holds what was written to it, the statistics add up, everything is
 * returned by empty_cache), record_stream with real events, OOM with the observer, and CUDA-graph
 * capture into a private pool.
 *
 * This program talks to the CUDA runtime directly (to create work on streams and to check memory
 * contents); the library itself confines CUDA to lib/backend/cuda.c.
 */
#include <criterion/criterion.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cuda_runtime_api.h>

#include "gpu_present.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"

/* ---- helpers ------------------------------------------------------------------------------- */

static int device_count_or_zero(cudaError_t *err) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  (void)cudaGetLastError();
  if (err) *err = e;
  return e == cudaSuccess ? n : 0;
}

/* Opens the cuda backend. Without a GPU on the machine: prints a visible SKIP line and skips the
 * test; with one, a failure to open FAILS the test with CUDA's reason. */
static ms_backend_t *open_or_skip(void) {
  ms_backend_t *b = NULL;
  ms_errbuf_t eb;
  int r = ms_backend_open("cuda", &b, &eb);
  char why[256];
  if (r != MS_OK && !ms_gpu_present(why, sizeof why)) {
    fprintf(stderr, "SKIP: %s (%s)\n", eb.msg, why);
    cr_skip_test("SKIP: %s", eb.msg);
  }
  cr_assert_eq(r, MS_OK, "a GPU is present (%s) but ms_backend_open(\"cuda\") failed: %s: %s", why,
               ms_err_name(r), eb.msg);
  return b;
}

static ms_allocator_t *allocator_on(ms_backend_t *b) {
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = &conf};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  return a;
}

static ms_stats_t stats_of(ms_allocator_t *a) {
  ms_stats_t st = MS_STATS_INIT;
  cr_assert_eq(ms_allocator_get_stats(a, &st), MS_OK);
  return st;
}

/* Captures the library's messages. */
static char captured[4096];
static void capture_output(const char *msg, void *arg) {
  (void)arg;
  size_t n = strlen(captured);
  snprintf(captured + n, sizeof captured - n, "%s\n", msg);
}

/* A gate: a host function enqueued on a stream that blocks the stream until the test opens the
 * gate. It makes "work still queued on a stream" deterministic, without timing assumptions. */
static atomic_int gate_open;
static void CUDART_CB gate_wait(void *arg) {
  (void)arg;
  struct timespec ts = {0, 100000};
  while (!atomic_load(&gate_open)) nanosleep(&ts, NULL);
}
static void gate_block(ms_stream_t s) {
  atomic_store(&gate_open, 0);
  cr_assert_eq(cudaLaunchHostFunc((cudaStream_t)(uintptr_t)s, gate_wait, NULL), cudaSuccess);
}
static void gate_release(void) { atomic_store(&gate_open, 1); }

/* ---- always runs -------------------------------------------------------------------------- */

Test(cuda, open_without_device_is_a_clear_error) {
  cudaError_t e;
  int n = device_count_or_zero(&e);
  ms_backend_t *sentinel = (ms_backend_t *)(uintptr_t)0x1234, *b = sentinel;
  ms_errbuf_t eb;
  int r = ms_backend_open("cuda", &b, &eb);
  if (n > 0) {
    cr_assert_eq(r, MS_OK, "%d devices but open failed: %s", n, eb.msg);
    int count = 0;
    cr_assert_str_eq(ms_backend_name(b), "cuda");
    cr_assert_eq(ms_backend_ops(b)->device_count(ms_backend_ops(b)->ctx, &count), MS_OK);
    cr_assert_eq(count, n);
    ms_backend_destroy(b);
    return;
  }
  char why[256];
  cr_assert(!ms_gpu_present(why, sizeof why),
            "a GPU is present (%s) but CUDA finds no device: %s", why, eb.msg);
  fprintf(stderr, "no CUDA device here: checking the error (%s)\n", eb.msg);
  cr_assert_eq(r, MS_ENODEVICE, "got %s", ms_err_name(r));
  cr_assert_eq(b, sentinel, "out-parameter written on failure");
  char want[512];
  if (e != cudaSuccess)
    snprintf(want, sizeof want, "no CUDA device: %s (%s from cudaGetDeviceCount)",
             cudaGetErrorString(e), cudaGetErrorName(e));
  else
    snprintf(want, sizeof want, "no CUDA device: cudaGetDeviceCount found none");
  cr_assert_str_eq(eb.msg, want);
  /* The direct constructor says the same, and so does a second attempt (nothing sticky). */
  ms_errbuf_t eb2;
  cr_assert_eq(ms_backend_cuda_create(&b, &eb2), MS_ENODEVICE);
  cr_assert_str_eq(eb2.msg, want);
  cr_assert_eq(b, sentinel);
  /* eb may be NULL. */
  cr_assert_eq(ms_backend_open("cuda", &b, NULL), MS_ENODEVICE);
}

/* ---- the backend on a real device ---------------------------------------------------------- */

Test(cuda, backend_malloc_writes_reads_and_frees, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  size_t f0, t0;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f0, &t0), MS_OK);
  cr_assert(t0 > 0 && f0 <= t0);
  ms_devptr_t p = 0;
  size_t sz = (size_t)3 << 20;
  cr_assert_eq(o->malloc(o->ctx, 0, sz, 0, &p), MS_OK);
  cr_assert_neq(p, 0);
  cr_assert_eq(p % 512, 0, "cudaMalloc aligns to at least 512 bytes");
  cr_assert_eq(cudaMemset((void *)p, 0x5a, sz), cudaSuccess);
  unsigned char head[64], tail[64];
  cr_assert_eq(cudaMemcpy(head, (void *)p, sizeof head, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(cudaMemcpy(tail, (void *)(p + sz - sizeof tail), sizeof tail,
                          cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t i = 0; i < sizeof head; i++) cr_assert(head[i] == 0x5a && tail[i] == 0x5a);
  size_t f1, t1;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f1, &t1), MS_OK);
  cr_assert_eq(t1, t0);
  cr_assert(f1 <= f0 - sz + ((size_t)2 << 20), "free memory did not drop: %zu -> %zu", f0, f1);
  cr_assert_eq(o->free(o->ctx, 0, p), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, 0, 0, 0, &p), MS_EINVAL);
  ms_backend_destroy(b);
}

Test(cuda, backend_oom_is_eoom_and_clears_the_error, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  size_t f, t;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f, &t), MS_OK);
  ms_devptr_t p = 0xdead;
  cr_assert_eq(o->malloc(o->ctx, 0, t + ((size_t)1 << 30), 0, &p), MS_EOOM);
  cr_assert_eq(p, 0xdead, "out-parameter written on failure");
  cr_assert_eq(cudaGetLastError(), cudaSuccess, "the OOM error state was not cleared");
  cr_assert_eq(o->malloc(o->ctx, 0, 4096, 0, &p), MS_OK);
  cr_assert_eq(o->free(o->ctx, 0, p), MS_OK);
  ms_backend_destroy(b);
}

Test(cuda, backend_errors_carry_cuda_name_and_text, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  captured[0] = 0;
  ms_set_output(capture_output, NULL);
  /* Destroying an event twice is a non-sticky cudaErrorInvalidResourceHandle (or the driver
   * reports the handle as invalid value); either way a named error and MS_EINVAL. */
  ms_event_t ev;
  cr_assert_eq(o->event_create(o->ctx, 0, &ev), MS_OK);
  cr_assert_eq(o->event_destroy(o->ctx, 0, ev), MS_OK);
  int r = o->free(o->ctx, 0, (ms_devptr_t)0x10); /* not a device pointer */
  ms_set_output(NULL, NULL);
  cr_assert_neq(r, MS_OK);
  cr_assert_neq(r, MS_EOOM);
  cr_assert(strstr(captured, "memsnap: error: cuda: cudaFree on device 0: ") != NULL, "%s",
            captured);
  cr_assert(strstr(captured, "cudaError") != NULL, "no cudaGetErrorName in: %s", captured);
  /* The error state does not leak into the next call. */
  ms_devptr_t p;
  cr_assert_eq(o->malloc(o->ctx, 0, 4096, 0, &p), MS_OK);
  cr_assert_eq(o->free(o->ctx, 0, p), MS_OK);
  /* A device index out of range. */
  int n = 0;
  cr_assert_eq(o->device_count(o->ctx, &n), MS_OK);
  cr_assert_eq(o->malloc(o->ctx, n, 4096, 0, &p), MS_ENODEVICE);
  cr_assert_eq(o->malloc(o->ctx, -1, 4096, 0, &p), MS_ENODEVICE);
  ms_backend_destroy(b);
}

Test(cuda, backend_restores_the_current_device, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  int n = 0;
  cr_assert_eq(o->device_count(o->ctx, &n), MS_OK);
  for (int cur = 0; cur < n; cur++) {
    cr_assert_eq(cudaSetDevice(cur), cudaSuccess);
    for (int d = 0; d < n; d++) {
      ms_devptr_t p;
      size_t f, t;
      cr_assert_eq(o->malloc(o->ctx, d, 1 << 20, 0, &p), MS_OK);
      struct cudaPointerAttributes attr;
      cr_assert_eq(cudaPointerGetAttributes(&attr, (void *)p), cudaSuccess);
      cr_assert_eq(attr.device, d, "allocated on device %d, wanted %d", attr.device, d);
      cr_assert_eq(o->mem_info(o->ctx, d, &f, &t), MS_OK);
      cr_assert_eq(o->free(o->ctx, d, p), MS_OK);
      int now = -1;
      cr_assert_eq(cudaGetDevice(&now), cudaSuccess);
      cr_assert_eq(now, cur, "current device changed from %d to %d", cur, now);
    }
  }
  ms_backend_destroy(b);
}

Test(cuda, backend_events_on_two_streams, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_stream_t s1, s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s1), MS_OK);
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  cr_assert(s1 != 0 && s2 != 0 && s1 != s2);
  ms_event_t e1, e2;
  cr_assert_eq(o->event_create(o->ctx, 0, &e1), MS_OK);
  cr_assert_eq(o->event_create(o->ctx, 0, &e2), MS_OK);
  bool done = false;
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
  cr_assert(done, "an event never recorded counts as completed");
  gate_block(s1);
  cr_assert_eq(o->event_record(o->ctx, 0, e1, s1), MS_OK);
  cr_assert_eq(o->event_record(o->ctx, 0, e2, s2), MS_OK);
  cr_assert_eq(o->event_synchronize(o->ctx, 0, e2), MS_OK);
  cr_assert_eq(o->event_query(o->ctx, 0, e2, &done), MS_OK);
  cr_assert(done, "s2 has no queued work");
  for (int i = 0; i < 3; i++) {
    cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
    cr_assert(!done, "s1 is blocked by the gate");
  }
  cr_assert_eq(cudaGetLastError(), cudaSuccess, "cudaErrorNotReady was left behind");
  gate_release();
  cr_assert_eq(o->event_synchronize(o->ctx, 0, e1), MS_OK);
  cr_assert_eq(o->event_query(o->ctx, 0, e1, &done), MS_OK);
  cr_assert(done);
  cr_assert_eq(o->device_synchronize(o->ctx, 0), MS_OK);
  cr_assert_eq(o->event_destroy(o->ctx, 0, e1), MS_OK);
  cr_assert_eq(o->event_destroy(o->ctx, 0, e2), MS_OK);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, 0), MS_EINVAL);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s1), MS_OK);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s2), MS_OK);
  ms_backend_destroy(b);
}

Test(cuda, backend_reports_stream_capture, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  cr_assert_not_null(o->stream_capture_info);
  ms_stream_t s;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s), MS_OK);
  bool cap = true;
  uint64_t id = 7;
  cr_assert_eq(o->stream_capture_info(o->ctx, 0, s, &cap, &id), MS_OK);
  cr_assert(!cap && id == 0);
  cudaStream_t cs = (cudaStream_t)(uintptr_t)s;
  cr_assert_eq(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), cudaSuccess);
  cr_assert_eq(o->stream_capture_info(o->ctx, 0, s, &cap, &id), MS_OK);
  cr_assert(cap && id != 0);
  /* A segment can be allocated during the capture (relaxed mode inside malloc). */
  ms_devptr_t p;
  cr_assert_eq(o->malloc(o->ctx, 0, 1 << 20, s, &p), MS_OK);
  cr_assert_eq(cudaMemsetAsync((void *)p, 1, 1 << 20, cs), cudaSuccess);
  cudaGraph_t g;
  cr_assert_eq(cudaStreamEndCapture(cs, &g), cudaSuccess);
  cr_assert_eq(o->stream_capture_info(o->ctx, 0, s, &cap, &id), MS_OK);
  cr_assert(!cap && id == 0);
  cr_assert_eq(cudaGraphDestroy(g), cudaSuccess);
  cr_assert_eq(o->free(o->ctx, 0, p), MS_OK);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s), MS_OK);
  ms_backend_destroy(b);
}

Test(cuda, backend_virtual_memory_maps_and_unmaps_pages, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  cr_assert(o->va_reserve != NULL,
            "device 0 is present but the cuda backend has no virtual-memory operations (the "
            "driver lacks cuMemCreate/cuMemMap..., or the device lacks "
            "CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED): expandable segments "
            "cannot work here");
  size_t page = (size_t)2 << 20;
  if (o->mem_granularity) cr_assert_eq(o->mem_granularity(o->ctx, 0, &page), MS_OK);
  cr_assert(page > 0 && ((size_t)2 << 20) % page == 0, "granularity %zu does not divide 2 MiB",
            page);
  page = (size_t)2 << 20;
  ms_devptr_t base;
  cr_assert_eq(o->va_reserve(o->ctx, 0, 8 * page, &base), MS_OK);
  cr_assert_eq(base % page, 0);
  /* One mem_map is one physical allocation: three single pages, then one of two pages. */
  for (int i = 1; i <= 3; i++)
    cr_assert_eq(o->mem_map(o->ctx, 0, base + (size_t)i * page, page), MS_OK);
  cr_assert_eq(o->mem_map(o->ctx, 0, base + 5 * page, 2 * page), MS_OK);
  cr_assert_eq(o->mem_map(o->ctx, 0, base + 2 * page, page), MS_ESTATE, "mapped twice");
  cr_assert_eq(cudaMemset((void *)(base + page), 0x33, 3 * page), cudaSuccess);
  cr_assert_eq(cudaMemset((void *)(base + 5 * page), 0x44, 2 * page), cudaSuccess);
  unsigned char c = 0;
  cr_assert_eq(cudaMemcpy(&c, (void *)(base + 4 * page - 1), 1, cudaMemcpyDeviceToHost),
               cudaSuccess);
  cr_assert_eq(c, 0x33);
  /* A run of whole mapped ranges can be unmapped; part of a range, or a run with a hole,
   * cannot. */
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 2 * page, page), MS_OK);
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + page, 2 * page), MS_ESTATE, "a hole");
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 5 * page, page), MS_ESTATE, "half a range");
  cr_assert_eq(o->va_release(o->ctx, 0, base, 8 * page), MS_ESTATE, "pages still mapped");
  cr_assert_eq(cudaMemcpy(&c, (void *)(base + 7 * page - 1), 1, cudaMemcpyDeviceToHost),
               cudaSuccess);
  cr_assert_eq(c, 0x44, "a refused unmap changed nothing");
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + page, page), MS_OK);
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 3 * page, page), MS_OK);
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 5 * page, 2 * page), MS_OK);
  cr_assert_eq(o->va_release(o->ctx, 0, base, 8 * page), MS_OK);
  cr_assert_eq(o->mem_map(o->ctx, 0, base + 1, page), MS_EINVAL);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  ms_backend_destroy(b);
}

/* ---- the allocator on a real device ------------------------------------------------------- */

typedef struct live_s {
  ms_devptr_t p;
  size_t size;
  unsigned char tag;
} live_t;

static int live_cmp(const void *x, const void *y) {
  const live_t *a = x, *b = y;
  return a->p < b->p ? -1 : a->p > b->p;
}

static void check_live(live_t *live, size_t n) {
  live_t *sorted = malloc(n * sizeof *sorted + 1);
  memcpy(sorted, live, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, live_cmp);
  for (size_t i = 0; i + 1 < n; i++)
    cr_assert(sorted[i].p + sorted[i].size <= sorted[i + 1].p, "live blocks overlap");
  cr_assert_eq(cudaDeviceSynchronize(), cudaSuccess);
  for (size_t i = 0; i < n; i++) {
    unsigned char first = 0, last = 0;
    cr_assert_eq(cudaMemcpy(&first, (void *)live[i].p, 1, cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert_eq(cudaMemcpy(&last, (void *)(live[i].p + live[i].size - 1), 1,
                            cudaMemcpyDeviceToHost), cudaSuccess);
    cr_assert(first == live[i].tag && last == live[i].tag,
              "block %#llx holds %u/%u, wrote %u", (unsigned long long)live[i].p, first, last,
              live[i].tag);
  }
  free(sorted);
}

Test(cuda, allocator_invariants_on_the_device, .timeout = 120) {
  ms_backend_t *b = open_or_skip();
  ms_allocator_t *a = allocator_on(b);
  enum { MAXLIVE = 48, STEPS = 400 };
  live_t live[MAXLIVE];
  size_t n = 0;
  uint64_t rng = 0x9e3779b97f4a7c15ull;
  int64_t requested = 0;
  for (int step = 0; step < STEPS; step++) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    unsigned r = (unsigned)(rng >> 33);
    if (n == MAXLIVE || (n > 0 && r % 3 == 0)) {
      size_t i = r % n;
      cr_assert_eq(ms_allocator_free(a, live[i].p), MS_OK);
      requested -= (int64_t)live[i].size;
      live[i] = live[--n];
    } else {
      /* Sizes from a few bytes to 12 MiB: small pool, large pool, oversize splits. */
      size_t size = (r % 4 == 0) ? 1 + r % 4000 : (r % 4 == 1) ? 1 + r % (1u << 20)
                                                               : 1 + r % (12u << 20);
      ms_devptr_t p = 0;
      cr_assert_eq(ms_allocator_malloc(a, size, 0, &p), MS_OK, "malloc(%zu)", size);
      unsigned char tag = (unsigned char)(1 + step % 250);
      cr_assert_eq(cudaMemsetAsync((void *)p, tag, size, 0), cudaSuccess);
      live[n++] = (live_t){p, size, tag};
      requested += (int64_t)size;
    }
    if (step % 50 == 49) {
      check_live(live, n);
      ms_stats_t st = stats_of(a);
      cr_assert_eq(st.allocation[MS_STAT_ALL].current, (int64_t)n);
      cr_assert_eq(st.requested_bytes[MS_STAT_ALL].current, requested);
      cr_assert(st.allocated_bytes[MS_STAT_ALL].current >= requested);
      cr_assert(st.reserved_bytes[MS_STAT_ALL].current >= st.allocated_bytes[MS_STAT_ALL].current);
      cr_assert_eq(st.allocated_bytes[MS_STAT_ALL].current,
                   st.allocated_bytes[MS_STAT_SMALL_POOL].current +
                       st.allocated_bytes[MS_STAT_LARGE_POOL].current);
    }
  }
  check_live(live, n);
  while (n) cr_assert_eq(ms_allocator_free(a, live[--n].p), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  ms_stats_t st = stats_of(a);
  cr_assert_eq(st.allocated_bytes[MS_STAT_ALL].current, 0);
  cr_assert_eq(st.reserved_bytes[MS_STAT_ALL].current, 0);
  cr_assert_eq(st.segment[MS_STAT_ALL].current, 0);
  cr_assert_eq(st.num_device_alloc, st.num_device_free);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

Test(cuda, allocator_cache_hits_reuse_device_memory, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  ms_allocator_t *a = allocator_on(b);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 1000000, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  int64_t allocs = stats_of(a).num_device_alloc;
  for (int i = 0; i < 100; i++) {
    cr_assert_eq(ms_allocator_malloc(a, 1000000, 0, &q), MS_OK);
    cr_assert_eq(q, p, "a cache hit returns the cached block");
    cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  }
  cr_assert_eq(stats_of(a).num_device_alloc, allocs, "a cache hit must not call cudaMalloc");
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

Test(cuda, allocator_record_stream_waits_for_real_events, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b);
  ms_stream_t s1, s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s1), MS_OK);
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  const size_t sz = (size_t)4 << 20;
  ms_devptr_t p, q, r;
  cr_assert_eq(ms_allocator_malloc(a, sz, s1, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, s2), MS_OK);
  gate_block(s2); /* s2 still "uses" p */
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, sz, s1, &q), MS_OK);
  cr_assert(q + sz <= p || p + sz <= q, "reused a block whose stream event is pending");
  ms_stats_t st = stats_of(a);
  cr_assert_eq(st.active_bytes[MS_STAT_ALL].current, st.allocated_bytes[MS_STAT_ALL].current +
                                                         (int64_t)sz,
               "the pending block stays active until its event completes");
  gate_release();
  cr_assert_eq(cudaStreamSynchronize((cudaStream_t)(uintptr_t)s2), cudaSuccess);
  /* The next malloc processes the completed event: p is free again and is the best fit. */
  cr_assert_eq(ms_allocator_malloc(a, sz, s1, &r), MS_OK);
  cr_assert_eq(r, p);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_free(a, r), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(stats_of(a).reserved_bytes[MS_STAT_ALL].current, 0);
  ms_allocator_destroy(a);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s1), MS_OK);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s2), MS_OK);
  ms_backend_destroy(b);
}

typedef struct oom_seen_s {
  int calls;
  size_t alloc_size, device_total, device_free;
} oom_seen_t;

static void oom_observer(void *arg, int device, size_t alloc_size, size_t device_total,
                         size_t device_free) {
  oom_seen_t *s = arg;
  (void)device;
  s->calls++;
  s->alloc_size = alloc_size;
  s->device_total = device_total;
  s->device_free = device_free;
}

Test(cuda, allocator_oom_on_the_device_calls_the_observer, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b);
  oom_seen_t seen = {0};
  cr_assert_eq(ms_allocator_attach_oom_observer(a, oom_observer, &seen), MS_OK);
  size_t f, t;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f, &t), MS_OK);
  ms_devptr_t p = 0xbeef;
  cr_assert_eq(ms_allocator_malloc(a, t + ((size_t)1 << 30), 0, &p), MS_EOOM);
  cr_assert_eq(p, 0xbeef);
  cr_assert_eq(seen.calls, 1);
  cr_assert_eq(seen.device_total, t);
  cr_assert(seen.alloc_size >= t + ((size_t)1 << 30));
  char msg[1024];
  cr_assert(ms_allocator_last_oom_message(a, msg, sizeof msg) > 0);
  cr_assert(strstr(msg, "out of memory") != NULL, "%s", msg);
  cr_assert_eq(stats_of(a).num_ooms, 1);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  cr_assert_eq(ms_allocator_malloc(a, 1 << 20, 0, &p), MS_OK, "recovers after the OOM");
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

static bool only_stream(void *arg, ms_stream_t s) { return s == *(ms_stream_t *)arg; }

Test(cuda, allocator_graph_capture_uses_a_private_pool, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b);
  ms_stream_t s;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s), MS_OK);
  cudaStream_t cs = (cudaStream_t)(uintptr_t)s;
  ms_devptr_t outside;
  cr_assert_eq(ms_allocator_malloc(a, 1 << 20, s, &outside), MS_OK);
  cr_assert_eq(ms_allocator_free(a, outside), MS_OK); /* cached in the default pool */
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(a, id, only_stream, &s), MS_OK);
  cr_assert_eq(cudaStreamBeginCapture(cs, cudaStreamCaptureModeGlobal), cudaSuccess);
  ms_devptr_t p1, p2;
  cr_assert_eq(ms_allocator_malloc(a, 1 << 20, s, &p1), MS_OK);
  cr_assert_neq(p1, outside, "a capture must not take blocks of the default pool");
  cr_assert_eq(cudaMemsetAsync((void *)p1, 7, 1 << 20, cs), cudaSuccess);
  cr_assert_eq(ms_allocator_malloc(a, 3 << 20, s, &p2), MS_OK);
  cr_assert_eq(cudaMemcpyAsync((void *)p2, (void *)p1, 1 << 20, cudaMemcpyDeviceToDevice, cs),
               cudaSuccess);
  cr_assert_eq(ms_allocator_free(a, p1), MS_OK); /* during capture: stays in the private pool */
  cudaGraph_t g;
  cr_assert_eq(cudaStreamEndCapture(cs, &g), cudaSuccess);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(a, id), MS_OK);
  cudaGraphExec_t ge;
  cr_assert_eq(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
  for (int i = 0; i < 20; i++) cr_assert_eq(cudaGraphLaunch(ge, cs), cudaSuccess);
  cr_assert_eq(cudaStreamSynchronize(cs), cudaSuccess);
  unsigned char c = 0;
  cr_assert_eq(cudaMemcpy(&c, (void *)(p2 + 12345), 1, cudaMemcpyDeviceToHost), cudaSuccess);
  cr_assert_eq(c, 7, "the replays wrote through the pool's memory");
  /* The pool's memory is kept while the graph lives: empty_cache does not return it. */
  int64_t reserved = stats_of(a).reserved_bytes[MS_STAT_ALL].current;
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert(stats_of(a).reserved_bytes[MS_STAT_ALL].current >= (int64_t)(4 << 20));
  cr_assert(stats_of(a).reserved_bytes[MS_STAT_ALL].current <= reserved);
  cr_assert_eq(cudaGraphExecDestroy(ge), cudaSuccess);
  cr_assert_eq(cudaGraphDestroy(g), cudaSuccess);
  cr_assert_eq(ms_allocator_free(a, p2), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(stats_of(a).reserved_bytes[MS_STAT_ALL].current, 0);
  ms_allocator_destroy(a);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s), MS_OK);
  ms_backend_destroy(b);
}

/* ---- issue #15 on the device: three streams, expandable segments end to end ---------------- */

/* Gates of their own (one per stream), so that each stream can be released separately. */
static void CUDART_CB gate_wait_on(void *arg) {
  atomic_int *g = arg;
  struct timespec ts = {0, 100000};
  while (!atomic_load(g)) nanosleep(&ts, NULL);
}

Test(cuda, allocator_record_stream_across_three_streams, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b);
  ms_stream_t s[3];
  for (int i = 0; i < 3; i++) cr_assert_eq(o->stream_create(o->ctx, 0, &s[i]), MS_OK);
  static atomic_int g1, g2;
  atomic_store(&g1, 0);
  atomic_store(&g2, 0);
  const size_t sz = (size_t)8 << 20;
  ms_devptr_t p, q, r;
  cr_assert_eq(ms_allocator_malloc(a, sz, s[0], &p), MS_OK);
  cr_assert_eq(cudaMemsetAsync((void *)p, 1, sz, (cudaStream_t)(uintptr_t)s[0]), cudaSuccess);
  cr_assert_eq(ms_allocator_record_stream(a, p, s[1]), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, s[2]), MS_OK);
  cr_assert_eq(cudaLaunchHostFunc((cudaStream_t)(uintptr_t)s[1], gate_wait_on, &g1), cudaSuccess);
  cr_assert_eq(cudaLaunchHostFunc((cudaStream_t)(uintptr_t)s[2], gate_wait_on, &g2), cudaSuccess);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, sz, s[0], &q), MS_OK);
  cr_assert(q + sz <= p || p + sz <= q, "reused while two streams still use it");
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  /* One of the two streams done: still pending on the other. */
  atomic_store(&g1, 1);
  cr_assert_eq(cudaStreamSynchronize((cudaStream_t)(uintptr_t)s[1]), cudaSuccess);
  cr_assert_eq(ms_allocator_malloc(a, sz, s[0], &r), MS_OK);
  cr_assert_neq(r, p, "reused while the third stream still uses it");
  cr_assert_eq(r, q, "the free block of the same size is the one taken");
  ms_stats_t st = stats_of(a);
  cr_assert_eq(st.active_bytes[MS_STAT_ALL].current,
               st.allocated_bytes[MS_STAT_ALL].current + (int64_t)sz);
  cr_assert_eq(ms_allocator_free(a, r), MS_OK);
  atomic_store(&g2, 1);
  cr_assert_eq(cudaStreamSynchronize((cudaStream_t)(uintptr_t)s[2]), cudaSuccess);
  ms_devptr_t x, y;
  cr_assert_eq(ms_allocator_malloc(a, sz, s[0], &x), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, sz, s[0], &y), MS_OK);
  cr_assert((x == p || y == p), "p is free again once every stream is done");
  cr_assert_eq(ms_allocator_free(a, x), MS_OK);
  cr_assert_eq(ms_allocator_free(a, y), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(stats_of(a).reserved_bytes[MS_STAT_ALL].current, 0);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  ms_allocator_destroy(a);
  for (int i = 0; i < 3; i++) cr_assert_eq(o->stream_destroy(o->ctx, 0, s[i]), MS_OK);
  ms_backend_destroy(b);
}

/* Expandable segments end to end on the device: grow one range to half of the free memory in
 * 60 MiB blocks (3 pages of 20 MiB each), shrink it (free every other block, empty_cache unmaps
 * their pages and the driver gets the memory back), remap blocks of 2x and 0.5x the size in the
 * holes, ask for twice the device (an OOM that changes nothing), then return everything. */
Test(cuda, expandable_segments_grow_shrink_unmap_remap, .timeout = 240) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  cr_assert(o->va_reserve != NULL, "device 0 has no virtual memory management");
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  conf.expandable_segments = true;
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = &conf};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  size_t f0, total;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f0, &total), MS_OK);
  const size_t chunk = (size_t)60 << 20;
  size_t nblocks = (f0 / 2) / chunk;
  if (nblocks > 1024) nblocks = 1024;
  cr_assert(nblocks >= 4, "device 0 has less than 480 MiB free (%zu bytes)", f0);
  live_t *live = calloc(nblocks + 4, sizeof *live);
  cr_assert(live != NULL);
  /* Grow. */
  for (size_t i = 0; i < nblocks; i++) {
    cr_assert_eq(ms_allocator_malloc(a, chunk, 0, &live[i].p), MS_OK, "block %zu", i);
    live[i].size = chunk;
    live[i].tag = (unsigned char)(1 + i % 250);
    cr_assert_eq(cudaMemsetAsync((void *)live[i].p, live[i].tag, chunk, 0), cudaSuccess);
    if (i) cr_assert_eq(live[i].p, live[i - 1].p + chunk, "the range grows in place");
  }
  check_live(live, nblocks);
  ms_stats_t st = stats_of(a);
  cr_assert_eq(st.reserved_bytes[MS_STAT_ALL].current, (int64_t)(nblocks * chunk));
  cr_assert_eq(st.segment[MS_STAT_ALL].current, 0, "expandable memory is never a segment");
  size_t f1, t1;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f1, &t1), MS_OK);
  cr_assert(f0 - f1 >= nblocks * chunk, "the driver lent the mapped pages (%zu < %zu)", f0 - f1,
            nblocks * chunk);
  /* Shrink: every other block freed, their pages unmapped by empty_cache. */
  size_t kept = 0, freed = 0;
  for (size_t i = 0; i < nblocks; i++) {
    if (i % 2) {
      cr_assert_eq(ms_allocator_free(a, live[i].p), MS_OK);
      freed += chunk;
    } else {
      live[kept++] = live[i];
    }
  }
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  st = stats_of(a);
  cr_assert_eq(st.reserved_bytes[MS_STAT_ALL].current, (int64_t)(nblocks * chunk - freed),
               "each freed 60 MiB block is exactly 3 whole pages");
  size_t f2, t2;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f2, &t2), MS_OK);
  cr_assert(f2 >= f1 + freed - ((size_t)64 << 20), "the unmapped pages went back to the driver");
  check_live(live, kept);
  /* Remap into the holes: 2x (needs two adjacent holes? no: one hole is 60 MiB, so a 120 MiB
   * block maps new pages at the end or a fresh range) and 0.5x (fits a hole). */
  ms_devptr_t big, half;
  cr_assert_eq(ms_allocator_malloc(a, 2 * chunk, 0, &big), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, chunk / 2, 0, &half), MS_OK);
  live[kept++] = (live_t){big, 2 * chunk, 251};
  live[kept++] = (live_t){half, chunk / 2, 252};
  cr_assert_eq(cudaMemsetAsync((void *)big, 251, 2 * chunk, 0), cudaSuccess);
  cr_assert_eq(cudaMemsetAsync((void *)half, 252, chunk / 2, 0), cudaSuccess);
  check_live(live, kept);
  /* Twice the device: an OOM that leaves everything as it was. */
  ms_devptr_t none = 0xbeef;
  int64_t reserved = stats_of(a).reserved_bytes[MS_STAT_ALL].current;
  cr_assert_eq(ms_allocator_malloc(a, 2 * total, 0, &none), MS_EOOM);
  cr_assert_eq(none, 0xbeef);
  cr_assert(stats_of(a).reserved_bytes[MS_STAT_ALL].current <= reserved);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  check_live(live, kept);
  /* Everything back. */
  for (size_t i = 0; i < kept; i++) cr_assert_eq(ms_allocator_free(a, live[i].p), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  st = stats_of(a);
  cr_assert_eq(st.reserved_bytes[MS_STAT_ALL].current, 0);
  cr_assert_eq(st.active_bytes[MS_STAT_ALL].current, 0);
  size_t f3, t3;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f3, &t3), MS_OK);
  cr_assert(f3 + ((size_t)64 << 20) >= f0, "memory not returned: %zu free at the start, %zu now",
            f0, f3);
  free(live);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* What the backend sees of a capture it was not told about (the fake CUDA models the same; this
 * test settles it on the real driver): on a blocking stream the legacy stream reports it, so
 * cudaFree and the synchronizations are refused and the capture survives; on a non-blocking
 * stream nothing is visible from the legacy stream (docs/gpu.md, known limits). */
Test(cuda, backend_refuses_frees_and_syncs_during_a_capture_on_a_blocking_stream, .timeout = 60) {
  ms_backend_t *b = open_or_skip();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  captured[0] = 0;
  ms_set_output(capture_output, NULL);
  cudaStream_t bs;
  cr_assert_eq(cudaStreamCreate(&bs), cudaSuccess); /* blocking */
  ms_devptr_t raw;
  cr_assert_eq(o->malloc(o->ctx, 0, 1 << 20, 0, &raw), MS_OK);
  ms_event_t ev;
  cr_assert_eq(o->event_create(o->ctx, 0, &ev), MS_OK);
  cr_assert_eq(cudaStreamBeginCapture(bs, cudaStreamCaptureModeGlobal), cudaSuccess);
  cr_assert_eq(cudaMemsetAsync((void *)raw, 3, 1 << 20, bs), cudaSuccess);
  bool cap = false;
  uint64_t id = 0;
  cr_assert_eq(o->stream_capture_info(o->ctx, 0, 0, &cap, &id), MS_OK);
  cr_assert(cap, "the legacy stream does not report the capture on a blocking stream");
  cr_assert_eq(o->free(o->ctx, 0, raw), MS_ESTATE);
  cr_assert_eq(o->device_synchronize(o->ctx, 0), MS_ESTATE);
  cr_assert_eq(o->event_synchronize(o->ctx, 0, ev), MS_ESTATE);
  bool done = true;
  cr_assert_eq(o->event_query(o->ctx, 0, ev, &done), MS_OK);
  cr_assert(!done);
  cudaGraph_t g;
  cr_assert_eq(cudaStreamEndCapture(bs, &g), cudaSuccess, "the capture was invalidated");
  cr_assert_eq(cudaGraphDestroy(g), cudaSuccess);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  cr_assert_eq(o->free(o->ctx, 0, raw), MS_OK);
  /* A non-blocking stream's capture is not visible from the legacy stream. */
  ms_stream_t nb;
  cr_assert_eq(o->stream_create(o->ctx, 0, &nb), MS_OK);
  cr_assert_eq(cudaStreamBeginCapture((cudaStream_t)(uintptr_t)nb, cudaStreamCaptureModeGlobal),
               cudaSuccess);
  cr_assert_eq(o->stream_capture_info(o->ctx, 0, nb, &cap, &id), MS_OK);
  cr_assert(cap, "the capturing stream itself reports it");
  cr_assert_eq(o->stream_capture_info(o->ctx, 0, 0, &cap, &id), MS_OK);
  cr_log_info("legacy stream during a non-blocking capture: %s", cap ? "capturing" : "not capturing");
  cr_assert_eq(cudaStreamEndCapture((cudaStream_t)(uintptr_t)nb, &g), cudaSuccess);
  cr_assert_eq(cudaGraphDestroy(g), cudaSuccess);
  ms_set_output(NULL, NULL);
  cr_assert_eq(o->event_destroy(o->ctx, 0, ev), MS_OK);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, nb), MS_OK);
  cr_assert_eq(cudaStreamDestroy(bs), cudaSuccess);
  ms_backend_destroy(b);
}
