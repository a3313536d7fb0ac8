/* SPDX-License-Identifier: MIT
 * memsnap core: the block sizes a 4-byte bsize cannot hold (timeline/internal.h, tl_bbig_t).
 *
 * The index keeps, per alloc and free_completed entry, the size of its block: 8 bytes an entry
 * were 38 MB of the 937 MB pickle's peak, for sizes that are multiples of 512 bytes in every
 * trace of PyTorch's allocator. bsize holds them in units of 512 in 4 bytes; a size that is not
 * a multiple, or is 2 TiB or more (a damaged or hand-made trace, an inferred block in an odd
 * gap), is marked TL_BSIZE_BIG there and kept here, by entry.
 */
#include <stdlib.h>

#include "timeline/internal.h"

static size_t bbig_slot(const tl_bbig_t *m, uint32_t key) {
  size_t h = (size_t)(((uint64_t)key * 0x9E3779B97F4A7C15ull) >> 32) & (m->cap - 1);
  while (m->key[h] && m->key[h] != key)
    h = (h + 1) & (m->cap - 1);
  return h;
}

uint64_t ms__tl_bsize_big(const tl_dev_t *d, size_t i) {
  const tl_bbig_t *m = &d->bbig;
  if (!m->cap) return 0;
  size_t h = bbig_slot(m, (uint32_t)i + 1);
  return m->key[h] ? m->val[h] : 0;
}

static int bbig_grow(tl_bbig_t *m) {
  size_t cap = m->cap ? m->cap * 2 : 64;
  tl_bbig_t n = {calloc(cap, sizeof *n.key), malloc(cap * sizeof *n.val), cap, m->len};
  if (!n.key || !n.val) {
    free(n.key);
    free(n.val);
    return MS_ENOMEM;
  }
  for (size_t k = 0; k < m->cap; k++)
    if (m->key[k]) {
      size_t h = bbig_slot(&n, m->key[k]);
      n.key[h] = m->key[k];
      n.val[h] = m->val[k];
    }
  free(m->key);
  free(m->val);
  *m = n;
  return MS_OK;
}

int ms__tl_bsize_set_big(tl_dev_t *d, size_t i, uint64_t size) {
  tl_bbig_t *m = &d->bbig;
  if (i >= UINT32_MAX) return MS_EINVAL; /* an index's entries are uint32_t (pair) */
  if ((m->len + 1) * 2 > m->cap && bbig_grow(m) != MS_OK) return MS_ENOMEM;
  size_t h = bbig_slot(m, (uint32_t)i + 1);
  if (!m->key[h]) {
    m->key[h] = (uint32_t)i + 1;
    m->len++;
  }
  m->val[h] = size;
  d->bsize[i] = TL_BSIZE_BIG;
  return MS_OK;
}

void ms__tl_bsize_free(tl_dev_t *d) {
  free(d->bbig.key);
  free(d->bbig.val);
  d->bbig = (tl_bbig_t){NULL, NULL, 0, 0};
}
