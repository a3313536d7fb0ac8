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
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "memsnap/pickle.h"
#include "memsnap/timeline.h"
#include "synth.h"
#include "bench_util.h"

enum { REPS = 3 };

static void die(const char *what, const char *msg) {
  fprintf(stderr, "memsnap: error: bench_explain: %s: %s\n", what, msg);
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

/* The OOM snapshot at the synthetic run's peak, written as a pickle (in a child: its memory goes
 * with it). */
static void generate(const char *path, size_t entries) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    synth_opts_t o = {1, entries, 4, 0};
    ms_snapshot_t *s = NULL, *at = NULL;
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    if (synth_workload(&o, &s, &eb) != MS_OK) die("synthetic snapshot", eb.msg);
    if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) die("time index", eb.msg);
    ms_tl_peak_t p;
    size_t n = ms_timeline_nentries(tl, 0);
    if (ms_timeline_peak(tl, 0, MS_TL_ALLOCATED, 0, n, &p) != MS_OK || p.step >= n)
      die("synthetic snapshot", "no peak before the last entry");
    if (ms_timeline_snapshot_at(tl, 0, p.step, NULL, &at) != MS_OK) die("state", "out of memory");
    /* the entry after the peak becomes the failed request (the trace is the source's, which the
     * state borrows: it is cut there) */
    ms_snap_trace_t *e = &s->trace[s->devices[0].first_trace + p.step];
    e->action = MS_TRACE_OOM;
    e->size = 64ull << 30; /* more than anything free */
    e->addr = 512ull << 20; /* device_free */
    e->present &= (uint16_t)~MS_TRACE_NO_ADDR;
    at->devices[0].ntrace = (uint32_t)(p.step + 1);
    for (size_t d = 1; d < at->ndevices; d++) at->devices[d].ntrace = 0;
    if (synth_write_pickle(at, path, &eb) != MS_OK) die(path, eb.msg);
    printf("explain_1gb_entries %zu\n", p.step + 1);
    fflush(stdout);
    _exit(0);
  }
  int st;
  if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    die("generating the synthetic snapshot", "child failed");
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
    generate(path, entries);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) die(path, strerror(errno));
  double wt, wn, we;
  double tl = bench_cli((const char *const[]){"timeline", path, NULL}, &wt);
  double nr = bench_cli((const char *const[]){"explain", path, "--no-replay", NULL}, &wn);
  double ex = bench_cli((const char *const[]){"explain", path, NULL}, &we);
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
