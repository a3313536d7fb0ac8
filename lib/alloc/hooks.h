/* SPDX-License-Identifier: MIT
 * memsnap core: the contract between the allocator (allocator.c and friends) and the history
 * recorder (history.c, backtrace.c, snapshot_take.c).
 *
 * The allocator knows nothing about stacks or ring buffers: it calls the hooks below at the points
 * where PyTorch's DeviceCachingAllocator gathers a context or records a TraceEntry
 * (docs/pytorch-allocator.md, "Recording", "Trace entries"), and stores the opaque context ids it
 * is given in its blocks. The hooks are function pointers installed at run time, so the allocator
 * links and runs without the recorder.
 *
 * Context ids: 0 means "no context". Ids are owned by the recorder and stay valid until the
 * recorder is destroyed (stacks are interned, never freed one by one), so the allocator may copy
 * them freely.
 */
#ifndef MEMSNAP_LIB_ALLOC_HOOKS_H
#define MEMSNAP_LIB_ALLOC_HOOKS_H

#include <stdint.h>

#include "memsnap/snapshot.h"

/* PyTorch's RecordContext. */
enum ms__ctx_level {
  MS__CTX_NEVER = 0, /* no stacks */
  MS__CTX_STATE = 1, /* stacks of live blocks (gathered in malloc) */
  MS__CTX_ALLOC = 2, /* and on alloc trace entries */
  MS__CTX_ALL = 3,   /* and at free, empty_cache (free_requested, free_completed, segment_free) */
};

typedef struct ms__trace_rec_s {
  ms_trace_action action;
  uint64_t addr;      /* for MS_TRACE_OOM: the device's free bytes */
  uint64_t size;
  uint64_t stream;
  int64_t pool_id[2]; /* private pool of the block/segment, (0,0) = default */
  uint32_t ctx;       /* context id for this entry (0 = none) */
} ms__trace_rec_t;

typedef struct ms__alloc_hooks_s {
  void *ctx;
  /* Current context level (enum ms__ctx_level); the allocator reads it to decide whether to call
   * gather. 0 with trace == NULL means "recording off". */
  int context_level;
  /* Whether trace entries are wanted at all (PyTorch's enabled="all"). */
  int trace_enabled;
  /* Captures the calling thread's stack and returns its context id (0 if none).
   * Called OUTSIDE the allocator's lock, from any thread. */
  uint32_t (*gather)(void *ctx);
  /* Records one trace entry. Called UNDER the allocator's lock, in event order. */
  void (*trace)(void *ctx, const ms__trace_rec_t *rec);
  /* Called once by ms_allocator_destroy, OUTSIDE the allocator's lock, after the last trace entry
   * (the segment_free entries of the final release) and before the allocator's memory is freed:
   * the owner of ctx may free it (and the hooks structure) here. The allocator is not to be called
   * from it. May be NULL. */
  void (*release)(void *ctx);
} ms__alloc_hooks_t;

/* context_level and trace_enabled change while the allocator runs (ms_allocator_record_history
 * stores them with relaxed atomic stores), so every reader loads them atomically too: relaxed, as
 * each is a lone flag read at each call, with no other data published through it. */
static inline int ms__hooks_context_level(const ms__alloc_hooks_t *h) {
  return __atomic_load_n(&h->context_level, __ATOMIC_RELAXED);
}
static inline int ms__hooks_trace_enabled(const ms__alloc_hooks_t *h) {
  return __atomic_load_n(&h->trace_enabled, __ATOMIC_RELAXED);
}

#endif /* MEMSNAP_LIB_ALLOC_HOOKS_H */
