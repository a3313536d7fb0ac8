/* SPDX-License-Identifier: MIT
 * memsnap CLI: many snapshots at once, one per rank (issue #17 §4): `memsnap timeline A B C...`
 * prints one row per file (rank): the peak of allocated memory with its device, entry and time,
 * reserved memory then and the fragmentation it means, the peak of reserved memory, the OOMs, and
 * the stack holding the most memory at the peak; then which rank peaked highest and the outliers
 * (a peak more than 10% above the median). `--json` gives the same rows.
 *
 * Files are read by a few worker threads (one per core by default, `--jobs N`), each loading a
 * file, computing its row and freeing the snapshot before taking the next file, so that at most
 * one snapshot per worker is in memory whatever the number of ranks.
 */
#include <ctype.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <dirent.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/export.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"

typedef struct ranks_row_s {
  const char *file;
  bool ok, has_rank, has_trace, has_time;
  char error[600];
  int64_t rank;
  size_t device, entries;
  uint64_t peak, reserved_at_peak, peak_reserved;
  int64_t entry, time_us, reserved_entry;
  uint64_t ooms;
  uint64_t top_bytes;
  char top_label[512];
  bool outlier;
} ranks_row_t;

typedef struct ranks_job_s {
  char **files;
  ranks_row_t *rows;
  size_t n, next;
  pthread_mutex_t lock; /* next; cli_top_compute (it sorts through a static) */
} ranks_job_t;

/* The row of one snapshot: the device whose allocated memory peaked highest. */
static void ranks_compute(ranks_job_t *job, ranks_row_t *r, const ms_snapshot_t *s) {
  r->has_rank = (s->present & MS_SNAP_HAS_RANK) != 0;
  r->rank = s->rank;
  if (!r->has_rank) r->has_rank = ms_export_rank_from_name(r->file, &r->rank);
  for (size_t i = 0; i < s->ntrace; i++) r->ooms += s->trace[i].action == MS_TRACE_OOM;
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  if (ms_timeline_create(s, NULL, &tl, &eb) != MS_OK) {
    snprintf(r->error, sizeof r->error, "%s", eb.msg[0] ? eb.msg : "cannot index the trace");
    return;
  }
  bool found = false;
  ms_tl_peak_t best = {0};
  for (size_t d = 0; d < ms_timeline_ndevices(tl); d++) {
    ms_tl_peak_t p;
    if (ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, SIZE_MAX, &p) != MS_OK) continue;
    if (!found || p.bytes > best.bytes) {
      best = p;
      r->device = d;
      found = true;
    }
  }
  if (!found) {
    snprintf(r->error, sizeof r->error, "no device has a trace or segments");
    ms_timeline_destroy(tl);
    return;
  }
  r->entries = ms_timeline_nentries(tl, r->device);
  r->has_trace = r->entries > 0;
  r->peak = best.bytes;
  r->entry = best.entry;
  r->time_us = best.time_us;
  r->has_time = best.has_time;
  uint64_t tot[MS_TL_METRIC_COUNT];
  if (ms_timeline_totals_at(tl, r->device, best.step, tot) == MS_OK)
    r->reserved_at_peak = tot[MS_TL_RESERVED];
  ms_tl_peak_t pr;
  if (ms_timeline_peak(tl, r->device, MS_TL_RESERVED, 0, SIZE_MAX, &pr) == MS_OK) {
    r->peak_reserved = pr.bytes;
    r->reserved_entry = pr.entry;
  }
  ms_snapshot_t *at = NULL;
  if (ms_timeline_snapshot_at(tl, r->device, best.step, NULL, &at) == MS_OK) {
    cli_top_t top;
    pthread_mutex_lock(&job->lock);
    int err = cli_top_compute(at, CLI_TOP_STACK, &top);
    pthread_mutex_unlock(&job->lock);
    if (err == MS_OK && top.nitems > 0) {
      r->top_bytes = top.items[0].bytes;
      cli_top_label(at, &top, 0, r->top_label, sizeof r->top_label);
    }
    if (err == MS_OK) cli_top_release(&top);
    ms_snapshot_free(at);
  }
  ms_timeline_destroy(tl);
  r->ok = true;
}

static void *ranks_worker(void *arg) {
  ranks_job_t *job = arg;
  for (;;) {
    pthread_mutex_lock(&job->lock);
    size_t i = job->next++;
    pthread_mutex_unlock(&job->lock);
    if (i >= job->n) return NULL;
    ranks_row_t *r = &job->rows[i];
    r->file = cli_display_name(job->files[i]);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    if (ms_snapshot_load(job->files[i], &s, &eb) != MS_OK) {
      r->has_rank = ms_export_rank_from_name(r->file, &r->rank); /* which rank crashed */
      snprintf(r->error, sizeof r->error, "%s", eb.msg[0] ? eb.msg : "cannot read it");
      continue;
    }
    ranks_compute(job, r, s);
    ms_snapshot_free(s);
  }
}

static int ranks_cmp_u64(const void *a, const void *b) {
  uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
  return x < y ? -1 : x > y;
}

/* Marks the outliers; @return the median peak (0 without rows) and *best the highest row. */
static uint64_t ranks_outliers(ranks_row_t *rows, size_t n, size_t *best) {
  uint64_t *v = malloc((n ? n : 1) * sizeof *v);
  size_t k = 0;
  *best = SIZE_MAX;
  for (size_t i = 0; i < n; i++) {
    if (!rows[i].ok) continue;
    if (v) v[k++] = rows[i].peak;
    if (*best == SIZE_MAX || rows[i].peak > rows[*best].peak) *best = i;
  }
  uint64_t med = 0;
  if (v && k) {
    qsort(v, k, sizeof *v, ranks_cmp_u64);
    med = k % 2 ? v[k / 2] : v[k / 2 - 1] / 2 + v[k / 2] / 2 + (v[k / 2 - 1] % 2 + v[k / 2] % 2) / 2;
  }
  free(v);
  for (size_t i = 0; i < n; i++)
    rows[i].outlier = rows[i].ok && k > 1 && (double)rows[i].peak > 1.1 * (double)med;
  return med;
}

static void ranks_json_str(FILE *out, const char *s) {
  fputc('"', out);
  for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
    if (*p == '"' || *p == '\\')
      fprintf(out, "\\%c", *p);
    else if (*p < 0x20)
      fprintf(out, "\\u%04x", *p);
    else
      fputc(*p, out);
  }
  fputc('"', out);
}

static void ranks_row_json(FILE *out, const ranks_row_t *r, bool outlier);

static void ranks_print_json(FILE *out, const ranks_row_t *rows, size_t n, uint64_t med,
                             size_t best) {
  /* highest: the rank that peaked highest (null: none, or its file has no rank), and its file */
  fprintf(out, "{\"median_peak_allocated\": %" PRIu64 ", \"highest\": ", med);
  if (best != SIZE_MAX && rows[best].has_rank)
    fprintf(out, "%" PRId64, rows[best].rank);
  else
    fputs("null", out);
  fputs(", \"highest_file\": ", out);
  if (best == SIZE_MAX)
    fputs("null", out);
  else
    ranks_json_str(out, rows[best].file);
  fputs(", \"files\": [", out);
  for (size_t i = 0; i < n; i++) {
    fputs(i ? ",\n" : "\n", out);
    ranks_row_json(out, &rows[i], true);
  }
  fputs("]}\n", out);
}

/* One row as a JSON object: the rows of `--json`, and `memsnap summary --json` (without the
 * outlier mark, which needs the other ranks). */
static void ranks_row_json(FILE *out, const ranks_row_t *r, bool outlier) {
  fputs("{\"file\": ", out);
  ranks_json_str(out, r->file);
  fputs(", \"rank\": ", out);
  if (r->has_rank)
    fprintf(out, "%" PRId64, r->rank);
  else
    fputs("null", out);
  if (!r->ok) {
    fputs(", \"error\": ", out);
    ranks_json_str(out, r->error);
    fputc('}', out);
    return;
  }
  fprintf(out,
          ", \"device\": %zu, \"entries\": %zu, \"peak_allocated\": %" PRIu64
          ", \"entry\": %" PRId64 ", \"time_us\": ",
          r->device, r->entries, r->peak, r->entry);
  if (r->has_time)
    fprintf(out, "%" PRId64, r->time_us);
  else
    fputs("null", out);
  fprintf(out,
          ", \"reserved_at_peak\": %" PRIu64 ", \"fragmentation\": %.6f, \"peak_reserved\": "
          "%" PRIu64 ", \"peak_reserved_entry\": %" PRId64 ", \"ooms\": %" PRIu64
          ", \"top_stack_bytes\": %" PRIu64 ", \"top_stack\": ",
          r->reserved_at_peak,
          r->reserved_at_peak ? 1.0 - (double)r->peak / (double)r->reserved_at_peak : 0.0,
          r->peak_reserved, r->reserved_entry, r->ooms, r->top_bytes);
  ranks_json_str(out, r->top_label);
  if (outlier) fprintf(out, ", \"outlier\": %s", r->outlier ? "true" : "false");
  fputc('}', out);
}

static void ranks_print_text(FILE *out, const ranks_row_t *rows, size_t n, uint64_t med,
                             size_t best) {
  fprintf(out, "%-5s %-24s %3s %8s %12s %8s %12s %6s %12s %5s  %s\n", "rank", "file", "dev",
          "entries", "peak alloc", "at entry", "reserved", "frag", "peak reserv", "OOMs",
          "largest stack at the peak");
  for (size_t i = 0; i < n; i++) {
    const ranks_row_t *r = &rows[i];
    char rank[24] = "-", a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ], c[CLI_BYTES_BUFSZ],
         t[CLI_BYTES_BUFSZ];
    if (r->has_rank) snprintf(rank, sizeof rank, "%" PRId64, r->rank);
    if (!r->ok) {
      fprintf(out, "%-5s %-24s error: %s\n", rank, r->file, r->error);
      continue;
    }
    double frag =
        r->reserved_at_peak ? 100.0 * (1.0 - (double)r->peak / (double)r->reserved_at_peak) : 0;
    fprintf(out, "%-5s %-24s %3zu %8zu %12s %8" PRId64 " %12s %5.1f%% %12s %5" PRIu64 "  %s %s%s\n",
            rank, r->file, r->device, r->entries, cli_format_ubytes(r->peak, a), r->entry,
            cli_format_ubytes(r->reserved_at_peak, b), frag,
            cli_format_ubytes(r->peak_reserved, c), r->ooms,
            cli_format_ubytes(r->top_bytes, t), r->top_label[0] ? r->top_label : "-",
            r->outlier ? "  << outlier" : "");
  }
  if (best == SIZE_MAX) return;
  const ranks_row_t *h = &rows[best];
  char a[CLI_BYTES_BUFSZ], m[CLI_BYTES_BUFSZ], when[96] = "";
  if (h->has_time) {
    ms_snap_trace_t e;
    memset(&e, 0, sizeof e);
    e.time_us = h->time_us;
    e.present = MS_TRACE_HAS_TIME;
    char tt[80];
    cli_format_time(&e, tt, sizeof tt);
    snprintf(when, sizeof when, ", %s", tt);
  }
  char who[64] = "";
  if (h->has_rank) snprintf(who, sizeof who, "rank %" PRId64 ", ", h->rank);
  fprintf(out, "\nhighest peak: %s%s: %s on device %zu after entry %" PRId64 "%s\n", who, h->file,
          cli_format_ubytes(h->peak, a), h->device, h->entry, when);
  fprintf(out, "median peak: %s", cli_format_ubytes(med, m));
  if (med) fprintf(out, "; the highest is %.2fx the median", (double)h->peak / (double)med);
  fputc('\n', out);
  size_t nout = 0;
  for (size_t i = 0; i < n; i++) nout += rows[i].outlier;
  fprintf(out, "outliers (peak more than 10%% above the median): %zu\n", nout);
}

static bool ranks_is_dir(const char *path) {
  struct stat st;
  return strcmp(path, "-") != 0 && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

bool cli_ranks_wanted(char **files, int nfiles) {
  return nfiles > 1 || (nfiles == 1 && ranks_is_dir(files[0]));
}

/* Names in natural order: runs of digits compare by value, so rank2 comes before rank10. */
static int ranks_cmp_str(const void *a, const void *b) {
  const unsigned char *x = *(unsigned char *const *)a, *y = *(unsigned char *const *)b;
  while (*x && *y) {
    if (isdigit(*x) && isdigit(*y)) {
      while (*x == '0' && isdigit(x[1])) x++;
      while (*y == '0' && isdigit(y[1])) y++;
      size_t nx = 0, ny = 0;
      while (isdigit(x[nx])) nx++;
      while (isdigit(y[ny])) ny++;
      if (nx != ny) return nx < ny ? -1 : 1;
      int c = memcmp(x, y, nx);
      if (c) return c;
      x += nx;
      y += ny;
    } else {
      if (*x != *y) return *x < *y ? -1 : 1;
      x++;
      y++;
    }
  }
  if (*x || *y) return *x ? 1 : -1;
  return strcmp(*(char *const *)a, *(char *const *)b); /* rank01 and rank1: a fixed order */
}

typedef struct ranks_list_s {
  char **v;
  size_t n, cap;
} ranks_list_t;

static bool ranks_push(ranks_list_t *l, char *p) {
  if (!p) return false;
  if (l->n == l->cap) {
    size_t nc = l->cap ? l->cap * 2 : 16;
    char **q = realloc(l->v, nc * sizeof *q);
    if (!q) {
      free(p);
      return false;
    }
    l->v = q;
    l->cap = nc;
  }
  l->v[l->n++] = p;
  return true;
}

static void ranks_list_free(ranks_list_t *l) {
  for (size_t i = 0; i < l->n; i++) free(l->v[i]);
  free(l->v);
}

/* Whether a name ends as a snapshot's does (.pickle, .pkl, .msgpack, .memsnap, maybe .gz). */
static bool ranks_snapshot_name(const char *path) {
  static const char *const ext[] = {".pickle", ".pkl", ".msgpack", ".memsnap"};
  size_t n = strlen(path);
  if (n > 3 && strcmp(path + n - 3, ".gz") == 0) n -= 3;
  for (size_t i = 0; i < sizeof ext / sizeof *ext; i++) {
    size_t k = strlen(ext[i]);
    if (n > k && strncmp(path + n - k, ext[i], k) == 0) return true;
  }
  return false;
}

/* A file of a directory is taken when its first bytes are a snapshot's (a memsnap file, a
 * pickle, or gzip-compressed): a run's directory also holds logs and scripts. One named as a
 * snapshot is taken whatever it holds: a crashed rank leaves an empty or truncated rankN.pickle,
 * which must be reported, not skipped (issue #31). */
static bool ranks_looks_like_snapshot(const char *path) {
  if (ranks_snapshot_name(path)) return true;
  unsigned char head[4096];
  FILE *f = fopen(path, "rb");
  if (!f) return true; /* named, so that the error says why it cannot be read */
  size_t n = fread(head, 1, sizeof head, f);
  fclose(f);
  if (n >= 2 && head[0] == 0x1f && head[1] == 0x8b) return true;
  return ms_format_detect(head, n) != MS_FORMAT_UNKNOWN;
}

/* The regular files of a directory (not hidden) that look like snapshots, sorted by name,
 * appended to l. @return CLI_OK or CLI_FAILURE (printed). */
static int ranks_dir(ranks_list_t *l, const char *dir) {
  DIR *d = opendir(dir);
  if (!d) {
    cli_error("cannot open the directory '%s'", dir);
    return CLI_FAILURE;
  }
  size_t first = l->n;
  int rc = CLI_OK;
  struct dirent *de;
  while (rc == CLI_OK && (de = readdir(d))) {
    if (de->d_name[0] == '.') continue;
    size_t len = strlen(dir) + strlen(de->d_name) + 2;
    char *p = malloc(len);
    if (p) snprintf(p, len, "%s/%s", dir, de->d_name);
    struct stat st;
    if (p && (stat(p, &st) != 0 || !S_ISREG(st.st_mode) || !ranks_looks_like_snapshot(p))) {
      free(p);
      continue;
    }
    if (!ranks_push(l, p)) {
      cli_error("out of memory");
      rc = CLI_FAILURE;
    }
  }
  closedir(d);
  if (rc == CLI_OK && l->n == first) {
    cli_error("'%s': no snapshot in the directory", dir);
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) qsort(l->v + first, l->n - first, sizeof *l->v, ranks_cmp_str);
  return rc;
}

int cli_expand_files(char **args, int nargs, char ***out, int *nout) {
  ranks_list_t l = {0};
  int rc = CLI_OK;
  for (int i = 0; i < nargs && rc == CLI_OK; i++) {
    if (ranks_is_dir(args[i])) {
      rc = ranks_dir(&l, args[i]);
    } else if (!ranks_push(&l, strdup(args[i]))) {
      cli_error("out of memory");
      rc = CLI_FAILURE;
    }
  }
  if (rc == CLI_OK && l.n > (size_t)INT32_MAX) {
    cli_error("too many files");
    rc = CLI_FAILURE;
  }
  if (rc != CLI_OK) {
    ranks_list_free(&l);
    return rc;
  }
  *out = l.v;
  *nout = (int)l.n;
  return CLI_OK;
}

void cli_files_free(char **files, int n) {
  for (int i = 0; i < n; i++) free(files[i]);
  free(files);
}

int cli_ranks(const char *cmd, char **args, int nargs, bool json, const char *jobs_s,
              bool keep_going) {
  char **files = NULL;
  int n = 0;
  int rc = cli_expand_files(args, nargs, &files, &n);
  if (rc != CLI_OK) return rc;
  rc = cli_ranks_files(cmd, files, n, json, jobs_s, keep_going);
  cli_files_free(files, n);
  return rc;
}

/* Reports the rows that failed (errors, or warnings with keep_going), marks the outliers and
 * prints the table. @return CLI_OK, or CLI_FAILURE when a row failed without keep_going. */
static int ranks_report(ranks_row_t *rows, size_t n, bool json, bool keep_going) {
  int rc = CLI_OK;
  for (size_t i = 0; i < n; i++) {
    if (rows[i].ok) continue;
    char quoted[600];
    snprintf(quoted, sizeof quoted, "'%s'", rows[i].file);
    char msg[1300];
    if (strstr(rows[i].error, quoted))
      snprintf(msg, sizeof msg, "%s", rows[i].error);
    else
      snprintf(msg, sizeof msg, "%s: %.*s", quoted, (int)sizeof rows[i].error, rows[i].error);
    if (keep_going) {
      cli_warning("skipped %s", msg);
    } else {
      cli_error("%s", msg);
      rc = CLI_FAILURE;
    }
  }
  size_t best;
  uint64_t med = ranks_outliers(rows, n, &best);
  if (json)
    ranks_print_json(stdout, rows, n, med, best);
  else
    ranks_print_text(stdout, rows, n, med, best);
  return rc;
}

int cli_ranks_files(const char *cmd, char **files, int nfiles, bool json, const char *jobs_s,
                    bool keep_going) {
  long ncpu = sysconf(_SC_NPROCESSORS_ONLN);
  unsigned jobs = ncpu > 0 ? (unsigned)ncpu : 1;
  int prc = jobs_s ? cli_parse_jobs(cmd, jobs_s, 256, &jobs) : CLI_OK;
  if (prc != CLI_OK) return prc;
  if (jobs > (unsigned)nfiles) jobs = (unsigned)nfiles;
  ranks_job_t job = {files, calloc((size_t)nfiles, sizeof(ranks_row_t)), (size_t)nfiles, 0,
                     PTHREAD_MUTEX_INITIALIZER};
  pthread_t *th = calloc(jobs, sizeof *th);
  if (!job.rows || !th) {
    free(job.rows);
    free(th);
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  cli_progress_start("reading %d files", nfiles);
  size_t started = 0;
  for (; started < jobs; started++)
    if (pthread_create(&th[started], NULL, ranks_worker, &job) != 0) break;
  if (started == 0) ranks_worker(&job);
  for (size_t i = 0; i < started; i++) pthread_join(th[i], NULL);
  cli_progress_stop();
  int rc = ranks_report(job.rows, job.n, json, keep_going);
  free(job.rows);
  free(th);
  return rc;
}

/* ---- one rank at a time: memsnap summary FILE, timeline --from-summaries DIR (issue #31) ---- */

int cli_summary(const char *file, bool json) {
  char *files[1] = {(char *)file};
  ranks_row_t row = {0};
  ranks_job_t job = {files, &row, 1, 0, PTHREAD_MUTEX_INITIALIZER};
  ranks_worker(&job);
  if (!json) return ranks_report(&row, 1, false, false);
  ranks_row_json(stdout, &row, false);
  fputc('\n', stdout);
  if (row.ok) return CLI_OK;
  cli_error("'%s': %s", row.file, row.error);
  return CLI_FAILURE;
}

/* The value after "key": in the flat JSON object text (keys never occur inside its strings,
 * whose quotes are escaped), or NULL. */
static const char *summary_value(const char *text, const char *key) {
  char k[64];
  snprintf(k, sizeof k, "\"%s\": ", key);
  const char *p = strstr(text, k);
  return p ? p + strlen(k) : NULL;
}

/* A string value as ranks_json_str wrote it (\" \\ and \u00XX escapes) into buf.
 * @return false when it is not one. */
static bool summary_str(const char *text, const char *key, char *buf, size_t cap) {
  const char *p = summary_value(text, key);
  if (!p || *p != '"') return false;
  size_t n = 0;
  for (p++; *p && *p != '"'; p++) {
    char c = *p;
    if (c == '\\') {
      if (p[1] == 'u' && p[2] && p[3] && p[4] && p[5]) {
        char hex[5] = {p[2], p[3], p[4], p[5], 0};
        c = (char)strtol(hex, NULL, 16);
        p += 5;
      } else if (p[1]) {
        c = *++p;
      }
    }
    if (n + 1 < cap) buf[n++] = c;
  }
  buf[n] = 0;
  return *p == '"';
}

/* A number value (null: false, *v untouched). */
static bool summary_i64(const char *text, const char *key, int64_t *v) {
  const char *p = summary_value(text, key);
  if (!p || (*p != '-' && !isdigit((unsigned char)*p))) return false;
  *v = strtoll(p, NULL, 10);
  return true;
}

/* A row from one line of `memsnap summary --json`. @return false when it is not one. */
static bool summary_parse(const char *text, ranks_row_t *r, char *file, size_t cap) {
  if (!summary_str(text, "file", file, cap)) return false;
  r->file = file;
  r->has_rank = summary_i64(text, "rank", &r->rank);
  if (summary_str(text, "error", r->error, sizeof r->error)) return true;
  int64_t dev, entries, peak, res, pres, ooms, top;
  if (!summary_i64(text, "device", &dev) || !summary_i64(text, "entries", &entries) ||
      !summary_i64(text, "peak_allocated", &peak) || !summary_i64(text, "entry", &r->entry) ||
      !summary_i64(text, "reserved_at_peak", &res) ||
      !summary_i64(text, "peak_reserved", &pres) ||
      !summary_i64(text, "peak_reserved_entry", &r->reserved_entry) ||
      !summary_i64(text, "ooms", &ooms) || !summary_i64(text, "top_stack_bytes", &top) ||
      !summary_str(text, "top_stack", r->top_label, sizeof r->top_label))
    return false;
  r->has_time = summary_i64(text, "time_us", &r->time_us);
  r->device = (size_t)dev;
  r->entries = (size_t)entries;
  r->has_trace = r->entries > 0;
  r->peak = (uint64_t)peak;
  r->reserved_at_peak = (uint64_t)res;
  r->peak_reserved = (uint64_t)pres;
  r->ooms = (uint64_t)ooms;
  r->top_bytes = (uint64_t)top;
  r->ok = true;
  return true;
}

/* The text of a summary file (at most 1 MiB; a summary is a line). @return it (free()) or NULL. */
static char *summary_read(const char *path) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  char *text = malloc((1u << 20) + 1);
  size_t n = text ? fread(text, 1, 1u << 20, f) : 0;
  fclose(f);
  if (text) text[n] = 0;
  return text;
}

/* The rows of the *.json files of dir (natural order), one summary each. */
int cli_ranks_from_summaries(const char *dir, bool json, bool keep_going) {
  DIR *d = opendir(dir);
  if (!d) {
    cli_error("cannot open the directory '%s'", dir);
    return CLI_FAILURE;
  }
  ranks_list_t l = {0};
  struct dirent *de;
  int rc = CLI_OK;
  while (rc == CLI_OK && (de = readdir(d))) {
    size_t len = strlen(de->d_name);
    if (de->d_name[0] == '.' || len < 6 || strcmp(de->d_name + len - 5, ".json") != 0) continue;
    size_t n = strlen(dir) + len + 2;
    char *p = malloc(n);
    if (p) snprintf(p, n, "%s/%s", dir, de->d_name);
    if (!ranks_push(&l, p)) rc = CLI_FAILURE;
  }
  closedir(d);
  if (rc == CLI_OK && l.n == 0) {
    cli_error("'%s': no summary (*.json) in the directory", dir);
    rc = CLI_FAILURE;
  }
  ranks_row_t *rows = rc == CLI_OK ? calloc(l.n, sizeof *rows) : NULL;
  char(*names)[600] = rows ? calloc(l.n, sizeof *names) : NULL;
  if (rc == CLI_OK && !names) {
    cli_error("out of memory");
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) qsort(l.v, l.n, sizeof *l.v, ranks_cmp_str);
  for (size_t i = 0; rc == CLI_OK && i < l.n; i++) {
    char *text = summary_read(l.v[i]);
    if (!text || !summary_parse(text, &rows[i], names[i], sizeof names[i])) {
      rows[i].file = l.v[i];
      snprintf(rows[i].error, sizeof rows[i].error, "not a summary of `memsnap summary --json`");
    }
    free(text);
  }
  if (rc == CLI_OK) rc = ranks_report(rows, l.n, json, keep_going);
  free(names);
  free(rows);
  ranks_list_free(&l);
  return rc;
}

static const char summary_usage[] =
    "usage: memsnap summary FILE [--json]\n"
    "\n"
    "The row of one rank that `memsnap timeline FILE FILE...` prints: the device whose allocated\n"
    "memory peaked highest, the peak and its entry, reserved memory, OOMs and the largest stack\n"
    "at the peak. With --json, one JSON line: run it per rank in any job runner (GNU parallel,\n"
    "a Slurm array, Spark), then merge with `memsnap timeline --from-summaries DIR`\n"
    "(docs/exports.md).\n"
    "\n"
    "options:\n"
    "  --json      one JSON line\n"
    "  -h, --help  show this help\n";

int cmd_summary(int argc, char **argv) {
  int json = 0;
  const struct cli_opt opts[] = {{"json", 0, &json, NULL}, {NULL, 0, NULL, NULL}};
  char *pos[1] = {NULL};
  int npos = 0;
  int rc = cli_parse_options("summary", summary_usage, opts, argc, argv, pos, 1, &npos);
  if (rc == CLI_HELP_SHOWN) return CLI_OK;
  if (rc != CLI_OK) return rc;
  if (npos < 1) return cli_usage_error("summary", "missing FILE");
  return cli_summary(pos[0], json != 0);
}
