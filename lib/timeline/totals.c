/* SPDX-License-Identifier: MIT
 * memsnap core: the time index's totals (memsnap/timeline.h, issue #33): the totals at a step,
 * the peaks over a range of steps and the series, none of which a built index stores per step.
 *
 * A built index keeps the peaks over every step (found by the build, index.c) and its
 * checkpoints, which hold the totals at their steps. Everything else is a walk (ms__tl_walk):
 * restore the checkpoint at or after the last step asked for and undo entries down to the first,
 * reading the totals after each undo. A walk over a 5 M-entry trace takes about 0.2 s and stores
 * nothing per step; the four series of that trace were 153 MB, and the pages alone cost about as
 * much CPU as the walk. A series is made (one walk) only when ms_timeline_series asks for it, and
 * kept; a stored index (lib/cache) comes with its four series, and every query then reads them.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "timeline/internal.h"

/* ---- walks --------------------------------------------------------------------------------- */

int ms__tl_walk(const ms_timeline_t *tl, size_t dev, size_t from, size_t to, tl_visit_fn *fn,
                void *arg) {
  tl_dev_t *d = &tl->dev[dev];
  tl_ws_t w;
  memset(&w, 0, sizeof w);
  w.filter = tl_filter_of(tl);
  int rc = ms__tl_reach(tl, dev, to, &w);
  if (rc == MS_OK) fn(arg, to, w.totals);
  tl_ctx_t cx = {tl, d, dev, false, NULL, NULL};
  for (size_t i = to; rc == MS_OK && i-- > from;) {
    rc = ms__tl_undo(&cx, &w, i);
    if (rc == MS_OK) fn(arg, i, w.totals);
  }
  ms__tl_ws_release(&w);
  /* the build undid every entry with these sizes: a failure now is memory, or a forged stored
   * index (lib/cache), whose answers may be wrong but never crash */
  return rc == MS_ENOMEM ? MS_ENOMEM : rc == MS_OK ? MS_OK : MS_EFORMAT;
}

int ms_timeline_walk(const ms_timeline_t *tl, size_t dev, size_t from, size_t to,
                     ms_tl_visit_fn *fn, void *arg) {
  if (dev >= tl->ndev || !fn) return MS_EINVAL;
  if (to > tl->dev[dev].n) to = tl->dev[dev].n;
  if (from > to) return MS_EINVAL;
  return ms__tl_walk(tl, dev, from, to, fn, arg);
}

/* ---- series -------------------------------------------------------------------------------- */

/* Device dev's series of m, or NULL when none is made. */
static const uint64_t *tl_series_get(const ms_timeline_t *tl, size_t dev, ms_tl_metric m) {
  ms_timeline_t *mut = (ms_timeline_t *)tl; /* the lock only: the index is otherwise read */
  pthread_mutex_lock(&mut->lock);
  const uint64_t *v = tl->dev[dev].series[m];
  pthread_mutex_unlock(&mut->lock);
  return v;
}

typedef struct tl_fill_s {
  uint64_t *v[MS_TL_METRIC_COUNT]; /* NULL: not wanted */
} tl_fill_t;

static void tl_fill_visit(void *arg, size_t step, const uint64_t totals[MS_TL_METRIC_COUNT]) {
  tl_fill_t *f = arg;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    if (f->v[m]) f->v[m][step] = totals[m];
}

int ms__tl_series_make(const ms_timeline_t *tl, size_t dev, unsigned mask) {
  if (dev >= tl->ndev) return MS_EINVAL;
  ms_timeline_t *mut = (ms_timeline_t *)tl; /* the series are a cache of what the index holds */
  tl_dev_t *d = &mut->dev[dev];
  int rc = MS_OK;
  pthread_mutex_lock(&mut->lock);
  tl_fill_t f;
  memset(&f, 0, sizeof f);
  bool any = false;
  for (int m = 0; m < MS_TL_METRIC_COUNT && rc == MS_OK; m++) {
    if (!(mask & 1u << m) || d->series[m]) continue;
    f.v[m] = ms__big_malloc((d->n + 1) * sizeof(uint64_t));
    if (!f.v[m]) rc = MS_ENOMEM;
    any = true;
  }
  if (any && rc == MS_OK) rc = ms__tl_walk(tl, dev, 0, d->n, tl_fill_visit, &f);
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    if (rc == MS_OK && f.v[m])
      d->series[m] = f.v[m];
    else
      ms__big_free(f.v[m]);
  }
  pthread_mutex_unlock(&mut->lock);
  return rc;
}

const uint64_t *ms_timeline_series(const ms_timeline_t *tl, size_t dev, ms_tl_metric m) {
  if (dev >= tl->ndev || (unsigned)m >= MS_TL_METRIC_COUNT) return NULL;
  if (ms__tl_series_make(tl, dev, 1u << m) != MS_OK) return NULL;
  return tl_series_get(tl, dev, m);
}

/* ---- totals at a step ---------------------------------------------------------------------- */

int ms_timeline_totals_at(const ms_timeline_t *tl, size_t dev, size_t step,
                          uint64_t totals[MS_TL_METRIC_COUNT]) {
  if (dev >= tl->ndev || step > tl->dev[dev].n || !totals) return MS_EINVAL;
  const tl_dev_t *d = &tl->dev[dev];
  uint64_t t[MS_TL_METRIC_COUNT];
  bool all = true;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    const uint64_t *v = tl_series_get(tl, dev, (ms_tl_metric)m);
    if (v) t[m] = v[step];
    all = all && v;
  }
  if (!all) {
    size_t lo = tl_ckpt_at_or_after(d, step); /* a checkpoint holds the totals at its step */
    if (lo < d->ckpts.len && d->ckpts.ptr[lo].step == step) {
      memcpy(t, d->ckpts.ptr[lo].totals, sizeof t);
    } else {
      tl_ws_t w;
      memset(&w, 0, sizeof w);
      w.filter = tl_filter_of(tl);
      int rc = ms__tl_reach(tl, dev, step, &w);
      memcpy(t, w.totals, sizeof t);
      ms__tl_ws_release(&w);
      if (rc != MS_OK) return rc == MS_ENOMEM ? MS_ENOMEM : MS_EFORMAT;
    }
  }
  memcpy(totals, t, sizeof t);
  return MS_OK;
}

/* ---- peaks --------------------------------------------------------------------------------- */

/* The peaks of the metrics in mask over steps [from, to] (pre: valid, to <= n) into pk: from a
 * series where one is made, from the build's peaks for the whole range, else one walk. */
static int tl_peaks_range(const ms_timeline_t *tl, size_t dev, size_t from, size_t to,
                          unsigned mask, tl_peaks_t *pk) {
  const tl_dev_t *d = &tl->dev[dev];
  unsigned walk = 0;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    if (!(mask & 1u << m)) continue;
    const uint64_t *v = tl_series_get(tl, dev, (ms_tl_metric)m);
    if (v) {
      size_t best = from;
      for (size_t s = from + 1; s <= to; s++)
        if (v[s] > v[best]) best = s;
      pk->bytes[m] = v[best];
      pk->step[m] = best;
    } else if (d->has_peaks && from == 0 && to == d->n) {
      pk->bytes[m] = d->peak_bytes[m];
      pk->step[m] = d->peak_step[m];
    } else {
      walk |= 1u << m;
    }
  }
  if (!walk) return MS_OK;
  tl_peaks_t w;
  memset(&w, 0, sizeof w);
  int rc = ms__tl_walk(tl, dev, from, to, tl_peaks_visit, &w);
  if (rc != MS_OK) return rc;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    if (walk & 1u << m) {
      pk->bytes[m] = w.bytes[m];
      pk->step[m] = w.step[m];
    }
  return MS_OK;
}

static void tl_peak_out(const tl_dev_t *d, uint64_t bytes, size_t step, ms_tl_peak_t *out) {
  ms_tl_peak_t p;
  memset(&p, 0, sizeof p);
  p.bytes = bytes;
  p.step = step;
  p.entry = (int64_t)step - 1;
  if (step > 0 && (d->trace[step - 1].present & MS_TRACE_HAS_TIME)) {
    p.has_time = true;
    p.time_us = d->trace[step - 1].time_us;
  }
  *out = p;
}

int ms_timeline_peak(const ms_timeline_t *tl, size_t dev, ms_tl_metric m, size_t from, size_t to,
                     ms_tl_peak_t *out) {
  if (dev >= tl->ndev || (unsigned)m >= MS_TL_METRIC_COUNT) return MS_EINVAL;
  const tl_dev_t *d = &tl->dev[dev];
  if (to > d->n) to = d->n;
  if (from > to) return MS_EINVAL;
  tl_peaks_t pk;
  memset(&pk, 0, sizeof pk);
  int rc = tl_peaks_range(tl, dev, from, to, 1u << m, &pk);
  if (rc != MS_OK) return rc;
  tl_peak_out(d, pk.bytes[m], pk.step[m], out);
  return MS_OK;
}

int ms_timeline_peaks(const ms_timeline_t *tl, size_t dev, size_t from, size_t to,
                      ms_tl_peak_t out[MS_TL_METRIC_COUNT]) {
  if (dev >= tl->ndev || !out) return MS_EINVAL;
  const tl_dev_t *d = &tl->dev[dev];
  if (to > d->n) to = d->n;
  if (from > to) return MS_EINVAL;
  tl_peaks_t pk;
  memset(&pk, 0, sizeof pk);
  int rc = tl_peaks_range(tl, dev, from, to, (1u << MS_TL_METRIC_COUNT) - 1, &pk);
  if (rc != MS_OK) return rc;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    tl_peak_out(d, pk.bytes[m], pk.step[m], &out[m]);
  return MS_OK;
}
