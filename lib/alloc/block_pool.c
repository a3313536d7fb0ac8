/* SPDX-License-Identifier: MIT
 * memsnap core: free-block sets ordered by (stream, size, address), PyTorch's BlockPool::blocks
 * (docs/pytorch-allocator.md, "Blocks and pools").
 *
 * A pool keeps one set per stream (ms__fset_t, sorted by stream in pool->sets), and a set splits
 * its blocks into MS__FSET_NBINS size classes: up to 32 KiB one class per 512-byte size, above
 * that 32 classes per power of two (each covers at most 1/32 of its sizes; sizes above 32 TiB
 * share the last class). Each class holds an intrusive treap ordered by (size, address), whose node
 * priorities (a hash of the block's address and size) form a max-heap, so its expected depth is
 * O(log n) whatever the insertion order; a bitmap of the non-empty classes (with a summary word)
 * finds the next non-empty class in two word scans.
 *
 * Best fit is lower_bound(stream, size, 0), exactly as with one ordered set: the smallest block of
 * that stream that fits, lowest address on ties. It is the set's first block (cached) when that
 * fits, else the lower bound inside the request's class or, when that has none, the first block
 * of the next non-empty class, since classes are ordered by size. A descent therefore visits a few nodes of one small treap (cache lines and mispredicted
 * branches were what a single treap of all blocks cost; docs/allocator.md, "Speed"). Parent links
 * and the bitmaps give the in-order successor and predecessor across classes and streams for the
 * ordered walks of release_blocks and release_available_cached_blocks.
 *
 * Memory: the links live in the blocks; a set (about 8 KiB) exists for each (pool, stream) that
 * has segments: made with the first (ms__pool_reserve, the only step that can fail, so that
 * inserting never allocates) and freed with the last (ms__pool_unreserve).
 */
#include <stdlib.h>
#include <string.h>

#include "alloc/types.h"
#include "common/hash.h"

#define FSET_WORDS (MS__FSET_NBINS / 64)
#define SUB_LOG2 5 /* 32 classes per power of two */
#define SUB (1u << SUB_LOG2)
#define MAX_LOG2 35 /* units of 512 B: 2^36 units = 32 TiB */

_Static_assert(MS__FSET_NBINS == (MAX_LOG2 - SUB_LOG2 + 2) * SUB, "class count");
_Static_assert(FSET_WORDS <= 64, "one summary word");

struct ms__fset_s {
  ms_stream_t stream;
  size_t nsegments;                      /* the pool's segments on stream (ms__pool_reserve) */
  ms__block_t *min;                      /* the set's first block (NULL: empty) */
  uint64_t summary;                      /* bit w: bits[w] != 0 */
  uint64_t bits[FSET_WORDS];             /* bit i: roots[i] != NULL */
  ms__block_t *roots[MS__FSET_NBINS];    /* per class: a treap by (size, ptr) */
};

/* The class of a size: monotone non-decreasing in size. Classes are counted on units - 1 so that
 * a power of two ends its class rather than starting one: a 2 MiB segment and its remainder after
 * a small allocation share a class, and the remainder is shrunk in place. */
static inline unsigned size_class(size_t size) {
  uint64_t u = (uint64_t)size >> 9;
  u -= u != 0;
  if (u < SUB) return (unsigned)u;
  unsigned k = 63u - (unsigned)__builtin_clzll(u); /* >= SUB_LOG2 */
  if (k > MAX_LOG2) return MS__FSET_NBINS - 1;
  return (k - SUB_LOG2 + 1) * SUB + (unsigned)((u >> (k - SUB_LOG2)) & (SUB - 1));
}

/* The first non-empty class >= i, or -1. */
static inline int next_class(const ms__fset_t *s, unsigned i) {
  if (i >= MS__FSET_NBINS) return -1;
  unsigned w = i >> 6;
  uint64_t m = s->bits[w] & (~0ULL << (i & 63));
  if (m) return (int)(w * 64 + (unsigned)__builtin_ctzll(m));
  uint64_t sm = w + 1 < 64 ? s->summary & (~0ULL << (w + 1)) : 0;
  if (!sm) return -1;
  w = (unsigned)__builtin_ctzll(sm);
  return (int)(w * 64 + (unsigned)__builtin_ctzll(s->bits[w]));
}

/* The last non-empty class <= i, or -1. */
static inline int prev_class(const ms__fset_t *s, int i) {
  if (i < 0) return -1;
  unsigned w = (unsigned)i >> 6;
  uint64_t m = s->bits[w] & (~0ULL >> (63 - ((unsigned)i & 63)));
  if (m) return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(m));
  uint64_t sm = s->summary & ((1ULL << w) - 1);
  if (!sm) return -1;
  w = 63u - (unsigned)__builtin_clzll(sm);
  return (int)(w * 64 + 63 - (unsigned)__builtin_clzll(s->bits[w]));
}

/* ---- the pool's sets ------------------------------------------------------------------------- */

void ms__pool_init(ms__pool_t *p, bool is_small, ms__private_pool_t *owner) {
  p->hot = NULL;
  p->sets = NULL;
  p->nsets = 0;
  p->nblocks = 0;
  p->is_small = is_small;
  p->owner = owner;
  p->get_free_blocks_call_count = 0;
  p->unmapped = NULL;
}

void ms__pool_fini(ms__pool_t *p) {
  for (size_t i = 0; i < p->nsets; i++) free(p->sets[i]);
  free(p->sets);
  p->sets = NULL;
  p->nsets = 0;
  p->hot = NULL;
}

/* The index of the first set whose stream is >= stream. */
static size_t set_index(const ms__pool_t *p, ms_stream_t stream) {
  size_t lo = 0, hi = p->nsets;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (p->sets[mid]->stream < stream) lo = mid + 1;
    else hi = mid;
  }
  return lo;
}

static inline ms__fset_t *set_of(ms__pool_t *p, ms_stream_t stream) {
  ms__fset_t *h = p->hot;
  if (ms_likely(h && h->stream == stream)) return h;
  size_t i = set_index(p, stream);
  if (i == p->nsets || p->sets[i]->stream != stream) return NULL;
  p->hot = p->sets[i];
  return p->hot;
}

int ms__pool_reserve(ms__pool_t *p, ms_stream_t stream) {
  size_t i = set_index(p, stream);
  if (i < p->nsets && p->sets[i]->stream == stream) {
    p->sets[i]->nsegments++;
    return MS_OK;
  }
  ms__fset_t *s = calloc(1, sizeof *s);
  ms__fset_t **ns = s ? realloc(p->sets, (p->nsets + 1) * sizeof *ns) : NULL;
  if (!ns) {
    free(s);
    return MS_ENOMEM;
  }
  s->stream = stream;
  s->nsegments = 1;
  memmove(&ns[i + 1], &ns[i], (p->nsets - i) * sizeof *ns);
  ns[i] = s;
  p->sets = ns;
  p->nsets++;
  return MS_OK;
}

void ms__pool_unreserve(ms__pool_t *p, ms_stream_t stream) {
  size_t i = set_index(p, stream);
  if (i == p->nsets || p->sets[i]->stream != stream) return; /* after ms__pool_fini */
  ms__fset_t *s = p->sets[i];
  if (--s->nsegments) return;
  ms_assert_internal(s->min == NULL); /* no segment, no block */
  if (p->hot == s) p->hot = NULL;
  free(s);
  memmove(&p->sets[i], &p->sets[i + 1], (p->nsets - i - 1) * sizeof *p->sets);
  p->nsets--;
}

/* ---- treaps ---------------------------------------------------------------------------------- */

/* Strict (size, ptr) order inside one set. */
static inline bool node_less(const ms__block_t *a, const ms__block_t *b) {
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

/* Rotates x above its parent; root is the treap's root link. */
static inline void rotate_up(ms__block_t **root, ms__block_t *x) {
  ms__block_t *par = x->tp, *g = par->tp;
  if (par->tl == x) {
    par->tl = x->tr;
    if (x->tr) x->tr->tp = par;
    x->tr = par;
  } else {
    par->tr = x->tl;
    if (x->tl) x->tl->tp = par;
    x->tl = par;
  }
  par->tp = x;
  x->tp = g;
  if (!g) *root = x;
  else if (g->tl == par) g->tl = x;
  else g->tr = x;
}

static inline ms__block_t *leftmost(ms__block_t *n) {
  if (n)
    while (n->tl) n = n->tl;
  return n;
}

static inline ms__block_t *rightmost(ms__block_t *n) {
  if (n)
    while (n->tr) n = n->tr;
  return n;
}

void ms__pool_insert(ms__pool_t *p, ms__block_t *b) {
  ms_assert_internal(!b->in_set);
  ms__fset_t *s = set_of(p, b->stream);
  ms_assert(s != NULL); /* ms__pool_reserve ran when the block's segment was made */
  b->gc_count_base = p->get_free_blocks_call_count;
  b->prio = (uint32_t)ms_hash_u64((uint64_t)b->ptr ^ ((uint64_t)b->size << 1));
  b->tl = b->tr = NULL;
  unsigned c = size_class(b->size);
  ms__block_t **root = &s->roots[c];
  if (!*root) {
    s->bits[c >> 6] |= 1ULL << (c & 63);
    s->summary |= 1ULL << (c >> 6);
  }
  ms__block_t *par = NULL, **link = root;
  while (*link) {
    par = *link;
    link = node_less(b, par) ? &par->tl : &par->tr;
  }
  *link = b;
  b->tp = par;
  while (b->tp && b->tp->prio < b->prio) rotate_up(root, b);
  if (!s->min || node_less(b, s->min)) s->min = b;
  b->in_set = true;
  p->nblocks++;
}

void ms__pool_erase(ms__pool_t *p, ms__block_t *b) {
  ms_assert_internal(b->in_set);
  ms__fset_t *s = set_of(p, b->stream);
  ms_assert_internal(s != NULL);
  unsigned c = size_class(b->size);
  ms__block_t **root = &s->roots[c];
  while (b->tl && b->tr) rotate_up(root, b->tl->prio > b->tr->prio ? b->tl : b->tr);
  ms__block_t *ch = b->tl ? b->tl : b->tr;
  if (ch) ch->tp = b->tp;
  if (!b->tp) *root = ch;
  else if (b->tp->tl == b) b->tp->tl = ch;
  else b->tp->tr = ch;
  if (!*root) {
    s->bits[c >> 6] &= ~(1ULL << (c & 63));
    if (!s->bits[c >> 6]) s->summary &= ~(1ULL << (c >> 6));
  }
  if (s->min == b) { /* the next block: b's class, else the next class */
    int nc = *root ? (int)c : next_class(s, c + 1);
    s->min = nc < 0 ? NULL : leftmost(s->roots[nc]);
  }
  b->tl = b->tr = b->tp = NULL;
  b->in_set = false;
  p->nblocks--;
}

/* b's neighbours inside its class's treap (in order), or NULL. */
static inline ms__block_t *class_prev(const ms__block_t *b) {
  if (b->tl) return rightmost(b->tl);
  while (b->tp && b->tp->tl == b) b = b->tp;
  return b->tp;
}

static inline ms__block_t *class_next(const ms__block_t *b) {
  if (b->tr) return leftmost(b->tr);
  while (b->tp && b->tp->tr == b) b = b->tp;
  return b->tp;
}

void ms__pool_shrink_front(ms__pool_t *p, ms__block_t *b, size_t cut) {
  ms_assert_internal(b->in_set && cut < b->size);
  size_t nsize = b->size - cut;
  uintptr_t nptr = b->ptr + cut;
  const ms__block_t *pr;
  if (size_class(nsize) == size_class(b->size) &&
      (!(pr = class_prev(b)) || pr->size < nsize || (pr->size == nsize && pr->ptr < nptr))) {
    /* Still after its predecessor: the treap's order holds, its priority is kept, and the set's
     * first block is unchanged (b stays first if it was). */
    b->size = nsize;
    b->ptr = nptr;
    b->gc_count_base = p->get_free_blocks_call_count;
    return;
  }
  ms__pool_erase(p, b);
  b->size = nsize;
  b->ptr = nptr;
  ms__pool_insert(p, b);
}

void ms__pool_replace(ms__pool_t *p, ms__block_t *old, ms__block_t *nb) {
  ms_assert_internal(old->in_set && !nb->in_set && old->stream == nb->stream);
  unsigned c = size_class(old->size);
  const ms__block_t *pr, *nx;
  if (size_class(nb->size) != c || ((pr = class_prev(old)) && !node_less(pr, nb)) ||
      ((nx = class_next(old)) && !node_less(nb, nx))) {
    ms__pool_erase(p, old);
    ms__pool_insert(p, nb);
    return;
  }
  /* nb takes old's node: same links and priority, so order and heap hold. */
  ms__fset_t *s = set_of(p, old->stream);
  ms_assert_internal(s != NULL);
  nb->tl = old->tl;
  nb->tr = old->tr;
  nb->tp = old->tp;
  nb->prio = old->prio;
  if (nb->tl) nb->tl->tp = nb;
  if (nb->tr) nb->tr->tp = nb;
  if (!nb->tp) s->roots[c] = nb;
  else if (nb->tp->tl == old) nb->tp->tl = nb;
  else nb->tp->tr = nb;
  if (s->min == old) s->min = nb;
  nb->gc_count_base = p->get_free_blocks_call_count;
  nb->in_set = true;
  old->tl = old->tr = old->tp = NULL;
  old->in_set = false;
}

/* The smallest block of s with size >= size (lowest address on ties), or NULL. */
static inline ms__block_t *set_lower_bound(const ms__fset_t *s, size_t size) {
  if (!s->min || s->min->size >= size) return s->min; /* the first block fits (or none) */
  unsigned c = size_class(size);
  ms__block_t *res = NULL, *n = s->roots[c];
  while (n) {
    if (n->size < size) {
      n = n->tr;
    } else {
      res = n;
      n = n->tl;
    }
  }
  if (res) return res;
  int nc = next_class(s, c + 1);
  return nc < 0 ? NULL : leftmost(s->roots[nc]);
}

static ms__block_t *set_first(const ms__fset_t *s) { return s->min; }

static ms__block_t *set_last(const ms__fset_t *s) {
  int c = prev_class(s, MS__FSET_NBINS - 1);
  return c < 0 ? NULL : rightmost(s->roots[c]);
}

ms__block_t *ms__pool_find(ms__pool_t *p, ms_stream_t stream, size_t size) {
  ms__fset_t *s = set_of(p, stream);
  return s ? set_lower_bound(s, size) : NULL;
}

ms__block_t *ms__pool_lower_bound(const ms__pool_t *p, ms_stream_t stream, size_t size) {
  size_t i = set_index(p, stream);
  if (i < p->nsets && p->sets[i]->stream == stream) {
    ms__block_t *b = set_lower_bound(p->sets[i], size);
    if (b) return b;
    i++;
  }
  for (; i < p->nsets; i++) {
    ms__block_t *b = set_first(p->sets[i]);
    if (b) return b;
  }
  return NULL;
}

ms__block_t *ms__pool_first(const ms__pool_t *p) {
  for (size_t i = 0; i < p->nsets; i++) {
    ms__block_t *b = set_first(p->sets[i]);
    if (b) return b;
  }
  return NULL;
}

ms__block_t *ms__pool_last(const ms__pool_t *p) {
  for (size_t i = p->nsets; i-- > 0;) {
    ms__block_t *b = set_last(p->sets[i]);
    if (b) return b;
  }
  return NULL;
}

ms__block_t *ms__pool_next(const ms__block_t *b) {
  ms__block_t *n = class_next(b);
  if (n) return n;
  /* b was the last of its class: the next class, then the next streams. */
  const ms__pool_t *p = b->pool;
  size_t i = set_index(p, b->stream);
  ms_assert_internal(i < p->nsets && p->sets[i]->stream == b->stream);
  int c = next_class(p->sets[i], size_class(b->size) + 1);
  if (c >= 0) return leftmost(p->sets[i]->roots[c]);
  for (i++; i < p->nsets; i++) {
    ms__block_t *f = set_first(p->sets[i]);
    if (f) return f;
  }
  return NULL;
}

ms__block_t *ms__pool_prev(const ms__block_t *b) {
  ms__block_t *n = class_prev(b);
  if (n) return n;
  /* b was the first of its class: the previous class, then the previous streams. */
  const ms__pool_t *p = b->pool;
  size_t i = set_index(p, b->stream);
  ms_assert_internal(i < p->nsets && p->sets[i]->stream == b->stream);
  int c = prev_class(p->sets[i], (int)size_class(b->size) - 1);
  if (c >= 0) return rightmost(p->sets[i]->roots[c]);
  while (i-- > 0) {
    ms__block_t *l = set_last(p->sets[i]);
    if (l) return l;
  }
  return NULL;
}

/* ---- checks ---------------------------------------------------------------------------------- */

static size_t check_subtree(const ms__pool_t *p, const ms__fset_t *s, unsigned c,
                            const ms__block_t *n, const ms__block_t *parent, bool *ok) {
  if (!n) return 0;
  if (n->tp != parent || !n->in_set || n->pool != p || n->stream != s->stream ||
      size_class(n->size) != c)
    *ok = false;
  if (parent && n->prio > parent->prio) *ok = false;
  if (n->tl && !node_less(n->tl, n)) *ok = false;
  if (n->tr && !node_less(n, n->tr)) *ok = false;
  if (!*ok) return 0;
  return 1 + check_subtree(p, s, c, n->tl, n, ok) + check_subtree(p, s, c, n->tr, n, ok);
}

static bool pool_less(const ms__block_t *a, const ms__block_t *b) {
  if (a->stream != b->stream) return a->stream < b->stream;
  return node_less(a, b);
}

bool ms__pool_is_valid(const ms__pool_t *p) {
  bool ok = true;
  size_t total = 0;
  for (size_t i = 0; i < p->nsets && ok; i++) {
    const ms__fset_t *s = p->sets[i];
    if ((i && !(p->sets[i - 1]->stream < s->stream)) || s->nsegments == 0) return false;
    for (unsigned w = 0; w < FSET_WORDS; w++)
      if (((s->summary >> w) & 1) != (s->bits[w] != 0)) return false;
    if (FSET_WORDS < 64 && (s->summary >> FSET_WORDS)) return false;
    int first = next_class(s, 0);
    if (s->min != (first < 0 ? NULL : leftmost(s->roots[first]))) return false;
    /* Every marked class holds a treap. The converse (an unmarked class is empty) is not
     * scanned, 1024 loads per set on every check: a block left in an unmarked class is missed
     * by the walks below, so the count differs (and ms__allocator_check counts the cached blocks
     * from the segments). */
    for (int c = next_class(s, 0); c >= 0 && ok; c = next_class(s, (unsigned)c + 1)) {
      if (!s->roots[c]) return false;
      total += check_subtree(p, s, (unsigned)c, s->roots[c], NULL, &ok);
    }
  }
  if (!ok || total != p->nblocks) return false;
  if (p->hot) {
    bool known = false;
    for (size_t i = 0; i < p->nsets; i++) known |= p->sets[i] == p->hot;
    if (!known) return false;
  }
  /* in-order walks, both ways, strictly monotone and complete */
  size_t n = 0;
  const ms__block_t *prev = NULL;
  for (const ms__block_t *b = ms__pool_first(p); b; b = ms__pool_next(b), n++) {
    if (prev && !pool_less(prev, b)) return false;
    prev = b;
  }
  if (n != p->nblocks || prev != ms__pool_last(p)) return false;
  n = 0;
  const ms__block_t *after = NULL;
  for (const ms__block_t *b = ms__pool_last(p); b; b = ms__pool_prev(b), n++) {
    if (after && !pool_less(b, after)) return false;
    after = b;
  }
  return n == p->nblocks;
}

/* ---- the unmapped set (expandable segments' unmapped ranges, by (stream, ptr)) ---------- */

static inline bool es_less(const ms__block_t *x, const ms__block_t *y) {
  if (x->stream != y->stream) return x->stream < y->stream;
  return x->ptr < y->ptr;
}

/* tl = next in the set, tr = previous. */
void ms__pool_unmapped_insert(ms__pool_t *p, ms__block_t *b) {
  ms__block_t *prev = NULL, *cur = p->unmapped;
  while (cur && es_less(cur, b)) {
    prev = cur;
    cur = cur->tl;
  }
  b->tl = cur;
  b->tr = prev;
  if (cur) cur->tr = b;
  if (prev) prev->tl = b;
  else p->unmapped = b;
}

void ms__pool_unmapped_erase(ms__pool_t *p, ms__block_t *b) {
  if (b->tr) b->tr->tl = b->tl;
  else p->unmapped = b->tl;
  if (b->tl) b->tl->tr = b->tr;
  b->tl = b->tr = NULL;
}
