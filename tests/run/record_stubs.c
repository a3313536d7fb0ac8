/* SPDX-License-Identifier: MIT
 * What lib/interpose/record.c needs from preload.c, for testing the recorder in-process
 * (tests/test_run_record.c): the re-entrancy flag, and a cache mode that is never active. */
#include "interpose/run_internal.h"

__thread int ms__run_in_hook __attribute__((tls_model("initial-exec")));

bool ms__run_cache_active(void) { return false; }
int ms__run_cache_snapshot(int device, ms_snapshot_t **out, ms_errbuf_t *eb) {
  (void)device, (void)eb;
  *out = NULL;
  return MS_OK;
}
uint64_t ms__run_cache_devices(void) { return 0; }
