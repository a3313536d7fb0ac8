/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap stats FILE [--summary]`, `_memory_viz.py stats` byte for byte
 * (`segsum`; docs/cli.md, `stats`): a map of every segment of 20 MiB or more, one
 * character per 20 MiB page, then the totals and the legend. `--summary` adds the allocator's
 * memory_summary table per device, from the statistics a memsnap snapshot carries.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/snapshot.h"
#include "memsnap/stats.h"

#define STATS_PAGE_SIZE (20ull * 1024 * 1024)

static const char stats_usage[] =
    "usage: memsnap stats FILE [--summary | --json] [--at MOMENT] [--device N] [--range A:B]\n"
    "                          [--stream S] [--pool A,B]\n"
    "       memsnap stats FILE FILE... | DIR [--json] [--jobs N] [--keep-going]\n"
    "\n"
    "Prints a map of the segments of FILE (one character per 20 MiB page) and the totals of\n"
    "reserved, allocated and free memory, exactly as PyTorch's `_memory_viz.py stats`.\n"
    "FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard input).\n"
    "With several FILEs (or a DIR of them: one per rank), one row per file instead: peak\n"
    "allocated and reserved with their moment, fragmentation at the peak, OOMs, the largest\n"
    "stack at the peak, and the ranks whose peak is more than 10% above the median\n"
    "(as `memsnap timeline` and `memsnap top` with several FILEs).\n"
    "\n"
    "options:\n"
    "  --summary   also print the allocator's memory_summary table for each device\n"
    "              (memsnap snapshots; PyTorch pickles carry no statistics)\n"
    "  --json      the segments and totals as JSON (docs/cli.md, JSON outputs)\n"
    "  --at MOMENT       show the state at MOMENT: peak (of allocated bytes), peak-reserved,\n"
    "                    end, an entry index N (after trace entry N; -1 = before the first),\n"
    "                    or a time in microseconds: t=1700000000123456 or 1700000000123456us\n"
    "  -d, --device N    only device N (with --at: default the device with the longest trace)\n"
    "  --range A:B       with --at: peaks within trace entries A to B; alone: the state after B\n"
    "                    (or t=T0:T1 by time_us, step=N[:M] by ProfilerStep#N)\n"
    "  --stream S        only segments of stream S (a raw handle, decimal or 0x...)\n"
    "  --pool A,B        only segments of private pool (A, B); 0,0 is the default pool\n"
    "  --jobs N          several FILEs: read N at a time (default: one per core)\n"
    "  --keep-going      several FILEs: one that cannot be read is a warning, not a failure\n"
    "  -h, --help  show this help\n";

static const char stats_legend[] =
    "\n"
    "Legend:\n"
    "    [a     ] - a segment in the allocator\n"
    "     ^-- a page 20.0MiB of memory in the segment\n"
    "    a-z: pages filled with a single block's content\n"
    "    ' ': page is completely free\n"
    "    *: page if completely full with multiple blocks\n"
    "    0-9: page is partially full with tensors of multiple blocks (9 == 90% full)\n"
    "    (X% internal) - of the free memory, X% is free because we rounded the size of the "
    "allocation.\n";

/* Sums are exact, as Python's int is in _memory_viz.py: sizes of a hostile file (up to 2^64 - 1
 * each, 2^32 blocks) may sum past int64_t, never past 128 bits; internal free (size - requested)
 * may be negative. Printed as bytes where they fit int64_t, else as a double's text. */
__extension__ typedef __int128 stats_sum_t;

/* A segment whose map `stats` draws is at most this large (one character per 20 MiB page: 16 TiB
 * is 838,861 of them, and no device has a segment that large); a larger one is refused. */
#define STATS_MAX_DRAWN ((uint64_t)1 << 44)

static const char *stats_bytes(stats_sum_t v, char b[CLI_BYTES_BUFSZ]) {
  return v >= INT64_MIN && v <= INT64_MAX ? cli_format_bytes((int64_t)v, b)
                                          : cli_format_bytes_double((double)v, b);
}

/* `_block_extra(b)[1]`: the bytes an active block accounts for. */
static uint64_t stats_block_allocated(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (!(b->present & MS_BLOCK_HAS_FRAMES) && b->stack == MS_SNAP_NO_STACK &&
      (b->present & MS_BLOCK_HAS_HISTORY) && b->nhistory > 0)
    return s->history[b->first_history].real_size;
  if ((b->present & MS_BLOCK_HAS_REQUESTED_SIZE) || s->origin == MS_SNAP_ORIGIN_MEMSNAP)
    return b->requested_size;
  return b->size;
}

typedef struct stats_order_s {
  uint64_t total;
  uint64_t active;
  size_t index;
} stats_order_t;

static int stats_order_cmp(const void *a, const void *b) {
  const stats_order_t *x = a, *y = b;
  if (x->total != y->total) return x->total < y->total ? -1 : 1;
  if (x->active != y->active) return x->active < y->active ? -1 : 1;
  return x->index < y->index ? -1 : x->index > y->index; /* Python's sort is stable */
}

static void stats_report_free(FILE *out, stats_sum_t external, stats_sum_t internal) {
  char b[CLI_BYTES_BUFSZ];
  stats_sum_t total = external + internal;
  fputs(stats_bytes(total, b), out);
  if (total != 0) fprintf(out, " (%.1f%% internal)", (double)internal / (double)total * 100.0);
}

/* One segment's line (`segsum`'s loop body); adds its amounts to the totals. */
static int stats_segment(FILE *out, const ms_snapshot_t *s, const char *file,
                         const ms_snap_segment_t *seg, stats_sum_t *t_alloc, stats_sum_t *f_ext,
                         stats_sum_t *f_int) {
  stats_sum_t ext = 0, in = 0, alloc = 0, offset = 0;
  uint64_t npages = seg->total_size ? (seg->total_size - 1) / STATS_PAGE_SIZE + 1 : 0;
  bool draw = seg->total_size >= STATS_PAGE_SIZE;
  if (seg->total_size > STATS_MAX_DRAWN) {
    char b[CLI_BYTES_BUFSZ], l[CLI_BYTES_BUFSZ];
    cli_error("'%s': the segment at 0x%" PRIx64 " is %s (%" PRIu64 " bytes): stats draws a "
              "segment of %s at most",
              file, seg->address, cli_format_ubytes(seg->total_size, b), seg->total_size,
              cli_format_ubytes(STATS_MAX_DRAWN, l));
    return CLI_FAILURE;
  }
  char *occ = NULL;
  double *frac = NULL;
  if (draw) {
    occ = malloc(npages + 1);
    frac = calloc(npages, sizeof *frac);
    if (!occ || !frac) {
      free(occ);
      free(frac);
      cli_error("out of memory");
      return CLI_FAILURE;
    }
    memset(occ, ' ', npages);
    occ[npages] = 0;
  }
  size_t nactive = 0;
  for (uint32_t i = 0; i < seg->nblocks; i++) {
    const ms_snap_block_t *b = ms_snap_segment_block(s, seg, i);
    if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) {
      stats_sum_t a = stats_block_allocated(s, b);
      alloc += a;
      in += (stats_sum_t)b->size - a;
      if (draw && a > 0) {
        stats_sum_t st = offset, fin = offset + a;
        stats_sum_t p0 = st / STATS_PAGE_SIZE, p1 = (fin - 1) / STATS_PAGE_SIZE + 1;
        char m = (char)('a' + nactive % 26);
        for (stats_sum_t j = p0; j < p1 && j < npages; j++) {
          stats_sum_t lo = st > j * STATS_PAGE_SIZE ? st : j * STATS_PAGE_SIZE;
          stats_sum_t hi = fin < (j + 1) * STATS_PAGE_SIZE ? fin : (j + 1) * STATS_PAGE_SIZE;
          size_t at = (size_t)j; /* < npages: at most STATS_MAX_DRAWN / 20 MiB */
          frac[at] += (double)(hi - lo) / (double)STATS_PAGE_SIZE;
          if (occ[at] != ' ') {
            int k = (int)(frac[at] * 10);
            occ[at] = "0123456789*"[k < 0 ? 0 : k > 10 ? 10 : k];
          } else {
            occ[at] = m;
          }
        }
      }
      nactive++;
    } else {
      ext += b->size;
    }
    offset += b->size;
  }
  *t_alloc += alloc;
  *f_ext += ext;
  *f_int += in;
  if (draw) {
    char b[CLI_BYTES_BUFSZ];
    fprintf(out, "[%s] %s allocated, ", occ, cli_format_ubytes(seg->total_size, b));
    stats_report_free(out, ext, in);
    fputs(" free", out);
    if (seg->stream != 0) fprintf(out, " stream_%llu", (unsigned long long)seg->stream);
    fputc('\n', out);
  }
  free(occ);
  free(frac);
  return CLI_OK;
}

static int stats_segsum(FILE *out, const ms_snapshot_t *s, const char *file) {
  char b[CLI_BYTES_BUFSZ];
  stats_order_t *order = malloc((s->nsegments ? s->nsegments : 1) * sizeof *order);
  if (!order) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *seg = &s->segments[i];
    uint64_t active = 0; /* a sort key: Python's int, saturated here past 2^64 - 1 */
    for (uint32_t k = 0; k < seg->nblocks; k++) {
      const ms_snap_block_t *blk = ms_snap_segment_block(s, seg, k);
      if (blk->state == MS_BLOCK_ACTIVE_ALLOCATED)
        active = active + blk->size < active ? UINT64_MAX : active + blk->size;
    }
    order[i] = (stats_order_t){seg->total_size, active, i};
  }
  qsort(order, s->nsegments, sizeof *order, stats_order_cmp);

  fprintf(out, "Summary of segments >= %s in size\n",
          cli_format_bytes((int64_t)STATS_PAGE_SIZE, b));
  stats_sum_t reserved = 0, allocated = 0, f_ext = 0, f_int = 0;
  int rc = CLI_OK;
  for (size_t i = 0; i < s->nsegments && rc == CLI_OK; i++) {
    const ms_snap_segment_t *seg = &s->segments[order[i].index];
    reserved += seg->total_size;
    rc = stats_segment(out, s, file, seg, &allocated, &f_ext, &f_int);
  }
  free(order);
  if (rc != CLI_OK) return rc;
  fprintf(out, "segments: %zu\n", s->nsegments);
  fprintf(out, "total_reserved: %s\n", stats_bytes(reserved, b));
  fprintf(out, "total_allocated: %s\n", stats_bytes(allocated, b));
  fputs("total_free: ", out);
  stats_report_free(out, f_ext, f_int);
  fputc('\n', out);
  fputs(stats_legend, out);
  fputc('\n', out); /* print() ends the text with one more newline */
  return CLI_OK;
}

/* ---- --json ---------------------------------------------------------------------------------- */

/* An exact integer of 128 bits as JSON. */
static void stats_json_sum(cli_json_t *j, stats_sum_t v) {
  if (v >= INT64_MIN && v <= INT64_MAX) {
    cli_json_i64(j, (int64_t)v);
    return;
  }
  char t[48], *p = t + sizeof t;
  __extension__ unsigned __int128 u = v < 0 ? -(unsigned __int128)v : (unsigned __int128)v;
  do {
    *--p = (char)('0' + (int)(u % 10));
    u /= 10;
  } while (u);
  if (v < 0) *--p = '-';
  cli_json_raw(j, p, (size_t)(t + sizeof t - p));
}

/* The numbers behind the text: every segment in snapshot order with the bytes the map draws
 * (allocated as the text counts it; free split into external and internal), then the totals. */
static int stats_json(FILE *out, const ms_snapshot_t *s, const char *file) {
  ms_sink_t sink;
  ms_sink_init_file(&sink, out);
  cli_json_t j = {&sink, 0};
  cli_json_lit(&j, "{\"command\": \"stats\", \"file\": ");
  cli_json_str(&j, file);
  cli_json_lit(&j, ", \"segments\": [");
  stats_sum_t reserved = 0, allocated = 0, f_ext = 0, f_int = 0;
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *seg = &s->segments[i];
    stats_sum_t alloc = 0, ext = 0, in = 0;
    for (uint32_t k = 0; k < seg->nblocks; k++) {
      const ms_snap_block_t *b = ms_snap_segment_block(s, seg, k);
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) {
        stats_sum_t a = stats_block_allocated(s, b);
        alloc += a;
        in += (stats_sum_t)b->size - a;
      } else {
        ext += b->size;
      }
    }
    reserved += seg->total_size;
    allocated += alloc;
    f_ext += ext;
    f_int += in;
    cli_json_lit(&j, i ? ",\n  {\"device\": " : "\n  {\"device\": ");
    cli_json_i64(&j, seg->device);
    cli_json_lit(&j, ", \"address\": ");
    cli_json_u64(&j, seg->address);
    cli_json_lit(&j, ", \"stream\": ");
    cli_json_u64(&j, seg->stream);
    cli_json_lit(&j, ", \"total_size\": ");
    cli_json_u64(&j, seg->total_size);
    cli_json_lit(&j, ", \"allocated\": ");
    stats_json_sum(&j, alloc);
    cli_json_lit(&j, ", \"free_external\": ");
    stats_json_sum(&j, ext);
    cli_json_lit(&j, ", \"free_internal\": ");
    stats_json_sum(&j, in);
    cli_json_lit(&j, "}");
  }
  cli_json_lit(&j, s->nsegments ? "\n], \"total_segments\": " : "], \"total_segments\": ");
  cli_json_u64(&j, s->nsegments);
  cli_json_lit(&j, ", \"total_reserved\": ");
  stats_json_sum(&j, reserved);
  cli_json_lit(&j, ", \"total_allocated\": ");
  stats_json_sum(&j, allocated);
  cli_json_lit(&j, ", \"total_free_external\": ");
  stats_json_sum(&j, f_ext);
  cli_json_lit(&j, ", \"total_free_internal\": ");
  stats_json_sum(&j, f_int);
  cli_json_lit(&j, "}\n");
  return CLI_OK; /* a write error is reported when stdout is closed (main.c) */
}

/* ---- --summary ------------------------------------------------------------------------------- */

/* Finds a flat statistic of device d by PyTorch's key name. */
static bool stats_lookup(const ms_snapshot_t *s, const ms_snap_device_t *d, const char *key,
                         int64_t *v) {
  for (uint32_t i = 0; i < d->nstats; i++) {
    const ms_snap_kv_t *kv = &s->stats[d->first_stat + i];
    if (strcmp(kv->key, key) != 0) continue;
    if (kv->kind == MS_SNAP_VAL_INT)
      *v = kv->i;
    else if (kv->kind == MS_SNAP_VAL_FLOAT)
      *v = (int64_t)kv->f;
    else if (kv->kind == MS_SNAP_VAL_BOOL)
      *v = kv->b;
    else
      return false;
    return true;
  }
  return false;
}

static void stats_gauge(const ms_snapshot_t *s, const ms_snap_device_t *d, const char *name,
                        ms_stat_t *g) {
  char key[128];
  snprintf(key, sizeof key, "%s.current", name);
  stats_lookup(s, d, key, &g->current);
  snprintf(key, sizeof key, "%s.peak", name);
  stats_lookup(s, d, key, &g->peak);
  snprintf(key, sizeof key, "%s.allocated", name);
  stats_lookup(s, d, key, &g->allocated);
  snprintf(key, sizeof key, "%s.freed", name);
  stats_lookup(s, d, key, &g->freed);
}

/* Rebuilds an ms_stats_t from the flat statistics of one device (PyTorch's key names). */
static void stats_from_flat(const ms_snapshot_t *s, const ms_snap_device_t *d, ms_stats_t *st) {
  static const char *const pools[MS_STAT_NUM_TYPES] = {"all", "small_pool", "large_pool"};
  char name[96];
  ms_stats_init(st);
#define STATS_GET_ARRAY(field)                              \
  for (int p = 0; p < MS_STAT_NUM_TYPES; p++) {             \
    snprintf(name, sizeof name, "%s.%s", #field, pools[p]); \
    stats_gauge(s, d, name, &st->field[p]);                 \
  }
#define STATS_GET_STAT(field) stats_gauge(s, d, #field, &st->field);
#define STATS_GET_COUNTER(field) stats_lookup(s, d, #field, &st->field);
#define STATS_GET(kind, field) STATS_GET_##kind(field)
  MS_STAT_FIELDS(STATS_GET)
#undef STATS_GET
#undef STATS_GET_COUNTER
#undef STATS_GET_STAT
#undef STATS_GET_ARRAY
}

/* The current values memory_summary would show, computed from one device's segments: what a
 * snapshot without statistics (a PyTorch pickle) still tells. Peaks and totals are not recorded
 * anywhere in such a file, so they are not shown. */
enum {
  STATS_C_RESERVED,
  STATS_C_ALLOCATED,
  STATS_C_ACTIVE,
  STATS_C_REQUESTED,
  STATS_C_NONREL,
  STATS_C_SEGMENTS,
  STATS_C_ALLOCS,
  STATS_C_ACTIVE_ALLOCS,
  STATS_C_NONREL_ALLOCS,
  STATS_C_N
};

static int stats_cmp_i64(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

static void stats_computed_device(FILE *out, const ms_snapshot_t *s, int64_t device) {
  static const char *const names[STATS_C_N] = {
      "reserved memory",  "allocated memory",      "active memory",
      "requested memory", "non-releasable memory", "segments",
      "allocations",      "active allocs",         "non-releasable allocs"};
  stats_sum_t v[STATS_C_N][3] = {{0}}; /* all, large_pool, small_pool */
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *seg = &s->segments[i];
    if (seg->device != device) continue;
    int pool = seg->is_large ? 1 : 2;
    stats_sum_t add[STATS_C_N] = {0};
    add[STATS_C_RESERVED] = seg->total_size;
    add[STATS_C_SEGMENTS] = 1;
    for (uint32_t k = 0; k < seg->nblocks; k++) {
      const ms_snap_block_t *b = ms_snap_segment_block(s, seg, k);
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED) {
        add[STATS_C_ALLOCATED] += b->size;
        add[STATS_C_REQUESTED] += stats_block_allocated(s, b);
        add[STATS_C_ALLOCS]++;
      }
      if (b->state == MS_BLOCK_ACTIVE_ALLOCATED || b->state == MS_BLOCK_ACTIVE_PENDING_FREE) {
        add[STATS_C_ACTIVE] += b->size;
        add[STATS_C_ACTIVE_ALLOCS]++;
      } else if (seg->nblocks > 1) { /* a free block of a split segment */
        add[STATS_C_NONREL] += b->size;
        add[STATS_C_NONREL_ALLOCS]++;
      }
    }
    for (int m = 0; m < STATS_C_N; m++) {
      v[m][0] += add[m];
      v[m][pool] += add[m];
    }
  }
  fprintf(out, "\nCurrent values computed from the segments of device %lld:\n", (long long)device);
  fprintf(out, "  %-22s %12s %12s %12s\n", "", "all", "large_pool", "small_pool");
  for (int m = 0; m < STATS_C_N; m++) {
    char c[3][CLI_BYTES_BUFSZ];
    for (int p = 0; p < 3; p++) {
      if (m < STATS_C_SEGMENTS)
        stats_bytes(v[m][p], c[p]);
      else /* counts of blocks and segments: each below 2^32 */
        snprintf(c[p], sizeof c[p], "%lld", (long long)v[m][p]);
    }
    fprintf(out, "  %-22s %12s %12s %12s\n", names[m], c[0], c[1], c[2]);
  }
}

static int stats_computed(FILE *out, const ms_snapshot_t *s) {
  fputs(
      "\nmemory_summary: this snapshot carries no allocator statistics (PyTorch pickles have "
      "none;\nmemsnap snapshots record them per device), so peaks and totals are unknown.\n",
      out);
  int64_t *dev = malloc((s->nsegments ? s->nsegments : 1) * sizeof *dev);
  if (!dev) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  for (size_t i = 0; i < s->nsegments; i++) dev[i] = s->segments[i].device;
  qsort(dev, s->nsegments, sizeof *dev, stats_cmp_i64);
  for (size_t i = 0; i < s->nsegments; i++)
    if (i == 0 || dev[i] != dev[i - 1]) stats_computed_device(out, s, dev[i]);
  free(dev);
  return CLI_OK;
}

static int stats_summary(FILE *out, const ms_snapshot_t *s) {
  bool any = false;
  for (size_t i = 0; i < s->ndevices; i++) {
    const ms_snap_device_t *d = &s->devices[i];
    if (!(d->present & MS_DEV_HAS_STATS) || d->nstats == 0) continue;
    ms_stats_t st;
    stats_from_flat(s, d, &st);
    char *text = NULL;
    if (ms_stats_memory_summary(&st, (int)i, false, &text) != MS_OK) {
      cli_error("out of memory");
      return CLI_FAILURE;
    }
    fputc('\n', out);
    fputs(text, out);
    ms_stats_text_free(text);
    any = true;
  }
  return any ? CLI_OK : stats_computed(out, s);
}

int cmd_stats(int argc, char **argv) {
  int summary = 0, json = 0, keep_going = 0;
  const char *at_s = NULL, *device_s = NULL, *range_s = NULL, *stream_s = NULL, *pool_s = NULL,
             *jobs_s = NULL;
  const struct cli_opt opts[] = {{"summary", 0, &summary, NULL}, {"json", 0, &json, NULL},
                                 {"at", 0, NULL, &at_s},         {"jobs", 0, NULL, &jobs_s},
                                 {"keep-going", 0, &keep_going, NULL},
                                 {"device", 0, NULL, &device_s}, {"range", 0, NULL, &range_s},
                                 {"stream", 0, NULL, &stream_s}, {"pool", 0, NULL, &pool_s},
                                 {NULL, 0, NULL, NULL}};
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (!pos) return CLI_FAILURE;
  int npos = 0;
  int rc = cli_parse_options("stats", stats_usage, opts, argc, argv, pos, argc, &npos);
  if (rc == CLI_OK && cli_ranks_wanted(pos, npos)) { /* many ranks (cli/ranks.c) */
    if (summary || at_s || device_s || range_s || stream_s || pool_s)
      rc = cli_usage_error("stats",
                           "with several FILEs only --json, --jobs and --keep-going apply");
    else
      rc = cli_ranks("stats", pos, npos, json != 0, jobs_s, keep_going != 0);
    free(pos);
    return rc;
  }
  char *file = npos > 0 ? pos[0] : NULL;
  free(pos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (!file) return cli_usage_error("stats", "missing FILE");
  if (jobs_s) return cli_usage_error("stats", "option '--jobs' needs several FILEs");
  if (keep_going)
    return cli_usage_error("stats", "option '--keep-going' needs several FILEs");
  if (json && summary)
    return cli_usage_error("stats", "--summary has no JSON form; use one or the other");
  cli_tl_args_t ta;
  if ((rc = cli_tl_args_parse("stats", &ta, device_s, range_s, stream_s, pool_s, at_s)) != CLI_OK)
    return rc;
  ms_snapshot_t *snap = NULL, *view = NULL;
  /* the state at the end needs no trace; a moment, a range or a filter does */
  if ((rc = cli_load_range(file, cli_tl_args_need_trace(&ta) ? MS_LOAD_NO_FREE_STACKS : MS_LOAD_NO_TRACE,
                        &ta, &snap)) !=
      CLI_OK)
    return rc;
  rc = cli_at_snapshot(snap, cli_display_name(file), &ta, true, &view, NULL, NULL);
  if (rc == CLI_OK && json) {
    rc = stats_json(stdout, view ? view : snap, cli_display_name(file));
  } else if (rc == CLI_OK) {
    rc = stats_segsum(stdout, view ? view : snap, cli_display_name(file));
  }
  if (rc == CLI_OK && summary) rc = stats_summary(stdout, view ? view : snap);
  ms_snapshot_free(view);
  ms_snapshot_free(snap);
  return rc;
}
