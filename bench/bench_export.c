/* SPDX-License-Identifier: MIT
 * Benchmark of `memsnap export --sqlite` (issue #17 §1; targets: >= 500,000 trace rows/s, and a
 * 1 GB pickle exported with a peak RSS <= 1.5 x the file). Prints on stdout:
 *   export_sqlite_trace_rows_per_s   in this process: trace entries written per second of
 *                                    ms_export_sqlite_add + finish (each entry's trace row, its
 *                                    timeline row and, on this worst-case trace, its own stack
 *                                    row), on a 1,000,000-entry synthetic snapshot (bench/synth.h)
 *   export_sqlite_rows_per_s         the same time, counting every row of every table
 *   export_sqlite_paths_trace_rows_per_s, export_sqlite_paths_rows_per_s   the same with stacks
 *                                    drawn from 2,000 code paths per kind, as real traces repeat
 *                                    theirs (so most entries need no stack row of their own)
 *   export_pprof_1m_s, export_perfetto_1m_s   CPU seconds of --pprof (at the peak) and
 *                                    --perfetto --allocations on the code-paths snapshot
 *   export_sqlite_1gb_s              `memsnap export FILE --sqlite OUT` on the ~1 GB synthetic
 *                                    pickle (5,000,000 entries, every entry its own stack): CPU
 *                                    seconds of the command (reading and indexing included)
 *   export_sqlite_1gb_trace_rows_per_s   the file's trace entries / those CPU seconds
 *   export_sqlite_1gb_rss_ratio      the command's peak RSS / the file's size
 *   export_sqlite_1gb_db_mb          the database's size
 * One run each (a run of the command takes tens of seconds). The files live in $TMPDIR (or /tmp)
 * and are deleted; MS_BENCH_PICKLE_SCALE scales the pickle (a fraction), MS_BENCH_READ_KEEP
 * names a pickle to reuse (as bench_read). MS_BENCH_EXPORT_INPROC=1 runs only the two in-process
 * insert measurements (no other format, no pickle), for iterating on the SQLite writer.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "memsnap/export.h"
#include "memsnap/timeline.h"
#include "synth.h"
#include "bench_util.h"

static int count_write(void *ctx, const char *buf, size_t len) {
  (void)buf;
  *(uint64_t *)ctx += len;
  return 0;
}

/* pprof (at the peak) and Chrome trace JSON (with --allocations) of the same snapshot, written to
 * a sink that only counts. */
static void bench_other_formats(const ms_snapshot_t *s, const ms_timeline_t *tl) {
  uint64_t bytes = 0;
  ms_sink_t sink = {count_write, &bytes};
  ms_errbuf_t eb = {{0}};
  ms_tl_peak_t pk;
  size_t dev = 0;
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++)
    if (ms_timeline_nentries(tl, d) > ms_timeline_nentries(tl, dev)) dev = d;
  if (ms_timeline_peak(tl, dev, MS_TL_ALLOCATED, 0, SIZE_MAX, &pk) != MS_OK) bench_die("peak", "none");
  double t0 = cpu_s();
  if (ms_export_pprof_write(tl, dev, pk.step, &sink, &eb) != MS_OK) bench_die("pprof", eb.msg);
  double tp = cpu_s() - t0;
  printf("export_pprof_1m_s %.3f\n", tp);
  fprintf(stderr, "  pprof of %zu entries: %.2f s CPU, %.1f MB gzipped\n", s->ntrace, tp,
          (double)bytes / 1e6);
  bytes = 0;
  ms_export_perfetto_opts_t po = {true, NULL};
  t0 = cpu_s();
  if (ms_export_perfetto_write(tl, &po, &sink, &eb) != MS_OK) bench_die("perfetto", eb.msg);
  double tf = cpu_s() - t0;
  printf("export_perfetto_1m_s %.3f\n", tf);
  fflush(stdout);
  fprintf(stderr, "  Chrome trace JSON (--allocations) of %zu entries: %.2f s CPU, %.0f MB\n",
          s->ntrace, tf, (double)bytes / 1e6);
}

/* The insert rate, in this process, on a synthetic snapshot built in memory. */
static void bench_inserts(const char *tmpdir, size_t code_paths, const char *metric) {
  synth_opts_t o = {1, 1000000, 4, code_paths};
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_workload(&o, &s, &eb) != MS_OK) bench_die("synthetic snapshot", eb.msg);
  ms_timeline_t *tl = NULL;
  if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) bench_die("time index", eb.msg);
  char path[4200];
  snprintf(path, sizeof path, "%s/memsnap-bench-export-%d.db", tmpdir, (int)getpid());
  unlink(path);
  ms_export_sqlite_t *x = NULL;
  double t0 = cpu_s(), w0 = now_s();
  if (ms_export_sqlite_create(path, &x, &eb) != MS_OK) bench_die(path, eb.msg);
  if (ms_export_sqlite_add(x, s, tl, "synthetic", true, 0, NULL, &eb) != MS_OK)
    bench_die(path, eb.msg);
  double t_add = cpu_s() - t0;
  if (ms_export_sqlite_finish(x, &eb) != MS_OK) bench_die(path, eb.msg);
  double dt = cpu_s() - t0, dw = now_s() - w0;
  size_t timeline_rows = 0;
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    size_t n = ms_timeline_nentries(tl, d);
    timeline_rows += n ? n + 1 : 0;
  }
  double rows = (double)(s->ntrace + timeline_rows + s->nstacks + s->nframes + s->nsegments +
                         s->nblocks);
  printf("%s_trace_rows_per_s %.0f\n", metric, (double)s->ntrace / dt);
  /* issue #17's figure (trace rows per second, the worst case) under the name it gives */
  if (!code_paths) printf("sqlite_rows_per_s %.0f\n", (double)s->ntrace / dt);
  printf("%s_rows_per_s %.0f\n", metric, rows / dt);
  fflush(stdout);
  struct stat dbst;
  double db_mb = stat(path, &dbst) == 0 ? (double)dbst.st_size / 1e6 : 0;
  printf("%s_db_mb %.1f\n", metric, db_mb);
  fflush(stdout);
  fprintf(stderr, "  %s: %zu trace entries, %zu stacks (%.0f rows in all) in %.2f s CPU "
          "(inserts %.2f s, indexes and commit %.2f s), %.2f s wall, %.1f MB\n",
          metric, s->ntrace, s->nstacks, rows, dt, t_add, dt - t_add, dw, db_mb);
  unlink(path);
  const char *inproc = getenv("MS_BENCH_EXPORT_INPROC");
  if (code_paths && !(inproc && *inproc && strcmp(inproc, "0") != 0)) bench_other_formats(s, tl);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) bench_die("MEMSNAP_BIN", "not set (run through bench/run.sh)");
  bench_inserts(tmpdir, 0, "export_sqlite");
  bench_inserts(tmpdir, 2000, "export_sqlite_paths");
  const char *inproc = getenv("MS_BENCH_EXPORT_INPROC");
  if (inproc && *inproc && strcmp(inproc, "0") != 0) return 0;

  double scale = 1.0;
  const char *sc = getenv("MS_BENCH_PICKLE_SCALE");
  if (sc && *sc) scale = atof(sc);
  if (!(scale > 0 && scale <= 4)) scale = 1.0;
  const char *keep = getenv("MS_BENCH_READ_KEEP");
  char path[4096], db[4200];
  if (keep && *keep)
    snprintf(path, sizeof path, "%s", keep);
  else
    snprintf(path, sizeof path, "%s/memsnap-bench-export-%d.pickle", tmpdir, (int)getpid());
  snprintf(db, sizeof db, "%s/memsnap-bench-export-%d.1gb.db", tmpdir, (int)getpid());
  struct stat st;
  size_t entries = (size_t)(5e6 * scale) < 1000 ? 1000 : (size_t)(5e6 * scale);
  if (!(keep && *keep && stat(path, &st) == 0)) {
    double w0 = now_s();
    synth_opts_t o = {1, entries, 4, 0};
    synth_generate_pickle(&o, path);
    fprintf(stderr, "  generated %s in %.1f s\n", path, now_s() - w0);
  }
  if (stat(path, &st) != 0) bench_die(path, strerror(errno));
  double file_bytes = (double)st.st_size;
  /* the trace's length, from the file itself (a reused file may have another) */
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_snapshot_load(path, &s, &eb) != MS_OK) bench_die(path, eb.msg);
  size_t ntrace = s->ntrace;
  ms_snapshot_free(s);

  bench_child_t ex = bench_run((const char *const[]){bin, "export", path, "--sqlite", db, NULL});
  double wall = ex.wall, cpu = ex.cpu;
  struct stat dbst;
  if (stat(db, &dbst) != 0) bench_die(db, strerror(errno));
  printf("export_sqlite_1gb_s %.3f\n", cpu);
  printf("export_sqlite_1gb_trace_rows_per_s %.0f\n", (double)ntrace / cpu);
  printf("export_sqlite_1gb_rss_ratio %.3f\n", (double)ex.rss_kb * 1024.0 / file_bytes);
  printf("export_sqlite_1gb_db_mb %.1f\n", (double)dbst.st_size / 1e6);
  fprintf(stderr,
          "  export of %.0f MB (%zu entries): %.2f s CPU, %.2f s wall, peak RSS %.0f MB, "
          "database %.0f MB\n",
          file_bytes / 1e6, ntrace, cpu, wall, (double)ex.rss_kb / 1024.0,
          (double)dbst.st_size / 1e6);
  unlink(db);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
