/* SPDX-License-Identifier: MIT
 * memsnap core: expandable segments (`expandable_segments:True`; docs/pytorch-allocator.md
 * and docs/allocator.md, "Expandable segments").
 *
 * Per (stream, pool) a virtual range of page * ceil(9/8 * device total / page) bytes is reserved
 * with the backend's va_reserve; physical pages (2 MiB in the small pool, large_segment_size in the
 * large pool) are mapped on demand (mem_map) and unmapped when cached memory is released
 * (mem_unmap), so one growing segment replaces many device mallocs and fragmentation between
 * them. The range is an ms__segment_t with `expandable` set; its blocks tile the whole range:
 * mapped blocks (allocated, pending or free, the free ones in the pool's free set) and unmapped
 * blocks, which live in the pool's unmapped set ordered by (stream, ptr).
 *
 * The functions follow PyTorch's find_expandable_block, try_allocate_expandable_block, map_block,
 * unmap_block and release_expandable_segment step by step, since `memsnap replay` checks every
 * map and unmap against recorded traces. Statistics: mapped bytes count as reserved bytes and
 * every map/unmap as one device allocation/free; expandable memory is never a `segment` and never
 * `inactive_split`. All functions run under the allocator's lock.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/hooks.h"
#include "alloc/stats_internal.h"
#include "alloc/types.h"

bool ms__es_supported(const ms_allocator_t *a) {
  return a->ops.va_reserve && a->ops.va_release && a->ops.mem_map && a->ops.mem_unmap;
}

/* ---- trace and statistics ------------------------------------------------------------------ */

static void es_trace(ms_allocator_t *a, ms_trace_action action, uint64_t addr, uint64_t size,
                     ms_stream_t stream, uint32_t ctx) {
  const ms__alloc_hooks_t *h = atomic_load_explicit(&a->hooks, memory_order_acquire);
  if (!h || !h->trace || !ms__hooks_trace_enabled(h)) return;
  ms__trace_rec_t rec = {action, addr, size, stream, {0, 0}, 0};
  rec.ctx = ms__hooks_context_level(h) >= MS__CTX_ALLOC ? ctx : 0;
  h->trace(h->ctx, &rec);
}

static inline enum ms_stat_type es_stat(const ms__pool_t *p) {
  return p->is_small ? MS_STAT_SMALL_POOL : MS_STAT_LARGE_POOL;
}

/* A block is "free" for expandable purposes when it could be merged ("Splitting and merging"). */
static inline bool es_free(const ms__block_t *b) {
  return b && !b->allocated && b->event_count == 0 && b->nuses == 0;
}

/* ---- ExpandableSegment ----------------------------------------------------------------------- */

/* A new reserved range for (stream, pool), as one unmapped block (in the unmapped set).
 * NULL with *err set (the backend's error, MS_ENOMEM) on failure. */
static ms__block_t *es_create(ms_allocator_t *a, ms__pool_t *pool, ms_stream_t stream, int *err) {
  size_t page = pool->is_small ? MS_SMALL_BUFFER : a->cfg.large_segment_size;
  size_t total = a->device_total ? a->device_total : page;
  size_t handles = (total + total / 8 + page - 1) / page;
  if (handles == 0) handles = 1;
  ms_devptr_t base = 0;
  *err = a->ops.va_reserve(a->ops.ctx, a->device, handles * page, &base);
  if (*err != MS_OK) return NULL;
  ms__block_t *b = ms__block_new(a);
  ms__segment_t *s = b ? ms__segment_new(a, base, handles * page, stream, pool, 0) : NULL;
  uint8_t *pages = s ? calloc(handles, 1) : NULL;
  if (!pages) {
    if (s) ms__segment_delete(a, s);
    if (b) ms__block_delete(a, b);
    (void)a->ops.va_release(a->ops.ctx, a->device, base, handles * page);
    *err = MS_ENOMEM;
    return NULL;
  }
  s->expandable = true;
  s->page = page;
  s->npages = handles;
  s->pages = pages;
  s->head = b;
  b->stream = stream;
  b->size = handles * page;
  b->ptr = base;
  b->seg = s;
  b->pool = pool;
  b->mapped = false;
  b->expandable = true;
  ms__pool_unmapped_insert(pool, b);
  if (pool->owner) pool->owner->malloc_count++; /* a private pool is freed at 0 */
  return b;
}

/* ExpandableSegment::map: backs the pages covering [ptr, ptr+size) (ptr is page-aligned inside an
 * unmapped block), one backend mem_map (one physical allocation) per page, as PyTorch creates one
 * handle per page. @return the bytes now mapped from ptr (whole pages), 0 on failure with *err
 * = the backend's error (MS_EOOM exactly when the device is out of memory); the pages mapped by
 * a failed call are unmapped again (all or nothing). */
static size_t es_map_pages(ms_allocator_t *a, ms__segment_t *s, uintptr_t ptr, size_t size,
                           int *err) {
  size_t begin = (ptr - s->ptr) / s->page;
  size_t end = (ptr + size - s->ptr + s->page - 1) / s->page;
  if (end > s->npages) end = s->npages;
  *err = MS_EOOM;
  if (begin >= end) return 0;
  size_t bytes = (end - begin) * s->page;
  for (size_t i = begin; i < end; i++) {
    int e = a->ops.mem_map(a->ops.ctx, a->device, s->ptr + i * s->page, s->page);
    if (e != MS_OK) {
      for (size_t k = begin; k < i; k++)
        if (a->ops.mem_unmap(a->ops.ctx, a->device, s->ptr + k * s->page, s->page) != MS_OK)
          ms__warning("device %d: cannot undo the map of page 0x%" PRIxPTR, a->device,
                      s->ptr + k * s->page);
      *err = e;
      return 0;
    }
  }
  *err = MS_OK;
  memset(s->pages + begin, 1, end - begin);
  if (end > s->hi_page) s->hi_page = end;
  s->mapped += bytes;
  return bytes;
}

/* ExpandableSegment::unmap: releases the pages entirely inside [ptr, ptr+size), page by page.
 * *start = the first unmapped byte. @return the bytes unmapped (0: no whole page inside). When
 * the backend fails (*err = its error), the pages unmapped so far are returned and the rest stay
 * mapped and accounted. Never called while a graph capture is under way (the callers check). */
static size_t es_unmap_pages(ms_allocator_t *a, ms__segment_t *s, uintptr_t ptr, size_t size,
                             uintptr_t *start, int *err) {
  size_t begin = (ptr - s->ptr + s->page - 1) / s->page;
  size_t end = (ptr + size - s->ptr) / s->page;
  *err = MS_OK;
  if (begin >= end) return 0;
  /* PyTorch synchronizes the segment's stream before unmapping; the device is a superset. */
  *err = a->ops.device_synchronize(a->ops.ctx, a->device);
  if (*err != MS_OK) return 0;
  size_t stop = begin;
  while (stop < end) {
    *err = a->ops.mem_unmap(a->ops.ctx, a->device, s->ptr + stop * s->page, s->page);
    if (*err != MS_OK) break;
    stop++;
  }
  end = stop;
  if (begin >= end) return 0;
  size_t bytes = (end - begin) * s->page;
  memset(s->pages + begin, 0, end - begin);
  s->mapped -= bytes;
  *start = s->ptr + begin * s->page;
  return bytes;
}

/* map_block: maps the first `size` bytes (rounded up to pages) of unmapped block b, merges
 * it with free mapped neighbours and puts it in the free set. @return the mapped block (b) or
 * NULL when out of memory. */
static ms__block_t *es_map_block(ms_allocator_t *a, ms__block_t *b, size_t size, uint32_t ctx,
                                 int *err) {
  ms__segment_t *s = b->seg;
  ms__pool_t *pool = b->pool;
  size_t got = es_map_pages(a, s, b->ptr, size, err);
  if (!got) return NULL;
  if (got < b->size) {
    ms__block_t *rem = ms__block_new(a);
    if (!rem) {
      uintptr_t st;
      int e2;
      es_unmap_pages(a, s, b->ptr, got, &st, &e2);
      *err = MS_ENOMEM;
      return NULL;
    }
    ms__pool_unmapped_erase(pool, b);
    rem->stream = b->stream;
    rem->size = b->size - got;
    rem->ptr = b->ptr + got;
    rem->seg = s;
    rem->pool = pool;
    rem->mapped = false;
    rem->expandable = true;
    rem->prev = b;
    rem->next = b->next;
    if (b->next) b->next->prev = rem;
    b->next = rem;
    b->size = got;
    ms__pool_unmapped_insert(pool, rem);
  } else {
    ms__pool_unmapped_erase(pool, b);
  }
  b->mapped = true;
  uintptr_t addr = b->ptr;
  ms__block_try_merge(a, b, b->prev);
  ms__block_try_merge(a, b, b->next);
  ms__pool_insert(pool, b);
  a->total_allocated_memory += got;
  ms__stat_array_increase(a->stats.reserved_bytes, es_stat(pool), (int64_t)got);
  a->stats.num_device_alloc++;
  es_trace(a, MS_TRACE_SEGMENT_MAP, addr, got, b->stream, ctx);
  if (!b->prev && !s->ctx) s->ctx = ctx;
  return b;
}

/* find_expandable_block: an unmapped block of stream (or the free block just before it)
 * starting a run of free and unmapped blocks of at least size bytes; a new range otherwise. */
static ms__block_t *es_find(ms_allocator_t *a, ms__pool_t *pool, ms_stream_t stream,
                            size_t size, int *err) {
  for (ms__block_t *u = pool->unmapped; u; u = u->tl) {
    if (u->stream < stream) continue;
    if (u->stream > stream) break;
    ms__block_t *c = u;
    if (c->prev && es_free(c->prev)) c = c->prev;
    size_t sum = 0;
    for (ms__block_t *x = c; x && sum < size && (!x->mapped || x->in_set); x = x->next)
      sum += x->size;
    if (sum >= size) return c;
  }
  return es_create(a, pool, stream, err);
}

ms__block_t *ms__es_try_allocate(ms_allocator_t *a, ms__pool_t *pool, ms_stream_t stream,
                                 size_t size, uint32_t ctx, int *err) {
  *err = MS_OK;
  ms__block_t *c = es_find(a, pool, stream, size, err);
  if (!c) return NULL;
  if (!c->mapped) {
    c = es_map_block(a, c, c->size < size ? c->size : size, ctx, err);
    if (!c) return NULL;
  }
  while (c->size < size) {
    ms__block_t *n = c->next;
    if (!n || n->mapped) {
      *err = MS_EOOM; /* the range is exhausted */
      return NULL;
    }
    size_t want = size - c->size;
    n = es_map_block(a, n, n->size < want ? n->size : want, ctx, err);
    if (!n) return NULL;
    c = n; /* map_block merged c into n */
  }
  ms__pool_erase(pool, c);
  return c;
}

ms__block_t *ms__es_choose(ms__pool_t *pool, ms__block_t *b, ms_stream_t stream, bool es_active) {
  (void)pool;
  if (es_active) {
    for (;;) {
      if (!b->expandable) return b;
      ms__block_t *nx = ms__pool_next(b);
      if (!nx || nx->stream != stream) return b;
      size_t eb = b->size + (b->next && !b->next->mapped ? b->next->size : 0);
      size_t en = nx->size + (nx->next && !nx->next->mapped ? nx->next->size : 0);
      if (en >= eb) return b;
      b = nx;
    }
  }
  do {
    b = ms__pool_next(b);
  } while (b && b->expandable && b->stream == stream);
  return b && b->stream == stream ? b : NULL;
}

/* unmap_block: unmaps the whole pages of free block b; partial pages at its ends stay as
 * free mapped blocks. */
static int es_unmap_block(ms_allocator_t *a, ms__block_t *b, uint32_t ctx) {
  ms__segment_t *s = b->seg;
  ms__pool_t *pool = b->pool;
  uintptr_t start = 0;
  int err = MS_OK;
  size_t got = es_unmap_pages(a, s, b->ptr, b->size, &start, &err);
  if (!got) return err;
  ms__pool_erase(pool, b);
  size_t before = start - b->ptr, after = b->size - before - got;
  if (before) {
    ms__block_t *bf = ms__block_new(a);
    if (bf) {
      bf->stream = b->stream;
      bf->size = before;
      bf->ptr = b->ptr;
      bf->seg = s;
      bf->pool = pool;
      bf->expandable = true;
      bf->prev = b->prev;
      if (bf->prev) bf->prev->next = bf;
      else s->head = bf;
      bf->next = b;
      b->prev = bf;
      ms__pool_insert(pool, bf);
    }
  }
  if (after) {
    ms__block_t *af = ms__block_new(a);
    if (af) {
      af->stream = b->stream;
      af->size = after;
      af->ptr = start + got;
      af->seg = s;
      af->pool = pool;
      af->expandable = true;
      af->next = b->next;
      if (af->next) af->next->prev = af;
      af->prev = b;
      b->next = af;
      ms__pool_insert(pool, af);
    }
  }
  b->ptr = start;
  b->size = got;
  b->mapped = false;
  ms__block_try_merge(a, b, b->prev);
  ms__block_try_merge(a, b, b->next);
  ms__pool_unmapped_insert(pool, b);
  a->total_allocated_memory -= got;
  ms__stat_array_decrease(a->stats.reserved_bytes, es_stat(pool), (int64_t)got);
  a->stats.num_device_free++;
  es_trace(a, MS_TRACE_SEGMENT_UNMAP, start, got, b->stream, ctx ? ctx : s->ctx);
  return err;
}

/* release_expandable_segment: b spans the whole (unmapped) range. */
static int es_destroy(ms_allocator_t *a, ms__block_t *b) {
  ms__segment_t *s = b->seg;
  int err = a->ops.va_release(a->ops.ctx, a->device, s->ptr, s->size);
  if (err != MS_OK) return err; /* the range stays reserved, as an unmapped segment */
  ms__pool_unmapped_erase(b->pool, b);
  if (b->pool->owner) b->pool->owner->malloc_count--;
  ms__segment_delete(a, s);
  ms__block_delete(a, b);
  return MS_OK;
}

int ms__es_release(ms_allocator_t *a, ms__pool_t *pool, uint32_t ctx) {
  MS_VEC(ms__block_t *) to_unmap = {0};
  int err = MS_OK;
  for (ms__block_t *b = ms__pool_first(pool); b; b = ms__pool_next(b))
    if (b->expandable && MS_VEC_PUSH(&to_unmap, b) != 0) {
      err = MS_ENOMEM;
      break;
    }
  for (size_t i = 0; i < to_unmap.len && err == MS_OK; i++) {
    ms__block_t *b = to_unmap.ptr[i];
    err = es_unmap_block(a, b, ctx);
    if (err == MS_OK && !b->mapped && !b->prev && !b->next) err = es_destroy(a, b);
  }
  MS_VEC_FREE(&to_unmap);
  /* A private pool also returns ranges that are wholly unmapped without having been in its free
   * set (a range whose first map failed), so that the pool can be freed (malloc_count 0). */
  for (ms__block_t *u = pool->owner ? pool->unmapped : NULL, *nx; u && err == MS_OK; u = nx) {
    nx = u->tl;
    if (!u->prev && !u->next) err = es_destroy(a, u);
  }
  return err;
}

void ms__es_destroy_all(ms_allocator_t *a) {
  ms__segment_t *s = a->segments;
  while (s) {
    ms__segment_t *next = s->snext;
    if (s->expandable) {
      bool live = false;
      for (ms__block_t *b = s->head; b; b = b->next) live |= b->mapped && !b->in_set;
      if (!live) {
        for (ms__block_t *b = s->head; b; b = b->next) {
          if (b->in_set) ms__pool_erase(b->pool, b);
          else ms__pool_unmapped_erase(b->pool, b);
        }
        for (size_t i = 0; i < s->hi_page;) {
          if (!s->pages[i]) {
            i++;
            continue;
          }
          size_t j = i;
          while (j < s->hi_page && s->pages[j]) j++;
          if (a->ops.mem_unmap(a->ops.ctx, a->device, s->ptr + i * s->page,
                               (j - i) * s->page) != MS_OK)
            ms__warning("device %d: cannot unmap 0x%" PRIxPTR " at destruction", a->device,
                        s->ptr + i * s->page);
          i = j;
        }
        if (a->ops.va_release(a->ops.ctx, a->device, s->ptr, s->size) != MS_OK)
          ms__warning("device %d: cannot release the range 0x%" PRIxPTR " at destruction",
                      a->device, s->ptr);
        ms__block_t *b = s->head;
        while (b) {
          ms__block_t *n = b->next;
          ms__block_delete(a, b);
          b = n;
        }
        ms__segment_delete(a, s);
      }
    }
    s = next;
  }
}
