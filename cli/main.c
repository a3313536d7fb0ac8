/* SPDX-License-Identifier: MIT
 * memsnap CLI: the command table and dispatch (git's git.c and run_builtin, perf.c); the
 * messages are message.c's, help and version cmd-help.c's (git's usage.c and help.c).
 * After the command, stdout is flushed and closed, and a write error fails the run. */
#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/options.h"
#include "memsnap/common.h"

const struct cli_cmd cli_commands[] = {
    {"help", cmd_help, "show help for memsnap or one of its commands"},
    {"version", cmd_version, "print memsnap's version"},
    {"stats", cmd_stats, "segment map and totals, as _memory_viz.py stats"},
    {"trace", cmd_trace, "the allocator trace as text, as _memory_viz.py trace"},
    {"memory", cmd_memory, "flame graph by stream, block state and stack"},
    {"segments", cmd_segments, "flame graph by stream, segment, block state and stack"},
    {"compare", cmd_compare, "what changed between two snapshots; leak suspects"},
    {"flamegraph", cmd_flamegraph, "any folded-stack file to an interactive flame graph"},
    {"replay", cmd_replay, "replay a trace through the allocator: fidelity check, what-if"},
    {"convert", cmd_convert, "a snapshot between memsnap's format and PyTorch's pickle"},
    {"timeline", cmd_timeline, "memory over time: peaks, OOMs, the final state"},
    {"top", cmd_top, "the biggest consumers at a moment (default: the peak)"},
    {"summary", cmd_summary, "one rank's peaks, OOMs and top stack (--json: to merge)"},
    {"check", cmd_check, "a memory gate for CI: limits on peaks and counts"},
    {"explain", cmd_explain, "why memory ran out or peaked, and what setting avoids it"},
    {"export", cmd_export, "to SQLite (many ranks), pprof or Perfetto/Chrome trace JSON"},
    {"run", cmd_run, "run a CUDA program and snapshot its device memory (LD_PRELOAD)"},
    {"view", cmd_view, "an offline HTML viewer: timelines, state history, settings"},
    {"cache", cmd_cache, "the snapshot cache: where, how big; --clear empties it"},
    {"trace_plot", cmd_trace_plot, "the viewer opened on the memory timeline, as _memory_viz.py"},
    {"segment_plot", cmd_segment_plot, "the viewer opened on the allocator state history"},
    {NULL, NULL, NULL},
};

/* A failed write to standard output is reported even when the command already failed (its
 * status, non-zero, is kept): what was lost must be said. */
static int finish_stdout(int status) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    int e = errno ? errno : EIO;
    if (!cli_stdout_error_reported) { /* else said by the output's own error */
      if (e == ENOSPC)
        cli_error("no space left on device while writing '<stdout>'");
      else
        cli_error("write to standard output failed: %s", strerror(e));
    }
    return status == CLI_OK ? CLI_FAILURE : status;
  }
  if (fclose(stdout) != 0) {
    cli_error("closing standard output failed: %s", strerror(errno));
    return status == CLI_OK ? CLI_FAILURE : status;
  }
  return status;
}

int main(int argc, char **argv) {
  cli_command_table = cli_commands; /* for help and "did you mean" (cmd-help.c) */
  ms_set_output(cli_lib_message, NULL);
  /* one command, then exit: the library may keep the large arrays it frees for its next ones
   * (a read's tables for the time index; MS_REUSE_MEMORY=0 in the environment still wins) */
  ms_option_set_default(MS_OPTION_REUSE_MEMORY, 1);
  if (argc < 2) {
    cli_main_usage(stderr);
    return CLI_USAGE;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
    cli_main_usage(stdout);
    return finish_stdout(CLI_OK);
  }
  if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) name = "version";
  if (name[0] == '-') return cli_usage_error(NULL, "unknown option '%s'", name);
  const struct cli_cmd *c = cli_find_command(name);
  if (!c) return cli_unknown_command(name);
  argv[1] = (char *)c->name;
  return finish_stdout(c->fn(argc - 1, argv + 1));
}
