/* SPDX-License-Identifier: MIT
 * memsnap core: the snapshot reader's cold objects (msgpack_read.h): the header, the meta object,
 * devices and allocator_settings, unpacked with msgpack-c into a zone destroyed after each object;
 * the error reports that name the byte offset and the field path; and the unpack-only baseline of
 * bench_snapshot (msgpack_internal.h).
 */
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot/msgpack_internal.h"
#include "snapshot/msgpack_read.h"

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

int ms__mpr_fail_off(rd_t *r, int err, uint64_t off, const char *path, const char *fmt, ...) {
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
MS_NOINLINE int ms__mpr_fail_col(rd_t *r, int err, int col, const char *colname, const char *msg) {
  /* The row is element row_in_chunk + 1 of the chunk array (element 0 is the tag). */
  size_t off = ms__mp_child_offset(r->obj, r->obj_len, 0, (uint64_t)r->row_in_chunk + 1);
  if (col >= 0) off = ms__mp_child_offset(r->obj, r->obj_len, off, (uint64_t)col);
  char path[200];
  rd_path(r, col >= 0 ? colname : NULL, path, sizeof path);
  return ms__mpr_fail_off(r, err, r->obj_off + off, path, "%s", msg);
}

const char *ms__mp_type_name(msgpack_object_type t) {
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
  snprintf(msg, sizeof msg, "expected %s, got %s", want, ms__mp_type_name(o->type));
  return ms__mpr_fail_col(r, MS_EFORMAT, col, cols ? cols[col] : NULL, msg);
}

/* Column accessors: `row` is the row's element array, `col` the column index. */
static int rd_row(rd_t *r, const msgpack_object *o, size_t ncols, const msgpack_object **row) {
  if (o->type != MSGPACK_OBJECT_ARRAY) {
    char msg[96];
    snprintf(msg, sizeof msg, "expected array of %zu columns, got %s", ncols,
             ms__mp_type_name(o->type));
    return ms__mpr_fail_col(r, MS_EFORMAT, -1, NULL, msg);
  }
  if (o->via.array.size != ncols) {
    char msg[96];
    snprintf(msg, sizeof msg, "expected %zu columns, got %" PRIu32, ncols, o->via.array.size);
    return ms__mpr_fail_col(r, MS_EFORMAT, -1, NULL, msg);
  }
  *row = o->via.array.ptr;
  return MS_OK;
}

int ms__mpr_nomem(rd_t *r, int rc) {
  return ms__mpr_fail_off(r, rc, r->obj_off, NULL, "%s", ms_strerror(rc));
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
      return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, path, "'%s': integer out of range",
                              kv->key);
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
    return rc == MS_OK ? MS_OK : ms__mpr_nomem(r, rc);
  }
  default:
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, path,
                            "'%s': expected nil, boolean, integer, float or string, got %s",
                            kv->key, ms__mp_type_name(v->type));
  }
}

static int rd_key(rd_t *r, const msgpack_object *k, const char *path, const char **dst) {
  if (k->type != MSGPACK_OBJECT_STR)
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, path, "key: expected string, got %s",
                            ms__mp_type_name(k->type));
  int rc = ms__snapbuild_str(&r->b, k->via.str.ptr, k->via.str.size, dst);
  return rc == MS_OK ? MS_OK : ms__mpr_nomem(r, rc);
}

/* Adds the entries of a nested settings map as one contiguous run of children; nested maps' own
 * children runs follow. *first = index of the run among children. */
static int rd_settings_children(rd_t *r, const msgpack_object_map *m, int depth, uint32_t *first) {
  if (depth > SETTINGS_MAX_DEPTH)
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "allocator_settings",
                            "nested deeper than %d", SETTINGS_MAX_DEPTH);
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
    if (rc != MS_OK) return ms__mpr_nomem(r, rc);
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

int ms__mpr_settings(rd_t *r, const msgpack_object *o) {
  if (o->type != MSGPACK_OBJECT_MAP)
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "allocator_settings", "expected map, got %s",
                            ms__mp_type_name(o->type));
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
    if (rc != MS_OK) return ms__mpr_nomem(r, rc);
  }
  r->rows[TAG_SETTINGS] += m->size;
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
    return ms__mpr_fail_col(r, MS_ELIMIT, 0, cols_device[0], "too many trace entries");
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
    if (rc != MS_OK) return ms__mpr_nomem(r, rc);
  }
  int rc = ms__snapbuild_add_device(&r->b, &d);
  return rc == MS_OK ? MS_OK : ms__mpr_nomem(r, rc);
}

/* Unpacks the current object with msgpack-c into r->mo (the cold objects: header, meta, devices
 * and allocator_settings, where msgpack-c's tree costs nothing measurable and reads best).
 * The guard has accepted the object, so msgpack-c allocates only for values present in it. */
int ms__mpr_unpack(rd_t *r, const char *expect, msgpack_object *o) {
  size_t off = 0;
  msgpack_unpack_return ret = msgpack_unpack_next(&r->mo, (const char *)r->obj, r->obj_len, &off);
  *o = r->mo.data; /* (set on failure too: keeps GCC's -Wmaybe-uninitialized quiet) */
  if (ret != MSGPACK_UNPACK_SUCCESS || off != r->obj_len)
    return ms__mpr_fail_off(r, ret == MSGPACK_UNPACK_NOMEM_ERROR ? MS_ENOMEM : MS_EFORMAT,
                            r->obj_off, NULL, "malformed msgpack in %s", expect);
  return MS_OK;
}

/* Ends the use of the current object (and frees msgpack-c's zone, if it was unpacked). */
void ms__mpr_release_obj(rd_t *r) {
  msgpack_unpacked_destroy(&r->mo);
  r->obj = NULL;
}

static int str_eq(const msgpack_object *o, const char *s) {
  size_t n = strlen(s);
  return o->type == MSGPACK_OBJECT_STR && o->via.str.size == n && memcmp(o->via.str.ptr, s, n) == 0;
}

int ms__mpr_header(rd_t *r) {
  int rc = ms__mpr_next(r, "the header");
  if (rc == 0) return ms__mpr_fail_off(r, MS_ETRUNCATED, 0, NULL, "empty input");
  if (rc < 0) return rc;
  msgpack_object o;
  MS_FORWARD_IF_ERROR(ms__mpr_unpack(r, "the header", &o));
  if (o.type != MSGPACK_OBJECT_MAP || o.via.map.size < 2 ||
      !str_eq(&o.via.map.ptr[0].key, "magic") || !str_eq(&o.via.map.ptr[0].val, SNAP_MAGIC))
    return ms__mpr_fail_off(r, MS_EFORMAT, 0, NULL, "not a memsnap snapshot (bad magic)");
  const msgpack_object *v = &o.via.map.ptr[1].val;
  if (!str_eq(&o.via.map.ptr[1].key, "version") || v->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
    return ms__mpr_fail_off(r, MS_EFORMAT, ms__mp_child_offset(r->obj, r->obj_len, 0, 2),
                            "header.version", "expected unsigned integer");
  if (v->via.u64 < 1 || v->via.u64 > SNAP_VERSION)
    return ms__mpr_fail_off(r, MS_EUNSUPPORTED, ms__mp_child_offset(r->obj, r->obj_len, 0, 3),
                            "header.version",
                            "unsupported format version %" PRIu64 " (this build reads 1 to %d)",
                            v->via.u64, SNAP_VERSION);
  r->version = (int)v->via.u64;
  ms__mpr_release_obj(r);
  return MS_OK;
}

int ms__mpr_meta(rd_t *r) {
  int rc = ms__mpr_next(r, "meta");
  if (rc == 0)
    return ms__mpr_fail_off(r, MS_ETRUNCATED, r->pos, NULL, "truncated input: missing meta");
  if (rc < 0) return rc;
  msgpack_object o;
  MS_FORWARD_IF_ERROR(ms__mpr_unpack(r, "meta", &o));
  if (o.type != MSGPACK_OBJECT_MAP)
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "expected map, got %s",
                            ms__mp_type_name(o.type));
  enum { HAVE_ORIGIN = 1, HAVE_PRESENT = 2, HAVE_COUNTS = 4 };
  int have = 0;
  ms_snapshot_t *h = &r->b.hdr;
  for (uint32_t i = 0; i < o.via.map.size; i++) {
    const msgpack_object *k = &o.via.map.ptr[i].key, *v = &o.via.map.ptr[i].val;
    uint64_t off = r->obj_off + ms__mp_child_offset(r->obj, r->obj_len, 0, 2 * (uint64_t)i + 1);
    if (k->type != MSGPACK_OBJECT_STR)
      return ms__mpr_fail_off(r, MS_EFORMAT, off, "meta", "key: expected string, got %s",
                              ms__mp_type_name(k->type));
    char path[48];
    snprintf(path, sizeof path, "meta.%.*s", (int)(k->via.str.size > 32 ? 32 : k->via.str.size),
             k->via.str.ptr);
    int is_int =
        v->type == MSGPACK_OBJECT_POSITIVE_INTEGER || v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER;
    if (str_eq(k, "origin") || str_eq(k, "present")) {
      if (v->type != MSGPACK_OBJECT_POSITIVE_INTEGER || v->via.u64 > UINT32_MAX)
        return ms__mpr_fail_off(r, MS_EFORMAT, off, path, "expected unsigned integer");
      if (str_eq(k, "origin")) {
        if (v->via.u64 > MS_SNAP_ORIGIN_TORCH_DICT)
          return ms__mpr_fail_off(r, MS_EFORMAT, off, path, "unknown origin %" PRIu64, v->via.u64);
        h->origin = (ms_snap_origin)v->via.u64;
        have |= HAVE_ORIGIN;
      } else {
        /* MS_SNAP_TRACE_SKIPPED and _STACKS_SKIPPED say how a snapshot was loaded, never what a file holds */
        h->present = (uint32_t)v->via.u64 & ~(uint32_t)(MS_SNAP_TRACE_SKIPPED | MS_SNAP_TRACE_STACKS_SKIPPED);
        have |= HAVE_PRESENT;
      }
    } else if (str_eq(k, "pid") || str_eq(k, "rank") || str_eq(k, "time_us")) {
      if (!is_int || (v->type == MSGPACK_OBJECT_POSITIVE_INTEGER && v->via.u64 > INT64_MAX))
        return ms__mpr_fail_off(r, MS_EFORMAT, off, path, "expected integer");
      int64_t x = v->type == MSGPACK_OBJECT_NEGATIVE_INTEGER ? v->via.i64 : (int64_t)v->via.u64;
      if (str_eq(k, "pid"))
        h->pid = x;
      else if (str_eq(k, "rank"))
        h->rank = x;
      else
        h->time_us = x;
    } else if (str_eq(k, "hostname")) {
      if (v->type != MSGPACK_OBJECT_STR)
        return ms__mpr_fail_off(r, MS_EFORMAT, off, path, "expected string, got %s",
                                ms__mp_type_name(v->type));
      int e = ms__snapbuild_str(&r->b, v->via.str.ptr, v->via.str.size, &h->hostname);
      if (e != MS_OK) return ms__mpr_nomem(r, e);
    } else if (str_eq(k, "counts")) {
      if (v->type != MSGPACK_OBJECT_ARRAY || v->via.array.size != TAG_COUNT - 1)
        return ms__mpr_fail_off(r, MS_EFORMAT, off, path, "expected array of %d unsigned integers",
                                TAG_COUNT - 1);
      for (int t = 1; t < TAG_COUNT; t++) {
        const msgpack_object *c = &v->via.array.ptr[t - 1];
        if (c->type != MSGPACK_OBJECT_POSITIVE_INTEGER)
          return ms__mpr_fail_off(r, MS_EFORMAT, off, path,
                                  "expected array of %d unsigned integers", TAG_COUNT - 1);
        r->declared[t] = c->via.u64;
      }
      have |= HAVE_COUNTS;
    }
    /* Other keys (e.g. "writer") are informational and ignored. */
  }
  if (!(have & HAVE_ORIGIN))
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "missing key 'origin'");
  if (!(have & HAVE_PRESENT))
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "missing key 'present'");
  if (!(have & HAVE_COUNTS))
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "meta", "missing key 'counts'");
  ms__mpr_release_obj(r);
  return MS_OK;
}

/* Reads the rows of a devices chunk (a cold table, decoded with msgpack-c: its rows hold maps). */
int ms__mpr_device_chunk(rd_t *r, const msgpack_object *o) {
  const msgpack_object *e = o->via.array.ptr;
  uint32_t n = o->via.array.size;
  for (uint32_t i = 1; i < n; i++) {
    r->row_in_chunk = i - 1;
    MS_FORWARD_IF_ERROR(rd_device(r, &e[i]));
    r->rows[TAG_DEVICES]++;
  }
  return MS_OK;
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
