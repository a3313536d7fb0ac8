/* SPDX-License-Identifier: MIT
 * memsnap core: the streaming reader of PyTorch snapshot pickles (memsnap/pickle.h, issue #4).
 *
 * A small pickle VM: a typed value stack (scalars, arena strings, and "objects" for dicts, lists
 * and sets), a mark stack, and a memo of values. It never builds a generic object tree. Every
 * dict or list gets a role the moment it is created (EMPTY_DICT/EMPTY_LIST), from its position:
 * the container it is about to be stored in (found from the shape of the stack, as Python's
 * pickler lays it out) and the key it will be stored under. A dict whose role is "block" is a
 * block record in the snapshot builder from birth; SETITEMS into it converts each value straight
 * into the record's fields. A "frames" list accumulates interned frame indices and becomes an
 * interned stack when it is first used; memo gets of the same frame dict or frame list (PyTorch
 * shares them through the memo) give back the same frame or stack index in O(1).
 *
 * The role guessed at creation is verified when the container is consumed (APPENDS/SETITEMS into
 * its real parent): a container in a place the schema does not know is skipped (its values are
 * still parsed, safely); one whose guessed role does not match its real place is an error, never
 * a silent misreading.
 *
 * Bounds: stack depth and marks (RD_MAX_STACK), memo indices (dense, at most RD_MEMO_SLACK
 * beyond the entries stored), string lengths (below 4 GiB), integers (RD_MAX_LONG bytes). A
 * declared length is read in chunks and memory grows only as the input delivers the bytes, so a
 * 2^62-byte string in a 100-byte file fails at the end of the input having allocated nothing
 * big.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/pickle.h"
#include "model/snapbuild.h"

#define RD_BUF_CAP (1u << 17)      /* input buffer (128 KiB), once more than RD_BUF_MIN came */
#define RD_BUF_MIN (1u << 13)      /* the first 8 KiB: small inputs stay cheap */
#define RD_MAX_STACK (1u << 18)    /* values on the stack; also the number of open marks */
#define RD_MEMO_SLACK (1u << 16)   /* how far beyond the memo's end a PUT may store */
#define RD_MAX_STR 0xfffffffeu     /* longest string or bytes value */
#define RD_MAX_LONG (1u << 16)     /* longest LONG4 integer, in bytes */
#define RD_MAX_SETTINGS_DEPTH 1 /* allocator_settings maps kept: one level (the builder stores a
                                   * map's entries after the map, so deeper ones are dropped) */
#define RD_NO_OBJ UINT32_MAX

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

typedef struct rd_val_s {
  uint8_t t;
  uint8_t key; /* V_STR: the schema key it spells (K_*), K_UNKNOWN otherwise */
  uint8_t kind; /* V_SKIP: O_DICT, O_LIST or O_SET */
  uint8_t pad_;
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
  XX(USER_METADATA, "user_metadata") XX(POOL_ID, "pool_id") XX(STAGE, "stage")

enum rd_key {
  K_UNKNOWN = 0,
#define RD_KEY_ENUM(id, s) K_##id,
  RD_KEYS(RD_KEY_ENUM)
#undef RD_KEY_ENUM
  K_COUNT
};

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

static uint8_t rd_key_lookup(const char *s, size_t len) {
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

static const uint8_t rd_role_kind[R_COUNT] = {
    [R_NONE] = O_DICT,     [R_ROOT] = O_DICT,     [R_SEGMENTS] = O_LIST, [R_SEGMENT] = O_DICT,
    [R_BLOCKS] = O_LIST,   [R_BLOCK] = O_DICT,    [R_HISTORY] = O_LIST,  [R_HIST] = O_DICT,
    [R_FRAMES] = O_LIST,   [R_FRAME] = O_DICT,    [R_DEVTRACES] = O_LIST, [R_TRACES] = O_LIST,
    [R_TRACE] = O_DICT,    [R_SETTINGS] = O_DICT, [R_SETMAP] = O_DICT,   [R_ANNOTS] = O_LIST,
    [R_ANNOT] = O_DICT,
};

/* The role of a dict's value under key k (R_NONE: ignored). */
static uint8_t rd_dict_child(uint8_t role, uint8_t k) {
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
static uint8_t rd_list_child(uint8_t role) {
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

enum {
  OF_USED = 1u << 0,     /* stored into its parent (or memo-got and stored again) */
  OF_SEALED = 1u << 1,   /* frames list: ref is its interned stack */
  OF_INTERNED = 1u << 2, /* frame dict: ref is its interned frame */
  OF_PENDING = 1u << 3,  /* frames list of a trace entry, queued for interning (rd_pend_t) */
};

typedef struct rd_obj_s {
  uint8_t kind;    /* O_* */
  uint8_t role;    /* R_* */
  uint8_t flags;   /* OF_* */
  uint8_t key;     /* key it sits under in a dict parent (for paths) */
  uint32_t parent; /* the container it was created for, RD_NO_OBJ for the root */
  uint32_t idx;    /* its index in a list parent (for paths) */
  uint32_t ref;    /* record index in the builder; first record of a list; frame/stack index;
                      pending-frame slot; first child of a settings map */
  uint32_t count;  /* items stored so far */
  uint32_t aux;    /* R_SETMAP: nesting depth */
} rd_obj_t;

/* A trace entry's frames list whose stack is interned later (rd_flush), so that the intern
 * table's slot, prefetched now, is in cache by then. Its frame indices stay at the end of the
 * builder's stack_frames, after those of the lists queued before it. */
#define RD_PENDING 16
typedef struct rd_pend_s {
  uint32_t list;  /* the frames list (OF_PENDING) */
  uint32_t rec;   /* its trace record */
  uint32_t n;     /* its frame indices */
  uint64_t hash;  /* ms__snapbuild_stack_hash of them */
} rd_pend_t;

typedef struct rd_pframe_s {
  const char *name, *file;
  int64_t line;
  uint32_t next_free;
} rd_pframe_t;

typedef struct rd_s {
  /* input */
  ms_source_t *src;
  char *buf;
  size_t pos, len, cap;
  uint64_t base; /* file offset of buf[0] */
  bool eof;
  uint64_t op_off;
  MS_VEC(char) scratch;
  /* VM */
  MS_VEC(rd_val_t) st;
  MS_VEC(uint32_t) marks;
  MS_VEC(rd_val_t) memo;
  MS_VEC(rd_obj_t) objs;
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
  /* output */
  ms__snapbuild_t b;
  ms_errbuf_t *eb;
} rd_t;

/* ---- errors ---------------------------------------------------------------------------------- */

static int rd_err(rd_t *r, int code, const char *fmt, ...) MS_PRINTF(3, 4);
static int rd_err(rd_t *r, int code, const char *fmt, ...) {
  char msg[400];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return ms__errbuf_set(r->eb, code, "offset %" PRIu64 ": %s", r->op_off, msg);
}

static const char *rd_type_name(const rd_t *r, const rd_val_t *v) {
  switch (v->t) {
  case V_NONE: return "None";
  case V_BOOL: return "bool";
  case V_INT:
  case V_UINT:
  case V_BIG: return "int";
  case V_FLOAT: return "float";
  case V_STR: return "str";
  case V_BYTES: return "bytes";
  case V_PAIR:
  case V_TUPLE: return "tuple";
  case V_FSET: return "frozenset";
  case V_SKIP: return v->kind == O_DICT ? "dict" : v->kind == O_LIST ? "list" : "set";
  case V_OBJ: {
    uint8_t k = r->objs.ptr[v->v.obj].kind;
    return k == O_DICT ? "dict" : k == O_LIST ? "list" : "set";
  }
  default: return "nothing";
  }
}

/* Writes the key path of object o (e.g. "segments[3].blocks[7]") into out. */
static void rd_path(const rd_t *r, uint32_t o, char *out, size_t cap) {
  uint32_t chain[24];
  size_t n = 0;
  bool cut = false;
  for (uint32_t c = o; c != RD_NO_OBJ && c != r->root; c = r->objs.ptr[c].parent) {
    if (n == 24) {
      cut = true;
      break;
    }
    chain[n++] = c;
  }
  size_t w = 0;
  out[0] = 0;
  if (cut) w += (size_t)snprintf(out, cap, "...");
  while (n-- > 0 && w < cap) {
    const rd_obj_t *ob = &r->objs.ptr[chain[n]];
    const rd_obj_t *par = ob->parent == RD_NO_OBJ ? NULL : &r->objs.ptr[ob->parent];
    if (par && par->kind == O_LIST)
      w += (size_t)snprintf(out + w, cap - w, "[%" PRIu32 "]", ob->idx);
    else
      w += (size_t)snprintf(out + w, cap - w, "%s%s", w ? "." : "", rd_key_names[ob->key]);
  }
  if (o == r->root && cap) snprintf(out, cap, "top level");
}

/* A key from the file, made safe to print: at most 60 bytes, control bytes as '?'. */
static void rd_safe_key(const rd_val_t *k, char out[64]) {
  const char *s = k && k->t == V_STR ? k->v.s : "?";
  size_t n = 0;
  for (; s[n] && n < 60; n++) out[n] = (unsigned char)s[n] < 0x20 || s[n] == 0x7f ? '?' : s[n];
  out[n] = 0;
}

/* "path.key" of a field of object o. */
static void rd_field_path(const rd_t *r, uint32_t o, const rd_val_t *k, char *out, size_t cap) {
  char p[200], name[64];
  rd_path(r, o, p, sizeof p);
  rd_safe_key(k, name);
  if (o == r->root)
    snprintf(out, cap, "%.120s", name);
  else
    snprintf(out, cap, "%.150s.%.120s", p, name);
}

/* ---- input ----------------------------------------------------------------------------------- */

static int rd_read_more(rd_t *r) {
  if (r->eof) return MS_ETRUNCATED;
  if (r->pos > 0) {
    memmove(r->buf, r->buf + r->pos, r->len - r->pos);
    r->base += r->pos;
    r->len -= r->pos;
    r->pos = 0;
  }
  if (r->cap < RD_BUF_CAP && r->base + r->len >= r->cap) {
    /* the input is larger than the first buffer: switch to the full size */
    char *nb = realloc(r->buf, RD_BUF_CAP);
    if (!nb) return rd_err(r, MS_ENOMEM, "out of memory");
    r->buf = nb;
    r->cap = RD_BUF_CAP;
  }
  while (r->len < r->cap) {
    ptrdiff_t n = r->src->read(r->src->ctx, r->buf + r->len, r->cap - r->len);
    if (n < 0) return rd_err(r, (int)n, "read error: %s", ms_strerror((int)n));
    if (n == 0) {
      r->eof = true;
      break;
    }
    r->len += (size_t)n;
    if (r->len >= 4096) break; /* enough to go on; keep latency low for pipes */
  }
  return MS_OK;
}

static int rd_truncated(rd_t *r, const char *what) {
  return rd_err(r, MS_ETRUNCATED, "pickle truncated: the input ends inside %s", what);
}

/* Makes n (<= RD_BUF_CAP) bytes available at buf+pos. */
static int rd_need(rd_t *r, size_t n, const char *what) {
  while (r->len - r->pos < n) {
    if (r->eof) return rd_truncated(r, what);
    int rc = rd_read_more(r);
    if (rc != MS_OK && rc != MS_ETRUNCATED) return rc;
    if (r->eof && r->len - r->pos < n) return rd_truncated(r, what);
  }
  return MS_OK;
}

/* rd_take when the buffer holds fewer than n bytes. */
static MS_NOINLINE int rd_take_slow(rd_t *r, uint64_t n, const char **p, const char *what) {
  if (n <= RD_BUF_CAP / 2) {
    MS_FORWARD_IF_ERROR(rd_need(r, (size_t)n, what));
    *p = r->buf + r->pos;
    r->pos += (size_t)n;
    return MS_OK;
  }
  r->scratch.len = 0;
  while (r->scratch.len < n) {
    if (r->pos == r->len) {
      if (r->eof) return rd_truncated(r, what);
      int rc = rd_read_more(r);
      if (rc != MS_OK && rc != MS_ETRUNCATED) return rc;
      if (r->pos == r->len) return rd_truncated(r, what);
    }
    size_t chunk = r->len - r->pos;
    if (chunk > n - r->scratch.len) chunk = (size_t)(n - r->scratch.len);
    if (MS_VEC_RESERVE(&r->scratch, chunk)) return rd_err(r, MS_ENOMEM, "out of memory");
    memcpy(r->scratch.ptr + r->scratch.len, r->buf + r->pos, chunk);
    r->scratch.len += chunk;
    r->pos += chunk;
  }
  *p = r->scratch.ptr;
  return MS_OK;
}

/* Takes n bytes; *p stays valid until the next input call. Long runs go through scratch, which
 * grows only as the bytes arrive. */
static inline int rd_take(rd_t *r, uint64_t n, const char **p, const char *what) {
  if (ms_likely(n <= r->len - r->pos)) {
    *p = r->buf + r->pos;
    r->pos += (size_t)n;
    return MS_OK;
  }
  return rd_take_slow(r, n, p, what);
}

/* Reads a text argument up to '\n' (protocol 0 opcodes); at most cap-1 bytes. */
static int rd_line(rd_t *r, char *out, size_t cap) {
  size_t n = 0;
  for (;;) {
    MS_FORWARD_IF_ERROR(rd_need(r, 1, "a text argument"));
    char c = r->buf[r->pos++];
    if (c == '\n') break;
    if (n + 1 >= cap) return rd_err(r, MS_ELIMIT, "text argument longer than %zu bytes", cap - 1);
    out[n++] = c;
  }
  out[n] = 0;
  return MS_OK;
}

static inline uint64_t rd_le(const char *p, size_t n) {
  uint64_t x = 0;
  for (size_t i = n; i-- > 0;) x = (x << 8) | (uint8_t)p[i];
  return x;
}

/* ---- stack ----------------------------------------------------------------------------------- */

static inline int rd_push(rd_t *r, rd_val_t v) {
  if (ms_unlikely(r->st.len >= RD_MAX_STACK))
    return rd_err(r, MS_ELIMIT, "pickle stack deeper than %u values", RD_MAX_STACK);
  if (ms_unlikely(MS_VEC_RESERVE(&r->st, 1))) return rd_err(r, MS_ENOMEM, "out of memory");
  r->st.ptr[r->st.len++] = v;
  return MS_OK;
}

/* Number of values above the topmost mark (or all of them when there is no mark). */
static inline size_t rd_mark_pos(const rd_t *r) {
  return r->marks.len ? r->marks.ptr[r->marks.len - 1] : 0;
}

static int rd_need_values(rd_t *r, size_t n, const char *op) {
  size_t avail = r->st.len - rd_mark_pos(r);
  if (avail < n)
    return rd_err(r, MS_EFORMAT, "%s needs %zu value%s on the stack above the mark, found %zu", op,
                  n, n == 1 ? "" : "s", avail);
  return MS_OK;
}

static int rd_pop_mark(rd_t *r, const char *op, size_t *pos) {
  if (!r->marks.len) return rd_err(r, MS_EFORMAT, "%s without a MARK", op);
  *pos = r->marks.ptr[--r->marks.len];
  return MS_OK;
}

/* ---- objects and roles ----------------------------------------------------------------------- */

static int rd_new_obj(rd_t *r, uint8_t kind, uint32_t *id) {
  if (r->objs.len >= UINT32_MAX - 1) return rd_err(r, MS_ELIMIT, "too many containers");
  rd_obj_t o = {kind, R_NONE, 0, K_UNKNOWN, RD_NO_OBJ, 0, 0, 0, 0};
  if (MS_BIGVEC_RESERVE(&r->objs, 1)) return rd_err(r, MS_ENOMEM, "out of memory");
  r->objs.ptr[r->objs.len++] = o;
  *id = (uint32_t)r->objs.len - 1;
  return MS_OK;
}

typedef struct rd_cand_s {
  uint32_t parent;
  uint8_t key;
  uint8_t role;
  bool skip; /* the parent is a skipped container (V_SKIP) */
  uint32_t idx;
} rd_cand_t;

static inline bool rd_is_container(const rd_t *r, const rd_val_t *v, uint8_t kind) {
  return (v->t == V_OBJ && r->objs.ptr[v->v.obj].kind == kind) ||
         (v->t == V_SKIP && v->kind == kind);
}

/* The candidate parent pv (a container value) for a new container of the given kind, stored
 * under key (dicts). */
static void rd_cand_at(const rd_t *r, rd_cand_t *c, const rd_val_t *pv, uint8_t kind,
                       uint8_t key) {
  c->key = key;
  if (pv->t == V_SKIP) {
    c->skip = true;
    return;
  }
  c->parent = pv->v.obj;
  const rd_obj_t *p = &r->objs.ptr[c->parent];
  bool is_list = p->kind == O_LIST;
  if (is_list) c->idx = p->count;
  uint8_t role = is_list ? rd_list_child(p->role) : rd_dict_child(p->role, key);
  if (role != R_NONE && rd_role_kind[role] != kind) role = R_NONE;
  c->role = role;
}

/* Decides which container a new container (of the given kind) is being built for, from the
 * shape of the stack. Python's pickler stores a container's items either in batches
 * (parent MARK items... APPENDS/SETITEMS) or one at a time (parent item APPEND, parent key item
 * SETITEM); both shapes are considered and the one that gives a known role wins (then one whose
 * parent is skipped: what it holds is skipped too). *root: this is the top-level container. */
static void rd_place(const rd_t *r, uint8_t kind, rd_cand_t *out, bool *root) {
  size_t n = r->st.len, mpos = rd_mark_pos(r);
  bool has_mark = r->marks.len > 0;
  *root = n == 0 && !has_mark && r->root == RD_NO_OBJ;
  rd_cand_t a = {RD_NO_OBJ, K_UNKNOWN, R_NONE, false, 0}, bt = a;
  *out = a;
  if (*root) return;
  /* one at a time: the top value is a list, or the top is a key below which sits a dict */
  if (n > 0 && (!has_mark || mpos < n)) {
    const rd_val_t *top = &r->st.ptr[n - 1];
    if (rd_is_container(r, top, O_LIST)) {
      rd_cand_at(r, &a, top, kind, K_UNKNOWN);
    } else if (top->t != V_OBJ && top->t != V_SKIP && n >= 2 && (!has_mark || mpos <= n - 2) &&
               rd_is_container(r, &r->st.ptr[n - 2], O_DICT)) {
      rd_cand_at(r, &a, &r->st.ptr[n - 2], kind, top->t == V_STR ? top->key : K_UNKNOWN);
    }
  }
  /* in a batch: the value below the topmost mark is the parent */
  if (has_mark && mpos >= 1) {
    const rd_val_t *pv = &r->st.ptr[mpos - 1];
    size_t above = n - mpos;
    if (rd_is_container(r, pv, O_LIST)) {
      rd_cand_at(r, &bt, pv, kind, K_UNKNOWN);
      bt.idx += (uint32_t)above;
    } else if (rd_is_container(r, pv, O_DICT) && (above & 1)) {
      const rd_val_t *top = &r->st.ptr[n - 1];
      rd_cand_at(r, &bt, pv, kind, top->t == V_STR ? top->key : K_UNKNOWN);
    }
  }
  bool ha = a.parent != RD_NO_OBJ || a.skip, hb = bt.parent != RD_NO_OBJ || bt.skip;
  if (!ha)
    *out = bt;
  else if (!hb)
    *out = a;
  else if ((a.role != R_NONE) != (bt.role != R_NONE))
    *out = a.role != R_NONE ? a : bt;
  else if (a.skip || bt.skip)
    *out = a.skip ? a : bt;
  else /* a single item follows a full batch of 1000, or the container is fresh */
    *out = r->objs.ptr[a.parent].count % 1000 == 0 ? a : bt;
}

/* Creates the builder record that a dict of a record role stands for. */
static int rd_birth(rd_t *r, uint32_t id) {
  rd_obj_t *o = &r->objs.ptr[id];
  ms__snapbuild_t *b = &r->b;
  int rc = MS_OK;
  switch (o->role) {
  case R_SEGMENT: {
    ms_snap_segment_t s = {0};
    s.stack = MS_SNAP_NO_STACK;
    s.is_large = true;
    o->ref = (uint32_t)b->segments.len;
    rc = ms__snapbuild_add_segment(b, &s);
    break;
  }
  case R_BLOCK: {
    ms_snap_block_t k = {0};
    k.stack = MS_SNAP_NO_STACK;
    k.state = MS_BLOCK_STATE_OTHER;
    k.state_name = "";
    o->ref = (uint32_t)b->blocks.len;
    rc = ms__snapbuild_add_block(b, &k);
    break;
  }
  case R_HIST: {
    ms_snap_history_t h = {0, 0, MS_SNAP_NO_STACK, 0};
    o->ref = (uint32_t)b->history.len;
    rc = ms__snapbuild_add_history(b, &h);
    break;
  }
  case R_TRACE: {
    ms_snap_trace_t t = {0};
    t.action = MS_TRACE_OTHER;
    t.action_name = "";
    t.stack = MS_SNAP_NO_STACK;
    t.compile_context = "";
    t.user_metadata = "";
    o->ref = (uint32_t)b->trace.len;
    rc = ms__snapbuild_add_trace(b, &t);
    break;
  }
  case R_ANNOT: {
    ms_snap_annotation_t a = {"", "", 0, 0};
    o->ref = (uint32_t)b->annotations.len;
    rc = ms__snapbuild_add_annotation(b, &a);
    break;
  }
  case R_FRAME: {
    uint32_t slot = r->pframe_free;
    if (slot != RD_NO_OBJ) {
      r->pframe_free = r->pframes.ptr[slot].next_free;
    } else {
      if (MS_VEC_RESERVE(&r->pframes, 1)) return rd_err(r, MS_ENOMEM, "out of memory");
      slot = (uint32_t)r->pframes.len++;
    }
    r->pframes.ptr[slot] = (rd_pframe_t){"", "", 0, RD_NO_OBJ};
    o->ref = slot;
    break;
  }
  default:
    break;
  }
  if (rc == MS_ENOMEM) return rd_err(r, rc, "out of memory");
  if (rc != MS_OK) return rd_err(r, rc, "too many records");
  return MS_OK;
}

/* A new container: a V_OBJ with its role, or a V_SKIP when it belongs to the skipped trace. */
static int rd_create(rd_t *r, uint8_t kind, rd_val_t *out) {
  rd_cand_t c;
  bool root;
  rd_place(r, kind, &c, &root);
  if (!root && (c.skip || (r->skip_trace && c.role == R_TRACE))) {
    *out = (rd_val_t){V_SKIP, K_UNKNOWN, kind, 0, 0, {0}};
    return MS_OK;
  }
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_new_obj(r, kind, &id));
  rd_obj_t *o = &r->objs.ptr[id];
  if (root) {
    r->root = id;
    o->role = kind == O_DICT ? R_ROOT : kind == O_LIST ? R_SEGMENTS : R_NONE;
  } else {
    o->parent = c.parent;
    o->key = c.key;
    o->idx = c.idx;
    o->role = c.role;
    if (o->role == R_SETMAP) { /* aux: nesting depth of settings maps */
      const rd_obj_t *p = &r->objs.ptr[c.parent];
      o->aux = p->role == R_SETMAP ? p->aux + 1 : 1;
    }
  }
  MS_FORWARD_IF_ERROR(rd_birth(r, id));
  *out = (rd_val_t){V_OBJ, K_UNKNOWN, 0, 0, 0, {.obj = id}};
  return MS_OK;
}

/* ---- frames and stacks ----------------------------------------------------------------------- */

static int rd_intern_frame(rd_t *r, uint32_t id, uint32_t *frame) {
  rd_obj_t *o = &r->objs.ptr[id];
  if (!(o->flags & OF_INTERNED)) {
    rd_pframe_t *pf = &r->pframes.ptr[o->ref];
    uint32_t f = 0;
    int rc = ms__snapbuild_frame_owned(&r->b, pf->name, pf->file, pf->line, &f);
    if (rc != MS_OK) return rd_err(r, rc, "cannot store a frame: %s", ms_strerror(rc));
    pf->next_free = r->pframe_free;
    r->pframe_free = o->ref;
    o->ref = f;
    o->flags |= OF_INTERNED;
  }
  *frame = o->ref;
  return MS_OK;
}

/* Room for have + extra indices of the list being filled, after the queued lists' indices. */
static int rd_tail(rd_t *r, size_t have, size_t extra, uint32_t **tail) {
  int rc = ms__snapbuild_stack_room(&r->b, r->pend_frames + have, extra, tail);
  if (rc != MS_OK) return rc;
  *tail += r->pend_frames;
  return MS_OK;
}

/* Interns the queued lists' stacks, in order, into their lists and trace records. */
static int rd_flush(rd_t *r) {
  ms__snapbuild_t *b = &r->b;
  size_t rest = r->pend_frames + r->fbuf_len; /* indices at the tail, from the current one on */
  for (uint32_t i = 0; i < r->npend; i++) {
    const rd_pend_t *p = &r->pend[i];
    size_t len0 = b->stack_frames.len;
    uint32_t st = 0;
    int rc = ms__snapbuild_stack_tail_hashed(b, p->n, p->hash, &st);
    if (rc != MS_OK) return rd_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
    rest -= p->n;
    if (b->stack_frames.len == len0 && rest) /* a known stack: drop its indices */
      memmove(b->stack_frames.ptr + len0, b->stack_frames.ptr + len0 + p->n,
              rest * sizeof *b->stack_frames.ptr);
    rd_obj_t *o = &r->objs.ptr[p->list];
    o->ref = st;
    o->flags = (uint8_t)((o->flags & ~OF_PENDING) | OF_SEALED);
    b->trace.ptr[p->rec].stack = st;
  }
  r->npend = 0;
  r->pend_frames = 0;
  return MS_OK;
}

/* Queues the frames list being filled (id, the list of trace record rec) for interning. */
static int rd_defer_frames(rd_t *r, uint32_t id, uint32_t rec) {
  if (r->npend == RD_PENDING) MS_FORWARD_IF_ERROR(rd_flush(r));
  uint32_t *tail = NULL;
  int rc = rd_tail(r, r->fbuf_len, 0, &tail);
  if (rc != MS_OK) return rd_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
  uint64_t h = ms__snapbuild_stack_hash(tail, r->fbuf_len);
  ms__snapbuild_stack_prefetch(&r->b, h);
  r->pend[r->npend++] = (rd_pend_t){id, rec, (uint32_t)r->fbuf_len, h};
  r->pend_frames += r->fbuf_len;
  r->fbuf_owner = RD_NO_OBJ;
  r->fbuf_len = 0;
  r->objs.ptr[id].flags |= OF_PENDING;
  return MS_OK;
}

/* Turns a frames list into its interned stack (once). */
static int rd_seal_frames(rd_t *r, uint32_t id) {
  if (r->npend) MS_FORWARD_IF_ERROR(rd_flush(r)); /* the tail holds only the current list now */
  rd_obj_t *o = &r->objs.ptr[id];
  if (o->flags & OF_SEALED) return MS_OK;
  uint32_t st = 0;
  /* An empty list's stack leaves the frames being gathered for another list in place. */
  int rc = r->fbuf_owner == id ? ms__snapbuild_stack_tail(&r->b, r->fbuf_len, &st)
                               : ms__snapbuild_stack(&r->b, NULL, 0, &st);
  if (rc != MS_OK) return rd_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
  if (r->fbuf_owner == id) {
    r->fbuf_owner = RD_NO_OBJ;
    r->fbuf_len = 0;
  }
  o = &r->objs.ptr[id];
  o->ref = st;
  o->flags |= OF_SEALED;
  return MS_OK;
}

/* ---- typed field conversion ------------------------------------------------------------------ */

typedef struct rd_ctx_s {
  uint32_t obj;       /* the container being filled */
  const rd_val_t *k;  /* key (dicts) */
  uint32_t idx;       /* index (lists) */
} rd_ctx_t;

static int rd_type_err(rd_t *r, const rd_ctx_t *c, const char *want, const rd_val_t *v) {
  char p[300];
  if (c->k) {
    rd_field_path(r, c->obj, c->k, p, sizeof p);
  } else {
    char q[260];
    rd_path(r, c->obj, q, sizeof q);
    snprintf(p, sizeof p, "%s[%" PRIu32 "]", c->obj == r->root ? "" : q, c->idx);
  }
  return rd_err(r, MS_EFORMAT, "%s: expected %s, got %s", p, want, rd_type_name(r, v));
}

static int rd_want_i64(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, int64_t *out) {
  if (v->t == V_INT) {
    *out = v->v.i;
    return MS_OK;
  }
  if (v->t == V_UINT || v->t == V_BIG) return rd_type_err(r, c, "a 64-bit signed int", v);
  return rd_type_err(r, c, "int", v);
}

static int rd_want_u64(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint64_t *out) {
  if (v->t == V_INT && v->v.i >= 0) {
    *out = (uint64_t)v->v.i;
    return MS_OK;
  }
  if (v->t == V_UINT) {
    *out = v->v.u;
    return MS_OK;
  }
  if (v->t == V_INT || v->t == V_BIG) return rd_type_err(r, c, "an int in [0, 2^64)", v);
  return rd_type_err(r, c, "int", v);
}

/* Stream handles are raw pointers; a negative value is kept as its two's complement. */
static int rd_want_u64_wrap(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint64_t *out) {
  if (v->t == V_INT) {
    *out = (uint64_t)v->v.i;
    return MS_OK;
  }
  return rd_want_u64(r, c, v, out);
}

static int rd_want_str(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, const char **out) {
  if (v->t != V_STR) return rd_type_err(r, c, "str", v);
  *out = v->v.s;
  return MS_OK;
}

static int rd_want_bool(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, bool *out) {
  if (v->t != V_BOOL) return rd_type_err(r, c, "bool", v);
  *out = v->v.i != 0;
  return MS_OK;
}

/* A value of the skipped trace is needed elsewhere (a file that shares, through the memo, a
 * container of device_traces with a later part): the caller must read the file again without
 * skipping. */
static int rd_cannot_skip(rd_t *r, const rd_ctx_t *c) {
  char p[300];
  if (c->k)
    rd_field_path(r, c->obj, c->k, p, sizeof p);
  else
    snprintf(p, sizeof p, "element %" PRIu32, c->idx);
  r->cannot_skip = true;
  return rd_err(r, MS_EUNSUPPORTED,
                "%s: uses a value of device_traces, so the trace cannot be skipped", p);
}

static int rd_want_pair(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, int64_t out[2]) {
  if (v->t != V_PAIR) return rd_type_err(r, c, "a tuple of two ints", v);
  out[0] = r->pairs.ptr[2 * (size_t)v->v.pair];
  out[1] = r->pairs.ptr[2 * (size_t)v->v.pair + 1];
  return MS_OK;
}

/* A child container stored at c: checks it is the container of role `want` built for this place.
 * want == R_NONE: not part of the schema, ignored (*id = RD_NO_OBJ). */
static int rd_want_obj(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint8_t want, uint32_t *id) {
  *id = RD_NO_OBJ;
  if (want == R_NONE) return MS_OK;
  if (v->t == V_SKIP) return rd_cannot_skip(r, c);
  uint8_t kind = rd_role_kind[want];
  if (v->t != V_OBJ || r->objs.ptr[v->v.obj].kind != kind)
    return rd_type_err(r, c, kind == O_DICT ? "dict" : "list", v);
  rd_obj_t *o = &r->objs.ptr[v->v.obj];
  if (o->role != want) {
    char p[300];
    if (c->k)
      rd_field_path(r, c->obj, c->k, p, sizeof p);
    else
      snprintf(p, sizeof p, "element %" PRIu32, c->idx);
    return rd_err(r, MS_EFORMAT,
                  "%s: unexpected pickle structure (this %s was built for another place)", p,
                  kind == O_DICT ? "dict" : "list");
  }
  bool shareable = want == R_FRAMES || want == R_FRAME || want == R_TRACES;
  if ((o->flags & OF_USED) && !shareable) {
    char p[300];
    rd_path(r, v->v.obj, p, sizeof p);
    return rd_err(r, MS_EFORMAT, "%s: the same %s is stored twice (shared through the memo)", p,
                  kind == O_DICT ? "dict" : "list");
  }
  o->flags |= OF_USED;
  *id = v->v.obj;
  return MS_OK;
}

static int rd_frames_stack(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint32_t *stack) {
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_FRAMES, &id));
  MS_FORWARD_IF_ERROR(rd_seal_frames(r, id));
  *stack = r->objs.ptr[id].ref;
  return MS_OK;
}

/* A record list (segments, blocks, ...): its records must be consecutive in the builder. */
static int rd_list_record(rd_t *r, rd_obj_t *list, uint32_t list_id, uint32_t rec, size_t nrecs) {
  (void)nrecs;
  if (list->count == 0) {
    list->ref = rec;
  } else if (rec != list->ref + list->count) {
    char p[260];
    rd_path(r, list_id, p, sizeof p);
    return rd_err(r, MS_EFORMAT, "%s[%" PRIu32 "]: unexpected pickle structure (out of order)", p,
                  list->count);
  }
  return MS_OK;
}

/* ---- storing items --------------------------------------------------------------------------- */

static int rd_modified_after_use(rd_t *r, uint32_t id) {
  char p[260];
  rd_path(r, id, p, sizeof p);
  return rd_err(r, MS_EFORMAT, "%s: modified after it was used (shared through the memo)", p);
}

/* list[len] = v */
static int rd_list_append(rd_t *r, uint32_t lid, const rd_val_t *v) {
  rd_obj_t *l = &r->objs.ptr[lid];
  rd_ctx_t c = {lid, NULL, l->count};
  uint8_t want = rd_list_child(l->role);
  if (l->role != R_NONE && (l->flags & (OF_USED | OF_SEALED))) return rd_modified_after_use(r, lid);
  if (v->t == V_SKIP && l->role == R_TRACES && v->kind == O_DICT) { /* a skipped entry */
    if (l->count == UINT32_MAX) return rd_err(r, MS_ELIMIT, "list longer than 2^32 items");
    l->count++;
    return MS_OK;
  }
  uint32_t id = RD_NO_OBJ;
  if (want != R_NONE) MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, want, &id));
  l = &r->objs.ptr[lid];
  switch (l->role) {
  case R_FRAMES: {
    uint32_t f = 0;
    MS_FORWARD_IF_ERROR(rd_intern_frame(r, id, &f));
    if (r->fbuf_owner != lid) {
      if (r->fbuf_owner != RD_NO_OBJ) MS_FORWARD_IF_ERROR(rd_seal_frames(r, r->fbuf_owner));
      r->fbuf_owner = lid;
      r->fbuf_len = 0;
    }
    uint32_t *tail = NULL;
    int rc = rd_tail(r, r->fbuf_len, 1, &tail);
    if (rc != MS_OK) return rd_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
    tail[r->fbuf_len++] = f;
    break;
  }
  case R_SEGMENTS:
  case R_BLOCKS:
  case R_HISTORY:
  case R_TRACES:
  case R_ANNOTS:
    MS_FORWARD_IF_ERROR(rd_list_record(r, l, lid, r->objs.ptr[id].ref, 0));
    break;
  case R_DEVTRACES: {
    const rd_obj_t *t = &r->objs.ptr[id];
    ms_snap_device_t d = {0};
    d.ntrace = r->skip_trace ? 0 : t->count; /* skipped entries are not kept */
    d.first_trace = d.ntrace ? t->ref : UINT32_MAX; /* empty: placed in rd_finish */
    int rc = ms__snapbuild_add_device(&r->b, &d);
    if (rc != MS_OK) return rd_err(r, rc, "cannot store a device: %s", ms_strerror(rc));
    break;
  }
  default:
    break;
  }
  l = &r->objs.ptr[lid];
  if (l->count == UINT32_MAX) return rd_err(r, MS_ELIMIT, "list longer than 2^32 items");
  l->count++;
  return MS_OK;
}

static int rd_setting_value(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, ms_snap_kv_t *kv,
                            bool *keep) {
  *keep = true;
  switch (v->t) {
  case V_NONE: kv->kind = MS_SNAP_VAL_NONE; break;
  case V_BOOL: kv->kind = MS_SNAP_VAL_BOOL; kv->b = v->v.i != 0; break;
  case V_INT: kv->kind = MS_SNAP_VAL_INT; kv->i = v->v.i; break;
  case V_FLOAT: kv->kind = MS_SNAP_VAL_FLOAT; kv->f = v->v.f; break;
  case V_STR: kv->kind = MS_SNAP_VAL_STR; kv->s = v->v.s; break;
  case V_OBJ:
    if (r->objs.ptr[v->v.obj].kind == O_DICT) {
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_SETMAP, &id));
      if (r->objs.ptr[id].aux > RD_MAX_SETTINGS_DEPTH) {
        *keep = false; /* a map in a map: not in the model (PyTorch writes none) */
        break;
      }
      kv->kind = MS_SNAP_VAL_MAP;
      kv->first = r->objs.ptr[id].ref;
      kv->count = r->objs.ptr[id].count;
      break;
    }
    *keep = false; /* lists and sets have no place in the model */
    break;
  case V_SKIP:
    if (v->kind == O_DICT) return rd_cannot_skip(r, c);
    *keep = false;
    break;
  default:
    *keep = false; /* unsigned 64-bit, huge ints, bytes, tuples */
    break;
  }
  return MS_OK;
}

/* dict[k] = v */
static int rd_dict_set(rd_t *r, uint32_t did, const rd_val_t *k, const rd_val_t *v) {
  rd_obj_t *d = &r->objs.ptr[did];
  uint8_t role = d->role;
  if (role == R_NONE) return MS_OK;
  if (d->flags & (OF_USED | OF_INTERNED)) return rd_modified_after_use(r, did);
  rd_ctx_t c = {did, k, 0};
  uint8_t key = k->t == V_STR ? k->key : K_UNKNOWN;
  ms__snapbuild_t *b = &r->b;
  uint32_t id = RD_NO_OBJ;
  switch (role) {
  case R_ROOT:
    switch (key) {
    case K_SEGMENTS:
      MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_SEGMENTS, &id));
      r->root_segments = id;
      break;
    case K_DEVICE_TRACES:
      MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_DEVTRACES, &id));
      b->hdr.present |= MS_SNAP_HAS_DEVICE_TRACES;
      break;
    case K_ALLOCATOR_SETTINGS:
      MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_SETTINGS, &id));
      b->hdr.present |= MS_SNAP_HAS_SETTINGS;
      break;
    case K_EXTERNAL_ANNOTATIONS:
      MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_ANNOTS, &id));
      b->hdr.present |= MS_SNAP_HAS_ANNOTATIONS;
      break;
    default:
      break;
    }
    return MS_OK;
  case R_SEGMENT: {
    ms_snap_segment_t *s = &b->segments.ptr[d->ref];
    switch (key) {
    case K_DEVICE: return rd_want_i64(r, &c, v, &s->device);
    case K_ADDRESS: return rd_want_u64(r, &c, v, &s->address);
    case K_TOTAL_SIZE: return rd_want_u64(r, &c, v, &s->total_size);
    case K_ALLOCATED_SIZE: return rd_want_u64(r, &c, v, &s->allocated_size);
    case K_ACTIVE_SIZE: return rd_want_u64(r, &c, v, &s->active_size);
    case K_REQUESTED_SIZE:
      s->present |= MS_SEG_HAS_REQUESTED_SIZE;
      return rd_want_u64(r, &c, v, &s->requested_size);
    case K_STREAM: return rd_want_u64_wrap(r, &c, v, &s->stream);
    case K_SEGMENT_TYPE: {
      const char *t = NULL;
      MS_FORWARD_IF_ERROR(rd_want_str(r, &c, v, &t));
      s->is_large = strcmp(t, "small") != 0;
      s->present |= MS_SEG_HAS_SEGMENT_TYPE;
      return MS_OK;
    }
    case K_SEGMENT_POOL_ID:
      s->present |= MS_SEG_HAS_POOL_ID;
      return rd_want_pair(r, &c, v, s->pool_id);
    case K_IS_EXPANDABLE:
      s->present |= MS_SEG_HAS_EXPANDABLE;
      return rd_want_bool(r, &c, v, &s->is_expandable);
    case K_FRAMES: {
      uint32_t st = 0;
      MS_FORWARD_IF_ERROR(rd_frames_stack(r, &c, v, &st));
      s = &b->segments.ptr[r->objs.ptr[did].ref];
      s->stack = st;
      s->present |= MS_SEG_HAS_FRAMES;
      return MS_OK;
    }
    case K_BLOCKS: {
      MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_BLOCKS, &id));
      const rd_obj_t *l = &r->objs.ptr[id];
      s->first_block = l->count ? l->ref : UINT32_MAX;
      s->nblocks = l->count;
      return MS_OK;
    }
    default: return MS_OK;
    }
  }
  case R_BLOCK: {
    ms_snap_block_t *k2 = &b->blocks.ptr[d->ref];
    switch (key) {
    case K_ADDRESS:
      k2->present |= MS_BLOCK_HAS_ADDRESS;
      return rd_want_u64(r, &c, v, &k2->address);
    case K_SIZE: return rd_want_u64(r, &c, v, &k2->size);
    case K_REQUESTED_SIZE:
      k2->present |= MS_BLOCK_HAS_REQUESTED_SIZE;
      return rd_want_u64(r, &c, v, &k2->requested_size);
    case K_STATE:
      MS_FORWARD_IF_ERROR(rd_want_str(r, &c, v, &k2->state_name));
      k2->state = ms_block_state_parse(k2->state_name);
      return MS_OK;
    case K_FRAMES: {
      uint32_t st = 0;
      MS_FORWARD_IF_ERROR(rd_frames_stack(r, &c, v, &st));
      k2 = &b->blocks.ptr[r->objs.ptr[did].ref];
      k2->stack = st;
      k2->present |= MS_BLOCK_HAS_FRAMES;
      return MS_OK;
    }
    case K_HISTORY: {
      MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_HISTORY, &id));
      const rd_obj_t *l = &r->objs.ptr[id];
      k2->first_history = l->count ? l->ref : UINT32_MAX;
      k2->nhistory = l->count;
      k2->present |= MS_BLOCK_HAS_HISTORY;
      return MS_OK;
    }
    default: return MS_OK;
    }
  }
  case R_HIST: {
    ms_snap_history_t *h = &b->history.ptr[d->ref];
    switch (key) {
    case K_ADDR: return rd_want_u64(r, &c, v, &h->addr);
    case K_REAL_SIZE: return rd_want_u64(r, &c, v, &h->real_size);
    case K_FRAMES: {
      uint32_t st = 0;
      MS_FORWARD_IF_ERROR(rd_frames_stack(r, &c, v, &st));
      h = &b->history.ptr[r->objs.ptr[did].ref];
      h->stack = st;
      h->present |= MS_HIST_HAS_FRAMES;
      return MS_OK;
    }
    default: return MS_OK;
    }
  }
  case R_FRAME: {
    rd_pframe_t *pf = &r->pframes.ptr[d->ref];
    switch (key) {
    case K_NAME: return rd_want_str(r, &c, v, &pf->name);
    case K_FILENAME: return rd_want_str(r, &c, v, &pf->file);
    case K_LINE: return rd_want_i64(r, &c, v, &pf->line);
    default: return MS_OK;
    }
  }
  case R_TRACE: {
    ms_snap_trace_t *t = &b->trace.ptr[d->ref];
    switch (key) {
    case K_ACTION:
      MS_FORWARD_IF_ERROR(rd_want_str(r, &c, v, &t->action_name));
      t->action = ms_trace_action_parse(t->action_name);
      return MS_OK;
    case K_ADDR:
    case K_DEVICE_FREE: return rd_want_u64(r, &c, v, &t->addr);
    case K_SIZE: return rd_want_u64(r, &c, v, &t->size);
    case K_STREAM:
      t->present |= MS_TRACE_HAS_STREAM;
      return rd_want_u64_wrap(r, &c, v, &t->stream);
    case K_TIME_US:
      t->present |= MS_TRACE_HAS_TIME;
      return rd_want_i64(r, &c, v, &t->time_us);
    case K_COMPILE_CONTEXT:
      t->present |= MS_TRACE_HAS_COMPILE_CONTEXT;
      return rd_want_str(r, &c, v, &t->compile_context);
    case K_USER_METADATA:
      t->present |= MS_TRACE_HAS_USER_METADATA;
      return rd_want_str(r, &c, v, &t->user_metadata);
    case K_POOL_ID:
      t->present |= MS_TRACE_HAS_POOL_ID;
      return rd_want_pair(r, &c, v, t->pool_id);
    case K_FRAMES: {
      uint32_t st = 0;
      if (v->t == V_OBJ && v->v.obj == r->fbuf_owner && r->fbuf_len > 0) {
        /* the list just filled, the usual case: its stack is interned a little later */
        MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, R_FRAMES, &id));
        t->present |= MS_TRACE_HAS_FRAMES;
        return rd_defer_frames(r, id, r->objs.ptr[did].ref);
      }
      MS_FORWARD_IF_ERROR(rd_frames_stack(r, &c, v, &st));
      t = &b->trace.ptr[r->objs.ptr[did].ref];
      t->stack = st;
      t->present |= MS_TRACE_HAS_FRAMES;
      return MS_OK;
    }
    default: return MS_OK;
    }
  }
  case R_ANNOT: {
    ms_snap_annotation_t *a = &b->annotations.ptr[d->ref];
    switch (key) {
    case K_NAME: return rd_want_str(r, &c, v, &a->name);
    case K_STAGE: return rd_want_str(r, &c, v, &a->stage);
    case K_DEVICE: return rd_want_i64(r, &c, v, &a->device);
    case K_TIME_US: return rd_want_i64(r, &c, v, &a->time_us);
    default: return MS_OK;
    }
  }
  case R_SETTINGS:
  case R_SETMAP: {
    if (k->t != V_STR) return MS_OK; /* the model's settings have string keys */
    if (role == R_SETMAP && d->aux > RD_MAX_SETTINGS_DEPTH) return MS_OK; /* dropped map */
    ms_snap_kv_t kv = {0};
    kv.key = k->v.s;
    kv.s = "";
    bool keep;
    MS_FORWARD_IF_ERROR(rd_setting_value(r, &c, v, &kv, &keep));
    if (!keep) return MS_OK;
    int rc;
    if (role == R_SETTINGS) {
      rc = ms__snapbuild_add_setting(b, &kv);
    } else {
      uint32_t ix;
      rc = ms__snapbuild_add_setting_child(b, &kv, &ix);
      if (rc == MS_OK) {
        d = &r->objs.ptr[did];
        if (d->count == 0) {
          d->ref = ix;
        } else if (ix != d->ref + d->count) {
          char p[300];
          rd_field_path(r, did, k, p, sizeof p);
          return rd_err(r, MS_EFORMAT, "%s: unexpected pickle structure (settings out of order)",
                        p);
        }
      }
    }
    if (rc != MS_OK) return rd_err(r, rc, "cannot store a setting: %s", ms_strerror(rc));
    d = &r->objs.ptr[did];
    d->count++;
    return MS_OK;
  }
  default:
    return MS_OK;
  }
}

/* ---- opcodes --------------------------------------------------------------------------------- */

static int rd_push_str(rd_t *r, const char *p, uint64_t n) {
  if (n > RD_MAX_STR) return rd_err(r, MS_ELIMIT, "string of %" PRIu64 " bytes is too long", n);
  rd_val_t v = {V_STR, K_UNKNOWN, 0, 0, (uint32_t)n, {0}};
  int rc = ms__snapbuild_str(&r->b, p, (size_t)n, &v.v.s);
  if (rc != MS_OK) return rd_err(r, rc, "cannot store a string: %s", ms_strerror(rc));
  v.key = rd_key_lookup(p, (size_t)n);
  return rd_push(r, v);
}

static int rd_op_str(rd_t *r, uint64_t n, bool is_bytes) {
  const char *p = NULL;
  if (n > RD_MAX_STR)
    return rd_err(r, MS_ELIMIT, "declared length %" PRIu64 " is beyond the reader's limit", n);
  MS_FORWARD_IF_ERROR(rd_take(r, n, &p, is_bytes ? "a bytes value" : "a string"));
  if (is_bytes) {
    rd_val_t v = {V_BYTES, K_UNKNOWN, 0, 0, 0, {0}};
    return rd_push(r, v);
  }
  return rd_push_str(r, p, n);
}

/* Two's complement little-endian integer of n bytes (LONG1/LONG4). */
static rd_val_t rd_decode_long(const char *p, size_t n) {
  rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
  if (n == 0) return v;
  bool neg = (uint8_t)p[n - 1] & 0x80;
  uint8_t ext = neg ? 0xff : 0x00;
  size_t m = n;
  while (m > 0 && (uint8_t)p[m - 1] == ext) m--;
  if (!neg) {
    if (m > 8) {
      v.t = V_BIG;
      return v;
    }
    uint64_t u = rd_le(p, m);
    if (u <= (uint64_t)INT64_MAX) {
      v.v.i = (int64_t)u;
    } else {
      v.t = V_UINT;
      v.v.u = u;
    }
    return v;
  }
  if (m > 8 || (m == 8 && !((uint8_t)p[7] & 0x80))) {
    v.t = V_BIG;
    return v;
  }
  uint64_t u = rd_le(p, m);
  if (m < 8) u |= ~(uint64_t)0 << (8 * m);
  memcpy(&v.v.i, &u, sizeof u);
  return v;
}

static const char *rd_refused_name(int op) {
  switch (op) {
  case 'c': return "GLOBAL";
  case 0x93: return "STACK_GLOBAL";
  case 'R': return "REDUCE";
  case 'b': return "BUILD";
  case 'i': return "INST";
  case 'o': return "OBJ";
  case 0x81: return "NEWOBJ";
  case 0x92: return "NEWOBJ_EX";
  case 'P': return "PERSID";
  case 'Q': return "BINPERSID";
  case 0x82: return "EXT1";
  case 0x83: return "EXT2";
  case 0x84: return "EXT4";
  case 0x97: return "NEXT_BUFFER";
  case 0x98: return "READONLY_BUFFER";
  default: return NULL;
  }
}

static int rd_memo_put(rd_t *r, uint64_t idx) {
  if (r->st.len == 0 || (r->marks.len && r->st.len == rd_mark_pos(r)))
    return rd_err(r, MS_EFORMAT, "memo put with nothing on the stack");
  if (idx > r->memo.len + (uint64_t)RD_MEMO_SLACK || idx >= UINT32_MAX)
    return rd_err(r, MS_ELIMIT,
                  "memo index %" PRIu64 " is far beyond the %zu entries stored (sparse memos are "
                  "not supported)",
                  idx, r->memo.len);
  if (idx >= r->memo.len) {
    size_t add = (size_t)idx + 1 - r->memo.len;
    if (MS_BIGVEC_RESERVE(&r->memo, add)) return rd_err(r, MS_ENOMEM, "out of memory");
    memset(r->memo.ptr + r->memo.len, 0, add * sizeof *r->memo.ptr);
    r->memo.len += add;
  }
  r->memo.ptr[idx] = r->st.ptr[r->st.len - 1];
  return MS_OK;
}

static int rd_memo_get(rd_t *r, uint64_t idx, const char *op) {
  if (idx >= r->memo.len || r->memo.ptr[idx].t == V_UNSET)
    return rd_err(r, MS_EFORMAT, "%s %" PRIu64 ": memo entry %" PRIu64 " was never stored", op, idx,
                  idx);
  return rd_push(r, r->memo.ptr[idx]);
}

/* SETITEMS / SETITEM / DICT: items st[from..len) as key, value pairs into dict did. */
static int rd_setitems(rd_t *r, uint32_t did, size_t from) {
  size_t n = r->st.len - from;
  if (n & 1) return rd_err(r, MS_EFORMAT, "SETITEMS with an odd number of values (%zu)", n);
  if (did == RD_NO_OBJ) { /* a skipped dict */
    r->st.len = from;
    return MS_OK;
  }
  for (size_t i = from; i < r->st.len; i += 2) {
    rd_val_t k = r->st.ptr[i], v = r->st.ptr[i + 1];
    MS_FORWARD_IF_ERROR(rd_dict_set(r, did, &k, &v));
  }
  r->st.len = from;
  return MS_OK;
}

/* The hot path of real snapshots: a batch of frame dicts (memo gets, already interned) appended
 * to a frames list that is being filled. Handles the leading run of such items; returns where
 * the general path must continue. */
static size_t rd_appends_frames_fast(rd_t *r, uint32_t lid, size_t from) {
  rd_obj_t *l = &r->objs.ptr[lid];
  if (l->role != R_FRAMES || (l->flags & (OF_USED | OF_SEALED))) return from;
  if (r->fbuf_owner != lid && (r->fbuf_owner != RD_NO_OBJ || l->count != 0)) return from;
  size_t n = r->st.len - from;
  if (n == 0 || (uint64_t)l->count + n > UINT32_MAX) return from;
  size_t have = r->fbuf_owner == lid ? r->fbuf_len : 0;
  uint32_t *tail = NULL;
  if (rd_tail(r, have, n, &tail) != MS_OK) return from;
  if (r->fbuf_owner != lid) {
    r->fbuf_owner = lid;
    r->fbuf_len = 0;
  }
  const rd_val_t *v = r->st.ptr + from, *end = r->st.ptr + r->st.len;
  uint32_t *dst = tail + r->fbuf_len;
  for (; v < end; v++) {
    if (v->t != V_OBJ) break;
    rd_obj_t *o = &r->objs.ptr[v->v.obj];
    if (o->role != R_FRAME || !(o->flags & OF_INTERNED)) break;
    o->flags |= OF_USED;
    *dst++ = o->ref;
  }
  size_t done = (size_t)(v - (r->st.ptr + from));
  r->fbuf_len += done;
  l->count += (uint32_t)done;
  return from + done;
}

static int rd_appends(rd_t *r, uint32_t lid, size_t from) {
  size_t start = from;
  if (lid == RD_NO_OBJ) { /* a skipped list */
    r->st.len = from;
    return MS_OK;
  }
  from = rd_appends_frames_fast(r, lid, from);
  for (size_t i = from; i < r->st.len; i++) {
    rd_val_t v = r->st.ptr[i];
    MS_FORWARD_IF_ERROR(rd_list_append(r, lid, &v));
  }
  r->st.len = start;
  return MS_OK;
}

static int rd_target(rd_t *r, size_t at, uint8_t kind, const char *op, uint32_t *id) {
  if (at == 0 || (r->marks.len && at - 1 < rd_mark_pos(r)))
    return rd_err(r, MS_EFORMAT, "%s with nothing to add to", op);
  const rd_val_t *t = &r->st.ptr[at - 1];
  if (t->t == V_SKIP && t->kind == kind) { /* items of a skipped container: dropped */
    *id = RD_NO_OBJ;
    return MS_OK;
  }
  if (t->t != V_OBJ || r->objs.ptr[t->v.obj].kind != kind)
    return rd_err(r, MS_EFORMAT, "%s on a %s", op, rd_type_name(r, t));
  *id = t->v.obj;
  return MS_OK;
}

static int rd_tuple(rd_t *r, size_t from) {
  size_t n = r->st.len - from;
  rd_val_t v = {V_TUPLE, K_UNKNOWN, 0, 0, 0, {0}};
  if (n == 2 && r->st.ptr[from].t == V_INT && r->st.ptr[from + 1].t == V_INT) {
    if (r->pairs.len / 2 >= UINT32_MAX) return rd_err(r, MS_ELIMIT, "too many tuples");
    if (MS_VEC_RESERVE(&r->pairs, 2)) return rd_err(r, MS_ENOMEM, "out of memory");
    v.t = V_PAIR;
    v.v.pair = (uint32_t)(r->pairs.len / 2);
    r->pairs.ptr[r->pairs.len++] = r->st.ptr[from].v.i;
    r->pairs.ptr[r->pairs.len++] = r->st.ptr[from + 1].v.i;
  }
  r->st.len = from;
  return rd_push(r, v);
}

/* Builds a dict or list from the values above the topmost mark (protocol 0/1 DICT and LIST). */
static int rd_build_from_mark(rd_t *r, uint8_t kind, const char *op) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, op, &from));
  r->tmp.len = 0;
  size_t n = r->st.len - from;
  if (MS_VEC_RESERVE(&r->tmp, n)) return rd_err(r, MS_ENOMEM, "out of memory");
  if (n) memcpy(r->tmp.ptr, r->st.ptr + from, n * sizeof *r->tmp.ptr);
  r->tmp.len = n;
  r->st.len = from;
  rd_val_t ov;
  MS_FORWARD_IF_ERROR(rd_create(r, kind, &ov));
  uint32_t id = ov.t == V_OBJ ? ov.v.obj : RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_push(r, ov));
  size_t at = r->st.len;
  if (MS_VEC_RESERVE(&r->st, n)) return rd_err(r, MS_ENOMEM, "out of memory");
  if (n) memcpy(r->st.ptr + at, r->tmp.ptr, n * sizeof *r->tmp.ptr);
  r->st.len += n;
  return kind == O_DICT ? rd_setitems(r, id, at) : rd_appends(r, id, at);
}

/* Runs the VM until STOP. */
static int rd_run(rd_t *r) {
  for (;;) {
    if (ms_unlikely(r->pos >= r->len)) {
      r->op_off = r->base + r->pos;
      MS_FORWARD_IF_ERROR(rd_need(r, 1, "an opcode (no STOP)"));
    }
    r->op_off = r->base + r->pos;
    int op = (uint8_t)r->buf[r->pos++];
    const char *p = NULL;
    switch (op) {
    case 0x80: /* PROTO */
      MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "PROTO"));
      if ((uint8_t)p[0] > 5)
        return rd_err(r, MS_EUNSUPPORTED, "unsupported pickle protocol %u (0 to 5 are known)",
                      (uint8_t)p[0]);
      break;
    case 0x95: /* FRAME: framing is transparent to the reader */
      MS_FORWARD_IF_ERROR(rd_take(r, 8, &p, "FRAME"));
      break;
    case '.': { /* STOP */
      if (r->st.len == 0 || r->st.len == rd_mark_pos(r))
        return rd_err(r, MS_EFORMAT, "STOP with an empty stack");
      const rd_val_t *t = &r->st.ptr[r->st.len - 1];
      if (t->t != V_OBJ || t->v.obj != r->root)
        return rd_err(r, MS_EFORMAT,
                      "not a PyTorch memory snapshot: the top-level object is a %s, not a dict "
                      "or a list of segments",
                      rd_type_name(r, t));
      return MS_OK;
    }
    case '(': /* MARK */
      if (r->marks.len >= RD_MAX_STACK)
        return rd_err(r, MS_ELIMIT, "more than %u nested MARKs", RD_MAX_STACK);
      if (MS_VEC_PUSH(&r->marks, (uint32_t)r->st.len)) return rd_err(r, MS_ENOMEM, "out of memory");
      break;
    case '0': /* POP */
      if (r->st.len == rd_mark_pos(r) && r->marks.len) {
        r->marks.len--; /* POP of a mark, as Python's pickle does */
      } else {
        MS_FORWARD_IF_ERROR(rd_need_values(r, 1, "POP"));
        r->st.len--;
      }
      break;
    case '1': { /* POP_MARK */
      size_t from = 0;
      MS_FORWARD_IF_ERROR(rd_pop_mark(r, "POP_MARK", &from));
      r->st.len = from;
      break;
    }
    case '2': /* DUP */
      MS_FORWARD_IF_ERROR(rd_need_values(r, 1, "DUP"));
      MS_FORWARD_IF_ERROR(rd_push(r, r->st.ptr[r->st.len - 1]));
      break;
    case 'N': {
      rd_val_t v = {V_NONE, K_UNKNOWN, 0, 0, 0, {0}};
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 0x88: /* NEWTRUE */
    case 0x89: { /* NEWFALSE */
      rd_val_t v = {V_BOOL, K_UNKNOWN, 0, 0, 0, {.i = op == 0x88}};
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 'K': /* BININT1 */
    case 'M': /* BININT2 */
    case 'J': { /* BININT */
      size_t n = op == 'K' ? 1 : op == 'M' ? 2 : 4;
      MS_FORWARD_IF_ERROR(rd_take(r, n, &p, "an integer"));
      rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
      uint64_t u = rd_le(p, n);
      v.v.i = op == 'J' ? (int64_t)(int32_t)(uint32_t)u : (int64_t)u;
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 0x8a: /* LONG1 */
    case 0x8b: { /* LONG4 */
      uint64_t n;
      if (op == 0x8a) {
        MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "LONG1"));
        n = (uint8_t)p[0];
      } else {
        MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "LONG4"));
        int32_t sn = (int32_t)(uint32_t)rd_le(p, 4);
        if (sn < 0) return rd_err(r, MS_EFORMAT, "LONG4 with a negative length (%" PRId32 ")", sn);
        n = (uint64_t)sn;
        if (n > RD_MAX_LONG)
          return rd_err(r, MS_ELIMIT, "integer of %" PRIu64 " bytes is beyond the reader's limit",
                        n);
      }
      MS_FORWARD_IF_ERROR(rd_take(r, n, &p, "an integer"));
      MS_FORWARD_IF_ERROR(rd_push(r, rd_decode_long(p, (size_t)n)));
      break;
    }
    case 'I': /* INT (protocol 0; "I01" is True) */
    case 'L': { /* LONG (protocol 0) */
      char line[64], *end;
      MS_FORWARD_IF_ERROR(rd_line(r, line, sizeof line));
      size_t ln = strlen(line);
      if (op == 'L' && ln && line[ln - 1] == 'L') line[--ln] = 0;
      rd_val_t v = {V_INT, K_UNKNOWN, 0, 0, 0, {0}};
      if (op == 'I' && (strcmp(line, "00") == 0 || strcmp(line, "01") == 0)) {
        v.t = V_BOOL;
        v.v.i = line[1] == '1';
      } else {
        errno = 0;
        long long x = strtoll(line, &end, 10);
        if (end == line || *end) return rd_err(r, MS_EFORMAT, "bad integer text '%s'", line);
        if (errno) {
          v.t = V_BIG;
          if (line[0] != '-') {
            errno = 0;
            unsigned long long ux = strtoull(line, &end, 10);
            if (!errno) {
              v.t = V_UINT;
              v.v.u = ux;
            }
          }
        } else {
          v.v.i = x;
        }
      }
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 'F': { /* FLOAT (protocol 0) */
      char line[64], *end;
      MS_FORWARD_IF_ERROR(rd_line(r, line, sizeof line));
      rd_val_t v = {V_FLOAT, K_UNKNOWN, 0, 0, 0, {0}};
      v.v.f = strtod(line, &end);
      if (end == line || *end) return rd_err(r, MS_EFORMAT, "bad float text '%s'", line);
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 'G': { /* BINFLOAT: big-endian IEEE 754 double */
      MS_FORWARD_IF_ERROR(rd_take(r, 8, &p, "BINFLOAT"));
      uint64_t u = 0;
      for (int i = 0; i < 8; i++) u = (u << 8) | (uint8_t)p[i];
      rd_val_t v = {V_FLOAT, K_UNKNOWN, 0, 0, 0, {0}};
      memcpy(&v.v.f, &u, sizeof u);
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 0x8c: /* SHORT_BINUNICODE */
    case 'U':  /* SHORT_BINSTRING */
    case 'C':  /* SHORT_BINBYTES */
      MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "a string length"));
      MS_FORWARD_IF_ERROR(rd_op_str(r, (uint8_t)p[0], op == 'C'));
      break;
    case 'X': /* BINUNICODE */
    case 'T': /* BINSTRING (signed length) */
    case 'B': { /* BINBYTES */
      MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "a string length"));
      uint64_t n = rd_le(p, 4);
      if (op == 'T' && (n & 0x80000000u))
        return rd_err(r, MS_EFORMAT, "BINSTRING with a negative length");
      MS_FORWARD_IF_ERROR(rd_op_str(r, n, op == 'B'));
      break;
    }
    case 0x8d: /* BINUNICODE8 */
    case 0x8e: /* BINBYTES8 */
    case 0x96: /* BYTEARRAY8 */
      MS_FORWARD_IF_ERROR(rd_take(r, 8, &p, "a string length"));
      MS_FORWARD_IF_ERROR(rd_op_str(r, rd_le(p, 8), op != 0x8d));
      break;
    case '}': /* EMPTY_DICT */
    case ']': /* EMPTY_LIST */
    case 0x8f: { /* EMPTY_SET */
      rd_val_t v;
      MS_FORWARD_IF_ERROR(rd_create(r, op == '}' ? O_DICT : op == ']' ? O_LIST : O_SET, &v));
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 'd': /* DICT */
      MS_FORWARD_IF_ERROR(rd_build_from_mark(r, O_DICT, "DICT"));
      break;
    case 'l': /* LIST */
      MS_FORWARD_IF_ERROR(rd_build_from_mark(r, O_LIST, "LIST"));
      break;
    case ')': /* EMPTY_TUPLE */
      MS_FORWARD_IF_ERROR(rd_tuple(r, r->st.len));
      break;
    case 0x85: /* TUPLE1 */
    case 0x86: /* TUPLE2 */
    case 0x87: { /* TUPLE3 */
      size_t n = (size_t)(op - 0x84);
      MS_FORWARD_IF_ERROR(rd_need_values(r, n, "TUPLE1/2/3"));
      MS_FORWARD_IF_ERROR(rd_tuple(r, r->st.len - n));
      break;
    }
    case 't': { /* TUPLE */
      size_t from = 0;
      MS_FORWARD_IF_ERROR(rd_pop_mark(r, "TUPLE", &from));
      MS_FORWARD_IF_ERROR(rd_tuple(r, from));
      break;
    }
    case 0x91: { /* FROZENSET */
      size_t from = 0;
      MS_FORWARD_IF_ERROR(rd_pop_mark(r, "FROZENSET", &from));
      r->st.len = from;
      rd_val_t v = {V_FSET, K_UNKNOWN, 0, 0, 0, {0}};
      MS_FORWARD_IF_ERROR(rd_push(r, v));
      break;
    }
    case 's': { /* SETITEM */
      MS_FORWARD_IF_ERROR(rd_need_values(r, 3, "SETITEM"));
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_target(r, r->st.len - 2, O_DICT, "SETITEM", &id));
      MS_FORWARD_IF_ERROR(rd_setitems(r, id, r->st.len - 2));
      break;
    }
    case 'u': { /* SETITEMS */
      size_t from = 0;
      MS_FORWARD_IF_ERROR(rd_pop_mark(r, "SETITEMS", &from));
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_target(r, from, O_DICT, "SETITEMS", &id));
      MS_FORWARD_IF_ERROR(rd_setitems(r, id, from));
      break;
    }
    case 'a': { /* APPEND */
      MS_FORWARD_IF_ERROR(rd_need_values(r, 2, "APPEND"));
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_target(r, r->st.len - 1, O_LIST, "APPEND", &id));
      MS_FORWARD_IF_ERROR(rd_appends(r, id, r->st.len - 1));
      break;
    }
    case 'e': { /* APPENDS */
      size_t from = 0;
      MS_FORWARD_IF_ERROR(rd_pop_mark(r, "APPENDS", &from));
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_target(r, from, O_LIST, "APPENDS", &id));
      MS_FORWARD_IF_ERROR(rd_appends(r, id, from));
      break;
    }
    case 0x90: { /* ADDITEMS: sets are not part of the schema */
      size_t from = 0;
      MS_FORWARD_IF_ERROR(rd_pop_mark(r, "ADDITEMS", &from));
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_target(r, from, O_SET, "ADDITEMS", &id));
      r->st.len = from;
      break;
    }
    case 0x94: /* MEMOIZE */
      MS_FORWARD_IF_ERROR(rd_memo_put(r, r->memo.len));
      break;
    case 'q': /* BINPUT */
      MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "BINPUT"));
      MS_FORWARD_IF_ERROR(rd_memo_put(r, (uint8_t)p[0]));
      break;
    case 'r': /* LONG_BINPUT */
      MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "LONG_BINPUT"));
      MS_FORWARD_IF_ERROR(rd_memo_put(r, rd_le(p, 4)));
      break;
    case 'h': /* BINGET */
      MS_FORWARD_IF_ERROR(rd_take(r, 1, &p, "BINGET"));
      MS_FORWARD_IF_ERROR(rd_memo_get(r, (uint8_t)p[0], "BINGET"));
      break;
    case 'j': /* LONG_BINGET */
      MS_FORWARD_IF_ERROR(rd_take(r, 4, &p, "LONG_BINGET"));
      MS_FORWARD_IF_ERROR(rd_memo_get(r, rd_le(p, 4), "LONG_BINGET"));
      break;
    case 'p': /* PUT (protocol 0) */
    case 'g': { /* GET (protocol 0) */
      char line[32], *end;
      MS_FORWARD_IF_ERROR(rd_line(r, line, sizeof line));
      errno = 0;
      unsigned long long x = strtoull(line, &end, 10);
      if (end == line || *end || errno || line[0] == '-')
        return rd_err(r, MS_EFORMAT, "bad memo index text '%s'", line);
      MS_FORWARD_IF_ERROR(op == 'p' ? rd_memo_put(r, x) : rd_memo_get(r, x, "GET"));
      break;
    }
    case 'S':
    case 'V':
      return rd_err(r, MS_EUNSUPPORTED,
                    "opcode %s (protocol 0 text strings) is not supported; PyTorch writes "
                    "protocol 2 or later",
                    op == 'S' ? "STRING" : "UNICODE");
    default: {
      const char *name = rd_refused_name(op);
      if (name)
        return rd_err(r, MS_EREFUSED,
                      "opcode %s refused: it would import or call Python code, and memsnap never "
                      "executes anything from a pickle",
                      name);
      return rd_err(r, MS_EFORMAT, "unknown opcode 0x%02x", (unsigned)op);
    }
    }
  }
}

/* ---- finishing ------------------------------------------------------------------------------- */

/* After STOP: checks that the records tile their arrays, fills what older eras lack. */
static int rd_finish(rd_t *r, ms_snapshot_t **out) {
  MS_FORWARD_IF_ERROR(rd_flush(r));
  ms__snapbuild_t *b = &r->b;
  const rd_obj_t *root = &r->objs.ptr[r->root];
  const rd_obj_t *segs;
  if (root->role == R_ROOT) {
    if (r->root_segments == RD_NO_OBJ)
      return rd_err(r, MS_EFORMAT,
                    "not a PyTorch memory snapshot: the top-level dict has no 'segments' key");
    segs = &r->objs.ptr[r->root_segments];
    b->hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  } else if (root->role == R_SEGMENTS) {
    segs = root;
    b->hdr.origin = MS_SNAP_ORIGIN_TORCH_LIST;
  } else {
    return rd_err(r, MS_EFORMAT, "not a PyTorch memory snapshot: the top level is a set");
  }
  if ((segs->count && segs->ref != 0) || segs->count != b->segments.len)
    return rd_err(r, MS_EFORMAT, "unexpected pickle structure: segments outside 'segments'");
  uint64_t pos = 0;
  for (size_t i = 0; i < b->segments.len; i++) {
    ms_snap_segment_t *s = &b->segments.ptr[i];
    if (s->nblocks == 0) s->first_block = (uint32_t)pos;
    if (s->first_block != pos)
      return rd_err(r, MS_EFORMAT, "unexpected pickle structure: segments[%zu].blocks out of order",
                    i);
    pos += s->nblocks;
    uint64_t addr = s->address, total = 0, alloc = 0, active = 0, req = 0;
    for (uint32_t j = 0; j < s->nblocks; j++) {
      ms_snap_block_t *k = &b->blocks.ptr[s->first_block + j];
      if (!(k->present & MS_BLOCK_HAS_ADDRESS)) k->address = addr;
      addr = k->address + k->size;
      total += k->size;
      if (k->state == MS_BLOCK_ACTIVE_ALLOCATED) alloc += k->size;
      if (k->state == MS_BLOCK_ACTIVE_ALLOCATED || k->state == MS_BLOCK_ACTIVE_PENDING_FREE) {
        active += k->size;
        req += k->requested_size;
      }
    }
    /* Pre-2.0 files may lack the totals; they follow from the blocks. */
    if (s->total_size == 0) s->total_size = total;
    if (s->allocated_size == 0) s->allocated_size = alloc;
    if (s->active_size == 0) s->active_size = active;
    if (!(s->present & MS_SEG_HAS_REQUESTED_SIZE)) s->requested_size = req;
  }
  if (pos != b->blocks.len)
    return rd_err(r, MS_EFORMAT, "unexpected pickle structure: blocks outside any segment");
  pos = 0;
  for (size_t i = 0; i < b->blocks.len; i++) {
    ms_snap_block_t *k = &b->blocks.ptr[i];
    if (k->nhistory == 0) k->first_history = (uint32_t)pos;
    if (k->first_history != pos)
      return rd_err(r, MS_EFORMAT, "unexpected pickle structure: history out of order");
    pos += k->nhistory;
    if (!(k->present & MS_BLOCK_HAS_REQUESTED_SIZE) && k->nhistory)
      k->requested_size = b->history.ptr[k->first_history].real_size;
  }
  if (pos != b->history.len)
    return rd_err(r, MS_EFORMAT, "unexpected pickle structure: history outside any block");
  pos = 0;
  for (size_t i = 0; i < b->devices.len; i++) {
    ms_snap_device_t *d = &b->devices.ptr[i];
    if (d->ntrace == 0) d->first_trace = (uint32_t)pos;
    if (d->first_trace != pos)
      return rd_err(r, MS_EFORMAT, "unexpected pickle structure: device_traces[%zu] out of order",
                    i);
    pos += d->ntrace;
  }
  if (pos != b->trace.len)
    return rd_err(r, MS_EFORMAT, "unexpected pickle structure: trace entries outside "
                                 "device_traces");
  if (r->skip_trace) b->hdr.present |= MS_SNAP_TRACE_SKIPPED;
  /* Settings maps must be referenced by their parents; the builder checks ranges. */
  ms_errbuf_t inner = {{0}};
  int rc = ms__snapbuild_finish(b, out, &inner);
  if (rc != MS_OK) return rd_err(r, rc, "%s", inner.msg);
  return MS_OK;
}

int ms__pickle_read(ms_source_t *src, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb,
                    bool *cannot_skip) {
  if (cannot_skip) *cannot_skip = false;
  if (!src || !src->read || !out) return ms__errbuf_set(eb, MS_EINVAL, "invalid argument");
  if (flags & ~(unsigned)MS_LOAD_NO_TRACE)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load flags 0x%x", flags);
  rd_t *r = calloc(1, sizeof *r);
  if (!r) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  r->buf = malloc(RD_BUF_MIN);
  r->cap = RD_BUF_MIN;
  int rc = MS_OK;
  if (!r->buf) {
    free(r);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  r->src = src;
  r->eb = eb;
  r->root = RD_NO_OBJ;
  r->root_segments = RD_NO_OBJ;
  r->fbuf_owner = RD_NO_OBJ;
  r->pframe_free = RD_NO_OBJ;
  r->skip_trace = (flags & MS_LOAD_NO_TRACE) != 0;
  ms__snapbuild_init(&r->b);
  /* The first opcode must be PROTO (protocols 2 to 5); say so plainly for other files. */
  rc = rd_need(r, 2, "the pickle header");
  if (rc == MS_OK && ((uint8_t)r->buf[0] != 0x80 || (uint8_t)r->buf[1] < 2))
    rc = ms__errbuf_set(eb, MS_EFORMAT,
                        "offset 0: not a pickle of protocol 2 or later (PyTorch snapshots start "
                        "with 0x80 0x02..0x05)");
  if (rc == MS_OK) rc = rd_run(r);
  ms_snapshot_t *snap = NULL;
  if (rc == MS_OK) rc = rd_finish(r, &snap);
  if (cannot_skip) *cannot_skip = r->cannot_skip;
  ms__snapbuild_release(&r->b);
  free(r->buf);
  MS_VEC_FREE(&r->scratch);
  MS_VEC_FREE(&r->st);
  MS_VEC_FREE(&r->marks);
  MS_VEC_FREE(&r->memo);
  MS_VEC_FREE(&r->objs);
  MS_VEC_FREE(&r->pframes);
  MS_VEC_FREE(&r->pairs);
  MS_VEC_FREE(&r->tmp);
  free(r);
  if (rc == MS_OK) *out = snap;
  return rc;
}

int ms_pickle_read(ms_source_t *src, ms_snapshot_t **out, ms_errbuf_t *eb) {
  return ms__pickle_read(src, 0, out, eb, NULL);
}

int ms_pickle_read_ex(ms_source_t *src, unsigned flags, ms_snapshot_t **out, ms_errbuf_t *eb) {
  return ms__pickle_read(src, flags, out, eb, NULL);
}
