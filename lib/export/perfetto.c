/* SPDX-License-Identifier: MIT
 * memsnap exports: Chrome Trace Event Format JSON (issue #17 §3), which ui.perfetto.dev and
 * chrome://tracing open ("JSON Object Format": {"traceEvents": [...], "displayTimeUnit": "ms"}).
 *
 * Mapping (docs/exports.md): a process per device (pid = device + 1, named "device N" by a
 * process_name metadata event); counter events ("C") named allocated, reserved and active with
 * the device's totals in bytes, one whenever the total changes, at the trace's time_us (a trace
 * without times uses the entry index as its microseconds, so that the order still shows);
 * instant events ("i", process scope) for OOMs, snapshots and every run of consecutive
 * segment_free/segment_unmap entries (an empty_cache or an OOM's release of cached segments);
 * with opts->allocations, an async slice ("b"/"e", category "allocation", id = the alloc's entry
 * index × the number of devices + the device, so that no two devices share an id: a viewer pairs
 * async events by category and id alone, across processes; issue #31) from each alloc to its
 * free_completed (or the trace's last time), named by its source (memsnap/attribution.h: the
 * user's own line, never the unwinder's frame), with size, address, source and category as args.
 * With opts->counter_buckets, the counters are downsampled: each run of entries gives only its
 * lowest and highest totals (a 1 GB trace's counters are millions of events).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "common/internal.h"
#include "export/internal.h"
#include "memsnap/export.h"
#include "timeline/internal.h"

typedef struct pf_writer_s {
  ms__xbuf_t b;
  ms_sink_t *sink;
  int err;
  bool first;
} pf_writer_t;

/* Writes the buffer out when it holds more than a MiB (or at the end). */
static void pf_flush(pf_writer_t *w, bool all) {
  if (w->err || (!all && w->b.len < (1u << 20))) return;
  if (w->b.oom) {
    w->err = MS_ENOMEM;
    return;
  }
  if (w->b.len) w->err = w->sink->write(w->sink->ctx, w->b.ptr, w->b.len);
  w->b.len = 0;
}

static void pf_event_start(pf_writer_t *w) {
  ms__xbuf_puts(&w->b, w->first ? "\n" : ",\n");
  w->first = false;
}

/* An entry's time, or its index when the trace has none. */
static int64_t pf_time(const ms_snap_trace_t *e, size_t i, bool timed) {
  return timed ? e->time_us : (int64_t)i;
}

/* The entries [lo, hi) of a device that the trace shows (opts' window, or all of them). */
typedef struct pf_window_s {
  size_t lo, hi;
} pf_window_t;

static void pf_counter(pf_writer_t *w, ms_tl_metric m, int64_t ts, size_t dev, uint64_t bytes) {
  pf_event_start(w);
  ms__xbuf_printf(&w->b,
                  "{\"name\": \"%s\", \"ph\": \"C\", \"ts\": %" PRId64 ", \"pid\": %zu, "
                  "\"args\": {\"bytes\": %" PRIu64 "}}",
                  ms_tl_metric_name(m), ts, dev + 1, bytes);
  pf_flush(w, false);
}

/* A counter's events: its value before the window's first entry, then every change; or, with
 * buckets (> 0, fewer than the entries shown), the window cut into that many runs of entries and
 * of each run only its lowest and its highest value, in their order (so that every peak and
 * trough of the whole series stays, at its time, in at most 2 x buckets events). */
static void pf_counter_series(pf_writer_t *w, const ms_timeline_t *tl, size_t dev, bool timed,
                              pf_window_t win, ms_tl_metric m, size_t buckets) {
  const uint64_t *v = ms_timeline_series(tl, dev, m);
  if (!v) return;
  size_t shown = 0, last_shown = 0;
  for (size_t i = win.lo; i < win.hi; i++)
    if (!timed || (ms_timeline_entry(tl, dev, i)->present & MS_TRACE_HAS_TIME)) {
      shown++;
      last_shown = i;
    }
  size_t per = buckets && shown > buckets ? (shown + buckets - 1) / buckets : 1;
  bool any = false;
  uint64_t last = 0;
  size_t in = 0, lo = SIZE_MAX, hi = SIZE_MAX; /* the run's entries, its lowest and highest */
  for (size_t i = win.lo; i < win.hi && !w->err; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (timed && !(e->present & MS_TRACE_HAS_TIME)) continue;
    if (!any) { /* the state before the first entry shown, at its time */
      pf_counter(w, m, pf_time(e, i, timed), dev, v[i]);
      last = v[i];
      any = true;
    }
    if (per == 1) {
      if (v[i + 1] != last) pf_counter(w, m, pf_time(e, i, timed), dev, last = v[i + 1]);
      continue;
    }
    if (lo == SIZE_MAX || v[i + 1] < v[lo + 1]) lo = i;
    if (hi == SIZE_MAX || v[i + 1] > v[hi + 1]) hi = i;
    if (++in < per && i != last_shown) continue; /* the last entry shown ends the last run */
    size_t first = lo < hi ? lo : hi, second = lo < hi ? hi : lo;
    if (v[first + 1] != last)
      pf_counter(w, m, pf_time(ms_timeline_entry(tl, dev, first), first, timed), dev,
                 last = v[first + 1]);
    if (v[second + 1] != last)
      pf_counter(w, m, pf_time(ms_timeline_entry(tl, dev, second), second, timed), dev,
                 last = v[second + 1]);
    in = 0;
    lo = hi = SIZE_MAX;
  }
}

static void pf_counters(pf_writer_t *w, const ms_timeline_t *tl, size_t dev, bool timed,
                        pf_window_t win, size_t buckets) {
  static const ms_tl_metric metrics[3] = {MS_TL_ALLOCATED, MS_TL_RESERVED, MS_TL_ACTIVE};
  /* the three in one pass over the trace (the index keeps no series until asked) */
  (void)ms__tl_series_make(tl, dev,
                           1u << MS_TL_ALLOCATED | 1u << MS_TL_RESERVED | 1u << MS_TL_ACTIVE);
  for (int m = 0; m < 3; m++) pf_counter_series(w, tl, dev, timed, win, metrics[m], buckets);
}

static void pf_instants(pf_writer_t *w, const ms_timeline_t *tl, size_t dev, bool timed,
                        pf_window_t win) {
  size_t n = win.hi;
  for (size_t i = win.lo; i < n && !w->err; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (timed && !(e->present & MS_TRACE_HAS_TIME)) continue;
    int64_t ts = pf_time(e, i, timed);
    if (e->action == MS_TRACE_OOM) {
      pf_event_start(w);
      ms__xbuf_printf(&w->b,
                      "{\"name\": \"oom\", \"ph\": \"i\", \"s\": \"p\", \"ts\": %" PRId64
                      ", \"pid\": %zu, \"tid\": 0, \"args\": {\"entry\": %zu, \"size\": %" PRIu64
                      ", \"device_free\": %" PRIu64 "}}",
                      ts, dev + 1, i, e->size, e->addr);
    } else if (e->action == MS_TRACE_SNAPSHOT) {
      pf_event_start(w);
      ms__xbuf_printf(&w->b,
                      "{\"name\": \"snapshot\", \"ph\": \"i\", \"s\": \"p\", \"ts\": %" PRId64
                      ", \"pid\": %zu, \"tid\": 0, \"args\": {\"entry\": %zu}}",
                      ts, dev + 1, i);
    } else if (e->action == MS_TRACE_SEGMENT_FREE || e->action == MS_TRACE_SEGMENT_UNMAP) {
      size_t j = i, count = 0;
      uint64_t bytes = 0;
      for (; j < n; j++) {
        const ms_snap_trace_t *f = ms_timeline_entry(tl, dev, j);
        if (f->action != MS_TRACE_SEGMENT_FREE && f->action != MS_TRACE_SEGMENT_UNMAP) break;
        count++;
        bytes += f->size;
      }
      pf_event_start(w);
      ms__xbuf_printf(&w->b,
                      "{\"name\": \"segments released\", \"ph\": \"i\", \"s\": \"p\", \"ts\": "
                      "%" PRId64 ", \"pid\": %zu, \"tid\": 0, \"args\": {\"entry\": %zu, "
                      "\"segments\": %zu, \"bytes\": %" PRIu64 "}}",
                      ts, dev + 1, i, count, bytes);
      i = j - 1;
    }
    pf_flush(w, false);
  }
}

/* ---- allocations: alloc paired with free_completed by address -------------------------------- */

typedef struct pf_open_s {
  uint64_t addr;
  size_t entry; /* SIZE_MAX: empty slot */
} pf_open_t;

typedef struct pf_map_s {
  pf_open_t *slot;
  size_t cap, n;
} pf_map_t;

static size_t pf_hash(uint64_t a, size_t cap) {
  return (size_t)((a >> 9) * 0x9e3779b97f4a7c15ull >> 17) & (cap - 1);
}

static bool pf_map_grow(pf_map_t *m) {
  size_t ncap = m->cap ? m->cap * 2 : 1024;
  pf_open_t *ns = malloc(ncap * sizeof *ns);
  if (!ns) return false;
  for (size_t i = 0; i < ncap; i++) ns[i].entry = SIZE_MAX;
  for (size_t i = 0; i < m->cap; i++) {
    if (m->slot[i].entry == SIZE_MAX) continue;
    size_t j = pf_hash(m->slot[i].addr, ncap);
    while (ns[j].entry != SIZE_MAX) j = (j + 1) & (ncap - 1);
    ns[j] = m->slot[i];
  }
  free(m->slot);
  m->slot = ns;
  m->cap = ncap;
  return true;
}

/* Takes the open alloc of addr out of the map (linear probing with backward-shift deletion).
 * @return its entry, or SIZE_MAX. */
static size_t pf_map_take(pf_map_t *m, uint64_t addr) {
  if (!m->cap) return SIZE_MAX;
  size_t j = pf_hash(addr, m->cap);
  while (m->slot[j].entry != SIZE_MAX && m->slot[j].addr != addr) j = (j + 1) & (m->cap - 1);
  if (m->slot[j].entry == SIZE_MAX) return SIZE_MAX;
  size_t found = m->slot[j].entry;
  m->slot[j].entry = SIZE_MAX;
  m->n--;
  for (size_t k = (j + 1) & (m->cap - 1); m->slot[k].entry != SIZE_MAX; k = (k + 1) & (m->cap - 1)) {
    size_t h = pf_hash(m->slot[k].addr, m->cap);
    bool movable = j <= k ? (h <= j || h > k) : (h <= j && h > k);
    if (movable) {
      m->slot[j] = m->slot[k];
      m->slot[k].entry = SIZE_MAX;
      j = k;
    }
  }
  return found;
}

static bool pf_map_put(pf_map_t *m, uint64_t addr, size_t entry) {
  if ((m->n + 1) * 2 > m->cap && !pf_map_grow(m)) return false;
  pf_map_take(m, addr); /* an alloc over an open one replaces it (inconsistent trace) */
  size_t j = pf_hash(addr, m->cap);
  while (m->slot[j].entry != SIZE_MAX) j = (j + 1) & (m->cap - 1);
  m->slot[j].addr = addr;
  m->slot[j].entry = entry;
  m->n++;
  return true;
}

static void pf_slice(pf_writer_t *w, const ms_attr_t *attr, const ms_timeline_t *tl, size_t dev,
                     size_t a, int64_t fe, int64_t begin, int64_t end) {
  const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, a);
  char src[512];
  ms_attr_source(attr, e->stack, src, sizeof src);
  ms_category cat = ms__attr_classify(attr, dev, (int64_t)a, fe, e->stack, e->addr, false);
  ms__xbuf_t name = {0};
  ms__xbuf_json_str(&name, src);
  uint64_t id = (uint64_t)a * ms_timeline_ndevices(tl) + dev;
  const char *nm = ms__xbuf_cstr(&name);
  pf_event_start(w);
  ms__xbuf_printf(&w->b,
                  "{\"name\": %s, \"cat\": \"allocation\", \"ph\": \"b\", "
                  "\"id\": %" PRIu64 ", \"ts\": %" PRId64 ", \"pid\": %zu, \"tid\": 0, \"args\": "
                  "{\"entry\": %zu, \"size\": %" PRIu64 ", \"addr\": \"0x%" PRIx64
                  "\", \"stream\": %" PRIu64 ", \"category\": \"%s\", \"source\": %s}},\n",
                  nm, id, begin, dev + 1, a, e->size, e->addr, ms_snap_trace_stream(e),
                  ms_category_name(cat), nm);
  ms__xbuf_printf(&w->b,
                  "{\"name\": %s, \"cat\": \"allocation\", \"ph\": \"e\", "
                  "\"id\": %" PRIu64 ", \"ts\": %" PRId64 ", \"pid\": %zu, \"tid\": 0}",
                  nm, id, end, dev + 1);
  if (name.oom) w->b.oom = true;
  ms__xbuf_release(&name);
  pf_flush(w, false);
}

static int pf_cmp_size(const void *a, const void *b) {
  size_t x = *(const size_t *)a, y = *(const size_t *)b;
  return x < y ? -1 : x > y;
}

/* A slice's begin: its alloc's time, or the window's first time for one allocated before it. */
static int64_t pf_begin(const ms_timeline_t *tl, size_t dev, size_t a, bool timed, int64_t lo_ts) {
  int64_t t = pf_time(ms_timeline_entry(tl, dev, a), a, timed);
  return t < lo_ts ? lo_ts : t;
}

static void pf_allocations(pf_writer_t *w, const ms_attr_t *attr, const ms_timeline_t *tl,
                           size_t dev, bool timed, pf_window_t win) {
  size_t n = win.hi;
  int64_t last_ts = 0, lo_ts = INT64_MIN;
  for (size_t i = win.lo; i < n; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (timed && !(e->present & MS_TRACE_HAS_TIME)) continue;
    last_ts = pf_time(e, i, timed);
    if (lo_ts == INT64_MIN) lo_ts = last_ts;
  }
  pf_map_t m = {0};
  for (size_t i = 0; i < n && !w->err; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (timed && !(e->present & MS_TRACE_HAS_TIME)) continue;
    if (e->action == MS_TRACE_ALLOC) {
      if (!pf_map_put(&m, e->addr, i)) w->err = MS_ENOMEM;
    } else if (e->action == MS_TRACE_FREE_COMPLETED) {
      size_t a = pf_map_take(&m, e->addr); /* one freed before the window is not shown */
      if (a != SIZE_MAX && i >= win.lo)
        pf_slice(w, attr, tl, dev, a, (int64_t)i, pf_begin(tl, dev, a, timed, lo_ts),
                 pf_time(e, i, timed));
    }
  }
  /* still alive at the end: in the order of their allocs */
  size_t *open = m.n ? malloc(m.n * sizeof *open) : NULL;
  size_t k = 0;
  if (m.n && !open) w->err = MS_ENOMEM;
  for (size_t j = 0; open && j < m.cap; j++)
    if (m.slot[j].entry != SIZE_MAX) open[k++] = m.slot[j].entry;
  if (k > 1) qsort(open, k, sizeof *open, pf_cmp_size);
  for (size_t j = 0; j < k && !w->err; j++)
    pf_slice(w, attr, tl, dev, open[j], -1, pf_begin(tl, dev, open[j], timed, lo_ts), last_ts);
  free(open);
  free(m.slot);
}

int ms_export_perfetto_write(const ms_timeline_t *tl, const ms_export_perfetto_opts_t *opts,
                             ms_sink_t *sink, ms_errbuf_t *eb) {
  pf_writer_t w = {{0}, sink, MS_OK, true};
  const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
  ms_attr_t *own = NULL;
  const ms_attr_t *attr = opts ? opts->attr : NULL;
  if (opts && opts->allocations && !attr) {
    int err = ms_attr_create(snap, tl, NULL, &own, eb);
    if (err != MS_OK) return err;
    attr = own;
  }
  ms__xbuf_puts(&w.b, "{\"displayTimeUnit\": \"ms\", \"otherData\": {\"producer\": ");
  ms__xbuf_json_str(&w.b, ms__export_producer(snap));
  ms__xbuf_puts(&w.b, ", \"exporter\": \"memsnap\"}, \"traceEvents\": [");
  for (size_t dev = 0; dev < ms_timeline_ndevices(tl) && !w.err; dev++) {
    size_t n = ms_timeline_nentries(tl, dev);
    pf_window_t win = {0, n};
    if (opts && opts->has_range) {
      win.lo = opts->first < n ? opts->first : n;
      win.hi = opts->last < n ? opts->last + 1 : n;
    }
    if (n == 0 || win.lo >= win.hi) continue;
    bool timed = false;
    for (size_t i = 0; i < n && !timed; i++)
      timed = (ms_timeline_entry(tl, dev, i)->present & MS_TRACE_HAS_TIME) != 0;
    pf_event_start(&w);
    ms__xbuf_printf(&w.b,
                    "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %zu, \"args\": "
                    "{\"name\": \"device %zu\"}}",
                    dev + 1, dev);
    pf_counters(&w, tl, dev, timed, win, opts ? opts->counter_buckets : 0);
    pf_instants(&w, tl, dev, timed, win);
    if (opts && opts->allocations) pf_allocations(&w, attr, tl, dev, timed, win);
  }
  ms__xbuf_puts(&w.b, "\n]}\n");
  pf_flush(&w, true);
  ms__xbuf_release(&w.b);
  ms_attr_destroy(own);
  if (w.err) return ms__errbuf_set(eb, w.err, "cannot write the trace: %s", ms_strerror(w.err));
  return MS_OK;
}
