/* SPDX-License-Identifier: MIT
 * memsnap: answers (docs/explain.md, issue #26). Why memory peaked or ran out at a moment of a
 * snapshot, and which allocator setting would have avoided it, with replays as the proof.
 *
 * The moment is the first OOM of a device (an `oom` trace entry), else the peak of allocated
 * memory, else (no trace) the snapshot's end state; the caller may name another. At it the
 * allocator's state (the time index, memsnap/timeline.h) gives the figures of the answer: reserved,
 * allocated and requested bytes, the free bytes of the cache per pool, the largest free block in
 * the pool the request needed, inactive split bytes, private pools, memory outside the allocator.
 * A closed set of verdicts (ms_explain_verdict) says why, by the rules of docs/explain.md. Then
 * each remedy (expandable segments, max_split_size_mb around the request, the garbage collection
 * threshold, power-of-two rounding, and combinations) is replayed (memsnap/replay.h) at the
 * device's capacity: whether it avoids the OOM, its peak reserved memory, and the smallest
 * capacity it runs on. The recommendation is the best of them, or, when none helps, how much the
 * run needs.
 *
 * The capacity: given by the caller, else the size the snapshot records (memsnap's), else the one
 * the first OOM implies (reserved there + the device's free bytes it carries), else unknown; an
 * answer on an unknown capacity says so and claims nothing a replay cannot prove.
 *
 * Thread-safety: ms_explain_run reads the snapshot only (its replays run on worker threads).
 */
#ifndef MEMSNAP_EXPLAIN_H
#define MEMSNAP_EXPLAIN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/attribution.h"
#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

MS_EXTERN_C_BEGIN

typedef enum ms_explain_verdict {
  MS_EXPLAIN_FULL = 0,       /* "full": live tensors leave no room for the request */
  MS_EXPLAIN_FRAGMENTATION,  /* "fragmentation": free bytes enough, no free block fits */
  MS_EXPLAIN_RELEASABLE,     /* "releasable": cached whole segments would have made room */
  MS_EXPLAIN_PRIVATE_POOL,   /* "private_pool": private pools hold the missing free memory */
  MS_EXPLAIN_UNKNOWN,        /* "unknown": the snapshot cannot tell (reason says why) */
} ms_explain_verdict;

/* @return "full", "fragmentation", "releasable", "private_pool" or "unknown". */
MS_API const char *ms_explain_verdict_name(ms_explain_verdict v);

typedef enum ms_explain_moment {
  MS_EXPLAIN_AT_OOM = 0, /* "oom": an `oom` entry */
  MS_EXPLAIN_AT_PEAK,    /* "peak": the peak of allocated memory */
  MS_EXPLAIN_AT_END,     /* "end": the end state (a snapshot without a usable trace) */
  MS_EXPLAIN_AT_GIVEN,   /* "at": the moment the caller named */
} ms_explain_moment;

typedef struct ms_explain_options_s {
  int device;            /* -1: the first device with an OOM, else the viewer's default device */
  bool has_moment;       /* moment given; else the first OOM, else the peak */
  ms_tl_moment_t moment;
  uint64_t capacity;     /* > 0: the device's capacity (source "given") */
  bool remedies;         /* replay the remedies (default true) */
  bool min_capacity;     /* bisect each remedy's smallest capacity (default true) */
  unsigned threads;      /* replay workers; 0 = one per online core */
  size_t ntop;           /* holders to list (default 10) */
  size_t series_points;  /* > 0: also the allocated and reserved bytes over the trace, as at
                            most this many buckets (their maxima), e.g. for a chart; default 0 */
  const ms_timeline_t *timeline; /* NULL (default): the time index is built here; else an index
                            of this snapshot with ms_timeline_config_init's configuration (one
                            stored by the snapshot cache, memsnap/cache.h), used instead */
  const ms_attr_t *attr; /* NULL (default): the sources and categories of the holders are
                            classified here; else a classifier of this snapshot over the index
                            used, with the default rules (ms_attr_create(snap, tl, NULL, ...)),
                            used instead (the viewer's, which it built for its own columns) */
} ms_explain_options_t;

MS_API void ms_explain_options_init(ms_explain_options_t *o);

/* The cache of one pool at the moment: segments of one stream, size class and private pool. */
typedef struct ms_explain_pool_s {
  int64_t pool_id[2];    /* (0,0) = the default pool */
  uint64_t stream;
  bool large;            /* the large pool (requests over 1 MiB), else the small one */
  size_t segments;
  uint64_t reserved;     /* bytes in its segments */
  uint64_t free;         /* bytes in no live block */
  uint64_t largest_free; /* its largest free block */
} ms_explain_pool_t;

/* A row of the holders by source line or by category (memsnap/attribution.h). */
typedef struct ms_explain_row_s {
  char *key;             /* the source ("model.py:532 forward") or the category's name */
  uint64_t bytes;        /* allocated bytes */
  uint64_t blocks;
} ms_explain_row_t;

/* One allocation stack among the biggest holders of allocated memory at the moment. */
typedef struct ms_explain_holder_s {
  uint32_t stack;        /* MS_SNAP_NO_STACK when none was recorded */
  uint64_t bytes;        /* allocated bytes */
  uint64_t blocks;
} ms_explain_holder_t;

typedef struct ms_explain_remedy_s {
  char config[128];      /* MEMSNAP_ALLOC_CONF / PYTORCH_CUDA_ALLOC_CONF text; "" = as recorded */
  bool replayed;         /* false: the replay could not run (error in note) */
  int avoids_oom;        /* 1: no OOM at the capacity; 0: an OOM; -1: unknown capacity */
  uint64_t peak_reserved;/* at the capacity (unlimited when unknown) */
  uint64_t ooms;         /* at the capacity */
  int64_t first_oom_entry; /* -1 if none */
  uint64_t min_capacity; /* smallest capacity without an OOM (multiple of 2 MiB); 0 = not found
                            or not asked */
  char note[320];        /* why it was not replayed or has no min_capacity, else "" */
} ms_explain_remedy_t;

typedef struct ms_explain_s {
  size_t device;
  ms_explain_moment moment;
  size_t step;           /* the state shown: after step entries (memsnap/timeline.h) */
  int64_t entry;         /* the trace entry of the moment (the `oom` entry, the peak's), or -1 */
  bool has_time;
  int64_t time_us;
  bool has_trace;        /* the device has a trace (entries beyond a lone snapshot/free) */
  /* The request: the failed allocation (OOM) or the allocation that reached the peak. */
  bool has_request;
  uint64_t request_bytes;
  uint64_t request_rounded;  /* PyTorch's round_size (multiples of 512) */
  uint64_t request_segment;  /* the segment a new allocation would need (get_allocation_size) */
  uint64_t request_stream;
  int64_t request_pool[2];
  bool request_large;
  /* Step and phase: the ProfilerStep#N range and the innermost other annotation range that
   * hold the moment's time (-1 / NULL when none). */
  int64_t step_number;
  const char *phase;     /* borrowed from the snapshot */
  /* Capacity */
  ms_capacity_source capacity_source;
  uint64_t capacity;     /* 0 when unknown */
  ms_tl_oom_t capacity_oom; /* MS_CAPACITY_INFERRED: the OOM it came from */
  bool has_device_free;
  uint64_t device_free;  /* OOM: what the entry carried */
  /* The state */
  uint64_t reserved_bytes, allocated_bytes, active_bytes, requested_bytes;
  uint64_t cached_free_bytes;        /* reserved - active, every pool */
  uint64_t largest_free_block_bytes; /* in the request's pool (the largest overall without one) */
  uint64_t inactive_split_bytes;     /* free bytes in segments that hold live blocks */
  uint64_t releasable_bytes;         /* whole free segments of the default pools */
  uint64_t private_pool_bytes;       /* reserved by private pools (CUDA graphs, MemPool) */
  uint64_t private_pool_free_bytes;
  bool has_outside;
  uint64_t outside_allocator_bytes;  /* capacity - reserved - device_free (OOM, known size) */
  ms_explain_pool_t *pools;          /* pools with segments, the request's first */
  size_t npools;
  /* The answer */
  ms_explain_verdict verdict;
  char verdict_text[512];            /* the verdict in one line, with its figures */
  ms_explain_holder_t *top;          /* biggest first */
  size_t ntop;
  uint64_t top_total_blocks;
  ms_explain_row_t *by_source;       /* the biggest holders by source line, biggest first */
  size_t nby_source;
  ms_explain_row_t *by_category;     /* every category, biggest first */
  size_t nby_category;
  ms_explain_remedy_t *remedies;     /* the recorded settings first, then by benefit */
  size_t nremedies;
  bool replayable;
  char replay_note[320];             /* why the trace cannot be replayed, else "" */
  char recommendation[640];
  char hint[512];                    /* what to record next time (no trace), else "" */
  /* series_points > 0: bucket k covers steps [series_step[k], series_step[k + 1]) (the last up
   * to the end); the maxima of allocated and reserved bytes over it. */
  uint64_t *series_step, *series_allocated, *series_reserved;
  size_t nseries;
} ms_explain_t;

/* Explains snap as *o says (NULL = defaults). @return MS_OK with *out (free with
 * ms_explain_free); MS_EINVAL (no such device or moment: eb says which), MS_EFORMAT (an
 * inconsistent trace: eb names the entry), MS_ENOMEM. *out is untouched on failure. */
MS_API MS_NODISCARD int ms_explain_run(const ms_snapshot_t *snap, const ms_explain_options_t *o,
                                       ms_explain_t **out, ms_errbuf_t *eb);
/* Frees an answer. Accepts NULL. */
MS_API void ms_explain_free(ms_explain_t *x);

/* ---- the answer as JSON ---------------------------------------------------------------------- */

/* A JSON writer, the caller's own: each output quotes strings as it needs (a terminal's JSON, a
 * string inside an HTML page). */
typedef struct ms_json_writer_s {
  void *ctx;
  void (*lit)(void *ctx, const char *text); /* JSON text, written as it is */
  void (*str)(void *ctx, const char *s);    /* a string value: quoted and escaped */
  void (*u64)(void *ctx, uint64_t v);
  void (*i64)(void *ctx, int64_t v);
  /* the label of one of the snapshot's stacks into buf (top_by_stack's keys); NULL: the member
   * top_by_stack is left out */
  void (*stack_label)(void *ctx, uint32_t stack, char *buf, size_t cap);
} ms_json_writer_t;

/* ms_explain_write_json's flags. */
enum {
  /* also the viewer's members: capacity_oom_entry, replayed, replay_note and series */
  MS_EXPLAIN_JSON_VIEWER = 1u << 0
};

/* Writes answer x as the members of a JSON object, `"device": N, "moment": ...` through `"hint":
 * ...`, separated by ", " (the caller writes the braces and any members of its own before them).
 * Absent values are null; docs/explain.md names every member. One writer for `memsnap explain
 * --json` and the viewer's Explain panel, so that the two read the same fields. */
MS_API void ms_explain_write_json(const ms_explain_t *x, const ms_json_writer_t *w,
                                  unsigned flags);

MS_EXTERN_C_END

#endif /* MEMSNAP_EXPLAIN_H */
