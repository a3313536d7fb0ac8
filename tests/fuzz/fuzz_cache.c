/* SPDX-License-Identifier: MIT
 * libFuzzer target for the snapshot cache's reader, ms_cache_decode (issue #33): any bytes as a
 * cache file. The checksums are skipped (the fuzzer could never forge them), so that every input
 * reaches the structural checks. For every input:
 *  - the reader answers MS_OK with a snapshot or an error without one, never crashes;
 *  - with the checksums, it accepts no more than without them, and a file it accepts is refused
 *    less its last byte;
 *  - a snapshot it accepts is sound for the consumers: the time index builds over it (or refuses
 *    it cleanly), the memsnap writer writes it (or refuses it), and it encodes to a cache file
 *    that decodes, checksums on, to a snapshot that encodes to the same bytes;
 *  - the time index's file (ms_cache_index_decode): the bytes after the snapshot's file (whose
 *    length its header gives) are an index file of that snapshot, read with the checksums off;
 *    with them it accepts no more, and an index it accepts answers the index's queries (states,
 *    peaks, the state as a snapshot) without a crash. An index the snapshot's own timeline builds
 *    encodes to a file that decodes, checksums on, and encodes to the same bytes.
 *  - the input as a blob's file (ms_cache_blob_decode, the pages of `memsnap view`): accepted only
 *    whole and pointing into the input; with the checksums no more; re-encoded it decodes the same.
 * Seeds: entries of the fuzz_load corpus's snapshots, a page's blob, and two fixtures' entries with their index
 * entries appended.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_cache/.
 * fuzz-flags: -max_len=65536
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/internal.h"
#include "fuzz_util.h"
#include "memsnap/cache.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* The index's queries over an index that was accepted: they answer or refuse, never crash. */
static void fz_index_queries(const ms_timeline_t *tl) {
  for (size_t d = 0; d < ms_timeline_ndevices(tl) && d < 8; d++) {
    size_t n = ms_timeline_nentries(tl, d);
    for (size_t st = 0; st <= n; st += n / 3 + 1) {
      ms_snapshot_t *at = NULL;
      if (ms_timeline_snapshot_at(tl, d, st, NULL, &at) == MS_OK) ms_snapshot_free(at);
    }
    ms_tl_peak_t pk;
    (void)!ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, n, &pk);
  }
}

/* The index of s built, then through its file and back; and the input's index file (tail). */
static void fz_index(const ms_snapshot_t *s, const uint8_t *tail, size_t tail_len) {
  ms_cache_key_t key = {3, 4, 0};
  ms_timeline_t *tl = NULL, *back = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_timeline_create(s, NULL, &tl, NULL) == MS_OK) {
    void *a = NULL, *b = NULL;
    size_t la = 0, lb = 0;
    if (ms_cache_index_encode(tl, &key, &a, &la) == MS_OK) {
      FZ_CHECK(ms_cache_index_decode(a, la, &key, true, s, NULL, &back, &eb) == MS_OK,
               "an encoded index refused: %s", eb.msg);
      FZ_CHECK(ms_cache_index_encode(back, &key, &b, &lb) == MS_OK, "cannot encode an index");
      FZ_CHECK(la == lb && memcmp(a, b, la) == 0, "index: encode(decode(encode(x))) != encode(x)");
      ms_timeline_destroy(back);
      back = NULL;
    }
    free(a);
    free(b);
    ms_timeline_destroy(tl);
  }
  if (!tail_len) return;
  int rc = ms_cache_index_decode(tail, tail_len, NULL, false, s, NULL, &back, NULL);
  ms_timeline_t *t2 = NULL;
  int rc_sums = ms_cache_index_decode(tail, tail_len, NULL, true, s, NULL, &t2, NULL);
  FZ_CHECK(rc_sums != MS_OK || rc == MS_OK, "index accepted with checksums, refused without");
  ms_timeline_destroy(t2);
  if (rc != MS_OK) {
    FZ_CHECK(back == NULL, "index: out-parameter set on failure");
    return;
  }
  fz_index_queries(back);
  ms_timeline_destroy(back);
}

/* The input as a blob's file (a page of `memsnap view`): accepted only whole, its bytes inside the
 * input; with the checksums it accepts no more; re-encoded under its key it decodes the same. */
/* A hash memo's file (statmemo.c): refused, or accepted and written back byte for byte. */
static void fz_memo(const uint8_t *data, size_t size) {
  ms__cache_memo_t m;
  if (ms__cache_memo_decode(data, size, &m) != MS_OK) return;
  unsigned char b[MS_CACHE_MEMO_LEN];
  ms__cache_memo_encode(&m, b);
  FZ_CHECK(size == sizeof b && memcmp(b, data, size) == 0, "memo: encode(decode(x)) != x");
}

static void fz_blob(const uint8_t *data, size_t size) {
  const void *d = NULL, *d2 = NULL;
  size_t n = 0, n2 = 0;
  int rc = ms_cache_blob_decode(data, size, NULL, 0, false, &d, &n, NULL);
  int rc_sums = ms_cache_blob_decode(data, size, NULL, 0, true, &d2, &n2, NULL);
  FZ_CHECK(rc_sums != MS_OK || rc == MS_OK, "blob accepted with checksums, refused without");
  if (rc != MS_OK) {
    FZ_CHECK(d == NULL && n == 0, "blob: out-parameters set on failure");
    return;
  }
  FZ_CHECK((const uint8_t *)d >= data && n <= size && (const uint8_t *)d + n == data + size,
           "blob: its bytes are not the input's tail");
  FZ_CHECK(ms_cache_blob_decode(data, size - 1, NULL, 0, false, &d2, &n2, NULL) != MS_OK,
           "blob: an accepted file less its last byte was accepted too");
  ms_cache_key_t key = {9, 10, 0};
  void *a = NULL;
  size_t la = 0;
  if (ms_cache_blob_encode(&key, 11, d, n, &a, &la) == MS_OK) {
    FZ_CHECK(ms_cache_blob_decode(a, la, &key, 11, true, &d2, &n2, NULL) == MS_OK && n2 == n &&
                 memcmp(d2, d, n) == 0,
             "blob: encode then decode differs");
    free(a);
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  ms_snapshot_t *s = NULL, *t = NULL;
  fz_memo(data, size);
  fz_blob(data, size);
  ms_errbuf_t eb = {{0}};
  /* the snapshot's file, then (optionally) an index file */
  const uint8_t *tail = NULL;
  size_t tail_len = 0;
  if (size >= 40) {
    uint64_t flen = 0;
    for (int i = 7; i >= 0; i--) flen = flen << 8 | data[32 + i];
    if (flen < size) {
      tail = data + flen;
      tail_len = size - (size_t)flen;
      size = (size_t)flen;
    }
  }
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
  fz_index(s, tail, tail_len);
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
