/* SPDX-License-Identifier: MIT
 * memsnap core: the writer of PyTorch snapshot pickles (memsnap/pickle.h, issue #4).
 *
 * Output is what Python's pickle.dump(snapshot, f, protocol=4) would write for the same dict:
 * PROTO 4, then the opcodes cut into FRAMEs of about 64 KiB, containers filled in batches of
 * 1000 (MARK ... APPENDS/SETITEMS, or a single APPEND/SETITEM for a batch of one), the smallest
 * integer opcode for each value (BININT1/BININT2/BININT, else LONG1 in minimal two's complement),
 * BINFLOAT, SHORT_BINUNICODE/BINUNICODE/BINUNICODE8. Through MEMOIZE/BINGET, every distinct
 * string, every frame dict and every frame list (stack) is written once; later uses are memo
 * gets, as in PyTorch's files, where frames are shared per traceback.
 *
 * Era (docs/pytorch.md): a snapshot that came from a PyTorch pickle is written with the keys its
 * `present` bits record (2.0 `history` blocks without `address` stay so; a bare list of segments
 * stays a list); a memsnap snapshot is written in the newest format.
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/pickle.h"
#include "common/hash.h"

#define WR_FRAME_TARGET (64u * 1024u)
#define WR_BATCH 1000u
#define WR_MAX_SETTINGS_DEPTH 32

typedef struct wr_str_s {
  const char *s;
  size_t len;
  uint32_t memo;
} wr_str_t;

typedef struct wr_s {
  ms_sink_t *sink;
  ms_errbuf_t *eb;
  const ms_snapshot_t *snap;
  bool torch; /* follow the present bits (snapshot read from a PyTorch pickle) */
  char *buf;  /* the current frame */
  size_t len, cap;
  int err;
  uint32_t memo_n;
  uint32_t *frame_memo; /* per frame: memo index + 1, 0 = not written yet */
  uint32_t *stack_memo; /* per stack */
  wr_str_t *strs;       /* open addressing on content */
  size_t strs_cap, strs_n;
} wr_t;

/* ---- bytes and frames ------------------------------------------------------------------------- */

static int wr_reserve(wr_t *w, size_t n) {
  if (w->err) return w->err;
  if (w->cap - w->len >= n) return MS_OK;
  size_t ncap = w->cap ? w->cap : WR_FRAME_TARGET * 2;
  while (ncap - w->len < n) {
    if (ncap > SIZE_MAX / 2) return w->err = MS_ENOMEM;
    ncap *= 2;
  }
  char *nb = realloc(w->buf, ncap);
  if (!nb) return w->err = MS_ENOMEM;
  w->buf = nb;
  w->cap = ncap;
  return MS_OK;
}

static void wr_bytes(wr_t *w, const void *p, size_t n) {
  if (wr_reserve(w, n) != MS_OK) return;
  memcpy(w->buf + w->len, p, n);
  w->len += n;
}

static inline void wr_op(wr_t *w, uint8_t op) {
  if (ms_likely(w->len < w->cap && !w->err))
    w->buf[w->len++] = (char)op;
  else
    wr_bytes(w, &op, 1);
}

static void wr_op_arg(wr_t *w, uint8_t op, uint64_t arg, size_t n) {
  char b[9];
  b[0] = (char)op;
  for (size_t i = 0; i < n; i++) b[1 + i] = (char)(arg >> (8 * i));
  wr_bytes(w, b, 1 + n);
}

static void wr_sink(wr_t *w, const char *p, size_t n) {
  if (w->err || n == 0) return;
  int rc = w->sink->write(w->sink->ctx, p, n);
  if (rc != MS_OK) w->err = rc < 0 ? rc : MS_EIO;
}

/* Emits the current frame (Python's _Framer.commit_frame). */
static void wr_commit(wr_t *w, bool force) {
  if (w->err || w->len == 0 || (!force && w->len < WR_FRAME_TARGET)) return;
  if (w->len > 4) {
    char h[9];
    h[0] = (char)0x95;
    for (int i = 0; i < 8; i++) h[1 + i] = (char)((uint64_t)w->len >> (8 * i));
    wr_sink(w, h, sizeof h);
  }
  wr_sink(w, w->buf, w->len);
  w->len = 0;
}

/* ---- scalars ---------------------------------------------------------------------------------- */

static void wr_memoize(wr_t *w, uint32_t *slot) {
  wr_op(w, 0x94);
  *slot = ++w->memo_n; /* memo index + 1 */
}

static void wr_get(wr_t *w, uint32_t idx) {
  if (idx < 256)
    wr_op_arg(w, 'h', idx, 1);
  else
    wr_op_arg(w, 'j', idx, 4);
}

static void wr_int(wr_t *w, int64_t x) {
  if (x >= 0 && x <= 0xff) {
    wr_op_arg(w, 'K', (uint64_t)x, 1);
  } else if (x >= 0 && x <= 0xffff) {
    wr_op_arg(w, 'M', (uint64_t)x, 2);
  } else if (x >= INT32_MIN && x <= INT32_MAX) {
    wr_op_arg(w, 'J', (uint64_t)(uint32_t)(int32_t)x, 4);
  } else {
    /* LONG1, minimal two's complement little-endian (Python's encode_long) */
    uint64_t u = (uint64_t)x;
    size_t n = 1;
    while (n < 8) {
      int64_t lo = -((int64_t)1 << (8 * n - 1)), hi = ((int64_t)1 << (8 * n - 1)) - 1;
      if (x >= lo && x <= hi) break;
      n++;
    }
    char b[10];
    b[0] = (char)0x8a;
    b[1] = (char)n;
    for (size_t i = 0; i < n; i++) b[2 + i] = (char)(u >> (8 * i));
    wr_bytes(w, b, 2 + n);
  }
}

static void wr_uint(wr_t *w, uint64_t x) {
  if (x <= (uint64_t)INT64_MAX) {
    wr_int(w, (int64_t)x);
    return;
  }
  char b[11];
  b[0] = (char)0x8a;
  b[1] = 9;
  for (int i = 0; i < 8; i++) b[2 + i] = (char)(x >> (8 * i));
  b[10] = 0;
  wr_bytes(w, b, sizeof b);
}

static void wr_float(wr_t *w, double f) {
  uint64_t u;
  memcpy(&u, &f, sizeof u);
  char b[9];
  b[0] = 'G';
  for (int i = 0; i < 8; i++) b[1 + i] = (char)(u >> (8 * (7 - i)));
  wr_bytes(w, b, sizeof b);
}

static void wr_bool(wr_t *w, bool v) { wr_op(w, v ? 0x88 : 0x89); }

static int wr_strs_grow(wr_t *w) {
  size_t ncap = w->strs_cap ? w->strs_cap * 2 : 1024;
  wr_str_t *nt = calloc(ncap, sizeof *nt);
  if (!nt) return w->err = MS_ENOMEM;
  for (size_t i = 0; i < w->strs_cap; i++) {
    const wr_str_t *e = &w->strs[i];
    if (!e->memo) continue;
    size_t j = (size_t)ms_hash_bytes(e->s, e->len, 0x9e11) & (ncap - 1);
    while (nt[j].memo) j = (j + 1) & (ncap - 1);
    nt[j] = *e;
  }
  free(w->strs);
  w->strs = nt;
  w->strs_cap = ncap;
  return MS_OK;
}

/* Writes a str; each distinct string is written once and memo-got afterwards. */
static void wr_str(wr_t *w, const char *s) {
  if (w->err) return;
  if (!s) s = "";
  size_t n = strlen(s);
  if ((w->strs_n + 1) * 4 > w->strs_cap * 3 && wr_strs_grow(w) != MS_OK) return;
  size_t mask = w->strs_cap - 1, j = (size_t)ms_hash_bytes(s, n, 0x9e11) & mask;
  for (; w->strs[j].memo; j = (j + 1) & mask) {
    const wr_str_t *e = &w->strs[j];
    if (e->len == n && (e->s == s || memcmp(e->s, s, n) == 0)) {
      wr_get(w, e->memo - 1);
      return;
    }
  }
  if (n < 256) {
    wr_op_arg(w, 0x8c, n, 1);
  } else if (n <= UINT32_MAX) {
    wr_op_arg(w, 'X', n, 4);
  } else {
    wr_op_arg(w, 0x8d, n, 8);
  }
  wr_bytes(w, s, n);
  wr_str_t e = {s, n, 0};
  wr_memoize(w, &e.memo);
  w->strs[j] = e;
  w->strs_n++;
}

/* ---- containers ------------------------------------------------------------------------------- */

/* Dicts: n items, known in advance (Python's _batch_setitems with n <= 1000). */
static void wr_dict_begin(wr_t *w, size_t n, uint32_t *memo) {
  wr_op(w, '}');
  if (memo) wr_memoize(w, memo); /* before the MARK, as Python's save_dict */
  if (n > 1) wr_op(w, '(');
}
static void wr_dict_end(wr_t *w, size_t n) {
  if (n > 1)
    wr_op(w, 'u');
  else if (n == 1)
    wr_op(w, 's');
}

/* Lists: call before item i and after it (Python's _batch_appends). */
static void wr_list_item_begin(wr_t *w, size_t i, size_t n) {
  if (i % WR_BATCH == 0 && n - i > 1) wr_op(w, '(');
}
static void wr_list_item_end(wr_t *w, size_t i, size_t n) {
  if ((i + 1) % WR_BATCH == 0 || i + 1 == n) {
    size_t bn = i % WR_BATCH + 1;
    wr_op(w, bn > 1 ? 'e' : 'a');
  }
  wr_commit(w, false);
}

static void wr_frame(wr_t *w, uint32_t f) {
  if (w->frame_memo[f]) {
    wr_get(w, w->frame_memo[f] - 1);
    return;
  }
  const ms_snap_frame_t *fr = &w->snap->frames[f];
  wr_dict_begin(w, 3, &w->frame_memo[f]);
  wr_str(w, "name");
  wr_str(w, fr->name);
  wr_str(w, "filename");
  wr_str(w, fr->filename);
  wr_str(w, "line");
  wr_int(w, fr->line);
  wr_dict_end(w, 3);
}

/* A frames list; MS_SNAP_NO_STACK writes []. */
static void wr_stack(wr_t *w, uint32_t st) {
  if (st == MS_SNAP_NO_STACK) {
    wr_op(w, ']');
    return;
  }
  if (w->stack_memo[st]) {
    wr_get(w, w->stack_memo[st] - 1);
    return;
  }
  const ms_snap_stack_t *s = &w->snap->stacks[st];
  wr_op(w, ']');
  wr_memoize(w, &w->stack_memo[st]);
  for (size_t i = 0; i < s->nframes; i++) {
    wr_list_item_begin(w, i, s->nframes);
    wr_frame(w, ms_snap_frame_index(w->snap, s->first + i));
    wr_list_item_end(w, i, s->nframes);
  }
}

static void wr_pair(wr_t *w, const int64_t p[2]) {
  wr_int(w, p[0]);
  wr_int(w, p[1]);
  wr_op(w, 0x86); /* TUPLE2 */
}

/* ---- the snapshot ----------------------------------------------------------------------------- */

static void wr_history(wr_t *w, const ms_snap_history_t *h) {
  bool frames = (h->present & MS_HIST_HAS_FRAMES) != 0;
  size_t n = 2 + frames;
  wr_dict_begin(w, n, NULL);
  wr_str(w, "addr");
  wr_uint(w, h->addr);
  wr_str(w, "real_size");
  wr_uint(w, h->real_size);
  if (frames) {
    wr_str(w, "frames");
    wr_stack(w, h->stack);
  }
  wr_dict_end(w, n);
}

static void wr_block(wr_t *w, const ms_snap_block_t *k) {
  const ms_snapshot_t *s = w->snap;
  bool addr = !w->torch || (k->present & MS_BLOCK_HAS_ADDRESS);
  bool req = !w->torch || (k->present & MS_BLOCK_HAS_REQUESTED_SIZE);
  bool frames = !w->torch || (k->present & MS_BLOCK_HAS_FRAMES);
  bool hist = (k->present & MS_BLOCK_HAS_HISTORY) != 0;
  size_t n = 2 + addr + req + frames + hist;
  wr_dict_begin(w, n, NULL);
  if (addr) {
    wr_str(w, "address");
    wr_uint(w, k->address);
  }
  wr_str(w, "size");
  wr_uint(w, k->size);
  if (req) {
    wr_str(w, "requested_size");
    wr_uint(w, k->requested_size);
  }
  wr_str(w, "state");
  wr_str(w, k->state == MS_BLOCK_STATE_OTHER ? k->state_name : ms_block_state_name(k->state));
  if (frames) {
    wr_str(w, "frames");
    wr_stack(w, k->stack);
  }
  if (hist) {
    wr_str(w, "history");
    wr_op(w, ']');
    for (size_t i = 0; i < k->nhistory; i++) {
      wr_list_item_begin(w, i, k->nhistory);
      wr_history(w, &s->history[k->first_history + i]);
      wr_list_item_end(w, i, k->nhistory);
    }
  }
  wr_dict_end(w, n);
}

static void wr_segment(wr_t *w, const ms_snap_segment_t *g) {
  const ms_snapshot_t *s = w->snap;
  bool req = !w->torch || (g->present & MS_SEG_HAS_REQUESTED_SIZE);
  bool type = !w->torch || (g->present & MS_SEG_HAS_SEGMENT_TYPE);
  bool pool = !w->torch || (g->present & MS_SEG_HAS_POOL_ID);
  bool exp = !w->torch || (g->present & MS_SEG_HAS_EXPANDABLE);
  bool frames = !w->torch || (g->present & MS_SEG_HAS_FRAMES);
  size_t n = 7 + req + type + pool + exp + frames;
  wr_dict_begin(w, n, NULL);
  wr_str(w, "device");
  wr_int(w, g->device);
  wr_str(w, "address");
  wr_uint(w, g->address);
  wr_str(w, "total_size");
  wr_uint(w, g->total_size);
  wr_str(w, "allocated_size");
  wr_uint(w, g->allocated_size);
  wr_str(w, "active_size");
  wr_uint(w, g->active_size);
  if (req) {
    wr_str(w, "requested_size");
    wr_uint(w, g->requested_size);
  }
  wr_str(w, "stream");
  wr_uint(w, g->stream);
  if (type) {
    wr_str(w, "segment_type");
    wr_str(w, g->is_large ? "large" : "small");
  }
  if (pool) {
    wr_str(w, "segment_pool_id");
    wr_pair(w, g->pool_id);
  }
  if (exp) {
    wr_str(w, "is_expandable");
    wr_bool(w, g->is_expandable);
  }
  if (frames) {
    wr_str(w, "frames");
    wr_stack(w, g->stack);
  }
  wr_str(w, "blocks");
  wr_op(w, ']');
  for (size_t i = 0; i < g->nblocks; i++) {
    wr_list_item_begin(w, i, g->nblocks);
    wr_block(w, &s->blocks[g->first_block + i]);
    wr_list_item_end(w, i, g->nblocks);
  }
  wr_dict_end(w, n);
}

static void wr_trace(wr_t *w, const ms_snap_trace_t *t) {
  bool stream = !w->torch || (t->present & MS_TRACE_HAS_STREAM);
  bool time = !w->torch || (t->present & MS_TRACE_HAS_TIME);
  bool cc = !w->torch || (t->present & MS_TRACE_HAS_COMPILE_CONTEXT);
  bool um = !w->torch || (t->present & MS_TRACE_HAS_USER_METADATA);
  bool pool = (t->present & MS_TRACE_HAS_POOL_ID) != 0;
  bool cat = ms_snap_trace_category(t)[0] || (w->torch && (t->present & MS_TRACE_HAS_CATEGORY));
  bool frames = w->torch ? (t->present & MS_TRACE_HAS_FRAMES) != 0 : t->stack != MS_SNAP_NO_STACK;
  bool addr = !(t->present & MS_TRACE_NO_ADDR); /* an entry read without one gets none */
  size_t n = 2 + addr + stream + time + cc + um + pool + cat + frames;
  wr_dict_begin(w, n, NULL);
  wr_str(w, "action");
  wr_str(w, ms_snap_trace_action_name(t));
  if (addr) {
    wr_str(w, t->action == MS_TRACE_OOM ? "device_free" : "addr");
    wr_uint(w, t->addr);
  }
  wr_str(w, "size");
  wr_uint(w, t->size);
  if (stream) {
    wr_str(w, "stream");
    wr_uint(w, ms_snap_trace_stream(t));
  }
  if (time) {
    wr_str(w, "time_us");
    wr_int(w, t->time_us);
  }
  if (cc) {
    wr_str(w, "compile_context");
    wr_str(w, ms_snap_trace_compile_context(t));
  }
  if (um) {
    wr_str(w, "user_metadata");
    wr_str(w, ms_snap_trace_user_metadata(t));
  }
  if (cat) {
    wr_str(w, "category");
    wr_str(w, ms_snap_trace_category(t));
  }
  if (pool) {
    wr_str(w, "pool_id");
    wr_pair(w, t->extra ? t->extra->pool_id : (const int64_t[2]){0, 0});
  }
  if (frames) {
    wr_str(w, "frames");
    wr_stack(w, t->stack);
  }
  wr_dict_end(w, n);
}

static void wr_settings(wr_t *w, size_t first, size_t count, int depth) {
  const ms_snapshot_t *s = w->snap;
  if (depth > WR_MAX_SETTINGS_DEPTH) {
    if (!w->err) w->err = MS_ELIMIT;
    return;
  }
  /* Python batches dict items by 1000 too; settings never come close, but stay correct. */
  wr_op(w, '}');
  for (size_t i = 0; i < count; i++) {
    if (i % WR_BATCH == 0 && count - i > 1) wr_op(w, '(');
    const ms_snap_kv_t *kv = &s->settings[first + i];
    wr_str(w, kv->key);
    switch (kv->kind) {
    case MS_SNAP_VAL_NONE: wr_op(w, 'N'); break;
    case MS_SNAP_VAL_BOOL: wr_bool(w, kv->b); break;
    case MS_SNAP_VAL_INT: wr_int(w, kv->i); break;
    case MS_SNAP_VAL_FLOAT: wr_float(w, kv->f); break;
    case MS_SNAP_VAL_STR: wr_str(w, kv->s); break;
    case MS_SNAP_VAL_MAP: wr_settings(w, kv->first, kv->count, depth + 1); break;
    default: wr_op(w, 'N'); break;
    }
    if ((i + 1) % WR_BATCH == 0 || i + 1 == count) wr_op(w, i % WR_BATCH > 0 ? 'u' : 's');
  }
}

static void wr_annotation(wr_t *w, const ms_snap_annotation_t *a) {
  wr_dict_begin(w, 4, NULL);
  wr_str(w, "stage");
  wr_str(w, a->stage);
  wr_str(w, "name");
  wr_str(w, a->name);
  wr_str(w, "device");
  wr_int(w, a->device);
  wr_str(w, "time_us");
  wr_int(w, a->time_us);
  wr_dict_end(w, 4);
}

static void wr_segments(wr_t *w) {
  const ms_snapshot_t *s = w->snap;
  wr_op(w, ']');
  for (size_t i = 0; i < s->nsegments; i++) {
    wr_list_item_begin(w, i, s->nsegments);
    wr_segment(w, &s->segments[i]);
    wr_list_item_end(w, i, s->nsegments);
  }
}

static void wr_snapshot(wr_t *w) {
  const ms_snapshot_t *s = w->snap;
  wr_op_arg(w, 0x80, 4, 1); /* PROTO 4, outside the first frame (as Python writes it) */
  wr_sink(w, w->buf, w->len);
  w->len = 0;
  if (s->origin == MS_SNAP_ORIGIN_TORCH_LIST) {
    wr_segments(w);
  } else {
    bool traces = !w->torch || (s->present & MS_SNAP_HAS_DEVICE_TRACES);
    bool settings = (s->present & MS_SNAP_HAS_SETTINGS) || (!w->torch && s->nsettings_top);
    bool annots = (s->present & MS_SNAP_HAS_ANNOTATIONS) || (!w->torch && s->nannotations);
    size_t n = 1 + traces + settings + annots;
    wr_dict_begin(w, n, NULL);
    wr_str(w, "segments");
    wr_segments(w);
    if (traces) {
      wr_str(w, "device_traces");
      wr_op(w, ']');
      for (size_t d = 0; d < s->ndevices; d++) {
        const ms_snap_device_t *dev = &s->devices[d];
        wr_list_item_begin(w, d, s->ndevices);
        wr_op(w, ']');
        for (size_t i = 0; i < dev->ntrace; i++) {
          wr_list_item_begin(w, i, dev->ntrace);
          wr_trace(w, &s->trace[dev->first_trace + i]);
          wr_list_item_end(w, i, dev->ntrace);
        }
        wr_list_item_end(w, d, s->ndevices);
      }
    }
    if (settings) {
      wr_str(w, "allocator_settings");
      wr_settings(w, 0, s->nsettings_top, 0);
    }
    if (annots) {
      wr_str(w, "external_annotations");
      wr_op(w, ']');
      for (size_t i = 0; i < s->nannotations; i++) {
        wr_list_item_begin(w, i, s->nannotations);
        wr_annotation(w, &s->annotations[i]);
        wr_list_item_end(w, i, s->nannotations);
      }
    }
    wr_dict_end(w, n);
  }
  wr_op(w, '.');
  wr_commit(w, true);
}

int ms_pickle_write(const ms_snapshot_t *snap, ms_sink_t *sink, ms_errbuf_t *eb) {
  if (!snap || !sink || !sink->write) return ms__errbuf_set(eb, MS_EINVAL, "invalid argument");
  if (snap->present & MS_SNAP_TRACE_SKIPPED)
    return ms__errbuf_set(eb, MS_EINVAL, "the snapshot was loaded without its trace");
  if (snap->present & MS_SNAP_TRACE_STACKS_SKIPPED)
    return ms__errbuf_set(eb, MS_EINVAL, "the snapshot was loaded without its trace's stacks");
  wr_t w;
  memset(&w, 0, sizeof w);
  w.sink = sink;
  w.eb = eb;
  w.snap = snap;
  w.torch = snap->origin != MS_SNAP_ORIGIN_MEMSNAP;
  w.frame_memo = calloc(snap->nframes ? snap->nframes : 1, sizeof *w.frame_memo);
  w.stack_memo = calloc(snap->nstacks ? snap->nstacks : 1, sizeof *w.stack_memo);
  if (!w.frame_memo || !w.stack_memo)
    w.err = MS_ENOMEM;
  else
    wr_snapshot(&w);
  free(w.frame_memo);
  free(w.stack_memo);
  free(w.strs);
  free(w.buf);
  if (w.err == MS_ENOMEM) return ms__errbuf_set(eb, w.err, "out of memory writing the pickle");
  if (w.err == MS_ELIMIT)
    return ms__errbuf_set(eb, w.err, "allocator_settings nested deeper than %d levels",
                          WR_MAX_SETTINGS_DEPTH);
  if (w.err) return ms__errbuf_set(eb, w.err, "writing the pickle failed: %s", ms_strerror(w.err));
  return MS_OK;
}

int ms_pickle_write_file(const ms_snapshot_t *snap, const char *path, ms_errbuf_t *eb) {
  ms_atomic_file_t af;
  MS_FORWARD_IF_ERROR(ms_atomic_file_open(&af, path, eb));
  ms_sink_t sink;
  ms_sink_init_file(&sink, af.fp);
  ms_errbuf_t inner = {{0}};
  int rc = ms_pickle_write(snap, &sink, &inner);
  if (rc != MS_OK) {
    ms_atomic_file_abort(&af);
    return ms__errbuf_set(eb, rc, "'%s': %s", path, inner.msg);
  }
  return ms_atomic_file_commit(&af, eb);
}
