/* SPDX-License-Identifier: MIT
 * memsnap viewer: the snapshot's stacks as binary sections (stacks.h).
 *
 * A stack is written from its outermost frame in, each frame as its rank among the frames seen
 * so far right inside the frame before it (its context; the outermost frame's context is the
 * root). Stacks of one program repeat the same calls: after a Python frame comes the
 * interpreter's, after an operator its kernel, so most ranks are 0 or small and the page's data
 * compresses several times better than frame numbers do, while every stack still has its own
 * frames. The successor lists (per context, in order of first use) give the frames back.
 */
#include "stacks.h"

#include <stdlib.h>
#include <string.h>

#include "memsnap/error.h"

/* (context, frame) -> rank: open addressing on the pair packed in 64 bits (value rank + 1), key
 * and value side by side so that a probe touches one cache line */
typedef struct vs_slot_s {
  uint64_t key;
  uint32_t val;
} vs_slot_t;
typedef struct vs_map_s {
  vs_slot_t *slot;
  size_t cap, len;
} vs_map_t;

static size_t vs_hash(uint64_t k, size_t cap) {
  return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 20) & (cap - 1);
}

static int vs_grow(vs_map_t *m) {
  size_t cap = m->cap ? 2 * m->cap : 4096;
  vs_slot_t *slot = calloc(cap, sizeof *slot);
  if (!slot) return MS_ENOMEM;
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->slot[i].val) continue;
    size_t h = vs_hash(m->slot[i].key, cap);
    while (slot[h].val) h = (h + 1) & (cap - 1);
    slot[h] = m->slot[i];
  }
  free(m->slot);
  m->slot = slot;
  m->cap = cap;
  return MS_OK;
}

/* The slot of k (its value 0 when absent). */
static vs_slot_t *vs_slot(const vs_map_t *m, uint64_t k) {
  size_t h = vs_hash(k, m->cap);
  while (m->slot[h].val && m->slot[h].key != k) h = (h + 1) & (m->cap - 1);
  return &m->slot[h];
}

#define VS_SMALL 8 /* a context's first successors are kept in a short list, not the map */

typedef struct vs_ctx_s {
  vs_map_t map;
  uint32_t *small;     /* per context: its first VS_SMALL successors, in rank order */
  uint32_t *nsucc;     /* per context: successors so far */
  uint32_t *last;      /* per context: the last successor seen (a cache of the map) */
  uint32_t *last_rank; /* its rank */
  uint64_t *pairs;     /* (context << 32 | frame) in order of first use */
  size_t npairs, cap_pairs;
} vs_ctx_t;

static int vs_pair(vs_ctx_t *c, uint64_t k) {
  if (c->npairs == c->cap_pairs) {
    size_t cap = c->cap_pairs ? 2 * c->cap_pairs : 4096;
    uint64_t *p = realloc(c->pairs, cap * sizeof *p);
    if (!p) return MS_ENOMEM;
    c->pairs = p;
    c->cap_pairs = cap;
  }
  c->pairs[c->npairs++] = k;
  return MS_OK;
}

/* (k, rank + 1) into the map */
static int vs_put(vs_map_t *m, uint64_t k, uint32_t val) {
  if ((m->len + 1) * 2 > m->cap && vs_grow(m)) return MS_ENOMEM;
  vs_slot_t *h = vs_slot(m, k);
  h->key = k;
  h->val = val;
  m->len++;
  return MS_OK;
}

/* The rank of frame f after context ctx, new successors numbered in order of first use: a
 * context's first VS_SMALL successors are found in its short list (most contexts have no more:
 * after a Python frame comes the interpreter's), the others in the map. */
static int vs_rank(vs_ctx_t *c, uint32_t ctx, uint32_t f, uint32_t *rank) {
  if (c->last[ctx] == f) {
    *rank = c->last_rank[ctx];
    return MS_OK;
  }
  uint32_t n = c->nsucc[ctx], *l = c->small + (size_t)ctx * VS_SMALL, r = UINT32_MAX;
  uint64_t k = (uint64_t)ctx << 32 | f;
  for (uint32_t i = 0; i < n && i < VS_SMALL; i++)
    if (l[i] == f) r = i;
  if (r == UINT32_MAX && n < VS_SMALL) {
    if (vs_pair(c, k)) return MS_ENOMEM;
    l[n] = f;
    r = c->nsucc[ctx]++;
  } else if (r == UINT32_MAX) {
    if (n == VS_SMALL) /* the list is full: from now on the map holds them all */
      for (uint32_t i = 0; i < VS_SMALL; i++)
        if (vs_put(&c->map, (uint64_t)ctx << 32 | l[i], i + 1)) return MS_ENOMEM;
    if ((c->map.len + 1) * 2 > c->map.cap && vs_grow(&c->map)) return MS_ENOMEM;
    vs_slot_t *h = vs_slot(&c->map, k);
    if (!h->val) {
      if (vs_pair(c, k)) return MS_ENOMEM;
      h->key = k;
      h->val = ++c->nsucc[ctx];
      c->map.len++;
    }
    r = h->val - 1;
  }
  *rank = r;
  c->last[ctx] = f;
  c->last_rank[ctx] = *rank;
  return MS_OK;
}

static void vs_count(vb_t *b, uint32_t v, bool byte) {
  if (byte) vb_u8(b, (uint8_t)v);
  else vb_u32(b, v);
}

/* stacks.count, stacks.ranks (a byte per frame: the rank, 255 for one of 255 or more, which is
 * then in stacks.ranks_big) and per stack the number of those (stacks.nbig). The big ranks wait
 * in memory until the byte ranks are written (a few per stack). */
static int vs_ranks(vb_t *b, const ms_snapshot_t *s, vs_ctx_t *c, bool small) {
  uint32_t maxn = 0;
  for (size_t i = 0; i < s->nstacks; i++)
    if (s->stacks[i].nframes > maxn) maxn = s->stacks[i].nframes;
  bool byte = maxn < 256;
  vb_begin(b, "stacks.count", byte ? "u8" : "u32");
  for (size_t i = 0; i < s->nstacks; i++) vs_count(b, s->stacks[i].nframes, byte);
  vb_end(b);
  uint32_t root = (uint32_t)s->nframes, *nbig = calloc(s->nstacks ? s->nstacks : 1, sizeof *nbig);
  /* the big ranks, u16 (small) or u32 as they will be written */
  unsigned char *big = NULL;
  size_t nb = 0, cap = 0, esz = small ? 2 : 4;
  int rc = nbig ? MS_OK : MS_ENOMEM;
  vb_begin(b, "stacks.ranks", "u8");
  for (size_t i = 0; i < s->nstacks && rc == MS_OK; i++) {
    const ms_snap_stack_t *st = &s->stacks[i];
    uint32_t ctx = root, r = 0;
    for (uint32_t k = st->nframes; k-- > 0 && rc == MS_OK;) {
      uint32_t f = ms_snap_frame_index(s, st->first + k);
      if (f >= root) rc = MS_EINVAL; /* the reader never gives one: no frame to name */
      else rc = vs_rank(c, ctx, f, &r);
      if (rc == MS_OK && r >= 255) {
        if (nb == cap) {
          cap = cap ? 2 * cap : 4096;
          unsigned char *p = realloc(big, cap * esz);
          if (!p) rc = MS_ENOMEM;
          else big = p;
        }
        if (rc == MS_OK) {
          uint16_t r16 = (uint16_t)r;
          memcpy(big + esz * nb++, small ? (const void *)&r16 : (const void *)&r, esz);
          nbig[i]++;
        }
      }
      vb_u8(b, r < 255 ? (uint8_t)r : 255);
      ctx = f;
    }
  }
  vb_end(b);
  if (rc == MS_OK) {
    vb_begin(b, "stacks.nbig", byte ? "u8" : "u32");
    for (size_t i = 0; i < s->nstacks; i++) vs_count(b, nbig[i], byte);
    vb_end(b);
    vb_begin(b, "stacks.ranks_big", small ? "u16" : "u32");
    for (size_t i = 0; i < nb; i++) {
      uint16_t r16;
      uint32_t r32;
      if (small) memcpy(&r16, big + 2 * i, 2), vb_u16(b, r16);
      else memcpy(&r32, big + 4 * i, 4), vb_u32(b, r32);
    }
    vb_end(b);
  }
  free(nbig);
  free(big);
  return rc;
}

/* stacks.succ_count (per context, the root last) and stacks.succ (the lists, context by
 * context, each in rank order) */
static int vs_successors(vb_t *b, const ms_snapshot_t *s, vs_ctx_t *c, bool small) {
  size_t nctx = s->nframes + 1;
  vb_begin(b, "stacks.succ_count", "u32");
  for (size_t i = 0; i < nctx; i++) vb_u32(b, c->nsucc[i]);
  vb_end(b);
  /* counting sort of the pairs by context: rank order is first-use order within a context */
  size_t *at = malloc((nctx + 1) * sizeof *at);
  uint32_t *out = malloc((c->npairs ? c->npairs : 1) * sizeof *out);
  if (!at || !out) {
    free(at);
    free(out);
    return MS_ENOMEM;
  }
  at[0] = 0;
  for (size_t i = 0; i < nctx; i++) at[i + 1] = at[i] + c->nsucc[i];
  for (size_t i = 0; i < c->npairs; i++) out[at[c->pairs[i] >> 32]++] = (uint32_t)c->pairs[i];
  vb_begin(b, "stacks.succ", small ? "u16" : "u32");
  for (size_t i = 0; i < c->npairs; i++) {
    if (small) vb_u16(b, (uint16_t)out[i]);
    else vb_u32(b, out[i]);
  }
  vb_end(b);
  free(at);
  free(out);
  return MS_OK;
}

int vs_write_stacks(vb_t *b, const ms_snapshot_t *s) {
  size_t nctx = s->nframes + 1;
  bool small = s->nframes < 65536;
  vs_ctx_t c;
  memset(&c, 0, sizeof c);
  c.nsucc = calloc(nctx, sizeof *c.nsucc);
  c.last = malloc(nctx * sizeof *c.last);
  c.last_rank = malloc(nctx * sizeof *c.last_rank);
  c.small = malloc(nctx * VS_SMALL * sizeof *c.small);
  int rc = c.nsucc && c.last && c.last_rank && c.small ? MS_OK : MS_ENOMEM;
  if (rc == MS_OK) {
    memset(c.last, 0xff, nctx * sizeof *c.last); /* no frame is UINT32_MAX */
    rc = vs_ranks(b, s, &c, small);
  }
  if (rc == MS_OK) rc = vs_successors(b, s, &c, small);
  free(c.map.slot);
  free(c.nsucc);
  free(c.last);
  free(c.last_rank);
  free(c.small);
  free(c.pairs);
  return rc;
}
