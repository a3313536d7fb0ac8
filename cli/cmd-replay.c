/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap replay FILE --check | --config STR | --sweep SPEC [--capacity SIZE]
 * [--min-capacity] [--json]` (docs/replay.md).
 *
 * --check replays every device trace with the recorded settings and prints, per device, the
 * verdict (PASS, FAIL or INCONCLUSIVE with the first mismatch and the trace entries around it, or
 * "not replayable" with the reason); exit status 0 when every replayable trace passes.
 * --config and --sweep replay the allocation stream under other settings (memsnap/replay.h) and
 * print the usage side by side with the recorded run; --min-capacity adds the smallest device
 * capacity without an OOM.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "memsnap/config.h"
#include "memsnap/replay.h"
#include "memsnap/stats.h"

static const char replay_usage[] =
    "usage: memsnap replay FILE --check [--capacity SIZE] [--json]\n"
    "       memsnap replay FILE --config STR [--capacity SIZE | --min-capacity] [--json]\n"
    "       memsnap replay FILE --sweep SPEC [--capacity SIZE | --min-capacity] [--json]\n"
    "\n"
    "Replays the allocator trace of a snapshot (a PyTorch pickle or a memsnap snapshot) through\n"
    "memsnap's allocator.\n"
    "--check reproduces every decision PyTorch's allocator recorded (new segments, block\n"
    "addresses, release bursts, the final layout) and prints PASS, FAIL or INCONCLUSIVE per\n"
    "device; the exit status is 0 when every replayable trace passes, 1 otherwise.\n"
    "--config and --sweep answer what-if questions: the same allocations and frees under other\n"
    "allocator settings and device capacity, with peak reserved and allocated memory,\n"
    "fragmentation at the peak, device allocations and frees, retries and OOMs, side by side with\n"
    "the recorded run.\n"
    "\n"
    "options:\n"
    "  --check            fidelity check with the recorded settings\n"
    "  --config STR       what-if under STR (MEMSNAP_ALLOC_CONF syntax, on top of the recorded\n"
    "                     settings), e.g. 'expandable_segments:True'\n"
    "  --sweep SPEC       what-if for every combination of SPEC, e.g.\n"
    "                     'max_split_size_mb=64,256;expandable_segments=False,True'\n"
    "  --capacity SIZE    device capacity (e.g. 24GiB, 8000M, 123456789, or unlimited); what-if\n"
    "                     default: the device's size the snapshot records (memsnap's do), else\n"
    "                     the one its first OOM implies (reserved + device_free), else unlimited\n"
    "  --min-capacity     also find the smallest capacity without an OOM (a search)\n"
    "  -d, --device N     replay only device N\n"
    "  --json             print a JSON document instead of text\n"
    "  -h, --help         show this help\n";

/* ---- helpers --------------------------------------------------------------------------------- */

static void replay_json_str(FILE *f, const char *s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char c = (unsigned char)*s;
    if (c == '"' || c == '\\') fprintf(f, "\\%c", c);
    else if (c < 0x20) fprintf(f, "\\u%04x", c);
    else fputc(c, f);
  }
  fputc('"', f);
}

static const char *replay_size(uint64_t n, char *buf, size_t cap) {
  ms_format_size(n, buf, cap);
  return buf;
}

static void replay_print_entry(const ms_snapshot_t *s, size_t i, bool mark) {
  const ms_snap_trace_t *e = &s->trace[i];
  const char *name = e->action == MS_TRACE_OTHER ? ms_snap_trace_action_name(e) : ms_trace_action_name(e->action);
  if (e->action == MS_TRACE_OOM)
    printf("    %c %7zu  %-15s device_free %" PRIu64 "  %" PRIu64 " B  stream %" PRIu64 "\n",
           mark ? '>' : ' ', i, name, e->addr, e->size, ms_snap_trace_stream(e));
  else
    printf("    %c %7zu  %-15s 0x%" PRIx64 "  %" PRIu64 " B  stream %" PRIu64 "\n",
           mark ? '>' : ' ', i, name, e->addr, e->size, ms_snap_trace_stream(e));
}

static void replay_print_start(const ms_replay_device_t *d) {
  if (!d->mid_run) {
    printf("start: empty");
    return;
  }
  printf("start: mid-run, rebuilt from the snapshot: %zu segments, %zu live blocks, %zu block "
         "sizes inferred (%zu ambiguous)",
         d->start_segments, d->start_blocks, d->inferred, d->ambiguous);
}

/* ---- --check ----------------------------------------------------------------------------------- */

static void replay_check_text(const ms_snapshot_t *s, const ms_replay_report_t *rep) {
  for (size_t k = 0; k < rep->ndevices; k++) {
    const ms_replay_device_t *d = &rep->devices[k];
    if (d->verdict == MS_REPLAY_UNREPLAYABLE) {
      printf("device %d: not replayable: %s\n", d->device, d->reason);
      continue;
    }
    printf("device %d: %s  %zu allocs replayed (%zu trace entries); ", d->device,
           ms_replay_verdict_name(d->verdict), d->allocs, d->entries);
    replay_print_start(d);
    putchar('\n');
    if (d->verdict == MS_REPLAY_PASS) continue;
    if (d->mismatch_entry >= 0)
      printf("  first mismatch at trace entry %" PRId64 "%s\n", d->mismatch_entry,
             d->verdict == MS_REPLAY_INCONCLUSIVE ? " (next to an ambiguous inferred start block)"
                                                  : "");
    else
      printf("  first mismatch in the final layout%s\n",
             d->verdict == MS_REPLAY_INCONCLUSIVE ? " (next to an ambiguous inferred start block)"
                                                  : "");
    printf("  PyTorch: %s\n  memsnap: %s\n", d->expected, d->actual);
    if (d->mismatch_entry >= 0) {
      const ms_snap_device_t *dv = &s->devices[d->device];
      size_t lo = dv->first_trace, hi = dv->first_trace + dv->ntrace;
      size_t at = (size_t)d->mismatch_entry;
      size_t from = at >= lo + 4 ? at - 4 : lo, to = at + 3 < hi ? at + 3 : hi;
      printf("  context:\n");
      for (size_t i = from; i < to; i++) replay_print_entry(s, i, i == at);
    }
  }
}

static void replay_check_json(const char *file, const ms_replay_report_t *rep, bool pass) {
  printf("{\"file\": ");
  replay_json_str(stdout, file);
  printf(", \"mode\": \"check\", \"pass\": %s, \"devices\": [", pass ? "true" : "false");
  for (size_t k = 0; k < rep->ndevices; k++) {
    const ms_replay_device_t *d = &rep->devices[k];
    printf("%s\n  {\"device\": %d, \"verdict\": \"%s\", \"entries\": %zu, \"allocs\": %zu", k ? "," : "",
           d->device, ms_replay_verdict_name(d->verdict), d->entries, d->allocs);
    if (d->verdict == MS_REPLAY_UNREPLAYABLE) {
      printf(", \"reason\": ");
      replay_json_str(stdout, d->reason);
      printf("}");
      continue;
    }
    printf(", \"mid_run\": %s, \"start_segments\": %zu, \"start_blocks\": %zu, \"inferred\": %zu, "
           "\"ambiguous\": %zu, \"mismatch\": ",
           d->mid_run ? "true" : "false", d->start_segments, d->start_blocks, d->inferred,
           d->ambiguous);
    if (d->verdict == MS_REPLAY_PASS) {
      printf("null}");
      continue;
    }
    printf("{\"entry\": %" PRId64 ", \"expected\": ", d->mismatch_entry);
    replay_json_str(stdout, d->expected);
    printf(", \"actual\": ");
    replay_json_str(stdout, d->actual);
    printf("}}");
  }
  printf("\n]}\n");
}

/* ---- what-if ----------------------------------------------------------------------------------- */

typedef struct replay_row_s {
  const char *config; /* a --sweep combination, the --config string, or "" */
  ms_replay_report_t *rep;
  size_t *min_capacity; /* per device of rep (its k-th entry); 0 = not asked / not found */
} replay_row_t;

static void replay_usage_json(const ms_replay_usage_t *u) {
  if (!u->valid) {
    printf("null");
    return;
  }
  printf("{\"peak_reserved\": %" PRIu64 ", \"peak_reserved_index\": %" PRId64
         ", \"peak_allocated\": %" PRIu64 ", \"peak_allocated_index\": %" PRId64
         ", \"peak_requested\": %" PRIu64 ", \"peak_requested_index\": %" PRId64
         ", \"unallocated_at_peak_reserved\": %" PRIu64,
         u->peak_reserved, u->peak_reserved_index, u->peak_allocated, u->peak_allocated_index,
         u->peak_requested, u->peak_requested_index, u->unallocated_at_peak_reserved);
  printf(", \"device_mallocs\": %" PRIu64 ", \"device_frees\": %" PRIu64
         ", \"alloc_retries\": %" PRIu64 ", \"ooms\": %" PRIu64 ", \"first_oom_index\": %" PRId64
         ", \"final_reserved\": %" PRIu64 ", \"final_allocated\": %" PRIu64,
         u->device_mallocs, u->device_frees, u->alloc_retries, u->ooms, u->first_oom_index,
         u->final_reserved, u->final_allocated);
  printf(", \"start_reserved\": %" PRIu64 ", \"start_short\": %" PRIu64, u->start_reserved,
         u->start_short);
  if (u->first_oom_index >= 0) {
    printf(", \"first_oom\": {\"index\": %" PRId64 ", \"size\": %" PRIu64 ", \"message\": ",
           u->first_oom_index, u->first_oom_size);
    replay_json_str(stdout, u->oom_message);
    printf("}");
  }
  printf("}");
}

/* The figures of docs/replay.md, by name, in the order the text prints them. */
enum { RP_NFIG = 14 };
static const char *const replay_fig_names[RP_NFIG] = {
    "peak_reserved",  "peak_reserved_index", "peak_allocated", "peak_allocated_index",
    "peak_requested", "peak_requested_index", "unallocated_at_peak_reserved", "device_mallocs",
    "device_frees",   "alloc_retries",        "ooms",           "first_oom_index",
    "final_reserved", "final_allocated"};

static void replay_cells(const ms_replay_usage_t *u, char cells[RP_NFIG][32]) {
  if (!u->valid) {
    for (int i = 0; i < RP_NFIG; i++) snprintf(cells[i], 32, "-");
    return;
  }
  ms_format_size(u->peak_reserved, cells[0], 32);
  snprintf(cells[1], 32, "%" PRId64, u->peak_reserved_index);
  ms_format_size(u->peak_allocated, cells[2], 32);
  snprintf(cells[3], 32, "%" PRId64, u->peak_allocated_index);
  ms_format_size(u->peak_requested, cells[4], 32);
  snprintf(cells[5], 32, "%" PRId64, u->peak_requested_index);
  ms_format_size(u->unallocated_at_peak_reserved, cells[6], 32);
  snprintf(cells[7], 32, "%" PRIu64, u->device_mallocs);
  snprintf(cells[8], 32, "%" PRIu64, u->device_frees);
  snprintf(cells[9], 32, "%" PRIu64, u->alloc_retries);
  snprintf(cells[10], 32, "%" PRIu64, u->ooms);
  snprintf(cells[11], 32, "%" PRId64, u->first_oom_index);
  ms_format_size(u->final_reserved, cells[12], 32);
  ms_format_size(u->final_allocated, cells[13], 32);
}

/* The recorded start state does not fit the capacity: nothing was replayed. */
static void replay_print_start_short(const char *config, const ms_replay_usage_t *u,
                                     size_t capacity) {
  char a[32], b[32], c[32];
  if (!u->valid || !u->start_short) return;
  printf("  %s%sthe start state does not fit: it holds %s reserved, the capacity is %s (%s short); "
         "nothing was replayed\n",
         config, *config ? ": " : "", replay_size(u->start_reserved, a, sizeof a), replay_size(capacity, b, sizeof b),
         replay_size(u->start_short, c, sizeof c));
}

/* Where a what-if's capacity came from: 'capacity 4.0GiB (recorded in the snapshot)'. */
static const char *replay_capacity_from(const ms_replay_device_t *d, bool given) {
  if (given) return "--capacity";
  switch (d->capacity_source) {
  case MS_CAPACITY_RECORDED: return "snapshot";
  case MS_CAPACITY_INFERRED: return "inferred_from_oom";
  default: return "none";
  }
}

static const char *replay_capacity(const ms_replay_device_t *d, bool given, char *buf,
                                   size_t cap) {
  char sz[32], a[32], b[32];
  if (given && d->capacity) snprintf(buf, cap, "%s (--capacity)", replay_size(d->capacity, sz, sizeof sz));
  else if (given) snprintf(buf, cap, "unlimited (--capacity unlimited)");
  else if (d->capacity_source == MS_CAPACITY_RECORDED)
    snprintf(buf, cap, "%s (recorded in the snapshot)", replay_size(d->capacity, sz, sizeof sz));
  else if (d->capacity_source == MS_CAPACITY_INFERRED)
    snprintf(buf, cap, "%s (inferred from the recorded OOM at entry %zu: reserved %s + %s free on "
             "the device)", replay_size(d->capacity, sz, sizeof sz), d->capacity_oom.entry,
             replay_size(d->capacity_oom.reserved, a, sizeof a),
             replay_size(d->capacity_oom.device_free, b, sizeof b));
  else snprintf(buf, cap, "unlimited (the snapshot records no device size)");
  return buf;
}

/* A what-if whose OOMs differ from the recorded run's on a device of unknown size answers
 * nothing about those OOMs: the warning every output carries then (NULL when none). */
static const char *replay_capacity_warning(const ms_replay_device_t *d,
                                           const ms_replay_usage_t *u, char *buf, size_t cap) {
  if (d->capacity || d->capacity_source != MS_CAPACITY_UNKNOWN || !u->valid ||
      u->ooms == d->recorded_ooms)
    return NULL;
  snprintf(buf, cap, "recorded %zu OOM%s, replayed %" PRIu64 ": the device's size is unknown; "
           "pass --capacity", d->recorded_ooms, d->recorded_ooms == 1 ? "" : "s", u->ooms);
  return buf;
}

/* Who recorded the run, from the file: memsnap's own snapshots or PyTorch's pickles. */
static const char *replay_producer(const ms_snapshot_t *snap) {
  return snap->origin == MS_SNAP_ORIGIN_MEMSNAP ? "memsnap" : "PyTorch";
}

static void replay_whatif_text(const ms_snapshot_t *snap, const replay_row_t *rows, size_t nrows,
                               bool sweep, bool capacity_given, bool min_cap) {
  char capbuf[192];
  const ms_replay_report_t *first = rows[0].rep;
  for (size_t k = 0; k < first->ndevices; k++) {
    const ms_replay_device_t *d0 = &first->devices[k];
    if (d0->verdict == MS_REPLAY_UNREPLAYABLE) {
      printf("device %d: not replayable: %s\n", d0->device, d0->reason);
      continue;
    }
    printf("device %d: %zu allocs, capacity %s; ", d0->device, d0->allocs,
           replay_capacity(d0, capacity_given, capbuf, sizeof capbuf));
    replay_print_start(d0);
    putchar('\n');
    if (d0->verdict != MS_REPLAY_PASS)
      printf("  note: --check gives %s here (%s); the recorded column is partial\n",
             ms_replay_verdict_name(d0->verdict), d0->reason);
    for (size_t j = 0; j < nrows; j++) {
      char wb[160];
      const ms_replay_device_t *d = &rows[j].rep->devices[k];
      const char *w = replay_capacity_warning(d, &d->replayed, wb, sizeof wb);
      if (w) printf("  warning: %s%s%s\n", rows[j].config, rows[j].config[0] ? ": " : "", w);
    }
    char rc[RP_NFIG][32], cc[RP_NFIG][32];
    replay_cells(&d0->recorded, rc);
    if (!sweep) {
      const ms_replay_device_t *d = &rows[0].rep->devices[k];
      replay_cells(&d->replayed, cc);
      char head[32];
      snprintf(head, sizeof head, "recorded (%s)", replay_producer(snap));
      printf("  %-28s %-20s %s\n", "", head, rows[0].config[0] ? rows[0].config
                                                                              : "replayed");
      for (int i = 0; i < RP_NFIG; i++)
        printf("  %-28s %-20s %s\n", replay_fig_names[i], rc[i], cc[i]);
      if (min_cap && rows[0].min_capacity[k])
        printf("  %-28s %-20s %s (%zu bytes)\n", "min_capacity", "",
               replay_size(rows[0].min_capacity[k], capbuf, sizeof capbuf),
               rows[0].min_capacity[k]);
      const ms_replay_usage_t *u = &d->replayed;
      replay_print_start_short("", u, (size_t)d->capacity);
      if (u->first_oom_index >= 0)
        printf("  first OOM at entry %" PRId64 " of device %d's trace (%" PRIu64
               " B requested):\n    %s\n",
               u->first_oom_index, d->device, u->first_oom_size, u->oom_message);
      continue;
    }
    /* The configuration column is as wide as its longest value. */
    int w = 19;
    for (size_t j = 0; j < nrows; j++)
      if ((int)strlen(rows[j].config) > w) w = (int)strlen(rows[j].config);
    printf("  %-*s %13s %14s %28s %14s %12s %13s %4s%s\n", w, "configuration", "peak_reserved",
           "peak_allocated", "unallocated_at_peak_reserved", "device_mallocs", "device_frees",
           "alloc_retries", "ooms", min_cap ? "  min_capacity" : "");
    char head[32];
    snprintf(head, sizeof head, "(recorded: %s)", replay_producer(snap));
    printf("  %-*s %13s %14s %28s %14s %12s %13s %4s\n", w, head, rc[0], rc[2], rc[6], rc[7],
           rc[8], rc[9], rc[10]);
    for (size_t j = 0; j < nrows; j++) {
      const ms_replay_device_t *d = &rows[j].rep->devices[k];
      replay_cells(&d->replayed, cc);
      printf("  %-*s %13s %14s %28s %14s %12s %13s %4s", w, rows[j].config, cc[0], cc[2], cc[6],
             cc[7], cc[8], cc[9], cc[10]);
      if (min_cap)
        printf("  %12s", rows[j].min_capacity[k]
                             ? replay_size(rows[j].min_capacity[k], capbuf, sizeof capbuf)
                             : "-");
      putchar('\n');
    }
    for (size_t j = 0; j < nrows; j++) {
      const ms_replay_usage_t *u = &rows[j].rep->devices[k].replayed;
      if (u->valid && u->first_oom_index >= 0)
        printf("  %s: first OOM at entry %" PRId64 " of device %d's trace (%" PRIu64
               " B requested)\n",
               rows[j].config, u->first_oom_index, d0->device, u->first_oom_size);
      replay_print_start_short(rows[j].config, u, (size_t)rows[j].rep->devices[k].capacity);
    }
  }
}

static void replay_whatif_json(const ms_snapshot_t *snap, const char *file,
                               const replay_row_t *rows, size_t nrows, size_t capacity,
                               bool capacity_given) {
  printf("{\"file\": ");
  replay_json_str(stdout, file);
  printf(", \"mode\": \"whatif\", \"recorded_by\": \"%s\", \"capacity\": %zu, \"devices\": [",
         replay_producer(snap), capacity);
  const ms_replay_report_t *first = rows[0].rep;
  for (size_t k = 0; k < first->ndevices; k++) {
    const ms_replay_device_t *d0 = &first->devices[k];
    printf("%s\n  {\"device\": %d, \"allocs\": %zu, \"check\": \"%s\"", k ? "," : "", d0->device,
           d0->allocs, ms_replay_verdict_name(d0->verdict));
    if (d0->verdict != MS_REPLAY_UNREPLAYABLE)
      printf(", \"capacity\": %" PRIu64 ", \"capacity_from\": \"%s\", \"capacity_source\": \"%s\""
             ", \"recorded_ooms\": %zu",
             d0->capacity, replay_capacity_from(d0, capacity_given),
             capacity_given ? "given" : ms_capacity_source_name(d0->capacity_source),
             d0->recorded_ooms);
    if (d0->verdict == MS_REPLAY_UNREPLAYABLE) {
      printf(", \"reason\": ");
      replay_json_str(stdout, d0->reason);
      printf("}");
      continue;
    }
    printf(", \"recorded\": ");
    replay_usage_json(&d0->recorded);
    printf(", \"configs\": [");
    for (size_t j = 0; j < nrows; j++) {
      printf("%s\n    {\"config\": ", j ? "," : "");
      replay_json_str(stdout, rows[j].config);
      char wb[160];
      const ms_replay_device_t *d = &rows[j].rep->devices[k];
      const char *w = replay_capacity_warning(d, &d->replayed, wb, sizeof wb);
      if (w) {
        printf(", \"warning\": ");
        replay_json_str(stdout, w);
      }
      printf(", \"replayed\": ");
      replay_usage_json(&rows[j].rep->devices[k].replayed);
      if (rows[j].min_capacity[k]) printf(", \"min_capacity\": %zu", rows[j].min_capacity[k]);
      printf("}");
    }
    printf("]}");
  }
  printf("\n]}\n");
}

/* The configurations to replay: the --sweep grid or the one --config (the recorded one when
 * none), each checked. @return the number of rows (*rows to free()), or minus the exit status. */
static int replay_rows(const char *config, const char *sweep, ms_replay_sweep_t *grid,
                       replay_row_t **out) {
  replay_row_t *rows = NULL;
  int nrows = 1;
  if (sweep) {
    ms_errbuf_t eb;
    if (ms_replay_sweep_parse(sweep, grid, &eb) != MS_OK)
      return -cli_usage_error("replay", "invalid --sweep '%s': %s", sweep, eb.msg);
    nrows = (int)grid->n;
  }
  rows = calloc((size_t)nrows, sizeof *rows);
  if (!rows) {
    ms_replay_sweep_release(grid);
    cli_error("out of memory");
    return -CLI_FAILURE;
  }
  for (int j = 0; j < nrows; j++) rows[j].config = sweep ? grid->configs[j] : config ? config : "";
  for (int j = 0; j < nrows; j++) {
    ms_alloc_config_t c;
    ms_errbuf_t eb;
    ms_alloc_config_init(&c);
    if (ms_alloc_config_parse(&c, rows[j].config, &eb) != MS_OK) {
      int u = cli_usage_error("replay", "invalid configuration '%s': %s", rows[j].config, eb.msg);
      free(rows);
      ms_replay_sweep_release(grid);
      return -u;
    }
  }
  *out = rows;
  return nrows;
}

/* Prints the check or what-if report. @return the exit status. */
static int replay_report(const ms_snapshot_t *snap, const char *name, replay_row_t *rows,
                         int nrows, int check, int json, bool sweep, size_t capacity,
                         bool capacity_given, int min_cap) {
  const ms_replay_report_t *rep = rows[0].rep;
  size_t replayable = 0, passed = 0;
  for (size_t k = 0; k < rep->ndevices; k++) {
    if (rep->devices[k].verdict == MS_REPLAY_UNREPLAYABLE) continue;
    replayable++;
    passed += rep->devices[k].verdict == MS_REPLAY_PASS;
  }
  if (check) {
    bool pass = replayable > 0 && passed == replayable;
    if (json) replay_check_json(name, rep, pass);
    else {
      replay_check_text(snap, rep);
      printf("%zu of %zu replayable trace%s pass%s\n", passed, replayable,
             replayable == 1 ? "" : "s", replayable == 1 ? "es" : "");
    }
    return pass ? CLI_OK : CLI_FAILURE;
  }
  if (json) replay_whatif_json(snap, name, rows, (size_t)nrows, capacity, capacity_given);
  else replay_whatif_text(snap, rows, (size_t)nrows, sweep, capacity_given, min_cap);
  return replayable ? CLI_OK : CLI_FAILURE;
}

/* A file with no trace at all: says why there is nothing to replay. @return whether so. */
static bool replay_nothing(const ms_snapshot_t *snap, const char *path) {
  size_t entries = 0;
  for (size_t d = 0; d < snap->ndevices; d++) entries += snap->devices[d].ntrace;
  if (entries) return false;
  if (snap->origin == MS_SNAP_ORIGIN_TORCH_LIST)
    cli_error("'%s': nothing to replay: a bare segment list (torch.cuda.memory_snapshot(), the "
              "format of PyTorch before 2.0) records the segments but no trace", cli_display_name(path));
  else
    cli_error("'%s': nothing to replay: no trace was recorded (PyTorch's "
              "torch.cuda.memory._record_memory_history, or memsnap's history, was not on)",
              cli_display_name(path));
  return true;
}

static void replay_prepared_free(ms_replay_prepared_t **prep, size_t n) {
  for (size_t d = 0; prep && d < n; d++)
    ms_replay_prepared_free(prep[d]);
  free(prep);
}

/* Every device of snap (or only `device`, when >= 0) prepared for its what-ifs, into *out
 * (indexed by device). @return CLI_OK, or CLI_FAILURE (said; *out NULL). */
static int replay_prepare(const ms_snapshot_t *snap, int device, const char *path,
                          ms_replay_prepared_t ***out) {
  *out = NULL;
  ms_replay_prepared_t **prep = calloc(snap->ndevices ? snap->ndevices : 1, sizeof *prep);
  if (!prep) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  for (size_t d = 0; d < snap->ndevices; d++) {
    if (device >= 0 && (size_t)device != d) continue;
    ms_errbuf_t eb;
    int r = ms_replay_prepare(snap, (int)d, &prep[d], &eb);
    if (r != MS_OK) {
      cli_error("'%s': replay failed: %s", cli_display_name(path),
                eb.msg[0] ? eb.msg : ms_strerror(r));
      replay_prepared_free(prep, snap->ndevices);
      return CLI_FAILURE;
    }
  }
  *out = prep;
  return CLI_OK;
}

/* Each row's replay under o (its config the row's), and with min_cap each replayable device's
 * smallest capacity (its own search, on the device prepared in prep). @return CLI_OK, or
 * CLI_FAILURE (said). */
static int replay_run_rows(const ms_snapshot_t *snap, ms_replay_options_t *o, replay_row_t *rows,
                           int nrows, bool min_cap, ms_replay_prepared_t *const *prep,
                           const char *path) {
  for (int j = 0; j < nrows; j++) {
    ms_errbuf_t eb;
    o->config = rows[j].config;
    int r = ms_replay_run(snap, o, &rows[j].rep, &eb);
    if (r != MS_OK) {
      cli_progress_stop();
      cli_error("'%s': replay failed: %s", cli_display_name(path),
                eb.msg[0] ? eb.msg : ms_strerror(r));
      return CLI_FAILURE;
    }
    rows[j].min_capacity = calloc(rows[j].rep->ndevices + 1, sizeof *rows[j].min_capacity);
    if (!rows[j].min_capacity) {
      cli_error("out of memory");
      return CLI_FAILURE;
    }
    for (size_t k = 0; min_cap && k < rows[j].rep->ndevices; k++) {
      const ms_replay_device_t *d = &rows[j].rep->devices[k];
      if (d->verdict == MS_REPLAY_UNREPLAYABLE) continue;
      const ms_replay_prepared_t *p = prep ? prep[d->device] : NULL;
      r = p ? ms_replay_prepared_min_capacity(p, rows[j].config, &rows[j].min_capacity[k], &eb)
            : ms_replay_min_capacity(snap, d->device, rows[j].config, &rows[j].min_capacity[k],
                                     &eb);
      if (r != MS_OK) rows[j].min_capacity[k] = 0;
    }
  }
  return CLI_OK;
}

int cmd_replay(int argc, char **argv) {
  int check = 0, json = 0, min_cap = 0;
  const char *config = NULL, *sweep = NULL, *capacity_s = NULL, *device_s = NULL;
  const struct cli_opt opts[] = {{"check", 0, &check, NULL},
                                 {"config", 0, NULL, &config},
                                 {"sweep", 0, NULL, &sweep},
                                 {"capacity", 0, NULL, &capacity_s},
                                 {"min-capacity", 0, &min_cap, NULL},
                                 {"device", 0, NULL, &device_s},
                                 {"json", 0, &json, NULL},
                                 {NULL, 0, NULL, NULL}};
  char *pos[1];
  int npos = 0;
  int rc = cli_parse_options("replay", replay_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("replay", "missing FILE");
  int modes = check + (config != NULL) + (sweep != NULL);
  if (modes == 0 && !min_cap)
    return cli_usage_error("replay", "one of --check, --config, --sweep or --min-capacity is needed");
  if (modes > 1) return cli_usage_error("replay", "--check, --config and --sweep exclude each other");
  if (check && min_cap) return cli_usage_error("replay", "--min-capacity is a what-if option");
  if (capacity_s && min_cap)
    return cli_usage_error("replay", "--capacity and --min-capacity exclude each other");
  size_t capacity = 0;
  bool unlimited = capacity_s && strcmp(capacity_s, "unlimited") == 0;
  if (capacity_s && !unlimited && ms_replay_parse_capacity(capacity_s, &capacity, NULL) != MS_OK)
    return cli_usage_error("replay",
                           "invalid size '%s' for --capacity (digits with an optional K, M, G "
                           "or T: 24GiB, 8000M, 123456789; or 'unlimited')",
                           capacity_s);
  int device = -1;
  if (device_s) {
    char *end = NULL;
    long v = strtol(device_s, &end, 10);
    if (!*device_s || *end || v < 0 || v > 1 << 20)
      return cli_usage_error("replay", "invalid device '%s'", device_s);
    device = (int)v;
  }
  replay_row_t *rows = NULL;
  ms_replay_sweep_t grid = {0, NULL};
  int nrows = replay_rows(config, sweep, &grid, &rows);
  if (nrows < 0) return -nrows;
  ms_snapshot_t *snap = NULL;
  rc = cli_load(pos[0], &snap);
  if (rc != CLI_OK) {
    free(rows);
    ms_replay_sweep_release(&grid);
    return rc;
  }
  if (device >= 0 && (size_t)device >= snap->ndevices) {
    cli_error("'%s' has no trace for device %d (it has %zu)", cli_display_name(pos[0]), device,
              snap->ndevices);
    ms_snapshot_free(snap);
    free(rows);
    ms_replay_sweep_release(&grid);
    return CLI_FAILURE;
  }
  if (replay_nothing(snap, pos[0])) {
    ms_snapshot_free(snap);
    free(rows);
    ms_replay_sweep_release(&grid);
    return CLI_FAILURE;
  }
  ms_replay_options_t o;
  ms_replay_options_init(&o);
  o.whatif = !check;
  o.capacity = capacity;
  o.recorded_capacity = !capacity_s; /* the device's recorded size unless --capacity says */
  o.inferred_capacity = !capacity_s; /* else the one its first OOM implies */
  o.device = device;
  int status = CLI_OK;
  if (nrows > 1 || min_cap)
    cli_progress_start("replaying '%s' under %d configuration%s", cli_display_name(pos[0]), nrows,
                       nrows == 1 ? "" : "s");
  else
    cli_progress_start("replaying '%s'", cli_display_name(pos[0]));
  /* several what-ifs of a device (a sweep, or a what-if and its search): prepared once */
  ms_replay_prepared_t **prep = NULL;
  if (!check && (nrows > 1 || min_cap)) {
    status = replay_prepare(snap, device, pos[0], &prep);
    o.prepared = (const ms_replay_prepared_t *const *)prep;
    o.nprepared = prep ? snap->ndevices : 0;
  }
  if (status == CLI_OK) status = replay_run_rows(snap, &o, rows, nrows, min_cap, prep, pos[0]);
  cli_progress_stop();
  replay_prepared_free(prep, snap->ndevices);
  if (status == CLI_OK)
    status = replay_report(snap, cli_display_name(pos[0]), rows, nrows, check, json,
                           sweep != NULL, capacity, capacity_s != NULL, min_cap);
  for (int j = 0; j < nrows; j++) {
    ms_replay_report_free(rows[j].rep);
    free(rows[j].min_capacity);
  }
  free(rows);
  ms_replay_sweep_release(&grid);
  ms_snapshot_free(snap);
  return status;
}
