/* SPDX-License-Identifier: MIT
 * memsnap viewer (viz/view): a buffered writer of HTML and of JSON that is safe inside a
 * <script type="application/json"> element ('<', '>' and '&' always written as \u escapes) and
 * ASCII only (the page is declared windows-1252 for its binary data: bin.h).
 */
#ifndef MEMSNAP_VIZ_VIEW_WRITER_H
#define MEMSNAP_VIZ_VIEW_WRITER_H

#include <stddef.h>
#include <stdint.h>

#include "memsnap/serialize.h"

typedef struct vw_s {
  ms_sink_t *sink;
  size_t len;
  int err;     /* the first error of the sink (MS_OK until then) */
  char buf[1 << 16];
} vw_t;

void vw_init(vw_t *w, ms_sink_t *sink);
void vw_flush(vw_t *w);
void vw_raw(vw_t *w, const char *s, size_t n);
/* A sink that writes what it gets into w (vw_raw; @return w's error). */
void vw_as_sink(vw_t *w, ms_sink_t *sink);
void vw_puts(vw_t *w, const char *s);
void vw_i64(vw_t *w, int64_t v);
void vw_u64(vw_t *w, uint64_t v);
/* A JSON string of v as lowercase hexadecimal without prefix ("7f00"). */
void vw_hexstr(vw_t *w, uint64_t v);
/* A JSON string (quoted), all ASCII: markup characters, quotes, backslashes, control bytes and
 * every non-ASCII character escaped (\uXXXX, a surrogate pair above U+FFFF); a byte that starts
 * no valid UTF-8 sequence becomes U+FFFD. s may be NULL (""). */
void vw_str(vw_t *w, const char *s);
/* Text of HTML (element content or attribute value), all ASCII: & < > " ' escaped, control bytes
 * as U+FFFD, every non-ASCII character as &#xHEX; (invalid UTF-8: U+FFFD). */
void vw_html(vw_t *w, const char *s);

#endif
