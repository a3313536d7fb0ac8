/* SPDX-License-Identifier: MIT
 * memsnap core: the caching allocator, PyTorch's DeviceCachingAllocator in C
 * (docs/pytorch-allocator.md; docs/allocator.md lists every decision).
 *
 * The functions below keep PyTorch's names and follow its pseudo-code step by step, because
 * `memsnap replay` must reproduce PyTorch's every decision: malloc -> get_free_block ->
 * alloc_block -> release_available_cached_blocks -> release_cached_blocks -> raise_oom;
 * free -> insert_events / free_block -> try_merge_blocks; process_events and
 * synchronize_and_free_events for record_stream; garbage_collect_cached_blocks.
 *
 * Locking: one mutex per allocator, taken by every public call. Stack contexts are gathered
 * before it is taken, OOM observers are called after it is released. Free-memory callbacks and
 * pool filters run under it.
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

/* Requests this large fail at once (PyTorch's 1 EiB check). */
#define MS__MAX_REQUEST ((size_t)1 << 60)

#ifdef MS_TEST_MUTATIONS
/* Test-only rule mutations (alloc_internal.h): compiled into the replay tests' copy of this file
 * only (tests/CMakeLists.txt), never into the library. */
int ms__alloc_test_mutation = MS__MUT_NONE;
#endif

/* ---- trace records and messages ---------------------------------------------------------- */

static void pool_id_of(const ms__pool_t *p, int64_t out[2]) {
  out[0] = p && p->owner ? p->owner->id.first : 0;
  out[1] = p && p->owner ? p->owner->id.second : 0;
}

/* record_trace: under the lock. The context survives only at level >= ALLOC ("Recording"). The test
 * for a recorder is inline; the record is built out of line, off the fast path. */
__attribute__((noinline)) void ms__alloc_trace_record(const ms__alloc_hooks_t *h,
                                                         ms_trace_action action, uint64_t addr,
                                                         uint64_t size, ms_stream_t stream,
                                                         const ms__pool_t *pool, uint32_t ctx) {
  if (!h->trace || !ms__hooks_trace_enabled(h)) return;
  ms__trace_rec_t rec = {action, addr, size, stream, {0, 0}, 0};
  pool_id_of(pool, rec.pool_id);
  rec.ctx = ms__hooks_context_level(h) >= MS__CTX_ALLOC ? ctx : 0;
  h->trace(h->ctx, &rec);
}

/* PyTorch's format_size for the OOM message ("The OOM path and releases"). */
static void format_size_pt(size_t n, char *dst, size_t cap) {
  if (n <= 1024) snprintf(dst, cap, "%zu bytes", n);
  else if (n <= 1048576) snprintf(dst, cap, "%.2f KiB", (double)n / 1024.0);
  else if (n <= 1073741824) snprintf(dst, cap, "%.2f MiB", (double)n / 1048576.0);
  else snprintf(dst, cap, "%.2f GiB", (double)n / 1073741824.0);
}

/* ---- events ("Freeing and events") ----------------------------------------------------------- */

static int event_get(ms_allocator_t *a, ms_event_t *out) {
  if (a->event_pool.len) {
    *out = a->event_pool.ptr[--a->event_pool.len];
    return MS_OK;
  }
  return a->ops.event_create(a->ops.ctx, a->device, out);
}

static void event_put(ms_allocator_t *a, ms_event_t e) {
  if (MS_VEC_PUSH(&a->event_pool, e) != 0) a->ops.event_destroy(a->ops.ctx, a->device, e);
}

static ms__evqueue_t *queue_for(ms_allocator_t *a, ms_stream_t s) {
  for (size_t i = 0; i < a->queues.len; i++)
    if (a->queues.ptr[i].stream == s) return &a->queues.ptr[i];
  ms__evqueue_t q = {s, NULL, 0, 0, 0};
  if (MS_VEC_PUSH(&a->queues, q) != 0) return NULL;
  return &a->queues.ptr[a->queues.len - 1];
}

static int queue_push(ms__evqueue_t *q, ms__evpair_t p) {
  if (q->len == q->cap) {
    size_t ncap = q->cap ? q->cap * 2 : 8;
    ms__evpair_t *n = malloc(ncap * sizeof *n);
    if (!n) return MS_ENOMEM;
    for (size_t i = 0; i < q->len; i++) n[i] = q->q[(q->head + i) % q->cap];
    free(q->q);
    q->q = n;
    q->cap = ncap;
    q->head = 0;
  }
  q->q[(q->head + q->len) % q->cap] = p;
  q->len++;
  return MS_OK;
}

static void queue_pop(ms__evqueue_t *q) {
  q->head = (q->head + 1) % q->cap;
  q->len--;
}

static void queues_drop_empty(ms_allocator_t *a) {
  size_t w = 0;
  for (size_t i = 0; i < a->queues.len; i++) {
    if (a->queues.ptr[i].len == 0) {
      free(a->queues.ptr[i].q);
      continue;
    }
    a->queues.ptr[w++] = a->queues.ptr[i];
  }
  a->queues.len = w;
}

static void free_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx);

/* insert_events: one event per stream in stream_uses; the set is moved out. A stream
 * whose event cannot be created or recorded stays in stream_uses and the block goes to the
 * deferred list (retried at the next malloc with no capture under way): the block stays pending,
 * never reused too early, never synchronized for (that could be during a capture), and the
 * backend's error is returned (PyTorch throws there). */
static int insert_events(ms_allocator_t *a, ms__block_t *b, uint32_t ctx) {
  uint32_t n = b->nuses, cap = b->cap_uses, left = 0;
  ms_stream_t *uses = b->uses;
  b->uses = NULL;
  b->nuses = b->cap_uses = 0;
  int err = MS_OK;
  for (uint32_t i = 0; i < n; i++) {
    ms_event_t e;
    ms__evqueue_t *q = NULL;
    int r = event_get(a, &e);
    if (r == MS_OK) {
      r = a->ops.event_record(a->ops.ctx, a->device, e, uses[i]);
      if (r == MS_OK && !(q = queue_for(a, uses[i]))) r = MS_ENOMEM;
      if (r == MS_OK) r = queue_push(q, (ms__evpair_t){e, b});
      if (r != MS_OK) event_put(a, e);
    }
    if (r != MS_OK) {
      if (err == MS_OK) err = r;
      uses[left++] = uses[i];
      continue;
    }
    b->event_count++;
    a->outstanding_events++;
  }
  if (left) {
    b->uses = uses;
    b->nuses = left;
    b->cap_uses = cap;
    if (MS_VEC_PUSH(&a->deferred, b) != 0)
      ms__warning("device %d: a block whose stream event failed cannot be queued for retry; "
                  "its memory stays pending",
                  a->device);
    return err;
  }
  free(uses);
  if (b->event_count == 0) free_block(a, b, ctx);
  return err;
}

/* Removes from b's stream uses the streams recorded during a capture, and forgets those records
 * (PyTorch's insert_events_deferred_until_no_capture: a capture's stream uses belong to the
 * graph's replays, not to the eager work the events must wait for). */
static void drop_capture_uses(ms_allocator_t *a, ms__block_t *b) {
  size_t w = 0;
  for (size_t i = 0; i < a->capture_uses.len; i++) {
    ms__capuse_t u = a->capture_uses.ptr[i];
    if (u.block != b) {
      a->capture_uses.ptr[w++] = u;
      continue;
    }
    for (uint32_t k = 0; k < b->nuses; k++) {
      if (b->uses[k] == u.stream) {
        b->uses[k] = b->uses[--b->nuses];
        break;
      }
    }
  }
  a->capture_uses.len = w;
}

/* insert_events_deferred_until_no_capture (and the retry of failed event records).
 * @return the first error of insert_events (the failed blocks are deferred again). */
static int insert_deferred(ms_allocator_t *a, uint32_t ctx) {
  size_t n = a->deferred.len;
  ms__block_t **list = NULL;
  if (n) {
    list = malloc(n * sizeof *list);
    if (!list) return MS_ENOMEM;
    memcpy(list, a->deferred.ptr, n * sizeof *list);
  }
  a->deferred.len = 0;
  int err = MS_OK;
  for (size_t i = 0; i < n; i++) {
    ms__block_t *b = list[i];
    if (a->capture_uses.len) drop_capture_uses(a, b);
    if (b->nuses) {
      int r = insert_events(a, b, ctx);
      if (r != MS_OK && err == MS_OK) err = r;
    } else if (b->event_count == 0) {
      free_block(a, b, ctx);
    }
  }
  free(list);
  return err;
}

/* process_events: per-stream FIFO, no head-of-line blocking across streams. A failed query
 * keeps its block pending and is returned (PyTorch throws). */
static int process_events(ms_allocator_t *a, uint32_t ctx) {
  int err = a->deferred.len ? insert_deferred(a, ctx) : MS_OK;
  bool any_empty = false;
  for (size_t i = 0; i < a->queues.len; i++) {
    ms__evqueue_t *q = &a->queues.ptr[i];
    while (q->len) {
      ms__evpair_t p = q->q[q->head];
      bool done = false;
      int r = a->ops.event_query(a->ops.ctx, a->device, p.ev, &done);
      if (r != MS_OK) {
        if (err == MS_OK) err = r;
        break;
      }
      if (!done) break;
      queue_pop(q);
      a->outstanding_events--;
      event_put(a, p.ev);
      if (--p.block->event_count == 0 && p.block->nuses == 0) free_block(a, p.block, ctx);
      q = &a->queues.ptr[i]; /* free_block never touches queues, but stay safe */
    }
    if (!q->len) any_empty = true;
  }
  if (any_empty) queues_drop_empty(a);
  return err;
}

/* synchronize_and_free_events; pp != NULL limits it to that private pool's blocks. A
 * failed synchronization keeps that event (and the rest of its stream's queue) pending and is
 * returned. */
static int synchronize_and_free_events(ms_allocator_t *a, uint32_t ctx,
                                       const ms__private_pool_t *pp) {
  a->stats.num_sync_all_streams++;
  int err = MS_OK;
  if (a->captures.len == 0 && a->deferred.len) err = insert_deferred(a, ctx);
  for (size_t i = 0; i < a->queues.len; i++) {
    ms__evqueue_t *q = &a->queues.ptr[i];
    size_t n = q->len, w = 0;
    ms__evpair_t *keep = malloc((n ? n : 1) * sizeof *keep);
    if (!keep) return MS_ENOMEM;
    bool failed = false;
    for (size_t k = 0; k < n; k++) {
      ms__evpair_t p = q->q[(q->head + k) % q->cap];
      if (failed || (pp && p.block->pool->owner != pp)) {
        keep[w++] = p;
        continue;
      }
      int r = a->ops.event_synchronize(a->ops.ctx, a->device, p.ev);
      if (r != MS_OK) {
        if (err == MS_OK) err = r;
        failed = true;
        keep[w++] = p;
        continue;
      }
      a->outstanding_events--;
      event_put(a, p.ev);
      if (--p.block->event_count == 0 && p.block->nuses == 0) free_block(a, p.block, ctx);
    }
    q->head = 0;
    q->len = 0;
    for (size_t k = 0; k < w; k++) q->q[k] = keep[k];
    q->len = w;
    free(keep);
  }
  queues_drop_empty(a);
  return err;
}

/* ---- pools ----------------------------------------------------------------------------------- */


/* get_pool: the routings (most recent first), then the default pools. */
ms__pool_t *ms__alloc_get_pool_routed(ms_allocator_t *a, size_t size, ms_stream_t stream) {
  for (size_t i = a->captures.len; i-- > 0;) {
    ms__capture_t *c = &a->captures.ptr[i];
    if (!c->filter || c->filter(c->arg, stream)) {
      ms__private_pool_t *pp = find_private_pool(a, c->id);
      ms_assert(pp != NULL);
      return size <= MS_SMALL_SIZE ? &pp->small : &pp->large;
    }
  }
  return size <= MS_SMALL_SIZE ? &a->small : &a->large;
}


/* ---- malloc ---------------------------------------------------------------------------------- */

typedef struct alloc_params_s {
  size_t size;       /* rounded */
  size_t alloc_size; /* segment size */
  ms_stream_t stream;
  ms__pool_t *pool;
  ms__block_t *block;
  int err;           /* of the last device allocation */
} alloc_params_t;

/* get_free_block. */
static inline bool get_free_block(ms_allocator_t *a, alloc_params_t *p) {
  ms__pool_t *pool = p->pool;
  if (ms_unlikely(a->has_allowed_max && a->has_gc)) pool->get_free_blocks_call_count++;
  ms__block_t *b = ms__pool_find(pool, p->stream, p->size);
  if (!b) return false;
  if (ms_unlikely(b->expandable)) { /* expandable segments (expandable.c) */
    b = ms__es_choose(pool, b, p->stream, ms__es_active(a, pool));
    if (!b) return false;
  }
#ifdef MS_TEST_MUTATIONS
  if (ms_unlikely(ms__alloc_test_mutation == MS__MUT_TIEBREAK_HIGH)) {
    for (ms__block_t *n = ms__pool_next(b); n && n->stream == b->stream && n->size == b->size;
         n = ms__pool_next(n))
      b = n;
  }
#endif
  size_t mss = a->cfg.max_split_size;
  if (p->size < mss && b->size >= mss) return false;
  if (p->size >= mss && b->size >= p->size + a->cfg.max_non_split_rounding_size) return false;
  p->block = b; /* still in the free set: alloc_found_block takes it out (or splits it there) */
  return true;
}

/* Calls the free-memory callbacks with the lock released, so that a callback may call back into
 * the allocator (empty_cache, free, even malloc) without deadlocking; PyTorch's mutex is
 * recursive for the same reason. pre and post: lock held. The caller re-selects its pool, since
 * routings may have changed meanwhile. */
static bool trigger_free_memory_callbacks(ms_allocator_t *a) {
  size_t n = a->free_callbacks.len;
  if (n == 0) return false;
  ms__freecb_t stackbuf[8], *cbs = n <= 8 ? stackbuf : malloc(n * sizeof *cbs);
  if (!cbs) return false;
  memcpy(cbs, a->free_callbacks.ptr, n * sizeof *cbs);
  pthread_mutex_unlock(&a->mu);
  bool freed = false;
  for (size_t i = 0; i < n; i++) freed |= cbs[i].fn(cbs[i].arg);
  pthread_mutex_lock(&a->mu);
  if (cbs != stackbuf) free(cbs);
  return freed;
}

/* alloc_block: a new segment from the device. */
static bool alloc_block(ms_allocator_t *a, alloc_params_t *p, bool is_retry, uint32_t ctx) {
  size_t size = p->alloc_size;
  if (is_retry) a->stats.num_alloc_retries++;
  if (a->has_allowed_max && a->total_allocated_memory + size > a->allowed_memory_maximum) {
    p->err = MS_EOOM;
    return false;
  }
  if (ms__es_active(a, p->pool)) { /* expandable segments: map pages instead (expandable.c) */
    int err = MS_OK;
    p->block = ms__es_try_allocate(a, p->pool, p->stream, p->size, ctx, &err);
    p->err = p->block ? MS_OK : err != MS_OK ? err : MS_EOOM;
    return p->block != NULL;
  }
  ms_devptr_t ptr = 0;
  p->err = a->ops.malloc(a->ops.ctx, a->device, size, p->stream, &ptr);
  if (p->err != MS_OK) return false;
  ms__block_t *b = ms__block_new(a);
  ms__segment_t *s = b ? ms__segment_new(a, ptr, size, p->stream, p->pool, ctx) : NULL;
  if (!s) {
    if (b) ms__block_delete(a, b);
    a->ops.free(a->ops.ctx, a->device, ptr);
    p->err = MS_ENOMEM;
    return false;
  }
  ms__private_pool_t *pp = p->pool->owner;
  if (pp) pp->malloc_count++;
  a->total_allocated_memory += size;
  b->stream = p->stream;
  b->size = size;
  b->ptr = ptr;
  b->seg = s;
  b->pool = p->pool;
  s->head = b;
  enum ms_stat_type st = pool_stat(p->pool);
  ms__stat_array_increase(a->stats.segment, st, 1);
  ms__stat_array_increase(a->stats.reserved_bytes, st, (int64_t)size);
  if (size >= a->cfg.max_split_size) ms__stat_increase(&a->stats.oversize_segments, 1);
  a->stats.num_device_alloc++;
  alloc_trace(a, MS_TRACE_SEGMENT_ALLOC, ptr, size, p->stream, p->pool, ctx);
  p->block = b;
  return true;
}

/* try_mempool_fallback: a default-pool malloc that could not get a segment takes a cached
 * block of a use_on_oom pool (get_free_block only, never a device malloc), pools in id order.
 * PyTorch routes to the pool and ends the routing around the search (the use count comes back to
 * where it was); searching the pool directly is the same. */
static __attribute__((noinline)) bool try_mempool_fallback(ms_allocator_t *a,
                                                          alloc_params_t *p) {
  if (p->pool->owner) return false; /* only for the default pools */
  for (size_t i = 0; i < a->pool_opts.len; i++) {
    if (!a->pool_opts.ptr[i].opts.use_on_oom) continue;
    ms__private_pool_t *pp = find_private_pool(a, a->pool_opts.ptr[i].id);
    if (!pp || pp->freeable) continue;
    alloc_params_t q = *p;
    q.pool = q.size <= MS_SMALL_SIZE ? &pp->small : &pp->large;
    q.block = NULL;
    if (get_free_block(a, &q)) {
      *p = q;
      return true;
    }
  }
  return false;
}

/* release_block: returns a whole cached segment to the device. When the backend's free
 * fails, the segment stays cached and accounted (it is still allocated on the device) and the
 * error is returned (PyTorch raises). */
static int release_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx) {
  ms_assert_internal(!ms__block_is_split(b) && b->in_set);
  ms__segment_t *s = b->seg;
  ms__pool_t *pool = b->pool;
  int e = a->ops.free(a->ops.ctx, a->device, s->ptr);
  if (e != MS_OK) {
    ms__warning("device %d: the backend failed to free segment 0x%" PRIxPTR " (%zu bytes): %s; "
                "it stays cached",
                a->device, s->ptr, s->size, ms_strerror(e));
    return e;
  }
  alloc_trace(a, MS_TRACE_SEGMENT_FREE, s->ptr, s->size, s->stream, pool, ctx ? ctx : s->ctx);
  a->total_allocated_memory -= s->size;
  if (pool->owner) pool->owner->malloc_count--;
  enum ms_stat_type st = pool_stat(pool);
  ms__stat_array_decrease(a->stats.segment, st, 1);
  ms__stat_array_decrease(a->stats.reserved_bytes, st, (int64_t)s->size);
  if (s->size >= a->cfg.max_split_size) ms__stat_decrease(&a->stats.oversize_segments, 1);
  a->stats.num_device_free++;
  ms__pool_erase(pool, b);
  ms__segment_delete(a, s);
  ms__block_delete(a, b);
  return MS_OK;
}

/* release_blocks: every unsplit cached segment of pool, in (stream, size, address) order; stops
 * at the first failure (returned). */
static int release_blocks(ms_allocator_t *a, ms__pool_t *pool, uint32_t ctx) {
  ms__block_t *b = ms__pool_first(pool);
  bool any_expandable = false;
  while (b) {
    ms__block_t *n = ms__pool_next(b);
    if (b->expandable) any_expandable = true;
    else if (!ms__block_is_split(b)) MS_FORWARD_IF_ERROR(release_block(a, b, ctx));
    b = n;
  }
  if (any_expandable || (pool->owner && pool->unmapped)) /* then unmap expandable blocks */
    return ms__es_release(a, pool, ctx);
  return MS_OK;
}

/* Whether a graph capture may be under way on the device: a private-pool routing is active
 * (begin_allocate_to_pool announces a capture, as torch.cuda.graph does), or the backend says
 * that stream, or the legacy stream (which answers for captures on blocking streams), is
 * capturing. Then nothing is freed,
 * unmapped or synchronized (the release is deferred to a later empty_cache or OOM), because
 * cudaFree or a synchronization would invalidate the capture. Only on the release paths, never
 * on the malloc/free fast paths. */
static bool capture_under_way(ms_allocator_t *a, ms_stream_t stream) {
  if (a->captures.len) return true; /* a routing is announced around a capture */
  if (!a->ops.stream_capture_info) return false;
  bool cap = false;
  uint64_t id = 0;
  if (a->ops.stream_capture_info(a->ops.ctx, a->device, stream, &cap, &id) == MS_OK && cap)
    return true;
  if (stream != 0 && a->ops.stream_capture_info(a->ops.ctx, a->device, 0, &cap, &id) == MS_OK &&
      cap)
    return true;
  return false;
}

/* release_available_cached_blocks, PyTorch's selection. A failed release sets p->err (the
 * backend's error) and returns false. One deviation, for a state PyTorch cannot reach under one
 * configuration: an oversize cached block that is split (the rest of a segment split when
 * max_split_size was larger, as in a replay's what-if from a recorded start state) cannot be
 * released; it is passed over (PyTorch's release_block assumes a whole segment). */
static bool release_available_cached_blocks(ms_allocator_t *a, alloc_params_t *p, uint32_t ctx) {
  size_t mss = a->cfg.max_split_size;
  if (mss == SIZE_MAX) return false;
  if (capture_under_way(a, p->stream)) return false;
  size_t key_size = p->size > mss ? p->size : mss;
  ms__pool_t *pool = p->pool;
  ms__block_t *it = ms__pool_lower_bound(pool, p->stream, key_size);
  if (!it || it->stream != p->stream || it->expandable) {
    /* No single block is large enough: free oversize blocks from the largest downwards. */
    it = it ? ms__pool_prev(it) : ms__pool_last(pool);
    if (!it) return false;
    size_t released = 0;
    while (released < key_size && it->size >= mss && it->stream == p->stream) {
      ms__block_t *cur = it;
      ms__block_t *before = ms__pool_prev(cur);
      if (!cur->expandable && !ms__block_is_split(cur)) {
        size_t sz = cur->size; /* release_block deletes cur */
        int e = release_block(a, cur, ctx);
        if (e != MS_OK) {
          p->err = e;
          return false;
        }
        released += sz;
      }
      if (!before) break;
      it = before;
    }
    return released >= key_size;
  }
  if (ms__block_is_split(it)) return false;
  int e = release_block(a, it, ctx);
  if (e != MS_OK) {
    p->err = e;
    return false;
  }
  return true;
}

/* release_cached_blocks, for the default id (0,0) or one private pool. Nothing is
 * released while a graph capture is under way (capture_under_way). @return the first error of a
 * synchronization or release (what was released until then stays released). */
static int release_cached_blocks(ms_allocator_t *a, uint32_t ctx, const ms_pool_id_t *only) {
  if (capture_under_way(a, 0)) return MS_OK;
  if (!only && a->captures.len == 0) {
    MS_FORWARD_IF_ERROR(synchronize_and_free_events(a, ctx, NULL));
    MS_FORWARD_IF_ERROR(release_blocks(a, &a->large, ctx));
    MS_FORWARD_IF_ERROR(release_blocks(a, &a->small, ctx));
  }
  ms__private_pool_t **link = &a->pools;
  while (*link) {
    ms__private_pool_t *pp = *link;
    if (!pp->freeable || (only && (pp->id.first != only->first || pp->id.second != only->second))) {
      link = &pp->next;
      continue;
    }
    if (only) MS_FORWARD_IF_ERROR(synchronize_and_free_events(a, ctx, pp));
    MS_FORWARD_IF_ERROR(release_blocks(a, &pp->small, ctx));
    MS_FORWARD_IF_ERROR(release_blocks(a, &pp->large, ctx));
    if (pp->malloc_count == 0) {
      *link = pp->next;
      ms__pool_fini(&pp->small);
      ms__pool_fini(&pp->large);
      free(pp);
    } else {
      link = &pp->next;
    }
  }
  return MS_OK;
}

/* garbage_collect_cached_blocks: default large pool only, average-age passes.
 * @return the backend's error when a release failed (GC stops there). */
static int garbage_collect_cached_blocks(ms_allocator_t *a, uint32_t ctx, ms_stream_t stream) {
  if (capture_under_way(a, stream)) return MS_OK;
  size_t threshold = (size_t)(a->cfg.garbage_collection_threshold *
                              (double)a->allowed_memory_maximum);
  if (a->total_allocated_memory <= threshold) return MS_OK;
  size_t target = a->total_allocated_memory - threshold;
  ms__pool_t *pool = &a->large;
  double total_age = 0.0;
  size_t n = 0;
  for (ms__block_t *b = ms__pool_first(pool); b; b = ms__pool_next(b)) {
    if (!ms__block_is_split(b)) {
      total_age += (double)(pool->get_free_blocks_call_count - b->gc_count_base);
      n++;
    }
  }
  if (n == 0) return MS_OK;
  size_t reclaimed = 0;
  bool freed_any = true;
  while (reclaimed < target && freed_any && n > 0) {
    double age_threshold = total_age / (double)n;
    freed_any = false;
    ms__block_t *b = ms__pool_first(pool);
    while (b) {
      ms__block_t *nx = ms__pool_next(b);
      double age = (double)(pool->get_free_blocks_call_count - b->gc_count_base);
      if (!ms__block_is_split(b) && !b->expandable && age >= age_threshold) {
        freed_any = true;
        reclaimed += b->size;
        total_age -= age;
        n--;
        MS_FORWARD_IF_ERROR(release_block(a, b, ctx));
      }
      b = nx;
    }
  }
  return MS_OK;
}

/* should_split. */
static inline bool should_split(const ms_allocator_t *a, const ms__block_t *b, size_t size) {
  if (ms_unlikely(b->pool->owner != NULL) && b->pool->owner->no_split) return false; /* [2025+] */
  size_t remaining = b->size - size;
  if (b->pool->is_small || ms__es_active(a, b->pool)) return remaining >= MS_MIN_BLOCK_SIZE;
#ifdef MS_TEST_MUTATIONS
  if (ms_unlikely(ms__alloc_test_mutation == MS__MUT_SPLIT_GE))
    return size < a->cfg.max_split_size && remaining >= MS_SMALL_SIZE;
#endif
  return size < a->cfg.max_split_size && remaining > MS_SMALL_SIZE;
}

/* alloc_found_block: p->block is in the free set (found by get_free_block) or a new one
 * (alloc_block). When it is split, the remainder stays in (or enters) the set, as PyTorch's
 * erase + insert leave it (ms__pool_shrink_front spares the rebalancing).
 * @return MS_OK or MS_ENOMEM (block returned to the pool). */
static int alloc_found_block(ms_allocator_t *a, alloc_params_t *p, size_t orig_size, uint32_t ctx,
                             bool split) {
  ms__block_t *b = p->block;
  ms__pool_t *pool = p->pool;
  enum ms_stat_type st = pool_stat(pool);
  bool already_split = ms__block_is_split(b);
  bool in_set = b->in_set;
  if (split) {
    ms__block_t *remaining = b;
    b = ms__block_split_low(a, remaining, p->size);
    if (!in_set) ms__pool_insert(pool, remaining);
    if (ms_unlikely(!b)) return MS_ENOMEM;
    if (b->expandable) {
      /* expandable memory is never inactive_split ("Splitting and merging") */
    } else if (already_split) {
      ms__stat_array_decrease(a->stats.inactive_split_bytes, st, (int64_t)p->size);
    } else {
      ms__stat_array_increase(a->stats.inactive_split_bytes, st, (int64_t)remaining->size);
      ms__stat_array_increase(a->stats.inactive_split, st, 1);
    }
  } else {
    if (in_set) ms__pool_erase(pool, b);
    if (already_split && !b->expandable) {
      ms__stat_array_decrease(a->stats.inactive_split_bytes, st, (int64_t)b->size);
      ms__stat_array_decrease(a->stats.inactive_split, st, 1);
    }
  }
  if (ms_unlikely(map_insert(&a->map, b) != MS_OK)) {
    /* Undo: the block goes back as a free block (merging with its remainder). */
    b->requested_size = 0;
    ms__block_t *nb = b;
    int64_t d_blocks = 0, d_bytes = 0;
    size_t s1 = ms__block_try_merge(a, nb, nb->prev), s2 = ms__block_try_merge(a, nb, nb->next);
    if (s1) d_blocks--, d_bytes -= (int64_t)s1;
    if (s2) d_blocks--, d_bytes -= (int64_t)s2;
    ms__pool_insert(pool, nb);
    if (ms__block_is_split(nb)) d_blocks++, d_bytes += (int64_t)nb->size;
    ms__stat_array_update(a->stats.inactive_split, st, d_blocks);
    ms__stat_array_update(a->stats.inactive_split_bytes, st, d_bytes);
    return MS_ENOMEM;
  }
  b->allocated = true;
  b->requested_size = orig_size;
  b->ctx = ctx;
  alloc_trace(a, MS_TRACE_ALLOC, b->ptr, orig_size, b->stream, pool, ctx);
  ms__stat_array_increase(a->stats.allocation, st, 1);
  ms__stat_array_increase(a->stats.allocated_bytes, st, (int64_t)b->size);
  ms__stat_array_increase(a->stats.active, st, 1);
  ms__stat_array_increase(a->stats.active_bytes, st, (int64_t)b->size);
  ms__stat_array_increase(a->stats.requested_bytes, st, (int64_t)orig_size);
  if (b->size >= a->cfg.max_split_size) ms__stat_increase(&a->stats.oversize_allocations, 1);
  p->block = b;
  return MS_OK;
}

/* Sum of the free cached blocks of every private pool (for the OOM message). */
static size_t private_pools_cached(const ms_allocator_t *a) {
  size_t sum = 0;
  for (const ms__private_pool_t *pp = a->pools; pp; pp = pp->next) {
    for (const ms__block_t *b = ms__pool_first(&pp->small); b; b = ms__pool_next(b)) sum += b->size;
    for (const ms__block_t *b = ms__pool_first(&pp->large); b; b = ms__pool_next(b)) sum += b->size;
  }
  return sum;
}

/* raise_oom: builds the message, counts, traces; unlocks; calls the observers.
 * pre: lock held. post: lock released. */
static int raise_oom(ms_allocator_t *a, alloc_params_t *p, uint32_t ctx) {
  size_t dfree = 0, dtotal = a->device_total;
  if (a->ops.mem_info(a->ops.ctx, a->device, &dfree, &dtotal) != MS_OK) {
    dfree = 0;
    dtotal = a->device_total;
  }
  alloc_trace(a, MS_TRACE_OOM, dfree, p->size, p->stream, p->pool, ctx);
  a->stats.num_ooms++;
  size_t allocated = (size_t)a->stats.allocated_bytes[MS_STAT_ALL].current;
  size_t reserved = (size_t)a->stats.reserved_bytes[MS_STAT_ALL].current;
  size_t priv = private_pools_cached(a);
  char s_alloc[32], s_total[32], s_free[32], s_allowed[32], s_used[32], s_unalloc[32], s_priv[32];
  format_size_pt(p->alloc_size, s_alloc, sizeof s_alloc);
  format_size_pt(dtotal, s_total, sizeof s_total);
  format_size_pt(dfree, s_free, sizeof s_free);
  format_size_pt(a->allowed_memory_maximum, s_allowed, sizeof s_allowed);
  format_size_pt(allocated + priv, s_used, sizeof s_used);
  size_t unalloc = reserved >= allocated + priv ? reserved - allocated - priv : 0;
  format_size_pt(unalloc, s_unalloc, sizeof s_unalloc);
  format_size_pt(priv, s_priv, sizeof s_priv);
  char allowed_info[64] = "", priv_info[128] = "";
  if (a->has_allowed_max) snprintf(allowed_info, sizeof allowed_info, "%s allowed; ", s_allowed);
  if (priv)
    snprintf(priv_info, sizeof priv_info,
             "with %s allocated in private pools (e.g., CUDA Graphs), ", s_priv);
  /* PyTorch >= 2.2's hint ("The OOM error"), printed even when expandable segments are on
   * (#173049). */
  int n = snprintf(a->oom_msg, sizeof a->oom_msg,
                   "memsnap: device out of memory. Tried to allocate %s. GPU %d has a total "
                   "capacity of %s of which %s is free. %sOf the allocated memory %s is allocated "
                   "by memsnap, %sand %s is reserved by memsnap but unallocated. If reserved but "
                   "unallocated memory is large try setting "
                   "MEMSNAP_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See "
                   "docs/allocator.md (\"Out of memory\") for MEMSNAP_ALLOC_CONF.",
                   s_alloc, a->device, s_total, s_free, allowed_info, s_used, priv_info, s_unalloc);
  a->oom_len = n < 0 ? 0 : (size_t)n;
  size_t nobs = a->observers.len;
  ms__observer_t stackbuf[8], *obs = nobs <= 8 ? stackbuf : malloc(nobs * sizeof *obs);
  if (!obs) nobs = 0;
  if (nobs) memcpy(obs, a->observers.ptr, nobs * sizeof *obs);
  size_t limit = a->has_allowed_max ? a->allowed_memory_maximum : dtotal;
  size_t alloc_size = p->alloc_size;
  pthread_mutex_unlock(&a->mu);
  for (size_t i = 0; i < nobs; i++) obs[i].fn(obs[i].arg, a->device, alloc_size, limit, dfree);
  if (obs != stackbuf) free(obs);
  return MS_EOOM;
}

static void alloc_debug_check(ms_allocator_t *a) {
#if MS_DEBUG >= 3
  static _Atomic unsigned long counter;
  /* The full walk is O(state); run it on a sample of calls so that debug test runs stay fast. */
  if ((atomic_fetch_add(&counter, 1) & 255) == 0) {
    ms_errbuf_t eb;
    int r = ms__allocator_check_locked(a, &eb);
    if (r != MS_OK) ms__assert_fail(eb.msg, __FILE__, __LINE__, __func__);
  }
#else
  (void)a;
#endif
}

/* Caching disabled (the top-level wrapper): plain cudaMalloc. */
static __attribute__((noinline, cold)) int uncached_malloc(ms_allocator_t *a, size_t size,
                                                          ms_stream_t stream, ms_devptr_t *out) {
  return a->ops.malloc(a->ops.ctx, a->device, size, stream, out);
}

int ms_allocator_malloc(ms_allocator_t *a, size_t orig_size, ms_stream_t stream,
                        ms_devptr_t *out) {
  MS_RETURN_IF(!a || !out, MS_EINVAL);
  if (ms_unlikely(orig_size == 0)) {
    *out = 0;
    return MS_OK;
  }
  if (ms_unlikely(orig_size >= MS__MAX_REQUEST)) {
    pthread_mutex_lock(&a->mu);
    snprintf(a->oom_msg, sizeof a->oom_msg,
             "memsnap: device out of memory. Tried to allocate more than 1EB memory.");
    a->oom_len = strlen(a->oom_msg);
    pthread_mutex_unlock(&a->mu);
    return MS_EOOM;
  }
  if (ms_unlikely(a->no_caching)) return uncached_malloc(a, orig_size, stream, out);
  if (ms_unlikely(a->ops.stream_key != NULL)) /* e.g. cudaStreamPerThread: the real stream */
    MS_FORWARD_IF_ERROR(a->ops.stream_key(a->ops.ctx, a->device, stream, &stream));
  uint32_t ctx = alloc_gather(a, MS__CTX_STATE);
  pthread_mutex_lock(&a->mu);
  if (ms_likely(a->captures.len == 0)) {
    if (ms_unlikely(a->queues.len || a->deferred.len)) {
      int e = process_events(a, ctx);
      if (e != MS_OK) {
        pthread_mutex_unlock(&a->mu);
        return e;
      }
    }
  }
  alloc_params_t p;
  p.size = alloc_round_size(a, orig_size);
  p.stream = stream;
  p.pool = get_pool(a, p.size, stream);
  p.block = NULL;
  p.err = MS_OK;
  bool found = get_free_block(a, &p);
  if (ms_unlikely(!found)) {
    p.alloc_size = ms_alloc_allocation_size(&a->cfg, p.size);
    if (a->free_callbacks.len && trigger_free_memory_callbacks(a)) {
      p.pool = get_pool(a, p.size, stream);
      found = get_free_block(a, &p);
    }
    if (!found) {
      if (a->has_allowed_max && a->has_gc) p.err = garbage_collect_cached_blocks(a, ctx, stream);
      if (p.err == MS_OK) found = alloc_block(a, &p, false, ctx);
      if (!found && p.err == MS_EOOM && a->pool_opts.len) found = try_mempool_fallback(a, &p);
      if (!found && p.err == MS_EOOM)
        found = release_available_cached_blocks(a, &p, ctx) && alloc_block(a, &p, false, ctx);
      if (!found && p.err == MS_EOOM && a->captures.len == 0) {
        /* Faithful to PyTorch (issue #189504): after releasing everything the pool is not
         * searched again; only a new segment is tried. docs/allocator.md explains. */
        p.err = release_cached_blocks(a, ctx, NULL);
        if (p.err == MS_OK) found = alloc_block(a, &p, true, ctx);
      }
    }
    if (!found) {
      if (p.err != MS_EOOM && p.err != MS_OK) {
        int e = p.err;
        pthread_mutex_unlock(&a->mu);
        return e;
      }
      return raise_oom(a, &p, ctx);
    }
  }
  bool split = should_split(a, p.block, p.size);
  int r = alloc_found_block(a, &p, orig_size, ctx, split);
  alloc_debug_check(a);
  pthread_mutex_unlock(&a->mu);
  if (ms_unlikely(r != MS_OK)) return r;
  *out = p.block->ptr;
  return MS_OK;
}

/* ---- free ("Freeing and events") ------------------------------------------------------------- */

/* Caching disabled (the top-level wrapper): cudaFree, which synchronizes the device first. */
static __attribute__((noinline, cold)) int uncached_free(ms_allocator_t *a, ms_devptr_t ptr) {
  int r = a->ops.device_synchronize(a->ops.ctx, a->device);
  if (r != MS_OK) return r;
  return a->ops.free(a->ops.ctx, a->device, ptr);
}

/* free_block: the block truly becomes free, merging with free neighbours. */
static void free_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx) {
  ms_assert_internal(!b->allocated && b->event_count == 0 && b->nuses == 0);
  ms__pool_t *pool = b->pool;
  alloc_trace(a, MS_TRACE_FREE_COMPLETED, b->ptr, b->requested_size, b->stream, pool,
              ctx ? ctx : b->ctx);
  b->ctx = 0;
  size_t orig = b->size, req = b->requested_size;
  int64_t d_blocks = 0, d_bytes = 0;
  /* The first free neighbour merged keeps its place in the free set for b (ms__pool_replace:
   * the same set as erasing it and inserting b, without the rebalancing). */
  ms__block_t *slot = NULL;
  size_t s = b->prev ? ms__block_merge_slot(a, b, b->prev, &slot) : 0;
  if (s) d_blocks--, d_bytes -= (int64_t)s;
  s = b->next ? ms__block_merge_slot(a, b, b->next, &slot) : 0;
  if (s) d_blocks--, d_bytes -= (int64_t)s;
  if (slot) {
    ms__pool_replace(pool, slot, b);
    ms__block_delete(a, slot);
  } else {
    ms__pool_insert(pool, b);
  }
  if (ms__block_is_split(b)) d_blocks++, d_bytes += (int64_t)b->size;
  enum ms_stat_type st = pool_stat(pool);
  if (b->expandable) d_blocks = d_bytes = 0; /* expandable memory: never inactive_split */
  if (d_blocks) ms__stat_array_update(a->stats.inactive_split, st, d_blocks);
  if (d_bytes) ms__stat_array_update(a->stats.inactive_split_bytes, st, d_bytes);
  ms__stat_array_decrease(a->stats.active, st, 1);
  ms__stat_array_decrease(a->stats.active_bytes, st, (int64_t)orig);
  ms__stat_array_decrease(a->stats.requested_bytes, st, (int64_t)req);
}

int ms_allocator_free(ms_allocator_t *a, ms_devptr_t ptr) {
  MS_RETURN_IF(!a, MS_EINVAL);
  if (!ptr) return MS_OK;
  if (ms_unlikely(a->no_caching)) return uncached_free(a, ptr);
  uint32_t ctx = alloc_gather(a, MS__CTX_ALL);
  pthread_mutex_lock(&a->mu);
  size_t slot;
  ms__block_t *b = map_find(&a->map, ptr, &slot);
  if (ms_unlikely(!b)) {
    pthread_mutex_unlock(&a->mu);
    return MS_EINVAL;
  }
  map_remove_at(&a->map, slot);
  b->allocated = false;
  enum ms_stat_type st = pool_stat(b->pool);
  ms__stat_array_decrease(a->stats.allocation, st, 1);
  ms__stat_array_decrease(a->stats.allocated_bytes, st, (int64_t)b->size);
  alloc_trace(a, MS_TRACE_FREE_REQUESTED, b->ptr, b->requested_size, b->stream, b->pool,
              ctx ? ctx : b->ctx);
  if (b->size >= a->cfg.max_split_size) ms__stat_decrease(&a->stats.oversize_allocations, 1);
  int r = MS_OK;
  if (ms_unlikely(b->nuses)) {
    if (a->captures.len) {
      if (MS_VEC_PUSH(&a->deferred, b) != 0) r = MS_ENOMEM; /* stays pending, never reused */
    } else {
      if (a->capture_uses.len) drop_capture_uses(a, b);
      if (b->nuses) r = insert_events(a, b, ctx);
      else free_block(a, b, ctx);
    }
  } else {
    if (ms_unlikely(a->capture_uses.len)) drop_capture_uses(a, b);
    free_block(a, b, ctx);
  }
  alloc_debug_check(a);
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_record_stream(ms_allocator_t *a, ms_devptr_t ptr, ms_stream_t stream) {
  MS_RETURN_IF(!a, MS_EINVAL);
  if (!ptr || a->no_caching) return MS_OK; /* PyTorch skips pointers it did not cache */
  if (a->ops.stream_key)
    MS_FORWARD_IF_ERROR(a->ops.stream_key(a->ops.ctx, a->device, stream, &stream));
  pthread_mutex_lock(&a->mu);
  size_t slot;
  ms__block_t *b = map_find(&a->map, ptr, &slot);
  int r = MS_OK;
  if (!b) {
    r = MS_EINVAL;
  } else if (stream != b->stream) {
    bool have = false;
    for (uint32_t i = 0; i < b->nuses; i++) have |= b->uses[i] == stream;
    if (!have) {
      if (b->nuses == b->cap_uses) {
        uint32_t ncap = b->cap_uses ? b->cap_uses * 2 : 4;
        ms_stream_t *nu = realloc(b->uses, ncap * sizeof *nu);
        if (!nu) r = MS_ENOMEM;
        else b->uses = nu, b->cap_uses = ncap;
      }
      if (r == MS_OK) b->uses[b->nuses++] = stream;
      /* During a capture, remembered so that the use is dropped before the deferred events are
       * recorded (insert_deferred). */
      if (r == MS_OK && a->captures.len &&
          MS_VEC_PUSH(&a->capture_uses, ((ms__capuse_t){b, stream})) != 0)
        r = MS_ENOMEM;
    }
  }
  pthread_mutex_unlock(&a->mu);
  return r;
}

/* ---- for the allocator's other files (alloc_core.h) ------------------------------------------ */

void ms__alloc_free_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx) { free_block(a, b, ctx); }

int ms__alloc_release_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx) {
  return release_block(a, b, ctx);
}

int ms__alloc_release_cached_blocks(ms_allocator_t *a, uint32_t ctx, const ms_pool_id_t *only) {
  return release_cached_blocks(a, ctx, only);
}

int ms__alloc_process_events(ms_allocator_t *a, uint32_t ctx) { return process_events(a, ctx); }

int ms__alloc_sync_and_free_events(ms_allocator_t *a, uint32_t ctx, const ms__private_pool_t *pp) {
  return synchronize_and_free_events(a, ctx, pp);
}

void ms__alloc_debug_check(ms_allocator_t *a) { alloc_debug_check(a); }
