/* SPDX-License-Identifier: MIT
 * memsnap CLI: names and sizes as the commands print them: "<stdin>" for "-", and
 * `_memory_viz.py`'s byte formatter. A bottom layer of cli/: it calls no other file of it.
 */
#include <inttypes.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

const char *cli_display_name(const char *path) {
  return strcmp(path, "-") == 0 ? "<stdin>" : path;
}


/* ---- formatting -------------------------------------------------------------------------------
 */

static const char *const units[] = {"", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "Zi"};

const char *cli_format_bytes(int64_t n, char buf[CLI_BYTES_BUFSZ]) {
  if (n >= 0 && n < ((int64_t)1 << 53)) {
    /* The common case without printf (`memsnap trace` formats millions): n / 1024^i is exact in
     * a double, so "%.1f" of it is 10n / 2^(10i) rounded to nearest, ties to even, as glibc's
     * printf rounds an exact value. */
    uint64_t u = (uint64_t)n;
    unsigned i = 0;
    while ((u >> (10 * i)) >= 1024) i++;
    unsigned sh = 10 * i;
    uint64_t t = 10 * u, q = t >> sh;
    if (sh) {
      uint64_t rem = t & (((uint64_t)1 << sh) - 1), half = (uint64_t)1 << (sh - 1);
      if (rem > half || (rem == half && (q & 1))) q++;
    }
    char digits[24];
    int k = 0;
    uint64_t ip = q / 10;
    do {
      digits[k++] = (char)('0' + ip % 10);
      ip /= 10;
    } while (ip);
    char *w = buf;
    while (k) *w++ = digits[--k];
    *w++ = '.';
    *w++ = (char)('0' + q % 10);
    for (const char *p = units[i]; *p; p++) *w++ = *p;
    *w++ = 'B';
    *w = 0;
    return buf;
  }
  return cli_format_bytes_double((double)n, buf);
}

const char *cli_format_ubytes(uint64_t n, char buf[CLI_BYTES_BUFSZ]) {
  return n <= (uint64_t)INT64_MAX ? cli_format_bytes((int64_t)n, buf)
                                  : cli_format_bytes_double((double)n, buf);
}

const char *cli_format_bytes_double(double v, char buf[CLI_BYTES_BUFSZ]) {
  for (size_t i = 0; i < sizeof units / sizeof *units; i++) {
    if (fabs(v) < 1024.0) {
      snprintf(buf, CLI_BYTES_BUFSZ, "%3.1f%sB", v, units[i]);
      return buf;
    }
    v /= 1024.0;
  }
  snprintf(buf, CLI_BYTES_BUFSZ, "%.1fYiB", v);
  return buf;
}
