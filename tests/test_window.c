/* SPDX-License-Identifier: MIT
 * Loading for a window of the trace (ms_snapshot_load_window, memsnap/serialize.h; `--range` of
 * the commands, docs/cli.md):
 *  - window: on every PyTorch fixture and many windows, the windowed read is really windowed
 *    (MS_SNAP_TRACE_STACKS_SKIPPED, no read again in full), keeps every entry, and gives the time
 *    index the same series everywhere and the same blocks, stacks included, at every step up to
 *    the window's end; a time window over times out of order is read again in full; memsnap
 *    files are read in full; an unknown window is refused.
 *  - window_cli: every command that takes --range prints byte for byte what it prints with
 *    MEMSNAP_WINDOW=0 (a full read), for each fixture and a table of windows: entries (empty,
 *    single entry, whole trace, open ends, out of bounds), t= (between entries, before every
 *    entry), step= on a copy of a fixture given ProfilerStep annotations (present, N:M, absent:
 *    the error); windowed loads do not go through the snapshot cache.
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/cache.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

static const char *const fixtures[] = {
    "a0kuma_adamw_small",        "cranberrii_ftcourse",       "jogregoire_diffusion_tiny",
    "maphsge_select_n_4dev",     "wedsonlin_cs336_medium_1024_training",
    "yiyi_flexgen_1.3b_legacy_a", "yiyi_flexgen_oom_legacy",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)

static char fx_path[1200];
static const char *fx(const char *name) {
  snprintf(fx_path, sizeof fx_path, "%s/%s.pickle", th_fixture_dir(), name);
  return fx_path;
}
static bool have_fixtures(void) {
  return access(fx(fixtures[0]), R_OK) == 0;
}
#define NEED_FIXTURES()                                                                       \
  do {                                                                                        \
    if (!have_fixtures()) cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir()); \
  } while (0)

static ms_snapshot_t *load(const char *path, unsigned flags, const ms_load_window_t *w) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  int rc = ms_snapshot_load_window(path, flags, w, &s, &eb);
  cr_assert_eq(rc, MS_OK, "%s: %s", path, eb.msg);
  return s;
}

/* Two stacks (of two snapshots) with the same frames. */
static bool same_stack(const ms_snapshot_t *a, uint32_t sa, const ms_snapshot_t *b, uint32_t sb) {
  if ((sa == MS_SNAP_NO_STACK) != (sb == MS_SNAP_NO_STACK)) return false;
  if (sa == MS_SNAP_NO_STACK) return true;
  if (ms_snap_stack_depth(a, sa) != ms_snap_stack_depth(b, sb)) return false;
  for (uint32_t i = 0; i < ms_snap_stack_depth(a, sa); i++) {
    const ms_snap_frame_t *x = ms_snap_stack_frame(a, sa, i), *y = ms_snap_stack_frame(b, sb, i);
    if (x->line != y->line || strcmp(x->name, y->name) || strcmp(x->filename, y->filename))
      return false;
  }
  return true;
}

static ms_timeline_t *index_of(const ms_snapshot_t *s) {
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  return tl;
}

/* The windowed snapshot w against the full one f: same entries (stacks where the window keeps
 * them), same series, same states up to step `end` (inclusive) of every device. */
static void check_window(const char *name, const ms_snapshot_t *f, const ms_snapshot_t *w,
                         uint64_t last) {
  cr_assert(w->present & MS_SNAP_TRACE_STACKS_SKIPPED, "%s: read again in full", name);
  cr_assert_eq(w->ndevices, f->ndevices, "%s", name);
  cr_assert_eq(w->ntrace, f->ntrace, "%s", name);
  size_t kept = 0, after = 0;
  for (size_t d = 0; d < f->ndevices; d++) {
    const ms_snap_device_t *df = &f->devices[d], *dw = &w->devices[d];
    cr_assert_eq(df->ntrace, dw->ntrace, "%s", name);
    for (uint32_t i = 0; i < df->ntrace; i++) {
      const ms_snap_trace_t *a = &f->trace[df->first_trace + i], *b = &w->trace[dw->first_trace + i];
      cr_assert(a->action == b->action && a->addr == b->addr && a->size == b->size &&
                    a->time_us == b->time_us && a->present == b->present,
                "%s: device %zu entry %u", name, d, i);
      if (i <= last)
        cr_assert(same_stack(f, a->stack, w, b->stack), "%s: entry %u's stack", name, i);
      else if (a->action == MS_TRACE_ALLOC && a->stack != MS_SNAP_NO_STACK)
        kept += b->stack != MS_SNAP_NO_STACK, after++;
    }
  }
  /* allocs after the window keep a stack only when its frames list is shared with a place that
   * keeps one (a live block, the segment_alloc the alloc caused): in a long trace, few do */
  if (after >= 1000)
    cr_assert_leq(kept * 4, after, "%s: %zu of %zu allocs after the window kept a stack", name,
                  kept, after);
  ms_timeline_t *tf = index_of(f), *tw = index_of(w);
  for (size_t d = 0; d < ms_timeline_ndevices(tf); d++) {
    size_t n = ms_timeline_nentries(tf, d);
    cr_assert_eq(n, ms_timeline_nentries(tw, d));
    for (int m = 0; m < MS_TL_METRIC_COUNT; m++)
      cr_assert_arr_eq(ms_timeline_series(tf, d, (ms_tl_metric)m),
                       ms_timeline_series(tw, d, (ms_tl_metric)m), (n + 1) * sizeof(uint64_t),
                       "%s: series %d", name, m);
    size_t end = last >= n ? n : (size_t)last + 1;
    ms_tl_state_t sf, sw;
    ms_timeline_state_init(&sf);
    ms_timeline_state_init(&sw);
    cr_assert_eq(ms_timeline_state_at(tf, d, 0, &sf), MS_OK);
    cr_assert_eq(ms_timeline_state_at(tw, d, 0, &sw), MS_OK);
    /* walked forwards; compared at every step of short traces, at steps 0, end and every 61st of
     * long ones */
    for (size_t step = 0;; step++) {
      if (n <= 400 || step % 61 == 0 || step == end) {
        cr_assert_eq(sf.nblocks, sw.nblocks, "%s: step %zu", name, step);
        cr_assert_eq(sf.nsegments, sw.nsegments, "%s: step %zu", name, step);
        for (size_t k = 0; k < sf.nblocks; k++) {
          const ms_tl_block_t *x = &sf.blocks[k], *y = &sw.blocks[k];
          cr_assert(x->address == y->address && x->size == y->size &&
                        x->alloc_entry == y->alloc_entry && x->free_entry == y->free_entry &&
                        x->time_us == y->time_us && x->state == y->state,
                    "%s: device %zu step %zu block %zu", name, d, step, k);
          cr_assert(same_stack(f, x->stack, w, y->stack), "%s: step %zu block %zu's stack", name,
                    step, k);
        }
        for (size_t k = 0; k < sf.nsegments; k++)
          cr_assert(sf.segments[k].address == sw.segments[k].address &&
                        same_stack(f, sf.segments[k].stack, w, sw.segments[k].stack),
                    "%s: step %zu segment %zu", name, step, k);
      }
      if (step == end) break;
      cr_assert_eq(ms_timeline_state_advance(tf, &sf), MS_OK);
      cr_assert_eq(ms_timeline_state_advance(tw, &sw), MS_OK);
    }
    ms_timeline_state_release(&sf);
    ms_timeline_state_release(&sw);
  }
  ms_timeline_destroy(tf);
  ms_timeline_destroy(tw);
}

TestSuite(window, .timeout = 300);

Test(window, entry_windows_match_the_full_read) {
  NEED_FIXTURES();
  for (size_t i = 0; i < NFIX; i++) {
    const char *path = fx(fixtures[i]);
    for (int flags = 0; flags < 2; flags++) {
      unsigned lf = flags ? MS_LOAD_NO_FREE_STACKS : 0;
      ms_snapshot_t *f = load(path, lf, NULL);
      size_t n = f->ndevices ? f->devices[0].ntrace : 0;
      uint64_t lasts[] = {0, 7, n / 3, n ? n - 1 : 0, UINT64_MAX - 1};
      for (size_t k = 0; k < sizeof lasts / sizeof *lasts; k++) {
        ms_load_window_t win = {MS_LOAD_WINDOW_ENTRIES, lasts[k], 0};
        ms_snapshot_t *w = load(path, lf, &win);
        char name[300];
        snprintf(name, sizeof name, "%s (flags %u, last %" PRIu64 ")", fixtures[i], lf, lasts[k]);
        check_window(name, f, w, lasts[k]);
        ms_snapshot_free(w);
      }
      ms_snapshot_free(f);
    }
  }
}

/* The index of the first entry of device 0 whose time is past t (n when none). */
static uint64_t first_past(const ms_snapshot_t *s, int64_t t) {
  const ms_snap_device_t *d = &s->devices[0];
  for (uint32_t i = 0; i < d->ntrace; i++)
    if ((s->trace[d->first_trace + i].present & MS_TRACE_HAS_TIME) &&
        s->trace[d->first_trace + i].time_us > t)
      return i;
  return d->ntrace;
}

Test(window, time_windows_match_the_full_read) {
  NEED_FIXTURES();
  const char *timed[] = {"a0kuma_adamw_small", "wedsonlin_cs336_medium_1024_training",
                         "jogregoire_diffusion_tiny"};
  for (size_t i = 0; i < 3; i++) {
    const char *path = fx(timed[i]);
    ms_snapshot_t *f = load(path, MS_LOAD_NO_FREE_STACKS, NULL);
    const ms_snap_trace_t *t = f->trace + f->devices[0].first_trace;
    size_t n = f->devices[0].ntrace;
    int64_t ends[] = {INT64_MIN, t[0].time_us - 1, t[0].time_us, t[n / 2].time_us + 1,
                      t[n - 1].time_us, INT64_MAX - 1};
    for (size_t k = 0; k < sizeof ends / sizeof *ends; k++) {
      ms_load_window_t win = {MS_LOAD_WINDOW_TIMES, 0, ends[k]};
      ms_snapshot_t *w = load(path, MS_LOAD_NO_FREE_STACKS, &win);
      uint64_t past = first_past(f, ends[k]);
      char name[300];
      snprintf(name, sizeof name, "%s (t <= %" PRId64 ")", timed[i], ends[k]);
      check_window(name, f, w, past ? past - 1 : 0);
      ms_snapshot_free(w);
    }
    ms_snapshot_free(f);
  }
}

/* A copy of a fixture whose entries' times are out of order past t: read again in full. */
Test(window, time_window_over_unsorted_times_reads_in_full) {
  NEED_FIXTURES();
  ms_snapshot_t *f = load(fx("a0kuma_adamw_small"), 0, NULL);
  ms_snap_trace_t *t = f->trace + f->devices[0].first_trace;
  size_t n = f->devices[0].ntrace;
  cr_assert_gt(n, 20);
  int64_t t10 = t[10].time_us, t5 = t[5].time_us;
  t[12].time_us = t5; /* after entry 10, an earlier time again */
  th_workdir_setup();
  char path[400], why[512];
  snprintf(path, sizeof path, "%s/unsorted.pickle", th_workdir);
  cr_assert_eq(th_write_snapshot(f, NULL, path, why, sizeof why), 0, "%s", why);
  ms_snapshot_t *full = load(path, 0, NULL);
  ms_load_window_t win = {MS_LOAD_WINDOW_TIMES, 0, t10 - 1};
  ms_snapshot_t *w = load(path, 0, &win);
  cr_assert_not(w->present & MS_SNAP_TRACE_STACKS_SKIPPED, "read again in full");
  TH_ASSERT_SNAP_EQ(full, w);
  /* a window ending before both: times past its end only, windowed */
  ms_load_window_t early = {MS_LOAD_WINDOW_TIMES, 0, t[0].time_us};
  ms_snapshot_t *e = load(path, 0, &early);
  cr_assert(e->present & MS_SNAP_TRACE_STACKS_SKIPPED);
  ms_snapshot_free(e);
  ms_snapshot_free(w);
  ms_snapshot_free(full);
  ms_snapshot_free(f);
  th_workdir_teardown();
}

Test(window, memsnap_files_are_read_in_full) {
  NEED_FIXTURES();
  ms_snapshot_t *f = load(fx("a0kuma_adamw_small"), 0, NULL);
  th_workdir_setup();
  char why[512], path[400];
  cr_assert_eq(th_write_snapshot(f, th_workdir, "a.memsnap", why, sizeof why), 0, "%s", why);
  snprintf(path, sizeof path, "%s/a.memsnap", th_workdir);
  ms_load_window_t win = {MS_LOAD_WINDOW_ENTRIES, 3, 0};
  ms_snapshot_t *a = load(path, 0, NULL), *b = load(path, 0, &win);
  TH_ASSERT_SNAP_EQ(a, b);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  ms_snapshot_free(f);
  th_workdir_teardown();
}

Test(window, refusals) {
  NEED_FIXTURES();
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  ms_load_window_t bad = {(ms_load_window_kind)7, 0, 0};
  cr_assert_eq(ms_snapshot_load_window(fx(fixtures[0]), 0, &bad, &s, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "unknown load window kind 7");
  ms_load_window_t ok = {MS_LOAD_WINDOW_ENTRIES, 3, 0};
  cr_assert_eq(ms_snapshot_load_window(fx(fixtures[0]), 0x100, &ok, &s, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "unknown load flags 0x100");
  cr_assert_null(s);
  /* without the trace, the window changes nothing */
  s = load(fx(fixtures[0]), MS_LOAD_NO_TRACE, &ok);
  cr_assert(s->present & MS_SNAP_TRACE_SKIPPED);
  cr_assert_not(s->present & MS_SNAP_TRACE_STACKS_SKIPPED);
  ms_snapshot_free(s);
}

/* ---- the commands ------------------------------------------------------------------------- */

TestSuite(window_cli, .init = th_workdir_setup, .fini = th_workdir_teardown, .timeout = 900);

/* Runs args with and without windowed loading; asserts the same status, stdout and stderr. */
static void same_both_ways(const char *const *args, const char *what) {
  static const char *const off[] = {"MEMSNAP_WINDOW=0", "MEMSNAP_CACHE=0", NULL};
  static const char *const on[] = {"MEMSNAP_CACHE=0", NULL};
  th_run_t a = th_run(th_workdir, NULL, off, args), b = th_run(th_workdir, NULL, on, args);
  cr_assert_eq(a.status, b.status, "%s: status %d != %d: %s", what, a.status, b.status, b.err);
  cr_assert(a.out_len == b.out_len && memcmp(a.out, b.out, a.out_len) == 0, "%s: stdout differs",
            what);
  cr_assert_str_eq(a.err, b.err, "%s: stderr", what);
  th_run_free(&a);
  th_run_free(&b);
}

/* The commands that take --range, each as it is run on FILE WINDOW. */
static const char *const commands[][7] = {
    {"timeline", NULL},
    {"timeline", "--json", NULL},
    {"timeline", "--steps", NULL},
    {"timeline", "--viewer-data", NULL},
    {"timeline", "--viewer-data", "--segments", NULL},
    {"top", NULL},
    {"top", "--at", "peak-reserved", "--by", "size", NULL},
    {"top", "--by", "frame", "--json", NULL},
    {"timeline", "--by", "category", NULL},
    {"memory", "--by", "category", "--folded", NULL},
    {"stats", NULL},
    {"stats", "--json", "--at", "peak", NULL},
    {"memory", "--folded", NULL},
    {"segments", "--folded", "--at", "end", NULL},
    {"trace", NULL},
    {"trace", "--json", NULL},
};
#define NCMD (sizeof commands / sizeof *commands)

/* Every command on path with window (the value of --range) both ways. */
static void all_commands(const char *path, const char *label, const char *window) {
  for (size_t c = 0; c < NCMD; c++) {
    const char *args[14];
    size_t n = 0;
    args[n++] = commands[c][0];
    args[n++] = path;
    for (size_t k = 1; k < 7 && commands[c][k]; k++)
      args[n++] = commands[c][k];
    args[n++] = "--range";
    args[n++] = window;
    args[n] = NULL;
    char what[400];
    snprintf(what, sizeof what, "%s %s --range %s", commands[c][0], label, window);
    same_both_ways(args, what);
  }
}

Test(window_cli, entry_and_time_windows_print_what_a_full_read_prints) {
  NEED_FIXTURES();
  for (size_t i = 0; i < NFIX; i++) {
    const char *path = fx(fixtures[i]);
    ms_snapshot_t *s = load(path, 0, NULL);
    size_t n = s->ndevices ? s->devices[0].ntrace : 0;
    char w[16][64];
    size_t nw = 0;
    snprintf(w[nw++], 64, "0:0");
    snprintf(w[nw++], 64, "1:1");
    snprintf(w[nw++], 64, "0:%zu", n / 3);
    snprintf(w[nw++], 64, "%zu:%zu", n / 4, n / 2);
    snprintf(w[nw++], 64, ":%zu", n / 2);
    if (n < 1000) snprintf(w[nw++], 64, "%zu:", n / 2); /* an open end: read in full both ways */
    snprintf(w[nw++], 64, "0:%zu", n ? n - 1 : 0);
    snprintf(w[nw++], 64, "0:%zu", n + 100);
    snprintf(w[nw++], 64, "%zu:%zu", n + 5, n + 9); /* out of bounds: the error */
    const ms_snap_trace_t *t = n ? s->trace + s->devices[0].first_trace : NULL;
    if (t && (t[0].present & MS_TRACE_HAS_TIME)) {
      snprintf(w[nw++], 64, "t=0:1");
      snprintf(w[nw++], 64, "t=%" PRId64 ":%" PRId64, t[n / 4].time_us + 1,
               t[n / 2].time_us - 1); /* between entries */
      snprintf(w[nw++], 64, "t=:%" PRId64, t[n / 3].time_us);
    } else {
      snprintf(w[nw++], 64, "t=0:100"); /* no times: the error */
    }
    ms_snapshot_free(s);
    for (size_t k = 0; k < nw; k++)
      all_commands(path, fixtures[i], w[k]);
  }
}

/* A copy of the wedsonlin fixture with ProfilerStep#0..2 annotations over its trace. */
static const char *stepped_copy(void) {
  static char path[400];
  ms_snapshot_t *s = load(fx("wedsonlin_cs336_medium_1024_training"), 0, NULL);
  const ms_snap_trace_t *t = s->trace + s->devices[0].first_trace;
  size_t n = s->devices[0].ntrace;
  ms_snap_annotation_t an[6];
  const char *names[3] = {"ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#2"};
  for (int k = 0; k < 3; k++) {
    an[2 * k] = (ms_snap_annotation_t){names[k], "START", 0, t[n * (size_t)k / 4].time_us};
    an[2 * k + 1] = (ms_snap_annotation_t){names[k], "END", 0, t[n * (size_t)(k + 1) / 4].time_us - 1};
  }
  ms_snap_annotation_t *saved = s->annotations;
  size_t nsaved = s->nannotations;
  uint32_t present = s->present;
  s->annotations = an;
  s->nannotations = 6;
  s->present |= MS_SNAP_HAS_ANNOTATIONS;
  char why[512];
  snprintf(path, sizeof path, "%s/stepped.pickle", th_workdir);
  cr_assert_eq(th_write_snapshot(s, NULL, path, why, sizeof why), 0, "%s", why);
  s->annotations = saved;
  s->nannotations = nsaved;
  s->present = present;
  ms_snapshot_free(s);
  return path;
}

Test(window_cli, step_windows_print_what_a_full_read_prints) {
  NEED_FIXTURES();
  const char *path = stepped_copy();
  const char *windows[] = {"step=0", "step=1", "step=2", "step=0:1", "step=1:2", "step=5",
                           "step=1:7"};
  for (size_t k = 0; k < sizeof windows / sizeof *windows; k++)
    all_commands(path, "stepped", windows[k]);
  /* the absent step's error, exactly */
  th_run_t r = TH_RUN("top", path, "--range", "step=5");
  cr_assert_eq(r.status, 1);
  char want[1600];
  snprintf(want, sizeof want,
           "memsnap: error: '%s': --range step=5: no step 5: the snapshot has no ProfilerStep#5 "
           "annotation (record_function ranges are recorded while the profiler runs)\n",
           path);
  cr_assert_str_eq(r.err, want);
  cr_assert_str_empty(r.out);
  th_run_free(&r);
}

Test(window_cli, errors_and_usage) {
  NEED_FIXTURES();
  const char *p = fx("a0kuma_adamw_small");
  th_run_t r = TH_RUN("timeline", p, "--range", "40:50");
  cr_assert_eq(r.status, 1);
  char want[1600];
  snprintf(want, sizeof want,
           "memsnap: error: '%s': --range starts at entry 40, past the 35 entries of device 0\n", p);
  cr_assert_str_eq(r.err, want);
  th_run_free(&r);
  r = TH_RUN("top", fx("cranberrii_ftcourse"), "--range", "t=0:5");
  cr_assert_eq(r.status, 1);
  snprintf(want, sizeof want,
           "memsnap: error: '%s': --range t=0:5: the trace of device 0 has no times\n",
           fx("cranberrii_ftcourse"));
  cr_assert_str_eq(r.err, want);
  th_run_free(&r);
  struct {
    const char *range, *msg;
  } usage[] = {
      {"t=5:2", "option '--range' needs t=T0:T1 with times T0 <= T1 (time_us), not 't=5:2'"},
      {"t=x:2", "option '--range' needs t=T0:T1 with times T0 <= T1 (time_us), not 't=x:2'"},
      {"step=3:1", "option '--range' needs A:B, t=T0:T1 or step=N[:M] (N <= M), not 'step=3:1'"},
      {"step=-1", "option '--range' needs A:B, t=T0:T1 or step=N[:M] (N <= M), not 'step=-1'"},
      {"step=2:", "option '--range' needs A:B, t=T0:T1 or step=N[:M] (N <= M), not 'step=2:'"},
      {"5:2", "option '--range' needs A:B with entry indices A <= B, not '5:2'"},
  };
  for (size_t i = 0; i < sizeof usage / sizeof *usage; i++) {
    r = TH_RUN("top", p, "--range", usage[i].range);
    cr_assert_eq(r.status, 2, "%s", usage[i].range);
    snprintf(want, sizeof want, "memsnap: error: %s\nRun 'memsnap top --help' for usage.\n",
             usage[i].msg);
    cr_assert_str_eq(r.err, want, "%s", usage[i].range);
    th_run_free(&r);
  }
}

Test(window_cli, windowed_loads_skip_the_cache) {
  NEED_FIXTURES();
  char cache[400], env[440], dir[460];
  snprintf(cache, sizeof cache, "%s/cache", th_workdir);
  snprintf(env, sizeof env, "XDG_CACHE_HOME=%s", cache);
  snprintf(dir, sizeof dir, "%s/memsnap", cache);
  const char *const envs[] = {env, "MEMSNAP_CACHE=1", NULL};
  const char *p = fx("a0kuma_adamw_small");
  struct {
    const char *args[8];
    bool stores;
  } runs[] = {
      {{"top", p, "--by", "size", "--range", "0:9", NULL}, false},
      {{"trace", p, "--range", "2:5", NULL}, false},
      {{"timeline", p, "--range", "t=0:1777365830500000", NULL}, false},
      /* categories need every stack: read in full, through the cache */
      {{"top", p, "--range", "0:9", NULL}, true},
      /* an open end: the whole trace, through the cache */
      {{"trace", p, "--range", "3:", NULL}, true},
  };
  int before = 0;
  for (size_t i = 0; i < sizeof runs / sizeof *runs; i++) {
    th_run_t r = th_run(th_workdir, NULL, envs, runs[i].args);
    cr_assert_eq(r.status, 0, "run %zu: %s", i, r.err);
    /* the entries (a hash memo, 96 bytes of the file's identity, is none) */
    size_t entries = 0;
    uint64_t bytes = 0;
    cr_assert_eq(ms_cache_usage(dir, &entries, &bytes), MS_OK);
    int now = (int)entries;
    if (runs[i].stores)
      cr_assert_gt(now, before, "run %zu stored nothing", i);
    else
      cr_assert_eq(now, before, "run %zu stored a cache entry", i);
    before = now;
    th_run_free(&r);
  }
}
