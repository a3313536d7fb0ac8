/* SPDX-License-Identifier: MIT
 * memsnap core: `memsnap replay`, driving the allocator from a recorded trace
 * (include/memsnap/replay.h; the method is reference/replay-notes.md §2-§4; docs/replay.md).
 *
 * Check mode. The allocator runs on a "recorded device", a backend private to this file: it
 * returns, for a new segment, the address the trace recorded when the allocator asks for the
 * recorded size at that point (a synthetic far address otherwise), and for a new expandable range
 * the base of its first recorded map. The simulated device ("sim") is not used here because
 * recorded addresses lie anywhere in the 64-bit space and real reservations have the recorded
 * GPU's size, neither of which fits the sim's fixed address window. Release bursts that the trace
 * shows on the OOM path (a run of segment_free/segment_unmap followed by a new segment, a map or
 * an `oom` entry) are reproduced by making the recorded device report "out of memory" until the
 * allocator has freed as many segments as the burst did, so the allocator runs its own OOM chain
 * and chooses what to release; empty_cache bursts are external triggers. With a capacity given,
 * the device is simply that large and every burst on the OOM path must be predicted.
 *
 * Each operation's trace entries, as emitted by the allocator through the history hooks, are
 * compared with the recorded ones; the first difference stops the replay. The final layout is
 * compared with the snapshot's segments.
 *
 * What-if mode replays the same allocation stream on the sim device under another configuration
 * and capacity, with fresh addresses; OOM-path bursts are left to the allocator.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "common/internal.h"
#include "memsnap/allocator.h"
#include "memsnap/config.h"
#include "memsnap/history.h"
#include "memsnap/replay.h"
#include "memsnap/stats.h"
#include "common/hash.h"
#include "common/vec.h"

#define RP_PAGE ((uint64_t)2 << 20)
/* Synthetic addresses (segments the trace did not record) live far above any real one. */
#define RP_SYNTH_BASE 0xfff0000000000000ULL
/* Total memory the recorded device reports when no capacity is given. */
#define RP_UNLIMITED ((size_t)1 << 50)
/* Capacity of the sim device for an unlimited what-if (its address window is 16 TiB). */
#define RP_WHATIF_UNLIMITED ((size_t)1 << 40)
#define RP_MIN_CAP_BOUND ((size_t)1 << 40)

const char *ms_replay_verdict_name(ms_replay_verdict v) {
  switch (v) {
  case MS_REPLAY_PASS: return "PASS";
  case MS_REPLAY_FAIL: return "FAIL";
  case MS_REPLAY_INCONCLUSIVE: return "INCONCLUSIVE";
  case MS_REPLAY_UNREPLAYABLE: return "UNREPLAYABLE";
  }
  return "?";
}

void ms_replay_options_init(ms_replay_options_t *o) {
  memset(o, 0, sizeof *o);
  o->device = -1;
}

/* ---- address map: recorded address -> value (open addressing, backward-shift delete) ---------- */

typedef struct rp_map_s {
  uint64_t *k, *v;
  size_t cap, len;
} rp_map_t;

static inline size_t rp_slot(const rp_map_t *m, uint64_t k) {
  return (size_t)ms_hash_u64(k) & (m->cap - 1);
}

static int rp_map_grow(rp_map_t *m) {
  size_t ncap = m->cap ? m->cap * 2 : 256;
  uint64_t *nk = calloc(ncap, sizeof *nk), *nv = malloc(ncap * sizeof *nv);
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return MS_ENOMEM;
  }
  rp_map_t n = {nk, nv, ncap, 0};
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->k[i]) continue;
    size_t j = rp_slot(&n, m->k[i]);
    while (n.k[j]) j = (j + 1) & (ncap - 1);
    n.k[j] = m->k[i];
    n.v[j] = m->v[i];
    n.len++;
  }
  free(m->k);
  free(m->v);
  *m = n;
  return MS_OK;
}

/* Inserts or overwrites; key != 0. */
static int rp_map_put(rp_map_t *m, uint64_t k, uint64_t v) {
  if ((m->len + 1) * 2 > m->cap) MS_FORWARD_IF_ERROR(rp_map_grow(m));
  size_t j = rp_slot(m, k);
  while (m->k[j] && m->k[j] != k) j = (j + 1) & (m->cap - 1);
  if (!m->k[j]) m->len++;
  m->k[j] = k;
  m->v[j] = v;
  return MS_OK;
}

static bool rp_map_find(const rp_map_t *m, uint64_t k, size_t *slot) {
  if (!m->cap || !k) return false;
  for (size_t j = rp_slot(m, k); m->k[j]; j = (j + 1) & (m->cap - 1)) {
    if (m->k[j] == k) {
      *slot = j;
      return true;
    }
  }
  return false;
}

static bool rp_map_has(const rp_map_t *m, uint64_t k) {
  size_t j;
  return rp_map_find(m, k, &j);
}

/* Removes k; *v = its value. @return whether it was there. */
static bool rp_map_take(rp_map_t *m, uint64_t k, uint64_t *v) {
  size_t i;
  if (!rp_map_find(m, k, &i)) return false;
  *v = m->v[i];
  size_t mask = m->cap - 1;
  for (;;) {
    m->k[i] = 0;
    size_t k2 = i;
    for (;;) {
      k2 = (k2 + 1) & mask;
      if (!m->k[k2]) {
        m->len--;
        return true;
      }
      size_t home = rp_slot(m, m->k[k2]);
      bool stays = i <= k2 ? (home > i && home <= k2) : (home > i || home <= k2);
      if (!stays) {
        m->k[i] = m->k[k2];
        m->v[i] = m->v[k2];
        i = k2;
        break;
      }
    }
  }
}

static void rp_map_free(rp_map_t *m) {
  free(m->k);
  free(m->v);
  memset(m, 0, sizeof *m);
}

/* ---- the recorded device (check mode's backend) ------------------------------------------------ */

typedef struct rdev_range_s {
  uint64_t addr, size;
  bool va;
} rdev_range_t;

typedef struct rdev_expect_s {
  uint64_t addr, size;
} rdev_expect_t;

enum { RDEV_FAIL_NONE = 0, RDEV_FAIL_UNTIL_FREES, RDEV_FAIL_ALL };

typedef struct rdev_s {
  size_t capacity; /* 0 = unlimited */
  size_t total;    /* the total reported by mem_info (sizes expandable reservations) */
  size_t used;
  MS_VEC(rdev_range_t) ranges;
  /* expectations of the operation being replayed */
  MS_VEC(rdev_expect_t) expect; /* recorded segment_alloc entries, in order */
  size_t expect_pos;
  MS_VEC(uint64_t) va_bases;    /* recorded bases of new expandable ranges, in order */
  size_t va_pos;
  int fail;
  size_t fail_frees, frees_done;
  uint64_t synth;
  uint64_t next_handle;
} rdev_t;

static int rdev_full(rdev_t *d, size_t size) {
  if (d->fail == RDEV_FAIL_ALL) return MS_EOOM;
  if (d->fail == RDEV_FAIL_UNTIL_FREES && d->frees_done < d->fail_frees) return MS_EOOM;
  if (d->capacity && (size > d->capacity || d->used > d->capacity - size)) return MS_EOOM;
  return MS_OK;
}

static uint64_t rdev_synth(rdev_t *d, size_t size) {
  uint64_t a = d->synth;
  d->synth += (size + RP_PAGE - 1) & ~(RP_PAGE - 1);
  return a;
}

static int rdev_add(rdev_t *d, uint64_t addr, uint64_t size, bool va) {
  return MS_VEC_PUSH(&d->ranges, ((rdev_range_t){addr, size, va})) == 0 ? MS_OK : MS_ENOMEM;
}

static size_t rdev_find(const rdev_t *d, uint64_t addr, bool va) {
  for (size_t i = d->ranges.len; i-- > 0;)
    if (d->ranges.ptr[i].addr == addr && d->ranges.ptr[i].va == va) return i;
  return SIZE_MAX;
}

static void rdev_remove(rdev_t *d, size_t i) {
  d->ranges.ptr[i] = d->ranges.ptr[d->ranges.len - 1];
  d->ranges.len--;
}

/* Whether [addr, addr+size) overlaps a live device allocation (a hostile or inconsistent trace;
 * reservations are not checked, their recorded size being unknown). */
static bool rdev_overlaps(const rdev_t *d, uint64_t addr, uint64_t size) {
  if (addr + size < addr) return true;
  for (size_t i = 0; i < d->ranges.len; i++) {
    const rdev_range_t *r = &d->ranges.ptr[i];
    if (!r->va && addr < r->addr + r->size && r->addr < addr + size) return true;
  }
  return false;
}

static int rdev_device_count(void *ctx, int *count) {
  (void)ctx;
  *count = 1;
  return MS_OK;
}

static int rdev_malloc(void *ctx, int device, size_t size, ms_stream_t stream, ms_devptr_t *out) {
  rdev_t *d = ctx;
  (void)device, (void)stream;
  MS_FORWARD_IF_ERROR(rdev_full(d, size));
  uint64_t addr;
  if (d->expect_pos < d->expect.len && d->expect.ptr[d->expect_pos].size == size &&
      !rdev_overlaps(d, d->expect.ptr[d->expect_pos].addr, size))
    addr = d->expect.ptr[d->expect_pos++].addr;
  else
    addr = rdev_synth(d, size); /* then the comparison reports the difference */
  MS_FORWARD_IF_ERROR(rdev_add(d, addr, size, false));
  d->used += size;
  *out = (ms_devptr_t)addr;
  return MS_OK;
}

static int rdev_free(void *ctx, int device, ms_devptr_t ptr) {
  rdev_t *d = ctx;
  (void)device;
  size_t i = rdev_find(d, ptr, false);
  if (i == SIZE_MAX) return MS_EINVAL;
  d->used -= d->ranges.ptr[i].size;
  rdev_remove(d, i);
  d->frees_done++;
  return MS_OK;
}

static int rdev_mem_info(void *ctx, int device, size_t *free_bytes, size_t *total_bytes) {
  rdev_t *d = ctx;
  (void)device;
  size_t total = d->capacity ? d->capacity : d->total;
  *total_bytes = total;
  *free_bytes = d->used < total ? total - d->used : 0;
  return MS_OK;
}

static int rdev_handle(void *ctx, int device, uint64_t *out) {
  rdev_t *d = ctx;
  (void)device;
  *out = ++d->next_handle;
  return MS_OK;
}

static int rdev_ok2(void *ctx, int device, uint64_t h) {
  (void)ctx, (void)device, (void)h;
  return MS_OK;
}

static int rdev_event_record(void *ctx, int device, ms_event_t e, ms_stream_t s) {
  (void)ctx, (void)device, (void)e, (void)s;
  return MS_OK;
}

static int rdev_event_query(void *ctx, int device, ms_event_t e, bool *done) {
  (void)ctx, (void)device, (void)e;
  *done = true;
  return MS_OK;
}

static int rdev_sync(void *ctx, int device) {
  (void)ctx, (void)device;
  return MS_OK;
}

static int rdev_va_reserve(void *ctx, int device, size_t size, ms_devptr_t *out) {
  rdev_t *d = ctx;
  (void)device;
  uint64_t addr = d->va_pos < d->va_bases.len ? d->va_bases.ptr[d->va_pos++] : rdev_synth(d, size);
  MS_FORWARD_IF_ERROR(rdev_add(d, addr, size, true));
  *out = (ms_devptr_t)addr;
  return MS_OK;
}

static int rdev_va_release(void *ctx, int device, ms_devptr_t addr, size_t size) {
  rdev_t *d = ctx;
  (void)device, (void)size;
  size_t i = rdev_find(d, addr, true);
  if (i == SIZE_MAX) return MS_EINVAL;
  rdev_remove(d, i);
  return MS_OK;
}

static int rdev_mem_map(void *ctx, int device, ms_devptr_t addr, size_t size) {
  rdev_t *d = ctx;
  (void)device, (void)addr;
  MS_FORWARD_IF_ERROR(rdev_full(d, size));
  d->used += size;
  return MS_OK;
}

static int rdev_mem_unmap(void *ctx, int device, ms_devptr_t addr, size_t size) {
  rdev_t *d = ctx;
  (void)device, (void)addr;
  d->used -= size < d->used ? size : d->used;
  d->frees_done++;
  return MS_OK;
}

static void rdev_destroy(void *ctx) {
  rdev_t *d = ctx;
  MS_VEC_FREE(&d->ranges);
  MS_VEC_FREE(&d->expect);
  MS_VEC_FREE(&d->va_bases);
  free(d);
}

static int rdev_create(size_t capacity, size_t total, ms_backend_t **out, rdev_t **dev) {
  rdev_t *d = calloc(1, sizeof *d);
  if (!d) return MS_ENOMEM;
  d->capacity = capacity;
  d->total = total ? total : RP_UNLIMITED;
  d->synth = RP_SYNTH_BASE;
  ms_backend_ops_t ops = {
      .name = "recorded",
      .ctx = d,
      .device_count = rdev_device_count,
      .malloc = rdev_malloc,
      .free = rdev_free,
      .mem_info = rdev_mem_info,
      .stream_create = rdev_handle,
      .stream_destroy = rdev_ok2,
      .event_create = rdev_handle,
      .event_record = rdev_event_record,
      .event_query = rdev_event_query,
      .event_synchronize = rdev_ok2,
      .event_destroy = rdev_ok2,
      .device_synchronize = rdev_sync,
      .va_reserve = rdev_va_reserve,
      .va_release = rdev_va_release,
      .mem_map = rdev_mem_map,
      .mem_unmap = rdev_mem_unmap,
      .stream_capture_info = NULL,
      .destroy = rdev_destroy,
  };
  int r = ms_backend_create(&ops, out);
  if (r != MS_OK) {
    free(d);
    return r;
  }
  *dev = d;
  return MS_OK;
}

/* ---- settings of the recorded run ---------------------------------------------------------------- */

static const ms_snap_kv_t *rp_setting(const ms_snapshot_t *s, const char *key) {
  for (size_t i = 0; i < s->nsettings_top && i < s->nsettings; i++)
    if (s->settings[i].key && strcmp(s->settings[i].key, key) == 0) return &s->settings[i];
  return NULL;
}

/* The configuration the trace was recorded with (reference/replay-notes.md §2: files without
 * allocator_settings use the defaults). */
static void rp_config_of(const ms_snapshot_t *s, ms_alloc_config_t *c) {
  ms_alloc_config_init(c);
  const ms_snap_kv_t *kv = rp_setting(s, "PYTORCH_CUDA_ALLOC_CONF");
  if (kv && kv->kind == MS_SNAP_VAL_STR && kv->s && *kv->s) {
    ms_alloc_config_t t = *c;
    if (ms_alloc_config_parse(&t, kv->s, NULL) == MS_OK) *c = t;
  }
  kv = rp_setting(s, "max_split_size");
  if (kv && kv->kind == MS_SNAP_VAL_INT && kv->i > 0) c->max_split_size = (size_t)kv->i;
  kv = rp_setting(s, "expandable_segments");
  if (kv && kv->kind == MS_SNAP_VAL_BOOL) c->expandable_segments = kv->b;
  kv = rp_setting(s, "garbage_collection_threshold");
  if (kv && kv->kind == MS_SNAP_VAL_FLOAT) c->garbage_collection_threshold = kv->f;
  kv = rp_setting(s, "roundup_power2_divisions");
  if (kv && kv->kind == MS_SNAP_VAL_MAP) {
    for (uint32_t i = 0; i < kv->count && kv->first + i < s->nsettings; i++) {
      const ms_snap_kv_t *e = &s->settings[kv->first + i];
      unsigned long mib = e->key ? strtoul(e->key, NULL, 10) : 0;
      if (!mib || (mib & (mib - 1)) || e->kind != MS_SNAP_VAL_INT || e->i < 0) continue;
      int idx = 0;
      while ((1ul << idx) < mib) idx++;
      if (idx < MS_ROUNDUP_POWER2_INTERVALS) c->roundup_power2_divisions[idx] = (size_t)e->i;
    }
  }
  ms_alloc_config_t d;
  if (ms_alloc_config_validate(c, NULL) != MS_OK) {
    ms_alloc_config_init(&d);
    *c = d;
  }
}

/* ---- one device's trace: preconditions and the start state (replay-notes §3) ---------------------- */

typedef struct rp_sblock_s {
  uint64_t addr;
  uint64_t size;     /* 0 = to infer */
  uint64_t requested;
  int state;         /* 1 allocated, 2 pending */
  bool ambiguous;
  int64_t free_entry; /* entry of its free in the trace (inferred ones), else -1 */
} rp_sblock_t;

typedef struct rp_sseg_s {
  uint64_t addr, size, stream;
  bool is_small;
  int64_t snap_index; /* its segment in the snapshot, -1 if re-created from a segment_free */
  MS_VEC(rp_sblock_t) blocks;
} rp_sseg_t;

typedef struct rp_trace_s {
  const ms_snapshot_t *snap;
  const ms_snap_trace_t *t; /* the device's entries */
  size_t n;
  size_t first;             /* entry index of t[0] */
  int device;
  ms_alloc_config_t cfg;
  MS_VEC(rp_sseg_t) segs;   /* start segments, sorted by address */
  size_t inferred, ambiguous, start_blocks;
  /* The recorded device's total memory when the snapshot says (memsnap's do): expandable
   * reservations are sized from it, and best fit among expandable blocks sees their size. */
  uint64_t device_total;
  /* Per entry starting a release burst: 1 = empty_cache, 2 = the OOM path, 0 = unknown. The
   * check replay classifies them; what-if replays reuse its answers. */
  uint8_t *burst_kind;
} rp_trace_t;

static void rp_trace_release(rp_trace_t *tr) {
  free(tr->burst_kind);
  for (size_t i = 0; i < tr->segs.len; i++) MS_VEC_FREE(&tr->segs.ptr[i].blocks);
  MS_VEC_FREE(&tr->segs);
}

static int rp_cmp_sseg(const void *a, const void *b) {
  const rp_sseg_t *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

static int rp_cmp_sblock(const void *a, const void *b) {
  const rp_sblock_t *x = a, *y = b;
  return x->addr < y->addr ? -1 : x->addr > y->addr;
}

/* The start segment containing addr, or NULL. */
static rp_sseg_t *rp_seg_of(rp_trace_t *tr, uint64_t addr) {
  size_t lo = 0, hi = tr->segs.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (tr->segs.ptr[mid].addr <= addr) lo = mid + 1;
    else hi = mid;
  }
  if (!lo) return NULL;
  rp_sseg_t *s = &tr->segs.ptr[lo - 1];
  return addr < s->addr + s->size ? s : NULL;
}

static bool rp_is_device_seg(const ms_snap_segment_t *sg, int device) {
  return sg->device == device;
}

/* Sets *why and returns false when the device's trace cannot be replayed (replay-notes §4). */
static bool rp_replayable(const rp_trace_t *tr, char *why, size_t cap) {
  const ms_snapshot_t *s = tr->snap;
  if (s->origin == MS_SNAP_ORIGIN_TORCH_LIST) {
    snprintf(why, cap, "a bare segment list (PyTorch before 2.0) has no trace");
    return false;
  }
  size_t nalloc = 0, nfree = 0;
  for (size_t i = 0; i < tr->n; i++) {
    const ms_snap_trace_t *e = &tr->t[i];
    if (e->action == MS_TRACE_ALLOC) nalloc++;
    if (e->action == MS_TRACE_FREE_REQUESTED) nfree++;
    if ((e->present & MS_TRACE_HAS_POOL_ID) && (e->pool_id[0] || e->pool_id[1])) {
      snprintf(why, cap, "uses private pools (CUDA graphs or MemPool), which replay does not model");
      return false;
    }
  }
  if (tr->n == 0) {
    snprintf(why, cap, "no trace entries");
    return false;
  }
  if (nalloc + nfree == 0) { /* at most a free_completed or a snapshot entry */
    snprintf(why, cap, "no alloc/free history (%zu trace entr%s)", tr->n, tr->n == 1 ? "y" : "ies");
    return false;
  }
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *sg = &s->segments[i];
    if (!rp_is_device_seg(sg, tr->device)) continue;
    if (sg->pool_id[0] || sg->pool_id[1]) {
      snprintf(why, cap, "uses private pools (CUDA graphs or MemPool), which replay does not model");
      return false;
    }
  }
  return true;
}

/* An alloc of the trace, for landing evidence: sorted by (address, entry). */
typedef struct rp_landing_s {
  uint64_t addr;
  size_t idx;
} rp_landing_t;

static int rp_cmp_landing(const void *a, const void *b) {
  const rp_landing_t *x = a, *y = b;
  if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
  return x->idx < y->idx ? -1 : x->idx > y->idx;
}

/* Step 1: the start segments, the final ones with the trace's segment_alloc/free undone, newest
 * first; expandable segments only when the trace mapped all of them. */
static int rp_start_segments(rp_trace_t *tr, char *why, size_t cap) {
  const ms_snapshot_t *s = tr->snap;
  bool any_expandable_map = false;
  for (size_t i = 0; i < tr->n; i++)
    if (tr->t[i].action == MS_TRACE_SEGMENT_MAP || tr->t[i].action == MS_TRACE_SEGMENT_UNMAP)
      any_expandable_map = true;
  uint64_t final_expandable = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *sg = &s->segments[i];
    if (!rp_is_device_seg(sg, tr->device)) continue;
    if (sg->is_expandable) {
      final_expandable += sg->total_size;
      continue;
    }
    rp_sseg_t ss = {sg->address, sg->total_size, sg->stream, false, (int64_t)i, {0}};
    ss.is_small = (sg->present & MS_SEG_HAS_SEGMENT_TYPE) ? !sg->is_large
                                                           : sg->total_size <= MS_SMALL_BUFFER;
    if (MS_VEC_PUSH(&tr->segs, ss) != 0) return MS_ENOMEM;
  }
  if (final_expandable || any_expandable_map) {
    /* Replayable only when nothing was mapped before the trace (§3): the mapped bytes at the end
     * must all come from the trace's maps. */
    int64_t net = 0;
    for (size_t i = 0; i < tr->n; i++) {
      if (tr->t[i].action == MS_TRACE_SEGMENT_MAP) net += (int64_t)tr->t[i].size;
      if (tr->t[i].action == MS_TRACE_SEGMENT_UNMAP) net -= (int64_t)tr->t[i].size;
    }
    if (net != (int64_t)final_expandable) {
      snprintf(why, cap,
               "expandable segments were mapped before the trace began (%" PRIu64
               " bytes mapped at the end, %" PRId64 " mapped by the trace)",
               final_expandable, net);
      return MS_EINVAL;
    }
  }
  for (size_t k = tr->n; k-- > 0;) {
    const ms_snap_trace_t *e = &tr->t[k];
    if (e->action == MS_TRACE_SEGMENT_ALLOC) {
      size_t j = 0;
      while (j < tr->segs.len && tr->segs.ptr[j].addr != e->addr) j++;
      if (j == tr->segs.len) {
        snprintf(why, cap, "entry %zu: segment_alloc at 0x%" PRIx64 " of a segment that is neither "
                 "in the snapshot nor freed later in the trace", tr->first + k, e->addr);
        return MS_EINVAL;
      }
      MS_VEC_FREE(&tr->segs.ptr[j].blocks);
      tr->segs.ptr[j] = tr->segs.ptr[tr->segs.len - 1];
      tr->segs.len--;
    } else if (e->action == MS_TRACE_SEGMENT_FREE) {
      rp_sseg_t ss = {e->addr, e->size, e->stream, e->size <= MS_SMALL_BUFFER, -1, {0}};
      if (MS_VEC_PUSH(&tr->segs, ss) != 0) return MS_ENOMEM;
    }
  }
  if (tr->segs.len) qsort(tr->segs.ptr, tr->segs.len, sizeof *tr->segs.ptr, rp_cmp_sseg);
  for (size_t i = 1; i < tr->segs.len; i++) {
    if (tr->segs.ptr[i - 1].addr + tr->segs.ptr[i - 1].size > tr->segs.ptr[i].addr) {
      snprintf(why, cap, "start segments at 0x%" PRIx64 " and 0x%" PRIx64 " overlap",
               tr->segs.ptr[i - 1].addr, tr->segs.ptr[i].addr);
      return MS_EINVAL;
    }
  }

  return MS_OK;
}

/* Step 2: the blocks live at the start: (b) freed in the trace without their alloc (size to
 * infer), pending frees cut by the ring buffer, and (a) active at the end with no alloc in the
 * trace (exact sizes). */
static int rp_start_blocks(rp_trace_t *tr) {
  const ms_snapshot_t *s = tr->snap;
  int r = MS_OK;
  /* forward scan: addresses allocated in the trace, and frees of older blocks */
  rp_map_t live = {0}, freed = {0};
  for (size_t i = 0; i < tr->n && r == MS_OK; i++) {
    const ms_snap_trace_t *e = &tr->t[i];
    uint64_t v;
    if (e->action == MS_TRACE_ALLOC) {
      r = rp_map_put(&live, e->addr, 1);
    } else if (e->action == MS_TRACE_FREE_REQUESTED) {
      if (rp_map_take(&live, e->addr, &v)) {
        r = rp_map_put(&freed, e->addr, 1);
      } else {
        /* (b): allocated at the start, freed here. */
        rp_sseg_t *sg = rp_seg_of(tr, e->addr);
        if (!sg) continue; /* checked by the replay itself */
        rp_sblock_t b = {e->addr, 0, e->size, 1, false, (int64_t)i};
        if (MS_VEC_PUSH(&sg->blocks, b) != 0) r = MS_ENOMEM;
        r = r == MS_OK ? rp_map_put(&freed, e->addr, 1) : r;
      }
    } else if (e->action == MS_TRACE_FREE_COMPLETED) {
      if (!rp_map_take(&freed, e->addr, &v)) {
        /* Pending at the start (the ring buffer cut inside a deferred free). */
        rp_sseg_t *sg = rp_seg_of(tr, e->addr);
        if (!sg) continue;
        rp_sblock_t b = {e->addr, 0, e->size, 2, false, (int64_t)i};
        if (MS_VEC_PUSH(&sg->blocks, b) != 0) r = MS_ENOMEM;
      }
    }
  }
  /* (a): blocks active at the end whose alloc is not in the trace (exact sizes). */
  for (size_t j = 0; j < tr->segs.len && r == MS_OK; j++) {
    rp_sseg_t *sg = &tr->segs.ptr[j];
    if (sg->snap_index < 0) continue;
    const ms_snap_segment_t *fs = &s->segments[sg->snap_index];
    for (uint32_t k = 0; k < fs->nblocks; k++) {
      const ms_snap_block_t *b = ms_snap_segment_block(s, fs, k);
      if (b->state != MS_BLOCK_ACTIVE_ALLOCATED && b->state != MS_BLOCK_ACTIVE_PENDING_FREE) continue;
      if (rp_map_has(&live, b->address) || rp_map_has(&freed, b->address)) continue;
      rp_sblock_t sb = {b->address, b->size, b->requested_size,
                        b->state == MS_BLOCK_ACTIVE_ALLOCATED ? 1 : 2, false, -1};
      if (MS_VEC_PUSH(&sg->blocks, sb) != 0) {
        r = MS_ENOMEM;
        break;
      }
    }
  }
  rp_map_free(&live);
  rp_map_free(&freed);
  return r;
}

/* The size of start block k of sg freed in the trace (replay-notes §3): its rounded request in
 * the small pool; in the large pool the gap to the next known block when that gap is a split
 * remainder PyTorch would not keep (<= 1 MiB), else the nearest earlier alloc landing just above
 * it (land: the trace's allocs sorted by address), else the rounded request (ambiguous). *next
 * gets the address of the next known block. */
static void rp_infer_size(rp_trace_t *tr, rp_sseg_t *sg, size_t k, const rp_landing_t *land,
                          size_t nland, uint64_t *next_out) {
  rp_sblock_t *b = &sg->blocks.ptr[k];
  tr->inferred++;
  uint64_t next = k + 1 < sg->blocks.len ? sg->blocks.ptr[k + 1].addr : sg->addr + sg->size;
  uint64_t rs = ms_alloc_round_size(&tr->cfg, b->requested ? b->requested : 1);
  if (sg->is_small) {
    b->size = rs;
  } else if (b->addr + rs <= next && next - (b->addr + rs) <= MS_SMALL_SIZE) {
    b->size = next - b->addr; /* a large-pool free block is > 1 MiB: the block owns the gap */
  } else {
    uint64_t lo = b->addr + rs, hi = lo + MS_SMALL_SIZE, best = 0;
    size_t a = 0, z = nland;
    while (a < z) {
      size_t mid = a + (z - a) / 2;
      if (land[mid].addr < lo) a = mid + 1;
      else z = mid;
    }
    for (; a < nland && land[a].addr <= hi; a++) {
      if ((int64_t)land[a].idx < b->free_entry && land[a].addr < next) {
        best = land[a].addr;
        break;
      }
    }
    if (best) {
      b->size = best - b->addr;
    } else {
      b->size = rs;
      b->ambiguous = true;
      tr->ambiguous++;
    }
  }
  *next_out = next;
}

/* Step 3: the sizes of the blocks freed in the trace, and the consistency of the start blocks. */
static int rp_start_sizes(rp_trace_t *tr, char *why, size_t cap) {
  /* landing evidence needs the allocs sorted by address */
  MS_VEC(rp_landing_t) land = {0};
  for (size_t i = 0; i < tr->n; i++)
    if (tr->t[i].action == MS_TRACE_ALLOC &&
        MS_VEC_PUSH(&land, ((rp_landing_t){tr->t[i].addr, i})) != 0) {
      MS_VEC_FREE(&land);
      return MS_ENOMEM;
    }
  if (land.len) qsort(land.ptr, land.len, sizeof *land.ptr, rp_cmp_landing);
  for (size_t j = 0; j < tr->segs.len; j++) {
    rp_sseg_t *sg = &tr->segs.ptr[j];
    if (!sg->blocks.len) continue;
    qsort(sg->blocks.ptr, sg->blocks.len, sizeof *sg->blocks.ptr, rp_cmp_sblock);
    for (size_t k = 0; k < sg->blocks.len; k++) {
      rp_sblock_t *b = &sg->blocks.ptr[k];
      tr->start_blocks++;
      if (k && sg->blocks.ptr[k - 1].addr == b->addr) {
        snprintf(why, cap, "two blocks at 0x%" PRIx64 " at the start", b->addr);
        MS_VEC_FREE(&land);
        return MS_EINVAL;
      }
      if (b->size) continue;
      uint64_t next;
      rp_infer_size(tr, sg, k, land.ptr, land.len, &next);
      if (b->addr + b->size > next) {
        snprintf(why, cap, "the block at 0x%" PRIx64 " (%" PRIu64 " B requested) overlaps the next "
                 "known block at 0x%" PRIx64, b->addr, b->requested, next);
        MS_VEC_FREE(&land);
        return MS_EINVAL;
      }
    }
  }
  MS_VEC_FREE(&land);
  return MS_OK;
}


/* Rebuilds the segments and blocks that existed when the trace began. @return MS_OK, or
 * MS_EINVAL with *why when the trace and the snapshot contradict each other. */
static int rp_rebuild_start(rp_trace_t *tr, char *why, size_t cap) {
  MS_FORWARD_IF_ERROR(rp_start_segments(tr, why, cap));
  if (!tr->segs.len) return MS_OK;
  MS_FORWARD_IF_ERROR(rp_start_blocks(tr));
  return rp_start_sizes(tr, why, cap);
}

/* ---- the replay of one device -------------------------------------------------------------------- */

typedef struct rp_got_s {
  ms_trace_action action;
  uint64_t addr, size;
} rp_got_t;

/* A synthetic expandable range paired with the recorded one it stands for. */
typedef struct rp_xlate_s {
  uint64_t syn, rec, size;
} rp_xlate_t;

typedef struct rp_run_s {
  rp_trace_t *tr;
  MS_VEC(rp_xlate_t) xlate; /* synthetic range -> recorded range */
  bool whatif;
  size_t capacity;
  ms_backend_t *backend;
  rdev_t *rdev;          /* check mode */
  ms_allocator_t *a;
  ms__alloc_hooks_t hooks;
  MS_VEC(rp_got_t) got;  /* allocator trace entries of the current operation */
  MS_VEC(size_t) pend;   /* recorded segment entries awaiting their operation */
  rp_map_t live;         /* recorded address -> replayed address */
  rp_map_t pending;      /* recorded address -> pending handle */
  ms_replay_device_t *res;
  ms_replay_usage_t *use;
  bool stop;
} rp_run_t;

static void rp_hook_trace(void *ctx, const ms__trace_rec_t *rec) {
  rp_run_t *run = ctx;
  switch (rec->action) {
  case MS_TRACE_ALLOC:
  case MS_TRACE_SEGMENT_ALLOC:
  case MS_TRACE_SEGMENT_FREE:
  case MS_TRACE_SEGMENT_MAP:
  case MS_TRACE_SEGMENT_UNMAP:
  case MS_TRACE_OOM:
    if (MS_VEC_PUSH(&run->got, ((rp_got_t){rec->action, rec->addr, rec->size})) != 0)
      run->stop = true;
    break;
  default:
    break;
  }
}

/* The recorded address of a replayed one (identity outside paired synthetic ranges). */
static uint64_t rp_xlate(const rp_run_t *run, uint64_t addr) {
  for (size_t i = 0; i < run->xlate.len; i++) {
    const rp_xlate_t *x = &run->xlate.ptr[i];
    if (addr >= x->syn && addr - x->syn < x->size) return x->rec + (addr - x->syn);
  }
  return addr;
}

/* A range reserved by an allocation that failed (no map recorded then) got a synthetic base; its
 * first recorded map, at the recorded range's base, pairs the two. @return whether y_addr is such
 * an unpaired synthetic base (and pairs it with rec). */
static bool rp_pair_range(rp_run_t *run, uint64_t y_addr, uint64_t rec) {
  if (!run->rdev || y_addr < RP_SYNTH_BASE) return false;
  for (size_t i = 0; i < run->xlate.len; i++)
    if (run->xlate.ptr[i].syn == y_addr) return false;
  for (size_t i = 0; i < run->rdev->ranges.len; i++) {
    const rdev_range_t *rg = &run->rdev->ranges.ptr[i];
    if (rg->va && rg->addr == y_addr) {
      if (MS_VEC_PUSH(&run->xlate, ((rp_xlate_t){y_addr, rec, rg->size})) != 0) run->stop = true;
      return true;
    }
  }
  return false;
}

static void rp_describe(char *dst, size_t cap, ms_trace_action a, uint64_t addr, uint64_t size) {
  if (a == MS_TRACE_OOM)
    snprintf(dst, cap, "oom for %" PRIu64 " B", size);
  else
    snprintf(dst, cap, "%s 0x%" PRIx64 " %" PRIu64 " B", ms_trace_action_name(a), addr, size);
}

/* Whether addr lies in a start segment that holds an ambiguous inferred block. */
static bool rp_near_ambiguous(rp_trace_t *tr, uint64_t addr) {
  rp_sseg_t *sg = rp_seg_of(tr, addr);
  if (!sg) return false;
  for (size_t k = 0; k < sg->blocks.len; k++)
    if (sg->blocks.ptr[k].ambiguous) return true;
  return false;
}

static void rp_mismatch(rp_run_t *run, int64_t entry, uint64_t addr1, uint64_t addr2,
                        const char *expected, const char *actual) {
  ms_replay_device_t *res = run->res;
  if (run->stop) return;
  run->stop = true;
  bool inc = rp_near_ambiguous(run->tr, addr1) || rp_near_ambiguous(run->tr, addr2);
  res->verdict = inc ? MS_REPLAY_INCONCLUSIVE : MS_REPLAY_FAIL;
  res->mismatch_entry = entry;
  snprintf(res->expected, sizeof res->expected, "%s", expected);
  snprintf(res->actual, sizeof res->actual, "%s", actual);
  if (entry >= 0)
    snprintf(res->reason, sizeof res->reason, "entry %" PRId64 ": PyTorch: %s; memsnap: %s%s",
             entry, expected, actual, inc ? " (next to an ambiguous inferred start block)" : "");
  else
    snprintf(res->reason, sizeof res->reason, "final layout: PyTorch: %s; memsnap: %s", expected,
             actual);
}

/* Compares the allocator's entries of the operation with the recorded ones: pend + last (the
 * entry that ended the operation, or SIZE_MAX). */
static void rp_compare(rp_run_t *run, size_t last) {
  rp_trace_t *tr = run->tr;
  size_t nexp = run->pend.len + (last != SIZE_MAX);
  char e[256], g[256];
  for (size_t k = 0; k < nexp || k < run->got.len; k++) {
    size_t idx = k < run->pend.len ? run->pend.ptr[k] : last;
    const ms_snap_trace_t *x = k < nexp ? &tr->t[idx] : NULL;
    const rp_got_t *y = k < run->got.len ? &run->got.ptr[k] : NULL;
    if (x && y && x->action == y->action && x->size == y->size &&
        (x->action == MS_TRACE_OOM || x->addr == rp_xlate(run, y->addr) ||
         (x->action == MS_TRACE_SEGMENT_MAP && rp_pair_range(run, y->addr, x->addr))))
      continue;
    int64_t at = (int64_t)(tr->first + (x ? idx : (last != SIZE_MAX ? last : run->pend.ptr[0])));
    if (x) rp_describe(e, sizeof e, x->action, x->addr, x->size);
    else snprintf(e, sizeof e, "nothing more");
    if (y) rp_describe(g, sizeof g, y->action, rp_xlate(run, y->addr), y->size);
    else snprintf(g, sizeof g, "nothing more");
    rp_mismatch(run, at, x ? x->addr : 0, y ? y->addr : 0, e, g);
    return;
  }
}

static void rp_track_peak(rp_run_t *run) {
  size_t res, alc;
  ms__allocator_replay_usage(run->a, &res, &alc);
  /* Fragmentation at the peak: the least unallocated part of reserved memory while reserved
   * memory stood at its peak (the peak's unavoidable part, not its first moment). */
  uint64_t frag = res - (alc < res ? alc : res);
  if (res > run->use->peak_reserved) {
    run->use->peak_reserved = res;
    run->use->frag_at_peak = frag;
  } else if (res == run->use->peak_reserved && frag < run->use->frag_at_peak) {
    run->use->frag_at_peak = frag;
  }
  if (alc > run->use->peak_allocated) run->use->peak_allocated = alc;
}

static void rp_note_oom(rp_run_t *run, size_t i, uint64_t size) {
  ms_replay_usage_t *u = run->use;
  if (u->first_oom_entry >= 0) return;
  u->first_oom_entry = (int64_t)(run->tr->first + i);
  u->first_oom_size = size;
  ms_allocator_last_oom_message(run->a, u->oom_message, sizeof u->oom_message);
}

/* Sets the recorded device up for the operation ending at entry `last` (check mode). */
static void rp_arm(rp_run_t *run, bool oom_entry) {
  rdev_t *d = run->rdev;
  rp_trace_t *tr = run->tr;
  d->expect.len = 0;
  d->expect_pos = 0;
  d->va_bases.len = 0;
  d->va_pos = 0;
  d->fail = RDEV_FAIL_NONE;
  d->frees_done = 0;
  size_t nfree = 0;
  bool mapped_base = false;
  for (size_t k = 0; k < run->pend.len; k++) {
    const ms_snap_trace_t *e = &tr->t[run->pend.ptr[k]];
    if (e->action == MS_TRACE_SEGMENT_ALLOC) {
      if (MS_VEC_PUSH(&d->expect, ((rdev_expect_t){e->addr, e->size})) != 0) run->stop = true;
    } else if (e->action == MS_TRACE_SEGMENT_MAP) {
      /* An allocation maps pages of one range only; when it had to reserve a new range, its first
       * map is at that range's base (the reservation's size is the recorded GPU's, unknown here,
       * so the base is taken whenever the allocator reserves). */
      if (!mapped_base) {
        if (MS_VEC_PUSH(&d->va_bases, e->addr) != 0) run->stop = true;
        mapped_base = true;
      }
    } else {
      nfree++;
    }
  }
  if (!run->capacity) {
    if (oom_entry) {
      d->fail = RDEV_FAIL_ALL;
    } else if (nfree) {
      d->fail = RDEV_FAIL_UNTIL_FREES;
      d->fail_frees = nfree;
    }
  }
}

static void rp_disarm(rp_run_t *run) {
  if (!run->rdev) return;
  run->rdev->fail = RDEV_FAIL_NONE;
  run->rdev->expect.len = 0;
  run->rdev->va_bases.len = 0;
}

/* Whether the burst in pend was made by empty_cache (its stack says so) rather than by the OOM
 * path (replay-notes §1). */
static bool rp_burst_is_empty_cache(const rp_run_t *run) {
  const ms_snapshot_t *s = run->tr->snap;
  for (size_t k = 0; k < run->pend.len; k++) {
    const ms_snap_trace_t *e = &run->tr->t[run->pend.ptr[k]];
    if (e->stack == MS_SNAP_NO_STACK || e->stack >= s->nstacks) continue;
    for (uint32_t f = 0; f < ms_snap_stack_depth(s, e->stack); f++) {
      const char *nm = ms_snap_stack_frame(s, e->stack, f)->name;
      if (nm && (strstr(nm, "emptyCache") || strstr(nm, "empty_cache"))) return true;
    }
    return false;
  }
  return false;
}

static void rp_op_flush(rp_run_t *run);

/* Before the operation of an alloc or oom entry: a release burst in pend that the allocation did
 * not cause (the OOM path always ends with a new segment, a map or an `oom` entry; the burst's
 * stack may name empty_cache) is replayed first as an empty_cache of its own. */
static void rp_split_burst(rp_run_t *run, size_t i, bool oom_entry) {
  size_t nfree = 0;
  while (nfree < run->pend.len) {
    ms_trace_action ac = run->tr->t[run->pend.ptr[nfree]].action;
    if (ac != MS_TRACE_SEGMENT_FREE && ac != MS_TRACE_SEGMENT_UNMAP) break;
    nfree++;
  }
  if (!nfree) return;
  /* Caused by the allocation only if the cache could not serve it (PyTorch's OOM path starts
   * when get_free_block fails). What-if replays take the check replay's answer. */
  const ms_snap_trace_t *e = &run->tr->t[i];
  uint8_t *kind = run->tr->burst_kind ? &run->tr->burst_kind[run->pend.ptr[0]] : NULL;
  bool caused;
  if (run->whatif && kind && *kind) {
    caused = *kind == 2;
  } else {
    caused = oom_entry || (nfree < run->pend.len &&
                           !ms__allocator_replay_would_fit(run->a, (size_t)e->size,
                                                           (ms_stream_t)e->stream));
    if (caused && rp_burst_is_empty_cache(run)) caused = false;
    if (kind && !run->whatif) *kind = caused ? 2 : 1;
  }
  if (caused) return;
  size_t total = run->pend.len;
  run->pend.len = nfree;
  rp_op_flush(run); /* reads pend, never grows it */
  memmove(run->pend.ptr, run->pend.ptr + nfree, (total - nfree) * sizeof *run->pend.ptr);
  run->pend.len = total - nfree;
}

/* alloc / oom entry i. */
static void rp_op_malloc(rp_run_t *run, size_t i, bool oom_entry) {
  const ms_snap_trace_t *e = &run->tr->t[i];
  size_t size = (size_t)e->size;
  rp_split_burst(run, i, oom_entry);
  if (run->stop) return;
  if (run->whatif) {
    run->pend.len = 0; /* what remains belongs to the OOM path: the allocator predicts its own */
  } else {
    rp_arm(run, oom_entry);
  }
  run->got.len = 0;
  ms_devptr_t ptr = 0;
  int r = size ? ms_allocator_malloc(run->a, size, (ms_stream_t)e->stream, &ptr) : MS_OK;
  rp_disarm(run);
  if (run->whatif) {
    if (r == MS_EOOM) {
      rp_note_oom(run, i, size);
    } else if (r != MS_OK) {
      run->stop = true;
    } else if (oom_entry) {
      /* The recorded run failed here; under this configuration it did not. The program did not
       * get the memory in the recorded run, so it is released at once. */
      (void)ms_allocator_free(run->a, ptr);
    } else if (ptr && rp_map_put(&run->live, e->addr, ptr) != MS_OK) {
      run->stop = true;
    }
    if (r == MS_OK) rp_track_peak(run);
    return;
  }
  char ex[256], got[256];
  if (oom_entry) {
    if (r != MS_EOOM) {
      rp_describe(ex, sizeof ex, MS_TRACE_OOM, 0, e->size);
      snprintf(got, sizeof got, "the allocation succeeded at 0x%" PRIxPTR, (uintptr_t)ptr);
      rp_mismatch(run, (int64_t)(run->tr->first + i), 0, ptr, ex, got);
      return;
    }
    rp_note_oom(run, i, size);
    rp_compare(run, i);
    run->pend.len = 0;
    return;
  }
  if (r != MS_OK) {
    rp_describe(ex, sizeof ex, MS_TRACE_ALLOC, e->addr, e->size);
    snprintf(got, sizeof got, "malloc failed: %s", ms_strerror(r));
    if (r == MS_EOOM) rp_note_oom(run, i, size);
    rp_mismatch(run, (int64_t)(run->tr->first + i), e->addr, 0, ex, got);
    return;
  }
  rp_compare(run, i);
  run->pend.len = 0;
  if (!run->stop && rp_map_put(&run->live, e->addr, ptr) != MS_OK) run->stop = true;
  rp_track_peak(run);
}

/* A burst (or stray segment entries) not followed by an allocation: empty_cache. */
static void rp_op_flush(rp_run_t *run) {
  if (!run->pend.len) return;
  rp_trace_t *tr = run->tr;
  if (run->whatif) {
    bool frees_only = true;
    for (size_t k = 0; k < run->pend.len; k++) {
      ms_trace_action ac = tr->t[run->pend.ptr[k]].action;
      if (ac != MS_TRACE_SEGMENT_FREE && ac != MS_TRACE_SEGMENT_UNMAP) frees_only = false;
    }
    if (frees_only && ms_allocator_empty_cache(run->a) != MS_OK) run->stop = true;
    run->pend.len = 0;
    return;
  }
  rp_arm(run, false);
  run->rdev->fail = RDEV_FAIL_NONE;
  run->got.len = 0;
  if (ms_allocator_empty_cache(run->a) != MS_OK) run->stop = true;
  rp_disarm(run);
  rp_compare(run, SIZE_MAX);
  run->pend.len = 0;
}

static void rp_op_free(rp_run_t *run, size_t *ip) {
  rp_trace_t *tr = run->tr;
  size_t i = *ip;
  const ms_snap_trace_t *e = &tr->t[i];
  uint64_t ptr;
  if (!rp_map_take(&run->live, e->addr, &ptr)) {
    if (run->whatif) return; /* its allocation failed (OOM) in this configuration */
    char ex[256];
    rp_describe(ex, sizeof ex, MS_TRACE_FREE_REQUESTED, e->addr, e->size);
    rp_mismatch(run, (int64_t)(tr->first + i), e->addr, 0, ex, "no block is allocated there");
    return;
  }
  bool now = i + 1 < tr->n && tr->t[i + 1].action == MS_TRACE_FREE_COMPLETED &&
             tr->t[i + 1].addr == e->addr;
  if (now) {
    if (ms_allocator_free(run->a, (ms_devptr_t)ptr) != MS_OK) run->stop = true;
    *ip = i + 1;
    return;
  }
  void *h = NULL;
  if (ms__allocator_replay_free_deferred(run->a, (ms_devptr_t)ptr, &h) != MS_OK ||
      rp_map_put(&run->pending, e->addr, (uint64_t)(uintptr_t)h) != MS_OK)
    run->stop = true;
}

static void rp_op_complete(rp_run_t *run, size_t i) {
  const ms_snap_trace_t *e = &run->tr->t[i];
  uint64_t h;
  if (!rp_map_take(&run->pending, e->addr, &h)) {
    if (run->whatif) return;
    char ex[256];
    rp_describe(ex, sizeof ex, MS_TRACE_FREE_COMPLETED, e->addr, e->size);
    rp_mismatch(run, (int64_t)(run->tr->first + i), e->addr, 0, ex,
                "no block is waiting to be freed there");
    return;
  }
  ms__allocator_replay_complete(run->a, (void *)(uintptr_t)h);
}

/* Places the start state: exactly (check) or by allocating the live blocks (what-if). */
static int rp_place_start(rp_run_t *run) {
  rp_trace_t *tr = run->tr;
  for (size_t j = 0; j < tr->segs.len; j++) {
    rp_sseg_t *sg = &tr->segs.ptr[j];
    if (run->whatif) {
      for (size_t k = 0; k < sg->blocks.len; k++) {
        rp_sblock_t *b = &sg->blocks.ptr[k];
        ms_devptr_t p = 0;
        int r = ms_allocator_malloc(run->a, b->requested ? b->requested : b->size,
                                    (ms_stream_t)sg->stream, &p);
        if (r == MS_EOOM) {
          rp_note_oom(run, 0, b->requested);
          run->use->first_oom_entry = (int64_t)tr->first;
          continue;
        }
        MS_FORWARD_IF_ERROR(r);
        if (b->state == 1) {
          MS_FORWARD_IF_ERROR(rp_map_put(&run->live, b->addr, p));
        } else {
          void *h = NULL;
          MS_FORWARD_IF_ERROR(ms__allocator_replay_free_deferred(run->a, p, &h));
          MS_FORWARD_IF_ERROR(rp_map_put(&run->pending, b->addr, (uint64_t)(uintptr_t)h));
        }
      }
      continue;
    }
    /* Tile the segment: known blocks, and free gaps between them. */
    MS_VEC(ms__replay_block_t) tiles = {0};
    uint64_t at = sg->addr, end = sg->addr + sg->size;
    int r = MS_OK;
    for (size_t k = 0; k <= sg->blocks.len && r == MS_OK; k++) {
      uint64_t nx = k < sg->blocks.len ? sg->blocks.ptr[k].addr : end;
      if (nx > at) r = MS_VEC_PUSH(&tiles, ((ms__replay_block_t){nx - at, 0, 0, NULL})) ? MS_ENOMEM : MS_OK;
      if (k == sg->blocks.len || r != MS_OK) break;
      rp_sblock_t *b = &sg->blocks.ptr[k];
      r = MS_VEC_PUSH(&tiles, ((ms__replay_block_t){b->size, b->requested, b->state, NULL}))
              ? MS_ENOMEM : MS_OK;
      at = b->addr + b->size;
    }
    if (r == MS_OK) r = rdev_add(run->rdev, sg->addr, sg->size, false);
    if (r == MS_OK) {
      run->rdev->used += sg->size;
      r = ms__allocator_replay_add_segment(run->a, sg->addr, sg->size, sg->stream, sg->is_small,
                                           tiles.ptr, tiles.len);
    }
    for (size_t k = 0, bi = 0; r == MS_OK && k < tiles.len; k++) {
      if (tiles.ptr[k].state == 0) continue;
      rp_sblock_t *b = &sg->blocks.ptr[bi++];
      if (tiles.ptr[k].state == 1) r = rp_map_put(&run->live, b->addr, b->addr);
      else r = rp_map_put(&run->pending, b->addr, (uint64_t)(uintptr_t)tiles.ptr[k].pending);
    }
    MS_VEC_FREE(&tiles);
    if (r != MS_OK) return r;
  }
  return MS_OK;
}

static int rp_cmp_seg_addr(const void *a, const void *b) {
  const ms_snap_segment_t *x = *(const ms_snap_segment_t *const *)a;
  const ms_snap_segment_t *y = *(const ms_snap_segment_t *const *)b;
  return x->address < y->address ? -1 : x->address > y->address;
}

static int rp_cmp_seg_value(const void *a, const void *b) {
  const ms_snap_segment_t *x = a, *y = b;
  return x->address < y->address ? -1 : x->address > y->address;
}

/* The final layout against the snapshot (check mode). */
static int rp_compare_final(rp_run_t *run) {
  rp_trace_t *tr = run->tr;
  const ms_snapshot_t *s = tr->snap;
  ms_snapshot_t *mine = NULL;
  ms_errbuf_t eb;
  MS_FORWARD_IF_ERROR(ms_allocator_snapshot(&run->a, 1, &mine, &eb));
  const ms_snap_segment_t **rec = malloc((s->nsegments + 1) * sizeof *rec);
  if (!rec) {
    ms_snapshot_free(mine);
    return MS_ENOMEM;
  }
  size_t nrec = 0;
  for (size_t i = 0; i < s->nsegments; i++)
    if (rp_is_device_seg(&s->segments[i], tr->device)) rec[nrec++] = &s->segments[i];
  qsort(rec, nrec, sizeof *rec, rp_cmp_seg_addr);
  char ex[256], got[256];
  size_t nmine = mine->nsegments;
  /* memsnap's addresses in recorded terms (paired synthetic ranges), sorted again. */
  for (size_t i = 0; i < nmine; i++) {
    mine->segments[i].address = rp_xlate(run, mine->segments[i].address);
    for (uint32_t k = 0; k < mine->segments[i].nblocks; k++)
      mine->blocks[mine->segments[i].first_block + k].address =
          rp_xlate(run, mine->blocks[mine->segments[i].first_block + k].address);
  }
  if (nmine) qsort(mine->segments, nmine, sizeof *mine->segments, rp_cmp_seg_value);
  for (size_t i = 0; i < nrec || i < nmine; i++) {
    const ms_snap_segment_t *x = i < nrec ? rec[i] : NULL;
    const ms_snap_segment_t *y = i < nmine ? &mine->segments[i] : NULL;
    if (!x || !y || x->address != y->address || x->total_size != y->total_size) {
      if (x) snprintf(ex, sizeof ex, "segment 0x%" PRIx64 " of %" PRIu64 " B", x->address, x->total_size);
      else snprintf(ex, sizeof ex, "no more segments");
      if (y) snprintf(got, sizeof got, "segment 0x%" PRIx64 " of %" PRIu64 " B", y->address, y->total_size);
      else snprintf(got, sizeof got, "no more segments");
      rp_mismatch(run, -1, x ? x->address : 0, y ? y->address : 0, ex, got);
      break;
    }
    for (uint32_t k = 0; k < x->nblocks || k < y->nblocks; k++) {
      const ms_snap_block_t *bx = k < x->nblocks ? ms_snap_segment_block(s, x, k) : NULL;
      const ms_snap_block_t *by = k < y->nblocks ? ms_snap_segment_block(mine, y, k) : NULL;
      if (bx && by && bx->address == by->address && bx->size == by->size && bx->state == by->state)
        continue;
      if (bx) snprintf(ex, sizeof ex, "block 0x%" PRIx64 " %" PRIu64 " B %s", bx->address, bx->size,
                       ms_block_state_name(bx->state));
      else snprintf(ex, sizeof ex, "no more blocks in segment 0x%" PRIx64, x->address);
      if (by) snprintf(got, sizeof got, "block 0x%" PRIx64 " %" PRIu64 " B %s", by->address,
                       by->size, ms_block_state_name(by->state));
      else snprintf(got, sizeof got, "no more blocks in segment 0x%" PRIx64, y->address);
      rp_mismatch(run, -1, bx ? bx->address : x->address, by ? by->address : y->address, ex, got);
      break;
    }
    if (run->stop) break;
  }
  free(rec);
  ms_snapshot_free(mine);
  return MS_OK;
}

/* Replays one device. cfg_over: what-if configuration string (NULL = recorded settings). */
static int rp_run_device(rp_trace_t *tr, bool whatif, const ms_alloc_config_t *cfg,
                         size_t capacity, ms_replay_device_t *res, ms_replay_usage_t *use) {
  rp_run_t run;
  memset(&run, 0, sizeof run);
  run.tr = tr;
  run.whatif = whatif;
  run.capacity = capacity;
  run.res = res;
  run.use = use;
  memset(use, 0, sizeof *use);
  use->first_oom_entry = -1;
  int r;
  if (whatif) {
    ms_sim_config_t sc = {1, capacity ? capacity : RP_WHATIF_UNLIMITED, false, true, 0};
    r = ms_backend_sim_create(&sc, &run.backend);
  } else {
    r = rdev_create(capacity, tr->device_total, &run.backend, &run.rdev);
  }
  if (r != MS_OK) return r;
  ms_allocator_config_t ac = {.backend = run.backend, .device = 0, .alloc = cfg};
  ms_errbuf_t eb;
  r = ms_allocator_create(&ac, &run.a, &eb);
  if (r != MS_OK) {
    ms_backend_destroy(run.backend);
    return r;
  }
  run.hooks.ctx = &run;
  run.hooks.context_level = 0;
  run.hooks.trace_enabled = !whatif;
  run.hooks.gather = NULL;
  run.hooks.trace = rp_hook_trace;
  if (!whatif) ms__allocator_set_hooks(run.a, &run.hooks);
  r = rp_place_start(&run);
  if (r == MS_EINVAL) { /* a start state the allocator cannot hold (inconsistent sizes) */
    res->verdict = MS_REPLAY_UNREPLAYABLE;
    snprintf(res->reason, sizeof res->reason, "the start state rebuilt from the snapshot is "
             "inconsistent (block sizes do not tile the segments)");
    run.stop = true;
    r = MS_OK;
  }
  if (r == MS_OK) rp_track_peak(&run);
  /* Counters cover the trace only, not the rebuilt start state. */
  ms_stats_t st0 = MS_STATS_INIT;
  if (r == MS_OK) r = ms_allocator_get_stats(run.a, &st0);
  size_t allocs = 0, i = 0;
  for (; r == MS_OK && i < tr->n && !run.stop; i++) {
    const ms_snap_trace_t *e = &tr->t[i];
    switch (e->action) {
    case MS_TRACE_SEGMENT_ALLOC:
    case MS_TRACE_SEGMENT_MAP:
    case MS_TRACE_SEGMENT_FREE:
    case MS_TRACE_SEGMENT_UNMAP:
      if (MS_VEC_PUSH(&run.pend, i) != 0) r = MS_ENOMEM;
      continue;
    case MS_TRACE_ALLOC:
      allocs++;
      rp_op_malloc(&run, i, false);
      continue;
    case MS_TRACE_OOM:
      rp_op_malloc(&run, i, true);
      continue;
    default:
      break;
    }
    rp_op_flush(&run);
    if (run.stop) break;
    if (e->action == MS_TRACE_FREE_REQUESTED) rp_op_free(&run, &i);
    else if (e->action == MS_TRACE_FREE_COMPLETED) rp_op_complete(&run, i);
  }
  if (r == MS_OK && !run.stop) rp_op_flush(&run);
  res->allocs = allocs;
  res->events = i < tr->n ? i : tr->n;
  if (r == MS_OK && !whatif && !run.stop) r = rp_compare_final(&run);
  if (r == MS_OK && run.stop && res->verdict == MS_REPLAY_PASS && !whatif) r = MS_ENOMEM;
  if (r == MS_OK && run.stop && whatif && res->verdict == MS_REPLAY_UNREPLAYABLE) r = MS_OK;
  if (!whatif) ms__allocator_set_hooks(run.a, NULL);
  ms_stats_t st = MS_STATS_INIT;
  if (ms_allocator_get_stats(run.a, &st) == MS_OK) {
    use->device_allocs = (uint64_t)(st.num_device_alloc - st0.num_device_alloc);
    use->device_frees = (uint64_t)(st.num_device_free - st0.num_device_free);
    use->alloc_retries = (uint64_t)(st.num_alloc_retries - st0.num_alloc_retries);
    use->ooms = (uint64_t)st.num_ooms; /* start-state OOMs count: the run could not begin */
  }
  use->valid = r == MS_OK && (whatif || res->verdict == MS_REPLAY_PASS);
  ms_allocator_destroy(run.a);
  ms_backend_destroy(run.backend);
  MS_VEC_FREE(&run.got);
  MS_VEC_FREE(&run.pend);
  MS_VEC_FREE(&run.xlate);
  rp_map_free(&run.live);
  rp_map_free(&run.pending);
  return r;
}

/* ---- public entry points ------------------------------------------------------------------------- */

static int rp_prepare(const ms_snapshot_t *s, size_t d, rp_trace_t *tr, ms_replay_device_t *res) {
  memset(tr, 0, sizeof *tr);
  tr->snap = s;
  tr->device = (int)d;
  tr->first = s->devices[d].first_trace;
  tr->n = s->devices[d].ntrace;
  tr->t = s->trace + tr->first;
  if (s->devices[d].present & MS_DEV_HAS_CAPACITY) tr->device_total = s->devices[d].capacity;
  rp_config_of(s, &tr->cfg);
  tr->burst_kind = calloc(tr->n ? tr->n : 1, 1);
  if (!tr->burst_kind) return MS_ENOMEM;
  res->device = (int)d;
  res->entries = tr->n;
  res->mismatch_entry = -1;
  if (!rp_replayable(tr, res->reason, sizeof res->reason)) {
    res->verdict = MS_REPLAY_UNREPLAYABLE;
    return MS_OK;
  }
  int r = rp_rebuild_start(tr, res->reason, sizeof res->reason);
  if (r == MS_EINVAL) {
    res->verdict = MS_REPLAY_UNREPLAYABLE;
    return MS_OK;
  }
  MS_FORWARD_IF_ERROR(r);
  res->mid_run = tr->segs.len > 0;
  res->start_segments = tr->segs.len;
  res->start_blocks = tr->start_blocks;
  res->inferred = tr->inferred;
  res->ambiguous = tr->ambiguous;
  return MS_OK;
}

static int rp_whatif_config(const rp_trace_t *tr, const char *config, ms_alloc_config_t *out,
                            ms_errbuf_t *eb) {
  *out = tr->cfg;
  if (config && *config) return ms_alloc_config_parse(out, config, eb);
  return MS_OK;
}

int ms_replay_run(const ms_snapshot_t *snap, const ms_replay_options_t *opt,
                  ms_replay_report_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!snap || !out, MS_EINVAL);
  ms_replay_options_t o;
  if (opt) o = *opt;
  else ms_replay_options_init(&o);
  if (o.config && *o.config) {
    ms_alloc_config_t probe;
    ms_alloc_config_init(&probe);
    MS_FORWARD_IF_ERROR(ms_alloc_config_parse(&probe, o.config, eb));
  }
  ms_replay_report_t *rep = calloc(1, sizeof *rep);
  size_t nd = snap->ndevices;
  if (!rep) return MS_ENOMEM;
  rep->devices = calloc(nd ? nd : 1, sizeof *rep->devices);
  if (!rep->devices) {
    free(rep);
    return MS_ENOMEM;
  }
  int r = MS_OK;
  for (size_t d = 0; d < nd && r == MS_OK; d++) {
    if (o.device >= 0 && (size_t)o.device != d) continue;
    ms_replay_device_t *res = &rep->devices[rep->ndevices++];
    rp_trace_t tr;
    r = rp_prepare(snap, d, &tr, res);
    if (r == MS_OK && res->verdict != MS_REPLAY_UNREPLAYABLE) {
      if (!o.whatif) {
        r = rp_run_device(&tr, false, &tr.cfg, o.capacity, res, &res->recorded);
      } else {
        ms_alloc_config_t cfg;
        r = rp_whatif_config(&tr, o.config, &cfg, eb);
        ms_replay_device_t scratch = *res;
        if (r == MS_OK) r = rp_run_device(&tr, false, &tr.cfg, 0, &scratch, &res->recorded);
        if (r == MS_OK) {
          res->verdict = scratch.verdict;
          memcpy(res->reason, scratch.reason, sizeof res->reason);
          res->mismatch_entry = scratch.mismatch_entry;
          memcpy(res->expected, scratch.expected, sizeof res->expected);
          memcpy(res->actual, scratch.actual, sizeof res->actual);
          r = rp_run_device(&tr, true, &cfg, o.capacity, res, &res->replayed);
        }
      }
    }
    rp_trace_release(&tr);
  }
  if (r != MS_OK) {
    ms_replay_report_free(rep);
    return r;
  }
  *out = rep;
  return MS_OK;
}

void ms_replay_report_free(ms_replay_report_t *r) {
  if (!r) return;
  free(r->devices);
  free(r);
}

int ms_replay_min_capacity(const ms_snapshot_t *snap, int device, const char *config,
                           size_t *out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!snap || !out || device < 0 || (size_t)device >= snap->ndevices, MS_EINVAL);
  ms_replay_device_t res;
  memset(&res, 0, sizeof res);
  rp_trace_t tr;
  int r = rp_prepare(snap, (size_t)device, &tr, &res);
  ms_alloc_config_t cfg;
  if (r == MS_OK && res.verdict == MS_REPLAY_UNREPLAYABLE) {
    r = ms__errbuf_set(eb, MS_ENOTFOUND, "device %d: not replayable: %s", device, res.reason);
  }
  if (r == MS_OK) r = rp_whatif_config(&tr, config, &cfg, eb);
  ms_replay_usage_t use;
  if (r == MS_OK) r = rp_run_device(&tr, false, &tr.cfg, 0, &res, &use); /* classifies bursts */
  /* hi: a capacity without OOM, lo: one with an OOM (0 always OOMs when anything is allocated). */
  size_t lo = 0, hi = 0;
  if (r == MS_OK) {
    r = rp_run_device(&tr, true, &cfg, 0, &res, &use);
    hi = ((size_t)use.peak_reserved + RP_PAGE - 1) & ~(size_t)(RP_PAGE - 1);
    if (hi < RP_PAGE) hi = RP_PAGE;
  }
  while (r == MS_OK) {
    r = rp_run_device(&tr, true, &cfg, hi, &res, &use);
    if (r != MS_OK || use.ooms == 0) break;
    lo = hi;
    if (hi >= RP_MIN_CAP_BOUND) {
      r = ms__errbuf_set(eb, MS_ENOTFOUND, "device %d: the replay runs out of memory even with "
                         "%zu bytes", device, hi);
      break;
    }
    hi *= 2;
  }
  while (r == MS_OK && hi - lo > RP_PAGE) {
    size_t mid = lo + ((hi - lo) / 2 & ~(size_t)(RP_PAGE - 1));
    if (mid == lo) mid = lo + RP_PAGE;
    r = rp_run_device(&tr, true, &cfg, mid, &res, &use);
    if (r != MS_OK) break;
    if (use.ooms) lo = mid;
    else hi = mid;
  }
  rp_trace_release(&tr);
  if (r == MS_OK) *out = hi;
  return r;
}
