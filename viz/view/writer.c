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

void vw_str(vw_t *w, const char *s) {
  vw_raw(w, "\"", 1);
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  while (*p) {
    unsigned c = *p;
    if (c < 0x20 || c == '<' || c == '>' || c == '&' || c == '\'') {
      char b[8];
      snprintf(b, sizeof b, "\\u%04x", c);
      vw_raw(w, b, 6);
      p++;
    } else if (c == '"' || c == '\\') {
      char b[2] = {'\\', (char)c};
      vw_raw(w, b, 2);
      p++;
    } else if (c < 0x80) {
      vw_raw(w, (const char *)p, 1);
      p++;
    } else {
      size_t n = writer_utf8_len(p);
      if (n == 0) {
        vw_puts(w, "\\ufffd");
        p++;
      } else {
        vw_raw(w, (const char *)p, n);
        p += n;
      }
    }
  }
  vw_raw(w, "\"", 1);
}

void vw_html(vw_t *w, const char *s) {
  const unsigned char *p = (const unsigned char *)(s ? s : "");
  for (; *p; p++) {
    switch (*p) {
    case '&': vw_puts(w, "&amp;"); break;
    case '<': vw_puts(w, "&lt;"); break;
    case '>': vw_puts(w, "&gt;"); break;
    case '"': vw_puts(w, "&quot;"); break;
    case '\'': vw_puts(w, "&#39;"); break;
    default:
      if (*p < 0x20) vw_puts(w, "\xef\xbf\xbd"); /* U+FFFD */
      else if (*p < 0x80) vw_raw(w, (const char *)p, 1);
      else {
        size_t n = writer_utf8_len(p);
        if (n == 0) vw_puts(w, "\xef\xbf\xbd");
        else {
          vw_raw(w, (const char *)p, n);
          p += n - 1;
        }
      }
    }
  }
}

static int writer_json_write(void *ctx, const char *buf, size_t len) {
  vw_t *w = ctx;
  size_t start = 0;
  for (size_t i = 0; i < len; i++) {
    const char *esc = buf[i] == '<' ? "\\u003c" : buf[i] == '>' ? "\\u003e"
                      : buf[i] == '&' ? "\\u0026" : NULL;
    if (!esc) continue;
    vw_raw(w, buf + start, i - start);
    vw_raw(w, esc, 6);
    start = i + 1;
  }
  vw_raw(w, buf + start, len - start);
  return w->err;
}

void vw_json_sink(vw_t *w, ms_sink_t *out) {
  out->write = writer_json_write;
  out->ctx = w;
}
