/* SPDX-License-Identifier: MIT
 * memsnap CLI: output files (cli.h, issue #16). An output is written complete-or-not-at-all
 * through ms_atomic_file_t (a hidden temporary file renamed at the end; an existing FIFO,
 * device or symbolic link to one is written through), and this file adds what a command line
 * owes its user around it:
 *
 *  - no command writes over one of its inputs: every input is noted (device and inode, so a
 *    symbolic or hard link to it is caught, not only the same name) and an output that is the
 *    same file is refused before anything is written;
 *  - SIGINT, SIGTERM and SIGHUP while a temporary file exists remove it, then end the process
 *    with the signal (the handler unlinks the one registered path, then re-raises);
 *  - write errors say what happened: "no space left on device while writing 'OUT'", with
 *    standard output named '<stdout>'.
 */
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"

const char *cli_output_name(const char *path) {
  return strcmp(path, "-") == 0 ? "<stdout>" : path;
}

bool cli_quiet, cli_force;
static const char *cli_out_default_name; /* the output named by default, not by -o */

void cli_out_note_default(const char *path) {
  cli_out_default_name = path;
}

int cli_output_default(const char *cmd, const char **output, bool svg) {
  if (!*output) {
    *output = svg ? "output.svg" : "-";
    if (svg) cli_out_note_default(*output);
  }
  if (!(*output)[0]) return cli_usage_error(cmd, "option '--output' needs a file name");
  if (svg && strcmp(*output, "-") == 0 && isatty(STDOUT_FILENO))
    return cli_usage_error(cmd,
                           "refusing to write an SVG to a terminal; redirect it (-o - > out.svg, "
                           "-o - | ...) or name a file (-o out.svg)");
  return CLI_OK;
}

/* Whether the file at path was written by memsnap: its first 4 KiB name memsnap (the SVG's
 * "written by memsnap" comment, the viewer's "memsnap view" title). */
static bool cli_out_is_ours(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return true; /* cannot be read: the rename decides */
  char buf[4097];
  size_t n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = 0;
  return memmem(buf, n, "memsnap", 7) != NULL;
}

/* An output named by default (no -o) is written over an existing file only when memsnap wrote
 * that file, or with --force (memray's rule): a user's own output.svg is never lost silently. */
static int cli_out_check_overwrite(const char *path) {
  struct stat st;
  if (cli_force || !cli_out_default_name || strcmp(path, cli_out_default_name) != 0 ||
      stat(path, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size == 0 || cli_out_is_ours(path))
    return CLI_OK;
  cli_error("refusing to overwrite '%s', which memsnap did not write; name another output with "
            "-o, or add --force",
            path);
  return CLI_FAILURE;
}

/* "memsnap: wrote 'OUT' (1.2MiB); open it in a web browser" on stderr, unless -q. */
static void cli_out_say_written(const char *path) {
  struct stat st;
  if (cli_quiet || strcmp(path, "-") == 0 || stat(path, &st) != 0 || !S_ISREG(st.st_mode))
    return;
  char size[CLI_BYTES_BUFSZ];
  cli_format_bytes((int64_t)st.st_size, size);
  size_t n = strlen(path);
  bool page = (n >= 4 && strcmp(path + n - 4, ".svg") == 0) ||
              (n >= 5 && strcmp(path + n - 5, ".html") == 0);
  fflush(stdout);
  fputs("memsnap: wrote '", stderr);
  cli_fputs_escaped(path, stderr);
  fprintf(stderr, "' (%s)%s\n", size, page ? "; open it in a web browser" : "");
}

/* ---- inputs ---------------------------------------------------------------------------------- */

#define CLI_MAX_INPUTS 8

static struct {
  dev_t dev;
  ino_t ino;
  char name[256];
} cli_inputs[CLI_MAX_INPUTS];
static size_t cli_ninputs;

void cli_note_input(const char *path) {
  struct stat st;
  int rc = strcmp(path, "-") == 0 ? fstat(STDIN_FILENO, &st) : stat(path, &st);
  /* only regular files can be written over; `-o /dev/null` with /dev/null as input is fine */
  if (rc != 0 || !S_ISREG(st.st_mode) || cli_ninputs == CLI_MAX_INPUTS) return;
  cli_inputs[cli_ninputs].dev = st.st_dev;
  cli_inputs[cli_ninputs].ino = st.st_ino;
  snprintf(cli_inputs[cli_ninputs].name, sizeof cli_inputs[0].name, "%s", cli_display_name(path));
  cli_ninputs++;
}

int cli_out_check_inputs(const char *path) {
  struct stat st;
  if (strcmp(path, "-") == 0 || stat(path, &st) != 0) return CLI_OK;
  for (size_t i = 0; i < cli_ninputs; i++) {
    if (cli_inputs[i].dev != st.st_dev || cli_inputs[i].ino != st.st_ino) continue;
    if (strcmp(cli_inputs[i].name, path) == 0)
      cli_error("refusing to write the output over the input '%s'", path);
    else
      cli_error("refusing to write the output '%s' over the input '%s' (the same file)", path,
                cli_inputs[i].name);
    return CLI_FAILURE;
  }
  return CLI_OK;
}

/* ---- the temporary file on a signal ------------------------------------------------------- */

static const int cli_out_signals[] = {SIGINT, SIGTERM, SIGHUP};
/* The temporary files open at once (`export --csv` writes five): a slot each. */
#define CLI_TMP_SLOTS 8
static char cli_tmp_path[CLI_TMP_SLOTS][4096];
static volatile sig_atomic_t cli_tmp_set[CLI_TMP_SLOTS];

static void cli_out_on_signal(int sig) {
  for (int i = 0; i < CLI_TMP_SLOTS; i++)
    if (cli_tmp_set[i]) unlink(cli_tmp_path[i]);
  signal(sig, SIG_DFL);
  raise(sig); /* delivered when the handler returns (the signal is blocked while it runs) */
}

static void cli_out_install_handlers(void) {
  static bool installed;
  if (installed) return;
  installed = true;
  for (size_t i = 0; i < sizeof cli_out_signals / sizeof *cli_out_signals; i++) {
    struct sigaction old, sa;
    if (sigaction(cli_out_signals[i], NULL, &old) != 0 || old.sa_handler == SIG_IGN)
      continue; /* a signal ignored by whoever started us stays ignored (nohup, `cmd &`) */
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = cli_out_on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(cli_out_signals[i], &sa, NULL);
  }
}

/* Blocks the signals while the temporary file and its registration change together. */
static void cli_out_block(sigset_t *old) {
  sigset_t set;
  sigemptyset(&set);
  for (size_t i = 0; i < sizeof cli_out_signals / sizeof *cli_out_signals; i++)
    sigaddset(&set, cli_out_signals[i]);
  sigprocmask(SIG_BLOCK, &set, old);
}

static void cli_out_unblock(const sigset_t *old) {
  sigprocmask(SIG_SETMASK, old, NULL);
}

/* ---- output files ---------------------------------------------------------------------------- */

static atomic_uint_least64_t cli_out_written;

uint64_t cli_out_bytes_written(void) {
  return (uint64_t)atomic_load(&cli_out_written);
}

ms_sink_t cli_out_keep;

static int cli_out_write(void *ctx, const char *buf, size_t len) {
  cli_out_t *o = ctx;
  atomic_fetch_add(&cli_out_written, (uint_least64_t)len);
  if (cli_out_keep.write) (void)cli_out_keep.write(cli_out_keep.ctx, buf, len);
  if (len && fwrite(buf, 1, len, o->af.fp) != len) {
    if (!o->werr) o->werr = errno ? errno : EIO;
    return MS_EIO;
  }
  return 0;
}

int cli_out_open(cli_out_t *o, const char *path) {
  ms_errbuf_t eb = {{0}};
  memset(o, 0, sizeof *o);
  if (cli_out_check_inputs(path) != CLI_OK) return CLI_FAILURE;
  if (cli_out_check_overwrite(path) != CLI_OK) return CLI_FAILURE;
  cli_out_install_handlers();
  sigset_t old;
  cli_out_block(&old);
  int err = ms_atomic_file_open(&o->af, path, &eb);
  for (int i = 0; err == MS_OK && o->af.tmp_path && i < CLI_TMP_SLOTS; i++) {
    if (cli_tmp_set[i] || strlen(o->af.tmp_path) >= sizeof cli_tmp_path[i]) continue;
    strcpy(cli_tmp_path[i], o->af.tmp_path);
    cli_tmp_set[i] = 1;
    break;
  }
  cli_out_unblock(&old);
  if (err != MS_OK) {
    cli_error("%s", eb.msg[0] ? eb.msg : "cannot create the output file");
    return CLI_FAILURE;
  }
  o->path = path;
  o->sink.write = cli_out_write;
  o->sink.ctx = o;
  return CLI_OK;
}

/* Drops o's temporary file from the signal handler's list (signals blocked). */
static void cli_out_forget(const cli_out_t *o) {
  for (int i = 0; o->af.tmp_path && i < CLI_TMP_SLOTS; i++)
    if (cli_tmp_set[i] && strcmp(cli_tmp_path[i], o->af.tmp_path) == 0) cli_tmp_set[i] = 0;
}

void cli_out_abort(cli_out_t *o) {
  sigset_t old;
  cli_out_block(&old);
  cli_out_forget(o);
  ms_atomic_file_abort(&o->af);
  cli_out_unblock(&old);
}

/* Prints the error of a failed write: the errno a write met (ENOSPC said in words), else
 * detail. */
bool cli_stdout_error_reported;

static void cli_out_report(const cli_out_t *o, int e, const char *detail) {
  const char *name = cli_output_name(o->path ? o->path : "-");
  if (!o->path || strcmp(o->path, "-") == 0) cli_stdout_error_reported = true;
  if (e == ENOSPC)
    cli_error("no space left on device while writing '%s'", name);
  else if (e)
    cli_error("cannot write '%s': %s", name, strerror(e));
  else
    cli_error("cannot write '%s': %s", name, detail);
}

int cli_out_fail(cli_out_t *o, int err, const ms_errbuf_t *eb) {
  int e = o->werr;
  if (!e && err == MS_EIO && !(eb && eb->msg[0])) e = errno ? errno : EIO;
  cli_out_abort(o);
  cli_out_report(o, e, eb && eb->msg[0] ? eb->msg : ms_strerror(err));
  return CLI_FAILURE;
}

int cli_out_commit(cli_out_t *o) {
  ms_errbuf_t eb = {{0}};
  if (o->werr) return cli_out_fail(o, MS_EIO, NULL);
  if (fflush(o->af.fp) != 0 || ferror(o->af.fp)) {
    o->werr = errno ? errno : EIO;
    return cli_out_fail(o, MS_EIO, NULL);
  }
  sigset_t old;
  cli_out_block(&old);
  cli_out_forget(o);
  int err = ms_atomic_file_commit(&o->af, &eb);
  cli_out_unblock(&old);
  if (err != MS_OK) {
    const char *enospc = strerror(ENOSPC);
    if (strstr(eb.msg, enospc))
      cli_out_report(o, ENOSPC, NULL);
    else
      cli_error("%s", eb.msg[0] ? eb.msg : "cannot write the output file");
    return CLI_FAILURE;
  }
  cli_out_say_written(o->path);
  return CLI_OK;
}
