/* SPDX-License-Identifier: MIT
 * memsnap CLI: messages in git's style on stderr, "memsnap: error: ..." and "memsnap: warning:
 * ...", and the library's own messages (ms_set_output), all with what they quote from inputs
 * escaped (cli_fputs_escaped): the lowest layer of cli/, which every other file may call. While
 * cli_msg_keep is set (cli/answers.c: a command's answer being kept), every line also goes there,
 * as written, so that a stored answer gives its messages again. A thread may hold its lines back
 * (cli_msg_hold: compare and check reading two files at once), to be written later in order.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

ms_sink_t cli_msg_keep;

/* The library's messages may come from any thread: one line at a time. */
static pthread_mutex_t msg_mu = PTHREAD_MUTEX_INITIALIZER;
/* This thread's lines held back (cli_msg_hold), or NULL. */
static _Thread_local cli_msg_held_t *msg_held;

/* Writes one whole line (n bytes, newline included) to stderr and, with cli_msg_keep set, gives
 * it the same bytes. Called with msg_mu held. */
static void msg_emit_locked(const char *line, size_t n) {
  fflush(stdout);
  fwrite(line, 1, n, stderr);
  if (cli_msg_keep.write) (void)cli_msg_keep.write(cli_msg_keep.ctx, line, n);
}

/* Writes prefix, text escaped and a newline to stderr, or to this thread's held lines; with
 * cli_msg_keep set, gives it the same bytes (or, when they cannot be copied, a NULL write: a
 * message was lost). */
static void msg_line(const char *prefix, const char *text) {
  if (msg_held && msg_held->f) {
    fputs(prefix, msg_held->f);
    cli_fputs_escaped(text, msg_held->f);
    fputc('\n', msg_held->f);
    return;
  }
  pthread_mutex_lock(&msg_mu);
  char *line = NULL;
  size_t n = 0;
  FILE *m = cli_msg_keep.write ? open_memstream(&line, &n) : NULL;
  if (m) {
    fputs(prefix, m);
    cli_fputs_escaped(text, m);
    fputc('\n', m);
  }
  if (m && fclose(m) == 0 && line) {
    msg_emit_locked(line, n);
  } else {
    fflush(stdout);
    if (cli_msg_keep.write) (void)cli_msg_keep.write(cli_msg_keep.ctx, NULL, 0);
    fputs(prefix, stderr);
    cli_fputs_escaped(text, stderr);
    fputc('\n', stderr);
  }
  free(line);
  pthread_mutex_unlock(&msg_mu);
}

void cli_msg_hold(cli_msg_held_t *h) {
  h->buf = NULL;
  h->len = 0;
  h->lost = false;
  h->f = open_memstream(&h->buf, &h->len);
  msg_held = h;
}

void cli_msg_hold_end(cli_msg_held_t *h) {
  if (msg_held == h) msg_held = NULL;
  if (h->f && fclose(h->f) != 0) {
    free(h->buf); /* lines lost: a stream that cannot be completed is not half printed */
    h->buf = NULL;
    h->len = 0;
    h->lost = true;
  }
  h->f = NULL;
}

void cli_msg_release(cli_msg_held_t *h, bool print) {
  if (print && (h->buf || h->lost)) {
    pthread_mutex_lock(&msg_mu);
    if (h->lost && cli_msg_keep.write) (void)cli_msg_keep.write(cli_msg_keep.ctx, NULL, 0);
    for (size_t i = 0; i < h->len;) {
      const char *nl = memchr(h->buf + i, '\n', h->len - i);
      size_t n = nl ? (size_t)(nl - (h->buf + i)) + 1 : h->len - i;
      msg_emit_locked(h->buf + i, n);
      i += n;
    }
    pthread_mutex_unlock(&msg_mu);
  }
  free(h->buf);
  h->buf = NULL;
  h->len = 0;
}

/* One message line; what it quotes from inputs is escaped (cli_fputs_escaped). */
static void vmsg(const char *prefix, const char *fmt, va_list ap) {
  char small[2048], *buf = small;
  va_list aq;
  va_copy(aq, ap);
  int n = vsnprintf(small, sizeof small, fmt, ap);
  if (n >= (int)sizeof small && (buf = malloc((size_t)n + 1)) != NULL)
    vsnprintf(buf, (size_t)n + 1, fmt, aq);
  va_end(aq);
  msg_line(prefix, buf ? buf : small);
  if (buf != small) free(buf);
}

/* The library's messages (ms_set_output), escaped as the CLI's own. */
void cli_lib_message(const char *msg, void *arg) {
  (void)arg;
  msg_line("", msg);
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
