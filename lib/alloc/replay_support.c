/* SPDX-License-Identifier: MIT
 * memsnap core: the entry points `memsnap replay` drives the allocator with (alloc_internal.h,
 * docs/replay.md, "Traces that began mid-run"): a free kept pending, a recorded segment rebuilt
 * at its address, usage and fit queries. They take the allocator's mutex like every public call.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "alloc/alloc_core.h"
#include "alloc/alloc_internal.h"
#include "alloc/stats_internal.h"
#include "alloc/types.h"
#include "backend/backend_internal.h"

/* ---- replay support (alloc_internal.h; used by lib/replay.c) --------------------------------- */

int ms__allocator_replay_process_events(ms_allocator_t *a) {
  pthread_mutex_lock(&a->mu);
  int r = ms__alloc_process_events(a, 0);
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms__allocator_replay_add_segment(ms_allocator_t *a, uintptr_t ptr, size_t size,
                                     ms_stream_t stream, bool is_small, ms__replay_block_t *blocks,
                                     size_t n) {
  size_t sum = 0;
  for (size_t i = 0; i < n; i++) {
    if (blocks[i].size == 0 || blocks[i].size % MS_MIN_BLOCK_SIZE || blocks[i].state > 1)
      return MS_EINVAL;
    if (i && blocks[i].state == 0 && blocks[i - 1].state == 0) return MS_EINVAL;
    sum += blocks[i].size;
  }
  if (n == 0 || sum != size) return MS_EINVAL;
  pthread_mutex_lock(&a->mu);
  ms__pool_t *pool = is_small ? &a->small : &a->large;
  ms__segment_t *s = ms__segment_new(a, ptr, size, stream, pool, 0);
  if (!s) {
    pthread_mutex_unlock(&a->mu);
    return MS_ENOMEM;
  }
  enum ms_stat_type st = pool_stat(pool);
  ms__stat_array_increase(a->stats.segment, st, 1);
  ms__stat_array_increase(a->stats.reserved_bytes, st, (int64_t)size);
  if (size >= a->cfg.max_split_size) ms__stat_increase(&a->stats.oversize_segments, 1);
  a->total_allocated_memory += size;
  ms__block_t *prev = NULL;
  uintptr_t at = ptr;
  int r = MS_OK;
  for (size_t i = 0; i < n && r == MS_OK; i++) {
    ms__block_t *b = ms__block_new(a);
    if (!b) {
      r = MS_ENOMEM;
      break;
    }
    b->stream = stream;
    b->size = blocks[i].size;
    b->ptr = at;
    b->seg = s;
    b->pool = pool;
    b->prev = prev;
    if (prev)
      prev->next = b;
    else
      s->head = b;
    prev = b;
    at += b->size;
    b->requested_size = blocks[i].requested;
    if (blocks[i].state == 1) {
      b->allocated = true;
      r = map_insert(&a->map, b);
      ms__stat_array_increase(a->stats.allocation, st, 1);
      ms__stat_array_increase(a->stats.allocated_bytes, st, (int64_t)b->size);
      if (b->size >= a->cfg.max_split_size) ms__stat_increase(&a->stats.oversize_allocations, 1);
    }
    if (blocks[i].state != 0) {
      ms__stat_array_increase(a->stats.active, st, 1);
      ms__stat_array_increase(a->stats.active_bytes, st, (int64_t)b->size);
      ms__stat_array_increase(a->stats.requested_bytes, st, (int64_t)b->requested_size);
    }
  }
  /* Free blocks join the pool once the segment is linked (a split segment's free blocks count as
   * inactive_split). */
  if (r == MS_OK) {
    for (ms__block_t *b = s->head; b; b = b->next) {
      if (b->allocated) continue;
      ms__pool_insert(pool, b);
      if (ms__block_is_split(b)) {
        ms__stat_array_increase(a->stats.inactive_split, st, 1);
        ms__stat_array_increase(a->stats.inactive_split_bytes, st, (int64_t)b->size);
      }
    }
  }
  ms__alloc_debug_check(a);
  pthread_mutex_unlock(&a->mu);
  return r;
}

void ms__allocator_replay_usage(ms_allocator_t *a, size_t *reserved, size_t *allocated,
                                size_t *requested) {
  pthread_mutex_lock(&a->mu);
  *reserved = (size_t)a->stats.reserved_bytes[MS_STAT_ALL].current;
  *allocated = (size_t)a->stats.allocated_bytes[MS_STAT_ALL].current;
  *requested = (size_t)a->stats.requested_bytes[MS_STAT_ALL].current;
  pthread_mutex_unlock(&a->mu);
}

bool ms__allocator_replay_would_fit(ms_allocator_t *a, size_t size, ms_stream_t stream) {
  pthread_mutex_lock(&a->mu);
  size_t rounded = alloc_round_size(a, size);
  ms__pool_t *pool = get_pool(a, rounded, stream);
  ms__block_t *b = ms__pool_find(pool, stream, rounded);
  if (b && b->expandable) b = ms__es_choose(pool, b, stream, ms__es_active(a, pool));
  bool fit = b && b->stream == stream;
  size_t mss = a->cfg.max_split_size;
  if (fit && rounded < mss && b->size >= mss) fit = false;
  if (fit && rounded >= mss && b->size >= rounded + a->cfg.max_non_split_rounding_size) fit = false;
  pthread_mutex_unlock(&a->mu);
  return fit;
}

bool ms__allocator_replay_would_release(ms_allocator_t *a, size_t size, ms_stream_t stream) {
  pthread_mutex_lock(&a->mu);
  size_t mss = a->cfg.max_split_size, rounded = alloc_round_size(a, size);
  bool any = false;
  if (mss != SIZE_MAX) {
    /* release_available_cached_blocks's selection (allocator.c), without releasing. */
    ms__pool_t *pool = get_pool(a, rounded, stream);
    size_t key = rounded > mss ? rounded : mss;
    ms__block_t *it = ms__pool_lower_bound(pool, stream, key);
    if (it && it->stream == stream && !it->expandable) {
      any = true;
    } else {
      for (it = it ? ms__pool_prev(it) : ms__pool_last(pool);
           it && it->size >= mss && it->stream == stream && !any; it = ms__pool_prev(it))
        any = !it->expandable;
    }
  }
  pthread_mutex_unlock(&a->mu);
  return any;
}

static int replay_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Completed blocks ordered by segment, then address. */
static int replay_cmp_block(const void *a, const void *b) {
  const ms__block_t *x = *(ms__block_t *const *)a, *y = *(ms__block_t *const *)b;
  if (x->seg != y->seg) return (uintptr_t)x->seg < (uintptr_t)y->seg ? -1 : 1;
  return x->ptr < y->ptr ? -1 : x->ptr > y->ptr;
}

/* Whether every block of the segment of done[0..n) (sorted by address, one segment) is cached
 * (free) or one of them. */
static bool replay_whole_after(ms__block_t *const *done, size_t n) {
  ms__block_t *b = done[0];
  while (b->prev)
    b = b->prev;
  size_t k = 0;
  for (; b; b = b->next) {
    while (k < n && done[k]->ptr < b->ptr)
      k++;
    bool in = k < n && done[k] == b;
    if (!in && (b->allocated || b->event_count)) return false;
  }
  return true;
}

size_t ms__allocator_replay_cached_after(ms_allocator_t *a, const uint64_t *events, size_t n) {
  uint64_t *ev = malloc((n ? n : 1) * sizeof *ev);
  ms__block_t **done = malloc((n ? n : 1) * sizeof *done);
  if (!ev || !done) {
    free(ev);
    free(done);
    return SIZE_MAX; /* no answer: the caller's comparison then fails */
  }
  if (n) memcpy(ev, events, n * sizeof *ev); /* events may be NULL when n is 0 */
  qsort(ev, n, sizeof *ev, replay_cmp_u64);
  pthread_mutex_lock(&a->mu);
  size_t count = 0, nd = 0;
  for (int k = 0; k < 2; k++)
    for (ms__block_t *b = ms__pool_first(k ? &a->small : &a->large); b; b = ms__pool_next(b))
      count += !b->expandable && !ms__block_is_split(b);
  /* The blocks waiting on these events alone. */
  for (size_t i = 0; i < a->queues.len; i++) {
    const ms__evqueue_t *q = &a->queues.ptr[i];
    for (size_t k = 0; k < q->len && nd < n; k++) {
      const ms__evpair_t *p = &q->q[(q->head + k) % q->cap];
      uint64_t e = (uint64_t)p->ev;
      if (p->block->event_count == 1 && !p->block->expandable &&
          bsearch(&e, ev, n, sizeof *ev, replay_cmp_u64))
        done[nd++] = p->block;
    }
  }
  qsort(done, nd, sizeof *done, replay_cmp_block);
  for (size_t i = 0, j; i < nd; i = j) {
    for (j = i + 1; j < nd && done[j]->seg == done[i]->seg; j++) {
    }
    if (replay_whole_after(done + i, j - i)) count++;
  }
  pthread_mutex_unlock(&a->mu);
  free(ev);
  free(done);
  return count;
}
