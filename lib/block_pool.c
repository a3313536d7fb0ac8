/* SPDX-License-Identifier: MIT
 * memsnap core: free-block sets ordered by (stream, size, address), PyTorch's BlockPool::blocks
 * (reference/pytorch-allocator.md §3.2).
 *
 * The set is an intrusive treap with parent links: a binary search tree by key whose node
 * priorities (a hash of the block's address and size) form a max-heap, so its expected depth is
 * O(log n) whatever the insertion order. Best fit is lower_bound(stream, size, 0): the smallest
 * block of that stream that fits, lowest address on ties. Parent links give in-order successor
 * and predecessor for the ordered walks of release_blocks and release_available_cached_blocks.
 * No memory is allocated here: the links live in the blocks.
 */
#include "types.h"
#include "util/hash.h"

void ms__pool_init(ms__pool_t *p, bool is_small, ms__private_pool_t *owner) {
  p->root = NULL;
  p->nblocks = 0;
  p->is_small = is_small;
  p->owner = owner;
  p->get_free_blocks_call_count = 0;
  p->unmapped = NULL;
}

/* Strict (stream, size, ptr) order. */
static inline bool pool_less(const ms__block_t *a, const ms__block_t *b) {
  if (a->stream != b->stream) return a->stream < b->stream;
  if (a->size != b->size) return a->size < b->size;
  return a->ptr < b->ptr;
}

/* Rotates x above its parent. */
static void pool_rotate_up(ms__pool_t *p, ms__block_t *x) {
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
  if (!g) p->root = x;
  else if (g->tl == par) g->tl = x;
  else g->tr = x;
}

void ms__pool_insert(ms__pool_t *p, ms__block_t *b) {
  ms_assert_internal(!b->in_set);
  b->gc_count_base = p->get_free_blocks_call_count;
  b->prio = (uint32_t)ms_hash_u64((uint64_t)b->ptr ^ ((uint64_t)b->size << 1));
  b->tl = b->tr = NULL;
  ms__block_t *par = NULL, **link = &p->root;
  while (*link) {
    par = *link;
    link = pool_less(b, par) ? &par->tl : &par->tr;
  }
  *link = b;
  b->tp = par;
  while (b->tp && b->tp->prio < b->prio) pool_rotate_up(p, b);
  b->in_set = true;
  p->nblocks++;
}

void ms__pool_erase(ms__pool_t *p, ms__block_t *b) {
  ms_assert_internal(b->in_set);
  while (b->tl && b->tr) pool_rotate_up(p, b->tl->prio > b->tr->prio ? b->tl : b->tr);
  ms__block_t *c = b->tl ? b->tl : b->tr;
  if (c) c->tp = b->tp;
  if (!b->tp) p->root = c;
  else if (b->tp->tl == b) b->tp->tl = c;
  else b->tp->tr = c;
  b->tl = b->tr = b->tp = NULL;
  b->in_set = false;
  p->nblocks--;
}

ms__block_t *ms__pool_lower_bound(const ms__pool_t *p, ms_stream_t stream, size_t size) {
  ms__block_t *res = NULL, *n = p->root;
  while (n) {
    bool less = n->stream < stream || (n->stream == stream && n->size < size);
    if (less) {
      n = n->tr;
    } else {
      res = n;
      n = n->tl;
    }
  }
  return res;
}

ms__block_t *ms__pool_first(const ms__pool_t *p) {
  ms__block_t *n = p->root;
  if (n)
    while (n->tl) n = n->tl;
  return n;
}

ms__block_t *ms__pool_last(const ms__pool_t *p) {
  ms__block_t *n = p->root;
  if (n)
    while (n->tr) n = n->tr;
  return n;
}

ms__block_t *ms__pool_next(const ms__block_t *b) {
  if (b->tr) {
    ms__block_t *n = b->tr;
    while (n->tl) n = n->tl;
    return n;
  }
  while (b->tp && b->tp->tr == b) b = b->tp;
  return b->tp;
}

ms__block_t *ms__pool_prev(const ms__block_t *b) {
  if (b->tl) {
    ms__block_t *n = b->tl;
    while (n->tr) n = n->tr;
    return n;
  }
  while (b->tp && b->tp->tl == b) b = b->tp;
  return b->tp;
}

static size_t pool_check_subtree(const ms__block_t *n, const ms__block_t *parent, bool *ok) {
  if (!n) return 0;
  if (n->tp != parent || !n->in_set) *ok = false;
  if (parent && n->prio > parent->prio) *ok = false;
  if (n->tl && !pool_less(n->tl, n)) *ok = false;
  if (n->tr && !pool_less(n, n->tr)) *ok = false;
  return 1 + pool_check_subtree(n->tl, n, ok) + pool_check_subtree(n->tr, n, ok);
}

bool ms__pool_is_valid(const ms__pool_t *p) {
  bool ok = true;
  size_t n = pool_check_subtree(p->root, NULL, &ok);
  if (n != p->nblocks) return false;
  /* in-order walk strictly increasing */
  const ms__block_t *prev = NULL;
  for (const ms__block_t *b = ms__pool_first(p); b; b = ms__pool_next(b)) {
    if (prev && !pool_less(prev, b)) return false;
    if (b->pool != p) return false;
    prev = b;
  }
  return ok;
}
