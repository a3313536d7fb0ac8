/* SPDX-License-Identifier: MIT
 * memsnap core: what the files of explain/ share (memsnap/explain.h). state.c: the moment, the
 * figures of the state at it, the verdict and the holders; remedies.c: the remedies' replays and
 * the recommendation.
 */
#ifndef MEMSNAP_LIB_EXPLAIN_INTERNAL_H
#define MEMSNAP_LIB_EXPLAIN_INTERNAL_H

#include "common/internal.h"
#include "memsnap/explain.h"
#include "memsnap/replay.h"

#define EX_MIB (1024ull * 1024ull)
#define EX_SMALL_SIZE EX_MIB            /* kSmallSize: requests up to 1 MiB use the small pool */
#define EX_SMALL_BUFFER (2 * EX_MIB)    /* kSmallBuffer */
#define EX_LARGE_BUFFER (20 * EX_MIB)   /* kLargeBuffer */
#define EX_MIN_LARGE_ALLOC (10 * EX_MIB) /* kMinLargeAlloc */
#define EX_ROUND_LARGE (2 * EX_MIB)     /* kRoundLarge */

/* Replays the remedies of x (moment, capacity and request filled) and writes the
 * recommendation. @return MS_OK or MS_ENOMEM (a replay that fails is noted in its remedy). */
int ms__explain_remedies(const ms_snapshot_t *snap, const ms_explain_options_t *o,
                         ms_explain_t *x);

/* "1.5GiB" (memsnap's size text, as the CLI prints sizes). */
const char *ms__explain_size(uint64_t n, char *buf, size_t cap);

#endif /* MEMSNAP_LIB_EXPLAIN_INTERNAL_H */
