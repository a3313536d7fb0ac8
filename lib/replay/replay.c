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

#include "replay/internal.h"

/* What-if: pending handles that are events, and the streams of deferred frees. */
#define RP_EVENT_TAG ((uint64_t)1 << 63)
#define RP_SYNTH_STREAM ((uint64_t)0xe5 << 56)

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
  rp_map_t pending;      /* recorded address -> pending handle (what-if: event | RP_EVENT_TAG) */
  uint64_t next_stream;  /* what-if: synthetic streams of deferred frees */
  MS_VEC(size_t) late;   /* what-if: free_completed entries left to the allocator's next sync */
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
  if (run->whatif) {
    /* A stream of its own uses the block (no head-of-line blocking between deferred frees); the
     * free records an event on it, complete at the recorded free_completed or when the allocator
     * synchronizes (its OOM path, empty_cache), as the program's stream work would be. */
    ms_stream_t use = (ms_stream_t)(RP_SYNTH_STREAM + run->next_stream++);
    run->rdev->last_event = 0;
    if (ms_allocator_record_stream(run->a, (ms_devptr_t)ptr, use) != MS_OK ||
        ms_allocator_free(run->a, (ms_devptr_t)ptr) != MS_OK || !run->rdev->last_event ||
        rp_map_put(&run->pending, e->addr, run->rdev->last_event | RP_EVENT_TAG) != MS_OK)
      run->stop = true;
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
  if (h & RP_EVENT_TAG) { /* what-if: the event completes; the allocator frees at its next query */
    if (rp_map_put(&run->rdev->done, h & ~RP_EVENT_TAG, 1) != MS_OK) run->stop = true;
    return;
  }
  ms__allocator_replay_complete(run->a, (void *)(uintptr_t)h);
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

/* What-if: the free_completed entries a synchronization emitted. The allocator's own OOM path or
 * empty_cache completed them if it ran; otherwise their work was done by then anyway: their
 * events complete now, and the allocator frees them at its next query. */
static void rp_complete_late(rp_run_t *run) {
  for (size_t k = 0; k < run->late.len && !run->stop; k++)
    rp_op_complete(run, run->late.ptr[k]);
  run->late.len = 0;
}

/* Places the start state at its recorded addresses, blocks and free gaps as they were (check and
 * what-if alike: a what-if assumes the recorded start state). */
static int rp_place_start(rp_run_t *run) {
  rp_trace_t *tr = run->tr;
  for (size_t j = 0; j < tr->segs.len; j++) {
    rp_sseg_t *sg = &tr->segs.ptr[j];
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
    if (r == MS_OK) r = ms__rp_dev_add(run->rdev, sg->addr, sg->size, false);
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
  use->first_oom_index = -1;
  int r;
  /* What-if runs on the recorded device too, with nothing expected: the start segments sit at
   * their recorded addresses, new ones get synthetic addresses, and the capacity (if any) is the
   * only limit (no address window). */
  r = ms__rp_dev_create(capacity, tr->device_total, &run.backend, &run.rdev);
  if (r != MS_OK) return r;
  run.rdev->real_events = whatif;
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
  if (r == MS_OK && capacity && run.rdev->used > capacity) {
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
      if (whatif && rp_sync_emitted(tr, i)) {
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
  res->allocs = allocs;
  res->events = i < tr->n ? i : tr->n;
  if (r == MS_OK && !whatif && !run.stop) r = rp_compare_final(&run);
  if (r == MS_OK && run.stop && res->verdict == MS_REPLAY_PASS && !whatif) r = MS_ENOMEM;
  if (r == MS_OK && run.stop && whatif && res->verdict == MS_REPLAY_UNREPLAYABLE) r = MS_OK;
  if (!whatif) ms__allocator_set_hooks(run.a, NULL);
  rp_final_usage(&run, &st0);
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

/* ---- public entry points ------------------------------------------------------------------------- */

static int rp_prepare(const ms_snapshot_t *s, size_t d, rp_trace_t *tr, ms_replay_device_t *res) {
  memset(tr, 0, sizeof *tr);
  tr->snap = s;
  tr->device = (int)d;
  tr->first = s->devices[d].first_trace;
  tr->n = s->devices[d].ntrace;
  tr->t = tr->n ? s->trace + tr->first : NULL; /* not NULL + 0 */
  if (s->devices[d].present & MS_DEV_HAS_CAPACITY) tr->device_total = s->devices[d].capacity;
  ms__rp_config_of(s, &tr->cfg);
  tr->burst_kind = calloc(tr->n ? tr->n : 1, 1);
  if (!tr->burst_kind) return MS_ENOMEM;
  res->device = (int)d;
  res->entries = tr->n;
  res->mismatch_entry = -1;
  if (!ms__rp_replayable(tr, res->reason, sizeof res->reason)) {
    res->verdict = MS_REPLAY_UNREPLAYABLE;
    return MS_OK;
  }
  int r = ms__rp_rebuild_start(tr, res->reason, sizeof res->reason);
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
          res->allocs = scratch.allocs; /* the trace's, even when the what-if stopped early */
        }
      }
    }
    ms__rp_trace_release(&tr);
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

/* A what-if run fits its capacity: the start state fits and no allocation failed. */
static bool rp_fits(const ms_replay_usage_t *u) {
  return u->ooms == 0 && u->start_short == 0;
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
    /* Below the start state's reserved memory nothing fits. */
    if (use.start_reserved > RP_PAGE) lo = ((size_t)use.start_reserved - 1) & ~(size_t)(RP_PAGE - 1);
    if (lo >= hi) lo = hi - RP_PAGE;
  }
  while (r == MS_OK) {
    r = rp_run_device(&tr, true, &cfg, hi, &res, &use);
    if (r != MS_OK || rp_fits(&use)) break;
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
    if (rp_fits(&use)) hi = mid;
    else lo = mid;
  }
  /* Verified: the bisection assumes that a larger device never does worse, which the OOM path
   * does not promise; 2 MiB less must not fit (stepping down while it does, a bounded number of
   * times). */
  for (int step = 0; r == MS_OK && hi > RP_PAGE; step++) {
    r = rp_run_device(&tr, true, &cfg, hi - RP_PAGE, &res, &use);
    if (r != MS_OK || !rp_fits(&use)) break;
    if (step == 64) {
      r = ms__errbuf_set(eb, MS_ENOTFOUND, "device %d: no smallest capacity: the replay fits on "
                         "%zu bytes and on 64 smaller sizes below its bisection's answer", device,
                         hi - RP_PAGE);
      break;
    }
    hi -= RP_PAGE;
  }
  ms__rp_trace_release(&tr);
  if (r == MS_OK) *out = hi;
  return r;
}
