/* SPDX-License-Identifier: MIT
 * Benchmark of reading a large PyTorch snapshot by the commands that need its trace and those that
 * do not (issue #12 §6). A synthetic, consistent, training-shaped pickle of about 1 GB (5,000,000
 * trace entries with stacks of 25-53 frames, 4 streams: bench/synth.h) is written by our writer,
 * then each command runs 3 times as a child process; what is reported is the median CPU time
 * (user + system) of the child, so that page faults count and waiting for a CPU on a shared
 * machine does not. Prints on stdout:
 *   pickle_1gb_stats_s        `memsnap stats FILE` (reads the file without its trace)
 *   pickle_1gb_segments_s     `memsnap segments FILE -o -` to /dev/null (likewise)
 *   pickle_1gb_trace_s        `memsnap trace FILE` to /dev/null (reads everything)
 *   pickle_1gb_timeline_s     `memsnap timeline FILE` (reads everything and builds the time index)
 *   pickle_1gb_timeline_rss_ratio   its peak RSS / the file's size (target <= 1.5)
 *   pickle_1gb_top_s          `memsnap top FILE` (likewise, and the biggest consumers at the peak)
 *   pickle_1gb_memory_at_peak_s  `memsnap memory FILE --at peak -o /dev/null` (the flame graph of
 *                             what was alive at the peak)
 *   pickle_1gb_paths_timeline_s, pickle_1gb_paths_timeline_rss_ratio, pickle_1gb_paths_mb
 *                             the same on a file whose stacks come from 2,000 code paths per kind
 *                             (allocations, frees), as real traces repeat theirs; the file above
 *                             gives every entry a stack of its own, the worst case
 *   pickle_1gb_python_timeline_s, pickle_1gb_python_timeline_rss_ratio, pickle_1gb_python_mb
 *                             the same on the first file loaded and written again by Python's
 *                             pickler, as PyTorch writes its snapshots: every dict memoized too
 *                             (skipped, with a note, when python3 cannot do it)
 *   pickle_1gb_full_read_s    the baseline: ms_pickle_read of the whole file in this process
 *                             (what every command did before reads could skip the trace)
 *   pickle_1gb_no_trace_read_s   ms_pickle_read_ex(MS_LOAD_NO_TRACE) in this process
 *   pickle_1gb_mb             the file's size
 * Targets: stats and segments <= 2 s; trace, timeline, top and memory --at <= 4 s. Each line on stderr shows the wall-clock time
 * and the baseline beside.
 * The file lives in $TMPDIR (or /tmp) and is deleted; with less than three times its size free
 * it is scaled down (a note says so). Environment: MS_BENCH_PICKLE_SCALE (a fraction to scale by),
 * MS_BENCH_READ_KEEP (a path: the file is written there, kept, and reused when it exists).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "synth.h"
#include "bench_util.h"

enum { REPS = 3 };

/* Prints metric (median CPU seconds of args); with rss_metric, also the peak RSS of the command
 * divided by the file's size (file_bytes). */
static void bench_cli(const char *metric, const char *const *args, double baseline,
                      const char *rss_metric, double file_bytes) {
  bench_child_t m = bench_run_memsnap_median(args, REPS);
  printf("%s %.3f\n", metric, m.cpu);
  if (rss_metric) printf("%s %.3f\n", rss_metric, (double)m.rss_kb * 1024.0 / file_bytes);
  fflush(stdout);
  fprintf(stderr, "  %-28s %.2f s CPU, %.2f s wall, peak RSS %.0f MB (full read: %.2f s CPU)\n",
          metric, m.cpu, m.wall, (double)m.rss_kb / 1024.0, baseline);
}

/* In-process read; CPU seconds. */
static double read_once(const char *path, unsigned flags) {
  FILE *f = fopen(path, "rb");
  if (!f) bench_die(path, strerror(errno));
  ms_source_t src;
  ms_source_init_file(&src, f);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  double t0 = cpu_s();
  if (ms_pickle_read_ex(&src, flags, &s, &eb) != MS_OK) bench_die(path, eb.msg);
  double dt = cpu_s() - t0;
  ms_snapshot_free(s);
  fclose(f);
  return dt;
}

static double read_median(const char *path, unsigned flags) {
  double t[REPS];
  for (int i = 0; i < REPS; i++)
    t[i] = read_once(path, flags);
  return median(t, REPS);
}

int main(void) {
  /* every run reads the file: the cache's own benchmark is bench_cache */
  setenv("MEMSNAP_CACHE", "0", 1);
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
    snprintf(path, sizeof path, "%s/memsnap-bench-read-%d.pickle", tmpdir, (int)getpid());
  struct stat st;
  if (!(keep && *keep && stat(path, &st) == 0)) {
    struct statvfs vfs;
    double want = 5e6 * SYNTH_BYTES_PER_ENTRY * scale;
    if (statvfs(tmpdir, &vfs) == 0) {
      double avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
      if (avail < 3 * want) {
        double s2 = scale * avail / (3 * want);
        fprintf(stderr,
                "note: bench_read: only %.0f MB free in %s; the synthetic snapshot is scaled "
                "down to %.0f%% of 1 GB\n",
                avail / 1e6, tmpdir, s2 * 100);
        scale = s2;
      }
    }
    double w0 = now_s();
    synth_opts_t o = {1, (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale), 4, 0};
    synth_generate_pickle(&o, path);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  printf("pickle_1gb_mb %.1f\n", (double)st.st_size / 1e6);
  double full = read_median(path, 0);
  printf("pickle_1gb_full_read_s %.3f\n", full);
  double notrace = read_median(path, MS_LOAD_NO_TRACE);
  printf("pickle_1gb_no_trace_read_s %.3f\n", notrace);
  fflush(stdout);
  fprintf(stderr, "  full read %.2f s CPU, without the trace %.2f s CPU (%.0f MB)\n", full, notrace,
          (double)st.st_size / 1e6);
  double fb = (double)st.st_size;
  bench_cli("pickle_1gb_stats_s", (const char *const[]){"stats", path, NULL}, full, NULL, fb);
  bench_cli("pickle_1gb_segments_s", (const char *const[]){"segments", path, "-o", "-", NULL},
            full, NULL, fb);
  bench_cli("pickle_1gb_trace_s", (const char *const[]){"trace", path, NULL}, full, NULL, fb);
  /* the time index: the whole file read and indexed, peaks and the top stacks at each */
  bench_cli("pickle_1gb_timeline_s", (const char *const[]){"timeline", path, NULL}, full,
            "pickle_1gb_timeline_rss_ratio", fb);
  /* the other commands that read a trace through the index: the biggest consumers at the peak,
   * and the flame graph of what was alive then */
  bench_cli("pickle_1gb_top_s", (const char *const[]){"top", path, NULL}, full, NULL, fb);
  bench_cli("pickle_1gb_memory_at_peak_s",
            (const char *const[]){"memory", path, "--at", "peak", "-o", "/dev/null", NULL}, full,
            NULL, fb);
  /* The same file as Python's pickler writes it (PyTorch's files): each entry dict memoized, so
   * the reader keeps it in the memo rather than freeing it (lib/snapshot/pickle_retire.c). */
  char path3[4200];
  snprintf(path3, sizeof path3, "%s.python.pickle", path);
  if (!(keep && *keep && stat(path3, &st) == 0)) {
    double w0 = now_s();
    static const char script[] =
        "import pickle, sys\n"
        "with open(sys.argv[1], 'rb') as f: d = pickle.load(f)\n"
        "with open(sys.argv[2], 'wb') as f: pickle.dump(d, f, protocol=4)\n";
    const char *argv[] = {"python3", "-c", script, path, path3, NULL};
    bench_child_t r;
    if (bench_try_run(argv, &r) != 0) {
      unlink(path3);
      fprintf(stderr, "note: bench_read: python3 could not write the file again; "
                      "pickle_1gb_python_* skipped\n");
    } else {
      fprintf(stderr, "  wrote %s with Python's pickler in %.1f s\n", path3, now_s() - w0);
    }
  }
  if (!(keep && *keep)) unlink(path);
  if (stat(path3, &st) == 0) {
    printf("pickle_1gb_python_mb %.1f\n", (double)st.st_size / 1e6);
    bench_cli("pickle_1gb_python_timeline_s", (const char *const[]){"timeline", path3, NULL}, full,
              "pickle_1gb_python_timeline_rss_ratio", (double)st.st_size);
    if (!(keep && *keep)) unlink(path3);
  }

  /* The same run with stacks drawn from 2,000 code paths per kind, as real traces repeat theirs:
   * what the stack table costs in practice (the file is about as large: every entry still carries
   * its frames in the pickle). */
  char path2[4200];
  snprintf(path2, sizeof path2, "%s.paths.pickle", path);
  if (!(keep && *keep && stat(path2, &st) == 0)) {
    double w0 = now_s();
    synth_opts_t o = {1, (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale), 4, 2000};
    synth_generate_pickle(&o, path2);
    fprintf(stderr, "  generated %s in %.1f s\n", path2, now_s() - w0);
  }
  if (stat(path2, &st) != 0) bench_die(path2, strerror(errno));
  printf("pickle_1gb_paths_mb %.1f\n", (double)st.st_size / 1e6);
  bench_cli("pickle_1gb_paths_timeline_s", (const char *const[]){"timeline", path2, NULL}, full,
            "pickle_1gb_paths_timeline_rss_ratio", (double)st.st_size);
  if (!(keep && *keep)) unlink(path2);
  return 0;
}
