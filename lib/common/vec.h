/* SPDX-License-Identifier: MIT
 * memsnap: typed growable arrays.
 *
 *   MS_VEC(int) v = {0};                      // {ptr, len, cap}
 *   if (MS_VEC_PUSH(&v, 42) != 0) ...          // 0 or MS_ENOMEM; v unchanged on failure
 *   free(v.ptr);
 *
 * Growth doubles the capacity (at least 16 elements); lengths are checked for overflow.
 */
#ifndef MEMSNAP_UTIL_VEC_H
#define MEMSNAP_UTIL_VEC_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#define MS_VEC(T) \
  struct {        \
    T *ptr;       \
    size_t len;   \
    size_t cap;   \
  }

/* The capacity that holds `extra` more elements of size `elem` after `len`, doubling `cap` (at
 * least 16 elements); 0 when the bytes would overflow. */
static inline size_t ms__vec_grown_cap(size_t cap, size_t len, size_t extra, size_t elem) {
  if (extra > SIZE_MAX / elem - len) return 0;
  size_t need = len + extra;
  size_t ncap = cap ? cap : 16;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2) {
      ncap = need;
      break;
    }
    ncap *= 2;
  }
  return ncap > SIZE_MAX / elem ? 0 : ncap;
}

/* Ensures room for `extra` more elements of size `elem`. @return 0 or -1 (MS_ENOMEM). */
static inline int ms__vec_reserve(void **ptr, size_t *cap, size_t len, size_t extra, size_t elem) {
  if (extra <= *cap - len) return 0;
  size_t ncap = ms__vec_grown_cap(*cap, len, extra, elem);
  if (!ncap) return -1;
  void *p = realloc(*ptr, ncap * elem);
  if (!p) return -1;
  *ptr = p;
  *cap = ncap;
  return 0;
}

#define MS_VEC_RESERVE(v, extra) \
  ms__vec_reserve((void **)&(v)->ptr, &(v)->cap, (v)->len, (extra), sizeof(*(v)->ptr))

#define MS_VEC_PUSH(v, val) \
  (MS_VEC_RESERVE((v), 1) != 0 ? -1 : ((v)->ptr[(v)->len++] = (val), 0))

#define MS_VEC_FREE(v) \
  do {                 \
    free((v)->ptr);    \
    (v)->ptr = NULL;   \
    (v)->len = 0;      \
    (v)->cap = 0;      \
  } while (0)

#endif /* MEMSNAP_UTIL_VEC_H */
