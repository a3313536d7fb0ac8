/* SPDX-License-Identifier: MIT
 * memsnap core: the guard scanner of the snapshot reader (msgpack_read.h): decides where each
 * top-level msgpack object ends and that it is well-formed (complete, no invalid type byte, every
 * declared length backed by bytes present and within the per-object limits) before anything is
 * built from it; and the helpers that locate a value inside a checked object for error messages.
 */
#include <inttypes.h>
#include <limits.h>
#include <msgpack.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "snapshot/msgpack_read.h"

static uint64_t be_read(const unsigned char *p, int n) {
  uint64_t v = 0;
  for (int i = 0; i < n; i++)
    v = (v << 8) | p[i];
  return v;
}

/* Decodes the header of the value at p (avail bytes). *hdr = header bytes, *payload = bytes that
 * follow the header, *children = values contained (maps count keys and values).
 * @return 1 ok, 0 need more bytes, -1 invalid type byte. */
int ms__mp_head(const unsigned char *p, size_t avail, size_t *hdr, uint64_t *payload,
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

int ms__mp_guard_scan(guard_t *g, const unsigned char *p, size_t avail, char *why, size_t whycap) {
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
      int r = ms__mp_head(p + pos, avail - pos, &hdr, &payload, &children);
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
    if (ms__mp_head(p + pos, len - pos, &hdr, &payload, &children) != 1) return len;
    pos += hdr + (size_t)payload;
    todo += children;
    todo--;
  }
  return pos;
}

size_t ms__mp_child_offset(const unsigned char *p, size_t len, size_t pos, uint64_t idx) {
  size_t hdr;
  uint64_t payload, children;
  if (pos >= len || ms__mp_head(p + pos, len - pos, &hdr, &payload, &children) != 1) return pos;
  if (idx >= children) return pos;
  pos += hdr;
  for (uint64_t i = 0; i < idx && pos < len; i++)
    pos = mp_skip(p, len, pos);
  return pos;
}

/* Reader state. */
