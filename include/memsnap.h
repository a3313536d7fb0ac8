/* SPDX-License-Identifier: MIT
 * memsnap: umbrella header. Includes every public header of the core library.
 * The visualisation library's header is memsnap/viz.h (link memsnap::viz). */
#ifndef MEMSNAP_H
#define MEMSNAP_H

#include "memsnap/common.h"
#include "memsnap/error.h"
#include "memsnap/config.h"
#include "memsnap/stats.h"
#include "memsnap/backend.h"
#include "memsnap/allocator.h"
#include "memsnap/options.h"
#include "memsnap/snapshot.h"
#include "memsnap/serialize.h"
#include "memsnap/history.h"
#include "memsnap/replay.h"
#include "memsnap/pickle.h"
#include "memsnap/timeline.h"
#include "memsnap/attribution.h"
#include "memsnap/export.h"
#include "memsnap/explain.h"
#include "memsnap/cache.h"

#endif /* MEMSNAP_H */
