/* SPDX-License-Identifier: MIT
 * memsnap viz: snapshot views, i.e. the folded stacks of PyTorch's `_memory_viz.py` `memory`,
 * `segments` and `compare` (docs/cli.md, `memory` and `segments`, `compare`).
 *
 * A view walks a snapshot and emits one stack per line of the folded text that `_memory_viz.py`
 * writes for flamegraph.pl: the frames root-first and a count in bytes. The same emitter feeds
 * the folded-text writer (`--folded`, ms_view_folded_emit) and the flame-graph builder (the SVG),
 * so the two outputs cannot disagree.
 *
 * Vocabulary of the frames of a stack, root-first:
 *  - `only_before` / `only_after` (compare only), then `stream_<S>`, then `seg_<ADDR>` (segments
 *    and compare; ADDR in decimal), then the block state as the snapshot spells it
 *    (`active_allocated`, `active_pending_free`, `inactive`, ...);
 *  - then the block's frames, outermost first, each as `<basename(filename)>:<line>:<name>`
 *    (basename = the text after the last '/'; Windows paths stay whole), with PyTorch's frame
 *    filter applied (ms_view_frame_kept); or `<non-python>` for an empty stack; or `<no-context>`
 *    for a legacy history entry recorded without frames; or `<gaps>` for the bytes of a block that
 *    its allocations do not account for (rounding slack, free space).
 *  - When every frame of a stack is filtered out, the stack ends in one empty frame "" (PyTorch
 *    writes `...;<state>; <n>`); folded text keeps it, a flame-graph consumer may drop it.
 * Lines with a negative count (a `<gaps>` line of an inactive block whose stale requested size
 * exceeds its size; flamegraph.pl drops them) are never emitted. Lines with a zero count are
 * emitted, as PyTorch writes them.
 *
 * Names are data: a frame name containing ';', markup or control bytes is passed through as is.
 * Thread-safety: views only read the (immutable) snapshot; they keep no global state.
 */
#ifndef MEMSNAP_VIEWS_H
#define MEMSNAP_VIEWS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/serialize.h"
#include "memsnap/snapshot.h"

MS_EXTERN_C_BEGIN

typedef enum ms_view_kind {
  MS_VIEW_MEMORY = 0, /* stream_S;STATE;frames...           (_memory_viz.py memory) */
  MS_VIEW_SEGMENTS,   /* stream_S;seg_ADDR;STATE;frames...  (_memory_viz.py segments) */
} ms_view_kind;

/* Receives one stack of a view: nframes >= 1 frames, root-first (the strings are valid only
 * during the call), and its count in bytes.
 * @return 0 to go on, or a negative ms_err, which stops the view and is returned by it. */
typedef int ms_view_emit_fn(void *ctx, const char *const *frames, size_t nframes, uint64_t count);

/* Emits the stacks of `kind` for every block of every segment, in snapshot order (segments as
 * stored, blocks in address order, legacy history entries newest first), exactly the lines of
 * `_memory_viz.py memory|segments` minus those with a negative count.
 * @return MS_OK, MS_ENOMEM, or the first error returned by emit. */
MS_API MS_NODISCARD int ms_view_emit(const ms_snapshot_t *snap, ms_view_kind kind,
                                     ms_view_emit_fn *emit, void *ctx);

/* Segments present in one snapshot and not the other, keyed as `_memory_viz.py compare` keys
 * them: by (address, total_size). Each list is sorted by address (then size) ascending and holds
 * each key once. Free with ms_view_segdiff_release(); release accepts a zeroed struct. */
typedef struct ms_view_segdiff_s {
  uint64_t *only_before; /* addresses of segments only in BEFORE */
  size_t n_before;
  uint64_t *only_after; /* addresses of segments only in AFTER */
  size_t n_after;
} ms_view_segdiff_t;

/* Fills *out (left untouched on failure). @return MS_OK or MS_ENOMEM. */
MS_API MS_NODISCARD int ms_view_segdiff(const ms_snapshot_t *before, const ms_snapshot_t *after,
                                        ms_view_segdiff_t *out);
MS_API void ms_view_segdiff_release(ms_view_segdiff_t *d);

/* Emits the compare view: the blocks of every segment only in BEFORE, in BEFORE's order, under
 * `only_before;stream_S;seg_ADDR;STATE;...`, then those of every segment only in AFTER under
 * `only_after;...` (`_memory_viz.py compare` as it was meant to work).
 * @return as ms_view_emit. */
MS_API MS_NODISCARD int ms_view_compare_emit(const ms_snapshot_t *before,
                                             const ms_snapshot_t *after, ms_view_emit_fn *emit,
                                             void *ctx);

/* PyTorch's frame filter (`_frame_filter`): false when the name contains one of the omitted
 * function markers (`unwind::unwind`, `PyEval_`, `_start`, ...) or the filename one of the omitted
 * file markers (`core/boxing`, `/Register`, `ceval.c`, ...): plain substring tests. */
MS_API bool ms_view_frame_kept(const char *name, const char *filename);

/* Formats a frame as the flame graph names it, `<basename(filename)>:<line>:<name>`, into buf
 * (always NUL-terminated when cap > 0). @return the length the full text needs (like snprintf). */
MS_API size_t ms_view_frame_format(char *buf, size_t cap, const ms_snap_frame_t *f);

/* An ms_view_emit_fn that writes each stack as one folded line, `f1;f2;...;fn COUNT\n`, to the
 * ms_sink_t passed as ctx. @return 0 or the sink's error. */
MS_API int ms_view_folded_emit(void *ctx, const char *const *frames, size_t nframes,
                               uint64_t count);

MS_EXTERN_C_END

#endif /* MEMSNAP_VIEWS_H */
