/* SPDX-License-Identifier: MIT
 * memsnap CLI: global options, the command table and dispatch (git's run_builtin, perf.c).
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
    {"compare", cmd_compare, "what changed between two snapshots, by source line; leak suspects"},
    {"flamegraph", cmd_flamegraph, "any folded-stack file to an interactive flame graph"},
    {"replay", cmd_replay, "replay a trace through the allocator: fidelity check, what-if"},
    {"convert", cmd_convert, "a snapshot between memsnap's format and PyTorch's pickle"},
    {"timeline", cmd_timeline, "memory over time: peaks, final state; --json = PyTorch viewer's data"},
    {"top", cmd_top, "the biggest consumers at a moment (default: the peak)"},
    {"summary", cmd_summary, "one rank's peaks, OOMs and top stack (--json: to merge many ranks)"},
    {"check", cmd_check, "a memory gate for CI: limits on peaks and counts, exit 1 when broken"},
    {"explain", cmd_explain, "why memory ran out or peaked, and which setting avoids it (replayed)"},
    {"export", cmd_export, "to SQLite, pprof or Perfetto/Chrome trace JSON (several ranks: --sqlite)"},
    {"run", cmd_run, "run a CUDA program and snapshot its device memory (LD_PRELOAD)"},
    {"view", cmd_view, "an offline HTML viewer: timelines, allocator state history, settings"},
    {"trace_plot", cmd_trace_plot, "the viewer opened on the memory timeline, as _memory_viz.py"},
    {"segment_plot", cmd_segment_plot, "the viewer opened on the allocator state history"},
    {NULL, NULL, NULL},
};

const struct cli_cmd *cli_find_command(const char *name) {
  for (const struct cli_cmd *c = cli_commands; c->name; c++)
    if (strcmp(c->name, name) == 0) return c;
  return NULL;
}

/* One message line; what it quotes from inputs is escaped (cli_fputs_escaped). */
static void vmsg(const char *prefix, const char *fmt, va_list ap) {
  fflush(stdout);
  char small[2048], *buf = small;
  va_list aq;
  va_copy(aq, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  if (n >= (int)sizeof small && (buf = malloc((size_t)n + 1)) != NULL)
    vsnprintf(buf, (size_t)n + 1, fmt, aq);
  va_end(aq);
  fputs(prefix, stderr);
  cli_fputs_escaped(buf ? buf : small, stderr);
  fputc('\n', stderr);
  if (buf != small) free(buf);
}

/* The library's messages (ms_set_output), escaped as the CLI's own. */
static void lib_message(const char *msg, void *arg) {
  (void)arg;
  fflush(stdout);
  cli_fputs_escaped(msg, stderr);
  fputc('\n', stderr);
}

void cli_error(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("memsnap: error: ", fmt, ap);
  va_end(ap);
}

void cli_warning(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("memsnap: warning: ", fmt, ap);
  va_end(ap);
}

int cli_usage_error(const char *cmd, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vmsg("memsnap: error: ", fmt, ap);
  va_end(ap);
  if (cmd)
    fprintf(stderr, "Run 'memsnap %s --help' for usage.\n", cmd);
  else
    fprintf(stderr, "Run 'memsnap --help' for usage.\n");
  return CLI_USAGE;
}

static void main_usage(FILE *fp) {
  fprintf(fp,
          "usage: memsnap [--version] [--help] <command> [<args>]\n"
          "\n"
          "GPU memory snapshots: statistics, traces and interactive flame graphs, for memsnap\n"
          "snapshots and PyTorch's torch.cuda.memory._dump_snapshot() pickles.\n"
          "\n"
          "commands:\n");
  for (const struct cli_cmd *c = cli_commands; c->name; c++)
    fprintf(fp, "   %-13s %s\n", c->name, c->summary); /* segment_plot and two spaces */
  fprintf(fp, "\nRun 'memsnap help <command>' or 'memsnap <command> --help' for a command's options.\n");
}

static const char version_usage[] =
    "usage: memsnap version\n"
    "\n"
    "Prints memsnap's version, e.g. `memsnap 1.2.3` (also `memsnap --version`, `memsnap -V`).\n"
    "\n"
    "options:\n"
    "  -h, --help  show this help\n";

static const char help_usage[] =
    "usage: memsnap help [COMMAND]\n"
    "\n"
    "Without COMMAND, lists memsnap's commands; with one, prints its help, exactly what\n"
    "`memsnap COMMAND --help` prints.\n"
    "\n"
    "options:\n"
    "  -h, --help  show this help\n";

static bool is_help_option(const char *a) {
  return strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0;
}

int cmd_version(int argc, char **argv) {
  if (argc == 2 && is_help_option(argv[1])) {
    fputs(version_usage, stdout);
    return CLI_OK;
  }
  if (argc > 1) return cli_usage_error("version", "'version' takes no arguments");
  printf("memsnap %s\n", ms_version_string());
  return CLI_OK;
}

int cmd_help(int argc, char **argv) {
  if (argc < 2) {
    main_usage(stdout);
    return CLI_OK;
  }
  for (int i = 1; i < argc; i++)
    if (is_help_option(argv[i])) {
      fputs(help_usage, stdout);
      return CLI_OK;
    }
  if (argc > 2) return cli_usage_error("help", "'help' takes at most one command name");
  const struct cli_cmd *c = cli_find_command(argv[1]);
  if (!c) return cli_usage_error(NULL, "'%s' is not a memsnap command", argv[1]);
  if (c->fn == cmd_help) { /* `memsnap help help` = `memsnap help --help` */
    fputs(help_usage, stdout);
    return CLI_OK;
  }
  char *sub[] = {argv[1], "--help", NULL};
  return c->fn(2, sub);
}

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
  ms_set_output(lib_message, NULL);
  /* one command, then exit: the library may keep the large arrays it frees for its next ones
   * (a read's tables for the time index; MS_REUSE_MEMORY=0 in the environment still wins) */
  ms_option_set_default(MS_OPTION_REUSE_MEMORY, 1);
  if (argc < 2) {
    main_usage(stderr);
    return CLI_USAGE;
  }
  const char *name = argv[1];
  if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0) {
    main_usage(stdout);
    return finish_stdout(CLI_OK);
  }
  if (strcmp(name, "--version") == 0 || strcmp(name, "-V") == 0) name = "version";
  if (name[0] == '-') return cli_usage_error(NULL, "unknown option '%s'", name);
  const struct cli_cmd *c = cli_find_command(name);
  if (!c) return cli_usage_error(NULL, "'%s' is not a memsnap command", name);
  argv[1] = (char *)c->name;
  return finish_stdout(c->fn(argc - 1, argv + 1));
}
