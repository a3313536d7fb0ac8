/* SPDX-License-Identifier: MIT
 * Tests for the allocator statistics (lib/stats.c, lib/stats_internal.h): PyTorch's Stat
 * semantics and update_stat_array, the resets, merge, the 122 flat keys of memory_stats() in
 * their sorted order, the amount formatters, and memory_summary()'s exact text. The expected
 * summary texts below were produced by a transcription of PyTorch's memory_summary() in Python
 * fed with the same numbers as fill_stats(). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/stats.h"
#include "alloc/stats_internal.h"

#define KiB ((int64_t)1024)
#define MiB ((int64_t)1048576)

static const char expected_full[] =
    "|===========================================================================|\n"
    "|                  PyTorch CUDA memory summary, device ID 0                 |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 1            |        cudaMalloc retries: 2         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      | 524304 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|       from large pool | 471875 KiB |    921 MiB |   9216 MiB |   8755 MiB |\n"
    "|       from small pool |  52445 KiB |    102 MiB |   1024 MiB |    973 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         | 524312 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|       from large pool | 471883 KiB |    921 MiB |   9216 MiB |   8755 MiB |\n"
    "|       from small pool |  52453 KiB |    102 MiB |   1024 MiB |    973 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      | 524320 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|       from large pool | 471891 KiB |    921 MiB |   9216 MiB |   8755 MiB |\n"
    "|       from small pool |  52461 KiB |    102 MiB |   1024 MiB |    973 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   | 524308 KiB |   1024 MiB |   3072 TiB |   9728 MiB |\n"
    "|       from large pool | 471879 KiB |    921 MiB |   2048 TiB |   8755 MiB |\n"
    "|       from small pool |  52449 KiB |    102 MiB |   1023 TiB |    973 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory | 524316 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|       from large pool | 471887 KiB |    921 MiB |   9216 MiB |   8755 MiB |\n"
    "|       from small pool |  52457 KiB |    102 MiB |   1024 MiB |    973 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |     120    |     300    |    2000 M  |    1499 K  |\n"
    "|       from large pool |     108    |     270    |    1999 M  |    1349 K  |\n"
    "|       from small pool |      12    |      30    |       0 M  |     149 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |     360    |     900    |    4500 K  |    4499 K  |\n"
    "|       from large pool |     324    |     810    |    4050 K  |    4049 K  |\n"
    "|       from small pool |      36    |      90    |     450 K  |     449 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |     240    |     600    |    3000 K  |    2999 K  |\n"
    "|       from large pool |     216    |     540    |    2700 K  |    2699 K  |\n"
    "|       from small pool |      24    |      60    |     300 K  |     299 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |     120    |     300    |    1500 K  |    1499 K  |\n"
    "|       from large pool |     108    |     270    |    1350 K  |    1349 K  |\n"
    "|       from small pool |      12    |      30    |     150 K  |     149 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       3    |       7    |     800 K  |     799 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       1    |       2    |       5    |       4    |\n"
    "|===========================================================================|\n";

static const char expected_abbrev[] =
    "|===========================================================================|\n"
    "|                  PyTorch CUDA memory summary, device ID 3                 |\n"
    "|---------------------------------------------------------------------------|\n"
    "|            CUDA OOMs: 1            |        cudaMalloc retries: 2         |\n"
    "|===========================================================================|\n"
    "|        Metric         | Cur Usage  | Peak Usage | Tot Alloc  | Tot Freed  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocated memory      | 524304 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active memory         | 524312 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Requested memory      | 524320 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved memory   | 524308 KiB |   1024 MiB |   3072 TiB |   9728 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable memory | 524316 KiB |   1024 MiB |  10240 MiB |   9728 MiB |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Allocations           |     120    |     300    |    2000 M  |    1499 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Active allocs         |     360    |     900    |    4500 K  |    4499 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| GPU reserved segments |     240    |     600    |    3000 K  |    2999 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Non-releasable allocs |     120    |     300    |    1500 K  |    1499 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize allocations  |       3    |       7    |     800 K  |     799 K  |\n"
    "|---------------------------------------------------------------------------|\n"
    "| Oversize GPU segments |       1    |       2    |       5    |       4    |\n"
    "|===========================================================================|\n";

static const char *const expected_keys[MS_STATS_NKEYS] = {
    "active.all.allocated",
    "active.all.current",
    "active.all.freed",
    "active.all.peak",
    "active.large_pool.allocated",
    "active.large_pool.current",
    "active.large_pool.freed",
    "active.large_pool.peak",
    "active.small_pool.allocated",
    "active.small_pool.current",
    "active.small_pool.freed",
    "active.small_pool.peak",
    "active_bytes.all.allocated",
    "active_bytes.all.current",
    "active_bytes.all.freed",
    "active_bytes.all.peak",
    "active_bytes.large_pool.allocated",
    "active_bytes.large_pool.current",
    "active_bytes.large_pool.freed",
    "active_bytes.large_pool.peak",
    "active_bytes.small_pool.allocated",
    "active_bytes.small_pool.current",
    "active_bytes.small_pool.freed",
    "active_bytes.small_pool.peak",
    "allocated_bytes.all.allocated",
    "allocated_bytes.all.current",
    "allocated_bytes.all.freed",
    "allocated_bytes.all.peak",
    "allocated_bytes.large_pool.allocated",
    "allocated_bytes.large_pool.current",
    "allocated_bytes.large_pool.freed",
    "allocated_bytes.large_pool.peak",
    "allocated_bytes.small_pool.allocated",
    "allocated_bytes.small_pool.current",
    "allocated_bytes.small_pool.freed",
    "allocated_bytes.small_pool.peak",
    "allocation.all.allocated",
    "allocation.all.current",
    "allocation.all.freed",
    "allocation.all.peak",
    "allocation.large_pool.allocated",
    "allocation.large_pool.current",
    "allocation.large_pool.freed",
    "allocation.large_pool.peak",
    "allocation.small_pool.allocated",
    "allocation.small_pool.current",
    "allocation.small_pool.freed",
    "allocation.small_pool.peak",
    "inactive_split.all.allocated",
    "inactive_split.all.current",
    "inactive_split.all.freed",
    "inactive_split.all.peak",
    "inactive_split.large_pool.allocated",
    "inactive_split.large_pool.current",
    "inactive_split.large_pool.freed",
    "inactive_split.large_pool.peak",
    "inactive_split.small_pool.allocated",
    "inactive_split.small_pool.current",
    "inactive_split.small_pool.freed",
    "inactive_split.small_pool.peak",
    "inactive_split_bytes.all.allocated",
    "inactive_split_bytes.all.current",
    "inactive_split_bytes.all.freed",
    "inactive_split_bytes.all.peak",
    "inactive_split_bytes.large_pool.allocated",
    "inactive_split_bytes.large_pool.current",
    "inactive_split_bytes.large_pool.freed",
    "inactive_split_bytes.large_pool.peak",
    "inactive_split_bytes.small_pool.allocated",
    "inactive_split_bytes.small_pool.current",
    "inactive_split_bytes.small_pool.freed",
    "inactive_split_bytes.small_pool.peak",
    "max_split_size",
    "num_alloc_retries",
    "num_device_alloc",
    "num_device_free",
    "num_ooms",
    "num_sync_all_streams",
    "oversize_allocations.allocated",
    "oversize_allocations.current",
    "oversize_allocations.freed",
    "oversize_allocations.peak",
    "oversize_segments.allocated",
    "oversize_segments.current",
    "oversize_segments.freed",
    "oversize_segments.peak",
    "requested_bytes.all.allocated",
    "requested_bytes.all.current",
    "requested_bytes.all.freed",
    "requested_bytes.all.peak",
    "requested_bytes.large_pool.allocated",
    "requested_bytes.large_pool.current",
    "requested_bytes.large_pool.freed",
    "requested_bytes.large_pool.peak",
    "requested_bytes.small_pool.allocated",
    "requested_bytes.small_pool.current",
    "requested_bytes.small_pool.freed",
    "requested_bytes.small_pool.peak",
    "reserved_bytes.all.allocated",
    "reserved_bytes.all.current",
    "reserved_bytes.all.freed",
    "reserved_bytes.all.peak",
    "reserved_bytes.large_pool.allocated",
    "reserved_bytes.large_pool.current",
    "reserved_bytes.large_pool.freed",
    "reserved_bytes.large_pool.peak",
    "reserved_bytes.small_pool.allocated",
    "reserved_bytes.small_pool.current",
    "reserved_bytes.small_pool.freed",
    "reserved_bytes.small_pool.peak",
    "segment.all.allocated",
    "segment.all.current",
    "segment.all.freed",
    "segment.all.peak",
    "segment.large_pool.allocated",
    "segment.large_pool.current",
    "segment.large_pool.freed",
    "segment.large_pool.peak",
    "segment.small_pool.allocated",
    "segment.small_pool.current",
    "segment.small_pool.freed",
    "segment.small_pool.peak",
};

/* The hand-made statistics of the expected texts above. */
static void fill_stats(ms_stats_t *st) {
  static const int64_t byte_vals[3][4] = {
      /* all, small_pool, large_pool (enum ms_stat_type order) x current, peak, allocated, freed */
      {524288 * KiB, 1024 * MiB, 10240 * MiB, 9728 * MiB},
      {52429 * KiB, 103 * MiB - 123456, 1024 * MiB, 973 * MiB},
      {471859 * KiB, 921 * MiB + 123456, 9216 * MiB, 8755 * MiB},
  };
  static const int64_t count_vals[3][4] = {
      {120, 300, 1500000, 1499880},
      {12, 30, 150000, 149988},
      {108, 270, 1350000, 1349892},
  };
  ms_stats_init(st);
  ms_stat_t *arrays[9] = {st->allocation,     st->segment,        st->active,
                          st->inactive_split, st->allocated_bytes, st->reserved_bytes,
                          st->active_bytes,   st->inactive_split_bytes, st->requested_bytes};
  for (int i = 0; i < 9; i++) {
    bool bytes = i >= 4;
    for (int p = 0; p < MS_STAT_NUM_TYPES; p++) {
      int64_t v[4];
      for (int j = 0; j < 4; j++)
        v[j] = bytes ? byte_vals[p][j] + i * 4096 : count_vals[p][j] * (i % 3 + 1);
      arrays[i][p] = (ms_stat_t){v[0], v[1], v[2], v[3]};
    }
  }
  st->oversize_allocations = (ms_stat_t){3, 7, 800000, 799997};
  st->oversize_segments = (ms_stat_t){1, 2, 5, 4};
  st->num_alloc_retries = 2;
  st->num_ooms = 1;
  st->num_sync_all_streams = 9;
  st->num_device_alloc = 40;
  st->num_device_free = 38;
  st->max_split_size = -1;
  st->reserved_bytes[MS_STAT_ALL].allocated = (int64_t)3 << 50;
  st->reserved_bytes[MS_STAT_LARGE_POOL].allocated = ((int64_t)2 << 50) + 5;
  st->reserved_bytes[MS_STAT_SMALL_POOL].allocated = ((int64_t)1 << 50) - 5;
  st->allocation[MS_STAT_ALL].allocated = 2000000000;
  st->allocation[MS_STAT_LARGE_POOL].allocated = 1999999000;
  st->allocation[MS_STAT_SMALL_POOL].allocated = 1000;
}

Test(stats, memory_summary_is_pytorchs_table) {
  ms_stats_t st;
  fill_stats(&st);
  char *text = NULL;
  cr_assert_eq(ms_stats_memory_summary(&st, 0, false, &text), MS_OK);
  cr_assert_str_eq(text, expected_full);
  /* every line is 75 characters between the borders */
  size_t lines = 0;
  for (const char *l = text; *l; lines++) {
    const char *nl = strchr(l, '\n');
    cr_assert_not_null(nl);
    cr_assert_eq(nl - l, 77, "line %zu is %td characters", lines, nl - l);
    cr_assert(l[0] == '|' && nl[-1] == '|');
    l = nl + 1;
  }
  cr_assert_eq(lines, 6 + 9 * 4 + 2 * 2 + 1);
  ms_stats_text_free(text);

  cr_assert_eq(ms_stats_memory_summary(&st, 3, true, &text), MS_OK);
  cr_assert_str_eq(text, expected_abbrev);
  ms_stats_text_free(text);
  ms_stats_text_free(NULL);
}

Test(stats, memory_summary_of_empty_stats) {
  ms_stats_t st = MS_STATS_INIT;
  char *text = NULL;
  cr_assert_eq(ms_stats_memory_summary(&st, 12, true, &text), MS_OK);
  cr_assert(strstr(text, "|                  PyTorch CUDA memory summary, device ID 12                |\n"));
  cr_assert(strstr(text, "| Allocated memory      |      0 B   |      0 B   |      0 B   |      0 B   |\n"));
  cr_assert(strstr(text, "| Allocations           |       0    |       0    |       0    |       0    |\n"));
  ms_stats_text_free(text);
}

Test(stats, memory_summary_wide_numbers_widen_the_cell) {
  /* Python's {:6d} does not truncate; neither do we. */
  ms_stats_t st = MS_STATS_INIT;
  st.num_ooms = 12345678901234;
  st.allocation[MS_STAT_ALL].current = 1234567890;
  st.allocation[MS_STAT_SMALL_POOL].current = 1234567890;
  char *text = NULL;
  cr_assert_eq(ms_stats_memory_summary(&st, 0, false, &text), MS_OK);
  cr_assert(strstr(text, "|            CUDA OOMs: 12345678901234 |        cudaMalloc retries: 0         |\n"),
            "%s", text);
  cr_assert(strstr(text, "| Allocations           |    1234 M  |"), "%s", text);
  cr_assert(strstr(text, "|       from small pool |    1234 M  |"), "%s", text);
  ms_stats_text_free(text);
}

/* ---------------------------------------------------------------------------------------- */
/* Flat keys                                                                                 */

Test(stats, flat_keys_are_pytorchs_sorted) {
  ms_stats_t st;
  fill_stats(&st);
  ms_stat_kv_t kv[MS_STATS_NKEYS + 3];
  size_t n = 0;
  cr_assert_eq(MS_STATS_NKEYS, 122);
  cr_assert_eq(ms_stats_flat(&st, kv, sizeof kv / sizeof kv[0], &n), MS_OK);
  cr_assert_eq(n, 122);
  for (size_t i = 0; i < n; i++) {
    cr_assert_str_eq(kv[i].name, expected_keys[i], "key %zu", i);
    int64_t v = 0;
    cr_assert_eq(ms_stats_get(&st, kv[i].name, &v), MS_OK);
    cr_assert_eq(v, kv[i].value);
  }
  /* spot values through the names */
  int64_t v = 0;
  cr_assert_eq(ms_stats_get(&st, "allocated_bytes.all.current", &v), MS_OK);
  cr_assert_eq(v, st.allocated_bytes[MS_STAT_ALL].current);
  cr_assert_eq(ms_stats_get(&st, "reserved_bytes.large_pool.peak", &v), MS_OK);
  cr_assert_eq(v, st.reserved_bytes[MS_STAT_LARGE_POOL].peak);
  cr_assert_eq(ms_stats_get(&st, "segment.small_pool.freed", &v), MS_OK);
  cr_assert_eq(v, st.segment[MS_STAT_SMALL_POOL].freed);
  cr_assert_eq(ms_stats_get(&st, "oversize_allocations.peak", &v), MS_OK);
  cr_assert_eq(v, 7);
  cr_assert_eq(ms_stats_get(&st, "oversize_segments.freed", &v), MS_OK);
  cr_assert_eq(v, 4);
  cr_assert_eq(ms_stats_get(&st, "num_alloc_retries", &v), MS_OK);
  cr_assert_eq(v, 2);
  cr_assert_eq(ms_stats_get(&st, "num_sync_all_streams", &v), MS_OK);
  cr_assert_eq(v, 9);
  cr_assert_eq(ms_stats_get(&st, "max_split_size", &v), MS_OK);
  cr_assert_eq(v, -1);
  v = 77;
  cr_assert_eq(ms_stats_get(&st, "allocated.all.current", &v), MS_ENOTFOUND);
  cr_assert_eq(ms_stats_get(&st, "num_ooms.current", &v), MS_ENOTFOUND);
  cr_assert_eq(ms_stats_get(&st, "", &v), MS_ENOTFOUND);
  cr_assert_eq(v, 77);
}

Test(stats, flat_refuses_a_short_buffer) {
  ms_stats_t st = MS_STATS_INIT;
  ms_stat_kv_t kv[MS_STATS_NKEYS];
  memset(kv, 0, sizeof kv);
  size_t n = 999;
  cr_assert_eq(ms_stats_flat(&st, kv, MS_STATS_NKEYS - 1, &n), MS_ELIMIT);
  cr_assert_eq(n, 999);
  cr_assert_null(kv[0].name);
  cr_assert_eq(ms_stats_flat(&st, kv, MS_STATS_NKEYS, &n), MS_OK);
}

/* Every field of the struct is reachable through exactly one key (no field left out). */
Test(stats, every_field_has_one_key) {
  ms_stats_t st;
  ms_stats_init(&st);
  int64_t *words = (int64_t *)((char *)&st + offsetof(ms_stats_t, allocation));
  size_t nwords = (sizeof st - offsetof(ms_stats_t, allocation)) / sizeof(int64_t);
  cr_assert_eq(nwords, MS_STATS_NKEYS);
  for (size_t i = 0; i < nwords; i++) words[i] = (int64_t)i * 1000 + 7;
  ms_stat_kv_t kv[MS_STATS_NKEYS];
  size_t n;
  cr_assert_eq(ms_stats_flat(&st, kv, MS_STATS_NKEYS, &n), MS_OK);
  bool seen[MS_STATS_NKEYS] = {false};
  for (size_t i = 0; i < n; i++) {
    int64_t w = (kv[i].value - 7) / 1000;
    cr_assert(w >= 0 && w < (int64_t)nwords && !seen[w], "%s", kv[i].name);
    seen[w] = true;
  }
}

/* ---------------------------------------------------------------------------------------- */
/* Gauges, arrays, resets, merge, versions                                                   */

Test(stats, init_and_version) {
  ms_stats_t a = MS_STATS_INIT, b;
  memset(&b, 0xff, sizeof b);
  ms_stats_init(&b);
  cr_assert_eq(memcmp(&a, &b, sizeof a), 0);
  cr_assert_eq(a.size, sizeof(ms_stats_t));
  cr_assert_eq(a.version, MS_STATS_VERSION);
  cr_assert_eq(ms_stats_check(&a), MS_OK);
  a.version = MS_STATS_VERSION + 1;
  cr_assert_eq(ms_stats_check(&a), MS_EVERSION);
  b.size = sizeof b - 8;
  cr_assert_eq(ms_stats_check(&b), MS_EVERSION);
  cr_assert_eq(ms_stats_check(NULL), MS_EINVAL);
}

Test(stats, gauge_semantics) {
  ms_stat_t s = {0, 0, 0, 0};
  ms__stat_increase(&s, 100);
  ms__stat_increase(&s, 50);
  ms__stat_decrease(&s, 120);
  ms__stat_increase(&s, 10);
  cr_assert_eq(s.current, 40);
  cr_assert_eq(s.peak, 150);
  cr_assert_eq(s.allocated, 160);
  cr_assert_eq(s.freed, 120);
  cr_assert_eq(s.current, s.allocated - s.freed);
}

Test(stats, array_update_goes_to_all_and_the_pool) {
  ms_stats_t st = MS_STATS_INIT;
  ms__stat_array_update(st.allocated_bytes, MS_STAT_SMALL_POOL, 512);
  ms__stat_array_update(st.allocated_bytes, MS_STAT_LARGE_POOL, 2 * MiB);
  ms__stat_array_update(st.allocated_bytes, MS_STAT_SMALL_POOL, -512);
  ms__stat_array_increase(st.allocated_bytes, MS_STAT_LARGE_POOL, MiB);
  ms__stat_array_decrease(st.allocated_bytes, MS_STAT_LARGE_POOL, 2 * MiB);
  const ms_stat_t *a = st.allocated_bytes;
  cr_assert_eq(a[MS_STAT_ALL].current, MiB);
  cr_assert_eq(a[MS_STAT_ALL].peak, 3 * MiB);
  cr_assert_eq(a[MS_STAT_ALL].allocated, 3 * MiB + 512);
  cr_assert_eq(a[MS_STAT_ALL].freed, 2 * MiB + 512);
  cr_assert_eq(a[MS_STAT_SMALL_POOL].current, 0);
  cr_assert_eq(a[MS_STAT_SMALL_POOL].peak, 512);
  cr_assert_eq(a[MS_STAT_LARGE_POOL].current, MiB);
  cr_assert_eq(a[MS_STAT_LARGE_POOL].peak, 3 * MiB);
  cr_assert_eq(ms__stat_pool_of_size(1048576), MS_STAT_SMALL_POOL);
  cr_assert_eq(ms__stat_pool_of_size(1048577), MS_STAT_LARGE_POOL);
  /* nothing else moved */
  ms_stats_t zero = MS_STATS_INIT;
  memcpy(zero.allocated_bytes, st.allocated_bytes, sizeof st.allocated_bytes);
  cr_assert_eq(memcmp(&zero, &st, sizeof st), 0);
}

Test(stats, reset_peak) {
  ms_stats_t st, before;
  fill_stats(&st);
  before = st;
  ms_stats_reset_peak(&st);
  for (int p = 0; p < MS_STAT_NUM_TYPES; p++) {
    cr_assert_eq(st.reserved_bytes[p].peak, before.reserved_bytes[p].current);
    cr_assert_eq(st.segment[p].peak, before.segment[p].current);
    cr_assert_eq(st.requested_bytes[p].allocated, before.requested_bytes[p].allocated);
    cr_assert_eq(st.inactive_split[p].freed, before.inactive_split[p].freed);
  }
  cr_assert_eq(st.oversize_allocations.peak, 3);
  cr_assert_eq(st.oversize_segments.peak, 1);
  cr_assert_eq(st.num_ooms, before.num_ooms);
  cr_assert_eq(st.num_device_alloc, before.num_device_alloc);
  /* every peak key now equals its current key; all other keys unchanged */
  ms_stat_kv_t kb[MS_STATS_NKEYS], ka[MS_STATS_NKEYS];
  size_t n;
  cr_assert_eq(ms_stats_flat(&before, kb, MS_STATS_NKEYS, &n), MS_OK);
  cr_assert_eq(ms_stats_flat(&st, ka, MS_STATS_NKEYS, &n), MS_OK);
  for (size_t i = 0; i < n; i++) {
    size_t len = strlen(ka[i].name);
    if (len > 5 && strcmp(ka[i].name + len - 5, ".peak") == 0) {
      char cur[96];
      snprintf(cur, sizeof cur, "%.*s.current", (int)(len - 5), ka[i].name);
      int64_t v;
      cr_assert_eq(ms_stats_get(&st, cur, &v), MS_OK);
      cr_assert_eq(ka[i].value, v, "%s", ka[i].name);
    } else {
      cr_assert_eq(ka[i].value, kb[i].value, "%s", ka[i].name);
    }
  }
}

Test(stats, reset_accumulated) {
  ms_stats_t st, before;
  fill_stats(&st);
  before = st;
  ms_stats_reset_accumulated(&st);
  ms_stat_kv_t kb[MS_STATS_NKEYS], ka[MS_STATS_NKEYS];
  size_t n;
  cr_assert_eq(ms_stats_flat(&before, kb, MS_STATS_NKEYS, &n), MS_OK);
  cr_assert_eq(ms_stats_flat(&st, ka, MS_STATS_NKEYS, &n), MS_OK);
  static const char *const zeroed[] = {"num_alloc_retries", "num_ooms", "num_sync_all_streams",
                                       "num_device_alloc", "num_device_free"};
  size_t nzero = 0;
  for (size_t i = 0; i < n; i++) {
    const char *k = ka[i].name;
    size_t len = strlen(k);
    bool acc = (len > 10 && strcmp(k + len - 10, ".allocated") == 0) ||
               (len > 6 && strcmp(k + len - 6, ".freed") == 0);
    for (size_t z = 0; z < sizeof zeroed / sizeof zeroed[0]; z++)
      if (strcmp(k, zeroed[z]) == 0) acc = true;
    if (acc) {
      cr_assert_eq(ka[i].value, 0, "%s", k);
      nzero++;
    } else {
      cr_assert_eq(ka[i].value, kb[i].value, "%s", k);
    }
  }
  cr_assert_eq(nzero, 9 * 3 * 2 + 2 * 2 + 5); /* allocated/freed of 27 + 2 gauges, 5 counters */
  cr_assert_eq(st.max_split_size, -1);
}

Test(stats, merge_sums_and_keeps_the_setting) {
  ms_stats_t a, b, sum = MS_STATS_INIT;
  fill_stats(&a);
  fill_stats(&b);
  b.max_split_size = 200 * MiB;
  ms_stats_merge(&sum, &a);
  cr_assert_eq(memcmp(&sum, &a, sizeof a), 0, "merging into zero copies");
  ms_stats_merge(&sum, &b);
  cr_assert_eq(sum.max_split_size, -1);
  cr_assert_eq(sum.allocated_bytes[MS_STAT_ALL].current, 2 * a.allocated_bytes[MS_STAT_ALL].current);
  cr_assert_eq(sum.segment[MS_STAT_LARGE_POOL].peak, 2 * a.segment[MS_STAT_LARGE_POOL].peak);
  cr_assert_eq(sum.oversize_segments.freed, 8);
  cr_assert_eq(sum.num_device_free, 76);
  ms_stats_t c = MS_STATS_INIT;
  ms_stats_merge(&c, &b);
  cr_assert_eq(c.max_split_size, 200 * MiB);
  cr_assert_eq(c.size, sizeof c);
  cr_assert_eq(c.version, MS_STATS_VERSION);
}

/* ---------------------------------------------------------------------------------------- */
/* Formatters                                                                                */

struct size_case {
  uint64_t bytes;
  char text[24];
};

static const struct size_case format_size_cases[] = {
  {0, "0.0B"},
  {4, "4.0B"},
  {1023, "1023.0B"},
  {1024, "1.0KiB"},
  {605 * 1024, "605.0KiB"},
  {1048575, "1024.0KiB"},
  {20 * 1048576, "20.0MiB"},
  {5261334938ull, "4.9GiB"},
  {(uint64_t)3 << 50, "3.0PiB"},
  {UINT64_MAX, "16.0EiB"},
};

static void check_format_size(const struct size_case *p) {
  char buf[32];
  int n = ms_format_size(p->bytes, buf, sizeof buf);
  cr_assert_str_eq(buf, p->text);
  cr_assert_eq(n, (int)strlen(p->text));
}

Test(stats, format_size) {
  for (size_t i = 0; i < sizeof format_size_cases / sizeof format_size_cases[0]; i++)
    check_format_size(&format_size_cases[i]);
}

Test(stats, format_size_limits_and_sign) {
  char buf[32];
  cr_assert_eq(ms_format_size_signed(-1536, buf, sizeof buf), 7);
  cr_assert_str_eq(buf, "-1.5KiB");
  cr_assert_eq(ms_format_size_signed(INT64_MIN, buf, sizeof buf), 7);
  cr_assert_str_eq(buf, "-8.0EiB");
  cr_assert_eq(ms_format_size(605 * 1024, buf, 8), MS_ELIMIT);
  cr_assert_eq(ms_format_size(605 * 1024, buf, 9), 8);
  cr_assert_eq(ms_format_size(1, NULL, 9), MS_EINVAL);
}

struct cell_case {
  bool count;
  int64_t value, pref;
  char text[24];
};

static const struct cell_case format_cells_cases[] = {
  {false, 0, 0, "     0 B  "},
  {false, 786431, 786431, "786431 B  "},
  {false, 786432, 786432, "   768 KiB"},
  {false, 524288 * 1024, 524288 * 1024, "524288 KiB"},
  {false, (int64_t)1 << 30, (int64_t)1 << 30, "  1024 MiB"},
  {false, 1023, (int64_t)1 << 30, "     0 MiB"},      /* the unit follows the "all" value */
  {false, -1, 1 << 20, "    -1 KiB"},                 /* Python's floor division */
  {false, (int64_t)1 << 62, (int64_t)1 << 62, "  4096 PiB"}, /* PiB is the last unit */
  {false, 12345678, 0, "12345678 B  "},                /* wider than 6: not truncated */
  {true, 0, 0, "      0   "},
  {true, 749999, 749999, " 749999   "},
  {true, 750000, 750000, "    750 K "},
  {true, 1500, 750000, "      1 K "},
  {true, 750000000, 750000000, "    750 M "},
  {true, INT64_MAX, INT64_MAX, "9223372036854 M "},
  {true, -5, 1000000, "     -1 K "},
};

static void check_format_cells(const struct cell_case *p) {
  char buf[48];
  int n = p->count ? ms_format_count_cell(p->value, p->pref, buf, sizeof buf)
                   : ms_format_size_cell(p->value, p->pref, buf, sizeof buf);
  cr_assert_str_eq(buf, p->text, "%lld/%lld", (long long)p->value, (long long)p->pref);
  cr_assert_eq(n, (int)strlen(p->text));
}

Test(stats, format_cells) {
  for (size_t i = 0; i < sizeof format_cells_cases / sizeof format_cells_cases[0]; i++)
    check_format_cells(&format_cells_cases[i]);
}
