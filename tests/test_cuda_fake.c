/* SPDX-License-Identifier: MIT
 * The cuda backend (lib/backend/cuda.c) and the allocator on it, driven through the fault-
 * injecting fake of the CUDA runtime and driver (tests/fakecuda, issue #15): no GPU needed.
 *
 * Every failure path of issue #15 is forced here and checked the same way: the error reaches the
 * caller (return code and the reported "cuda: <call> on device N: <name>: <text>" line), and the
 * books stay right (memory_stats, the fake's own count of live device memory, segments).
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#include "fakecuda/fakecuda.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"

#define MiB ((size_t)1 << 20)

/* ---- helpers ------------------------------------------------------------------------------- */

static char captured[8192];
static void capture_output(const char *msg, void *arg) {
  (void)arg;
  size_t n = strlen(captured);
  snprintf(captured + n, sizeof captured - n, "%s\n", msg);
}

static void setup(void) {
  /* The backend loads its runtime at run time (lib/backend/cudart.c): the fake, already linked
   * into this program, is the one it finds (dlopen of the same file). */
  setenv("MEMSNAP_CUDART", MS_FAKECUDA_SO, 1);
  fakecuda_reset();
  captured[0] = 0;
  ms_set_output(capture_output, NULL);
}

static void teardown(void) {
  ms_set_output(NULL, NULL);
}

TestSuite(cuda_fake, .init = setup, .fini = teardown, .timeout = 30);

static ms_backend_t *open_cuda(void) {
  ms_backend_t *b = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_backend_cuda_create(&b, &eb), MS_OK, "%s", eb.msg);
  return b;
}

static ms_allocator_t *allocator_on(ms_backend_t *b, int device, bool expandable) {
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  conf.expandable_segments = expandable;
  ms_allocator_config_t cfg = {.backend = b, .device = device, .alloc = &conf};
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

#define RESERVED(a) (stats_of(a).reserved_bytes[MS_STAT_ALL].current)
#define ACTIVE(a) (stats_of(a).active_bytes[MS_STAT_ALL].current)
#define ALLOCATED(a) (stats_of(a).allocated_bytes[MS_STAT_ALL].current)
#define SEGMENTS(a) (stats_of(a).segment[MS_STAT_ALL].current)

static void expect_reported(const char *what) {
  cr_assert(strstr(captured, what) != NULL, "expected \"%s\" in the reports:\n%s", what, captured);
}

/* ---- opening ------------------------------------------------------------------------------- */

Test(cuda_fake, open_without_device_or_with_an_old_driver) {
  ms_backend_t *b = (ms_backend_t *)(uintptr_t)0x1234;
  ms_errbuf_t eb;
  fakecuda_set_device_count(0);
  cr_assert_eq(ms_backend_cuda_create(&b, &eb), MS_ENODEVICE);
  cr_assert_str_eq(eb.msg, "no CUDA device: no CUDA-capable device is detected "
                           "(cudaErrorNoDevice from cudaGetDeviceCount)");
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess, "our own error state is cleared");
  fakecuda_set_device_count(1);
  fakecuda_set_driver_version(12020);
  cr_assert_eq(ms_backend_open("cuda", &b, &eb), MS_ENODEVICE);
  cr_assert_str_eq(eb.msg, "no CUDA device: CUDA driver version is insufficient for CUDA runtime "
                           "version (cudaErrorInsufficientDriver from cudaGetDeviceCount)");
  cr_assert_eq(b, (ms_backend_t *)(uintptr_t)0x1234, "out-parameter untouched on failure");
  /* Without the driver's context entry points the backend refuses to open. */
  fakecuda_set_driver_version(13000);
  fakecuda_fail("cuCtxGetCurrent:missing", 1, 1, 1);
  cr_assert_eq(ms_backend_cuda_create(&b, &eb), MS_EBACKEND);
  cr_assert(strstr(eb.msg, "cuCtxGetCurrent") != NULL, "%s", eb.msg);
}

/* Without a loadable runtime (a machine without CUDA) the backend says so; the answer is the
 * same when asked again (the runtime is loaded once per process). */
Test(cuda_fake, open_without_the_runtime) {
  setenv("MEMSNAP_CUDART", "/nonexistent", 1);
  ms_backend_t *b = (ms_backend_t *)(uintptr_t)0x1234;
  ms_errbuf_t eb;
  for (int i = 0; i < 2; i++) {
    cr_assert_eq(ms_backend_open("cuda", &b, &eb), MS_ENODEVICE);
    cr_assert_str_eq(eb.msg, "cuda backend: cannot load the CUDA runtime (/nonexistent): "
                             "/nonexistent: cannot open shared object file: No such file or "
                             "directory");
  }
  cr_assert_eq(b, (ms_backend_t *)(uintptr_t)0x1234, "out-parameter untouched on failure");
  ms_backend_t *sim = NULL;
  cr_assert_eq(ms_backend_open("sim", &sim, &eb), MS_OK, "the sim backend does not need CUDA");
  ms_backend_destroy(sim);
}

/* A library that is not a CUDA runtime (memsnap's own) lacks the first function looked up. */
Test(cuda_fake, open_with_a_runtime_that_lacks_a_function) {
  setenv("MEMSNAP_CUDART", MS_CORE_SO, 1);
  ms_backend_t *b = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_backend_cuda_create(&b, &eb), MS_EBACKEND);
  cr_assert_str_eq(eb.msg, "cuda backend: the CUDA runtime (" MS_CORE_SO ") has no "
                           "cudaGetErrorName: " MS_CORE_SO ": undefined symbol: cudaGetErrorName");
}

/* ---- 1. failed frees keep the books ------------------------------------------------------- */

Test(cuda_fake, failed_free_keeps_the_segment_accounted) {
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(a, 5 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  int64_t reserved = RESERVED(a), segments = SEGMENTS(a);
  int64_t frees = stats_of(a).num_device_free;
  cr_assert(reserved >= (int64_t)(5 * MiB));
  fakecuda_fail("cudaFree", 1, cudaErrorLaunchFailure, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND, "the error reaches the caller");
  expect_reported("cuda: cudaFree on device 0: cudaErrorLaunchFailure: unspecified launch failure");
  cr_assert_eq(RESERVED(a), reserved, "the segment is still reserved");
  cr_assert_eq(SEGMENTS(a), segments);
  cr_assert_eq(stats_of(a).num_device_free, frees);
  cr_assert_eq(fakecuda_live_allocations(0), 1, "and still allocated on the device");
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess);
  /* The segment is still usable (a cache hit), and a later empty_cache returns it. */
  ms_devptr_t q;
  cr_assert_eq(ms_allocator_malloc(a, 5 * MiB, 0, &q), MS_OK);
  cr_assert_eq(q, p);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  cr_assert_eq(fakecuda_used_bytes(0), 0);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

Test(cuda_fake, failed_free_on_the_oom_path_is_an_error_not_an_oom) {
  fakecuda_set_capacity(0, 64 * MiB);
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 40 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  int64_t reserved = RESERVED(a);
  /* 50 MiB needs the cached 40 MiB segment released; its cudaFree fails. */
  fakecuda_fail("cudaFree", 1, cudaErrorIllegalAddress, 1);
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &q), MS_EBACKEND);
  cr_assert_eq(stats_of(a).num_ooms, 0, "not an out-of-memory");
  cr_assert_eq(RESERVED(a), reserved);
  cr_assert_eq(fakecuda_live_allocations(0), 1);
  expect_reported("cudaFree on device 0: cudaErrorIllegalAddress");
  /* Without the fault, the same request frees the cache and succeeds. */
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &q), MS_OK);
  cr_assert_eq(fakecuda_live_allocations(0), 1);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  ms_allocator_destroy(a);
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  ms_backend_destroy(b);
}

/* ---- 3. failed event record / query / synchronize keep the block pending ------------------- */

Test(cuda_fake, failed_event_record_keeps_the_block_pending) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_stream_t s1, s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s1), MS_OK);
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s1, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, s2), MS_OK);
  fakecuda_block_stream(s2, true);
  fakecuda_fail("cudaEventRecord", 1, cudaErrorLaunchFailure, 1);
  fakecuda_log_clear();
  cr_assert_eq(ms_allocator_free(a, p), MS_EBACKEND, "the failed record reaches the caller");
  expect_reported("cudaEventRecord on device 0: cudaErrorLaunchFailure");
  cr_assert_eq(fakecuda_count("cudaDeviceSynchronize"), 0, "no synchronization instead");
  cr_assert_eq(ALLOCATED(a), 0);
  cr_assert_eq(ACTIVE(a), (int64_t)(4 * MiB), "the block stays pending");
  /* Not reused while pending: the next malloc retries the record (now on a blocked stream). */
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s1, &q), MS_OK);
  cr_assert(q != p, "a pending block was reused");
  cr_assert_eq(fakecuda_count("cudaEventRecord"), 2,
               "the record is retried (the failed call, then the retry)");
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  fakecuda_block_stream(s2, false);
  ms_devptr_t r;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s1, &r), MS_OK);
  cr_assert_eq(ACTIVE(a), (int64_t)(4 * MiB), "the event completed: p is free again");
  cr_assert_eq(ms_allocator_free(a, r), MS_OK);
  ms_allocator_destroy(a);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s1), MS_OK);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s2), MS_OK);
  ms_backend_destroy(b);
}

Test(cuda_fake, failed_event_query_and_sync_keep_the_block_pending) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_stream_t s1, s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s1), MS_OK);
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s1, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, s2), MS_OK);
  fakecuda_block_stream(s2, true);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  int64_t active = ACTIVE(a), reserved = RESERVED(a);
  fakecuda_fail("cudaEventQuery", 1, cudaErrorIllegalAddress, 1);
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s1, &q), MS_EBACKEND);
  expect_reported("cudaEventQuery on device 0: cudaErrorIllegalAddress");
  cr_assert_eq(ACTIVE(a), active, "still pending after the failed query");
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess);
  /* A "not ready" answer is not an error and leaves no error state behind. */
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s1, &q), MS_OK);
  cr_assert(q != p);
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess, "cudaErrorNotReady left behind");
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  /* empty_cache synchronizes the events: a failed synchronization keeps p pending. */
  fakecuda_fail("cudaEventSynchronize", 1, cudaErrorLaunchFailure, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  expect_reported("cudaEventSynchronize on device 0: cudaErrorLaunchFailure");
  cr_assert_eq(ACTIVE(a), active);
  cr_assert(RESERVED(a) >= reserved);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(ACTIVE(a), 0);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- 5. only out-of-memory is OOM ---------------------------------------------------------- */

typedef struct {
  int calls;
} oom_seen_t;
static void oom_observer(void *arg, int device, size_t alloc_size, size_t total, size_t free_b) {
  (void)device, (void)alloc_size, (void)total, (void)free_b;
  ((oom_seen_t *)arg)->calls++;
}

Test(cuda_fake, cudamalloc_oom_versus_other_errors) {
  fakecuda_set_capacity(0, 64 * MiB);
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, false);
  oom_seen_t seen = {0};
  cr_assert_eq(ms_allocator_attach_oom_observer(a, oom_observer, &seen), MS_OK);
  ms_devptr_t p = 0xbeef;
  cr_assert_eq(ms_allocator_malloc(a, 100 * MiB, 0, &p), MS_EOOM);
  cr_assert_eq(seen.calls, 1);
  cr_assert_eq(stats_of(a).num_ooms, 1);
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess, "the OOM's error state is cleared");
  cr_assert(strstr(captured, "cudaMalloc") == NULL, "an OOM is not reported as a CUDA error");
  fakecuda_fail("cudaMalloc", 1, cudaErrorIllegalAddress, 1);
  cr_assert_eq(ms_allocator_malloc(a, 1 * MiB, 0, &p), MS_EBACKEND);
  cr_assert_eq(p, 0xbeef);
  cr_assert_eq(seen.calls, 1, "no OOM observer for another error");
  cr_assert_eq(stats_of(a).num_ooms, 1);
  expect_reported("cuda: cudaMalloc(2097152 bytes) on device 0: cudaErrorIllegalAddress: an "
                  "illegal memory access was encountered");
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(ms_allocator_malloc(a, 1 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

Test(cuda_fake, failed_map_is_an_error_and_oom_only_when_out_of_memory) {
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, true);
  ms_devptr_t p = 0xbeef;
  /* A cuMemMap failure that is not out-of-memory: an error with the driver's name, no OOM. */
  fakecuda_fail("cuMemMap", 1, CUDA_ERROR_INVALID_VALUE, 1);
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_EINVAL);
  cr_assert_eq(p, 0xbeef);
  expect_reported("cuda: cuMemMap on device 0: CUDA_ERROR_INVALID_VALUE");
  cr_assert_eq(stats_of(a).num_ooms, 0);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_handles(), 0, "the page created by the failed map is released");
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_used_bytes(0), 0);
  /* The second page of a two-page map fails: the first one is unmapped again. */
  fakecuda_fail("cuMemSetAccess", 2, CUDA_ERROR_UNKNOWN, 1);
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_EBACKEND);
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_live_handles(), 0);
  cr_assert_eq(RESERVED(a), 0);
  /* cuMemCreate out of memory is the OOM. */
  fakecuda_fail("cuMemCreate", 1, CUDA_ERROR_OUT_OF_MEMORY, -1);
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_EOOM);
  cr_assert_eq(stats_of(a).num_ooms, 1);
  fakecuda_clear_failures();
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_OK);
  cr_assert_eq(RESERVED(a), (int64_t)(40 * MiB), "two 20 MiB pages");
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_handles(), 0);
  ms_allocator_destroy(a);
  cr_assert_eq(fakecuda_live_reservations(), 0);
  ms_backend_destroy(b);
}

Test(cuda_fake, failed_unmap_keeps_the_pages_accounted) {
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, true);
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(RESERVED(a), (int64_t)(40 * MiB));
  fakecuda_fail("cuMemUnmap", 1, CUDA_ERROR_ILLEGAL_ADDRESS, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  expect_reported("cuMemUnmap on device 0: CUDA_ERROR_ILLEGAL_ADDRESS");
  cr_assert_eq(RESERVED(a), (int64_t)(40 * MiB), "nothing was unmapped: all still reserved");
  cr_assert_eq(fakecuda_live_mappings(), 2);
  /* The second page fails: the first is unmapped and accounted as such. */
  fakecuda_fail("cuMemUnmap", 2, CUDA_ERROR_ILLEGAL_ADDRESS, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  cr_assert_eq(RESERVED(a), (int64_t)(20 * MiB));
  cr_assert_eq(fakecuda_live_mappings(), 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_used_bytes(0), 0);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

Test(cuda_fake, failed_release_maps_the_page_back_and_keeps_it_accounted) {
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, true);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  fakecuda_fail("cuMemRelease", 1, CUDA_ERROR_LAUNCH_FAILED, 1);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_EBACKEND);
  expect_reported("cuda: cuMemRelease on device 0: CUDA_ERROR_LAUNCH_FAILED");
  cr_assert_eq(RESERVED(a), (int64_t)(40 * MiB), "the page is still on the books");
  cr_assert_eq(fakecuda_live_mappings(), 2, "and really mapped again");
  cr_assert_eq(fakecuda_mapping_size(p), 20 * MiB);
  cr_assert_eq(fakecuda_access_mask(p), 0x1u, "with its access");
  cr_assert_eq(fakecuda_live_handles(), 2);
  /* The page serves allocations, and a later empty_cache returns everything. */
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &q), MS_OK);
  cr_assert_eq(q, p);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_live_handles(), 0);
  cr_assert_eq(fakecuda_used_bytes(0), 0);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* The backend's VMM contract (backend.h): one mem_map is one physical allocation; mem_unmap takes
 * runs of whole mapped ranges and refuses anything else without touching the driver. */
Test(cuda_fake, mem_map_and_unmap_work_on_whole_mapped_ranges) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  const size_t page = 2 * MiB;
  ms_devptr_t base;
  cr_assert_eq(o->va_reserve(o->ctx, 0, 8 * page, &base), MS_OK);
  for (int i = 1; i <= 3; i++)
    cr_assert_eq(o->mem_map(o->ctx, 0, base + (size_t)i * page, page), MS_OK);
  cr_assert_eq(o->mem_map(o->ctx, 0, base + 5 * page, 2 * page), MS_OK);
  cr_assert_eq(fakecuda_live_handles(), 4);
  cr_assert_eq(fakecuda_mapping_size(base + 6 * page), 2 * page);
  cr_assert_eq(o->mem_map(o->ctx, 0, base + 2 * page, page), MS_ESTATE, "mapped twice");
  fakecuda_log_clear();
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + page, 2 * page), MS_OK, "two whole ranges");
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 3 * page, 3 * page), MS_ESTATE, "a hole");
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 5 * page, page), MS_ESTATE, "half a range");
  cr_assert_eq(fakecuda_count("cuMemUnmap"), 2, "refusals touch nothing");
  cr_assert_eq(o->va_release(o->ctx, 0, base, 8 * page), MS_ESTATE, "pages still mapped");
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 3 * page, page), MS_OK);
  cr_assert_eq(o->mem_unmap(o->ctx, 0, base + 5 * page, 2 * page), MS_OK);
  cr_assert_eq(o->va_release(o->ctx, 0, base, 8 * page), MS_OK);
  cr_assert_eq(o->mem_map(o->ctx, 0, base + 1, page), MS_EINVAL);
  cr_assert_eq(fakecuda_live_handles(), 0);
  cr_assert_eq(fakecuda_live_reservations(), 0);
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess);
  ms_backend_destroy(b);
}

Test(cuda_fake, page_sizes_must_be_multiples_of_the_granularity) {
  fakecuda_set_granularity(0, 8 * MiB);
  ms_backend_t *b = open_cuda();
  ms_alloc_config_t conf;
  ms_alloc_config_init(&conf);
  conf.expandable_segments = true;
  ms_allocator_config_t cfg = {.backend = b, .device = 0, .alloc = &conf};
  ms_allocator_t *a = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_ECONFIG);
  cr_assert_str_eq(eb.msg, "expandable_segments: the page sizes (2097152 and large_segment_size "
                           "20971520 bytes) must be multiples of device 0's allocation "
                           "granularity (8388608 bytes)");
  conf.expandable_segments = false;
  cr_assert_eq(ms_allocator_create(&cfg, &a, &eb), MS_OK, "%s", eb.msg);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- 7. 20 MiB pages in the large pool, access for peers ---------------------------------- */

Test(cuda_fake, expandable_pages_follow_the_pool_and_peers_get_access) {
  fakecuda_set_device_count(3);
  fakecuda_set_peer_access(1, 0, true); /* device 1 can access device 0; device 2 cannot */
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, true);
  ms_devptr_t big, small;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &big), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 1000, 0, &small), MS_OK);
  cr_assert_eq(fakecuda_mapping_size(big), 20 * MiB, "large pool: one 20 MiB allocation a page");
  cr_assert_eq(fakecuda_mapping_size(big + 25 * MiB), 20 * MiB);
  cr_assert_eq(fakecuda_mapping_size(small), 2 * MiB, "small pool: 2 MiB pages");
  cr_assert_eq(fakecuda_access_mask(big), 0x3u, "device 0 and its peer 1");
  cr_assert_eq(fakecuda_access_mask(small), 0x3u);
  cr_assert_eq(fakecuda_live_mappings(), 3);
  cr_assert_eq(ms_allocator_free(a, big), MS_OK);
  cr_assert_eq(ms_allocator_free(a, small), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_live_handles(), 0);
  ms_allocator_destroy(a);
  cr_assert_eq(fakecuda_live_reservations(), 0);
  ms_backend_destroy(b);
}

/* ---- 2. graph capture: no free, no sync; capture stream uses dropped ---------------------- */

static bool only_stream(void *arg, ms_stream_t s) {
  return s == *(ms_stream_t *)arg;
}

/* ---- 8. private pools use expandable segments too (PyTorch allows it) -------------------- */

Test(cuda_fake, a_private_pool_maps_expandable_pages_and_returns_them) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, true);
  ms_stream_t s;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s), MS_OK);
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(a, id, only_stream, &s), MS_OK);
  cr_assert_eq(fakecuda_begin_capture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, s, &p), MS_OK, "%s", captured);
  cr_assert_eq(ms_allocator_malloc(a, 1000, s, &q), MS_OK);
  cr_assert_eq(fakecuda_live_allocations(0), 0, "no cudaMalloc: pages are mapped");
  cr_assert_eq(fakecuda_mapping_size(p), 20 * MiB);
  cr_assert_eq(fakecuda_mapping_size(q), 2 * MiB);
  cr_assert_eq(RESERVED(a), (int64_t)(42 * MiB));
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(fakecuda_count("cuMemUnmap"), 0, "nothing unmapped during the capture");
  cr_assert(!fakecuda_capture_invalidated(s));
  cr_assert_eq(fakecuda_end_capture(s), cudaSuccess);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK); /* frees the freeable pool */
  cr_assert_eq(RESERVED(a), 0, "the pool's pages are unmapped");
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_live_handles(), 0);
  cr_assert_eq(fakecuda_live_reservations(), 0, "and its ranges returned");
  ms_allocator_destroy(a);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s), MS_OK);
  ms_backend_destroy(b);
}

Test(cuda_fake, nothing_is_freed_or_synchronized_during_a_capture) {
  fakecuda_set_capacity(0, 64 * MiB);
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_stream_t s;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s), MS_OK);
  ms_devptr_t cached, p1, p2;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &cached), MS_OK);
  cr_assert_eq(ms_allocator_free(a, cached), MS_OK); /* cached in the default pool */
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(a, id, only_stream, &s), MS_OK);
  cr_assert_eq(fakecuda_begin_capture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  fakecuda_log_clear();
  cr_assert_eq(ms_allocator_malloc(a, 10 * MiB, s, &p1), MS_OK, "relaxed-mode cudaMalloc");
  cr_assert_eq(ms_allocator_free(a, p1), MS_OK);
  /* empty_cache and an OOM during the capture must not free or synchronize anything. */
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 40 * MiB, s, &p2), MS_EOOM);
  cr_assert_eq(fakecuda_count("cudaFree"), 0);
  cr_assert_eq(fakecuda_count("cudaDeviceSynchronize"), 0);
  cr_assert_eq(fakecuda_count("cudaEventSynchronize"), 0);
  cr_assert_eq(fakecuda_count("cudaEventQuery"), 0);
  cr_assert(!fakecuda_capture_invalidated(s), "the capture was invalidated");
  cr_assert_eq(fakecuda_end_capture(s), cudaSuccess, "capture still valid at its end");
  cr_assert_eq(ms_allocator_end_allocate_to_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  ms_allocator_destroy(a);
  cr_assert_eq(o->stream_destroy(o->ctx, 0, s), MS_OK);
  ms_backend_destroy(b);
}

/* A capture the allocator was not told about (no routing), on a blocking stream: the legacy
 * stream reports it, so neither the allocator nor the backend frees or synchronizes. */
Test(cuda_fake, an_unannounced_capture_on_a_blocking_stream_is_seen_and_left_intact) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  cudaStream_t bs;
  cr_assert_eq(cudaStreamCreate(&bs), cudaSuccess); /* blocking */
  ms_stream_t s = (ms_stream_t)(uintptr_t)bs;
  ms_devptr_t cached, raw;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &cached), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, cached, s), MS_OK);
  fakecuda_block_stream(s, true);
  cr_assert_eq(ms_allocator_free(a, cached), MS_OK); /* pending on s */
  cr_assert_eq(o->malloc(o->ctx, 0, 2 * MiB, 0, &raw), MS_OK);
  ms_event_t ev;
  cr_assert_eq(o->event_create(o->ctx, 0, &ev), MS_OK);
  cr_assert_eq(fakecuda_begin_capture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  fakecuda_log_clear();
  /* The allocator: empty_cache frees and synchronizes nothing, and says so by succeeding. */
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  int64_t reserved = RESERVED(a);
  cr_assert_eq(reserved, (int64_t)(30 * MiB), "the cached segment is kept for later");
  /* The backend refuses the calls that would invalidate the capture, and defers a query. */
  cr_assert_eq(o->free(o->ctx, 0, raw), MS_ESTATE);
  expect_reported("cuda: cudaFree(");
  expect_reported("refused: a CUDA graph capture is under way");
  cr_assert_eq(o->device_synchronize(o->ctx, 0), MS_ESTATE);
  expect_reported("cuda: cudaDeviceSynchronize on device 0 refused");
  cr_assert_eq(o->event_synchronize(o->ctx, 0, ev), MS_ESTATE);
  bool done = true;
  cr_assert_eq(o->event_query(o->ctx, 0, ev, &done), MS_OK);
  cr_assert(!done, "a query during a capture answers \"not yet\"");
  cr_assert_eq(fakecuda_count("cudaFree"), 0);
  cr_assert_eq(fakecuda_count("cudaDeviceSynchronize"), 0);
  cr_assert_eq(fakecuda_count("cudaEventSynchronize"), 0);
  cr_assert_eq(fakecuda_count("cudaEventQuery"), 0);
  cr_assert(!fakecuda_capture_invalidated(s));
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess);
  cr_assert_eq(fakecuda_end_capture(s), cudaSuccess, "capture still valid at its end");
  /* After the capture everything goes through. */
  cr_assert_eq(o->free(o->ctx, 0, raw), MS_OK);
  cr_assert_eq(o->event_destroy(o->ctx, 0, ev), MS_OK);
  fakecuda_block_stream(s, false);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  ms_allocator_destroy(a);
  cr_assert_eq(cudaStreamDestroy(bs), cudaSuccess);
  ms_backend_destroy(b);
}

Test(cuda_fake, capture_stream_uses_are_dropped_before_deferred_events) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_stream_t s, s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s), MS_OK);
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  ms_devptr_t eager, p;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 0, &eager), MS_OK);
  ms_pool_id_t id = ms_pool_id_new(true);
  cr_assert_eq(ms_allocator_begin_allocate_to_pool(a, id, only_stream, &s), MS_OK);
  cr_assert_eq(fakecuda_begin_capture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, s, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, s2), MS_OK);     /* during the capture */
  cr_assert_eq(ms_allocator_record_stream(a, eager, s2), MS_OK); /* also during it */
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);                  /* deferred */
  cr_assert_eq(fakecuda_end_capture(s), cudaSuccess);
  cr_assert_eq(ms_allocator_end_allocate_to_pool(a, id), MS_OK);
  fakecuda_log_clear();
  ms_devptr_t q;
  cr_assert_eq(ms_allocator_malloc(a, 1 * MiB, 0, &q), MS_OK);
  cr_assert_eq(fakecuda_count("cudaEventRecord"), 0, "the capture's stream use was dropped");
  cr_assert_eq(ms_allocator_free(a, eager), MS_OK);
  cr_assert_eq(fakecuda_count("cudaEventRecord"), 0);
  cr_assert_eq(ACTIVE(a), (int64_t)stats_of(a).allocated_bytes[MS_STAT_ALL].current);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_release_pool(a, id), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- 4. contexts --------------------------------------------------------------------------- */

typedef struct thread_check_s {
  ms_allocator_t *a;
  int ctx_before, ctx_after, r_malloc, r_free, r_empty;
  bool ctx0_created;
} thread_check_t;

static void *fresh_thread(void *arg) {
  thread_check_t *t = arg;
  t->ctx_before = fakecuda_current_context_device();
  ms_devptr_t p = 0;
  t->r_malloc = ms_allocator_malloc(t->a, 30 * MiB, 0, &p);
  t->r_free = ms_allocator_free(t->a, p);
  t->r_empty = ms_allocator_empty_cache(t->a);
  t->ctx_after = fakecuda_current_context_device();
  t->ctx0_created = fakecuda_context_created(0);
  return NULL;
}

Test(cuda_fake, a_thread_without_context_works_and_gets_none_back) {
  fakecuda_set_device_count(2);
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 1, true); /* expandable: driver VMM calls on device 1 */
  cr_assert_eq(fakecuda_current_context_device(), -1, "opening touched no context");
  thread_check_t t = {.a = a};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, fresh_thread, &t), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(t.ctx_before, -1);
  cr_assert_eq(t.r_malloc, MS_OK, "%s", captured);
  cr_assert_eq(t.r_free, MS_OK);
  cr_assert_eq(t.r_empty, MS_OK);
  cr_assert_eq(t.ctx_after, -1, "the thread had no context and gets none back");
  cr_assert(!t.ctx0_created, "a context was created on GPU 0, which the program never used");
  cr_assert(fakecuda_context_created(1));
  /* A thread whose context is on device 0 keeps it across calls on device 1. */
  cr_assert_eq(cudaSetDevice(0), cudaSuccess);
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(a, 1 * MiB, 0, &p), MS_OK);
  cr_assert_eq(fakecuda_current_context_device(), 0);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(fakecuda_current_context_device(), 0);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- 5. the program's pending error is not swallowed -------------------------------------- */

Test(cuda_fake, the_programs_pending_error_is_preserved) {
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_stream_t s2;
  cr_assert_eq(o->stream_create(o->ctx, 0, &s2), MS_OK);
  fakecuda_set_pending_error(cudaErrorLaunchFailure); /* from the program's own kernel */
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(a, 1 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, s2), MS_OK);
  fakecuda_block_stream(s2, true);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  ms_devptr_t q;
  cr_assert_eq(ms_allocator_malloc(a, 1 * MiB, 0, &q), MS_OK); /* queries: not ready */
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  size_t f, t;
  cr_assert_eq(o->mem_info(o->ctx, 0, &f, &t), MS_OK);
  cr_assert_neq(fakecuda_pending_error(), cudaSuccess, "the program's error was cleared");
  /* Its value is the program's where memsnap caused no error of its own. */
  fakecuda_set_pending_error(cudaErrorLaunchFailure);
  cr_assert_eq(ms_allocator_malloc(a, 3 * MiB, 0, &q), MS_OK);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(fakecuda_pending_error(), cudaErrorLaunchFailure);
  /* An OOM leaves the error state as it found it too. */
  fakecuda_fail("cudaMalloc", 1, cudaErrorMemoryAllocation, -1);
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &q), MS_EOOM);
  cr_assert_neq(fakecuda_pending_error(), cudaSuccess);
  fakecuda_clear_failures();
  fakecuda_set_pending_error(cudaSuccess);
  fakecuda_fail("cudaMalloc", 1, cudaErrorMemoryAllocation, -1);
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &q), MS_EOOM);
  cr_assert_eq(fakecuda_pending_error(), cudaSuccess, "memsnap's own OOM is cleared");
  fakecuda_clear_failures();
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- 6. per-thread default streams --------------------------------------------------------- */

typedef struct pt_check_s {
  ms_allocator_t *a;
  ms_devptr_t got;
  int r;
} pt_check_t;

static void *pt_thread(void *arg) {
  pt_check_t *t = arg;
  t->r = ms_allocator_malloc(t->a, 4 * MiB, (ms_stream_t)(uintptr_t)cudaStreamPerThread, &t->got);
  if (t->r == MS_OK) t->r = ms_allocator_free(t->a, t->got);
  return NULL;
}

Test(cuda_fake, per_thread_default_streams_are_keyed_by_the_real_stream) {
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, false);
  const ms_stream_t pt = (ms_stream_t)(uintptr_t)cudaStreamPerThread;
  ms_devptr_t mine;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, pt, &mine), MS_OK);
  cr_assert_eq(ms_allocator_free(a, mine), MS_OK); /* cached on this thread's stream */
  pt_check_t t = {.a = a};
  pthread_t th;
  cr_assert_eq(pthread_create(&th, NULL, pt_thread, &t), 0);
  cr_assert_eq(pthread_join(th, NULL), 0);
  cr_assert_eq(t.r, MS_OK);
  cr_assert_neq(t.got, mine, "another thread's per-thread stream got this thread's block");
  ms_devptr_t again;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, pt, &again), MS_OK);
  cr_assert_eq(again, mine, "this thread's own stream still hits its cache");
  cr_assert_eq(ms_allocator_free(a, again), MS_OK);
  /* cudaStreamLegacy and 0 are one stream. */
  ms_devptr_t l, z;
  cr_assert_eq(ms_allocator_malloc(a, 6 * MiB, (ms_stream_t)(uintptr_t)cudaStreamLegacy, &l),
               MS_OK);
  cr_assert_eq(ms_allocator_free(a, l), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 6 * MiB, 0, &z), MS_OK);
  cr_assert_eq(z, l);
  cr_assert_eq(ms_allocator_free(a, z), MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- 8. events on the stream's device, largest_free_block, callbacks --------------------- */

Test(cuda_fake, record_stream_on_a_stream_of_another_device) {
  fakecuda_set_device_count(2);
  ms_backend_t *b = open_cuda();
  const ms_backend_ops_t *o = ms_backend_ops(b);
  ms_allocator_t *a = allocator_on(b, 0, false);
  ms_stream_t other;
  cr_assert_eq(o->stream_create(o->ctx, 1, &other), MS_OK);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_record_stream(a, p, other), MS_OK);
  fakecuda_block_stream(other, true);
  fakecuda_log_clear();
  cr_assert_eq(ms_allocator_free(a, p), MS_OK, "%s", captured);
  cr_assert_eq(fakecuda_count("cudaEventRecord"), 1);
  fakecuda_call_t c;
  bool found = false;
  for (size_t i = 0; fakecuda_log_get(i, &c); i++)
    if (strcmp(c.fn, "cudaEventRecord") == 0) {
      cr_assert_eq(c.result, cudaSuccess);
      cr_assert_eq(c.device, 1, "recorded from device 1's context");
      found = true;
      fakecuda_call_t ev;
      cr_assert(fakecuda_log_get(i, &ev));
      cr_assert_eq(fakecuda_event_device(ev.addr), 1, "the event lives on the stream's device");
    }
  cr_assert(found);
  cr_assert_eq(ms_allocator_malloc(a, 4 * MiB, 0, &q), MS_OK);
  cr_assert_neq(q, p, "pending on the other device's stream");
  fakecuda_block_stream(other, false);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  cr_assert_eq(RESERVED(a), 0);
  ms_allocator_destroy(a);
  cr_assert_eq(o->stream_destroy(o->ctx, 1, other), MS_OK);
  ms_backend_destroy(b);
}

Test(cuda_fake, largest_free_block_falls_back_to_the_device_free_memory) {
  fakecuda_set_capacity(0, 256 * MiB);
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, false);
  cr_assert_eq(ms_allocator_largest_free_block(a), 256 * MiB, "nothing cached: cudaMemGetInfo");
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(a, 30 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_largest_free_block(a), 226 * MiB);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_largest_free_block(a), 30 * MiB, "the cached block");
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

static bool empty_cache_callback(void *arg) {
  return ms_allocator_empty_cache((ms_allocator_t *)arg) == MS_OK;
}

Test(cuda_fake, a_free_memory_callback_may_call_the_allocator, .timeout = 10) {
  fakecuda_set_capacity(0, 64 * MiB);
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, false);
  cr_assert_eq(ms_allocator_add_free_memory_callback(a, empty_cache_callback, a), MS_OK);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 40 * MiB, 0, &p), MS_OK);
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a, 50 * MiB, 0, &q), MS_OK, "deadlocked or failed");
  cr_assert_eq(RESERVED(a), (int64_t)(50 * MiB));
  cr_assert_eq(fakecuda_live_allocations(0), 1);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  ms_allocator_destroy(a);
  ms_backend_destroy(b);
}

/* ---- the fake itself: what other tests (memsnap run, issue #18) rely on -------------------- */

Test(cuda_fake, the_fake_serves_stream_ordered_pool_and_managed_memory) {
  fakecuda_set_capacity(0, 64 * MiB);
  cudaStream_t s;
  cr_assert_eq(cudaStreamCreate(&s), cudaSuccess);
  void *a = NULL, *b = NULL, *c = NULL, *d = NULL;
  cr_assert_eq(cudaMallocAsync(&a, 10 * MiB, s), cudaSuccess);
  fakecuda_call_t last;
  cr_assert(fakecuda_log_get(fakecuda_log_len() - 1, &last));
  cr_assert_str_eq(last.fn, "cudaMallocAsync");
  cr_assert_eq(last.addr, (uint64_t)(uintptr_t)a);
  cr_assert_eq(last.size, 10 * MiB);
  cudaMemPool_t pool;
  cr_assert_eq(cudaDeviceGetDefaultMemPool(&pool, 0), cudaSuccess);
  cr_assert_eq(cudaMallocFromPoolAsync(&b, 20 * MiB, pool, s), cudaSuccess);
  cr_assert_eq(cudaMallocManaged(&c, 30 * MiB, cudaMemAttachGlobal), cudaSuccess);
  cr_assert_eq(fakecuda_used_bytes(0), 60 * MiB);
  cr_assert_eq(fakecuda_live_allocations(0), 3);
  /* Past the capacity: out of memory, in the thread's error state until read. */
  cr_assert_eq(cudaMallocAsync(&d, 10 * MiB, s), cudaErrorMemoryAllocation);
  cr_assert_eq(cudaPeekAtLastError(), cudaErrorMemoryAllocation);
  cr_assert_eq(cudaGetLastError(), cudaErrorMemoryAllocation);
  cr_assert_eq(cudaGetLastError(), cudaSuccess);
  /* An injected failure changes nothing. */
  fakecuda_fail("cudaFreeAsync", 1, cudaErrorIllegalAddress, 1);
  cr_assert_eq(cudaFreeAsync(a, s), cudaErrorIllegalAddress);
  cr_assert_eq(fakecuda_used_bytes(0), 60 * MiB);
  (void)cudaGetLastError();
  cr_assert_eq(cudaFreeAsync(a, s), cudaSuccess);
  cr_assert_eq(cudaFreeAsync(b, s), cudaSuccess);
  cr_assert_eq(cudaFree(c), cudaSuccess, "managed memory is freed with cudaFree");
  cr_assert_eq(cudaFreeAsync(c, s), cudaErrorInvalidValue, "a second free is an error");
  (void)cudaGetLastError();
  cr_assert_eq(fakecuda_used_bytes(0), 0);
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  struct cudaMemPoolProps props;
  memset(&props, 0, sizeof props);
  props.allocType = cudaMemAllocationTypePinned;
  props.location.type = cudaMemLocationTypeDevice;
  props.location.id = 0;
  cudaMemPool_t mine;
  cr_assert_eq(cudaMemPoolCreate(&mine, &props), cudaSuccess);
  cr_assert_eq(cudaMallocFromPoolAsync(&d, 1 * MiB, mine, s), cudaSuccess);
  cr_assert_eq(cudaFreeAsync(d, s), cudaSuccess);
  cr_assert_eq(cudaMemPoolTrimTo(mine, 0), cudaSuccess);
  cr_assert_eq(cudaMemPoolDestroy(mine), cudaSuccess);
  cr_assert_eq(cudaMemPoolDestroy(pool), cudaErrorInvalidValue, "the default pool stays");
  (void)cudaGetLastError();
  cr_assert_eq(cudaStreamDestroy(s), cudaSuccess);
  cr_assert_eq(fakecuda_count("cudaMallocAsync"), 2);
  cr_assert_eq(fakecuda_count("cudaFreeAsync"), 5);
}

/* ---- many threads, with faults ----------------------------------------------------------------
 */

typedef struct mt_s {
  ms_allocator_t *a;
  cudaStream_t own, *all;
  int id, nthreads;
  long errors, ops;
} mt_t;

static void *mt_worker(void *arg) {
  mt_t *t = arg;
  uint64_t x = 0x9e3779b97f4a7c15ull * (uint64_t)(t->id + 1);
  ms_devptr_t live[16];
  int n = 0;
  for (int op = 0; op < 3000; op++) {
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    if (n == 16 || (n && x % 3 == 0)) {
      ms_devptr_t p = live[--n];
      if (x % 5 == 0) {
        ms_stream_t other = (ms_stream_t)(uintptr_t)t->all[(t->id + 1) % t->nthreads];
        if (ms_allocator_record_stream(t->a, p, other) != MS_OK) t->errors++;
      }
      if (ms_allocator_free(t->a, p) != MS_OK) t->errors++; /* the block is freed anyway */
    } else {
      size_t size = (size_t)1 << (9 + x % 16); /* 512 B .. 16 MiB */
      ms_devptr_t p;
      int r = ms_allocator_malloc(t->a, size, (ms_stream_t)(uintptr_t)t->own, &p);
      if (r == MS_OK)
        live[n++] = p;
      else if (r != MS_EOOM)
        t->errors++;
    }
    if (x % 97 == 0 && ms_allocator_empty_cache(t->a) != MS_OK) t->errors++;
    t->ops++;
  }
  while (n)
    if (ms_allocator_free(t->a, live[--n]) != MS_OK) t->errors++;
  return NULL;
}

static void many_threads(bool expandable) {
  fakecuda_set_capacity(0, 256 * MiB);
  ms_backend_t *b = open_cuda();
  ms_allocator_t *a = allocator_on(b, 0, expandable);
  enum { T = 6 };
  cudaStream_t streams[T];
  mt_t t[T];
  pthread_t th[T];
  for (int i = 0; i < T; i++)
    cr_assert_eq(cudaStreamCreate(&streams[i]), cudaSuccess);
  /* Faults that hit whichever thread comes: frees, unmaps, event records and queries. */
  fakecuda_fail("cudaFree", 5, cudaErrorLaunchFailure, 3);
  fakecuda_fail("cuMemUnmap", 3, CUDA_ERROR_UNKNOWN, 2);
  fakecuda_fail("cuMemRelease", 2, CUDA_ERROR_UNKNOWN, 2);
  fakecuda_fail("cudaEventRecord", 10, cudaErrorLaunchFailure, 3);
  fakecuda_fail("cudaEventQuery", 20, cudaErrorLaunchFailure, 3);
  for (int i = 0; i < T; i++) {
    t[i] = (mt_t){.a = a, .own = streams[i], .all = streams, .id = i, .nthreads = T};
    cr_assert_eq(pthread_create(&th[i], NULL, mt_worker, &t[i]), 0);
  }
  long errors = 0, ops = 0;
  for (int i = 0; i < T; i++) {
    cr_assert_eq(pthread_join(th[i], NULL), 0);
    errors += t[i].errors, ops += t[i].ops;
  }
  cr_assert_eq(ops, T * 3000L);
  cr_assert(errors > 0, "the injected faults reached no caller");
  fakecuda_clear_failures();
  ms_devptr_t p;
  cr_assert_eq(ms_allocator_malloc(a, 1000, 0, &p), MS_OK); /* retries what failed */
  cr_assert_eq(ms_allocator_free(a, p), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(a), MS_OK);
  ms_stats_t st = stats_of(a);
  cr_assert_eq(st.allocated_bytes[MS_STAT_ALL].current, 0);
  cr_assert_eq(st.active_bytes[MS_STAT_ALL].current, 0, "a pending block was lost");
  cr_assert_eq(st.reserved_bytes[MS_STAT_ALL].current, 0);
  cr_assert_eq(fakecuda_used_bytes(0), 0, "device memory leaked");
  cr_assert_eq(fakecuda_live_allocations(0), 0);
  cr_assert_eq(fakecuda_live_mappings(), 0);
  cr_assert_eq(fakecuda_live_handles(), 0);
  ms_allocator_destroy(a);
  cr_assert_eq(fakecuda_live_reservations(), 0);
  for (int i = 0; i < T; i++)
    cr_assert_eq(cudaStreamDestroy(streams[i]), cudaSuccess);
  ms_backend_destroy(b);
}

Test(cuda_fake, many_threads_with_faults_keep_the_books, .timeout = 60) {
  many_threads(false);
}
Test(cuda_fake, many_threads_with_faults_keep_the_books_expandable, .timeout = 60) {
  many_threads(true);
}
