/* SPDX-License-Identifier: MIT
 * Benchmark of loading for a window of the trace (`--range`, ms_snapshot_load_window; docs/cli.md
 * and docs/performance.md) on the synthetic pickle of bench_read (about 1 GB, 5,000,000 entries,
 * every entry its own stack: bench/synth.h), with the snapshot cache off. Each command runs as a
 * child process, windowed and with MEMSNAP_WINDOW=0 (a full read: what every command did before)
 * in turn, 3 times each; reported are the median CPU seconds (user + system) and the largest peak
 * RSS. Prints on stdout:
 *   pickle_1gb_window_full_timeline_s, pickle_1gb_window_full_rss_mb
 *                                      `memsnap timeline FILE --range 0:100000`, full read
 *   pickle_1gb_window_timeline_s, pickle_1gb_window_rss_mb     the same, windowed
 *   pickle_1gb_window_rss_ratio        windowed / full peak RSS
 *   pickle_1gb_window_t_full_timeline_s, pickle_1gb_window_t_full_rss_mb
 *                                      `memsnap timeline FILE --range t=T0:T1` over the same
 *                                      entries' times, full read
 *   pickle_1gb_window_t_timeline_s, pickle_1gb_window_t_rss_mb   the same, windowed
 * Environment: MS_BENCH_READ_KEEP (the file, written there when absent and kept), else it is
 * written to $TMPDIR (or /tmp) and deleted.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench_util.h"
#include "memsnap/serialize.h"
#include "synth.h"

enum { REPS = 3, LAST = 100000 };

/* The times of entries 0 and LAST of device 0's trace, from a windowed read in this process. */
static void window_times(const char *path, int64_t *t0, int64_t *t1) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  ms_load_window_t w = {MS_LOAD_WINDOW_ENTRIES, LAST, 0};
  if (ms_snapshot_load_window(path, MS_LOAD_NO_FREE_STACKS, &w, &s, &eb) != MS_OK)
    bench_die(path, eb.msg);
  if (s->ndevices == 0 || s->devices[0].ntrace <= LAST) bench_die(path, "fewer entries than the window");
  *t0 = s->trace[s->devices[0].first_trace].time_us;
  *t1 = s->trace[s->devices[0].first_trace + LAST].time_us;
  ms_snapshot_free(s);
}

/* REPS runs of args windowed and full in turn; prints the four metrics under prefix. */
static void window_pair(const char *prefix, const char *const *args, double *rss_ratio) {
  double cw[REPS], cf[REPS];
  long rw = 0, rf = 0;
  for (int i = 0; i < REPS; i++) {
    setenv("MEMSNAP_WINDOW", "0", 1);
    bench_child_t f = bench_run_memsnap(args);
    unsetenv("MEMSNAP_WINDOW");
    bench_child_t w = bench_run_memsnap(args);
    cf[i] = f.cpu;
    cw[i] = w.cpu;
    if (f.rss_kb > rf) rf = f.rss_kb;
    if (w.rss_kb > rw) rw = w.rss_kb;
  }
  double mf = median(cf, REPS), mw = median(cw, REPS);
  printf("%s_full_timeline_s %.3f\n%s_full_rss_mb %.1f\n", prefix, mf, prefix, rf / 1024.0);
  printf("%s_timeline_s %.3f\n%s_rss_mb %.1f\n", prefix, mw, prefix, rw / 1024.0);
  fflush(stdout);
  fprintf(stderr, "  %-26s windowed %.2f s CPU, %.0f MB; full read %.2f s CPU, %.0f MB\n", prefix,
          mw, rw / 1024.0, mf, rf / 1024.0);
  if (rss_ratio) *rss_ratio = (double)rw / (double)rf;
}

int main(void) {
  setenv("MEMSNAP_CACHE", "0", 1);
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  const char *keep = getenv("MS_BENCH_READ_KEEP");
  char path[4096];
  if (keep && *keep)
    snprintf(path, sizeof path, "%s", keep);
  else
    snprintf(path, sizeof path, "%s/memsnap-bench-window-%d.pickle", tmpdir, (int)getpid());
  struct stat st;
  if (!(keep && *keep && stat(path, &st) == 0)) {
    double w0 = now_s();
    synth_opts_t o = {1, 5000000, 4, 0};
    synth_generate_pickle(&o, path);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  double ratio = 0;
  char range[64];
  snprintf(range, sizeof range, "0:%d", LAST);
  window_pair("pickle_1gb_window", (const char *const[]){"timeline", path, "--range", range, NULL},
              &ratio);
  printf("pickle_1gb_window_rss_ratio %.3f\n", ratio);
  int64_t t0, t1;
  window_times(path, &t0, &t1);
  snprintf(range, sizeof range, "t=%" PRId64 ":%" PRId64, t0, t1);
  window_pair("pickle_1gb_window_t", (const char *const[]){"timeline", path, "--range", range, NULL},
              NULL);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
