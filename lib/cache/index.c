/* SPDX-License-Identifier: MIT
 * memsnap cache: the time index's file (memsnap/cache.h, ms_cache_index_*). What `top`,
 * `timeline`, `memory --at` and the classifier need after reading a snapshot is its time index
 * (memsnap/timeline.h): per device, the alloc/free pairs, the chosen block sizes, the four series
 * and the checkpoints. Building it is a pass over the whole trace; this file stores it so that a
 * later run decodes it instead.
 *
 * The file, all integers little-endian, every u64 8-byte aligned:
 *   header (IX_HEADER_BYTES): magic "memsnapI", u32 version, u32 load flags, u64 content hash,
 *     u64 input size, u64 file length, u64 body checksum, u32 checkpoint interval, u32 filter
 *     bits (1: stream, 2: pool), u64 stream, i64 pool[2], u64 devices, u64 header checksum;
 *   per device: u64 entries (n), u64 checkpoints, 4 x u64 the series' first values; the entries'
 *     stream (below, padded to 8 bytes); each checkpoint: u64 step, u64 segments, u64 blocks,
 *     4 x u64 totals, then the records of its segments and of its blocks (varints, each described
 *     where it is written: ixw_segment, ixw_block), padded to 8 bytes.
 *   The entries' stream holds for each entry a u16 code word, then the varints it calls for
 *     (lib/cache/varint.h). Its pair: none, the entry that named this one as its pair (an alloc's
 *     free names its alloc so), or a varint of the zigzag difference from this entry. Its block
 *     size: the guess (its earlier pair's, the rounded request of an alloc or a free, else 0), or
 *     the guess plus a varint of the zigzag difference. Each series' change from this entry's step
 *     to the next: a code, 0 or plus or minus the entry's block size, its size or its rounded size,
 *     or 7 and a varint of the zigzag change. An entry takes 2 bytes, an alloc and a free paired
 *     far apart 4 to 5 (the arrays at full width took 44). On the 937 MB synthetic pickle the
 *     file is 20 MB: 14.5 for the entries, the rest for 941 checkpoints (261 MB at full width).
 * The checksums are those of the snapshot's file (lib/cache/internal.h).
 *
 * A file is refused (never trusted) unless, besides magic, version, key, configuration, length and
 * checksums: its devices and their entry counts are the snapshot's; every pair is none or an entry
 * of the device, and every entry's stream is whole, with known codes and a pair named before;
 * each device's checkpoints have increasing steps, the last at the end of the trace; every
 * record of a checkpoint is whole, with known flags; each checkpoint's segments are sorted and disjoint, its block counts add up to its blocks, each
 * block lies inside its segment after the previous one, every index in a segment or block (entries,
 * stacks, the snapshot's segments and blocks) is in range, every state and flag is one the index
 * makes, and the totals are the series' at that step. Wrong numbers in the pairs, sizes or series of
 * a forged file give wrong answers, never a crash: the index's readers check what they index with.
 */
#include <errno.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cache/internal.h"
#include "cache/varint.h"
#include "common/internal.h"
#include "memsnap/cache.h"
#include "timeline/internal.h"

#define IX_MAGIC "memsnapI"
#define IX_HEADER_BYTES 96u
#define IX_BLOCK_FLAGS (MS_TL_BLOCK_FROM_SNAPSHOT | MS_TL_BLOCK_SIZE_INFERRED | \
                        MS_TL_BLOCK_ALLOC_UNRECORDED)


static void ix_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void ix_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint64_t ix_rd64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint32_t ix_rd32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ---- writing -------------------------------------------------------------------------------- */

/* The index's body goes through the writer the snapshot's file uses (cache_out_t, format.c). */
typedef cache_out_t ixw_t;

static void ixw_u64(ixw_t *w, uint64_t v) {
  unsigned char b[8];
  ix_le64(b, v);
  ms__cache_out_put(w, b, 8);
}

static void ixw_pad8(ixw_t *w) {
  static const unsigned char zero[8];
  if (w->pos % 8) ms__cache_out_put(w, zero, 8 - (size_t)(w->pos % 8));
}

/* ---- a checkpoint's segments (both ways) ---------------------------------------------------- */

/* Each segment of a checkpoint: a byte saying which of its fields (IXS_*) differ from the guess,
 * a varint of the zigzag change of its snapshot segment + 1 (0: none) from the previous
 * segment's, less one, a varint of its number of blocks, then of each differing field the zigzag
 * difference from the guess: its snapshot segment's fields, or for a segment of the trace the
 * previous segment's, starting where that one ends. */
enum { IXS_ADDRESS, IXS_SIZE, IXS_STREAM, IXS_POOL0, IXS_POOL1, IXS_EXPANDABLE, IXS_STACK,
       IXS_COUNT };
#define IXS_MIN_BYTES 3u

static void ix_seg_fields(const ms_tl_segment_t *g, uint64_t v[IXS_COUNT]) {
  v[IXS_ADDRESS] = g->address;
  v[IXS_SIZE] = g->size;
  v[IXS_STREAM] = g->stream;
  v[IXS_POOL0] = (uint64_t)g->pool_id[0];
  v[IXS_POOL1] = (uint64_t)g->pool_id[1];
  v[IXS_EXPANDABLE] = g->is_expandable;
  v[IXS_STACK] = g->stack;
}

/* The guess of a segment: snapshot segment sn - 1 (sn in range), else after prev (NULL: none). */
static void ix_seg_guess(const ms_snapshot_t *s, uint64_t sn, const ms_tl_segment_t *prev,
                         uint64_t g[IXS_COUNT]) {
  memset(g, 0, IXS_COUNT * sizeof *g);
  if (sn) {
    const ms_snap_segment_t *k = &s->segments[sn - 1];
    g[IXS_ADDRESS] = k->address;
    g[IXS_SIZE] = k->total_size;
    g[IXS_STREAM] = k->stream;
    g[IXS_POOL0] = (uint64_t)k->pool_id[0];
    g[IXS_POOL1] = (uint64_t)k->pool_id[1];
    g[IXS_EXPANDABLE] = k->is_expandable;
    g[IXS_STACK] = k->stack;
  } else if (prev) {
    ix_seg_fields(prev, g);
    g[IXS_ADDRESS] = prev->address + prev->size;
  }
}

/* Segment i of checkpoint ck (of snapshot s) into w; false when it names no snapshot segment. */
static bool ixw_segment(ixw_t *w, const ms_snapshot_t *s, const tl_ckpt_t *ck, size_t i) {
  const ms_tl_segment_t *g = &ck->segs[i];
  uint64_t sn = (uint32_t)(g->snap_segment + 1u);
  uint64_t prev_sn = i ? (uint32_t)(ck->segs[i - 1].snap_segment + 1u) : 0;
  if (sn > s->nsegments) return false;
  unsigned char rec[1 + (2 + IXS_COUNT) * CACHE_VAR_MAX];
  uint64_t guess[IXS_COUNT], v[IXS_COUNT];
  ix_seg_guess(s, sn, i ? &ck->segs[i - 1] : NULL, guess);
  ix_seg_fields(g, v);
  size_t k = 1;
  rec[0] = 0;
  k += cache_put_var(rec + k, cache_zigzag(sn - prev_sn - 1));
  k += cache_put_var(rec + k, ck->seg_nblk[i]);
  for (int f = 0; f < IXS_COUNT; f++) {
    if (v[f] == guess[f]) continue;
    rec[0] |= (unsigned char)(1u << f);
    k += cache_put_var(rec + k, cache_zigzag(v[f] - guess[f]));
  }
  ms__cache_out_put(w, rec, k);
  return true;
}

/* ---- a checkpoint's blocks (both ways) ------------------------------------------------------ */

/* Each block of a checkpoint: a byte of its state (bit 0: pending free) and flags (bits 1-3), a
 * byte saying which of its fields (IXB_*) differ from the guess, varints of the zigzag distances
 * of its alloc and free entries from the checkpoint's step, then of each differing field the
 * zigzag difference from the guess: the block its entries make (address, request, stream,
 * stack, the alloc's time; the size chosen for its free, else its alloc; no snapshot block). */
enum { IXB_ADDRESS, IXB_SIZE, IXB_REQUESTED, IXB_STREAM, IXB_TIME, IXB_STACK, IXB_SNAP, IXB_COUNT };
#define IXB_MIN_BYTES 4u

static void ix_block_guess(const tl_dev_t *d, int64_t ai, int64_t fi, uint64_t g[IXB_COUNT]) {
  memset(g, 0, IXB_COUNT * sizeof *g);
  const ms_snap_trace_t *src = ai >= 0 ? &d->trace[ai] : fi >= 0 ? &d->trace[fi] : NULL;
  if (src) {
    g[IXB_ADDRESS] = src->addr;
    g[IXB_REQUESTED] = src->size;
    g[IXB_STREAM] = ms_snap_trace_stream(src);
    g[IXB_STACK] = src->stack;
  }
  if (ai >= 0) g[IXB_TIME] = (uint64_t)d->trace[ai].time_us;
  g[IXB_SIZE] = fi >= 0 ? tl_bsize(d, (size_t)fi) : ai >= 0 ? tl_bsize(d, (size_t)ai) : 0;
  g[IXB_SNAP] = UINT32_MAX;
}

static void ix_block_fields(const ms_tl_block_t *b, uint64_t v[IXB_COUNT]) {
  v[IXB_ADDRESS] = b->address;
  v[IXB_SIZE] = b->size;
  v[IXB_REQUESTED] = b->requested_size;
  v[IXB_STREAM] = b->stream;
  v[IXB_TIME] = (uint64_t)b->time_us;
  v[IXB_STACK] = b->stack;
  v[IXB_SNAP] = b->snap_block;
}

/* Block b of the checkpoint at step into w; false when its state or flags cannot be written. */
static bool ixw_block(ixw_t *w, const tl_dev_t *d, size_t step, const ms_tl_block_t *b) {
  if ((b->state != MS_BLOCK_ACTIVE_ALLOCATED && b->state != MS_BLOCK_ACTIVE_PENDING_FREE) ||
      (b->flags & ~(uint32_t)IX_BLOCK_FLAGS) || b->alloc_entry < -1 ||
      b->alloc_entry >= (int64_t)d->n || b->free_entry < -1 || b->free_entry >= (int64_t)d->n)
    return false;
  unsigned char rec[2 + (2 + IXB_COUNT) * CACHE_VAR_MAX];
  uint64_t g[IXB_COUNT], v[IXB_COUNT];
  ix_block_guess(d, b->alloc_entry, b->free_entry, g);
  ix_block_fields(b, v);
  rec[0] = (unsigned char)((b->state == MS_BLOCK_ACTIVE_PENDING_FREE ? 1u : 0u) | b->flags << 1);
  rec[1] = 0;
  size_t k = 2;
  k += cache_put_var(rec + k, cache_zigzag((uint64_t)b->alloc_entry - step));
  k += cache_put_var(rec + k, cache_zigzag((uint64_t)b->free_entry - step));
  for (int f = 0; f < IXB_COUNT; f++) {
    if (v[f] == g[f]) continue;
    rec[1] |= (unsigned char)(1u << f);
    k += cache_put_var(rec + k, cache_zigzag(v[f] - g[f]));
  }
  ms__cache_out_put(w, rec, k);
  return true;
}

/* ---- the entries' stream (both ways) -------------------------------------------------------- */

/* Each entry's code word (u16): its pair (bits 0-1), whether its block size differs from the guess
 * (bit 2), and for each metric m the code of its series' change (bits 3 + 3m .. 5 + 3m). */
enum { IXC_PAIR_NONE = 0, IXC_PAIR_PARTNER = 1, IXC_PAIR_AT = 2 };
#define IXC_BSIZE_AT 4u
#define IXC_METRIC_SHIFT 3
#define IXC_ESCAPE 7u
#define IXC_UNUSED 0x8000u

/* The guess of entry i's block size: its partner's (a free after its alloc), the rounded request
 * of an alloc or a free, else 0 (what the index gives the other actions). */
static uint64_t ix_bsize_guess(const tl_dev_t *d, size_t i, uint32_t pair) {
  const ms_snap_trace_t *e = &d->trace[i];
  if (pair != TL_NONE && pair < i) return tl_bsize(d, pair);
  if (e->action == MS_TRACE_ALLOC || e->action == MS_TRACE_FREE_COMPLETED) return tl_round(e->size);
  return 0;
}

/* A series' change at an entry, from its code: nothing, plus or minus the entry's block size (b),
 * its size (s) or its rounded size (r); IXC_ESCAPE: none of them (the change follows). */
static uint64_t ix_metric_delta(unsigned code, uint64_t b, uint64_t s, uint64_t r) {
  switch (code) {
  case 1: return b;
  case 2: return 0 - b;
  case 3: return s;
  case 4: return 0 - s;
  case 5: return r;
  case 6: return 0 - r;
  default: return 0;
  }
}

/* Adds an entry's changes of the four totals (coded in word, escaped ones read from *p) to cur:
 * b its block's size, sz its size. @return false when an escaped change is cut short. */
static bool ixr_add_deltas(const unsigned char **p, const unsigned char *end, unsigned word,
                           uint64_t b, uint64_t sz, uint64_t cur[MS_TL_METRIC_COUNT]) {
  uint64_t rs = tl_round(sz), v;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    unsigned c = word >> (IXC_METRIC_SHIFT + 3 * m) & 7u;
    uint64_t delta = ix_metric_delta(c, b, sz, rs);
    if (c == IXC_ESCAPE) {
      if (!cache_get_var(p, end, &v)) return false;
      delta = cache_unzigzag(v);
    }
    cur[m] += delta;
  }
  return true;
}

static unsigned ix_metric_code(uint64_t delta, uint64_t b, uint64_t s, uint64_t r) {
  for (unsigned c = 0; c < IXC_ESCAPE; c++)
    if (ix_metric_delta(c, b, s, r) == delta) return c;
  return IXC_ESCAPE;
}

/* Entry i's record into rec (room for 2 + 6 varints); its length. prov: the pair that the reader
 * holds for each later entry (written ahead by an earlier entry that names it); t: the four
 * totals at step i, then at step i + 1. */
static size_t ixw_entry(const tl_dev_t *d, size_t i, uint32_t *prov, const uint64_t *t,
                        unsigned char *rec) {
  unsigned word = 0;
  size_t k = 2;
  uint32_t pr = d->pair[i];
  if (pr == TL_NONE) {
    word = IXC_PAIR_NONE;
  } else if (prov[i] == pr) {
    word = IXC_PAIR_PARTNER;
  } else {
    word = IXC_PAIR_AT;
    k += cache_put_var(rec + k, cache_zigzag((uint64_t)pr - i));
    if (pr > i && pr < d->n) prov[pr] = (uint32_t)i;
  }
  uint64_t diff = tl_bsize(d, i) - ix_bsize_guess(d, i, pr);
  if (diff) {
    word |= IXC_BSIZE_AT;
    k += cache_put_var(rec + k, cache_zigzag(diff));
  }
  uint64_t b = tl_bsize(d, i), s = d->trace[i].size, r = tl_round(s);
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    uint64_t delta = t[MS_TL_METRIC_COUNT + m] - t[m];
    unsigned c = ix_metric_code(delta, b, s, r);
    if (c == IXC_ESCAPE) k += cache_put_var(rec + k, cache_zigzag(delta));
    word |= c << (IXC_METRIC_SHIFT + 3 * m);
  }
  rec[0] = (unsigned char)word;
  rec[1] = (unsigned char)(word >> 8);
  return k;
}

/* The totals of steps [lo, hi] into win (4 values a step): one walk down from the checkpoint
 * at hi (timeline/internal.h). */
typedef struct ixw_win_s {
  uint64_t *t;
  size_t lo;
} ixw_win_t;

static void ixw_win_visit(void *arg, size_t step, const uint64_t totals[MS_TL_METRIC_COUNT]) {
  ixw_win_t *win = arg;
  memcpy(win->t + (step - win->lo) * MS_TL_METRIC_COUNT, totals,
         MS_TL_METRIC_COUNT * sizeof *totals);
}

/* The entries' stream of device dev. The index keeps no series (issue #33): each interval
 * between checkpoints is walked once into a window of its totals, then its entries written, so
 * the writer holds one interval's totals at a time, not the 32 bytes a step of the series. */
static bool ixw_entries(ixw_t *w, const ms_timeline_t *tl, size_t dev) {
  const tl_dev_t *d = &tl->dev[dev];
  size_t n = d->n, span = 0, lo = 0;
  for (size_t c = 0; c < d->ckpts.len; c++) {
    size_t gap = d->ckpts.ptr[c].step - (c ? d->ckpts.ptr[c - 1].step : 0);
    if (gap > span) span = gap;
  }
  uint32_t *prov = ms__big_malloc((n ? n : 1) * sizeof *prov);
  ixw_win_t win = {ms__big_malloc((span + 1) * MS_TL_METRIC_COUNT * sizeof(uint64_t)), 0};
  bool ok = prov && win.t;
  if (ok) memset(prov, 0xff, (n ? n : 1) * sizeof *prov);
  unsigned char rec[2 + (1 + 1 + MS_TL_METRIC_COUNT) * CACHE_VAR_MAX];
  for (size_t c = 0; ok && c < d->ckpts.len; c++) {
    size_t hi = d->ckpts.ptr[c].step;
    win.lo = lo;
    ok = ms__tl_walk(tl, dev, lo, hi, ixw_win_visit, &win) == MS_OK;
    if (ok && c == 0) /* the series' first values come first (lo is 0) */
      for (int m = 0; m < MS_TL_METRIC_COUNT; m++) ixw_u64(w, win.t[m]);
    for (size_t i = lo; ok && i < hi; i++)
      ms__cache_out_put(w, rec,
                        ixw_entry(d, i, prov, win.t + (i - lo) * MS_TL_METRIC_COUNT, rec));
    lo = hi;
  }
  ms__big_free(win.t);
  ms__big_free(prov);
  return ok;
}

static bool ixw_device(ixw_t *w, const ms_timeline_t *tl, size_t dev) {
  const ms_snapshot_t *snap = tl->snap;
  const tl_dev_t *d = &tl->dev[dev];
  ixw_u64(w, d->n);
  ixw_u64(w, d->ckpts.len);
  if (!ixw_entries(w, tl, dev)) return false;
  ixw_pad8(w);
  for (size_t c = 0; c < d->ckpts.len; c++) {
    const tl_ckpt_t *ck = &d->ckpts.ptr[c];
    ixw_u64(w, ck->step);
    ixw_u64(w, ck->nsegs);
    ixw_u64(w, ck->nblocks);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) ixw_u64(w, ck->totals[m]);
    for (size_t i = 0; i < ck->nsegs; i++)
      if (!ixw_segment(w, snap, ck, i)) w->failed = true;
    for (size_t i = 0; i < ck->nblocks; i++)
      if (!ixw_block(w, d, ck->step, &ck->blocks[i])) w->failed = true;
    ixw_pad8(w);
  }
  return true;
}

static unsigned ix_filter_bits(const ms_tl_filter_t *f) {
  return (f->has_stream ? 1u : 0u) | (f->has_pool ? 2u : 0u);
}

/* The header for a body of body_len bytes with checksum sum. */
static void ix_header(unsigned char *h, const ms_timeline_t *tl, const ms_cache_key_t *key,
                      uint64_t file_len, uint64_t sum) {
  memset(h, 0, IX_HEADER_BYTES);
  memcpy(h, IX_MAGIC, 8);
  ix_le32(h + 8, MS_CACHE_VERSION);
  ix_le32(h + 12, key->flags);
  ix_le64(h + 16, key->hash);
  ix_le64(h + 24, key->size);
  ix_le64(h + 32, file_len);
  ix_le64(h + 40, sum);
  ix_le32(h + 48, tl->k);
  ix_le32(h + 52, ix_filter_bits(&tl->filter));
  ix_le64(h + 56, tl->filter.has_stream ? tl->filter.stream : 0);
  ix_le64(h + 64, tl->filter.has_pool ? (uint64_t)tl->filter.pool_id[0] : 0);
  ix_le64(h + 72, tl->filter.has_pool ? (uint64_t)tl->filter.pool_id[1] : 0);
  ix_le64(h + 80, tl->ndev);
  ix_le64(h + 88, cache_checksum(h, 88));
}

/* The index's file to fd (a new, empty file; the header is written last) or, fd < 0, to memory. */
static int ix_write(const ms_timeline_t *tl, const ms_cache_key_t *key, int fd, void **buf,
                    size_t *len) {
  ixw_t w = {.fd = fd, .pos = IX_HEADER_BYTES, .sum = 0x6d656d736e617073ULL};
  w.chunk = malloc(CACHE_SUM_CHUNK);
  if (!w.chunk) return MS_ENOMEM;
  unsigned char h[IX_HEADER_BYTES] = {0};
  if (fd >= 0) {
    if (lseek(fd, IX_HEADER_BYTES, SEEK_SET) != (off_t)IX_HEADER_BYTES) w.failed = true;
  } else {
    ms__cache_out_raw(&w, h, sizeof h); /* room for it */
  }
  bool nomem = false;
  for (size_t i = 0; i < tl->ndev && !nomem; i++) nomem = !ixw_device(&w, tl, i);
  ms__cache_out_flush(&w);
  uint64_t body = w.pos - IX_HEADER_BYTES;
  w.sum = ms_hash_step(w.sum, body);
  ix_header(h, tl, key, w.pos, w.sum);
  free(w.chunk);
  if (nomem) {
    free(w.mem);
    return MS_ENOMEM;
  }
  if (fd >= 0) {
    if (!w.failed && pwrite(fd, h, sizeof h, 0) != (ssize_t)sizeof h) w.failed = true;
    if (w.failed) return MS_EIO;
    *len = (size_t)w.pos;
    return MS_OK;
  }
  if (w.failed) {
    free(w.mem);
    return MS_ENOMEM;
  }
  memcpy(w.mem, h, sizeof h);
  *buf = w.mem;
  *len = w.mem_len;
  return MS_OK;
}

int ms__cache_index_write_fd(int fd, const ms_timeline_t *tl, const ms_cache_key_t *key,
                             size_t *len) {
  return ix_write(tl, key, fd, NULL, len);
}

int ms_cache_index_encode(const ms_timeline_t *tl, const ms_cache_key_t *key, void **buf,
                          size_t *len) {
  if (!tl || !key || !buf || !len) return MS_EINVAL;
  return ix_write(tl, key, -1, buf, len);
}

/* ---- reading -------------------------------------------------------------------------------- */

typedef struct ixr_s {
  const unsigned char *p;
  size_t len, off;
  ms_errbuf_t *eb;
} ixr_t;

static int ix_bad(ixr_t *r, const char *what) {
  return ms__errbuf_set(r->eb, MS_EFORMAT, "cache index: %s (offset %zu)", what, r->off);
}

/* The next n x width bytes (8-aligned start), or NULL when they do not fit. */
static const unsigned char *ixr_take(ixr_t *r, uint64_t count, size_t width) {
  if (r->off % 8) r->off += 8 - r->off % 8;
  if (r->off > r->len || count > (r->len - r->off) / width) return NULL;
  const unsigned char *q = r->p + r->off;
  r->off += (size_t)count * width;
  return q;
}

static bool ixr_u64(ixr_t *r, uint64_t *v) {
  const unsigned char *q = ixr_take(r, 1, 8);
  if (!q) return false;
  *v = ix_rd64(q);
  return true;
}

static bool ix_stack_ok(const ms_snapshot_t *s, uint32_t st) {
  return st == MS_SNAP_NO_STACK || st < s->nstacks;
}

/* The segment at *pp (before end) of checkpoint ck into ck->segs[i] and its block count into
 * ck->seg_nblk[i]; *pp moved past it. */
static int ixr_segment(ixr_t *r, const unsigned char **pp, const unsigned char *end,
                       const ms_snapshot_t *s, tl_ckpt_t *ck, size_t i) {
  ms_tl_segment_t *g = &ck->segs[i];
  memset(g, 0, sizeof *g);
  const unsigned char *p = *pp;
  r->off = (size_t)(p - r->p);
  uint64_t dsn, nb, v[IXS_COUNT];
  if (p >= end) return ix_bad(r, "a segment is cut short");
  unsigned mask = *p++;
  if (mask >> IXS_COUNT) return ix_bad(r, "a segment has unknown flags");
  if (!cache_get_var(&p, end, &dsn) || !cache_get_var(&p, end, &nb))
    return ix_bad(r, "a segment is cut short");
  uint64_t prev_sn = i ? (uint32_t)(ck->segs[i - 1].snap_segment + 1u) : 0;
  uint64_t sn = prev_sn + 1 + cache_unzigzag(dsn);
  if (sn > s->nsegments) return ix_bad(r, "a segment names no segment of the snapshot");
  if (nb > UINT32_MAX) return ix_bad(r, "a checkpoint's block counts exceed its blocks");
  ix_seg_guess(s, sn, i ? &ck->segs[i - 1] : NULL, v);
  for (int f = 0; f < IXS_COUNT; f++) {
    uint64_t x;
    if (!(mask >> f & 1)) continue;
    if (!cache_get_var(&p, end, &x)) return ix_bad(r, "a segment is cut short");
    v[f] += cache_unzigzag(x);
  }
  *pp = p;
  if (v[IXS_EXPANDABLE] > 1) return ix_bad(r, "a segment's flag is not 0 or 1");
  if (v[IXS_STACK] > UINT32_MAX) return ix_bad(r, "a segment's stack is out of range");
  g->address = v[IXS_ADDRESS];
  g->size = v[IXS_SIZE];
  g->stream = v[IXS_STREAM];
  g->pool_id[0] = (int64_t)v[IXS_POOL0];
  g->pool_id[1] = (int64_t)v[IXS_POOL1];
  g->is_expandable = v[IXS_EXPANDABLE] == 1;
  g->stack = (uint32_t)v[IXS_STACK];
  g->snap_segment = (uint32_t)(sn - 1); /* 0 - 1: UINT32_MAX, none */
  ck->seg_nblk[i] = (uint32_t)nb;
  if (g->address + g->size < g->address) return ix_bad(r, "a segment wraps around");
  if (!ix_stack_ok(s, g->stack)) return ix_bad(r, "a segment's stack is out of range");
  return MS_OK;
}

/* The block at *pp (before end) of the checkpoint at step of device d into b; *pp moved past it. */
static int ixr_block(ixr_t *r, const unsigned char **pp, const unsigned char *end,
                     const ms_snapshot_t *s, const tl_dev_t *d, size_t step, ms_tl_block_t *b) {
  memset(b, 0, sizeof *b);
  const unsigned char *p = *pp;
  r->off = (size_t)(p - r->p);
  uint64_t ai, fi;
  if (end - p < 2) return ix_bad(r, "a block is cut short");
  unsigned head = p[0], mask = p[1];
  p += 2;
  if (head >> 4 || mask >> IXB_COUNT) return ix_bad(r, "a block has unknown flags");
  if (!cache_get_var(&p, end, &ai) || !cache_get_var(&p, end, &fi))
    return ix_bad(r, "a block is cut short");
  b->alloc_entry = (int64_t)(step + cache_unzigzag(ai));
  b->free_entry = (int64_t)(step + cache_unzigzag(fi));
  if (b->alloc_entry < -1 || b->alloc_entry >= (int64_t)d->n || b->free_entry < -1 ||
      b->free_entry >= (int64_t)d->n)
    return ix_bad(r, "a block's trace entry is out of range");
  uint64_t v[IXB_COUNT];
  ix_block_guess(d, b->alloc_entry, b->free_entry, v);
  for (int f = 0; f < IXB_COUNT; f++) {
    uint64_t x;
    if (!(mask >> f & 1)) continue;
    if (!cache_get_var(&p, end, &x)) return ix_bad(r, "a block is cut short");
    v[f] += cache_unzigzag(x);
  }
  *pp = p;
  if (v[IXB_STACK] > UINT32_MAX || v[IXB_SNAP] > UINT32_MAX)
    return ix_bad(r, "a block's stack is out of range");
  b->address = v[IXB_ADDRESS];
  b->size = v[IXB_SIZE];
  b->requested_size = v[IXB_REQUESTED];
  b->stream = v[IXB_STREAM];
  b->time_us = (int64_t)v[IXB_TIME];
  b->stack = (uint32_t)v[IXB_STACK];
  b->snap_block = (uint32_t)v[IXB_SNAP];
  b->state = head & 1 ? MS_BLOCK_ACTIVE_PENDING_FREE : MS_BLOCK_ACTIVE_ALLOCATED;
  b->flags = head >> 1;
  if (!ix_stack_ok(s, b->stack)) return ix_bad(r, "a block's stack is out of range");
  if (b->snap_block != UINT32_MAX && b->snap_block >= s->nblocks)
    return ix_bad(r, "a block names no block of the snapshot");
  if (b->address + b->size < b->address) return ix_bad(r, "a block wraps around");
  return MS_OK;
}

/* One checkpoint of a device of n entries, into ck (its arrays malloc'd). */
static int ix_ckpt(ixr_t *r, const ms_snapshot_t *s, const tl_dev_t *d, tl_ckpt_t *ck) {
  uint64_t step, nsegs, nblocks;
  if (!ixr_u64(r, &step) || !ixr_u64(r, &nsegs) || !ixr_u64(r, &nblocks))
    return ix_bad(r, "a checkpoint is cut short");
  if (step > d->n) return ix_bad(r, "a checkpoint lies past the trace");
  ck->step = (size_t)step;
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) /* checked against the series by the caller */
    if (!ixr_u64(r, &ck->totals[m])) return ix_bad(r, "a checkpoint is cut short");
  /* the segments' and the blocks' records, IXS_MIN_BYTES and IXB_MIN_BYTES or more each */
  const unsigned char *q = ixr_take(r, 0, 1);
  if (!q || nsegs > (r->len - r->off) / IXS_MIN_BYTES ||
      nblocks > (r->len - r->off) / IXB_MIN_BYTES)
    return ix_bad(r, "a checkpoint is cut short");
  const unsigned char *file_end = r->p + r->len;
  ck->nsegs = (size_t)nsegs;
  ck->nblocks = (size_t)nblocks;
  ck->segs = malloc((nsegs ? nsegs : 1) * sizeof *ck->segs);
  ck->seg_nblk = malloc((nsegs ? nsegs : 1) * sizeof *ck->seg_nblk);
  ck->blocks = malloc((nblocks ? nblocks : 1) * sizeof *ck->blocks);
  if (!ck->segs || !ck->seg_nblk || !ck->blocks) return MS_ENOMEM;
  for (size_t i = 0; i < nsegs; i++) {
    int rc = ixr_segment(r, &q, file_end, s, ck, i);
    if (rc != MS_OK) return rc;
    if (i > 0 && ck->segs[i - 1].address + ck->segs[i - 1].size > ck->segs[i].address)
      return ix_bad(r, "a checkpoint's segments overlap or are out of order");
  }
  uint64_t k = 0;
  for (size_t i = 0; i < nsegs; i++) {
    const ms_tl_segment_t *g = &ck->segs[i];
    uint32_t nb = ck->seg_nblk[i];
    if (nb > nblocks - k) return ix_bad(r, "a checkpoint's block counts exceed its blocks");
    uint64_t end = g->address;
    for (uint32_t j = 0; j < nb; j++, k++) {
      ms_tl_block_t *b = &ck->blocks[k];
      int rc = ixr_block(r, &q, file_end, s, d, ck->step, b);
      if (rc != MS_OK) return rc;
      if (b->address < end || b->address + b->size > g->address + g->size)
        return ix_bad(r, "a checkpoint's block lies outside its segment or overlaps another");
      end = b->address + b->size;
    }
  }
  if (k != nblocks) return ix_bad(r, "a checkpoint's block counts do not add up to its blocks");
  r->off = (size_t)(q - r->p);
  if (!ixr_take(r, 0, 1)) return ix_bad(r, "a checkpoint is cut short"); /* its padding */
  return MS_OK;
}

/* The entries' stream of a device of n entries at r->off into d's pair and bsize, and the peaks
 * of its series (the first values given) into d: the index keeps no series (issue #33), so the
 * series' changes are summed as they are read; r->off moved past it. */
static int ixr_entries(ixr_t *r, tl_dev_t *d, size_t n, const uint64_t first[]) {
  const unsigned char *p = r->p + r->off, *end = r->p + r->len;
  uint32_t *pair = d->pair;
  uint64_t cur[MS_TL_METRIC_COUNT];
  memcpy(cur, first, sizeof cur);
  tl_peaks_t pk;
  memset(&pk, 0, sizeof pk);
  tl_peaks_note(&pk, 0, cur);
  if (n) memset(pair, 0xff, n * sizeof *pair); /* TL_NONE, until an earlier entry names one */
  for (size_t i = 0; i < n; i++) {
    r->off = (size_t)(p - r->p);
    if (end - p < 2) return ix_bad(r, "an entry is cut short");
    unsigned word = (unsigned)p[0] | (unsigned)p[1] << 8;
    p += 2;
    uint64_t v;
    if (word & IXC_UNUSED) return ix_bad(r, "an entry has an unknown code");
    switch (word & 3u) {
    case IXC_PAIR_NONE:
      pair[i] = TL_NONE;
      break;
    case IXC_PAIR_PARTNER:
      if (pair[i] == TL_NONE) return ix_bad(r, "an entry's pair was named by no earlier entry");
      break;
    case IXC_PAIR_AT:
      if (!cache_get_var(&p, end, &v)) return ix_bad(r, "an entry is cut short");
      v = (uint64_t)i + cache_unzigzag(v);
      if (v >= n) return ix_bad(r, "a pair names no entry of its device");
      pair[i] = (uint32_t)v;
      if (v > i) pair[v] = (uint32_t)i;
      break;
    default:
      return ix_bad(r, "an entry has an unknown code");
    }
    uint64_t bsize = ix_bsize_guess(d, i, pair[i]);
    if (word & IXC_BSIZE_AT) {
      if (!cache_get_var(&p, end, &v)) return ix_bad(r, "an entry is cut short");
      bsize += cache_unzigzag(v);
    }
    if (tl_bsize_set(d, i, bsize) != MS_OK) return MS_ENOMEM;
    if (!ixr_add_deltas(&p, end, word, bsize, d->trace[i].size, cur))
      return ix_bad(r, "an entry is cut short");
    tl_peaks_note(&pk, i + 1, cur);
  }
  r->off = (size_t)(p - r->p);
  memcpy(d->peak_bytes, pk.bytes, sizeof d->peak_bytes);
  memcpy(d->peak_step, pk.step, sizeof d->peak_step);
  d->has_peaks = true;
  return MS_OK;
}

/* Checks each checkpoint's totals against the series read again from the entries' stream at
 * off (read whole by ixr_entries, so only the series' changes are decoded here: the pairs' and
 * sizes' varints are skipped): what ix_ckpt checked against the stored series when the index
 * kept them. */
static int ixr_check_totals(ixr_t *r, const tl_dev_t *d, size_t off, const uint64_t first[]) {
  const unsigned char *p = r->p + off, *end = r->p + r->len;
  uint64_t cur[MS_TL_METRIC_COUNT], v;
  memcpy(cur, first, sizeof cur);
  size_t k = 0;
  for (size_t step = 0;; step++) {
    for (; k < d->ckpts.len && d->ckpts.ptr[k].step == step; k++)
      if (memcmp(d->ckpts.ptr[k].totals, cur, sizeof cur) != 0)
        return ix_bad(r, "a checkpoint's totals are not the series'");
    if (step == d->n || k == d->ckpts.len) return MS_OK;
    if (end - p < 2) return ix_bad(r, "an entry is cut short");
    unsigned word = (unsigned)p[0] | (unsigned)p[1] << 8;
    p += 2;
    if ((word & 3u) == IXC_PAIR_AT && !cache_get_var(&p, end, &v))
      return ix_bad(r, "an entry is cut short");
    if ((word & IXC_BSIZE_AT) && !cache_get_var(&p, end, &v))
      return ix_bad(r, "an entry is cut short");
    if (!ixr_add_deltas(&p, end, word, tl_bsize(d, step), d->trace[step].size, cur))
      return ix_bad(r, "an entry is cut short");
  }
}

static int ix_device(ixr_t *r, const ms_snapshot_t *s, tl_dev_t *d, char **arena) {
  uint64_t n, nck, first[MS_TL_METRIC_COUNT];
  if (!ixr_u64(r, &n) || !ixr_u64(r, &nck)) return ix_bad(r, "a device is cut short");
  if (n != d->n) return ix_bad(r, "a device's entries are not the snapshot's");
  if (nck == 0 || nck > n + 1) return ix_bad(r, "a device's checkpoint count is out of range");
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
    if (!ixr_u64(r, &first[m])) return ix_bad(r, "a device is cut short");
  /* an entry takes 2 bytes or more: a count past the rest of the file is refused before sizing */
  if (n > (r->len - r->off) / 2) return ix_bad(r, "a device's entries are cut short");
  /* the arrays, from the block the index was given (ix_arena) */
  d->pair = (uint32_t *)(void *)*arena;
  *arena += (n * sizeof *d->pair + 7) / 8 * 8;
  d->bsize = (uint32_t *)(void *)*arena;
  *arena += (n * sizeof *d->bsize + 7) / 8 * 8;
  size_t stream = r->off;
  int rc = ixr_entries(r, d, (size_t)n, first);
  if (rc != MS_OK) return rc;
  if (MS_VEC_RESERVE(&d->ckpts, (size_t)nck)) return MS_ENOMEM;
  for (uint64_t c = 0; c < nck; c++) {
    tl_ckpt_t *ck = &d->ckpts.ptr[d->ckpts.len++];
    memset(ck, 0, sizeof *ck);
    rc = ix_ckpt(r, s, d, ck);
    if (rc != MS_OK) return rc;
    if (c > 0 && ck->step <= d->ckpts.ptr[c - 1].step)
      return ix_bad(r, "a device's checkpoints are out of order");
  }
  if (d->ckpts.ptr[d->ckpts.len - 1].step != n)
    return ix_bad(r, "a device's last checkpoint is not at the end of its trace");
  size_t after = r->off;
  rc = ixr_check_totals(r, d, stream, first);
  r->off = after;
  return rc;
}

static void ix_arena_free(void *arena) { free(arena); }

/* One block for every device's pair and bsize (no series: issue #33), handed to tl as the
 * storage its release gives back: a malloc'd block, whose fresh pages cost the system less than
 * ms__big_malloc's huge-page mappings (measured: a warm timeline spent a third of its time
 * clearing those). Refused when the file is too short for the entries (2 bytes or more each). */
static int ix_arena(ixr_t *r, ms_timeline_t *tl, char **arena) {
  size_t bytes = 0, entries = 0;
  for (size_t i = 0; i < tl->ndev; i++) {
    size_t n = tl->dev[i].n;
    entries += n;
    bytes += 2 * ((n * sizeof(uint32_t) + 7) / 8 * 8);
  }
  if (entries > r->len / 2) return ix_bad(r, "its entries are cut short");
  *arena = malloc(bytes ? bytes : 1);
  if (!*arena) return MS_ENOMEM;
  tl->release = ix_arena_free;
  tl->release_arg = *arena;
  return MS_OK;
}

/* Checks the header against key and cfg; the body's bounds in *r. */
static int ix_header_check(ixr_t *r, const ms_cache_key_t *key, const ms_timeline_t *tl,
                           bool check_sums, uint64_t *ndev) {
  const unsigned char *h = r->p;
  if (r->len < IX_HEADER_BYTES || memcmp(h, IX_MAGIC, 8) != 0) {
    if (r->len >= 8 && memcmp(h, IX_MAGIC, 8) == 0)
      return ms__errbuf_set(r->eb, MS_ETRUNCATED, "cache index: truncated header");
    return ms__errbuf_set(r->eb, MS_EFORMAT, "not a memsnap cache index");
  }
  if (ix_rd32(h + 8) != MS_CACHE_VERSION)
    return ms__errbuf_set(r->eb, MS_EVERSION, "cache index: version %u, not %u", ix_rd32(h + 8),
                          MS_CACHE_VERSION);
  if (ix_rd64(h + 32) != r->len)
    return ms__errbuf_set(r->eb, ix_rd64(h + 32) > r->len ? MS_ETRUNCATED : MS_EFORMAT,
                          "cache index: %zu bytes, the header says %llu", r->len,
                          (unsigned long long)ix_rd64(h + 32));
  if (check_sums && ix_rd64(h + 88) != cache_checksum(h, 88))
    return ms__errbuf_set(r->eb, MS_EFORMAT, "cache index: header checksum mismatch");
  if (key && (ix_rd32(h + 12) != key->flags || ix_rd64(h + 16) != key->hash ||
              ix_rd64(h + 24) != key->size))
    return ms__errbuf_set(r->eb, MS_ENOTFOUND, "cache index: another key");
  const ms_tl_filter_t *f = &tl->filter;
  if (ix_rd32(h + 48) != tl->k || ix_rd32(h + 52) != ix_filter_bits(f) ||
      ix_rd64(h + 56) != (f->has_stream ? f->stream : 0) ||
      ix_rd64(h + 64) != (f->has_pool ? (uint64_t)f->pool_id[0] : 0) ||
      ix_rd64(h + 72) != (f->has_pool ? (uint64_t)f->pool_id[1] : 0))
    return ms__errbuf_set(r->eb, MS_ENOTFOUND, "cache index: another configuration");
  if (check_sums) {
    uint64_t sum = 0x6d656d736e617073ULL;
    const unsigned char *body = h + IX_HEADER_BYTES;
    size_t blen = r->len - IX_HEADER_BYTES;
    for (size_t off = 0; off < blen; off += CACHE_SUM_CHUNK) {
      size_t k = blen - off < CACHE_SUM_CHUNK ? blen - off : CACHE_SUM_CHUNK;
      sum = ms_hash_step(sum, cache_sum(body + off, k, 0));
    }
    if (ms_hash_step(sum, (uint64_t)blen) != ix_rd64(h + 40))
      return ms__errbuf_set(r->eb, MS_EFORMAT, "cache index: body checksum mismatch");
  }
  *ndev = ix_rd64(h + 80);
  r->off = IX_HEADER_BYTES;
  return MS_OK;
}

int ms__cache_index_decode(const void *buf, size_t len, const ms_cache_key_t *key,
                           bool check_sums, const ms_snapshot_t *snap,
                           const ms_timeline_config_t *cfg, void (*release)(void *),
                           void *release_arg, ms_timeline_t **out, ms_errbuf_t *eb) {
  if (!buf || !snap || !out) return ms__errbuf_set(eb, MS_EINVAL, "cache index: no input");
  ms_timeline_t *tl = NULL;
  int rc = ms__tl_alloc(snap, cfg, &tl, eb);
  if (rc != MS_OK) return rc;
  ixr_t r = {buf, len, 0, eb};
  uint64_t ndev = 0;
  rc = ix_header_check(&r, key, tl, check_sums, &ndev);
  char *arena = NULL;
  if (rc == MS_OK) rc = ix_arena(&r, tl, &arena);
  if (rc == MS_OK && ndev != tl->ndev) rc = ix_bad(&r, "its devices are not the snapshot's");
  for (size_t i = 0; rc == MS_OK && i < tl->ndev; i++) rc = ix_device(&r, snap, &tl->dev[i], &arena);
  if (rc == MS_OK && r.off != len) rc = ix_bad(&r, "bytes after the last device");
  if (rc != MS_OK) {
    if (rc == MS_ENOMEM) ms__errbuf_set(eb, rc, "out of memory");
    ms_timeline_destroy(tl);
    return rc;
  }
  if (release) release(release_arg); /* everything was decoded into the index's own arrays */
  *out = tl;
  return MS_OK;
}

int ms_cache_index_decode(const void *buf, size_t len, const ms_cache_key_t *key,
                          bool check_sums, const ms_snapshot_t *snap,
                          const ms_timeline_config_t *cfg, ms_timeline_t **out, ms_errbuf_t *eb) {
  return ms__cache_index_decode(buf, len, key, check_sums, snap, cfg, NULL, NULL, out, eb);
}
