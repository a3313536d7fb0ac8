/* SPDX-License-Identifier: MIT
 * memsnap viz: the frame tree behind every flame graph.
 *
 * Names are interned once (an arena of bytes plus an open-addressing table). A child is found by
 * scanning its parent's short list of children while the parent has fewer than FT_LIST_MAX of
 * them (most nodes: deep stacks are chains), and by (parent, name) in a second hash table once it
 * has more, so wide nodes cost one probe per frame and the table stays small. Nodes are stored
 * as arrays of small fields (16 bytes of topology and 16 bytes of values per node) because the 200,000-stack benchmark input merges into about 3 million nodes
 * (docs/dev/measurements.md, "Flame-graph inputs and SVG size") and peak memory is one of its
 * targets.
 * Flame charts keep input order: a frame merges only with its parent's most recent child.
 */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "flamegraph/internal.h"

#define FT_CHUNK_MIN ((size_t)1 << 16)
/* A parent with this many children has them in the (parent, name) hash table. */
#define FT_LIST_MAX 8

/* Prefaults the grown part of a large node array in one system call. The arrays of a
 * 3-million-node tree are touched page by page as nodes are appended, and in a virtual machine
 * each 4 KiB page fault costs more than filling the page (measured: about a third of the
 * 200,000-stack benchmark's time). Advice only: where the kernel lacks it nothing changes. */
static void ft_prefault(void *p, size_t old_bytes, size_t bytes) {
#ifdef MADV_POPULATE_WRITE
  const uintptr_t page = 4096;
  if (bytes < ((size_t)4 << 20)) return;
  uintptr_t lo = ((uintptr_t)p + old_bytes + page - 1) & ~(page - 1);
  uintptr_t hi = ((uintptr_t)p + bytes) & ~(page - 1);
  if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_POPULATE_WRITE);
#else
  (void)p;
  (void)old_bytes;
  (void)bytes;
#endif
}

static int ft_grow_nodes(ms__ftree_t *t) {
  size_t cap = t->cap ? t->cap * 2 : 1024;
  if (cap > MS__VIZ_MAX_NODES) cap = MS__VIZ_MAX_NODES;
  if (t->n >= cap) return MS_ELIMIT;
  ms__fnode_t *nodes = realloc(t->nodes, cap * sizeof *nodes);
  if (!nodes) return MS_ENOMEM;
  t->nodes = nodes;
  ft_prefault(nodes, t->cap * sizeof *nodes, cap * sizeof *nodes);
  uint64_t **arrays[4] = {&t->total, &t->self, &t->btotal, &t->bself};
  for (int i = 0; i < (t->diff ? 4 : 2); i++) {
    uint64_t *a = realloc(*arrays[i], cap * sizeof *a);
    if (!a) return MS_ENOMEM; /* arrays already grown keep their larger size: harmless */
    *arrays[i] = a;
    ft_prefault(a, t->cap * sizeof *a, cap * sizeof *a);
  }
  uint8_t *k = realloc(t->nkids, cap);
  if (!k) return MS_ENOMEM;
  t->nkids = k;
  t->cap = cap;
  return MS_OK;
}

static uint64_t ft_child_hash(uint32_t parent, uint32_t name) {
  return ms__viz_mum(((uint64_t)parent << 32 | name) ^ 0x9e3779b97f4a7c15ULL,
                     0xe7037ed1a0b428dbULL);
}

static int ft_rehash_children(ms__ftree_t *t, size_t cap) {
  uint32_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return MS_ENOMEM;
  size_t hashed = 0;
  for (size_t i = 1; i < t->n; i++) {
    if (t->nkids[t->nodes[i].parent] < FT_LIST_MAX) continue;
    size_t h = (size_t)ft_child_hash(t->nodes[i].parent, t->nodes[i].name) & (cap - 1);
    while (slots[h]) h = (h + 1) & (cap - 1);
    slots[h] = (uint32_t)i + 1;
    hashed++;
  }
  free(t->child_slots);
  t->child_slots = slots;
  t->child_slot_cap = cap;
  t->child_hashed = hashed;
  return MS_OK;
}

/* Makes room for `more` entries in the child table (load factor at most 1/2). */
static int ft_reserve_children(ms__ftree_t *t, size_t more) {
  size_t cap = t->child_slot_cap;
  while ((t->child_hashed + more) * 2 > cap) cap *= 2;
  return cap == t->child_slot_cap ? MS_OK : ft_rehash_children(t, cap);
}

static void ft_hash_child(ms__ftree_t *t, uint32_t id) {
  size_t mask = t->child_slot_cap - 1;
  size_t h = (size_t)ft_child_hash(t->nodes[id].parent, t->nodes[id].name) & mask;
  while (t->child_slots[h]) h = (h + 1) & mask;
  t->child_slots[h] = id + 1;
  t->child_hashed++;
}

static int ft_rehash_names(ms__ftree_t *t, size_t cap) {
  uint32_t *slots = calloc(cap, sizeof *slots);
  if (!slots) return MS_ENOMEM;
  for (size_t i = 0; i < t->nnames; i++) {
    size_t h = (size_t)ms__viz_hash(t->names[i].ptr, t->names[i].len) & (cap - 1);
    while (slots[h]) h = (h + 1) & (cap - 1);
    slots[h] = (uint32_t)i + 1;
  }
  free(t->name_slots);
  t->name_slots = slots;
  t->name_slot_cap = cap;
  return MS_OK;
}

static uint32_t ft_new_node(ms__ftree_t *t, uint32_t parent, uint32_t name) {
  uint32_t id = (uint32_t)t->n++;
  t->nodes[id] = (ms__fnode_t){.name = name, .parent = parent, .child = MS__VIZ_NONE,
                               .sibling = MS__VIZ_NONE};
  t->total[id] = t->self[id] = 0;
  t->nkids[id] = 0;
  if (t->diff) t->btotal[id] = t->bself[id] = 0;
  if (parent != MS__VIZ_NONE) {
    t->nodes[id].sibling = t->nodes[parent].child;
    t->nodes[parent].child = id;
  }
  return id;
}

int ms__ftree_init(ms__ftree_t *t, int flamechart) {
  t->flamechart = flamechart;
  int err = ft_grow_nodes(t);
  uint32_t name = 0;
  if (!err && !flamechart) err = ft_rehash_children(t, 1024);
  if (!err) err = ft_rehash_names(t, 1024);
  if (!err) err = ms__ftree_intern(t, "all", 3, &name);
  if (err) {
    ms__ftree_release(t);
    return err;
  }
  ft_new_node(t, MS__VIZ_NONE, name);
  return MS_OK;
}

void ms__ftree_release(ms__ftree_t *t) {
  for (size_t i = 0; i < t->nchunks; i++) free(t->chunks[i]);
  free(t->chunks);
  free(t->names);
  free(t->name_slots);
  free(t->nodes);
  free(t->total);
  free(t->self);
  free(t->btotal);
  free(t->bself);
  free(t->child_slots);
  free(t->nkids);
  free(t->path);
  memset(t, 0, sizeof *t);
}

int ms__ftree_make_diff(ms__ftree_t *t) {
  if (t->diff) return MS_OK;
  if (t->total[0] != 0 || t->n > 1) return MS_ESTATE;
  uint64_t *b = calloc(t->cap, sizeof *b), *bs = calloc(t->cap, sizeof *bs);
  if (!b || !bs) {
    free(b);
    free(bs);
    return MS_ENOMEM;
  }
  t->btotal = b;
  t->bself = bs;
  t->diff = 1;
  return MS_OK;
}

static int ft_store_name(ms__ftree_t *t, const char *s, size_t len, const char **out) {
  if (t->nchunks == 0 || t->chunk_cap - t->chunk_used < len) {
    size_t cap = len > FT_CHUNK_MIN ? len : FT_CHUNK_MIN;
    if (t->nchunks) {
      size_t prev = t->chunk_cap * 2;
      if (prev > ((size_t)1 << 24)) prev = (size_t)1 << 24;
      if (cap < prev) cap = prev;
    }
    char **chunks = realloc(t->chunks, (t->nchunks + 1) * sizeof *chunks);
    if (!chunks) return MS_ENOMEM;
    t->chunks = chunks;
    char *c = malloc(cap ? cap : 1);
    if (!c) return MS_ENOMEM;
    t->chunks[t->nchunks++] = c;
    t->chunk_cap = cap;
    t->chunk_used = 0;
  }
  char *dst = t->chunks[t->nchunks - 1] + t->chunk_used;
  if (len) memcpy(dst, s, len);
  t->chunk_used += len;
  *out = dst;
  return MS_OK;
}

int ms__ftree_intern(ms__ftree_t *t, const char *s, size_t len, uint32_t *id) {
  size_t mask = t->name_slot_cap - 1;
  size_t h = (size_t)ms__viz_hash(s, len) & mask;
  for (uint32_t slot; (slot = t->name_slots[h]) != 0; h = (h + 1) & mask) {
    const ms__viz_str_t *n = &t->names[slot - 1];
    if (n->len == len && (len == 0 || memcmp(n->ptr, s, len) == 0)) {
      *id = slot - 1;
      return MS_OK;
    }
  }
  if (t->nnames >= MS__VIZ_MAX_NODES) return MS_ELIMIT;
  if (t->nnames == t->names_cap) {
    size_t cap = t->names_cap ? t->names_cap * 2 : 256;
    ms__viz_str_t *names = realloc(t->names, cap * sizeof *names);
    if (!names) return MS_ENOMEM;
    t->names = names;
    t->names_cap = cap;
  }
  const char *stored;
  int err = ft_store_name(t, s, len, &stored);
  if (err) return err;
  uint32_t nid = (uint32_t)t->nnames++;
  t->names[nid] = (ms__viz_str_t){stored, len};
  t->name_slots[h] = nid + 1;
  if (t->nnames * 2 > t->name_slot_cap) {
    /* Failing to grow the table only makes probing slower; the name is already stored. */
    (void)ft_rehash_names(t, t->name_slot_cap * 2);
  }
  *id = nid;
  return MS_OK;
}

int ms__ftree_child(ms__ftree_t *t, uint32_t parent, uint32_t name, uint32_t *out) {
  if (t->flamechart) {
    uint32_t last = t->nodes[parent].child;
    if (last != MS__VIZ_NONE && t->nodes[last].name == name) {
      *out = last;
      return MS_OK;
    }
    if (t->n == t->cap) MS_FORWARD_ERR(ft_grow_nodes(t));
    *out = ft_new_node(t, parent, name);
    return MS_OK;
  }
  uint8_t k = t->nkids[parent];
  if (k < FT_LIST_MAX) {
    for (uint32_t c = t->nodes[parent].child; c != MS__VIZ_NONE; c = t->nodes[c].sibling) {
      if (t->nodes[c].name == name) {
        *out = c;
        return MS_OK;
      }
    }
    if (t->n == t->cap) MS_FORWARD_ERR(ft_grow_nodes(t));
    if (k + 1 == FT_LIST_MAX) MS_FORWARD_ERR(ft_reserve_children(t, FT_LIST_MAX));
    uint32_t id = ft_new_node(t, parent, name);
    t->nkids[parent] = (uint8_t)(k + 1);
    if (k + 1 == FT_LIST_MAX) {
      for (uint32_t c = t->nodes[parent].child; c != MS__VIZ_NONE; c = t->nodes[c].sibling)
        ft_hash_child(t, c);
    }
    *out = id;
    return MS_OK;
  }
  size_t mask = t->child_slot_cap - 1;
  size_t h = (size_t)ft_child_hash(parent, name) & mask;
  for (uint32_t slot; (slot = t->child_slots[h]) != 0; h = (h + 1) & mask) {
    const ms__fnode_t *c = &t->nodes[slot - 1];
    if (c->parent == parent && c->name == name) {
      *out = slot - 1;
      return MS_OK;
    }
  }
  if (t->n == t->cap) MS_FORWARD_ERR(ft_grow_nodes(t));
  MS_FORWARD_ERR(ft_reserve_children(t, 1));
  uint32_t id = ft_new_node(t, parent, name);
  ft_hash_child(t, id);
  *out = id;
  return MS_OK;
}

int ms__ftree_can_add(const ms__ftree_t *t, uint64_t before, uint64_t after) {
  const uint64_t lim = (uint64_t)1 << 63;
  if (after >= lim || t->total[0] >= lim - after) return 0;
  if (t->diff && (before >= lim || t->btotal[0] >= lim - before)) return 0;
  return 1;
}

void ms__ftree_credit(ms__ftree_t *t, const uint32_t *path, size_t depth, uint64_t before,
                      uint64_t after) {
  t->total[0] += after;
  for (size_t i = 0; i < depth; i++) t->total[path[i]] += after;
  t->self[depth ? path[depth - 1] : 0] += after;
  if (t->diff) {
    t->btotal[0] += before;
    for (size_t i = 0; i < depth; i++) t->btotal[path[i]] += before;
    t->bself[depth ? path[depth - 1] : 0] += before;
  }
}

int ms__ftree_add(ms__ftree_t *t, const char *const *fptr, const size_t *flen, size_t n,
                  size_t reuse, int reverse, uint64_t before, uint64_t after) {
  if (!ms__ftree_can_add(t, before, after)) return MS_ELIMIT;
  if (n > MS__VIZ_MAX_NODES) return MS_ELIMIT;
  if (n > t->path_cap) {
    size_t cap = t->path_cap ? t->path_cap : 64;
    while (cap < n) cap *= 2;
    uint32_t *p = realloc(t->path, cap * sizeof *p);
    if (!p) return MS_ENOMEM;
    t->path = p;
    t->path_cap = cap;
  }
  uint32_t parent = reuse ? t->path[reuse - 1] : 0;
  for (size_t i = reuse; i < n; i++) {
    size_t k = reverse ? n - 1 - i : i;
    uint32_t name;
    MS_FORWARD_ERR(ms__ftree_intern(t, fptr[k], flen[k], &name));
    MS_FORWARD_ERR(ms__ftree_child(t, parent, name, &parent));
    t->path[i] = parent;
  }
  ms__ftree_credit(t, t->path, n, before, after);
  return MS_OK;
}

void ms__ftree_widths(const ms__ftree_t *t, uint64_t *w) {
  if (!t->diff) {
    memcpy(w, t->total, t->n * sizeof *w);
    return;
  }
  /* Children have larger indices than their parents: one backward pass sums them first. */
  memset(w, 0, t->n * sizeof *w);
  for (size_t i = t->n; i-- > 0;) {
    uint64_t m = t->total[i] > t->btotal[i] ? t->total[i] : t->btotal[i];
    if (w[i] < m) w[i] = m; /* w[i] holds the sum of the children's widths so far */
    uint32_t p = t->nodes[i].parent;
    if (p != MS__VIZ_NONE) {
      uint64_t s = w[p] + w[i];
      w[p] = s < w[p] ? UINT64_MAX : s;
    }
  }
}

int ms__ftree_is_valid(const ms__ftree_t *t) {
  if (t->n == 0 || t->nodes[0].parent != MS__VIZ_NONE) return 0;
  uint64_t *sum = calloc(t->n, sizeof *sum), *bsum = calloc(t->n, sizeof *bsum);
  int ok = sum && bsum;
  for (size_t i = 1; ok && i < t->n; i++) {
    uint32_t p = t->nodes[i].parent;
    if (p >= i) ok = 0;
    else {
      sum[p] += t->total[i];
      if (t->diff) bsum[p] += t->btotal[i];
    }
  }
  for (size_t i = 0; ok && i < t->n; i++) {
    if (t->total[i] != t->self[i] + sum[i]) ok = 0;
    if (t->diff && t->btotal[i] != t->bself[i] + bsum[i]) ok = 0;
  }
  free(sum);
  free(bsum);
  return ok;
}
