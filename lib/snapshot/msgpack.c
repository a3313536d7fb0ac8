/* SPDX-License-Identifier: MIT
 * memsnap core: memsnap's own snapshot file format (docs/snapshot-format.md). The only file that
 * includes msgpack.h.
 *
 * Writing: msgpack-c's packer appends to a 64 KiB buffer that is handed to the ms_sink_t each time
 * it fills, so the writer's memory is bounded whatever the snapshot's size. Tables are written as
 * "chunks": top-level arrays [tag, row, row, ...] of at most WR_CHUNK_ROWS rows, each row an
 * array whose columns are fixed by the schema version.
 *
 * Reading: bytes are read from the ms_source_t into the reader's buffer. A guard scanner decides
 * where each top-level object ends and that it is well-formed: complete, no invalid type byte,
 * every declared length backed by bytes present and within the per-object limits, so nothing is
 * ever allocated for a length the file cannot back. The cold objects (header, meta, devices,
 * allocator_settings) are scanned first, then unpacked with msgpack-c (msgpack_unpack_next and a
 * zone, destroyed after each object). The chunks of the hot tables (frames, stacks, segments,
 * blocks, history, trace, annotations: fixed row shapes) are decoded by the row decoder below
 * straight from the buffer into the builder's arrays while they are read, without a guard pass;
 * on any error the guard scans the chunk and its findings come first, so the messages are those
 * of a guard-first reader (rd_hot_chunk, rd_settle). This departs from style.md 14's "decode with
 * msgpack_unpacked + zone" for speed: msgpack-c's object tree alone runs at about the 500 MB/s
 * the reader must reach (docs/snapshot-format.md, Performance). msgpack_object never leaves this
 * file. Errors name the byte offset and the field path, e.g.
 * "offset 1234: segments[3].blocks[2].size: expected unsigned integer".
 */
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/internal.h"
#include "memsnap/serialize.h"
#include "snapshot/msgpack_internal.h"
#include "model/snapbuild.h"
#include "snapshot/zio.h"

/* ---- schema constants (docs/snapshot-format.md) -------------------------------------------- */

#define SNAP_VERSION 1
/* The header object: {"magic": "memsnap-snapshot", "version": N}. Its first 16 bytes are fixed
 * and identify the format. */
static const char snap_head16[16] = "\x82\xa5magic\xb0memsnap-";
#define SNAP_MAGIC "memsnap-snapshot"

enum {
  TAG_END = 0,
  TAG_FRAMES = 1,
  TAG_STACKS,
  TAG_SEGMENTS,
  TAG_BLOCKS,
  TAG_HISTORY,
  TAG_DEVICES,
  TAG_TRACE,
  TAG_ANNOTATIONS,
  TAG_SETTINGS,
  TAG_COUNT
};

/* Order of the "counts" array in the meta object; equal to the tag order. */
static const char *const table_names[TAG_COUNT] = {
    "end",     "frames",  "stacks", "segments",    "blocks",
    "history", "devices", "trace",  "annotations", "allocator_settings",
};

/* Columns of each row, in schema order. */
static const char *const cols_frame[] = {"name", "filename", "line"};
static const char *const cols_segment[] = {
    "device",         "address", "total_size", "allocated_size", "active_size",
    "requested_size", "stream",  "is_large",   "is_expandable",  "pool_id[0]",
    "pool_id[1]",     "frames",  "nblocks",    "present"};
static const char *const cols_block[] = {"address", "size",     "requested_size", "state",
                                         "frames",  "nhistory", "present"};
static const char *const cols_history[] = {"addr", "real_size", "frames", "present"};
static const char *const cols_device[] = {"ntrace", "trace_dropped", "capacity", "present",
                                          "stats"};
static const char *const cols_trace[] = {"action",          "addr",          "size",       "stream",
                                         "time_us",         "pool_id[0]",    "pool_id[1]", "frames",
                                         "compile_context", "user_metadata", "present"};
static const char *const cols_annotation[] = {"name", "stage", "device", "time_us"};

#define NCOLS(a) (sizeof(a) / sizeof((a)[0]))

/* The row decoder's small readers must be inlined into the row loops (a call per value costs more
 * than the value). */
#if defined(__GNUC__)
#define RD_INLINE static inline __attribute__((always_inline))
#else
#define RD_INLINE static inline
#endif

/* Limits of the reader (documented in docs/snapshot-format.md). */
#define RD_OBJ_MAX_BYTES (64u * 1024u * 1024u) /* one top-level object */
#define RD_OBJ_MAX_ITEMS (1u << 21)            /* msgpack values in one top-level object */
#define RD_MAX_DEPTH 12                        /* nesting inside one top-level object */
#define RD_READ_CHUNK (256u * 1024u)
#define SETTINGS_MAX_DEPTH 8 /* nested maps in allocator_settings */

#define WR_BUF (64u * 1024u)
/* Inlines msgpack-c's static pack functions and the write callback into a table writer, so that
 * GCC devirtualizes the callback (an indirect call per value costs 3x; performance.md S1). */
#if defined(__GNUC__) && !defined(__clang__)
#define WR_FLATTEN __attribute__((flatten))
#else
#define WR_FLATTEN
#endif
#define WR_CHUNK_ROWS 1024u

/* ---- format detection ----------------------------------------------------------------------- */

ms_format ms_format_detect(const void *head, size_t len) {
  const unsigned char *p = head;
  if (!head) return MS_FORMAT_UNKNOWN;
  if (len >= sizeof snap_head16 && memcmp(p, snap_head16, sizeof snap_head16) == 0)
    return MS_FORMAT_MEMSNAP;
  if (len >= 2 && p[0] == 0x80 && p[1] >= 2 && p[1] <= 5) return MS_FORMAT_PICKLE;
  if (ms__zio_is_gzip(p, len)) {
    char out[sizeof snap_head16];
    size_t n = ms__zio_peek(p, len, out, sizeof out);
    if (n == sizeof out && memcmp(out, snap_head16, sizeof out) == 0) return MS_FORMAT_MEMSNAP_Z;
  }
  return MS_FORMAT_UNKNOWN;
}

const char *ms_format_name(ms_format f) {
  switch (f) {
  case MS_FORMAT_MEMSNAP:
    return "memsnap";
  case MS_FORMAT_MEMSNAP_Z:
    return "memsnap-z";
  case MS_FORMAT_PICKLE:
    return "pickle";
  default:
    return "unknown";
  }
}

/* ==== writer ================================================================================= */

typedef struct wr_s {
  ms_sink_t *sink;
  int err;
  size_t len;
  char buf[WR_BUF];
} wr_t;

static int wr_flush(wr_t *w) {
  if (w->len && !w->err) w->err = w->sink->write(w->sink->ctx, w->buf, w->len);
  w->len = 0;
  return w->err;
}

static MS_NOINLINE int wr_append_slow(wr_t *w, const char *b, size_t n) {
  if (wr_flush(w)) return -1;
  if (n >= WR_BUF) {
    w->err = w->sink->write(w->sink->ctx, b, n);
    return w->err ? -1 : 0;
  }
  memcpy(w->buf, b, n);
  w->len = n;
  return 0;
}

/* The packer's write callback. Small and static, so that GCC can inline it into the pack
 * functions of a local packer (an indirect call per value costs 3x, reference/performance.md). */
static inline int wr_append(void *data, const char *b, size_t n) {
  wr_t *w = data;
  if (ms_likely(n <= WR_BUF - w->len)) {
    memcpy(w->buf + w->len, b, n);
    w->len += n;
    return 0;
  }
  return wr_append_slow(w, b, n);
}

static void pk_str(msgpack_packer *pk, const char *s) {
  size_t n = s ? strlen(s) : 0;
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s ? s : "", n);
}

static void pk_stack(msgpack_packer *pk, uint32_t st) {
  if (st == MS_SNAP_NO_STACK)
    msgpack_pack_nil(pk);
  else
    msgpack_pack_uint32(pk, st);
}

static void pk_value(msgpack_packer *pk, const ms_snapshot_t *s, const ms_snap_kv_t *kv, int depth);

static void pk_kv_map(msgpack_packer *pk, const ms_snapshot_t *s, const ms_snap_kv_t *kv, size_t n,
                      int depth) {
  msgpack_pack_map(pk, n);
  for (size_t i = 0; i < n; i++) {
    pk_str(pk, kv[i].key);
    pk_value(pk, s, &kv[i], depth);
  }
}

static void pk_value(msgpack_packer *pk, const ms_snapshot_t *s, const ms_snap_kv_t *kv,
                     int depth) {
  switch (kv->kind) {
  case MS_SNAP_VAL_BOOL:
    if (kv->b)
      msgpack_pack_true(pk);
    else
      msgpack_pack_false(pk);
    break;
  case MS_SNAP_VAL_INT:
    msgpack_pack_int64(pk, kv->i);
    break;
  case MS_SNAP_VAL_FLOAT:
    msgpack_pack_double(pk, kv->f);
    break;
  case MS_SNAP_VAL_STR:
    pk_str(pk, kv->s);
    break;
  case MS_SNAP_VAL_MAP:
    pk_kv_map(pk, s, kv->count ? s->settings + kv->first : NULL, kv->count, depth + 1);
    break;
  default:
    msgpack_pack_nil(pk);
    break;
  }
}

/* Checks what the writer relies on beyond ms__snapshot_check(): the canonical layout (each
 * segment's blocks follow the previous segment's, and so on), which the format stores implicitly,
 * plus the settings' depth and the flatness of statistics. */
static int wr_check(const ms_snapshot_t *s, ms_errbuf_t *eb) {
  MS_FORWARD_IF_ERROR(ms__snapshot_check(s, eb));
  uint64_t next = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    if (s->segments[i].first_block != next)
      return ms__errbuf_set(eb, MS_EINVAL, "segment %zu: blocks are not stored in segment order",
                            i);
    next += s->segments[i].nblocks;
  }
  if (next != s->nblocks)
    return ms__errbuf_set(eb, MS_EINVAL, "%zu blocks belong to no segment",
                          (size_t)(s->nblocks - next));
  /* The reader requires every segment to be tiled by its blocks; refuse to write what it would
   * refuse to read. */
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->address > UINT64_MAX - g->total_size)
      return ms__errbuf_set(eb, MS_EINVAL, "segments[%zu]: wraps around the address space", i);
    uint64_t addr = g->address, left = g->total_size;
    for (uint32_t k = 0; k < g->nblocks; k++) {
      const ms_snap_block_t *b = &s->blocks[g->first_block + k];
      if (b->address != addr)
        return ms__errbuf_set(eb, MS_EINVAL,
                              "segments[%zu].blocks[%u]: address 0x%" PRIx64
                              " does not follow the previous block (expected 0x%" PRIx64 ")",
                              i, k, b->address, addr);
      if (b->size > left)
        return ms__errbuf_set(eb, MS_EINVAL,
                              "segments[%zu].blocks[%u]: size %" PRIu64 " exceeds the %" PRIu64
                              " bytes left in the segment",
                              i, k, b->size, left);
      addr += b->size;
      left -= b->size;
    }
    if (left != 0)
      return ms__errbuf_set(eb, MS_EINVAL,
                            "segments[%zu]: block sizes sum to %" PRIu64 ", total_size is %" PRIu64,
                            i, g->total_size - left, g->total_size);
  }
  next = 0;
  for (size_t i = 0; i < s->nblocks; i++) {
    if (s->blocks[i].nhistory && s->blocks[i].first_history != next)
      return ms__errbuf_set(eb, MS_EINVAL, "block %zu: history is not stored in block order", i);
    next += s->blocks[i].nhistory;
  }
  if (next != s->nhistory)
    return ms__errbuf_set(eb, MS_EINVAL, "history entries that belong to no block");
  uint64_t nt = 0, ns = 0;
  for (size_t i = 0; i < s->ndevices; i++) {
    const ms_snap_device_t *d = &s->devices[i];
    if ((d->ntrace && d->first_trace != nt) || (d->nstats && d->first_stat != ns))
      return ms__errbuf_set(eb, MS_EINVAL, "device %zu: trace or statistics not in device order",
                            i);
    nt += d->ntrace;
    ns += d->nstats;
  }
  if (nt != s->ntrace || ns != s->nstats)
    return ms__errbuf_set(eb, MS_EINVAL, "trace entries or statistics that belong to no device");
  for (size_t i = 0; i < s->nstats; i++)
    if (s->stats[i].kind == MS_SNAP_VAL_MAP)
      return ms__errbuf_set(eb, MS_EINVAL, "statistic '%s' is a map", s->stats[i].key);
  /* Settings depth: a MAP's children come after it (checked), so depth is the longest chain. */
  for (size_t i = 0; i < s->nsettings_top; i++) {
    /* Depth-first walk with an explicit stack of (next child, children left). */
    const ms_snap_kv_t *kv = &s->settings[i];
    uint32_t todo[SETTINGS_MAX_DEPTH + 1][2];
    if (kv->kind != MS_SNAP_VAL_MAP) continue;
    todo[0][0] = kv->first, todo[0][1] = kv->count;
    int stack_depth = 1;
    while (stack_depth > 0) {
      uint32_t *top = todo[stack_depth - 1];
      if (top[1] == 0) {
        stack_depth--;
        continue;
      }
      const ms_snap_kv_t *c = &s->settings[top[0]];
      top[0]++, top[1]--;
      if (c->kind == MS_SNAP_VAL_MAP) {
        if (stack_depth >= SETTINGS_MAX_DEPTH)
          return ms__errbuf_set(eb, MS_EINVAL, "allocator_settings nested deeper than %d",
                                SETTINGS_MAX_DEPTH);
        todo[stack_depth][0] = c->first, todo[stack_depth][1] = c->count;
        stack_depth++;
      }
    }
  }
  return MS_OK;
}

static void pk_chunk_head(msgpack_packer *pk, int tag, size_t rows) {
  msgpack_pack_array(pk, rows + 1);
  msgpack_pack_uint8(pk, (uint8_t)tag);
}

/* Each table writer packs with a local packer, so that the callback is known at compile time. */

static WR_FLATTEN void wr_frames(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->nframes && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->nframes - i < WR_CHUNK_ROWS ? s->nframes - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_FRAMES, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_frame_t *f = &s->frames[k];
      msgpack_pack_array(&pk, NCOLS(cols_frame));
      pk_str(&pk, f->name);
      pk_str(&pk, f->filename);
      msgpack_pack_int64(&pk, f->line);
    }
  }
}

static WR_FLATTEN void wr_stacks(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->nstacks && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->nstacks - i < WR_CHUNK_ROWS ? s->nstacks - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_STACKS, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_stack_t *st = &s->stacks[k];
      msgpack_pack_array(&pk, st->nframes);
      for (uint32_t j = 0; j < st->nframes; j++)
        msgpack_pack_uint32(&pk, s->stack_frames[st->first + j]);
    }
  }
}

static WR_FLATTEN void wr_segments(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->nsegments && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->nsegments - i < WR_CHUNK_ROWS ? s->nsegments - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_SEGMENTS, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_segment_t *g = &s->segments[k];
      msgpack_pack_array(&pk, NCOLS(cols_segment));
      msgpack_pack_int64(&pk, g->device);
      msgpack_pack_uint64(&pk, g->address);
      msgpack_pack_uint64(&pk, g->total_size);
      msgpack_pack_uint64(&pk, g->allocated_size);
      msgpack_pack_uint64(&pk, g->active_size);
      msgpack_pack_uint64(&pk, g->requested_size);
      msgpack_pack_uint64(&pk, g->stream);
      if (g->is_large)
        msgpack_pack_true(&pk);
      else
        msgpack_pack_false(&pk);
      if (g->is_expandable)
        msgpack_pack_true(&pk);
      else
        msgpack_pack_false(&pk);
      msgpack_pack_int64(&pk, g->pool_id[0]);
      msgpack_pack_int64(&pk, g->pool_id[1]);
      pk_stack(&pk, g->stack);
      msgpack_pack_uint32(&pk, g->nblocks);
      msgpack_pack_uint32(&pk, g->present);
    }
  }
}

static WR_FLATTEN void wr_blocks(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->nblocks && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->nblocks - i < WR_CHUNK_ROWS ? s->nblocks - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_BLOCKS, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_block_t *b = &s->blocks[k];
      msgpack_pack_array(&pk, NCOLS(cols_block));
      msgpack_pack_uint64(&pk, b->address);
      msgpack_pack_uint64(&pk, b->size);
      msgpack_pack_uint64(&pk, b->requested_size);
      if ((unsigned)b->state < MS_BLOCK_STATE_OTHER)
        msgpack_pack_uint8(&pk, (uint8_t)b->state);
      else
        pk_str(&pk, b->state_name);
      pk_stack(&pk, b->stack);
      msgpack_pack_uint32(&pk, b->nhistory);
      msgpack_pack_uint32(&pk, b->present);
    }
  }
}

static WR_FLATTEN void wr_history(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->nhistory && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->nhistory - i < WR_CHUNK_ROWS ? s->nhistory - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_HISTORY, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_history_t *h = &s->history[k];
      msgpack_pack_array(&pk, NCOLS(cols_history));
      msgpack_pack_uint64(&pk, h->addr);
      msgpack_pack_uint64(&pk, h->real_size);
      pk_stack(&pk, h->stack);
      msgpack_pack_uint32(&pk, h->present);
    }
  }
}

static WR_FLATTEN void wr_devices(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->ndevices && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->ndevices - i < WR_CHUNK_ROWS ? s->ndevices - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_DEVICES, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_device_t *d = &s->devices[k];
      msgpack_pack_array(&pk, NCOLS(cols_device));
      msgpack_pack_uint32(&pk, d->ntrace);
      msgpack_pack_uint64(&pk, d->trace_dropped);
      msgpack_pack_uint64(&pk, d->capacity);
      msgpack_pack_uint32(&pk, d->present);
      pk_kv_map(&pk, s, d->nstats ? s->stats + d->first_stat : NULL, d->nstats, 0);
    }
  }
}

static WR_FLATTEN void wr_trace(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->ntrace && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->ntrace - i < WR_CHUNK_ROWS ? s->ntrace - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_TRACE, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_trace_t *t = &s->trace[k];
      msgpack_pack_array(&pk, NCOLS(cols_trace));
      if ((unsigned)t->action < MS_TRACE_OTHER)
        msgpack_pack_uint8(&pk, (uint8_t)t->action);
      else
        pk_str(&pk, t->action_name);
      msgpack_pack_uint64(&pk, t->addr);
      msgpack_pack_uint64(&pk, t->size);
      msgpack_pack_uint64(&pk, t->stream);
      msgpack_pack_int64(&pk, t->time_us);
      msgpack_pack_int64(&pk, t->pool_id[0]);
      msgpack_pack_int64(&pk, t->pool_id[1]);
      pk_stack(&pk, t->stack);
      pk_str(&pk, t->compile_context);
      pk_str(&pk, t->user_metadata);
      msgpack_pack_uint32(&pk, t->present);
    }
  }
}

static WR_FLATTEN void wr_annotations(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);
  for (size_t i = 0; i < s->nannotations && !w->err; i += WR_CHUNK_ROWS) {
    size_t n = s->nannotations - i < WR_CHUNK_ROWS ? s->nannotations - i : WR_CHUNK_ROWS;
    pk_chunk_head(&pk, TAG_ANNOTATIONS, n);
    for (size_t k = i; k < i + n; k++) {
      const ms_snap_annotation_t *a = &s->annotations[k];
      msgpack_pack_array(&pk, NCOLS(cols_annotation));
      pk_str(&pk, a->name);
      pk_str(&pk, a->stage);
      msgpack_pack_int64(&pk, a->device);
      msgpack_pack_int64(&pk, a->time_us);
    }
  }
}

static void wr_body(wr_t *w, const ms_snapshot_t *s) {
  msgpack_packer pk;
  msgpack_packer_init(&pk, w, wr_append);

  /* Header: magic and version first (docs/snapshot-format.md). */
  msgpack_pack_map(&pk, 2);
  pk_str(&pk, "magic");
  pk_str(&pk, SNAP_MAGIC);
  pk_str(&pk, "version");
  msgpack_pack_uint32(&pk, SNAP_VERSION);

  /* Meta. */
  msgpack_pack_map(&pk, 8);
  pk_str(&pk, "writer");
  pk_str(&pk, ms_version_string());
  pk_str(&pk, "origin");
  msgpack_pack_uint32(&pk, (uint32_t)s->origin);
  pk_str(&pk, "present");
  msgpack_pack_uint32(&pk, s->present);
  pk_str(&pk, "pid");
  msgpack_pack_int64(&pk, s->pid);
  pk_str(&pk, "hostname");
  pk_str(&pk, s->hostname);
  pk_str(&pk, "rank");
  msgpack_pack_int64(&pk, s->rank);
  pk_str(&pk, "time_us");
  msgpack_pack_int64(&pk, s->time_us);
  pk_str(&pk, "counts");
  msgpack_pack_array(&pk, TAG_COUNT - 1);
  const uint64_t counts[TAG_COUNT - 1] = {s->nframes, s->nstacks,      s->nsegments,
                                          s->nblocks, s->nhistory,     s->ndevices,
                                          s->ntrace,  s->nannotations, s->nsettings_top};
  for (int i = 0; i < TAG_COUNT - 1; i++)
    msgpack_pack_uint64(&pk, counts[i]);

  wr_frames(w, s);
  wr_stacks(w, s);
  wr_segments(w, s);
  wr_blocks(w, s);
  wr_history(w, s);
  wr_devices(w, s);
  wr_trace(w, s);
  wr_annotations(w, s);
  pk_chunk_head(&pk, TAG_SETTINGS, 1);
  pk_kv_map(&pk, s, s->settings, s->nsettings_top, 0);
  pk_chunk_head(&pk, TAG_END, 0);
}

int ms_snapshot_write(const ms_snapshot_t *snap, const ms_write_opts_t *opts, ms_sink_t *sink,
                      ms_errbuf_t *eb) {
  if (!snap || !sink || !sink->write) return ms__errbuf_set(eb, MS_EINVAL, "invalid argument");
  if (snap->present & MS_SNAP_TRACE_SKIPPED)
    return ms__errbuf_set(eb, MS_EINVAL, "the snapshot was loaded without its trace");
  int level = opts ? opts->compress : 0;
  if (level < 0 || level > 9)
    return ms__errbuf_set(eb, MS_EINVAL, "compression level %d is not in 0-9", level);
  MS_FORWARD_IF_ERROR(wr_check(snap, eb));

  wr_t *w = malloc(sizeof *w);
  if (!w) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  w->len = 0;
  w->err = MS_OK;
  ms__zsink_t *z = NULL;
  ms_sink_t zsink;
  w->sink = sink;
  if (level > 0) {
    int rc = ms__zsink_create(sink, level, &z, &zsink);
    if (rc != MS_OK) {
      free(w);
      return ms__errbuf_set(eb, rc, "cannot start compression: %s", ms_strerror(rc));
    }
    w->sink = &zsink;
  }
  wr_body(w, snap);
  int rc = wr_flush(w);
  if (rc == MS_OK && z) rc = ms__zsink_finish(z);
  ms__zsink_destroy(z);
  free(w);
  if (rc != MS_OK) return ms__errbuf_set(eb, rc, "write failed: %s", ms_strerror(rc));
  return MS_OK;
}

/* ==== reader ================================================================================= */

/* Incremental guard scanner over one top-level msgpack object (see the file comment). */
typedef struct guard_s {
  size_t pos;                  /* bytes of the current object scanned */
  uint32_t depth;              /* open containers */
  uint64_t left[RD_MAX_DEPTH]; /* values still expected in each open container */
                               /* (between calls; see guard_scan) */
  uint64_t pending;            /* sum of left[] */
  uint64_t nitems;             /* values seen */
  int err;                     /* on GUARD_ERR: MS_EFORMAT or MS_ELIMIT */
} guard_t;

enum { GUARD_MORE = 0, GUARD_DONE = 1, GUARD_ERR = -1 };

static uint64_t be_read(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = (v << 8) | p[i];
  return v;
}

/* Decodes the header of the value at p (avail bytes). *hdr = header bytes, *payload = bytes that
 * follow the header, *children = values contained (maps count keys and values).
 * @return 1 ok, 0 need more bytes, -1 invalid type byte. */
static int mp_head(const unsigned char *p, size_t avail, size_t *hdr, uint64_t *payload,
                   uint64_t *children) {
  if (avail < 1) return 0;
  unsigned c = p[0];
  *payload = 0;
  *children = 0;
  *hdr = 1;
  if (c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3) return 1;
  if (c >= 0x80 && c <= 0x8f) return *children = 2u * (c & 0x0f), 1;
  if (c >= 0x90 && c <= 0x9f) return *children = c & 0x0f, 1;
  if (c >= 0xa0 && c <= 0xbf) return *payload = c & 0x1f, 1;
  int lenbytes = 0;
  switch (c) {
  case 0xc4:
  case 0xd9:
    lenbytes = 1;
    break; /* bin8 str8 */
  case 0xc5:
  case 0xda:
    lenbytes = 2;
    break; /* bin16 str16 */
  case 0xc6:
  case 0xdb:
    lenbytes = 4;
    break; /* bin32 str32 */
  case 0xc7:
  case 0xc8:
  case 0xc9: /* ext8/16/32 */
    lenbytes = c == 0xc7 ? 1 : c == 0xc8 ? 2 : 4;
    if (avail < 1u + (size_t)lenbytes) return 0;
    *payload = be_read(p + 1, lenbytes) + 1; /* type byte */
    *hdr = 1 + (size_t)lenbytes;
    return 1;
  case 0xca:
    *payload = 4;
    return 1;
  case 0xcb:
    *payload = 8;
    return 1;
  case 0xcc:
  case 0xd0:
    *payload = 1;
    return 1;
  case 0xcd:
  case 0xd1:
    *payload = 2;
    return 1;
  case 0xce:
  case 0xd2:
    *payload = 4;
    return 1;
  case 0xcf:
  case 0xd3:
    *payload = 8;
    return 1;
  case 0xd4:
    *payload = 2;
    return 1;
  case 0xd5:
    *payload = 3;
    return 1;
  case 0xd6:
    *payload = 5;
    return 1;
  case 0xd7:
    *payload = 9;
    return 1;
  case 0xd8:
    *payload = 17;
    return 1;
  case 0xdc:
  case 0xdd: /* array16/32 */
    lenbytes = c == 0xdc ? 2 : 4;
    if (avail < 1u + (size_t)lenbytes) return 0;
    *children = be_read(p + 1, lenbytes);
    *hdr = 1 + (size_t)lenbytes;
    return 1;
  case 0xde:
  case 0xdf: /* map16/32 */
    lenbytes = c == 0xde ? 2 : 4;
    if (avail < 1u + (size_t)lenbytes) return 0;
    *children = 2 * be_read(p + 1, lenbytes);
    *hdr = 1 + (size_t)lenbytes;
    return 1;
  default:
    return -1; /* 0xc1: never used */
  }
  if (avail < 1u + (size_t)lenbytes) return 0;
  *payload = be_read(p + 1, lenbytes);
  *hdr = 1 + (size_t)lenbytes;
  return 1;
}

/* Total length of the fixed-size msgpack values by type byte (fixints, nil, booleans, floats,
 * ints, fixext); 0 for the others (containers, strings, binaries, ext, the unused 0xc1). */
static const uint8_t guard_fixed_len[256] = {
    [0x00 ... 0x7f] = 1, [0xc0] = 1,  [0xc2 ... 0xc3] = 1, [0xca] = 5,          [0xcb] = 9,
    [0xcc] = 2,          [0xcd] = 3,  [0xce] = 5,          [0xcf] = 9,          [0xd0] = 2,
    [0xd1] = 3,          [0xd2] = 5,  [0xd3] = 9,          [0xd4] = 3,          [0xd5] = 4,
    [0xd6] = 6,          [0xd7] = 10, [0xd8] = 18,         [0xe0 ... 0xff] = 1,
};

static int guard_scan(guard_t *g, const unsigned char *p, size_t avail, char *why, size_t whycap) {
  /* The scan state lives in locals (stores through g could alias p, a char pointer, and force
   * reloads in the hot loop): cur = values still expected in the innermost open container (0 at
   * depth 0), outer = those expected in the other open containers; g->left[] holds the outer
   * containers' counts while they are not innermost, and pending = outer + cur. */
  size_t pos = g->pos;
  uint64_t nitems = g->nitems;
  uint32_t depth = g->depth;
  uint64_t cur = depth ? g->left[depth - 1] : 0;
  uint64_t outer = g->pending - cur;
  const size_t lim = avail < RD_OBJ_MAX_BYTES ? avail : RD_OBJ_MAX_BYTES;
  int rc = GUARD_MORE;
  while (pos < avail) {
    /* Fast path: a fixed-size scalar inside a container (most row values). The common type
     * bytes are told apart by branches, not by the table, so that finding the next value does not
     * wait for two dependent loads: the CPU predicts the branches. */
    unsigned b = p[pos];
    size_t flen;
    if (b <= 0x7f)
      flen = 1;
    else if (b == 0xcf)
      flen = 9;
    else if (b == 0xcd)
      flen = 3;
    else if (b == 0xce)
      flen = 5;
    else if (b == 0xcc)
      flen = 2;
    else
      flen = guard_fixed_len[b];
    if (ms_likely(flen != 0 && cur != 0 && nitems < RD_OBJ_MAX_ITEMS && pos + flen <= lim)) {
      pos += flen;
      nitems++;
      if (ms_likely(--cur != 0)) continue;
    } else {
      size_t hdr;
      uint64_t payload, children;
      int r = mp_head(p + pos, avail - pos, &hdr, &payload, &children);
      g->err = MS_ELIMIT;
      if (r < 0) {
        snprintf(why, whycap, "invalid msgpack type byte 0x%02x", p[pos]);
        g->err = MS_EFORMAT;
        rc = GUARD_ERR;
        break;
      }
      if (r == 0) break;
      if (payload > RD_OBJ_MAX_BYTES || pos + hdr + payload > RD_OBJ_MAX_BYTES) {
        snprintf(why, whycap,
                 "declared length %" PRIu64 " exceeds the limit of %u bytes per object", payload,
                 RD_OBJ_MAX_BYTES);
        rc = GUARD_ERR;
        break;
      }
      if (pos + hdr + payload > avail) break;
      if (++nitems > RD_OBJ_MAX_ITEMS) {
        snprintf(why, whycap, "more than %u values in one object", RD_OBJ_MAX_ITEMS);
        rc = GUARD_ERR;
        break;
      }
      /* Every promised value takes at least one byte: reject counts the object cannot hold. */
      if (children > RD_OBJ_MAX_BYTES || outer + cur + children > RD_OBJ_MAX_BYTES - pos - hdr) {
        snprintf(why, whycap,
                 "declared length %" PRIu64 " exceeds the limit of %u bytes per object", children,
                 RD_OBJ_MAX_BYTES);
        rc = GUARD_ERR;
        break;
      }
      if (children) {
        if (depth >= RD_MAX_DEPTH) {
          snprintf(why, whycap, "nesting deeper than %d levels", RD_MAX_DEPTH);
          g->err = MS_EFORMAT; /* reported at the offending header */
          rc = GUARD_ERR;
          break;
        }
        pos += hdr;
        if (depth) {
          g->left[depth - 1] = cur;
          outer += cur;
        }
        depth++;
        cur = children;
        continue;
      }
      pos += hdr + (size_t)payload;
      /* A value completed: count it in its container. */
      if (depth == 0) {
        rc = GUARD_DONE;
        break;
      }
      if (--cur != 0) continue;
    }
    /* The innermost container is complete: count it in its parents, closing those that are full. */
    for (;;) {
      if (--depth == 0) {
        rc = GUARD_DONE;
        break;
      }
      cur = g->left[depth - 1];
      outer -= cur;
      if (--cur != 0) break;
    }
    if (rc == GUARD_DONE) break;
  }
  g->pos = pos;
  g->nitems = nitems;
  g->depth = depth;
  if (depth) g->left[depth - 1] = cur;
  g->pending = outer + cur;
  return rc;
}

/* Offset of value number `idx` inside the array or map starting at p (complete object).
 * @return its offset from p, or 0 if not found. */
static size_t mp_skip(const unsigned char *p, size_t len, size_t pos) {
  uint64_t todo = 1;
  while (todo && pos < len) {
    size_t hdr;
    uint64_t payload, children;
    if (mp_head(p + pos, len - pos, &hdr, &payload, &children) != 1) return len;
    pos += hdr + (size_t)payload;
    todo += children;
    todo--;
  }
  return pos;
}

static size_t mp_child_offset(const unsigned char *p, size_t len, size_t pos, uint64_t idx) {
  size_t hdr;
  uint64_t payload, children;
  if (pos >= len || mp_head(p + pos, len - pos, &hdr, &payload, &children) != 1) return pos;
  if (idx >= children) return pos;
  pos += hdr;
  for (uint64_t i = 0; i < idx && pos < len; i++)
    pos = mp_skip(p, len, pos);
  return pos;
}

/* Reader state. */
typedef struct rd_s {
  /* input buffer: bytes [off, used) of buf are read and not yet consumed */
  unsigned char *buf;
  size_t off, used, cap;
  msgpack_unpacked mo; /* msgpack-c's tree of the current cold object (rd_unpack) */
  const char *state_names[MS_BLOCK_STATE_OTHER]; /* ms_block_state_name() of each number */
  ms_source_t *src;
  ms__zsource_t *z;
  ms_source_t zsrc;
  int eof;
  uint64_t pos; /* stream offset of the next unparsed byte */
  ms_errbuf_t *eb;
  ms__snapbuild_t b;

  /* current top-level object */
  const unsigned char *obj;
  size_t obj_len;
  uint64_t obj_off;
  uint64_t obj_items;           /* msgpack values of the rows decoded from the current chunk */
  int table;                    /* TAG_* of the current chunk */
  uint32_t row_in_chunk;        /* 0-based row inside the chunk */
  uint64_t rows[TAG_COUNT];     /* rows read per table */
  uint64_t declared[TAG_COUNT]; /* the meta object's counts */
  int version;

  /* remaps from file indices to builder indices (the builder interns) */
  MS_VEC(uint32_t) frame_map;
  MS_VEC(uint32_t) stack_map;

  /* block cursor */
  size_t seg;      /* segment whose blocks are being read, when seg_open */
  size_t seg_next; /* next segment to open */
  int seg_open;
  uint64_t seg_blocks_left, seg_bytes_left, seg_expect_addr, blk_in_seg;
  uint64_t hist_declared; /* sum of the blocks' nhistory */
  /* history cursor */
  size_t hblk;
  uint64_t hist_left, hist_in_blk;
  /* trace cursor */
  size_t tdev;
  uint64_t trace_left, trace_in_dev;
} rd_t;

/* Builds the field path of the current row (and column) for error messages. */
static void rd_path(const rd_t *r, const char *col, char *buf, size_t cap) {
  uint64_t row = r->rows[r->table];
  size_t n = 0;
  switch (r->table) {
  case TAG_FRAMES:
    n = (size_t)snprintf(buf, cap, "frames[%" PRIu64 "]", row);
    break;
  case TAG_STACKS:
    n = (size_t)snprintf(buf, cap, "stacks[%" PRIu64 "]", row);
    break;
  case TAG_SEGMENTS:
    n = (size_t)snprintf(buf, cap, "segments[%" PRIu64 "]", row);
    break;
  case TAG_BLOCKS:
    if (!r->seg_open)
      n = (size_t)snprintf(buf, cap, "blocks[%" PRIu64 "]", row);
    else
      n = (size_t)snprintf(buf, cap, "segments[%zu].blocks[%" PRIu64 "]", r->seg, r->blk_in_seg);
    break;
  case TAG_HISTORY: {
    size_t seg = 0, blk = r->hblk;
    for (size_t i = 0; i < r->b.segments.len; i++) {
      const ms_snap_segment_t *g = &r->b.segments.ptr[i];
      if (blk >= g->first_block && blk < (size_t)g->first_block + g->nblocks) {
        seg = i;
        blk -= g->first_block;
        break;
      }
    }
    n = (size_t)snprintf(buf, cap, "segments[%zu].blocks[%zu].history[%" PRIu64 "]", seg, blk,
                         r->hist_in_blk);
    break;
  }
  case TAG_DEVICES:
    n = (size_t)snprintf(buf, cap, "devices[%" PRIu64 "]", row);
    break;
  case TAG_TRACE:
    n = (size_t)snprintf(buf, cap, "device_traces[%zu][%" PRIu64 "]", r->tdev, r->trace_in_dev);
    break;
  case TAG_ANNOTATIONS:
    n = (size_t)snprintf(buf, cap, "external_annotations[%" PRIu64 "]", row);
    break;
  case TAG_SETTINGS:
    n = (size_t)snprintf(buf, cap, "allocator_settings");
    break;
  default:
    n = (size_t)snprintf(buf, cap, "%s", r->table < 0 ? "header" : "meta");
    break;
  }
  if (col && n < cap) snprintf(buf + n, cap - n, ".%s", col);
}

static int rd_fail_off(rd_t *r, int err, uint64_t off, const char *path, const char *fmt, ...)
    MS_PRINTF(5, 6);
static int rd_fail_off(rd_t *r, int err, uint64_t off, const char *path, const char *fmt, ...) {
  char msg[320];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (path && *path)
    return ms__errbuf_set(r->eb, err, "offset %" PRIu64 ": %s: %s", off, path, msg);
  return ms__errbuf_set(r->eb, err, "offset %" PRIu64 ": %s", off, msg);
}

/* Fails on column `col` (index, or -1 for the whole row) of the current row. */
static MS_NOINLINE int rd_fail_col(rd_t *r, int err, int col, const char *colname,
                                   const char *msg) {
  /* The row is element row_in_chunk + 1 of the chunk array (element 0 is the tag). */
  size_t off = mp_child_offset(r->obj, r->obj_len, 0, (uint64_t)r->row_in_chunk + 1);
  if (col >= 0) off = mp_child_offset(r->obj, r->obj_len, off, (uint64_t)col);
  char path[200];
  rd_path(r, col >= 0 ? colname : NULL, path, sizeof path);
  return rd_fail_off(r, err, r->obj_off + off, path, "%s", msg);
}

static const char *mp_type_name(msgpack_object_type t) {
  switch (t) {
  case MSGPACK_OBJECT_NIL:
    return "nil";
  case MSGPACK_OBJECT_BOOLEAN:
    return "boolean";
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    return "unsigned integer";
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    return "negative integer";
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    return "float";
  case MSGPACK_OBJECT_STR:
    return "string";
  case MSGPACK_OBJECT_ARRAY:
    return "array";
  case MSGPACK_OBJECT_MAP:
    return "map";
  case MSGPACK_OBJECT_BIN:
    return "binary";
  case MSGPACK_OBJECT_EXT:
    return "extension";
  default:
    return "unknown";
  }
}

static MS_NOINLINE int rd_type_error(rd_t *r, const msgpack_object *o, int col,
                                     const char *const *cols, const char *want) {
  char msg[96];
  snprintf(msg, sizeof msg, "expected %s, got %s", want, mp_type_name(o->type));
  return rd_fail_col(r, MS_EFORMAT, col, cols ? cols[col] : NULL, msg);
}

/* Column accessors: `row` is the row's element array, `col` the column index. */
#define RD_U64(dst, col, cols)                                                                     \
  do {                                                                                             \
    const msgpack_object *o_ = &row[col];                                                          \
    if (ms_unlikely(o_->type != MSGPACK_OBJECT_POSITIVE_INTEGER))                                  \
      return rd_type_error(r, o_, col, cols, "unsigned integer");                                  \
    (dst) = o_->via.u64;                                                                           \
  } while (0)

#define RD_U32(dst, col, cols)                                                                     \
  do {                                                                                             \
    const msgpack_object *o_ = &row[col];                                                          \
    if (ms_unlikely(o_->type != MSGPACK_OBJECT_POSITIVE_INTEGER))                                  \
      return rd_type_error(r, o_, col, cols, "unsigned integer");                                  \
    if (ms_unlikely(o_->via.u64 > UINT32_MAX))                                                     \
      return rd_fail_col(r, MS_EFORMAT, col, cols[col], "value out of range (> 4294967295)");      \
    (dst) = (uint32_t)o_->via.u64;                                                                 \
  } while (0)

static int rd_row(rd_t *r, const msgpack_object *o, size_t ncols, const msgpack_object **row) {
  if (o->type != MSGPACK_OBJECT_ARRAY) {
    char msg[96];
    snprintf(msg, sizeof msg, "expected array of %zu columns, got %s", ncols,
             mp_type_name(o->type));
    return rd_fail_col(r, MS_EFORMAT, -1, NULL, msg);
  }
  if (o->via.array.size != ncols) {
    char msg[96];
    snprintf(msg, sizeof msg, "expected %zu columns, got %" PRIu32, ncols, o->via.array.size);
    return rd_fail_col(r, MS_EFORMAT, -1, NULL, msg);
  }
  *row = o->via.array.ptr;
  return MS_OK;
}

static int rd_nomem(rd_t *r, int rc) {
  return rd_fail_off(r, rc, r->obj_off, NULL, "%s", ms_strerror(rc));
}

/* ---- direct decoding of the hot tables ---- */

/* The rows of frames, stacks, segments, blocks, history, trace and annotations are decoded
 * straight from the bytes of their chunk, in one pass that writes the builder's arrays: building
 * msgpack-c's object tree first costs as much as the whole reader may (docs/snapshot-format.md,
 * Performance). The cursor's end is the end of the buffered bytes (rd_hot_chunk) or, after a
 * guard scan, the end of the object: every read below checks its bytes against it, and a value
 * that goes on after it makes the row reader return RD_NEED_MORE. The rows have fixed shapes, so
 * the decoder only knows the scalars they use: integers (any encoding), nil, booleans, strings,
 * and the row's array header. */
typedef struct cur_s {
  const unsigned char *p;   /* the next value */
  const unsigned char *end; /* the end of the object */
} cur_t;

enum { MPI_NONE = 0, MPI_UINT = 1, MPI_NEG = 2 };

/* Returned (like an error, but > 0) by the row readers when a row goes on after the buffered
 * bytes: rd_hot_chunk() reads more input and decodes the row again. */
enum { RD_NEED_MORE = 1 };

/* Big-endian load of n = 1, 2, 4 or 8 bytes. */
RD_INLINE uint64_t ld_be(const unsigned char *p, unsigned n) {
  switch (n) {
  case 1:
    return p[0];
  case 2:
    return (uint64_t)p[0] << 8 | p[1];
  case 4:
    return (uint64_t)p[0] << 24 | (uint64_t)p[1] << 16 | (uint64_t)p[2] << 8 | p[3];
  default:
    return (uint64_t)p[0] << 56 | (uint64_t)p[1] << 48 | (uint64_t)p[2] << 40 |
           (uint64_t)p[3] << 32 | (uint64_t)p[4] << 24 | (uint64_t)p[5] << 16 |
           (uint64_t)p[6] << 8 | p[7];
  }
}

/* Reads an integer in any of msgpack's encodings. A signed encoding of a value >= 0 counts as
 * unsigned, as in msgpack-c (MSGPACK_OBJECT_POSITIVE_INTEGER).
 * @return MPI_UINT (*v = the value) or MPI_NEG (*v = the negative int64 value, as uint64) with the
 * cursor moved past it, or MPI_NONE when the value is not an integer or does not fit before the
 * end (the cursor then stays on it). */
RD_INLINE int cur_int(cur_t *c, uint64_t *v) {
  const unsigned char *p = c->p;
  if (ms_unlikely(p >= c->end)) return MPI_NONE;
  unsigned b = p[0];
  if (ms_likely(b <= 0x7f)) {
    *v = b;
    c->p = p + 1;
    return MPI_UINT;
  }
  if (b >= 0xe0) {
    *v = (uint64_t)((int64_t)b - 256);
    c->p = p + 1;
    return MPI_NEG;
  }
  if (b < 0xcc || b > 0xd3) return MPI_NONE;
  unsigned n = 1u << ((b - 0xcc) & 3); /* cc..cf uint8..64, d0..d3 int8..64 */
  if (ms_unlikely((size_t)(c->end - p) <= n)) return MPI_NONE;
  uint64_t x = ld_be(p + 1, n);
  c->p = p + 1 + n;
  if (b <= 0xcf) {
    *v = x;
    return MPI_UINT;
  }
  if (n < 8 && (x >> (8 * n - 1)) != 0) x |= ~(uint64_t)0 << (8 * n); /* sign-extend */
  *v = x;
  return (int64_t)x < 0 ? MPI_NEG : MPI_UINT;
}

/* Reads a string. @return 1 (*s, *len: its bytes, not NUL-terminated) with the cursor moved past
 * it, or 0 when the value is not a string or does not fit (the cursor stays). */
RD_INLINE int cur_str(cur_t *c, const char **s, size_t *len) {
  const unsigned char *p = c->p;
  size_t avail = (size_t)(c->end - p), hdr, n;
  if (ms_unlikely(p >= c->end)) return 0;
  unsigned b = p[0];
  if (b >= 0xa0 && b <= 0xbf) {
    hdr = 1;
    n = b & 0x1f;
  } else if (b >= 0xd9 && b <= 0xdb) {
    unsigned lb = 1u << (b - 0xd9); /* str8, str16, str32 */
    hdr = 1 + lb;
    if (avail < hdr) return 0;
    n = (size_t)ld_be(p + 1, lb);
  } else {
    return 0;
  }
  if (avail - hdr < n) return 0;
  *s = (const char *)p + hdr;
  *len = n;
  c->p = p + hdr + n;
  return 1;
}

/* @return whether the value at the cursor is a string (of any length encoding). */
RD_INLINE int cur_is_str(const cur_t *c) {
  return c->p < c->end && ((*c->p >= 0xa0 && *c->p <= 0xbf) || (*c->p >= 0xd9 && *c->p <= 0xdb));
}

/* Reads an array header. @return 1 (*n = its element count) or 0 (not an array; cursor stays). */
RD_INLINE int cur_array(cur_t *c, uint64_t *n) {
  const unsigned char *p = c->p;
  if (ms_unlikely(p >= c->end)) return 0;
  unsigned b = p[0];
  if (b >= 0x90 && b <= 0x9f) {
    *n = b & 0x0f;
    c->p = p + 1;
    return 1;
  }
  if (b != 0xdc && b != 0xdd) return 0;
  unsigned lb = b == 0xdc ? 2 : 4;
  if ((size_t)(c->end - p) <= lb) return 0;
  *n = ld_be(p + 1, lb);
  c->p = p + 1 + lb;
  return 1;
}

/* The name of the value's type at p, in msgpack-c's terms (mp_type_name). */
static const char *mp_byte_type_name(const unsigned char *p, const unsigned char *end) {
  unsigned b = p[0];
  if (b <= 0x7f || (b >= 0xcc && b <= 0xcf)) return "unsigned integer";
  if (b >= 0xe0) return "negative integer";
  if (b >= 0xd0 && b <= 0xd3) {
    cur_t c = {p, end};
    uint64_t v;
    return cur_int(&c, &v) == MPI_UINT ? "unsigned integer" : "negative integer";
  }
  if (b <= 0x8f || b == 0xde || b == 0xdf) return "map";
  if (b <= 0x9f || b == 0xdc || b == 0xdd) return "array";
  if (b <= 0xbf || (b >= 0xd9 && b <= 0xdb)) return "string";
  switch (b) {
  case 0xc0:
    return "nil";
  case 0xc2:
  case 0xc3:
    return "boolean";
  case 0xca:
  case 0xcb:
    return "float";
  case 0xc4:
  case 0xc5:
  case 0xc6:
    return "binary";
  case 0xc7:
  case 0xc8:
  case 0xc9:
  case 0xd4:
  case 0xd5:
  case 0xd6:
  case 0xd7:
  case 0xd8:
    return "extension";
  default:
    return "unknown";
  }
}

/* Fails on the value at `at` (column col of the current row, or the row itself when col < 0),
 * which is not of the type the schema wants; or returns RD_NEED_MORE when it is not complete
 * before `end` (rd_hot_chunk). */
static MS_NOINLINE int rd_bad_value(rd_t *r, const unsigned char *at, const unsigned char *end,
                                    int col, const char *colname, const char *want) {
  size_t hdr;
  uint64_t payload, children;
  int h = at < end ? mp_head(at, (size_t)(end - at), &hdr, &payload, &children) : 0;
  if (h == 1 &&
      (payload > RD_OBJ_MAX_BYTES || (size_t)(at - r->obj) + hdr + payload > RD_OBJ_MAX_BYTES))
    /* What the guard reports before it would wait for the rest (rd_settle() lets it). */
    return rd_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "declared length over the limit");
  if (h == 0 || (h == 1 && payload > (size_t)(end - at) - hdr))
    return RD_NEED_MORE; /* the value goes on after the buffered bytes */
  char msg[96];
  snprintf(msg, sizeof msg, "expected %s, got %s", want, mp_byte_type_name(at, end));
  return rd_fail_col(r, MS_EFORMAT, col, colname, msg);
}

/* Column readers: the value at the cursor is column col of the current row. Each checks the type
 * (and range) like the msgpack-c readers above and gives the same messages. */

/* The row's array header, which must announce ncols columns. */
RD_INLINE int cur_row(rd_t *r, cur_t *c, size_t ncols) {
  if (ms_likely(c->p < c->end && *c->p == 0x90 + ncols)) { /* fixarray: how writers write rows */
    c->p++;
    return MS_OK;
  }
  const unsigned char *at = c->p;
  uint64_t n;
  if (!cur_array(c, &n)) {
    char want[48];
    snprintf(want, sizeof want, "array of %zu columns", ncols);
    return rd_bad_value(r, at, c->end, -1, NULL, want);
  }
  if (n != ncols) {
    char msg[96];
    snprintf(msg, sizeof msg, "expected %zu columns, got %" PRIu64, ncols, n);
    return rd_fail_col(r, MS_EFORMAT, -1, NULL, msg);
  }
  return MS_OK;
}

RD_INLINE int cur_u64(rd_t *r, cur_t *c, int col, const char *const *cols, uint64_t *dst) {
  const unsigned char *at = c->p;
  if (ms_unlikely(cur_int(c, dst) != MPI_UINT))
    return rd_bad_value(r, at, c->end, col, cols[col], "unsigned integer");
  return MS_OK;
}

RD_INLINE int cur_u32(rd_t *r, cur_t *c, int col, const char *const *cols, uint32_t *dst) {
  uint64_t v;
  MS_FORWARD_IF_ERROR(cur_u64(r, c, col, cols, &v));
  if (ms_unlikely(v > UINT32_MAX))
    return rd_fail_col(r, MS_EFORMAT, col, cols[col], "value out of range (> 4294967295)");
  *dst = (uint32_t)v;
  return MS_OK;
}

RD_INLINE int cur_i64(rd_t *r, cur_t *c, int col, const char *const *cols, int64_t *dst) {
  const unsigned char *at = c->p;
  uint64_t v;
  int kind = cur_int(c, &v);
  if (ms_unlikely(kind == MPI_NONE)) return rd_bad_value(r, at, c->end, col, cols[col], "integer");
  if (ms_unlikely(kind == MPI_UINT && v > INT64_MAX))
    return rd_fail_col(r, MS_EFORMAT, col, cols[col], "value out of range (> INT64_MAX)");
  *dst = (int64_t)v;
  return MS_OK;
}

RD_INLINE int cur_bool(rd_t *r, cur_t *c, int col, const char *const *cols, bool *dst) {
  if (ms_unlikely(c->p >= c->end || (*c->p != 0xc2 && *c->p != 0xc3)))
    return rd_bad_value(r, c->p, c->end, col, cols[col], "boolean");
  *dst = *c->p++ == 0xc3;
  return MS_OK;
}

/* A string, copied (interned) into the builder's arena. */
RD_INLINE int cur_strcol(rd_t *r, cur_t *c, int col, const char *const *cols, const char **dst) {
  const unsigned char *at = c->p;
  const char *s;
  size_t n;
  if (ms_unlikely(!cur_str(c, &s, &n)))
    return rd_bad_value(r, at, c->end, col, cols[col], "string");
  if (n == 0) { /* what ms__snapbuild_str() gives, without the call */
    *dst = "";
    return MS_OK;
  }
  int rc = ms__snapbuild_str(&r->b, s, n, dst);
  if (rc != MS_OK) return rd_fail_col(r, rc, col, cols[col], ms_strerror(rc));
  return MS_OK;
}

/* A stack reference: nil (no stack) or an index into the stacks table. */
RD_INLINE int cur_stack_ref(rd_t *r, cur_t *c, int col, const char *const *cols, uint32_t *dst) {
  if (c->p < c->end && *c->p == 0xc0) {
    c->p++;
    *dst = MS_SNAP_NO_STACK;
    return MS_OK;
  }
  const unsigned char *at = c->p;
  uint64_t v;
  if (ms_unlikely(cur_int(c, &v) != MPI_UINT))
    return rd_bad_value(r, at, c->end, col, cols[col], "nil or stack index");
  if (ms_unlikely(v >= r->stack_map.len)) {
    char msg[96];
    snprintf(msg, sizeof msg, "stack index %" PRIu64 " out of range (%zu stacks)", v,
             r->stack_map.len);
    return rd_fail_col(r, MS_EFORMAT, col, cols[col], msg);
  }
  *dst = r->stack_map.ptr[v];
  return MS_OK;
}

/* Appends record x to the builder's vector vec: in place while there is room, else through the
 * builder's add function (which grows the vector); the same limit (rows per table) either way. */
#define RD_APPEND(r, vec, x, add_fn)                                                               \
  (ms_likely((r)->b.vec.len < (r)->b.vec.cap && (r)->b.vec.len < UINT32_MAX - 1)                   \
       ? ((r)->b.vec.ptr[(r)->b.vec.len++] = (x), MS_OK)                                           \
       : rd_added(r, add_fn(&(r)->b, &(x))))

static MS_NOINLINE int rd_added(rd_t *r, int rc) {
  return rc == MS_OK ? MS_OK : rd_nomem(r, rc);
}

/* ---- generic values (statistics and allocator_settings) ---- */

static int rd_scalar(rd_t *r, const msgpack_object *v, ms_snap_kv_t *kv, const char *path) {
  kv->s = "";
  switch (v->type) {
  case MSGPACK_OBJECT_NIL:
    kv->kind = MS_SNAP_VAL_NONE;
    return MS_OK;
  case MSGPACK_OBJECT_BOOLEAN:
    kv->kind = MS_SNAP_VAL_BOOL;
    kv->b = v->via.boolean;
    return MS_OK;
  case MSGPACK_OBJECT_POSITIVE_INTEGER:
    if (v->via.u64 > INT64_MAX)
      return rd_fail_off(r, MS_EFORMAT, r->obj_off, path, "'%s': integer out of range", kv->key);
    kv->kind = MS_SNAP_VAL_INT;
    kv->i = (int64_t)v->via.u64;
    return MS_OK;
  case MSGPACK_OBJECT_NEGATIVE_INTEGER:
    kv->kind = MS_SNAP_VAL_INT;
    kv->i = v->via.i64;
    return MS_OK;
  case MSGPACK_OBJECT_FLOAT32:
  case MSGPACK_OBJECT_FLOAT64:
    kv->kind = MS_SNAP_VAL_FLOAT;
    kv->f = v->via.f64;
    return MS_OK;
  case MSGPACK_OBJECT_STR: {
    kv->kind = MS_SNAP_VAL_STR;
    int rc = ms__snapbuild_str(&r->b, v->via.str.ptr, v->via.str.size, &kv->s);
    return rc == MS_OK ? MS_OK : rd_nomem(r, rc);
  }
  default:
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, path,
                       "'%s': expected nil, boolean, integer, float or string, got %s", kv->key,
                       mp_type_name(v->type));
  }
}

static int rd_key(rd_t *r, const msgpack_object *k, const char *path, const char **dst) {
  if (k->type != MSGPACK_OBJECT_STR)
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, path, "key: expected string, got %s",
                       mp_type_name(k->type));
  int rc = ms__snapbuild_str(&r->b, k->via.str.ptr, k->via.str.size, dst);
  return rc == MS_OK ? MS_OK : rd_nomem(r, rc);
}

/* Adds the entries of a nested settings map as one contiguous run of children; nested maps' own
 * children runs follow. *first = index of the run among children. */
static int rd_settings_children(rd_t *r, const msgpack_object_map *m, int depth, uint32_t *first) {
  if (depth > SETTINGS_MAX_DEPTH)
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, "allocator_settings", "nested deeper than %d",
                       SETTINGS_MAX_DEPTH);
  uint32_t base = (uint32_t)r->b.settings_children.len;
  for (uint32_t i = 0; i < m->size; i++) {
    ms_snap_kv_t kv = {0};
    MS_FORWARD_IF_ERROR(rd_key(r, &m->ptr[i].key, "allocator_settings", &kv.key));
    if (m->ptr[i].val.type == MSGPACK_OBJECT_MAP) {
      kv.kind = MS_SNAP_VAL_MAP;
      kv.s = "";
    } else {
      MS_FORWARD_IF_ERROR(rd_scalar(r, &m->ptr[i].val, &kv, "allocator_settings"));
    }
    uint32_t idx;
    int rc = ms__snapbuild_add_setting_child(&r->b, &kv, &idx);
    if (rc != MS_OK) return rd_nomem(r, rc);
  }
  for (uint32_t i = 0; i < m->size; i++) {
    if (m->ptr[i].val.type != MSGPACK_OBJECT_MAP) continue;
    uint32_t cfirst;
    const msgpack_object_map *cm = &m->ptr[i].val.via.map;
    MS_FORWARD_IF_ERROR(rd_settings_children(r, cm, depth + 1, &cfirst));
    r->b.settings_children.ptr[base + i].first = cfirst;
    r->b.settings_children.ptr[base + i].count = cm->size;
  }
  *first = base;
  return MS_OK;
}

static int rd_settings(rd_t *r, const msgpack_object *o) {
  if (o->type != MSGPACK_OBJECT_MAP)
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, "allocator_settings", "expected map, got %s",
                       mp_type_name(o->type));
  const msgpack_object_map *m = &o->via.map;
  for (uint32_t i = 0; i < m->size; i++) {
    ms_snap_kv_t kv = {0};
    MS_FORWARD_IF_ERROR(rd_key(r, &m->ptr[i].key, "allocator_settings", &kv.key));
    if (m->ptr[i].val.type == MSGPACK_OBJECT_MAP) {
      kv.kind = MS_SNAP_VAL_MAP;
      kv.s = "";
      MS_FORWARD_IF_ERROR(rd_settings_children(r, &m->ptr[i].val.via.map, 1, &kv.first));
      kv.count = m->ptr[i].val.via.map.size;
    } else {
      MS_FORWARD_IF_ERROR(rd_scalar(r, &m->ptr[i].val, &kv, "allocator_settings"));
    }
    int rc = ms__snapbuild_add_setting(&r->b, &kv);
    if (rc != MS_OK) return rd_nomem(r, rc);
  }
  r->rows[TAG_SETTINGS] += m->size;
  return MS_OK;
}

/* ---- rows ---- */

/* Each row reader decodes one row at *cp (advancing it past the row on success), checks every
 * column, then the row's references and the model's invariants, and appends it to the builder. */

static int rd_frame(rd_t *r, cur_t *cp) {
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_frame)));
  const char *name, *file;
  int64_t line = 0;
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 0, cols_frame, &name));
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 1, cols_frame, &file));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 2, cols_frame, &line));
  uint32_t idx;
  int rc = ms__snapbuild_frame_owned(&r->b, name, file, line, &idx);
  if (rc == MS_OK && MS_VEC_PUSH(&r->frame_map, idx)) rc = MS_ENOMEM;
  if (rc != MS_OK) return rd_nomem(r, rc);
  r->obj_items += NCOLS(cols_frame) + 1;
  *cp = c;
  return MS_OK;
}

static int rd_stack(rd_t *r, cur_t *cp) {
  cur_t c = *cp;
  const unsigned char *at = c.p;
  uint64_t n;
  if (!cur_array(&c, &n)) return rd_bad_value(r, at, c.end, -1, NULL, "array of frame indices");
  /* Before the guard has seen the whole chunk (rd_hot_chunk), n may be anything: allocate only
   * for indices that are buffered. */
  if (n > RD_OBJ_MAX_ITEMS)
    return rd_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "more than %u values in one object",
                       RD_OBJ_MAX_ITEMS);
  if (n > (size_t)(c.end - c.p)) return RD_NEED_MORE;
  uint32_t tmp[64];
  uint32_t *fr = n <= 64 ? tmp : malloc((size_t)n * sizeof *fr);
  if (!fr) return rd_nomem(r, MS_ENOMEM);
  int rc = MS_OK;
  for (uint64_t i = 0; i < n && rc == MS_OK; i++) {
    at = c.p;
    uint64_t v;
    if (cur_int(&c, &v) != MPI_UINT) {
      char col[32];
      snprintf(col, sizeof col, "frames[%" PRIu64 "]", i);
      rc = rd_bad_value(r, at, c.end, (int)i, col, "frame index");
    } else if (v >= r->frame_map.len) {
      char col[32], msg[96];
      snprintf(col, sizeof col, "frames[%" PRIu64 "]", i);
      snprintf(msg, sizeof msg, "frame index %" PRIu64 " out of range (%zu frames)", v,
               r->frame_map.len);
      rc = rd_fail_col(r, MS_EFORMAT, (int)i, col, msg);
    } else {
      fr[i] = r->frame_map.ptr[v];
    }
  }
  uint32_t idx = 0;
  if (rc == MS_OK) {
    static const uint32_t no_frames[1];
    rc = ms__snapbuild_stack(&r->b, n ? fr : no_frames, (size_t)n, &idx);
    if (rc == MS_OK && MS_VEC_PUSH(&r->stack_map, idx)) rc = MS_ENOMEM;
    if (rc != MS_OK) rc = rd_nomem(r, rc);
  }
  if (fr != tmp) free(fr);
  if (rc == MS_OK) {
    r->obj_items += n + 1;
    *cp = c;
  }
  return rc;
}

static int rd_segment(rd_t *r, cur_t *cp) {
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_segment)));
  ms_snap_segment_t g = {0};
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 0, cols_segment, &g.device));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 1, cols_segment, &g.address));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 2, cols_segment, &g.total_size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 3, cols_segment, &g.allocated_size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 4, cols_segment, &g.active_size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 5, cols_segment, &g.requested_size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 6, cols_segment, &g.stream));
  MS_FORWARD_IF_ERROR(cur_bool(r, &c, 7, cols_segment, &g.is_large));
  MS_FORWARD_IF_ERROR(cur_bool(r, &c, 8, cols_segment, &g.is_expandable));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 9, cols_segment, &g.pool_id[0]));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 10, cols_segment, &g.pool_id[1]));
  MS_FORWARD_IF_ERROR(cur_stack_ref(r, &c, 11, cols_segment, &g.stack));
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 12, cols_segment, &g.nblocks));
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 13, cols_segment, &g.present));
  if (g.address > UINT64_MAX - g.total_size)
    return rd_fail_col(r, MS_EFORMAT, 2, cols_segment[2], "segment wraps around the address space");
  uint64_t first = 0;
  if (r->b.segments.len) {
    const ms_snap_segment_t *p = &r->b.segments.ptr[r->b.segments.len - 1];
    first = (uint64_t)p->first_block + p->nblocks;
  }
  if (first + g.nblocks > UINT32_MAX - 1)
    return rd_fail_col(r, MS_ELIMIT, 12, cols_segment[12], "too many blocks");
  g.first_block = (uint32_t)first;
  MS_FORWARD_IF_ERROR(RD_APPEND(r, segments, g, ms__snapbuild_add_segment));
  r->obj_items += NCOLS(cols_segment) + 1;
  *cp = c;
  return MS_OK;
}

/* Closes the segment the block cursor is on: its blocks must cover it exactly. */
/* off = UINT64_MAX: the offset of the current row (computed only on failure). */
static int rd_close_segment(rd_t *r, uint64_t off) {
  if (!r->seg_open) return MS_OK;
  if (ms_likely(r->seg_blocks_left == 0 && r->seg_bytes_left == 0)) {
    r->seg_open = 0;
    return MS_OK;
  }
  const ms_snap_segment_t *g = &r->b.segments.ptr[r->seg];
  char path[48];
  snprintf(path, sizeof path, "segments[%zu]", r->seg);
  if (off == UINT64_MAX)
    off = r->obj_off + mp_child_offset(r->obj, r->obj_len, 0, (uint64_t)r->row_in_chunk + 1);
  if (r->seg_blocks_left != 0)
    return rd_fail_off(r, MS_EFORMAT, off, path, "declares %" PRIu32 " blocks, %" PRIu64 " found",
                       g->nblocks, r->blk_in_seg);
  if (r->seg_bytes_left != 0)
    return rd_fail_off(r, MS_EFORMAT, off, path,
                       "block sizes sum to %" PRIu64 ", total_size is %" PRIu64,
                       g->total_size - r->seg_bytes_left, g->total_size);
  r->seg_open = 0;
  return MS_OK;
}

/* Closes the current segment and opens the next one (pre: one is left). */
static int rd_next_segment(rd_t *r, uint64_t off) {
  MS_FORWARD_IF_ERROR(rd_close_segment(r, off));
  size_t next = r->seg_next++;
  const ms_snap_segment_t *g = &r->b.segments.ptr[next];
  r->seg = next;
  r->seg_open = 1;
  r->seg_blocks_left = g->nblocks;
  r->seg_bytes_left = g->total_size;
  r->seg_expect_addr = g->address;
  r->blk_in_seg = 0;
  return MS_OK;
}

/* The hottest loop of the reader: a snapshot has about 25 bytes of file per block. */
static int rd_block(rd_t *r, cur_t *cp) {
  /* Find the segment this block belongs to. */
  while (ms_unlikely(!r->seg_open || r->seg_blocks_left == 0)) {
    if (r->seg_next >= r->b.segments.len) {
      r->seg_open = 0;
      return rd_fail_col(r, MS_EFORMAT, -1, NULL, "more blocks than the segments hold");
    }
    MS_FORWARD_IF_ERROR(rd_next_segment(r, UINT64_MAX));
  }
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_block)));
  ms_snap_block_t k = {0};
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 0, cols_block, &k.address));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 1, cols_block, &k.size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 2, cols_block, &k.requested_size));
  const unsigned char *at = c.p;
  uint64_t st;
  int kind = cur_int(&c, &st);
  if (ms_likely(kind == MPI_UINT)) {
    if (st >= MS_BLOCK_STATE_OTHER)
      return rd_fail_col(r, MS_EFORMAT, 3, cols_block[3], "unknown state number");
    k.state = (ms_block_state)st;
    k.state_name = r->state_names[st];
  } else if (kind == MPI_NONE && cur_is_str(&c)) {
    MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 3, cols_block, &k.state_name));
    k.state = ms_block_state_parse(k.state_name);
  } else {
    return rd_bad_value(r, at, c.end, 3, cols_block[3], "state number or string");
  }
  MS_FORWARD_IF_ERROR(cur_stack_ref(r, &c, 4, cols_block, &k.stack));
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 5, cols_block, &k.nhistory));
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 6, cols_block, &k.present));
  if (ms_unlikely(k.address != r->seg_expect_addr)) {
    char msg[128];
    snprintf(msg, sizeof msg,
             "0x%" PRIx64 " does not follow the previous block (expected 0x%" PRIx64 ")", k.address,
             r->seg_expect_addr);
    return rd_fail_col(r, MS_EFORMAT, 0, cols_block[0], msg);
  }
  if (ms_unlikely(k.size > r->seg_bytes_left)) {
    char msg[128];
    snprintf(msg, sizeof msg, "%" PRIu64 " exceeds the %" PRIu64 " bytes left in the segment",
             k.size, r->seg_bytes_left);
    return rd_fail_col(r, MS_EFORMAT, 1, cols_block[1], msg);
  }
  if (ms_unlikely(r->hist_declared + k.nhistory > UINT32_MAX - 1))
    return rd_fail_col(r, MS_ELIMIT, 5, cols_block[5], "too many history entries");
  k.first_history = (uint32_t)r->hist_declared;
  r->hist_declared += k.nhistory;
  MS_FORWARD_IF_ERROR(RD_APPEND(r, blocks, k, ms__snapbuild_add_block));
  r->seg_expect_addr += k.size;
  r->seg_bytes_left -= k.size;
  r->seg_blocks_left--;
  r->blk_in_seg++;
  r->obj_items += NCOLS(cols_block) + 1;
  *cp = c;
  return MS_OK;
}

static int rd_history(rd_t *r, cur_t *cp) {
  while (r->hist_left == 0) {
    size_t next = r->hblk == SIZE_MAX ? 0 : r->hblk + 1;
    while (next < r->b.blocks.len && r->b.blocks.ptr[next].nhistory == 0)
      next++;
    if (next >= r->b.blocks.len)
      return rd_fail_col(r, MS_EFORMAT, -1, NULL, "more history entries than the blocks declare");
    r->hblk = next;
    r->hist_left = r->b.blocks.ptr[next].nhistory;
    r->hist_in_blk = 0;
  }
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_history)));
  ms_snap_history_t h = {0};
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 0, cols_history, &h.addr));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 1, cols_history, &h.real_size));
  MS_FORWARD_IF_ERROR(cur_stack_ref(r, &c, 2, cols_history, &h.stack));
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 3, cols_history, &h.present));
  MS_FORWARD_IF_ERROR(RD_APPEND(r, history, h, ms__snapbuild_add_history));
  r->hist_left--;
  r->hist_in_blk++;
  r->obj_items += NCOLS(cols_history) + 1;
  *cp = c;
  return MS_OK;
}

static int rd_device(rd_t *r, const msgpack_object *o) {
  const msgpack_object *row = NULL;
  MS_FORWARD_IF_ERROR(rd_row(r, o, NCOLS(cols_device), &row));
  ms_snap_device_t d = {0};
  RD_U32(d.ntrace, 0, cols_device);
  RD_U64(d.trace_dropped, 1, cols_device);
  RD_U64(d.capacity, 2, cols_device);
  RD_U32(d.present, 3, cols_device);
  uint64_t tfirst = 0;
  if (r->b.devices.len) {
    const ms_snap_device_t *p = &r->b.devices.ptr[r->b.devices.len - 1];
    tfirst = (uint64_t)p->first_trace + p->ntrace;
  }
  if (tfirst + d.ntrace > UINT32_MAX - 1)
    return rd_fail_col(r, MS_ELIMIT, 0, cols_device[0], "too many trace entries");
  d.first_trace = (uint32_t)tfirst;
  const msgpack_object *m = &row[4];
  if (m->type != MSGPACK_OBJECT_MAP) return rd_type_error(r, m, 4, cols_device, "map");
  d.first_stat = (uint32_t)r->b.stats.len;
  d.nstats = m->via.map.size;
  char path[64];
  rd_path(r, "stats", path, sizeof path);
  for (uint32_t i = 0; i < m->via.map.size; i++) {
    ms_snap_kv_t kv = {0};
    MS_FORWARD_IF_ERROR(rd_key(r, &m->via.map.ptr[i].key, path, &kv.key));
    MS_FORWARD_IF_ERROR(rd_scalar(r, &m->via.map.ptr[i].val, &kv, path));
    int rc = ms__snapbuild_add_stat(&r->b, &kv);
    if (rc != MS_OK) return rd_nomem(r, rc);
  }
  int rc = ms__snapbuild_add_device(&r->b, &d);
  return rc == MS_OK ? MS_OK : rd_nomem(r, rc);
}

static int rd_trace(rd_t *r, cur_t *cp) {
  while (r->trace_left == 0) {
    size_t next = r->tdev == SIZE_MAX ? 0 : r->tdev + 1;
    while (next < r->b.devices.len && r->b.devices.ptr[next].ntrace == 0)
      next++;
    if (next >= r->b.devices.len)
      return rd_fail_col(r, MS_EFORMAT, -1, NULL, "more trace entries than the devices declare");
    r->tdev = next;
    r->trace_left = r->b.devices.ptr[next].ntrace;
    r->trace_in_dev = 0;
  }
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_trace)));
  ms_snap_trace_t t = {0};
  const unsigned char *at = c.p;
  uint64_t act;
  int kind = cur_int(&c, &act);
  if (ms_likely(kind == MPI_UINT)) {
    if (act >= MS_TRACE_OTHER)
      return rd_fail_col(r, MS_EFORMAT, 0, cols_trace[0], "unknown action number");
    t.action = (ms_trace_action)act;
    t.action_name = ms_trace_action_name(t.action);
  } else if (kind == MPI_NONE && cur_is_str(&c)) {
    MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 0, cols_trace, &t.action_name));
    t.action = ms_trace_action_parse(t.action_name);
  } else {
    return rd_bad_value(r, at, c.end, 0, cols_trace[0], "action number or string");
  }
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 1, cols_trace, &t.addr));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 2, cols_trace, &t.size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 3, cols_trace, &t.stream));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 4, cols_trace, &t.time_us));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 5, cols_trace, &t.pool_id[0]));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 6, cols_trace, &t.pool_id[1]));
  MS_FORWARD_IF_ERROR(cur_stack_ref(r, &c, 7, cols_trace, &t.stack));
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 8, cols_trace, &t.compile_context));
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 9, cols_trace, &t.user_metadata));
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 10, cols_trace, &t.present));
  MS_FORWARD_IF_ERROR(RD_APPEND(r, trace, t, ms__snapbuild_add_trace));
  r->trace_left--;
  r->trace_in_dev++;
  r->obj_items += NCOLS(cols_trace) + 1;
  *cp = c;
  return MS_OK;
}

static int rd_annotation(rd_t *r, cur_t *cp) {
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_annotation)));
  ms_snap_annotation_t a = {0};
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 0, cols_annotation, &a.name));
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 1, cols_annotation, &a.stage));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 2, cols_annotation, &a.device));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 3, cols_annotation, &a.time_us));
  MS_FORWARD_IF_ERROR(RD_APPEND(r, annotations, a, ms__snapbuild_add_annotation));
  r->obj_items += NCOLS(cols_annotation) + 1;
  *cp = c;
  return MS_OK;
}

/* ---- objects ---- */

/* Makes room for at least `want` more bytes after the buffered ones: moves the unconsumed bytes
 * to the front of the buffer, then grows it. Invalidates r->obj. */
static int rd_reserve(rd_t *r, size_t want) {
  if (r->cap - r->used >= want) return MS_OK;
  if (r->off > 0) {
    memmove(r->buf, r->buf + r->off, r->used - r->off);
    r->used -= r->off;
    r->off = 0;
    if (r->cap - r->used >= want) return MS_OK;
  }
  size_t ncap = r->cap ? r->cap : 64 * 1024;
  while (ncap - r->used < want) {
    if (ncap > SIZE_MAX / 2) return MS_ENOMEM;
    ncap *= 2;
  }
  unsigned char *nb = realloc(r->buf, ncap);
  if (!nb) return MS_ENOMEM;
  r->buf = nb;
  r->cap = ncap;
  return MS_OK;
}

/* Reads more input after the buffered bytes (at least `want` bytes of room). Sets r->eof at the
 * end of the input. @return MS_OK or a described error (at offset `off`). */
static int rd_fill(rd_t *r, size_t want, uint64_t off) {
  if (rd_reserve(r, want) != MS_OK) return rd_fail_off(r, MS_ENOMEM, r->pos, NULL, "out of memory");
  ms_source_t *src = r->z ? &r->zsrc : r->src;
  ptrdiff_t n = src->read(src->ctx, (char *)r->buf + r->used, r->cap - r->used);
  if (n < 0) {
    const char *zm = r->z ? ms__zsource_error(r->z) : "";
    return rd_fail_off(r, (int)n, off, NULL, "%s", *zm ? zm : ms_strerror((int)n));
  }
  if (n == 0) r->eof = 1;
  r->used += (size_t)n;
  return MS_OK;
}

/* Reads until guard_scan() finds the object at the start of the buffered bytes complete and within
 * the limits; *len = its length. @return 1 object, 0 clean end of input (nothing pending), or a
 * negative error. */
static int rd_scan(rd_t *r, const char *expect, size_t *len) {
  guard_t g;
  memset(&g, 0, sizeof g);
  char why[160];
  for (;;) {
    size_t avail = r->used - r->off;
    int gr = guard_scan(&g, r->buf + r->off, avail, why, sizeof why);
    if (gr == GUARD_DONE) break;
    if (gr == GUARD_ERR) return rd_fail_off(r, g.err, r->pos + g.pos, NULL, "%s", why);
    if (r->eof) {
      if (avail == 0) return 0;
      return rd_fail_off(r, MS_ETRUNCATED, r->pos + avail, NULL,
                         "truncated input in %s (object at offset %" PRIu64 " is incomplete)",
                         expect, r->pos);
    }
    /* Small reads first (small files stay cheap), large ones once the input proves large. */
    size_t want = r->pos + avail < 4 * RD_READ_CHUNK ? RD_READ_CHUNK / 8 : RD_READ_CHUNK;
    MS_FORWARD_IF_ERROR(rd_fill(r, want, r->pos + avail));
  }
  *len = g.pos;
  return 1;
}

/* Fetches the next top-level object into r->obj (valid until the next call) after the guard has
 * scanned it (rd_scan). @return 1 object, 0 clean end of input, or a negative error. */
static int rd_next(rd_t *r, const char *expect) {
  size_t len = 0;
  int rc = rd_scan(r, expect, &len);
  if (rc != 1) return rc;
  r->obj = r->buf + r->off;
  r->obj_len = len;
  r->obj_off = r->pos;
  r->off += len;
  r->pos += len;
  return 1;
}

/* Unpacks the current object with msgpack-c into r->mo (the cold objects: header, meta, devices
 * and allocator_settings, where msgpack-c's tree costs nothing measurable and reads best).
 * The guard has accepted the object, so msgpack-c allocates only for values present in it. */
static int rd_unpack(rd_t *r, const char *expect, msgpack_object *o) {
  size_t off = 0;
  msgpack_unpack_return ret = msgpack_unpack_next(&r->mo, (const char *)r->obj, r->obj_len, &off);
  *o = r->mo.data; /* (set on failure too: keeps GCC's -Wmaybe-uninitialized quiet) */
  if (ret != MSGPACK_UNPACK_SUCCESS || off != r->obj_len)
    return rd_fail_off(r, ret == MSGPACK_UNPACK_NOMEM_ERROR ? MS_ENOMEM : MS_EFORMAT, r->obj_off,
                       NULL, "malformed msgpack in %s", expect);
  return MS_OK;
}

/* Ends the use of the current object (and frees msgpack-c's zone, if it was unpacked). */
static void rd_release_obj(rd_t *r) {
  msgpack_unpacked_destroy(&r->mo);
  r->obj = NULL;
}

static int str_eq(const msgpack_object *o, const char *s) {
  size_t n = strlen(s);
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

static int rd_header(rd_t *r) {
  int rc = rd_next(r, "the header");
  if (rc == 0) return rd_fail_off(r, MS_ETRUNCATED, 0, NULL, "empty input");
  if (rc < 0) return rc;
  msgpack_object o;
  MS_FORWARD_IF_ERROR(rd_unpack(r, "the header", &o));
  if (o.type != MSGPACK_OBJECT_MAP || o.via.map.size < 2 ||
      !str_eq(&o.via.map.ptr[0].key, "magic") || !str_eq(&o.via.map.ptr[0].val, SNAP_MAGIC))
    return rd_fail_off(r, MS_EFORMAT, 0, NULL, "not a memsnap snapshot (bad magic)");
  const msgpack_object *v = &o.via.map.ptr[1].val;
  if (!str_eq(&o.via.map.ptr[1].key, "version") || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return rd_fail_off(r, MS_EFORMAT, mp_child_offset(r->obj, r->obj_len, 0, 2), "header.version",
                       "expected unsigned integer");
  if (v->via.u64 < 1 || v->via.u64 > SNAP_VERSION)
    return rd_fail_off(r, MS_EUNSUPPORTED, mp_child_offset(r->obj, r->obj_len, 0, 3),
                       "header.version",
                       "unsupported format version %" PRIu64 " (this build reads 1 to %d)",
                       v->via.u64, SNAP_VERSION);
  r->version = (int)v->via.u64;
  rd_release_obj(r);
  return MS_OK;
}

static int rd_meta(rd_t *r) {
  int rc = rd_next(r, "meta");
  if (rc == 0) return rd_fail_off(r, MS_ETRUNCATED, r->pos, NULL, "truncated input: missing meta");
  if (rc < 0) return rc;
  msgpack_object o;
  MS_FORWARD_IF_ERROR(rd_unpack(r, "meta", &o));
  if (o.type != MSGPACK_OBJECT_MAP)
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "expected map, got %s",
                       mp_type_name(o.type));
  enum { HAVE_ORIGIN = 1, HAVE_PRESENT = 2, HAVE_COUNTS = 4 };
  int have = 0;
  ms_snapshot_t *h = &r->b.hdr;
  for (uint32_t i = 0; i < o.via.map.size; i++) {
    const msgpack_object *k = &o.via.map.ptr[i].key, *v = &o.via.map.ptr[i].val;
    uint64_t off = r->obj_off + mp_child_offset(r->obj, r->obj_len, 0, 2 * (uint64_t)i + 1);
    if (k->type != MSGPACK_OBJECT_STR)
      return rd_fail_off(r, MS_EFORMAT, off, "meta", "key: expected string, got %s",
                         mp_type_name(k->type));
    char path[48];
    snprintf(path, sizeof path, "meta.%.*s", (int)(k->via.str.size > 32 ? 32 : k->via.str.size),
             k->via.str.ptr);
    int is_int =
        v->type == MSGPACK_OBJECT_POSITIVE_INTEGER || v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
    if (str_eq(k, "origin") || str_eq(k, "present")) {
      if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > UINT32_MAX)
        return rd_fail_off(r, MS_EFORMAT, off, path, "expected unsigned integer");
      if (str_eq(k, "origin")) {
        if (v->via.u64 > MS_SNAP_ORIGIN_TORCH_DICT)
          return rd_fail_off(r, MS_EFORMAT, off, path, "unknown origin %" PRIu64, v->via.u64);
        h->origin = (ms_snap_origin)v->via.u64;
        have |= HAVE_ORIGIN;
      } else {
        /* MS_SNAP_TRACE_SKIPPED says how a snapshot was loaded, never what a file holds */
        h->present = (uint32_t)v->via.u64 & ~(uint32_t)MS_SNAP_TRACE_SKIPPED;
        have |= HAVE_PRESENT;
      }
    } else if (str_eq(k, "pid") || str_eq(k, "rank") || str_eq(k, "time_us")) {
      if (!is_int || (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 > INT64_MAX))
        return rd_fail_off(r, MS_EFORMAT, off, path, "expected integer");
      int64_t x = v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? v->via.i64 : (int64_t)v->via.u64;
      if (str_eq(k, "pid"))
        h->pid = x;
      else if (str_eq(k, "rank"))
        h->rank = x;
      else
        h->time_us = x;
    } else if (str_eq(k, "hostname")) {
      if (v->type != MSGPACK_OBJECT_STR)
        return rd_fail_off(r, MS_EFORMAT, off, path, "expected string, got %s",
                           mp_type_name(v->type));
      int e = ms__snapbuild_str(&r->b, v->via.str.ptr, v->via.str.size, &h->hostname);
      if (e != MS_OK) return rd_nomem(r, e);
    } else if (str_eq(k, "counts")) {
      if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size != TAG_COUNT - 1)
        return rd_fail_off(r, MS_EFORMAT, off, path, "expected array of %d unsigned integers",
                           TAG_COUNT - 1);
      for (int t = 1; t < TAG_COUNT; t++) {
        const msgpack_object *c = &v->via.array.ptr[t - 1];
        if (c->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
          return rd_fail_off(r, MS_EFORMAT, off, path, "expected array of %d unsigned integers",
                             TAG_COUNT - 1);
        r->declared[t] = c->via.u64;
      }
      have |= HAVE_COUNTS;
    }
    /* Other keys (e.g. "writer") are informational and ignored. */
  }
  if (!(have & HAVE_ORIGIN))
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "missing key 'origin'");
  if (!(have & HAVE_PRESENT))
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "missing key 'present'");
  if (!(have & HAVE_COUNTS))
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "missing key 'counts'");
  rd_release_obj(r);
  return MS_OK;
}

/* Ends table t: its row count must match the declaration, and its cursors must be complete. */
static int rd_end_table(rd_t *r, int t, uint64_t off) {
  uint64_t rows = r->rows[t];
  if (t == TAG_BLOCKS) {
    /* Every segment must be covered exactly by its blocks (segments left must be empty). */
    MS_FORWARD_IF_ERROR(rd_close_segment(r, off));
    while (r->seg_next < r->b.segments.len) {
      MS_FORWARD_IF_ERROR(rd_next_segment(r, off));
      MS_FORWARD_IF_ERROR(rd_close_segment(r, off));
    }
  }
  if (t == TAG_HISTORY && rows != r->hist_declared)
    return rd_fail_off(r, MS_EFORMAT, off, "history",
                       "%" PRIu64 " entries, the blocks declare %" PRIu64, rows, r->hist_declared);
  if (t == TAG_TRACE) {
    uint64_t want = 0;
    for (size_t i = 0; i < r->b.devices.len; i++)
      want += r->b.devices.ptr[i].ntrace;
    if (want != r->b.trace.len)
      return rd_fail_off(r, MS_EFORMAT, off, "device_traces",
                         "%zu entries, the devices declare %" PRIu64, r->b.trace.len, want);
  }
  if (rows != r->declared[t])
    return rd_fail_off(r, MS_EFORMAT, off, table_names[t],
                       "%" PRIu64 " rows, meta.counts declares %" PRIu64, rows, r->declared[t]);
  return MS_OK;
}

/* Reads the rows of a devices chunk (a cold table, decoded with msgpack-c: its rows hold maps). */
static int rd_device_chunk(rd_t *r, const msgpack_object *o) {
  const msgpack_object *e = o->via.array.ptr;
  uint32_t n = o->via.array.size;
  for (uint32_t i = 1; i < n; i++) {
    r->row_in_chunk = i - 1;
    MS_FORWARD_IF_ERROR(rd_device(r, &e[i]));
    r->rows[TAG_DEVICES]++;
  }
  return MS_OK;
}

/* Reads rows *i to n - 1 of a chunk of one of the hot tables (r->table) straight from the bytes;
 * c is on row *i. *i counts the rows read, so that a call that returned RD_NEED_MORE can be
 * repeated from the row it stopped in. */
static int rd_rows(rd_t *r, cur_t *c, uint64_t n, uint64_t *i) {
  const int t = r->table;
#define RD_ROWS(fn)                                                                                \
  for (; *i < n; ++*i) {                                                                           \
    r->row_in_chunk = (uint32_t)*i;                                                                \
    MS_FORWARD_IF_ERROR(fn(r, c));                                                                 \
    r->rows[t]++;                                                                                  \
    if (ms_unlikely(r->obj_items > RD_OBJ_MAX_ITEMS))                                              \
      return rd_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "more than %u values in one object",      \
                         RD_OBJ_MAX_ITEMS);                                                        \
  }                                                                                                \
  break
  switch (t) {
  case TAG_FRAMES:
    RD_ROWS(rd_frame);
  case TAG_STACKS:
    RD_ROWS(rd_stack);
  case TAG_SEGMENTS:
    RD_ROWS(rd_segment);
  case TAG_BLOCKS:
    RD_ROWS(rd_block);
  case TAG_HISTORY:
    RD_ROWS(rd_history);
  case TAG_TRACE:
    RD_ROWS(rd_trace);
  case TAG_ANNOTATIONS:
    RD_ROWS(rd_annotation);
  default:
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, NULL, "no rows expected in table %d", t);
  }
#undef RD_ROWS
  return MS_OK;
}

static int is_hot_table(uint64_t tag) {
  return tag >= TAG_FRAMES && tag <= TAG_ANNOTATIONS && tag != TAG_DEVICES;
}

/* The checks and the bookkeeping at the start of chunk `tag` (pre: tag < TAG_COUNT): table order,
 * the end of the tables passed over. *last = the last table seen. */
static int rd_chunk_head(rd_t *r, int tag, int *last) {
  if (tag != TAG_END && tag < *last)
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, table_names[tag], "table out of order (after %s)",
                       table_names[*last]);
  /* Close the tables passed over (including the previous one). */
  for (int t = *last == 0 ? 1 : *last; t < (tag == TAG_END ? TAG_COUNT : tag); t++) {
    r->table = t;
    MS_FORWARD_IF_ERROR(rd_end_table(r, t, r->obj_off));
  }
  return MS_OK;
}

/* Settles an error (or RD_NEED_MORE at the end of the input) met while decoding a chunk that the
 * guard has not scanned. The guard's findings come first, as when the guard scanned every chunk
 * before its rows were read: its limits, invalid msgpack and truncation. So the guard scans the
 * whole object from its start (reading more input as needed). @return the guard's error if it
 * finds one, else rc, whose message is already in the error buffer. */
static MS_NOINLINE int rd_settle(rd_t *r, int rc) {
  r->pos = r->obj_off;
  int g = rd_next(r, "a table chunk");
  if (g < 0) return g;
  if (rc > 0 || g == 0) /* the guard finds complete what the decoder did not: a bug */
    return rd_fail_off(r, MS_EFORMAT, r->obj_off, NULL, "malformed msgpack in a table chunk");
  return rc;
}

/* Scans the buffered bytes of the current object with the guard, without reading more.
 * @return the guard's error (described) or 0 if it found none. */
static MS_NOINLINE int rd_guard_buffered(rd_t *r) {
  guard_t g;
  memset(&g, 0, sizeof g);
  char why[160];
  if (guard_scan(&g, r->buf + r->off, r->used - r->off, why, sizeof why) == GUARD_ERR)
    return rd_fail_off(r, g.err, r->pos + g.pos, NULL, "%s", why);
  return 0;
}

/* Decodes a chunk of a hot table while reading it, without a guard scan first: the row readers
 * check every value against the buffered bytes and ask for more (RD_NEED_MORE) when a row goes on
 * after them; the chunk is then decoded on from the start of that row. Every row reader changes
 * the reader's state only once its row is complete, except for steps that a second decode finds
 * done (opening the segment, block or device the row belongs to) and strings interned for a row
 * that was cut (interned again: short ones are shared, a long one is copied again), so a row can
 * be decoded again. The guard's limits are checked on the way (values, bytes); on any error
 * rd_settle() lets the guard report what it would have reported first. Saves the guard's pass over
 * the bytes (a third of the reader's time).
 *
 * pre: the buffered bytes start with the chunk's array header (n elements, n <= RD_OBJ_MAX_ITEMS)
 * and its tag, a hot table's. @return MS_OK (the chunk is consumed) or an error. */
static int rd_hot_chunk(rd_t *r, int *last) {
  const unsigned char *base = r->buf + r->off;
  cur_t c = {base, r->buf + r->used};
  uint64_t n = 0, tag = 0;
  if (!cur_array(&c, &n) || cur_int(&c, &tag) != MPI_UINT) /* pre */
    return rd_fail_off(r, MS_EFORMAT, r->pos, NULL, "malformed msgpack in a table chunk");
  r->obj = base;
  r->obj_len = r->used - r->off;
  r->obj_off = r->pos;
  r->obj_items = 2; /* the chunk's array and its tag */
  int rc = rd_chunk_head(r, (int)tag, last);
  if (rc != MS_OK) return rd_settle(r, rc);
  *last = (int)tag;
  r->table = (int)tag;
  uint64_t i = 0, cut = UINT64_MAX;
  int scanned = 0; /* the guard has found the whole chunk buffered */
  for (;;) {
    rc = rd_rows(r, &c, n - 1, &i);
    if (rc != RD_NEED_MORE) break;
    size_t at = (size_t)(c.p - base); /* the start of the row that was cut */
    if (scanned || r->eof || r->used - r->off > RD_OBJ_MAX_BYTES) break;
    if (i == cut) {
      /* The same row was cut twice (a row longer than a read): rather than decoding it again
       * after each read (quadratic in its length), let the guard read the rest of the chunk. */
      size_t len = 0;
      int g = rd_scan(r, "a table chunk", &len);
      if (g < 0) return g;
      if (g == 0) break; /* cannot be: bytes are buffered */
      base = r->buf + r->off;
      c.p = base + at;
      c.end = base + len;
      r->obj = base;
      r->obj_len = len;
      scanned = 1;
      continue;
    }
    cut = i;
    size_t avail = r->used - r->off;
    size_t want = r->pos + avail < 4 * RD_READ_CHUNK ? RD_READ_CHUNK / 8 : RD_READ_CHUNK;
    rc = rd_fill(r, want, r->pos + avail);
    if (rc != MS_OK) {
      /* The guard would have scanned the buffered bytes before this read: its errors first. */
      int g = rd_guard_buffered(r);
      return g < 0 ? g : rc;
    }
    base = r->buf + r->off;
    c.p = base + at;
    c.end = r->buf + r->used;
    r->obj = base;
    r->obj_len = r->used - r->off;
  }
  size_t len = (size_t)(c.p - base);
  if (rc == MS_OK && (len > RD_OBJ_MAX_BYTES || r->obj_items > RD_OBJ_MAX_ITEMS))
    rc = rd_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "chunk over the limits");
  if (rc != MS_OK) return rd_settle(r, rc);
  r->obj = NULL;
  r->off += len;
  r->pos += len;
  return MS_OK;
}

/* @return the tag of the chunk at the start of the buffered bytes if it belongs to a hot table
 * and its array header and tag are buffered, else -1. */
static int rd_peek_hot(const rd_t *r) {
  cur_t c = {r->buf + r->off, r->buf + r->used};
  uint64_t n, tag;
  if (!cur_array(&c, &n) || n < 1 || n > RD_OBJ_MAX_ITEMS || cur_int(&c, &tag) != MPI_UINT ||
      !is_hot_table(tag))
    return -1;
  return (int)tag;
}

static int rd_body(rd_t *r) {
  MS_FORWARD_IF_ERROR(rd_header(r));
  MS_FORWARD_IF_ERROR(rd_meta(r));
  int last = 0; /* last table tag seen */
  r->hblk = SIZE_MAX;
  r->tdev = SIZE_MAX;
  for (;;) {
    if (rd_peek_hot(r) >= 0) {
      MS_FORWARD_IF_ERROR(rd_hot_chunk(r, &last));
      continue;
    }
    /* Other chunks (or one whose start is not buffered yet): the guard scans it first. */
    int rc = rd_next(r, "a table chunk");
    if (rc == 0)
      return rd_fail_off(r, MS_ETRUNCATED, r->pos, NULL,
                         "truncated input: missing end marker after %s", table_names[last]);
    if (rc < 0) return rc;
    cur_t c = {r->obj, r->obj + r->obj_len};
    uint64_t n = 0, tagv = 0;
    if (!cur_array(&c, &n) || n < 1 || cur_int(&c, &tagv) != MPI_UINT || tagv >= TAG_COUNT)
      return rd_fail_off(r, MS_EFORMAT, r->obj_off, NULL,
                         "expected a table chunk [tag, rows...] with a tag in 0-%d", TAG_COUNT - 1);
    int tag = (int)tagv;
    MS_FORWARD_IF_ERROR(rd_chunk_head(r, tag, &last));
    if (tag == TAG_END) {
      if (n != 1)
        return rd_fail_off(r, MS_EFORMAT, r->obj_off, "end", "end marker has extra elements");
      rd_release_obj(r);
      break;
    }
    if (tag == TAG_SETTINGS && last == TAG_SETTINGS)
      return rd_fail_off(r, MS_EFORMAT, r->obj_off, table_names[tag], "repeated table");
    last = tag;
    r->table = tag;
    if (tag == TAG_SETTINGS) {
      if (n != 2)
        return rd_fail_off(r, MS_EFORMAT, r->obj_off, table_names[tag], "expected [%d, {settings}]",
                           TAG_SETTINGS);
      msgpack_object o;
      MS_FORWARD_IF_ERROR(rd_unpack(r, "a table chunk", &o));
      MS_FORWARD_IF_ERROR(rd_settings(r, &o.via.array.ptr[1]));
    } else if (tag == TAG_DEVICES) {
      msgpack_object o;
      MS_FORWARD_IF_ERROR(rd_unpack(r, "a table chunk", &o));
      MS_FORWARD_IF_ERROR(rd_device_chunk(r, &o));
    } else {
      uint64_t i = 0;
      r->obj_items = 2;
      rc = rd_rows(r, &c, n - 1, &i);
      /* The guard ended the object after its last element; a walk that did not is a bug. */
      if (rc > 0 || (rc == MS_OK && c.p != c.end))
        return rd_fail_off(r, MS_EFORMAT, r->obj_off, NULL, "malformed msgpack in a table chunk");
      if (rc != MS_OK) return rc;
    }
    rd_release_obj(r);
  }
  /* Nothing may follow the end marker. */
  for (;;) {
    if (r->used > r->off)
      return rd_fail_off(r, MS_EFORMAT, r->pos, NULL, "trailing data after the end marker");
    if (r->eof) break;
    MS_FORWARD_IF_ERROR(rd_fill(r, 64, r->pos));
  }
  return MS_OK;
}

int ms_snapshot_read(ms_source_t *src, ms_snapshot_t **out, ms_errbuf_t *eb) {
  if (!src || !src->read || !out) return ms__errbuf_set(eb, MS_EINVAL, "invalid argument");
  rd_t *r = calloc(1, sizeof *r);
  if (!r) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  r->src = src;
  r->eb = eb;
  r->table = -1;
  ms__snapbuild_init(&r->b);
  msgpack_unpacked_init(&r->mo);
  for (int i = 0; i < MS_BLOCK_STATE_OTHER; i++)
    r->state_names[i] = ms_block_state_name((ms_block_state)i);
  int rc = MS_OK;
  /* Peek at the first bytes: a gzip header means a compressed snapshot. */
  char head[16];
  size_t nh = 0;
  while (nh < 3) {
    ptrdiff_t n = src->read(src->ctx, head + nh, sizeof head - nh);
    if (n < 0) {
      rc = ms__errbuf_set(eb, (int)n, "offset 0: %s", ms_strerror((int)n));
      goto out;
    }
    if (n == 0) break;
    nh += (size_t)n;
  }
  if (rd_reserve(r, 64 * 1024) != MS_OK) {
    rc = ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
    goto out;
  }
  if (ms__zio_is_gzip(head, nh)) {
    rc = ms__zsource_create(src, head, nh, &r->z, &r->zsrc);
    if (rc != MS_OK) {
      ms__errbuf_set(eb, rc, "out of memory");
      goto out;
    }
  } else if (nh) {
    memcpy(r->buf, head, nh);
    r->used = nh;
  } else {
    r->eof = 1;
  }
  rc = rd_body(r);
  if (rc == MS_OK) {
    r->b.hdr.hostname = r->b.hdr.hostname ? r->b.hdr.hostname : "";
    rc = ms__snapbuild_finish(&r->b, out, eb);
  }
out:
  rd_release_obj(r);
  free(r->buf);
  ms__zsource_destroy(r->z);
  ms__snapbuild_release(&r->b);
  MS_VEC_FREE(&r->frame_map);
  MS_VEC_FREE(&r->stack_map);
  free(r);
  return rc;
}

long ms__serialize_unpack_only(const void *data, size_t len) {
  msgpack_unpacker up;
  if (!msgpack_unpacker_init(&up, 64 * 1024)) return -1;
  const char *p = data;
  size_t pos = 0;
  long nobj = 0;
  for (;;) {
    int ret = msgpack_unpacker_execute(&up);
    if (ret < 0) {
      nobj = -1;
      break;
    }
    if (ret > 0) {
      nobj++;
      msgpack_unpacker_reset(&up);
      if (up.z) msgpack_unpacker_reset_zone(&up);
      continue;
    }
    if (pos >= len) break;
    size_t n = len - pos < RD_READ_CHUNK ? len - pos : RD_READ_CHUNK;
    if (!msgpack_unpacker_reserve_buffer(&up, n)) {
      nobj = -1;
      break;
    }
    memcpy(msgpack_unpacker_buffer(&up), p + pos, n);
    pos += n;
    msgpack_unpacker_buffer_consumed(&up, n);
  }
  msgpack_unpacker_destroy(&up);
  return nobj;
}
