/* SPDX-License-Identifier: MIT
 * memsnap core: zlib sink and source (see zio.h). The only file that includes zlib.h.
 *
 * The sink compresses into a 256 KiB output buffer that it hands to the inner sink whenever it
 * fills, so memory stays bounded whatever the snapshot's size. The source inflates from a 64 KiB
 * input buffer refilled from the inner source, and enforces the decompression-bomb bound.
 */
#include "snapshot/zio.h"

#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include "common/internal.h"

#define ZSINK_OUT (256u * 1024u)
#define ZSOURCE_IN (64u * 1024u)
#define GZIP_WBITS (15 + 16) /* deflate: gzip container */
#define AUTO_WBITS (15 + 32) /* inflate: gzip or zlib, detected */

/* ---- sink ----------------------------------------------------------------------------------- */

struct ms__zsink_s {
  z_stream zs;
  ms_sink_t *inner;
  int level;
  int err; /* sticky inner-sink error */
  unsigned char out[ZSINK_OUT];
};

static int zsink_drain(ms__zsink_t *z) {
  size_t n = ZSINK_OUT - z->zs.avail_out;
  if (n) {
    int rc = z->inner->write(z->inner->ctx, (const char *)z->out, n);
    if (rc != MS_OK) return z->err = rc;
  }
  z->zs.next_out = z->out;
  z->zs.avail_out = ZSINK_OUT;
  return MS_OK;
}

static int zsink_write(void *ctx, const char *buf, size_t len) {
  ms__zsink_t *z = ctx;
  if (z->err) return z->err;
  while (len) {
    uInt chunk = len > UINT_MAX ? UINT_MAX : (uInt)len;
    z->zs.next_in = (Bytef *)(uintptr_t)buf;
    z->zs.avail_in = chunk;
    while (z->zs.avail_in) {
      if (z->zs.avail_out == 0) MS_FORWARD_IF_ERROR(zsink_drain(z));
      int zr = deflate(&z->zs, Z_NO_FLUSH);
      MS_RETURN_IF(zr != Z_OK && zr != Z_BUF_ERROR, z->err = MS_EIO);
    }
    buf += chunk;
    len -= chunk;
  }
  return MS_OK;
}

int ms__zsink_create(ms_sink_t *inner, int level, ms__zsink_t **out, ms_sink_t *sink) {
  MS_RETURN_IF(level < 1 || level > 9, MS_EINVAL);
  ms__zsink_t *z = calloc(1, sizeof *z);
  MS_RETURN_IF(!z, MS_ENOMEM);
  if (deflateInit2(&z->zs, level, Z_DEFLATED, GZIP_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK) {
    free(z);
    MS_RETURN_IF(1, MS_ENOMEM);
  }
  z->inner = inner;
  z->level = level;
  z->zs.next_out = z->out;
  z->zs.avail_out = ZSINK_OUT;
  sink->write = zsink_write;
  sink->ctx = z;
  *out = z;
  return MS_OK;
}

int ms__zsink_rle(ms__zsink_t *z, int rle) {
  if (z->err) return z->err;
  z->zs.next_in = NULL;
  z->zs.avail_in = 0;
  /* zlib compresses what it holds with the old strategy first, and answers Z_BUF_ERROR until
   * there was room enough for that */
  for (int tries = 0;; tries++) {
    int zr = deflateParams(&z->zs, z->level, rle ? Z_RLE : Z_DEFAULT_STRATEGY);
    if (zr == Z_OK) return MS_OK;
    MS_RETURN_IF(zr != Z_BUF_ERROR || tries > 1000000, z->err = MS_EIO);
    MS_FORWARD_IF_ERROR(zsink_drain(z));
  }
}

/* The deflated size of sample[0..n) at level with strategy (SIZE_MAX on error). */
static size_t zsink_trial(int level, int strategy, const void *sample, size_t n) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (deflateInit2(&zs, level, Z_DEFLATED, -MAX_WBITS, 8, strategy) != Z_OK) return SIZE_MAX;
  unsigned char out[16384];
  size_t total = 0;
  zs.next_in = (Bytef *)(uintptr_t)sample;
  zs.avail_in = n > UINT_MAX ? UINT_MAX : (uInt)n;
  int zr;
  do {
    zs.next_out = out;
    zs.avail_out = sizeof out;
    zr = deflate(&zs, Z_FINISH);
    total += sizeof out - zs.avail_out;
  } while (zr == Z_OK || zr == Z_BUF_ERROR);
  deflateEnd(&zs);
  return zr == Z_STREAM_END ? total : SIZE_MAX;
}

int ms__zsink_rle_better(const ms__zsink_t *z, const void *sample, size_t n) {
  size_t rle = zsink_trial(z->level, Z_RLE, sample, n);
  size_t def = zsink_trial(z->level, Z_DEFAULT_STRATEGY, sample, n);
  return rle < def;
}

int ms__zsink_finish(ms__zsink_t *z) {
  if (z->err) return z->err;
  z->zs.next_in = NULL;
  z->zs.avail_in = 0;
  for (;;) {
    if (z->zs.avail_out == 0) MS_FORWARD_IF_ERROR(zsink_drain(z));
    int zr = deflate(&z->zs, Z_FINISH);
    if (zr == Z_STREAM_END) break;
    MS_RETURN_IF(zr != Z_OK && zr != Z_BUF_ERROR, z->err = MS_EIO);
  }
  return zsink_drain(z);
}

void ms__zsink_destroy(ms__zsink_t *z) {
  if (!z) return;
  deflateEnd(&z->zs);
  free(z);
}

/* ---- source --------------------------------------------------------------------------------- */

struct ms__zsource_s {
  z_stream zs;
  ms_source_t *inner;
  unsigned char *prefix; /* bytes read during detection, replayed first */
  size_t prefix_len, prefix_pos;
  int eof;               /* inner exhausted */
  int done;              /* end of the compressed stream reached */
  int err;               /* sticky error */
  uint64_t in_total, out_total;
  char msg[256];
  unsigned char in[ZSOURCE_IN];
};

/* Records the source's (sticky) failure, with where it happened: the offset in the compressed
 * input where inflating stopped (the prefix replayed first is the input's start, so this is an
 * offset in the file), and how many bytes it had inflated by then. */
static ptrdiff_t zsource_fail(ms__zsource_t *z, int err, const char *what, const char *detail) {
  snprintf(z->msg, sizeof z->msg,
           "%s at offset %" PRIu64 " of the compressed file (%" PRIu64 " bytes inflated)%s%s", what,
           ms__zsource_consumed(z), z->out_total, detail ? ": " : "", detail ? detail : "");
  z->err = err;
  return err;
}

/* Refills the input buffer. @return MS_OK (possibly with eof set) or an error. */
static int zsource_fill(ms__zsource_t *z) {
  size_t n = 0;
  if (z->prefix_pos < z->prefix_len) {
    n = z->prefix_len - z->prefix_pos;
    if (n > ZSOURCE_IN) n = ZSOURCE_IN;
    memcpy(z->in, z->prefix + z->prefix_pos, n);
    z->prefix_pos += n;
  } else {
    ptrdiff_t r = z->inner->read(z->inner->ctx, (char *)z->in, ZSOURCE_IN);
    if (r < 0) return (int)r;
    if (r == 0) z->eof = 1;
    n = (size_t)r;
  }
  z->zs.next_in = z->in;
  z->zs.avail_in = (uInt)n;
  z->in_total += n;
  return MS_OK;
}

static ptrdiff_t zsource_read(void *ctx, char *buf, size_t cap) {
  ms__zsource_t *z = ctx;
  if (z->err) return z->err;
  if (z->done || cap == 0) return 0;
  if (cap > UINT_MAX) cap = UINT_MAX;
  z->zs.next_out = (Bytef *)buf;
  z->zs.avail_out = (uInt)cap;
  while (z->zs.avail_out == cap) {
    if (z->zs.avail_in == 0 && !z->eof) {
      int rc = zsource_fill(z);
      if (rc != MS_OK) return zsource_fail(z, rc, "cannot read the compressed stream", NULL);
      continue;
    }
    int zr = inflate(&z->zs, Z_NO_FLUSH);
    if (zr == Z_STREAM_END) {
      z->done = 1;
      /* Nothing may follow the compressed stream. */
      if (z->zs.avail_in == 0 && !z->eof) {
        int rc = zsource_fill(z);
        if (rc != MS_OK) return zsource_fail(z, rc, "cannot read the compressed stream", NULL);
      }
      if (z->zs.avail_in != 0) {
        z->out_total += cap - z->zs.avail_out;
        return zsource_fail(z, MS_EFORMAT, "trailing data after the compressed stream", NULL);
      }
      break;
    }
    if (zr == Z_BUF_ERROR && z->eof && z->zs.avail_in == 0) {
      z->out_total += cap - z->zs.avail_out; /* what it gave before the end of the input */
      return zsource_fail(z, MS_ETRUNCATED, "compressed stream is truncated", NULL);
    }
    if (zr == Z_MEM_ERROR) return zsource_fail(z, MS_ENOMEM, "out of memory inflating", NULL);
    if (zr != Z_OK && zr != Z_BUF_ERROR) {
      z->out_total += cap - z->zs.avail_out;
      return zsource_fail(z, MS_EFORMAT, "corrupt compressed data",
                          z->zs.msg ? z->zs.msg : "invalid deflate stream");
    }
  }
  size_t n = cap - z->zs.avail_out;
  z->out_total += n;
  if (z->out_total > MS__ZIO_BOMB_SLACK + (uint64_t)MS__ZIO_BOMB_RATIO * z->in_total) {
    char d[96];
    snprintf(d, sizeof d, "more than %u times the compressed size", MS__ZIO_BOMB_RATIO);
    return zsource_fail(z, MS_ELIMIT, "decompressed data is too large (decompression bomb?)", d);
  }
  return (ptrdiff_t)n;
}

int ms__zsource_create(ms_source_t *inner, const void *prefix, size_t prefix_len,
                       ms__zsource_t **out, ms_source_t *src) {
  ms__zsource_t *z = calloc(1, sizeof *z);
  MS_RETURN_IF(!z, MS_ENOMEM);
  if (prefix_len) {
    z->prefix = malloc(prefix_len);
    if (!z->prefix) {
      free(z);
      MS_RETURN_IF(1, MS_ENOMEM);
    }
    memcpy(z->prefix, prefix, prefix_len);
    z->prefix_len = prefix_len;
  }
  if (inflateInit2(&z->zs, AUTO_WBITS) != Z_OK) {
    free(z->prefix);
    free(z);
    MS_RETURN_IF(1, MS_ENOMEM);
  }
  z->inner = inner;
  src->read = zsource_read;
  src->ctx = z;
  *out = z;
  return MS_OK;
}

const char *ms__zsource_error(const ms__zsource_t *z) { return z->msg; }

int ms__zsource_drain(ms__zsource_t *z, uint64_t max) {
  char buf[16384];
  uint64_t start = z->out_total;
  for (;;) {
    ptrdiff_t n = zsource_read(z, buf, sizeof buf);
    if (n < 0) return (int)n;
    if (n == 0) return MS_OK;
    if (z->out_total - start > max) return 1;
  }
}

uint64_t ms__zsource_consumed(const ms__zsource_t *z) { return z->in_total - z->zs.avail_in; }

void ms__zsource_destroy(ms__zsource_t *z) {
  if (!z) return;
  inflateEnd(&z->zs);
  free(z->prefix);
  free(z);
}

/* ---- detection and one-shot helpers --------------------------------------------------------- */

int ms__zio_is_gzip(const void *head, size_t len) {
  const unsigned char *p = head;
  return len >= 3 && p[0] == 0x1f && p[1] == 0x8b && p[2] == 8;
}

size_t ms__zio_peek(const void *head, size_t len, void *out, size_t cap) {
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  if (inflateInit2(&zs, AUTO_WBITS) != Z_OK) return 0;
  zs.next_in = (Bytef *)(uintptr_t)head;
  zs.avail_in = len > UINT_MAX ? UINT_MAX : (uInt)len;
  zs.next_out = out;
  zs.avail_out = cap > UINT_MAX ? UINT_MAX : (uInt)cap;
  int zr = inflate(&zs, Z_SYNC_FLUSH);
  size_t n = (size_t)zs.total_out;
  inflateEnd(&zs);
  if (zr != Z_OK && zr != Z_STREAM_END && zr != Z_BUF_ERROR) return 0;
  return n;
}

size_t ms__zio_deflate_bound(size_t len) {
  if (len > ULONG_MAX / 2) return SIZE_MAX;
  return (size_t)compressBound((uLong)len) + 32;
}

int ms__zio_deflate_buffer(int level, const void *src, size_t len, void *dst, size_t cap,
                           size_t *out_len) {
  MS_RETURN_IF(level < 1 || level > 9, MS_EINVAL);
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  MS_RETURN_IF(deflateInit2(&zs, level, Z_DEFLATED, GZIP_WBITS, 8, Z_DEFAULT_STRATEGY) != Z_OK,
               MS_ENOMEM);
  const unsigned char *in = src;
  zs.next_out = dst;
  zs.avail_out = cap > UINT_MAX ? UINT_MAX : (uInt)cap;
  int zr = Z_OK;
  while (len) {
    uInt chunk = len > UINT_MAX ? UINT_MAX : (uInt)len;
    zs.next_in = (Bytef *)(uintptr_t)in;
    zs.avail_in = chunk;
    zr = deflate(&zs, Z_NO_FLUSH);
    if (zr != Z_OK || zs.avail_in) break;
    in += chunk;
    len -= chunk;
  }
  if (!len) zr = deflate(&zs, Z_FINISH);
  size_t n = (size_t)zs.total_out;
  deflateEnd(&zs);
  MS_RETURN_IF(zr != Z_STREAM_END, MS_ELIMIT);
  *out_len = n;
  return MS_OK;
}
