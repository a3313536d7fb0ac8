/* SPDX-License-Identifier: MIT
 * memsnap core: the classifier (memsnap/attribution.h, attribution/internal.h): what the rules
 * read of an allocation's stack, each device's phase spans, the gradient sizes that name the
 * parameters allocated before recording, a block's category, and the category series
 * (stacks.c: the per-frame and per-stack features these read).
 *
 * Cost: spans are one pass over each trace. Classifying a block is a binary search over its
 * device's spans and a walk of the category rules (a few dozen).
 */
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "timeline/internal.h"

/* ---- what the rules read of an allocation's stack ---------------------------------------- */

/* An allocation's stack as the category rules read it. */
typedef struct attr_key_s {
  const uint64_t *bits; /* the rules whose frame conditions hold (rw words; NULL: none) */
  uint32_t set;         /* its pattern set's index; a->nsets: none, or a set not in the table */
  uint8_t phase;        /* by the phase rules (ATTR_PH_UNSET: none) */
  bool nostack;         /* no stack recorded, or an empty one */
  uint64_t own[ATTR_MAX_RULES / 64]; /* bits for a set not in the table */
} attr_key_t;

static void attr_key_of_set(const ms_attr_t *a, uint32_t set, bool nostack, attr_key_t *k) {
  k->nostack = nostack;
  if (set < a->nsets) {
    k->set = set;
    k->bits = &a->set_rules[(size_t)set * a->rw];
    k->phase = a->set_phase[set];
  } else {
    k->set = (uint32_t)a->nsets;
    k->bits = NULL;
    k->phase = ATTR_PH_UNSET;
  }
}

/* Stack `stack` (MS_SNAP_NO_STACK, ATTR_STACK_UNRECORDED: none). */
static void attr_stack_key(const ms_attr_t *a, uint32_t stack, attr_key_t *k) {
  const ms_snapshot_t *s = a->snap;
  if (stack >= s->nstacks) {
    attr_key_of_set(a, ATTR_NONE, true, k);
    return;
  }
  bool nostack = s->stacks[stack].nframes == 0;
  if (stack < a->nst) {
    attr_key_of_set(a, a->sset[stack], nostack, k);
    return;
  }
  /* a stack read from the file since the classifier was made: its set found now */
  uint64_t set[ATTR_PW];
  ms__attr_stack_set(a, stack, set, NULL, NULL);
  k->nostack = nostack;
  k->set = (uint32_t)a->nsets;
  k->phase = ms__attr_set_eval(a, set, k->own);
  k->bits = k->own;
}

/* The stack of entry i of device dev: the set its frames had when they were read from the file
 * (eset), else its record's stack. */
static void attr_entry_key(const ms_attr_t *a, size_t dev, size_t i, attr_key_t *k) {
  const ms_snap_trace_t *t = &a->tl->dev[dev].trace[i];
  if (a->eset || a->eset8) {
    uintptr_t base = (uintptr_t)a->snap->trace, at = (uintptr_t)t;
    size_t rec = (size_t)((at - base) / sizeof *t);
    uint32_t set = at >= base && rec < a->snap->ntrace ? attr_record_set(a, rec) : ATTR_NONE;
    if (set != ATTR_NONE) {
      attr_key_of_set(a, set, false, k);
      return;
    }
  }
  attr_stack_key(a, t->stack, k);
}

/* ---- phase spans --------------------------------------------------------------------------- */

/* Whether rule ru, a phase rule with an annotation= pattern, names range x of device dev, a range
 * that ended. */
static bool attr_rule_names(const ms_attr_t *a, const attr_rule_t *ru, size_t dev,
                            const ms_tl_range_t *x) {
  return ru->kind == ATTR_R_PHASE && ru->annotation != ATTR_NONE && x->device == (int64_t)dev &&
         x->has_end && x->end_us != INT64_MAX &&
         ms__attr_glob(a->rules.pat[ru->annotation].glob, x->name, false);
}

/* Forces the phase of the entries of device dev inside the annotation ranges that phase rules
 * name (entries with times; times must not decrease, else annotations are not used): the ranges
 * the index paired (ms_tl_ranges_build), the first rule that names a range winning. Each rule
 * is matched against each range once; the table of forced entries (a trace's length) is made,
 * and the order of the times checked, at the first range that a rule names, so that a device
 * with none costs no pass over its trace. */
static int attr_annotations(const ms_attr_t *a, size_t dev, const ms_tl_ranges_t *rs,
                            const ms_snap_trace_t *tr, size_t n, uint8_t *ph) {
  uint8_t *forced = NULL;
  for (size_t r = 0; r < a->rules.nrules; r++) {
    const attr_rule_t *ru = &a->rules.rules[r];
    if (ru->kind != ATTR_R_PHASE || ru->annotation == ATTR_NONE) continue;
    for (size_t k = 0; k < rs->n; k++) {
      const ms_tl_range_t *x = &rs->ranges[k];
      if (!attr_rule_names(a, ru, dev, x)) continue;
      if (!forced) {
        for (size_t i = 1; i < n; i++)
          if ((tr[i].present & MS_TRACE_HAS_TIME) && (tr[i - 1].present & MS_TRACE_HAS_TIME) &&
              tr[i].time_us < tr[i - 1].time_us)
            return MS_OK;
        if (!(forced = ms__big_calloc(n, 1))) return MS_ENOMEM;
      }
      size_t lo = 0, hi = n; /* first entry with a time >= start */
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if ((tr[mid].present & MS_TRACE_HAS_TIME) && tr[mid].time_us >= x->start_us)
          hi = mid;
        else
          lo = mid + 1;
      }
      for (size_t i = lo; i < n && tr[i].time_us <= x->end_us; i++) {
        if (!(tr[i].present & MS_TRACE_HAS_TIME) || forced[i]) continue;
        ph[i] = ru->target;
        forced[i] = 1;
      }
    }
  }
  ms__big_free(forced);
  return MS_OK;
}

typedef MS_VEC(attr_span_t) attr_spanvec_t;

static int attr_span_push(attr_spanvec_t *sp, size_t first, uint8_t phase) {
  attr_span_t x = {sp->len == 0 ? 0 : (uint32_t)first, phase}; /* the first starts at 0 */
  return MS_VEC_PUSH(sp, x) ? MS_ENOMEM : MS_OK;
}

/* Spans of device dev. Classified entries (allocations whose stack has a phase, entries inside
 * an annotation range of a phase rule) start a span when their phase differs from the current
 * one; allocations without a phase between two spans of one phase belong to it, and between
 * spans of different phases form a `none` span. Other entries (frees) belong to the span before
 * them, so that a free just after an op's last allocation stays within the op's phase. */
static int attr_dev_spans(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  size_t n = ms_timeline_nentries(a->tl, dev);
  ad->n = n;
  if (n == 0) return MS_OK;
  const ms_snap_trace_t *tr = ms_timeline_entry(a->tl, dev, 0);
  const ms_tl_ranges_t *rs = a->snap->nannotations ? ms__tl_ranges(a->tl) : NULL;
  if (a->snap->nannotations && !rs) return MS_ENOMEM;
  uint8_t *ph = ms__big_malloc(n); /* a trace's length */
  if (!ph) return MS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    ph[i] = ATTR_PH_UNSET;
    if (tr[i].action != MS_TRACE_ALLOC) continue;
    attr_key_t k;
    attr_entry_key(a, dev, i, &k);
    ph[i] = k.phase != ATTR_PH_UNSET ? k.phase : ATTR_PH_NONE;
  }
  int rc = rs ? attr_annotations(a, dev, rs, tr, n, ph) : MS_OK;
  attr_spanvec_t sp = {0};
  uint8_t cur = ATTR_PH_UNSET;
  size_t pending = SIZE_MAX; /* the first phaseless allocation since the last classified entry */
  for (size_t i = 0; i < n && rc == MS_OK; i++) {
    if (ph[i] == ATTR_PH_UNSET) continue;
    if (ph[i] == ATTR_PH_NONE) {
      if (pending == SIZE_MAX) pending = i;
      continue;
    }
    if (ph[i] != cur) {
      if (pending != SIZE_MAX) rc = attr_span_push(&sp, pending, ATTR_PH_NONE);
      if (rc == MS_OK) rc = attr_span_push(&sp, i, ph[i]);
      cur = ph[i];
    }
    pending = SIZE_MAX;
  }
  if (rc == MS_OK && (pending != SIZE_MAX || sp.len == 0))
    rc = attr_span_push(&sp, pending == SIZE_MAX ? 0 : pending, ATTR_PH_NONE);
  ms__big_free(ph);
  ad->spans = sp.ptr;
  ad->nspans = sp.len;
  return rc;
}

/* The blocks alive at the end of device dev (their sizes are the snapshot's). */
static int attr_dev_end(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(a->tl, dev, ad->n, &st);
  size_t n = rc == MS_OK ? st.nblocks : 0;
  ad->end_addr = malloc((n ? n : 1) * sizeof *ad->end_addr);
  ad->end_size = malloc((n ? n : 1) * sizeof *ad->end_size);
  if (rc == MS_OK && (!ad->end_addr || !ad->end_size)) rc = MS_ENOMEM;
  for (size_t k = 0; k < n && rc == MS_OK; k++) {
    ad->end_addr[k] = st.blocks[k].address;
    ad->end_size[k] = st.blocks[k].size;
    if (st.blocks[k].alloc_entry < 0 && st.blocks[k].free_entry < 0) ad->has_old = true;
  }
  ad->nend = rc == MS_OK ? n : 0;
  ms_timeline_state_release(&st);
  return rc;
}

int ms__attr_spans(ms_attr_t *a) {
  a->ndev = ms_timeline_ndevices(a->tl);
  a->dev = calloc(a->ndev ? a->ndev : 1, sizeof *a->dev);
  if (!a->dev) return MS_ENOMEM;
  for (size_t d = 0; d < a->ndev; d++) {
    atomic_init(&a->dev[d].ecat_ready, 0);
    MS_FORWARD_IF_ERROR(attr_dev_spans(a, d));
    MS_FORWARD_IF_ERROR(attr_dev_end(a, d));
  }
  return MS_OK;
}

uint64_t ms__attr_entry_size(const ms_attr_t *a, size_t dev, size_t i) {
  const tl_dev_t *td = &a->tl->dev[dev];
  if (td->pair[i] != TL_NONE) return tl_bsize(td, i);
  const attr_dev_t *ad = &a->dev[dev];
  uint64_t addr = td->trace[i].addr;
  size_t lo = 0, hi = ad->nend;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ad->end_addr[mid] < addr) lo = mid + 1; else hi = mid;
  }
  return lo < ad->nend && ad->end_addr[lo] == addr ? ad->end_size[lo] : tl_bsize(td, i);
}

/* ---- a block's category -------------------------------------------------------------------- */

static size_t attr_span_of(const attr_dev_t *ad, size_t entry) {
  size_t lo = 0, hi = ad->nspans;
  while (hi - lo > 1) {
    size_t mid = lo + (hi - lo) / 2;
    if (ad->spans[mid].first <= entry)
      lo = mid;
    else
      hi = mid;
  }
  return lo;
}

static bool attr_grad_addr(const attr_dev_t *ad, uint64_t addr) {
  size_t lo = 0, hi = ad->ngrad_addr;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (ad->grad_addr[mid] < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo < ad->ngrad_addr && ad->grad_addr[lo] == addr;
}

/* ms__attr_classify with the span of the alloc entry known (SIZE_MAX: look it up). */
static ms_category attr_classify_in(const ms_attr_t *a, size_t dev, size_t span,
                                    int64_t alloc_entry, int64_t free_entry, const attr_key_t *key,
                                    uint64_t address, bool ignore_matches) {
  const attr_dev_t *ad = dev < a->ndev ? &a->dev[dev] : NULL;
  bool recorded = alloc_entry >= 0 && ad && (size_t)alloc_entry < ad->n && ad->nspans > 0;
  uint8_t phase = ATTR_PH_NONE, prev = ATTR_PH_UNSET, next = ATTR_PH_UNSET;
  int freed;
  if (recorded) {
    size_t k = span != SIZE_MAX ? span : attr_span_of(ad, (size_t)alloc_entry);
    phase = ad->spans[k].phase;
    if (k > 0) prev = ad->spans[k - 1].phase;
    if (k + 1 < ad->nspans) next = ad->spans[k + 1].phase;
    size_t end = k + 1 < ad->nspans ? ad->spans[k + 1].first : ad->n;
    freed = free_entry < 0 ? ATTR_FREED_NEVER
            : (size_t)free_entry < end ? ATTR_FREED_WITHIN : ATTR_FREED_AFTER;
  } else {
    if (key->phase != ATTR_PH_UNSET) phase = key->phase;
    freed = free_entry < 0 ? ATTR_FREED_NEVER : ATTR_FREED_AFTER;
  }
  bool nostack = key->nostack;
  const uint64_t *bits = key->bits;
  for (size_t r = 0; r < a->rules.nrules; r++) {
    const attr_rule_t *ru = &a->rules.rules[r];
    if (ru->kind != ATTR_R_CATEGORY) continue;
    if (ru->has_frames && (!bits || !(bits[r / 64] >> (r % 64) & 1))) continue;
    if (ru->phase && !(ru->phase >> phase & 1)) continue;
    if (ru->prev && (prev == ATTR_PH_UNSET || !(ru->prev >> prev & 1))) continue;
    if (ru->next && (next == ATTR_PH_UNSET || !(ru->next >> next & 1))) continue;
    if (ru->freed == ATTR_FREED_WITHIN && freed != ATTR_FREED_WITHIN) continue;
    if (ru->freed == ATTR_FREED_AFTER && freed == ATTR_FREED_WITHIN) continue;
    if (ru->freed == ATTR_FREED_NEVER && freed != ATTR_FREED_NEVER) continue;
    if (ru->alloc == ATTR_ALLOC_RECORDED && !recorded) continue;
    if (ru->alloc == ATTR_ALLOC_UNRECORDED && recorded) continue;
    if (ru->nostack >= 0 && (ru->nostack == 1) != nostack) continue;
    if (ru->matches_gradient &&
        (ignore_matches || recorded || free_entry >= 0 || !ad || !attr_grad_addr(ad, address)))
      continue;
    return (ms_category)ru->target;
  }
  return MS_CAT_UNKNOWN;
}

ms_category ms__attr_entry_alone(const ms_attr_t *a, size_t dev, size_t i) {
  const tl_dev_t *td = &a->tl->dev[dev];
  const char *given = ms_snap_trace_category(&td->trace[i]);
  ms_category gc = given[0] ? ms_category_parse(given) : MS_CAT_COUNT;
  if (gc < MS_CAT_COUNT) return gc;
  uint32_t fe = td->pair[i];
  attr_key_t k;
  attr_entry_key(a, dev, i, &k);
  return attr_classify_in(a, dev, SIZE_MAX, (int64_t)i, fe == TL_NONE ? -1 : (int64_t)fe, &k,
                          td->trace[i].addr, true);
}

/* The category of alloc entry i of device dev: from the cache when it is built; else alone, and
 * the cache is built first when `whole` (a walk over the trace asks) or after ATTR_DIRECT_MAX
 * answers found alone (many blocks asked one by one). */
static ms_category attr_entry_cat(const ms_attr_t *a, size_t dev, size_t i, bool whole) {
  const attr_dev_t *ad = &a->dev[dev];
  if (atomic_load_explicit(&ad->ecat_ready, memory_order_acquire) == 1)
    return (ms_category)ad->ecat[i];
  atomic_size_t *nd = (atomic_size_t *)(uintptr_t)&a->ndirect; /* a counter, not the answers */
  if ((whole || atomic_fetch_add_explicit(nd, 1, memory_order_relaxed) >= ATTR_DIRECT_MAX) &&
      ms__attr_ecat_ready(a, dev))
    return (ms_category)ad->ecat[i];
  return ms__attr_entry_alone(a, dev, i);
}

ms_category ms__attr_classify(const ms_attr_t *a, size_t dev, int64_t alloc_entry,
                              int64_t free_entry, uint32_t stack, uint64_t address,
                              bool ignore_matches) {
  /* an alloc entry freed where the index pairs it: its entry's category (matches= holds only for
   * blocks older than the trace, so it is the same with ignore_matches) */
  if (alloc_entry >= 0 && dev < a->ndev && (size_t)alloc_entry < a->dev[dev].n) {
    const tl_dev_t *td = &a->tl->dev[dev];
    size_t i = (size_t)alloc_entry;
    if (td->trace[i].action == MS_TRACE_ALLOC &&
        free_entry == (td->pair[i] == TL_NONE ? -1 : (int64_t)td->pair[i]))
      return attr_entry_cat(a, dev, i, false);
  }
  /* an alloc entry's stack is its record's (stack says the same, unless the record's was read
   * from the file after the classifier was made) */
  attr_key_t k;
  if (alloc_entry >= 0 && dev < a->ndev && (size_t)alloc_entry < a->dev[dev].n &&
      a->tl->dev[dev].trace[alloc_entry].action == MS_TRACE_ALLOC)
    attr_entry_key(a, dev, (size_t)alloc_entry, &k);
  else
    attr_stack_key(a, stack, &k);
  return attr_classify_in(a, dev, SIZE_MAX, alloc_entry, free_entry, &k, address, ignore_matches);
}

/* Memo of attr_dev_ecat: within one span, an alloc entry's category (matches= ignored) depends
 * only on its stack's pattern set (or none), whether its stack is empty, and whether it is freed
 * within the span, after it or never; one walk of the rules per such key and span. The slots are
 * stamped with the span (+ 1) that filled them, so moving to the next span clears nothing. */
#define ATTR_MEMO_MAX_SETS 65536 /* more distinct sets: no memo */

typedef struct attr_memo_s {
  uint32_t *stamp;
  uint8_t *cat;
  size_t nsets;
} attr_memo_t;

/* The memo's slot of an alloc entry whose stack is key (freed: ATTR_FREED_*), or SIZE_MAX:
 * none. */
static size_t attr_memo_slot(const attr_memo_t *m, const attr_key_t *key, int freed) {
  if (!m->stamp) return SIZE_MAX;
  size_t set = key->set < m->nsets ? key->set : m->nsets;
  return (set * 2 + key->nostack) * 4 + (size_t)freed;
}

/* The category of every alloc entry of device dev, in one pass (spans followed in order). */
static int attr_dev_ecat(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  const tl_dev_t *td = &a->tl->dev[dev];
  if (ad->n == 0) return MS_OK;
  ad->ecat = ms__big_malloc(ad->n ? ad->n : 1);
  if (!ad->ecat) return MS_ENOMEM;
  attr_memo_t m = {NULL, NULL, a->nsets};
  if (a->nsets <= ATTR_MEMO_MAX_SETS && ad->nspans < UINT32_MAX) {
    size_t slots = (a->nsets + 1) * 8;
    m.stamp = calloc(slots, sizeof *m.stamp);
    m.cat = malloc(slots);
    if (!m.stamp || !m.cat) {
      free(m.stamp); /* classify without the memo */
      free(m.cat);
      m.stamp = NULL;
    }
  }
  size_t k = 0, end = ad->nspans > 1 ? ad->spans[1].first : ad->n;
  for (size_t i = 0; i < ad->n; i++) {
    while (k + 1 < ad->nspans && ad->spans[k + 1].first <= i) {
      k++;
      end = k + 1 < ad->nspans ? ad->spans[k + 1].first : ad->n;
    }
    if (td->trace[i].action != MS_TRACE_ALLOC) {
      ad->ecat[i] = 0xff;
      continue;
    }
    /* a category the snapshot carries (made from PyTorch's profiler) wins over the rules */
    const char *given = ms_snap_trace_category(&td->trace[i]);
    ms_category gc = given[0] ? ms_category_parse(given) : MS_CAT_COUNT;
    if (gc < MS_CAT_COUNT) {
      ad->ecat[i] = (uint8_t)gc;
      continue;
    }
    uint32_t fe = td->pair[i];
    int freed = fe == TL_NONE ? ATTR_FREED_NEVER : fe < end ? ATTR_FREED_WITHIN : ATTR_FREED_AFTER;
    attr_key_t key;
    attr_entry_key(a, dev, i, &key);
    size_t slot = key.bits == key.own ? SIZE_MAX : attr_memo_slot(&m, &key, freed);
    if (slot != SIZE_MAX && m.stamp[slot] == (uint32_t)k + 1) {
      ad->ecat[i] = m.cat[slot];
      continue;
    }
    ad->ecat[i] = (uint8_t)attr_classify_in(a, dev, k, (int64_t)i, fe == TL_NONE ? -1 : (int64_t)fe,
                                            &key, td->trace[i].addr, true);
    if (slot != SIZE_MAX) {
      m.stamp[slot] = (uint32_t)k + 1;
      m.cat[slot] = ad->ecat[i];
    }
  }
  free(m.stamp);
  free(m.cat);
  return MS_OK;
}

bool ms__attr_ecat_ready(const ms_attr_t *ca, size_t dev) {
  ms_attr_t *a = (ms_attr_t *)(uintptr_t)ca; /* a cache filled once: the classifier stays
                                                immutable to its users */
  attr_dev_t *ad = &a->dev[dev];
  int st = atomic_load_explicit(&ad->ecat_ready, memory_order_acquire);
  if (st) return st == 1;
  pthread_mutex_lock(&a->ecat_mu);
  st = atomic_load_explicit(&ad->ecat_ready, memory_order_relaxed);
  if (!st) {
    st = attr_dev_ecat(a, dev) == MS_OK ? 1 : 2; /* 2: no memory, answers found alone */
    atomic_store_explicit(&ad->ecat_ready, st, memory_order_release);
  }
  pthread_mutex_unlock(&a->ecat_mu);
  return st == 1;
}

/* The stack that a block's category reads: its alloc entry's, the snapshot's block's when it
 * was alive at the end, none when only its free was recorded. */
uint32_t ms__attr_block_stack(const ms_attr_t *a, size_t dev, const ms_tl_block_t *b) {
  if (b->alloc_entry >= 0 && (size_t)b->alloc_entry < ms_timeline_nentries(a->tl, dev))
    return ms_timeline_entry(a->tl, dev, (size_t)b->alloc_entry)->stack;
  if (b->flags & MS_TL_BLOCK_FROM_SNAPSHOT) return b->stack;
  if (b->flags & MS_TL_BLOCK_ALLOC_UNRECORDED) return ATTR_STACK_UNRECORDED;
  return b->stack;
}

ms_category ms__attr_entry_category(const ms_attr_t *a, size_t dev, size_t i) {
  if (dev >= a->ndev || i >= a->dev[dev].n || a->tl->dev[dev].trace[i].action != MS_TRACE_ALLOC)
    return MS_CAT_UNKNOWN;
  return attr_entry_cat(a, dev, i, true);
}

ms_category ms_attr_entry_category(const ms_attr_t *a, size_t dev, size_t entry) {
  if (dev >= a->ndev || entry >= a->dev[dev].n ||
      a->tl->dev[dev].trace[entry].action != MS_TRACE_ALLOC)
    return MS_CAT_UNKNOWN;
  return ms__attr_entry_category(a, dev, entry);
}

ms_category ms_attr_block_category(const ms_attr_t *a, size_t dev, const ms_tl_block_t *b) {
  return ms__attr_classify(a, dev, b->alloc_entry, b->free_entry,
                           ms__attr_block_stack(a, dev, b), b->address, false);
}

/* ---- the gradient sizes -------------------------------------------------------------------- */

typedef struct attr_gs_s {
  uint64_t span; /* UINT64_MAX: allocated before recording */
  uint64_t size;
} attr_gs_t;

static int attr_gs_cmp(const void *x, const void *y) {
  const attr_gs_t *a = x, *b = y;
  if (a->size != b->size) return a->size < b->size ? -1 : 1;
  return a->span < b->span ? -1 : a->span > b->span;
}

static int attr_u64_cmp(const void *x, const void *y) {
  uint64_t a = *(const uint64_t *)x, b = *(const uint64_t *)y;
  return a < b ? -1 : a > b;
}

/* matches=gradient on device dev: per requested size (a parameter and its gradient have the
 * same; their blocks may not, when the allocator leaves a large block's tail unsplit), the most
 * gradient blocks of that size allocated in one phase span (or alive before recording); then the
 * blocks alive over the whole trace, in address order, take those counts. */
static int attr_dev_grad(ms_attr_t *a, size_t dev) {
  attr_dev_t *ad = &a->dev[dev];
  const tl_dev_t *td = &a->tl->dev[dev];
  MS_VEC(attr_gs_t) gs = {0};
  if (!ms__attr_ecat_ready(a, dev)) return MS_ENOMEM;
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(a->tl, dev, ad->n, &st);
  for (size_t i = 0; i < ad->n && rc == MS_OK; i++) {
    if (ad->ecat[i] != MS_CAT_GRADIENT) continue;
    attr_gs_t g = {attr_span_of(ad, i), td->trace[i].size}; /* the requested size */
    if (MS_VEC_PUSH(&gs, g)) rc = MS_ENOMEM;
  }
  MS_VEC(uint64_t) cand = {0}; /* (size, address) of blocks alive throughout */
  for (size_t k = 0; k < st.nblocks && rc == MS_OK; k++) {
    const ms_tl_block_t *b = &st.blocks[k];
    if (b->alloc_entry >= 0 || b->free_entry >= 0) continue;
    if (ms__attr_classify(a, dev, -1, -1, ms__attr_block_stack(a, dev, b), 0, true) ==
        MS_CAT_GRADIENT) {
      attr_gs_t g = {UINT64_MAX, b->requested_size};
      if (MS_VEC_PUSH(&gs, g)) rc = MS_ENOMEM;
    }
    if (rc == MS_OK &&
        (MS_VEC_PUSH(&cand, b->requested_size) || MS_VEC_PUSH(&cand, b->address)))
      rc = MS_ENOMEM;
  }
  ms_timeline_state_release(&st);
  if (rc == MS_OK && gs.len > 0 && cand.len > 0) {
    qsort(gs.ptr, gs.len, sizeof *gs.ptr, attr_gs_cmp);
    /* per size, in gs.ptr[m]: its cap (span field) = the longest run of one span */
    size_t m = 0;
    uint64_t psize = 0, pspan = 0, run = 0;
    for (size_t j = 0; j < gs.len; j++) {
      attr_gs_t g = gs.ptr[j];
      run = j > 0 && g.size == psize && g.span == pspan ? run + 1 : 1;
      if (m > 0 && gs.ptr[m - 1].size == g.size) {
        if (run > gs.ptr[m - 1].span) gs.ptr[m - 1].span = run;
      } else {
        gs.ptr[m].size = g.size;
        gs.ptr[m++].span = run;
      }
      psize = g.size;
      pspan = g.span;
    }
    ad->grad_addr = malloc(cand.len / 2 * sizeof *ad->grad_addr);
    if (!ad->grad_addr) rc = MS_ENOMEM;
    for (size_t c = 0; c < cand.len && rc == MS_OK; c += 2) { /* in address order */
      size_t lo = 0, hi = m;
      while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (gs.ptr[mid].size < cand.ptr[c]) lo = mid + 1; else hi = mid;
      }
      if (lo >= m || gs.ptr[lo].size != cand.ptr[c] || gs.ptr[lo].span == 0) continue;
      gs.ptr[lo].span--;
      ad->grad_addr[ad->ngrad_addr++] = cand.ptr[c + 1];
    }
    if (rc == MS_OK) qsort(ad->grad_addr, ad->ngrad_addr, sizeof *ad->grad_addr, attr_u64_cmp);
  }
  MS_VEC_FREE(&gs);
  MS_VEC_FREE(&cand);
  return rc;
}

int ms__attr_gradient_sizes(ms_attr_t *a) {
  bool used = false;
  for (size_t r = 0; r < a->rules.nrules; r++)
    used |= a->rules.rules[r].kind == ATTR_R_CATEGORY && a->rules.rules[r].matches_gradient;
  if (!used) return MS_OK;
  for (size_t d = 0; d < a->ndev; d++) /* only blocks older than the trace read the sizes */
    if (a->dev[d].has_old) MS_FORWARD_IF_ERROR(attr_dev_grad(a, d));
  return MS_OK;
}
