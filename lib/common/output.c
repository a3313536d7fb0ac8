/* SPDX-License-Identifier: MIT
 * memsnap core: the output hook. The library never writes to stdout or stderr itself; every
 * message goes through the installed ms_output_fn (default: one line to stderr). Repeated
 * warnings are capped so that a hot path cannot flood the output. */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/options.h"

#define MS_MAX_WARNINGS 100

static ms_output_fn *output_fn = NULL;
static void *output_arg = NULL;
static atomic_long warning_count;

static void output_default(const char *msg, void *arg) {
  (void)arg;
  fputs(msg, stderr);
  fputc('\n', stderr);
}

void ms_set_output(ms_output_fn *fn, void *arg) {
  output_fn = fn;
  output_arg = arg;
}

static void output_vmessage(const char *prefix, const char *fmt, va_list ap) {
  char buf[1024];
  size_t n = strlen(prefix);
  if (n >= sizeof buf) n = sizeof buf - 1;
  memcpy(buf, prefix, n);
  vsnprintf(buf + n, sizeof buf - n, fmt, ap);
  ms_output_fn *fn = output_fn ? output_fn : output_default;
  fn(buf, output_fn ? output_arg : NULL);
}

void ms__message(const char *prefix, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  output_vmessage(prefix, fmt, ap);
  va_end(ap);
}

void ms__warning(const char *fmt, ...) {
  long n = atomic_fetch_add(&warning_count, 1);
  if (n >= MS_MAX_WARNINGS) {
    if (n == MS_MAX_WARNINGS) ms__message("memsnap: warning: ", "%s", "further warnings suppressed");
    return;
  }
  va_list ap;
  va_start(ap, fmt);
  output_vmessage("memsnap: warning: ", fmt, ap);
  va_end(ap);
}

void ms__error_msg(const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  output_vmessage("memsnap: error: ", fmt, ap);
  va_end(ap);
}

void ms__assert_fail(const char *expr, const char *file, int line, const char *func) {
  ms__message("memsnap: error: ", "assertion failed: %s (%s:%d, %s)", expr, file, line, func);
  abort();
}

void ms__debug_trace_error(int err, const char *file, int line) {
  if (ms_option_is_enabled(MS_OPTION_TRACE_ERRORS))
    ms__message("memsnap: debug: ", "%s returned at %s:%d", ms_err_name(err), file, line);
}

int ms__errbuf_set(ms_errbuf_t *eb, int err, const char *fmt, ...) {
  if (eb) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    va_end(ap);
  }
  return err;
}

int ms_version(void) { return MS_VERSION; }

const char *ms_version_string(void) {
#define MS__STR2(x) #x
#define MS__STR(x) MS__STR2(x)
  return MS__STR(MS_VERSION_MAJOR) "." MS__STR(MS_VERSION_MINOR) "." MS__STR(MS_VERSION_PATCH);
}
