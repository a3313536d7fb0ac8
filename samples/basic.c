/* SPDX-License-Identifier: MIT
 * memsnap sample: the smallest complete program. Creates a caching allocator on a device backend
 * ("sim" by default, or the one named on the command line, e.g. "cuda"), allocates and frees a few
 * blocks, and prints the statistics PyTorch users know.
 *
 *   basic [BACKEND]
 *
 * Settings come from MEMSNAP_ALLOC_CONF (PYTORCH_CUDA_ALLOC_CONF's syntax and keys), e.g.
 *   MEMSNAP_ALLOC_CONF=max_split_size_mb:64 ./basic
 */
#include <stdio.h>

#include "memsnap/allocator.h"
#include "memsnap/backend.h"

int main(int argc, char **argv) {
  const char *name = argc > 1 ? argv[1] : "sim";
  ms_errbuf_t eb;
  ms_backend_t *backend = NULL;
  if (ms_backend_open(name, &backend, &eb) != MS_OK) {
    fprintf(stderr, "basic: error: %s\n", eb.msg);
    return 1;
  }
  /* alloc == NULL: PyTorch's defaults with MEMSNAP_ALLOC_CONF applied */
  ms_allocator_config_t cfg = {.backend = backend, .device = 0, .alloc = NULL};
  ms_allocator_t *alloc = NULL;
  if (ms_allocator_create(&cfg, &alloc, &eb) != MS_OK) {
    fprintf(stderr, "basic: error: %s\n", eb.msg);
    ms_backend_destroy(backend);
    return 1;
  }

  ms_devptr_t small = 0, large = 0;
  int r = ms_allocator_malloc(alloc, 1000, 0, &small); /* 512-byte rounding, 2 MiB segment */
  if (r == MS_OK) r = ms_allocator_malloc(alloc, 5 << 20, 0, &large); /* 20 MiB segment */
  if (r != MS_OK) {
    char msg[1024];
    ms_allocator_last_oom_message(alloc, msg, sizeof msg);
    fprintf(stderr, "basic: error: %s\n", r == MS_EOOM ? msg : ms_strerror(r));
    ms_allocator_destroy(alloc);
    ms_backend_destroy(backend);
    return 1;
  }
  printf("small block at %#lx, large block at %#lx\n", (unsigned long)small, (unsigned long)large);
  ms_allocator_free(alloc, small);
  ms_devptr_t again = 0;
  if (ms_allocator_malloc(alloc, 800, 0, &again) == MS_OK) /* a cache hit: same address */
    printf("reallocated %s\n", again == small ? "from the cache, same address" : "elsewhere");

  ms_stats_t st = MS_STATS_INIT;
  ms_allocator_get_stats(alloc, &st);
  printf("allocated %lld bytes in %lld blocks, reserved %lld bytes in %lld segments\n",
         (long long)st.allocated_bytes[MS_STAT_ALL].current,
         (long long)st.allocation[MS_STAT_ALL].current,
         (long long)st.reserved_bytes[MS_STAT_ALL].current,
         (long long)st.segment[MS_STAT_ALL].current);
  char *summary = NULL;
  if (ms_allocator_memory_summary(alloc, true, &summary) == MS_OK) fputs(summary, stdout);
  ms_stats_text_free(summary);

  ms_allocator_free(alloc, again);
  ms_allocator_free(alloc, large);
  ms_allocator_destroy(alloc); /* returns the cached segments to the device */
  ms_backend_destroy(backend);
  return 0;
}
