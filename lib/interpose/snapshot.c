/* SPDX-License-Identifier: MIT
 * memsnap run: building and writing the interposer's snapshots (docs/run.md). The recorder's state
 * is copied under its lock (record.c), then built into a snapshot outside it: the live
 * allocations as segments of one block, the trace with its times, the statistics per device, and
 * in cache mode the allocators' own snapshot merged in; then symbolised and written atomically.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "alloc/stats_internal.h"
#include "common/internal.h"
#include "history/history_internal.h"
#include "interpose/run_internal.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"
#include "memsnap/stats.h"
#include "model/snapbuild.h"

#define R ms__run_R

/* ---- snapshots ------------------------------------------------------------------------------ */

typedef struct copy_s {
  live_t *live;
  size_t nlive;
  ent_t *ents;
  size_t nents;
  uint64_t dropped[MS__RUN_MAX_DEVICES];
  ms_stats_t stats[MS__RUN_MAX_DEVICES];
  uint64_t capacity[MS__RUN_MAX_DEVICES];
  int ndev;
} copy_t;

static void copy_release(copy_t *c) {
  free(c->live);
  free(c->ents);
}

static int take_copy(copy_t *c) {
  memset(c, 0, sizeof *c);
  pthread_mutex_lock(&R.mu);
  c->live = malloc((R.count ? R.count : 1) * sizeof *c->live);
  c->ents = malloc((R.ring_len ? R.ring_len : 1) * sizeof *c->ents);
  if (!c->live || !c->ents) {
    pthread_mutex_unlock(&R.mu);
    copy_release(c);
    return MS_ENOMEM;
  }
  for (size_t i = 0; i < R.cap; i++)
    if (R.tab[i].addr != 0 && R.tab[i].addr != TOMB) c->live[c->nlive++] = R.tab[i];
  for (size_t i = 0; i < R.ring_len; i++)
    c->ents[i] = R.ring[(R.ring_head + i) % R.ring_cap];
  c->nents = R.ring_len;
  memcpy(c->dropped, R.dropped, sizeof c->dropped);
  memcpy(c->stats, R.stats, sizeof c->stats);
  memcpy(c->capacity, R.capacity, sizeof c->capacity);
  c->ndev = R.ndev;
  pthread_mutex_unlock(&R.mu);
  return MS_OK;
}

static int cmp_live(const void *x, const void *y) {
  const live_t *a = x, *b = y;
  if (a->device != b->device) return a->device < b->device ? -1 : 1;
  return (a->addr > b->addr) - (a->addr < b->addr);
}

typedef struct build_s {
  ms__snapbuild_t b;
  /* stack id -> builder stack: open addressing, key 0 = empty (ids are >= 1, not dense) */
  uint32_t *keys;
  uint32_t *vals;
  size_t cap, count;
} build_t;

/* @return the value slot of id (*fresh = 1 when just inserted), NULL on ENOMEM. */
static uint32_t *build_slot(build_t *t, uint32_t id, int *fresh) {
  if ((t->count + 1) * 2 > t->cap) {
    size_t ncap = t->cap ? t->cap * 2 : 256;
    uint32_t *nk = calloc(ncap, sizeof *nk), *nv = calloc(ncap, sizeof *nv);
    if (!nk || !nv) {
      free(nk);
      free(nv);
      return NULL;
    }
    for (size_t i = 0; i < t->cap; i++) {
      if (!t->keys[i]) continue;
      size_t j = slot_of(t->keys[i], ncap - 1);
      while (nk[j])
        j = (j + 1) & (ncap - 1);
      nk[j] = t->keys[i];
      nv[j] = t->vals[i];
    }
    free(t->keys);
    free(t->vals);
    t->keys = nk;
    t->vals = nv;
    t->cap = ncap;
  }
  size_t mask = t->cap - 1, j = slot_of(id, mask);
  for (; t->keys[j]; j = (j + 1) & mask)
    if (t->keys[j] == id) {
      *fresh = 0;
      return &t->vals[j];
    }
  t->keys[j] = id;
  t->count++;
  *fresh = 1;
  return &t->vals[j];
}

/* Converts stack id to a builder stack (symbolised once per id). pre: R.snap_mu held. */
static int build_stack(build_t *t, uint32_t id, uint32_t *out) {
  *out = MS_SNAP_NO_STACK;
  if (id == 0 || !R.stacks) return MS_OK;
  int fresh;
  uint32_t *slot = build_slot(t, id, &fresh);
  if (!slot) return MS_ENOMEM;
  if (!fresh) {
    *out = *slot;
    return MS_OK;
  }
  *slot = MS_SNAP_NO_STACK;
  size_t n = 0;
  const uintptr_t *pcs = ms__stacktab_get(R.stacks, id, &n);
  if (!pcs) return MS_OK;
  if (!R.sym) MS_FORWARD_IF_ERROR(ms__symbolizer_create(&R.sym));
  uint32_t fr[MS__MAX_FRAMES * (MS__SYM_MAX_INLINE + 1)];
  size_t nf = 0;
  for (size_t i = 0; i < n && i < MS__MAX_FRAMES; i++) {
    const ms__sym_t *syms;
    size_t ns;
    MS_FORWARD_IF_ERROR(ms__symbolize(R.sym, pcs[i], &syms, &ns));
    for (size_t k = 0; k < ns; k++)
      MS_FORWARD_IF_ERROR(ms__snapbuild_frame(&t->b, syms[k].name, strlen(syms[k].name),
                                              syms[k].filename, strlen(syms[k].filename),
                                              syms[k].line, &fr[nf++]));
  }
  uint32_t idx;
  MS_FORWARD_IF_ERROR(ms__snapbuild_stack(&t->b, fr, nf, &idx));
  *slot = idx;
  *out = idx;
  return MS_OK;
}

/* One live allocation as a segment holding one block. */
static int add_live_segment(build_t *t, const live_t *e, const char *st_alloc) {
  ms_snap_segment_t sg;
  ms_snap_block_t bl;
  memset(&sg, 0, sizeof sg);
  memset(&bl, 0, sizeof bl);
  MS_FORWARD_IF_ERROR(build_stack(t, e->stack, &bl.stack));
  bl.address = e->addr;
  bl.size = e->size;
  bl.requested_size = e->size;
  bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
  bl.state_name = st_alloc;
  bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  sg.device = e->device;
  sg.address = e->addr;
  sg.total_size = e->size;
  sg.allocated_size = e->size;
  sg.active_size = e->size;
  sg.requested_size = e->size;
  sg.stream = e->stream;
  sg.is_large = e->size > ((uint64_t)1 << 20);
  sg.pool_id[0] = e->pool_id[0];
  sg.pool_id[1] = e->pool_id[1];
  sg.stack = bl.stack;
  sg.first_block = (uint32_t)t->b.blocks.len;
  sg.nblocks = 1;
  sg.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE |
               MS_SEG_HAS_REQUESTED_SIZE | MS_SEG_HAS_SEGMENT_TYPE;
  MS_FORWARD_IF_ERROR(ms__snapbuild_add_block(&t->b, &bl));
  return ms__snapbuild_add_segment(&t->b, &sg);
}

/* One recorded trace entry. */
static int add_ent_trace(build_t *t, const ent_t *e, int64_t time_us, const char **names) {
  ms_snap_trace_t tr;
  memset(&tr, 0, sizeof tr);
  tr.action = (uint8_t)e->action;
  if (tr.action >= MS_TRACE_OTHER && !names[tr.action]) {
    const char *nm = ms_trace_action_name((ms_trace_action)tr.action);
    MS_FORWARD_IF_ERROR(ms__snapbuild_str(&t->b, nm, strlen(nm), &names[tr.action]));
  }
  tr.addr = e->addr;
  tr.size = e->size;
  tr.time_us = time_us;
  ms_snap_trace_extra_t x = ms__trace_extra_of(&tr);
  x.action_name = tr.action >= MS_TRACE_OTHER ? names[tr.action] : NULL;
  x.pool_id[0] = e->pool_id[0];
  x.pool_id[1] = e->pool_id[1];
  x.stream = e->stream;
  MS_FORWARD_IF_ERROR(ms__snapbuild_trace_extra(&t->b, &tr, &x));
  tr.present = MS_TRACE_HAS_TIME | MS_TRACE_HAS_STREAM;
  if (e->pool_id[0] || e->pool_id[1]) tr.present |= MS_TRACE_HAS_POOL_ID;
  MS_FORWARD_IF_ERROR(build_stack(t, e->stack, &tr.stack));
  if (tr.stack != MS_SNAP_NO_STACK) tr.present |= MS_TRACE_HAS_FRAMES;
  return ms__snapbuild_add_trace(&t->b, &tr);
}

/* ---- the cache mode's snapshot (the allocators'), copied to merge the passthrough records ---- */

static int copy_str(build_t *t, const char *s, const char **out) {
  return ms__snapbuild_str(&t->b, s ? s : "", s ? strlen(s) : 0, out);
}

static bool ends_with(const char *s, const char *tail) {
  size_t n = strlen(s), m = strlen(tail);
  return n >= m && strcmp(s + n - m, tail) == 0;
}

/* Whether frame f is one of the interposer's hooks that call the cache mode's allocators (named
 * with libdw: the hooks are static functions of preload.c, not exported). */
static bool is_hook_frame(const ms_snap_frame_t *f) {
  static const char *const hooks[] = {"hook_cudaMalloc", "hook_cudaMallocAsync",
                                       "hook_cudaMallocAsync_ptsz"};
  bool named = false;
  for (size_t i = 0; i < sizeof hooks / sizeof *hooks; i++)
    if (strcmp(f->name, hooks[i]) == 0) named = true;
  return named && ends_with(f->filename, "preload.c");
}

/* Whether frame f lies in the interposer, unnamed (without libdw, dladdr names a frame by the
 * object's exported symbols only, and the file is the object). */
static bool in_interposer_object(const ms_snap_frame_t *f) {
  return ends_with(f->filename, "libmemsnap_preload.so");
}

/* Stack i of a as a stack of the builder (*out), without the hooks' frames as the recorder's
 * stacks; map[i] remembers it (UINT32_MAX: not yet). */
static int copy_stack(build_t *t, const ms_snapshot_t *a, uint32_t *map, uint32_t i,
                      uint32_t *out) {
  *out = MS_SNAP_NO_STACK;
  if (i == MS_SNAP_NO_STACK || i >= a->nstacks) return MS_OK;
  if (map[i] != UINT32_MAX) {
    *out = map[i];
    return MS_OK;
  }
  const ms_snap_stack_t *st = &a->stacks[i];
  uint32_t *fr = malloc((st->nframes ? st->nframes : 1) * sizeof *fr);
  if (!fr) return MS_ENOMEM;
  int err = MS_OK;
  /* everything up to the innermost hook is memsnap's (the allocator's frames, which the
   * snapshot names and leaves out with libdw; without it they stay, unnamed, below the hook) */
  uint32_t k0 = 0, nf = 0;
  for (uint32_t k = 0; k < st->nframes; k++) {
    const ms_snap_frame_t *f = ms_snap_stack_frame(a, i, k);
    bool last_of_object = in_interposer_object(f) &&
                          (k + 1 == st->nframes ||
                           !in_interposer_object(ms_snap_stack_frame(a, i, k + 1)));
    if (is_hook_frame(f) || last_of_object) {
      k0 = k + 1;
      break;
    }
  }
  for (uint32_t k = k0; k < st->nframes && err == MS_OK; k++) {
    const ms_snap_frame_t *f = ms_snap_stack_frame(a, i, k);
    err = ms__snapbuild_frame(&t->b, f->name, strlen(f->name), f->filename, strlen(f->filename),
                              f->line, &fr[nf++]);
  }
  if (err == MS_OK) err = ms__snapbuild_stack(&t->b, fr, nf, &map[i]);
  free(fr);
  if (err == MS_OK) *out = map[i];
  return err;
}

static int copy_segment(build_t *t, const ms_snapshot_t *a, uint32_t *map,
                        const ms_snap_segment_t *src) {
  ms_snap_segment_t sg = *src;
  MS_FORWARD_IF_ERROR(copy_stack(t, a, map, src->stack, &sg.stack));
  sg.first_block = (uint32_t)t->b.blocks.len;
  for (uint32_t k = 0; k < src->nblocks; k++) {
    ms_snap_block_t bl = *ms_snap_segment_block(a, src, k);
    bl.first_history = 0;
    bl.nhistory = 0; /* memsnap's allocators write no legacy history */
    bl.present &= ~(uint32_t)MS_BLOCK_HAS_HISTORY;
    MS_FORWARD_IF_ERROR(copy_str(t, bl.state_name, &bl.state_name));
    MS_FORWARD_IF_ERROR(copy_stack(t, a, map, bl.stack, &bl.stack));
    MS_FORWARD_IF_ERROR(ms__snapbuild_add_block(&t->b, &bl));
  }
  return ms__snapbuild_add_segment(&t->b, &sg);
}

static int copy_trace(build_t *t, const ms_snapshot_t *a, uint32_t *map,
                      const ms_snap_trace_t *src) {
  ms_snap_trace_t tr = *src;
  tr.extra = NULL;
  ms_snap_trace_extra_t x = ms__trace_extra_of(src);
  if (x.action_name) MS_FORWARD_IF_ERROR(copy_str(t, x.action_name, &x.action_name));
  MS_FORWARD_IF_ERROR(copy_str(t, x.compile_context, &x.compile_context));
  MS_FORWARD_IF_ERROR(copy_str(t, x.user_metadata, &x.user_metadata));
  MS_FORWARD_IF_ERROR(ms__snapbuild_trace_extra(&t->b, &tr, &x));
  MS_FORWARD_IF_ERROR(copy_stack(t, a, map, src->stack, &tr.stack));
  return ms__snapbuild_add_trace(&t->b, &tr);
}

/* allocator_settings: top-level entries and maps of one level (what the allocators write). */
static int copy_settings(build_t *t, const ms_snapshot_t *a) {
  for (size_t i = 0; i < a->nsettings_top; i++) {
    ms_snap_kv_t kv = a->settings[i];
    MS_FORWARD_IF_ERROR(copy_str(t, kv.key, &kv.key));
    if (kv.kind == MS_SNAP_VAL_STR) MS_FORWARD_IF_ERROR(copy_str(t, kv.s, &kv.s));
    if (kv.kind == MS_SNAP_VAL_MAP) {
      uint32_t first = 0;
      for (uint32_t k = 0; k < kv.count; k++) {
        if ((size_t)kv.first + k >= a->nsettings) return MS_EINVAL;
        ms_snap_kv_t ch = a->settings[kv.first + k];
        if (ch.kind == MS_SNAP_VAL_MAP) return MS_EUNSUPPORTED;
        MS_FORWARD_IF_ERROR(copy_str(t, ch.key, &ch.key));
        if (ch.kind == MS_SNAP_VAL_STR) MS_FORWARD_IF_ERROR(copy_str(t, ch.s, &ch.s));
        uint32_t idx;
        MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting_child(&t->b, &ch, &idx));
        if (k == 0) first = idx;
      }
      kv.first = first;
    }
    MS_FORWARD_IF_ERROR(ms__snapbuild_add_setting(&t->b, &kv));
  }
  return MS_OK;
}

/* Builds the snapshot: the recorder's allocations and trace (c), merged, when a (the cache
 * mode's allocators' snapshot) is given, with a's segments (by device and address) and trace (by
 * time), whose statistics, capacities and settings are then a's. device >= 0: only that device. */
/* Segments by device and address: a's (already so) and the recorded ones, merged. */
static int build_segments(build_t *t, const copy_t *c, const ms_snapshot_t *a, uint32_t *map,
                          int device, const char *st_alloc) {
  int err = MS_OK;
  size_t i = 0, k = 0, na = a ? a->nsegments : 0;
  while (err == MS_OK && (i < c->nlive || k < na)) {
    const live_t *e = i < c->nlive ? &c->live[i] : NULL;
    const ms_snap_segment_t *g = k < na ? &a->segments[k] : NULL;
    if (e && device >= 0 && e->device != device) {
      i++;
      continue;
    }
    if (g && device >= 0 && g->device != device) {
      k++;
      continue;
    }
    bool take_e =
        e && (!g || e->device < g->device || (e->device == g->device && e->addr < g->address));
    if (take_e) {
      err = add_live_segment(t, e, st_alloc);
      i++;
    } else {
      err = copy_segment(t, a, map, g);
      k++;
    }
  }
  return err;
}

/* Device d's entry: the trace (the recorded entries and a's, merged by time), dropped counts, the
 * statistics (the allocator's in cache mode, else the recorder's) and the capacity. Only device
 * `device` gets its data when device >= 0. */
static int build_device(build_t *t, const copy_t *c, const ms_snapshot_t *a, uint32_t *map, int d,
                        int device, clock_pair_t now, const char **an) {
  int err = MS_OK;
  ms_snap_device_t dev;
  memset(&dev, 0, sizeof dev);
  dev.first_trace = (uint32_t)t->b.trace.len;
  dev.first_stat = (uint32_t)t->b.stats.len;
  if (device >= 0 && d != device) return ms__snapbuild_add_device(&t->b, &dev);
  const ms_snap_device_t *ad = a && (size_t)d < a->ndevices ? &a->devices[d] : NULL;
  /* the trace: both oldest first, merged by time (a's first on a tie) */
  size_t ke = 0, ka = 0, nae = ad ? ad->ntrace : 0;
  while (err == MS_OK) {
    while (ke < c->nents && c->ents[ke].device != d)
      ke++;
    const ent_t *e = ke < c->nents ? &c->ents[ke] : NULL;
    const ms_snap_trace_t *x = ka < nae ? &a->trace[ad->first_trace + ka] : NULL;
    if (!e && !x) break;
    int64_t te = e ? ms__run_ticks_to_us((uint64_t)e->time, now) : 0;
    if (e && (!x || te < x->time_us)) {
      err = add_ent_trace(t, e, te, an);
      ke++;
    } else {
      err = copy_trace(t, a, map, x);
      ka++;
    }
  }
  dev.ntrace = (uint32_t)(t->b.trace.len - dev.first_trace);
  dev.trace_dropped = c->dropped[d] + (ad ? ad->trace_dropped : 0);
  if (ad) { /* the allocator's statistics and capacity */
    for (uint32_t s2 = 0; s2 < ad->nstats && err == MS_OK; s2++) {
      ms_snap_kv_t kv = a->stats[ad->first_stat + s2];
      err = copy_str(t, kv.key, &kv.key);
      if (err == MS_OK && kv.kind == MS_SNAP_VAL_STR) err = copy_str(t, kv.s, &kv.s);
      if (err == MS_OK) err = ms__snapbuild_add_stat(&t->b, &kv);
    }
    dev.nstats = ad->nstats;
    dev.capacity = ad->capacity;
    dev.present = ad->present;
  } else {
    ms_stat_kv_t kv[MS_STATS_NKEYS];
    size_t nkv = 0;
    if (err == MS_OK) err = ms_stats_flat(&c->stats[d], kv, MS_STATS_NKEYS, &nkv);
    for (size_t s2 = 0; s2 < nkv && err == MS_OK; s2++) {
      ms_snap_kv_t e;
      memset(&e, 0, sizeof e);
      err = ms__snapbuild_str(&t->b, kv[s2].name, strlen(kv[s2].name), &e.key);
      e.kind = MS_SNAP_VAL_INT;
      e.i = kv[s2].value;
      if (err == MS_OK) err = ms__snapbuild_add_stat(&t->b, &e);
    }
    dev.nstats = (uint32_t)nkv;
    dev.present = MS_DEV_HAS_STATS;
  }
  if (!(dev.present & MS_DEV_HAS_CAPACITY) && c->capacity[d]) {
    dev.capacity = c->capacity[d];
    dev.present |= MS_DEV_HAS_CAPACITY;
  }
  if (err == MS_OK) err = ms__snapbuild_add_device(&t->b, &dev);
  return err;
}

/* The header: host, process, time, rank (from $RANK, as torchrun sets it). */
static int build_header(build_t *t, const ms_snapshot_t *a) {
  char host[256];
  if (gethostname(host, sizeof host) != 0) host[0] = 0;
  host[sizeof host - 1] = 0;
  int err = ms__snapbuild_str(&t->b, host, strlen(host), &t->b.hdr.hostname);
  if (err != MS_OK) return err;
  t->b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  t->b.hdr.pid = (int64_t)getpid();
  t->b.hdr.time_us = ms__now_us();
  t->b.hdr.rank = -1;
  t->b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_PROCESS;
  if (a && (a->present & MS_SNAP_HAS_SETTINGS)) t->b.hdr.present |= MS_SNAP_HAS_SETTINGS;
  const char *rank = getenv("RANK");
  if (rank && *rank) {
    char *end;
    long long v = strtoll(rank, &end, 10);
    if (!*end && v >= 0) {
      t->b.hdr.rank = v;
      t->b.hdr.present |= MS_SNAP_HAS_RANK;
    }
  }
  return MS_OK;
}

static int build(const copy_t *c, const ms_snapshot_t *a, int device, ms_snapshot_t **out,
                 ms_errbuf_t *eb) {
  clock_pair_t now = ms__run_clock_pair();
  build_t t;
  memset(&t, 0, sizeof t);
  ms__snapbuild_init(&t.b);
  uint32_t *map = NULL;
  int err = MS_OK;
  const char *st_alloc;
  const char *an[MS_TRACE_ACTION_COUNT] = {0};
  const char *s1 = ms_block_state_name(MS_BLOCK_ACTIVE_ALLOCATED);
  if ((err = ms__snapbuild_str(&t.b, s1, strlen(s1), &st_alloc)) != MS_OK) goto out;
  if (a && a->nstacks) {
    map = malloc(a->nstacks * sizeof *map);
    if (!map) {
      err = MS_ENOMEM;
      goto out;
    }
    memset(map, 0xff, a->nstacks * sizeof *map);
  }

  err = build_segments(&t, c, a, map, device, st_alloc);
  /* One device entry per index up to the highest, as PyTorch's device_traces. */
  int ndev = c->ndev;
  if (a && (int)a->ndevices > ndev) ndev = (int)a->ndevices;
  if (device >= 0) ndev = device + 1;
  for (int d = 0; d < ndev && err == MS_OK; d++)
    err = build_device(&t, c, a, map, d, device, now, an);
  if (err == MS_OK && a) err = copy_settings(&t, a);
  if (err != MS_OK) goto out;

  if ((err = build_header(&t, a)) != MS_OK) goto out;
  err = ms__snapbuild_finish(&t.b, out, eb);
  free(map);
  free(t.keys);
  free(t.vals);
  ms__snapbuild_release(&t.b);
  return err;
out:
  free(map);
  free(t.keys);
  free(t.vals);
  ms__snapbuild_release(&t.b);
  return ms__errbuf_set(eb, err, "cannot build the snapshot: %s", ms_strerror(err));
}

int ms__run_take(int device, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_snapshot_t *a = NULL;
  if (ms__run_cache_active()) {
    int err = ms__run_cache_snapshot(device, &a, eb);
    if (err != MS_OK) return err;
  }
  copy_t c;
  int err = take_copy(&c);
  if (err != MS_OK) {
    ms_snapshot_free(a);
    return ms__errbuf_set(eb, err, "out of host memory");
  }
  qsort(c.live, c.nlive, sizeof *c.live, cmp_live);
  err = build(&c, a, device, out, eb);
  copy_release(&c);
  ms_snapshot_free(a);
  return err;
}

static bool pattern_has_device(const char *p) {
  for (; *p; p++)
    if (*p == '%') {
      if (p[1] == 'd') return true;
      if (p[1]) p++;
    }
  return false;
}

/* pre: R.snap_mu held. */
static int write_one(int device, uint64_t n, char *path_out, size_t cap) {
  const char *pattern = ms__run_opts()->pattern;
  char path[4096];
  int err = ms_oom_path_format(pattern, device < 0 ? 0 : device, n, path, sizeof path);
  if (err != MS_OK) {
    ms__warning("cannot format the snapshot path '%s': %s", pattern, ms_strerror(err));
    return err;
  }
  ms_errbuf_t eb = {0};
  ms_snapshot_t *snap = NULL;
  if ((err = ms__run_take(device, &snap, &eb)) != MS_OK) {
    ms__warning("cannot take a snapshot: %s", eb.msg[0] ? eb.msg : ms_strerror(err));
    return err;
  }
  err = ms_snapshot_write_file(snap, path, NULL, &eb);
  ms_snapshot_free(snap);
  if (err != MS_OK) {
    if (eb.msg[0]) /* the writer's message names the path already */
      ms__warning("%s", eb.msg);
    else
      ms__warning("cannot write '%s': %s", path, ms_strerror(err));
    return err;
  }
  if (path_out && cap) snprintf(path_out, cap, "%s", path);
  return MS_OK;
}

/* @return the devices that have something to show (bit d). pre: none. */
static uint64_t devices_used(void) {
  uint64_t m = ms__run_cache_active() ? ms__run_cache_devices() : 0;
  pthread_mutex_lock(&R.mu);
  for (int d = 0; d < R.ndev; d++)
    if (R.stats[d].num_device_alloc || R.stats[d].num_ooms) m |= 1ULL << d;
  pthread_mutex_unlock(&R.mu);
  return m;
}

/* Tells `memsnap run` that a process of the program wrote a snapshot: one byte appended to the
 * file MEMSNAP_RUN_SEEN names (the command says so when it stays empty: no CUDA call seen). */
static void run_mark_seen(void) {
  const char *m = getenv("MEMSNAP_RUN_SEEN");
  if (!m || !*m) return;
  int fd = open(m, O_WRONLY | O_APPEND | O_CLOEXEC);
  if (fd < 0) return;
  if (write(fd, "1", 1) != 1) { /* nothing to do: the command then says no call was seen */
  }
  close(fd);
}

int ms__run_write(const char *why, int device, char *path_out, size_t cap) {
  run_mark_seen();
  int saved = ms__run_in_hook;
  ms__run_in_hook = 1; /* CUDA calls made while writing are not recorded */
  pthread_mutex_lock(&R.snap_mu);
  int err = MS_OK;
  char last[4096] = "";
  if (R.exiting && strcmp(why, "exit") != 0) goto out; /* the exit snapshot is the last one */
  uint64_t n = atomic_fetch_add(&R.nseq, 1);
  if (pattern_has_device(ms__run_opts()->pattern)) {
    uint64_t m = device >= 0 ? 1ULL << device : devices_used();
    for (int d = 0; d < MS__RUN_MAX_DEVICES && err == MS_OK; d++)
      if (m & (1ULL << d)) err = write_one(d, n, last, sizeof last);
  } else {
    err = write_one(-1, n, last, sizeof last);
  }
  if (err == MS_OK && last[0]) {
    if (path_out && cap) snprintf(path_out, cap, "%s", last);
    if (!ms__run_opts()->quiet && strcmp(why, "every") != 0 && strcmp(why, "oom") != 0)
      ms__message("memsnap: ", "snapshot written to '%s' (%s)", last, why);
  }
out:
  pthread_mutex_unlock(&R.snap_mu);
  ms__run_in_hook = saved;
  return err;
}
