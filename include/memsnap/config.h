/* SPDX-License-Identifier: MIT
 * memsnap: allocator configuration (MEMSNAP_ALLOC_CONF).
 *
 * The configuration of memsnap's caching allocator has the syntax and the keys of PyTorch's
 * PYTORCH_CUDA_ALLOC_CONF (docs/pytorch-allocator.md, "Configuration keys"): a comma-separated
 * list of `key:value` pairs, where a value is a token or a bracketed list `[k:v,k:v,>:v]`, e.g.
 *
 *   max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True
 *
 * ms_alloc_config_t is a plain struct in the caller's storage (no heap memory, freely copied):
 * ms_alloc_config_init() fills PyTorch's defaults, ms_alloc_config_parse() applies a string on top
 * (with PyTorch's re-parse resets, "Configuration keys"), ms_alloc_config_format() writes the
 * canonical string back. A bad string is an error that names the key, the character offset and what
 * was expected; an unknown key is an error too (docs/allocator.md, "Configuration", says why), and
 * a failed parse leaves the struct untouched.
 *
 * The size helpers (ms_alloc_round_size, ms_alloc_allocation_size) are the exact formulas of
 * "Sizes and rounding" that the allocator uses on every malloc.
 *
 * Thread-safety: every function here works on caller-owned data only; concurrent calls on
 * different structs (or read-only calls on the same struct) are safe.
 */
#ifndef MEMSNAP_CONFIG_H
#define MEMSNAP_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"

MS_EXTERN_C_BEGIN

/* Size classes, exact values of PyTorch's constants ("Sizes and rounding"). */
#define MS_MIN_BLOCK_SIZE ((size_t)512)        /* every size is a multiple of this (kMinBlockSize) */
#define MS_SMALL_SIZE ((size_t)1048576)        /* rounded size <= this: small pool (kSmallSize) */
#define MS_SMALL_BUFFER ((size_t)2097152)      /* segment size of small requests (kSmallBuffer) */
#define MS_LARGE_BUFFER ((size_t)20971520)     /* default large_segment_size (kLargeBuffer) */
#define MS_MIN_LARGE_ALLOC ((size_t)10485760)  /* below this (and > 1 MiB): one large segment */
#define MS_ROUND_LARGE ((size_t)2097152)       /* sizes >= 10 MiB round to this for the device */
#define MS_ROUNDUP_POWER2_INTERVALS 16         /* intervals [2^(20+i), 2^(21+i)), i = 0..15 */
#define MS_MIB ((size_t)1048576)

/* The name of the environment variable read by ms_alloc_config_from_env(). */
#define MS_ALLOC_CONF_ENV "MEMSNAP_ALLOC_CONF"

/* Longest configuration string accepted (bytes, without the NUL); longer ones are an error. */
#define MS_ALLOC_CONF_MAX 1023

/* The allocator configuration. Every field has PyTorch's meaning and default ("Configuration
 * keys"); sizes are in bytes here even where the key is in MiB. The memsnap allocator copies the
 * struct when it is created, so later changes to the caller's copy do not affect a running
 * allocator. */
typedef struct ms_alloc_config_s {
  /* Blocks of this size or larger are never split, and the oversize rules apply ("Best fit and the
   * oversize rules").
   * Bytes; key max_split_size_mb (MiB, >= large_segment_size_mb); default SIZE_MAX = unlimited. */
  size_t max_split_size;
  /* An oversize free block may serve a request >= max_split_size only if
   * block < request + this. Bytes; key max_non_split_rounding_mb (MiB, >= large_segment_size_mb);
   * default large_segment_size (20 MiB), and reset to it on every parse. */
  size_t max_non_split_rounding_size;
  /* Segment size for requests in (1 MiB, 10 MiB), and the page size of large-pool expandable
   * segments. Bytes; key large_segment_size_mb (MiB, > 10); default 20 MiB (MS_LARGE_BUFFER). */
  size_t large_segment_size;
  /* Fraction of the allowed memory above which cached blocks are garbage-collected ("Garbage
   * collection").
   * Key garbage_collection_threshold, in (0.0, 1.0); default 0.0 = off. */
  double garbage_collection_threshold;
  /* Power-of-two rounding divisions per interval [2^(20+i), 2^(21+i)) bytes ("Sizes and rounding"):
   * 0 or 1 = plain 512-byte rounding, else a power of two. Key roundup_power2_divisions, scalar or
   * list form; default all 0. */
  size_t roundup_power2_divisions[MS_ROUNDUP_POWER2_INTERVALS];
  /* Per-process memory fraction each device allocator starts with ("Memory fraction"): the
   * allocator may hold at most fraction * device total. Key per_process_memory_fraction,
   * in [0.0, 1.0]; default 1.0 = no limit. */
  double per_process_memory_fraction;
  /* Key expandable_segments (True/False); default false ("Expandable segments"). */
  bool expandable_segments;
  /* Drop the allocator's lock around the device allocation call. Key release_lock_on_cudamalloc
   * (alias release_lock_on_hipmalloc); default false. */
  bool release_lock_on_cudamalloc;
  /* Reuse blocks freed during graph capture once their stream events are done ("Private pools
   * and CUDA graphs").
   * Key graph_capture_record_stream_reuse; default false. */
  bool graph_capture_record_stream_reuse;
  /* Host (pinned) allocator keys, accepted and stored for fidelity; memsnap has no pinned host
   * allocator, so nothing reads them yet. */
  bool pinned_use_cuda_host_register;   /* key pinned_use_cuda_host_register (alias _hip_); false */
  bool pinned_use_background_threads;   /* key pinned_use_background_threads; false */
  size_t pinned_num_register_threads;   /* key pinned_num_register_threads, power of 2 <= 128; 1 */
  size_t pinned_reserve_segment_size;   /* bytes; key pinned_reserve_segment_size_mb (> 0); 0 */
  /* The raw string of the last successful parse ("" after init); PyTorch's
   * last_allocator_settings, exported in snapshots under "PYTORCH_CUDA_ALLOC_CONF". */
  char last_allocator_settings[MS_ALLOC_CONF_MAX + 1];
} ms_alloc_config_t;

/* Fills *c with PyTorch's defaults (every field as documented above, last_allocator_settings "").
 * pre: c != NULL. */
MS_API void ms_alloc_config_init(ms_alloc_config_t *c);

/* Applies the configuration string str on top of *c, as PyTorch's allocator-settings parse does:
 * max_split_size, roundup_power2_divisions, garbage_collection_threshold and
 * max_non_split_rounding_size are first reset to their defaults (the last one to the resulting
 * large_segment_size); every other field keeps its value unless str sets it. The empty string (or
 * whitespace only) is valid. The key backend accepts only "native": "cudaMallocAsync" is refused,
 * since memsnap implements the native allocator only.
 * pre: c != NULL, str != NULL; eb may be NULL.
 * @return MS_OK, or MS_ECONFIG with eb->msg naming the key, the 0-based character offset of the
 * offending token in str and what was expected, e.g.
 * "key 'max_split_size_mb' at offset 18: CachingAllocator option max_split_size_mb too small,
 * must be >= 20". On failure *c is left untouched. */
MS_API MS_NODISCARD int ms_alloc_config_parse(ms_alloc_config_t *c, const char *str,
                                              ms_errbuf_t *eb);

/* Parses the environment variable MEMSNAP_ALLOC_CONF (if set) with ms_alloc_config_parse();
 * when the variable is unset, *c is left as it is and MS_OK is returned. Errors are those of
 * ms_alloc_config_parse(), with eb->msg prefixed by "MEMSNAP_ALLOC_CONF: ".
 * Thread-safety: reads the environment (getenv); do not call concurrently with setenv. */
MS_API MS_NODISCARD int ms_alloc_config_from_env(ms_alloc_config_t *c, ms_errbuf_t *eb);

/* Writes the canonical configuration string of *c into dst (NUL-terminated): only the keys whose
 * value differs from ms_alloc_config_init()'s, in the order of the table in docs/allocator.md,
 * sizes in MiB, divisions as a scalar when all 16 are equal and else as the full list
 * "[1:d0,2:d1,4:d2,...,32768:d15]". The empty string means "all defaults". Parsing the result
 * into a freshly initialised struct gives back every field of *c (except last_allocator_settings).
 * @return the length written (without the NUL), MS_ELIMIT if cap is too small (dst then holds
 * ""), or MS_EINVAL if a field cannot be written as a key (a size that is not a whole number of
 * MiB, or a value outside its key's limits). */
MS_API int ms_alloc_config_format(const ms_alloc_config_t *c, char *dst, size_t cap);

/* Checks every field against the limits of its key (the ones ms_alloc_config_parse() enforces).
 * @return MS_OK or MS_ECONFIG with eb->msg naming the field. */
MS_API MS_NODISCARD int ms_alloc_config_validate(const ms_alloc_config_t *c, ms_errbuf_t *eb);

/* The divisions that apply to size: table entry clamp(floor(log2(size)) - 20, 0, 15) ("Sizes and
 * rounding"); sizes below 1 MiB (and 0) use entry 0. */
MS_API size_t ms_alloc_roundup_divisions_for(const ms_alloc_config_t *c, size_t size);

/* PyTorch's round_size: < 512 -> 512; with divisions d > 1 and size > 512*d, the next
 * 1/d step of size's power-of-two interval (a power of two stays as it is); else the next
 * multiple of 512. @return the rounded size, or 0 if it does not fit in size_t. */
MS_API size_t ms_alloc_round_size(const ms_alloc_config_t *c, size_t size);

/* PyTorch's get_allocation_size, the segment size requested from the device for a
 * rounded size: <= 1 MiB -> 2 MiB; < 10 MiB -> large_segment_size; else the next multiple of
 * 2 MiB. @return the segment size, or 0 if it does not fit in size_t. */
MS_API size_t ms_alloc_allocation_size(const ms_alloc_config_t *c, size_t rounded);

MS_EXTERN_C_END

#endif /* MEMSNAP_CONFIG_H */
