/* SPDX-License-Identifier: MIT
 * memsnap viewer: the data of the "Memory over time" view (docs/view.md, "Memory over time"):
 * reserved and allocated bytes over the trace on one chart, the part of reserved memory that is
 * expandable segments' mapped ranges (`segment_map` / `segment_unmap`), the fragmentation
 * (reserved minus allocated) and the largest free block of each pool, all from the time index
 * (memsnap/timeline.h). viz/view/memory.js draws it.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/snapshot.h"
#include "memory.h"

typedef struct mem_pools_s {
  int64_t (*id)[2];
  uint64_t *largest; /* npools rows of nsamples */
  size_t (*first)[2]; /* per pool: the first sample that has it, and its first segment there */
  size_t n, cap, nsamples;
} mem_pools_t;

/* The row of pool (a, b), added (zeroed) at its first sight, seen in sample k at segment g (the
 * samples come newest first: the earliest sight is kept); NULL on allocation failure. */
static uint64_t *pool_row(mem_pools_t *p, const int64_t id[2], size_t k, size_t g) {
  size_t i = 0;
  while (i < p->n && (p->id[i][0] != id[0] || p->id[i][1] != id[1]))
    i++;
  if (i == p->n) {
    if (p->n == p->cap) {
      size_t cap = p->cap ? 2 * p->cap : 4;
      int64_t(*ids)[2] = realloc(p->id, cap * sizeof *ids);
      if (!ids) return NULL;
      p->id = ids;
      size_t(*first)[2] = realloc(p->first, cap * sizeof *first);
      if (!first) return NULL;
      p->first = first;
      uint64_t *rows = realloc(p->largest, cap * p->nsamples * sizeof *rows);
      if (!rows) return NULL;
      p->largest = rows;
      p->cap = cap;
    }
    p->id[i][0] = id[0];
    p->id[i][1] = id[1];
    p->first[i][0] = SIZE_MAX;
    memset(p->largest + i * p->nsamples, 0, p->nsamples * sizeof *p->largest);
    p->n++;
  }
  if (k < p->first[i][0] || (k == p->first[i][0] && g < p->first[i][1])) {
    p->first[i][0] = k;
    p->first[i][1] = g;
  }
  return p->largest + i * p->nsamples;
}

/* The pools in the order of their first sight in the samples taken oldest first. */
static void pools_order(mem_pools_t *p) {
  for (size_t i = 1; i < p->n; i++) { /* insertion sort: a few pools */
    for (size_t j = i; j > 0; j--) {
      size_t *a = p->first[j - 1], *b = p->first[j];
      if (a[0] < b[0] || (a[0] == b[0] && a[1] <= b[1])) break;
      size_t f[2] = {a[0], a[1]};
      int64_t id[2] = {p->id[j - 1][0], p->id[j - 1][1]};
      memcpy(a, b, sizeof f);
      memcpy(b, f, sizeof f);
      memcpy(p->id[j - 1], p->id[j], sizeof id);
      memcpy(p->id[j], id, sizeof id);
      uint64_t *r = p->largest + (j - 1) * p->nsamples, *q = r + p->nsamples;
      for (size_t s = 0; s < p->nsamples; s++) {
        uint64_t t = r[s];
        r[s] = q[s];
        q[s] = t;
      }
    }
  }
}

/* Sample k's largest free range of each pool in state st (segments and blocks sorted by
 * address). @return MS_OK or MS_ENOMEM. */
static int largest_free(void *arg, size_t k, const ms_tl_state_t *st) {
  mem_pools_t *p = arg;
  size_t b = 0;
  for (size_t i = 0; i < st->nsegments; i++) {
    const ms_tl_segment_t *g = &st->segments[i];
    uint64_t *row = pool_row(p, g->pool_id, k, i);
    if (!row) return MS_ENOMEM;
    uint64_t at = g->address, end = g->address + g->size, best = 0;
    while (b < st->nblocks && st->blocks[b].address < g->address) b++;
    for (; b < st->nblocks && st->blocks[b].address < end; b++) {
      const ms_tl_block_t *x = &st->blocks[b];
      if (x->address > at && x->address - at > best) best = x->address - at;
      if (x->address + x->size > at) at = x->address + x->size;
    }
    if (end > at && end - at > best) best = end - at;
    if (best > row[k]) row[k] = best;
  }
  return MS_OK;
}

static void put_array(vw_t *w, const uint64_t *v, size_t n) {
  vw_puts(w, "[");
  for (size_t i = 0; i < n; i++) {
    if (i) vw_puts(w, ",");
    vw_u64(w, v[i]);
  }
  vw_puts(w, "]");
}

static void put_u64s(vw_t *w, const char *key, const uint64_t *v, size_t n) {
  vw_puts(w, ",\"");
  vw_puts(w, key);
  vw_puts(w, "\":");
  put_array(w, v, n);
}

/* The buckets' maxima (allocated, reserved, mapped, frag: 4 rows of nb) of the steps, found by
 * one walk of the time index, newest step first (ms_timeline_walk: no series is made). The bytes
 * mapped in expandable segments: the snapshot's expandable segments at the end, each
 * `segment_map` undone backwards (and `segment_unmap` redone), 0 where a trace maps more than the
 * end state holds. */
typedef struct mem_walk_s {
  const ms_timeline_t *tl;
  size_t dev, nb, b; /* b: the bucket of the step visited last */
  const uint64_t *first;
  uint64_t *out;
  int64_t mapped; /* at the step visited last */
} mem_walk_t;

static void mem_visit(void *arg, size_t s, const uint64_t totals[MS_TL_METRIC_COUNT]) {
  mem_walk_t *k = arg;
  if (s < ms_timeline_nentries(k->tl, k->dev)) { /* step s + 1 -> s: undo entry s */
    const ms_snap_trace_t *e = ms_timeline_entry(k->tl, k->dev, s);
    k->mapped -= e->action == MS_TRACE_SEGMENT_MAP     ? (int64_t)e->size
                 : e->action == MS_TRACE_SEGMENT_UNMAP ? -(int64_t)e->size
                                                       : 0;
  }
  while (k->b > 0 && k->first[k->b] > s)
    k->b--;
  uint64_t *o = k->out, al = totals[MS_TL_ALLOCATED], re = totals[MS_TL_RESERVED];
  uint64_t mm = k->mapped < 0 ? 0 : (uint64_t)k->mapped, f = re > al ? re - al : 0;
  size_t nb = k->nb, i = k->b;
  if (al > o[i]) o[i] = al;
  if (re > o[nb + i]) o[nb + i] = re;
  if (mm > o[2 * nb + i]) o[2 * nb + i] = mm;
  if (f > o[3 * nb + i]) o[3 * nb + i] = f;
}

static int bucket_max(const ms_timeline_t *tl, size_t dev, size_t nsteps, size_t nb,
                      uint64_t *first, uint64_t *out) {
  for (size_t i = 0; i < nb; i++)
    first[i] = i * nsteps / nb;
  memset(out, 0, 4 * nb * sizeof *out);
  const ms_snapshot_t *s = ms_timeline_snapshot(tl);
  mem_walk_t k = {tl, dev, nb, nb - 1, first, out, 0};
  for (size_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device >= 0 && (uint64_t)s->segments[i].device == dev &&
        s->segments[i].is_expandable)
      k.mapped += (int64_t)s->segments[i].total_size;
  return ms_timeline_walk(tl, dev, 0, nsteps - 1, mem_visit, &k);
}

void ms__view_memory_json(vw_t *w, const ms_timeline_t *tl, size_t dev) {
  if (!tl || dev >= ms_timeline_ndevices(tl)) {
    vw_puts(w, "null");
    return;
  }
  size_t nsteps = ms_timeline_nentries(tl, dev) + 1;
  size_t nb = nsteps < MS_VIEW_MEMORY_BUCKETS ? nsteps : MS_VIEW_MEMORY_BUCKETS;
  size_t ns = nsteps < MS_VIEW_MEMORY_FREE_SAMPLES ? nsteps : MS_VIEW_MEMORY_FREE_SAMPLES;
  uint64_t *first = malloc(nb * sizeof *first), *rows = malloc(4 * nb * sizeof *rows);
  size_t *fstep = malloc(ns * sizeof *fstep);
  mem_pools_t p = {NULL, NULL, NULL, 0, 0, ns};
  int rc = first && rows && fstep ? MS_OK : MS_ENOMEM;
  for (size_t k = 0; rc == MS_OK && k < ns; k++)
    fstep[k] = ns > 1 ? k * (nsteps - 1) / (ns - 1) : 0;
  /* the samples in one pass, newest first (each one a checkpoint's walk: minutes on a trace of
   * many live blocks) */
  if (rc == MS_OK) rc = ms_timeline_states_at(tl, dev, fstep, ns, largest_free, &p);
  if (rc == MS_OK) pools_order(&p);
  if (rc == MS_OK) rc = bucket_max(tl, dev, nsteps, nb, first, rows);
  if (rc != MS_OK) {
    vw_puts(w, "null");
  } else {
    vw_puts(w, "{\"steps\":");
    vw_u64(w, nsteps);
    put_u64s(w, "step", first, nb);
    put_u64s(w, "allocated", rows, nb);
    put_u64s(w, "reserved", rows + nb, nb);
    put_u64s(w, "mapped", rows + 2 * nb, nb);
    put_u64s(w, "frag", rows + 3 * nb, nb);
    vw_puts(w, ",\"free_step\":[");
    for (size_t i = 0; i < ns; i++) {
      if (i) vw_puts(w, ",");
      vw_u64(w, fstep[i]);
    }
    vw_puts(w, "]");
    vw_puts(w, ",\"free_pools\":[");
    for (size_t i = 0; i < p.n; i++) {
      vw_puts(w, i ? ",[" : "[");
      vw_i64(w, p.id[i][0]);
      vw_puts(w, ",");
      vw_i64(w, p.id[i][1]);
      vw_puts(w, "]");
    }
    vw_puts(w, "],\"largest_free\":[");
    for (size_t i = 0; i < p.n; i++) {
      vw_puts(w, i ? "," : "");
      put_array(w, p.largest + i * ns, ns);
    }
    vw_puts(w, "]}");
  }
  free(p.id);
  free(p.first);
  free(p.largest);
  free(first);
  free(rows);
  free(fstep);
}
