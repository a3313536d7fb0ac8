/* SPDX-License-Identifier: MIT
 * memsnap: memory over time (issue #12). A time index over a snapshot's trace gives the
 * allocator's state at any moment of the trace, the totals after every entry and their peaks;
 * the viewer data computes exactly what PyTorch's web viewer (MemoryViz.js) draws in its
 * "Active Memory Timeline" and "Active Cached Segment Timeline".
 *
 * Vocabulary:
 *  - A device's trace has n entries (ms_snap_device_t.ntrace). The state at *step* s
 *    (0 <= s <= n) is the state after the first s entries: step n is the end of the trace (the
 *    snapshot's own segments and blocks), step 0 the state before entry 0. "The state at entry i"
 *    is step i + 1.
 *  - Earlier states are the end state with the trace undone, newest first (as the viewer's
 *    "Allocator State History"): an `alloc` undone removes its block, a `free_completed` undone
 *    puts the block back (pending free), a `free_requested` undone makes it allocated again,
 *    `segment_alloc`/`segment_free` remove/add a whole segment, `segment_map`/`segment_unmap`
 *    remove/add a range of an expandable segment (adjacent mapped ranges of one stream and pool
 *    form one segment, as PyTorch reports them). A block freed in the trace whose alloc is not in
 *    it (ring buffer) stays live back to step 0 (MS_TL_BLOCK_ALLOC_UNRECORDED).
 *  - A live block is allocated (`active_allocated`) or pending free (`active_pending_free`);
 *    free (`inactive`) blocks are the gaps between live blocks inside a segment.
 *  - Totals (bytes): allocated = sizes of allocated blocks; active = allocated + pending-free
 *    blocks; requested = the user's requested sizes of active blocks; reserved = segment sizes.
 *  - Block sizes: a block alive at the end has its exact size (the snapshot's). The trace records
 *    only requested sizes, so a block freed within the trace gets an inferred size
 *    (MS_TL_BLOCK_SIZE_INFERRED): PyTorch's 512-byte rounding of the request, or, for a large
 *    request (> 1 MiB), the whole room up to the next block when the remainder would have been too
 *    small to split off (<= 1 MiB); the room is the smallest gap the block had to its next
 *    neighbour over its whole life, so inferred blocks never overlap (a first pass finds it).
 *  - An inconsistent trace (an alloc whose block is not there later, a free inside a live block
 *    or outside every segment, a segment that overlaps another, a map/unmap outside a segment)
 *    is an error naming the device and the entry number: MS_EFORMAT with the description in the
 *    error buffer, e.g. "device 0, trace entry 17 (free_completed 0x7f00): no segment holds it".
 *
 * Cost: building is two passes over each trace and O(1) per entry (hash map); a checkpoint of
 * the state is kept every max(K, 2 x live blocks) entries, so reaching any step undoes at most
 * that many entries from the nearest later checkpoint. The index keeps no total per step (issue
 * #33): it keeps the peaks over the whole trace and the totals at its checkpoints; the totals at
 * another step, a peak over part of the trace, and a series (made on first use, then kept) are
 * found by undoing entries from a checkpoint, one undo per step covered.
 * Thread-safety: any number of threads may query one index at once. The index is immutable after
 * ms_timeline_create except for the series, which ms_timeline_series makes on first use under a
 * lock of the index; every query that reads a series takes that lock. The source snapshot must
 * outlive the index and every snapshot it materialises.
 */
#ifndef MEMSNAP_TIMELINE_H
#define MEMSNAP_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

MS_EXTERN_C_BEGIN

typedef struct ms_timeline_s ms_timeline_t;

/* A filter by stream and private pool: a field applies when its has_ flag is set; a segment
 * passes by its own stream and segment_pool_id. */
typedef struct ms_tl_filter_s {
  bool has_stream;
  uint64_t stream;    /* raw stream handle */
  bool has_pool;
  int64_t pool_id[2]; /* (0,0) = the default pool */
} ms_tl_filter_t;

typedef struct ms_timeline_config_s {
  uint32_t checkpoint_every; /* minimum entries between checkpoints (K); 0 = default 1024 */
  ms_tl_filter_t filter;     /* the totals, series and peaks count only the segments that pass
                                it, and their blocks (default: all); states still hold every
                                segment (ms_timeline_snapshot_at takes a filter of its own) */
} ms_timeline_config_t;

/* Fills the defaults. */
MS_API void ms_timeline_config_init(ms_timeline_config_t *cfg);

/* Builds the index of every device of snap. cfg may be NULL (defaults). Two or more devices of
 * 65,536 entries or more are built on threads of their own (one per online CPU at most, and as
 * many at once as a quarter of the free memory holds the builds' temporaries of), which end
 * before it returns; the index and the error reported are those of one thread.
 * @return MS_OK; MS_EFORMAT for an inconsistent trace or snapshot (eb names device and entry);
 * MS_ENOMEM; MS_ELIMIT for an absurd device number. *out untouched on failure. */
MS_API MS_NODISCARD int ms_timeline_create(const ms_snapshot_t *snap,
                                           const ms_timeline_config_t *cfg, ms_timeline_t **out,
                                           ms_errbuf_t *eb);
/* Frees the index. Accepts NULL. */
MS_API void ms_timeline_destroy(ms_timeline_t *tl);

/* @return the snapshot the index was built from. */
MS_API const ms_snapshot_t *ms_timeline_snapshot(const ms_timeline_t *tl);
/* @return the number of devices: one per trace, or more when segments name a higher device. */
MS_API size_t ms_timeline_ndevices(const ms_timeline_t *tl);
/* @return the number of trace entries of device dev (0 for an unknown device). The steps of the
 * device are 0 .. that number. */
MS_API size_t ms_timeline_nentries(const ms_timeline_t *tl, size_t dev);
/* @return the trace entry i of device dev (pre: i < ms_timeline_nentries). */
MS_API const ms_snap_trace_t *ms_timeline_entry(const ms_timeline_t *tl, size_t dev, size_t i);

/* ---- totals, series and peaks -------------------------------------------------------------- */

typedef enum ms_tl_metric {
  MS_TL_ALLOCATED = 0, /* bytes in allocated blocks */
  MS_TL_ACTIVE,        /* bytes in allocated and pending-free blocks */
  MS_TL_REQUESTED,     /* requested bytes of active blocks */
  MS_TL_RESERVED,      /* bytes in segments */
  MS_TL_METRIC_COUNT
} ms_tl_metric;

/* @return "allocated", "active", "requested", "reserved" ("?" otherwise). */
MS_API const char *ms_tl_metric_name(ms_tl_metric m);

/* @return the metric's value at every step of device dev: an array of nentries + 1 values owned
 * by the index (value[s] = the total at step s), or NULL for an unknown device or metric, or out
 * of memory. The first call for a device and metric makes the array (one pass over the trace
 * from its checkpoints, 8 bytes per step) and the index keeps it until ms_timeline_destroy;
 * later calls return the same array. Thread-safe: concurrent first calls make it once. For one
 * value or a peak, ms_timeline_totals_at and ms_timeline_peak cost far less. */
MS_API const uint64_t *ms_timeline_series(const ms_timeline_t *tl, size_t dev, ms_tl_metric m);

/* The four totals of device dev at step s (totals[m] = ms_timeline_series(tl, dev, m)[s]),
 * without making a series: from the checkpoint at that step, or by undoing entries from the next
 * one (at most one checkpoint interval). totals is untouched on failure.
 * @return MS_OK, MS_EINVAL (unknown device, s > nentries, totals NULL), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_timeline_totals_at(const ms_timeline_t *tl, size_t dev, size_t step,
                                              uint64_t totals[MS_TL_METRIC_COUNT]);

/* Called by ms_timeline_walk for each step visited, with the four totals at that step. */
typedef void ms_tl_visit_fn(void *arg, size_t step, const uint64_t totals[MS_TL_METRIC_COUNT]);

/* Visits steps to, to - 1, ..., from of device dev (to clamped to nentries), newest first,
 * calling fn(arg, step, totals) at each: one pass undoing the entries from the checkpoint at or
 * after `to`, storing nothing per step. For what needs every step of a range without keeping a
 * series (maxima over buckets of steps, a sum). fn must not call back into the walk.
 * @return MS_OK, MS_EINVAL (unknown device, from > to after clamping, fn NULL), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_timeline_walk(const ms_timeline_t *tl, size_t dev, size_t from,
                                         size_t to, ms_tl_visit_fn *fn, void *arg);

typedef struct ms_tl_peak_s {
  uint64_t bytes;  /* the highest value */
  size_t step;     /* the first step where it is reached */
  int64_t entry;   /* step - 1: the entry after which it is reached; -1 = before the first entry */
  int64_t time_us; /* that entry's time_us; 0 when the entry has none or entry is -1 */
  bool has_time;   /* time_us is known */
} ms_tl_peak_t;

/* The peak of metric m over steps [from, to] of device dev (to clamped to nentries). The whole
 * range [0, nentries] (or any range once the series is made) is answered at once; a part of it
 * undoes the entries from the checkpoint at or after `to` down to `from`, storing nothing.
 * @return MS_OK, MS_EINVAL for an unknown device/metric or from > to, MS_ENOMEM. */
MS_API MS_NODISCARD int ms_timeline_peak(const ms_timeline_t *tl, size_t dev, ms_tl_metric m,
                                         size_t from, size_t to, ms_tl_peak_t *out);

/* The peaks of the four metrics over steps [from, to] (out[m] as ms_timeline_peak gives it for
 * m), in one pass where a pass is needed. out is untouched on failure.
 * @return MS_OK, MS_EINVAL (unknown device, from > to after clamping, out NULL), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_timeline_peaks(const ms_timeline_t *tl, size_t dev, size_t from,
                                          size_t to, ms_tl_peak_t out[MS_TL_METRIC_COUNT]);

/* ---- the state at a step ------------------------------------------------------------------- */

enum {
  MS_TL_BLOCK_SIZE_INFERRED = 1u << 0,    /* block size inferred (see above) */
  MS_TL_BLOCK_ALLOC_UNRECORDED = 1u << 1, /* freed in the trace, alloc not in it */
  MS_TL_BLOCK_FROM_SNAPSHOT = 1u << 2,    /* alive at the end: snap_block is valid */
};

typedef struct ms_tl_block_s {
  uint64_t address;
  uint64_t size;           /* bytes (see MS_TL_BLOCK_SIZE_INFERRED) */
  uint64_t requested_size; /* the user's size */
  uint64_t stream;         /* raw stream handle */
  int64_t alloc_entry;     /* index of its alloc entry in the device's trace, -1 when not in it */
  int64_t free_entry;      /* index of its free_completed entry, -1 when alive at the end */
  int64_t time_us;         /* time of that alloc entry (0 when unknown) */
  uint32_t stack;          /* allocation stack (the free's when the alloc is unrecorded) */
  uint32_t snap_block;     /* the snapshot's block (MS_TL_BLOCK_FROM_SNAPSHOT), else UINT32_MAX */
  ms_block_state state;    /* MS_BLOCK_ACTIVE_ALLOCATED or MS_BLOCK_ACTIVE_PENDING_FREE */
  uint32_t flags;          /* MS_TL_BLOCK_* */
} ms_tl_block_t;

typedef struct ms_tl_segment_s {
  uint64_t address;
  uint64_t size;       /* bytes */
  uint64_t stream;     /* raw stream handle */
  int64_t pool_id[2];  /* (0,0) = default pool */
  bool is_expandable;
  uint32_t stack;      /* segment allocation stack, or MS_SNAP_NO_STACK */
  uint32_t snap_segment; /* the snapshot's segment it came from, or UINT32_MAX */
} ms_tl_segment_t;

/* A state, in the caller's storage: ms_timeline_state_init, fill with ms_timeline_state_at (as
 * often as wanted), ms_timeline_state_release. Segments and blocks sorted by address. */
typedef struct ms_tl_state_s {
  size_t device;
  size_t step;
  ms_tl_segment_t *segments;
  size_t nsegments;
  ms_tl_block_t *blocks; /* live blocks only */
  size_t nblocks;
  uint64_t totals[MS_TL_METRIC_COUNT]; /* of the segments that pass the index's filter */
  size_t cap_segments_, cap_blocks_; /* private */
} ms_tl_state_t;

MS_API void ms_timeline_state_init(ms_tl_state_t *st);
MS_API void ms_timeline_state_release(ms_tl_state_t *st);

/* Fills *st with the state of device dev at step s. For a snapshot loaded with
 * MS_LOAD_DEFER_STACKS (memsnap/serialize.h), reads the stacks its blocks need from the file
 * first (so such an index must not be used from two threads at once). @return MS_OK, MS_EINVAL
 * (unknown device or s > nentries), MS_ENOMEM; deferred stacks: MS_EIO (the file changed since
 * it was read, or cannot be read), MS_EFORMAT (its bytes are not the frames read before). */
MS_API MS_NODISCARD int ms_timeline_state_at(const ms_timeline_t *tl, size_t dev, size_t step,
                                             ms_tl_state_t *st);

/* Called by ms_timeline_states_at with the state at steps[k]; returns MS_OK to go on, else the
 * code that ms_timeline_states_at returns. st is valid only during the call. */
typedef int ms_tl_state_visit_fn(void *arg, size_t k, const ms_tl_state_t *st);

/* The states of device dev at steps[0] <= steps[1] <= ... <= steps[n - 1], newest first, in one
 * pass undoing the entries from the checkpoint at or after the last: for many moments of one
 * trace, where n calls of ms_timeline_state_at would each start at a checkpoint. Deferred stacks
 * as ms_timeline_state_at. @return MS_OK, MS_EINVAL (unknown device, fn NULL, a step past the
 * trace or steps out of order), MS_ENOMEM, fn's code, and as ms_timeline_state_at. */
MS_API MS_NODISCARD int ms_timeline_states_at(const ms_timeline_t *tl, size_t dev,
                                              const size_t *steps, size_t n,
                                              ms_tl_state_visit_fn *fn, void *arg);

/* Applies the next entry (st->step) to *st, forwards, so that st becomes the state at step + 1
 * (pre: st was filled by ms_timeline_state_at or this function, and st->step < nentries).
 * Used to check the index (tests) and to walk a range. @return MS_OK, MS_EINVAL, MS_ENOMEM, and
 * as ms_timeline_state_at for deferred stacks. */
MS_API MS_NODISCARD int ms_timeline_state_advance(const ms_timeline_t *tl, ms_tl_state_t *st);

/* The state of device dev at step s as a snapshot, so that every view of a snapshot (stats,
 * memory and segments flame graphs, compare) shows that moment unchanged: the segments of that
 * device (filtered by filter, which may be NULL) with their blocks, free gaps as `inactive`
 * blocks. The result borrows everything else (frames, stacks, trace, settings) from the source
 * snapshot, which must outlive it; free it with ms_snapshot_free().
 * @return MS_OK, MS_EINVAL, MS_ENOMEM. */
MS_API MS_NODISCARD int ms_timeline_snapshot_at(const ms_timeline_t *tl, size_t dev, size_t step,
                                                const ms_tl_filter_t *filter,
                                                ms_snapshot_t **out);

/* The snapshot's segments of one device (dev = SIZE_MAX: all devices) that pass the filter (NULL:
 * all), with their blocks: the end state without a time index (no trace needed). The result
 * borrows everything else from snap, which must outlive it; free it with ms_snapshot_free().
 * @return MS_OK or MS_ENOMEM. */
MS_API MS_NODISCARD int ms_snapshot_select(const ms_snapshot_t *snap, size_t dev,
                                           const ms_tl_filter_t *filter, ms_snapshot_t **out);

/* ---- moments ------------------------------------------------------------------------------- */

typedef enum ms_tl_moment_kind {
  MS_TL_MOMENT_PEAK = 0,      /* "peak": the first step of the peak of allocated bytes */
  MS_TL_MOMENT_PEAK_RESERVED, /* "peak-reserved" */
  MS_TL_MOMENT_ENTRY,         /* "123": after trace entry 123 (step 124); "-1" = before entry 0 */
  MS_TL_MOMENT_TIME,          /* "t=1700000000123456" or "1700000000123456us": the state after the
                                 last entry with time_us <= the time (before entry 0 if none) */
  MS_TL_MOMENT_END,           /* "end": the end of the trace (the snapshot itself) */
  MS_TL_MOMENT_OOM,           /* "oom" (the first) or "oom:N" (the Nth, from 1): after that `oom`
                                 entry (an OOM changes no state: the state when it failed) */
  MS_TL_MOMENT_STEP,          /* "step=N": the end of step N (ProfilerStep#N's END annotation):
                                 after the last entry with time_us <= that END */
} ms_tl_moment_kind;

typedef struct ms_tl_moment_s {
  ms_tl_moment_kind kind;
  int64_t value; /* ENTRY: the entry index (-1 allowed); TIME: microseconds; OOM: N (from 1);
                    STEP: the step number */
} ms_tl_moment_t;

/* Parses a moment's text (see ms_tl_moment_kind). @return MS_OK or MS_EINVAL with eb filled. */
MS_API MS_NODISCARD int ms_tl_moment_parse(const char *text, ms_tl_moment_t *out,
                                           ms_errbuf_t *eb);
/* Resolves a moment to a step of device dev, within steps [from, to] for the peaks.
 * @return MS_OK, or MS_EINVAL with eb filled (entry out of range, no entry has a time...). */
MS_API MS_NODISCARD int ms_timeline_moment_step(const ms_timeline_t *tl, size_t dev,
                                                const ms_tl_moment_t *m, size_t from, size_t to,
                                                size_t *step, ms_errbuf_t *eb);

/* ---- out-of-memory events and the device's capacity (docs/explain.md) ---------------------- */

/* One `oom` entry of a device's trace: the request that failed and what the device said. */
typedef struct ms_tl_oom_s {
  size_t entry;          /* its index in the device's trace */
  uint64_t request;      /* the requested bytes (the entry's size) */
  uint64_t stream;       /* raw stream handle */
  int64_t pool_id[2];    /* the private pool it was for, (0,0) = the default pool */
  bool has_device_free;  /* the entry carried device_free (MS_TRACE_NO_ADDR not set) */
  uint64_t device_free;  /* the device's free bytes when the request failed (cudaMemGetInfo) */
  bool has_reserved;     /* reserved is known (the trace is consistent with the end state) */
  uint64_t reserved;     /* bytes reserved by the allocator on that device at the entry */
} ms_tl_oom_t;

/* @return the number of `oom` entries in the trace of device dev (0 for an unknown device). */
MS_API size_t ms_snapshot_oom_count(const ms_snapshot_t *snap, size_t dev);
/* The k-th (from 0) `oom` entry of device dev, with the reserved bytes at it, computed from the
 * end state by undoing the segment entries after it (no time index needed).
 * @return MS_OK, or MS_EINVAL when there is no such entry. */
MS_API MS_NODISCARD int ms_snapshot_oom_at(const ms_snapshot_t *snap, size_t dev, size_t k,
                                           ms_tl_oom_t *out);

/* Every `oom` entry of a device's trace, in trace order: ooms[k] is ms_snapshot_oom_at's k-th. */
typedef struct ms_tl_ooms_s {
  ms_tl_oom_t *ooms;
  size_t n;
} ms_tl_ooms_t;

/* Every `oom` entry of device dev in *out (release with ms_tl_ooms_release), in two passes over
 * its trace however many there are (ms_snapshot_oom_at costs a pass each); none for a device
 * the snapshot does not list. @return MS_OK, MS_EINVAL (no snapshot or no out: *out empty, when
 * given) or MS_ENOMEM. */
MS_API MS_NODISCARD int ms_snapshot_ooms(const ms_snapshot_t *snap, size_t dev, ms_tl_ooms_t *out);
MS_API void ms_tl_ooms_release(ms_tl_ooms_t *o);

typedef enum ms_capacity_source {
  MS_CAPACITY_UNKNOWN = 0, /* "unknown": no size recorded, no OOM entry that tells it */
  MS_CAPACITY_RECORDED,    /* "recorded": the snapshot records the device's size (memsnap's) */
  MS_CAPACITY_INFERRED,    /* "inferred_from_oom": reserved at the first OOM + its device_free */
  MS_CAPACITY_GIVEN,       /* "given": the user said (--capacity) */
} ms_capacity_source;

/* @return "unknown", "recorded", "inferred_from_oom" or "given". */
MS_API const char *ms_capacity_source_name(ms_capacity_source s);

/* The memory the allocator of device dev could have had: the size the snapshot records, else the
 * reserved bytes at the first `oom` entry that carries device_free plus that device_free (the
 * memory other users of the device held is then left out, as it was for the allocator).
 * *bytes = 0 when unknown; *oom (may be NULL) receives the OOM used when inferred.
 * @return the source. */
MS_API ms_capacity_source ms_snapshot_capacity(const ms_snapshot_t *snap, size_t dev,
                                               uint64_t *bytes, ms_tl_oom_t *oom);

/* ---- annotations: steps and phases (external_annotations) ---------------------------------- */

/* A range of a record_function annotation: a START and its END of the same name and device. */
typedef struct ms_tl_range_s {
  const char *name;  /* e.g. "ProfilerStep#3", "## forward ##" (the snapshot's string) */
  int64_t device;
  int64_t start_us;
  int64_t end_us;    /* INT64_MAX when the range never ended (no END) */
  bool has_end;
  int64_t step;      /* N for "ProfilerStep#N", else -1 */
} ms_tl_range_t;

typedef struct ms_tl_ranges_s {
  ms_tl_range_t *ranges; /* sorted by start time, then by end time (outer first) */
  size_t n;
  size_t unmatched_ends; /* END markers without a START before them (ignored) */
  size_t unknown_stages; /* markers whose stage is neither START nor END (ignored) */
  size_t *by_step;       /* the positions in ranges of the step ranges (step >= 0), by step number,
                            then position: ms_tl_ranges_step's search (NULL: it scans the ranges) */
  size_t nsteps;         /* their number */
} ms_tl_ranges_t;

/* Pairs the snapshot's external_annotations into ranges: markers sorted by time (stable), each END
 * closing the latest open START of the same name and device (in time linear in the markers,
 * after the sort, however they nest). Fills *out (release with ms_tl_ranges_release). @return
 * MS_OK or MS_ENOMEM. */
MS_API MS_NODISCARD int ms_tl_ranges_build(const ms_snapshot_t *snap, ms_tl_ranges_t *out);
MS_API void ms_tl_ranges_release(ms_tl_ranges_t *r);
/* The innermost range of device dev (or of every device when dev < 0) that holds time t, whose
 * step field is -1 (phase) or >= 0 (step) as want_step says; NULL when none. */
MS_API const ms_tl_range_t *ms_tl_ranges_at(const ms_tl_ranges_t *r, int64_t dev, int64_t t,
                                            bool want_step);
/* The range of step n ("ProfilerStep#n") of device dev (or any device when dev < 0), NULL if
 * none, and for n < 0 (the first such range when a step number repeats): a binary search of
 * by_step. */
MS_API const ms_tl_range_t *ms_tl_ranges_step(const ms_tl_ranges_t *r, int64_t dev, int64_t n);

/* The trace entries of device dev inside step n: the steps [*from, *to] (the state before its
 * first entry to the state after its last). @return MS_OK, or MS_EINVAL with eb filled (no such
 * step, the trace has no times). */
MS_API MS_NODISCARD int ms_timeline_step_range(const ms_timeline_t *tl, size_t dev, int64_t n,
                                               size_t *from, size_t *to, ms_errbuf_t *eb);
/* The trace entries of device dev from the start of step n to the end of step m (n <= m): the
 * entries whose times lie from the one's start to the other's end, as ms_timeline_time_range.
 * @return as ms_timeline_step_range (the message names the step that is missing). */
MS_API MS_NODISCARD int ms_timeline_steps_range(const ms_timeline_t *tl, size_t dev, int64_t n,
                                                int64_t m, size_t *from, size_t *to,
                                                ms_errbuf_t *eb);
/* The trace entries of device dev whose time_us lies in [t0, t1] (times need not be sorted): the
 * steps [*from, *to] from the state before the first of them to the state after the last; when
 * none does, the empty range [*from, *from] after the last entry before t0 (entries without a
 * time are passed over). @return MS_OK, or MS_EINVAL with eb filled (no device dev, the trace has
 * no times). */
MS_API MS_NODISCARD int ms_timeline_time_range(const ms_timeline_t *tl, size_t dev, int64_t t0,
                                               int64_t t1, size_t *from, size_t *to,
                                               ms_errbuf_t *eb);

/* ---- PyTorch viewer's timeline data ---------------------------------------------------------- */
/* What `memsnap timeline --viewer-data` prints (docs/timeline.md, "`--viewer-data`: PyTorch's
 * viewer's data"). */

/* The devices the viewer lists (a non-empty trace or at least one segment) and its default (the
 * longest trace, first on ties). @return the number listed (0: the viewer cannot show the
 * snapshot); the first min(that, cap) device numbers go to devs; *def (may be NULL) = default. */
MS_API size_t ms_tl_viewer_devices(const ms_snapshot_t *snap, size_t *devs, size_t cap,
                                   size_t *def);

/* One series of allocations_over_time: elem (an element index, or -1 for "summarized"),
 * points (timestep, offset) in order, size (one value, or per point for the summarized band). */
typedef struct ms_tlv_series_s {
  int64_t elem;        /* -1 = "summarized" */
  size_t first_point;  /* into ms_tlv_t.timesteps / offsets / sizes */
  size_t npoints;      /* timesteps; the summarized band has npoints + 1 offsets (MemoryViz) */
  int64_t size;        /* element size (not the summarized band) */
  int64_t color;
  bool ghost;          /* a block of the snapshot with no alloc in the trace */
} ms_tlv_series_t;

typedef struct ms_tlv_s {
  size_t device;
  bool segments;           /* the "Active Cached Segment Timeline" */
  int64_t max_size;
  size_t elements_length;
  int64_t *max_at_time;    /* one value per timestep */
  size_t ntimesteps;
  ms_tlv_series_t *series; /* drawn elements in order of appearance, the summarized band last */
  size_t nseries;
  int64_t *timesteps;      /* points of all series, series by series */
  int64_t *offsets;        /* offsets, the same layout (summarized band: one more) */
  int64_t *sizes;          /* summarized band's sizes (npoints values), at its first_point */
  size_t npoints;
  /* Elements (for hover texts): the trace entry index of element e, or -1 - k for the snapshot's
   * block or segment k (ghost / initially present). */
  int64_t *element_source;
  void *impl_;
} ms_tlv_t;

/* The budget of the viewer's data. Every free adds two points to every band stacked above the
 * freed one, so the points can grow as the square of the trace (5,000 long-lived blocks, then
 * 5,000 rounds of allocating one and freeing a random one: 25 million points). The bands' points
 * (a timestep, an offset and a summarized-band size, MS_TLV_POINT_BYTES each) may take at most
 * 64 MiB (MS_TLV_BUDGET_BYTES, 2.8 million points) or 384 bytes per trace entry of the range
 * (MS_TLV_BUDGET_PER_ENTRY, 16 points), whichever is more: a small trace of the worst shape stays
 * small, and a long ordinary one exact (real traces need 1 to 27 points per entry; a synthetic
 * training run of 5 M entries 0.7). What the rest of the data takes (max_at_time, the summarized
 * band, the elements) is linear in the trace, at most a few values per entry. The points are
 * counted before any is stored (O(n log n) time, O(n) memory). */
#define MS_TLV_POINT_BYTES 24u
#define MS_TLV_BUDGET_BYTES ((uint64_t)64 << 20)
#define MS_TLV_BUDGET_PER_ENTRY ((uint64_t)16 * MS_TLV_POINT_BYTES)

/* The default budget, in bytes, of the viewer data of a range of nentries trace entries. */
MS_API uint64_t ms_tlv_default_budget(size_t nentries);

typedef struct ms_tlv_budget_s {
  uint64_t bytes;      /* in: the most bytes the bands' points may take; 0 = the default
                          (ms_tlv_default_budget of the range, set here), UINT64_MAX = none */
  bool summarize;      /* in: past the budget, draw fewer elements on their own (the smallest go
                          into the summarized band, as MemoryViz's max_entries does) instead of
                          failing with MS_ELIMIT */
  uint64_t exact_bytes; /* out: the points' bytes with max_entries elements drawn on their own */
  size_t fits_entries; /* out: the largest max_entries (<= the one asked) whose points fit */
  size_t drawn;        /* out: the elements drawn on their own in the result */
  bool summarized;     /* out: fewer elements drawn than max_entries asked, to fit the budget */
} ms_tlv_budget_t;

/* Computes the viewer's data for device dev (plot_segments: the segment timeline) with at most
 * max_entries elements drawn on their own (SIZE_MAX: all; MemoryViz's default is 15000),
 * restricted to trace entries [first, last) of the device (0, SIZE_MAX: the whole trace).
 * `at_last` gives the segments at the end of that range (the state at step `last`, e.g. from
 * ms_timeline_snapshot_at); NULL means snap itself, which is right when last reaches the end.
 * The data is exact (PyTorch's numbers) within the default budget (ms_tlv_default_budget).
 * @return MS_OK, MS_EINVAL (no such device), MS_ENOMEM, MS_ELIMIT (more than 2^32 elements, or
 * a size or the memory alive at once of 2^62 bytes or more: no real trace, a hostile one; or
 * points past the budget). Free with ms_tlv_release. */
MS_API MS_NODISCARD int ms_tlv_compute(const ms_snapshot_t *snap, size_t dev, bool plot_segments,
                                       size_t max_entries, size_t first, size_t last,
                                       const ms_snapshot_t *at_last, ms_tlv_t *out);
/* ms_tlv_compute with a budget (NULL = the default, exact or MS_ELIMIT), which says what it cost
 * and, with `summarize`, draws the largest elements that fit on their own and the others in the
 * summarized band. Past the budget without `summarize`: MS_ELIMIT with budget->exact_bytes >
 * budget->bytes (other MS_ELIMIT causes leave exact_bytes at or under it). */
MS_API MS_NODISCARD int ms_tlv_compute_budget(const ms_snapshot_t *snap, size_t dev,
                                              bool plot_segments, size_t max_entries,
                                              size_t first, size_t last,
                                              const ms_snapshot_t *at_last,
                                              ms_tlv_budget_t *budget, ms_tlv_t *out);
MS_API void ms_tlv_release(ms_tlv_t *v);

/* Writes the data as one JSON object with the viewer's field names: device, max_size,
 * elements_length, max_at_time, allocations_over_time ({elem, timesteps, offsets, size, color
 * [, ghost]}, the band with elem "summarized"). @return MS_OK or the sink's error. */
MS_API MS_NODISCARD int ms_tlv_write_json(const ms_tlv_t *v, ms_sink_t *sink);

MS_EXTERN_C_END

#endif /* MEMSNAP_TIMELINE_H */
