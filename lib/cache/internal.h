/* SPDX-License-Identifier: MIT
 * memsnap cache: what its files share (memsnap/cache.h). format.c: the flat file format (encode,
 * validate, decode); store.c: the directory, keys, atomic writes, LRU eviction, ms_cache_load.
 *
 * The file, all integers little-endian:
 *   header (CACHE_HEADER_BYTES): magic "memsnapC", u32 version, u32 load flags, u64 content hash,
 *     u64 input size, u64 file length, u64 body checksum, then CACHE_NSECTIONS x (u64 offset,
 *     u64 count), then u64 header checksum (of every byte before it);
 *   sections, each a run of fixed-width records at its offset (see format.c for each record),
 *   but the trace's, the stacks' and their frame indices', whose counts are their lengths in
 *   bytes (varints: format.c's w_trace, stackcode.c);
 *   strings are u32 offsets into the STRINGS section (one NUL-terminated string each; the section
 *   ends with a NUL), CACHE_NO_STR for a NULL string.
 * The checksums are cache_sum over 1 MiB chunks folded in order.
 */
#ifndef MEMSNAP_LIB_CACHE_INTERNAL_H
#define MEMSNAP_LIB_CACHE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/hash.h"
#include "memsnap/error.h"

enum {
  CS_SCALARS = 0,
  CS_SEGMENTS,
  CS_BLOCKS,
  CS_HISTORY,
  CS_DEVICES,
  CS_TRACE,
  CS_EXTRAS,
  CS_FRAMES,
  CS_STACKS,
  CS_STACK_FRAMES,
  CS_SETTINGS,
  CS_STATS,
  CS_ANNOTATIONS,
  CS_STRINGS,
  CACHE_NSECTIONS
};

#define CACHE_MAGIC "memsnapC"
#define CACHE_FIXED_BYTES 48u
#define CACHE_HEADER_BYTES (CACHE_FIXED_BYTES + 16u * CACHE_NSECTIONS + 8u)
#define CACHE_NO_STR UINT32_MAX
#define CACHE_SUM_CHUNK ((size_t)1 << 20)

/* A fast hash of a byte run: four independent lanes of wyhash's multiply-fold over 64 bytes per
 * round, so that it runs at memory speed. */
static inline uint64_t cache_sum(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t s[4] = {seed ^ MS_HASH_P0, seed ^ MS_HASH_P1, seed ^ MS_HASH_P2,
                   seed ^ 0x589965cc75374cc3ULL};
  size_t n = len;
  while (n >= 64) {
    for (int k = 0; k < 4; k++) {
      uint64_t a, b;
      memcpy(&a, p + 16 * k, 8);
      memcpy(&b, p + 16 * k + 8, 8);
      s[k] = ms_hash_mum(a ^ s[k] ^ MS_HASH_P0, b ^ MS_HASH_P1) ^ (s[k] >> 7 | s[k] << 57);
    }
    p += 64;
    n -= 64;
  }
  unsigned char tail[64] = {0};
  memcpy(tail, p, n);
  for (int k = 0; k < 4; k++) {
    uint64_t a, b;
    memcpy(&a, tail + 16 * k, 8);
    memcpy(&b, tail + 16 * k + 8, 8);
    s[k] = ms_hash_mum(a ^ s[k] ^ MS_HASH_P0, b ^ MS_HASH_P1 ^ (uint64_t)n) ^ s[k];
  }
  uint64_t h = ms_hash_step(ms_hash_step(s[0], s[1]), ms_hash_step(s[2], s[3]));
  return ms_hash_step(h, (uint64_t)len);
}

/* The checksum of a byte run: cache_sum of each 1 MiB chunk, folded in order. */
static inline uint64_t cache_checksum(const void *data, size_t len) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t h = 0x6d656d736e617073ULL;
  for (size_t off = 0; off < len; off += CACHE_SUM_CHUNK) {
    size_t n = len - off < CACHE_SUM_CHUNK ? len - off : CACHE_SUM_CHUNK;
    h = ms_hash_step(h, cache_sum(p + off, n, 0));
  }
  return ms_hash_step(h, (uint64_t)len);
}

/* The writer of a cache file's body (format.c), shared by the snapshot's and the index's files:
 * it streams the body through one chunk of CACHE_SUM_CHUNK bytes; each full chunk is added to
 * the body's checksum and handed on, to a growing buffer (fd < 0) or to the file fd, so that
 * writing a file of hundreds of MB takes 1 MiB of memory. */
typedef struct cache_out_s {
  unsigned char *chunk; /* CACHE_SUM_CHUNK bytes */
  size_t fill;          /* bytes in chunk */
  uint64_t pos;         /* file offset of chunk[fill] */
  uint64_t sum;         /* the body's checksum so far (cache_checksum's fold) */
  int fd;               /* >= 0: the file; else mem */
  unsigned char *mem;
  size_t mem_len, mem_cap;
  bool failed; /* a write or an allocation failed: later writes do nothing */
} cache_out_t;
/* Hands n bytes on to the file or the memory buffer, past the checksum. */
void ms__cache_out_raw(cache_out_t *w, const unsigned char *p, size_t n);
/* Adds the chunk's bytes to the checksum and hands them on. */
void ms__cache_out_flush(cache_out_t *w);
/* Appends n bytes to the body. */
void ms__cache_out_put(cache_out_t *w, const void *data, size_t n);

struct ms_snapshot_s;
struct ms_cache_key_s;
/* ms_cache_encode streamed to fd (a new, empty file; the header is written last, at offset 0),
 * in 1 MiB of memory. *len = the file's length. @return MS_OK, MS_EIO or MS_ENOMEM. */
int ms__cache_write_fd(int fd, const struct ms_snapshot_s *s, const struct ms_cache_key_s *key,
                       size_t *len);

struct ms_timeline_s;
struct ms_timeline_config_s;
/* The time index's file (index.c) streamed to fd as ms__cache_write_fd streams a snapshot's. */
int ms__cache_index_write_fd(int fd, const struct ms_timeline_s *tl,
                             const struct ms_cache_key_s *key, size_t *len);
/* ms_cache_index_decode; with release, release(release_arg) is called once buf is no longer
 * needed (at once on success: the index decodes into arrays of its own). On failure release is
 * not called. */
int ms__cache_index_decode(const void *buf, size_t len, const struct ms_cache_key_s *key,
                           bool check_sums, const struct ms_snapshot_s *snap,
                           const struct ms_timeline_config_s *cfg, void (*release)(void *),
                           void *release_arg, struct ms_timeline_s **out, ms_errbuf_t *eb);

/* stackcode.c: the sections CS_STACKS and CS_STACK_FRAMES of a snapshot's file (see that file).
 * The writers append to o (false on a failed write, or with *nomem when out of memory); the
 * readers fill t's stacks (nstacks, stacks) or frame indices (nstack_frames and stack_frames16 for
 * width 2, else stack_frames, of frames below nframes or not) from the section's len bytes, and
 * return NULL or what they refused (*nomem set when out of memory). */
bool ms__cache_w_stacks(cache_out_t *o, const struct ms_snapshot_s *s);
bool ms__cache_w_stack_frames(cache_out_t *o, const struct ms_snapshot_s *s, bool *nomem);
const char *ms__cache_r_stacks(const unsigned char *p, size_t len, struct ms_snapshot_s *t,
                               bool *nomem);
const char *ms__cache_r_stack_frames(const unsigned char *p, size_t len, unsigned width,
                                     size_t nframes, struct ms_snapshot_s *t, bool *nomem);
/* The threads ms__cache_w_stack_frames uses at most (its four lanes side by side). 0, the
 * default: one a lane, no more than the CPUs online, and one for a section of fewer than 4,096
 * indices; else that many (at most four) whatever the size: tests compare 1 and 4. */
extern unsigned ms__cache_sc_threads;

/* A blob's file (blob.c): its header, then its bytes. */
#define MS_CACHE_BLOB_HEADER 64u
void ms__cache_blob_header(unsigned char h[MS_CACHE_BLOB_HEADER], const struct ms_cache_key_s *key,
                           uint64_t tag, const void *data, size_t len);

/* statmemo.c: a file's content hash remembered by its identity (see that file). A memo is
 * MS_CACHE_MEMO_LEN bytes, in the cache directory under MS_CACHE_MEMO_PREFIX, the device and
 * the inode in hex. */
#define MS_CACHE_MEMO_LEN 96u
#define MS_CACHE_MEMO_PREFIX ".hash-"
struct stat;
typedef struct ms__cache_memo_s {
  uint64_t dev, ino, size;
  int64_t mtime_s, mtime_ns, ctime_s, ctime_ns;
  uint64_t hash;
} ms__cache_memo_t;
/* The memo of st's file with hash. */
void ms__cache_memo_of(const struct stat *st, uint64_t hash, ms__cache_memo_t *m);
/* Same device, inode, size and times (not the hash). */
bool ms__cache_memo_same(const ms__cache_memo_t *a, const ms__cache_memo_t *b);
void ms__cache_memo_encode(const ms__cache_memo_t *m, unsigned char out[MS_CACHE_MEMO_LEN]);
/* MS_OK, or MS_ETRUNCATED / MS_EFORMAT / MS_EVERSION for bytes it refuses. */
int ms__cache_memo_decode(const void *buf, size_t len, ms__cache_memo_t *m);
/* dir/MS_CACHE_MEMO_PREFIX<dev>-<ino> of st's file into buf. */
int ms__cache_memo_path(const char *dir, const struct stat *st, char *buf, size_t cap);
/* Whether fd's file system updates a file's change time on every write (memos are used there
 * only). */
bool ms__cache_memo_trusted_fs(int fd);
/* Whether st's modification and change times lie far enough before started_s (the wall clock's
 * seconds when the hashing started) for its hash to be remembered. */
bool ms__cache_memo_settled(const struct stat *st, int64_t started_s);
/* The hash the memo at path gives for st's file: MS_OK with *hash, or MS_ENOTFOUND (no memo, a
 * memo of other times; a memo it refuses is removed). */
int ms__cache_memo_read(const char *path, const struct stat *st, uint64_t *hash);

#endif /* MEMSNAP_LIB_CACHE_INTERNAL_H */
