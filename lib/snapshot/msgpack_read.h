/* SPDX-License-Identifier: MIT
 * memsnap core: the snapshot reader's state and the functions its files share. The reader is
 * three files: msgpack_guard.c (the guard scanner that checks a top-level object before anything
 * is built from it), msgpack_read.c (the input buffer, the hot tables' rows decoded straight from
 * the bytes, the body loop, ms_snapshot_read) and msgpack_objects.c (the cold objects: header,
 * meta, devices, settings, unpacked with msgpack-c; and the error reports). Only the msgpack*
 * files of this module include it (it needs <msgpack.h>).
 */
#ifndef MEMSNAP_LIB_SNAPSHOT_MSGPACK_READ_H
#define MEMSNAP_LIB_SNAPSHOT_MSGPACK_READ_H

#include <inttypes.h>
#include <msgpack.h>
#include <stdbool.h>
#include <stddef.h>

#include "common/internal.h"
#include "memsnap/serialize.h"
#include "model/snapbuild.h"
#include "snapshot/msgpack_schema.h"
#include "snapshot/zio.h"

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
      return ms__mpr_fail_col(r, MS_EFORMAT, col, cols[col], "value out of range (> 4294967295)"); \
    (dst) = (uint32_t)o_->via.u64;                                                                 \
  } while (0)

/* ---- msgpack_guard.c ---------------------------------------------------------------------- */

int ms__mp_guard_scan(guard_t *g, const unsigned char *p, size_t avail, char *why, size_t whycap);
size_t ms__mp_child_offset(const unsigned char *p, size_t len, size_t pos, uint64_t idx);
int ms__mp_head(const unsigned char *p, size_t avail, size_t *hdr, uint64_t *payload,
                uint64_t *children);
const char *ms__mp_type_name(msgpack_object_type t);

/* ---- msgpack_objects.c: the cold objects and the error reports ----------------------------- */

int ms__mpr_device_chunk(rd_t *r, const msgpack_object *o);
int ms__mpr_fail_col(rd_t *r, int err, int col, const char *colname, const char *msg);
int ms__mpr_fail_off(rd_t *r, int err, uint64_t off, const char *path, const char *fmt, ...)
    MS_PRINTF(5, 6);
int ms__mpr_header(rd_t *r);
int ms__mpr_meta(rd_t *r);
int ms__mpr_nomem(rd_t *r, int rc);
void ms__mpr_release_obj(rd_t *r);
int ms__mpr_settings(rd_t *r, const msgpack_object *o);
int ms__mpr_unpack(rd_t *r, const char *expect, msgpack_object *o);

/* ---- msgpack_read.c ------------------------------------------------------------------------ */

int ms__mpr_next(rd_t *r, const char *expect);

#endif /* MEMSNAP_LIB_SNAPSHOT_MSGPACK_READ_H */
