/* SPDX-License-Identifier: MIT
 * memsnap viewer: the data of the Explain panel (docs/view.md, issue #26 §5): each listed
 * device's answer (memsnap/explain.h) as JSON in the page's "ms-data" element: the moment, the
 * capacity, the figures, the verdict, the holders, the remedies, the recommendation, and the
 * allocated and reserved bytes over the trace for the panel's chart. viz/view/explain.js draws it.
 */
#include <stdio.h>
#include <string.h>

#include "memsnap/explain.h"
#include "answer.h"

static void answer_key(vw_t *w, const char *k) {
  vw_puts(w, ",\"");
  vw_puts(w, k);
  vw_puts(w, "\":");
}

static void answer_u64_or_null(vw_t *w, const char *k, bool has, uint64_t v) {
  answer_key(w, k);
  if (has) vw_u64(w, v);
  else vw_puts(w, "null");
}

static void answer_remedies(vw_t *w, const ms_explain_t *x) {
  answer_key(w, "remedies");
  vw_puts(w, "[");
  for (size_t i = 0; i < x->nremedies; i++) {
    const ms_explain_remedy_t *r = &x->remedies[i];
    vw_puts(w, i ? ",{\"config\":" : "{\"config\":");
    vw_str(w, r->config);
    answer_key(w, "replayed");
    vw_puts(w, r->replayed ? "true" : "false");
    answer_key(w, "avoids_oom");
    vw_puts(w, !r->replayed || r->avoids_oom < 0 ? "null" : r->avoids_oom ? "true" : "false");
    answer_u64_or_null(w, "peak_reserved", r->replayed, r->peak_reserved);
    answer_u64_or_null(w, "min_capacity", r->min_capacity != 0, r->min_capacity);
    answer_key(w, "note");
    vw_str(w, r->note);
    vw_puts(w, "}");
  }
  vw_puts(w, "]");
}

static void answer_body(vw_t *w, const ms_explain_t *x) {
  static const char *const moments[] = {"oom", "peak", "end", "at"};
  vw_puts(w, "{\"moment\":");
  vw_str(w, moments[x->moment]);
  answer_key(w, "entry");
  vw_i64(w, x->entry);
  answer_key(w, "step");
  vw_i64(w, x->step_number);
  answer_key(w, "phase");
  vw_str(w, x->phase ? x->phase : "");
  answer_u64_or_null(w, "request_bytes", x->has_request, x->request_bytes);
  answer_u64_or_null(w, "capacity_bytes", x->capacity != 0, x->capacity);
  answer_key(w, "capacity_source");
  vw_str(w, ms_capacity_source_name(x->capacity_source));
  answer_u64_or_null(w, "capacity_oom_entry", x->capacity_source == MS_CAPACITY_INFERRED,
                     x->capacity_oom.entry);
  answer_u64_or_null(w, "device_free_bytes", x->has_device_free, x->device_free);
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
    answer_key(w, figs[i].k);
    vw_u64(w, figs[i].v);
  }
  answer_u64_or_null(w, "outside_allocator_bytes", x->has_outside, x->outside_allocator_bytes);
  answer_key(w, "verdict");
  vw_str(w, ms_explain_verdict_name(x->verdict));
  answer_key(w, "verdict_text");
  vw_str(w, x->verdict_text);
  answer_key(w, "top");
  vw_puts(w, "[");
  for (size_t i = 0; i < x->nby_source; i++) {
    vw_puts(w, i ? ",{\"key\":" : "{\"key\":");
    vw_str(w, x->by_source[i].key);
    answer_key(w, "bytes");
    vw_u64(w, x->by_source[i].bytes);
    answer_key(w, "blocks");
    vw_u64(w, x->by_source[i].blocks);
    vw_puts(w, "}");
  }
  vw_puts(w, "]");
  answer_key(w, "by_category");
  vw_puts(w, "[");
  for (size_t i = 0; i < x->nby_category; i++) {
    vw_puts(w, i ? ",{\"key\":" : "{\"key\":");
    vw_str(w, x->by_category[i].key);
    answer_key(w, "bytes");
    vw_u64(w, x->by_category[i].bytes);
    vw_puts(w, "}");
  }
  vw_puts(w, "]");
  answer_remedies(w, x);
  answer_key(w, "replayed");
  vw_puts(w, x->nremedies ? "true" : "false");
  answer_key(w, "replay_note");
  vw_str(w, x->replay_note);
  answer_key(w, "recommendation");
  vw_str(w, x->recommendation);
  answer_key(w, "hint");
  vw_str(w, x->hint);
  answer_key(w, "series");
  vw_puts(w, "[");
  for (size_t i = 0; i < x->nseries; i++) {
    vw_puts(w, i ? ",[" : "[");
    vw_u64(w, x->series_step[i]);
    vw_puts(w, ",");
    vw_u64(w, x->series_allocated[i]);
    vw_puts(w, ",");
    vw_u64(w, x->series_reserved[i]);
    vw_puts(w, "]");
  }
  vw_puts(w, "]}");
}

void ms__view_answer_json(vw_t *w, const ms_snapshot_t *s, size_t dev, int replay) {
  ms_explain_options_t o;
  ms_explain_options_init(&o);
  o.device = (int)dev;
  o.min_capacity = false;
  o.remedies = replay > 0 || (replay < 0 && ms_snapshot_oom_count(s, dev) > 0);
  o.series_points = 1000;
  ms_explain_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_explain_run(s, &o, &x, &eb);
  if (rc != MS_OK) {
    /* the panel says why there is no answer (an inconsistent trace, no memory) */
    vw_puts(w, "{\"error\":");
    vw_str(w, eb.msg[0] ? eb.msg : ms_strerror(rc));
    vw_puts(w, "}");
    return;
  }
  answer_body(w, x);
  ms_explain_free(x);
}
