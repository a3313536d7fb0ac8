/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap top FILE [--at MOMENT] [-n N] [--by KEY] [--json]` (issue #12 §4, issue
 * #27): the biggest consumers of allocated memory at a moment (default: the peak of allocated
 * bytes), grouped by source (the user's own line, default), category, allocation stack, innermost
 * (kept) frame, its file, or block size. Source, category and stack come from the classifier
 * (memsnap/attribution.h); frame, file and size from the state as a snapshot. An answer is stored
 * in the snapshot cache, and a second top of the same bytes with the same options prints it
 * (docs/performance.md).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/attribution.h"
#include "memsnap/cache.h"
#include "memsnap/timeline.h"
#include "memsnap/views.h"

static const char top_usage[] =
    "usage: memsnap top FILE [--at MOMENT] [-n N] [--by KEY] [--categories RULES] [--json]\n"
    "                   [--device N] [--range A:B] [--stream S] [--pool A,B]\n"
    "       memsnap top FILE FILE...|DIR [--json] [--jobs N] [--keep-going]\n"
    "                                  (one row per rank, at its peak)\n"
    "\n"
    "Lists the biggest consumers of allocated memory at a moment: bytes, number of blocks,\n"
    "share of all allocated bytes, and the source line (or category, stack, frame, file,\n"
    "block size) that allocated them. FILE is a memsnap snapshot or a PyTorch pickle ('-'\n"
    "reads standard input).\n"
    "\n"
    "options:\n"
    "  --at MOMENT   peak (default: the peak of allocated bytes), peak-reserved, end, an entry\n"
    "                index (the state after that trace entry; -1 = before the first), or a time\n"
    "                in microseconds written t=1700000000123456 or 1700000000123456us\n"
    "  -n N          show the N biggest (default 10; 0 = all)\n"
    "  --by KEY      group by source (default: the innermost frame of your own code, with\n"
    "                the operator beside it when one line allocates through several),\n"
    "                category (parameter, gradient, optimizer_state, activation, temporary,\n"
    "                input, autograd_detail, unknown), stack, frame (innermost frame kept by\n"
    "                PyTorch's filter), file (that frame's file) or size (block size)\n"
    "  --categories RULES  a rules file that extends (or, with 'defaults none', replaces) the\n"
    "                default rules of sources and categories (docs/categories.md)\n"
    "  --json        print the result as JSON\n"
    "  --device N    device N (default: the device with the longest trace)\n"
    "  --range A:B   resolve peaks within trace entries A to B\n"
    "  --stream S    only segments of stream S; --pool A,B: only segments of pool (A, B)\n"
    "  -h, --help    show this help\n";

static void top_json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(out, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(out, "\\u%04x", *p);
    else
      fputc(*p, out);
  }
  fputc('"', out);
}

/* The kept frames of a stack, innermost first, formatted as the flame graph names them. */
static void top_frames(FILE *out, const ms_snapshot_t *s, uint32_t stack, bool json,
                       const char *indent) {
  if (stack == MS_SNAP_NO_STACK || stack >= s->nstacks) return;
  const ms_snap_stack_t *st = &s->stacks[stack];
  bool first = true;
  for (uint32_t i = 0; i < st->nframes; i++) {
    const ms_snap_frame_t *f = &s->frames[ms_snap_frame_index(s, st->first + i)];
    if (!ms_view_frame_kept(f->name, f->filename)) continue;
    char buf[1024];
    ms_view_frame_format(buf, sizeof buf, f);
    if (json) {
      if (!first) fputs(", ", out);
      top_json_str(out, buf);
    } else {
      fprintf(out, "%s%s\n", indent, buf);
    }
    first = false;
  }
}

static bool top_is_python(const ms_snap_frame_t *f) {
  size_t len = strlen(f->filename);
  return len >= 3 && strcmp(f->filename + len - 3, ".py") == 0;
}

/* The rest of a stack under its label: its Python frames (innermost first, at most 12), or the
 * first frames PyTorch's filter keeps when it has none. */
static void top_text_stack(FILE *out, const ms_snapshot_t *s, uint32_t stack, int indent,
                           bool skip_label) {
  const ms_snap_stack_t *st = &s->stacks[stack];
  bool python = false;
  for (uint32_t k = 0; k < st->nframes && !python; k++)
    python = top_is_python(&s->frames[ms_snap_frame_index(s, st->first + k)]);
  int shown = 0;
  bool skipped_label = !skip_label;
  for (uint32_t k = 0; k < st->nframes && shown < 12; k++) {
    const ms_snap_frame_t *f = &s->frames[ms_snap_frame_index(s, st->first + k)];
    if (!ms_view_frame_kept(f->name, f->filename)) continue;
    if (python && !top_is_python(f)) continue;
    if (!skipped_label) { /* the label line shows it */
      skipped_label = true;
      continue;
    }
    char label[1024];
    ms_view_frame_format(label, sizeof label, f);
    fprintf(out, "%*s%s\n", indent, "", label);
    shown++;
  }
}

static bool top_parse_by(const char *s, cli_top_by *by) {
  static const char *const names[] = {"stack", "frame", "file", "size"};
  for (int i = 1; i < 4; i++) {
    if (strcmp(s, names[i]) == 0) {
      *by = (cli_top_by)i;
      return true;
    }
  }
  return false;
}

/* The moment's header line (text) or fields (JSON). */
static void top_head(FILE *out, const ms_snapshot_t *snap, size_t dev, size_t step,
                     const char *at_text, bool json, const char *by, uint64_t total,
                     uint64_t count) {
  const ms_snap_trace_t *e =
      step > 0 ? &snap->trace[snap->devices[dev].first_trace + step - 1] : NULL;
  char b[CLI_BYTES_BUFSZ];
  if (json) {
    fprintf(out, "{\"device\": %zu, \"moment\": ", dev);
    top_json_str(out, at_text);
    fprintf(out, ", \"entry\": %" PRId64 ", \"time_us\": ", (int64_t)step - 1);
    if (e && (e->present & MS_TRACE_HAS_TIME))
      fprintf(out, "%" PRId64, e->time_us);
    else
      fputs("null", out);
    fprintf(out, ", \"by\": \"%s\", \"total_bytes\": %" PRIu64 ", \"total_count\": %" PRIu64
                 ", \"groups\": [",
            by, total, count);
    return;
  }
  if (step > 0) {
    char t[96];
    cli_format_time(e, t, sizeof t);
    fprintf(out, "device %zu at %s: after entry %zu (%s)%s%s\n", dev, at_text, step - 1,
            ms_trace_action_name(e->action), t[0] ? ", " : "", t);
  } else {
    fprintf(out, "device %zu at %s: before entry 0\n", dev, at_text);
  }
  fprintf(out, "allocated: %s (%" PRIu64 " bytes) in %" PRIu64 " blocks\n\n",
          cli_format_bytes((int64_t)total, b), total, count);
}

/* The rows of the classifier (--by category, source, stack). */
static void top_attr_print(FILE *out, const ms_snapshot_t *snap, const ms_attr_t *a,
                           const ms_attr_rows_t *r, ms_attr_by by, size_t shown, bool json) {
  static const char *const bys[] = {"category", "source", "stack"};
  char b[CLI_BYTES_BUFSZ];
  if (!json)
    fprintf(out, "%12s %7s %8s  %s%s\n", "bytes", "share", "blocks",
            by == MS_ATTR_BY_CATEGORY ? "" : "category         ", bys[by]);
  for (size_t i = 0; i < shown; i++) {
    const ms_attr_row_t *w = &r->rows[i];
    double share = r->total_bytes ? (double)w->bytes / (double)r->total_bytes : 0.0;
    if (json) {
      fprintf(out, "%s\n{\"key\": ", i ? "," : "");
      top_json_str(out, w->key);
      fprintf(out, ", \"bytes\": %" PRIu64 ", \"blocks\": %" PRIu64 ", \"count\": %" PRIu64
                   ", \"share\": %.6f, \"category\": \"%s\", \"label\": ",
              w->bytes, w->blocks, w->blocks, share, ms_category_name(w->category));
      top_json_str(out, w->key);
      if (by == MS_ATTR_BY_STACK) {
        fputs(", \"frames\": [", out);
        top_frames(out, snap, w->stack, true, "");
        fputc(']', out);
      }
      fputc('}', out);
      continue;
    }
    fprintf(out, "%12s %6.1f%% %8" PRIu64 "  ", cli_format_bytes((int64_t)w->bytes, b),
            100.0 * share, w->blocks);
    if (by != MS_ATTR_BY_CATEGORY) fprintf(out, "%-16s ", ms_category_name(w->category));
    if (by == MS_ATTR_BY_STACK && w->stack != MS_SNAP_NO_STACK) {
      /* a stack reads as its source, then its Python frames (or kept ones) below it */
      char src[1024];
      ms_attr_source(a, w->stack, src, sizeof src);
      cli_fputs_escaped(src, out);
      fputc('\n', out);
      top_text_stack(out, snap, w->stack, 48, false);
      continue;
    }
    cli_fputs_escaped(w->key, out);
    fputc('\n', out);
  }
  if (json) fputs("]}\n", out);
  else if (r->total_blocks == 0) fprintf(out, "(no allocated block at that moment)\n");
}

/* top --by category|source|stack: the classifier's rows at the moment. */
static int top_attr(FILE *out, const ms_snapshot_t *snap, const char *name,
                    const cli_tl_args_t *ta, ms_attr_by by, const char *rules, uint64_t limit,
                    bool json) {
  static const char *const bys[] = {"category", "source", "stack"};
  size_t dev, from, to, step = 0;
  int rc = cli_tl_device(snap, name, ta, &dev);
  if (rc != CLI_OK) return rc;
  ms_timeline_t *tl = NULL;
  cli_tl_args_t ta2 = *ta; /* the index counts every segment; the rows apply the filter */
  memset(&ta2.filter, 0, sizeof ta2.filter);
  if ((rc = cli_tl_open(snap, name, &ta2, &tl)) != CLI_OK) return rc;
  ms_attr_t *a = NULL;
  ms_attr_rows_t rows = {0};
  rc = cli_tl_steps(tl, name, ta, dev, &from, &to);
  if (rc == CLI_OK) {
    ms_errbuf_t eb = {{0}};
    if (ms_timeline_moment_step(tl, dev, &ta->at, from, to, &step, &eb) != MS_OK) {
      cli_error("'%s': --at %s: %s", name, ta->at_text, eb.msg);
      rc = CLI_FAILURE;
    }
  }
  if (rc == CLI_OK) rc = cli_attr_open(snap, tl, rules, &a);
  const ms_tl_filter_t *f = ta->filter.has_stream || ta->filter.has_pool ? &ta->filter : NULL;
  if (rc == CLI_OK && ms_attr_aggregate(a, dev, step, f, by, &rows) != MS_OK) {
    cli_error("out of memory");
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) {
    size_t shown = limit == 0 || limit > rows.nrows ? rows.nrows : (size_t)limit;
    top_head(out, snap, dev, step, ta->at_text, json, bys[by], rows.total_bytes,
             rows.total_blocks);
    top_attr_print(out, snap, a, &rows, by, shown, json);
  }
  ms_attr_rows_free(&rows);
  ms_attr_destroy(a);
  ms_timeline_destroy(tl);
  return rc;
}

/* What "<no frame>" means, said under the rows where one appears. */
static const char top_no_frame_note[] =
    "\n<no frame>: a stack without a frame that PyTorch's filter keeps (only allocator or C++ "
    "frames,\nor none recorded)\n";

/* The rows of cli_top_compute (--by stack, frame, file, size) at the state `at`. */
static void top_plain_print(FILE *out, const ms_snapshot_t *at, const cli_top_t *top,
                            cli_top_by by, size_t shown, bool json) {
  static const char *const bys[] = {"stack", "frame", "file", "size"};
  char b[CLI_BYTES_BUFSZ];
  if (json) {
    for (size_t i = 0; i < shown; i++) {
      char label[1024];
      cli_top_label(at, top, i, label, sizeof label);
      fprintf(out, "%s\n{\"key\": ", i ? "," : "");
      top_json_str(out, label);
      fprintf(out, ", \"bytes\": %" PRIu64 ", \"blocks\": %" PRIu64 ", \"count\": %" PRIu64
                   ", \"share\": %.6f, ",
              top->items[i].bytes, top->items[i].count, top->items[i].count,
              top->total ? (double)top->items[i].bytes / (double)top->total : 0.0);
      fputs("\"label\": ", out);
      top_json_str(out, label);
      if (by == CLI_TOP_STACK) {
        fputs(", \"frames\": [", out);
        top_frames(out, at, (uint32_t)top->items[i].key, true, "");
        fputc(']', out);
      }
      fputc('}', out);
    }
    fputs("]}\n", out);
    return;
  }
  fprintf(out, "%12s %7s %8s  %s\n", "bytes", "share", "blocks", bys[by]);
  bool no_frame = false;
  for (size_t i = 0; i < shown; i++) {
    char label[1024];
    cli_top_label(at, top, i, label, sizeof label);
    no_frame |= strncmp(label, "<no frame>", 10) == 0;
    fprintf(out, "%12s %6.1f%% %8" PRIu64 "  %s\n",
            cli_format_bytes((int64_t)top->items[i].bytes, b),
            top->total ? 100.0 * (double)top->items[i].bytes / (double)top->total : 0.0,
            top->items[i].count, label);
    if (by == CLI_TOP_STACK && top->items[i].key != MS_SNAP_NO_STACK)
      top_text_stack(out, at, (uint32_t)top->items[i].key, 31, true);
  }
  if (top->nitems == 0) fprintf(out, "(no allocated block at that moment)\n");
  if (no_frame) fputs(top_no_frame_note, out);
}

/* top --by stack|frame|file|size: the state at the moment as a snapshot, grouped. */
static int top_plain(FILE *out, const ms_snapshot_t *snap, const char *name,
                     const cli_tl_args_t *ta, cli_top_by by, uint64_t limit, bool json) {
  static const char *const bys[] = {"stack", "frame", "file", "size"};
  ms_snapshot_t *at = NULL;
  size_t dev = 0, step = 0;
  int rc = cli_at_snapshot(snap, name, ta, false, &at, &dev, &step);
  cli_top_t top;
  memset(&top, 0, sizeof top);
  if (rc == CLI_OK && cli_top_compute(at, by, &top) != MS_OK) {
    cli_error("out of memory");
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) {
    size_t shown = limit == 0 || limit > top.nitems ? top.nitems : (size_t)limit;
    top_head(out, snap, dev, step, ta->at_text, json, bys[by], top.total, top.count);
    top_plain_print(out, at, &top, by, shown, json);
  }
  cli_top_release(&top);
  ms_snapshot_free(at);
  return rc;
}

/* One top's question, as the options gave it. */
typedef struct top_req_s {
  const char *file, *rules;
  cli_tl_args_t ta;
  uint64_t limit;
  bool classify, json;
  ms_attr_by aby;
  cli_top_by by;
} top_req_t;

/* Reads the snapshot and writes the answer to out; *loaded = the cache key the snapshot was
 * filed under (all zero when it was not loaded through the cache). */
static int top_answer(const top_req_t *q, FILE *out, ms_cache_key_t *loaded) {
  memset(loaded, 0, sizeof *loaded);
  ms_snapshot_t *snap = NULL;
  /* the trace is read through the time index, which never uses free_requested's stacks; for
   * --range's window unless categories are shown (their phases need the whole trace). A
   * moment's blocks take their stacks from the file when they are grouped, and the categories
   * read every allocation's frames from it without keeping its stack */
  unsigned flags = MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS;
  if (q->classify) cli_classify_on_read(q->rules);
  int rc = cli_load_range(q->file, flags, q->classify ? NULL : &q->ta, &snap);
  if (rc != CLI_OK) return rc;
  const char *name = cli_display_name(q->file);
  if (q->classify)
    rc = top_attr(out, snap, name, &q->ta, q->aby, q->rules, q->limit, q->json);
  else
    rc = top_plain(out, snap, name, &q->ta, q->by, q->limit, q->json);
  const ms_cache_key_t *k = cli_cache_key(snap);
  if (k) *loaded = *k;
  ms_snapshot_free(snap);
  return rc;
}

int cmd_top(int argc, char **argv) {
  int json = 0, keep_going = 0;
  const char *at_s = NULL, *n_s = NULL, *by_s = NULL, *device_s = NULL, *range_s = NULL,
             *stream_s = NULL, *pool_s = NULL, *jobs_s = NULL, *rules_s = NULL;
  const struct cli_opt opts[] = {{"jobs", 0, NULL, &jobs_s},
                                 {"keep-going", 0, &keep_going, NULL},
                                 {"categories", 0, NULL, &rules_s},
                                 {"at", 0, NULL, &at_s},         {"n", 'n', NULL, &n_s},
                                 {"by", 0, NULL, &by_s},         {"json", 0, &json, NULL},
                                 {"device", 0, NULL, &device_s}, {"range", 0, NULL, &range_s},
                                 {"stream", 0, NULL, &stream_s}, {"pool", 0, NULL, &pool_s},
                                 {NULL, 0, NULL, NULL}};
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (!pos) return CLI_FAILURE;
  int npos = 0;
  int rc = cli_parse_options("top", top_usage, opts, argc, argv, pos, argc, &npos);
  if (rc == CLI_OK && cli_ranks_wanted(pos, npos)) { /* many ranks (cli/ranks.c) */
    if (at_s || n_s || by_s || device_s || range_s || stream_s || pool_s || rules_s)
      rc = cli_usage_error("top",
                           "with several FILEs only --json, --jobs and --keep-going apply");
    else
      rc = cli_ranks("top", pos, npos, json != 0, jobs_s, keep_going != 0);
    free(pos);
    return rc;
  }
  top_req_t q;
  memset(&q, 0, sizeof q);
  q.file = npos > 0 ? pos[0] : NULL;
  free(pos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (!q.file) return cli_usage_error("top", "missing FILE");
  if (jobs_s) return cli_usage_error("top", "option '--jobs' needs several FILEs");
  if (keep_going)
    return cli_usage_error("top", "option '--keep-going' needs several FILEs");
  q.limit = 10;
  if (n_s && !cli_parse_u64(n_s, &q.limit))
    return cli_usage_error("top", "option '-n' needs a number, not '%s'", n_s);
  q.by = CLI_TOP_STACK;
  q.aby = MS_ATTR_BY_SOURCE;
  q.classify = !by_s || cli_attr_by_parse(by_s, &q.aby);
  if (!q.classify && !top_parse_by(by_s, &q.by))
    return cli_usage_error("top", "option '--by' needs source, category, stack, frame, file or "
                           "size, not '%s'", by_s);
  if (rules_s && !q.classify)
    return cli_usage_error("top", "option '--categories' needs --by source, category or stack");
  if ((rc = cli_tl_args_parse("top", &q.ta, device_s, range_s, stream_s, pool_s,
                              at_s ? at_s : "peak")) != CLI_OK)
    return rc;
  q.rules = rules_s;
  q.json = json != 0;
  /* the answer through the cache (cli/answers.c): the options as given, in this order */
  static const char *const names[8] = {"at", "n", "by", "device", "range", "stream", "pool",
                                       "categories"};
  const char *const vals[8] = {at_s, n_s, by_s, device_s, range_s, stream_s, pool_s, rules_s};
  cli_answer_t c;
  cli_answer_open(&c, "top", q.file, MS_LOAD_NO_FREE_STACKS, 8, names, vals, q.json, q.rules);
  if (cli_answer_serve(&c)) return CLI_OK;
  ms_cache_key_t loaded;
  rc = top_answer(&q, cli_answer_stream(&c), &loaded);
  cli_answer_close(&c, rc, &loaded);
  return rc;
}
