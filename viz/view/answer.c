/* SPDX-License-Identifier: MIT
 * memsnap viewer: the data of the Explain panel (docs/view.md, issue #26 §5): each listed
 * device's answer (memsnap/explain.h) as JSON in the page's "ms-data" element, the members of
 * `memsnap explain --json` (ms_explain_write_json: the moment, the capacity, the figures, the
 * verdict, the holders, the remedies, the recommendation) and the viewer's own: the allocated
 * and reserved bytes over the trace for the panel's chart. viz/view/explain.js draws it.
 */
#include <stdio.h>
#include <string.h>

#include "memsnap/explain.h"
#include "answer.h"

/* The library's JSON writer (ms_explain_write_json) onto the page's: strings escaped for HTML. */
static void answer_lit(void *w, const char *s) { vw_puts(w, s); }
static void answer_str(void *w, const char *s) { vw_str(w, s); }
static void answer_u64(void *w, uint64_t v) { vw_u64(w, v); }
static void answer_i64(void *w, int64_t v) { vw_i64(w, v); }

void ms__view_answer_json(vw_t *w, const ms_snapshot_t *s, const ms_timeline_t *tl,
                          const ms_attr_t *attr, size_t dev, int replay) {
  ms_explain_options_t o;
  ms_explain_options_init(&o);
  o.device = (int)dev;
  o.min_capacity = false;
  o.remedies = replay > 0 || (replay < 0 && ms_snapshot_oom_count(s, dev) > 0);
  o.series_points = 1000;
  o.timeline = tl;
  o.attr = tl ? attr : NULL;
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
  const ms_json_writer_t jw = {w, answer_lit, answer_str, answer_u64, answer_i64, NULL};
  vw_puts(w, "{");
  ms_explain_write_json(x, &jw, MS_EXPLAIN_JSON_VIEWER);
  vw_puts(w, "}");
  ms_explain_free(x);
}
