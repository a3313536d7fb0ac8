/* SPDX-License-Identifier: MIT
 * memsnap: the snapshot data model.
 *
 * A snapshot is an immutable picture of one process's device memory: its segments and their
 * blocks, the stacks that allocated them, the per-device trace of recent allocator events, the
 * allocator's settings and statistics. It can hold everything PyTorch's
 * torch.cuda.memory._snapshot() returns, in every era (see docs/snapshot-format.md and
 * docs/pytorch.md), plus memsnap's additions (statistics, capacity, process identity).
 *
 * Vocabulary and invariants:
 *  - All arrays are owned by the snapshot and live until ms_snapshot_free().
 *  - Strings are NUL-terminated UTF-8 (as found in the input; readers do not validate UTF-8), never
 *    NULL: an absent string is "".
 *  - Frames are stored once in `frames`; a stack is a run of frame indices in `stack_frames`,
 *    innermost first (index 0 is the innermost call, as in PyTorch). Every reference to a stack is
 *    a uint32_t index into `stacks`; MS_SNAP_NO_STACK means "no stack recorded", which is distinct
 *    from a recorded empty stack.
 *  - Segment i's blocks are blocks[segments[i].first_block ..+ segments[i].nblocks), in address
 *    order. Block i's legacy history entries are history[blocks[i].first_history ..+ nhistory),
 *    newest first (PyTorch 2.0's `history` list).
 *  - Device d's trace is trace[devices[d].first_trace ..+ ntrace], oldest first.
 *  - The `present` bit sets say which optional keys the source had, so that a writer can reproduce
 *    the source's era faithfully (a 2.0 pickle has no block `address`; a 2.1 one no `time_us`).
 *
 * Thread-safety: a snapshot is immutable after it is built; any number of threads may read it.
 */
#ifndef MEMSNAP_SNAPSHOT_H
#define MEMSNAP_SNAPSHOT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"

MS_EXTERN_C_BEGIN

#define MS_SNAP_NO_STACK UINT32_MAX

/* Where a snapshot came from. */
typedef enum ms_snap_origin {
  MS_SNAP_ORIGIN_MEMSNAP = 0, /* taken by memsnap's allocator */
  MS_SNAP_ORIGIN_TORCH_LIST,  /* PyTorch before 2.0: a bare list of segments */
  MS_SNAP_ORIGIN_TORCH_DICT,  /* PyTorch 2.0 or later: a dict with "segments" */
} ms_snap_origin;

typedef enum ms_block_state {
  MS_BLOCK_INACTIVE = 0,          /* "inactive": free, cached */
  MS_BLOCK_ACTIVE_ALLOCATED,      /* "active_allocated" */
  MS_BLOCK_ACTIVE_PENDING_FREE,   /* "active_pending_free": freed, waiting on stream events */
  MS_BLOCK_STATE_OTHER,           /* any other string; kept in ms_snap_block_t.state_name */
} ms_block_state;

/* Trace actions, with PyTorch's strings (ms_trace_action_name). */
typedef enum ms_trace_action {
  MS_TRACE_ALLOC = 0,      /* "alloc" */
  MS_TRACE_FREE_REQUESTED, /* "free_requested" */
  MS_TRACE_FREE_COMPLETED, /* "free_completed" */
  MS_TRACE_SEGMENT_ALLOC,  /* "segment_alloc" */
  MS_TRACE_SEGMENT_FREE,   /* "segment_free" */
  MS_TRACE_SEGMENT_MAP,    /* "segment_map" */
  MS_TRACE_SEGMENT_UNMAP,  /* "segment_unmap" */
  MS_TRACE_SNAPSHOT,       /* "snapshot" */
  MS_TRACE_OOM,            /* "oom": addr holds the device's free bytes (device_free) */
  MS_TRACE_ANNOTATE,       /* "annotate" (2026) */
  MS_TRACE_OTHER,          /* any other string; kept in ms_snap_trace_t.action_name */
  MS_TRACE_ACTION_COUNT
} ms_trace_action;

/* @return PyTorch's string for a (known) action; "?" otherwise. */
MS_API const char *ms_trace_action_name(ms_trace_action a);
/* @return the action for PyTorch's string, MS_TRACE_OTHER when unknown. */
MS_API ms_trace_action ms_trace_action_parse(const char *s);
/* @return PyTorch's string for a (known) block state; "?" otherwise. */
MS_API const char *ms_block_state_name(ms_block_state s);
/* @return the state for PyTorch's string, MS_BLOCK_STATE_OTHER when unknown. */
MS_API ms_block_state ms_block_state_parse(const char *s);

typedef struct ms_snap_frame_s {
  const char *name;     /* function name, e.g. "forward" or "at::native::foo()" */
  const char *filename; /* source file, "" or "??" when unknown */
  int64_t line;         /* line number, 0 when unknown */
} ms_snap_frame_t;

typedef struct ms_snap_stack_s {
  uint32_t first;   /* index of the first (innermost) entry in ms_snapshot_t.stack_frames */
  uint32_t nframes; /* number of frames */
} ms_snap_stack_t;

/* Legacy (PyTorch 2.0) per-block history entry. */
enum {
  MS_HIST_HAS_FRAMES = 1u << 0, /* the entry had a "frames" key */
};
typedef struct ms_snap_history_s {
  uint64_t addr;      /* address of that allocation */
  uint64_t real_size; /* the user's size */
  uint32_t stack;     /* its frames, or MS_SNAP_NO_STACK */
  uint32_t present;   /* MS_HIST_* */
} ms_snap_history_t;

enum {
  MS_BLOCK_HAS_ADDRESS = 1u << 0,        /* "address" key present (2.1+) */
  MS_BLOCK_HAS_REQUESTED_SIZE = 1u << 1, /* "requested_size" key present */
  MS_BLOCK_HAS_FRAMES = 1u << 2,         /* "frames" key present (2.1+) */
  MS_BLOCK_HAS_HISTORY = 1u << 3,        /* "history" key present (2.0) */
};
typedef struct ms_snap_block_s {
  uint64_t address;        /* always filled: computed from the segment when absent */
  uint64_t size;           /* bytes */
  uint64_t requested_size; /* the user's size of the (last) allocation; may be stale if inactive */
  ms_block_state state;
  const char *state_name;  /* the source's string for the state */
  uint32_t stack;          /* allocation stack (frames era), or MS_SNAP_NO_STACK */
  uint32_t first_history;  /* legacy history entries, newest first */
  uint32_t nhistory;
  uint32_t present;        /* MS_BLOCK_HAS_* */
} ms_snap_block_t;

enum {
  MS_SEG_HAS_FRAMES = 1u << 0,        /* "frames" key present */
  MS_SEG_HAS_POOL_ID = 1u << 1,       /* "segment_pool_id" key present */
  MS_SEG_HAS_EXPANDABLE = 1u << 2,    /* "is_expandable" key present */
  MS_SEG_HAS_REQUESTED_SIZE = 1u << 3, /* "requested_size" key present */
  MS_SEG_HAS_SEGMENT_TYPE = 1u << 4,  /* "segment_type" key present */
};
typedef struct ms_snap_segment_s {
  int64_t device;          /* device index */
  uint64_t address;        /* start of the segment */
  uint64_t total_size;     /* bytes; equals the sum of its blocks' sizes */
  uint64_t allocated_size; /* bytes in active_allocated blocks */
  uint64_t active_size;    /* bytes in active blocks (allocated or pending free) */
  uint64_t requested_size; /* sum of requested_size over active blocks */
  uint64_t stream;         /* raw stream handle */
  bool is_large;           /* segment_type "large" (true) or "small" */
  bool is_expandable;
  int64_t pool_id[2];      /* segment_pool_id; (0,0) = default pool */
  uint32_t stack;          /* stack of the segment allocation, or MS_SNAP_NO_STACK */
  uint32_t first_block;
  uint32_t nblocks;
  uint32_t present;        /* MS_SEG_HAS_* */
} ms_snap_segment_t;

enum {
  MS_TRACE_HAS_FRAMES = 1u << 0,
  MS_TRACE_HAS_TIME = 1u << 1,            /* "time_us" */
  MS_TRACE_HAS_COMPILE_CONTEXT = 1u << 2, /* "compile_context" */
  MS_TRACE_HAS_USER_METADATA = 1u << 3,   /* "user_metadata" */
  MS_TRACE_HAS_STREAM = 1u << 4,          /* "stream" */
  MS_TRACE_HAS_POOL_ID = 1u << 5,         /* "pool_id" / mempool */
  /* The source entry had neither "addr" nor "device_free" (addr is then 0): an `oom` entry of a
   * hostile or damaged pickle whose device_free is unknown rather than 0. Only the pickle reader
   * sets it; the pickle writer then leaves the key out. */
  MS_TRACE_NO_ADDR = 1u << 6,
  MS_TRACE_HAS_CATEGORY = 1u << 7,        /* "category" (a snapshot made from the profiler) */
};
/* The fields of a trace entry that most entries leave at their defaults, or that few entries
 * differ in (the stream), stored once per distinct combination and shared (a 5 M-entry trace's
 * entries are 40 bytes instead of 96). */
typedef struct ms_snap_trace_extra_s {
  const char *action_name;     /* the source's string for the action; NULL: the action's own
                                  name (ms_trace_action_name), as it is for every known action */
  const char *compile_context; /* "" when absent */
  const char *user_metadata;   /* "" when absent */
  int64_t pool_id[2];          /* private pool, when present */
  const char *category;        /* "" when absent: the memory category PyTorch's profiler gave an
                                  allocation (`_memory_viz.py`'s conversion of a profile to a
                                  snapshot writes it on `alloc` entries: "activation", ...) */
  uint64_t stream;             /* the raw stream handle (0: the default stream); read it through
                                  ms_snap_trace_stream() */
} ms_snap_trace_extra_t;

typedef struct ms_snap_trace_s {
  uint64_t addr;               /* address; for MS_TRACE_OOM the device's free bytes */
  uint64_t size;               /* bytes (see PyTorch's table per action) */
  int64_t time_us;             /* unix time in microseconds, when present */
  const ms_snap_trace_extra_t *extra; /* NULL: every extra field at its default; read them
                                  through ms_snap_trace_action_name() and its neighbours */
  uint32_t stack;              /* MS_SNAP_NO_STACK when the entry had no frames */
  uint16_t present;            /* MS_TRACE_HAS_* */
  uint8_t action;              /* ms_trace_action */
} ms_snap_trace_t;

/* The source's string for t's action (PyTorch's name for a known action). */
static inline const char *ms_snap_trace_action_name(const ms_snap_trace_t *t) {
  return t->extra && t->extra->action_name ? t->extra->action_name
                                           : ms_trace_action_name((ms_trace_action)t->action);
}
/* t's compile_context / user_metadata, "" when absent. */
static inline const char *ms_snap_trace_compile_context(const ms_snap_trace_t *t) {
  return t->extra ? t->extra->compile_context : "";
}
static inline const char *ms_snap_trace_user_metadata(const ms_snap_trace_t *t) {
  return t->extra ? t->extra->user_metadata : "";
}
/* t's "category", "" when absent. */
static inline const char *ms_snap_trace_category(const ms_snap_trace_t *t) {
  return t->extra && t->extra->category ? t->extra->category : "";
}
/* t's raw stream handle, 0 for the default stream. */
static inline uint64_t ms_snap_trace_stream(const ms_snap_trace_t *t) {
  return t->extra ? t->extra->stream : 0;
}
/* t's private pool, (0, 0) when none. */
static inline int64_t ms_snap_trace_pool(const ms_snap_trace_t *t, int k) {
  return t->extra ? t->extra->pool_id[k] : 0;
}

/* A generic value, used for allocator_settings (whose keys vary across versions) and for the
 * flat statistics. Maps hold their entries as a contiguous run of ms_snap_kv_t. */
typedef enum ms_snap_value_kind {
  MS_SNAP_VAL_NONE = 0,
  MS_SNAP_VAL_BOOL,
  MS_SNAP_VAL_INT,
  MS_SNAP_VAL_FLOAT,
  MS_SNAP_VAL_STR,
  MS_SNAP_VAL_MAP, /* entries: settings[first ..+ count] */
} ms_snap_value_kind;

typedef struct ms_snap_kv_s {
  const char *key;
  ms_snap_value_kind kind;
  bool b;
  int64_t i;
  double f;
  const char *s;
  uint32_t first; /* MS_SNAP_VAL_MAP: first entry in ms_snapshot_t.settings */
  uint32_t count; /* MS_SNAP_VAL_MAP: number of entries */
} ms_snap_kv_t;

typedef struct ms_snap_annotation_s {
  const char *name;  /* e.g. "Optimizer.step#AdamW.step" */
  const char *stage; /* "START" or "END" */
  int64_t device;
  int64_t time_us;
} ms_snap_annotation_t;

enum {
  MS_DEV_HAS_CAPACITY = 1u << 0, /* capacity known (memsnap snapshots) */
  MS_DEV_HAS_STATS = 1u << 1,    /* stats known (memsnap snapshots) */
};
typedef struct ms_snap_device_s {
  uint32_t first_trace;    /* this device's trace entries, oldest first */
  uint32_t ntrace;
  uint64_t trace_dropped;  /* entries lost because the ring buffer wrapped */
  uint64_t capacity;       /* device total bytes, when MS_DEV_HAS_CAPACITY */
  uint32_t first_stat;     /* flat statistics (PyTorch's key names) in ms_snapshot_t.stats */
  uint32_t nstats;
  uint32_t present;        /* MS_DEV_HAS_* */
} ms_snap_device_t;

enum {
  MS_SNAP_HAS_DEVICE_TRACES = 1u << 0,  /* "device_traces" key present */
  MS_SNAP_HAS_SETTINGS = 1u << 1,       /* "allocator_settings" key present */
  MS_SNAP_HAS_ANNOTATIONS = 1u << 2,    /* "external_annotations" key present */
  MS_SNAP_HAS_PROCESS = 1u << 3,        /* pid / host / time_us known */
  MS_SNAP_HAS_RANK = 1u << 4,           /* rank known */
  /* Loaded without its trace (MS_LOAD_NO_TRACE): the devices' trace entries were left out, so
   * ntrace is 0 whatever the file holds. Writers refuse such a snapshot (MS_EINVAL). */
  MS_SNAP_TRACE_SKIPPED = 1u << 5,
  /* Loaded with MS_LOAD_NO_TRACE_STACKS or MS_LOAD_NO_FREE_STACKS: trace entries of the actions
   * they name have no stack whatever the file holds. Writers refuse such a snapshot (MS_EINVAL). */
  MS_SNAP_TRACE_STACKS_SKIPPED = 1u << 6,
};

typedef struct ms_snapshot_s {
  ms_snap_origin origin;
  uint32_t present;                 /* MS_SNAP_HAS_* */

  ms_snap_segment_t *segments;      /* sorted as the source had them (memsnap: by address) */
  size_t nsegments;
  ms_snap_block_t *blocks;
  size_t nblocks;
  ms_snap_history_t *history;       /* legacy per-block history */
  size_t nhistory;

  ms_snap_device_t *devices;        /* one per entry of device_traces (or per device seen) */
  size_t ndevices;
  ms_snap_trace_t *trace;
  size_t ntrace;

  ms_snap_frame_t *frames;
  size_t nframes;
  ms_snap_stack_t *stacks;
  size_t nstacks;
  uint32_t *stack_frames;           /* frame indices, see ms_snap_stack_t, 4 bytes each; NULL
                                       when stack_frames16 holds them: read them through
                                       ms_snap_stack_frame() */
  uint16_t *stack_frames16;         /* the same, 2 bytes each, when the snapshot has fewer than
                                       65,536 frames (as nearly all do): half the model's largest
                                       table. Exactly one of the two is set when there are any. */
  size_t nstack_frames;

  ms_snap_kv_t *settings;           /* allocator_settings: top-level entries first */
  size_t nsettings_top;             /* number of top-level entries (settings[0 .. nsettings_top)) */
  size_t nsettings;                 /* total, including nested map entries */

  ms_snap_kv_t *stats;              /* flat statistics of all devices, see ms_snap_device_t */
  size_t nstats;

  ms_snap_annotation_t *annotations;
  size_t nannotations;

  /* memsnap's additions (MS_SNAP_HAS_PROCESS / MS_SNAP_HAS_RANK) */
  int64_t pid;
  const char *hostname;
  int64_t rank;
  int64_t time_us;                  /* when the snapshot was taken, unix microseconds */

  void *impl_;                      /* owned storage; do not touch */
} ms_snapshot_t;


/* Frees a snapshot and everything it owns. Accepts NULL. */
MS_API void ms_snapshot_free(ms_snapshot_t *snap);

/* Convenience accessors (pre: indices in range). */
/* Entry i of the snapshot's stack_frames (a frame index), whichever width it is stored in:
 * stack st's frames are ms_snap_frame_index(s, st->first + k) for k < st->nframes. */
static inline uint32_t ms_snap_frame_index(const ms_snapshot_t *s, size_t i) {
  return s->stack_frames16 ? s->stack_frames16[i] : s->stack_frames[i];
}
static inline const ms_snap_block_t *ms_snap_segment_block(const ms_snapshot_t *s,
                                                           const ms_snap_segment_t *seg,
                                                           size_t i) {
  return &s->blocks[seg->first_block + i];
}
static inline const ms_snap_frame_t *ms_snap_stack_frame(const ms_snapshot_t *s, uint32_t stack,
                                                         size_t i) {
  return &s->frames[ms_snap_frame_index(s, s->stacks[stack].first + i)];
}
static inline uint32_t ms_snap_stack_depth(const ms_snapshot_t *s, uint32_t stack) {
  return stack == MS_SNAP_NO_STACK ? 0 : s->stacks[stack].nframes;
}

MS_EXTERN_C_END

#endif /* MEMSNAP_SNAPSHOT_H */
