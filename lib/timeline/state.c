/* SPDX-License-Identifier: MIT
 * memsnap core: the time index's working state (timeline/internal.h): segments and their live
 * blocks kept sorted by address, checkpoints (flat copies), and undoing or redoing one trace entry
 * with the consistency checks that name the entry when a trace cannot be undone.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "timeline/internal.h"

/* ---- small helpers ------------------------------------------------------------------------- */

void ms__tl_ws_release(tl_ws_t *w) {
  for (size_t i = 0; i < w->segs.len; i++)
    ms__tl_blk_free(&w->segs.ptr[i].blk);
  free(w->segs.ptr);
  const ms_tl_filter_t *f = w->filter;
  memset(w, 0, sizeof *w);
  w->filter = f;
}

void ms__tl_totals_block(tl_ws_t *w, const ms_tl_segment_t *seg, const ms_tl_block_t *b, int sign) {
  uint64_t d = b->size, r = b->requested_size;
  if (!tl_counts(w, seg)) {
    w->nlive = sign > 0 ? w->nlive + 1 : w->nlive - 1;
    return;
  }
  if (sign > 0) {
    if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) w->totals[MS_TL_ALLOCATED] += d;
    w->totals[MS_TL_ACTIVE] += d;
    w->totals[MS_TL_REQUESTED] += r;
    w->nlive++;
  } else {
    if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) w->totals[MS_TL_ALLOCATED] -= d;
    w->totals[MS_TL_ACTIVE] -= d;
    w->totals[MS_TL_REQUESTED] -= r;
    w->nlive--;
  }
}

/* Index of the last segment whose address is <= addr, or SIZE_MAX. */
static size_t tl_seg_floor(const tl_ws_t *w, uint64_t addr) {
  size_t lo = 0, hi = w->segs.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (w->segs.ptr[mid].seg.address <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo == 0 ? SIZE_MAX : lo - 1;
}

/* The segment holding addr, or SIZE_MAX. Consecutive entries mostly fall in the segment the one
 * before fell in: that one is tried first, and taken when it holds addr and is the last segment
 * at or below addr (as the search would find it, even beside a segment of size 0). */
static size_t tl_seg_find(tl_ws_t *w, uint64_t addr) {
  size_t h = w->seg_hint;
  if (h < w->segs.len) {
    const ms_tl_segment_t *s = &w->segs.ptr[h].seg;
    if (addr - s->address < s->size &&
        (h + 1 == w->segs.len || w->segs.ptr[h + 1].seg.address > addr))
      return h;
  }
  size_t i = tl_seg_floor(w, addr);
  if (i == SIZE_MAX) return SIZE_MAX;
  const ms_tl_segment_t *s = &w->segs.ptr[i].seg;
  if (addr - s->address >= s->size) return SIZE_MAX;
  w->seg_hint = i;
  return i;
}

static int tl_seg_insert(tl_ws_t *w, size_t at, const ms_tl_segment_t *s) {
  if (MS_VEC_RESERVE(&w->segs, 1)) return MS_ENOMEM;
  memmove(w->segs.ptr + at + 1, w->segs.ptr + at, (w->segs.len - at) * sizeof *w->segs.ptr);
  memset(&w->segs.ptr[at], 0, sizeof w->segs.ptr[at]);
  w->segs.ptr[at].seg = *s;
  w->segs.len++;
  if (tl_counts(w, s)) w->totals[MS_TL_RESERVED] += s->size;
  return MS_OK;
}

static void tl_seg_remove(tl_ws_t *w, size_t at) {
  if (tl_counts(w, &w->segs.ptr[at].seg)) w->totals[MS_TL_RESERVED] -= w->segs.ptr[at].seg.size;
  ms__tl_blk_free(&w->segs.ptr[at].blk);
  memmove(w->segs.ptr + at, w->segs.ptr + at + 1, (w->segs.len - at - 1) * sizeof *w->segs.ptr);
  w->segs.len--;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

void ms__tl_ckpt_free(tl_ckpt_t *c) {
  if (c->pooled) return;
  free(c->segs);
  free(c->seg_nblk);
  free(c->blocks);
}

#define TL_CK_CHUNK_MIN ((size_t)64 << 10)
#define TL_CK_CHUNK_MAX ((size_t)4 << 20)

/* bytes (a multiple of 8) from the device's last chunk, or a new one: each twice the last, from
 * 64 KiB (a small index stays small) to 4 MiB, or as large as asked. NULL: out of memory. */
static void *tl_ck_carve(tl_dev_t *d, size_t bytes) {
  if (d->ck_cap - d->ck_used < bytes) {
    size_t cap = d->ck_cap ? 2 * d->ck_cap : TL_CK_CHUNK_MIN;
    if (cap > TL_CK_CHUNK_MAX) cap = TL_CK_CHUNK_MAX;
    if (cap < bytes) cap = bytes;
    if (MS_VEC_RESERVE(&d->ck_chunks, 1)) return NULL;
    void *p = ms__big_malloc(cap);
    if (!p) return NULL;
    d->ck_chunks.ptr[d->ck_chunks.len++] = p;
    d->ck_cap = cap;
    d->ck_used = 0;
  }
  void *p = (char *)d->ck_chunks.ptr[d->ck_chunks.len - 1] + d->ck_used;
  d->ck_used += bytes;
  return p;
}

static size_t tl_ck_round8(size_t n) {
  return (n + 7) & ~(size_t)7;
}

int ms__tl_ckpt_take(const tl_ws_t *w, size_t step, tl_ckpt_t *c, tl_dev_t *pool) {
  memset(c, 0, sizeof *c);
  c->step = step;
  c->nsegs = w->segs.len;
  c->nblocks = w->nlive;
  size_t ns = c->nsegs ? c->nsegs : 1, nb = c->nblocks ? c->nblocks : 1;
  if (pool) {
    size_t a = tl_ck_round8(ns * sizeof *c->segs), b = tl_ck_round8(ns * sizeof *c->seg_nblk);
    char *p = tl_ck_carve(pool, a + b + tl_ck_round8(nb * sizeof *c->blocks));
    if (!p) return MS_ENOMEM;
    c->pooled = true;
    c->segs = (ms_tl_segment_t *)(void *)p;
    c->seg_nblk = (uint32_t *)(void *)(p + a);
    c->blocks = (ms_tl_block_t *)(void *)(p + a + b);
  } else {
    c->segs = malloc(ns * sizeof *c->segs);
    c->seg_nblk = malloc(ns * sizeof *c->seg_nblk);
    c->blocks = malloc(nb * sizeof *c->blocks);
  }
  if (!c->segs || !c->seg_nblk || !c->blocks) {
    ms__tl_ckpt_free(c);
    return MS_ENOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < c->nsegs; i++) {
    const tl_wseg_t *s = &w->segs.ptr[i];
    c->segs[i] = s->seg;
    c->seg_nblk[i] = (uint32_t)s->blk.len;
    if (s->blk.len) k += ms__tl_blk_copy(&s->blk, c->blocks + k);
  }
  memcpy(c->totals, w->totals, sizeof c->totals);
  return MS_OK;
}

int ms__tl_ckpt_restore(const tl_ckpt_t *c, tl_ws_t *w) {
  ms__tl_ws_release(w);
  if (MS_VEC_RESERVE(&w->segs, c->nsegs ? c->nsegs : 1)) return MS_ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < c->nsegs; i++) {
    tl_wseg_t *s = &w->segs.ptr[w->segs.len++];
    memset(s, 0, sizeof *s);
    s->seg = c->segs[i];
    if (c->seg_nblk[i] && ms__tl_blk_load(&s->blk, c->blocks + k, c->seg_nblk[i])) return MS_ENOMEM;
    k += c->seg_nblk[i];
  }
  memcpy(w->totals, c->totals, sizeof w->totals);
  w->nlive = c->nblocks;
  return MS_OK;
}

/* ---- undo and redo of one entry ------------------------------------------------------------ */

/* First pass: a block b that gets a neighbour (or a segment end) at `end` cannot extend past it. */
static void tl_room_limit(tl_ctx_t *c, const ms_tl_block_t *b, uint64_t end) {
  if (!c->grow || !(b->flags & MS_TL_BLOCK_SIZE_INFERRED) || b->free_entry < 0) return;
  ms__tl_grow_limit(c->grow, (uint32_t)b->free_entry, end);
}

/* Only expandable segments are mapped and unmapped (a pickle without is_expandable predates
 * them). */
static bool tl_seg_may_map(const ms_timeline_t *tl, const ms_tl_segment_t *s) {
  (void)tl;
  return s->is_expandable;
}

static int tl_bad(tl_ctx_t *c, size_t i, const char *what) {
  const ms_snap_trace_t *e = &c->d->trace[i];
  return ms__errbuf_set(c->eb, MS_EFORMAT,
                        "inconsistent trace: device %zu, trace entry %zu (%s 0x%" PRIx64
                        ", %" PRIu64 " bytes): %s",
                        c->dev, i, ms_trace_action_name(e->action), e->addr, e->size, what);
}

/* Removes [addr, addr+size) from the mapped segment holding it (undo of segment_map, redo of
 * segment_unmap). */
static int tl_range_remove(tl_ctx_t *c, tl_ws_t *w, size_t i, uint64_t addr, uint64_t size) {
  size_t si = tl_seg_find(w, addr);
  if (si == SIZE_MAX) return tl_bad(c, i, "no segment holds the range");
  tl_wseg_t *s = &w->segs.ptr[si];
  if (!tl_seg_may_map(c->tl, &s->seg))
    return tl_bad(c, i, "the range lies in a segment that is not expandable");
  uint64_t end = addr + size, send = s->seg.address + s->seg.size;
  if (size == 0 || end < addr || end > send) return tl_bad(c, i, "the range runs past its segment");
  tl_bpos_t b0 = tl_blk_lower(&s->blk, addr);
  const ms_tl_block_t *below = tl_blk_before(&s->blk, b0), *at = tl_blk_at(&s->blk, b0);
  if (below && below->address + below->size > addr)
    return tl_bad(c, i, "a live block overlaps the range");
  if (at && at->address < end) return tl_bad(c, i, "a live block lies in the range");
  if (below) tl_room_limit(c, below, addr);
  if (addr == s->seg.address && end == send) {
    tl_seg_remove(w, si);
    return MS_OK;
  }
  uint64_t counted = tl_counts(w, &s->seg) ? 1 : 0;
  if (addr == s->seg.address) { /* the blocks all lie above: keep them */
    s->seg.address = end;
    s->seg.size -= size;
    w->totals[MS_TL_RESERVED] -= counted * size;
    return MS_OK;
  }
  if (end == send) {
    s->seg.size -= size;
    w->totals[MS_TL_RESERVED] -= counted * size;
    return MS_OK;
  }
  /* split: [seg, addr) keeps blocks below b0; [end, send) takes the rest */
  ms_tl_segment_t right = s->seg;
  right.address = end;
  right.size = send - end;
  s->seg.size = addr - s->seg.address;
  w->totals[MS_TL_RESERVED] -= counted * (size + right.size); /* tl_seg_insert adds right */
  if (tl_seg_insert(w, si + 1, &right)) {
    w->totals[MS_TL_RESERVED] += counted * right.size;
    return MS_ENOMEM;
  }
  return ms__tl_blk_split(&w->segs.ptr[si].blk, b0, &w->segs.ptr[si + 1].blk);
}

static bool tl_mergeable(const ms_timeline_t *tl, const ms_tl_segment_t *a,
                         const ms_tl_segment_t *b) {
  return tl_seg_may_map(tl, a) && b->is_expandable && a->stream == b->stream &&
         a->pool_id[0] == b->pool_id[0] && a->pool_id[1] == b->pool_id[1];
}

/* Adds the mapped range [addr, addr+size) (undo of segment_unmap, redo of segment_map), joining
 * adjacent mapped ranges of the same stream and pool. */
static int tl_range_add(tl_ctx_t *c, tl_ws_t *w, size_t i, const ms_tl_segment_t *ns) {
  uint64_t addr = ns->address, end = addr + ns->size;
  if (ns->size == 0 || end < addr) return tl_bad(c, i, "empty or wrapping range");
  size_t fl = tl_seg_floor(w, addr);
  size_t at = fl == SIZE_MAX ? 0 : fl + 1;
  if (fl != SIZE_MAX) {
    const ms_tl_segment_t *p = &w->segs.ptr[fl].seg;
    if (p->address + p->size > addr) return tl_bad(c, i, "the range overlaps a segment");
  }
  if (at < w->segs.len && w->segs.ptr[at].seg.address < end)
    return tl_bad(c, i, "the range overlaps a segment");
  bool left = fl != SIZE_MAX && w->segs.ptr[fl].seg.address + w->segs.ptr[fl].seg.size == addr &&
              tl_mergeable(c->tl, &w->segs.ptr[fl].seg, ns);
  bool right = at < w->segs.len && w->segs.ptr[at].seg.address == end &&
               tl_mergeable(c->tl, &w->segs.ptr[at].seg, ns);
  if (left && right) {
    tl_wseg_t *l = &w->segs.ptr[fl], *r = &w->segs.ptr[at];
    if (ms__tl_blk_append(&l->blk, &r->blk)) return MS_ENOMEM;
    uint64_t counted = tl_counts(w, &l->seg) ? 1 : 0;
    l->seg.size += ns->size + r->seg.size;
    w->totals[MS_TL_RESERVED] += counted * (ns->size + r->seg.size);
    tl_seg_remove(w, at); /* subtracts r's size again */
    return MS_OK;
  }
  if (left) {
    w->segs.ptr[fl].seg.size += ns->size;
    if (tl_counts(w, ns)) w->totals[MS_TL_RESERVED] += ns->size;
    return MS_OK;
  }
  if (right) {
    w->segs.ptr[at].seg.address = addr;
    w->segs.ptr[at].seg.size += ns->size;
    if (tl_counts(w, ns)) w->totals[MS_TL_RESERVED] += ns->size;
    return MS_OK;
  }
  return tl_seg_insert(w, at, ns);
}

static ms_tl_segment_t tl_entry_segment(const ms_snap_trace_t *e, bool expandable) {
  ms_tl_segment_t s;
  memset(&s, 0, sizeof s);
  s.address = e->addr;
  s.size = e->size;
  s.stream = ms_snap_trace_stream(e);
  if (e->present & MS_TRACE_HAS_POOL_ID) {
    s.pool_id[0] = ms_snap_trace_pool(e, 0);
    s.pool_id[1] = ms_snap_trace_pool(e, 1);
  }
  s.is_expandable = expandable;
  s.stack = e->stack;
  s.snap_segment = TL_NONE;
  return s;
}

/* The block an entry of the trace puts back (undo of free_completed) or creates (redo of alloc);
 * size already chosen. */
static ms_tl_block_t tl_entry_block(const tl_dev_t *d, size_t alloc_i, size_t free_i, uint64_t size,
                                    ms_block_state state) {
  ms_tl_block_t b;
  memset(&b, 0, sizeof b);
  const ms_snap_trace_t *src = alloc_i != TL_NONE ? &d->trace[alloc_i] : &d->trace[free_i];
  b.address = src->addr;
  b.size = size;
  b.requested_size = src->size;
  b.stream = ms_snap_trace_stream(src);
  b.alloc_entry = alloc_i != TL_NONE ? (int64_t)alloc_i : -1;
  b.free_entry = free_i != TL_NONE ? (int64_t)free_i : -1;
  b.time_us = alloc_i != TL_NONE && (src->present & MS_TRACE_HAS_TIME) ? src->time_us : 0;
  b.stack = src->stack;
  b.snap_block = TL_NONE;
  b.state = state;
  b.flags = MS_TL_BLOCK_SIZE_INFERRED | (alloc_i == TL_NONE ? MS_TL_BLOCK_ALLOC_UNRECORDED : 0);
  return b;
}

/* Undoes entry i: w goes from step i + 1 to step i. */
int ms__tl_undo(tl_ctx_t *c, tl_ws_t *w, size_t i) {
  tl_dev_t *d = c->d;
  const ms_snap_trace_t *e = &d->trace[i];
  switch (e->action) {
  case MS_TRACE_ALLOC: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX) return tl_bad(c, i, "no segment holds its block later");
    tl_blks_t *v = &w->segs.ptr[si].blk;
    tl_bpos_t k = tl_blk_lower(v, e->addr);
    ms_tl_block_t *b = tl_blk_at(v, k);
    if (!b || b->address != e->addr)
      return tl_bad(c, i, "its block is not live later (freed without a free in the trace?)");
    if (b->state != MS_BLOCK_ACTIVE_ALLOCATED)
      return tl_bad(c, i, "its block is pending free later without a free_requested");
    if (c->building) MS_FORWARD_IF_ERROR(tl_bsize_set(d, i, b->size));
    ms__tl_totals_block(w, &w->segs.ptr[si].seg, b, -1);
    int64_t fc = b->free_entry;
    ms__tl_blk_remove(v, k);
    /* building: its life in the pass ends here, and with it its room (grow.c) */
    return c->grow && fc >= 0 ? ms__tl_grow_close(c->grow, d, (uint32_t)fc) : MS_OK;
  }
  case MS_TRACE_FREE_REQUESTED: {
    size_t si = tl_seg_find(w, e->addr);
    ms_tl_block_t *b = si == SIZE_MAX ? NULL
                                      : tl_blk_at(&w->segs.ptr[si].blk,
                                                  tl_blk_lower(&w->segs.ptr[si].blk, e->addr));
    if (!b || b->address != e->addr) return tl_bad(c, i, "its block is not live later");
    if (b->state != MS_BLOCK_ACTIVE_PENDING_FREE)
      return tl_bad(c, i, "its block is still allocated later (no pending free)");
    b->state = MS_BLOCK_ACTIVE_ALLOCATED;
    if (tl_counts(w, &w->segs.ptr[si].seg)) w->totals[MS_TL_ALLOCATED] += b->size;
    if (c->grow && b->free_entry >= 0)
      ms__tl_grow_freq(c->grow, (uint32_t)b->free_entry, (uint32_t)i);
    return MS_OK;
  }
  case MS_TRACE_FREE_COMPLETED: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX) return tl_bad(c, i, "no segment holds it");
    tl_wseg_t *s = &w->segs.ptr[si];
    tl_bpos_t k = tl_blk_lower(&s->blk, e->addr);
    const ms_tl_block_t *next = tl_blk_at(&s->blk, k), *below = tl_blk_before(&s->blk, k);
    if (next && next->address == e->addr)
      return tl_bad(c, i, "a block is live at that address later (double free?)");
    if (below && below->address + below->size > e->addr)
      return tl_bad(c, i, "the address lies inside a live block");
    uint64_t gap_end = next ? next->address : s->seg.address + s->seg.size;
    uint32_t ai = d->pair[i];
    if (c->grow) { /* building: the smallest size it can have (fixed up later); note its room */
      const ms_snap_trace_t *src = ai != TL_NONE ? &d->trace[ai] : e;
      uint64_t r = tl_round(src->size);
      MS_FORWARD_IF_ERROR(tl_bsize_set(d, i, r < gap_end - e->addr ? r : gap_end - e->addr));
      /* Only a large request with room past its rounded size can end larger: the room only
       * shrinks, and never below the block (a neighbour inside it is an inconsistency above). */
      if (src->size > TL_SMALL_SIZE && r < gap_end - e->addr) {
        int rc = ms__tl_grow_open(c->grow, (uint32_t)i, gap_end, tl_counts(w, &s->seg));
        if (rc != MS_OK) return rc;
      }
      if (below) tl_room_limit(c, below, e->addr);
    }
    uint64_t bs = tl_bsize(d, i);
    if (bs > gap_end - e->addr) return tl_bad(c, i, "its block does not fit");
    ms_tl_block_t b = tl_entry_block(d, ai, i, bs, MS_BLOCK_ACTIVE_PENDING_FREE);
    int rc = ms__tl_blk_insert(&s->blk, k, &b);
    if (rc) return rc;
    ms__tl_totals_block(w, &s->seg, &b, +1);
    return MS_OK;
  }
  case MS_TRACE_SEGMENT_ALLOC: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX || w->segs.ptr[si].seg.address != e->addr)
      return tl_bad(c, i, "no segment starts there later");
    if (w->segs.ptr[si].seg.size != e->size)
      return tl_bad(c, i, "the segment there later has another size");
    if (w->segs.ptr[si].blk.len) return tl_bad(c, i, "live blocks precede their segment");
    tl_seg_remove(w, si);
    return MS_OK;
  }
  case MS_TRACE_SEGMENT_FREE: {
    ms_tl_segment_t s = tl_entry_segment(e, false);
    if (s.size == 0 || s.address + s.size < s.address) return tl_bad(c, i, "empty segment");
    size_t fl = tl_seg_floor(w, s.address);
    size_t at = fl == SIZE_MAX ? 0 : fl + 1;
    if (fl != SIZE_MAX && w->segs.ptr[fl].seg.address + w->segs.ptr[fl].seg.size > s.address)
      return tl_bad(c, i, "the segment overlaps another segment");
    if (at < w->segs.len && w->segs.ptr[at].seg.address < s.address + s.size)
      return tl_bad(c, i, "the segment overlaps another segment");
    return tl_seg_insert(w, at, &s);
  }
  case MS_TRACE_SEGMENT_MAP:
    return tl_range_remove(c, w, i, e->addr, e->size);
  case MS_TRACE_SEGMENT_UNMAP: {
    ms_tl_segment_t s = tl_entry_segment(e, true);
    return tl_range_add(c, w, i, &s);
  }
  default:
    return MS_OK;
  }
}

int ms__tl_redo(tl_ctx_t *c, tl_ws_t *w, size_t i) {
  tl_dev_t *d = c->d;
  const ms_snap_trace_t *e = &d->trace[i];
  switch (e->action) {
  case MS_TRACE_ALLOC: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX) return MS_EINVAL;
    ms_tl_block_t b;
    if (d->pair[i] == TL_NONE) { /* alive at the end: the snapshot's block */
      const tl_ckpt_t *end = &d->ckpts.ptr[d->ckpts.len - 1];
      size_t lo = 0, hi = end->nblocks;
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (end->blocks[mid].address < e->addr)
          lo = mid + 1;
        else
          hi = mid;
      }
      if (lo >= end->nblocks || end->blocks[lo].address != e->addr) return MS_EINVAL;
      b = end->blocks[lo];
      b.state = MS_BLOCK_ACTIVE_ALLOCATED;
    } else {
      b = tl_entry_block(d, i, d->pair[i], tl_bsize(d, i), MS_BLOCK_ACTIVE_ALLOCATED);
    }
    tl_blks_t *v = &w->segs.ptr[si].blk;
    int rc = ms__tl_blk_insert(v, tl_blk_lower(v, e->addr), &b);
    if (rc == MS_OK) ms__tl_totals_block(w, &w->segs.ptr[si].seg, &b, +1);
    return rc;
  }
  case MS_TRACE_FREE_REQUESTED:
  case MS_TRACE_FREE_COMPLETED: {
    size_t si = tl_seg_find(w, e->addr);
    tl_blks_t *v = si == SIZE_MAX ? NULL : &w->segs.ptr[si].blk;
    tl_bpos_t k = v ? tl_blk_lower(v, e->addr) : (tl_bpos_t){0, 0};
    ms_tl_block_t *b = v ? tl_blk_at(v, k) : NULL;
    if (!b || b->address != e->addr) return MS_EINVAL;
    if (e->action == MS_TRACE_FREE_REQUESTED) {
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) {
        b->state = MS_BLOCK_ACTIVE_PENDING_FREE;
        if (tl_counts(w, &w->segs.ptr[si].seg)) w->totals[MS_TL_ALLOCATED] -= b->size;
      }
      return MS_OK;
    }
    ms__tl_totals_block(w, &w->segs.ptr[si].seg, b, -1);
    ms__tl_blk_remove(v, k);
    return MS_OK;
  }
  case MS_TRACE_SEGMENT_ALLOC: {
    ms_tl_segment_t s = tl_entry_segment(e, false);
    if (d->pair[i] == TL_NONE) { /* alive at the end: the snapshot's segment */
      const tl_ckpt_t *end = &d->ckpts.ptr[d->ckpts.len - 1];
      for (size_t k = 0; k < end->nsegs; k++)
        if (end->segs[k].address == e->addr && end->segs[k].size == e->size) s = end->segs[k];
    }
    size_t fl = tl_seg_floor(w, s.address);
    return tl_seg_insert(w, fl == SIZE_MAX ? 0 : fl + 1, &s);
  }
  case MS_TRACE_SEGMENT_FREE: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX) return MS_EINVAL;
    tl_seg_remove(w, si);
    return MS_OK;
  }
  case MS_TRACE_SEGMENT_MAP: {
    ms_tl_segment_t s = tl_entry_segment(e, true);
    return tl_range_add(c, w, i, &s);
  }
  case MS_TRACE_SEGMENT_UNMAP:
    return tl_range_remove(c, w, i, e->addr, e->size);
  default:
    return MS_OK;
  }
}
