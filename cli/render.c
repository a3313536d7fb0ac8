/* SPDX-License-Identifier: MIT
 * memsnap CLI: views to files (cli_render: an SVG or folded text, complete-or-not-at-all). It sits
 * above the helpers it uses (outputs, progress, messages), none of which calls it; the commands and
 * cli/categories.c call it.
 */
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/views.h"
#include "memsnap/viz.h"

/* ---- views to files ----------------------------------------------------------------------------
 */

typedef struct cli_flame_sink_s {
  ms_flame_t *flame;
  int side; /* -1: plain values; 0: before; 1: after */
} cli_flame_sink_t;

/* Feeds a view's stacks to a flame builder; a trailing empty frame (every frame of the stack
 * filtered, PyTorch's "state; n") carries no name, so its bytes stay with the state. */
static int cli_flame_emit(void *ctx, const char *const *frames, size_t nframes, uint64_t count) {
  cli_flame_sink_t *fs = ctx;
  if (nframes > 0 && frames[nframes - 1][0] == 0) nframes--;
  if (fs->side < 0) return ms_flame_add(fs->flame, frames, nframes, count);
  return ms_flame_add_diff(fs->flame, frames, nframes, fs->side == 0 ? count : 0,
                           fs->side == 1 ? count : 0);
}

int cli_render(const char *out_path, cli_render_mode mode, const ms_flame_options_t *fopts,
               cli_view_fn *view, void *arg) {
  cli_out_t o;
  ms_errbuf_t eb = {{0}};
  int err;
  if (mode == CLI_RENDER_FOLDED) {
    if (cli_out_open(&o, out_path) != CLI_OK) return CLI_FAILURE;
    err = view(arg, ms_view_folded_emit, &o.sink, NULL);
    if (err != MS_OK) goto fail_out;
    return cli_out_commit(&o);
  }
  cli_flame_sink_t fs = {NULL, -1};
  if ((err = ms_flame_create(fopts, &fs.flame)) != MS_OK) {
    cli_error("cannot create the flame graph: %s", ms_strerror(err));
    return CLI_FAILURE;
  }
  cli_progress_start("building the flame graph");
  err = view(arg, cli_flame_emit, &fs, &fs.side);
  cli_progress_stop();
  if (err != MS_OK) {
    cli_error("cannot build the flame graph: %s", ms_strerror(err));
    ms_flame_destroy(fs.flame);
    return CLI_FAILURE;
  }
  if (cli_out_open(&o, out_path) != CLI_OK) {
    ms_flame_destroy(fs.flame);
    return CLI_FAILURE;
  }
  cli_progress_count(cli_out_bytes_written, 0);
  cli_progress_start("writing '%s'", out_path);
  err = mode == CLI_RENDER_MERGED ? ms_flame_write_folded(fs.flame, &o.sink, &eb)
                                  : ms_flame_write_svg(fs.flame, &o.sink, &eb);
  cli_progress_stop();
  ms_flame_destroy(fs.flame);
  if (err != MS_OK) goto fail_out;
  return cli_out_commit(&o);
fail_out:
  return cli_out_fail(&o, err, &eb);
}

