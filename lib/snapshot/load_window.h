/* SPDX-License-Identifier: MIT
 * memsnap core: the trace window of a load in progress (ms_snapshot_load_window,
 * memsnap/serialize.h), as the pickle reader's drop rules (pickle_drop.c) see it.
 *
 * ms_snapshot_load_window() sets the calling thread's window for the duration of its
 * ms_snapshot_load_ex() (with MS_LOAD_NO_FREE_STACKS, whose bookkeeping of the entries, in trace
 * order, the window's rules use), so that the readers' signatures stay as they are; a read again
 * in full (without that flag) never consults it.
 */
#ifndef MEMSNAP_SNAPSHOT_LOAD_WINDOW_H
#define MEMSNAP_SNAPSHOT_LOAD_WINDOW_H

#include <stdbool.h>
#include <stdint.h>

#include "memsnap/serialize.h"

typedef struct ms__load_window_s {
  ms_load_window_t w;
  bool free_stacks;   /* the caller asked for MS_LOAD_NO_FREE_STACKS (or _DEFER_STACKS) itself */
  /* the reader's progress through the device lists (entries are accounted in trace order) */
  bool have_list;
  uint32_t list;      /* the device list whose entries were accounted last */
  uint32_t first_rec; /* its first entry's trace record */
  bool late;          /* MS_LOAD_WINDOW_TIMES: an entry of that list was past the window's end */
} ms__load_window_t;

/* The calling thread's window, NULL outside ms_snapshot_load_window(). */
ms__load_window_t *ms__load_window_current(void);

#endif /* MEMSNAP_SNAPSHOT_LOAD_WINDOW_H */
