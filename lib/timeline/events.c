/* SPDX-License-Identifier: MIT
 * memsnap core: the trace's events beyond allocations (memsnap/timeline.h, docs/explain.md): the
 * `oom` entries with the reserved bytes at each and the device capacity they imply, and the
 * record_function annotations (external_annotations) paired into ranges: steps
 * (ProfilerStep#N) and phases.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/hash.h"
#include "timeline/internal.h"

/* ---- OOMs and capacity ----------------------------------------------------------------------- */

size_t ms_snapshot_oom_count(const ms_snapshot_t *snap, size_t dev) {
  if (!snap || dev >= snap->ndevices) return 0;
  const ms_snap_device_t *d = &snap->devices[dev];
  size_t n = 0;
  for (size_t i = 0; i < d->ntrace; i++)
    n += snap->trace[d->first_trace + i].action == MS_TRACE_OOM;
  return n;
}

/* Visits the `oom` entries of device dev from its last to its first (k counts down from the number
 * of them), each with the reserved bytes at it: the end state's segments with the segment entries
 * after it undone, in one pass from the end for all of them. Reserved is unknown for an entry
 * before a point where the trace frees more than it holds. visit returns false to stop. */
typedef bool (*tl_oom_visit_fn)(void *ctx, size_t k, const ms_tl_oom_t *o);

static void tl_ooms_back(const ms_snapshot_t *snap, size_t dev, size_t noom, tl_oom_visit_fn visit,
                         void *ctx) {
  const ms_snap_device_t *d = &snap->devices[dev];
  /* In 128 bits: hostile sizes must not wrap into a plausible figure. */
  unsigned __int128 r = 0;
  for (size_t i = 0; i < snap->nsegments; i++)
    if (snap->segments[i].device == (int64_t)dev) r += snap->segments[i].total_size;
  bool bad = false; /* the entries undone so far free more than was held */
  size_t k = noom;
  for (size_t i = d->ntrace; i-- > 0 && k > 0;) {
    const ms_snap_trace_t *e = &snap->trace[d->first_trace + i];
    switch (e->action) {
    case MS_TRACE_OOM: {
      ms_tl_oom_t o;
      memset(&o, 0, sizeof o);
      o.entry = i;
      o.request = e->size;
      o.stream = ms_snap_trace_stream(e);
      o.pool_id[0] = ms_snap_trace_pool(e, 0);
      o.pool_id[1] = ms_snap_trace_pool(e, 1);
      o.has_device_free = !(e->present & MS_TRACE_NO_ADDR);
      o.device_free = o.has_device_free ? e->addr : 0;
      o.has_reserved = !bad && r <= UINT64_MAX;
      o.reserved = o.has_reserved ? (uint64_t)r : 0;
      if (!visit(ctx, --k, &o)) return;
      break;
    }
    case MS_TRACE_SEGMENT_ALLOC:
    case MS_TRACE_SEGMENT_MAP:
      if (r < e->size) bad = true;
      if (!bad) r -= e->size;
      break;
    case MS_TRACE_SEGMENT_FREE:
    case MS_TRACE_SEGMENT_UNMAP: r += e->size; break;
    default: break;
    }
  }
}

typedef struct tl_oom_find_s {
  size_t k;
  ms_tl_oom_t *out;
} tl_oom_find_t;

static bool tl_oom_find(void *ctx, size_t k, const ms_tl_oom_t *o) {
  tl_oom_find_t *f = ctx;
  if (k != f->k) return true;
  *f->out = *o;
  return false;
}

int ms_snapshot_oom_at(const ms_snapshot_t *snap, size_t dev, size_t k, ms_tl_oom_t *out) {
  if (!snap || !out || dev >= snap->ndevices) return MS_EINVAL;
  size_t n = ms_snapshot_oom_count(snap, dev);
  if (k >= n) return MS_EINVAL;
  tl_oom_find_t f = {k, out};
  tl_ooms_back(snap, dev, n, tl_oom_find, &f);
  return MS_OK;
}

static bool tl_oom_store(void *ctx, size_t k, const ms_tl_oom_t *o) {
  ((ms_tl_oom_t *)ctx)[k] = *o;
  return true;
}

int ms_snapshot_ooms(const ms_snapshot_t *snap, size_t dev, ms_tl_ooms_t *out) {
  if (!out) return MS_EINVAL;
  memset(out, 0, sizeof *out);
  if (!snap) return MS_EINVAL;
  size_t n = ms_snapshot_oom_count(snap, dev); /* 0 for a device the snapshot does not list */
  if (n == 0) return MS_OK;
  out->ooms = malloc(n * sizeof *out->ooms);
  if (!out->ooms) return MS_ENOMEM;
  out->n = n;
  tl_ooms_back(snap, dev, n, tl_oom_store, out->ooms);
  return MS_OK;
}

void ms_tl_ooms_release(ms_tl_ooms_t *o) {
  if (!o) return;
  free(o->ooms);
  memset(o, 0, sizeof *o);
}

const char *ms_capacity_source_name(ms_capacity_source s) {
  switch (s) {
  case MS_CAPACITY_UNKNOWN: return "unknown";
  case MS_CAPACITY_RECORDED: return "recorded";
  case MS_CAPACITY_INFERRED: return "inferred_from_oom";
  case MS_CAPACITY_GIVEN: return "given";
  }
  return "?";
}

/* The first `oom` entry that tells the device's capacity: device_free and the reserved bytes
 * known, their sum neither 0 nor past 64 bits (the visits go from the last entry to the first:
 * the last one found is the first in the trace). */
typedef struct tl_oom_first_s {
  bool found;
  ms_tl_oom_t o;
} tl_oom_first_t;

static bool tl_oom_first(void *ctx, size_t k, const ms_tl_oom_t *o) {
  (void)k;
  tl_oom_first_t *f = ctx;
  if (!o->has_device_free || !o->has_reserved || o->device_free > UINT64_MAX - o->reserved)
    return true;
  if (o->reserved + o->device_free == 0) return true;
  f->found = true;
  f->o = *o;
  return true;
}

ms_capacity_source ms_snapshot_capacity(const ms_snapshot_t *snap, size_t dev, uint64_t *bytes,
                                        ms_tl_oom_t *oom) {
  *bytes = 0;
  if (!snap || dev >= snap->ndevices) return MS_CAPACITY_UNKNOWN;
  const ms_snap_device_t *d = &snap->devices[dev];
  if ((d->present & MS_DEV_HAS_CAPACITY) && d->capacity > 0) {
    *bytes = d->capacity;
    return MS_CAPACITY_RECORDED;
  }
  tl_oom_first_t f = {false, {0}};
  tl_ooms_back(snap, dev, ms_snapshot_oom_count(snap, dev), tl_oom_first, &f);
  if (!f.found) return MS_CAPACITY_UNKNOWN;
  *bytes = f.o.reserved + f.o.device_free;
  if (oom) *oom = f.o;
  return MS_CAPACITY_INFERRED;
}

/* ---- annotations ------------------------------------------------------------------------------ */

typedef struct tl_mark_s {
  const ms_snap_annotation_t *a;
  size_t order; /* position in the snapshot: a stable sort */
} tl_mark_t;

static int tl_mark_cmp(const void *x, const void *y) {
  const tl_mark_t *a = x, *b = y;
  if (a->a->time_us != b->a->time_us) return a->a->time_us < b->a->time_us ? -1 : 1;
  return a->order < b->order ? -1 : a->order > b->order;
}

/* A range being paired, with the position of its START among the sorted markers (a stable sort
 * of the ranges) and the range of the same name and device that was open when it opened. */
typedef struct tl_open_s {
  ms_tl_range_t r;
  size_t pos;
  size_t below; /* TL_OPEN_NONE: none */
} tl_open_t;

#define TL_OPEN_NONE SIZE_MAX

static int tl_open_cmp(const void *x, const void *y) {
  const tl_open_t *a = x, *b = y;
  if (a->r.start_us != b->r.start_us) return a->r.start_us < b->r.start_us ? -1 : 1;
  if (a->r.end_us != b->r.end_us) return a->r.end_us > b->r.end_us ? -1 : 1; /* outer first */
  return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* The ranges open, by name and device: per key, a slot holding one range of that key (rep, for
 * the comparison) and the latest one still open (top; the others below it, through below). */
typedef struct tl_keyslot_s {
  size_t rep, top; /* rep TL_OPEN_NONE: an empty slot */
} tl_keyslot_t;

static size_t tl_key_slot(const tl_keyslot_t *t, size_t cap, const tl_open_t *r, const char *name,
                          int64_t device) {
  size_t i = (size_t)ms_hash_bytes(name, strlen(name), (uint64_t)device) & (cap - 1);
  while (t[i].rep != TL_OPEN_NONE &&
         (r[t[i].rep].r.device != device || strcmp(r[t[i].rep].r.name, name) != 0))
    i = (i + 1) & (cap - 1);
  return i;
}

/* N of "ProfilerStep#N" (decimal, at most 18 digits), else -1. */
static int64_t tl_step_number(const char *name) {
  static const char prefix[] = "ProfilerStep#";
  if (strncmp(name, prefix, sizeof prefix - 1) != 0) return -1;
  const char *p = name + sizeof prefix - 1;
  int64_t v = 0;
  size_t nd = 0;
  for (; *p >= '0' && *p <= '9' && nd < 18; p++, nd++)
    v = v * 10 + (*p - '0');
  return nd > 0 && *p == 0 ? v : -1;
}

/* The key table with room for twice its keys (r: the ranges that the keys name); false when out
 * of memory. */
static bool tl_keys_grow(tl_keyslot_t **t, size_t *cap, size_t nkeys, const tl_open_t *r) {
  if ((nkeys + 1) * 2 <= *cap) return true;
  size_t ncap = *cap ? *cap * 2 : 64;
  tl_keyslot_t *g = malloc(ncap * sizeof *g);
  if (!g) return false;
  for (size_t i = 0; i < ncap; i++)
    g[i].rep = TL_OPEN_NONE;
  for (size_t i = 0; i < *cap; i++) {
    if ((*t)[i].rep == TL_OPEN_NONE) continue;
    const ms_tl_range_t *x = &r[(*t)[i].rep].r;
    g[tl_key_slot(g, ncap, r, x->name, x->device)] = (*t)[i];
  }
  free(*t);
  *t = g;
  *cap = ncap;
  return true;
}

/* Pairs the sorted markers m[0..n) into r (its count into *nr): each END closes the top of its
 * key's stack of open ranges, so that pairing is linear in the markers however they nest. */
static int tl_pair(const tl_mark_t *m, size_t n, tl_open_t *r, size_t *nr, ms_tl_ranges_t *out) {
  tl_keyslot_t *t = NULL;
  size_t cap = 0, nkeys = 0, k = 0;
  if (!tl_keys_grow(&t, &cap, 0, r)) return MS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const ms_snap_annotation_t *a = m[i].a;
    bool start = strcmp(a->stage, "START") == 0;
    if (!start && strcmp(a->stage, "END") != 0) {
      out->unknown_stages++;
      continue;
    }
    size_t s = tl_key_slot(t, cap, r, a->name, a->device);
    if (start && t[s].rep == TL_OPEN_NONE) { /* a new key */
      if (!tl_keys_grow(&t, &cap, nkeys, r)) {
        free(t);
        return MS_ENOMEM;
      }
      s = tl_key_slot(t, cap, r, a->name, a->device);
      t[s] = (tl_keyslot_t){k, TL_OPEN_NONE};
      nkeys++;
    }
    if (start) {
      r[k] = (tl_open_t){
          {a->name, a->device, a->time_us, INT64_MAX, false, tl_step_number(a->name)}, i, t[s].top};
      t[s].top = k++;
    } else if (t[s].rep == TL_OPEN_NONE || t[s].top == TL_OPEN_NONE) {
      out->unmatched_ends++;
    } else {
      tl_open_t *x = &r[t[s].top];
      x->r.end_us = a->time_us;
      x->r.has_end = true;
      t[s].top = x->below;
    }
  }
  free(t);
  *nr = k;
  return MS_OK;
}

/* Sorts n elements unless they are in order already (the markers of a trace mostly are). */
static void tl_sort(void *base, size_t n, size_t size, int (*cmp)(const void *, const void *)) {
  const char *p = base;
  for (size_t i = 1; i < n; i++)
    if (cmp(p + (i - 1) * size, p + i * size) > 0) {
      qsort(base, n, size, cmp);
      return;
    }
}

typedef struct tl_stepkey_s {
  int64_t step;
  size_t pos;
} tl_stepkey_t;

static int tl_step_cmp(const void *x, const void *y) {
  const tl_stepkey_t *a = x, *b = y;
  if (a->step != b->step) return a->step < b->step ? -1 : 1;
  return a->pos < b->pos ? -1 : a->pos > b->pos;
}

/* out->by_step from out->ranges, which hold nsteps step ranges. */
static int tl_steps_index(ms_tl_ranges_t *out, size_t nsteps) {
  tl_stepkey_t *k = malloc(nsteps * sizeof *k);
  out->by_step = malloc(nsteps * sizeof *out->by_step);
  if (!k || !out->by_step) {
    free(k);
    return MS_ENOMEM;
  }
  size_t j = 0;
  for (size_t i = 0; i < out->n; i++)
    if (out->ranges[i].step >= 0) k[j++] = (tl_stepkey_t){out->ranges[i].step, i};
  qsort(k, nsteps, sizeof *k, tl_step_cmp);
  for (j = 0; j < nsteps; j++)
    out->by_step[j] = k[j].pos;
  out->nsteps = nsteps;
  free(k);
  return MS_OK;
}

int ms_tl_ranges_build(const ms_snapshot_t *snap, ms_tl_ranges_t *out) {
  memset(out, 0, sizeof *out);
  size_t n = snap ? snap->nannotations : 0;
  if (n == 0) return MS_OK;
  tl_mark_t *m = malloc(n * sizeof *m);
  tl_open_t *o = malloc(n * sizeof *o);
  if (!m || !o) {
    free(m);
    free(o);
    return MS_ENOMEM;
  }
  for (size_t i = 0; i < n; i++) m[i] = (tl_mark_t){&snap->annotations[i], i};
  tl_sort(m, n, sizeof *m, tl_mark_cmp);
  size_t nr = 0;
  int rc = tl_pair(m, n, o, &nr, out);
  free(m);
  if (rc != MS_OK) {
    free(o);
    memset(out, 0, sizeof *out);
    return rc;
  }
  tl_sort(o, nr, sizeof *o, tl_open_cmp);
  /* the ranges take the front of o's block (a range is smaller than its tl_open_t) */
  _Static_assert(sizeof(ms_tl_range_t) <= sizeof(tl_open_t), "ranges fit in place");
  size_t nsteps = 0;
  for (size_t i = 0; i < nr; i++) {
    ms_tl_range_t x = o[i].r;
    nsteps += x.step >= 0;
    memcpy((char *)o + i * sizeof x, &x, sizeof x);
  }
  ms_tl_range_t *r = realloc(o, (nr ? nr : 1) * sizeof *r);
  out->ranges = r ? r : (ms_tl_range_t *)(void *)o;
  out->n = nr;
  if (nsteps > 0 && tl_steps_index(out, nsteps) != MS_OK) {
    ms_tl_ranges_release(out);
    return MS_ENOMEM;
  }
  return MS_OK;
}

void ms_tl_ranges_release(ms_tl_ranges_t *r) {
  if (!r) return;
  free(r->ranges);
  free(r->by_step);
  memset(r, 0, sizeof *r);
}

const ms_tl_range_t *ms_tl_ranges_at(const ms_tl_ranges_t *r, int64_t dev, int64_t t,
                                     bool want_step) {
  const ms_tl_range_t *best = NULL;
  for (size_t i = 0; i < r->n && r->ranges[i].start_us <= t; i++) {
    const ms_tl_range_t *x = &r->ranges[i];
    if ((dev >= 0 && x->device != dev) || (x->step >= 0) != want_step) continue;
    if (t > x->end_us) continue;
    /* sorted by start: a later start that holds t is inner (or a sibling that began later) */
    best = x;
  }
  return best;
}

const ms_tl_range_t *ms_tl_ranges_step(const ms_tl_ranges_t *r, int64_t dev, int64_t n) {
  if (n < 0) return NULL; /* no step: the phase ranges have step -1 */
  if (!r->by_step) {      /* a table filled by its caller: a scan */
    for (size_t i = 0; i < r->n; i++) {
      const ms_tl_range_t *x = &r->ranges[i];
      if (x->step == n && (dev < 0 || x->device == dev)) return x;
    }
    return NULL;
  }
  size_t lo = 0, hi = r->nsteps; /* the first of step n, then those after it in ranges' order */
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (r->ranges[r->by_step[mid]].step < n)
      lo = mid + 1;
    else
      hi = mid;
  }
  for (; lo < r->nsteps && r->ranges[r->by_step[lo]].step == n; lo++) {
    const ms_tl_range_t *x = &r->ranges[r->by_step[lo]];
    if (dev < 0 || x->device == dev) return x;
  }
  return NULL;
}

/* Whether every entry of d has a time and the times never decrease: found on first use, kept. */
static bool tl_times_sorted(const ms_timeline_t *tl, size_t dev) {
  ms_timeline_t *mut = (ms_timeline_t *)tl; /* the lock, and a cache of what the trace says */
  tl_dev_t *d = &mut->dev[dev];
  pthread_mutex_lock(&mut->lock);
  if (d->time_order == 0) {
    bool sorted = true;
    for (size_t i = 0; i < d->n && sorted; i++)
      sorted = (d->trace[i].present & MS_TRACE_HAS_TIME) &&
               (i == 0 || d->trace[i].time_us >= d->trace[i - 1].time_us);
    d->time_order = sorted ? 1 : 2;
  }
  bool sorted = d->time_order == 1;
  pthread_mutex_unlock(&mut->lock);
  return sorted;
}

/* The first entry of d (sorted by time) whose time is >= t (upper: > t). */
static size_t tl_time_bound(const tl_dev_t *d, int64_t t, bool upper) {
  size_t lo = 0, hi = d->n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    int64_t v = d->trace[mid].time_us;
    if (upper ? v <= t : v < t)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

/* The step range of device dev's entries with lo <= time <= hi: by binary search when every entry
 * has a time and they never decrease (a step's entries are asked for once per step), else by a
 * pass over the trace, which skips the entries without a time. */
static int tl_time_range(const ms_timeline_t *tl, size_t dev, int64_t lo, int64_t hi,
                         size_t *from, size_t *to, ms_errbuf_t *eb) {
  const tl_dev_t *d = &tl->dev[dev];
  if (d->n > 0 && tl_times_sorted(tl, dev)) {
    size_t first = tl_time_bound(d, lo, false), end = hi < lo ? first : tl_time_bound(d, hi, true);
    *from = first;
    *to = end > first ? end : first; /* none inside: the (empty) range where it would be */
    return MS_OK;
  }
  size_t first = SIZE_MAX, last = 0;
  bool any = false;
  for (size_t i = 0; i < d->n; i++) {
    const ms_snap_trace_t *e = &d->trace[i];
    if (!(e->present & MS_TRACE_HAS_TIME)) continue;
    any = true;
    if (e->time_us < lo || e->time_us > hi) continue;
    if (first == SIZE_MAX) first = i;
    last = i;
  }
  if (!any) return ms__errbuf_set(eb, MS_EINVAL, "the trace of device %zu has no times", dev);
  if (first == SIZE_MAX) {
    /* no entry inside: the (empty) range where it would be */
    size_t at = 0;
    for (size_t i = 0; i < d->n; i++)
      if ((d->trace[i].present & MS_TRACE_HAS_TIME) && d->trace[i].time_us < lo) at = i + 1;
    *from = *to = at;
    return MS_OK;
  }
  *from = first;
  *to = last + 1;
  return MS_OK;
}

int ms_timeline_time_range(const ms_timeline_t *tl, size_t dev, int64_t t0, int64_t t1,
                           size_t *from, size_t *to, ms_errbuf_t *eb) {
  if (dev >= tl->ndev) return ms__errbuf_set(eb, MS_EINVAL, "no device %zu", dev);
  return tl_time_range(tl, dev, t0, t1, from, to, eb);
}

static int tl_no_step(ms_errbuf_t *eb, int64_t n) {
  return ms__errbuf_set(eb, MS_EINVAL,
                        "no step %" PRId64 ": the snapshot has no ProfilerStep#%" PRId64
                        " annotation (record_function ranges are recorded while the profiler "
                        "runs)",
                        n, n);
}

const ms_tl_ranges_t *ms__tl_ranges(const ms_timeline_t *tl) {
  ms_timeline_t *mut = (ms_timeline_t *)tl; /* the lock, and a cache of what the snapshot says */
  pthread_mutex_lock(&mut->lock);
  if (!mut->have_ranges) mut->have_ranges = ms_tl_ranges_build(tl->snap, &mut->ranges) == MS_OK;
  const ms_tl_ranges_t *rs = mut->have_ranges ? &mut->ranges : NULL;
  pthread_mutex_unlock(&mut->lock);
  return rs;
}

int ms_timeline_steps_range(const ms_timeline_t *tl, size_t dev, int64_t n, int64_t m,
                            size_t *from, size_t *to, ms_errbuf_t *eb) {
  if (dev >= tl->ndev) return ms__errbuf_set(eb, MS_EINVAL, "no device %zu", dev);
  if (n > m) return ms__errbuf_set(eb, MS_EINVAL, "steps %" PRId64 " to %" PRId64 ": out of order", n, m);
  const ms_tl_ranges_t *rs = ms__tl_ranges(tl);
  if (!rs) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  const ms_tl_range_t *x = ms_tl_ranges_step(rs, (int64_t)dev, n);
  if (!x) x = ms_tl_ranges_step(rs, -1, n); /* annotations recorded for another device index */
  const ms_tl_range_t *y = n == m ? x : ms_tl_ranges_step(rs, (int64_t)dev, m);
  if (!y) y = ms_tl_ranges_step(rs, -1, m);
  if (!x || !y) return tl_no_step(eb, x ? m : n);
  return tl_time_range(tl, dev, x->start_us, y->end_us, from, to, eb);
}

int ms_timeline_step_range(const ms_timeline_t *tl, size_t dev, int64_t n, size_t *from,
                           size_t *to, ms_errbuf_t *eb) {
  return ms_timeline_steps_range(tl, dev, n, n, from, to, eb);
}
