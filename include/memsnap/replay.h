/* SPDX-License-Identifier: MIT
 * memsnap: replaying a recorded allocator trace through memsnap's allocator (docs/replay.md,
 * "`--check`: what is compared, and the output").
 *
 * Two uses of one engine:
 *  - check: every device trace of a snapshot (PyTorch's pickle or ours) is replayed with the
 *    settings it was recorded with (allocator_settings), new segments placed at the recorded
 *    addresses, and every decision compared with the recorded one: each new segment (size and
 *    address) or mapped range, each block address, each release burst (contents and order), and
 *    at the end each segment's block list. Traces that began mid-run get their start state rebuilt
 *    from the final snapshot (block sizes inferred where the snapshot cannot say, some of them
 *    ambiguous). The verdict is PASS, FAIL (first mismatch), INCONCLUSIVE (first mismatch next to
 *    an ambiguous inferred block) or UNREPLAYABLE (with the reason).
 *  - what-if: the same allocation stream (allocs, frees, empty_cache bursts) replayed under
 *    another configuration and device capacity on the simulated device, with freshly chosen
 *    addresses, measuring peak reserved and allocated memory, fragmentation at the peak, device
 *    allocations and frees, retries and OOMs.
 *
 * Vocabulary: "entry" = an index into ms_snapshot_t.trace (all devices); a device's entries are
 * devices[d].first_trace ..+ ntrace.
 *
 * Thread-safety: the functions read the snapshot only; any number of replays of the same
 * snapshot may run concurrently. Results are plain data owned by the caller.
 */
#ifndef MEMSNAP_REPLAY_H
#define MEMSNAP_REPLAY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

MS_EXTERN_C_BEGIN

typedef enum ms_replay_verdict {
  MS_REPLAY_PASS = 0,         /* every decision reproduced */
  MS_REPLAY_FAIL,             /* a decision differs (see mismatch_entry, expected, actual) */
  MS_REPLAY_INCONCLUSIVE,     /* the first mismatch touches an ambiguous inferred start block */
  MS_REPLAY_UNREPLAYABLE,     /* the trace cannot be replayed (see reason) */
} ms_replay_verdict;

/* @return "PASS", "FAIL", "INCONCLUSIVE" or "UNREPLAYABLE". */
MS_API const char *ms_replay_verdict_name(ms_replay_verdict v);

/* What a run used, as measured on the replayed allocator (or, for `recorded`, on the check
 * replay that reproduces the recorded run). Bytes unless stated. */
typedef struct ms_replay_usage_s {
  bool valid;               /* false when it could not be measured (e.g. the check failed) */
  /* Entry indexes are in the device's own trace; -1 = the start state (before entry 0). */
  uint64_t peak_reserved;   /* highest reserved (segments + mapped pages) */
  int64_t peak_reserved_index;  /* the entry that first reached it */
  uint64_t peak_allocated;  /* highest allocated (rounded sizes; a block stops counting at its
                             * free_requested, as PyTorch's allocated_bytes) */
  int64_t peak_allocated_index;
  uint64_t peak_requested;  /* highest requested (unrounded sizes of allocated blocks) */
  int64_t peak_requested_index;
  uint64_t unallocated_at_peak_reserved; /* reserved - allocated right after the entry that
                                          * first reached peak_reserved */
  uint64_t device_mallocs;  /* device mallocs and expandable maps during the trace */
  uint64_t device_frees;    /* device frees and non-empty expandable unmaps during the trace
                             * (the start state's segments are not counted as mallocs) */
  uint64_t alloc_retries;   /* mallocs retried after releasing every cached segment */
  uint64_t ooms;            /* out-of-memory errors */
  uint64_t final_reserved;  /* reserved after the last entry */
  uint64_t final_allocated; /* allocated after the last entry */
  uint64_t start_reserved;  /* reserved by the recorded start state (0 = the trace began empty) */
  uint64_t start_short;     /* > 0: the start state does not fit the capacity by this many bytes
                             * (what-if: nothing was replayed) */
  int64_t first_oom_index;  /* the entry where the first OOM happened, -1 if none */
  uint64_t first_oom_size;  /* its requested size */
  char oom_message[640];    /* the allocator's OOM message for it ("" if none) */
} ms_replay_usage_t;

/* The result for one device trace. */
typedef struct ms_replay_device_s {
  int device;
  ms_replay_verdict verdict;
  char reason[256];          /* UNREPLAYABLE: why; FAIL/INCONCLUSIVE: the mismatch in one line */
  size_t entries;            /* trace entries of the device */
  size_t allocs;             /* alloc entries replayed */
  size_t events;             /* trace entries replayed (for the events/s benchmark) */
  bool mid_run;              /* the trace began after segments existed */
  size_t start_segments;     /* segments rebuilt at the start */
  size_t start_blocks;       /* allocated or pending blocks rebuilt at the start */
  size_t inferred;           /* start blocks whose size was inferred */
  size_t ambiguous;          /* ... of which the inference stayed ambiguous */
  int64_t mismatch_entry;    /* entry of the first mismatch; -1 = the final layout or none */
  char expected[256];        /* what PyTorch (the trace / the snapshot) did */
  char actual[256];          /* what memsnap did */
  ms_replay_usage_t recorded; /* the run as recorded (what-if only) */
  ms_replay_usage_t replayed; /* the run under the what-if configuration (what-if only) */
  /* What-if: the device capacity the replay ran on (0 = unlimited), and whether it is the
   * device's size recorded in the snapshot (no capacity given, ms_replay_options_t.
   * recorded_capacity) rather than the options' capacity. */
  uint64_t capacity;
  bool capacity_recorded;
  /* What-if: where `capacity` came from: MS_CAPACITY_GIVEN (the options' capacity, 0 =
   * unlimited as asked), MS_CAPACITY_RECORDED (capacity_recorded), MS_CAPACITY_INFERRED (from the
   * OOM in capacity_oom: reserved there + its device_free), MS_CAPACITY_UNKNOWN (unlimited
   * because nothing tells the size). */
  ms_capacity_source capacity_source;
  ms_tl_oom_t capacity_oom;
  /* The `oom` entries of the device's trace: the OOMs of the recorded run. */
  size_t recorded_ooms;
} ms_replay_device_t;

typedef struct ms_replay_report_s {
  size_t ndevices;
  ms_replay_device_t *devices; /* one per device trace of the snapshot */
} ms_replay_report_t;

typedef struct ms_replay_options_s {
  /* false: fidelity check; true: what-if. */
  bool whatif;
  /* What-if: a MEMSNAP_ALLOC_CONF string applied on top of the trace's own settings (with the
   * parser's resets), e.g. "expandable_segments:True"; NULL or "" = the trace's settings. */
  const char *config;
  /* Device capacity in bytes; 0 = unlimited. Check: OOM-path release bursts are then predicted
   * by the allocator instead of being taken from the trace. What-if: the simulated device's
   * size. */
  size_t capacity;
  /* Only this device (-1 = every device). */
  int device;
  /* What-if with capacity 0: a device whose size the snapshot records (MS_DEV_HAS_CAPACITY:
   * memsnap's snapshots, OOM snapshots included) is replayed on that size, as the run was;
   * false: unlimited. Check ignores it (it takes the recorded failures from the trace). */
  bool recorded_capacity;
  /* What-if with capacity 0 and no recorded size: a device whose trace has an `oom` entry that
   * carries device_free is replayed on the capacity it implies (ms_snapshot_capacity: reserved at
   * that entry + device_free), as the run had it; false: unlimited. */
  bool inferred_capacity;
  /* What-if: replay from a fresh allocator rather than the recorded pool. A trace that began
   * mid-run starts with the segments the pool had then, free gaps and whole cached segments
   * included, so its reserved figures depend on the pool's history before recording began (two
   * runs of the same work can differ by gigabytes). With fresh_start the start state's live
   * blocks are allocated anew through the configured allocator (requested sizes, address order)
   * and nothing else is carried over: the figures then depend only on the live memory and the
   * trace (`memsnap check --replay`, docs/compare.md). A start state that does not fit the
   * capacity sets replayed.start_short and replays nothing. Default false. */
  bool fresh_start;
  /* What-if: devices prepared once (ms_replay_prepare), indexed by device, `nprepared` of them:
   * a device with a preparation (of this snapshot) skips its own, and its check replay. A caller
   * that replays one trace under several settings prepares it once. NULL (the default): every
   * device is prepared here. Check ignores it. */
  const struct ms_replay_prepared_s *const *prepared;
  size_t nprepared;
} ms_replay_options_t;

/* Fills *o with the defaults: check, no config, capacity 0 (what-if: the recorded size where
 * the snapshot has one, else the one its first OOM implies, else unlimited: recorded_capacity and
 * inferred_capacity true), every device. */
MS_API void ms_replay_options_init(ms_replay_options_t *o);

/* Replays every device trace of snap as *opt says (NULL = defaults).
 * @return MS_OK with *out (free with ms_replay_report_free) even when traces fail or are
 * unreplayable (their verdicts say so); MS_ECONFIG for a bad opt->config (eb names the key and
 * offset); MS_EINVAL; MS_ENOMEM. *out is untouched on failure. */
MS_API MS_NODISCARD int ms_replay_run(const ms_snapshot_t *snap, const ms_replay_options_t *opt,
                                      ms_replay_report_t **out, ms_errbuf_t *eb);

/* Frees a report. Accepts NULL. */
MS_API void ms_replay_report_free(ms_replay_report_t *r);

/* ---- one device prepared for many what-if replays -----------------------------------------------
 * A what-if starts by preparing its device: the start state rebuilt from the snapshot and the
 * check replay run, which classifies the trace's bursts for the what-if runs; ms_replay_run() and
 * ms_replay_min_capacity() do both at every call. A preparation does them once; it is only read
 * afterwards, so what-ifs and searches on it may run on several threads at once (explain's
 * remedies do). */
typedef struct ms_replay_prepared_s ms_replay_prepared_t;

/* Prepares device `device` of snap (which must outlive the preparation). A trace that cannot be
 * replayed is prepared too: its result says why (verdict MS_REPLAY_UNREPLAYABLE and reason), and
 * the calls below answer as ms_replay_run() and ms_replay_min_capacity() do then.
 * @return MS_OK; MS_EINVAL (no such device); MS_ENOMEM. *out is untouched on failure. */
MS_API MS_NODISCARD int ms_replay_prepare(const ms_snapshot_t *snap, int device,
                                          ms_replay_prepared_t **out, ms_errbuf_t *eb);

/* The preparation's result: the device, its start state, the check replay's verdict and the
 * recorded run's figures (`recorded`), as ms_replay_run() reports them before a what-if. */
MS_API const ms_replay_device_t *ms_replay_prepared_result(const ms_replay_prepared_t *p);

/* The what-if of *o (its config, capacity, recorded_capacity, inferred_capacity and fresh_start)
 * on the prepared device, into *out as ms_replay_run() fills that device of its report.
 * @return MS_OK; MS_ECONFIG for a bad o->config; MS_ENOMEM. */
MS_API MS_NODISCARD int ms_replay_prepared_whatif(const ms_replay_prepared_t *p,
                                                  const ms_replay_options_t *o,
                                                  ms_replay_device_t *out, ms_errbuf_t *eb);

/* ms_replay_min_capacity() of config on the prepared device. */
MS_API MS_NODISCARD int ms_replay_prepared_min_capacity(const ms_replay_prepared_t *p,
                                                        const char *config, size_t *out,
                                                        ms_errbuf_t *eb);

/* Frees a preparation. Accepts NULL. */
MS_API void ms_replay_prepared_free(ms_replay_prepared_t *p);

/* Finds the smallest device capacity (a multiple of 2 MiB) on which the what-if replay of
 * device's trace under config (as ms_replay_options_t.config) has no OOM, by a bisection that
 * tries 2 MiB under a fitting run's peak first (docs/replay.md, `--min-capacity`): on *out bytes
 * the replay has no OOM, on *out - 2 MiB it has one. The search is bounded by 1 TiB.
 * @return MS_OK; MS_ENOTFOUND when the trace is unreplayable or still OOMs at the bound;
 * MS_ECONFIG, MS_EINVAL, MS_ENOMEM. */
MS_API MS_NODISCARD int ms_replay_min_capacity(const ms_snapshot_t *snap, int device,
                                               const char *config, size_t *out,
                                               ms_errbuf_t *eb);

/* ---- the values of `memsnap replay`'s options --------------------------------------------------
 * Parsed here, not in the CLI, so that they are tested and fuzzed (tests/fuzz/fuzz_cli_values.c). */

/* Parses a device capacity as --capacity takes it: digits, an optional fraction (a point and
 * digits), then an optional binary unit K, M, G or T (any case; "iB" may follow) or a lone "B":
 * "24GiB", "8000M", "1.5G", "4k", "2TB", "123456789". Nothing else: no sign, blank, hexadecimal,
 * exponent, "inf" or "nan" ("0x10" is an error, not 16 bytes). A fraction of a byte is dropped.
 * @return MS_OK with *out >= 1; MS_EINVAL for text outside that grammar or a size under one byte
 * ("0", "0.1"); MS_ELIMIT for 2^64 bytes or more. eb (may be NULL) says what is wrong and where;
 * *out is untouched on failure. */
MS_API MS_NODISCARD int ms_replay_parse_capacity(const char *s, size_t *out, ms_errbuf_t *eb);

/* The configurations of a --sweep: one MEMSNAP_ALLOC_CONF string per combination. */
typedef struct ms_replay_sweep_s {
  size_t n;       /* number of combinations (1 to 256) */
  char **configs; /* "key:v1,key2:v3", the first key varying slowest */
} ms_replay_sweep_t;

/* Expands SPEC, `key=v1,v2,...;key2=v3,...` (at most 8 keys of at most 32 values each, at most
 * 1023 bytes, at most 256 combinations), into every combination. A value may be a bracketed list
 * holding commas (roundup_power2_divisions=[256:1,>:4],[>:8]); blanks before a key are skipped;
 * the values themselves are checked by ms_alloc_config_parse(), not here.
 * @return MS_OK with *out (free with ms_replay_sweep_release); MS_EINVAL (malformed: "expected
 * 'key=v1,v2;key2=v3,...'", "unbalanced brackets", "key 'K' appears twice ..."), MS_ELIMIT (too
 * long, too many keys, values or combinations), MS_ENOMEM; eb (may be NULL) says which. *out is
 * untouched on failure. */
MS_API MS_NODISCARD int ms_replay_sweep_parse(const char *spec, ms_replay_sweep_t *out,
                                              ms_errbuf_t *eb);
/* Frees what ms_replay_sweep_parse() gave and zeroes *s. Accepts NULL and a zeroed struct. */
MS_API void ms_replay_sweep_release(ms_replay_sweep_t *s);

MS_EXTERN_C_END

#endif /* MEMSNAP_REPLAY_H */
