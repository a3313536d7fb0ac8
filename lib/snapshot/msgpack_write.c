/* SPDX-License-Identifier: MIT
 * memsnap core: memsnap's own snapshot file format (docs/snapshot-format.md): the writer. The format's files are msgpack_write.c, msgpack_read.c (with msgpack_guard.c and
 * msgpack_objects.c) and msgpack_schema.h; only they include msgpack.h.
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
#include "model/snapbuild.h"
#include "snapshot/msgpack_schema.h"
#include "snapshot/zio.h"

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
 * functions of a local packer (an indirect call per value costs 3x:
 * docs/dev/measurements.md, "Serialisation"). */
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
        msgpack_pack_uint32(&pk, ms_snap_frame_index(s, st->first + j));
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
        pk_str(&pk, ms_snap_trace_action_name(t));
      msgpack_pack_uint64(&pk, t->addr);
      msgpack_pack_uint64(&pk, t->size);
      msgpack_pack_uint64(&pk, ms_snap_trace_stream(t));
      msgpack_pack_int64(&pk, t->time_us);
      msgpack_pack_int64(&pk, ms_snap_trace_pool(t, 0));
      msgpack_pack_int64(&pk, ms_snap_trace_pool(t, 1));
      pk_stack(&pk, t->stack);
      pk_str(&pk, ms_snap_trace_compile_context(t));
      pk_str(&pk, ms_snap_trace_user_metadata(t));
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
  if (snap->present & MS_SNAP_TRACE_STACKS_SKIPPED)
    return ms__errbuf_set(eb, MS_EINVAL, "the snapshot was loaded without its trace's stacks");
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
