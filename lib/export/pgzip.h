/* SPDX-License-Identifier: MIT
 * memsnap exports: one standard gzip member compressed on several threads, as pigz does. The
 * text comes in chunks; each chunk is raw-deflated on a worker of a pool, its dictionary primed
 * with the 32 KiB of text before it, and ended by a sync flush (an empty stored block, so that
 * the next chunk starts on a byte); the chunks' outputs are written in order after one gzip
 * header, then an empty final block and the trailer (the CRC-32 of the whole text, combined from
 * the chunks' with crc32_combine, and its length mod 2^32). gunzip, Python's gzip and every other
 * reader see one member whose bytes are the text's, whatever the chunks' sizes.
 */
#ifndef MEMSNAP_LIB_EXPORT_PGZIP_H
#define MEMSNAP_LIB_EXPORT_PGZIP_H

#include <stddef.h>

#include "memsnap/serialize.h"

/* The workers, shared by any number of streams (each stream is written from one thread). */
typedef struct ms__pgz_pool_s ms__pgz_pool_t;
typedef struct ms__pgz_s ms__pgz_t;

/* Starts `workers` threads (1 to 256) compressing at level (1-9).
 * @return MS_OK, MS_EINVAL, MS_ENOMEM (or no thread could start). */
int ms__pgz_pool_create(int workers, int level, ms__pgz_pool_t **out);
/* Stops the threads; every stream of the pool must have been destroyed. Accepts NULL. */
void ms__pgz_pool_destroy(ms__pgz_pool_t *p);

/* A gzip member into inner (which must outlive it); chunks are at most cap bytes.
 * @return MS_OK or MS_ENOMEM. */
int ms__pgz_create(ms__pgz_pool_t *pool, ms_sink_t *inner, size_t cap, ms__pgz_t **out);
/* A malloc'd buffer of cap bytes (a spare one of z's if any); NULL when out of memory. */
char *ms__pgz_buffer(ms__pgz_t *z);
/* Takes the malloc'd buffer *buf of cap bytes, whose first len bytes are the next text, to be
 * compressed, and puts a free buffer of cap bytes in *buf (with an error, and for len 0, *buf
 * stays the caller's: free it with free()). Blocks while as many chunks as the pool can keep busy
 * are in flight. Errors are sticky.
 * @return MS_OK, MS_ENOMEM, or the inner sink's error. */
int ms__pgz_write(ms__pgz_t *z, char **buf, size_t len);
/* Writes every pending chunk, the final block and the trailer. @return as ms__pgz_write. */
int ms__pgz_finish(ms__pgz_t *z);
/* Waits for z's chunks in flight and frees it (finished or not). Accepts NULL. */
void ms__pgz_destroy(ms__pgz_t *z);

#endif
