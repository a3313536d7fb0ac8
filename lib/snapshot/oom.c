/* SPDX-License-Identifier: MIT
 * memsnap core: the OOM observer (ms_oom_snapshot_install, memsnap/history.h): when an allocation
 * runs out of memory, a snapshot of the allocator is taken and written to a file named by a
 * pattern; ms_snapshot_dump, the same written now, on request. It sits above history (it takes and writes snapshots); the recorder keeps the pattern
 * (history/history.c) so that it lives and dies with the allocator.
 */
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/internal.h"
#include "history/history_internal.h"
#include "memsnap/serialize.h"

static atomic_ulong oom_counter;
static __thread int oom_in_observer;

int ms_oom_path_format(const char *pattern, int device, uint64_t counter, char *dst, size_t cap) {
  if (!pattern || !dst || cap == 0) return MS_EINVAL;
  size_t o = 0;
  char num[32];
  for (const char *p = pattern; *p; p++) {
    const char *piece = p;
    size_t len = 1;
    if (*p == '%') {
      switch (p[1]) {
      case 'p':
        len = (size_t)snprintf(num, sizeof num, "%ld", (long)getpid());
        piece = num;
        break;
      case 'd':
        len = (size_t)snprintf(num, sizeof num, "%d", device);
        piece = num;
        break;
      case 'n':
        len = (size_t)snprintf(num, sizeof num, "%llu", (unsigned long long)counter);
        piece = num;
        break;
      case '%':
        break;
      default:
        return MS_EINVAL;
      }
      p++;
    }
    if (len >= cap - o) return MS_ELIMIT;
    memcpy(dst + o, piece, len);
    o += len;
  }
  if (o == 0) return MS_EINVAL;
  dst[o] = 0;
  return MS_OK;
}

static void oom_observer(void *arg, int device, size_t alloc_size, size_t device_total,
                         size_t device_free) {
  ms__recorder_t *r = arg;
  if (oom_in_observer) return; /* an OOM raised by our own work is not observed again */
  oom_in_observer = 1;
  char pattern[4096];
  ms__recorder_oom_pattern(r, pattern, sizeof pattern);
  char path[4096];
  uint64_t n = atomic_fetch_add(&oom_counter, 1);
  ms_errbuf_t eb;
  eb.msg[0] = 0;
  ms_snapshot_t *snap = NULL;
  ms_allocator_t *alloc = ms__recorder_allocator(r);
  int err = ms_oom_path_format(pattern, device, n, path, sizeof path);
  if (err != MS_OK) {
    ms__warning("oom snapshot: cannot format path '%s': %s", pattern, ms_strerror(err));
  } else if ((err = ms_allocator_snapshot(&alloc, 1, &snap, &eb)) != MS_OK) {
    ms__warning("oom snapshot: cannot take a snapshot of device %d: %s", device,
                eb.msg[0] ? eb.msg : ms_strerror(err));
  } else if ((err = ms_snapshot_write_file(snap, path, NULL, &eb)) != MS_OK) {
    ms__warning("oom snapshot: cannot write '%s': %s", path, eb.msg[0] ? eb.msg : ms_strerror(err));
  } else { /* say where it went: the user needs the path to open it */
    ms__message("memsnap: ",
                "out of memory on device %d (%zu bytes requested, %zu of %zu free): snapshot "
                "written to '%s'",
                device, alloc_size, device_free, device_total, path);
  }
  ms_snapshot_free(snap);
  oom_in_observer = 0;
}

int ms_snapshot_dump(ms_allocator_t *a, const char *path) {
  if (!a || !path || !*path) return MS_EINVAL;
  ms_errbuf_t eb;
  eb.msg[0] = 0;
  ms_snapshot_t *snap = NULL;
  int err = ms_allocator_snapshot(&a, 1, &snap, &eb);
  if (err != MS_OK) {
    ms__error_msg("cannot take a snapshot for '%s': %s", path, eb.msg[0] ? eb.msg : ms_strerror(err));
    return err;
  }
  if ((err = ms_snapshot_write_file(snap, path, NULL, &eb)) != MS_OK)
    ms__error_msg("cannot write '%s': %s", path, eb.msg[0] ? eb.msg : ms_strerror(err));
  ms_snapshot_free(snap);
  return err;
}

int ms_oom_snapshot_install(ms_allocator_t *a, const char *path_pattern) {
  char probe[4096];
  if (!a || !path_pattern) return MS_EINVAL;
  int err = ms_oom_path_format(path_pattern, 0, 0, probe, sizeof probe);
  MS_RETURN_IF(err != MS_OK, err == MS_ELIMIT ? MS_EINVAL : err);
  char *copy = strdup(path_pattern);
  if (!copy) return MS_ENOMEM;
  return ms__recorder_set_oom(a, copy, oom_observer);
}
