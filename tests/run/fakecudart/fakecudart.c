/* SPDX-License-Identifier: MIT
 * fakecudart: a minimal fake of the CUDA runtime's device-memory calls, for testing and
 * benchmarking `memsnap run` (lib/interpose/) without a GPU (issue #18).
 *
 * It exports cudart's own names with cudart's ABI (cudaError_t is an int-sized enum, handles are
 * pointers), so a program linked against libmemsnap_fakecudart.so (or its static archive) behaves
 * as one linked against libcudart on a machine with FAKECUDART_DEVICES GPUs of
 * FAKECUDART_CAPACITY bytes each. Device memory is bookkeeping only: addresses are never
 * dereferenced.
 *
 * Configuration, read once from the environment at the first call:
 *   FAKECUDART_DEVICES   number of devices (default 2)
 *   FAKECUDART_CAPACITY  bytes per device (default 1 GiB): cudaMalloc, cudaMallocAsync,
 *                        cudaMallocFromPoolAsync, cudaMallocManaged, cudaMallocPitch (pitch =
 *                        width rounded up to 512) and cudaMalloc3D fail with
 *                        cudaErrorMemoryAllocation (2) past it
 *   FAKECUDART_FAIL      "fn:nth:error[,fn:nth:error...]": the nth call (1 = the first) of the
 *                        function named fn returns error without doing anything (one-shot each)
 * Addresses are deterministic: each device hands out increasing 512-byte aligned addresses from
 * 0x7f0000000000 + device * 2^40, never reused. Streams, events and pools are small counters cast
 * to pointers. Events complete at once. The per-thread "last error" is kept as cudart keeps it.
 *
 * Besides cudart's names it exports fakecudart_used_bytes(device) and fakecudart_live(device),
 * so a test program can print what the runtime itself holds.
 *
 * Thread-safety: every function may be called from any thread (one mutex inside).
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FK_API __attribute__((visibility("default")))

typedef int cudaError_t;
typedef struct fk_stream_s *cudaStream_t;
typedef struct fk_event_s *cudaEvent_t;
typedef struct fk_pool_s *cudaMemPool_t;

enum {
  cudaSuccess = 0,
  cudaErrorInvalidValue = 1,
  cudaErrorMemoryAllocation = 2,
  cudaErrorInvalidDevice = 101,
  cudaErrorNoDevice = 100,
};

#define FK_MAXDEV 8
#define FK_MAX_RULES 16

typedef struct {
  uint64_t addr, size;
  int dev;
} fk_alloc_t;

static struct {
  pthread_mutex_t mu;
  pthread_once_t once;
  int ndev;
  size_t capacity;
  size_t used[FK_MAXDEV];
  size_t live[FK_MAXDEV];
  uint64_t next_addr[FK_MAXDEV];
  fk_alloc_t *allocs;
  size_t nallocs, cap;
  uintptr_t next_handle;
  struct {
    char fn[48];
    unsigned countdown;
    int error;
  } rules[FK_MAX_RULES];
  int nrules;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .once = PTHREAD_ONCE_INIT};

static __thread int t_device;
static __thread cudaError_t t_last_error;

static void fk_init(void) {
  const char *s = getenv("FAKECUDART_DEVICES");
  G.ndev = s ? atoi(s) : 2;
  if (G.ndev < 0) G.ndev = 0;
  if (G.ndev > FK_MAXDEV) G.ndev = FK_MAXDEV;
  s = getenv("FAKECUDART_CAPACITY");
  G.capacity = s ? (size_t)strtoull(s, NULL, 0) : ((size_t)1 << 30);
  for (int d = 0; d < FK_MAXDEV; d++)
    G.next_addr[d] = 0x7f0000000000ULL + ((uint64_t)d << 40);
  G.next_handle = 0x1000;
  s = getenv("FAKECUDART_FAIL");
  if (s) {
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", s);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok && G.nrules < FK_MAX_RULES;
         tok = strtok_r(NULL, ",", &save)) {
      char fn[48];
      unsigned nth;
      int err;
      if (sscanf(tok, "%47[^:]:%u:%d", fn, &nth, &err) == 3 && nth > 0) {
        snprintf(G.rules[G.nrules].fn, sizeof G.rules[0].fn, "%s", fn);
        G.rules[G.nrules].countdown = nth;
        G.rules[G.nrules].error = err;
        G.nrules++;
      }
    }
  }
}

/* Locks the state and applies the fault rules of fn. @return an injected error, or 0. */
static cudaError_t fk_enter(const char *fn) {
  pthread_once(&G.once, fk_init);
  pthread_mutex_lock(&G.mu);
  for (int i = 0; i < G.nrules; i++)
    if (G.rules[i].countdown && strcmp(G.rules[i].fn, fn) == 0 && --G.rules[i].countdown == 0)
      return G.rules[i].error;
  return cudaSuccess;
}

static cudaError_t fk_leave(cudaError_t e) {
  pthread_mutex_unlock(&G.mu);
  if (e != cudaSuccess) t_last_error = e;
  return e;
}

static cudaError_t fk_alloc(const char *fn, void **p, size_t size) {
  cudaError_t e = fk_enter(fn);
  if (e) return fk_leave(e);
  if (!p) return fk_leave(cudaErrorInvalidValue);
  int d = t_device;
  if (d >= G.ndev) return fk_leave(G.ndev ? cudaErrorInvalidDevice : cudaErrorNoDevice);
  if (size == 0) {
    *p = NULL;
    return fk_leave(cudaSuccess);
  }
  if (size > G.capacity - G.used[d]) return fk_leave(cudaErrorMemoryAllocation);
  if (G.nallocs == G.cap) {
    size_t ncap = G.cap ? G.cap * 2 : 256;
    fk_alloc_t *n = realloc(G.allocs, ncap * sizeof *n);
    if (!n) return fk_leave(cudaErrorMemoryAllocation);
    G.allocs = n;
    G.cap = ncap;
  }
  uint64_t a = G.next_addr[d];
  G.next_addr[d] += (size + 511) & ~(uint64_t)511;
  G.allocs[G.nallocs++] = (fk_alloc_t){a, size, d};
  G.used[d] += size;
  G.live[d]++;
  *p = (void *)(uintptr_t)a;
  return fk_leave(cudaSuccess);
}

static cudaError_t fk_free(const char *fn, void *p) {
  cudaError_t e = fk_enter(fn);
  if (e) return fk_leave(e);
  if (!p) return fk_leave(cudaSuccess);
  for (size_t i = G.nallocs; i-- > 0;) {
    if (G.allocs[i].addr != (uint64_t)(uintptr_t)p) continue;
    G.used[G.allocs[i].dev] -= G.allocs[i].size;
    G.live[G.allocs[i].dev]--;
    G.allocs[i] = G.allocs[--G.nallocs];
    return fk_leave(cudaSuccess);
  }
  return fk_leave(cudaErrorInvalidValue);
}

static void *fk_handle(void) {
  return (void *)(G.next_handle++ * 16);
}

FK_API cudaError_t cudaMalloc(void **p, size_t size) {
  return fk_alloc("cudaMalloc", p, size);
}
FK_API cudaError_t cudaFree(void *p) {
  return fk_free("cudaFree", p);
}
FK_API cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t s) {
  (void)s;
  return fk_alloc("cudaMallocAsync", p, size);
}
FK_API cudaError_t cudaFreeAsync(void *p, cudaStream_t s) {
  (void)s;
  return fk_free("cudaFreeAsync", p);
}
FK_API cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                           cudaStream_t s) {
  (void)s;
  if (!pool) return fk_leave(fk_enter("cudaMallocFromPoolAsync") ?: cudaErrorInvalidValue);
  return fk_alloc("cudaMallocFromPoolAsync", p, size);
}
FK_API cudaError_t cudaMallocManaged(void **p, size_t size, unsigned flags) {
  (void)flags;
  return fk_alloc("cudaMallocManaged", p, size);
}

FK_API cudaError_t cudaMallocPitch(void **p, size_t *pitch, size_t width, size_t height) {
  size_t pt = (width + 511) & ~(size_t)511;
  if (!pitch) return fk_leave(fk_enter("cudaMallocPitch") ?: cudaErrorInvalidValue);
  cudaError_t e = fk_alloc("cudaMallocPitch", p, pt * height);
  if (e == cudaSuccess) *pitch = pt;
  return e;
}
typedef struct {
  size_t width, height, depth;
} fk_extent_t;
typedef struct {
  void *ptr;
  size_t pitch, xsize, ysize;
} fk_pitched_t;
FK_API cudaError_t cudaMalloc3D(fk_pitched_t *pp, fk_extent_t ext) {
  size_t pt = (ext.width + 511) & ~(size_t)511;
  if (!pp) return fk_leave(fk_enter("cudaMalloc3D") ?: cudaErrorInvalidValue);
  void *p = NULL;
  cudaError_t e = fk_alloc("cudaMalloc3D", &p, pt * ext.height * ext.depth);
  if (e == cudaSuccess) *pp = (fk_pitched_t){p, pt, ext.width, ext.height};
  return e;
}
FK_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const void *props) {
  cudaError_t e = fk_enter("cudaMemPoolCreate");
  if (!e && (!pool || !props)) e = cudaErrorInvalidValue;
  if (!e) *pool = (cudaMemPool_t)fk_handle();
  return fk_leave(e);
}
FK_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  cudaError_t e = fk_enter("cudaMemPoolDestroy");
  if (!e && !pool) e = cudaErrorInvalidValue;
  return fk_leave(e);
}
FK_API cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  cudaError_t e = fk_enter("cudaDeviceSetMemPool");
  if (!e && (device < 0 || device >= G.ndev)) e = cudaErrorInvalidDevice;
  (void)pool;
  return fk_leave(e);
}
FK_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  (void)keep;
  cudaError_t e = fk_enter("cudaMemPoolTrimTo");
  if (!e && !pool) e = cudaErrorInvalidValue;
  return fk_leave(e);
}

FK_API cudaError_t cudaGetDeviceCount(int *n) {
  cudaError_t e = fk_enter("cudaGetDeviceCount");
  if (!e && !n) e = cudaErrorInvalidValue;
  if (!e && G.ndev == 0) e = cudaErrorNoDevice;
  if (!e) *n = G.ndev;
  return fk_leave(e);
}
FK_API cudaError_t cudaGetDevice(int *d) {
  cudaError_t e = fk_enter("cudaGetDevice");
  if (!e && !d) e = cudaErrorInvalidValue;
  if (!e) *d = t_device;
  return fk_leave(e);
}
FK_API cudaError_t cudaSetDevice(int d) {
  cudaError_t e = fk_enter("cudaSetDevice");
  if (!e && (d < 0 || d >= G.ndev)) e = cudaErrorInvalidDevice;
  if (!e) t_device = d;
  return fk_leave(e);
}
FK_API cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  cudaError_t e = fk_enter("cudaMemGetInfo");
  if (!e && (!free_b || !total)) e = cudaErrorInvalidValue;
  if (!e && t_device >= G.ndev) e = cudaErrorNoDevice;
  if (!e) {
    *free_b = G.capacity - G.used[t_device];
    *total = G.capacity;
  }
  return fk_leave(e);
}
FK_API cudaError_t cudaDeviceSynchronize(void) {
  return fk_leave(fk_enter("cudaDeviceSynchronize"));
}
/* Frees every allocation of the thread's device, as the runtime's reset destroys its context. */
FK_API cudaError_t cudaDeviceReset(void) {
  cudaError_t e = fk_enter("cudaDeviceReset");
  if (e) return fk_leave(e);
  int d = t_device;
  for (size_t i = G.nallocs; i-- > 0;)
    if (G.allocs[i].dev == d) {
      G.used[d] -= G.allocs[i].size;
      G.live[d]--;
      G.allocs[i] = G.allocs[--G.nallocs];
    }
  return fk_leave(cudaSuccess);
}
FK_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  cudaError_t e = fk_enter("cudaStreamCreate");
  if (!e && !s) e = cudaErrorInvalidValue;
  if (!e) *s = (cudaStream_t)fk_handle();
  return fk_leave(e);
}
FK_API cudaError_t cudaStreamDestroy(cudaStream_t s) {
  (void)s;
  return fk_leave(fk_enter("cudaStreamDestroy"));
}
FK_API cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  (void)s;
  return fk_leave(fk_enter("cudaStreamSynchronize"));
}
FK_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *ev, unsigned flags) {
  (void)flags;
  cudaError_t e = fk_enter("cudaEventCreateWithFlags");
  if (!e && !ev) e = cudaErrorInvalidValue;
  if (!e) *ev = (cudaEvent_t)fk_handle();
  return fk_leave(e);
}
FK_API cudaError_t cudaEventCreate(cudaEvent_t *ev) {
  return cudaEventCreateWithFlags(ev, 0);
}
FK_API cudaError_t cudaEventRecord(cudaEvent_t ev, cudaStream_t s) {
  (void)ev, (void)s;
  return fk_leave(fk_enter("cudaEventRecord"));
}
FK_API cudaError_t cudaEventQuery(cudaEvent_t ev) {
  (void)ev;
  return fk_leave(fk_enter("cudaEventQuery"));
}
FK_API cudaError_t cudaEventSynchronize(cudaEvent_t ev) {
  (void)ev;
  return fk_leave(fk_enter("cudaEventSynchronize"));
}
FK_API cudaError_t cudaEventDestroy(cudaEvent_t ev) {
  (void)ev;
  return fk_leave(fk_enter("cudaEventDestroy"));
}
FK_API cudaError_t cudaGetLastError(void) {
  cudaError_t e = t_last_error;
  t_last_error = cudaSuccess;
  return e;
}
FK_API cudaError_t cudaPeekAtLastError(void) {
  return t_last_error;
}
FK_API const char *cudaGetErrorName(cudaError_t e) {
  switch (e) {
  case cudaSuccess:
    return "cudaSuccess";
  case cudaErrorInvalidValue:
    return "cudaErrorInvalidValue";
  case cudaErrorMemoryAllocation:
    return "cudaErrorMemoryAllocation";
  case cudaErrorNoDevice:
    return "cudaErrorNoDevice";
  case cudaErrorInvalidDevice:
    return "cudaErrorInvalidDevice";
  case 4:
    return "cudaErrorCudartUnloading"; /* the name `memsnap run` looks for in a stripped
                                          program to tell it contains the runtime */
  default:
    return "cudaErrorUnknown";
  }
}
FK_API const char *cudaGetErrorString(cudaError_t e) {
  switch (e) {
  case cudaSuccess:
    return "no error";
  case cudaErrorInvalidValue:
    return "invalid argument";
  case cudaErrorMemoryAllocation:
    return "out of memory";
  case cudaErrorNoDevice:
    return "no CUDA-capable device is detected";
  case cudaErrorInvalidDevice:
    return "invalid device ordinal";
  default:
    return "unknown error";
  }
}

FK_API size_t fakecudart_used_bytes(int device) {
  pthread_once(&G.once, fk_init);
  pthread_mutex_lock(&G.mu);
  size_t v = device >= 0 && device < FK_MAXDEV ? G.used[device] : 0;
  pthread_mutex_unlock(&G.mu);
  return v;
}
FK_API size_t fakecudart_live(int device) {
  pthread_once(&G.once, fk_init);
  pthread_mutex_lock(&G.mu);
  size_t v = device >= 0 && device < FK_MAXDEV ? G.live[device] : 0;
  pthread_mutex_unlock(&G.mu);
  return v;
}
