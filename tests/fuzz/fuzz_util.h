/* SPDX-License-Identifier: MIT
 * Helpers shared by the libFuzzer targets of tests/fuzz/ (header only; scripts/fuzz.sh builds
 * each fuzz_*.c alone): a growing memory sink, a byte reader over the fuzzer's input, and the
 * check that turns a broken invariant into a crash libFuzzer reports.
 */
#ifndef MEMSNAP_FUZZ_UTIL_H
#define MEMSNAP_FUZZ_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/error.h"
#include "memsnap/serialize.h"

/* A sink into memory; limit (0 = none) makes writes past it fail with MS_EIO, as a full disk. */
typedef struct fz_buf_s {
  char *p;
  size_t n, cap, limit;
} fz_buf_t;

static int fz_buf_write(void *ctx, const char *buf, size_t len) {
  fz_buf_t *b = ctx;
  if (b->limit && b->n + len > b->limit) return MS_EIO;
  if (b->n + len + 1 > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 4096;
    while (nc < b->n + len + 1)
      nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) return MS_ENOMEM;
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, buf, len);
  b->n += len;
  b->p[b->n] = 0;
  return MS_OK;
}

static void fz_buf_reset(fz_buf_t *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* Whether the text ends with "</svg>" and then only newlines (one SVG document, complete). */
static int fz_svg_complete(const fz_buf_t *b) {
  size_t n = b->n;
  while (n > 0 && b->p[n - 1] == '\n')
    n--;
  return n >= 6 && memcmp(b->p + n - 6, "</svg>", 6) == 0;
}

/* Aborts (a crash for libFuzzer) with what broke. */
#define FZ_CHECK(cond, ...)                                                                        \
  do {                                                                                             \
    if (!(cond)) {                                                                                 \
      fprintf(stderr, "%s: invariant violated (%s:%d): ", __FILE__, __FILE__, __LINE__);           \
      fprintf(stderr, __VA_ARGS__);                                                                \
      fputc('\n', stderr);                                                                         \
      abort();                                                                                     \
    }                                                                                              \
  } while (0)

/* A failure returned with a message: never an empty one. */
#define FZ_DESCRIBED(rc, eb)                                                                       \
  FZ_CHECK((rc) == MS_OK || (eb).msg[0] != 0, "error %d without a message", (rc))

#endif /* MEMSNAP_FUZZ_UTIL_H */
