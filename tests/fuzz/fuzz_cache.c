/* SPDX-License-Identifier: MIT
 * libFuzzer target for the snapshot cache's reader, ms_cache_decode (issue #33): any bytes as a
 * cache file. The checksums are skipped (the fuzzer could never forge them), so that every input
 * reaches the structural checks. For every input:
 *  - the reader answers MS_OK with a snapshot or an error without one, never crashes;
 *  - with the checksums, it accepts no more than without them, and a file it accepts is refused
 *    less its last byte;
 *  - a snapshot it accepts is sound for the consumers: the time index builds over it (or refuses
 *    it cleanly), the memsnap writer writes it (or refuses it), and it encodes to a cache file
 *    that decodes, checksums on, to a snapshot that encodes to the same bytes.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_cache/.
 * fuzz-flags: -max_len=65536
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "memsnap/cache.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ms_snapshot_t *s = NULL, *t = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_cache_decode(data, size, NULL, false, &s, &eb);
  int rc_sums = ms_cache_decode(data, size, NULL, true, &t, NULL);
  FZ_CHECK(rc_sums != MS_OK || rc == MS_OK, "accepted with checksums, refused without");
  ms_snapshot_free(t);
  t = NULL;
  if (rc == MS_OK && size > 0) { /* the length is in the header */
    FZ_CHECK(ms_cache_decode(data, size - 1, NULL, false, &t, NULL) != MS_OK,
             "an accepted file less its last byte was accepted too");
  }
  if (rc != MS_OK) {
    FZ_CHECK(s == NULL, "out-parameter set on failure");
    return 0;
  }
  FZ_CHECK(s != NULL, "MS_OK without a snapshot");
  ms_timeline_t *tl = NULL;
  if (ms_timeline_create(s, NULL, &tl, NULL) == MS_OK) ms_timeline_destroy(tl);
  fz_buf_t out = {0};
  ms_sink_t sink = {fz_buf_write, &out};
  (void)!ms_snapshot_write(s, NULL, &sink, NULL);
  free(out.p);
  ms_cache_key_t key = {1, 2, 0};
  void *a = NULL, *b = NULL;
  size_t la = 0, lb = 0;
  if (ms_cache_encode(s, &key, &a, &la) == MS_OK) {
    FZ_CHECK(ms_cache_decode(a, la, &key, true, &t, &eb) == MS_OK, "re-encoded file refused: %s",
             eb.msg);
    FZ_CHECK(ms_cache_encode(t, &key, &b, &lb) == MS_OK, "cannot encode a decoded snapshot");
    FZ_CHECK(la == lb && memcmp(a, b, la) == 0, "encode(decode(encode(x))) != encode(x)");
    ms_snapshot_free(t);
  }
  free(a);
  free(b);
  ms_snapshot_free(s);
  return 0;
}
