/* SPDX-License-Identifier: MIT
 * memsnap: allocation history, snapshots of the allocator, and OOM snapshots (docs/history.md).
 *
 * The model is PyTorch's torch.cuda.memory._record_memory_history() and _snapshot()
 * (docs/pytorch-allocator.md, "History, trace entries and snapshots"):
 *  - what to record: nothing, the state (each live block remembers the stack that allocated it),
 *    or the state and a trace (a per-device ring buffer of allocator events: alloc,
 *    free_requested, free_completed, segment_alloc, segment_free, oom, snapshot);
 *  - which stacks to keep (PyTorch's `context`): none, the stacks of live blocks (state), those and
 *    the stacks of alloc events (alloc), or also stacks at free and empty_cache (all).
 * Stacks are raw return addresses (backtrace(3), or a frame-pointer walk that falls back to
 * backtrace(3)), interned once per distinct stack, and symbolised ({name, filename, line},
 * innermost first) only when a snapshot is taken, once per distinct address. The allocator's own
 * frames are left out.
 *
 * Recording can be switched on, changed and switched off at any time; blocks allocated while
 * stacks were off show no stack (MS_SNAP_NO_STACK), as in PyTorch.
 *
 * Thread-safety: every function here may be called from any thread, concurrently with the
 * allocator's own functions on the same allocator (except ms_allocator_destroy).
 */
#ifndef MEMSNAP_HISTORY_H
#define MEMSNAP_HISTORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/allocator.h"
#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/snapshot.h"

MS_EXTERN_C_BEGIN

/* PyTorch's `enabled`: None, "state", "all". */
typedef enum ms_history_record {
  MS_HISTORY_OFF = 0,   /* record nothing (and clear the trace, as PyTorch does) */
  MS_HISTORY_STATE = 1, /* per-block stacks only, no trace */
  MS_HISTORY_ALL = 2,   /* per-block stacks and the trace ring buffer */
} ms_history_record;

/* PyTorch's `context` (RecordContext): which events keep a stack. */
typedef enum ms_history_context {
  MS_CONTEXT_NONE = 0,  /* no stacks at all */
  MS_CONTEXT_STATE = 1, /* stacks of live blocks (and segments) */
  MS_CONTEXT_ALLOC = 2, /* and of alloc / segment_alloc / oom trace entries */
  MS_CONTEXT_ALL = 3,   /* and of free_requested, free_completed, segment_free (stacks at free) */
} ms_history_context;

/* How stacks are captured. */
typedef enum ms_unwinder {
  /* glibc backtrace(3): works for any build, about 0.1 us per frame. */
  MS_UNWIND_BACKTRACE = 0,
  /* Frame-pointer walk, about 1 ns per frame, for programs built with -fno-omit-frame-pointer;
   * a stack whose frame chain looks broken is taken with backtrace(3) instead. */
  MS_UNWIND_FRAME_POINTER = 1,
} ms_unwinder;

/* The deepest stack recorded. */
#define MS_HISTORY_MAX_FRAMES 128

typedef struct ms_history_config_s {
  ms_history_record enabled;  /* default MS_HISTORY_ALL */
  ms_history_context context; /* default MS_CONTEXT_ALL */
  /* Capacity of each device's trace ring buffer, in entries (56 bytes each); older entries are
   * dropped (and counted) when it is full. PyTorch's default is unbounded; ours 1,000,000
   * (56 MB). MS_HISTORY_STATE ignores it (no trace). Must be >= 1. */
  size_t max_entries;
  /* Frames kept per stack, counted from the allocator's caller outwards, 1..MS_HISTORY_MAX_FRAMES;
   * default 32. */
  unsigned max_frames;
  ms_unwinder unwinder;       /* default MS_UNWIND_BACKTRACE */
  bool clear_history;         /* empty the trace ring buffer now (PyTorch's clear_history) */
} ms_history_config_t;

/* Fills *cfg with the defaults above (state + trace, context all, 1,000,000 entries, 32 frames,
 * backtrace(3)). pre: cfg != NULL. */
MS_API void ms_history_config_init(ms_history_config_t *cfg);

/* Starts, changes or stops recording on allocator a (its device), like
 * torch.cuda.memory._record_memory_history(enabled, context, max_entries, device).
 * cfg == NULL means the defaults. MS_HISTORY_OFF stops recording and clears the trace; stacks
 * already attached to live blocks stay (they are shown in later snapshots). Changing max_entries
 * keeps the newest entries that fit.
 * The first call loads backtrace(3)'s unwinder (libgcc) so that no capture ever does.
 * @return MS_OK, MS_EINVAL (a value out of range, with a reason in eb; nothing changes), or
 * MS_ENOMEM. */
MS_API MS_NODISCARD int ms_allocator_record_history(ms_allocator_t *a,
                                                    const ms_history_config_t *cfg,
                                                    ms_errbuf_t *eb);

/* Sets the rank stored in later snapshots of this process (distributed jobs); a negative value
 * removes it. Without a call, the environment variable RANK (an integer) is used when set. */
MS_API void ms_snapshot_set_rank(int64_t rank);

/* Takes a snapshot of n allocators (typically one per device) into a new ms_snapshot_t, like
 * torch.cuda.memory._snapshot(): segments and blocks with their stacks (symbolised now), one
 * device entry per allocator with its trace (oldest first, wrapped entries counted in
 * trace_dropped), capacity and statistics (PyTorch's flat keys), the allocator settings of the
 * first allocator, and the process id, host name, rank (see ms_snapshot_set_rank) and time.
 * Records a `snapshot` entry in each recording allocator's trace, as PyTorch does.
 * Allocators without recording give segments without stacks and an empty trace.
 * pre: n >= 1, allocs[i] distinct. The snapshot is freed with ms_snapshot_free().
 * @return MS_OK, MS_EINVAL, MS_ENOMEM or MS_ELIMIT (eb says which); *out untouched on failure. */
MS_API MS_NODISCARD int ms_allocator_snapshot(ms_allocator_t *const *allocs, size_t n,
                                              ms_snapshot_t **out, ms_errbuf_t *eb);

/* Writes a snapshot of a to path now, in one call, like PyTorch's
 * torch.cuda.memory._dump_snapshot(path): ms_allocator_snapshot() of a alone, then
 * ms_snapshot_write_file() (memsnap's format, written atomically). Records the `snapshot` entry
 * in a's trace as ms_allocator_snapshot does. A failure is also reported through the output hook
 * ("memsnap: error: cannot write 'PATH': ..."), so a program may ignore the status.
 * @return MS_OK, MS_EINVAL (a or path NULL or empty), or the error of taking or writing it. */
MS_API int ms_snapshot_dump(ms_allocator_t *a, const char *path);

/* Installs the ready-made OOM observer on a: on every out-of-memory error of a, it takes a
 * snapshot of a and writes it (ms_snapshot_write_file, atomically) to path_pattern with
 *   %p -> process id, %d -> device index, %n -> a counter (0, 1, ... per process), %% -> '%'.
 * e.g. "oom-%p-dev%d-%n.msgpack". It runs on the failing thread, outside the allocator's lock,
 * after the `oom` trace entry was recorded, so the file shows the failing request and the state
 * at the failure. An OOM raised while the observer itself runs (it allocates only host memory)
 * is not observed again. Each snapshot written is reported through the output hook, naming the
 * file: "memsnap: out of memory on device 0 (314572800 bytes requested, 274726912 of 536870912
 * free): snapshot written to 'oom-4242-dev0-0.msgpack'"; failures to write are reported there
 * too (warnings). The snapshot records the device's capacity (MS_DEV_HAS_CAPACITY).
 * When no recording was ever set up on a, this turns on the trace without stacks
 * (MS_HISTORY_ALL, MS_CONTEXT_NONE), so the `oom` entry is there; call
 * ms_allocator_record_history for stacks.
 * @return MS_OK, MS_EINVAL (bad pattern: unknown %-escape, empty) or MS_ENOMEM. */
MS_API MS_NODISCARD int ms_oom_snapshot_install(ms_allocator_t *a, const char *path_pattern);

/* Expands a path pattern as the OOM observer does (%p, %d, %n, %%) into dst (NUL-terminated).
 * @return MS_OK, MS_EINVAL (unknown escape, or a pattern that yields an empty path) or MS_ELIMIT
 * (dst too small). */
MS_API MS_NODISCARD int ms_oom_path_format(const char *pattern, int device, uint64_t counter,
                                           char *dst, size_t cap);

MS_EXTERN_C_END

#endif /* MEMSNAP_HISTORY_H */
