/* SPDX-License-Identifier: MIT
 * memsnap exports: a pprof profile (issue #17 §2): profile.proto
 * (github.com/google/pprof/proto/profile.proto) written by a small protobuf encoder (varints,
 * length-delimited submessages, packed repeated fields: the four wire rules the schema needs),
 * gzipped through the zlib sink (snapshot/zio.h), as `go tool pprof` reads it.
 *
 * Mapping: one sample per allocation stack with four values in Go's heap-profile order,
 * alloc_objects (count), alloc_space (bytes), inuse_objects (count), inuse_space (bytes), the
 * default being inuse_space; a Location and a Function per frame of the snapshot (name, file,
 * line), a sample's locations innermost first as pprof wants; a stack-less allocation is the
 * one location "<no stack recorded>". inuse_* count the blocks allocated at the chosen step (what
 * `memsnap top --at` counts), alloc_* every `alloc` entry of the device's trace with its
 * requested size. Each sample carries two labels (issue #27, memsnap/attribution.h): `source`
 * (the user's own line) and `category`; a stack whose blocks fall in several categories has a
 * sample per category.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "attribution/internal.h"
#include "common/hash.h"
#include "common/internal.h"
#include "export/internal.h"
#include "memsnap/export.h"
#include "snapshot/zio.h"

/* profile.proto field numbers */
enum {
  PB_PROFILE_SAMPLE_TYPE = 1,
  PB_PROFILE_SAMPLE = 2,
  PB_PROFILE_LOCATION = 4,
  PB_PROFILE_FUNCTION = 5,
  PB_PROFILE_STRING_TABLE = 6,
  PB_PROFILE_DROP_FRAMES = 7,
  PB_PROFILE_TIME_NANOS = 9,
  PB_PROFILE_DURATION_NANOS = 10,
  PB_PROFILE_PERIOD_TYPE = 11,
  PB_PROFILE_PERIOD = 12,
  PB_PROFILE_COMMENT = 13,
  PB_PROFILE_DEFAULT_SAMPLE_TYPE = 14,
};

enum { PB_VARINT = 0, PB_LEN = 2 };

/* profile.drop_frames, a regular expression matched against whole function names (RE2). */
#define PP_DROP_FRAMES \
  ".*(unwind::unwind|CapturedTraceback::gather|gather_with_cpp|CUDACachingAllocator::).*"


static void pb_varint(ms__xbuf_t *b, uint64_t v) {
  char tmp[10];
  size_t n = 0;
  do {
    tmp[n++] = (char)((v & 0x7f) | (v >= 0x80 ? 0x80 : 0));
    v >>= 7;
  } while (v);
  ms__xbuf_put(b, tmp, n);
}

static void pb_key(ms__xbuf_t *b, unsigned field, unsigned wire) {
  pb_varint(b, (uint64_t)field << 3 | wire);
}

/* An int64/uint64 field (int64 is written as its two's-complement uint64, as protobuf does). */
static void pb_int(ms__xbuf_t *b, unsigned field, uint64_t v) {
  if (v == 0) return; /* proto3 default */
  pb_key(b, field, PB_VARINT);
  pb_varint(b, v);
}

static void pb_bytes(ms__xbuf_t *b, unsigned field, const void *p, size_t n) {
  pb_key(b, field, PB_LEN);
  pb_varint(b, n);
  ms__xbuf_put(b, p, n);
}

/* A submessage built in tmp, appended to b as field. */
static void pb_sub(ms__xbuf_t *b, unsigned field, ms__xbuf_t *tmp) {
  pb_bytes(b, field, tmp->ptr ? tmp->ptr : "", tmp->len);
  if (tmp->oom) b->oom = true;
  tmp->len = 0;
}

/* ---- the string table ----------------------------------------------------------------------- */

typedef struct pp_strings_s {
  const char **keys; /* open addressing, by content */
  int64_t *ids;
  size_t cap, n;
  ms__xbuf_t *out; /* the profile: each new string is written as a string_table field */
  ms__xbuf_t fix;  /* a string that is not valid UTF-8, made valid (string_table is UTF-8) */
} pp_strings_t;

static uint64_t pp_hash(const char *s) {
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static int pp_strings_init(pp_strings_t *t, size_t expect, ms__xbuf_t *out) {
  memset(t, 0, sizeof t[0]);
  t->cap = 64;
  while (t->cap < expect * 2 + 16) t->cap *= 2;
  t->keys = calloc(t->cap, sizeof *t->keys);
  t->ids = calloc(t->cap, sizeof *t->ids);
  t->out = out;
  if (!t->keys || !t->ids) return MS_ENOMEM;
  pb_bytes(out, PB_PROFILE_STRING_TABLE, "", 0); /* string_table[0] = "" */
  t->n = 1;
  return MS_OK;
}

static void pp_strings_release(pp_strings_t *t) {
  free(t->keys);
  free(t->ids);
  ms__xbuf_release(&t->fix);
}

/* The index of s in the string table, adding it. -1 when out of memory. */
static int64_t pp_str(pp_strings_t *t, const char *s) {
  if (!*s) return 0;
  if ((t->n + 1) * 2 > t->cap) {
    size_t ncap = t->cap * 2;
    const char **nk = calloc(ncap, sizeof *nk);
    int64_t *ni = calloc(ncap, sizeof *ni);
    if (!nk || !ni) {
      free(nk);
      free(ni);
      return -1;
    }
    for (size_t i = 0; i < t->cap; i++) {
      if (!t->keys[i]) continue;
      size_t j = pp_hash(t->keys[i]) & (ncap - 1);
      while (nk[j]) j = (j + 1) & (ncap - 1);
      nk[j] = t->keys[i];
      ni[j] = t->ids[i];
    }
    free(t->keys);
    free(t->ids);
    t->keys = nk;
    t->ids = ni;
    t->cap = ncap;
  }
  size_t j = pp_hash(s) & (t->cap - 1);
  while (t->keys[j]) {
    if (strcmp(t->keys[j], s) == 0) return t->ids[j];
    j = (j + 1) & (t->cap - 1);
  }
  t->keys[j] = s;
  t->ids[j] = (int64_t)t->n;
  if (ms__utf8_valid(s)) {
    pb_bytes(t->out, PB_PROFILE_STRING_TABLE, s, strlen(s));
  } else { /* invalid sequences as U+FFFD, as the JSON outputs write them */
    t->fix.len = 0;
    ms__xbuf_utf8(&t->fix, s);
    if (t->fix.oom) return -1;
    pb_bytes(t->out, PB_PROFILE_STRING_TABLE, t->fix.ptr, t->fix.len);
  }
  return (int64_t)t->n++;
}

/* ---- the profile ---------------------------------------------------------------------------- */

typedef struct pp_sample_s {
  uint64_t key;  /* stack (nstacks: no stack recorded) * MS_CAT_COUNT + category, + 1 (0: empty) */
  int64_t v[4];  /* alloc_objects, alloc_space, inuse_objects, inuse_space */
} pp_sample_t;

/* The samples by (stack, category): open addressing over a power-of-two table. */
typedef struct pp_samples_s {
  pp_sample_t *t;
  size_t cap, n;
} pp_samples_t;

static pp_sample_t *pp_sample(pp_samples_t *m, size_t stack, ms_category c) {
  if ((m->n + 1) * 2 > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 1024;
    pp_sample_t *nt = calloc(ncap, sizeof *nt);
    if (!nt) return NULL;
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->t[i].key) continue;
      size_t j = ms_hash_u64(m->t[i].key) & (ncap - 1);
      while (nt[j].key) j = (j + 1) & (ncap - 1);
      nt[j] = m->t[i];
    }
    free(m->t);
    m->t = nt;
    m->cap = ncap;
  }
  uint64_t key = (uint64_t)stack * MS_CAT_COUNT + (uint64_t)c + 1;
  size_t j = ms_hash_u64(key) & (m->cap - 1);
  while (m->t[j].key && m->t[j].key != key) j = (j + 1) & (m->cap - 1);
  if (!m->t[j].key) {
    m->t[j].key = key;
    m->n++;
  }
  return &m->t[j];
}

static int pp_sample_cmp(const void *x, const void *y) {
  const pp_sample_t *a = x, *b = y;
  return a->key < b->key ? -1 : a->key > b->key;
}

/* The samples' values: alloc_* of every alloc entry (with its lifetime's category), inuse_* of
 * the blocks allocated at step. */
static int pp_gather(const ms_timeline_t *tl, const ms_attr_t *attr, size_t dev, size_t step,
                     pp_samples_t *m, size_t nstacks) {
  size_t n = ms_timeline_nentries(tl, dev);
  /* each alloc's category needs its free entry: the pair the index made */
  for (size_t i = 0; i < n; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (e->action != MS_TRACE_ALLOC) continue;
    size_t k = e->stack < nstacks ? e->stack : nstacks;
    pp_sample_t *s = pp_sample(m, k, ms__attr_entry_category(attr, dev, i));
    if (!s) return MS_ENOMEM;
    s->v[0] += 1;
    s->v[1] += (int64_t)e->size;
  }
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int err = ms_timeline_state_at(tl, dev, step, &st);
  if (err == MS_OK) {
    const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
    for (size_t i = 0; i < st.nblocks && err == MS_OK; i++) {
      const ms_tl_block_t *b = &st.blocks[i];
      if (b->state != MS_BLOCK_ACTIVE_ALLOCATED) continue;
      uint32_t stack = b->stack;
      if ((b->flags & MS_TL_BLOCK_FROM_SNAPSHOT) && b->snap_block < snap->nblocks) {
        const ms_snap_block_t *sb = &snap->blocks[b->snap_block];
        stack = sb->stack;
        if (stack == MS_SNAP_NO_STACK && sb->nhistory > 0 && sb->first_history < snap->nhistory)
          stack = snap->history[sb->first_history].stack;
      }
      size_t k = stack < nstacks ? stack : nstacks;
      pp_sample_t *s = pp_sample(m, k, ms_attr_block_category(attr, dev, b));
      if (!s) {
        err = MS_ENOMEM;
        break;
      }
      s->v[2] += 1;
      s->v[3] += (int64_t)b->size;
    }
  }
  ms_timeline_state_release(&st);
  return err;
}

static void pp_value_type(ms__xbuf_t *b, ms__xbuf_t *tmp, unsigned field, int64_t type,
                          int64_t unit) {
  pb_int(tmp, 1, (uint64_t)type);
  pb_int(tmp, 2, (uint64_t)unit);
  pb_sub(b, field, tmp);
}

/* The header: sample types, period, comment. @return MS_OK or MS_ENOMEM. */
static int pp_header(ms__xbuf_t *b, ms__xbuf_t *tmp, pp_strings_t *strs, const char *comment) {
  static const char *const types[4][2] = {{"alloc_objects", "count"},
                                          {"alloc_space", "bytes"},
                                          {"inuse_objects", "count"},
                                          {"inuse_space", "bytes"}};
  for (int i = 0; i < 4; i++) {
    int64_t t = pp_str(strs, types[i][0]), u = pp_str(strs, types[i][1]);
    if (t < 0 || u < 0) return MS_ENOMEM;
    pp_value_type(b, tmp, PB_PROFILE_SAMPLE_TYPE, t, u);
  }
  int64_t space = pp_str(strs, "space"), bytes = pp_str(strs, "bytes"),
          inuse = pp_str(strs, "inuse_space"), c = pp_str(strs, comment);
  if (space < 0 || bytes < 0 || inuse < 0 || c < 0) return MS_ENOMEM;
  pp_value_type(b, tmp, PB_PROFILE_PERIOD_TYPE, space, bytes);
  pb_int(b, PB_PROFILE_PERIOD, 1);
  pb_int(b, PB_PROFILE_COMMENT, (uint64_t)c);
  pb_int(b, PB_PROFILE_DEFAULT_SAMPLE_TYPE, (uint64_t)inuse);
  /* The allocator's own frames at the leaf of PyTorch's stacks (the unwinder and the caching
   * allocator), which pprof drops with everything below them, as Go's heap profiles drop
   * runtime.mallocgc: the leaf shown is then the operator that asked for memory. */
  int64_t drop = pp_str(strs, PP_DROP_FRAMES);
  if (drop < 0) return MS_ENOMEM;
  pb_int(b, PB_PROFILE_DROP_FRAMES, (uint64_t)drop);
  return MS_OK;
}

/* Functions and locations: one each per frame (ids frame + 1), and id nframes + 1 for
 * "<no stack recorded>". */
static int pp_locations(ms__xbuf_t *b, ms__xbuf_t *tmp, pp_strings_t *strs,
                        const ms_snapshot_t *snap) {
  for (size_t f = 0; f <= snap->nframes; f++) {
    const char *name = f < snap->nframes ? snap->frames[f].name : "<no stack recorded>";
    const char *file = f < snap->nframes ? snap->frames[f].filename : "";
    int64_t ni = pp_str(strs, name[0] ? name : "<unnamed>"), fi = pp_str(strs, file);
    if (ni < 0 || fi < 0) return MS_ENOMEM;
    pb_int(tmp, 1, f + 1);           /* Function.id */
    pb_int(tmp, 2, (uint64_t)ni);    /* name */
    /* no system_name: pprof "demangles" a function whose name equals its system_name, and its
     * simplifier drops whatever lies between angle brackets, so that Python's <module> became
     * <unknown> and merged with every other <...> (issue #31). The names are never mangled. */
    pb_int(tmp, 4, (uint64_t)fi);    /* filename */
    pb_sub(b, PB_PROFILE_FUNCTION, tmp);
  }
  ms__xbuf_t line = {0};
  for (size_t f = 0; f <= snap->nframes; f++) {
    int64_t ln = f < snap->nframes ? snap->frames[f].line : 0;
    pb_int(&line, 1, f + 1);        /* Line.function_id */
    pb_int(&line, 2, (uint64_t)ln); /* Line.line */
    pb_int(tmp, 1, f + 1);          /* Location.id */
    pb_sub(tmp, 4, &line);          /* Location.line */
    pb_sub(b, PB_PROFILE_LOCATION, tmp);
  }
  bool oom = line.oom;
  ms__xbuf_release(&line);
  return oom ? MS_ENOMEM : MS_OK;
}

/* A Label {key, str} of a sample. */
static void pp_label(ms__xbuf_t *tmp, ms__xbuf_t *lab, int64_t key, int64_t str) {
  pb_int(lab, 1, (uint64_t)key);
  pb_int(lab, 2, (uint64_t)str);
  pb_sub(tmp, 3, lab); /* Sample.label */
}

static int pp_samples(ms__xbuf_t *b, ms__xbuf_t *tmp, pp_strings_t *strs, const ms_attr_t *attr,
                      const ms_snapshot_t *snap, pp_samples_t *m, size_t nstacks) {
  /* in (stack, category) order, so that the profile is the same from run to run */
  size_t n = 0;
  for (size_t i = 0; i < m->cap; i++)
    if (m->t[i].key) m->t[n++] = m->t[i];
  if (n) qsort(m->t, n, sizeof *m->t, pp_sample_cmp); /* m->t is NULL when there is none */
  int64_t kcat = pp_str(strs, "category"), ksrc = pp_str(strs, "source");
  if (kcat < 0 || ksrc < 0) return MS_ENOMEM;
  ms__xbuf_t packed = {0}, lab = {0};
  char src[1024];
  for (size_t j = 0; j < n; j++) {
    const pp_sample_t *s = &m->t[j];
    size_t k = (size_t)((s->key - 1) / MS_CAT_COUNT);
    ms_category c = (ms_category)((s->key - 1) % MS_CAT_COUNT);
    uint32_t depth = k < nstacks ? snap->stacks[k].nframes : 0;
    if (depth == 0) {
      pb_varint(&packed, snap->nframes + 1);
    } else {
      for (uint32_t i = 0; i < depth; i++)
        pb_varint(&packed, (uint64_t)ms_snap_frame_index(snap, snap->stacks[k].first + i) + 1);
    }
    pb_sub(tmp, 1, &packed); /* Sample.location_id, packed */
    for (int i = 0; i < 4; i++) pb_varint(&packed, (uint64_t)s->v[i]);
    pb_sub(tmp, 2, &packed); /* Sample.value, packed */
    ms_attr_source(attr, k < nstacks ? (uint32_t)k : MS_SNAP_NO_STACK, src, sizeof src);
    int64_t vs = pp_str(strs, src), vc = pp_str(strs, ms_category_name(c));
    if (vs < 0 || vc < 0) {
      b->oom = true;
      break;
    }
    pp_label(tmp, &lab, kcat, vc);
    pp_label(tmp, &lab, ksrc, vs);
    pb_sub(b, PB_PROFILE_SAMPLE, tmp);
  }
  if (packed.oom || lab.oom) b->oom = true;
  ms__xbuf_release(&packed);
  ms__xbuf_release(&lab);
  return b->oom ? MS_ENOMEM : MS_OK;
}

/* The times of the device's trace: start and duration in nanoseconds. */
static void pp_times(ms__xbuf_t *b, const ms_timeline_t *tl, size_t dev) {
  size_t n = ms_timeline_nentries(tl, dev);
  int64_t first = 0, last = 0;
  bool any = false;
  for (size_t i = 0; i < n; i++) {
    const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, i);
    if (!(e->present & MS_TRACE_HAS_TIME)) continue;
    if (!any) first = e->time_us;
    last = e->time_us;
    any = true;
  }
  if (!any || first < 0 || first > INT64_MAX / 1000 || last < first) return;
  pb_int(b, PB_PROFILE_TIME_NANOS, (uint64_t)first * 1000);
  if (last - first <= INT64_MAX / 1000)
    pb_int(b, PB_PROFILE_DURATION_NANOS, (uint64_t)(last - first) * 1000);
}

int ms_export_pprof_write(const ms_timeline_t *tl, size_t dev, size_t step, ms_sink_t *sink,
                          ms_errbuf_t *eb) {
  return ms_export_pprof_write_ex(tl, NULL, dev, step, sink, eb);
}

int ms_export_pprof_write_ex(const ms_timeline_t *tl, const ms_attr_t *attr, size_t dev,
                             size_t step, ms_sink_t *sink, ms_errbuf_t *eb) {
  if (dev >= ms_timeline_ndevices(tl) || step > ms_timeline_nentries(tl, dev))
    return ms__errbuf_set(eb, MS_EINVAL, "no device %zu or step %zu", dev, step);
  const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
  size_t nstacks = snap->nstacks;
  pp_samples_t smp = {NULL, 0, 0};
  ms_attr_t *own = NULL;
  if (!attr) {
    int e = ms_attr_create(snap, tl, NULL, &own, eb);
    if (e != MS_OK) return e;
    attr = own;
  }
  int err = pp_gather(tl, attr, dev, step, &smp, nstacks);
  ms__xbuf_t b = {0}, tmp = {0};
  pp_strings_t strs;
  memset(&strs, 0, sizeof strs);
  if (err == MS_OK) err = pp_strings_init(&strs, snap->nframes + 16, &b);
  char comment[160];
  if (step == 0)
    snprintf(comment, sizeof comment, "memsnap: device %zu, inuse_* before trace entry 0", dev);
  else
    snprintf(comment, sizeof comment, "memsnap: device %zu, inuse_* after trace entry %zu", dev,
             step - 1);
  if (err == MS_OK) err = pp_header(&b, &tmp, &strs, comment);
  if (err == MS_OK) err = pp_locations(&b, &tmp, &strs, snap);
  if (err == MS_OK) err = pp_samples(&b, &tmp, &strs, attr, snap, &smp, nstacks);
  if (err == MS_OK) pp_times(&b, tl, dev);
  if (err == MS_OK && (b.oom || tmp.oom)) err = MS_ENOMEM;
  free(smp.t);
  ms_attr_destroy(own);
  pp_strings_release(&strs);
  ms__xbuf_release(&tmp);
  if (err != MS_OK) {
    ms__xbuf_release(&b);
    return ms__errbuf_set(eb, err, "%s", ms_strerror(err));
  }
  ms__zsink_t *z = NULL;
  ms_sink_t zs;
  err = ms__zsink_create(sink, 6, &z, &zs);
  if (err == MS_OK) err = zs.write(zs.ctx, b.ptr, b.len);
  if (err == MS_OK) err = ms__zsink_finish(z);
  ms__zsink_destroy(z);
  ms__xbuf_release(&b);
  if (err != MS_OK) return ms__errbuf_set(eb, err, "cannot write the profile: %s", ms_strerror(err));
  return MS_OK;
}
