/* SPDX-License-Identifier: MIT
 * memsnap core: zlib streams behind the ms_sink_t / ms_source_t interfaces (lib/zio.c is the only
 * file that includes zlib.h).
 *
 * Compressed snapshot files use the gzip container (RFC 1952), so `zcat file | ...` works for
 * users; the deflate stream inside is plain zlib deflate at the chosen level. A compressed
 * snapshot is recognised from the content: a gzip header whose inflated content starts with the
 * memsnap magic (docs/snapshot-format.md).
 *
 * Decompression bombs: the zlib source refuses to produce more than
 * MS__ZIO_BOMB_SLACK + MS__ZIO_BOMB_RATIO x (compressed bytes consumed) bytes and fails with
 * MS_ELIMIT. Real snapshots compress 3-20x; deflate's theoretical maximum is about 1032x.
 *
 * Thread-safety: a stream is used by one thread at a time.
 */
#ifndef MEMSNAP_LIB_ZIO_H
#define MEMSNAP_LIB_ZIO_H

#include <stddef.h>
#include <stdint.h>

#include "memsnap/serialize.h"

#define MS__ZIO_BOMB_RATIO 256u
#define MS__ZIO_BOMB_SLACK (16u * 1024u * 1024u)

/* ---- compressing sink ---- */
typedef struct ms__zsink_s ms__zsink_t;

/* Creates a sink that gzip-compresses at `level` (1-9) into `inner` (which must outlive it).
 * *sink receives the compressing sink. @return MS_OK, MS_EINVAL (level) or MS_ENOMEM. */
int ms__zsink_create(ms_sink_t *inner, int level, ms__zsink_t **out, ms_sink_t *sink);
/* Finishes the stream (gzip trailer) and writes everything pending to inner.
 * @return MS_OK or the inner sink's error. */
/* From now on deflate with zlib's run-length strategy (rle) or the default one; what was written
 * before is compressed with the old one. @return MS_OK or the inner sink's error. */
int ms__zsink_rle(ms__zsink_t *z, int rle);
/* Whether the run-length strategy compresses sample[0..n) smaller than the default one at z's
 * level (each tried on its own, nothing written). @return 1 (rle), 0 (default, also on error). */
int ms__zsink_rle_better(const ms__zsink_t *z, const void *sample, size_t n);
int ms__zsink_finish(ms__zsink_t *z);
/* Frees the sink (without finishing). Accepts NULL. */
void ms__zsink_destroy(ms__zsink_t *z);

/* ---- decompressing source ---- */
typedef struct ms__zsource_s ms__zsource_t;

/* Creates a source that inflates a gzip (or zlib) stream read from `inner`, after first consuming
 * the `prefix_len` bytes at `prefix` (bytes already read from inner while detecting the format;
 * copied). Data after the end of the compressed stream is an error.
 * @return MS_OK or MS_ENOMEM. */
int ms__zsource_create(ms_source_t *inner, const void *prefix, size_t prefix_len,
                       ms__zsource_t **out, ms_source_t *src);
/* @return a description of the last failure of the source ("" if none), which names the offset
 * in the compressed input where it went wrong and how many bytes were inflated by then; static
 * until the next call on z. */
const char *ms__zsource_error(const ms__zsource_t *z);
/* Reads the rest of the stream and drops it, so that its end is checked (the CRC and length of
 * the gzip trailer, no trailing data). @return MS_OK at a sound end, 1 when more than max bytes
 * came out first (not checked), or the source's error (ms__zsource_error says what and where). */
int ms__zsource_drain(ms__zsource_t *z, uint64_t max);
/* Compressed bytes consumed so far. */
uint64_t ms__zsource_consumed(const ms__zsource_t *z);
void ms__zsource_destroy(ms__zsource_t *z);

/* ---- detection ---- */

/* @return true if head starts with a gzip member header (1f 8b 08). */
int ms__zio_is_gzip(const void *head, size_t len);
/* Inflates as much of the gzip stream prefix `head` as possible into out (at most cap bytes),
 * without failing on truncation. @return bytes produced (0 on corrupt data). */
size_t ms__zio_peek(const void *head, size_t len, void *out, size_t cap);

/* ---- one-shot compression (used by the benchmark's baseline) ---- */

/* Deflates src in one call at `level` with the gzip container into dst (the same settings as
 * the sink). *out_len receives the compressed size. @return MS_OK, MS_ELIMIT (dst too small) or
 * MS_ENOMEM. */
int ms__zio_deflate_buffer(int level, const void *src, size_t len, void *dst, size_t cap,
                           size_t *out_len);
/* Worst-case compressed size of len bytes (deflateBound plus the gzip header). */
size_t ms__zio_deflate_bound(size_t len);

#endif /* MEMSNAP_LIB_ZIO_H */
