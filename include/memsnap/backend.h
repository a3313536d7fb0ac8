/* SPDX-License-Identifier: MIT
 * memsnap: device backends, the table of device operations the caching allocator is built on.
 *
 * A backend is a table of function pointers (struct ms_backend_ops) plus an opaque context, so
 * that the simulated device ("sim", always built) and real GPUs ("cuda", built only when the CUDA
 * Toolkit is found) are interchangeable. The allocator calls nothing else on the device.
 *
 * Vocabulary:
 *  - device: an index 0 .. device_count-1. Every operation names its device explicitly (the
 *    backend switches device itself where the driver needs it).
 *  - ms_devptr_t: a device address. It is a number, never dereferenced by the library; on "sim"
 *    it is deterministic (see ms_sim_config_t), on "cuda" it is what cudaMalloc returned.
 *  - ms_stream_t: a raw stream handle (cudaStream_t on "cuda"). 0 is the device's default stream
 *    and always exists. The allocator keys its free-block pools by this number, as PyTorch does.
 *  - ms_event_t: a raw event handle; events are recorded on a stream and complete when the work
 *    queued on that stream before the record has finished.
 *
 * Contract of every operation in struct ms_backend_ops:
 *  - It returns 0 (MS_OK) on success or a negative enum ms_err. Out-parameters are never NULL and
 *    are written only on success.
 *  - malloc returns MS_EOOM exactly when the device is out of memory (cudaErrorMemoryAllocation):
 *    the allocator then frees cached memory and retries. Any other failure is another negative
 *    code (MS_EBACKEND, MS_EINVAL, MS_ENODEVICE ...), which the allocator reports without retrying.
 *  - Operations may be called from any thread, concurrently, for the same or different devices:
 *    a backend protects its own state.
 *  - The optional virtual-memory operations (va_reserve, va_release, mem_map, mem_unmap) may be
 *    NULL; they are needed only for expandable segments.
 *
 * Thread-safety: an ms_backend_t may be shared by any number of allocators and threads; it must
 * outlive every allocator that uses it. ms_backend_destroy is not thread-safe with other calls.
 */
#ifndef MEMSNAP_BACKEND_H
#define MEMSNAP_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"

MS_EXTERN_C_BEGIN

typedef uintptr_t ms_devptr_t; /* device address; 0 is "null" */
typedef uint64_t ms_stream_t;  /* raw stream handle; 0 = the default stream */
typedef uint64_t ms_event_t;   /* raw event handle */

typedef struct ms_backend_ops_s {
  const char *name; /* "sim", "cuda", ...; static storage */
  void *ctx;        /* passed as the first argument of every operation */

  /* *count = number of devices (>= 1 on success). */
  int (*device_count)(void *ctx, int *count);
  /* Allocates size (> 0) bytes on device, like cudaMalloc; *out = the address.
   * @return MS_EOOM if the device has not enough free memory; other negative codes for other
   * failures. `stream` is the stream the allocator is serving (informational, as cudaMalloc is
   * not stream-ordered). */
  int (*malloc)(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out);
  /* Frees an address returned by malloc on the same device (pre: not freed before). Like cudaFree
   * it may synchronize the device. On failure the memory is still allocated (the allocator keeps
   * it accounted and reports the error). */
  int (*free)(void *ctx, int device, ms_devptr_t ptr);
  /* Like cudaMemGetInfo: *free_bytes and *total_bytes of the device. */
  int (*mem_info)(void *ctx, int device, size_t *free_bytes, size_t *total_bytes);

  /* Streams. *out is a new non-zero handle. Destroying stream 0 is an error. */
  int (*stream_create)(void *ctx, int device, ms_stream_t *out);
  int (*stream_destroy)(void *ctx, int device, ms_stream_t stream);

  /* Events (created without timing, like cudaEventDisableTiming). */
  int (*event_create)(void *ctx, int device, ms_event_t *out);
  /* Records event on stream: it completes when the work queued on stream so far is done. */
  int (*event_record)(void *ctx, int device, ms_event_t event, ms_stream_t stream);
  /* *done = whether event has completed (an event never recorded counts as completed). */
  int (*event_query)(void *ctx, int device, ms_event_t event, bool *done);
  /* Blocks until event has completed. */
  int (*event_synchronize)(void *ctx, int device, ms_event_t event);
  int (*event_destroy)(void *ctx, int device, ms_event_t event);
  /* Blocks until all work on every stream of device has completed. */
  int (*device_synchronize)(void *ctx, int device);

  /* Optional virtual-memory operations for expandable segments (NULL when unsupported).
   * va_reserve reserves size bytes of address space (no memory); va_release returns it (pre: no
   * page mapped). mem_map backs [addr, addr+size) with one physical allocation (MS_EOOM exactly
   * when the device is out of memory; any other failure another code); mem_unmap releases the
   * memory of a range made of whole ranges previously mapped with mem_map (the allocator maps one
   * page of an expandable segment per call, so that any run of pages can be unmapped later).
   * Sizes and addresses are multiples of the granularity (mem_granularity, 2 MiB by default). A
   * failed mem_unmap leaves the range mapped. */
  int (*va_reserve)(void *ctx, int device, size_t size, ms_devptr_t *out);
  int (*va_release)(void *ctx, int device, ms_devptr_t addr, size_t size);
  int (*mem_map)(void *ctx, int device, ms_devptr_t addr, size_t size);
  int (*mem_unmap)(void *ctx, int device, ms_devptr_t addr, size_t size);

  /* Optional (NULL: streams are never captured). *capturing = whether stream is being captured
   * into a CUDA graph (cudaStreamIsCapturing: active, or invalidated but not yet ended);
   * *capture_id = that capture's unique non-zero id, 0 when not capturing. While a capture is
   * under way the allocator must not call event_query (illegal during capture: the queries are
   * deferred until no capture is under way), serves the capture's allocations from its private
   * pool and keeps that memory for replays (docs/pytorch-allocator.md, "Private pools and CUDA
   * graphs"). */
  int (*stream_capture_info)(void *ctx, int device, ms_stream_t stream, bool *capturing,
                             uint64_t *capture_id);

  /* Optional (NULL: the handle is the key). *key = the value the allocator keys its pools and
   * stream uses by for `stream` as named by the calling thread. Handles that name a different
   * stream on each thread (CUDA's cudaStreamPerThread) get a key unique to the real stream; two
   * handles of one stream (cudaStreamLegacy and 0) get the same key. Every other operation that
   * takes a stream accepts keys as well as handles. */
  int (*stream_key)(void *ctx, int device, ms_stream_t stream, ms_stream_t *key);

  /* Optional (NULL: any multiple of 2 MiB). *bytes = the device's allocation granularity for
   * mem_map: the page sizes of expandable segments must be multiples of it. */
  int (*mem_granularity)(void *ctx, int device, size_t *bytes);

  /* Releases ctx; called once by ms_backend_destroy. May be NULL. */
  void (*destroy)(void *ctx);
} ms_backend_ops_t;

/* A backend: a validated copy of an ops table. Opaque. */
typedef struct ms_backend_s ms_backend_t;

/* Wraps a caller-written ops table into a backend (the table is copied; ctx is owned by the new
 * backend from now on and released with ops->destroy by ms_backend_destroy).
 * @return MS_OK, MS_EINVAL if a required operation (everything except the va/mem and destroy
 * members) is NULL or name is NULL, MS_ENOMEM. On failure ctx is not released. */
MS_API MS_NODISCARD int ms_backend_create(const ms_backend_ops_t *ops, ms_backend_t **out);

/* Opens a backend by name: "sim" (a simulated device with the default ms_sim_config_t) or "cuda"
 * (only in builds with the CUDA Toolkit). eb (may be NULL) receives a one-line reason on failure.
 * @return MS_OK, MS_ENOTFOUND for an unknown name, MS_EUNSUPPORTED for "cuda" in a build without
 * CUDA, or the backend's own error (e.g. MS_ENODEVICE when no GPU is present). */
MS_API MS_NODISCARD int ms_backend_open(const char *name, ms_backend_t **out, ms_errbuf_t *eb);

/* Frees a backend (calls ops.destroy). Accepts NULL. pre: no allocator uses it any more. */
MS_API void ms_backend_destroy(ms_backend_t *b);

/* @return the backend's ops table (valid until ms_backend_destroy). */
MS_API const ms_backend_ops_t *ms_backend_ops(const ms_backend_t *b);
/* @return the backend's name. */
MS_API const char *ms_backend_name(const ms_backend_t *b);

/* The CUDA backend (lib/backend/cuda.c). In a build without CUDA this returns MS_EUNSUPPORTED. */
MS_API MS_NODISCARD int ms_backend_cuda_create(ms_backend_t **out, ms_errbuf_t *eb);

/* ---- the simulated device ("sim") --------------------------------------------------------- */

#define MS_SIM_MAX_DEVICES 64
/* Default capacity of each simulated device: 80 GiB (an H100/A100-80GB). */
#define MS_SIM_DEFAULT_CAPACITY ((size_t)80 << 30)
/* Device d's addresses start at MS_SIM_BASE_ADDRESS + d * MS_SIM_DEVICE_STRIDE. */
#define MS_SIM_BASE_ADDRESS ((ms_devptr_t)0x7f0000000000ULL)
#define MS_SIM_DEVICE_STRIDE ((ms_devptr_t)1 << 44)
/* Addresses handed out by malloc are multiples of this (cudaMalloc aligns to at least 512 B;
 * the sim keeps segments on 2 MiB pages so that addresses look like a GPU's). */
#define MS_SIM_ALIGNMENT ((size_t)2 << 20)

typedef struct ms_sim_config_s {
  int ndevices;              /* number of devices, 1..MS_SIM_MAX_DEVICES; 0 = 1 */
  size_t capacity;           /* bytes per device; 0 = MS_SIM_DEFAULT_CAPACITY */
  bool host_memory;          /* back every allocation with host memory (ms_sim_host_ptr) */
  bool auto_complete_events; /* every recorded event completes at once */
  size_t log_capacity;       /* keep the last N calls in the call log; 0 = no log */
} ms_sim_config_t;

/* Creates a simulated device backend. cfg may be NULL (defaults: 1 device of 80 GiB, no host
 * memory, events completed by the program, no log).
 *
 * Behaviour: malloc is cudaMalloc-like: it fails with MS_EOOM when size exceeds the device's free
 * bytes (capacity minus live allocations; the address space never fragments, since CUDA remaps
 * pages). Addresses are deterministic: the lowest free MS_SIM_ALIGNMENT-aligned range of the
 * device's window that fits (so, like the CUDA driver, freed ranges are reused), unless an address
 * was forced with ms_sim_set_next_address. Streams get handles 1, 2, 3, ... per device in creation
 * order. An event recorded on a stream completes when the program marks the stream's work done
 * (ms_sim_stream_complete / ms_sim_event_complete), on event_synchronize / device_synchronize, or
 * at once in auto-complete mode. */
MS_API MS_NODISCARD int ms_backend_sim_create(const ms_sim_config_t *cfg, ms_backend_t **out);

/* @return whether b is a simulated device (the ms_sim_* calls below need one: on another
 * backend they return MS_EINVAL). */
MS_API bool ms_backend_is_sim(const ms_backend_t *b);

/* Call counters of one simulated device (every operation of the ops table is counted, failed
 * calls included). */
typedef struct ms_sim_counters_s {
  uint64_t mallocs;        /* malloc calls */
  uint64_t malloc_ooms;    /* ... of which failed with MS_EOOM (real or injected) */
  uint64_t frees;
  uint64_t mem_infos;
  uint64_t stream_creates;
  uint64_t stream_destroys;
  uint64_t event_creates;
  uint64_t event_records;
  uint64_t event_queries;
  uint64_t event_syncs;    /* event_synchronize calls */
  uint64_t event_destroys;
  uint64_t device_syncs;   /* device_synchronize calls */
  uint64_t va_reserves;
  uint64_t va_releases;
  uint64_t mem_maps;
  uint64_t mem_unmaps;
  size_t used_bytes;       /* bytes currently allocated (malloc + mapped) */
  size_t peak_used_bytes;
  size_t live_allocations; /* malloc'd ranges not freed yet */
} ms_sim_counters_t;

MS_API int ms_sim_get_counters(const ms_backend_t *b, int device, ms_sim_counters_t *out);
/* Zeroes the call counters of device (used_bytes and live_allocations are state, kept). */
MS_API int ms_sim_reset_counters(ms_backend_t *b, int device);

/* The call log: one entry per operation, in call order, across devices. */
typedef enum ms_sim_op {
  MS_SIM_OP_MALLOC = 0,
  MS_SIM_OP_FREE,
  MS_SIM_OP_MEM_INFO,
  MS_SIM_OP_STREAM_CREATE,
  MS_SIM_OP_STREAM_DESTROY,
  MS_SIM_OP_EVENT_CREATE,
  MS_SIM_OP_EVENT_RECORD,
  MS_SIM_OP_EVENT_QUERY,
  MS_SIM_OP_EVENT_SYNCHRONIZE,
  MS_SIM_OP_EVENT_DESTROY,
  MS_SIM_OP_DEVICE_SYNCHRONIZE,
  MS_SIM_OP_VA_RESERVE,
  MS_SIM_OP_VA_RELEASE,
  MS_SIM_OP_MEM_MAP,
  MS_SIM_OP_MEM_UNMAP,
  MS_SIM_OP_COUNT
} ms_sim_op;

typedef struct ms_sim_call_s {
  ms_sim_op op;
  int device;
  int result;       /* what the call returned (MS_OK, MS_EOOM, ...) */
  uint64_t addr;    /* address (malloc: the result; free/map/unmap: the argument), else 0 */
  uint64_t size;    /* size argument, else 0 */
  uint64_t handle;  /* stream or event handle, else 0 */
} ms_sim_call_t;

/* @return the lowercase name of op ("malloc", "free", "event_query", ...). */
MS_API const char *ms_sim_op_name(ms_sim_op op);
/* Copies up to cap of the logged calls, oldest first, into dst; *n = number copied. The log keeps
 * the last cfg.log_capacity calls. */
MS_API int ms_sim_get_log(const ms_backend_t *b, ms_sim_call_t *dst, size_t cap, size_t *n);
MS_API int ms_sim_clear_log(ms_backend_t *b);

/* Sets device's capacity in bytes (may be below what is in use: then every malloc fails). */
MS_API int ms_sim_set_capacity(ms_backend_t *b, int device, size_t capacity);
/* Fault injection: the nth device allocation (malloc or mem_map) on device from now on fails
 * with MS_EOOM (n = 1: the next one); n = 0 cancels. One-shot. */
MS_API int ms_sim_fail_nth_malloc(ms_backend_t *b, int device, uint64_t n);
/* Makes the next malloc on device return addr (for replaying recorded traces). The range must
 * not overlap a live allocation (else that malloc fails with MS_EBACKEND); capacity is still
 * enforced. One-shot; ms_sim_set_next_address(b, d, 0) cancels. */
MS_API int ms_sim_set_next_address(ms_backend_t *b, int device, ms_devptr_t addr);
/* Switches the auto-complete mode of events on or off (all devices). */
MS_API int ms_sim_set_auto_complete(ms_backend_t *b, bool on);
/* Marks all work queued so far on stream of device done: every event recorded on it completes. */
MS_API int ms_sim_stream_complete(ms_backend_t *b, int device, ms_stream_t stream);
/* Completes event and every event recorded before it on the same stream (streams are FIFO). */
MS_API int ms_sim_event_complete(ms_backend_t *b, int device, ms_event_t event);
/* *done = whether event has completed, without counting a query. */
MS_API int ms_sim_event_is_complete(const ms_backend_t *b, int device, ms_event_t event,
                                    bool *done);
/* With host_memory: *out = host address of device address ptr (anywhere inside a live
 * allocation). @return MS_ENOTFOUND if ptr is in no live allocation, MS_EUNSUPPORTED without
 * host_memory. */
MS_API int ms_sim_host_ptr(const ms_backend_t *b, int device, ms_devptr_t ptr, void **out);

MS_EXTERN_C_END

#endif /* MEMSNAP_BACKEND_H */
