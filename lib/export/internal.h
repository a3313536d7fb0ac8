/* SPDX-License-Identifier: MIT
 * memsnap exports (issue #17): what the format writers share. A growable byte buffer and the JSON
 * string escaping that the SQLite export (frames and settings as JSON text) and the Chrome trace
 * writer use, so that any name (quotes, backslashes, markup, control characters) stays valid
 * JSON and reads back unchanged.
 */
#ifndef MEMSNAP_LIB_EXPORT_INTERNAL_H
#define MEMSNAP_LIB_EXPORT_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

/* A growable buffer; `oom` is sticky: after a failed growth every append is a no-op. */
typedef struct ms__xbuf_s {
  char *ptr;
  size_t len, cap;
  bool oom;
} ms__xbuf_t;

void ms__xbuf_release(ms__xbuf_t *b);
void ms__xbuf_put(ms__xbuf_t *b, const void *p, size_t n);
void ms__xbuf_puts(ms__xbuf_t *b, const char *s);
void ms__xbuf_printf(ms__xbuf_t *b, const char *fmt, ...) MS_PRINTF(2, 3);
/* A JSON string with its quotes: '"' and '\' escaped, control characters as \uXXXX, valid UTF-8
 * unchanged, and each byte that is not part of valid UTF-8 (the readers do not validate it) as
 * \ufffd, so that the result is always JSON that strict parsers accept. */
void ms__xbuf_json_str(ms__xbuf_t *b, const char *s);
/* Whether s (NUL-terminated) is valid UTF-8 (no overlong form, surrogate or code past U+10FFFF). */
bool ms__utf8_valid(const char *s);
/* Appends s with each byte that is not part of valid UTF-8 replaced by U+FFFD, as
 * ms__xbuf_json_str does: for outputs whose strings must be UTF-8 (pprof, SQLite TEXT). */
void ms__xbuf_utf8(ms__xbuf_t *b, const char *s);
/* A NUL-terminated view of the content (appends a NUL not counted in len). "" after oom. */
const char *ms__xbuf_cstr(ms__xbuf_t *b);

/* The snapshot's allocator settings as one JSON object ("{}" without any). */
void ms__export_settings_json(ms__xbuf_t *b, const ms_snapshot_t *snap);
/* A short name of the snapshot's producer: "memsnap", "pytorch" or "pytorch (list, before 2.0)". */
const char *ms__export_producer(const ms_snapshot_t *snap);

/* The file's peak of allocated memory: the highest over the devices with a trace, ties to the
 * first device and entry, as the timeline rows give it. Kept per file (the snapshot table's and
 * peaks.csv.gz's peak columns) so that "which rank peaked" reads one row per file instead of
 * every timeline row. @return false without a time index or a trace. */
bool ms__export_file_peak(const ms_timeline_t *tl, ms_tl_peak_t *peak, size_t *dev);

/* The length class of a lifetime from alloc_us to free_us (-1: unknown or none), the
 * allocations' life_class column: k when it ended less than 2^k us after it began (0 for an end
 * at or before its start), 63 when a time is unknown or it never ended. */
int ms__export_life_class(int64_t alloc_us, int64_t free_us);

#endif /* MEMSNAP_LIB_EXPORT_INTERNAL_H */
