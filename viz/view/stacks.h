/* SPDX-License-Identifier: MIT
 * memsnap viewer (viz/view): the snapshot's stacks as binary sections (bin.h), compactly.
 *
 * A stack is a walk from the root through its frames, outermost first, to its end. Each step
 * goes from a context (the root, then the frame before) to a successor: a frame, or the end of
 * the stack. The successors of each context (those ever seen right after it, in any stack) are
 * listed once, most frequent first; a step is written as its successor's rank in that list, and a
 * step from a context with only one successor is not written at all (after an interpreter frame
 * always comes the same one, after the allocator's innermost frame always the end). So the
 * stacks cost about what their choices are worth, not a byte per frame:
 *   stacks.n           one value: the number of stacks
 *   stacks.succ_count  per frame, then for the root, the number of its successors
 *   stacks.succ        those successors, context by context, in rank order; the end of a stack
 *                      is the value nframes (u16 when nframes < 65,536, else u32)
 *   stacks.ranks       the written steps from contexts with at most 256 successors, stack after
 *                      stack: the rank (u8)
 *   stacks.ranks_hi    those from contexts with more: the rank's high byte (u8), 255 meaning
 *                      that the rank (255 * 256 or more) is the next of stacks.ranks_big (u32)
 *   stacks.ranks_lo    their low bytes (u8; none for a big rank)
 *   stacks.at          where every 64th stack (0, 64, ...) starts in stacks.ranks, then where
 *                      in stacks.ranks_hi, in stacks.ranks_lo and in stacks.ranks_big (f64)
 * (the few frames after which many others follow, like the interpreter's frame before a Python
 * frame, have their ranks apart: each section compresses by its own statistics).
 * To read stack i, start where stack 64 * (i / 64) starts and read the stacks before i:
 *   ctx = root; loop: r = (one successor ? 0 : the next rank, from stacks.ranks or from the
 *   others by the context's number of successors); f = succ[start(ctx) + r];
 *   stop at the end; else f is the next frame (outermost first) and ctx = f
 * (start(ctx) = the sum of succ_count before ctx).
 */
#ifndef MEMSNAP_VIZ_VIEW_STACKS_H
#define MEMSNAP_VIZ_VIEW_STACKS_H

#include "memsnap/snapshot.h"
#include "bin.h"

/* @return MS_OK, MS_ENOMEM or MS_ELIMIT (more frames than the format counts; the sections' own
 * write errors are in b->err). */
int vs_write_stacks(vb_t *b, const ms_snapshot_t *s);

/* vs_write_stacks in parts, so that the work (every stack's steps counted and ranked, the
 * ranks kept in memory) can run on threads of their own while other sections are written:
 * vs_plan reads the snapshot only: the first pass and the ranking (@return MS_OK, MS_ENOMEM,
 * MS_EINVAL or MS_ELIMIT; *out NULL on failure); then any number of threads at once may call vs_plan_work,
 * which walks parts of the second pass (stacks in parts of about 1/64 of them) until none is
 * left (@return MS_OK: its errors are vs_write_plan's); once they have returned, vs_write_plan
 * walks what is left and writes what vs_write_stacks writes (@return MS_OK, MS_ENOMEM or
 * MS_EINVAL). vs_plan_free accepts NULL. */
typedef struct vs_plan_s vs_plan_t;
int vs_plan(const ms_snapshot_t *s, vs_plan_t **out);
int vs_plan_work(vs_plan_t *p, const ms_snapshot_t *s);
int vs_write_plan(vb_t *b, const ms_snapshot_t *s, vs_plan_t *p);
void vs_plan_free(vs_plan_t *p);

#endif
