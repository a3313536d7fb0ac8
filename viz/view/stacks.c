/* SPDX-License-Identifier: MIT
 * memsnap viewer: the snapshot's stacks as binary sections (stacks.h).
 *
 * Two passes over the stacks: the first finds every (context, successor) pair and counts its
 * uses, which ranks each context's successors (most used first) and tells which contexts have
 * one successor; the second writes the ranks of the steps that carry a choice. Stacks of one
 * program repeat the same calls, so most contexts have one successor or a few, and the written
 * ranks are few and small.
 */
#include "stacks.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/error.h"

/* (context, successor) -> pair number + 1: open addressing on the pair packed in 64 bits, key and
 * value side by side so that a probe touches one cache line */
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

/* The slot of k (its value 0 when absent; the map is never full). */
static vs_slot_t *vs_slot(const vs_map_t *m, uint64_t k) {
  size_t h = vs_hash(k, m->cap);
  while (m->slot[h].val && m->slot[h].key != k) h = (h + 1) & (m->cap - 1);
  return &m->slot[h];
}

static int vs_put(vs_map_t *m, uint64_t k, uint32_t val) {
  if ((m->len + 1) * 2 > m->cap && vs_grow(m)) return MS_ENOMEM;
  vs_slot_t *h = vs_slot(m, k);
  h->key = k;
  h->val = val;
  m->len++;
  return MS_OK;
}

#define VS_SMALL 8 /* a context's first successors are kept in a short list */
/* A context with more successors gets a row: per frame its pair + 1 (0: none yet), then, once
 * ranked, its rank + 1; one load per step where a list would be searched or a pair hashed. Rows
 * take nframes + 1 entries each, and all of them together at most VS_ROWS_MAX (32 MiB): the
 * contexts past that keep their pairs in the map. */
#define VS_ROWS_MAX ((size_t)1 << 23)

struct vs_plan_s {
  vs_map_t map;     /* the pairs of contexts with more than VS_SMALL successors and no row */
  uint32_t **row;   /* per context: its row, or NULL */
  size_t nrows;      /* contexts (the length of row) */
  size_t nrow_entries; /* the entries of every row so far */
  uint32_t *small;  /* per context: its first VS_SMALL successors */
  uint32_t *small_p; /* and their pairs */
  uint32_t *nsucc;  /* per context: its successors */
  uint32_t *last;   /* per context: the last successor seen (a cache of the lookup) */
  uint32_t *last_p; /* its pair */
  uint64_t *pairs;  /* per pair, numbered in order of first use: context << 32 | successor */
  uint32_t *uses;   /* per pair: its uses (first pass), then its rank in its context */
  uint32_t *succ;   /* the successors, context by context, in rank order (stacks.succ) */
  size_t *start;    /* per context: where its successors start in succ */
  struct vs_wide_s *x; /* the second pass's ranks (all of the rank sections) */
  size_t npairs, cap_pairs;
};
typedef vs_plan_t vs_ctx_t;

static int vs_new_pair(vs_ctx_t *c, uint64_t k, uint32_t *p) {
  if (c->npairs == c->cap_pairs) {
    size_t cap = c->cap_pairs ? 2 * c->cap_pairs : 4096;
    uint64_t *np = realloc(c->pairs, cap * sizeof *np);
    if (np) c->pairs = np;
    uint32_t *nu = np ? realloc(c->uses, cap * sizeof *nu) : NULL;
    if (!nu) return MS_ENOMEM;
    c->uses = nu;
    c->cap_pairs = cap;
  }
  if (c->npairs >= UINT32_MAX - 1) return MS_ELIMIT;
  *p = (uint32_t)c->npairs;
  c->pairs[c->npairs] = k;
  c->uses[c->npairs++] = 0;
  return MS_OK;
}

/* Context ctx, whose short list is full, gets a row (or, past the budget, its pairs go into the
 * map). */
static int vs_widen(vs_ctx_t *c, uint32_t ctx, size_t nctx) {
  const uint32_t *l = c->small + (size_t)ctx * VS_SMALL, *lp = c->small_p + (size_t)ctx * VS_SMALL;
  if (c->nrow_entries + nctx <= VS_ROWS_MAX) {
    uint32_t *row = calloc(nctx, sizeof *row);
    if (!row) return MS_ENOMEM;
    for (uint32_t i = 0; i < VS_SMALL; i++) row[l[i]] = lp[i] + 1;
    c->row[ctx] = row;
    c->nrow_entries += nctx;
    return MS_OK;
  }
  for (uint32_t i = 0; i < VS_SMALL; i++)
    if (vs_put(&c->map, c->pairs[lp[i]], lp[i] + 1)) return MS_ENOMEM;
  return MS_OK;
}

/* The pair (ctx, f) of the first pass, added when absent. */
static int vs_pair(vs_ctx_t *c, uint32_t ctx, uint32_t f, size_t nctx, uint32_t *p) {
  uint32_t n = c->nsucc[ctx], found = UINT32_MAX;
  uint32_t *row = c->row[ctx];
  uint64_t k = (uint64_t)ctx << 32 | f;
  if (row) {
    found = row[f] - 1; /* UINT32_MAX when absent */
  } else if (n <= VS_SMALL) {
    const uint32_t *l = c->small + (size_t)ctx * VS_SMALL;
    for (uint32_t i = 0; i < n; i++)
      if (l[i] == f) found = c->small_p[(size_t)ctx * VS_SMALL + i];
  } else {
    vs_slot_t *h = vs_slot(&c->map, k);
    if (h->val) found = h->val - 1;
  }
  if (found == UINT32_MAX) {
    int rc = vs_new_pair(c, k, &found);
    if (rc == MS_OK && n == VS_SMALL) rc = vs_widen(c, ctx, nctx);
    if (rc != MS_OK) return rc;
    row = c->row[ctx];
    if (n < VS_SMALL) {
      c->small[(size_t)ctx * VS_SMALL + n] = f;
      c->small_p[(size_t)ctx * VS_SMALL + n] = found;
    } else if (row) {
      row[f] = found + 1;
    } else if (vs_put(&c->map, k, found + 1)) {
      return MS_ENOMEM;
    }
    c->nsucc[ctx]++;
  }
  c->last[ctx] = f;
  c->last_p[ctx] = found;
  *p = found;
  return MS_OK;
}

/* The rank of the step (ctx, f) of the second pass (every pair was found by the first; a
 * context's row holds ranks by then, its succ list is in rank order). */
static int vs_rank_of(const vs_ctx_t *c, uint32_t ctx, uint32_t f, uint32_t *r) {
  const uint32_t *row = c->row[ctx];
  uint32_t n = c->nsucc[ctx];
  if (row) {
    *r = row[f] - 1;
    return row[f] ? MS_OK : MS_EINVAL;
  }
  if (n <= VS_SMALL) {
    const uint32_t *l = c->succ + c->start[ctx];
    for (uint32_t i = 0; i < n; i++)
      if (l[i] == f) {
        *r = i;
        return MS_OK;
      }
    return MS_EINVAL;
  }
  const vs_slot_t *h = vs_slot(&c->map, (uint64_t)ctx << 32 | f);
  if (!h->val) return MS_EINVAL;
  *r = c->uses[h->val - 1];
  return MS_OK;
}

/* Bytes buffered for a section written later. */
typedef struct vs_buf_s {
  unsigned char *p;
  size_t n, cap;
} vs_buf_t;

static int vs_buf_grow(vs_buf_t *b, size_t len) {
  if (b->n + len > b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 65536;
    unsigned char *p = realloc(b->p, cap);
    if (!p) return MS_ENOMEM;
    b->p = p;
    b->cap = cap;
  }
  return MS_OK;
}

static int vs_buf_put(vs_buf_t *b, const void *v, size_t len) {
  if (b->n + len > b->cap && vs_buf_grow(b, len)) return MS_ENOMEM;
  memcpy(b->p + b->n, v, len);
  b->n += len;
  return MS_OK;
}

static inline int vs_buf_byte(vs_buf_t *b, unsigned char v) {
  if (b->n == b->cap && vs_buf_grow(b, 1)) return MS_ENOMEM;
  b->p[b->n++] = v;
  return MS_OK;
}

/* The rank sections, kept in memory until they are written, in parts: the second pass walks the
 * stacks part by part, each part on whichever thread takes it (vs_plan_work), into buffers of its
 * own; the sections are the parts' buffers one after the other. */
#define VS_EVERY 64
#define VS_PARTS 64 /* about: parts are whole multiples of VS_EVERY stacks */
typedef struct vs_part_s {
  vs_buf_t ranks, hi, lo, big;
  uint64_t nranks;
} vs_part_t;

typedef struct vs_wide_s {
  vs_part_t *part;
  size_t nparts, per_part; /* per_part stacks each (the last fewer) */
  pthread_mutex_t mu;      /* next and rc */
  size_t next;             /* the next part to walk */
  int rc;                  /* the first error of a part's walk */
  /* where every VS_EVERY-th stack starts in each rank section ([4][nck]): from its part's start
   * until vs_sections adds the parts before */
  uint64_t *at;
  size_t nck;
} vs_wide_t;

/* Keeps rank r of a step from a context with n successors (stacks.h). */
static int vs_put_rank(vs_part_t *x, uint32_t r, uint32_t n) {
  if (n <= 256) {
    x->nranks++;
    return vs_buf_byte(&x->ranks, (unsigned char)r);
  }
  unsigned char hi = r < 255 * 256 ? (unsigned char)(r >> 8) : 255;
  if (vs_buf_byte(&x->hi, hi)) return MS_ENOMEM;
  if (hi < 255) return vs_buf_byte(&x->lo, (unsigned char)r);
  unsigned char le[4] = {(unsigned char)r, (unsigned char)(r >> 8), (unsigned char)(r >> 16),
                         (unsigned char)(r >> 24)};
  return vs_buf_put(&x->big, le, 4);
}

/* A pass over stacks [i0, i1): the first (x NULL) finds and counts the pairs, the second keeps
 * the ranks of the steps from contexts with more than one successor in part x of w. */
static int vs_walk(vs_ctx_t *c, const ms_snapshot_t *s, vs_wide_t *w, vs_part_t *x, size_t i0,
                   size_t i1) {
  uint32_t root = (uint32_t)s->nframes, end = root;
  size_t nctx = (size_t)root + 1;
  for (size_t i = i0; i < i1; i++) {
    const ms_snap_stack_t *st = &s->stacks[i];
    uint32_t ctx = root, p;
    if (x && i % VS_EVERY == 0) {
      size_t ck = i / VS_EVERY;
      w->at[ck] = x->nranks;
      w->at[w->nck + ck] = x->hi.n;
      w->at[2 * w->nck + ck] = x->lo.n;
      w->at[3 * w->nck + ck] = x->big.n / 4;
    }
    for (uint32_t k = st->nframes + 1; k-- > 0;) {
      uint32_t f = k ? ms_snap_frame_index(s, st->first + k - 1) : end;
      if (k && f >= root) return MS_EINVAL; /* the reader never gives one: no frame to name */
      if (!x) {
        if (c->last[ctx] == f) { /* vs_pair's own first test, without the call: most steps */
          p = c->last_p[ctx];
        } else {
          int rc = vs_pair(c, ctx, f, nctx, &p);
          if (rc != MS_OK) return rc;
        }
        c->uses[p] += c->uses[p] < UINT32_MAX;
      } else if (c->nsucc[ctx] > 1) { /* the second pass finds only the pairs it writes */
        uint32_t r;
        int rc = vs_rank_of(c, ctx, f, &r);
        if (rc != MS_OK) return rc;
        if (vs_put_rank(x, r, c->nsucc[ctx])) return MS_ENOMEM;
      }
      ctx = f;
    }
  }
  return MS_OK;
}

static int vs_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The order of stacks.succ (c->succ, context by context, context i's from c->start[i]); each
 * pair's uses become its rank in its context (most used first, then in order of first use), and
 * so do the entries of the rows (rank + 1). */
static int vs_rank(const ms_snapshot_t *s, vs_ctx_t *c) {
  size_t nctx = s->nframes + 1;
  /* counting sort of the pairs by context, then each context's by uses */
  size_t *at = c->start = malloc((nctx + 1) * sizeof *at);
  uint64_t *key = malloc((c->npairs ? c->npairs : 1) * sizeof *key);
  c->succ = malloc((c->npairs ? c->npairs : 1) * sizeof *c->succ);
  if (!at || !key || !c->succ) {
    free(key);
    return MS_ENOMEM;
  }
  at[0] = 0;
  for (size_t i = 0; i < nctx; i++) at[i + 1] = at[i] + c->nsucc[i];
  for (size_t p = 0; p < c->npairs; p++)
    key[at[c->pairs[p] >> 32]++] = (uint64_t)(UINT32_MAX - c->uses[p]) << 32 | p;
  for (size_t i = nctx; i-- > 0;) at[i + 1] = at[i]; /* at[i] is now where context i ends */
  at[0] = 0;
  for (size_t i = 0; i < nctx; i++) {
    qsort(key + at[i], at[i + 1] - at[i], sizeof *key, vs_cmp_u64);
    for (size_t j = at[i]; j < at[i + 1]; j++) {
      uint32_t p = (uint32_t)key[j];
      c->succ[j] = (uint32_t)c->pairs[p];
      c->uses[p] = (uint32_t)(j - at[i]);
      if (c->row[i]) c->row[i][c->succ[j]] = (uint32_t)(j - at[i]) + 1;
    }
  }
  free(key);
  return MS_OK;
}

/* stacks.succ_count and stacks.succ (vs_rank's order). */
static void vs_successors(vb_t *b, const ms_snapshot_t *s, const vs_ctx_t *c, bool small) {
  size_t nctx = s->nframes + 1;
  vb_begin(b, "stacks.succ_count", "u32");
  for (size_t i = 0; i < nctx; i++) vb_u32(b, c->nsucc[i]);
  vb_end(b);
  vb_begin(b, "stacks.succ", small ? "u16" : "u32");
  for (size_t j = 0; j < c->npairs; j++) {
    if (small) vb_u16(b, (uint16_t)c->succ[j]);
    else vb_u32(b, c->succ[j]);
  }
  vb_end(b);
}

/* The rank sections: bytes of few values, in patterns that repeat where a program's stacks do
 * (real traces: deflate's default search) or not (the synthetic benchmark: its runs strategy,
 * which leaves them to the Huffman codes); bin.h picks by the first 64 KiB. A section is the parts'
 * buffers (the one at offset off of each part) one after the other. */
static void vs_section_parts(vb_t *b, const char *name, const vs_wide_t *w, size_t off) {
  vb_begin_with(b, name, "u8", VB_PICK);
  for (size_t k = 0; k < w->nparts; k++) {
    const vs_buf_t *x = (const vs_buf_t *)(const void *)((const char *)&w->part[k] + off);
    vb_bytes(b, x->p, x->n);
  }
  vb_end(b);
}

static int vs_sections(vb_t *b, const ms_snapshot_t *s, vs_ctx_t *c) {
  bool small = s->nframes < 65536;
  vs_wide_t *w = c->x;
  vb_begin(b, "stacks.n", "u32");
  vb_u32(b, (uint32_t)s->nstacks);
  vb_end(b);
  vs_successors(b, s, c, small);
  vs_section_parts(b, "stacks.ranks", w, offsetof(vs_part_t, ranks));
  vs_section_parts(b, "stacks.ranks_hi", w, offsetof(vs_part_t, hi));
  vs_section_parts(b, "stacks.ranks_lo", w, offsetof(vs_part_t, lo));
  vb_begin(b, "stacks.ranks_big", "u32");
  for (size_t k = 0; k < w->nparts; k++) {
    const vs_buf_t *x = &w->part[k].big;
    for (size_t i = 0; i + 4 <= x->n; i += 4) {
      const unsigned char *q = x->p + i;
      vb_u32(b, (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 |
                    (uint32_t)q[3] << 24);
    }
  }
  vb_end(b);
  /* each part's checkpoints from the start of the sections: after the parts before it */
  uint64_t base[4] = {0, 0, 0, 0};
  for (size_t k = 0; k < w->nparts; k++) {
    const vs_part_t *x = &w->part[k];
    size_t ck0 = k * (w->per_part / VS_EVERY), ck1 = ck0 + w->per_part / VS_EVERY;
    for (size_t ck = ck0; ck < ck1 && ck < w->nck; ck++)
      for (int q = 0; q < 4; q++) w->at[q * w->nck + ck] += base[q];
    base[0] += x->nranks;
    base[1] += x->hi.n;
    base[2] += x->lo.n;
    base[3] += x->big.n / 4;
  }
  /* exact as doubles: no section holds 2^53 values */
  vb_begin_with(b, "stacks.at", "f64", VB_DELTA | VB_SHUFFLE | VB_PICK);
  for (size_t i = 0; i < 4 * w->nck; i++) vb_f64(b, (double)w->at[i]);
  vb_end(b);
  return MS_OK;
}

/* The second pass's parts, into c->x (walked by vs_plan_work). */
static int vs_second(const ms_snapshot_t *s, vs_ctx_t *c) {
  vs_wide_t *w = c->x = calloc(1, sizeof *w);
  if (!w) return MS_ENOMEM;
  if (pthread_mutex_init(&w->mu, NULL) != 0) {
    free(w);
    c->x = NULL;
    return MS_ENOMEM;
  }
  w->nck = (s->nstacks + VS_EVERY - 1) / VS_EVERY;
  size_t per = (w->nck + VS_PARTS - 1) / VS_PARTS; /* checkpoints per part */
  w->per_part = (per ? per : 1) * VS_EVERY;
  w->nparts = (s->nstacks + w->per_part - 1) / w->per_part;
  w->at = malloc((4 * w->nck + 1) * sizeof *w->at);
  w->part = calloc(w->nparts ? w->nparts : 1, sizeof *w->part);
  return w->at && w->part ? MS_OK : MS_ENOMEM;
}

int vs_plan_work(vs_plan_t *c, const ms_snapshot_t *s) {
  vs_wide_t *w = c->x;
  for (;;) {
    pthread_mutex_lock(&w->mu);
    size_t k = w->next;
    bool go = w->rc == MS_OK && k < w->nparts;
    if (go) w->next++;
    pthread_mutex_unlock(&w->mu);
    if (!go) return MS_OK;
    size_t i0 = k * w->per_part, i1 = i0 + w->per_part < s->nstacks ? i0 + w->per_part : s->nstacks;
    int rc = vs_walk(c, s, w, &w->part[k], i0, i1);
    if (rc != MS_OK) {
      pthread_mutex_lock(&w->mu);
      if (w->rc == MS_OK) w->rc = rc;
      pthread_mutex_unlock(&w->mu);
      return MS_OK;
    }
  }
}

void vs_plan_free(vs_plan_t *c) {
  if (!c) return;
  free(c->map.slot);
  if (c->row)
    for (size_t i = 0; i < c->nrows; i++) free(c->row[i]);
  free(c->row);
  free(c->start);
  free(c->nsucc);
  free(c->last);
  free(c->last_p);
  free(c->small);
  free(c->small_p);
  free(c->pairs);
  free(c->uses);
  free(c->succ);
  if (c->x) {
    vs_wide_t *w = c->x;
    for (size_t k = 0; w->part && k < w->nparts; k++) {
      free(w->part[k].ranks.p);
      free(w->part[k].hi.p);
      free(w->part[k].lo.p);
      free(w->part[k].big.p);
    }
    free(w->part);
    free(w->at);
    pthread_mutex_destroy(&w->mu);
    free(w);
  }
  free(c);
}

int vs_plan(const ms_snapshot_t *s, vs_plan_t **out) {
  *out = NULL;
  if (s->nframes >= UINT32_MAX - 1 || s->nstacks > UINT32_MAX) return MS_ELIMIT;
  size_t nctx = s->nframes + 1;
  vs_ctx_t *c = calloc(1, sizeof *c);
  if (!c) return MS_ENOMEM;
  c->nsucc = calloc(nctx, sizeof *c->nsucc);
  c->row = calloc(nctx, sizeof *c->row);
  c->nrows = nctx;
  c->last = malloc(nctx * sizeof *c->last);
  c->last_p = malloc(nctx * sizeof *c->last_p);
  c->small = malloc(nctx * VS_SMALL * sizeof *c->small);
  c->small_p = malloc(nctx * VS_SMALL * sizeof *c->small_p);
  int rc = c->nsucc && c->row && c->last && c->last_p && c->small && c->small_p && vs_grow(&c->map) == MS_OK
               ? MS_OK
               : MS_ENOMEM;
  if (rc == MS_OK) {
    memset(c->last, 0xff, nctx * sizeof *c->last); /* no successor is UINT32_MAX */
    rc = vs_walk(c, s, NULL, NULL, 0, s->nstacks);
  }
  if (rc == MS_OK) rc = vs_rank(s, c);
  if (rc == MS_OK) rc = vs_second(s, c);
  if (rc != MS_OK) {
    vs_plan_free(c);
    return rc;
  }
  *out = c;
  return MS_OK;
}

int vs_write_plan(vb_t *b, const ms_snapshot_t *s, vs_plan_t *p) {
  int rc = vs_plan_work(p, s); /* the parts no other thread took */
  if (rc == MS_OK) rc = p->x->rc;
  return rc == MS_OK ? vs_sections(b, s, p) : rc;
}

int vs_write_stacks(vb_t *b, const ms_snapshot_t *s) {
  vs_plan_t *p = NULL;
  int rc = vs_plan(s, &p);
  if (rc == MS_OK) rc = vs_write_plan(b, s, p);
  vs_plan_free(p);
  return rc;
}
