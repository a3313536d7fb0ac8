/* SPDX-License-Identifier: MIT
 * memsnap viewer: the buffered HTML/JSON writer (writer.h).
 */
#include "writer.h"

#include <inttypes.h>
#include <stdio.h>
#include <string.h>

#include "memsnap/error.h"

void vw_init(vw_t *w, ms_sink_t *sink) {
  w->sink = sink;
  w->len = 0;
  w->err = MS_OK;
}

void vw_flush(vw_t *w) {
  if (w->len && w->err == MS_OK) {
    int rc = w->sink->write(w->sink->ctx, w->buf, w->len);
    if (rc != 0) w->err = rc < 0 ? rc : MS_EIO;
  }
  w->len = 0;
}

void vw_raw(vw_t *w, const char *s, size_t n) {
  while (n > 0) {
    if (w->len == sizeof w->buf) vw_flush(w);
    size_t room = sizeof w->buf - w->len, k = n < room ? n : room;
    memcpy(w->buf + w->len, s, k);
    w->len += k;
    s += k;
    n -= k;
  }
}

static int writer_sink_write(void *ctx, const char *buf, size_t len) {
  vw_t *w = ctx;
  vw_raw(w, buf, len);
  return w->err;
}

void vw_as_sink(vw_t *w, ms_sink_t *sink) {
  sink->write = writer_sink_write;
  sink->ctx = w;
}

void vw_puts(vw_t *w, const char *s) { vw_raw(w, s, strlen(s)); }

void vw_i64(vw_t *w, int64_t v) {
  char b[32];
  int n = snprintf(b, sizeof b, "%" PRId64, v);
  vw_raw(w, b, (size_t)n);
}

void vw_u64(vw_t *w, uint64_t v) {
  char b[32];
  int n = snprintf(b, sizeof b, "%" PRIu64, v);
  vw_raw(w, b, (size_t)n);
}

void vw_hexstr(vw_t *w, uint64_t v) {
  char b[32];
  int n = snprintf(b, sizeof b, "\"%" PRIx64 "\"", v);
  vw_raw(w, b, (size_t)n);
}

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when the bytes there are not one. */
static size_t writer_utf8_len(const unsigned char *s) {
  unsigned c = s[0];
  size_t n;
  unsigned min;
  if (c < 0x80) return 1;
  if (c >= 0xc2 && c <= 0xdf) n = 2, min = 0x80;
  else if (c >= 0xe0 && c <= 0xef) n = 3, min = 0x800;
  else if (c >= 0xf0 && c <= 0xf4) n = 4, min = 0x10000;
  else return 0;
  unsigned cp = c & (0x3fu >> (n - 1));
  for (size_t i = 1; i < n; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return n;
}

/* The code point of the valid UTF-8 sequence of n bytes at s. */
static unsigned writer_utf8_cp(const unsigned char *s, size_t n) {
  unsigned cp = s[0] & (0x7fu >> n);
  for (size_t i = 1; i < n; i++) cp = (cp << 6) | (s[i] & 0x3f);
  return cp;
}

/* The code point at *p (U+FFFD for a byte that starts no valid UTF-8 sequence); advances *p. */
static unsigned writer_next_cp(const unsigned char **p) {
  size_t n = writer_utf8_len(*p);
  unsigned cp = n ? writer_utf8_cp(*p, n) : 0xfffd;
  *p += n ? n : 1;
  return cp;
}

/* "\\uXXXX" of one UTF-16 code unit (the caller splits code points above U+FFFF). */
static void writer_u_escape(vw_t *w, unsigned u) {
  char b[16];
  snprintf(b, sizeof b, "\\u%04x", u & 0xffffu);
  vw_raw(w, b, 6);
}

void vw_str(vw_t *w, const char *s) {
  vw_raw(w, "\"", 1);
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  while (*p) {
    unsigned c = *p;
    if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == '\'') {
      writer_u_escape(w, c);
      p++;
    } else if (c == '"' || c == '\\') {
      char b[2] = {'\\', (char)c};
      vw_raw(w, b, 2);
      p++;
    } else if (c < 0x80) {
      vw_raw(w, (const char *)p, 1);
      p++;
    } else {
      unsigned cp = writer_next_cp(&p);
      if (cp >= 0x10000) { /* a surrogate pair */
        writer_u_escape(w, 0xd800 + ((cp - 0x10000) >> 10));
        writer_u_escape(w, 0xdc00 + ((cp - 0x10000) & 0x3ff));
      } else {
        writer_u_escape(w, cp);
      }
    }
  }
  vw_raw(w, "\"", 1);
}

void vw_html(vw_t *w, const char *s) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  while (*p) {
    unsigned c = *p;
    const char *e = c == '&' ? "&amp;" : c == '<' ? "&lt;" : c == '>' ? "&gt;"
                    : c == '"' ? "&quot;" : c == '\'' ? "&#39;" : NULL;
    if (e || c < 0x80) {
      if (e) vw_puts(w, e);
      else if (c < 0x20) vw_puts(w, "&#xfffd;");
      else vw_raw(w, (const char *)p, 1);
      p++;
      continue;
    }
    char b[16];
    int n = snprintf(b, sizeof b, "&#x%x;", writer_next_cp(&p));
    vw_raw(w, b, (size_t)n);
  }
}
