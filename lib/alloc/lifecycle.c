/* SPDX-License-Identifier: MIT
 * memsnap core: creating and destroying an allocator (configuration, backend, pools), and the
 * hooks table history installs (alloc_internal.h).
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "alloc/alloc_core.h"
#include "alloc/alloc_internal.h"
#include "alloc/stats_internal.h"
#include "alloc/types.h"
#include "backend/backend_internal.h"

/* ---- create / destroy ------------------------------------------------------------------------ */

/* Whether the environment variable name is set to 1, true, yes or on (any case). */
static bool env_truthy(const char *name) {
  const char *v = getenv(name);
  if (!v) return false;
  static const char *const yes[] = {"1", "true", "yes", "on"};
  for (size_t i = 0; i < sizeof yes / sizeof *yes; i++)
    if (strcasecmp(v, yes[i]) == 0) return true;
  return false;
}

int ms_allocator_create(const ms_allocator_config_t *cfg, ms_allocator_t **out, ms_errbuf_t *eb) {
  if (eb) eb->msg[0] = 0;
  MS_RETURN_IF(!out, MS_EINVAL);
  if (!cfg || !cfg->backend) return ms__errbuf_set(eb, MS_EINVAL, "no device backend given");
  const ms_backend_ops_t *ops = ms_backend_ops(cfg->backend);
  int ndev = 0;
  int r = ops->device_count(ops->ctx, &ndev);
  if (r != MS_OK) return ms__errbuf_set(eb, r, "backend '%s': cannot count devices", ops->name);
  if (cfg->device < 0 || cfg->device >= ndev)
    return ms__errbuf_set(eb, MS_ENODEVICE, "backend '%s' has no device %d (it has %d)", ops->name,
                          cfg->device, ndev);
  ms_alloc_config_t conf;
  if (cfg->alloc) {
    conf = *cfg->alloc;
    MS_FORWARD_IF_ERROR(ms_alloc_config_validate(&conf, eb));
  } else {
    ms_alloc_config_init(&conf);
    MS_FORWARD_IF_ERROR(ms_alloc_config_from_env(&conf, eb));
  }
  size_t dfree = 0, dtotal = 0;
  r = ops->mem_info(ops->ctx, cfg->device, &dfree, &dtotal);
  if (r != MS_OK)
    return ms__errbuf_set(eb, r, "backend '%s': cannot query device %d", ops->name, cfg->device);
  ms_allocator_t *a = calloc(1, sizeof *a);
  if (!a) return ms__errbuf_set(eb, MS_ENOMEM, "out of host memory");
  pthread_mutex_init(&a->mu, NULL);
  a->backend = cfg->backend;
  a->ops = *ops;
  a->device = cfg->device;
  a->device_total = dtotal;
  a->cfg = conf;
  if (a->cfg.expandable_segments && !ms__es_supported(a)) {
    ms__warning("expandable_segments not supported on this platform");
    a->cfg.expandable_segments = false;
  }
  if (a->cfg.expandable_segments) {
    /* Pages (2 MiB small, large_segment_size large) must be whole multiples of the device's
     * granularity: refused here rather than failing at the first map. A backend without
     * mem_granularity maps multiples of 2 MiB (memsnap/backend.h): large_segment_size_mb:31 is
     * refused there too (every large malloc failed with "invalid argument"; fuzz_alloc_conf). */
    size_t gran = (size_t)2 << 20;
    r = ops->mem_granularity ? ops->mem_granularity(ops->ctx, cfg->device, &gran) : MS_OK;
    if (r == MS_OK && gran && (MS_SMALL_BUFFER % gran || a->cfg.large_segment_size % gran))
      r = ms__errbuf_set(eb, MS_ECONFIG,
                         "expandable_segments: the page sizes (%zu and large_segment_size %zu "
                         "bytes) must be multiples of device %d's allocation granularity "
                         "(%zu bytes)",
                         (size_t)MS_SMALL_BUFFER, a->cfg.large_segment_size, cfg->device, gran);
    else if (r != MS_OK)
      r = ms__errbuf_set(eb, r, "backend '%s': cannot query device %d's granularity", ops->name,
                         cfg->device);
    if (r != MS_OK) {
      pthread_mutex_destroy(&a->mu);
      free(a);
      return r;
    }
  }
  for (int i = 0; i < MS_ROUNDUP_POWER2_INTERVALS; i++)
    if (a->cfg.roundup_power2_divisions[i] > 1) a->any_divisions = true;
  a->has_gc = a->cfg.garbage_collection_threshold > 0.0;
  /* The environment counts where MEMSNAP_ALLOC_CONF does (cfg->alloc NULL): replay and tests
   * that give their settings are not switched by it. */
  a->no_caching = cfg->no_caching || (!cfg->alloc && env_truthy("MEMSNAP_NO_CACHING"));
  ms__pool_init(&a->small, true, NULL);
  ms__pool_init(&a->large, false, NULL);
  ms_stats_init(&a->stats);
  a->stats.max_split_size = (int64_t)a->cfg.max_split_size; /* SIZE_MAX reads as -1 */
  a->rng = 0x853c49e6748fea9bULL;
  atomic_init(&a->hooks, NULL);
  r = ms__alloc_set_fraction_locked(a, a->cfg.per_process_memory_fraction, eb);
  if (r != MS_OK) {
    pthread_mutex_destroy(&a->mu);
    free(a);
    return r;
  }
  *out = a;
  return MS_OK;
}

static void pool_release_all(ms_allocator_t *a, ms__pool_t *pool) {
  ms__block_t *b = ms__pool_first(pool);
  while (b) {
    ms__block_t *n = ms__pool_next(b);
    if (!ms__block_is_split(b) && !b->expandable) (void)ms__alloc_release_block(a, b, 0);
    b = n;
  }
}

void ms_allocator_destroy(ms_allocator_t *a) {
  if (!a) return;
  pthread_mutex_lock(&a->mu);
  a->captures.len = 0;
  if (ms__alloc_sync_and_free_events(a, 0, NULL) != MS_OK)
    ms__warning("device %d: allocator destroyed with stream events that failed", a->device);
  pool_release_all(a, &a->large);
  pool_release_all(a, &a->small);
  for (ms__private_pool_t *pp = a->pools; pp; pp = pp->next) {
    pool_release_all(a, &pp->small);
    pool_release_all(a, &pp->large);
  }
  ms__es_destroy_all(a);
  const ms__alloc_hooks_t *hooks = alloc_hooks(a);
  atomic_store_explicit(&a->hooks, NULL, memory_order_release);
  pthread_mutex_unlock(&a->mu);
  /* The last trace entry is recorded: the recorder may go (alloc_hooks.h). */
  if (hooks && hooks->release) hooks->release(hooks->ctx);
  /* What is left holds live blocks: forget the free sets, then the segments, then the pools. */
  for (ms__private_pool_t *pp = a->pools; pp; pp = pp->next) {
    ms__pool_fini(&pp->small);
    ms__pool_fini(&pp->large);
  }
  ms__pool_fini(&a->small);
  ms__pool_fini(&a->large);
  while (a->segments)
    ms__segment_delete(a, a->segments);
  ms__private_pool_t *pp = a->pools;
  while (pp) {
    ms__private_pool_t *n = pp->next;
    free(pp);
    pp = n;
  }
  for (size_t i = 0; i < a->event_pool.len; i++)
    a->ops.event_destroy(a->ops.ctx, a->device, a->event_pool.ptr[i]);
  for (size_t i = 0; i < a->queues.len; i++)
    free(a->queues.ptr[i].q);
  /* Stream-use arrays of blocks still allocated. */
  for (size_t i = 0; i < a->map.cap; i++)
    if (a->map.slots[i]) free(a->map.slots[i]->uses);
  MS_VEC_FREE(&a->queues);
  MS_VEC_FREE(&a->event_pool);
  MS_VEC_FREE(&a->deferred);
  MS_VEC_FREE(&a->capture_uses);
  MS_VEC_FREE(&a->captures);
  MS_VEC_FREE(&a->pool_opts);
  MS_VEC_FREE(&a->observers);
  MS_VEC_FREE(&a->free_callbacks);
  free(a->map.slots);
  ms__blocks_release_all(a);
  pthread_mutex_destroy(&a->mu);
  free(a);
}

/* ---- internal API (alloc_internal.h) --------------------------------------------------------- */

void ms__allocator_set_hooks(ms_allocator_t *a, const ms__alloc_hooks_t *hooks) {
  pthread_mutex_lock(&a->mu);
  atomic_store_explicit(&a->hooks, hooks, memory_order_release);
  pthread_mutex_unlock(&a->mu);
}

const ms__alloc_hooks_t *ms__allocator_get_hooks(ms_allocator_t *a) {
  return alloc_hooks(a);
}
