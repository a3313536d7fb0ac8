/* SPDX-License-Identifier: MIT
 * memsnap viewer: binary sections and their escape for the page (bin.h).
 */
#include "bin.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/error.h"

void vb_init(vb_t *b, ms_sink_t *sink, ms_gzip_sink_t *gz) {
  memset(b, 0, offsetof(vb_t, buf));
  b->sink = sink;
  b->gz = gz;
  b->err = MS_OK;
  b->width = b->nblk = 0;
}

void vb_release(vb_t *b) {
  free(b->sec);
  b->sec = NULL;
  b->nsec = b->cap = 0;
}

/* The strategy of the gzip sink from now on. */
static void bin_strategy(vb_t *b, bool rle) {
  if (!b->gz || rle == b->rle) return;
  int rc = ms_gzip_sink_rle(b->gz, rle);
  if (rc != MS_OK && b->err == MS_OK) b->err = rc;
  b->rle = rle;
}

void vb_flush(vb_t *b) {
  if (b->picking) { /* the open section's first bytes are all buffered: choose by them */
    b->picking = false;
    bin_strategy(b, b->len && ms_gzip_sink_rle_better(b->gz, b->buf, b->len));
  }
  if (b->len && b->err == MS_OK) {
    int rc = b->sink->write(b->sink->ctx, (const char *)b->buf, b->len);
    if (rc != 0) b->err = rc < 0 ? rc : MS_EIO;
  }
  b->len = 0;
}

static void bin_put(vb_t *b, const void *p, size_t n) {
  if (b->len + n > sizeof b->buf) vb_flush(b);
  memcpy(b->buf + b->len, p, n);
  b->len += n;
  b->offset += n;
}

static size_t bin_width(const char *type) {
  return type[0] == 'f' ? 8 : type[1] == '8' ? 1 : type[1] == '1' ? 2 : 4;
}

void vb_begin_with(vb_t *b, const char *name, const char *type, unsigned flags) {
  static const unsigned char zero[8] = {0};
  if (b->offset % 8) bin_put(b, zero, 8 - b->offset % 8);
  if (b->gz && ((flags & VB_PICK) || b->rle)) {
    vb_flush(b); /* what is buffered goes with the strategy it was chosen for */
    bin_strategy(b, false);
    b->picking = (flags & VB_PICK) != 0;
  }
  if (b->nsec == b->cap) {
    size_t cap = b->cap ? 2 * b->cap : 32;
    vb_section_t *s = realloc(b->sec, cap * sizeof *s);
    if (!s) {
      if (b->err == MS_OK) b->err = MS_ENOMEM;
      return;
    }
    b->sec = s;
    b->cap = cap;
  }
  vb_section_t *s = &b->sec[b->nsec++];
  memset(s, 0, sizeof *s);
  strncpy(s->name, name, sizeof s->name - 1);
  strncpy(s->type, type, sizeof s->type - 1);
  s->offset = b->offset;
  s->delta = b->delta = (flags & VB_DELTA) != 0;
  size_t w = bin_width(type);
  s->shuffle = (flags & VB_SHUFFLE) && w > 1;
  b->width = s->shuffle ? w : 0;
  b->nblk = 0;
  b->prev_u = 0;
  b->prev_f = 0;
}

void vb_begin(vb_t *b, const char *name, const char *type) { vb_begin_with(b, name, type, 0); }

void vb_begin_delta(vb_t *b, const char *name, const char *type) {
  vb_begin_with(b, name, type, VB_DELTA);
}

/* The shuffled block written, plane by plane: plane k holds byte k (little-endian) of every
 * value. blk holds the values as the host stores them (uint16_t, uint32_t or uint64_t). */
static void bin_block(vb_t *b) {
  size_t w = b->width, n = b->nblk;
  unsigned char *pl = b->planes;
  const unsigned char *q = b->blk;
  if (w == 8) {
    for (size_t i = 0; i < n; i++) {
      uint64_t u;
      memcpy(&u, q + 8 * i, 8);
      for (size_t k = 0; k < 8; k++) pl[k * n + i] = (unsigned char)(u >> (8 * k));
    }
  } else if (w == 4) {
    for (size_t i = 0; i < n; i++) {
      uint32_t u;
      memcpy(&u, q + 4 * i, 4);
      for (size_t k = 0; k < 4; k++) pl[k * n + i] = (unsigned char)(u >> (8 * k));
    }
  } else {
    for (size_t i = 0; i < n; i++) {
      uint16_t u;
      memcpy(&u, q + 2 * i, 2);
      pl[i] = (unsigned char)u;
      pl[n + i] = (unsigned char)(u >> 8);
    }
  }
  bin_put(b, pl, w * n);
  b->nblk = 0;
}

void vb_end(vb_t *b) {
  if (b->nsec == 0) return;
  if (b->width && b->nblk) bin_block(b);
  if (b->picking) vb_flush(b);
  vb_section_t *s = &b->sec[b->nsec - 1];
  s->count = (b->offset - s->offset) / bin_width(s->type);
  b->delta = false;
  b->width = 0;
}

/* Little-endian whatever the host; into the block of a shuffled section (as the host stores
 * a value of n bytes: bin_block reads it so). */
static inline void bin_le(vb_t *b, uint64_t v, size_t n) {
  if (b->width) {
    unsigned char *q = b->blk + b->nblk * n;
    if (n == 8) {
      memcpy(q, &v, 8);
    } else if (n == 4) {
      uint32_t u = (uint32_t)v;
      memcpy(q, &u, 4);
    } else {
      uint16_t u = (uint16_t)v;
      memcpy(q, &u, 2);
    }
    if (++b->nblk == VB_BLOCK) bin_block(b);
    return;
  }
  unsigned char p[8];
  for (size_t i = 0; i < n; i++) p[i] = (unsigned char)(v >> (8 * i));
  bin_put(b, p, n);
}

static uint32_t bin_delta_u(vb_t *b, uint32_t v) {
  if (!b->delta) return v;
  uint32_t d = v - b->prev_u;
  b->prev_u = v;
  return d;
}
void vb_i32(vb_t *b, int32_t v) { bin_le(b, bin_delta_u(b, (uint32_t)v), 4); }
void vb_u32(vb_t *b, uint32_t v) { bin_le(b, bin_delta_u(b, v), 4); }
void vb_u16(vb_t *b, uint16_t v) { bin_le(b, v, 2); }
void vb_u8(vb_t *b, uint8_t v) { bin_put(b, &v, 1); }
void vb_bytes(vb_t *b, const void *p, size_t n) {
  const unsigned char *c = p;
  while (n > 0) {
    size_t room = sizeof b->buf - b->len;
    if (room == 0) {
      vb_flush(b);
      room = sizeof b->buf;
    }
    size_t k = n < room ? n : room;
    bin_put(b, c, k);
    c += k;
    n -= k;
  }
}
void vb_f64(vb_t *b, double v) {
  if (b->delta) {
    double d = v - b->prev_f;
    b->prev_f = v;
    v = d;
  }
  uint64_t u;
  memcpy(&u, &v, 8);
  bin_le(b, u, 8);
}

void vb_table(const vb_t *b, vw_t *w) {
  vw_puts(w, "[");
  for (size_t i = 0; i < b->nsec; i++) {
    const vb_section_t *s = &b->sec[i];
    vw_puts(w, i ? ",\n{\"name\":" : "\n{\"name\":");
    vw_str(w, s->name);
    vw_puts(w, ",\"type\":");
    vw_str(w, s->type);
    vw_puts(w, ",\"offset\":");
    vw_u64(w, s->offset);
    vw_puts(w, ",\"count\":");
    vw_u64(w, s->count);
    if (s->shuffle) {
      vw_puts(w, ",\"shuffle\":");
      vw_u64(w, VB_BLOCK);
    }
    vw_puts(w, s->delta ? ",\"delta\":true}" : "}");
  }
  vw_puts(w, "]");
}

/* The bytes escaped (bin.h): NUL, CR, '<', the escape byte itself, and (narrow) the 27 bytes
 * 0x80-0x9F that windows-1252 decodes to characters above U+00FF (all but 0x81, 0x8D, 0x8F, 0x90,
 * 0x9D). */
static bool bin_special(unsigned char c, bool narrow) {
  if (c >= 0x80 && c <= 0x9f)
    return narrow && c != 0x81 && c != 0x8d && c != 0x8f && c != 0x90 && c != 0x9d;
  return c == 0 || c == '\r' || c == '<' || c == VB_ESC;
}

/* bin_special as two tables (wide, narrow), filled once. */
static unsigned char bin_tab[2][256];
static pthread_once_t bin_tab_once = PTHREAD_ONCE_INIT;
static void bin_tab_fill(void) {
  for (int c = 0; c < 256; c++) {
    bin_tab[0][c] = bin_special((unsigned char)c, false);
    bin_tab[1][c] = bin_special((unsigned char)c, true);
  }
}

/* Without a branch per byte (the escaped ones are unpredictable in compressed data): every byte
 * writes its escape's second byte after it, which the next byte overwrites unless it was
 * escaped. */
size_t vb_escape(const void *in, size_t n, unsigned char *out, bool narrow) {
  pthread_once(&bin_tab_once, bin_tab_fill);
  const unsigned char *p = in, *tab = bin_tab[narrow];
  size_t k = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = p[i], m = tab[c];
    out[k] = (unsigned char)(c ^ ((c ^ VB_ESC) & (0u - m)));
    out[k + 1] = (unsigned char)(c + 64);
    k += 1u + m;
  }
  return k;
}

/* Escapes straight into the writer's buffer (room for twice what it takes). */
static int esc_write(void *ctx, const char *buf, size_t len) {
  vb_esc_t *e = ctx;
  vw_t *w = e->w;
  while (len > 0 && w->err == MS_OK) {
    if (sizeof w->buf - w->len < 2 * (len < 4096 ? len : 4096)) vw_flush(w);
    size_t room = (sizeof w->buf - w->len) / 2, n = len < room ? len : room;
    w->len += vb_escape(buf, n, (unsigned char *)w->buf + w->len, e->narrow);
    buf += n;
    len -= n;
  }
  return w->err;
}

void vb_escape_sink(vb_esc_t *e, ms_sink_t *sink) {
  sink->write = esc_write;
  sink->ctx = e;
}
