/* SPDX-License-Identifier: MIT
 * Benchmark of `memsnap compare` (issue #28) on the ~1 GB synthetic pickle of bench_read (5,000,000
 * entries of a consistent, training-shaped trace: bench/synth.h) and a copy of it shifted by one
 * step: BEFORE is the same run cut 1,000 entries earlier (about one step of the workload: 150 to
 * 400 allocations, their frees and the backward pass's), AFTER the whole run. Each command runs 3
 * times as a child process; the median CPU time (user + system) is reported. Prints on stdout:
 *   compare_1gb_s            `memsnap compare BEFORE AFTER` (the report: both files read and
 *                            indexed, peaks, the states at the peaks, categories and sources)
 *   compare_1gb_wall_s       its wall-clock seconds
 *   compare_1gb_timeline_s   the baseline, `memsnap timeline AFTER` (pickle_1gb_timeline_s's
 *                            command on this run's file)
 *   compare_1gb_ratio        compare_1gb_s / compare_1gb_timeline_s (target: <= 2)
 *   compare_1gb_moments_s    `memsnap compare AFTER --at N --at end`: the same step apart, as two
 *                            moments of one file (one read, one index and classifier)
 *   compare_1gb_moments_ratio  compare_1gb_moments_s / compare_1gb_timeline_s
 *   compare_1gb_mb           AFTER's size in MB
 * Environment: MS_BENCH_PICKLE_SCALE (a fraction of the 5,000,000 entries), MS_BENCH_COMPARE_KEEP
 * (a path prefix: the files are written there, kept, and reused when they exist).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "synth.h"
#include "bench_util.h"

enum { REPS = 3 };

static void die(const char *what, const char *msg) {
  fprintf(stderr, "memsnap: error: bench_compare: %s: %s\n", what, msg);
  exit(1);
}

/* Runs memsnap with args, stdout to /dev/null; CPU seconds of the child, *wall its wall time. */
static double run_cli(const char *const *args, double *wall) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) die("MEMSNAP_BIN", "not set (run through bench/run.sh)");
  fflush(stdout);
  double w0 = now_s();
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0 || dup2(fd, 1) < 0) _exit(127);
    char *argv[12];
    int n = 0;
    argv[n++] = (char *)bin;
    for (; args[n - 1] && n < 11; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    execv(bin, argv);
    _exit(127);
  }
  int st;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    die(args[0], "the command failed");
  *wall = now_s() - w0;
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

static double bench_cli(const char *const *args, double *wall_median) {
  double c[REPS], w[REPS];
  for (int i = 0; i < REPS; i++) c[i] = run_cli(args, &w[i]);
  *wall_median = median(w, REPS);
  return median(c, REPS);
}

/* The whole run (after) and the run one step earlier (before), written as pickles (in a child:
 * its memory goes with it). */
static void generate(const char *before, const char *after, size_t entries) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    synth_opts_t o = {1, entries, 4, 0};
    ms_snapshot_t *s = NULL, *at = NULL;
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    if (synth_workload(&o, &s, &eb) != MS_OK) die("synthetic snapshot", eb.msg);
    if (synth_write_pickle(s, after, &eb) != MS_OK) die(after, eb.msg);
    if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) die("time index", eb.msg);
    size_t n = ms_timeline_nentries(tl, 0), cut = n > 2000 ? n - 1000 : n / 2;
    if (ms_timeline_snapshot_at(tl, 0, cut, NULL, &at) != MS_OK) die("state", "out of memory");
    at->devices[0].ntrace = (uint32_t)cut; /* the trace is the source's, cut there */
    for (size_t d = 1; d < at->ndevices; d++) at->devices[d].ntrace = 0;
    if (synth_write_pickle(at, before, &eb) != MS_OK) die(before, eb.msg);
    _exit(0);
  }
  int st;
  if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    die("generating the synthetic snapshots", "child failed");
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
    generate(before, after, entries);
    fprintf(stderr, "  generated %s and %s in %.1f s\n", before, after, now_s() - w0);
  }
  if (stat(after, &st) != 0) die(after, strerror(errno));
  double wt, wc, wm;
  double tl = bench_cli((const char *const[]){"timeline", after, NULL}, &wt);
  double cmp = bench_cli((const char *const[]){"compare", before, after, NULL}, &wc);
  /* BEFORE is AFTER's state after its first n - 1000 entries: entry n - 1001 */
  ms_snapshot_t *b = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_snapshot_load(before, &b, &eb) != MS_OK) die(before, eb.msg);
  char at[32];
  snprintf(at, sizeof at, "%ld", (long)b->devices[0].ntrace - 1);
  ms_snapshot_free(b);
  double mom = bench_cli((const char *const[]){"compare", after, "--at", at, "--at", "end", NULL},
                         &wm);
  printf("compare_1gb_mb %.1f\n", (double)st.st_size / 1e6);
  printf("compare_1gb_timeline_s %.3f\n", tl);
  printf("compare_1gb_s %.3f\n", cmp);
  printf("compare_1gb_wall_s %.3f\n", wc);
  printf("compare_1gb_ratio %.3f\n", tl > 0 ? cmp / tl : 0.0);
  printf("compare_1gb_moments_s %.3f\n", mom);
  printf("compare_1gb_moments_ratio %.3f\n", tl > 0 ? mom / tl : 0.0);
  fprintf(stderr, "  %.0f MB: timeline %.2f s CPU (%.2f wall); compare %.2f s CPU (%.2f wall); "
          "two moments of one file %.2f s CPU (%.2f wall)\n",
          (double)st.st_size / 1e6, tl, wt, cmp, wc, mom, wm);
  if (!(keep && *keep)) {
    unlink(before);
    unlink(after);
  }
  return 0;
}
