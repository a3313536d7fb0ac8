/* SPDX-License-Identifier: MIT
 * memsnap CUDA sample 2 (issue #6): an out-of-memory capture on a real GPU.
 *
 *   cuda_oom [--chunk-mb 1024] [--out snapshots]
 *
 * Allocates chunks (and writes each one) until the device refuses. memsnap's ready-made OOM
 * observer (ms_oom_snapshot_install) writes OUT/oom-<pid>-dev<d>-<n>.msgpack at the failure, with
 * the `oom` trace entry and the stacks of every live block. The program then recovers the way a
 * training job does: it drops half of what it holds, returns the cached memory to the device
 * with empty_cache, and carries on with smaller requests. A last snapshot, OUT/oom-after.msgpack,
 * shows the state after recovery.
 */
#include <stdio.h>
#include <stdlib.h>

#include "common.h"
#include "kernels.h"

#define MAX_CHUNKS 4096

/* One chunk of "activations": allocated, then written by a kernel. A function of its own so that
 * the snapshot's stacks name it. */
int grab_chunk(ms_allocator_t *a, size_t bytes, cudaStream_t s, ms_devptr_t *out) {
  int r = ms_allocator_malloc(a, bytes, (ms_stream_t)(uintptr_t)s, out);
  if (r == MS_OK)
    SAMPLE_CK(ms_sample_fill((float *)*out, bytes / sizeof(float), 1.0f, 0.0f, s));
  return r;
}

int main(int argc, char **argv) {
  long chunk_mb = 1024;
  const char *out = "snapshots";
  const sample_opt_t opts[] = {
      {"chunk-mb", "size of each allocation in MiB (default 1024)", &chunk_mb, NULL},
      {"out", "directory for the snapshot files (default snapshots)", NULL, &out},
  };
  sample_parse(argc, argv, "Allocate until the GPU is full; the OOM observer writes a snapshot.",
               opts, sizeof opts / sizeof opts[0]);
  if (chunk_mb <= 0) chunk_mb = 1;
  ms_backend_t *backend;
  ms_allocator_t *a;
  sample_open(sample_prog, &backend, &a);
  sample_record_history(a);
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/oom-%%p-dev%%d-%%n.msgpack", out);
  sample_write_snapshot(a, out, "oom-before.msgpack"); /* also creates the directory */
  SAMPLE_MS(ms_oom_snapshot_install(a, pattern));

  cudaStream_t s;
  SAMPLE_CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  static ms_devptr_t chunks[MAX_CHUNKS];
  size_t n = 0, bytes = (size_t)chunk_mb << 20;
  int r = MS_OK;
  while (n < MAX_CHUNKS && (r = grab_chunk(a, bytes, s, &chunks[n])) == MS_OK) n++;
  if (r != MS_EOOM) {
    fprintf(stderr, "%s: error: the device never ran out (%zu chunks): %s\n", sample_prog, n,
            ms_strerror(r));
    return 1;
  }
  char msg[2048];
  ms_allocator_last_oom_message(a, msg, sizeof msg);
  printf("out of memory after %zu chunks of %ld MiB:\n  %s\n", n, chunk_mb, msg);

  /* Recover: drop every second chunk, give the cache back to the device, continue smaller. */
  size_t kept = 0;
  for (size_t i = 0; i < n; i++) {
    if (i % 2)
      SAMPLE_MS(ms_allocator_free(a, chunks[i]));
    else
      chunks[kept++] = chunks[i];
  }
  SAMPLE_CK(cudaStreamSynchronize(s));
  SAMPLE_MS(ms_allocator_empty_cache(a));
  size_t again = 0;
  for (; again < 4 && kept < MAX_CHUNKS; again++) {
    r = grab_chunk(a, bytes / 2, s, &chunks[kept]);
    if (r != MS_OK) break;
    kept++;
  }
  SAMPLE_CK(cudaStreamSynchronize(s));
  printf("recovered: %zu more chunks of %ld MiB after empty_cache\n", again, chunk_mb / 2);
  sample_write_snapshot(a, out, "oom-after.msgpack");
  for (size_t i = 0; i < kept; i++) SAMPLE_MS(ms_allocator_free(a, chunks[i]));
  SAMPLE_CK(cudaStreamDestroy(s));
  ms_allocator_destroy(a);
  ms_backend_destroy(backend);
  if (again == 0) {
    fprintf(stderr, "%s: error: no allocation succeeded after empty_cache\n", sample_prog);
    return 1;
  }
  return 0;
}
