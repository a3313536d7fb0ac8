/* SPDX-License-Identifier: MIT
 * memsnap: the caching device-memory allocator, PyTorch's native CUDA caching allocator in C
 * (docs/pytorch-allocator.md; memsnap's decisions: docs/allocator.md).
 *
 * Vocabulary:
 *  - segment: one range obtained from the device backend (one backend malloc).
 *  - block: a sub-range of a segment, allocated to a client or free (cached). The blocks of a
 *    segment tile it exactly; two free neighbours are always merged.
 *  - pools: free blocks live in the small pool (rounded size <= 1 MiB, 2 MiB segments) or the
 *    large pool, or in a private pool (ms_pool_id_t) while allocations are routed to one.
 *  - stream: blocks are reused only on the stream they were allocated on; a block used on other
 *    streams (ms_allocator_record_stream) returns to its pool only when events recorded on those
 *    streams at free time have completed.
 *
 * One allocator serves one device of one backend. Every public call takes the allocator's mutex,
 * so any number of threads may call any function on the same allocator concurrently, except
 * ms_allocator_destroy. Callbacks (OOM observers, free-memory callbacks, pool filters) are
 * documented with the lock state they run in.
 */
#ifndef MEMSNAP_ALLOCATOR_H
#define MEMSNAP_ALLOCATOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/backend.h"
#include "memsnap/common.h"
#include "memsnap/config.h"
#include "memsnap/error.h"
#include "memsnap/stats.h"

MS_EXTERN_C_BEGIN

typedef struct ms_allocator_s ms_allocator_t;

/* A private pool id, PyTorch's MempoolId_t. (0,0) = the default pools. Ids of graph captures are
 * (n, 0), ids of memory pools (0, n), n >= 1 (ms_allocator_new_pool_id). */
typedef struct ms_pool_id_s {
  int64_t first;
  int64_t second;
} ms_pool_id_t;

typedef struct ms_allocator_config_s {
  ms_backend_t *backend;          /* required; borrowed, must outlive the allocator */
  int device;                     /* device index of the backend; default 0 */
  /* Allocator settings; NULL = PyTorch's defaults with MEMSNAP_ALLOC_CONF applied (a bad
   * MEMSNAP_ALLOC_CONF makes create fail with MS_ECONFIG). Copied at creation. */
  const ms_alloc_config_t *alloc;
  /* Caching disabled (PyTorch's PYTORCH_NO_CUDA_MEMORY_CACHING): every malloc is one backend
   * malloc and every free one device synchronize (as cudaFree's) and one backend free; nothing is
   * cached, counted in the statistics, traced or shown in snapshots, and an out-of-memory is the
   * backend's MS_EOOM without the OOM chain, message or observers. When alloc is NULL, also
   * turned on by the environment variable MEMSNAP_NO_CACHING set to 1, true, yes or on (any
   * case). */
  bool no_caching;
} ms_allocator_config_t;

/* Creates an allocator for cfg->device of cfg->backend. eb (may be NULL) receives the reason of
 * a failure (e.g. the configuration error).
 * @return MS_OK, MS_EINVAL (no backend), MS_ENODEVICE, MS_ECONFIG, MS_ENOMEM. */
MS_API MS_NODISCARD int ms_allocator_create(const ms_allocator_config_t *cfg,
                                            ms_allocator_t **out, ms_errbuf_t *eb);

/* Returns every cached segment to the backend, and frees the allocator. Blocks still allocated
 * are leaked on the device (their segments are not freed); events still pending are synchronized.
 * Accepts NULL. Not thread-safe: no other call may be running or follow. */
MS_API void ms_allocator_destroy(ms_allocator_t *a);

/* @return the device index served by a. */
MS_API int ms_allocator_device(const ms_allocator_t *a);

/* Allocates size bytes for use on stream (0 = default stream), PyTorch's malloc: round the
 * size, best fit in the pool of that stream, else a new segment, else the OOM chain (free-memory
 * callbacks, garbage collection, release of oversize cached segments, synchronize and release all
 * cached segments, retry). size == 0 gives *out = 0 and MS_OK without touching the allocator.
 * @return MS_OK; MS_EOOM when the device memory is exhausted (the message of PyTorch's
 * OutOfMemoryError is then available from ms_allocator_last_oom_message, and every OOM observer
 * has been called); MS_EBACKEND (or the backend's code) when the device failed otherwise, also
 * when a free, unmap or event call of the OOM chain or of the pending-event processing failed
 * (never reported as an OOM; what could not be freed stays cached and accounted). */
MS_API MS_NODISCARD int ms_allocator_malloc(ms_allocator_t *a, size_t size, ms_stream_t stream,
                                            ms_devptr_t *out);

/* Frees ptr (from ms_allocator_malloc of this allocator). 0 is a no-op. The memory returns to the
 * cache at once, or once the events of its other streams have completed (record_stream).
 * @return MS_OK, MS_EINVAL ("invalid device pointer") for an unknown pointer, or the backend's
 * error when a stream event could not be recorded: the block is freed for the program but stays
 * pending (never reused) and the record is retried at a later malloc. */
MS_API int ms_allocator_free(ms_allocator_t *a, ms_devptr_t ptr);

/* Marks ptr (an allocated block) as used on stream too (PyTorch's recordStream): when it is
 * freed, its memory is reused only after the work queued on stream at free time is done. The
 * block's own stream is ignored. @return MS_OK, or MS_EINVAL for an unknown pointer. */
MS_API int ms_allocator_record_stream(ms_allocator_t *a, ms_devptr_t ptr, ms_stream_t stream);

/* PyTorch's emptyCache: synchronizes all pending events, returns every unsplit cached
 * segment of the default pools to the device, and frees the cached segments of released private
 * pools. While a graph capture may be under way (a private-pool routing is active, or the backend
 * reports a capture) it does nothing and returns MS_OK: freeing or synchronizing would invalidate
 * the capture. @return MS_OK or the first backend error (a failed free, unmap or event
 * synchronization: that memory stays cached and accounted; what was released before stays
 * released). */
MS_API int ms_allocator_empty_cache(ms_allocator_t *a);

/* Copies the statistics into *out (pre: out initialised by ms_stats_init or MS_STATS_INIT).
 * @return MS_OK, or MS_EVERSION if out's size/version differ from the library's. */
MS_API int ms_allocator_get_stats(ms_allocator_t *a, ms_stats_t *out);
/* PyTorch's resetPeakStats / resetAccumulatedStats. */
MS_API void ms_allocator_reset_peak(ms_allocator_t *a);
MS_API void ms_allocator_reset_accumulated(ms_allocator_t *a);

/* torch.cuda.memory_summary() text of this allocator (see ms_stats_memory_summary).
 * @return MS_OK with *out to free with ms_stats_text_free, or MS_ENOMEM. */
MS_API MS_NODISCARD int ms_allocator_memory_summary(ms_allocator_t *a, bool abbreviated,
                                                    char **out);

/* PyTorch's setMemoryFraction: 0 <= fraction <= 1; below 1 the allocator keeps at most
 * fraction * device total bytes of segments (this also enables garbage_collection_threshold).
 * @return MS_OK, MS_EINVAL for a fraction outside [0, 1] (eb: "invalid fraction:<f>. Please set
 * within [0, 1]."), or the backend's error from mem_info. */
MS_API int ms_allocator_set_memory_fraction(ms_allocator_t *a, double fraction, ms_errbuf_t *eb);

/* The allocator's settings (a copy of what it was created with). */
MS_API void ms_allocator_get_config(ms_allocator_t *a, ms_alloc_config_t *out);

/* Largest free cached block across all pools (PyTorch's cacheInfo), in bytes; with nothing
 * cached, the device's free bytes from the backend's mem_info (as cacheInfo falls back to
 * cudaMemGetInfo), 0 if that fails. */
MS_API size_t ms_allocator_largest_free_block(ms_allocator_t *a);

/* ---- out of memory ----------------------------------------------------------------------- */

/* Called on every OOM, after num_ooms is counted and before the failing malloc returns, OUTSIDE the
 * allocator's lock (an observer may call this allocator, e.g. take a snapshot), on the thread of
 * the failing malloc. Arguments as PyTorch's ("OOM observers"): device, the segment size the
 * allocator tried to obtain, the memory limit (fraction * total when a fraction < 1 is set, else
 * the device's total) and the device's free bytes. */
typedef void ms_oom_observer_fn(void *arg, int device, size_t alloc_size, size_t device_total,
                                size_t device_free);
/* Registers an observer (called in registration order). @return MS_OK or MS_ENOMEM. */
MS_API int ms_allocator_attach_oom_observer(ms_allocator_t *a, ms_oom_observer_fn *fn, void *arg);

/* Free-memory callbacks (PyTorch's FreeCudaMemoryCallbacksRegistry): run in the OOM chain when no
 * cached block fits; each returns whether it freed something (then the pool is searched again).
 * They run with the allocator's lock released, so they may call this allocator (empty_cache,
 * free, even malloc); the pool is searched again afterwards. */
typedef bool ms_free_memory_fn(void *arg);
MS_API int ms_allocator_add_free_memory_callback(ms_allocator_t *a, ms_free_memory_fn *fn,
                                                 void *arg);

/* Copies the message of the last OOM of this allocator (PyTorch's OutOfMemoryError text with
 * memsnap and MEMSNAP_ALLOC_CONF named, "The OOM error") into dst (NUL-terminated, truncated
 * to cap). @return its full length (0 if there was no OOM). */
MS_API size_t ms_allocator_last_oom_message(ms_allocator_t *a, char *dst, size_t cap);

/* ---- private pools (CUDA graphs, MemPool; "Private pools and CUDA graphs") ------------------- */

/* Decides whether an allocation on stream goes to the pool being recorded to. Called UNDER the
 * allocator's lock, on the allocating thread, for every malloc while a routing is active. */
typedef bool ms_pool_filter_fn(void *arg, ms_stream_t stream);

/* A new unique id: graph ids (n, 0) when is_graph, MemPool ids (0, n) otherwise. Thread-safe
 * (process-wide counters, as PyTorch's). */
MS_API ms_pool_id_t ms_pool_id_new(bool is_graph);

/* PyTorch's beginAllocateToPool: creates the private pool id (or takes one more reference to it)
 * and routes to it every malloc whose stream the filter accepts (filter NULL: every malloc), most
 * recent routing first. @return MS_OK, MS_EINVAL for the id (0,0), MS_ESTATE if id is already
 * being recorded to ("beginAllocateToPool: already recording to mempool_id"), MS_ENOMEM. */
MS_API int ms_allocator_begin_allocate_to_pool(ms_allocator_t *a, ms_pool_id_t id,
                                               ms_pool_filter_fn *filter, void *arg);
/* PyTorch's endAllocateToPool. @return MS_OK or MS_ESTATE if id is not being recorded to. */
MS_API int ms_allocator_end_allocate_to_pool(ms_allocator_t *a, ms_pool_id_t id);
/* PyTorch's releasePool: drops one reference; at zero the pool's cached segments are returned at
 * the next empty_cache (and the pool disappears once it holds no segment). Blocks still allocated
 * from the pool stay valid and return to it when freed. @return MS_OK or MS_ENOTFOUND. */
MS_API int ms_allocator_release_pool(ms_allocator_t *a, ms_pool_id_t id);
/* Options of a private pool (torch.cuda.MemPool(use_on_oom=..., no_split=...), "Private pools and
 * CUDA graphs"). */
typedef struct ms_pool_options_s {
  /* A malloc routed to the default pools that finds no cached block and cannot get a new segment
   * takes a cached block of this pool (best fit, never a new segment) before releasing cached
   * memory: after the first failed device malloc, before release_available_cached_blocks.
   * Several such pools are tried in increasing id order. A released pool is not tried. */
  bool use_on_oom;
  /* Blocks of this pool are never split: an allocation takes a whole cached block (or a whole
   * new segment). */
  bool no_split;
} ms_pool_options_t;

/* Sets the options of private pool id (PyTorch's setUseOnOOM / setNoSplit, which MemPool calls at
 * creation). They belong to the id: given before the pool exists (ms_allocator_begin_allocate_to_
 * pool creates it) or while it exists, they hold until changed; all false removes them.
 * @return MS_OK, MS_EINVAL (NULL opts, or the id (0,0)), MS_ENOMEM. */
MS_API int ms_allocator_set_pool_options(ms_allocator_t *a, ms_pool_id_t id,
                                         const ms_pool_options_t *opts);

/* PyTorch's emptyCache(pool id): for a released pool, synchronizes its events and returns its
 * cached segments. @return MS_OK or a backend error. */
MS_API int ms_allocator_empty_pool_cache(ms_allocator_t *a, ms_pool_id_t id);

MS_EXTERN_C_END

#endif /* MEMSNAP_ALLOCATOR_H */
