/* SPDX-License-Identifier: MIT
 * Benchmark of `memsnap explain` (issue #26) on the ~1 GB synthetic pickle of bench_read (5,000,000
 * entries of a consistent, training-shaped trace: bench/synth.h) turned into an OOM snapshot at
 * its peak: the trace is cut right after the peak of allocated memory, the entry after it becomes
 * an `oom` entry (a request larger than anything free, with device_free), and the segments are the
 * state at that moment. Each command runs 3 times as a child process; the median CPU time (user +
 * system, every thread) and wall time are reported. Prints on stdout:
 *   explain_1gb_s              `memsnap explain FILE`: CPU seconds (the remedies' replays run on
 *                              one thread per core, so wall time is less: explain_1gb_wall_s)
 *   explain_1gb_wall_s         its wall-clock seconds
 *   explain_1gb_no_replay_s    `memsnap explain FILE --no-replay`: the state and verdict only
 *   explain_1gb_replay_share   (explain_1gb_s - explain_1gb_no_replay_s) / explain_1gb_s
 *   explain_1gb_timeline_s     the baseline, `memsnap timeline FILE`, on the same file
 *   explain_1gb_ratio          explain_1gb_no_replay_s / explain_1gb_timeline_s (target: <= 2)
 *   explain_1gb_entries        the trace entries of the OOM snapshot
 * Environment: MS_BENCH_PICKLE_SCALE (a fraction of the 5,000,000 entries), MS_BENCH_EXPLAIN_KEEP
 * (a path: the file is written there, kept, and reused when it exists).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memsnap/pickle.h"
#include "memsnap/timeline.h"
#include "synth.h"
#include "bench_util.h"

enum { REPS = 3 };

typedef struct gen_s {
  const char *path;
  size_t entries;
} gen_t;

/* The OOM snapshot at the synthetic run's peak, written as a pickle (in a child: its memory goes
 * with it). */
static void generate_child(void *ctx) {
  const char *path = ((const gen_t *)ctx)->path;
  size_t entries = ((const gen_t *)ctx)->entries;
  synth_opts_t o = {1, entries, 4, 0};
  ms_snapshot_t *s = NULL, *at = NULL;
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_workload(&o, &s, &eb) != MS_OK) bench_die("synthetic snapshot", eb.msg);
  if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) bench_die("time index", eb.msg);
  ms_tl_peak_t p;
  size_t n = ms_timeline_nentries(tl, 0);
  if (ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 0, n, &p) != MS_OK || p.step >= n)
    bench_die("synthetic snapshot", "no peak before the last entry");
  if (ms_timeline_snapshot_at(tl, 0, p.step, NULL, &at) != MS_OK) bench_die("state", "out of memory");
  /* the entry after the peak becomes the failed request (the trace is the source's, which the
   * state borrows: it is cut there) */
  ms_snap_trace_t *e = &s->trace[s->devices[0].first_trace + p.step];
  e->action = MS_TRACE_OOM;
  e->size = 64ull << 30; /* more than anything free */
  e->addr = 512ull << 20; /* device_free */
  e->present &= (uint16_t)~MS_TRACE_NO_ADDR;
  at->devices[0].ntrace = (uint32_t)(p.step + 1);
  for (size_t d = 1; d < at->ndevices; d++) at->devices[d].ntrace = 0;
  if (synth_write_pickle(at, path, &eb) != MS_OK) bench_die(path, eb.msg);
  printf("explain_1gb_entries %zu\n", p.step + 1);
  fflush(stdout);
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  double scale = 1.0;
  const char *sc = getenv("MS_BENCH_PICKLE_SCALE");
  if (sc && *sc) scale = atof(sc);
  if (!(scale > 0 && scale <= 4)) scale = 1.0;
  const char *keep = getenv("MS_BENCH_EXPLAIN_KEEP");
  char path[4096];
  if (keep && *keep) snprintf(path, sizeof path, "%s", keep);
  else snprintf(path, sizeof path, "%s/memsnap-bench-explain-%d.pickle", tmpdir, (int)getpid());
  struct stat st;
  if (!(keep && *keep && stat(path, &st) == 0)) {
    double w0 = now_s();
    size_t entries = (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale);
    gen_t g = {path, entries};
    bench_in_child(generate_child, &g, "generating the synthetic snapshot");
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  bench_child_t t = bench_run_memsnap_median((const char *const[]){"timeline", path, NULL}, REPS);
  bench_child_t n =
      bench_run_memsnap_median((const char *const[]){"explain", path, "--no-replay", NULL}, REPS);
  bench_child_t e = bench_run_memsnap_median((const char *const[]){"explain", path, NULL}, REPS);
  double tl = t.cpu, wt = t.wall, nr = n.cpu, wn = n.wall, ex = e.cpu, we = e.wall;
  printf("explain_1gb_timeline_s %.3f\n", tl);
  printf("explain_1gb_no_replay_s %.3f\n", nr);
  printf("explain_1gb_s %.3f\n", ex);
  printf("explain_1gb_wall_s %.3f\n", we);
  printf("explain_1gb_replay_share %.3f\n", ex > 0 ? (ex - nr) / ex : 0.0);
  printf("explain_1gb_ratio %.3f\n", tl > 0 ? nr / tl : 0.0);
  fprintf(stderr,
          "  %.0f MB: timeline %.2f s CPU (%.2f wall); explain --no-replay %.2f s CPU (%.2f wall); "
          "explain %.2f s CPU (%.2f wall), replays %.0f%% of its CPU\n",
          (double)st.st_size / 1e6, tl, wt, nr, wn, ex, we, ex > 0 ? 100 * (ex - nr) / ex : 0.0);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
