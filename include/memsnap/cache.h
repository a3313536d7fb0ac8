/* SPDX-License-Identifier: MIT
 * memsnap: the persistent snapshot cache (issue #33).
 *
 * Reading a 1 GB PyTorch pickle takes seconds; a user runs many commands on one file. The first
 * load of a file stores the model it gave (ms_snapshot_t, exactly as the reader built it for the
 * load flags asked) in a flat, relocatable cache file; later loads of the same bytes with the same
 * flags read that file instead of the pickle. The time index built over such a snapshot
 * (memsnap/timeline.h) is stored beside it (ms_cache_timeline) and later decoded from it.
 * Bytes derived from a snapshot (the page `memsnap view` wrote, the answer `memsnap top` printed)
 * are stored as blobs beside them (ms_cache_blob_put / ms_cache_blob_get).
 *
 *  - Location: $XDG_CACHE_HOME/memsnap/, else $HOME/.cache/memsnap/ (ms_cache_dir).
 *  - Key: a fast 64-bit hash of the input's whole content (ms_cache_hash_file), its size, the load
 *    flags and the format's version. A changed file is never answered from a stale entry, even
 *    with the same size and mtime.
 *  - Validation: a cache file is checked before use (magic, version, key, a checksum of its header
 *    and of its body, every section's offset and length within the file, every string offset
 *    within the string table, every index within its table, the model's invariants). Anything
 *    else is a miss: the entry is removed and rebuilt, never trusted.
 *  - Writes are atomic (a temporary file in the same directory, renamed over the entry), so
 *    concurrent runs see either no entry or a complete one.
 *  - Size: bounded (MEMSNAP_CACHE_MAX, default 4 GiB); after a store, the least recently used
 *    entries (a hit refreshes an entry's mtime) are evicted until the total fits.
 *  - Standard input ("-") and anything but a regular file are never cached.
 *  - MEMSNAP_CACHE=0 disables it (ms_cache_env_enabled).
 *
 * Thread-safety: every function may be called from any thread; distinct processes may share one
 * cache directory.
 */
#ifndef MEMSNAP_CACHE_H
#define MEMSNAP_CACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

MS_EXTERN_C_BEGIN

/* The format's version: entries of another version are misses (and evicted in time). */
#define MS_CACHE_VERSION 6u

/* What identifies an entry. */
typedef struct ms_cache_key_s {
  uint64_t hash;  /* ms_cache_hash_file of the input */
  uint64_t size;  /* the input's size in bytes */
  unsigned flags; /* MS_LOAD_* the snapshot was loaded with */
} ms_cache_key_t;

typedef struct ms_cache_options_s {
  const char *dir;    /* NULL: ms_cache_dir() */
  uint64_t max_bytes; /* 0: MEMSNAP_CACHE_MAX, else 4 GiB */
  bool read_only;     /* ms_cache_load_keyed: an entry is used, a miss is not stored */
} ms_cache_options_t;

/* How a load went (for tests, `memsnap cache`, benchmarks). */
typedef enum ms_cache_outcome {
  MS_CACHE_BYPASSED = 0, /* not cacheable (standard input, not a regular file, no directory) */
  MS_CACHE_HIT,          /* answered from the cache */
  MS_CACHE_STORED,       /* read from the input, and stored */
  MS_CACHE_MISSED,       /* read from the input, not stored (too large, the input changed, I/O) */
} ms_cache_outcome;

/* The cache directory into buf: $XDG_CACHE_HOME/memsnap (when set and absolute), else
 * $HOME/.cache/memsnap. @return MS_OK, MS_NOTFOUND (neither variable usable) or MS_LIMIT. */
MS_API MS_NODISCARD int ms_cache_dir(char *buf, size_t cap);

/* false when MEMSNAP_CACHE is "0", "off", "no" or "false". */
MS_API bool ms_cache_env_enabled(void);

/* The content hash of a file (several threads over 64 MiB chunks; the value does not depend on
 * their number). When the cache is enabled (ms_cache_env_enabled), a hash memo in ms_cache_dir()
 * gives it without reading the file when the file's device, inode, size, modification and
 * change times are those it had when it was hashed, and a hash computed is remembered there
 * when the file's times are settled and its file system sets the change time on every write
 * (docs/performance.md, "the hash memo"). @return MS_OK or MS_IO. */
MS_API MS_NODISCARD int ms_cache_hash_file(const char *path, uint64_t *hash, uint64_t *size);

/* ms_snapshot_load_ex through the cache: a hit maps the entry and builds the snapshot from it
 * without reading the input's format; a miss loads the input as ms_snapshot_load_ex does (same
 * result, same errors and messages) and stores the result. The snapshot is the same either way.
 * outcome may be NULL. */
MS_API MS_NODISCARD int ms_cache_load(const char *path, unsigned flags,
                                      const ms_cache_options_t *opts, ms_snapshot_t **out,
                                      ms_cache_outcome *outcome, ms_errbuf_t *eb);

/* ms_cache_load, and the key the snapshot is filed under into *key (for ms_cache_timeline): when
 * the input is not cacheable, *key is all zero. key may be NULL. With opts->read_only a miss is
 * read from the input and not stored (MS_CACHE_MISSED); *key is still given when the input did
 * not change while it was read. */
MS_API MS_NODISCARD int ms_cache_load_keyed(const char *path, unsigned flags,
                                            const ms_cache_options_t *opts, ms_snapshot_t **out,
                                            ms_cache_outcome *outcome, ms_cache_key_t *key,
                                            ms_errbuf_t *eb);

/* The time index of snap (ms_timeline_create with cfg) through the cache: snap must be what
 * ms_cache_load_keyed gave for key. A hit maps the index's entry (filed under key and cfg's
 * checkpoint interval and filter) and decodes it, without a pass over the trace; a miss
 * builds the index as ms_timeline_create does (same result, same errors) and stores it. key NULL
 * or all zero: ms_timeline_create alone. The index is the same either way. outcome may be NULL. */
MS_API MS_NODISCARD int ms_cache_timeline(const ms_cache_key_t *key, const ms_cache_options_t *opts,
                                          const ms_snapshot_t *snap,
                                          const ms_timeline_config_t *cfg, ms_timeline_t **out,
                                          ms_cache_outcome *outcome, ms_errbuf_t *eb);

/* The entries in dir (NULL: ms_cache_dir()): their number and total bytes. */
MS_API MS_NODISCARD int ms_cache_usage(const char *dir, size_t *nfiles, uint64_t *bytes);
/* Removes every entry (and hash memo, and stale temporary file) of dir; *removed (may be NULL):
 * the entries and temporary files removed. */
MS_API MS_NODISCARD int ms_cache_clear(const char *dir, size_t *removed);
/* Evicts the least recently used entries of dir until their total is at most max_bytes. */
MS_API MS_NODISCARD int ms_cache_evict(const char *dir, uint64_t max_bytes);
/* The bound in force: MEMSNAP_CACHE_MAX (bytes, or with a K, M or G suffix), else 4 GiB. */
MS_API uint64_t ms_cache_max_bytes(void);

/* The format itself. encode writes snap as a cache file for key into a malloc'd buffer;
 * decode checks one (key NULL: any key; check_sums false: skip the checksums, so that fuzzing
 * reaches the structural checks) and builds the snapshot. decode returns MS_FORMAT,
 * MS_TRUNCATED, MS_VERSION or MS_NOTFOUND (another key) for a file it refuses, never crashes. */
MS_API MS_NODISCARD int ms_cache_encode(const ms_snapshot_t *snap, const ms_cache_key_t *key,
                                        void **buf, size_t *len);
MS_API MS_NODISCARD int ms_cache_decode(const void *buf, size_t len, const ms_cache_key_t *key,
                                        bool check_sums, ms_snapshot_t **out, ms_errbuf_t *eb);

/* The time index's file: encode writes tl (built over a snapshot filed under key) into a
 * malloc'd buffer; decode checks one against key (NULL: any), the snapshot snap it must index and
 * cfg (NULL: the defaults), and builds the index, which owns its memory. decode returns
 * MS_FORMAT, MS_TRUNCATED, MS_VERSION or MS_NOTFOUND (another key or configuration) for a file it
 * refuses, never crashes. */
MS_API MS_NODISCARD int ms_cache_index_encode(const ms_timeline_t *tl, const ms_cache_key_t *key,
                                              void **buf, size_t *len);
MS_API MS_NODISCARD int ms_cache_index_decode(const void *buf, size_t len,
                                              const ms_cache_key_t *key, bool check_sums,
                                              const ms_snapshot_t *snap,
                                              const ms_timeline_config_t *cfg,
                                              ms_timeline_t **out, ms_errbuf_t *eb);

/* Blobs: bytes derived from a snapshot (the page `memsnap view` wrote for it), filed under the
 * snapshot's key and a tag that names everything else they were derived with (options, the
 * program's version). The entries are bounded, evicted and checked like the others.
 *
 * ms_cache_blob_get writes the stored bytes to sink: MS_OK; MS_NOTFOUND when there is no entry
 * (or a refused one, which is removed) and nothing was written; else the sink's error. */
MS_API MS_NODISCARD int ms_cache_blob_get(const ms_cache_key_t *key, uint64_t tag,
                                          const ms_cache_options_t *opts, ms_sink_t *sink);
/* Stores data[0..len) for key and tag (atomically; nothing when len is over the bound).
 * @return MS_OK, MS_EINVAL (key all zero), MS_ELIMIT or MS_EIO. */
MS_API MS_NODISCARD int ms_cache_blob_put(const ms_cache_key_t *key, uint64_t tag,
                                          const ms_cache_options_t *opts, const void *data,
                                          size_t len);
/* The blob's file: encode into a malloc'd buffer; decode checks one against key and tag (key
 * NULL: any key and tag) and points *data into buf. decode returns MS_FORMAT, MS_TRUNCATED,
 * MS_VERSION or MS_NOTFOUND (another key or tag) for a file it refuses, never crashes. */
MS_API MS_NODISCARD int ms_cache_blob_encode(const ms_cache_key_t *key, uint64_t tag,
                                             const void *data, size_t len, void **buf,
                                             size_t *buflen);
MS_API MS_NODISCARD int ms_cache_blob_decode(const void *buf, size_t len,
                                             const ms_cache_key_t *key, uint64_t tag,
                                             bool check_sums, const void **data,
                                             size_t *data_len, ms_errbuf_t *eb);

MS_EXTERN_C_END

#endif /* MEMSNAP_CACHE_H */
