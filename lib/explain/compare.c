/* SPDX-License-Identifier: MIT
 * memsnap core: what changed between two snapshots or two moments (memsnap/compare.h, issue #28):
 * the totals of each side, the change by source and by category, the settings that differ, and
 * the leak suspects of the AFTER side. The gate's figures and limits are gate.c's.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "explain/compare_internal.h"

void ms_compare_options_init(ms_compare_options_t *o) {
  memset(o, 0, sizeof *o);
  o->device = -1;
  o->nrows = 20;
  o->leaks = true;
  o->leak_tolerance = 0.25;
}

/* ---- strings owned by a result --------------------------------------------------------------- */

const char *ms__cmp_strdup(cmp_strings_t *s, const char *text) {
  size_t n = strlen(text);
  char *p = malloc(n + 1);
  if (!p) return NULL;
  memcpy(p, text, n + 1);
  if (MS_VEC_PUSH(&s->v, p) != 0) {
    free(p);
    return NULL;
  }
  return p;
}

void ms__cmp_strings_free(cmp_strings_t *s) {
  if (!s) return;
  for (size_t i = 0; i < s->v.len; i++)
    free(s->v.ptr[i]);
  MS_VEC_FREE(&s->v);
  free(s);
}

void ms_compare_free(ms_compare_t *c) {
  if (!c) return;
  free(c->by_source);
  free(c->settings);
  free(c->leaks);
  ms__cmp_strings_free(c->impl_);
  free(c);
}

/* ---- one side -------------------------------------------------------------------------------- */

bool ms__cmp_has_trace(const ms_snapshot_t *snap, size_t dev) {
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

int ms__cmp_device(const ms_snapshot_t *snap, int want, const char *side, size_t *dev,
                   ms_errbuf_t *eb) {
  if (want >= 0) {
    size_t d = (size_t)want;
    bool listed = d < snap->ndevices && snap->devices[d].ntrace > 0;
    for (size_t i = 0; i < snap->nsegments && !listed; i++)
      listed = snap->segments[i].device == (int64_t)d;
    if (!listed)
      return ms__errbuf_set(eb, MS_EINVAL, "%s has no device %zu (no trace and no segments on it)",
                            side, d);
    *dev = d;
    return MS_OK;
  }
  size_t def = 0;
  if (ms_tl_viewer_devices(snap, NULL, 0, &def) == 0)
    return ms__errbuf_set(eb, MS_EINVAL, "%s has no device with a trace or segments", side);
  *dev = def;
  return MS_OK;
}

void ms__cmp_side_close(cmp_side_t *s) {
  if (!s->borrowed) {
    ms_attr_destroy(s->attr);
    ms_timeline_destroy(s->tl);
  }
  ms_timeline_state_release(&s->st);
  memset(s, 0, sizeof *s);
}

/* Puts "NAME: " before eb's message. */
static void cmp_prefix(ms_errbuf_t *eb, const char *name) {
  if (!eb) return;
  char why[sizeof eb->msg];
  memcpy(why, eb->msg, sizeof why);
  int n = snprintf(eb->msg, sizeof eb->msg, "%s: ", name);
  if (n > 0 && (size_t)n < sizeof eb->msg)
    snprintf(eb->msg + n, sizeof eb->msg - (size_t)n, "%.*s", (int)(sizeof eb->msg - (size_t)n - 1), why);
}

/* Opens a side: the index, the device, the moment's state and the classifier. */
int ms__cmp_side_open(const ms_snapshot_t *snap, int device, const ms_tl_moment_t *m,
                      const char *name, const cmp_side_t *share, cmp_side_t *s,
                      ms_errbuf_t *eb) {
  memset(s, 0, sizeof *s);
  ms_timeline_state_init(&s->st);
  s->snap = snap;
  ms_compare_side_t *f = &s->fig;
  MS_FORWARD_IF_ERROR(ms__cmp_device(snap, device, name, &f->device, eb));
  f->has_trace = ms__cmp_has_trace(snap, f->device);
  if (!f->has_trace && m && m->kind != MS_TL_MOMENT_END)
    return ms__errbuf_set(eb, MS_EINVAL, "%s has no allocation trace on device %zu: only its end "
                          "state can be compared (no --at)", name, f->device);
  if (f->device < snap->ndevices && (snap->devices[f->device].present & MS_DEV_HAS_CAPACITY)) {
    f->has_capacity = true;
    f->capacity = snap->devices[f->device].capacity;
  }
  int r = MS_OK;
  if (share) { /* the same snapshot: its index and classifier serve both moments */
    s->tl = share->tl;
    s->attr = share->attr;
    s->borrowed = true;
  } else {
    ms_timeline_config_t cfg;
    ms_timeline_config_init(&cfg);
    r = ms_timeline_create(snap, &cfg, &s->tl, eb);
    if (r == MS_EFORMAT) cmp_prefix(eb, name);
    MS_FORWARD_IF_ERROR(r);
  }
  size_t n = ms_timeline_nentries(s->tl, f->device);
  f->nentries = n;
  ms_tl_moment_t mm = {f->has_trace ? MS_TL_MOMENT_PEAK : MS_TL_MOMENT_END, 0};
  if (m) mm = *m;
  r = ms_timeline_moment_step(s->tl, f->device, &mm, 0, n, &f->step, eb);
  if (r != MS_OK) cmp_prefix(eb, name);
  MS_FORWARD_IF_ERROR(r);
  ms_tl_peak_t p;
  static const ms_tl_metric metric[3] = {MS_TL_ALLOCATED, MS_TL_RESERVED, MS_TL_REQUESTED};
  uint64_t *peak[3] = {&f->peak_allocated, &f->peak_reserved, &f->peak_requested};
  for (int k = 0; k < 3; k++) {
    MS_FORWARD_IF_ERROR(ms_timeline_peak(s->tl, f->device, metric[k], 0, n, &p));
    *peak[k] = p.bytes;
  }
  MS_FORWARD_IF_ERROR(ms_timeline_state_at(s->tl, f->device, f->step, &s->st));
  f->allocated = s->st.totals[MS_TL_ALLOCATED];
  f->reserved = s->st.totals[MS_TL_RESERVED];
  f->requested = s->st.totals[MS_TL_REQUESTED];
  f->segments = s->st.nsegments;
  f->blocks = s->st.nblocks;
  return share ? MS_OK : ms_attr_create(snap, s->tl, NULL, &s->attr, eb);
}

/* ---- the change by source and by category ---------------------------------------------------- */

static int cmp_row_key_cmp(const void *a, const void *b) {
  return strcmp(((const ms_compare_row_t *)a)->key, ((const ms_compare_row_t *)b)->key);
}

static int cmp_row_change_cmp(const void *a, const void *b) {
  const ms_compare_row_t *x = a, *y = b;
  uint64_t mx = x->change < 0 ? (uint64_t)0 - (uint64_t)x->change : (uint64_t)x->change;
  uint64_t my = y->change < 0 ? (uint64_t)0 - (uint64_t)y->change : (uint64_t)y->change;
  if (mx != my) return mx > my ? -1 : 1;
  if (x->change != y->change) return x->change > y->change ? -1 : 1;
  return strcmp(x->key, y->key);
}

/* Merges BEFORE's and AFTER's rows by key into c->by_source. */
static int cmp_merge_sources(ms_compare_t *c, cmp_strings_t *strs, const ms_attr_rows_t *rb,
                             const ms_attr_rows_t *ra, size_t nrows) {
  size_t n = rb->nrows + ra->nrows;
  ms_compare_row_t *all = calloc(n ? n : 1, sizeof *all);
  if (!all) return MS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    const ms_attr_row_t *r = i < rb->nrows ? &rb->rows[i] : &ra->rows[i - rb->nrows];
    all[i].key = r->key;
    all[i].category = r->category;
    if (i < rb->nrows) {
      all[i].before = r->bytes;
      all[i].blocks_before = r->blocks;
    } else {
      all[i].after = r->bytes;
      all[i].blocks_after = r->blocks;
    }
  }
  qsort(all, n, sizeof *all, cmp_row_key_cmp);
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    if (k && strcmp(all[k - 1].key, all[i].key) == 0) {
      ms_compare_row_t *d = &all[k - 1];
      d->before += all[i].before;
      d->after += all[i].after;
      d->blocks_before += all[i].blocks_before;
      d->blocks_after += all[i].blocks_after;
      if (all[i].after) d->category = all[i].category; /* AFTER's category wins */
      continue;
    }
    all[k++] = all[i];
  }
  size_t m = 0;
  for (size_t i = 0; i < k; i++) {
    all[i].change = (int64_t)(all[i].after - all[i].before);
    if (all[i].change == 0) continue;
    all[m] = all[i];
    if (!(all[m].key = ms__cmp_strdup(strs, all[i].key))) {
      free(all);
      return MS_ENOMEM;
    }
    m++;
  }
  qsort(all, m, sizeof *all, cmp_row_change_cmp);
  c->nsource_all = m;
  c->nsource = nrows && nrows < m ? nrows : m;
  c->by_source = all;
  return MS_OK;
}

/* The allocated blocks of a side at its moment by category (rows[0]) and by source (rows[1]); the
 * sources' keys copied into keep, so that the rows outlive the side's classifier. */
static int cmp_side_rows(const cmp_side_t *side, ms_attr_rows_t rows[2], cmp_strings_t *keep) {
  MS_FORWARD_IF_ERROR(
      ms_attr_aggregate_state(side->attr, &side->st, NULL, MS_ATTR_BY_CATEGORY, &rows[0]));
  MS_FORWARD_IF_ERROR(
      ms_attr_aggregate_state(side->attr, &side->st, NULL, MS_ATTR_BY_SOURCE, &rows[1]));
  for (size_t i = 0; i < rows[1].nrows; i++)
    if (!(rows[1].rows[i].key = ms__cmp_strdup(keep, rows[1].rows[i].key))) return MS_ENOMEM;
  return MS_OK;
}

/* The change by category and by source, from both sides' rows. */
static int cmp_attribution(ms_compare_t *c, cmp_strings_t *strs, ms_attr_rows_t rows[2][2],
                           size_t nrows) {
  for (int k = 0; k < MS_CAT_COUNT; k++) {
    ms_compare_row_t *row = &c->by_category[k];
    row->key = ms_category_name((ms_category)k);
    row->category = (ms_category)k;
  }
  for (int s = 0; s < 2; s++)
    for (size_t i = 0; i < rows[s][0].nrows; i++) {
      ms_compare_row_t *row = &c->by_category[rows[s][0].rows[i].category];
      *(s ? &row->after : &row->before) += rows[s][0].rows[i].bytes;
      *(s ? &row->blocks_after : &row->blocks_before) += rows[s][0].rows[i].blocks;
    }
  for (int k = 0; k < MS_CAT_COUNT; k++)
    c->by_category[k].change = (int64_t)(c->by_category[k].after - c->by_category[k].before);
  return cmp_merge_sources(c, strs, &rows[0][1], &rows[1][1], nrows);
}

/* ---- the settings ---------------------------------------------------------------------------- */

/* A setting's value as text ("True", "512", "0.8", "{1: 4, 2: 8}"). */
static void cmp_value_text(const ms_snapshot_t *s, const ms_snap_kv_t *kv, char *buf, size_t cap,
                           int depth) {
  size_t n = 0;
  switch (kv->kind) {
  case MS_SNAP_VAL_NONE: snprintf(buf, cap, "None"); return;
  case MS_SNAP_VAL_BOOL: snprintf(buf, cap, "%s", kv->b ? "True" : "False"); return;
  case MS_SNAP_VAL_INT: snprintf(buf, cap, "%" PRId64, kv->i); return;
  case MS_SNAP_VAL_FLOAT: snprintf(buf, cap, "%g", kv->f); return;
  case MS_SNAP_VAL_STR: snprintf(buf, cap, "%s", kv->s ? kv->s : ""); return;
  case MS_SNAP_VAL_MAP: break;
  }
  n += (size_t)snprintf(buf, cap, "{");
  for (uint32_t i = 0; i < kv->count && kv->first + i < s->nsettings && n < cap; i++) {
    char v[128];
    const ms_snap_kv_t *e = &s->settings[kv->first + i];
    if (depth < 4) cmp_value_text(s, e, v, sizeof v, depth + 1);
    else snprintf(v, sizeof v, "...");
    n += (size_t)snprintf(buf + n, cap - n, "%s%s: %s", i ? ", " : "", e->key ? e->key : "", v);
  }
  if (n < cap) snprintf(buf + n, cap - n, "}");
}

static const ms_snap_kv_t *cmp_setting(const ms_snapshot_t *s, const char *key) {
  for (size_t i = 0; i < s->nsettings_top && i < s->nsettings; i++)
    if (s->settings[i].key && strcmp(s->settings[i].key, key) == 0) return &s->settings[i];
  return NULL;
}

static int cmp_settings(ms_compare_t *c, cmp_strings_t *strs, const ms_snapshot_t *b,
                        const ms_snapshot_t *a) {
  size_t nb = b->nsettings_top < b->nsettings ? b->nsettings_top : b->nsettings;
  size_t na = a->nsettings_top < a->nsettings ? a->nsettings_top : a->nsettings;
  c->settings = calloc(nb + na + 1, sizeof *c->settings);
  if (!c->settings) return MS_ENOMEM;
  for (size_t i = 0; i < nb + na; i++) {
    const ms_snapshot_t *s = i < nb ? b : a;
    const ms_snap_kv_t *kv = &s->settings[i < nb ? i : i - nb];
    if (!kv->key || (i >= nb && cmp_setting(b, kv->key))) continue; /* seen from BEFORE */
    const ms_snap_kv_t *kb = i < nb ? kv : NULL, *ka = cmp_setting(a, kv->key);
    char vb[512] = "", va[512] = "";
    if (kb) cmp_value_text(b, kb, vb, sizeof vb, 0);
    if (ka) cmp_value_text(a, ka, va, sizeof va, 0);
    if (kb && ka && strcmp(vb, va) == 0) {
      c->nsettings_same++;
      continue;
    }
    ms_compare_setting_t *d = &c->settings[c->nsettings++];
    d->key = ms__cmp_strdup(strs, kv->key);
    d->before = ms__cmp_strdup(strs, vb);
    d->after = ms__cmp_strdup(strs, va);
    if (!d->key || !d->before || !d->after) return MS_ENOMEM;
  }
  return MS_OK;
}

/* ---- the whole comparison -------------------------------------------------------------------- */

/* Leak suspects of AFTER: alive at its moment when one was given, else at the end of its trace
 * (its default moment, the peak, is for the totals and the attribution). */
static int cmp_leaks_at(ms_compare_t *c, cmp_strings_t *strs, const cmp_side_t *after,
                        const ms_compare_options_t *o) {
  if (o->has_moment[1] || after->fig.step == after->fig.nentries)
    return ms__cmp_leaks(c, strs, after, o->leak_tolerance);
  cmp_side_t end = *after; /* borrows the index and classifier, a state of its own */
  ms_timeline_state_init(&end.st);
  end.fig.step = end.fig.nentries;
  int r = ms_timeline_state_at(end.tl, end.fig.device, end.fig.step, &end.st);
  if (r == MS_OK) r = ms__cmp_leaks(c, strs, &end, o->leak_tolerance);
  c->leaks_step = end.fig.step;
  ms_timeline_state_release(&end.st);
  return r;
}

/* The sides, one after the other, each reduced to its figures and rows before the next is built
 * (its large arrays freed, their pages reused: MS_REUSE_MEMORY); the same snapshot twice shares
 * one index and classifier. Leak suspects from AFTER while it is open. */
static int cmp_sides(ms_compare_t *c, cmp_strings_t *strs, const ms_snapshot_t *before,
                     const ms_snapshot_t *after, const ms_compare_options_t *o,
                     ms_attr_rows_t rows[2][2], cmp_strings_t *keep, ms_errbuf_t *eb) {
  static const char *const names[2] = {"BEFORE", "AFTER"};
  cmp_side_t side[2];
  memset(side, 0, sizeof side);
  bool same = before == after;
  int r = ms__cmp_side_open(before, o->device, o->has_moment[0] ? &o->moment[0] : NULL, names[0],
                            NULL, &side[0], eb);
  if (r == MS_OK) r = cmp_side_rows(&side[0], rows[0], keep);
  c->side[0] = side[0].fig;
  if (!same) ms__cmp_side_close(&side[0]);
  if (r == MS_OK)
    r = ms__cmp_side_open(after, o->device, o->has_moment[1] ? &o->moment[1] : NULL, names[1],
                          same ? &side[0] : NULL, &side[1], eb);
  if (r == MS_OK) r = cmp_side_rows(&side[1], rows[1], keep);
  c->side[1] = side[1].fig;
  if (r == MS_OK && o->leaks && side[1].fig.has_trace) r = cmp_leaks_at(c, strs, &side[1], o);
  ms__cmp_side_close(&side[1]);
  ms__cmp_side_close(&side[0]);
  return r;
}

int ms_compare_run(const ms_snapshot_t *before, const ms_snapshot_t *after,
                   const ms_compare_options_t *opt, ms_compare_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!before || !after || !out, MS_EINVAL);
  ms_compare_options_t o;
  if (opt) o = *opt;
  else ms_compare_options_init(&o);
  ms_compare_t *c = calloc(1, sizeof *c);
  cmp_strings_t *strs = calloc(1, sizeof *strs);
  if (!c || !strs) {
    free(c);
    free(strs);
    return MS_ENOMEM;
  }
  c->impl_ = strs;
  ms_attr_rows_t rows[2][2];
  memset(rows, 0, sizeof rows);
  cmp_strings_t keep = {{0}};
  int r = cmp_sides(c, strs, before, after, &o, rows, &keep, eb);
  if (r == MS_OK) r = cmp_attribution(c, strs, rows, o.nrows);
  if (r == MS_OK) r = cmp_settings(c, strs, before, after);
  for (int s = 0; s < 2; s++)
    for (int k = 0; k < 2; k++)
      ms_attr_rows_free(&rows[s][k]);
  for (size_t i = 0; i < keep.v.len; i++)
    free(keep.v.ptr[i]);
  MS_VEC_FREE(&keep.v);
  if (r != MS_OK) {
    ms_compare_free(c);
    return r;
  }
  *out = c;
  return MS_OK;
}
