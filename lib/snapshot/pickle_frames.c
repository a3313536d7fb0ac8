/* SPDX-License-Identifier: MIT
 * memsnap core: the hot paths of the pickle reader that fill a trace entry's frames list
 * (the reader's files and vocabulary: pickle_internal.h).
 *
 * PyTorch's files hold most of their bytes in frames lists: a MARK, one memo get per frame (a
 * frame dict met before, already interned), an APPENDS. These two paths write the frames'
 * indices straight to the list's place at the builder's stack tail (pickle_schema.c interns the
 * stack when the list is complete): one after the gets pushed their values (APPENDS), one for
 * the whole run of gets before anything is pushed (called from the VM's loop for a run of gets).
 * Either takes what it can and leaves the rest, untouched, to the general path of
 * pickle_schema.c, so that what a file means and how it fails do not depend on which path read
 * it.
 */
#include <stdlib.h>

#include "snapshot/pickle_internal.h"

/* The hot path of real snapshots: a batch of frame dicts (memo gets, already interned) appended
 * to a frames list that is being filled. Handles the leading run of such items; returns where
 * the general path must continue. */
size_t ms__pickle_appends_frames_fast(rd_t *r, uint32_t lid, size_t from) {
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

MS_HOT_ALIGN bool ms__pickle_frame_gets(rd_t *r, size_t pos, int op, size_t have, size_t *nout,
                           size_t *end) {
  /* One pass: each get is checked (an interned frame dict, an APPENDS after the run) and its
   * frame's index written to the list's place at the stack tail, in room reserved as the run
   * grows. Nothing is committed: on a failure the indices written stay scratch past the list's
   * length, and the only other writes, OF_USED on interned frame dicts and the frame cache,
   * change nothing (an interned frame is already closed to changes and may be stored again; the
   * cache holds what the memo says). A get whose memo index the cache holds costs one load
   * instead of three dependent ones (the tag, the object, its fields). */
  rd_fslot_t *fc = r->fcache;
  if (!fc) {
    if (!(fc = malloc(RD_FCACHE_SLOTS * sizeof *fc))) return false;
    memset(fc, 0xff, RD_FCACHE_SLOTS * sizeof *fc); /* every slot empty */
    r->fcache = fc;
  }
  const unsigned char *buf = (const unsigned char *)r->buf;
  const uint8_t *tag = r->memo_tag.ptr;
  const uint32_t *memo_obj = r->memo_obj.ptr;
  rd_obj_t *objs = r->objs.ptr;
  size_t nmemo = r->memo.len, n = 0;
  if (r->lim - pos < 5) return false;
  /* room for 64 Ki gets at most (a longer run is the general path's), reserved once: a get is
   * two bytes at least, so a get read at pos <= last is within it, whole, and so is the opcode
   * after it (one nearer lim is the general path's: rd_read has lim >= pos) */
  size_t room = (size_t)1 << 16, last = r->lim - 5;
  if (last > pos + 2 * room - 2) last = pos + 2 * room - 2;
  uint32_t *dst = NULL;
  if (rd_tail(r, have, room, &dst) != MS_OK) return false;
  dst += have;
  for (int o = op;;) {
    uint32_t idx;
    if (o == 'j') {
      if (ms_unlikely(pos > last)) return false;
      idx = rd_le32(buf + pos);
      o = buf[pos + 4];
      pos += 5;
    } else if (o == 'h') {
      if (ms_unlikely(pos > last)) return false;
      idx = buf[pos];
      o = buf[pos + 1];
      pos += 2;
    } else if (o == 'e') {
      break;
    } else {
      return false;
    }
    rd_fslot_t *slot = &fc[idx & (RD_FCACHE_SLOTS - 1)];
    uint32_t ref = slot->ref;
    if (ms_unlikely(slot->idx != idx)) {
      if (idx >= nmemo || tag[idx] != V_OBJ) return false;
      rd_obj_t *f = &objs[memo_obj[idx]];
      if (f->role != R_FRAME || !(f->flags & OF_INTERNED)) return false;
      f->flags |= OF_USED;
      ref = f->ref;
      *slot = (rd_fslot_t){idx, ref};
    }
    dst[n++] = ref;
  }
  *nout = n;
  *end = pos;
  return true;
}

bool ms__pickle_frames_run(rd_t *r, int op) {
  if (r->marks.len == 0) return false;
  size_t from = rd_mark_pos(r);
  if (from == 0 || r->st.len != from) return false; /* the run is the whole batch */
  if (r->marks.len > 1 && from - 1 < r->marks.ptr[r->marks.len - 2]) return false;
  const rd_val_t *t = &r->st.ptr[from - 1];
  if (t->t != V_OBJ) return false;
  uint32_t lid = t->v.obj;
  rd_obj_t *l = &r->objs.ptr[lid];
  if (l->kind != O_LIST || l->role != R_FRAMES || (l->flags & (OF_USED | OF_SEALED))) return false;
  if (r->fbuf_owner != lid && (r->fbuf_owner != RD_NO_OBJ || l->count != 0)) return false;
  size_t have = r->fbuf_owner == lid ? r->fbuf_len : 0, n = 0, pos = 0;
  if (!ms__pickle_frame_gets(r, r->pos, op, have, &n, &pos)) return false;
  /* the general path fails on a stack this deep, or a list this long */
  if (n > RD_MAX_STACK - r->st.len || (uint64_t)l->count + n > UINT32_MAX) return false;
  if (r->fbuf_owner != lid) {
    r->fbuf_owner = lid;
    r->fbuf_len = 0;
  }
  r->fbuf_len += n;
  r->objs.ptr[lid].count += (uint32_t)n;
  r->pos = pos;
  r->marks.len--;
  return true;
}
