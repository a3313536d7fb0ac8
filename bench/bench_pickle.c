/* SPDX-License-Identifier: MIT
 * Benchmark of the PyTorch pickle reader (issue #4). Prints on stdout:
 * Rates are bytes per second of CPU time (user + system, so page faults count; waiting for a
 * CPU on a shared machine does not), medians; pickle_read_wall_mb_s is the wall-clock rate.
 *   pickle_read_fixture_mb_s     the largest fixture, read from memory repeatedly (median)
 *   pickle_read_python_fixture_mb_s   Python's pickle.loads of the same bytes (baseline, median;
 *                                only when python3 is there)
 *   pickle_read_mb_s             a synthetic snapshot of about 1 GB written by our writer and
 *                                shaped like real ones (1,000,000 trace entries, each with its
 *                                own stack 160-223 frames deep over 4,000 code locations, half of
 *                                them C++ frames with long names), read from its file (median
 *                                of 3)
 *   pickle_read_peak_rss_ratio   peak resident memory of a child process that only reads the
 *                                synthetic file, divided by the file's size
 *   pickle_read_wall_mb_s        the same reads, by wall-clock time
 *   pickle_write_mb_s            writing the synthetic snapshot (one run, wall clock)
 *   pickle_synthetic_mb          the synthetic file's size
 * Targets: pickle_read_mb_s >= 200, pickle_read_peak_rss_ratio <= 1.5.
 * The synthetic file lives in $TMPDIR (or /tmp) and is deleted; when the disk has less than
 * three times its size free, the snapshot is scaled down and a note says so on stderr.
 * Environment: MEMSNAP_TORCH_FIXTURES, MS_BENCH_PICKLE_SCALE (a fraction to scale by, e.g. 0.1),
 * MS_BENCH_PICKLE_KEEP (a path: the synthetic file is written there and kept).
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <time.h>
#include <unistd.h>

#include "memsnap/pickle.h"
#include "synth.h"
#include "bench_util.h"

/* ---- the largest fixture ---------------------------------------------------------------------- */

static void bench_fixture(void) {
  const char *dir = getenv("MEMSNAP_TORCH_FIXTURES");
  char path[4096];
  snprintf(path, sizeof path, "%s/wedsonlin_cs336_medium_1024_training.pickle",
           dir && *dir ? dir : MS_BENCH_FIXTURES_DEFAULT);
  FILE *f = fopen(path, "rb");
  if (!f) {
    fprintf(stderr, "SKIP: fixture %s not found: no pickle_read_fixture_mb_s\n", path);
    return;
  }
  fseek(f, 0, SEEK_END);
  size_t len = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  char *data = malloc(len);
  if (!data || fread(data, 1, len, f) != len) bench_die(path, "cannot read");
  fclose(f);
  enum { REPS = 15 };
  double t[REPS];
  for (int i = 0; i < REPS; i++) {
    ms_membuf_t mb;
    ms_source_t src;
    ms_source_init_mem(&src, &mb, data, len);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    double t0 = cpu_s();
    if (ms_pickle_read(&src, &s, &eb) != MS_OK) bench_die(path, eb.msg);
    t[i] = cpu_s() - t0;
    ms_snapshot_free(s);
  }
  printf("pickle_read_fixture_mb_s %.1f\n", (double)len / 1e6 / median(t, REPS));
  free(data);
  /* baseline: Python's own unpickler on the same bytes (what _memory_viz.py does first) */
  char cmd[8192];
  snprintf(cmd, sizeof cmd,
           "python3 -c \"import pickle,time,sys,statistics\n"
           "b=open(sys.argv[1],'rb').read(); t=[]\n"
           "for i in range(5):\n"
           "  t0=time.process_time(); pickle.loads(b); t.append(time.process_time()-t0)\n"
           "print('%%.1f' %% (len(b)/1e6/statistics.median(t)))\" '%s' 2>/dev/null",
           path);
  FILE *p = popen(cmd, "r");
  double py = 0;
  if (p && fscanf(p, "%lf", &py) == 1 && py > 0)
    printf("pickle_read_python_fixture_mb_s %.1f\n", py);
  else
    fprintf(stderr, "SKIP: python3 not available: no Python baseline\n");
  if (p) pclose(p);
}

/* ---- a synthetic snapshot of about 1 GB --------------------------------------------------------- */

static int file_write(void *ctx, const char *buf, size_t len) {
  return fwrite(buf, 1, len, ctx) == len ? MS_OK : MS_EIO;
}

typedef struct gen_s {
  const char *path;
  double scale;
} gen_t;

/* In a child process: builds the snapshot, writes it; prints the write rate. */
static void generate_child(void *ctx) {
  const char *path = ((const gen_t *)ctx)->path;
  double scale = ((const gen_t *)ctx)->scale;
  size_t ntrace = (size_t)(1000000 * scale);
  if (ntrace < 1000) ntrace = 1000;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb0 = {{0}};
  if (synth_wide(ntrace, 1000, &s, &eb0) != MS_OK) bench_die("synthetic snapshot", eb0.msg);
  FILE *f = fopen(path, "wb");
  if (!f) bench_die(path, strerror(errno));
  ms_sink_t sink = {file_write, f};
  ms_errbuf_t eb = {{0}};
  double t0 = now_s();
  if (ms_pickle_write(s, &sink, &eb) != MS_OK) bench_die(path, eb.msg);
  if (fflush(f) != 0) bench_die(path, strerror(errno));
  double dt = now_s() - t0;
  long size = ftell(f);
  fclose(f);
  printf("pickle_write_mb_s %.1f\n", (double)size / 1e6 / dt);
  fflush(stdout);
  ms_snapshot_free(s);
}

static void generate(const char *path, double scale) {
  gen_t g = {path, scale};
  bench_in_child(generate_child, &g, "generating the synthetic snapshot");
}

static double read_file(const char *path, double *wall) {
  FILE *f = fopen(path, "rb");
  if (!f) bench_die(path, strerror(errno));
  ms_source_t src;
  ms_source_init_file(&src, f);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  double w0 = now_s(), t0 = cpu_s();
  if (ms_pickle_read(&src, &s, &eb) != MS_OK) bench_die(path, eb.msg);
  double dt = cpu_s() - t0;
  if (wall) *wall = now_s() - w0;
  if (s->ntrace < 1000) bench_die(path, "too few trace entries read back");
  ms_snapshot_free(s);
  fclose(f);
  return dt;
}

static void read_child(void *path) {
  read_file(path, NULL);
}

/* Peak RSS (bytes) of a child that only reads the file. */
static double read_peak_rss(const char *path) {
  return (double)bench_in_child(read_child, (void *)path, "reading the synthetic snapshot").rss_kb *
         1024.0;
}

int main(void) {
  bench_fixture();
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  double scale = 1.0;
  const char *sc = getenv("MS_BENCH_PICKLE_SCALE");
  if (sc && *sc) scale = atof(sc);
  if (!(scale > 0 && scale <= 4)) scale = 1.0;
  struct statvfs vfs;
  double want = 0.95e9 * scale; /* bytes the full-size file takes */
  if (statvfs(tmpdir, &vfs) == 0) {
    double avail = (double)vfs.f_bavail * (double)vfs.f_frsize;
    if (avail < 3 * want) {
      double s2 = scale * avail / (3 * want);
      fprintf(stderr,
              "note: bench_pickle: only %.0f MB free in %s; the synthetic snapshot is scaled "
              "down to %.0f%% of 1 GB\n",
              avail / 1e6, tmpdir, s2 * 100);
      scale = s2;
    }
  }
  char path[4096];
  const char *keep = getenv("MS_BENCH_PICKLE_KEEP"); /* a path: write there and keep the file */
  if (keep && *keep)
    snprintf(path, sizeof path, "%s", keep);
  else
    snprintf(path, sizeof path, "%s/memsnap-bench-pickle-%d.pickle", tmpdir, (int)getpid());
  generate(path, scale);
  struct stat st;
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  double size = (double)st.st_size;
  printf("pickle_synthetic_mb %.1f\n", size / 1e6);
  double rss = read_peak_rss(path);
  printf("pickle_read_peak_rss_ratio %.3f\n", rss / size);
  fflush(stdout);
  enum { REPS = 3 };
  double t[REPS], w[REPS];
  for (int i = 0; i < REPS; i++) t[i] = read_file(path, &w[i]);
  printf("pickle_read_mb_s %.1f\n", size / 1e6 / median(t, REPS));
  printf("pickle_read_wall_mb_s %.1f\n", size / 1e6 / median(w, REPS));
  if (!(keep && *keep)) unlink(path);
  return 0;
}
