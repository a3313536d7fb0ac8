/* SPDX-License-Identifier: MIT
 * memsnap core: the public gzip sink (memsnap/serialize.h) over the zlib sink of zio.h.
 */
#include <stdlib.h>

#include "memsnap/serialize.h"
#include "snapshot/zio.h"

struct ms_gzip_sink_s {
  ms__zsink_t *z;
};

int ms_gzip_sink_create(ms_sink_t *inner, int level, ms_gzip_sink_t **out, ms_sink_t *sink) {
  ms_gzip_sink_t *g = malloc(sizeof *g);
  if (!g) return MS_ENOMEM;
  int rc = ms__zsink_create(inner, level, &g->z, sink);
  if (rc != MS_OK) {
    free(g);
    return rc;
  }
  *out = g;
  return MS_OK;
}

int ms_gzip_sink_rle(ms_gzip_sink_t *g, bool rle) { return ms__zsink_rle(g->z, rle); }

bool ms_gzip_sink_rle_better(const ms_gzip_sink_t *g, const void *sample, size_t n) {
  return ms__zsink_rle_better(g->z, sample, n) == 1;
}

int ms_gzip_sink_finish(ms_gzip_sink_t *g) { return ms__zsink_finish(g->z); }

void ms_gzip_sink_destroy(ms_gzip_sink_t *g) {
  if (!g) return;
  ms__zsink_destroy(g->z);
  free(g);
}
