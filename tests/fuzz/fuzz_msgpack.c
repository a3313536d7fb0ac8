/* SPDX-License-Identifier: MIT
 * libFuzzer target for memsnap's own snapshot reader (ms_snapshot_read, plain and gzip-compressed;
 * issue #3 section 4). Any input must give MS_OK or a described error ("offset N: ..."), never a
 * crash, a hang or unbounded memory. An uncompressed input is read a second time in small pieces,
 * which must give the same result (the reader decodes rows while it reads, and settles errors with
 * its guard scan: neither may depend on where reads end). An accepted input is written back (plain
 * and compressed) and read again, which must succeed with the same table sizes. A PyTorch pickle
 * seed is converted to the memsnap format first, so the pickle fixtures also exercise the writer
 * and the reader.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_msgpack/.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/pickle.h"
#include "memsnap/serialize.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct fz_buf_s {
  char *p;
  size_t n, cap;
} fz_buf_t;

static int fz_write(void *ctx, const char *buf, size_t len) {
  fz_buf_t *b = ctx;
  if (b->n + len > b->cap) {
    size_t nc = b->cap ? b->cap * 2 : 4096;
    while (nc < b->n + len)
      nc *= 2;
    char *np = realloc(b->p, nc);
    if (!np) return MS_ENOMEM;
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, buf, len);
  b->n += len;
  return MS_OK;
}

static void fz_check(int cond, const char *what) {
  if (!cond) {
    fprintf(stderr, "fuzz_msgpack: invariant violated: %s\n", what);
    abort();
  }
}

/* A memory source that returns at most `piece` bytes per read. */
typedef struct fz_pieces_s {
  const uint8_t *p;
  size_t n, pos, piece;
} fz_pieces_t;

static ptrdiff_t fz_pieces_read(void *ctx, char *buf, size_t cap) {
  fz_pieces_t *f = ctx;
  size_t k = f->n - f->pos;
  if (k > f->piece) k = f->piece;
  if (k > cap) k = cap;
  memcpy(buf, f->p + f->pos, k);
  f->pos += k;
  return (ptrdiff_t)k;
}

/* Reads data at once (piece 0) or in pieces. */
static ms_snapshot_t *fz_read_pieces(const void *data, size_t size, size_t piece, ms_errbuf_t *eb) {
  ms_membuf_t mb;
  ms_source_t src;
  fz_pieces_t fp = {data, size, 0, piece};
  ms_source_init_mem(&src, &mb, data, size);
  if (piece) {
    src.read = fz_pieces_read;
    src.ctx = &fp;
  }
  ms_snapshot_t *s = NULL;
  eb->msg[0] = 0;
  int rc = ms_snapshot_read(&src, &s, eb);
  if (rc != MS_OK) {
    fz_check(s == NULL, "out-parameter set on failure");
    fz_check(rc < 0 && eb->msg[0] != 0, "failure without a message");
  }
  return s;
}

static ms_snapshot_t *fz_read(const void *data, size_t size, ms_errbuf_t *eb) {
  return fz_read_pieces(data, size, 0, eb);
}

/* Writes s (plain, then compressed) and reads it back: the sizes must survive. */
static void fz_roundtrip(const ms_snapshot_t *s) {
  for (int level = 0; level <= 1; level++) {
    fz_buf_t b = {0};
    ms_sink_t sink = {fz_write, &b};
    ms_write_opts_t o = {level};
    ms_errbuf_t eb;
    if (ms_snapshot_write(s, &o, &sink, &eb) == MS_OK) {
      ms_snapshot_t *r = fz_read(b.p, b.n, &eb);
      fz_check(r != NULL, eb.msg);
      fz_check(r->nsegments == s->nsegments && r->nblocks == s->nblocks && r->ntrace == s->ntrace &&
                   r->nframes == s->nframes && r->nsettings == s->nsettings &&
                   r->nstats == s->nstats,
               "round trip changed the table sizes");
      ms_snapshot_free(r);
    }
    free(b.p);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ms_errbuf_t eb;
  if (ms_format_detect(data, size) == MS_FORMAT_PICKLE) {
    ms_membuf_t mb;
    ms_source_t src;
    ms_source_init_mem(&src, &mb, data, size);
    ms_snapshot_t *p = NULL;
    if (ms_pickle_read(&src, &p, &eb) == MS_OK) {
      fz_roundtrip(p);
      ms_snapshot_free(p);
    }
    return 0;
  }
  ms_snapshot_t *s = fz_read(data, size, &eb);
  if (size >= 2 && !(data[0] == 0x1f && data[1] == 0x8b)) {
    /* Plain input: the same result when it arrives in pieces. (Not for gzip: an error of zlib is
     * reported at the inflated offset of the failing read, which depends on the read sizes.) */
    ms_errbuf_t eb2;
    ms_snapshot_t *s2 = fz_read_pieces(data, size, 1 + size % 61, &eb2);
    fz_check((s == NULL) == (s2 == NULL), "read in pieces: accepted once only");
    if (s)
      fz_check(s2->nsegments == s->nsegments && s2->nblocks == s->nblocks &&
                   s2->ntrace == s->ntrace && s2->nframes == s->nframes &&
                   s2->nstacks == s->nstacks && s2->nsettings == s->nsettings,
               "read in pieces: other table sizes");
    else
      fz_check(strcmp(eb.msg, eb2.msg) == 0, "read in pieces: another error message");
    ms_snapshot_free(s2);
  }
  if (s) {
    fz_roundtrip(s);
    ms_snapshot_free(s);
  }
  return 0;
}
