/* SPDX-License-Identifier: MIT
 * memsnap: what changed between two snapshots, or two moments of one, and a memory gate for CI
 * (docs/compare.md, issue #28).
 *
 * A comparison (ms_compare_run) reads two *sides*: a snapshot and a moment of one of its devices
 * (default: the peak of allocated memory; the end state when the device has no trace). For each
 * side: the peaks of allocated, reserved and requested bytes over the whole trace, and at the
 * moment the allocated, reserved and requested bytes, the segments and the live blocks. Then the
 * change in allocated bytes at the moments by source line and by category (memsnap/
 * attribution.h), largest change first; the allocator settings the two record, where they
 * differ; and leak suspects of the AFTER side: sources whose allocations made in step N
 * (`ProfilerStep#N` annotation ranges) are still alive at the end of AFTER's trace (or at its
 * moment, when one is given), by about the same amount in every step from the first such step
 * on.
 *
 * A gate (ms_gate_*) computes a snapshot's named *figures* (the replay's, docs/replay.md, and the
 * peak of each category) as recorded, or replayed through a fresh allocator (reproducible
 * reserved memory: ms_replay_options_t.fresh_start), and checks limits on them, absolute
 * ("peak_allocated<=20GiB") or relative to a baseline's figure ("peak_reserved<=+5%").
 *
 * Thread-safety: the functions read the snapshots only. Results are plain data owned by the
 * caller.
 */
#ifndef MEMSNAP_COMPARE_H
#define MEMSNAP_COMPARE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/attribution.h"
#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

MS_EXTERN_C_BEGIN

/* ---- comparison ------------------------------------------------------------------------------ */

typedef struct ms_compare_options_s {
  int device;             /* -1: each side's default (the viewer's: the longest trace) */
  bool has_moment[2];     /* BEFORE's and AFTER's moment given; else the peak of allocated */
  ms_tl_moment_t moment[2];
  size_t nrows;           /* rows kept by source (largest change first); 0 = all (default 20) */
  bool leaks;             /* look for leak suspects (default true) */
  double leak_tolerance;  /* a suspect's steps may differ from their median by this fraction
                             (default 0.25) */
} ms_compare_options_t;

MS_API void ms_compare_options_init(ms_compare_options_t *o);

typedef struct ms_compare_side_s {
  size_t device;
  bool has_trace;          /* the device has trace entries (else: the end state only) */
  size_t step;             /* the moment: the state after `step` entries (memsnap/timeline.h) */
  size_t nentries;         /* trace entries of the device */
  uint64_t peak_allocated, peak_reserved, peak_requested; /* over the whole trace */
  uint64_t allocated, reserved, requested;                 /* at the moment */
  size_t segments, blocks; /* at the moment: segments, live (allocated or pending-free) blocks */
  bool has_capacity;
  uint64_t capacity;       /* the device's size as the snapshot records it */
} ms_compare_side_t;

/* One row of the attribution: allocated bytes at each side's moment, grouped by key. */
typedef struct ms_compare_row_s {
  const char *key;         /* the source (or category name); owned by the comparison */
  uint64_t before, after;  /* allocated bytes */
  uint64_t blocks_before, blocks_after;
  int64_t change;          /* after - before */
  ms_category category;    /* by source: the category of most bytes (AFTER's, else BEFORE's) */
} ms_compare_row_t;

/* One allocator setting that differs ("" = not recorded by that side). */
typedef struct ms_compare_setting_s {
  const char *key;
  const char *before, *after;
} ms_compare_setting_t;

/* A leak suspect: allocations of one source, made in step N and alive at leaks_step, for
 * every step from first_step to last_step, each step's bytes within the tolerance of the
 * median (per_step). */
typedef struct ms_compare_leak_s {
  const char *source;
  ms_category category;
  uint64_t per_step;       /* the median bytes per step */
  uint64_t blocks_per_step;/* the median blocks per step */
  int64_t first_step, last_step; /* step numbers (ProfilerStep#N) */
  size_t nsteps;
  uint64_t total;          /* bytes alive at the moment from those steps */
} ms_compare_leak_t;

typedef struct ms_compare_s {
  ms_compare_side_t side[2];      /* BEFORE, AFTER */
  ms_compare_row_t *by_source;    /* change descending by magnitude, then key */
  size_t nsource;                 /* rows kept (options.nrows) */
  size_t nsource_all;             /* rows before the cut (rows whose change is 0 left out) */
  ms_compare_row_t by_category[MS_CAT_COUNT]; /* every category, in ms_category order */
  ms_compare_setting_t *settings; /* the settings that differ, by key */
  size_t nsettings;
  size_t nsettings_same;          /* settings recorded by both with the same value */
  size_t steps;                   /* ProfilerStep ranges that AFTER's leak search used */
  size_t leaks_step;              /* the state the leak search looked at (AFTER's step) */
  ms_compare_leak_t *leaks;       /* total bytes descending */
  size_t nleaks;
  void *impl_;                    /* private: the strings */
} ms_compare_t;

/* Compares before and after (may be the same snapshot at two moments) as *o says (NULL =
 * defaults). @return MS_OK with *out (free with ms_compare_free); MS_EINVAL (a device or moment
 * one side lacks: eb names the side), MS_EFORMAT (an inconsistent trace), MS_ENOMEM. *out is
 * untouched on failure. */
MS_API MS_NODISCARD int ms_compare_run(const ms_snapshot_t *before, const ms_snapshot_t *after,
                                       const ms_compare_options_t *o, ms_compare_t **out,
                                       ms_errbuf_t *eb);
/* Frees a comparison. Accepts NULL. */
MS_API void ms_compare_free(ms_compare_t *c);

/* A comparison built one side at a time, so that a caller need hold only one snapshot at a time:
 * ms_compare_add reduces a side to its figures, rows, settings (and for AFTER, leak suspects),
 * after which its snapshot may be freed before the next is read. Two snapshots compared this way
 * give the same result as ms_compare_run on both (which shares one index when given the same
 * snapshot twice), at about half the peak memory. */
typedef struct ms_compare_build_s ms_compare_build_t;

/* Starts a comparison with options *o (NULL = defaults, copied). @return MS_OK with *out (end it
 * with ms_compare_finish or ms_compare_build_free), MS_EINVAL, MS_ENOMEM. */
MS_API MS_NODISCARD int ms_compare_begin(const ms_compare_options_t *o, ms_compare_build_t **out);
/* Adds the next side: BEFORE first, then AFTER (the first side neither added nor being added).
 * The snapshot is not used after the call returns. @return MS_OK; MS_EINVAL (both sides added
 * already, or a device or moment the side lacks: eb names the side), MS_EFORMAT, MS_ENOMEM. After a
 * failure only ms_compare_build_free applies. */
MS_API MS_NODISCARD int ms_compare_add(ms_compare_build_t *b, const ms_snapshot_t *snap,
                                       ms_errbuf_t *eb);
/* ms_compare_add with the side's time index given: tl (NULL: built here) is snap's, made with the
 * default configuration (ms_timeline_create(snap, NULL, ...), or ms_cache_timeline's); it is only
 * read, and stays the caller's. The result is the same. @return as ms_compare_add; MS_EINVAL when
 * tl is another snapshot's. */
MS_API MS_NODISCARD int ms_compare_add_indexed(ms_compare_build_t *b, const ms_snapshot_t *snap,
                                               const ms_timeline_t *tl, ms_errbuf_t *eb);
/* Adds side k (0: BEFORE, 1: AFTER) with its time index tl as ms_compare_add_indexed does, in
 * either order: two threads may add the two sides of one comparison at once (each side's
 * figures, index and classifier are its own; only the short reductions take turns), so that a
 * caller reads both files in parallel. A side that fails leaves the other's addition undisturbed
 * (its own result and message); the comparison can then only be freed. @return as
 * ms_compare_add_indexed; MS_EINVAL when k is neither 0 nor 1, or side k is added already or
 * being added. */
MS_API MS_NODISCARD int ms_compare_add_side(ms_compare_build_t *b, int k, const ms_snapshot_t *snap,
                                            const ms_timeline_t *tl, ms_errbuf_t *eb);
/* Completes the comparison of both sides into *out (free with ms_compare_free) and frees b, also
 * on failure. @return MS_OK, MS_EINVAL (a side is missing), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_compare_finish(ms_compare_build_t *b, ms_compare_t **out);
/* Frees an unfinished comparison. Accepts NULL. */
MS_API void ms_compare_build_free(ms_compare_build_t *b);

/* ---- the gate -------------------------------------------------------------------------------- */

/* The named figures: the replay's (ms_replay_usage_t), then one per category (peak_<name>). */
typedef enum ms_gate_figure {
  MS_FIG_PEAK_RESERVED = 0,
  MS_FIG_PEAK_ALLOCATED,
  MS_FIG_PEAK_REQUESTED,
  MS_FIG_UNALLOCATED_AT_PEAK_RESERVED,
  MS_FIG_DEVICE_MALLOCS,
  MS_FIG_DEVICE_FREES,
  MS_FIG_ALLOC_RETRIES,
  MS_FIG_OOMS,
  MS_FIG_FINAL_RESERVED,
  MS_FIG_FINAL_ALLOCATED,
  MS_FIG_CATEGORY0, /* peak_parameter .. peak_unknown: MS_FIG_CATEGORY0 + ms_category */
  MS_FIG_COUNT = MS_FIG_CATEGORY0 + MS_CAT_COUNT
} ms_gate_figure;

/* @return the figure's name ("peak_reserved", ..., "peak_optimizer_state"), "?" otherwise. */
MS_API const char *ms_gate_figure_name(ms_gate_figure f);
/* @return whether the figure is in bytes (else a count). */
MS_API bool ms_gate_figure_is_bytes(ms_gate_figure f);

typedef enum ms_gate_op { MS_GATE_LE = 0, MS_GATE_LT, MS_GATE_GE, MS_GATE_GT } ms_gate_op;

/* A limit: FIGURE OP VALUE, VALUE absolute ("20GiB", "3") or relative to the baseline's figure
 * ("+5%", "-10%", "+512MiB"; a signed value is relative). */
typedef struct ms_gate_limit_s {
  ms_gate_figure figure;
  ms_gate_op op;
  bool relative;
  bool percent;    /* relative: value is a percentage (in hundredths of a percent) */
  int64_t value;   /* absolute: the bound; relative: the change in bytes or 1/100 % */
  char text[128];  /* the limit as given (truncated) */
} ms_gate_limit_t;

/* Parses "FIGURE<=VALUE" (also <, >=, >). VALUE: digits with an optional fraction and a unit
 * K, M, G, T (binary; "iB" may follow) or B; a sign makes it relative; a relative value may end
 * in '%'. @return MS_OK; MS_EINVAL (malformed, eb says where), MS_ENOTFOUND (an unknown figure,
 * eb lists the names). *out untouched on failure. */
MS_API MS_NODISCARD int ms_gate_limit_parse(const char *text, ms_gate_limit_t *out,
                                            ms_errbuf_t *eb);

typedef struct ms_gate_options_s {
  int device;          /* -1: the viewer's default device */
  bool replay;         /* figures from a what-if replay through a fresh allocator */
  const char *config;  /* replay: a MEMSNAP_ALLOC_CONF on top of the recorded settings */
  uint64_t capacity;   /* replay: the device's size (0: recorded, else inferred, else unlimited) */
} ms_gate_options_t;

MS_API void ms_gate_options_init(ms_gate_options_t *o);

/* A snapshot's figures, with the step of each peak (for its sources). */
typedef struct ms_gate_figures_s {
  size_t device;
  bool replayed;             /* from the fresh-start replay */
  bool known[MS_FIG_COUNT];  /* false: the snapshot cannot tell (e.g. no trace) */
  uint64_t value[MS_FIG_COUNT];
  int64_t step[MS_FIG_COUNT];/* the state the figure is reached at, -1 when not a moment */
  char note[256];            /* why figures are unknown, else "" */
} ms_gate_figures_t;

/* Computes the figures of snap. Recorded: peaks, final values and unallocated_at_peak_reserved
 * from the time index, device_mallocs/frees and ooms counted in the trace, alloc_retries from the
 * recorded statistics (memsnap's snapshots) or the check replay. Replayed: the what-if replay's
 * (fresh_start) under the recorded settings (or o->config) and capacity; the peaks of the
 * categories always come from the recorded trace. @return MS_OK (unknown figures so marked),
 * MS_EINVAL (no such device, the replay is impossible: eb says why), MS_ECONFIG, MS_EFORMAT,
 * MS_ENOMEM. */
MS_API MS_NODISCARD int ms_gate_figures(const ms_snapshot_t *snap, const ms_gate_options_t *o,
                                        ms_gate_figures_t *out, ms_errbuf_t *eb);

/* Whether value holds under limit l (the baseline's figure for a relative one): *bound receives
 * the bound it was held to. */
MS_API bool ms_gate_holds(const ms_gate_limit_t *l, uint64_t value, uint64_t baseline,
                          uint64_t *bound);

MS_EXTERN_C_END

#endif /* MEMSNAP_COMPARE_H */
