/* SPDX-License-Identifier: MIT
 * Benchmark of `memsnap compare` (issue #28) on the ~1 GB synthetic pickle of bench_read (5,000,000
 * entries of a consistent, training-shaped trace: bench/synth.h) and a copy of it shifted by one
 * step: BEFORE is the same run cut 1,000 entries earlier (about one step of the workload: 150 to
 * 400 allocations, their frees and the backward pass's), AFTER the whole run. Each command runs 5
 * times as a child process, `timeline` and `compare` alternating (a slow spell of a shared
 * machine then weighs on both); the median CPU time (user + system, every thread) is reported,
 * and the wall time beside it (the machine may be shared: CPU times are what to compare). Every
 * command reads the pickles (MEMSNAP_CACHE=0, as pickle_1gb_timeline_s of bench_read does), then
 * the same commands run again from the snapshot cache (a user's second command on the files).
 * Prints on stdout:
 *   compare_1gb_s            `memsnap compare BEFORE AFTER` (the report: both files read and
 *                            indexed, peaks, the states at the peaks, categories and sources;
 *                            the two files read at once, each on a thread, where the machine
 *                            has two cores and the memory)
 *   compare_1gb_wall_s       its wall-clock seconds
 *   compare_1gb_wall_ratio   compare_1gb_wall_s / the timeline's wall-clock seconds: what a user
 *                            waits for compare against timeline (CPU time counts both threads)
 *   compare_1gb_in_turn_s    `compare --jobs 1`: one file after the other (half the memory), CPU
 *   compare_1gb_in_turn_ratio  compare_1gb_in_turn_s / compare_1gb_timeline_s
 *   compare_1gb_in_turn_wall_s  its wall-clock seconds
 *   compare_1gb_rss_mb       its peak RSS in MB
 *   compare_1gb_timeline_s   the baseline, `memsnap timeline AFTER` (pickle_1gb_timeline_s's
 *                            command on this run's file)
 *   compare_1gb_timeline_rss_mb  its peak RSS in MB
 *   compare_1gb_ratio        compare_1gb_s / compare_1gb_timeline_s (target: <= 2)
 *   compare_1gb_pair_ratio   the median of the five ratios compare / timeline of the runs side
 *                            by side (the same target, less at the mercy of a slow spell)
 *   compare_1gb_moments_s    `memsnap compare AFTER --at N --at end`: the same step apart, as two
 *                            moments of one file (one read, one index and classifier)
 *   compare_1gb_moments_ratio  compare_1gb_moments_s / compare_1gb_timeline_s
 *   compare_1gb_warm_s, compare_1gb_warm_timeline_s   the same two commands with the snapshot
 *                            cache on and filled (docs/performance.md): each prints the answer
 *                            an earlier run of it stored (a lookup, so no ratio of the two is
 *                            printed)
 *   compare_1gb_warm_other_s `compare` with the cache filled but a question no run asked before
 *                            (-n 11, 12, 13: the median of the three): from the two snapshots
 *                            and indexes stored, each side classified again
 *   compare_1gb_mb           AFTER's size in MB
 * Environment: MS_BENCH_PICKLE_SCALE (a fraction of the 5,000,000 entries), MS_BENCH_COMPARE_KEEP
 * (a path prefix: the files are written there, kept, and reused when they exist).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "memsnap/cache.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "synth.h"
#include "bench_util.h"

enum { REPS = 5 };

typedef struct gen_s {
  const char *before, *after;
  size_t entries;
} gen_t;

/* The whole run (after) and the run one step earlier (before), written as pickles. */
static void generate_child(void *ctx) {
  const gen_t *g = ctx;
  synth_opts_t o = {1, g->entries, 4, 0};
  ms_snapshot_t *s = NULL, *at = NULL;
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_workload(&o, &s, &eb) != MS_OK) bench_die("synthetic snapshot", eb.msg);
  if (synth_write_pickle(s, g->after, &eb) != MS_OK) bench_die(g->after, eb.msg);
  if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) bench_die("time index", eb.msg);
  size_t n = ms_timeline_nentries(tl, 0), cut = n > 2000 ? n - 1000 : n / 2;
  if (ms_timeline_snapshot_at(tl, 0, cut, NULL, &at) != MS_OK) bench_die("state", "out of memory");
  at->devices[0].ntrace = (uint32_t)cut; /* the trace is the source's, cut there */
  for (size_t d = 1; d < at->ndevices; d++) at->devices[d].ntrace = 0;
  if (synth_write_pickle(at, g->before, &eb) != MS_OK) bench_die(g->before, eb.msg);
}

static double mb(long kb) {
  return (double)kb * 1024.0 / 1e6;
}

/* timeline, compare and compare at two moments of one file, with the cache as the environment
 * says; prints their metrics with prefix ("compare_1gb" or "compare_1gb_warm"). */
static void measure(const char *prefix, const char *before, const char *after, const char *at,
                    bool all) {
  bench_child_t tl, cmp;
  double pairs;
  bench_run_memsnap_pairs((const char *const[]){"timeline", after, NULL},
                          (const char *const[]){"compare", before, after, NULL}, REPS, &tl, &cmp,
                          &pairs);
  printf("%s_timeline_s %.3f\n", prefix, tl.cpu);
  printf("%s_s %.3f\n", prefix, cmp.cpu);
  if (all) {
    printf("%s_ratio %.3f\n", prefix, tl.cpu > 0 ? cmp.cpu / tl.cpu : 0.0);
    printf("%s_pair_ratio %.3f\n", prefix, pairs);
    bench_child_t mom = bench_run_memsnap_median(
        (const char *const[]){"compare", after, "--at", at, "--at", "end", NULL}, REPS);
    printf("%s_wall_s %.3f\n", prefix, cmp.wall);
    printf("%s_wall_ratio %.3f\n", prefix, tl.wall > 0 ? cmp.wall / tl.wall : 0.0);
    bench_child_t turn = bench_run_memsnap_median(
        (const char *const[]){"compare", before, after, "--jobs", "1", NULL}, REPS);
    printf("%s_in_turn_s %.3f\n", prefix, turn.cpu);
    printf("%s_in_turn_ratio %.3f\n", prefix, tl.cpu > 0 ? turn.cpu / tl.cpu : 0.0);
    printf("%s_in_turn_wall_s %.3f\n", prefix, turn.wall);
    fprintf(stderr, "  one file after the other (--jobs 1) %.2f s CPU (%.2f wall, %.0f MB)\n",
            turn.cpu, turn.wall, mb(turn.rss_kb));
    printf("%s_rss_mb %.1f\n", prefix, mb(cmp.rss_kb));
    printf("%s_timeline_rss_mb %.1f\n", prefix, mb(tl.rss_kb));
    printf("%s_moments_s %.3f\n", prefix, mom.cpu);
    printf("%s_moments_ratio %.3f\n", prefix, tl.cpu > 0 ? mom.cpu / tl.cpu : 0.0);
    fprintf(stderr, "  two moments of one file %.2f s CPU (%.2f wall)\n", mom.cpu, mom.wall);
  }
  fflush(stdout);
  fprintf(stderr, "  %s: timeline %.2f s CPU (%.2f wall, %.0f MB); compare %.2f s CPU (%.2f wall, "
          "%.0f MB)\n", prefix, tl.cpu, tl.wall, mb(tl.rss_kb), cmp.cpu, cmp.wall,
          mb(cmp.rss_kb));
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  double scale = 1.0;
  const char *sc = getenv("MS_BENCH_PICKLE_SCALE");
  if (sc && *sc) scale = atof(sc);
  if (!(scale > 0 && scale <= 4)) scale = 1.0;
  const char *keep = getenv("MS_BENCH_COMPARE_KEEP");
  char before[4096], after[4096];
  if (keep && *keep) {
    snprintf(before, sizeof before, "%s.before.pickle", keep);
    snprintf(after, sizeof after, "%s.after.pickle", keep);
  } else {
    snprintf(before, sizeof before, "%s/memsnap-bench-compare-%d.before.pickle", tmpdir, (int)getpid());
    snprintf(after, sizeof after, "%s/memsnap-bench-compare-%d.after.pickle", tmpdir, (int)getpid());
  }
  struct stat st;
  if (!(keep && *keep && stat(before, &st) == 0 && stat(after, &st) == 0)) {
    double w0 = now_s();
    size_t entries = (size_t)(5e6 * scale) < 4000 ? 4000 : (size_t)(5e6 * scale);
    gen_t g = {before, after, entries};
    bench_in_child(generate_child, &g, "generating the synthetic snapshots");
    fprintf(stderr, "  generated %s and %s in %.1f s\n", before, after, now_s() - w0);
  }
  if (stat(after, &st) != 0) bench_die(after, strerror(errno));
  /* BEFORE is AFTER's state after its first n - 1000 entries: entry n - 1001 */
  ms_snapshot_t *b = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_snapshot_load(before, &b, &eb) != MS_OK) bench_die(before, eb.msg);
  char at[32];
  snprintf(at, sizeof at, "%ld", (long)b->devices[0].ntrace - 1);
  ms_snapshot_free(b);
  printf("compare_1gb_mb %.1f\n", (double)st.st_size / 1e6);
  setenv("MEMSNAP_CACHE", "0", 1); /* every command reads the pickles */
  measure("compare_1gb", before, after, at, true);
  /* the cache on (a cache of its own beside the files, filled by one run of compare first) */
  char cache[4200];
  snprintf(cache, sizeof cache, "%s.cache", after);
  if (mkdir(cache, 0700) != 0 && errno != EEXIST) bench_die(cache, strerror(errno));
  setenv("XDG_CACHE_HOME", cache, 1);
  unsetenv("MEMSNAP_CACHE");
  bench_run_memsnap((const char *const[]){"compare", before, after, NULL});
  measure("compare_1gb_warm", before, after, at, false);
  double other[3], other_wall[3];
  for (int k = 0; k < 3; k++) {
    char n[8];
    snprintf(n, sizeof n, "%d", 11 + k);
    bench_child_t o =
        bench_run_memsnap((const char *const[]){"compare", before, after, "-n", n, NULL});
    other[k] = o.cpu;
    other_wall[k] = o.wall;
  }
  printf("compare_1gb_warm_other_s %.3f\n", median(other, 3));
  fflush(stdout);
  fprintf(stderr, "  compare_1gb_warm_other: %.2f s CPU (%.2f wall)\n", median(other, 3),
          median(other_wall, 3));
  char sub[4300];
  snprintf(sub, sizeof sub, "%s/memsnap", cache);
  if (ms_cache_clear(sub, NULL) != MS_OK) bench_die(sub, "cannot clear the cache");
  rmdir(sub);
  rmdir(cache);
  if (!(keep && *keep)) {
    unlink(before);
    unlink(after);
  }
  return 0;
}
