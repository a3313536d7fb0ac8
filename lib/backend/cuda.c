/* SPDX-License-Identifier: MIT
 * memsnap core: the "cuda" backend, the ops table of include/memsnap/backend.h on real NVIDIA GPUs
 * through the CUDA runtime (issues #6, #15). With cudart.c (the runtime's loader) the only files
 * of memsnap_core that include CUDA headers; compiled only when CMake found a CUDA Toolkit >= 12.8
 * (MS_HAVE_CUDA).
 *
 * What each operation calls (docs/pytorch-allocator.md, "The CUDA calls used"; docs/gpu.md):
 *  - malloc: cudaMalloc, in relaxed stream-capture mode (cudaThreadExchangeStreamCaptureMode) so
 *    that a segment can be allocated while a stream of this thread is being captured into a graph,
 *    as PyTorch does. cudaErrorMemoryAllocation is MS_EOOM; nothing else is.
 *  - free: cudaFree, never while a graph capture is under way on the device (cudaFree there would
 *    invalidate the capture): then MS_ESTATE without calling it. No explicit synchronization (the
 *    allocator never frees during a capture, and cudaFree synchronizes by itself).
 *  - mem_info: cudaMemGetInfo. device_synchronize: cudaDeviceSynchronize, refused (MS_ESTATE)
 *    while a capture is under way, like cudaEventSynchronize (event_synchronize) and cuMemUnmap;
 *    event_query answers "not done" then without calling cudaEventQuery. "Under way" is what the
 *    legacy stream reports (cudaErrorStreamCaptureImplicit: a blocking stream of the device is
 *    capturing); the allocator itself also treats every private-pool routing as a capture.
 *  - streams: cudaStreamCreateWithFlags(cudaStreamNonBlocking), like PyTorch's stream pool.
 *  - stream_key: cudaStreamPerThread is the same handle on every thread but a different stream on
 *    each: its key is CUDA_PT_KEY_BIT | cudaStreamGetId(cudaStreamPerThread), unique to the real
 *    stream; cudaStreamLegacy becomes 0. Operations given such a key on another thread fail.
 *  - events: each memsnap event is a small record {cudaEvent_t, device}. The event is created
 *    with cudaEventDisableTiming on the allocator's device and re-created on the stream's device
 *    when it is recorded on a stream of another device (record_stream with a stream of another
 *    GPU; cudaEventRecord needs both on one device). query (cudaErrorNotReady is "not done"),
 *    synchronize and destroy run on the event's device.
 *  - stream_capture_info: cudaStreamGetCaptureInfo.
 *  - va_reserve/va_release/mem_map/mem_unmap (expandable segments): the driver's virtual-memory
 *    calls cuMemAddressReserve, cuMemCreate + cuMemMap + cuMemSetAccess (one physical allocation
 *    per mem_map call: the allocator maps one page at a time, 2 MiB in the small pool and
 *    large_segment_size, 20 MiB by default, in the large pool, as PyTorch does), cuMemUnmap +
 *    cuMemRelease, cuMemAddressFree. Access is set for the device and for every device that can
 *    access it as a peer (cudaDeviceCanAccessPeer), so that peer kernels may use the memory as
 *    they could use cudaMalloc'd memory with peer access enabled. mem_granularity is
 *    cuMemGetAllocationGranularity (minimum). The driver functions are looked up at run time
 *    through cudaGetDriverEntryPointByVersion rather than linked: linking libcuda.so.1 would make
 *    every program that links memsnap_core fail to start on a machine without the NVIDIA driver.
 *
 * Contexts (PyTorch's CUDAGuard): every operation saves the calling thread's current context
 * (cuCtxGetCurrent, NULL on a fresh thread), makes the device's primary context current with
 * cudaSetDevice only when the current context is not already on that device, and restores the
 * saved context with cuCtxSetCurrent before returning. A thread that had no context gets none
 * back, and no context is ever created on a device the call does not name (restoring with
 * cudaSetDevice(0) would create one on GPU 0 in a process that never used it).
 *
 * Errors: a failed call is reported once through the library's output hook as
 *   memsnap: error: cuda: cudaFree on device 0: cudaErrorIllegalAddress: an illegal memory
 *   access was encountered
 * (the call, the device, the error's name and text) and mapped to MS_EINVAL (bad value, handle or
 * pointer), MS_ENODEVICE (bad device), MS_ESTATE (capture under way) or MS_EBACKEND. The error
 * state of the calling thread (cudaGetLastError) is left as it was found: an error this backend
 * caused is cleared only when no error was pending before the call, so a program's own pending
 * error is never swallowed (cudaPeekAtLastError at entry). Out-of-memory is the only MS_EOOM.
 *
 * The runtime itself is loaded at run time too (cudart.h, the first time the backend is opened):
 * memsnap never links libcudart, so a program that never opens this backend never needs CUDA.
 *
 * Opening: ms_backend_cuda_create fails with MS_ENODEVICE and "cuda backend: cannot load the CUDA
 * runtime (libcudart.so.13): <dlerror>" when the runtime is not installed, MS_EBACKEND when it
 * lacks a function of cudart.h, MS_ENODEVICE and "no CUDA device: ..." when there is no GPU or
 * no driver, and MS_EBACKEND when the driver lacks the context calls.
 *
 * Thread-safety: every operation may be called from any thread (the CUDA runtime is thread-safe;
 * the table of mapped ranges has its own mutex).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "backend/backend_internal.h"
#include "backend/cudart.h"
#include "common/internal.h"

#if CUDART_VERSION < 12080
#error                                                                                             \
    "the cuda backend needs CUDA 12.8 or newer (cudaStreamGetDevice, cudaGetDriverEntryPointByVersion)"
#endif

/* The runtime's functions, loaded at run time (cudart.h): memsnap does not link libcudart. */
#define RT ms__cudart

/* Keys of per-thread default streams (stream_key): this bit and the stream's id. Real handles
 * are user-space addresses, below 2^63. */
#define CUDA_PT_KEY_BIT ((ms_stream_t)1 << 63)
/* Default granularity assumed by the allocator (backend.h). */
#define CUDA_DEFAULT_PAGE ((size_t)2 << 20)

/* One physical allocation mapped by mem_map. */
typedef struct cuda_chunk_s {
  CUdeviceptr addr;
  size_t size;
  CUmemGenericAllocationHandle handle;
  int device;
  bool unmapped; /* unmapped, its release failed and it could not be mapped back */
} cuda_chunk_t;

typedef struct cuda_drv_s {
  PFN_cuCtxGetCurrent_v4000 ctx_get_current;
  PFN_cuCtxSetCurrent_v4000 ctx_set_current;
  PFN_cuCtxGetDevice_v2000 ctx_get_device;
  PFN_cuMemAddressReserve_v10020 reserve;
  PFN_cuMemAddressFree_v10020 address_free;
  PFN_cuMemCreate_v10020 create;
  PFN_cuMemRelease_v10020 release;
  PFN_cuMemMap_v10020 map;
  PFN_cuMemUnmap_v10020 unmap;
  PFN_cuMemSetAccess_v10020 set_access;
  PFN_cuMemGetAllocationGranularity_v10020 granularity;
  PFN_cuDeviceGetAttribute_v2000 device_attribute;
  PFN_cuGetErrorName_v6000 error_name;
  PFN_cuGetErrorString_v6000 error_string;
} cuda_drv_t;

/* A memsnap event: the CUDA event and the device it lives on (events are created on the
 * allocator's device and moved to a stream's device when recorded there). */
typedef struct cuda_event_s {
  cudaEvent_t ev;
  int device;
} cuda_event_t;

typedef struct cuda_ctx_s {
  int ndevices;
  bool have_vmm; /* every device supports the virtual-memory calls */
  cuda_drv_t drv;
  size_t *gran;         /* per device: allocation granularity (have_vmm) */
  int **peers;          /* per device: the devices that can access it, -1 terminated */
  pthread_mutex_t lock; /* protects chunks */
  cuda_chunk_t *chunks; /* mapped ranges, sorted by (device, addr) */
  size_t nchunks, cap_chunks;
} cuda_ctx_t;

/* ---- the current context and the error state, saved and restored ------------------------- */

typedef struct cuda_guard_s {
  int device;          /* the device the operation runs on */
  CUcontext prev;      /* the thread's context at entry (NULL: none) */
  bool switched;       /* whether the context was changed */
  cudaError_t pending; /* the thread's pending error at entry */
} cuda_guard_t;

/* Clears the error this backend just caused, unless the program had one pending at entry (then
 * it stays for the program to see). */
static void error_restore(const cuda_guard_t *g) {
  if (g->pending == cudaSuccess) (void)RT.cudaGetLastError();
}

static int map_error(cudaError_t e) {
  switch (e) {
  case cudaErrorMemoryAllocation:
    return MS_EOOM;
  case cudaErrorInvalidValue:
  case cudaErrorInvalidResourceHandle:
  case cudaErrorInvalidDevicePointer:
    return MS_EINVAL;
  case cudaErrorInvalidDevice:
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
    return MS_ENODEVICE;
  case cudaErrorStreamCaptureUnsupported:
  case cudaErrorStreamCaptureInvalidated:
  case cudaErrorStreamCaptureImplicit:
    return MS_ESTATE;
  default:
    return MS_EBACKEND;
  }
}

/* Reports a failed runtime call (name and text) and maps it. Out-of-memory is reported by the
 * allocator's OOM path instead, so it is not printed here. */
static int cuda_fail(const cuda_guard_t *g, cudaError_t e, const char *call, const char *detail) {
  error_restore(g);
  int r = map_error(e);
  if (r != MS_EOOM)
    ms__error_msg("cuda: %s%s on device %d: %s: %s", call, detail ? detail : "", g->device,
                  RT.cudaGetErrorName(e), RT.cudaGetErrorString(e));
  return r;
}

static int cuda_fail_drv(const cuda_ctx_t *c, int device, CUresult r, const char *call) {
  if (r == CUDA_ERROR_OUT_OF_MEMORY) return MS_EOOM;
  const char *name = NULL, *text = NULL;
  if (!c->drv.error_name || c->drv.error_name(r, &name) != CUDA_SUCCESS || !name)
    name = "CUDA_ERROR_?";
  if (!c->drv.error_string || c->drv.error_string(r, &text) != CUDA_SUCCESS || !text)
    text = "unknown driver error";
  ms__error_msg("cuda: %s on device %d: %s (%d): %s", call, device, name, (int)r, text);
  switch (r) {
  case CUDA_ERROR_INVALID_VALUE:
    return MS_EINVAL;
  case CUDA_ERROR_INVALID_DEVICE:
    return MS_ENODEVICE;
  case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED:
  case CUDA_ERROR_STREAM_CAPTURE_INVALIDATED:
    return MS_ESTATE;
  default:
    return MS_EBACKEND;
  }
}

/* Makes device's context current for this thread (CUDAGuard semantics, see the top). */
static int guard_enter(const cuda_ctx_t *c, int device, cuda_guard_t *g) {
  MS_RETURN_IF(device < 0 || device >= c->ndevices, MS_ENODEVICE);
  g->device = device;
  g->switched = false;
  g->prev = NULL;
  g->pending = RT.cudaPeekAtLastError();
  CUresult r = c->drv.ctx_get_current(&g->prev);
  if (r != CUDA_SUCCESS) return cuda_fail_drv(c, device, r, "cuCtxGetCurrent");
  if (g->prev) {
    CUdevice cur = -1;
    if (c->drv.ctx_get_device(&cur) == CUDA_SUCCESS && cur == device) return MS_OK;
  }
  cudaError_t e = RT.cudaSetDevice(device);
  if (e != cudaSuccess) return cuda_fail(g, e, "cudaSetDevice", NULL);
  g->switched = true;
  return MS_OK;
}

static void guard_leave(const cuda_ctx_t *c, const cuda_guard_t *g) {
  if (!g->switched) return;
  CUresult r = c->drv.ctx_set_current(g->prev);
  if (r != CUDA_SUCCESS) (void)cuda_fail_drv(c, g->device, r, "cuCtxSetCurrent (restoring)");
}

static cudaStream_t stream_of(ms_stream_t s) {
  return (cudaStream_t)(uintptr_t)s;
}

/* The handle usable on this thread for a stream key (pre: guard entered). */
static int stream_from_key(const cuda_guard_t *g, ms_stream_t key, cudaStream_t *out) {
  if (!(key & CUDA_PT_KEY_BIT)) {
    *out = stream_of(key);
    return MS_OK;
  }
  unsigned long long id = 0;
  cudaError_t e = RT.cudaStreamGetId(cudaStreamPerThread, &id);
  if (e != cudaSuccess) return cuda_fail(g, e, "cudaStreamGetId", " (cudaStreamPerThread)");
  if ((ms_stream_t)id != (key & ~CUDA_PT_KEY_BIT)) {
    ms__error_msg("cuda: stream key %#llx is the per-thread default stream of another thread "
                  "(device %d): it cannot be used from this thread",
                  (unsigned long long)key, g->device);
    return MS_EINVAL;
  }
  *out = cudaStreamPerThread;
  return MS_OK;
}

/* Whether a graph capture that forbids cudaFree, cuMemUnmap or a synchronization is under way on
 * the guard's device: the legacy stream answers cudaErrorStreamCaptureImplicit while another
 * stream captures in global mode. */
static bool capture_under_way(const cuda_guard_t *g) {
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  cudaError_t e = RT.cudaStreamIsCapturing(cudaStreamLegacy, &st);
  if (e != cudaSuccess) error_restore(g);
  return e == cudaErrorStreamCaptureImplicit || st != cudaStreamCaptureStatusNone;
}

/* A call that would invalidate a capture under way is not made: reported, MS_ESTATE. */
static int refuse_during_capture(const cuda_guard_t *g, const char *call) {
  ms__error_msg("cuda: %s on device %d refused: a CUDA graph capture is under way (it would "
                "invalidate the capture)",
                call, g->device);
  return MS_ESTATE;
}

#define CTX(c) cuda_ctx_t *c = (cuda_ctx_t *)ctx

/* ---- the ops ------------------------------------------------------------------------------- */

static int cuda_device_count(void *ctx, int *count) {
  *count = ((cuda_ctx_t *)ctx)->ndevices;
  return MS_OK;
}

static int cuda_malloc(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out) {
  (void)stream; /* cudaMalloc is not stream-ordered */
  CTX(c);
  MS_RETURN_IF(size == 0, MS_EINVAL);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  /* Relaxed capture mode: allowed while this thread captures a graph (PyTorch's alloc_block);
   * replays do not allocate again, the memory stays in the capture's private pool. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t me = RT.cudaThreadExchangeStreamCaptureMode(&mode);
  void *p = NULL;
  cudaError_t e = RT.cudaMalloc(&p, size);
  if (me == cudaSuccess) (void)RT.cudaThreadExchangeStreamCaptureMode(&mode);
  int r = MS_OK;
  if (e != cudaSuccess) {
    char detail[48];
    snprintf(detail, sizeof detail, "(%zu bytes)", size);
    r = cuda_fail(&g, e, "cudaMalloc", detail);
  } else {
    *out = (ms_devptr_t)p;
  }
  guard_leave(c, &g);
  return r;
}

static int cuda_free(void *ctx, int device, ms_devptr_t ptr) {
  CTX(c);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  int r = MS_OK;
  if (capture_under_way(&g)) {
    ms__error_msg("cuda: cudaFree(%#llx) on device %d refused: a CUDA graph capture is under way "
                  "(freeing would invalidate it)",
                  (unsigned long long)ptr, device);
    r = MS_ESTATE;
  } else {
    cudaError_t e = RT.cudaFree((void *)ptr);
    if (e != cudaSuccess) r = cuda_fail(&g, e, "cudaFree", NULL);
  }
  guard_leave(c, &g);
  return r;
}

static int cuda_mem_info(void *ctx, int device, size_t *free_bytes, size_t *total_bytes) {
  CTX(c);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  size_t f = 0, t = 0;
  int r = MS_OK;
  cudaError_t e = RT.cudaMemGetInfo(&f, &t);
  if (e != cudaSuccess) {
    r = cuda_fail(&g, e, "cudaMemGetInfo", NULL);
  } else {
    *free_bytes = f;
    *total_bytes = t;
  }
  guard_leave(c, &g);
  return r;
}

static int cuda_stream_create(void *ctx, int device, ms_stream_t *out) {
  CTX(c);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  cudaStream_t s = NULL;
  int r = MS_OK;
  cudaError_t e = RT.cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess)
    r = cuda_fail(&g, e, "cudaStreamCreateWithFlags", NULL);
  else
    *out = (ms_stream_t)(uintptr_t)s;
  guard_leave(c, &g);
  return r;
}

static int cuda_stream_destroy(void *ctx, int device, ms_stream_t stream) {
  CTX(c);
  MS_RETURN_IF(stream == 0 || (uintptr_t)stream == (uintptr_t)cudaStreamLegacy ||
                   (uintptr_t)stream == (uintptr_t)cudaStreamPerThread ||
                   (stream & CUDA_PT_KEY_BIT),
               MS_EINVAL);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  int r = MS_OK;
  cudaError_t e = RT.cudaStreamDestroy(stream_of(stream));
  if (e != cudaSuccess) r = cuda_fail(&g, e, "cudaStreamDestroy", NULL);
  guard_leave(c, &g);
  return r;
}

static int cuda_stream_key(void *ctx, int device, ms_stream_t stream, ms_stream_t *key) {
  CTX(c);
  if ((uintptr_t)stream == (uintptr_t)cudaStreamLegacy) {
    *key = 0;
    return MS_OK;
  }
  if ((uintptr_t)stream != (uintptr_t)cudaStreamPerThread) {
    *key = stream;
    return MS_OK;
  }
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  unsigned long long id = 0;
  int r = MS_OK;
  cudaError_t e = RT.cudaStreamGetId(cudaStreamPerThread, &id);
  if (e != cudaSuccess)
    r = cuda_fail(&g, e, "cudaStreamGetId", " (cudaStreamPerThread)");
  else
    *key = CUDA_PT_KEY_BIT | (ms_stream_t)id;
  guard_leave(c, &g);
  return r;
}

static int cuda_event_create(void *ctx, int device, ms_event_t *out) {
  CTX(c);
  cuda_event_t *ev = malloc(sizeof *ev);
  MS_RETURN_IF(!ev, MS_ENOMEM);
  cuda_guard_t g;
  int r = guard_enter(c, device, &g);
  if (r != MS_OK) {
    free(ev);
    return r;
  }
  cudaError_t e = RT.cudaEventCreateWithFlags(&ev->ev, cudaEventDisableTiming);
  if (e != cudaSuccess) {
    r = cuda_fail(&g, e, "cudaEventCreateWithFlags", NULL);
    free(ev);
  } else {
    ev->device = device;
    *out = (ms_event_t)(uintptr_t)ev;
  }
  guard_leave(c, &g);
  return r;
}

/* The device of a stream key as seen from device's context (pre: guard on device entered). */
static int stream_device(const cuda_guard_t *g, cudaStream_t s, int *out) {
  if (s == NULL || s == cudaStreamLegacy || s == cudaStreamPerThread) {
    *out = g->device;
    return MS_OK;
  }
  cudaError_t e = RT.cudaStreamGetDevice(s, out);
  return e == cudaSuccess ? MS_OK : cuda_fail(g, e, "cudaStreamGetDevice", NULL);
}

static int cuda_event_record(void *ctx, int device, ms_event_t event, ms_stream_t stream) {
  CTX(c);
  cuda_event_t *ev = (cuda_event_t *)(uintptr_t)event;
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  cudaStream_t s = NULL;
  int sdev = device;
  int r = stream_from_key(&g, stream, &s);
  if (r == MS_OK) r = stream_device(&g, s, &sdev);
  guard_leave(c, &g);
  MS_FORWARD_IF_ERROR(r);
  MS_FORWARD_IF_ERROR(guard_enter(c, sdev, &g));
  cudaError_t e = cudaSuccess;
  if (ev->device != sdev) {
    /* A stream of another device (record_stream across GPUs): the event moves there. */
    cudaEvent_t moved = NULL;
    e = RT.cudaEventCreateWithFlags(&moved, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      r = cuda_fail(&g, e, "cudaEventCreateWithFlags", " (moving an event to the stream's device)");
    } else {
      cuda_guard_t g2;
      if (guard_enter(c, ev->device, &g2) == MS_OK) {
        if (RT.cudaEventDestroy(ev->ev) != cudaSuccess) error_restore(&g2);
        guard_leave(c, &g2);
      }
      ev->ev = moved;
      ev->device = sdev;
    }
  }
  if (r == MS_OK) {
    e = RT.cudaEventRecord(ev->ev, s);
    if (e != cudaSuccess) r = cuda_fail(&g, e, "cudaEventRecord", NULL);
  }
  guard_leave(c, &g);
  return r;
}

static int cuda_event_query(void *ctx, int device, ms_event_t event, bool *done) {
  CTX(c);
  (void)device;
  cuda_event_t *ev = (cuda_event_t *)(uintptr_t)event;
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, ev->device, &g));
  int r = MS_OK;
  if (capture_under_way(&g)) {
    /* cudaEventQuery would invalidate the capture: "not done yet", asked again later. */
    *done = false;
    guard_leave(c, &g);
    return MS_OK;
  }
  cudaError_t e = RT.cudaEventQuery(ev->ev);
  if (e == cudaSuccess) {
    *done = true;
  } else if (e == cudaErrorNotReady) {
    error_restore(&g); /* "not ready" is an answer, not an error ("Freeing and events") */
    *done = false;
  } else {
    r = cuda_fail(&g, e, "cudaEventQuery", NULL);
  }
  guard_leave(c, &g);
  return r;
}

static int cuda_event_synchronize(void *ctx, int device, ms_event_t event) {
  CTX(c);
  (void)device;
  cuda_event_t *ev = (cuda_event_t *)(uintptr_t)event;
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, ev->device, &g));
  int r = MS_OK;
  cudaError_t e = cudaSuccess;
  if (capture_under_way(&g))
    r = refuse_during_capture(&g, "cudaEventSynchronize");
  else if ((e = RT.cudaEventSynchronize(ev->ev)) != cudaSuccess)
    r = cuda_fail(&g, e, "cudaEventSynchronize", NULL);
  guard_leave(c, &g);
  return r;
}

static int cuda_event_destroy(void *ctx, int device, ms_event_t event) {
  CTX(c);
  (void)device;
  cuda_event_t *ev = (cuda_event_t *)(uintptr_t)event;
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, ev->device, &g));
  int r = MS_OK;
  cudaError_t e = RT.cudaEventDestroy(ev->ev);
  if (e != cudaSuccess)
    r = cuda_fail(&g, e, "cudaEventDestroy", NULL);
  else
    free(ev);
  guard_leave(c, &g);
  return r;
}

static int cuda_device_synchronize(void *ctx, int device) {
  CTX(c);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  int r = MS_OK;
  cudaError_t e = cudaSuccess;
  if (capture_under_way(&g))
    r = refuse_during_capture(&g, "cudaDeviceSynchronize");
  else if ((e = RT.cudaDeviceSynchronize()) != cudaSuccess)
    r = cuda_fail(&g, e, "cudaDeviceSynchronize", NULL);
  guard_leave(c, &g);
  return r;
}

static int cuda_stream_capture_info(void *ctx, int device, ms_stream_t stream, bool *capturing,
                                    uint64_t *capture_id) {
  CTX(c);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  cudaStream_t s = NULL;
  int r = stream_from_key(&g, stream, &s);
  if (r == MS_OK) {
    enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    unsigned long long id = 0;
#if CUDART_VERSION >= 13000
    cudaError_t e = RT.cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL, NULL);
#else
    cudaError_t e = RT.cudaStreamGetCaptureInfo(s, &st, &id, NULL, NULL, NULL);
#endif
    if (e == cudaErrorStreamCaptureImplicit) {
      /* The legacy default stream was asked about while another stream captures in global mode:
       * it cannot itself be capturing, but a capture is under way, which is what the caller
       * needs to know to defer event queries and frees. */
      error_restore(&g);
      *capturing = true;
      *capture_id = 0;
    } else if (e != cudaSuccess) {
      r = cuda_fail(&g, e, "cudaStreamGetCaptureInfo", NULL);
    } else {
      *capturing = st != cudaStreamCaptureStatusNone;
      *capture_id = *capturing ? (uint64_t)id : 0;
    }
  }
  guard_leave(c, &g);
  return r;
}

/* ---- virtual memory for expandable segments (driver API, looked up at run time) ------------ */

/* Index of the first chunk >= (device, addr) in the sorted table. */
static size_t chunks_lower_bound(const cuda_ctx_t *c, int device, CUdeviceptr addr) {
  size_t lo = 0, hi = c->nchunks;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const cuda_chunk_t *p = &c->chunks[mid];
    if (p->device < device || (p->device == device && p->addr < addr))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static CUmemAllocationProp cuda_page_prop(int device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

static int cuda_mem_granularity(void *ctx, int device, size_t *bytes) {
  CTX(c);
  MS_RETURN_IF(device < 0 || device >= c->ndevices, MS_ENODEVICE);
  *bytes = c->gran[device];
  return MS_OK;
}

static int cuda_va_reserve(void *ctx, int device, size_t size, ms_devptr_t *out) {
  CTX(c);
  MS_RETURN_IF(device < 0 || device >= c->ndevices, MS_ENODEVICE);
  MS_RETURN_IF(size == 0 || size % c->gran[device] != 0, MS_EINVAL);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  CUdeviceptr p = 0;
  int r = MS_OK;
  CUresult cr = c->drv.reserve(&p, size, c->gran[device], 0, 0);
  if (cr != CUDA_SUCCESS)
    r = cuda_fail_drv(c, device, cr, "cuMemAddressReserve");
  else
    *out = (ms_devptr_t)p;
  guard_leave(c, &g);
  return r;
}

static int cuda_va_release(void *ctx, int device, ms_devptr_t addr, size_t size) {
  CTX(c);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  int r = MS_OK;
  pthread_mutex_lock(&c->lock);
  size_t i = chunks_lower_bound(c, device, (CUdeviceptr)addr);
  bool mapped = i < c->nchunks && c->chunks[i].device == device &&
                c->chunks[i].addr < (CUdeviceptr)(addr + size);
  pthread_mutex_unlock(&c->lock);
  if (mapped) {
    ms__error_msg("cuda: va_release of a range that still has mapped pages on device %d", device);
    r = MS_ESTATE;
  } else {
    CUresult cr = c->drv.address_free((CUdeviceptr)addr, size);
    if (cr != CUDA_SUCCESS) r = cuda_fail_drv(c, device, cr, "cuMemAddressFree");
  }
  guard_leave(c, &g);
  return r;
}

static int chunks_reserve(cuda_ctx_t *c, size_t extra) {
  if (c->nchunks + extra <= c->cap_chunks) return MS_OK;
  size_t cap = c->cap_chunks ? c->cap_chunks : 64;
  while (cap < c->nchunks + extra)
    cap *= 2;
  cuda_chunk_t *np = realloc(c->chunks, cap * sizeof *np);
  MS_RETURN_IF(!np, MS_ENOMEM);
  c->chunks = np;
  c->cap_chunks = cap;
  return MS_OK;
}

/* Read/write access to [addr, addr+size) for device and every peer that can access it. */
static CUresult set_access(const cuda_ctx_t *c, int device, CUdeviceptr addr, size_t size) {
  CUmemAccessDesc acc[64];
  size_t n = 0;
  memset(acc, 0, sizeof acc);
  acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  acc[n].location.id = device;
  acc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  for (const int *p = c->peers[device]; *p >= 0 && n < 64; p++) {
    acc[n].location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    acc[n].location.id = *p;
    acc[n++].flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
  }
  return c->drv.set_access(addr, size, acc, n);
}

static int cuda_mem_map(void *ctx, int device, ms_devptr_t addr, size_t size) {
  CTX(c);
  MS_RETURN_IF(device < 0 || device >= c->ndevices, MS_ENODEVICE);
  size_t gran = c->gran[device];
  MS_RETURN_IF(size == 0 || size % gran != 0 || addr % gran != 0, MS_EINVAL);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  CUmemAllocationProp prop = cuda_page_prop(device);
  int r = MS_OK;
  pthread_mutex_lock(&c->lock);
  size_t at = chunks_lower_bound(c, device, (CUdeviceptr)addr);
  bool overlap = (at < c->nchunks && c->chunks[at].device == device &&
                  c->chunks[at].addr < (CUdeviceptr)(addr + size)) ||
                 (at > 0 && c->chunks[at - 1].device == device &&
                  c->chunks[at - 1].addr + c->chunks[at - 1].size > (CUdeviceptr)addr);
  if (overlap) {
    ms__error_msg("cuda: mem_map of a range that is already mapped on device %d", device);
    r = MS_ESTATE;
  } else {
    r = chunks_reserve(c, 1);
  }
  CUmemGenericAllocationHandle h = 0;
  bool created = false, mapped = false;
  if (r == MS_OK) {
    CUresult cr = c->drv.create(&h, size, &prop, 0);
    if (cr != CUDA_SUCCESS)
      r = cuda_fail_drv(c, device, cr, "cuMemCreate");
    else
      created = true;
  }
  if (r == MS_OK) {
    CUresult cr = c->drv.map((CUdeviceptr)addr, size, 0, h, 0);
    if (cr != CUDA_SUCCESS)
      r = cuda_fail_drv(c, device, cr, "cuMemMap");
    else
      mapped = true;
  }
  if (r == MS_OK) {
    /* Read/write for the device and every peer that can access it ("Expandable segments"). */
    CUresult cr = set_access(c, device, (CUdeviceptr)addr, size);
    if (cr != CUDA_SUCCESS) r = cuda_fail_drv(c, device, cr, "cuMemSetAccess");
  }
  if (r == MS_OK) {
    memmove(&c->chunks[at + 1], &c->chunks[at], (c->nchunks - at) * sizeof *c->chunks);
    c->chunks[at] =
        (cuda_chunk_t){.addr = (CUdeviceptr)addr, .size = size, .handle = h, .device = device};
    c->nchunks++;
  } else {
    /* All or nothing (PyTorch releases what a failed map created, "Expandable segments"). */
    if (mapped && c->drv.unmap((CUdeviceptr)addr, size) != CUDA_SUCCESS)
      ms__warning("cuda: cannot undo a failed mem_map on device %d", device);
    if (created && c->drv.release(h) != CUDA_SUCCESS)
      ms__warning("cuda: cannot release the memory of a failed mem_map on device %d", device);
  }
  pthread_mutex_unlock(&c->lock);
  if (r != MS_OK) error_restore(&g);
  guard_leave(c, &g);
  return r;
}

/* Unmaps and releases chunk k (the caller removes it from the table on success). Caller holds
 * the lock. On failure the chunk is left as the allocator believes it is, mapped and usable:
 * a failed cuMemUnmap changed nothing, and after a failed cuMemRelease the still-valid handle is
 * mapped back (with its access) so that the page the allocator keeps on its books is really
 * there; only if that fails too is the chunk marked unmapped (a later attempt releases it). */
static int chunk_drop(cuda_ctx_t *c, size_t k) {
  cuda_chunk_t *ch = &c->chunks[k];
  CUresult cr;
  if (!ch->unmapped) {
    cr = c->drv.unmap(ch->addr, ch->size);
    if (cr != CUDA_SUCCESS) return cuda_fail_drv(c, ch->device, cr, "cuMemUnmap");
  }
  cr = c->drv.release(ch->handle);
  if (cr != CUDA_SUCCESS) {
    int r = cuda_fail_drv(c, ch->device, cr, "cuMemRelease");
    if (!ch->unmapped) {
      CUresult m = c->drv.map(ch->addr, ch->size, 0, ch->handle, 0);
      if (m == CUDA_SUCCESS) m = set_access(c, ch->device, ch->addr, ch->size);
      if (m != CUDA_SUCCESS) {
        ch->unmapped = true;
        ms__warning("cuda: page 0x%llx (%zu bytes) of device %d is unmapped but could not be "
                    "released nor mapped back: do not use it",
                    (unsigned long long)ch->addr, ch->size, ch->device);
      }
    }
    return r;
  }
  return MS_OK;
}

static int cuda_mem_unmap(void *ctx, int device, ms_devptr_t addr, size_t size) {
  CTX(c);
  MS_RETURN_IF(device < 0 || device >= c->ndevices, MS_ENODEVICE);
  size_t gran = c->gran[device];
  MS_RETURN_IF(size == 0 || size % gran != 0 || addr % gran != 0, MS_EINVAL);
  cuda_guard_t g;
  MS_FORWARD_IF_ERROR(guard_enter(c, device, &g));
  int r = MS_OK;
  if (capture_under_way(&g)) {
    ms__error_msg("cuda: mem_unmap on device %d refused: a CUDA graph capture is under way",
                  device);
    r = MS_ESTATE;
  }
  if (r == MS_OK) {
    pthread_mutex_lock(&c->lock);
    size_t at = chunks_lower_bound(c, device, (CUdeviceptr)addr);
    /* The range must be made of whole chunks: check before touching anything. */
    size_t k = at;
    CUdeviceptr end = (CUdeviceptr)(addr + size), pos = (CUdeviceptr)addr;
    while (k < c->nchunks && c->chunks[k].device == device && c->chunks[k].addr == pos &&
           pos + c->chunks[k].size <= end)
      pos += c->chunks[k++].size;
    if (pos != end) {
      ms__error_msg("cuda: mem_unmap of a range that is not made of whole mapped ranges on "
                    "device %d",
                    device);
      r = MS_ESTATE;
    } else {
      /* Chunk by chunk; on a failure the chunks not unmapped stay in the table (mapped). */
      size_t done = 0;
      for (size_t i = at; i < k; i++, done++) {
        r = chunk_drop(c, i);
        if (r != MS_OK) break;
      }
      memmove(&c->chunks[at], &c->chunks[at + done], (c->nchunks - at - done) * sizeof *c->chunks);
      c->nchunks -= done;
    }
    pthread_mutex_unlock(&c->lock);
  }
  if (r != MS_OK) error_restore(&g);
  guard_leave(c, &g);
  return r;
}

/* ---- creation ------------------------------------------------------------------------------ */

/* Looks up one driver function by name; NULL when the driver does not have it. */
static void *cuda_driver_symbol(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
  cudaError_t pending = RT.cudaPeekAtLastError();
  cudaError_t e = RT.cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    if (e != cudaSuccess && pending == cudaSuccess) (void)RT.cudaGetLastError();
    return NULL;
  }
  return fn;
}

/* Fills c->drv; sets c->have_vmm when the driver has every VMM call and every device supports
 * virtual memory management. @return MS_OK or MS_EBACKEND without the context calls. */
static int cuda_drv_init(cuda_ctx_t *c) {
  cuda_drv_t *v = &c->drv;
  v->ctx_get_current = (PFN_cuCtxGetCurrent_v4000)cuda_driver_symbol("cuCtxGetCurrent");
  v->ctx_set_current = (PFN_cuCtxSetCurrent_v4000)cuda_driver_symbol("cuCtxSetCurrent");
  v->ctx_get_device = (PFN_cuCtxGetDevice_v2000)cuda_driver_symbol("cuCtxGetDevice");
  if (!v->ctx_get_current || !v->ctx_set_current || !v->ctx_get_device) return MS_EBACKEND;
  v->reserve = (PFN_cuMemAddressReserve_v10020)cuda_driver_symbol("cuMemAddressReserve");
  v->address_free = (PFN_cuMemAddressFree_v10020)cuda_driver_symbol("cuMemAddressFree");
  v->create = (PFN_cuMemCreate_v10020)cuda_driver_symbol("cuMemCreate");
  v->release = (PFN_cuMemRelease_v10020)cuda_driver_symbol("cuMemRelease");
  v->map = (PFN_cuMemMap_v10020)cuda_driver_symbol("cuMemMap");
  v->unmap = (PFN_cuMemUnmap_v10020)cuda_driver_symbol("cuMemUnmap");
  v->set_access = (PFN_cuMemSetAccess_v10020)cuda_driver_symbol("cuMemSetAccess");
  v->granularity =
      (PFN_cuMemGetAllocationGranularity_v10020)cuda_driver_symbol("cuMemGetAllocationGranularity");
  v->device_attribute = (PFN_cuDeviceGetAttribute_v2000)cuda_driver_symbol("cuDeviceGetAttribute");
  v->error_name = (PFN_cuGetErrorName_v6000)cuda_driver_symbol("cuGetErrorName");
  v->error_string = (PFN_cuGetErrorString_v6000)cuda_driver_symbol("cuGetErrorString");
  c->have_vmm = v->reserve && v->address_free && v->create && v->release && v->map && v->unmap &&
                v->set_access && v->granularity && v->device_attribute;
  for (int d = 0; c->have_vmm && d < c->ndevices; d++) {
    int supported = 0;
    size_t gran = 0;
    CUmemAllocationProp prop = cuda_page_prop(d);
    if (v->device_attribute(&supported, CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED,
                            (CUdevice)d) != CUDA_SUCCESS ||
        !supported ||
        v->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS || gran == 0)
      c->have_vmm = false;
    else
      c->gran[d] = gran;
  }
  return MS_OK;
}

/* peers[d] = the devices p != d with cudaDeviceCanAccessPeer(p, d). */
static int cuda_peers_init(cuda_ctx_t *c) {
  for (int d = 0; d < c->ndevices; d++) {
    c->peers[d] = malloc((size_t)(c->ndevices + 1) * sizeof **c->peers);
    MS_RETURN_IF(!c->peers[d], MS_ENOMEM);
    int n = 0;
    for (int p = 0; p < c->ndevices; p++) {
      int can = 0;
      if (p == d) continue;
      cudaError_t pending = RT.cudaPeekAtLastError();
      if (RT.cudaDeviceCanAccessPeer(&can, p, d) != cudaSuccess) {
        if (pending == cudaSuccess) (void)RT.cudaGetLastError();
        can = 0;
      }
      if (can) c->peers[d][n++] = p;
    }
    c->peers[d][n] = -1;
  }
  return MS_OK;
}

static void cuda_destroy(void *ctx) {
  cuda_ctx_t *c = ctx;
  if (!c) return;
  /* Ranges still mapped belong to an allocator that was not destroyed first (a broken
   * pre-condition); release them rather than leak device memory. */
  if (c->nchunks) {
    ms__warning("cuda: backend destroyed with %zu mapped ranges; releasing them", c->nchunks);
    pthread_mutex_lock(&c->lock);
    for (size_t k = 0; k < c->nchunks; k++)
      (void)chunk_drop(c, k);
    c->nchunks = 0;
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_destroy(&c->lock);
  if (c->peers)
    for (int d = 0; d < c->ndevices; d++)
      free(c->peers[d]);
  free(c->peers);
  free(c->gran);
  free(c->chunks);
  free(c);
}

int ms_backend_cuda_create(ms_backend_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!out, MS_EINVAL);
  MS_FORWARD_IF_ERROR(ms__cudart_load(eb));
  int n = 0;
  cudaError_t pending = RT.cudaPeekAtLastError();
  cudaError_t e = RT.cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    /* cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver at all, or too old),
     * initialization failures...: all mean there is no GPU memsnap could use. */
    if (pending == cudaSuccess) (void)RT.cudaGetLastError();
    return ms__errbuf_set(eb, MS_ENODEVICE, "no CUDA device: %s (%s from cudaGetDeviceCount)",
                          RT.cudaGetErrorString(e), RT.cudaGetErrorName(e));
  }
  if (n <= 0)
    return ms__errbuf_set(eb, MS_ENODEVICE, "no CUDA device: cudaGetDeviceCount found none");
  cuda_ctx_t *c = calloc(1, sizeof *c);
  if (!c) return ms__errbuf_set(eb, MS_ENOMEM, "cannot create the cuda backend: out of memory");
  c->ndevices = n;
  c->gran = calloc((size_t)n, sizeof *c->gran);
  c->peers = calloc((size_t)n, sizeof *c->peers);
  if (!c->gran || !c->peers || pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c->gran);
    free(c->peers);
    free(c);
    return ms__errbuf_set(eb, MS_ENOMEM, "cannot create the cuda backend: out of memory");
  }
  for (int d = 0; d < n; d++)
    c->gran[d] = CUDA_DEFAULT_PAGE;
  if (cuda_drv_init(c) != MS_OK) {
    cuda_destroy(c);
    return ms__errbuf_set(eb, MS_EBACKEND,
                          "cannot create the cuda backend: the driver has no cuCtxGetCurrent/"
                          "cuCtxSetCurrent/cuCtxGetDevice entry points");
  }
  if (cuda_peers_init(c) != MS_OK) {
    cuda_destroy(c);
    return ms__errbuf_set(eb, MS_ENOMEM, "cannot create the cuda backend: out of memory");
  }
  ms_backend_ops_t ops = {
      .name = "cuda",
      .ctx = c,
      .device_count = cuda_device_count,
      .malloc = cuda_malloc,
      .free = cuda_free,
      .mem_info = cuda_mem_info,
      .stream_create = cuda_stream_create,
      .stream_destroy = cuda_stream_destroy,
      .event_create = cuda_event_create,
      .event_record = cuda_event_record,
      .event_query = cuda_event_query,
      .event_synchronize = cuda_event_synchronize,
      .event_destroy = cuda_event_destroy,
      .device_synchronize = cuda_device_synchronize,
      .va_reserve = c->have_vmm ? cuda_va_reserve : NULL,
      .va_release = c->have_vmm ? cuda_va_release : NULL,
      .mem_map = c->have_vmm ? cuda_mem_map : NULL,
      .mem_unmap = c->have_vmm ? cuda_mem_unmap : NULL,
      .stream_capture_info = cuda_stream_capture_info,
      .stream_key = cuda_stream_key,
      .mem_granularity = c->have_vmm ? cuda_mem_granularity : NULL,
      .destroy = cuda_destroy,
  };
  int r = ms_backend_create(&ops, out);
  if (r != MS_OK) {
    cuda_destroy(c);
    return ms__errbuf_set(eb, r, "cannot create the cuda backend: %s", ms_strerror(r));
  }
  return MS_OK;
}
