/* SPDX-License-Identifier: MIT
 * memsnap core: the public entry points of `memsnap replay` (include/memsnap/replay.h): the
 * report of every device (check, or check then what-if) and the --min-capacity bisection, over
 * replay.c's replay of one device (ms__rp_run_device).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/internal.h"

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
  o->recorded_capacity = true;
  o->inferred_capacity = true;
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
  tr->fc_kind = calloc(tr->n ? tr->n : 1, 1);
  if (!tr->burst_kind || !tr->fc_kind) return MS_ENOMEM;
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

/* The capacity a what-if of device d runs on, and where it comes from. */
static void rp_whatif_capacity(const ms_snapshot_t *snap, size_t d, const ms_replay_options_t *o,
                               uint64_t device_total, ms_replay_device_t *res) {
  res->recorded_ooms = ms_snapshot_oom_count(snap, d);
  res->capacity = o->capacity;
  res->capacity_source = MS_CAPACITY_GIVEN;
  if (o->capacity) return;
  uint64_t cap = 0;
  ms_tl_oom_t oom;
  ms_capacity_source src = ms_snapshot_capacity(snap, d, &cap, &oom);
  if (o->recorded_capacity && device_total) {
    res->capacity = device_total;
    res->capacity_recorded = true;
    res->capacity_source = MS_CAPACITY_RECORDED;
  } else if (o->inferred_capacity && src == MS_CAPACITY_INFERRED) {
    res->capacity = cap;
    res->capacity_source = MS_CAPACITY_INFERRED;
    res->capacity_oom = oom;
  } else if (o->recorded_capacity || o->inferred_capacity) {
    res->capacity_source = MS_CAPACITY_UNKNOWN;
  }
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
        r = ms__rp_run_device(&tr, false, &tr.cfg, o.capacity, false, res, &res->recorded);
      } else {
        ms_alloc_config_t cfg;
        r = rp_whatif_config(&tr, o.config, &cfg, eb);
        ms_replay_device_t scratch = *res;
        if (r == MS_OK)
          r = ms__rp_run_device(&tr, false, &tr.cfg, 0, false, &scratch, &res->recorded);
        if (r == MS_OK) {
          res->verdict = scratch.verdict;
          memcpy(res->reason, scratch.reason, sizeof res->reason);
          res->mismatch_entry = scratch.mismatch_entry;
          memcpy(res->expected, scratch.expected, sizeof res->expected);
          memcpy(res->actual, scratch.actual, sizeof res->actual);
          rp_whatif_capacity(snap, d, &o, tr.device_total, res);
          tr.fresh_start = o.fresh_start;
          r = ms__rp_run_device(&tr, true, &cfg, (size_t)res->capacity, false, res, &res->replayed);
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
  if (r == MS_OK)
    r = ms__rp_run_device(&tr, false, &tr.cfg, 0, false, &res, &use); /* classifies bursts */
  /* hi: a capacity without OOM, lo: one with an OOM (0 always OOMs when anything is allocated). */
  size_t lo = 0, hi = 0;
  if (r == MS_OK) {
    r = ms__rp_run_device(&tr, true, &cfg, 0, false, &res, &use);
    hi = ((size_t)use.peak_reserved + RP_PAGE - 1) & ~(size_t)(RP_PAGE - 1);
    if (hi < RP_PAGE) hi = RP_PAGE;
    /* Below the start state's reserved memory nothing fits; nor below the peak of allocated
     * bytes: a run without an OOM makes every allocation of the unlimited run, whose allocated
     * bytes do not depend on the capacity, and reserved memory holds them. */
    size_t floor_bytes = (size_t)(use.start_reserved > use.peak_allocated ? use.start_reserved
                                                                          : use.peak_allocated);
    if (floor_bytes > RP_PAGE) lo = (floor_bytes - 1) & ~(size_t)(RP_PAGE - 1);
    if (lo >= hi) lo = hi - RP_PAGE;
  }
  while (r == MS_OK) {
    r = ms__rp_run_device(&tr, true, &cfg, hi, true, &res, &use);
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
    r = ms__rp_run_device(&tr, true, &cfg, mid, true, &res, &use);
    if (r != MS_OK) break;
    if (rp_fits(&use)) hi = mid;
    else lo = mid;
  }
  /* Verified: the bisection assumes that a larger device never does worse, which the OOM path
   * does not promise; 2 MiB less must not fit (stepping down while it does, a bounded number of
   * times). */
  for (int step = 0; r == MS_OK && hi > RP_PAGE; step++) {
    r = ms__rp_run_device(&tr, true, &cfg, hi - RP_PAGE, true, &res, &use);
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
