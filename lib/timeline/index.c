/* SPDX-License-Identifier: MIT
 * memsnap core: the time index (memsnap/timeline.h, issue #12 §1): building it, and the state
 * at a step. The working state and undo/redo are state.c; the totals, peaks and series are
 * totals.c; moments and the state as a snapshot are moments.c (timeline/internal.h).
 *
 * Per device: a forward pre-pass pairs each alloc with its free_completed (and each
 * segment_alloc with its segment_free) by address; the build pass then starts from the end state
 * (the snapshot's segments and live blocks) and undoes the trace newest first, noting the peaks
 * of the totals (no total per step is kept: issue #33), the block size chosen for every block
 * born in the trace (so that later queries undo identically), and a checkpoint (a flat copy of
 * the state) every max(K, 2 x live blocks) entries. A query restores the nearest later
 * checkpoint and undoes down to the step asked for.
 *
 * The working state is an address-sorted array of segments, each with its own address-sorted
 * array of live blocks: every operation is a binary search plus a short memmove within one
 * segment, and the ordered layout answers "which block follows this address" for the size
 * inference and the consistency checks.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "snapshot/deferred.h"
#include "timeline/internal.h"

/* ---- building ------------------------------------------------------------------------------ */

/* Open-addressing map address -> entry index (the pairing pre-pass). */
typedef struct tl_map_s {
  uint64_t *key;
  uint32_t *val; /* index + 1; 0 = empty */
  size_t cap;
} tl_map_t;

static size_t tl_hash(uint64_t k, size_t cap) {
  return (size_t)((k * 0x9E3779B97F4A7C15ull) >> 17) & (cap - 1);
}

static int tl_map_init(tl_map_t *m, size_t n) {
  size_t cap = 64;
  while (cap < n * 2 + 16)
    cap *= 2;
  m->cap = cap;
  m->key = malloc(cap * sizeof *m->key);
  m->val = calloc(cap, sizeof *m->val);
  return m->key && m->val ? MS_OK : MS_ENOMEM;
}

static void tl_map_free(tl_map_t *m) {
  free(m->key);
  free(m->val);
}

static uint32_t *tl_map_slot(tl_map_t *m, uint64_t k) {
  size_t h = tl_hash(k, m->cap);
  while (m->val[h] && m->key[h] != k)
    h = (h + 1) & (m->cap - 1);
  m->key[h] = k;
  return &m->val[h];
}

static void tl_map_del(tl_map_t *m, uint64_t k) {
  size_t h = tl_hash(k, m->cap);
  while (m->val[h] && m->key[h] != k)
    h = (h + 1) & (m->cap - 1);
  if (!m->val[h]) return;
  m->val[h] = 0;
  /* backward-shift deletion */
  size_t j = h;
  for (;;) {
    j = (j + 1) & (m->cap - 1);
    if (!m->val[j]) return;
    size_t home = tl_hash(m->key[j], m->cap);
    bool move = (j > h) ? (home <= h || home > j) : (home <= h && home > j);
    if (move) {
      m->key[h] = m->key[j];
      m->val[h] = m->val[j];
      m->val[j] = 0;
      h = j;
    }
  }
}

static uint32_t tl_map_get(const tl_map_t *m, uint64_t k) {
  size_t h = tl_hash(k, m->cap);
  while (m->val[h]) {
    if (m->key[h] == k) return m->val[h];
    h = (h + 1) & (m->cap - 1);
  }
  return 0;
}

/* Puts k -> v, first doubling the map (twice, from tl_map_init) when it would be more than half
 * full; *count is the number of keys it holds. On failure the map is unchanged. */
static int tl_map_put(tl_map_t *m, size_t *count, uint64_t k, uint32_t v) {
  if ((*count + 1) * 2 > m->cap) {
    tl_map_t big;
    if (tl_map_init(&big, m->cap) != MS_OK) {
      tl_map_free(&big);
      return MS_ENOMEM;
    }
    for (size_t h = 0; h < m->cap; h++)
      if (m->val[h]) *tl_map_slot(&big, m->key[h]) = m->val[h];
    tl_map_free(m);
    *m = big;
  }
  uint32_t *slot = tl_map_slot(m, k);
  if (!*slot) (*count)++;
  *slot = v;
  return MS_OK;
}

/* Pairs allocs with free_completed and segment_alloc with segment_free; the allocs left open
 * are the blocks alive at the end (open_allocs). Both maps hold only what is open, so they are
 * sized by the most blocks (segments) alive at once, not by the trace: a table sized for every
 * entry of a 5 M-entry trace was 192 MB of pages touched at random. */
static int tl_pair(const ms_timeline_t *tl, tl_dev_t *d, tl_map_t *open_allocs) {
  tl_map_t segs = {0};
  int rc = tl_map_init(open_allocs, 512);
  if (rc == MS_OK) rc = tl_map_init(&segs, 16);
  if (rc != MS_OK) {
    tl_map_free(&segs);
    return rc;
  }
  size_t nseg = 0, nopen = 0;
  for (size_t i = 0; rc == MS_OK && i < d->n; i++) {
    const ms_snap_trace_t *e = &d->trace[i];
    d->pair[i] = TL_NONE;
    if (e->action == MS_TRACE_ALLOC) {
      rc = tl_map_put(open_allocs, &nopen, e->addr, (uint32_t)i + 1);
    } else if (e->action == MS_TRACE_FREE_COMPLETED) {
      uint32_t a = tl_map_get(open_allocs, e->addr);
      if (a) {
        d->pair[i] = a - 1;
        d->pair[a - 1] = (uint32_t)i;
        tl_map_del(open_allocs, e->addr);
        nopen--;
      }
    } else if (e->action == MS_TRACE_SEGMENT_ALLOC) {
      rc = tl_map_put(&segs, &nseg, e->addr, (uint32_t)i + 1);
    } else if (e->action == MS_TRACE_SEGMENT_FREE) {
      uint32_t a = tl_map_get(&segs, e->addr);
      if (a) {
        d->pair[a - 1] = (uint32_t)i;
        tl_map_del(&segs, e->addr);
        nseg--;
      }
    }
  }
  (void)tl;
  tl_map_free(&segs);
  return rc;
}

static int tl_seg_cmp(const void *a, const void *b) {
  const tl_wseg_t *x = a, *y = b;
  return x->seg.address < y->seg.address ? -1 : x->seg.address > y->seg.address;
}

/* The end state of device dev: the snapshot's segments and live blocks. */
static int tl_end_state(const ms_timeline_t *tl, size_t dev, const tl_map_t *open_allocs,
                        tl_ws_t *w, ms_errbuf_t *eb) {
  const ms_snapshot_t *s = tl->snap;
  const tl_dev_t *d = &tl->dev[dev];
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->device < 0 || (uint64_t)g->device != dev) continue;
    if (MS_VEC_RESERVE(&w->segs, 1)) return MS_ENOMEM;
    tl_wseg_t *ws = &w->segs.ptr[w->segs.len++];
    memset(ws, 0, sizeof *ws);
    ws->seg.address = g->address;
    ws->seg.size = g->total_size;
    ws->seg.stream = g->stream;
    ws->seg.pool_id[0] = g->pool_id[0];
    ws->seg.pool_id[1] = g->pool_id[1];
    ws->seg.is_expandable = g->is_expandable;
    ws->seg.stack = g->stack;
    ws->seg.snap_segment = (uint32_t)i;
    if (g->address + g->total_size < g->address)
      return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: segment 0x%" PRIx64 " wraps around", dev,
                            g->address);
    if (tl_counts(w, &ws->seg)) w->totals[MS_TL_RESERVED] += g->total_size;
    uint64_t off = g->address;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      size_t bi = (size_t)g->first_block + k;
      const ms_snap_block_t *sb = &s->blocks[bi];
      uint64_t addr = (sb->present & MS_BLOCK_HAS_ADDRESS) ? sb->address : off;
      off += sb->size;
      if (sb->state != MS_BLOCK_ACTIVE_ALLOCATED && sb->state != MS_BLOCK_ACTIVE_PENDING_FREE)
        continue;
      if (addr < g->address || addr - g->address > g->total_size ||
          sb->size > g->total_size - (addr - g->address))
        return ms__errbuf_set(eb, MS_EFORMAT,
                              "device %zu: block 0x%" PRIx64 " lies outside its segment 0x%" PRIx64,
                              dev, addr, g->address);
      ms_tl_block_t b;
      memset(&b, 0, sizeof b);
      b.address = addr;
      b.size = sb->size;
      b.requested_size = tl_snap_requested(s, sb);
      b.stream = g->stream;
      b.alloc_entry = -1;
      b.free_entry = -1;
      uint32_t a = tl_map_get(open_allocs, addr);
      if (a) {
        b.alloc_entry = a - 1;
        const ms_snap_trace_t *ae = &d->trace[a - 1];
        if (ae->present & MS_TRACE_HAS_TIME) b.time_us = ae->time_us;
      }
      b.stack = tl_snap_stack(s, sb);
      b.snap_block = (uint32_t)bi;
      b.state = sb->state;
      b.flags = MS_TL_BLOCK_FROM_SNAPSHOT;
      tl_bpos_t at = tl_blk_lower(&ws->blk, addr);
      const ms_tl_block_t *next = tl_blk_at(&ws->blk, at), *below = tl_blk_before(&ws->blk, at);
      if ((next && next->address < addr + b.size) || (below && below->address + below->size > addr))
        return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: blocks overlap at 0x%" PRIx64, dev,
                              addr);
      if (ms__tl_blk_insert(&ws->blk, at, &b)) return MS_ENOMEM;
      ms__tl_totals_block(w, &ws->seg, &b, +1);
    }
  }
  if (w->segs.len > 1) qsort(w->segs.ptr, w->segs.len, sizeof *w->segs.ptr, tl_seg_cmp);
  for (size_t i = 1; i < w->segs.len; i++) {
    const ms_tl_segment_t *p = &w->segs.ptr[i - 1].seg, *q = &w->segs.ptr[i].seg;
    if (p->address + p->size > q->address)
      return ms__errbuf_set(eb, MS_EFORMAT,
                            "device %zu: segments 0x%" PRIx64 " and 0x%" PRIx64 " overlap", dev,
                            p->address, q->address);
  }
  return MS_OK;
}

/* Entries between checkpoints: at least K, and enough that a checkpoint (a copy of the state)
 * costs no more than TL_CKPT_BYTES_PER_ENTRY bytes per entry it covers, so that the checkpoints
 * of a long trace with many live blocks stay a small part of the index (a 5 M-entry trace with
 * 500 live blocks: 10 MB instead of 300 MB; the build holds them at its peak, with the trace).
 * Reaching a moment redoes at most that many entries, each a binary search and a small move in
 * the sorted state: 2 ms on bench_timeline's trace (`timeline_at_ms`), well under 20 ms. */
#define TL_CKPT_BYTES_PER_ENTRY 4
static size_t tl_ckpt_every(const ms_timeline_t *tl, const tl_ws_t *w) {
  size_t bytes = w->segs.len * (sizeof(ms_tl_segment_t) + sizeof(uint32_t)) +
                 w->nlive * sizeof(ms_tl_block_t);
  size_t every = bytes / TL_CKPT_BYTES_PER_ENTRY;
  return every > tl->k ? every : tl->k;
}

static void tl_ival_note(uint64_t m[2], const uint64_t *totals) {
  if (totals[MS_TL_ALLOCATED] > m[0]) m[0] = totals[MS_TL_ALLOCATED];
  if (totals[MS_TL_ACTIVE] > m[1]) m[1] = totals[MS_TL_ACTIVE];
}

static int tl_ival_cmp(const void *x, const void *y) {
  const tl_ival_t *p = x, *q = y;
  uint64_t u = p->base[0] + p->grow[0], v = q->base[0] + q->grow[0];
  return u > v ? -1 : u < v;
}

/* Whether interval v may hold a step whose final total of metric m (0: allocated, 1: active)
 * beats pk's peak: higher, or as high and earlier. */
static bool tl_ival_may(const tl_ival_t *v, int k, const tl_peaks_t *pk, int m) {
  uint64_t ub = v->base[k] + v->grow[k];
  if (ub < v->base[k]) return true; /* no bound */
  return !pk->any || ub > pk->bytes[m] || (ub == pk->bytes[m] && v->lo < pk->step[m]);
}

/* The peaks over every step into d. The build pass saw every step's totals (pk); when blocks
 * grew afterwards, allocated and active differ from them between the checkpoints, and walks with
 * the final sizes (no series is kept: issue #33) find their peaks: only over the intervals whose
 * bound (iv) may beat the best found, the highest bound first. On the 937 MB pickle, whose
 * blocks grow, that is a few intervals instead of a walk over 5 M entries. */
static int tl_whole_peaks(const ms_timeline_t *tl, size_t dev, bool grew, tl_ivals_t *iv,
                          tl_peaks_t *pk) {
  tl_dev_t *d = &tl->dev[dev];
  if (grew) {
    if (iv->len > 1) qsort(iv->ptr, iv->len, sizeof *iv->ptr, tl_ival_cmp);
    tl_peaks_t fin;
    memset(&fin, 0, sizeof fin);
    for (size_t j = 0; j < iv->len; j++) {
      const tl_ival_t *v = &iv->ptr[j];
      if (!tl_ival_may(v, 0, &fin, MS_TL_ALLOCATED) && !tl_ival_may(v, 1, &fin, MS_TL_ACTIVE))
        continue;
      int rc = ms__tl_walk(tl, dev, v->lo, v->hi, tl_peaks_visit, &fin);
      if (rc != MS_OK) return rc;
    }
    pk->bytes[MS_TL_ALLOCATED] = fin.bytes[MS_TL_ALLOCATED];
    pk->step[MS_TL_ALLOCATED] = fin.step[MS_TL_ALLOCATED];
    pk->bytes[MS_TL_ACTIVE] = fin.bytes[MS_TL_ACTIVE];
    pk->step[MS_TL_ACTIVE] = fin.step[MS_TL_ACTIVE];
  }
  memcpy(d->peak_bytes, pk->bytes, sizeof d->peak_bytes);
  memcpy(d->peak_step, pk->step, sizeof d->peak_step);
  d->has_peaks = true;
  return MS_OK;
}

static int tl_build_dev(ms_timeline_t *tl, size_t dev, ms_errbuf_t *eb) {
  tl_dev_t *d = &tl->dev[dev];
  size_t n = d->n;
  /* Large arrays come from ms__big_* (common/internal.h): with MS_REUSE_MEMORY they take the
   * pages the read freed (its tables), and the temporaries' pages go to the next arrays. */
  d->pair = ms__big_malloc((n ? n : 1) * sizeof *d->pair);
  d->bsize = ms__big_calloc(n ? n : 1, sizeof *d->bsize);
  if (!d->pair || !d->bsize) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory indexing the trace");
  tl_map_t open_allocs;
  int rc = tl_pair(tl, d, &open_allocs);
  tl_ws_t w;
  memset(&w, 0, sizeof w);
  w.filter = tl_filter_of(tl);
  if (rc == MS_OK) rc = tl_end_state(tl, dev, &open_allocs, &w, eb);
  tl_map_free(&open_allocs);
  tl_grow_t grow;
  memset(&grow, 0, sizeof grow);
  tl_ckpt_t ck;
  tl_peaks_t pk;
  memset(&pk, 0, sizeof pk);
  tl_ivals_t iv = {0};
  tl_ival_t cur = {0};
  if (rc == MS_OK) {
    tl_peaks_note(&pk, n, w.totals);
    cur.lo = cur.hi = n;
    tl_ival_note(cur.base, w.totals);
    rc = ms__tl_ckpt_take(&w, n, &ck, d);
    if (rc == MS_OK && MS_VEC_PUSH(&d->ckpts, ck)) {
      ms__tl_ckpt_free(&ck);
      rc = MS_ENOMEM;
    }
  }
  /* One pass from the end: every block freed in the trace at its smallest size (its rounded
   * request, which the real block cannot be smaller than, so a consistent trace never overlaps),
   * noting the smallest room it had after it over its life and giving it its final size when its
   * alloc is met (grow.c); the peaks of the totals (no series: ms_timeline_series makes one when
   * asked); checkpoints. This pass reports the inconsistencies. */
  tl_ctx_t c = {tl, d, dev, true, &grow, eb};
  size_t last = n;
  for (size_t i = n; rc == MS_OK && i-- > 0;) {
    rc = ms__tl_undo(&c, &w, i);
    if (rc != MS_OK) break;
    tl_peaks_note(&pk, i, w.totals);
    tl_ival_note(cur.base, w.totals);
    cur.lo = i;
    size_t every = tl_ckpt_every(tl, &w);
    if (last - i >= every && i > 0) {
      rc = ms__tl_ckpt_take(&w, i, &ck, d);
      if (rc == MS_OK && MS_VEC_PUSH(&d->ckpts, ck)) {
        ms__tl_ckpt_free(&ck);
        rc = MS_ENOMEM;
      }
      if (rc == MS_OK && MS_VEC_PUSH(&iv, cur)) rc = MS_ENOMEM;
      memset(&cur, 0, sizeof cur); /* the next interval starts at this checkpoint */
      cur.lo = cur.hi = i;
      tl_ival_note(cur.base, w.totals);
      last = i;
    }
  }
  if (rc == MS_OK && MS_VEC_PUSH(&iv, cur)) rc = MS_ENOMEM;
  ms__tl_ws_release(&w);
  if (rc == MS_OK) rc = ms__tl_grow_close_all(&grow, d);
  bool grew = rc == MS_OK && grow.grew;
  if (grew) rc = ms__tl_grow_apply(&grow, d, &iv);
  ms__tl_grow_free(&grow);
  if (rc == MS_OK) {
    /* checkpoints were taken newest first: put them in increasing step order */
    for (size_t a = 0, b = d->ckpts.len ? d->ckpts.len - 1 : 0; a < b; a++, b--) {
      tl_ckpt_t t = d->ckpts.ptr[a];
      d->ckpts.ptr[a] = d->ckpts.ptr[b];
      d->ckpts.ptr[b] = t;
    }
    rc = tl_whole_peaks(tl, dev, grew, &iv, &pk);
  }
  free(iv.ptr);
  if (rc == MS_ENOMEM) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory indexing the trace");
  return rc;
}

void ms_timeline_config_init(ms_timeline_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->checkpoint_every = 1024;
}

void ms_timeline_destroy(ms_timeline_t *tl) {
  if (!tl) return;
  for (size_t i = 0; i < tl->ndev; i++) {
    tl_dev_t *d = &tl->dev[i];
    if (!tl->release) {
      ms__big_free(d->pair);
      ms__big_free(d->bsize);
    }
    ms__tl_bsize_free(d);
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) /* made on demand (totals.c), by any index */
      ms__big_free(d->series[m]);
    for (size_t k = 0; k < d->ckpts.len; k++)
      ms__tl_ckpt_free(&d->ckpts.ptr[k]);
    free(d->ckpts.ptr);
    for (size_t k = 0; k < d->ck_chunks.len; k++)
      ms__big_free(d->ck_chunks.ptr[k]);
    free(d->ck_chunks.ptr);
  }
  free(tl->dev);
  if (tl->release) tl->release(tl->release_arg);
  ms_tl_ranges_release(&tl->ranges);
  pthread_mutex_destroy(&tl->lock);
  free(tl);
}

int ms__tl_alloc(const ms_snapshot_t *snap, const ms_timeline_config_t *cfg, ms_timeline_t **out,
                 ms_errbuf_t *eb) {
  if (!snap || !out) return ms__errbuf_set(eb, MS_EINVAL, "no snapshot");
  size_t ndev = snap->ndevices;
  for (size_t i = 0; i < snap->nsegments; i++) {
    int64_t dv = snap->segments[i].device;
    if (dv < 0 || dv >= TL_MAX_DEVICES)
      return ms__errbuf_set(eb, MS_ELIMIT, "segment 0x%" PRIx64 " names device %" PRId64,
                            snap->segments[i].address, dv);
    if ((size_t)dv + 1 > ndev) ndev = (size_t)dv + 1;
  }
  if (ndev > TL_MAX_DEVICES)
    return ms__errbuf_set(eb, MS_ELIMIT, "%zu devices: more than %d", ndev, TL_MAX_DEVICES);
  ms_timeline_t *tl = calloc(1, sizeof *tl);
  if (!tl) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  if (pthread_mutex_init(&tl->lock, NULL) != 0) {
    free(tl);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  tl->snap = snap;
  tl->k = cfg && cfg->checkpoint_every ? cfg->checkpoint_every : 1024;
  if (cfg) tl->filter = cfg->filter;
  tl->ndev = ndev;
  tl->dev = calloc(ndev ? ndev : 1, sizeof *tl->dev);
  if (!tl->dev) {
    pthread_mutex_destroy(&tl->lock);
    free(tl);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  for (size_t i = 0; i < ndev; i++) {
    tl_dev_t *d = &tl->dev[i];
    if (i < snap->ndevices) {
      const ms_snap_device_t *sd = &snap->devices[i];
      if ((size_t)sd->first_trace + sd->ntrace > snap->ntrace) {
        ms_timeline_destroy(tl);
        return ms__errbuf_set(eb, MS_EFORMAT, "device %zu: trace out of range", i);
      }
      d->trace = sd->ntrace ? snap->trace + sd->first_trace : NULL; /* not NULL + 0 */
      d->n = sd->ntrace;
    }
  }
  *out = tl;
  return MS_OK;
}

/* ---- the devices on threads ------------------------------------------------------------------ */

/* A device's index is built from its own trace into its own tl_dev_t: the devices share nothing
 * but the snapshot (read only) and the ms__big_* pool (locked), so a snapshot of several large
 * devices (one process driving many GPUs) builds them on threads, the largest first. A build's
 * temporaries (tl_build_dev's tl_grow_t: its blocks that grew, 24 bytes each, at most one every
 * other entry) are freed when it ends;
 * built one after another, the largest device's are the most held at once. On threads, a device
 * starts only while the temporaries of the builds under way, with its own, stay within a quarter
 * of the memory free when the build began (or it is the only build under way), so that a
 * snapshot near the machine's limit is not pushed past it by building its devices at once. */
typedef struct tl_build_job_s {
  ms_timeline_t *tl;
  const size_t *order; /* the devices, largest first */
  size_t norder;
  size_t next;     /* the next place in order to take */
  size_t inflight; /* temporaries' bytes of the builds under way */
  size_t budget;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int *rc;         /* per device */
  ms_errbuf_t *eb; /* per device */
} tl_build_job_t;

static size_t tl_build_temp(const tl_dev_t *d) {
  return d->n > SIZE_MAX / 16 ? SIZE_MAX / 2 : d->n * (sizeof(tl_growth_t) / 2) + 4096;
}

static void *tl_build_worker(void *arg) {
  tl_build_job_t *j = arg;
  pthread_mutex_lock(&j->mu);
  while (j->next < j->norder) {
    size_t dev = j->order[j->next], need = tl_build_temp(&j->tl->dev[dev]);
    if (j->inflight > 0 && need > j->budget - (j->inflight < j->budget ? j->inflight : j->budget)) {
      pthread_cond_wait(&j->cv, &j->mu); /* a build under way ends first */
      continue;
    }
    j->next++;
    j->inflight += need;
    pthread_mutex_unlock(&j->mu);
    j->rc[dev] = tl_build_dev(j->tl, dev, &j->eb[dev]);
    pthread_mutex_lock(&j->mu);
    j->inflight -= need;
    pthread_cond_broadcast(&j->cv);
  }
  pthread_mutex_unlock(&j->mu);
  return NULL;
}

typedef struct tl_dev_size_s {
  size_t n, dev;
} tl_dev_size_t;

static int tl_size_desc(const void *x, const void *y) {
  const tl_dev_size_t *a = x, *b = y;
  if (a->n != b->n) return a->n > b->n ? -1 : 1;
  return a->dev < b->dev ? -1 : a->dev > b->dev;
}

/* How many threads build tl: one per device of TL_PAR_MIN entries or more, at most threads (0:
 * the online CPUs); 1 when fewer than two devices are that large. */
static size_t tl_build_threads(const ms_timeline_t *tl, size_t threads) {
  if (threads == 0) {
    long c = sysconf(_SC_NPROCESSORS_ONLN);
    threads = c > 0 ? (size_t)c : 1;
  }
  size_t big = 0;
  for (size_t i = 0; i < tl->ndev; i++)
    if (tl->dev[i].n >= TL_PAR_MIN) big++;
  if (big < 2) return 1;
  return big < threads ? big : threads;
}

int ms__tl_build(ms_timeline_t *tl, size_t threads, size_t budget, ms_errbuf_t *eb) {
  size_t nt = tl_build_threads(tl, threads), ndev = tl->ndev;
  tl_build_job_t j = {.tl = tl, .norder = ndev};
  size_t *order = nt > 1 ? malloc(ndev * sizeof *order) : NULL;
  pthread_t *th = nt > 1 ? malloc((nt - 1) * sizeof *th) : NULL;
  j.rc = nt > 1 ? malloc(ndev * sizeof *j.rc) : NULL;
  j.eb = nt > 1 ? calloc(ndev, sizeof *j.eb) : NULL;
  bool sync = nt > 1 && pthread_mutex_init(&j.mu, NULL) == 0;
  if (sync && pthread_cond_init(&j.cv, NULL) != 0) {
    pthread_mutex_destroy(&j.mu);
    sync = false;
  }
  if (!order || !th || !j.rc || !j.eb || !sync) { /* one thread, or too little memory for more */
    if (sync) {
      pthread_cond_destroy(&j.cv);
      pthread_mutex_destroy(&j.mu);
    }
    free(order);
    free(th);
    free(j.rc);
    free(j.eb);
    for (size_t i = 0; i < ndev; i++)
      MS_FORWARD_IF_ERROR(tl_build_dev(tl, i, eb));
    return MS_OK;
  }
  if (budget == 0) { /* a quarter of the memory free now (the page cache not counted) */
    long pages = sysconf(_SC_AVPHYS_PAGES), pg = sysconf(_SC_PAGESIZE);
    budget = pages > 0 && pg > 0 && (size_t)pages < SIZE_MAX / (size_t)pg
                 ? (size_t)pages * (size_t)pg / 4
                 : SIZE_MAX;
  }
  j.budget = budget;
  tl_dev_size_t *by = malloc(ndev * sizeof *by);
  for (size_t i = 0; i < ndev; i++) {
    order[i] = i;
    if (by) by[i] = (tl_dev_size_t){tl->dev[i].n, i};
  }
  if (by) { /* else in device order */
    qsort(by, ndev, sizeof *by, tl_size_desc);
    for (size_t i = 0; i < ndev; i++)
      order[i] = by[i].dev;
    free(by);
  }
  j.order = order;
  size_t started = 0;
  while (started < nt - 1 && pthread_create(&th[started], NULL, tl_build_worker, &j) == 0)
    started++;
  tl_build_worker(&j); /* this thread too; with no thread started it builds every device */
  for (size_t k = 0; k < started; k++)
    pthread_join(th[k], NULL);
  pthread_cond_destroy(&j.cv);
  pthread_mutex_destroy(&j.mu);
  /* the first device that failed, as one thread building them in order would report it */
  int rc = MS_OK;
  for (size_t i = 0; i < ndev && rc == MS_OK; i++)
    if ((rc = j.rc[i]) != MS_OK && eb) *eb = j.eb[i];
  free(order);
  free(th);
  free(j.rc);
  free(j.eb);
  return rc;
}

int ms_timeline_create(const ms_snapshot_t *snap, const ms_timeline_config_t *cfg,
                       ms_timeline_t **out, ms_errbuf_t *eb) {
  ms_timeline_t *tl = NULL;
  int rc = ms__tl_alloc(snap, cfg, &tl, eb);
  if (rc != MS_OK) return rc;
  rc = ms__tl_build(tl, 0, 0, eb);
  if (rc != MS_OK) {
    ms_timeline_destroy(tl);
    return rc;
  }
  *out = tl;
  return MS_OK;
}

/* ---- queries ------------------------------------------------------------------------------- */

const ms_snapshot_t *ms_timeline_snapshot(const ms_timeline_t *tl) {
  return tl->snap;
}
size_t ms_timeline_ndevices(const ms_timeline_t *tl) {
  return tl->ndev;
}
size_t ms_timeline_nentries(const ms_timeline_t *tl, size_t dev) {
  return dev < tl->ndev ? tl->dev[dev].n : 0;
}
const ms_snap_trace_t *ms_timeline_entry(const ms_timeline_t *tl, size_t dev, size_t i) {
  return &tl->dev[dev].trace[i];
}

const char *ms_tl_metric_name(ms_tl_metric m) {
  switch (m) {
  case MS_TL_ALLOCATED:
    return "allocated";
  case MS_TL_ACTIVE:
    return "active";
  case MS_TL_REQUESTED:
    return "requested";
  case MS_TL_RESERVED:
    return "reserved";
  default:
    return "?";
  }
}

int ms__tl_reach(const ms_timeline_t *tl, size_t dev, size_t step, tl_ws_t *w) {
  tl_dev_t *d = &tl->dev[dev];
  size_t lo = tl_ckpt_at_or_after(d, step);
  if (lo >= d->ckpts.len) return MS_EINVAL;
  const tl_ckpt_t *c = &d->ckpts.ptr[lo];
  int rc = ms__tl_ckpt_restore(c, w);
  tl_ctx_t cx = {tl, d, dev, false, NULL, NULL};
  for (size_t i = c->step; rc == MS_OK && i-- > step;)
    rc = ms__tl_undo(&cx, w, i);
  return rc;
}

void ms_timeline_state_init(ms_tl_state_t *st) {
  memset(st, 0, sizeof *st);
}

void ms_timeline_state_release(ms_tl_state_t *st) {
  if (!st) return;
  free(st->segments);
  free(st->blocks);
  memset(st, 0, sizeof *st);
}

static int tl_state_from_ws(const tl_ws_t *w, size_t dev, size_t step, ms_tl_state_t *st) {
  if (w->segs.len > st->cap_segments_) {
    void *p = realloc(st->segments, w->segs.len * sizeof *st->segments);
    if (!p) return MS_ENOMEM;
    st->segments = p;
    st->cap_segments_ = w->segs.len;
  }
  if (w->nlive > st->cap_blocks_) {
    void *p = realloc(st->blocks, w->nlive * sizeof *st->blocks);
    if (!p) return MS_ENOMEM;
    st->blocks = p;
    st->cap_blocks_ = w->nlive;
  }
  size_t k = 0;
  for (size_t i = 0; i < w->segs.len; i++) {
    st->segments[i] = w->segs.ptr[i].seg;
    if (w->segs.ptr[i].blk.len) k += ms__tl_blk_copy(&w->segs.ptr[i].blk, st->blocks + k);
  }
  st->nsegments = w->segs.len;
  st->nblocks = k;
  st->device = dev;
  st->step = step;
  memcpy(st->totals, w->totals, sizeof st->totals);
  return MS_OK;
}

/* The working state equivalent of a filled ms_tl_state_t. */
static int tl_ws_from_state(const ms_timeline_t *tl, const ms_tl_state_t *st, tl_ws_t *w) {
  memset(w, 0, sizeof *w);
  w->filter = tl_filter_of(tl);
  if (MS_VEC_RESERVE(&w->segs, st->nsegments ? st->nsegments : 1)) return MS_ENOMEM;
  size_t k = 0;
  for (size_t i = 0; i < st->nsegments; i++) {
    tl_wseg_t *s = &w->segs.ptr[w->segs.len++];
    memset(s, 0, sizeof *s);
    s->seg = st->segments[i];
    uint64_t end = s->seg.address + s->seg.size;
    size_t k0 = k;
    while (k < st->nblocks && st->blocks[k].address < end)
      k++;
    if (k > k0 && ms__tl_blk_load(&s->blk, st->blocks + k0, k - k0)) return MS_ENOMEM;
  }
  memcpy(w->totals, st->totals, sizeof w->totals);
  w->nlive = k;
  return MS_OK;
}

/* A snapshot read with MS_LOAD_DEFER_STACKS: the index's blocks were made before their alloc's
 * stack was read; st's blocks read theirs now (snapshot/deferred.h) and take them. A block alive
 * at the end has the snapshot's stack already, and its alloc entry reads its own too (what reads
 * a block's stack through its alloc entry, the classifier's sources, finds it). A state advanced
 * from one already done has at most its new block to look at: nothing is allocated or read for
 * the others. */
static bool tl_entry_unread(const tl_dev_t *d, const ms_tl_block_t *b) {
  return b->alloc_entry >= 0 && (size_t)b->alloc_entry < d->n &&
         (b->stack == MS_SNAP_NO_STACK ||
          (d->trace[b->alloc_entry].stack == MS_SNAP_NO_STACK &&
           (d->trace[b->alloc_entry].present & MS_TRACE_HAS_FRAMES)));
}

static int tl_state_restack(const ms_timeline_t *tl, ms_tl_state_t *st) {
  if (!ms__snapshot_defers(tl->snap)) return MS_OK;
  const tl_dev_t *d = &tl->dev[st->device];
  size_t n = 0;
  for (size_t i = 0; i < st->nblocks; i++)
    n += tl_entry_unread(d, &st->blocks[i]);
  if (n == 0) return MS_OK;
  if (ms__snapshot_has_deferred(tl->snap)) {
    size_t base = (size_t)(d->trace - tl->snap->trace), k = 0;
    size_t *want = malloc(n * sizeof *want);
    if (!want) return MS_ENOMEM;
    for (size_t i = 0; i < st->nblocks; i++)
      if (tl_entry_unread(d, &st->blocks[i])) want[k++] = base + (size_t)st->blocks[i].alloc_entry;
    ms_errbuf_t eb;
    int rc = ms__snapshot_fill_stacks(tl->snap, want, n, &eb);
    free(want);
    if (rc != MS_OK) return rc;
  }
  for (size_t i = 0; i < st->nblocks; i++) {
    ms_tl_block_t *b = &st->blocks[i];
    if (b->alloc_entry >= 0 && b->stack == MS_SNAP_NO_STACK && (size_t)b->alloc_entry < d->n)
      b->stack = d->trace[b->alloc_entry].stack;
  }
  return MS_OK;
}

int ms_timeline_state_at(const ms_timeline_t *tl, size_t dev, size_t step, ms_tl_state_t *st) {
  if (dev >= tl->ndev || step > tl->dev[dev].n) return MS_EINVAL;
  tl_ws_t w;
  memset(&w, 0, sizeof w);
  w.filter = tl_filter_of(tl);
  int rc = ms__tl_reach(tl, dev, step, &w);
  if (rc == MS_OK) rc = tl_state_from_ws(&w, dev, step, st);
  if (rc == MS_OK) rc = tl_state_restack(tl, st);
  ms__tl_ws_release(&w);
  return rc;
}

int ms_timeline_states_at(const ms_timeline_t *tl, size_t dev, const size_t *steps, size_t n,
                          ms_tl_state_visit_fn *fn, void *arg) {
  if (dev >= tl->ndev || !fn || (n > 0 && !steps)) return MS_EINVAL;
  for (size_t k = 0; k < n; k++)
    if (steps[k] > tl->dev[dev].n || (k > 0 && steps[k] < steps[k - 1])) return MS_EINVAL;
  if (n == 0) return MS_OK;
  tl_ws_t w;
  memset(&w, 0, sizeof w);
  w.filter = tl_filter_of(tl);
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  size_t at = steps[n - 1];
  int rc = ms__tl_reach(tl, dev, at, &w);
  tl_ctx_t cx = {tl, &tl->dev[dev], dev, false, NULL, NULL};
  for (size_t k = n; rc == MS_OK && k-- > 0;) {
    while (rc == MS_OK && at > steps[k])
      rc = ms__tl_undo(&cx, &w, --at);
    if (rc == MS_OK) rc = tl_state_from_ws(&w, dev, at, &st);
    if (rc == MS_OK) rc = tl_state_restack(tl, &st);
    if (rc == MS_OK) rc = fn(arg, k, &st);
  }
  ms_timeline_state_release(&st);
  ms__tl_ws_release(&w);
  return rc;
}

/* Redoes entry i (forwards): the inverse of tl_undo, with the sizes chosen when building. */
int ms_timeline_state_advance(const ms_timeline_t *tl, ms_tl_state_t *st) {
  if (st->device >= tl->ndev || st->step >= tl->dev[st->device].n) return MS_EINVAL;
  tl_ws_t w;
  int rc = tl_ws_from_state(tl, st, &w);
  tl_ctx_t c = {tl, &tl->dev[st->device], st->device, false, NULL, NULL};
  if (rc == MS_OK) rc = ms__tl_redo(&c, &w, st->step);
  if (rc == MS_OK) rc = tl_state_from_ws(&w, st->device, st->step + 1, st);
  if (rc == MS_OK) rc = tl_state_restack(tl, st);
  ms__tl_ws_release(&w);
  return rc;
}
