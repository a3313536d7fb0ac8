/* SPDX-License-Identifier: MIT
 * memsnap CLI: the body of `memory` and `segments` (cli_view_main). It sits above the helpers it
 * uses (options, loading, outputs, JSON, moments, cli/render.c, cli/categories.c), none of which
 * calls it. Its output is stored in the snapshot cache, and a second run of the same question on
 * the same bytes writes it again from there (cli/answers.c, docs/performance.md).
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/views.h"
#include "memsnap/viz.h"

/* ---- memory and segments -----------------------------------------------------------------------
 */

typedef struct cli_view_arg_s {
  const ms_snapshot_t *snap;
  ms_view_kind kind;
} cli_view_arg_t;

static int cli_view_one(void *arg, ms_view_emit_fn *emit, void *ctx, int *side) {
  (void)side;
  cli_view_arg_t *a = arg;
  return ms_view_emit(a->snap, a->kind, emit, ctx);
}

int cli_view_main(const char *cmd, const char *usage, ms_view_kind kind, int argc, char **argv) {
  int folded = 0, json = 0;
  const char *output = NULL;
  cli_view_opts_t vo = {NULL, NULL, NULL};
  const char *at_s = NULL, *device_s = NULL, *range_s = NULL, *stream_s = NULL, *pool_s = NULL;
  const char *by_s = NULL, *rules_s = NULL; /* memory --by category (docs/categories.md) */
  const struct cli_opt opts[] = {{"output", 'o', NULL, &output}, {"folded", 0, &folded, NULL},
                                 {"by", 0, NULL, &by_s},         {"categories", 0, NULL, &rules_s},
                                 {"json", 0, &json, NULL},       {"at", 0, NULL, &at_s},         {"device", 0, NULL, &device_s},
                                 {"range", 0, NULL, &range_s},   {"stream", 0, NULL, &stream_s},
                                 {"pool", 0, NULL, &pool_s},     {"title", 0, NULL, &vo.title},
                                 {"width", 0, NULL, &vo.width},  {"minwidth", 0, NULL, &vo.minwidth},
                                 {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options(cmd, usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error(cmd, "missing FILE");
  if (folded && json) return cli_usage_error(cmd, "--folded and --json exclude each other");
  if (by_s && (kind != MS_VIEW_MEMORY || strcmp(by_s, "category") != 0))
    return cli_usage_error(cmd, "option '--by' takes only 'category' (memory), not '%s'", by_s);
  if (rules_s && !by_s) return cli_usage_error(cmd, "option '--categories' needs '--by category'");
  if ((rc = cli_output_default(cmd, &output, !folded && !json)) != CLI_OK) return rc;
  ms_flame_options_t fo;
  ms_flame_options_init(&fo);
  if ((rc = cli_view_flame_options(cmd, &vo, &fo, NULL, 0)) != CLI_OK) return rc;
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse(cmd, &ta, device_s, range_s, stream_s, pool_s, at_s)) != CLI_OK)
    return rc;
  /* the views at the end need no trace; a moment, a range or a filter does, read through the time
   * index (which never uses free_requested's stacks) */
  unsigned flags = cli_tl_args_need_trace(&ta) || by_s ? MS_LOAD_NO_FREE_STACKS : MS_LOAD_NO_TRACE;
  /* a moment's blocks take their stacks from the file when the view asks (categories need every
   * allocation's) */
  unsigned load_flags =
      flags | (flags == MS_LOAD_NO_FREE_STACKS && !by_s ? MS_LOAD_DEFER_STACKS : 0);
  /* the output through the cache (cli/answers.c): the options as given, and the file's name,
   * which the title and the JSON print */
  static const char *const names[12] = {"file",  "by",    "categories", "folded",
                                        "at",    "device", "range",     "stream",
                                        "pool",  "title", "width",      "minwidth"};
  const char *const vals[12] = {cli_display_name(pos[0]), by_s,     rules_s,
                                folded ? "1" : NULL,      at_s,     device_s,
                                range_s,                  stream_s, pool_s,
                                vo.title,                 vo.width, vo.minwidth};
  cli_answer_t ans = {0};
  if (!(range_s && !by_s)) /* a --range reads a window, never through the cache */
    cli_answer_open(&ans, cmd, pos[0], flags, 12, names, vals, json != 0, rules_s);
  if ((rc = cli_answer_serve_file(&ans, pos[0], output)) != CLI_USAGE) {
    cli_answer_close(&ans, CLI_FAILURE, NULL);
    return rc;
  }
  ms_snapshot_t *snap = NULL, *view = NULL;
  if ((rc = cli_load_range(pos[0], load_flags, by_s ? NULL : &ta, &snap)) != CLI_OK) {
    cli_answer_close(&ans, rc, NULL);
    return rc;
  }
  if (!by_s && (rc = cli_at_snapshot(snap, cli_display_name(pos[0]), &ta, true, &view, NULL, NULL)) !=
      CLI_OK) {
    cli_answer_close(&ans, rc, NULL);
    ms_snapshot_free(snap);
    return rc;
  }
  fo.countname = "bytes";
  fo.memory = 1;
  char subtitle[512];
  snprintf(subtitle, sizeof subtitle, "%s: %s", cmd,
           by_s ? "category and stack (allocated bytes)"
           : kind == MS_VIEW_MEMORY ? "stream, block state and stack"
                                    : "stream, segment, block state and stack");
  fo.subtitle = subtitle;
  char title[600];
  if (ta.has_device)
    snprintf(title, sizeof title, "%s \u2014 %s (device %zu)", cmd,
             cli_base_name(cli_display_name(pos[0])), ta.device);
  else
    snprintf(title, sizeof title, "%s \u2014 %s", cmd, cli_base_name(cli_display_name(pos[0])));
  if (!vo.title) fo.title = title;
  cli_view_arg_t a = {view ? view : snap, kind};
  cli_answer_capture(&ans);
  if (by_s)
    rc = cli_memory_by_category(snap, cli_display_name(pos[0]), &ta, rules_s, output,
                                folded ? CLI_RENDER_FOLDED : CLI_RENDER_SVG, &fo, json != 0);
  else if (json)
    rc = cli_render_json(output, cmd, cli_json_head_file, (void *)cli_display_name(pos[0]),
                         cli_view_one, &a);
  else
    rc = cli_render(output, folded ? CLI_RENDER_FOLDED : CLI_RENDER_SVG, &fo, cli_view_one, &a);
  cli_answer_close(&ans, rc, cli_cache_key(snap));
  ms_snapshot_free(view);
  ms_snapshot_free(snap);
  return rc;
}
