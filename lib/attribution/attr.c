/* SPDX-License-Identifier: MIT
 * memsnap core: building and freeing the classifier (memsnap/attribution.h), and the category
 * series (bytes per category at every step of a device: one forward walk of its trace).
 */
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "common/hash.h"
#include "timeline/internal.h"

void ms_attr_config_init(ms_attr_config_t *cfg) { memset(cfg, 0, sizeof *cfg); }

void ms_attr_destroy(ms_attr_t *a) {
  if (!a) return;
  ms__attr_rules_free(&a->rules);
  free(a->fflags);
  free(a->fpat);
  ms__big_free(a->sset);
  free(a->set_pat);
  free(a->set_rules);
  free(a->set_phase);
  ms__big_free(a->ssrc);
  ms__big_free(a->sop);
  free(a->smulti);
  ms__big_free(a->eset);
  ms__big_free(a->eset8);
  free(a->eset_map);
  free(a->dfirst);
  free(a->dmulti);
  pthread_mutex_destroy(&a->src_mu);
  pthread_mutex_destroy(&a->ecat_mu);
  for (size_t d = 0; d < a->ndev; d++) {
    free(a->dev[d].spans);
    free(a->dev[d].grad_addr);
    free(a->dev[d].end_addr);
    free(a->dev[d].end_size);
    ms__big_free(a->dev[d].ecat);
  }
  free(a->dev);
  free(a);
}

int ms_attr_create(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                   const ms_attr_config_t *cfg, ms_attr_t **out, ms_errbuf_t *eb) {
  return ms__attr_create_ex(snap, tl, cfg, false, out, eb);
}

int ms__attr_create_ex(const ms_snapshot_t *snap, const ms_timeline_t *tl,
                       const ms_attr_config_t *cfg, bool sources, ms_attr_t **out,
                       ms_errbuf_t *eb) {
  if (!snap || !tl || !out || ms_timeline_snapshot(tl) != snap) {
    return ms__errbuf_set(eb, MS_EINVAL, "the classifier needs a snapshot and its time index");
  }
  ms_attr_config_t def;
  if (!cfg) {
    ms_attr_config_init(&def);
    cfg = &def;
  }
  ms_attr_t *a = calloc(1, sizeof *a);
  if (!a) return MS_ENOMEM;
  a->snap = snap;
  a->tl = tl;
  pthread_mutex_init(&a->src_mu, NULL);
  pthread_mutex_init(&a->ecat_mu, NULL);
  atomic_init(&a->ndirect, 0);
  int rc = ms__attr_rules_load(&a->rules, cfg, eb);
  if (rc == MS_OK) a->seed = ms__attr_seed_match(snap, cfg);
  if (rc == MS_OK) rc = ms__attr_frames(a);
  if (rc == MS_OK) rc = ms__attr_stacks(a, sources, eb);
  if (rc == MS_OK) rc = ms__attr_spans(a);
  if (rc == MS_OK) rc = ms__attr_gradient_sizes(a);
  if (rc != MS_OK) {
    if (rc == MS_ENOMEM) ms__errbuf_set(eb, rc, "out of memory");
    ms_attr_destroy(a);
    return rc;
  }
  *out = a;
  return MS_OK;
}

int ms__attr_rules_load(attr_rules_t *r, const ms_attr_config_t *cfg, ms_errbuf_t *eb) {
  int rc = MS_OK;
  if (cfg->rules) rc = ms__attr_rules_parse(r, cfg->rules, cfg->rules_len, cfg->rules_name, eb);
  if (rc == MS_OK && (!cfg->rules || (!cfg->replace && !r->no_defaults))) {
    const char *d = ms_attr_default_rules();
    rc = ms__attr_rules_parse(r, d, strlen(d), "default rules", eb);
  }
  return rc;
}

/* ---- the category series ------------------------------------------------------------------- */

/* Live blocks by address: open addressing, key address + 1 (0 = empty), tombstones. */
typedef struct attr_live_s {
  uint64_t key;
  uint64_t size;
  uint8_t cat;
  uint8_t allocated;
} attr_live_t;

typedef struct attr_map_s {
  attr_live_t *t;
  size_t cap, used; /* used counts tombstones */
} attr_map_t;

#define ATTR_TOMB UINT64_MAX

static int attr_map_grow(attr_map_t *m) {
  size_t live = 0;
  for (size_t i = 0; i < m->cap; i++) live += m->t[i].key && m->t[i].key != ATTR_TOMB;
  size_t ncap = 1024;
  while (ncap < live * 4) ncap *= 2; /* tombstones go: the table grows only with live blocks */
  attr_live_t *nt = calloc(ncap, sizeof *nt);
  if (!nt) return MS_ENOMEM;
  size_t used = 0;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->t[i].key || m->t[i].key == ATTR_TOMB) continue;
    size_t j = ms_hash_u64(m->t[i].key) & (ncap - 1);
    while (nt[j].key) j = (j + 1) & (ncap - 1);
    nt[j] = m->t[i];
    used++;
  }
  free(m->t);
  m->t = nt;
  m->cap = ncap;
  m->used = used;
  return MS_OK;
}

static attr_live_t *attr_map_find(attr_map_t *m, uint64_t addr) {
  if (!m->cap) return NULL;
  uint64_t k = addr + 1;
  for (size_t j = ms_hash_u64(k) & (m->cap - 1);; j = (j + 1) & (m->cap - 1)) {
    if (!m->t[j].key) return NULL;
    if (m->t[j].key == k) return &m->t[j];
  }
}

static int attr_map_put(attr_map_t *m, uint64_t addr, uint64_t size, uint8_t cat) {
  if ((m->used + 1) * 2 > m->cap) MS_FORWARD_IF_ERROR(attr_map_grow(m));
  uint64_t k = addr + 1;
  size_t j = ms_hash_u64(k) & (m->cap - 1);
  while (m->t[j].key && m->t[j].key != k) j = (j + 1) & (m->cap - 1);
  if (!m->t[j].key) m->used++;
  attr_live_t v = {k, size, cat, 1};
  m->t[j] = v;
  return MS_OK;
}

/* Applies entry i of device dev to the live map and the running totals. */
static int attr_series_step(const ms_attr_t *a, size_t dev, const tl_dev_t *td, size_t i,
                            attr_map_t *m, uint64_t *cur) {
  const ms_snap_trace_t *e = &td->trace[i];
  attr_live_t *v;
  switch (e->action) {
  case MS_TRACE_ALLOC: {
    ms_category c = ms__attr_entry_category(a, dev, i);
    uint64_t size = ms__attr_entry_size(a, dev, i);
    cur[c] += size;
    return attr_map_put(m, e->addr, size, (uint8_t)c);
  }
  case MS_TRACE_FREE_REQUESTED:
    if ((v = attr_map_find(m, e->addr)) && v->allocated) {
      cur[v->cat] -= v->size;
      v->allocated = 0;
    }
    return MS_OK;
  case MS_TRACE_FREE_COMPLETED:
    if ((v = attr_map_find(m, e->addr))) {
      if (v->allocated) cur[v->cat] -= v->size;
      v->key = ATTR_TOMB;
    }
    return MS_OK;
  default:
    return MS_OK;
  }
}

/* Calls step(arg, s, bytes per category) for every step s = 0 .. n of device dev, in order. */
typedef void attr_step_fn(void *arg, size_t s, const uint64_t cur[MS_CAT_COUNT]);

static int attr_walk(const ms_attr_t *a, size_t dev, attr_step_fn *step, void *arg) {
  const tl_dev_t *td = &a->tl->dev[dev];
  (void)ms__attr_ecat_ready(a, dev); /* every entry is asked (else each is found alone) */
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  attr_map_t m = {NULL, 0, 0};
  uint64_t cur[MS_CAT_COUNT] = {0};
  int rc = ms_timeline_state_at(a->tl, dev, 0, &st);
  for (size_t k = 0; k < st.nblocks && rc == MS_OK; k++) {
    const ms_tl_block_t *b = &st.blocks[k];
    ms_category c = ms_attr_block_category(a, dev, b);
    rc = attr_map_put(&m, b->address, b->size, (uint8_t)c);
    if (b->state == MS_BLOCK_ACTIVE_ALLOCATED)
      cur[c] += b->size;
    else if (rc == MS_OK)
      attr_map_find(&m, b->address)->allocated = 0;
  }
  ms_timeline_state_release(&st);
  if (rc == MS_OK) step(arg, 0, cur);
  for (size_t i = 0; i < td->n && rc == MS_OK; i++) {
    rc = attr_series_step(a, dev, td, i, &m, cur);
    if (rc == MS_OK) step(arg, i + 1, cur);
  }
  free(m.t);
  return rc;
}

static void attr_series_fill(void *arg, size_t s, const uint64_t cur[MS_CAT_COUNT]) {
  memcpy(&((uint64_t *)arg)[s * MS_CAT_COUNT], cur, MS_CAT_COUNT * sizeof *cur);
}

int ms_attr_category_series(const ms_attr_t *a, size_t dev, uint64_t **out) {
  if (dev >= a->ndev) return MS_EINVAL;
  size_t n = a->tl->dev[dev].n;
  if (n + 1 > SIZE_MAX / MS_CAT_COUNT / sizeof(uint64_t)) return MS_ENOMEM;
  uint64_t *ser = malloc((n + 1) * MS_CAT_COUNT * sizeof *ser);
  if (!ser) return MS_ENOMEM;
  int rc = attr_walk(a, dev, attr_series_fill, ser);
  if (rc != MS_OK) {
    free(ser);
    return rc;
  }
  *out = ser;
  return MS_OK;
}

typedef struct attr_peaks_arg_s {
  size_t from, to, at;
  ms_attr_peaks_t *p;
} attr_peaks_arg_t;

static void attr_peaks_step(void *arg, size_t s, const uint64_t cur[MS_CAT_COUNT]) {
  attr_peaks_arg_t *x = arg;
  if (s == x->at) memcpy(x->p->at, cur, sizeof x->p->at);
  if (s < x->from || s > x->to) return;
  for (int c = 0; c < MS_CAT_COUNT; c++)
    if (cur[c] > x->p->peak[c]) {
      x->p->peak[c] = cur[c];
      x->p->peak_step[c] = s;
    }
}

int ms_attr_category_peaks(const ms_attr_t *a, size_t dev, size_t from, size_t to, size_t at,
                           ms_attr_peaks_t *out) {
  if (dev >= a->ndev || from > to || at > a->tl->dev[dev].n) return MS_EINVAL;
  ms_attr_peaks_t p;
  memset(&p, 0, sizeof p);
  for (int c = 0; c < MS_CAT_COUNT; c++) p.peak_step[c] = from;
  attr_peaks_arg_t x = {from, to, at, &p};
  int rc = attr_walk(a, dev, attr_peaks_step, &x);
  if (rc == MS_OK) *out = p;
  return rc;
}

/* ---- block lifetimes ----------------------------------------------------------------------- */

int ms__attr_lifetimes(const ms_attr_t *a, size_t dev, attr_life_t **out, size_t *nout) {
  if (dev >= a->ndev) return MS_EINVAL;
  const tl_dev_t *td = &a->tl->dev[dev];
  (void)ms__attr_ecat_ready(a, dev); /* every entry is asked (else each is found alone) */
  MS_VEC(attr_life_t) v = {0};
  attr_map_t m = {NULL, 0, 0}; /* address -> index of its open lifetime (in .size) */
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(a->tl, dev, 0, &st);
  for (size_t k = 0; k < st.nblocks && rc == MS_OK; k++) {
    const ms_tl_block_t *b = &st.blocks[k];
    attr_life_t l = {-1, b->state == MS_BLOCK_ACTIVE_ALLOCATED ? -2 : -1, -1, -1,
                     b->address, b->size, b->requested_size, b->stream,
                     ms__attr_block_stack(a, dev, b), (uint8_t)ms_attr_block_category(a, dev, b),
                     -1};
    if (MS_VEC_PUSH(&v, l)) rc = MS_ENOMEM;
    if (rc == MS_OK) rc = attr_map_put(&m, b->address, v.len - 1, 0);
  }
  ms_timeline_state_release(&st);
  for (size_t i = 0; i < td->n && rc == MS_OK; i++) {
    const ms_snap_trace_t *e = &td->trace[i];
    attr_live_t *o;
    if (e->action == MS_TRACE_ALLOC) {
      attr_life_t l = {(int64_t)i, -2,
                       -1,         (e->present & MS_TRACE_HAS_TIME) ? e->time_us : -1,
                       e->addr,    ms__attr_entry_size(a, dev, i),
                       e->size,    ms_snap_trace_stream(e),
                       e->stack,   (uint8_t)ms__attr_entry_category(a, dev, i),
                       -1};
      if (MS_VEC_PUSH(&v, l)) rc = MS_ENOMEM;
      if (rc == MS_OK) rc = attr_map_put(&m, e->addr, v.len - 1, 0);
    } else if ((e->action == MS_TRACE_FREE_REQUESTED || e->action == MS_TRACE_FREE_COMPLETED) &&
               (o = attr_map_find(&m, e->addr))) {
      attr_life_t *l = &v.ptr[o->size];
      if (e->action == MS_TRACE_FREE_REQUESTED) {
        if (l->freq_entry == -2) l->freq_entry = (int64_t)i;
      } else {
        l->free_entry = (int64_t)i;
        l->free_time_us = (e->present & MS_TRACE_HAS_TIME) ? e->time_us : -1;
        o->key = ATTR_TOMB;
      }
    }
  }
  free(m.t);
  if (rc != MS_OK) {
    MS_VEC_FREE(&v);
    return rc;
  }
  *out = v.ptr;
  *nout = v.len;
  return MS_OK;
}
