/* SPDX-License-Identifier: MIT
 * bench_timeline: the time index (issue #12 §6).
 *
 *  - timeline_index_events_per_s: trace entries indexed per second by ms_timeline_create on a
 *    synthetic trace of 4.5 M entries (median of 3; target >= 5 M). The trace is generated here:
 *    64 segments of 64 MiB carved into 1 MiB slots, a steady state of ~3,000 live blocks of
 *    1 B..1 MiB with alloc / free_requested / free_completed cycles, and 8 segment_free /
 *    segment_alloc pairs on empty segments, consistent by construction.
 *  - timeline_at_ms: milliseconds to materialise the state at a random step as a snapshot
 *    (ms_timeline_snapshot_at, what `--at` does), after the index is built (median of 200;
 *    target <= 20).
 *  - timeline_index_bytes_per_entry: the index's resident growth per trace entry (RSS delta).
 *  - timeline_ooms_all_ms: milliseconds for every `oom` entry with the reserved bytes at each
 *    (ms_snapshot_ooms, what `memsnap timeline` lists) on the same kind of trace, 1 M entries with
 *    an `oom` entry after every 100th (a run that retried after each OOM: about 10,000 of them;
 *    median of 3), and its baseline timeline_oom_at_ms, one of them alone (ms_snapshot_oom_at,
 *    the middle one: what the listing cost for each of them before ms_snapshot_ooms).
 *  - timeline_steps_all_ms: milliseconds for every step's entries (ms_tl_ranges_build, then for
 *    each ProfilerStep#N range ms_tl_ranges_step and ms_timeline_step_range: what `timeline
 *    --steps` and compare's leak suspects ask) on a 1 M-entry trace with 1,000 steps of 1,000
 *    annotated ops each (2 M markers; median of 3), and its baseline timeline_ranges_build_ms,
 *    the pairing of the markers alone (before the step index, each step was a scan of the 1 M
 *    ranges).
 *  - timeline_index_4dev_ms: milliseconds for ms_timeline_create on a snapshot of 4 devices of
 *    1.2 M entries each (the same kind of trace, drawn per device; median of 3): the devices are
 *    indexed on threads of their own, one per CPU at most; its baseline
 *    timeline_index_4dev_1thread_ms, the same index built on one thread.
 *  - timeline_json_largest_fixture_s: `memsnap timeline FILE --viewer-data > /dev/null` (PyTorch's
 *    viewer's data, which `--json` printed when the metric was named) on the largest shared
 *    fixture, whole process (median of 5; target <= 0.2).
 *  - timeline_report_json_largest_fixture_s: `memsnap timeline FILE --json` (the text's content:
 *    peaks and the stacks alive then, OOMs, final state) likewise, and
 *    timeline_text_largest_fixture_s, the text itself, its baseline (the same report).
 *    Without the fixtures it prints a SKIP line on stderr and neither metric.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"
#include "timeline/internal.h"
#include "bench_util.h"

#define NSEG 64
#define SEG_SIZE ((uint64_t)64 << 20)
#define SLOT ((uint64_t)1 << 20)
#define SLOTS_PER_SEG (SEG_SIZE / SLOT)
#define NSLOTS (NSEG * SLOTS_PER_SEG)
#define BASE 0x7f0000000000ull

static long rss_kb(void) {
  FILE *f = fopen("/proc/self/statm", "r");
  long pages = 0, res = 0;
  if (!f) return 0;
  if (fscanf(f, "%ld %ld", &pages, &res) != 2) res = 0;
  fclose(f);
  return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static uint64_t rng = 88172645463325252ull;
static uint64_t next(void) {
  rng ^= rng << 13;
  rng ^= rng >> 7;
  rng ^= rng << 17;
  return rng;
}

static int add_entry(ms__snapbuild_t *b, ms_trace_action a, uint64_t addr, uint64_t size,
                     int64_t t) {
  ms_snap_trace_t e;
  memset(&e, 0, sizeof e);
  e.action = (uint8_t)a;
  e.addr = addr;
  e.size = size;
  e.time_us = t;
  e.stack = MS_SNAP_NO_STACK;
  e.present = MS_TRACE_HAS_TIME;
  return ms__snapbuild_add_trace(b, &e);
}

/* nsteps ProfilerStep#N ranges over the times [t0, t1), each holding OPS_PER_STEP operator ranges
 * one after the other (what record_function leaves when every op is annotated). */
enum { OPS_PER_STEP = 1000 };
static int add_steps(ms__snapbuild_t *b, size_t nsteps, int64_t t0, int64_t t1) {
  static const char *ops[] = {"aten::mm", "aten::add", "aten::relu", "aten::empty"};
  int64_t span = (t1 - t0) / (int64_t)nsteps, op = span / (OPS_PER_STEP + 1);
  for (size_t k = 0; k < nsteps; k++) {
    char name[64];
    int len = snprintf(name, sizeof name, "ProfilerStep#%zu", k);
    ms_snap_annotation_t a = {NULL, "START", 0, t0 + (int64_t)k * span};
    if (ms__snapbuild_str(b, name, (size_t)len, &a.name) || ms__snapbuild_add_annotation(b, &a))
      return 1;
    for (size_t j = 0; j < OPS_PER_STEP; j++) {
      ms_snap_annotation_t o = {ops[j % 4], "START", 0, a.time_us + 1 + (int64_t)j * op};
      if (ms__snapbuild_add_annotation(b, &o)) return 1;
      o.stage = "END";
      o.time_us += op - 1;
      if (ms__snapbuild_add_annotation(b, &o)) return 1;
    }
    a.stage = "END";
    a.time_us += span - 1;
    if (ms__snapbuild_add_annotation(b, &a)) return 1;
  }
  return 0;
}

/* The synthetic snapshot: a consistent trace of about `target` entries and its end state; with
 * oom_every > 0, an `oom` entry after every oom_every-th entry (an event: the state is the same);
 * with nsteps > 0, that many steps annotated over the trace (add_steps).
 */
static int synth_dev(ms__snapbuild_t *bp, size_t target, size_t oom_every, size_t nsteps,
                     int64_t dev) {
  uint64_t *req = calloc(NSLOTS, sizeof *req); /* 0 = free slot */
  int *live_in_seg = calloc(NSEG, sizeof *live_in_seg);
  bool *mapped = calloc(NSEG, sizeof *mapped);
  if (!req || !live_in_seg || !mapped) return -1;
  int64_t t = 1700000000000000, dt = nsteps ? 1000 : 1; /* µs an entry */
  size_t n = 0;
  for (int s = 0; s < NSEG; s++, n++) {
    mapped[s] = true;
    if (add_entry(bp, MS_TRACE_SEGMENT_ALLOC, BASE + s * SEG_SIZE, SEG_SIZE, (t += dt) - dt))
      return -1;
  }
  size_t live = 0;
  while (n < target) {
    if (oom_every && n % oom_every == oom_every - 1) {
      if (add_entry(bp, MS_TRACE_OOM, next() % SEG_SIZE, 1 + next() % SEG_SIZE, (t += dt) - dt))
        return -1;
      n++;
      continue;
    }
    uint64_t r = next();
    size_t slot = (size_t)(r % NSLOTS);
    int seg = (int)(slot / SLOTS_PER_SEG);
    uint64_t addr = BASE + slot * SLOT;
    if (!mapped[seg]) {
      mapped[seg] = true;
      if (add_entry(bp, MS_TRACE_SEGMENT_ALLOC, BASE + seg * SEG_SIZE, SEG_SIZE, (t += dt) - dt))
        return -1;
      n++;
    }
    bool want_alloc = live < 3000 ? (r >> 60) < 12 : (r >> 60) < 4;
    if (!req[slot] && want_alloc) {
      req[slot] = 1 + (next() % SLOT);
      live++;
      live_in_seg[seg]++;
      if (add_entry(bp, MS_TRACE_ALLOC, addr, req[slot], (t += dt) - dt)) return -1;
      n++;
    } else if (req[slot]) {
      if (add_entry(bp, MS_TRACE_FREE_REQUESTED, addr, req[slot], (t += dt) - dt) ||
          add_entry(bp, MS_TRACE_FREE_COMPLETED, addr, req[slot], (t += dt) - dt))
        return -1;
      n += 2;
      req[slot] = 0;
      live--;
      if (--live_in_seg[seg] == 0 && (r & 0xffff) < 40) { /* an empty segment released */
        mapped[seg] = false;
        if (add_entry(bp, MS_TRACE_SEGMENT_FREE, BASE + seg * SEG_SIZE, SEG_SIZE, (t += dt) - dt))
          return -1;
        n++;
      }
    }
  }
  if (nsteps && add_steps(bp, nsteps, 1700000000000000, t)) return -1;
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = (uint32_t)n;
  d.first_trace = (uint32_t)(bp->trace.len - n); /* after the devices before */
  if (ms__snapbuild_add_device(bp, &d)) return -1;
  for (int s = 0; s < NSEG; s++) {
    if (!mapped[s]) continue;
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.address = BASE + s * SEG_SIZE;
    g.total_size = SEG_SIZE;
    g.is_large = true;
    g.device = dev;
    g.stack = MS_SNAP_NO_STACK;
    g.first_block = (uint32_t)bp->blocks.len;
    uint64_t at = g.address;
    for (size_t k = 0; k < SLOTS_PER_SEG; k++) {
      size_t slot = s * SLOTS_PER_SEG + k;
      if (!req[slot]) continue;
      uint64_t addr = BASE + slot * SLOT, size = (req[slot] + 511) & ~511ull;
      ms_snap_block_t bl;
      memset(&bl, 0, sizeof bl);
      bl.stack = MS_SNAP_NO_STACK;
      bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
      if (addr > at) {
        bl.address = at;
        bl.size = addr - at;
        bl.state_name = "inactive";
        if (ms__snapbuild_add_block(bp, &bl)) return -1;
      }
      bl.address = addr;
      bl.size = size;
      bl.requested_size = req[slot];
      bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
      bl.state_name = "active_allocated";
      if (ms__snapbuild_add_block(bp, &bl)) return -1;
      at = addr + size;
    }
    if (at < g.address + g.total_size) {
      ms_snap_block_t bl;
      memset(&bl, 0, sizeof bl);
      bl.stack = MS_SNAP_NO_STACK;
      bl.address = at;
      bl.size = g.address + g.total_size - at;
      bl.state_name = "inactive";
      bl.present = MS_BLOCK_HAS_ADDRESS;
      if (ms__snapbuild_add_block(bp, &bl)) return -1;
    }
    g.nblocks = (uint32_t)(bp->blocks.len - g.first_block);
    if (ms__snapbuild_add_segment(bp, &g)) return -1;
  }
  free(req);
  free(live_in_seg);
  free(mapped);
  return 0;
}

/* synth's trace on each of ndev devices (their own draws of the same shape). */
static ms_snapshot_t *synth_devices(size_t target, size_t oom_every, size_t nsteps, size_t ndev) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  for (size_t d = 0; d < ndev; d++)
    if (synth_dev(&b, target, oom_every, nsteps, (int64_t)d)) return NULL;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms__snapbuild_finish(&b, &s, &eb) != MS_OK) {
    fprintf(stderr, "bench_timeline: %s\n", eb.msg);
    return NULL;
  }
  return s;
}

/* Seconds of `memsnap timeline PATH [FLAG] > /dev/null`, or -1 when it failed. */
static double run_json(const char *bin, const char *path, const char *flag) {
  bench_child_t r; /* flag NULL: the arguments end at path */
  if (bench_try_run((const char *const[]){bin, "timeline", path, flag, NULL}, &r) != 0) return -1;
  return r.wall;
}

/* timeline_ooms_all_ms and its baseline timeline_oom_at_ms. */
static int bench_ooms(void) {
  ms_snapshot_t *s = synth_devices(1000000, 100, 0, 1);
  if (!s) {
    fprintf(stderr, "bench_timeline: cannot generate the trace with oom entries\n");
    return 1;
  }
  size_t noom = ms_snapshot_oom_count(s, 0);
  double all[3], one[3];
  for (int i = 0; i < 3; i++) {
    ms_tl_ooms_t o;
    double t0 = now_s();
    if (ms_snapshot_ooms(s, 0, &o) != MS_OK || o.n != noom) return 1;
    all[i] = (now_s() - t0) * 1e3;
    ms_tl_ooms_release(&o);
    ms_tl_oom_t x;
    t0 = now_s();
    if (ms_snapshot_oom_at(s, 0, noom / 2, &x) != MS_OK) return 1;
    one[i] = (now_s() - t0) * 1e3;
  }
  qsort(all, 3, sizeof *all, cmp_double);
  qsort(one, 3, sizeof *one, cmp_double);
  printf("timeline_ooms_all_ms %.3f\n", all[1]);
  printf("timeline_oom_at_ms %.3f\n", one[1]);
  fprintf(stderr,
          "bench_timeline: %zu oom entries in %u: all at once %.2f ms; one alone %.2f ms (all "
          "one at a time: about %.1f s)\n",
          noom, s->devices[0].ntrace, all[1], one[1], one[1] * (double)noom / 1e3);
  ms_snapshot_free(s);
  return 0;
}

/* timeline_steps_all_ms and its baseline timeline_ranges_build_ms. */
static int bench_steps(void) {
  enum { NSTEPS = 1000 };
  ms_snapshot_t *s = synth_devices(1000000, 0, NSTEPS, 1);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  if (!s || ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) {
    fprintf(stderr, "bench_timeline: the annotated trace: %s\n", eb.msg);
    return 1;
  }
  double all[3], build[3];
  for (int i = 0; i < 3; i++) {
    ms_tl_ranges_t rs;
    double t0 = now_s();
    if (ms_tl_ranges_build(s, &rs) != MS_OK || rs.n != NSTEPS * (OPS_PER_STEP + 1)) return 1;
    build[i] = (now_s() - t0) * 1e3;
    size_t steps = 0; /* what `timeline --steps` asks: each step's range and its entries */
    for (size_t k = 0; k < rs.n; k++) {
      const ms_tl_range_t *x = &rs.ranges[k];
      size_t lo, hi;
      if (x->step < 0 || ms_tl_ranges_step(&rs, 0, x->step) != x) continue;
      if (ms_timeline_step_range(tl, 0, x->step, &lo, &hi, &eb) != MS_OK) return 1;
      steps++;
    }
    all[i] = (now_s() - t0) * 1e3;
    ms_tl_ranges_release(&rs);
    if (steps != NSTEPS) return 1;
  }
  qsort(all, 3, sizeof *all, cmp_double);
  qsort(build, 3, sizeof *build, cmp_double);
  printf("timeline_steps_all_ms %.3f\n", all[1]);
  printf("timeline_ranges_build_ms %.3f\n", build[1]);
  fprintf(stderr,
          "bench_timeline: %d steps of %d annotated ops each (%zu markers): every step's "
          "entries %.2f ms, of which pairing the markers %.2f ms\n",
          NSTEPS, OPS_PER_STEP, s->nannotations, all[1], build[1]);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  return 0;
}

/* timeline_index_4dev_ms and its baseline timeline_index_4dev_1thread_ms. */
static int bench_devices(void) {
  enum { NDEV = 4 };
  ms_snapshot_t *s = synth_devices(1200000, 0, 0, NDEV);
  if (!s) return 1;
  double ms[2][3];
  for (int i = 0; i < 3; i++)
    for (int k = 0; k < 2; k++) { /* k = 0: one thread; 1: ms_timeline_create's threads */
      ms_timeline_t *tl = NULL;
      ms_errbuf_t eb = {{0}};
      double t0 = now_s();
      int rc = ms__tl_alloc(s, NULL, &tl, &eb);
      if (rc == MS_OK) rc = ms__tl_build(tl, k ? 0 : 1, 0, &eb);
      ms[k][i] = (now_s() - t0) * 1e3;
      ms_timeline_destroy(tl);
      if (rc != MS_OK) {
        fprintf(stderr, "bench_timeline: %s\n", eb.msg);
        return 1;
      }
    }
  qsort(ms[0], 3, sizeof ms[0][0], cmp_double);
  qsort(ms[1], 3, sizeof ms[1][0], cmp_double);
  printf("timeline_index_4dev_ms %.1f\n", ms[1][1]);
  printf("timeline_index_4dev_1thread_ms %.1f\n", ms[0][1]);
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  fprintf(stderr,
          "bench_timeline: %d devices of %zu entries: index on %ld CPUs %.1f ms, on one thread "
          "%.1f ms\n",
          NDEV, s->ntrace / NDEV, ncpu, ms[1][1], ms[0][1]);
  ms_snapshot_free(s);
  return 0;
}

int main(void) {
  ms_snapshot_t *s = synth_devices(4500000, 0, 0, 1);
  if (!s) {
    fprintf(stderr, "bench_timeline: cannot generate the trace\n");
    return 1;
  }
  size_t n = s->devices[0].ntrace;
  fprintf(stderr, "bench_timeline: synthetic trace of %zu entries\n", n);
  double rate[3];
  ms_timeline_t *tl = NULL;
  long rss0 = 0, rss1 = 0;
  for (int i = 0; i < 3; i++) {
    ms_timeline_destroy(tl);
    tl = NULL;
    rss0 = rss_kb();
    ms_errbuf_t eb = {{0}};
    double t0 = now_s();
    if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) {
      fprintf(stderr, "bench_timeline: %s\n", eb.msg);
      return 1;
    }
    rate[i] = (double)n / (now_s() - t0);
    rss1 = rss_kb();
  }
  qsort(rate, 3, sizeof *rate, cmp_double);
  printf("timeline_index_events_per_s %.0f\n", rate[1]);
  printf("timeline_index_bytes_per_entry %.1f\n", (double)(rss1 - rss0) * 1024.0 / (double)n);
  enum { AT = 200 };
  double at[AT];
  for (int i = 0; i < AT; i++) {
    size_t step = (size_t)(next() % (n + 1));
    ms_snapshot_t *v = NULL;
    double t0 = now_s();
    if (ms_timeline_snapshot_at(tl, 0, step, NULL, &v) != MS_OK) return 1;
    at[i] = (now_s() - t0) * 1e3;
    ms_snapshot_free(v);
  }
  qsort(at, AT, sizeof *at, cmp_double);
  printf("timeline_at_ms %.3f\n", at[AT / 2]);
  fprintf(stderr, "bench_timeline: --at: median %.3f ms, max %.3f ms\n", at[AT / 2], at[AT - 1]);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  if (bench_ooms() != 0 || bench_steps() != 0 || bench_devices() != 0) return 1;

  const char *dir = getenv("MEMSNAP_TORCH_FIXTURES");
  if (!dir || !*dir) dir = MS_BENCH_FIXTURES_DEFAULT;
  const char *bin = getenv("MEMSNAP_BIN");
  char path[4096];
  snprintf(path, sizeof path, "%s/wedsonlin_cs336_medium_1024_training.pickle", dir);
  struct stat st;
  if (stat(path, &st) != 0 || !bin) {
    fprintf(stderr, "SKIP: bench_timeline: %s or MEMSNAP_BIN not found\n", path);
    return 0;
  }
  static const struct {
    const char *flag, *metric;
  } runs[] = {{"--viewer-data", "timeline_json_largest_fixture_s"},
              {"--json", "timeline_report_json_largest_fixture_s"},
              {NULL, "timeline_text_largest_fixture_s"}};
  for (size_t r = 0; r < sizeof runs / sizeof *runs; r++) {
    double js[5];
    for (int i = 0; i < 5; i++) {
      js[i] = run_json(bin, path, runs[r].flag);
      if (js[i] < 0) {
        fprintf(stderr, "bench_timeline: memsnap timeline %s failed\n",
                runs[r].flag ? runs[r].flag : "(text)");
        return 1;
      }
    }
    qsort(js, 5, sizeof *js, cmp_double);
    printf("%s %.4f\n", runs[r].metric, js[2]);
  }
  return 0;
}
