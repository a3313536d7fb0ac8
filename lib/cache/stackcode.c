/* SPDX-License-Identifier: MIT
 * memsnap cache: the stacks and their frame indices in a snapshot's cache file (format.c's
 * sections CS_STACKS and CS_STACK_FRAMES, each counted in bytes; varints of lib/cache/varint.h).
 *
 * The stacks: their number, then for each its start as the zigzag difference from the end of the
 * previous stack (0 when the stacks follow one another, as the readers lay them out) and its
 * number of frames: 2 bytes a stack, against 8 at full width.
 *
 * The frame indices (the model's largest table: every stack's frames, innermost first, one stack
 * after the other) are coded by what precedes them. Stacks repeat their transitions: the frame
 * after an allocator frame, an interpreter frame or a module's frame is one of a few, and often
 * always the same. So the section holds, for each frame (and for the start), the list of the
 * values ever seen right after it, most frequent first, then for each index its rank in the list
 * of the one before: nothing when the list has one value, else a varint. The last index is
 * followed by an end mark (value 0 in the lists; index k is value k + 1), so that no run of
 * indices that cost nothing can loop. The indices are cut into SC_LANES lanes of equal length,
 * each starting at the start: the reader follows them side by side, since each rank's list
 * depends on the index before, a chain of loads that one lane alone would wait on.
 * Layout: varint count N; for each context (frame 0 .. nframes - 1, then the start and any index
 * past the frames) a varint list length and the values; each lane's length in bytes; the lanes'
 * ranks, the end mark's at the end of the last; then zero bytes, as many as make the section at
 * least N / CACHE_SF_RATIO bytes: the reader allocates N indices only when the file is that
 * large, whatever N it says. On the 937 MB synthetic pickle (every entry a stack of its own,
 * 25-53 frames): 58 MB for 65.9 M indices, against 132 MB at 2 bytes each.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/internal.h"
#include "cache/varint.h"
#include "common/internal.h"
#include "common/hash.h"
#include "memsnap/snapshot.h"

#define CACHE_SF_RATIO 64u /* the most frame indices a byte of the section may stand for */
#define SC_EMPTY UINT64_MAX
#define SC_LANES 4u /* independent runs of indices, read side by side (sc_r_walk has 4) */

/* ---- writing -------------------------------------------------------------------------------- */

static void sc_put_var(cache_out_t *o, uint64_t v) {
  unsigned char b[CACHE_VAR_MAX];
  ms__cache_out_put(o, b, cache_put_var(b, v));
}

bool ms__cache_w_stacks(cache_out_t *o, const ms_snapshot_t *s) {
  sc_put_var(o, s->nstacks);
  uint64_t end = 0;
  for (size_t i = 0; i < s->nstacks; i++) {
    unsigned char b[2 * CACHE_VAR_MAX];
    size_t n = cache_put_var(b, cache_zigzag((uint64_t)s->stacks[i].first - end));
    n += cache_put_var(b + n, s->stacks[i].nframes);
    ms__cache_out_put(o, b, n);
    end = (uint64_t)s->stacks[i].first + s->stacks[i].nframes;
  }
  return !o->failed;
}

/* The transitions (context, value) seen: tables keyed by context << 33 | value (value 0 the end
 * mark, else the index + 1), open addressing on slots that hold the key beside its value (a
 * count, or a rank), so that a step of the walks below costs one access to a table that stays
 * in the core's cache (21 k transitions on the 937 MB synthetic). */
typedef struct sc_slot_s {
  uint64_t key; /* SC_EMPTY: a free slot */
  uint64_t val;
} sc_slot_t;

typedef struct sc_tab_s {
  sc_slot_t *slot;
  size_t cap, len; /* cap: a power of two, at least twice len */
} sc_tab_t;

MS_ALWAYS_INLINE sc_slot_t *sc_slot(const sc_tab_t *t, uint64_t key) {
  /* Fibonacci hashing: the key's context and value both reach the top bits a slot takes */
  size_t j = (size_t)((key * 0x9E3779B97F4A7C15ull) >> 40) & (t->cap - 1);
  while (t->slot[j].key != SC_EMPTY && t->slot[j].key != key) j = (j + 1) & (t->cap - 1);
  return &t->slot[j];
}

/* A table of room for n keys; false when out of memory. */
static bool sc_tab_init(sc_tab_t *t, size_t n) {
  size_t cap = 4096;
  while (cap < 2 * n) cap *= 2;
  t->len = 0;
  t->cap = cap;
  if (!(t->slot = malloc(cap * sizeof *t->slot))) return false;
  for (size_t i = 0; i < cap; i++) t->slot[i] = (sc_slot_t){SC_EMPTY, 0};
  return true;
}

static MS_NOINLINE bool sc_tab_grow(sc_tab_t *t) {
  sc_tab_t n;
  if (!sc_tab_init(&n, t->cap)) return false;
  for (size_t i = 0; i < t->cap; i++)
    if (t->slot[i].key != SC_EMPTY) *sc_slot(&n, t->slot[i].key) = t->slot[i];
  n.len = t->len;
  free(t->slot);
  *t = n;
  return true;
}

/* The slot of key, made (value 0) when new; NULL when out of memory. */
MS_ALWAYS_INLINE sc_slot_t *sc_put(sc_tab_t *t, uint64_t key) {
  sc_slot_t *e = sc_slot(t, key);
  if (ms_likely(e->key == key)) return e;
  if ((t->len + 1) * 2 > t->cap) {
    if (!sc_tab_grow(t)) return NULL;
    e = sc_slot(t, key);
  }
  t->len++;
  *e = (sc_slot_t){key, 0};
  return e;
}

/* A transition of the merged lanes: its counts per lane, and its rank in its context's list. */
typedef struct sc_edge_s {
  uint64_t key;
  uint64_t count[SC_LANES];
  uint64_t total; /* the lanes' sum, at most UINT32_MAX (as the format's first writer counted) */
  uint32_t rank;
} sc_edge_t;

/* The lists' order: by context, most frequent first, then by value. */
static int sc_edge_cmp(const void *a, const void *b) {
  const sc_edge_t *x = a, *y = b;
  uint64_t cx = x->key >> 33, cy = y->key >> 33;
  if (cx != cy) return cx < cy ? -1 : 1;
  if (x->total != y->total) return x->total > y->total ? -1 : 1;
  return x->key < y->key ? -1 : x->key > y->key;
}

/* The context an index (or the start, SIZE_MAX) gives the next one. */
static uint64_t sc_ctx(uint64_t prev, size_t nframes) {
  return prev < nframes ? prev : nframes;
}

/* The first index of lane j of n indices. */
static size_t sc_lane_start(size_t n, unsigned j) {
  return (size_t)((uint64_t)n * j / SC_LANES);
}

/* Lane j's steps: [*a, *b) (the last lane's ends with the end mark). */
static void sc_lane(size_t n, unsigned j, size_t *a, size_t *b) {
  *a = sc_lane_start(n, j);
  *b = j + 1 < SC_LANES ? sc_lane_start(n, j + 1) : n + 1;
}

/* The value at step i of s's indices (0: the end mark), and the context it is read in. */
static uint64_t sc_value(const ms_snapshot_t *s, size_t i) {
  return i < s->nstack_frames ? (uint64_t)ms_snap_frame_index(s, i) + 1 : 0;
}

/* The lanes are counted, then written, side by side on up to SC_LANES threads when there are at
 * least SC_THREAD_MIN indices (fewer: on the calling thread, the same work in the same order).
 * Each lane counts into a table of its own (merged after), and writes its ranks into a buffer of
 * the length its counts give; the buffers then go out in order, so the section's bytes do not
 * depend on the number of threads. */
#define SC_THREAD_MIN ((size_t)4096)

unsigned ms__cache_sc_threads = 0;

typedef struct sc_job_s {
  const ms_snapshot_t *s;
  sc_tab_t count[SC_LANES]; /* counting: lane j's transitions and their counts */
  sc_tab_t rank;            /* writing: the rank of each transition whose context has a list of
                               more than one value (no other is written) */
  unsigned char *buf[SC_LANES];
  uint64_t bytes[SC_LANES];
  bool ok[SC_LANES];
  bool writing;
  unsigned next; /* the next lane to take */
  pthread_mutex_t lock;
} sc_job_t;

/* Counts lane j's transitions into t, the end mark included. */
static bool sc_count_lane(sc_tab_t *t, const ms_snapshot_t *s, unsigned j) {
  size_t a, b;
  sc_lane(s->nstack_frames, j, &a, &b);
  uint64_t prev = UINT64_MAX;
  for (size_t i = a; i < b; i++) {
    uint64_t v = sc_value(s, i), c = sc_ctx(prev, s->nframes);
    sc_slot_t *e = sc_put(t, c << 33 | v);
    if (!e) return false;
    e->val++;
    prev = v - 1;
  }
  return true;
}

/* Writes lane j's ranks into its buffer (job->bytes[j] bytes, as the counts said, and room for a
 * varint more); false when they do not fill it exactly. */
static bool sc_write_lane(sc_job_t *job, unsigned j) {
  const ms_snapshot_t *s = job->s;
  size_t a, b;
  sc_lane(s->nstack_frames, j, &a, &b);
  unsigned char *p = job->buf[j], *end = p + job->bytes[j];
  uint64_t prev = UINT64_MAX;
  for (size_t i = a; i < b; i++) {
    uint64_t c = sc_ctx(prev, s->nframes), v = sc_value(s, i);
    prev = v - 1;
    const sc_slot_t *e = sc_slot(&job->rank, c << 33 | v);
    if (e->key == SC_EMPTY) continue; /* a context of one value: nothing written */
    if (p > end) return false;        /* the buffer has a varint's room past end */
    p += cache_put_var(p, e->val);
  }
  return p == end;
}

static void *sc_worker(void *arg) {
  sc_job_t *job = arg;
  for (;;) {
    pthread_mutex_lock(&job->lock);
    unsigned j = job->next++;
    pthread_mutex_unlock(&job->lock);
    if (j >= SC_LANES) break;
    job->ok[j] = job->writing ? sc_write_lane(job, j) : sc_count_lane(&job->count[j], job->s, j);
  }
  return NULL;
}

/* Runs the job's phase over every lane; @return whether each lane succeeded. */
static bool sc_run(sc_job_t *job) {
  job->next = 0;
  size_t nt = 1;
  if (ms__cache_sc_threads) {
    nt = ms__cache_sc_threads < SC_LANES ? ms__cache_sc_threads : SC_LANES;
  } else if (job->s->nstack_frames >= SC_THREAD_MIN) {
    long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
    nt = ncpu < 1 ? 1 : ncpu > (long)SC_LANES ? SC_LANES : (size_t)ncpu;
  }
  pthread_t th[SC_LANES];
  size_t started = 0;
  for (size_t i = 1; i < nt; i++)
    if (pthread_create(&th[started], NULL, sc_worker, job) == 0) started++;
  sc_worker(job);
  for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
  bool ok = true;
  for (unsigned j = 0; j < SC_LANES; j++) ok = ok && job->ok[j];
  return ok;
}

/* The lanes' transitions as one list of edges, in the lists' order, ranked; NULL when out of
 * memory. *ne: their number. */
static sc_edge_t *sc_merge(sc_job_t *job, size_t *ne) {
  sc_tab_t idx; /* key -> the edge's number */
  size_t most = 0;
  for (unsigned j = 0; j < SC_LANES; j++) most += job->count[j].len;
  sc_edge_t *e = malloc((most ? most : 1) * sizeof *e);
  if (!e || !sc_tab_init(&idx, most)) {
    free(e);
    return NULL;
  }
  size_t n = 0;
  for (unsigned j = 0; j < SC_LANES; j++) {
    const sc_tab_t *t = &job->count[j];
    for (size_t i = 0; i < t->cap; i++) {
      if (t->slot[i].key == SC_EMPTY) continue;
      sc_slot_t *x = sc_put(&idx, t->slot[i].key); /* room for all: never grows */
      if (!x) {
        free(idx.slot);
        free(e);
        return NULL;
      }
      if (x->val == 0) {
        e[n] = (sc_edge_t){t->slot[i].key, {0}, 0, 0};
        x->val = ++n;
      }
      e[x->val - 1].count[j] += t->slot[i].val;
    }
  }
  free(idx.slot);
  for (size_t i = 0; i < n; i++) {
    uint64_t total = 0;
    for (unsigned j = 0; j < SC_LANES; j++) total += e[i].count[j];
    e[i].total = total < UINT32_MAX ? total : UINT32_MAX;
  }
  qsort(e, n, sizeof *e, sc_edge_cmp);
  for (size_t i = 0; i < n; i++)
    e[i].rank = i && e[i].key >> 33 == e[i - 1].key >> 33 ? e[i - 1].rank + 1 : 0;
  *ne = n;
  return e;
}

/* The lists of every context (nctx of them, the edges e[0..ne) in their order). */
static void sc_put_lists(cache_out_t *o, const sc_edge_t *e, size_t ne, size_t nctx) {
  size_t k = 0;
  for (uint64_t c = 0; c < nctx; c++) {
    size_t a = k;
    while (k < ne && e[k].key >> 33 == c) k++;
    sc_put_var(o, k - a);
    for (size_t j = a; j < k; j++) sc_put_var(o, e[j].key & (((uint64_t)1 << 33) - 1));
  }
}

/* The ranks after the lists: the lanes' lengths (from the counts: a rank is written where its
 * context has more than one value), then the lanes, coded into job's buffers. */
static bool sc_put_lanes(cache_out_t *o, sc_job_t *job, const sc_edge_t *e, size_t ne) {
  if (!sc_tab_init(&job->rank, ne)) return false;
  for (size_t i = 0; i < ne; i++) {
    /* a rank is written where its context's list has more than one value (the edges are in
     * their lists' order: a context's values are neighbours) */
    bool multi = (i && e[i].key >> 33 == e[i - 1].key >> 33) ||
                 (i + 1 < ne && e[i].key >> 33 == e[i + 1].key >> 33);
    if (!multi) continue;
    sc_slot_t *x = sc_put(&job->rank, e[i].key); /* room for all: never grows */
    if (!x) return false;
    x->val = e[i].rank;
    unsigned char tmp[CACHE_VAR_MAX];
    uint64_t k = cache_put_var(tmp, e[i].rank);
    for (unsigned j = 0; j < SC_LANES; j++) job->bytes[j] += e[i].count[j] * k;
  }
  for (unsigned j = 0; j < SC_LANES; j++) {
    if (job->bytes[j] > SIZE_MAX - CACHE_VAR_MAX ||
        !(job->buf[j] = malloc((size_t)job->bytes[j] + CACHE_VAR_MAX)))
      return false;
    sc_put_var(o, job->bytes[j]);
  }
  job->writing = true;
  if (!sc_run(job)) return false;
  for (unsigned j = 0; j < SC_LANES; j++) ms__cache_out_put(o, job->buf[j], (size_t)job->bytes[j]);
  return true;
}

bool ms__cache_w_stack_frames(cache_out_t *o, const ms_snapshot_t *s, bool *nomem) {
  uint64_t start = o->pos;
  sc_job_t job = {.s = s};
  sc_edge_t *e = NULL;
  size_t ne = 0;
  bool ok = s->nframes < ((size_t)1 << 30);
  for (unsigned j = 0; ok && j < SC_LANES; j++) ok = sc_tab_init(&job.count[j], 0);
  pthread_mutex_init(&job.lock, NULL);
  ok = ok && sc_run(&job) && (e = sc_merge(&job, &ne)) != NULL;
  for (unsigned j = 0; j < SC_LANES; j++) {
    free(job.count[j].slot);
    job.count[j].slot = NULL;
  }
  if (ok) {
    sc_put_var(o, s->nstack_frames);
    sc_put_lists(o, e, ne, s->nframes + 1);
    ok = sc_put_lanes(o, &job, e, ne);
  }
  static const unsigned char zero[64];
  uint64_t need = (uint64_t)s->nstack_frames / CACHE_SF_RATIO;
  while (ok && !o->failed && o->pos - start < need) {
    uint64_t k = need - (o->pos - start);
    ms__cache_out_put(o, zero, k < sizeof zero ? (size_t)k : sizeof zero);
  }
  pthread_mutex_destroy(&job.lock);
  for (unsigned j = 0; j < SC_LANES; j++) free(job.buf[j]);
  free(job.rank.slot);
  free(e);
  if (!ok) *nomem = true; /* out of memory (a lane that does not fill its buffer cannot be) */
  return ok && !o->failed;
}

/* ---- reading -------------------------------------------------------------------------------- */

const char *ms__cache_r_stacks(const unsigned char *p, size_t len, ms_snapshot_t *t, bool *nomem) {
  const unsigned char *end = p + len;
  uint64_t n;
  if (!cache_get_var(&p, end, &n)) return "stacks cut short";
  if (n > (uint64_t)(end - p) / 2 || n > UINT32_MAX - 1) return "stacks out of range";
  t->nstacks = (size_t)n;
  t->stacks = n ? malloc((size_t)n * sizeof *t->stacks) : NULL;
  if (n && !t->stacks) {
    *nomem = true;
    return NULL;
  }
  uint64_t at = 0;
  for (size_t i = 0; i < t->nstacks; i++) {
    uint64_t d, k;
    if (!cache_get_var(&p, end, &d) || !cache_get_var(&p, end, &k)) return "stacks cut short";
    at += cache_unzigzag(d);
    if (at > UINT32_MAX || k > UINT32_MAX) return "stack out of range";
    t->stacks[i].first = (uint32_t)at;
    t->stacks[i].nframes = (uint32_t)k;
    at += k;
  }
  return p == end ? NULL : "stacks section longer than its stacks";
}

/* A context of the reader: its list's place in the values and its length. */
#define SC_END UINT32_MAX
typedef struct sc_ctx_s {
  uint32_t off, len;
} sc_ctx_t;

/* The lists of the nctx contexts at *p into ctx and vals (malloc'd, the caller's): each value is
 * a frame index (at most vmax) or SC_END. */
static const char *sc_r_lists(const unsigned char **p, const unsigned char *end, size_t nctx,
                              uint64_t vmax, sc_ctx_t **ctx_out, uint32_t **vals_out,
                              bool *nomem) {
  sc_ctx_t *ctx = malloc(nctx * sizeof *ctx);
  /* every value takes a byte: no more of them than the section has bytes */
  size_t cap = (size_t)(end - *p) + 1;
  uint32_t *vals = malloc(cap * sizeof *vals);
  *ctx_out = ctx;
  *vals_out = vals;
  if (!ctx || !vals || cap > UINT32_MAX) {
    *nomem = true;
    return NULL;
  }
  size_t nv = 0;
  for (size_t c = 0; c < nctx; c++) {
    uint64_t k, v;
    if (!cache_get_var(p, end, &k)) return "stack frames cut short";
    if (k > (uint64_t)(end - *p)) return "stack frames cut short";
    ctx[c].off = (uint32_t)nv;
    ctx[c].len = (uint32_t)k;
    for (uint64_t j = 0; j < k; j++) {
      if (!cache_get_var(p, end, &v)) return "stack frames cut short";
      if (v > vmax) return "stack frame index out of range";
      vals[nv++] = v == 0 ? SC_END : (uint32_t)(v - 1);
    }
  }
  return NULL;
}

/* The rank at *pp for a context of len values (none when len is 1), *pp moved past it; false
 * when cut short. The common ranks (one or two bytes) are read without a branch on the data,
 * which the walk's unpredictable mix of lists of one and of many values would mispredict. */
static inline bool sc_rank(const unsigned char **pp, const unsigned char *end, uint32_t len,
                           uint64_t *rank) {
  const unsigned char *p = *pp;
  uint32_t multi = len > 1;
  if (end - p >= 2) {
    uint32_t b0 = p[0], b1 = p[1], two = b0 >> 7;
    if (!(two & b1 >> 7)) { /* a varint of one or two bytes, or none at all */
      uint32_t r = (b0 & 0x7f) | (b1 << 7 & (0u - two));
      *rank = multi ? r : 0;
      *pp = p + (multi ? 1 + two : 0);
      return true;
    }
  }
  *rank = 0;
  return !multi || cache_get_var(pp, end, rank);
}

/* A lane being read: its ranks (p .. end), its context, its next index and where it stops. */
typedef struct sc_lane_s {
  const unsigned char *p, *end;
  const sc_ctx_t *x;
  size_t i, stop;
} sc_lane_t;

/* The value of lane l's next step (the rank read in its context); NULL or what is wrong. */
static inline const char *sc_step(sc_lane_t *l, const uint32_t *vals, uint32_t *v) {
  uint64_t rank;
  if (!sc_rank(&l->p, l->end, l->x->len, &rank)) return "stack frames cut short";
  if (rank >= l->x->len)
    return l->x->len ? "stack frame rank out of range"
                     : "a stack frame follows one that has no successors";
  *v = vals[l->x->off + rank];
  return NULL;
}

/* Lane l's next index into out16 or out32; NULL or what is wrong. */
static inline const char *sc_step_index(sc_lane_t *l, const sc_ctx_t *ctx, const uint32_t *vals,
                                        uint32_t nframes, uint16_t *out16, uint32_t *out32) {
  uint32_t v;
  const char *why = sc_step(l, vals, &v);
  if (why) return why;
  if (v == SC_END) return "stack frames end where they should not";
  if (out16)
    out16[l->i] = (uint16_t)v;
  else
    out32[l->i] = v;
  l->i++;
  l->x = &ctx[v < nframes ? v : nframes];
  return NULL;
}

/* Reads the lanes (their ranks one after the other from *pp, of the lengths lane_bytes) for n
 * indices and the end mark, into out16 or out32: side by side while every lane has indices left,
 * so that their chains of loads overlap. */
static const char *sc_r_walk(const unsigned char **pp, const unsigned char *end,
                             const uint64_t lane_bytes[], const sc_ctx_t *ctx,
                             const uint32_t *vals, uint32_t nframes, size_t n, uint16_t *out16,
                             uint32_t *out32) {
  sc_lane_t l[SC_LANES];
  const unsigned char *p = *pp;
  for (unsigned j = 0; j < SC_LANES; j++) {
    if (lane_bytes[j] > (uint64_t)(end - p)) return "stack frames cut short";
    l[j] = (sc_lane_t){p, p + lane_bytes[j], &ctx[nframes], sc_lane_start(n, j),
                       j + 1 < SC_LANES ? sc_lane_start(n, j + 1) : n};
    p += lane_bytes[j];
  }
  const char *why = NULL;
  size_t common = l[0].stop - l[0].i;
  for (unsigned j = 1; j < SC_LANES; j++)
    if (l[j].stop - l[j].i < common) common = l[j].stop - l[j].i;
  /* side by side, each lane's state in registers (a copy, written back after) */
  sc_lane_t a = l[0], b = l[1], c = l[2], e = l[3];
  for (size_t k = 0; k < common && !why; k++) {
    const char *wa = sc_step_index(&a, ctx, vals, nframes, out16, out32);
    const char *wb = sc_step_index(&b, ctx, vals, nframes, out16, out32);
    const char *wc = sc_step_index(&c, ctx, vals, nframes, out16, out32);
    const char *we = sc_step_index(&e, ctx, vals, nframes, out16, out32);
    why = wa ? wa : wb ? wb : wc ? wc : we;
  }
  l[0] = a;
  l[1] = b;
  l[2] = c;
  l[3] = e;
  for (unsigned j = 0; j < SC_LANES && !why; j++)
    while (l[j].i < l[j].stop && !why) why = sc_step_index(&l[j], ctx, vals, nframes, out16, out32);
  uint32_t v = 0;
  if (!why) why = sc_step(&l[SC_LANES - 1], vals, &v);
  if (!why && v != SC_END) why = "stack frames end where they should not";
  for (unsigned j = 0; j < SC_LANES && !why; j++)
    if (l[j].p != l[j].end) why = "a lane of stack frames is longer than its frames";
  if (!why) *pp = p;
  return why;
}

const char *ms__cache_r_stack_frames(const unsigned char *p, size_t len, unsigned width,
                                     size_t nframes, ms_snapshot_t *t, bool *nomem) {
  const unsigned char *end = p + len;
  uint64_t n;
  if (!cache_get_var(&p, end, &n)) return "stack frames cut short";
  if (n > (uint64_t)len * CACHE_SF_RATIO || n > UINT32_MAX - 1 || nframes > UINT32_MAX - 2)
    return "stack frames out of range";
  sc_ctx_t *ctx = NULL;
  uint32_t *vals = NULL;
  /* a frame index is below 2^16 at width 2; SC_END is never one */
  const char *why = sc_r_lists(&p, end, nframes + 1, width == 2 ? UINT16_MAX + 1u : UINT32_MAX,
                               &ctx, &vals, nomem);
  if (!why && !*nomem) {
    t->nstack_frames = (size_t)n;
    if (n && width == 2)
      t->stack_frames16 = malloc((size_t)n * 2);
    else if (n)
      t->stack_frames = malloc((size_t)n * 4);
    if (n && !t->stack_frames16 && !t->stack_frames) *nomem = true;
  }
  uint64_t lanes[SC_LANES];
  for (unsigned j = 0; j < SC_LANES && !why && !*nomem; j++)
    if (!cache_get_var(&p, end, &lanes[j])) why = "stack frames cut short";
  if (!why && !*nomem)
    why = sc_r_walk(&p, end, lanes, ctx, vals, (uint32_t)nframes, (size_t)n, t->stack_frames16,
                    t->stack_frames);
  while (!why && !*nomem && p < end)
    if (*p++ != 0) why = "stack frames section longer than its frames";
  free(ctx);
  free(vals);
  return why;
}
