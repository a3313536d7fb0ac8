/* SPDX-License-Identifier: MIT
 * memsnap core: PyTorch viewer's timeline data (memsnap/timeline.h, issue #12 §2): the exact
 * computation of MemoryViz.js's `annotate_snapshot` + `process_alloc_data` for the "Active Memory
 * Timeline" and the "Active Cached Segment Timeline" (private-pool envelopes aside: that view is
 * another tab), and its JSON.
 *
 * Where MemoryViz keeps the position of an element in its stack with findLastIndex (a scan), this
 * keeps each element's position and renumbers only the elements above a freed one, which it
 * visits anyway to slide them down; the numbers are the same.
 *
 * The points can grow as the square of the trace (every free adds two points to every band above
 * the freed one), so they are counted first, without storing any (tlv_count: a Fenwick tree of
 * the frees by place in the stack, O(n log n)), against the budget (memsnap/timeline.h); past it
 * the data is refused, or (ms_tlv_budget_t.summarize) the largest number of elements that fits is
 * drawn on their own, found by bisection (the count only grows with it). The replay then writes
 * each point straight into its series' place: no point is stored twice and nothing is sorted.
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

/* a sorted as tlv_sort_cmp says (largest first, ties in the order they are in: a holds them by
 * index), by a stable LSD radix sort over the bytes in which the sizes differ: at 1.7 M elements
 * qsort's calls of the comparison cost ten times as much. Without memory for a second array,
 * qsort. */
static void tlv_sort(tlv_sort_t *a, size_t n) {
  tlv_sort_t *tmp = n > 1 ? malloc(n * sizeof *tmp) : NULL;
  if (!tmp) {
    if (n > 1) qsort(a, n, sizeof *a, tlv_sort_cmp);
    return;
  }
  /* ascending keys are descending sizes */
#define TLV_KEY(x) (~((uint64_t)(x).size ^ ((uint64_t)1 << 63)))
  size_t(*count)[256] = calloc(8, sizeof *count); /* per byte of the key, its values' counts */
  if (!count) {
    free(tmp);
    qsort(a, n, sizeof *a, tlv_sort_cmp);
    return;
  }
  for (size_t i = 0; i < n; i++) {
    uint64_t k = TLV_KEY(a[i]);
    for (int d = 0; d < 8; d++) count[d][(k >> (8 * d)) & 255]++;
  }
  tlv_sort_t *src = a, *dst = tmp;
  for (int d = 0; d < 8; d++) {
    size_t *c = count[d], at = 0;
    if (c[(TLV_KEY(a[0]) >> (8 * d)) & 255] == n) continue; /* one value: the order stays */
    for (int v = 0; v < 256; v++) {
      size_t m = c[v];
      c[v] = at;
      at += m;
    }
    for (size_t i = 0; i < n; i++) dst[c[(TLV_KEY(src[i]) >> (8 * d)) & 255]++] = src[i];
    tlv_sort_t *t = src;
    src = dst;
    dst = t;
  }
#undef TLV_KEY
  if (src != a) memcpy(a, src, n * sizeof *a);
  free(count);
  free(tmp);
}

typedef struct tlv_run_s {
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
  /* the count (tlv_count) */
  uint32_t *fen;               /* Fenwick tree: frees per place in the stack (adds + 1) */
  uint32_t *seq, *base;        /* element -> its place; the frees before it was added */
  uint8_t *live;               /* element -> added and not yet freed */
  uint64_t *npts;              /* series -> its points */
  size_t nadds;                /* the most adds: elements present at the start + actions */
  size_t nplaces;              /* the adds counted: the series, the summarized band aside */
  /* the points, series by series: series s from first[s], its next point at cursor[s] */
  int64_t *pt_t, *pt_off;
  size_t *first, *cursor;
  uint64_t series_points;
} tlv_ctx_t;

static void tlv_point(tlv_ctx_t *c, uint32_t series, int64_t t, int64_t off) {
  size_t at = c->cursor[series]++;
  c->pt_t[at] = t;
  c->pt_off[at] = off;
  c->last_off[series] = off;
}

static void tlv_ctx_release(tlv_ctx_t *c) {
  free(c->el.ptr);
  free(c->actions.ptr);
  free(c->initially.ptr);
  free(c->map.key);
  free(c->map.val);
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
  free(c->fen);
  free(c->seq);
  free(c->base);
  free(c->live);
  free(c->npts);
  free(c->pt_t);
  free(c->pt_off);
  free(c->first);
  free(c->cursor);
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
 * action); the elements sorted by size for the choice of those drawn on their own. */
static int tlv_prepare(tlv_ctx_t *c) {
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
  c->nadds = c->initially.len + c->actions.len;
  c->last_off = malloc((c->nadds + 1) * sizeof *c->last_off);
  c->fen = malloc((c->nadds + 1) * sizeof *c->fen);
  c->npts = malloc((c->nadds + 1) * sizeof *c->npts);
  c->seq = malloc(n1 * sizeof *c->seq);
  c->base = malloc(n1 * sizeof *c->base);
  c->live = malloc(n1);
  if (!c->order || !c->drawn || !c->summarized || !c->pos || !c->series_of || !c->cur ||
      !c->last_off || !c->fen || !c->npts || !c->seq || !c->base || !c->live)
    return MS_ENOMEM;
  for (size_t i = 0; i < ne; i++) {
    c->order[i] = (tlv_sort_t){c->el.ptr[i].size, (uint32_t)i};
    c->pos[i] = -1;
  }
  tlv_sort(c->order, ne);
  if (MS_VEC_PUSH(&c->r.s_off, 0)) return MS_ENOMEM; /* the band's offsets start with [total] */
  return MS_OK;
}

/* The k largest elements (MemoryViz's max_entries) are drawn on their own. */
static void tlv_draw_first(tlv_ctx_t *c, size_t k) {
  size_t ne = c->el.len;
  memset(c->drawn, 0, ne ? ne : 1);
  for (size_t i = 0; i < ne && i < k; i++) c->drawn[c->order[i].idx] = 1;
}

/* The points of element e's series, as it ends (freed, or alive at the end): one where it was
 * added, one where it ends, and two for every free below it in the stack while it lived. */
static uint64_t tlv_count_end(const tlv_ctx_t *c, uint32_t e) {
  uint64_t below = 0;
  for (size_t i = c->seq[e]; i > 0; i -= i & (~i + 1)) below += c->fen[i];
  return 2 + 2 * (below - c->base[e]);
}

/* The points the replay (tlv_replay) gives the drawn elements, counted without storing them:
 * the same adds and frees, in the same order; the frees of earlier places (lower in the stack)
 * counted by a Fenwick tree. per_series: each series' count (series = place) into c->npts. */
static uint64_t tlv_count(tlv_ctx_t *c, bool per_series) {
  size_t ne = c->el.len, nin = c->initially.len, nplace = 0;
  uint32_t frees = 0;
  uint64_t total = 0;
  memset(c->fen, 0, (c->nadds + 1) * sizeof *c->fen);
  memset(c->live, 0, ne ? ne : 1);
  for (size_t k = 0; k < c->nadds; k++) {
    uint32_t e = k < nin ? c->initially.ptr[k] : c->actions.ptr[k - nin];
    if (!c->drawn[e]) continue;
    if (!c->live[e]) { /* tlv_add */
      c->seq[e] = (uint32_t)nplace++;
      c->base[e] = frees;
      c->live[e] = 1;
      continue;
    }
    uint64_t n = tlv_count_end(c, e); /* tlv_remove */
    if (per_series) c->npts[c->seq[e]] = n;
    total += n;
    for (size_t i = (size_t)c->seq[e] + 1; i <= c->nadds; i += i & (~i + 1)) c->fen[i]++;
    frees++;
    c->live[e] = 0;
  }
  for (uint32_t e = 0; e < ne; e++) {
    if (!c->live[e]) continue;
    uint64_t n = tlv_count_end(c, e);
    if (per_series) c->npts[c->seq[e]] = n;
    total += n;
  }
  c->nplaces = nplace;
  return total;
}

/* Chooses the elements drawn on their own: max_entries of them, or, past the budget and when
 * summarizing, the most that fit (the count never shrinks as more are drawn: bisection). */
static int tlv_fit(tlv_ctx_t *c, size_t max_entries, ms_tlv_budget_t *b) {
  uint64_t max_pts = b->bytes == UINT64_MAX ? UINT64_MAX : b->bytes / MS_TLV_POINT_BYTES;
  size_t kmax = max_entries < c->el.len ? max_entries : c->el.len;
  tlv_draw_first(c, kmax);
  uint64_t need = c->series_points = tlv_count(c, true); /* kept by tlv_layout when it fits */
  b->exact_bytes = need > UINT64_MAX / MS_TLV_POINT_BYTES ? UINT64_MAX : need * MS_TLV_POINT_BYTES;
  b->fits_entries = max_entries;
  b->drawn = kmax;
  b->summarized = false;
  if (need <= max_pts) return MS_OK;
  size_t lo = 0, hi = kmax; /* lo fits (nothing drawn: no point), hi does not */
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    tlv_draw_first(c, mid);
    if (tlv_count(c, false) <= max_pts)
      lo = mid;
    else
      hi = mid;
  }
  b->fits_entries = lo;
  if (!b->summarize) return MS_ELIMIT;
  tlv_draw_first(c, lo);
  c->series_points = tlv_count(c, true);
  b->drawn = lo;
  b->summarized = true;
  return MS_OK;
}

/* Lays the drawn elements' series out: each series' first point, from the exact count of the
 * chosen elements (tlv_fit). */
static int tlv_layout(tlv_ctx_t *c) {
  if (c->series_points > SIZE_MAX / sizeof(int64_t) - 4) return MS_ENOMEM;
  size_t n = c->nplaces + 1;
  c->first = malloc(n * sizeof *c->first);
  c->cursor = malloc(n * sizeof *c->cursor);
  c->pt_t = malloc(((size_t)c->series_points + 1) * sizeof *c->pt_t);
  c->pt_off = malloc(((size_t)c->series_points + 1) * sizeof *c->pt_off);
  if (!c->first || !c->cursor || !c->pt_t || !c->pt_off) return MS_ENOMEM;
  size_t at = 0;
  for (size_t i = 0; i < c->nplaces; i++) {
    c->first[i] = c->cursor[i] = at;
    at += (size_t)c->npts[i];
  }
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
  tlv_point(c, c->series_of[e], c->r.t, c->r.total);
  c->r.total += c->el.ptr[e].size; /* both <= TLV_MAX_BYTES */
  if (c->r.total > TLV_MAX_BYTES) c->r.beyond = 1;
}

/* A drawn element freed: its series ends, those above it move down by its size. */
static void tlv_remove(tlv_ctx_t *c, uint32_t e, int64_t size) {
  tlv_run_t *r = &c->r;
  size_t idx = (size_t)c->pos[e];
  tlv_advance(r, 1);
  uint32_t sid = c->series_of[e];
  tlv_point(c, sid, r->t, c->last_off[sid]);
  memmove(c->cur + idx, c->cur + idx + 1, (c->ncur - idx - 1) * sizeof *c->cur);
  c->ncur--;
  c->pos[e] = -1;
  if (idx < c->ncur) {
    for (size_t j = idx; j < c->ncur; j++) {
      uint32_t o = c->cur[j];
      uint32_t so = c->series_of[o];
      c->pos[o] = (int64_t)j;
      tlv_point(c, so, r->t, c->last_off[so]);
      tlv_point(c, so, r->t + 3, c->last_off[so] - size);
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
    tlv_point(c, so, r->t, c->last_off[so]);
  }
  return r->oom ? MS_ENOMEM : MS_OK;
}

/* The output: the series' points as the replay laid them out, the summarized band last (its
 * offsets have one more value than its timesteps). The points' arrays grow by the band in place
 * (realloc: a large block is remapped, not copied); `sizes` is zero but for the band, and
 * calloc's untouched pages of a large block cost no memory. */
static int tlv_output(tlv_ctx_t *c, size_t dev, bool plot_segments, ms_tlv_t *out) {
  tlv_run_t *r = &c->r;
  size_t ns = c->ser.len, ne = c->el.len, npts = (size_t)c->series_points;
  if (ns != c->nplaces) return MS_EFORMAT; /* the count and the replay disagree: a bug */
  for (size_t i = 0; i < ns; i++) {
    if (c->cursor[i] != c->first[i] + c->npts[i]) return MS_EFORMAT;
    c->ser.ptr[i].first_point = c->first[i];
    c->ser.ptr[i].npoints = (size_t)c->npts[i];
  }
  size_t band_pts = r->s_t.len;
  size_t total_pts = npts + band_pts;
  int64_t *t = realloc(c->pt_t, (total_pts + 1) * sizeof(int64_t));
  if (t) c->pt_t = t;
  int64_t *o = realloc(c->pt_off, (total_pts + 2) * sizeof(int64_t));
  if (o) c->pt_off = o;
  memset(out, 0, sizeof *out);
  out->sizes = calloc(total_pts + 1, sizeof(int64_t));
  if (!t || !o || !out->sizes || MS_VEC_RESERVE(&c->ser, 1)) {
    free(out->sizes);
    out->sizes = NULL;
    return MS_ENOMEM;
  }
  out->timesteps = c->pt_t;
  out->offsets = c->pt_off;
  c->pt_t = c->pt_off = NULL;
  ms_tlv_series_t band;
  memset(&band, 0, sizeof band);
  band.elem = -1;
  band.first_point = npts;
  band.npoints = band_pts;
  if (band_pts) { /* an empty band has no buffers: memcpy from NULL is undefined even for 0 bytes */
    memcpy(out->timesteps + npts, r->s_t.ptr, band_pts * sizeof(int64_t));
    memcpy(out->sizes + npts, r->s_size.ptr, band_pts * sizeof(int64_t));
  }
  memcpy(out->offsets + npts, r->s_off.ptr, (band_pts + 1) * sizeof(int64_t));
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

uint64_t ms_tlv_default_budget(size_t nentries) {
  uint64_t per = (uint64_t)nentries * MS_TLV_BUDGET_PER_ENTRY; /* < 2^64: entries < 2^40 */
  return per > MS_TLV_BUDGET_BYTES ? per : MS_TLV_BUDGET_BYTES;
}

int ms_tlv_compute_budget(const ms_snapshot_t *snap, size_t dev, bool plot_segments,
                          size_t max_entries, size_t first, size_t last,
                          const ms_snapshot_t *at_last, ms_tlv_budget_t *budget, ms_tlv_t *out) {
  const ms_snapshot_t *segsrc = at_last ? at_last : snap;
  const ms_snap_trace_t *trace = NULL;
  size_t n = 0;
  ms_tlv_budget_t dflt;
  memset(&dflt, 0, sizeof dflt);
  ms_tlv_budget_t *b = budget ? budget : &dflt;
  b->exact_bytes = 0;
  b->fits_entries = max_entries;
  b->drawn = 0;
  b->summarized = false;
  if (dev >= 4096) return MS_EINVAL;
  if (dev < snap->ndevices) {
    n = snap->devices[dev].ntrace;
    trace = n ? snap->trace + snap->devices[dev].first_trace : NULL; /* not NULL + 0 */
  }
  if (last > n) last = n;
  if (first > last) first = last;
  if (b->bytes == 0) b->bytes = ms_tlv_default_budget(last - first);
  tlv_ctx_t c;
  memset(&c, 0, sizeof c);
  int rc = tlv_match_trace(&c, trace, first, last, plot_segments);
  if (rc == MS_OK) rc = tlv_add_snapshot(&c, segsrc, dev, plot_segments);
  if (rc == MS_OK) rc = tlv_prepare(&c);
  if (rc == MS_OK) rc = tlv_fit(&c, max_entries, b);
  if (rc == MS_OK) rc = tlv_layout(&c);
  if (rc == MS_OK) rc = tlv_replay(&c);
  if (rc == MS_OK) rc = tlv_output(&c, dev, plot_segments, out);
  tlv_ctx_release(&c);
  return rc;
}

int ms_tlv_compute(const ms_snapshot_t *snap, size_t dev, bool plot_segments, size_t max_entries,
                   size_t first, size_t last, const ms_snapshot_t *at_last, ms_tlv_t *out) {
  return ms_tlv_compute_budget(snap, dev, plot_segments, max_entries, first, last, at_last, NULL,
                               out);
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
