/* SPDX-License-Identifier: MIT
 * Benchmark of categories (issue #27): the extra time that `memsnap timeline FILE --by category`
 * (sources and categories of every allocation: the classifier, its phase spans, and the category
 * of every block at every step) takes over `memsnap timeline FILE` on the 1 GB synthetic
 * training-shaped pickle of bench_read (5,000,000 trace entries, each with its own stack: the
 * worst case for the per-stack work). The two commands run alternately, REPS times each, as child
 * processes; the median CPU time (user + system) of each is taken. Prints on stdout:
 *   categories_1gb_timeline_s   the baseline: `memsnap timeline FILE` (pickle_1gb_timeline_s of
 *                               bench_read, measured again here, in the same run)
 *   categories_1gb_by_category_s   `memsnap timeline FILE --by category`
 *   categories_1gb_s            the difference: what categories add
 *   categories_1gb_ratio        categories_1gb_s / categories_1gb_timeline_s (target <= 0.20)
 * The file lives in $TMPDIR (or /tmp) and is deleted; MS_BENCH_PICKLE_SCALE scales it, and with
 * less than three times its size free it is scaled down (a note says so); MS_BENCH_READ_KEEP (a
 * path) keeps it there and reuses it, as bench_read does.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "memsnap/snapshot.h"
#include "synth.h"

enum { REPS = 5 };

static void die(const char *what, const char *msg) {
  fprintf(stderr, "memsnap: error: bench_categories: %s: %s\n", what, msg);
  exit(1);
}

/* Runs memsnap with args, stdout to /dev/null; @return its CPU seconds (user + system). */
static double run_cli(const char *const *args) {
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) die("MEMSNAP_BIN", "not set (run through bench/run.sh)");
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    int fd = open("/dev/null", O_WRONLY);
    if (fd < 0 || dup2(fd, 1) < 0) _exit(127);
    char *argv[8];
    int n = 0;
    argv[n++] = (char *)bin;
    for (; args[n - 1] && n < 7; n++) argv[n] = (char *)args[n - 1];
    argv[n] = NULL;
    execv(bin, argv);
    _exit(127);
  }
  int st;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    die(args[0], "the command failed");
  return (double)ru.ru_utime.tv_sec + (double)ru.ru_utime.tv_usec * 1e-6 +
         (double)ru.ru_stime.tv_sec + (double)ru.ru_stime.tv_usec * 1e-6;
}

/* Writes the synthetic file in a child process (its memory goes with it). */
static void generate(const char *path, size_t entries) {
  fflush(stdout);
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    synth_opts_t o = {1, entries, 4, 0};
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    if (synth_workload(&o, &s, &eb) != MS_OK) die("synthetic snapshot", eb.msg);
    if (synth_write_pickle(s, path, &eb) != MS_OK) die(path, eb.msg);
    ms_snapshot_free(s);
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
  const char *keep = getenv("MS_BENCH_READ_KEEP");
  char path[4096];
  if (keep && *keep)
    snprintf(path, sizeof path, "%s", keep);
  else
    snprintf(path, sizeof path, "%s/memsnap-bench-categories-%d.pickle", tmpdir, (int)getpid());
  struct stat st;
  if (!(keep && *keep && stat(path, &st) == 0)) {
    struct statvfs vfs;
    double want = 5e6 * SYNTH_BYTES_PER_ENTRY * scale;
    if (statvfs(tmpdir, &vfs) == 0) {
      double avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
      if (avail < 3 * want) {
        scale *= avail / (3 * want);
        fprintf(stderr, "note: bench_categories: only %.0f MB free in %s; the synthetic snapshot "
                "is scaled down to %.0f%% of 1 GB\n", avail / 1e6, tmpdir, scale * 100);
      }
    }
    double w0 = now_s();
    generate(path, (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale));
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) die(path, strerror(errno));
  const char *plain[] = {"timeline", path, NULL};
  const char *bycat[] = {"timeline", path, "--by", "category", NULL};
  double a[REPS], b[REPS];
  for (int i = 0; i < REPS; i++) { /* alternately, so that a slow spell hits both */
    a[i] = run_cli(plain);
    b[i] = run_cli(bycat);
    fprintf(stderr, "  run %d: timeline %.2f s CPU, timeline --by category %.2f s CPU\n", i + 1,
            a[i], b[i]);
  }
  double ma = median(a, REPS), mb = median(b, REPS);
  printf("categories_1gb_timeline_s %.3f\n", ma);
  printf("categories_1gb_by_category_s %.3f\n", mb);
  printf("categories_1gb_s %.3f\n", mb - ma);
  printf("categories_1gb_ratio %.3f\n", ma > 0 ? (mb - ma) / ma : 0.0);
  fprintf(stderr, "  categories add %.2f s CPU to timeline's %.2f s (%.0f%%; target <= 20%%), "
          "%.0f MB file\n", mb - ma, ma, ma > 0 ? 100 * (mb - ma) / ma : 0.0,
          (double)st.st_size / 1e6);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
