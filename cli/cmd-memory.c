/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap memory FILE [-o OUT] [--folded]`, `_memory_viz.py memory`: a flame graph
 * of the snapshot's blocks by stream, block state and allocation stack (memsnap/views.h), as an
 * interactive SVG, or as the folded text PyTorch feeds flamegraph.pl (minus its negative lines).
 */
#include "cli.h"

static const char memory_usage[] =
    "usage: memsnap memory FILE [-o OUT] [--folded | --json] [--at MOMENT] [--device N]\n"
    "                       [--range A:B] [--stream S] [--pool A,B] [--by category]\n"
    "\n"
    "Draws a flame graph of the memory of FILE by stream, block state and allocation stack,\n"
    "as PyTorch's `_memory_viz.py memory`. Widths are bytes: requested bytes for allocations,\n"
    "<gaps> for rounding slack and free space.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  -o, --output OUT  write to OUT ('-' = standard output; default: output.svg, and\n"
    "                    standard output with --folded; an SVG is not written to a terminal)\n"
    "  --folded          write the folded stacks (`a;b;c BYTES` lines) instead of an SVG\n"
    "  --json            write the folded stacks as JSON records (docs/cli.md, JSON outputs)\n"
    "  --at MOMENT       show the state at MOMENT: peak (of allocated bytes), peak-reserved,\n"
    "                    end, an entry index N (after trace entry N; -1 = before the first),\n"
    "                    or a time in microseconds: t=1700000000123456 or 1700000000123456us\n"
    "  -d, --device N    only device N (with --at: default the device with the longest trace)\n"
    "  --range A:B       with --at: peaks within trace entries A to B; alone: the state after B\n"
    "                    (or t=T0:T1 by time_us, step=N[:M] by ProfilerStep#N)\n"
    "  --stream S        only segments of stream S (a raw handle, decimal or 0x...)\n"
    "  --pool A,B        only segments of private pool (A, B); 0,0 is the default pool\n"
    "  --by category     a first level by category (parameter, gradient, optimizer_state,\n"
    "                    activation, temporary, input, autograd_detail, unknown), widths the\n"
    "                    allocated blocks' sizes (docs/categories.md)\n"
    "  --categories RULES  with --by category: a rules file extending the defaults\n"
    "  --title TEXT      the SVG's title (default: the view and the file, e.g.\n"
    "                    'memory \u2014 x.pickle (device 0)')\n"
    "  --width PX        the SVG's width (default 1200)\n"
    "  --minwidth PX|N%  gather narrower frames into [N small frames] (default 0.1 px)\n"
    "  -h, --help        show this help\n";

int cmd_memory(int argc, char **argv) {
  return cli_view_main("memory", memory_usage, MS_VIEW_MEMORY, argc, argv);
}
