/* SPDX-License-Identifier: MIT
 * memsnap core: an answer (memsnap/explain.h) as JSON, once for both of its readers: `memsnap
 * explain --json` and the viewer's Explain panel (docs/explain.md names every field). The caller
 * gives the writer, which quotes strings as its output needs (the viewer's page escapes what HTML
 * would read).
 */
#include <stddef.h>

#include "memsnap/explain.h"

static void jkey(const ms_json_writer_t *w, const char *k) {
  w->lit(w->ctx, ", \"");
  w->lit(w->ctx, k);
  w->lit(w->ctx, "\": ");
}

static void jbool(const ms_json_writer_t *w, int v) {
  w->lit(w->ctx, v > 0 ? "true" : v == 0 ? "false" : "null");
}

static void ju64_or_null(const ms_json_writer_t *w, const char *k, bool has, uint64_t v) {
  jkey(w, k);
  if (has) w->u64(w->ctx, v);
  else w->lit(w->ctx, "null");
}

static void ji64_or_null(const ms_json_writer_t *w, const char *k, bool has, int64_t v) {
  jkey(w, k);
  if (has) w->i64(w->ctx, v);
  else w->lit(w->ctx, "null");
}

static void jstr_or_null(const ms_json_writer_t *w, const char *k, const char *s) {
  jkey(w, k);
  if (s && s[0]) w->str(w->ctx, s);
  else w->lit(w->ctx, "null");
}

static const char *json_moment_name(ms_explain_moment m) {
  switch (m) {
  case MS_EXPLAIN_AT_OOM: return "oom";
  case MS_EXPLAIN_AT_PEAK: return "peak";
  case MS_EXPLAIN_AT_END: return "end";
  case MS_EXPLAIN_AT_GIVEN: return "at";
  }
  return "?";
}

static void json_remedies(const ms_explain_t *x, const ms_json_writer_t *w) {
  jkey(w, "remedies");
  w->lit(w->ctx, "[");
  for (size_t i = 0; i < x->nremedies; i++) {
    const ms_explain_remedy_t *r = &x->remedies[i];
    w->lit(w->ctx, i ? ",\n  {\"config\": " : "\n  {\"config\": ");
    w->str(w->ctx, r->config);
    jkey(w, "replayed");
    jbool(w, r->replayed);
    jkey(w, "avoids_oom");
    jbool(w, r->replayed ? r->avoids_oom : -1);
    ju64_or_null(w, "peak_reserved", r->replayed, r->peak_reserved);
    ju64_or_null(w, "min_capacity", r->min_capacity != 0, r->min_capacity);
    ju64_or_null(w, "ooms", r->replayed, r->ooms);
    if (r->note[0]) {
      jkey(w, "note");
      w->str(w->ctx, r->note);
    }
    w->lit(w->ctx, "}");
  }
  w->lit(w->ctx, "]");
}

/* name: [{"key": ..., "bytes": ..., "blocks": ...}, ...]; keys from rows, else stack labels. */
static void json_rows(const ms_json_writer_t *w, const char *name, const ms_explain_row_t *rows,
                      const ms_explain_holder_t *top, size_t n) {
  char buf[256];
  jkey(w, name);
  w->lit(w->ctx, "[");
  for (size_t i = 0; i < n; i++) {
    w->lit(w->ctx, i ? ", {\"key\": " : "{\"key\": ");
    if (rows) {
      w->str(w->ctx, rows[i].key);
    } else {
      w->stack_label(w->ctx, top[i].stack, buf, sizeof buf);
      w->str(w->ctx, buf);
    }
    jkey(w, "bytes");
    w->u64(w->ctx, rows ? rows[i].bytes : top[i].bytes);
    jkey(w, "blocks");
    w->u64(w->ctx, rows ? rows[i].blocks : top[i].blocks);
    w->lit(w->ctx, "}");
  }
  w->lit(w->ctx, "]");
}

/* The request, the capacity, the state's figures and pools. */
static void json_state(const ms_explain_t *x, const ms_json_writer_t *w) {
  ju64_or_null(w, "request_bytes", x->has_request, x->request_bytes);
  if (x->has_request) {
    jkey(w, "request_stream");
    w->u64(w->ctx, x->request_stream);
    jkey(w, "request_pool");
    w->lit(w->ctx, "[");
    w->i64(w->ctx, x->request_pool[0]);
    w->lit(w->ctx, ", ");
    w->i64(w->ctx, x->request_pool[1]);
    w->lit(w->ctx, "]");
  }
  ju64_or_null(w, "capacity_bytes", x->capacity != 0, x->capacity);
  jkey(w, "capacity_source");
  w->str(w->ctx, ms_capacity_source_name(x->capacity_source));
  ju64_or_null(w, "device_free_bytes", x->has_device_free, x->device_free);
  const struct {
    const char *k;
    uint64_t v;
  } figs[] = {{"reserved_bytes", x->reserved_bytes},
              {"allocated_bytes", x->allocated_bytes},
              {"requested_bytes", x->requested_bytes},
              {"cached_free_bytes", x->cached_free_bytes},
              {"largest_free_block_bytes", x->largest_free_block_bytes},
              {"inactive_split_bytes", x->inactive_split_bytes},
              {"releasable_bytes", x->releasable_bytes},
              {"private_pool_bytes", x->private_pool_bytes}};
  for (size_t i = 0; i < sizeof figs / sizeof figs[0]; i++) {
    jkey(w, figs[i].k);
    w->u64(w->ctx, figs[i].v);
  }
  ju64_or_null(w, "outside_allocator_bytes", x->has_outside, x->outside_allocator_bytes);
  jkey(w, "pools");
  w->lit(w->ctx, "[");
  for (size_t i = 0; i < x->npools; i++) {
    const ms_explain_pool_t *p = &x->pools[i];
    w->lit(w->ctx, i ? ", {\"pool_id\": [" : "{\"pool_id\": [");
    w->i64(w->ctx, p->pool_id[0]);
    w->lit(w->ctx, ", ");
    w->i64(w->ctx, p->pool_id[1]);
    w->lit(w->ctx, "], \"stream\": ");
    w->u64(w->ctx, p->stream);
    w->lit(w->ctx, p->large ? ", \"size_class\": \"large\"" : ", \"size_class\": \"small\"");
    jkey(w, "segments");
    w->u64(w->ctx, p->segments);
    jkey(w, "reserved_bytes");
    w->u64(w->ctx, p->reserved);
    jkey(w, "free_bytes");
    w->u64(w->ctx, p->free);
    jkey(w, "largest_free_block_bytes");
    w->u64(w->ctx, p->largest_free);
    w->lit(w->ctx, "}");
  }
  w->lit(w->ctx, "]");
}

/* The viewer's members: the OOM the capacity was inferred from, whether remedies were replayed
 * and why not, and the series of allocated and reserved bytes for its chart. */
static void json_viewer(const ms_explain_t *x, const ms_json_writer_t *w) {
  ju64_or_null(w, "capacity_oom_entry", x->capacity_source == MS_CAPACITY_INFERRED,
               x->capacity_oom.entry);
  jkey(w, "replayed");
  jbool(w, x->nremedies != 0);
  jkey(w, "replay_note");
  w->str(w->ctx, x->replay_note);
  jkey(w, "series");
  w->lit(w->ctx, "[");
  for (size_t i = 0; i < x->nseries; i++) {
    w->lit(w->ctx, i ? ", [" : "[");
    w->u64(w->ctx, x->series_step[i]);
    w->lit(w->ctx, ", ");
    w->u64(w->ctx, x->series_allocated[i]);
    w->lit(w->ctx, ", ");
    w->u64(w->ctx, x->series_reserved[i]);
    w->lit(w->ctx, "]");
  }
  w->lit(w->ctx, "]");
}

void ms_explain_write_json(const ms_explain_t *x, const ms_json_writer_t *w, unsigned flags) {
  if (!x || !w) return;
  w->lit(w->ctx, "\"device\": ");
  w->u64(w->ctx, x->device);
  jkey(w, "moment");
  w->str(w->ctx, json_moment_name(x->moment));
  ji64_or_null(w, "entry", x->entry >= 0, x->entry);
  ji64_or_null(w, "time_us", x->has_time, x->time_us);
  ji64_or_null(w, "step", x->step_number >= 0, x->step_number);
  jkey(w, "phase");
  if (x->phase) w->str(w->ctx, x->phase);
  else w->lit(w->ctx, "null");
  json_state(x, w);
  jkey(w, "verdict");
  w->str(w->ctx, ms_explain_verdict_name(x->verdict));
  jkey(w, "verdict_text");
  w->str(w->ctx, x->verdict_text);
  json_rows(w, "top", x->by_source, NULL, x->nby_source);
  json_rows(w, "top_by_category", x->by_category, NULL, x->nby_category);
  if (w->stack_label) json_rows(w, "top_by_stack", NULL, x->top, x->ntop);
  json_remedies(x, w);
  jstr_or_null(w, "recommendation", x->recommendation);
  jstr_or_null(w, "hint", x->hint);
  if (flags & MS_EXPLAIN_JSON_VIEWER) json_viewer(x, w);
}
