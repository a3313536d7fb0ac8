/* SPDX-License-Identifier: MIT
 * memsnap: exports of snapshots to the tools users already look in (issue #17): a SQLite
 * database, a pprof profile (profile.proto, gzipped) and a Chrome trace event JSON file that
 * Perfetto and chrome://tracing open. docs/exports.md describes each format and its mapping.
 *
 * Vocabulary:
 *  - A *file* is one snapshot added to an export; several files (one per rank) go into one SQLite
 *    database, each with its own file_id (0, 1, ...), name and rank.
 *  - Trace entry ids are the entry's index in its device's trace (as `memsnap trace` numbers them
 *    and `--at N` names them), so (file_id, device, id) identifies an entry.
 *  - A *step* is a state of the time index (memsnap/timeline.h): step s = after s entries.
 *
 * Thread-safety: one export object per thread; the snapshots and indexes it reads are immutable.
 */
#ifndef MEMSNAP_EXPORT_H
#define MEMSNAP_EXPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/attribution.h"
#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

MS_EXTERN_C_BEGIN

/* ---- SQLite -------------------------------------------------------------------------------- */

typedef struct ms_export_sqlite_s ms_export_sqlite_t;

/* Opens (creating) the database at path, which must be a new or empty file (the CLI passes a
 * temporary file that it renames when the export succeeds), creates the schema and starts the
 * one transaction every row goes into. @return MS_OK; MS_EIO with eb naming path and SQLite's
 * message; MS_ENOMEM. *out untouched on failure. */
MS_API MS_NODISCARD int ms_export_sqlite_create(const char *path, ms_export_sqlite_t **out,
                                                ms_errbuf_t *eb);

/* Adds one snapshot as the next file (file_id = the number added before it): its snapshot row,
 * locations, stacks, segments, blocks and trace entries, and, when tl (built from snap, may be
 * NULL) is given, the timeline rows (the four totals after every entry). name is the file's
 * name as the user gave it; has_rank/rank its rank (NULL in the database without one);
 * timeline_error, when not NULL, is kept in the snapshot row (why there is no timeline).
 * @return MS_OK, MS_EIO (eb says why), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_export_sqlite_add(ms_export_sqlite_t *x, const ms_snapshot_t *snap,
                                             const ms_timeline_t *tl, const char *name,
                                             bool has_rank, int64_t rank,
                                             const char *timeline_error, ms_errbuf_t *eb);

/* Creates the indexes, commits and closes the database. x is freed in every case.
 * @return MS_OK or MS_EIO (eb says why). */
MS_API MS_NODISCARD int ms_export_sqlite_finish(ms_export_sqlite_t *x, ms_errbuf_t *eb);

/* Closes the database without committing and frees x. Accepts NULL. */
MS_API void ms_export_sqlite_destroy(ms_export_sqlite_t *x);

/* Writes the tables of the finished database at db_path into the existing directory dir as
 * gzip'd CSV (RFC 4180, a header line, NULL as an empty field, text always quoted):
 * snapshots.csv.gz, peaks.csv.gz, allocations.csv.gz, trace.csv.gz and stacks.csv.gz, with the
 * columns of docs/exports.md (issue #31: what DuckDB, Spark, Polars and pandas read natively,
 * offline). Files already there are replaced. @return MS_OK, MS_EIO (eb says why), MS_ENOMEM. */
MS_API MS_NODISCARD int ms_export_sqlite_csv(const char *db_path, const char *dir,
                                             ms_errbuf_t *eb);

/* ---- gzip'd CSV ------------------------------------------------------------------------------ */

/* The CSV files, in the order their sinks are given (ms_export_csv_file_name names each). */
enum {
  MS_EXPORT_CSV_SNAPSHOTS,   /* snapshots.csv.gz: one row per file */
  MS_EXPORT_CSV_PEAKS,       /* peaks.csv.gz: one row per file */
  MS_EXPORT_CSV_ALLOCATIONS, /* allocations.csv.gz: one row per block lifetime */
  MS_EXPORT_CSV_TRACE,       /* trace.csv.gz: one row per trace entry */
  MS_EXPORT_CSV_STACKS,      /* stacks.csv.gz: one row per distinct stack */
  MS_EXPORT_CSV_NFILES
};

typedef struct ms_export_csv_s ms_export_csv_t;

/* "snapshots.csv.gz", ... for MS_EXPORT_CSV_*; NULL for another number. */
MS_API const char *ms_export_csv_file_name(int file);

/* Starts the CSV export into sinks[MS_EXPORT_CSV_*] (each must outlive x), gzip-compressed at
 * level (1-9; 1 is zlib's fastest), each with its header line. The rows, their order and their
 * bytes are those ms_export_sqlite_csv writes from a database of the same files, written straight
 * from the snapshots. @return MS_OK, MS_EINVAL (level), MS_ENOMEM. *out untouched on failure. */
MS_API MS_NODISCARD int ms_export_csv_create(ms_sink_t *const sinks[MS_EXPORT_CSV_NFILES],
                                             int level, ms_export_csv_t **out, ms_errbuf_t *eb);

/* How many threads compress the files (1 to 256; by default as many as there are online CPUs, at
 * most 32), set before the first ms_export_csv_add. With more than one, each file is still one
 * standard gzip member (pigz-style: 1 MiB chunks deflated in parallel, in order, with one CRC);
 * with 1, each file is compressed by the thread that writes it. @return MS_OK or MS_EINVAL. */
MS_API MS_NODISCARD int ms_export_csv_jobs(ms_export_csv_t *x, int jobs, ms_errbuf_t *eb);

/* Adds one snapshot as the next file, as ms_export_sqlite_add does (the same arguments). The
 * trace and stacks tables are written on threads of their own while this one writes the others;
 * the sinks may thus be called from three threads, each sink from one. @return MS_OK, MS_ENOMEM, or a sink's
 * error (eb names the file). */
MS_API MS_NODISCARD int ms_export_csv_add(ms_export_csv_t *x, const ms_snapshot_t *snap,
                                          const ms_timeline_t *tl, const char *name,
                                          bool has_rank, int64_t rank,
                                          const char *timeline_error, ms_errbuf_t *eb);

/* Rows written so far to file MS_EXPORT_CSV_* (without the header line). */
MS_API uint64_t ms_export_csv_rows(const ms_export_csv_t *x, int file);

/* Writes what is pending and each file's gzip trailer, and frees x (in every case).
 * @return MS_OK or a sink's error (eb names the file). */
MS_API MS_NODISCARD int ms_export_csv_finish(ms_export_csv_t *x, ms_errbuf_t *eb);

/* Frees x without finishing the files. Accepts NULL. */
MS_API void ms_export_csv_destroy(ms_export_csv_t *x);

/* The rank a file's name gives: the digits after the last "rank" in its base name, with an
 * optional '_', '-' or '.' between ("rank3.pickle", "snapshot_rank_12.pickle", "RANK-7").
 * @return true and *rank when found. */
MS_API bool ms_export_rank_from_name(const char *path, int64_t *rank);

/* ---- pprof --------------------------------------------------------------------------------- */

/* Writes a gzipped profile.proto (github.com/google/pprof/proto/profile.proto) of device dev:
 * one sample per allocation stack with four values: inuse_space (bytes) and inuse_objects (blocks)
 * of the blocks allocated at step `step` (their stacks as ms_timeline_snapshot_at gives them),
 * and alloc_space/alloc_objects of every `alloc` entry of the device's trace (requested bytes).
 * Locations and functions come from the stacks' frames (innermost first), with file and line.
 * @return MS_OK, MS_EINVAL (unknown device or step), MS_ENOMEM, or the sink's error. */
MS_API MS_NODISCARD int ms_export_pprof_write(const ms_timeline_t *tl, size_t dev, size_t step,
                                              ms_sink_t *sink, ms_errbuf_t *eb);
/* ms_export_pprof_write with the classifier attr (built from tl; NULL: the default rules) that
 * gives every sample its `source` and `category` labels (a stack with blocks of several
 * categories has one sample per category). ms_export_pprof_write labels with the defaults. */
MS_API MS_NODISCARD int ms_export_pprof_write_ex(const ms_timeline_t *tl, const ms_attr_t *attr,
                                                 size_t dev, size_t step, ms_sink_t *sink,
                                                 ms_errbuf_t *eb);

/* ---- Chrome trace event JSON (Perfetto, chrome://tracing) ---------------------------------- */

typedef struct ms_export_perfetto_opts_s {
  bool allocations; /* one async slice per allocation, alloc to free (default false) */
  const ms_attr_t *attr; /* the classifier that names the slices (source) and gives their
                            category; NULL: one with the default rules */
  bool has_range;        /* a window (issue #31: a whole 1 GB trace is past V8's string limit):
                            only the events of entries first..last of each device, the slices
                            of the allocations alive in it clipped to it */
  size_t first, last;
  size_t counter_buckets; /* > 0: the counters of each device downsampled: the entries shown cut
                             into this many runs, of each only its lowest and highest total, in
                             their order (at most 2 x counter_buckets events per counter; every
                             peak and trough stays); 0: every change (default) */
} ms_export_perfetto_opts_t;

/* Writes a Chrome Trace Event Format JSON object ({"traceEvents": [...], "displayTimeUnit":
 * "ms"}): per device, counter events ("C") for allocated, reserved and active bytes after every
 * trace entry that has a time, instant events ("i") for OOMs, snapshots and runs of segment_free
 * (empty_cache), and with opts->allocations a "b"/"e" pair per allocation. opts may be NULL.
 * @return MS_OK, MS_ENOMEM, or the sink's error. */
MS_API MS_NODISCARD int ms_export_perfetto_write(const ms_timeline_t *tl,
                                                 const ms_export_perfetto_opts_t *opts,
                                                 ms_sink_t *sink, ms_errbuf_t *eb);

MS_EXTERN_C_END

#endif /* MEMSNAP_EXPORT_H */
