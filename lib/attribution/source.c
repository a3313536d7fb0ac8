/* SPDX-License-Identifier: MIT
 * memsnap core: the source of a stack (memsnap/attribution.h) and the rows of ms_attr_aggregate:
 * blocks grouped by category, source or stack, biggest first.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "timeline/internal.h"

#define ATTR_SRC_NOSTACK (ATTR_NONE - 1)   /* "<no stack recorded>" */
#define ATTR_SRC_UNRECORDED (ATTR_NONE - 2) /* "<allocated before recording>" */
#define ATTR_SRC_LATER (ATTR_NONE - 3)      /* ssrc of a stack no allocation has: found when asked */

/* ---- which frame is the source ------------------------------------------------------------- */

/* The source frame and the op frame of stack st (indices into frames, ATTR_NONE: none). */
static void attr_stack_source(const ms_attr_t *a, uint32_t st, uint32_t *src, uint32_t *op) {
  const ms_snapshot_t *s = a->snap;
  const ms_snap_stack_t *k = &s->stacks[st];
  attr_srcwalk_t w;
  attr_srcwalk_init(&w);
  for (uint32_t j = 0; j < k->nframes; j++) {
    uint32_t f = ms_snap_frame_index(s, k->first + j);
    if (attr_srcwalk_frame(&w, a->fflags[f], f)) break;
  }
  attr_srcwalk_end(&w, src, op);
}

void ms__attr_sources_link(ms_attr_t *a, uint32_t *first_op, uint8_t *multi) {
  const ms_snapshot_t *s = a->snap;
  /* only allocations' stacks decide whether a line has several operators (frees' stacks may or
   * may not have been read): those of the trace's allocs, the blocks and the history, which
   * ms__attr_stacks gave a pattern set (sset) and a source here */
  for (size_t f = 0; f < s->nframes; f++) /* the records whose stacks were left for later too */
    first_op[f] = a->dfirst ? a->dfirst[f] : ATTR_OP_UNSEEN;
  if (a->dmulti) memcpy(multi, a->dmulti, s->nframes);
  for (size_t st = 0; st < a->nst; st++) {
    uint32_t f = a->ssrc[st];
    if (f != ATTR_SRC_LATER) attr_note_op(first_op, multi, f, a->sop[st]);
  }
  for (size_t st = 0; st < a->nst; st++)
    if (a->ssrc[st] == ATTR_NONE || (a->ssrc[st] != ATTR_SRC_LATER && !multi[a->ssrc[st]]))
      a->sop[st] = ATTR_NONE;
  a->smulti = multi;
}

int ms__attr_sources_alloc(ms_attr_t *a, uint32_t **first_op, uint8_t **multi) {
  const ms_snapshot_t *s = a->snap;
  size_t ns = a->nst ? a->nst : 1, nf = s->nframes ? s->nframes : 1;
  a->ssrc = ms__big_malloc(ns * sizeof *a->ssrc); /* per stack: reuse a read's pages */
  a->sop = ms__big_malloc(ns * sizeof *a->sop);
  *first_op = malloc(nf * sizeof **first_op);
  *multi = calloc(nf, 1);
  if (!a->ssrc || !a->sop || !*first_op || !*multi) {
    free(*first_op);
    free(*multi);
    return MS_ENOMEM;
  }
  return MS_OK;
}

void ms__attr_stack_later(ms_attr_t *a, uint32_t st) {
  a->ssrc[st] = ATTR_SRC_LATER;
  a->sop[st] = ATTR_NONE;
}

/* Per stack its source frame, and the op frame where another stack with that source frame
 * allocates through another op. */
int ms__attr_sources(ms_attr_t *a) {
  uint32_t *first_op;
  uint8_t *multi;
  MS_FORWARD_IF_ERROR(ms__attr_sources_alloc(a, &first_op, &multi));
  for (size_t st = 0; st < a->nst; st++) {
    if (a->sset[st] == ATTR_NONE) /* a free's stack: its source only if asked (attr_src_of) */
      ms__attr_stack_later(a, (uint32_t)st);
    else
      attr_stack_source(a, (uint32_t)st, &a->ssrc[st], &a->sop[st]);
  }
  ms__attr_sources_link(a, first_op, multi);
  free(first_op);
  return MS_OK;
}

int ms__attr_sources_ready(const ms_attr_t *ca) {
  ms_attr_t *a = (ms_attr_t *)ca; /* a cache filled once: the classifier stays immutable to users */
  pthread_mutex_lock(&a->src_mu);
  if (a->src_state == 0) {
    int rc = ms__attr_sources(a);
    a->src_state = rc == MS_OK ? 1 : rc;
  }
  int st = a->src_state;
  pthread_mutex_unlock(&a->src_mu);
  return st == 1 ? MS_OK : st;
}

/* ---- formatting ---------------------------------------------------------------------------- */

typedef struct attr_buf_s {
  char *p;
  size_t cap, len; /* len counts what did not fit too */
} attr_buf_t;

static void attr_put(attr_buf_t *b, const char *s, size_t n) {
  if (b->len < b->cap) {
    size_t room = b->cap - 1 - b->len;
    memcpy(b->p + b->len, s, n < room ? n : room);
  }
  b->len += n;
}

static const char *attr_base(const char *path) {
  const char *b = path;
  for (const char *p = path; *p; p++)
    if (*p == '/' || *p == '\\') b = p + 1;
  return b;
}

/* A C++ name without return type, template arguments, parameters and autograd's namespaces:
 * `void torch::autograd::AccumulateGrad::accumulateGrad<...>(...)` -> `AccumulateGrad::
 * accumulateGrad`, `torch::autograd::generated::MulBackward0::apply(...)` -> `MulBackward0`. */
static void attr_put_cpp(attr_buf_t *b, const char *name) {
  if (!strchr(name, '(')) { /* not a C++ signature: as it is */
    attr_put(b, name, strlen(name));
    return;
  }
  char tmp[512];
  size_t n = 0;
  int depth = 0;
  for (const char *p = name; *p && n < sizeof tmp - 1; p++) {
    if (*p == '<') {
      depth++;
    } else if (*p == '>' && depth > 0) {
      depth--;
    } else if (depth == 0 && *p == '(' && n > 0) {
      break;
    } else if (depth == 0 && *p == ' ') {
      n = 0; /* a return type or qualifier before the name */
    } else if (depth == 0) {
      tmp[n++] = *p;
    }
  }
  if (n == 0) { /* nothing left: the name as it is */
    attr_put(b, name, strlen(name));
    return;
  }
  tmp[n] = 0;
  const char *t = tmp;
  static const char *const prefixes[] = {"torch::autograd::generated::", "torch::autograd::"};
  for (size_t i = 0; i < 2; i++)
    if (strncmp(t, prefixes[i], strlen(prefixes[i])) == 0 && t[strlen(prefixes[i])]) {
      t += strlen(prefixes[i]);
      break;
    }
  size_t tl = strlen(t);
  if (tl > 7 && strcmp(t + tl - 7, "::apply") == 0) tl -= 7;
  attr_put(b, t, tl);
}

/* `FILE:LINE FUNC` of a Python frame, `FILE:LINE:FUNC` (sep ':') in stack keys. */
static void attr_put_frame(const ms_attr_t *a, attr_buf_t *b, uint32_t f, char sep) {
  const ms_snap_frame_t *fr = &a->snap->frames[f];
  if (a->fflags[f] & ATTR_F_PYTHON) {
    char num[48];
    const char *base = attr_base(fr->filename);
    attr_put(b, base, strlen(base));
    int n = snprintf(num, sizeof num, ":%" PRId64 "%c", fr->line, sep);
    attr_put(b, num, (size_t)n);
    attr_put(b, fr->name, strlen(fr->name));
  } else {
    attr_put_cpp(b, fr->name);
  }
}

/* ` → at::OP` of an `at::_ops::OP::call(...)` frame. */
static void attr_put_op(const ms_attr_t *a, attr_buf_t *b, uint32_t f) {
  const char *name = a->snap->frames[f].name + 10; /* after at::_ops:: */
  const char *end = strstr(name, "::call(");
  attr_put(b, " \xe2\x86\x92 at::", 9);
  attr_put(b, name, end ? (size_t)(end - name) : strlen(name));
}

static size_t attr_fmt_key(const ms_attr_t *a, uint32_t src, uint32_t op, char *buf, size_t cap) {
  attr_buf_t b = {buf, cap, 0};
  if (src == ATTR_SRC_NOSTACK) {
    attr_put(&b, "<no stack recorded>", 19);
  } else if (src == ATTR_SRC_UNRECORDED) {
    attr_put(&b, "<allocated before recording>", 28);
  } else if (src == ATTR_NONE) {
    attr_put(&b, "<no frame>", 10);
  } else {
    attr_put_frame(a, &b, src, ' ');
    if (op != ATTR_NONE) attr_put_op(a, &b, op);
  }
  buf[b.len < cap ? b.len : cap - 1] = 0;
  return b.len;
}

static void attr_src_of(const ms_attr_t *a, uint32_t stack, uint32_t *src, uint32_t *op) {
  if (stack == ATTR_STACK_UNRECORDED) {
    *src = ATTR_SRC_UNRECORDED;
    *op = ATTR_NONE;
  } else if (stack >= a->snap->nstacks) {
    *src = ATTR_SRC_NOSTACK;
    *op = ATTR_NONE;
  } else if (stack >= a->nst || a->ssrc[stack] == ATTR_SRC_LATER) { /* also one read later */
    attr_stack_source(a, stack, src, op);
    if (*src == ATTR_NONE || !a->smulti[*src]) *op = ATTR_NONE;
  } else {
    *src = a->ssrc[stack];
    *op = a->sop[stack];
  }
}

size_t ms_attr_source(const ms_attr_t *a, uint32_t stack, char *buf, size_t cap) {
  if (ms__attr_sources_ready(a) != MS_OK) {
    snprintf(buf, cap, "<out of memory>");
    return strlen("<out of memory>");
  }
  uint32_t src, op;
  attr_src_of(a, stack, &src, &op);
  return attr_fmt_key(a, src, op, buf, cap);
}

/* The stack key: its Python frames (torch's too) and the other frames the skip list keeps,
 * outermost first, joined by ';'. */
static size_t attr_fmt_stack(const ms_attr_t *a, uint32_t stack, char *buf, size_t cap) {
  attr_buf_t b = {buf, cap, 0};
  if (stack == ATTR_STACK_UNRECORDED) {
    attr_put(&b, "<allocated before recording>", 28);
  } else if (stack >= a->snap->nstacks) {
    attr_put(&b, "<no stack recorded>", 19);
  } else {
    const ms_snap_stack_t *k = &a->snap->stacks[stack];
    bool any = false;
    for (uint32_t j = k->nframes; j-- > 0;) {
      uint32_t f = ms_snap_frame_index(a->snap, k->first + j);
      if ((a->fflags[f] & (ATTR_F_SKIP | ATTR_F_PYTHON)) == ATTR_F_SKIP) continue;
      if (any) attr_put(&b, ";", 1);
      attr_put_frame(a, &b, f, ':');
      any = true;
    }
    if (!any) attr_put(&b, "<no frame>", 10);
  }
  buf[b.len < cap ? b.len : cap - 1] = 0;
  return b.len;
}

/* ---- rows ---------------------------------------------------------------------------------- */

typedef struct attr_item_s {
  uint64_t key;
  uint64_t bytes, blocks;
  uint64_t cat_bytes[MS_CAT_COUNT];
  uint32_t stack;      /* the stack of the most bytes so far */
  uint64_t stack_bytes;
  size_t str;          /* offset of the key text */
  const char *text;    /* the key text (once every text is written) */
} attr_item_t;

static int attr_key_cmp(const void *x, const void *y) {
  const attr_item_t *a = x, *b = y;
  return a->key < b->key ? -1 : a->key > b->key;
}

static int attr_str_cmp(const void *x, const void *y) {
  const attr_item_t *a = x, *b = y;
  return strcmp(a->text, b->text);
}

static int attr_row_cmp(const void *x, const void *y) {
  const ms_attr_row_t *a = x, *b = y;
  if (a->bytes != b->bytes) return a->bytes > b->bytes ? -1 : 1;
  if (a->blocks != b->blocks) return a->blocks > b->blocks ? -1 : 1;
  return strcmp(a->key, b->key);
}

static void attr_merge(attr_item_t *into, const attr_item_t *it) {
  into->bytes += it->bytes;
  into->blocks += it->blocks;
  for (int c = 0; c < MS_CAT_COUNT; c++) into->cat_bytes[c] += it->cat_bytes[c];
  if (it->stack_bytes > into->stack_bytes) {
    into->stack = it->stack;
    into->stack_bytes = it->stack_bytes;
  }
}

/* Sorts items by key and merges equal keys; @return the number left. */
static size_t attr_merge_keys(attr_item_t *it, size_t n) {
  qsort(it, n, sizeof *it, attr_key_cmp);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m > 0 && it[m - 1].key == it[i].key)
      attr_merge(&it[m - 1], &it[i]);
    else
      it[m++] = it[i];
  }
  return m;
}

/* The key texts of items into one buffer (*strings, offsets in items[i].str). */
static int attr_texts(const ms_attr_t *a, ms_attr_by by, attr_item_t *it, size_t n,
                      char **strings) {
  size_t cap = 4096, len = 0;
  char *s = malloc(cap);
  if (!s) return MS_ENOMEM;
  for (size_t i = 0; i < n; i++) {
    for (;;) {
      size_t room = cap - len, need;
      if (by == MS_ATTR_BY_CATEGORY)
        need = (size_t)snprintf(s + len, room, "%s", ms_category_name((ms_category)it[i].key));
      else if (by == MS_ATTR_BY_SOURCE)
        need = attr_fmt_key(a, (uint32_t)(it[i].key >> 32), (uint32_t)it[i].key, s + len, room);
      else
        need = attr_fmt_stack(a, (uint32_t)it[i].key, s + len, room);
      if (need < room) {
        it[i].str = len;
        len += need + 1;
        break;
      }
      size_t ncap = cap * 2 > len + need + 1 ? cap * 2 : len + need + 1;
      char *ns = realloc(s, ncap);
      if (!ns) {
        free(s);
        return MS_ENOMEM;
      }
      s = ns;
      cap = ncap;
    }
  }
  *strings = s;
  return MS_OK;
}

/* The allocated blocks of st in segments that pass filter, as items keyed by `by`. */
static int attr_items(const ms_attr_t *a, const ms_tl_state_t *st, const ms_tl_filter_t *filter,
                      ms_attr_by by, attr_item_t **out, size_t *nout) {
  attr_item_t *it = calloc(st->nblocks + MS_CAT_COUNT, sizeof *it);
  if (!it) return MS_ENOMEM;
  size_t n = 0, k = 0;
  if (by == MS_ATTR_BY_CATEGORY) /* every category has a row */
    for (int c = 0; c < MS_CAT_COUNT; c++) {
      it[n].key = (uint64_t)c;
      it[n++].stack = MS_SNAP_NO_STACK;
    }
  for (size_t g = 0; g < st->nsegments; g++) {
    const ms_tl_segment_t *seg = &st->segments[g];
    uint64_t end = seg->address + seg->size;
    for (; k < st->nblocks && st->blocks[k].address < end; k++) {
      const ms_tl_block_t *b = &st->blocks[k];
      if (b->address < seg->address || b->state != MS_BLOCK_ACTIVE_ALLOCATED) continue;
      if (!tl_filter_keeps(filter, seg)) continue;
      ms_category c = ms_attr_block_category(a, st->device, b);
      attr_item_t x;
      memset(&x, 0, sizeof x);
      uint32_t stack = ms__attr_block_stack(a, st->device, b);
      x.bytes = x.stack_bytes = b->size;
      x.blocks = 1;
      x.cat_bytes[c] = b->size;
      x.stack = stack == ATTR_STACK_UNRECORDED ? MS_SNAP_NO_STACK : stack;
      if (by == MS_ATTR_BY_CATEGORY) {
        x.key = (uint64_t)c;
        x.stack = MS_SNAP_NO_STACK;
        x.stack_bytes = 0;
      } else if (by == MS_ATTR_BY_SOURCE) {
        uint32_t src, op;
        attr_src_of(a, stack, &src, &op);
        x.key = (uint64_t)src << 32 | op;
      } else {
        x.key = stack;
      }
      it[n++] = x;
    }
  }
  *out = it;
  *nout = n;
  return MS_OK;
}

int ms_attr_aggregate_state(const ms_attr_t *a, const ms_tl_state_t *st,
                            const ms_tl_filter_t *filter, ms_attr_by by, ms_attr_rows_t *out) {
  if (by != MS_ATTR_BY_CATEGORY && by != MS_ATTR_BY_SOURCE && by != MS_ATTR_BY_STACK)
    return MS_EINVAL;
  if (by == MS_ATTR_BY_SOURCE) MS_FORWARD_IF_ERROR(ms__attr_sources_ready(a));
  attr_item_t *it;
  size_t n;
  MS_FORWARD_IF_ERROR(attr_items(a, st, filter, by, &it, &n));
  n = attr_merge_keys(it, n);
  char *strings = NULL;
  int rc = attr_texts(a, by, it, n, &strings);
  if (rc != MS_OK) {
    free(it);
    return rc;
  }
  /* keys that differ but read the same (two frames of one line) are one row */
  for (size_t i = 0; i < n; i++) it[i].text = strings + it[i].str;
  qsort(it, n, sizeof *it, attr_str_cmp);
  size_t m = 0;
  for (size_t i = 0; i < n; i++) {
    if (m > 0 && strcmp(it[m - 1].text, it[i].text) == 0)
      attr_merge(&it[m - 1], &it[i]);
    else
      it[m++] = it[i];
  }
  ms_attr_row_t *rows = malloc((m ? m : 1) * sizeof *rows);
  if (!rows) {
    free(it);
    free(strings);
    return MS_ENOMEM;
  }
  uint64_t tb = 0, tn = 0;
  for (size_t i = 0; i < m; i++) {
    rows[i].key = it[i].text;
    rows[i].bytes = it[i].bytes;
    rows[i].blocks = it[i].blocks;
    rows[i].stack = it[i].stack;
    ms_category best = MS_CAT_UNKNOWN;
    for (int c = 0; c < MS_CAT_COUNT; c++)
      if (it[i].cat_bytes[c] > it[i].cat_bytes[best]) best = (ms_category)c;
    rows[i].category = by == MS_ATTR_BY_CATEGORY ? (ms_category)it[i].key : best;
    tb += it[i].bytes;
    tn += it[i].blocks;
  }
  free(it);
  qsort(rows, m, sizeof *rows, attr_row_cmp);
  out->rows = rows;
  out->nrows = m;
  out->total_bytes = tb;
  out->total_blocks = tn;
  out->strings_ = strings;
  return MS_OK;
}

int ms_attr_aggregate(const ms_attr_t *a, size_t dev, size_t step, const ms_tl_filter_t *filter,
                      ms_attr_by by, ms_attr_rows_t *out) {
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int rc = ms_timeline_state_at(a->tl, dev, step, &st);
  if (rc == MS_OK) rc = ms_attr_aggregate_state(a, &st, filter, by, out);
  ms_timeline_state_release(&st);
  return rc;
}

void ms_attr_rows_free(ms_attr_rows_t *r) {
  if (!r) return;
  free(r->rows);
  free(r->strings_);
  memset(r, 0, sizeof *r);
}
