/* SPDX-License-Identifier: MIT
 * memsnap core: the public calls of the caching allocator that are not malloc or free: emptying the
 * cache, statistics, the memory fraction, the largest free block, OOM observers and free-memory
 * callbacks, the last OOM message (docs/pytorch-allocator.md, "The OOM path and releases").
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

/* ---- other public calls ---------------------------------------------------------------------- */

int ms_allocator_empty_cache(ms_allocator_t *a) {
  MS_RETURN_IF(!a, MS_EINVAL);
  uint32_t ctx = alloc_gather(a, MS__CTX_ALL);
  pthread_mutex_lock(&a->mu);
  int r = ms__alloc_release_cached_blocks(a, ctx, NULL);
  ms__alloc_debug_check(a);
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_empty_pool_cache(ms_allocator_t *a, ms_pool_id_t id) {
  MS_RETURN_IF(!a, MS_EINVAL);
  uint32_t ctx = alloc_gather(a, MS__CTX_ALL);
  pthread_mutex_lock(&a->mu);
  int r = id.first == 0 && id.second == 0 ? ms__alloc_release_cached_blocks(a, ctx, NULL)
                                          : ms__alloc_release_cached_blocks(a, ctx, &id);
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_get_stats(ms_allocator_t *a, ms_stats_t *out) {
  MS_RETURN_IF(!a, MS_EINVAL);
  MS_FORWARD_IF_ERROR(ms_stats_check(out));
  pthread_mutex_lock(&a->mu);
  *out = a->stats;
  pthread_mutex_unlock(&a->mu);
  return MS_OK;
}

void ms_allocator_reset_peak(ms_allocator_t *a) {
  pthread_mutex_lock(&a->mu);
  ms_stats_reset_peak(&a->stats);
  pthread_mutex_unlock(&a->mu);
}

void ms_allocator_reset_accumulated(ms_allocator_t *a) {
  pthread_mutex_lock(&a->mu);
  ms_stats_reset_accumulated(&a->stats);
  pthread_mutex_unlock(&a->mu);
}

int ms_allocator_memory_summary(ms_allocator_t *a, bool abbreviated, char **out) {
  ms_stats_t st = MS_STATS_INIT;
  MS_FORWARD_IF_ERROR(ms_allocator_get_stats(a, &st));
  return ms_stats_memory_summary(&st, a->device, abbreviated, out);
}

int ms_allocator_device(const ms_allocator_t *a) {
  return a->device;
}

void ms_allocator_get_config(ms_allocator_t *a, ms_alloc_config_t *out) {
  pthread_mutex_lock(&a->mu);
  *out = a->cfg;
  pthread_mutex_unlock(&a->mu);
}

/* setMemoryFraction; pre: lock held. */
int ms__alloc_set_fraction_locked(ms_allocator_t *a, double f, ms_errbuf_t *eb) {
  if (!(f >= 0.0 && f <= 1.0))
    return ms__errbuf_set(eb, MS_EINVAL, "invalid fraction:%g. Please set within [0, 1].", f);
  if (f < 1.0) {
    a->has_allowed_max = true;
    a->allowed_memory_maximum = (size_t)(f * (double)a->device_total);
  } else {
    a->has_allowed_max = false;
    a->allowed_memory_maximum = 0;
  }
  return MS_OK;
}

int ms_allocator_set_memory_fraction(ms_allocator_t *a, double fraction, ms_errbuf_t *eb) {
  MS_RETURN_IF(!a, MS_EINVAL);
  if (eb) eb->msg[0] = 0;
  pthread_mutex_lock(&a->mu);
  int r = ms__alloc_set_fraction_locked(a, fraction, eb);
  pthread_mutex_unlock(&a->mu);
  return r;
}

size_t ms_allocator_largest_free_block(ms_allocator_t *a) {
  pthread_mutex_lock(&a->mu);
  size_t best = 0;
  const ms__pool_t *pools[2] = {&a->large, &a->small};
  for (int i = 0; i < 2; i++)
    for (const ms__block_t *b = ms__pool_first(pools[i]); b; b = ms__pool_next(b))
      if (b->size > best) best = b->size;
  for (const ms__private_pool_t *pp = a->pools; pp; pp = pp->next) {
    for (const ms__block_t *b = ms__pool_first(&pp->large); b; b = ms__pool_next(b))
      if (b->size > best) best = b->size;
    for (const ms__block_t *b = ms__pool_first(&pp->small); b; b = ms__pool_next(b))
      if (b->size > best) best = b->size;
  }
  pthread_mutex_unlock(&a->mu);
  if (best == 0) {
    /* Nothing cached: PyTorch's cacheInfo then reports the device's free memory
     * (cudaMemGetInfo) as the largest block one could get. */
    size_t dfree = 0, dtotal = 0;
    if (a->ops.mem_info(a->ops.ctx, a->device, &dfree, &dtotal) == MS_OK) best = dfree;
  }
  return best;
}

int ms_allocator_attach_oom_observer(ms_allocator_t *a, ms_oom_observer_fn *fn, void *arg) {
  MS_RETURN_IF(!a || !fn, MS_EINVAL);
  pthread_mutex_lock(&a->mu);
  int r = MS_VEC_PUSH(&a->observers, ((ms__observer_t){fn, arg})) == 0 ? MS_OK : MS_ENOMEM;
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_add_free_memory_callback(ms_allocator_t *a, ms_free_memory_fn *fn, void *arg) {
  MS_RETURN_IF(!a || !fn, MS_EINVAL);
  pthread_mutex_lock(&a->mu);
  int r = MS_VEC_PUSH(&a->free_callbacks, ((ms__freecb_t){fn, arg})) == 0 ? MS_OK : MS_ENOMEM;
  pthread_mutex_unlock(&a->mu);
  return r;
}

size_t ms_allocator_last_oom_message(ms_allocator_t *a, char *dst, size_t cap) {
  pthread_mutex_lock(&a->mu);
  size_t n = a->oom_len;
  if (cap) {
    size_t k = n < cap - 1 ? n : cap - 1;
    memcpy(dst, a->oom_msg, k);
    dst[k] = 0;
  }
  pthread_mutex_unlock(&a->mu);
  return n;
}
