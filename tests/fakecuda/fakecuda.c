/* SPDX-License-Identifier: MIT
 * fakecuda: the fake CUDA runtime and driver of fakecuda.h (libmemsnap_fakecuda.so).
 *
 * Types, enums and error codes come from the toolkit's own headers, so the exported functions
 * have exactly cudart's and the driver's signatures. State: one mutex (G.mu) over the devices,
 * allocations, VMM objects, streams, events, rules and log; per-thread state (current context,
 * runtime device, error state, capture mode, per-thread default streams) in thread-local storage,
 * re-initialised lazily after fakecuda_reset (a generation counter).
 */
#include "fakecuda.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cuda.h>
#include <cuda_runtime_api.h>

#define FK_API __attribute__((visibility("default")))
#define MAXDEV FAKECUDA_MAX_DEVICES
#define LOG_CAP 65536
#define MAX_RULES 32

/* ---- state --------------------------------------------------------------------------------- */

typedef struct fk_stream_s {
  struct fk_stream_s *next; /* registry of every stream (created, legacy, per-thread) */
  int dev;
  bool blocked;
  bool legacy, per_thread;
  bool nonblocking; /* created with cudaStreamNonBlocking: no implicit sync with legacy */
  int capture_mode; /* -1: not capturing, else an enum cudaStreamCaptureMode */
  bool invalidated;
  unsigned long long capture_id;
  pthread_t capture_thread;
  unsigned long long id;
} fk_stream_t;

typedef struct fk_event_s {
  struct fk_event_s *next;
  int dev;
  bool pending;
  fk_stream_t *stream;
} fk_event_t;

/* kind: 0 cudaMalloc, 1 stream-ordered (cudaMallocAsync/FromPoolAsync), 2 cudaMallocManaged */
typedef struct {
  uint64_t addr;
  size_t size;
  int dev;
  int kind;
} fk_alloc_t;
typedef struct {
  int dev;
  bool is_default;
} fk_pool_t; /* a cudaMemPool_t is its address */
typedef struct {
  uint64_t addr;
  size_t size;
  int dev;
} fk_resv_t;
typedef struct {
  uint64_t id;
  size_t size;
  int dev;
  bool released;
  int mapped;
} fk_handle_t;
typedef struct {
  uint64_t addr;
  size_t size;
  uint64_t handle;
  int dev;
  unsigned access;
} fk_map_t;

typedef struct {
  char fn[48];
  unsigned countdown;
  int error;
  int times;
} fk_rule_t;

typedef struct {
  int dev;
} fk_ctx_t; /* a primary context; CUcontext is its address */

#define VEC(T)                                                                                     \
  struct {                                                                                         \
    T *v;                                                                                          \
    size_t n, cap;                                                                                 \
  }
#define VEC_PUSH(vec, x)                                                                           \
  do {                                                                                             \
    if ((vec).n == (vec).cap) {                                                                    \
      (vec).cap = (vec).cap ? (vec).cap * 2 : 16;                                                  \
      (vec).v = realloc((vec).v, (vec).cap * sizeof *(vec).v);                                     \
      if (!(vec).v) abort();                                                                       \
    }                                                                                              \
    (vec).v[(vec).n++] = (x);                                                                      \
  } while (0)
#define VEC_DEL(vec, i) ((vec).v[i] = (vec).v[--(vec).n])

static struct {
  pthread_mutex_t mu;
  int gen;
  int ndev;
  int driver_version;
  size_t capacity[MAXDEV], gran[MAXDEV], used[MAXDEV];
  bool vmm[MAXDEV];
  bool peer[MAXDEV][MAXDEV];
  bool ctx_created[MAXDEV];
  fk_ctx_t ctx[MAXDEV];
  fk_stream_t legacy[MAXDEV];
  fk_pool_t default_pool[MAXDEV];
  fk_stream_t *streams;
  fk_event_t *events;
  VEC(fk_alloc_t) allocs;
  VEC(fk_resv_t) resv;
  VEC(fk_handle_t) handles;
  VEC(fk_map_t) maps;
  uint64_t next_malloc[MAXDEV], next_va[MAXDEV], next_handle;
  unsigned long long next_stream_id, next_capture_id;
  fk_rule_t rules[MAX_RULES];
  int nrules;
  fakecuda_call_t *log;
  size_t log_len;
} G = {.mu = PTHREAD_MUTEX_INITIALIZER, .gen = 0};

static __thread struct {
  int gen;   /* G.gen when this thread's state was set up; 0 = never */
  int ctx;   /* current context's device, -1: none */
  int rtdev; /* the runtime's device for this thread */
  int err;   /* pending runtime error */
  int mode;  /* capture interaction mode */
  fk_stream_t *pt[MAXDEV];
} T;

static void lock(void) {
  pthread_mutex_lock(&G.mu);
}
static void unlock(void) {
  pthread_mutex_unlock(&G.mu);
}

static void init_defaults_locked(void) {
  G.ndev = 1;
  G.driver_version = 13000;
  for (int d = 0; d < MAXDEV; d++) {
    G.capacity[d] = (size_t)1 << 30;
    G.gran[d] = (size_t)2 << 20;
    G.used[d] = 0;
    G.vmm[d] = true;
    G.ctx_created[d] = false;
    G.ctx[d].dev = d;
    for (int p = 0; p < MAXDEV; p++)
      G.peer[d][p] = false;
    G.default_pool[d] = (fk_pool_t){.dev = d, .is_default = true};
    G.legacy[d] = (fk_stream_t){.dev = d, .legacy = true, .capture_mode = -1, .id = 1000 + d};
    G.next_malloc[d] = 0x7e0000000000ULL + ((uint64_t)d << 40);
    G.next_va[d] = G.next_malloc[d] + ((uint64_t)1 << 39);
  }
  G.next_handle = 1;
  G.next_stream_id = 2000;
  G.next_capture_id = 1;
}

static void ensure_init_locked(void) {
  if (G.gen == 0) {
    G.gen = 1;
    init_defaults_locked();
  }
}

static void thread_state(void) {
  if (T.gen == G.gen) return;
  T.gen = G.gen;
  T.ctx = -1;
  T.rtdev = 0;
  T.err = cudaSuccess;
  T.mode = cudaStreamCaptureModeGlobal;
  for (int d = 0; d < MAXDEV; d++)
    T.pt[d] = NULL;
}

/* Every exported CUDA function starts with ENTER: initialised state, lock held. */
static void enter(void) {
  lock();
  ensure_init_locked();
  thread_state();
}

/* ---- log and fault injection ---------------------------------------------------------------- */

static void log_call(const char *fn, int result, uint64_t addr, uint64_t size) {
  if (!G.log) {
    G.log = calloc(LOG_CAP, sizeof *G.log);
    if (!G.log) return;
  }
  fakecuda_call_t *c = &G.log[G.log_len % LOG_CAP];
  snprintf(c->fn, sizeof c->fn, "%s", fn);
  c->result = result;
  c->device = T.ctx;
  c->addr = addr;
  c->size = size;
  G.log_len++;
}

/* Whether a rule makes this call of fn fail; *err = the error to return. */
static bool injected(const char *fn, int *err) {
  for (int i = 0; i < G.nrules; i++) {
    fk_rule_t *r = &G.rules[i];
    if (strcmp(r->fn, fn) != 0 || r->times == 0) continue;
    if (r->countdown > 1) {
      r->countdown--;
      continue;
    }
    *err = r->error;
    if (r->times > 0) r->times--;
    return true;
  }
  return false;
}

/* Runtime calls return through rt(): logs, sets the error state, unlocks. */
static cudaError_t rt(const char *fn, cudaError_t e, uint64_t addr, uint64_t size) {
  log_call(fn, (int)e, addr, size);
  if (e != cudaSuccess) T.err = e;
  unlock();
  return e;
}

static CUresult drv(const char *fn, CUresult r, uint64_t addr, uint64_t size) {
  log_call(fn, (int)r, addr, size);
  unlock();
  return r;
}

#define RT_INJECT(fn)                                                                              \
  do {                                                                                             \
    int inj_;                                                                                      \
    if (injected(fn, &inj_)) return rt(fn, (cudaError_t)inj_, 0, 0);                               \
  } while (0)
#define DRV_INJECT(fn)                                                                             \
  do {                                                                                             \
    int inj_;                                                                                      \
    if (injected(fn, &inj_)) return drv(fn, (CUresult)inj_, 0, 0);                                 \
  } while (0)

/* ---- contexts ------------------------------------------------------------------------------ */

static void ctx_create(int dev) {
  G.ctx_created[dev] = true;
}

/* A runtime call that needs a context: the thread's current one, or the primary context of its
 * runtime device, created and made current as cudart does. @return the device. */
static int rt_ctx(void) {
  if (T.ctx < 0) {
    ctx_create(T.rtdev);
    T.ctx = T.rtdev;
  }
  return T.ctx;
}

/* ---- streams and capture ------------------------------------------------------------------- */

static fk_stream_t *stream_new(int dev) {
  fk_stream_t *s = calloc(1, sizeof *s);
  if (!s) abort();
  s->dev = dev;
  s->capture_mode = -1;
  s->id = ++G.next_stream_id;
  s->next = G.streams;
  G.streams = s;
  return s;
}

/* The stream a handle names for this thread (NULL: invalid handle). pre: rt_ctx() done. */
static fk_stream_t *stream_of(cudaStream_t h) {
  uintptr_t v = (uintptr_t)h;
  if (v == 0 || v == (uintptr_t)cudaStreamLegacy) return &G.legacy[T.ctx];
  if (v == (uintptr_t)cudaStreamPerThread) {
    if (!T.pt[T.ctx]) {
      T.pt[T.ctx] = stream_new(T.ctx);
      T.pt[T.ctx]->per_thread = true;
    }
    return T.pt[T.ctx];
  }
  for (fk_stream_t *s = G.streams; s; s = s->next)
    if (s == (fk_stream_t *)h && !s->per_thread) return s;
  return NULL;
}

static bool capture_blocks(const fk_stream_t *s) {
  if (s->capture_mode < 0) return false;
  if (s->capture_mode == cudaStreamCaptureModeGlobal) return true;
  if (s->capture_mode == cudaStreamCaptureModeThreadLocal)
    return pthread_equal(s->capture_thread, pthread_self());
  return false;
}

/* An unsafe call from this thread: with a capture under way that forbids it, the captures are
 * invalidated and the call fails (cudaErrorStreamCaptureUnsupported). */
static bool capture_violation(void) {
  if (T.mode == cudaStreamCaptureModeRelaxed) return false;
  bool hit = false;
  for (int d = 0; d < G.ndev; d++)
    if (capture_blocks(&G.legacy[d])) G.legacy[d].invalidated = hit = true;
  for (fk_stream_t *s = G.streams; s; s = s->next)
    if (capture_blocks(s)) s->invalidated = hit = true;
  return hit;
}

/* Whether a blocking stream of dev (one that synchronizes implicitly with the legacy stream:
 * created without cudaStreamNonBlocking, or a per-thread default stream) is capturing: then
 * cudaStreamIsCapturing(cudaStreamLegacy) answers cudaErrorStreamCaptureImplicit, as the
 * runtime's documentation says. A capture on a non-blocking stream is invisible from there. */
static bool blocking_capture(int dev) {
  for (fk_stream_t *s = G.streams; s; s = s->next)
    if (s->dev == dev && s->capture_mode >= 0 && !s->nonblocking) return true;
  return false;
}

static fk_event_t *event_of(cudaEvent_t h) {
  for (fk_event_t *e = G.events; e; e = e->next)
    if (e == (fk_event_t *)h) return e;
  return NULL;
}

static void stream_release(fk_stream_t *s) {
  s->blocked = false;
  for (fk_event_t *e = G.events; e; e = e->next)
    if (e->stream == s) e->pending = false;
}

/* ---- control API --------------------------------------------------------------------------- */

FK_API void fakecuda_reset(void) {
  lock();
  while (G.streams) {
    fk_stream_t *n = G.streams->next;
    free(G.streams);
    G.streams = n;
  }
  while (G.events) {
    fk_event_t *n = G.events->next;
    free(G.events);
    G.events = n;
  }
  G.allocs.n = G.resv.n = G.handles.n = G.maps.n = 0;
  G.nrules = 0;
  G.log_len = 0;
  G.gen = G.gen + 1;
  init_defaults_locked();
  unlock();
}

#define CONTROL(body)                                                                              \
  do {                                                                                             \
    lock();                                                                                        \
    ensure_init_locked();                                                                          \
    thread_state();                                                                                \
    body;                                                                                          \
    unlock();                                                                                      \
  } while (0)

static bool devok(int d) {
  return d >= 0 && d < MAXDEV;
}

FK_API void fakecuda_set_device_count(int n) {
  CONTROL(G.ndev = n < 0 ? 0 : n > MAXDEV ? MAXDEV : n);
}
FK_API void fakecuda_set_capacity(int d, size_t b) {
  CONTROL(if (devok(d)) G.capacity[d] = b);
}
FK_API void fakecuda_set_granularity(int d, size_t b) {
  CONTROL(if (devok(d)) G.gran[d] = b);
}
FK_API void fakecuda_set_vmm_supported(int d, bool s) {
  CONTROL(if (devok(d)) G.vmm[d] = s);
}
FK_API void fakecuda_set_peer_access(int d, int p, bool c) {
  CONTROL(if (devok(d) && devok(p)) G.peer[d][p] = c);
}
FK_API void fakecuda_set_driver_version(int v) {
  CONTROL(G.driver_version = v);
}

FK_API void fakecuda_fail(const char *fn, unsigned nth, int error, int times) {
  CONTROL({
    if (G.nrules < MAX_RULES && nth > 0 && times != 0) {
      fk_rule_t *r = &G.rules[G.nrules++];
      snprintf(r->fn, sizeof r->fn, "%s", fn);
      r->countdown = nth;
      r->error = error;
      r->times = times;
    }
  });
}
FK_API void fakecuda_clear_failures(void) {
  CONTROL(G.nrules = 0);
}

FK_API size_t fakecuda_count(const char *fn) {
  size_t n = 0;
  CONTROL({
    size_t len = G.log_len < LOG_CAP ? G.log_len : LOG_CAP;
    for (size_t i = 0; i < len; i++)
      if (!fn || strcmp(G.log[i].fn, fn) == 0) n++;
  });
  return n;
}
FK_API size_t fakecuda_log_len(void) {
  size_t n = 0;
  CONTROL(n = G.log_len < LOG_CAP ? G.log_len : LOG_CAP);
  return n;
}
FK_API bool fakecuda_log_get(size_t i, fakecuda_call_t *out) {
  bool ok = false;
  CONTROL({
    size_t len = G.log_len < LOG_CAP ? G.log_len : LOG_CAP;
    size_t first = G.log_len < LOG_CAP ? 0 : G.log_len % LOG_CAP;
    if (i < len) {
      *out = G.log[(first + i) % LOG_CAP];
      ok = true;
    }
  });
  return ok;
}
FK_API void fakecuda_log_clear(void) {
  CONTROL(G.log_len = 0);
}

FK_API bool fakecuda_context_created(int d) {
  bool r = false;
  CONTROL(r = devok(d) && G.ctx_created[d]);
  return r;
}
FK_API int fakecuda_current_context_device(void) {
  int r = -1;
  CONTROL(r = T.ctx);
  return r;
}
FK_API void fakecuda_forget_thread_context(void) {
  CONTROL({
    T.ctx = -1;
    T.rtdev = 0;
  });
}
FK_API int fakecuda_pending_error(void) {
  int r = 0;
  CONTROL(r = T.err);
  return r;
}
FK_API void fakecuda_set_pending_error(int e) {
  CONTROL(T.err = e);
}

static fk_stream_t *control_stream(uint64_t h) {
  int saved = T.ctx;
  if (T.ctx < 0) T.ctx = T.rtdev;
  fk_stream_t *s = stream_of((cudaStream_t)(uintptr_t)h);
  T.ctx = saved;
  return s;
}

FK_API void fakecuda_block_stream(uint64_t h, bool blocked) {
  CONTROL({
    fk_stream_t *s = control_stream(h);
    if (s) {
      if (blocked)
        s->blocked = true;
      else
        stream_release(s);
    }
  });
}

static int begin_capture_locked(fk_stream_t *s, int mode) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (s->capture_mode >= 0) return cudaErrorIllegalState;
  if (s->legacy) return cudaErrorStreamCaptureUnsupported;
  s->capture_mode = mode;
  s->invalidated = false;
  s->capture_id = G.next_capture_id++;
  s->capture_thread = pthread_self();
  return cudaSuccess;
}

static int end_capture_locked(fk_stream_t *s) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (s->capture_mode < 0) return cudaErrorIllegalState;
  bool inval = s->invalidated;
  s->capture_mode = -1;
  s->invalidated = false;
  s->capture_id = 0;
  return inval ? cudaErrorStreamCaptureInvalidated : cudaSuccess;
}

FK_API int fakecuda_begin_capture(uint64_t h, int mode) {
  int r = 0;
  CONTROL(r = begin_capture_locked(control_stream(h), mode));
  return r;
}
FK_API int fakecuda_end_capture(uint64_t h) {
  int r = 0;
  CONTROL(r = end_capture_locked(control_stream(h)));
  return r;
}
FK_API bool fakecuda_capture_invalidated(uint64_t h) {
  bool r = false;
  CONTROL({
    fk_stream_t *s = control_stream(h);
    r = s && s->invalidated;
  });
  return r;
}

FK_API size_t fakecuda_used_bytes(int d) {
  size_t r = 0;
  CONTROL(r = devok(d) ? G.used[d] : 0);
  return r;
}
FK_API size_t fakecuda_live_allocations(int d) {
  size_t r = 0;
  CONTROL(for (size_t i = 0; i < G.allocs.n; i++) r += G.allocs.v[i].dev == d);
  return r;
}
FK_API size_t fakecuda_live_handles(void) {
  size_t r = 0;
  CONTROL(r = G.handles.n);
  return r;
}
FK_API size_t fakecuda_live_mappings(void) {
  size_t r = 0;
  CONTROL(r = G.maps.n);
  return r;
}
FK_API size_t fakecuda_live_reservations(void) {
  size_t r = 0;
  CONTROL(r = G.resv.n);
  return r;
}
FK_API unsigned fakecuda_access_mask(uint64_t addr) {
  unsigned r = 0;
  CONTROL(for (size_t i = 0; i < G.maps.n;
               i++) if (addr >= G.maps.v[i].addr && addr < G.maps.v[i].addr + G.maps.v[i].size) r =
              G.maps.v[i].access);
  return r;
}
FK_API size_t fakecuda_mapping_size(uint64_t addr) {
  size_t r = 0;
  CONTROL(for (size_t i = 0; i < G.maps.n;
               i++) if (addr >= G.maps.v[i].addr && addr < G.maps.v[i].addr + G.maps.v[i].size) r =
              G.maps.v[i].size);
  return r;
}
FK_API int fakecuda_event_device(uint64_t h) {
  int r = -1;
  CONTROL({
    fk_event_t *e = event_of((cudaEvent_t)(uintptr_t)h);
    r = e ? e->dev : -1;
  });
  return r;
}

/* ---- error names --------------------------------------------------------------------------- */

typedef struct {
  int code;
  const char *name, *text;
} fk_errname_t;

static const fk_errname_t rt_errors[] = {
    {cudaSuccess, "cudaSuccess", "no error"},
    {cudaErrorInvalidValue, "cudaErrorInvalidValue", "invalid argument"},
    {cudaErrorMemoryAllocation, "cudaErrorMemoryAllocation", "out of memory"},
    {cudaErrorInitializationError, "cudaErrorInitializationError", "initialization error"},
    {cudaErrorInsufficientDriver, "cudaErrorInsufficientDriver",
     "CUDA driver version is insufficient for CUDA runtime version"},
    {cudaErrorNoDevice, "cudaErrorNoDevice", "no CUDA-capable device is detected"},
    {cudaErrorInvalidDevice, "cudaErrorInvalidDevice", "invalid device ordinal"},
    {cudaErrorInvalidDevicePointer, "cudaErrorInvalidDevicePointer", "invalid device pointer"},
    {cudaErrorInvalidResourceHandle, "cudaErrorInvalidResourceHandle", "invalid resource handle"},
    {cudaErrorIllegalState, "cudaErrorIllegalState",
     "the operation cannot be performed in the present state"},
    {cudaErrorNotReady, "cudaErrorNotReady", "device not ready"},
    {cudaErrorIllegalAddress, "cudaErrorIllegalAddress",
     "an illegal memory access was encountered"},
    {cudaErrorLaunchFailure, "cudaErrorLaunchFailure", "unspecified launch failure"},
    {cudaErrorPeerAccessUnsupported, "cudaErrorPeerAccessUnsupported",
     "peer access is not supported between these two devices"},
    {cudaErrorPeerAccessAlreadyEnabled, "cudaErrorPeerAccessAlreadyEnabled",
     "peer access is already enabled"},
    {cudaErrorStreamCaptureUnsupported, "cudaErrorStreamCaptureUnsupported",
     "operation not permitted when stream is capturing"},
    {cudaErrorStreamCaptureInvalidated, "cudaErrorStreamCaptureInvalidated",
     "operation failed due to a previous error during capture"},
    {cudaErrorStreamCaptureImplicit, "cudaErrorStreamCaptureImplicit",
     "operation would make the legacy stream depend on a capturing blocking stream"},
    {cudaErrorUnknown, "cudaErrorUnknown", "unknown error"},
};

static const fk_errname_t drv_errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_ILLEGAL_ADDRESS, "CUDA_ERROR_ILLEGAL_ADDRESS",
     "an illegal memory access was encountered"},
    {CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED",
     "operation not permitted when stream is capturing"},
    {CUDA_ERROR_LAUNCH_FAILED, "CUDA_ERROR_LAUNCH_FAILED", "unspecified launch failure"},
    {CUDA_ERROR_ALREADY_MAPPED, "CUDA_ERROR_ALREADY_MAPPED", "resource already mapped"},
    {CUDA_ERROR_NOT_MAPPED, "CUDA_ERROR_NOT_MAPPED", "resource not mapped"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static const fk_errname_t *find_err(const fk_errname_t *t, size_t n, int code) {
  for (size_t i = 0; i < n; i++)
    if (t[i].code == code) return &t[i];
  return NULL;
}

FK_API const char *cudaGetErrorName(cudaError_t e) {
  const fk_errname_t *x = find_err(rt_errors, sizeof rt_errors / sizeof *rt_errors, (int)e);
  return x ? x->name : "cudaErrorUnknown";
}

FK_API const char *cudaGetErrorString(cudaError_t e) {
  const fk_errname_t *x = find_err(rt_errors, sizeof rt_errors / sizeof *rt_errors, (int)e);
  return x ? x->text : "unrecognized error code";
}

FK_API CUresult cuGetErrorName(CUresult r, const char **s) {
  const fk_errname_t *x = find_err(drv_errors, sizeof drv_errors / sizeof *drv_errors, (int)r);
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = x ? x->name : NULL;
  return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

FK_API CUresult cuGetErrorString(CUresult r, const char **s) {
  const fk_errname_t *x = find_err(drv_errors, sizeof drv_errors / sizeof *drv_errors, (int)r);
  if (!s) return CUDA_ERROR_INVALID_VALUE;
  *s = x ? x->text : NULL;
  return x ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- the runtime: devices and errors -------------------------------------------------------- */

FK_API cudaError_t cudaGetLastError(void) {
  enter();
  cudaError_t e = (cudaError_t)T.err;
  T.err = cudaSuccess;
  log_call("cudaGetLastError", (int)e, 0, 0);
  unlock();
  return e;
}

FK_API cudaError_t cudaPeekAtLastError(void) {
  enter();
  cudaError_t e = (cudaError_t)T.err;
  log_call("cudaPeekAtLastError", (int)e, 0, 0);
  unlock();
  return e;
}

FK_API cudaError_t cudaGetDeviceCount(int *n) {
  enter();
  RT_INJECT("cudaGetDeviceCount");
  if (G.driver_version < CUDART_VERSION)
    return rt("cudaGetDeviceCount", cudaErrorInsufficientDriver, 0, 0);
  if (G.ndev == 0) return rt("cudaGetDeviceCount", cudaErrorNoDevice, 0, 0);
  *n = G.ndev;
  return rt("cudaGetDeviceCount", cudaSuccess, 0, (uint64_t)G.ndev);
}

FK_API cudaError_t cudaDriverGetVersion(int *v) {
  enter();
  RT_INJECT("cudaDriverGetVersion");
  *v = G.driver_version;
  return rt("cudaDriverGetVersion", cudaSuccess, 0, 0);
}

FK_API cudaError_t cudaRuntimeGetVersion(int *v) {
  enter();
  RT_INJECT("cudaRuntimeGetVersion");
  *v = CUDART_VERSION;
  return rt("cudaRuntimeGetVersion", cudaSuccess, 0, 0);
}

FK_API cudaError_t cudaGetDevice(int *d) {
  enter();
  RT_INJECT("cudaGetDevice");
  *d = T.ctx >= 0 ? T.ctx : T.rtdev;
  return rt("cudaGetDevice", cudaSuccess, 0, 0);
}

FK_API cudaError_t cudaSetDevice(int d) {
  enter();
  RT_INJECT("cudaSetDevice");
  if (d < 0 || d >= G.ndev) return rt("cudaSetDevice", cudaErrorInvalidDevice, 0, 0);
  T.rtdev = d;
  ctx_create(d);
  T.ctx = d;
  return rt("cudaSetDevice", cudaSuccess, 0, (uint64_t)d);
}

FK_API cudaError_t cudaDeviceCanAccessPeer(int *can, int d, int p) {
  enter();
  RT_INJECT("cudaDeviceCanAccessPeer");
  if (d < 0 || d >= G.ndev || p < 0 || p >= G.ndev)
    return rt("cudaDeviceCanAccessPeer", cudaErrorInvalidDevice, 0, 0);
  *can = d != p && G.peer[d][p];
  return rt("cudaDeviceCanAccessPeer", cudaSuccess, 0, 0);
}

FK_API cudaError_t cudaDeviceEnablePeerAccess(int p, unsigned int flags) {
  enter();
  RT_INJECT("cudaDeviceEnablePeerAccess");
  int d = rt_ctx();
  if (flags != 0 || p < 0 || p >= G.ndev)
    return rt("cudaDeviceEnablePeerAccess", cudaErrorInvalidValue, 0, 0);
  if (!G.peer[d][p]) return rt("cudaDeviceEnablePeerAccess", cudaErrorPeerAccessUnsupported, 0, 0);
  return rt("cudaDeviceEnablePeerAccess", cudaSuccess, 0, 0);
}

/* ---- the runtime: memory ------------------------------------------------------------------- */

/* Takes size (> 0) bytes of device d's capacity at a fresh 2 MiB-aligned address; returns
 * through rt(). */
static cudaError_t alloc_locked(const char *fn, void **p, size_t size, int d, int kind) {
  if (size > G.capacity[d] - G.used[d] || G.used[d] > G.capacity[d])
    return rt(fn, cudaErrorMemoryAllocation, 0, size);
  uint64_t a = G.next_malloc[d];
  G.next_malloc[d] += (size + ((2u << 20) - 1)) & ~(uint64_t)((2u << 20) - 1);
  G.used[d] += size;
  VEC_PUSH(G.allocs, ((fk_alloc_t){a, size, d, kind}));
  *p = (void *)(uintptr_t)a;
  return rt(fn, cudaSuccess, a, size);
}

/* Releases the allocation at p (any kind); returns through rt(). */
static cudaError_t free_locked(const char *fn, void *p) {
  for (size_t i = 0; i < G.allocs.n; i++) {
    if (G.allocs.v[i].addr == (uint64_t)(uintptr_t)p) {
      G.used[G.allocs.v[i].dev] -= G.allocs.v[i].size;
      size_t sz = G.allocs.v[i].size;
      VEC_DEL(G.allocs, i);
      return rt(fn, cudaSuccess, (uint64_t)(uintptr_t)p, sz);
    }
  }
  return rt(fn, cudaErrorInvalidValue, (uint64_t)(uintptr_t)p, 0);
}

FK_API cudaError_t cudaMalloc(void **p, size_t size) {
  enter();
  RT_INJECT("cudaMalloc");
  int d = rt_ctx();
  if (!p) return rt("cudaMalloc", cudaErrorInvalidValue, 0, size);
  if (capture_violation()) return rt("cudaMalloc", cudaErrorStreamCaptureUnsupported, 0, size);
  if (size == 0) {
    *p = NULL;
    return rt("cudaMalloc", cudaSuccess, 0, 0);
  }
  return alloc_locked("cudaMalloc", p, size, d, 0);
}

FK_API cudaError_t cudaFree(void *p) {
  enter();
  RT_INJECT("cudaFree");
  rt_ctx();
  if (capture_violation())
    return rt("cudaFree", cudaErrorStreamCaptureUnsupported, (uint64_t)(uintptr_t)p, 0);
  if (!p) return rt("cudaFree", cudaSuccess, 0, 0);
  return free_locked("cudaFree", p);
}

/* Stream-ordered allocation (allowed during a capture, as the driver records it as a node).
 * The memory is taken and returned at once: the fake has no pool cache. */
FK_API cudaError_t cudaMallocAsync(void **p, size_t size, cudaStream_t h) {
  enter();
  RT_INJECT("cudaMallocAsync");
  rt_ctx();
  fk_stream_t *s = stream_of(h);
  if (!p) return rt("cudaMallocAsync", cudaErrorInvalidValue, 0, size);
  if (!s) return rt("cudaMallocAsync", cudaErrorInvalidResourceHandle, 0, size);
  if (size == 0) {
    *p = NULL;
    return rt("cudaMallocAsync", cudaSuccess, 0, 0);
  }
  return alloc_locked("cudaMallocAsync", p, size, s->dev, 1);
}

FK_API cudaError_t cudaMallocFromPoolAsync(void **p, size_t size, cudaMemPool_t pool,
                                           cudaStream_t h) {
  enter();
  RT_INJECT("cudaMallocFromPoolAsync");
  rt_ctx();
  fk_stream_t *s = stream_of(h);
  if (!p || !pool) return rt("cudaMallocFromPoolAsync", cudaErrorInvalidValue, 0, size);
  if (!s) return rt("cudaMallocFromPoolAsync", cudaErrorInvalidResourceHandle, 0, size);
  if (size == 0) {
    *p = NULL;
    return rt("cudaMallocFromPoolAsync", cudaSuccess, 0, 0);
  }
  return alloc_locked("cudaMallocFromPoolAsync", p, size, ((fk_pool_t *)pool)->dev, 1);
}

FK_API cudaError_t cudaFreeAsync(void *p, cudaStream_t h) {
  enter();
  RT_INJECT("cudaFreeAsync");
  rt_ctx();
  if (!stream_of(h)) return rt("cudaFreeAsync", cudaErrorInvalidResourceHandle, 0, 0);
  if (!p) return rt("cudaFreeAsync", cudaSuccess, 0, 0);
  return free_locked("cudaFreeAsync", p);
}

FK_API cudaError_t cudaDeviceGetDefaultMemPool(cudaMemPool_t *pool, int device) {
  enter();
  RT_INJECT("cudaDeviceGetDefaultMemPool");
  if (!pool) return rt("cudaDeviceGetDefaultMemPool", cudaErrorInvalidValue, 0, 0);
  if (device < 0 || device >= G.ndev)
    return rt("cudaDeviceGetDefaultMemPool", cudaErrorInvalidDevice, 0, 0);
  *pool = (cudaMemPool_t)&G.default_pool[device];
  return rt("cudaDeviceGetDefaultMemPool", cudaSuccess, (uint64_t)(uintptr_t)*pool, 0);
}

FK_API cudaError_t cudaMemPoolCreate(cudaMemPool_t *pool, const struct cudaMemPoolProps *props) {
  enter();
  RT_INJECT("cudaMemPoolCreate");
  if (!pool || !props || props->location.type != cudaMemLocationTypeDevice ||
      props->location.id < 0 || props->location.id >= G.ndev)
    return rt("cudaMemPoolCreate", cudaErrorInvalidValue, 0, 0);
  fk_pool_t *n = calloc(1, sizeof *n);
  if (!n) return rt("cudaMemPoolCreate", cudaErrorMemoryAllocation, 0, 0);
  n->dev = props->location.id;
  *pool = (cudaMemPool_t)n;
  return rt("cudaMemPoolCreate", cudaSuccess, (uint64_t)(uintptr_t)n, 0);
}

FK_API cudaError_t cudaMemPoolDestroy(cudaMemPool_t pool) {
  enter();
  RT_INJECT("cudaMemPoolDestroy");
  fk_pool_t *fp = (fk_pool_t *)pool;
  if (!fp || fp->is_default) return rt("cudaMemPoolDestroy", cudaErrorInvalidValue, 0, 0);
  uint64_t id = (uint64_t)(uintptr_t)fp;
  free(fp);
  return rt("cudaMemPoolDestroy", cudaSuccess, id, 0);
}

FK_API cudaError_t cudaMemPoolTrimTo(cudaMemPool_t pool, size_t keep) {
  enter();
  RT_INJECT("cudaMemPoolTrimTo");
  if (!pool) return rt("cudaMemPoolTrimTo", cudaErrorInvalidValue, 0, keep);
  return rt("cudaMemPoolTrimTo", cudaSuccess, (uint64_t)(uintptr_t)pool, keep);
}

/* Managed memory: counted against the calling thread's device like device memory. */
FK_API cudaError_t cudaMallocManaged(void **p, size_t size, unsigned int flags) {
  enter();
  RT_INJECT("cudaMallocManaged");
  int d = rt_ctx();
  if (!p || size == 0 || (flags != cudaMemAttachGlobal && flags != cudaMemAttachHost))
    return rt("cudaMallocManaged", cudaErrorInvalidValue, 0, size);
  if (capture_violation())
    return rt("cudaMallocManaged", cudaErrorStreamCaptureUnsupported, 0, size);
  return alloc_locked("cudaMallocManaged", p, size, d, 2);
}

FK_API cudaError_t cudaMemGetInfo(size_t *free_b, size_t *total) {
  enter();
  RT_INJECT("cudaMemGetInfo");
  int d = rt_ctx();
  *total = G.capacity[d];
  *free_b = G.used[d] < G.capacity[d] ? G.capacity[d] - G.used[d] : 0;
  return rt("cudaMemGetInfo", cudaSuccess, 0, *free_b);
}

FK_API cudaError_t cudaDeviceSynchronize(void) {
  enter();
  RT_INJECT("cudaDeviceSynchronize");
  int d = rt_ctx();
  if (capture_violation())
    return rt("cudaDeviceSynchronize", cudaErrorStreamCaptureUnsupported, 0, 0);
  stream_release(&G.legacy[d]);
  for (fk_stream_t *s = G.streams; s; s = s->next)
    if (s->dev == d) stream_release(s);
  return rt("cudaDeviceSynchronize", cudaSuccess, 0, 0);
}

/* ---- the runtime: streams and capture ------------------------------------------------------ */

FK_API cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned int flags) {
  enter();
  RT_INJECT("cudaStreamCreateWithFlags");
  fk_stream_t *n = stream_new(rt_ctx());
  n->nonblocking = (flags & cudaStreamNonBlocking) != 0;
  *s = (cudaStream_t)n;
  return rt("cudaStreamCreateWithFlags", cudaSuccess, (uint64_t)(uintptr_t)n, 0);
}

FK_API cudaError_t cudaStreamCreate(cudaStream_t *s) {
  enter();
  RT_INJECT("cudaStreamCreate");
  fk_stream_t *n = stream_new(rt_ctx());
  *s = (cudaStream_t)n;
  return rt("cudaStreamCreate", cudaSuccess, (uint64_t)(uintptr_t)n, 0);
}

FK_API cudaError_t cudaStreamDestroy(cudaStream_t h) {
  enter();
  RT_INJECT("cudaStreamDestroy");
  rt_ctx();
  fk_stream_t **link = &G.streams;
  while (*link && *link != (fk_stream_t *)h)
    link = &(*link)->next;
  if (!*link || (*link)->per_thread)
    return rt("cudaStreamDestroy", cudaErrorInvalidResourceHandle, (uint64_t)(uintptr_t)h, 0);
  fk_stream_t *s = *link;
  *link = s->next;
  for (fk_event_t *e = G.events; e; e = e->next)
    if (e->stream == s) e->stream = NULL, e->pending = false;
  free(s);
  return rt("cudaStreamDestroy", cudaSuccess, (uint64_t)(uintptr_t)h, 0);
}

FK_API cudaError_t cudaStreamSynchronize(cudaStream_t h) {
  enter();
  RT_INJECT("cudaStreamSynchronize");
  rt_ctx();
  fk_stream_t *s = stream_of(h);
  if (!s) return rt("cudaStreamSynchronize", cudaErrorInvalidResourceHandle, 0, 0);
  if (s->capture_mode >= 0) {
    s->invalidated = true;
    return rt("cudaStreamSynchronize", cudaErrorStreamCaptureUnsupported, 0, 0);
  }
  stream_release(s);
  return rt("cudaStreamSynchronize", cudaSuccess, 0, 0);
}

FK_API cudaError_t cudaStreamGetDevice(cudaStream_t h, int *device) {
  enter();
  RT_INJECT("cudaStreamGetDevice");
  rt_ctx();
  fk_stream_t *s = stream_of(h);
  if (!s) return rt("cudaStreamGetDevice", cudaErrorInvalidResourceHandle, 0, 0);
  *device = s->dev;
  return rt("cudaStreamGetDevice", cudaSuccess, (uint64_t)(uintptr_t)h, 0);
}

FK_API cudaError_t cudaStreamGetId(cudaStream_t h, unsigned long long *id) {
  enter();
  RT_INJECT("cudaStreamGetId");
  rt_ctx();
  fk_stream_t *s = stream_of(h);
  if (!s) return rt("cudaStreamGetId", cudaErrorInvalidResourceHandle, 0, 0);
  *id = s->id;
  return rt("cudaStreamGetId", cudaSuccess, (uint64_t)(uintptr_t)h, s->id);
}

FK_API cudaError_t cudaStreamBeginCapture(cudaStream_t h, enum cudaStreamCaptureMode mode) {
  enter();
  RT_INJECT("cudaStreamBeginCapture");
  rt_ctx();
  return rt("cudaStreamBeginCapture", (cudaError_t)begin_capture_locked(stream_of(h), (int)mode),
            (uint64_t)(uintptr_t)h, 0);
}

FK_API cudaError_t cudaStreamEndCapture(cudaStream_t h, cudaGraph_t *graph) {
  enter();
  RT_INJECT("cudaStreamEndCapture");
  rt_ctx();
  cudaError_t e = (cudaError_t)end_capture_locked(stream_of(h));
  static char fake_graph;
  if (graph) *graph = e == cudaSuccess ? (cudaGraph_t)(void *)&fake_graph : NULL;
  return rt("cudaStreamEndCapture", e, (uint64_t)(uintptr_t)h, 0);
}

static cudaError_t capture_status(fk_stream_t *s, enum cudaStreamCaptureStatus *st,
                                  unsigned long long *id) {
  if (!s) return cudaErrorInvalidResourceHandle;
  if (s->legacy && s->capture_mode < 0 && blocking_capture(s->dev))
    return cudaErrorStreamCaptureImplicit;
  if (s->capture_mode < 0) {
    *st = cudaStreamCaptureStatusNone;
    if (id) *id = 0;
  } else {
    *st = s->invalidated ? cudaStreamCaptureStatusInvalidated : cudaStreamCaptureStatusActive;
    if (id) *id = s->capture_id;
  }
  return cudaSuccess;
}

FK_API cudaError_t cudaStreamIsCapturing(cudaStream_t h, enum cudaStreamCaptureStatus *st) {
  enter();
  RT_INJECT("cudaStreamIsCapturing");
  rt_ctx();
  return rt("cudaStreamIsCapturing", capture_status(stream_of(h), st, NULL), (uint64_t)(uintptr_t)h,
            0);
}

#if CUDART_VERSION >= 13000
FK_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t h, enum cudaStreamCaptureStatus *st,
                                            unsigned long long *id, cudaGraph_t *graph,
                                            const cudaGraphNode_t **deps,
                                            const cudaGraphEdgeData **edges, size_t *ndeps) {
  if (edges) *edges = NULL;
#else
FK_API cudaError_t cudaStreamGetCaptureInfo(cudaStream_t h, enum cudaStreamCaptureStatus *st,
                                            unsigned long long *id, cudaGraph_t *graph,
                                            const cudaGraphNode_t **deps, size_t *ndeps) {
#endif
  enter();
  RT_INJECT("cudaStreamGetCaptureInfo");
  rt_ctx();
  if (graph) *graph = NULL;
  if (deps) *deps = NULL;
  if (ndeps) *ndeps = 0;
  return rt("cudaStreamGetCaptureInfo", capture_status(stream_of(h), st, id),
            (uint64_t)(uintptr_t)h, 0);
}

FK_API cudaError_t cudaThreadExchangeStreamCaptureMode(enum cudaStreamCaptureMode *mode) {
  enter();
  RT_INJECT("cudaThreadExchangeStreamCaptureMode");
  int old = T.mode;
  T.mode = (int)*mode;
  *mode = (enum cudaStreamCaptureMode)old;
  return rt("cudaThreadExchangeStreamCaptureMode", cudaSuccess, 0, (uint64_t)T.mode);
}

/* ---- the runtime: events ------------------------------------------------------------------- */

static cudaError_t event_create_locked(cudaEvent_t *out) {
  fk_event_t *e = calloc(1, sizeof *e);
  if (!e) abort();
  e->dev = rt_ctx();
  e->next = G.events;
  G.events = e;
  *out = (cudaEvent_t)e;
  return cudaSuccess;
}

FK_API cudaError_t cudaEventCreateWithFlags(cudaEvent_t *out, unsigned int flags) {
  (void)flags;
  enter();
  RT_INJECT("cudaEventCreateWithFlags");
  cudaError_t e = event_create_locked(out);
  return rt("cudaEventCreateWithFlags", e, (uint64_t)(uintptr_t)*out, 0);
}

FK_API cudaError_t cudaEventCreate(cudaEvent_t *out) {
  enter();
  RT_INJECT("cudaEventCreate");
  cudaError_t e = event_create_locked(out);
  return rt("cudaEventCreate", e, (uint64_t)(uintptr_t)*out, 0);
}

FK_API cudaError_t cudaEventRecord(cudaEvent_t h, cudaStream_t sh) {
  enter();
  RT_INJECT("cudaEventRecord");
  rt_ctx();
  fk_event_t *e = event_of(h);
  fk_stream_t *s = stream_of(sh);
  if (!e || !s || e->dev != s->dev)
    return rt("cudaEventRecord", cudaErrorInvalidResourceHandle, (uint64_t)(uintptr_t)h, 0);
  e->stream = s;
  e->pending = s->capture_mode < 0 && s->blocked;
  return rt("cudaEventRecord", cudaSuccess, (uint64_t)(uintptr_t)h, (uint64_t)(uintptr_t)sh);
}

FK_API cudaError_t cudaEventQuery(cudaEvent_t h) {
  enter();
  RT_INJECT("cudaEventQuery");
  rt_ctx();
  fk_event_t *e = event_of(h);
  if (!e) return rt("cudaEventQuery", cudaErrorInvalidResourceHandle, (uint64_t)(uintptr_t)h, 0);
  if (capture_violation())
    return rt("cudaEventQuery", cudaErrorStreamCaptureUnsupported, (uint64_t)(uintptr_t)h, 0);
  return rt("cudaEventQuery", e->pending ? cudaErrorNotReady : cudaSuccess, (uint64_t)(uintptr_t)h,
            0);
}

FK_API cudaError_t cudaEventSynchronize(cudaEvent_t h) {
  enter();
  RT_INJECT("cudaEventSynchronize");
  rt_ctx();
  fk_event_t *e = event_of(h);
  if (!e)
    return rt("cudaEventSynchronize", cudaErrorInvalidResourceHandle, (uint64_t)(uintptr_t)h, 0);
  if (capture_violation())
    return rt("cudaEventSynchronize", cudaErrorStreamCaptureUnsupported, (uint64_t)(uintptr_t)h, 0);
  e->pending = false; /* waits for the work before it */
  return rt("cudaEventSynchronize", cudaSuccess, (uint64_t)(uintptr_t)h, 0);
}

FK_API cudaError_t cudaEventDestroy(cudaEvent_t h) {
  enter();
  RT_INJECT("cudaEventDestroy");
  rt_ctx();
  fk_event_t **link = &G.events;
  while (*link && *link != (fk_event_t *)h)
    link = &(*link)->next;
  if (!*link)
    return rt("cudaEventDestroy", cudaErrorInvalidResourceHandle, (uint64_t)(uintptr_t)h, 0);
  fk_event_t *e = *link;
  *link = e->next;
  free(e);
  return rt("cudaEventDestroy", cudaSuccess, (uint64_t)(uintptr_t)h, 0);
}

/* ---- the driver: contexts and attributes --------------------------------------------------- */

FK_API CUresult cuCtxGetCurrent(CUcontext *pctx) {
  enter();
  DRV_INJECT("cuCtxGetCurrent");
  *pctx = T.ctx >= 0 ? (CUcontext)(void *)&G.ctx[T.ctx] : NULL;
  return drv("cuCtxGetCurrent", CUDA_SUCCESS, 0, 0);
}

FK_API CUresult cuCtxSetCurrent(CUcontext c) {
  enter();
  DRV_INJECT("cuCtxSetCurrent");
  if (!c) {
    T.ctx = -1;
    return drv("cuCtxSetCurrent", CUDA_SUCCESS, 0, 0);
  }
  fk_ctx_t *x = (fk_ctx_t *)(void *)c;
  if (x < &G.ctx[0] || x >= &G.ctx[MAXDEV] || !G.ctx_created[x->dev])
    return drv("cuCtxSetCurrent", CUDA_ERROR_INVALID_CONTEXT, 0, 0);
  T.ctx = x->dev;
  return drv("cuCtxSetCurrent", CUDA_SUCCESS, 0, (uint64_t)x->dev);
}

FK_API CUresult cuCtxGetDevice(CUdevice *dev) {
  enter();
  DRV_INJECT("cuCtxGetDevice");
  if (T.ctx < 0) return drv("cuCtxGetDevice", CUDA_ERROR_INVALID_CONTEXT, 0, 0);
  *dev = T.ctx;
  return drv("cuCtxGetDevice", CUDA_SUCCESS, 0, 0);
}

FK_API CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attr, CUdevice dev) {
  enter();
  DRV_INJECT("cuDeviceGetAttribute");
  if (dev < 0 || dev >= G.ndev) return drv("cuDeviceGetAttribute", CUDA_ERROR_INVALID_DEVICE, 0, 0);
  *pi = attr == CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED ? G.vmm[dev] : 0;
  return drv("cuDeviceGetAttribute", CUDA_SUCCESS, 0, 0);
}

FK_API CUresult cuMemGetAllocationGranularity(size_t *g, const CUmemAllocationProp *prop,
                                              CUmemAllocationGranularity_flags opt) {
  (void)opt;
  enter();
  DRV_INJECT("cuMemGetAllocationGranularity");
  int d = prop ? prop->location.id : -1;
  if (d < 0 || d >= G.ndev)
    return drv("cuMemGetAllocationGranularity", CUDA_ERROR_INVALID_DEVICE, 0, 0);
  *g = G.gran[d];
  return drv("cuMemGetAllocationGranularity", CUDA_SUCCESS, 0, G.gran[d]);
}

/* ---- the driver: virtual memory ------------------------------------------------------------ */

FK_API CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t align, CUdeviceptr addr,
                                    unsigned long long flags) {
  (void)addr;
  (void)flags;
  enter();
  DRV_INJECT("cuMemAddressReserve");
  if (T.ctx < 0) return drv("cuMemAddressReserve", CUDA_ERROR_INVALID_CONTEXT, 0, size);
  int d = T.ctx;
  if (size == 0 || size % G.gran[d] || (align && align % G.gran[d]))
    return drv("cuMemAddressReserve", CUDA_ERROR_INVALID_VALUE, 0, size);
  uint64_t a = G.next_va[d];
  G.next_va[d] += size + G.gran[d]; /* a gap between reservations */
  VEC_PUSH(G.resv, ((fk_resv_t){a, size, d}));
  *ptr = (CUdeviceptr)a;
  return drv("cuMemAddressReserve", CUDA_SUCCESS, a, size);
}

FK_API CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size) {
  enter();
  DRV_INJECT("cuMemAddressFree");
  for (size_t i = 0; i < G.resv.n; i++) {
    if (G.resv.v[i].addr != ptr || G.resv.v[i].size != size) continue;
    for (size_t k = 0; k < G.maps.n; k++)
      if (G.maps.v[k].addr >= ptr && G.maps.v[k].addr < ptr + size)
        return drv("cuMemAddressFree", CUDA_ERROR_INVALID_VALUE, ptr, size);
    VEC_DEL(G.resv, i);
    return drv("cuMemAddressFree", CUDA_SUCCESS, ptr, size);
  }
  return drv("cuMemAddressFree", CUDA_ERROR_INVALID_VALUE, ptr, size);
}

FK_API CUresult cuMemCreate(CUmemGenericAllocationHandle *h, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags) {
  (void)flags;
  enter();
  DRV_INJECT("cuMemCreate");
  if (T.ctx < 0) return drv("cuMemCreate", CUDA_ERROR_INVALID_CONTEXT, 0, size);
  int d = prop ? prop->location.id : -1;
  if (d < 0 || d >= G.ndev) return drv("cuMemCreate", CUDA_ERROR_INVALID_DEVICE, 0, size);
  if (size == 0 || size % G.gran[d]) return drv("cuMemCreate", CUDA_ERROR_INVALID_VALUE, 0, size);
  if (size > G.capacity[d] - G.used[d] || G.used[d] > G.capacity[d])
    return drv("cuMemCreate", CUDA_ERROR_OUT_OF_MEMORY, 0, size);
  G.used[d] += size;
  uint64_t id = G.next_handle++;
  VEC_PUSH(G.handles, ((fk_handle_t){id, size, d, false, 0}));
  *h = (CUmemGenericAllocationHandle)id;
  return drv("cuMemCreate", CUDA_SUCCESS, id, size);
}

static fk_handle_t *handle_of(uint64_t id, size_t *at) {
  for (size_t i = 0; i < G.handles.n; i++)
    if (G.handles.v[i].id == id && !G.handles.v[i].released) {
      if (at) *at = i;
      return &G.handles.v[i];
    }
  return NULL;
}

static void handle_maybe_free(size_t i) {
  fk_handle_t *h = &G.handles.v[i];
  if (h->released && h->mapped == 0) {
    G.used[h->dev] -= h->size;
    VEC_DEL(G.handles, i);
  }
}

FK_API CUresult cuMemRelease(CUmemGenericAllocationHandle id) {
  enter();
  DRV_INJECT("cuMemRelease");
  size_t i;
  if (!handle_of((uint64_t)id, &i)) return drv("cuMemRelease", CUDA_ERROR_INVALID_VALUE, id, 0);
  G.handles.v[i].released = true;
  handle_maybe_free(i);
  return drv("cuMemRelease", CUDA_SUCCESS, id, 0);
}

FK_API CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle id, unsigned long long flags) {
  (void)flags;
  enter();
  DRV_INJECT("cuMemMap");
  if (T.ctx < 0) return drv("cuMemMap", CUDA_ERROR_INVALID_CONTEXT, ptr, size);
  fk_handle_t *h = handle_of((uint64_t)id, NULL);
  if (!h || offset != 0 || size != h->size)
    return drv("cuMemMap", CUDA_ERROR_INVALID_VALUE, ptr, size);
  bool inside = false;
  for (size_t i = 0; i < G.resv.n; i++)
    inside |= ptr >= G.resv.v[i].addr && ptr + size <= G.resv.v[i].addr + G.resv.v[i].size;
  for (size_t i = 0; inside && i < G.maps.n; i++)
    if (ptr < G.maps.v[i].addr + G.maps.v[i].size && G.maps.v[i].addr < ptr + size) inside = false;
  if (!inside) return drv("cuMemMap", CUDA_ERROR_INVALID_VALUE, ptr, size);
  h->mapped++;
  VEC_PUSH(G.maps, ((fk_map_t){ptr, size, id, h->dev, 0}));
  return drv("cuMemMap", CUDA_SUCCESS, ptr, size);
}

/* Whether the mappings tile [ptr, ptr+size) exactly (whole mappings, no gap). */
static bool maps_tile(CUdeviceptr ptr, size_t size) {
  CUdeviceptr at = ptr;
  while (at < ptr + size) {
    bool found = false;
    for (size_t i = 0; i < G.maps.n && !found; i++)
      if (G.maps.v[i].addr == at && at + G.maps.v[i].size <= ptr + size) {
        at += G.maps.v[i].size;
        found = true;
      }
    if (!found) return false;
  }
  return size > 0;
}

FK_API CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count) {
  enter();
  DRV_INJECT("cuMemSetAccess");
  if (T.ctx < 0) return drv("cuMemSetAccess", CUDA_ERROR_INVALID_CONTEXT, ptr, size);
  if (!maps_tile(ptr, size)) return drv("cuMemSetAccess", CUDA_ERROR_INVALID_VALUE, ptr, size);
  unsigned mask = 0;
  for (size_t k = 0; k < count; k++) {
    int d = desc[k].location.id;
    if (d < 0 || d >= G.ndev) return drv("cuMemSetAccess", CUDA_ERROR_INVALID_DEVICE, ptr, size);
    mask |= 1u << d;
  }
  for (size_t i = 0; i < G.maps.n; i++) {
    fk_map_t *m = &G.maps.v[i];
    if (m->addr < ptr || m->addr >= ptr + size) continue;
    for (int d = 0; d < G.ndev; d++)
      if ((mask >> d & 1) && d != m->dev && !G.peer[d][m->dev])
        return drv("cuMemSetAccess", CUDA_ERROR_INVALID_DEVICE, ptr, size);
  }
  for (size_t i = 0; i < G.maps.n; i++)
    if (G.maps.v[i].addr >= ptr && G.maps.v[i].addr < ptr + size) G.maps.v[i].access |= mask;
  return drv("cuMemSetAccess", CUDA_SUCCESS, ptr, size);
}

FK_API CUresult cuMemUnmap(CUdeviceptr ptr, size_t size) {
  enter();
  DRV_INJECT("cuMemUnmap");
  if (capture_violation())
    return drv("cuMemUnmap", CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, ptr, size);
  if (!maps_tile(ptr, size)) return drv("cuMemUnmap", CUDA_ERROR_INVALID_VALUE, ptr, size);
  for (size_t i = 0; i < G.maps.n;) {
    fk_map_t m = G.maps.v[i];
    if (m.addr >= ptr && m.addr < ptr + size) {
      VEC_DEL(G.maps, i);
      for (size_t k = 0; k < G.handles.n; k++)
        if (G.handles.v[k].id == m.handle) {
          G.handles.v[k].mapped--;
          handle_maybe_free(k);
          break;
        }
    } else {
      i++;
    }
  }
  return drv("cuMemUnmap", CUDA_SUCCESS, ptr, size);
}

/* ---- driver entry points ------------------------------------------------------------------- */

typedef struct {
  const char *name;
  void *fn;
} fk_sym_t;

static const fk_sym_t driver_symbols[] = {
    {"cuCtxGetCurrent", (void *)cuCtxGetCurrent},
    {"cuCtxSetCurrent", (void *)cuCtxSetCurrent},
    {"cuCtxGetDevice", (void *)cuCtxGetDevice},
    {"cuDeviceGetAttribute", (void *)cuDeviceGetAttribute},
    {"cuMemGetAllocationGranularity", (void *)cuMemGetAllocationGranularity},
    {"cuMemAddressReserve", (void *)cuMemAddressReserve},
    {"cuMemAddressFree", (void *)cuMemAddressFree},
    {"cuMemCreate", (void *)cuMemCreate},
    {"cuMemRelease", (void *)cuMemRelease},
    {"cuMemMap", (void *)cuMemMap},
    {"cuMemUnmap", (void *)cuMemUnmap},
    {"cuMemSetAccess", (void *)cuMemSetAccess},
    {"cuGetErrorName", (void *)cuGetErrorName},
    {"cuGetErrorString", (void *)cuGetErrorString},
};

FK_API cudaError_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                    unsigned int version, unsigned long long flags,
                                                    enum cudaDriverEntryPointQueryResult *status) {
  (void)version;
  (void)flags;
  enter();
  RT_INJECT("cudaGetDriverEntryPointByVersion");
  if (!symbol || !fn) return rt("cudaGetDriverEntryPointByVersion", cudaErrorInvalidValue, 0, 0);
  for (size_t i = 0; i < sizeof driver_symbols / sizeof *driver_symbols; i++) {
    if (strcmp(driver_symbols[i].name, symbol) == 0) {
      int inj;
      /* "cuX:missing" rules (any error) make one symbol absent, as on an old driver. */
      char key[64];
      snprintf(key, sizeof key, "%s:missing", symbol);
      if (injected(key, &inj)) break;
      *fn = driver_symbols[i].fn;
      if (status) *status = cudaDriverEntryPointSuccess;
      return rt("cudaGetDriverEntryPointByVersion", cudaSuccess, 0, 0);
    }
  }
  *fn = NULL;
  if (status) *status = cudaDriverEntryPointSymbolNotFound;
  return rt("cudaGetDriverEntryPointByVersion", cudaSuccess, 0, 0);
}
