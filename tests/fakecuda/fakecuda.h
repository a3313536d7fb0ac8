/* SPDX-License-Identifier: MIT
 * fakecuda: a fault-injecting fake of the CUDA runtime and driver calls that memsnap's cuda
 * backend makes (issue #15), built as the shared library libmemsnap_fakecuda.so.
 *
 * The library exports the real CUDA runtime names (cudaMalloc, cudaFree, cudaEventRecord, ...,
 * with the types and error codes of the toolkit's headers) and the driver calls the backend looks
 * up through cudaGetDriverEntryPointByVersion (cuMemCreate, cuMemMap, cuCtxGetCurrent, ...), so a
 * program linked against it (or started with it in LD_PRELOAD) behaves like one linked to
 * libcudart on a machine with the GPUs described below. No GPU is ever touched: device memory is
 * address-only bookkeeping (addresses are never dereferenced).
 *
 * What it models (docs/gpu.md, "Testing without a GPU"):
 *  - devices: a count, a capacity each (cudaMalloc, cudaMallocAsync, cudaMallocFromPoolAsync,
 *    cudaMallocManaged and cuMemCreate fail with out-of-memory past it), the VMM attribute, the
 *    allocation granularity, the peer-access matrix;
 *  - memory pools: cudaDeviceGetDefaultMemPool, cudaMemPoolCreate/Destroy/TrimTo; a
 *    stream-ordered allocation takes the device's capacity at once and cudaFreeAsync (or
 *    cudaFree) returns it at once (no pool cache is modelled);
 *  - contexts: one primary context per device, created on first use; each thread has a current
 *    context (none on a fresh thread) and a runtime device (0 until cudaSetDevice). Runtime calls
 *    that need a context create the primary context of the thread's runtime device, as cudart
 *    does; driver calls without a current context fail with CUDA_ERROR_INVALID_CONTEXT;
 *  - the per-thread error state: a failed runtime call sets it, cudaGetLastError returns and
 *    clears it, cudaPeekAtLastError returns it;
 *  - streams (cudaStreamLegacy/0 per device, cudaStreamPerThread per thread and device, created
 *    streams) with their device and capture status; events with their device; a stream can be
 *    "blocked" so that events recorded on it stay pending until it is released;
 *  - graph capture: while a stream captures in global mode (or thread-local mode in this
 *    thread), an unsafe call (cudaMalloc, cudaFree, cudaDeviceSynchronize, cudaEventSynchronize,
 *    cudaEventQuery, cuMemUnmap, cuMemRelease) from a thread not in relaxed mode fails with
 *    cudaErrorStreamCaptureUnsupported and invalidates the capture, as the driver does;
 *    cudaStreamIsCapturing/GetCaptureInfo on cudaStreamLegacy answer
 *    cudaErrorStreamCaptureImplicit while a blocking stream of the device (not created with
 *    cudaStreamNonBlocking) captures, and nothing special for a non-blocking one;
 *  - fault injection: the nth call of a named function from now returns a given error;
 *  - a call log (name, result, device, address, size) to assert on.
 *
 * Using it (CMake target memsnap_fakecuda, built with the cuda backend, i.e. when a CUDA Toolkit
 * >= 12.8 is found; output build/lib/libmemsnap_fakecuda.so):
 *  - a test or program links `memsnap_fakecuda` (and the toolkit's include directory for
 *    cuda_runtime_api.h); linked ahead of libcudart, its definitions win. It needs no libcudart
 *    and no libcuda at run time. A CUDA function it does not define resolves to whatever else is
 *    on the link line (libcudart if linked, e.g. through memsnap_core's private dependency):
 *    tests/test_cuda_fake links with --as-needed and has no libcudart in its NEEDED list
 *    (`readelf -d`), which shows that every call it makes lands in the fake;
 *  - or a program built against the real libcudart is started with
 *    LD_PRELOAD=build/lib/libmemsnap_fakecuda.so;
 *  - the fakecuda_* calls below steer it from the test; call fakecuda_reset() first.
 * Exported CUDA functions: cudaGetDeviceCount, cudaDriverGetVersion, cudaRuntimeGetVersion,
 * cudaGetDevice, cudaSetDevice, cudaDeviceCanAccessPeer, cudaDeviceEnablePeerAccess,
 * cudaGetLastError, cudaPeekAtLastError, cudaGetErrorName, cudaGetErrorString, cudaMalloc,
 * cudaFree, cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync, cudaMallocManaged,
 * cudaDeviceGetDefaultMemPool, cudaMemPoolCreate, cudaMemPoolDestroy, cudaMemPoolTrimTo,
 * cudaMemGetInfo, cudaDeviceSynchronize, cudaStreamCreate, cudaStreamCreateWithFlags,
 * cudaStreamDestroy, cudaStreamSynchronize, cudaStreamGetDevice, cudaStreamGetId,
 * cudaStreamBeginCapture, cudaStreamEndCapture, cudaStreamIsCapturing, cudaStreamGetCaptureInfo,
 * cudaThreadExchangeStreamCaptureMode, cudaEventCreate, cudaEventCreateWithFlags,
 * cudaEventRecord, cudaEventQuery, cudaEventSynchronize, cudaEventDestroy,
 * cudaGetDriverEntryPointByVersion, and the driver's cuCtxGetCurrent, cuCtxSetCurrent,
 * cuCtxGetDevice, cuDeviceGetAttribute, cuMemGetAllocationGranularity, cuMemAddressReserve,
 * cuMemAddressFree, cuMemCreate, cuMemRelease, cuMemMap, cuMemUnmap, cuMemSetAccess,
 * cuGetErrorName, cuGetErrorString. Every one of them can be made to fail (fakecuda_fail).
 *
 * Thread-safety: every function may be called from any thread (one mutex inside).
 */
#ifndef MEMSNAP_TESTS_FAKECUDA_H
#define MEMSNAP_TESTS_FAKECUDA_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FAKECUDA_MAX_DEVICES 8

/* Back to the initial state: 1 device of 1 GiB, VMM supported, granularity 2 MiB, no peer
 * access, driver version 13000, no rules, empty log, no context created, every thread's context
 * and error state forgotten (threads that run on keep their thread-local state: call reset from a
 * test's start, before its threads exist). */
void fakecuda_reset(void);

/* Devices. ndevices 0 makes cudaGetDeviceCount fail with cudaErrorNoDevice. */
void fakecuda_set_device_count(int ndevices);
void fakecuda_set_capacity(int device, size_t bytes);
void fakecuda_set_granularity(int device, size_t bytes);
void fakecuda_set_vmm_supported(int device, bool supported);
/* Whether device `dev` can access memory of device `peer` (cudaDeviceCanAccessPeer, and the
 * only peers cuMemSetAccess accepts). */
void fakecuda_set_peer_access(int dev, int peer, bool can);
/* cudaDriverGetVersion's answer (e.g. 12020); a value below the runtime's makes
 * cudaGetDeviceCount fail with cudaErrorInsufficientDriver. */
void fakecuda_set_driver_version(int version);

/* Fault injection: the nth call (1 = the next) of the function named `fn` (e.g. "cudaFree",
 * "cuMemMap") from now returns `error` (a cudaError_t for runtime calls, a CUresult for driver
 * calls) without doing anything; then the following `times - 1` calls fail too (times < 0:
 * every call from the nth on). Up to 32 rules. */
void fakecuda_fail(const char *fn, unsigned nth, int error, int times);
void fakecuda_clear_failures(void);

/* The call log. Every exported CUDA function is logged (the fakecuda_* calls are not). */
typedef struct fakecuda_call_s {
  char fn[48];   /* function name */
  int result;    /* what it returned */
  int device;    /* the calling thread's current context's device, -1 without one */
  uint64_t addr; /* address or handle argument/result, else 0 */
  uint64_t size; /* size argument, else 0 */
} fakecuda_call_t;
/* Number of calls of fn logged since the last clear (fn NULL: all calls). */
size_t fakecuda_count(const char *fn);
/* Copies entry i (0 = oldest) into *out; false past the end. The log keeps 65536 entries. */
bool fakecuda_log_get(size_t i, fakecuda_call_t *out);
size_t fakecuda_log_len(void);
void fakecuda_log_clear(void);

/* Contexts. Whether device's primary context was ever created (by a runtime call on it or
 * cudaSetDevice). */
bool fakecuda_context_created(int device);
/* The calling thread's current context's device, -1 when it has none. */
int fakecuda_current_context_device(void);
/* Makes this thread have no current context (as a fresh thread), runtime device 0. */
void fakecuda_forget_thread_context(void);

/* The calling thread's pending runtime error (what cudaPeekAtLastError would say), without
 * logging a call. Set it with fakecuda_set_pending_error (as if a user call had failed). */
int fakecuda_pending_error(void);
void fakecuda_set_pending_error(int error);

/* Streams. Blocking a stream keeps every event recorded on it pending until it is unblocked
 * (a cudaEventSynchronize or cudaStreamSynchronize on it then fails with cudaErrorNotReady
 * instead of hanging; cudaDeviceSynchronize releases it). stream is a cudaStream_t value. */
void fakecuda_block_stream(uint64_t stream, bool blocked);
/* Capture: begins/ends a capture on stream as cudaStreamBeginCapture/EndCapture would
 * (mode: a cudaStreamCaptureMode). */
int fakecuda_begin_capture(uint64_t stream, int mode);
int fakecuda_end_capture(uint64_t stream);
/* Whether a capture on stream was invalidated by an unsafe call (until the capture ends). */
bool fakecuda_capture_invalidated(uint64_t stream);

/* Memory: bytes in use on device (cudaMalloc*, stream-ordered, managed and cuMemCreate'd, not
 * released), live allocations of the runtime (cudaMalloc, stream-ordered and managed), live VMM
 * physical handles, live mapped ranges, live reservations. */
size_t fakecuda_used_bytes(int device);
size_t fakecuda_live_allocations(int device);
size_t fakecuda_live_handles(void);
size_t fakecuda_live_mappings(void);
size_t fakecuda_live_reservations(void);
/* The devices that have read/write access to the mapping containing addr (bit d set for
 * device d); 0 when addr is not mapped. */
unsigned fakecuda_access_mask(uint64_t addr);
/* The size of the physical allocation mapped at addr (0 if none): the unit memsnap maps. */
size_t fakecuda_mapping_size(uint64_t addr);

/* The device an event was created on (-1: unknown event). */
int fakecuda_event_device(uint64_t event);

#ifdef __cplusplus
}
#endif

#endif /* MEMSNAP_TESTS_FAKECUDA_H */
