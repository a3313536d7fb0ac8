/* SPDX-License-Identifier: MIT
 * memsnap core: trace stacks read when they are asked for (MS_LOAD_DEFER_STACKS,
 * memsnap/serialize.h; lib/snapshot/deferred.c). Internal to lib/.
 *
 * A read of a PyTorch pickle with MS_LOAD_DEFER_STACKS leaves the stacks of alloc entries out
 * when it read their frames lists whole on its fast path (a MARK, one memo get per frame dict
 * already interned, an APPENDS), and records where the list's gets are in the file. The snapshot
 * keeps the file open (its identity checked at each fill), those places, and which frame each
 * memo index named. A fill reads the gets again and interns their stacks into the snapshot's
 * stack table, beside the stacks it has (the same stack, the same id).
 */
#ifndef MEMSNAP_LIB_SNAPSHOT_DEFERRED_H
#define MEMSNAP_LIB_SNAPSHOT_DEFERRED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "memsnap/error.h"
#include "memsnap/snapshot.h"

/* Where the frames lists of the records left for later are: per record a 4-byte offset from the
 * first place noted in its block of MS__DEFER_BLOCK records (a block's records lie within a few
 * MB of one another: one that does not fit is not left for later). */
#define MS__DEFER_BLOCK 4096
typedef struct ms__defer_locs_s {
  uint32_t *off;  /* per record: its offset - base[rec / MS__DEFER_BLOCK] + 1; 0 for none (an
                     ms__big_* array: its pages reused, untouched past cap) */
  uint64_t *base; /* per block: UINT64_MAX until a record of it is noted */
  size_t cap;     /* records `off` holds and says are noted or not, a multiple of MS__DEFER_BLOCK
                     (set block by block as records are noted: the rest is not written) */
  size_t room;    /* records `off` and `base` have room for */
  size_t n;       /* records noted and not read yet */
} ms__defer_locs_t;

/* Notes that record rec's frames list's first get is at file offset off. false: out of memory,
 * or too far from its block's first: the record's stack is read now. */
bool ms__defer_locs_note(ms__defer_locs_t *l, size_t rec, uint64_t off);
void ms__defer_locs_free(ms__defer_locs_t *l);

/* Gives snap what a deferred read found: fd (duplicated here; the caller keeps its own) of a file
 * that had `size` bytes when the read began (MS_EIO when it has no longer), the places (taken,
 * *locs zeroed), and the frame of each memo index that held an interned frame dict (nf pairs,
 * memo ascending). On failure snap is unchanged and the places are freed. */
int ms__deferred_attach(ms_snapshot_t *snap, int fd, uint64_t size, ms__defer_locs_t *locs,
                        const uint32_t *memo, const uint32_t *frame, size_t nf, ms_errbuf_t *eb);

/* Whether snap was read with stacks left for later (some may be read by now). */
bool ms__snapshot_defers(const ms_snapshot_t *snap);
/* Whether snap has trace stacks still to read. */
bool ms__snapshot_has_deferred(const ms_snapshot_t *snap);

/* Reads the stacks of the trace records trace_idx[0..n) that are still to read (others are
 * skipped) and sets their `stack`. The snapshot is const to its readers: this fills in what its
 * load left for later, and must not run beside another use of the same snapshot. MS_EIO when the
 * file changed since it was read (or cannot be read), MS_EFORMAT when its bytes are no longer the
 * frames list read before, MS_ENOMEM. */
int ms__snapshot_fill_stacks(const ms_snapshot_t *snap, const size_t *trace_idx, size_t n,
                             ms_errbuf_t *eb);

/* What ms__snapshot_scan_deferred shows of trace record rec: the frame indices of its stack,
 * frames[0..n) (n >= 1), as a fill would intern them. A result other than MS_OK stops the scan
 * and is its result. */
typedef int ms__deferred_visit_fn(void *ctx, size_t rec, const uint32_t *frames, uint32_t n);

/* Shows fn every trace record whose stack is still to read, in the records' order, reading the
 * file again without interning anything (a classifier that needs each allocation's frames, not
 * its stack). Nothing is filled. Same errors as ms__snapshot_fill_stacks, and fn's. */
int ms__snapshot_scan_deferred(const ms_snapshot_t *snap, ms__deferred_visit_fn *fn, void *ctx,
                               ms_errbuf_t *eb);

/* ---- watching a deferred read ---------------------------------------------------------------
 * A classifier needs the frames of every allocation; a read that leaves their stacks for later
 * has them in hand once, as it reads each record. A watch is shown them then, so that the file
 * need not be read again (ms__snapshot_scan_deferred) for that. */

/* Record rec is left for later; its frames are frames[0..n) (n >= 1), indices into ftab[0..nftab),
 * the frames read so far (the snapshot's frame indices; ftab is valid during the call only). */
typedef void ms__defer_watch_fn(void *ctx, size_t rec, const uint32_t *frames, uint32_t n,
                                const ms_snap_frame_t *ftab, size_t nftab);

/* ms_snapshot_load_ex(path, flags, out, eb) with fn shown every record the read leaves for later
 * (flags must hold MS_LOAD_DEFER_STACKS for there to be any), as it reads them, on the calling
 * thread. A read that fails and is made again without leaving stacks for later (a trace that
 * cannot be read so) shows nothing more: what fn saw then is of no snapshot, and the snapshot
 * returned has no record left for later (ms__snapshot_defers is false). */
int ms__snapshot_load_watched(const char *path, unsigned flags, ms__defer_watch_fn *fn, void *ctx,
                              ms_snapshot_t **out, ms_errbuf_t *eb);
/* The watch of the calling thread's read (NULL: none), and its context (pickle_drop.c). */
ms__defer_watch_fn *ms__defer_watch_current(void **ctx);

/* Gives a snapshot read with stacks left for later p, what a watch of its read found, freed with
 * free_fn when the snapshot is (a companion kept before is freed now). false when snap was not
 * read so (p is then not taken). */
bool ms__snapshot_defer_keep(ms_snapshot_t *snap, void *p, void (*free_fn)(void *));
/* The companion ms__snapshot_defer_keep gave snap (NULL: none). */
void *ms__snapshot_defer_kept(const ms_snapshot_t *snap);

#endif /* MEMSNAP_LIB_SNAPSHOT_DEFERRED_H */
