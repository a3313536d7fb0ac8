/* SPDX-License-Identifier: MIT
 * memsnap viewer (viz/view): the snapshot's stacks as binary sections (bin.h), compactly:
 *   stacks.count       per stack its number of frames (u8 when every stack has fewer than 256)
 *   stacks.ranks       per stack, from its outermost frame in, each frame as its rank among the
 *                      frames that follow the frame before it, a byte each: 255 means "255 or
 *                      more", the rank then being the next of stacks.ranks_big
 *   stacks.nbig        per stack, how many of its ranks are in stacks.ranks_big (type of count)
 *   stacks.ranks_big   those ranks (u16 with fewer than 65,536 frames, else u32)
 *   stacks.succ_count  per frame, then for the root (the context of outermost frames), the
 *                      number of frames ever seen right inside it
 *   stacks.succ        those frames, context by context, in rank order
 * To read stack i: ctx = root; for each rank r: frame = succ[start(ctx) + r]; ctx = frame
 * (start(ctx) = the sum of succ_count before ctx); the frames come outermost first.
 */
#ifndef MEMSNAP_VIZ_VIEW_STACKS_H
#define MEMSNAP_VIZ_VIEW_STACKS_H

#include "memsnap/snapshot.h"
#include "bin.h"

/* @return MS_OK or MS_ENOMEM (the sections' own write errors are in b->err). */
int vs_write_stacks(vb_t *b, const ms_snapshot_t *s);

#endif
