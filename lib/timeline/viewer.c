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

int ms_tlv_compute(const ms_snapshot_t *snap, size_t dev, bool plot_segments, size_t max_entries,
                   size_t first, size_t last, const ms_snapshot_t *at_last, ms_tlv_t *out) {
  const ms_snapshot_t *segsrc = at_last ? at_last : snap;
  const ms_snap_trace_t *trace = NULL;
  size_t n = 0;
  if (dev >= 4096) return MS_EINVAL;
  if (dev < snap->ndevices) {
    trace = snap->trace + snap->devices[dev].first_trace;
    n = snap->devices[dev].ntrace;
  }
  if (last > n) last = n;
  if (first > last) first = last;

  MS_VEC(tlv_elem_t) el = {0};
  MS_VEC(uint32_t) actions = {0};
  MS_VEC(uint32_t) initially = {0};
  tlv_map_t map = {0};
  tlv_run_t r;
  memset(&r, 0, sizeof r);
  uint32_t *cur = NULL, *series_of = NULL;
  int64_t *pos = NULL, *last_off = NULL;
  uint8_t *drawn = NULL, *summarized = NULL;
  tlv_sort_t *order = NULL;
  MS_VEC(ms_tlv_series_t) ser = {0};
  int rc = MS_ENOMEM;

  ms_trace_action a_alloc = plot_segments ? MS_TRACE_SEGMENT_ALLOC : MS_TRACE_ALLOC;
  /* annotate: a free_completed directly after a free_requested of the same address merges into
   * one `free` at the free_requested's place */
  for (size_t i = first; i < last; i++) {
    const ms_snap_trace_t *e = &trace[i];
    bool is_alloc = e->action == a_alloc;
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
    if (is_alloc) {
      tlv_elem_t x = {(int64_t)e->size, (int64_t)i, false};
      if (MS_VEC_PUSH(&el, x)) goto out;
      if (tlv_map_set(&map, e->addr, (uint32_t)el.len)) goto out;
      if (MS_VEC_PUSH(&actions, (uint32_t)(el.len - 1))) goto out;
    } else if (is_free) {
      uint32_t v = tlv_map_get(&map, e->addr);
      if (v) {
        if (MS_VEC_PUSH(&actions, v - 1)) goto out;
        tlv_map_del(&map, e->addr);
      } else {
        tlv_elem_t x = {(int64_t)e->size, (int64_t)i, false};
        if (MS_VEC_PUSH(&el, x)) goto out;
        if (MS_VEC_PUSH(&initially, (uint32_t)(el.len - 1))) goto out;
        if (MS_VEC_PUSH(&actions, (uint32_t)(el.len - 1))) goto out;
      }
    }
  }
  for (size_t si = 0; si < segsrc->nsegments; si++) {
    const ms_snap_segment_t *g = &segsrc->segments[si];
    if (g->device != (int64_t)dev) continue;
    if (plot_segments) {
      if (!tlv_map_get(&map, g->address)) {
        tlv_elem_t x = {(int64_t)g->total_size, -1 - (int64_t)si, false};
        if (MS_VEC_PUSH(&el, x) || MS_VEC_PUSH(&initially, (uint32_t)(el.len - 1))) goto out;
      }
      continue;
    }
    uint64_t addr = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const ms_snap_block_t *b = &segsrc->blocks[(size_t)g->first_block + k];
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED && !tlv_map_get(&map, addr)) {
        tlv_elem_t x = {tlv_block_requested(segsrc, b), -1 - (int64_t)(g->first_block + k), true};
        if (MS_VEC_PUSH(&el, x) || MS_VEC_PUSH(&initially, (uint32_t)(el.len - 1))) goto out;
      }
      addr += b->size;
    }
  }
  if (el.len > UINT32_MAX - 2) {
    rc = MS_ELIMIT;
    goto out;
  }
  /* reverse(initially); no actions but some initially present: the last one becomes an action */
  for (size_t a = 0, b = initially.len ? initially.len - 1 : 0; a < b; a++, b--) {
    uint32_t t = initially.ptr[a];
    initially.ptr[a] = initially.ptr[b];
    initially.ptr[b] = t;
  }
  if (actions.len == 0 && initially.len > 0) {
    if (MS_VEC_PUSH(&actions, initially.ptr[initially.len - 1])) goto out;
    initially.len--;
  }

  size_t ne = el.len;
  order = malloc((ne ? ne : 1) * sizeof *order);
  drawn = calloc(ne ? ne : 1, 1);
  summarized = calloc(ne ? ne : 1, 1);
  pos = malloc((ne ? ne : 1) * sizeof *pos);
  series_of = malloc((ne ? ne : 1) * sizeof *series_of);
  cur = malloc((ne ? ne : 1) * sizeof *cur);
  last_off = malloc((2 * ne + 1) * sizeof *last_off);
  if (!order || !drawn || !summarized || !pos || !series_of || !cur || !last_off) goto out;
  for (size_t i = 0; i < ne; i++) {
    order[i] = (tlv_sort_t){el.ptr[i].size, (uint32_t)i};
    pos[i] = -1;
  }
  qsort(order, ne, sizeof *order, tlv_sort_cmp);
  for (size_t i = 0; i < ne && i < max_entries; i++) drawn[order[i].idx] = 1;

  size_t ncur = 0;
  int64_t max_size = 0;
  if (MS_VEC_PUSH(&r.s_off, 0)) goto out; /* the band's offsets start with [total_mem] */
#define TLV_ADD(e)                                                                   \
  do {                                                                               \
    uint32_t e_ = (e);                                                               \
    ms_tlv_series_t s_;                                                              \
    memset(&s_, 0, sizeof s_);                                                       \
    s_.elem = e_;                                                                    \
    s_.size = el.ptr[e_].size;                                                       \
    s_.color = e_;                                                                   \
    s_.ghost = el.ptr[e_].ghost;                                                     \
    if (MS_VEC_PUSH(&ser, s_)) goto out;                                             \
    series_of[e_] = (uint32_t)(ser.len - 1);                                         \
    pos[e_] = (int64_t)ncur;                                                         \
    cur[ncur++] = e_;                                                                \
    tlv_point(&r, last_off, series_of[e_], r.t, r.total);                                      \
    r.total += el.ptr[e_].size;                                                      \
  } while (0)

  for (size_t i = 0; i < initially.len; i++) {
    uint32_t e = initially.ptr[i];
    if (drawn[e]) {
      TLV_ADD(e);
    } else {
      r.summ += el.ptr[e].size;
      summarized[e] = 1;
    }
  }
  for (size_t k = 0; k < actions.len && !r.oom; k++) {
    uint32_t e = actions.ptr[k];
    int64_t size = el.ptr[e].size;
    if (!drawn[e]) {
      if (summarized[e]) {
        tlv_advance(&r, 1);
        r.summ -= size;
        summarized[e] = 2; /* MemoryViz sets it to null: still "in" the map */
      } else {
        r.summ += size;
        summarized[e] = 1;
        tlv_advance(&r, 1);
      }
      continue;
    }
    if (pos[e] < 0) {
      TLV_ADD(e);
      tlv_advance(&r, 1);
    } else {
      size_t idx = (size_t)pos[e];
      tlv_advance(&r, 1);
      uint32_t sid = series_of[e];
      tlv_point(&r, last_off, sid, r.t, last_off[sid]);
      memmove(cur + idx, cur + idx + 1, (ncur - idx - 1) * sizeof *cur);
      ncur--;
      pos[e] = -1;
      if (idx < ncur) {
        for (size_t j = idx; j < ncur; j++) {
          uint32_t o = cur[j];
          uint32_t so = series_of[o];
          pos[o] = (int64_t)j;
          tlv_point(&r, last_off, so, r.t, last_off[so]);
          tlv_point(&r, last_off, so, r.t + 3, last_off[so] - size);
        }
        tlv_advance(&r, 3);
      }
      r.total -= size;
    }
    if (r.total + r.summ > max_size) max_size = r.total + r.summ;
  }
  for (size_t j = 0; j < ncur; j++) {
    uint32_t so = series_of[cur[j]];
    tlv_point(&r, last_off, so, r.t, last_off[so]);
  }
  if (r.oom) goto out;

  /* group the points by series (stable counting sort) */
  size_t ns = ser.len;
  size_t *cnt = calloc(ns + 1, sizeof *cnt);
  if (!cnt) goto out;
  for (size_t i = 0; i < r.pts.len; i++) cnt[r.pts.ptr[i].series + 1]++;
  for (size_t i = 0; i < ns; i++) {
    ser.ptr[i].first_point = cnt[i];
    ser.ptr[i].npoints = cnt[i + 1];
    cnt[i + 1] += cnt[i];
  }
  size_t band_pts = r.s_t.len;
  size_t total_pts = r.pts.len + band_pts;
  memset(out, 0, sizeof *out);
  out->timesteps = malloc((total_pts + 1) * sizeof(int64_t));
  out->offsets = malloc((total_pts + 2) * sizeof(int64_t));
  out->sizes = malloc((total_pts + 1) * sizeof(int64_t));
  if (!out->timesteps || !out->offsets || !out->sizes || MS_VEC_RESERVE(&ser, 1)) {
    free(cnt);
    free(out->timesteps);
    free(out->offsets);
    free(out->sizes);
    goto out;
  }
  for (size_t i = 0; i < r.pts.len; i++) {
    size_t at = cnt[r.pts.ptr[i].series]++;
    out->timesteps[at] = r.pts.ptr[i].t;
    out->offsets[at] = r.pts.ptr[i].off;
    out->sizes[at] = 0;
  }
  free(cnt);
  /* the summarized band: its offsets have one more value than its timesteps */
  ms_tlv_series_t band;
  memset(&band, 0, sizeof band);
  band.elem = -1;
  band.first_point = r.pts.len;
  band.npoints = band_pts;
  memcpy(out->timesteps + r.pts.len, r.s_t.ptr, band_pts * sizeof(int64_t));
  memcpy(out->offsets + r.pts.len, r.s_off.ptr, (band_pts + 1) * sizeof(int64_t));
  memcpy(out->sizes + r.pts.len, r.s_size.ptr, band_pts * sizeof(int64_t));
  ser.ptr[ser.len++] = band;
  out->npoints = total_pts;
  out->device = dev;
  out->segments = plot_segments;
  out->max_size = max_size;
  out->elements_length = ne;
  out->max_at_time = r.mat.ptr;
  out->ntimesteps = r.mat.len;
  r.mat.ptr = NULL;
  out->series = ser.ptr;
  out->nseries = ser.len;
  ser.ptr = NULL;
  out->element_source = malloc((ne ? ne : 1) * sizeof(int64_t));
  if (out->element_source)
    for (size_t i = 0; i < ne; i++) out->element_source[i] = el.ptr[i].source;
  rc = out->element_source ? MS_OK : MS_ENOMEM;
  if (rc != MS_OK) ms_tlv_release(out);
#undef TLV_ADD
out:
  free(el.ptr);
  free(actions.ptr);
  free(initially.ptr);
  free(map.key);
  free(map.val);
  free(r.pts.ptr);
  free(r.mat.ptr);
  free(r.s_t.ptr);
  free(r.s_off.ptr);
  free(r.s_size.ptr);
  free(cur);
  free(series_of);
  free(pos);
  free(last_off);
  free(drawn);
  free(summarized);
  free(order);
  free(ser.ptr);
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
