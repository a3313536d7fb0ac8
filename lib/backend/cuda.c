/* SPDX-License-Identifier: MIT
 * memsnap core: the "cuda" backend, the ops table of include/memsnap/backend.h on real NVIDIA GPUs
 * through the CUDA runtime (issue #6). This is the only file of memsnap that includes CUDA headers;
 * it is compiled only when CMake found a CUDA Toolkit (MS_HAVE_CUDA).
 *
 * What each operation calls (reference/pytorch-allocator.md §7, §8, §12, §13, §18):
 *  - malloc: cudaMalloc, in relaxed stream-capture mode (cudaThreadExchangeStreamCaptureMode) so
 *    that a segment can be allocated while a stream of this thread is being captured into a graph,
 *    as PyTorch does. cudaErrorMemoryAllocation clears the error state (cudaGetLastError) and
 *    returns MS_EOOM, which sends the allocator down its free-cache-and-retry path.
 *  - free: cudaDeviceSynchronize, then cudaFree. PyTorch synchronizes before it releases
 *    segments; doing it explicitly makes an earlier asynchronous kernel fault surface here with its
 *    own name rather than as a puzzling cudaFree failure.
 *  - mem_info: cudaMemGetInfo. device_synchronize: cudaDeviceSynchronize.
 *  - streams: cudaStreamCreateWithFlags(cudaStreamNonBlocking), like PyTorch's stream pool.
 *  - events: cudaEventCreateWithFlags(cudaEventDisableTiming); record, query (cudaErrorNotReady is
 *    "not done" and its error state is cleared), synchronize, destroy.
 *  - stream_capture_info: cudaStreamIsCapturing and cudaStreamGetCaptureInfo.
 *  - va_reserve/va_release/mem_map/mem_unmap (expandable segments): the driver's virtual-memory
 *    calls cuMemAddressReserve, cuMemCreate, cuMemMap, cuMemSetAccess, cuMemUnmap, cuMemRelease,
 *    cuMemAddressFree, one physical allocation per 2 MiB page so that any page-aligned sub-range
 *    can be unmapped later (§12). The driver functions are looked up at run time through
 *    cudaGetDriverEntryPointByVersion rather than linked: linking libcuda.so.1 (link-only in the
 *    toolkit) would make every program that links memsnap_core fail to start on a machine
 *    without the NVIDIA driver, where memsnap must still run on the "sim" backend. When the driver
 *    or a device lacks them, the four members are NULL (the allocator then has no expandable
 *    segments on this backend).
 *
 * Devices: every operation names its device. It saves the calling thread's current device with
 * cudaGetDevice, switches with cudaSetDevice only when needed, and restores it before returning,
 * so a program's own notion of the current device is never disturbed (the allocator may serve
 * several devices from one thread).
 *
 * Errors: besides the out-of-memory case, every CUDA failure becomes MS_EBACKEND (MS_EINVAL for
 * cudaErrorInvalidValue and friends caused by a bad argument, MS_ENODEVICE for a device index out
 * of range) and is reported once through the library's output hook as
 *   memsnap: error: cuda: cudaMalloc(1048576 bytes) on device 0: cudaErrorIllegalAddress: an
 *   illegal memory access was encountered
 * i.e. the call, the device, cudaGetErrorName and cudaGetErrorString. The ops table has no error
 * buffer of its own, so this message is how the name and the text reach the user.
 *
 * Opening: ms_backend_cuda_create fails with MS_ENODEVICE and "no CUDA device: ..." (cudaGetDeviceCount's
 * error text and name) when there is no GPU or no driver; it never crashes.
 *
 * Thread-safety: every operation may be called from any thread (the CUDA runtime is thread-safe;
 * the page table of mapped memory has its own mutex).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include "backend/backend_internal.h"
#include "common/internal.h"

/* Unit of physical memory for mem_map (backend.h: "multiples of the backend's page size"). */
#define CUDA_PAGE_SIZE ((size_t)2 << 20)

/* One physical page mapped by mem_map: its address and the driver handle to release. */
typedef struct cuda_page_s {
  CUdeviceptr addr;
  CUmemGenericAllocationHandle handle;
  int device;
} cuda_page_t;

typedef struct cuda_vmm_s {
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
} cuda_vmm_t;

typedef struct cuda_ctx_s {
  int ndevices;
  bool have_vmm;          /* every device supports the virtual-memory calls */
  cuda_vmm_t vmm;
  pthread_mutex_t lock;   /* protects pages */
  cuda_page_t *pages;     /* mapped pages, sorted by (device, addr) */
  size_t npages, cap_pages;
} cuda_ctx_t;

/* ---- errors -------------------------------------------------------------------------------- */

/* Maps a failed CUDA call to a memsnap error and reports it (name and text) through the output
 * hook. cudaErrorMemoryAllocation never comes here: callers handle it as MS_EOOM. The error state
 * of the calling thread is cleared for non-sticky errors, so that it does not poison the next
 * call (sticky errors such as cudaErrorIllegalAddress stay until the context is destroyed, and
 * every later call reports them again). */
static int cuda_fail(cudaError_t e, int device, const char *call, const char *detail) {
  (void)cudaGetLastError();
  ms__error_msg("cuda: %s%s on device %d: %s: %s", call, detail ? detail : "", device,
                cudaGetErrorName(e), cudaGetErrorString(e));
  switch (e) {
  case cudaErrorInvalidValue:
  case cudaErrorInvalidResourceHandle:
  case cudaErrorInvalidDevicePointer:
    return MS_EINVAL;
  case cudaErrorInvalidDevice:
  case cudaErrorNoDevice:
  case cudaErrorInsufficientDriver:
    return MS_ENODEVICE;
  default:
    return MS_EBACKEND;
  }
}

static int cuda_fail_drv(const cuda_ctx_t *c, CUresult r, int device, const char *call) {
  const char *name = NULL, *text = NULL;
  if (!c->vmm.error_name || c->vmm.error_name(r, &name) != CUDA_SUCCESS) name = "CUDA_ERROR_?";
  if (!c->vmm.error_string || c->vmm.error_string(r, &text) != CUDA_SUCCESS) text = "unknown";
  ms__error_msg("cuda: %s on device %d: %s: %s", call, device, name, text);
  return r == CUDA_ERROR_INVALID_VALUE ? MS_EINVAL : MS_EBACKEND;
}

/* ---- the current device, saved and restored ----------------------------------------------- */

/* Makes device current for this thread; *prev = the device to restore with device_leave.
 * @return MS_OK, MS_ENODEVICE for an index out of range, or the CUDA error. */
static int device_enter(const cuda_ctx_t *c, int device, int *prev) {
  MS_RETURN_IF(device < 0 || device >= c->ndevices, MS_ENODEVICE);
  int cur = 0;
  cudaError_t e = cudaGetDevice(&cur);
  if (e != cudaSuccess) return cuda_fail(e, device, "cudaGetDevice", NULL);
  if (cur != device) {
    e = cudaSetDevice(device);
    if (e != cudaSuccess) return cuda_fail(e, device, "cudaSetDevice", NULL);
  }
  *prev = cur;
  return MS_OK;
}

static void device_leave(int device, int prev) {
  if (prev != device) {
    cudaError_t e = cudaSetDevice(prev);
    if (e != cudaSuccess) (void)cuda_fail(e, prev, "cudaSetDevice (restoring)", NULL);
  }
}

static cudaStream_t stream_of(ms_stream_t s) { return (cudaStream_t)(uintptr_t)s; }
static cudaEvent_t event_of(ms_event_t e) { return (cudaEvent_t)(uintptr_t)e; }

/* ---- the ops ------------------------------------------------------------------------------- */

static int cuda_device_count(void *ctx, int *count) {
  *count = ((cuda_ctx_t *)ctx)->ndevices;
  return MS_OK;
}

static int cuda_malloc(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out) {
  (void)stream; /* cudaMalloc is not stream-ordered */
  cuda_ctx_t *c = ctx;
  MS_RETURN_IF(size == 0, MS_EINVAL);
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  /* Relaxed capture mode: allowed while this thread captures a graph (PyTorch §8.1); replays do
   * not allocate again, the memory stays in the capture's private pool. */
  enum cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  cudaError_t me = cudaThreadExchangeStreamCaptureMode(&mode);
  void *p = NULL;
  cudaError_t e = cudaMalloc(&p, size);
  if (me == cudaSuccess) (void)cudaThreadExchangeStreamCaptureMode(&mode);
  int r = MS_OK;
  if (e == cudaErrorMemoryAllocation) {
    (void)cudaGetLastError(); /* clear the error state, as PyTorch does (§8.1) */
    r = MS_EOOM;
  } else if (e != cudaSuccess) {
    char detail[48];
    snprintf(detail, sizeof detail, "(%zu bytes)", size);
    r = cuda_fail(e, device, "cudaMalloc", detail);
  } else {
    *out = (ms_devptr_t)p;
  }
  device_leave(device, prev);
  return r;
}

static int cuda_free(void *ctx, int device, ms_devptr_t ptr) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) {
    r = cuda_fail(e, device, "cudaDeviceSynchronize", " (before cudaFree)");
  } else {
    e = cudaFree((void *)ptr);
    if (e != cudaSuccess) r = cuda_fail(e, device, "cudaFree", NULL);
  }
  device_leave(device, prev);
  return r;
}

static int cuda_mem_info(void *ctx, int device, size_t *free_bytes, size_t *total_bytes) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  size_t f = 0, t = 0;
  int r = MS_OK;
  cudaError_t e = cudaMemGetInfo(&f, &t);
  if (e != cudaSuccess) {
    r = cuda_fail(e, device, "cudaMemGetInfo", NULL);
  } else {
    *free_bytes = f;
    *total_bytes = t;
  }
  device_leave(device, prev);
  return r;
}

static int cuda_stream_create(void *ctx, int device, ms_stream_t *out) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  cudaStream_t s = NULL;
  int r = MS_OK;
  cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
  if (e != cudaSuccess)
    r = cuda_fail(e, device, "cudaStreamCreateWithFlags", NULL);
  else
    *out = (ms_stream_t)(uintptr_t)s;
  device_leave(device, prev);
  return r;
}

static int cuda_stream_destroy(void *ctx, int device, ms_stream_t stream) {
  cuda_ctx_t *c = ctx;
  MS_RETURN_IF(stream == 0, MS_EINVAL);
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaStreamDestroy(stream_of(stream));
  if (e != cudaSuccess) r = cuda_fail(e, device, "cudaStreamDestroy", NULL);
  device_leave(device, prev);
  return r;
}

static int cuda_event_create(void *ctx, int device, ms_event_t *out) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  cudaEvent_t ev = NULL;
  int r = MS_OK;
  cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
  if (e != cudaSuccess)
    r = cuda_fail(e, device, "cudaEventCreateWithFlags", NULL);
  else
    *out = (ms_event_t)(uintptr_t)ev;
  device_leave(device, prev);
  return r;
}

static int cuda_event_record(void *ctx, int device, ms_event_t event, ms_stream_t stream) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaEventRecord(event_of(event), stream_of(stream));
  if (e != cudaSuccess) r = cuda_fail(e, device, "cudaEventRecord", NULL);
  device_leave(device, prev);
  return r;
}

static int cuda_event_query(void *ctx, int device, ms_event_t event, bool *done) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaEventQuery(event_of(event));
  if (e == cudaSuccess) {
    *done = true;
  } else if (e == cudaErrorNotReady) {
    (void)cudaGetLastError(); /* "not ready" is an answer, not an error (§7.3) */
    *done = false;
  } else {
    r = cuda_fail(e, device, "cudaEventQuery", NULL);
  }
  device_leave(device, prev);
  return r;
}

static int cuda_event_synchronize(void *ctx, int device, ms_event_t event) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaEventSynchronize(event_of(event));
  if (e != cudaSuccess) r = cuda_fail(e, device, "cudaEventSynchronize", NULL);
  device_leave(device, prev);
  return r;
}

static int cuda_event_destroy(void *ctx, int device, ms_event_t event) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaEventDestroy(event_of(event));
  if (e != cudaSuccess) r = cuda_fail(e, device, "cudaEventDestroy", NULL);
  device_leave(device, prev);
  return r;
}

static int cuda_device_synchronize(void *ctx, int device) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) r = cuda_fail(e, device, "cudaDeviceSynchronize", NULL);
  device_leave(device, prev);
  return r;
}

static int cuda_stream_capture_info(void *ctx, int device, ms_stream_t stream, bool *capturing,
                                    uint64_t *capture_id) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  enum cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  unsigned long long id = 0;
#if CUDART_VERSION >= 13000
  cudaError_t e = cudaStreamGetCaptureInfo(stream_of(stream), &st, &id, NULL, NULL, NULL, NULL);
#elif CUDART_VERSION >= 12000
  cudaError_t e = cudaStreamGetCaptureInfo(stream_of(stream), &st, &id, NULL, NULL, NULL);
#else
  cudaError_t e = cudaStreamGetCaptureInfo(stream_of(stream), &st, &id);
#endif
  if (e == cudaErrorStreamCaptureImplicit) {
    /* The legacy default stream was asked about while another stream captures in global mode:
     * it cannot itself be capturing, but a capture is under way, which is what the caller needs
     * to know to defer event queries. */
    (void)cudaGetLastError();
    *capturing = true;
    *capture_id = 0;
  } else if (e != cudaSuccess) {
    r = cuda_fail(e, device, "cudaStreamGetCaptureInfo", NULL);
  } else {
    *capturing = st != cudaStreamCaptureStatusNone;
    *capture_id = *capturing ? (uint64_t)id : 0;
  }
  device_leave(device, prev);
  return r;
}

/* ---- virtual memory for expandable segments (driver API, looked up at run time) ------------ */

/* Index of the first page >= (device, addr) in the sorted page table. */
static size_t pages_lower_bound(const cuda_ctx_t *c, int device, CUdeviceptr addr) {
  size_t lo = 0, hi = c->npages;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    const cuda_page_t *p = &c->pages[mid];
    if (p->device < device || (p->device == device && p->addr < addr))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int pages_reserve(cuda_ctx_t *c, size_t extra) {
  if (c->npages + extra <= c->cap_pages) return MS_OK;
  size_t cap = c->cap_pages ? c->cap_pages : 64;
  while (cap < c->npages + extra) cap *= 2;
  cuda_page_t *np = realloc(c->pages, cap * sizeof *np);
  MS_RETURN_IF(!np, MS_ENOMEM);
  c->pages = np;
  c->cap_pages = cap;
  return MS_OK;
}

static CUmemAllocationProp cuda_page_prop(int device) {
  CUmemAllocationProp prop;
  memset(&prop, 0, sizeof prop);
  prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
  prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
  prop.location.id = device;
  return prop;
}

static int cuda_va_reserve(void *ctx, int device, size_t size, ms_devptr_t *out) {
  cuda_ctx_t *c = ctx;
  MS_RETURN_IF(size == 0 || size % CUDA_PAGE_SIZE != 0, MS_EINVAL);
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  CUdeviceptr p = 0;
  int r = MS_OK;
  CUresult cr = c->vmm.reserve(&p, size, CUDA_PAGE_SIZE, 0, 0);
  if (cr == CUDA_ERROR_OUT_OF_MEMORY)
    r = MS_EOOM;
  else if (cr != CUDA_SUCCESS)
    r = cuda_fail_drv(c, cr, device, "cuMemAddressReserve");
  else
    *out = (ms_devptr_t)p;
  device_leave(device, prev);
  return r;
}

static int cuda_va_release(void *ctx, int device, ms_devptr_t addr, size_t size) {
  cuda_ctx_t *c = ctx;
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  int r = MS_OK;
  /* pre: no page of the range is mapped any more. */
  pthread_mutex_lock(&c->lock);
  size_t i = pages_lower_bound(c, device, (CUdeviceptr)addr);
  bool mapped = i < c->npages && c->pages[i].device == device &&
                c->pages[i].addr < (CUdeviceptr)(addr + size);
  pthread_mutex_unlock(&c->lock);
  if (mapped) {
    ms__error_msg("cuda: va_release of a range that still has mapped pages on device %d", device);
    r = MS_ESTATE;
  } else {
    CUresult cr = c->vmm.address_free((CUdeviceptr)addr, size);
    if (cr != CUDA_SUCCESS) r = cuda_fail_drv(c, cr, device, "cuMemAddressFree");
  }
  device_leave(device, prev);
  return r;
}

/* Unmaps and releases the pages [first, first+n) of the table (all of device, contiguous in the
 * table), and removes them from it. Caller holds the lock. */
static int pages_drop(cuda_ctx_t *c, int device, size_t first, size_t n) {
  int r = MS_OK;
  for (size_t k = first; k < first + n; k++) {
    CUresult cr = c->vmm.unmap(c->pages[k].addr, CUDA_PAGE_SIZE);
    if (cr != CUDA_SUCCESS && r == MS_OK) r = cuda_fail_drv(c, cr, device, "cuMemUnmap");
    cr = c->vmm.release(c->pages[k].handle);
    if (cr != CUDA_SUCCESS && r == MS_OK) r = cuda_fail_drv(c, cr, device, "cuMemRelease");
  }
  memmove(&c->pages[first], &c->pages[first + n], (c->npages - first - n) * sizeof *c->pages);
  c->npages -= n;
  return r;
}

static int cuda_mem_map(void *ctx, int device, ms_devptr_t addr, size_t size) {
  cuda_ctx_t *c = ctx;
  MS_RETURN_IF(size == 0 || size % CUDA_PAGE_SIZE != 0 || addr % CUDA_PAGE_SIZE != 0, MS_EINVAL);
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  size_t n = size / CUDA_PAGE_SIZE;
  CUmemAllocationProp prop = cuda_page_prop(device);
  int r = MS_OK;
  pthread_mutex_lock(&c->lock);
  size_t at = pages_lower_bound(c, device, (CUdeviceptr)addr);
  if (at < c->npages && c->pages[at].device == device &&
      c->pages[at].addr < (CUdeviceptr)(addr + size)) {
    ms__error_msg("cuda: mem_map of a range that is already mapped on device %d", device);
    r = MS_ESTATE;
  } else {
    r = pages_reserve(c, n);
  }
  size_t done = 0;
  if (r == MS_OK) {
    /* Insert the new pages at `at`, in address order, one physical allocation each. */
    memmove(&c->pages[at + n], &c->pages[at], (c->npages - at) * sizeof *c->pages);
    for (; done < n; done++) {
      CUdeviceptr pa = (CUdeviceptr)addr + done * CUDA_PAGE_SIZE;
      CUmemGenericAllocationHandle h = 0;
      CUresult cr = c->vmm.create(&h, CUDA_PAGE_SIZE, &prop, 0);
      if (cr == CUDA_ERROR_OUT_OF_MEMORY) {
        r = MS_EOOM;
        break;
      }
      if (cr != CUDA_SUCCESS) {
        r = cuda_fail_drv(c, cr, device, "cuMemCreate");
        break;
      }
      cr = c->vmm.map(pa, CUDA_PAGE_SIZE, 0, h, 0);
      if (cr != CUDA_SUCCESS) {
        (void)c->vmm.release(h);
        r = cr == CUDA_ERROR_OUT_OF_MEMORY ? MS_EOOM : cuda_fail_drv(c, cr, device, "cuMemMap");
        break;
      }
      c->pages[at + done] = (cuda_page_t){.addr = pa, .handle = h, .device = device};
    }
    c->npages += n;
    if (r == MS_OK) {
      CUmemAccessDesc acc;
      memset(&acc, 0, sizeof acc);
      acc.location = prop.location;
      acc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
      CUresult cr = c->vmm.set_access((CUdeviceptr)addr, size, &acc, 1);
      if (cr != CUDA_SUCCESS) r = cr == CUDA_ERROR_OUT_OF_MEMORY
                                      ? MS_EOOM
                                      : cuda_fail_drv(c, cr, device, "cuMemSetAccess");
      if (r != MS_OK) done = n;
    }
    if (r != MS_OK) {
      /* All or nothing (PyTorch releases the pages created in a failed map, §12): drop the pages
       * mapped by this call, then close the gap left by the ones never created. */
      memmove(&c->pages[at + done], &c->pages[at + n], (c->npages - at - n) * sizeof *c->pages);
      c->npages -= n - done;
      (void)pages_drop(c, device, at, done);
      if (r == MS_EOOM) (void)cudaGetLastError();
    }
  }
  pthread_mutex_unlock(&c->lock);
  device_leave(device, prev);
  return r;
}

static int cuda_mem_unmap(void *ctx, int device, ms_devptr_t addr, size_t size) {
  cuda_ctx_t *c = ctx;
  MS_RETURN_IF(size == 0 || size % CUDA_PAGE_SIZE != 0 || addr % CUDA_PAGE_SIZE != 0, MS_EINVAL);
  int prev;
  MS_FORWARD_IF_ERROR(device_enter(c, device, &prev));
  size_t n = size / CUDA_PAGE_SIZE;
  int r = MS_OK;
  /* Like PyTorch's unmap (§12): wait for the work that may still use the memory. */
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess) r = cuda_fail(e, device, "cudaDeviceSynchronize", " (before cuMemUnmap)");
  if (r == MS_OK) {
    pthread_mutex_lock(&c->lock);
    size_t at = pages_lower_bound(c, device, (CUdeviceptr)addr);
    /* Every page of the range must be mapped: check before touching anything. */
    bool whole = at + n <= c->npages;
    for (size_t k = 0; whole && k < n; k++)
      whole = c->pages[at + k].device == device &&
              c->pages[at + k].addr == (CUdeviceptr)addr + k * CUDA_PAGE_SIZE;
    if (!whole) {
      ms__error_msg("cuda: mem_unmap of a range that is not entirely mapped on device %d", device);
      r = MS_ESTATE;
    } else {
      r = pages_drop(c, device, at, n);
    }
    pthread_mutex_unlock(&c->lock);
  }
  device_leave(device, prev);
  return r;
}

/* Looks up one driver function by name; NULL when the driver does not have it. */
static void *cuda_driver_symbol(const char *name) {
  void *fn = NULL;
  enum cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
#if CUDART_VERSION >= 12050
  cudaError_t e = cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &q);
#else
  cudaError_t e = cudaGetDriverEntryPoint(name, &fn, cudaEnableDefault, &q);
#endif
  if (e != cudaSuccess || q != cudaDriverEntryPointSuccess) {
    (void)cudaGetLastError();
    return NULL;
  }
  return fn;
}

/* Fills c->vmm and sets c->have_vmm when the driver has every call, every device supports
 * virtual memory management and 2 MiB is a multiple of each device's allocation granularity. */
static void cuda_vmm_init(cuda_ctx_t *c) {
  cuda_vmm_t *v = &c->vmm;
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
        v->granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) != CUDA_SUCCESS ||
        gran == 0 || CUDA_PAGE_SIZE % gran != 0)
      c->have_vmm = false;
  }
}

/* ---- creation ------------------------------------------------------------------------------ */

static void cuda_destroy(void *ctx) {
  cuda_ctx_t *c = ctx;
  if (!c) return;
  /* Pages still mapped belong to an allocator that was not destroyed first (a broken
   * pre-condition); release them rather than leak device memory. */
  if (c->npages) {
    ms__warning("cuda: backend destroyed with %zu mapped pages; releasing them", c->npages);
    pthread_mutex_lock(&c->lock);
    while (c->npages) (void)pages_drop(c, c->pages[0].device, 0, 1);
    pthread_mutex_unlock(&c->lock);
  }
  pthread_mutex_destroy(&c->lock);
  free(c->pages);
  free(c);
}

int ms_backend_cuda_create(ms_backend_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!out, MS_EINVAL);
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    /* cudaErrorNoDevice, cudaErrorInsufficientDriver (no driver at all), cudaErrorInitialization
     * failures...: all mean there is no GPU memsnap could use. */
    (void)cudaGetLastError();
    return ms__errbuf_set(eb, MS_ENODEVICE, "no CUDA device: %s (%s from cudaGetDeviceCount)",
                          cudaGetErrorString(e), cudaGetErrorName(e));
  }
  if (n <= 0)
    return ms__errbuf_set(eb, MS_ENODEVICE, "no CUDA device: cudaGetDeviceCount found none");
  cuda_ctx_t *c = calloc(1, sizeof *c);
  if (!c) return ms__errbuf_set(eb, MS_ENOMEM, "cannot create the cuda backend: out of memory");
  c->ndevices = n;
  if (pthread_mutex_init(&c->lock, NULL) != 0) {
    free(c);
    return ms__errbuf_set(eb, MS_ENOMEM, "cannot create the cuda backend: pthread_mutex_init");
  }
  cuda_vmm_init(c);
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
      .destroy = cuda_destroy,
  };
  int r = ms_backend_create(&ops, out);
  if (r != MS_OK) {
    cuda_destroy(c);
    return ms__errbuf_set(eb, r, "cannot create the cuda backend: %s", ms_strerror(r));
  }
  return MS_OK;
}
