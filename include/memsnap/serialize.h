/* SPDX-License-Identifier: MIT
 * memsnap: reading and writing snapshot files.
 *
 * Formats (docs/snapshot-format.md, docs/pytorch.md), always recognised from the content:
 *  - memsnap's own msgpack format, plain or zlib-compressed;
 *  - PyTorch's pickles from torch.cuda.memory._dump_snapshot() (every era; see memsnap/pickle.h).
 *
 * Encoders write through an ms_sink_t and decoders read through an ms_source_t, so memory, FILE*
 * and zlib share one code path. File writers write to a temporary name in the same directory,
 * flush, fsync and rename: an interrupted write never leaves a truncated file under the final
 * name.
 *
 * Thread-safety: functions here share no state; a snapshot may be written by several threads at
 * once (it is immutable).
 */
#ifndef MEMSNAP_SERIALIZE_H
#define MEMSNAP_SERIALIZE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/snapshot.h"

MS_EXTERN_C_BEGIN

/* Writes len bytes; @return 0 on success, a negative ms_err on failure (the encoder stops). */
typedef int ms_write_fn(void *ctx, const char *buf, size_t len);
typedef struct ms_sink_s {
  ms_write_fn *write;
  void *ctx;
} ms_sink_t;

/* Reads up to cap bytes into buf; @return bytes read (0 = end of input) or a negative ms_err. */
typedef ptrdiff_t ms_read_fn(void *ctx, char *buf, size_t cap);
typedef struct ms_source_s {
  ms_read_fn *read;
  void *ctx;
} ms_source_t;

/* A sink that appends to a FILE*; a source that reads from one. The FILE stays the caller's. */
MS_API void ms_sink_init_file(ms_sink_t *sink, FILE *fp);
MS_API void ms_source_init_file(ms_source_t *src, FILE *fp);
/* A source over a memory buffer, which must outlive the source. ctx points to caller storage of
 * type ms_membuf_t. */
typedef struct ms_membuf_s {
  const char *data;
  size_t len;
  size_t pos;
} ms_membuf_t;
MS_API void ms_source_init_mem(ms_source_t *src, ms_membuf_t *buf, const void *data, size_t len);

typedef enum ms_format {
  MS_FORMAT_UNKNOWN = 0,
  MS_FORMAT_MEMSNAP,   /* memsnap msgpack */
  MS_FORMAT_MEMSNAP_Z, /* memsnap msgpack, zlib-compressed */
  MS_FORMAT_PICKLE,    /* PyTorch pickle */
} ms_format;

/* Recognises a format from the first bytes of a file: 16 are enough for plain memsnap files and
 * pickles; a compressed snapshot is recognised by inflating the head, which needs the first few
 * hundred bytes (ms_snapshot_load() passes 4096). */
MS_API ms_format ms_format_detect(const void *head, size_t len);
/* @return "memsnap", "memsnap-z", "pickle" or "unknown". */
MS_API const char *ms_format_name(ms_format f);

typedef struct ms_write_opts_s {
  int compress;   /* 0: plain msgpack; 1-9: deflate level, gzip container (default 0) */
} ms_write_opts_t;

/* Encodes snap in memsnap's format (docs/snapshot-format.md) into sink, streaming with bounded
 * memory (a 64 KiB buffer, plus the compressor's state). opts may be NULL (plain).
 * Refuses (MS_EINVAL, nothing written) a model that the reader would refuse: tables not in the
 * canonical order (each segment's blocks after the previous segment's, and likewise for history,
 * trace and statistics), segments not tiled exactly by their blocks, nested statistics, or
 * allocator_settings deeper than 8 maps.
 * @return MS_OK or an ms_err, with a description in eb (may be NULL); a sink error is returned
 * as is. */
MS_API MS_NODISCARD int ms_snapshot_write(const ms_snapshot_t *snap, const ms_write_opts_t *opts,
                                          ms_sink_t *sink, ms_errbuf_t *eb);
/* Writes snap to path atomically (temporary file, fsync, rename). */
MS_API MS_NODISCARD int ms_snapshot_write_file(const ms_snapshot_t *snap, const char *path,
                                               const ms_write_opts_t *opts, ms_errbuf_t *eb);

/* Decodes a memsnap-format snapshot (plain or compressed) from src. On failure *out is untouched
 * and eb names what is wrong and where (field path and byte offset). */
MS_API MS_NODISCARD int ms_snapshot_read(ms_source_t *src, ms_snapshot_t **out, ms_errbuf_t *eb);

/* Reads a snapshot of any supported format from path ("-" = standard input), recognising the
 * format from the content; a gzip-compressed pickle is inflated as it is read. Messages in eb name the file, e.g.
 * "'x.bin': not a memsnap snapshot or PyTorch pickle". */
MS_API MS_NODISCARD int ms_snapshot_load(const char *path, ms_snapshot_t **out, ms_errbuf_t *eb);

/* Parts of a snapshot that a reader may leave out, for callers that do not need them (load
 * faster, in less memory). */
enum {
  /* The trace: devices are listed with no entries (ntrace 0) and the snapshot has
   * MS_SNAP_TRACE_SKIPPED in `present`. Its bytes are still parsed (a truncated or malformed
   * file is still an error) but the entries are not built or type-checked. */
  MS_LOAD_NO_TRACE = 1u << 0,
  /* The stacks of the trace entries that name no stack when printed: those whose action is
   * alloc, free_requested, free_completed, segment_alloc, segment_free or oom (nearly all of a
   * trace). Their frames are still parsed, but the entries get MS_SNAP_NO_STACK (with
   * MS_TRACE_HAS_FRAMES as the file had them) and the snapshot has MS_SNAP_TRACE_STACKS_SKIPPED in
   * `present`. Entries of other actions, blocks, segments and history keep their stacks. What
   * `memsnap trace` prints needs no more; a 1 GB trace reads in half the memory and ~40 % less
   * time. Ignored with MS_LOAD_NO_TRACE. */
  MS_LOAD_NO_TRACE_STACKS = 1u << 1,
  /* The stacks of free_requested entries, which the time index (memsnap/timeline.h) never uses
   * (a block's stack is its allocation's, or its free_completed's when the allocation is not in
   * the trace): those entries get MS_SNAP_NO_STACK as with MS_LOAD_NO_TRACE_STACKS, whose rules
   * and refusals apply. For the commands that read a trace only through the index. */
  MS_LOAD_NO_FREE_STACKS = 1u << 2,
  /* MS_LOAD_NO_FREE_STACKS, and the stacks of alloc entries read later, when they are asked for:
   * the snapshot keeps the file open and, for each such entry, where its frames list is, and
   * ms_timeline_state_at() (and what is built on it: ms_timeline_snapshot_at()) reads the stacks
   * of the blocks it returns. Until then those entries hold MS_SNAP_NO_STACK (with
   * MS_TRACE_HAS_FRAMES). For callers that read a trace's stacks only through those two
   * functions. Honoured for a PyTorch pickle read from a regular file (else the same as
   * MS_LOAD_NO_FREE_STACKS); the snapshot cache never stores such a snapshot. A 1 GB trace whose
   * allocations' stacks differ reads in about a fifth less time and memory. */
  MS_LOAD_DEFER_STACKS = 1u << 3,
};
#define MS_LOAD_FLAGS_ALL                                                                          \
  (MS_LOAD_NO_TRACE | MS_LOAD_NO_TRACE_STACKS | MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS)

/* ms_snapshot_load() leaving out what flags (MS_LOAD_*) say. PyTorch pickles honour
 * MS_LOAD_NO_TRACE and MS_LOAD_NO_TRACE_STACKS (ms_pickle_read_ex; when a file cannot be read so,
 * a regular file is read again in full); memsnap files are always read in full (their trace is one array, cheap to
 * decode). The snapshots given either way differ only in what the flags leave out.
 * @return as ms_snapshot_load(); MS_EINVAL for unknown flags. */
MS_API MS_NODISCARD int ms_snapshot_load_ex(const char *path, unsigned flags, ms_snapshot_t **out,
                                            ms_errbuf_t *eb);

/* A window of the trace for ms_snapshot_load_window(): where in each device's trace the entries
 * a caller will look at end. Every entry is still read (the time index reaches the state at the
 * window's start by undoing the trace from the end state, and infers block sizes from the
 * neighbours a block had over its whole life, so it needs every entry before the window too);
 * what the window saves is the stacks of the entries after it, which nothing about the window
 * needs. */
typedef enum ms_load_window_kind {
  MS_LOAD_WINDOW_NONE = 0,  /* no window: a plain ms_snapshot_load_ex() */
  MS_LOAD_WINDOW_ENTRIES,   /* the window ends at entry `last_entry` of each device's trace */
  MS_LOAD_WINDOW_TIMES,     /* it ends before the first entry (of each device's trace) whose
                               time_us is past `last_time_us` */
} ms_load_window_kind;
typedef struct ms_load_window_s {
  ms_load_window_kind kind;
  uint64_t last_entry;  /* MS_LOAD_WINDOW_ENTRIES: index in its device's trace, inclusive */
  int64_t last_time_us; /* MS_LOAD_WINDOW_TIMES: inclusive */
} ms_load_window_t;

/* ms_snapshot_load_ex() for callers that look only at a window of the trace: the state and the
 * entries in the window, the state before it, the time index over the whole trace. Of the
 * entries after the window, those whose stack the time index never gives a block keep none: an
 * alloc, and a free_requested or free_completed of an alloc in the trace (as
 * MS_LOAD_NO_FREE_STACKS); a free_completed whose alloc is not in the trace, segment events and
 * the other actions keep theirs. So everything a caller derives from the window and the states
 * at its entries (the time index's series, peaks, blocks and their stacks at any step up to the
 * window's end) is what a full read gives, in less memory and time for a window early in a long
 * trace. The snapshot has MS_SNAP_TRACE_STACKS_SKIPPED in `present` (writers refuse it).
 * With MS_LOAD_WINDOW_TIMES the entries must be in time order from the window's end on: when an
 * entry with a time at or before the window's end follows one past it, the file is read again
 * in full (as a pickle that MS_LOAD_NO_FREE_STACKS cannot read so), which is the same snapshot
 * a full read gives (standard input cannot be read again: the load fails with MS_EUNSUPPORTED, as
 * with MS_LOAD_NO_FREE_STACKS). PyTorch pickles honour the window; memsnap files are read in
 * full. window NULL or MS_LOAD_WINDOW_NONE, or flags
 * with MS_LOAD_NO_TRACE: ms_snapshot_load_ex(). The window applies to the calling thread's load
 * only; loads on other threads are unaffected.
 * @return as ms_snapshot_load_ex(); MS_EINVAL for an unknown window kind. */
MS_API MS_NODISCARD int ms_snapshot_load_window(const char *path, unsigned flags,
                                                const ms_load_window_t *window,
                                                ms_snapshot_t **out, ms_errbuf_t *eb);

/* ---- atomic files ----------------------------------------------------------------------------
 * "Complete or not at all": a file is written under a temporary name in the destination's
 * directory (".NAME.tmp-XXXXXX", created exclusively with the mode fopen would give), then
 * flushed, fsync'ed and renamed over the final name. Until ms_atomic_file_commit() succeeds the
 * final name is untouched; a crash leaves at most a stray temporary file, never a truncated
 * output. Used for snapshot files, SVG output and OOM snapshots.
 *
 *   ms_atomic_file_t af;
 *   if (ms_atomic_file_open(&af, "out.svg", eb) != MS_OK) return ...;
 *   ... write to af.fp ...
 *   if (failed) ms_atomic_file_abort(&af);               // unlinks the temporary file
 *   else rc = ms_atomic_file_commit(&af, eb);            // closes af.fp in every case
 *
 * The path "-" means standard output: af.fp = stdout, commit only flushes it, abort does nothing.
 * An existing path that is not a regular file (a FIFO, a device such as /dev/null, a symbolic
 * link that does not end at a regular file) is opened and written through, as cp and sort -o do
 * (tmp_path stays NULL; abort closes it); renaming over it would destroy it. A symbolic link to
 * a regular file is followed: its target is replaced complete-or-not-at-all, the link stays.
 * Thread-safety: one ms_atomic_file_t per thread; distinct files may be written concurrently. */
typedef struct ms_atomic_file_s {
  FILE *fp;       /* write the content here; NULL after commit/abort */
  char *path;     /* final name (owned copy) */
  char *tmp_path; /* temporary name (owned), NULL for "-" */
} ms_atomic_file_t;

/* Creates the temporary file. On failure af is left closed (abort is a harmless no-op) and eb
 * says why, naming the path: "cannot create 'dir/x.svg': Permission denied". */
MS_API MS_NODISCARD int ms_atomic_file_open(ms_atomic_file_t *af, const char *path,
                                            ms_errbuf_t *eb);
/* Flushes, fsyncs, closes and renames the temporary file to the final name (and fsyncs the
 * directory). On any failure the temporary file is removed and the final name is untouched.
 * af is released in every case. @return MS_OK or MS_EIO. */
MS_API MS_NODISCARD int ms_atomic_file_commit(ms_atomic_file_t *af, ms_errbuf_t *eb);
/* Closes and removes the temporary file; releases af. Accepts an already committed, aborted or
 * failed-to-open af. */
MS_API void ms_atomic_file_abort(ms_atomic_file_t *af);

/* A sink that gzip-compresses (RFC 1952: zlib's deflate at level 1-9) what is written to it into
 * inner, which must outlive it; used for compressed payloads inside other files (the HTML
 * viewer's data). ms_gzip_sink_finish writes what is pending and the trailer; destroy frees it
 * (finished or not). Thread-safety: one thread at a time. */
typedef struct ms_gzip_sink_s ms_gzip_sink_t;
/* @return MS_OK, MS_EINVAL (level) or MS_ENOMEM; *sink receives the compressing sink. */
MS_API MS_NODISCARD int ms_gzip_sink_create(ms_sink_t *inner, int level, ms_gzip_sink_t **out,
                                            ms_sink_t *sink);
/* From now on compress with deflate's run-length strategy (rle: matches only of runs of one byte,
 * which suits data like the byte planes of numbers that change little) or its default one; what
 * was written before is compressed with the old one. @return MS_OK or the inner sink's error. */
MS_API MS_NODISCARD int ms_gzip_sink_rle(ms_gzip_sink_t *z, bool rle);
/* Whether the run-length strategy compresses sample[0..n) smaller than the default one at the
 * sink's level (both tried on the side; nothing is written): to choose per part of the data. */
MS_API bool ms_gzip_sink_rle_better(const ms_gzip_sink_t *z, const void *sample, size_t n);
/* @return MS_OK or the inner sink's error. */
MS_API MS_NODISCARD int ms_gzip_sink_finish(ms_gzip_sink_t *z);
/* Accepts NULL. */
MS_API void ms_gzip_sink_destroy(ms_gzip_sink_t *z);

MS_EXTERN_C_END

#endif /* MEMSNAP_SERIALIZE_H */
