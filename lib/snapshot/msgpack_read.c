/* SPDX-License-Identifier: MIT
 * memsnap core: the snapshot reader (docs/snapshot-format.md; the design is in msgpack_write.c's
 * file comment and msgpack_read.h): the input buffer, the rows of the hot tables decoded straight
 * from the bytes into the builder, the body loop over top-level objects, and ms_snapshot_read.
 */
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot/msgpack_read.h"

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
  int h = at < end ? ms__mp_head(at, (size_t)(end - at), &hdr, &payload, &children) : 0;
  if (h == 1 &&
      (payload > RD_OBJ_MAX_BYTES || (size_t)(at - r->obj) + hdr + payload > RD_OBJ_MAX_BYTES))
    /* What the guard reports before it would wait for the rest (rd_settle() lets it). */
    return ms__mpr_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "declared length over the limit");
  if (h == 0 || (h == 1 && payload > (size_t)(end - at) - hdr))
    return RD_NEED_MORE; /* the value goes on after the buffered bytes */
  char msg[96];
  snprintf(msg, sizeof msg, "expected %s, got %s", want, mp_byte_type_name(at, end));
  return ms__mpr_fail_col(r, MS_EFORMAT, col, colname, msg);
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
    return ms__mpr_fail_col(r, MS_EFORMAT, -1, NULL, msg);
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
    return ms__mpr_fail_col(r, MS_EFORMAT, col, cols[col], "value out of range (> 4294967295)");
  *dst = (uint32_t)v;
  return MS_OK;
}

RD_INLINE int cur_i64(rd_t *r, cur_t *c, int col, const char *const *cols, int64_t *dst) {
  const unsigned char *at = c->p;
  uint64_t v;
  int kind = cur_int(c, &v);
  if (ms_unlikely(kind == MPI_NONE)) return rd_bad_value(r, at, c->end, col, cols[col], "integer");
  if (ms_unlikely(kind == MPI_UINT && v > INT64_MAX))
    return ms__mpr_fail_col(r, MS_EFORMAT, col, cols[col], "value out of range (> INT64_MAX)");
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
  if (rc != MS_OK) return ms__mpr_fail_col(r, rc, col, cols[col], ms_strerror(rc));
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
    return ms__mpr_fail_col(r, MS_EFORMAT, col, cols[col], msg);
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
  return rc == MS_OK ? MS_OK : ms__mpr_nomem(r, rc);
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
  if (rc != MS_OK) return ms__mpr_nomem(r, rc);
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
    return ms__mpr_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "more than %u values in one object",
                            RD_OBJ_MAX_ITEMS);
  if (n > (size_t)(c.end - c.p)) return RD_NEED_MORE;
  uint32_t tmp[64];
  uint32_t *fr = n <= 64 ? tmp : malloc((size_t)n * sizeof *fr);
  if (!fr) return ms__mpr_nomem(r, MS_ENOMEM);
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
      rc = ms__mpr_fail_col(r, MS_EFORMAT, (int)i, col, msg);
    } else {
      fr[i] = r->frame_map.ptr[v];
    }
  }
  uint32_t idx = 0;
  if (rc == MS_OK) {
    static const uint32_t no_frames[1];
    rc = ms__snapbuild_stack(&r->b, n ? fr : no_frames, (size_t)n, &idx);
    if (rc == MS_OK && MS_VEC_PUSH(&r->stack_map, idx)) rc = MS_ENOMEM;
    if (rc != MS_OK) rc = ms__mpr_nomem(r, rc);
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
    return ms__mpr_fail_col(r, MS_EFORMAT, 2, cols_segment[2],
                            "segment wraps around the address space");
  uint64_t first = 0;
  if (r->b.segments.len) {
    const ms_snap_segment_t *p = &r->b.segments.ptr[r->b.segments.len - 1];
    first = (uint64_t)p->first_block + p->nblocks;
  }
  if (first + g.nblocks > UINT32_MAX - 1)
    return ms__mpr_fail_col(r, MS_ELIMIT, 12, cols_segment[12], "too many blocks");
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
    off = r->obj_off + ms__mp_child_offset(r->obj, r->obj_len, 0, (uint64_t)r->row_in_chunk + 1);
  if (r->seg_blocks_left != 0)
    return ms__mpr_fail_off(r, MS_EFORMAT, off, path,
                            "declares %" PRIu32 " blocks, %" PRIu64 " found", g->nblocks,
                            r->blk_in_seg);
  if (r->seg_bytes_left != 0)
    return ms__mpr_fail_off(r, MS_EFORMAT, off, path,
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
      return ms__mpr_fail_col(r, MS_EFORMAT, -1, NULL, "more blocks than the segments hold");
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
      return ms__mpr_fail_col(r, MS_EFORMAT, 3, cols_block[3], "unknown state number");
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
    return ms__mpr_fail_col(r, MS_EFORMAT, 0, cols_block[0], msg);
  }
  if (ms_unlikely(k.size > r->seg_bytes_left)) {
    char msg[128];
    snprintf(msg, sizeof msg, "%" PRIu64 " exceeds the %" PRIu64 " bytes left in the segment",
             k.size, r->seg_bytes_left);
    return ms__mpr_fail_col(r, MS_EFORMAT, 1, cols_block[1], msg);
  }
  if (ms_unlikely(r->hist_declared + k.nhistory > UINT32_MAX - 1))
    return ms__mpr_fail_col(r, MS_ELIMIT, 5, cols_block[5], "too many history entries");
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
      return ms__mpr_fail_col(r, MS_EFORMAT, -1, NULL,
                              "more history entries than the blocks declare");
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

static int rd_trace(rd_t *r, cur_t *cp) {
  while (r->trace_left == 0) {
    size_t next = r->tdev == SIZE_MAX ? 0 : r->tdev + 1;
    while (next < r->b.devices.len && r->b.devices.ptr[next].ntrace == 0)
      next++;
    if (next >= r->b.devices.len)
      return ms__mpr_fail_col(r, MS_EFORMAT, -1, NULL,
                              "more trace entries than the devices declare");
    r->tdev = next;
    r->trace_left = r->b.devices.ptr[next].ntrace;
    r->trace_in_dev = 0;
  }
  cur_t c = *cp;
  MS_FORWARD_IF_ERROR(cur_row(r, &c, NCOLS(cols_trace)));
  ms_snap_trace_t t = {0};
  ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
  const unsigned char *at = c.p;
  uint64_t act;
  int kind = cur_int(&c, &act);
  if (ms_likely(kind == MPI_UINT)) {
    if (act >= MS_TRACE_OTHER)
      return ms__mpr_fail_col(r, MS_EFORMAT, 0, cols_trace[0], "unknown action number");
    t.action = (uint8_t)act;
  } else if (kind == MPI_NONE && cur_is_str(&c)) {
    MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 0, cols_trace, &x.action_name));
    t.action = (uint8_t)ms_trace_action_parse(x.action_name);
  } else {
    return rd_bad_value(r, at, c.end, 0, cols_trace[0], "action number or string");
  }
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 1, cols_trace, &t.addr));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 2, cols_trace, &t.size));
  MS_FORWARD_IF_ERROR(cur_u64(r, &c, 3, cols_trace, &x.stream));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 4, cols_trace, &t.time_us));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 5, cols_trace, &x.pool_id[0]));
  MS_FORWARD_IF_ERROR(cur_i64(r, &c, 6, cols_trace, &x.pool_id[1]));
  MS_FORWARD_IF_ERROR(cur_stack_ref(r, &c, 7, cols_trace, &t.stack));
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 8, cols_trace, &x.compile_context));
  MS_FORWARD_IF_ERROR(cur_strcol(r, &c, 9, cols_trace, &x.user_metadata));
  uint32_t present = 0;
  MS_FORWARD_IF_ERROR(cur_u32(r, &c, 10, cols_trace, &present));
  if (present > UINT16_MAX)
    return rd_bad_value(r, at, c.end, 10, cols_trace[10], "presence flags");
  t.present = (uint16_t)present;
  MS_FORWARD_IF_ERROR(rd_added(r, ms__snapbuild_trace_extra(&r->b, &t, &x)));
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
  if (rd_reserve(r, want) != MS_OK)
    return ms__mpr_fail_off(r, MS_ENOMEM, r->pos, NULL, "out of memory");
  ms_source_t *src = r->z ? &r->zsrc : r->src;
  ptrdiff_t n = src->read(src->ctx, (char *)r->buf + r->used, r->cap - r->used);
  if (n < 0) {
    const char *zm = r->z ? ms__zsource_error(r->z) : "";
    if (*zm) /* the gzip layer's error names its offset in the compressed file */
      return ms__errbuf_set(r->eb, (int)n, "gzip: %s", zm);
    return ms__mpr_fail_off(r, (int)n, off, NULL, "%s", ms_strerror((int)n));
  }
  if (n == 0) r->eof = 1;
  r->used += (size_t)n;
  return MS_OK;
}

/* Reads until ms__mp_guard_scan() finds the object at the start of the buffered bytes complete and
 * within the limits; *len = its length. @return 1 object, 0 clean end of input (nothing pending),
 * or a negative error. */
static int rd_scan(rd_t *r, const char *expect, size_t *len) {
  guard_t g;
  memset(&g, 0, sizeof g);
  char why[160];
  for (;;) {
    size_t avail = r->used - r->off;
    int gr = ms__mp_guard_scan(&g, r->buf + r->off, avail, why, sizeof why);
    if (gr == GUARD_DONE) break;
    if (gr == GUARD_ERR) return ms__mpr_fail_off(r, g.err, r->pos + g.pos, NULL, "%s", why);
    if (r->eof) {
      if (avail == 0) return 0;
      return ms__mpr_fail_off(r, MS_ETRUNCATED, r->pos + avail, NULL,
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
int ms__mpr_next(rd_t *r, const char *expect) {
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
    return ms__mpr_fail_off(r, MS_EFORMAT, off, "history",
                            "%" PRIu64 " entries, the blocks declare %" PRIu64, rows,
                            r->hist_declared);
  if (t == TAG_TRACE) {
    uint64_t want = 0;
    for (size_t i = 0; i < r->b.devices.len; i++)
      want += r->b.devices.ptr[i].ntrace;
    if (want != r->b.trace.len)
      return ms__mpr_fail_off(r, MS_EFORMAT, off, "device_traces",
                              "%zu entries, the devices declare %" PRIu64, r->b.trace.len, want);
  }
  if (rows != r->declared[t])
    return ms__mpr_fail_off(r, MS_EFORMAT, off, table_names[t],
                            "%" PRIu64 " rows, meta.counts declares %" PRIu64, rows,
                            r->declared[t]);
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
      return ms__mpr_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "more than %u values in one object", \
                              RD_OBJ_MAX_ITEMS);                                                   \
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
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, NULL, "no rows expected in table %d", t);
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
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, table_names[tag],
                            "table out of order (after %s)", table_names[*last]);
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
  int g = ms__mpr_next(r, "a table chunk");
  if (g < 0) return g;
  if (rc > 0 || g == 0) /* the guard finds complete what the decoder did not: a bug */
    return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, NULL, "malformed msgpack in a table chunk");
  return rc;
}

/* Scans the buffered bytes of the current object with the guard, without reading more.
 * @return the guard's error (described) or 0 if it found none. */
static MS_NOINLINE int rd_guard_buffered(rd_t *r) {
  guard_t g;
  memset(&g, 0, sizeof g);
  char why[160];
  if (ms__mp_guard_scan(&g, r->buf + r->off, r->used - r->off, why, sizeof why) == GUARD_ERR)
    return ms__mpr_fail_off(r, g.err, r->pos + g.pos, NULL, "%s", why);
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
    return ms__mpr_fail_off(r, MS_EFORMAT, r->pos, NULL, "malformed msgpack in a table chunk");
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
    rc = ms__mpr_fail_off(r, MS_ELIMIT, r->obj_off, NULL, "chunk over the limits");
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
  MS_FORWARD_IF_ERROR(ms__mpr_header(r));
  MS_FORWARD_IF_ERROR(ms__mpr_meta(r));
  int last = 0; /* last table tag seen */
  r->hblk = SIZE_MAX;
  r->tdev = SIZE_MAX;
  for (;;) {
    if (rd_peek_hot(r) >= 0) {
      MS_FORWARD_IF_ERROR(rd_hot_chunk(r, &last));
      continue;
    }
    /* Other chunks (or one whose start is not buffered yet): the guard scans it first. */
    int rc = ms__mpr_next(r, "a table chunk");
    if (rc == 0)
      return ms__mpr_fail_off(r, MS_ETRUNCATED, r->pos, NULL,
                              "truncated input: missing end marker after %s", table_names[last]);
    if (rc < 0) return rc;
    cur_t c = {r->obj, r->obj + r->obj_len};
    uint64_t n = 0, tagv = 0;
    if (!cur_array(&c, &n) || n < 1 || cur_int(&c, &tagv) != MPI_UINT || tagv >= TAG_COUNT)
      return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, NULL,
                              "expected a table chunk [tag, rows...] with a tag in 0-%d",
                              TAG_COUNT - 1);
    int tag = (int)tagv;
    MS_FORWARD_IF_ERROR(rd_chunk_head(r, tag, &last));
    if (tag == TAG_END) {
      if (n != 1)
        return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, "end", "end marker has extra elements");
      ms__mpr_release_obj(r);
      break;
    }
    if (tag == TAG_SETTINGS && last == TAG_SETTINGS)
      return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, table_names[tag], "repeated table");
    last = tag;
    r->table = tag;
    if (tag == TAG_SETTINGS) {
      if (n != 2)
        return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, table_names[tag],
                                "expected [%d, {settings}]", TAG_SETTINGS);
      msgpack_object o;
      MS_FORWARD_IF_ERROR(ms__mpr_unpack(r, "a table chunk", &o));
      MS_FORWARD_IF_ERROR(ms__mpr_settings(r, &o.via.array.ptr[1]));
    } else if (tag == TAG_DEVICES) {
      msgpack_object o;
      MS_FORWARD_IF_ERROR(ms__mpr_unpack(r, "a table chunk", &o));
      MS_FORWARD_IF_ERROR(ms__mpr_device_chunk(r, &o));
    } else {
      uint64_t i = 0;
      r->obj_items = 2;
      rc = rd_rows(r, &c, n - 1, &i);
      /* The guard ended the object after its last element; a walk that did not is a bug. */
      if (rc > 0 || (rc == MS_OK && c.p != c.end))
        return ms__mpr_fail_off(r, MS_EFORMAT, r->obj_off, NULL,
                                "malformed msgpack in a table chunk");
      if (rc != MS_OK) return rc;
    }
    ms__mpr_release_obj(r);
  }
  /* Nothing may follow the end marker. */
  for (;;) {
    if (r->used > r->off)
      return ms__mpr_fail_off(r, MS_EFORMAT, r->pos, NULL, "trailing data after the end marker");
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
  ms__mpr_release_obj(r);
  free(r->buf);
  ms__zsource_destroy(r->z);
  ms__snapbuild_release(&r->b);
  MS_VEC_FREE(&r->frame_map);
  MS_VEC_FREE(&r->stack_map);
  free(r);
  return rc;
}
