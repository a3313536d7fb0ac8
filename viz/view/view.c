/* SPDX-License-Identifier: MIT
 * memsnap viewer: the HTML page (memsnap/view.h). The page is the style, a skeleton, the binary
 * data (gzip, escaped: bin.h), the JSON data and the script (the viewer's scripts, listed in
 * viz/CMakeLists.txt) that draws everything from the data. The page is declared windows-1252,
 * whose decoder gives every byte a character of its own, so the binary elements hold raw bytes;
 * everything else in it is ASCII (writer.h).
 */
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/timeline.h"
#include "memsnap/attribution.h"
#include "memsnap/view.h"
#include "bin.h"
#include "stacks.h"
#include "answer.h"
#include "memory.h"
#include "spool.h"
#include "writer.h"

/* The page's script and style (viz/CMakeLists.txt lists the scripts; view.css), embedded at build time (embed.cmake). */
extern const char ms__view_js[];
extern const size_t ms__view_js_len;
extern const char ms__view_css[];
extern const size_t ms__view_css_len;

void ms_viewer_opts_init(ms_viewer_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->device = SIZE_MAX;
  o->explain = -1;
}

/* FNV-1a over n bytes, then a terminator (so that "ab","c" and "a","bc" differ). */
static uint64_t view_fnv(uint64_t h, const void *p, size_t n) {
  const unsigned char *c = p;
  for (size_t i = 0; i < n; i++) h = (h ^ c[i]) * 0x100000001b3ULL;
  return (h ^ 0xff) * 0x100000001b3ULL;
}

static uint64_t view_fnv_u64(uint64_t h, uint64_t v) { return view_fnv(h, &v, sizeof v); }

static uint64_t view_fnv_str(uint64_t h, const char *s) {
  return s ? view_fnv(view_fnv_u64(h, 1), s, strlen(s)) : view_fnv_u64(h, 0);
}

uint64_t ms_viewer_page_tag(const ms_viewer_opts_t *o) {
  ms_viewer_opts_t def;
  if (!o) {
    ms_viewer_opts_init(&def);
    o = &def;
  }
  uint64_t h = view_fnv_str(0xcbf29ce484222325ULL, ms_version_string());
  h = view_fnv(h, ms__view_js, ms__view_js_len);
  h = view_fnv(h, ms__view_css, ms__view_css_len);
  h = view_fnv_u64(h, (uint64_t)o->device);
  h = view_fnv_str(h, o->view);
  h = view_fnv_str(h, o->title);
  h = view_fnv_u64(h, (uint64_t)(int64_t)o->explain);
  return view_fnv_u64(h, o->timeline_budget_bytes);
}

static int view_no_device(ms_errbuf_t *eb, size_t dev) {
  if (!eb) return MS_EINVAL;
  if (dev == SIZE_MAX)
    snprintf(eb->msg, sizeof eb->msg, "no device has a trace or segments: nothing to show");
  else
    snprintf(eb->msg, sizeof eb->msg, "device %zu has no trace and no segments", dev);
  return MS_EINVAL;
}

static void view_settings(vw_t *w, const ms_snapshot_t *s, size_t first, size_t count) {
  vw_raw(w, "{", 1);
  for (size_t i = 0; i < count && first + i < s->nsettings; i++) {
    const ms_snap_kv_t *kv = &s->settings[first + i];
    if (i) vw_raw(w, ",", 1);
    vw_str(w, kv->key);
    vw_raw(w, ":", 1);
    switch (kv->kind) {
    case MS_SNAP_VAL_BOOL: vw_puts(w, kv->b ? "true" : "false"); break;
    case MS_SNAP_VAL_INT: vw_i64(w, kv->i); break;
    case MS_SNAP_VAL_FLOAT: {
      char b[40];
      snprintf(b, sizeof b, "%.17g", kv->f);
      /* JSON has no inf/nan: write those as strings */
      if (strspn(b, "0123456789+-.e") != strlen(b)) vw_str(w, b);
      else vw_puts(w, b);
      break;
    }
    case MS_SNAP_VAL_STR: vw_str(w, kv->s); break;
    case MS_SNAP_VAL_MAP: view_settings(w, s, kv->first, kv->count); break;
    default: vw_puts(w, "null");
    }
  }
  vw_raw(w, "}", 1);
}

#define VIEW_MAX_POOLS 1024

/* ---- the binary sections ------------------------------------------------------------------ */

/* Whether integers v[0..n) are small enough (|v| <= 2^52) for a delta-coded f64 section to give
 * them back exactly. */
#define VIEW_EXACT ((int64_t)1 << 52)
static bool view_exact(const int64_t *v, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (v[i] > VIEW_EXACT || v[i] < -VIEW_EXACT) return false;
  return true;
}
/* Starts an f64 section, delta coded when `exact`; shuffled, its strategy picked (bin.h): the
 * doubles hold integers, often small differences, whose high and low bytes are long runs. */
static void view_f64_begin(vb_t *b, const char *name, bool exact) {
  vb_begin_with(b, name, "f64", (exact ? VB_DELTA : 0) | VB_SHUFFLE | VB_PICK);
}

/* A timeline's data (ms_tlv_t) as sections named PREFIX.*: per series its first point, number
 * of points, element (-1: the summarized band), size, colour and ghost flag; the points'
 * timesteps (T) and offsets (O, one more for the summarized band, which is last), the summarized
 * band's sizes (S), the elements' sources, and max_at_time only where the page cannot compute it
 * exactly. The sorted or slowly changing ones (first points, elements, colours, timesteps,
 * offsets, sources) are delta coded; all but the ghost flags are shuffled. */
static void view_bin_tlv(vb_t *b, const char *prefix, const ms_tlv_t *v) {
  char name[64];
#define SEC(suffix, type)                                      \
  snprintf(name, sizeof name, "%s.%s", prefix, suffix);        \
  vb_begin_with(b, name, type, VB_SHUFFLE)
#define DSEC(suffix, type)                                     \
  snprintf(name, sizeof name, "%s.%s", prefix, suffix);        \
  vb_begin_with(b, name, type, VB_DELTA | VB_SHUFFLE)
#define FSEC(suffix, exact)                                    \
  snprintf(name, sizeof name, "%s.%s", prefix, suffix);        \
  view_f64_begin(b, name, exact)
  DSEC("first", "u32");
  for (size_t i = 0; i < v->nseries; i++) vb_u32(b, (uint32_t)v->series[i].first_point);
  vb_end(b);
  SEC("npoints", "u32");
  for (size_t i = 0; i < v->nseries; i++) vb_u32(b, (uint32_t)v->series[i].npoints);
  vb_end(b);
  DSEC("elem", "i32");
  for (size_t i = 0; i < v->nseries; i++) vb_i32(b, (int32_t)v->series[i].elem);
  vb_end(b);
  FSEC("size", false);
  for (size_t i = 0; i < v->nseries; i++) vb_f64(b, (double)v->series[i].size);
  vb_end(b);
  DSEC("color", "i32");
  for (size_t i = 0; i < v->nseries; i++) vb_i32(b, (int32_t)v->series[i].color);
  vb_end(b);
  snprintf(name, sizeof name, "%s.ghost", prefix);
  vb_begin(b, name, "u8");
  for (size_t i = 0; i < v->nseries; i++) vb_u8(b, v->series[i].ghost);
  vb_end(b);
  DSEC("T", "i32");
  for (size_t i = 0; i < v->npoints; i++) vb_i32(b, (int32_t)v->timesteps[i]);
  vb_end(b);
  size_t nsumm = 0, summ_first = 0;
  for (size_t i = 0; i < v->nseries; i++)
    if (v->series[i].elem < 0) nsumm = v->series[i].npoints, summ_first = v->series[i].first_point;
  size_t no = v->nseries && v->series[v->nseries - 1].elem < 0 ? v->npoints + 1 : v->npoints;
  FSEC("O", view_exact(v->offsets, no));
  for (size_t i = 0; i < no; i++) vb_f64(b, (double)v->offsets[i]);
  vb_end(b);
  FSEC("S", false);
  for (size_t i = 0; i < nsumm; i++) vb_f64(b, (double)v->sizes[summ_first + i]);
  vb_end(b);
  /* max_at_time is the sum of the sizes of the bands alive at each step: the page computes it
   * from the bands (timeline-data.js, maxAtTime), exactly while every total is at most 2^52 */
  bool band = false; /* the page sums max_at_time from the bands, the summarized one aside */
  for (size_t i = 0; i < nsumm && !band; i++) band = v->sizes[summ_first + i] != 0;
  if (band || !view_exact(v->max_at_time, v->ntimesteps)) {
    FSEC("max_at_time", false);
    for (size_t i = 0; i < v->ntimesteps; i++) vb_f64(b, (double)v->max_at_time[i]);
    vb_end(b);
  }
  FSEC("sources", view_exact(v->element_source, v->elements_length));
  for (size_t i = 0; i < v->elements_length; i++) vb_f64(b, (double)v->element_source[i]);
  vb_end(b);
#undef SEC
#undef DSEC
#undef FSEC
}

/* The trace of device dev as columns (trace.*): action, address, size, stream, time (-1: none),
 * stack (-1: none), pool (an index into the JSON's pools, -1: none). Addresses, sizes, streams and
 * times are doubles: exact below 2^53 (device addresses and times are). */
static int view_bin_trace(vb_t *b, const char *prefix, const ms_snapshot_t *s, size_t dev,
                          int64_t (**pools)[2], size_t *npools) {
  char name[64];
#define TSEC(col, type)                                       \
  snprintf(name, sizeof name, "%s.%s", prefix, col);          \
  vb_begin(b, name, type)
  const ms_snap_device_t *d = dev < s->ndevices ? &s->devices[dev] : NULL;
  size_t n = d ? d->ntrace : 0;
  const ms_snap_trace_t *t = n ? s->trace + d->first_trace : NULL; /* not NULL + 0 */
  /* addresses, streams and times change little from one entry to the next: delta coded when
   * every value is exact that way */
  bool ea = true, es = true, et = true;
  for (size_t i = 0; i < n; i++) {
    ea &= t[i].addr <= (uint64_t)VIEW_EXACT;
    es &= ms_snap_trace_stream(&t[i]) <= (uint64_t)VIEW_EXACT;
    et &= !(t[i].present & MS_TRACE_HAS_TIME) ||
          (t[i].time_us <= VIEW_EXACT && t[i].time_us >= -VIEW_EXACT);
  }
  TSEC("action", "u8");
  for (size_t i = 0; i < n; i++) vb_u8(b, (uint8_t)t[i].action);
  vb_end(b);
  snprintf(name, sizeof name, "%s.addr", prefix);
  view_f64_begin(b, name, ea);
  for (size_t i = 0; i < n; i++) vb_f64(b, (double)t[i].addr);
  vb_end(b);
  TSEC("size", "f64");
  for (size_t i = 0; i < n; i++) vb_f64(b, (double)t[i].size);
  vb_end(b);
  snprintf(name, sizeof name, "%s.stream", prefix);
  view_f64_begin(b, name, es);
  for (size_t i = 0; i < n; i++)
    vb_f64(b, (double)ms_snap_trace_stream(&t[i]));
  vb_end(b);
  snprintf(name, sizeof name, "%s.time", prefix);
  view_f64_begin(b, name, et);
  for (size_t i = 0; i < n; i++)
    vb_f64(b, t[i].present & MS_TRACE_HAS_TIME ? (double)t[i].time_us : -1.0);
  vb_end(b);
  snprintf(name, sizeof name, "%s.stack", prefix);
  vb_begin_with(b, name, "i32", VB_DELTA | VB_SHUFFLE);
  for (size_t i = 0; i < n; i++)
    vb_i32(b, t[i].stack == MS_SNAP_NO_STACK ? -1 : (int32_t)t[i].stack);
  vb_end(b);
  TSEC("pool", "i32");
  int64_t last_pool = -1;
  for (size_t i = 0; i < n; i++) {
    int32_t k = -1;
    /* pools are few; a trace naming more than VIEW_MAX_POOLS distinct ones (hostile) shows the
     * rest as "pool_id unknown" rather than costing a search per entry over all of them */
    if ((t[i].present & MS_TRACE_HAS_POOL_ID) && k < 0 && last_pool >= 0 &&
        (*pools)[last_pool][0] == ms_snap_trace_pool(&t[i], 0) && (*pools)[last_pool][1] == ms_snap_trace_pool(&t[i], 1)) {
      k = (int32_t)last_pool;
    } else if (t[i].present & MS_TRACE_HAS_POOL_ID) {
      for (size_t j = 0; j < *npools && k < 0; j++)
        if ((*pools)[j][0] == ms_snap_trace_pool(&t[i], 0) && (*pools)[j][1] == ms_snap_trace_pool(&t[i], 1)) k = (int32_t)j;
      if (k < 0 && *npools < VIEW_MAX_POOLS) {
        int64_t(*p)[2] = realloc(*pools, (*npools + 1) * sizeof **pools);
        if (!p) return MS_ENOMEM;
        *pools = p;
        p[*npools][0] = ms_snap_trace_pool(&t[i], 0);
        p[*npools][1] = ms_snap_trace_pool(&t[i], 1);
        k = (int32_t)(*npools)++;
      }
      if (k >= 0) last_pool = k;
    }
    vb_i32(b, k);
  }
  vb_end(b);
#undef TSEC
  return MS_OK;
}

static void view_segments(vw_t *w, const ms_snapshot_t *s, size_t dev) {
  vw_puts(w, "[");
  bool first = true;
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    if (g->device != (int64_t)dev) continue;
    vw_puts(w, first ? "\n{\"addr\":" : ",\n{\"addr\":");
    first = false;
    vw_hexstr(w, g->address);
    vw_puts(w, ",\"size\":");
    vw_u64(w, g->total_size);
    vw_puts(w, ",\"stream\":");
    vw_u64(w, g->stream);
    vw_puts(w, ",\"pool\":[");
    vw_i64(w, g->pool_id[0]);
    vw_raw(w, ",", 1);
    vw_i64(w, g->pool_id[1]);
    vw_puts(w, g->is_expandable ? "],\"expandable\":true" : "],\"expandable\":false");
    vw_puts(w, ",\"stack\":");
    vw_i64(w, g->stack == MS_SNAP_NO_STACK ? -1 : (int64_t)g->stack);
    vw_puts(w, ",\"index\":");
    vw_u64(w, i);
    vw_puts(w, ",\"first_block\":");
    vw_u64(w, g->first_block);
    /* blocks: [size, requested, state (0 inactive, 1 allocated, 2 pending free), stack] */
    vw_puts(w, ",\"blocks\":[");
    for (uint32_t b = 0; b < g->nblocks; b++) {
      const ms_snap_block_t *k = &s->blocks[g->first_block + b];
      vw_puts(w, b ? ",[" : "[");
      vw_u64(w, k->size);
      vw_raw(w, ",", 1);
      vw_u64(w, k->requested_size);
      vw_raw(w, ",", 1);
      vw_i64(w, k->state == MS_BLOCK_ACTIVE_ALLOCATED      ? 1
                : k->state == MS_BLOCK_ACTIVE_PENDING_FREE ? 2
                                                           : 0);
      vw_raw(w, ",", 1);
      vw_i64(w, k->stack == MS_SNAP_NO_STACK ? -1 : (int64_t)k->stack);
      vw_raw(w, "]", 1);
    }
    vw_puts(w, "]}");
  }
  vw_puts(w, "]");
}

/* Frames as "file:line:name" (as the viewer formats them) and stacks as frame indices. */
static void view_frames(vw_t *w, const ms_snapshot_t *s) {
  vw_puts(w, "\"frames\":[");
  for (size_t i = 0; i < s->nframes; i++) {
    if (i) vw_puts(w, ",\n");
    const ms_snap_frame_t *f = &s->frames[i];
    vw_puts(w, "[");
    vw_str(w, f->filename);
    vw_raw(w, ",", 1);
    vw_i64(w, f->line);
    vw_raw(w, ",", 1);
    vw_str(w, f->name);
    vw_puts(w, "]");
  }
  vw_puts(w, "]");
}

/* The Explain panels' answers (answer.h; the explain costs a pass of its own over the trace):
 * written, device after device, by a thread of its own into mem, device k's ending at end[k]. */
typedef struct view_answers_s {
  const ms_snapshot_t *s;
  const ms_timeline_t *tl; /* the page's time index (NULL: each answer builds one) */
  const ms_attr_t *attr;   /* and its classifier (NULL: each answer classifies its own) */
  const size_t *devs;
  size_t ndevs;
  int replay;
  vw_t *w;
  view_mem_t mem;
  ms_sink_t sink;
  size_t *end;
  pthread_t th;
  bool threaded, done;
} view_answers_t;

static void *view_answers_run(void *arg) {
  view_answers_t *j = arg;
  for (size_t k = 0; k < j->ndevs && j->w->err == MS_OK; k++) {
    ms__view_answer_json(j->w, j->s, j->tl, j->attr, j->devs[k], j->replay);
    vw_flush(j->w);
    j->end[k] = j->mem.len;
  }
  j->done = true;
  return NULL;
}

/* Starts the answers' thread (without one, or without memory, view_answer writes them itself). */
static void view_answers_start(view_answers_t *j, const ms_snapshot_t *s,
                               const ms_timeline_t *tl, const ms_attr_t *attr, const size_t *devs,
                               size_t ndevs, int replay) {
  memset(j, 0, sizeof *j);
  j->s = s;
  j->tl = tl;
  j->attr = attr;
  j->devs = devs;
  j->ndevs = ndevs;
  j->replay = replay;
  j->w = malloc(sizeof *j->w);
  j->end = malloc(ndevs * sizeof *j->end);
  j->sink.write = view_mem_write;
  j->sink.ctx = &j->mem;
  if (!j->w || !j->end) return;
  vw_init(j->w, &j->sink);
  j->threaded = pthread_create(&j->th, NULL, view_answers_run, j) == 0;
}

static void view_answers_wait(view_answers_t *j) {
  if (j->threaded) pthread_join(j->th, NULL);
  j->threaded = false;
}

static void view_answers_release(view_answers_t *j) {
  view_answers_wait(j);
  free(j->w);
  free(j->end);
  free(j->mem.p);
}

/* What the JSON says of one timeline (its arrays are in the binary data). */
typedef struct view_tlmeta_s {
  int64_t max_size;
  size_t elements_length, nseries, npoints, ntimesteps;
  ms_tlv_budget_t budget; /* what fitting the data to its budget did */
} view_tlmeta_t;

typedef struct view_ctx_s {
  const ms_snapshot_t *s;
  const ms_attr_t *attr;   /* sources and categories (NULL: the trace could not be indexed) */
  const ms_timeline_t *tl; /* attr's index */
  const ms_viewer_opts_t *o;
  size_t dev;          /* the device shown first */
  const size_t *devs;  /* every device listed, each in the page */
  size_t ndevs;
  view_tlmeta_t *meta; /* two per listed device: memory, segments */
  int64_t (*pools)[2];
  size_t npools;
  uint64_t bin_bytes, trace_bytes; /* uncompressed */
  char why[200];                   /* what failed, when the error needs saying */
  const ms_viewer_file_t *files;   /* a page of several files (NULL: of one) */
  size_t nfiles, file;             /* their number, and which this is */
  view_answers_t *answers;         /* the Explain panels' answers, being written */
} view_ctx_t;

static void view_tlv_json(vw_t *w, const char *key, const view_tlmeta_t *m) {
  vw_puts(w, ",\n\"");
  vw_puts(w, key);
  vw_puts(w, "\":{\"max_size\":");
  vw_i64(w, m->max_size);
  vw_puts(w, ",\"elements_length\":");
  vw_u64(w, m->elements_length);
  vw_puts(w, ",\"nseries\":");
  vw_u64(w, m->nseries);
  vw_puts(w, ",\"npoints\":");
  vw_u64(w, m->npoints);
  vw_puts(w, ",\"ntimesteps\":");
  vw_u64(w, m->ntimesteps);
  if (m->budget.summarized) { /* the page says so (docs/view.md, "The budget") */
    vw_puts(w, ",\"budget\":{\"bytes\":");
    vw_u64(w, m->budget.bytes);
    vw_puts(w, ",\"exact_bytes\":");
    vw_u64(w, m->budget.exact_bytes);
    vw_puts(w, ",\"drawn\":");
    vw_u64(w, m->budget.drawn);
    vw_puts(w, "}");
  }
  vw_puts(w, "}");
}


/* The steps of device dev (the ProfilerStep#N ranges of external_annotations, those recorded for
 * another device index when it has none): "steps":[[N, start_us, end_us (-1: never ended)],...]
 * in start order; the page puts them on the time axis. */
static void view_steps(vw_t *w, const ms_snapshot_t *s, size_t dev) {
  ms_tl_ranges_t rs;
  vw_puts(w, ",\"steps\":[");
  if (ms_tl_ranges_build(s, &rs) != MS_OK) {
    vw_puts(w, "]");
    return;
  }
  bool own = false, first = true;
  for (size_t i = 0; i < rs.n; i++) own |= rs.ranges[i].step >= 0 && rs.ranges[i].device == (int64_t)dev;
  for (size_t i = 0; i < rs.n; i++) {
    const ms_tl_range_t *x = &rs.ranges[i];
    if (x->step < 0 || (own && x->device != (int64_t)dev)) continue;
    vw_puts(w, first ? "[" : ",[");
    first = false;
    vw_i64(w, x->step);
    vw_raw(w, ",", 1);
    vw_i64(w, x->start_us);
    vw_raw(w, ",", 1);
    vw_i64(w, x->has_end ? x->end_us : -1);
    vw_raw(w, "]", 1);
  }
  ms_tl_ranges_release(&rs);
  vw_puts(w, "]");
}

/* Listed device k's answer: the thread's, or (without it, or when it failed) written here. */
static void view_answer(vw_t *w, const view_ctx_t *c, size_t k) {
  view_answers_t *j = c->answers;
  view_answers_wait(j);
  if (j->done && j->w->err == MS_OK)
    vw_raw(w, j->mem.p + (k ? j->end[k - 1] : 0), j->end[k] - (k ? j->end[k - 1] : 0));
  else
    ms__view_answer_json(w, c->s, c->tl, c->attr, c->devs[k], c->o->explain);
}

static void view_data(vw_t *w, const view_ctx_t *c, const vb_t *b) {
  const ms_snapshot_t *s = c->s;
  vw_puts(w, "{\"format\":2,\"title\":");
  vw_str(w, c->o->title ? c->o->title : "");
  vw_puts(w, ",\"view\":");
  vw_str(w, c->o->view ? c->o->view : "timeline");
  vw_puts(w, ",\"device\":");
  vw_u64(w, c->dev);
  vw_puts(w, ",\"devices\":[");
  for (size_t i = 0; i < c->ndevs; i++) {
    if (i) vw_raw(w, ",", 1);
    vw_u64(w, c->devs[i]);
  }
  vw_puts(w, "],\"has_settings\":");
  vw_puts(w, s->present & MS_SNAP_HAS_SETTINGS ? "true" : "false");
  vw_puts(w, ",\"settings\":");
  view_settings(w, s, 0, s->nsettings_top);
  vw_puts(w, ",\n\"actions\":[");
  for (int a = 0; a < MS_TRACE_ACTION_COUNT; a++) {
    if (a) vw_raw(w, ",", 1);
    vw_str(w, a == MS_TRACE_OTHER ? "other" : ms_trace_action_name((ms_trace_action)a));
  }
  /* MemoryViz's categories (the profiler's; `unknown` always among them, which MemoryViz.js
   * needs) with the profiler's colours, in ms_category order: the .cat sections index them */
  vw_puts(w, "],\n\"categories\":[");
  static const char *const hex[MS_CAT_COUNT] = {"#006400", "#daa520", "#000000", "#9370db",
                                                "#ff0000", "#0000cd", "#4169e1", "#808080"};
  for (int k = 0; k < MS_CAT_COUNT; k++) {
    if (k) vw_raw(w, ",", 1);
    vw_str(w, ms_category_name((ms_category)k));
  }
  vw_puts(w, "],\"category_colors\":[");
  for (int k = 0; k < MS_CAT_COUNT; k++) {
    if (k) vw_raw(w, ",", 1);
    vw_str(w, hex[k]);
  }
  vw_puts(w, "],\n");
  view_frames(w, s);
  vw_puts(w, ",\n\"per_device\":[");
  for (size_t k = 0; k < c->ndevs; k++) {
    size_t dev = c->devs[k];
    const ms_snap_device_t *d = dev < s->ndevices ? &s->devices[dev] : NULL;
    vw_puts(w, k ? ",\n{\"device\":" : "\n{\"device\":");
    vw_u64(w, dev);
    vw_puts(w, ",\"capacity\":");
    vw_u64(w, d && (d->present & MS_DEV_HAS_CAPACITY) ? d->capacity : 0);
    vw_puts(w, ",\"trace_dropped\":");
    vw_u64(w, d ? d->trace_dropped : 0);
    vw_puts(w, ",\"ntrace\":");
    vw_u64(w, d ? d->ntrace : 0);
    vw_puts(w, ",\n\"segments\":");
    view_segments(w, s, dev);
    view_tlv_json(w, "tl", &c->meta[2 * k]);
    view_tlv_json(w, "seg", &c->meta[2 * k + 1]);
    vw_puts(w, ",\n\"explain\":");
    view_answer(w, c, k);
    vw_puts(w, ",\n\"memory\":");
    ms__view_memory_json(w, c->tl, dev);
    view_steps(w, s, dev);
    vw_puts(w, "}");
  }
  vw_puts(w, "]");
  vw_puts(w, ",\n\"bin\":{\"encoding\":\"gzip+esc\",\"length\":");
  vw_u64(w, c->bin_bytes);
  vw_puts(w, ",\"sections\":");
  vb_table(b, w);
  vw_puts(w, "}}");
}

/* The pools the traces name (the trailing JSON's "pools", which the trace's pool column indexes). */
static void view_pools(vw_t *w, const view_ctx_t *c) {
  vw_puts(w, "\"pools\":[");
  for (size_t i = 0; i < c->npools; i++) {
    vw_puts(w, i ? ",[" : "[");
    vw_i64(w, c->pools[i][0]);
    vw_raw(w, ",", 1);
    vw_i64(w, c->pools[i][1]);
    vw_raw(w, "]", 1);
  }
  vw_puts(w, "]");
}

/* The category of every element of a memory timeline (PREFIX.cat, u8, the index into the JSON's
 * "categories"): its alloc entry's, or the snapshot block's (ms_attr_block_category of the end
 * state); `unknown` without a classifier. */
static int view_bin_categories(view_ctx_t *c, vb_t *b, const char *prefix, size_t dev,
                               const ms_tlv_t *v) {
  const ms_snapshot_t *s = c->s;
  uint8_t *snapcat = malloc(s->nblocks ? s->nblocks : 1);
  if (!snapcat) return MS_ENOMEM;
  memset(snapcat, MS_CAT_UNKNOWN, s->nblocks);
  int rc = MS_OK;
  if (c->attr && dev < ms_timeline_ndevices(c->tl)) {
    ms_tl_state_t st;
    ms_timeline_state_init(&st);
    rc = ms_timeline_state_at(c->tl, dev, ms_timeline_nentries(c->tl, dev), &st);
    for (size_t k = 0; k < st.nblocks && rc == MS_OK; k++)
      if ((st.blocks[k].flags & MS_TL_BLOCK_FROM_SNAPSHOT) && st.blocks[k].snap_block < s->nblocks)
        snapcat[st.blocks[k].snap_block] =
            (uint8_t)ms_attr_block_category(c->attr, dev, &st.blocks[k]);
    ms_timeline_state_release(&st);
  }
  char name[64];
  snprintf(name, sizeof name, "%s.cat", prefix);
  vb_begin(b, name, "u8");
  for (size_t e = 0; e < v->elements_length; e++) {
    int64_t src = v->element_source[e];
    uint8_t cat = MS_CAT_UNKNOWN;
    if (c->attr && src >= 0)
      cat = (uint8_t)ms_attr_entry_category(c->attr, dev, (size_t)src);
    else if (src < 0 && (uint64_t)(-1 - src) < s->nblocks)
      cat = snapcat[-1 - src];
    vb_u8(b, cat);
  }
  vb_end(b);
  free(snapcat);
  return rc;
}

/* What goes into the first binary element: per device its timelines. */
static int view_bin_devices(view_ctx_t *c, vb_t *b) {
  int rc = MS_OK;
  for (size_t k = 0; k < c->ndevs && rc == MS_OK; k++) {
    char prefix[48];
    for (int seg = 0; seg < 2 && rc == MS_OK; seg++) {
      ms_tlv_t v;
      view_tlmeta_t *m = &c->meta[2 * k + (size_t)seg];
      m->budget.bytes = c->o->timeline_budget_bytes;
      m->budget.summarize = true;
      rc = ms_tlv_compute_budget(c->s, c->devs[k], seg != 0, SIZE_MAX, 0, SIZE_MAX, NULL,
                                 &m->budget, &v);
      if (rc == MS_ELIMIT)
        snprintf(c->why, sizeof c->why,
                 "device %zu: the %s timeline holds more than 2^32 elements, or a size or the "
                 "memory alive at once of 2^62 bytes (4 EiB) or more, which no device has",
                 c->devs[k], seg ? "segment" : "memory");
      if (rc != MS_OK) break;
      snprintf(prefix, sizeof prefix, "d%zu.%s", c->devs[k], seg ? "seg" : "tl");
      view_bin_tlv(b, prefix, &v);
      if (!seg) rc = view_bin_categories(c, b, prefix, c->devs[k], &v);
      m->max_size = v.max_size;
      m->elements_length = v.elements_length;
      m->nseries = v.nseries;
      m->npoints = v.npoints;
      m->ntimesteps = v.ntimesteps;
      ms_tlv_release(&v);
    }
  }
  return rc;
}

/* The stacks' work (stacks.h): the first pass and the ranking, then parts of the second pass, on
 * a thread of its own; the trace element's thread takes the second pass's parts too once it has
 * written the traces. */
typedef struct view_plan_job_s {
  const ms_snapshot_t *s;
  vs_plan_t *plan;
  int rc;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  bool ready; /* plan and rc are set */
} view_plan_job_t;

static void *view_plan_run(void *arg) {
  view_plan_job_t *j = arg;
  int rc = vs_plan(j->s, &j->plan);
  pthread_mutex_lock(&j->mu);
  j->rc = rc;
  j->ready = true;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
  if (rc == MS_OK) (void)vs_plan_work(j->plan, j->s);
  return NULL;
}

/* What goes into the second: per device its trace, then the stacks (their work on another thread
 * meanwhile, and then on both). */
static int view_bin_traces(view_ctx_t *c, vb_t *b) {
  view_plan_job_t pj = {c->s, NULL, MS_OK, PTHREAD_MUTEX_INITIALIZER, PTHREAD_COND_INITIALIZER,
                        false};
  pthread_t th;
  bool threaded = pthread_create(&th, NULL, view_plan_run, &pj) == 0;
  int rc = MS_OK;
  for (size_t k = 0; k < c->ndevs && rc == MS_OK; k++) {
    char prefix[48];
    snprintf(prefix, sizeof prefix, "d%zu.trace", c->devs[k]);
    rc = view_bin_trace(b, prefix, c->s, c->devs[k], &c->pools, &c->npools);
  }
  if (threaded) {
    pthread_mutex_lock(&pj.mu);
    while (!pj.ready) pthread_cond_wait(&pj.cv, &pj.mu);
    pthread_mutex_unlock(&pj.mu);
    if (rc == MS_OK && pj.rc == MS_OK) (void)vs_plan_work(pj.plan, c->s);
    pthread_join(th, NULL);
  } else if (rc == MS_OK) {
    view_plan_run(&pj);
  }
  pthread_cond_destroy(&pj.cv);
  pthread_mutex_destroy(&pj.mu);
  if (rc == MS_OK) rc = pj.rc;
  if (rc == MS_OK) rc = vs_write_plan(b, c->s, pj.plan);
  vs_plan_free(pj.plan);
  return rc;
}

/* A binary element: sections, gzipped, escaped (bin.h): the devices' timelines, or (traces) their
 * traces and the stacks, which the page reads after its first paint, not escaped yet (the page's
 * thread escapes them as it drains them: view_page). */
static int view_bin(vw_t *w, view_ctx_t *c, vb_t *b, bool traces) {
  ms_sink_t esc, gz, out = {NULL, NULL};
  ms_gzip_sink_t *z = NULL;
  vb_esc_t e = {w, true};
  vb_escape_sink(&e, &esc);
  if (traces) vw_as_sink(w, &out);
  int rc = ms_gzip_sink_create(traces ? &out : &esc, c->s->ntrace > 1000000 ? 1 : 6, &z, &gz);
  if (rc != MS_OK) return rc;
  vb_init(b, &gz, z);
  rc = traces ? view_bin_traces(c, b) : view_bin_devices(c, b);
  vb_flush(b);
  if (rc == MS_OK) rc = b->err;
  *(traces ? &c->trace_bytes : &c->bin_bytes) = b->offset;
  if (rc == MS_OK) rc = ms_gzip_sink_finish(z);
  ms_gzip_sink_destroy(z);
  return rc != MS_OK ? rc : w->err;
}

/* The trace element's job: its sections (sb) and its escaped bytes (spool, which the page's
 * thread drains into the page once it has reached the element). It reads the snapshot, the
 * devices, and writes c->pools, c->npools and c->trace_bytes only, which nothing else touches
 * until it is joined. */
typedef struct view_trace_job_s {
  view_ctx_t *c;
  vb_t *sb;
  vw_t *w;
  vsp_t spool;
  ms_sink_t sink;
  int rc;
  pthread_t th;
  bool threaded, done; /* running in th; run (or given up) */
} view_trace_job_t;

static void *view_trace_run(void *arg) {
  view_trace_job_t *j = arg;
  j->rc = view_bin(j->w, j->c, j->sb, true);
  vw_flush(j->w);
  vsp_close(&j->spool);
  j->done = true;
  if (j->rc == MS_OK) j->rc = j->w->err;
  return NULL;
}

/* The page's head, its style and the app's element (once per page). */
static void view_head(vw_t *w, const char *title) {
  /* the charset must be declared within the first 1024 bytes */
  vw_puts(w, "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"windows-1252\">\n"
             "<meta name=\"viewport\" content=\"width=device-width\">\n"
             "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
             "script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:; "
             "worker-src blob:; connect-src 'none'\">\n<title>memsnap view: ");
  vw_html(w, title ? title : "");
  vw_puts(w, "</title>\n<style>\n");
  vw_raw(w, ms__view_css, ms__view_css_len);
  vw_puts(w, "</style>\n</head>\n<body>\n<div id=\"app\"><noscript>This page needs "
             "JavaScript.</noscript></div>\n");
}

/* A data element's opening: id NAME, then "-K" for the file K > 0 of a page of several. */
static void view_open(vw_t *w, const view_ctx_t *c, const char *type, const char *name) {
  vw_puts(w, "<script type=\"");
  vw_puts(w, type);
  vw_puts(w, "\" id=\"");
  vw_puts(w, name);
  if (c->file > 0) {
    vw_puts(w, "-");
    vw_u64(w, c->file);
  }
  vw_puts(w, "\">");
}

/* The files of a page of several, their names in order ("ms-files", before the script). */
static void view_files(vw_t *w, const view_ctx_t *c) {
  vw_puts(w, "<script type=\"application/json\" id=\"ms-files\">[");
  for (size_t i = 0; i < c->nfiles; i++) {
    if (i) vw_puts(w, ",");
    vw_str(w, c->files[i].title ? c->files[i].title : "");
  }
  vw_puts(w, "]</script>\n");
}

/* Waits for the trace element's job (or, without a thread, runs it when run_here); once. */
static void view_trace_wait(view_trace_job_t *j, bool run_here) {
  if (j->threaded) pthread_join(j->th, NULL);
  else if (run_here && !j->done) view_trace_run(j);
  j->threaded = false;
  j->done = true;
}

/* One file's data elements (ms-bin, ms-data, ms-trace, ms-trace-data; each "-K" past the first
 * file of several); the first file's have the viewer's script between them, so that the page
 * draws before it has parsed the traces. The trace element (job) is being written meanwhile. */
static int view_page(vw_t *w, view_ctx_t *c, view_trace_job_t *job) {
  view_open(w, c, "application/octet-stream", "ms-bin");
  vb_t *b = malloc(sizeof *b);
  if (!b) return MS_ENOMEM;
  /* the traces and the stacks come last, after the script, with their table (and the pools the
   * traces name) in a JSON element of their own: the browser runs the script, which draws the
   * timeline, before it has parsed them */
  int rc = view_bin(w, c, b, false);
  if (rc == MS_OK) {
    vw_puts(w, "</script>\n");
    view_open(w, c, "application/json", "ms-data");
    view_data(w, c, b);
    vw_puts(w, "</script>\n");
    if (c->file == 0 && c->files) view_files(w, c);
    if (c->file == 0) {
      vw_puts(w, "<script>\n");
      vw_raw(w, ms__view_js, ms__view_js_len);
      vw_puts(w, "</script>\n");
    }
    view_open(w, c, "application/octet-stream", "ms-trace");
    vw_flush(w);
    rc = w->err;
    /* the element's bytes as the job writes them, escaped (not narrow: bin.h) on their way,
     * then (it has closed) the rest */
    vb_esc_t e = {w, false};
    ms_sink_t esc;
    vb_escape_sink(&e, &esc);
    if (rc == MS_OK && job->threaded) rc = vsp_drain(&job->spool, &esc);
    view_trace_wait(job, true);
    if (rc == MS_OK) rc = job->rc;
    if (rc == MS_OK) rc = vsp_drain(&job->spool, &esc);
  }
  if (rc == MS_OK) {
    vw_puts(w, "</script>\n");
    view_open(w, c, "application/json", "ms-trace-data");
    vw_puts(w, "{");
    view_pools(w, c);
    vw_puts(w, ",\n\"trace_bin\":{\"encoding\":\"gzip+esc\",\"length\":");
    vw_u64(w, c->trace_bytes);
    vw_puts(w, ",\"sections\":");
    vb_table(job->sb, w);
    vw_puts(w, "}}</script>\n");
  }
  vb_release(b);
  free(b);
  return rc;
}

/* Whether snap has a device to show and, for its first file (k == 0), the one opts asks for;
 * before anything is written, so that a failed page is not begun. */
static int view_check(const ms_snapshot_t *snap, const ms_viewer_opts_t *opts, size_t k,
                      ms_errbuf_t *eb) {
  size_t ndevs = ms_tl_viewer_devices(snap, NULL, 0, NULL);
  if (ndevs == 0) return view_no_device(eb, SIZE_MAX);
  if (opts->device == SIZE_MAX || k > 0) return MS_OK;
  size_t *devs = malloc(ndevs * sizeof *devs);
  if (!devs) return MS_ENOMEM;
  ms_tl_viewer_devices(snap, devs, ndevs, NULL);
  bool listed = false;
  for (size_t i = 0; i < ndevs; i++) listed |= devs[i] == opts->device;
  free(devs);
  return listed ? MS_OK : view_no_device(eb, opts->device);
}

/* File k of files (NULL: the one file snap) into w: its devices, its indexes, its elements.
 * A device that opts asks for and file k > 0 does not list is left to that file's default. */
static int view_one(vw_t *w, const ms_snapshot_t *snap, const ms_viewer_opts_t *opts,
                    const ms_viewer_file_t *files, size_t nfiles, size_t k, ms_errbuf_t *eb) {
  size_t ndevs = ms_tl_viewer_devices(snap, NULL, 0, NULL), dev = 0;
  if (ndevs == 0)
    return view_no_device(eb, SIZE_MAX);
  size_t *devs = malloc(ndevs * sizeof *devs);
  if (!devs) return MS_ENOMEM;
  ms_tl_viewer_devices(snap, devs, ndevs, &dev);
  int rc = MS_OK;
  if (opts->device != SIZE_MAX) {
    bool listed = false;
    for (size_t i = 0; i < ndevs; i++) listed |= devs[i] == opts->device;
    if (!listed && k == 0) {
      free(devs);
      return view_no_device(eb, opts->device);
    }
    if (listed) dev = opts->device;
  }
  view_tlmeta_t *meta = calloc(2 * ndevs, sizeof *meta);
  if (!meta) {
    rc = MS_ENOMEM;
  } else {
    /* categories need the time index; a trace it cannot index leaves every band `unknown` */
    ms_timeline_t *tl = NULL;
    ms_attr_t *attr = NULL;
    view_answers_t answers;
    memset(&answers, 0, sizeof answers);
    view_ctx_t c = {snap, NULL, NULL, opts, dev, devs, ndevs, meta, NULL, 0, 0, 0, "", files, nfiles, k, &answers};
    /* the trace element needs neither the time index nor the timelines: a thread writes it
     * meanwhile (or, without one, view_page after them) */
    view_trace_job_t job;
    memset(&job, 0, sizeof job);
    job.c = &c;
    job.sb = malloc(sizeof *job.sb);
    job.w = malloc(sizeof *job.w);
    bool spool = vsp_init(&job.spool) == MS_OK;
    vsp_sink(&job.spool, &job.sink);
    if (!job.sb || !job.w || !spool) {
      rc = MS_ENOMEM;
    } else {
      vb_init(job.sb, NULL, NULL);
      vw_init(job.w, &job.sink);
      job.threaded = pthread_create(&job.th, NULL, view_trace_run, &job) == 0;
      /* the answers (their own thread) read the same index and classifier, built once */
      if (ms_timeline_create(snap, NULL, &tl, NULL) != MS_OK) tl = NULL;
      if (tl && ms_attr_create(snap, tl, NULL, &attr, NULL) != MS_OK) attr = NULL;
      view_answers_start(&answers, snap, tl, attr, devs, ndevs, opts->explain);
      c.attr = attr;
      c.tl = tl;
      rc = view_page(w, &c, &job);
      view_trace_wait(&job, false);
      if (rc == MS_OK) rc = w->err;
      if (rc != MS_OK && c.why[0] && eb) snprintf(eb->msg, sizeof eb->msg, "%s", c.why);
    }
    if (job.sb) vb_release(job.sb);
    free(job.sb);
    free(job.w);
    if (spool) vsp_release(&job.spool);
    view_answers_release(&answers);
    free(c.pools);
    ms_attr_destroy(attr);
    ms_timeline_destroy(tl);
  }
  free(meta);
  free(devs);
  return rc;
}

int ms_viewer_write_html(const ms_snapshot_t *snap, const ms_viewer_opts_t *opts,
                         ms_sink_t *sink, ms_errbuf_t *eb) {
  ms_viewer_opts_t def;
  if (!opts) {
    ms_viewer_opts_init(&def);
    opts = &def;
  }
  int rc = view_check(snap, opts, 0, eb);
  if (rc != MS_OK) return rc;
  vw_t *w = malloc(sizeof *w);
  if (!w) return MS_ENOMEM;
  vw_init(w, sink);
  view_head(w, opts->title);
  rc = view_one(w, snap, opts, NULL, 0, 0, eb);
  if (rc == MS_OK) vw_puts(w, "</body>\n</html>\n");
  vw_flush(w);
  if (rc == MS_OK) rc = w->err;
  free(w);
  return rc;
}

/* eb's message prefixed with the file's name; @return rc. */
static int view_name_file(ms_errbuf_t *eb, const char *title, int rc) {
  if (eb && title) {
    char why[sizeof eb->msg];
    snprintf(why, sizeof why, "%s", eb->msg[0] ? eb->msg : ms_strerror(rc));
    snprintf(eb->msg, sizeof eb->msg, "'%.200s': %.300s", title, why);
  }
  return rc;
}

int ms_viewer_write_html_files(const ms_viewer_file_t *files, size_t nfiles,
                               const ms_viewer_opts_t *opts, ms_sink_t *sink, ms_errbuf_t *eb) {
  if (!files || nfiles == 0) {
    if (eb) snprintf(eb->msg, sizeof eb->msg, "no file to write a page of");
    return MS_EINVAL;
  }
  ms_viewer_opts_t o;
  if (opts) o = *opts;
  else ms_viewer_opts_init(&o);
  const char *title = o.title;
  int rc = MS_OK;
  size_t k;
  for (k = 0; k < nfiles && rc == MS_OK; k++) rc = view_check(files[k].snap, &o, k, eb);
  if (rc != MS_OK) return view_name_file(eb, files[k - 1].title, rc);
  vw_t *w = malloc(sizeof *w);
  if (!w) return MS_ENOMEM;
  vw_init(w, sink);
  view_head(w, title ? title : files[0].title);
  for (k = 0; k < nfiles && rc == MS_OK; k++) {
    o.title = files[k].title;
    rc = view_one(w, files[k].snap, &o, files, nfiles, k, eb);
    if (rc != MS_OK) view_name_file(eb, files[k].title, rc);
  }
  if (rc == MS_OK) vw_puts(w, "</body>\n</html>\n");
  vw_flush(w);
  if (rc == MS_OK) rc = w->err;
  free(w);
  return rc;
}
