/* SPDX-License-Identifier: MIT
 * Helpers shared by the libFuzzer targets of tests/fuzz/ (header only; scripts/fuzz.sh builds
 * each fuzz_*.c alone): a growing memory sink; the readers of the fuzzer's input (option bytes
 * taken from its front, the rest as a string, a FILE*, or an ms_source_t read at once or in
 * pieces); and the check that turns a broken invariant into a crash libFuzzer reports.
 */
#ifndef MEMSNAP_FUZZ_UTIL_H
#define MEMSNAP_FUZZ_UTIL_H

#include <stdbool.h>
#include <stddef.h>
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

static inline int fz_buf_write(void *ctx, const char *buf, size_t len) {
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

static inline void fz_buf_reset(fz_buf_t *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* Whether the text ends with "</svg>" and then only newlines (one SVG document, complete). */
static inline int fz_svg_complete(const fz_buf_t *b) {
  size_t n = b->n;
  while (n > 0 && b->p[n - 1] == '\n')
    n--;
  return n >= 6 && memcmp(b->p + n - 6, "</svg>", 6) == 0;
}

/* ---- the fuzzer's input ---------------------------------------------------------------------- */

/* The input not yet taken: option bytes come off its front (fz_take), the rest is the payload. */
typedef struct fz_in_s {
  const uint8_t *p;
  size_t n;
} fz_in_t;

static inline fz_in_t fz_in(const uint8_t *data, size_t size) {
  fz_in_t in = {data, size};
  return in;
}

/* Takes the next byte into *b. @return false (in and *b unchanged) when none is left. */
static inline bool fz_take(fz_in_t *in, uint8_t *b) {
  if (in->n == 0) return false;
  *b = in->p[0];
  in->p++;
  in->n--;
  return true;
}

/* The rest as a NUL-terminated copy of at most max bytes (0: all of it); an inner NUL ends the
 * string early, as it would for a C caller. @return malloc'd text (free it), NULL without
 * memory. */
static inline char *fz_cstr(fz_in_t in, size_t max) {
  size_t n = max && in.n > max ? max : in.n;
  char *s = malloc(n + 1);
  if (!s) return NULL;
  if (n) memcpy(s, in.p, n);
  s[n] = 0;
  return s;
}

/* The rest as a stream to read ("rb"; close with fclose). fmemopen refuses (or misreads) an empty
 * buffer on some libcs: /dev/null is empty too. @return the stream, NULL on failure. */
static inline FILE *fz_fopen(fz_in_t in) {
  if (in.n == 0) return fopen("/dev/null", "rb");
  return fmemopen((void *)in.p, in.n, "rb");
}

/* The rest as an ms_source_t that returns it at once (piece 0) or at most `piece` bytes per read
 * (a reader must not depend on where reads end). */
typedef struct fz_source_s {
  ms_membuf_t mb;
  ms_source_t src;
  const uint8_t *p;
  size_t n, pos, piece;
} fz_source_t;

static inline ptrdiff_t fz_source_read_pieces(void *ctx, char *buf, size_t cap) {
  fz_source_t *f = ctx;
  size_t k = f->n - f->pos;
  if (k > f->piece) k = f->piece;
  if (k > cap) k = cap;
  if (k) memcpy(buf, f->p + f->pos, k);
  f->pos += k;
  return (ptrdiff_t)k;
}

/* Sets f up over in. @return &f->src, to read from. */
static inline ms_source_t *fz_source(fz_source_t *f, fz_in_t in, size_t piece) {
  memset(f, 0, sizeof *f);
  ms_source_init_mem(&f->src, &f->mb, in.p, in.n);
  f->p = in.p;
  f->n = in.n;
  f->piece = piece;
  if (piece) {
    f->src.read = fz_source_read_pieces;
    f->src.ctx = f;
  }
  return &f->src;
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
