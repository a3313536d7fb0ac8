/* SPDX-License-Identifier: MIT
 * memsnap core: the values built by the reader of PyTorch snapshot pickles (memsnap/pickle.h,
 * issue #4; the reader's files and vocabulary: pickle_internal.h).
 *
 * Every dict or list gets a role the moment it is created (EMPTY_DICT/EMPTY_LIST), from its
 * position: the container it is about to be stored in (found from the shape of the stack, as
 * Python's pickler lays it out) and the key it will be stored under. A dict whose role is
 * "block" is a block record in the snapshot builder from birth (pickle_schema.c); SETITEMS into
 * it converts each value straight into the record's fields. A container in a place the schema
 * does not know has no role: its values are still parsed, safely, and dropped. Containers of the
 * trace skipped by MS_LOAD_NO_TRACE are V_SKIP values with no record at all.
 *
 * Also here: tuples (a pair of ints is kept, for pool ids; any other tuple only as its type),
 * strings (copied into the builder's arena, tagged with the schema key they spell), and the key
 * paths and type names that error messages show.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "snapshot/pickle_internal.h"

/* ---- names and paths for messages ------------------------------------------------------------ */

const char *ms__pickle_type_name(const rd_t *r, const rd_val_t *v) {
  switch (v->t) {
  case V_NONE: return "None";
  case V_BOOL: return "bool";
  case V_INT:
  case V_UINT:
  case V_BIG: return "int";
  case V_FLOAT: return "float";
  case V_STR: return "str";
  case V_BYTES: return v->flags & VF_UNHASHABLE ? "bytearray" : "bytes";
  case V_PAIR:
  case V_TUPLE: return "tuple";
  case V_FSET: return "frozenset";
  case V_SKIP: return v->kind == O_DICT ? "dict" : v->kind == O_LIST ? "list" : "set";
  case V_OBJ: {
    uint8_t k = r->objs.ptr[v->v.obj].kind;
    return k == O_DICT ? "dict" : k == O_LIST ? "list" : "set";
  }
  default: return "nothing";
  }
}

/* Writes the key path of object o (e.g. "segments[3].blocks[7]") into out. */
void ms__pickle_path(const rd_t *r, uint32_t o, char *out, size_t cap) {
  uint32_t chain[24];
  size_t n = 0;
  bool cut = false;
  for (uint32_t c = o; c != RD_NO_OBJ && c != r->root; c = r->objs.ptr[c].parent) {
    if (n == 24) {
      cut = true;
      break;
    }
    chain[n++] = c;
  }
  size_t w = 0;
  out[0] = 0;
  if (cut) w += (size_t)snprintf(out, cap, "...");
  while (n-- > 0 && w < cap) {
    const rd_obj_t *ob = &r->objs.ptr[chain[n]];
    const rd_obj_t *par = ob->parent == RD_NO_OBJ ? NULL : &r->objs.ptr[ob->parent];
    if (par && par->kind == O_LIST)
      w += (size_t)snprintf(out + w, cap - w, "[%" PRIu32 "]", ob->idx);
    else
      w += (size_t)snprintf(out + w, cap - w, "%s%s", w ? "." : "", rd_key_names[ob->key]);
  }
  if (o == r->root && cap) snprintf(out, cap, "top level");
}

/* A key from the file, made safe to print: at most 60 bytes, control bytes as '?'. */
static void rd_safe_key(const rd_val_t *k, char out[64]) {
  const char *s = k && k->t == V_STR ? k->v.s : "?";
  size_t n = 0;
  for (; s[n] && n < 60; n++) out[n] = (unsigned char)s[n] < 0x20 || s[n] == 0x7f ? '?' : s[n];
  out[n] = 0;
}

/* "path.key" of a field of object o. */
void ms__pickle_field_path(const rd_t *r, uint32_t o, const rd_val_t *k, char *out, size_t cap) {
  char p[200], name[64];
  ms__pickle_path(r, o, p, sizeof p);
  rd_safe_key(k, name);
  if (o == r->root)
    snprintf(out, cap, "%.120s", name);
  else
    snprintf(out, cap, "%.150s.%.120s", p, name);
}

/* ---- containers ------------------------------------------------------------------------------ */

typedef struct rd_cand_s {
  uint32_t parent;
  uint8_t key;
  uint8_t role;
  bool skip; /* the parent is a skipped container (V_SKIP) */
  uint32_t idx;
} rd_cand_t;

static inline bool rd_is_container(const rd_t *r, const rd_val_t *v, uint8_t kind) {
  return (v->t == V_OBJ && r->objs.ptr[v->v.obj].kind == kind) ||
         (v->t == V_SKIP && v->kind == kind);
}

/* The candidate parent pv (a container value) for a new container of the given kind, stored
 * under key (dicts). */
static void rd_cand_at(const rd_t *r, rd_cand_t *c, const rd_val_t *pv, uint8_t kind,
                       uint8_t key) {
  c->key = key;
  if (pv->t == V_SKIP) {
    c->skip = true;
    return;
  }
  c->parent = pv->v.obj;
  const rd_obj_t *p = &r->objs.ptr[c->parent];
  bool is_list = p->kind == O_LIST;
  if (is_list) c->idx = p->count;
  uint8_t role = is_list ? rd_list_child(p->role) : rd_dict_child(p->role, key);
  if (role != R_NONE && rd_role_kind[role] != kind) role = R_NONE;
  c->role = role;
}

/* Decides which container a new container (of the given kind) is being built for, from the
 * shape of the stack. Python's pickler stores a container's items either in batches
 * (parent MARK items... APPENDS/SETITEMS) or one at a time (parent item APPEND, parent key item
 * SETITEM); both shapes are considered and the one that gives a known role wins (then one whose
 * parent is skipped: what it holds is skipped too). *root: this is the top-level container. */
static void rd_place(const rd_t *r, uint8_t kind, rd_cand_t *out, bool *root) {
  size_t n = r->st.len, mpos = rd_mark_pos(r);
  bool has_mark = r->marks.len > 0;
  *root = n == 0 && !has_mark && r->root == RD_NO_OBJ;
  rd_cand_t a = {RD_NO_OBJ, K_UNKNOWN, R_NONE, false, 0}, bt = a;
  *out = a;
  if (*root) return;
  /* one at a time: the top value is a list, or the top is a key below which sits a dict */
  if (n > 0 && (!has_mark || mpos < n)) {
    const rd_val_t *top = &r->st.ptr[n - 1];
    if (rd_is_container(r, top, O_LIST)) {
      rd_cand_at(r, &a, top, kind, K_UNKNOWN);
    } else if (top->t != V_OBJ && top->t != V_SKIP && n >= 2 && (!has_mark || mpos <= n - 2) &&
               rd_is_container(r, &r->st.ptr[n - 2], O_DICT)) {
      rd_cand_at(r, &a, &r->st.ptr[n - 2], kind, top->t == V_STR ? top->key : K_UNKNOWN);
    }
  }
  /* in a batch: the value below the topmost mark is the parent */
  if (has_mark && mpos >= 1) {
    const rd_val_t *pv = &r->st.ptr[mpos - 1];
    size_t above = n - mpos;
    if (rd_is_container(r, pv, O_LIST)) {
      rd_cand_at(r, &bt, pv, kind, K_UNKNOWN);
      bt.idx += (uint32_t)above;
    } else if (rd_is_container(r, pv, O_DICT) && (above & 1)) {
      const rd_val_t *top = &r->st.ptr[n - 1];
      rd_cand_at(r, &bt, pv, kind, top->t == V_STR ? top->key : K_UNKNOWN);
    }
  }
  bool ha = a.parent != RD_NO_OBJ || a.skip, hb = bt.parent != RD_NO_OBJ || bt.skip;
  if (!ha)
    *out = bt;
  else if (!hb)
    *out = a;
  else if ((a.role != R_NONE) != (bt.role != R_NONE))
    *out = a.role != R_NONE ? a : bt;
  else if (a.skip || bt.skip)
    *out = a.skip ? a : bt;
  else /* a single item follows a full batch of 1000, or the container is fresh */
    *out = rd_items(&r->objs.ptr[a.parent]) % 1000 == 0 ? a : bt;
}

/* A new container: a V_OBJ with its role, or a V_SKIP when it belongs to the skipped trace. */
int ms__pickle_create(rd_t *r, uint8_t kind, rd_val_t *out) {
  if (rd_born_skipped(r, kind)) {
    *out = (rd_val_t){V_SKIP, K_UNKNOWN, kind, 0, 0, {0}};
    return MS_OK;
  }
  rd_cand_t c;
  bool root;
  rd_place(r, kind, &c, &root);
  if (!root && (c.skip || (r->skip_trace && c.role == R_TRACE))) {
    *out = (rd_val_t){V_SKIP, K_UNKNOWN, kind, 0, 0, {0}};
    return MS_OK;
  }
  uint32_t id = RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(ms__pickle_new_obj(r, kind, &id));
  rd_obj_t *o = &r->objs.ptr[id];
  if (root) {
    r->root = id;
    o->role = kind == O_DICT ? R_ROOT : kind == O_LIST ? R_SEGMENTS : R_NONE;
  } else {
    o->parent = c.parent;
    o->key = c.key;
    o->idx = c.idx;
    o->role = c.role;
    if (o->role == R_SETMAP) { /* aux: nesting depth of settings maps */
      const rd_obj_t *p = &r->objs.ptr[c.parent];
      o->aux = p->role == R_SETMAP ? p->aux + 1 : 1;
    }
    if (c.parent != RD_NO_OBJ) ms__pickle_child_born(r, c.parent);
  }
  MS_FORWARD_IF_ERROR(ms__pickle_birth(r, id));
  *out = rd_obj_val(id);
  return MS_OK;
}

/* ---- tuples and protocol 0/1 containers ------------------------------------------------------ */

int ms__pickle_check_hashable(rd_t *r, size_t from, size_t step, const char *op, const char *as) {
  for (size_t i = from; i < r->st.len; i += step) {
    const rd_val_t *k = &r->st.ptr[i];
    if (ms_unlikely(rd_unhashable(k))) {
      const char *t = ms__pickle_type_name(r, k);
      const char *held = strcmp(t, "tuple") == 0 ? " holding a dict, list, set or bytearray" : "";
      return ms__pickle_err(r, MS_EFORMAT,
                            "%s: the %s is a %s%s, which Python cannot hash (its unpickler "
                            "raises TypeError)",
                            op, as, t, held);
    }
  }
  return MS_OK;
}

int ms__pickle_tuple(rd_t *r, size_t from) {
  size_t n = r->st.len - from;
  rd_val_t v = {V_TUPLE, K_UNKNOWN, 0, 0, 0, {0}};
  for (size_t i = from; i < r->st.len; i++)
    if (rd_unhashable(&r->st.ptr[i])) v.flags = VF_UNHASHABLE;
  if (n == 2 && r->st.ptr[from].t == V_INT && r->st.ptr[from + 1].t == V_INT) {
    if (r->pairs.len / 2 >= UINT32_MAX) return ms__pickle_err(r, MS_ELIMIT, "too many tuples");
    if (MS_VEC_RESERVE(&r->pairs, 2)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
    v.t = V_PAIR;
    v.v.pair = (uint32_t)(r->pairs.len / 2);
    r->pairs.ptr[r->pairs.len++] = r->st.ptr[from].v.i;
    r->pairs.ptr[r->pairs.len++] = r->st.ptr[from + 1].v.i;
  }
  r->st.len = from;
  return rd_push(r, v);
}

/* Builds a dict or list from the values above the topmost mark (protocol 0/1 DICT and LIST). */
int ms__pickle_build_from_mark(rd_t *r, uint8_t kind, const char *op) {
  size_t from = 0;
  MS_FORWARD_IF_ERROR(rd_pop_mark(r, op, &from));
  r->tmp.len = 0;
  size_t n = r->st.len - from;
  if (MS_VEC_RESERVE(&r->tmp, n)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  if (n) memcpy(r->tmp.ptr, r->st.ptr + from, n * sizeof *r->tmp.ptr);
  r->tmp.len = n;
  r->st.len = from;
  rd_val_t ov;
  MS_FORWARD_IF_ERROR(ms__pickle_create(r, kind, &ov));
  uint32_t id = ov.t == V_OBJ ? ov.v.obj : RD_NO_OBJ;
  MS_FORWARD_IF_ERROR(rd_push(r, ov));
  size_t at = r->st.len;
  if (MS_VEC_RESERVE(&r->st, n)) return ms__pickle_err(r, MS_ENOMEM, "out of memory");
  if (n) memcpy(r->st.ptr + at, r->tmp.ptr, n * sizeof *r->tmp.ptr);
  r->st.len += n;
  return kind == O_DICT ? ms__pickle_setitems(r, id, at, op) : ms__pickle_appends(r, id, at);
}

/* ---- strings --------------------------------------------------------------------------------- */

int ms__pickle_str_value(rd_t *r, const char *p, uint64_t n, rd_val_t *out) {
  if (n > RD_MAX_STR)
    return ms__pickle_err(r, MS_ELIMIT, "string of %" PRIu64 " bytes is too long", n);
  rd_val_t v = {V_STR, K_UNKNOWN, 0, 0, (uint32_t)n, {0}};
  int rc = ms__snapbuild_str(&r->b, p, (size_t)n, &v.v.s);
  if (rc != MS_OK) return ms__pickle_err(r, rc, "cannot store a string: %s", ms_strerror(rc));
  v.key = rd_key_lookup(p, (size_t)n);
  *out = v;
  return MS_OK;
}

static int rd_push_str(rd_t *r, const char *p, uint64_t n) {
  rd_val_t v;
  MS_FORWARD_IF_ERROR(ms__pickle_str_value(r, p, n, &v));
  return rd_push(r, v);
}

/* pickle_internal.h */
size_t ms__pickle_text_valid(const unsigned char *p, size_t n, bool ascii) {
  size_t i = 0;
  while (i < n) {
    if (i + 8 <= n) { /* eight ASCII bytes at a time: most strings of a snapshot */
      uint64_t w;
      memcpy(&w, p + i, 8);
      if (!(w & 0x8080808080808080ull)) {
        i += 8;
        continue;
      }
    }
    unsigned c = p[i];
    if (c < 0x80) {
      i++;
      continue;
    }
    if (ascii) return i;
    size_t len;
    unsigned lo = 0x80, hi = 0xbf; /* the range of the second byte */
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) { /* no overlong form (E0 80..9F) */
      len = 3;
      lo = c == 0xe0 ? 0xa0 : 0x80;
    } else if (c >= 0xf0 && c <= 0xf4) { /* no overlong form, nothing beyond U+10FFFF */
      len = 4;
      lo = c == 0xf0 ? 0x90 : 0x80;
      hi = c == 0xf4 ? 0x8f : 0xbf;
    } else {
      return i; /* a continuation byte, C0/C1, F5..FF */
    }
    if (n - i < len || p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t j = 2; j < len; j++)
      if ((p[i + j] & 0xc0) != 0x80) return i;
    i += len;
  }
  return n;
}

static const char *rd_str_op_name(int op) {
  switch (op) {
  case 0x8c: return "SHORT_BINUNICODE";
  case 'X': return "BINUNICODE";
  case 0x8d: return "BINUNICODE8";
  case 'U': return "SHORT_BINSTRING";
  default: return "BINSTRING";
  }
}

int ms__pickle_str(rd_t *r, uint64_t n, int op) {
  const char *p = NULL;
  bool is_bytes = op == 'C' || op == 'B' || op == 0x8e || op == 0x96;
  if (n > RD_MAX_STR)
    return ms__pickle_err(r, MS_ELIMIT, "declared length %" PRIu64 " is beyond the reader's limit",
                          n);
  if (is_bytes) { /* content not kept: skipped, never buffered */
    MS_FORWARD_IF_ERROR(ms__pickle_skip(r, n, "a bytes value"));
    rd_val_t v = {V_BYTES, K_UNKNOWN, 0, op == 0x96 ? VF_UNHASHABLE : 0, 0, {0}};
    return rd_push(r, v);
  }
  MS_FORWARD_IF_ERROR(rd_take(r, n, &p, "a string"));
  bool ascii = op == 'U' || op == 'T'; /* Python 2 str: Python 3 decodes them as ASCII */
  size_t ok = ms__pickle_text_valid((const unsigned char *)p, (size_t)n, ascii);
  if (ms_unlikely(ok < n)) {
    /* the string's bytes follow the opcode and its 1, 4 or 8 length bytes */
    size_t head = op == 0x8c || op == 'U' ? 2 : op == 0x8d ? 9 : 5;
    return ms__pickle_err(r, MS_EFORMAT,
                          "%s string is not valid %s: byte 0x%02x at offset %" PRIu64
                          " (Python's unpickler raises UnicodeDecodeError)",
                          rd_str_op_name(op), ascii ? "ASCII" : "UTF-8", (unsigned char)p[ok],
                          r->op_off + head + ok);
  }
  int rc = rd_push_str(r, p, n);
  if (r->scratch.cap > 8 * RD_BUF_CAP) MS_VEC_FREE(&r->scratch); /* a long string is copied */
  return rc;
}
