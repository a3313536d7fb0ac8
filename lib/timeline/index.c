/* SPDX-License-Identifier: MIT
 * memsnap core: the time index (memsnap/timeline.h, issue #12 §1).
 *
 * Per device: a forward pre-pass pairs each alloc with its free_completed (and each
 * segment_alloc with its segment_free) by address; the build pass then starts from the end state
 * (the snapshot's segments and live blocks) and undoes the trace newest first, recording the
 * totals at every step, the block size chosen for every block born in the trace (so that later
 * queries undo identically), and a checkpoint (a flat copy of the state) every
 * max(K, 2 x live blocks) entries. A query restores the nearest later checkpoint and undoes down
 * to the step asked for.
 *
 * The working state is an address-sorted array of segments, each with its own address-sorted
 * array of live blocks: every operation is a binary search plus a short memmove within one
 * segment, and the ordered layout answers "which block follows this address" for the size
 * inference and the consistency checks.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"
#include "common/vec.h"

#define TL_NONE UINT32_MAX
#define TL_SMALL_SIZE (1ull << 20) /* kSmallSize: requests up to 1 MiB use the small pool */
#define TL_MAX_DEVICES 4096

typedef MS_VEC(ms_tl_block_t) tl_blockvec_t;

typedef struct tl_wseg_s {
  ms_tl_segment_t seg;
  tl_blockvec_t blk; /* live blocks, sorted by address */
} tl_wseg_t;

typedef struct tl_ws_s {
  MS_VEC(tl_wseg_t) segs; /* sorted by address, non-overlapping */
  uint64_t totals[MS_TL_METRIC_COUNT]; /* of the segments the filter keeps */
  size_t nlive;
  const ms_tl_filter_t *filter; /* NULL: every segment counts */
} tl_ws_t;

static bool tl_filter_keeps(const ms_tl_filter_t *f, const ms_tl_segment_t *s) {
  if (!f) return true;
  if (f->has_stream && s->stream != f->stream) return false;
  if (f->has_pool && (s->pool_id[0] != f->pool_id[0] || s->pool_id[1] != f->pool_id[1]))
    return false;
  return true;
}

static bool tl_counts(const tl_ws_t *w, const ms_tl_segment_t *s) {
  return tl_filter_keeps(w->filter, s);
}

typedef struct tl_ckpt_s {
  size_t step;
  ms_tl_segment_t *segs;
  uint32_t *seg_nblk;
  size_t nsegs;
  ms_tl_block_t *blocks;
  size_t nblocks;
  uint64_t totals[MS_TL_METRIC_COUNT];
} tl_ckpt_t;

typedef struct tl_dev_s {
  const ms_snap_trace_t *trace;
  size_t n;
  uint32_t *pair;  /* alloc -> its free_completed; free_completed -> its alloc;
                      segment_alloc -> its segment_free (TL_NONE: none) */
  uint64_t *bsize; /* alloc / free_completed: the size of the block (chosen when building) */
  uint64_t *series[MS_TL_METRIC_COUNT]; /* n + 1 values */
  MS_VEC(tl_ckpt_t) ckpts;              /* increasing step; the last is step n */
} tl_dev_t;

struct ms_timeline_s {
  const ms_snapshot_t *snap;
  size_t ndev;
  tl_dev_t *dev;
  uint32_t k;
  ms_tl_filter_t filter;
};

/* The index's filter, or NULL when it keeps everything. */
static const ms_tl_filter_t *tl_filter_of(const ms_timeline_t *tl) {
  return tl->filter.has_stream || tl->filter.has_pool ? &tl->filter : NULL;
}


/* ---- small helpers ------------------------------------------------------------------------- */

static uint64_t tl_round(uint64_t req) {
  if (req < 512) return 512;
  if (req > UINT64_MAX - 511) return req;
  return (req + 511) & ~(uint64_t)511;
}

static uint64_t tl_snap_requested(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (!(b->present & MS_BLOCK_HAS_FRAMES) && b->stack == MS_SNAP_NO_STACK &&
      (b->present & MS_BLOCK_HAS_HISTORY) && b->nhistory > 0 &&
      b->first_history < s->nhistory)
    return s->history[b->first_history].real_size;
  if ((b->present & MS_BLOCK_HAS_REQUESTED_SIZE) || s->origin == MS_SNAP_ORIGIN_MEMSNAP)
    return b->requested_size;
  return b->size;
}

static uint32_t tl_snap_stack(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (b->stack != MS_SNAP_NO_STACK) return b->stack;
  if ((b->present & MS_BLOCK_HAS_HISTORY) && b->nhistory > 0 && b->first_history < s->nhistory)
    return s->history[b->first_history].stack;
  return MS_SNAP_NO_STACK;
}

static void tl_ws_release(tl_ws_t *w) {
  for (size_t i = 0; i < w->segs.len; i++) free(w->segs.ptr[i].blk.ptr);
  free(w->segs.ptr);
  const ms_tl_filter_t *f = w->filter;
  memset(w, 0, sizeof *w);
  w->filter = f;
}

static void tl_totals_block(tl_ws_t *w, const ms_tl_segment_t *seg, const ms_tl_block_t *b,
                            int sign) {
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

/* The segment holding addr, or SIZE_MAX. */
static size_t tl_seg_find(const tl_ws_t *w, uint64_t addr) {
  size_t i = tl_seg_floor(w, addr);
  if (i == SIZE_MAX) return SIZE_MAX;
  const ms_tl_segment_t *s = &w->segs.ptr[i].seg;
  return addr - s->address < s->size ? i : SIZE_MAX;
}

/* First block of v whose address is >= addr. */
static size_t tl_blk_lower(const tl_blockvec_t *v, uint64_t addr) {
  size_t lo = 0, hi = v->len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (v->ptr[mid].address < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

static int tl_blk_insert(tl_blockvec_t *v, size_t at, const ms_tl_block_t *b) {
  if (MS_VEC_RESERVE(v, 1)) return MS_ENOMEM;
  memmove(v->ptr + at + 1, v->ptr + at, (v->len - at) * sizeof *v->ptr);
  v->ptr[at] = *b;
  v->len++;
  return MS_OK;
}

static void tl_blk_remove(tl_blockvec_t *v, size_t at) {
  memmove(v->ptr + at, v->ptr + at + 1, (v->len - at - 1) * sizeof *v->ptr);
  v->len--;
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
  free(w->segs.ptr[at].blk.ptr);
  memmove(w->segs.ptr + at, w->segs.ptr + at + 1, (w->segs.len - at - 1) * sizeof *w->segs.ptr);
  w->segs.len--;
}

/* ---- checkpoints --------------------------------------------------------------------------- */

static void tl_ckpt_free(tl_ckpt_t *c) {
  free(c->segs);
  free(c->seg_nblk);
  free(c->blocks);
}

static int tl_ckpt_take(const tl_ws_t *w, size_t step, tl_ckpt_t *c) {
  memset(c, 0, sizeof *c);
  c->step = step;
  c->nsegs = w->segs.len;
  c->nblocks = w->nlive;
  c->segs = malloc((c->nsegs ? c->nsegs : 1) * sizeof *c->segs);
  c->seg_nblk = malloc((c->nsegs ? c->nsegs : 1) * sizeof *c->seg_nblk);
  c->blocks = malloc((c->nblocks ? c->nblocks : 1) * sizeof *c->blocks);
  if (!c->segs || !c->seg_nblk || !c->blocks) {
    tl_ckpt_free(c);
    return MS_ENOMEM;
  }
  size_t k = 0;
  for (size_t i = 0; i < c->nsegs; i++) {
    const tl_wseg_t *s = &w->segs.ptr[i];
    c->segs[i] = s->seg;
    c->seg_nblk[i] = (uint32_t)s->blk.len;
    if (s->blk.len) memcpy(c->blocks + k, s->blk.ptr, s->blk.len * sizeof *c->blocks);
    k += s->blk.len;
  }
  memcpy(c->totals, w->totals, sizeof c->totals);
  return MS_OK;
}

static int tl_ckpt_restore(const tl_ckpt_t *c, tl_ws_t *w) {
  tl_ws_release(w);
  if (MS_VEC_RESERVE(&w->segs, c->nsegs ? c->nsegs : 1)) return MS_ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < c->nsegs; i++) {
    tl_wseg_t *s = &w->segs.ptr[w->segs.len++];
    memset(s, 0, sizeof *s);
    s->seg = c->segs[i];
    if (c->seg_nblk[i]) {
      if (MS_VEC_RESERVE(&s->blk, c->seg_nblk[i])) return MS_ENOMEM;
      memcpy(s->blk.ptr, c->blocks + k, c->seg_nblk[i] * sizeof *c->blocks);
      s->blk.len = c->seg_nblk[i];
    }
    k += c->seg_nblk[i];
  }
  memcpy(w->totals, c->totals, sizeof w->totals);
  w->nlive = c->nblocks;
  return MS_OK;
}

/* ---- undo and redo of one entry ------------------------------------------------------------ */

typedef struct tl_ctx_s {
  const ms_timeline_t *tl;
  tl_dev_t *d;
  size_t dev;
  bool building; /* record the sizes of blocks removed by an undone alloc */
  uint64_t *room; /* building: per free_completed entry, the smallest end of the free room
                     after its block over the block's life; NULL otherwise */
  uint32_t *freq; /* building: per free_completed entry, its block's free_requested entry */
  uint8_t *counted; /* building: per free_completed entry, its segment passes the filter */
  ms_errbuf_t *eb;
} tl_ctx_t;

/* First pass: a block b that gets a neighbour (or a segment end) at `end` cannot extend past it. */
static void tl_room_limit(tl_ctx_t *c, const ms_tl_block_t *b, uint64_t end) {
  if (!c->room || !(b->flags & MS_TL_BLOCK_SIZE_INFERRED) || b->free_entry < 0) return;
  uint64_t *r = &c->room[b->free_entry];
  if (end < *r) *r = end;
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
  size_t b0 = tl_blk_lower(&s->blk, addr);
  if (b0 > 0 && s->blk.ptr[b0 - 1].address + s->blk.ptr[b0 - 1].size > addr)
    return tl_bad(c, i, "a live block overlaps the range");
  if (b0 < s->blk.len && s->blk.ptr[b0].address < end)
    return tl_bad(c, i, "a live block lies in the range");
  if (b0 > 0) tl_room_limit(c, &s->blk.ptr[b0 - 1], addr);
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
  s = &w->segs.ptr[si];
  tl_wseg_t *r = &w->segs.ptr[si + 1];
  size_t nr = s->blk.len - b0;
  if (nr) {
    if (MS_VEC_RESERVE(&r->blk, nr)) return MS_ENOMEM;
    memcpy(r->blk.ptr, s->blk.ptr + b0, nr * sizeof *r->blk.ptr);
    r->blk.len = nr;
    s->blk.len = b0;
  }
  return MS_OK;
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
    if (r->blk.len) {
      if (MS_VEC_RESERVE(&l->blk, r->blk.len)) return MS_ENOMEM;
      memcpy(l->blk.ptr + l->blk.len, r->blk.ptr, r->blk.len * sizeof *r->blk.ptr);
      l->blk.len += r->blk.len;
    }
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
  s.stream = e->stream;
  if (e->present & MS_TRACE_HAS_POOL_ID) {
    s.pool_id[0] = e->pool_id[0];
    s.pool_id[1] = e->pool_id[1];
  }
  s.is_expandable = expandable;
  s.stack = e->stack;
  s.snap_segment = TL_NONE;
  return s;
}

/* The block an entry of the trace puts back (undo of free_completed) or creates (redo of alloc);
 * size already chosen. */
static ms_tl_block_t tl_entry_block(const tl_dev_t *d, size_t alloc_i, size_t free_i,
                                    uint64_t size, ms_block_state state) {
  ms_tl_block_t b;
  memset(&b, 0, sizeof b);
  const ms_snap_trace_t *src = alloc_i != TL_NONE ? &d->trace[alloc_i] : &d->trace[free_i];
  b.address = src->addr;
  b.size = size;
  b.requested_size = src->size;
  b.stream = src->stream;
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
static int tl_undo(tl_ctx_t *c, tl_ws_t *w, size_t i) {
  tl_dev_t *d = c->d;
  const ms_snap_trace_t *e = &d->trace[i];
  switch (e->action) {
  case MS_TRACE_ALLOC: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX) return tl_bad(c, i, "no segment holds its block later");
    tl_blockvec_t *v = &w->segs.ptr[si].blk;
    size_t k = tl_blk_lower(v, e->addr);
    if (k >= v->len || v->ptr[k].address != e->addr)
      return tl_bad(c, i, "its block is not live later (freed without a free in the trace?)");
    if (v->ptr[k].state != MS_BLOCK_ACTIVE_ALLOCATED)
      return tl_bad(c, i, "its block is pending free later without a free_requested");
    if (c->building) d->bsize[i] = v->ptr[k].size;
    tl_totals_block(w, &w->segs.ptr[si].seg, &v->ptr[k], -1);
    tl_blk_remove(v, k);
    return MS_OK;
  }
  case MS_TRACE_FREE_REQUESTED: {
    size_t si = tl_seg_find(w, e->addr);
    tl_blockvec_t *v = si == SIZE_MAX ? NULL : &w->segs.ptr[si].blk;
    size_t k = v ? tl_blk_lower(v, e->addr) : 0;
    if (!v || k >= v->len || v->ptr[k].address != e->addr)
      return tl_bad(c, i, "its block is not live later");
    if (v->ptr[k].state != MS_BLOCK_ACTIVE_PENDING_FREE)
      return tl_bad(c, i, "its block is still allocated later (no pending free)");
    v->ptr[k].state = MS_BLOCK_ACTIVE_ALLOCATED;
    if (tl_counts(w, &w->segs.ptr[si].seg)) w->totals[MS_TL_ALLOCATED] += v->ptr[k].size;
    if (c->freq && v->ptr[k].free_entry >= 0) c->freq[v->ptr[k].free_entry] = (uint32_t)i;
    return MS_OK;
  }
  case MS_TRACE_FREE_COMPLETED: {
    size_t si = tl_seg_find(w, e->addr);
    if (si == SIZE_MAX) return tl_bad(c, i, "no segment holds it");
    tl_wseg_t *s = &w->segs.ptr[si];
    size_t k = tl_blk_lower(&s->blk, e->addr);
    if (k < s->blk.len && s->blk.ptr[k].address == e->addr)
      return tl_bad(c, i, "a block is live at that address later (double free?)");
    if (k > 0 && s->blk.ptr[k - 1].address + s->blk.ptr[k - 1].size > e->addr)
      return tl_bad(c, i, "the address lies inside a live block");
    uint64_t gap_end = k < s->blk.len ? s->blk.ptr[k].address : s->seg.address + s->seg.size;
    uint32_t ai = d->pair[i];
    if (c->room) { /* building: the smallest size it can have (fixed up later); note its room */
      const ms_snap_trace_t *src = ai != TL_NONE ? &d->trace[ai] : e;
      uint64_t r = tl_round(src->size);
      d->bsize[i] = r < gap_end - e->addr ? r : gap_end - e->addr;
      c->room[i] = gap_end;
      c->freq[i] = TL_NONE;
      c->counted[i] = tl_counts(w, &s->seg);
      if (k > 0) tl_room_limit(c, &s->blk.ptr[k - 1], e->addr);
    }
    if (d->bsize[i] > gap_end - e->addr) return tl_bad(c, i, "its block does not fit");
    ms_tl_block_t b = tl_entry_block(d, ai, i, d->bsize[i], MS_BLOCK_ACTIVE_PENDING_FREE);
    int rc = tl_blk_insert(&s->blk, k, &b);
    if (rc) return rc;
    tl_totals_block(w, &s->seg, &b, +1);
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
    if (fl != SIZE_MAX &&
        w->segs.ptr[fl].seg.address + w->segs.ptr[fl].seg.size > s.address)
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

/* ---- building ------------------------------------------------------------------------------ */

/* Open-addressing map address -> entry index (the pairing pre-pass). */
typedef struct tl_map_s {
  uint64_t *key;
  uint32_t *val; /* index + 1; 0 = empty */
  size_t cap;
} tl_map_t;

static size_t tl_hash(uint64_t k, size_t cap) {
  return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static int tl_map_init(tl_map_t *m, size_t n) {
  size_t cap = 64;
  while (cap < n * 2 + 16) cap *= 2;
  m->cap = cap;
  m->key = malloc(cap * sizeof *m->key);
  m->val = calloc(cap, sizeof *m->val);
  return m->key && m->val ? MS_OK : MS_ENOMEM;
}

static void tl_map_free(tl_map_t *m) {
  free(m->key);
  free(m->val);
}

static uint32_t *tl_map_slot(tl_map_t *m, uint64_t k) {
  size_t h = tl_hash(k, m->cap);
  while (m->val[h] && m->key[h] != k) h = (h + 1) & (m->cap - 1);
  m->key[h] = k;
  return &m->val[h];
}

static void tl_map_del(tl_map_t *m, uint64_t k) {
  size_t h = tl_hash(k, m->cap);
  while (m->val[h] && m->key[h] != k) h = (h + 1) & (m->cap - 1);
  if (!m->val[h]) return;
  m->val[h] = 0;
  /* backward-shift deletion */
  size_t j = h;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (!m->val[j]) return;
    size_t home = tl_hash(m->key[j], m->cap);
    bool move = (j > h) ? (home <= h || home > j) : (home <= h && home > j);
    if (move) {
      m->key[h] = m->key[j];
      m->val[h] = m->val[j];
      m->val[j] = 0;
      h = j;
    }
  }
}

static uint32_t tl_map_get(const tl_map_t *m, uint64_t k) {
  size_t h = tl_hash(k, m->cap);
  while (m->val[h]) {
    if (m->key[h] == k) return m->val[h];
    h = (h + 1) & (m->cap - 1);
  }
  return 0;
}

/* Pairs allocs with free_completed and segment_alloc with segment_free; the allocs left open
 * are the blocks alive at the end (open_allocs). */
static int tl_pair(const ms_timeline_t *tl, tl_dev_t *d, tl_map_t *open_allocs) {
  tl_map_t segs;
  int rc = tl_map_init(open_allocs, d->n);
  if (rc == MS_OK) rc = tl_map_init(&segs, 16);
  if (rc != MS_OK) return rc;
  size_t nseg = 0;
  for (size_t i = 0; i < d->n; i++) {
    const ms_snap_trace_t *e = &d->trace[i];
    d->pair[i] = TL_NONE;
    if (e->action == MS_TRACE_ALLOC) {
      *tl_map_slot(open_allocs, e->addr) = (uint32_t)i + 1;
    } else if (e->action == MS_TRACE_FREE_COMPLETED) {
      uint32_t a = tl_map_get(open_allocs, e->addr);
      if (a) {
        d->pair[i] = a - 1;
        d->pair[a - 1] = (uint32_t)i;
        tl_map_del(open_allocs, e->addr);
      }
    } else if (e->action == MS_TRACE_SEGMENT_ALLOC) {
      if (nseg * 2 + 16 > segs.cap) { /* grow */
        tl_map_t big;
        if (tl_map_init(&big, segs.cap) != MS_OK) {
          tl_map_free(&segs);
          return MS_ENOMEM;
        }
        for (size_t h = 0; h < segs.cap; h++)
          if (segs.val[h]) *tl_map_slot(&big, segs.key[h]) = segs.val[h];
        tl_map_free(&segs);
        segs = big;
      }
      *tl_map_slot(&segs, e->addr) = (uint32_t)i + 1;
      nseg++;
    } else if (e->action == MS_TRACE_SEGMENT_FREE) {
      uint32_t a = tl_map_get(&segs, e->addr);
      if (a) {
        d->pair[a - 1] = (uint32_t)i;
        tl_map_del(&segs, e->addr);
        nseg--;
      }
    }
  }
  tl_map_free(&segs);
  return MS_OK;
}

static int tl_seg_cmp(const void *a, const void *b) {
  const tl_wseg_t *x = a, *y = b;
  return x->seg.address < y->seg.address ? -1 : x->seg.address > y->seg.address;
}

static bool tl_filter_keeps_snap(const ms_tl_filter_t *f, const ms_snap_segment_t *g) {
  if (f->has_stream && g->stream != f->stream) return false;
  if (f->has_pool && (g->pool_id[0] != f->pool_id[0] || g->pool_id[1] != f->pool_id[1]))
    return false;
  return true;
}

/* The end state of device dev: the snapshot's segments and live blocks. */
static int tl_end_state(const ms_timeline_t *tl, size_t dev, const tl_map_t *open_allocs,
                        tl_ws_t *w, ms_errbuf_t *eb) {
  const ms_snapshot_t *s = tl->snap;
  const tl_dev_t *d = &tl->dev[dev];
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->device < 0 || (uint64_t)g->device != dev) continue;
    if (MS_VEC_RESERVE(&w->segs, 1)) return MS_ENOMEM;
    tl_wseg_t *ws = &w->segs.ptr[w->segs.len++];
    memset(ws, 0, sizeof *ws);
    ws->seg.address = g->address;
    ws->seg.size = g->total_size;
    ws->seg.stream = g->stream;
    ws->seg.pool_id[0] = g->pool_id[0];
    ws->seg.pool_id[1] = g->pool_id[1];
    ws->seg.is_expandable = g->is_expandable;
    ws->seg.stack = g->stack;
    ws->seg.snap_segment = (uint32_t)i;
    if (g->address + g->total_size < g->address)
      return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: segment 0x%" PRIx64 " wraps around",
                            dev, g->address);
    if (tl_counts(w, &ws->seg)) w->totals[MS_TL_RESERVED] += g->total_size;
    uint64_t off = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      size_t bi = (size_t)g->first_block + k;
      const ms_snap_block_t *sb = &s->blocks[bi];
      uint64_t addr = (sb->present & MS_BLOCK_HAS_ADDRESS) ? sb->address : off;
      off += sb->size;
      if (sb->state != MS_BLOCK_ACTIVE_ALLOCATED && sb->state != MS_BLOCK_ACTIVE_PENDING_FREE)
        continue;
      if (addr < g->address || addr - g->address > g->total_size ||
          sb->size > g->total_size - (addr - g->address))
        return ms__errbuf_set(eb, MS_EFORMAT,
                              "device %zu: block 0x%" PRIx64 " lies outside its segment 0x%" PRIx64,
                              dev, addr, g->address);
      ms_tl_block_t b;
      memset(&b, 0, sizeof b);
      b.address = addr;
      b.size = sb->size;
      b.requested_size = tl_snap_requested(s, sb);
      b.stream = g->stream;
      b.alloc_entry = -1;
      b.free_entry = -1;
      uint32_t a = tl_map_get(open_allocs, addr);
      if (a) {
        b.alloc_entry = a - 1;
        const ms_snap_trace_t *ae = &d->trace[a - 1];
        if (ae->present & MS_TRACE_HAS_TIME) b.time_us = ae->time_us;
      }
      b.stack = tl_snap_stack(s, sb);
      b.snap_block = (uint32_t)bi;
      b.state = sb->state;
      b.flags = MS_TL_BLOCK_FROM_SNAPSHOT;
      size_t at = tl_blk_lower(&ws->blk, addr);
      if ((at < ws->blk.len && ws->blk.ptr[at].address < addr + b.size) ||
          (at > 0 && ws->blk.ptr[at - 1].address + ws->blk.ptr[at - 1].size > addr))
        return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: blocks overlap at 0x%" PRIx64, dev,
                              addr);
      if (tl_blk_insert(&ws->blk, at, &b)) return MS_ENOMEM;
      tl_totals_block(w, &ws->seg, &b, +1);
    }
  }
  if (w->segs.len > 1) qsort(w->segs.ptr, w->segs.len, sizeof *w->segs.ptr, tl_seg_cmp);
  for (size_t i = 1; i < w->segs.len; i++) {
    const ms_tl_segment_t *p = &w->segs.ptr[i - 1].seg, *q = &w->segs.ptr[i].seg;
    if (p->address + p->size > q->address)
      return ms__errbuf_set(eb, MS_EFORMAT,
                            "device %zu: segments 0x%" PRIx64 " and 0x%" PRIx64 " overlap", dev,
                            p->address, q->address);
  }
  return MS_OK;
}

/* Adds delta to series v over steps [a, b] through a difference array. */
static void tl_diff_add(int64_t *diff, size_t a, size_t b, int64_t delta) {
  diff[a] += delta;
  diff[b + 1] -= delta;
}

static int tl_build_dev(ms_timeline_t *tl, size_t dev, ms_errbuf_t *eb) {
  tl_dev_t *d = &tl->dev[dev];
  size_t n = d->n;
  d->pair = malloc((n ? n : 1) * sizeof *d->pair);
  d->bsize = calloc(n ? n : 1, sizeof *d->bsize);
  uint64_t *room = malloc((n + 2) * sizeof *room);
  uint32_t *freq = malloc((n ? n : 1) * sizeof *freq);
  uint8_t *counted = malloc(n ? n : 1);
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) d->series[m] = malloc((n + 1) * sizeof(uint64_t));
  bool ok = d->pair && d->bsize && room && freq && counted;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) ok = ok && d->series[m];
  if (!ok) {
    free(room);
    free(freq);
    free(counted);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory indexing the trace");
  }
  tl_map_t open_allocs;
  int rc = tl_pair(tl, d, &open_allocs);
  tl_ws_t w;
  memset(&w, 0, sizeof w);
  w.filter = tl_filter_of(tl);
  if (rc == MS_OK) rc = tl_end_state(tl, dev, &open_allocs, &w, eb);
  tl_map_free(&open_allocs);
  tl_ckpt_t ck;
  if (rc == MS_OK) {
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) d->series[m][n] = w.totals[m];
    rc = tl_ckpt_take(&w, n, &ck);
    if (rc == MS_OK && MS_VEC_PUSH(&d->ckpts, ck)) {
      tl_ckpt_free(&ck);
      rc = MS_ENOMEM;
    }
  }
  /* One pass from the end: every block freed in the trace at its smallest size (its rounded
   * request, which the real block cannot be smaller than, so a consistent trace never overlaps),
   * noting the smallest room it had after it over its life; totals at every step; checkpoints.
   * This pass reports the inconsistencies. */
  tl_ctx_t c = {tl, d, dev, true, room, freq, counted, eb};
  size_t last = n;
  for (size_t i = n; rc == MS_OK && i-- > 0;) {
    rc = tl_undo(&c, &w, i);
    if (rc != MS_OK) break;
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) d->series[m][i] = w.totals[m];
    size_t every = tl->k > 2 * w.nlive ? tl->k : 2 * w.nlive;
    if (last - i >= every && i > 0) {
      rc = tl_ckpt_take(&w, i, &ck);
      if (rc == MS_OK && MS_VEC_PUSH(&d->ckpts, ck)) {
        tl_ckpt_free(&ck);
        rc = MS_ENOMEM;
      }
      last = i;
    }
  }
  tl_ws_release(&w);
  /* The final sizes: a large request takes its whole room when the remainder was too small to
   * split off. The blocks that grow add their growth to the totals over their life. */
  int64_t *grow_alloc = NULL, *grow_active = NULL;
  if (rc == MS_OK) {
    grow_alloc = calloc(n + 2, sizeof *grow_alloc);
    grow_active = calloc(n + 2, sizeof *grow_active);
    if (!grow_alloc || !grow_active) rc = MS_ENOMEM;
  }
  bool grew = false;
  for (size_t i = 0; rc == MS_OK && i < n; i++) {
    const ms_snap_trace_t *e = &d->trace[i];
    if (e->action != MS_TRACE_FREE_COMPLETED) continue;
    const ms_snap_trace_t *src = d->pair[i] != TL_NONE ? &d->trace[d->pair[i]] : e;
    uint64_t space = room[i] - e->addr, r = tl_round(src->size);
    uint64_t size = r >= space || (src->size > TL_SMALL_SIZE && space - r <= TL_SMALL_SIZE) ? space : r;
    if (size == d->bsize[i]) continue;
    grew = true;
    int64_t delta = (int64_t)(size - d->bsize[i]);
    size_t born = d->pair[i] != TL_NONE ? (size_t)d->pair[i] + 1 : 0;
    d->bsize[i] = size;
    if (d->pair[i] != TL_NONE) d->bsize[d->pair[i]] = size;
    if (!counted[i]) continue; /* outside the filter: not in the totals */
    tl_diff_add(grow_active, born, i, delta);
    if (freq[i] != TL_NONE) tl_diff_add(grow_alloc, born, freq[i], delta);
  }
  if (rc == MS_OK && grew) {
    int64_t a = 0, b = 0;
    for (size_t st = 0; st <= n; st++) {
      a += grow_alloc[st];
      b += grow_active[st];
      d->series[MS_TL_ALLOCATED][st] += (uint64_t)a;
      d->series[MS_TL_ACTIVE][st] += (uint64_t)b;
    }
    /* the checkpoints hold the blocks at their first sizes: give them the final ones */
    for (size_t k = 0; k < d->ckpts.len; k++) {
      tl_ckpt_t *ckp = &d->ckpts.ptr[k];
      for (size_t j = 0; j < ckp->nblocks; j++) {
        ms_tl_block_t *bl = &ckp->blocks[j];
        if ((bl->flags & MS_TL_BLOCK_SIZE_INFERRED) && bl->free_entry >= 0)
          bl->size = d->bsize[bl->free_entry];
      }
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++) ckp->totals[m] = d->series[m][ckp->step];
    }
  }
  free(grow_alloc);
  free(grow_active);
  free(room);
  free(freq);
  free(counted);
  if (rc == MS_ENOMEM) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory indexing the trace");
  if (rc != MS_OK) return rc;
  /* checkpoints were taken newest first: put them in increasing step order */
  for (size_t a = 0, b = d->ckpts.len ? d->ckpts.len - 1 : 0; a < b; a++, b--) {
    tl_ckpt_t t = d->ckpts.ptr[a];
    d->ckpts.ptr[a] = d->ckpts.ptr[b];
    d->ckpts.ptr[b] = t;
  }
  return MS_OK;
}

void ms_timeline_config_init(ms_timeline_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->checkpoint_every = 1024;
}

void ms_timeline_destroy(ms_timeline_t *tl) {
  if (!tl) return;
  for (size_t i = 0; i < tl->ndev; i++) {
    tl_dev_t *d = &tl->dev[i];
    free(d->pair);
    free(d->bsize);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) free(d->series[m]);
    for (size_t k = 0; k < d->ckpts.len; k++) tl_ckpt_free(&d->ckpts.ptr[k]);
    free(d->ckpts.ptr);
  }
  free(tl->dev);
  free(tl);
}

int ms_timeline_create(const ms_snapshot_t *snap, const ms_timeline_config_t *cfg,
                       ms_timeline_t **out, ms_errbuf_t *eb) {
  if (!snap || !out) return ms__errbuf_set(eb, MS_EINVAL, "no snapshot");
  size_t ndev = snap->ndevices;
  for (size_t i = 0; i < snap->nsegments; i++) {
    int64_t dv = snap->segments[i].device;
    if (dv < 0 || dv >= TL_MAX_DEVICES)
      return ms__errbuf_set(eb, MS_ELIMIT, "segment 0x%" PRIx64 " names device %" PRId64,
                            snap->segments[i].address, dv);
    if ((size_t)dv + 1 > ndev) ndev = (size_t)dv + 1;
  }
  if (ndev > TL_MAX_DEVICES)
    return ms__errbuf_set(eb, MS_ELIMIT, "%zu devices: more than %d", ndev, TL_MAX_DEVICES);
  ms_timeline_t *tl = calloc(1, sizeof *tl);
  if (!tl) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  tl->snap = snap;
  tl->k = cfg && cfg->checkpoint_every ? cfg->checkpoint_every : 1024;
  if (cfg) tl->filter = cfg->filter;
  tl->ndev = ndev;
  tl->dev = calloc(ndev ? ndev : 1, sizeof *tl->dev);
  if (!tl->dev) {
    free(tl);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < ndev; i++) {
    tl_dev_t *d = &tl->dev[i];
    if (i < snap->ndevices) {
      const ms_snap_device_t *sd = &snap->devices[i];
      if ((size_t)sd->first_trace + sd->ntrace > snap->ntrace) {
        ms_timeline_destroy(tl);
        return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: trace out of range", i);
      }
      d->trace = snap->trace + sd->first_trace;
      d->n = sd->ntrace;
    }
    int rc = tl_build_dev(tl, i, eb);
    if (rc != MS_OK) {
      ms_timeline_destroy(tl);
      return rc;
    }
  }
  *out = tl;
  return MS_OK;
}

/* ---- queries ------------------------------------------------------------------------------- */

const ms_snapshot_t *ms_timeline_snapshot(const ms_timeline_t *tl) {
  return tl->snap;
}
size_t ms_timeline_ndevices(const ms_timeline_t *tl) {
  return tl->ndev;
}
size_t ms_timeline_nentries(const ms_timeline_t *tl, size_t dev) {
  return dev < tl->ndev ? tl->dev[dev].n : 0;
}
const ms_snap_trace_t *ms_timeline_entry(const ms_timeline_t *tl, size_t dev, size_t i) {
  return &tl->dev[dev].trace[i];
}

const char *ms_tl_metric_name(ms_tl_metric m) {
  switch (m) {
  case MS_TL_ALLOCATED:
    return "allocated";
  case MS_TL_ACTIVE:
    return "active";
  case MS_TL_REQUESTED:
    return "requested";
  case MS_TL_RESERVED:
    return "reserved";
  default:
    return "?";
  }
}

const uint64_t *ms_timeline_series(const ms_timeline_t *tl, size_t dev, ms_tl_metric m) {
  if (dev >= tl->ndev || (unsigned)m >= MS_TL_METRIC_COUNT) return NULL;
  return tl->dev[dev].series[m];
}

int ms_timeline_peak(const ms_timeline_t *tl, size_t dev, ms_tl_metric m, size_t from, size_t to,
                     ms_tl_peak_t *out) {
  if (dev >= tl->ndev || (unsigned)m >= MS_TL_METRIC_COUNT) return MS_EINVAL;
  const tl_dev_t *d = &tl->dev[dev];
  if (to > d->n) to = d->n;
  if (from > to) return MS_EINVAL;
  const uint64_t *v = d->series[m];
  size_t best = from;
  for (size_t s = from + 1; s <= to; s++)
    if (v[s] > v[best]) best = s;
  ms_tl_peak_t p;
  memset(&p, 0, sizeof p);
  p.bytes = v[best];
  p.step = best;
  p.entry = (int64_t)best - 1;
  if (best > 0 && (d->trace[best - 1].present & MS_TRACE_HAS_TIME)) {
    p.has_time = true;
    p.time_us = d->trace[best - 1].time_us;
  }
  *out = p;
  return MS_OK;
}

/* Brings w to the given step: restores the nearest checkpoint at or after it and undoes. */
static int tl_reach(const ms_timeline_t *tl, size_t dev, size_t step, tl_ws_t *w) {
  tl_dev_t *d = &tl->dev[dev];
  size_t lo = 0, hi = d->ckpts.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->ckpts.ptr[mid].step < step)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (lo >= d->ckpts.len) return MS_EINVAL;
  const tl_ckpt_t *c = &d->ckpts.ptr[lo];
  int rc = tl_ckpt_restore(c, w);
  tl_ctx_t cx = {tl, d, dev, false, NULL, NULL, NULL, NULL};
  for (size_t i = c->step; rc == MS_OK && i-- > step;) rc = tl_undo(&cx, w, i);
  return rc;
}

void ms_timeline_state_init(ms_tl_state_t *st) {
  memset(st, 0, sizeof *st);
}

void ms_timeline_state_release(ms_tl_state_t *st) {
  if (!st) return;
  free(st->segments);
  free(st->blocks);
  memset(st, 0, sizeof *st);
}

static int tl_state_from_ws(const tl_ws_t *w, size_t dev, size_t step, ms_tl_state_t *st) {
  if (w->segs.len > st->cap_segments_) {
    void *p = realloc(st->segments, w->segs.len * sizeof *st->segments);
    if (!p) return MS_ENOMEM;
    st->segments = p;
    st->cap_segments_ = w->segs.len;
  }
  if (w->nlive > st->cap_blocks_) {
    void *p = realloc(st->blocks, w->nlive * sizeof *st->blocks);
    if (!p) return MS_ENOMEM;
    st->blocks = p;
    st->cap_blocks_ = w->nlive;
  }
  size_t k = 0;
  for (size_t i = 0; i < w->segs.len; i++) {
    st->segments[i] = w->segs.ptr[i].seg;
    if (w->segs.ptr[i].blk.len)
      memcpy(st->blocks + k, w->segs.ptr[i].blk.ptr,
             w->segs.ptr[i].blk.len * sizeof *st->blocks);
    k += w->segs.ptr[i].blk.len;
  }
  st->nsegments = w->segs.len;
  st->nblocks = k;
  st->device = dev;
  st->step = step;
  memcpy(st->totals, w->totals, sizeof st->totals);
  return MS_OK;
}

/* The working state equivalent of a filled ms_tl_state_t. */
static int tl_ws_from_state(const ms_timeline_t *tl, const ms_tl_state_t *st, tl_ws_t *w) {
  memset(w, 0, sizeof *w);
  w->filter = tl_filter_of(tl);
  if (MS_VEC_RESERVE(&w->segs, st->nsegments ? st->nsegments : 1)) return MS_ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < st->nsegments; i++) {
    tl_wseg_t *s = &w->segs.ptr[w->segs.len++];
    memset(s, 0, sizeof *s);
    s->seg = st->segments[i];
    uint64_t end = s->seg.address + s->seg.size;
    size_t k0 = k;
    while (k < st->nblocks && st->blocks[k].address < end) k++;
    if (k > k0) {
      if (MS_VEC_RESERVE(&s->blk, k - k0)) return MS_ENOMEM;
      memcpy(s->blk.ptr, st->blocks + k0, (k - k0) * sizeof *st->blocks);
      s->blk.len = k - k0;
    }
  }
  memcpy(w->totals, st->totals, sizeof w->totals);
  w->nlive = k;
  return MS_OK;
}

int ms_timeline_state_at(const ms_timeline_t *tl, size_t dev, size_t step, ms_tl_state_t *st) {
  if (dev >= tl->ndev || step > tl->dev[dev].n) return MS_EINVAL;
  tl_ws_t w;
  memset(&w, 0, sizeof w);
  w.filter = tl_filter_of(tl);
  int rc = tl_reach(tl, dev, step, &w);
  if (rc == MS_OK) rc = tl_state_from_ws(&w, dev, step, st);
  tl_ws_release(&w);
  return rc;
}

/* Redoes entry i (forwards): the inverse of tl_undo, with the sizes chosen when building. */
static int tl_redo(tl_ctx_t *c, tl_ws_t *w, size_t i) {
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
      b = tl_entry_block(d, i, d->pair[i], d->bsize[i], MS_BLOCK_ACTIVE_ALLOCATED);
    }
    tl_blockvec_t *v = &w->segs.ptr[si].blk;
    int rc = tl_blk_insert(v, tl_blk_lower(v, e->addr), &b);
    if (rc == MS_OK) tl_totals_block(w, &w->segs.ptr[si].seg, &b, +1);
    return rc;
  }
  case MS_TRACE_FREE_REQUESTED:
  case MS_TRACE_FREE_COMPLETED: {
    size_t si = tl_seg_find(w, e->addr);
    tl_blockvec_t *v = si == SIZE_MAX ? NULL : &w->segs.ptr[si].blk;
    size_t k = v ? tl_blk_lower(v, e->addr) : 0;
    if (!v || k >= v->len || v->ptr[k].address != e->addr) return MS_EINVAL;
    if (e->action == MS_TRACE_FREE_REQUESTED) {
      if (v->ptr[k].state == MS_BLOCK_ACTIVE_ALLOCATED) {
        v->ptr[k].state = MS_BLOCK_ACTIVE_PENDING_FREE;
        if (tl_counts(w, &w->segs.ptr[si].seg)) w->totals[MS_TL_ALLOCATED] -= v->ptr[k].size;
      }
      return MS_OK;
    }
    tl_totals_block(w, &w->segs.ptr[si].seg, &v->ptr[k], -1);
    tl_blk_remove(v, k);
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

int ms_timeline_state_advance(const ms_timeline_t *tl, ms_tl_state_t *st) {
  if (st->device >= tl->ndev || st->step >= tl->dev[st->device].n) return MS_EINVAL;
  tl_ws_t w;
  int rc = tl_ws_from_state(tl, st, &w);
  tl_ctx_t c = {tl, &tl->dev[st->device], st->device, false, NULL, NULL, NULL, NULL};
  if (rc == MS_OK) rc = tl_redo(&c, &w, st->step);
  if (rc == MS_OK) rc = tl_state_from_ws(&w, st->device, st->step + 1, st);
  tl_ws_release(&w);
  return rc;
}

/* ---- the state as a snapshot --------------------------------------------------------------- */

int ms_timeline_snapshot_at(const ms_timeline_t *tl, size_t dev, size_t step,
                            const ms_tl_filter_t *filter, ms_snapshot_t **out) {
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(tl, dev, step, &st);
  if (rc != MS_OK) return rc;
  const ms_snapshot_t *src = tl->snap;
  ms_snapshot_t *s = NULL;
  /* at most 2 blocks per live block + 1 per segment */
  size_t nseg = st.nsegments, maxb = 2 * st.nblocks + st.nsegments;
  ms_snap_segment_t *segs = malloc((nseg ? nseg : 1) * sizeof *segs);
  ms_snap_block_t *blks = malloc((maxb ? maxb : 1) * sizeof *blks);
  if (!segs || !blks || ms__snapshot_new_borrowing(src, &s) != MS_OK) {
    free(segs);
    free(blks);
    ms_timeline_state_release(&st);
    return MS_ENOMEM;
  }
  size_t ns = 0, nb = 0, k = 0;
  for (size_t i = 0; i < st.nsegments; i++) {
    const ms_tl_segment_t *g = &st.segments[i];
    uint64_t end = g->address + g->size;
    size_t k0 = k;
    while (k < st.nblocks && st.blocks[k].address < end) k++;
    if (!tl_filter_keeps(filter, g)) continue;
    ms_snap_segment_t *o = &segs[ns++];
    memset(o, 0, sizeof *o);
    if (g->snap_segment != TL_NONE && g->snap_segment < src->nsegments)
      *o = src->segments[g->snap_segment];
    o->device = (int64_t)dev;
    o->address = g->address;
    o->total_size = g->size;
    o->stream = g->stream;
    o->pool_id[0] = g->pool_id[0];
    o->pool_id[1] = g->pool_id[1];
    o->is_expandable = g->is_expandable;
    if (g->snap_segment == TL_NONE) {
      o->is_large = g->size > 2 * TL_SMALL_SIZE || g->is_expandable;
      o->stack = g->stack;
      o->present = MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE | MS_SEG_HAS_SEGMENT_TYPE |
                   (g->stack != MS_SNAP_NO_STACK ? MS_SEG_HAS_FRAMES : 0);
    }
    o->allocated_size = o->active_size = o->requested_size = 0;
    o->first_block = (uint32_t)nb;
    uint64_t at = g->address;
    for (size_t j = k0; j <= k; j++) {
      uint64_t next = j < k ? st.blocks[j].address : end;
      if (next > at) { /* a free gap */
        ms_snap_block_t *fb = &blks[nb++];
        memset(fb, 0, sizeof *fb);
        fb->address = at;
        fb->size = next - at;
        fb->state = MS_BLOCK_INACTIVE;
        fb->state_name = "inactive";
        fb->stack = MS_SNAP_NO_STACK;
        fb->present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
      }
      if (j == k) break;
      const ms_tl_block_t *b = &st.blocks[j];
      ms_snap_block_t *ob = &blks[nb++];
      memset(ob, 0, sizeof *ob);
      if (b->snap_block != TL_NONE && b->snap_block < src->nblocks) *ob = src->blocks[b->snap_block];
      ob->address = b->address;
      ob->size = b->size;
      ob->requested_size = b->requested_size;
      ob->state = b->state;
      ob->state_name = ms_block_state_name(b->state);
      if (b->snap_block == TL_NONE) {
        ob->stack = b->stack;
        ob->first_history = 0;
        ob->nhistory = 0;
        ob->present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
      }
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) o->allocated_size += b->size;
      o->active_size += b->size;
      o->requested_size += b->requested_size;
      at = b->address + b->size;
    }
    o->nblocks = (uint32_t)(nb - o->first_block);
  }
  ms_timeline_state_release(&st);
  s->segments = segs;
  s->nsegments = ns;
  s->blocks = blks;
  s->nblocks = nb;
  *out = s;
  return MS_OK;
}

/* ---- moments ------------------------------------------------------------------------------- */

static bool tl_parse_i64(const char *s, int64_t *out) {
  if (!*s) return false;
  bool neg = *s == '-';
  if (neg) s++;
  if (!*s) return false;
  uint64_t v = 0;
  for (; *s; s++) {
    if (*s < '0' || *s > '9') return false;
    if (v > (UINT64_MAX - 9) / 10) return false;
    v = v * 10 + (uint64_t)(*s - '0');
  }
  if (v > (uint64_t)INT64_MAX) return false;
  *out = neg ? -(int64_t)v : (int64_t)v;
  return true;
}

int ms_tl_moment_parse(const char *text, ms_tl_moment_t *out, ms_errbuf_t *eb) {
  ms_tl_moment_t m = {MS_TL_MOMENT_PEAK, 0};
  if (!text) return ms__errbuf_set(eb, MS_EINVAL, "empty moment");
  size_t len = strlen(text);
  char buf[64];
  if (strcmp(text, "peak") == 0) {
    m.kind = MS_TL_MOMENT_PEAK;
  } else if (strcmp(text, "peak-reserved") == 0) {
    m.kind = MS_TL_MOMENT_PEAK_RESERVED;
  } else if (strcmp(text, "end") == 0) {
    m.kind = MS_TL_MOMENT_END;
  } else if (strncmp(text, "t=", 2) == 0 && tl_parse_i64(text + 2, &m.value)) {
    m.kind = MS_TL_MOMENT_TIME;
  } else if (len > 2 && len < sizeof buf && strcmp(text + len - 2, "us") == 0) {
    memcpy(buf, text, len - 2);
    buf[len - 2] = 0;
    if (!tl_parse_i64(buf, &m.value)) goto bad;
    m.kind = MS_TL_MOMENT_TIME;
  } else if (tl_parse_i64(text, &m.value) && m.value >= -1) {
    m.kind = MS_TL_MOMENT_ENTRY;
  } else {
    goto bad;
  }
  *out = m;
  return MS_OK;
bad:
  return ms__errbuf_set(eb, MS_EINVAL,
                        "invalid moment '%.100s' (expected peak, peak-reserved, end, an entry "
                        "index such as 123, or a time such as t=1700000000123456 or "
                        "1700000000123456us)",
                        text);
}

int ms_timeline_moment_step(const ms_timeline_t *tl, size_t dev, const ms_tl_moment_t *m,
                            size_t from, size_t to, size_t *step, ms_errbuf_t *eb) {
  if (dev >= tl->ndev) return ms__errbuf_set(eb, MS_EINVAL, "no device %zu", dev);
  const tl_dev_t *d = &tl->dev[dev];
  if (to > d->n) to = d->n;
  if (from > to) return ms__errbuf_set(eb, MS_EINVAL, "empty range of entries");
  ms_tl_peak_t p;
  switch (m->kind) {
  case MS_TL_MOMENT_PEAK:
  case MS_TL_MOMENT_PEAK_RESERVED:
    if (ms_timeline_peak(tl, dev,
                         m->kind == MS_TL_MOMENT_PEAK ? MS_TL_ALLOCATED : MS_TL_RESERVED, from,
                         to, &p) != MS_OK)
      return ms__errbuf_set(eb, MS_EINVAL, "no peak");
    *step = p.step;
    return MS_OK;
  case MS_TL_MOMENT_END:
    *step = to;
    return MS_OK;
  case MS_TL_MOMENT_ENTRY:
    if (m->value >= (int64_t)d->n)
      return ms__errbuf_set(eb, MS_EINVAL,
                            "entry %" PRId64 " is past the trace of device %zu (%zu entries)",
                            m->value, dev, d->n);
    *step = (size_t)(m->value + 1);
    return MS_OK;
  case MS_TL_MOMENT_TIME: {
    /* the last entry whose time is <= the moment (times need not be sorted: scan) */
    size_t best = 0;
    bool any = false;
    for (size_t i = 0; i < d->n; i++) {
      const ms_snap_trace_t *e = &d->trace[i];
      if (!(e->present & MS_TRACE_HAS_TIME)) continue;
      any = true;
      if (e->time_us <= m->value) best = i + 1;
    }
    if (!any)
      return ms__errbuf_set(eb, MS_EINVAL, "the trace of device %zu has no times", dev);
    *step = best;
    return MS_OK;
  }
  }
  return ms__errbuf_set(eb, MS_EINVAL, "invalid moment");
}

/* ---- selecting segments of the end state ---------------------------------------------------- */

int ms_snapshot_select(const ms_snapshot_t *snap, size_t dev, const ms_tl_filter_t *filter,
                       ms_snapshot_t **out) {
  size_t ns = 0, nb = 0;
  for (size_t i = 0; i < snap->nsegments; i++) {
    const ms_snap_segment_t *g = &snap->segments[i];
    if (dev != SIZE_MAX && g->device != (int64_t)dev) continue;
    if (filter && !tl_filter_keeps_snap(filter, g)) continue;
    ns++;
    nb += g->nblocks;
  }
  ms_snapshot_t *s = NULL;
  ms_snap_segment_t *segs = malloc((ns ? ns : 1) * sizeof *segs);
  ms_snap_block_t *blks = malloc((nb ? nb : 1) * sizeof *blks);
  if (!segs || !blks || ms__snapshot_new_borrowing(snap, &s) != MS_OK) {
    free(segs);
    free(blks);
    return MS_ENOMEM;
  }
  ns = nb = 0;
  for (size_t i = 0; i < snap->nsegments; i++) {
    const ms_snap_segment_t *g = &snap->segments[i];
    if (dev != SIZE_MAX && g->device != (int64_t)dev) continue;
    if (filter && !tl_filter_keeps_snap(filter, g)) continue;
    segs[ns] = *g;
    segs[ns].first_block = (uint32_t)nb;
    if (g->nblocks) memcpy(blks + nb, snap->blocks + g->first_block, g->nblocks * sizeof *blks);
    nb += g->nblocks;
    ns++;
  }
  s->segments = segs;
  s->nsegments = ns;
  s->blocks = blks;
  s->nblocks = nb;
  *out = s;
  return MS_OK;
}
