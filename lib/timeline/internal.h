/* SPDX-License-Identifier: MIT
 * memsnap core: the time index's state and the functions its files share (memsnap/timeline.h).
 * state.c: the working state (an address-sorted array of segments, each with its address-sorted
 * live blocks, in chunks: blocks.c), its checkpoints, and undoing or redoing one trace entry;
 * index.c: pairing allocs
 * with frees, building the index (one pass undoing the trace from the end state), the state at
 * any step; totals.c: walks from a checkpoint, the totals at a step, peaks, series made on
 * demand; moments.c: the state as a snapshot, naming moments, and selecting segments of the end
 * state.
 */
#ifndef MEMSNAP_LIB_TIMELINE_INTERNAL_H
#define MEMSNAP_LIB_TIMELINE_INTERNAL_H

#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "common/vec.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"

#define TL_NONE UINT32_MAX
#define TL_SMALL_SIZE (1ull << 20) /* kSmallSize: requests up to 1 MiB use the small pool */
#define TL_MAX_DEVICES 4096

/* A segment's live blocks, sorted by address (blocks.c): chunks of at most TL_BLK_CHUNK blocks,
 * none empty, in address order, so that adding or removing a block moves at most one chunk's
 * blocks and the chunks' pointers, however many blocks the segment holds (an expandable segment
 * may hold tens of thousands). A place in it is a chunk and an offset; the end is (nch, 0). */
#define TL_BLK_CHUNK 256
typedef struct tl_bchunk_s {
  uint32_t n, cap;
  ms_tl_block_t b[];
} tl_bchunk_t;

typedef struct tl_blks_s {
  tl_bchunk_t **ch;
  size_t nch, cap; /* chunks, room for chunk pointers */
  size_t len;      /* blocks */
} tl_blks_t;

typedef struct tl_bpos_s {
  size_t c, o;
} tl_bpos_t;

typedef struct tl_wseg_s {
  ms_tl_segment_t seg;
  tl_blks_t blk; /* live blocks, sorted by address */
} tl_wseg_t;

typedef struct tl_ws_s {
  MS_VEC(tl_wseg_t) segs;              /* sorted by address, non-overlapping */
  uint64_t totals[MS_TL_METRIC_COUNT]; /* of the segments the filter keeps */
  size_t nlive;
  const ms_tl_filter_t *filter; /* NULL: every segment counts */
  size_t seg_hint; /* the segment the last lookup found (any value is safe: it is checked) */
} tl_ws_t;

static inline bool tl_filter_keeps(const ms_tl_filter_t *f, const ms_tl_segment_t *s) {
  if (!f) return true;
  if (f->has_stream && s->stream != f->stream) return false;
  if (f->has_pool && (s->pool_id[0] != f->pool_id[0] || s->pool_id[1] != f->pool_id[1]))
    return false;
  return true;
}

static inline bool tl_counts(const tl_ws_t *w, const ms_tl_segment_t *s) {
  return tl_filter_keeps(w->filter, s);
}

typedef struct tl_ckpt_s {
  size_t step;
  ms_tl_segment_t *segs;
  uint32_t *seg_nblk;
  size_t nsegs;
  ms_tl_block_t *blocks;
  size_t nblocks;
  uint64_t totals[MS_TL_METRIC_COUNT];
  bool pooled; /* segs, seg_nblk and blocks lie in the device's ck_chunks: not freed alone */
} tl_ckpt_t;

/* Block sizes a 4-byte bsize cannot hold (tl_bsize_set): entry + 1 -> size, open addressing.
 * Empty in a trace of PyTorch's allocator, whose blocks are multiples of 512 bytes. */
typedef struct tl_bbig_s {
  uint32_t *key; /* entry + 1; 0: an empty slot */
  uint64_t *val;
  size_t cap, len;
} tl_bbig_t;

typedef struct tl_dev_s {
  const ms_snap_trace_t *trace;
  size_t n;
  uint32_t *pair;  /* alloc -> its free_completed; free_completed -> its alloc;
                      segment_alloc -> its segment_free (TL_NONE: none) */
  /* alloc / free_completed: the size of the block (chosen when building), in units of
   * TL_BSIZE_UNIT bytes, or TL_BSIZE_BIG: then in bbig. Read and set with tl_bsize and
   * tl_bsize_set. 4 bytes an entry, not 8: 19 MB less of the 937 MB pickle's peak (issue #33). */
  uint32_t *bsize;
  tl_bbig_t bbig;
  /* n + 1 values each, or NULL: an index makes a series only when ms_timeline_series asks for it
   * (issue #33: the four were 153 MB of a 5 M-entry index, and most commands need a peak or a
   * value at a step). Read and set under ms_timeline_s.lock (tl_series_get); never changed once
   * set; freed by ms_timeline_destroy. */
  uint64_t *series[MS_TL_METRIC_COUNT];
  MS_VEC(tl_ckpt_t) ckpts; /* increasing step; the last is step n */
  /* The built checkpoints' arrays, carved from a few large arrays (ms__big_*) rather than
   * malloc'd one by one: with MS_REUSE_MEMORY those take the pages the read freed, where ~1,000
   * mallocs of 40 KB were 39 MB of fresh heap pages on the 937 MB pickle (issue #33). */
  MS_VEC(void *) ck_chunks;
  size_t ck_used, ck_cap; /* bytes used of the last chunk, and its size */
  /* The peaks over every step (first step reaching the highest value), found when building or
   * when reading a stored index (lib/cache). */
  bool has_peaks;
  uint64_t peak_bytes[MS_TL_METRIC_COUNT];
  size_t peak_step[MS_TL_METRIC_COUNT];
  /* Whether every entry has a time and the times never decrease (entries by time are then found
   * by binary search): 0 not known yet, 1 yes, 2 no. Set under ms_timeline_s.lock (events.c). */
  int time_order;
} tl_dev_t;

/* bsize's unit: PyTorch rounds every block to a multiple of 512 bytes. */
#define TL_BSIZE_SHIFT 9
#define TL_BSIZE_BIG UINT32_MAX

/* Entry i's size from bbig (bsize.c); 0 when it holds none. */
uint64_t ms__tl_bsize_big(const tl_dev_t *d, size_t i);
/* Sets entry i's size in bbig and marks bsize[i] so. MS_ENOMEM. */
int ms__tl_bsize_set_big(tl_dev_t *d, size_t i, uint64_t size);
void ms__tl_bsize_free(tl_dev_t *d);

/* Entry i's block size (alloc / free_completed; 0 for other entries and before it is set). */
static inline uint64_t tl_bsize(const tl_dev_t *d, size_t i) {
  uint32_t v = d->bsize[i];
  return ms_likely(v != TL_BSIZE_BIG) ? (uint64_t)v << TL_BSIZE_SHIFT : ms__tl_bsize_big(d, i);
}

/* Sets entry i's block size. MS_ENOMEM (a size bsize cannot hold, and no memory for it). */
static inline int tl_bsize_set(tl_dev_t *d, size_t i, uint64_t size) {
  if (ms_likely((size & ((1u << TL_BSIZE_SHIFT) - 1)) == 0 &&
                (size >> TL_BSIZE_SHIFT) < TL_BSIZE_BIG)) {
    d->bsize[i] = (uint32_t)(size >> TL_BSIZE_SHIFT);
    return MS_OK;
  }
  return ms__tl_bsize_set_big(d, i, size);
}

/* The first of d's checkpoints at or after step (d->ckpts.len when none is). */
static inline size_t tl_ckpt_at_or_after(const tl_dev_t *d, size_t step) {
  size_t lo = 0, hi = d->ckpts.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (d->ckpts.ptr[mid].step < step)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

struct ms_timeline_s {
  const ms_snapshot_t *snap;
  size_t ndev;
  tl_dev_t *dev;
  uint32_t k;
  ms_tl_filter_t filter;
  /* An index read from elsewhere (lib/cache): when release is set, every device's pair and bsize
   * lie in storage that release(release_arg) gives back, and are not freed one by one. */
  void (*release)(void *arg);
  void *release_arg;
  /* Guards the devices' series: ms_timeline_series makes one on first use, and several threads
   * may query one index (memsnap view explains in a thread on the page's index). Also guards
   * what events.c makes on first use: the annotations' ranges (a step's entries are asked for
   * once per step) and each device's time order. */
  pthread_mutex_t lock;
  bool have_ranges;
  ms_tl_ranges_t ranges;
};

/* Builds the index of every device of tl (made by ms__tl_alloc): devices of TL_PAR_MIN entries or
 * more on threads of their own when two or more are that large, at most threads of them (0: one
 * per online CPU; 1: all on the calling thread), while the temporaries of the builds under way
 * stay within budget bytes (0: a quarter of the free memory; a build alone may exceed it).
 * The result, and the error reported (the first failing device's), do not depend on the number
 * of threads or the budget. */
#define TL_PAR_MIN ((size_t)1 << 16)
int ms__tl_build(ms_timeline_t *tl, size_t threads, size_t budget, ms_errbuf_t *eb);
/* The index of ms_timeline_create with every device's trace in place (d->trace, d->n) and nothing
 * built: for a reader of a stored index, which fills pair, bsize, ckpts and the peaks (index.c).
 * Fails as ms_timeline_create fails before building (devices out of range). */
int ms__tl_alloc(const ms_snapshot_t *snap, const ms_timeline_config_t *cfg, ms_timeline_t **out,
                 ms_errbuf_t *eb);

/* The index's filter, or NULL when it keeps everything. */
static inline const ms_tl_filter_t *tl_filter_of(const ms_timeline_t *tl) {
  return tl->filter.has_stream || tl->filter.has_pool ? &tl->filter : NULL;
}

/* ---- small helpers ------------------------------------------------------------------------- */

static inline uint64_t tl_round(uint64_t req) {
  if (req < 512) return 512;
  if (req > UINT64_MAX - 511) return req;
  return (req + 511) & ~(uint64_t)511;
}

static inline uint64_t tl_snap_requested(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (!(b->present & MS_BLOCK_HAS_FRAMES) && b->stack == MS_SNAP_NO_STACK &&
      (b->present & MS_BLOCK_HAS_HISTORY) && b->nhistory > 0 && b->first_history < s->nhistory)
    return s->history[b->first_history].real_size;
  if ((b->present & MS_BLOCK_HAS_REQUESTED_SIZE) || s->origin == MS_SNAP_ORIGIN_MEMSNAP)
    return b->requested_size;
  return b->size;
}

static inline uint32_t tl_snap_stack(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (b->stack != MS_SNAP_NO_STACK) return b->stack;
  if ((b->present & MS_BLOCK_HAS_HISTORY) && b->nhistory > 0 && b->first_history < s->nhistory)
    return s->history[b->first_history].stack;
  return MS_SNAP_NO_STACK;
}

/* The place of the first block of v whose address is >= addr (the end when none). */
static inline tl_bpos_t tl_blk_lower(const tl_blks_t *v, uint64_t addr) {
  size_t lo = 0, hi = v->nch;
  if (hi == 1) hi = 0; /* one chunk (most segments): its end is the end */
  while (lo < hi) {    /* the first chunk whose last block is at or above addr */
    size_t mid = lo + (hi - lo) / 2;
    const tl_bchunk_t *c = v->ch[mid];
    if (c->b[c->n - 1].address < addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  tl_bpos_t p = {lo, 0};
  if (lo == v->nch) return p;
  const tl_bchunk_t *c = v->ch[lo];
  size_t a = 0, b = c->n;
  while (a < b) {
    size_t mid = a + (b - a) / 2;
    if (c->b[mid].address < addr)
      a = mid + 1;
    else
      b = mid;
  }
  p.o = a;
  if (a == c->n) p = (tl_bpos_t){v->nch, 0}; /* past the only chunk's last block */
  return p;
}

/* The block at p, NULL at the end. */
static inline ms_tl_block_t *tl_blk_at(const tl_blks_t *v, tl_bpos_t p) {
  return p.c < v->nch ? &v->ch[p.c]->b[p.o] : NULL;
}

/* The block before p, NULL at the start. */
static inline ms_tl_block_t *tl_blk_before(const tl_blks_t *v, tl_bpos_t p) {
  if (p.o > 0) return &v->ch[p.c]->b[p.o - 1];
  if (p.c == 0) return NULL;
  tl_bchunk_t *c = v->ch[p.c - 1];
  return &c->b[c->n - 1];
}

/* blocks.c: b inserted at p (its place by address); the block at p removed; v's blocks copied
 * into dst in order (@return their number); n sorted blocks loaded into an empty v; the blocks
 * from p on moved to an empty tail; src's blocks (all above v's) moved to v's end; v emptied. */
int ms__tl_blk_insert(tl_blks_t *v, tl_bpos_t p, const ms_tl_block_t *b);
void ms__tl_blk_remove(tl_blks_t *v, tl_bpos_t p);
size_t ms__tl_blk_copy(const tl_blks_t *v, ms_tl_block_t *dst);
int ms__tl_blk_load(tl_blks_t *v, const ms_tl_block_t *src, size_t n);
int ms__tl_blk_split(tl_blks_t *v, tl_bpos_t p, tl_blks_t *tail);
int ms__tl_blk_append(tl_blks_t *v, tl_blks_t *src);
void ms__tl_blk_free(tl_blks_t *v);

static inline bool tl_filter_keeps_snap(const ms_tl_filter_t *f, const ms_snap_segment_t *g) {
  if (f->has_stream && g->stream != f->stream) return false;
  if (f->has_pool && (g->pool_id[0] != f->pool_id[0] || g->pool_id[1] != f->pool_id[1]))
    return false;
  return true;
}

/* ---- peaks and walks (totals.c) ---------------------------------------------------------- */

/* The highest value of each metric over the steps seen so far and the step where it is first
 * reached: fed steps in any order, ties go to the lower step. */
typedef struct tl_peaks_s {
  uint64_t bytes[MS_TL_METRIC_COUNT];
  size_t step[MS_TL_METRIC_COUNT];
  bool any;
} tl_peaks_t;

static inline void tl_peaks_note(tl_peaks_t *p, size_t step, const uint64_t *totals) {
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    if (!p->any || totals[m] > p->bytes[m] || (totals[m] == p->bytes[m] && step < p->step[m])) {
      p->bytes[m] = totals[m];
      p->step[m] = step;
    }
  p->any = true;
}

/* Called for each step of a walk with the totals at that step (memsnap/timeline.h). */
typedef ms_tl_visit_fn tl_visit_fn;

/* A tl_visit_fn noting the peaks into the tl_peaks_t arg. */
static inline void tl_peaks_visit(void *arg, size_t step,
                                  const uint64_t totals[MS_TL_METRIC_COUNT]) {
  tl_peaks_note(arg, step, totals);
}

/* Brings w to the given step of device dev: restores the nearest checkpoint at or after it and
 * undoes (index.c). @return MS_OK, MS_EINVAL (step past the trace), MS_ENOMEM. */
int ms__tl_reach(const ms_timeline_t *tl, size_t dev, size_t step, tl_ws_t *w);

/* Visits steps to, to - 1, ..., from of device dev (pre: dev < ndev, from <= to <= n), newest
 * first, with the totals at each: restores the checkpoint at or after `to` and undoes entries
 * with the sizes the build chose, so the totals are the final ones. Stores nothing per step; costs
 * one undo per step plus at most one checkpoint interval. Thread-safe (reads the index only).
 * @return MS_OK, MS_ENOMEM. */
int ms__tl_walk(const ms_timeline_t *tl, size_t dev, size_t from, size_t to, tl_visit_fn *fn,
                void *arg);

/* The annotations' ranges of tl's snapshot (ms_tl_ranges_build), built on first use and kept
 * with the index (events.c); thread-safe. NULL when out of memory. */
const ms_tl_ranges_t *ms__tl_ranges(const ms_timeline_t *tl);

/* Makes the series of the metrics in mask (bit 1 << m) of device dev that are not made yet, in
 * one walk; thread-safe (under tl->lock). @return MS_OK, MS_EINVAL (unknown device), MS_ENOMEM. */
int ms__tl_series_make(const ms_timeline_t *tl, size_t dev, unsigned mask);

/* ---- the final sizes of inferred blocks (grow.c) -------------------------------------------- */

/* The steps [lo, hi] between two checkpoints (both ends included), with the highest allocated and
 * active totals of the build pass there (base) and the highest growth that the final sizes add
 * there (grow): base + grow bounds the final totals of those steps from above, so that only the
 * intervals that may hold a peak are walked again (index.c, tl_whole_peaks). */
typedef struct tl_ival_s {
  size_t lo, hi;
  uint64_t base[2], grow[2]; /* [0]: allocated, [1]: active */
} tl_ival_t;
typedef MS_VEC(tl_ival_t) tl_ivals_t;

/* A block of inferred size alive in the build pass (between its free_completed and its alloc). */
typedef struct tl_room_s {
  uint32_t fc1; /* its free_completed entry + 1; 0: an empty slot */
  uint32_t fr;  /* its free_requested entry, TL_NONE until the pass meets one */
  uint64_t end; /* the smallest end of the free room after it so far */
  bool counted; /* its segment passes the filter */
} tl_room_t;

/* A block whose final size is larger than the one the pass gave it. */
typedef struct tl_growth_s {
  uint64_t delta;
  uint32_t fc, fr; /* its free_completed and free_requested (TL_NONE) entries */
  uint32_t start;  /* the step after its alloc; 0 when born before the trace */
} tl_growth_t;

typedef struct tl_grow_s {
  tl_room_t *t; /* open addressing by free_completed entry */
  size_t cap, n;
  MS_VEC(tl_growth_t) grown; /* as the pass met their allocs (newest first), then the rest */
  bool grew;                 /* a block's size changed (inside the filter or not) */
} tl_grow_t;

/* The block freed at entry fc starts its life in the pass, with room up to end. */
int ms__tl_grow_open(tl_grow_t *g, uint32_t fc, uint64_t end, bool counted);
/* The room after fc's block ends at end or below (a neighbour, a segment's unmapped range). */
void ms__tl_grow_limit(tl_grow_t *g, uint32_t fc, uint64_t end);
/* fc's block was requested free at entry fr. */
void ms__tl_grow_freq(tl_grow_t *g, uint32_t fc, uint32_t fr);
/* fc's block ends its life in the pass (its alloc): its final size into d->bsize. */
int ms__tl_grow_close(tl_grow_t *g, tl_dev_t *d, uint32_t fc);
/* Every block still open at the pass's end (born before the trace), in entry order. */
int ms__tl_grow_close_all(tl_grow_t *g, tl_dev_t *d);
/* The growth added to d's checkpoints (sizes and totals) and to the intervals' grow bounds;
 * called when g->grew. */
int ms__tl_grow_apply(tl_grow_t *g, tl_dev_t *d, tl_ivals_t *iv);
void ms__tl_grow_free(tl_grow_t *g);

/* ---- undo and redo (state.c) --------------------------------------------------------------- */

typedef struct tl_ctx_s {
  const ms_timeline_t *tl;
  tl_dev_t *d;
  size_t dev;
  bool building;   /* record the sizes of blocks removed by an undone alloc */
  tl_grow_t *grow; /* building: the room of the blocks whose size is inferred; NULL otherwise */
  ms_errbuf_t *eb;
} tl_ctx_t;

void ms__tl_ckpt_free(tl_ckpt_t *c);
int ms__tl_ckpt_restore(const tl_ckpt_t *c, tl_ws_t *w);
/* A checkpoint of w at step into c: its arrays carved from pool's chunks, or malloc'd when pool
 * is NULL. */
int ms__tl_ckpt_take(const tl_ws_t *w, size_t step, tl_ckpt_t *c, tl_dev_t *pool);
int ms__tl_redo(tl_ctx_t *c, tl_ws_t *w, size_t i);
int ms__tl_undo(tl_ctx_t *c, tl_ws_t *w, size_t i);
void ms__tl_ws_release(tl_ws_t *w);
void ms__tl_totals_block(tl_ws_t *w, const ms_tl_segment_t *seg, const ms_tl_block_t *b, int sign);

#endif /* MEMSNAP_LIB_TIMELINE_INTERNAL_H */
