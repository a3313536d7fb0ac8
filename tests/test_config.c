/* SPDX-License-Identifier: MIT
 * Tests for the allocator configuration (lib/config.c): the size formulas against the tables of
 * docs/pytorch-allocator.md ("Sizes and rounding"), the PYTORCH_CUDA_ALLOC_CONF syntax and keys
 * ("Configuration keys": values,
 * resets, every error with its exact text and offset), MEMSNAP_ALLOC_CONF, the canonical string,
 * and hostile strings (every truncation, random bytes, absurd numbers, deep nesting). */
#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/config.h"

#define MiB ((size_t)1048576)

static ms_alloc_config_t config_with_divisions(size_t d) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++) c.roundup_power2_divisions[i] = d;
  return c;
}

/* ---------------------------------------------------------------------------------------- */
/* Defaults                                                                                  */

Test(config, init_gives_pytorch_defaults) {
  ms_alloc_config_t c;
  memset(&c, 0x5a, sizeof c);
  ms_alloc_config_init(&c);
  cr_assert_eq(c.max_split_size, SIZE_MAX);
  cr_assert_eq(c.max_non_split_rounding_size, 20 * MiB);
  cr_assert_eq(c.large_segment_size, 20 * MiB);
  cr_assert_eq(c.garbage_collection_threshold, 0.0);
  cr_assert_eq(c.per_process_memory_fraction, 1.0);
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++)
    cr_assert_eq(c.roundup_power2_divisions[i], 0);
  cr_assert(!c.expandable_segments);
  cr_assert(!c.release_lock_on_cudamalloc);
  cr_assert(!c.graph_capture_record_stream_reuse);
  cr_assert(!c.pinned_use_cuda_host_register);
  cr_assert(!c.pinned_use_background_threads);
  cr_assert_eq(c.pinned_num_register_threads, 1);
  cr_assert_eq(c.pinned_reserve_segment_size, 0);
  cr_assert_str_eq(c.last_allocator_settings, "");
  cr_assert_eq(ms_alloc_config_validate(&c, NULL), MS_OK);
}

Test(config, constants_are_pytorchs) {
  cr_assert_eq(MS_MIN_BLOCK_SIZE, 512);
  cr_assert_eq(MS_SMALL_SIZE, 1048576);
  cr_assert_eq(MS_SMALL_BUFFER, 2097152);
  cr_assert_eq(MS_LARGE_BUFFER, 20971520);
  cr_assert_eq(MS_MIN_LARGE_ALLOC, 10485760);
  cr_assert_eq(MS_ROUND_LARGE, 2097152);
  cr_assert_eq(MS_ROUNDUP_POWER2_INTERVALS, 16);
}

/* ---------------------------------------------------------------------------------------- */
/* "Sizes and rounding" examples: request, round (d=0), alloc_size, round (d=4), alloc_size */

struct round_case {
  size_t request, round0, alloc0, round4, alloc4;
};

ParameterizedTestParameters(config, round_size_worked_examples) {
  static struct round_case cases[] = {
      {1, 512, 2 * MiB, 512, 2 * MiB},
      {513, 1024, 2 * MiB, 1024, 2 * MiB},
      {1048576, 1048576, 2 * MiB, 1048576, 2 * MiB},
      {1048577, 1049088, 20 * MiB, 1310720, 20 * MiB},
      {5000000, 5000192, 20 * MiB, 5242880, 20 * MiB},
      {10485761, 10486272, 12 * MiB, 12582912, 12 * MiB},
      {123456789, 123457024, 123731968, 134217728, 128 * MiB},
  };
  return cr_make_param_array(struct round_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct round_case *p, config, round_size_worked_examples) {
  ms_alloc_config_t c0 = config_with_divisions(0), c4 = config_with_divisions(4);
  size_t r0 = ms_alloc_round_size(&c0, p->request);
  size_t r4 = ms_alloc_round_size(&c4, p->request);
  cr_assert_eq(r0, p->round0, "round_size(%zu, d=0) = %zu, expected %zu", p->request, r0,
               p->round0);
  cr_assert_eq(ms_alloc_allocation_size(&c0, r0), p->alloc0);
  cr_assert_eq(r4, p->round4, "round_size(%zu, d=4) = %zu, expected %zu", p->request, r4,
               p->round4);
  cr_assert_eq(ms_alloc_allocation_size(&c4, r4), p->alloc4);
}

/* More rounding cases from "Sizes and rounding"'s consequences: (divisions, request, expected). */
struct round_d_case {
  size_t d, request, expected;
};

ParameterizedTestParameters(config, round_size_rules) {
  static struct round_d_case cases[] = {
      {0, 0, 512},                  /* < 512 -> 512 */
      {0, 511, 512},
      {0, 512, 512},
      {0, 1536, 1536},
      {4, 1200, 1536},              /* d=4 but size <= 512*4: plain 512 rounding, not 1280 */
      {4, 2048, 2048},              /* 2048 == 512*4: still plain */
      {4, 2049, 2560},              /* f=2048, step 512 */
      {1, 1048577, 1049088},        /* divisions 1 is ignored (#161139) */
      {2, 1048577, 1572864},        /* step = 512 KiB */
      {2, 3 * MiB, 3 * MiB},        /* exactly on a step */
      {8, 4 * MiB, 4 * MiB},        /* a power of two stays */
      {8, 4 * MiB + 1, 4 * MiB + 512 * 1024},
      {16, 1000000, 1015808},       /* < 1 MiB uses interval 0: f=512Ki, step 32Ki */
      {4096, 1048577, 1049088},     /* 512*d = 2 MiB >= size: plain rounding */
      {1024, 1048577, 1049600},     /* f=1Mi, step 1Ki */
  };
  return cr_make_param_array(struct round_d_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct round_d_case *p, config, round_size_rules) {
  ms_alloc_config_t c = config_with_divisions(p->d);
  size_t r = ms_alloc_round_size(&c, p->request);
  cr_assert_eq(r, p->expected, "round_size(%zu, d=%zu) = %zu, expected %zu", p->request, p->d, r,
               p->expected);
}

Test(config, round_size_overflow_is_zero) {
  ms_alloc_config_t c = config_with_divisions(0);
  cr_assert_eq(ms_alloc_round_size(&c, SIZE_MAX), 0);
  cr_assert_eq(ms_alloc_round_size(&c, SIZE_MAX - 510), 0);
  cr_assert_eq(ms_alloc_round_size(&c, SIZE_MAX - 511), SIZE_MAX - 511);
  c = config_with_divisions(2);
  cr_assert_eq(ms_alloc_round_size(&c, SIZE_MAX), 0);
  cr_assert_eq(ms_alloc_round_size(&c, (SIZE_MAX >> 1) + 1), (SIZE_MAX >> 1) + 1);
  c = config_with_divisions((size_t)1 << 62); /* 512*d overflows: plain rounding */
  cr_assert_eq(ms_alloc_round_size(&c, 3 * MiB + 1), 3 * MiB + 512);
}

Test(config, allocation_size_rules) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_allocation_size(&c, 512), 2 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, MiB), 2 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, MiB + 512), 20 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, 10 * MiB - 512), 20 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, 10 * MiB), 10 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, 10 * MiB + 512), 12 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, SIZE_MAX - 511), 0);
  cr_assert_eq(ms_alloc_config_parse(&c, "large_segment_size_mb:32", NULL), MS_OK);
  cr_assert_eq(ms_alloc_allocation_size(&c, 5 * MiB), 32 * MiB);
  cr_assert_eq(ms_alloc_allocation_size(&c, 11 * MiB), 12 * MiB);
}

Test(config, divisions_for_clamps_the_interval) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++) c.roundup_power2_divisions[i] = (size_t)i + 100;
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, 0), 100);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, 1), 100);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, MiB - 1), 100);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, 2 * MiB - 1), 100);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, 2 * MiB), 101);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, (size_t)1 << 35), 115);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, (size_t)1 << 36), 115);
  cr_assert_eq(ms_alloc_roundup_divisions_for(&c, SIZE_MAX), 115);
}

/* ---------------------------------------------------------------------------------------- */
/* Parsing valid strings                                                                     */

struct div_case {
  char str[96];
  size_t expect[MS_ROUNDUP_POWER2_INTERVALS];
};

static const struct div_case divisions_forms_cases[] = {
  {"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
   {1, 1, 1, 1, 1, 1, 1, 1, 1, 2, 4, 8, 8, 8, 8, 8}},
  {"roundup_power2_divisions:[1:1,4:2,16:4]", {1, 0, 2, 0, 4, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0}},
  {"roundup_power2_divisions:4", {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
  {"roundup_power2_divisions:1", {1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1}},
  {"roundup_power2_divisions:[]", {0}},
  /* '>' with no explicit key yet fills from index 1 ([2025+] last_index + 1 rule). */
  {"roundup_power2_divisions:[>:8]", {0, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8, 8}},
  /* '>' after the last interval fills nothing. */
  {"roundup_power2_divisions:[32768:2,>:8]", {2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}},
  /* keys above 32768 MiB clamp to the last interval */
  {"roundup_power2_divisions:[1048576:4]", {4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4, 4}},
  /* 0 disables rounding for an interval; later keys overwrite */
  {"roundup_power2_divisions:[2:4,2:0,>:2]", {4, 0, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2, 2}},
  {" roundup_power2_divisions : [ 256 : 1 , > : 8 ] ",
   {1, 1, 1, 1, 1, 1, 1, 1, 1, 8, 8, 8, 8, 8, 8, 8}},
};

static void check_divisions_forms(const struct div_case *p) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_alloc_config_parse(&c, p->str, &eb), MS_OK, "%s: %s", p->str, eb.msg);
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++)
    cr_assert_eq(c.roundup_power2_divisions[i], p->expect[i], "%s: [%d] = %zu, expected %zu",
                 p->str, i, c.roundup_power2_divisions[i], p->expect[i]);
}

Test(config, divisions_forms) {
  for (size_t i = 0; i < sizeof divisions_forms_cases / sizeof divisions_forms_cases[0]; i++)
    check_divisions_forms(&divisions_forms_cases[i]);
}

Test(config, every_key_is_parsed) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  const char *s =
      "max_split_size_mb:128,max_non_split_rounding_mb:64,large_segment_size_mb:32,"
      "roundup_power2_divisions:2,garbage_collection_threshold:0.6,"
      "per_process_memory_fraction:0.25,expandable_segments:True,"
      "release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True,backend:native,"
      "pinned_use_cuda_host_register:True,pinned_num_register_threads:8,"
      "pinned_use_background_threads:True,pinned_reserve_segment_size_mb:64";
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_alloc_config_parse(&c, s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(c.max_split_size, 128 * MiB);
  cr_assert_eq(c.max_non_split_rounding_size, 64 * MiB);
  cr_assert_eq(c.large_segment_size, 32 * MiB);
  cr_assert_eq(c.roundup_power2_divisions[7], 2);
  cr_assert_eq(c.garbage_collection_threshold, 0.6);
  cr_assert_eq(c.per_process_memory_fraction, 0.25);
  cr_assert(c.expandable_segments);
  cr_assert(c.release_lock_on_cudamalloc);
  cr_assert(c.graph_capture_record_stream_reuse);
  cr_assert(c.pinned_use_cuda_host_register);
  cr_assert_eq(c.pinned_num_register_threads, 8);
  cr_assert(c.pinned_use_background_threads);
  cr_assert_eq(c.pinned_reserve_segment_size, 64 * MiB);
  cr_assert_str_eq(c.last_allocator_settings, s);
  cr_assert_eq(ms_alloc_config_validate(&c, NULL), MS_OK);
}

Test(config, aliases_whitespace_trailing_comma_and_empty) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, "release_lock_on_hipmalloc:True,"
                                         "pinned_use_hip_host_register:True,", NULL), MS_OK);
  cr_assert(c.release_lock_on_cudamalloc);
  cr_assert(c.pinned_use_cuda_host_register);
  cr_assert_eq(ms_alloc_config_parse(&c, "\tmax_split_size_mb :\n 200 ,\rexpandable_segments: False",
                                     NULL), MS_OK);
  cr_assert_eq(c.max_split_size, 200 * MiB);
  cr_assert(!c.expandable_segments);
  cr_assert(c.release_lock_on_cudamalloc); /* not a reset key: kept */
  cr_assert_eq(ms_alloc_config_parse(&c, "", NULL), MS_OK);
  cr_assert_eq(c.max_split_size, SIZE_MAX);
  cr_assert_eq(ms_alloc_config_parse(&c, "   ", NULL), MS_OK);
  /* a repeated key: the last one wins, as in PyTorch */
  cr_assert_eq(ms_alloc_config_parse(&c, "max_split_size_mb:100,max_split_size_mb:300", NULL),
               MS_OK);
  cr_assert_eq(c.max_split_size, 300 * MiB);
}

Test(config, limits_at_their_edges) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, "max_split_size_mb:20", NULL), MS_OK);
  cr_assert_eq(c.max_split_size, 20 * MiB);
  cr_assert_eq(ms_alloc_config_parse(&c, "max_non_split_rounding_mb:20", NULL), MS_OK);
  cr_assert_eq(ms_alloc_config_parse(&c, "large_segment_size_mb:11", NULL), MS_OK);
  cr_assert_eq(c.large_segment_size, 11 * MiB);
  /* max_split_size_mb is clamped to SIZE_MAX / MiB, as PyTorch does */
  cr_assert_eq(ms_alloc_config_parse(&c, "max_split_size_mb:18446744073709551615", NULL), MS_OK);
  cr_assert_eq(c.max_split_size, SIZE_MAX / MiB * MiB);
  cr_assert_eq(ms_alloc_config_parse(&c, "per_process_memory_fraction:0", NULL), MS_OK);
  cr_assert_eq(c.per_process_memory_fraction, 0.0);
  cr_assert_eq(ms_alloc_config_parse(&c, "per_process_memory_fraction:1.0", NULL), MS_OK);
  cr_assert_eq(ms_alloc_config_parse(&c, "per_process_memory_fraction:5e-1", NULL), MS_OK);
  cr_assert_eq(c.per_process_memory_fraction, 0.5);
  cr_assert_eq(ms_alloc_config_parse(&c, "garbage_collection_threshold:.999", NULL), MS_OK);
  cr_assert_eq(c.garbage_collection_threshold, 0.999);
  cr_assert_eq(ms_alloc_config_parse(&c, "pinned_num_register_threads:128", NULL), MS_OK);
  cr_assert_eq(c.pinned_num_register_threads, 128);
  cr_assert_eq(ms_alloc_config_parse(&c, "pinned_num_register_threads:1", NULL), MS_OK);
}

Test(config, reparse_resets_like_pytorch) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, "max_split_size_mb:100,roundup_power2_divisions:4,"
                                         "garbage_collection_threshold:0.5,"
                                         "max_non_split_rounding_mb:40,large_segment_size_mb:30,"
                                         "expandable_segments:True,"
                                         "per_process_memory_fraction:0.5",
                                     NULL),
               MS_OK);
  cr_assert_eq(c.max_non_split_rounding_size, 40 * MiB);
  cr_assert_eq(ms_alloc_config_parse(&c, "release_lock_on_cudamalloc:True", NULL), MS_OK);
  /* reset on every parse */
  cr_assert_eq(c.max_split_size, SIZE_MAX);
  cr_assert_eq(c.roundup_power2_divisions[0], 0);
  cr_assert_eq(c.roundup_power2_divisions[15], 0);
  cr_assert_eq(c.garbage_collection_threshold, 0.0);
  cr_assert_eq(c.max_non_split_rounding_size, 30 * MiB); /* = the current large_segment_size */
  /* kept */
  cr_assert_eq(c.large_segment_size, 30 * MiB);
  cr_assert(c.expandable_segments);
  cr_assert_eq(c.per_process_memory_fraction, 0.5);
  cr_assert_str_eq(c.last_allocator_settings, "release_lock_on_cudamalloc:True");
}

Test(config, large_segment_size_applies_to_limits_whatever_the_order) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb = {{0}};
  /* the limit of max_split_size_mb is large_segment_size_mb, even when given after it */
  cr_assert_eq(ms_alloc_config_parse(&c, "max_split_size_mb:30,large_segment_size_mb:40", &eb),
               MS_ECONFIG);
  cr_assert_str_eq(eb.msg, "key 'max_split_size_mb' at offset 18: CachingAllocator option "
                           "max_split_size_mb too small, must be >= 40");
  cr_assert_eq(ms_alloc_config_parse(&c, "large_segment_size_mb:12,max_split_size_mb:12", &eb),
               MS_OK);
  cr_assert_eq(c.max_split_size, 12 * MiB);
  cr_assert_eq(c.max_non_split_rounding_size, 12 * MiB);
}

/* ---------------------------------------------------------------------------------------- */
/* Errors: exact messages, offsets, and the struct left untouched                            */

struct err_case {
  char str[96];
  char msg[640];
};

/* One test over the whole table: a process per case would cost more than the cases. */
static const struct err_case error_cases[] = {
  {"foo:1", "key 'foo' at offset 0: unrecognized key, expected one of: max_split_size_mb, "
            "max_non_split_rounding_mb, large_segment_size_mb, roundup_power2_divisions, "
            "garbage_collection_threshold, per_process_memory_fraction, expandable_segments, "
            "release_lock_on_cudamalloc, graph_capture_record_stream_reuse, backend, "
            "pinned_use_cuda_host_register, pinned_num_register_threads, "
            "pinned_use_background_threads, pinned_reserve_segment_size_mb"},
  {"max_split_size_mb:19",
   "key 'max_split_size_mb' at offset 18: CachingAllocator option max_split_size_mb too "
   "small, must be >= 20"},
  {"max_split_size_mb:0", "key 'max_split_size_mb' at offset 18: CachingAllocator option "
                          "max_split_size_mb too small, must be >= 20"},
  {"max_split_size_mb:-1", "key 'max_split_size_mb' at offset 18: expected a non-negative "
                           "integer, got '-1'"},
  {"max_split_size_mb:12abc", "key 'max_split_size_mb' at offset 18: expected a "
                              "non-negative integer, got '12abc'"},
  {"max_split_size_mb:18446744073709551616",
   "key 'max_split_size_mb' at offset 18: expected a non-negative integer of at most "
   "18446744073709551615, got '18446744073709551616'"},
  {"max_split_size_mb", "key 'max_split_size_mb' at offset 17: expected ':' after the key, "
                        "got end of string"},
  {"max_split_size_mb:", "key 'max_split_size_mb' at offset 18: expected a non-negative "
                         "integer, got end of string"},
  {"max_split_size_mb,100", "key 'max_split_size_mb' at offset 17: expected ':' after the "
                            "key, got ','"},
  {"max_split_size_mb:100 200", "key 'max_split_size_mb' at offset 22: expected ',' or the "
                                "end of the string after the value, got '200'"},
  {"max_split_size_mb:100:", "key 'max_split_size_mb' at offset 21: expected ',' or the end "
                             "of the string after the value, got ':'"},
  {",max_split_size_mb:100", "at offset 0: expected a key, got ','"},
  {"max_split_size_mb:100,,", "at offset 22: expected a key, got ','"},
  {":1", "at offset 0: expected a key, got ':'"},
  {"max_non_split_rounding_mb:10",
   "key 'max_non_split_rounding_mb' at offset 26: CachingAllocator option "
   "max_non_split_rounding_mb too small, must be >= 20"},
  {"max_non_split_rounding_mb:17592186044416",
   "key 'max_non_split_rounding_mb' at offset 26: expected a size of at most 17592186044415 "
   "MiB, got 17592186044416"},
  {"large_segment_size_mb:10", "key 'large_segment_size_mb' at offset 22: CachingAllocator "
                               "option large_segment_size_mb must be > 10 MB"},
  {"roundup_power2_divisions:3", "key 'roundup_power2_divisions' at offset 25: For roundups, "
                                 "the divisions has to be power of 2, got 3"},
  {"roundup_power2_divisions:0", "key 'roundup_power2_divisions' at offset 25: For roundups, "
                                 "the divisions has to be power of 2, got 0"},
  {"roundup_power2_divisions:[256:3]",
   "key 'roundup_power2_divisions' at offset 30: For roundups, the divisions has to be power "
   "of 2 or 0 to disable roundup, got 3"},
  {"roundup_power2_divisions:[3:2]", "key 'roundup_power2_divisions' at offset 26: For "
                                     "roundups, the intervals have to be power of 2, got 3"},
  {"roundup_power2_divisions:[0:2]", "key 'roundup_power2_divisions' at offset 26: For "
                                     "roundups, the intervals have to be power of 2, got 0"},
  {"roundup_power2_divisions:[256:1,512:2",
   "key 'roundup_power2_divisions' at offset 25: expected closing bracket ']' but reached "
   "end of config"},
  {"roundup_power2_divisions:[", "key 'roundup_power2_divisions' at offset 25: expected "
                                 "closing bracket ']' but reached end of config"},
  {"roundup_power2_divisions:[256:1 512:2]",
   "key 'roundup_power2_divisions' at offset 32: expected ',' or ']' in the list, got '512'"},
  {"roundup_power2_divisions:[256 1]", "key 'roundup_power2_divisions' at offset 30: "
                                       "expected ':' after the interval, got '1'"},
  {"roundup_power2_divisions:[x:1]", "key 'roundup_power2_divisions' at offset 26: expected "
                                     "an interval start in MiB or '>', got 'x'"},
  {"roundup_power2_divisions:[[1:1]]", "key 'roundup_power2_divisions' at offset 26: "
                                       "expected an interval start in MiB or '>', got '['"},
  {"roundup_power2_divisions:[>:3]", "key 'roundup_power2_divisions' at offset 28: For "
                                     "roundups, the divisions has to be power of 2 or 0 to "
                                     "disable roundup, got 3"},
  {"roundup_power2_divisions:]", "key 'roundup_power2_divisions' at offset 25: expected a "
                                 "non-negative integer, got ']'"},
  {"garbage_collection_threshold:1.0", "key 'garbage_collection_threshold' at offset 29: "
                                       "garbage_collect_threshold is invalid, set it in "
                                       "(0.0, 1.0)"},
  {"garbage_collection_threshold:0", "key 'garbage_collection_threshold' at offset 29: "
                                     "garbage_collect_threshold is invalid, set it in (0.0, "
                                     "1.0)"},
  {"garbage_collection_threshold:nan", "key 'garbage_collection_threshold' at offset 29: "
                                       "expected a decimal number, got 'nan'"},
  {"garbage_collection_threshold:0.5.5", "key 'garbage_collection_threshold' at offset 29: "
                                         "expected a decimal number, got '0.5.5'"},
  {"garbage_collection_threshold:1e999", "key 'garbage_collection_threshold' at offset 29: "
                                         "expected a decimal number, got '1e999'"},
  {"per_process_memory_fraction:1.5", "key 'per_process_memory_fraction' at offset 28: "
                                      "per_process_memory_fraction is invalid, set it in "
                                      "[0.0, 1.0]"},
  {"per_process_memory_fraction:-0.1", "key 'per_process_memory_fraction' at offset 28: "
                                       "per_process_memory_fraction is invalid, set it in "
                                       "[0.0, 1.0]"},
  {"expandable_segments:true", "key 'expandable_segments' at offset 20: expected 'True' or "
                               "'False', got 'true'"},
  {"expandable_segments:1", "key 'expandable_segments' at offset 20: expected 'True' or "
                            "'False', got '1'"},
  {"release_lock_on_cudamalloc:yes", "key 'release_lock_on_cudamalloc' at offset 27: "
                                     "expected 'True' or 'False', got 'yes'"},
  {"graph_capture_record_stream_reuse:", "key 'graph_capture_record_stream_reuse' at offset "
                                         "34: expected 'True' or 'False', got end of string"},
  {"backend:cudaMallocAsync", "key 'backend' at offset 8: backend 'cudaMallocAsync' is not "
                              "supported: memsnap implements the native allocator only "
                              "(expected 'native')"},
  {"backend:hipMallocAsync", "key 'backend' at offset 8: backend 'hipMallocAsync' is not "
                             "supported: memsnap implements the native allocator only "
                             "(expected 'native')"},
  {"backend:Native", "key 'backend' at offset 8: Unknown allocator backend, options are "
                     "native and cudaMallocAsync (got 'Native')"},
  {"pinned_num_register_threads:3", "key 'pinned_num_register_threads' at offset 28: Number "
                                    "of register threads has to be power of 2, got 3"},
  {"pinned_num_register_threads:0", "key 'pinned_num_register_threads' at offset 28: Number "
                                    "of register threads has to be power of 2, got 0"},
  {"pinned_num_register_threads:256", "key 'pinned_num_register_threads' at offset 28: Number "
                                      "of register threads should be less than or equal to "
                                      "128, got 256"},
  {"pinned_reserve_segment_size_mb:0", "key 'pinned_reserve_segment_size_mb' at offset 31: "
                                       "Pinned reserve segment size has to be greater than 0"},
  /* the offset is that of the bad token, after earlier valid pairs */
  {"expandable_segments:True, max_split_size_mb:5",
   "key 'max_split_size_mb' at offset 44: CachingAllocator option max_split_size_mb too "
   "small, must be >= 20"},
  /* a removed key of 2022 is unknown now */
  {"expandable_segments:True,roundup_bypass_threshold_mb:10",
   "key 'roundup_bypass_threshold_mb' at offset 25: unrecognized key, expected one of: "
   "max_split_size_mb, max_non_split_rounding_mb, large_segment_size_mb, "
   "roundup_power2_divisions, garbage_collection_threshold, per_process_memory_fraction, "
   "expandable_segments, release_lock_on_cudamalloc, graph_capture_record_stream_reuse, "
   "backend, pinned_use_cuda_host_register, pinned_num_register_threads, "
   "pinned_use_background_threads, pinned_reserve_segment_size_mb"},
  /* non-printable bytes are not echoed */
  {"expandable_segments:\x01\x7f", "key 'expandable_segments' at offset 20: expected 'True' "
                                   "or 'False', got '?" "?'"},
};

static void check_error_case(const struct err_case *p) {
  ms_alloc_config_t c, before;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, "expandable_segments:True,max_split_size_mb:64", NULL),
               MS_OK);
  memcpy(&before, &c, sizeof c);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_alloc_config_parse(&c, p->str, &eb), MS_ECONFIG, "'%s' was accepted", p->str);
  cr_assert_str_eq(eb.msg, p->msg, "'%s'", p->str);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "'%s' changed the config", p->str);
  /* a NULL errbuf is fine */
  cr_assert_eq(ms_alloc_config_parse(&c, p->str, NULL), MS_ECONFIG);
}

Test(config, errors) {
  for (size_t i = 0; i < sizeof error_cases / sizeof error_cases[0]; i++)
    check_error_case(&error_cases[i]);
}

Test(config, too_long_string_is_refused) {
  char *s = malloc(MS_ALLOC_CONF_MAX + 2);
  cr_assert_not_null(s);
  memset(s, ' ', MS_ALLOC_CONF_MAX + 1);
  s[MS_ALLOC_CONF_MAX + 1] = '\0';
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_alloc_config_parse(&c, s, &eb), MS_ECONFIG);
  cr_assert_str_eq(eb.msg, "at offset 1023: configuration string too long (1024 characters, "
                           "expected at most 1023)");
  s[MS_ALLOC_CONF_MAX] = '\0';
  cr_assert_eq(ms_alloc_config_parse(&c, s, &eb), MS_OK);
  free(s);
}

/* ---------------------------------------------------------------------------------------- */
/* Environment                                                                               */

Test(config, from_env) {
  ms_alloc_config_t c, before;
  ms_alloc_config_init(&c);
  c.expandable_segments = true;
  memcpy(&before, &c, sizeof c);
  ms_errbuf_t eb = {{0}};
  unsetenv("MEMSNAP_ALLOC_CONF");
  cr_assert_eq(ms_alloc_config_from_env(&c, &eb), MS_OK);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "an unset variable must change nothing");

  setenv("MEMSNAP_ALLOC_CONF", "max_split_size_mb:256,garbage_collection_threshold:0.8", 1);
  cr_assert_eq(ms_alloc_config_from_env(&c, &eb), MS_OK);
  cr_assert_eq(c.max_split_size, 256 * MiB);
  cr_assert_eq(c.garbage_collection_threshold, 0.8);
  cr_assert(c.expandable_segments);
  cr_assert_str_eq(c.last_allocator_settings,
                   "max_split_size_mb:256,garbage_collection_threshold:0.8");

  memcpy(&before, &c, sizeof c);
  setenv("MEMSNAP_ALLOC_CONF", "max_split_size_mb:256,expandable_segment:True", 1);
  cr_assert_eq(ms_alloc_config_from_env(&c, &eb), MS_ECONFIG);
  /* a typo gets a "did you mean" (issue #32 item 1) */
  cr_assert_eq(strncmp(eb.msg, "MEMSNAP_ALLOC_CONF: key 'expandable_segment' at offset 22: "
                               "unrecognized key; did you mean 'expandable_segments'? expected "
                               "one of: ",
                       strlen("MEMSNAP_ALLOC_CONF: key 'expandable_segment' at offset 22: "
                              "unrecognized key; did you mean 'expandable_segments'? expected "
                              "one of: ")),
               0, "%s", eb.msg);
  cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
  /* the PyTorch variable is not ours */
  unsetenv("MEMSNAP_ALLOC_CONF");
  setenv("PYTORCH_CUDA_ALLOC_CONF", "max_split_size_mb:512", 1);
  cr_assert_eq(ms_alloc_config_from_env(&c, &eb), MS_OK);
  cr_assert_eq(c.max_split_size, 256 * MiB);
  unsetenv("PYTORCH_CUDA_ALLOC_CONF");
}

/* ---------------------------------------------------------------------------------------- */
/* Canonical string                                                                          */

struct fmt_case {
  char in[320];
  char canonical[320];
};

static const struct fmt_case format_canonical_cases[] = {
  {"", ""},
  {"backend:native", ""},
  {"expandable_segments:False", ""},
  {"expandable_segments:True , max_split_size_mb:128",
   "max_split_size_mb:128,expandable_segments:True"},
  {"roundup_power2_divisions:[256:1,512:2,1024:4,>:8]",
   "roundup_power2_divisions:[1:1,2:1,4:1,8:1,16:1,32:1,64:1,128:1,256:1,512:2,1024:4,"
   "2048:8,4096:8,8192:8,16384:8,32768:8]"},
  {"roundup_power2_divisions:[1:4,>:4]", "roundup_power2_divisions:4"},
  {"garbage_collection_threshold:0.6,per_process_memory_fraction:0.1",
   "garbage_collection_threshold:0.6,per_process_memory_fraction:0.1"},
  {"large_segment_size_mb:32,max_non_split_rounding_mb:32", "large_segment_size_mb:32"},
  {"large_segment_size_mb:32,max_non_split_rounding_mb:64",
   "max_non_split_rounding_mb:64,large_segment_size_mb:32"},
  {"pinned_use_background_threads:True,pinned_num_register_threads:4,"
   "pinned_reserve_segment_size_mb:8,pinned_use_hip_host_register:True,"
   "release_lock_on_hipmalloc:True,graph_capture_record_stream_reuse:True",
   "release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True,"
   "pinned_use_cuda_host_register:True,pinned_num_register_threads:4,"
   "pinned_use_background_threads:True,pinned_reserve_segment_size_mb:8"},
};

static void check_format_canonical(const struct fmt_case *p) {
  ms_alloc_config_t c, back;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, p->in, NULL), MS_OK, "%s", p->in);
  char buf[1024];
  int n = ms_alloc_config_format(&c, buf, sizeof buf);
  cr_assert_geq(n, 0);
  cr_assert_str_eq(buf, p->canonical);
  cr_assert_eq((size_t)n, strlen(p->canonical));
  /* round trip: every field but the raw string */
  ms_alloc_config_init(&back);
  cr_assert_eq(ms_alloc_config_parse(&back, buf, NULL), MS_OK, "%s", buf);
  memcpy(back.last_allocator_settings, c.last_allocator_settings,
         sizeof c.last_allocator_settings);
  cr_assert_eq(memcmp(&back, &c, sizeof c), 0, "'%s' did not round-trip", buf);
}

Test(config, format_canonical) {
  for (size_t i = 0; i < sizeof format_canonical_cases / sizeof format_canonical_cases[0]; i++)
    check_format_canonical(&format_canonical_cases[i]);
}

Test(config, format_limits) {
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, "max_split_size_mb:128", NULL), MS_OK);
  char small[8] = "xyz";
  cr_assert_eq(ms_alloc_config_format(&c, small, sizeof small), MS_ELIMIT);
  cr_assert_str_eq(small, "");
  char buf[64];
  cr_assert_eq(ms_alloc_config_format(&c, buf, 21), MS_ELIMIT);
  cr_assert_eq(ms_alloc_config_format(&c, buf, 22), 21);
  cr_assert_str_eq(buf, "max_split_size_mb:128");
  c.max_split_size = 100 * MiB + 1; /* not a whole MiB */
  cr_assert_eq(ms_alloc_config_format(&c, buf, sizeof buf), MS_EINVAL);
  ms_alloc_config_init(&c);
  c.roundup_power2_divisions[3] = 3;
  cr_assert_eq(ms_alloc_config_format(&c, buf, sizeof buf), MS_EINVAL);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_alloc_config_validate(&c, &eb), MS_ECONFIG);
  cr_assert_str_eq(eb.msg, "roundup_power2_divisions[3] is 3, expected 0 or a power of 2");
  ms_alloc_config_init(&c);
  c.garbage_collection_threshold = 1.0;
  cr_assert_eq(ms_alloc_config_validate(&c, &eb), MS_ECONFIG);
  cr_assert_str_eq(eb.msg, "garbage_collection_threshold is 1, expected 0 (off) or in (0.0, 1.0)");
  ms_alloc_config_init(&c);
  c.max_split_size = 5 * MiB;
  cr_assert_eq(ms_alloc_config_validate(&c, &eb), MS_ECONFIG);
  cr_assert_str_eq(eb.msg, "max_split_size is 5242880 bytes, expected >= large_segment_size "
                           "(20971520)");
}

/* ---------------------------------------------------------------------------------------- */
/* Hostile strings                                                                           */

static void check_parse_is_all_or_nothing(const char *s) {
  ms_alloc_config_t c, before;
  ms_alloc_config_init(&c);
  c.expandable_segments = true;
  memcpy(&before, &c, sizeof c);
  ms_errbuf_t eb;
  memset(&eb, 0, sizeof eb);
  int rc = ms_alloc_config_parse(&c, s, &eb);
  if (rc == MS_OK) {
    cr_assert_eq(ms_alloc_config_validate(&c, NULL), MS_OK, "'%s' parsed to an invalid config", s);
    cr_assert_str_eq(c.last_allocator_settings, s);
  } else {
    cr_assert_eq(rc, MS_ECONFIG);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
    cr_assert_neq(eb.msg[0], '\0');
    cr_assert(strstr(eb.msg, "offset ") != NULL, "no offset in '%s'", eb.msg);
  }
}

Test(config, every_truncation) {
  static const char full[] =
      "max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,1024:4,>:8],"
      "garbage_collection_threshold:0.6,expandable_segments:True,backend:native,"
      "per_process_memory_fraction:0.5,large_segment_size_mb:32";
  char buf[sizeof full];
  for (size_t n = 0; n < sizeof full; n++) {
    memcpy(buf, full, n);
    buf[n] = '\0';
    check_parse_is_all_or_nothing(buf);
  }
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  cr_assert_eq(ms_alloc_config_parse(&c, full, NULL), MS_OK);
}

Test(config, random_strings) {
  static const char alphabet[] = "[]:,> \t01248.e-TrueFalsmx_spitzbackend";
  static const char *const words[] = {"max_split_size_mb", "roundup_power2_divisions",
                                      "expandable_segments", "True", "256", "0.5", "[", "]",
                                      ":", ",", ">", "garbage_collection_threshold", "\xff"};
  uint64_t x = 0x9e3779b97f4a7c15ull;
  char buf[256];
  for (int iter = 0; iter < 20000; iter++) {
    size_t n = 0, len;
    x ^= x << 13, x ^= x >> 7, x ^= x << 17;
    len = x % 80;
    while (n < len) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      if (x & 1) {
        const char *w = words[(x >> 1) % (sizeof words / sizeof words[0])];
        size_t wl = strlen(w);
        if (n + wl >= sizeof buf) break;
        memcpy(buf + n, w, wl);
        n += wl;
      } else {
        buf[n++] = alphabet[(x >> 1) % (sizeof alphabet - 1)];
      }
    }
    buf[n] = '\0';
    check_parse_is_all_or_nothing(buf);
  }
}

Test(config, deep_nesting_and_absurd_numbers) {
  char buf[MS_ALLOC_CONF_MAX + 1];
  size_t pre = strlen("roundup_power2_divisions:");
  memcpy(buf, "roundup_power2_divisions:", pre);
  memset(buf + pre, '[', sizeof buf - 1 - pre);
  buf[sizeof buf - 1] = '\0';
  check_parse_is_all_or_nothing(buf);
  check_parse_is_all_or_nothing("roundup_power2_divisions:[99999999999999999999999999:1]");
  check_parse_is_all_or_nothing("roundup_power2_divisions:[9223372036854775808:2]");
  check_parse_is_all_or_nothing("roundup_power2_divisions:[1:9223372036854775808]");
  check_parse_is_all_or_nothing("garbage_collection_threshold:1e-400");
  check_parse_is_all_or_nothing("pinned_reserve_segment_size_mb:99999999999999999999");
  check_parse_is_all_or_nothing("large_segment_size_mb:17592186044415");
  ms_alloc_config_t c;
  ms_alloc_config_init(&c);
  /* a huge but valid division count: rounding stays safe */
  cr_assert_eq(ms_alloc_config_parse(&c, "roundup_power2_divisions:9223372036854775808", NULL),
               MS_OK);
  cr_assert_eq(ms_alloc_round_size(&c, 5000000), 5000192);
}

/* ---------------------------------------------------------------------------------------- */
/* Options (lib/options.c; suite "options"). Each test runs in its own process, so every
 * option is still unread when a test sets the environment.                                  */

#include "memsnap/options.h"

static char options_log[4][256];
static int options_nlog;

static void options_capture(const char *msg, void *arg) {
  (void)arg;
  if (options_nlog < 4) snprintf(options_log[options_nlog], sizeof options_log[0], "%s", msg);
  options_nlog++;
}

Test(options, defaults_and_names) {
  unsetenv("MS_VERBOSE");
  unsetenv("MS_TRACE_ERRORS");
  unsetenv("MS_REUSE_MEMORY");
  cr_assert_eq(ms_option_get(MS_OPTION_VERBOSE), 0);
  cr_assert(!ms_option_is_enabled(MS_OPTION_TRACE_ERRORS));
  cr_assert(!ms_option_is_enabled(MS_OPTION_REUSE_MEMORY)); /* off for programs that embed it */
  cr_assert_str_eq(ms_option_name(MS_OPTION_VERBOSE), "verbose");
  cr_assert_str_eq(ms_option_name(MS_OPTION_TRACE_ERRORS), "trace_errors");
  cr_assert_str_eq(ms_option_name(MS_OPTION_REUSE_MEMORY), "reuse_memory");
  cr_assert_null(ms_option_name(MS_OPTION_LAST));
  cr_assert_eq(ms_option_get(MS_OPTION_LAST), 0);
  ms_option_set(MS_OPTION_LAST, 1); /* ignored */
}

struct bool_case {
  char text[16];
  int64_t value; /* -1: invalid, the default (0) is kept with a warning */
};

/* Parameterized: each case runs in a new process, where MS_VERBOSE is still unread. */
ParameterizedTestParameters(options, booleans_from_the_environment) {
  static struct bool_case cases[] = {
      {"1", 1},     {"TRUE", 1}, {"yes", 1}, {"On", 1}, {" on\t", 1}, {"0", 0},
      {"false", 0}, {"NO", 0},   {"off", 0}, {"2", -1}, {"", -1},     {"enable", -1},
  };
  return cr_make_param_array(struct bool_case, cases, sizeof cases / sizeof cases[0]);
}

ParameterizedTest(struct bool_case *p, options, booleans_from_the_environment) {
  options_nlog = 0;
  ms_set_output(options_capture, NULL);
  setenv("MS_VERBOSE", p->text, 1);
  int64_t v = ms_option_get(MS_OPTION_VERBOSE);
  ms_set_output(NULL, NULL);
  if (p->value >= 0) {
    cr_assert_eq(v, p->value, "MS_VERBOSE='%s'", p->text);
    cr_assert_eq(options_nlog, 0);
  } else {
    cr_assert_eq(v, 0, "MS_VERBOSE='%s'", p->text);
    cr_assert_eq(options_nlog, 1);
    char expect[256];
    snprintf(expect, sizeof expect,
             "memsnap: warning: environment option MS_VERBOSE has an invalid value '%s' "
             "(expected 1/TRUE/YES/ON or 0/FALSE/NO/OFF), keeping 0",
             p->text);
    cr_assert_str_eq(options_log[0], expect);
  }
}

Test(options, read_once_then_set) {
  setenv("MS_TRACE_ERRORS", "Yes", 1);
  cr_assert_eq(ms_option_get(MS_OPTION_TRACE_ERRORS), 1);
  /* read once: a later change of the environment is not seen */
  setenv("MS_TRACE_ERRORS", "0", 1);
  cr_assert_eq(ms_option_get(MS_OPTION_TRACE_ERRORS), 1);
  ms_option_set(MS_OPTION_TRACE_ERRORS, 0);
  cr_assert_eq(ms_option_get(MS_OPTION_TRACE_ERRORS), 0);
  ms_option_set_default(MS_OPTION_TRACE_ERRORS, 1); /* too late: no effect */
  cr_assert_eq(ms_option_get(MS_OPTION_TRACE_ERRORS), 0);
  unsetenv("MS_TRACE_ERRORS");
}

Test(options, set_default_before_first_read) {
  unsetenv("MS_VERBOSE");
  ms_option_set_default(MS_OPTION_VERBOSE, 1);
  cr_assert_eq(ms_option_get(MS_OPTION_VERBOSE), 1);
}

Test(options, environment_beats_the_default) {
  setenv("MS_VERBOSE", "off", 1);
  ms_option_set_default(MS_OPTION_VERBOSE, 1);
  cr_assert_eq(ms_option_get(MS_OPTION_VERBOSE), 0);
  unsetenv("MS_VERBOSE");
}

Test(options, print_only_in_verbose_mode) {
  unsetenv("MS_VERBOSE");
  unsetenv("MS_TRACE_ERRORS");
  unsetenv("MS_REUSE_MEMORY");
  options_nlog = 0;
  ms_set_output(options_capture, NULL);
  ms_options_init();
  ms_options_print();
  cr_assert_eq(options_nlog, 0);
  ms_option_set(MS_OPTION_VERBOSE, 1);
  ms_options_print();
  ms_set_output(NULL, NULL);
  cr_assert_eq(options_nlog, 3);
  cr_assert_str_eq(options_log[0], "memsnap: option 'verbose': 1 (MS_VERBOSE)");
  cr_assert_str_eq(options_log[1], "memsnap: option 'trace_errors': 0 (MS_TRACE_ERRORS)");
  cr_assert_str_eq(options_log[2], "memsnap: option 'reuse_memory': 0 (MS_REUSE_MEMORY)");
}

/* ---- large arrays reused within the process (lib/common/bigmem.c) --------------------------- */

#include <pthread.h>
#include <sched.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/internal.h"
#include "common/vec.h"

#define BM_MIB ((size_t)1 << 20)

/* Whether every page of [p, p + bytes) is mapped (mincore fails with ENOMEM on a hole). */
static bool bm_mapped(const void *p, size_t bytes) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uintptr_t a = (uintptr_t)p & ~(uintptr_t)(pg - 1);
  size_t len = ((uintptr_t)p + bytes - a + pg - 1) & ~(pg - 1);
  unsigned char *vec = malloc(len / pg);
  cr_assert_not_null(vec);
  int rc = mincore((void *)a, len, vec);
  free(vec);
  return rc == 0;
}

static bool bm_all(const unsigned char *p, size_t n, unsigned char v) {
  for (size_t i = 0; i < n; i++)
    if (p[i] != v) return false;
  return true;
}

Test(bigmem, reuse_on_hands_freed_pages_to_the_next_arrays) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(8 * BM_MIB);
  cr_assert_not_null(a);
  memset(a, 0xab, 8 * BM_MIB);
  ms__big_free(a);
  cr_assert(bm_mapped(a, 8 * BM_MIB), "kept, not given back");
  /* the smallest kept range that fits, its head: the same address */
  unsigned char *b = ms__big_malloc(4 * BM_MIB);
  cr_assert_eq(b, a);
  cr_assert(bm_all(b, 4 * BM_MIB, 0xab), "malloc: the old bytes are still there");
  /* its tail, zeroed because calloc was asked for */
  unsigned char *c = ms__big_calloc(BM_MIB, 3);
  cr_assert(c > b && c < a + 8 * BM_MIB, "%p from the tail of %p", (void *)c, (void *)a);
  cr_assert(bm_all(c, 3 * BM_MIB, 0), "calloc on reused pages reads zeros");
  ms__big_free(b);
  ms__big_free(c);
}

Test(bigmem, reuse_on_grows_a_smaller_kept_range_and_zeroes_it_for_calloc) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(2 * BM_MIB);
  memset(a, 0xff, 2 * BM_MIB);
  ms__big_free(a);
  unsigned char *b = ms__big_calloc(16, BM_MIB); /* no kept range fits: the largest, grown */
  cr_assert_not_null(b);
  cr_assert(bm_all(b, 16 * BM_MIB, 0));
  memset(b, 0x11, 16 * BM_MIB);
  ms__big_free(b);
}

/* A freed array written only in places (the pickle reader's memo of values, whose containers
 * are kept apart) is kept as its written pieces: runs of 2 MiB or more never touched are given
 * back, so that the next arrays take resident pages rather than fresh ones among the kept. */
Test(bigmem, reuse_on_gives_back_the_long_runs_a_freed_array_never_touched) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(64 * BM_MIB);
  cr_assert_not_null(a);
  memset(a, 3, BM_MIB);
  memset(a + 2 * BM_MIB, 3, BM_MIB);
  memset(a + 32 * BM_MIB, 3, BM_MIB);
  memset(a + 63 * BM_MIB, 3, BM_MIB);
  ms__big_free(a);
  cr_assert(bm_mapped(a, 3 * BM_MIB), "the first piece, its short gap with it, kept");
  cr_assert(bm_mapped(a + 32 * BM_MIB, BM_MIB), "a piece between two gaps kept");
  cr_assert(bm_mapped(a + 63 * BM_MIB, BM_MIB), "the last piece kept");
  /* (huge pages may make up to 2 MiB around a written piece resident) */
  cr_assert(!bm_mapped(a + 8 * BM_MIB, 16 * BM_MIB), "a long run never touched given back");
  cr_assert(!bm_mapped(a + 40 * BM_MIB, 16 * BM_MIB), "a long run never touched given back");
  /* the pieces serve the next arrays as kept ranges do */
  unsigned char *b = ms__big_calloc(24, BM_MIB);
  cr_assert_not_null(b);
  cr_assert(bm_all(b, 24 * BM_MIB, 0));
  memset(b, 4, 24 * BM_MIB);
  ms__big_free(b);
}

Test(bigmem, reuse_off_gives_pages_back_at_once_and_turning_it_off_trims) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 0);
  unsigned char *a = ms__big_malloc(8 * BM_MIB);
  memset(a, 1, 8 * BM_MIB);
  ms__big_free(a);
  cr_assert(!bm_mapped(a, 8 * BM_MIB), "given back");
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *k[3];
  for (int i = 0; i < 3; i++) {
    k[i] = ms__big_malloc((size_t)(i + 2) * BM_MIB);
    memset(k[i], 2, (size_t)(i + 2) * BM_MIB);
  }
  for (int i = 0; i < 3; i++) ms__big_free(k[i]);
  for (int i = 0; i < 3; i++) cr_assert(bm_mapped(k[i], (size_t)(i + 2) * BM_MIB));
  ms_option_set(MS_OPTION_REUSE_MEMORY, 0);
  unsigned char *b = ms__big_calloc(BM_MIB, 6); /* the next large allocation trims */
  for (int i = 0; i < 3; i++)
    cr_assert(!bm_mapped(k[i], (size_t)(i + 2) * BM_MIB) || (k[i] >= b && k[i] < b + 6 * BM_MIB),
              "kept range %d given back", i);
  cr_assert(bm_all(b, 6 * BM_MIB, 0));
  ms__big_free(b);
}

/* Resident bytes of this process (/proc/self/statm), 0 when unknown. */
static size_t bm_resident(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  unsigned long size = 0, res = 0;
  if (!f) return 0;
  int n = fscanf(f, "%lu %lu", &size, &res);
  fclose(f);
  return n == 2 ? (size_t)res * (size_t)sysconf(_SC_PAGESIZE) : 0;
}

/* Twelve "files" read one after another, each a vector grown by doubling to 32 MiB and an array
 * of 16 MiB, every page touched, then freed: what is kept and what is in use stay within the
 * most ever in use, 48 MiB (issue #31 item 6: the kept ranges of each file stayed while the
 * next file's vector grew beside them, and 12 ranks of 1 GB held 4.4 GB). */
Test(bigmem, reuse_on_holds_one_working_set_however_many_files) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  size_t before = bm_resident(), most = 0;
  if (!before) return; /* no /proc */
  for (int f = 0; f < 12; f++) {
    unsigned char *v = NULL;
    size_t cap = 0;
    for (size_t len = 0; len < 32 * BM_MIB; len += BM_MIB) {
      cr_assert_eq(ms__big_vec_reserve((void **)&v, &cap, len, BM_MIB, 1), 0);
      memset(v + len, f, BM_MIB);
    }
    unsigned char *a = ms__big_malloc(16 * BM_MIB);
    cr_assert_not_null(a);
    memset(a, f, 16 * BM_MIB);
    size_t now = bm_resident();
    if (now > most) most = now;
    ms__big_free(v);
    ms__big_free(a);
  }
  size_t grown = most > before ? most - before : 0;
  cr_assert_leq(grown, 60 * BM_MIB, "resident grew by %zu MiB over 12 files of 48 MiB",
                grown / BM_MIB);
}

Test(bigmem, realloc_keeps_contents_across_kinds_and_sizes) {
  for (int reuse = 0; reuse < 2; reuse++) {
    ms_option_set(MS_OPTION_REUSE_MEMORY, reuse);
    uint32_t *v = NULL;
    size_t sizes[] = {100, 4096, (1u << 18) - 16, 1u << 18, 3u << 20, 1u << 16, 5u << 20, 7};
    size_t have = 0; /* elements written */
    for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++) {
      uint32_t *n = ms__big_realloc(v, sizes[k] * sizeof *v);
      cr_assert_not_null(n, "reuse %d size %zu", reuse, sizes[k]);
      v = n;
      size_t keep = have < sizes[k] ? have : sizes[k];
      for (size_t i = 0; i < keep; i++)
        cr_assert_eq(v[i], (uint32_t)(i * 2654435761u), "reuse %d size %zu at %zu", reuse,
                     sizes[k], i);
      for (size_t i = keep; i < sizes[k]; i++) v[i] = (uint32_t)(i * 2654435761u);
      have = sizes[k];
    }
    ms__big_free(v);
    MS_VEC(uint64_t) w = {0};
    for (uint64_t i = 0; i < (1u << 19); i++) {
      cr_assert_eq(ms__big_vec_reserve((void **)&w.ptr, &w.cap, w.len, 1, sizeof *w.ptr), 0);
      w.ptr[w.len++] = i ^ 0x5555;
    }
    for (uint64_t i = 0; i < w.len; i += 997) cr_assert_eq(w.ptr[i], i ^ 0x5555);
    cr_assert_eq(ms__big_vec_reserve((void **)&w.ptr, &w.cap, w.len, SIZE_MAX / 4, 8), -1);
    cr_assert_eq(w.len, 1u << 19, "unchanged on failure");
    ms__big_free(w.ptr);
    cr_assert_null(ms__big_calloc(SIZE_MAX / 2, 4), "overflow");
    cr_assert_null(ms__big_malloc(SIZE_MAX - 8));
    ms__big_free(NULL);
  }
}

#ifdef MADV_NOHUGEPAGE
/* Only the resident part of a mapping is kept: past its last touched page, its pages go back
 * (kept, they would be fresh pages for the next array, counted as if they were not). */
Test(bigmem, reuse_on_keeps_only_the_pages_an_array_touched) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(16 * BM_MIB);
  cr_assert_not_null(a);
  cr_assert_eq(madvise(a - 64, 16 * BM_MIB, MADV_NOHUGEPAGE), 0); /* 4 KiB pages: exact */
  memset(a, 1, 4 * BM_MIB + 64);
  ms__big_free(a);
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  cr_assert(bm_mapped(a, 4 * BM_MIB + 64), "the touched part, kept");
  cr_assert(!bm_mapped(a + 4 * BM_MIB + pg, pg), "past it, given back");
}
#endif

/* Pieces of one kept range, given back, are one range again: an array of the whole size takes
 * it at the same address. */
Test(bigmem, reuse_on_joins_the_pieces_of_a_kept_range) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(8 * BM_MIB);
  cr_assert_not_null(a);
  memset(a, 1, 8 * BM_MIB);
  ms__big_free(a);
  unsigned char *p[4];
  for (int i = 0; i < 4; i++) {
    p[i] = ms__big_malloc(2 * BM_MIB - 64); /* mappings of 2 MiB exactly, header included */
    cr_assert_eq(p[i], a + (size_t)i * 2 * BM_MIB, "piece %d from the kept range, in order", i);
  }
  int order[4] = {2, 0, 3, 1};
  for (int i = 0; i < 4; i++) ms__big_free(p[order[i]]);
  unsigned char *b = ms__big_malloc(8 * BM_MIB);
  cr_assert_eq(b, a, "the joined range");
  cr_assert(bm_all(b, 2 * BM_MIB - 64, 1), "its pages, not new ones (up to the next header)");
  ms__big_free(b);
}

/* A vector grows into the kept range that follows it, in place, without new pages; when none
 * follows, it moves (mremap) and its new part takes the pages of a kept range, not new ones. */
Test(bigmem, reuse_on_grows_into_kept_pages) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(16 * BM_MIB);
  cr_assert_not_null(a);
  memset(a, 7, 16 * BM_MIB);
  ms__big_free(a);
  size_t pg = (size_t)sysconf(_SC_PAGESIZE); /* a mapping: the array, its header, a page's end */
  unsigned char *v = ms__big_malloc(2 * BM_MIB);
  cr_assert_eq(v, a, "the kept range's head");
  memset(v, 3, 2 * BM_MIB);
  unsigned char *w = ms__big_realloc(v, 8 * BM_MIB);
  cr_assert_eq(w, v, "in place");
  cr_assert(bm_all(w, 2 * BM_MIB, 3), "its bytes");
  cr_assert(bm_all(w + 2 * BM_MIB, 6 * BM_MIB, 7), "the kept pages that followed it");
  unsigned char *x = ms__big_malloc(4 * BM_MIB); /* the next piece: w can no longer grow there */
  cr_assert_eq(x, a + 8 * BM_MIB + pg, "right after w");
  unsigned char *k = ms__big_malloc(32 * BM_MIB); /* the largest kept range once freed */
  cr_assert_not_null(k);
  memset(k, 9, 32 * BM_MIB);
  ms__big_free(k);
  memset(w, 5, 8 * BM_MIB);
  unsigned char *y = ms__big_realloc(w, 12 * BM_MIB);
  cr_assert_not_null(y);
  cr_assert(bm_all(y, 8 * BM_MIB, 5), "its bytes, moved");
  /* its mapping's new part begins at y - 64 + 8 MiB + a page: k's mapping (header, then 9s) */
  cr_assert(bm_all(y + 8 * BM_MIB + pg, 4 * BM_MIB - pg, 9), "the kept range's pages");
  cr_assert(!bm_mapped(k + BM_MIB, 1), "moved away from where k was kept");
  ms__big_free(x);
  ms__big_free(y);
}

#ifdef MADV_NOHUGEPAGE
/* A kept range joined from pieces of two of the kernel's mappings (here: one piece advised apart,
 * so that the kernel splits the mapping), which mremap cannot grow: the array moves into a new
 * mapping, its bytes copied. */
Test(bigmem, reuse_on_grows_an_array_that_spans_two_mappings) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *a = ms__big_malloc(8 * BM_MIB - 64);
  cr_assert_not_null(a);
  memset(a, 1, 8 * BM_MIB - 64);
  ms__big_free(a);
  unsigned char *head = ms__big_malloc(2 * BM_MIB - 64);
  cr_assert_eq(head, a);
  cr_assert_eq(madvise(head - 64, 2 * BM_MIB, MADV_NOHUGEPAGE), 0);
  ms__big_free(head);
  uint32_t *v = ms__big_malloc(8 * BM_MIB - 64); /* the joined range: two mappings */
  cr_assert_eq((void *)v, (void *)a);
  size_t n = (8 * BM_MIB - 64) / sizeof *v;
  for (size_t i = 0; i < n; i++) v[i] = (uint32_t)i * 2654435761u;
  uint32_t *w = ms__big_realloc(v, 64 * BM_MIB);
  cr_assert_not_null(w);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(w[i], (uint32_t)i * 2654435761u, "at %zu", i);
  memset(w + n, 0, 64 * BM_MIB - n * sizeof *v);
  ms__big_free(w);
}
#endif

static void *bm_thread(void *arg) {
  unsigned seed = (unsigned)(uintptr_t)arg;
  for (int it = 0; it < 200; it++) {
    seed = seed * 1103515245u + 12345u;
    size_t n = BM_MIB + (seed >> 8) % (6 * BM_MIB);
    unsigned char tag = (unsigned char)(seed >> 3);
    unsigned char *p = (it & 1) ? ms__big_calloc(n, 1) : ms__big_malloc(n);
    if (!p) return (void *)1;
    if ((it & 1) && !bm_all(p, n, 0)) return (void *)2;
    memset(p, tag, n);
    sched_yield();
    if (!bm_all(p, n, tag)) return (void *)3; /* nobody else was handed these pages */
    ms__big_free(p);
  }
  return NULL;
}

Test(bigmem, threads_never_share_an_array) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  pthread_t t[4];
  for (uintptr_t i = 0; i < 4; i++)
    cr_assert_eq(pthread_create(&t[i], NULL, bm_thread, (void *)(i + 1)), 0);
  for (int i = 0; i < 4; i++) {
    void *r;
    pthread_join(t[i], &r);
    cr_assert_null(r, "thread %d: failure %p", i, r);
  }
}

/* A child of fork while another thread allocates and frees large arrays, the lock perhaps held at
 * the fork: the child's own arrays never wait on it (a hung child is ended by its alarm). */
#include <signal.h>
#include <stdatomic.h>
#include <sys/wait.h>

static atomic_bool bm_stop;

static void *bm_churn(void *arg) {
  (void)arg;
  while (!atomic_load(&bm_stop)) {
    void *p = ms__big_malloc(2 * BM_MIB);
    ms__big_free(p);
  }
  return NULL;
}

Test(bigmem, a_child_of_fork_never_waits_on_the_parents_lock, .timeout = 120) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  atomic_store(&bm_stop, false);
  pthread_t t;
  cr_assert_eq(pthread_create(&t, NULL, bm_churn, NULL), 0);
  for (int i = 0; i < 300; i++) {
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
      alarm(10);
      void *p = ms__big_malloc(2 * BM_MIB);
      ms__big_free(p);
      _exit(p ? 0 : 1);
    }
    int st = 0;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "child %d: status 0x%x (hung: signal %d)", i,
              st, WIFSIGNALED(st) ? WTERMSIG(st) : 0);
  }
  atomic_store(&bm_stop, true);
  pthread_join(t, NULL);
}

/* A vector past 64 MiB grows by an eighth (growing moves its pages and copies nothing), so that
 * the room it does not use is small: a second file's vectors fill their new room with the
 * first's kept pages. */
Test(bigmem, a_large_vector_grows_by_an_eighth) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  unsigned char *v = NULL;
  size_t cap = 0;
  cr_assert_eq(ms__big_vec_reserve((void **)&v, &cap, 0, 40 * BM_MIB, 1), 0);
  cr_assert_eq(cap, 64 * BM_MIB, "doubling from 16 below 64 MiB: %zu", cap);
  cr_assert_eq(ms__big_vec_reserve((void **)&v, &cap, 64 * BM_MIB, 1, 1), 0);
  cr_assert_eq(cap, 72 * BM_MIB, "an eighth more: %zu", cap);
  cr_assert_eq(ms__big_vec_reserve((void **)&v, &cap, 72 * BM_MIB, 20 * BM_MIB, 1), 0);
  cr_assert_eq(cap, 92 * BM_MIB, "what is needed when that is more: %zu", cap);
  v[0] = 1;
  v[92 * BM_MIB - 1] = 2;
  ms__big_free(v);
}

/* A sparse array (the pickle reader's memo of values) grows into untouched pages: the kept
 * resident ones stay kept for the arrays that write every page. */
Test(bigmem, reuse_on_a_sparse_array_leaves_the_kept_pages_kept) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  /* the most ever in use, 96 MiB, leaves room for the kept range beside the sparse array
   * (kept and in use together stay within it: reuse_on_holds_one_working_set...) */
  unsigned char *a = ms__big_malloc(32 * BM_MIB), *other = ms__big_malloc(64 * BM_MIB);
  cr_assert_not_null(a);
  cr_assert_not_null(other);
  memset(a, 5, 32 * BM_MIB);
  ms__big_free(a);
  ms__big_free(other); /* never touched: given back */
  cr_assert(bm_mapped(a, 32 * BM_MIB), "kept");
  unsigned char *v = NULL;
  size_t cap = 0;
  cr_assert_eq(ms__big_vec_reserve((void **)&v, &cap, 0, 1, 1), 0);
  ms__big_sparse(v);
  for (size_t len = 1; len < 24 * BM_MIB; len += BM_MIB) { /* (len: the bytes in use) */
    cr_assert_eq(ms__big_vec_reserve((void **)&v, &cap, len, BM_MIB, 1), 0);
    v[len + BM_MIB - 1] = 7; /* one byte a MiB */
  }
  cr_assert(v + cap <= a || v >= a + 32 * BM_MIB, "the sparse array is not in the kept range");
  cr_assert(bm_mapped(a, 32 * BM_MIB), "the kept range is still kept, whole");
  for (size_t len = 1; len < 24 * BM_MIB; len += BM_MIB) cr_assert_eq(v[len + BM_MIB - 1], 7);
  cr_assert_eq(v[BM_MIB + 4096], 0, "an untouched page reads zeros");
  unsigned char *b = ms__big_malloc(32 * BM_MIB); /* a dense array takes the kept pages */
  cr_assert_eq(b, a);
  cr_assert(bm_all(b, 32 * BM_MIB, 5));
  ms__big_free(b);
  ms__big_free(v);
}
