/* SPDX-License-Identifier: MIT
 * memsnap core: the shortcuts of a skipped trace (MS_LOAD_NO_TRACE): a frames list's run of
 * gets only checked, and a trace entry read in one loop (the reader's files and vocabulary:
 * pickle_internal.h).
 *
 * When the trace is skipped (`stats`, and every command that needs no trace), an entry is a dict
 * whose items are parsed and dropped: PyTorch writes it as EMPTY_DICT, MEMOIZE, MARK, a dozen
 * keys and values (memo gets, integers, a string or two) and a frames list (EMPTY_LIST,
 * MEMOIZE, MARK, memo gets, APPENDS), then SETITEMS. Each of those opcodes costs a turn of the
 * general loop's dispatch, which is most of what a skipped trace costs apart from its gets. Here
 * the entry is first scanned to its SETITEMS without touching the reader's state, then, when
 * every opcode in it is one this loop knows and every check the general path makes passes, its
 * effect is applied at once: its strings stored and its memo entries written in their order, the
 * dict left on the stack as a V_SKIP value, exactly as the general path leaves it. Anything else
 * (another opcode, a frame's or the buffer's end, an index the memo does not hold, a key Python
 * cannot hash, a string that is not UTF-8, a memo with holes) leaves r untouched, and the general
 * path reads the entry and says what is wrong with it, so that what a file means and how it fails
 * do not depend on which path read it.
 */
#include "snapshot/pickle_internal.h"

/* The VM's shortcut (rd_op_get_run) for a skipped list (MS_LOAD_NO_TRACE: a frames list of the trace):
 * a run of gets that APPENDS ends, into a V_SKIP list below the topmost mark, stores nothing,
 * so the run is only checked (each index stored, which a memo without holes says by its length)
 * and dropped with the APPENDS, as rd_op_appends would drop it. @return true when it did so;
 * false leaves r untouched for the general path. */
bool ms__pickle_skip_list_run(rd_t *r, int op) {
  if (r->memo_holes || r->marks.len == 0) return false;
  size_t from = rd_mark_pos(r);
  if (from == 0) return false;
  const rd_val_t *t = &r->st.ptr[from - 1];
  if (t->t != V_SKIP || t->kind != O_LIST) return false;
  if (r->marks.len > 1 && from - 1 < r->marks.ptr[r->marks.len - 2]) return false;
  size_t n = 0, end = 0;
  if (!rd_check_get_run((const unsigned char *)r->buf, r->pos, r->lim, r->memo.len, op, &n,
                        &end) ||
      n > RD_MAX_STACK - r->st.len) /* the general path says the stack is too deep */
    return false;
  r->pos = end;
  r->marks.len--;
  r->st.len = from;
  return true;
}

/* What the scan found to apply, in order. */
#define SKIM_MAX_EVENTS 64

typedef struct skim_event_s {
  uint32_t at;   /* STR: the string's offset in buf */
  uint8_t kind;  /* SKIM_STR, SKIM_PUT_DICT, SKIM_PUT_LIST */
  uint8_t len;   /* STR: its length */
  bool memoized; /* STR: a memo put follows it */
} skim_event_t;

enum { SKIM_STR = 1, SKIM_PUT_DICT, SKIM_PUT_LIST };

typedef struct skim_s {
  const unsigned char *buf;
  size_t pos, lim;
  size_t nmemo, nput; /* the memo's length, the puts found so far */
  skim_event_t ev[SKIM_MAX_EVENTS];
  size_t nev;
} skim_t;

static bool skim_event(skim_t *k, uint8_t kind, size_t at, size_t len) {
  if (k->nev == SKIM_MAX_EVENTS) return false;
  k->ev[k->nev++] = (skim_event_t){(uint32_t)at, kind, (uint8_t)len, false};
  return true;
}

/* An optional memo put of the value just read, of the next index (rd_scan_put). */
MS_ALWAYS_INLINE bool skim_put(skim_t *k, bool *put) {
  bool ok = rd_scan_put(k->buf, &k->pos, k->lim, k->nmemo + k->nput, put);
  k->nput += *put;
  return ok;
}

/* A memo get at k->pos (its opcode op already read): the index, or false when the memo does
 * not hold it (or the argument reaches lim). */
MS_ALWAYS_INLINE bool skim_get(skim_t *k, unsigned op, uint32_t *idx) {
  if (op == 'j') {
    if (k->lim - k->pos < 4) return false;
    *idx = rd_le32(k->buf + k->pos);
    k->pos += 4;
  } else {
    if (k->lim - k->pos < 1) return false;
    *idx = k->buf[k->pos];
    k->pos += 1;
  }
  return *idx < k->nmemo;
}

/* The frames list after its EMPTY_LIST: an optional put, then nothing (empty) or MARK, memo
 * gets, APPENDS. *items: its gets (the stack they take). */
static bool skim_list(skim_t *k, size_t *items) {
  bool put;
  if (!skim_put(k, &put) || (put && !skim_event(k, SKIM_PUT_LIST, 0, 0))) return false;
  *items = 0;
  if (k->lim - k->pos < 1 || k->buf[k->pos] != '(') return true; /* an empty list */
  if (k->lim - k->pos < 2) return false;
  int op = k->buf[k->pos + 1]; /* an empty batch (MARK, APPENDS) too: the general path */
  size_t end = 0;
  if ((op | 2) != 'j' || !rd_check_get_run(k->buf, k->pos + 2, k->lim, k->nmemo, op, items, &end))
    return false;
  k->pos = end;
  return true;
}

bool ms__pickle_skim = true;

MS_HOT_ALIGN int ms__pickle_skim_entry(rd_t *r, bool *done) {
  *done = false;
  if (!ms__pickle_skim || r->memo_holes || r->marks.len + 2 > RD_MAX_STACK) return MS_OK;
  skim_t k; /* its events are written before they are read */
  k.buf = (const unsigned char *)r->buf;
  k.pos = r->pos;
  k.lim = r->lim;
  k.nmemo = r->memo.len;
  k.nput = 0;
  k.nev = 0;
  const uint8_t *tag = r->memo_tag.ptr;
  bool put;
  if (!skim_put(&k, &put) || (put && !skim_event(&k, SKIM_PUT_DICT, 0, 0))) return MS_OK;
  if (k.lim - k.pos < 1 || k.buf[k.pos] != '(') return MS_OK; /* an empty dict */
  k.pos++;
  size_t items = 0, deepest = 0; /* values above the mark; the most there while a list is read */
  for (;;) {
    if (k.lim - k.pos < 1) return MS_OK;
    unsigned op = k.buf[k.pos++];
    bool key = !(items & 1);
    size_t extra = 0;       /* a list's items above it while it is read */
    if ((op | 2u) == 'j') { /* BINGET 'h', LONG_BINGET 'j' ('h' | 2 == 'j'): most items */
      uint32_t idx;
      if (!skim_get(&k, op, &idx)) return MS_OK;
      uint8_t t = tag[idx];
      /* a key Python can hash; a value that is no object (ms__pickle_create would then decide
       * what a list after it is) */
      if (t == V_UNSET || t == V_OBJ || rd_tag_freed(t)) return MS_OK;
      if (key && ((t & RD_TAG_SKIP) || (r->memo.ptr[idx].flags & VF_UNHASHABLE))) return MS_OK;
    } else {
      /* clang-format off */
      switch (op) {
      /* BININT1, BININT2, BININT, BINFLOAT */
      case 'K': k.pos += 1; break;
      case 'M': k.pos += 2; break;
      case 'J': k.pos += 4; break;
      case 'G': k.pos += 8; break;
      /* NONE, NEWTRUE, NEWFALSE */
      case 'N': case 0x88: case 0x89: break;
      /* clang-format on */
      case 0x8a: /* LONG1 */
        if (k.lim - k.pos < 1) return MS_OK;
        k.pos += 1 + (size_t)k.buf[k.pos];
        break;
      case 0x8c: { /* SHORT_BINUNICODE */
        if (k.lim - k.pos < 1) return MS_OK;
        size_t n = k.buf[k.pos], at = k.pos + 1;
        if (k.lim - at < n || at > UINT32_MAX || ms__pickle_text_valid(k.buf + at, n, false) < n ||
            !skim_event(&k, SKIM_STR, at, n))
          return MS_OK;
        k.pos = at + n;
        if (!skim_put(&k, &put)) return MS_OK;
        k.ev[k.nev - 1].memoized = put;
        break;
      }
      case ']': /* EMPTY_LIST: a value (the frames) */
        if (key || !skim_list(&k, &extra)) return MS_OK;
        extra++; /* the list itself */
        break;
      case 'u': /* SETITEMS */
        if (items & 1) return MS_OK;
        goto apply;
      default:
        return MS_OK; /* a put after a get or a scalar too (PyTorch memoizes neither) */
      }
    }
    if (k.pos > k.lim) return MS_OK;            /* a scalar's bytes reach past lim */
    if (items + extra > deepest) deepest = items + extra; /* a list's items above it */
    items++;
  }
apply:
  /* the dict, and the most values the general path would have held above it */
  if (items > deepest) deepest = items;
  if (deepest + 1 > RD_MAX_STACK - r->st.len) return MS_OK;
  if (MS_BIGVEC_RESERVE(&r->memo, k.nput) || MS_BIGVEC_RESERVE(&r->memo_obj, k.nput) ||
      MS_BIGVEC_RESERVE(&r->memo_tag, k.nput) || MS_VEC_RESERVE(&r->st, 1))
    return MS_OK; /* out of memory: the general path says so */
  for (size_t i = 0; i < k.nev; i++) {
    const skim_event_t *e = &k.ev[i];
    rd_val_t v = {V_SKIP, K_UNKNOWN, e->kind == SKIM_PUT_LIST ? O_LIST : O_DICT, 0, 0, {0}};
    if (e->kind == SKIM_STR) {
      /* stored as the general path stores every string it reads; its failure is that path's */
      r->op_off = r->base + e->at - 2;
      MS_FORWARD_IF_ERROR(ms__pickle_str_value(r, (const char *)k.buf + e->at, e->len, &v));
      if (!e->memoized) continue;
    }
    size_t idx = r->memo.len;
    if (v.t == V_SKIP) {
      r->memo_tag.ptr[idx] = (uint8_t)(RD_TAG_SKIP | v.kind);
    } else {
      r->memo_tag.ptr[idx] = v.t;
      r->memo.ptr[idx] = v;
    }
    r->memo.len++;
    r->memo_obj.len++;
    r->memo_tag.len++;
  }
  r->st.ptr[r->st.len++] = (rd_val_t){V_SKIP, K_UNKNOWN, O_DICT, 0, 0, {0}};
  r->pos = k.pos;
  *done = true;
  return MS_OK;
}
