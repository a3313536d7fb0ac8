/* SPDX-License-Identifier: MIT
 * memsnap core: the schema of memsnap's snapshot files (docs/snapshot-format.md), shared by the
 * writer (msgpack_write.c) and the reader (msgpack_read.c, msgpack_objects.c, msgpack_guard.c):
 * table tags, column names, and the reader's limits.
 */
#ifndef MEMSNAP_LIB_SNAPSHOT_MSGPACK_SCHEMA_H
#define MEMSNAP_LIB_SNAPSHOT_MSGPACK_SCHEMA_H

#define SNAP_VERSION 1
/* The header object: {"magic": "memsnap-snapshot", "version": N}. Its first 16 bytes are fixed
 * and identify the format. */
__attribute__((unused)) static const char snap_head16[16] = "\x82\xa5magic\xb0memsnap-";
#define SNAP_MAGIC "memsnap-snapshot"

enum {
  TAG_END = 0,
  TAG_FRAMES = 1,
  TAG_STACKS,
  TAG_SEGMENTS,
  TAG_BLOCKS,
  TAG_HISTORY,
  TAG_DEVICES,
  TAG_TRACE,
  TAG_ANNOTATIONS,
  TAG_SETTINGS,
  TAG_COUNT
};

/* Order of the "counts" array in the meta object; equal to the tag order. */
__attribute__((unused)) static const char *const table_names[TAG_COUNT] = {
    "end",     "frames",  "stacks", "segments",    "blocks",
    "history", "devices", "trace",  "annotations", "allocator_settings",
};

/* Columns of each row, in schema order. */
__attribute__((unused)) static const char *const cols_frame[] = {"name", "filename", "line"};
__attribute__((unused)) static const char *const cols_segment[] = {
    "device",         "address", "total_size", "allocated_size", "active_size",
    "requested_size", "stream",  "is_large",   "is_expandable",  "pool_id[0]",
    "pool_id[1]",     "frames",  "nblocks",    "present"};
__attribute__((unused)) static const char *const cols_block[] = {
    "address", "size", "requested_size", "state", "frames", "nhistory", "present"};
__attribute__((unused)) static const char *const cols_history[] = {"addr", "real_size", "frames",
                                                                   "present"};
__attribute__((unused)) static const char *const cols_device[] = {"ntrace", "trace_dropped",
                                                                  "capacity", "present", "stats"};
__attribute__((unused)) static const char *const cols_trace[] = {
    "action",          "addr",          "size",       "stream",
    "time_us",         "pool_id[0]",    "pool_id[1]", "frames",
    "compile_context", "user_metadata", "present"};
__attribute__((unused)) static const char *const cols_annotation[] = {"name", "stage", "device",
                                                                      "time_us"};

#define NCOLS(a) (sizeof(a) / sizeof((a)[0]))

/* The row decoder's small readers must be inlined into the row loops (a call per value costs more
 * than the value). */
#if defined(__GNUC__)
#define RD_INLINE static inline __attribute__((always_inline))
#else
#define RD_INLINE static inline
#endif

/* Limits of the reader (documented in docs/snapshot-format.md). */
#define RD_OBJ_MAX_BYTES (64u * 1024u * 1024u) /* one top-level object */
#define RD_OBJ_MAX_ITEMS (1u << 21)            /* msgpack values in one top-level object */
#define RD_MAX_DEPTH 12                        /* nesting inside one top-level object */
#define RD_READ_CHUNK (256u * 1024u)
#define SETTINGS_MAX_DEPTH 8 /* nested maps in allocator_settings */

#define WR_BUF (64u * 1024u)
/* Inlines msgpack-c's static pack functions and the write callback into a table writer, so that
 * GCC devirtualizes the callback (an indirect call per value costs 3x; performance.md S1). */
#if defined(__GNUC__) && !defined(__clang__)
#define WR_FLATTEN __attribute__((flatten))
#else
#define WR_FLATTEN
#endif
#define WR_CHUNK_ROWS 1024u

#endif /* MEMSNAP_LIB_SNAPSHOT_MSGPACK_SCHEMA_H */
