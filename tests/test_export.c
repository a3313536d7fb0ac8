/* SPDX-License-Identifier: MIT
 * memsnap tests: exports (issue #17). The SQLite database is read back with SQLite itself and
 * compared row by row with the snapshot on every PyTorch fixture; the docs' example queries run
 * and give the time index's answers; hostile names (quotes, markup, SQL, control characters)
 * come back intact; the CLI writes complete-or-nothing and never over an input.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/error.h"
#include "memsnap/export.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"

static const char *const fixtures[] = {
    "jogregoire_diffusion_tiny", "a0kuma_adamw_small",    "yiyi_flexgen_oom_legacy",
    "yiyi_flexgen_1.3b_legacy_a", "maphsge_select_n_4dev", "cranberrii_ftcourse",
    "wedsonlin_cs336_medium_1024_training",
};
#define NFIX (sizeof fixtures / sizeof *fixtures)

static char fx_path[1024];
static const char *fx(const char *name) {
  snprintf(fx_path, sizeof fx_path, "%s/%s.pickle", th_fixture_dir(), name);
  return fx_path;
}
static bool have_fixtures(void) {
  if (access(fx("a0kuma_adamw_small"), R_OK) == 0) return true;
  printf("SKIP: export fixture tests: no PyTorch fixtures in %s\n", th_fixture_dir());
  return false;
}

static ms_snapshot_t *load(const char *path) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s: %s", path, eb.msg);
  return s;
}

/* ---- SQL helpers ---------------------------------------------------------------------------- */

static sqlite3 *db_open(const char *path) {
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open_v2(path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK, "%s", path);
  return db;
}

static sqlite3_stmt *q(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, sql, -1, &st, NULL), SQLITE_OK, "%s: %s", sql,
               sqlite3_errmsg(db));
  return st;
}

static int64_t q_int(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = q(db, sql);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
  int64_t v = sqlite3_column_int64(st, 0);
  sqlite3_finalize(st);
  return v;
}

static char *q_text(sqlite3 *db, const char *sql) {
  sqlite3_stmt *st = q(db, sql);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s", sql);
  const unsigned char *t = sqlite3_column_text(st, 0);
  char *r = strdup(t ? (const char *)t : "(null)");
  sqlite3_finalize(st);
  return r;
}

/* Exports snaps (with their indexes) into path through the library. */
static void export_files(const char *path, ms_snapshot_t **snaps, const char *const *names,
                         size_t n) {
  ms_export_sqlite_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_export_sqlite_create(path, &x, &eb), MS_OK, "%s", eb.msg);
  for (size_t i = 0; i < n; i++) {
    ms_timeline_t *tl = NULL;
    cr_assert_eq(ms_timeline_create(snaps[i], NULL, &tl, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(ms_export_sqlite_add(x, snaps[i], tl, names[i], true, (int64_t)i * 10, NULL, &eb),
                 MS_OK, "%s", eb.msg);
    ms_timeline_destroy(tl);
  }
  cr_assert_eq(ms_export_sqlite_finish(x, &eb), MS_OK, "%s", eb.msg);
}

static uint32_t block_stack(const ms_snapshot_t *s, const ms_snap_block_t *b) {
  if (b->stack == MS_SNAP_NO_STACK && b->nhistory > 0) return s->history[b->first_history].stack;
  return b->stack;
}

static void check_stack_col(sqlite3_stmt *st, int col, uint32_t stack, const char *what,
                            size_t i) {
  if (stack == MS_SNAP_NO_STACK)
    cr_assert_eq(sqlite3_column_type(st, col), SQLITE_NULL, "%s %zu: frames_id not NULL", what,
                 i);
  else
    cr_assert_eq(sqlite3_column_int64(st, col), (int64_t)stack, "%s %zu: frames_id", what, i);
}

/* Every row of file file_id equals the snapshot's data, and nothing more is there. */
static void check_file(sqlite3 *db, int64_t file_id, const ms_snapshot_t *s,
                       const ms_timeline_t *tl, const char *name) {
  char sql[512];
  /* segments and blocks */
  snprintf(sql, sizeof sql,
           "SELECT id, device, address, total_size, allocated_size, active_size, "
           "requested_size, stream, segment_type, is_expandable, frames_id FROM segments "
           "WHERE file_id = %" PRId64 " ORDER BY id",
           file_id);
  sqlite3_stmt *st = q(db, sql);
  for (size_t i = 0; i < s->nsegments; i++) {
    const ms_snap_segment_t *g = &s->segments[i];
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: segment %zu missing", name, i);
    cr_assert_eq(sqlite3_column_int64(st, 0), (int64_t)i);
    cr_assert_eq(sqlite3_column_int64(st, 1), g->device);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 2), g->address);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 3), g->total_size);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 4), g->allocated_size);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 5), g->active_size);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 6), g->requested_size);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 7), g->stream);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 8), g->is_large ? "large" : "small");
    cr_assert_eq(sqlite3_column_int(st, 9), g->is_expandable);
    check_stack_col(st, 10, g->stack, "segment", i);
  }
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s: more segments than the snapshot", name);
  sqlite3_finalize(st);
  snprintf(sql, sizeof sql,
           "SELECT id, segment_id, addr, size, requested_size, state, frames_id FROM blocks "
           "WHERE file_id = %" PRId64 " ORDER BY id",
           file_id);
  st = q(db, sql);
  size_t nb = 0;
  for (size_t si = 0; si < s->nsegments; si++) {
    for (uint32_t k = 0; k < s->segments[si].nblocks; k++, nb++) {
      size_t i = s->segments[si].first_block + k;
      const ms_snap_block_t *b = &s->blocks[i];
      cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: block %zu missing", name, i);
      cr_assert_eq(sqlite3_column_int64(st, 0), (int64_t)i);
      cr_assert_eq(sqlite3_column_int64(st, 1), (int64_t)si);
      cr_assert_eq((uint64_t)sqlite3_column_int64(st, 2), b->address);
      cr_assert_eq((uint64_t)sqlite3_column_int64(st, 3), b->size);
      cr_assert_eq((uint64_t)sqlite3_column_int64(st, 4), b->requested_size);
      cr_assert_str_eq((const char *)sqlite3_column_text(st, 5),
                       b->state == MS_BLOCK_STATE_OTHER ? b->state_name
                                                        : ms_block_state_name(b->state));
      check_stack_col(st, 6, block_stack(s, b), "block", i);
    }
  }
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s: more blocks than the snapshot", name);
  sqlite3_finalize(st);
  /* trace */
  snprintf(sql, sizeof sql,
           "SELECT device, id, action, addr, size, stream, time_us, frames_id FROM device_traces "
           "WHERE file_id = %" PRId64 " ORDER BY device, id",
           file_id);
  st = q(db, sql);
  for (size_t d = 0; d < s->ndevices; d++) {
    for (uint32_t i = 0; i < s->devices[d].ntrace; i++) {
      const ms_snap_trace_t *e = &s->trace[s->devices[d].first_trace + i];
      cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: trace %zu/%u missing", name, d, i);
      cr_assert_eq(sqlite3_column_int64(st, 0), (int64_t)d);
      cr_assert_eq(sqlite3_column_int64(st, 1), (int64_t)i);
      cr_assert_str_eq((const char *)sqlite3_column_text(st, 2),
                       e->action == MS_TRACE_OTHER ? ms_snap_trace_action_name(e)
                                                   : ms_trace_action_name(e->action));
      cr_assert_eq((uint64_t)sqlite3_column_int64(st, 3), e->addr);
      cr_assert_eq((uint64_t)sqlite3_column_int64(st, 4), e->size);
      cr_assert_eq((uint64_t)sqlite3_column_int64(st, 5), ms_snap_trace_stream(e));
      if (e->present & MS_TRACE_HAS_TIME)
        cr_assert_eq(sqlite3_column_int64(st, 6), e->time_us);
      else
        cr_assert_eq(sqlite3_column_type(st, 6), SQLITE_NULL);
      check_stack_col(st, 7, e->stack, "trace entry", i);
    }
  }
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s: more trace rows than the snapshot", name);
  sqlite3_finalize(st);
  /* timeline: the four series of every device with entries */
  snprintf(sql, sizeof sql,
           "SELECT device, entry, allocated, reserved, active, requested FROM timeline "
           "WHERE file_id = %" PRId64 " ORDER BY device, entry",
           file_id);
  st = q(db, sql);
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    size_t n = ms_timeline_nentries(tl, d);
    if (n == 0) continue;
    static const ms_tl_metric m[4] = {MS_TL_ALLOCATED, MS_TL_RESERVED, MS_TL_ACTIVE,
                                      MS_TL_REQUESTED};
    for (size_t step = 0; step <= n; step++) {
      cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: timeline %zu/%zu missing", name, d, step);
      cr_assert_eq(sqlite3_column_int64(st, 0), (int64_t)d);
      cr_assert_eq(sqlite3_column_int64(st, 1), (int64_t)step - 1);
      for (int k = 0; k < 4; k++)
        cr_assert_eq((uint64_t)sqlite3_column_int64(st, 2 + k),
                     ms_timeline_series(tl, d, m[k])[step], "%s: timeline %zu/%zu %s", name, d,
                     step, ms_tl_metric_name(m[k]));
    }
  }
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s: more timeline rows", name);
  sqlite3_finalize(st);
  /* stacks: every frame of every stack, through the `frames` view's JSON */
  snprintf(sql, sizeof sql,
           "SELECT f.id, f.depth, j.key, json_extract(j.value, '$.name'), "
           "json_extract(j.value, '$.filename'), json_extract(j.value, '$.line') "
           "FROM frames f, json_each(f.frames) j WHERE f.file_id = %" PRId64
           " ORDER BY f.id, j.key",
           file_id);
  st = q(db, sql);
  for (size_t k = 0; k < s->nstacks; k++) {
    for (uint32_t i = 0; i < s->stacks[k].nframes; i++) {
      const ms_snap_frame_t *f = ms_snap_stack_frame(s, (uint32_t)k, i);
      cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: stack %zu frame %u missing", name, k, i);
      cr_assert_eq(sqlite3_column_int64(st, 0), (int64_t)k);
      cr_assert_eq(sqlite3_column_int64(st, 1), (int64_t)s->stacks[k].nframes);
      cr_assert_eq(sqlite3_column_int64(st, 2), (int64_t)i);
      cr_assert_str_eq((const char *)sqlite3_column_text(st, 3), f->name);
      cr_assert_str_eq((const char *)sqlite3_column_text(st, 4), f->filename);
      cr_assert_eq(sqlite3_column_int64(st, 5), f->line);
    }
  }
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE, "%s: more frames than the snapshot", name);
  sqlite3_finalize(st);
  snprintf(sql, sizeof sql, "SELECT count(*) FROM stacks WHERE file_id = %" PRId64, file_id);
  cr_assert_eq(q_int(db, sql), (int64_t)s->nstacks);
}

TestSuite(export, .timeout = 300);

Test(export, sqlite_every_fixture_row_by_row) {
  if (!have_fixtures()) return;
  char *dir = th_tmpdir();
  char path[1200];
  snprintf(path, sizeof path, "%s/all.db", dir);
  ms_snapshot_t *snaps[NFIX];
  const char *names[NFIX];
  for (size_t i = 0; i < NFIX; i++) {
    snaps[i] = load(fx(fixtures[i]));
    names[i] = fixtures[i];
  }
  export_files(path, snaps, names, NFIX);
  sqlite3 *db = db_open(path);
  cr_assert_eq(q_int(db, "SELECT count(*) FROM snapshot"), (int64_t)NFIX);
  for (size_t i = 0; i < NFIX; i++) {
    char sql[256];
    snprintf(sql, sizeof sql, "SELECT file || ' ' || rank FROM snapshot WHERE file_id = %zu", i);
    char *t = q_text(db, sql), want[300];
    snprintf(want, sizeof want, "%s %zu", fixtures[i], i * 10);
    cr_assert_str_eq(t, want);
    free(t);
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_timeline_create(snaps[i], NULL, &tl, &eb), MS_OK);
    check_file(db, (int64_t)i, snaps[i], tl, fixtures[i]);
    ms_timeline_destroy(tl);
    /* every table carries the rank */
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM device_traces WHERE file_id = %zu AND rank IS NOT %zu", i,
             i * 10);
    cr_assert_eq(q_int(db, sql), 0);
  }
  sqlite3_close(db);
  for (size_t i = 0; i < NFIX; i++) ms_snapshot_free(snaps[i]);
  th_rmdir(dir);
  free(dir);
}

/* (addr, entry index, is an alloc) of one device's alloc and free entries, sorted by address. */
typedef struct {
  uint64_t addr;
  uint32_t k;
  bool alloc;
} addr_ev_t;
static int addr_ev_cmp(const void *a, const void *b) {
  const addr_ev_t *x = a, *y = b;
  if (x->addr != y->addr) return x->addr < y->addr ? -1 : 1;
  return x->k < y->k ? -1 : x->k > y->k;
}
static int u64_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* How many trace allocs made a block still allocated at the end: no later alloc or free at
 * their address on their device, and an active_allocated block there. An address that was freed
 * and reused counts once, for its last alloc. */
static int64_t allocs_alive_at_end(const ms_snapshot_t *s) {
  uint64_t *live = malloc((s->nblocks + 1) * sizeof *live);
  size_t nlive = 0;
  for (size_t k = 0; k < s->nblocks; k++)
    if (s->blocks[k].state == MS_BLOCK_ACTIVE_ALLOCATED) live[nlive++] = s->blocks[k].address;
  qsort(live, nlive, sizeof *live, u64_cmp);
  int64_t n = 0;
  for (size_t d = 0; d < s->ndevices; d++) {
    const ms_snap_trace_t *t = &s->trace[s->devices[d].first_trace];
    addr_ev_t *ev = malloc((s->devices[d].ntrace + 1) * sizeof *ev);
    size_t m = 0;
    for (uint32_t k = 0; k < s->devices[d].ntrace; k++)
      if (t[k].action == MS_TRACE_ALLOC || t[k].action == MS_TRACE_FREE_REQUESTED ||
          t[k].action == MS_TRACE_FREE_COMPLETED)
        ev[m++] = (addr_ev_t){t[k].addr, k, t[k].action == MS_TRACE_ALLOC};
    qsort(ev, m, sizeof *ev, addr_ev_cmp);
    for (size_t j = 0; j < m; j++)
      if (ev[j].alloc && (j + 1 == m || ev[j + 1].addr != ev[j].addr) &&
          bsearch(&ev[j].addr, live, nlive, sizeof *live, u64_cmp))
        n++;
    free(ev);
  }
  free(live);
  return n;
}

/* The queries of docs/exports.md, on every fixture: they run, and give the index's answers. */
static const char doc_peak_query[] =
    "SELECT s.rank, s.file, p.device, p.entry, p.allocated\n"
    "FROM (SELECT *, row_number() OVER (PARTITION BY file_id ORDER BY allocated DESC, device,\n"
    "      entry) AS r FROM timeline) p\n"
    "JOIN snapshot s USING (file_id) WHERE p.r = 1 ORDER BY s.file_id";

/* The example query of docs/exports.md under the comment "-- title", as written there, with its
 * `file_id = 0` made `file_id = FILE_ID` and wrapped as SELECT count(*) FROM (...). */
static char *doc_query_count(const char *title, size_t file_id) {
  char path[1200];
  snprintf(path, sizeof path, "%s/docs/exports.md", MS_TEST_SOURCE_DIR);
  FILE *f = fopen(path, "r");
  cr_assert(f, "%s", path);
  char line[1024], q[4096] = "";
  bool in = false;
  while (fgets(line, sizeof line, f)) {
    if (!in) {
      in = strncmp(line, "-- ", 3) == 0 && strncmp(line + 3, title, strlen(title)) == 0 &&
           line[3 + strlen(title)] == '\n';
      continue;
    }
    char *semi = strchr(line, ';');
    if (semi) *semi = 0;
    char *z = strstr(line, "file_id = 0 ");
    if (z) {
      char rest[1024];
      snprintf(rest, sizeof rest, "%s", z + 12);
      snprintf(z, sizeof line - (size_t)(z - line), "file_id = %zu %s", file_id, rest);
    }
    cr_assert_lt(strlen(q) + strlen(line), sizeof q - 1);
    strcat(q, line);
    if (semi) break;
  }
  fclose(f);
  cr_assert(in && q[0], "docs/exports.md has no query '-- %s'", title);
  size_t n = strlen(q) + 64;
  char *out = malloc(n);
  snprintf(out, n, "SELECT count(*) FROM (%s)", q);
  return out;
}

/* The rows of sql (":t" bound to t) as "key=value,...". */
static char *rows_at(sqlite3 *db, const char *sql, int64_t t) {
  sqlite3_stmt *st = q(db, sql);
  sqlite3_bind_int64(st, sqlite3_bind_parameter_index(st, ":t"), t);
  size_t cap = 4096, n = 0;
  char *out = calloc(1, cap);
  int rc;
  while ((rc = sqlite3_step(st)) == SQLITE_ROW) {
    if (n + 256 > cap) out = realloc(out, cap *= 2);
    n += (size_t)snprintf(out + n, cap - n, "%s=%lld,", (const char *)sqlite3_column_text(st, 0),
                          (long long)sqlite3_column_int64(st, 1));
  }
  cr_assert_eq(rc, SQLITE_DONE, "%s: %s", sql, sqlite3_errmsg(db));
  sqlite3_finalize(st);
  return out;
}

/* docs/exports.md's "alive at time T" (life classes, issue #31) gives the rows of the plain
 * query at times along file file_id's device 0, each entry's time and a microsecond either side,
 * and reads the allocations_life index. */
static void alive_at_time_check(sqlite3 *db, const ms_snapshot_t *s, size_t file_id) {
  char *count = doc_query_count("alive at time T (microseconds), by category", file_id);
  char *doc = strdup(count + strlen("SELECT count(*) FROM ("));
  doc[strlen(doc) - 1] = 0;
  free(count);
  char plain[400];
  snprintf(plain, sizeof plain,
           "SELECT category, sum(size) FROM allocations WHERE file_id = %zu AND device = 0 AND "
           "(alloc_time_us IS NULL OR alloc_time_us <= :t) AND (free_time_us IS NULL OR "
           "free_time_us > :t) GROUP BY category",
           file_id);
  size_t n = s->ndevices ? s->devices[0].ntrace : 0, checked = 0;
  for (size_t k = 0; k < 16 && n; k++) {
    const ms_snap_trace_t *e = &s->trace[s->devices[0].first_trace + k * (n - 1) / 15];
    if (!(e->present & MS_TRACE_HAS_TIME)) continue;
    for (int64_t dt = -1; dt <= 1; dt++) {
      char *a = rows_at(db, doc, e->time_us + dt), *b = rows_at(db, plain, e->time_us + dt);
      cr_assert_str_eq(a, b, "file %zu, T = %lld", file_id, (long long)(e->time_us + dt));
      checked += a[0] != 0;
      free(a);
      free(b);
    }
  }
  cr_assert(checked > 0 || n == 0 || !(s->trace[s->devices[0].first_trace].present &
                                       MS_TRACE_HAS_TIME), "file %zu: nothing alive", file_id);
  size_t len = strlen(doc) + 32;
  char *plan = malloc(len);
  snprintf(plan, len, "EXPLAIN QUERY PLAN %s", doc);
  sqlite3_stmt *st = q(db, plan);
  bool indexed = false;
  while (sqlite3_step(st) == SQLITE_ROW)
    indexed |= strstr((const char *)sqlite3_column_text(st, 3), "allocations_life") != NULL;
  sqlite3_finalize(st);
  cr_assert(indexed, "the alive-at-time query reads allocations_life");
  free(plan);
  free(doc);
}

Test(export, sqlite_docs_queries) {
  if (!have_fixtures()) return;
  char *dir = th_tmpdir();
  char path[1200];
  snprintf(path, sizeof path, "%s/all.db", dir);
  ms_snapshot_t *snaps[NFIX];
  const char *names[NFIX];
  for (size_t i = 0; i < NFIX; i++) {
    snaps[i] = load(fx(fixtures[i]));
    names[i] = fixtures[i];
  }
  export_files(path, snaps, names, NFIX);
  sqlite3 *db = db_open(path);
  /* the peak of every rank */
  sqlite3_stmt *st = q(db, doc_peak_query);
  for (size_t i = 0; i < NFIX; i++) {
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_timeline_create(snaps[i], NULL, &tl, &eb), MS_OK);
    ms_tl_peak_t best = {0};
    size_t best_dev = SIZE_MAX;
    for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
      ms_tl_peak_t p;
      if (ms_timeline_nentries(tl, d) == 0) continue;
      cr_assert_eq(ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p), MS_OK);
      if (best_dev == SIZE_MAX || p.bytes > best.bytes) {
        best = p;
        best_dev = d;
      }
    }
    ms_timeline_destroy(tl);
    /* the peak kept in the snapshot row (issue #31: the timeline query takes 10 s at 1 GB) */
    char sql[300];
    snprintf(sql, sizeof sql,
             "SELECT coalesce(peak_allocated, -1), coalesce(peak_device, -1), "
             "coalesce(peak_entry, -2) FROM snapshot WHERE file_id = %zu",
             i);
    sqlite3_stmt *pk = q(db, sql);
    cr_assert_eq(sqlite3_step(pk), SQLITE_ROW);
    bool none = best_dev == SIZE_MAX;
    cr_assert_eq(sqlite3_column_int64(pk, 0), none ? -1 : (int64_t)best.bytes, "%s", fixtures[i]);
    cr_assert_eq(sqlite3_column_int64(pk, 1), none ? -1 : (int64_t)best_dev, "%s", fixtures[i]);
    cr_assert_eq(sqlite3_column_int64(pk, 2), none ? -2 : best.entry, "%s", fixtures[i]);
    sqlite3_finalize(pk);
    if (best_dev == SIZE_MAX) continue; /* no trace: no timeline rows */
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW, "%s: no peak row", fixtures[i]);
    cr_assert_eq(sqlite3_column_int64(st, 0), (int64_t)i * 10);
    cr_assert_str_eq((const char *)sqlite3_column_text(st, 1), fixtures[i]);
    cr_assert_eq(sqlite3_column_int64(st, 2), (int64_t)best_dev, "%s", fixtures[i]);
    cr_assert_eq(sqlite3_column_int64(st, 3), best.entry, "%s", fixtures[i]);
    cr_assert_eq((uint64_t)sqlite3_column_int64(st, 4), best.bytes, "%s", fixtures[i]);
  }
  cr_assert_eq(sqlite3_step(st), SQLITE_DONE);
  sqlite3_finalize(st);
  /* the documented "which rank peaked": one row per file */
  char *peaked = doc_query_count("which rank peaked, on which device, after which entry (ties: the "
                                 "first), highest first", 0);
  cr_assert_eq(q_int(db, peaked), (int64_t)NFIX, "%s", peaked);
  free(peaked);
  for (size_t i = 0; i < NFIX; i++) {
    const ms_snapshot_t *s = snaps[i];
    char sql[1024];
    /* PyTorch's: the allocations, without the stacks */
    size_t nalloc = 0;
    for (size_t k = 0; k < s->ntrace; k++) nalloc += s->trace[k].action == MS_TRACE_ALLOC;
    snprintf(sql, sizeof sql,
             "SELECT count(*) FROM (SELECT time_us, size, action FROM device_traces "
             "WHERE file_id = %zu AND action = 'alloc')",
             i);
    cr_assert_eq(q_int(db, sql), (int64_t)nalloc, "%s", fixtures[i]);
    /* the biggest stacks alive at the end: they add up to the allocated bytes */
    uint64_t allocated = 0;
    for (size_t k = 0; k < s->nsegments; k++) allocated += s->segments[k].allocated_size;
    snprintf(sql, sizeof sql,
             "SELECT coalesce(sum(bytes), 0) FROM (SELECT frames_id, sum(size) AS bytes, "
             "count(*) AS n FROM blocks WHERE file_id = %zu AND state = 'active_allocated' "
             "GROUP BY frames_id ORDER BY bytes DESC)",
             i);
    cr_assert_eq((uint64_t)q_int(db, sql), allocated, "%s", fixtures[i]);
    /* an entry's stack, as PyTorch's JSON list */
    for (size_t d = 0; d < s->ndevices; d++) {
      if (s->devices[d].ntrace == 0) continue;
      const ms_snap_trace_t *e = &s->trace[s->devices[d].first_trace];
      snprintf(sql, sizeof sql,
               "SELECT coalesce(json_array_length(frames), -1) FROM device_traces "
               "WHERE file_id = %zu AND device = %zu AND id = 0",
               i, d);
      cr_assert_eq(q_int(db, sql),
                   e->stack == MS_SNAP_NO_STACK ? -1 : (int64_t)s->stacks[e->stack].nframes);
    }
    /* from a trace entry to the block it made, still alive at the end: only the last
     * allocation at a reused address (issue #31 item 3) */
    char *alive = doc_query_count("from a trace entry to the block it made, still alive at the "
                                  "end", i);
    cr_assert_eq(q_int(db, alive), allocs_alive_at_end(s), "%s: %s", fixtures[i], alive);
    free(alive);
    alive_at_time_check(db, s, i);
  }
  /* every query of docs/exports.md's example block runs on the database (:t a time of adamw) */
  char dpath[1200];
  snprintf(dpath, sizeof dpath, "%s/docs/exports.md", MS_TEST_SOURCE_DIR);
  size_t doclen = 0;
  char *doc = th_read_file(dpath, &doclen);
  cr_assert(doc, "%s", dpath);
  char *blk = strstr(doc, "### Example queries\n\n```sql\n");
  cr_assert(blk);
  blk = strchr(strstr(blk, "```sql\n"), '\n') + 1;
  *strstr(blk, "\n```") = 0;
  int nq = 0;
  for (const char *sq = blk; *sq;) {
    sqlite3_stmt *ds = NULL;
    const char *tail = NULL;
    cr_assert_eq(sqlite3_prepare_v2(db, sq, -1, &ds, &tail), SQLITE_OK, "%s: %s", sq,
                 sqlite3_errmsg(db));
    if (!ds) break; /* only comments left */
    int ti = sqlite3_bind_parameter_index(ds, ":t");
    if (ti) sqlite3_bind_int64(ds, ti, snaps[1]->trace[snaps[1]->ntrace / 2].time_us);
    int rc;
    while ((rc = sqlite3_step(ds)) == SQLITE_ROW) {}
    cr_assert_eq(rc, SQLITE_DONE, "%s: %s", sq, sqlite3_errmsg(db));
    sqlite3_finalize(ds);
    nq++;
    sq = tail;
  }
  cr_assert_geq(nq, 9, "docs/exports.md's example queries: %d", nq);
  free(doc);
  /* the indexes the queries use exist (none on action: a third of the rows is an alloc) */
  cr_assert_eq(q_int(db, "SELECT count(*) FROM sqlite_master WHERE type = 'index' AND name IN "
                         "('trace_rows_addr', 'trace_rows_key', 'block_rows_addr')"),
               3);
  sqlite3_close(db);
  for (size_t i = 0; i < NFIX; i++) ms_snapshot_free(snaps[i]);
  th_rmdir(dir);
  free(dir);
}

/* ---- hostile names -------------------------------------------------------------------------- */

static const char *const hostile[] = {
    "'; DROP TABLE trace_rows; --",
    "\"quoted\" and \\backslash\\",
    "<script>alert(1)</script> & </g>",
    "ctl\x01\x02\x1f tab\t nl\n cr\r end",
    "caf\xc3\xa9 \xe2\x9c\x93",
    "",
};
#define NHOSTILE (sizeof hostile / sizeof *hostile)

/* A consistent snapshot (one segment, one live block, its alloc in the trace) whose stack's frames
 * have the n (at most 16) names, each frame's file the next name, and hostile allocator
 * settings. */
static ms_snapshot_t *named_snapshot(const char *const *names, size_t n, bool broken) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_SETTINGS;
  uint32_t fr[16], stack;
  cr_assert_leq(n, 16);
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(ms__snapbuild_frame(&b, names[i], strlen(names[i]), names[(i + 1) % n],
                                     strlen(names[(i + 1) % n]), (int64_t)i, &fr[i]),
                 MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr, n, &stack), MS_OK);
  ms_snap_kv_t kv;
  memset(&kv, 0, sizeof kv);
  kv.key = hostile[1];
  kv.kind = MS_SNAP_VAL_STR;
  kv.s = hostile[3];
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = 0x7f0000000000;
  g.total_size = 2 << 20;
  g.allocated_size = g.active_size = g.requested_size = 4096;
  g.is_large = true;
  g.stack = stack;
  g.nblocks = 2;
  ms_snap_block_t bl;
  memset(&bl, 0, sizeof bl);
  bl.address = g.address;
  bl.size = bl.requested_size = 4096;
  bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
  bl.state_name = "active_allocated";
  bl.stack = stack;
  cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
  bl.address += 4096;
  bl.size = g.total_size - 4096;
  bl.requested_size = 0;
  bl.state = MS_BLOCK_INACTIVE;
  bl.state_name = "inactive";
  bl.stack = MS_SNAP_NO_STACK;
  cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_trace_t t;
  memset(&t, 0, sizeof t);
  t.action = MS_TRACE_SEGMENT_ALLOC;
  t.addr = g.address;
  t.size = g.total_size;
  t.stack = stack;
  t.time_us = 1000;
  t.present = MS_TRACE_HAS_TIME;
  cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  t.action = MS_TRACE_ALLOC;
  t.size = 4096;
  t.time_us = 2000;
  cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  if (broken) { /* a free outside every segment: the trace cannot be undone */
    t.action = MS_TRACE_FREE_COMPLETED;
    t.addr = 0x1000;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = broken ? 3 : 2;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static ms_snapshot_t *hostile_snapshot_ex(bool broken) {
  return named_snapshot(hostile, NHOSTILE, broken);
}

static ms_snapshot_t *hostile_snapshot(void) {
  return hostile_snapshot_ex(false);
}

/* Names that are not UTF-8 (a stray byte, a cut sequence, a surrogate, an overlong '/'), and
 * what the outputs must hold instead: each byte that is not part of valid UTF-8 as U+FFFD, as
 * the JSON outputs write them (issue #35 item 14: pprof strings and SQLite TEXT got them as is). */
#define FFFD "\xef\xbf\xbd"
static const char *const not_utf8[] = {"ok \xc3\xa9", "bad\xff", "cut\xe2\x9c", "sur\xed\xa0\x80",
                                       "over\xc0\xaf"};
static const char *const as_utf8[] = {"ok \xc3\xa9", "bad" FFFD, "cut" FFFD FFFD,
                                      "sur" FFFD FFFD FFFD, "over" FFFD FFFD};
#define NNOT (sizeof not_utf8 / sizeof *not_utf8)

Test(export, sqlite_text_is_utf8) {
  char *dir = th_tmpdir();
  char path[1200];
  snprintf(path, sizeof path, "%s/u.db", dir);
  ms_snapshot_t *s = named_snapshot(not_utf8, NNOT, false);
  const char *names[] = {not_utf8[1]};
  export_files(path, &s, names, 1);
  sqlite3 *db = db_open(path);
  char *file = q_text(db, "SELECT file FROM snapshot");
  cr_expect_str_eq(file, as_utf8[1]);
  free(file);
  sqlite3_stmt *st = q(db, "SELECT name, filename FROM locations ORDER BY id");
  for (size_t i = 0; i < NNOT; i++) {
    cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
    cr_expect_str_eq((const char *)sqlite3_column_text(st, 0), as_utf8[i]);
    cr_expect_str_eq((const char *)sqlite3_column_text(st, 1), as_utf8[(i + 1) % NNOT]);
  }
  sqlite3_finalize(st);
  sqlite3_close(db);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

Test(export, sqlite_hostile_names_intact) {
  char *dir = th_tmpdir();
  char path[1200];
  snprintf(path, sizeof path, "%s/h.db", dir);
  ms_snapshot_t *s = hostile_snapshot();
  const char *names[] = {hostile[0]};
  export_files(path, &s, names, 1);
  sqlite3 *db = db_open(path);
  char *file = q_text(db, "SELECT file FROM snapshot");
  cr_assert_str_eq(file, hostile[0]);
  free(file);
  cr_assert_eq(q_int(db, "SELECT count(*) FROM trace_rows"), 2);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  check_file(db, 0, s, tl, "hostile");
  ms_timeline_destroy(tl);
  /* the settings are valid JSON with the key and value intact */
  sqlite3_stmt *st = q(db, "SELECT j.key, j.value FROM snapshot, json_each(settings) j");
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  cr_assert_str_eq((const char *)sqlite3_column_text(st, 0), hostile[1]);
  cr_assert_str_eq((const char *)sqlite3_column_text(st, 1), hostile[3]);
  sqlite3_finalize(st);
  /* the blocks view's frames of the live block */
  cr_assert_eq(q_int(db, "SELECT json_array_length(frames) FROM blocks WHERE id = 0"),
               (int64_t)NHOSTILE);
  sqlite3_close(db);
  ms_snapshot_free(s);
  th_rmdir(dir);
  free(dir);
}

Test(export, rank_from_name) {
  int64_t r = -1;
  cr_assert(ms_export_rank_from_name("rank3.pickle", &r) && r == 3);
  cr_assert(ms_export_rank_from_name("/x/rank9/snapshot_rank_12.pickle", &r) && r == 12);
  cr_assert(ms_export_rank_from_name("RANK-7.pkl", &r) && r == 7);
  cr_assert(ms_export_rank_from_name("a.rank.5", &r) && r == 5);
  cr_assert(!ms_export_rank_from_name("/rank3/snapshot.pickle", &r));
  cr_assert(!ms_export_rank_from_name("ranking.pickle", &r));
  cr_assert(!ms_export_rank_from_name("rank99999999999999999999.pickle", &r));
}

/* ---- the command ---------------------------------------------------------------------------- */

static char cli_dir[256];

typedef struct run_s {
  int status;
  char *out, *err;
} run_t;

static char *read_text(const char *path) {
  size_t len = 0;
  char *b = th_read_file(path, &len);
  if (!b) return NULL;
  char *t = realloc(b, len + 1);
  if (!t) {
    free(b);
    return NULL;
  }
  t[len] = 0;
  return t;
}

static run_t run_args(const char *const *args) {
  char outp[300], errp[300];
  snprintf(outp, sizeof outp, "%s/../.stdout-%d", cli_dir, (int)getpid());
  snprintf(errp, sizeof errp, "%s/../.stderr-%d", cli_dir, (int)getpid());
  const char *argv[32];
  int n = 0;
  const char *bin = getenv("MEMSNAP_BIN");
  argv[n++] = bin && *bin ? bin : MS_TEST_BINARY_DIR "/bin/memsnap";
  for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int in = open("/dev/null", O_RDONLY);
    if (in < 0 || out < 0 || err < 0 || chdir(cli_dir) != 0) _exit(126);
    dup2(in, 0);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  run_t r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.out = read_text(outp);
  r.err = read_text(errp);
  unlink(outp);
  unlink(errp);
  cr_assert(r.out && r.err);
  return r;
}
#define RUN(...) run_args((const char *const[]){__VA_ARGS__, NULL})

static void run_free(run_t *r) {
  free(r->out);
  free(r->err);
}

static void cli_setup(void) {
  char *d = th_tmpdir();
  snprintf(cli_dir, sizeof cli_dir, "%s", d);
  free(d);
}
static void cli_teardown(void) {
  th_rmdir(cli_dir);
}

TestSuite(export_cli, .init = cli_setup, .fini = cli_teardown, .timeout = 300);

/* Links fixture name into the test directory as link (a name with a rank in it). */
static void link_fixture(const char *name, const char *link) {
  char p[600];
  snprintf(p, sizeof p, "%s/%s", cli_dir, link);
  cr_assert_eq(symlink(fx(name), p), 0);
}

Test(export_cli, sqlite_many_ranks) {
  if (!have_fixtures()) return;
  link_fixture("a0kuma_adamw_small", "snap_rank0.pickle");
  link_fixture("cranberrii_ftcourse", "snap_rank1.pickle");
  link_fixture("jogregoire_diffusion_tiny", "snap_rank2.pickle");
  run_t r = RUN("export", "snap_rank0.pickle", "snap_rank1.pickle", "snap_rank2.pickle",
                "--sqlite", "out.db");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert_str_eq(r.out, "");
  run_free(&r);
  char path[600];
  snprintf(path, sizeof path, "%s/out.db", cli_dir);
  sqlite3 *db = db_open(path);
  char *t = q_text(db, "SELECT group_concat(file || ':' || rank, ' ') FROM (SELECT * FROM "
                       "snapshot ORDER BY file_id)");
  cr_assert_str_eq(t, "snap_rank0.pickle:0 snap_rank1.pickle:1 snap_rank2.pickle:2");
  free(t);
  ms_snapshot_t *s = load(fx("cranberrii_ftcourse"));
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK);
  check_file(db, 1, s, tl, "cranberrii_ftcourse");
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  sqlite3_close(db);
  /* a directory stands for its files, in name order */
  snprintf(path, sizeof path, "%s/ranks", cli_dir);
  cr_assert_eq(mkdir(path, 0755), 0);
  link_fixture("a0kuma_adamw_small", "ranks/r_rank1.pickle");
  link_fixture("jogregoire_diffusion_tiny", "ranks/r_rank0.pickle");
  r = RUN("export", "ranks", "--sqlite", "dir.db");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof path, "%s/dir.db", cli_dir);
  db = db_open(path);
  t = q_text(db, "SELECT group_concat(file || ':' || rank, ' ') FROM (SELECT * FROM "
                 "snapshot ORDER BY file_id)");
  cr_assert_str_eq(t, "ranks/r_rank0.pickle:0 ranks/r_rank1.pickle:1");
  free(t);
  sqlite3_close(db);
  for (int i = 0; i < 2; i++) {
    snprintf(path, sizeof path, "%s/ranks/r_rank%d.pickle", cli_dir, i);
    unlink(path);
  }
  snprintf(path, sizeof path, "%s/ranks", cli_dir);
  rmdir(path);
  /* --rank overrides the name's */
  r = RUN("export", "snap_rank1.pickle", "--sqlite", "one.db", "--rank", "41");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof path, "%s/one.db", cli_dir);
  db = db_open(path);
  cr_assert_eq(q_int(db, "SELECT rank FROM snapshot"), 41);
  cr_assert_eq(q_int(db, "SELECT count(*) FROM segments WHERE rank <> 41"), 0);
  sqlite3_close(db);
}

/* The highest allocated total over every device of a fixture. */
static uint64_t peak_of(const char *name) {
  ms_snapshot_t *s = load(fx(name));
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK);
  uint64_t best = 0;
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    ms_tl_peak_t p;
    if (ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p) == MS_OK && p.bytes > best)
      best = p.bytes;
  }
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
  return best;
}

Test(export_cli, sqlite_attach_across_databases) {
  if (!have_fixtures()) return;
  link_fixture("a0kuma_adamw_small", "rank0.pickle");
  link_fixture("cranberrii_ftcourse", "rank1.pickle");
  run_t r = RUN("export", "rank0.pickle", "--sqlite", "rank0.db");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = RUN("export", "rank1.pickle", "--sqlite", "rank1.db");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char path[600], sql[1400];
  snprintf(path, sizeof path, "%s/rank0.db", cli_dir);
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open(path, &db), SQLITE_OK);
  snprintf(sql, sizeof sql, "ATTACH '%s/rank1.db' AS r1", cli_dir);
  cr_assert_eq(sqlite3_exec(db, sql, NULL, NULL, NULL), SQLITE_OK);
  /* docs/exports.md: the peak of each rank over attached per-rank databases */
  char *t = q_text(db, "SELECT group_concat(rank || '=' || peak, ' ') FROM (SELECT s.rank, "
                       "max(t.allocated) AS peak FROM main.timeline t JOIN main.snapshot s USING "
                       "(file_id) GROUP BY s.rank UNION ALL SELECT s.rank, max(t.allocated) FROM "
                       "r1.timeline t JOIN r1.snapshot s USING (file_id) GROUP BY s.rank)");
  char want[128];
  snprintf(want, sizeof want, "0=%" PRIu64 " 1=%" PRIu64, peak_of("a0kuma_adamw_small"),
           peak_of("cranberrii_ftcourse"));
  cr_assert_str_eq(t, want);
  free(t);
  sqlite3_close(db);
}

Test(export_cli, sqlite_complete_or_nothing) {
  if (!have_fixtures()) return;
  link_fixture("a0kuma_adamw_small", "a.pickle");
  /* a later file fails: no output, no temporary file left */
  run_t r = RUN("export", "a.pickle", "missing.pickle", "--sqlite", "out.db");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "memsnap: error: ") && strstr(r.err, "missing.pickle"), "%s", r.err);
  run_free(&r);
  cr_assert_eq(th_dir_count(cli_dir), 1, "only the input is left");
  /* an existing output is replaced only on success */
  char path[600];
  snprintf(path, sizeof path, "%s/keep.db", cli_dir);
  cr_assert_eq(th_write_file(path, "old", 3), 0);
  r = RUN("export", "a.pickle", "missing.pickle", "--sqlite", "keep.db");
  cr_assert_eq(r.status, 1);
  run_free(&r);
  size_t len = 0;
  char *old = th_read_file(path, &len);
  cr_assert(old && len == 3 && memcmp(old, "old", 3) == 0);
  free(old);
  /* never over an input, whatever its name */
  r = RUN("export", "a.pickle", "--sqlite", fx("a0kuma_adamw_small"));
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "refusing to write over it"), "%s", r.err);
  run_free(&r);
  struct stat sb;
  cr_assert_eq(stat(fx("a0kuma_adamw_small"), &sb), 0);
  cr_assert_gt(sb.st_size, 1000);
}

Test(export_cli, usage_errors) {
  const char *const *cases[] = {
      (const char *const[]){"export", "a.pickle", NULL},
      (const char *const[]){"export", "a.pickle", "--sqlite", "x.db", "--pprof", "y", NULL},
      (const char *const[]){"export", "a.pickle", "--sqlite", "-", NULL},
      (const char *const[]){"export", "--sqlite", "x.db", NULL},
      (const char *const[]){"export", "a", "b", "--sqlite", "x.db", "--rank", "1", NULL},
      (const char *const[]){"export", "a", "--sqlite", "x.db", "--rank", "x", NULL},
      (const char *const[]){"export", "a", "--sqlite", "x.db", "--at", "peak", NULL},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    run_t r = run_args(cases[i]);
    cr_assert_eq(r.status, 2, "case %zu: %d %s", i, r.status, r.err);
    cr_assert(strstr(r.err, "memsnap: error: "), "case %zu: %s", i, r.err);
    run_free(&r);
  }
  run_t r = RUN("export", "--help");
  cr_assert_eq(r.status, 0);
  cr_assert(strstr(r.out, "usage: memsnap export"));
  run_free(&r);
}

/* ---- pprof: decoded back here, and read by `go tool pprof` when Go is installed ------------- */

#include <zlib.h>

/* A whole gzip file inflated; *len its size. */
static unsigned char *gunzip(const char *path, size_t *len) {
  gzFile g = gzopen(path, "rb");
  cr_assert(g, "%s", path);
  size_t cap = 1 << 16, n = 0;
  unsigned char *b = malloc(cap);
  for (;;) {
    if (n == cap) b = realloc(b, cap *= 2);
    int r = gzread(g, b + n, (unsigned)(cap - n));
    cr_assert_geq(r, 0);
    if (r == 0) break;
    n += (size_t)r;
  }
  gzclose(g);
  *len = n;
  return b;
}

typedef struct pb_s {
  const unsigned char *p, *end;
} pb_t;

static uint64_t pb_varint(pb_t *r) {
  uint64_t v = 0;
  for (int sh = 0; sh < 64; sh += 7) {
    cr_assert(r->p < r->end, "truncated varint");
    unsigned char c = *r->p++;
    v |= (uint64_t)(c & 0x7f) << sh;
    if (!(c & 0x80)) return v;
  }
  cr_assert_fail("varint too long");
  return 0;
}

/* The next field: its number, wire type, and value (varint) or bytes (length-delimited). */
static bool pb_next(pb_t *r, unsigned *field, pb_t *sub, uint64_t *v) {
  if (r->p >= r->end) return false;
  uint64_t key = pb_varint(r);
  *field = (unsigned)(key >> 3);
  switch (key & 7) {
  case 0:
    *v = pb_varint(r);
    break;
  case 2: {
    uint64_t n = pb_varint(r);
    cr_assert_leq(n, (uint64_t)(r->end - r->p), "length past the end");
    sub->p = r->p;
    sub->end = r->p + n;
    r->p += n;
    break;
  }
  default:
    cr_assert_fail("unexpected wire type %u", (unsigned)(key & 7));
  }
  return true;
}

typedef struct profile_s {
  char **strings;
  size_t nstrings;
  int64_t types[4], totals[4];
  size_t ntypes, nsamples, nlocations, nfunctions;
  int64_t default_type;
  char **function_names; /* by function id (1-based, dense as we write them) */
  size_t nsystem_names;  /* functions with a system_name (field 3) */
} profile_t;

static void profile_decode(const char *path, profile_t *pf) {
  memset(pf, 0, sizeof *pf);
  size_t len;
  unsigned char *data = gunzip(path, &len);
  pb_t r = {data, data + len}, sub;
  unsigned f;
  uint64_t v;
  /* strings first (they may come anywhere) */
  while (pb_next(&r, &f, &sub, &v)) {
    if (f != 6) continue;
    pf->strings = realloc(pf->strings, (pf->nstrings + 1) * sizeof *pf->strings);
    pf->strings[pf->nstrings++] = strndup((const char *)sub.p, (size_t)(sub.end - sub.p));
  }
  cr_assert_gt(pf->nstrings, 0);
  cr_assert_str_eq(pf->strings[0], "", "string_table[0] must be empty");
  r.p = data;
  size_t nfunc_cap = 0;
  while (pb_next(&r, &f, &sub, &v)) {
    unsigned g;
    pb_t s2;
    uint64_t w;
    if (f == 1) { /* sample_type */
      while (pb_next(&sub, &g, &s2, &w))
        if (g == 1) pf->types[pf->ntypes] = (int64_t)w;
      pf->ntypes++;
    } else if (f == 2) { /* sample */
      pf->nsamples++;
      size_t nv = 0, nl = 0;
      while (pb_next(&sub, &g, &s2, &w)) {
        if (g == 2)
          while (s2.p < s2.end) pf->totals[nv++] += (int64_t)pb_varint(&s2);
        if (g == 1)
          while (s2.p < s2.end) {
            uint64_t id = pb_varint(&s2);
            cr_assert(id >= 1, "location id 0");
            nl++;
          }
      }
      cr_assert_eq(nv, 4, "a sample has %zu values", nv);
      cr_assert_gt(nl, 0, "a sample without locations");
    } else if (f == 4) {
      pf->nlocations++;
    } else if (f == 5) { /* function: id, name */
      uint64_t id = 0, name = 0;
      while (pb_next(&sub, &g, &s2, &w)) {
        if (g == 1) id = w;
        if (g == 2) name = w;
        if (g == 3) pf->nsystem_names++;
      }
      cr_assert(id >= 1 && name < pf->nstrings);
      if (id > nfunc_cap) {
        size_t nc = id * 2;
        pf->function_names = realloc(pf->function_names, nc * sizeof(char *));
        memset(pf->function_names + nfunc_cap, 0, (nc - nfunc_cap) * sizeof(char *));
        nfunc_cap = nc;
      }
      pf->function_names[id - 1] = pf->strings[name];
      pf->nfunctions++;
    } else if (f == 14) {
      pf->default_type = (int64_t)v;
    }
  }
  free(data);
}

static void profile_free(profile_t *pf) {
  for (size_t i = 0; i < pf->nstrings; i++) free(pf->strings[i]);
  free(pf->strings);
  free(pf->function_names);
}

/* "total_bytes": N and "total_count": N of `memsnap top --json` output. */
static int64_t json_int(const char *doc, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *p = strstr(doc, k);
  cr_assert(p, "%s not in %s", key, doc);
  return strtoll(p + strlen(k), NULL, 10);
}

static bool have_go(void) {
  if (system("go version >/dev/null 2>&1") == 0) return true;
  printf("SKIP: go tool pprof checks: no 'go' on PATH (apt-get install golang-go)\n");
  return false;
}

/* `go tool pprof -top -unit=B -sample_index=IDX` total, or -1. */
static int64_t go_total(const char *path, const char *index) {
  char cmd[1400];
  snprintf(cmd, sizeof cmd, "go tool pprof -top -unit=B -sample_index=%s '%s' 2>/dev/null", index,
           path);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  char line[4096];
  int64_t total = -1;
  while (fgets(line, sizeof line, p)) {
    /* "Showing nodes accounting for X, P% of TOTALB total" */
    const char *t = strstr(line, "% of ");
    if (strncmp(line, "Showing nodes", 13) == 0 && t) total = strtoll(t + 5, NULL, 10);
  }
  pclose(p);
  return total;
}

Test(export_cli, pprof_totals_equal_top_on_every_fixture) {
  if (!have_fixtures()) return;
  bool go = have_go();
  for (size_t i = 0; i < NFIX; i++) {
    for (int at = 0; at < 2; at++) {
      const char *moment = at ? "end" : "peak";
      run_t r = RUN("export", fx(fixtures[i]), "--pprof", "p.pb.gz", "--at", moment);
      cr_assert_eq(r.status, 0, "%s: %s", fixtures[i], r.err);
      run_free(&r);
      r = RUN("top", fx(fixtures[i]), "--json", "--at", moment);
      cr_assert_eq(r.status, 0, "%s: %s", fixtures[i], r.err);
      int64_t bytes = json_int(r.out, "total_bytes"), count = json_int(r.out, "total_count");
      run_free(&r);
      char path[600];
      snprintf(path, sizeof path, "%s/p.pb.gz", cli_dir);
      profile_t pf;
      profile_decode(path, &pf);
      cr_assert_eq(pf.ntypes, 4);
      static const char *const names[4] = {"alloc_objects", "alloc_space", "inuse_objects",
                                           "inuse_space"};
      for (int k = 0; k < 4; k++) cr_assert_str_eq(pf.strings[pf.types[k]], names[k]);
      cr_assert_str_eq(pf.strings[pf.default_type], "inuse_space");
      cr_assert_eq(pf.totals[3], bytes, "%s at %s: inuse_space", fixtures[i], moment);
      cr_assert_eq(pf.totals[2], count, "%s at %s: inuse_objects", fixtures[i], moment);
      /* alloc_*: every alloc of the default device's trace */
      ms_snapshot_t *s = load(fx(fixtures[i]));
      size_t devs[1], dev = 0;
      ms_tl_viewer_devices(s, devs, 0, &dev);
      int64_t na = 0, sa = 0;
      for (uint32_t k = 0; dev < s->ndevices && k < s->devices[dev].ntrace; k++) {
        const ms_snap_trace_t *e = &s->trace[s->devices[dev].first_trace + k];
        if (e->action != MS_TRACE_ALLOC) continue;
        na++;
        sa += (int64_t)e->size;
      }
      cr_assert_eq(pf.totals[0], na, "%s: alloc_objects", fixtures[i]);
      cr_assert_eq(pf.totals[1], sa, "%s: alloc_space", fixtures[i]);
      cr_assert_eq(pf.nfunctions, s->nframes + 1);
      ms_snapshot_free(s);
      if (go) {
        cr_assert_eq(go_total(path, "inuse_space"), bytes, "%s: go tool pprof", fixtures[i]);
        cr_assert_eq(go_total(path, "inuse_objects"), count);
        cr_assert_eq(go_total(path, "alloc_space"), sa);
        cr_assert_eq(go_total(path, "alloc_objects"), na);
      }
      profile_free(&pf);
    }
  }
}

Test(export_cli, pprof_hostile_names_and_traces) {
  ms_snapshot_t *s = hostile_snapshot();
  char path[600];
  snprintf(path, sizeof path, "%s/h.msgpack", cli_dir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  run_t r = RUN("export", "h.msgpack", "--pprof", "h.pb.gz");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof path, "%s/h.pb.gz", cli_dir);
  profile_t pf;
  profile_decode(path, &pf);
  for (size_t i = 0; i < NHOSTILE; i++) {
    const char *want = hostile[i][0] ? hostile[i] : "<unnamed>";
    cr_assert_str_eq(pf.function_names[i], want);
  }
  cr_assert_eq(pf.totals[3], 4096);
  profile_free(&pf);
  if (have_go()) {
    char cmd[800];
    snprintf(cmd, sizeof cmd,
             "go tool pprof -traces '%s' 2>/dev/null | grep -v ' source: ' | grep -c 'DROP TABLE'",
             path);
    FILE *p = popen(cmd, "r");
    char line[64] = "";
    cr_assert(fgets(line, sizeof line, p));
    pclose(p);
    cr_assert_eq(atoi(line), 1, "go tool pprof -traces shows the stack once");
  }
  ms_snapshot_free(s);
}

/* go tool pprof demangles a function whose name equals its system_name, and its simplifier drops
 * everything between angle brackets: Python's <module> became <unknown>, merged with the others
 * (issue #31 item 5). */
Test(export_cli, pprof_keeps_angle_bracket_names) {
  if (!have_fixtures()) return;
  run_t r = RUN("export", fx("a0kuma_adamw_small"), "--pprof", "m.pb.gz");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  /* without Go: no function has a system_name for pprof to "demangle", and <module> is one */
  char path[700];
  snprintf(path, sizeof path, "%s/m.pb.gz", cli_dir);
  profile_t pf;
  profile_decode(path, &pf);
  cr_assert_eq(pf.nsystem_names, 0);
  size_t modules = 0;
  for (size_t i = 0; i < pf.nfunctions; i++)
    modules += pf.function_names[i] && strcmp(pf.function_names[i], "<module>") == 0;
  cr_assert_geq(modules, 1);
  profile_free(&pf);
  if (!have_go()) return;
  char cmd[1400], line[4096];
  snprintf(cmd, sizeof cmd, "go tool pprof -top -cum -nodecount=1000 '%s/m.pb.gz' 2>/dev/null",
           cli_dir);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  int module = 0, unknown = 0;
  while (fgets(line, sizeof line, p)) {
    module += strstr(line, " <module>") != NULL;
    unknown += strstr(line, "<unknown>") != NULL;
  }
  cr_assert_eq(pclose(p), 0);
  cr_assert_geq(module, 1, "go tool pprof -top shows no <module>");
  cr_assert_eq(unknown, 0, "go tool pprof -top shows <unknown>");
}

Test(export_cli, pprof_strings_are_utf8) {
  ms_snapshot_t *s = named_snapshot(not_utf8, NNOT, false);
  char path[600];
  snprintf(path, sizeof path, "%s/u.msgpack", cli_dir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  run_t r = RUN("export", "u.msgpack", "--pprof", "u.pb.gz");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof path, "%s/u.pb.gz", cli_dir);
  profile_t pf;
  profile_decode(path, &pf);
  for (size_t i = 0; i < NNOT; i++) cr_expect_str_eq(pf.function_names[i], as_utf8[i]);
  profile_free(&pf);
}

/* ---- Chrome trace JSON: parsed by Python's strict json module ------------------------------- */

static bool have_python(void) {
  if (system("python3 -c 'import json' >/dev/null 2>&1") == 0) return true;
  printf("SKIP: Chrome trace JSON checks: no python3\n");
  return false;
}

/* Counts of events by phase ("C b e i M") and the sources of the allocation slices (their names,
 * never the unwinder's frame), from python3's json.load of path (which fails on anything that is
 * not JSON). */
static char *json_summary(const char *path) {
  char cmd[1600];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys,collections\n"
           "d=json.load(open(sys.argv[1]))\n"
           "assert d[\"displayTimeUnit\"]==\"ms\"\n"
           "ev=d[\"traceEvents\"]\n"
           "c=collections.Counter(e[\"ph\"] for e in ev)\n"
           "for e in ev: assert isinstance(e[\"pid\"],int) and isinstance(e[\"name\"],str)\n"
           "for e in ev:\n"
           "  if e[\"ph\"]!=\"M\": assert isinstance(e[\"ts\"],int)\n"
           "op={};seen=set()\n"
           "for e in ev:\n"
           "  if e[\"ph\"]==\"b\":\n"
           "    k=(e[\"cat\"],e[\"id\"]); assert k not in seen, k; seen.add(k); op[k]=e[\"pid\"]\n"
           "  if e[\"ph\"]==\"e\": assert op.pop((e[\"cat\"],e[\"id\"]))==e[\"pid\"], e\n"
           "assert not op, len(op)\n"
           "print(\" \".join(\"%%s=%%d\"%%(k,c[k]) for k in \"CbeiM\"))\n"
           "for e in ev:\n"
           "  if e[\"ph\"] in \"be\": assert \"unwind::unwind\" not in e[\"name\"]\n"
           "  if e[\"ph\"]==\"b\": assert e[\"name\"]==e[\"args\"][\"source\"]\n"
           "  if e[\"ph\"]==\"b\": print(repr(e[\"args\"][\"source\"]))' '%s'",
           path);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  size_t r;
  while ((r = fread(out + n, 1, cap - n - 1, p)) > 0) {
    n += r;
    if (n + 1 == cap) out = realloc(out, cap *= 2);
  }
  out[n] = 0;
  cr_assert_eq(pclose(p), 0, "python3 could not parse %s: %s", path, out);
  return out;
}

/* The counts the mapping of lib/export/perfetto.c gives for a snapshot. */
static void perfetto_expected(const ms_snapshot_t *s, char *buf, size_t cap) {
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK);
  size_t c = 0, b = 0, i = 0, m = 0;
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    size_t n = ms_timeline_nentries(tl, d);
    if (n == 0) continue;
    m++;
    bool timed = false;
    for (size_t k = 0; k < n; k++)
      timed |= (ms_timeline_entry(tl, d, k)->present & MS_TRACE_HAS_TIME) != 0;
    static const ms_tl_metric ms[3] = {MS_TL_ALLOCATED, MS_TL_RESERVED, MS_TL_ACTIVE};
    for (int x = 0; x < 3; x++) {
      const uint64_t *v = ms_timeline_series(tl, d, ms[x]);
      bool first = true;
      uint64_t last = 0;
      for (size_t k = 0; k < n; k++) {
        if (timed && !(ms_timeline_entry(tl, d, k)->present & MS_TRACE_HAS_TIME)) continue;
        if (first) c++, last = v[k], first = false;
        if (v[k + 1] != last) c++, last = v[k + 1];
      }
    }
    bool in_run = false;
    for (size_t k = 0; k < n; k++) {
      const ms_snap_trace_t *e = ms_timeline_entry(tl, d, k);
      bool rel = e->action == MS_TRACE_SEGMENT_FREE || e->action == MS_TRACE_SEGMENT_UNMAP;
      if (rel && !in_run) i++;
      in_run = rel;
      i += e->action == MS_TRACE_OOM || e->action == MS_TRACE_SNAPSHOT;
      b += e->action == MS_TRACE_ALLOC;
    }
  }
  ms_timeline_destroy(tl);
  snprintf(buf, cap, "C=%zu b=%zu e=%zu i=%zu M=%zu\n", c, b, b, i, m);
}

Test(export_cli, perfetto_valid_json_expected_counts) {
  if (!have_fixtures() || !have_python()) return;
  for (size_t i = 0; i < NFIX; i++) {
    run_t r = RUN("export", fx(fixtures[i]), "--perfetto", "t.json", "--allocations");
    cr_assert_eq(r.status, 0, "%s: %s", fixtures[i], r.err);
    run_free(&r);
    char path[600], want[200];
    snprintf(path, sizeof path, "%s/t.json", cli_dir);
    char *got = json_summary(path);
    ms_snapshot_t *s = load(fx(fixtures[i]));
    perfetto_expected(s, want, sizeof want);
    ms_snapshot_free(s);
    cr_assert(strncmp(got, want, strlen(want)) == 0, "%s: got %.80s, want %s", fixtures[i], got,
              want);
    free(got);
    /* without --allocations: no slices */
    r = RUN("export", fx(fixtures[i]), "--perfetto", "t.json");
    cr_assert_eq(r.status, 0);
    run_free(&r);
    got = json_summary(path);
    cr_assert(strstr(got, " b=0 e=0 "), "%s", got);
    free(got);
  }
}

/* Three devices, each with a segment, dev + 2 allocs of 4 KiB and the first of them freed: the
 * alloc entries of the devices share their indexes (1, 2, ...). */
static ms_snapshot_t *three_device_snapshot(void) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  uint32_t fr, stack;
  cr_assert_eq(ms__snapbuild_frame(&b, "<module>", 8, "train.py", 8, 7, &fr), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, &fr, 1, &stack), MS_OK);
  for (int dev = 0; dev < 3; dev++) {
    uint64_t base = 0x7f0000000000ull + ((uint64_t)dev << 32), k = (uint64_t)dev + 2;
    ms_snap_segment_t g;
    memset(&g, 0, sizeof g);
    g.device = dev;
    g.address = base;
    g.total_size = 2 << 20;
    g.allocated_size = g.active_size = g.requested_size = (k - 1) * 4096;
    g.is_large = true;
    g.stack = stack;
    g.nblocks = (uint32_t)k + 1;
    g.first_block = (uint32_t)(dev * (dev + 5) / 2); /* the blocks of the previous segments */
    ms_snap_block_t bl;
    memset(&bl, 0, sizeof bl);
    for (uint64_t i = 0; i <= k; i++) {
      bool live = i > 0 && i < k;
      bl.address = base + i * 4096;
      bl.size = i < k ? 4096 : g.total_size - k * 4096;
      bl.requested_size = live ? 4096 : 0;
      bl.state = live ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
      bl.state_name = live ? "active_allocated" : "inactive";
      bl.stack = live ? stack : MS_SNAP_NO_STACK;
      cr_assert_eq(ms__snapbuild_add_block(&b, &bl), MS_OK);
    }
    cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  }
  for (int dev = 0; dev < 3; dev++) {
    uint64_t base = 0x7f0000000000ull + ((uint64_t)dev << 32), k = (uint64_t)dev + 2;
    ms_snap_trace_t t;
    memset(&t, 0, sizeof t);
    t.present = MS_TRACE_HAS_TIME;
    t.stack = stack;
    t.action = MS_TRACE_SEGMENT_ALLOC;
    t.addr = base;
    t.size = 2 << 20;
    t.time_us = 1000;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
    for (uint64_t i = 0; i < k; i++) {
      t.action = MS_TRACE_ALLOC;
      t.addr = base + i * 4096;
      t.size = 4096;
      t.time_us = 2000 + (int64_t)i;
      cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
    }
    t.addr = base;
    t.time_us = 3000;
    t.action = MS_TRACE_FREE_REQUESTED;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
    t.action = MS_TRACE_FREE_COMPLETED;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
    ms_snap_device_t d;
    memset(&d, 0, sizeof d);
    d.first_trace = (uint32_t)(dev * (dev + 9) / 2); /* the entries of the previous devices */
    d.ntrace = (uint32_t)k + 3;
    cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  }
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

/* Several GPUs: a viewer pairs async events by category and id alone, so the slices of two
 * devices must not share an id; every begin has its end on its own device, one slice per
 * allocation (issue #31 item 1: 154 unmatched events on a 3-device snapshot). */
Test(export_cli, perfetto_slices_of_several_devices) {
  if (!have_python()) return;
  ms_snapshot_t *s = three_device_snapshot();
  char path[600];
  snprintf(path, sizeof path, "%s/3dev.msgpack", cli_dir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  run_t r = RUN("export", "3dev.msgpack", "--perfetto", "3dev.json", "--allocations");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof path, "%s/3dev.json", cli_dir);
  char cmd[1400];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys,collections\n"
           "ev=json.load(open(sys.argv[1]))[\"traceEvents\"]\n"
           "op={}\n"
           "n=collections.Counter()\n"
           "for e in sorted(ev, key=lambda e: (e.get(\"ts\",0), e[\"ph\"]!=\"e\")):\n"
           "  k=(e.get(\"cat\"),e.get(\"id\"))\n"
           "  if e[\"ph\"]==\"b\": assert k not in op, k; op[k]=e[\"pid\"]; n[e[\"pid\"]]+=1\n"
           "  if e[\"ph\"]==\"e\": assert op.pop(k)==e[\"pid\"], e\n"
           "assert not op\n"
           "print(\" \".join(\"%%d:%%d\"%%(p,n[p]) for p in sorted(n)))' '%s'",
           path);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  char line[256] = "";
  cr_assert(fgets(line, sizeof line, p));
  cr_assert_eq(pclose(p), 0, "the slices do not pair: %s", line);
  /* pid = device + 1; device d made d + 2 allocations */
  cr_assert_str_eq(line, "1:2 2:3 3:4\n");
}

/* --range A:B: only the events of entries A..B, and the slices of the allocations alive in the
 * window, clipped to it (issue #31 item 8: a whole 1 GB trace is past V8's string limit).
 * ftcourse has no times, so that a timestamp is an entry index. */
Test(export_cli, perfetto_range_window) {
  if (!have_fixtures() || !have_python()) return;
  run_t r = RUN("export", fx("cranberrii_ftcourse"), "--perfetto", "w.json", "--allocations",
                "--range", "3000:3100");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = RUN("export", fx("cranberrii_ftcourse"), "--perfetto", "f.json", "--allocations");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char cmd[1600];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys\n"
           "w=json.load(open(sys.argv[1]+\"/w.json\"))[\"traceEvents\"]\n"
           "f=json.load(open(sys.argv[1]+\"/f.json\"))[\"traceEvents\"]\n"
           "assert all(3000<=e[\"ts\"]<=3100 for e in w if \"ts\" in e)\n"
           "op={}\n"
           "for e in w:\n"
           "  if e[\"ph\"]==\"b\": op[e[\"id\"]]=e\n"
           "  if e[\"ph\"]==\"e\": assert op.pop(e[\"id\"])[\"pid\"]==e[\"pid\"]\n"
           "assert not op\n"
           "b={e[\"id\"]:e[\"ts\"] for e in f if e[\"ph\"]==\"b\"}\n"
           "want=sum(1 for e in f if e[\"ph\"]==\"e\" and b[e[\"id\"]]<=3100 and e[\"ts\"]>=3000)\n"
           "got=sum(1 for e in w if e[\"ph\"]==\"b\")\n"
           "print(got, want)' '%s'",
           cli_dir);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  char line[128] = "";
  cr_assert(fgets(line, sizeof line, p));
  cr_assert_eq(pclose(p), 0, "%s", line);
  int got = 0, want = -1;
  cr_assert_eq(sscanf(line, "%d %d", &got, &want), 2, "%s", line);
  cr_assert_eq(got, want);
  cr_assert_gt(got, 0);
  r = RUN("export", fx("cranberrii_ftcourse"), "--perfetto", "w.json", "--range", "9:3");
  cr_assert_eq(r.status, 2);
  run_free(&r);
}

Test(export_cli, perfetto_hostile_names) {
  if (!have_python()) return;
  ms_snapshot_t *s = hostile_snapshot();
  char path[600];
  snprintf(path, sizeof path, "%s/h.msgpack", cli_dir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  run_t r = RUN("export", "h.msgpack", "--perfetto", "-", "--allocations");
  cr_assert_eq(r.status, 0, "%s", r.err);
  snprintf(path, sizeof path, "%s/h.json", cli_dir);
  cr_assert_eq(th_write_file(path, r.out, strlen(r.out)), 0);
  run_free(&r);
  char *got = json_summary(path);
  /* no frame's file ends in .py: the source is the innermost frame's name, read back by Python */
  char want[400];
  snprintf(want, sizeof want, "C=6 b=1 e=1 i=0 M=1\n%s\n", "\"'; DROP TABLE trace_rows; --\"");
  cr_assert_str_eq(got, want);
  free(got);
  ms_snapshot_free(s);
}

/* ---- many ranks: memsnap timeline A B C... --------------------------------------------------- */

static int ranks_cmp(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* The value of key in the line of file `file` of the --json output. */
static int64_t ranks_value(const char *doc, const char *file, const char *key) {
  char k[300];
  snprintf(k, sizeof k, "{\"file\": \"%s\"", file);
  const char *line = strstr(doc, k);
  cr_assert(line, "no row for %s in %s", file, doc);
  const char *end = strchr(line, '\n');
  char *row = end ? strndup(line, (size_t)(end - line)) : strdup(line);
  int64_t v = strstr(row, "\"outlier\": true") ? 1 : 0;
  if (strcmp(key, "outlier") != 0) v = json_int(row, key);
  free(row);
  return v;
}

Test(export_cli, timeline_many_ranks) {
  if (!have_fixtures()) return;
  static const char *const names[] = {"a0kuma_adamw_small", "cranberrii_ftcourse",
                                      "maphsge_select_n_4dev",
                                      "wedsonlin_cs336_medium_1024_training"};
  char links[4][32];
  for (int i = 0; i < 4; i++) {
    snprintf(links[i], sizeof links[i], "run_rank%d.pickle", i);
    link_fixture(names[i], links[i]);
  }
  run_t r = RUN("timeline", links[0], links[1], links[2], links[3], "--json", "--jobs", "2");
  cr_assert_eq(r.status, 0, "%s", r.err);
  uint64_t peaks[4];
  for (int i = 0; i < 4; i++) {
    ms_snapshot_t *s = load(fx(names[i]));
    ms_timeline_t *tl = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK);
    ms_tl_peak_t best = {0};
    size_t dev = SIZE_MAX;
    for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
      ms_tl_peak_t p;
      if (ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p) != MS_OK) continue;
      if (dev == SIZE_MAX || p.bytes > best.bytes) best = p, dev = d;
    }
    uint64_t reserved = ms_timeline_series(tl, dev, MS_TL_RESERVED)[best.step];
    ms_timeline_destroy(tl);
    ms_snapshot_free(s);
    peaks[i] = best.bytes;
    cr_assert_eq(ranks_value(r.out, links[i], "rank"), i);
    cr_assert_eq(ranks_value(r.out, links[i], "device"), (int64_t)dev);
    cr_assert_eq(ranks_value(r.out, links[i], "peak_allocated"), (int64_t)best.bytes, "%s",
                 names[i]);
    cr_assert_eq(ranks_value(r.out, links[i], "entry"), best.entry);
    cr_assert_eq(ranks_value(r.out, links[i], "reserved_at_peak"), (int64_t)reserved);
  }
  /* the median of four is the mean of the middle two; outliers are > 1.1 x the median */
  uint64_t sorted[4];
  memcpy(sorted, peaks, sizeof sorted);
  qsort(sorted, 4, sizeof *sorted, ranks_cmp);
  uint64_t med = sorted[1] / 2 + sorted[2] / 2 + (sorted[1] % 2 + sorted[2] % 2) / 2;
  cr_assert_eq(json_int(r.out, "median_peak_allocated"), (int64_t)med);
  for (int i = 0; i < 4; i++)
    cr_assert_eq(ranks_value(r.out, links[i], "outlier"), (double)peaks[i] > 1.1 * (double)med,
                 "%s", names[i]);
  run_free(&r);
  /* text: the highest rank named */
  r = RUN("timeline", links[0], links[1], links[2], links[3]);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "highest peak: rank 3, run_rank3.pickle: "), "%s", r.out);
  run_free(&r);
  /* `top` over the directory: the same rows, files in name order */
  r = RUN("top", cli_dir, "--json");
  cr_assert_eq(r.status, 0, "%s", r.err);
  for (int i = 0; i < 4; i++) {
    char full[600];
    snprintf(full, sizeof full, "%s/%s", cli_dir, links[i]);
    cr_assert_eq(ranks_value(r.out, full, "peak_allocated"), (int64_t)peaks[i]);
    if (i > 0) {
      char prev[600];
      snprintf(prev, sizeof prev, "%s/%s", cli_dir, links[i - 1]);
      const char *rows = strstr(r.out, "\"files\": ["); /* after highest_file */
      cr_assert(rows);
      cr_assert_lt(strstr(rows, prev), strstr(rows, full), "name order");
    }
  }
  /* `stats` over the directory: the same table as `top` and `timeline`; a file in the directory
   * that is not a snapshot (a log) is left out, not reported */
  char logp[600];
  snprintf(logp, sizeof logp, "%s/notes.txt", cli_dir);
  FILE *lf = fopen(logp, "w");
  cr_assert(lf);
  fputs("step 1: loss 2.3\n", lf);
  fclose(lf);
  char *top_out = strdup(r.out);
  run_free(&r);
  r = RUN("stats", cli_dir, "--json");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(!strstr(r.out, "notes.txt"), "%s", r.out);
  for (int i = 0; i < 4; i++) {
    char full[600];
    snprintf(full, sizeof full, "%s/%s", cli_dir, links[i]);
    cr_assert_eq(ranks_value(r.out, full, "peak_allocated"), (int64_t)peaks[i]);
    cr_assert_eq(ranks_value(r.out, full, "peak_allocated"), ranks_value(top_out, full,
                                                                         "peak_allocated"));
  }
  free(top_out);
  run_free(&r);
  r = RUN("stats", links[0], links[1]);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "median peak: "), "%s", r.out);
  run_free(&r);
  r = RUN("stats", links[0], links[1], "--summary");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "with several FILEs only --json, --jobs and --keep-going apply"), "%s",
            r.err);
  run_free(&r);
  r = RUN("stats", links[0], "--jobs", "2");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "option '--jobs' needs several FILEs"), "%s", r.err);
  run_free(&r);
  unlink(logp);
  r = RUN("top", links[0], links[1], "--at", "end");
  cr_assert_eq(r.status, 2);
  run_free(&r);
  /* an unreadable file: its error, the other rows, status 1 */
  r = RUN("timeline", links[0], "nothere.pickle", "--json");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "memsnap: error: ") && strstr(r.err, "nothere.pickle"), "%s", r.err);
  cr_assert(strstr(r.out, "\"file\": \"nothere.pickle\", \"rank\": null, \"error\": "), "%s",
            r.out);
  cr_assert_eq(ranks_value(r.out, links[0], "peak_allocated"), (int64_t)peaks[0]);
  run_free(&r);
  r = RUN("timeline", links[0], links[1], "--segments", "--json");
  cr_assert_eq(r.status, 2);
  run_free(&r);
  r = RUN("timeline", links[0], "--jobs", "2");
  cr_assert_eq(r.status, 2);
  run_free(&r);
}

/* A crashed rank leaves an empty or garbage rankN.pickle: reported, exit 1, unless --keep-going
 * (a warning, exit 0); ranks in numeric order (rank2 before rank10); "highest" is a rank, not
 * the row's index (issue #31 items 7 and 9). */
Test(export_cli, ranks_dir_crashed_dumps) {
  if (!have_fixtures()) return;
  char p[600];
  snprintf(p, sizeof p, "%s/crash", cli_dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  link_fixture("a0kuma_adamw_small", "crash/rank10.pickle");
  link_fixture("cranberrii_ftcourse", "crash/rank2.pickle");
  snprintf(p, sizeof p, "%s/crash/rank3.pickle", cli_dir);
  cr_assert_eq(th_write_file(p, "", 0), 0);
  snprintf(p, sizeof p, "%s/crash/rank4.pickle", cli_dir);
  cr_assert_eq(th_write_file(p, "\x80\x02garbage", 9), 0);
  run_t r = RUN("timeline", "crash", "--json");
  cr_assert_eq(r.status, 1, "%s", r.err);
  cr_assert(strstr(r.err, "memsnap: error: ") && strstr(r.err, "rank3.pickle"), "%s", r.err);
  cr_assert(strstr(r.err, "rank4.pickle"), "%s", r.err);
  run_free(&r);
  r = RUN("top", "crash", "--json", "--keep-going");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.err, "memsnap: warning: skipped ") && strstr(r.err, "rank3.pickle"), "%s",
            r.err);
  cr_assert(strstr(r.err, "rank4.pickle"), "%s", r.err);
  const char *r2 = strstr(r.out, "crash/rank2.pickle"), *r3 = strstr(r.out, "crash/rank3.pickle");
  const char *r10 = strstr(r.out, "crash/rank10.pickle");
  cr_assert(r2 && r3 && r10 && r2 < r3 && r3 < r10, "numeric order: %s", r.out);
  /* ftcourse (rank 2) peaks far above adamw (rank 10) */
  cr_assert_eq(json_int(r.out, "highest"), 2, "%s", r.out);
  run_free(&r);
}

/* `export --csv DIR`: gzip'd CSV that Python's csv module reads, with as many rows per table as
 * the SQLite export of the same files (issue #31, past one machine). */
Test(export_cli, csv_rows_equal_sqlite) {
  if (!have_fixtures() || !have_python()) return;
  link_fixture("a0kuma_adamw_small", "c_rank0.pickle");
  link_fixture("maphsge_select_n_4dev", "c_rank1.pickle");
  link_fixture("yiyi_flexgen_oom_legacy", "c_rank2.pickle");
  run_t r = RUN("export", "c_rank0.pickle", "c_rank1.pickle", "c_rank2.pickle", "--csv", "csv");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = RUN("export", "c_rank0.pickle", "c_rank1.pickle", "c_rank2.pickle", "--sqlite", "c.db");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char path[700], cmd[1600];
  snprintf(path, sizeof path, "%s/c.db", cli_dir);
  sqlite3 *db = db_open(path);
  char want[400];
  snprintf(want, sizeof want, "snapshots=%lld peaks=%lld allocations=%lld trace=%lld stacks=%lld\n",
           (long long)q_int(db, "SELECT count(*) FROM snapshot"),
           (long long)q_int(db, "SELECT count(*) FROM snapshot"),
           (long long)q_int(db, "SELECT count(*) FROM allocations"),
           (long long)q_int(db, "SELECT count(*) FROM trace_rows"),
           (long long)q_int(db, "SELECT count(*) FROM stacks"));
  cr_assert_gt(q_int(db, "SELECT count(*) FROM allocations"), 0);
  sqlite3_close(db);
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import csv,gzip,sys\n"
           "out=[]\n"
           "for t in (\"snapshots\",\"peaks\",\"allocations\",\"trace\",\"stacks\"):\n"
           "  rows=list(csv.reader(gzip.open(sys.argv[1]+\"/\"+t+\".csv.gz\",\"rt\",newline=\"\")))\n"
           "  assert all(len(x)==len(rows[0]) for x in rows), t\n"
           "  out.append(\"%%s=%%d\"%%(t,len(rows)-1))\n"
           "print(\" \".join(out))' '%s/csv'",
           cli_dir);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  char got[400] = "";
  cr_assert(fgets(got, sizeof got, p));
  cr_assert_eq(pclose(p), 0, "%s", got);
  cr_assert_str_eq(got, want);
  /* the five files and nothing else: no temporary file left behind */
  snprintf(cmd, sizeof cmd, "ls -A '%s/csv' | tr '\\n' ' '", cli_dir);
  p = popen(cmd, "r");
  cr_assert(fgets(got, sizeof got, p));
  pclose(p);
  cr_assert_str_eq(got, "allocations.csv.gz peaks.csv.gz snapshots.csv.gz stacks.csv.gz "
                        "trace.csv.gz ");
  /* --jobs: the same text with one compressing thread and with four, and each file one gzip
   * member (Python's zlib: the stream ends and nothing follows it) */
  r = RUN("export", "c_rank0.pickle", "c_rank1.pickle", "c_rank2.pickle", "--csv", "csv1",
          "--jobs", "1");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = RUN("export", "c_rank0.pickle", "c_rank1.pickle", "c_rank2.pickle", "--csv", "csv4",
          "--jobs", "4");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  snprintf(cmd, sizeof cmd,
           "cd '%s' && python3 -c 'import gzip,zlib\n"
           "for t in (\"snapshots\",\"peaks\",\"allocations\",\"trace\",\"stacks\"):\n"
           "  one=gzip.open(\"csv1/\"+t+\".csv.gz\").read()\n"
           "  for j in (\"csv\",\"csv4\"):\n"
           "    d=zlib.decompressobj(31)\n"
           "    text=d.decompress(open(j+\"/\"+t+\".csv.gz\",\"rb\").read())\n"
           "    assert d.eof and d.unused_data==b\"\" and text==one, (j,t)\n"
           "print(\"same\")'",
           cli_dir);
  p = popen(cmd, "r");
  cr_assert(fgets(got, sizeof got, p));
  cr_assert_eq(pclose(p), 0, "%s", got);
  cr_assert_str_eq(got, "same\n");
  r = RUN("export", "c_rank0.pickle", "--csv", "csv5", "--jobs", "0");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "memsnap: error: option '--jobs' needs a number from 1 to 256, not "
                          "'0'\n"), "%s", r.err);
  run_free(&r);
  r = RUN("export", "c_rank0.pickle", "--sqlite", "c5.db", "--jobs", "2");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "memsnap: error: --jobs goes with --csv\n"), "%s", r.err);
  run_free(&r);
  /* complete or nothing: a file that cannot be read leaves no CSV file, nor a temporary one */
  char bad[700];
  snprintf(bad, sizeof bad, "%s/c_rank3.pickle", cli_dir);
  cr_assert_eq(th_write_file(bad, "\x80\x02garbage", 9), 0);
  r = RUN("export", "c_rank0.pickle", "c_rank3.pickle", "--csv", "csv2");
  cr_assert_eq(r.status, 1, "%s", r.err);
  cr_assert(strstr(r.err, "c_rank3.pickle"), "%s", r.err);
  run_free(&r);
  snprintf(cmd, sizeof cmd, "ls -A '%s/csv2' | wc -l", cli_dir);
  p = popen(cmd, "r");
  cr_assert(fgets(got, sizeof got, p));
  pclose(p);
  cr_assert_eq(atoi(got), 0, "files left in csv2");
}

/* `memsnap summary FILE --json` per rank, merged by `timeline --from-summaries DIR`: the same
 * output as `timeline` over the files (issue #31, past one machine). */
Test(export_cli, summaries_merge_as_timeline) {
  if (!have_fixtures()) return;
  static const char *const names[] = {"a0kuma_adamw_small", "cranberrii_ftcourse",
                                      "maphsge_select_n_4dev"};
  static const char *const links[] = {"sum_rank0.pickle", "sum_rank1.pickle",
                                      "sum_rank10.pickle"};
  char p[700];
  snprintf(p, sizeof p, "%s/sums", cli_dir);
  cr_assert_eq(mkdir(p, 0755), 0);
  for (int i = 0; i < 3; i++) {
    link_fixture(names[i], links[i]);
    run_t r = RUN("summary", links[i], "--json");
    cr_assert_eq(r.status, 0, "%s", r.err);
    cr_assert_eq(strchr(r.out, '\n'), r.out + strlen(r.out) - 1, "one line: %s", r.out);
    snprintf(p, sizeof p, "%s/sums/%d.json", cli_dir, i);
    cr_assert_eq(th_write_file(p, r.out, strlen(r.out)), 0);
    run_free(&r);
  }
  run_t a = RUN("timeline", "--from-summaries", "sums", "--json");
  cr_assert_eq(a.status, 0, "%s", a.err);
  run_t b = RUN("timeline", links[0], links[1], links[2], "--json");
  cr_assert_eq(b.status, 0, "%s", b.err);
  cr_assert_str_eq(a.out, b.out);
  run_free(&a);
  run_free(&b);
  /* a crashed rank's summary: reported, exit 1, unless --keep-going */
  snprintf(p, sizeof p, "%s/sums/9.json", cli_dir);
  cr_assert_eq(th_write_file(p, "{\"file\": \"x", 12), 0);
  a = RUN("timeline", "--from-summaries", "sums");
  cr_assert_eq(a.status, 1, "%s", a.err);
  cr_assert(strstr(a.err, "9.json") && strstr(a.err, "not a summary"), "%s", a.err);
  run_free(&a);
  a = RUN("timeline", "--from-summaries", "sums", "--keep-going");
  cr_assert_eq(a.status, 0, "%s", a.err);
  cr_assert(strstr(a.err, "memsnap: warning: skipped "), "%s", a.err);
  run_free(&a);
  /* an unreadable snapshot: its error row, exit 1 */
  snprintf(p, sizeof p, "%s/sum_rank5.pickle", cli_dir);
  cr_assert_eq(th_write_file(p, "", 0), 0);
  a = RUN("summary", "sum_rank5.pickle", "--json");
  cr_assert_eq(a.status, 1);
  cr_assert(strstr(a.out, "{\"file\": \"sum_rank5.pickle\", \"rank\": 5, \"error\": "), "%s",
            a.out);
  run_free(&a);
}

/* The line of out that begins (after spaces) with `{"index": N,`, or NULL. */
static char *trace_record(const char *out, int n) {
  char k[64];
  snprintf(k, sizeof k, "{\"index\": %d,", n);
  const char *p = strstr(out, k);
  if (!p) return NULL;
  const char *e = strchr(p, '\n');
  char *rec = e ? strndup(p, (size_t)(e - p)) : strdup(p);
  size_t len = strlen(rec);
  if (len && rec[len - 1] == ',') rec[len - 1] = 0; /* the separator before the next record */
  return rec;
}

/* `trace --json --range A:B` numbers the entries A..B as the whole trace does, not from 0
 * (issue #31 item 9). */
Test(export_cli, trace_json_range_keeps_the_numbering) {
  if (!have_fixtures()) return;
  run_t all = RUN("trace", fx("a0kuma_adamw_small"), "--json");
  cr_assert_eq(all.status, 0, "%s", all.err);
  run_t r = RUN("trace", fx("a0kuma_adamw_small"), "--json", "--range", "5:8");
  cr_assert_eq(r.status, 0, "%s", r.err);
  int n = 0;
  for (const char *p = r.out; (p = strstr(p, "{\"index\": ")); p++) n++;
  cr_assert_eq(n, 4, "%s", r.out);
  for (int i = 5; i <= 8; i++) {
    char *a = trace_record(all.out, i), *b = trace_record(r.out, i);
    cr_assert(a && b, "entry %d: %s", i, r.out);
    cr_assert_str_eq(b, a);
    free(a);
    free(b);
  }
  run_free(&r);
  run_free(&all);
}

Test(export_cli, sqlite_inconsistent_trace_keeps_the_rest) {
  ms_snapshot_t *s = hostile_snapshot_ex(true);
  char path[600];
  snprintf(path, sizeof path, "%s/broken.msgpack", cli_dir);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  run_t r = RUN("export", "broken.msgpack", "--sqlite", "b.db");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.err, "memsnap: warning: 'broken.msgpack': no timeline rows: "), "%s", r.err);
  run_free(&r);
  snprintf(path, sizeof path, "%s/b.db", cli_dir);
  sqlite3 *db = db_open(path);
  cr_assert_eq(q_int(db, "SELECT count(*) FROM device_traces"), 3);
  cr_assert_eq(q_int(db, "SELECT count(*) FROM timeline"), 0);
  char *t = q_text(db, "SELECT timeline_error FROM snapshot");
  cr_assert(strstr(t, "trace entry 2"), "%s", t);
  free(t);
  sqlite3_close(db);
  /* the formats that need the index fail cleanly, leaving nothing */
  r = RUN("export", "broken.msgpack", "--pprof", "b.pb.gz");
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "memsnap: error: 'broken.msgpack': "), "%s", r.err);
  run_free(&r);
  r = RUN("export", "broken.msgpack", "--perfetto", "b.json");
  cr_assert_eq(r.status, 1);
  run_free(&r);
  cr_assert_eq(th_dir_count(cli_dir), 2, "only the input and b.db");
}

/* ---- the JSON strings of the exports --------------------------------------------------------- */

#include "export/internal.h"
#include "export/pgzip.h"

Test(export, json_strings_escaped_and_valid_utf8) {
  static const struct {
    const char *in, *out;
  } cases[] = {
      {"plain", "\"plain\""},
      {"\"q\" \\b\\", "\"\\\"q\\\" \\\\b\\\\\""},
      {"<a href='x'>&amp;</a>", "\"<a href='x'>&amp;</a>\""},
      {"\x01\x1f\n\t\r\x7f", "\"\\u0001\\u001f\\n\\t\\u000d\x7f\""},
      {"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80", "\"caf\xc3\xa9 \xe2\x9c\x93 \xf0\x9f\x98\x80\""},
      {"bad\xff" "x\xc3(\xe0\x80\x80\xed\xa0\x80\xf4\x90\x80\x80\xc3", /* stray, cut, overlong,
                                                                          surrogate, > U+10FFFF */
       "\"bad\\ufffdx\\ufffd(\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd\\ufffd"
       "\\ufffd\\ufffd\""},
      {"", "\"\""},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
    ms__xbuf_t b = {0};
    ms__xbuf_json_str(&b, cases[i].in);
    cr_assert_str_eq(ms__xbuf_cstr(&b), cases[i].out, "case %zu: %s", i, ms__xbuf_cstr(&b));
    ms__xbuf_release(&b);
  }
}

/* ---- CSV straight from the snapshots ---------------------------------------------------------- */

static int csv_file_write(void *ctx, const char *buf, size_t len) {
  return fwrite(buf, 1, len, ctx) == len ? MS_OK : MS_EIO;
}

/* gz[0..ngz) is one standard gzip member and nothing after it: its text is want[0..n), and its
 * trailer holds the text's CRC-32 and its length mod 2^32. */
static void expect_one_gzip_member(const unsigned char *gz, size_t ngz, const unsigned char *want,
                                   size_t n, const char *what) {
  cr_assert_geq(ngz, 18, "%s: %zu bytes", what);
  cr_assert(gz[0] == 0x1f && gz[1] == 0x8b && gz[2] == 8 && gz[3] == 0, "%s: header", what);
  z_stream zs;
  memset(&zs, 0, sizeof zs);
  cr_assert_eq(inflateInit2(&zs, 16 + MAX_WBITS), Z_OK);
  unsigned char *out = malloc(n + 1);
  zs.next_in = (Bytef *)(uintptr_t)gz;
  zs.avail_in = (uInt)ngz;
  zs.next_out = out;
  zs.avail_out = (uInt)(n + 1);
  int rc = inflate(&zs, Z_FINISH);
  cr_assert_eq(rc, Z_STREAM_END, "%s: inflate %d (%s)", what, rc, zs.msg ? zs.msg : "");
  cr_assert_eq(zs.avail_in, 0, "%s: %u bytes after the first member", what, zs.avail_in);
  cr_assert_eq(zs.total_out, n, "%s: %lu bytes, not %zu", what, zs.total_out, n);
  cr_assert(n == 0 || memcmp(out, want, n) == 0, "%s: the text differs", what);
  inflateEnd(&zs);
  free(out);
  uint32_t crc = (uint32_t)crc32(0L, want, (uInt)n), len = (uint32_t)n;
  const unsigned char *t = gz + ngz - 8;
  for (int i = 0; i < 4; i++) {
    cr_assert_eq(t[i], (unsigned char)(crc >> (8 * i)), "%s: CRC byte %d", what, i);
    cr_assert_eq(t[4 + i], (unsigned char)(len >> (8 * i)), "%s: length byte %d", what, i);
  }
}

static unsigned char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  cr_assert(f, "%s", path);
  size_t cap = 1 << 16;
  unsigned char *b = malloc(cap);
  *n = 0;
  for (size_t r; (r = fread(b + *n, 1, cap - *n, f)) > 0;)
    if ((*n += r) == cap) b = realloc(b, cap *= 2);
  fclose(f);
  return b;
}

typedef struct membuf_s {
  unsigned char *p;
  size_t n, cap;
  int fail_after; /* a write error after this many writes (-1: never) */
} membuf_t;

static int membuf_write(void *ctx, const char *buf, size_t len) {
  membuf_t *m = ctx;
  if (m->fail_after == 0) return MS_EIO;
  if (m->fail_after > 0) m->fail_after--;
  while (m->n + len > m->cap) m->p = realloc(m->p, m->cap = m->cap ? 2 * m->cap : 4096);
  memcpy(m->p + m->n, buf, len);
  m->n += len;
  return MS_OK;
}

/* The parallel gzip writer (lib/export/pgzip.c): 6 MiB of CSV-like text handed over in chunks that
 * end at odd places (1 byte, 7, one short of deflate's window, the window, one past, a whole
 * buffer, nothing) on three workers: one gzip member whose text and trailer are right; the same
 * with no text at all; a sink's error comes back from the write or the finish. */
Test(export, pgzip_one_member_any_chunks) {
  enum { CAP = 1 << 20 };
  size_t n = (size_t)6 << 20;
  unsigned char *text = malloc(n);
  uint64_t r = 88172645463325252u;
  for (size_t i = 0, row = 0; i < n; row++) {
    char line[64];
    r ^= r << 13, r ^= r >> 7, r ^= r << 17;
    int k = snprintf(line, sizeof line, "0,3,%zu,\"alloc\",%" PRIu64 ",512,0,%zu\r\n", row,
                     r % 1000000007u, row * 17);
    for (int j = 0; j < k && i < n; j++) text[i++] = (unsigned char)line[j];
  }
  static const size_t sizes[] = {1, 7, 32767, 32768, 32769, CAP, 0, 100003, 3, 65537, 999999};
  ms__pgz_pool_t *pool = NULL;
  cr_assert_eq(ms__pgz_pool_create(0, 1, &pool), MS_EINVAL);
  cr_assert_eq(ms__pgz_pool_create(3, 0, &pool), MS_EINVAL);
  cr_assert_eq(ms__pgz_pool_create(3, 1, &pool), MS_OK);
  for (int pass = 0; pass < 2; pass++) {
    size_t len = pass ? 0 : n; /* the second: no text */
    membuf_t m = {NULL, 0, 0, -1};
    ms_sink_t sink = {membuf_write, &m};
    ms__pgz_t *z = NULL;
    cr_assert_eq(ms__pgz_create(pool, &sink, CAP, &z), MS_OK);
    char *buf = ms__pgz_buffer(z);
    size_t chunks = 0;
    for (size_t at = 0, i = 0; at < len; i++) {
      size_t k = sizes[i % (sizeof sizes / sizeof *sizes)];
      if (k > len - at) k = len - at;
      memcpy(buf, text + at, k);
      cr_assert_eq(ms__pgz_write(z, &buf, k), MS_OK);
      at += k;
      chunks += k > 0;
    }
    cr_assert_eq(ms__pgz_finish(z), MS_OK);
    free(buf);
    ms__pgz_destroy(z);
    cr_assert_eq(chunks, pass ? 0 : 30);
    expect_one_gzip_member(m.p, m.n, text, len, pass ? "no text" : "6 MiB");
    cr_assert_lt(m.n, pass ? 64 : n / 3, "%zu bytes", m.n);
    free(m.p);
  }
  for (int fail_after = 0; fail_after < 3; fail_after += 2) {
    membuf_t m = {NULL, 0, 0, fail_after};
    ms_sink_t sink = {membuf_write, &m};
    ms__pgz_t *z = NULL;
    cr_assert_eq(ms__pgz_create(pool, &sink, CAP, &z), MS_OK);
    char *buf = ms__pgz_buffer(z);
    int err = MS_OK;
    for (size_t at = 0; at < n && err == MS_OK; at += CAP) {
      memcpy(buf, text + at, CAP);
      err = ms__pgz_write(z, &buf, CAP);
    }
    if (err == MS_OK) err = ms__pgz_finish(z);
    cr_assert_eq(err, MS_EIO);
    cr_assert_eq(ms__pgz_finish(z), MS_EIO); /* sticky */
    free(buf);
    ms__pgz_destroy(z);
    free(m.p);
  }
  ms__pgz_pool_destroy(pool);
  free(text);
}

/* ms_export_csv writes the bytes that ms_export_sqlite_csv reads back from a database of the same
 * files (issue #31: the CSV export no longer goes through SQLite): three fixtures (one with four
 * devices, one legacy), hostile and non-UTF-8 names, a file without a time index (its error in
 * its row), a file without a rank, and byte for byte after gunzip. */
Test(export, csv_bytes_equal_sqlite_csv) {
  if (!have_fixtures()) return;
  char *dir = th_tmpdir();
  static const char *const fxs[] = {"a0kuma_adamw_small", "maphsge_select_n_4dev",
                                    "yiyi_flexgen_oom_legacy"};
  enum { NS = 7 };
  ms_snapshot_t *snaps[NS];
  const char *names[NS] = {"rank0.pickle", "multi\"dev\".pickle", "legacy.pickle", hostile[3],
                           not_utf8[2], "long.pickle", "broken.pickle"};
  for (int i = 0; i < 3; i++) snaps[i] = load(fx(fxs[i]));
  snaps[3] = hostile_snapshot();
  snaps[4] = named_snapshot(not_utf8, NNOT, false);
  /* a frame name of 3 MiB with quotes: longer than the writer's buffer */
  size_t nlong = (size_t)3 << 20;
  char *longname = malloc(nlong + 1);
  for (size_t k = 0; k < nlong; k++) longname[k] = k % 61 == 0 ? '"' : (char)('a' + k % 26);
  longname[nlong] = 0;
  const char *const longnames[] = {longname, "short"};
  snaps[5] = named_snapshot(longnames, 2, false);
  free(longname);
  snaps[6] = hostile_snapshot_ex(true);
  char db[1200], a[1200], b[1200];
  snprintf(db, sizeof db, "%s/c.db", dir);
  snprintf(a, sizeof a, "%s/a", dir);
  snprintf(b, sizeof b, "%s/b", dir);
  cr_assert_eq(mkdir(a, 0755), 0);
  cr_assert_eq(mkdir(b, 0755), 0);
  ms_export_sqlite_t *x = NULL;
  ms_export_csv_t *c = NULL;
  ms_errbuf_t eb = {{0}};
  FILE *f[MS_EXPORT_CSV_NFILES];
  ms_sink_t sink[MS_EXPORT_CSV_NFILES], *sinks[MS_EXPORT_CSV_NFILES];
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) {
    char p[1300];
    snprintf(p, sizeof p, "%s/%s", b, ms_export_csv_file_name(k));
    cr_assert(f[k] = fopen(p, "wb"), "%s", p);
    sink[k] = (ms_sink_t){csv_file_write, f[k]};
    sinks[k] = &sink[k];
  }
  cr_assert_eq(ms_export_csv_file_name(MS_EXPORT_CSV_NFILES), NULL);
  cr_assert_eq(ms_export_csv_create(sinks, 0, &c, &eb), MS_EINVAL);
  cr_assert_eq(ms_export_csv_create(sinks, 1, &c, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_export_csv_jobs(c, 0, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "0 compressing jobs is not 1 to 256");
  cr_assert_eq(ms_export_csv_jobs(c, 3, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_export_sqlite_create(db, &x, &eb), MS_OK, "%s", eb.msg);
  uint64_t ntrace = 0;
  for (int i = 0; i < NS; i++) {
    ms_timeline_t *tl = NULL;
    const char *why = NULL;
    if (ms_timeline_create(snaps[i], NULL, &tl, &eb) != MS_OK) why = eb.msg;
    cr_assert_eq(why != NULL, i == NS - 1, "%s: %s", names[i], eb.msg);
    bool has_rank = i != 2;
    ms_errbuf_t e2 = {{0}};
    cr_assert_eq(ms_export_sqlite_add(x, snaps[i], tl, names[i], has_rank, i * 7, why, &e2), MS_OK,
                 "%s", e2.msg);
    cr_assert_eq(ms_export_csv_add(c, snaps[i], tl, names[i], has_rank, i * 7, why, &e2), MS_OK,
                 "%s", e2.msg);
    cr_assert_eq(ms_export_csv_jobs(c, 2, &e2), MS_EINVAL);
    cr_assert_str_eq(e2.msg, "the jobs are set before the first file is added");
    ntrace += snaps[i]->ntrace;
    ms_timeline_destroy(tl);
  }
  cr_assert_eq(ms_export_csv_rows(c, MS_EXPORT_CSV_SNAPSHOTS), NS);
  cr_assert_eq(ms_export_csv_rows(c, MS_EXPORT_CSV_TRACE), ntrace);
  cr_assert_eq(ms_export_sqlite_finish(x, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_export_csv_finish(c, &eb), MS_OK, "%s", eb.msg);
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) cr_assert_eq(fclose(f[k]), 0);
  cr_assert_eq(ms_export_sqlite_csv(db, a, &eb), MS_OK, "%s", eb.msg);
  for (int k = 0; k < MS_EXPORT_CSV_NFILES; k++) {
    char pa[1300], pb[1300];
    snprintf(pa, sizeof pa, "%s/%s", a, ms_export_csv_file_name(k));
    snprintf(pb, sizeof pb, "%s/%s", b, ms_export_csv_file_name(k));
    size_t na, nb;
    unsigned char *ta = gunzip(pa, &na), *tb = gunzip(pb, &nb);
    size_t at = 0;
    while (at < na && at < nb && ta[at] == tb[at]) at++;
    size_t from = at > 20 ? at - 20 : 0;
    cr_expect(na == nb && at == na, "%s: differs at byte %zu of %zu/%zu: '%.*s' vs '%.*s'",
              ms_export_csv_file_name(k), at, na, nb, (int)(na - from < 60 ? na - from : 60),
              (const char *)ta + from, (int)(nb - from < 60 ? nb - from : 60),
              (const char *)tb + from);
    /* compressed on three threads, still one gzip member with its trailer */
    size_t ngz;
    unsigned char *gz = slurp(pb, &ngz);
    expect_one_gzip_member(gz, ngz, tb, nb, ms_export_csv_file_name(k));
    free(gz);
    free(ta);
    free(tb);
  }
  for (int i = 0; i < NS; i++) ms_snapshot_free(snaps[i]);
  th_rmdir(dir);
  free(dir);
}

/* --downsample N: each device's counters in N runs of entries, of each its lowest and highest
 * total: at most 2N + 1 events per counter, with the whole series' highest and lowest values, and
 * every value one the whole trace has (issue #31 item 8: a 1 GB trace's counters are millions of
 * events). */
Test(export_cli, perfetto_downsampled_counters) {
  if (!have_fixtures() || !have_python()) return;
  run_t r = RUN("export", fx("cranberrii_ftcourse"), "--perfetto", "d.json", "--downsample", "50");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  r = RUN("export", fx("cranberrii_ftcourse"), "--perfetto", "f.json");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char cmd[1600];
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import json,sys\n"
           "def series(p):\n"
           "  s={}\n"
           "  for e in json.load(open(sys.argv[1]+p))[\"traceEvents\"]:\n"
           "    if e[\"ph\"]==\"C\": s.setdefault((e[\"pid\"],e[\"name\"]),[]).append(e)\n"
           "  return s\n"
           "d=series(\"/d.json\"); f=series(\"/f.json\")\n"
           "assert d.keys()==f.keys() and len(d)==3, (d.keys(),f.keys())\n"
           "for k in f:\n"
           "  dv=[e[\"args\"][\"bytes\"] for e in d[k]]; fv=[e[\"args\"][\"bytes\"] for e in f[k]]\n"
           "  assert len(dv)<=101 and len(fv)>len(dv), (k,len(dv),len(fv))\n"
           "  assert max(dv)==max(fv) and min(dv)==min(fv), k\n"
           "  assert set(dv)<=set(fv), k\n"
           "  ts=[e[\"ts\"] for e in d[k]]; assert ts==sorted(ts), k\n"
           "print(sum(len(v) for v in d.values()), sum(len(v) for v in f.values()))' '%s'",
           cli_dir);
  FILE *p = popen(cmd, "r");
  cr_assert(p);
  char line[128] = "";
  cr_assert(fgets(line, sizeof line, p));
  cr_assert_eq(pclose(p), 0, "%s", line);
  int nd = 0, nf = 0;
  cr_assert_eq(sscanf(line, "%d %d", &nd, &nf), 2, "%s", line);
  cr_assert_gt(nd, 3);
  cr_assert_lt(nd, nf);
  r = RUN("export", fx("cranberrii_ftcourse"), "--perfetto", "d.json", "--downsample", "0");
  cr_assert_eq(r.status, 2);
  cr_assert(strstr(r.err, "option '--downsample' needs a number of runs from 1"), "%s", r.err);
  run_free(&r);
  r = RUN("export", fx("cranberrii_ftcourse"), "--pprof", "d.pb.gz", "--downsample", "5");
  cr_assert_eq(r.status, 2);
  run_free(&r);
}
