/* SPDX-License-Identifier: MIT
 * memsnap core: the public entry points of `memsnap replay` (include/memsnap/replay.h): the
 * report of every device (check, or check then what-if) and the --min-capacity search, over
 * replay.c's replay of one device (ms__rp_run_device); and one device prepared once for many
 * what-if runs (ms_replay_prepare), which the other entry points use too.
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

/* The check replay that a what-if needs first (it classifies the trace's bursts and
 * free_completed entries for the what-if runs, which only read them): res takes its verdict and
 * mismatch, res->recorded its figures, *allocs its allocation count. */
static int rp_check_first(rp_trace_t *tr, ms_replay_device_t *res, uint64_t *allocs) {
  ms_replay_device_t scratch = *res;
  int r = ms__rp_run_device(tr, false, &tr->cfg, 0, false, &scratch, &res->recorded);
  if (r != MS_OK) return r;
  res->verdict = scratch.verdict;
  memcpy(res->reason, scratch.reason, sizeof res->reason);
  res->mismatch_entry = scratch.mismatch_entry;
  memcpy(res->expected, scratch.expected, sizeof res->expected);
  memcpy(res->actual, scratch.actual, sizeof res->actual);
  *allocs = scratch.allocs;
  return MS_OK;
}

/* The what-if of o (its config parsed into cfg) on device d, after rp_check_first filled res:
 * the capacity chosen, then the run. The trace is only read (tr->fresh_start as o says). */
static int rp_whatif_after_check(const ms_snapshot_t *snap, size_t d, const rp_trace_t *tr,
                                 const ms_replay_options_t *o, const ms_alloc_config_t *cfg,
                                 uint64_t allocs, ms_replay_device_t *res) {
  rp_whatif_capacity(snap, d, o, tr->device_total, res);
  rp_trace_t t = *tr; /* the arrays shared, read only by a what-if */
  t.fresh_start = o->fresh_start;
  int r = ms__rp_run_device(&t, true, cfg, (size_t)res->capacity, false, res, &res->replayed);
  res->allocs = allocs; /* the trace's, even when the what-if stopped early */
  return r;
}

/* One device prepared once for many what-if runs (ms_replay_prepare). */
struct ms_replay_prepared_s {
  const ms_snapshot_t *snap;
  rp_trace_t tr;
  ms_replay_device_t res; /* the preparation's and the check replay's result */
  uint64_t allocs;        /* the check replay's allocation count */
  bool replayable;        /* as the preparation found (a check that fails still allows what-ifs) */
};

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
  for (size_t d = 0; o.whatif && d < o.nprepared && o.prepared; d++) {
    const ms_replay_prepared_t *p = o.prepared[d];
    if (p && (p->snap != snap || (size_t)p->tr.device != d))
      r = ms__errbuf_set(eb, MS_EINVAL, "the preparation given for device %zu is %s", d,
                         p->snap != snap ? "another snapshot's" : "another device's");
  }
  for (size_t d = 0; d < nd && r == MS_OK; d++) {
    if (o.device >= 0 && (size_t)o.device != d) continue;
    ms_replay_device_t *res = &rep->devices[rep->ndevices++];
    if (o.whatif && o.prepared && d < o.nprepared && o.prepared[d]) {
      r = ms_replay_prepared_whatif(o.prepared[d], &o, res, eb);
      continue;
    }
    rp_trace_t tr;
    r = rp_prepare(snap, d, &tr, res);
    if (r == MS_OK && res->verdict != MS_REPLAY_UNREPLAYABLE) {
      if (!o.whatif) {
        r = ms__rp_run_device(&tr, false, &tr.cfg, o.capacity, false, res, &res->recorded);
      } else {
        ms_alloc_config_t cfg;
        uint64_t allocs = 0;
        r = rp_whatif_config(&tr, o.config, &cfg, eb);
        if (r == MS_OK) r = rp_check_first(&tr, res, &allocs);
        if (r == MS_OK) r = rp_whatif_after_check(snap, d, &tr, &o, &cfg, allocs, res);
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

static size_t rp_page_up(uint64_t v) {
  return (size_t)((v + RP_PAGE - 1) & ~(RP_PAGE - 1));
}

/* The next run a hint names (rp_min_capacity_on): none, 2 MiB under a fitting run's peak, or that
 * peak after an OOM there. */
typedef struct rp_hint_s {
  size_t at;    /* 0: none */
  size_t peak;  /* the peak `at` is 2 MiB under (0: `at` is the peak itself, or a step) */
  bool on;      /* hints are still worth a run */
  bool stepped; /* the one step 2 MiB under a run that filled its capacity was taken */
} rp_hint_t;

/* A run on C fitted with peak reserved `peak`: the next hint. A peak under C names a candidate
 * (2 MiB under it, then it); a run that filled C names none, but one step 2 MiB under C is worth
 * it once (a run that could take C took it; a smaller device often does without). The search
 * takes that step first, under the unlimited run's peak; here it is left for a capacity the
 * search had to double. */
static void rp_hint_after_fit(rp_hint_t *h, size_t c, uint64_t peak_reserved) {
  size_t peak = rp_page_up(peak_reserved);
  h->at = h->peak = 0;
  if (!h->on || peak <= RP_PAGE || c <= RP_PAGE) return;
  if (peak < c) {
    h->at = peak - RP_PAGE;
    h->peak = peak;
  } else if (!h->stepped) {
    h->stepped = true;
    h->at = c - RP_PAGE;
  }
}

/* The smallest capacity of the what-if of cfg on tr, after its check replay (res: the prepared
 * device's result, copied for each run). The search keeps hi, a capacity that fits, and lo, one
 * that does not or cannot, and ends when they are one page apart.
 * - lo starts at the floor: a run without an OOM serves every request of the unlimited run, its
 *   allocations included, so it reserves at least the most those hold at once (an oom entry's
 *   request among them) and at least the start state's reserved memory.
 * - hi starts at the unlimited run's peak reserved, or twice that until a run fits; 2 MiB under
 *   that peak is run first, which spares hi its own run when it fits (a smaller device often
 *   does not need the unlimited run's peak).
 * - A run that fits on C with a lower peak P says where the answer likely is: 2 MiB under P is
 *   run next, and P after an OOM there, which ends the search when P fits. A run 2 MiB under P
 *   that fits too says that this trace takes what it is given (a smaller device, a smaller peak):
 *   no more hints then, the bisection does the rest. So hints cost at most three runs more than a
 *   bisection; on the 1 GB synthetic OOM trace the search takes 4 runs where a bisection took 18.
 * Each run's answer, from a hint or a bisection, is a fact about that capacity, so the answer is
 * the same as a bisection's wherever a larger device never does worse. Where the OOM path breaks
 * that, the answer is verified: it fits, and 2 MiB less does not (stepping down while it does, a
 * bounded number of times). */
static int rp_min_capacity_on(const rp_trace_t *tr, const ms_replay_device_t *checked,
                              const char *config, size_t *out, ms_errbuf_t *eb) {
  ms_alloc_config_t cfg;
  int r = rp_whatif_config(tr, config, &cfg, eb);
  MS_FORWARD_IF_ERROR(r);
  rp_trace_t t = *tr; /* read only by what-if runs */
  t.fresh_start = false;
  ms_replay_device_t res = *checked;
  ms_replay_usage_t use;
  uint64_t held = 0;
  /* hi: a capacity without OOM, lo: one with an OOM (0 always OOMs when anything is allocated). */
  size_t lo = 0, hi = 0;
  bool lo_run = false; /* lo was run (not only the floor) */
  r = ms__rp_run_device_ex(&t, true, &cfg, 0, false, &res, &use, &held);
  if (r == MS_OK) {
    hi = rp_page_up(use.peak_reserved);
    if (hi < RP_PAGE) hi = RP_PAGE;
    size_t floor_bytes = (size_t)(use.start_reserved > held ? use.start_reserved : held);
    if (floor_bytes > RP_PAGE) lo = (floor_bytes - 1) & ~(size_t)(RP_PAGE - 1);
    if (lo >= hi) lo = hi - RP_PAGE;
  }
  rp_hint_t h = {0, 0, true, false};
  /* 2 MiB under the unlimited run's peak first (the step of rp_hint_after_fit): when that fits,
   * hi needs no run of its own; when it does not, hi is run (and doubled while it does not fit) */
  bool hi_run = false;
  if (r == MS_OK && hi - lo > RP_PAGE) {
    h.stepped = true;
    res = *checked;
    r = ms__rp_run_device(&t, true, &cfg, hi - RP_PAGE, true, &res, &use);
    if (r == MS_OK && rp_fits(&use)) {
      hi -= RP_PAGE;
      hi_run = true;
      rp_hint_after_fit(&h, hi, use.peak_reserved);
    } else if (r == MS_OK) {
      lo = hi - RP_PAGE;
      lo_run = true;
    }
  }
  while (r == MS_OK && !hi_run) {
    res = *checked;
    r = ms__rp_run_device(&t, true, &cfg, hi, true, &res, &use);
    if (r != MS_OK) break;
    if (rp_fits(&use)) {
      rp_hint_after_fit(&h, hi, use.peak_reserved);
      hi_run = true;
      break;
    }
    lo = hi;
    lo_run = true;
    if (hi >= RP_MIN_CAP_BOUND) {
      r = ms__errbuf_set(eb, MS_ENOTFOUND, "device %d: the replay runs out of memory even with "
                         "%zu bytes", tr->device, hi);
      break;
    }
    hi *= 2;
  }
  while (r == MS_OK && hi - lo > RP_PAGE) {
    size_t mid, under = 0; /* under: the peak a hint runs 2 MiB under */
    bool from_hint = h.on && h.at > lo && h.at < hi;
    if (from_hint) {
      mid = h.at;
      under = h.peak;
    } else {
      mid = lo + ((hi - lo) / 2 & ~(size_t)(RP_PAGE - 1));
      if (mid == lo) mid = lo + RP_PAGE;
    }
    h.at = h.peak = 0;
    res = *checked;
    r = ms__rp_run_device(&t, true, &cfg, mid, true, &res, &use);
    if (r != MS_OK) break;
    if (rp_fits(&use)) {
      hi = mid;
      if (under) h.on = false; /* 2 MiB under a peak fits: the trace takes what it is given */
      rp_hint_after_fit(&h, mid, use.peak_reserved);
    } else {
      lo = mid;
      lo_run = true;
      if (under)
        h.at = under; /* then the peak itself */
      else if (from_hint)
        h.on = false; /* a step or a peak that does not fit: no more hints */
    }
  }
  /* Verified: 2 MiB less must not fit (known when lo is that and was run; else stepping down
   * while it does, a bounded number of times). */
  for (int step = 0; r == MS_OK && hi > RP_PAGE && !(lo_run && lo == hi - RP_PAGE); step++) {
    res = *checked;
    r = ms__rp_run_device(&t, true, &cfg, hi - RP_PAGE, true, &res, &use);
    if (r != MS_OK || !rp_fits(&use)) break;
    if (step == 64) {
      r = ms__errbuf_set(eb, MS_ENOTFOUND, "device %d: no smallest capacity: the replay fits on "
                         "%zu bytes and on 64 smaller sizes below its bisection's answer",
                         tr->device, hi - RP_PAGE);
      break;
    }
    hi -= RP_PAGE;
  }
  if (r == MS_OK) *out = hi;
  return r;
}

int ms_replay_min_capacity(const ms_snapshot_t *snap, int device, const char *config,
                           size_t *out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!snap || !out || device < 0 || (size_t)device >= snap->ndevices, MS_EINVAL);
  ms_replay_prepared_t *p = NULL;
  int r = ms_replay_prepare(snap, device, &p, eb);
  if (r == MS_OK) r = ms_replay_prepared_min_capacity(p, config, out, eb);
  ms_replay_prepared_free(p);
  return r;
}

/* ---- one device prepared for many what-if runs ---------------------------------------------- */

int ms_replay_prepare(const ms_snapshot_t *snap, int device, ms_replay_prepared_t **out,
                      ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!snap || !out || device < 0 || (size_t)device >= snap->ndevices, MS_EINVAL);
  ms_replay_prepared_t *p = calloc(1, sizeof *p);
  if (!p) return MS_ENOMEM;
  p->snap = snap;
  int r = rp_prepare(snap, (size_t)device, &p->tr, &p->res);
  p->replayable = r == MS_OK && p->res.verdict != MS_REPLAY_UNREPLAYABLE;
  if (p->replayable) r = rp_check_first(&p->tr, &p->res, &p->allocs);
  if (r != MS_OK) {
    if (r == MS_ENOMEM) ms__errbuf_set(eb, r, "out of memory");
    ms_replay_prepared_free(p);
    return r;
  }
  *out = p;
  return MS_OK;
}

const ms_replay_device_t *ms_replay_prepared_result(const ms_replay_prepared_t *p) {
  return p ? &p->res : NULL;
}

int ms_replay_prepared_whatif(const ms_replay_prepared_t *p, const ms_replay_options_t *o,
                              ms_replay_device_t *out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!p || !o || !out, MS_EINVAL);
  ms_replay_device_t res = p->res;
  if (p->replayable) {
    ms_alloc_config_t cfg;
    MS_FORWARD_IF_ERROR(rp_whatif_config(&p->tr, o->config, &cfg, eb));
    MS_FORWARD_IF_ERROR(
        rp_whatif_after_check(p->snap, (size_t)p->tr.device, &p->tr, o, &cfg, p->allocs, &res));
  }
  *out = res;
  return MS_OK;
}

int ms_replay_prepared_min_capacity(const ms_replay_prepared_t *p, const char *config, size_t *out,
                                    ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!p || !out, MS_EINVAL);
  if (!p->replayable)
    return ms__errbuf_set(eb, MS_ENOTFOUND, "device %d: not replayable: %s", p->tr.device,
                          p->res.reason);
  return rp_min_capacity_on(&p->tr, &p->res, config, out, eb);
}

void ms_replay_prepared_free(ms_replay_prepared_t *p) {
  if (!p) return;
  ms__rp_trace_release(&p->tr);
  free(p);
}
