/* SPDX-License-Identifier: MIT
 * memsnap core: backend selection by name and validation of ops tables.
 *
 * Backends are chosen by name: "sim" is always available; "cuda" exists only when the library
 * was built with the CUDA Toolkit (MS_HAVE_CUDA), where lib/backend/cuda.c defines
 * ms_backend_cuda_create. Without it, asking for "cuda" is a clear MS_EUNSUPPORTED error.
 */
#include <stdlib.h>
#include <string.h>

#include "backend/backend_internal.h"
#include "common/internal.h"

int ms_backend_create(const ms_backend_ops_t *ops, ms_backend_t **out) {
  MS_RETURN_IF(!ops || !out, MS_EINVAL);
  MS_RETURN_IF(!ops->name || !ops->device_count || !ops->malloc || !ops->free || !ops->mem_info ||
                   !ops->stream_create || !ops->stream_destroy || !ops->event_create ||
                   !ops->event_record || !ops->event_query || !ops->event_synchronize ||
                   !ops->event_destroy || !ops->device_synchronize,
               MS_EINVAL);
  /* The virtual-memory operations come as a set: all four or none. */
  int nva = !!ops->va_reserve + !!ops->va_release + !!ops->mem_map + !!ops->mem_unmap;
  MS_RETURN_IF(nva != 0 && nva != 4, MS_EINVAL);
  ms_backend_t *b = calloc(1, sizeof *b);
  MS_RETURN_IF(!b, MS_ENOMEM);
  b->ops = *ops;
  *out = b;
  return MS_OK;
}

void ms_backend_destroy(ms_backend_t *b) {
  if (!b) return;
  if (b->ops.destroy) b->ops.destroy(b->ops.ctx);
  free(b);
}

const ms_backend_ops_t *ms_backend_ops(const ms_backend_t *b) { return &b->ops; }

const char *ms_backend_name(const ms_backend_t *b) { return b->ops.name; }

#ifndef MS_HAVE_CUDA
int ms_backend_cuda_create(ms_backend_t **out, ms_errbuf_t *eb) {
  (void)out;
  return ms__errbuf_set(eb, MS_EUNSUPPORTED,
                        "backend 'cuda' is not available: memsnap was built without the CUDA "
                        "Toolkit (reconfigure with -DMEMSNAP_WITH_CUDA=ON)");
}
#endif

int ms_backend_open(const char *name, ms_backend_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!out, MS_EINVAL);
  if (!name) return ms__errbuf_set(eb, MS_EINVAL, "no backend name given");
  if (strcmp(name, "sim") == 0) {
    int r = ms_backend_sim_create(NULL, out);
    if (r != MS_OK) ms__errbuf_set(eb, r, "cannot create the sim backend: %s", ms_strerror(r));
    return r;
  }
  if (strcmp(name, "cuda") == 0) return ms_backend_cuda_create(out, eb);
  return ms__errbuf_set(eb, MS_ENOTFOUND, "unknown backend '%s' (known: sim, cuda)", name);
}
