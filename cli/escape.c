/* SPDX-License-Identifier: MIT
 * memsnap CLI: messages that quote an input cannot drive the terminal (issue #16 item 21). A
 * crafted folded file or snapshot could put escape sequences into an error message (set the
 * window title, clear the screen); every message goes out through cli_fputs_escaped(), which
 * writes control bytes, DEL, C1 controls and bytes of invalid UTF-8 as \xNN and keeps valid
 * UTF-8 text (names in any script) as it is.
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"

/* The length of the valid, printable UTF-8 sequence at p (2 to 4 bytes), or 0. */
static size_t cli_utf8_len(const unsigned char *p) {
  unsigned c = p[0];
  size_t n;
  unsigned cp;
  if (c >= 0xc2 && c <= 0xdf) {
    n = 2;
    cp = c & 0x1f;
  } else if (c >= 0xe0 && c <= 0xef) {
    n = 3;
    cp = c & 0x0f;
  } else if (c >= 0xf0 && c <= 0xf4) {
    n = 4;
    cp = c & 0x07;
  } else {
    return 0;
  }
  for (size_t i = 1; i < n; i++) {
    if ((p[i] & 0xc0) != 0x80) return 0; /* also stops at the terminating NUL */
    cp = (cp << 6) | (p[i] & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff))) return 0;
  if (cp >= 0xd800 && cp <= 0xdfff) return 0; /* surrogates */
  if (cp >= 0x80 && cp <= 0x9f) return 0;     /* C1 controls (0x9b is a CSI) */
  return n;
}

void cli_fputs_escaped(const char *s, FILE *fp) {
  const unsigned char *p = (const unsigned char *)s;
  while (*p) {
    if (*p >= 0x20 && *p < 0x7f) {
      const unsigned char *q = p;
      while (*q >= 0x20 && *q < 0x7f) q++;
      fwrite(p, 1, (size_t)(q - p), fp);
      p = q;
      continue;
    }
    size_t n = *p >= 0x80 ? cli_utf8_len(p) : 0;
    if (n) {
      fwrite(p, 1, n, fp);
      p += n;
    } else {
      fprintf(fp, "\\x%02x", *p);
      p++;
    }
  }
}
