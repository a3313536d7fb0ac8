/* SPDX-License-Identifier: MIT
 * memsnap: allocator statistics, PyTorch's DeviceStats (docs/pytorch-allocator.md, "Statistics").
 *
 * Vocabulary:
 *  - A gauge (ms_stat_t) is {current, peak, allocated, freed}: increase(n) adds n to current and
 *    allocated and raises peak to current; decrease(n) subtracts n from current and adds n to
 *    freed. So current == allocated - freed until the accumulated counters are reset.
 *  - A stat array is three gauges indexed by enum ms_stat_type: all (aggregate), small_pool and
 *    large_pool. Every change goes to "all" and to the pool of the block (PyTorch's
 *    update_stat_array), so all == small_pool + large_pool.
 *  - A counter is one int64_t.
 *
 * MS_STAT_FIELDS(XX) lists every field once. It generates the struct, the resets, the merge, the
 * flat key list (exactly PyTorch's memory_stats() keys, MS_STATS_NKEYS of them) and the encoders,
 * which therefore cannot disagree.
 *
 * ms_stats_t is a versioned plain struct: it starts with `size` and `version`, and functions that
 * fill one (ms_allocator_get_stats) refuse a caller whose struct has another size or version.
 * Initialise it with ms_stats_init() or MS_STATS_INIT.
 *
 * Thread-safety: every function here works on caller-owned data only.
 */
#ifndef MEMSNAP_STATS_H
#define MEMSNAP_STATS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"

MS_EXTERN_C_BEGIN

/* XX(kind, name): kind is ARRAY (a stat array: all/small_pool/large_pool x 4), STAT (one gauge)
 * or COUNTER (one int64_t). Order = PyTorch's DeviceStats. */
#define MS_STAT_FIELDS(XX)                                                                     \
  XX(ARRAY, allocation)           /* count of live client allocations */                     \
  XX(ARRAY, segment)              /* count of device segments (device mallocs held) */      \
  XX(ARRAY, active)               /* count of blocks allocated or awaiting stream events */ \
  XX(ARRAY, inactive_split)       /* count of free blocks in partially used segments */     \
  XX(ARRAY, allocated_bytes)      /* bytes of allocated blocks (rounded sizes) */           \
  XX(ARRAY, reserved_bytes)       /* bytes of device memory held by the allocator */        \
  XX(ARRAY, active_bytes)         /* bytes of active blocks */                              \
  XX(ARRAY, inactive_split_bytes) /* bytes of free blocks in partially used segments */     \
  XX(ARRAY, requested_bytes)      /* bytes requested by clients (unrounded) of active blocks */ \
  XX(COUNTER, num_alloc_retries)  /* final retries after releasing all cached segments */    \
  XX(COUNTER, num_ooms)           /* out-of-memory errors returned */                        \
  XX(STAT, oversize_allocations)  /* count of allocated blocks >= max_split_size */         \
  XX(STAT, oversize_segments)     /* count of segments >= max_split_size */                 \
  XX(COUNTER, num_sync_all_streams) /* synchronize-and-free-all-events calls */             \
  XX(COUNTER, num_device_alloc)   /* device allocation (and expandable map) calls */        \
  XX(COUNTER, num_device_free)    /* device free (and expandable unmap) calls */            \
  XX(COUNTER, max_split_size)     /* bytes; config value at creation, -1 = unlimited */

enum ms_stat_type {
  MS_STAT_ALL = 0,        /* "all": aggregate of both pools */
  MS_STAT_SMALL_POOL = 1, /* "small_pool": blocks of rounded size <= 1 MiB */
  MS_STAT_LARGE_POOL = 2, /* "large_pool" */
  MS_STAT_NUM_TYPES = 3
};

/* One gauge; all four values are in the unit of its field (bytes or a count). */
typedef struct ms_stat_s {
  int64_t current;   /* value now */
  int64_t peak;      /* highest current since creation or the last ms_stats_reset_peak() */
  int64_t allocated; /* sum of increases since creation or the last reset_accumulated */
  int64_t freed;     /* sum of decreases since creation or the last reset_accumulated */
} ms_stat_t;

#define MS_STATS_VERSION 1u

/* Number of keys of the flat view: 9*3*4 + 2*4 + 6 = 122, as torch.cuda.memory_stats(). */
#define MS_STATS_NKEYS 122

#define MS__STATS_FIELD_ARRAY(name) ms_stat_t name[MS_STAT_NUM_TYPES];
#define MS__STATS_FIELD_STAT(name) ms_stat_t name;
#define MS__STATS_FIELD_COUNTER(name) int64_t name;
#define MS__STATS_FIELD(kind, name) MS__STATS_FIELD_##kind(name)

typedef struct ms_stats_s {
  size_t size;      /* sizeof(ms_stats_t) of the caller */
  uint32_t version; /* MS_STATS_VERSION of the caller */
  MS_STAT_FIELDS(MS__STATS_FIELD)
} ms_stats_t;

/* Static initialiser: every statistic 0, size and version set. */
#define MS_STATS_INIT {.size = sizeof(ms_stats_t), .version = MS_STATS_VERSION}

/* One entry of the flat view: a PyTorch key and its value. name is static storage. */
typedef struct ms_stat_kv_s {
  const char *name; /* e.g. "allocated_bytes.all.current", "num_alloc_retries" */
  int64_t value;
} ms_stat_kv_t;

/* Zeroes every statistic and sets size and version. pre: st != NULL. */
MS_API void ms_stats_init(ms_stats_t *st);

/* @return MS_OK if st->size and st->version match this library's ms_stats_t, else MS_EVERSION
 * (MS_EINVAL if st is NULL). Fillers of a caller's ms_stats_t call this first. */
MS_API int ms_stats_check(const ms_stats_t *st);

/* PyTorch's resetPeakStats: peak = current for every gauge (the 9 arrays and both oversize
 * stats). Counters are unchanged. */
MS_API void ms_stats_reset_peak(ms_stats_t *st);

/* PyTorch's resetAccumulatedStats: allocated = freed = 0 for every gauge, and the counters
 * num_alloc_retries, num_ooms, num_sync_all_streams, num_device_alloc and num_device_free = 0.
 * current, peak and max_split_size are unchanged. */
MS_API void ms_stats_reset_accumulated(ms_stats_t *st);

/* Adds src into dst (for totals over several devices): current, allocated, freed and counters are
 * summed; peaks are summed too, an upper bound of the peak of the sum (mimalloc's convention).
 * max_split_size is a setting, not an amount: dst keeps its own unless it is 0, then takes src's.
 * pre: both checked by ms_stats_check(). */
MS_API void ms_stats_merge(ms_stats_t *dst, const ms_stats_t *src);

/* The flat view of torch.cuda.memory_stats(): MS_STATS_NKEYS (name, value) pairs sorted by name
 * in byte order (as Python sorts the flattened keys), e.g. "active.all.allocated" first.
 * @return MS_OK with *n = MS_STATS_NKEYS, or MS_ELIMIT if cap < MS_STATS_NKEYS (out and *n
 * untouched). */
MS_API MS_NODISCARD int ms_stats_flat(const ms_stats_t *st, ms_stat_kv_t *out, size_t cap,
                                      size_t *n);

/* Looks up one flat key (e.g. "reserved_bytes.large_pool.peak").
 * @return MS_OK with *value set, or MS_ENOTFOUND. */
MS_API MS_NODISCARD int ms_stats_get(const ms_stats_t *st, const char *name, int64_t *value);

/* torch.cuda.memory_summary(device, abbreviated): PyTorch's table, exactly (75 characters
 * between the '|' borders of every line, each line ending in "|\n"; header box, nine metrics
 * with "from large pool"/"from small pool" rows unless abbreviated, then the two oversize rows).
 * Cells use PyTorch's _format_size/_format_count, with the unit chosen from the "all" row of the
 * same column (see ms_format_size_cell). The header still says "PyTorch CUDA memory summary" and
 * "cudaMalloc retries" so that tools reading PyTorch's text read ours.
 * @return MS_OK with *out = a heap string the caller frees with ms_stats_text_free(), or
 * MS_ENOMEM (*out untouched). */
MS_API MS_NODISCARD int ms_stats_memory_summary(const ms_stats_t *st, int device, bool abbreviated,
                                                char **out);

/* Frees a string returned by this module; accepts NULL. */
MS_API void ms_stats_text_free(char *text);

/* The amount formatter: _memory_viz.py's _format_size, binary units with one decimal place:
 * divide by 1024 while the value is >= 1024, through "", Ki, Mi, Gi, Ti, Pi, Ei, Zi, then print
 * "%.1f<unit>B", e.g. "0.0B", "512.0B", "605.0KiB", "20.0MiB", "4.9GiB".
 * @return the length written (without the NUL), or MS_ELIMIT if cap is too small (dst then
 * holds a truncated string; 16 bytes always suffice). */
MS_API int ms_format_size(uint64_t bytes, char *dst, size_t cap);

/* The same for a signed amount (a difference): "-1.5KiB". */
MS_API int ms_format_size_signed(int64_t bytes, char *dst, size_t cap);

/* memory_summary's byte cell, PyTorch's _format_size(sz, pref_sz): the unit is raised (B, KiB,
 * MiB, GiB, TiB, PiB) while pref is >= 768 KiB of the current unit, dividing value by 1024 with
 * floor division each time; printed as "%6d %s" (10 characters unless the number is wider).
 * @return as ms_format_size (32 bytes always suffice). */
MS_API int ms_format_size_cell(int64_t value, int64_t pref, char *dst, size_t cap);

/* memory_summary's count cell, PyTorch's _format_count(cnt, pref_cnt): units " ", "K", "M",
 * raised while pref >= 750000 of the current unit, dividing by 1000; printed as "%7d %s ".
 * @return as ms_format_size (32 bytes always suffice). */
MS_API int ms_format_count_cell(int64_t value, int64_t pref, char *dst, size_t cap);

MS_EXTERN_C_END

#endif /* MEMSNAP_STATS_H */
