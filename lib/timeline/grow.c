/* SPDX-License-Identifier: MIT
 * memsnap core: the final sizes of the blocks the time index infers (timeline/internal.h,
 * tl_grow_t).
 *
 * A block freed in the trace is put back, by the build pass that goes from the end, at its
 * smallest size: its rounded request. PyTorch gives a large request its whole room when the
 * remainder is too small to split off, so a block's final size depends on the room after it over
 * its whole life, known only when the pass reaches its alloc. The room is kept here while the
 * block lives (in the pass: from its free_completed down to its alloc), in a table of the blocks
 * alive then, not in arrays by entry: on a 5 M-entry trace those (the room, the free_requested
 * and the filter's flag, 13 bytes an entry) were 57 MB of the index's peak, for a few thousand
 * blocks alive at once. Only a request over 1 MiB with room past its rounded size enters the table:
 * no other block can end larger (state.c). When the block's alloc is undone (or the pass ends,
 * for a block born before the trace) its final size is set; a block that grew is noted (24
 * bytes), and after the pass its growth is added, step by step, to the checkpoints' totals and to
 * the bounds of the intervals that tl_whole_peaks walks again.
 */
#include <stdlib.h>
#include <string.h>

#include "timeline/internal.h"

#define TL_GROW_MIN_CAP 64

static size_t tl_grow_hash(uint32_t fc, size_t cap) {
  return (size_t)(((uint64_t)fc * 0x9E3779B97F4A7C15ull) >> 21) & (cap - 1);
}

static int tl_grow_rehash(tl_grow_t *g, size_t cap) {
  tl_room_t *t = calloc(cap, sizeof *t);
  if (!t) return MS_ENOMEM;
  for (size_t i = 0; i < g->cap; i++) {
    if (!g->t[i].fc1) continue;
    size_t h = tl_grow_hash(g->t[i].fc1 - 1, cap);
    while (t[h].fc1)
      h = (h + 1) & (cap - 1);
    t[h] = g->t[i];
  }
  free(g->t);
  g->t = t;
  g->cap = cap;
  return MS_OK;
}

static tl_room_t *tl_grow_find(const tl_grow_t *g, uint32_t fc) {
  if (!g->cap) return NULL;
  size_t h = tl_grow_hash(fc, g->cap);
  while (g->t[h].fc1) {
    if (g->t[h].fc1 == fc + 1) return &g->t[h];
    h = (h + 1) & (g->cap - 1);
  }
  return NULL;
}

int ms__tl_grow_open(tl_grow_t *g, uint32_t fc, uint64_t end, bool counted) {
  if (fc == TL_NONE) return MS_EINVAL;
  if ((g->n + 1) * 2 > g->cap) {
    size_t cap = g->cap ? g->cap * 2 : TL_GROW_MIN_CAP;
    MS_FORWARD_IF_ERROR(tl_grow_rehash(g, cap));
  }
  size_t h = tl_grow_hash(fc, g->cap);
  while (g->t[h].fc1 && g->t[h].fc1 != fc + 1)
    h = (h + 1) & (g->cap - 1);
  if (!g->t[h].fc1) g->n++;
  g->t[h] = (tl_room_t){fc + 1, TL_NONE, end, counted};
  return MS_OK;
}

void ms__tl_grow_limit(tl_grow_t *g, uint32_t fc, uint64_t end) {
  tl_room_t *r = tl_grow_find(g, fc);
  if (r && end < r->end) r->end = end;
}

void ms__tl_grow_freq(tl_grow_t *g, uint32_t fc, uint32_t fr) {
  tl_room_t *r = tl_grow_find(g, fc);
  if (r) r->fr = fr;
}

/* Removes slot h (backward-shift deletion: no tombstones, so a long pass does not fill the
 * table). */
static void tl_grow_remove_at(tl_grow_t *g, size_t h) {
  g->t[h].fc1 = 0;
  g->n--;
  size_t j = h;
  for (;;) {
    j = (j + 1) & (g->cap - 1);
    if (!g->t[j].fc1) return;
    size_t home = tl_grow_hash(g->t[j].fc1 - 1, g->cap);
    bool move = (j > h) ? (home <= h || home > j) : (home <= h && home > j);
    if (move) {
      g->t[h] = g->t[j];
      g->t[j].fc1 = 0;
      h = j;
    }
  }
}

/* The final size of r's block: a large request takes its whole room when the remainder would be
 * too small to split off (PyTorch's block splitting). */
static int tl_grow_final(tl_grow_t *g, tl_dev_t *d, const tl_room_t *r) {
  uint32_t i = r->fc1 - 1;
  const ms_snap_trace_t *e = &d->trace[i];
  const ms_snap_trace_t *src = d->pair[i] != TL_NONE ? &d->trace[d->pair[i]] : e;
  uint64_t space = r->end - e->addr, rs = tl_round(src->size);
  uint64_t size =
      rs >= space || (src->size > TL_SMALL_SIZE && space - rs <= TL_SMALL_SIZE) ? space : rs;
  uint64_t was = tl_bsize(d, i);
  if (size == was) return MS_OK;
  g->grew = true;
  uint64_t delta = size - was;
  MS_FORWARD_IF_ERROR(tl_bsize_set(d, i, size));
  if (d->pair[i] != TL_NONE) MS_FORWARD_IF_ERROR(tl_bsize_set(d, d->pair[i], size));
  if (!r->counted) return MS_OK; /* outside the filter: not in the totals */
  uint32_t a = d->pair[i];
  tl_growth_t gr = {delta, i, r->fr, a != TL_NONE ? a + 1 : 0};
  return MS_VEC_PUSH(&g->grown, gr) ? MS_ENOMEM : MS_OK;
}

int ms__tl_grow_close(tl_grow_t *g, tl_dev_t *d, uint32_t fc) {
  tl_room_t *r = tl_grow_find(g, fc);
  if (!r) return MS_OK;
  tl_room_t copy = *r;
  tl_grow_remove_at(g, (size_t)(r - g->t));
  return tl_grow_final(g, d, &copy);
}

/* The blocks still open when the pass ends (born before the trace), in entry order so that the
 * result does not depend on the table's layout. */
static int tl_room_by_fc(const void *x, const void *y) {
  const tl_room_t *a = x, *b = y;
  return a->fc1 < b->fc1 ? -1 : a->fc1 > b->fc1;
}

int ms__tl_grow_close_all(tl_grow_t *g, tl_dev_t *d) {
  size_t k = 0;
  for (size_t i = 0; i < g->cap; i++)
    if (g->t[i].fc1) g->t[k++] = g->t[i];
  if (k > 1) qsort(g->t, k, sizeof *g->t, tl_room_by_fc);
  int rc = MS_OK;
  for (size_t i = 0; i < k && rc == MS_OK; i++)
    rc = tl_grow_final(g, d, &g->t[i]);
  if (g->cap) memset(g->t, 0, g->cap * sizeof *g->t);
  g->n = 0;
  return rc;
}

void ms__tl_grow_free(tl_grow_t *g) {
  free(g->t);
  MS_VEC_FREE(&g->grown);
  memset(g, 0, sizeof *g);
}

/* ---- the growth over the steps --------------------------------------------------------------- */

static int tl_growth_by_start(const void *x, const void *y) {
  const tl_growth_t *a = x, *b = y;
  return a->start < b->start ? -1 : a->start > b->start;
}

/* A growth that ends at a step: of allocated (its free_requested) or of active (its
 * free_completed). */
typedef struct tl_gend_s {
  size_t step;
  uint64_t delta;
  int metric; /* 0: allocated, 1: active */
} tl_gend_t;

typedef MS_VEC(tl_gend_t) tl_gheap_t;

static int tl_gheap_push(tl_gheap_t *h, tl_gend_t v) {
  if (MS_VEC_PUSH(h, v)) return MS_ENOMEM;
  size_t i = h->len - 1;
  while (i > 0 && h->ptr[(i - 1) / 2].step > h->ptr[i].step) {
    tl_gend_t t = h->ptr[i];
    h->ptr[i] = h->ptr[(i - 1) / 2];
    h->ptr[(i - 1) / 2] = t;
    i = (i - 1) / 2;
  }
  return MS_OK;
}

static tl_gend_t tl_gheap_pop(tl_gheap_t *h) {
  tl_gend_t top = h->ptr[0];
  h->ptr[0] = h->ptr[--h->len];
  size_t i = 0;
  for (;;) {
    size_t l = 2 * i + 1, r = l + 1, m = i;
    if (l < h->len && h->ptr[l].step < h->ptr[m].step) m = l;
    if (r < h->len && h->ptr[r].step < h->ptr[m].step) m = r;
    if (m == i) break;
    tl_gend_t t = h->ptr[i];
    h->ptr[i] = h->ptr[m];
    h->ptr[m] = t;
    i = m;
  }
  return top;
}

static void tl_grow_note(uint64_t m[2], const uint64_t g[2]) {
  if (g[0] > m[0]) m[0] = g[0];
  if (g[1] > m[1]) m[1] = g[1];
}

/* The growth of the allocated and active totals is a sum over the grown blocks, each adding its
 * growth from the step after its alloc to its free_requested (allocated) and its free_completed
 * (active). It changes only at those steps: the walk visits them, the checkpoints' steps and the
 * intervals' first steps, in increasing order, with the growths under way in a heap by end. */
int ms__tl_grow_apply(tl_grow_t *g, tl_dev_t *d, tl_ivals_t *iv) {
  tl_growth_t *x = g->grown.ptr;
  size_t nx = g->grown.len;
  /* noted as the pass met the allocs, newest first, then the blocks born before the trace */
  bool sorted = true;
  for (size_t j = 1; j < nx && sorted; j++)
    sorted = x[j - 1].start >= x[j].start;
  if (!sorted) { /* (a trace paired oddly) */
    qsort(x, nx, sizeof *x, tl_growth_by_start);
  } else {
    for (size_t a = 0, b = nx ? nx - 1 : 0; a < b; a++, b--) {
      tl_growth_t t = x[a];
      x[a] = x[b];
      x[b] = t;
    }
  }
  tl_gheap_t heap = {0};
  uint64_t gr[2] = {0, 0};   /* the growth at the step: allocated, active */
  size_t k = d->ckpts.len;   /* newest first: the next checkpoint up is k - 1 */
  size_t v = iv->len, u = v; /* newest first: the interval of st is v - 1; next first step u - 1 */
  size_t j = 0;              /* the next growth to start */
  int rc = MS_OK;
  for (;;) {
    size_t st = SIZE_MAX;
    if (j < nx) st = x[j].start;
    if (heap.len && heap.ptr[0].step < st) st = heap.ptr[0].step;
    if (k > 0 && d->ckpts.ptr[k - 1].step < st) st = d->ckpts.ptr[k - 1].step;
    if (u > 0 && iv->ptr[u - 1].lo < st) st = iv->ptr[u - 1].lo;
    if (st == SIZE_MAX) break;
    for (; j < nx && x[j].start == st; j++) {
      gr[1] += x[j].delta;
      if (x[j].fr != TL_NONE) {
        gr[0] += x[j].delta;
        rc = tl_gheap_push(&heap, (tl_gend_t){(size_t)x[j].fr + 1, x[j].delta, 0});
      }
      if (rc == MS_OK) rc = tl_gheap_push(&heap, (tl_gend_t){(size_t)x[j].fc + 1, x[j].delta, 1});
      if (rc != MS_OK) break;
    }
    if (rc != MS_OK) break;
    while (heap.len && heap.ptr[0].step == st) {
      tl_gend_t e = tl_gheap_pop(&heap);
      gr[e.metric] -= e.delta;
    }
    while (u > 0 && iv->ptr[u - 1].lo <= st)
      u--;
    for (size_t q = v; q > 0 && iv->ptr[q - 1].lo <= st; q--) { /* st may end one, start the next */
      if (iv->ptr[q - 1].hi < st) continue;
      tl_grow_note(iv->ptr[q - 1].grow, gr);
    }
    while (v > 0 && iv->ptr[v - 1].hi <= st)
      v--;
    if (k == 0 || d->ckpts.ptr[k - 1].step != st) continue;
    tl_ckpt_t *ckp = &d->ckpts.ptr[--k];
    for (size_t b = 0; b < ckp->nblocks; b++) {
      ms_tl_block_t *bl = &ckp->blocks[b];
      if ((bl->flags & MS_TL_BLOCK_SIZE_INFERRED) && bl->free_entry >= 0)
        bl->size = tl_bsize(d, (size_t)bl->free_entry);
    }
    ckp->totals[MS_TL_ALLOCATED] += gr[0];
    ckp->totals[MS_TL_ACTIVE] += gr[1];
  }
  MS_VEC_FREE(&heap);
  return rc;
}
