/* SPDX-License-Identifier: MIT
 * Benchmark of the snapshot cache (issue #33) on the synthetic ~1 GB PyTorch pickle of bench_read
 * (5,000,000 trace entries, bench/synth.h): each command runs 3 times as a child process and the
 * median CPU time (user + system, every thread) is reported, beside `cat FILE` of the same file in
 * the same run (the floor: reading the bytes at all). Prints on stdout:
 *   pickle_1gb_floor_s              `cat FILE > /dev/null`
 *   pickle_1gb_stats_s              `memsnap stats FILE`, the cache off (MEMSNAP_CACHE=0)
 *   pickle_1gb_timeline_s           `memsnap timeline FILE`, the cache off
 *   pickle_1gb_timeline_rss_ratio   its peak RSS / the file's size
 *   pickle_1gb_pages_floor_s        a child that only faults in as much fresh memory as
 *                                   `timeline`'s peak RSS, each run right after one of
 *                                   timeline's (the floor of holding that memory at all: on a
 *                                   virtual machine, the host's share varies from run to run)
 *   pickle_1gb_top_s, pickle_1gb_memory_at_s   `memsnap top FILE`, `memsnap memory FILE --at
 *                                   peak -o /dev/null`, the cache off
 *   pickle_1gb_first_top_s          `memsnap top FILE` into an empty cache (reads and stores)
 *   pickle_1gb_explain_s            `memsnap explain FILE --no-replay`, the cache off
 *   pickle_1gb_cached_stats_s, _cached_top_s, _cached_timeline_s, _cached_memory_at_s,
 *   _cached_explain_s,
 *   pickle_1gb_cached_view_s        the same commands answered from the cache (second runs)
 *   cache_mb_per_gb                 the cache's size after them, per GB of pickle
 * Each line on stderr shows the wall-clock time and the floor beside.
 * The file lives in $TMPDIR (or /tmp) and is deleted, unless MS_BENCH_READ_KEEP names a path (the
 * file is then written there, kept, and reused when it exists). The cache lives in a temporary
 * folder (XDG_CACHE_HOME), never the user's.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "memsnap/cache.h"
#include "memsnap/serialize.h"
#include "synth.h"
#include "bench_util.h"

enum { REPS = 3 };

static double floor_s;

/* Median CPU seconds of `memsnap args` (reps runs); prints metric, and with rss_metric the peak
 * RSS over the file's size. */
static double bench(const char *metric, const char *const *args, int reps, const char *rss_metric,
                    double file_bytes) {
  bench_child_t m = bench_run_memsnap_median(args, reps);
  printf("%s %.3f\n", metric, m.cpu);
  if (rss_metric) printf("%s %.3f\n", rss_metric, (double)m.rss_kb * 1024.0 / file_bytes);
  fflush(stdout);
  fprintf(stderr, "  %-30s %.2f s CPU, %.2f s wall, peak RSS %.0f MB (floor: %.2f s CPU)\n",
          metric, m.cpu, m.wall, (double)m.rss_kb / 1024.0, floor_s);
  return m.cpu;
}

/* `memsnap timeline FILE` (the cache off) REPS times, each run followed by a child that faults in
 * as much fresh memory as the first run's peak RSS: the medians of both, so that the time the
 * kernel and the host take to give a command its pages (which varies with the host from one
 * minute to the next) is seen beside the command's. */
static void bench_timeline(const char *path, double fb) {
  double c[REPS], w[REPS], pc[REPS], pw[REPS];
  long rss = 0;
  const char *const args[] = {"timeline", path, NULL};
  for (int i = 0; i < REPS; i++) {
    bench_child_t r = bench_run_memsnap(args);
    c[i] = r.cpu;
    w[i] = r.wall;
    if (r.rss_kb > rss) rss = r.rss_kb;
    bench_child_t p = bench_touch((size_t)rss * 1024);
    pc[i] = p.cpu;
    pw[i] = p.wall;
  }
  double cpu = median(c, REPS), wall = median(w, REPS), pcpu = median(pc, REPS);
  printf("pickle_1gb_timeline_s %.3f\n", cpu);
  printf("pickle_1gb_timeline_rss_ratio %.3f\n", (double)rss * 1024.0 / fb);
  printf("pickle_1gb_pages_floor_s %.3f\n", pcpu);
  fflush(stdout);
  fprintf(stderr, "  %-30s %.2f s CPU, %.2f s wall, peak RSS %.0f MB (floor: %.2f s CPU)\n",
          "pickle_1gb_timeline_s", cpu, wall, (double)rss / 1024.0, floor_s);
  fprintf(stderr, "  %-30s %.2f s CPU, %.2f s wall (%.0f MB of fresh pages, one write each)\n",
          "pickle_1gb_pages_floor_s", pcpu, median(pw, REPS), (double)rss / 1024.0);
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  const char *keep = getenv("MS_BENCH_READ_KEEP");
  char path[4096], cache[4200];
  if (keep && *keep)
    snprintf(path, sizeof path, "%s", keep);
  else
    snprintf(path, sizeof path, "%s/memsnap-bench-cache-%d.pickle", tmpdir, (int)getpid());
  snprintf(cache, sizeof cache, "%s/memsnap-bench-cache-%d.d", tmpdir, (int)getpid());
  if (mkdir(cache, 0700) != 0) bench_die(cache, strerror(errno));
  setenv("XDG_CACHE_HOME", cache, 1);
  unsetenv("MEMSNAP_CACHE_MAX");
  struct stat st;
  if (!(keep && *keep && stat(path, &st) == 0)) {
    double w0 = now_s();
    synth_opts_t o = {1, 5000000, 4, 0};
    synth_generate_pickle(&o, path);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  double fb = (double)st.st_size;
  {
    double c[REPS], w[REPS];
    for (int i = 0; i < REPS; i++) {
      bench_child_t r = bench_run((const char *const[]){"cat", path, NULL});
      c[i] = r.cpu;
      w[i] = r.wall;
    }
    floor_s = median(c, REPS);
    printf("pickle_1gb_floor_s %.3f\n", floor_s);
    fprintf(stderr, "  pickle_1gb_floor_s             %.2f s CPU, %.2f s wall (%.0f MB)\n",
            floor_s, median(w, REPS), fb / 1e6);
  }
  setenv("MEMSNAP_CACHE", "0", 1);
  bench("pickle_1gb_stats_s", (const char *const[]){"stats", path, NULL}, REPS, NULL, fb);
  bench_timeline(path, fb);
  bench("pickle_1gb_top_s", (const char *const[]){"top", path, NULL}, REPS, NULL, fb);
  bench("pickle_1gb_memory_at_s",
        (const char *const[]){"memory", path, "--at", "peak", "-o", "/dev/null", NULL}, REPS, NULL,
        fb);
  bench("pickle_1gb_explain_s", (const char *const[]){"explain", path, "--no-replay", NULL}, REPS,
        NULL, fb);
  unsetenv("MEMSNAP_CACHE");
  bench("pickle_1gb_first_top_s", (const char *const[]){"top", path, NULL}, 1, NULL, fb);
  bench("pickle_1gb_cached_top_s", (const char *const[]){"top", path, NULL}, REPS, NULL, fb);
  bench("pickle_1gb_cached_timeline_s", (const char *const[]){"timeline", path, NULL}, REPS, NULL,
        fb);
  bench("pickle_1gb_cached_memory_at_s",
        (const char *const[]){"memory", path, "--at", "peak", "-o", "/dev/null", NULL}, REPS, NULL,
        fb);
  bench("pickle_1gb_cached_explain_s",
        (const char *const[]){"explain", path, "--no-replay", NULL}, REPS, NULL, fb);
  bench("pickle_1gb_first_stats_s", (const char *const[]){"stats", path, NULL}, 1, NULL, fb);
  bench("pickle_1gb_cached_stats_s", (const char *const[]){"stats", path, NULL}, REPS, NULL, fb);
  char html[4300];
  snprintf(html, sizeof html, "%s/view.html", cache);
  bench("pickle_1gb_first_view_s", (const char *const[]){"view", path, "-o", html, NULL}, 1, NULL,
        fb);
  bench("pickle_1gb_cached_view_s", (const char *const[]){"view", path, "-o", html, NULL}, REPS,
        NULL, fb);
  unlink(html);
  char dir[4300];
  snprintf(dir, sizeof dir, "%s/memsnap", cache);
  size_t n = 0;
  uint64_t bytes = 0;
  if (ms_cache_usage(dir, &n, &bytes) != MS_OK) bench_die(dir, "cannot read the cache");
  printf("cache_mb_per_gb %.1f\n", (double)bytes / 1e6 / (fb / 1e9));
  fprintf(stderr, "  cache: %zu entries, %.0f MB for a %.0f MB file\n", n, (double)bytes / 1e6,
          fb / 1e6);
  if (ms_cache_clear(dir, NULL) != MS_OK) bench_die(dir, "cannot clear the cache");
  rmdir(dir);
  rmdir(cache);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
