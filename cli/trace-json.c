/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap trace FILE --json` (issue #16 item 5): each device's trace entries as
 * records, with the fields the snapshot holds (the text form's names a, b, ... are PyTorch's
 * pseudo-code and stay there). Schema in docs/cli.md (JSON outputs).
 */
#include <stdio.h>

#include "cli.h"
#include "memsnap/snapshot.h"

/* The entry's frames as the snapshot holds them, innermost first, unfiltered. */
static void trace_json_frames(cli_json_t *j, const ms_snapshot_t *s, uint32_t stack) {
  cli_json_lit(j, ", \"frames\": [");
  if (stack != MS_SNAP_NO_STACK && stack < s->nstacks) {
    const ms_snap_stack_t *st = &s->stacks[stack];
    for (uint32_t i = 0; i < st->nframes; i++) {
      const ms_snap_frame_t *f = &s->frames[ms_snap_frame_index(s, st->first + i)];
      cli_json_lit(j, i ? ", {\"name\": " : "{\"name\": ");
      cli_json_str(j, f->name);
      cli_json_lit(j, ", \"filename\": ");
      cli_json_str(j, f->filename);
      cli_json_lit(j, ", \"line\": ");
      cli_json_i64(j, f->line);
      cli_json_lit(j, "}");
    }
  }
  cli_json_lit(j, "]");
}

static void trace_json_entry(cli_json_t *j, const ms_snapshot_t *s, size_t index,
                             const ms_snap_trace_t *e) {
  cli_json_lit(j, "{\"index\": ");
  cli_json_u64(j, index);
  cli_json_lit(j, ", \"action\": ");
  cli_json_str(j, e->action == MS_TRACE_OTHER ? ms_snap_trace_action_name(e) : ms_trace_action_name(e->action));
  cli_json_lit(j, ", \"addr\": ");
  cli_json_u64(j, e->addr);
  cli_json_lit(j, ", \"size\": ");
  cli_json_u64(j, e->size);
  cli_json_lit(j, ", \"stream\": ");
  cli_json_u64(j, ms_snap_trace_stream(e));
  if (e->present & MS_TRACE_HAS_TIME) {
    cli_json_lit(j, ", \"time_us\": ");
    cli_json_i64(j, e->time_us);
  }
  if (e->present & MS_TRACE_HAS_POOL_ID) {
    cli_json_lit(j, ", \"pool_id\": [");
    cli_json_i64(j, ms_snap_trace_pool(e, 0));
    cli_json_lit(j, ", ");
    cli_json_i64(j, ms_snap_trace_pool(e, 1));
    cli_json_lit(j, "]");
  }
  if (e->present & MS_TRACE_HAS_COMPILE_CONTEXT) {
    cli_json_lit(j, ", \"compile_context\": ");
    cli_json_str(j, ms_snap_trace_compile_context(e));
  }
  if (e->present & MS_TRACE_HAS_USER_METADATA) {
    cli_json_lit(j, ", \"user_metadata\": ");
    cli_json_str(j, ms_snap_trace_user_metadata(e));
  }
  trace_json_frames(j, s, e->stack);
  cli_json_lit(j, "}");
}

bool cli_trace_entry_kept(const ms_tl_filter_t *f, const ms_snap_trace_t *e) {
  if (!f) return true;
  if (f->has_stream && ms_snap_trace_stream(e) != f->stream) return false;
  if (f->has_pool) {
    bool has = (e->present & MS_TRACE_HAS_POOL_ID) != 0;
    if ((has ? ms_snap_trace_pool(e, 0) : 0) != f->pool_id[0] || (has ? ms_snap_trace_pool(e, 1) : 0) != f->pool_id[1])
      return false;
  }
  return true;
}

int cli_trace_json(FILE *out, const ms_snapshot_t *s, const char *file,
                   const ms_tl_filter_t *filter, size_t only_dev, size_t first) {
  ms_sink_t sink;
  ms_sink_init_file(&sink, out);
  cli_json_t j = {&sink, 0};
  cli_json_lit(&j, "{\"command\": \"trace\", \"file\": ");
  cli_json_str(&j, file);
  cli_json_lit(&j, ", \"devices\": [");
  bool first_dev = true;
  for (size_t d = 0; d < s->ndevices && !j.err; d++) {
    const ms_snap_device_t *dev = &s->devices[d];
    if (dev->ntrace == 0 || (only_dev != SIZE_MAX && d != only_dev)) continue;
    cli_json_lit(&j, first_dev ? "\n {\"device\": " : ",\n {\"device\": ");
    first_dev = false;
    cli_json_u64(&j, d);
    cli_json_lit(&j, ", \"entries\": [");
    size_t k = 0;
    for (size_t i = 0; i < dev->ntrace && !j.err; i++) {
      const ms_snap_trace_t *e = &s->trace[dev->first_trace + i];
      if (!cli_trace_entry_kept(filter, e)) continue;
      cli_json_lit(&j, k++ ? ",\n  " : "\n  ");
      trace_json_entry(&j, s, (d == only_dev ? first : 0) + i, e);
    }
    cli_json_lit(&j, k ? "\n ]}" : "]}");
  }
  cli_json_lit(&j, first_dev ? "]}\n" : "\n]}\n");
  return CLI_OK; /* a write error is reported when stdout is closed (main.c) */
}
