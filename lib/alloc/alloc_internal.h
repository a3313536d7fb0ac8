/* SPDX-License-Identifier: MIT
 * memsnap core: the allocator's internal API for other modules of lib/ (never installed):
 * history hooks, the snapshot walker, the invariant checker used by tests.
 *
 * Locking: every function here takes the allocator's mutex itself, except where stated. None may
 * be called from a hook or callback that already runs under that lock (the mutex is not
 * recursive).
 */
#ifndef MEMSNAP_LIB_ALLOC_INTERNAL_H
#define MEMSNAP_LIB_ALLOC_INTERNAL_H

#include <stdint.h>

#include "alloc/hooks.h"
#include "memsnap/allocator.h"
#include "model/snapbuild.h"

/* ---- "allocator.c" --------------------------------------------------------------------------- */

/* Installs (or, with NULL, removes) the history hooks. hooks is borrowed and must stay valid and
 * unchanged (except its context_level and trace_enabled fields, read at each call) until it is
 * replaced or the allocator is destroyed; ms_allocator_destroy calls hooks->release(hooks->ctx)
 * (when not NULL) outside the lock, after the last trace entry, so the owner can free them there.
 *
 * Where the allocator calls them (docs/pytorch-allocator.md, "Trace entries"):
 *  - gather, OUTSIDE the lock: at malloc when context_level >= MS__CTX_STATE; at free and
 *    empty_cache when context_level >= MS__CTX_ALL.
 *  - trace, UNDER the lock, when trace_enabled: alloc (alloc_found_block), free_requested (free),
 *    free_completed (free_block, address before merging), segment_alloc (device malloc),
 *    segment_free (device free of a cached segment), oom (addr = device free bytes, size = rounded
 *    request), snapshot (from ms__allocator_snapshot). The entry's ctx follows "Trace entries"
 *    (the call's context, else the block's allocation context, else the segment's) and is 0
 *    unless context_level >= MS__CTX_ALLOC, as PyTorch's record_trace does.
 * Blocks keep the malloc context as their allocation context, and the head block of a segment
 * keeps the context of the malloc that created the segment. */
void ms__allocator_set_hooks(ms_allocator_t *a, const ms__alloc_hooks_t *hooks);
/* @return the hooks installed (NULL if none). */
const ms__alloc_hooks_t *ms__allocator_get_hooks(ms_allocator_t *a);

/* Maps a context id to a stack index of the builder (MS_SNAP_NO_STACK allowed). Called under the
 * allocator's lock. @return MS_OK or an error that aborts the walk. */
typedef int ms__ctx_to_stack_fn(void *arg, uint32_t ctx, uint32_t *stack);

/* What ms__allocator_snapshot reports besides segments. */
typedef struct ms__alloc_snapinfo_s {
  int device;          /* the allocator's device */
  uint64_t capacity;   /* the device's total bytes (backend mem_info) */
  uint32_t first_stat; /* the flat statistics appended: b->stats[first_stat ..+ nstats) */
  uint32_t nstats;     /* MS_STATS_NKEYS */
} ms__alloc_snapinfo_t;

/* Under the lock, appends to b, as PyTorch's snapshot() ("Snapshot fields"):
 *  - every segment of the device (default and private pools), sorted by address, with its blocks
 *    in address order: state active_allocated (allocated), active_pending_free (freed but waiting
 *    on stream events) or inactive; size, requested_size (of the last allocation, also kept on
 *    inactive blocks), the allocation stack (ctx_to_stack of the block's context; inactive blocks
 *    get MS_SNAP_NO_STACK); segment totals (allocated/active/requested), stream, is_large
 *    (segment_type), pool id, the segment stack (ctx of the head block's segment context);
 *    present bits as a PyTorch 2.1+ snapshot has them;
 *  - the MS_STATS_NKEYS flat statistics (ms_stats_flat names, MS_SNAP_VAL_INT values);
 * and records a `snapshot` trace entry (size = total active bytes). ctx_to_stack may be NULL
 * (then no stacks). info may be NULL. @return MS_OK or the builder's / callback's error. */
int ms__allocator_snapshot(ms_allocator_t *a, ms__snapbuild_t *b, ms__ctx_to_stack_fn *ctx_to_stack,
                           void *arg, ms__alloc_snapinfo_t *info);

/* Appends the allocator_settings entries ("Snapshot fields", PyTorch's keys):
 * PYTORCH_CUDA_ALLOC_CONF (the last parsed string), max_split_size (-1 when unlimited, as PyTorch reports SIZE_MAX
 * through int64), garbage_collection_threshold, expandable_segments,
 * pinned_num_register_threads, release_lock_on_cudamalloc, pinned_use_cuda_host_register,
 * graph_capture_record_stream_reuse, and roundup_power2_divisions as a map "1", "2", "4", ...
 * "32768" -> divisions. @return MS_OK or the builder's error. */
int ms__allocator_snapshot_settings(ms_allocator_t *a, ms__snapbuild_t *b);

/* Checks every invariant of the allocator's state against a recomputation (used by the
 * model-based tests and, at MS_DEBUG >= 3, after operations):
 *  - the blocks of each segment tile it exactly (address-contiguous, linked both ways), share its
 *    stream and pool, and no two free mergeable neighbours stay unmerged;
 *  - each block is in exactly one place: a pool's free set (free, no events, no stream uses) or
 *    the active set (allocated, or pending on events), and the pointer map finds exactly the
 *    allocated ones; free sets are ordered by (stream, size, address);
 *  - every statistic (current values) equals its recomputation from the blocks and segments.
 * @return MS_OK, or MS_ESTATE with the first violation described in eb. */
int ms__allocator_check(ms_allocator_t *a, ms_errbuf_t *eb);

/* Totals used by tests: number of segments, of blocks, of pending (event-waiting) blocks, and of
 * outstanding backend events. */
typedef struct ms__alloc_counts_s {
  size_t segments;
  size_t blocks;
  size_t free_blocks;
  size_t pending_blocks;
  size_t outstanding_events;
  size_t private_pools;
} ms__alloc_counts_t;
void ms__allocator_counts(ms_allocator_t *a, ms__alloc_counts_t *out);

/* ---- replay support (lib/replay.c; defined in "allocator.c") ------------------------------------
 * Entry points that `memsnap replay` needs to drive the allocator from a recorded trace
 * (docs/replay.md, "`--check`", "Traces that began mid-run"). They take the allocator's mutex
 * like every public call. */

/* Test-only mutations of PyTorch's rules. The replay tests set one to prove that `memsnap replay
 * --check` fails with a wrong rule. The checks and the variable exist only in the copy of
 * allocator.c that the replay tests compile with MS_TEST_MUTATIONS (tests/CMakeLists.txt); the
 * library has neither. */
enum ms__alloc_mutation {
  MS__MUT_NONE = 0,
  MS__MUT_TIEBREAK_HIGH = 1, /* best fit takes the highest address among equal sizes */
  MS__MUT_SPLIT_GE = 2,      /* large pool splits when the remainder is >= 1 MiB (not >) */
  MS__MUT_ROUND_1024 = 3,    /* sizes round to multiples of 1024 B (not 512 B) */
};
extern int ms__alloc_test_mutation;

/* process_events (a malloc's first step) now: the blocks whose record_stream events the backend
 * reports complete return to their pools. @return the backend's error of a failed query. */
int ms__allocator_replay_process_events(ms_allocator_t *a);

/* One block of a segment placed by ms__allocator_replay_add_segment. */
typedef struct ms__replay_block_s {
  size_t size;      /* bytes, multiple of 512 */
  size_t requested; /* the client's size (allocated and pending blocks) */
  int state;        /* 0 free, 1 allocated (a pending block is placed allocated, then freed
                       after a record_stream, so that it waits on a real event) */
} ms__replay_block_t;

/* Places a segment that existed before a trace began: [ptr, ptr+size) on stream, in the default
 * small (is_small) or large pool, tiled by blocks[0..n) in address order (sizes add up to size;
 * no two free blocks adjacent). Statistics count it as if the allocator had made it (without
 * num_device_alloc). The backend is not called: the caller's backend must already consider the
 * range allocated. @return MS_OK, MS_EINVAL (bad tiling) or MS_ENOMEM. */
int ms__allocator_replay_add_segment(ms_allocator_t *a, uintptr_t ptr, size_t size,
                                     ms_stream_t stream, bool is_small,
                                     ms__replay_block_t *blocks, size_t n);

/* Whether a malloc of size on stream would be served from the cache (get_free_block's answer,
 * without taking the block): a recorded release burst before such a malloc cannot have been
 * caused by it. */
bool ms__allocator_replay_would_fit(ms_allocator_t *a, size_t size, ms_stream_t stream);

/* Whether release_available_cached_blocks, for a malloc of size on stream that the cache and the
 * device refused, would release a cached block now (its selection, nothing released); false
 * without max_split_size_mb, where it never releases. */
bool ms__allocator_replay_would_release(ms_allocator_t *a, size_t size, ms_stream_t stream);

/* The segments that release_cached_blocks would release (whole free segments of the default
 * pools, expandable ones left out) once the blocks waiting on events[0..n) were freed: those
 * cached now and those the completions would make whole. SIZE_MAX when memory ran out. */
size_t ms__allocator_replay_cached_after(ms_allocator_t *a, const uint64_t *events, size_t n);

/* Current reserved and allocated bytes (all pools), cheaply. */
void ms__allocator_replay_usage(ms_allocator_t *a, size_t *reserved, size_t *allocated,
                                size_t *requested);

#endif /* MEMSNAP_LIB_ALLOC_INTERNAL_H */
