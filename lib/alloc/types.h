/* SPDX-License-Identifier: MIT
 * memsnap core: the allocator's internal structures (block, segment, pool, private pool, the
 * allocator itself) and the prototypes of block_pool.c and segment.c. Never installed.
 *
 * Vocabulary (docs/pytorch-allocator.md, "Blocks and pools"):
 *  - segment (ms__segment_t): one range from the backend's malloc. It records the address, size,
 *    stream and pool, and the context of the malloc that created it (PyTorch keeps that on the
 *    segment's head block; a separate record keeps it stable across merges).
 *  - block (ms__block_t): a sub-range of a segment; its blocks are linked by prev/next in address
 *    order and tile the segment exactly.
 *  - pool (ms__pool_t): a free set of blocks ordered by (stream, size, address), PyTorch's
 *    BlockPool (block_pool.c: one set per stream, size classes, a small treap per class); the
 *    default small and large pools live in the allocator, private pools own a pair.
 *
 * Invariants (checked by ms__allocator_check):
 *  - every block is in exactly one of: its pool's free set (in_set; not allocated, no pending
 *    event, no stream uses), the pointer map (allocated), or pending (not allocated, waiting on
 *    events, or deferred with stream uses while a private-pool routing is active);
 *  - two neighbours in a segment are never both free (free_block merges them);
 *  - a block's stream and pool are its segment's.
 * Every field is guarded by the allocator's mutex.
 */
#ifndef MEMSNAP_LIB_TYPES_H
#define MEMSNAP_LIB_TYPES_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "alloc/hooks.h"
#include "common/internal.h"
#include "memsnap/allocator.h"
#include "common/vec.h"

typedef struct ms__block_s ms__block_t;
typedef struct ms__segment_s ms__segment_t;
typedef struct ms__pool_s ms__pool_t;
typedef struct ms__private_pool_s ms__private_pool_t;
typedef struct ms__fset_s ms__fset_t; /* the free blocks of one stream in one pool (block_pool.c) */

struct ms__block_s {
  /* First cache line: what a free-set descent and the malloc/free fast paths read (links, key,
   * priority, flags). */
  ms__block_t *tl, *tr, *tp; /* free-set links (a treap of one size class), valid while in_set */
  ms_stream_t stream;        /* the ordering key is (stream, size, ptr) */
  size_t size;               /* bytes, multiple of 512 */
  uintptr_t ptr;
  uint32_t prio;             /* treap priority (max-heap) */
  uint32_t ctx;              /* context id of the current allocation (0 = none) */
  bool allocated;
  bool in_set;               /* in its pool's free set */
  bool mapped;               /* always true without expandable segments */
  bool expandable;           /* seg->expandable, kept here so the fast paths skip the segment */
  int event_count;           /* outstanding events guarding a deferred free */
  /* Second cache line. */
  ms__block_t *prev, *next;  /* neighbours in the segment, address order */
  ms__segment_t *seg;
  ms__pool_t *pool;
  size_t requested_size;     /* the client's size of the last allocation */
  int64_t gc_count_base;     /* pool's GC clock when the block was last inserted */
  ms_stream_t *uses;         /* stream_uses: other streams recorded with record_stream */
  uint32_t nuses, cap_uses;
};

struct ms__segment_s {
  uintptr_t ptr;
  size_t size;
  ms_stream_t stream;
  ms__pool_t *pool;
  ms__block_t *head;        /* the block at ptr */
  uint32_t ctx;             /* context of the malloc that created it */
  ms__segment_t *sprev, *snext; /* the allocator's list of segments */
  /* Expandable segments (expandable.c): ptr/size are then the reserved virtual range, page the
   * physical page size, pages[i] whether page i is mapped, mapped the mapped bytes, hi_page one
   * past the highest page ever mapped (the range is the device's size and more: 600 M pages
   * when replaying with no capacity, of which a run maps a few; calloc leaves the rest unbacked
   * and the destruction scans only up to hi_page). */
  bool expandable;
  size_t page;
  size_t npages, hi_page;
  uint8_t *pages;
  size_t mapped;
};

struct ms__pool_s {
  ms__fset_t *hot;          /* the set last looked up by stream (a cache; NULL: none) */
  ms__fset_t **sets;        /* the free set: one per stream seen, sorted by stream */
  size_t nsets;
  size_t nblocks;           /* blocks in the free set */
  bool is_small;
  ms__private_pool_t *owner; /* NULL for the default pools */
  int64_t get_free_blocks_call_count; /* GC clock */
  /* Unmapped blocks of expandable segments, ordered by (stream, ptr), linked through the blocks'
   * tl (next) and tr (previous) fields, which the free set uses only while in_set
   * (expandable.c). */
  ms__block_t *unmapped;
};

struct ms__private_pool_s {
  ms_pool_id_t id;
  int use_count;
  int malloc_count;         /* segments held (PyTorch's cudaMalloc_count) */
  bool freeable;            /* use_count reached 0 */
  bool no_split;            /* its blocks are never split (ms_allocator_set_pool_options) */
  ms__pool_t large, small;
  ms__private_pool_t *next;
};

typedef struct ms__capture_s {
  ms_pool_id_t id;
  ms_pool_filter_fn *filter;
  void *arg;
} ms__capture_t;

/* Options given to a private pool id (ms_allocator_set_pool_options), PyTorch's use_on_oom_pools
 * and no_split_pools sets: kept by id, in increasing id order, whether or not the pool exists. */
typedef struct ms__pool_opts_s {
  ms_pool_id_t id;
  ms_pool_options_t opts;
} ms__pool_opts_t;

typedef struct ms__evpair_s {
  ms_event_t ev;
  ms__block_t *block;
} ms__evpair_t;

typedef struct ms__evqueue_s {
  ms_stream_t stream;
  ms__evpair_t *q; /* ring */
  size_t head, len, cap;
} ms__evqueue_t;

typedef struct ms__observer_s {
  ms_oom_observer_fn *fn;
  void *arg;
} ms__observer_t;

typedef struct ms__freecb_s {
  ms_free_memory_fn *fn;
  void *arg;
} ms__freecb_t;

/* Pointer map: open addressing with linear probing, keys are allocated blocks' addresses. */
typedef struct ms__ptrmap_s {
  ms__block_t **slots;
  size_t cap; /* power of two */
  size_t len;
} ms__ptrmap_t;

typedef struct ms__block_chunk_s ms__block_chunk_t;

/* A stream use recorded while a private-pool routing (graph capture) was active. */
typedef struct ms__capuse_s {
  struct ms__block_s *block;
  ms_stream_t stream;
} ms__capuse_t;

struct ms_allocator_s {
  pthread_mutex_t mu;
  ms_backend_t *backend;
  ms_backend_ops_t ops; /* copy of the backend's table */
  int device;
  size_t device_total;  /* from mem_info at creation */
  ms_alloc_config_t cfg;
  bool any_divisions;   /* some roundup_power2_divisions entry > 1 */
  bool has_gc;          /* garbage_collection_threshold > 0 */
  bool no_caching;      /* caching disabled: plain backend malloc/free (allocator.h) */

  ms__pool_t small, large;
  ms__private_pool_t *pools;
  MS_VEC(ms__capture_t) captures;
  MS_VEC(ms__pool_opts_t) pool_opts; /* non-default options of private pool ids */
  ms__ptrmap_t map;
  ms__segment_t *segments; /* list head */
  size_t nsegments;

  MS_VEC(ms__evqueue_t) queues; /* per-stream event queues, in order of first use */
  MS_VEC(ms_event_t) event_pool;
  MS_VEC(ms__block_t *) deferred; /* frees with stream uses during a private-pool routing, and
                                   * frees whose events could not be recorded (retried) */
  MS_VEC(ms__capuse_t) capture_uses; /* record_stream calls made during a routing (PyTorch's
                                      * block_to_cudagraph_stream_uses) */
  size_t outstanding_events;

  size_t total_allocated_memory;
  bool has_allowed_max;
  size_t allowed_memory_maximum;
  ms_stats_t stats;

  MS_VEC(ms__observer_t) observers;
  MS_VEC(ms__freecb_t) free_callbacks;
  char oom_msg[1024];
  size_t oom_len;

  _Atomic(const ms__alloc_hooks_t *) hooks;

  /* block objects: a free list refilled from chunks */
  ms__block_t *free_blocks;
  ms__block_chunk_t *chunks;
  uint64_t rng;
};

/* ---- "block_pool.c" -------------------------------------------------------------------------- */

/* Size classes of a stream's set (block_pool.c). */
#define MS__FSET_NBINS 1024

void ms__pool_init(ms__pool_t *p, bool is_small, ms__private_pool_t *owner);
/* Frees the pool's per-stream sets (blocks still in them are left as they are; a later
 * ms__pool_unreserve does nothing). */
void ms__pool_fini(ms__pool_t *p);
/* Counts one more segment of p on stream, making the stream's set if needed, so that inserting a
 * block of that stream cannot fail (ms__segment_new calls it). @return MS_OK or MS_ENOMEM. */
int ms__pool_reserve(ms__pool_t *p, ms_stream_t stream);
/* Counts one segment less (ms__segment_delete calls it); the last one frees the stream's set,
 * which is then empty. */
void ms__pool_unreserve(ms__pool_t *p, ms_stream_t stream);
/* Inserts b (pre: not in a set, ms__pool_reserve(p, b->stream) done); resets its GC age
 * (PyTorch's insert_into_blocks). b's size and stream must not change while it is in the set. */
void ms__pool_insert(ms__pool_t *p, ms__block_t *b);
/* Removes b (pre: in p). */
void ms__pool_erase(ms__pool_t *p, ms__block_t *b);
/* b (in p) gives up its first cut bytes (ptr += cut, size -= cut; pre: cut < size) and stays in
 * the set with its GC age restarted, as erase + change + insert would leave it; in place (no
 * rebalancing) when its size class is unchanged and it still follows its predecessor. */
void ms__pool_shrink_front(ms__pool_t *p, ms__block_t *b, size_t cut);
/* old (in p) leaves the set and nb (not in a set, same stream) enters it with its GC age
 * restarted, as erase(old) + insert(nb) would; nb takes old's node in place when it falls in the
 * same size class between old's neighbours (a freed block that absorbed old). */
void ms__pool_replace(ms__pool_t *p, ms__block_t *old, ms__block_t *nb);
/* Best fit: the first block whose key is >= (stream, size, 0) if it is of that stream, or NULL. */
ms__block_t *ms__pool_find(ms__pool_t *p, ms_stream_t stream, size_t size);
/* The first block whose key is >= (stream, size, 0), of any stream, or NULL. */
ms__block_t *ms__pool_lower_bound(const ms__pool_t *p, ms_stream_t stream, size_t size);
ms__block_t *ms__pool_first(const ms__pool_t *p);
ms__block_t *ms__pool_last(const ms__pool_t *p);
ms__block_t *ms__pool_next(const ms__block_t *b);
ms__block_t *ms__pool_prev(const ms__block_t *b);
/* Checks the sets (stream order, class bitmaps, each treap's order, heap property and parent
 * links, blocks' pool/stream/class, count, both in-order walks). @return true when valid. */
bool ms__pool_is_valid(const ms__pool_t *p);

/* ---- "segment.c" ----------------------------------------------------------------------------- */

/* A zeroed block object (from the free list), or NULL when host memory runs out. */
ms__block_t *ms__block_new(ms_allocator_t *a);
/* Returns a block object to the free list (its stream uses are freed). */
void ms__block_delete(ms_allocator_t *a, ms__block_t *b);
void ms__blocks_release_all(ms_allocator_t *a);
static inline bool ms__block_is_split(const ms__block_t *b) { return b->prev || b->next; }

/* Splits `size` bytes off the low end of b (pre: b->size > size): returns the new low block (not
 * in a set), linked before b; b keeps the high part, and stays in its pool's set if it was in it
 * (ms__pool_shrink_front). NULL when host memory runs out (b unchanged). */
ms__block_t *ms__block_split_low(ms_allocator_t *a, ms__block_t *b, size_t size);
/* PyTorch's try_merge_blocks(dst, src): merges src (a neighbour of dst) into dst if src is free
 * (not allocated, no events, no stream uses) and has the same mapping state; src leaves its pool's
 * set and is deleted. @return the bytes merged (0: no merge). */
size_t ms__block_try_merge(ms_allocator_t *a, ms__block_t *dst, ms__block_t *src);
/* As ms__block_try_merge, except that the first src found in a free set while *slot is NULL is
 * neither erased nor deleted but returned in *slot (unlinked from its segment, still in the set
 * under its old key), for the caller to hand its place to dst with ms__pool_replace and then
 * delete it. */
size_t ms__block_merge_slot(ms_allocator_t *a, ms__block_t *dst, ms__block_t *src,
                            ms__block_t **slot);

/* Segment records. ms__segment_new reserves pool's set for stream (ms__pool_reserve; NULL when
 * host memory runs out), ms__segment_delete releases it (pre: its blocks left the free set). */
ms__segment_t *ms__segment_new(ms_allocator_t *a, uintptr_t ptr, size_t size, ms_stream_t stream,
                               ms__pool_t *pool, uint32_t ctx);
void ms__segment_delete(ms_allocator_t *a, ms__segment_t *s);

/* ---- "expandable.c" (docs/pytorch-allocator.md, "Expandable segments") ----------------------- */

/* Whether expandable segments serve allocations from pool: the flag is on, for the default pools
 * and private pools alike (PyTorch bypasses them only for pools with a custom allocator, which
 * memsnap does not have). An expandable range of a private pool counts in its malloc_count. */
static inline bool ms__es_active(const ms_allocator_t *a, const ms__pool_t *pool) {
  (void)pool;
  return a->cfg.expandable_segments;
}
/* Whether a's backend has the virtual-memory operations expandable segments need. */
bool ms__es_supported(const ms_allocator_t *a);
/* The unmapped set of pool (block_pool.c keeps it ordered by (stream, ptr); expandable segments
 * use it). */
void ms__pool_unmapped_insert(ms__pool_t *p, ms__block_t *b);
void ms__pool_unmapped_erase(ms__pool_t *p, ms__block_t *b);
/* get_free_block's handling of an expandable candidate b: with es_active, prefer a
 * following candidate whose expandable size is smaller; without, skip expandable blocks.
 * @return the block to take (still in the set) or NULL. */
ms__block_t *ms__es_choose(ms__pool_t *pool, ms__block_t *b, ms_stream_t stream, bool es_active);
/* try_allocate_expandable_block: a free mapped block of at least size bytes (rounded) on
 * stream, taken out of pool, mapping pages (segment_map entries) as needed.
 * @return the block, or NULL when the device is out of memory (or host memory ran out). */
ms__block_t *ms__es_try_allocate(ms_allocator_t *a, ms__pool_t *pool, ms_stream_t stream,
                                 size_t size, uint32_t ctx, int *err);
/* release_blocks' part for the expandable blocks of pool's free set: unmap the whole pages of
 * each (segment_unmap entries), destroying a segment left entirely unmapped. */
int ms__es_release(ms_allocator_t *a, ms__pool_t *pool, uint32_t ctx);
/* At destroy: unmap and return every expandable segment that holds no live block. */
void ms__es_destroy_all(ms_allocator_t *a);

/* ---- "alloc_inspect.c" ----------------------------------------------------------------------- */

/* ms__allocator_check with the lock already held. */
int ms__allocator_check_locked(ms_allocator_t *a, ms_errbuf_t *eb);

#endif /* MEMSNAP_LIB_TYPES_H */
