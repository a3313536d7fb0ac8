/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap compare DIR_A DIR_B` (issue #28 §3, docs/compare.md): the per-rank files
 * of two directories paired by file name, each pair compared (memsnap/compare.h, without the
 * leak search), one row per rank: the change in peak allocated and peak reserved memory and the
 * source that changed most. A rank *stands out* when its change in peak allocated or in peak
 * reserved memory lies further from the median change than max(3 x the median absolute
 * deviation, 1 MiB) (with three ranks or more): the ranks doing the same work change alike, and
 * the one that does not is the one to look at.
 *
 * Pairs are compared by --jobs worker threads (default: one per core), each holding one pair at
 * a time.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/attribution.h"

typedef struct cr_row_s {
  const char *name;      /* the file name both directories hold */
  char *path[2];
  bool ok;
  char error[600];
  int64_t peak_allocated[2], peak_reserved[2];
  int64_t change, change_reserved;
  char top[512];
  int64_t top_change;
  bool outlier;
} cr_row_t;

typedef struct cr_job_s {
  cr_row_t *rows;
  size_t n, next;
  const ms_compare_options_t *o;
  pthread_mutex_t lock;
} cr_job_t;

static void cr_compute(cr_job_t *job, cr_row_t *r) {
  ms_snapshot_t *s[2] = {NULL, NULL};
  ms_errbuf_t eb = {{0}};
  for (int k = 0; k < 2; k++)
    /* classified as read: the comparison's classifier has the default rules */
    if (ms_attr_load(r->path[k], MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS, NULL, &s[k], &eb) !=
        MS_OK) {
      snprintf(r->error, sizeof r->error, "'%s': %s", r->path[k], eb.msg[0] ? eb.msg : "cannot read it");
      ms_snapshot_free(s[0]);
      return;
    }
  ms_compare_options_t o = *job->o;
  o.leaks = false;
  o.nrows = 1;
  ms_compare_t *c = NULL;
  if (ms_compare_run(s[0], s[1], &o, &c, &eb) != MS_OK) {
    snprintf(r->error, sizeof r->error, "%s", eb.msg[0] ? eb.msg : "cannot compare them");
  } else {
    for (int k = 0; k < 2; k++) {
      r->peak_allocated[k] = (int64_t)c->side[k].peak_allocated;
      r->peak_reserved[k] = (int64_t)c->side[k].peak_reserved;
    }
    r->change = r->peak_allocated[1] - r->peak_allocated[0];
    r->change_reserved = r->peak_reserved[1] - r->peak_reserved[0];
    if (c->nsource) {
      snprintf(r->top, sizeof r->top, "%s", c->by_source[0].key);
      r->top_change = c->by_source[0].change;
    }
    r->ok = true;
  }
  ms_compare_free(c);
  ms_snapshot_free(s[0]);
  ms_snapshot_free(s[1]);
}

static void *cr_worker(void *arg) {
  cr_job_t *job = arg;
  for (;;) {
    pthread_mutex_lock(&job->lock);
    size_t i = job->next++;
    pthread_mutex_unlock(&job->lock);
    if (i >= job->n) return NULL;
    cr_compute(job, &job->rows[i]);
  }
}

static int cr_i64_cmp(const void *a, const void *b) {
  int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;
  return x < y ? -1 : x > y;
}

/* The median of the rows' changes (which = 0: peak allocated, 1: peak reserved) and the
 * distance beyond which a change stands out: max(3 x the median absolute deviation, 1 MiB);
 * marks the rows beyond it (with three rows or more). */
static int64_t cr_outliers(cr_row_t *rows, size_t n, int which, int64_t *threshold) {
  int64_t *v = malloc((n ? n : 1) * sizeof *v);
  size_t m = 0;
  *threshold = 1 << 20;
  if (!v) return 0;
  for (size_t i = 0; i < n; i++)
    if (rows[i].ok) v[m++] = which ? rows[i].change_reserved : rows[i].change;
  int64_t med = 0, mad = 0;
  if (m) {
    qsort(v, m, sizeof *v, cr_i64_cmp);
    med = v[m / 2];
    for (size_t i = 0; i < m; i++) v[i] = v[i] > med ? v[i] - med : med - v[i];
    qsort(v, m, sizeof *v, cr_i64_cmp);
    mad = v[m / 2];
  }
  free(v);
  if (3 * mad > *threshold) *threshold = 3 * mad;
  for (size_t i = 0; i < n && m >= 3; i++) {
    int64_t x = which ? rows[i].change_reserved : rows[i].change;
    int64_t d = x > med ? x - med : med - x;
    if (rows[i].ok && d > *threshold) rows[i].outlier = true;
  }
  return med;
}

static void cr_text(const cr_row_t *rows, size_t n, const int64_t med[2], const int64_t thr[2]) {
  char a[CLI_BYTES_BUFSZ], b[CLI_BYTES_BUFSZ], c[CLI_BYTES_BUFSZ], d[CLI_BYTES_BUFSZ];
  printf("%-28s %13s %13s %13s %13s  %s\n", "rank (file)", "peak alloc A", "peak alloc B",
         "change", "reserved chg", "source that changed most");
  size_t nout = 0;
  for (size_t i = 0; i < n; i++) {
    const cr_row_t *r = &rows[i];
    if (!r->ok) {
      printf("%-28s error: %s\n", r->name, r->error);
      continue;
    }
    nout += r->outlier;
    printf("%-28s %13s %13s %13s %13s  %s%s%s\n", r->name,
           cli_format_bytes(r->peak_allocated[0], a), cli_format_bytes(r->peak_allocated[1], b),
           cli_format_bytes(r->change, c), cli_format_bytes(r->change_reserved, d),
           r->top[0] ? r->top : "-", r->outlier ? "  <- stands out" : "", "");
  }
  printf("\nmedian change: peak allocated %s, peak reserved %s; a rank stands out beyond %s and "
         "%s from them: ", cli_format_bytes(med[0], a), cli_format_bytes(med[1], b),
         cli_format_bytes(thr[0], c), cli_format_bytes(thr[1], d));
  if (!nout) printf("none does\n");
  else printf("%zu rank%s\n", nout, nout == 1 ? "" : "s");
}

static int cr_json(const cr_row_t *rows, size_t n, const int64_t med[2], const int64_t thr[2]) {
  cli_out_t o;
  int rc = cli_out_open(&o, "-");
  if (rc != CLI_OK) return rc;
  cli_json_t j = {&o.sink, 0};
  cli_json_lit(&j, "{\"command\": \"compare\", \"view\": \"ranks\", \"median_change\": ");
  cli_json_i64(&j, med[0]);
  cli_json_lit(&j, ", \"threshold\": ");
  cli_json_i64(&j, thr[0]);
  cli_json_lit(&j, ", \"median_change_reserved\": ");
  cli_json_i64(&j, med[1]);
  cli_json_lit(&j, ", \"threshold_reserved\": ");
  cli_json_i64(&j, thr[1]);
  cli_json_lit(&j, ", \"ranks\": [");
  for (size_t i = 0; i < n; i++) {
    const cr_row_t *r = &rows[i];
    cli_json_lit(&j, i ? ", {\"file\": " : "{\"file\": ");
    cli_json_str(&j, r->name);
    if (!r->ok) {
      cli_json_lit(&j, ", \"error\": ");
      cli_json_str(&j, r->error);
      cli_json_lit(&j, "}");
      continue;
    }
    const struct { const char *k; int64_t v; } f[] = {
        {"peak_allocated_before", r->peak_allocated[0]}, {"peak_allocated_after", r->peak_allocated[1]},
        {"change", r->change}, {"peak_reserved_before", r->peak_reserved[0]},
        {"peak_reserved_after", r->peak_reserved[1]}, {"change_reserved", r->change_reserved},
        {"top_change", r->top_change}};
    for (size_t k = 0; k < sizeof f / sizeof *f; k++) {
      cli_json_lit(&j, ", \"");
      cli_json_lit(&j, f[k].k);
      cli_json_lit(&j, "\": ");
      cli_json_i64(&j, f[k].v);
    }
    cli_json_lit(&j, ", \"top_source\": ");
    if (r->top[0]) cli_json_str(&j, r->top);
    else cli_json_lit(&j, "null");
    cli_json_lit(&j, r->outlier ? ", \"stands_out\": true}" : ", \"stands_out\": false}");
  }
  cli_json_lit(&j, "]}\n");
  if (j.err != MS_OK) return cli_out_fail(&o, j.err, NULL);
  return cli_out_commit(&o);
}

static const char *cr_base(const char *p) {
  const char *s = strrchr(p, '/');
  return s ? s + 1 : p;
}

/* The pairs: files of A whose name B holds too (both lists are sorted by name). */
static size_t cr_pair(char **fa, int na, char **fb, int nb, cr_row_t *rows) {
  size_t n = 0;
  int i = 0, k = 0;
  while (i < na || k < nb) {
    int c = i >= na ? 1 : k >= nb ? -1 : strcmp(cr_base(fa[i]), cr_base(fb[k]));
    if (c < 0) cli_warning("'%s' has no file of the same name in the other directory", fa[i++]);
    else if (c > 0) cli_warning("'%s' has no file of the same name in the other directory", fb[k++]);
    else {
      rows[n].name = cr_base(fa[i]);
      rows[n].path[0] = fa[i++];
      rows[n++].path[1] = fb[k++];
    }
  }
  return n;
}

int cli_compare_ranks(const char *dir_a, const char *dir_b, const ms_compare_options_t *o,
                      bool json, unsigned jobs) {
  unsigned nthreads = jobs;
  char *args[2] = {(char *)dir_a, (char *)dir_b};
  char **files[2] = {NULL, NULL};
  int nf[2] = {0, 0};
  int rc = CLI_OK;
  for (int k = 0; k < 2 && rc == CLI_OK; k++)
    rc = cli_expand_files(&args[k], 1, &files[k], &nf[k]);
  cr_row_t *rows = rc == CLI_OK ? calloc((size_t)nf[0] + 1, sizeof *rows) : NULL;
  if (rc == CLI_OK && !rows) {
    cli_error("out of memory");
    rc = CLI_FAILURE;
  }
  size_t n = rc == CLI_OK ? cr_pair(files[0], nf[0], files[1], nf[1], rows) : 0;
  if (rc == CLI_OK && n == 0) {
    cli_error("'%s' and '%s' hold no files of the same name to pair", dir_a, dir_b);
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) {
    if (!nthreads) {
      long c = sysconf(_SC_NPROCESSORS_ONLN);
      nthreads = c > 0 ? (unsigned)c : 1;
    }
    if (nthreads > n) nthreads = (unsigned)n;
    cr_job_t job = {rows, n, 0, o, PTHREAD_MUTEX_INITIALIZER};
    pthread_t th[64];
    unsigned started = 0;
    for (; started < nthreads && started < 64; started++)
      if (pthread_create(&th[started], NULL, cr_worker, &job) != 0) break;
    if (!started) cr_worker(&job);
    for (unsigned t = 0; t < started; t++) pthread_join(th[t], NULL);
    int64_t thr[2], med[2];
    for (int w = 0; w < 2; w++) med[w] = cr_outliers(rows, n, w, &thr[w]);
    bool failed = false;
    for (size_t i = 0; i < n; i++) failed |= !rows[i].ok;
    rc = json ? cr_json(rows, n, med, thr) : (cr_text(rows, n, med, thr), CLI_OK);
    if (rc == CLI_OK && failed) rc = CLI_FAILURE;
  }
  free(rows);
  for (int k = 0; k < 2; k++) cli_files_free(files[k], nf[k]);
  return rc;
}
