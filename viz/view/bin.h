/* SPDX-License-Identifier: MIT
 * memsnap viewer (viz/view): the page's binary data. Named sections of little-endian typed
 * values (i32, u32, u16, u8, f64), each starting at a multiple of 8 bytes, written through a sink.
 * A section may be delta coded ("delta":true in the table): each value is then the difference
 * from the one before (i32/u32 wrapping modulo 2^32, f64 only for integers the caller knows to be
 * exact), which compresses far better for sorted or slowly changing columns; the reader restores
 * the values by a running sum
 * (the page gzips them and writes them, escaped (vb_escape), in one script element; its script
 * inflates them with the browser's own DecompressionStream and reads each section as a typed
 * array). The table of sections goes into the page's JSON (docs/view.md, "Data").
 */
#ifndef MEMSNAP_VIZ_VIEW_BIN_H
#define MEMSNAP_VIZ_VIEW_BIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/serialize.h"
#include "writer.h"

typedef struct vb_section_s {
  char name[64];
  char type[4]; /* "i32", "u32", "u16", "u8", "f64" */
  uint64_t offset, count;
  bool delta;
} vb_section_t;

typedef struct vb_s {
  ms_sink_t *sink;
  uint64_t offset; /* bytes written so far */
  int err;
  vb_section_t *sec;
  size_t nsec, cap;
  bool delta;        /* the open section is delta coded */
  uint32_t prev_u;   /* its previous value (i32/u32) */
  double prev_f;     /* (f64) */
  size_t len;
  unsigned char buf[1 << 16];
} vb_t;

void vb_init(vb_t *b, ms_sink_t *sink);
void vb_release(vb_t *b);
/* Starts a section (pads the data to a multiple of 8 bytes first). */
void vb_begin(vb_t *b, const char *name, const char *type);
/* Starts a delta-coded section (see above). */
void vb_begin_delta(vb_t *b, const char *name, const char *type);
void vb_end(vb_t *b);
void vb_i32(vb_t *b, int32_t v);
void vb_u32(vb_t *b, uint32_t v);
void vb_u16(vb_t *b, uint16_t v);
void vb_u8(vb_t *b, uint8_t v);
void vb_f64(vb_t *b, double v);
/* Writes what is buffered to the sink. */
void vb_flush(vb_t *b);
/* The table as JSON: [{"name":..,"type":..,"offset":..,"count":..}, ...]. */
void vb_table(const vb_t *b, vw_t *w);

/* The page holds the gzipped sections as raw bytes in a <script type="application/octet-stream">
 * of a page declared windows-1252 (docs/view.md, "The bytes of the page"), which decodes each of
 * the bytes written as they are to the character of the same code. 31 byte values are escaped,
 * each written as VB_ESC followed by the byte plus 64 (modulo 256), as yEnc does: NUL (the HTML
 * parser would make it U+FFFD), CR (it would become or join a LF), '<' (it could end the element
 * or open a comment), VB_ESC itself, and the 27 bytes 0x80-0x9F that windows-1252 decodes to
 * characters above U+00FF (which make the browser hold the text as 16-bit characters: parsed
 * more slowly, two bytes each). */
#define VB_ESC 0x3d /* '=' */
/* Escapes n bytes of in into out (room for 2 n bytes); returns the length written. */
size_t vb_escape(const void *in, size_t n, unsigned char *out);
/* A sink that writes what it gets into w, escaped. */
void vb_escape_sink(vw_t *w, ms_sink_t *sink);

#endif
