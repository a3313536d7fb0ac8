/* SPDX-License-Identifier: MIT
 * memsnap core: PyTorch's snapshot schema mapped onto memsnap's model, for the reader of snapshot
 * pickles (memsnap/pickle.h, issue #4; the reader's files and vocabulary: pickle_internal.h).
 *
 * A dict of a record role (a segment, a block, a history entry, a trace entry, an annotation) is
 * a record in the snapshot builder from birth; the items stored into it (SETITEMS) are converted
 * straight into the record's typed fields, one setter per role. Lists of records check that
 * their records are consecutive in the builder. A "frames" list accumulates interned frame
 * indices and becomes an interned stack when it is first used; memo gets of the same frame dict
 * or frame list (PyTorch shares them through the memo) give back the same frame or stack index in
 * O(1). allocator_settings become the model's settings, one level of maps deep.
 *
 * The role guessed when a container was created (pickle_objects.c) is verified when it is
 * stored into its real parent: a container in a place the schema does not know is skipped (its
 * values are still parsed, safely); one whose guessed role does not match its real place is an
 * error, never a silent misreading. After STOP, the records must tile their arrays; totals that
 * older files lack are filled from the blocks.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "snapshot/pickle_internal.h"

/* ---- records born with their dicts ----------------------------------------------------------- */

/* Creates the builder record that a dict of a record role stands for. */
int ms__pickle_birth(rd_t *r, uint32_t id) {
  rd_obj_t *o = &r->objs.ptr[id];
  ms__snapbuild_t *b = &r->b;
  int rc = MS_OK;
  switch (o->role) {
  case R_SEGMENT: {
    ms_snap_segment_t s = {0};
    s.stack = MS_SNAP_NO_STACK;
    s.is_large = true;
    o->ref = (uint32_t)b->segments.len;
    rc = ms__snapbuild_add_segment(b, &s);
    break;
  }
  case R_BLOCK: {
    ms_snap_block_t k = {0};
    k.stack = MS_SNAP_NO_STACK;
    k.state = MS_BLOCK_STATE_OTHER;
    k.state_name = "";
    o->ref = (uint32_t)b->blocks.len;
    rc = ms__snapbuild_add_block(b, &k);
    break;
  }
  case R_HIST: {
    ms_snap_history_t h = {0, 0, MS_SNAP_NO_STACK, 0};
    o->ref = (uint32_t)b->history.len;
    rc = ms__snapbuild_add_history(b, &h);
    break;
  }
  case R_TRACE: {
    ms_snap_trace_t t = {0};
    t.action = MS_TRACE_OTHER; /* named "" until its "action" comes */
    t.stack = MS_SNAP_NO_STACK;
    t.present = MS_TRACE_NO_ADDR; /* until its "addr" or "device_free" comes */
    ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
    x.action_name = "";
    rc = ms__snapbuild_trace_extra(b, &t, &x);
    o->ref = (uint32_t)b->trace.len;
    if (rc == MS_OK) rc = ms__snapbuild_add_trace(b, &t);
    break;
  }
  case R_ANNOT: {
    ms_snap_annotation_t a = {"", "", 0, 0};
    o->ref = (uint32_t)b->annotations.len;
    rc = ms__snapbuild_add_annotation(b, &a);
    break;
  }
  case R_FRAME: {
    uint32_t slot = r->pframe_free;
    if (slot != RD_NO_OBJ) {
      r->pframe_free = r->pframes.ptr[slot].next_free;
    } else {
      if (MS_VEC_RESERVE(&r->pframes, 1)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
      slot = (uint32_t)r->pframes.len++;
    }
    r->pframes.ptr[slot] = (rd_pframe_t){"", "", 0, RD_NO_OBJ};
    o->ref = slot;
    break;
  }
  default:
    break;
  }
  if (rc == MS_ENOMEM) return ms__pickle_err(r, rc, "out of memory");
  if (rc != MS_OK) return ms__pickle_err(r, rc, "too many records");
  return MS_OK;
}

/* ---- frames and stacks ----------------------------------------------------------------------- */

static int rd_intern_frame(rd_t *r, uint32_t id, uint32_t *frame) {
  rd_obj_t *o = &r->objs.ptr[id];
  if (!(o->flags & OF_INTERNED)) {
    rd_pframe_t *pf = &r->pframes.ptr[o->ref];
    uint32_t f = 0;
    int rc = ms__snapbuild_frame_owned(&r->b, pf->name, pf->file, pf->line, &f);
    if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a frame: %s", ms_strerror(rc));
    pf->next_free = r->pframe_free;
    r->pframe_free = o->ref;
    o->ref = f;
    o->flags |= OF_INTERNED;
  }
  *frame = o->ref;
  return MS_OK;
}


/* Interns the queued lists' stacks, in order, into their lists and trace records; the indices of
 * the list being filled, after theirs at the tail, then move to its start. */
int ms__pickle_flush(rd_t *r) {
  ms__snapbuild_t *b = &r->b;
  size_t at = 0;
  for (uint32_t i = 0; i < r->npend; i++) {
    const rd_pend_t *p = &r->pend[i];
    uint32_t st = 0;
    int rc = ms__snapbuild_stack_tail_at(b, at, p->n, p->hash, &st);
    if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
    at += p->n;
    rd_obj_t *o = &r->objs.ptr[p->list];
    o->ref = st;
    o->flags = (uint8_t)((o->flags & ~OF_PENDING) | OF_SEALED);
    b->trace.ptr[p->rec].stack = st;
  }
  uint32_t *tail = b->stack_frames.ptr;
  if (at && r->fbuf_len) memmove(tail, tail + at, r->fbuf_len * sizeof *tail);
  r->npend = 0;
  r->pend_frames = 0;
  return MS_OK;
}

/* pickle_internal.h */
int ms__pickle_defer_frames(rd_t *r, uint32_t id, uint32_t rec) {
  if (r->npend == RD_PENDING) MS_FORWARD_IF_ERROR(ms__pickle_flush(r));
  uint32_t *tail = NULL;
  int rc = rd_tail(r, r->fbuf_len, 0, &tail);
  if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
  uint64_t h = ms__snapbuild_stack_hash(tail, r->fbuf_len);
  ms__snapbuild_stack_prefetch(&r->b, h);
  r->pend[r->npend++] = (rd_pend_t){id, rec, (uint32_t)r->fbuf_len, h};
  r->pend_frames += r->fbuf_len;
  r->fbuf_owner = RD_NO_OBJ;
  r->fbuf_len = 0;
  r->objs.ptr[id].flags |= OF_PENDING;
  return MS_OK;
}

/* Turns a frames list into its interned stack (once). */
static int rd_seal_frames(rd_t *r, uint32_t id) {
  /* the tail holds only the current list after this */
  if (r->npend) MS_FORWARD_IF_ERROR(ms__pickle_flush(r));
  rd_obj_t *o = &r->objs.ptr[id];
  if (o->flags & OF_SEALED) return MS_OK;
  uint32_t st = 0;
  /* An empty list's stack leaves the frames being gathered for another list in place. */
  int rc = r->fbuf_owner == id ? ms__snapbuild_stack_tail(&r->b, r->fbuf_len, &st)
                               : ms__snapbuild_stack(&r->b, NULL, 0, &st);
  if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
  if (r->fbuf_owner == id) {
    r->fbuf_owner = RD_NO_OBJ;
    r->fbuf_len = 0;
  }
  o = &r->objs.ptr[id];
  o->ref = st;
  o->flags |= OF_SEALED;
  return MS_OK;
}

/* ---- typed field conversion ------------------------------------------------------------------ */

typedef struct rd_ctx_s {
  uint32_t obj;       /* the container being filled */
  const rd_val_t *k;  /* key (dicts) */
  uint32_t idx;       /* index (lists) */
} rd_ctx_t;

static int rd_type_err(rd_t *r, const rd_ctx_t *c, const char *want, const rd_val_t *v) {
  char p[300];
  if (c->k) {
    ms__pickle_field_path(r, c->obj, c->k, p, sizeof p);
  } else {
    char q[260];
    ms__pickle_path(r, c->obj, q, sizeof q);
    snprintf(p, sizeof p, "%s[%" PRIu32 "]", c->obj == r->root ? "" : q, c->idx);
  }
  return ms__pickle_err(r, MS_EFORMAT, "%s: expected %s, got %s", p, want,
                        ms__pickle_type_name(r, v));
}

/* An int of the right type whose value does not fit: "out of range", not a type mismatch. */
static int rd_range_err(rd_t *r, const rd_ctx_t *c, const char *want) {
  char p[300];
  if (c->k) {
    ms__pickle_field_path(r, c->obj, c->k, p, sizeof p);
  } else {
    char q[260];
    ms__pickle_path(r, c->obj, q, sizeof q);
    snprintf(p, sizeof p, "%s[%" PRIu32 "]", c->obj == r->root ? "" : q, c->idx);
  }
  return ms__pickle_err(r, MS_EFORMAT, "%s: int out of range: expected %s", p, want);
}

static int rd_want_i64(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, int64_t *out) {
  if (v->t == V_INT) {
    *out = v->v.i;
    return MS_OK;
  }
  if (v->t == V_UINT || v->t == V_BIG) return rd_range_err(r, c, "a 64-bit signed int");
  return rd_type_err(r, c, "int", v);
}

static int rd_want_u64(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint64_t *out) {
  if (v->t == V_INT && v->v.i >= 0) {
    *out = (uint64_t)v->v.i;
    return MS_OK;
  }
  if (v->t == V_UINT) {
    *out = v->v.u;
    return MS_OK;
  }
  if (v->t == V_INT || v->t == V_BIG) return rd_range_err(r, c, "an int in [0, 2^64)");
  return rd_type_err(r, c, "int", v);
}

/* Stream handles are raw pointers; a negative value is kept as its two's complement. */
static int rd_want_u64_wrap(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint64_t *out) {
  if (v->t == V_INT) {
    *out = (uint64_t)v->v.i;
    return MS_OK;
  }
  return rd_want_u64(r, c, v, out);
}

static int rd_want_str(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, const char **out) {
  if (v->t != V_STR) return rd_type_err(r, c, "str", v);
  *out = v->v.s;
  return MS_OK;
}

static int rd_want_bool(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, bool *out) {
  if (v->t != V_BOOL) return rd_type_err(r, c, "bool", v);
  *out = v->v.i != 0;
  return MS_OK;
}

/* A value of the skipped trace is needed elsewhere (a file that shares, through the memo, a
 * container of device_traces with a later part): the caller must read the file again without
 * skipping. */
static int rd_cannot_skip(rd_t *r, const rd_ctx_t *c) {
  char p[300];
  if (c->k)
    ms__pickle_field_path(r, c->obj, c->k, p, sizeof p);
  else
    snprintf(p, sizeof p, "element %" PRIu32, c->idx);
  r->cannot_skip = true;
  return ms__pickle_err(r, MS_EUNSUPPORTED,
                        "%s: uses a value of device_traces, so the trace cannot be skipped", p);
}

static int rd_want_pair(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, int64_t out[2]) {
  if (v->t != V_PAIR) return rd_type_err(r, c, "a tuple of two ints", v);
  out[0] = r->pairs.ptr[2 * (size_t)v->v.pair];
  out[1] = r->pairs.ptr[2 * (size_t)v->v.pair + 1];
  return MS_OK;
}

/* A child container stored at c: checks it is the container of role `want` built for this place.
 * want == R_NONE: not part of the schema, ignored (*id = RD_NO_OBJ). */
static int rd_want_obj(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint8_t want, uint32_t *id) {
  *id = RD_NO_OBJ;
  if (want == R_NONE) return MS_OK;
  if (v->t == V_SKIP) return rd_cannot_skip(r, c);
  uint8_t kind = rd_role_kind[want];
  if (v->t != V_OBJ || r->objs.ptr[v->v.obj].kind != kind)
    return rd_type_err(r, c, kind == O_DICT ? "dict" : "list", v);
  rd_obj_t *o = &r->objs.ptr[v->v.obj];
  if (o->role != want) {
    char p[300];
    if (c->k)
      ms__pickle_field_path(r, c->obj, c->k, p, sizeof p);
    else
      snprintf(p, sizeof p, "element %" PRIu32, c->idx);
    return ms__pickle_err(r, MS_EFORMAT,
                          "%s: unexpected pickle structure (this %s was built for another place)",
                          p, kind == O_DICT ? "dict" : "list");
  }
  bool shareable = want == R_FRAMES || want == R_FRAME || want == R_TRACES;
  if ((o->flags & OF_USED) && !shareable) {
    char p[300];
    ms__pickle_path(r, v->v.obj, p, sizeof p);
    return ms__pickle_err(r, MS_EFORMAT,
                          "%s: the same %s is stored twice (shared through the memo)", p,
                          kind == O_DICT ? "dict" : "list");
  }
  o->flags |= OF_USED;
  *id = v->v.obj;
  return MS_OK;
}

/* MS_LOAD_NO_TRACE_STACKS, MS_LOAD_NO_FREE_STACKS: a stack that was left out is needed (a frames
 * list shared through the memo with a place that keeps its stack, an entry named a kept action
 * after its frames, a free no longer paired when it is complete): the caller must read the file
 * again in full. */
static int rd_cannot_drop(rd_t *r, const rd_ctx_t *c) {
  char p[300];
  if (c->k)
    ms__pickle_field_path(r, c->obj, c->k, p, sizeof p);
  else if (r->objs.ptr[c->obj].kind == O_DICT)
    ms__pickle_path(r, c->obj, p, sizeof p);
  else
    snprintf(p, sizeof p, "element %" PRIu32, c->idx);
  r->cannot_skip = true;
  return ms__pickle_err(r, MS_EUNSUPPORTED,
                        "%s: needs a stack that was left out, so the trace's stacks cannot be "
                        "skipped",
                        p);
}

/* The interned stack of a frames list; with `may_drop`, MS_SNAP_NO_STACK for a list whose stack
 * was left out (MS_LOAD_NO_*_STACKS), which is an error anywhere else. */
static int rd_frames_stack_ex(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, bool may_drop,
                              uint32_t *stack) {
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_FRAMES, &id));
  if (r->objs.ptr[id].flags & OF_DROPPED) {
    if (!may_drop) return rd_cannot_drop(r, c);
    *stack = MS_SNAP_NO_STACK;
    return MS_OK;
  }
  MS_FORWARD_IF_ERROR(rd_seal_frames(r, id));
  *stack = r->objs.ptr[id].ref;
  return MS_OK;
}

static int rd_frames_stack(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, uint32_t *stack) {
  return rd_frames_stack_ex(r, c, v, false, stack);
}

/* A record list (segments, blocks, ...): its records must be consecutive in the builder. */
static int rd_list_record(rd_t *r, rd_obj_t *list, uint32_t list_id, uint32_t rec, size_t nrecs) {
  (void)nrecs;
  if (list->count == 0) {
    list->ref = rec;
  } else if (rec != list->ref + list->count) {
    char p[260];
    ms__pickle_path(r, list_id, p, sizeof p);
    return ms__pickle_err(r, MS_EFORMAT,
                          "%s[%" PRIu32 "]: unexpected pickle structure (out of order)", p,
                          list->count);
  }
  return MS_OK;
}

/* ---- lists ----------------------------------------------------------------------------------- */

static int rd_modified_after_use(rd_t *r, uint32_t id) {
  char p[260];
  ms__pickle_path(r, id, p, sizeof p);
  return ms__pickle_err(r, MS_EFORMAT, "%s: modified after it was used (shared through the memo)",
                        p);
}

/* list[len] = v */
static int rd_list_append(rd_t *r, uint32_t lid, const rd_val_t *v) {
  rd_obj_t *l = &r->objs.ptr[lid];
  rd_ctx_t c = {lid, NULL, l->count};
  uint8_t want = rd_list_child(l->role);
  if (l->role != R_NONE && (l->flags & (OF_USED | OF_SEALED))) return rd_modified_after_use(r, lid);
  if (v->t == V_SKIP && l->role == R_TRACES && v->kind == O_DICT) { /* a skipped entry */
    if (l->count == UINT32_MAX) return ms__pickle_err(r, MS_ELIMIT, "list longer than 2^32 items");
    l->count++;
    return MS_OK;
  }
  uint32_t id = RD_NO_OBJ;
  if (want != R_NONE) MS_FORWARD_IF_ERROR(rd_want_obj(r, &c, v, want, &id));
  l = &r->objs.ptr[lid];
  switch (l->role) {
  case R_FRAMES: {
    uint32_t f = 0;
    MS_FORWARD_IF_ERROR(rd_intern_frame(r, id, &f));
    if (r->fbuf_owner != lid) {
      if (r->fbuf_owner != RD_NO_OBJ) MS_FORWARD_IF_ERROR(rd_seal_frames(r, r->fbuf_owner));
      r->fbuf_owner = lid;
      r->fbuf_len = 0;
    }
    uint32_t *tail = NULL;
    int rc = rd_tail(r, r->fbuf_len, 1, &tail);
    if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a stack: %s", ms_strerror(rc));
    tail[r->fbuf_len++] = f;
    break;
  }
  case R_SEGMENTS:
  case R_BLOCKS:
  case R_HISTORY:
  case R_TRACES:
  case R_ANNOTS:
    MS_FORWARD_IF_ERROR(rd_list_record(r, l, lid, r->objs.ptr[id].ref, 0));
    if (l->role == R_TRACES && l->count == 0) MS_FORWARD_IF_ERROR(ms__pickle_trace_list(r, lid));
    if (l->role == R_TRACES && r->drop_free) {
      rd_obj_t *o = &r->objs.ptr[id];
      int rc = MS_OK;
      if (!(o->flags & OF_ACCOUNTED)) {
        o->flags |= OF_ACCOUNTED;
        rc = ms__pickle_drop_account(r, o->ref, lid, (o->flags & OF_DROPPED) != 0);
      } else if (o->parent != lid) {
        rc = MS_EUNSUPPORTED; /* accounted for another list */
      }
      if (rc == MS_EUNSUPPORTED) return rd_cannot_drop(r, &c);
      if (rc != MS_OK) return ms__pickle_err(r, rc, "out of memory");
    }
    break;
  case R_DEVTRACES: {
    const rd_obj_t *t = &r->objs.ptr[id];
    ms_snap_device_t d = {0};
    d.ntrace = r->skip_trace ? 0 : t->count; /* skipped entries are not kept */
    d.first_trace = d.ntrace ? t->ref : UINT32_MAX; /* empty: placed in rd_finish */
    int rc = ms__snapbuild_add_device(&r->b, &d);
    if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a device: %s", ms_strerror(rc));
    break;
  }
  default:
    break;
  }
  l = &r->objs.ptr[lid];
  if (l->count == UINT32_MAX) return ms__pickle_err(r, MS_ELIMIT, "list longer than 2^32 items");
  l->count++;
  return MS_OK;
}

/* APPENDS / APPEND / LIST: items st[from..len) into list lid. */
int ms__pickle_appends(rd_t *r, uint32_t lid, size_t from) {
  size_t start = from;
  if (lid == RD_NO_OBJ) { /* a skipped list */
    r->st.len = from;
    return MS_OK;
  }
  from = ms__pickle_appends_frames_fast(r, lid, from);
  rd_obj_t *l = &r->objs.ptr[lid];
  if (l->role == R_TRACES && !(l->flags & (OF_USED | OF_SEALED))) {
    /* a batch of a skipped trace's entries: counted, as rd_list_append counts each one */
    size_t i = from;
    while (i < r->st.len && r->st.ptr[i].t == V_SKIP && r->st.ptr[i].kind == O_DICT) i++;
    if ((uint64_t)l->count + (i - from) <= UINT32_MAX) {
      l->count += (uint32_t)(i - from);
      from = i;
    }
    /* a batch of kept entries, each the record after the list's last one and accounted for
     * already (pickle_drop.c), as rd_list_append stores each one; anything else is its */
    for (; ms__pickle_fast && from < r->st.len && l->count && l->count < UINT32_MAX; from++) {
      const rd_val_t *v = &r->st.ptr[from];
      if (v->t != V_OBJ) break;
      rd_obj_t *o = &r->objs.ptr[v->v.obj];
      if (o->kind != O_DICT || o->role != R_TRACE || (o->flags & OF_USED) ||
          o->ref != l->ref + l->count)
        break;
      if (r->drop_free && (!(o->flags & OF_ACCOUNTED) || o->parent != lid)) break;
      o->flags |= OF_USED;
      l->count++;
    }
  }
  for (size_t i = from; i < r->st.len; i++) {
    rd_val_t v = r->st.ptr[i];
    MS_FORWARD_IF_ERROR(rd_list_append(r, lid, &v));
  }
  size_t end = r->st.len;
  r->st.len = start;
  if (r->objs.ptr[lid].role == R_TRACES) return ms__pickle_retire_entries(r, start, end);
  return MS_OK;
}

/* ---- dicts ----------------------------------------------------------------------------------- */

/* A setting's value in the model's terms; *keep = false for what the model has no place for. */
static int rd_setting_value(rd_t *r, const rd_ctx_t *c, const rd_val_t *v, ms_snap_kv_t *kv,
                            bool *keep) {
  *keep = true;
  switch (v->t) {
  case V_NONE: kv->kind = MS_SNAP_VAL_NONE; break;
  case V_BOOL: kv->kind = MS_SNAP_VAL_BOOL; kv->b = v->v.i != 0; break;
  case V_INT: kv->kind = MS_SNAP_VAL_INT; kv->i = v->v.i; break;
  case V_FLOAT: kv->kind = MS_SNAP_VAL_FLOAT; kv->f = v->v.f; break;
  case V_STR: kv->kind = MS_SNAP_VAL_STR; kv->s = v->v.s; break;
  case V_OBJ:
    if (r->objs.ptr[v->v.obj].kind == O_DICT) {
      uint32_t id = RD_NO_OBJ;
      MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_SETMAP, &id));
      if (r->objs.ptr[id].aux > RD_MAX_SETTINGS_DEPTH) {
        *keep = false; /* a map in a map: not in the model (PyTorch writes none) */
        break;
      }
      kv->kind = MS_SNAP_VAL_MAP;
      kv->first = r->objs.ptr[id].ref;
      kv->count = r->objs.ptr[id].count;
      break;
    }
    *keep = false; /* lists and sets have no place in the model */
    break;
  case V_SKIP:
    if (v->kind == O_DICT) return rd_cannot_skip(r, c);
    *keep = false;
    break;
  default:
    *keep = false; /* unsigned 64-bit, huge ints, bytes, tuples */
    break;
  }
  return MS_OK;
}

/* The top-level dict: its lists and the presence of the optional parts. */
static int rd_set_root(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  ms__snapbuild_t *b = &r->b;
  uint32_t id = RD_NO_OBJ;
  switch (key) {
  case K_SEGMENTS:
    MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_SEGMENTS, &id));
    r->root_segments = id;
    break;
  case K_DEVICE_TRACES:
    MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_DEVTRACES, &id));
    b->hdr.present |= MS_SNAP_HAS_DEVICE_TRACES;
    break;
  case K_ALLOCATOR_SETTINGS:
    MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_SETTINGS, &id));
    b->hdr.present |= MS_SNAP_HAS_SETTINGS;
    break;
  case K_EXTERNAL_ANNOTATIONS:
    MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_ANNOTS, &id));
    b->hdr.present |= MS_SNAP_HAS_ANNOTATIONS;
    break;
  default:
    break;
  }
  return MS_OK;
}

static int rd_set_segment(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  ms__snapbuild_t *b = &r->b;
  ms_snap_segment_t *s = &b->segments.ptr[r->objs.ptr[c->obj].ref];
  uint32_t id = RD_NO_OBJ;
  switch (key) {
  case K_DEVICE: return rd_want_i64(r, c, v, &s->device);
  case K_ADDRESS: return rd_want_u64(r, c, v, &s->address);
  case K_TOTAL_SIZE: return rd_want_u64(r, c, v, &s->total_size);
  case K_ALLOCATED_SIZE: return rd_want_u64(r, c, v, &s->allocated_size);
  case K_ACTIVE_SIZE: return rd_want_u64(r, c, v, &s->active_size);
  case K_REQUESTED_SIZE:
    s->present |= MS_SEG_HAS_REQUESTED_SIZE;
    return rd_want_u64(r, c, v, &s->requested_size);
  case K_STREAM: return rd_want_u64_wrap(r, c, v, &s->stream);
  case K_SEGMENT_TYPE: {
    const char *t = NULL;
    MS_FORWARD_IF_ERROR(rd_want_str(r, c, v, &t));
    s->is_large = strcmp(t, "small") != 0;
    s->present |= MS_SEG_HAS_SEGMENT_TYPE;
    return MS_OK;
  }
  case K_SEGMENT_POOL_ID:
    s->present |= MS_SEG_HAS_POOL_ID;
    return rd_want_pair(r, c, v, s->pool_id);
  case K_IS_EXPANDABLE:
    s->present |= MS_SEG_HAS_EXPANDABLE;
    return rd_want_bool(r, c, v, &s->is_expandable);
  case K_FRAMES: {
    uint32_t st = 0;
    MS_FORWARD_IF_ERROR(rd_frames_stack(r, c, v, &st));
    s = &b->segments.ptr[r->objs.ptr[c->obj].ref];
    s->stack = st;
    s->present |= MS_SEG_HAS_FRAMES;
    return MS_OK;
  }
  case K_BLOCKS: {
    MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_BLOCKS, &id));
    const rd_obj_t *l = &r->objs.ptr[id];
    s->first_block = l->count ? l->ref : UINT32_MAX;
    s->nblocks = l->count;
    return MS_OK;
  }
  default: return MS_OK;
  }
}

static int rd_set_block(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  ms__snapbuild_t *b = &r->b;
  ms_snap_block_t *k2 = &b->blocks.ptr[r->objs.ptr[c->obj].ref];
  uint32_t id = RD_NO_OBJ;
  switch (key) {
  case K_ADDRESS:
    k2->present |= MS_BLOCK_HAS_ADDRESS;
    return rd_want_u64(r, c, v, &k2->address);
  case K_SIZE: return rd_want_u64(r, c, v, &k2->size);
  case K_REQUESTED_SIZE:
    k2->present |= MS_BLOCK_HAS_REQUESTED_SIZE;
    return rd_want_u64(r, c, v, &k2->requested_size);
  case K_STATE:
    MS_FORWARD_IF_ERROR(rd_want_str(r, c, v, &k2->state_name));
    k2->state = ms_block_state_parse(k2->state_name);
    return MS_OK;
  case K_FRAMES: {
    uint32_t st = 0;
    MS_FORWARD_IF_ERROR(rd_frames_stack(r, c, v, &st));
    k2 = &b->blocks.ptr[r->objs.ptr[c->obj].ref];
    k2->stack = st;
    k2->present |= MS_BLOCK_HAS_FRAMES;
    return MS_OK;
  }
  case K_HISTORY: {
    MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_HISTORY, &id));
    const rd_obj_t *l = &r->objs.ptr[id];
    k2->first_history = l->count ? l->ref : UINT32_MAX;
    k2->nhistory = l->count;
    k2->present |= MS_BLOCK_HAS_HISTORY;
    return MS_OK;
  }
  default: return MS_OK;
  }
}

/* An entry of a block's history (PyTorch before 2.1). */
static int rd_set_hist(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  ms__snapbuild_t *b = &r->b;
  ms_snap_history_t *h = &b->history.ptr[r->objs.ptr[c->obj].ref];
  switch (key) {
  case K_ADDR: return rd_want_u64(r, c, v, &h->addr);
  case K_REAL_SIZE: return rd_want_u64(r, c, v, &h->real_size);
  case K_FRAMES: {
    uint32_t st = 0;
    MS_FORWARD_IF_ERROR(rd_frames_stack(r, c, v, &st));
    h = &b->history.ptr[r->objs.ptr[c->obj].ref];
    h->stack = st;
    h->present |= MS_HIST_HAS_FRAMES;
    return MS_OK;
  }
  default: return MS_OK;
  }
}

/* A frame dict, gathered in a pending frame until it is interned (first stored in a list). */
static int rd_set_frame(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  rd_pframe_t *pf = &r->pframes.ptr[r->objs.ptr[c->obj].ref];
  switch (key) {
  case K_NAME: return rd_want_str(r, c, v, &pf->name);
  case K_FILENAME: return rd_want_str(r, c, v, &pf->file);
  case K_LINE: return rd_want_i64(r, c, v, &pf->line);
  default: return MS_OK;
  }
}

/* pickle_internal.h */
int ms__pickle_trace_extra(rd_t *r, ms_snap_trace_t *t, const ms_snap_trace_extra_t *x) {
  int rc = ms__snapbuild_trace_extra(&r->b, t, x);
  return rc == MS_OK ? MS_OK : ms__pickle_err(r, rc, "cannot store a trace entry: %s",
                                              ms_strerror(rc));
}

/* pickle_internal.h */
uint8_t ms__pickle_action(rd_t *r, const char *s) {
  for (int i = 0; i < RD_ACT_CACHE; i++)
    if (r->act_str[i] == s && s) return r->act_val[i];
  uint8_t a = (uint8_t)ms_trace_action_parse(s);
  r->act_str[r->act_next] = s;
  r->act_val[r->act_next] = a;
  r->act_next = (uint8_t)((r->act_next + 1) % RD_ACT_CACHE);
  return a;
}

/* An entry of device_traces. */
static int rd_set_trace(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  ms__snapbuild_t *b = &r->b;
  ms_snap_trace_t *t = &b->trace.ptr[r->objs.ptr[c->obj].ref];
  uint32_t id = RD_NO_OBJ;
  ms_snap_trace_extra_t x;
  switch (key) {
  case K_ACTION: {
    x = ms__trace_extra_of(t);
    MS_FORWARD_IF_ERROR(rd_want_str(r, c, v, &x.action_name));
    uint8_t was = t->action;
    t->action = ms__pickle_action(r, x.action_name);
    /* named again after its frames were left out, now as an action that keeps them */
    if ((t->present & MS_TRACE_HAS_FRAMES) && t->stack == MS_SNAP_NO_STACK && rd_drops(r, was) &&
        !rd_drops(r, t->action))
      return rd_cannot_drop(r, c);
    /* a known action's name is its canonical one, which the builder does not keep */
    if (t->action != MS_TRACE_OTHER) x.action_name = NULL;
    return ms__pickle_trace_extra(r, t, &x);
  }
  case K_ADDR:
  case K_DEVICE_FREE:
    t->present &= (uint16_t)~MS_TRACE_NO_ADDR;
    return rd_want_u64(r, c, v, &t->addr);
  case K_SIZE: return rd_want_u64(r, c, v, &t->size);
  case K_STREAM:
    t->present |= MS_TRACE_HAS_STREAM;
    x = ms__trace_extra_of(t);
    MS_FORWARD_IF_ERROR(rd_want_u64_wrap(r, c, v, &x.stream));
    return ms__pickle_trace_extra(r, t, &x);
  case K_TIME_US:
    t->present |= MS_TRACE_HAS_TIME;
    return rd_want_i64(r, c, v, &t->time_us);
  case K_COMPILE_CONTEXT:
    t->present |= MS_TRACE_HAS_COMPILE_CONTEXT;
    x = ms__trace_extra_of(t);
    MS_FORWARD_IF_ERROR(rd_want_str(r, c, v, &x.compile_context));
    return ms__pickle_trace_extra(r, t, &x);
  case K_USER_METADATA:
    t->present |= MS_TRACE_HAS_USER_METADATA;
    x = ms__trace_extra_of(t);
    MS_FORWARD_IF_ERROR(rd_want_str(r, c, v, &x.user_metadata));
    return ms__pickle_trace_extra(r, t, &x);
  case K_CATEGORY:
    t->present |= MS_TRACE_HAS_CATEGORY;
    x = ms__trace_extra_of(t);
    MS_FORWARD_IF_ERROR(rd_want_str(r, c, v, &x.category));
    return ms__pickle_trace_extra(r, t, &x);
  case K_POOL_ID:
    t->present |= MS_TRACE_HAS_POOL_ID;
    x = ms__trace_extra_of(t);
    MS_FORWARD_IF_ERROR(rd_want_pair(r, c, v, x.pool_id));
    return ms__pickle_trace_extra(r, t, &x);
  case K_FRAMES: {
    uint32_t st = 0;
    bool drop =
        rd_drops(r, t->action) || ms__pickle_drop_free(r, t, r->objs.ptr[c->obj].parent);
    if (v->t == V_OBJ && v->v.obj == r->fbuf_owner && r->fbuf_len > 0) {
      /* the list just filled, the usual case: its stack is interned a little later */
      MS_FORWARD_IF_ERROR(rd_want_obj(r, c, v, R_FRAMES, &id));
      ms__pickle_frames_stored(r, c->obj, id);
      t->present |= MS_TRACE_HAS_FRAMES;
      if (!drop) return ms__pickle_defer_frames(r, id, r->objs.ptr[c->obj].ref);
      /* MS_LOAD_NO_*_STACKS: its frame indices, last at the builder's tail, are dropped */
      r->fbuf_owner = RD_NO_OBJ;
      r->fbuf_len = 0;
      r->objs.ptr[id].flags |= OF_SEALED | OF_DROPPED;
      r->objs.ptr[id].ref = MS_SNAP_NO_STACK;
      r->objs.ptr[c->obj].flags |= OF_DROPPED; /* the entry: checked when it is stored */
      return MS_OK;
    }
    MS_FORWARD_IF_ERROR(rd_frames_stack_ex(r, c, v, drop, &st));
    ms__pickle_frames_stored(r, c->obj, v->v.obj); /* a V_OBJ: rd_frames_stack_ex took it */
    if (drop && st == MS_SNAP_NO_STACK) r->objs.ptr[c->obj].flags |= OF_DROPPED;
    t = &b->trace.ptr[r->objs.ptr[c->obj].ref];
    t->stack = st;
    t->present |= MS_TRACE_HAS_FRAMES;
    return MS_OK;
  }
  default: return MS_OK;
  }
}

/* An entry of external_annotations. */
static int rd_set_annot(rd_t *r, const rd_ctx_t *c, uint8_t key, const rd_val_t *v) {
  ms_snap_annotation_t *a = &r->b.annotations.ptr[r->objs.ptr[c->obj].ref];
  switch (key) {
  case K_NAME: return rd_want_str(r, c, v, &a->name);
  case K_STAGE: return rd_want_str(r, c, v, &a->stage);
  case K_DEVICE: return rd_want_i64(r, c, v, &a->device);
  case K_TIME_US: return rd_want_i64(r, c, v, &a->time_us);
  default: return MS_OK;
  }
}

/* allocator_settings (role R_SETTINGS) or a map in it (R_SETMAP). */
static int rd_set_setting(rd_t *r, const rd_ctx_t *c, uint8_t role, const rd_val_t *v) {
  uint32_t did = c->obj;
  const rd_val_t *k = c->k;
  rd_obj_t *d = &r->objs.ptr[did];
  if (k->t != V_STR) return MS_OK; /* the model's settings have string keys */
  if (role == R_SETMAP && d->aux > RD_MAX_SETTINGS_DEPTH) return MS_OK; /* dropped map */
  ms_snap_kv_t kv = {0};
  kv.key = k->v.s;
  kv.s = "";
  bool keep;
  MS_FORWARD_IF_ERROR(rd_setting_value(r, c, v, &kv, &keep));
  if (!keep) return MS_OK;
  int rc;
  if (role == R_SETTINGS) {
    rc = ms__snapbuild_add_setting(&r->b, &kv);
  } else {
    uint32_t ix;
    rc = ms__snapbuild_add_setting_child(&r->b, &kv, &ix);
    if (rc == MS_OK) {
      d = &r->objs.ptr[did];
      if (d->count == 0) {
        d->ref = ix;
      } else if (ix != d->ref + d->count) {
        char p[300];
        ms__pickle_field_path(r, did, k, p, sizeof p);
        return ms__pickle_err(r, MS_EFORMAT,
                              "%s: unexpected pickle structure (settings out of order)", p);
      }
    }
  }
  if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a setting: %s", ms_strerror(rc));
  d = &r->objs.ptr[did];
  d->count++;
  return MS_OK;
}

/* dict[k] = v */
static int rd_dict_set(rd_t *r, uint32_t did, const rd_val_t *k, const rd_val_t *v) {
  rd_obj_t *d = &r->objs.ptr[did];
  uint8_t role = d->role;
  if (role == R_NONE) return MS_OK;
  if (d->flags & (OF_USED | OF_INTERNED)) return rd_modified_after_use(r, did);
  rd_ctx_t c = {did, k, 0};
  uint8_t key = k->t == V_STR ? k->key : K_UNKNOWN;
  switch (role) {
  case R_ROOT: return rd_set_root(r, &c, key, v);
  case R_SEGMENT: return rd_set_segment(r, &c, key, v);
  case R_BLOCK: return rd_set_block(r, &c, key, v);
  case R_HIST: return rd_set_hist(r, &c, key, v);
  case R_FRAME: return rd_set_frame(r, &c, key, v);
  case R_TRACE: return rd_set_trace(r, &c, key, v);
  case R_ANNOT: return rd_set_annot(r, &c, key, v);
  case R_SETTINGS:
  case R_SETMAP: return rd_set_setting(r, &c, role, v);
  default: return MS_OK;
  }
}

/* SETITEMS / SETITEM / DICT: items st[from..len) as key, value pairs into dict did. A key that
 * Python cannot hash fails the load, as it fails pickle.load (issue #16: such a key used to be
 * ignored, and the frames stored beside it with it). */
int ms__pickle_setitems(rd_t *r, uint32_t did, size_t from, const char *op) {
  size_t n = r->st.len - from;
  if (n & 1) return ms__pickle_err(r, MS_EFORMAT, "%s with an odd number of values (%zu)", op, n);
  MS_FORWARD_IF_ERROR(ms__pickle_check_hashable(r, from, 2, op, "dict key"));
  if (did == RD_NO_OBJ) { /* a skipped dict */
    r->st.len = from;
    return MS_OK;
  }
  rd_obj_t *d = &r->objs.ptr[did];
  if (r->drop_free && d->role == R_TRACE && (d->flags & OF_ACCOUNTED) && r->st.len > from) {
    rd_ctx_t c = {did, &r->st.ptr[from], 0};
    return rd_cannot_drop(r, &c); /* filled again after it was accounted for */
  }
  for (size_t i = from; i < r->st.len; i += 2) {
    rd_val_t k = r->st.ptr[i], v = r->st.ptr[i + 1];
    MS_FORWARD_IF_ERROR(rd_dict_set(r, did, &k, &v));
  }
  r->st.len = from;
  return r->objs.ptr[did].role == R_TRACE ? ms__pickle_entry_done(r, did) : MS_OK;
}

/* pickle_internal.h */
int ms__pickle_entry_done(rd_t *r, uint32_t did) {
  rd_obj_t *d = &r->objs.ptr[did];
  if (r->drop_free && !(d->flags & OF_USED)) {
    /* MS_LOAD_NO_FREE_STACKS: the entry is complete (one SETITEMS in Python's files) */
    d->flags |= OF_ACCOUNTED;
    int rc = ms__pickle_drop_account(r, d->ref, d->parent, (d->flags & OF_DROPPED) != 0);
    if (rc == MS_EUNSUPPORTED) {
      rd_ctx_t c = {did, NULL, 0};
      return rd_cannot_drop(r, &c);
    }
    if (rc != MS_OK) return ms__pickle_err(r, rc, "out of memory");
  }
  return MS_OK;
}

/* ---- finishing ------------------------------------------------------------------------------- */

/* After STOP: checks that the records tile their arrays, fills what older eras lack. */
int ms__pickle_finish(rd_t *r, ms_snapshot_t **out) {
  MS_FORWARD_IF_ERROR(ms__pickle_flush(r));
  ms__snapbuild_t *b = &r->b;
  const rd_obj_t *root = &r->objs.ptr[r->root];
  const rd_obj_t *segs;
  if (root->role == R_ROOT) {
    if (r->root_segments == RD_NO_OBJ)
      return ms__pickle_err(
          r, MS_EFORMAT, "not a PyTorch memory snapshot: the top-level dict has no 'segments' key");
    segs = &r->objs.ptr[r->root_segments];
    b->hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  } else if (root->role == R_SEGMENTS) {
    segs = root;
    b->hdr.origin = MS_SNAP_ORIGIN_TORCH_LIST;
  } else {
    return ms__pickle_err(r, MS_EFORMAT, "not a PyTorch memory snapshot: the top level is a set");
  }
  if ((segs->count && segs->ref != 0) || segs->count != b->segments.len)
    return ms__pickle_err(r, MS_EFORMAT,
                          "unexpected pickle structure: segments outside 'segments'");
  uint64_t pos = 0;
  for (size_t i = 0; i < b->segments.len; i++) {
    ms_snap_segment_t *s = &b->segments.ptr[i];
    if (s->nblocks == 0) s->first_block = (uint32_t)pos;
    if (s->first_block != pos)
      return ms__pickle_err(r, MS_EFORMAT,
                            "unexpected pickle structure: segments[%zu].blocks out of order", i);
    pos += s->nblocks;
    uint64_t addr = s->address, total = 0, alloc = 0, active = 0, req = 0;
    for (uint32_t j = 0; j < s->nblocks; j++) {
      ms_snap_block_t *k = &b->blocks.ptr[s->first_block + j];
      if (!(k->present & MS_BLOCK_HAS_ADDRESS)) k->address = addr;
      addr = k->address + k->size;
      total += k->size;
      if (k->state == MS_BLOCK_ACTIVE_ALLOCATED) alloc += k->size;
      if (k->state == MS_BLOCK_ACTIVE_ALLOCATED || k->state == MS_BLOCK_ACTIVE_PENDING_FREE) {
        active += k->size;
        req += k->requested_size;
      }
    }
    /* Pre-2.0 files may lack the totals; they follow from the blocks. */
    if (s->total_size == 0) s->total_size = total;
    if (s->allocated_size == 0) s->allocated_size = alloc;
    if (s->active_size == 0) s->active_size = active;
    if (!(s->present & MS_SEG_HAS_REQUESTED_SIZE)) s->requested_size = req;
  }
  if (pos != b->blocks.len)
    return ms__pickle_err(r, MS_EFORMAT, "unexpected pickle structure: blocks outside any segment");
  pos = 0;
  for (size_t i = 0; i < b->blocks.len; i++) {
    ms_snap_block_t *k = &b->blocks.ptr[i];
    if (k->nhistory == 0) k->first_history = (uint32_t)pos;
    if (k->first_history != pos)
      return ms__pickle_err(r, MS_EFORMAT, "unexpected pickle structure: history out of order");
    pos += k->nhistory;
    if (!(k->present & MS_BLOCK_HAS_REQUESTED_SIZE) && k->nhistory)
      k->requested_size = b->history.ptr[k->first_history].real_size;
  }
  if (pos != b->history.len)
    return ms__pickle_err(r, MS_EFORMAT, "unexpected pickle structure: history outside any block");
  pos = 0;
  for (size_t i = 0; i < b->devices.len; i++) {
    ms_snap_device_t *d = &b->devices.ptr[i];
    if (d->ntrace == 0) d->first_trace = (uint32_t)pos;
    if (d->first_trace != pos)
      return ms__pickle_err(r, MS_EFORMAT,
                            "unexpected pickle structure: device_traces[%zu] out of order", i);
    pos += d->ntrace;
  }
  if (pos != b->trace.len)
    return ms__pickle_err(r, MS_EFORMAT, "unexpected pickle structure: trace entries outside "
                                 "device_traces");
  if (r->skip_trace) b->hdr.present |= MS_SNAP_TRACE_SKIPPED;
  if (r->drop_actions || r->drop_free) b->hdr.present |= MS_SNAP_TRACE_STACKS_SKIPPED;
  /* Settings maps must be referenced by their parents; the builder checks ranges. */
  ms_errbuf_t inner = {{0}};
  int rc = ms__snapbuild_finish(b, out, &inner);
  if (rc != MS_OK) return ms__pickle_err(r, rc, "%s", inner.msg);
  return MS_OK;
}
