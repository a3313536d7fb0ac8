/* SPDX-License-Identifier: MIT
 * memsnap core: one device's trace prepared once for many what-if replays (lib/replay/entry.c),
 * for callers that replay it under several settings (explain's remedies). Internal to lib/.
 *
 * The preparation rebuilds the start state and runs the check replay, which classifies the
 * trace's bursts and free_completed entries for the what-if runs; ms_replay_run() and
 * ms_replay_min_capacity() do both for every call. A prepared device is only read afterwards:
 * what-if runs and searches on it may run on several threads at once.
 */
#ifndef MEMSNAP_LIB_REPLAY_PREPARED_H
#define MEMSNAP_LIB_REPLAY_PREPARED_H

#include <stddef.h>

#include "memsnap/error.h"
#include "memsnap/replay.h"
#include "memsnap/snapshot.h"

typedef struct ms__rp_prepared_s ms__rp_prepared_t;

/* Prepares device `device` of snap (which must outlive it). A trace that cannot be replayed is
 * prepared too: its result says so (verdict MS_REPLAY_UNREPLAYABLE, reason), and the calls below
 * answer as ms_replay_run() and ms_replay_min_capacity() do then. @return MS_OK, MS_EINVAL,
 * MS_ENOMEM. */
int ms__rp_prepared_create(const ms_snapshot_t *snap, int device, ms__rp_prepared_t **out,
                           ms_errbuf_t *eb);

/* The preparation's and the check replay's result (verdict, reason, the recorded figures). */
const ms_replay_device_t *ms__rp_prepared_result(const ms__rp_prepared_t *p);

/* The what-if of o (its config, capacity, recorded_capacity, inferred_capacity and fresh_start;
 * not its device or whatif) on the prepared device, into *res as ms_replay_run() fills a device
 * of its report. @return as ms_replay_run(). */
int ms__rp_prepared_whatif(const ms__rp_prepared_t *p, const ms_replay_options_t *o,
                           ms_replay_device_t *res, ms_errbuf_t *eb);

/* ms_replay_min_capacity() of config on the prepared device. */
int ms__rp_prepared_min_capacity(const ms__rp_prepared_t *p, const char *config, size_t *out,
                                 ms_errbuf_t *eb);

/* Accepts NULL. */
void ms__rp_prepared_free(ms__rp_prepared_t *p);

#endif /* MEMSNAP_LIB_REPLAY_PREPARED_H */
