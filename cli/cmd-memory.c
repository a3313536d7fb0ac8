/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap memory FILE [-o OUT] [--folded]`, `_memory_viz.py memory`: a flame graph
 * of the snapshot's blocks by stream, block state and allocation stack (memsnap/views.h), as an
 * interactive SVG, or as the folded text PyTorch feeds flamegraph.pl (minus its negative lines).
 */
#include "cli.h"

static const char memory_usage[] =
    "usage: memsnap memory FILE [-o OUT] [--folded]\n"
    "\n"
    "Draws a flame graph of the memory of FILE by stream, block state and allocation stack,\n"
    "as PyTorch's `_memory_viz.py memory`. Widths are bytes: requested bytes for allocations,\n"
    "<gaps> for rounding slack and free space.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  -o, --output OUT  write to OUT (default: output.svg; '-' = standard output)\n"
    "  --folded          write the folded stacks (`a;b;c BYTES` lines) instead of an SVG\n"
    "  -h, --help        show this help\n";

int cmd_memory(int argc, char **argv) {
  return cli_view_main("memory", memory_usage, MS_VIEW_MEMORY, argc, argv);
}
