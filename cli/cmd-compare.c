/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap compare BEFORE AFTER` (issue #28, docs/compare.md).
 *
 * Default: what changed, explained (cli/compare-report.c over memsnap/compare.h): the totals
 * before, after and their change, the change by category and by source line, the settings that
 * differ, the leak suspects. Two directories: the ranks paired by name (cli/compare-ranks.c).
 * --segments: what `_memory_viz.py compare` was meant to do (its CLI always crashes, passing whole
 * snapshots where segment lists are expected): the segments only in BEFORE and only in AFTER,
 * keyed by (address, total_size), listed on stdout as sorted Python lists, and their blocks drawn
 * under `only_before;` and `only_after;` (memsnap/views.h); -o, --folded, --title, --width and
 * --minwidth ask for a graph, so without --stacks they imply --segments.
 * --stacks: one differential flame graph of both snapshots' memory views (stream, block state,
 * stack), each frame as wide as the larger of its sizes and coloured by its change.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"

static const char compare_usage[] =
    "usage: memsnap compare BEFORE AFTER [--at MOMENT [--at MOMENT]] [--device N] [-n N] [--json]\n"
    "       memsnap compare FILE --at MOMENT --at MOMENT [--device N] [-n N] [--json]\n"
    "       memsnap compare DIR_A DIR_B [--json] [--jobs N]\n"
    "       memsnap compare BEFORE AFTER --segments [-o OUT] [--folded | --json] [--jobs N]\n"
    "       memsnap compare BEFORE AFTER --stacks [-o OUT] [--folded | --json] [--jobs N]\n"
    "\n"
    "Explains what changed between two snapshots, or two moments of one: peak allocated, reserved\n"
    "and requested memory before, after and their change; at the moments, allocated, reserved,\n"
    "segments and blocks; the change in allocated bytes by category and by source line, largest\n"
    "first; the allocator settings that differ; and leak suspects: sources whose allocations made\n"
    "in each step (ProfilerStep#N) stay alive, by about the same amount every step. Two\n"
    "directories of per-rank files: the ranks paired by file name, and those whose change stands\n"
    "out. BEFORE and AFTER are memsnap snapshots or PyTorch pickles (one of them may be '-').\n"
    "\n"
    "With --segments (implied by -o, --folded, --title, --width, --minwidth without --stacks),\n"
    "lists the segments only in BEFORE and only in AFTER (by address and size; `only_before =\n"
    "[...]`, `only_after = [...]`, sorted) and draws their blocks under only_before; and\n"
    "only_after; as `_memory_viz.py compare` was meant to. With --stacks, draws one differential\n"
    "flame graph of both snapshots by stream, block state and stack: frames that grew, shrank,\n"
    "are new or are gone in four colours.\n"
    "\n"
    "options:\n"
    "  --at MOMENT       compare the state at MOMENT (peak, peak-reserved, end, oom, step=N, an\n"
    "                    entry index N, or a time t=MICROSECONDS / MICROSECONDSus): one --at\n"
    "                    applies to both files; two apply to BEFORE and AFTER, or to two moments\n"
    "                    of one FILE (default: each side's peak of allocated memory)\n"
    "  --device N        only device N (default: the device with the longest trace)\n"
    "  -n N              list the N sources that changed most (default 20)\n"
    "  --json            the report as JSON (with --segments/--stacks: the segment lists and the\n"
    "                    records of each side)\n"
    "  --jobs N          read N files at a time: two files at once with 2 or more, one after\n"
    "                    the other with 1 (half the memory); N at a time of two directories\n"
    "                    (default: two files at once when there are two cores and memory for\n"
    "                    both; one file per core of directories)\n"
    "  --segments        the segment diff of _memory_viz.py instead of the report\n"
    "  --stacks          a differential flame graph of all stacks instead of the report\n"
    "  -o, --output OUT  the graph's file ('-' = standard output; default: output.svg, and\n"
    "                    standard output with --folded; an SVG is not written to a terminal)\n"
    "  --folded          write folded stacks instead of an SVG (with --stacks: merged\n"
    "                    `STACK BEFORE AFTER` lines, as difffolded.pl writes them)\n"
    "  --range A:B       graphs with --at: peaks within trace entries A to B\n"
    "  --stream S        graphs: only segments of stream S; --pool A,B: only segments of pool (A, "
    "B)\n"
    "  --title TEXT      the SVG's title (default: the files, e.g.\n"
    "                    'compare \u2014 a.pickle \u2192 b.pickle')\n"
    "  --width PX        the SVG's width (default 1200)\n"
    "  --minwidth PX|N%  gather narrower frames into [N small frames] (default 0.1 px)\n"
    "  -h, --help        show this help\n";

typedef struct compare_arg_s {
  const ms_snapshot_t *before;
  const ms_snapshot_t *after;
} compare_arg_t;

static int compare_segments_view(void *arg, ms_view_emit_fn *emit, void *ctx, int *side) {
  (void)side;
  compare_arg_t *a = arg;
  return ms_view_compare_emit(a->before, a->after, emit, ctx);
}

static int compare_stacks_view(void *arg, ms_view_emit_fn *emit, void *ctx, int *side) {
  compare_arg_t *a = arg;
  *side = 0;
  int err = ms_view_emit(a->before, MS_VIEW_MEMORY, emit, ctx);
  if (err) return err;
  *side = 1;
  return ms_view_emit(a->after, MS_VIEW_MEMORY, emit, ctx);
}

/* The file name without its directories, for the graph's subtitle. */
static const char *compare_base(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash && slash[1] ? slash + 1 : path;
}

/* compare --json's own fields: the two files and, for the segment diff, the two lists. */
typedef struct compare_head_s {
  const char *before, *after;
  const ms_view_segdiff_t *d; /* NULL with --stacks */
} compare_head_t;

static void compare_json_list(cli_json_t *j, const char *name, const uint64_t *v, size_t n) {
  cli_json_lit(j, ", \"");
  cli_json_lit(j, name);
  cli_json_lit(j, "\": [");
  for (size_t i = 0; i < n; i++) {
    if (i) cli_json_lit(j, ", ");
    cli_json_u64(j, v[i]);
  }
  cli_json_lit(j, "]");
}

static void compare_json_head(cli_json_t *j, void *arg) {
  const compare_head_t *h = arg;
  cli_json_lit(j, ", \"view\": ");
  cli_json_str(j, h->d ? "segments" : "stacks");
  cli_json_lit(j, ", \"before\": ");
  cli_json_str(j, h->before);
  cli_json_lit(j, ", \"after\": ");
  cli_json_str(j, h->after);
  if (h->d) {
    compare_json_list(j, "only_before", h->d->only_before, h->d->n_before);
    compare_json_list(j, "only_after", h->d->only_after, h->d->n_after);
  }
}

static void compare_print_list(FILE *out, const char *name, const uint64_t *v, size_t n) {
  fprintf(out, "%s = [", name);
  for (size_t i = 0; i < n; i++) fprintf(out, i ? ", %" PRIu64 : "%" PRIu64, v[i]);
  fputs("]\n", out);
}

/* Takes every `--at X` / `--at=X` out of argv (at most two kept in at[]); @return their number,
 * or -1 when there are more than two or one lacks its value. */
static int compare_take_at(int *argc, char **argv, const char *at[2]) {
  int n = 0, k = 1;
  for (int i = 1; i < *argc; i++) {
    if (strcmp(argv[i], "--") == 0) { /* the rest is positional */
      while (i < *argc) argv[k++] = argv[i++];
      break;
    }
    const char *v = NULL;
    if (strcmp(argv[i], "--at") == 0) {
      if (i + 1 >= *argc) return -1;
      v = argv[++i];
    } else if (strncmp(argv[i], "--at=", 5) == 0) {
      v = argv[i] + 5;
    } else {
      argv[k++] = argv[i];
      continue;
    }
    if (n >= 2) return -1;
    at[n++] = v;
  }
  *argc = k;
  argv[k] = NULL;
  return n;
}

/* One side of the comparison: the file's snapshot, or its state at a moment (*view). */
static int compare_side(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *base,
                        const char *at, ms_snapshot_t **view) {
  cli_tl_args_t ta = *base;
  if (at) {
    ms_errbuf_t eb = {{0}};
    if (ms_tl_moment_parse(at, &ta.at, &eb) != MS_OK)
      return cli_usage_error("compare", "option '--at': %s", eb.msg);
    ta.has_at = true;
    ta.at_text = at;
  }
  return cli_at_snapshot(snap, name, &ta, true, view, NULL, NULL);
}

/* The graphs' two files, read at once or one after the other (cli_two_sides). */
typedef struct compare_read_s {
  const char *path;
  unsigned flags;
  ms_snapshot_t *snap;
  ms_cache_key_t key;
} compare_read_t;

static bool compare_read_side(void *ctx, int k) {
  compare_read_t *r = (compare_read_t *)ctx + k;
  return cli_load_keyed(r->path, r->flags, &r->snap, &r->key) == CLI_OK;
}

/* @return CLI_OK with both snapshots (their cache keys noted, for the time index), or
 * CLI_FAILURE (printed; neither kept). */
static int compare_read_two(char *pos[2], unsigned flags, unsigned jobs, ms_snapshot_t **before,
                            ms_snapshot_t **after) {
  compare_read_t r[2] = {{pos[0], flags, NULL, {0, 0, 0}}, {pos[1], flags, NULL, {0, 0, 0}}};
  char what[1200];
  snprintf(what, sizeof what, "reading '%s' and '%s'", cli_display_name(pos[0]),
           cli_display_name(pos[1]));
  const char *paths[2] = {pos[0], pos[1]};
  if (!cli_two_sides(paths, jobs, what, compare_read_side, r)) {
    ms_snapshot_free(r[0].snap);
    ms_snapshot_free(r[1].snap);
    return CLI_FAILURE;
  }
  for (int k = 0; k < 2; k++)
    cli_cache_key_note(r[k].snap, &r[k].key);
  *before = r[0].snap;
  *after = r[1].snap;
  return CLI_OK;
}

static bool compare_is_dir(const char *path) {
  struct stat st;
  return strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

/* The report (the default): two files, or one file at two moments, or two directories. */
static int compare_report_main(char **pos, int npos, const char *at[2], int nat, bool json,
                               const char *device_s, const char *n_s, unsigned jobs) {
  ms_compare_options_t co;
  ms_compare_options_init(&co);
  cli_tl_args_t ta;
  int rc = cli_tl_args_parse("compare", &ta, device_s, NULL, NULL, NULL, NULL);
  if (rc != CLI_OK) return rc;
  if (ta.has_device) co.device = (int)ta.device;
  if (n_s) {
    uint64_t v;
    if (!cli_parse_u64(n_s, &v) || v == 0 || v > 1000000)
      return cli_usage_error("compare", "option '-n' needs a number from 1 to 1000000, not '%s'",
                             n_s);
    co.nrows = (size_t)v;
  }
  const char *ats[2] = {at[0], nat == 2 ? at[1] : at[0]};
  for (int s = 0; s < 2; s++) {
    if (!ats[s]) continue;
    ms_errbuf_t eb = {{0}};
    if (ms_tl_moment_parse(ats[s], &co.moment[s], &eb) != MS_OK)
      return cli_usage_error("compare", "option '--at': %s", eb.msg);
    co.has_moment[s] = true;
  }
  if (npos == 2 && compare_is_dir(pos[0]) && compare_is_dir(pos[1])) {
    if (nat) return cli_usage_error("compare", "--at does not apply to directories");
    return cli_compare_ranks(pos[0], pos[1], &co, json, jobs);
  }
  bool one_file = npos == 1;
  const char *paths[2] = {pos[0], pos[one_file ? 0 : 1]};
  const char *const qv[4] = {at[0], at[1], device_s, n_s};
  return cli_compare_report(paths, ats, &co, json, qv, jobs);
}

/* BEFORE and AFTER, or FILE with two moments; --jobs's value into *jobs (0: not given). @return
 * CLI_OK or CLI_USAGE (printed). */
static int compare_check_files(char **pos, int npos, int nat, const char *jobs_s,
                               unsigned *jobs) {
  bool one_file = npos == 1 && nat == 2;
  int rc;
  *jobs = 0; /* 0: as the machine allows */
  if (jobs_s && (rc = cli_parse_jobs("compare", jobs_s, 1024, jobs)) != CLI_OK) return rc;
  if (jobs_s && one_file)
    return cli_usage_error("compare", "--jobs applies to two files or directories");
  if (npos < 2 && !one_file) {
    if (npos == 1)
      return cli_usage_error("compare", nat ? "missing AFTER (or two --at moments of one FILE)"
                                            : "missing AFTER");
    return cli_usage_error("compare", "missing BEFORE and AFTER");
  }
  if (!one_file && strcmp(pos[0], "-") == 0 && strcmp(pos[1], "-") == 0)
    return cli_usage_error("compare", "only one of BEFORE and AFTER can be '-' (standard input)");
  return CLI_OK;
}

int cmd_compare(int argc, char **argv) {
  int folded = 0, stacks = 0, json = 0, segments = 0;
  cli_view_opts_t vo = {NULL, NULL, NULL};
  const char *output = NULL, *n_s = NULL, *jobs_s = NULL;
  const char *device_s = NULL, *range_s = NULL, *stream_s = NULL, *pool_s = NULL;
  const struct cli_opt opts[] = {
      {"output", 'o', NULL, &output}, {"folded", 0, &folded, NULL}, {"stacks", 0, &stacks, NULL},
      {"segments", 0, &segments, NULL}, {"json", 0, &json, NULL}, {"device", 0, NULL, &device_s},
      {"range", 0, NULL, &range_s}, {"stream", 0, NULL, &stream_s}, {"pool", 0, NULL, &pool_s},
      {"title", 0, NULL, &vo.title}, {"width", 0, NULL, &vo.width},
      {"minwidth", 0, NULL, &vo.minwidth}, {"n", 'n', NULL, &n_s}, {"jobs", 0, NULL, &jobs_s},
      {NULL, 0, NULL, NULL}};
  const char *at[2] = {NULL, NULL};
  int nat = compare_take_at(&argc, argv, at);
  if (nat < 0) return cli_usage_error("compare", "option '--at' is given at most twice, each with a value");
  char *pos[2];
  int npos = 0;
  int rc = cli_parse_options("compare", compare_usage, opts, argc, argv, pos, 2, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  bool one_file = npos == 1 && nat == 2;
  unsigned jobs;
  if ((rc = compare_check_files(pos, npos, nat, jobs_s, &jobs)) != CLI_OK) return rc;
  if (segments && stacks) return cli_usage_error("compare", "--segments and --stacks exclude each other");
  bool graph = output || folded || vo.title || vo.width || vo.minwidth;
  if (!stacks && !segments && !graph) {
    if (range_s || stream_s || pool_s)
      return cli_usage_error("compare", "--range, --stream and --pool apply to --segments, --stacks");
    return compare_report_main(pos, npos, at, nat, json, device_s, n_s, jobs);
  }
  if (n_s || (folded && json))
    return cli_usage_error("compare", folded && json ? "--folded and --json exclude each other"
                                                     : "-n applies to the report, not to "
                                                       "--segments or --stacks");
  if ((rc = cli_output_default("compare", &output, !folded && !json)) != CLI_OK) return rc;
  ms_flame_options_t fo;
  ms_flame_options_init(&fo);
  if ((rc = cli_view_flame_options("compare", &vo, &fo, NULL, 0)) != CLI_OK) return rc;
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse("compare", &ta, device_s, range_s, stream_s, pool_s, NULL)) != CLI_OK)
    return rc;

  ms_snapshot_t *before = NULL, *after = NULL, *vb = NULL, *va = NULL;
  /* the states at the end need no trace; moments, a range or a device read it through the time
   * index (which never uses the stacks of frees paired with their alloc) */
  unsigned lf = nat > 0 || cli_tl_args_need_trace(&ta) ? MS_LOAD_NO_FREE_STACKS : MS_LOAD_NO_TRACE;
  if (one_file) {
    if ((rc = cli_load_ex(pos[0], lf, &before)) != CLI_OK) return rc;
    pos[1] = pos[0];
  } else if ((rc = compare_read_two(pos, lf, jobs, &before, &after)) != CLI_OK) {
    return rc;
  }
  const ms_snapshot_t *after_src = one_file ? before : after;
  rc = compare_side(before, cli_display_name(pos[0]), &ta, at[0], &vb);
  if (rc == CLI_OK)
    rc = compare_side(after_src, cli_display_name(pos[1]), &ta, nat == 2 ? at[1] : at[0], &va);
  if (rc != CLI_OK) {
    ms_snapshot_free(vb);
    ms_snapshot_free(before);
    ms_snapshot_free(after);
    return rc;
  }
  compare_arg_t a = {vb ? vb : before, va ? va : after_src};
  char title[700];
  snprintf(title, sizeof title, "compare \u2014 %s \u2192 %s",
           compare_base(cli_display_name(pos[0])), compare_base(cli_display_name(pos[1])));
  if (!vo.title) fo.title = title;
  fo.countname = "bytes";
  fo.memory = 1;
  char subtitle[1024];
  if (stacks) {
    if (nat > 0)
      snprintf(subtitle, sizeof subtitle, "%s@%s -> %s@%s",
               compare_base(cli_display_name(pos[0])), at[0],
               compare_base(cli_display_name(pos[1])), nat == 2 ? at[1] : at[0]);
    else
      snprintf(subtitle, sizeof subtitle, "%s -> %s", compare_base(cli_display_name(pos[0])),
               compare_base(cli_display_name(pos[1])));
    fo.subtitle = subtitle;
    compare_head_t h = {cli_display_name(pos[0]), cli_display_name(pos[1]), NULL};
    if (json)
      rc = cli_render_json(output, "compare", compare_json_head, &h, compare_stacks_view, &a);
    else
      rc = cli_render(output, folded ? CLI_RENDER_MERGED : CLI_RENDER_SVG, &fo,
                      compare_stacks_view, &a);
  } else {
    ms_view_segdiff_t d;
    if (ms_view_segdiff(a.before, a.after, &d) != MS_OK) {
      cli_error("out of memory");
      rc = CLI_FAILURE;
    } else {
      /* the lists go to stdout, unless the graph itself does; JSON holds them */
      FILE *lists = strcmp(output, "-") == 0 ? stderr : stdout;
      if (!json) {
        compare_print_list(lists, "only_before", d.only_before, d.n_before);
        compare_print_list(lists, "only_after", d.only_after, d.n_after);
      }
      snprintf(subtitle, sizeof subtitle, "segments only in %s or only in %s",
               compare_base(cli_display_name(pos[0])), compare_base(cli_display_name(pos[1])));
      fo.subtitle = subtitle;
      compare_head_t h = {cli_display_name(pos[0]), cli_display_name(pos[1]), &d};
      if (json)
        rc = cli_render_json(output, "compare", compare_json_head, &h, compare_segments_view, &a);
      else
        rc = cli_render(output, folded ? CLI_RENDER_FOLDED : CLI_RENDER_SVG, &fo,
                        compare_segments_view, &a);
      ms_view_segdiff_release(&d);
    }
  }
  ms_snapshot_free(vb);
  ms_snapshot_free(va);
  ms_snapshot_free(before);
  ms_snapshot_free(after);
  return rc;
}
