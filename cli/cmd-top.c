/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap top FILE [--at MOMENT] [-n N] [--by stack|frame|file|size] [--json]`
 * (issue #12 §4): the biggest consumers of allocated memory at a moment (default: the peak of
 * allocated bytes), grouped by allocation stack, innermost (kept) frame, its file, or block size.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/timeline.h"
#include "memsnap/views.h"

static const char top_usage[] =
    "usage: memsnap top FILE [--at MOMENT] [-n N] [--by stack|frame|file|size] [--json]\n"
    "                   [--device N] [--range A:B] [--stream S] [--pool A,B]\n"
    "       memsnap top FILE FILE...|DIR [--json] [--jobs N]   (one row per rank, at its peak)\n"
    "\n"
    "Lists the biggest consumers of allocated memory at a moment: bytes, number of blocks,\n"
    "share of all allocated bytes, and the stack (or frame, file, block size) that allocated\n"
    "them. FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "\n"
    "options:\n"
    "  --at MOMENT   peak (default: the peak of allocated bytes), peak-reserved, end, an entry\n"
    "                index (the state after that trace entry; -1 = before the first), or a time\n"
    "                in microseconds written t=1700000000123456 or 1700000000123456us\n"
    "  -n N          show the N biggest (default 10; 0 = all)\n"
    "  --by KEY      group by stack (default), frame (innermost frame kept by PyTorch's\n"
    "                filter), file (that frame's file) or size (block size)\n"
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
static void top_text_stack(FILE *out, const ms_snapshot_t *s, uint32_t stack) {
  const ms_snap_stack_t *st = &s->stacks[stack];
  bool python = false;
  for (uint32_t k = 0; k < st->nframes && !python; k++)
    python = top_is_python(&s->frames[ms_snap_frame_index(s, st->first + k)]);
  int shown = 0;
  bool skipped_label = false;
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
    fprintf(out, "%31s%s\n", "", label);
    shown++;
  }
}

static bool top_parse_by(const char *s, cli_top_by *by) {
  static const char *const names[] = {"stack", "frame", "file", "size"};
  for (int i = 0; i < 4; i++) {
    if (strcmp(s, names[i]) == 0) {
      *by = (cli_top_by)i;
      return true;
    }
  }
  return false;
}

/* What "<no frame>" means, said under the rows where one appears. */
static const char top_no_frame_note[] =
    "\n<no frame>: a stack without a frame that PyTorch's filter keeps (only allocator or C++ "
    "frames,\nor none recorded)\n";

int cmd_top(int argc, char **argv) {
  int json = 0;
  const char *at_s = NULL, *n_s = NULL, *by_s = NULL, *device_s = NULL, *range_s = NULL,
             *stream_s = NULL, *pool_s = NULL, *jobs_s = NULL;
  const struct cli_opt opts[] = {{"jobs", 0, NULL, &jobs_s},
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
    if (at_s || n_s || by_s || device_s || range_s || stream_s || pool_s)
      rc = cli_usage_error("top", "with several FILEs only --json and --jobs apply");
    else
      rc = cli_ranks("top", pos, npos, json != 0, jobs_s);
    free(pos);
    return rc;
  }
  char *file = npos > 0 ? pos[0] : NULL;
  free(pos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (!file) return cli_usage_error("top", "missing FILE");
  if (jobs_s) return cli_usage_error("top", "option '--jobs' needs several FILEs");
  uint64_t limit = 10;
  if (n_s && !cli_parse_u64(n_s, &limit))
    return cli_usage_error("top", "option '-n' needs a number, not '%s'", n_s);
  cli_top_by by = CLI_TOP_STACK;
  if (by_s && !top_parse_by(by_s, &by))
    return cli_usage_error("top", "option '--by' needs stack, frame, file or size, not '%s'",
                           by_s);
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse("top", &ta, device_s, range_s, stream_s, pool_s,
                              at_s ? at_s : "peak")) != CLI_OK)
    return rc;
  ms_snapshot_t *snap = NULL;
  /* the trace is read through the time index, which never uses free_requested's stacks */
  if ((rc = cli_load_ex(file, MS_LOAD_NO_FREE_STACKS, &snap)) != CLI_OK) return rc;
  const char *name = cli_display_name(file);
  ms_snapshot_t *at = NULL;
  size_t dev = 0, step = 0;
  rc = cli_at_snapshot(snap, name, &ta, false, &at, &dev, &step);
  cli_top_t top;
  memset(&top, 0, sizeof top);
  if (rc == CLI_OK && cli_top_compute(at, by, &top) != MS_OK) {
    cli_error("out of memory");
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) {
    static const char *const bys[] = {"stack", "frame", "file", "size"};
    const ms_snap_trace_t *e =
        step > 0 ? &snap->trace[snap->devices[dev].first_trace + step - 1] : NULL;
    size_t shown = limit == 0 || limit > top.nitems ? top.nitems : (size_t)limit;
    FILE *out = stdout;
    char b[CLI_BYTES_BUFSZ];
    if (json) {
      fprintf(out, "{\"device\": %zu, \"moment\": ", dev);
      top_json_str(out, ta.at_text);
      fprintf(out, ", \"entry\": %" PRId64 ", \"time_us\": ", (int64_t)step - 1);
      if (e && (e->present & MS_TRACE_HAS_TIME))
        fprintf(out, "%" PRId64, e->time_us);
      else
        fputs("null", out);
      fprintf(out, ", \"by\": \"%s\", \"total_bytes\": %" PRIu64 ", \"total_count\": %" PRIu64
                   ", \"groups\": [",
              bys[by], top.total, top.count);
      for (size_t i = 0; i < shown; i++) {
        char label[1024];
        cli_top_label(at, &top, i, label, sizeof label);
        fprintf(out, "%s\n{\"bytes\": %" PRIu64 ", \"count\": %" PRIu64 ", \"share\": %.6f, ",
                i ? "," : "", top.items[i].bytes, top.items[i].count,
                top.total ? (double)top.items[i].bytes / (double)top.total : 0.0);
        fputs("\"label\": ", out);
        top_json_str(out, label);
        if (by == CLI_TOP_STACK) {
          fputs(", \"frames\": [", out);
          top_frames(out, at, (uint32_t)top.items[i].key, true, "");
          fputc(']', out);
        }
        fputc('}', out);
      }
      fputs("]}\n", out);
    } else {
      if (step > 0) {
        char t[96];
        cli_format_time(e, t, sizeof t);
        fprintf(out, "device %zu at %s: after entry %zu (%s)%s%s\n", dev, ta.at_text, step - 1,
                ms_trace_action_name(e->action), t[0] ? ", " : "", t);
      } else {
        fprintf(out, "device %zu at %s: before entry 0\n", dev, ta.at_text);
      }
      fprintf(out, "allocated: %s (%" PRIu64 " bytes) in %" PRIu64 " blocks\n\n",
              cli_format_bytes((int64_t)top.total, b), top.total, top.count);
      fprintf(out, "%12s %7s %8s  %s\n", "bytes", "share", "blocks", bys[by]);
      bool no_frame = false;
      for (size_t i = 0; i < shown; i++) {
        char label[1024];
        cli_top_label(at, &top, i, label, sizeof label);
        no_frame |= strncmp(label, "<no frame>", 10) == 0;
        fprintf(out, "%12s %6.1f%% %8" PRIu64 "  %s\n",
                cli_format_bytes((int64_t)top.items[i].bytes, b),
                top.total ? 100.0 * (double)top.items[i].bytes / (double)top.total : 0.0,
                top.items[i].count, label);
        if (by == CLI_TOP_STACK && top.items[i].key != MS_SNAP_NO_STACK)
          top_text_stack(out, at, (uint32_t)top.items[i].key);
      }
      if (top.nitems == 0) fprintf(out, "(no allocated block at that moment)\n");
      if (no_frame) fputs(top_no_frame_note, out);
    }
  }
  cli_top_release(&top);
  ms_snapshot_free(at);
  ms_snapshot_free(snap);
  return rc;
}
