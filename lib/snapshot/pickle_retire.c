/* SPDX-License-Identifier: MIT
 * memsnap core: the pickle reader's objects that can no longer be named, freed (issue #33; the
 * reader's files and vocabulary: pickle_internal.h).
 *
 * A long trace is most of a file: one dict per entry and one frames list in each, two objects
 * (rd_obj_t) per entry, 200 MB of a 1 GB pickle's read when every object stayed to the end. Once
 * an entry is stored into its device's list, a file names it again only through the memo or
 * through a copy of it left on the stack, and its frames list only through those or through the
 * entry (the list's path in messages goes through its parent). So when a device list takes its
 * entries (APPENDS), each entry that sits at most in one memo entry, is not on the stack and is
 * the parent of nothing but its own frames list is freed, and so is that list when it has no
 * child and sits at most in one memo entry: an object freed goes to a free list, and the next
 * container takes it, so that the objects stay as many as are alive at once.
 *
 * A memoized frames list (memsnap's writer memoizes every frames list, not the entries) can be
 * named again by a memo get, which must find it as it was, and its entry behind it for messages'
 * paths. Its memo entry keeps what that takes in 4 bytes: the entry's trace record, from which
 * the entry's list (the device list holding that record), its index there and the list's stack
 * (the record's) follow; the list's length goes to tf_count, by record, and the flags that vary
 * to the memo tag (RD_TF_*). It is kept so only when all of that gives back exactly the two
 * objects as they were; else both stay. A get makes them again (ms__pickle_revive), and the memo
 * holds the new list from then on, as it held the old one: every field, and so every message a
 * file can make from them, is what it was. The entry that then stores the list as its frames
 * holds it (count) as if it were its own, and when that entry is freed the list goes back into
 * its memo entry and both objects made again are freed with it (the entry made again is marked by
 * RD_KEY_REVIVED): a file that names its lists again long after their entries (the frees of old
 * blocks, a stack met again, in a file that does not memoize its entries) keeps no more objects.
 *
 * Python's pickler (PyTorch's files) memoizes every dict too, so each entry sits in a memo entry
 * of its own; kept whole, a 1 GB file's entries and lists held 200 MB to the end of the read. An
 * entry dict's first memo index is noted by its record (te_memo: the dict's idx is its place in
 * the list, for paths), and when the entry is freed its memo entry keeps it as the list's does
 * (RD_TAG_TENTRY, the same record and flags), with the distance to its list's memo index
 * (te_fdelta, by record: PyTorch puts the list a few memo entries after its dict). A get of
 * either makes both again and puts each back into its memo entry, unless that entry was stored
 * again since. An entry whose frames are a list that an earlier entry holds (PyTorch's
 * free_completed takes its free_requested's), or none, is kept alone (te_fdelta 0): made again,
 * it holds no list, as it held none of its own (the list made again for it goes back with the
 * entry behind it).
 *
 * What is never freed: an object on the stack (a scan of at most RD_RETIRE_SCAN values, else
 * nothing is freed), memoized twice (OF_KEEP), a dict memoized that is no trace entry, the
 * parent of a container that is not its entry's one frames list (frame dicts met first in a list
 * keep it), and a list being filled or queued for interning (the queue is interned first).
 */
#include "snapshot/pickle_internal.h"

/* The most values on the stack that a retirement scans for copies of what it frees. */
#define RD_RETIRE_SCAN 64
/* rd_obj_t.kind of a freed object (debugging) */
#define RD_KIND_FREE 0xffu
/* rd_obj_t.key of an entry made again with its frames list (ms__pickle_revive): no key of the
 * schema (it sits in a list, so its key is in no path) */
#define RD_KEY_REVIVED K_COUNT

bool ms__pickle_recycle = true;
_Thread_local size_t ms__pickle_last_objs, ms__pickle_last_revived, ms__pickle_last_whole;

int ms__pickle_new_obj(rd_t *r, uint8_t kind, uint32_t *id) {
  rd_obj_t o = {kind, R_NONE, 0, K_UNKNOWN, RD_NO_OBJ, {0}, 0, 0};
  uint32_t at = r->free_obj;
  if (at != RD_NO_OBJ) {
    r->free_obj = r->objs.ptr[at].ref;
  } else {
    if (r->objs.len >= UINT32_MAX - 1) return ms__pickle_err(r, MS_ELIMIT, "too many containers");
    if (MS_BIGVEC_RESERVE(&r->objs, 1)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
    at = (uint32_t)r->objs.len++;
  }
  r->objs.ptr[at] = o;
  *id = at;
  return MS_OK;
}

static void rt_free(rd_t *r, uint32_t id) {
  rd_obj_t *o = &r->objs.ptr[id];
  *o = (rd_obj_t){RD_KIND_FREE, R_NONE, 0, K_UNKNOWN, RD_NO_OBJ, {0}, r->free_obj, 0};
  r->free_obj = id;
}

void ms__pickle_child_born(rd_t *r, uint32_t parent) {
  rd_obj_t *p = &r->objs.ptr[parent];
  if (p->role == R_TRACE)
    p->flags |= (p->flags & OF_ONE) ? OF_KEEP : OF_ONE;
  else if (p->role == R_FRAMES)
    p->flags |= OF_KEEP; /* a frame dict met first in this list: its path goes through it */
}

/* Whether list fl was made again from the memo (its entry, behind it for paths only, too). */
static bool rt_revived(const rd_t *r, uint32_t fl) {
  uint32_t p = r->objs.ptr[fl].parent;
  return p != RD_NO_OBJ && r->objs.ptr[p].key == RD_KEY_REVIVED;
}

void ms__pickle_frames_stored(rd_t *r, uint32_t e, uint32_t fl) {
  rd_obj_t *o = &r->objs.ptr[e];
  /* its own list, or one made again that it alone holds: freed with it */
  if (r->objs.ptr[fl].parent == e || (!(o->flags & OF_ONE) && rt_revived(r, fl))) o->count = fl + 1;
}

/* 1 + the memo index that trace record rec's entry dict was first put at; 0: never. */
static uint32_t rt_te_memo(const rd_t *r, uint32_t rec) {
  return rec < r->te_memo.len ? r->te_memo.ptr[rec] : 0;
}

/* An entry dict of record rec put into the memo at idx: noted when it is its first put (false:
 * a second one, or no memory to note it, and the dict is kept). */
static bool rt_note_entry_put(rd_t *r, uint32_t rec, uint32_t idx) {
  if (idx == UINT32_MAX) return false;
  if (rec < r->te_memo.len) {
    if (r->te_memo.ptr[rec]) return false;
  } else {
    size_t add = (size_t)rec + 1 - r->te_memo.len;
    if (MS_BIGVEC_RESERVE(&r->te_memo, add)) return false;
    for (size_t i = r->te_memo.len; i < rec; i++) r->te_memo.ptr[i] = 0; /* mostly none */
    r->te_memo.len += add;
  }
  r->te_memo.ptr[rec] = idx + 1;
  return true;
}

void ms__pickle_memoized(rd_t *r, uint32_t id, uint32_t idx) {
  rd_obj_t *o = &r->objs.ptr[id];
  bool dict_parent = o->parent != RD_NO_OBJ && r->objs.ptr[o->parent].kind == O_DICT;
  if (o->kind == O_LIST && dict_parent && !(o->flags & (OF_ONE | OF_KEEP))) {
    o->flags |= OF_ONE;
    o->memo = idx; /* a list under a dict has no index for paths */
  } else if (o->kind == O_DICT && o->role == R_TRACE && !(o->flags & OF_KEEP) &&
             rt_note_entry_put(r, o->ref, idx)) {
    /* an entry dict put once (Python's files): its index is noted by its record (it needs its
     * idx for paths), and it may go into the memo with its frames list (RD_TAG_TENTRY) */
  } else {
    o->flags |= OF_KEEP;
  }
}

/* ---- device lists by their records --------------------------------------------------------- */

int ms__pickle_trace_list(rd_t *r, uint32_t lid) {
  if (r->tlists_broken) return MS_OK;
  uint32_t ref = r->objs.ptr[lid].ref;
  if (r->tlists.len && r->objs.ptr[r->tlists.ptr[r->tlists.len - 1]].ref >= ref) {
    r->tlists_broken = true; /* lists found by record must be in record order */
    return MS_OK;
  }
  if (MS_VEC_PUSH(&r->tlists, lid)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  return MS_OK;
}

/* The device list whose records begin last at or before rec (RD_NO_OBJ: none): the one that
 * holds rec, when one does, since a record is stored in one list. */
static uint32_t rt_list_of(const rd_t *r, uint32_t rec) {
  size_t lo = 0, hi = r->tlists.len;
  while (lo < hi) { /* the first list beginning after rec */
    size_t mid = lo + (hi - lo) / 2;
    if (r->objs.ptr[r->tlists.ptr[mid]].ref <= rec)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo ? r->tlists.ptr[lo - 1] : RD_NO_OBJ;
}

/* ---- freeing an entry ----------------------------------------------------------------------- */

/* A filter of the objects on the stack, made once per batch of entries (the stack does not change
 * while they are retired): bit (id & 63) of each; an object whose bit is clear is not there. */
static uint64_t rt_stack_bits(const rd_t *r) {
  uint64_t bits = 0;
  for (size_t i = 0; i < r->st.len; i++)
    if (r->st.ptr[i].t == V_OBJ) bits |= 1ull << (r->st.ptr[i].v.obj & 63);
  return bits;
}

static bool rt_on_stack(const rd_t *r, uint64_t bits, uint32_t a, uint32_t b) {
  if (!(bits >> (a & 63) & 1) && !(bits >> (b & 63) & 1)) return false;
  for (size_t i = 0; i < r->st.len; i++) {
    const rd_val_t *v = &r->st.ptr[i];
    if (v->t == V_OBJ && (v->v.obj == a || v->v.obj == b)) return true;
  }
  return false;
}

/* Whether entry dict e comes back exactly as it is from its record (ms__pickle_revive): in its
 * device list at its record's place, its key none of the schema's, its flags `want` but for
 * those the memo tag keeps (RD_TF_ENTRY_*). */
static bool rt_entry_back(const rd_t *r, uint32_t e, uint8_t want, bool revived_key) {
  const rd_obj_t *o = &r->objs.ptr[e];
  uint32_t rec = o->ref;
  if (rec >= r->b.trace.len || o->kind != O_DICT) return false;
  if (o->key != K_UNKNOWN && !(revived_key && o->key == RD_KEY_REVIVED)) return false;
  uint32_t lid = rt_list_of(r, rec);
  if (lid == RD_NO_OBJ || lid != o->parent || rec - r->objs.ptr[lid].ref != o->idx) return false;
  return (o->flags & ~(OF_ACCOUNTED | OF_DROPPED)) == want;
}

static uint8_t rt_entry_bits(const rd_obj_t *o) {
  return (uint8_t)((o->flags & OF_ACCOUNTED ? RD_TF_ENTRY_ACCOUNTED : 0) |
                   (o->flags & OF_DROPPED ? RD_TF_ENTRY_DROPPED : 0));
}

/* The memo tag that keeps frames list fl of entry e, or 0 when the objects would not come back
 * exactly as they are. */
static uint8_t rt_tag(const rd_t *r, uint32_t e, uint32_t fl) {
  const rd_obj_t *o = &r->objs.ptr[e], *f = &r->objs.ptr[fl];
  if (!rt_entry_back(r, e, OF_USED | OF_ONE, true)) return 0;
  const uint8_t fflags = OF_USED | OF_SEALED | OF_ONE;
  if (f->kind != O_LIST || f->key != K_FRAMES || (f->flags & ~OF_DROPPED) != fflags) return 0;
  if (f->ref != r->b.trace.ptr[o->ref].stack) return 0;
  return (uint8_t)(RD_TAG_TFRAMES | (f->flags & OF_DROPPED ? RD_TF_LIST_DROPPED : 0) |
                   rt_entry_bits(o));
}

/* The memo index that names entry dict e now: the one it was first put at, while that still
 * holds it. UINT32_MAX: none (never memoized, or that memo entry was stored again). */
static uint32_t rt_entry_named(const rd_t *r, uint32_t e) {
  uint32_t m = rt_te_memo(r, r->objs.ptr[e].ref);
  if (!m--) return UINT32_MAX;
  return r->memo_tag.ptr[m] == V_OBJ && r->memo_obj.ptr[m] == e ? m : UINT32_MAX;
}

/* Grows a table by trace record (tf_count, te_fdelta) to hold record rec; the entries between
 * are never read. false: out of memory. */
static inline bool rt_by_rec(void **ptr, size_t *len, size_t *cap, uint32_t rec, size_t size) {
  if (rec < *len) return true;
  size_t add = (size_t)rec + 1 - *len;
  if (add > *cap - *len && ms__bigvec_reserve(ptr, cap, *len, add, size)) return false;
  *len = (size_t)rec + 1;
  return true;
}
#define RT_BY_REC(v, rec) rt_by_rec((void **)&(v)->ptr, &(v)->len, &(v)->cap, (rec), sizeof *(v)->ptr)

/* Entry dict e, named by memo entry di, kept there alone (RD_TAG_TENTRY, te_fdelta 0): made
 * again, it holds no frames list (a trace entry's holds one only to be freed with it), which is
 * what it held when its frames were none or a list that another entry holds (the caller checked
 * rt_entry_back(r, e, OF_USED, false)). */
static int rt_keep_alone(rd_t *r, uint32_t e, uint32_t di) {
  const rd_obj_t *o = &r->objs.ptr[e];
  if (!RT_BY_REC(&r->te_fdelta, o->ref)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  r->te_fdelta.ptr[o->ref] = 0;
  r->memo_tag.ptr[di] = (uint8_t)(RD_TAG_TENTRY | rt_entry_bits(o));
  r->memo_obj.ptr[di] = o->ref;
  return MS_OK;
}

/* Frames list fl of entry e, kept in their memo entries when they can be (true): the list's
 * (f->memo) when `list_named`, the entry's (di) when it is not UINT32_MAX. */
static int rt_keep_in_memo(rd_t *r, uint32_t e, uint32_t fl, bool list_named, uint32_t di,
                           bool *kept) {
  *kept = false;
  uint8_t tag = rt_tag(r, e, fl);
  if (!tag) return MS_OK;
  uint32_t rec = r->objs.ptr[e].ref;
  const rd_obj_t *f = &r->objs.ptr[fl];
  /* the list's memo index is found from the entry's by their distance: its put comes after */
  if (di != UINT32_MAX && (f->memo <= di || f->memo - di > UINT8_MAX)) return MS_OK;
  if (!RT_BY_REC(&r->tf_count, rec) || (di != UINT32_MAX && !RT_BY_REC(&r->te_fdelta, rec)))
    return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  r->tf_count.ptr[rec] = f->count;
  if (list_named) {
    r->memo_tag.ptr[f->memo] = tag;
    r->memo_obj.ptr[f->memo] = rec;
  }
  if (di != UINT32_MAX) {
    r->te_fdelta.ptr[rec] = (uint8_t)(f->memo - di);
    r->memo_tag.ptr[di] = (uint8_t)(RD_TAG_TENTRY | (tag & 7u));
    r->memo_obj.ptr[di] = rec;
  }
  *kept = true;
  return MS_OK;
}

/* Entry e, just stored into its device list and off the stack: freed, with its frames list, when
 * nothing can name them again. That list is its own child, or a list made again from the memo
 * (whose entry made again, its parent, goes with it). */
static int rt_retire(rd_t *r, uint64_t stack_bits, uint32_t e) {
  const rd_obj_t *o = &r->objs.ptr[e];
  if (o->role != R_TRACE || (o->flags & OF_KEEP)) return MS_OK;
  if ((o->flags & OF_ONE) && o->count == 0) return MS_OK; /* its child is not its frames list */
  uint32_t fl = o->count ? o->count - 1 : RD_NO_OBJ, owner = e;
  /* an entry that the memo names goes there (RD_TAG_TENTRY): with its own frames list, or alone
   * when it has none or holds one made again, which goes with the entry behind it (dl: the memo
   * entry of that entry) */
  uint32_t di = rt_entry_named(r, e), dl = di;
  if (fl != RD_NO_OBJ) {
    const rd_obj_t *f = &r->objs.ptr[fl];
    if (f->parent != e) { /* a list made again (ms__pickle_frames_stored) */
      if ((o->flags & OF_ONE) || !rt_revived(r, fl)) return MS_OK;
      owner = f->parent;
      /* the entry made again, named through the memo since: it goes back there, or stays */
      if (r->objs.ptr[owner].flags & OF_KEEP) return MS_OK;
      dl = rt_entry_named(r, owner);
    }
    if (f->role != R_FRAMES || (f->flags & OF_KEEP) || fl == r->fbuf_owner) return MS_OK;
    if (f->flags & OF_PENDING) MS_FORWARD_IF_ERROR(ms__pickle_flush(r));
  }
  bool alone = di != UINT32_MAX && (fl == RD_NO_OBJ || owner != e);
  if (alone && !rt_entry_back(r, e, OF_USED, false)) return MS_OK;
  if (r->st.len > RD_RETIRE_SCAN || rt_on_stack(r, stack_bits, e, fl) ||
      (owner != e && rt_on_stack(r, stack_bits, owner, owner)))
    return MS_OK;
  if (fl != RD_NO_OBJ) {
    const rd_obj_t *f = &r->objs.ptr[fl];
    bool named =
        (f->flags & OF_ONE) && r->memo_tag.ptr[f->memo] == V_OBJ && r->memo_obj.ptr[f->memo] == fl;
    if (named || dl != UINT32_MAX) {
      bool kept = false;
      MS_FORWARD_IF_ERROR(rt_keep_in_memo(r, owner, fl, named, dl, &kept));
      if (!kept) return MS_OK;
    }
  }
  if (alone) MS_FORWARD_IF_ERROR(rt_keep_alone(r, e, di));
  if (fl != RD_NO_OBJ) {
    rt_free(r, fl);
    if (owner != e) rt_free(r, owner); /* named by nothing but its list and the memo */
  }
  rt_free(r, e);
  return MS_OK;
}

int ms__pickle_retire_entries(rd_t *r, size_t from, size_t to) {
  if (!ms__pickle_recycle) return MS_OK;
  uint64_t bits = r->st.len > RD_RETIRE_SCAN ? 0 : rt_stack_bits(r);
  for (size_t i = from; i < to; i++) {
    const rd_val_t *v = &r->st.ptr[i]; /* past st.len: nothing was pushed since */
    if (v->t == V_OBJ) MS_FORWARD_IF_ERROR(rt_retire(r, bits, v->v.obj));
  }
  return MS_OK;
}

/* ---- a freed frames list named again -------------------------------------------------------- */

/* Memo entry i holds record rec's entry or list, freed, with the tag test `is`. */
static bool rt_holds_freed(const rd_t *r, uint32_t i, uint32_t rec, bool (*is)(uint8_t)) {
  return i < r->memo.len && is(r->memo_tag.ptr[i]) && r->memo_obj.ptr[i] == rec;
}

/* Record rec's entry dict made again into *e, in device list lid at its record's place, its
 * flags `flags` and those the memo tag kept (RD_TF_ENTRY_*). */
static int rt_revive_entry(rd_t *r, uint32_t rec, uint32_t lid, uint8_t tag, uint8_t flags,
                           uint32_t *e) {
  MS_FORWARD_IF_ERROR(ms__pickle_new_obj(r, O_DICT, e));
  rd_obj_t *o = &r->objs.ptr[*e];
  o->role = R_TRACE;
  o->flags = (uint8_t)(flags | (tag & RD_TF_ENTRY_ACCOUNTED ? OF_ACCOUNTED : 0) |
                       (tag & RD_TF_ENTRY_DROPPED ? OF_DROPPED : 0));
  o->parent = lid;
  o->idx = rec - r->objs.ptr[lid].ref;
  o->ref = rec;
  return MS_OK;
}

int ms__pickle_revive(rd_t *r, uint32_t idx) {
  uint8_t tag = r->memo_tag.ptr[idx];
  uint32_t rec = r->memo_obj.ptr[idx], e = RD_NO_OBJ, fl = RD_NO_OBJ;
  uint32_t lid = rt_list_of(r, rec);
  /* the pair's memo indices: the list's (fi), and the entry's (di) when it was memoized */
  uint32_t fi = idx, di = UINT32_MAX, m = rt_te_memo(r, rec);
  if (rd_tag_tentry(tag)) {
    di = idx;
    if (r->te_fdelta.ptr[rec] == 0) { /* an entry without a list of its own (rt_keep_alone) */
      MS_FORWARD_IF_ERROR(rt_revive_entry(r, rec, lid, tag, OF_USED, &e));
      r->memo_tag.ptr[di] = V_OBJ;
      r->memo_obj.ptr[di] = e;
      r->revived++;
      return MS_OK;
    }
    fi = idx + r->te_fdelta.ptr[rec];
  } else if (m && rt_holds_freed(r, m - 1, rec, rd_tag_tentry)) {
    di = m - 1;
  }
  MS_FORWARD_IF_ERROR(rt_revive_entry(r, rec, lid, tag, OF_USED | OF_ONE, &e));
  MS_FORWARD_IF_ERROR(ms__pickle_new_obj(r, O_LIST, &fl));
  rd_obj_t *o = &r->objs.ptr[e], *f = &r->objs.ptr[fl];
  o->key = RD_KEY_REVIVED;
  o->count = fl + 1;
  f->role = R_FRAMES;
  f->flags = (uint8_t)(OF_USED | OF_SEALED | OF_ONE | (tag & RD_TF_LIST_DROPPED ? OF_DROPPED : 0));
  f->key = K_FRAMES;
  f->parent = e;
  f->memo = fi;
  f->ref = r->b.trace.ptr[rec].stack;
  f->count = r->tf_count.ptr[rec];
  /* each back in the memo entry that held it freed (one stored again since holds its value) */
  if (rt_holds_freed(r, fi, rec, rd_tag_tframes)) {
    r->memo_tag.ptr[fi] = V_OBJ;
    r->memo_obj.ptr[fi] = fl;
  }
  if (di != UINT32_MAX) {
    r->memo_tag.ptr[di] = V_OBJ;
    r->memo_obj.ptr[di] = e;
  }
  r->revived++;
  return MS_OK;
}

void ms__pickle_retire_release(rd_t *r) {
  ms__pickle_last_objs = r->objs.len;
  ms__pickle_last_revived = r->revived;
  ms__pickle_last_whole = r->whole;
  ms__big_free(r->tf_count.ptr);
  ms__big_free(r->te_memo.ptr);
  ms__big_free(r->te_fdelta.ptr);
  MS_VEC_FREE(&r->tlists);
}
