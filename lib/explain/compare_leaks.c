/* SPDX-License-Identifier: MIT
 * memsnap core: leak suspects (memsnap/compare.h, docs/compare.md). The steps are the
 * `ProfilerStep#N` annotation ranges that ended by the moment; a live allocated block belongs to
 * the step whose entries hold its alloc entry; its source (memsnap/attribution.h) names it. A
 * source is a suspect when its blocks of every step from its first such step to the last step
 * (at least two) are still alive, each step's bytes within the tolerance of their median: memory
 * that grows by about the same amount every step. Memory that lives on from one step only (the
 * optimizer's state made at step 1, the last step's gradients) is not.
 */
#include <stdlib.h>
#include <string.h>

#include "explain/compare_internal.h"
#include "timeline/internal.h"

typedef struct lk_step_s {
  int64_t number;
  size_t from, to; /* entries from .. to - 1 */
} lk_step_t;

typedef MS_VEC(lk_step_t) lk_steps_t;

typedef struct lk_rec_s {
  uint32_t stack;
  uint32_t step; /* index into the steps */
  uint64_t size;
  const char *source; /* filled after the sort by stack */
  ms_category category;
} lk_rec_t;

static int lk_step_cmp(const void *a, const void *b) {
  const lk_step_t *x = a, *y = b;
  if (x->from != y->from) return x->from < y->from ? -1 : 1;
  return x->number < y->number ? -1 : x->number > y->number;
}

static int lk_rec_stack_cmp(const void *a, const void *b) {
  const lk_rec_t *x = a, *y = b;
  return x->stack < y->stack ? -1 : x->stack > y->stack;
}

static int lk_rec_source_cmp(const void *a, const void *b) {
  const lk_rec_t *x = a, *y = b;
  int c = strcmp(x->source, y->source);
  if (c) return c;
  return x->step < y->step ? -1 : x->step > y->step;
}

static int lk_u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

static int lk_leak_cmp(const void *a, const void *b) {
  const ms_compare_leak_t *x = a, *y = b;
  if (x->total != y->total) return x->total > y->total ? -1 : 1;
  return strcmp(x->source, y->source);
}

/* The ended steps of device dev whose entries all lie before the moment, sorted by entry. */
static int lk_steps(const cmp_side_t *s, lk_steps_t *out) {
  const ms_tl_ranges_t *rg = ms__tl_ranges(s->tl); /* the index's, which the classifier read */
  if (!rg) return MS_ENOMEM;
  int r = MS_OK;
  for (size_t i = 0; i < rg->n && r == MS_OK; i++) {
    const ms_tl_range_t *x = &rg->ranges[i];
    if (x->step < 0 || !x->has_end) continue;
    if (x->device >= 0 && (size_t)x->device != s->fig.device) continue;
    if (ms_tl_ranges_step(rg, (int64_t)s->fig.device, x->step) != x) continue; /* a repeat */
    size_t from = 0, to = 0;
    ms_errbuf_t eb;
    if (ms_timeline_step_range(s->tl, s->fig.device, x->step, &from, &to, &eb) != MS_OK) continue;
    if (to > s->fig.step || to <= from) continue; /* not over by the moment, or empty */
    if (MS_VEC_PUSH(out, ((lk_step_t){x->step, from, to})) != 0) r = MS_ENOMEM;
  }
  if (r == MS_OK && out->len) qsort(out->ptr, out->len, sizeof *out->ptr, lk_step_cmp);
  return r;
}

/* The step holding entry e, or SIZE_MAX. */
static size_t lk_step_of(const lk_step_t *st, size_t n, size_t e) {
  size_t lo = 0, hi = n;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (st[mid].from <= e) lo = mid + 1;
    else hi = mid;
  }
  return lo && e < st[lo - 1].to ? lo - 1 : SIZE_MAX;
}

/* Judges one source's records [i, j) (sorted by step); appends a suspect to c->leaks. */
static int lk_judge(ms_compare_t *c, cmp_strings_t *strs, const lk_rec_t *rec, size_t i, size_t j,
                    size_t nsteps, const lk_step_t *steps, double tol, uint64_t *bytes,
                    uint64_t *blocks, uint64_t *sorted) {
  memset(bytes, 0, nsteps * sizeof *bytes);
  memset(blocks, 0, nsteps * sizeof *blocks);
  for (size_t k = i; k < j; k++) {
    bytes[rec[k].step] += rec[k].size;
    blocks[rec[k].step]++;
  }
  size_t first = rec[i].step, n = nsteps - first;
  if (n < 2) return MS_OK;
  for (size_t k = first; k < nsteps; k++)
    if (!bytes[k]) return MS_OK;
  memcpy(sorted, bytes + first, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, lk_u64_cmp);
  uint64_t med = sorted[n / 2], total = 0;
  for (size_t k = first; k < nsteps; k++) {
    double d = (double)bytes[k] - (double)med;
    if ((d < 0 ? -d : d) > tol * (double)med) return MS_OK;
    total += bytes[k];
  }
  memcpy(sorted, blocks + first, n * sizeof *sorted);
  qsort(sorted, n, sizeof *sorted, lk_u64_cmp);
  ms_compare_leak_t l = {ms__cmp_strdup(strs, rec[i].source), rec[i].category, med, sorted[n / 2],
                         steps[first].number, steps[nsteps - 1].number, n, total};
  if (!l.source) return MS_ENOMEM;
  ms_compare_leak_t *grown = realloc(c->leaks, (c->nleaks + 1) * sizeof *grown);
  if (!grown) return MS_ENOMEM;
  c->leaks = grown;
  c->leaks[c->nleaks++] = l;
  return MS_OK;
}

/* Sources of the records (sorted by stack), one text per stack. */
static int lk_sources(const cmp_side_t *s, lk_rec_t *rec, size_t n, cmp_strings_t *tmp) {
  const char *src = NULL;
  for (size_t i = 0; i < n; i++) {
    if (!i || rec[i].stack != rec[i - 1].stack) {
      char buf[1024];
      ms_attr_source(s->attr, rec[i].stack, buf, sizeof buf);
      if (!(src = ms__cmp_strdup(tmp, buf))) return MS_ENOMEM;
    }
    rec[i].source = src;
  }
  return MS_OK;
}

int ms__cmp_leaks(ms_compare_t *c, cmp_strings_t *strs, const cmp_side_t *s, double tol) {
  lk_steps_t steps = {0};
  MS_VEC(lk_rec_t) rec = {0};
  cmp_strings_t tmp = {{0}};
  uint64_t *work = NULL;
  int r = lk_steps(s, &steps);
  c->steps = steps.len;
  c->leaks_step = s->fig.step;
  for (size_t i = 0; r == MS_OK && steps.len >= 2 && i < s->st.nblocks; i++) {
    const ms_tl_block_t *b = &s->st.blocks[i];
    if (b->state != MS_BLOCK_ACTIVE_ALLOCATED || b->alloc_entry < 0) continue;
    size_t k = lk_step_of(steps.ptr, steps.len, (size_t)b->alloc_entry);
    if (k == SIZE_MAX) continue;
    lk_rec_t x = {b->stack, (uint32_t)k, b->size, NULL,
                  ms_attr_block_category(s->attr, s->fig.device, b)};
    if (MS_VEC_PUSH(&rec, x) != 0) r = MS_ENOMEM;
  }
  if (r == MS_OK && rec.len) {
    qsort(rec.ptr, rec.len, sizeof *rec.ptr, lk_rec_stack_cmp);
    r = lk_sources(s, rec.ptr, rec.len, &tmp);
  }
  if (r == MS_OK && rec.len) {
    qsort(rec.ptr, rec.len, sizeof *rec.ptr, lk_rec_source_cmp);
    work = malloc(3 * steps.len * sizeof *work);
    if (!work) r = MS_ENOMEM;
  }
  for (size_t i = 0, j; r == MS_OK && i < rec.len; i = j) {
    for (j = i + 1; j < rec.len && strcmp(rec.ptr[j].source, rec.ptr[i].source) == 0; j++) {}
    r = lk_judge(c, strs, rec.ptr, i, j, steps.len, steps.ptr, tol, work, work + steps.len,
                 work + 2 * steps.len);
  }
  if (r == MS_OK && c->nleaks) qsort(c->leaks, c->nleaks, sizeof *c->leaks, lk_leak_cmp);
  free(work);
  for (size_t i = 0; i < tmp.v.len; i++)
    free(tmp.v.ptr[i]);
  MS_VEC_FREE(&tmp.v);
  MS_VEC_FREE(&steps);
  MS_VEC_FREE(&rec);
  return r;
}
