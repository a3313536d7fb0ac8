/* SPDX-License-Identifier: MIT
 * memsnap core: the recorded run's settings, whether a device's trace can be replayed, and the
 * allocator state when the trace began (docs/replay.md, "Traces that began mid-run",
 * "Preconditions"): the start segments, the blocks live in them, and the sizes of those freed in
 * the trace, inferred (replay/internal.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

/* ---- settings of the recorded run
 * ---------------------------------------------------------------- */

static const ms_snap_kv_t *rp_setting(const ms_snapshot_t *s, const char *key) {
  for (size_t i = 0; i < s->nsettings_top && i < s->nsettings; i++)
    if (s->settings[i].key && strcmp(s->settings[i].key, key) == 0) return &s->settings[i];
  return NULL;
}

/* The configuration the trace was recorded with (docs/replay.md, "`--check`": files without
 * allocator_settings use the defaults). */
void ms__rp_config_of(const ms_snapshot_t *s, ms_alloc_config_t *c) {
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
      while ((1ul << idx) < mib)
        idx++;
      if (idx < MS_ROUNDUP_POWER2_INTERVALS) c->roundup_power2_divisions[idx] = (size_t)e->i;
    }
  }
  ms_alloc_config_t d;
  if (ms_alloc_config_validate(c, NULL) != MS_OK) {
    ms_alloc_config_init(&d);
    *c = d;
  }
}

/* ---- one device's trace: preconditions and the start state (docs/replay.md, "Traces that began
 * mid-run") --------------- */

void ms__rp_trace_release(rp_trace_t *tr) {
  free(tr->burst_kind);
  free(tr->fc_kind);
  for (size_t i = 0; i < tr->segs.len; i++)
    MS_VEC_FREE(&tr->segs.ptr[i].blocks);
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
rp_sseg_t *ms__rp_seg_of(rp_trace_t *tr, uint64_t addr) {
  size_t lo = 0, hi = tr->segs.len;
  while (lo < hi) {
    size_t mid = lo + (hi - lo) / 2;
    if (tr->segs.ptr[mid].addr <= addr)
      lo = mid + 1;
    else
      hi = mid;
  }
  if (!lo) return NULL;
  rp_sseg_t *s = &tr->segs.ptr[lo - 1];
  return addr < s->addr + s->size ? s : NULL;
}

/* Sets *why and returns false when the device's trace cannot be replayed (docs/replay.md,
 * "Preconditions"). */
bool ms__rp_replayable(const rp_trace_t *tr, char *why, size_t cap) {
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
    if ((e->present & MS_TRACE_HAS_POOL_ID) &&
        (ms_snap_trace_pool(e, 0) || ms_snap_trace_pool(e, 1))) {
      snprintf(why, cap,
               "uses private pools (CUDA graphs or MemPool), which replay does not model");
      return false;
    }
  }
  if (tr->n == 0) {
    snprintf(why, cap, "no trace entries (no history was recorded on this device: PyTorch's "
             "torch.cuda.memory._record_memory_history was not on for it)");
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
      snprintf(why, cap,
               "uses private pools (CUDA graphs or MemPool), which replay does not model");
      return false;
    }
    /* the start state is rebuilt from the segments: their blocks must tile them, in order */
    uint64_t at = sg->address;
    for (uint32_t k = 0; k < sg->nblocks; k++) {
      const ms_snap_block_t *bl = &s->blocks[sg->first_block + k];
      if (bl->address != at || bl->size == 0 || bl->size > sg->total_size - (at - sg->address)) {
        snprintf(why, cap,
                 "segment %zu (0x%" PRIx64 ") is inconsistent: its block %" PRIu32
                 " does not follow the one before inside the segment",
                 i, sg->address, k);
        return false;
      }
      at += bl->size;
    }
    if (sg->nblocks && at - sg->address != sg->total_size) {
      snprintf(why, cap,
               "segment %zu (0x%" PRIx64 ") is inconsistent: its blocks cover %" PRIu64
               " of its %" PRIu64 " bytes",
               i, sg->address, at - sg->address, sg->total_size);
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
    ss.is_small =
        (sg->present & MS_SEG_HAS_SEGMENT_TYPE) ? !sg->is_large : sg->total_size <= MS_SMALL_BUFFER;
    if (MS_VEC_PUSH(&tr->segs, ss) != 0) return MS_ENOMEM;
  }
  if (final_expandable || any_expandable_map) {
    /* Replayable only when nothing was mapped before the trace ("Traces that began mid-run"): the
     * mapped bytes at the end must all come from the trace's maps. */
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
      while (j < tr->segs.len && tr->segs.ptr[j].addr != e->addr)
        j++;
      if (j == tr->segs.len) {
        snprintf(why, cap,
                 "entry %zu: segment_alloc at 0x%" PRIx64 " of a segment that is neither "
                 "in the snapshot nor freed later in the trace",
                 tr->first + k, e->addr);
        return MS_EINVAL;
      }
      MS_VEC_FREE(&tr->segs.ptr[j].blocks);
      tr->segs.ptr[j] = tr->segs.ptr[tr->segs.len - 1];
      tr->segs.len--;
    } else if (e->action == MS_TRACE_SEGMENT_FREE) {
      rp_sseg_t ss = {e->addr, e->size, ms_snap_trace_stream(e), e->size <= MS_SMALL_BUFFER,
                      -1,      {0}};
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
        rp_sseg_t *sg = ms__rp_seg_of(tr, e->addr);
        if (!sg) continue; /* checked by the replay itself */
        rp_sblock_t b = {e->addr, 0, e->size, 1, false, (int64_t)i};
        if (MS_VEC_PUSH(&sg->blocks, b) != 0) r = MS_ENOMEM;
        r = r == MS_OK ? rp_map_put(&freed, e->addr, 1) : r;
      }
    } else if (e->action == MS_TRACE_FREE_COMPLETED) {
      if (!rp_map_take(&freed, e->addr, &v)) {
        /* Pending at the start (the ring buffer cut inside a deferred free). */
        rp_sseg_t *sg = ms__rp_seg_of(tr, e->addr);
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
      if (b->state != MS_BLOCK_ACTIVE_ALLOCATED && b->state != MS_BLOCK_ACTIVE_PENDING_FREE)
        continue;
      if (rp_map_has(&live, b->address) || rp_map_has(&freed, b->address)) continue;
      rp_sblock_t sb = {
          b->address, b->size, b->requested_size, b->state == MS_BLOCK_ACTIVE_ALLOCATED ? 1 : 2,
          false,      -1};
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

/* The size of start block k of sg freed in the trace (docs/replay.md, "Traces that began mid-run"):
 * its rounded request in the small pool; in the large pool the gap to the next known block when
 * that gap is a split remainder PyTorch would not keep (<= 1 MiB), else the nearest earlier alloc
 * landing just above it (land: the trace's allocs sorted by address), else the rounded request
 * (ambiguous). *next gets the address of the next known block. */
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
      if (land[mid].addr < lo)
        a = mid + 1;
      else
        z = mid;
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
        snprintf(why, cap,
                 "the block at 0x%" PRIx64 " (%" PRIu64 " B requested) overlaps the next "
                 "known block at 0x%" PRIx64,
                 b->addr, b->requested, next);
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
int ms__rp_rebuild_start(rp_trace_t *tr, char *why, size_t cap) {
  MS_FORWARD_IF_ERROR(rp_start_segments(tr, why, cap));
  if (!tr->segs.len) return MS_OK;
  MS_FORWARD_IF_ERROR(rp_start_blocks(tr));
  return rp_start_sizes(tr, why, cap);
}
