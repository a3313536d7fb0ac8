/* SPDX-License-Identifier: MIT
 * memsnap core: block and segment objects, block split and merge
 * (docs/pytorch-allocator.md, "Splitting and merging").
 *
 * Block objects come from a free list refilled by chunks of 256, so that the split/merge of the
 * hot path costs no call to malloc. Chunks are released only when the allocator is destroyed.
 * Debug builds fill deleted blocks with a fixed pattern (0xdb) to make use-after-delete visible.
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/types.h"

#define BLOCK_CHUNK 256

struct ms__block_chunk_s {
  ms__block_t blocks[BLOCK_CHUNK]; /* first: cache-line aligned with the chunk */
  ms__block_chunk_t *next;
};

_Static_assert(sizeof(ms__block_t) == 128, "a block is two cache lines");

static __attribute__((noinline)) bool block_refill(ms_allocator_t *a) {
  ms__block_chunk_t *c = aligned_alloc(64, (sizeof *c + 63) & ~(size_t)63);
  if (!c) return false;
  c->next = a->chunks;
  a->chunks = c;
  for (size_t i = 0; i < BLOCK_CHUNK; i++) {
    c->blocks[i].tl = a->free_blocks;
    a->free_blocks = &c->blocks[i];
  }
  return true;
}

/* An uninitialised block object from the free list, or NULL. */
static inline ms__block_t *block_take(ms_allocator_t *a) {
  if (ms_unlikely(!a->free_blocks) && !block_refill(a)) return NULL;
  ms__block_t *b = a->free_blocks;
  a->free_blocks = b->tl;
  return b;
}

ms__block_t *ms__block_new(ms_allocator_t *a) {
  ms__block_t *b = block_take(a);
  if (!b) return NULL;
  /* Field by field: a memset of the whole block compiles to `rep stos`, whose start-up cost
   * dominated the hit path (bench_alloc). */
  b->tl = b->tr = b->tp = NULL;
  b->prio = 0;
  b->stream = 0;
  b->size = 0;
  b->ptr = 0;
  b->prev = b->next = NULL;
  b->seg = NULL;
  b->pool = NULL;
  b->requested_size = 0;
  b->gc_count_base = 0;
  b->event_count = 0;
  b->ctx = 0;
  b->allocated = false;
  b->in_set = false;
  b->mapped = true;
  b->expandable = false;
  b->nuses = b->cap_uses = 0;
  b->uses = NULL;
  return b;
}

void ms__block_delete(ms_allocator_t *a, ms__block_t *b) {
  if (b->uses) free(b->uses);
#if MS_DEBUG >= 2
  memset(b, 0xdb, sizeof *b);
#endif
  b->tl = a->free_blocks;
  a->free_blocks = b;
}

void ms__blocks_release_all(ms_allocator_t *a) {
  ms__block_chunk_t *c = a->chunks;
  while (c) {
    ms__block_chunk_t *n = c->next;
    free(c);
    c = n;
  }
  a->chunks = NULL;
  a->free_blocks = NULL;
}

ms__block_t *ms__block_split_low(ms_allocator_t *a, ms__block_t *b, size_t size) {
  ms_assert_internal(b->size > size);
  ms__block_t *lo = block_take(a);
  if (!lo) return NULL;
  /* Every field set once (this is on the malloc fast path). */
  lo->tl = lo->tr = lo->tp = NULL;
  lo->stream = b->stream;
  lo->size = size;
  lo->ptr = b->ptr;
  lo->prio = 0;
  lo->ctx = 0;
  lo->allocated = false;
  lo->in_set = false;
  lo->mapped = b->mapped;
  lo->expandable = b->expandable;
  lo->event_count = 0;
  lo->seg = b->seg;
  lo->pool = b->pool;
  lo->requested_size = 0;
  lo->gc_count_base = 0;
  lo->uses = NULL;
  lo->nuses = lo->cap_uses = 0;
  lo->prev = b->prev;
  if (lo->prev) lo->prev->next = lo;
  lo->next = b;
  b->prev = lo;
  if (b->in_set) {
    ms__pool_shrink_front(b->pool, b, size);
  } else {
    b->ptr += size;
    b->size -= size;
  }
  if (!lo->prev) lo->seg->head = lo; /* b was the head */
  return lo;
}

/* Whether src (a neighbour of dst) is free to merge: PyTorch's try_merge_blocks test. */
static inline bool block_mergeable(const ms__block_t *dst, const ms__block_t *src) {
  return src && !src->allocated && src->event_count == 0 && src->nuses == 0 &&
         src->mapped == dst->mapped;
}

/* dst takes src's range (segment links and size); src is unlinked, its own fields untouched. */
static inline size_t block_absorb(ms__block_t *dst, ms__block_t *src) {
  ms_assert_internal(src->in_set || !src->mapped);
  if (dst->prev == src) {
    dst->ptr = src->ptr;
    dst->prev = src->prev;
    if (dst->prev) dst->prev->next = dst;
    else dst->seg->head = dst; /* src was the head */
  } else {
    ms_assert_internal(dst->next == src);
    dst->next = src->next;
    if (dst->next) dst->next->prev = dst;
  }
  dst->size += src->size;
  return src->size;
}

size_t ms__block_merge_slot(ms_allocator_t *a, ms__block_t *dst, ms__block_t *src,
                            ms__block_t **slot) {
  if (!block_mergeable(dst, src)) return 0;
  if (*slot || !src->in_set) return ms__block_try_merge(a, dst, src);
  *slot = src;
  return block_absorb(dst, src);
}

size_t ms__block_try_merge(ms_allocator_t *a, ms__block_t *dst, ms__block_t *src) {
  if (!block_mergeable(dst, src)) return 0;
  size_t subsumed = block_absorb(dst, src);
  if (src->mapped) ms__pool_erase(src->pool, src);
  else ms__pool_unmapped_erase(src->pool, src); /* expandable segments */
  ms__block_delete(a, src);
  return subsumed;
}

ms__segment_t *ms__segment_new(ms_allocator_t *a, uintptr_t ptr, size_t size, ms_stream_t stream,
                               ms__pool_t *pool, uint32_t ctx) {
  if (ms__pool_reserve(pool, stream) != MS_OK) return NULL;
  ms__segment_t *s = calloc(1, sizeof *s);
  if (!s) {
    ms__pool_unreserve(pool, stream);
    return NULL;
  }
  s->ptr = ptr;
  s->size = size;
  s->stream = stream;
  s->pool = pool;
  s->ctx = ctx;
  s->snext = a->segments;
  if (a->segments) a->segments->sprev = s;
  a->segments = s;
  a->nsegments++;
  return s;
}

void ms__segment_delete(ms_allocator_t *a, ms__segment_t *s) {
  if (s->sprev) s->sprev->snext = s->snext;
  else a->segments = s->snext;
  if (s->snext) s->snext->sprev = s->sprev;
  a->nsegments--;
  ms__pool_unreserve(s->pool, s->stream);
  free(s->pages);
  free(s);
}
