/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap timeline FILE` (issue #12 §2): memory over time.
 *
 * Text (default): per device, the number of trace entries, the first and last timestamps, the
 * peak of allocated bytes (bytes, entry, time, the biggest stacks alive then), the peak of
 * reserved bytes likewise, and the final state. `--json` prints exactly the data PyTorch's web
 * viewer computes for its "Active Memory Timeline" (`--segments`: "Active Cached Segment
 * Timeline"), see memsnap/timeline.h.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/timeline.h"

static const char timeline_usage[] =
    "usage: memsnap timeline FILE [--json [--segments] [--max-entries N]] [--steps] [--device N]\n"
    "                        [--range A:B|step=N] [--stream S] [--pool A,B] [--by category]\n"
    "       memsnap timeline FILE FILE...|DIR [--json] [--jobs N] [--keep-going]\n"
    "       memsnap timeline --from-summaries DIR [--json] [--keep-going]\n"
    "\n"
    "Memory over time. By default prints, for each device: the number of trace entries, the\n"
    "first and last timestamps, the peak of allocated memory (bytes, entry, time and the\n"
    "stacks that held the most memory then), the peak of reserved memory, each out-of-memory\n"
    "error, and the final state.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  --json             print the data of PyTorch's viewer \"Active Memory Timeline\" (one\n"
    "                     device: the viewer's default, or --device) as JSON\n"
    "  --segments         with --json: the \"Active Cached Segment Timeline\" instead\n"
    "  --max-entries N    with --json: draw only the N largest allocations on their own, the\n"
    "                     rest as one \"summarized\" band (the viewer's default is 15000);\n"
    "                     without it nothing is summarized\n"
    "  --steps            the peak of each step (ProfilerStep#N annotations) and the step of\n"
    "                     the peak\n"
    "  -d, --device N     only device N\n"
    "  --range A:B        only trace entries A to B (inclusive; either may be omitted);\n"
    "                     step=N: the entries of step N (ProfilerStep#N)\n"
    "  --stream S         (text) count only segments of stream S (raw handle, decimal or 0x..)\n"
    "  --pool A,B         (text) count only segments of private pool (A, B); 0,0 = default\n"
    "  --by category      also the allocated bytes of each category at the peak, and each\n"
    "                     category's own peak (docs/categories.md); with --json, that as JSON\n"
    "  --categories RULES with --by category: a rules file extending the default rules\n"
    "  --jobs N           with several FILEs (one per rank) or a DIR of them: read N files at\n"
    "                     a time (default: one per core); prints one row per file: peaks,\n"
    "                     fragmentation, OOMs, the largest stack at the peak, the highest rank\n"
    "                     and the outliers (docs/exports.md)\n"
    "  --from-summaries DIR  the same table from the `memsnap summary --json` lines in DIR's\n"
    "                     *.json files (one per rank, made in parallel anywhere)\n"
    "  --keep-going       with several FILEs: a file that cannot be read (a crashed rank's\n"
    "                     empty dump) is reported, and the exit is still 0\n"
    "  -h, --help         show this help\n";


static int timeline_json(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                         bool segments, size_t max_entries) {
  size_t dev;
  int rc = cli_tl_device(snap, name, ta, &dev);
  if (rc != CLI_OK) return rc;
  size_t n = dev < snap->ndevices ? snap->devices[dev].ntrace : 0;
  size_t first = 0, last = SIZE_MAX;
  ms_snapshot_t *at_last = NULL;
  if (ta->has_range) {
    ms_timeline_t *tl = NULL;
    if ((rc = cli_tl_open(snap, name, ta, &tl)) != CLI_OK) return rc;
    if ((rc = cli_tl_steps(tl, name, ta, dev, &first, &last)) != CLI_OK) {
      ms_timeline_destroy(tl);
      return rc;
    }
    int err = last < n ? ms_timeline_snapshot_at(tl, dev, last, NULL, &at_last) : MS_OK;
    ms_timeline_destroy(tl); /* at_last borrows from snap, not from the index */
    if (err != MS_OK) {
      cli_error("out of memory");
      return CLI_FAILURE;
    }
  }
  ms_tlv_t v;
  ms_tlv_budget_t bud = {0}; /* exact (PyTorch's data) or refused past MS_TLV_BUDGET_BYTES */
  int err = ms_tlv_compute_budget(snap, dev, segments, max_entries, first, last, at_last, &bud, &v);
  ms_snapshot_free(at_last);
  if (err == MS_ELIMIT && bud.exact_bytes > bud.bytes) {
    char nb[CLI_BYTES_BUFSZ], lb[CLI_BYTES_BUFSZ];
    cli_error("'%s': device %zu: the timeline data would take %s, past its limit of %s "
              "(docs/timeline.md); --max-entries %zu or fewer fits",
              name, dev, cli_format_bytes_double((double)bud.exact_bytes, nb),
              cli_format_bytes((int64_t)bud.bytes, lb), bud.fits_entries);
    return CLI_FAILURE;
  }
  if (err == MS_ELIMIT) {
    cli_error("'%s': device %zu: cannot compute the timeline: more than 2^32 elements, or a size "
              "or the memory alive at once of 2^62 bytes (4 EiB) or more, which no device has",
              name, dev);
    return CLI_FAILURE;
  }
  if (err != MS_OK) {
    cli_error("'%s': cannot compute the timeline: %s", name, ms_strerror(err));
    return CLI_FAILURE;
  }
  cli_out_t o;
  if ((rc = cli_out_open(&o, "-")) != CLI_OK) {
    ms_tlv_release(&v);
    return rc;
  }
  err = ms_tlv_write_json(&v, &o.sink);
  ms_tlv_release(&v);
  if (err != MS_OK) {
    cli_out_abort(&o);
    cli_error("cannot write the timeline: %s", ms_strerror(err));
    return CLI_FAILURE;
  }
  return cli_out_commit(&o);
}

static void timeline_bytes(FILE *out, uint64_t v) {
  char b[CLI_BYTES_BUFSZ];
  fprintf(out, "%s (%" PRIu64 " bytes)", cli_format_bytes((int64_t)v, b), v);
}

/* The peak of one metric and the stacks that held the most then. */
static int timeline_peak(FILE *out, const ms_timeline_t *tl, size_t dev, ms_tl_metric m,
                         size_t from, size_t to, const ms_tl_filter_t *filter) {
  ms_tl_peak_t p;
  if (ms_timeline_peak(tl, dev, m, from, to, &p) != MS_OK) return CLI_OK;
  char when[200];
  cli_moment_text(tl, dev, p.step, when, sizeof when);
  fprintf(out, "  peak %s: ", ms_tl_metric_name(m));
  timeline_bytes(out, p.bytes);
  fprintf(out, "\n    %s\n", when);
  ms_snapshot_t *at = NULL;
  if (ms_timeline_snapshot_at(tl, dev, p.step, filter, &at) != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  cli_top_t top;
  if (cli_top_compute(at, CLI_TOP_STACK, &top) != MS_OK) {
    ms_snapshot_free(at);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  fprintf(out, "    top stacks alive then (allocated bytes, blocks, innermost frame):\n");
  for (size_t i = 0; i < top.nitems && i < 5; i++) {
    char label[512], b[CLI_BYTES_BUFSZ];
    cli_top_label(at, &top, i, label, sizeof label);
    fprintf(out, "      %10s %6" PRIu64 "  %s\n",
            cli_format_bytes((int64_t)top.items[i].bytes, b), top.items[i].count, label);
  }
  if (top.nitems == 0) fprintf(out, "      (no allocated block)\n");
  cli_top_release(&top);
  ms_snapshot_free(at);
  return CLI_OK;
}

/* One line per `oom` entry of the device (within the range): the request, and what the device
 * said then. */
static void timeline_ooms(FILE *out, const ms_timeline_t *tl, size_t dev, size_t from, size_t to) {
  const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
  size_t n = ms_snapshot_oom_count(snap, dev);
  for (size_t k = 0; k < n; k++) {
    ms_tl_oom_t o;
    if (ms_snapshot_oom_at(snap, dev, k, &o) != MS_OK) break;
    if (o.entry < from || o.entry >= to) continue;
    char when[200], a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ];
    cli_moment_text(tl, dev, o.entry + 1, when, sizeof when);
    fprintf(out, "  out of memory (--at oom:%zu): %s requested on stream %" PRIu64 ", %s\n", k + 1,
            cli_format_ubytes(o.request, a), o.stream, when);
    if (o.has_device_free)
      fprintf(out, "    %s free on the device, %s reserved by the allocator then\n",
              cli_format_ubytes(o.device_free, a), cli_format_ubytes(o.reserved, b));
    else
      fprintf(out, "    the entry does not say how much the device had free (no device_free)\n");
  }
  if (n > 0)
    fprintf(out, "    (memsnap explain says why, and which setting would have avoided it)\n");
}

/* --steps: the peak of each ProfilerStep#N range, and the step of the whole range's peak. */
static int timeline_steps(FILE *out, const ms_timeline_t *tl, size_t dev, size_t from,
                          size_t to) {
  ms_tl_ranges_t rs;
  if (ms_tl_ranges_build(ms_timeline_snapshot(tl), &rs) != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  ms_tl_peak_t whole;
  bool has_whole = ms_timeline_peak(tl, dev, MS_TL_ALLOCATED, from, to, &whole) == MS_OK;
  size_t nsteps = 0;
  int64_t peak_step = -1;
  for (size_t i = 0; i < rs.n; i++) {
    const ms_tl_range_t *x = &rs.ranges[i];
    if (x->step < 0 || (x->device != (int64_t)dev && ms_tl_ranges_step(&rs, (int64_t)dev,
                                                                       x->step)))
      continue;
    size_t lo, hi;
    ms_errbuf_t eb = {{0}};
    if (ms_timeline_step_range(tl, dev, x->step, &lo, &hi, &eb) != MS_OK) {
      fprintf(out, "  steps: %s\n", eb.msg);
      ms_tl_ranges_release(&rs);
      return CLI_OK;
    }
    if (nsteps++ == 0)
      fprintf(out, "  steps (ProfilerStep#N annotations):\n    %6s  %-17s %12s %10s %12s\n",
              "step", "entries", "peak alloc", "at entry", "peak reserv");
    char ent[48], a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ];
    if (hi > lo) snprintf(ent, sizeof ent, "%zu-%zu", lo, hi - 1);
    else snprintf(ent, sizeof ent, "(none)");
    ms_tl_peak_t pa, pr;
    if (hi > lo && ms_timeline_peak(tl, dev, MS_TL_ALLOCATED, lo + 1, hi, &pa) == MS_OK &&
        ms_timeline_peak(tl, dev, MS_TL_RESERVED, lo + 1, hi, &pr) == MS_OK)
      fprintf(out, "    %6" PRId64 "  %-17s %12s %10" PRId64 " %12s%s\n", x->step, ent,
              cli_format_ubytes(pa.bytes, a), pa.entry, cli_format_ubytes(pr.bytes, b),
              x->has_end ? "" : "  (no END: runs to the end of the trace)");
    else
      fprintf(out, "    %6" PRId64 "  %-17s %12s %10s %12s\n", x->step, ent, "-", "-", "-");
    if (has_whole && whole.step > lo && whole.step <= hi && peak_step < 0) peak_step = x->step;
  }
  if (nsteps == 0)
    fprintf(out, "  steps: none (no ProfilerStep#N annotation: record with the profiler running, "
            "or wrap each step in torch.profiler.record_function)\n");
  else if (peak_step >= 0)
    fprintf(out, "    the peak of allocated memory is in step %" PRId64 "\n", peak_step);
  else if (has_whole)
    fprintf(out, "    the peak of allocated memory is outside every step\n");
  if (rs.unmatched_ends || rs.unknown_stages)
    fprintf(out, "    (%zu END annotation%s without a START, %zu of another stage: ignored)\n",
            rs.unmatched_ends, rs.unmatched_ends == 1 ? "" : "s", rs.unknown_stages);
  ms_tl_ranges_release(&rs);
  return CLI_OK;
}

/* One device's part of the text (or of --by category's JSON). */
static int timeline_device(FILE *out, const ms_snapshot_t *snap, const char *name,
                           const cli_tl_args_t *ta, const ms_timeline_t *tl, const ms_attr_t *a,
                           size_t dev, bool json, bool steps, bool *any_segment, bool *first);

static int timeline_text(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                         bool by_category, const char *rules, bool json, bool steps) {
  ms_timeline_t *tl = NULL;
  int rc;
  size_t only = SIZE_MAX;
  if (ta->has_device) {
    if ((rc = cli_tl_device(snap, name, ta, &only)) != CLI_OK) return rc;
  } else if (ms_tl_viewer_devices(snap, NULL, 0, NULL) == 0) {
    cli_error("'%s': no device has a trace or segments: nothing to show", name);
    return CLI_FAILURE;
  }
  if ((rc = cli_tl_open(snap, name, ta, &tl)) != CLI_OK) return rc;
  FILE *out = stdout;
  bool any_segment = false;
  ms_attr_t *a = NULL;
  if (by_category) rc = cli_attr_open(snap, tl, rules, &a);
  bool first = true;
  if (rc == CLI_OK && json) fputc('[', out);
  for (size_t dev = 0; dev < ms_timeline_ndevices(tl) && rc == CLI_OK; dev++) {
    if (only != SIZE_MAX && dev != only) continue;
    rc = timeline_device(out, snap, name, ta, tl, a, dev, json, steps, &any_segment, &first);
  }
  if (rc == CLI_OK && json) fputs("]\n", out);
  ms_attr_destroy(a);
  if (rc == CLI_OK && !any_segment && (ta->filter.has_stream || ta->filter.has_pool)) {
    cli_error("'%s': no segment matches the filter (--stream/--pool) at any moment", name);
    rc = CLI_FAILURE;
  }
  ms_timeline_destroy(tl);
  return rc;
}

static int timeline_device(FILE *out, const ms_snapshot_t *snap, const char *name,
                           const cli_tl_args_t *ta, const ms_timeline_t *tl, const ms_attr_t *a,
                           size_t dev, bool json, bool steps, bool *any_segment, bool *first) {
  int rc = CLI_OK;
  {
    size_t n = ms_timeline_nentries(tl, dev);
    const uint64_t *res = ms_timeline_series(tl, dev, MS_TL_RESERVED);
    bool has_seg = false;
    for (size_t i = 0; i < snap->nsegments && !has_seg; i++)
      has_seg = snap->segments[i].device == (int64_t)dev;
    if (n == 0 && !has_seg) return CLI_OK;
    size_t from, to;
    if ((rc = cli_tl_steps(tl, name, ta, dev, &from, &to)) != CLI_OK) return rc;
    for (size_t s = from; s <= to && !*any_segment; s++) *any_segment = res[s] > 0;
    if (json) {
      if (!*first) fputc(',', out);
      *first = false;
      return cli_timeline_categories(out, tl, a, dev, from, to, true);
    }
    fprintf(out, "device %zu: %zu trace entries", dev, n);
    if (ta->has_range) fprintf(out, ", showing entries %zu to %zu", from, to ? to - 1 : 0);
    fputc('\n', out);
    const ms_snap_trace_t *fe = NULL, *le = NULL;
    for (size_t i = from; i < to; i++) {
      const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
      if (!(e->present & MS_TRACE_HAS_TIME)) continue;
      if (!fe) fe = e;
      le = e;
    }
    if (fe) {
      char t1[96], t2[96];
      cli_format_time(fe, t1, sizeof t1);
      cli_format_time(le, t2, sizeof t2);
      fprintf(out, "  first entry: %s\n  last entry:  %s\n  duration: %.6f s\n", t1, t2,
              ((double)le->time_us - (double)fe->time_us) / 1e6); /* no int64_t overflow */
    } else if (to > from) {
      fprintf(out, "  (the entries have no timestamps)\n");
    }
    const ms_tl_filter_t *f =
        ta->filter.has_stream || ta->filter.has_pool ? &ta->filter : NULL;
    rc = timeline_peak(out, tl, dev, MS_TL_ALLOCATED, from, to, f);
    if (rc == CLI_OK) rc = timeline_peak(out, tl, dev, MS_TL_RESERVED, from, to, f);
    if (rc == CLI_OK && a) rc = cli_timeline_categories(out, tl, a, dev, from, to, false);
    if (rc != CLI_OK) return rc;
    timeline_ooms(out, tl, dev, from, to);
    if (steps && (rc = timeline_steps(out, tl, dev, from, to)) != CLI_OK) return rc;
    fprintf(out, "  %s:\n", to == n ? "final state (the snapshot)" : "state at the end of the range");
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
      fprintf(out, "    %-10s ", ms_tl_metric_name((ms_tl_metric)m));
      timeline_bytes(out, ms_timeline_series(tl, dev, (ms_tl_metric)m)[to]);
      fputc('\n', out);
    }
    if (from > 0 || !ta->has_range) {
      fprintf(out, "  before the first entry shown: allocated ");
      timeline_bytes(out, ms_timeline_series(tl, dev, MS_TL_ALLOCATED)[from]);
      fprintf(out, ", reserved ");
      timeline_bytes(out, res[from]);
      fputc('\n', out);
    }
  }
  return rc;
}

int cmd_timeline(int argc, char **argv) {
  int json = 0, segments = 0, steps = 0, keep_going = 0;
  const char *max_entries_s = NULL, *device_s = NULL, *range_s = NULL, *stream_s = NULL,
             *pool_s = NULL, *jobs_s = NULL, *by_s = NULL, *rules_s = NULL, *sums_s = NULL;
  const struct cli_opt opts[] = {{"json", 0, &json, NULL},
                                 {"by", 0, NULL, &by_s},
                                 {"categories", 0, NULL, &rules_s},
                                 {"jobs", 0, NULL, &jobs_s},
                                 {"keep-going", 0, &keep_going, NULL},
                                 {"from-summaries", 0, NULL, &sums_s},
                                 {"segments", 0, &segments, NULL},
                                 {"steps", 0, &steps, NULL},
                                 {"max-entries", 0, NULL, &max_entries_s},
                                 {"device", 0, NULL, &device_s},
                                 {"range", 0, NULL, &range_s},
                                 {"stream", 0, NULL, &stream_s},
                                 {"pool", 0, NULL, &pool_s},
                                 {NULL, 0, NULL, NULL}};
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (!pos) return CLI_FAILURE;
  int npos = 0;
  int rc = cli_parse_options("timeline", timeline_usage, opts, argc, argv, pos, argc, &npos);
  if (rc == CLI_OK && sums_s) { /* the rows of `memsnap summary --json`, one file per rank */
    if (npos || segments || steps || max_entries_s || device_s || range_s || stream_s ||
        pool_s || by_s || rules_s || jobs_s)
      rc = cli_usage_error("timeline", "with --from-summaries only --json and --keep-going apply");
    else
      rc = cli_ranks_from_summaries(sums_s, json != 0, keep_going != 0);
    free(pos);
    return rc;
  }
  if (rc == CLI_OK && cli_ranks_wanted(pos, npos)) { /* many ranks (cli/ranks.c) */
    if (segments || steps || max_entries_s || device_s || range_s || stream_s || pool_s || by_s ||
        rules_s)
      rc = cli_usage_error("timeline",
                           "with several FILEs only --json, --jobs and --keep-going apply");
    else
      rc = cli_ranks("timeline", pos, npos, json != 0, jobs_s, keep_going != 0);
    free(pos);
    return rc;
  }
  char *file = npos > 0 ? pos[0] : NULL;
  free(pos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (!file) return cli_usage_error("timeline", "missing FILE");
  if (jobs_s) return cli_usage_error("timeline", "option '--jobs' needs several FILEs");
  if (keep_going)
    return cli_usage_error("timeline", "option '--keep-going' needs several FILEs");
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse("timeline", &ta, device_s, range_s, stream_s, pool_s, NULL)) !=
      CLI_OK)
    return rc;
  size_t max_entries = SIZE_MAX;
  if (max_entries_s) {
    uint64_t v;
    if (!cli_parse_u64(max_entries_s, &v))
      return cli_usage_error("timeline", "option '--max-entries' needs a number, not '%s'",
                             max_entries_s);
    max_entries = (size_t)v;
  }
  if (by_s && strcmp(by_s, "category") != 0)
    return cli_usage_error("timeline", "option '--by' takes only 'category', not '%s'", by_s);
  if (rules_s && !by_s)
    return cli_usage_error("timeline", "option '--categories' needs '--by category'");
  if (by_s && (segments || max_entries_s || stream_s || pool_s))
    return cli_usage_error("timeline", "option '--by category' counts every segment and is not "
                           "the viewer's data: no --segments, --max-entries, --stream, --pool");
  if (json && steps)
    return cli_usage_error("timeline", "option '--steps' does not apply to '--json'");
  if (!json && (segments || max_entries_s))
    return cli_usage_error("timeline", "options '--segments' and '--max-entries' need '--json'");
  if (json && (stream_s || pool_s))
    return cli_usage_error("timeline",
                           "options '--stream' and '--pool' do not apply to '--json' (the "
                           "viewer's data covers the whole device)");

  ms_snapshot_t *snap = NULL;
  /* the trace is read through the time index, which never uses free_requested's stacks */
  if ((rc = cli_load_ex(file, MS_LOAD_NO_FREE_STACKS, &snap)) != CLI_OK) return rc;
  const char *name = cli_display_name(file);
  if (json && !by_s)
    rc = timeline_json(snap, name, &ta, segments != 0, max_entries);
  else
    rc = timeline_text(snap, name, &ta, by_s != NULL, rules_s, json != 0, steps != 0);
  ms_snapshot_free(snap);
  return rc;
}
