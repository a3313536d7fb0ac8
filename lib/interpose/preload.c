/* SPDX-License-Identifier: MIT
 * memsnap run: the interposer (libmemsnap_preload.so, issue #18, docs/run.md). `memsnap run`
 * puts it in LD_PRELOAD, so the program's calls of the CUDA runtime's device-memory functions
 * come here first:
 *   cudaMalloc, cudaFree, cudaMallocAsync, cudaFreeAsync, cudaMallocFromPoolAsync (and their
 *   per-thread-default-stream variants *_ptsz), cudaMallocManaged, cudaMemPoolCreate,
 *   cudaMemPoolDestroy, cudaDeviceSetMemPool.
 * Each is forwarded to the next definition in the lookup order (dlsym(RTLD_NEXT), i.e. the
 * program's libcudart; or a libcudart the program loaded privately, found among the loaded
 * modules), and its result returned unchanged, error codes included. The hooks are the static
 * hook_<name> functions; each exported name is an indirect function that resolves to its hook
 * only where a CUDA runtime defines the name too (the end of this file, visible.c).
 *
 * Modes (MEMSNAP_RUN_MODE):
 *  - observe (default): every call goes to CUDA unchanged; record.c records it.
 *  - cache: cudaMalloc/cudaFree and cudaMallocAsync/cudaFreeAsync are served by memsnap's caching
 *    allocator (one per device, created at the device's first allocation) on a backend whose
 *    operations are the real runtime functions (this file's cudart backend: no link to libcudart,
 *    so the interposer loads into programs without CUDA). cudaMallocManaged and allocations from
 *    explicit pools go to CUDA unchanged.
 *
 * Re-entrancy: a thread-local guard (ms__run_in_hook, initial-exec TLS: no allocation, no lock)
 * is set while the interposer works; any CUDA call made meanwhile (by the backend, by the runtime
 * calling itself, by snapshot writing) goes straight to the real function, unrecorded.
 * The interposer allocates no device memory of its own: its only runtime calls besides the
 * forwarded ones are cudaGetDevice, cudaStreamGetDevice, cudaMemGetInfo (capacity, and the free
 * bytes at an OOM) and, in cache mode, the backend's.
 *
 * Thread-safety: every exported function may be called from any thread; no lock is taken outside
 * the intercepted calls (a program that never calls them runs exactly as without memsnap: nothing
 * is started until the first one).
 */
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "interpose/run_internal.h"
#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/history.h"

#define MS_EXPORT __attribute__((visibility("default")))

/* ---- the CUDA runtime's ABI (no CUDA header is needed to build the interposer) ------------- */
typedef int cudaError_t; /* enum cudaError: int-sized */
typedef struct CUstream_st *cudaStream_t;
typedef struct CUevent_st *cudaEvent_t;
typedef struct CUmemPoolHandle_st *cudaMemPool_t;
/* struct cudaExtent and struct cudaPitchedPtr (driver_types.h), passed by value / pointer */
typedef struct ms_cuda_extent_s {
  size_t width, height, depth;
} ms_cuda_extent_t;
typedef struct ms_cuda_pitched_ptr_s {
  void *ptr;
  size_t pitch, xsize, ysize;
} ms_cuda_pitched_ptr_t;
enum {
  cudaSuccess = 0,
  cudaErrorMemoryAllocation = 2,
  cudaErrorNotReady = 600,
  cudaErrorSharedObjectSymbolNotFound = 302,
  cudaEventDisableTiming = 2,
};
#define CUDA_STREAM_PER_THREAD ((uint64_t)0x2)

/* The exported functions (cudart's signatures). */
MS_EXPORT cudaError_t cudaMalloc(void **devPtr, size_t size);
MS_EXPORT cudaError_t cudaFree(void *devPtr);
MS_EXPORT cudaError_t cudaMallocAsync(void **devPtr, size_t size, cudaStream_t s);
MS_EXPORT cudaError_t cudaFreeAsync(void *devPtr, cudaStream_t s);
MS_EXPORT cudaError_t cudaMallocFromPoolAsync(void **ptr, size_t size, cudaMemPool_t pool,
                                              cudaStream_t s);
MS_EXPORT cudaError_t cudaMallocAsync_ptsz(void **devPtr, size_t size, cudaStream_t s);
MS_EXPORT cudaError_t cudaFreeAsync_ptsz(void *devPtr, cudaStream_t s);
MS_EXPORT cudaError_t cudaMallocFromPoolAsync_ptsz(void **ptr, size_t size, cudaMemPool_t pool,
                                                   cudaStream_t s);
MS_EXPORT cudaError_t cudaMallocManaged(void **devPtr, size_t size, unsigned flags);
MS_EXPORT cudaError_t cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height);
MS_EXPORT cudaError_t cudaMalloc3D(ms_cuda_pitched_ptr_t *pitchedDevPtr, ms_cuda_extent_t extent);
MS_EXPORT cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const void *props);
MS_EXPORT cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool);
MS_EXPORT cudaError_t cudaDeviceSetMemPool(int device, cudaMemPool_t pool);
MS_EXPORT cudaError_t cudaDeviceReset(void);

__thread int ms__run_in_hook __attribute__((tls_model("initial-exec")));

/* ---- the real functions ---------------------------------------------------------------------- */

typedef cudaError_t malloc_fn(void **, size_t);
typedef cudaError_t free_fn(void *);
typedef cudaError_t malloc_async_fn(void **, size_t, cudaStream_t);
typedef cudaError_t free_async_fn(void *, cudaStream_t);
typedef cudaError_t malloc_pool_fn(void **, size_t, cudaMemPool_t, cudaStream_t);
typedef cudaError_t malloc_managed_fn(void **, size_t, unsigned);
typedef cudaError_t malloc_pitch_fn(void **, size_t *, size_t, size_t);
typedef cudaError_t malloc_3d_fn(ms_cuda_pitched_ptr_t *, ms_cuda_extent_t);
typedef cudaError_t pool_create_fn(cudaMemPool_t *, const void *);
typedef cudaError_t pool_destroy_fn(cudaMemPool_t);
typedef cudaError_t set_mempool_fn(int, cudaMemPool_t);
typedef cudaError_t get_device_fn(int *);
typedef cudaError_t set_device_fn(int);
typedef cudaError_t stream_get_device_fn(cudaStream_t, int *);
typedef cudaError_t mem_get_info_fn(size_t *, size_t *);
typedef cudaError_t get_last_error_fn(void);
typedef cudaError_t device_count_fn(int *);
typedef cudaError_t void_fn(void);
typedef cudaError_t stream_create_fn(cudaStream_t *);
typedef cudaError_t stream_destroy_fn(cudaStream_t);
typedef cudaError_t event_create_fn(cudaEvent_t *, unsigned);
typedef cudaError_t event_record_fn(cudaEvent_t, cudaStream_t);
typedef cudaError_t event_fn(cudaEvent_t);

typedef struct find_s {
  const char *name;
  void *sym;
} find_t;

static int find_in_cudart(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  find_t *f = arg;
  if (!info->dlpi_name || !strstr(info->dlpi_name, "libcudart.so")) return 0;
  void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
  if (!h) return 0;
  f->sym = dlsym(h, f->name);
  dlclose(h);
  return f->sym != NULL;
}

/* The next definition of name after ours; else one in a libcudart loaded privately
 * (dlopen RTLD_LOCAL, which RTLD_NEXT cannot see). */
static void *real_lookup(const char *name) {
  void *p = dlsym(RTLD_NEXT, name);
  if (!p) {
    find_t f = {name, NULL};
    dl_iterate_phdr(find_in_cudart, &f);
    p = f.sym;
  }
  return p;
}

/* Every real function the interposer calls: X(name, type, hooked), hooked = the interposer exports
 * it (the program calls it through us). */
#define REAL_FNS(X)                                                                                \
  X(cudaMalloc, malloc_fn, 1)                                                                      \
  X(cudaFree, free_fn, 1)                                                                          \
  X(cudaMallocAsync, malloc_async_fn, 1)                                                           \
  X(cudaFreeAsync, free_async_fn, 1)                                                               \
  X(cudaMallocAsync_ptsz, malloc_async_fn, 1)                                                      \
  X(cudaFreeAsync_ptsz, free_async_fn, 1)                                                          \
  X(cudaMallocFromPoolAsync, malloc_pool_fn, 1)                                                    \
  X(cudaMallocFromPoolAsync_ptsz, malloc_pool_fn, 1)                                               \
  X(cudaMallocManaged, malloc_managed_fn, 1)                                                       \
  X(cudaMallocPitch, malloc_pitch_fn, 1)                                                           \
  X(cudaMalloc3D, malloc_3d_fn, 1)                                                                 \
  X(cudaMemPoolCreate, pool_create_fn, 1)                                                          \
  X(cudaMemPoolDestroy, pool_destroy_fn, 1)                                                        \
  X(cudaDeviceSetMemPool, set_mempool_fn, 1)                                                       \
  X(cudaDeviceReset, void_fn, 1)                                                                   \
  X(cudaGetDevice, get_device_fn, 0)                                                               \
  X(cudaSetDevice, set_device_fn, 0)                                                               \
  X(cudaStreamGetDevice, stream_get_device_fn, 0)                                                  \
  X(cudaMemGetInfo, mem_get_info_fn, 0)                                                            \
  X(cudaGetLastError, get_last_error_fn, 0)                                                        \
  X(cudaGetDeviceCount, device_count_fn, 0)                                                        \
  X(cudaDeviceSynchronize, void_fn, 0)                                                             \
  X(cudaStreamCreate, stream_create_fn, 0)                                                         \
  X(cudaStreamDestroy, stream_destroy_fn, 0)                                                       \
  X(cudaEventCreateWithFlags, event_create_fn, 0)                                                  \
  X(cudaEventRecord, event_record_fn, 0)                                                           \
  X(cudaEventQuery, event_fn, 0)                                                                   \
  X(cudaEventSynchronize, event_fn, 0)                                                             \
  X(cudaEventDestroy, event_fn, 0)

enum {
#define REAL_ENUM(name, type, hooked) REAL_I_##name,
  REAL_FNS(REAL_ENUM)
#undef REAL_ENUM
      REAL_COUNT
};
static const char *const real_names[REAL_COUNT] = {
#define REAL_NAME(name, type, hooked) #name,
    REAL_FNS(REAL_NAME)
#undef REAL_NAME
};
static const bool real_hooked[REAL_COUNT] = {
#define REAL_HOOKED(name, type, hooked) hooked,
    REAL_FNS(REAL_HOOKED)
#undef REAL_HOOKED
};

/* The lookup cache. Each slot: NULL = not looked up (or forgotten), REAL_MISSING = looked up and
 * absent (cached too: a runtime without cudaStreamGetDevice is not asked again at every
 * cudaMallocAsync, issue #35 item 12), else the function.
 * A function found in an object loaded after the program started (a libcudart that the program,
 * or a plugin it loaded, brought in with dlopen) can go away with dlclose and come back at another
 * address (item 4): then each call first compares the loader's counts of objects loaded and
 * unloaded (dl_iterate_phdr's dlpi_adds and dlpi_subs) with those of the lookups, and the whole
 * cache is forgotten when they changed. Functions of objects loaded at start (the program's own
 * libcudart) never go away, and cost no check. A missing exported function (a program without
 * any runtime, which gets cudaErrorSharedObjectSymbolNotFound) is looked up again only when
 * objects were loaded since. */
#define REAL_MISSING ((void *)(uintptr_t)1)
static _Atomic(void *) real_cache[REAL_COUNT];
static atomic_bool real_unloadable;           /* a cached function lies in a dlopen()ed object */
static atomic_ullong real_adds, real_subs;    /* the loader's counts when the cache was started */
static atomic_bool real_counted;              /* real_adds/real_subs are set */
static size_t real_initial;                   /* objects loaded at start (the constructor) */
/* No lock: two threads that revalidate or start the cache at once store the same things (at
 * worst older counts, which only makes the next call look everything up again). A lock here
 * would also have to be ordered against the fork handlers' (record.c). */

typedef struct real_gen_s {
  unsigned long long adds, subs;
} real_gen_t;

static int real_gen_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  real_gen_t *g = arg;
  g->adds = info->dlpi_adds;
  g->subs = info->dlpi_subs;
  return 1; /* the first object is enough: the counts are the loader's */
}

static real_gen_t real_gen_now(void) {
  real_gen_t g = {0, 0};
  dl_iterate_phdr(real_gen_cb, &g);
  return g;
}

static int real_count_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)info, (void)size;
  (*(size_t *)arg)++;
  return 0;
}

/* Counts the objects loaded at start: they stay loaded for the life of the process. Nothing else
 * is done before the program's first CUDA call. */
__attribute__((constructor)) static void real_count_initial(void) {
  size_t n = 0;
  dl_iterate_phdr(real_count_cb, &n);
  real_initial = n;
}

typedef struct real_where_s {
  uintptr_t addr;
  size_t index, found; /* found = index + 1 of the object holding addr, 0 if none */
} real_where_t;

static int real_where_cb(struct dl_phdr_info *info, size_t size, void *arg) {
  (void)size;
  real_where_t *w = arg;
  for (int i = 0; i < info->dlpi_phnum; i++) {
    const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
    uintptr_t lo = info->dlpi_addr + ph->p_vaddr;
    if (ph->p_type == PT_LOAD && w->addr >= lo && w->addr - lo < ph->p_memsz) {
      w->found = w->index + 1;
      return 1;
    }
  }
  w->index++;
  return 0;
}

/* Whether the object defining p was loaded at start (objects loaded later follow them in the
 * loader's list, and those loaded at start are never unloaded). */
static bool real_loaded_at_start(void *p) {
  real_where_t w = {(uintptr_t)p, 0, 0};
  dl_iterate_phdr(real_where_cb, &w);
  return w.found && w.found <= real_initial;
}

/* Forgets every cached function when objects were loaded or unloaded since the lookups.
 * @return whether it did. */
static bool real_revalidate(void) {
  real_gen_t g = real_gen_now();
  if (atomic_load(&real_adds) == g.adds && atomic_load(&real_subs) == g.subs) return false;
  for (int i = 0; i < REAL_COUNT; i++)
    atomic_store(&real_cache[i], NULL);
  atomic_store(&real_unloadable, false);
  atomic_store(&real_adds, g.adds);
  atomic_store(&real_subs, g.subs);
  return true;
}

static MS_NOINLINE void *real_resolve(int i) {
  if (!atomic_load(&real_counted)) {
    real_gen_t g = real_gen_now(); /* before the lookup: an unload after it is seen */
    atomic_store(&real_adds, g.adds);
    atomic_store(&real_subs, g.subs);
    atomic_store(&real_counted, true);
  }
  void *p = real_lookup(real_names[i]);
  if (p && !real_loaded_at_start(p)) atomic_store(&real_unloadable, true);
  atomic_store_explicit(&real_cache[i], p ? p : REAL_MISSING, memory_order_release);
  return p;
}

/* @return the real function i, NULL when no loaded object defines it. */
static inline void *real_get(int i) {
  if (ms_unlikely(atomic_load_explicit(&real_unloadable, memory_order_relaxed))) real_revalidate();
  void *p = atomic_load_explicit(&real_cache[i], memory_order_acquire);
  if (ms_likely(p != NULL && p != REAL_MISSING)) return p;
  if (p == REAL_MISSING && (!real_hooked[i] || !real_revalidate())) return NULL;
  return real_resolve(i);
}

#define REAL_ACCESSOR(name, type, hooked)                                                          \
  static inline type *real_##name(void) { return (type *)real_get(REAL_I_##name); }
REAL_FNS(REAL_ACCESSOR)
#undef REAL_ACCESSOR

/* ---- helpers --------------------------------------------------------------------------------- */

static int current_device(void) {
  int d = 0;
  get_device_fn *f = real_cudaGetDevice();
  if (!f || f(&d) != cudaSuccess || d < 0 || d >= MS__RUN_MAX_DEVICES) d = 0;
  return d;
}

static int stream_device(cudaStream_t s) {
  stream_get_device_fn *f = s ? real_cudaStreamGetDevice() : NULL;
  int d;
  if (f && f(s, &d) == cudaSuccess && d >= 0 && d < MS__RUN_MAX_DEVICES) return d;
  return current_device();
}

static atomic_ullong cap_known; /* bit d: the capacity of device d was asked for */

static void note_capacity(int device) {
  uint64_t bit = 1ULL << device;
  if (ms_likely(atomic_load_explicit(&cap_known, memory_order_relaxed) & bit)) return;
  atomic_fetch_or(&cap_known, bit);
  mem_get_info_fn *f = real_cudaMemGetInfo();
  size_t fr = 0, tot = 0;
  if (f && f(&fr, &tot) == cudaSuccess && tot) ms__run_set_capacity(device, tot);
}

/* Private pools the program created: handle -> (0, n). */
static pthread_mutex_t pools_mu = PTHREAD_MUTEX_INITIALIZER;
static struct {
  cudaMemPool_t h;
  int64_t id;
} pools[256];
static int npools;
static int64_t next_pool_id = 1;
static cudaMemPool_t device_pool[MS__RUN_MAX_DEVICES]; /* cudaDeviceSetMemPool, NULL = default */

static int64_t pool_id_of(cudaMemPool_t h) {
  if (!h) return 0;
  int64_t id = 0;
  pthread_mutex_lock(&pools_mu);
  for (int i = 0; i < npools; i++)
    if (pools[i].h == h) id = pools[i].id;
  pthread_mutex_unlock(&pools_mu);
  return id;
}

static int64_t device_pool_id(int device) {
  pthread_mutex_lock(&pools_mu);
  cudaMemPool_t h = device_pool[device];
  pthread_mutex_unlock(&pools_mu);
  return h ? pool_id_of(h) : 0;
}

/* ---- observe --------------------------------------------------------------------------------- */

MS_ALWAYS_INLINE void observe_result(cudaError_t r, const char *call, void **p, size_t size,
                                     int device, uint64_t stream, int64_t pool, ms__run_kind kind,
                                     uint32_t stack) {
  if (r == cudaSuccess) {
    if (p && *p && size) {
      note_capacity(device);
      int64_t pid[2] = {0, pool};
      if (kind == MS__RUN_KIND_MANAGED) {
        pid[0] = MS__RUN_MANAGED_POOL_FIRST;
        pid[1] = MS__RUN_MANAGED_POOL_SECOND;
      }
      ms__run_on_alloc(device, (uint64_t)(uintptr_t)*p, size, stream, pid, stack, kind);
    }
  } else if (r == cudaErrorMemoryAllocation) {
    mem_get_info_fn *f = real_cudaMemGetInfo();
    size_t fr = 0, tot = 0;
    if (!f || f(&fr, &tot) != cudaSuccess) fr = tot = 0;
    ms__run_on_oom(call, device, size, stream, fr, tot, stack, false);
  }
}

/* ---- cache mode: the cudart backend and the allocators --------------------------------------- */

static __thread cudaError_t t_backend_err; /* the CUDA error behind the last MS_EBACKEND */

static int cb_err(cudaError_t e) {
  if (e == cudaSuccess) return MS_OK;
  t_backend_err = e;
  return MS_EBACKEND;
}

/* Runs on device for the duration of one backend call. */
typedef struct devswitch_s {
  int prev;
  bool switched;
} devswitch_t;

static devswitch_t dev_enter(int device) {
  devswitch_t s = {current_device(), false};
  if (s.prev != device) {
    set_device_fn *f = real_cudaSetDevice();
    s.switched = f && f(device) == cudaSuccess;
  }
  return s;
}

static void dev_leave(devswitch_t s) {
  if (s.switched) real_cudaSetDevice()(s.prev);
}

static int cb_device_count(void *ctx, int *count) {
  (void)ctx;
  device_count_fn *f = real_cudaGetDeviceCount();
  if (!f) return MS_EBACKEND;
  return cb_err(f(count));
}

static int cb_malloc(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out) {
  (void)ctx, (void)stream;
  devswitch_t s = dev_enter(device);
  void *p = NULL;
  cudaError_t e = real_cudaMalloc()(&p, size);
  dev_leave(s);
  if (e == cudaErrorMemoryAllocation) {
    real_cudaGetLastError()(); /* the allocator frees cached memory and retries, as PyTorch */
    return MS_EOOM;
  }
  if (e != cudaSuccess) return cb_err(e);
  *out = (ms_devptr_t)p;
  return MS_OK;
}

static int cb_free(void *ctx, int device, ms_devptr_t ptr) {
  (void)ctx;
  devswitch_t s = dev_enter(device);
  cudaError_t e = real_cudaFree()((void *)ptr);
  dev_leave(s);
  return cb_err(e);
}

static int cb_mem_info(void *ctx, int device, size_t *free_bytes, size_t *total_bytes) {
  (void)ctx;
  devswitch_t s = dev_enter(device);
  cudaError_t e = real_cudaMemGetInfo()(free_bytes, total_bytes);
  dev_leave(s);
  return cb_err(e);
}

static int cb_stream_create(void *ctx, int device, ms_stream_t *out) {
  (void)ctx;
  devswitch_t s = dev_enter(device);
  cudaStream_t st = NULL;
  cudaError_t e = real_cudaStreamCreate()(&st);
  dev_leave(s);
  if (e == cudaSuccess) *out = (ms_stream_t)(uintptr_t)st;
  return cb_err(e);
}

static int cb_stream_destroy(void *ctx, int device, ms_stream_t stream) {
  (void)ctx, (void)device;
  return cb_err(real_cudaStreamDestroy()((cudaStream_t)(uintptr_t)stream));
}

static int cb_event_create(void *ctx, int device, ms_event_t *out) {
  (void)ctx;
  devswitch_t s = dev_enter(device);
  cudaEvent_t ev = NULL;
  cudaError_t e = real_cudaEventCreateWithFlags()(&ev, cudaEventDisableTiming);
  dev_leave(s);
  if (e == cudaSuccess) *out = (ms_event_t)(uintptr_t)ev;
  return cb_err(e);
}

static int cb_event_record(void *ctx, int device, ms_event_t event, ms_stream_t stream) {
  (void)ctx;
  devswitch_t s = dev_enter(device);
  cudaError_t e =
      real_cudaEventRecord()((cudaEvent_t)(uintptr_t)event, (cudaStream_t)(uintptr_t)stream);
  dev_leave(s);
  return cb_err(e);
}

static int cb_event_query(void *ctx, int device, ms_event_t event, bool *done) {
  (void)ctx, (void)device;
  cudaError_t e = real_cudaEventQuery()((cudaEvent_t)(uintptr_t)event);
  if (e == cudaErrorNotReady) {
    real_cudaGetLastError()();
    *done = false;
    return MS_OK;
  }
  if (e == cudaSuccess) *done = true;
  return cb_err(e);
}

static int cb_event_sync(void *ctx, int device, ms_event_t event) {
  (void)ctx, (void)device;
  return cb_err(real_cudaEventSynchronize()((cudaEvent_t)(uintptr_t)event));
}

static int cb_event_destroy(void *ctx, int device, ms_event_t event) {
  (void)ctx, (void)device;
  return cb_err(real_cudaEventDestroy()((cudaEvent_t)(uintptr_t)event));
}

static int cb_device_sync(void *ctx, int device) {
  (void)ctx;
  devswitch_t s = dev_enter(device);
  cudaError_t e = real_cudaDeviceSynchronize()();
  dev_leave(s);
  return cb_err(e);
}

static pthread_mutex_t cache_mu = PTHREAD_MUTEX_INITIALIZER;
static ms_backend_t *cache_backend;
static _Atomic(ms_allocator_t *) cache_alloc[MS__RUN_MAX_DEVICES];
static atomic_bool cache_failed;

bool ms__run_cache_active(void) {
  return ms__run_opts()->mode == MS__RUN_CACHE && !atomic_load(&cache_failed);
}

uint64_t ms__run_cache_devices(void) {
  uint64_t m = 0;
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
    if (atomic_load(&cache_alloc[d])) m |= 1ULL << d;
  return m;
}

int ms__run_cache_snapshot(int device, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_allocator_t *as[MS__RUN_MAX_DEVICES];
  size_t n = 0;
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++) {
    ms_allocator_t *a = atomic_load(&cache_alloc[d]);
    if (a && (device < 0 || d == device)) as[n++] = a;
  }
  if (n == 0) { /* no allocation served yet: only what was passed through */
    *out = NULL;
    return MS_OK;
  }
  return ms_allocator_snapshot(as, n, out, eb);
}

static const ms_backend_ops_t cudart_ops = {
    .name = "cudart",
    .device_count = cb_device_count,
    .malloc = cb_malloc,
    .free = cb_free,
    .mem_info = cb_mem_info,
    .stream_create = cb_stream_create,
    .stream_destroy = cb_stream_destroy,
    .event_create = cb_event_create,
    .event_record = cb_event_record,
    .event_query = cb_event_query,
    .event_synchronize = cb_event_sync,
    .event_destroy = cb_event_destroy,
    .device_synchronize = cb_device_sync,
};

/* The allocator of device, created at its first use. NULL when creation failed (then the cache
 * mode is off for the whole run and every call is observed instead; a warning says why). */
static ms_allocator_t *cache_allocator(int device) {
  ms_allocator_t *a = atomic_load_explicit(&cache_alloc[device], memory_order_acquire);
  if (ms_likely(a != NULL)) return a;
  pthread_mutex_lock(&cache_mu);
  a = atomic_load(&cache_alloc[device]);
  ms_errbuf_t eb = {0};
  int err = MS_OK;
  if (!a && !cache_backend) err = ms_backend_create(&cudart_ops, &cache_backend);
  if (!a && err == MS_OK) {
    ms_allocator_config_t cfg = {.backend = cache_backend, .device = device};
    err = ms_allocator_create(&cfg, &a, &eb);
    if (err == MS_OK) {
      const ms__run_opts_t *o = ms__run_opts();
      ms_history_config_t hc;
      ms_history_config_init(&hc);
      hc.context = o->depth ? MS_CONTEXT_ALLOC : MS_CONTEXT_NONE;
      hc.max_frames = o->depth ? o->depth : 1;
      hc.unwinder = (ms_unwinder)o->unwinder;
      hc.max_entries = o->max_entries;
      if (ms_allocator_record_history(a, &hc, &eb) != MS_OK)
        ms__warning("cache mode: no history on device %d: %s", device, eb.msg);
      atomic_store_explicit(&cache_alloc[device], a, memory_order_release);
    }
  }
  if (err != MS_OK && !a) {
    atomic_store(&cache_failed, true);
    ms__warning("cache mode: cannot create the allocator of device %d: %s; observing instead",
                device, eb.msg[0] ? eb.msg : ms_strerror(err));
  }
  pthread_mutex_unlock(&cache_mu);
  return a;
}

/* In a child of fork, the parent's allocators (volatile: kept, though never read again). */
static ms_allocator_t *volatile cache_forked_away[MS__RUN_MAX_DEVICES];

void ms__run_preload_fork(ms__run_fork_phase phase) {
  switch (phase) {
  case MS__RUN_FORK_PREPARE: /* the order in which the hooks nest them */
    pthread_mutex_lock(&cache_mu);
    pthread_mutex_lock(&pools_mu);
    break;
  case MS__RUN_FORK_PARENT:
    pthread_mutex_unlock(&pools_mu);
    pthread_mutex_unlock(&cache_mu);
    break;
  case MS__RUN_FORK_CHILD:
    pthread_mutex_init(&pools_mu, NULL);
    pthread_mutex_init(&cache_mu, NULL);
    /* The parent's allocators are not the child's: their memory is the parent's, and another
     * thread of the parent may have held their locks at the fork. They are left as they are
     * (never destroyed here, still referenced), and the child's first allocation creates its
     * own. */
    for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
      cache_forked_away[d] = atomic_exchange(&cache_alloc[d], NULL);
    atomic_store(&cap_known, 0);
    break;
  }
}

/* Finds the cache-mode allocator owning ptr (current device first). */
static ms_allocator_t *cache_owner(void *ptr, int device, ms_stream_t stream) {
  ms_allocator_t *a = atomic_load(&cache_alloc[device]);
  if (a && ms_allocator_record_stream(a, (ms_devptr_t)ptr, stream) == MS_OK) return a;
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++) {
    ms_allocator_t *b = atomic_load(&cache_alloc[d]);
    if (b && b != a && ms_allocator_record_stream(b, (ms_devptr_t)ptr, stream) == MS_OK) return b;
  }
  return NULL;
}

/* Makes the thread's last CUDA error cudaErrorMemoryAllocation, as a failed cudaMalloc leaves it
 * (the allocator cleared it to retry): a request no device can serve fails at once. */
static void rearm_oom_error(void) {
  void *p = NULL;
  if (real_cudaMalloc()(&p, SIZE_MAX) == cudaSuccess) real_cudaFree()(p);
}

/* The OOM of a cache-mode allocation: the messages, the snapshot, the thread's last error. */
static void cache_oom(ms_allocator_t *a, const char *call, size_t size, int device,
                      uint64_t stream) {
  size_t fr = 0, tot = 0;
  if (real_cudaMemGetInfo()(&fr, &tot) != cudaSuccess) fr = tot = 0;
  char msg[1024];
  if (ms_allocator_last_oom_message(a, msg, sizeof msg)) ms__message("memsnap: ", "%s", msg);
  ms__run_on_oom(call, device, size, stream, fr, tot, 0, true);
  rearm_oom_error();
}

/* Serves an allocation from the cache: r = the result, or -1 when the cache mode could not start
 * (the caller then observes). A macro, not a function, so that the allocator's stack shows the
 * hook (named after the CUDA call) right above memsnap's allocator, even with inlined calls
 * expanded from DWARF. */
#define CACHE_MALLOC(r, call, p, size, device, stream)                                             \
  do {                                                                                             \
    ms_allocator_t *a_ = cache_allocator(device);                                                  \
    if (!a_) {                                                                                     \
      (r) = -1;                                                                                    \
    } else if (!(p)) {                                                                             \
      (r) = 1; /* cudaErrorInvalidValue, as the runtime says */                                    \
    } else {                                                                                       \
      ms_devptr_t out_ = 0;                                                                        \
      int err_ = ms_allocator_malloc(a_, (size), (ms_stream_t)(stream), &out_);                    \
      if (err_ == MS_OK) {                                                                         \
        *(p) = (void *)out_;                                                                       \
        (r) = cudaSuccess;                                                                         \
      } else if (err_ == MS_EOOM) {                                                                \
        cache_oom(a_, (call), (size), (device), (stream));                                         \
        (r) = cudaErrorMemoryAllocation;                                                           \
      } else {                                                                                     \
        (r) = err_ == MS_EBACKEND && t_backend_err ? t_backend_err : 999 /* cudaErrorUnknown */;   \
      }                                                                                            \
    }                                                                                              \
  } while (0)

/* @return -1 when ptr is not the cache's (the caller forwards), else the result. */
MS_ALWAYS_INLINE cudaError_t cache_free(void *ptr, int device, uint64_t stream) {
  if (!ptr) return -1;
  ms_allocator_t *a = cache_owner(ptr, device, (ms_stream_t)stream);
  if (!a) return -1;
  return ms_allocator_free(a, (ms_devptr_t)ptr) == MS_OK ? cudaSuccess : 1;
}

/* ---- the exported functions ------------------------------------------------------------------ */

/* The device of a call is asked for (cudaGetDevice, cudaStreamGetDevice) only after the call
 * succeeded or ran out of memory: then the runtime works and these queries succeed, so they never
 * change the thread's last error, which the program may read with cudaGetLastError.
 * Each hook captures the stack itself (MS__RUN_STACK_HERE in the exported function: the innermost
 * frame is then the hook, named after the CUDA call, and the next one the program's caller). */
#define HOOK_ENTER(realp)                                                                          \
  if (ms_unlikely(!(realp))) return cudaErrorSharedObjectSymbolNotFound;                           \
  if (ms__run_in_hook) return

#define OBSERVE_ALLOC(call, realcall, p, size, device, stream, pool, kind)                         \
  do {                                                                                             \
    ms__run_in_hook = 1;                                                                           \
    ms__run_start();                                                                               \
    uint32_t stack_;                                                                               \
    MS__RUN_STACK_HERE(stack_);                                                                    \
    cudaError_t r_ = (realcall);                                                                   \
    if (r_ == cudaSuccess || r_ == cudaErrorMemoryAllocation) {                                    \
      int dev_ = (device); /* asked after the call: see the note above */                          \
      observe_result(r_, call, p, size, dev_, stream, pool, kind, stack_);                         \
    }                                                                                              \
    ms__run_in_hook = 0;                                                                           \
    return r_;                                                                                     \
  } while (0)

#define OBSERVE_FREE(realcall, ptr)                                                                \
  do {                                                                                             \
    ms__run_in_hook = 1;                                                                           \
    ms__run_start();                                                                               \
    uint64_t begin_ = ms__run_free_begin();                                                        \
    cudaError_t r_ = (realcall);                                                                   \
    ms__run_free_end((uint64_t)(uintptr_t)(ptr), begin_, r_ == cudaSuccess);                       \
    ms__run_in_hook = 0;                                                                           \
    return r_;                                                                                     \
  } while (0)

static cudaError_t hook_cudaMalloc(void **devPtr, size_t size) {
  malloc_fn *real = real_cudaMalloc();
  HOOK_ENTER(real) real(devPtr, size);
  if (ms__run_cache_active()) {
    ms__run_in_hook = 1;
    ms__run_start();
    cudaError_t r;
    CACHE_MALLOC(r, "cudaMalloc", devPtr, size, current_device(), 0);
    ms__run_in_hook = 0;
    if (r >= 0) return r;
  }
  OBSERVE_ALLOC("cudaMalloc", real(devPtr, size), devPtr, size, current_device(), 0, 0,
                MS__RUN_KIND_MALLOC);
}

static cudaError_t hook_cudaFree(void *devPtr) {
  free_fn *real = real_cudaFree();
  HOOK_ENTER(real) real(devPtr);
  if (ms__run_cache_active() && devPtr) {
    ms__run_in_hook = 1;
    cudaError_t r = cache_free(devPtr, current_device(), 0);
    ms__run_in_hook = 0;
    if (r >= 0) return r;
  }
  if (!devPtr) return real(devPtr); /* cudaFree(0): context creation, nothing to record */
  OBSERVE_FREE(real(devPtr), devPtr);
}

#define ASYNC_HOOKS(suffix, default_stream)                                                        \
  static cudaError_t hook_cudaMallocAsync##suffix(void **devPtr, size_t size, cudaStream_t s) { \
    malloc_async_fn *real = real_cudaMallocAsync##suffix();                                        \
    HOOK_ENTER(real) real(devPtr, size, s);                                                        \
    uint64_t st = s ? (uint64_t)(uintptr_t)s : (default_stream);                                   \
    if (ms__run_cache_active()) {                                                                  \
      ms__run_in_hook = 1;                                                                         \
      ms__run_start();                                                                             \
      cudaError_t r;                                                                               \
      CACHE_MALLOC(r, "cudaMallocAsync", devPtr, size, stream_device(s), st);                      \
      ms__run_in_hook = 0;                                                                         \
      if (r >= 0) return r;                                                                        \
    }                                                                                              \
    OBSERVE_ALLOC("cudaMallocAsync", real(devPtr, size, s), devPtr, size, stream_device(s), st,    \
                  device_pool_id(dev_), MS__RUN_KIND_ASYNC);                                       \
  }                                                                                                \
  static cudaError_t hook_cudaFreeAsync##suffix(void *devPtr, cudaStream_t s) {                  \
    free_async_fn *real = real_cudaFreeAsync##suffix();                                            \
    HOOK_ENTER(real) real(devPtr, s);                                                              \
    uint64_t st = s ? (uint64_t)(uintptr_t)s : (default_stream);                                   \
    if (ms__run_cache_active() && devPtr) {                                                        \
      ms__run_in_hook = 1;                                                                         \
      cudaError_t r = cache_free(devPtr, stream_device(s), st);                                    \
      ms__run_in_hook = 0;                                                                         \
      if (r >= 0) return r;                                                                        \
    }                                                                                              \
    if (!devPtr) return real(devPtr, s);                                                           \
    OBSERVE_FREE(real(devPtr, s), devPtr);                                                         \
  }                                                                                                \
  static cudaError_t hook_cudaMallocFromPoolAsync##suffix(void **ptr, size_t size,               \
                                                        cudaMemPool_t pool, cudaStream_t s) {      \
    malloc_pool_fn *real = real_cudaMallocFromPoolAsync##suffix();                                 \
    HOOK_ENTER(real) real(ptr, size, pool, s);                                                     \
    uint64_t st = s ? (uint64_t)(uintptr_t)s : (default_stream);                                   \
    OBSERVE_ALLOC("cudaMallocFromPoolAsync", real(ptr, size, pool, s), ptr, size,                  \
                  stream_device(s), st, pool_id_of(pool), MS__RUN_KIND_ASYNC);                     \
  }

ASYNC_HOOKS(, 0)
ASYNC_HOOKS(_ptsz, CUDA_STREAM_PER_THREAD)

static cudaError_t hook_cudaMallocManaged(void **devPtr, size_t size, unsigned flags) {
  malloc_managed_fn *real = real_cudaMallocManaged();
  HOOK_ENTER(real) real(devPtr, size, flags);
  OBSERVE_ALLOC("cudaMallocManaged", real(devPtr, size, flags), devPtr, size, current_device(), 0,
                0, MS__RUN_KIND_MANAGED);
}

/* Pitched allocations (observed in both modes, never cached): the size recorded is what the
 * runtime reserved, pitch * rows (* depth); an OOM records the unpadded request. */
static cudaError_t hook_cudaMallocPitch(void **devPtr, size_t *pitch, size_t width, size_t height) {
  malloc_pitch_fn *real = real_cudaMallocPitch();
  HOOK_ENTER(real) real(devPtr, pitch, width, height);
  ms__run_in_hook = 1;
  ms__run_start();
  uint32_t stack;
  MS__RUN_STACK_HERE(stack);
  cudaError_t r = real(devPtr, pitch, width, height);
  size_t size = r == cudaSuccess && pitch ? *pitch * height : width * height;
  if (r == cudaSuccess || r == cudaErrorMemoryAllocation)
    observe_result(r, "cudaMallocPitch", devPtr, size, current_device(), 0, 0, MS__RUN_KIND_MALLOC,
                   stack);
  ms__run_in_hook = 0;
  return r;
}

static cudaError_t hook_cudaMalloc3D(ms_cuda_pitched_ptr_t *pitchedDevPtr, ms_cuda_extent_t extent) {
  malloc_3d_fn *real = real_cudaMalloc3D();
  HOOK_ENTER(real) real(pitchedDevPtr, extent);
  ms__run_in_hook = 1;
  ms__run_start();
  uint32_t stack;
  MS__RUN_STACK_HERE(stack);
  cudaError_t r = real(pitchedDevPtr, extent);
  size_t size = extent.width * extent.height * extent.depth;
  void *p = NULL;
  if (r == cudaSuccess && pitchedDevPtr) {
    size = pitchedDevPtr->pitch * extent.height * extent.depth;
    p = pitchedDevPtr->ptr;
  }
  if (r == cudaSuccess || r == cudaErrorMemoryAllocation)
    observe_result(r, "cudaMalloc3D", &p, size, current_device(), 0, 0, MS__RUN_KIND_MALLOC, stack);
  ms__run_in_hook = 0;
  return r;
}

static cudaError_t hook_cudaMemPoolCreate(cudaMemPool_t *pool, const void *props) {
  pool_create_fn *real = real_cudaMemPoolCreate();
  HOOK_ENTER(real) real(pool, props);
  ms__run_in_hook = 1; /* pools_mu: a signal handler's CUDA call meanwhile must not take it */
  cudaError_t r = real(pool, props);
  if (r == cudaSuccess && pool && *pool) {
    pthread_mutex_lock(&pools_mu);
    if (npools < (int)(sizeof pools / sizeof pools[0])) {
      pools[npools].h = *pool;
      pools[npools].id = next_pool_id++;
      npools++;
    }
    pthread_mutex_unlock(&pools_mu);
  }
  ms__run_in_hook = 0;
  return r;
}

static cudaError_t hook_cudaMemPoolDestroy(cudaMemPool_t pool) {
  pool_destroy_fn *real = real_cudaMemPoolDestroy();
  HOOK_ENTER(real) real(pool);
  ms__run_in_hook = 1;
  cudaError_t r = real(pool);
  if (r == cudaSuccess) {
    pthread_mutex_lock(&pools_mu);
    for (int i = 0; i < npools; i++)
      if (pools[i].h == pool) pools[i] = pools[--npools];
    for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
      if (device_pool[d] == pool) device_pool[d] = NULL;
    pthread_mutex_unlock(&pools_mu);
  }
  ms__run_in_hook = 0;
  return r;
}

static cudaError_t hook_cudaDeviceSetMemPool(int device, cudaMemPool_t pool) {
  set_mempool_fn *real = real_cudaDeviceSetMemPool();
  HOOK_ENTER(real) real(device, pool);
  ms__run_in_hook = 1;
  cudaError_t r = real(device, pool);
  if (r == cudaSuccess && device >= 0 && device < MS__RUN_MAX_DEVICES) {
    pthread_mutex_lock(&pools_mu);
    device_pool[device] = pool;
    pthread_mutex_unlock(&pools_mu);
  }
  ms__run_in_hook = 0;
  return r;
}

/* cudaDeviceReset frees every allocation of the current device. Observe: they are traced as
 * freed. Cache mode: the device's allocator would hold freed memory; a snapshot ("reset") keeps
 * its state and history, then it is destroyed (its cached segments returned while the context
 * still exists) and a new one is created at the device's next allocation. */
static cudaError_t hook_cudaDeviceReset(void) {
  void_fn *real = real_cudaDeviceReset();
  HOOK_ENTER(real) real();
  ms__run_in_hook = 1;
  int dev = current_device();
  if (ms__run_cache_active() && atomic_load(&cache_alloc[dev])) {
    ms__run_write("reset", -1, NULL, 0);
    pthread_mutex_lock(&cache_mu);
    ms__run_writer_lock(); /* no snapshot walks the allocator while it goes */
    ms_allocator_t *a = atomic_exchange(&cache_alloc[dev], NULL);
    ms_allocator_destroy(a);
    ms__run_writer_unlock();
    pthread_mutex_unlock(&cache_mu);
  }
  cudaError_t r = real();
  if (r == cudaSuccess) ms__run_on_reset(dev);
  ms__run_in_hook = 0;
  return r;
}

/* ---- the exported symbols ------------------------------------------------------------------
 * Each exported CUDA function is a GNU indirect function: the dynamic loader asks its resolver
 * for the address when it binds the name (a call of the program or of a library, dlsym). The
 * resolver answers the hook only when a CUDA runtime loaded in the process defines the function
 * too, else NULL: dlsym(RTLD_DEFAULT, "cudaMalloc") in a program without CUDA then finds nothing,
 * as without memsnap (issue #35 item 11). visible.c walks the loader's list; it calls no function,
 * since a resolver may run while the program is relocated at start. */
#define EXPORT_HOOK(name)                                                                          \
  static __typeof__(hook_##name) *resolve_##name(void) {                                           \
    return ms__run_defined_elsewhere(#name) ? hook_##name : NULL;                                  \
  }                                                                                                \
  MS_EXPORT __typeof__(hook_##name) name __attribute__((ifunc("resolve_" #name)));

EXPORT_HOOK(cudaMalloc)
EXPORT_HOOK(cudaFree)
EXPORT_HOOK(cudaMallocAsync)
EXPORT_HOOK(cudaFreeAsync)
EXPORT_HOOK(cudaMallocFromPoolAsync)
EXPORT_HOOK(cudaMallocAsync_ptsz)
EXPORT_HOOK(cudaFreeAsync_ptsz)
EXPORT_HOOK(cudaMallocFromPoolAsync_ptsz)
EXPORT_HOOK(cudaMallocManaged)
EXPORT_HOOK(cudaMallocPitch)
EXPORT_HOOK(cudaMalloc3D)
EXPORT_HOOK(cudaMemPoolCreate)
EXPORT_HOOK(cudaMemPoolDestroy)
EXPORT_HOOK(cudaDeviceSetMemPool)
EXPORT_HOOK(cudaDeviceReset)
