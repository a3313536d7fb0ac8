/* SPDX-License-Identifier: MIT
 * memsnap core: internals of the streaming reader of PyTorch snapshot pickles (memsnap/pickle.h,
 * issue #4), shared by its files:
 *
 *   pickle_vm.c       the pickle VM: input buffer, opcode decoding and the run loop, the value
 *                     stack, marks and memo; the entry point ms__pickle_read()
 *   pickle_objects.c  the values it builds: containers (dicts, lists, sets) born with a role
 *                     guessed from where they will be stored, tuples, strings copied into the
 *                     builder's arena; key paths and type names for messages
 *   pickle_schema.c   PyTorch's snapshot dicts mapped onto memsnap's model: records born for
 *                     dicts of a record role, items stored into typed fields (segments, blocks,
 *                     history, device_traces, frames, settings, annotations), frames lists
 *                     interned as stacks, and the checks after STOP
 *   pickle_frames.c   the hot paths that write a frames list's frame indices straight to the
 *                     builder's stack tail (a run of memo gets, or APPENDS of interned frames)
 *   pickle_entry.c    a kept trace's entry read whole in one loop (scanned, then applied in the
 *                     general path's order), its dict created without rd_place
 *   pickle_drop.c     which trace entries' stacks a read may leave out (MS_LOAD_NO_FREE_STACKS:
 *                     frees paired with their alloc as the time index pairs them)
 *   pickle_retire.c   the objects of trace entries and frames lists that nothing can name again,
 *                     freed for the next containers (a memoized frames list kept in its memo
 *                     entry, made again by a get)
 *
 * Vocabulary. The VM never builds a generic object tree. A value (rd_val_t) is a scalar, a string
 * in the builder's arena, or an object (rd_obj_t: a dict, list or set) with a role (R_*): the
 * part of the snapshot schema it stands for, guessed when the container is created from the
 * shape of the stack and the key it will be stored under (K_*), and verified when it is stored
 * into its real parent. A dict of a record role (a segment, a block, a trace entry...) is a
 * record in the snapshot builder from birth (obj->ref); its items go straight into the record's
 * fields. Containers of the trace skipped by MS_LOAD_NO_TRACE are V_SKIP values with no object.
 *
 * Speed: the run loop (pickle_vm.c) calls across files only where the one-file reader already
 * made a real call (creating a container, storing a batch of items, a string opcode); the
 * helpers on every opcode's path (rd_take, rd_push, the mark position, the key lookup, the role
 * tables) are static inline here.
 *
 * Names: rd_ is the reader's private vocabulary (types, static and inline helpers); functions
 * called from another of the reader's files are ms__pickle_*.
 */
#ifndef MEMSNAP_LIB_SNAPSHOT_PICKLE_INTERNAL_H
#define MEMSNAP_LIB_SNAPSHOT_PICKLE_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/pickle.h"
#include "model/snapbuild.h"
#include "snapshot/deferred.h"

#define RD_BUF_CAP (1u << 17)      /* input buffer (128 KiB), once more than RD_BUF_MIN came */
#define RD_BUF_MIN (1u << 13)      /* the first 8 KiB: small inputs stay cheap */
#define RD_MAX_STACK (1u << 18)    /* values on the stack; also the number of open marks */
#define RD_MEMO_SLACK (1u << 16)   /* how far beyond the memo's end a PUT may store */
#define RD_MAX_STR 0xfffffffeu     /* longest string or bytes value */
#define RD_MAX_LONG (1u << 16)     /* longest LONG4 integer, in bytes */
#define RD_MAX_SETTINGS_DEPTH 1 /* allocator_settings maps kept: one level (the builder stores a
                                   * map's entries after the map, so deeper ones are dropped) */
#define RD_NO_OBJ UINT32_MAX
#define RD_NO_FRAME UINT64_MAX

/* ---- values ---------------------------------------------------------------------------------- */

enum rd_vtype {
  V_UNSET = 0, /* memo hole */
  V_NONE,
  V_BOOL,
  V_INT,   /* fits int64 */
  V_UINT,  /* 2^63 .. 2^64-1 */
  V_BIG,   /* does not fit 64 bits; value not kept */
  V_FLOAT,
  V_STR,   /* v.s: NUL-terminated copy in the builder's arena, len bytes */
  V_BYTES, /* content not kept */
  V_OBJ,   /* v.obj: a dict, list or set in objs */
  V_PAIR,  /* a tuple of two ints: v.pair indexes pairs */
  V_TUPLE, /* any other tuple; content not kept */
  V_FSET,  /* frozenset; content not kept */
  V_SKIP,  /* a dict, list or set of the skipped trace (MS_LOAD_NO_TRACE): v.kind says which;
              its items are parsed and dropped, and it has no entry in objs */
};

/* rd_t.memo_tag of a V_SKIP value (its kind in the low bits), which needs no rd_val_t */
#define RD_TAG_SKIP 0x80u
/* rd_t.memo_tag of a trace entry's frames list whose objects were freed (pickle_retire.c): its
 * memo_obj is the entry's trace record, the low bits say which flags they had (RD_TF_*); a get
 * makes the objects again (ms__pickle_revive) */
#define RD_TAG_TFRAMES 0x40u
/* rd_t.memo_tag of a memoized trace entry dict freed with its frames list (Python's pickler
 * memoizes every dict): the same record and flags as RD_TAG_TFRAMES, a get makes both again */
#define RD_TAG_TENTRY 0x48u
enum {
  RD_TF_LIST_DROPPED = 1u << 0,  /* the list had OF_DROPPED */
  RD_TF_ENTRY_ACCOUNTED = 1u << 1, /* the entry had OF_ACCOUNTED */
  RD_TF_ENTRY_DROPPED = 1u << 2, /* the entry had OF_DROPPED */
};
static inline bool rd_tag_tframes(uint8_t tag) {
  return (tag & ~7u) == RD_TAG_TFRAMES;
}
static inline bool rd_tag_tentry(uint8_t tag) {
  return (tag & ~7u) == RD_TAG_TENTRY;
}
/* A freed frames list or entry dict (RD_TAG_TFRAMES, RD_TAG_TENTRY): a get makes it again. */
static inline bool rd_tag_freed(uint8_t tag) {
  return (tag & ~15u) == RD_TAG_TFRAMES;
}

/* rd_val_t.flags */
enum {
  VF_UNHASHABLE = 1u << 0, /* a bytearray, or a tuple that holds a dict, list, set or such a
                              tuple: Python refuses it as a dict key or set item */
};

typedef struct rd_val_s {
  uint8_t t;
  uint8_t key; /* V_STR: the schema key it spells (K_*), K_UNKNOWN otherwise */
  uint8_t kind; /* V_SKIP: O_DICT, O_LIST or O_SET */
  uint8_t flags; /* VF_* */
  uint32_t len;
  union {
    int64_t i;
    uint64_t u;
    double f;
    const char *s;
    uint32_t obj;
    uint32_t pair;
  } v;
} rd_val_t;

/* ---- schema keys and roles ------------------------------------------------------------------- */

#define RD_KEYS(XX)                                                                            \
  XX(SEGMENTS, "segments") XX(DEVICE_TRACES, "device_traces")                                  \
  XX(ALLOCATOR_SETTINGS, "allocator_settings") XX(EXTERNAL_ANNOTATIONS, "external_annotations") \
  XX(DEVICE, "device") XX(ADDRESS, "address") XX(TOTAL_SIZE, "total_size")                      \
  XX(ALLOCATED_SIZE, "allocated_size") XX(ACTIVE_SIZE, "active_size")                           \
  XX(REQUESTED_SIZE, "requested_size") XX(STREAM, "stream") XX(SEGMENT_TYPE, "segment_type")    \
  XX(SEGMENT_POOL_ID, "segment_pool_id") XX(IS_EXPANDABLE, "is_expandable")                    \
  XX(FRAMES, "frames") XX(BLOCKS, "blocks") XX(SIZE, "size") XX(STATE, "state")                 \
  XX(HISTORY, "history") XX(ADDR, "addr") XX(REAL_SIZE, "real_size") XX(NAME, "name")           \
  XX(FILENAME, "filename") XX(LINE, "line") XX(ACTION, "action") XX(DEVICE_FREE, "device_free") \
  XX(TIME_US, "time_us") XX(COMPILE_CONTEXT, "compile_context")                                 \
  XX(USER_METADATA, "user_metadata") XX(CATEGORY, "category") XX(POOL_ID, "pool_id") XX(STAGE, "stage")

enum rd_key {
  K_UNKNOWN = 0,
#define RD_KEY_ENUM(id, s) K_##id,
  RD_KEYS(RD_KEY_ENUM)
#undef RD_KEY_ENUM
  K_COUNT
};

/* The value of a container (V_OBJ) whose object is obj: every such value is this one, so that
 * the memo keeps only obj (rd_t.memo_obj). */
static inline rd_val_t rd_obj_val(uint32_t obj) {
  return (rd_val_t){V_OBJ, K_UNKNOWN, 0, 0, 0, {.obj = obj}};
}

/* Each key's text ("?" for K_UNKNOWN) and length: tables here, not in one file, so that the key
 * lookup of every string opcode is compiled against constants as before the split. */
static const char *const rd_key_names[K_COUNT] = {
    [K_UNKNOWN] = "?",
#define RD_KEY_NAME(id, s) [K_##id] = s,
    RD_KEYS(RD_KEY_NAME)
#undef RD_KEY_NAME
};

static const uint8_t rd_key_lens[K_COUNT] = {
    [K_UNKNOWN] = 1,
#define RD_KEY_LEN(id, s) [K_##id] = sizeof(s) - 1,
    RD_KEYS(RD_KEY_LEN)
#undef RD_KEY_LEN
};

/* The key a string spells, K_UNKNOWN for any other string (once per string opcode). */
static inline uint8_t rd_key_lookup(const char *s, size_t len) {
  if (len < 4 || len > 20) return K_UNKNOWN;
  for (int k = 1; k < K_COUNT; k++)
    if (rd_key_lens[k] == len && rd_key_names[k][0] == s[0] &&
        memcmp(rd_key_names[k], s, len) == 0)
      return (uint8_t)k;
  return K_UNKNOWN;
}

enum rd_kind { O_DICT = 0, O_LIST, O_SET };

enum rd_role {
  R_NONE = 0, /* not part of the schema: contents parsed, then ignored */
  R_ROOT,     /* the top-level dict */
  R_SEGMENTS, R_SEGMENT, R_BLOCKS, R_BLOCK, R_HISTORY, R_HIST, R_FRAMES, R_FRAME,
  R_DEVTRACES, R_TRACES, R_TRACE, R_SETTINGS, R_SETMAP, R_ANNOTS, R_ANNOT,
  R_COUNT
};

/* The kind of container each role is. */
static const uint8_t rd_role_kind[R_COUNT] = {
    [R_NONE] = O_DICT,     [R_ROOT] = O_DICT,     [R_SEGMENTS] = O_LIST, [R_SEGMENT] = O_DICT,
    [R_BLOCKS] = O_LIST,   [R_BLOCK] = O_DICT,    [R_HISTORY] = O_LIST,  [R_HIST] = O_DICT,
    [R_FRAMES] = O_LIST,   [R_FRAME] = O_DICT,    [R_DEVTRACES] = O_LIST, [R_TRACES] = O_LIST,
    [R_TRACE] = O_DICT,    [R_SETTINGS] = O_DICT, [R_SETMAP] = O_DICT,   [R_ANNOTS] = O_LIST,
    [R_ANNOT] = O_DICT,
};

/* The role of a dict's value under key k (R_NONE: ignored). */
static inline uint8_t rd_dict_child(uint8_t role, uint8_t k) {
  switch (role) {
  case R_ROOT:
    switch (k) {
    case K_SEGMENTS: return R_SEGMENTS;
    case K_DEVICE_TRACES: return R_DEVTRACES;
    case K_ALLOCATOR_SETTINGS: return R_SETTINGS;
    case K_EXTERNAL_ANNOTATIONS: return R_ANNOTS;
    default: return R_NONE;
    }
  case R_SEGMENT:
    return k == K_FRAMES ? R_FRAMES : k == K_BLOCKS ? R_BLOCKS : R_NONE;
  case R_BLOCK:
    return k == K_FRAMES ? R_FRAMES : k == K_HISTORY ? R_HISTORY : R_NONE;
  case R_HIST:
  case R_TRACE:
    return k == K_FRAMES ? R_FRAMES : R_NONE;
  case R_SETTINGS:
  case R_SETMAP:
    return R_SETMAP; /* only when the value is a dict; scalars are settings too */
  default:
    return R_NONE;
  }
}

/* The role of a list's elements. */
static inline uint8_t rd_list_child(uint8_t role) {
  switch (role) {
  case R_SEGMENTS: return R_SEGMENT;
  case R_BLOCKS: return R_BLOCK;
  case R_HISTORY: return R_HIST;
  case R_FRAMES: return R_FRAME;
  case R_DEVTRACES: return R_TRACES;
  case R_TRACES: return R_TRACE;
  case R_ANNOTS: return R_ANNOT;
  default: return R_NONE;
  }
}

/* ---- containers and the reader --------------------------------------------------------------- */

enum {
  OF_USED = 1u << 0,     /* stored into its parent (or memo-got and stored again) */
  OF_SEALED = 1u << 1,   /* frames list: ref is its interned stack */
  OF_INTERNED = 1u << 2, /* frame dict: ref is its interned frame */
  OF_PENDING = 1u << 3,  /* frames list of a trace entry, queued for interning (rd_pend_t) */
  OF_DROPPED = 1u << 4,  /* frames list whose stack was left out (MS_LOAD_NO_*_STACKS), or a
                            trace entry with such a list */
  OF_ACCOUNTED = 1u << 5, /* trace entry accounted for by pickle_drop.c */
  /* For pickle_retire.c, which frees what can no longer be named (issue #33): */
  OF_ONE = 1u << 6,  /* a list whose parent is a dict: memoized at one index, held in idx; a
                        trace entry dict: the parent of one container (its frames list, held in
                        count once it is stored there) */
  OF_KEEP = 1u << 7, /* never freed: memoized twice, or a dict memoized that is no trace entry,
                        or the parent of more than the one container OF_ONE stands for */
};

typedef struct rd_obj_s {
  uint8_t kind;    /* O_* */
  uint8_t role;    /* R_* */
  uint8_t flags;   /* OF_* */
  uint8_t key;     /* key it sits under in a dict parent (for paths) */
  uint32_t parent; /* the container it was created for, RD_NO_OBJ for the root */
  union {
    uint32_t idx; /* its index in a list parent (for paths) */
    uint32_t aux; /* R_SETMAP, whose parent is a dict: nesting depth */
    uint32_t memo; /* a list with OF_ONE (its parent a dict, so no index): its memo index */
  };
  uint32_t ref;    /* record index in the builder; first record of a list; frame/stack index;
                      pending-frame slot; first child of a settings map; next free object */
  uint32_t count;  /* items stored so far; a trace entry dict (which counts none): its frames
                      list + 1 once that list (its child, or one made again from the memo) is
                      stored as its "frames" (rd_items) */
} rd_obj_t;
/* 20 bytes: a 1 GB trace has 10 M of them (its entries and their frames lists), of which a read
 * keeps only those that can still be named (pickle_retire.c) */
_Static_assert(sizeof(rd_obj_t) == 20, "rd_obj_t stays small");

/* The items an object holds, as rd_place weighs them (a trace entry's count holds its frames
 * list instead: a dict of a trace entry counts no items). */
static inline uint32_t rd_items(const rd_obj_t *o) {
  return o->role == R_TRACE ? 0 : o->count;
}

/* A trace entry's frames list whose stack is interned later (ms__pickle_flush), so that the
 * intern table's slot, prefetched now, is in cache by then. Its frame indices stay at the end of
 * the builder's stack_frames, after those of the lists queued before it. */
#define RD_PENDING 16
typedef struct rd_pend_s {
  uint32_t list;  /* the frames list (OF_PENDING) */
  uint32_t rec;   /* its trace record */
  uint32_t n;     /* its frame indices */
  uint64_t hash;  /* ms__snapbuild_stack_hash of them */
} rd_pend_t;

/* The frame cache of ms__pickle_frames_run (pickle_frames.c): by memo index (direct-mapped on its
 * low bits), the frame of a memo entry found to be an interned frame dict. Such an entry names
 * that frame until a PUT stores another value at its index (rd_memo_put drops the slot then):
 * an interned frame dict is closed to changes and, memoized, is never freed. */
#define RD_FCACHE_SLOTS 8192u /* 64 KiB: a real trace's call sites, and most of the synthetic's */
typedef struct rd_fslot_s {
  uint32_t idx; /* memo index; UINT32_MAX: empty (no memo index reaches it) */
  uint32_t ref; /* its frame in the builder */
} rd_fslot_t;

/* A frame dict being filled, before it is interned. */
typedef struct rd_pframe_s {
  const char *name, *file;
  int64_t line;
  uint32_t next_free;
} rd_pframe_t;

/* The allocs open in the trace read so far, per device list (pickle_drop.c). */
typedef struct rd_drop_slot_s {
  uint64_t addr;
  uint32_t list; /* the device's list of entries (an object) */
  uint32_t used;
} rd_drop_slot_t;
typedef struct rd_drop_set_s {
  rd_drop_slot_t *slot;
  size_t cap, len;
  bool accounted;    /* an entry was accounted (last_rec is set) */
  uint32_t last_rec; /* the trace record accounted last */
} rd_drop_set_t;

#define RD_ACT_CACHE 4

typedef struct rd_s {
  /* input */
  ms_source_t *src;
  int map_fd;          /* >= 0: the input is this file, read through mapped windows (buf is one) */
  uint64_t map_size;   /* its size when the read began */
  void *map;           /* the current window's mapping (NULL before the first) */
  size_t map_len;      /* its length */
  char *buf;
  size_t pos, len, cap;
  uint64_t base; /* file offset of buf[0] */
  size_t lim;    /* rd_take's fast path reads below buf+lim: len, or the end of the current
                    frame when it lies in the buffer (reads that reach it take the slow path,
                    which checks them against the frame) */
  uint64_t frame_end; /* file offset where the current FRAME's bytes end; RD_NO_FRAME */
  uint64_t frame_at;  /* file offset of that FRAME opcode */
  uint64_t frame_len; /* the length it declares */
  bool eof;
  uint64_t op_off;
  MS_VEC(char) scratch;
  /* VM */
  MS_VEC(rd_val_t) st;
  MS_VEC(uint32_t) marks;
  MS_VEC(rd_val_t) memo; /* the memo's values: memo.ptr[i] is written only where memo_tag[i]
                            says so (RD_TAG_*); its pages for skipped values and containers stay
                            untouched */
  MS_VEC(uint32_t) memo_obj; /* the memo's containers: memo_obj.ptr[i] is the object of entry i
                                when memo_tag[i] is V_OBJ, the trace record of a freed frames
                                list's entry when it is RD_TAG_TFRAMES (a memo of a long trace is
                                mostly its frames lists or entries: 4 bytes each instead of 16) */
  MS_VEC(uint8_t) memo_tag; /* one byte an entry: 0 unset, RD_TAG_SKIP | kind for a V_SKIP value,
                               V_OBJ for a container (its object in memo_obj.ptr), RD_TAG_TFRAMES |
                               RD_TF_* for a freed frames list and RD_TAG_TENTRY | RD_TF_* for a
                               freed entry dict (its entry's record in memo_obj.ptr), else the
                               value's type (V_*), its value in memo.ptr */
  bool memo_holes;     /* a PUT beyond the memo's end left unset entries below it */
  MS_VEC(rd_obj_t) objs; /* grows only when free_obj is empty: its length is the most objects
                            alive at once */
  uint32_t free_obj;     /* the first freed object (RD_NO_OBJ: none), linked through ref */
  MS_VEC(uint32_t) tf_count; /* by trace record: the items of its freed frames list (written
                                only for those) */
  MS_VEC(uint32_t) te_memo; /* by trace record: 1 + the memo index its entry dict was first put
                               at (0: never; made only when a trace dict is memoized) */
  MS_VEC(uint8_t) te_fdelta; /* by trace record, for a freed memoized entry dict: its frames
                                list's memo index minus its own (written only for those) */
  MS_VEC(uint32_t) tlists;   /* the device lists of trace entries, by their first record
                                (rising); tlists_broken: one came out of order, and no more are
                                listed */
  bool tlists_broken;
  size_t revived; /* frames lists made again from the memo (ms__pickle_revive) */
  size_t whole;   /* trace entries read whole (pickle_entry.c) */
  MS_VEC(rd_pframe_t) pframes;
  uint32_t pframe_free;
  MS_VEC(int64_t) pairs;
  size_t fbuf_len;     /* frame indices of the frames list being filled, written in place at the
                           builder's stack tail (ms__snapbuild_stack_room) */
  uint32_t fbuf_owner; /* that list; its indices follow those of the queued lists */
  rd_pend_t pend[RD_PENDING];
  uint32_t npend;
  size_t pend_frames; /* indices of the queued lists, at the start of the builder's tail */
  MS_VEC(rd_val_t) tmp;
  uint32_t root;
  uint32_t root_segments; /* the root dict's "segments" list */
  bool skip_trace;        /* MS_LOAD_NO_TRACE: trace entries become V_SKIP values */
  bool cannot_skip;       /* a skipped value was needed outside the trace */
  uint16_t drop_actions;  /* MS_LOAD_NO_TRACE_STACKS, _NO_FREE_STACKS: 1 << action for each action
                             whose entries' frames lists are dropped */
  bool drop_free;         /* MS_LOAD_NO_FREE_STACKS: frees of an alloc in the trace drop theirs */
  rd_drop_set_t drop_set; /* the allocs open so far (pickle_drop.c) */
  /* MS_LOAD_DEFER_STACKS on a mapped file (pickle_drop.c, snapshot/deferred.h): the stacks of
   * alloc entries whose frames lists the entry loop read whole are left for later; dloc holds
   * where their lists' first gets are */
  bool defer;
  bool defer_broken; /* a memo entry that held a frame dict was stored again */
  ms__defer_locs_t dloc;
  ms__defer_watch_fn *watch; /* shown each record left for later (NULL: none) */
  void *watch_ctx;
  struct ms__load_window_s *window; /* ms__load_window_current() when the read began */
  /* the last action strings parsed and their actions: an entry's action is a memo get of one
   * of a few stored strings, whose text never changes (pickle_schema.c, rd_action) */
  const char *act_str[RD_ACT_CACHE];
  uint8_t act_val[RD_ACT_CACHE];
  uint8_t act_next;
  rd_fslot_t *fcache; /* NULL until the first run of frame gets (RD_FCACHE_SLOTS) */
  /* output */
  ms__snapbuild_t b;
  ms_errbuf_t *eb;
} rd_t;

/* The frame cache forgets memo entry idx (rd_memo_put stores another value there). */
static inline void rd_fcache_drop(rd_t *r, uint64_t idx) {
  rd_fslot_t *slot = r->fcache ? &r->fcache[idx & (RD_FCACHE_SLOTS - 1)] : NULL;
  if (slot && slot->idx == idx) slot->idx = UINT32_MAX;
}

/* ---- pickle_vm.c ----------------------------------------------------------------------------- */

/* Sets r's error: "offset N: message" (N: the current opcode's file offset). @return code. */
int ms__pickle_err(rd_t *r, int code, const char *fmt, ...) MS_PRINTF(3, 4);

/* rd_take when the buffer holds fewer than n bytes. */
MS_NOINLINE int ms__pickle_take_slow(rd_t *r, uint64_t n, const char **p, const char *what);

/* Takes n bytes; *p stays valid until the next input call. Long runs go through scratch, which
 * grows only as the bytes arrive. A read that begins inside a frame must end inside it (as
 * Python's pickle.py checks). */
static inline int rd_take(rd_t *r, uint64_t n, const char **p, const char *what) {
  if (ms_likely(n <= r->lim - r->pos)) {
    *p = r->buf + r->pos;
    r->pos += (size_t)n;
    return MS_OK;
  }
  return ms__pickle_take_slow(r, n, p, what);
}

/* A little-endian uint32 (compilers make this one load). */
static inline uint32_t rd_le32(const unsigned char *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* The value of a LONG1 integer of n bytes (1 to 8) at q, with at least 8 bytes readable there:
 * one load, masked and sign-extended, instead of two byte loops (the same value as the general
 * decoding's: V_INT, or V_UINT from 2^63 on). */
static inline rd_val_t rd_long1(const unsigned char *q, size_t n) {
  uint64_t u = (uint64_t)rd_le32(q) | (uint64_t)rd_le32(q + 4) << 32;
  unsigned bits = 8u * (unsigned)n;
  if (bits < 64) u &= ((uint64_t)1 << bits) - 1;
  rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
  if (q[n - 1] & 0x80) { /* negative: extended to 64 bits */
    if (bits < 64) u |= ~(uint64_t)0 << bits;
    memcpy(&v.v.i, &u, sizeof u);
  } else if (u <= (uint64_t)INT64_MAX) {
    v.v.i = (int64_t)u;
  } else {
    v.t = V_UINT;
    v.v.u = u;
  }
  return v;
}

/* An optional memo put at buf[*pos] of the memo's index `want` (MEMOIZE, or BINPUT / LONG_BINPUT
 * of that index), for the loops that scan ahead of the general path (pickle_skim.c,
 * pickle_entry.c): true with *put and *pos past it when there is one they take, true without
 * one, false for one they leave to the general path (another index, or one near lim). */
static inline bool rd_scan_put(const unsigned char *buf, size_t *pos, size_t lim, uint64_t want,
                               bool *put) {
  size_t p = *pos;
  *put = false;
  if (lim - p < 5) return lim - p >= 1 && buf[p] != 0x94 && buf[p] != 'q' && buf[p] != 'r';
  unsigned op = buf[p];
  if (op == 0x94) {
    p += 1;
  } else if (op == 'q') {
    if (buf[p + 1] != want) return false;
    p += 2;
  } else if (op == 'r') {
    if (rd_le32(buf + p + 1) != want) return false;
    p += 5;
  } else {
    return true;
  }
  if (want >= UINT32_MAX - 1) return false;
  *pos = p;
  *put = true;
  return true;
}

/* A run of memo gets ended by APPENDS into a list whose items are dropped (a skipped trace's
 * frames list): BINGET 'h' and LONG_BINGET 'j', the run's first opcode op read and its argument
 * at buf[pos]. The run is only checked: every index below nmemo (a memo without holes holds
 * them all). true: *n gets, *end the position after the APPENDS; false: anything else, or a get
 * that does not lie with the opcode after it at least five bytes before lim (the buffer's or the
 * frame's end), left to the general path. */
static inline bool rd_check_get_run(const unsigned char *buf, size_t pos, size_t lim,
                                    size_t nmemo, int op, size_t *n, size_t *end) {
  if (lim - pos < 5) return false;
  size_t last = lim - 5, k = 0;
  if (nmemo <= 0xff) { /* a BINGET's index may be too large: checked too */
    for (;;) {
      k++;
      if (op == 'j') {
        if (rd_le32(buf + pos) >= nmemo) return false;
        op = buf[pos + 4];
        pos += 5;
      } else {
        if (buf[pos] >= nmemo) return false;
        op = buf[pos + 1];
        pos += 2;
      }
      if (op == 'e') break;
      if ((op | 2) != 'j' || pos > last) return false; /* 'h' | 2 == 'j': the run goes on */
    }
  } else { /* every BINGET's index is below nmemo; one test of the opcode a get */
    for (;; k++) {
      if (op == 'j' && pos <= last) {
        if (rd_le32(buf + pos) >= nmemo) return false;
        op = buf[pos + 4];
        pos += 5;
      } else if (op == 'h' && pos <= last) {
        op = buf[pos + 1];
        pos += 2;
      } else if (op == 'e') {
        break;
      } else {
        return false;
      }
    }
  }
  *n = k;
  *end = pos;
  return true;
}

/* Skips n bytes (a value whose content is not kept) without buffering them. */
int ms__pickle_skip(rd_t *r, uint64_t n, const char *what);

static inline int rd_push(rd_t *r, rd_val_t v) {
  if (ms_unlikely(r->st.len >= RD_MAX_STACK))
    return ms__pickle_err(r, MS_ELIMIT, "pickle stack deeper than %u values", RD_MAX_STACK);
  if (ms_unlikely(MS_VEC_RESERVE(&r->st, 1))) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  r->st.ptr[r->st.len++] = v;
  return MS_OK;
}

/* Number of values above the topmost mark (or all of them when there is no mark). */
static inline size_t rd_mark_pos(const rd_t *r) {
  return r->marks.len ? r->marks.ptr[r->marks.len - 1] : 0;
}

static inline int rd_pop_mark(rd_t *r, const char *op, size_t *pos) {
  if (!r->marks.len) return ms__pickle_err(r, MS_EFORMAT, "%s without a MARK", op);
  *pos = r->marks.ptr[--r->marks.len];
  return MS_OK;
}

/* Room for have + extra indices of the list being filled, at the builder's stack tail after the
 * queued lists' indices. */
static inline int rd_tail(rd_t *r, size_t have, size_t extra, uint32_t **tail) {
  int rc = ms__snapbuild_stack_room(&r->b, r->pend_frames + have, extra, tail);
  if (rc != MS_OK) return rc;
  *tail += r->pend_frames;
  return MS_OK;
}

/* ---- pickle_frames.c ------------------------------------------------------------------------- */

/* APPENDS into a frames list being filled: the leading run of st[from..len) that are interned
 * frame dicts goes to the list's place at the stack tail. @return where the general path goes
 * on (from itself when the list is not one to take this way). */
size_t ms__pickle_appends_frames_fast(rd_t *r, uint32_t lid, size_t from);

/* A run of memo gets (op, whose opcode byte is at buf[pos - 1], the first) that an APPENDS ends,
 * into the frames list below the topmost mark while it is being filled: the interned frames'
 * indices go straight to the list's place at the builder's stack tail, as APPENDS would put them
 * there after the gets pushed their values. @return true when it did so (r past the APPENDS);
 * false leaves r untouched for the general path. */
bool ms__pickle_frames_run(rd_t *r, int op);

/* The run of memo gets at buf[pos] (op, its first opcode, already read) that an APPENDS ends,
 * each an interned frame dict: their frames written to the builder's stack tail from index `have`
 * of the list being filled on (rd_tail). true: *n frames, *end the position after the APPENDS;
 * false for anything else (nothing is committed either way: the indices lie past the list's
 * length until the caller counts them). */
bool ms__pickle_frame_gets(rd_t *r, size_t pos, int op, size_t have, size_t *n, size_t *end);

/* ---- pickle_entry.c -------------------------------------------------------------------------- */

/* The trace entry dict did, just created and pushed (EMPTY_DICT): read whole, up to its SETITEMS,
 * when it is made of what this path knows; else r is left to the general path. */
int ms__pickle_entry(rd_t *r, uint32_t did);
/* EMPTY_DICT (just read) of an entry in a batch of a device's list: the dict created as
 * ms__pickle_create creates it (*done), and read whole when it can be; else r untouched. */
int ms__pickle_entry_dict(rd_t *r, bool *done);

/* ---- pickle_objects.c ------------------------------------------------------------------------ */

/* Python's name of v's type, for messages. */
const char *ms__pickle_type_name(const rd_t *r, const rd_val_t *v);
/* Writes the key path of object o (e.g. "segments[3].blocks[7]") into out. */
void ms__pickle_path(const rd_t *r, uint32_t o, char *out, size_t cap);
/* "path.key" of a field of object o, the key made safe to print. */
void ms__pickle_field_path(const rd_t *r, uint32_t o, const rd_val_t *k, char *out, size_t cap);

/* rd_place's answer, found without it, when it can only be "skipped": the container is made in
 * a batch (below the topmost mark) of a skipped container, or, when the trace is skipped, of a
 * device's list of entries (a trace entry); and nothing on the stack makes it a one-at-a-time
 * item of another container (the top value is no list that is an object, and no key sits above
 * a dict that is an object). The frames lists and entries of a skipped trace take this way. */
static inline bool rd_born_skipped(const rd_t *r, uint8_t kind) {
  if (r->marks.len == 0) return false;
  size_t n = r->st.len, m = rd_mark_pos(r);
  if (m == 0) return false;
  const rd_val_t *pv = &r->st.ptr[m - 1];
  if (pv->t == V_SKIP) {
    if (pv->kind == O_DICT && !((n - m) & 1)) return false; /* no key above: rd_place decides */
  } else if (!(r->skip_trace && kind == O_DICT && pv->t == V_OBJ &&
               r->objs.ptr[pv->v.obj].role == R_TRACES)) {
    return false;
  }
  if (pv->t == V_SKIP && pv->kind == O_SET) return false;
  if (n > m) {
    const rd_val_t *top = &r->st.ptr[n - 1];
    if (top->t == V_OBJ) return false;
    if (top->t != V_SKIP && n >= 2 && m <= n - 2 && r->st.ptr[n - 2].t == V_OBJ) return false;
  }
  return true;
}

/* A new container: a V_OBJ with its role, or a V_SKIP when it belongs to the skipped trace. */
int ms__pickle_create(rd_t *r, uint8_t kind, rd_val_t *out);
/* A tuple of st[from..len), which replaces them: V_PAIR for two ints, V_TUPLE otherwise. */
int ms__pickle_tuple(rd_t *r, size_t from);
/* Builds a dict or list from the values above the topmost mark (protocol 0/1 DICT and LIST). */
int ms__pickle_build_from_mark(rd_t *r, uint8_t kind, const char *op);
/* A string (or bytes) opcode's value of n bytes, taken from the input and pushed; op is the
 * opcode (text strings are checked as Python 3 decodes them: UTF-8 or ASCII). */
int ms__pickle_str(rd_t *r, uint64_t n, int op);
/* The value of the string p[0..n) (stored in the builder's arena), as ms__pickle_str pushes it. */
int ms__pickle_str_value(rd_t *r, const char *p, uint64_t n, rd_val_t *out);
/* The length of the longest prefix of p[0..n) that Python decodes: UTF-8 with surrogates
 * allowed ("surrogatepass", as pickle does for its unicode opcodes), or ASCII. */
size_t ms__pickle_text_valid(const unsigned char *p, size_t n, bool ascii);

/* ---- pickle_skim.c --------------------------------------------------------------------------- */

/* A run of memo gets (the first, op, just read) that APPENDS ends, into a skipped list below the
 * topmost mark: checked and dropped as rd_op_appends would drop it. false leaves r untouched. */
bool ms__pickle_skip_list_run(rd_t *r, int op);

/* The skipped trace entry whose EMPTY_DICT was just read (r->skip_trace, born skipped), read in
 * one loop when it is made of what that loop knows: *done with its effect applied (the dict on
 * the stack, its strings stored, its memo entries written), else r untouched for the general
 * path. An error is a string the general path would fail to store too. */
int ms__pickle_skim_entry(rd_t *r, bool *done);
/* ms__pickle_skim (common/internal.h) false: never. */
/* What Python cannot hash: a dict, list or set (an object or skipped), a bytearray, a tuple
 * holding one. */
static inline bool rd_unhashable(const rd_val_t *v) {
  return v->t == V_OBJ || v->t == V_SKIP || (v->flags & VF_UNHASHABLE);
}
/* Refuses what Python cannot hash (dicts, lists, sets, bytearrays, tuples holding them) among
 * st[from], st[from+step], ... up to the top: op's dict keys (step 2) or set items (step 1). */
int ms__pickle_check_hashable(rd_t *r, size_t from, size_t step, const char *op, const char *as);

/* ---- pickle_schema.c ------------------------------------------------------------------------- */

/* Whether entries of action a are left without a stack (MS_LOAD_NO_TRACE_STACKS,
 * MS_LOAD_NO_FREE_STACKS: r->drop_actions). */
static inline bool rd_drops(const rd_t *r, uint8_t a) {
  return a < 16 && ((r->drop_actions >> a) & 1u);
}
/* The action named by s (ms_trace_action_parse), remembered by the string's address. */
uint8_t ms__pickle_action(rd_t *r, const char *s);
/* Sets trace entry t's extra fields (ms__snapbuild_trace_extra), its failure the read's. */
int ms__pickle_trace_extra(rd_t *r, ms_snap_trace_t *t, const ms_snap_trace_extra_t *x);
/* Queues frames list id, just filled, of trace record rec for interning (ms__pickle_flush). */
int ms__pickle_defer_frames(rd_t *r, uint32_t id, uint32_t rec);
/* Trace entry did, complete (its SETITEMS): accounted for by pickle_drop.c when a read leaves
 * out the stacks of frees (MS_LOAD_NO_FREE_STACKS). */
int ms__pickle_entry_done(rd_t *r, uint32_t did);

/* Creates the builder record that a new container of a record role (id) stands for. */
int ms__pickle_birth(rd_t *r, uint32_t id);
/* SETITEMS / SETITEM / DICT (op): items st[from..len) as key, value pairs into dict did
 * (RD_NO_OBJ: a skipped dict), then dropped from the stack. */
int ms__pickle_setitems(rd_t *r, uint32_t did, size_t from, const char *op);
/* APPENDS / APPEND / LIST: items st[from..len) into list lid (RD_NO_OBJ: a skipped list), then
 * dropped from the stack. */
int ms__pickle_appends(rd_t *r, uint32_t lid, size_t from);
/* Interns the queued frames lists' stacks (rd_pend_t), in order. */
int ms__pickle_flush(rd_t *r);
/* After STOP: checks that the records tile their arrays, fills what older eras lack, and hands
 * the builder's snapshot to *out. */
int ms__pickle_finish(rd_t *r, ms_snapshot_t **out);

/* ---- pickle_retire.c ------------------------------------------------------------------------ */

/* A container's object, new or recycled from those freed. */
int ms__pickle_new_obj(rd_t *r, uint8_t kind, uint32_t *id);
/* A container was made a child of object parent (ms__pickle_create): the parent's path may be
 * needed as long as the child can be named. */
void ms__pickle_child_born(rd_t *r, uint32_t parent);
/* Frames list fl was stored as trace entry e's "frames". */
void ms__pickle_frames_stored(rd_t *r, uint32_t e, uint32_t fl);
/* Object id was put into the memo at idx (rd_memo_put). */
void ms__pickle_memoized(rd_t *r, uint32_t id, uint32_t idx);
/* Trace entries st[from..to) (past the stack's length now) were stored into a device list:
 * those that nothing can name again are freed, with their frames lists (a memoized one stays
 * in the memo as RD_TAG_TFRAMES). */
int ms__pickle_retire_entries(rd_t *r, size_t from, size_t to);
/* Device list lid gets its first trace record. */
int ms__pickle_trace_list(rd_t *r, uint32_t lid);
/* Memo entry idx, an RD_TAG_TFRAMES or RD_TAG_TENTRY, made objects again: the entry dict and its
 * frames list, each put back into the memo entry that held it freed. */
int ms__pickle_revive(rd_t *r, uint32_t idx);
/* At the end of a read: the counts for tests (common/internal.h), the tables freed. */
void ms__pickle_retire_release(rd_t *r);

/* ---- pickle_drop.c --------------------------------------------------------------------------- */

/* MS_LOAD_NO_FREE_STACKS: whether trace entry t (its fields as they are now) of device list
 * `list` is a free of an alloc open in the trace read so far, whose stack is left out. */
bool ms__pickle_drop_free(const rd_t *r, const ms_snap_trace_t *t, uint32_t list);
/* Trace record rec of device list `list` is complete: checks that it comes in trace order and
 * that a stack left out (dropped) still may be, then opens (alloc) or closes (free_completed)
 * its address. @return MS_OK; MS_EUNSUPPORTED when the decision no longer holds; MS_ENOMEM. */
int ms__pickle_drop_account(rd_t *r, uint32_t rec, uint32_t list, bool dropped);
void ms__pickle_drop_release(rd_t *r);
/* Sets the stack-dropping rules of a read with these load flags (after r->skip_trace), and the
 * load window it runs in (ms__load_window_current, set around the whole read). */
void ms__pickle_drop_init(rd_t *r, unsigned flags);
/* MS_LOAD_DEFER_STACKS: trace record rec's stack is left for later, its frames list's first get
 * at file offset off. false: it cannot be (out of memory), and is interned now. */
bool ms__pickle_defer_note(rd_t *r, uint32_t rec, uint64_t off);
/* At the end of a read that made snap: gives it the stacks left for later (snapshot/deferred.h).
 * MS_EUNSUPPORTED (r->cannot_skip) when a frame's memo entry was stored again. */
int ms__pickle_defer_finish(rd_t *r, ms_snapshot_t *snap);

/* ---- the memo (pickle_vm.c's, here for pickle_entry.c too) ---------------------------------- */

/* Stores v (the value on the stack's top for a PUT) at memo index idx, at most RD_MEMO_SLACK
 * past the memo's end (the caller checked): the entries skipped below it are holes. */
static inline int rd_memo_store(rd_t *r, uint64_t idx, const rd_val_t *v) {
  if (idx < r->memo.len) { /* another value replaces the one there */
    rd_fcache_drop(r, idx);
    /* a deferred stack names its frames by memo index: each must keep its frame */
    if (r->defer && r->memo_tag.ptr[idx] == V_OBJ &&
        r->objs.ptr[r->memo_obj.ptr[idx]].role == R_FRAME)
      r->defer_broken = true;
  }
  if (idx >= r->memo.len) {
    size_t add = (size_t)idx + 1 - r->memo.len;
    if (add > 1) r->memo_holes = true;
    /* the values' array only reserves (its pages are touched where a value is stored); the
     * tags, one byte an entry, are cleared */
    if (MS_BIGVEC_RESERVE(&r->memo, add) || MS_BIGVEC_RESERVE(&r->memo_obj, add) ||
        MS_BIGVEC_RESERVE(&r->memo_tag, add)) /* each calls only when it must grow */
      return ms__pickle_err(r, MS_ENOMEM, "out of memory");
    if (add == 1) r->memo_tag.ptr[r->memo_tag.len] = 0; /* MEMOIZE: one at the end */
    else memset(r->memo_tag.ptr + r->memo_tag.len, 0, add);
    r->memo.len += add;
    r->memo_obj.len += add;
    r->memo_tag.len += add;
  }
  if (v->t == V_SKIP) {
    r->memo_tag.ptr[idx] = (uint8_t)(RD_TAG_SKIP | v->kind);
  } else if (v->t == V_OBJ) {
    r->memo_tag.ptr[idx] = V_OBJ;
    r->memo_obj.ptr[idx] = v->v.obj;
    ms__pickle_memoized(r, v->v.obj, (uint32_t)idx);
  } else {
    r->memo_tag.ptr[idx] = v->t;
    r->memo.ptr[idx] = *v;
  }
  return MS_OK;
}

#endif /* MEMSNAP_LIB_SNAPSHOT_PICKLE_INTERNAL_H */
