/* SPDX-License-Identifier: MIT
 * memsnap viz: making names displayable, and number formatting for tooltips.
 *
 * Frame names are arbitrary bytes (a snapshot or a folded file says so). XML 1.0 cannot carry
 * invalid UTF-8 or most control characters at all, so before a name reaches the XML writer,
 * invalid sequences become U+FFFD and C0 controls and DEL become their visible control pictures
 * (U+2400 + byte, U+2421): the name still renders as text and shows that something odd is there.
 * Markup characters are left alone here; the XML writer escapes them.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flamegraph/internal.h"

/* Length of the valid UTF-8 sequence at s (1-4), or 0 if invalid (overlong forms, surrogates,
 * code points above U+10FFFF and truncated sequences are invalid). */
static size_t utf8_valid(const unsigned char *s, size_t len) {
  unsigned char c = s[0];
  if (c < 0x80) return 1;
  if (c >= 0xC2 && c <= 0xDF) return len >= 2 && (s[1] & 0xC0) == 0x80 ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (len < 3 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80) return 0;
    if (c == 0xE0 && s[1] < 0xA0) return 0;  /* overlong */
    if (c == 0xED && s[1] >= 0xA0) return 0; /* surrogates */
    if (c == 0xEF && s[1] == 0xBF && s[2] >= 0xBE) return 0; /* U+FFFE, U+FFFF: not XML */
    return 3;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (len < 4 || (s[1] & 0xC0) != 0x80 || (s[2] & 0xC0) != 0x80 || (s[3] & 0xC0) != 0x80)
      return 0;
    if (c == 0xF0 && s[1] < 0x90) return 0; /* overlong */
    if (c == 0xF4 && s[1] >= 0x90) return 0; /* above U+10FFFF */
    return 4;
  }
  return 0;
}

size_t ms__text_sanitize(const char *s, size_t len, char **buf, size_t *cap, size_t *ncp) {
  /* Every input byte yields at most 3 output bytes. */
  if (len > (SIZE_MAX - 1) / 3) return (size_t)-1;
  size_t need = len * 3 + 1;
  if (*cap < need) {
    char *b = realloc(*buf, need);
    if (!b) return (size_t)-1;
    *buf = b;
    *cap = need;
  }
  const unsigned char *p = (const unsigned char *)s;
  unsigned char *o = (unsigned char *)*buf;
  size_t n = 0, i = 0, cps = 0;
  while (i < len) {
    unsigned char c = p[i];
    if (c < 0x20 || c == 0x7F) {
      unsigned cp = c == 0x7F ? 0x2421 : 0x2400 + c;
      o[n++] = (unsigned char)(0xE0 | (cp >> 12));
      o[n++] = (unsigned char)(0x80 | ((cp >> 6) & 0x3F));
      o[n++] = (unsigned char)(0x80 | (cp & 0x3F));
      i++;
    } else {
      size_t k = utf8_valid(p + i, len - i);
      if (k == 0) {
        o[n++] = 0xEF; /* U+FFFD */
        o[n++] = 0xBF;
        o[n++] = 0xBD;
        i++;
      } else {
        memcpy(o + n, p + i, k);
        n += k;
        i += k;
      }
    }
    cps++;
  }
  o[n] = 0;
  if (ncp) *ncp = cps;
  return n;
}

size_t ms__text_prefix(const char *s, size_t len, size_t ncp) {
  size_t i = 0;
  while (i < len && ncp > 0) {
    i++;
    while (i < len && ((unsigned char)s[i] & 0xC0) == 0x80) i++;
    ncp--;
  }
  return i;
}

void ms__fmt_count(uint64_t v, char *buf, size_t cap) {
  char digits[32];
  int nd = snprintf(digits, sizeof digits, "%llu", (unsigned long long)v);
  char out[48];
  size_t n = 0;
  for (int i = 0; i < nd; i++) {
    if (i > 0 && (nd - i) % 3 == 0) out[n++] = ',';
    out[n++] = digits[i];
  }
  out[n] = 0;
  snprintf(buf, cap, "%s", out);
}

void ms__fmt_bytes(uint64_t v, char *buf, size_t cap) {
  static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (v < 1024) {
    snprintf(buf, cap, "%llu B", (unsigned long long)v);
    return;
  }
  double x = (double)v;
  int u = -1;
  while (x >= 1024.0 && u < 5) {
    x /= 1024.0;
    u++;
  }
  snprintf(buf, cap, "%.1f %s", x, units[u]);
}
