/* SPDX-License-Identifier: MIT
 * memsnap core: `memsnap replay`, driving the allocator from a recorded trace
 * (include/memsnap/replay.h; the method and its limits are in docs/replay.md).
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

#include "replay/internal.h"

/* A pending block's handle: its event and that record's generation (rdev_t). The streams of
 * deferred frees are synthetic. */
#define RP_HANDLE(ev, gen) (((uint64_t)(gen) << 32) | (uint64_t)(ev))
#define RP_SYNTH_STREAM ((uint64_t)0xe5 << 56)

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
  rp_map_t pending;      /* recorded address -> pending handle (RP_HANDLE) */
  uint64_t next_stream;  /* synthetic streams of deferred frees */
  MS_VEC(size_t) late;   /* free_completed entries left to the next operation's synchronization */
  bool force_sync;       /* check: late holds an RP_FC_SYNC_FORCED entry */
  bool dirty;            /* events completed that the allocator has not processed yet */
  ms_replay_device_t *res;
  ms_replay_usage_t *use;
  bool stop;
  bool fit_only; /* what-if: only whether the run fits, so the first OOM ends it */
  uint64_t held; /* what-if: the most allocated right after an oom entry's request was served */
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
  rp_sseg_t *sg = ms__rp_seg_of(tr, addr);
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

/* The peaks after entry idx (device-local; -1 = the start state): each first reached there. */
static void rp_track_peak(rp_run_t *run, int64_t idx) {
  size_t res, alc, req;
  ms__allocator_replay_usage(run->a, &res, &alc, &req);
  ms_replay_usage_t *u = run->use;
  if (res > u->peak_reserved || u->peak_reserved_index == -2) {
    u->peak_reserved = res;
    u->peak_reserved_index = idx;
    u->unallocated_at_peak_reserved = res - (alc < res ? alc : res);
  }
  if (alc > u->peak_allocated || u->peak_allocated_index == -2) {
    u->peak_allocated = alc;
    u->peak_allocated_index = idx;
  }
  if (req > u->peak_requested || u->peak_requested_index == -2) {
    u->peak_requested = req;
    u->peak_requested_index = idx;
  }
}

/* With no capacity and no recorded total, the device the message describes has no size: say so
 * instead of the recorded device's stand-in total. */
static void rp_unlimited_message(char *msg, size_t cap) {
  char *a = strstr(msg, " has a total capacity of ");
  char *b = a ? strstr(a, " is free. ") : NULL;
  if (!b) return;
  b += strlen(" is free. ");
  static const char unl[] = " has unlimited capacity (the recorded run failed here). ";
  size_t tail = strlen(b) + 1, at = (size_t)(a - msg);
  if (at + sizeof unl - 1 + tail > cap) return;
  memmove(a + sizeof unl - 1, b, tail);
  memcpy(a, unl, sizeof unl - 1);
}

/* The first OOM: its entry (the index in the device's own trace) and the allocator's message. */
static void rp_note_oom(rp_run_t *run, size_t i, uint64_t size) {
  ms_replay_usage_t *u = run->use;
  if (u->first_oom_index >= 0) return;
  u->first_oom_index = (int64_t)i;
  u->first_oom_size = size;
  ms_allocator_last_oom_message(run->a, u->oom_message, sizeof u->oom_message);
  if (!run->capacity && !run->tr->device_total)
    rp_unlimited_message(u->oom_message, sizeof u->oom_message);
  if (run->whatif && run->fit_only) run->stop = true;
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
  d->need_sync = !run->whatif && !run->capacity && run->force_sync;
  d->synced = false;
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
  run->rdev->need_sync = false;
  run->rdev->expect.len = 0;
  run->rdev->va_bases.len = 0;
}

/* process_events now, when events completed since the allocator last looked: the state a dry run
 * (rp_split_burst, rp_fc_classify) or the final comparison sees is the one after them. */
static void rp_process(rp_run_t *run) {
  if (!run->dirty) return;
  run->dirty = false;
  if (ms__allocator_replay_process_events(run->a) != MS_OK) run->stop = true;
}

/* Whether two entries were recorded with the same stack: 1 yes, 0 no, -1 unknown (one has none). */
static int rp_same_stack(const ms_snapshot_t *s, uint32_t a, uint32_t b) {
  if (a == MS_SNAP_NO_STACK || b == MS_SNAP_NO_STACK || a >= s->nstacks || b >= s->nstacks)
    return -1;
  if (a == b) return 1;
  uint32_t n = ms_snap_stack_depth(s, a);
  if (n != ms_snap_stack_depth(s, b)) return 0;
  for (uint32_t f = 0; f < n; f++) {
    const ms_snap_frame_t *x = ms_snap_stack_frame(s, a, f), *y = ms_snap_stack_frame(s, b, f);
    if (x->line != y->line || strcmp(x->name ? x->name : "", y->name ? y->name : "") ||
        strcmp(x->filename ? x->filename : "", y->filename ? y->filename : ""))
      return 0;
  }
  return 1;
}

/* Whether the burst in pend was made by empty_cache (its stack says so) rather than by the OOM
 * path (docs/replay.md, "`--check`"). */
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

/* Whether the device, when its total is recorded (memsnap's snapshots), could not have given
 * the new segment or map that follows the burst in pend[nfree] without the burst: the OOM path
 * starts only when the device refuses. Without a recorded total, assumed so. The allocator is
 * taken to be the device's only user (exact on the simulated device). */
static bool rp_device_was_full(const rp_run_t *run, size_t nfree) {
  const rp_trace_t *tr = run->tr;
  if (!tr->device_total || !run->rdev || nfree >= run->pend.len) return true;
  uint64_t need = tr->t[run->pend.ptr[nfree]].size, used = run->rdev->used;
  return need > tr->device_total || used > tr->device_total - need;
}

static void rp_op_flush(rp_run_t *run);
static uint8_t rp_fc_kind(rp_run_t *run, size_t i);

static bool rp_is_release(ms_trace_action a) {
  return a == MS_TRACE_SEGMENT_FREE || a == MS_TRACE_SEGMENT_UNMAP;
}

/* The end of the run of free_completed entries that starts at i, and whether a release, new
 * segment, map or oom follows it (then a malloc's OOM path may have completed the run). */
static size_t rp_fc_run_end(const rp_trace_t *tr, size_t i, bool *oom_path) {
  while (i < tr->n && tr->t[i].action == MS_TRACE_FREE_COMPLETED)
    i++;
  ms_trace_action nx = i < tr->n ? tr->t[i].action : MS_TRACE_ALLOC;
  *oom_path = rp_is_release(nx) || nx == MS_TRACE_SEGMENT_ALLOC || nx == MS_TRACE_SEGMENT_MAP ||
              nx == MS_TRACE_OOM;
  return i;
}

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
                                                           (ms_stream_t)ms_snap_trace_stream(e)));
    /* The burst's stack names empty_cache, or differs from the allocation's (the OOM path's
     * releases are recorded with the allocation's stack). */
    if (caused && (rp_burst_is_empty_cache(run) ||
                   rp_same_stack(run->tr->snap, run->tr->t[run->pend.ptr[0]].stack, e->stack) == 0))
      caused = false;
    if (caused && !oom_entry && !rp_device_was_full(run, nfree)) caused = false;
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
  rp_process(run);
  rp_split_burst(run, i, oom_entry);
  if (run->stop) return;
  rp_arm(run, oom_entry);
  if (run->whatif) {
    /* A new segment the what-if asks for where and as the recorded run did gets the recorded
     * address (tie-breaks then match); the rest of pend belongs to the OOM path: the allocator
     * predicts its own, the device never fails on purpose. */
    run->rdev->fail = RDEV_FAIL_NONE;
    run->pend.len = 0;
  }
  run->got.len = 0;
  ms_devptr_t ptr = 0;
  int r =
      size ? ms_allocator_malloc(run->a, size, (ms_stream_t)ms_snap_trace_stream(e), &ptr) : MS_OK;
  rp_disarm(run);
  if (run->whatif) {
    if (r == MS_EOOM) {
      rp_note_oom(run, i, size);
    } else if (r != MS_OK) {
      run->stop = true;
    } else if (oom_entry) {
      /* The recorded run failed here; under this configuration it did not. The program did not
       * get the memory in the recorded run, so it is released at once (held while it was: a
       * device without this OOM holds at least that much then). */
      size_t res_now, alc_now, req_now;
      ms__allocator_replay_usage(run->a, &res_now, &alc_now, &req_now);
      if (alc_now > run->held) run->held = alc_now;
      (void)ms_allocator_free(run->a, ptr);
    } else if (ptr && rp_map_put(&run->live, e->addr, ptr) != MS_OK) {
      run->stop = true;
    }
    if (r == MS_OK) rp_track_peak(run, (int64_t)i);
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
  rp_track_peak(run, (int64_t)i);
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

/* A record_stream-deferred free of the block at ptr (recorded address addr): a stream of its own
 * uses the block (no head-of-line blocking between deferred frees); the free records an event on
 * it, complete at the recorded free_completed or when the allocator synchronizes (its OOM path,
 * empty_cache), as the program's stream work would be. */
static int rp_defer(rp_run_t *run, uint64_t ptr, uint64_t addr) {
  ms_stream_t use = (ms_stream_t)(RP_SYNTH_STREAM + run->next_stream++);
  run->rdev->last_event = 0;
  MS_FORWARD_IF_ERROR(ms_allocator_record_stream(run->a, (ms_devptr_t)ptr, use));
  MS_FORWARD_IF_ERROR(ms_allocator_free(run->a, (ms_devptr_t)ptr));
  if (!run->rdev->last_event || run->rdev->last_event >> 32 || run->rdev->last_gen >> 31)
    return MS_ENOMEM; /* no event recorded, or handles beyond what RP_HANDLE holds */
  return rp_map_put(&run->pending, addr, RP_HANDLE(run->rdev->last_event, run->rdev->last_gen));
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
  /* Freed at once (no record_stream) when its free_completed follows and was not a
   * synchronization's (then it waited on an event until the next operation synchronized). Where
   * an OOM path may follow, the check replay defers it first: the classification of that
   * free_completed sees it pending. */
  bool next = i + 1 < tr->n && tr->t[i + 1].action == MS_TRACE_FREE_COMPLETED &&
              tr->t[i + 1].addr == e->addr;
  bool oom_path = true;
  if (next && !run->whatif && !tr->fc_kind[i + 1]) (void)rp_fc_run_end(tr, i + 1, &oom_path);
  bool now = next && (run->whatif || tr->fc_kind[i + 1] || !oom_path) &&
             rp_fc_kind(run, i + 1) == RP_FC_NOW;
  if (now) {
    if (ms_allocator_free(run->a, (ms_devptr_t)ptr) != MS_OK) run->stop = true;
    *ip = i + 1;
    return;
  }
  if (rp_defer(run, ptr, e->addr) != MS_OK) run->stop = true;
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
  /* The event completes (unless the allocator synchronized it and has recorded it again since);
   * the allocator frees the block at its next query. */
  uint64_t ev = h & 0xffffffffu, gen = h >> 32;
  size_t slot;
  if (!rp_map_find(&run->rdev->gen, ev, &slot) || run->rdev->gen.v[slot] != gen) return;
  if (rp_map_put(&run->rdev->done, ev, 1) != MS_OK) run->stop = true;
  run->dirty = true;
}

/* Whether free_completed entry i may have been emitted by a synchronization (the OOM path's or
 * empty_cache's release_cached_blocks): free_completed entries, then a segment_free/unmap, or
 * the allocation's new segment, map or `oom` (the release freed nothing). Left to the end of
 * that operation, a completion the allocation's own process_events made changes nothing: the
 * cache could not serve the request with the block, so it cannot without it. */
static bool rp_sync_emitted(const rp_trace_t *tr, size_t i) {
  size_t j = i + 1;
  while (j < tr->n && tr->t[j].action == MS_TRACE_FREE_COMPLETED)
    j++;
  if (j >= tr->n) return false;
  switch (tr->t[j].action) {
  case MS_TRACE_SEGMENT_FREE:
  case MS_TRACE_SEGMENT_UNMAP:
  case MS_TRACE_SEGMENT_ALLOC:
  case MS_TRACE_SEGMENT_MAP:
  case MS_TRACE_OOM: return true;
  default: return false;
  }
}


/* Whether the recorded device, when its total is known, refused a new segment or map of need
 * bytes beside what the replay holds now (rp_device_was_full's test). */
static bool rp_device_refused(const rp_run_t *run, uint64_t need) {
  uint64_t total = run->tr->device_total, used = run->rdev->used;
  return need > total || used > total - need;
}

/* The segments release_cached_blocks would release once the pending blocks of the
 * free_completed entries [i, i1) were complete. */
static size_t rp_cached_after(rp_run_t *run, size_t i, size_t i1) {
  MS_VEC(uint64_t) ev = {0};
  for (size_t k = i; k < i1; k++) {
    size_t slot;
    if (rp_map_find(&run->pending, run->tr->t[k].addr, &slot) &&
        MS_VEC_PUSH(&ev, run->pending.v[slot] & 0xffffffffu) != 0)
      break;
  }
  size_t n = ms__allocator_replay_cached_after(run->a, ev.ptr, ev.len);
  MS_VEC_FREE(&ev);
  return n;
}

/* Whether the releases [i1, j) before the malloc at entry m (the cache could not serve it, the
 * device refused) began with release_available_cached_blocks's, made before any synchronization:
 * it would release a block now, with every pending block still pending (then the synchronization
 * that frees them cannot have come first), the number of releases is not that of the segments
 * cached once the completions [i, i1) are done (release_cached_blocks releases every one), or the
 * releases begin as only it releases: oversize
 * segments of the malloc's stream, the largest first (release_cached_blocks goes through the
 * pools in (stream, size, address) order, up). A single oversize release of the malloc's stream
 * that the completions made possible fits both: it is taken for release_available_cached_blocks's
 * when the one completion is that of the block freed just before (just_freed: a free with no
 * record_stream completes at once, the common case), else for the synchronization's. */
static bool rp_released_first(rp_run_t *run, size_t i, size_t i1, size_t j, size_t m,
                              bool just_freed) {
  const ms_snap_trace_t *t = run->tr->t;
  uint64_t mss = run->tr->cfg.max_split_size;
  if (ms__allocator_replay_would_release(run->a, (size_t)t[m].size,
                                         (ms_stream_t)ms_snap_trace_stream(&t[m])))
    return true;
  if (rp_cached_after(run, i, i1) != j - i1)
    return true; /* release_cached_blocks would have released another number of segments */
  const ms_snap_trace_t *x = &t[i1], *y = &t[i1 + 1];
  if (j - i1 < 2)
    return just_freed && ms_snap_trace_stream(x) == ms_snap_trace_stream(&t[m]) && x->size >= mss;
  return ms_snap_trace_stream(x) == ms_snap_trace_stream(&t[m]) &&
         ms_snap_trace_stream(y) == ms_snap_trace_stream(&t[m]) && y->size >= mss &&
         x->size > y->size;
}

/* Check mode: where the recorded run completed the run of free_completed entries that starts at
 * i (fc_kind). A malloc completes pending frees at two points: process_events, its first step,
 * completes those whose work is done; on its OOM path, release_cached_blocks synchronizes and
 * completes every pending one, after release_available_cached_blocks may have released oversize
 * blocks and before it releases every cached segment. So a run followed by the malloc's releases,
 * new segment or oom is the synchronization's when it follows a release of that malloc; it is
 * process_events's when some pending block is left out of it (a synchronization completes them
 * all), when a second run follows the releases, when the device had room for the new segment, or
 * when release_available_cached_blocks made the releases (rp_released_first). The entries
 * [i - before, i) of the run were completed by their frees (they are still pending here). */
static void rp_fc_classify(rp_run_t *run, size_t i, size_t before) {
  rp_trace_t *tr = run->tr;
  const ms_snap_trace_t *t = tr->t;
  size_t n = tr->n;
  bool oom_path;
  size_t i1 = rp_fc_run_end(tr, i, &oom_path);
  uint8_t kind = RP_FC_NOW;
  ms_trace_action nx = i1 < n ? t[i1].action : MS_TRACE_ALLOC;
  if (oom_path) {
    size_t j = i1, m;
    while (j < n && rp_is_release(t[j].action))
      j++;
    for (m = j; m < n && (t[m].action == MS_TRACE_SEGMENT_ALLOC ||
                          t[m].action == MS_TRACE_SEGMENT_MAP); m++) {
    }
    bool is_malloc = m < n && (t[m].action == MS_TRACE_ALLOC || t[m].action == MS_TRACE_OOM);
    bool just_freed =
        i > 0 && t[i - 1].action == MS_TRACE_FREE_REQUESTED && t[i - 1].addr == t[i].addr;
    if (just_freed && is_malloc) {
      /* The block freed at i - 1: its free completed it (no record_stream) when the entry has the
       * free's stack, not the malloc's; the malloc did when it has the malloc's. */
      int by_free = rp_same_stack(tr->snap, t[i].stack, t[i - 1].stack);
      int by_malloc = rp_same_stack(tr->snap, t[i].stack, t[m].stack);
      if (by_free == 1 && by_malloc == 0) {
        tr->fc_kind[i] = RP_FC_NOW;
        if (i + 1 < i1) rp_fc_classify(run, i + 1, before + 1);
        return;
      }
      if (by_malloc == 1 && by_free == 0) just_freed = false;
    }
    rp_process(run);
    if (run->pend.len)
      kind = j == i1 ? RP_FC_SYNC_FORCED : RP_FC_SYNC;
    else if (i1 - i + before < run->pending.len)
      kind = RP_FC_NOW;
    else if (j > i1 && j < n && t[j].action == MS_TRACE_FREE_COMPLETED)
      kind = RP_FC_NOW;
    else if (!is_malloc)
      kind = RP_FC_SYNC;
    else if (j == i1 && nx == MS_TRACE_OOM)
      kind = RP_FC_SYNC_FORCED;
    else if (j == i1)
      kind = !tr->device_total ? RP_FC_SYNC
             : rp_device_refused(run, t[i1].size) ? RP_FC_SYNC_FORCED : RP_FC_NOW;
    else
      kind = rp_released_first(run, i - before, i1, j, m, just_freed && i1 - i == 1) ? RP_FC_NOW
                                                                                    : RP_FC_SYNC;
  }
  for (size_t k = i; k < i1; k++)
    tr->fc_kind[k] = kind;
}

/* Whether free_completed entry i is left to the next operation's synchronization (pushed on
 * late); what-if replays take the check replay's answer (rp_sync_emitted's guess where the check
 * stopped before i). */
static uint8_t rp_fc_kind(rp_run_t *run, size_t i) {
  rp_trace_t *tr = run->tr;
  if (!run->whatif && !tr->fc_kind[i] &&
      (i == 0 || tr->t[i - 1].action != MS_TRACE_FREE_COMPLETED))
    rp_fc_classify(run, i, 0);
  uint8_t k = tr->fc_kind[i];
  return k ? k : rp_sync_emitted(tr, i) ? RP_FC_SYNC : RP_FC_NOW;
}

static bool rp_fc_at_sync(rp_run_t *run, size_t i) {
  uint8_t k = rp_fc_kind(run, i);
  if (k == RP_FC_SYNC_FORCED) run->force_sync = true;
  return k != RP_FC_NOW;
}

/* The free_completed entries a synchronization emitted. The allocator's own OOM path or
 * empty_cache completed them if it ran; otherwise their work was done by then anyway: their
 * events complete now, and the allocator frees them at its next query. */
static void rp_complete_late(rp_run_t *run) {
  for (size_t k = 0; k < run->late.len && !run->stop; k++)
    rp_op_complete(run, run->late.ptr[k]);
  run->late.len = 0;
  run->force_sync = false;
}

/* What-if from a fresh allocator: the start state's live blocks allocated anew (the requested
 * size where known, else the block's), segment by segment in address order, on their stream;
 * pending-free ones are then freed deferred, as they were waiting on an event. Nothing else of
 * the recorded pool (its free gaps, its cached segments) is carried over. */
static int rp_place_fresh(rp_run_t *run) {
  rp_trace_t *tr = run->tr;
  for (size_t j = 0; j < tr->segs.len; j++) {
    rp_sseg_t *sg = &tr->segs.ptr[j];
    for (size_t k = 0; k < sg->blocks.len; k++) {
      rp_sblock_t *b = &sg->blocks.ptr[k];
      size_t size = (size_t)(b->requested ? b->requested : b->size);
      ms_devptr_t ptr = 0;
      if (!size) continue;
      int r = ms_allocator_malloc(run->a, size, (ms_stream_t)sg->stream, &ptr);
      if (r == MS_EOOM) { /* the live start state alone does not fit the capacity */
        run->use->start_short += size;
        continue;
      }
      MS_FORWARD_IF_ERROR(r);
      if (b->state == 1) r = rp_map_put(&run->live, b->addr, ptr);
      else r = rp_defer(run, ptr, b->addr);
      MS_FORWARD_IF_ERROR(r);
    }
  }
  return MS_OK;
}

/* Places the start state at its recorded addresses, blocks and free gaps as they were (check and
 * what-if alike: a what-if assumes the recorded start state, unless tr->fresh_start). */
static int rp_place_start(rp_run_t *run) {
  rp_trace_t *tr = run->tr;
  if (run->whatif && tr->fresh_start) return rp_place_fresh(run);
  for (size_t j = 0; j < tr->segs.len; j++) {
    rp_sseg_t *sg = &tr->segs.ptr[j];
    /* Tile the segment: known blocks, and free gaps between them. */
    MS_VEC(ms__replay_block_t) tiles = {0};
    uint64_t at = sg->addr, end = sg->addr + sg->size;
    int r = MS_OK;
    for (size_t k = 0; k <= sg->blocks.len && r == MS_OK; k++) {
      uint64_t nx = k < sg->blocks.len ? sg->blocks.ptr[k].addr : end;
      if (nx > at)
        r = MS_VEC_PUSH(&tiles, ((ms__replay_block_t){nx - at, 0, 0})) ? MS_ENOMEM : MS_OK;
      if (k == sg->blocks.len || r != MS_OK) break;
      rp_sblock_t *b = &sg->blocks.ptr[k];
      r = MS_VEC_PUSH(&tiles, ((ms__replay_block_t){b->size, b->requested, 1}))
              ? MS_ENOMEM : MS_OK;
      at = b->addr + b->size;
    }
    if (r == MS_OK) r = ms__rp_dev_add(run->rdev, sg->addr, sg->size, false);
    if (r == MS_OK) {
      run->rdev->used += sg->size;
      r = ms__allocator_replay_add_segment(run->a, sg->addr, sg->size, sg->stream, sg->is_small,
                                           tiles.ptr, tiles.len);
    }
    for (size_t k = 0, bi = 0; r == MS_OK && k < tiles.len; k++) {
      if (tiles.ptr[k].state == 0) continue;
      rp_sblock_t *b = &sg->blocks.ptr[bi++];
      /* A pending block waits on a real event, so that a synchronization completes it. */
      if (b->state == 1) r = rp_map_put(&run->live, b->addr, b->addr);
      else r = rp_defer(run, b->addr, b->addr);
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

/* The figures after the last entry: final usage, and the counters of the trace's part (st0: the
 * allocator's statistics after the start state was placed). */
static void rp_final_usage(rp_run_t *run, const ms_stats_t *st0) {
  ms_replay_usage_t *use = run->use;
  if (use->peak_reserved_index == -2) use->peak_reserved_index = -1;
  if (use->peak_allocated_index == -2) use->peak_allocated_index = -1;
  if (use->peak_requested_index == -2) use->peak_requested_index = -1;
  size_t fres = 0, falc = 0, freq = 0;
  ms__allocator_replay_usage(run->a, &fres, &falc, &freq);
  use->final_reserved = fres;
  use->final_allocated = falc;
  ms_stats_t st = MS_STATS_INIT;
  if (ms_allocator_get_stats(run->a, &st) == MS_OK) {
    use->device_mallocs = (uint64_t)(st.num_device_alloc - st0->num_device_alloc);
    use->device_frees = (uint64_t)(st.num_device_free - st0->num_device_free);
    use->alloc_retries = (uint64_t)(st.num_alloc_retries - st0->num_alloc_retries);
    use->ooms = (uint64_t)(st.num_ooms - st0->num_ooms);
  }
}

/* Replays one device (internal.h). */
int ms__rp_run_device(rp_trace_t *tr, bool whatif, const ms_alloc_config_t *cfg, size_t capacity,
                      bool fit_only, ms_replay_device_t *res, ms_replay_usage_t *use) {
  return ms__rp_run_device_ex(tr, whatif, cfg, capacity, fit_only, res, use, NULL);
}

int ms__rp_run_device_ex(rp_trace_t *tr, bool whatif, const ms_alloc_config_t *cfg,
                         size_t capacity, bool fit_only, ms_replay_device_t *res,
                         ms_replay_usage_t *use, uint64_t *held) {
  rp_run_t run;
  memset(&run, 0, sizeof run);
  run.tr = tr;
  run.whatif = whatif;
  run.capacity = capacity;
  run.fit_only = fit_only;
  run.res = res;
  run.use = use;
  memset(use, 0, sizeof *use);
  use->first_oom_index = -1;
  int r;
  /* What-if runs on the recorded device too, with nothing expected: the start segments sit at
   * their recorded addresses, new ones get synthetic addresses, and the capacity (if any) is the
   * only limit (no address window). */
  r = ms__rp_dev_create(capacity, tr->device_total, &run.backend, &run.rdev);
  if (r != MS_OK) return r;
  run.rdev->ndevices = tr->device + 1;
  ms_allocator_config_t ac = {.backend = run.backend, .device = tr->device, .alloc = cfg};
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
  use->peak_reserved_index = use->peak_allocated_index = use->peak_requested_index = -2;
  if (r == MS_OK) rp_track_peak(&run, -1);
  use->start_reserved = run.rdev->used;
  if (r == MS_OK && use->start_short) {
    run.stop = true; /* fresh start: the live blocks alone do not fit (what-if) */
  } else if (r == MS_OK && capacity && run.rdev->used > capacity) {
    /* The recorded start state does not fit on the device: nothing to replay (what-if). */
    use->start_short = run.rdev->used - capacity;
    if (whatif) run.stop = true;
  }
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
      rp_complete_late(&run);
      continue;
    case MS_TRACE_OOM:
      rp_op_malloc(&run, i, true);
      rp_complete_late(&run);
      continue;
    case MS_TRACE_FREE_COMPLETED:
      if (rp_fc_at_sync(&run, i)) {
        if (MS_VEC_PUSH(&run.late, i) != 0) r = MS_ENOMEM;
        continue;
      }
      break;
    default:
      break;
    }
    rp_op_flush(&run);
    rp_complete_late(&run);
    if (run.stop) break;
    if (e->action == MS_TRACE_FREE_REQUESTED) rp_op_free(&run, &i);
    else if (e->action == MS_TRACE_FREE_COMPLETED) rp_op_complete(&run, i);
  }
  if (r == MS_OK && !run.stop) rp_op_flush(&run);
  if (r == MS_OK && !run.stop) rp_complete_late(&run);
  if (r == MS_OK) rp_process(&run);
  res->allocs = allocs;
  res->events = i < tr->n ? i : tr->n;
  if (r == MS_OK && !whatif && !run.stop) r = rp_compare_final(&run);
  if (r == MS_OK && run.stop && res->verdict == MS_REPLAY_PASS && !whatif) r = MS_ENOMEM;
  if (r == MS_OK && run.stop && whatif && res->verdict == MS_REPLAY_UNREPLAYABLE) r = MS_OK;
  if (!whatif) ms__allocator_set_hooks(run.a, NULL);
  rp_final_usage(&run, &st0);
  if (held) *held = run.held > use->peak_allocated ? run.held : use->peak_allocated;
  use->valid = r == MS_OK && (whatif || res->verdict == MS_REPLAY_PASS);
  ms_allocator_destroy(run.a);
  ms_backend_destroy(run.backend);
  MS_VEC_FREE(&run.got);
  MS_VEC_FREE(&run.pend);
  MS_VEC_FREE(&run.late);
  MS_VEC_FREE(&run.xlate);
  rp_map_free(&run.live);
  rp_map_free(&run.pending);
  return r;
}
