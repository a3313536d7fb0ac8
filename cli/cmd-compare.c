/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap compare BEFORE AFTER [-o OUT] [--folded | --json] [--stacks]`.
 *
 * Default: what `_memory_viz.py compare` was meant to do (its CLI always crashes, passing whole
 * snapshots where segment lists are expected): the segments only in BEFORE and only in AFTER,
 * keyed by (address, total_size), listed on stdout as sorted Python lists, and their blocks drawn
 * under `only_before;` and `only_after;` (memsnap/views.h).
 * --stacks: one differential flame graph of both snapshots' memory views (stream, block state,
 * stack), each frame as wide as the larger of its sizes and coloured by its change.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <string.h>

#include "cli.h"

static const char compare_usage[] =
    "usage: memsnap compare BEFORE AFTER [-o OUT] [--folded | --json] [--stacks] [--at MOMENT [--at MOMENT]]\n"
    "       memsnap compare FILE --at MOMENT --at MOMENT [-o OUT] [--folded | --json] [--stacks]\n"
    "\n"
    "Compares two snapshots of the same process. By default, lists the segments only in BEFORE\n"
    "and only in AFTER (by address and size; `only_before = [...]`, `only_after = [...]`, sorted)\n"
    "and draws their blocks under only_before; and only_after; as `_memory_viz.py compare` was\n"
    "meant to. With --stacks, draws one differential flame graph of both snapshots by stream,\n"
    "block state and stack: frames that grew, shrank, are new or are gone in four colours.\n"
    "BEFORE and AFTER are memsnap snapshots or PyTorch pickles (one of them may be '-').\n"
    "\n"
    "options:\n"
    "  -o, --output OUT  write to OUT ('-' = standard output; default: output.svg, and\n"
    "                    standard output with --folded; an SVG is not written to a terminal)\n"
    "  --folded          write folded stacks instead of an SVG (with --stacks: merged\n"
    "                    `STACK BEFORE AFTER` lines, as difffolded.pl writes them)\n"
    "  --json            the same as JSON: the segment lists and the records of each side\n"
    "  --stacks          a differential flame graph of all stacks instead of the segment diff\n"
    "  --at MOMENT       compare the state at MOMENT (peak, peak-reserved, end, an entry index\n"
    "                    N, or a time t=MICROSECONDS / MICROSECONDSus): one --at applies to both\n"
    "                    files; two apply to BEFORE and AFTER, or to two moments of one FILE\n"
    "  --device N        only device N (with --at: default the device with the longest trace)\n"
    "  --range A:B       with --at: peaks within trace entries A to B\n"
    "  --stream S        only segments of stream S; --pool A,B: only segments of pool (A, B)\n"
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

int cmd_compare(int argc, char **argv) {
  int folded = 0, stacks = 0, json = 0;
  cli_view_opts_t vo = {NULL, NULL, NULL};
  const char *output = NULL;
  const char *device_s = NULL, *range_s = NULL, *stream_s = NULL, *pool_s = NULL;
  const struct cli_opt opts[] = {{"output", 'o', NULL, &output},
                                 {"folded", 0, &folded, NULL},
                                 {"stacks", 0, &stacks, NULL},
                                 {"json", 0, &json, NULL},
                                 {"device", 0, NULL, &device_s},
                                 {"range", 0, NULL, &range_s},
                                 {"stream", 0, NULL, &stream_s},
                                 {"pool", 0, NULL, &pool_s},
                                 {"title", 0, NULL, &vo.title},
                                 {"width", 0, NULL, &vo.width},
                                 {"minwidth", 0, NULL, &vo.minwidth},
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
  if (npos < 2 && !one_file) {
    if (npos == 1)
      return cli_usage_error("compare", nat ? "missing AFTER (or two --at moments of one FILE)"
                                            : "missing AFTER");
    return cli_usage_error("compare", "missing BEFORE and AFTER");
  }
  if (!one_file && strcmp(pos[0], "-") == 0 && strcmp(pos[1], "-") == 0)
    return cli_usage_error("compare", "only one of BEFORE and AFTER can be '-' (standard input)");
  if (folded && json) return cli_usage_error("compare", "--folded and --json exclude each other");
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
  if ((rc = cli_load_ex(pos[0], lf, &before)) != CLI_OK) return rc;
  if (one_file) {
    pos[1] = pos[0];
  } else if ((rc = cli_load_ex(pos[1], lf, &after)) != CLI_OK) {
    ms_snapshot_free(before);
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
