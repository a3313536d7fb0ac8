/* SPDX-License-Identifier: MIT
 * memsnap core: ms_allocator_snapshot, PyTorch's torch.cuda.memory._snapshot() for memsnap's
 * allocators (docs/pytorch-allocator.md, "Snapshot fields").
 *
 * For each allocator, in device order: the allocator's walker appends its segments, blocks and
 * flat statistics to the builder and records the `snapshot` trace entry; then each device's
 * trace is copied from its recorder's ring buffer (oldest first). Stacks are symbolised last,
 * outside every allocator lock: while walking, a context id becomes a provisional index into a
 * list of distinct (recorder, context id) pairs; each distinct stack is then converted once (each
 * distinct address symbolised once, by a process-wide symbolizer that remembers its answers; one
 * address gives several frames when calls were inlined there), and the provisional indices are
 * replaced by the builder's stack indices.
 *
 * The allocator's own frames are left out of every stack: the capture already drops the
 * recorder's frames, and here the frames up to and including the innermost run of public memsnap
 * entry points (names "ms_<...>", not "ms__<...>") are dropped; what is outside them is the
 * program's. When names cannot be resolved (no libdw and no exported symbols), the allocator's
 * frames stay.
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/alloc_internal.h"
#include "history/history_internal.h"
#include "common/internal.h"
#include "common/hash.h"

/* ---- rank ---------------------------------------------------------------------------------- */

static atomic_int rank_set;       /* 0: never set (use $RANK), 1: set by ms_snapshot_set_rank */
static _Atomic int64_t rank_value; /* negative: none */

void ms_snapshot_set_rank(int64_t rank) {
  atomic_store(&rank_value, rank < 0 ? -1 : rank);
  atomic_store(&rank_set, 1);
}

/* @return the rank, or -1 when none. */
static int64_t snapshot_rank(void) {
  if (atomic_load(&rank_set)) return atomic_load(&rank_value);
  const char *s = getenv("RANK");
  if (!s || !*s) return -1;
  char *end;
  errno = 0;
  long long v = strtoll(s, &end, 10);
  if (errno || *end || v < 0) return -1;
  return (int64_t)v;
}

/* ---- the process-wide symbolizer ------------------------------------------------------------ */

static pthread_mutex_t sym_lock = PTHREAD_MUTEX_INITIALIZER;
static ms__symbolizer_t *sym_global; /* created on first use, kept (its answers stay valid) */

/* ---- a small map from 64-bit keys to uint32 values ------------------------------------------ */

typedef struct u64map_s {
  uint64_t *keys; /* key + 1; 0 = empty */
  uint32_t *vals;
  size_t cap, count;
} u64map_t;

static void u64map_free(u64map_t *m) {
  free(m->keys);
  free(m->vals);
}

/* @return a pointer to the value slot of key (inserted with *fresh = 1 if absent), NULL on
 * ENOMEM. */
static uint32_t *u64map_slot(u64map_t *m, uint64_t key, int *fresh) {
  if ((m->count + 1) * 2 > m->cap) {
    size_t ncap = m->cap ? m->cap * 2 : 256;
    uint64_t *nk = calloc(ncap, sizeof *nk);
    uint32_t *nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return NULL;
    }
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->keys[i]) continue;
      size_t j = (size_t)ms_hash_u64(m->keys[i]) & (ncap - 1);
      while (nk[j]) j = (j + 1) & (ncap - 1);
      nk[j] = m->keys[i];
      nv[j] = m->vals[i];
    }
    u64map_free(m);
    m->keys = nk;
    m->vals = nv;
    m->cap = ncap;
  }
  uint64_t k = key + 1;
  size_t mask = m->cap - 1, j = (size_t)ms_hash_u64(k) & mask;
  for (; m->keys[j]; j = (j + 1) & mask)
    if (m->keys[j] == k) {
      *fresh = 0;
      return &m->vals[j];
    }
  m->keys[j] = k;
  m->count++;
  *fresh = 1;
  return &m->vals[j];
}

/* ---- the take ------------------------------------------------------------------------------ */

typedef struct pending_s {
  uint32_t rec; /* index into take_t.recs */
  uint32_t ctx;
} pending_t;

typedef struct pcinfo_s {
  uint32_t first; /* builder frame indices in take_t.pcframes, innermost first */
  uint32_t n;
  uint32_t pub;   /* the containing function is a public memsnap entry point */
} pcinfo_t;

typedef struct take_s {
  ms__snapbuild_t b;
  ms__recorder_t **recs; /* per allocator (in device order), NULL without recording */
  MS_VEC(pending_t) pending;
  u64map_t pending_map;  /* (rec << 32 | ctx) -> provisional index */
  u64map_t pc_map;       /* pc -> index into pcinfo */
  MS_VEC(pcinfo_t) pcinfo;
  MS_VEC(uint32_t) pcframes;
} take_t;

typedef struct walk_arg_s {
  take_t *t;
  uint32_t rec;
} walk_arg_t;

static int provisional(take_t *t, uint32_t rec, uint32_t ctx, uint32_t *out) {
  if (ctx == 0 || !t->recs[rec]) {
    *out = MS_SNAP_NO_STACK;
    return MS_OK;
  }
  int fresh;
  uint32_t *v = u64map_slot(&t->pending_map, (uint64_t)rec << 32 | ctx, &fresh);
  if (!v) return MS_ENOMEM;
  if (fresh) {
    if (t->pending.len >= UINT32_MAX - 1) return MS_ELIMIT;
    pending_t p = {rec, ctx};
    if (MS_VEC_PUSH(&t->pending, p)) return MS_ENOMEM;
    *v = (uint32_t)t->pending.len - 1;
  }
  *out = *v;
  return MS_OK;
}

static int walk_ctx_to_stack(void *arg, uint32_t ctx, uint32_t *stack) {
  walk_arg_t *w = arg;
  return provisional(w->t, w->rec, ctx, stack);
}

static int is_public_entry(const char *name) {
  return name[0] == 'm' && name[1] == 's' && name[2] == '_' && name[3] != '_' && name[3] != 0;
}

/* Symbolises pc into the builder's frames (once per pc); *out = its pcinfo index.
 * pre: sym_lock held. */
static int pc_frames(take_t *t, uintptr_t pc, uint32_t *out) {
  int fresh;
  uint32_t *v = u64map_slot(&t->pc_map, pc, &fresh);
  if (!v) return MS_ENOMEM;
  if (!fresh) {
    *out = *v;
    return MS_OK;
  }
  *v = UINT32_MAX; /* the slot exists from here on: never leave it undefined */
  const ms__sym_t *syms;
  size_t n;
  MS_FORWARD_IF_ERROR(ms__symbolize(sym_global, pc, &syms, &n));
  if (t->pcinfo.len >= UINT32_MAX - 1 || t->pcframes.len > UINT32_MAX - n) return MS_ELIMIT;
  if (MS_VEC_RESERVE(&t->pcframes, n) || MS_VEC_RESERVE(&t->pcinfo, 1)) return MS_ENOMEM;
  pcinfo_t info = {(uint32_t)t->pcframes.len, (uint32_t)n,
                   (uint32_t)is_public_entry(syms[n - 1].name)};
  for (size_t i = 0; i < n; i++) {
    uint32_t idx;
    MS_FORWARD_IF_ERROR(ms__snapbuild_frame(&t->b, syms[i].name, strlen(syms[i].name),
                                            syms[i].filename, strlen(syms[i].filename),
                                            syms[i].line, &idx));
    t->pcframes.ptr[t->pcframes.len++] = idx;
  }
  t->pcinfo.ptr[t->pcinfo.len++] = info;
  *v = (uint32_t)t->pcinfo.len - 1;
  *out = *v;
  return MS_OK;
}

/* Converts every pending (recorder, ctx) into a builder stack; res[p] receives it. */
static int resolve_stacks(take_t *t, uint32_t *res) {
  int err = MS_OK;
  uint32_t info[MS__MAX_FRAMES];
  uint32_t *fr = malloc(sizeof *fr * MS__MAX_FRAMES * (MS__SYM_MAX_INLINE + 1));
  if (!fr) return MS_ENOMEM;
  pthread_mutex_lock(&sym_lock);
  if (!sym_global) err = ms__symbolizer_create(&sym_global);
  for (size_t p = 0; err == MS_OK && p < t->pending.len; p++) {
    pending_t pe = t->pending.ptr[p];
    size_t n = 0;
    const uintptr_t *pcs = ms__stacktab_get(ms__recorder_stacks(t->recs[pe.rec]), pe.ctx, &n);
    if (!pcs) {
      res[p] = MS_SNAP_NO_STACK;
      continue;
    }
    if (n > MS__MAX_FRAMES) n = MS__MAX_FRAMES;
    /* The addresses up to the end of the first run of public entry points are memsnap's own. */
    size_t drop = 0;
    int seen_public = 0;
    for (size_t i = 0; err == MS_OK && i < n; i++) {
      err = pc_frames(t, pcs[i], &info[i]);
      if (err != MS_OK) break;
      int pub = t->pcinfo.ptr[info[i]].pub != 0;
      if (pub && (!seen_public || drop == i)) drop = i + 1;
      if (pub) seen_public = 1;
    }
    if (err != MS_OK) break;
    size_t nf = 0;
    for (size_t i = drop; i < n; i++) {
      const pcinfo_t *pi = &t->pcinfo.ptr[info[i]];
      memcpy(fr + nf, t->pcframes.ptr + pi->first, pi->n * sizeof *fr);
      nf += pi->n;
    }
    err = ms__snapbuild_stack(&t->b, fr, nf, &res[p]);
  }
  pthread_mutex_unlock(&sym_lock);
  free(fr);
  return err;
}

static void remap(uint32_t *stack, const uint32_t *res) {
  if (*stack != MS_SNAP_NO_STACK) *stack = res[*stack];
}

typedef struct dev_s {
  ms_allocator_t *a;
  int device;
  ms__alloc_snapinfo_t info;
} snapdev_t;

static int cmp_dev(const void *x, const void *y) {
  const snapdev_t *a = x, *b = y;
  return (a->device > b->device) - (a->device < b->device);
}

static int add_trace(take_t *t, uint32_t rec, ms_snap_device_t *dev, ms_errbuf_t *eb) {
  ms__recorder_t *r = t->recs[rec];
  dev->first_trace = (uint32_t)t->b.trace.len;
  dev->ntrace = 0;
  dev->trace_dropped = 0;
  if (!r) return MS_OK;
  ms__trace_ent_t *ents = NULL;
  size_t n = 0;
  int err = ms__recorder_copy_trace(r, &ents, &n, &dev->trace_dropped);
  if (err != MS_OK) return ms__errbuf_set(eb, err, "cannot copy the trace: out of host memory");
  const char *names[MS_TRACE_ACTION_COUNT] = {0};
  for (size_t i = 0; i < n && err == MS_OK; i++) {
    const ms__trace_ent_t *e = &ents[i];
    ms_snap_trace_t tr;
    memset(&tr, 0, sizeof tr);
    tr.action = e->action < MS_TRACE_ACTION_COUNT ? (uint8_t)e->action : MS_TRACE_OTHER;
    if (tr.action == MS_TRACE_OTHER && !names[tr.action]) {
      const char *s = ms_trace_action_name(MS_TRACE_OTHER);
      err = ms__snapbuild_str(&t->b, s, strlen(s), &names[tr.action]);
      if (err != MS_OK) break;
    }
    tr.addr = e->addr;
    tr.size = e->size;
    tr.time_us = e->time;
    ms_snap_trace_extra_t x = ms__trace_extra_of(&tr);
    x.action_name = names[tr.action]; /* NULL for a known action: its own name */
    x.pool_id[0] = e->pool_id[0];
    x.pool_id[1] = e->pool_id[1];
    x.stream = e->stream;
    err = ms__snapbuild_trace_extra(&t->b, &tr, &x);
    if (err != MS_OK) break;
    tr.present = MS_TRACE_HAS_TIME | MS_TRACE_HAS_STREAM;
    if (e->pool_id[0] || e->pool_id[1]) tr.present |= MS_TRACE_HAS_POOL_ID;
    err = provisional(t, rec, e->ctx, &tr.stack);
    if (err == MS_OK && tr.stack != MS_SNAP_NO_STACK) tr.present |= MS_TRACE_HAS_FRAMES;
    if (err == MS_OK) err = ms__snapbuild_add_trace(&t->b, &tr);
  }
  free(ents);
  if (err != MS_OK) return ms__errbuf_set(eb, err, "cannot add the trace: %s", ms_strerror(err));
  dev->ntrace = (uint32_t)(t->b.trace.len - dev->first_trace);
  return MS_OK;
}

int ms_allocator_snapshot(ms_allocator_t *const *allocs, size_t n, ms_snapshot_t **out,
                          ms_errbuf_t *eb) {
  if (!allocs || n == 0 || !out) return ms__errbuf_set(eb, MS_EINVAL, "no allocator given");
  if (n > 4096) return ms__errbuf_set(eb, MS_EINVAL, "too many allocators (%zu)", n);
  snapdev_t *devs = calloc(n, sizeof *devs);
  take_t t;
  memset(&t, 0, sizeof t);
  ms__snapbuild_init(&t.b);
  t.recs = calloc(n, sizeof *t.recs);
  uint32_t *res = NULL;
  int err = MS_OK;
  if (!devs || !t.recs) {
    err = ms__errbuf_set(eb, MS_ENOMEM, "out of host memory");
    goto out;
  }
  for (size_t i = 0; i < n; i++) {
    if (!allocs[i]) {
      err = ms__errbuf_set(eb, MS_EINVAL, "allocator %zu is NULL", i);
      goto out;
    }
    devs[i].a = allocs[i];
    devs[i].device = ms_allocator_device(allocs[i]);
  }
  qsort(devs, n, sizeof *devs, cmp_dev);
  for (size_t i = 0; i + 1 < n; i++)
    if (devs[i].device == devs[i + 1].device) {
      err = ms__errbuf_set(eb, MS_EINVAL, "two allocators for device %d", devs[i].device);
      goto out;
    }
  if (devs[0].device < 0 || devs[n - 1].device > 65535) {
    err = ms__errbuf_set(eb, MS_EINVAL, "device index %d out of range",
                         devs[0].device < 0 ? devs[0].device : devs[n - 1].device);
    goto out;
  }

  /* Segments and blocks, device by device (stacks provisional). */
  for (size_t i = 0; i < n; i++) {
    t.recs[i] = ms__recorder_of(devs[i].a);
    walk_arg_t w = {&t, (uint32_t)i};
    err = ms__allocator_snapshot(devs[i].a, &t.b, walk_ctx_to_stack, &w, &devs[i].info);
    if (err != MS_OK) {
      ms__errbuf_set(eb, err, "cannot walk the allocator of device %d: %s", devs[i].device,
                     ms_strerror(err));
      goto out;
    }
  }
  /* One device entry per index up to the highest, as PyTorch's device_traces. */
  for (int d = 0, i = 0; d <= devs[n - 1].device; d++) {
    ms_snap_device_t dev;
    memset(&dev, 0, sizeof dev);
    dev.first_trace = (uint32_t)t.b.trace.len;
    dev.first_stat = (uint32_t)t.b.stats.len;
    if (devs[i].device == d) {
      err = add_trace(&t, (uint32_t)i, &dev, eb);
      if (err != MS_OK) goto out;
      dev.capacity = devs[i].info.capacity;
      dev.first_stat = devs[i].info.first_stat;
      dev.nstats = devs[i].info.nstats;
      dev.present = MS_DEV_HAS_CAPACITY | MS_DEV_HAS_STATS;
      i++;
    }
    err = ms__snapbuild_add_device(&t.b, &dev);
    if (err != MS_OK) {
      ms__errbuf_set(eb, err, "cannot add device %d", d);
      goto out;
    }
  }
  err = ms__allocator_snapshot_settings(devs[0].a, &t.b);
  if (err != MS_OK) {
    ms__errbuf_set(eb, err, "cannot add the allocator settings");
    goto out;
  }

  /* Stacks: symbolise each distinct one, then replace the provisional indices. */
  if (t.pending.len) {
    res = malloc(t.pending.len * sizeof *res);
    if (!res) {
      err = ms__errbuf_set(eb, MS_ENOMEM, "out of host memory");
      goto out;
    }
    err = resolve_stacks(&t, res);
    if (err != MS_OK) {
      ms__errbuf_set(eb, err, "cannot symbolise the stacks: %s", ms_strerror(err));
      goto out;
    }
    for (size_t i = 0; i < t.b.segments.len; i++) remap(&t.b.segments.ptr[i].stack, res);
    for (size_t i = 0; i < t.b.blocks.len; i++) remap(&t.b.blocks.ptr[i].stack, res);
    for (size_t i = 0; i < t.b.trace.len; i++) remap(&t.b.trace.ptr[i].stack, res);
  }

  /* Process identity and time (memsnap's additions). */
  char host[256];
  if (gethostname(host, sizeof host) != 0) host[0] = 0;
  host[sizeof host - 1] = 0;
  err = ms__snapbuild_str(&t.b, host, strlen(host), &t.b.hdr.hostname);
  if (err != MS_OK) {
    ms__errbuf_set(eb, err, "out of host memory");
    goto out;
  }
  t.b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  t.b.hdr.pid = (int64_t)getpid();
  t.b.hdr.time_us = ms__now_us();
  t.b.hdr.rank = snapshot_rank();
  t.b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_SETTINGS | MS_SNAP_HAS_PROCESS;
  if (t.b.hdr.rank >= 0) t.b.hdr.present |= MS_SNAP_HAS_RANK;
  err = ms__snapbuild_finish(&t.b, out, eb);

out:
  free(res);
  free(devs);
  free(t.recs);
  MS_VEC_FREE(&t.pending);
  u64map_free(&t.pending_map);
  u64map_free(&t.pc_map);
  MS_VEC_FREE(&t.pcinfo);
  MS_VEC_FREE(&t.pcframes);
  ms__snapbuild_release(&t.b);
  return err;
}
