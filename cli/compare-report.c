/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap compare`'s default report (issue #28, docs/compare.md): the totals
 * before, after and their change, the change by category and by source line, the settings that
 * differ and the leak suspects, as text or JSON. The comparison is the library's
 * (memsnap/compare.h).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "memsnap/cache.h"
#include "memsnap/stats.h"

#define SZ(v, b) cli_format_ubytes((v), (b))

static const char *report_signed(int64_t v, char buf[CLI_BYTES_BUFSZ]) {
  if (v == 0) return "0";
  buf[0] = v < 0 ? '-' : '+';
  char t[CLI_BYTES_BUFSZ];
  cli_format_ubytes(v < 0 ? (uint64_t)0 - (uint64_t)v : (uint64_t)v, t);
  size_t n = strlen(t);
  if (n > CLI_BYTES_BUFSZ - 2) n = CLI_BYTES_BUFSZ - 2;
  memcpy(buf + 1, t, n);
  buf[n + 1] = 0;
  return buf;
}

static int64_t report_change(uint64_t b, uint64_t a) {
  return (int64_t)(a - b);
}

/* "the peak of allocated memory, after entry 12 of 40" / "the end state (no trace)". */
static void report_moment(const ms_compare_side_t *s, const char *at, char *buf, size_t cap) {
  if (!s->has_trace) {
    snprintf(buf, cap, "the end state (no trace)");
    return;
  }
  const char *what = at ? at : "peak";
  if (s->step == 0) snprintf(buf, cap, "%s: before entry 0 of %zu", what, s->nentries);
  else if (s->step == s->nentries) snprintf(buf, cap, "%s: the end, after entry %zu of %zu", what,
                                            s->step - 1, s->nentries);
  else snprintf(buf, cap, "%s: after entry %zu of %zu", what, s->step - 1, s->nentries);
}

static void report_bytes_row(FILE *out, const char *name, uint64_t b, uint64_t a) {
  char x[CLI_BYTES_BUFSZ], y[CLI_BYTES_BUFSZ], z[CLI_BYTES_BUFSZ];
  fprintf(out, "  %-22s %12s %12s %12s\n", name, SZ(b, x), SZ(a, y),
          report_signed(report_change(b, a), z));
}

static void report_count_row(FILE *out, const char *name, uint64_t b, uint64_t a) {
  char z[32];
  int64_t d = report_change(b, a);
  snprintf(z, sizeof z, d > 0 ? "+%" PRId64 : "%" PRId64, d);
  fprintf(out, "  %-22s %12" PRIu64 " %12" PRIu64 " %12s\n", name, b, a, z);
}

/* Warnings about sides that do not compare like with like. */
void cli_compare_warnings(const char *names[2], const ms_compare_t *c) {
  const ms_compare_side_t *b = &c->side[0], *a = &c->side[1];
  if (b->device != a->device)
    cli_warning("comparing device %zu of '%s' with device %zu of '%s' (--device N picks one)",
                b->device, names[0], a->device, names[1]);
  for (int s = 0; s < 2; s++)
    if (!c->side[s].has_trace)
      cli_warning("'%s' has no allocation trace on device %zu: its peaks are its end state's, and "
                  "it has no steps", names[s], c->side[s].device);
  if (b->has_capacity && a->has_capacity && b->capacity != a->capacity) {
    char x[CLI_BYTES_BUFSZ], y[CLI_BYTES_BUFSZ];
    cli_warning("the devices differ in size: %s in '%s', %s in '%s'", SZ(b->capacity, x),
                names[0], SZ(a->capacity, y), names[1]);
  }
}

static void report_text_rows(FILE *out, const ms_compare_t *c) {
  char x[CLI_BYTES_BUFSZ], y[CLI_BYTES_BUFSZ], z[CLI_BYTES_BUFSZ];
  fprintf(out, "\nallocated bytes at the moments, by category:\n");
  fprintf(out, "  %-22s %12s %12s %12s\n", "category", "before", "after", "change");
  for (int k = 0; k < MS_CAT_COUNT; k++) {
    const ms_compare_row_t *r = &c->by_category[k];
    if (!r->before && !r->after) continue;
    fprintf(out, "  %-22s %12s %12s %12s\n", r->key, SZ(r->before, x), SZ(r->after, y),
            report_signed(r->change, z));
  }
  fprintf(out, "\nby source line, largest change first");
  if (c->nsource < c->nsource_all)
    fprintf(out, " (%zu of %zu sources that changed; -n N shows more)", c->nsource, c->nsource_all);
  fprintf(out, ":\n");
  if (!c->nsource)
    fprintf(out, "  no source changed\n");
  else
    fprintf(out, "  %12s %12s %12s  %-16s %s\n", "change", "before", "after", "category", "source");
  for (size_t i = 0; i < c->nsource; i++) {
    const ms_compare_row_t *r = &c->by_source[i];
    fprintf(out, "  %12s %12s %12s  %-16s ", report_signed(r->change, z), SZ(r->before, x),
            SZ(r->after, y), ms_category_name(r->category));
    cli_fputs_escaped(r->key, out);
    fputc('\n', out);
  }
}

static void report_text_tail(FILE *out, const ms_compare_t *c) {
  char x[CLI_BYTES_BUFSZ], y[CLI_BYTES_BUFSZ];
  fprintf(out, "\nallocator settings: ");
  if (!c->nsettings) {
    fprintf(out, "the same (%zu recorded by both)\n", c->nsettings_same);
  } else {
    fprintf(out, "%zu differ%s (%zu the same)\n", c->nsettings, c->nsettings == 1 ? "s" : "",
            c->nsettings_same);
    for (size_t i = 0; i < c->nsettings; i++) {
      const ms_compare_setting_t *s = &c->settings[i];
      fprintf(out, "  ");
      cli_fputs_escaped(s->key, out);
      fprintf(out, ": ");
      cli_fputs_escaped(s->before[0] ? s->before : "(not recorded)", out);
      fprintf(out, " \u2192 ");
      cli_fputs_escaped(s->after[0] ? s->after : "(not recorded)", out);
      fputc('\n', out);
    }
  }
  fprintf(out, "\nleak suspects: ");
  if (!c->side[1].has_trace) {
    fprintf(out, "none looked for (AFTER has no trace)\n");
  } else if (c->steps < 2) {
    fprintf(out,
            "none looked for (AFTER's trace has %zu ProfilerStep#N range%s ended %s; two are "
            "needed)\n",
            c->steps, c->steps == 1 ? "" : "s",
            c->leaks_step == c->side[1].nentries ? "by its end" : "by its moment");
  } else if (!c->nleaks) {
    fprintf(out,
            "none (over %zu steps, no source's allocations stay alive by about the same amount "
            "every step)\n",
            c->steps);
  } else {
    fprintf(out,
            "%zu (over %zu steps: allocations made in each step and still alive at AFTER's "
            "%s)\n",
            c->nleaks, c->steps, c->leaks_step == c->side[1].nentries ? "end" : "moment");
    for (size_t i = 0; i < c->nleaks; i++) {
      const ms_compare_leak_t *l = &c->leaks[i];
      fprintf(out,
              "  %s per step (%" PRIu64 " block%s) in steps %" PRId64 "..%" PRId64 " (%zu steps, "
              "%s alive), %s: ",
              SZ(l->per_step, x), l->blocks_per_step, l->blocks_per_step == 1 ? "" : "s",
              l->first_step, l->last_step, l->nsteps, SZ(l->total, y),
              ms_category_name(l->category));
      cli_fputs_escaped(l->source, out);
      fputc('\n', out);
    }
  }
}

static void report_text(FILE *out, const char *names[2], const char *at[2], const ms_compare_t *c) {
  char m[2][160];
  for (int s = 0; s < 2; s++)
    report_moment(&c->side[s], at[s], m[s], sizeof m[s]);
  fprintf(out, "memsnap compare:\n  before: ");
  cli_fputs_escaped(names[0], out);
  fprintf(out, ", device %zu, %s\n  after:  ", c->side[0].device, m[0]);
  cli_fputs_escaped(names[1], out);
  fprintf(out, ", device %zu, %s\n\n", c->side[1].device, m[1]);
  const ms_compare_side_t *b = &c->side[0], *a = &c->side[1];
  fprintf(out, "  %-22s %12s %12s %12s\n", "totals", "before", "after", "change");
  report_bytes_row(out, "peak allocated", b->peak_allocated, a->peak_allocated);
  report_bytes_row(out, "peak reserved", b->peak_reserved, a->peak_reserved);
  report_bytes_row(out, "peak requested", b->peak_requested, a->peak_requested);
  fprintf(out, "  at the moments:\n");
  report_bytes_row(out, "allocated", b->allocated, a->allocated);
  report_bytes_row(out, "reserved", b->reserved, a->reserved);
  report_bytes_row(out, "requested", b->requested, a->requested);
  report_count_row(out, "segments", b->segments, a->segments);
  report_count_row(out, "blocks (live)", b->blocks, a->blocks);
  report_text_rows(out, c);
  report_text_tail(out, c);
}

/* ---- JSON ------------------------------------------------------------------------------------ */

static void jkey(cli_json_t *j, const char *k) {
  cli_json_lit(j, ", \"");
  cli_json_lit(j, k);
  cli_json_lit(j, "\": ");
}

static void report_json_side(cli_json_t *j, const char *name, const char *at,
                             const ms_compare_side_t *s) {
  cli_json_lit(j, "{\"file\": ");
  cli_json_str(j, name);
  jkey(j, "device");
  cli_json_u64(j, s->device);
  jkey(j, "has_trace");
  cli_json_lit(j, s->has_trace ? "true" : "false");
  jkey(j, "moment");
  cli_json_str(j, !s->has_trace ? "end" : at ? at : "peak");
  jkey(j, "step");
  cli_json_u64(j, s->step);
  jkey(j, "entries");
  cli_json_u64(j, s->nentries);
  const struct { const char *k; uint64_t v; } f[] = {
      {"peak_allocated", s->peak_allocated}, {"peak_reserved", s->peak_reserved},
      {"peak_requested", s->peak_requested}, {"allocated", s->allocated},
      {"reserved", s->reserved},             {"requested", s->requested},
      {"segments", s->segments},             {"blocks", s->blocks}};
  for (size_t i = 0; i < sizeof f / sizeof *f; i++) {
    jkey(j, f[i].k);
    cli_json_u64(j, f[i].v);
  }
  jkey(j, "capacity");
  if (s->has_capacity) cli_json_u64(j, s->capacity);
  else cli_json_lit(j, "null");
  cli_json_lit(j, "}");
}

static void report_json_row(cli_json_t *j, const ms_compare_row_t *r, bool source) {
  cli_json_lit(j, source ? "{\"source\": " : "{\"category\": ");
  cli_json_str(j, r->key);
  if (source) {
    jkey(j, "category");
    cli_json_str(j, ms_category_name(r->category));
  }
  jkey(j, "before");
  cli_json_u64(j, r->before);
  jkey(j, "after");
  cli_json_u64(j, r->after);
  jkey(j, "change");
  cli_json_i64(j, r->change);
  jkey(j, "blocks_before");
  cli_json_u64(j, r->blocks_before);
  jkey(j, "blocks_after");
  cli_json_u64(j, r->blocks_after);
  cli_json_lit(j, "}");
}

static void report_json_lists(cli_json_t *j, const ms_compare_t *c) {
  jkey(j, "by_category");
  cli_json_lit(j, "[");
  for (int k = 0; k < MS_CAT_COUNT; k++) {
    if (k) cli_json_lit(j, ", ");
    report_json_row(j, &c->by_category[k], false);
  }
  cli_json_lit(j, "]");
  jkey(j, "sources_changed");
  cli_json_u64(j, c->nsource_all);
  jkey(j, "by_source");
  cli_json_lit(j, "[");
  for (size_t i = 0; i < c->nsource; i++) {
    if (i) cli_json_lit(j, ", ");
    report_json_row(j, &c->by_source[i], true);
  }
  cli_json_lit(j, "]");
  jkey(j, "settings_same");
  cli_json_u64(j, c->nsettings_same);
  jkey(j, "settings");
  cli_json_lit(j, "[");
  for (size_t i = 0; i < c->nsettings; i++) {
    cli_json_lit(j, i ? ", {\"key\": " : "{\"key\": ");
    cli_json_str(j, c->settings[i].key);
    jkey(j, "before");
    if (c->settings[i].before[0]) cli_json_str(j, c->settings[i].before);
    else cli_json_lit(j, "null");
    jkey(j, "after");
    if (c->settings[i].after[0]) cli_json_str(j, c->settings[i].after);
    else cli_json_lit(j, "null");
    cli_json_lit(j, "}");
  }
  cli_json_lit(j, "]");
  jkey(j, "steps");
  cli_json_u64(j, c->steps);
  jkey(j, "leaks_step");
  cli_json_u64(j, c->leaks_step);
  jkey(j, "leaks");
  cli_json_lit(j, "[");
  for (size_t i = 0; i < c->nleaks; i++) {
    const ms_compare_leak_t *l = &c->leaks[i];
    cli_json_lit(j, i ? ", {\"source\": " : "{\"source\": ");
    cli_json_str(j, l->source);
    jkey(j, "category");
    cli_json_str(j, ms_category_name(l->category));
    jkey(j, "per_step");
    cli_json_u64(j, l->per_step);
    jkey(j, "blocks_per_step");
    cli_json_u64(j, l->blocks_per_step);
    jkey(j, "first_step");
    cli_json_i64(j, l->first_step);
    jkey(j, "last_step");
    cli_json_i64(j, l->last_step);
    jkey(j, "steps");
    cli_json_u64(j, l->nsteps);
    jkey(j, "total");
    cli_json_u64(j, l->total);
    cli_json_lit(j, "}");
  }
  cli_json_lit(j, "]");
}

static int report_json(const char *names[2], const char *at[2], const ms_compare_t *c) {
  cli_out_t o;
  int rc = cli_out_open(&o, "-");
  if (rc != CLI_OK) return rc;
  cli_json_t j = {&o.sink, 0};
  cli_json_lit(&j, "{\"command\": \"compare\", \"view\": \"report\"");
  jkey(&j, "before");
  report_json_side(&j, names[0], at[0], &c->side[0]);
  jkey(&j, "after");
  report_json_side(&j, names[1], at[1], &c->side[1]);
  const ms_compare_side_t *b = &c->side[0], *a = &c->side[1];
  jkey(&j, "change");
  cli_json_lit(&j, "{\"peak_allocated\": ");
  cli_json_i64(&j, report_change(b->peak_allocated, a->peak_allocated));
  jkey(&j, "peak_reserved");
  cli_json_i64(&j, report_change(b->peak_reserved, a->peak_reserved));
  jkey(&j, "peak_requested");
  cli_json_i64(&j, report_change(b->peak_requested, a->peak_requested));
  jkey(&j, "allocated");
  cli_json_i64(&j, report_change(b->allocated, a->allocated));
  jkey(&j, "reserved");
  cli_json_i64(&j, report_change(b->reserved, a->reserved));
  jkey(&j, "segments");
  cli_json_i64(&j, (int64_t)a->segments - (int64_t)b->segments);
  jkey(&j, "blocks");
  cli_json_i64(&j, (int64_t)a->blocks - (int64_t)b->blocks);
  cli_json_lit(&j, "}");
  report_json_lists(&j, c);
  cli_json_lit(&j, "}\n");
  if (j.err != MS_OK) return cli_out_fail(&o, j.err, NULL);
  return cli_out_commit(&o);
}

/* One side of a comparison of two files: read, indexed (through the snapshot cache, as
 * timeline's) and reduced into the comparison (cli_two_sides: on a thread of its own when both
 * files are read at once). */
/* How compare reads a file: the time index never reads free_requested's stacks; the blocks of
 * the moments compared take theirs from the file, and the classifier reads every allocation's
 * frames from it without keeping its stack (MS_LOAD_DEFER_STACKS). */
#define CLI_COMPARE_LOAD (MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS)

typedef struct report_side_s {
  const char *path;
  ms_compare_build_t *b;
  int rc, err;        /* the read's CLI_*, the reduction's MS_* */
  ms_cache_key_t key; /* the key the read was made under (all zero: none) */
  ms_errbuf_t eb;
} report_side_t;

static bool report_side_run(void *ctx, int k) {
  report_side_t *s = (report_side_t *)ctx + k;
  ms_snapshot_t *snap = NULL;
  s->err = MS_OK;
  s->rc = cli_load_keyed(s->path, CLI_COMPARE_LOAD, &snap, &s->key);
  if (s->rc == CLI_OK) {
    /* the index through the snapshot cache, as timeline's (none: compare builds it, and reports
     * its errors) */
    ms_timeline_t *tl = NULL;
    if ((s->key.hash || s->key.size) &&
        ms_cache_timeline(&s->key, NULL, snap, NULL, &tl, NULL, NULL) != MS_OK)
      tl = NULL;
    s->err = ms_compare_add_side(s->b, k, snap, tl, &s->eb);
    ms_timeline_destroy(tl);
    ms_snapshot_free(snap);
  }
  return s->rc == CLI_OK && s->err == MS_OK;
}

/* The comparison of the two files at paths[], both read at once or one after the other, one
 * snapshot held at a time (cli_two_sides); loaded[k]: the cache key side k was read under (all
 * zero: none). */
static int report_run_two(const char *paths[2], const char *names[2], const ms_compare_options_t *o,
                          unsigned jobs, ms_compare_t **c, ms_cache_key_t loaded[2]) {
  ms_compare_build_t *b = NULL;
  if (ms_compare_begin(o, &b) != MS_OK) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  report_side_t side[2];
  memset(side, 0, sizeof side);
  for (int k = 0; k < 2; k++) {
    side[k].path = paths[k];
    side[k].b = b;
  }
  char what[1200];
  snprintf(what, sizeof what, "comparing '%s' and '%s'", names[0], names[1]);
  cli_two_sides(paths, jobs, what, report_side_run, side);
  int rc = CLI_OK, err = MS_OK;
  const ms_errbuf_t *why = NULL;
  for (int k = 0; k < 2 && rc == CLI_OK && err == MS_OK; k++) {
    rc = side[k].rc;
    err = rc == CLI_OK ? side[k].err : MS_OK;
    why = &side[k].eb;
    loaded[k] = side[k].key;
  }
  if (rc == CLI_OK && err == MS_OK)
    err = ms_compare_finish(b, c);
  else
    ms_compare_build_free(b);
  if (rc == CLI_OK && err != MS_OK) {
    cli_error("comparing '%s' with '%s': %s", names[0], names[1],
              why && why->msg[0] ? why->msg : ms_strerror(err));
    rc = CLI_FAILURE;
  }
  return rc;
}

/* The comparison of two moments of the file at path: one read, one index and classifier for
 * both; loaded[]: the key it was read under. */
static int report_run_one(const char *path, const char *names[2], const ms_compare_options_t *o,
                          ms_compare_t **c, ms_cache_key_t loaded[2]) {
  ms_snapshot_t *snap = NULL;
  int rc = cli_load_ex(path, CLI_COMPARE_LOAD, &snap);
  if (rc != CLI_OK) return rc;
  if (cli_cache_key(snap)) loaded[0] = loaded[1] = *cli_cache_key(snap);
  cli_progress_start("comparing '%s' and '%s'", names[0], names[1]);
  ms_errbuf_t eb = {{0}};
  int err = ms_compare_run(snap, snap, o, c, &eb);
  cli_progress_stop();
  ms_snapshot_free(snap);
  if (err != MS_OK) {
    cli_error("comparing '%s' with '%s': %s", names[0], names[1],
              eb.msg[0] ? eb.msg : ms_strerror(err));
    rc = CLI_FAILURE;
  }
  return rc;
}

/* The answer of this question through the cache (cli/answers.c), filed under AFTER's key: the
 * description holds BEFORE's content (its hash and size; the same file's for two moments), both
 * names (the report prints them) and the options as given. Not for BEFORE on standard input (AFTER
 * there: cli_answer_open says no). *before is BEFORE's key as hashed, for cli_answer_close. */
static void report_answer_open(cli_answer_t *ans, const char *paths[2], const char *names[2],
                               const char *const qv[4], bool json, ms_cache_key_t *before) {
  memset(ans, 0, sizeof *ans);
  memset(before, 0, sizeof *before);
  /* neither side on standard input (never cached): else BEFORE's hash is taken for nothing */
  if (!cli_cache_enabled() || strcmp(paths[0], "-") == 0 || strcmp(paths[1], "-") == 0) return;
  struct stat st;
  if (stat(paths[0], &st) != 0 || !S_ISREG(st.st_mode) ||
      ms_cache_hash_file(paths[0], &before->hash, &before->size) != MS_OK)
    return;
  before->flags = MS_LOAD_NO_FREE_STACKS;
  char content[48];
  snprintf(content, sizeof content, "%016" PRIx64 "-%" PRIu64, before->hash, before->size);
  static const char *const qn[7] = {"before",   "before-content", "after", "at",
                                    "at-after", "device",         "n"};
  const char *const vals[7] = {names[0], content, names[1], qv[0], qv[1], qv[2], qv[3]};
  cli_answer_open(ans, "compare", paths[1], MS_LOAD_NO_FREE_STACKS, 7, qn, vals, json, NULL);
}

int cli_compare_report(const char *paths[2], const char *at[2], const ms_compare_options_t *o,
                       bool json, const char *const qv[4], unsigned jobs) {
  const char *names[2] = {cli_display_name(paths[0]), cli_display_name(paths[1])};
  cli_answer_t ans;
  ms_cache_key_t hashed;
  report_answer_open(&ans, paths, names, qv, json, &hashed);
  if (cli_answer_serve(&ans)) return CLI_OK;
  ms_compare_t *c = NULL;
  ms_cache_key_t loaded[2];
  memset(loaded, 0, sizeof loaded);
  cli_classify_on_read(NULL); /* the report's classifier has the default rules */
  int rc = paths[0] == paths[1] ? report_run_one(paths[0], names, o, &c, loaded)
                                : report_run_two(paths, names, o, jobs, &c, loaded);
  if (rc != CLI_OK) {
    cli_answer_close(&ans, rc, NULL);
    return rc;
  }
  cli_compare_warnings(names, c);
  if (json) {
    cli_answer_capture(&ans);
    rc = report_json(names, at, c);
  } else {
    report_text(cli_answer_stream(&ans), names, at, c);
  }
  ms_compare_free(c);
  /* stored when both files were read as they were hashed (neither changed meanwhile) */
  bool same = (loaded[0].hash || loaded[0].size) && loaded[0].hash == hashed.hash &&
              loaded[0].size == hashed.size && loaded[0].flags == hashed.flags;
  cli_answer_close(&ans, rc, same ? &loaded[1] : NULL);
  return rc;
}
