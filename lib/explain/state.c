/* SPDX-License-Identifier: MIT
 * memsnap core: explain (memsnap/explain.h, docs/explain.md): choosing the moment, the figures of
 * the allocator's state at it, the verdict by the documented rules, the step and phase, and the
 * biggest holders. The remedies are remedies.c.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "explain/internal.h"
#include "memsnap/attribution.h"
#include "memsnap/stats.h"
#include "memsnap/timeline.h"
#include "timeline/internal.h"

const char *ms_explain_verdict_name(ms_explain_verdict v) {
  switch (v) {
  case MS_EXPLAIN_FULL: return "full";
  case MS_EXPLAIN_FRAGMENTATION: return "fragmentation";
  case MS_EXPLAIN_RELEASABLE: return "releasable";
  case MS_EXPLAIN_PRIVATE_POOL: return "private_pool";
  case MS_EXPLAIN_UNKNOWN: return "unknown";
  }
  return "?";
}

void ms_explain_options_init(ms_explain_options_t *o) {
  memset(o, 0, sizeof *o);
  o->device = -1;
  o->remedies = true;
  o->min_capacity = true;
  o->ntop = 10;
}

const char *ms__explain_size(uint64_t n, char *buf, size_t cap) {
  if (ms_format_size(n, buf, cap) < 0 && cap) buf[0] = 0;
  return buf;
}

static void ex_rows_free(ms_explain_row_t *r, size_t n) {
  for (size_t i = 0; i < n; i++) free(r[i].key);
  free(r);
}

void ms_explain_free(ms_explain_t *x) {
  if (!x) return;
  ex_rows_free(x->by_source, x->nby_source);
  ex_rows_free(x->by_category, x->nby_category);
  free(x->pools);
  free(x->top);
  free(x->remedies);
  free(x->series_step);
  free(x->series_allocated);
  free(x->series_reserved);
  free(x);
}

/* ---- the moment -------------------------------------------------------------------------------- */

/* Whether device dev's trace has anything to replay or index (not only a `snapshot` entry or a
 * lone free, as the _memory_viz.py-era files). */
static bool ex_has_trace(const ms_snapshot_t *snap, size_t dev) {
  if (dev >= snap->ndevices) return false;
  const ms_snap_device_t *d = &snap->devices[dev];
  for (size_t i = 0; i < d->ntrace; i++) {
    uint8_t a = snap->trace[d->first_trace + i].action;
    if (a == MS_TRACE_ALLOC || a == MS_TRACE_SEGMENT_ALLOC || a == MS_TRACE_SEGMENT_MAP ||
        a == MS_TRACE_OOM)
      return true;
  }
  return false;
}

static int ex_device(const ms_snapshot_t *snap, const ms_explain_options_t *o, size_t *dev,
                     ms_errbuf_t *eb) {
  if (o->device >= 0) {
    size_t d = (size_t)o->device;
    bool listed = d < snap->ndevices && snap->devices[d].ntrace > 0;
    for (size_t i = 0; i < snap->nsegments && !listed; i++)
      listed = snap->segments[i].device == (int64_t)d;
    if (!listed)
      return ms__errbuf_set(eb, MS_EINVAL, "device %zu has no trace and no segments", d);
    *dev = d;
    return MS_OK;
  }
  for (size_t d = 0; d < snap->ndevices; d++)
    if (ms_snapshot_oom_count(snap, d) > 0) {
      *dev = d;
      return MS_OK;
    }
  size_t def = 0;
  if (ms_tl_viewer_devices(snap, NULL, 0, &def) == 0)
    return ms__errbuf_set(eb, MS_EINVAL, "no device has a trace or segments: nothing to explain");
  *dev = def;
  return MS_OK;
}

static uint64_t ex_round(uint64_t req) {
  if (req < 512) return 512;
  if (req > UINT64_MAX - 511) return req;
  return (req + 511) & ~(uint64_t)511;
}

/* PyTorch's get_allocation_size: the segment a new allocation of `rounded` bytes would map. */
static uint64_t ex_segment_size(uint64_t rounded) {
  if (rounded <= EX_SMALL_SIZE) return EX_SMALL_BUFFER;
  if (rounded < EX_MIN_LARGE_ALLOC) return EX_LARGE_BUFFER;
  if (rounded > UINT64_MAX - EX_ROUND_LARGE) return rounded;
  return (rounded + EX_ROUND_LARGE - 1) / EX_ROUND_LARGE * EX_ROUND_LARGE;
}

static void ex_set_request(ms_explain_t *x, const ms_snap_trace_t *e) {
  x->has_request = true;
  x->request_bytes = e->size;
  x->request_rounded = ex_round(e->size);
  x->request_segment = ex_segment_size(x->request_rounded);
  x->request_stream = ms_snap_trace_stream(e);
  x->request_pool[0] = ms_snap_trace_pool(e, 0);
  x->request_pool[1] = ms_snap_trace_pool(e, 1);
  x->request_large = x->request_rounded > EX_SMALL_SIZE;
}

/* The moment: x->moment, step, entry, and the request of an OOM or of the peak's allocation. */
static int ex_moment(const ms_timeline_t *tl, const ms_explain_options_t *o, ms_explain_t *x,
                     ms_errbuf_t *eb) {
  const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
  size_t n = ms_timeline_nentries(tl, x->device);
  ms_tl_moment_t m = {MS_TL_MOMENT_END, 0};
  if (o->has_moment) {
    m = o->moment;
    x->moment = m.kind == MS_TL_MOMENT_OOM    ? MS_EXPLAIN_AT_OOM
                : m.kind == MS_TL_MOMENT_PEAK ? MS_EXPLAIN_AT_PEAK
                                              : MS_EXPLAIN_AT_GIVEN;
  } else if (ms_snapshot_oom_count(snap, x->device) > 0) {
    m = (ms_tl_moment_t){MS_TL_MOMENT_OOM, 1};
    x->moment = MS_EXPLAIN_AT_OOM;
  } else if (x->has_trace) {
    m = (ms_tl_moment_t){MS_TL_MOMENT_PEAK, 0};
    x->moment = MS_EXPLAIN_AT_PEAK;
  } else {
    x->moment = MS_EXPLAIN_AT_END;
  }
  MS_FORWARD_IF_ERROR(ms_timeline_moment_step(tl, x->device, &m, 0, n, &x->step, eb));
  x->entry = (int64_t)x->step - 1;
  if (x->entry < 0) return MS_OK;
  const ms_snap_trace_t *e = ms_timeline_entry(tl, x->device, (size_t)x->entry);
  x->has_time = (e->present & MS_TRACE_HAS_TIME) != 0;
  x->time_us = e->time_us;
  if (e->action == MS_TRACE_OOM) {
    x->moment = x->moment == MS_EXPLAIN_AT_GIVEN ? MS_EXPLAIN_AT_OOM : x->moment;
    ex_set_request(x, e);
    x->has_device_free = !(e->present & MS_TRACE_NO_ADDR);
    x->device_free = x->has_device_free ? e->addr : 0;
  } else if (e->action == MS_TRACE_ALLOC) {
    ex_set_request(x, e);
  }
  return MS_OK;
}

/* ---- the figures ------------------------------------------------------------------------------- */

static bool ex_same_pool(const int64_t a[2], const int64_t b[2]) {
  return a[0] == b[0] && a[1] == b[1];
}

static bool ex_segment_large(const ms_snapshot_t *snap, const ms_tl_segment_t *g) {
  if (g->snap_segment != UINT32_MAX && g->snap_segment < snap->nsegments &&
      (snap->segments[g->snap_segment].present & MS_SEG_HAS_SEGMENT_TYPE))
    return snap->segments[g->snap_segment].is_large;
  return g->size > EX_SMALL_BUFFER || g->is_expandable;
}

static ms_explain_pool_t *ex_pool(ms_explain_t *x, const int64_t pool[2], uint64_t stream,
                                  bool large) {
  for (size_t i = 0; i < x->npools; i++) {
    ms_explain_pool_t *p = &x->pools[i];
    if (ex_same_pool(p->pool_id, pool) && p->stream == stream && p->large == large) return p;
  }
  ms_explain_pool_t *p = &x->pools[x->npools++];
  memset(p, 0, sizeof *p);
  p->pool_id[0] = pool[0];
  p->pool_id[1] = pool[1];
  p->stream = stream;
  p->large = large;
  return p;
}

/* Walks the segments of the state: the pools, the free bytes and how they lie. */
static int ex_figures(const ms_snapshot_t *snap, const ms_tl_state_t *st, ms_explain_t *x) {
  x->pools = calloc(st->nsegments + 1, sizeof *x->pools);
  if (!x->pools) return MS_ENOMEM;
  if (x->has_request) /* the request's pool first, even when it has no segment */
    (void)ex_pool(x, x->request_pool, x->request_stream, x->request_large);
  x->reserved_bytes = st->totals[MS_TL_RESERVED];
  x->allocated_bytes = st->totals[MS_TL_ALLOCATED];
  x->active_bytes = st->totals[MS_TL_ACTIVE];
  x->requested_bytes = st->totals[MS_TL_REQUESTED];
  uint64_t largest_any = 0;
  size_t k = 0;
  for (size_t i = 0; i < st->nsegments; i++) {
    const ms_tl_segment_t *g = &st->segments[i];
    uint64_t end = g->address + g->size, at = g->address, gap_max = 0, live = 0, nlive = 0;
    while (k < st->nblocks && st->blocks[k].address < g->address) k++;
    for (; k < st->nblocks && st->blocks[k].address < end; k++) {
      const ms_tl_block_t *b = &st->blocks[k];
      if (b->address > at && b->address - at > gap_max) gap_max = b->address - at;
      live += b->size;
      nlive++;
      at = b->address + b->size;
    }
    if (end > at && end - at > gap_max) gap_max = end - at;
    uint64_t free = live < g->size ? g->size - live : 0;
    bool priv = g->pool_id[0] != 0 || g->pool_id[1] != 0;
    ms_explain_pool_t *p = ex_pool(x, g->pool_id, g->stream, ex_segment_large(snap, g));
    p->segments++;
    p->reserved += g->size;
    p->free += free;
    if (gap_max > p->largest_free) p->largest_free = gap_max;
    if (gap_max > largest_any) largest_any = gap_max;
    x->cached_free_bytes += free;
    if (nlive > 0) x->inactive_split_bytes += free;
    if (priv) {
      x->private_pool_bytes += g->size;
      x->private_pool_free_bytes += free;
    } else if (nlive == 0) {
      x->releasable_bytes += g->size;
    }
  }
  x->largest_free_block_bytes = x->has_request ? x->pools[0].largest_free : largest_any;
  return MS_OK;
}

/* The capacity and, at an OOM, the memory outside the allocator. */
static void ex_capacity(const ms_snapshot_t *snap, const ms_explain_options_t *o,
                        ms_explain_t *x) {
  if (o->capacity) {
    x->capacity = o->capacity;
    x->capacity_source = MS_CAPACITY_GIVEN;
  } else {
    x->capacity_source = ms_snapshot_capacity(snap, x->device, &x->capacity, &x->capacity_oom);
  }
  if (x->moment == MS_EXPLAIN_AT_OOM && x->has_device_free && x->capacity &&
      x->capacity >= x->reserved_bytes && x->capacity - x->reserved_bytes >= x->device_free) {
    x->has_outside = true;
    x->outside_allocator_bytes = x->capacity - x->reserved_bytes - x->device_free;
  }
}

/* ---- the verdict ------------------------------------------------------------------------------- */

#define EX_SZ(v, b) ms__explain_size((v), (b), sizeof(b))

/* At a failed (or named) request: docs/explain.md, "The verdict at an OOM". */
static void ex_verdict_request(ms_explain_t *x) {
  char a[32], b[32], c[32], d[32];
  bool fknown = x->has_device_free || x->capacity;
  uint64_t fr = x->has_device_free ? x->device_free
                : x->capacity > x->reserved_bytes ? x->capacity - x->reserved_bytes : 0;
  uint64_t room = fr + x->cached_free_bytes;
  uint64_t own_free = 0, own_whole = 0;
  for (size_t i = 0; i < x->npools; i++)
    if (ex_same_pool(x->pools[i].pool_id, x->request_pool)) own_free += x->pools[i].free;
  own_whole = ex_same_pool(x->request_pool, (int64_t[2]){0, 0}) ? x->releasable_bytes : 0;
  uint64_t r = x->request_rounded;
  if (room < r) {
    if (!fknown) {
      x->verdict = MS_EXPLAIN_UNKNOWN;
      snprintf(x->verdict_text, sizeof x->verdict_text,
               "unknown: the cache had %s free, less than the %s requested, and how much the "
               "device had free is not recorded (no device_free, no device size): pass --capacity",
               EX_SZ(x->cached_free_bytes, a), EX_SZ(r, b));
      return;
    }
    x->verdict = MS_EXPLAIN_FULL;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "full: live tensors hold %s; the %s requested is %s more than the %s not held by "
             "them (cache and device together)",
             EX_SZ(x->active_bytes, a), EX_SZ(r, b), EX_SZ(r - room, c), EX_SZ(room, d));
    return;
  }
  if (fr + own_free < r) {
    x->verdict = MS_EXPLAIN_PRIVATE_POOL;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "private_pool: the request's pool and the device had %s free, less than the %s "
             "requested; %s more lay free in other pools (private pools hold %s: CUDA graphs or "
             "MemPool), where the request cannot use it",
             EX_SZ(fr + own_free, a), EX_SZ(r, b), EX_SZ(room - fr - own_free, c),
             EX_SZ(x->private_pool_bytes, d));
    return;
  }
  if (fr + own_whole >= x->request_segment) {
    x->verdict = MS_EXPLAIN_RELEASABLE;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "releasable: the cache held %s in whole free segments; released (empty_cache, or "
             "the allocator's own release before an OOM), they and the %s free on the device make "
             "room for the %s segment the request needs",
             EX_SZ(own_whole, a), EX_SZ(fr, b), EX_SZ(x->request_segment, c));
    return;
  }
  x->verdict = MS_EXPLAIN_FRAGMENTATION;
  char l[32];
  snprintf(x->verdict_text, sizeof x->verdict_text,
           "fragmentation: %s lay free (%s in the cache, %s on the device), more than the %s "
           "requested, but the largest free block of its pool was %s",
           EX_SZ(fr + own_free, a), EX_SZ(own_free, b), EX_SZ(fr, c), EX_SZ(r, d),
           EX_SZ(x->largest_free_block_bytes, l));
}

/* At a peak or the end state: where the memory reserved beyond live tensors lies. */
static void ex_verdict_state(ms_explain_t *x) {
  char a[32], b[32], c[32];
  uint64_t res = x->reserved_bytes, waste = x->cached_free_bytes;
  if (res == 0) {
    x->verdict = MS_EXPLAIN_UNKNOWN;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "unknown: nothing was reserved on the device at this moment");
    return;
  }
  if (waste <= res / 10) {
    x->verdict = MS_EXPLAIN_FULL;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "full: live tensors hold %s of the %s reserved; the cache keeps only %s free: "
             "the memory is the tensors themselves",
             EX_SZ(x->active_bytes, a), EX_SZ(res, b), EX_SZ(waste, c));
    return;
  }
  uint64_t split_default = x->inactive_split_bytes;
  /* inactive split bytes of private pools count as the private pools' */
  uint64_t priv = x->private_pool_free_bytes;
  split_default = split_default > priv ? split_default - priv : 0;
  if (x->releasable_bytes >= split_default && x->releasable_bytes >= priv) {
    x->verdict = MS_EXPLAIN_RELEASABLE;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "releasable: %s of the %s reserved is cached in whole free segments, which "
             "empty_cache() or garbage_collection_threshold would give back",
             EX_SZ(x->releasable_bytes, a), EX_SZ(res, b));
  } else if (split_default >= priv) {
    x->verdict = MS_EXPLAIN_FRAGMENTATION;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "fragmentation: %s of the %s reserved lies free between live blocks (inactive "
             "split), where only smaller requests can use it",
             EX_SZ(split_default, a), EX_SZ(res, b));
  } else {
    x->verdict = MS_EXPLAIN_PRIVATE_POOL;
    snprintf(x->verdict_text, sizeof x->verdict_text,
             "private_pool: %s of the %s reserved lies free in private pools (CUDA graphs or "
             "MemPool), which the rest of the program cannot use",
             EX_SZ(priv, a), EX_SZ(res, b));
  }
}

/* ---- holders, step and phase -------------------------------------------------------------------- */

static int ex_holder_cmp(const void *a, const void *b) {
  const ms_explain_holder_t *x = a, *y = b;
  if (x->stack != y->stack) return x->stack < y->stack ? -1 : 1;
  return 0;
}

static int ex_holder_bytes_cmp(const void *a, const void *b) {
  const ms_explain_holder_t *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  return ex_holder_cmp(a, b);
}

static int ex_holders(const ms_tl_state_t *st, size_t ntop, ms_explain_t *x) {
  ms_explain_holder_t *h = calloc(st->nblocks + 1, sizeof *h);
  if (!h) return MS_ENOMEM;
  size_t n = 0;
  for (size_t i = 0; i < st->nblocks; i++) {
    if (st->blocks[i].state != MS_BLOCK_ACTIVE_ALLOCATED) continue;
    h[n++] = (ms_explain_holder_t){st->blocks[i].stack, st->blocks[i].size, 1};
  }
  qsort(h, n, sizeof *h, ex_holder_cmp);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m > 0 && h[m - 1].stack == h[i].stack) {
      h[m - 1].bytes += h[i].bytes;
      h[m - 1].blocks++;
    } else {
      h[m++] = h[i];
    }
  }
  qsort(h, m, sizeof *h, ex_holder_bytes_cmp);
  x->top_total_blocks = n;
  x->top = h;
  x->ntop = m < ntop ? m : ntop;
  return MS_OK;
}

/* The first n rows of the state's allocated blocks grouped by source or category. */
static int ex_attr_rows(const ms_attr_t *a, const ms_tl_state_t *st, ms_attr_by by, size_t n,
                        ms_explain_row_t **out, size_t *nout) {
  ms_attr_rows_t rows;
  MS_FORWARD_IF_ERROR(ms_attr_aggregate_state(a, st, NULL, by, &rows));
  size_t m = rows.nrows < n ? rows.nrows : n;
  ms_explain_row_t *r = calloc(m + 1, sizeof *r);
  int rc = r ? MS_OK : MS_ENOMEM;
  for (size_t i = 0; i < m && rc == MS_OK; i++) {
    r[i].key = strdup(rows.rows[i].key ? rows.rows[i].key : "");
    r[i].bytes = rows.rows[i].bytes;
    r[i].blocks = rows.rows[i].blocks;
    if (!r[i].key) rc = MS_ENOMEM;
  }
  ms_attr_rows_free(&rows);
  if (rc != MS_OK) {
    ex_rows_free(r, m);
    return rc;
  }
  *out = r;
  *nout = m;
  return MS_OK;
}

/* The holders by source line and by category (docs/categories.md). */
static int ex_attributed(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                         const ms_tl_state_t *st, const ms_attr_t *given, size_t ntop,
                         ms_explain_t *x, ms_errbuf_t *eb) {
  ms_attr_t *own = NULL;
  if (!given) MS_FORWARD_IF_ERROR(ms_attr_create(snap, tl, NULL, &own, eb));
  const ms_attr_t *a = given ? given : own;
  int rc = ex_attr_rows(a, st, MS_ATTR_BY_SOURCE, ntop, &x->by_source, &x->nby_source);
  if (rc == MS_OK)
    rc = ex_attr_rows(a, st, MS_ATTR_BY_CATEGORY, MS_CAT_COUNT, &x->by_category,
                      &x->nby_category);
  ms_attr_destroy(own);
  return rc;
}

static int ex_step_phase(const ms_timeline_t *tl, ms_explain_t *x) {
  x->step_number = -1;
  if (!x->has_time) return MS_OK;
  const ms_tl_ranges_t *rs = ms__tl_ranges(tl); /* the index's, which the classifier read */
  if (!rs) return MS_ENOMEM;
  int64_t dev = (int64_t)x->device;
  const ms_tl_range_t *s = ms_tl_ranges_at(rs, dev, x->time_us, true);
  if (!s) s = ms_tl_ranges_at(rs, -1, x->time_us, true);
  const ms_tl_range_t *p = ms_tl_ranges_at(rs, dev, x->time_us, false);
  if (!p) p = ms_tl_ranges_at(rs, -1, x->time_us, false);
  if (s) x->step_number = s->step;
  if (p) x->phase = p->name; /* the snapshot's string */
  return MS_OK;
}

/* ---- the answer ---------------------------------------------------------------------------------- */

static void ex_hint(ms_explain_t *x) {
  if (x->has_trace) return;
  snprintf(x->hint, sizeof x->hint,
           "this snapshot has no allocation trace, so only its end state can be explained; record "
           "one next time with torch.cuda.memory._record_memory_history(max_entries=100000) "
           "before the run and torch.cuda.memory._dump_snapshot(\"snap.pickle\") after it (or in "
           "an OOM observer: docs/explain.md)");
}

/* ex_series's walk, newest step first: b is the bucket of the step visited last. */
typedef struct ex_buckets_s {
  ms_explain_t *x;
  size_t b;
} ex_buckets_t;

static void ex_bucket_visit(void *arg, size_t step, const uint64_t totals[MS_TL_METRIC_COUNT]) {
  ex_buckets_t *k = arg;
  ms_explain_t *x = k->x;
  while (k->b > 0 && x->series_step[k->b] > step)
    k->b--;
  if (totals[MS_TL_ALLOCATED] > x->series_allocated[k->b])
    x->series_allocated[k->b] = totals[MS_TL_ALLOCATED];
  if (totals[MS_TL_RESERVED] > x->series_reserved[k->b])
    x->series_reserved[k->b] = totals[MS_TL_RESERVED];
}

/* The allocated and reserved maxima over at most `points` buckets of the device's steps: one walk
 * over the trace, without making the two series (issue #33). */
static int ex_series(const ms_timeline_t *tl, size_t points, ms_explain_t *x) {
  if (x->device >= ms_timeline_ndevices(tl)) return MS_OK;
  size_t steps = ms_timeline_nentries(tl, x->device) + 1;
  size_t nb = points < steps ? points : steps;
  if (nb == 0) return MS_OK;
  x->series_step = calloc(nb, sizeof *x->series_step);
  x->series_allocated = calloc(nb, sizeof *x->series_allocated);
  x->series_reserved = calloc(nb, sizeof *x->series_reserved);
  if (!x->series_step || !x->series_allocated || !x->series_reserved) return MS_ENOMEM;
  for (size_t b = 0; b < nb; b++)
    x->series_step[b] = (size_t)((unsigned __int128)b * steps / nb);
  ex_buckets_t k = {x, nb - 1};
  int rc = ms_timeline_walk(tl, x->device, 0, steps - 1, ex_bucket_visit, &k);
  if (rc != MS_OK) return rc;
  x->nseries = nb;
  return MS_OK;
}

static int ex_analyse(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                      const ms_explain_options_t *o, ms_explain_t *x, ms_errbuf_t *eb) {
  MS_FORWARD_IF_ERROR(ex_moment(tl, o, x, eb));
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(tl, x->device, x->step, &st);
  if (rc == MS_OK) rc = ex_figures(snap, &st, x);
  if (rc == MS_OK) rc = ex_holders(&st, o->ntop, x);
  if (rc == MS_OK) rc = ex_attributed(snap, tl, &st, o->attr, o->ntop, x, eb);
  ms_timeline_state_release(&st);
  MS_FORWARD_IF_ERROR(rc);
  ex_capacity(snap, o, x);
  if (x->moment == MS_EXPLAIN_AT_OOM) ex_verdict_request(x);
  else ex_verdict_state(x);
  MS_FORWARD_IF_ERROR(ex_step_phase(tl, x));
  if (o->series_points && x->has_trace) MS_FORWARD_IF_ERROR(ex_series(tl, o->series_points, x));
  ex_hint(x);
  return MS_OK;
}

int ms_explain_run(const ms_snapshot_t *snap, const ms_explain_options_t *opt, ms_explain_t **out,
                   ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!snap || !out, MS_EINVAL);
  ms_explain_options_t o;
  if (opt) o = *opt;
  else ms_explain_options_init(&o);
  if (o.ntop == 0) o.ntop = 10;
  size_t dev = 0;
  MS_FORWARD_IF_ERROR(ex_device(snap, &o, &dev, eb));
  ms_explain_t *x = calloc(1, sizeof *x);
  if (!x) return MS_ENOMEM;
  x->device = dev;
  x->entry = -1;
  x->step_number = -1;
  x->has_trace = ex_has_trace(snap, dev);
  if (!x->has_trace && o.has_moment && o.moment.kind != MS_TL_MOMENT_END) {
    ms_explain_free(x);
    return ms__errbuf_set(eb, MS_EINVAL, "device %zu has no allocation trace: only its end state "
                          "can be explained (no --at)", dev);
  }
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  ms_timeline_t *tl = NULL;
  int rc = MS_OK;
  if (o.timeline && ms_timeline_snapshot(o.timeline) == snap) /* the caller's (a cached one) */
    rc = ex_analyse(snap, o.timeline, &o, x, eb);
  else if ((rc = ms_timeline_create(snap, &cfg, &tl, eb)) == MS_OK)
    rc = ex_analyse(snap, tl, &o, x, eb);
  ms_timeline_destroy(tl);
  if (rc == MS_OK && o.remedies) rc = ms__explain_remedies(snap, &o, x);
  if (rc != MS_OK) {
    ms_explain_free(x);
    return rc;
  }
  *out = x;
  return MS_OK;
}
