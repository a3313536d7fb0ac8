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
 *   csv_rows_per_s                   rows of every table written per second (wall clock) by
 *                                    ms_export_csv_add + finish (`export --csv`: gzip'd CSV at
 *                                    level 1, the trace and stacks tables on threads of their
 *                                    own, the files deflated by a pool of one thread per CPU) on
 *                                    the code-paths snapshot below (issue #31's target);
 *                                    csv_mb_per_row_m its compressed MB per million rows;
 *                                    csv_1job_rows_per_s the same with one compressing job
 *                                    (ms_export_csv_jobs: each file deflated by the thread that
 *                                    writes it, the writer before the pool), just before (and
 *                                    csv_unique_stacks_1job_rows_per_s for the snapshot below);
 *                                    csv_unique_stacks_rows_per_s the same on the snapshot whose
 *                                    every entry has its own stack (a million stacks.csv.gz rows
 *                                    of PyTorch's JSON frames: most of the bytes);
 *                                    csv_via_sqlite_rows_per_s the same rows the way `export
 *                                    --csv` went before (a temporary database, then
 *                                    ms_export_sqlite_csv), on the code-paths snapshot
 *   export_sqlite_1gb_s              `memsnap export FILE --sqlite OUT` on the ~1 GB synthetic
 *                                    pickle (5,000,000 entries, every entry its own stack): CPU
 *                                    seconds of the command (reading and indexing included)
 *   export_sqlite_1gb_trace_rows_per_s   the file's trace entries / those CPU seconds
 *   export_sqlite_1gb_rss_ratio      the command's peak RSS / the file's size
 *   export_sqlite_1gb_db_mb          the database's size
 *   sqlite_alive_at_1gb_ms           docs/exports.md's "alive at time T, by category" on that
 *                                    database: the median milliseconds over 9 times T spread over
 *                                    the trace (issue #31 target <= 100); sqlite_alive_at_1gb_
 *                                    plain_ms the plain form (alloc_time_us <= T < free_time_us)
 *                                    at the middle time, once, for comparison
 * One run each (a run of the command takes tens of seconds). The files live in $TMPDIR (or /tmp)
 * and are deleted; MS_BENCH_PICKLE_SCALE scales the pickle (a fraction), MS_BENCH_READ_KEEP
 * names a pickle to reuse (as bench_read). MS_BENCH_EXPORT_INPROC=1 runs only the two in-process
 * insert measurements (no other format, no pickle), for iterating on the SQLite writer;
 * MS_BENCH_EXPORT_CSV=1 only the CSV measurements (csv_*), for iterating on the CSV writer.
 */
#include <errno.h>
#include <fcntl.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
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

/* One CSV export with `jobs` compressing threads (0: the default), to sinks that only count the
 * compressed bytes: its rows, wall and CPU seconds, and compressed bytes. */
static void csv_once(const ms_snapshot_t *s, const ms_timeline_t *tl, int jobs, uint64_t *rows,
                     double *dw, double *dt, uint64_t *total) {
  uint64_t bytes[MS_EXPORT_CSV_NFILES] = {0};
  ms_sink_t sink[MS_EXPORT_CSV_NFILES], *sinks[MS_EXPORT_CSV_NFILES];
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) {
    sink[k] = (ms_sink_t){count_write, &bytes[k]};
    sinks[k] = &sink[k];
  }
  ms_export_csv_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  double t0 = cpu_s(), w0 = now_s();
  if (ms_export_csv_create(sinks, 1, &x, &eb) != MS_OK) bench_die("csv", eb.msg);
  if (jobs && ms_export_csv_jobs(x, jobs, &eb) != MS_OK) bench_die("csv", eb.msg);
  if (ms_export_csv_add(x, s, tl, "synthetic", true, 0, NULL, &eb) != MS_OK) bench_die("csv", eb.msg);
  *rows = *total = 0;
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) *rows += ms_export_csv_rows(x, k);
  if (ms_export_csv_finish(x, &eb) != MS_OK) bench_die("csv", eb.msg);
  *dw = now_s() - w0;
  *dt = cpu_s() - t0;
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) *total += bytes[k];
}

/* The CSV writer's rows per second (wall clock: the trace and stacks tables have threads of their
 * own, and the files are compressed by a pool of one thread per CPU), just after the same with
 * one job (each file compressed by the thread that writes it: the writer as it was before the
 * pool) as the baseline of the same run; on the code-paths snapshot also the way through SQLite. */
static void bench_csv(const ms_snapshot_t *s, const ms_timeline_t *tl, const char *metric) {
  uint64_t rows, total;
  double dw, dt, load[3] = {0, 0, 0};
  if (getloadavg(load, 3) < 1) load[0] = -1;
  bool code_paths = strcmp(metric, "csv") == 0;
  csv_once(s, tl, 1, &rows, &dw, &dt, &total);
  printf("%s_1job_rows_per_s %.0f\n", metric, (double)rows / dw);
  fprintf(stderr, "  %s, one job: %llu rows in %.2f s wall, %.2f s CPU, %.1f MB gzipped "
          "(load %.2f)\n", metric, (unsigned long long)rows, dw, dt, (double)total / 1e6, load[0]);
  csv_once(s, tl, 0, &rows, &dw, &dt, &total);
  printf("%s_rows_per_s %.0f\n", metric, (double)rows / dw);
  if (code_paths) printf("csv_mb_per_row_m %.1f\n", (double)total / 1e6 / ((double)rows / 1e6));
  fflush(stdout);
  if (getloadavg(load, 3) < 1) load[0] = -1;
  fprintf(stderr, "  %s: %llu rows (%zu trace entries) in %.2f s wall, %.2f s CPU, %.1f MB "
          "gzipped, %ld CPUs (load %.2f)\n", metric, (unsigned long long)rows, s->ntrace, dw, dt,
          (double)total / 1e6, sysconf(_SC_NPROCESSORS_ONLN), load[0]);
  if (!code_paths) return;
  /* the way `export --csv` went before the writer of its own: a temporary database as CSV */
  char dir[4200], db[4300];
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  snprintf(dir, sizeof dir, "%s/memsnap-bench-csv-%d", tmpdir, (int)getpid());
  snprintf(db, sizeof db, "%s/x.db", dir);
  if (mkdir(dir, 0755) != 0) bench_die(dir, strerror(errno));
  ms_export_sqlite_t *q = NULL;
  ms_errbuf_t eb = {{0}};
  double w0 = now_s();
  if (ms_export_sqlite_create(db, &q, &eb) != MS_OK) bench_die(db, eb.msg);
  if (ms_export_sqlite_add(q, s, tl, "synthetic", true, 0, NULL, &eb) != MS_OK) bench_die(db, eb.msg);
  if (ms_export_sqlite_finish(q, &eb) != MS_OK) bench_die(db, eb.msg);
  if (ms_export_sqlite_csv(db, dir, &eb) != MS_OK) bench_die(dir, eb.msg);
  double dv = now_s() - w0;
  printf("csv_via_sqlite_rows_per_s %.0f\n", (double)rows / dv);
  fflush(stdout);
  fprintf(stderr, "  csv through a temporary SQLite database (the way before): %.2f s wall\n", dv);
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) {
    char p[4400];
    snprintf(p, sizeof p, "%s/%s", dir, ms_export_csv_file_name(k));
    unlink(p);
  }
  unlink(db);
  rmdir(dir);
}

/* The insert rate, in this process, on a synthetic snapshot built in memory. */
static void bench_inserts(const char *tmpdir, size_t code_paths, const char *metric) {
  synth_opts_t o = {1, 1000000, 4, code_paths};
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_workload(&o, &s, &eb) != MS_OK) bench_die("synthetic snapshot", eb.msg);
  ms_timeline_t *tl = NULL;
  if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) bench_die("time index", eb.msg);
  bench_csv(s, tl, code_paths ? "csv" : "csv_unique_stacks");
  const char *csv_only = getenv("MS_BENCH_EXPORT_CSV");
  if (csv_only && *csv_only && strcmp(csv_only, "0") != 0) {
    ms_timeline_destroy(tl);
    ms_snapshot_free(s);
    return;
  }
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

/* docs/exports.md's query (the test suite checks the docs' copy against the plain form) */
static const char alive_at_sql[] =
    "SELECT a.category, sum(a.size) FROM life_classes c CROSS JOIN allocations a "
    "WHERE a.file_id = 0 AND a.device = 0 AND a.life_class = c.class "
    "AND coalesce(a.alloc_time_us, -1) > :t - c.span AND coalesce(a.alloc_time_us, -1) <= :t "
    "AND coalesce(a.free_time_us, 1 << 62) > :t GROUP BY a.category";
static const char alive_at_plain_sql[] =
    "SELECT category, sum(size) FROM allocations WHERE file_id = 0 AND device = 0 "
    "AND (alloc_time_us IS NULL OR alloc_time_us <= :t) "
    "AND (free_time_us IS NULL OR free_time_us > :t) GROUP BY category";

/* Milliseconds of one run of sql at t; *rows: its rows. */
static double alive_query_ms(sqlite3 *db, const char *sql, int64_t t, int *rows) {
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, sql, -1, &st, NULL) != SQLITE_OK) bench_die("alive at", sqlite3_errmsg(db));
  sqlite3_bind_int64(st, 1, t);
  double w0 = now_s();
  int rc;
  *rows = 0;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) (*rows)++;
  double ms = (now_s() - w0) * 1e3;
  if (rc != SQLITE_DONE) bench_die("alive at", sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return ms;
}

static int dbl_cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

/* "alive at time T" on the 1 GB database (a fresh connection: a cold page cache of SQLite's own,
 * the file in the system's). */
static void bench_alive_at(const char *db_path) {
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK)
    bench_die(db_path, db ? sqlite3_errmsg(db) : "cannot open");
  sqlite3_stmt *st = NULL;
  if (sqlite3_prepare_v2(db, "SELECT min(alloc_time_us), max(alloc_time_us), count(*) FROM "
                         "allocations WHERE file_id = 0 AND device = 0", -1, &st, NULL) !=
          SQLITE_OK ||
      sqlite3_step(st) != SQLITE_ROW)
    bench_die(db_path, sqlite3_errmsg(db));
  int64_t lo = sqlite3_column_int64(st, 0), hi = sqlite3_column_int64(st, 1);
  int64_t nalloc = sqlite3_column_int64(st, 2);
  sqlite3_finalize(st);
  double ms[9];
  int rows = 0;
  for (int k = 0; k < 9; k++)
    ms[k] = alive_query_ms(db, alive_at_sql, lo + (hi - lo) * (k + 1) / 10, &rows);
  qsort(ms, 9, sizeof *ms, dbl_cmp);
  double plain = alive_query_ms(db, alive_at_plain_sql, lo + (hi - lo) / 2, &rows);
  printf("sqlite_alive_at_1gb_ms %.2f\n", ms[4]);
  printf("sqlite_alive_at_1gb_plain_ms %.1f\n", plain);
  fflush(stdout);
  fprintf(stderr, "  alive at T on %lld lifetimes: %.2f ms median, %.2f ms at most (9 times); "
          "the plain query %.1f ms\n", (long long)nalloc, ms[4], ms[8], plain);
  sqlite3_close(db);
}

int main(void) {
  const char *tmpdir = getenv("TMPDIR") && *getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
  const char *bin = getenv("MEMSNAP_BIN");
  if (!bin || !*bin) bench_die("MEMSNAP_BIN", "not set (run through bench/run.sh)");
  const char *csv_only = getenv("MS_BENCH_EXPORT_CSV");
  bool csv = csv_only && *csv_only && strcmp(csv_only, "0") != 0;
  bench_inserts(tmpdir, 0, "export_sqlite");
  bench_inserts(tmpdir, 2000, "export_sqlite_paths");
  if (csv) return 0;
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
  bench_alive_at(db);
  unlink(db);
  if (!(keep && *keep)) unlink(path);
  return 0;
}
