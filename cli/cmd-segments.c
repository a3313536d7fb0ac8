/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap segments FILE [-o OUT] [--folded]`, `_memory_viz.py segments`: a flame
 * graph of the snapshot's blocks by stream, segment (seg_<address>), block state and allocation
 * stack (memsnap/views.h), as an interactive SVG or as folded text.
 */
#include "cli.h"

static const char segments_usage[] =
    "usage: memsnap segments FILE [-o OUT] [--folded | --json] [--at MOMENT] [--device N]\n"
    "                       [--range A:B] [--stream S] [--pool A,B]\n"
    "\n"
    "Draws a flame graph of the memory of FILE by stream, segment, block state and allocation\n"
    "stack, as PyTorch's `_memory_viz.py segments`. Widths are bytes.\n"
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
    "  --title TEXT      the SVG's title (default: the view and the file, e.g.\n"
    "                    'segments \u2014 x.pickle (device 0)')\n"
    "  --width PX        the SVG's width (default 1200)\n"
    "  --minwidth PX|N%  gather narrower frames into [N small frames] (default 0.1 px)\n"
    "  -h, --help        show this help\n";

int cmd_segments(int argc, char **argv) {
  return cli_view_main("segments", segments_usage, MS_VIEW_SEGMENTS, argc, argv);
}
