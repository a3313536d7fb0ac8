/* SPDX-License-Identifier: MIT
 * memsnap core: a segment's live blocks, sorted by address (timeline/internal.h, tl_blks_t).
 *
 * The time index undoes and redoes millions of entries, each adding or removing one block of one
 * segment. In one array sorted by address, that moved every block above it: a segment holding
 * 50,000 live blocks (an expandable segment, or the viewer's worst shape in bench_view_worst)
 * cost 1.8 MB of moves per entry, and a pass over a 200,000-entry trace seconds. The blocks are
 * in chunks instead: a chunk grows by doubling up to TL_BLK_CHUNK blocks and then splits in two;
 * a chunk left empty goes. A change moves at most one chunk's blocks and the chunk pointers
 * after it; a segment of a few blocks is one small chunk, as the array was.
 */
#include <stdlib.h>
#include <string.h>

#include "timeline/internal.h"

static tl_bchunk_t *tl_chunk_new(size_t cap) {
  tl_bchunk_t *c = malloc(sizeof *c + cap * sizeof c->b[0]);
  if (c) {
    c->n = 0;
    c->cap = (uint32_t)cap;
  }
  return c;
}

/* Room for `more` chunk pointers. */
static int tl_chunks_reserve(tl_blks_t *v, size_t more) {
  if (v->nch + more <= v->cap) return MS_OK;
  size_t cap = v->cap ? v->cap * 2 : 1;
  while (cap < v->nch + more)
    cap *= 2;
  tl_bchunk_t **ch = realloc(v->ch, cap * sizeof *ch);
  if (!ch) return MS_ENOMEM;
  v->ch = ch;
  v->cap = cap;
  return MS_OK;
}

/* Chunk c inserted at position at of v's chunks (pre: room reserved). */
static void tl_chunks_put(tl_blks_t *v, size_t at, tl_bchunk_t *c) {
  memmove(v->ch + at + 1, v->ch + at, (v->nch - at) * sizeof *v->ch);
  v->ch[at] = c;
  v->nch++;
}

/* Room for one more block in the chunk at *p: the chunk grown, or split in two (*p then names
 * the place in the half that holds it). */
static int tl_chunk_room(tl_blks_t *v, tl_bpos_t *p) {
  tl_bchunk_t *c = v->ch[p->c];
  if (c->n < c->cap) return MS_OK;
  if (c->cap < TL_BLK_CHUNK) {
    size_t cap = c->cap * 2 < TL_BLK_CHUNK ? c->cap * 2 : TL_BLK_CHUNK;
    tl_bchunk_t *g = realloc(c, sizeof *c + cap * sizeof c->b[0]);
    if (!g) return MS_ENOMEM;
    g->cap = (uint32_t)cap;
    v->ch[p->c] = g;
    return MS_OK;
  }
  if (tl_chunks_reserve(v, 1)) return MS_ENOMEM;
  tl_bchunk_t *hi = tl_chunk_new(TL_BLK_CHUNK);
  if (!hi) return MS_ENOMEM;
  uint32_t half = c->n / 2;
  hi->n = c->n - half;
  memcpy(hi->b, c->b + half, hi->n * sizeof c->b[0]);
  c->n = half;
  tl_chunks_put(v, p->c + 1, hi);
  if (p->o > half) {
    p->c++;
    p->o -= half;
  }
  return MS_OK;
}

int ms__tl_blk_insert(tl_blks_t *v, tl_bpos_t p, const ms_tl_block_t *b) {
  if (v->nch == 0) {
    if (tl_chunks_reserve(v, 1)) return MS_ENOMEM;
    tl_bchunk_t *c = tl_chunk_new(4);
    if (!c) return MS_ENOMEM;
    tl_chunks_put(v, 0, c);
    p = (tl_bpos_t){0, 0};
  } else if (p.c == v->nch) { /* past the last block: the last chunk's end */
    p.c = v->nch - 1;
    p.o = v->ch[p.c]->n;
  }
  if (tl_chunk_room(v, &p)) return MS_ENOMEM;
  tl_bchunk_t *c = v->ch[p.c];
  memmove(c->b + p.o + 1, c->b + p.o, (c->n - p.o) * sizeof c->b[0]);
  c->b[p.o] = *b;
  c->n++;
  v->len++;
  return MS_OK;
}

void ms__tl_blk_remove(tl_blks_t *v, tl_bpos_t p) {
  tl_bchunk_t *c = v->ch[p.c];
  memmove(c->b + p.o, c->b + p.o + 1, (c->n - p.o - 1) * sizeof c->b[0]);
  c->n--;
  v->len--;
  if (c->n > 0) return;
  free(c);
  memmove(v->ch + p.c, v->ch + p.c + 1, (v->nch - p.c - 1) * sizeof *v->ch);
  v->nch--;
}

size_t ms__tl_blk_copy(const tl_blks_t *v, ms_tl_block_t *dst) {
  size_t k = 0;
  for (size_t i = 0; i < v->nch; i++) {
    memcpy(dst + k, v->ch[i]->b, v->ch[i]->n * sizeof *dst);
    k += v->ch[i]->n;
  }
  return k;
}

int ms__tl_blk_load(tl_blks_t *v, const ms_tl_block_t *src, size_t n) {
  if (n == 0) return MS_OK;
  if (tl_chunks_reserve(v, (n + TL_BLK_CHUNK - 1) / TL_BLK_CHUNK)) return MS_ENOMEM;
  for (size_t k = 0; k < n; k += TL_BLK_CHUNK) {
    size_t m = n - k < TL_BLK_CHUNK ? n - k : TL_BLK_CHUNK;
    tl_bchunk_t *c = tl_chunk_new(m < 4 ? 4 : m);
    if (!c) return MS_ENOMEM;
    memcpy(c->b, src + k, m * sizeof *src);
    c->n = (uint32_t)m;
    v->ch[v->nch++] = c;
    v->len += m;
  }
  return MS_OK;
}

int ms__tl_blk_split(tl_blks_t *v, tl_bpos_t p, tl_blks_t *tail) {
  if (p.c == v->nch) return MS_OK;
  size_t first = p.c; /* the first chunk that moves whole */
  tl_bchunk_t *part = NULL;
  if (p.o > 0) {
    tl_bchunk_t *c = v->ch[p.c];
    part = tl_chunk_new(c->n - p.o < 4 ? 4 : c->n - p.o);
    if (!part) return MS_ENOMEM;
    part->n = (uint32_t)(c->n - p.o);
    first = p.c + 1;
  }
  if (tl_chunks_reserve(tail, (part ? 1 : 0) + v->nch - first)) {
    free(part);
    return MS_ENOMEM;
  }
  if (part) {
    tl_bchunk_t *c = v->ch[p.c];
    memcpy(part->b, c->b + p.o, part->n * sizeof c->b[0]);
    c->n = (uint32_t)p.o;
    tail->ch[tail->nch++] = part;
    tail->len += part->n;
  }
  for (size_t i = first; i < v->nch; i++) {
    tail->ch[tail->nch++] = v->ch[i];
    tail->len += v->ch[i]->n;
  }
  v->len -= tail->len;
  v->nch = first;
  return MS_OK;
}

int ms__tl_blk_append(tl_blks_t *v, tl_blks_t *src) {
  if (src->nch == 0) return MS_OK;
  if (tl_chunks_reserve(v, src->nch)) return MS_ENOMEM;
  memcpy(v->ch + v->nch, src->ch, src->nch * sizeof *v->ch);
  v->nch += src->nch;
  v->len += src->len;
  src->nch = 0;
  src->len = 0;
  return MS_OK;
}

void ms__tl_blk_free(tl_blks_t *v) {
  for (size_t i = 0; i < v->nch; i++)
    free(v->ch[i]);
  free(v->ch);
  memset(v, 0, sizeof *v);
}
