/* SPDX-License-Identifier: MIT
 * memsnap CLI: what the commands share about time (issue #12): parsing --device, --range,
 * --stream, --pool and --at; building the time index with a clear error; the state at a moment
 * as a snapshot for the existing views; the biggest consumers at a moment (`top`, and the
 * `timeline` text); the `timeline` outputs.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <time.h>

#include "cli.h"
#include "memsnap/cache.h"
#include "memsnap/error.h"
#include "memsnap/timeline.h"
#include "memsnap/views.h"

bool cli_parse_u64(const char *s, uint64_t *out) {
  if (!s || !*s || *s == '-' || *s == '+' || *s == ' ') return false;
  char *end;
  errno = 0;
  unsigned long long v = strtoull(s, &end, 0);
  if (*end || end == s || errno == ERANGE) return false;
  *out = (uint64_t)v;
  return true;
}

int cli_parse_jobs(const char *cmd, const char *s, unsigned max, unsigned *out) {
  uint64_t v;
  if (!cli_parse_u64(s, &v) || v == 0 || v > max)
    return cli_usage_error(cmd, "option '--jobs' needs a number from 1 to %u, not '%s'", max, s);
  *out = (unsigned)v;
  return CLI_OK;
}

static bool cli_parse_i64(const char *s, int64_t *out) {
  if (!s || !*s || *s == ' ') return false;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 0);
  if (*end || end == s || errno == ERANGE) return false;
  *out = (int64_t)v;
  return true;
}

/* "A:B" into *lo, *hi with parse; an empty side keeps its default. @return false when
 * malformed. */
static bool cli_pair_parse(const char *s, bool (*parse)(const char *, void *), void *lo,
                           void *hi) {
  const char *colon = strchr(s, ':');
  char a[32], b[32];
  if (!colon) return false;
  size_t la = (size_t)(colon - s), lb = strlen(colon + 1);
  if (la >= sizeof a || lb >= sizeof b) return false;
  memcpy(a, s, la);
  a[la] = 0;
  memcpy(b, colon + 1, lb + 1);
  return (!la || parse(a, lo)) && (!lb || parse(b, hi));
}

static bool cli_parse_u64_v(const char *s, void *out) {
  return cli_parse_u64(s, out);
}
static bool cli_parse_i64_v(const char *s, void *out) {
  return cli_parse_i64(s, out);
}
static bool cli_parse_step_v(const char *s, void *out) {
  return s[0] != '-' && s[0] != '+' && cli_parse_i64(s, out) && *(int64_t *)out >= 0;
}

/* --range A:B, t=T0:T1, step=N or step=N:M. */
static int cli_range_parse(const char *cmd, cli_tl_args_t *ta, const char *range_s) {
  if (strncmp(range_s, "step=", 5) == 0) {
    const char *v = range_s + 5;
    ta->range_is_step = true;
    ta->range_step = -1;
    ta->range_step_last = -1;
    bool ok = strchr(v, ':') ? cli_pair_parse(v, cli_parse_step_v, &ta->range_step,
                                              &ta->range_step_last)
                             : cli_parse_step_v(v, &ta->range_step);
    if (!strchr(v, ':')) ta->range_step_last = ta->range_step;
    if (!ok || ta->range_step < 0 || ta->range_step_last < ta->range_step)
      return cli_usage_error(cmd, "option '--range' needs A:B, t=T0:T1 or step=N[:M] (N <= M), "
                                  "not '%s'", range_s);
    return CLI_OK;
  }
  if (strncmp(range_s, "t=", 2) == 0) {
    ta->range_is_time = true;
    ta->range_t0 = INT64_MIN;
    ta->range_t1 = INT64_MAX;
    if (!cli_pair_parse(range_s + 2, cli_parse_i64_v, &ta->range_t0, &ta->range_t1) ||
        ta->range_t0 > ta->range_t1)
      return cli_usage_error(cmd, "option '--range' needs t=T0:T1 with times T0 <= T1 (time_us), "
                                  "not '%s'", range_s);
    return CLI_OK;
  }
  if (!strchr(range_s, ':'))
    return cli_usage_error(cmd, "option '--range' needs A:B, not '%s'", range_s);
  if (!cli_pair_parse(range_s, cli_parse_u64_v, &ta->first, &ta->last) || ta->first > ta->last)
    return cli_usage_error(cmd, "option '--range' needs A:B with entry indices A <= B, not '%s'",
                           range_s);
  return CLI_OK;
}

int cli_tl_args_parse(const char *cmd, cli_tl_args_t *ta, const char *device_s,
                      const char *range_s, const char *stream_s, const char *pool_s,
                      const char *at_s) {
  memset(ta, 0, sizeof *ta);
  ta->last = UINT64_MAX;
  uint64_t v;
  if (device_s) {
    if (!cli_parse_u64(device_s, &v) || v > 4095)
      return cli_usage_error(cmd, "option '--device' needs a device number, not '%s'", device_s);
    ta->has_device = true;
    ta->device = (size_t)v;
  }
  if (range_s) {
    int rc = cli_range_parse(cmd, ta, range_s);
    if (rc != CLI_OK) return rc;
    ta->has_range = true;
    ta->range_text = range_s;
  }
  if (stream_s) {
    if (!cli_parse_u64(stream_s, &ta->filter.stream))
      return cli_usage_error(cmd, "option '--stream' needs a stream handle, not '%s'", stream_s);
    ta->filter.has_stream = true;
  }
  if (pool_s) {
    const char *comma = strchr(pool_s, ',');
    char a[32];
    size_t la = comma ? (size_t)(comma - pool_s) : 0;
    if (!comma || la >= sizeof a)
      return cli_usage_error(cmd, "option '--pool' needs A,B (a pool id), not '%s'", pool_s);
    memcpy(a, pool_s, la);
    a[la] = 0;
    if (!cli_parse_i64(a, &ta->filter.pool_id[0]) ||
        !cli_parse_i64(comma + 1, &ta->filter.pool_id[1]))
      return cli_usage_error(cmd, "option '--pool' needs A,B (a pool id), not '%s'", pool_s);
    ta->filter.has_pool = true;
  }
  if (at_s) {
    ms_errbuf_t eb = {{0}};
    if (ms_tl_moment_parse(at_s, &ta->at, &eb) != MS_OK)
      return cli_usage_error(cmd, "option '--at': %s", eb.msg);
    ta->has_at = true;
    ta->at_text = at_s;
  }
  return CLI_OK;
}

/* Whether path names a regular file whose first bytes are not memsnap's format (whose files are
 * read in full whatever the window), so that a first read for a step's times is worth it. */
static bool cli_range_pickle_file(const char *path) {
  FILE *fp = fopen(path, "rb");
  if (!fp) return false;
  char head[4096];
  size_t n = fread(head, 1, sizeof head, fp);
  struct stat st;
  bool reg = fstat(fileno(fp), &st) == 0 && S_ISREG(st.st_mode);
  fclose(fp);
  ms_format f = ms_format_detect(head, n);
  return reg && n > 0 && f != MS_FORMAT_MEMSNAP && f != MS_FORMAT_MEMSNAP_Z;
}

/* The end time of step=N:M's window: the latest end of a ProfilerStep#M range of any device (the
 * command picks one of them), from a read without the trace; INT64_MIN when the file has none
 * (the command then says so, after a read that keeps no stack past the first timed entry).
 * @return false when that read fails (the full load then reports the error). */
static bool cli_range_step_end(const char *path, int64_t m, int64_t *end) {
  ms_snapshot_t *pre = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_snapshot_load_ex(path, MS_LOAD_NO_TRACE, &pre, &eb) != MS_OK) return false;
  ms_tl_ranges_t rs;
  bool ok = ms_tl_ranges_build(pre, &rs) == MS_OK;
  *end = INT64_MIN;
  for (size_t i = 0; ok && i < rs.n; i++)
    if (rs.ranges[i].step == m && rs.ranges[i].end_us > *end) *end = rs.ranges[i].end_us;
  if (ok) ms_tl_ranges_release(&rs);
  ms_snapshot_free(pre);
  return ok;
}

/* The window --range asks a read of path for; MS_LOAD_WINDOW_NONE for a full read. */
static ms_load_window_t cli_range_window(const char *path, unsigned flags,
                                         const cli_tl_args_t *ta) {
  ms_load_window_t none = {MS_LOAD_WINDOW_NONE, 0, 0};
  const char *env = getenv("MEMSNAP_WINDOW");
  bool off = env && (strcmp(env, "0") == 0 || strcasecmp(env, "off") == 0 ||
                     strcasecmp(env, "no") == 0 || strcasecmp(env, "false") == 0);
  if (!ta || !ta->has_range || off || strcmp(path, "-") == 0 || (flags & MS_LOAD_NO_TRACE))
    return none;
  /* a moment by entry, time, step or OOM may lie past the window: the whole trace then */
  if (ta->has_at && ta->at.kind != MS_TL_MOMENT_PEAK &&
      ta->at.kind != MS_TL_MOMENT_PEAK_RESERVED && ta->at.kind != MS_TL_MOMENT_END)
    return none;
  if (ta->range_is_time)
    return ta->range_t1 == INT64_MAX ? none
                                     : (ms_load_window_t){MS_LOAD_WINDOW_TIMES, 0, ta->range_t1};
  if (ta->range_is_step) {
    int64_t end;
    if (!cli_range_pickle_file(path) || !cli_range_step_end(path, ta->range_step_last, &end) ||
        end == INT64_MAX)
      return none;
    return (ms_load_window_t){MS_LOAD_WINDOW_TIMES, 0, end};
  }
  return ta->last == UINT64_MAX ? none
                                : (ms_load_window_t){MS_LOAD_WINDOW_ENTRIES, ta->last, 0};
}

int cli_load_range(const char *path, unsigned flags, const cli_tl_args_t *ta,
                   ms_snapshot_t **out) {
  ms_load_window_t w = cli_range_window(path, flags, ta);
  return w.kind == MS_LOAD_WINDOW_NONE ? cli_load_ex(path, flags, out)
                                       : cli_load_window(path, flags, &w, out);
}

static void cli_filter_text(const cli_tl_args_t *ta, char *buf, size_t cap) {
  buf[0] = 0;
  size_t n = 0;
  if (ta->filter.has_stream)
    n += (size_t)snprintf(buf + n, cap - n, " --stream %" PRIu64, ta->filter.stream);
  if (ta->filter.has_pool && n < cap)
    snprintf(buf + n, cap - n, " --pool %" PRId64 ",%" PRId64, ta->filter.pool_id[0],
             ta->filter.pool_id[1]);
}

int cli_tl_open(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                ms_timeline_t **out) {
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  cfg.filter = ta->filter;
  ms_errbuf_t eb = {{0}};
  cli_progress_start("indexing the trace of '%s'", name);
  /* through the cache when the snapshot came from it: the index of an earlier run is mapped */
  int err = ms_cache_timeline(cli_cache_key(snap), NULL, snap, &cfg, out, NULL, &eb);
  cli_progress_stop();
  if (err != MS_OK) {
    cli_error("'%s': %s", name, eb.msg[0] ? eb.msg : ms_strerror(err));
    return CLI_FAILURE;
  }
  return CLI_OK;
}

int cli_tl_device(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                  size_t *dev) {
  size_t devs[1], def = 0;
  size_t n = ms_tl_viewer_devices(snap, devs, 0, &def);
  if (ta->has_device) {
    bool listed = ta->device < snap->ndevices && snap->devices[ta->device].ntrace > 0;
    for (size_t i = 0; !listed && i < snap->nsegments; i++)
      listed = snap->segments[i].device == (int64_t)ta->device;
    if (!listed) {
      cli_error("'%s': device %zu has no trace and no segments", name, ta->device);
      return CLI_FAILURE;
    }
    *dev = ta->device;
    return CLI_OK;
  }
  if (n == 0) {
    cli_error("'%s': no device has a trace or segments: nothing to show", name);
    return CLI_FAILURE;
  }
  *dev = def;
  return CLI_OK;
}

int cli_tl_steps(const ms_timeline_t *tl, const char *name, const cli_tl_args_t *ta, size_t dev,
                 size_t *from, size_t *to) {
  size_t n = ms_timeline_nentries(tl, dev);
  *from = 0;
  *to = n;
  if (!ta->has_range) return CLI_OK;
  if (ta->range_is_step || ta->range_is_time) {
    ms_errbuf_t eb = {{0}};
    int rc = ta->range_is_step ? ms_timeline_steps_range(tl, dev, ta->range_step,
                                                         ta->range_step_last, from, to, &eb)
                               : ms_timeline_time_range(tl, dev, ta->range_t0, ta->range_t1,
                                                        from, to, &eb);
    if (rc != MS_OK) {
      cli_error("'%s': --range %s: %s", name, ta->range_text, eb.msg[0] ? eb.msg : ms_strerror(rc));
      return CLI_FAILURE;
    }
    return CLI_OK;
  }
  if (ta->first > 0 && ta->first >= n) {
    cli_error("'%s': --range starts at entry %" PRIu64 ", past the %zu entries of device %zu",
              name, ta->first, n, dev);
    return CLI_FAILURE;
  }
  *from = (size_t)ta->first;
  *to = ta->last >= n ? n : (size_t)ta->last + 1;
  return CLI_OK;
}

void cli_moment_text(const ms_timeline_t *tl, size_t dev, size_t step, char *buf, size_t cap) {
  if (step == 0) {
    snprintf(buf, cap, "before entry 0");
    return;
  }
  const ms_snap_trace_t *e = ms_timeline_entry(tl, dev, step - 1);
  char t[64];
  cli_format_time(e, t, sizeof t);
  snprintf(buf, cap, "after entry %zu (%s)%s%s", step - 1, ms_trace_action_name(e->action),
           t[0] ? ", " : "", t);
}

void cli_format_time(const ms_snap_trace_t *e, char *buf, size_t cap) {
  buf[0] = 0;
  if (!e || !(e->present & MS_TRACE_HAS_TIME)) return;
  int64_t us = e->time_us;
  /* floor division without negating us (-INT64_MIN overflows) or multiplying back */
  int64_t frac = us % 1000000;
  time_t sec = (time_t)(us / 1000000 - (frac < 0));
  if (frac < 0) frac += 1000000;
  struct tm tm;
  if (!gmtime_r(&sec, &tm)) {
    snprintf(buf, cap, "t=%" PRId64, us);
    return;
  }
  char d[40];
  strftime(d, sizeof d, "%Y-%m-%d %H:%M:%S", &tm);
  snprintf(buf, cap, "%s.%06" PRId64 " UTC (t=%" PRId64 ")", d, frac, us);
}

bool cli_tl_args_need_trace(const cli_tl_args_t *ta) {
  return ta->has_at || ta->has_range || ta->has_device;
}

void cli_state_error(int rc) {
  if (rc == MS_ENOMEM)
    cli_error("out of memory");
  else /* a trace whose stacks are read when asked for (MS_LOAD_DEFER_STACKS) reads them here */
    cli_error("cannot read the stacks of the blocks alive then: %s (the file changed since it was "
              "read, or cannot be read; run the command again)",
              ms_strerror(rc));
}

int cli_at_snapshot(const ms_snapshot_t *snap, const char *name, const cli_tl_args_t *ta,
                    bool keep_all_devices, ms_snapshot_t **out, size_t *out_dev,
                    size_t *out_step) {
  bool filtered = ta->filter.has_stream || ta->filter.has_pool;
  if (!ta->has_at && !ta->has_range) {
    if (!ta->has_device && !filtered) return CLI_OK; /* the snapshot as it is */
    size_t dev = SIZE_MAX;
    if (ta->has_device) {
      int rc = cli_tl_device(snap, name, ta, &dev);
      if (rc != CLI_OK) return rc;
    } else if (!keep_all_devices) {
      dev = SIZE_MAX;
    }
    if (ms_snapshot_select(snap, dev, &ta->filter, out) != MS_OK) {
      cli_error("out of memory");
      return CLI_FAILURE;
    }
    if ((*out)->nsegments == 0 && snap->nsegments > 0) {
      char f[128];
      cli_filter_text(ta, f, sizeof f);
      if (ta->has_device) snprintf(f + strlen(f), sizeof f - strlen(f), " --device %zu", dev);
      cli_error("'%s': no segment matches%s", name, f);
      ms_snapshot_free(*out);
      *out = NULL;
      return CLI_FAILURE;
    }
    if (out_dev) *out_dev = dev;
    return CLI_OK;
  }
  size_t dev;
  int rc = cli_tl_device(snap, name, ta, &dev);
  if (rc != CLI_OK) return rc;
  ms_timeline_t *tl = NULL;
  if ((rc = cli_tl_open(snap, name, ta, &tl)) != CLI_OK) return rc;
  size_t from, to, step;
  rc = cli_tl_steps(tl, name, ta, dev, &from, &to);
  if (rc == CLI_OK) {
    ms_tl_moment_t end = {MS_TL_MOMENT_END, 0};
    ms_errbuf_t eb = {{0}};
    if (ms_timeline_moment_step(tl, dev, ta->has_at ? &ta->at : &end, from, to, &step, &eb) !=
        MS_OK) {
      cli_error("'%s': --at %s: %s", name, ta->has_at ? ta->at_text : "end", eb.msg);
      rc = CLI_FAILURE;
    }
  }
  if (rc == CLI_OK) {
    int r = ms_timeline_snapshot_at(tl, dev, step, filtered ? &ta->filter : NULL, out);
    if (r != MS_OK) {
      cli_state_error(r);
      rc = CLI_FAILURE;
    } else if ((*out)->nsegments == 0 && filtered) {
      char f[128];
      cli_filter_text(ta, f, sizeof f);
      cli_error("'%s': no segment of device %zu matches%s at that moment", name, dev, f);
      ms_snapshot_free(*out);
      *out = NULL;
      rc = CLI_FAILURE;
    } else {
      /* the trace as it was then: this device's entries up to the moment */
      for (size_t d = 0; d < (*out)->ndevices; d++)
        if (d != dev) (*out)->devices[d].ntrace = 0;
      if (dev < (*out)->ndevices) {
        (*out)->devices[dev].first_trace += (uint32_t)from;
        (*out)->devices[dev].ntrace = (uint32_t)(step - from);
      }
      if (out_dev) *out_dev = dev;
      if (out_step) *out_step = step;
    }
  }
  ms_timeline_destroy(tl);
  return rc;
}

/* ---- top: the biggest consumers at a moment ------------------------------------------------ */

typedef struct cli_top_item_s {
  uint64_t key;        /* stack index, frame index, size */
  const char *skey;    /* file name (by file) */
  uint64_t bytes;
  uint64_t count;
} cli_top_item_t;

static cli_top_by cli_top_mode;

static int cli_top_key_cmp(const void *a, const void *b) {
  const cli_top_item_t *x = a, *y = b;
  if (cli_top_mode == CLI_TOP_FILE) {
    int c = strcmp(x->skey, y->skey);
    if (c) return c;
  }
  return x->key < y->key ? -1 : x->key > y->key;
}

static int cli_top_bytes_cmp(const void *a, const void *b) {
  const cli_top_item_t *x = a, *y = b;
  if (x->bytes != y->bytes) return x->bytes > y->bytes ? -1 : 1;
  if (x->count != y->count) return x->count > y->count ? -1 : 1;
  return cli_top_key_cmp(a, b);
}

/* A frame's class under PyTorch's filter: CLI_FR_DROPPED, CLI_FR_KEPT, or CLI_FR_PY (kept, and a
 * file ending in .py). memo (one byte a frame, zeroed; may be NULL) remembers it: a label looks
 * at the same frames for every row it is compared with. */
enum { CLI_FR_DROPPED = 1, CLI_FR_KEPT, CLI_FR_PY };
static uint8_t cli_frame_class(const ms_snapshot_t *s, uint32_t f, uint8_t *memo) {
  if (memo && memo[f]) return memo[f];
  uint8_t c = CLI_FR_DROPPED;
  if (ms_view_frame_kept(s->frames[f].name, s->frames[f].filename)) {
    size_t len = strlen(s->frames[f].filename);
    c = len >= 3 && strcmp(s->frames[f].filename + len - 3, ".py") == 0 ? CLI_FR_PY : CLI_FR_KEPT;
  }
  if (memo) memo[f] = c;
  return c;
}

/* A zeroed memo for cli_frame_class; NULL (no memo) when out of memory. */
static uint8_t *cli_frame_memo(const ms_snapshot_t *s) {
  return calloc(s->nframes ? s->nframes : 1, 1);
}

/* The frame that names a stack: its innermost Python frame (a file ending in .py), else the
 * innermost frame PyTorch's filter keeps; UINT32_MAX when none. */
static uint32_t cli_top_frame(const ms_snapshot_t *s, uint32_t stack, uint8_t *memo) {
  if (stack == MS_SNAP_NO_STACK || stack >= s->nstacks) return UINT32_MAX;
  const ms_snap_stack_t *st = &s->stacks[stack];
  uint32_t kept = UINT32_MAX;
  for (uint32_t i = 0; i < st->nframes; i++) {
    uint32_t f = ms_snap_frame_index(s, st->first + i);
    uint8_t c = cli_frame_class(s, f, memo);
    if (c == CLI_FR_PY) return f;
    if (c == CLI_FR_KEPT && kept == UINT32_MAX) kept = f;
  }
  return kept;
}

int cli_top_compute(const ms_snapshot_t *s, cli_top_by by, cli_top_t *out) {
  memset(out, 0, sizeof *out);
  size_t n = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].state == MS_BLOCK_ACTIVE_ALLOCATED) n++;
  cli_top_item_t *it = malloc((n ? n : 1) * sizeof *it);
  if (!it) return MS_ENOMEM;
  uint8_t *memo = by == CLI_TOP_FRAME || by == CLI_TOP_FILE ? cli_frame_memo(s) : NULL;
  size_t k = 0;
  for (size_t si = 0; si < s->nsegments; si++) {
    const ms_snap_segment_t *g = &s->segments[si];
    for (uint32_t j = 0; j < g->nblocks; j++) {
      const ms_snap_block_t *b = &s->blocks[(size_t)g->first_block + j];
      if (b->state != MS_BLOCK_ACTIVE_ALLOCATED || k >= n) continue;
      uint32_t stack = b->stack;
      if (stack == MS_SNAP_NO_STACK && b->nhistory > 0 && b->first_history < s->nhistory)
        stack = s->history[b->first_history].stack;
      cli_top_item_t x = {0, "", b->size, 1};
      switch (by) {
      case CLI_TOP_STACK:
        x.key = stack;
        break;
      case CLI_TOP_FRAME:
        x.key = cli_top_frame(s, stack, memo);
        break;
      case CLI_TOP_FILE: {
        uint32_t f = cli_top_frame(s, stack, memo);
        x.key = f == UINT32_MAX ? 1 : 0;
        x.skey = f == UINT32_MAX ? "" : s->frames[f].filename;
        break;
      }
      case CLI_TOP_SIZE:
        x.key = b->size;
        break;
      }
      out->total += b->size;
      out->count++;
      it[k++] = x;
    }
  }
  free(memo);
  cli_top_mode = by;
  qsort(it, k, sizeof *it, cli_top_key_cmp);
  size_t m = 0;
  for (size_t i = 0; i < k; i++) {
    if (m > 0 && cli_top_key_cmp(&it[m - 1], &it[i]) == 0) {
      it[m - 1].bytes += it[i].bytes;
      it[m - 1].count += it[i].count;
    } else {
      it[m++] = it[i];
    }
  }
  qsort(it, m, sizeof *it, cli_top_bytes_cmp);
  out->items = malloc((m ? m : 1) * sizeof *out->items);
  if (!out->items) {
    free(it);
    return MS_ENOMEM;
  }
  for (size_t i = 0; i < m; i++) {
    out->items[i].bytes = it[i].bytes;
    out->items[i].count = it[i].count;
    out->items[i].key = it[i].key;
    out->items[i].skey = it[i].skey;
  }
  out->nitems = m;
  out->by = by;
  free(it);
  return MS_OK;
}

void cli_top_release(cli_top_t *t) {
  free(t->items);
  memset(t, 0, sizeof *t);
}

/* The label of an item: a frame, a file, a size, or (by stack) its innermost kept frame. */
void cli_stack_label(const ms_snapshot_t *s, uint32_t stack, char *buf, size_t cap) {
  uint32_t f = stack == MS_SNAP_NO_STACK ? UINT32_MAX : cli_top_frame(s, stack, NULL);
  if (stack == MS_SNAP_NO_STACK)
    snprintf(buf, cap, "<no stack recorded>");
  else if (f == UINT32_MAX)
    snprintf(buf, cap, "<no frame>");
  else
    ms_view_frame_format(buf, cap, &s->frames[f]);
}

/* The k-th frame of a stack that PyTorch's filter keeps, innermost first; UINT32_MAX past them. */
static uint32_t cli_kept_frame(const ms_snapshot_t *s, uint32_t stack, uint32_t k,
                               uint8_t *memo) {
  const ms_snap_stack_t *st = &s->stacks[stack];
  for (uint32_t i = 0; i < st->nframes; i++) {
    uint32_t f = ms_snap_frame_index(s, st->first + i);
    if (cli_frame_class(s, f, memo) != CLI_FR_DROPPED && k-- == 0) return f;
  }
  return UINT32_MAX;
}

/* Rows of `top` whose labels would read the same (one innermost Python line, reached along
 * different paths) get what tells them apart: " (via F1, F2)", this row's frames at each depth,
 * from the inside out, where its stack leaves one of the others' (each other row shows its own
 * frame at that depth, so the labels differ). Only the first rows are compared: the ones a
 * reader sees. */
#define CLI_TOP_TWINS 200
#define CLI_TOP_VIA 4
static void cli_top_distinguish(const ms_snapshot_t *s, const cli_top_t *t, size_t i, char *buf,
                                size_t cap) {
  uint32_t a = (uint32_t)t->items[i].key;
  if (a == MS_SNAP_NO_STACK || a >= s->nstacks) return;
  uint8_t *memo = cli_frame_memo(s);
  uint32_t fa = cli_top_frame(s, a, memo);
  uint32_t depth[CLI_TOP_VIA];
  size_t nd = 0;
  size_t n = t->nitems < CLI_TOP_TWINS ? t->nitems : CLI_TOP_TWINS;
  for (size_t j = 0; j < n; j++) {
    uint32_t b = (uint32_t)t->items[j].key;
    if (j == i || b == MS_SNAP_NO_STACK || b >= s->nstacks || cli_top_frame(s, b, memo) != fa)
      continue;
    uint32_t k = 0;
    while (k < 4096 && cli_kept_frame(s, a, k, memo) == cli_kept_frame(s, b, k, memo) &&
           cli_kept_frame(s, a, k, memo) != UINT32_MAX)
      k++;
    size_t at = 0; /* depths kept sorted and distinct, the shallowest CLI_TOP_VIA */
    while (at < nd && depth[at] < k) at++;
    if ((at < nd && depth[at] == k) || at == CLI_TOP_VIA) continue;
    if (nd == CLI_TOP_VIA) nd--;
    memmove(depth + at + 1, depth + at, (nd - at) * sizeof *depth);
    depth[at] = k;
    nd++;
  }
  size_t len = strlen(buf);
  for (size_t d = 0; d < nd && len + 8 < cap; d++) {
    uint32_t f = cli_kept_frame(s, a, depth[d], memo);
    char fr[512];
    if (f == UINT32_MAX)
      snprintf(fr, sizeof fr, "no deeper frame");
    else
      ms_view_frame_format(fr, sizeof fr, &s->frames[f]);
    snprintf(buf + len, cap - len, "%s%s%s", d ? ", " : " (via ", fr, d + 1 == nd ? ")" : "");
    len = strlen(buf);
  }
  free(memo);
}

void cli_top_label(const ms_snapshot_t *s, const cli_top_t *t, size_t i, char *buf, size_t cap) {
  const struct cli_top_entry_s *e = &t->items[i];
  switch (t->by) {
  case CLI_TOP_STACK:
    cli_stack_label(s, (uint32_t)e->key, buf, cap);
    cli_top_distinguish(s, t, i, buf, cap);
    return;
  case CLI_TOP_FRAME:
    if (e->key == UINT32_MAX)
      snprintf(buf, cap, "<no frame>");
    else
      ms_view_frame_format(buf, cap, &s->frames[e->key]);
    return;
  case CLI_TOP_FILE:
    snprintf(buf, cap, "%s", e->skey[0] ? e->skey : "<no frame>");
    return;
  case CLI_TOP_SIZE:
    snprintf(buf, cap, "%" PRIu64 " bytes", e->key);
    return;
  }
}
