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

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <sys/stat.h>

#include "memsnap/attribution.h"
#include "memsnap/cache.h"
#include "memsnap/common.h"
#include "memsnap/compare.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"
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
int cmd_timeline(int argc, char **argv);
int cmd_top(int argc, char **argv);
int cmd_summary(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_export(int argc, char **argv);
int cmd_view(int argc, char **argv);
int cmd_trace_plot(int argc, char **argv);
int cmd_segment_plot(int argc, char **argv);
int cmd_explain(int argc, char **argv);
int cmd_check(int argc, char **argv);
int cmd_cache(int argc, char **argv);

/* The table, NULL-terminated (main.c), which main() hands to cmd-help.c as cli_command_table
 * before dispatching: help and "did you mean" read it there, so no file calls back into main.c. */
extern const struct cli_cmd cli_commands[];
extern const struct cli_cmd *cli_command_table;
/* @return the command named name in cli_command_table, or NULL (cmd-help.c). */
const struct cli_cmd *cli_find_command(const char *name);
/* "memsnap: error: 'stat' is not a memsnap command; did you mean 'stats'?"; @return CLI_USAGE. */
int cli_unknown_command(const char *name);
/* The list of commands, `memsnap --help`'s text. */
void cli_main_usage(FILE *fp);

/* Messages in git's style, to stderr: "memsnap: error: ..." / "memsnap: warning: ..."
 * (cli/message.c). cli_lib_message is the library's output hook (ms_set_output). */
void cli_lib_message(const char *msg, void *arg);
void cli_error(const char *fmt, ...) MS_PRINTF(1, 2);
void cli_warning(const char *fmt, ...) MS_PRINTF(1, 2);
/* While its write is set, every message line (those above, and the library's) is also written
 * there as it went to stderr; a write of (NULL, 0) says that a line could not be copied. Set by
 * cli/answers.c while it keeps an answer, so that the stored answer gives its messages again. */
extern ms_sink_t cli_msg_keep;
/* Message lines held back: between cli_msg_hold and cli_msg_hold_end, the calling thread's lines
 * go to h instead of stderr (a worker reading one of several files); cli_msg_release then writes
 * them as if printed at that moment (print true; to stderr and cli_msg_keep), or drops them, and
 * frees h. Lines that cannot be held (out of memory) are printed at once. */
typedef struct cli_msg_held_s {
  FILE *f;
  char *buf;
  size_t len;
  bool lost; /* lines that could not be held were lost */
} cli_msg_held_t;
void cli_msg_hold(cli_msg_held_t *h);
void cli_msg_hold_end(cli_msg_held_t *h);
void cli_msg_release(cli_msg_held_t *h, bool print);
/* Writes s with control bytes, DEL, C1 controls and invalid UTF-8 as \xNN (cli/escape.c): the
 * messages quote inputs, which must not drive the terminal. */
void cli_fputs_escaped(const char *s, FILE *fp);
/* Prints "memsnap: error: <msg>" and a hint to run `memsnap CMD --help`; @return CLI_USAGE. */
int cli_usage_error(const char *cmd, const char *fmt, ...) MS_PRINTF(2, 3);

/* Prints a help text with every line within 80 columns: a longer one is broken at a space and
 * its rest carried into the block's next line (cli/help.c). */
void cli_print_help(const char *text, FILE *fp);

/* "Did you mean": of the n candidates (NULL entries skipped), the one nearest to typed[0..len)
 * when it is a likely typo (one or two characters off, one for words of three or fewer) and
 * nearer than every other; else NULL (cli/suggest.c). */
const char *cli_suggest(const char *typed, size_t len, const char *const *cands, size_t n);

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
 * stdout. As getopt_long and argparse: an unambiguous prefix of a long name stands for it
 * (`--out` for `--output`), an ambiguous one is refused with its candidates; `_` in a long name
 * is read as `-` (`--filter_freed` = `--filter-freed`); `-d` is `--device` in every command that
 * has a --device and no other -d. An unknown option gets a "did you mean", and errors name
 * the option as the user typed it. Positional arguments go to pos (at most maxpos; more is a usage error), their number
 * to *npos. @return CLI_OK, CLI_HELP_SHOWN, or CLI_USAGE after printing the error. */
int cli_parse_options(const char *cmd, const char *usage, const struct cli_opt *opts, int argc,
                      char **argv, char **pos, int maxpos, int *npos);

/* "<stdin>" for "-", else path (cli/format.c). */
const char *cli_display_name(const char *path);
/* Loads a snapshot of any format ("-" = stdin) into *out. On failure prints
 * "memsnap: error: ..." naming the file and what is wrong, and returns CLI_FAILURE (*out
 * untouched). Shows a progress line on a terminal when loading takes more than a second. */
/* Whether the snapshot cache is in use: neither --no-cache nor MEMSNAP_CACHE=0. */
bool cli_cache_enabled(void);
/* cli_load() that uses a cached snapshot but does not store one on a miss (`view`, which stores
 * its page instead). */
int cli_load_unstored(const char *path, ms_snapshot_t **out);
int cli_load(const char *path, ms_snapshot_t **out);
/* cli_load() leaving out what flags (MS_LOAD_*, memsnap/serialize.h) say, e.g. MS_LOAD_NO_TRACE
 * for views of the state at the end, which need no trace. */
int cli_load_ex(const char *path, unsigned flags, ms_snapshot_t **out);
/* cli_load_ex()'s read alone, for a worker thread: no progress line, no note of the input (the
 * caller's cli_note_input) or of the key, which *key receives instead (all zero: not read
 * through the cache). Errors are printed. */
int cli_load_keyed(const char *path, unsigned flags, ms_snapshot_t **out, ms_cache_key_t *key);
/* The work on two files (compare's BEFORE and AFTER, check's SNAP and baseline): fn(ctx, 0) on
 * the calling thread and fn(ctx, 1) on a thread of its own when both are read at once, else one
 * after the other, side 1 only when side 0 succeeded (fn returns true). At once: with jobs 2 or
 * more; with jobs 0 (not given), when the machine has two cores or more and memory for both
 * reads: the files' bytes (a gzip one's counted 8 x) within a quarter of what the system can
 * still give (a read takes about half a pickle's bytes), neither being standard input. Under one
 * progress line `what`, counting both files' bytes; each side's messages are held and printed
 * after both, in the sides' order, side 1's only when side 0 succeeded: the same output either
 * way. fn reads with cli_load_keyed (no progress line of its own). @return both succeeded. */
typedef bool cli_side_fn(void *ctx, int k);
bool cli_two_sides(const char *paths[2], unsigned jobs, const char *what, cli_side_fn *fn,
                   void *ctx);
/* From now on, a read that leaves the allocations' stacks for later (MS_LOAD_DEFER_STACKS) and
 * does not go through the snapshot cache also classifies them as it reads them, for a classifier
 * of the rules file rules_path (NULL: the defaults; ms_attr_load), so that the classifier the
 * command makes then does not read the file again. For commands that classify every allocation
 * (top, timeline --by category, compare, check). A rules file that cannot be read is read as
 * usual by cli_attr_open, which says what is wrong. */
void cli_classify_on_read(const char *rules_path);
/* The text of the rules file path (*len bytes, at most one over the library's limit), quietly:
 * NULL when it cannot be read. free() it. */
char *cli_rules_text(const char *path, size_t *len);
/* cli_load_ex() through ms_snapshot_load_window() (window NULL: none), never through the snapshot
 * cache (a windowed snapshot is not a full one). */
int cli_load_window(const char *path, unsigned flags, const ms_load_window_t *window,
                    ms_snapshot_t **out);
/* The snapshot cache's key of a snapshot cli_load_ex loaded through the cache, else NULL (for
 * ms_cache_timeline: the time index through the cache). */
const ms_cache_key_t *cli_cache_key(const ms_snapshot_t *snap);
/* Notes key (all zero: none) as snap's, for cli_cache_key: what cli_load_ex does after a read,
 * for a snapshot read by cli_load_keyed. */
void cli_cache_key_note(const ms_snapshot_t *snap, const ms_cache_key_t *key);

/* A command's answer through the snapshot cache (cli/answers.c): a second run of the same
 * question on the same bytes prints what the first stored. Use: cli_answer_open(); when
 * cli_answer_serve() says true, the answer was printed and the command is done; else write the
 * answer to cli_answer_stream() (it goes to stdout as it is written; stdout itself when the
 * cache is off) and end with cli_answer_close(), which stores it when rc is CLI_OK, it is at
 * most 16 MiB, and loaded (the key the snapshot was read under, NULL: none) is the file's. The
 * messages printed from cli_answer_open() to cli_answer_close() (warnings: the command's, the
 * library's) are stored with it and printed again where they came, between the same bytes of
 * the answer. Every path after a cli_answer_open() that was not served ends in
 * cli_answer_close(). */
typedef struct cli_answer_s {
  bool on;              /* the question is cacheable */
  bool served;          /* the stored answer was written to stdout */
  ms_cache_key_t key;   /* the file's content, with the command's load flags */
  uint64_t tag;         /* of desc */
  char *desc;           /* the question, described (malloc'd) */
  size_t desc_len;
  const char *rules;    /* the --categories file, or NULL */
  struct stat rules_st; /* it, as hashed */
  FILE *out;            /* the answer being written: to stdout, and a copy into buf */
  char *buf;
  size_t len, cap;
  bool dropped;         /* the copy was given up (too large, out of memory, a message lost):
                           nothing stored */
  bool kept;            /* something was written to the copy */
  char *msgs;           /* the messages printed meanwhile (cli_msg_keep): records "OFFSET LEN\n"
                           and the LEN bytes of the line, OFFSET the answer's bytes before it */
  size_t msgs_len, msgs_cap;
} cli_answer_t;
/* cmd: the command's name; flags: the load flags it reads the file with; names[i], vals[i]: each
 * option the answer depends on as given (NULL: not given); json: --json; rules: the --categories
 * file (its content is part of the question). Not cacheable: standard input, not a regular
 * file, the cache off, a rules file that is not a regular file. */
void cli_answer_open(cli_answer_t *c, const char *cmd, const char *file, unsigned flags,
                     size_t nopts, const char *const *names, const char *const *vals, bool json,
                     const char *rules);
bool cli_answer_serve(cli_answer_t *c);
FILE *cli_answer_stream(cli_answer_t *c);
void cli_answer_close(cli_answer_t *c, int rc, const ms_cache_key_t *loaded);
/* For an answer the command writes to a file through cli_out_t (-o): cli_answer_serve_file
 * writes the stored answer to out_path (file: the input, which the output must not be):
 * CLI_OK or CLI_FAILURE (printed) when it did; CLI_USAGE when there is none, and the command
 * goes on. cli_answer_capture() then has every cli_out_t give a copy of what it writes to the
 * answer (cli_out_keep) until cli_answer_close(), which stores it as for an answer on stdout. */
int cli_answer_serve_file(cli_answer_t *c, const char *file, const char *out_path);
void cli_answer_capture(cli_answer_t *c);

/* A progress line on stderr, drawn only when stderr is a terminal and the operation has taken
 * more than a second; stop erases it. Not nestable. */
void cli_progress_start(const char *fmt, ...) MS_PRINTF(1, 2);
void cli_progress_stop(void);
/* The bytes an operation has done so far, for the progress line. */
typedef uint64_t cli_progress_count_fn(void);
/* Called just before cli_progress_start: the line then also says how far the operation is, from
 * count() less its value at the start: "45% (412.3MiB of 912.0MiB)" of total, or "412.3MiB"
 * when total is 0 (unknown). */
void cli_progress_count(cli_progress_count_fn *count, uint64_t total);
/* Bytes this process has read (/proc/self/io rchar; 0 where unknown): a read's progress. */
/* The number after "KEY:" in a file of lines "KEY: NUMBER ..." (/proc/self/io, /proc/meminfo);
 * 0 when the file or the key is missing. */
uint64_t cli_proc_value(const char *path, const char *key);
uint64_t cli_bytes_read(void);

/* ---- output files (cli/output.c) ---- */

/* "<stdout>" for "-", else path. */
const char *cli_output_name(const char *path);
/* Notes a file the command reads ("-": standard input, when it is a regular file); an output
 * naming the same file (device and inode: through a symbolic or hard link too) is refused by
 * cli_out_open(). cli_load() notes its file. */
void cli_note_input(const char *path);
/* @return CLI_OK, or CLI_FAILURE (printed) when path names the same file as a noted input
 * (cli_out_open checks it; a command writing its output otherwise calls it itself). */
int cli_out_check_inputs(const char *path);
/* An output file written complete-or-not-at-all (ms_atomic_file_t); "-" is standard output.
 * Write through `sink`. open refuses an input (cli_note_input); while the hidden temporary file
 * exists, SIGINT/SIGTERM/SIGHUP remove it before ending the process. commit/abort print their
 * errors and release the file. */
typedef struct cli_out_s {
  ms_atomic_file_t af;
  const char *path;
  ms_sink_t sink;
  int werr; /* errno of the first failed write through sink, 0 if none */
} cli_out_t;
/* While its write is set, a copy of every byte written through a cli_out_t goes there (its
 * result ignored): cli/answers.c keeps a command's output to store it. Not for outputs written
 * from several threads. */
extern ms_sink_t cli_out_keep;
/* Bytes written through every cli_out_t so far: a write's progress (cli_progress_count). */
uint64_t cli_out_bytes_written(void);
int cli_out_open(cli_out_t *o, const char *path);   /* @return CLI_OK or CLI_FAILURE */
int cli_out_commit(cli_out_t *o);                   /* @return CLI_OK or CLI_FAILURE */
void cli_out_abort(cli_out_t *o);
/* Aborts o after a writer returned err (eb: its message, may be NULL) and prints why, naming
 * the output: "no space left on device while writing 'OUT'", "cannot write 'OUT': ...".
 * @return CLI_FAILURE. */
int cli_out_fail(cli_out_t *o, int err, const ms_errbuf_t *eb);
/* -q/--quiet: no "memsnap: wrote 'OUT' (SIZE)" line after an output file is committed.
 * --force (and -f where a command has no -f of its own): write a default-named output over a
 * file that memsnap did not write. Set by cli_parse_options for every command. */
extern bool cli_quiet, cli_force;
/* Notes that path is the command's default output (no -o): cli_out_open refuses to write it
 * over a file that memsnap did not write, unless --force. cli_output_default notes its own. */
void cli_out_note_default(const char *path);
/* Set once a failed write to standard output has been reported (main.c says it only once). */
extern bool cli_stdout_error_reported;
/* The output of a view command: *output NULL (no -o) becomes output.svg for an SVG (as
 * _memory_viz.py) and standard output for folded text (as flamegraph tools); an SVG to standard
 * output that is a terminal is refused with a hint (to a pipe or a file it is written).
 * @return CLI_OK or CLI_USAGE (printed). */
int cli_output_default(const char *cmd, const char **output, bool svg);

/* (cli/format.c) _memory_viz.py's Bytes/_format_size: "%3.1f" and "", Ki, Mi, ... then "B" (e.g. "605.0KiB",
 * "-38.1MiB"). @return buf. */
#define CLI_BYTES_BUFSZ 48
const char *cli_format_bytes(int64_t n, char buf[CLI_BYTES_BUFSZ]);
/* The same for an unsigned count, and for a value Python holds as an int beyond int64_t (its
 * _format_size turns it into a float at the first division, as (double) does here). */
const char *cli_format_ubytes(uint64_t n, char buf[CLI_BYTES_BUFSZ]);
const char *cli_format_bytes_double(double v, char buf[CLI_BYTES_BUFSZ]);

/* A view for cli_render: emits its stacks through emit(ctx, ...). side is NULL for folded text;
 * otherwise a differential view sets *side to 0 before emitting BEFORE's stacks and to 1 before
 * AFTER's (a plain view leaves it alone). @return MS_OK or an ms_err. */
typedef int cli_view_fn(void *arg, ms_view_emit_fn *emit, void *ctx, int *side);
typedef enum cli_render_mode {
  CLI_RENDER_SVG = 0, /* the interactive flame graph (memsnap/viz.h) */
  CLI_RENDER_FOLDED,  /* the view's lines as they come (PyTorch's folded text) */
  CLI_RENDER_MERGED,  /* the flame builder's merged folded text (`STACK BEFORE AFTER` for diffs) */
} cli_render_mode;
/* Renders a view into out_path ("-" = stdout), complete-or-not-at-all (cli/view-main.c). fopts may be NULL.
 * Prints errors naming the file. @return CLI_OK or CLI_FAILURE. */
int cli_render(const char *out_path, cli_render_mode mode, const ms_flame_options_t *fopts,
               cli_view_fn *view, void *arg);

/* ---- JSON (cli/json.c) ---- */

/* A JSON writer over a sink; the first write error sticks in err and stops the rest. */
typedef struct cli_json_s {
  ms_sink_t *sink;
  int err;
} cli_json_t;
void cli_json_raw(cli_json_t *j, const char *s, size_t n);
void cli_json_lit(cli_json_t *j, const char *s);
/* A JSON string: '"', '\\' and control bytes escaped, bytes that are not UTF-8 as U+FFFD. */
void cli_json_str(cli_json_t *j, const char *s);
void cli_json_u64(cli_json_t *j, uint64_t v);
void cli_json_i64(cli_json_t *j, int64_t v);
/* Writes a document's own fields, each as `, "key": value`. */
typedef void cli_json_head_fn(cli_json_t *j, void *arg);
/* A view as JSON records into out_path ("-" = stdout), complete-or-not-at-all:
 * {"command": CMD<head's fields>, "records": [{"frames": [...], "bytes": N}, ...]}, with
 * "side": "before"|"after" in each record of a differential view. @return CLI_OK/CLI_FAILURE. */
int cli_render_json(const char *out_path, const char *cmd, cli_json_head_fn *head, void *head_arg,
                    cli_view_fn *view, void *arg);
/* A head of one field, `, "file": NAME` (head_arg: the name). */
void cli_json_head_file(cli_json_t *j, void *name);

/* Whether a trace entry passes --stream/--pool (filter NULL: all do) (cli/trace-json.c). */
bool cli_trace_entry_kept(const ms_tl_filter_t *f, const ms_snap_trace_t *e);
/* `trace --json`: each device's entries (only_dev, or SIZE_MAX for all) that pass filter, as
 * records with their index in the device's trace, plus first (the index of s's first entry of
 * only_dev in the whole trace: A of --range A:B) (cli/trace-json.c). @return CLI_OK. */
int cli_trace_json(FILE *out, const ms_snapshot_t *s, const char *file,
                   const ms_tl_filter_t *filter, size_t only_dev, size_t first);

/* ---- flamegraph.pl's options for the views (cli/view-opts.c) ---- */

/* --title, --width, --minwidth as given (NULL = absent). */
typedef struct cli_view_opts_s {
  const char *title, *width, *minwidth;
} cli_view_opts_t;
/* Applies vo to fo: --width (21 to 1,000,000 px), --minwidth (px, or N% of the total), --title;
 * without --title, fo->title = title_buf (the caller's default, e.g. "memory — x.pickle").
 * @return CLI_OK or CLI_USAGE (printed). */
int cli_view_flame_options(const char *cmd, const cli_view_opts_t *vo, ms_flame_options_t *fo,
                           char *title_buf, size_t cap);
/* The last component of a path ("-" stays "-"). */
const char *cli_base_name(const char *path);

/* The body of `memory` and `segments` (cli/view-main.c): FILE [-o OUT] [--folded], OUT defaulting to output.svg. */
int cli_view_main(const char *cmd, const char *usage, ms_view_kind kind, int argc, char **argv);

/* ---- time (cli/timeline-util.c, issue #12) ---- */

/* A decimal or 0x-hexadecimal unsigned number. @return true on success. */
bool cli_parse_u64(const char *s, uint64_t *out);
/* --jobs N's value, 1 to max, into *out. @return CLI_OK or CLI_USAGE (printed). */
int cli_parse_jobs(const char *cmd, const char *s, unsigned max, unsigned *out);

/* --device N, --range A:B, --stream S, --pool A,B and --at MOMENT, parsed. */
typedef struct cli_tl_args_s {
  bool has_device;
  size_t device;
  bool has_range;
  uint64_t first, last; /* trace entries, inclusive; last = UINT64_MAX when open */
  bool range_is_step;   /* --range step=N[:M]: the entries of ProfilerStep#N (to #M) */
  int64_t range_step, range_step_last;
  bool range_is_time;   /* --range t=T0:T1: the entries whose time_us lies in [T0, T1] */
  int64_t range_t0, range_t1;
  const char *range_text;
  ms_tl_filter_t filter;
  bool has_at;
  ms_tl_moment_t at;
  const char *at_text;
} cli_tl_args_t;
/* Parses the given option values (NULL = absent). @return CLI_OK or CLI_USAGE (printed). */
int cli_tl_args_parse(const char *cmd, cli_tl_args_t *ta, const char *device_s,
                      const char *range_s, const char *stream_s, const char *pool_s,
                      const char *at_s);
/* Whether the options need the trace read (a moment, a range or a device); without them a view
 * shows the end state, which the segments alone give (MS_LOAD_NO_TRACE). */
bool cli_tl_args_need_trace(const cli_tl_args_t *ta);
/* cli_load_ex() for a command that looks only at --range's window of the trace: a PyTorch
 * pickle is read for the window (ms_snapshot_load_window; a step= window finds the step's end
 * time in a first read without the trace), not through the snapshot cache; without a range, with
 * an open end, on standard input, with ta NULL (a command that classifies: categories need
 * every allocation's stack) or with MEMSNAP_WINDOW=0, cli_load_ex(). The answers are the same
 * either way. @return CLI_OK/CLI_FAILURE (printed). */
/* The message for a failed ms_timeline_state_at / ms_timeline_snapshot_at (rc): out of memory,
 * or the stacks of a trace read with MS_LOAD_DEFER_STACKS that could not be read. */
void cli_state_error(int rc);
int cli_load_range(const char *path, unsigned flags, const cli_tl_args_t *ta,
                   ms_snapshot_t **out);
/* Builds the time index (with the args' filter); prints the error. @return CLI_OK/CLI_FAILURE. */
int cli_tl_open(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                ms_timeline_t **out);
/* The device to show: --device (which must have a trace or segments) or the viewer's default
 * (the longest trace). Prints the error. @return CLI_OK/CLI_FAILURE. */
int cli_tl_device(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                  size_t *dev);
/* The steps [from, to] that --range covers on device dev. @return CLI_OK/CLI_FAILURE. */
int cli_tl_steps(const ms_timeline_t *tl, const char *name, const cli_tl_args_t *ta, size_t dev,
                 size_t *from, size_t *to);
/* "after entry 12 (alloc), 2026-04-28 08:43:50.123456 UTC (t=...)" or "before entry 0". */
void cli_moment_text(const ms_timeline_t *tl, size_t dev, size_t step, char *buf, size_t cap);
/* An entry's time as "2026-04-28 08:43:50.123456 UTC (t=1777365830123456)"; "" without one. */
void cli_format_time(const ms_snap_trace_t *e, char *buf, size_t cap);
/* The snapshot a view shows under --at/--range/--device/--stream/--pool: *out stays NULL when
 * none is given (show snap itself); else a snapshot of one device (all devices without --device
 * when keep_all_devices and no moment) at the moment (default: the end of the range), its trace
 * cut at the moment. Prints errors, including a filter that matches nothing.
 * @return CLI_OK/CLI_FAILURE. */
int cli_at_snapshot(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                    bool keep_all_devices, ms_snapshot_t **out, size_t *out_dev,
                    size_t *out_step);

typedef enum cli_top_by { CLI_TOP_STACK = 0, CLI_TOP_FRAME, CLI_TOP_FILE, CLI_TOP_SIZE } cli_top_by;
typedef struct cli_top_s {
  struct cli_top_entry_s {
    uint64_t bytes, count;
    uint64_t key;     /* stack index, frame index (UINT32_MAX: none), size */
    const char *skey; /* file name */
  } *items;           /* biggest first */
  size_t nitems;
  uint64_t total, count; /* allocated bytes and blocks */
  cli_top_by by;
} cli_top_t;
/* Groups the allocated blocks of s by stack, frame, file or size. @return MS_OK or MS_ENOMEM. */
int cli_top_compute(const ms_snapshot_t *s, cli_top_by by, cli_top_t *out);
void cli_top_release(cli_top_t *t);
void cli_top_label(const ms_snapshot_t *s, const cli_top_t *t, size_t i, char *buf, size_t cap);
/* The label of a stack in `top`: its innermost Python frame, else the innermost frame PyTorch's
 * filter keeps ("<no frame>" when none, "<no stack recorded>" for MS_SNAP_NO_STACK). */
void cli_stack_label(const ms_snapshot_t *s, uint32_t stack, char *buf, size_t cap);

/* ---- the content of `timeline`'s text and of its --json (cli/timeline-report.c) ---- */

#define CLI_TL_TOP_STACKS 5
/* A peak (of allocated or reserved bytes) and the stacks that held the most allocated bytes
 * then, biggest first (cli_top_label's labels). */
typedef struct cli_tl_peak_s {
  bool has; /* false: the range has no step (nothing to show) */
  ms_tl_peak_t p;
  const ms_snap_trace_t *entry; /* the entry after which it is reached; NULL before entry 0 */
  size_t nstacks;
  struct cli_tl_stack_s {
    uint64_t bytes, blocks;
    char label[512];
  } stacks[CLI_TL_TOP_STACKS];
} cli_tl_peak_t;
/* One ProfilerStep#N range on the device: entries [lo, hi), its peaks when it has entries. */
typedef struct cli_tl_step_s {
  int64_t step;
  size_t lo, hi;
  bool has_peaks, has_end;
  ms_tl_peak_t allocated, reserved;
} cli_tl_step_t;
/* Everything `timeline FILE` says about one device (within --range). */
typedef struct cli_tl_report_s {
  size_t dev, nentries, from, to; /* steps [from, to] of the device's nentries */
  bool has_range;
  const ms_snap_trace_t *first, *last; /* the first and last entries with a time; NULL: none */
  cli_tl_peak_t peaks[2];              /* allocated, reserved */
  size_t noom_all;                     /* OOM entries of the whole trace */
  size_t nooms;                        /* those within the range: */
  ms_tl_oom_t *ooms;
  size_t *oom_n; /* each one's N of --at oom:N */
  bool steps_wanted;
  char steps_error[sizeof(ms_errbuf_t)]; /* "" unless the steps could not be told apart */
  cli_tl_step_t *steps;
  size_t nsteps;
  int64_t peak_step; /* the step holding the peak of allocated; -1 none */
  bool has_whole_peak;
  size_t unmatched_ends, unknown_stages;
  uint64_t state[MS_TL_METRIC_COUNT]; /* at step `to` */
  bool has_before;                    /* before the first entry shown: */
  uint64_t before_allocated, before_reserved;
} cli_tl_report_t;
/* Computes the report of device dev over steps [from, to] (filter: --stream/--pool or NULL).
 * Prints errors. @return CLI_OK or CLI_FAILURE (*r released). */
int cli_tl_report(const ms_timeline_t *tl, size_t dev, size_t from, size_t to, bool has_range,
                  const ms_tl_filter_t *filter, bool steps, cli_tl_report_t *r);
void cli_tl_report_release(cli_tl_report_t *r);
/* One device's object of `timeline --json` (docs/timeline.md, "`--json`: the text as JSON");
 * a: --by category's classifier (NULL: none), its "categories" added.
 * @return CLI_OK or CLI_FAILURE (printed). */
int cli_tl_report_json(cli_json_t *j, const cli_tl_report_t *r, const ms_timeline_t *tl,
                       const ms_attr_t *a);

/* ---- categories and sources (cli/categories.c, issue #27) ---- */

/* Builds the classifier of snap over tl with the rules file rules_path (NULL: the defaults);
 * prints the error (naming the file and line of a bad rule). @return CLI_OK or CLI_FAILURE. */
int cli_attr_open(const ms_snapshot_t *snap, const ms_timeline_t *tl, const char *rules_path,
                  ms_attr_t **out);
/* `memory --by category`: the allocated blocks (of every device at its end, or of one device at
 * the moment ta gives) as a flame graph whose first level is the category, then the stack
 * (PyTorch's filter), widths the block sizes; rendered as cli_render (mode, fo) or as JSON
 * records. @return CLI_OK or CLI_FAILURE (printed). */
int cli_memory_by_category(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                           const char *rules, const char *output, cli_render_mode mode,
                           const ms_flame_options_t *fo, bool json);
/* `timeline --by category`: for device dev over steps [from, to], the bytes of each category at
 * the peak of allocated and each category's own peak: text on out, or, when j is given, the
 * JSON field `, "categories": [...]` (docs/cli.md). @return CLI_OK or CLI_FAILURE (printed). */
int cli_timeline_categories(FILE *out, cli_json_t *j, const ms_timeline_t *tl,
                            const ms_attr_t *a, size_t dev, size_t from, size_t to);
/* "category", "source", "stack". @return true when s is one of them. */
bool cli_attr_by_parse(const char *s, ms_attr_by *by);

/* ---- many ranks (cli/ranks.c, issue #17 §4) ---- */

/* `stats`, `top` and `timeline` with several FILEs or a directory: one row per file (rank): peaks, fragmentation at the peak, OOMs, the largest stack then; the
 * outliers; as text or JSON on stdout. Files are read by --jobs worker threads (default: one per
 * core), one snapshot per worker at a time. A file that cannot be read is an error row and makes
 * the status CLI_FAILURE. @return CLI_OK, CLI_FAILURE or CLI_USAGE. */
/* keep_going: a file that cannot be read is reported on stderr as a warning, and the exit is
 * still 0 (issue #31); without it, any such file makes the exit non-zero. */
int cli_ranks(const char *cmd, char **files, int nfiles, bool json, const char *jobs_s,
              bool keep_going);
/* cli_ranks on files only (no directory expansion). */
int cli_ranks_files(const char *cmd, char **files, int nfiles, bool json, const char *jobs_s,
                    bool keep_going);
/* `memsnap summary FILE [--json]`: the row of one rank (--json: one JSON line, for a job runner
 * to collect; the rows of `timeline --json`, without "outlier"). @return CLI_OK or CLI_FAILURE. */
int cli_summary(const char *file, bool json);
/* `memsnap timeline --from-summaries DIR`: the table of the ranks from the summaries (*.json) in
 * DIR, as cli_ranks prints it from the snapshots. */
int cli_ranks_from_summaries(const char *dir, bool json, bool keep_going);
/* Whether the positional arguments ask for the many-ranks table: several FILEs, or a directory
 * (which stands for the files in it, sorted by name). */
bool cli_ranks_wanted(char **files, int nfiles);
/* The files named by args, a directory standing for its regular, not hidden files in name order:
 * *out (free with cli_files_free) and *nout. @return CLI_OK or CLI_FAILURE (printed). */
int cli_expand_files(char **args, int nargs, char ***out, int *nout);
void cli_files_free(char **files, int n);

/* ---- compare's report and its many-ranks form (cli/compare-report.c, cli/compare-ranks.c,
 * issue #28) ---- */

/* `compare`'s default: the comparison of the files at paths[] (BEFORE, AFTER; the same path twice:
 * one file at two moments, read once; at[]: the moments' texts, NULL = the peak) as text or JSON
 * on stdout. Two files are read at once, each on a thread, when jobs is 2 or more, or when jobs
 * is 0 and the machine has the cores and memory for both; else one after the other, BEFORE
 * reduced to its figures and freed before AFTER is read. The output is the same either way. The
 * answer goes through the cache as the other commands' (cli_answer_t): qv[] are the options as
 * given (--at, the second --at, --device, -n; NULL: not given). @return CLI_OK, CLI_FAILURE or a
 * load's code (printed). */
int cli_compare_report(const char *paths[2], const char *at[2], const ms_compare_options_t *o,
                       bool json, const char *const qv[4], unsigned jobs);
/* Warnings about sides that differ in kind: devices, a side without a trace, device sizes. */
void cli_compare_warnings(const char *names[2], const ms_compare_t *c);
/* `compare DIR_A DIR_B`: the files of both directories paired by name, one row per rank, and the
 * ranks whose change stands out; jobs pairs at a time (0: one per core). @return CLI_OK,
 * CLI_FAILURE or CLI_USAGE. */
int cli_compare_ranks(const char *dir_a, const char *dir_b, const ms_compare_options_t *o,
                      bool json, unsigned jobs);

#endif /* MEMSNAP_CLI_H */
