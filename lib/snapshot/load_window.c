/* SPDX-License-Identifier: MIT
 * memsnap core: loading a snapshot for a window of its trace (ms_snapshot_load_window,
 * memsnap/serialize.h). The rules that leave stacks out are the pickle reader's
 * (pickle_drop.c); this file hands them the window (snapshot/load_window.h).
 */
#include <stddef.h>

#include "common/internal.h"
#include "snapshot/load_window.h"

static __thread ms__load_window_t *load_window_now;

ms__load_window_t *ms__load_window_current(void) {
  return load_window_now;
}

int ms_snapshot_load_window(const char *path, unsigned flags, const ms_load_window_t *window,
                            ms_snapshot_t **out, ms_errbuf_t *eb) {
  if (!window || window->kind == MS_LOAD_WINDOW_NONE || (flags & MS_LOAD_NO_TRACE))
    return ms_snapshot_load_ex(path, flags, out, eb);
  if (window->kind != MS_LOAD_WINDOW_ENTRIES && window->kind != MS_LOAD_WINDOW_TIMES)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load window kind %d", (int)window->kind);
  if (flags & ~(unsigned)MS_LOAD_FLAGS_ALL)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown load flags 0x%x", flags);
  ms__load_window_t lw = {0};
  lw.w = *window;
  lw.free_stacks = (flags & (MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS)) != 0;
  ms__load_window_t *saved = load_window_now;
  load_window_now = &lw;
  int rc = ms_snapshot_load_ex(path, flags | MS_LOAD_NO_FREE_STACKS, out, eb);
  load_window_now = saved;
  return rc;
}
