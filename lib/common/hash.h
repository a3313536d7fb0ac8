/* SPDX-License-Identifier: MIT
 * memsnap: a strong, fast 64-bit hash for byte strings and integer sequences.
 *
 * Interning tables depend on the hash spreading similar keys (stacks that differ in one return
 * address, sizes that differ by 512) across all buckets; a weak hash once made heaptrack's
 * interning degenerate (docs/dev/measurements.md, "Interning stacks"). The mixer is a 64x64->128
 * multiply folded by xor (wyhash's "mum"), which passes SMHasher's avalanche tests.
 */
#ifndef MEMSNAP_UTIL_HASH_H
#define MEMSNAP_UTIL_HASH_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define MS_HASH_P0 0xa0761d6478bd642fULL
#define MS_HASH_P1 0xe7037ed1a0b428dbULL
#define MS_HASH_P2 0x8ebc6af09c88c6e3ULL

static inline uint64_t ms_hash_mum(uint64_t a, uint64_t b) {
  __uint128_t r = (__uint128_t)a * b;
  return (uint64_t)r ^ (uint64_t)(r >> 64);
}

static inline uint64_t ms_hash_u64(uint64_t x) {
  return ms_hash_mum(x ^ MS_HASH_P0, MS_HASH_P1);
}

/* Combines a running hash with one 64-bit word. */
static inline uint64_t ms_hash_step(uint64_t h, uint64_t x) {
  return ms_hash_mum(h ^ x ^ MS_HASH_P0, MS_HASH_P1 ^ (h >> 32));
}

static inline uint64_t ms_hash_bytes(const void *data, size_t len, uint64_t seed) {
  const unsigned char *p = (const unsigned char *)data;
  uint64_t h = seed ^ ms_hash_mum(seed ^ MS_HASH_P0, (uint64_t)len ^ MS_HASH_P1);
  while (len >= 16) {
    uint64_t a, b;
    memcpy(&a, p, 8);
    memcpy(&b, p + 8, 8);
    h = ms_hash_mum(a ^ MS_HASH_P1 ^ h, b ^ MS_HASH_P2);
    p += 16;
    len -= 16;
  }
  uint64_t a = 0, b = 0;
  if (len >= 8) {
    memcpy(&a, p, 8);
    memcpy(&b, p + len - 8, 8);
  } else if (len >= 4) {
    uint32_t x, y;
    memcpy(&x, p, 4);
    memcpy(&y, p + len - 4, 4);
    a = x;
    b = y;
  } else if (len > 0) {
    a = ((uint64_t)p[0] << 16) | ((uint64_t)p[len >> 1] << 8) | p[len - 1];
  }
  return ms_hash_mum(ms_hash_mum(a ^ MS_HASH_P1, b ^ h) ^ MS_HASH_P0, (uint64_t)len ^ MS_HASH_P2);
}

#endif /* MEMSNAP_UTIL_HASH_H */
