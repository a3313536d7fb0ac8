/* SPDX-License-Identifier: MIT
 * Benchmark of the many-rank commands' memory (issue #31 item 6: with 1 GB ranks and --jobs 1 the
 * peak RSS of `timeline` grew with the number of files, 1.15 GB for one, 4.31 GB for 12). Prints:
 *   ranks_rss_ratio     peak RSS of `memsnap timeline DIR --jobs 1` over 12 ranks of ~1 GB,
 *                       divided by that of the same command over a directory of one of them
 *                       (target <= 1.2: one snapshot's working set per job, however many
 *                       files). The many-rank command does more per rank than `timeline FILE`
 *                       (the snapshot at the peak and its top stack), so a single file's
 *                       `timeline` is not its baseline; it is printed beside, as
 *                       ranks_rss_file_mb.
 *   ranks_rss_1_mb, ranks_rss_12_mb   the two peaks
 *   ranks_12_s          wall seconds of the 12-rank run
 * The ranks are 12 hard links to one synthetic pickle (bench/synth.h, 5,000,000 entries, ~1 GB):
 * each is read and indexed on its own, as 12 different files are (the cache is off, --no-cache),
 * and the disk holds one file. The files live in $TMPDIR (or /tmp) and are deleted;
 * MS_BENCH_PICKLE_SCALE scales the pickle (a fraction), MS_BENCH_READ_KEEP names a pickle to
 * reuse (as bench_read).
 */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "bench_util.h"
#include "synth.h"

#define RANKS 12

static void die(const char *what, const char *msg) {
  fprintf(stderr, "memsnap: error: bench_ranks: %s: %s\n", what, msg);
  exit(1);
}

/* Runs `memsnap timeline PATH --no-cache --json` (stdout to /dev/null), with `--jobs 1` when
 * PATH is the directory of ranks; @return its peak RSS in bytes, *wall its seconds. */
static double run_timeline(const char *bin, const char *path, bool ranks, double *wall) {
  fflush(stdout);
  double w0 = now_s();
  pid_t pid = fork();
  if (pid < 0) die("fork", strerror(errno));
  if (pid == 0) {
    if (!freopen("/dev/null", "w", stdout)) _exit(126);
    if (ranks)
      execl(bin, bin, "timeline", path, "--jobs", "1", "--no-cache", "--json", (char *)NULL);
    else
      execl(bin, bin, "timeline", path, "--no-cache", "--json", (char *)NULL);
    _exit(127);
  }
  int st;
  struct rusage ru;
  if (wait4(pid, &st, 0, &ru) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0)
    die("memsnap timeline", "the command failed");
  *wall = now_s() - w0;
  return (double)ru.ru_maxrss * 1024.0;
}

/* Writes the synthetic pickle in a child process (its memory goes with it). */
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
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) die("MEMSNAP_BIN", "not set (run through bench/run.sh)");
  double scale = 1.0;
  const char *sc = getenv("MS_BENCH_PICKLE_SCALE");
  if (sc && *sc) scale = atof(sc);
  if (!(scale > 0 && scale <= 4)) scale = 1.0;
  const char *keep = getenv("MS_BENCH_READ_KEEP");
  char path[4096], dir[4096], lnk[4200];
  if (keep && *keep)
    snprintf(path, sizeof path, "%s", keep);
  else
    snprintf(path, sizeof path, "%s/memsnap-bench-ranks-%d.pickle", tmpdir, (int)getpid());
  struct stat st;
  size_t entries = (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale);
  if (!(keep && *keep && stat(path, &st) == 0)) {
    double w0 = now_s();
    generate(path, entries);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) die(path, strerror(errno));
  snprintf(dir, sizeof dir, "%s/memsnap-bench-ranks-%d", tmpdir, (int)getpid());
  if (mkdir(dir, 0755) != 0) die(dir, strerror(errno));
  for (int r = 0; r < RANKS; r++) {
    snprintf(lnk, sizeof lnk, "%s/rank%d.pickle", dir, r);
    if (link(path, lnk) != 0 && symlink(path, lnk) != 0) die(lnk, strerror(errno));
  }
  char dir1[4096], lnk1[4200];
  snprintf(dir1, sizeof dir1, "%s/memsnap-bench-ranks-%d.one", tmpdir, (int)getpid());
  snprintf(lnk1, sizeof lnk1, "%s/rank0.pickle", dir1);
  if (mkdir(dir1, 0755) != 0) die(dir1, strerror(errno));
  if (link(path, lnk1) != 0 && symlink(path, lnk1) != 0) die(lnk1, strerror(errno));
  double w1, w12, wf;
  snprintf(lnk, sizeof lnk, "%s/rank0.pickle", dir);
  double file = run_timeline(bin, lnk, false, &wf);
  double one = run_timeline(bin, dir1, true, &w1);
  double all = run_timeline(bin, dir, true, &w12);
  unlink(lnk1);
  rmdir(dir1);
  printf("ranks_rss_ratio %.3f\n", all / one);
  printf("ranks_rss_1_mb %.0f\n", one / 1e6);
  printf("ranks_rss_12_mb %.0f\n", all / 1e6);
  printf("ranks_rss_file_mb %.0f\n", file / 1e6);
  printf("ranks_12_s %.1f\n", w12);
  fprintf(stderr,
          "  timeline --jobs 1 of a directory of one %.0f MB rank: peak RSS %.0f MB in %.1f s; of "
          "%d such ranks: %.0f MB in %.1f s; timeline of the file alone: %.0f MB in %.1f s\n",
          (double)st.st_size / 1e6, one / 1e6, w1, RANKS, all / 1e6, w12, file / 1e6, wf);
  for (int r = 0; r < RANKS; r++) {
    snprintf(lnk, sizeof lnk, "%s/rank%d.pickle", dir, r);
    unlink(lnk);
  }
  rmdir(dir);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
