/* SPDX-License-Identifier: MIT
 * memsnap exports: the growable buffer and JSON text shared by the format writers
 * (lib/export/internal.h).
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "export/internal.h"

void ms__xbuf_release(ms__xbuf_t *b) {
  free(b->ptr);
  memset(b, 0, sizeof *b);
}

static bool xbuf_reserve(ms__xbuf_t *b, size_t n) {
  if (b->oom) return false;
  if (n < b->cap - b->len) return true;
  size_t cap = b->cap ? b->cap : 256;
  while (cap - b->len <= n) {
    if (cap > SIZE_MAX / 2) {
      b->oom = true;
      return false;
    }
    cap *= 2;
  }
  char *p = realloc(b->ptr, cap);
  if (!p) {
    b->oom = true;
    return false;
  }
  b->ptr = p;
  b->cap = cap;
  return true;
}

void ms__xbuf_put(ms__xbuf_t *b, const void *p, size_t n) {
  if (!xbuf_reserve(b, n)) return;
  memcpy(b->ptr + b->len, p, n);
  b->len += n;
}

void ms__xbuf_puts(ms__xbuf_t *b, const char *s) {
  ms__xbuf_put(b, s, strlen(s));
}

void ms__xbuf_printf(ms__xbuf_t *b, const char *fmt, ...) {
  char tmp[256];
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  if ((size_t)n < sizeof tmp) {
    ms__xbuf_put(b, tmp, (size_t)n);
    return;
  }
  if (!xbuf_reserve(b, (size_t)n + 1)) return;
  va_start(ap, fmt);
  vsnprintf(b->ptr + b->len, (size_t)n + 1, fmt, ap);
  va_end(ap);
  b->len += (size_t)n;
}

/* The length of the valid UTF-8 sequence at p (1-4), or 0 when it is not one (a stray
 * continuation byte, an overlong form, a surrogate, past U+10FFFF, or cut short). */
static size_t json_utf8_len(const unsigned char *p) {
  unsigned char c = p[0];
  size_t n;
  unsigned char lo = 0x80, hi = 0xbf;
  if (c >= 0xc2 && c <= 0xdf)
    n = 2;
  else if (c >= 0xe0 && c <= 0xef)
    n = 3, lo = c == 0xe0 ? 0xa0 : 0x80, hi = c == 0xed ? 0x9f : 0xbf;
  else if (c >= 0xf0 && c <= 0xf4)
    n = 4, lo = c == 0xf0 ? 0x90 : 0x80, hi = c == 0xf4 ? 0x8f : 0xbf;
  else
    return 0;
  if (p[1] < lo || p[1] > hi) return 0;
  for (size_t i = 2; i < n; i++)
    if (p[i] < 0x80 || p[i] > 0xbf) return 0; /* a NUL ends it too */
  return n;
}

bool ms__utf8_valid(const char *s) {
  for (const unsigned char *p = (const unsigned char *)s; *p;) {
    size_t n = *p < 0x80 ? 1 : json_utf8_len(p);
    if (!n) return false;
    p += n;
  }
  return true;
}

void ms__xbuf_utf8(ms__xbuf_t *b, const char *s) {
  const unsigned char *run = (const unsigned char *)s, *p = run;
  while (*p) {
    size_t n = *p < 0x80 ? 1 : json_utf8_len(p);
    if (n) {
      p += n;
      continue;
    }
    ms__xbuf_put(b, run, (size_t)(p - run));
    ms__xbuf_put(b, "\xef\xbf\xbd", 3); /* U+FFFD, one per byte, as the JSON outputs write */
    run = ++p;
  }
  ms__xbuf_put(b, run, (size_t)(p - run));
}

void ms__xbuf_json_str(ms__xbuf_t *b, const char *s) {
  static const char hex[] = "0123456789abcdef";
  ms__xbuf_put(b, "\"", 1);
  const unsigned char *run = (const unsigned char *)s, *p = run;
  for (;;) {
    unsigned char c = *p;
    if (c >= 0x20 && c < 0x80 && c != '"' && c != '\\') {
      p++;
      continue;
    }
    if (c >= 0x80) {
      size_t n = json_utf8_len(p);
      if (n) {
        p += n;
        continue;
      }
    }
    ms__xbuf_put(b, run, (size_t)(p - run));
    if (c == 0) break;
    char esc[6] = {'\\', 'u', '0', '0', hex[c >> 4], hex[c & 15]};
    if (c >= 0x80) {
      ms__xbuf_puts(b, "\\ufffd"); /* not UTF-8: JSON text must be */
    } else if (c == '"' || c == '\\') {
      esc[1] = (char)c;
      ms__xbuf_put(b, esc, 2);
    } else if (c == '\n') {
      ms__xbuf_put(b, "\\n", 2);
    } else if (c == '\t') {
      ms__xbuf_put(b, "\\t", 2);
    } else {
      ms__xbuf_put(b, esc, 6);
    }
    run = ++p;
  }
  ms__xbuf_put(b, "\"", 1);
}

const char *ms__xbuf_cstr(ms__xbuf_t *b) {
  if (!xbuf_reserve(b, 1)) return "";
  b->ptr[b->len] = 0;
  return b->ptr;
}

static void export_settings_map(ms__xbuf_t *b, const ms_snapshot_t *snap, size_t first,
                                 size_t count, int depth) {
  ms__xbuf_put(b, "{", 1);
  for (size_t i = 0; i < count && first + i < snap->nsettings; i++) {
    const ms_snap_kv_t *kv = &snap->settings[first + i];
    if (i) ms__xbuf_put(b, ", ", 2);
    ms__xbuf_json_str(b, kv->key);
    ms__xbuf_put(b, ": ", 2);
    switch (kv->kind) {
    case MS_SNAP_VAL_BOOL:
      ms__xbuf_puts(b, kv->b ? "true" : "false");
      break;
    case MS_SNAP_VAL_INT:
      ms__xbuf_printf(b, "%lld", (long long)kv->i);
      break;
    case MS_SNAP_VAL_FLOAT:
      if (kv->f == kv->f && kv->f - kv->f == 0)
        ms__xbuf_printf(b, "%.17g", kv->f);
      else
        ms__xbuf_puts(b, "null"); /* JSON has no NaN or infinity */
      break;
    case MS_SNAP_VAL_STR:
      ms__xbuf_json_str(b, kv->s);
      break;
    case MS_SNAP_VAL_MAP:
      if (depth < 16)
        export_settings_map(b, snap, kv->first, kv->count, depth + 1);
      else
        ms__xbuf_puts(b, "null");
      break;
    default:
      ms__xbuf_puts(b, "null");
      break;
    }
  }
  ms__xbuf_put(b, "}", 1);
}

void ms__export_settings_json(ms__xbuf_t *b, const ms_snapshot_t *snap) {
  export_settings_map(b, snap, 0, snap->nsettings_top, 0);
}

const char *ms__export_producer(const ms_snapshot_t *snap) {
  switch (snap->origin) {
  case MS_SNAP_ORIGIN_MEMSNAP:
    return "memsnap";
  case MS_SNAP_ORIGIN_TORCH_LIST:
    return "pytorch (list, before 2.0)";
  default:
    return "pytorch";
  }
}

bool ms__export_file_peak(const ms_timeline_t *tl, ms_tl_peak_t *peak, size_t *dev) {
  ms_tl_peak_t best = {0};
  size_t best_dev = SIZE_MAX;
  for (size_t d = 0; tl && d < ms_timeline_ndevices(tl); d++) {
    ms_tl_peak_t p;
    if (ms_timeline_nentries(tl, d) == 0 ||
        ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p) != MS_OK)
      continue;
    if (best_dev == SIZE_MAX || p.bytes > best.bytes) {
      best = p;
      best_dev = d;
    }
  }
  if (best_dev == SIZE_MAX) return false;
  *peak = best;
  *dev = best_dev;
  return true;
}

int ms__export_life_class(int64_t alloc_us, int64_t free_us) {
  if (alloc_us == -1 || free_us == -1) return 63;
  if (free_us <= alloc_us) return 0;
  uint64_t d = (uint64_t)free_us - (uint64_t)alloc_us;
  int k = 0;
  while (k < 63 && (d >> k) != 0) k++;
  return k; /* d < 2^k; 63 for a length of 2^62 or more (span 2^63 - 1) */
}
