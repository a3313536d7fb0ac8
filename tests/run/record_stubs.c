/* SPDX-License-Identifier: MIT
 * What lib/interpose/record.c needs from preload.c, for testing the recorder in-process
 * (tests/test_run_record.c): the re-entrancy flag, and a cache mode that a test may switch on by
 * giving the allocators to snapshot (record_stub_allocs). */
#include "interpose/run_internal.h"
#include "memsnap/history.h"

__thread int ms__run_in_hook __attribute__((tls_model("initial-exec")));

/* Set by a test: the allocators standing for the cache mode's (NULL: cache mode off). */
ms_allocator_t *record_stub_allocs[4];
size_t record_stub_nallocs;

bool ms__run_cache_active(void) {
  return record_stub_nallocs > 0;
}

int ms__run_cache_snapshot(int device, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_allocator_t *as[4];
  size_t n = 0;
  for (size_t i = 0; i < record_stub_nallocs; i++)
    if (device < 0 || ms_allocator_device(record_stub_allocs[i]) == device)
      as[n++] = record_stub_allocs[i];
  if (n == 0) {
    *out = NULL;
    return MS_OK;
  }
  return ms_allocator_snapshot(as, n, out, eb);
}

uint64_t ms__run_cache_devices(void) {
  uint64_t m = 0;
  for (size_t i = 0; i < record_stub_nallocs; i++)
    m |= 1ULL << ms_allocator_device(record_stub_allocs[i]);
  return m;
}

void ms__run_preload_fork(ms__run_fork_phase phase) {
  (void)phase;
}
