/* SPDX-License-Identifier: MIT
 * libFuzzer target for the consumers of a hostile but accepted snapshot (issue #16 item 25). The
 * input is a file of any format (memsnap, memsnap-z, pickle, gzip-compressed pickle); when
 * ms_snapshot_load accepts it, everything a command does with a snapshot is done with it:
 *  - the views: memory and segments as folded text and as flame graphs (SVG in memory), compare
 *    against the state at the start of the trace; the HTML viewer page;
 *  - the timeline index: peaks, the state at the first and peak steps, the viewer's data as
 *    JSON, the Perfetto and pprof exports;
 *  - replay: the fidelity check (unlimited and on a small device) and a what-if under another
 *    configuration, and the smallest capacity for short traces;
 *  - the text and JSON commands themselves, through the CLI's own code (the objects of cli/ linked
 * in, with standard output sent to /dev/null): `stats`, `stats --summary`, `stats --json`, `trace`,
 *    `trace --json`, `top`, `explain --no-replay --json`, `timeline --steps` (text and `--json`);
 *  - the answers: explain (without and, for short traces, with its remedies' replays), the
 *    capacity and the OOMs of every device, the annotation ranges;
 *  - the file read with its trace stacks left for later: the classifier, which reads every
 *    allocation's frames from the file again, and its rows at the end.
 * Each answers MS_OK or a described error (the CLI: exit status 0 or 1, never 2 for a file it
 * could read), never a crash, a leak or a hang. Work is bounded by the input (-max_len) and by the
 * replay's limits here.
 *
 * Built and run by scripts/fuzz.sh (make fuzz) with memsnap_viz and the CLI's objects; seeds in
 * tests/fuzz/corpus/fuzz_consumers/.
 * fuzz-flags: -max_len=16384
 * fuzz-link: cli
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../cli/cli.h"
#include "common/internal.h"
#include "fuzz_util.h"
#include "memsnap/attribution.h"
#include "memsnap/explain.h"
#include "memsnap/export.h"
#include "memsnap/replay.h"
#include "memsnap/timeline.h"
#include "memsnap/view.h"
#include "memsnap/views.h"
#include "memsnap/viz.h"

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fz_path[64];

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  /* the commands print to stdout: keep libFuzzer's log readable */
  if (!freopen("/dev/null", "w", stdout)) abort();
  cli_command_table = cli_commands; /* as main() does before dispatching (cmd-help.c) */
  snprintf(fz_path, sizeof fz_path, "/tmp/memsnap-fuzz-consumers-%ld", (long)getpid());
  return 0;
}

/* ---- views ---------------------------------------------------------------------------------- */

typedef struct view_acc_s {
  ms_flame_t *fl;
  ms_sink_t *folded;
  uint64_t sum;
} view_acc_t;

static int view_emit(void *ctx, const char *const *frames, size_t nframes, uint64_t count) {
  view_acc_t *a = ctx;
  FZ_CHECK(nframes >= 1 && frames, "a view emitted an empty stack");
  for (size_t i = 0; i < nframes; i++)
    FZ_CHECK(frames[i] != NULL, "a NULL frame");
  int rc = ms_flame_add(a->fl, frames, nframes, count);
  if (rc == MS_ELIMIT) return rc;
  FZ_CHECK(rc == MS_OK, "flame_add: %d", rc);
  a->sum += count;
  return ms_view_folded_emit(a->folded, frames, nframes, count);
}

static void views(const ms_snapshot_t *s, const ms_snapshot_t *start) {
  for (int k = 0; k < 3; k++) {
    ms_flame_options_t o;
    ms_flame_options_init(&o);
    o.memory = 1;
    fz_buf_t svg = {0}, folded = {0};
    ms_sink_t ssvg = {fz_buf_write, &svg}, sfold = {fz_buf_write, &folded};
    view_acc_t a = {NULL, &sfold, 0};
    FZ_CHECK(ms_flame_create(&o, &a.fl) == MS_OK, "flame_create");
    int rc = k == 2 ? ms_view_compare_emit(start ? start : s, s, view_emit, &a)
                    : ms_view_emit(s, k ? MS_VIEW_SEGMENTS : MS_VIEW_MEMORY, view_emit, &a);
    FZ_CHECK(rc == MS_OK || rc == MS_ELIMIT, "view %d: %d", k, rc);
    if (rc == MS_OK)
      FZ_CHECK(ms_flame_total(a.fl) == a.sum, "view %d: flame total is not the sum", k);
    ms_errbuf_t eb = {{0}};
    rc = ms_flame_write_svg(a.fl, &ssvg, &eb);
    FZ_CHECK(rc == MS_OK, "view %d: write_svg %d %s", k, rc, eb.msg);
    FZ_CHECK(fz_svg_complete(&svg), "view %d: no </svg>", k);
    ms_flame_destroy(a.fl);
    fz_buf_reset(&svg);
    fz_buf_reset(&folded);
  }
  fz_buf_t html = {0};
  ms_sink_t sh = {fz_buf_write, &html};
  ms_viewer_opts_t vo;
  ms_viewer_opts_init(&vo);
  ms_errbuf_t eb = {{0}};
  int rc = ms_viewer_write_html(s, &vo, &sh, &eb);
  FZ_CHECK(rc == MS_OK || ((rc == MS_EINVAL || rc == MS_ELIMIT) && eb.msg[0]), "viewer: %d %s", rc,
           eb.msg);
  fz_buf_reset(&html);
}

/* ---- the timeline and the exports ---------------------------------------------------------- */

/* @return the state at step 0 of the first device with a trace (to compare with), or NULL. */
static ms_snapshot_t *timeline(const ms_snapshot_t *s) {
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_timeline_create(s, NULL, &tl, &eb);
  if (rc != MS_OK) {
    FZ_DESCRIBED(rc, eb);
    return NULL;
  }
  ms_snapshot_t *start = NULL;
  size_t def = 0;
  if (ms_tl_viewer_devices(s, NULL, 0, &def) > 0) {
    for (int seg = 0; seg < 2; seg++) {
      ms_tlv_t v;
      if (ms_tlv_compute(s, def, seg != 0, 8, 0, SIZE_MAX, NULL, &v) != MS_OK) continue;
      fz_buf_t j = {0};
      ms_sink_t sj = {fz_buf_write, &j};
      FZ_CHECK(ms_tlv_write_json(&v, &sj) == MS_OK, "tlv json");
      fz_buf_reset(&j);
      ms_tlv_release(&v);
    }
  }
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    ms_tl_peak_t p;
    FZ_CHECK(ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p) == MS_OK, "peak");
    size_t steps[2] = {0, p.step};
    for (int k = 0; k < 2; k++) {
      ms_snapshot_t *at = NULL;
      FZ_CHECK(ms_timeline_snapshot_at(tl, d, steps[k], NULL, &at) == MS_OK, "snapshot_at");
      if (k == 0 && !start)
        start = at;
      else
        ms_snapshot_free(at);
    }
    fz_buf_t pb = {0};
    ms_sink_t sp = {fz_buf_write, &pb};
    rc = ms_export_pprof_write(tl, d, p.step, &sp, &eb);
    FZ_CHECK(rc == MS_OK, "pprof: %d %s", rc, eb.msg);
    fz_buf_reset(&pb);
  }
  fz_buf_t pf = {0};
  ms_sink_t sf = {fz_buf_write, &pf};
  ms_export_perfetto_opts_t po = {true};
  rc = ms_export_perfetto_write(tl, &po, &sf, &eb);
  FZ_CHECK(rc == MS_OK, "perfetto: %d %s", rc, eb.msg);
  fz_buf_reset(&pf);
  ms_timeline_destroy(tl);
  return start;
}

/* ---- replay --------------------------------------------------------------------------------- */

static void replay(const ms_snapshot_t *s, uint8_t knob) {
  static const char *const configs[] = {"", "expandable_segments:True",
                                        "max_split_size_mb:20,roundup_power2_divisions:4",
                                        "garbage_collection_threshold:0.5"};
  size_t entries = 0;
  for (size_t d = 0; d < s->ndevices; d++)
    entries += s->devices[d].ntrace;
  for (int mode = 0; mode < 3; mode++) {
    ms_replay_options_t o;
    ms_replay_options_init(&o);
    o.whatif = mode == 2;
    o.capacity = mode == 1 ? (size_t)64 << 20 : 0;
    o.config = mode == 2 ? configs[knob % 4] : NULL;
    ms_replay_report_t *rep = NULL;
    ms_errbuf_t eb = {{0}};
    int rc = ms_replay_run(s, &o, &rep, &eb);
    FZ_CHECK(rc == MS_OK, "replay mode %d: %d %s", mode, rc, eb.msg);
    FZ_CHECK(rep->ndevices == s->ndevices, "replay: %zu reports for %zu devices", rep->ndevices,
             s->ndevices);
    ms_replay_report_free(rep);
  }
  if (entries == 0 || entries > 64) return;
  for (size_t d = 0; d < s->ndevices; d++) {
    size_t cap = 0;
    ms_errbuf_t eb = {{0}};
    int rc = ms_replay_min_capacity(s, (int)d, configs[knob % 4], &cap, &eb);
    FZ_CHECK(rc == MS_OK || rc == MS_ENOTFOUND, "min_capacity: %d %s", rc, eb.msg);
  }
}

/* ---- answers: explain, capacity, OOMs, annotation ranges ------------------------------------- */

static void answers(const ms_snapshot_t *s) {
  size_t entries = 0;
  for (size_t d = 0; d < s->ndevices; d++) {
    entries += s->devices[d].ntrace;
    uint64_t cap = 0;
    ms_tl_oom_t o;
    ms_capacity_source src = ms_snapshot_capacity(s, d, &cap, &o);
    FZ_CHECK(src == MS_CAPACITY_UNKNOWN ? cap == 0 : cap > 0, "capacity %d %llu", (int)src,
             (unsigned long long)cap);
    size_t n = ms_snapshot_oom_count(s, d);
    for (size_t k = 0; k < n && k < 4; k++)
      FZ_CHECK(ms_snapshot_oom_at(s, d, k, &o) == MS_OK, "oom %zu of %zu", k, n);
  }
  ms_tl_ranges_t rs;
  FZ_CHECK(ms_tl_ranges_build(s, &rs) == MS_OK, "ranges");
  for (size_t i = 0; i < rs.n; i++)
    FZ_CHECK(!rs.ranges[i].has_end || rs.ranges[i].end_us >= rs.ranges[i].start_us, "range %zu", i);
  ms_tl_ranges_release(&rs);
  for (int replays = 0; replays < 2; replays++) {
    if (replays && entries > 256) break;
    ms_explain_options_t o;
    ms_explain_options_init(&o);
    o.remedies = replays;
    o.min_capacity = entries <= 64;
    o.threads = 1;
    o.series_points = 50;
    ms_explain_t *x = NULL;
    ms_errbuf_t eb = {{0}};
    int rc = ms_explain_run(s, &o, &x, &eb);
    FZ_CHECK(rc == MS_OK || rc == MS_EFORMAT || rc == MS_EINVAL || rc == MS_ELIMIT,
             "explain: %d %s", rc, eb.msg);
    if (rc == MS_OK) {
      FZ_CHECK(x->cached_free_bytes <= x->reserved_bytes && x->allocated_bytes <= x->reserved_bytes,
               "explain: figures");
      FZ_CHECK(x->verdict_text[0] != 0, "explain: no verdict text");
    }
    ms_explain_free(x);
  }
}

/* ---- the stacks left for later ------------------------------------------------------------- */

/* The file at fz_path read with its trace stacks left for later (a pickle read in place), then
 * what reads them: the classifier (which reads every allocation's frames from the file again),
 * its rows by source at the end (which read the stacks of the blocks alive then), and a state.
 * Read a second time by ms_attr_load, which keeps what the classifier needs of those frames as it
 * reads them: its classifier must give every allocation the category the first one gives. */
typedef struct fz_side_s {
  ms_snapshot_t *s;
  ms_timeline_t *tl;
  ms_attr_t *a;
} fz_side_t;

static void deferred_side(bool watched, fz_side_t *x) {
  ms_errbuf_t eb = {{0}};
  unsigned flags = MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS;
  int rc = watched ? ms_attr_load(fz_path, flags, NULL, &x->s, &eb)
                   : ms_snapshot_load_ex(fz_path, flags, &x->s, &eb);
  if (rc != MS_OK) return;
  if (ms_timeline_create(x->s, NULL, &x->tl, &eb) != MS_OK) return;
  rc = ms_attr_create(x->s, x->tl, NULL, &x->a, &eb);
  FZ_CHECK(rc == MS_OK || rc == MS_EFORMAT || rc == MS_EIO || rc == MS_ENOMEM,
           "classifier of a deferred read: %d %s", rc, eb.msg);
}

static void deferred_close(fz_side_t *x) {
  ms_attr_destroy(x->a);
  ms_timeline_destroy(x->tl);
  ms_snapshot_free(x->s);
}

static void deferred(void) {
  fz_side_t x = {0}, y = {0};
  deferred_side(false, &x);
  deferred_side(true, &y);
  FZ_CHECK((x.a != NULL) == (y.a != NULL), "a classifier of one deferred read only");
  for (size_t d = 0; x.a && y.a && d < ms_timeline_ndevices(x.tl); d++)
    for (size_t i = 0; i < ms_timeline_nentries(x.tl, d); i++)
      if (ms_timeline_entry(x.tl, d, i)->action == MS_TRACE_ALLOC)
        FZ_CHECK(ms_attr_entry_category(x.a, d, i) == ms_attr_entry_category(y.a, d, i),
                 "device %zu entry %zu: another category when classified as read", d, i);
  for (size_t d = 0; x.a && d < ms_timeline_ndevices(x.tl); d++) {
    ms_attr_rows_t r = {0};
    int rc = ms_attr_aggregate(x.a, d, ms_timeline_nentries(x.tl, d), NULL, MS_ATTR_BY_SOURCE, &r);
    FZ_CHECK(rc == MS_OK || rc == MS_EIO || rc == MS_EFORMAT || rc == MS_ENOMEM,
             "rows of a deferred read: %d", rc);
    ms_attr_rows_free(&r);
  }
  deferred_close(&x);
  deferred_close(&y);
}

/* ---- the CLI's commands --------------------------------------------------------------------- */

static void cli(const uint8_t *data, size_t size) {
  FILE *fp = fopen(fz_path, "wb");
  if (!fp) return;
  int ok = fwrite(data, 1, size, fp) == size;
  if (fclose(fp) != 0 || !ok) {
    unlink(fz_path);
    return;
  }
  deferred();
  static const char *const cmds[][4] = {{"stats", NULL},
                                        {"stats", "--summary", NULL},
                                        {"stats", "--json", NULL},
                                        {"trace", NULL},
                                        {"trace", "--json", NULL},
                                        {"top", NULL},
                                        {"explain", "--no-replay", "--json", NULL},
                                        {"timeline", "--steps", NULL},
                                        {"timeline", "--steps", "--json", NULL}};
  for (size_t c = 0; c < sizeof cmds / sizeof *cmds; c++) {
    char *argv[6];
    int argc = 0;
    for (; cmds[c][argc]; argc++)
      argv[argc] = (char *)cmds[c][argc];
    argv[argc++] = fz_path;
    argv[argc] = NULL;
    const struct cli_cmd *cmd = cli_find_command(argv[0]);
    FZ_CHECK(cmd != NULL, "no command %s", argv[0]);
    int st = cmd->fn(argc, argv);
    FZ_CHECK(st == CLI_OK || st == CLI_FAILURE, "`%s %s` exited %d", argv[0], argv[1], st);
    fflush(stdout);
    clearerr(stdout);
  }
  unlink(fz_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size == 0) return 0;
  FILE *fp = fz_fopen(fz_in(data, size));
  FZ_CHECK(fp != NULL, "cannot open a memory stream");
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms__snapshot_load_fp(fp, "input", true, 0, &s, &eb);
  fclose(fp);
  if (rc != MS_OK) return 0;
  ms_snapshot_t *start = timeline(s);
  views(s, start);
  ms_snapshot_free(start);
  replay(s, data[size - 1]);
  answers(s);
  cli(data, size);
  ms_snapshot_free(s);
  return 0;
}
