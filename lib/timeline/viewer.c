/* SPDX-License-Identifier: MIT
 * memsnap core: PyTorch viewer's timeline data (memsnap/timeline.h, issue #12 §2): the exact
 * computation of MemoryViz.js's `annotate_snapshot` + `process_alloc_data` for the "Active Memory
 * Timeline" and the "Active Cached Segment Timeline" (private-pool envelopes aside: that view is
 * another tab), and its JSON.
 *
 * Where MemoryViz keeps the position of an element in its stack with findLastIndex (a scan), this
 * keeps each element's position and renumbers only the elements above a freed one, which it
 * visits anyway to slide them down; the numbers are the same.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/timeline.h"
#include "common/vec.h"

/* Sizes and sums are exact int64_t (beyond 2^53, where the page's doubles are not, the page is
 * given max_at_time): a size, or memory alive at once, of 2^62 bytes or more (4 EiB, in no real
 * trace; a hostile one asked for 2^63) is refused with MS_ELIMIT instead of being summed past
 * int64_t. Every sum below adds two values <= TLV_MAX_BYTES: no overflow. */
#define TLV_MAX_BYTES (((int64_t)1 << 62) - 1)

typedef struct tlv_elem_s {
  int64_t size;
  int64_t source; /* trace index, or -1 - k for the snapshot's block / segment k */
  bool ghost;
} tlv_elem_t;

typedef struct tlv_point_s {
  uint32_t series;
  int64_t t;
  int64_t off;
} tlv_point_t;

/* address -> element index map (open addressing, the element index + 1; 0 = empty) */
typedef struct tlv_map_s {
  uint64_t *key;
  uint32_t *val;
  size_t cap, len;
} tlv_map_t;

static size_t tlv_hash(uint64_t k, size_t cap) {
  return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static int tlv_map_grow(tlv_map_t *m) {
  size_t cap = m->cap ? m->cap * 2 : 1024;
  uint64_t *key = malloc(cap * sizeof *key);
  uint32_t *val = calloc(cap, sizeof *val);
  if (!key || !val) {
    free(key);
    free(val);
    return MS_ENOMEM;
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->val[i]) continue;
    size_t h = tlv_hash(m->key[i], cap);
    while (val[h]) h = (h + 1) & (cap - 1);
    key[h] = m->key[i];
    val[h] = m->val[i];
  }
  free(m->key);
  free(m->val);
  m->key = key;
  m->val = val;
  m->cap = cap;
  return MS_OK;
}

static uint32_t tlv_map_get(const tlv_map_t *m, uint64_t k) {
  if (!m->cap) return 0;
  size_t h = tlv_hash(k, m->cap);
  while (m->val[h]) {
    if (m->key[h] == k) return m->val[h];
    h = (h + 1) & (m->cap - 1);
  }
  return 0;
}

static int tlv_map_set(tlv_map_t *m, uint64_t k, uint32_t v) {
  if ((m->len + 1) * 2 > m->cap && tlv_map_grow(m)) return MS_ENOMEM;
  size_t h = tlv_hash(k, m->cap);
  while (m->val[h] && m->key[h] != k) h = (h + 1) & (m->cap - 1);
  if (!m->val[h]) m->len++;
  m->key[h] = k;
  m->val[h] = v;
  return MS_OK;
}

static void tlv_map_del(tlv_map_t *m, uint64_t k) {
  if (!m->cap) return;
  size_t h = tlv_hash(k, m->cap);
  while (m->val[h] && m->key[h] != k) h = (h + 1) & (m->cap - 1);
  if (!m->val[h]) return;
  m->val[h] = 0;
  m->len--;
  size_t j = h;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (!m->val[j]) return;
    size_t home = tlv_hash(m->key[j], m->cap);
    bool move = (j > h) ? (home <= h || home > j) : (home <= h && home > j);
    if (move) {
      m->key[h] = m->key[j];
      m->val[h] = m->val[j];
      m->val[j] = 0;
      h = j;
    }
  }
}

size_t ms_tl_viewer_devices(const ms_snapshot_t *snap, size_t *devs, size_t cap, size_t *def) {
  size_t ndev = snap->ndevices;
  for (size_t i = 0; i < snap->nsegments; i++) {
    int64_t d = snap->segments[i].device;
    if (d >= 0 && d < 4096 && (size_t)d + 1 > ndev) ndev = (size_t)d + 1;
  }
  size_t n = 0, best = 0, bestlen = 0;
  bool have_best = false;
  for (size_t d = 0; d < ndev; d++) {
    size_t len = d < snap->ndevices ? snap->devices[d].ntrace : 0;
    bool listed = len > 0;
    for (size_t i = 0; !listed && i < snap->nsegments; i++)
      listed = snap->segments[i].device == (int64_t)d;
    if (!listed) continue;
    if (n < cap) devs[n] = d;
    n++;
    if (!have_best || len > bestlen) {
      best = d;
      bestlen = len;
      have_best = true;
    }
  }
  if (def) *def = best;
  return n;
}

/* annotate_snapshot's requested_size of a block */
static int64_t tlv_block_requested(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (!(b->present & MS_BLOCK_HAS_FRAMES)) {
    bool has_req = (b->present & MS_BLOCK_HAS_REQUESTED_SIZE) && b->requested_size != 0;
    if (b->present & MS_BLOCK_HAS_HISTORY) {
      if (has_req) return (int64_t)b->requested_size;
      if (b->nhistory > 0 && b->first_history < s->nhistory)
        return (int64_t)s->history[b->first_history].real_size;
      return (int64_t)b->size;
    }
    return has_req ? (int64_t)b->requested_size : (int64_t)b->size;
  }
  if (b->present & MS_BLOCK_HAS_REQUESTED_SIZE || s->origin == MS_SNAP_ORIGIN_MEMSNAP)
    return (int64_t)b->requested_size;
  return (int64_t)b->size;
}

typedef struct tlv_sort_s {
  int64_t size;
  uint32_t idx;
} tlv_sort_t;

static int tlv_sort_cmp(const void *a, const void *b) {
  const tlv_sort_t *x = a, *y = b;
  if (x->size != y->size) return x->size > y->size ? -1 : 1; /* descending */
  return x->idx < y->idx ? -1 : x->idx > y->idx;             /* stable */
}

typedef struct tlv_run_s {
  MS_VEC(tlv_point_t) pts;
  MS_VEC(int64_t) mat;     /* max_at_time */
  MS_VEC(int64_t) s_t;     /* summarized band */
  MS_VEC(int64_t) s_off;
  MS_VEC(int64_t) s_size;
  int64_t t, total, summ;
  int oom;
  int beyond; /* total passed TLV_MAX_BYTES (tlv_add) */
} tlv_run_t;

static void tlv_advance(tlv_run_t *r, int64_t n) {
  if (MS_VEC_PUSH(&r->s_t, r->t) || MS_VEC_PUSH(&r->s_off, r->total) ||
      MS_VEC_PUSH(&r->s_size, r->summ) || MS_VEC_RESERVE(&r->mat, (size_t)n)) {
    r->oom = 1;
    return;
  }
  r->t += n;
  for (int64_t i = 0; i < n; i++) r->mat.ptr[r->mat.len++] = r->total + r->summ;
}

static void tlv_point(tlv_run_t *r, int64_t *last_off, uint32_t series, int64_t t, int64_t off) {
  tlv_point_t p = {series, t, off};
  last_off[series] = off;
  if (MS_VEC_PUSH(&r->pts, p)) r->oom = 1;
}

/* The state of one computation (ms_tlv_compute), phase by phase. */
typedef struct tlv_ctx_s {
  MS_VEC(tlv_elem_t) el;       /* elements: allocations (or segments) in the viewer's order */
  MS_VEC(uint32_t) actions;    /* element per alloc/free action */
  MS_VEC(uint32_t) initially;  /* elements present before the first action */
  tlv_map_t map;               /* address -> element + 1 of the open allocations */
  tlv_run_t r;                 /* the replay's points, band and max_at_time */
  MS_VEC(ms_tlv_series_t) ser; /* one series per drawn element, in the order they appear */
  uint32_t *cur, *series_of;   /* the stack of drawn elements; element -> series */
  int64_t *pos, *last_off;     /* element -> place in the stack (-1 = none); series -> offset */
  uint8_t *drawn, *summarized; /* element drawn on its own; element in the band (1) or out (2) */
  tlv_sort_t *order;
  size_t ncur;
  int64_t max_size;
} tlv_ctx_t;

static void tlv_ctx_release(tlv_ctx_t *c) {
  free(c->el.ptr);
  free(c->actions.ptr);
  free(c->initially.ptr);
  free(c->map.key);
  free(c->map.val);
  free(c->r.pts.ptr);
  free(c->r.mat.ptr);
  free(c->r.s_t.ptr);
  free(c->r.s_off.ptr);
  free(c->r.s_size.ptr);
  free(c->cur);
  free(c->series_of);
  free(c->pos);
  free(c->last_off);
  free(c->drawn);
  free(c->summarized);
  free(c->order);
  free(c->ser.ptr);
}

/* Phase 1, process_alloc_data's matching: allocs open elements, frees close them or (unmatched)
 * become elements present from the start. A free_completed directly after a free_requested of
 * the same address merges into one `free` at the free_requested's place (annotate_snapshot). */
static int tlv_match_trace(tlv_ctx_t *c, const ms_snap_trace_t *trace, size_t first, size_t last,
                           bool plot_segments) {
  ms_trace_action a_alloc = plot_segments ? MS_TRACE_SEGMENT_ALLOC : MS_TRACE_ALLOC;
  for (size_t i = first; i < last; i++) {
    const ms_snap_trace_t *e = &trace[i];
    bool is_free;
    if (plot_segments) {
      is_free = e->action == MS_TRACE_SEGMENT_FREE;
    } else {
      bool merged_free = e->action == MS_TRACE_FREE_REQUESTED && i + 1 < last &&
                         trace[i + 1].action == MS_TRACE_FREE_COMPLETED &&
                         trace[i + 1].addr == e->addr;
      bool dropped = e->action == MS_TRACE_FREE_COMPLETED && i > first &&
                     trace[i - 1].action == MS_TRACE_FREE_REQUESTED &&
                     trace[i - 1].addr == e->addr;
      is_free = merged_free || (e->action == MS_TRACE_FREE_COMPLETED && !dropped);
    }
    if (e->action == a_alloc) {
      if (e->size > (uint64_t)TLV_MAX_BYTES) return MS_ELIMIT;
      tlv_elem_t x = {(int64_t)e->size, (int64_t)i, false};
      if (MS_VEC_PUSH(&c->el, x)) return MS_ENOMEM;
      if (tlv_map_set(&c->map, e->addr, (uint32_t)c->el.len)) return MS_ENOMEM;
      if (MS_VEC_PUSH(&c->actions, (uint32_t)(c->el.len - 1))) return MS_ENOMEM;
    } else if (is_free) {
      uint32_t v = tlv_map_get(&c->map, e->addr);
      if (v) {
        if (MS_VEC_PUSH(&c->actions, v - 1)) return MS_ENOMEM;
        tlv_map_del(&c->map, e->addr);
      } else {
        if (e->size > (uint64_t)TLV_MAX_BYTES) return MS_ELIMIT;
        tlv_elem_t x = {(int64_t)e->size, (int64_t)i, false};
        if (MS_VEC_PUSH(&c->el, x)) return MS_ENOMEM;
        if (MS_VEC_PUSH(&c->initially, (uint32_t)(c->el.len - 1))) return MS_ENOMEM;
        if (MS_VEC_PUSH(&c->actions, (uint32_t)(c->el.len - 1))) return MS_ENOMEM;
      }
    }
  }
  return MS_OK;
}

/* Phase 2: segments (plot_segments) or active allocated blocks of the snapshot that no alloc of
 * the trace opened are present from the start (ghosts, for blocks). */
static int tlv_add_snapshot(tlv_ctx_t *c, const ms_snapshot_t *segsrc, size_t dev,
                            bool plot_segments) {
  for (size_t si = 0; si < segsrc->nsegments; si++) {
    const ms_snap_segment_t *g = &segsrc->segments[si];
    if (g->device != (int64_t)dev) continue;
    if (plot_segments) {
      if (!tlv_map_get(&c->map, g->address)) {
        if (g->total_size > (uint64_t)TLV_MAX_BYTES) return MS_ELIMIT;
        tlv_elem_t x = {(int64_t)g->total_size, -1 - (int64_t)si, false};
        if (MS_VEC_PUSH(&c->el, x) || MS_VEC_PUSH(&c->initially, (uint32_t)(c->el.len - 1)))
          return MS_ENOMEM;
      }
      continue;
    }
    uint64_t addr = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const ms_snap_block_t *b = &segsrc->blocks[(size_t)g->first_block + k];
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED && !tlv_map_get(&c->map, addr)) {
        tlv_elem_t x = {tlv_block_requested(segsrc, b), -1 - (int64_t)(g->first_block + k), true};
        if (x.size < 0 || x.size > TLV_MAX_BYTES) return MS_ELIMIT;
        if (MS_VEC_PUSH(&c->el, x) || MS_VEC_PUSH(&c->initially, (uint32_t)(c->el.len - 1)))
          return MS_ENOMEM;
      }
      addr += b->size;
    }
  }
  return c->el.len > UINT32_MAX - 2 ? MS_ELIMIT : MS_OK;
}

/* Between the phases: reverse(initially) (with no actions, the last one present becomes an
 * action); the max_entries largest elements are drawn on their own. */
static int tlv_prepare(tlv_ctx_t *c, size_t max_entries) {
  for (size_t a = 0, b = c->initially.len ? c->initially.len - 1 : 0; a < b; a++, b--) {
    uint32_t t = c->initially.ptr[a];
    c->initially.ptr[a] = c->initially.ptr[b];
    c->initially.ptr[b] = t;
  }
  if (c->actions.len == 0 && c->initially.len > 0) {
    if (MS_VEC_PUSH(&c->actions, c->initially.ptr[c->initially.len - 1])) return MS_ENOMEM;
    c->initially.len--;
  }
  size_t ne = c->el.len, n1 = ne ? ne : 1;
  c->order = malloc(n1 * sizeof *c->order);
  c->drawn = calloc(n1, 1);
  c->summarized = calloc(n1, 1);
  c->pos = malloc(n1 * sizeof *c->pos);
  c->series_of = malloc(n1 * sizeof *c->series_of);
  c->cur = malloc(n1 * sizeof *c->cur);
  c->last_off = malloc((2 * ne + 1) * sizeof *c->last_off);
  if (!c->order || !c->drawn || !c->summarized || !c->pos || !c->series_of || !c->cur ||
      !c->last_off)
    return MS_ENOMEM;
  for (size_t i = 0; i < ne; i++) {
    c->order[i] = (tlv_sort_t){c->el.ptr[i].size, (uint32_t)i};
    c->pos[i] = -1;
  }
  qsort(c->order, ne, sizeof *c->order, tlv_sort_cmp);
  for (size_t i = 0; i < ne && i < max_entries; i++) c->drawn[c->order[i].idx] = 1;
  if (MS_VEC_PUSH(&c->r.s_off, 0)) return MS_ENOMEM; /* the band's offsets start with [total] */
  return MS_OK;
}

/* add_allocation(e): a new series on top of the stack. */
static void tlv_add(tlv_ctx_t *c, uint32_t e) {
  ms_tlv_series_t s;
  memset(&s, 0, sizeof s);
  s.elem = e;
  s.size = c->el.ptr[e].size;
  s.color = e;
  s.ghost = c->el.ptr[e].ghost;
  if (MS_VEC_PUSH(&c->ser, s)) {
    c->r.oom = 1;
    return;
  }
  c->series_of[e] = (uint32_t)(c->ser.len - 1);
  c->pos[e] = (int64_t)c->ncur;
  c->cur[c->ncur++] = e;
  tlv_point(&c->r, c->last_off, c->series_of[e], c->r.t, c->r.total);
  c->r.total += c->el.ptr[e].size; /* both <= TLV_MAX_BYTES */
  if (c->r.total > TLV_MAX_BYTES) c->r.beyond = 1;
}

/* A drawn element freed: its series ends, those above it move down by its size. */
static void tlv_remove(tlv_ctx_t *c, uint32_t e, int64_t size) {
  tlv_run_t *r = &c->r;
  size_t idx = (size_t)c->pos[e];
  tlv_advance(r, 1);
  uint32_t sid = c->series_of[e];
  tlv_point(r, c->last_off, sid, r->t, c->last_off[sid]);
  memmove(c->cur + idx, c->cur + idx + 1, (c->ncur - idx - 1) * sizeof *c->cur);
  c->ncur--;
  c->pos[e] = -1;
  if (idx < c->ncur) {
    for (size_t j = idx; j < c->ncur; j++) {
      uint32_t o = c->cur[j];
      uint32_t so = c->series_of[o];
      c->pos[o] = (int64_t)j;
      tlv_point(r, c->last_off, so, r->t, c->last_off[so]);
      tlv_point(r, c->last_off, so, r->t + 3, c->last_off[so] - size);
    }
    tlv_advance(r, 3);
  }
  r->total -= size;
}

/* Phase 3: the stacked timeline, replaying the elements present at the start, then the actions. */
static int tlv_replay(tlv_ctx_t *c) {
  tlv_run_t *r = &c->r;
  for (size_t i = 0; i < c->initially.len; i++) {
    uint32_t e = c->initially.ptr[i];
    if (c->drawn[e]) {
      tlv_add(c, e);
    } else {
      r->summ += c->el.ptr[e].size;
      c->summarized[e] = 1;
      if (r->summ > TLV_MAX_BYTES) r->beyond = 1;
    }
    if (r->beyond) return MS_ELIMIT;
  }
  for (size_t k = 0; k < c->actions.len && !r->oom; k++) {
    uint32_t e = c->actions.ptr[k];
    int64_t size = c->el.ptr[e].size;
    if (!c->drawn[e]) {
      if (c->summarized[e]) {
        tlv_advance(r, 1);
        r->summ -= size;
        c->summarized[e] = 2; /* MemoryViz sets it to null: still "in" the map */
      } else {
        r->summ += size;
        c->summarized[e] = 1;
        if (r->summ > TLV_MAX_BYTES) return MS_ELIMIT; /* before total + summ is formed */
        tlv_advance(r, 1);
      }
      continue;
    }
    if (c->pos[e] < 0) {
      tlv_add(c, e);
      if (r->beyond) return MS_ELIMIT;
      tlv_advance(r, 1);
    } else {
      tlv_remove(c, e, size);
    }
    if (r->total + r->summ > c->max_size) c->max_size = r->total + r->summ;
  }
  for (size_t j = 0; j < c->ncur; j++) {
    uint32_t so = c->series_of[c->cur[j]];
    tlv_point(r, c->last_off, so, r->t, c->last_off[so]);
  }
  return r->oom ? MS_ENOMEM : MS_OK;
}

/* The output: points grouped by series (a stable counting sort), the summarized band last (its
 * offsets have one more value than its timesteps). */
static int tlv_output(tlv_ctx_t *c, size_t dev, bool plot_segments, ms_tlv_t *out) {
  tlv_run_t *r = &c->r;
  size_t ns = c->ser.len, ne = c->el.len;
  size_t *cnt = calloc(ns + 1, sizeof *cnt);
  if (!cnt) return MS_ENOMEM;
  for (size_t i = 0; i < r->pts.len; i++) cnt[r->pts.ptr[i].series + 1]++;
  for (size_t i = 0; i < ns; i++) {
    c->ser.ptr[i].first_point = cnt[i];
    c->ser.ptr[i].npoints = cnt[i + 1];
    cnt[i + 1] += cnt[i];
  }
  size_t band_pts = r->s_t.len;
  size_t total_pts = r->pts.len + band_pts;
  memset(out, 0, sizeof *out);
  out->timesteps = malloc((total_pts + 1) * sizeof(int64_t));
  out->offsets = malloc((total_pts + 2) * sizeof(int64_t));
  out->sizes = malloc((total_pts + 1) * sizeof(int64_t));
  if (!out->timesteps || !out->offsets || !out->sizes || MS_VEC_RESERVE(&c->ser, 1)) {
    free(cnt);
    free(out->timesteps);
    free(out->offsets);
    free(out->sizes);
    return MS_ENOMEM;
  }
  for (size_t i = 0; i < r->pts.len; i++) {
    size_t at = cnt[r->pts.ptr[i].series]++;
    out->timesteps[at] = r->pts.ptr[i].t;
    out->offsets[at] = r->pts.ptr[i].off;
    out->sizes[at] = 0;
  }
  free(cnt);
  ms_tlv_series_t band;
  memset(&band, 0, sizeof band);
  band.elem = -1;
  band.first_point = r->pts.len;
  band.npoints = band_pts;
  if (band_pts) { /* an empty band has no buffers: memcpy from NULL is undefined even for 0 bytes */
    memcpy(out->timesteps + r->pts.len, r->s_t.ptr, band_pts * sizeof(int64_t));
    memcpy(out->sizes + r->pts.len, r->s_size.ptr, band_pts * sizeof(int64_t));
  }
  memcpy(out->offsets + r->pts.len, r->s_off.ptr, (band_pts + 1) * sizeof(int64_t));
  c->ser.ptr[c->ser.len++] = band;
  out->npoints = total_pts;
  out->device = dev;
  out->segments = plot_segments;
  out->max_size = c->max_size;
  out->elements_length = ne;
  out->max_at_time = r->mat.ptr;
  out->ntimesteps = r->mat.len;
  r->mat.ptr = NULL;
  out->series = c->ser.ptr;
  out->nseries = c->ser.len;
  c->ser.ptr = NULL;
  out->element_source = malloc((ne ? ne : 1) * sizeof(int64_t));
  if (!out->element_source) {
    ms_tlv_release(out);
    return MS_ENOMEM;
  }
  for (size_t i = 0; i < ne; i++) out->element_source[i] = c->el.ptr[i].source;
  return MS_OK;
}

int ms_tlv_compute(const ms_snapshot_t *snap, size_t dev, bool plot_segments, size_t max_entries,
                   size_t first, size_t last, const ms_snapshot_t *at_last, ms_tlv_t *out) {
  const ms_snapshot_t *segsrc = at_last ? at_last : snap;
  const ms_snap_trace_t *trace = NULL;
  size_t n = 0;
  if (dev >= 4096) return MS_EINVAL;
  if (dev < snap->ndevices) {
    n = snap->devices[dev].ntrace;
    trace = n ? snap->trace + snap->devices[dev].first_trace : NULL; /* not NULL + 0 */
  }
  if (last > n) last = n;
  if (first > last) first = last;
  tlv_ctx_t c;
  memset(&c, 0, sizeof c);
  int rc = tlv_match_trace(&c, trace, first, last, plot_segments);
  if (rc == MS_OK) rc = tlv_add_snapshot(&c, segsrc, dev, plot_segments);
  if (rc == MS_OK) rc = tlv_prepare(&c, max_entries);
  if (rc == MS_OK) rc = tlv_replay(&c);
  if (rc == MS_OK) rc = tlv_output(&c, dev, plot_segments, out);
  tlv_ctx_release(&c);
  return rc;
}

void ms_tlv_release(ms_tlv_t *v) {
  if (!v) return;
  free(v->max_at_time);
  free(v->series);
  free(v->timesteps);
  free(v->offsets);
  free(v->sizes);
  free(v->element_source);
  memset(v, 0, sizeof *v);
}

/* ---- JSON ---------------------------------------------------------------------------------- */

typedef struct tlv_out_s {
  ms_sink_t *sink;
  char buf[65536];
  size_t len;
  int err;
} tlv_out_t;

static void tlv_flush(tlv_out_t *o) {
  if (o->len && !o->err) o->err = o->sink->write(o->sink->ctx, o->buf, o->len);
  o->len = 0;
}

static void tlv_puts(tlv_out_t *o, const char *s) {
  size_t n = strlen(s);
  if (o->len + n > sizeof o->buf) tlv_flush(o);
  if (n > sizeof o->buf) {
    if (!o->err) o->err = o->sink->write(o->sink->ctx, s, n);
    return;
  }
  memcpy(o->buf + o->len, s, n);
  o->len += n;
}

static void tlv_int(tlv_out_t *o, int64_t v) {
  char t[32];
  snprintf(t, sizeof t, "%" PRId64, v);
  tlv_puts(o, t);
}

static void tlv_list(tlv_out_t *o, const int64_t *v, size_t n) {
  tlv_puts(o, "[");
  for (size_t i = 0; i < n; i++) {
    if (i) tlv_puts(o, ", ");
    tlv_int(o, v[i]);
  }
  tlv_puts(o, "]");
}

int ms_tlv_write_json(const ms_tlv_t *v, ms_sink_t *sink) {
  tlv_out_t *o = malloc(sizeof *o);
  if (!o) return MS_ENOMEM;
  o->sink = sink;
  o->len = 0;
  o->err = 0;
  tlv_puts(o, "{\"device\": ");
  tlv_int(o, (int64_t)v->device);
  tlv_puts(o, ", \"max_size\": ");
  tlv_int(o, v->max_size);
  tlv_puts(o, ", \"elements_length\": ");
  tlv_int(o, (int64_t)v->elements_length);
  tlv_puts(o, ",\n\"max_at_time\": ");
  tlv_list(o, v->max_at_time, v->ntimesteps);
  tlv_puts(o, ",\n\"allocations_over_time\": [");
  for (size_t i = 0; i < v->nseries; i++) {
    const ms_tlv_series_t *s = &v->series[i];
    tlv_puts(o, i ? ",\n{\"elem\": " : "\n{\"elem\": ");
    if (s->elem < 0)
      tlv_puts(o, "\"summarized\"");
    else
      tlv_int(o, s->elem);
    tlv_puts(o, ", \"timesteps\": ");
    tlv_list(o, v->timesteps + s->first_point, s->npoints);
    tlv_puts(o, ", \"offsets\": ");
    tlv_list(o, v->offsets + s->first_point, s->npoints + (s->elem < 0 ? 1 : 0));
    tlv_puts(o, ", \"size\": ");
    if (s->elem < 0)
      tlv_list(o, v->sizes + s->first_point, s->npoints);
    else
      tlv_int(o, s->size);
    tlv_puts(o, ", \"color\": ");
    tlv_int(o, s->color);
    if (s->ghost) tlv_puts(o, ", \"ghost\": true");
    tlv_puts(o, "}");
  }
  tlv_puts(o, "]}\n");
  tlv_flush(o);
  int err = o->err;
  free(o);
  return err ? err : MS_OK;
}
