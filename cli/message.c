/* SPDX-License-Identifier: MIT
 * memsnap CLI: messages in git's style on stderr, "memsnap: error: ..." and "memsnap: warning:
 * ...", and the library's own messages (ms_set_output), all with what they quote from inputs
 * escaped (cli_fputs_escaped): the lowest layer of cli/, which every other file may call. While
 * cli_msg_keep is set (cli/answers.c: a command's answer being kept), every line also goes there,
 * as written, so that a stored answer gives its messages again.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

ms_sink_t cli_msg_keep;

/* The library's messages may come from any thread: one line at a time. */
static pthread_mutex_t msg_mu = PTHREAD_MUTEX_INITIALIZER;

/* Writes prefix, text escaped and a newline to stderr; with cli_msg_keep set, gives it the same
 * bytes (or, when they cannot be copied, a NULL write: a message was lost). */
static void msg_line(const char *prefix, const char *text) {
  pthread_mutex_lock(&msg_mu);
  fflush(stdout);
  char *line = NULL;
  size_t n = 0;
  FILE *m = cli_msg_keep.write ? open_memstream(&line, &n) : NULL;
  if (m) {
    fputs(prefix, m);
    cli_fputs_escaped(text, m);
    fputc('\n', m);
  }
  if (m && fclose(m) == 0 && line) {
    fwrite(line, 1, n, stderr);
    (void)cli_msg_keep.write(cli_msg_keep.ctx, line, n);
  } else {
    if (cli_msg_keep.write) (void)cli_msg_keep.write(cli_msg_keep.ctx, NULL, 0);
    fputs(prefix, stderr);
    cli_fputs_escaped(text, stderr);
    fputc('\n', stderr);
  }
  free(line);
  pthread_mutex_unlock(&msg_mu);
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
