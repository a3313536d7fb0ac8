/* SPDX-License-Identifier: MIT
 * memsnap CLI: `memsnap export FILE... --sqlite OUT.db | --pprof OUT.pb.gz | --perfetto OUT.json`
 * (issue #17): snapshots into the tools users already look in (docs/exports.md).
 *
 * Every output is complete or absent: the SQLite database is built in a temporary file next to
 * OUT and renamed over it at the end, the other formats go through cli_out_t. An output that is
 * one of the inputs is refused before anything is read. Files are read one at a time and freed
 * before the next, so many ranks never sit in memory together.
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "memsnap/export.h"
#include "memsnap/timeline.h"

static const char export_usage[] =
    "usage: memsnap export FILE...|DIR --sqlite OUT.db [--rank N]\n"
    "       memsnap export FILE...|DIR --csv OUTDIR [--rank N] [--jobs N]\n"
    "       memsnap export FILE --pprof OUT.pb.gz [--at MOMENT] [--device N] [--categories R]\n"
    "       memsnap export FILE --perfetto OUT.json [--allocations] [--range A:B]\n"
    "                     [--downsample N] [--categories R]\n"
    "\n"
    "Writes snapshots where other tools read them: a SQLite database (every FILE, one per\n"
    "rank, or every file of DIR, into one database with file_id and rank columns), a pprof\n"
    "profile (gzipped profile.proto: inuse_space/inuse_objects at a moment, alloc_space/\n"
    "alloc_objects over the trace), or a Chrome trace event JSON file that ui.perfetto.dev and\n"
    "chrome://tracing open. FILE is a memsnap snapshot or a PyTorch pickle ('-' reads standard\n"
    "input). See docs/exports.md.\n"
    "\n"
    "options:\n"
    "  --sqlite OUT.db      write a SQLite database (OUT must not be '-')\n"
    "  --csv OUTDIR         write the tables as gzip'd CSV files into OUTDIR (made if missing):\n"
    "                       snapshots, peaks, allocations, trace, stacks (docs/exports.md)\n"
    "  --jobs N             with --csv: N threads compress the files (default: one per CPU, at\n"
    "                       most 32); each file is one standard gzip member either way\n"
    "  --rank N             with --sqlite or --csv: the rank of the one FILE (default: the snapshot's rank, else the\n"
    "                       digits after 'rank' in the file name, else none)\n"
    "  --pprof OUT.pb.gz    write a pprof profile of one FILE ('-': standard output)\n"
    "  --at MOMENT          with --pprof: the moment of inuse_* (default: peak; see `memsnap top`)\n"
    "  -d, --device N       with --pprof: device N (default: the device with the longest trace)\n"
    "  --perfetto OUT.json  write a Chrome trace event JSON file of one FILE ('-': stdout)\n"
    "  --allocations        with --perfetto: one slice per allocation, from alloc to free,\n"
    "                       named by its source, with its category\n"
    "  --range A:B          with --perfetto: only trace entries A to B of each device (a whole\n"
    "                       large trace is past what a JSON viewer can open)\n"
    "  --downsample N       with --perfetto: the counters of each device in N runs of entries,\n"
    "                       of each only its lowest and highest total (every peak stays)\n"
    "  --categories RULES   with --pprof or --perfetto: a rules file extending the default\n"
    "                       rules of sources and categories (docs/categories.md)\n"
    "  -h, --help           show this help\n";

/* Refuses an output that is one of the inputs (the same file, under any name). */
static int export_check_output(const char *out, char **files, int nfiles) {
  struct stat so;
  if (strcmp(out, "-") == 0 || stat(out, &so) != 0) return CLI_OK;
  for (int i = 0; i < nfiles; i++) {
    struct stat si;
    if (strcmp(files[i], "-") == 0 || stat(files[i], &si) != 0) continue;
    if (si.st_dev == so.st_dev && si.st_ino == so.st_ino) {
      cli_error("'%s': the output is the input '%s'; refusing to write over it", out, files[i]);
      return CLI_FAILURE;
    }
  }
  return CLI_OK;
}

/* The time index of snap, or NULL with the reason in why (a trace that cannot be undone). */
static ms_timeline_t *export_index(const ms_snapshot_t *snap, const char *name, char *why,
                                   size_t cap) {
  ms_timeline_config_t cfg;
  ms_timeline_config_init(&cfg);
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cli_progress_start("indexing the trace of '%s'", name);
  int err = ms_timeline_create(snap, &cfg, &tl, &eb);
  cli_progress_stop();
  if (err != MS_OK) {
    snprintf(why, cap, "%s", eb.msg[0] ? eb.msg : ms_strerror(err));
    return NULL;
  }
  return tl;
}

/* The rank of --rank N (*has set) or none; a usage error for a bad N or N with several FILEs. */
static int export_forced_rank(const char *rank_s, int nfiles, int64_t *rank) {
  *rank = 0;
  if (!rank_s) return CLI_OK;
  uint64_t v;
  if (!cli_parse_u64(rank_s, &v) || v > INT64_MAX)
    return cli_usage_error("export", "option '--rank' needs a number, not '%s'", rank_s);
  if (nfiles != 1) return cli_usage_error("export", "option '--rank' needs exactly one FILE");
  *rank = (int64_t)v;
  return CLI_OK;
}

/* Adds one loaded file to a table export (SQLite or CSV). */
typedef int export_add_fn(void *x, const ms_snapshot_t *snap, const ms_timeline_t *tl,
                          const char *name, bool has_rank, int64_t rank, const char *tl_error,
                          ms_errbuf_t *eb);

static int export_add_sqlite(void *x, const ms_snapshot_t *snap, const ms_timeline_t *tl,
                             const char *name, bool has_rank, int64_t rank, const char *tl_error,
                             ms_errbuf_t *eb) {
  return ms_export_sqlite_add(x, snap, tl, name, has_rank, rank, tl_error, eb);
}

static int export_add_csv(void *x, const ms_snapshot_t *snap, const ms_timeline_t *tl,
                          const char *name, bool has_rank, int64_t rank, const char *tl_error,
                          ms_errbuf_t *eb) {
  return ms_export_csv_add(x, snap, tl, name, has_rank, rank, tl_error, eb);
}

/* Every FILE into x, one at a time (each freed before the next is read): its rank (--rank, the
 * snapshot's, its name's), its time index (none: a warning and the reason in its row). */
static int export_files(export_add_fn *add, void *x, const char *out, char **files, int nfiles,
                        const char *rank_s, int64_t forced_rank) {
  int rc = CLI_OK;
  for (int i = 0; i < nfiles && rc == CLI_OK; i++) {
    ms_snapshot_t *snap = NULL;
    if ((rc = cli_load(files[i], &snap)) != CLI_OK) break;
    const char *name = cli_display_name(files[i]);
    int64_t rank = forced_rank;
    bool has_rank = rank_s != NULL;
    if (!has_rank && (snap->present & MS_SNAP_HAS_RANK)) {
      has_rank = true;
      rank = snap->rank;
    }
    if (!has_rank) has_rank = ms_export_rank_from_name(name, &rank);
    char why[600] = "";
    ms_errbuf_t eb = {{0}};
    ms_timeline_t *tl = export_index(snap, name, why, sizeof why);
    if (!tl) cli_warning("'%s': no timeline rows: %s", name, why);
    cli_progress_start("writing '%s' into '%s'", name, out);
    int err = add(x, snap, tl, name, has_rank, rank, tl ? NULL : why, &eb);
    cli_progress_stop();
    if (err != MS_OK) {
      cli_error("%s", eb.msg);
      rc = CLI_FAILURE;
    }
    ms_timeline_destroy(tl);
    ms_snapshot_free(snap);
  }
  return rc;
}

static int export_sqlite(const char *out, char **files, int nfiles, const char *rank_s) {
  int64_t forced_rank;
  int rc = export_forced_rank(rank_s, nfiles, &forced_rank);
  if (rc != CLI_OK) return rc;
  /* the database is written under a temporary name and renamed: never over an input */
  for (int i = 0; i < nfiles; i++) cli_note_input(files[i]);
  if (cli_out_check_inputs(out) != CLI_OK) return CLI_FAILURE;
  /* SQLite needs a regular file: not standard output, a FIFO or a device (which
   * ms_atomic_file_open would write through; opening a FIFO would even wait for a reader) */
  struct stat st;
  if (strcmp(out, "-") == 0 || (stat(out, &st) == 0 && !S_ISREG(st.st_mode))) {
    cli_error("cannot write a SQLite database to '%s': not a regular file", cli_output_name(out));
    return CLI_FAILURE;
  }
  /* the CLI's output (cli/output.c): a signal removes the temporary database as it does every
   * other command's temporary file; SQLite writes the file by its name, the commit renames it */
  cli_out_t o;
  ms_errbuf_t eb = {{0}};
  if (cli_out_open(&o, out) != CLI_OK) return CLI_FAILURE;
  if (!o.af.tmp_path) { /* a dangling symbolic link is written through too */
    cli_out_abort(&o);
    cli_error("cannot write a SQLite database to '%s': not a regular file", cli_output_name(out));
    return CLI_FAILURE;
  }
  ms_export_sqlite_t *x = NULL;
  if (ms_export_sqlite_create(o.af.tmp_path, &x, &eb) != MS_OK) {
    cli_error("'%s': %s", out, eb.msg);
    cli_out_abort(&o);
    return CLI_FAILURE;
  }
  rc = export_files(export_add_sqlite, x, out, files, nfiles, rank_s, forced_rank);
  if (rc != CLI_OK) {
    ms_export_sqlite_destroy(x);
    cli_out_abort(&o);
    return rc;
  }
  cli_progress_start("indexing '%s'", out);
  int err = ms_export_sqlite_finish(x, &eb);
  cli_progress_stop();
  if (err != MS_OK) {
    cli_error("%s", eb.msg);
    cli_out_abort(&o);
    return CLI_FAILURE;
  }
  return cli_out_commit(&o);
}

/* --csv DIR: the tables as gzip'd CSV files in DIR, written straight from each snapshot (issue
 * #31), each file through the CLI's output (a temporary file renamed when all succeeded). */
static int export_csv(const char *dir, char **files, int nfiles, const char *rank_s,
                      const char *jobs_s) {
  int64_t forced_rank;
  int rc = export_forced_rank(rank_s, nfiles, &forced_rank);
  if (rc != CLI_OK) return rc;
  unsigned jobs = 0;
  if (jobs_s && (rc = cli_parse_jobs("export", jobs_s, 256, &jobs)) != CLI_OK) return rc;
  struct stat st;
  if (mkdir(dir, 0777) != 0 && (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode))) {
    cli_error("cannot write CSV files into '%s': not a directory", dir);
    return CLI_FAILURE;
  }
  for (int i = 0; i < nfiles; i++) cli_note_input(files[i]);
  cli_out_t o[MS_EXPORT_CSV_NFILES];
  char *path[MS_EXPORT_CSV_NFILES] = {NULL};
  ms_sink_t *sinks[MS_EXPORT_CSV_NFILES];
  int nopen = 0;
  for (; nopen < MS_EXPORT_CSV_NFILES && rc == CLI_OK; nopen++) {
    const char *name = ms_export_csv_file_name(nopen);
    size_t n = strlen(dir) + strlen(name) + 2;
    if (!(path[nopen] = malloc(n))) {
      cli_error("out of memory");
      rc = CLI_FAILURE;
      break;
    }
    snprintf(path[nopen], n, "%s/%s", dir, name);
    if (cli_out_open(&o[nopen], path[nopen]) != CLI_OK) {
      rc = CLI_FAILURE;
      break;
    }
    sinks[nopen] = &o[nopen].sink;
  }
  ms_export_csv_t *x = NULL;
  ms_errbuf_t eb = {{0}};
  if (rc == CLI_OK && (ms_export_csv_create(sinks, 1, &x, &eb) != MS_OK ||
                       (jobs && ms_export_csv_jobs(x, (int)jobs, &eb) != MS_OK))) {
    cli_error("%s", eb.msg);
    rc = CLI_FAILURE;
  }
  if (rc == CLI_OK) rc = export_files(export_add_csv, x, dir, files, nfiles, rank_s, forced_rank);
  if (rc == CLI_OK) {
    int err = ms_export_csv_finish(x, &eb);
    x = NULL;
    for (int i = 0; err != MS_OK && i < MS_EXPORT_CSV_NFILES; i++)
      if (o[i].werr && rc == CLI_OK) /* the output's own error: "no space left on device" */
        rc = cli_out_fail(&o[i], err, NULL);
    if (err != MS_OK && rc == CLI_OK) {
      cli_error("%s", eb.msg);
      rc = CLI_FAILURE;
    }
  }
  ms_export_csv_destroy(x);
  for (int i = 0; i < nopen; i++) {
    if (rc == CLI_OK)
      rc = cli_out_commit(&o[i]);
    else if (o[i].af.fp)
      cli_out_abort(&o[i]);
  }
  for (int i = 0; i < MS_EXPORT_CSV_NFILES; i++) free(path[i]);
  return rc;
}

/* Loads FILE, builds its index and resolves --device and --at; prints errors. */
static int export_open(const char *file, const char *device_s, const char *at_s,
                       ms_snapshot_t **snap, ms_timeline_t **tl, size_t *dev, size_t *step) {
  cli_tl_args_t ta;
  int rc = cli_tl_args_parse("export", &ta, device_s, NULL, NULL, NULL, at_s);
  if (rc != CLI_OK) return rc;
  if ((rc = cli_load(file, snap)) != CLI_OK) return rc;
  const char *name = cli_display_name(file);
  if ((rc = cli_tl_device(*snap, name, &ta, dev)) == CLI_OK)
    rc = cli_tl_open(*snap, name, &ta, tl);
  if (rc == CLI_OK && ta.has_at) {
    ms_errbuf_t eb = {{0}};
    if (ms_timeline_moment_step(*tl, *dev, &ta.at, 0, SIZE_MAX, step, &eb) != MS_OK) {
      cli_error("'%s': --at %s: %s", name, ta.at_text, eb.msg);
      rc = CLI_FAILURE;
    }
  }
  if (rc != CLI_OK) {
    ms_timeline_destroy(*tl);
    ms_snapshot_free(*snap);
    *tl = NULL;
    *snap = NULL;
  }
  return rc;
}

typedef int export_write_fn(const ms_timeline_t *tl, size_t dev, size_t step, const void *arg,
                            ms_sink_t *sink, ms_errbuf_t *eb);

/* What the writers take: the Chrome trace's options, the classifier of --categories (NULL: the
 * default rules). */
typedef struct export_arg_s {
  ms_export_perfetto_opts_t po;
  const char *rules;
  const ms_attr_t *attr;
} export_arg_t;

static int export_pprof_fn(const ms_timeline_t *tl, size_t dev, size_t step, const void *arg,
                           ms_sink_t *sink, ms_errbuf_t *eb) {
  return ms_export_pprof_write_ex(tl, ((const export_arg_t *)arg)->attr, dev, step, sink, eb);
}

static int export_perfetto_fn(const ms_timeline_t *tl, size_t dev, size_t step, const void *arg,
                              ms_sink_t *sink, ms_errbuf_t *eb) {
  (void)dev;
  (void)step;
  const export_arg_t *x = arg;
  ms_export_perfetto_opts_t po = x->po;
  po.attr = x->attr;
  return ms_export_perfetto_write(tl, &po, sink, eb);
}

/* One FILE to one output through fn. */
static int export_one(const char *file, const char *out, const char *device_s, const char *at_s,
                      export_write_fn *fn, export_arg_t *arg) {
  ms_snapshot_t *snap = NULL;
  ms_timeline_t *tl = NULL;
  size_t dev = 0, step = 0;
  int rc = export_open(file, device_s, at_s, &snap, &tl, &dev, &step);
  if (rc != CLI_OK) return rc;
  ms_attr_t *attr = NULL;
  if (arg->rules && (rc = cli_attr_open(snap, tl, arg->rules, &attr)) != CLI_OK) {
    ms_timeline_destroy(tl);
    ms_snapshot_free(snap);
    return rc;
  }
  arg->attr = attr;
  cli_out_t o;
  if ((rc = cli_out_open(&o, out)) == CLI_OK) {
    ms_errbuf_t eb = {{0}};
    cli_progress_start("writing '%s'", out);
    int err = fn(tl, dev, step, arg, &o.sink, &eb);
    cli_progress_stop();
    if (err != MS_OK && o.werr) { /* the output's own error: "no space left on device" */
      rc = cli_out_fail(&o, err, NULL);
    } else if (err != MS_OK) {
      cli_out_abort(&o);
      cli_error("'%s': %s", out, eb.msg[0] ? eb.msg : ms_strerror(err));
      rc = CLI_FAILURE;
    } else {
      rc = cli_out_commit(&o);
    }
  }
  ms_attr_destroy(attr);
  ms_timeline_destroy(tl);
  ms_snapshot_free(snap);
  return rc;
}

int cmd_export(int argc, char **argv) {
  const char *range_s = NULL, *sqlite_s = NULL, *csv_s = NULL, *pprof_s = NULL,
             *perfetto_s = NULL, *rank_s = NULL, *at_s = NULL, *device_s = NULL, *rules_s = NULL,
             *downsample_s = NULL, *jobs_s = NULL;
  int allocations = 0;
  const struct cli_opt opts[] = {{"sqlite", 0, NULL, &sqlite_s},
                                 {"csv", 0, NULL, &csv_s},
                                 {"pprof", 0, NULL, &pprof_s},
                                 {"perfetto", 0, NULL, &perfetto_s},
                                 {"rank", 0, NULL, &rank_s},
                                 {"at", 0, NULL, &at_s},
                                 {"device", 0, NULL, &device_s},
                                 {"allocations", 0, &allocations, NULL},
                                 {"categories", 0, NULL, &rules_s},
                                 {"range", 0, NULL, &range_s},
                                 {"downsample", 0, NULL, &downsample_s},
                                 {"jobs", 0, NULL, &jobs_s},
                                 {NULL, 0, NULL, NULL}};
  char **pos = calloc((size_t)argc + 1, sizeof *pos);
  if (!pos) {
    cli_error("out of memory");
    return CLI_FAILURE;
  }
  int npos = 0;
  int rc = cli_parse_options("export", export_usage, opts, argc, argv, pos, argc, &npos);
  if (rc == CLI_HELP_SHOWN) {
    rc = CLI_OK;
    goto out;
  }
  if (rc != CLI_OK) goto out;
  int nout = (sqlite_s != NULL) + (csv_s != NULL) + (pprof_s != NULL) + (perfetto_s != NULL);
  if (nout != 1) {
    rc = cli_usage_error("export", "give exactly one of --sqlite, --csv, --pprof and --perfetto");
    goto out;
  }
  if (npos < 1) {
    rc = cli_usage_error("export", "missing FILE");
    goto out;
  }
  bool tables = sqlite_s || csv_s; /* many FILEs, a rank each */
  const char *out = sqlite_s ? sqlite_s : csv_s ? csv_s : pprof_s ? pprof_s : perfetto_s;
  if (!tables && npos > 1) {
    rc = cli_usage_error("export", "--%s takes one FILE, not %d", pprof_s ? "pprof" : "perfetto",
                         npos);
    goto out;
  }
  if (jobs_s && !csv_s) {
    rc = cli_usage_error("export", "--jobs goes with --csv");
    goto out;
  }
  if ((rank_s && !tables) || ((at_s || device_s) && !pprof_s) ||
      ((allocations || range_s || downsample_s) && !perfetto_s)) {
    rc = cli_usage_error("export", "--rank goes with --sqlite and --csv, --at and --device with "
                                   "--pprof, --allocations, --range and --downsample with "
                                   "--perfetto");
    goto out;
  }
  if (rules_s && tables) {
    rc = cli_usage_error("export", "--categories goes with --pprof and --perfetto (the SQLite "
                                   "export uses the default rules)");
    goto out;
  }
  if (tables && strcmp(out, "-") == 0) {
    rc = cli_usage_error("export", "--%s needs a file name, not '-'",
                         sqlite_s ? "sqlite" : "csv");
    goto out;
  }
  if ((rc = export_check_output(out, pos, npos)) != CLI_OK) goto out;
  if (tables) {
    char **files = NULL; /* a directory stands for the files in it (one per rank) */
    int nfiles = 0;
    if ((rc = cli_expand_files(pos, npos, &files, &nfiles)) != CLI_OK) goto out;
    if ((rc = export_check_output(out, files, nfiles)) == CLI_OK)
      rc = sqlite_s ? export_sqlite(sqlite_s, files, nfiles, rank_s)
                    : export_csv(csv_s, files, nfiles, rank_s, jobs_s);
    cli_files_free(files, nfiles);
  }
  else {
    export_arg_t xa = {{allocations != 0, NULL, false, 0, 0, 0}, rules_s, NULL};
    if (downsample_s) {
      uint64_t nb;
      if (!cli_parse_u64(downsample_s, &nb) || nb == 0 || nb > ((uint64_t)1 << 32)) {
        rc = cli_usage_error("export", "option '--downsample' needs a number of runs from 1 to "
                                       "4294967296, not '%s'", downsample_s);
        goto out;
      }
      xa.po.counter_buckets = (size_t)nb;
    }
    if (range_s) {
      const char *colon = strchr(range_s, ':');
      char a[32] = "";
      uint64_t first, last;
      if (colon && (size_t)(colon - range_s) < sizeof a)
        memcpy(a, range_s, (size_t)(colon - range_s));
      if (!colon || !cli_parse_u64(a, &first) || !cli_parse_u64(colon + 1, &last) ||
          first > last) {
        rc = cli_usage_error("export", "option '--range' needs A:B with entry indices A <= B, "
                                       "not '%s'", range_s);
        goto out;
      }
      xa.po.has_range = true;
      xa.po.first = (size_t)first;
      xa.po.last = (size_t)last;
    }
    if (pprof_s)
      rc = export_one(pos[0], pprof_s, device_s, at_s ? at_s : "peak", export_pprof_fn, &xa);
    else
      rc = export_one(pos[0], perfetto_s, NULL, NULL, export_perfetto_fn, &xa);
  }
out:
  free(pos);
  return rc;
}
