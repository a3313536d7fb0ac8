/* SPDX-License-Identifier: MIT
 * memsnap CLI: what `memsnap timeline FILE` says about a device, computed once and written two
 * ways: as text by cli/cmd-timeline.c and as `--json` here, so that the two cannot disagree. The
 * JSON's schema is in docs/timeline.md ("`--json`: the text as JSON").
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/timeline.h"

/* The peak of metric m and the stacks alive then. */
static int report_peak(const ms_timeline_t *tl, size_t dev, ms_tl_metric m, size_t from,
                       size_t to, const ms_tl_filter_t *filter, cli_tl_peak_t *pk) {
  memset(pk, 0, sizeof *pk);
  if (ms_timeline_peak(tl, dev, m, from, to, &pk->p) != MS_OK) return CLI_OK;
  pk->has = true;
  pk->entry = pk->p.step > 0 ? ms_timeline_entry(tl, dev, pk->p.step - 1) : NULL;
  ms_snapshot_t *at = NULL;
  int rc = ms_timeline_snapshot_at(tl, dev, pk->p.step, filter, &at);
  if (rc != MS_OK) {
    cli_state_error(rc);
    return CLI_FAILURE;
  }
  cli_top_t top;
  if (cli_top_compute(at, CLI_TOP_STACK, &top) != MS_OK) {
    ms_snapshot_free(at);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  for (size_t i = 0; i < top.nitems && i < CLI_TL_TOP_STACKS; i++) {
    struct cli_tl_stack_s *s = &pk->stacks[pk->nstacks++];
    s->bytes = top.items[i].bytes;
    s->blocks = top.items[i].count;
    cli_top_label(at, &top, i, s->label, sizeof s->label);
  }
  cli_top_release(&top);
  ms_snapshot_free(at);
  return CLI_OK;
}

/* The `oom` entries of the device within [from, to). */
static int report_ooms(const ms_timeline_t *tl, size_t dev, size_t from, size_t to,
                       cli_tl_report_t *r) {
  ms_tl_ooms_t all;
  if (ms_snapshot_ooms(ms_timeline_snapshot(tl), dev, &all) != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  size_t n = all.n;
  r->noom_all = n;
  if (n == 0) return CLI_OK;
  r->ooms = calloc(n, sizeof *r->ooms);
  r->oom_n = calloc(n, sizeof *r->oom_n);
  if (!r->ooms || !r->oom_n) {
    ms_tl_ooms_release(&all);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  for (size_t k = 0; k < n; k++) {
    const ms_tl_oom_t *o = &all.ooms[k];
    if (o->entry < from || o->entry >= to) continue;
    r->oom_n[r->nooms] = k + 1;
    r->ooms[r->nooms++] = *o;
  }
  ms_tl_ooms_release(&all);
  return CLI_OK;
}

/* --steps: the peak of each ProfilerStep#N range, and the step of the whole range's peak. */
static int report_steps(const ms_timeline_t *tl, size_t dev, size_t from, size_t to,
                        cli_tl_report_t *r) {
  ms_tl_ranges_t rs;
  if (ms_tl_ranges_build(ms_timeline_snapshot(tl), &rs) != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  r->steps = rs.n ? calloc(rs.n, sizeof *r->steps) : NULL;
  if (rs.n && !r->steps) {
    ms_tl_ranges_release(&rs);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  ms_tl_peak_t whole;
  r->has_whole_peak = ms_timeline_peak(tl, dev, MS_TL_ALLOCATED, from, to, &whole) == MS_OK;
  r->peak_step = -1;
  r->unmatched_ends = rs.unmatched_ends;
  r->unknown_stages = rs.unknown_stages;
  for (size_t i = 0; i < rs.n; i++) {
    const ms_tl_range_t *x = &rs.ranges[i];
    if (x->step < 0 ||
        (x->device != (int64_t)dev && ms_tl_ranges_step(&rs, (int64_t)dev, x->step)))
      continue;
    cli_tl_step_t *st = &r->steps[r->nsteps];
    ms_errbuf_t eb = {{0}};
    if (ms_timeline_step_range(tl, dev, x->step, &st->lo, &st->hi, &eb) != MS_OK) {
      snprintf(r->steps_error, sizeof r->steps_error, "%s", eb.msg[0] ? eb.msg : "?");
      break;
    }
    r->nsteps++;
    st->step = x->step;
    st->has_end = x->has_end;
    ms_tl_peak_t pk[MS_TL_METRIC_COUNT]; /* both in one pass over the step's entries */
    st->has_peaks = st->hi > st->lo && ms_timeline_peaks(tl, dev, st->lo + 1, st->hi, pk) == MS_OK;
    if (st->has_peaks) {
      st->allocated = pk[MS_TL_ALLOCATED];
      st->reserved = pk[MS_TL_RESERVED];
    }
    if (r->has_whole_peak && whole.step > st->lo && whole.step <= st->hi && r->peak_step < 0)
      r->peak_step = x->step;
  }
  ms_tl_ranges_release(&rs);
  return CLI_OK;
}

int cli_tl_report(const ms_timeline_t *tl, size_t dev, size_t from, size_t to, bool has_range,
                  const ms_tl_filter_t *filter, bool steps, cli_tl_report_t *r) {
  memset(r, 0, sizeof *r);
  r->dev = dev;
  r->nentries = ms_timeline_nentries(tl, dev);
  r->from = from;
  r->to = to;
  r->has_range = has_range;
  r->peak_step = -1;
  for (size_t i = from; i < to; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (!(e->present & MS_TRACE_HAS_TIME)) continue;
    if (!r->first) r->first = e;
    r->last = e;
  }
  int rc = report_peak(tl, dev, MS_TL_ALLOCATED, from, to, filter, &r->peaks[0]);
  if (rc == CLI_OK) rc = report_peak(tl, dev, MS_TL_RESERVED, from, to, filter, &r->peaks[1]);
  if (rc == CLI_OK) rc = report_ooms(tl, dev, from, to, r);
  r->steps_wanted = steps;
  if (rc == CLI_OK && steps) rc = report_steps(tl, dev, from, to, r);
  uint64_t before[MS_TL_METRIC_COUNT];
  if (rc == CLI_OK && (ms_timeline_totals_at(tl, dev, to, r->state) != MS_OK ||
                       ms_timeline_totals_at(tl, dev, from, before) != MS_OK)) {
    cli_error("out of memory");
    rc = CLI_FAILURE;
  }
  r->has_before = from > 0 || !has_range;
  if (rc == CLI_OK) {
    r->before_allocated = before[MS_TL_ALLOCATED];
    r->before_reserved = before[MS_TL_RESERVED];
  }
  if (rc != CLI_OK) cli_tl_report_release(r);
  return rc;
}

void cli_tl_report_release(cli_tl_report_t *r) {
  free(r->ooms);
  free(r->oom_n);
  free(r->steps);
  r->ooms = NULL;
  r->oom_n = NULL;
  r->steps = NULL;
  r->nooms = r->nsteps = 0;
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static void json_key(cli_json_t *j, const char *key) {
  cli_json_lit(j, ", \"");
  cli_json_lit(j, key);
  cli_json_lit(j, "\": ");
}

static void json_time(cli_json_t *j, const char *key, const ms_snap_trace_t *e) {
  json_key(j, key);
  if (e && (e->present & MS_TRACE_HAS_TIME)) cli_json_i64(j, e->time_us);
  else cli_json_lit(j, "null");
}

/* {"bytes": N, "entry": E} of a step's peak. */
static void json_small_peak(cli_json_t *j, const ms_tl_peak_t *p) {
  cli_json_lit(j, "{\"bytes\": ");
  cli_json_u64(j, p->bytes);
  cli_json_lit(j, ", \"entry\": ");
  cli_json_i64(j, p->entry);
  cli_json_lit(j, "}");
}

static void json_peak(cli_json_t *j, const cli_tl_peak_t *pk) {
  if (!pk->has) {
    cli_json_lit(j, "null");
    return;
  }
  cli_json_lit(j, "{\"bytes\": ");
  cli_json_u64(j, pk->p.bytes);
  cli_json_lit(j, ", \"entry\": ");
  cli_json_i64(j, pk->p.entry);
  json_key(j, "action");
  if (pk->entry) cli_json_str(j, ms_trace_action_name(pk->entry->action));
  else cli_json_lit(j, "null");
  json_time(j, "time_us", pk->entry);
  cli_json_lit(j, ", \"top_stacks\": [");
  for (size_t i = 0; i < pk->nstacks; i++) {
    cli_json_lit(j, i ? ",\n    {\"bytes\": " : "\n    {\"bytes\": ");
    cli_json_u64(j, pk->stacks[i].bytes);
    cli_json_lit(j, ", \"blocks\": ");
    cli_json_u64(j, pk->stacks[i].blocks);
    cli_json_lit(j, ", \"label\": ");
    cli_json_str(j, pk->stacks[i].label);
    cli_json_lit(j, "}");
  }
  cli_json_lit(j, "]}");
}

static void json_ooms(cli_json_t *j, const cli_tl_report_t *r, const ms_timeline_t *tl) {
  cli_json_lit(j, ",\n  \"ooms\": [");
  for (size_t k = 0; k < r->nooms; k++) {
    const ms_tl_oom_t *o = &r->ooms[k];
    cli_json_lit(j, k ? ",\n    {\"oom\": " : "\n    {\"oom\": ");
    cli_json_u64(j, r->oom_n[k]);
    cli_json_lit(j, ", \"entry\": ");
    cli_json_u64(j, o->entry);
    json_time(j, "time_us", ms_timeline_entry(tl, r->dev, o->entry));
    json_key(j, "request");
    cli_json_u64(j, o->request);
    json_key(j, "stream");
    cli_json_u64(j, o->stream);
    json_key(j, "device_free");
    if (o->has_device_free) cli_json_u64(j, o->device_free);
    else cli_json_lit(j, "null");
    json_key(j, "reserved");
    if (o->has_reserved) cli_json_u64(j, o->reserved);
    else cli_json_lit(j, "null");
    cli_json_lit(j, "}");
  }
  cli_json_lit(j, "]");
}

static void json_steps(cli_json_t *j, const cli_tl_report_t *r) {
  cli_json_lit(j, ",\n  \"steps\": {\"steps\": [");
  for (size_t i = 0; i < r->nsteps; i++) {
    const cli_tl_step_t *st = &r->steps[i];
    cli_json_lit(j, i ? ",\n    {\"step\": " : "\n    {\"step\": ");
    cli_json_i64(j, st->step);
    json_key(j, "first_entry");
    if (st->hi > st->lo) cli_json_u64(j, st->lo);
    else cli_json_lit(j, "null");
    json_key(j, "last_entry");
    if (st->hi > st->lo) cli_json_u64(j, st->hi - 1);
    else cli_json_lit(j, "null");
    json_key(j, "peak_allocated");
    if (st->has_peaks) json_small_peak(j, &st->allocated);
    else cli_json_lit(j, "null");
    json_key(j, "peak_reserved");
    if (st->has_peaks) json_small_peak(j, &st->reserved);
    else cli_json_lit(j, "null");
    cli_json_lit(j, st->has_end ? ", \"has_end\": true}" : ", \"has_end\": false}");
  }
  cli_json_lit(j, "]");
  json_key(j, "peak_step");
  if (r->peak_step >= 0) cli_json_i64(j, r->peak_step);
  else cli_json_lit(j, "null");
  json_key(j, "unmatched_ends");
  cli_json_u64(j, r->unmatched_ends);
  json_key(j, "other_stages");
  cli_json_u64(j, r->unknown_stages);
  json_key(j, "error");
  if (r->steps_error[0]) cli_json_str(j, r->steps_error);
  else cli_json_lit(j, "null");
  cli_json_lit(j, "}");
}

int cli_tl_report_json(cli_json_t *j, const cli_tl_report_t *r, const ms_timeline_t *tl,
                       const ms_attr_t *a) {
  cli_json_lit(j, "{\"device\": ");
  cli_json_u64(j, r->dev);
  json_key(j, "entries");
  cli_json_u64(j, r->nentries);
  json_key(j, "range");
  if (!r->has_range) {
    cli_json_lit(j, "null");
  } else {
    cli_json_lit(j, "{\"first\": ");
    cli_json_u64(j, r->from);
    cli_json_lit(j, ", \"last\": ");
    if (r->to > r->from) cli_json_u64(j, r->to - 1);
    else cli_json_lit(j, "null");
    cli_json_lit(j, "}");
  }
  json_time(j, "first_time_us", r->first);
  json_time(j, "last_time_us", r->last);
  json_key(j, "duration_us"); /* null when it does not fit in 64 bits (a damaged file) */
  int64_t d;
  if (r->first && !__builtin_sub_overflow(r->last->time_us, r->first->time_us, &d))
    cli_json_i64(j, d);
  else
    cli_json_lit(j, "null");
  cli_json_lit(j, ",\n  \"peaks\": {\"allocated\": ");
  json_peak(j, &r->peaks[0]);
  cli_json_lit(j, ",\n  \"reserved\": ");
  json_peak(j, &r->peaks[1]);
  cli_json_lit(j, "}");
  if (a) {
    if (cli_timeline_categories(NULL, j, tl, a, r->dev, r->from, r->to) != CLI_OK)
      return CLI_FAILURE;
  }
  json_ooms(j, r, tl);
  if (r->steps_wanted) json_steps(j, r);
  cli_json_lit(j, ",\n  \"state\": {\"at\": ");
  cli_json_lit(j, r->to == r->nentries ? "\"end\"" : "\"range_end\"");
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    json_key(j, ms_tl_metric_name((ms_tl_metric)m));
    cli_json_u64(j, r->state[m]);
  }
  cli_json_lit(j, "}");
  json_key(j, "before");
  if (r->has_before) {
    cli_json_lit(j, "{\"allocated\": ");
    cli_json_u64(j, r->before_allocated);
    cli_json_lit(j, ", \"reserved\": ");
    cli_json_u64(j, r->before_reserved);
    cli_json_lit(j, "}");
  } else {
    cli_json_lit(j, "null");
  }
  cli_json_lit(j, "}");
  return CLI_OK;
}
