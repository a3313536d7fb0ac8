/* SPDX-License-Identifier: MIT
 * memsnap cache: the variable-length integers its files share (format.c's trace, index.c's time
 * index): LEB128 (7 bits a byte, low bits first, the high bit set on every byte but the last) and
 * zigzag for differences taken modulo 2^64, read as signed ones (0, -1, 1, -2, ... as 0, 1, 2, 3).
 */
#ifndef MEMSNAP_LIB_CACHE_VARINT_H
#define MEMSNAP_LIB_CACHE_VARINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The longest varint of a uint64_t. */
#define CACHE_VAR_MAX 10u

/* LEB128 of v into p (room for CACHE_VAR_MAX bytes); its length. */
static inline size_t cache_put_var(unsigned char *p, uint64_t v) {
  size_t n = 0;
  for (; v >= 0x80; v >>= 7) p[n++] = (unsigned char)(v | 0x80);
  p[n++] = (unsigned char)v;
  return n;
}

/* A varint at *p (before end) into *v, *p moved past it; false when it runs past end or past
 * CACHE_VAR_MAX bytes (bits past the 64th are dropped). */
static inline bool cache_get_var(const unsigned char **p, const unsigned char *end, uint64_t *v) {
  const unsigned char *q = *p;
  if (q < end && !(*q & 0x80)) { /* the common case: one byte */
    *v = *q;
    *p = q + 1;
    return true;
  }
  uint64_t x = 0;
  for (unsigned sh = 0; sh < 7 * CACHE_VAR_MAX; sh += 7) {
    if (q >= end) return false;
    unsigned char c = *q++;
    x |= sh < 64 ? (uint64_t)(c & 0x7f) << sh : 0;
    if (!(c & 0x80)) {
      *v = x;
      *p = q;
      return true;
    }
  }
  return false;
}

/* A difference taken modulo 2^64, as a signed one, to an unsigned with small magnitudes small. */
static inline uint64_t cache_zigzag(uint64_t delta) {
  return delta << 1 ^ (uint64_t)-(int64_t)(delta >> 63);
}

static inline uint64_t cache_unzigzag(uint64_t z) { return z >> 1 ^ (uint64_t)-(int64_t)(z & 1); }

#endif /* MEMSNAP_LIB_CACHE_VARINT_H */
