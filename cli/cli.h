/* SPDX-License-Identifier: MIT
 * memsnap CLI: the command table and shared helpers (git's builtin.h pattern).
 *
 * Adding a subcommand (docs/adding-a-subcommand.md): write cli/cmd-<name>.c with
 * `int cmd_<name>(int argc, char **argv)` returning an exit status, declare it below, add a row
 * to the table in main.c, add the file to cli/CMakeLists.txt, document it in docs/cli.md and
 * test it in tests/test_cli*.c.
 */
#ifndef MEMSNAP_CLI_H
#define MEMSNAP_CLI_H

#include <stdint.h>
#include <stdio.h>

#include "memsnap/common.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/views.h"
#include "memsnap/viz.h"

enum cli_exit {
  CLI_OK = 0,      /* success */
  CLI_FAILURE = 1, /* run-time failure */
  CLI_USAGE = 2,   /* usage error (as argparse) */
};

struct cli_cmd {
  const char *name;
  int (*fn)(int argc, char **argv); /* argv[0] is the subcommand's name */
  const char *summary;              /* one line for `memsnap --help` */
};

/* Subcommands (cli/cmd-<name>.c). */
int cmd_help(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_stats(int argc, char **argv);
int cmd_trace(int argc, char **argv);
int cmd_memory(int argc, char **argv);
int cmd_segments(int argc, char **argv);
int cmd_compare(int argc, char **argv);
int cmd_flamegraph(int argc, char **argv);
int cmd_replay(int argc, char **argv);
int cmd_convert(int argc, char **argv);

/* The table, NULL-terminated (main.c). */
extern const struct cli_cmd cli_commands[];
/* @return the command named name, or NULL. */
const struct cli_cmd *cli_find_command(const char *name);

/* Messages in git's style, to stderr: "memsnap: error: ..." / "memsnap: warning: ...". */
void cli_error(const char *fmt, ...) MS_PRINTF(1, 2);
void cli_warning(const char *fmt, ...) MS_PRINTF(1, 2);
/* Prints "memsnap: error: <msg>" and a hint to run `memsnap CMD --help`; @return CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) MS_PRINTF(2, 3);

/* ---- helpers of the snapshot commands (cli/util.c) ---- */

/* Returned by cli_parse_options() after printing --help; the command then returns CLI_OK. */
#define CLI_HELP_SHOWN (-1)

/* One option of a command: a flag (flag != NULL: set to 1) or an option with a value
 * (value != NULL: set to the argument). Tables end with a zeroed entry. */
struct cli_opt {
  const char *name;   /* long name without the dashes, e.g. "output" */
  char short_name;    /* e.g. 'o', or 0 */
  int *flag;
  const char **value;
};
/* Parses argv[1..] in argparse's manner: options anywhere, `--name=V`, `--name V`, `-oV`, `-o V`,
 * `--` ends the options, `-` is a positional argument (standard input). -h/--help prints usage to
 * stdout. Positional arguments go to pos (at most maxpos; more is a usage error), their number
 * to *npos. @return CLI_OK, CLI_HELP_SHOWN, or CLI_USAGE after printing the error. */
int cli_parse_options(const char *cmd, const char *usage, const struct cli_opt *opts, int argc,
                      char **argv, char **pos, int maxpos, int *npos);

/* "<stdin>" for "-", else path. */
const char *cli_display_name(const char *path);
/* Loads a snapshot of any format ("-" = stdin) into *out. On failure prints
 * "memsnap: error: ..." naming the file and what is wrong, and returns CLI_FAILURE (*out
 * untouched). Shows a progress line on a terminal when loading takes more than a second. */
int cli_load(const char *path, ms_snapshot_t **out);
/* cli_load() leaving out what flags (MS_LOAD_*, memsnap/serialize.h) say, e.g. MS_LOAD_NO_TRACE
 * for views of the state at the end, which need no trace. */
int cli_load_ex(const char *path, unsigned flags, ms_snapshot_t **out);

/* A progress line on stderr, drawn only when stderr is a terminal and the operation has taken
 * more than a second; stop erases it. Not nestable. */
void cli_progress_start(const char *fmt, ...) MS_PRINTF(1, 2);
void cli_progress_stop(void);

/* An output file written complete-or-not-at-all (ms_atomic_file_t); "-" is standard output.
 * Write through `sink`. commit/abort print their errors and release the file. */
typedef struct cli_out_s {
  ms_atomic_file_t af;
  const char *path;
  ms_sink_t sink;
} cli_out_t;
int cli_out_open(cli_out_t *o, const char *path);   /* @return CLI_OK or CLI_FAILURE */
int cli_out_commit(cli_out_t *o);                   /* @return CLI_OK or CLI_FAILURE */
void cli_out_abort(cli_out_t *o);

/* _memory_viz.py's Bytes/_format_size: "%3.1f" and "", Ki, Mi, ... then "B" (e.g. "605.0KiB",
 * "-38.1MiB"). @return buf. */
#define CLI_BYTES_BUFSZ 48
const char *cli_format_bytes(int64_t n, char buf[CLI_BYTES_BUFSZ]);

/* A view for cli_render: emits its stacks through emit(ctx, ...). side is NULL for folded text;
 * otherwise a differential view sets *side to 0 before emitting BEFORE's stacks and to 1 before
 * AFTER's (a plain view leaves it alone). @return MS_OK or an ms_err. */
typedef int cli_view_fn(void *arg, ms_view_emit_fn *emit, void *ctx, int *side);
typedef enum cli_render_mode {
  CLI_RENDER_SVG = 0, /* the interactive flame graph (memsnap/viz.h) */
  CLI_RENDER_FOLDED,  /* the view's lines as they come (PyTorch's folded text) */
  CLI_RENDER_MERGED,  /* the flame builder's merged folded text (`STACK BEFORE AFTER` for diffs) */
} cli_render_mode;
/* Renders a view into out_path ("-" = stdout), complete-or-not-at-all. fopts may be NULL.
 * Prints errors naming the file. @return CLI_OK or CLI_FAILURE. */
int cli_render(const char *out_path, cli_render_mode mode, const ms_flame_options_t *fopts,
               cli_view_fn *view, void *arg);

/* The body of `memory` and `segments`: FILE [-o OUT] [--folded], OUT defaulting to output.svg. */
int cli_view_main(const char *cmd, const char *usage, ms_view_kind kind, int argc, char **argv);

#endif /* MEMSNAP_CLI_H */
