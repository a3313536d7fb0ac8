/* SPDX-License-Identifier: MIT
 * memsnap viewer: the data of the "Memory over time" view (memory.c).
 */
#ifndef MEMSNAP_VIZ_VIEW_MEMORY_H
#define MEMSNAP_VIZ_VIEW_MEMORY_H

#include <stddef.h>

#include "memsnap/timeline.h"
#include "writer.h"

/* Buckets of steps, and the samples of the largest free block, at most. */
#define MS_VIEW_MEMORY_BUCKETS 512
#define MS_VIEW_MEMORY_FREE_SAMPLES 64

/* Writes device dev's memory over time as one JSON object (docs/view.md, "Memory over time"):
 *   "steps": the device's steps (trace entries + 1; step s = the state after s entries);
 *   "step": each bucket's first step (buckets cover [step[i], step[i+1]), the last up to steps);
 *   "allocated", "reserved", "mapped", "frag": per bucket, the most bytes allocated, reserved
 *     (segments and expandable segments' mapped ranges), mapped in expandable segments, and
 *     reserved minus allocated (fragmentation and cache), each at any step of the bucket;
 *   "free_step": the steps at which the largest free block was read (at most
 *     MS_VIEW_MEMORY_FREE_SAMPLES, evenly spread, the last one the last step);
 *   "free_pools": [[pool_id_0, pool_id_1], ...] every pool with a segment at one of them, in
 *     order of first sight; "largest_free": per pool, per sample, the largest free range of its
 *     segments (bytes between and around the live blocks of one segment; 0 without a segment).
 * null when tl is NULL or does not know dev. */
void ms__view_memory_json(vw_t *w, const ms_timeline_t *tl, size_t dev);

#endif
