/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap timeline FILE` (issue #12 §2): memory over time.
 *
 * Text (default): per device, the number of trace entries, the first and last timestamps, the
 * peak of allocated bytes (bytes, entry, time, the biggest stacks alive then), the peak of
 * reserved bytes likewise, each out-of-memory error, with --steps the peak of each step, and the
 * final state (cli/timeline-report.c computes them once); `--json` the same as one JSON
 * document. `--viewer-data` prints exactly the data PyTorch's web viewer computes for its
 * "Active Memory Timeline" (`--segments`: "Active Cached Segment Timeline"), see
 * memsnap/timeline.h; `--json` printed that before, and still does in this release when given
 * `--segments` or `--max-entries` or MEMSNAP_TIMELINE_JSON=viewer, with a warning. The report's
 * answer is stored in the snapshot cache, and a second run of the same question on the same bytes
 * prints it (cli/answers.c, docs/performance.md).
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/timeline.h"

static const char timeline_usage[] =
    "usage: memsnap timeline FILE [--json] [--steps] [--device N] [--range RANGE]\n"
    "                        [--stream S] [--pool A,B] [--by category]\n"
    "       memsnap timeline FILE --viewer-data [--segments] [--max-entries N] [--device N]\n"
    "                        [--range RANGE]\n"
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
    "  --json             print the same as one JSON document (docs/timeline.md)\n"
    "  --viewer-data      print the data of PyTorch's viewer \"Active Memory Timeline\" (one\n"
    "                     device: the viewer's default, or --device) as JSON; '--json' printed\n"
    "                     it before, and still does in this release with '--segments',\n"
    "                     '--max-entries' or MEMSNAP_TIMELINE_JSON=viewer (with a warning)\n"
    "  --segments         with --viewer-data: the \"Active Cached Segment Timeline\" instead\n"
    "  --max-entries N    with --viewer-data: draw only the N largest allocations on their\n"
    "                     own, the rest as one \"summarized\" band (the viewer's default is\n"
    "                     15000); without it nothing is summarized\n"
    "  --steps            the peak of each step (ProfilerStep#N annotations) and the step of\n"
    "                     the peak\n"
    "  -d, --device N     only device N\n"
    "  --range A:B        only trace entries A to B (inclusive; either may be omitted);\n"
    "                     t=T0:T1: the entries whose time_us lies in [T0, T1];\n"
    "                     step=N[:M]: the entries of step N (to M) (ProfilerStep#N);\n"
    "                     a pickle is then read for the range only (docs/cli.md)\n"
    "  --stream S         count only segments of stream S (raw handle, decimal or 0x..)\n"
    "  --pool A,B         count only segments of private pool (A, B); 0,0 = default\n"
    "  --by category      also the allocated bytes of each category at the peak, and each\n"
    "                     category's own peak (docs/categories.md)\n"
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

static int timeline_viewer_data(const ms_snapshot_t *snap, const char *name,
                                const cli_tl_args_t *ta, bool segments, size_t max_entries) {
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
static void text_peak(FILE *out, const ms_timeline_t *tl, size_t dev, ms_tl_metric m,
                      const cli_tl_peak_t *pk) {
  if (!pk->has) return;
  char when[200];
  cli_moment_text(tl, dev, pk->p.step, when, sizeof when);
  fprintf(out, "  peak %s: ", ms_tl_metric_name(m));
  timeline_bytes(out, pk->p.bytes);
  fprintf(out, "\n    %s\n", when);
  fprintf(out, "    top stacks alive then (allocated bytes, blocks, innermost frame):\n");
  for (size_t i = 0; i < pk->nstacks; i++) {
    char b[CLI_BYTES_BUFSZ];
    fprintf(out, "      %10s %6" PRIu64 "  %s\n", cli_format_bytes((int64_t)pk->stacks[i].bytes, b),
            pk->stacks[i].blocks, pk->stacks[i].label);
  }
  if (pk->nstacks == 0) fprintf(out, "      (no allocated block)\n");
}

/* More `oom` entries than this in the range: the text shows the first and the last
 * TEXT_OOMS_EACH_END of them, and says how many it left out (--json lists every one). */
#define TEXT_OOMS_MAX 10
#define TEXT_OOMS_EACH_END 5

/* One line per `oom` entry of the device (within the range): the request, and what the device
 * said then; of a run that failed and retried thousands of times, the first and the last. */
static void text_ooms(FILE *out, const ms_timeline_t *tl, const cli_tl_report_t *r) {
  bool cut = r->nooms > TEXT_OOMS_MAX;
  if (cut)
    fprintf(out,
            "  out of memory %zu times (the first %d and the last %d below; --json lists "
            "every one)\n",
            r->nooms, TEXT_OOMS_EACH_END, TEXT_OOMS_EACH_END);
  for (size_t k = 0; k < r->nooms; k++) {
    if (cut && k == TEXT_OOMS_EACH_END) {
      size_t last = r->nooms - TEXT_OOMS_EACH_END;
      fprintf(out, "  ... %zu more (--at oom:%zu to oom:%zu)\n", last - k, r->oom_n[k],
              r->oom_n[last - 1]);
      k = last;
    }
    const ms_tl_oom_t *o = &r->ooms[k];
    char when[200], a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ];
    cli_moment_text(tl, r->dev, o->entry + 1, when, sizeof when);
    fprintf(out, "  out of memory (--at oom:%zu): %s requested on stream %" PRIu64 ", %s\n",
            r->oom_n[k], cli_format_ubytes(o->request, a), o->stream, when);
    if (o->has_device_free)
      fprintf(out, "    %s free on the device, %s reserved by the allocator then\n",
              cli_format_ubytes(o->device_free, a), cli_format_ubytes(o->reserved, b));
    else
      fprintf(out, "    the entry does not say how much the device had free (no device_free)\n");
  }
  if (r->noom_all > 0)
    fprintf(out, "    (memsnap explain says why, and which setting would have avoided it)\n");
}

/* --steps: the peak of each ProfilerStep#N range, and the step of the whole range's peak. */
static void text_steps(FILE *out, const cli_tl_report_t *r) {
  for (size_t i = 0; i < r->nsteps; i++) {
    const cli_tl_step_t *st = &r->steps[i];
    if (i == 0)
      fprintf(out, "  steps (ProfilerStep#N annotations):\n    %6s  %-17s %12s %10s %12s\n",
              "step", "entries", "peak alloc", "at entry", "peak reserv");
    char ent[48], a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ];
    if (st->hi > st->lo) snprintf(ent, sizeof ent, "%zu-%zu", st->lo, st->hi - 1);
    else snprintf(ent, sizeof ent, "(none)");
    if (st->has_peaks)
      fprintf(out, "    %6" PRId64 "  %-17s %12s %10" PRId64 " %12s%s\n", st->step, ent,
              cli_format_ubytes(st->allocated.bytes, a), st->allocated.entry,
              cli_format_ubytes(st->reserved.bytes, b),
              st->has_end ? "" : "  (no END: runs to the end of the trace)");
    else
      fprintf(out, "    %6" PRId64 "  %-17s %12s %10s %12s\n", st->step, ent, "-", "-", "-");
  }
  if (r->steps_error[0]) {
    fprintf(out, "  steps: %s\n", r->steps_error);
    return;
  }
  if (r->nsteps == 0)
    fprintf(out, "  steps: none (no ProfilerStep#N annotation: record with the profiler running, "
            "or wrap each step in torch.profiler.record_function)\n");
  else if (r->peak_step >= 0)
    fprintf(out, "    the peak of allocated memory is in step %" PRId64 "\n", r->peak_step);
  else if (r->has_whole_peak)
    fprintf(out, "    the peak of allocated memory is outside every step\n");
  if (r->unmatched_ends || r->unknown_stages)
    fprintf(out, "    (%zu END annotation%s without a START, %zu of another stage: ignored)\n",
            r->unmatched_ends, r->unmatched_ends == 1 ? "" : "s", r->unknown_stages);
}

/* One device's text. */
static int text_device(FILE *out, const ms_timeline_t *tl, const ms_attr_t *a,
                       const cli_tl_report_t *r) {
  fprintf(out, "device %zu: %zu trace entries", r->dev, r->nentries);
  if (r->has_range) fprintf(out, ", showing entries %zu to %zu", r->from, r->to ? r->to - 1 : 0);
  fputc('\n', out);
  if (r->first) {
    char t1[96], t2[96];
    cli_format_time(r->first, t1, sizeof t1);
    cli_format_time(r->last, t2, sizeof t2);
    fprintf(out, "  first entry: %s\n  last entry:  %s\n  duration: %.6f s\n", t1, t2,
            ((double)r->last->time_us - (double)r->first->time_us) / 1e6); /* no overflow */
  } else if (r->to > r->from) {
    fprintf(out, "  (the entries have no timestamps)\n");
  }
  text_peak(out, tl, r->dev, MS_TL_ALLOCATED, &r->peaks[0]);
  text_peak(out, tl, r->dev, MS_TL_RESERVED, &r->peaks[1]);
  if (a && cli_timeline_categories(out, NULL, tl, a, r->dev, r->from, r->to) != CLI_OK)
    return CLI_FAILURE;
  text_ooms(out, tl, r);
  if (r->steps_wanted) text_steps(out, r);
  fprintf(out, "  %s:\n",
          r->to == r->nentries ? "final state (the snapshot)" : "state at the end of the range");
  for (int m = 0; m < MS_TL_METRIC_COUNT; m++) {
    fprintf(out, "    %-10s ", ms_tl_metric_name((ms_tl_metric)m));
    timeline_bytes(out, r->state[m]);
    fputc('\n', out);
  }
  if (r->has_before) {
    fprintf(out, "  before the first entry shown: allocated ");
    timeline_bytes(out, r->before_allocated);
    fprintf(out, ", reserved ");
    timeline_bytes(out, r->before_reserved);
    fputc('\n', out);
  }
  return CLI_OK;
}

/* The device's report, as text on out or as an element of the JSON's "devices" (j). */
static int timeline_device(FILE *out, cli_json_t *j, const ms_snapshot_t *snap,
                           const char *name, const cli_tl_args_t *ta, const ms_timeline_t *tl,
                           const ms_attr_t *a, size_t dev, bool steps, bool *any_segment,
                           bool *first) {
  size_t n = ms_timeline_nentries(tl, dev);
  bool has_seg = false;
  for (size_t i = 0; i < snap->nsegments && !has_seg; i++)
    has_seg = snap->segments[i].device == (int64_t)dev;
  if (n == 0 && !has_seg) return CLI_OK;
  size_t from, to;
  int rc = cli_tl_steps(tl, name, ta, dev, &from, &to);
  if (rc != CLI_OK) return rc;
  ms_tl_peak_t res; /* reserved above 0 at some step shown */
  if (!*any_segment && ms_timeline_peak(tl, dev, MS_TL_RESERVED, from, to, &res) == MS_OK)
    *any_segment = res.bytes > 0;
  const ms_tl_filter_t *f = ta->filter.has_stream || ta->filter.has_pool ? &ta->filter : NULL;
  cli_tl_report_t r;
  if ((rc = cli_tl_report(tl, dev, from, to, ta->has_range, f, steps, &r)) != CLI_OK) return rc;
  if (j) {
    cli_json_lit(j, *first ? "\n " : ",\n ");
    *first = false;
    rc = cli_tl_report_json(j, &r, tl, a);
  } else {
    rc = text_device(out, tl, a, &r);
  }
  cli_tl_report_release(&r);
  return rc;
}

/* The JSON document in memory until every device is done: an error on a later device must not
 * leave a partial document on standard output. */
typedef struct timeline_buf_s {
  char *p;
  size_t n, cap;
} timeline_buf_t;

static int timeline_buf_write(void *ctx, const char *s, size_t len) {
  timeline_buf_t *b = ctx;
  if (len > b->cap - b->n) {
    size_t nc = b->cap ? b->cap : 4096;
    while (nc - b->n < len) {
      if (nc > SIZE_MAX / 2) return MS_ENOMEM;
      nc *= 2;
    }
    char *np = realloc(b->p, nc);
    if (!np) return MS_ENOMEM;
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, s, len);
  b->n += len;
  return MS_OK;
}

/* Writes the finished document to out: standard output through cli_out_t, or the stream of a
 * stored answer (which writes through to standard output). @return CLI_OK or CLI_FAILURE
 * (printed). */
static int timeline_buf_flush(FILE *out, const timeline_buf_t *b, int err) {
  if (err != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  if (out != stdout) {
    (void)!fwrite(b->p, 1, b->n, out); /* a failed write to stdout is main's to report */
    return CLI_OK;
  }
  cli_out_t o;
  int rc = cli_out_open(&o, "-");
  if (rc != CLI_OK) return rc;
  if ((err = o.sink.write(o.sink.ctx, b->p, b->n)) != MS_OK) return cli_out_fail(&o, err, NULL);
  return cli_out_commit(&o);
}

/* The text, or with json its content as one JSON document (docs/timeline.md), on out. */
static int timeline_report(FILE *out, const ms_snapshot_t *snap, const char *name,
                           const cli_tl_args_t *ta, bool by_category, const char *rules, bool json,
                           bool steps) {
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
  bool any_segment = false, first = true;
  ms_attr_t *a = NULL;
  if (by_category) rc = cli_attr_open(snap, tl, rules, &a);
  timeline_buf_t buf = {NULL, 0, 0};
  ms_sink_t sink = {timeline_buf_write, &buf};
  cli_json_t j = {NULL, MS_OK};
  if (json) {
    j.sink = &sink;
    cli_json_lit(&j, "{\"command\": \"timeline\", \"file\": ");
    cli_json_str(&j, name);
    cli_json_lit(&j, ", \"devices\": [");
  }
  for (size_t dev = 0; dev < ms_timeline_ndevices(tl) && rc == CLI_OK; dev++) {
    if (only != SIZE_MAX && dev != only) continue;
    rc = timeline_device(out, j.sink ? &j : NULL, snap, name, ta, tl, a, dev, steps,
                         &any_segment, &first);
  }
  ms_attr_destroy(a);
  if (rc == CLI_OK && !any_segment && (ta->filter.has_stream || ta->filter.has_pool)) {
    cli_error("'%s': no segment matches the filter (--stream/--pool) at any moment", name);
    rc = CLI_FAILURE;
  }
  ms_timeline_destroy(tl);
  if (json && rc == CLI_OK) {
    cli_json_lit(&j, "\n]}\n");
    rc = timeline_buf_flush(out, &buf, j.err);
  }
  free(buf.p);
  return rc;
}

/* The options of one FILE, as given. */
typedef struct timeline_opts_s {
  int json, viewer_data, segments, steps;
  const char *max_entries_s, *stream_s, *pool_s, *by_s, *rules_s;
} timeline_opts_t;

/* Checks the combinations of options for one FILE and settles which output is asked for:
 * *viewer (the viewer's data: --viewer-data, or, for this release, --json in its earlier
 * meaning, with a warning). @return CLI_OK or CLI_USAGE (printed). */
static int timeline_check(const timeline_opts_t *t, bool *viewer) {
  const char *env = getenv("MEMSNAP_TIMELINE_JSON");
  if (t->by_s && strcmp(t->by_s, "category") != 0)
    return cli_usage_error("timeline", "option '--by' takes only 'category', not '%s'", t->by_s);
  if (t->rules_s && !t->by_s)
    return cli_usage_error("timeline", "option '--categories' needs '--by category'");
  if (t->by_s && (t->viewer_data || t->segments || t->max_entries_s || t->stream_s || t->pool_s))
    return cli_usage_error("timeline", "option '--by category' counts every segment and is not "
                           "the viewer's data: no --viewer-data, --segments, --max-entries, "
                           "--stream, --pool");
  if (t->json && t->viewer_data)
    return cli_usage_error("timeline", "options '--json' and '--viewer-data' exclude each other");
  *viewer = t->viewer_data != 0;
  if (t->json && (t->segments || t->max_entries_s)) { /* the form before --viewer-data */
    cli_warning("'--json' with '--segments' or '--max-entries' prints the viewer's data as "
                "before, in this release only: use '--viewer-data' (docs/timeline.md)");
    *viewer = true;
  } else if (t->json && env && strcmp(env, "viewer") == 0) {
    cli_warning("MEMSNAP_TIMELINE_JSON=viewer: '--json' prints the viewer's data as before, in "
                "this release only: use '--viewer-data' (docs/timeline.md)");
    *viewer = true;
  }
  if (!*viewer && (t->segments || t->max_entries_s))
    return cli_usage_error("timeline",
                           "options '--segments' and '--max-entries' need '--viewer-data'");
  if (*viewer && t->steps)
    return cli_usage_error("timeline", "option '--steps' does not apply to '--viewer-data'");
  if (*viewer && (t->stream_s || t->pool_s))
    return cli_usage_error("timeline",
                           "options '--stream' and '--pool' do not apply to '--viewer-data' (the "
                           "viewer's data covers the whole device)");
  return CLI_OK;
}

int cmd_timeline(int argc, char **argv) {
  timeline_opts_t t = {0};
  int keep_going = 0;
  const char *device_s = NULL, *range_s = NULL, *jobs_s = NULL, *sums_s = NULL;
  const struct cli_opt opts[] = {{"json", 0, &t.json, NULL},
                                 {"viewer-data", 0, &t.viewer_data, NULL},
                                 {"by", 0, NULL, &t.by_s},
                                 {"categories", 0, NULL, &t.rules_s},
                                 {"jobs", 0, NULL, &jobs_s},
                                 {"keep-going", 0, &keep_going, NULL},
                                 {"from-summaries", 0, NULL, &sums_s},
                                 {"segments", 0, &t.segments, NULL},
                                 {"steps", 0, &t.steps, NULL},
                                 {"max-entries", 0, NULL, &t.max_entries_s},
                                 {"device", 0, NULL, &device_s},
                                 {"range", 0, NULL, &range_s},
                                 {"stream", 0, NULL, &t.stream_s},
                                 {"pool", 0, NULL, &t.pool_s},
                                 {NULL, 0, NULL, NULL}};
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (!pos) return CLI_FAILURE;
  int npos = 0;
  int rc = cli_parse_options("timeline", timeline_usage, opts, argc, argv, pos, argc, &npos);
  bool one_file_opts = t.viewer_data || t.segments || t.steps || t.max_entries_s || device_s ||
                       range_s || t.stream_s || t.pool_s || t.by_s || t.rules_s;
  if (rc == CLI_OK && sums_s) { /* the rows of `memsnap summary --json`, one file per rank */
    if (npos || one_file_opts || jobs_s)
      rc = cli_usage_error("timeline", "with --from-summaries only --json and --keep-going apply");
    else
      rc = cli_ranks_from_summaries(sums_s, t.json != 0, keep_going != 0);
    free(pos);
    return rc;
  }
  if (rc == CLI_OK && cli_ranks_wanted(pos, npos)) { /* many ranks (cli/ranks.c) */
    if (one_file_opts)
      rc = cli_usage_error("timeline",
                           "with several FILEs only --json, --jobs and --keep-going apply");
    else
      rc = cli_ranks("timeline", pos, npos, t.json != 0, jobs_s, keep_going != 0);
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
  if ((rc = cli_tl_args_parse("timeline", &ta, device_s, range_s, t.stream_s, t.pool_s, NULL)) !=
      CLI_OK)
    return rc;
  size_t max_entries = SIZE_MAX;
  if (t.max_entries_s) {
    uint64_t v;
    if (!cli_parse_u64(t.max_entries_s, &v))
      return cli_usage_error("timeline", "option '--max-entries' needs a number, not '%s'",
                             t.max_entries_s);
    max_entries = (size_t)v;
  }
  bool viewer = false;
  if ((rc = timeline_check(&t, &viewer)) != CLI_OK) return rc;

  /* the report's answer through the cache (cli/answers.c): the options as given, and the name
   * the JSON prints; not for the viewer's data (large, and `view` stores its page), nor for a
   * --range that reads a window (never through the cache) */
  static const char *const names[8] = {"file", "by", "categories", "device", "range", "stream",
                                       "pool", "steps"};
  const char *const vals[8] = {cli_display_name(file), t.by_s, t.rules_s, device_s, range_s,
                               t.stream_s, t.pool_s, t.steps ? "1" : NULL};
  cli_answer_t c = {0};
  if (!viewer && !(range_s && !t.by_s)) {
    cli_answer_open(&c, "timeline", file, MS_LOAD_NO_FREE_STACKS, 8, names, vals, t.json != 0,
                    t.rules_s);
    if (cli_answer_serve(&c)) return CLI_OK;
  }
  ms_snapshot_t *snap = NULL;
  /* the trace is read through the time index, which never uses free_requested's stacks; for
   * --range's window unless categories are asked for (their phases need the whole trace). The
   * report needs the stacks of the blocks alive at its peaks only: the others are never read
   * (MS_LOAD_DEFER_STACKS; the categories read every allocation's frames from the file without
   * keeping its stack; the viewer's data needs them all) */
  unsigned flags = MS_LOAD_NO_FREE_STACKS | (viewer ? 0 : MS_LOAD_DEFER_STACKS);
  if (t.by_s) cli_classify_on_read(t.rules_s);
  if ((rc = cli_load_range(file, flags, t.by_s ? NULL : &ta, &snap)) != CLI_OK) {
    cli_answer_close(&c, rc, NULL);
    return rc;
  }
  const char *name = cli_display_name(file);
  if (viewer)
    rc = timeline_viewer_data(snap, name, &ta, t.segments != 0, max_entries);
  else
    rc = timeline_report(cli_answer_stream(&c), snap, name, &ta, t.by_s != NULL, t.rules_s,
                         t.json != 0, t.steps != 0);
  cli_answer_close(&c, rc, cli_cache_key(snap));
  ms_snapshot_free(snap);
  return rc;
}
