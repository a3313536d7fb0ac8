/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap segments FILE [-o OUT] [--folded]`, `_memory_viz.py segments`: a flame
 * graph of the snapshot's blocks by stream, segment (seg_<address>), block state and allocation
 * stack (memsnap/views.h), as an interactive SVG or as folded text.
 */
#include "cli.h"

static const char segments_usage[] =
    "usage: memsnap segments FILE [-o OUT] [--folded]\n"
    "\n"
    "Draws a flame graph of the memory of FILE by stream, segment, block state and allocation\n"
    "stack, as PyTorch's `_memory_viz.py segments`. Widths are bytes.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  -o, --output OUT  write to OUT (default: output.svg; '-' = standard output)\n"
    "  --folded          write the folded stacks (`a;b;c BYTES` lines) instead of an SVG\n"
    "  -h, --help        show this help\n";

int cmd_segments(int argc, char **argv) {
  return cli_view_main("segments", segments_usage, MS_VIEW_SEGMENTS, argc, argv);
}
