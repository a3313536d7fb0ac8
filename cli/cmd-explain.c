/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap explain FILE [--device N] [--at MOMENT] [--capacity SIZE] [--json]`
 * (issue #26, docs/explain.md): why memory ran out or peaked, and which setting would have
 * avoided it, with the replays as proof. The analysis is the library's (memsnap/explain.h); this
 * file prints it as text or JSON. The answer is stored in the snapshot cache, and a second run
 * of the same question on the same bytes prints it (cli/answers.c, docs/performance.md).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/explain.h"
#include "memsnap/replay.h"
#include "memsnap/stats.h"

static const char explain_usage[] =
    "usage: memsnap explain FILE [--device N] [--at MOMENT] [--capacity SIZE] [--json]\n"
    "                       [--no-replay] [--no-min-capacity] [-n N]\n"
    "\n"
    "Says why memory ran out (the first OOM of the trace) or peaked (without an OOM): the\n"
    "request, the allocator's state then (capacity, reserved, allocated, free bytes per pool, the\n"
    "largest free block, inactive split bytes, private pools, memory outside the allocator), a\n"
    "verdict (full, fragmentation, releasable, private_pool or unknown), the biggest holders,\n"
    "and remedies (expandable_segments, max_split_size_mb, garbage_collection_threshold,\n"
    "roundup_power2_divisions and combinations) replayed at the device's capacity: whether each\n"
    "avoids the OOM, its peak reserved memory and the smallest capacity it runs on; then one\n"
    "recommendation. FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  -d, --device N     device N (default: the first device with an OOM, else the device\n"
    "                     with the longest trace)\n"
    "  --at MOMENT        oom (the first OOM), oom:N, peak, peak-reserved, end, step=N, an\n"
    "                     entry index, or a time t=... (default: oom, else peak)\n"
    "  --capacity SIZE    the device's capacity (24GiB, 80000M, ...); default: the size the\n"
    "                     snapshot records, else reserved + device_free at the first OOM\n"
    "  --json             print the answer as JSON (docs/explain.md names every field)\n"
    "  --no-replay        skip the remedies' replays (the state and verdict only)\n"
    "  --no-min-capacity  replay each remedy at the capacity only, without the search\n"
    "  -n N               list the N biggest holders (default 10)\n"
    "  -h, --help         show this help\n";

#define SZ(v, b) cli_format_ubytes((v), (b))

static void explain_capacity_text(const ms_explain_t *x, char *buf, size_t cap) {
  char a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ], c[CLI_BYTES_BUFSZ];
  switch (x->capacity_source) {
  case MS_CAPACITY_GIVEN: snprintf(buf, cap, "%s (--capacity)", SZ(x->capacity, a)); return;
  case MS_CAPACITY_RECORDED:
    snprintf(buf, cap, "%s (recorded in the snapshot)", SZ(x->capacity, a));
    return;
  case MS_CAPACITY_INFERRED:
    snprintf(buf, cap, "%s (inferred from the recorded OOM at entry %zu: reserved %s + %s free "
             "on the device)", SZ(x->capacity, a), x->capacity_oom.entry,
             SZ(x->capacity_oom.reserved, b), SZ(x->capacity_oom.device_free, c));
    return;
  case MS_CAPACITY_UNKNOWN: break;
  }
  snprintf(buf, cap, "unknown (the snapshot records no device size and no OOM says it; pass "
           "--capacity)");
}

static void explain_pool_name(const ms_explain_pool_t *p, char *buf, size_t cap) {
  snprintf(buf, cap, "%s pool (%" PRId64 ",%" PRId64 "), stream %" PRIu64 ", %s",
           p->pool_id[0] || p->pool_id[1] ? "private" : "default", p->pool_id[0], p->pool_id[1],
           p->stream, p->large ? "large" : "small");
}

/* ---- text ------------------------------------------------------------------------------------- */

static void explain_text_state(FILE *out, const ms_snapshot_t *snap, const ms_explain_t *x) {
  char a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ], buf[512];
  (void)snap;
  if (x->has_request) {
    fprintf(out, "request:   %s (%" PRIu64 " bytes; %s rounded) on stream %" PRIu64 ", %s pool%s; "
           "a new segment for it: %s\n",
           SZ(x->request_bytes, a), x->request_bytes, SZ(x->request_rounded, b), x->request_stream,
           x->request_large ? "large" : "small",
           x->request_pool[0] || x->request_pool[1] ? " of a private pool" : "",
           SZ(x->request_segment, buf));
  }
  explain_capacity_text(x, buf, sizeof buf);
  fprintf(out, "capacity:  %s\n", buf);
  fprintf(out, "state:\n");
  fprintf(out, "  %-36s %12s\n", "reserved", SZ(x->reserved_bytes, a));
  fprintf(out, "  %-36s %12s\n", "allocated", SZ(x->allocated_bytes, a));
  fprintf(out, "  %-36s %12s\n", "requested", SZ(x->requested_bytes, a));
  if (x->has_device_free) fprintf(out, "  %-36s %12s\n", "free on the device", SZ(x->device_free, a));
  fprintf(out, "  %-36s %12s\n", "free in the cache", SZ(x->cached_free_bytes, a));
  for (size_t i = 0; i < x->npools; i++) {
    const ms_explain_pool_t *p = &x->pools[i];
    explain_pool_name(p, buf, sizeof buf);
    fprintf(out, "    %s: %zu segment%s, %s reserved, %s free, largest free block %s\n", buf,
           p->segments, p->segments == 1 ? "" : "s", SZ(p->reserved, a), SZ(p->free, b),
           SZ(p->largest_free, buf + 256));
  }
  if (x->has_request)
    fprintf(out, "  %-36s %12s  (the request: %s)\n", "largest free block, request's pool",
           SZ(x->largest_free_block_bytes, a), SZ(x->request_rounded, b));
  else
    fprintf(out, "  %-36s %12s\n", "largest free block", SZ(x->largest_free_block_bytes, a));
  fprintf(out, "  %-36s %12s\n", "inactive split", SZ(x->inactive_split_bytes, a));
  fprintf(out, "  %-36s %12s\n", "whole free segments (releasable)", SZ(x->releasable_bytes, a));
  fprintf(out, "  %-36s %12s\n", "private pools (CUDA graphs, MemPool)", SZ(x->private_pool_bytes, a));
  if (x->has_outside)
    fprintf(out, "  %-36s %12s\n", "outside the allocator", SZ(x->outside_allocator_bytes, a));
  else if (x->moment == MS_EXPLAIN_AT_OOM)
    fprintf(out, "  %-36s %12s\n", "outside the allocator", "unknown");
}

static void explain_text_remedies(FILE *out, const ms_explain_t *x) {
  char a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ], buf[256];
  if (x->nremedies == 0) return;
  explain_capacity_text(x, buf, sizeof buf);
  fprintf(out, "remedies, replayed at %s:\n", x->capacity ? buf : "an unlimited device (size unknown)");
  if (!x->replayable) {
    fprintf(out, "  none: %s\n", x->replay_note);
    return;
  }
  fprintf(out, "  %-58s %-10s %13s %13s\n", "configuration", "avoids OOM", "peak reserved",
         "min capacity");
  for (size_t i = 0; i < x->nremedies; i++) {
    const ms_explain_remedy_t *r = &x->remedies[i];
    const char *name = r->config[0] ? r->config : "(the recorded settings)";
    if (!r->replayed) {
      fprintf(out, "  %-58s %s\n", name, r->note);
      continue;
    }
    fprintf(out, "  %-58s %-10s %13s %13s\n", name,
           r->avoids_oom == 1 ? "yes" : r->avoids_oom == 0 ? "no" : "?",
           SZ(r->peak_reserved, a), r->min_capacity ? SZ(r->min_capacity, b) : "-");
  }
}

static void explain_text(FILE *out, const ms_snapshot_t *snap, const char *name,
                         const ms_explain_t *x) {
  char a[CLI_BYTES_BUFSZ];
  fprintf(out, "memsnap explain: '%s', device %zu\n", name, x->device);
  if (x->moment == MS_EXPLAIN_AT_END) {
    fprintf(out, "moment:    the end state (the snapshot's segments)\n");
  } else {
    const char *what = x->moment == MS_EXPLAIN_AT_OOM    ? "out of memory"
                       : x->moment == MS_EXPLAIN_AT_PEAK ? "the peak of allocated memory"
                                                         : "the moment asked for";
    if (x->entry >= 0) {
      const ms_snap_trace_t *e = &snap->trace[snap->devices[x->device].first_trace + x->entry];
      char t[96];
      cli_format_time(e, t, sizeof t);
      fprintf(out, "moment:    %s, after entry %" PRId64 " (%s)%s%s\n", what, x->entry,
             ms_snap_trace_action_name(e), t[0] ? ", " : "", t);
    } else {
      fprintf(out, "moment:    %s, before the first entry\n", what);
    }
  }
  if (x->step_number >= 0 || x->phase) {
    fprintf(out, "step:      ");
    if (x->step_number >= 0) fprintf(out, "step %" PRId64, x->step_number);
    if (x->phase) {
      fprintf(out, "%sphase \"", x->step_number >= 0 ? ", " : "");
      cli_fputs_escaped(x->phase, out);
      fprintf(out, "\"");
    }
    fprintf(out, "\n");
  }
  explain_text_state(out, snap, x);
  fprintf(out, "verdict:   %s\n", x->verdict_text);
  fprintf(out, "top holders by source line (allocated bytes, blocks, source):\n");
  for (size_t i = 0; i < x->nby_source; i++) {
    fprintf(out, "  %10s %6" PRIu64 "  ", SZ(x->by_source[i].bytes, a), x->by_source[i].blocks);
    cli_fputs_escaped(x->by_source[i].key, out);
    fputc('\n', out);
  }
  if (x->nby_source == 0) fprintf(out, "  (no allocated block)\n");
  bool any = false;
  for (size_t i = 0; i < x->nby_category; i++) {
    if (!x->by_category[i].bytes) continue;
    fprintf(out, any ? ", %s %s" : "by category: %s %s", x->by_category[i].key,
           SZ(x->by_category[i].bytes, a));
    any = true;
  }
  if (any) fprintf(out, " (docs/categories.md)\n");
  explain_text_remedies(out, x);
  if (x->recommendation[0]) fprintf(out, "recommendation: %s\n", x->recommendation);
  if (x->hint[0]) fprintf(out, "hint: %s\n", x->hint);
}

/* ---- JSON ------------------------------------------------------------------------------------- */

/* The answer's members are the library's (ms_explain_write_json), written through the command's
 * JSON writer; top_by_stack's keys are the stacks' labels as `top` prints them. */
typedef struct explain_jctx_s {
  cli_json_t *j;
  const ms_snapshot_t *snap;
} explain_jctx_t;

static void explain_jlit(void *ctx, const char *s) { cli_json_lit(((explain_jctx_t *)ctx)->j, s); }
static void explain_jstr(void *ctx, const char *s) { cli_json_str(((explain_jctx_t *)ctx)->j, s); }
static void explain_ju64(void *ctx, uint64_t v) { cli_json_u64(((explain_jctx_t *)ctx)->j, v); }
static void explain_ji64(void *ctx, int64_t v) { cli_json_i64(((explain_jctx_t *)ctx)->j, v); }

static void explain_jstack(void *ctx, uint32_t stack, char *buf, size_t cap) {
  cli_stack_label(((explain_jctx_t *)ctx)->snap, stack, buf, cap);
}

static int explain_file_write(void *ctx, const char *p, size_t n) {
  return fwrite(p, 1, n, (FILE *)ctx) == n ? MS_OK : MS_EIO;
}

/* The JSON document on out: standard output through cli_out_t, or the stream of a stored answer
 * (which writes through to standard output; a failed write there is main's to report). */
static int explain_json(FILE *out, const ms_snapshot_t *snap, const char *name,
                        const ms_explain_t *x) {
  cli_out_t o;
  ms_sink_t file_sink = {explain_file_write, out};
  if (out == stdout) {
    int rc = cli_out_open(&o, "-");
    if (rc != CLI_OK) return rc;
  }
  cli_json_t j = {out == stdout ? &o.sink : &file_sink, 0};
  cli_json_lit(&j, "{\"command\": \"explain\", \"file\": ");
  cli_json_str(&j, name);
  cli_json_lit(&j, ", ");
  explain_jctx_t c = {&j, snap};
  const ms_json_writer_t w = {&c, explain_jlit, explain_jstr, explain_ju64, explain_ji64,
                              explain_jstack};
  ms_explain_write_json(x, &w, 0);
  cli_json_lit(&j, "}\n");
  if (out != stdout) return CLI_OK;
  if (j.err != MS_OK) return cli_out_fail(&o, j.err, NULL);
  return cli_out_commit(&o);
}

/* ---- the command ------------------------------------------------------------------------------ */

int cmd_explain(int argc, char **argv) {
  int json = 0, no_replay = 0, no_min = 0;
  const char *device_s = NULL, *at_s = NULL, *capacity_s = NULL, *n_s = NULL;
  const struct cli_opt opts[] = {{"json", 0, &json, NULL},
                                 {"no-replay", 0, &no_replay, NULL},
                                 {"no-min-capacity", 0, &no_min, NULL},
                                 {"device", 0, NULL, &device_s},
                                 {"at", 0, NULL, &at_s},
                                 {"capacity", 0, NULL, &capacity_s},
                                 {"n", 'n', NULL, &n_s},
                                 {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("explain", explain_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("explain", "missing FILE");
  ms_explain_options_t eo;
  ms_explain_options_init(&eo);
  eo.remedies = !no_replay;
  eo.min_capacity = !no_min;
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse("explain", &ta, device_s, NULL, NULL, NULL, at_s)) != CLI_OK)
    return rc;
  if (ta.has_device) eo.device = (int)ta.device;
  if (ta.has_at) {
    eo.has_moment = true;
    eo.moment = ta.at;
  }
  if (capacity_s) {
    size_t cap = 0;
    ms_errbuf_t eb = {{0}};
    if (ms_replay_parse_capacity(capacity_s, &cap, &eb) != MS_OK)
      return cli_usage_error("explain", "invalid size '%s' for --capacity: %s", capacity_s,
                             eb.msg);
    eo.capacity = cap;
  }
  if (n_s) {
    uint64_t v;
    if (!cli_parse_u64(n_s, &v) || v == 0 || v > 100000)
      return cli_usage_error("explain", "option '-n' needs a number from 1 to 100000, not '%s'",
                             n_s);
    eo.ntop = (size_t)v;
  }
  /* the answer through the cache (cli/answers.c): the options as given, and the file's name,
   * which the answer prints */
  static const char *const names[7] = {"file", "device", "at", "capacity", "n", "no-replay",
                                       "no-min-capacity"};
  const char *const vals[7] = {cli_display_name(pos[0]), device_s, at_s, capacity_s, n_s,
                               no_replay ? "1" : NULL, no_min ? "1" : NULL};
  cli_answer_t ans;
  cli_answer_open(&ans, "explain", pos[0], MS_LOAD_NO_FREE_STACKS, 7, names, vals, json != 0,
                  NULL);
  if (cli_answer_serve(&ans)) return CLI_OK;
  ms_snapshot_t *snap = NULL;
  /* every stack read with the trace: the remedies' replays compare the allocations' stacks (what
   * released a burst of segments), and the holders of equal bytes are in the order of their
   * stacks' ids */
  if ((rc = cli_load_ex(pos[0], MS_LOAD_NO_FREE_STACKS, &snap)) != CLI_OK) {
    cli_answer_close(&ans, rc, NULL);
    return rc;
  }
  const char *name = cli_display_name(pos[0]);
  ms_explain_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  cli_progress_start("explaining '%s'", name);
  /* the time index stored by an earlier run (memsnap/cache.h) when the snapshot came from the
   * cache; on any failure explain builds it and reports what is wrong itself */
  ms_timeline_t *tl = NULL;
  const ms_cache_key_t *key = cli_cache_key(snap);
  if (key && ms_cache_timeline(key, NULL, snap, NULL, &tl, NULL, NULL) == MS_OK) eo.timeline = tl;
  int err = ms_explain_run(snap, &eo, &x, &eb);
  ms_timeline_destroy(tl);
  cli_progress_stop();
  if (err != MS_OK) {
    cli_error("'%s': %s", name, eb.msg[0] ? eb.msg : ms_strerror(err));
    cli_answer_close(&ans, CLI_FAILURE, NULL);
    ms_snapshot_free(snap);
    return CLI_FAILURE;
  }
  FILE *out = cli_answer_stream(&ans);
  if (json) rc = explain_json(out, snap, name, x);
  else explain_text(out, snap, name, x);
  cli_answer_close(&ans, rc, cli_cache_key(snap));
  ms_explain_free(x);
  ms_snapshot_free(snap);
  return rc;
}
