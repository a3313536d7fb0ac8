/* SPDX-License-Identifier: MIT
 * memsnap core: what the files of `memsnap replay` share (include/memsnap/replay.h). device.c: the
 * recorded device, check mode's backend; start_state.c: the recorded run's settings, whether a
 * device's trace can be replayed, and the allocator state when the trace began; replay.c: the
 * replay of one device; entry.c: the public entry points, one device prepared for many what-if
 * runs among them.
 */
#ifndef MEMSNAP_LIB_REPLAY_INTERNAL_H
#define MEMSNAP_LIB_REPLAY_INTERNAL_H

#include <inttypes.h>
#include <stdbool.h>
#include <stdlib.h>

#include "alloc/alloc_internal.h"
#include "common/hash.h"
#include "common/internal.h"
#include "common/vec.h"
#include "memsnap/allocator.h"
#include "memsnap/config.h"
#include "memsnap/history.h"
#include "memsnap/replay.h"
#include "memsnap/stats.h"

#define RP_PAGE ((uint64_t)2 << 20)
/* Synthetic addresses (segments the trace did not record) live far above any real one (GPU
 * virtual addresses stay below 2^57); the 15 * 2^60 bytes above hold millions of unlimited
 * expandable reservations (each 9/8 of the device's total, 4.5 TiB when unknown). */
#define RP_SYNTH_BASE ((uint64_t)1 << 60)
/* Total memory the recorded device reports when no capacity is given: 4 TiB, 14x the largest
 * GPU's memory today, and small enough that a trace asking for absurd sizes in an
 * expandable-segments what-if maps its 9/8 reservation (one handle per page, as PyTorch) in
 * 236 K large pages, not the 59 M of 1 PiB (2.95 s, 40 s in the fuzz build, for one request). */
#define RP_UNLIMITED ((size_t)1 << 42)
#define RP_MIN_CAP_BOUND ((size_t)1 << 40)

/* ---- address map: recorded address -> value (open addressing, backward-shift delete) ----------
 */

typedef struct rp_map_s {
  uint64_t *k, *v;
  size_t cap, len;
} rp_map_t;

static inline size_t rp_slot(const rp_map_t *m, uint64_t k) {
  return (size_t)ms_hash_u64(k) & (m->cap - 1);
}

static inline int rp_map_grow(rp_map_t *m) {
  size_t ncap = m->cap ? m->cap * 2 : 256;
  uint64_t *nk = calloc(ncap, sizeof *nk), *nv = malloc(ncap * sizeof *nv);
  if (!nk || !nv) {
    free(nk);
    free(nv);
    return MS_ENOMEM;
  }
  rp_map_t n = {nk, nv, ncap, 0};
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->k[i]) continue;
    size_t j = rp_slot(&n, m->k[i]);
    while (n.k[j])
      j = (j + 1) & (ncap - 1);
    n.k[j] = m->k[i];
    n.v[j] = m->v[i];
    n.len++;
  }
  free(m->k);
  free(m->v);
  *m = n;
  return MS_OK;
}

/* Inserts or overwrites; key != 0. */
static inline int rp_map_put(rp_map_t *m, uint64_t k, uint64_t v) {
  if ((m->len + 1) * 2 > m->cap) MS_FORWARD_IF_ERROR(rp_map_grow(m));
  size_t j = rp_slot(m, k);
  while (m->k[j] && m->k[j] != k)
    j = (j + 1) & (m->cap - 1);
  if (!m->k[j]) m->len++;
  m->k[j] = k;
  m->v[j] = v;
  return MS_OK;
}

static inline bool rp_map_find(const rp_map_t *m, uint64_t k, size_t *slot) {
  if (!m->cap || !k) return false;
  for (size_t j = rp_slot(m, k); m->k[j]; j = (j + 1) & (m->cap - 1)) {
    if (m->k[j] == k) {
      *slot = j;
      return true;
    }
  }
  return false;
}

static inline bool rp_map_has(const rp_map_t *m, uint64_t k) {
  size_t j;
  return rp_map_find(m, k, &j);
}

/* Removes k; *v = its value. @return whether it was there. */
static inline bool rp_map_take(rp_map_t *m, uint64_t k, uint64_t *v) {
  size_t i;
  if (!rp_map_find(m, k, &i)) return false;
  *v = m->v[i];
  size_t mask = m->cap - 1;
  for (;;) {
    m->k[i] = 0;
    size_t k2 = i;
    for (;;) {
      k2 = (k2 + 1) & mask;
      if (!m->k[k2]) {
        m->len--;
        return true;
      }
      size_t home = rp_slot(m, m->k[k2]);
      bool stays = i <= k2 ? (home > i && home <= k2) : (home > i || home <= k2);
      if (!stays) {
        m->k[i] = m->k[k2];
        m->v[i] = m->v[k2];
        i = k2;
        break;
      }
    }
  }
}

static inline void rp_map_free(rp_map_t *m) {
  free(m->k);
  free(m->v);
  memset(m, 0, sizeof *m);
}

/* ---- the recorded device (device.c) ------------------------------------------------------- */

enum { RDEV_FAIL_NONE = 0, RDEV_FAIL_UNTIL_FREES, RDEV_FAIL_ALL };

typedef struct rdev_range_s {
  uint64_t addr, size;
  bool va;
} rdev_range_t;

typedef struct rdev_expect_s {
  uint64_t addr, size;
} rdev_expect_t;

typedef struct rdev_s {
  size_t capacity; /* 0 = unlimited */
  size_t total;    /* the total reported by mem_info (sizes expandable reservations) */
  size_t used;
  MS_VEC(rdev_range_t) ranges;
  /* expectations of the operation being replayed */
  MS_VEC(rdev_expect_t) expect; /* recorded segment_alloc entries, in order */
  size_t expect_pos;
  MS_VEC(uint64_t) va_bases; /* recorded bases of new expandable ranges, in order */
  size_t va_pos;
  int fail;
  size_t fail_frees, frees_done;
  uint64_t synth;
  uint64_t next_handle;
  /* Check mode: refuse (out of memory) until the allocator has synchronized its events, as the
   * recorded device did until the OOM path reached release_cached_blocks. */
  bool need_sync, synced;
  int ndevices;         /* the replayed device's number + 1 (messages name the recorded GPU) */
  /* Events are real: a record_stream-deferred free completes when the replay reaches its
   * free_completed (the program's work on that stream is done), or when the allocator
   * synchronizes (its OOM path, empty_cache). An allocator reuses its events: each record starts
   * a new generation, so that completing an old one cannot complete a later use. */
  rp_map_t done;        /* event handle -> 1: complete */
  rp_map_t gen;         /* event handle -> generation of its last record */
  uint64_t last_event;  /* the event last recorded, and that record's generation */
  uint64_t last_gen;
} rdev_t;

int ms__rp_dev_add(rdev_t *d, uint64_t addr, uint64_t size, bool va);
int ms__rp_dev_create(size_t capacity, size_t total, ms_backend_t **out, rdev_t **dev);

/* ---- one device's trace and its start state (start_state.c) ------------------------------- */

typedef struct rp_sblock_s {
  uint64_t addr;
  uint64_t size; /* 0 = to infer */
  uint64_t requested;
  int state; /* 1 allocated, 2 pending */
  bool ambiguous;
  int64_t free_entry; /* entry of its free in the trace (inferred ones), else -1 */
} rp_sblock_t;

typedef struct rp_sseg_s {
  uint64_t addr, size, stream;
  bool is_small;
  int64_t snap_index; /* its segment in the snapshot, -1 if re-created from a segment_free */
  MS_VEC(rp_sblock_t) blocks;
} rp_sseg_t;

typedef struct rp_trace_s {
  const ms_snapshot_t *snap;
  const ms_snap_trace_t *t; /* the device's entries */
  size_t n;
  size_t first; /* entry index of t[0] */
  int device;
  ms_alloc_config_t cfg;
  MS_VEC(rp_sseg_t) segs; /* start segments, sorted by address */
  size_t inferred, ambiguous, start_blocks;
  /* The recorded device's total memory when the snapshot says (memsnap's do): expandable
   * reservations are sized from it, and best fit among expandable blocks sees their size. */
  uint64_t device_total;
  /* Per entry starting a release burst: 1 = empty_cache, 2 = the OOM path, 0 = unknown. The
   * check replay classifies them; what-if replays reuse its answers. */
  uint8_t *burst_kind;
  /* Per free_completed entry: where the recorded run completed it (RP_FC_*, 0 = unknown). The
   * check replay classifies them; what-if replays reuse its answers. */
  uint8_t *fc_kind;
  /* What-if: start from a fresh allocator (ms_replay_options_t.fresh_start): the start state's
   * live blocks are allocated anew, in address order, instead of placed in their recorded
   * segments, so no cached free memory of the recorded pool's history carries over. */
  bool fresh_start;
} rp_trace_t;

/* A free_completed emitted by process_events at the start of a malloc, by a free, or otherwise
 * before the next operation: the event completes when the replay reaches it. */
#define RP_FC_NOW 1
/* Emitted by the synchronization of the next malloc's OOM path (release_cached_blocks) or of an
 * empty_cache: the event stays pending for that operation, whose allocator completes it when it
 * synchronizes; completed after the operation if it did not. */
#define RP_FC_SYNC 2
/* The same, where the trace proves that the recorded device refused until the synchronization
 * (the check's recorded device then refuses as long). */
#define RP_FC_SYNC_FORCED 3

static inline bool rp_is_device_seg(const ms_snap_segment_t *sg, int device) {
  return sg->device == device;
}

void ms__rp_config_of(const ms_snapshot_t *s, ms_alloc_config_t *c);
int ms__rp_rebuild_start(rp_trace_t *tr, char *why, size_t cap);
bool ms__rp_replayable(const rp_trace_t *tr, char *why, size_t cap);
rp_sseg_t *ms__rp_seg_of(rp_trace_t *tr, uint64_t addr);
void ms__rp_trace_release(rp_trace_t *tr);

/* ---- the replay of one device (replay.c) ---------------------------------------------------- */

/* Replays tr: check mode (whatif false: the recorded settings, every decision compared, bursts
 * and free_completed entries classified for later what-if runs) or what-if under cfg; capacity 0
 * is unlimited. fit_only (what-if): the run only answers whether it fits, and its first OOM ends
 * it (use then holds the figures up to there, with ooms >= 1). Fills res (verdict, mismatch) and
 * use (the figures). */
int ms__rp_run_device(rp_trace_t *tr, bool whatif, const ms_alloc_config_t *cfg, size_t capacity,
                      bool fit_only, ms_replay_device_t *res, ms_replay_usage_t *use);
/* The same; *held (when not NULL): the most allocated at any moment of the run, counting the
 * request of an oom entry that a what-if served (and released at once), which peak_allocated
 * leaves out. A run without an OOM serves every request the unlimited run serves, so the unlimited
 * run's figure bounds the capacity of any run that fits from below. */
int ms__rp_run_device_ex(rp_trace_t *tr, bool whatif, const ms_alloc_config_t *cfg,
                         size_t capacity, bool fit_only, ms_replay_device_t *res,
                         ms_replay_usage_t *use, uint64_t *held);

#endif /* MEMSNAP_LIB_REPLAY_INTERNAL_H */
