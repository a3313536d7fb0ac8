/* SPDX-License-Identifier: MIT
 * memsnap tests: shared helpers (no Criterion dependency in helpers.c, so any test can link it).
 *
 *  - th_synth(): a deterministic synthetic snapshot that fills every table and every field of the
 *    model (segments and blocks of every state, legacy history, frames and stacks, two devices
 *    with traces and statistics, nested allocator_settings, annotations, process identity).
 *  - th_snapshot_diff(): deep model equality, table by table and field by field (strings by
 *    content); it describes the first difference.
 *  - th_memsink_t: a growable in-memory ms_sink_t.
 *  - th_tmpdir(): a fresh temporary directory.
 *  - th_rec_open() / th_rec_close(): a trace recorded by the allocator on the simulated device.
 *  - th_attr_same(): two classifiers' answers compared, the first difference described.
 *
 * Usage in a Criterion test: TH_ASSERT_SNAP_EQ(a, b);
 */
#ifndef MEMSNAP_TESTS_HELPERS_H
#define MEMSNAP_TESTS_HELPERS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/allocator.h"
#include "memsnap/attribution.h"
#include "memsnap/backend.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"

typedef struct th_synth_opts_s {
  size_t nsegments;          /* segments (default 4 when everything is 0) */
  size_t blocks_per_segment; /* blocks in each segment */
  size_t nframes;            /* distinct frames */
  size_t nstacks;            /* stacks (interned, so possibly fewer) */
  size_t ntrace;             /* trace entries per device (2 devices) */
  int history;               /* give some blocks legacy history entries */
  uint64_t seed;
} th_synth_opts_t;

/* Builds the synthetic snapshot; NULL opts = a small snapshot with every table filled.
 * @return the snapshot (free with ms_snapshot_free), or NULL if building failed. */
ms_snapshot_t *th_synth(const th_synth_opts_t *opts);

/* @return 0 if a and b are equal in every table and field, else 1 with the first difference
 * described in why (e.g. "blocks[3].size: 512 != 1024"). */
int th_snapshot_diff(const ms_snapshot_t *a, const ms_snapshot_t *b, char *why, size_t cap);

#define TH_ASSERT_SNAP_EQ(a, b)                                                  \
  do {                                                                           \
    char th_why_[512];                                                           \
    int th_d_ = th_snapshot_diff((a), (b), th_why_, sizeof th_why_);             \
    cr_assert(th_d_ == 0, "snapshots differ: %s", th_why_);                      \
  } while (0)

typedef struct th_memsink_s {
  char *data;
  size_t len, cap;
  size_t fail_after; /* a write that would pass this many bytes fails with MS_EIO (0 = never) */
} th_memsink_t;

/* Initialises a memory sink writing into m (data NULL until the first write, grows as needed,
 * and always followed by a NUL, so that text written into it is a C string). */
void th_memsink_init(ms_sink_t *sink, th_memsink_t *m);
void th_memsink_free(th_memsink_t *m);

/* Creates a fresh directory under $TMPDIR (or /tmp); returns a malloc'd path. */
char *th_tmpdir(void);
/* Removes a directory and the plain files in it (non-recursive). */
void th_rmdir(const char *dir);
/* Number of entries in dir, excluding . and .. */
int th_dir_count(const char *dir);

/* Suites of the snapshot cache (.init and .fini): th_cache_setup makes a fresh temporary
 * directory, th_cache_tmp, whose xdg/ is XDG_CACHE_HOME (MEMSNAP_CACHE and MEMSNAP_CACHE_MAX
 * unset), so that th_cache_dir() is the cache's folder; th_cache_teardown removes it all. A setup
 * that fails aborts the test. */
extern char *th_cache_tmp;
void th_cache_setup(void);
void th_cache_teardown(void);
const char *th_cache_dir(void);

/* Reads a whole file; @return malloc'd bytes (NULL on error), *len = size. */
char *th_read_file(const char *path, size_t *len);
/* Writes bytes to a file; @return 0 on success. */
int th_write_file(const char *path, const void *data, size_t len);

/* The fixture directory (MEMSNAP_TORCH_FIXTURES or the compile-time default). */
const char *th_fixture_dir(void);
/* The paths of its PyTorch pickles (*.pickle), at most cap, in the directory's order. None: a
 * "SKIP: ..." line on stdout, and 0 (the caller skips its test). */
size_t th_fixture_pickles(char paths[][4096], size_t cap);
/* Calls fn(ctx, bytes, n, what, k) for data (len bytes, restored after) cut at every offset, then
 * with bit 0, then bit 7, flipped in every third byte; what names the case ("NAME cut at N",
 * "NAME byte N bit B"), k counts the calls. For the readers' hostile-input tests. */
void th_cut_and_flip(char *data, size_t len, const char *name,
                     void (*fn)(void *ctx, const char *bytes, size_t n, const char *what,
                                size_t k),
                     void *ctx);

/* The memsnap program ($MEMSNAP_BIN, else the build tree's) run with args (NULL-terminated,
 * without argv[0]) in dir, stdin from in_path (NULL: /dev/null), with env's NAME=VALUE strings
 * (NULL-terminated, may be NULL) added: its exit status (128 + signal when killed; -1 when it
 * could not be run), stdout and stderr (NUL-terminated; free with th_run_free). */
typedef struct th_run_s {
  int status;
  char *out;
  size_t out_len;
  char *err;
} th_run_t;
th_run_t th_run(const char *dir, const char *in_path, const char *const *env,
                const char *const *args);
void th_run_free(th_run_t *r);
/* A whole file with a NUL after it; @return malloc'd text (NULL on error), *len (may be NULL) =
 * its size. */
char *th_read_text(const char *path, size_t *len);

/* The working directory of a suite of CLI tests: th_workdir_setup (the suite's .init) makes a
 * fresh one and puts its path in th_workdir, th_workdir_teardown (.fini) removes it and its
 * files. TH_RUN(ARGS...) runs memsnap ARGS there (th_run, standard input /dev/null). */
extern char th_workdir[256];
void th_workdir_setup(void);
void th_workdir_teardown(void);
#define TH_RUN(...) th_run(th_workdir, NULL, NULL, (const char *const[]){__VA_ARGS__, NULL})

/* A growable byte buffer (the hand-made inputs of the reader tests); running out of memory
 * aborts. th_bytes_sink_write is an ms_sink_t writer into one (ctx: the th_bytes_t). */
typedef struct th_bytes_s {
  char *p;
  size_t n, cap;
} th_bytes_t;
void th_bytes_put(th_bytes_t *b, const void *p, size_t n);
void th_bytes_put_le(th_bytes_t *b, uint64_t x, int n); /* n bytes, little-endian */
int th_bytes_sink_write(void *ctx, const char *buf, size_t len);
void th_bytes_free(th_bytes_t *b);
/* Reads a PyTorch pickle from memory with ms_pickle_read_ex(flags), eb cleared first.
 * @return its status. */
/* The bytes of a hand-made PyTorch pickle up to its first trace entry's last key (Python's
 * shape): the root dict, an empty "segments", "device_traces" with device 0's list, and an alloc
 * of 0x1000 (16 bytes, stream 0, time 5) whose frames list meets its one frame dict {"name": "f"}.
 * Memo: 0 root, 1 "segments", 2 [], 3 "device_traces", 4 [], 5 [] (device 0), 6 the entry,
 * 7 "action", 8 "alloc", 9 "addr", 10 "size", 11 "stream", 12 "time_us", 13 "frames", 14 its
 * list, 15 the frame dict, 16 "name", 17 "f". The entry's dict is still open (its MARK). */
#define TH_PICKLE_FIRST_ALLOC                                                                     \
  "\x80\x04}\x94(\x8c\x08segments\x94]\x94\x8c\x0d" "device_traces\x94]\x94]\x94(}\x94(" \
  "\x8c\x06" "action\x94\x8c\x05" "alloc\x94" \
  "\x8c\x04" "addr\x94\x8a\x02\x00\x10" \
  "\x8c\x04" "size\x94K\x10" \
  "\x8c\x06" "stream\x94K\x00" \
  "\x8c\x07" "time_us\x94K\x05" \
  "\x8c\x06" "frames\x94]\x94(}\x94(\x8c\x04name\x94\x8c\x01" "f\x94" "ue"

int th_pickle_read_mem(const void *data, size_t len, unsigned flags, ms_snapshot_t **out,
                       ms_errbuf_t *eb);
/* Whether python3 runs here with its pickle and json modules (the suites that ask Python's own
 * reader skip without it). */
bool th_have_python(void);
/* Pickle opcodes by hand: one opcode byte; a str (SHORT_BINUNICODE); an int (BININT1 for 0..255,
 * else LONG1 of 8 bytes). */
void th_pickle_op(th_bytes_t *b, int op);
void th_pickle_str(th_bytes_t *b, const char *s);
void th_pickle_int(th_bytes_t *b, int64_t x);

/* Writes s to DIR/NAME (dir NULL: NAME as it is): a PyTorch pickle when NAME ends in ".pickle",
 * else memsnap's format. @return 0, or -1 with why (naming the path). */
int th_write_snapshot(const ms_snapshot_t *s, const char *dir, const char *name, char *why,
                      size_t cap);

/* th_synth(opts) written to path in memsnap's format. @return 0, or -1 with why. */
int th_write_synth(const char *path, const th_synth_opts_t *opts, char *why, size_t cap);

/* A recording on the simulated device: an allocator with its history on. */
typedef struct th_rec_s {
  ms_backend_t *be;
  ms_allocator_t *al;
} th_rec_t;
/* Opens one on a device of `capacity` bytes, the allocator's default settings, the history's
 * context (MS_CONTEXT_*: stacks with MS_CONTEXT_ALL) and max_entries (0: the default).
 * @return 0 (MS_OK), or the negative MS_* code of the step that failed (nothing left open). */
int th_rec_open(th_rec_t *r, size_t capacity, int context, size_t max_entries);
/* The recording's snapshot, the allocator and its backend destroyed (even on failure); NULL when
 * the snapshot could not be made. */
ms_snapshot_t *th_rec_close(th_rec_t *r);

/* Whether two classifiers answer alike (on two reads of one file): every alloc entry's category,
 * the category series, and the rows by category, source and stack at the peak of allocated
 * memory and at the end of every device. @return true when they do; else false, and why (cap
 * bytes) names the first difference. */
bool th_attr_same(const ms_timeline_t *ta, const ms_attr_t *a, const ms_timeline_t *tb,
                  const ms_attr_t *b, char *why, size_t cap);

#endif /* MEMSNAP_TESTS_HELPERS_H */
