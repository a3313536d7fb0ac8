/* SPDX-License-Identifier: MIT
 * memsnap exports: the tables of the SQLite export as gzip'd CSV, written straight from the
 * in-memory snapshot and its time index (issue #31, past one machine). The rows, their order and
 * every byte of their text are those of ms_export_sqlite_csv over a database of the same files
 * (the test suite compares the two); this writer only skips the database: going through SQLite
 * cost two inserts and a select per row (about 50,000 rows per second), this costs the digits and
 * zlib's fastest level.
 *
 * Speed: fields are formatted into a 1 MiB buffer by hand (no printf), the stacks' frames are
 * turned into JSON once per location rather than once per stack, and the trace and stacks
 * tables, the largest, are written on threads of their own (started before the time index is
 * attributed, which only the allocations table needs) while this thread writes the others:
 * each table has its own buffer and compressor, and all only read the snapshot and its index.
 * With more than one job (the default where there is more than one CPU), each file is one gzip
 * member compressed pigz-style by a pool of workers that all files share (pgzip.h): a full 1 MiB
 * buffer is handed to the pool and the writer goes on in a fresh one, so deflate, which is most
 * of the cost, no longer holds up the trace table's thread. With one job each file has its own
 * zlib stream, compressed by the thread that writes it.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "attribution/internal.h"
#include "common/internal.h"
#include "export/internal.h"
#include "export/pgzip.h"
#include "memsnap/export.h"
#include "timeline/internal.h"

#define CSV_BUF (1u << 20)  /* bytes of rows handed to the compressor at once */
#define CSV_ROOM 1024       /* the most a row's numbers and fixed texts take */
#define CSV_MAX_JOBS 32     /* the most compressing threads by default */

static const char *const csv_names[MS_EXPORT_CSV_NFILES] = {
    "snapshots.csv.gz", "peaks.csv.gz", "allocations.csv.gz", "trace.csv.gz", "stacks.csv.gz"};

static const char *const csv_headers[MS_EXPORT_CSV_NFILES] = {
    "file_id,file,rank,producer,settings,devices,segments,blocks,trace_entries,trace_dropped,"
    "timeline_error\r\n",
    "file_id,rank,file,peak_allocated,peak_device,peak_entry,peak_time_us\r\n",
    "file_id,rank,device,id,alloc_entry,free_requested_entry,free_entry,alloc_time_us,"
    "free_time_us,addr,size,requested_size,stream,frames_id,source,category,life_class\r\n",
    "file_id,rank,device,id,action,addr,size,stream,time_us,frames_id,allocated,reserved,active,"
    "requested\r\n",
    "file_id,id,depth,frames\r\n"};

const char *ms_export_csv_file_name(int i) {
  return i >= 0 && i < MS_EXPORT_CSV_NFILES ? csv_names[i] : NULL;
}

/* One output file: its row buffer and its compressor. err is sticky. */
typedef struct csv_file_s {
  ms_gzip_sink_t *z; /* one job: a zlib stream */
  ms_sink_t gz;
  ms__pgz_t *pz;     /* several: a stream of the pool */
  char *buf;
  size_t len;
  int err;
  uint64_t rows;
} csv_file_t;

struct ms_export_csv_s {
  csv_file_t f[MS_EXPORT_CSV_NFILES];
  ms_sink_t *sinks[MS_EXPORT_CSV_NFILES];
  int level, jobs;
  bool started;         /* the compressors made (at the first add or finish) */
  ms__pgz_pool_t *pool; /* jobs > 1 */
  int64_t nfiles;
  ms__xbuf_t tmp;  /* a text made valid UTF-8 */
  ms__xbuf_t locs; /* the locations' JSON (the stacks' thread) */
  size_t *loc_end; /* the end of each location's JSON in locs */
};

static void csv_flush(csv_file_t *o) {
  if (o->err == MS_OK && o->len)
    o->err = o->pz ? ms__pgz_write(o->pz, &o->buf, o->len) : o->gz.write(o->gz.ctx, o->buf, o->len);
  o->len = 0;
}

/* Where the next row goes: at least CSV_ROOM bytes free. */
static inline char *csv_room(csv_file_t *o) {
  if (o->len > CSV_BUF - CSV_ROOM) csv_flush(o);
  return o->buf + o->len;
}

static inline void csv_end(csv_file_t *o, char *p) { o->len = (size_t)(p - o->buf); }

/* n bytes as they are (already quoted), of any length. */
static void csv_raw(csv_file_t *o, const char *p, size_t n) {
  while (n) {
    if (o->len == CSV_BUF) csv_flush(o);
    size_t k = CSV_BUF - o->len < n ? CSV_BUF - o->len : n;
    memcpy(o->buf + o->len, p, k);
    o->len += k;
    p += k;
    n -= k;
  }
}

/* One separator (',') between fields written by the text writers. */
static inline void csv_comma(csv_file_t *o) {
  char *p = csv_room(o);
  *p++ = ',';
  csv_end(o, p);
}

/* The decimal digits of v (as SQLite prints a 64-bit integer). */
static inline char *csv_i64(char *p, int64_t v) {
  static const char d2[] = "00010203040506070809101112131415161718192021222324252627282930313233"
                           "34353637383940414243444546474849505152535455565758596061626364656667"
                           "6869707172737475767778798081828384858687888990919293949596979899";
  uint64_t u = (uint64_t)v;
  if (v < 0) {
    *p++ = '-';
    u = 0 - u;
  }
  char t[24], *q = t + sizeof t;
  while (u >= 100) {
    unsigned r = (unsigned)(u % 100);
    u /= 100;
    q -= 2;
    memcpy(q, d2 + 2 * r, 2);
  }
  if (u >= 10) {
    q -= 2;
    memcpy(q, d2 + 2 * u, 2);
  } else {
    *--q = (char)('0' + u);
  }
  size_t n = (size_t)(t + sizeof t - q);
  memcpy(p, q, n);
  return p + n;
}

/* A number and the comma after it; u64 values go as SQLite stores them (signed 64-bit). */
static inline char *csv_num(char *p, int64_t v) {
  p = csv_i64(p, v);
  *p++ = ',';
  return p;
}

/* A value or nothing (NULL) when v == none, and the comma. */
static inline char *csv_opt(char *p, int64_t v, int64_t none) {
  if (v != none) p = csv_i64(p, v);
  *p++ = ',';
  return p;
}

/* Text of n bytes, quoted, its quotes doubled (RFC 4180), of any length. */
static void csv_text_n(csv_file_t *o, const char *s, size_t n) {
  char *p = csv_room(o);
  *p++ = '"';
  csv_end(o, p);
  while (n) {
    size_t room = CSV_BUF - o->len;
    if (room < 8) {
      csv_flush(o);
      continue;
    }
    p = o->buf + o->len;
    size_t k = 0;
    while (k < n && room >= 2) {
      if (s[k] == '"') {
        *p++ = '"';
        room--;
      }
      *p++ = s[k++];
      room--;
    }
    csv_end(o, p);
    s += k;
    n -= k;
  }
  p = csv_room(o);
  *p++ = '"';
  csv_end(o, p);
}

/* Text as the SQLite export binds it: each byte that is not valid UTF-8 as U+FFFD. */
static void csv_text_utf8(ms__xbuf_t *tmp, csv_file_t *o, const char *s) {
  if (ms__utf8_valid(s)) {
    csv_text_n(o, s, strlen(s));
    return;
  }
  tmp->len = 0;
  ms__xbuf_utf8(tmp, s);
  if (tmp->oom) o->err = MS_ENOMEM;
  csv_text_n(o, tmp->ptr ? tmp->ptr : "", tmp->len);
}

static inline char *csv_line_end(char *p) {
  p[0] = '\r';
  p[1] = '\n';
  return p + 2;
}

/* Replaces the ',' after the row's last field by the line end. */
static inline void csv_row_end(csv_file_t *o, char *p) {
  csv_end(o, csv_line_end(p - 1));
  o->rows++;
}

static int64_t csv_stack(const ms_snapshot_t *snap, uint32_t stack) {
  return stack == MS_SNAP_NO_STACK || stack >= snap->nstacks ? -1 : (int64_t)stack;
}

/* ---- files, their rows ---------------------------------------------------------------------- */

static void csv_file_row(ms_export_csv_t *x, const ms_snapshot_t *snap, const ms_timeline_t *tl,
                         const char *name, bool has_rank, int64_t rank, const char *tl_error) {
  csv_file_t *o = &x->f[MS_EXPORT_CSV_SNAPSHOTS];
  uint64_t dropped = 0;
  for (size_t d = 0; d < snap->ndevices; d++) dropped += snap->devices[d].trace_dropped;
  char *p = csv_num(csv_room(o), x->nfiles);
  csv_end(o, p);
  csv_text_utf8(&x->tmp, o, name);
  p = csv_room(o);
  *p++ = ',';
  p = has_rank ? csv_num(p, rank) : p + (*p = ',', 1);
  csv_end(o, p);
  const char *producer = ms__export_producer(snap);
  csv_text_n(o, producer, strlen(producer));
  csv_comma(o);
  x->tmp.len = 0;
  ms__export_settings_json(&x->tmp, snap);
  if (x->tmp.oom) o->err = MS_ENOMEM;
  csv_text_n(o, x->tmp.ptr ? x->tmp.ptr : "", x->tmp.len);
  p = csv_room(o);
  *p++ = ',';
  p = csv_num(p, (int64_t)snap->ndevices);
  p = csv_num(p, (int64_t)snap->nsegments);
  p = csv_num(p, (int64_t)snap->nblocks);
  p = csv_num(p, (int64_t)snap->ntrace);
  p = csv_num(p, (int64_t)dropped);
  csv_end(o, p);
  if (tl_error) csv_text_utf8(&x->tmp, o, tl_error);
  csv_end(o, csv_line_end(csv_room(o)));
  o->rows++;

  /* peaks: file_id, rank, file, then the peak or four NULLs */
  o = &x->f[MS_EXPORT_CSV_PEAKS];
  p = csv_num(csv_room(o), x->nfiles);
  p = has_rank ? csv_num(p, rank) : p + (*p = ',', 1);
  csv_end(o, p);
  csv_text_utf8(&x->tmp, o, name);
  p = csv_room(o);
  *p++ = ',';
  ms_tl_peak_t pk;
  size_t dev;
  if (ms__export_file_peak(tl, &pk, &dev)) {
    p = csv_num(p, (int64_t)pk.bytes);
    p = csv_num(p, (int64_t)dev);
    p = csv_num(p, (int64_t)pk.entry);
    p = pk.has_time ? csv_num(p, pk.time_us) : p + (*p = ',', 1);
  } else {
    memcpy(p, ",,,,", 4);
    p += 4;
  }
  csv_row_end(o, p);
}

/* s as SQLite's JSON functions write a TEXT value (the SQLite export binds s with each byte that
 * is not valid UTF-8 as U+FFFD): '"' and '\\' escaped, \b \t \n \f \r, the other control
 * characters as \u00xx, everything else as is; with csv, every '"' doubled. */
static void csv_json_str(ms__xbuf_t *b, const char *s, bool csv) {
  ms__xbuf_t fixed = {0};
  if (!ms__utf8_valid(s)) {
    ms__xbuf_utf8(&fixed, s);
    s = ms__xbuf_cstr(&fixed);
  }
  const char *q = csv ? "\"\"" : "\"";
  ms__xbuf_puts(b, q);
  const char *run = s;
  for (const unsigned char *p = (const unsigned char *)s;; p++) {
    unsigned char c = *p;
    if (c >= 0x20 && c != '"' && c != '\\') continue;
    ms__xbuf_put(b, run, (size_t)((const char *)p - run));
    run = (const char *)p + 1;
    if (!c) break;
    char e[8];
    size_t n = 2;
    e[0] = '\\';
    switch (c) {
    case '"': e[1] = '"'; break;
    case '\\': e[1] = '\\'; break;
    case '\b': e[1] = 'b'; break;
    case '\t': e[1] = 't'; break;
    case '\n': e[1] = 'n'; break;
    case '\f': e[1] = 'f'; break;
    case '\r': e[1] = 'r'; break;
    default:
      memcpy(e + 1, "u00", 3);
      e[4] = "0123456789abcdef"[c >> 4];
      e[5] = "0123456789abcdef"[c & 15];
      n = 6;
    }
    ms__xbuf_put(b, e, n);
    if (c == '"' && csv) ms__xbuf_put(b, "\"", 1);
  }
  ms__xbuf_puts(b, q);
  ms__xbuf_release(&fixed);
}

/* The JSON object of every location as SQLite's json_object gives it, its quotes already
 * doubled for CSV, one after the other in x->locs (x->loc_end: where each ends). */
static int csv_locations(ms_export_csv_t *x, const ms_snapshot_t *snap) {
  free(x->loc_end);
  x->loc_end = malloc((snap->nframes ? snap->nframes : 1) * sizeof *x->loc_end);
  if (!x->loc_end) return MS_ENOMEM;
  ms__xbuf_t *b = &x->locs;
  b->len = 0;
  for (size_t i = 0; i < snap->nframes; i++) {
    const ms_snap_frame_t *f = &snap->frames[i];
    char num[24];
    ms__xbuf_puts(b, "{\"\"filename\"\":");
    csv_json_str(b, f->filename, true);
    ms__xbuf_puts(b, ",\"\"line\"\":");
    ms__xbuf_put(b, num, (size_t)(csv_i64(num, f->line) - num));
    ms__xbuf_puts(b, ",\"\"name\"\":");
    csv_json_str(b, f->name, true);
    ms__xbuf_puts(b, "}");
    x->loc_end[i] = b->len;
  }
  return b->oom ? MS_ENOMEM : MS_OK;
}

static int csv_stacks(ms_export_csv_t *x, const ms_snapshot_t *snap) {
  int err = csv_locations(x, snap);
  if (err != MS_OK) return err;
  csv_file_t *o = &x->f[MS_EXPORT_CSV_STACKS];
  for (size_t i = 0; i < snap->nstacks && o->err == MS_OK; i++) {
    const ms_snap_stack_t *s = &snap->stacks[i];
    char *p = csv_num(csv_room(o), x->nfiles);
    p = csv_num(p, (int64_t)i);
    p = csv_num(p, s->nframes);
    *p++ = '"';
    *p++ = '[';
    csv_end(o, p);
    bool first = true;
    for (uint32_t k = 0; k < s->nframes; k++) {
      uint32_t f = ms_snap_frame_index(snap, s->first + k);
      if (f >= snap->nframes) continue; /* the join finds no location */
      size_t start = f ? x->loc_end[f - 1] : 0, n = x->loc_end[f] - start;
      if (!first) csv_comma(o);
      first = false;
      csv_raw(o, x->locs.ptr + start, n);
    }
    p = csv_room(o);
    *p++ = ']';
    *p++ = '"';
    csv_end(o, csv_line_end(p));
    o->rows++;
  }
  return o->err;
}

/* What the stacks table's thread reads. */
typedef struct csv_stacks_job_s {
  ms_export_csv_t *x;
  const ms_snapshot_t *snap;
  int err;
} csv_stacks_job_t;

static void *csv_stacks_run(void *arg) {
  csv_stacks_job_t *j = arg;
  j->err = csv_stacks(j->x, j->snap);
  return NULL;
}

/* What the trace table's thread reads. */
typedef struct csv_trace_job_s {
  csv_file_t *o;
  const ms_snapshot_t *snap;
  const ms_timeline_t *tl;
  int64_t file_id, rank;
  bool has_rank;
} csv_trace_job_t;

/* The rows of every trace entry of every device: the trace table's thread. */
static void *csv_trace(void *arg) {
  csv_trace_job_t *j = arg;
  const ms_snapshot_t *snap = j->snap;
  csv_file_t *o = j->o;
  ms__xbuf_t tmp = {0};
  static const ms_tl_metric m[4] = {MS_TL_ALLOCATED, MS_TL_RESERVED, MS_TL_ACTIVE,
                                    MS_TL_REQUESTED};
  for (size_t d = 0; d < snap->ndevices && o->err == MS_OK; d++) {
    const ms_snap_device_t *dv = &snap->devices[d];
    /* the totals after each entry, as the SQLite export's columns (none: NULLs) */
    const uint64_t *v[4] = {NULL, NULL, NULL, NULL};
    bool totals = j->tl && d < ms_timeline_ndevices(j->tl) &&
                  ms_timeline_nentries(j->tl, d) == dv->ntrace;
    /* the four in one pass over the trace (the index keeps no series until asked) */
    if (totals) (void)ms__tl_series_make(j->tl, d, (1u << MS_TL_METRIC_COUNT) - 1);
    for (int k = 0; k < 4 && totals; k++)
      if (!(v[k] = ms_timeline_series(j->tl, d, m[k]))) totals = false;
    uint32_t n = dv->first_trace >= snap->ntrace ? 0 : dv->ntrace;
    if (n > snap->ntrace - dv->first_trace) n = (uint32_t)(snap->ntrace - dv->first_trace);
    /* file_id, rank, device: the same on every row of the device */
    char head[80], *h = csv_num(head, j->file_id);
    h = j->has_rank ? csv_num(h, j->rank) : h + (*h = ',', 1);
    h = csv_num(h, (int64_t)d);
    size_t nhead = (size_t)(h - head);
    for (uint32_t i = 0; i < n && o->err == MS_OK; i++) {
      const ms_snap_trace_t *e = &snap->trace[(size_t)dv->first_trace + i];
      char *p = csv_room(o);
      memcpy(p, head, nhead);
      p = csv_num(p + nhead, i);
      const char *action = ms_trace_action_name((ms_trace_action)e->action);
      if (e->action == MS_TRACE_OTHER && ms_snap_trace_action_name(e)[0]) {
        csv_end(o, p);
        csv_text_utf8(&tmp, o, ms_snap_trace_action_name(e));
        p = csv_room(o);
        *p++ = ',';
      } else { /* PyTorch's names: no quote, no byte past ASCII */
        size_t an = strlen(action);
        *p++ = '"';
        memcpy(p, action, an);
        p += an;
        *p++ = '"';
        *p++ = ',';
      }
      p = csv_num(p, (int64_t)e->addr);
      p = csv_num(p, (int64_t)e->size);
      p = csv_num(p, (int64_t)ms_snap_trace_stream(e));
      p = (e->present & MS_TRACE_HAS_TIME) ? csv_num(p, e->time_us) : p + (*p = ',', 1);
      p = csv_opt(p, csv_stack(snap, e->stack), -1);
      if (totals) {
        for (int k = 0; k < 4; k++) p = csv_num(p, (int64_t)v[k][i + 1]);
      } else {
        memcpy(p, ",,,,", 4);
        p += 4;
      }
      csv_row_end(o, p);
    }
  }
  if (tmp.oom && o->err == MS_OK) o->err = MS_ENOMEM;
  ms__xbuf_release(&tmp);
  return NULL;
}

/* The allocations table: every block lifetime of every device (the SQLite export's rows). */
static int csv_allocations(ms_export_csv_t *x, const ms_attr_t *attr, const ms_timeline_t *tl,
                           bool has_rank, int64_t rank) {
  const ms_snapshot_t *snap = ms_timeline_snapshot(tl);
  csv_file_t *o = &x->f[MS_EXPORT_CSV_ALLOCATIONS];
  char src[1024];
  for (size_t d = 0; d < ms_timeline_ndevices(tl) && o->err == MS_OK; d++) {
    attr_life_t *lv = NULL;
    size_t n = 0;
    if (ms__attr_lifetimes(attr, d, &lv, &n) != MS_OK) return MS_ENOMEM;
    char head[80], *h = csv_num(head, x->nfiles);
    h = has_rank ? csv_num(h, rank) : h + (*h = ',', 1);
    h = csv_num(h, (int64_t)d);
    size_t nhead = (size_t)(h - head);
    uint32_t last_stack = MS_SNAP_NO_STACK - 1;
    size_t nsrc = 0;
    for (size_t i = 0; i < n && o->err == MS_OK; i++) {
      const attr_life_t *l = &lv[i];
      char *p = csv_room(o);
      memcpy(p, head, nhead);
      p = csv_num(p + nhead, (int64_t)i);
      p = csv_num(p, l->alloc_entry);
      p = csv_opt(p, l->freq_entry, -2);
      p = csv_opt(p, l->free_entry, -1);
      p = csv_opt(p, l->time_us, -1);
      p = csv_opt(p, l->free_time_us, -1);
      p = csv_num(p, (int64_t)l->address);
      p = csv_num(p, (int64_t)l->size);
      p = csv_num(p, (int64_t)l->requested_size);
      p = csv_num(p, (int64_t)l->stream);
      p = csv_opt(p, csv_stack(snap, l->stack), -1);
      csv_end(o, p);
      if (l->stack != last_stack || i == 0) { /* runs of one stack are common */
        ms_attr_source(attr, l->stack, src, sizeof src);
        nsrc = strlen(src); /* what SQLite binds (the return value is the whole length) */
        last_stack = l->stack;
      }
      csv_text_n(o, src, nsrc);
      const char *cat = ms_category_name((ms_category)l->category);
      p = csv_room(o);
      *p++ = ',';
      *p++ = '"';
      size_t cn = strlen(cat);
      memcpy(p, cat, cn);
      p += cn;
      *p++ = '"';
      *p++ = ',';
      p = csv_i64(p, ms__export_life_class(l->time_us, l->free_time_us));
      csv_end(o, csv_line_end(p));
      o->rows++;
    }
    free(lv);
  }
  return o->err;
}

/* ---- the writer ------------------------------------------------------------------------------ */

void ms_export_csv_destroy(ms_export_csv_t *x) {
  if (!x) return;
  for (int i = 0; i < MS_EXPORT_CSV_NFILES; i++) {
    ms_gzip_sink_destroy(x->f[i].z);
    ms__pgz_destroy(x->f[i].pz);
    free(x->f[i].buf);
  }
  ms__pgz_pool_destroy(x->pool);
  ms__xbuf_release(&x->tmp);
  ms__xbuf_release(&x->locs);
  free(x->loc_end);
  free(x);
}

int ms_export_csv_create(ms_sink_t *const sinks[MS_EXPORT_CSV_NFILES], int level,
                         ms_export_csv_t **out, ms_errbuf_t *eb) {
  if (level < 1 || level > 9)
    return ms__errbuf_set(eb, MS_EINVAL, "gzip level %d is not 1 to 9", level);
  ms_export_csv_t *x = calloc(1, sizeof *x);
  if (!x) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  x->level = level;
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  x->jobs = ncpu < 1 ? 1 : ncpu > CSV_MAX_JOBS ? CSV_MAX_JOBS : (int)ncpu;
  for (int i = 0; i < MS_EXPORT_CSV_NFILES; i++) {
    csv_file_t *o = &x->f[i];
    x->sinks[i] = sinks[i];
    if (!(o->buf = malloc(CSV_BUF))) {
      ms_export_csv_destroy(x);
      return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
    }
    o->len = strlen(csv_headers[i]);
    memcpy(o->buf, csv_headers[i], o->len);
  }
  *out = x;
  return MS_OK;
}

int ms_export_csv_jobs(ms_export_csv_t *x, int jobs, ms_errbuf_t *eb) {
  if (jobs < 1 || jobs > 256)
    return ms__errbuf_set(eb, MS_EINVAL, "%d compressing jobs is not 1 to 256", jobs);
  if (x->started)
    return ms__errbuf_set(eb, MS_EINVAL, "the jobs are set before the first file is added");
  x->jobs = jobs;
  return MS_OK;
}

/* Makes each file's compressor: a zlib stream (one job) or a stream of the pool. */
static int csv_start(ms_export_csv_t *x) {
  if (x->started) return MS_OK;
  x->started = true;
  int err = x->jobs > 1 ? ms__pgz_pool_create(x->jobs, x->level, &x->pool) : MS_OK;
  for (int i = 0; i < MS_EXPORT_CSV_NFILES && err == MS_OK; i++) {
    csv_file_t *o = &x->f[i];
    if (x->pool)
      err = ms__pgz_create(x->pool, x->sinks[i], CSV_BUF, &o->pz);
    else
      err = ms_gzip_sink_create(x->sinks[i], x->level, &o->z, &o->gz);
  }
  for (int i = 0; i < MS_EXPORT_CSV_NFILES && err != MS_OK; i++) x->f[i].err = err;
  return err;
}

/* The first error of the files (the sink's own, or MS_ENOMEM). */
static int csv_error(const ms_export_csv_t *x, int *which) {
  for (int i = 0; i < MS_EXPORT_CSV_NFILES; i++)
    if (x->f[i].err != MS_OK) {
      *which = i;
      return x->f[i].err;
    }
  return MS_OK;
}

static int csv_fail(const ms_export_csv_t *x, int err, int which, ms_errbuf_t *eb) {
  if (err == MS_ENOMEM) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  return ms__errbuf_set(eb, err, "cannot write %s: %s", csv_names[which], ms_strerror(err));
  (void)x;
}

int ms_export_csv_add(ms_export_csv_t *x, const ms_snapshot_t *snap, const ms_timeline_t *tl,
                      const char *name, bool has_rank, int64_t rank, const char *timeline_error,
                      ms_errbuf_t *eb) {
  if (csv_start(x) != MS_OK) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  /* the trace and stacks tables need no time index: their threads start first */
  csv_trace_job_t job = {&x->f[MS_EXPORT_CSV_TRACE], snap, tl, x->nfiles, rank, has_rank};
  csv_stacks_job_t sj = {x, snap, MS_OK};
  pthread_t th, sth;
  bool threaded = pthread_create(&th, NULL, csv_trace, &job) == 0;
  bool sthreaded = pthread_create(&sth, NULL, csv_stacks_run, &sj) == 0;
  ms_attr_t *attr = NULL; /* sources and categories need the time index */
  int err = tl ? ms_attr_create(snap, tl, NULL, &attr, eb) : MS_OK;
  bool attr_failed = err != MS_OK;
  if (err == MS_OK) {
    csv_file_row(x, snap, tl, name, has_rank, rank, timeline_error);
    if (tl) err = csv_allocations(x, attr, tl, has_rank, rank);
  } else { /* this file's trace rows are written, not its others: the files are unusable */
    x->f[MS_EXPORT_CSV_ALLOCATIONS].err = err;
  }
  if (sthreaded)
    pthread_join(sth, NULL);
  else
    csv_stacks_run(&sj);
  if (threaded)
    pthread_join(th, NULL);
  else
    csv_trace(&job);
  if (err == MS_OK) err = sj.err;
  ms_attr_destroy(attr);
  if (attr_failed) return err == MS_ENOMEM ? ms__errbuf_set(eb, MS_ENOMEM, "out of memory") : err;
  int which = 0;
  if (err == MS_OK) err = csv_error(x, &which);
  if (err == MS_ENOMEM || x->tmp.oom) return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  if (err != MS_OK) return csv_fail(x, err, which, eb);
  x->nfiles++;
  return MS_OK;
}

int ms_export_csv_finish(ms_export_csv_t *x, ms_errbuf_t *eb) {
  int err = csv_start(x), which = 0;
  if (err != MS_OK) {
    ms_export_csv_destroy(x);
    return ms__errbuf_set(eb, MS_ENOMEM, "out of memory");
  }
  for (int i = 0; i < MS_EXPORT_CSV_NFILES && err == MS_OK; i++) {
    csv_file_t *o = &x->f[i];
    csv_flush(o);
    if (o->err == MS_OK) o->err = o->pz ? ms__pgz_finish(o->pz) : ms_gzip_sink_finish(o->z);
    err = csv_error(x, &which);
  }
  if (err != MS_OK) csv_fail(x, err, which, eb);
  ms_export_csv_destroy(x);
  return err;
}

uint64_t ms_export_csv_rows(const ms_export_csv_t *x, int file) {
  return file >= 0 && file < MS_EXPORT_CSV_NFILES ? x->f[file].rows : 0;
}
