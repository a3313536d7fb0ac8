/* SPDX-License-Identifier: MIT
 * memsnap core: what changed between two snapshots or two moments (memsnap/compare.h, issue #28):
 * the totals of each side, the change by source and by category, the settings that differ, and
 * the leak suspects of the AFTER side. The gate's figures and limits are gate.c's.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
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
    if (!s->given_tl) ms_timeline_destroy(s->tl);
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
                      const char *name, const cmp_side_t *share, const ms_timeline_t *tl,
                      cmp_side_t *s, ms_errbuf_t *eb) {
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
  } else if (tl) { /* the caller's index: only read (the functions below take it non-const) */
    s->tl = (ms_timeline_t *)(uintptr_t)tl;
    s->given_tl = true;
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
  /* the report asks every block's source: found in the walk that classifies the stacks */
  return share ? MS_OK : ms__attr_create_ex(snap, s->tl, NULL, true, &s->attr, eb);
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

/* Side k's top-level settings as key and value text, into b's list k (the texts owned by keep). */
static int cmp_settings_text(cmp_settings_t *list, cmp_strings_t *keep, const ms_snapshot_t *s) {
  size_t n = s->nsettings_top < s->nsettings ? s->nsettings_top : s->nsettings;
  for (size_t i = 0; i < n; i++) {
    const ms_snap_kv_t *kv = &s->settings[i];
    if (!kv->key) continue;
    char v[512] = "";
    cmp_value_text(s, kv, v, sizeof v, 0);
    cmp_setting_text_t t = {ms__cmp_strdup(keep, kv->key), ms__cmp_strdup(keep, v)};
    if (!t.key || !t.text || MS_VEC_PUSH(&list->v, t) != 0) return MS_ENOMEM;
  }
  return MS_OK;
}

static const cmp_setting_text_t *cmp_setting(const cmp_settings_t *list, const char *key) {
  for (size_t i = 0; i < list->v.len; i++)
    if (strcmp(list->v.ptr[i].key, key) == 0) return &list->v.ptr[i];
  return NULL;
}

/* The settings that differ: BEFORE's in its order, then those only AFTER records. */
static int cmp_settings(ms_compare_t *c, cmp_strings_t *strs, const cmp_settings_t *b,
                        const cmp_settings_t *a) {
  size_t nb = b->v.len, na = a->v.len;
  c->settings = calloc(nb + na + 1, sizeof *c->settings);
  if (!c->settings) return MS_ENOMEM;
  for (size_t i = 0; i < nb + na; i++) {
    const cmp_setting_text_t *kv = i < nb ? &b->v.ptr[i] : &a->v.ptr[i - nb];
    if (i >= nb && cmp_setting(b, kv->key)) continue; /* seen from BEFORE */
    const cmp_setting_text_t *kb = i < nb ? kv : NULL, *ka = cmp_setting(a, kv->key);
    const char *vb = kb ? kb->text : "", *va = ka ? ka->text : "";
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

/* A comparison being built (memsnap/compare.h): the sides added so far, each reduced to its
 * figures, rows and settings. Two threads may add the two sides at once (ms_compare_add_side):
 * each opens its side alone, and the reductions, which share the strings, take turns under lock. */
struct ms_compare_build_s {
  ms_compare_options_t o;
  ms_compare_t *c;           /* the result: each side's figures, AFTER's leak suspects */
  ms_attr_rows_t rows[2][2]; /* per side: by category, by source */
  cmp_settings_t set[2];     /* per side: its top-level settings as text */
  cmp_strings_t keep;        /* the rows' source keys and the settings' texts */
  pthread_mutex_t lock;      /* the fields below, and the reductions */
  unsigned added, busy;      /* bit k: side k added; being added */
};

int ms_compare_begin(const ms_compare_options_t *opt, ms_compare_build_t **out) {
  MS_RETURN_IF(!out, MS_EINVAL);
  ms_compare_build_t *b = calloc(1, sizeof *b);
  ms_compare_t *c = calloc(1, sizeof *c);
  cmp_strings_t *strs = calloc(1, sizeof *strs);
  if (!b || !c || !strs) {
    free(b);
    free(c);
    free(strs);
    return MS_ENOMEM;
  }
  if (opt) b->o = *opt;
  else ms_compare_options_init(&b->o);
  if (pthread_mutex_init(&b->lock, NULL) != 0) {
    free(b);
    free(c);
    free(strs);
    return MS_ENOMEM;
  }
  c->impl_ = strs;
  b->c = c;
  *out = b;
  return MS_OK;
}

void ms_compare_build_free(ms_compare_build_t *b) {
  if (!b) return;
  for (int s = 0; s < 2; s++) {
    for (int k = 0; k < 2; k++)
      ms_attr_rows_free(&b->rows[s][k]);
    MS_VEC_FREE(&b->set[s].v);
  }
  for (size_t i = 0; i < b->keep.v.len; i++)
    free(b->keep.v.ptr[i]);
  MS_VEC_FREE(&b->keep.v);
  ms_compare_free(b->c);
  pthread_mutex_destroy(&b->lock);
  free(b);
}

/* Reduces the open side k to what the result needs: its figures, rows and settings, and for AFTER
 * the leak suspects. */
static int cmp_reduce(ms_compare_build_t *b, int k, const cmp_side_t *side) {
  int r = cmp_side_rows(side, b->rows[k], &b->keep);
  b->c->side[k] = side->fig;
  if (r == MS_OK) r = cmp_settings_text(&b->set[k], &b->keep, side->snap);
  if (r == MS_OK && k == 1 && b->o.leaks && side->fig.has_trace)
    r = cmp_leaks_at(b->c, b->c->impl_, side, &b->o);
  return r;
}

static const char *const cmp_names[2] = {"BEFORE", "AFTER"};

static const ms_tl_moment_t *cmp_moment(const ms_compare_build_t *b, int k) {
  return b->o.has_moment[k] ? &b->o.moment[k] : NULL;
}

int ms_compare_add_side(ms_compare_build_t *b, int k, const ms_snapshot_t *snap,
                        const ms_timeline_t *tl, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!b || !snap || (k != 0 && k != 1), MS_EINVAL);
  if (tl && ms_timeline_snapshot(tl) != snap) /* refused before anything changes */
    return ms__errbuf_set(eb, MS_EINVAL, "%s: the time index is another snapshot's", cmp_names[k]);
  pthread_mutex_lock(&b->lock);
  unsigned bit = 1u << k;
  bool free_side = !((b->added | b->busy) & bit);
  if (free_side) b->busy |= bit;
  pthread_mutex_unlock(&b->lock);
  MS_RETURN_IF(!free_side, MS_EINVAL);
  cmp_side_t side;
  memset(&side, 0, sizeof side);
  int r = ms__cmp_side_open(snap, b->o.device, cmp_moment(b, k), cmp_names[k], NULL, tl, &side,
                            eb);
  pthread_mutex_lock(&b->lock);
  if (r == MS_OK) r = cmp_reduce(b, k, &side);
  b->busy &= ~bit;
  if (r == MS_OK) b->added |= bit;
  pthread_mutex_unlock(&b->lock);
  ms__cmp_side_close(&side);
  return r;
}

int ms_compare_add_indexed(ms_compare_build_t *b, const ms_snapshot_t *snap,
                           const ms_timeline_t *tl, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!b || !snap, MS_EINVAL);
  pthread_mutex_lock(&b->lock);
  int k = (b->added | b->busy) & 1u ? 1 : 0;
  pthread_mutex_unlock(&b->lock);
  return ms_compare_add_side(b, k, snap, tl, eb);
}

int ms_compare_add(ms_compare_build_t *b, const ms_snapshot_t *snap, ms_errbuf_t *eb) {
  return ms_compare_add_indexed(b, snap, NULL, eb);
}

/* Both sides from one snapshot at two moments: one index and classifier serve both. */
static int cmp_add_shared(ms_compare_build_t *b, const ms_snapshot_t *snap, ms_errbuf_t *eb) {
  MS_RETURN_IF(b->added != 0, MS_EINVAL);
  cmp_side_t side[2];
  memset(side, 0, sizeof side);
  int r = ms__cmp_side_open(snap, b->o.device, cmp_moment(b, 0), cmp_names[0], NULL, NULL,
                            &side[0], eb);
  if (r == MS_OK) r = cmp_reduce(b, 0, &side[0]);
  if (r == MS_OK)
    r = ms__cmp_side_open(snap, b->o.device, cmp_moment(b, 1), cmp_names[1], &side[0], NULL,
                          &side[1], eb);
  if (r == MS_OK) r = cmp_reduce(b, 1, &side[1]);
  ms__cmp_side_close(&side[1]);
  ms__cmp_side_close(&side[0]);
  if (r == MS_OK) b->added = 3;
  return r;
}

int ms_compare_finish(ms_compare_build_t *b, ms_compare_t **out) {
  if (!b) return MS_EINVAL;
  int r = out && b->added == 3 ? MS_OK : MS_EINVAL;
  if (r == MS_OK) r = cmp_attribution(b->c, b->c->impl_, b->rows, b->o.nrows);
  if (r == MS_OK) r = cmp_settings(b->c, b->c->impl_, &b->set[0], &b->set[1]);
  if (r == MS_OK) {
    *out = b->c;
    b->c = NULL;
  }
  ms_compare_build_free(b);
  return r;
}

int ms_compare_run(const ms_snapshot_t *before, const ms_snapshot_t *after,
                   const ms_compare_options_t *opt, ms_compare_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!before || !after || !out, MS_EINVAL);
  ms_compare_build_t *b = NULL;
  MS_FORWARD_IF_ERROR(ms_compare_begin(opt, &b));
  int r = MS_OK;
  if (before == after) {
    r = cmp_add_shared(b, before, eb);
  } else {
    r = ms_compare_add(b, before, eb);
    if (r == MS_OK) r = ms_compare_add(b, after, eb);
  }
  if (r != MS_OK) {
    ms_compare_build_free(b);
    return r;
  }
  return ms_compare_finish(b, out);
}
