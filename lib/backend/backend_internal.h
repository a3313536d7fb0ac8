/* SPDX-License-Identifier: MIT
 * memsnap core: what backend.c, the backends in lib/backend/ and the allocator share about
 * ms_backend_t (never installed).
 *
 * A backend is a copy of its ops table; the sim backend's extra calls recognise their own
 * backends by the ops table's device_count function.
 */
#ifndef MEMSNAP_LIB_BACKEND_INTERNAL_H
#define MEMSNAP_LIB_BACKEND_INTERNAL_H

#include "memsnap/backend.h"

struct ms_backend_s {
  ms_backend_ops_t ops;
};

/* "backend/sim.c": whether ops belong to a sim backend. */
bool ms__backend_ops_are_sim(const ms_backend_ops_t *ops);

#endif /* MEMSNAP_LIB_BACKEND_INTERNAL_H */
