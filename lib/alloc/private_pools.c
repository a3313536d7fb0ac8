/* SPDX-License-Identifier: MIT
 * memsnap core: private pools (docs/pytorch-allocator.md, "Private pools and CUDA graphs"):
 * CUDA-graph pools and MemPools, their options, routing allocations to them, and releasing them.
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

/* ---- private pools ("Private pools and CUDA graphs") ----------------------------------------- */

ms_pool_id_t ms_pool_id_new(bool is_graph) {
  static _Atomic int64_t graph_uid = 1, pool_uid = 1;
  if (is_graph) return (ms_pool_id_t){atomic_fetch_add(&graph_uid, 1), 0};
  return (ms_pool_id_t){0, atomic_fetch_add(&pool_uid, 1)};
}

static bool pool_id_less(ms_pool_id_t x, ms_pool_id_t y) {
  return x.first < y.first || (x.first == y.first && x.second < y.second);
}

static ms__pool_opts_t *find_pool_opts(ms_allocator_t *a, ms_pool_id_t id) {
  for (size_t i = 0; i < a->pool_opts.len; i++)
    if (a->pool_opts.ptr[i].id.first == id.first && a->pool_opts.ptr[i].id.second == id.second)
      return &a->pool_opts.ptr[i];
  return NULL;
}

int ms_allocator_set_pool_options(ms_allocator_t *a, ms_pool_id_t id,
                                  const ms_pool_options_t *opts) {
  MS_RETURN_IF(!a || !opts || (id.first == 0 && id.second == 0), MS_EINVAL);
  pthread_mutex_lock(&a->mu);
  int r = MS_OK;
  ms__pool_opts_t *o = find_pool_opts(a, id);
  if (!opts->use_on_oom && !opts->no_split) {
    if (o) { /* all false: forget the id */
      size_t i = (size_t)(o - a->pool_opts.ptr);
      memmove(o, o + 1, (a->pool_opts.len - i - 1) * sizeof *o);
      a->pool_opts.len--;
    }
  } else if (o) {
    o->opts = *opts;
  } else if (MS_VEC_PUSH(&a->pool_opts, ((ms__pool_opts_t){id, *opts})) != 0) {
    r = MS_ENOMEM;
  } else { /* keep increasing id order (PyTorch's ordered sets) */
    for (size_t i = a->pool_opts.len - 1; i > 0 && pool_id_less(id, a->pool_opts.ptr[i - 1].id);
         i--) {
      ms__pool_opts_t t = a->pool_opts.ptr[i - 1];
      a->pool_opts.ptr[i - 1] = a->pool_opts.ptr[i];
      a->pool_opts.ptr[i] = t;
    }
  }
  ms__private_pool_t *pp = r == MS_OK ? find_private_pool(a, id) : NULL;
  if (pp) pp->no_split = opts->no_split;
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_begin_allocate_to_pool(ms_allocator_t *a, ms_pool_id_t id,
                                        ms_pool_filter_fn *filter, void *arg) {
  MS_RETURN_IF(!a || (id.first == 0 && id.second == 0), MS_EINVAL);
  pthread_mutex_lock(&a->mu);
  int r = MS_OK;
  for (size_t i = 0; i < a->captures.len; i++)
    if (a->captures.ptr[i].id.first == id.first && a->captures.ptr[i].id.second == id.second)
      r = MS_ESTATE; /* "beginAllocateToPool: already recording to mempool_id" */
  ms__private_pool_t *pp = r == MS_OK ? find_private_pool(a, id) : NULL;
  if (r == MS_OK && pp && pp->freeable) r = MS_ESTATE; /* released: PyTorch asserts use_count>0 */
  bool created = false;
  if (r == MS_OK && !pp) {
    pp = calloc(1, sizeof *pp);
    if (!pp) {
      r = MS_ENOMEM;
    } else {
      pp->id = id;
      const ms__pool_opts_t *o = find_pool_opts(a, id);
      pp->no_split = o && o->opts.no_split;
      ms__pool_init(&pp->large, false, pp);
      ms__pool_init(&pp->small, true, pp);
      created = true;
    }
  }
  if (r == MS_OK && MS_VEC_PUSH(&a->captures, ((ms__capture_t){id, filter, arg})) != 0) {
    r = MS_ENOMEM;
    if (created) free(pp);
  }
  if (r == MS_OK) {
    if (created) {
      pp->use_count = 1;
      pp->next = a->pools;
      a->pools = pp;
    } else {
      pp->use_count++;
    }
  }
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_end_allocate_to_pool(ms_allocator_t *a, ms_pool_id_t id) {
  MS_RETURN_IF(!a, MS_EINVAL);
  pthread_mutex_lock(&a->mu);
  int r = MS_ESTATE; /* "endAllocatePool: not currently recording to mempool_id" */
  for (size_t i = 0; i < a->captures.len; i++) {
    if (a->captures.ptr[i].id.first == id.first && a->captures.ptr[i].id.second == id.second) {
      memmove(&a->captures.ptr[i], &a->captures.ptr[i + 1],
              (a->captures.len - i - 1) * sizeof *a->captures.ptr);
      a->captures.len--;
      r = MS_OK;
      break;
    }
  }
  pthread_mutex_unlock(&a->mu);
  return r;
}

int ms_allocator_release_pool(ms_allocator_t *a, ms_pool_id_t id) {
  MS_RETURN_IF(!a, MS_EINVAL);
  pthread_mutex_lock(&a->mu);
  ms__private_pool_t *pp = find_private_pool(a, id);
  int r = pp && !pp->freeable ? MS_OK : MS_ENOTFOUND;
  if (r == MS_OK && --pp->use_count == 0) pp->freeable = true;
  pthread_mutex_unlock(&a->mu);
  return r;
}
