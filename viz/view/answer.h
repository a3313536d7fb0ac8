/* SPDX-License-Identifier: MIT
 * memsnap viewer: the Explain panel's data (answer.c).
 */
#ifndef MEMSNAP_VIZ_VIEW_ANSWER_H
#define MEMSNAP_VIZ_VIEW_ANSWER_H

#include <stddef.h>

#include "memsnap/attribution.h"
#include "memsnap/snapshot.h"
#include "memsnap/timeline.h"
#include "writer.h"

/* Writes device dev's answer (memsnap/explain.h) as one JSON object: the members of `memsnap
 * explain --json` but top_by_stack (ms_explain_write_json), and the viewer's: capacity_oom_entry,
 * replayed, replay_note and "series" ([step, allocated, reserved] buckets); {"error": "..."} when
 * there is none. replay: 1 replays the remedies (without the smallest
 * capacities), 0 does not, -1 only on a device that had an OOM. tl: the time index of s (with
 * the default configuration), or NULL: the answer builds its own; attr: a classifier of s over tl
 * with the default rules, or NULL (ms_explain_options_t.attr). */
void ms__view_answer_json(vw_t *w, const ms_snapshot_t *s, const ms_timeline_t *tl,
                          const ms_attr_t *attr, size_t dev, int replay);

#endif
