/* SPDX-License-Identifier: MIT
 * memsnap core: the entry points `memsnap replay` drives the allocator with (alloc_internal.h,
 * reference/replay-notes.md §2-§3): a free kept pending, a recorded segment rebuilt at its address,
 * usage and fit queries. They take the allocator's mutex like every public call.
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

/* The block waiting on event ev alone (NULL when none, or when it waits on other events too). */
static ms__block_t *replay_block_of_event(ms_allocator_t *a, uint64_t ev) {
  for (size_t i = 0; i < a->queues.len; i++) {
    const ms__evqueue_t *q = &a->queues.ptr[i];
    for (size_t k = 0; k < q->len; k++) {
      const ms__evpair_t *p = &q->q[(q->head + k) % q->cap];
      if ((uint64_t)p->ev == ev) return p->block->event_count == 1 ? p->block : NULL;
    }
  }
  return NULL;
}

/* Whether every block of b's segment is cached (free) or one of done[0..n). */
static bool replay_whole_after(ms__block_t *b, ms__block_t *const *done, size_t n) {
  while (b->prev)
    b = b->prev;
  for (; b; b = b->next) {
    if (!b->allocated && b->event_count == 0) continue;
    bool in = false;
    for (size_t k = 0; k < n && !in; k++)
      in = done[k] == b;
    if (!in) return false;
  }
  return true;
}

size_t ms__allocator_replay_cached_after(ms_allocator_t *a, const uint64_t *events, size_t n) {
  pthread_mutex_lock(&a->mu);
  size_t count = 0;
  for (int k = 0; k < 2; k++)
    for (ms__block_t *b = ms__pool_first(k ? &a->small : &a->large); b; b = ms__pool_next(b))
      count += !b->expandable && !ms__block_is_split(b);
  ms__block_t *stackbuf[16], **done = n <= 16 ? stackbuf : malloc(n * sizeof *done);
  size_t nd = 0;
  if (done) {
    for (size_t i = 0; i < n; i++) {
      ms__block_t *b = replay_block_of_event(a, events[i]);
      if (b && !b->expandable) done[nd++] = b;
    }
    /* Each segment once: counted at its first completed block. */
    for (size_t i = 0; i < nd; i++) {
      bool first = true;
      for (size_t k = 0; k < i && first; k++)
        first = done[k]->seg != done[i]->seg;
      if (first && replay_whole_after(done[i], done, nd)) count++;
    }
  }
  if (done != stackbuf) free(done);
  pthread_mutex_unlock(&a->mu);
  return count;
}
