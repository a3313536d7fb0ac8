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

#include "fuzz_util.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Reads data at once (piece 0) or in pieces. */
static ms_snapshot_t *fz_read_pieces(const void *data, size_t size, size_t piece, ms_errbuf_t *eb) {
  fz_source_t fs;
  ms_source_t *src = fz_source(&fs, fz_in(data, size), piece);
  ms_snapshot_t *s = NULL;
  eb->msg[0] = 0;
  int rc = ms_snapshot_read(src, &s, eb);
  if (rc != MS_OK) {
    FZ_CHECK(s == NULL, "out-parameter set on failure");
    FZ_CHECK(rc < 0 && eb->msg[0] != 0, "failure without a message");
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
    ms_sink_t sink = {fz_buf_write, &b};
    ms_write_opts_t o = {level};
    ms_errbuf_t eb;
    if (ms_snapshot_write(s, &o, &sink, &eb) == MS_OK) {
      ms_snapshot_t *r = fz_read(b.p, b.n, &eb);
      FZ_CHECK(r != NULL, "%s", eb.msg);
      FZ_CHECK(r->nsegments == s->nsegments && r->nblocks == s->nblocks && r->ntrace == s->ntrace &&
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
    fz_source_t fs;
    ms_snapshot_t *p = NULL;
    if (ms_pickle_read(fz_source(&fs, fz_in(data, size), 0), &p, &eb) == MS_OK) {
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
    FZ_CHECK((s == NULL) == (s2 == NULL), "read in pieces: accepted once only");
    if (s)
      FZ_CHECK(s2->nsegments == s->nsegments && s2->nblocks == s->nblocks &&
                   s2->ntrace == s->ntrace && s2->nframes == s->nframes &&
                   s2->nstacks == s->nstacks && s2->nsettings == s->nsettings,
               "read in pieces: other table sizes");
    else
      FZ_CHECK(strcmp(eb.msg, eb2.msg) == 0, "read in pieces: another error message");
    ms_snapshot_free(s2);
  }
  if (s) {
    fz_roundtrip(s);
    ms_snapshot_free(s);
  }
  return 0;
}
