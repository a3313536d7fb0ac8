/* SPDX-License-Identifier: MIT
 * memsnap core: a trace entry read in one loop when the trace is kept (the reader's files and
 * vocabulary: pickle_internal.h).
 *
 * Most of a long trace's bytes are its entries: PyTorch writes each as EMPTY_DICT, MEMOIZE (in
 * Python's files; not in every writer's), MARK, a dozen keys and values (memo gets of the key
 * strings and of the action, integers) and a frames list (EMPTY_LIST, MEMOIZE, MARK, one memo
 * get per frame, APPENDS), then SETITEMS. Through the general loop each of those opcodes is a
 * turn of the dispatch and a value pushed and popped, and SETITEMS converts every field through
 * the schema's generic checks. Here, once the general path has created the dict (so its role
 * and record are exactly the general path's), the rest of the entry is scanned to its SETITEMS
 * into a copy of its record, without touching the reader's state. When every opcode in it is one
 * this loop knows, every value has the type its field wants and every limit the general path
 * checks holds, its effect is applied in the general path's order:
 *
 *   1. what its opcodes do: the dict's and the frames list's memo puts, the list made (its
 *      object, its frame indices at the builder's stack tail, as ms__pickle_frames_run leaves
 *      them);
 *   2. what SETITEMS does: the fields, the frames list queued for interning (or its stack left
 *      out, MS_LOAD_NO_*_STACKS, decided on the fields set before it), the extra fields set
 *      once, the entry accounted for (pickle_drop.c).
 *
 * Anything else (a string met for the first time, another opcode, a frame's or the buffer's end,
 * an index the memo does not hold, a frame not interned yet, a value of the wrong type, a pool
 * id, the frames or an action after the frames met twice, a memo with holes) leaves r as it
 * was, and the general path reads the entry and says what is wrong with it, so that what a file
 * means and how it fails do not depend on which path read it.
 */
#include "snapshot/pickle_internal.h"

bool ms__pickle_fast = true;

typedef struct en_scan_s {
  const unsigned char *buf;
  size_t pos, lim;
  const uint8_t *tag; /* the memo's */
  const rd_val_t *memo;
  size_t nmemo;
} en_scan_t;

/* An optional memo put at k->pos of the memo's next index, want (rd_scan_put). */
MS_ALWAYS_INLINE bool en_put(en_scan_t *k, size_t want, bool *put) {
  return rd_scan_put(k->buf, &k->pos, k->lim, want, put);
}

/* A memo get at k->pos (BINGET, LONG_BINGET) of an index the memo holds: the index.
 * EN_NO_GET: another opcode, an index not stored, or the argument reaching lim (the memo never
 * reaches UINT32_MAX entries: rd_memo_put refuses them). */
#define EN_NO_GET UINT32_MAX
MS_ALWAYS_INLINE uint32_t en_get_idx(en_scan_t *k) {
  size_t left = k->lim - k->pos;
  if (left < 2) return EN_NO_GET;
  unsigned op = k->buf[k->pos];
  uint32_t idx;
  if (op == 'j' && left >= 5) {
    idx = rd_le32(k->buf + k->pos + 1);
    k->pos += 5;
  } else if (op == 'h') {
    idx = k->buf[k->pos + 1];
    k->pos += 2;
  } else {
    return EN_NO_GET;
  }
  return idx < k->nmemo ? idx : EN_NO_GET;
}

/* en_get_idx of a value that is no container: its tag (0: none this loop takes). */
MS_ALWAYS_INLINE uint8_t en_get(en_scan_t *k, uint32_t *idx) {
  *idx = en_get_idx(k);
  if (*idx == EN_NO_GET) return 0;
  uint8_t t = k->tag[*idx];
  return t == V_OBJ || t >= RD_TAG_TFRAMES ? 0 : t; /* V_UNSET is 0 */
}

/* A value that is no container at k->pos: an integer opcode, NONE, a bool, or a memo get. */
MS_ALWAYS_INLINE bool en_scalar(en_scan_t *k, rd_val_t *v) {
  const unsigned char *b = k->buf;
  size_t left = k->lim - k->pos; /* each opcode's bytes must lie below lim */
  if (left < 1) return false;
  unsigned op = b[k->pos];
  const unsigned char *q = b + k->pos + 1;
  *v = (rd_val_t){V_INT, K_UNKNOWN, 0, 0, 0, {0}};
  switch (op) {
  case 'h':
  case 'j': {
    uint32_t idx;
    uint8_t t = en_get(k, &idx);
    if (!t) return false;
    *v = k->memo[idx];
    return true;
  }
  case 'K': /* BININT1, BININT2, BININT */
    if (left < 2) return false;
    v->v.i = q[0];
    k->pos += 2;
    return true;
  case 'M':
    if (left < 3) return false;
    v->v.i = q[0] | q[1] << 8;
    k->pos += 3;
    return true;
  case 'J':
    if (left < 5) return false;
    v->v.i = (int64_t)(int32_t)rd_le32(q);
    k->pos += 5;
    return true;
  case 0x8a: { /* LONG1 of 1 to 8 bytes: addresses and times */
    if (left < 10) return false; /* its eight-byte load (near lim: the general path) */
    size_t n = q[0];
    if (n - 1 >= 8) return false;
    *v = rd_long1(q + 1, n);
    k->pos += 2 + n;
    return true;
  }
  case 'N': v->t = V_NONE; k->pos += 1; return true;
  case 0x88:
  case 0x89:
    v->t = V_BOOL;
    v->v.i = op == 0x88;
    k->pos += 1;
    return true;
  default: return false;
  }
}

/* A string met for the first time (SHORT_BINUNICODE), or the frames list: made when the scan is
 * applied, in the file's order. */
typedef struct en_event_s {
  uint32_t at;   /* EN_STR: the string's offset in buf */
  uint8_t len;   /* EN_STR: its length */
  uint8_t kind;  /* EN_STR, EN_LIST, EN_GET (at: the memo index of a frames list got) */
  uint8_t field; /* EN_STR: the key it is stored under (K_*) */
  bool put;      /* a memo put follows it */
  uint32_t off;  /* EN_GET: its opcode's offset in buf (for messages) */
} en_event_t;

enum { EN_STR = 1, EN_LIST, EN_GET };
#define EN_MAX_EVENTS 8

/* The extra fields ms__pickle_birth gives a trace record: an action named "" until its
 * "action" comes. */
static ms_snap_trace_extra_t en_born_extra(void) {
  ms_snap_trace_extra_t x = {"", "", "", {0, 0}, "", 0};
  return x;
}

/* What the scan found beyond the record's fields. */
typedef struct en_found_s {
  bool dict_put;           /* a memo put of the dict */
  size_t nput;             /* memo puts, the dict's included */
  en_event_t ev[EN_MAX_EVENTS];
  size_t nev;
  bool frames;             /* a frames list: */
  uint32_t nframes;        /* made here: its frames (at the builder's stack tail) */
  uint64_t frames_off;     /* made here: the file offset of its first get */
  bool got, drop;          /* got from the memo: its stack left out (MS_LOAD_NO_*_STACKS) */
  uint32_t list, rec;      /* the entry's device list (its dict's parent), its record */
  ms_snap_trace_t at_frames; /* made here: the record as SETITEMS has it at the frames */
  ms_snap_trace_extra_t x;   /* the extra fields, set once */
  bool extra;                /* an extra field was named */
  unsigned named;            /* the extra fields named (1 << K_*) */
} en_found_t;

_Static_assert(K_ACTION < 32 && K_COMPILE_CONTEXT < 32 && K_USER_METADATA < 32 && K_CATEGORY < 32,
               "en_found_t.named holds the extra fields' keys as bits");

/* A string value at k->pos met for the first time, stored under key, and its optional put: an
 * event. false: not this loop's. */
MS_ALWAYS_INLINE bool en_new_str(en_scan_t *k, en_found_t *f, uint8_t key) {
  if (f->nev == EN_MAX_EVENTS || k->lim - k->pos < 2 || k->buf[k->pos] != 0x8c) return false;
  size_t n = k->buf[k->pos + 1], at = k->pos + 2;
  if (k->lim - at < n || at > UINT32_MAX ||
      ms__pickle_text_valid(k->buf + at, n, false) < n)
    return false;
  en_event_t *e = &f->ev[f->nev++];
  *e = (en_event_t){(uint32_t)at, (uint8_t)n, EN_STR, key, false, 0};
  k->pos = at + n;
  if (!en_put(k, k->nmemo + f->nput, &e->put)) return false;
  f->nput += e->put;
  return true;
}

/* The frames as a memo get of a list made before (PyTorch's free names its alloc's list): one
 * sealed or queued for interning, or one freed and kept in the memo (pickle_retire.c), made again
 * when applied. Its stack must not have been left out unless this entry's is too (else the
 * general path's message). */
MS_NOINLINE static bool en_frames_get(rd_t *r, en_scan_t *k, const ms_snap_trace_t *t,
                                      en_found_t *f) {
  size_t at = k->pos;
  uint32_t idx = at > UINT32_MAX ? EN_NO_GET : en_get_idx(k);
  if (idx == EN_NO_GET) return false;
  uint8_t tag = k->tag[idx];
  bool dropped;
  if (tag == V_OBJ) {
    const rd_obj_t *l = &r->objs.ptr[r->memo_obj.ptr[idx]];
    if (l->kind != O_LIST || l->role != R_FRAMES || !(l->flags & (OF_SEALED | OF_PENDING)))
      return false;
    dropped = (l->flags & OF_DROPPED) != 0;
  } else if (rd_tag_tframes(tag)) {
    dropped = (tag & RD_TF_LIST_DROPPED) != 0;
  } else {
    return false;
  }
  /* decided on the record as SETITEMS has it then: in its place, since a window of the trace
   * finds an entry's index from its record's address (pickle_drop.c), and put back after */
  ms_snap_trace_t *rt = &r->b.trace.ptr[f->rec], born = *rt;
  *rt = *t;
  f->drop = rd_drops(r, t->action) || ms__pickle_drop_free(r, rt, f->list);
  *rt = born;
  if (dropped && !f->drop) return false;
  f->ev[f->nev++] = (en_event_t){idx, 0, EN_GET, K_FRAMES, false, (uint32_t)at};
  f->frames = f->got = true;
  return true;
}

/* The entry's pairs up to SETITEMS into t (a copy of its record) and f. false: not this loop's. */
static bool en_scan(rd_t *r, en_scan_t *k, ms_snap_trace_t *t, en_found_t *f) {
  size_t items = 0, deepest = 0; /* values above the dict; the most while the general path reads */
  for (;;) {
    if (k->lim - k->pos < 1) return false;
    if (k->buf[k->pos] == 'u') break; /* SETITEMS */
    uint32_t idx;
    if (en_get(k, &idx) != V_STR) return false; /* a key: a string met before */
    uint8_t key = k->memo[idx].key;
    rd_val_t v;
    items += 2;
    switch (key) {
    case K_ACTION:
    case K_COMPILE_CONTEXT:
    case K_USER_METADATA:
    case K_CATEGORY: {
      /* named twice: the general path (the later one wins there, whichever way it came) */
      if (f->named & (1u << key)) return false;
      f->named |= 1u << key;
      f->extra = true;
      const char *s = NULL;
      if (en_get(k, &idx) == V_STR) {
        s = k->memo[idx].v.s;
      } else if (key == K_ACTION || !en_new_str(k, f, key)) {
        return false; /* (an action's first name: its action is parsed from the stored text) */
      }
      if (key == K_ACTION) {
        if (f->frames) return false; /* its frames may have been left out for another action */
        f->x.action_name = s;
        t->action = ms__pickle_action(r, s);
        if (t->action != MS_TRACE_OTHER) f->x.action_name = NULL;
      } else if (key == K_COMPILE_CONTEXT) {
        t->present |= MS_TRACE_HAS_COMPILE_CONTEXT;
        f->x.compile_context = s;
      } else if (key == K_USER_METADATA) {
        t->present |= MS_TRACE_HAS_USER_METADATA;
        f->x.user_metadata = s;
      } else {
        t->present |= MS_TRACE_HAS_CATEGORY;
        f->x.category = s;
      }
      break;
    }
    case K_ADDR:
    case K_DEVICE_FREE:
    case K_SIZE:
    case K_STREAM:
    case K_TIME_US: {
      if (!en_scalar(k, &v)) return false;
      bool neg = v.t == V_INT && v.v.i < 0;
      if (v.t != V_INT && (v.t != V_UINT || key == K_TIME_US)) return false;
      if (neg && key != K_STREAM && key != K_TIME_US) return false;
      if (key == K_SIZE) {
        t->size = v.v.u; /* an int >= 0 or a V_UINT: the same bits */
      } else if (key == K_STREAM) {
        t->present |= MS_TRACE_HAS_STREAM;
        if (f->x.stream != v.v.u) {
          f->x.stream = v.v.u;
          f->extra = true;
        }
      } else if (key == K_TIME_US) {
        t->present |= MS_TRACE_HAS_TIME;
        t->time_us = v.v.i;
      } else {
        t->present &= (uint16_t)~MS_TRACE_NO_ADDR;
        t->addr = v.v.u;
      }
      break;
    }
    case K_FRAMES: { /* EMPTY_LIST, [put], MARK, gets, APPENDS; or a memo get of a list */
      if (f->frames || f->nev == EN_MAX_EVENTS || k->lim - k->pos < 1) return false;
      if (k->buf[k->pos] != ']') {
        if (!en_frames_get(r, k, t, f)) return false;
        break;
      }
      k->pos++;
      en_event_t *e = &f->ev[f->nev++];
      *e = (en_event_t){0, 0, EN_LIST, K_FRAMES, false, 0};
      if (!en_put(k, k->nmemo + f->nput, &e->put)) return false;
      f->nput += e->put;
      if (k->lim - k->pos < 2 || k->buf[k->pos] != '(') return false;
      int op = k->buf[k->pos + 1];
      size_t n = 0, end = 0;
      if ((op != 'h' && op != 'j') || !ms__pickle_frame_gets(r, k->pos + 2, op, 0, &n, &end))
        return false;
      f->frames_off = r->base + k->pos + 1;
      k->pos = end;
      f->frames = true;
      f->nframes = (uint32_t)n;
      f->at_frames = *t;
      if (items + n > deepest) deepest = items + n; /* the key, the list, its gets */
      break;
    }
    case K_POOL_ID: return false; /* a tuple */
    default: /* ignored, as rd_set_trace ignores it */
      if (!en_scalar(k, &v) && !en_new_str(k, f, key)) return false;
      break;
    }
    if (k->pos > k->lim) return false; /* a value's bytes reach past lim */
  }
  if (items > deepest) deepest = items;
  /* the general path fails on a stack this deep, or with this many marks */
  return deepest < RD_MAX_STACK - r->st.len && r->marks.len + 2 <= RD_MAX_STACK;
}

/* Step 1: the opcodes' effects, in the file's order: the dict's put; the strings stored, the
 * frames list made (as ms__pickle_create makes it under its key), their puts; the list's gets
 * counted. */
static int en_apply_ops(rd_t *r, uint32_t did, en_found_t *f, size_t dict_put_at, uint32_t *lid) {
  if (f->dict_put) {
    r->op_off = r->base + dict_put_at;
    rd_val_t dv = rd_obj_val(did);
    MS_FORWARD_IF_ERROR(rd_memo_store(r, r->memo.len, &dv));
  }
  for (size_t i = 0; i < f->nev; i++) {
    const en_event_t *e = &f->ev[i];
    rd_val_t v;
    if (e->kind == EN_STR) {
      r->op_off = r->base + e->at - 2;
      MS_FORWARD_IF_ERROR(ms__pickle_str_value(r, (const char *)r->buf + e->at, e->len, &v));
      if (e->field == K_COMPILE_CONTEXT) f->x.compile_context = v.v.s;
      else if (e->field == K_USER_METADATA) f->x.user_metadata = v.v.s;
      else if (e->field == K_CATEGORY) f->x.category = v.v.s;
      r->op_off = r->base + e->at + e->len;
    } else if (e->kind == EN_GET) { /* its memo get: a freed list made again */
      r->op_off = r->base + e->off;
      if (rd_tag_tframes(r->memo_tag.ptr[e->at])) MS_FORWARD_IF_ERROR(ms__pickle_revive(r, e->at));
      *lid = r->memo_obj.ptr[e->at];
      continue;
    } else {
      MS_FORWARD_IF_ERROR(ms__pickle_new_obj(r, O_LIST, lid));
      rd_obj_t *l = &r->objs.ptr[*lid];
      l->parent = did;
      l->key = K_FRAMES;
      l->idx = 0;
      l->role = R_FRAMES;
      ms__pickle_child_born(r, did);
      v = rd_obj_val(*lid);
    }
    if (e->put) MS_FORWARD_IF_ERROR(rd_memo_store(r, r->memo.len, &v));
  }
  if (f->frames && !f->got) { /* its gets, as ms__pickle_frames_run leaves them */
    r->fbuf_owner = *lid;
    r->fbuf_len = f->nframes;
    r->objs.ptr[*lid].count = f->nframes;
  }
  return MS_OK;
}

/* Step 2: SETITEMS (rd_set_trace's effects for what the scan let through). */
static int en_apply_fields(rd_t *r, uint32_t did, uint32_t lid, const ms_snap_trace_t *fields,
                           en_found_t *f) {
  uint32_t rec = r->objs.ptr[did].ref;
  ms_snap_trace_t *t = &r->b.trace.ptr[rec];
  const ms_snap_trace_extra_t *born = t->extra;
  if (f->got) { /* a list made before: its stack (rd_frames_stack_ex) */
    rd_obj_t *l = &r->objs.ptr[lid];
    l->flags |= OF_USED;
    uint32_t st = MS_SNAP_NO_STACK;
    if (!(l->flags & OF_DROPPED)) {
      if (r->npend) MS_FORWARD_IF_ERROR(ms__pickle_flush(r));
      st = r->objs.ptr[lid].ref;
    }
    ms__pickle_frames_stored(r, did, lid);
    if (f->drop && st == MS_SNAP_NO_STACK) r->objs.ptr[did].flags |= OF_DROPPED;
    t = &r->b.trace.ptr[rec];
    t->stack = st;
  } else if (f->frames) { /* the list just filled: its stack interned a little later */
    *t = f->at_frames;
    bool drop = rd_drops(r, t->action) || ms__pickle_drop_free(r, t, r->objs.ptr[did].parent);
    /* MS_LOAD_DEFER_STACKS: an alloc's stack is read later from the file (the list is left out
     * as a dropped one is, so that a place that needs its stack now reads the file again in
     * full; the entry's own stack is not left out) */
    bool later = !drop && r->defer && t->action == MS_TRACE_ALLOC &&
                 ms__pickle_defer_note(r, rec, f->frames_off);
    if (later && r->watch) { /* its frames, at the tail, shown before they are dropped */
      uint32_t *tail = NULL;
      int rc = rd_tail(r, r->fbuf_len, 0, &tail);
      if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
      r->watch(r->watch_ctx, rec, tail, (uint32_t)r->fbuf_len, r->b.frames.ptr, r->b.frames.len);
    }
    r->objs.ptr[lid].flags |= OF_USED;
    ms__pickle_frames_stored(r, did, lid);
    if (!drop && !later) {
      MS_FORWARD_IF_ERROR(ms__pickle_defer_frames(r, lid, rec));
    } else { /* MS_LOAD_NO_*_STACKS: its frame indices, last at the tail, are dropped */
      r->fbuf_owner = RD_NO_OBJ;
      r->fbuf_len = 0;
      r->objs.ptr[lid].flags |= OF_SEALED | OF_DROPPED;
      r->objs.ptr[lid].ref = MS_SNAP_NO_STACK;
      if (!later) r->objs.ptr[did].flags |= OF_DROPPED;
    }
    t = &r->b.trace.ptr[rec];
  }
  uint32_t stack = t->stack;
  *t = *fields;
  t->stack = stack;
  t->extra = born;
  if (f->frames) t->present |= MS_TRACE_HAS_FRAMES;
  if (f->extra) MS_FORWARD_IF_ERROR(ms__pickle_trace_extra(r, t, &f->x));
  return ms__pickle_entry_done(r, did);
}

/* The entry dict did, just created and pushed, read whole when it can be (*taken). born_extra:
 * its record's extra fields are still those of a record just born (ms__pickle_birth's, not set
 * yet: the caller sets them when the entry is not taken). */
MS_HOT_ALIGN static int en_entry(rd_t *r, uint32_t did, bool born_extra, bool *taken) {
  *taken = false;
  if (r->memo_holes || r->fbuf_owner != RD_NO_OBJ) return MS_OK;
  en_scan_t k = {(const unsigned char *)r->buf, r->pos, r->lim, r->memo_tag.ptr, r->memo.ptr,
                 r->memo.len};
  const ms_snap_trace_t *born = &r->b.trace.ptr[r->objs.ptr[did].ref];
  ms_snap_trace_t t = *born;
  en_found_t f;
  f.frames = f.got = f.drop = false;
  f.extra = born_extra;
  f.list = r->objs.ptr[did].parent;
  f.rec = r->objs.ptr[did].ref;
  f.nframes = 0;
  f.nev = 0;
  f.named = 0;
  f.x = born_extra ? en_born_extra() : ms__trace_extra_of(born);
  size_t dict_put_at = k.pos;
  if (!en_put(&k, k.nmemo, &f.dict_put)) return MS_OK;
  f.nput = f.dict_put;
  if (k.lim - k.pos < 1 || k.buf[k.pos] != '(') return MS_OK; /* an empty dict */
  k.pos++;
  if (!en_scan(r, &k, &t, &f)) return MS_OK;
  size_t puts = f.nput;
  if (puts && (MS_BIGVEC_RESERVE(&r->memo, puts) || MS_BIGVEC_RESERVE(&r->memo_obj, puts) ||
               MS_BIGVEC_RESERVE(&r->memo_tag, puts)))
    return MS_OK; /* out of memory: the general path says so */
  *taken = true;
  uint32_t lid = RD_NO_OBJ;
  size_t setitems_at = k.pos;
  MS_FORWARD_IF_ERROR(en_apply_ops(r, did, &f, dict_put_at, &lid));
  r->op_off = r->base + setitems_at;
  MS_FORWARD_IF_ERROR(en_apply_fields(r, did, lid, &t, &f));
  r->pos = setitems_at + 1;
  r->whole++;
  return MS_OK;
}

int ms__pickle_entry(rd_t *r, uint32_t did) {
  bool taken;
  return en_entry(r, did, false, &taken);
}

int ms__pickle_entry_dict(rd_t *r, bool *done) {
  *done = false;
  if (!ms__pickle_fast || r->skip_trace || r->marks.len == 0) return MS_OK;
  /* rd_place's answer for this shape, found without it: in a batch of a device's list of
   * entries (the value below the topmost mark), nothing above the mark but entries (dicts), so
   * nothing makes the new dict a one-at-a-time item of another container */
  size_t n = r->st.len, m = rd_mark_pos(r);
  if (m == 0 || r->st.ptr[m - 1].t != V_OBJ) return MS_OK;
  uint32_t lid = r->st.ptr[m - 1].v.obj;
  const rd_obj_t *l = &r->objs.ptr[lid];
  if (l->kind != O_LIST || l->role != R_TRACES) return MS_OK;
  if (n > m) {
    const rd_val_t *top = &r->st.ptr[n - 1];
    if (top->t != V_OBJ || r->objs.ptr[top->v.obj].kind != O_DICT) return MS_OK;
  }
  uint32_t idx = l->count + (uint32_t)(n - m), did = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(ms__pickle_new_obj(r, O_DICT, &did));
  rd_obj_t *o = &r->objs.ptr[did];
  o->parent = lid;
  o->key = K_UNKNOWN;
  o->idx = idx;
  o->role = R_TRACE;
  ms__pickle_child_born(r, lid);
  /* ms__pickle_birth's record, its extra fields set once with the entry's own (or below) */
  ms_snap_trace_t t = {0};
  t.action = MS_TRACE_OTHER;
  t.stack = MS_SNAP_NO_STACK;
  t.present = MS_TRACE_NO_ADDR;
  r->objs.ptr[did].ref = (uint32_t)r->b.trace.len;
  int rc = ms__snapbuild_add_trace(&r->b, &t);
  if (rc == MS_ENOMEM) return ms__pickle_err(r, rc, "out of memory");
  if (rc != MS_OK) return ms__pickle_err(r, rc, "too many records");
  MS_FORWARD_IF_ERROR(rd_push(r, rd_obj_val(did)));
  *done = true;
  bool taken;
  uint64_t op_off = r->op_off;
  MS_FORWARD_IF_ERROR(en_entry(r, did, true, &taken));
  if (taken) return MS_OK;
  r->op_off = op_off;
  ms_snap_trace_extra_t x = en_born_extra();
  rc = ms__snapbuild_trace_extra(&r->b, &r->b.trace.ptr[r->objs.ptr[did].ref], &x);
  if (rc == MS_ENOMEM) return ms__pickle_err(r, rc, "out of memory");
  if (rc != MS_OK) return ms__pickle_err(r, rc, "too many records");
  return MS_OK;
}
