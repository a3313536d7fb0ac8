/* SPDX-License-Identifier: MIT
 * memsnap exports: snapshots into a SQLite database (issue #17 §1). The only file that includes
 * sqlite3.h. The schema (docs/exports.md) follows PyTorch's _dump_snapshot_sqlite proposal
 * (device_traces, blocks, segments) so that queries written for it work here, with a file_id and
 * rank on every row so that many ranks share one database, plus memsnap's own tables: stacks and
 * locations (every stack stored once, `frames` giving it back as PyTorch's JSON list), timeline
 * (the four totals after every entry) and snapshot (one row per file); and (issue #27) the
 * category and source of every allocated block, and allocations: one row per block lifetime
 * (alloc and free entries and times, sizes, stack, source, category), so that SQL answers
 * `memsnap top` and "alive at entry N or time T" as range queries; "alive at time T" reads, for
 * each length class of lifetimes (life_class, life_classes), only the lifetimes of that class
 * allocated within its length before T (issue #31: a scan of every earlier allocation took
 * seconds on a 1 GB database).
 *
 * Speed: every row goes in through a prepared statement inside one transaction, with no journal
 * (the database is a temporary file that the caller renames only when everything succeeded, so
 * the journal would protect nothing). The tables are plain rowid tables, appended to in rowid
 * order (SQLite's cheapest insert: no key compare, no page split in the middle); their keys, e.g.
 * (file_id, device, id) of a trace entry, are unique indexes built once at the end with the other
 * indexes. (WITHOUT ROWID tables keyed by (file_id, ...) cost more: a key compare per insert, the
 * whole row in interior pages, and the key columns again in every secondary index.) An index
 * puts its most distinct column first, (id, device, file_id) rather than (file_id, device, id):
 * equality lookups use it the same, and SQLite's sorter, which compares the first column inline,
 * builds it faster (file_id is the same for a whole file).
 */
#include <inttypes.h>
#include <sqlite3.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "attribution/internal.h"
#include "common/internal.h"
#include "export/internal.h"
#include "memsnap/export.h"
#include "timeline/internal.h"

/* The frames of a stack as PyTorch's JSON list [{"filename", "line", "name"}, ...], innermost
 * first, rebuilt from stacks and locations; NULL when the row has no stack. */
#define SQL_FRAMES(T)                                                                          \
  "CASE WHEN " T ".frames_id IS NULL THEN NULL ELSE (SELECT json_group_array(json_object("     \
  "'filename', q.filename, 'line', q.line, 'name', q.name)) FROM (SELECT l.filename, l.line, " \
  "l.name FROM stacks s, json_each(s.location_ids) j JOIN locations l ON l.file_id = "         \
  "s.file_id AND l.id = j.value WHERE s.file_id = " T ".file_id AND s.id = " T ".frames_id "   \
  "ORDER BY j.key) q) END"

static const char sqlite_schema[] =
    "PRAGMA journal_mode = OFF;\n"
    "PRAGMA synchronous = OFF;\n"
    "PRAGMA page_size = 32768;\n"
    "PRAGMA cache_size = -65536;\n"
    "PRAGMA locking_mode = EXCLUSIVE;\n"
    "PRAGMA application_id = 1836278131;\n" /* "mems" */
    "PRAGMA user_version = 2;\n" /* 2: allocations.life_class, life_classes */
    "CREATE TABLE snapshot (file_id INTEGER PRIMARY KEY, file TEXT NOT NULL, rank INTEGER,\n"
    "  producer TEXT NOT NULL, settings TEXT NOT NULL, devices INTEGER NOT NULL,\n"
    "  segments INTEGER NOT NULL, blocks INTEGER NOT NULL, trace_entries INTEGER NOT NULL,\n"
    "  trace_dropped INTEGER NOT NULL, timeline_error TEXT, peak_allocated INTEGER,\n"
    "  peak_device INTEGER, peak_entry INTEGER, peak_time_us INTEGER);\n"
    "CREATE TABLE locations (file_id INTEGER NOT NULL, id INTEGER NOT NULL, name TEXT NOT NULL,\n"
    "  filename TEXT NOT NULL, line INTEGER NOT NULL);\n"
    "CREATE TABLE stacks (file_id INTEGER NOT NULL, id INTEGER NOT NULL, depth INTEGER NOT NULL,\n"
    "  location_ids TEXT NOT NULL);\n"
    "CREATE TABLE segments (file_id INTEGER NOT NULL, rank INTEGER, id INTEGER NOT NULL,\n"
    "  device INTEGER NOT NULL, address INTEGER NOT NULL, total_size INTEGER NOT NULL,\n"
    "  allocated_size INTEGER NOT NULL, active_size INTEGER NOT NULL,\n"
    "  requested_size INTEGER NOT NULL, stream INTEGER NOT NULL, segment_type TEXT NOT NULL,\n"
    "  pool_id TEXT NOT NULL, is_expandable INTEGER NOT NULL, frames_id INTEGER);\n"
    "CREATE TABLE block_rows (file_id INTEGER NOT NULL, rank INTEGER, id INTEGER NOT NULL,\n"
    "  segment_id INTEGER NOT NULL, addr INTEGER NOT NULL, size INTEGER NOT NULL,\n"
    "  requested_size INTEGER NOT NULL, state TEXT NOT NULL, frames_id INTEGER,\n"
    "  category TEXT, source TEXT);\n"
    "CREATE TABLE allocations (file_id INTEGER NOT NULL, rank INTEGER, device INTEGER NOT NULL,\n"
    "  id INTEGER NOT NULL, alloc_entry INTEGER NOT NULL, free_requested_entry INTEGER,\n"
    "  free_entry INTEGER, alloc_time_us INTEGER, free_time_us INTEGER, addr INTEGER NOT NULL,\n"
    "  size INTEGER NOT NULL, requested_size INTEGER NOT NULL, stream INTEGER NOT NULL,\n"
    "  frames_id INTEGER, source TEXT NOT NULL, category TEXT NOT NULL,\n"
    "  life_class INTEGER NOT NULL);\n"
    /* "alive at T" reads each class of lifetimes only in the window of its length before T */
    "CREATE TABLE life_classes (class INTEGER PRIMARY KEY, span INTEGER NOT NULL);\n"
    "WITH RECURSIVE k(c) AS (SELECT 0 UNION ALL SELECT c + 1 FROM k WHERE c < 62)\n"
    "  INSERT INTO life_classes SELECT c, 1 << c FROM k;\n"
    "INSERT INTO life_classes VALUES (63, 9223372036854775807);\n"
    "CREATE TABLE trace_rows (file_id INTEGER NOT NULL, rank INTEGER, device INTEGER NOT NULL,\n"
    "  id INTEGER NOT NULL, action TEXT NOT NULL, addr INTEGER NOT NULL, size INTEGER NOT NULL,\n"
    "  stream INTEGER NOT NULL, time_us INTEGER, frames_id INTEGER, allocated INTEGER,\n"
    "  reserved INTEGER, active INTEGER, requested INTEGER);\n"
    "CREATE TABLE timeline_start (file_id INTEGER NOT NULL, rank INTEGER,\n"
    "  device INTEGER NOT NULL, allocated INTEGER NOT NULL, reserved INTEGER NOT NULL,\n"
    "  active INTEGER NOT NULL, requested INTEGER NOT NULL,\n"
    "  PRIMARY KEY (file_id, device)) WITHOUT ROWID;\n"
    "CREATE VIEW timeline AS SELECT file_id, rank, device, -1 AS entry, allocated, reserved,\n"
    "  active, requested FROM timeline_start UNION ALL SELECT file_id, rank, device, id,\n"
    "  allocated, reserved, active, requested FROM trace_rows WHERE allocated IS NOT NULL;\n"
    "CREATE VIEW frames AS SELECT s.file_id AS file_id, s.id AS id, s.depth AS depth, (SELECT\n"
    "  json_group_array(json_object('filename', q.filename, 'line', q.line, 'name', q.name))\n"
    "  FROM (SELECT l.filename, l.line, l.name FROM json_each(s.location_ids) j JOIN locations l\n"
    "  ON l.file_id = s.file_id AND l.id = j.value ORDER BY j.key) q) AS frames FROM stacks s;\n"
    "CREATE VIEW device_traces AS SELECT t.file_id, t.rank, t.device, t.id, t.action, t.addr,\n"
    "  t.size, t.stream, t.time_us, t.frames_id, " SQL_FRAMES("t") " AS frames FROM trace_rows t;\n"
    "CREATE VIEW blocks AS SELECT b.file_id, b.rank, b.id, b.segment_id, b.addr, b.size,\n"
    "  b.requested_size, b.state, b.frames_id, " SQL_FRAMES("b") " AS frames, b.category,\n"
    "  b.source FROM block_rows b;\n"
    "BEGIN;\n";

static const char sqlite_indexes[] =
    "CREATE UNIQUE INDEX locations_key ON locations (id, file_id);\n"
    "CREATE UNIQUE INDEX stacks_key ON stacks (id, file_id);\n"
    "CREATE UNIQUE INDEX segments_key ON segments (file_id, id);\n"
    "CREATE UNIQUE INDEX block_rows_key ON block_rows (file_id, id);\n"
    "CREATE UNIQUE INDEX trace_rows_key ON trace_rows (id, device, file_id);\n"
    "CREATE INDEX trace_rows_addr ON trace_rows (addr, file_id);\n"
    "CREATE INDEX block_rows_addr ON block_rows (file_id, addr);\n"
    "CREATE INDEX block_rows_segment ON block_rows (file_id, segment_id);\n"
    "CREATE UNIQUE INDEX allocations_key ON allocations (id, device, file_id);\n"
    "CREATE INDEX allocations_alive ON allocations (file_id, device, alloc_entry, free_entry);\n"
    "CREATE INDEX allocations_time ON allocations (file_id, device, alloc_time_us);\n"
    "CREATE INDEX allocations_life ON allocations (file_id, device, life_class,\n"
    "  coalesce(alloc_time_us, -1));\n"
    "CREATE INDEX allocations_category ON allocations (file_id, category);\n"
    "COMMIT;\n";

enum {
  ST_SNAPSHOT,
  ST_LOCATION,
  ST_STACK,
  ST_SEGMENT,
  ST_BLOCK,
  ST_TRACE,
  ST_TIMELINE,
  ST_ALLOCATION,
  ST_STACK_BATCH, /* SQLITE_BATCH rows of stacks in one statement */
  ST_TRACE_BATCH, /* SQLITE_BATCH rows of trace_rows */
  ST_COUNT
};

/* Rows per multi-row INSERT: one sqlite3_step for many rows spares the statement's start and
 * end (its transaction checks, its reset) on all but one of them. */
#define SQLITE_BATCH 32
enum { STACK_COLS = 4, TRACE_COLS = 14 };

static const char *const sqlite_inserts[ST_COUNT] = {
    "INSERT INTO snapshot VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, "
    "?15)",
    "INSERT INTO locations VALUES (?1, ?2, ?3, ?4, ?5)",
    "INSERT INTO stacks VALUES (?1, ?2, ?3, ?4)",
    "INSERT INTO segments VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
    "INSERT INTO block_rows VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
    "INSERT INTO trace_rows VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, "
    "?14)",
    "INSERT INTO timeline_start VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
    "INSERT INTO allocations VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, "
    "?14, ?15, ?16, ?17)",
    "stacks",     /* ST_STACK_BATCH: built by sqlite_batch_sql() */
    "trace_rows", /* ST_TRACE_BATCH */
};

/* "INSERT INTO table VALUES (?,...),(?,...)...": SQLITE_BATCH rows of ncols parameters, numbered
 * row by row (row r's column c is parameter r * ncols + c + 1). @return it (free()), or NULL. */
static char *sqlite_batch_sql(const char *table, int ncols) {
  size_t cap = 64 + (size_t)SQLITE_BATCH * ((size_t)ncols * 2 + 3);
  char *sql = malloc(cap), *p = sql;
  if (!sql) return NULL;
  p += snprintf(p, cap, "INSERT INTO %s VALUES ", table);
  for (int r = 0; r < SQLITE_BATCH; r++) {
    *p++ = r ? ',' : ' ';
    *p++ = '(';
    for (int c = 0; c < ncols; c++) {
      if (c) *p++ = ',';
      *p++ = '?';
    }
    *p++ = ')';
  }
  *p = '\0';
  return sql;
}

struct ms_export_sqlite_s {
  sqlite3 *db;
  char *path;
  sqlite3_stmt *st[ST_COUNT];
  int64_t nfiles;
  ms__xbuf_t buf;
};

static int sqlite_fail(ms_export_sqlite_t *x, ms_errbuf_t *eb, const char *what) {
  return ms__errbuf_set(eb, MS_EIO, "'%s': %s: %s", x->path, what,
                        x->db ? sqlite3_errmsg(x->db) : "cannot open");
}

void ms_export_sqlite_destroy(ms_export_sqlite_t *x) {
  if (!x) return;
  for (int i = 0; i < ST_COUNT; i++) sqlite3_finalize(x->st[i]);
  sqlite3_close(x->db);
  ms__xbuf_release(&x->buf);
  free(x->path);
  free(x);
}

int ms_export_sqlite_create(const char *path, ms_export_sqlite_t **out, ms_errbuf_t *eb) {
  ms_export_sqlite_t *x = calloc(1, sizeof *x);
  if (!x || !(x->path = strdup(path))) {
    free(x);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  int rc = sqlite3_open_v2(path, &x->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, NULL);
  if (rc != SQLITE_OK) {
    int err = sqlite_fail(x, eb, "cannot open the database");
    ms_export_sqlite_destroy(x);
    return err;
  }
  char *msg = NULL;
  if (sqlite3_exec(x->db, sqlite_schema, NULL, NULL, &msg) != SQLITE_OK) {
    int err = ms__errbuf_set(eb, MS_EIO, "'%s': cannot create the tables: %s", path,
                             msg ? msg : sqlite3_errmsg(x->db));
    sqlite3_free(msg);
    ms_export_sqlite_destroy(x);
    return err;
  }
  for (int i = 0; i < ST_COUNT; i++) {
    char *batch = i == ST_STACK_BATCH   ? sqlite_batch_sql(sqlite_inserts[i], STACK_COLS)
                  : i == ST_TRACE_BATCH ? sqlite_batch_sql(sqlite_inserts[i], TRACE_COLS)
                                        : NULL;
    if (i >= ST_STACK_BATCH && !batch) {
      ms_export_sqlite_destroy(x);
      return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
    }
    rc = sqlite3_prepare_v3(x->db, batch ? batch : sqlite_inserts[i], -1,
                            SQLITE_PREPARE_PERSISTENT, &x->st[i], NULL);
    free(batch);
    if (rc != SQLITE_OK) {
      int err = sqlite_fail(x, eb, "cannot prepare the inserts");
      ms_export_sqlite_destroy(x);
      return err;
    }
  }
  *out = x;
  return MS_OK;
}

/* Runs a bound insert and resets it. @return SQLite's status. */
static int sqlite_step(sqlite3_stmt *st) {
  int rc = sqlite3_step(st);
  sqlite3_reset(st);
  return rc == SQLITE_DONE ? SQLITE_OK : rc;
}

static void bind_u64(sqlite3_stmt *st, int i, uint64_t v) {
  sqlite3_bind_int64(st, i, (sqlite3_int64)v); /* SQLite integers are signed 64-bit */
}

static void bind_stack(sqlite3_stmt *st, int i, const ms_snapshot_t *snap, uint32_t stack) {
  if (stack == MS_SNAP_NO_STACK || stack >= snap->nstacks)
    sqlite3_bind_null(st, i);
  else
    sqlite3_bind_int64(st, i, stack);
}

static void bind_rank(sqlite3_stmt *st, int i, bool has_rank, int64_t rank) {
  if (has_rank)
    sqlite3_bind_int64(st, i, rank);
  else
    sqlite3_bind_null(st, i);
}

/* Binds s as TEXT, which SQLite requires to be UTF-8: as is when it is, else with each invalid
 * byte replaced by U+FFFD (a copy), as the JSON outputs do. */
static void bind_utf8(sqlite3_stmt *st, int i, const char *s) {
  if (ms__utf8_valid(s)) {
    sqlite3_bind_text(st, i, s, -1, SQLITE_STATIC);
    return;
  }
  ms__xbuf_t t;
  memset(&t, 0, sizeof t);
  ms__xbuf_utf8(&t, s);
  sqlite3_bind_text(st, i, ms__xbuf_cstr(&t), -1, SQLITE_TRANSIENT); /* "" when out of memory */
  ms__xbuf_release(&t);
}

/* Binds the file's peak of allocated memory to 12..15 (peak_allocated, peak_device, peak_entry,
 * peak_time_us): the highest over the devices with a trace, ties to the first device and entry,
 * as the timeline rows give it; NULLs without a time index. Kept per file so that "which rank
 * peaked" reads one row per file instead of sorting every timeline row (issue #31). */
static void sqlite_bind_peak(sqlite3_stmt *st, const ms_timeline_t *tl) {
  ms_tl_peak_t best;
  size_t best_dev;
  for (int i = 12; i <= 15; i++) sqlite3_bind_null(st, i);
  if (!ms__export_file_peak(tl, &best, &best_dev)) return;
  bind_u64(st, 12, best.bytes);
  bind_u64(st, 13, best_dev);
  sqlite3_bind_int64(st, 14, best.entry);
  if (best.has_time) sqlite3_bind_int64(st, 15, best.time_us);
}

static int sqlite_add_snapshot_row(ms_export_sqlite_t *x, const ms_snapshot_t *snap,
                                   const ms_timeline_t *tl, const char *name, bool has_rank,
                                   int64_t rank, const char *tl_error) {
  sqlite3_stmt *st = x->st[ST_SNAPSHOT];
  uint64_t dropped = 0;
  for (size_t d = 0; d < snap->ndevices; d++) dropped += snap->devices[d].trace_dropped;
  x->buf.len = 0;
  ms__export_settings_json(&x->buf, snap);
  if (x->buf.oom) return SQLITE_NOMEM;
  sqlite3_bind_int64(st, 1, x->nfiles);
  bind_utf8(st, 2, name);
  bind_rank(st, 3, has_rank, rank);
  sqlite3_bind_text(st, 4, ms__export_producer(snap), -1, SQLITE_STATIC);
  sqlite3_bind_text(st, 5, x->buf.ptr, (int)x->buf.len, SQLITE_STATIC);
  bind_u64(st, 6, snap->ndevices);
  bind_u64(st, 7, snap->nsegments);
  bind_u64(st, 8, snap->nblocks);
  bind_u64(st, 9, snap->ntrace);
  bind_u64(st, 10, dropped);
  if (tl_error)
    bind_utf8(st, 11, tl_error);
  else
    sqlite3_bind_null(st, 11);
  sqlite_bind_peak(st, tl);
  return sqlite_step(st);
}

/* Appends the stack's location ids as a JSON array, "[3,17,5]", to buf. */
static void sqlite_stack_json(ms__xbuf_t *buf, const ms_snapshot_t *snap,
                              const ms_snap_stack_t *s) {
  char out[512]; /* written in pieces of this size */
  size_t n = 0;
  out[n++] = '[';
  for (uint32_t k = 0; k < s->nframes; k++) {
    char num[16], *p = num + sizeof num;
    uint32_t v = ms_snap_frame_index(snap, s->first + k);
    do {
      *--p = (char)('0' + v % 10);
      v /= 10;
    } while (v);
    if (k) *--p = ',';
    size_t len = (size_t)(num + sizeof num - p);
    if (n + len > sizeof out) {
      ms__xbuf_put(buf, out, n);
      n = 0;
    }
    memcpy(out + n, p, len);
    n += len;
  }
  ms__xbuf_put(buf, out, n);
  ms__xbuf_put(buf, "]", 1);
}

static int sqlite_add_stacks(ms_export_sqlite_t *x, const ms_snapshot_t *snap) {
  sqlite3_stmt *st = x->st[ST_LOCATION];
  int rc = SQLITE_OK;
  for (size_t i = 0; i < snap->nframes && rc == SQLITE_OK; i++) {
    const ms_snap_frame_t *f = &snap->frames[i];
    sqlite3_bind_int64(st, 1, x->nfiles);
    sqlite3_bind_int64(st, 2, (sqlite3_int64)i);
    bind_utf8(st, 3, f->name);
    bind_utf8(st, 4, f->filename);
    sqlite3_bind_int64(st, 5, f->line);
    rc = sqlite_step(st);
  }
  /* SQLITE_BATCH stacks per step (the rest one by one), their JSON texts one after the other in
   * x->buf, bound once all are written (the buffer may move while it grows) */
  for (size_t i = 0; i < snap->nstacks && rc == SQLITE_OK;) {
    size_t n = snap->nstacks - i >= SQLITE_BATCH ? SQLITE_BATCH : 1;
    size_t end[SQLITE_BATCH];
    x->buf.len = 0;
    for (size_t r = 0; r < n; r++) {
      sqlite_stack_json(&x->buf, snap, &snap->stacks[i + r]);
      end[r] = x->buf.len;
    }
    if (x->buf.oom) return SQLITE_NOMEM;
    st = x->st[n > 1 ? ST_STACK_BATCH : ST_STACK];
    for (size_t r = 0; r < n; r++) {
      int b = (int)r * STACK_COLS;
      size_t start = r ? end[r - 1] : 0;
      sqlite3_bind_int64(st, b + 1, x->nfiles);
      sqlite3_bind_int64(st, b + 2, (sqlite3_int64)(i + r));
      sqlite3_bind_int64(st, b + 3, snap->stacks[i + r].nframes);
      sqlite3_bind_text(st, b + 4, x->buf.ptr + start, (int)(end[r] - start), SQLITE_STATIC);
    }
    rc = sqlite_step(st);
    i += n;
  }
  return rc;
}

/* The stack of a block: its own, or (PyTorch 2.0) that of its newest history entry. */
static uint32_t sqlite_block_stack(const ms_snapshot_t *snap, const ms_snap_block_t *b) {
  if (b->stack == MS_SNAP_NO_STACK && b->nhistory > 0 && b->first_history < snap->nhistory)
    return snap->history[b->first_history].stack;
  return b->stack;
}

static int sqlite_add_segments(ms_export_sqlite_t *x, const ms_snapshot_t *snap, bool has_rank,
                               int64_t rank, const ms_attr_t *attr, const uint8_t *bcat) {
  int rc = SQLITE_OK;
  char src[1024];
  sqlite3_stmt *sg = x->st[ST_SEGMENT], *bl = x->st[ST_BLOCK];
  for (size_t i = 0; i < snap->nsegments && rc == SQLITE_OK; i++) {
    const ms_snap_segment_t *g = &snap->segments[i];
    char pool[48];
    snprintf(pool, sizeof pool, "%" PRId64 ",%" PRId64, g->pool_id[0], g->pool_id[1]);
    sqlite3_bind_int64(sg, 1, x->nfiles);
    bind_rank(sg, 2, has_rank, rank);
    sqlite3_bind_int64(sg, 3, (sqlite3_int64)i);
    sqlite3_bind_int64(sg, 4, g->device);
    bind_u64(sg, 5, g->address);
    bind_u64(sg, 6, g->total_size);
    bind_u64(sg, 7, g->allocated_size);
    bind_u64(sg, 8, g->active_size);
    bind_u64(sg, 9, g->requested_size);
    bind_u64(sg, 10, g->stream);
    sqlite3_bind_text(sg, 11, g->is_large ? "large" : "small", -1, SQLITE_STATIC);
    sqlite3_bind_text(sg, 12, pool, -1, SQLITE_TRANSIENT);
    sqlite3_bind_int(sg, 13, g->is_expandable);
    bind_stack(sg, 14, snap, g->stack);
    rc = sqlite_step(sg);
    for (uint32_t k = 0; k < g->nblocks && rc == SQLITE_OK; k++) {
      size_t bi = (size_t)g->first_block + k;
      if (bi >= snap->nblocks) break;
      const ms_snap_block_t *b = &snap->blocks[bi];
      sqlite3_bind_int64(bl, 1, x->nfiles);
      bind_rank(bl, 2, has_rank, rank);
      sqlite3_bind_int64(bl, 3, (sqlite3_int64)bi);
      sqlite3_bind_int64(bl, 4, (sqlite3_int64)i);
      bind_u64(bl, 5, b->address);
      bind_u64(bl, 6, b->size);
      bind_u64(bl, 7, b->requested_size);
      const char *state = b->state == MS_BLOCK_STATE_OTHER && b->state_name[0]
                              ? b->state_name
                              : ms_block_state_name(b->state);
      bind_utf8(bl, 8, state);
      bind_stack(bl, 9, snap, sqlite_block_stack(snap, b));
      if (bcat && bcat[bi] < MS_CAT_COUNT) {
        sqlite3_bind_text(bl, 10, ms_category_name((ms_category)bcat[bi]), -1, SQLITE_STATIC);
        ms_attr_source(attr, sqlite_block_stack(snap, b), src, sizeof src);
        sqlite3_bind_text(bl, 11, src, -1, SQLITE_TRANSIENT);
      } else {
        sqlite3_bind_null(bl, 10);
        sqlite3_bind_null(bl, 11);
      }
      rc = sqlite_step(bl);
    }
  }
  return rc;
}

/* The four totals of device d after every step (NULLs: none), in the columns' order. */
static void sqlite_series(const ms_timeline_t *tl, size_t d, const uint64_t *v[4]) {
  static const ms_tl_metric m[4] = {MS_TL_ALLOCATED, MS_TL_RESERVED, MS_TL_ACTIVE,
                                    MS_TL_REQUESTED};
  /* the four in one pass over the trace (the index keeps no series until asked) */
  if (tl && d < ms_timeline_ndevices(tl))
    (void)ms__tl_series_make(tl, d, (1u << MS_TL_METRIC_COUNT) - 1);
  for (int k = 0; k < 4; k++)
    v[k] = tl && d < ms_timeline_ndevices(tl) ? ms_timeline_series(tl, d, m[k]) : NULL;
  if (!v[0] || !v[1] || !v[2] || !v[3]) v[0] = NULL;
}

/* Binds trace entry i of its device (index ti of snap->trace) as the row whose parameters start
 * after b, but for its first three columns (file_id, rank, device: bound once per device); v:
 * the device's totals (v[0] NULL: none). */
static void sqlite_bind_trace(sqlite3_stmt *st, int b, const ms_snapshot_t *snap, uint32_t i,
                              size_t ti, const uint64_t *const v[4]) {
  const ms_snap_trace_t *e = &snap->trace[ti];
  const char *action = e->action == MS_TRACE_OTHER && ms_snap_trace_action_name(e)[0]
                           ? ms_snap_trace_action_name(e)
                           : ms_trace_action_name(e->action);
  sqlite3_bind_int64(st, b + 4, i);
  bind_utf8(st, b + 5, action);
  bind_u64(st, b + 6, e->addr);
  bind_u64(st, b + 7, e->size);
  bind_u64(st, b + 8, ms_snap_trace_stream(e));
  if (e->present & MS_TRACE_HAS_TIME)
    sqlite3_bind_int64(st, b + 9, e->time_us);
  else
    sqlite3_bind_null(st, b + 9);
  bind_stack(st, b + 10, snap, e->stack);
  for (int k = 0; k < 4; k++) {
    if (v[0])
      bind_u64(st, b + 11 + k, v[k][i + 1]);
    else
      sqlite3_bind_null(st, b + 11 + k);
  }
}

static int sqlite_add_trace(ms_export_sqlite_t *x, const ms_snapshot_t *snap,
                            const ms_timeline_t *tl, bool has_rank, int64_t rank) {
  int rc = SQLITE_OK;
  for (size_t d = 0; d < snap->ndevices && rc == SQLITE_OK; d++) {
    const ms_snap_device_t *dv = &snap->devices[d];
    const uint64_t *v[4];
    sqlite_series(tl, d, v);
    if (v[0] && ms_timeline_nentries(tl, d) != dv->ntrace) v[0] = NULL;
    /* the entries that lie in snap->trace */
    uint32_t n = dv->first_trace >= snap->ntrace ? 0 : dv->ntrace;
    if (n > snap->ntrace - dv->first_trace) n = (uint32_t)(snap->ntrace - dv->first_trace);
    /* SQLITE_BATCH rows per step, the rest one by one; sqlite3_reset keeps the bindings, so
     * the columns that hold for the whole device are bound once */
    for (int r = 0; r <= SQLITE_BATCH; r++) {
      sqlite3_stmt *st = x->st[r < SQLITE_BATCH ? ST_TRACE_BATCH : ST_TRACE];
      int b = r < SQLITE_BATCH ? r * TRACE_COLS : 0;
      sqlite3_bind_int64(st, b + 1, x->nfiles);
      bind_rank(st, b + 2, has_rank, rank);
      sqlite3_bind_int64(st, b + 3, (sqlite3_int64)d);
    }
    for (uint32_t i = 0; i < n && rc == SQLITE_OK;) {
      uint32_t rows = n - i >= SQLITE_BATCH ? SQLITE_BATCH : 1;
      sqlite3_stmt *st = x->st[rows > 1 ? ST_TRACE_BATCH : ST_TRACE];
      for (uint32_t r = 0; r < rows; r++)
        sqlite_bind_trace(st, (int)r * TRACE_COLS, snap, i + r, (size_t)dv->first_trace + i + r,
                          v);
      rc = sqlite_step(st);
      i += rows;
    }
  }
  return rc;
}

/* The state before the first entry of every device with a trace (the timeline's entry -1; the
 * totals after each entry are columns of trace_rows). */
static int sqlite_add_timeline(ms_export_sqlite_t *x, const ms_timeline_t *tl, bool has_rank,
                               int64_t rank) {
  int rc = SQLITE_OK;
  sqlite3_stmt *st = x->st[ST_TIMELINE];
  for (size_t d = 0; d < ms_timeline_ndevices(tl) && rc == SQLITE_OK; d++) {
    const uint64_t *v[4];
    sqlite_series(tl, d, v);
    if (ms_timeline_nentries(tl, d) == 0 || !v[0]) continue;
    sqlite3_bind_int64(st, 1, x->nfiles);
    bind_rank(st, 2, has_rank, rank);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)d);
    for (int m = 0; m < 4; m++) bind_u64(st, 4 + m, v[m][0]);
    rc = sqlite_step(st);
  }
  return rc;
}

/* Per snapshot block, the category of the allocated ones (0xff: none), from the end states. */
static int sqlite_block_categories(const ms_attr_t *attr, const ms_timeline_t *tl,
                                   const ms_snapshot_t *snap, uint8_t **out) {
  uint8_t *c = malloc(snap->nblocks ? snap->nblocks : 1);
  if (!c) return MS_ENOMEM;
  memset(c, 0xff, snap->nblocks);
  ms_tl_state_t st;
  ms_timeline_state_init(&st);
  int err = MS_OK;
  for (size_t d = 0; d < ms_timeline_ndevices(tl) && err == MS_OK; d++) {
    err = ms_timeline_state_at(tl, d, ms_timeline_nentries(tl, d), &st);
    for (size_t k = 0; k < st.nblocks && err == MS_OK; k++) {
      const ms_tl_block_t *b = &st.blocks[k];
      if ((b->flags & MS_TL_BLOCK_FROM_SNAPSHOT) && b->snap_block < snap->nblocks &&
          b->state == MS_BLOCK_ACTIVE_ALLOCATED)
        c[b->snap_block] = (uint8_t)ms_attr_block_category(attr, d, b);
    }
  }
  ms_timeline_state_release(&st);
  if (err != MS_OK) {
    free(c);
    return err;
  }
  *out = c;
  return MS_OK;
}

static void bind_opt(sqlite3_stmt *st, int i, int64_t v, int64_t none) {
  if (v == none)
    sqlite3_bind_null(st, i);
  else
    sqlite3_bind_int64(st, i, v);
}

/* The allocations table: every block lifetime of every device. */
static int sqlite_add_allocations(ms_export_sqlite_t *x, const ms_attr_t *attr,
                                  const ms_timeline_t *tl, bool has_rank, int64_t rank) {
  const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
  sqlite3_stmt *st = x->st[ST_ALLOCATION];
  int rc = SQLITE_OK;
  char src[1024];
  for (size_t d = 0; d < ms_timeline_ndevices(tl) && rc == SQLITE_OK; d++) {
    attr_life_t *lv = NULL;
    size_t n = 0;
    if (ms__attr_lifetimes(attr, d, &lv, &n) != MS_OK) return SQLITE_NOMEM;
    sqlite3_bind_int64(st, 1, x->nfiles);
    bind_rank(st, 2, has_rank, rank);
    sqlite3_bind_int64(st, 3, (sqlite3_int64)d);
    for (size_t i = 0; i < n && rc == SQLITE_OK; i++) {
      const attr_life_t *l = &lv[i];
      sqlite3_bind_int64(st, 4, (sqlite3_int64)i);
      sqlite3_bind_int64(st, 5, l->alloc_entry);
      bind_opt(st, 6, l->freq_entry, -2);
      bind_opt(st, 7, l->free_entry, -1);
      bind_opt(st, 8, l->time_us, -1);
      bind_opt(st, 9, l->free_time_us, -1);
      bind_u64(st, 10, l->address);
      bind_u64(st, 11, l->size);
      bind_u64(st, 12, l->requested_size);
      bind_u64(st, 13, l->stream);
      bind_stack(st, 14, snap, l->stack);
      ms_attr_source(attr, l->stack, src, sizeof src);
      sqlite3_bind_text(st, 15, src, -1, SQLITE_TRANSIENT);
      sqlite3_bind_text(st, 16, ms_category_name((ms_category)l->category), -1, SQLITE_STATIC);
      sqlite3_bind_int(st, 17, ms__export_life_class(l->time_us, l->free_time_us));
      rc = sqlite_step(st);
    }
    free(lv);
  }
  return rc;
}

int ms_export_sqlite_add(ms_export_sqlite_t *x, const ms_snapshot_t *snap,
                         const ms_timeline_t *tl, const char *name, bool has_rank, int64_t rank,
                         const char *timeline_error, ms_errbuf_t *eb) {
  ms_attr_t *attr = NULL; /* categories and sources need the time index */
  uint8_t *bcat = NULL;
  if (tl) {
    int err = ms_attr_create(snap, tl, NULL, &attr, eb);
    if (err == MS_OK) err = sqlite_block_categories(attr, tl, snap, &bcat);
    if (err != MS_OK) {
      ms_attr_destroy(attr);
      return err == MS_ENOMEM ? ms__errbuf_set(eb, MS_ENOMEM, "out of memory") : err;
    }
  }
  int rc = sqlite_add_snapshot_row(x, snap, tl, name, has_rank, rank, timeline_error);
  if (rc == SQLITE_OK) rc = sqlite_add_stacks(x, snap);
  if (rc == SQLITE_OK) rc = sqlite_add_segments(x, snap, has_rank, rank, attr, bcat);
  if (rc == SQLITE_OK) rc = sqlite_add_trace(x, snap, tl, has_rank, rank);
  if (rc == SQLITE_OK && tl) rc = sqlite_add_timeline(x, tl, has_rank, rank);
  if (rc == SQLITE_OK && tl) rc = sqlite_add_allocations(x, attr, tl, has_rank, rank);
  free(bcat);
  ms_attr_destroy(attr);
  if (rc == SQLITE_NOMEM || x->buf.oom) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  if (rc != SQLITE_OK) return sqlite_fail(x, eb, "cannot insert the rows");
  x->nfiles++;
  return MS_OK;
}

int ms_export_sqlite_finish(ms_export_sqlite_t *x, ms_errbuf_t *eb) {
  for (int i = 0; i < ST_COUNT; i++) {
    sqlite3_finalize(x->st[i]);
    x->st[i] = NULL;
  }
  char *msg = NULL;
  int err = MS_OK;
  if (sqlite3_exec(x->db, sqlite_indexes, NULL, NULL, &msg) != SQLITE_OK) {
    err = ms__errbuf_set(eb, MS_EIO, "'%s': cannot finish the database: %s", x->path,
                         msg ? msg : sqlite3_errmsg(x->db));
    sqlite3_free(msg);
  }
  if (err == MS_OK && sqlite3_close(x->db) != SQLITE_OK) {
    err = sqlite_fail(x, eb, "cannot close the database");
  } else if (err == MS_OK) {
    x->db = NULL;
  }
  ms_export_sqlite_destroy(x);
  return err;
}

bool ms_export_rank_from_name(const char *path, int64_t *rank) {
  const char *base = strrchr(path, '/');
  base = base ? base + 1 : path;
  const char *found = NULL;
  for (const char *p = base; *p; p++) {
    if (strncasecmp(p, "rank", 4) != 0) continue;
    const char *q = p + 4;
    if (*q == '_' || *q == '-' || *q == '.') q++;
    if (*q >= '0' && *q <= '9') found = q;
  }
  if (!found) return false;
  int64_t v = 0;
  for (const char *q = found; *q >= '0' && *q <= '9'; q++) {
    if (v > (INT64_MAX - 9) / 10) return false;
    v = v * 10 + (*q - '0');
  }
  *rank = v;
  return true;
}

/* ---- CSV: the tables as gzip'd CSV files (issue #31) -------------------------------------- */

/* The files of ms_export_sqlite_csv and the query each is read with (docs/exports.md gives the
 * columns): the ones an engine that reads CSV (DuckDB, Spark, Polars, pandas) needs. */
static const struct {
  const char *file, *sql;
} csv_tables[] = {
    {"snapshots.csv.gz", "SELECT file_id, file, rank, producer, settings, devices, segments, "
                         "blocks, trace_entries, trace_dropped, timeline_error FROM snapshot "
                         "ORDER BY file_id"},
    {"peaks.csv.gz", "SELECT file_id, rank, file, peak_allocated, peak_device, peak_entry, "
                     "peak_time_us FROM snapshot ORDER BY file_id"},
    {"allocations.csv.gz", "SELECT * FROM allocations ORDER BY rowid"},
    {"trace.csv.gz", "SELECT file_id, rank, device, id, action, addr, size, stream, time_us, "
                     "frames_id, allocated, reserved, active, requested FROM trace_rows "
                     "ORDER BY rowid"},
    {"stacks.csv.gz", "SELECT file_id, id, depth, frames FROM frames ORDER BY file_id, id"},
};

/* One CSV field (RFC 4180): NULL as nothing, a number as digits, text always quoted, with its
 * quotes doubled, so that an empty text ("") and NULL differ. */
static void csv_field(ms__xbuf_t *b, sqlite3_stmt *st, int c) {
  switch (sqlite3_column_type(st, c)) {
  case SQLITE_NULL:
    return;
  case SQLITE_INTEGER:
    ms__xbuf_printf(b, "%lld", (long long)sqlite3_column_int64(st, c));
    return;
  case SQLITE_FLOAT:
    ms__xbuf_printf(b, "%.17g", sqlite3_column_double(st, c));
    return;
  default: {
    const char *t = (const char *)sqlite3_column_text(st, c);
    ms__xbuf_puts(b, "\"");
    for (const char *q; t && (q = strchr(t, '"')); t = q + 1) {
      ms__xbuf_put(b, t, (size_t)(q - t) + 1);
      ms__xbuf_puts(b, "\"");
    }
    if (t) ms__xbuf_puts(b, t);
    ms__xbuf_puts(b, "\"");
  }
  }
}

/* Writes the rows of st, a header line first, through sink. @return MS_OK, MS_ENOMEM, MS_EIO
 * (SQLite's error) or the sink's error. */
static int csv_rows(sqlite3_stmt *st, ms_sink_t *sink, ms__xbuf_t *b) {
  int n = sqlite3_column_count(st), err = MS_OK, rc;
  for (int c = 0; c < n; c++) {
    if (c) ms__xbuf_puts(b, ",");
    ms__xbuf_puts(b, sqlite3_column_name(st, c));
  }
  ms__xbuf_puts(b, "\r\n");
  while (err == MS_OK && (rc = sqlite3_step(st)) == SQLITE_ROW) {
    for (int c = 0; c < n; c++) {
      if (c) ms__xbuf_puts(b, ",");
      csv_field(b, st, c);
    }
    ms__xbuf_puts(b, "\r\n");
    if (b->oom) return MS_ENOMEM;
    if (b->len >= (1u << 20)) {
      err = sink->write(sink->ctx, b->ptr, b->len);
      b->len = 0;
    }
  }
  if (err != MS_OK) return err;
  if (rc != SQLITE_DONE) return MS_EIO;
  if (b->oom) return MS_ENOMEM;
  if (b->len) err = sink->write(sink->ctx, b->ptr, b->len);
  b->len = 0;
  return err;
}

int ms_export_sqlite_csv(const char *db_path, const char *dir, ms_errbuf_t *eb) {
  sqlite3 *db = NULL;
  if (sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL) != SQLITE_OK) {
    int err = ms__errbuf_set(eb, MS_EIO, "'%s': %s", db_path, db ? sqlite3_errmsg(db) : "");
    sqlite3_close(db);
    return err;
  }
  ms__xbuf_t b = {0};
  int err = MS_OK;
  for (size_t i = 0; i < sizeof csv_tables / sizeof *csv_tables && err == MS_OK; i++) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, csv_tables[i].file);
    sqlite3_stmt *st = NULL;
    if (sqlite3_prepare_v2(db, csv_tables[i].sql, -1, &st, NULL) != SQLITE_OK) {
      err = ms__errbuf_set(eb, MS_EIO, "'%s': %s", db_path, sqlite3_errmsg(db));
      break;
    }
    FILE *f = fopen(path, "wb");
    ms_sink_t file, gz;
    ms_gzip_sink_t *z = NULL;
    if (!f) {
      err = ms__errbuf_set(eb, MS_EIO, "cannot write '%s'", path);
    } else {
      ms_sink_init_file(&file, f);
      err = ms_gzip_sink_create(&file, 6, &z, &gz);
      if (err == MS_OK) err = csv_rows(st, &gz, &b);
      if (err == MS_OK) err = ms_gzip_sink_finish(z);
      ms_gzip_sink_destroy(z);
      if (fclose(f) != 0 && err == MS_OK) err = MS_EIO;
      if (err != MS_OK)
        ms__errbuf_set(eb, err, "cannot write '%s': %s", path,
                       err == MS_EIO && sqlite3_errcode(db) != SQLITE_OK ? sqlite3_errmsg(db)
                                                                        : ms_strerror(err));
    }
    sqlite3_finalize(st);
  }
  ms__xbuf_release(&b);
  sqlite3_close(db);
  return err;
}
