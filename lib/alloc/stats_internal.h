/* SPDX-License-Identifier: MIT
 * memsnap core: the statistics update helpers of the allocator's hot path (never installed).
 *
 * These are PyTorch's Stat::increase/decrease and update_stat_array
 * (docs/pytorch-allocator.md, "Statistics"), inline so that a malloc/free pair costs a few adds.
 * Callers hold the allocator's lock; nothing here is atomic.
 */
#ifndef MEMSNAP_LIB_STATS_INTERNAL_H
#define MEMSNAP_LIB_STATS_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "common/internal.h"
#include "memsnap/stats.h"

/* current += n; peak = max(peak, current); allocated += n. pre: n >= 0. */
static inline void ms__stat_increase(ms_stat_t *s, int64_t n) {
  ms_assert_internal(n >= 0);
  s->current += n;
  if (s->current > s->peak) s->peak = s->current;
  s->allocated += n;
}

/* current -= n; freed += n. pre: n >= 0 and n <= current (a gauge never goes negative; checked
 * in debug builds, as PyTorch's debug-only assert). */
static inline void ms__stat_decrease(ms_stat_t *s, int64_t n) {
  ms_assert_internal(n >= 0);
  ms_assert_internal(s->current >= n);
  s->current -= n;
  s->freed += n;
}

/* update_stat_array: applies delta (> 0: increase, < 0: decrease) to the aggregate gauge and to
 * the pool's gauge. pool is MS_STAT_SMALL_POOL or MS_STAT_LARGE_POOL. */
static inline void ms__stat_array_update(ms_stat_t arr[MS_STAT_NUM_TYPES], enum ms_stat_type pool,
                                         int64_t delta) {
  ms_assert_internal(pool == MS_STAT_SMALL_POOL || pool == MS_STAT_LARGE_POOL);
  if (delta >= 0) {
    ms__stat_increase(&arr[MS_STAT_ALL], delta);
    ms__stat_increase(&arr[pool], delta);
  } else {
    ms__stat_decrease(&arr[MS_STAT_ALL], -delta);
    ms__stat_decrease(&arr[pool], -delta);
  }
}

static inline void ms__stat_array_increase(ms_stat_t arr[MS_STAT_NUM_TYPES],
                                           enum ms_stat_type pool, int64_t n) {
  ms__stat_increase(&arr[MS_STAT_ALL], n);
  ms__stat_increase(&arr[pool], n);
}

static inline void ms__stat_array_decrease(ms_stat_t arr[MS_STAT_NUM_TYPES],
                                           enum ms_stat_type pool, int64_t n) {
  ms__stat_decrease(&arr[MS_STAT_ALL], n);
  ms__stat_decrease(&arr[pool], n);
}

/* The pool type of a block of rounded size `size` (PyTorch: size <= kSmallSize is small). */
static inline enum ms_stat_type ms__stat_pool_of_size(size_t size) {
  return size <= ((size_t)1048576) ? MS_STAT_SMALL_POOL : MS_STAT_LARGE_POOL;
}

#endif /* MEMSNAP_LIB_STATS_INTERNAL_H */
