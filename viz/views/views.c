/* SPDX-License-Identifier: MIT
 * memsnap viz: snapshot views (memsnap/views.h), a line-for-line port of `_memory_viz.py`'s
 * `_write_blocks`, `_frames_fmt`, `_frame_filter`, `segments`, `memory` and `compare`
 * (docs/cli.md, `memory` and `segments`, `compare`).
 *
 * Each frame of the snapshot is formatted and filtered at most once per view (a per-frame cache),
 * so a view costs one pass over the blocks plus one formatting per distinct frame.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/views.h"

/* ---- PyTorch's frame filter and format --------------------------------------------------------
 */

static const char *const views_omit_functions[] = {
    "unwind::unwind",    "CapturedTraceback::gather",
    "gather_with_cpp",   "_start",
    "__libc_start_main", "PyEval_",
    "PyObject_",         "PyFunction_",
};
static const char *const views_omit_filenames[] = {
    "core/boxing",
    "/Register",
    "/Redispatch",
    "pythonrun.c",
    "Modules/main.c",
    "Objects/call.c",
    "Objects/methodobject.c",
    "pycore_ceval.h",
    "ceval.c",
    "cpython/abstract.h",
};

bool ms_view_frame_kept(const char *name, const char *filename) {
  for (size_t i = 0; i < sizeof views_omit_functions / sizeof *views_omit_functions; i++)
    if (strstr(name, views_omit_functions[i])) return false;
  for (size_t i = 0; i < sizeof views_omit_filenames / sizeof *views_omit_filenames; i++)
    if (strstr(filename, views_omit_filenames[i])) return false;
  return true;
}

size_t ms_view_frame_format(char *buf, size_t cap, const ms_snap_frame_t *f) {
  const char *slash = strrchr(f->filename, '/');
  const char *base = slash ? slash + 1 : f->filename;
  char line[32];
  int ln = snprintf(line, sizeof line, "%" PRId64, f->line);
  size_t nb = strlen(base), nn = strlen(f->name), nl = (size_t)ln;
  size_t need = nb + 1 + nl + 1 + nn;
  if (cap > 0) {
    size_t pos = 0;
    const char *parts[5] = {base, ":", line, ":", f->name};
    size_t lens[5] = {nb, 1, nl, 1, nn};
    for (int i = 0; i < 5 && pos < cap - 1; i++) {
      size_t n = lens[i] < cap - 1 - pos ? lens[i] : cap - 1 - pos;
      memcpy(buf + pos, parts[i], n);
      pos += n;
    }
    buf[pos] = 0;
  }
  return need;
}

/* ---- the walk -----------------------------------------------------------------------------------
 */

enum { VIEWS_UNKNOWN = 0, VIEWS_KEPT = 1, VIEWS_FILTERED = 2 };

typedef struct views_walk_s {
  const ms_snapshot_t *snap;
  ms_view_emit_fn *emit;
  void *ctx;
  char **fmt;         /* per frame: formatted text (owned), valid when state is VIEWS_KEPT */
  uint8_t *fstate;    /* per frame: VIEWS_* */
  const char **stack; /* scratch: the stack being emitted */
  size_t cap;
  size_t nprefix; /* frames of the current prefix (only_*, stream, seg) */
  char stream_buf[32];
  char seg_buf[32];
} views_walk_t;

static int views_walk_init(views_walk_t *w, const ms_snapshot_t *snap, ms_view_emit_fn *emit,
                           void *ctx) {
  memset(w, 0, sizeof *w);
  w->snap = snap;
  w->emit = emit;
  w->ctx = ctx;
  size_t n = snap->nframes ? snap->nframes : 1;
  w->fmt = calloc(n, sizeof *w->fmt);
  w->fstate = calloc(n, 1);
  w->cap = 64;
  w->stack = malloc(w->cap * sizeof *w->stack);
  if (!w->fmt || !w->fstate || !w->stack) return MS_ENOMEM;
  return MS_OK;
}

static void views_walk_release(views_walk_t *w) {
  if (w->fmt)
    for (size_t i = 0; i < w->snap->nframes; i++) free(w->fmt[i]);
  free(w->fmt);
  free(w->fstate);
  free(w->stack);
}

static int views_reserve(views_walk_t *w, size_t need) {
  if (need <= w->cap) return MS_OK;
  size_t ncap = w->cap;
  while (ncap < need) {
    if (ncap > SIZE_MAX / 2 / sizeof *w->stack) return MS_ENOMEM;
    ncap *= 2;
  }
  const char **p = realloc(w->stack, ncap * sizeof *p);
  if (!p) return MS_ENOMEM;
  w->stack = p;
  w->cap = ncap;
  return MS_OK;
}

/* Formats (once) and filters frame fi; @return its text or NULL when filtered; *err on ENOMEM. */
static const char *views_frame(views_walk_t *w, uint32_t fi, int *err) {
  if (w->fstate[fi] == VIEWS_UNKNOWN) {
    const ms_snap_frame_t *f = &w->snap->frames[fi];
    if (!ms_view_frame_kept(f->name, f->filename)) {
      w->fstate[fi] = VIEWS_FILTERED;
    } else {
      size_t need = ms_view_frame_format(NULL, 0, f);
      char *s = malloc(need + 1);
      if (!s) {
        *err = MS_ENOMEM;
        return NULL;
      }
      ms_view_frame_format(s, need + 1, f);
      w->fmt[fi] = s;
      w->fstate[fi] = VIEWS_KEPT;
    }
  }
  return w->fstate[fi] == VIEWS_KEPT ? w->fmt[fi] : NULL;
}

/* Emits prefix;state;FRAMES(stack) count, where FRAMES is `frames_fragment` of _write_blocks. */
static int views_emit_stack(views_walk_t *w, const char *state, uint32_t stack, uint64_t count) {
  size_t depth = ms_snap_stack_depth(w->snap, stack);
  int err = views_reserve(w, w->nprefix + 2 + depth);
  if (err) return err;
  size_t n = w->nprefix;
  w->stack[n++] = state;
  if (depth == 0) {
    w->stack[n++] = "<non-python>";
  } else {
    size_t before = n;
    for (size_t i = depth; i-- > 0;) {
      uint32_t fi = ms_snap_frame_index(w->snap, w->snap->stacks[stack].first + i);
      const char *s = views_frame(w, fi, &err);
      if (err) return err;
      if (s) w->stack[n++] = s;
    }
    if (n == before) w->stack[n++] = ""; /* every frame filtered: PyTorch writes "state; n" */
  }
  return w->emit(w->ctx, w->stack, n, count);
}

static int views_emit_pseudo(views_walk_t *w, const char *state, const char *what, uint64_t count) {
  int err = views_reserve(w, w->nprefix + 2);
  if (err) return err;
  w->stack[w->nprefix] = state;
  w->stack[w->nprefix + 1] = what;
  return w->emit(w->ctx, w->stack, w->nprefix + 2, count);
}

static const char *views_state_name(const ms_snap_block_t *b) {
  if (b->state_name && b->state_name[0]) return b->state_name;
  return ms_block_state_name(b->state);
}

/* `_write_blocks` for one block. */
static int views_block(views_walk_t *w, const ms_snap_block_t *b) {
  const ms_snapshot_t *s = w->snap;
  const char *state = views_state_name(b);
  uint64_t accounted = 0;
  bool overflow = false;
  int err;
  if (b->present & MS_BLOCK_HAS_HISTORY) {
    for (uint32_t i = 0; i < b->nhistory; i++) {
      const ms_snap_history_t *h = &s->history[b->first_history + i];
      if (h->real_size > UINT64_MAX - accounted) overflow = true;
      accounted += h->real_size;
      if (h->present & MS_HIST_HAS_FRAMES)
        err = views_emit_stack(w, state, h->stack, h->real_size);
      else
        err = views_emit_pseudo(w, state, "<no-context>", h->real_size);
      if (err) return err;
    }
  } else if ((b->present & MS_BLOCK_HAS_FRAMES) || b->stack != MS_SNAP_NO_STACK) {
    /* frames era: b["frames"], b["requested_size"] */
    accounted = (b->present & MS_BLOCK_HAS_REQUESTED_SIZE) || s->origin == MS_SNAP_ORIGIN_MEMSNAP
                    ? b->requested_size
                    : b->size;
    err = views_emit_stack(w, state, b->stack, accounted);
    if (err) return err;
  } else {
    /* legacy block without history: b.get("requested_size", b["size"]) and no frames */
    accounted = (b->present & MS_BLOCK_HAS_REQUESTED_SIZE) || s->origin == MS_SNAP_ORIGIN_MEMSNAP
                    ? b->requested_size
                    : b->size;
    err = views_emit_pseudo(w, state, "<non-python>", accounted);
    if (err) return err;
  }
  /* gaps = size - accounted; a negative gap is left out (flamegraph.pl drops it) */
  if (!overflow && accounted < b->size)
    return views_emit_pseudo(w, state, "<gaps>", b->size - accounted);
  return MS_OK;
}

static int views_segment(views_walk_t *w, const ms_snap_segment_t *seg, const char *only,
                         bool with_seg) {
  size_t n = 0;
  if (only) w->stack[n++] = only;
  snprintf(w->stream_buf, sizeof w->stream_buf, "stream_%" PRIu64, seg->stream);
  w->stack[n++] = w->stream_buf;
  if (with_seg) {
    snprintf(w->seg_buf, sizeof w->seg_buf, "seg_%" PRIu64, seg->address);
    w->stack[n++] = w->seg_buf;
  }
  w->nprefix = n;
  for (uint32_t i = 0; i < seg->nblocks; i++) {
    int err = views_block(w, ms_snap_segment_block(w->snap, seg, i));
    if (err) return err;
  }
  return MS_OK;
}

int ms_view_emit(const ms_snapshot_t *snap, ms_view_kind kind, ms_view_emit_fn *emit, void *ctx) {
  views_walk_t w;
  int err = views_walk_init(&w, snap, emit, ctx);
  for (size_t i = 0; err == MS_OK && i < snap->nsegments; i++)
    err = views_segment(&w, &snap->segments[i], NULL, kind == MS_VIEW_SEGMENTS);
  views_walk_release(&w);
  return err;
}

/* ---- compare
 * -------------------------------------------------------------------------------------- */

typedef struct views_key_s {
  uint64_t address;
  uint64_t size;
} views_key_t;

static int views_key_cmp(const void *a, const void *b) {
  const views_key_t *x = a, *y = b;
  if (x->address != y->address) return x->address < y->address ? -1 : 1;
  if (x->size != y->size) return x->size < y->size ? -1 : 1;
  return 0;
}

/* Sorted, deduplicated keys of snap's segments in *out (caller frees). */
static int views_keys(const ms_snapshot_t *snap, views_key_t **out, size_t *n) {
  views_key_t *k = malloc((snap->nsegments ? snap->nsegments : 1) * sizeof *k);
  if (!k) return MS_ENOMEM;
  for (size_t i = 0; i < snap->nsegments; i++)
    k[i] = (views_key_t){snap->segments[i].address, snap->segments[i].total_size};
  qsort(k, snap->nsegments, sizeof *k, views_key_cmp);
  size_t m = 0;
  for (size_t i = 0; i < snap->nsegments; i++)
    if (m == 0 || views_key_cmp(&k[m - 1], &k[i]) != 0) k[m++] = k[i];
  *out = k;
  *n = m;
  return MS_OK;
}

static bool views_has_key(const views_key_t *keys, size_t n, const ms_snap_segment_t *seg) {
  views_key_t k = {seg->address, seg->total_size};
  return bsearch(&k, keys, n, sizeof k, views_key_cmp) != NULL;
}

/* Addresses of keys in a and not in b (both sorted). */
static int views_minus(const views_key_t *a, size_t na, const views_key_t *b, size_t nb,
                       uint64_t **out, size_t *nout) {
  uint64_t *r = malloc((na ? na : 1) * sizeof *r);
  if (!r) return MS_ENOMEM;
  size_t m = 0;
  for (size_t i = 0; i < na; i++)
    if (!bsearch(&a[i], b, nb, sizeof *b, views_key_cmp)) r[m++] = a[i].address;
  *out = r;
  *nout = m;
  return MS_OK;
}

int ms_view_segdiff(const ms_snapshot_t *before, const ms_snapshot_t *after,
                    ms_view_segdiff_t *out) {
  views_key_t *kb = NULL, *ka = NULL;
  size_t nb = 0, na = 0;
  ms_view_segdiff_t d = {0};
  int err = views_keys(before, &kb, &nb);
  if (!err) err = views_keys(after, &ka, &na);
  if (!err) err = views_minus(kb, nb, ka, na, &d.only_before, &d.n_before);
  if (!err) err = views_minus(ka, na, kb, nb, &d.only_after, &d.n_after);
  free(kb);
  free(ka);
  if (err) {
    ms_view_segdiff_release(&d);
    return err;
  }
  *out = d;
  return MS_OK;
}

void ms_view_segdiff_release(ms_view_segdiff_t *d) {
  if (!d) return;
  free(d->only_before);
  free(d->only_after);
  d->only_before = d->only_after = NULL;
  d->n_before = d->n_after = 0;
}

static int views_compare_side(const ms_snapshot_t *snap, const views_key_t *other, size_t nother,
                              const char *only, ms_view_emit_fn *emit, void *ctx) {
  views_walk_t w;
  int err = views_walk_init(&w, snap, emit, ctx);
  for (size_t i = 0; err == MS_OK && i < snap->nsegments; i++)
    if (!views_has_key(other, nother, &snap->segments[i]))
      err = views_segment(&w, &snap->segments[i], only, true);
  views_walk_release(&w);
  return err;
}

int ms_view_compare_emit(const ms_snapshot_t *before, const ms_snapshot_t *after,
                         ms_view_emit_fn *emit, void *ctx) {
  views_key_t *kb = NULL, *ka = NULL;
  size_t nb = 0, na = 0;
  int err = views_keys(before, &kb, &nb);
  if (!err) err = views_keys(after, &ka, &na);
  if (!err) err = views_compare_side(before, ka, na, "only_before", emit, ctx);
  if (!err) err = views_compare_side(after, kb, nb, "only_after", emit, ctx);
  free(kb);
  free(ka);
  return err;
}

/* ---- folded text
 * ---------------------------------------------------------------------------------- */

int ms_view_folded_emit(void *ctx, const char *const *frames, size_t nframes, uint64_t count) {
  ms_sink_t *sink = ctx;
  int err;
  for (size_t i = 0; i < nframes; i++) {
    if (i > 0 && (err = sink->write(sink->ctx, ";", 1)) != 0) return err;
    if ((err = sink->write(sink->ctx, frames[i], strlen(frames[i]))) != 0) return err;
  }
  char num[32];
  int n = snprintf(num, sizeof num, " %" PRIu64 "\n", count);
  return sink->write(sink->ctx, num, (size_t)n);
}
