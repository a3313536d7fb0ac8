/* SPDX-License-Identifier: MIT
 * memsnap core: what allocator.c (the malloc and free decisions) shares with the allocator's other
 * files: control.c (the public calls that are not malloc or free), private_pools.c (graph pools
 * and MemPools), lifecycle.c (create and destroy) and replay_support.c (the entry points of
 * `memsnap replay`). Small helpers are inline here, so that the hot path of allocator.c is what it
 * was when everything was one file; the rest are functions of allocator.c, named ms__alloc_*.
 * The data structures below (block_pool.c, segment.c, expandable.c) never include this header:
 * they are called, and never call back.
 */
#ifndef MEMSNAP_LIB_ALLOC_CORE_H
#define MEMSNAP_LIB_ALLOC_CORE_H

#include <stdlib.h>

#include "alloc/alloc_internal.h"
#include "alloc/types.h"

/* ---- small helpers ------------------------------------------------------------------------- */

/* record_trace's out-of-line part (allocator.c). */
void ms__alloc_trace_record(const ms__alloc_hooks_t *h, ms_trace_action action, uint64_t addr,
                            uint64_t size, ms_stream_t stream, const ms__pool_t *pool,
                            uint32_t ctx);
static inline enum ms_stat_type pool_stat(const ms__pool_t *p) {
  return p->is_small ? MS_STAT_SMALL_POOL : MS_STAT_LARGE_POOL;
}

static inline const ms__alloc_hooks_t *alloc_hooks(ms_allocator_t *a) {
  return atomic_load_explicit(&a->hooks, memory_order_acquire);
}

/* maybe_gather_context(level): outside the lock. */
static inline uint32_t alloc_gather(ms_allocator_t *a, int level) {
  const ms__alloc_hooks_t *h = alloc_hooks(a);
  if (ms_likely(!h) || !h->gather || ms__hooks_context_level(h) < level) return 0;
  return h->gather(h->ctx);
}

static inline void alloc_trace(ms_allocator_t *a, ms_trace_action action, uint64_t addr,
                               uint64_t size, ms_stream_t stream, const ms__pool_t *pool,
                               uint32_t ctx) {
  const ms__alloc_hooks_t *h = alloc_hooks(a);
  if (ms_unlikely(h != NULL)) ms__alloc_trace_record(h, action, addr, size, stream, pool, ctx);
}

/* round_size; the plain 512 rounding inline, the power-of-two divisions through config. */
static inline size_t alloc_round_size(const ms_allocator_t *a, size_t size) {
#ifdef MS_TEST_MUTATIONS
  if (ms_unlikely(ms__alloc_test_mutation == MS__MUT_ROUND_1024))
    return size < 1024 ? 1024 : (size + 1023) & ~(size_t)1023;
#endif
  if (ms_likely(!a->any_divisions)) {
    if (size < MS_MIN_BLOCK_SIZE) return MS_MIN_BLOCK_SIZE;
    return (size + MS_MIN_BLOCK_SIZE - 1) & ~(MS_MIN_BLOCK_SIZE - 1);
  }
  return ms_alloc_round_size(&a->cfg, size);
}

static inline ms__private_pool_t *find_private_pool(ms_allocator_t *a, ms_pool_id_t id) {
  for (ms__private_pool_t *p = a->pools; p; p = p->next)
    if (p->id.first == id.first && p->id.second == id.second) return p;
  return NULL;
}

/* get_pool: the routings (most recent first), then the default pools. */
ms__pool_t *ms__alloc_get_pool_routed(ms_allocator_t *a, size_t size, ms_stream_t stream);

static inline ms__pool_t *get_pool(ms_allocator_t *a, size_t size, ms_stream_t stream) {
  if (ms_unlikely(a->captures.len)) return ms__alloc_get_pool_routed(a, size, stream);
  return size <= MS_SMALL_SIZE ? &a->small : &a->large;
}

/* ---- the pointer map: live blocks by address (open addressing, backward-shift deletion) ------ */
static inline size_t map_slot(const ms__ptrmap_t *m, uintptr_t ptr) {
  return (size_t)(((uint64_t)ptr >> 9) * 0x9E3779B97F4A7C15ULL >> 20) & (m->cap - 1);
}

static inline int map_grow(ms__ptrmap_t *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  ms__block_t **ns = calloc(ncap, sizeof *ns);
  if (!ns) return MS_ENOMEM;
  ms__ptrmap_t nm = {ns, ncap, 0};
  for (size_t i = 0; i < m->cap; i++) {
    ms__block_t *b = m->slots[i];
    if (!b) continue;
    size_t j = map_slot(&nm, b->ptr);
    while (ns[j])
      j = (j + 1) & (ncap - 1);
    ns[j] = b;
    nm.len++;
  }
  free(m->slots);
  *m = nm;
  return MS_OK;
}

static inline int map_insert(ms__ptrmap_t *m, ms__block_t *b) {
  if (ms_unlikely((m->len + 1) * 2 > m->cap)) MS_FORWARD_IF_ERROR(map_grow(m));
  size_t j = map_slot(m, b->ptr);
  while (m->slots[j])
    j = (j + 1) & (m->cap - 1);
  m->slots[j] = b;
  m->len++;
  return MS_OK;
}

static inline ms__block_t *map_find(const ms__ptrmap_t *m, uintptr_t ptr, size_t *slot) {
  if (!m->cap) return NULL;
  size_t j = map_slot(m, ptr);
  for (ms__block_t *b; (b = m->slots[j]) != NULL; j = (j + 1) & (m->cap - 1)) {
    if (b->ptr == ptr) {
      *slot = j;
      return b;
    }
  }
  return NULL;
}

/* Removes the entry at slot j (backward-shift deletion keeps probe chains intact). */
static inline void map_remove_at(ms__ptrmap_t *m, size_t j) {
  size_t mask = m->cap - 1;
  size_t i = j;
  for (;;) {
    m->slots[i] = NULL;
    size_t k = i;
    for (;;) {
      k = (k + 1) & mask;
      ms__block_t *b = m->slots[k];
      if (!b) {
        m->len--;
        return;
      }
      size_t home = map_slot(m, b->ptr);
      /* b may move to i if home is cyclically outside (i, k] */
      bool stays = i <= k ? (home > i && home <= k) : (home > i || home <= k);
      if (!stays) {
        m->slots[i] = b;
        i = k;
        break;
      }
    }
  }
}

/* ---- functions of allocator.c, for the other files --------------------------------------------
 * Each is allocator.c's function of the same name without the prefix (PyTorch's names); pre: the
 * allocator's lock is held. */

/* free_block: the block truly becomes free, merging with free neighbours. */
void ms__alloc_free_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx);
/* release_block: a whole free segment back to the backend. */
int ms__alloc_release_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx);
/* release_cached_blocks: every cached segment (of one private pool when only != NULL). */
int ms__alloc_release_cached_blocks(ms_allocator_t *a, uint32_t ctx, const ms_pool_id_t *only);
/* process_events: blocks whose events completed return to their pools. */
int ms__alloc_process_events(ms_allocator_t *a, uint32_t ctx);
/* synchronize_and_free_events, for one private pool or all (pp == NULL). */
int ms__alloc_sync_and_free_events(ms_allocator_t *a, uint32_t ctx, const ms__private_pool_t *pp);
/* The invariant walk on a sample of calls when MS_DEBUG >= 3 (inspect.c); nothing otherwise. */
void ms__alloc_debug_check(ms_allocator_t *a);
/* setMemoryFraction, control.c. */
int ms__alloc_set_fraction_locked(ms_allocator_t *a, double f, ms_errbuf_t *eb);

#endif /* MEMSNAP_LIB_ALLOC_CORE_H */
