/* SPDX-License-Identifier: MIT
 * memsnap CLI: what the flame-graph views (memory, segments, compare) share with flamegraph.pl's
 * options (issue #16 item 11): --title, --width and --minwidth, and a default title that names
 * the view and its input ("memory — step_5.pickle (device 0)").
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* Parses a number in [lo, hi] for option name. @return 1, or 0 after printing a usage error. */
static int cli_vo_num(const char *cmd, const char *name, const char *s, double lo, double hi,
                      double *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || *end || !(v >= lo && v <= hi)) {
    cli_usage_error(cmd, "option '--%s' needs a number from %.10g to %.10g, not '%s'", name, lo,
                    hi, s);
    return 0;
  }
  *out = v;
  return 1;
}

const char *cli_base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash && slash[1] ? slash + 1 : path;
}

int cli_view_flame_options(const char *cmd, const cli_view_opts_t *vo, ms_flame_options_t *fo,
                           char *title_buf, size_t cap) {
  double v;
  if (vo->width) {
    if (!cli_vo_num(cmd, "width", vo->width, 21, 1000000, &v)) return CLI_USAGE;
    fo->width = (unsigned)v;
  }
  if (vo->minwidth) {
    size_t len = strlen(vo->minwidth);
    if (len > 1 && vo->minwidth[len - 1] == '%') {
      char num[64];
      snprintf(num, sizeof num, "%.*s", (int)(len - 1), vo->minwidth);
      if (!cli_vo_num(cmd, "minwidth", num, 0, 100, &fo->minwidth_pct)) return CLI_USAGE;
      if (fo->minwidth_pct == 0) fo->minwidth = 0;
    } else if (!cli_vo_num(cmd, "minwidth", vo->minwidth, 0, 1e9, &fo->minwidth)) {
      return CLI_USAGE;
    }
  }
  if (vo->title) {
    fo->title = vo->title;
  } else if (title_buf && cap) {
    fo->title = title_buf;
  }
  return CLI_OK;
}
