/* SPDX-License-Identifier: MIT
 * memsnap CLI: messages in git's style on stderr, "memsnap: error: ..." and "memsnap: warning:
 * ...", and the library's own messages (ms_set_output), all with what they quote from inputs
 * escaped (cli_fputs_escaped): the lowest layer of cli/, which every other file may call.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>

#include "cli.h"

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
void cli_lib_message(const char *msg, void *arg) {
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
