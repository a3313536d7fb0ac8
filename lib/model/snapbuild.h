/* SPDX-License-Identifier: MIT
 * memsnap core: the snapshot builder, used by every producer of an ms_snapshot_t (the allocator's
 * snapshot, the msgpack reader, the pickle reader, tests).
 *
 * The builder owns growable arrays for every table of the model and an arena for strings. Frames
 * and stacks are interned (a frame or stack added twice gets the same index), so producers can add
 * them naively. ms__snapbuild_finish() moves everything into a new ms_snapshot_t; after it (or
 * ms__snapbuild_release()) the builder is empty and may be reused.
 *
 * Usage for a segment: fill an ms_snap_segment_t with first_block = b->blocks.len, add its
 * blocks, set nblocks, then ms__snapbuild_add_segment(). The same pattern holds for a device's
 * trace (first_trace/ntrace) and a block's legacy history (first_history/nhistory).
 *
 * Errors: every function returns MS_OK or MS_ENOMEM / MS_ELIMIT; on failure the builder stays
 * valid (and can be released).
 * Thread-safety: a builder is used by one thread at a time.
 */
#ifndef MEMSNAP_LIB_SNAPBUILD_H
#define MEMSNAP_LIB_SNAPBUILD_H

#include <stddef.h>
#include <stdint.h>

#include "memsnap/error.h"
#include "memsnap/snapshot.h"
#include "common/vec.h"

typedef struct ms__arena_chunk_s ms__arena_chunk_t;

typedef struct ms__snapbuild_s {
  ms_snapshot_t hdr; /* scalar fields (origin, present, pid, hostname, rank, time_us) */
  MS_VEC(ms_snap_segment_t) segments;
  MS_VEC(ms_snap_block_t) blocks;
  MS_VEC(ms_snap_history_t) history;
  MS_VEC(ms_snap_device_t) devices;
  MS_VEC(ms_snap_trace_t) trace;
  MS_VEC(ms_snap_frame_t) frames;
  MS_VEC(ms_snap_stack_t) stacks;
  /* The stacks' frame indices, written only by the stack functions: 2 bytes each (sf16) while
   * every index is below 65,536, then 4 (sf32; sf16 is emptied when the first larger one comes).
   * nsf = how many. */
  MS_VEC(uint16_t) sf16;
  MS_VEC(uint32_t) sf32;
  bool sf_wide;
  size_t nsf;
  /* Staging room for a stack being gathered (ms__snapbuild_stack_room): its len stays 0, the
   * producer writes 4-byte indices at ptr[0..] and stack_tail interns them from there. */
  MS_VEC(uint32_t) stack_frames;
  MS_VEC(ms_snap_kv_t) settings;
  MS_VEC(ms_snap_kv_t) settings_children;
  MS_VEC(ms_snap_kv_t) stats;
  MS_VEC(ms_snap_annotation_t) annotations;
  /* string arena */
  ms__arena_chunk_t *chunks;
  size_t arena_bytes;
  /* intern tables: open addressing, entry = hash tag << 32 | (index + 1), 0 = empty */
  uint64_t *frame_tab;
  size_t frame_tab_cap;
  uint64_t *stack_tab;
  size_t stack_tab_cap;
  uint64_t *str_tab; /* short-string intern table; entries index str_list */
  size_t str_tab_cap;
  MS_VEC(const char *) str_list;
  /* Every frame index the stack functions stored is below stack_frame_bound, so that finish()
   * need not re-read them. */
  uint32_t stack_frame_bound;
  /* Distinct trace extras (ms__snapbuild_trace_extra), in the arena, interned by value. */
  MS_VEC(const ms_snap_trace_extra_t *) extras;
  uint64_t *extra_tab;
  size_t extra_tab_cap;
  const ms_snap_trace_extra_t *extra_last[2]; /* the last two found or made */
  int extra_next;                             /* the slot of extra_last replaced next */
  /* The last call's fields as given, its entry's action, and its answer (t->extra) */
  ms_snap_trace_extra_t extra_in;
  uint8_t extra_in_action;
  bool extra_in_valid;
  const ms_snap_trace_extra_t *extra_out;
} ms__snapbuild_t;

/* A trace entry's extra fields at their defaults: the action's own name, no compile context or
 * user metadata, the default pool, the default stream (0). */
static inline ms_snap_trace_extra_t ms__trace_extra_of(const ms_snap_trace_t *t) {
  if (t->extra) return *t->extra;
  ms_snap_trace_extra_t x = {NULL, "", "", {0, 0}, "", 0};
  return x;
}
/* Sets trace entry t's extra fields to *x: t->extra becomes NULL when they are all defaults, else
 * a copy shared by every entry with the same fields (the strings are not copied: they must live
 * as long as the snapshot, as those of ms__snapbuild_str or static ones do). An action_name that
 * equals the action's own name is stored as NULL. */
int ms__snapbuild_trace_extra(ms__snapbuild_t *b, ms_snap_trace_t *t,
                              const ms_snap_trace_extra_t *x);

void ms__snapbuild_init(ms__snapbuild_t *b);
void ms__snapbuild_release(ms__snapbuild_t *b);

/* Copies len bytes of s (plus a NUL) into the arena; *out points to the copy. Short strings
 * (< 256 bytes) are interned: equal strings share storage. */
int ms__snapbuild_str(ms__snapbuild_t *b, const char *s, size_t len, const char **out);

/* Interns a frame; strings are copied. *out = its index. */
int ms__snapbuild_frame(ms__snapbuild_t *b, const char *name, size_t name_len,
                        const char *filename, size_t filename_len, int64_t line, uint32_t *out);
/* Interns a frame whose strings already live in this builder's arena. */
int ms__snapbuild_frame_owned(ms__snapbuild_t *b, const char *name, const char *filename,
                              int64_t line, uint32_t *out);
/* Interns a stack of n frame indices (innermost first). *out = its index. */
int ms__snapbuild_stack(ms__snapbuild_t *b, const uint32_t *frames, size_t n, uint32_t *out);
/* A stack written in place (for producers that gather a stack one frame at a time): stack_room
 * makes room for have + extra frame indices in the builder's staging room and sets *tail to its
 * start, where the producer writes them; stack_tail(n) then interns the n indices at *tail
 * exactly as ms__snapbuild_stack(b, tail, n, out) would. The indices written stay put across
 * other builder calls (stack_tail and ms__snapbuild_stack copy what they keep into the stack
 * table, leaving the staging room as it was); *tail moves when stack_room grows the room (the
 * indices written move with it). stack_tail returns MS_EINVAL when n exceeds the room made. */
int ms__snapbuild_stack_room(ms__snapbuild_t *b, size_t have, size_t extra, uint32_t **tail);
int ms__snapbuild_stack_tail(ms__snapbuild_t *b, size_t n, uint32_t *out);
/* For producers that intern stacks some time after gathering them, so that the lookup does not
 * wait for memory (a 1 GB pickle's 5 million stacks miss the cache): stack_hash is the intern
 * table's hash of n indices, stack_prefetch(hash) starts loading the table slot it will probe,
 * and stack_tail_hashed is stack_tail with that hash (of the same n indices at the tail). */
uint64_t ms__snapbuild_stack_hash(const uint32_t *frames, size_t n);
void ms__snapbuild_stack_prefetch(const ms__snapbuild_t *b, uint64_t hash);
int ms__snapbuild_stack_tail_hashed(ms__snapbuild_t *b, size_t n, uint64_t hash, uint32_t *out);
/* stack_tail_hashed of the n indices from index `at` of the tail on (several stacks queued one
 * after another in the tail, interned without moving them). */
int ms__snapbuild_stack_tail_at(ms__snapbuild_t *b, size_t at, size_t n, uint64_t hash,
                                uint32_t *out);

/* Appends a record (copied). Index of the new record = the vector's len before the call. */
int ms__snapbuild_add_segment(ms__snapbuild_t *b, const ms_snap_segment_t *seg);
int ms__snapbuild_add_block(ms__snapbuild_t *b, const ms_snap_block_t *blk);
int ms__snapbuild_add_history(ms__snapbuild_t *b, const ms_snap_history_t *h);
int ms__snapbuild_add_device(ms__snapbuild_t *b, const ms_snap_device_t *d);
int ms__snapbuild_add_trace(ms__snapbuild_t *b, const ms_snap_trace_t *t);
int ms__snapbuild_add_stat(ms__snapbuild_t *b, const ms_snap_kv_t *kv);
int ms__snapbuild_add_annotation(ms__snapbuild_t *b, const ms_snap_annotation_t *a);
/* Settings (allocator_settings). Top-level entries are added with add_setting; the entries of a
 * nested map with add_setting_child, which returns the child's index among children in *index;
 * a MAP entry (top-level or child) sets first = the index of its first child (as returned by
 * add_setting_child) and count. finish() places the top-level entries first and rebases every
 * MAP's `first` so that it indexes ms_snapshot_t.settings. */
int ms__snapbuild_add_setting(ms__snapbuild_t *b, const ms_snap_kv_t *kv);
int ms__snapbuild_add_setting_child(ms__snapbuild_t *b, const ms_snap_kv_t *kv, uint32_t *index);

/* MS_VEC_RESERVE for a producer's own big temporary tables (e.g. the pickle reader's value and
 * container tables): the same contract (0, or -1 with the vector unchanged), on an array of
 * ms__big_realloc (common/internal.h; freed by ms__big_free, never free), so that what is built
 * next reuses its pages (MS_REUSE_MEMORY); a mapping past 4 MiB is advised to use transparent huge
 * pages, which makes first-touch page faults rarer. */
int ms__bigvec_reserve(void **ptr, size_t *cap, size_t len, size_t extra, size_t elem);
#define MS_BIGVEC_RESERVE(v, extra)                                                                \
  ((size_t)(extra) <= (v)->cap - (v)->len                                                          \
       ? 0                                                                                         \
       : ms__bigvec_reserve((void **)&(v)->ptr, &(v)->cap, (v)->len, (extra), sizeof(*(v)->ptr)))

/* Checks the structural invariants of the model (indices in range, segments' blocks in range,
 * stacks' frames in range). @return MS_OK or MS_EFORMAT with a description in eb. */
int ms__snapshot_check(const ms_snapshot_t *s, ms_errbuf_t *eb);

/* Moves the built tables into a new snapshot (*out). The builder is left empty.
 * Runs ms__snapshot_check first; on failure nothing is moved. (The frame indices of stacks are
 * not read again when the stack functions saw them all in range: the check gives the same
 * result.) */
int ms__snapbuild_finish(ms__snapbuild_t *b, ms_snapshot_t **out, ms_errbuf_t *eb);

/* A new snapshot that borrows every table of src (frames, stacks, trace, history, settings,
 * statistics, annotations, strings) and owns its segments and blocks, which start empty (NULL, 0):
 * the caller fills them with malloc'd arrays, and a copy of src's devices (so that a device's
 * trace can be cut short). ms_snapshot_free() frees those, and the snapshot itself, never src's
 * tables; src must outlive it.
 * Used by the time index (lib/timeline/) to show an earlier moment through the existing views.
 * @return MS_OK or MS_ENOMEM. */
int ms__snapshot_new_borrowing(const ms_snapshot_t *src, ms_snapshot_t **out);

/* What a reader keeps with a snapshot it made (lib/snapshot/deferred.c: the file and the places
 * of stacks read later), and how ms_snapshot_free() releases it: ext_free runs first, and may put
 * back into snap the stack tables it replaced (freed as the snapshot's own). A borrowing snapshot
 * has none. */
void ms__snapshot_set_ext(ms_snapshot_t *snap, void *ext,
                          void (*ext_free)(ms_snapshot_t *, void *));
void *ms__snapshot_ext(const ms_snapshot_t *snap);

/* A new snapshot made of tables built elsewhere (the cache reader, lib/cache/): it takes every
 * array of *tables (each malloc'd, or NULL when empty, as ms_snapshot_free frees them) and
 * `strings`, one malloc'd block (or NULL) that the tables' strings point into, freed with it.
 * Runs ms__snapshot_check first; on failure (MS_EFORMAT) nothing is taken: the caller still owns
 * the arrays and the block. @return MS_OK, MS_EFORMAT or MS_ENOMEM. */
int ms__snapshot_adopt(const ms_snapshot_t *tables, void *strings, ms_snapshot_t **out,
                       ms_errbuf_t *eb);

#endif /* MEMSNAP_LIB_SNAPBUILD_H */
