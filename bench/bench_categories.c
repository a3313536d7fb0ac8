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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "bench_util.h"
#include "memsnap/snapshot.h"
#include "synth.h"

enum { REPS = 5 };

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
    synth_opts_t o = {1, (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale), 4, 0};
    synth_generate_pickle(&o, path);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  const char *plain[] = {"timeline", path, NULL};
  const char *bycat[] = {"timeline", path, "--by", "category", NULL};
  double a[REPS], b[REPS];
  for (int i = 0; i < REPS; i++) { /* alternately, so that a slow spell hits both */
    a[i] = bench_run_memsnap(plain).cpu;
    b[i] = bench_run_memsnap(bycat).cpu;
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
