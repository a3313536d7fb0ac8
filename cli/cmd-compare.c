/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap compare BEFORE AFTER [-o OUT] [--folded] [--stacks]`.
 *
 * Default: what `_memory_viz.py compare` was meant to do (its CLI always crashes, passing whole
 * snapshots where segment lists are expected): the segments only in BEFORE and only in AFTER,
 * keyed by (address, total_size), listed on stdout as sorted Python lists, and their blocks drawn
 * under `only_before;` and `only_after;` (memsnap/views.h).
 * --stacks: one differential flame graph of both snapshots' memory views (stream, block state,
 * stack), each frame as wide as the larger of its sizes and coloured by its change.
 */
#include <inttypes.h>
#include <string.h>

#include "cli.h"

static const char compare_usage[] =
    "usage: memsnap compare BEFORE AFTER [-o OUT] [--folded] [--stacks]\n"
    "\n"
    "Compares two snapshots of the same process. By default, lists the segments only in BEFORE\n"
    "and only in AFTER (by address and size; `only_before = [...]`, `only_after = [...]`, sorted)\n"
    "and draws their blocks under only_before; and only_after; as `_memory_viz.py compare` was\n"
    "meant to. With --stacks, draws one differential flame graph of both snapshots by stream,\n"
    "block state and stack: frames that grew, shrank, are new or are gone in four colours.\n"
    "BEFORE and AFTER are memsnap snapshots or PyTorch pickles (one of them may be '-').\n"
    "\n"
    "options:\n"
    "  -o, --output OUT  write to OUT (default: output.svg; '-' = standard output)\n"
    "  --folded          write folded stacks instead of an SVG (with --stacks: merged\n"
    "                    `STACK BEFORE AFTER` lines, as difffolded.pl writes them)\n"
    "  --stacks          a differential flame graph of all stacks instead of the segment diff\n"
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

static void compare_print_list(FILE *out, const char *name, const uint64_t *v, size_t n) {
  fprintf(out, "%s = [", name);
  for (size_t i = 0; i < n; i++) fprintf(out, i ? ", %" PRIu64 : "%" PRIu64, v[i]);
  fputs("]\n", out);
}

int cmd_compare(int argc, char **argv) {
  int folded = 0, stacks = 0;
  const char *output = "output.svg";
  const struct cli_opt opts[] = {{"output", 'o', NULL, &output},
                                 {"folded", 0, &folded, NULL},
                                 {"stacks", 0, &stacks, NULL},
                                 {NULL, 0, NULL, NULL}};
  char *pos[2];
  int npos = 0;
  int rc = cli_parse_options("compare", compare_usage, opts, argc, argv, pos, 2, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 2)
    return cli_usage_error("compare", npos ? "missing AFTER" : "missing BEFORE and AFTER");
  if (strcmp(pos[0], "-") == 0 && strcmp(pos[1], "-") == 0)
    return cli_usage_error("compare", "only one of BEFORE and AFTER can be '-' (standard input)");
  if (!output[0]) return cli_usage_error("compare", "option '--output' needs a file name");

  ms_snapshot_t *before = NULL, *after = NULL;
  if ((rc = cli_load(pos[0], &before)) != CLI_OK) return rc;
  if ((rc = cli_load(pos[1], &after)) != CLI_OK) {
    ms_snapshot_free(before);
    return rc;
  }
  compare_arg_t a = {before, after};
  ms_flame_options_t fo;
  ms_flame_options_init(&fo);
  fo.countname = "bytes";
  fo.memory = 1;
  char subtitle[1024];
  if (stacks) {
    snprintf(subtitle, sizeof subtitle, "%s -> %s", compare_base(cli_display_name(pos[0])),
             compare_base(cli_display_name(pos[1])));
    fo.subtitle = subtitle;
    rc = cli_render(output, folded ? CLI_RENDER_MERGED : CLI_RENDER_SVG, &fo, compare_stacks_view,
                    &a);
  } else {
    ms_view_segdiff_t d;
    if (ms_view_segdiff(before, after, &d) != MS_OK) {
      cli_error("out of memory");
      rc = CLI_FAILURE;
    } else {
      /* the lists go to stdout, unless the graph itself does */
      FILE *lists = strcmp(output, "-") == 0 ? stderr : stdout;
      compare_print_list(lists, "only_before", d.only_before, d.n_before);
      compare_print_list(lists, "only_after", d.only_after, d.n_after);
      ms_view_segdiff_release(&d);
      snprintf(subtitle, sizeof subtitle, "segments only in %s or only in %s",
               compare_base(cli_display_name(pos[0])), compare_base(cli_display_name(pos[1])));
      fo.subtitle = subtitle;
      rc = cli_render(output, folded ? CLI_RENDER_FOLDED : CLI_RENDER_SVG, &fo,
                      compare_segments_view, &a);
    }
  }
  ms_snapshot_free(before);
  ms_snapshot_free(after);
  return rc;
}
