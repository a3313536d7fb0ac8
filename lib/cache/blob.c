/* SPDX-License-Identifier: MIT
 * memsnap cache: derived bytes (memsnap/cache.h's blobs, e.g. the page `memsnap view` wrote),
 * filed under a snapshot's key and a tag that names what they were derived with.
 *
 * The file, integers little-endian: magic "memsnapB", u32 version, u32 load flags, u64 content
 * hash, u64 input size, u64 tag, u64 body length, u64 body checksum (cache_checksum), u64 header
 * checksum (cache_sum of the 56 bytes before it); then the body, the bytes themselves.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cache/internal.h"
#include "common/internal.h"
#include "memsnap/cache.h"

#define BLOB_MAGIC "memsnapB"

static void blob_le32(unsigned char *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static void blob_le64(unsigned char *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}
static uint32_t blob_rd32(const unsigned char *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t blob_rd64(const unsigned char *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

void ms__cache_blob_header(unsigned char h[MS_CACHE_BLOB_HEADER], const ms_cache_key_t *key,
                           uint64_t tag, const void *data, size_t len) {
  memcpy(h, BLOB_MAGIC, 8);
  blob_le32(h + 8, MS_CACHE_VERSION);
  blob_le32(h + 12, key->flags);
  blob_le64(h + 16, key->hash);
  blob_le64(h + 24, key->size);
  blob_le64(h + 32, tag);
  blob_le64(h + 40, (uint64_t)len);
  blob_le64(h + 48, cache_checksum(data, len));
  blob_le64(h + 56, cache_sum(h, 56, 1));
}

int ms_cache_blob_encode(const ms_cache_key_t *key, uint64_t tag, const void *data, size_t len,
                         void **buf, size_t *buflen) {
  if (!key || (!data && len) || !buf || !buflen || len > SIZE_MAX - MS_CACHE_BLOB_HEADER)
    return MS_EINVAL;
  unsigned char *b = malloc(MS_CACHE_BLOB_HEADER + len);
  if (!b) return MS_ENOMEM;
  ms__cache_blob_header(b, key, tag, data, len);
  if (len) memcpy(b + MS_CACHE_BLOB_HEADER, data, len);
  *buf = b;
  *buflen = MS_CACHE_BLOB_HEADER + len;
  return MS_OK;
}

int ms_cache_blob_decode(const void *buf, size_t len, const ms_cache_key_t *key, uint64_t tag,
                         bool check_sums, const void **data, size_t *data_len, ms_errbuf_t *eb) {
  if (data) *data = NULL;
  if (data_len) *data_len = 0;
  if (!buf || !data || !data_len) return MS_EINVAL;
  const unsigned char *h = buf;
  if (len < MS_CACHE_BLOB_HEADER)
    return ms__errbuf_set(eb, MS_ETRUNCATED, "cache blob: %zu bytes, shorter than its header",
                          len);
  if (memcmp(h, BLOB_MAGIC, 8) != 0)
    return ms__errbuf_set(eb, MS_EFORMAT, "cache blob: not a memsnap cache blob");
  if (blob_rd32(h + 8) != MS_CACHE_VERSION)
    return ms__errbuf_set(eb, MS_EVERSION, "cache blob: version %u, not %u", blob_rd32(h + 8),
                          MS_CACHE_VERSION);
  if (check_sums && blob_rd64(h + 56) != cache_sum(h, 56, 1))
    return ms__errbuf_set(eb, MS_EFORMAT, "cache blob: header checksum mismatch");
  if (key && (blob_rd32(h + 12) != key->flags || blob_rd64(h + 16) != key->hash ||
              blob_rd64(h + 24) != key->size))
    return ms__errbuf_set(eb, MS_ENOTFOUND, "cache blob: filed under another key");
  if (key && blob_rd64(h + 32) != tag)
    return ms__errbuf_set(eb, MS_ENOTFOUND, "cache blob: filed under another tag");
  uint64_t body = blob_rd64(h + 40);
  if (body != (uint64_t)(len - MS_CACHE_BLOB_HEADER))
    return ms__errbuf_set(eb, body > (uint64_t)(len - MS_CACHE_BLOB_HEADER) ? MS_ETRUNCATED
                                                                           : MS_EFORMAT,
                          "cache blob: a body of %llu bytes in a file of %zu",
                          (unsigned long long)body, len);
  if (check_sums && blob_rd64(h + 48) != cache_checksum(h + MS_CACHE_BLOB_HEADER, (size_t)body))
    return ms__errbuf_set(eb, MS_EFORMAT, "cache blob: body checksum mismatch");
  *data = h + MS_CACHE_BLOB_HEADER;
  *data_len = (size_t)body;
  return MS_OK;
}
