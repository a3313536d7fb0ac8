/* SPDX-License-Identifier: MIT
 * memsnap core: read-only walks over an allocator's state: the invariant checker (model-based
 * tests, MS_DEBUG=3), the counts used by tests, and the snapshot walker that appends segments,
 * blocks, flat statistics and settings to a snapshot builder (docs/pytorch-allocator.md,
 * "Snapshot fields").
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc_internal.h"
#include "alloc/types.h"

/* ---- invariant checker ----------------------------------------------------------------------- */

typedef struct check_acc_s {
  int64_t arr[9][MS_STAT_NUM_TYPES]; /* in MS_STAT_FIELDS order: allocation .. requested_bytes */
  int64_t oversize_alloc, oversize_seg;
} check_acc_t;

enum { C_ALLOCATION, C_SEGMENT, C_ACTIVE, C_INSPLIT, C_ALLOCB, C_RESB, C_ACTB, C_INSPLITB, C_REQB };

static void acc_add(check_acc_t *acc, int which, enum ms_stat_type st, int64_t n) {
  acc->arr[which][MS_STAT_ALL] += n;
  acc->arr[which][st] += n;
}

static bool in_deferred(const ms_allocator_t *a, const ms__block_t *b) {
  for (size_t i = 0; i < a->deferred.len; i++)
    if (a->deferred.ptr[i] == b) return true;
  return false;
}

static bool pool_known(const ms_allocator_t *a, const ms__pool_t *p) {
  if (p == &a->small || p == &a->large) return true;
  for (const ms__private_pool_t *pp = a->pools; pp; pp = pp->next)
    if (p == &pp->small || p == &pp->large) return true;
  return false;
}

#define CHECK(cond, ...)                                   \
  do {                                                     \
    if (!(cond)) return ms__errbuf_set(eb, MS_ESTATE, __VA_ARGS__); \
  } while (0)

/* Counts of the walk over the segments (ms__allocator_check_locked). */
typedef struct check_counts_s {
  size_t nalloc, in_sets, events, total;
} check_counts_t;

/* One segment: its blocks tile it, each block's state is consistent, and what it holds is added
 * to the recomputed statistics (acc) and counts (n). */
static int check_segment(ms_allocator_t *a, const ms__segment_t *s, check_acc_t *acc,
                         check_counts_t *n, ms_errbuf_t *eb) {
  size_t mss = a->cfg.max_split_size;
  CHECK(pool_known(a, s->pool), "segment 0x%zx: unknown pool", (size_t)s->ptr);
  CHECK(s->head && !s->head->prev, "segment 0x%zx: bad head", (size_t)s->ptr);
  enum ms_stat_type st = s->pool->is_small ? MS_STAT_SMALL_POOL : MS_STAT_LARGE_POOL;
  if (s->expandable) { /* expandable segments: mapped bytes only, never a `segment` */
    acc_add(acc, C_RESB, st, (int64_t)s->mapped);
    n->total += s->mapped;
  } else {
    acc_add(acc, C_SEGMENT, st, 1);
    acc_add(acc, C_RESB, st, (int64_t)s->size);
    if (s->size >= mss) acc->oversize_seg++;
    n->total += s->size;
  }
  uintptr_t expect = s->ptr;
  size_t sum = 0;
  bool split = s->head->next != NULL && !s->expandable;
  size_t mapped = 0;
  for (const ms__block_t *b = s->head; b; b = b->next) {
    CHECK(b->seg == s && b->stream == s->stream && b->pool == s->pool &&
              b->expandable == s->expandable,
          "block 0x%zx: segment/stream/pool/expandable mismatch", (size_t)b->ptr);
    CHECK(b->ptr == expect, "segment 0x%zx: block at 0x%zx, expected 0x%zx (blocks must tile)",
          (size_t)s->ptr, (size_t)b->ptr, (size_t)expect);
    CHECK(b->size > 0 && b->size % MS_MIN_BLOCK_SIZE == 0, "block 0x%zx: size %zu",
          (size_t)b->ptr, b->size);
    CHECK(!b->next || b->next->prev == b, "block 0x%zx: broken links", (size_t)b->ptr);
    expect += b->size;
    sum += b->size;
    n->events += (size_t)b->event_count;
    if (!b->mapped) { /* an unmapped range of an expandable segment */
      CHECK(s->expandable && !b->allocated && !b->in_set && b->event_count == 0,
            "block 0x%zx: unmapped but used", (size_t)b->ptr);
      CHECK(!b->next || b->next->mapped, "blocks 0x%zx and 0x%zx: unmapped neighbours not merged",
            (size_t)b->ptr, (size_t)b->next->ptr);
      continue;
    }
    mapped += b->size;
    if (b->allocated) {
      size_t slot;
      (void)slot;
      n->nalloc++;
      CHECK(!b->in_set && b->event_count == 0, "block 0x%zx: allocated and cached",
            (size_t)b->ptr);
      /* the pointer map must find exactly this block */
      bool found = false;
      if (a->map.cap) {
        size_t j = (size_t)(((uint64_t)b->ptr >> 9) * 0x9E3779B97F4A7C15ULL >> 20) &
                   (a->map.cap - 1);
        for (; a->map.slots[j]; j = (j + 1) & (a->map.cap - 1))
          if (a->map.slots[j] == b) found = true;
      }
      CHECK(found, "block 0x%zx: allocated but not in the pointer map", (size_t)b->ptr);
      acc_add(acc, C_ALLOCATION, st, 1);
      acc_add(acc, C_ALLOCB, st, (int64_t)b->size);
      acc_add(acc, C_ACTIVE, st, 1);
      acc_add(acc, C_ACTB, st, (int64_t)b->size);
      acc_add(acc, C_REQB, st, (int64_t)b->requested_size);
      if (b->size >= mss) acc->oversize_alloc++;
    } else if (b->in_set) {
      n->in_sets++;
      CHECK(b->event_count == 0 && b->nuses == 0, "block 0x%zx: cached with pending uses",
            (size_t)b->ptr);
      CHECK(!b->next || !b->next->in_set,
            "blocks 0x%zx and 0x%zx: free neighbours not merged", (size_t)b->ptr,
            (size_t)b->next->ptr);
      if (split) {
        acc_add(acc, C_INSPLIT, st, 1);
        acc_add(acc, C_INSPLITB, st, (int64_t)b->size);
      }
    } else {
      CHECK(b->event_count > 0 || (b->nuses > 0 && in_deferred(a, b)),
            "block 0x%zx: neither allocated, cached nor pending", (size_t)b->ptr);
      acc_add(acc, C_ACTIVE, st, 1);
      acc_add(acc, C_ACTB, st, (int64_t)b->size);
      acc_add(acc, C_REQB, st, (int64_t)b->requested_size);
    }
  }
  CHECK(sum == s->size, "segment 0x%zx: blocks sum to %zu of %zu", (size_t)s->ptr, sum, s->size);
  CHECK(!s->expandable || mapped == s->mapped, "expandable segment 0x%zx: %zu bytes in mapped "
        "blocks, %zu mapped", (size_t)s->ptr, mapped, s->mapped);
  return MS_OK;
}

/* The statistics equal those recomputed from the segments (acc). */
static int check_stats(const ms_allocator_t *a, const check_acc_t *acc, ms_errbuf_t *eb) {
  const ms_stat_t *arrs[9] = {a->stats.allocation,     a->stats.segment,
                              a->stats.active,         a->stats.inactive_split,
                              a->stats.allocated_bytes, a->stats.reserved_bytes,
                              a->stats.active_bytes,   a->stats.inactive_split_bytes,
                              a->stats.requested_bytes};
  static const char *const names[9] = {"allocation",      "segment",        "active",
                                       "inactive_split",  "allocated_bytes", "reserved_bytes",
                                       "active_bytes",    "inactive_split_bytes",
                                       "requested_bytes"};
  static const char *const types[3] = {"all", "small_pool", "large_pool"};
  for (int k = 0; k < 9; k++)
    for (int t = 0; t < MS_STAT_NUM_TYPES; t++) {
      CHECK(arrs[k][t].current == acc->arr[k][t], "%s.%s.current is %lld, recomputed %lld",
            names[k], types[t], (long long)arrs[k][t].current, (long long)acc->arr[k][t]);
      CHECK(arrs[k][t].peak >= arrs[k][t].current, "%s.%s.peak below current", names[k],
            types[t]);
    }
  CHECK(a->stats.oversize_allocations.current == acc->oversize_alloc,
        "oversize_allocations.current is %lld, recomputed %lld",
        (long long)a->stats.oversize_allocations.current, (long long)acc->oversize_alloc);
  CHECK(a->stats.oversize_segments.current == acc->oversize_seg,
        "oversize_segments.current is %lld, recomputed %lld",
        (long long)a->stats.oversize_segments.current, (long long)acc->oversize_seg);
  return MS_OK;
}


int ms__allocator_check_locked(ms_allocator_t *a, ms_errbuf_t *eb) {
  check_acc_t acc;
  memset(&acc, 0, sizeof acc);
  check_counts_t n = {0, 0, 0, 0};
  size_t nseg = 0;
  for (const ms__segment_t *s = a->segments; s; s = s->snext, nseg++)
    MS_FORWARD_IF_ERROR(check_segment(a, s, &acc, &n, eb));
  size_t nalloc = n.nalloc, in_sets = n.in_sets, events = n.events, total = n.total;
  CHECK(nseg == a->nsegments, "segment list has %zu entries, count says %zu", nseg, a->nsegments);
  CHECK(nalloc == a->map.len, "%zu allocated blocks, pointer map holds %zu", nalloc, a->map.len);
  CHECK(events == a->outstanding_events, "%zu events on blocks, %zu outstanding", events,
        a->outstanding_events);
  CHECK(total == a->total_allocated_memory, "segments total %zu, total_allocated_memory %zu",
        total, a->total_allocated_memory);
  size_t set_total = 0;
  const ms__pool_t *def[2] = {&a->small, &a->large};
  for (int i = 0; i < 2; i++) {
    CHECK(ms__pool_is_valid(def[i]), "default %s pool: free set corrupt",
          def[i]->is_small ? "small" : "large");
    set_total += def[i]->nblocks;
  }
  for (const ms__private_pool_t *pp = a->pools; pp; pp = pp->next) {
    CHECK(ms__pool_is_valid(&pp->small) && ms__pool_is_valid(&pp->large),
          "private pool (%lld,%lld): free set corrupt", (long long)pp->id.first,
          (long long)pp->id.second);
    set_total += pp->small.nblocks + pp->large.nblocks;
  }
  CHECK(set_total == in_sets, "free sets hold %zu blocks, segments have %zu cached", set_total,
        in_sets);
  return check_stats(a, &acc, eb);
}

int ms__allocator_check(ms_allocator_t *a, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  pthread_mutex_lock(&a->mu);
  int r = ms__allocator_check_locked(a, eb);
  pthread_mutex_unlock(&a->mu);
  return r;
}

void ms__allocator_counts(ms_allocator_t *a, ms__alloc_counts_t *out) {
  memset(out, 0, sizeof *out);
  pthread_mutex_lock(&a->mu);
  for (const ms__segment_t *s = a->segments; s; s = s->snext) {
    out->segments++;
    for (const ms__block_t *b = s->head; b; b = b->next) {
      if (!b->mapped) continue; /* unmapped range of an expandable segment */
      out->blocks++;
      if (b->in_set) out->free_blocks++;
      else if (!b->allocated) out->pending_blocks++;
    }
  }
  out->outstanding_events = a->outstanding_events;
  for (const ms__private_pool_t *pp = a->pools; pp; pp = pp->next) out->private_pools++;
  pthread_mutex_unlock(&a->mu);
}

/* ---- snapshot walker ------------------------------------------------------------------------ */

static int cmp_seg(const void *x, const void *y) {
  const ms__segment_t *a = *(const ms__segment_t *const *)x, *b = *(const ms__segment_t *const *)y;
  return a->ptr < b->ptr ? -1 : a->ptr > b->ptr;
}

static int snap_stack(ms__ctx_to_stack_fn *fn, void *arg, uint32_t ctx, uint32_t *out) {
  *out = MS_SNAP_NO_STACK;
  if (!fn || !ctx) return MS_OK;
  return fn(arg, ctx, out);
}

/* Appends the record of block bl ("Snapshot fields": state, sizes, the allocation's stack when
 * active) and adds it to its segment record's allocated/active/requested sizes and block count.
 * The caller owns total_size (a cudaMalloc segment's size, or the sum of an expandable range's
 * blocks). */
static int snapshot_block(ms__snapbuild_t *b, ms__ctx_to_stack_fn *fn, void *arg,
                          const ms__block_t *bl, const char *const state_names[3],
                          ms_snap_segment_t *ss) {
  static const ms_block_state states[3] = {MS_BLOCK_INACTIVE, MS_BLOCK_ACTIVE_ALLOCATED,
                                           MS_BLOCK_ACTIVE_PENDING_FREE};
  ms_snap_block_t sb;
  memset(&sb, 0, sizeof sb);
  sb.address = bl->ptr;
  sb.size = bl->size;
  sb.requested_size = bl->requested_size;
  int k = bl->allocated ? 1 : bl->in_set ? 0 : 2;
  sb.state = states[k];
  sb.state_name = state_names[k];
  sb.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  MS_FORWARD_IF_ERROR(snap_stack(fn, arg, k ? bl->ctx : 0, &sb.stack));
  if (k == 1) ss->allocated_size += bl->size;
  if (k != 0) {
    ss->active_size += bl->size;
    ss->requested_size += bl->requested_size;
  }
  ss->nblocks++;
  return ms__snapbuild_add_block(b, &sb);
}

/* The mapped ranges of an expandable segment, each as a segment record (is_expandable). */
static int snapshot_expandable(ms_allocator_t *a, ms__snapbuild_t *b, ms__ctx_to_stack_fn *fn,
                               void *arg, const ms__segment_t *s, const char *state_names[3],
                               uint64_t *total_active) {
  int r = MS_OK;
  const ms__block_t *bl = s->head;
  while (bl && r == MS_OK) {
    if (!bl->mapped) {
      bl = bl->next;
      continue;
    }
    ms_snap_segment_t ss;
    memset(&ss, 0, sizeof ss);
    ss.device = a->device;
    ss.address = bl->ptr;
    ss.stream = s->stream;
    ss.is_large = !s->pool->is_small;
    ss.is_expandable = true;
    ss.pool_id[0] = s->pool->owner ? s->pool->owner->id.first : 0; /* private pools map too */
    ss.pool_id[1] = s->pool->owner ? s->pool->owner->id.second : 0;
    ss.first_block = (uint32_t)b->blocks.len;
    ss.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE |
                 MS_SEG_HAS_REQUESTED_SIZE | MS_SEG_HAS_SEGMENT_TYPE;
    r = snap_stack(fn, arg, bl == s->head ? s->ctx : 0, &ss.stack);
    for (; bl && bl->mapped && r == MS_OK; bl = bl->next) {
      ss.total_size += bl->size;
      r = snapshot_block(b, fn, arg, bl, state_names, &ss);
    }
    *total_active += ss.active_size;
    if (r == MS_OK) r = ms__snapbuild_add_segment(b, &ss);
  }
  return r;
}

static int snapshot_locked(ms_allocator_t *a, ms__snapbuild_t *b, ms__ctx_to_stack_fn *fn,
                           void *arg, ms__alloc_snapinfo_t *info) {
  ms__segment_t **segs = malloc((a->nsegments ? a->nsegments : 1) * sizeof *segs);
  MS_RETURN_IF(!segs, MS_ENOMEM);
  size_t n = 0;
  for (ms__segment_t *s = a->segments; s; s = s->snext) segs[n++] = s;
  qsort(segs, n, sizeof *segs, cmp_seg);
  int r = MS_OK;
  uint64_t total_active = 0;
  const char *state_names[3];
  static const ms_block_state states[3] = {MS_BLOCK_INACTIVE, MS_BLOCK_ACTIVE_ALLOCATED,
                                           MS_BLOCK_ACTIVE_PENDING_FREE};
  for (int i = 0; i < 3 && r == MS_OK; i++) {
    const char *nm = ms_block_state_name(states[i]);
    r = ms__snapbuild_str(b, nm, strlen(nm), &state_names[i]);
  }
  for (size_t i = 0; i < n && r == MS_OK; i++) {
    const ms__segment_t *s = segs[i];
    if (s->expandable) { /* one record per contiguous mapped range ("Snapshot fields") */
      r = snapshot_expandable(a, b, fn, arg, s, state_names, &total_active);
      continue;
    }
    ms_snap_segment_t ss;
    memset(&ss, 0, sizeof ss);
    ss.device = a->device;
    ss.address = s->ptr;
    ss.total_size = s->size;
    ss.stream = s->stream;
    ss.is_large = !s->pool->is_small;
    ss.is_expandable = false;
    ss.pool_id[0] = s->pool->owner ? s->pool->owner->id.first : 0;
    ss.pool_id[1] = s->pool->owner ? s->pool->owner->id.second : 0;
    ss.first_block = (uint32_t)b->blocks.len;
    ss.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE |
                 MS_SEG_HAS_REQUESTED_SIZE | MS_SEG_HAS_SEGMENT_TYPE;
    r = snap_stack(fn, arg, s->ctx, &ss.stack);
    for (const ms__block_t *bl = s->head; bl && r == MS_OK; bl = bl->next) {
      r = snapshot_block(b, fn, arg, bl, state_names, &ss);
    }
    total_active += ss.active_size;
    if (r == MS_OK) r = ms__snapbuild_add_segment(b, &ss);
  }
  free(segs);
  MS_FORWARD_IF_ERROR(r);
  ms_stat_kv_t kv[MS_STATS_NKEYS];
  size_t nkv = 0;
  MS_FORWARD_IF_ERROR(ms_stats_flat(&a->stats, kv, MS_STATS_NKEYS, &nkv));
  uint32_t first_stat = (uint32_t)b->stats.len;
  for (size_t i = 0; i < nkv; i++) {
    ms_snap_kv_t e;
    memset(&e, 0, sizeof e);
    MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, kv[i].name, strlen(kv[i].name), &e.key));
    e.kind = MS_SNAP_VAL_INT;
    e.i = kv[i].value;
    MS_FORWARD_IF_ERROR(ms__snapbuild_add_stat(b, &e));
  }
  /* PyTorch records the snapshot entry with device 0 and no context ("Trace entries"). */
  const ms__alloc_hooks_t *h = atomic_load_explicit(&a->hooks, memory_order_acquire);
  if (h && h->trace && ms__hooks_trace_enabled(h)) {
    ms__trace_rec_t rec = {MS_TRACE_SNAPSHOT, 0, total_active, 0, {0, 0}, 0};
    h->trace(h->ctx, &rec);
  }
  if (info) {
    /* the device's size now (a backend's capacity can change after the allocator was made:
     * an OOM snapshot must record the one the OOM met), as raise_oom asks for it */
    size_t dfree = 0, dtotal = a->device_total;
    if (a->ops.mem_info(a->ops.ctx, a->device, &dfree, &dtotal) != MS_OK) dtotal = a->device_total;
    info->device = a->device;
    info->capacity = dtotal;
    info->first_stat = first_stat;
    info->nstats = (uint32_t)nkv;
  }
  return MS_OK;
}

int ms__allocator_snapshot(ms_allocator_t *a, ms__snapbuild_t *b, ms__ctx_to_stack_fn *fn,
                           void *arg, ms__alloc_snapinfo_t *info) {
  pthread_mutex_lock(&a->mu);
  int r = snapshot_locked(a, b, fn, arg, info);
  pthread_mutex_unlock(&a->mu);
  return r;
}

static int add_setting(ms__snapbuild_t *b, const char *key, ms_snap_value_kind kind, bool bv,
                       int64_t iv, double fv, const char *sv) {
  ms_snap_kv_t e;
  memset(&e, 0, sizeof e);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, key, strlen(key), &e.key));
  e.kind = kind;
  e.b = bv;
  e.i = iv;
  e.f = fv;
  if (kind == MS_SNAP_VAL_STR) MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, sv, strlen(sv), &e.s));
  return ms__snapbuild_add_setting(b, &e);
}

int ms__allocator_snapshot_settings(ms_allocator_t *a, ms__snapbuild_t *b) {
  ms_alloc_config_t c;
  pthread_mutex_lock(&a->mu); /* a copy, as ms_allocator_get_config makes (no call back up) */
  c = a->cfg;
  pthread_mutex_unlock(&a->mu);
  MS_FORWARD_IF_ERROR(add_setting(b, "PYTORCH_CUDA_ALLOC_CONF", MS_SNAP_VAL_STR, false, 0, 0,
                                  c.last_allocator_settings));
  MS_FORWARD_IF_ERROR(add_setting(b, "max_split_size", MS_SNAP_VAL_INT, false,
                                  (int64_t)c.max_split_size, 0, NULL));
  MS_FORWARD_IF_ERROR(add_setting(b, "garbage_collection_threshold", MS_SNAP_VAL_FLOAT, false, 0,
                                  c.garbage_collection_threshold, NULL));
  MS_FORWARD_IF_ERROR(add_setting(b, "expandable_segments", MS_SNAP_VAL_BOOL,
                                  c.expandable_segments, 0, 0, NULL));
  MS_FORWARD_IF_ERROR(add_setting(b, "pinned_num_register_threads", MS_SNAP_VAL_INT, false,
                                  (int64_t)c.pinned_num_register_threads, 0, NULL));
  MS_FORWARD_IF_ERROR(add_setting(b, "release_lock_on_cudamalloc", MS_SNAP_VAL_BOOL,
                                  c.release_lock_on_cudamalloc, 0, 0, NULL));
  MS_FORWARD_IF_ERROR(add_setting(b, "pinned_use_cuda_host_register", MS_SNAP_VAL_BOOL,
                                  c.pinned_use_cuda_host_register, 0, 0, NULL));
  MS_FORWARD_IF_ERROR(add_setting(b, "graph_capture_record_stream_reuse", MS_SNAP_VAL_BOOL,
                                  c.graph_capture_record_stream_reuse, 0, 0, NULL));
  uint32_t first = 0;
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++) {
    char key[16];
    snprintf(key, sizeof key, "%d", 1 << i);
    ms_snap_kv_t e;
    memset(&e, 0, sizeof e);
    MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, key, strlen(key), &e.key));
    e.kind = MS_SNAP_VAL_INT;
    e.i = (int64_t)c.roundup_power2_divisions[i];
    uint32_t idx;
    MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting_child(b, &e, &idx));
    if (i == 0) first = idx;
  }
  ms_snap_kv_t m;
  memset(&m, 0, sizeof m);
  MS_FORWARD_IF_ERROR(ms__snapbuild_str(b, "roundup_power2_divisions", 24, &m.key));
  m.kind = MS_SNAP_VAL_MAP;
  m.first = first;
  m.count = MS_ROUNDUP_POWER2_INTERVALS;
  return ms__snapbuild_add_setting(b, &m);
}
