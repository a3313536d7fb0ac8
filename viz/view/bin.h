/* SPDX-License-Identifier: MIT
 * memsnap viewer (viz/view): the page's binary data. Named sections of little-endian typed
 * values (i32, u32, u16, u8, f64), each starting at a multiple of 8 bytes, written through a sink.
 * A section may be delta coded ("delta":true in the table): each value is then the difference
 * from the one before (i32/u32 wrapping modulo 2^32, f64 only for integers the caller knows to be
 * exact), which compresses far better for sorted or slowly changing columns; the reader restores
 * the values by a running sum. A section may be shuffled ("shuffle":B): its values are written in
 * blocks of B (the last one shorter), each block byte plane by byte plane (every value's first
 * byte, then every second byte, ...), as Blosc does, so that the planes that hardly change (the
 * high bytes of small differences, the low bytes of doubles that hold integers) compress to
 * almost nothing; the reader transposes each block back before the running sum. A section may be
 * compressed with deflate's run-length strategy instead of its default one (VB_PICK: whichever
 * compresses the section's first 64 KiB smaller; runs win on planes of random-looking numbers,
 * the default search on data that repeats longer patterns, as real traces do).
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
  bool delta, shuffle;
} vb_section_t;

#define VB_BLOCK 4096 /* values per shuffled block */
enum { VB_DELTA = 1, VB_SHUFFLE = 2, VB_PICK = 4 }; /* vb_begin_with's flags */

typedef struct vb_s {
  ms_sink_t *sink;
  ms_gzip_sink_t *gz; /* the gzip sink under sink, if any: VB_PICK switches its strategy */
  bool rle;           /* its strategy now */
  bool picking;       /* the open section is VB_PICK and its strategy not chosen yet */
  uint64_t offset; /* bytes written so far */
  int err;
  vb_section_t *sec;
  size_t nsec, cap;
  bool delta;        /* the open section is delta coded */
  uint32_t prev_u;   /* its previous value (i32/u32) */
  double prev_f;     /* (f64) */
  size_t len;
  unsigned char buf[1 << 16];
  size_t width, nblk; /* the open shuffled section: its value width, the values in blk */
  unsigned char blk[VB_BLOCK * 8]; /* the values of the block, as the host stores them */
  unsigned char planes[VB_BLOCK * 8];
} vb_t;

/* gz: the gzip sink that sink is (or NULL: VB_PICK does nothing). */
void vb_init(vb_t *b, ms_sink_t *sink, ms_gzip_sink_t *gz);
void vb_release(vb_t *b);
/* Starts a section (pads the data to a multiple of 8 bytes first). */
void vb_begin(vb_t *b, const char *name, const char *type);
/* Starts a delta-coded section (see above). */
void vb_begin_delta(vb_t *b, const char *name, const char *type);
/* Starts a section with flags VB_DELTA, VB_SHUFFLE (not for u8) and VB_PICK (see above; without
 * it, deflate's default strategy). */
void vb_begin_with(vb_t *b, const char *name, const char *type, unsigned flags);
void vb_end(vb_t *b);
void vb_i32(vb_t *b, int32_t v);
void vb_u32(vb_t *b, uint32_t v);
void vb_u16(vb_t *b, uint16_t v);
void vb_u8(vb_t *b, uint8_t v);
void vb_f64(vb_t *b, double v);
/* n bytes of a u8 section at once. */
void vb_bytes(vb_t *b, const void *p, size_t n);
/* Writes what is buffered to the sink. */
void vb_flush(vb_t *b);
/* The table as JSON: [{"name":..,"type":..,"offset":..,"count":..}, ...]. */
void vb_table(const vb_t *b, vw_t *w);

/* The page holds the gzipped sections as raw bytes in a <script type="application/octet-stream">
 * of a page declared windows-1252 (docs/view.md, "The bytes of the page"), which decodes each of
 * the bytes written as they are to one character. The bytes the HTML parser would not give back
 * are escaped, each written as VB_ESC followed by the byte plus 64 (modulo 256), as yEnc does:
 * NUL (the parser would make it U+FFFD), CR (it would become or join a LF), '<' (it could end the
 * element or open a comment) and VB_ESC itself: 4 of 256 values, 1.6 % more bytes. Narrow, the 27
 * bytes 0x80-0x9F that windows-1252 decodes to characters above U+00FF (U+20AC for 0x80, ...; the
 * page maps them back) are escaped too, 12 % more bytes, so that the browser keeps the element's
 * text as one byte per character: half the memory, parsed faster. The timelines, read before the
 * first paint, are narrow; the traces and stacks, read after it, are not. */
#define VB_ESC 0x3d /* '=' */
/* Escapes n bytes of in into out (room for 2 n bytes, all of which it may write); returns the
 * length written. */
size_t vb_escape(const void *in, size_t n, unsigned char *out, bool narrow);
/* A sink that writes what it gets into e->w, escaped (narrow or not). */
typedef struct vb_esc_s {
  vw_t *w;
  bool narrow;
} vb_esc_t;
void vb_escape_sink(vb_esc_t *e, ms_sink_t *sink);

#endif
