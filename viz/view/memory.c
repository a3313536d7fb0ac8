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

/* The bytes mapped in expandable segments at every step (nsteps values): the snapshot's
 * expandable segments at the end, each `segment_map` undone backwards (and `segment_unmap`
 * redone). NULL on allocation failure. */
static int64_t *memory_mapped(const ms_timeline_t *tl, size_t dev, size_t nsteps) {
  int64_t *m = malloc(nsteps * sizeof *m);
  if (!m) return NULL;
  const ms_snapshot_t *s = ms_timeline_snapshot(tl);
  int64_t end = 0;
  for (size_t i = 0; i < s->nsegments; i++)
    if (s->segments[i].device >= 0 && (uint64_t)s->segments[i].device == dev &&
        s->segments[i].is_expandable)
      end += (int64_t)s->segments[i].total_size;
  m[nsteps - 1] = end;
  for (size_t i = nsteps - 1; i-- > 0;) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    int64_t d = e->action == MS_TRACE_SEGMENT_MAP ? (int64_t)e->size
              : e->action == MS_TRACE_SEGMENT_UNMAP ? -(int64_t)e->size : 0;
    m[i] = m[i + 1] - d;
  }
  for (size_t i = 0; i < nsteps; i++)
    if (m[i] < 0) m[i] = 0; /* a trace that maps more than the end state holds */
  return m;
}

typedef struct mem_pools_s {
  int64_t (*id)[2];
  uint64_t *largest; /* npools rows of nsamples */
  size_t n, cap, nsamples;
} mem_pools_t;

/* The row of pool (a, b), added (zeroed) at its first sight; NULL on allocation failure. */
static uint64_t *pool_row(mem_pools_t *p, const int64_t id[2]) {
  for (size_t i = 0; i < p->n; i++)
    if (p->id[i][0] == id[0] && p->id[i][1] == id[1]) return p->largest + i * p->nsamples;
  if (p->n == p->cap) {
    size_t cap = p->cap ? 2 * p->cap : 4;
    int64_t(*ids)[2] = realloc(p->id, cap * sizeof *ids);
    if (!ids) return NULL;
    p->id = ids;
    uint64_t *rows = realloc(p->largest, cap * p->nsamples * sizeof *rows);
    if (!rows) return NULL;
    p->largest = rows;
    p->cap = cap;
  }
  p->id[p->n][0] = id[0];
  p->id[p->n][1] = id[1];
  uint64_t *row = p->largest + p->n * p->nsamples;
  memset(row, 0, p->nsamples * sizeof *row);
  p->n++;
  return row;
}

/* Sample k's largest free range of each pool in state st (segments and blocks sorted by
 * address). @return MS_OK or MS_ENOMEM. */
static int largest_free(const ms_tl_state_t *st, mem_pools_t *p, size_t k) {
  size_t b = 0;
  for (size_t i = 0; i < st->nsegments; i++) {
    const ms_tl_segment_t *g = &st->segments[i];
    uint64_t *row = pool_row(p, g->pool_id);
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

/* The buckets' maxima (allocated, reserved, mapped, frag: 4 rows of nb) of the steps. */
static void bucket_max(const uint64_t *alloc, const uint64_t *res, const int64_t *mapped,
                       size_t nsteps, size_t nb, uint64_t *first, uint64_t *out) {
  for (size_t i = 0; i < nb; i++) {
    size_t a = i * nsteps / nb, z = (i + 1) * nsteps / nb;
    uint64_t ma = 0, mr = 0, mm = 0, mf = 0;
    for (size_t s = a; s < z; s++) {
      if (alloc[s] > ma) ma = alloc[s];
      if (res[s] > mr) mr = res[s];
      if ((uint64_t)mapped[s] > mm) mm = (uint64_t)mapped[s];
      uint64_t f = res[s] > alloc[s] ? res[s] - alloc[s] : 0;
      if (f > mf) mf = f;
    }
    first[i] = a;
    out[i] = ma;
    out[nb + i] = mr;
    out[2 * nb + i] = mm;
    out[3 * nb + i] = mf;
  }
}

void ms__view_memory_json(vw_t *w, const ms_timeline_t *tl, size_t dev) {
  const uint64_t *alloc = tl ? ms_timeline_series(tl, dev, MS_TL_ALLOCATED) : NULL;
  const uint64_t *res = tl ? ms_timeline_series(tl, dev, MS_TL_RESERVED) : NULL;
  if (!alloc || !res) {
    vw_puts(w, "null");
    return;
  }
  size_t nsteps = ms_timeline_nentries(tl, dev) + 1;
  size_t nb = nsteps < MS_VIEW_MEMORY_BUCKETS ? nsteps : MS_VIEW_MEMORY_BUCKETS;
  size_t ns = nsteps < MS_VIEW_MEMORY_FREE_SAMPLES ? nsteps : MS_VIEW_MEMORY_FREE_SAMPLES;
  int64_t *mapped = memory_mapped(tl, dev, nsteps);
  uint64_t *first = malloc(nb * sizeof *first), *rows = malloc(4 * nb * sizeof *rows);
  uint64_t *fstep = malloc(ns * sizeof *fstep);
  mem_pools_t p = {NULL, NULL, 0, 0, ns};
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = mapped && first && rows && fstep ? MS_OK : MS_ENOMEM;
  for (size_t k = 0; rc == MS_OK && k < ns; k++) {
    fstep[k] = ns > 1 ? k * (nsteps - 1) / (ns - 1) : 0;
    rc = ms_timeline_state_at(tl, dev, fstep[k], &st);
    if (rc == MS_OK) rc = largest_free(&st, &p, k);
  }
  ms_timeline_state_release(&st);
  if (rc != MS_OK) {
    vw_puts(w, "null");
  } else {
    bucket_max(alloc, res, mapped, nsteps, nb, first, rows);
    vw_puts(w, "{\"steps\":");
    vw_u64(w, nsteps);
    put_u64s(w, "step", first, nb);
    put_u64s(w, "allocated", rows, nb);
    put_u64s(w, "reserved", rows + nb, nb);
    put_u64s(w, "mapped", rows + 2 * nb, nb);
    put_u64s(w, "frag", rows + 3 * nb, nb);
    put_u64s(w, "free_step", fstep, ns);
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
  free(p.largest);
  free(mapped);
  free(first);
  free(rows);
  free(fstep);
}
