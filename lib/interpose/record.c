/* SPDX-License-Identifier: MIT
 * memsnap run: the observe-mode recorder of the interposer (issue #18, docs/run.md), and when
 * snapshots are written (at exit, on OOM, on SIGUSR1, every N seconds).
 *
 * State (one mutex, R.mu, taken only inside intercepted CUDA calls and by snapshots):
 *  - the live table: every allocation the program holds, keyed by address (open addressing);
 *  - the trace: a ring of PyTorch trace entries (segment_alloc + alloc for each allocation,
 *    free_requested + free_completed + segment_free for each free, oom), all devices together,
 *    growing on demand up to max_entries, the oldest overwritten and counted per device after;
 *  - per-device statistics with PyTorch's keys (in observe mode every allocation is one segment
 *    holding one block, so allocated = reserved = active bytes).
 * Stacks are raw return addresses interned in the history module's stack table
 * (lib/history_internal.h) and symbolised only when a snapshot is built.
 *
 * A free is recorded after the real cudaFree returned successfully (a failed free changes
 * nothing), without holding the lock across it: the freeing thread notes the newest allocation's
 * sequence number before the call, and afterwards removes the entry only if it is that old. If
 * another thread receives the same address from the driver in between, its allocation completes
 * the free first, so the trace stays in the driver's order.
 *
 * Writing: a snapshot is copied under R.mu and built, symbolised and written outside it, one
 * writer at a time (R.snap_mu), atomically (ms_snapshot_write_file: temporary file, fsync,
 * rename), so a crash of the program leaves the last complete file intact. SIGUSR1 only posts a
 * semaphore (async-signal-safe); a writer thread, started with the first recorded call, waits on
 * it and on the --every period, with every signal blocked.
 */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "alloc/stats_internal.h"
#include "common/internal.h"
#include "history/history_internal.h"
#include "interpose/run_internal.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"
#include "memsnap/stats.h"
#include "model/snapbuild.h"

#define TOMB UINT64_MAX

typedef struct live_s {
  uint64_t addr; /* 0 = empty slot, TOMB = deleted */
  uint64_t size;
  uint64_t stream;
  uint64_t seq; /* unique per allocation */
  int64_t pool_id[2];
  uint32_t stack;
  int16_t device;
  uint8_t kind;
} live_t;

typedef struct ent_s {
  uint64_t addr;
  uint64_t size;
  uint64_t stream;
  int64_t time; /* clock ticks (rec_ticks) */
  int64_t pool_id[2];
  uint32_t stack;
  uint8_t action; /* ms_trace_action */
  uint8_t device;
} ent_t;

static struct {
  pthread_mutex_t mu;
  /* live table */
  live_t *tab;
  size_t cap, count, used;   /* used = count + tombstones */
  _Atomic uint64_t next_seq; /* the seq of the newest allocation (written under mu) */
  /* trace ring */
  ent_t *ring;
  size_t ring_cap, ring_len, ring_head; /* ring_head: oldest entry once full (ring_len == cap) */
  size_t ring_max;                      /* max_entries */
  uint64_t dropped[MS__RUN_MAX_DEVICES];
  /* statistics */
  ms_stats_t stats[MS__RUN_MAX_DEVICES];
  uint64_t capacity[MS__RUN_MAX_DEVICES];
  int ndev; /* highest device recorded + 1 */
  uint64_t ncalls;
  uint64_t nooms; /* out-of-memory errors seen */
  /* stacks */
  ms__stacktab_t *stacks;
  /* writing */
  pthread_mutex_t snap_mu;
  ms__symbolizer_t *sym;
  atomic_ullong nseq;
  bool exiting;
  sem_t sem;
  bool thread_started;
} R = {.mu = PTHREAD_MUTEX_INITIALIZER, .snap_mu = PTHREAD_MUTEX_INITIALIZER};

static pthread_once_t start_once = PTHREAD_ONCE_INIT;
static pthread_once_t opts_once = PTHREAD_ONCE_INIT;
static ms__run_opts_t opts;

/* ---- options ----------------------------------------------------------------------------- */

void ms__run_opts_read(ms__run_opts_t *o) {
  memset(o, 0, sizeof *o);
  o->mode = MS__RUN_OBSERVE;
  snprintf(o->pattern, sizeof o->pattern, "%s", "memsnap-%p-%n.msgpack");
  o->depth = 32;
  o->unwinder = MS_UNWIND_FRAME_POINTER;
  o->max_entries = 1000000;
  o->signal = true;
  o->max_oom = 10;
  const char *s;
  if ((s = getenv("MEMSNAP_RUN_MODE")) && *s) {
    if (strcmp(s, "cache") == 0)
      o->mode = MS__RUN_CACHE;
    else if (strcmp(s, "observe") != 0)
      ms__warning("MEMSNAP_RUN_MODE='%s' is not observe or cache; observing", s);
  }
  if ((s = getenv("MEMSNAP_RUN_OUTPUT")) && *s) {
    char probe[64];
    int e = ms_oom_path_format(s, 0, 0, probe, sizeof probe);
    if ((e == MS_OK || e == MS_ELIMIT) && strlen(s) < sizeof o->pattern)
      snprintf(o->pattern, sizeof o->pattern, "%s", s);
    else
      ms__warning("MEMSNAP_RUN_OUTPUT='%s' is not a valid pattern; using '%s'", s, o->pattern);
  }
  if ((s = getenv("MEMSNAP_RUN_EVERY")) && *s) {
    char *end;
    double v = strtod(s, &end);
    if (*end || !(v >= 0) || v > 1e9)
      ms__warning("MEMSNAP_RUN_EVERY='%s' is not a number of seconds; no periodic snapshots", s);
    else
      o->every = v;
  }
  if ((s = getenv("MEMSNAP_RUN_STACKS")) && *s) {
    char *end;
    long v = strtol(s, &end, 10);
    if (*end || v < 0 || v > MS_HISTORY_MAX_FRAMES)
      ms__warning("MEMSNAP_RUN_STACKS='%s' is not 0..%d; keeping %u frames", s,
                  MS_HISTORY_MAX_FRAMES, o->depth);
    else
      o->depth = (unsigned)v;
  }
  if ((s = getenv("MEMSNAP_RUN_UNWIND")) && *s) {
    if (strcmp(s, "backtrace") == 0)
      o->unwinder = MS_UNWIND_BACKTRACE;
    else if (strcmp(s, "fp") == 0)
      o->unwinder = MS_UNWIND_FRAME_POINTER;
    else
      ms__warning("MEMSNAP_RUN_UNWIND='%s' is not fp or backtrace; using fp", s);
  }
  if ((s = getenv("MEMSNAP_RUN_MAX_ENTRIES")) && *s) {
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (*end || v < 1 || v > (1ULL << 32))
      ms__warning("MEMSNAP_RUN_MAX_ENTRIES='%s' is not 1..2^32; keeping %zu", s, o->max_entries);
    else
      o->max_entries = (size_t)v;
  }
  if ((s = getenv("MEMSNAP_RUN_MAX_OOM")) && *s) {
    char *end;
    unsigned long v = strtoul(s, &end, 10);
    if (*end || *s == '-' || v > 1000000)
      ms__warning("MEMSNAP_RUN_MAX_OOM='%s' is not 0..1000000; keeping %u", s, o->max_oom);
    else
      o->max_oom = (unsigned)v;
  }
  if ((s = getenv("MEMSNAP_RUN_QUIET")) && *s) o->quiet = strcmp(s, "0") != 0;
  if ((s = getenv("MEMSNAP_RUN_SIGNAL")) && *s) o->signal = strcmp(s, "0") != 0;
}

static void opts_init(void) {
  ms__run_opts_read(&opts);
}

const ms__run_opts_t *ms__run_opts(void) {
  pthread_once(&opts_once, opts_init);
  return &opts;
}

/* ---- time ------------------------------------------------------------------------------------
 * As history.c does (PyTorch's approximate TSC): entries store clock ticks, cheaper to read than
 * the wall clock, converted to unix microseconds when a snapshot is built, with the rate measured
 * between the recorder's start and the snapshot. */
#if defined(__x86_64__) || defined(__i386__)
static inline uint64_t rec_ticks(void) {
  return __builtin_ia32_rdtsc();
}
#else
static inline uint64_t rec_ticks(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

typedef struct clock_pair_s {
  uint64_t ticks;
  int64_t us;
} clock_pair_t;

static clock_pair_t clock_base;

static clock_pair_t clock_pair(void) {
  clock_pair_t best = {0, 0};
  uint64_t gap = UINT64_MAX;
  for (int i = 0; i < 3; i++) {
    uint64_t t0 = rec_ticks();
    int64_t us = ms__now_us();
    uint64_t t1 = rec_ticks();
    if (t1 - t0 < gap) {
      gap = t1 - t0;
      best.ticks = t0 + (t1 - t0) / 2;
      best.us = us;
    }
  }
  return best;
}

static int64_t ticks_to_us(uint64_t ticks, clock_pair_t now) {
  if (now.us <= clock_base.us || now.ticks <= clock_base.ticks) return now.us;
  double per_us = (double)(now.ticks - clock_base.ticks) / (double)(now.us - clock_base.us);
  double back = (double)(int64_t)(now.ticks - ticks) / per_us;
  return now.us - (int64_t)(back + 0.5);
}

/* ---- the live table (pre: R.mu held) ------------------------------------------------------ */

static size_t slot_of(uint64_t addr, size_t mask) {
  uint64_t h = addr * 0x9E3779B97F4A7C15ULL;
  return (size_t)(h >> 17) & mask;
}

static live_t *tab_find(uint64_t addr) {
  if (!R.cap) return NULL;
  size_t mask = R.cap - 1;
  for (size_t j = slot_of(addr, mask);; j = (j + 1) & mask) {
    if (R.tab[j].addr == addr) return &R.tab[j];
    if (R.tab[j].addr == 0) return NULL;
  }
}

static int tab_grow(void) {
  size_t ncap = R.cap ? (R.count * 4 > R.cap ? R.cap * 2 : R.cap) : 1024;
  live_t *nt = calloc(ncap, sizeof *nt);
  if (!nt) return MS_ENOMEM;
  for (size_t i = 0; i < R.cap; i++) {
    if (R.tab[i].addr == 0 || R.tab[i].addr == TOMB) continue;
    size_t j = slot_of(R.tab[i].addr, ncap - 1);
    while (nt[j].addr)
      j = (j + 1) & (ncap - 1);
    nt[j] = R.tab[i];
  }
  free(R.tab);
  R.tab = nt;
  R.cap = ncap;
  R.used = R.count;
  return MS_OK;
}

/* @return the slot for a new entry of addr (not present), NULL on ENOMEM. */
static live_t *tab_insert(uint64_t addr) {
  if ((R.used + 1) * 2 > R.cap && tab_grow() != MS_OK) return NULL;
  size_t mask = R.cap - 1;
  size_t j = slot_of(addr, mask);
  while (R.tab[j].addr != 0 && R.tab[j].addr != TOMB)
    j = (j + 1) & mask;
  if (R.tab[j].addr == 0) R.used++;
  R.count++;
  memset(&R.tab[j], 0, sizeof R.tab[j]);
  R.tab[j].addr = addr;
  return &R.tab[j];
}

static void tab_remove(live_t *e) {
  e->addr = TOMB;
  R.count--;
}

/* ---- trace and statistics (pre: R.mu held) ------------------------------------------------ */

static void note_device(int device) {
  if (device + 1 > R.ndev) R.ndev = device + 1;
}

static void trace_push(ms_trace_action action, int device, uint64_t addr, uint64_t size,
                       uint64_t stream, const int64_t pool_id[2], uint32_t stack, int64_t now) {
  if (ms_unlikely(R.ring_len == R.ring_cap) && R.ring_cap < R.ring_max) {
    /* grow (never wrapped yet: the oldest entry is in slot 0) */
    size_t ncap = R.ring_cap ? R.ring_cap * 2 : 4096;
    if (ncap > R.ring_max) ncap = R.ring_max;
    ent_t *n = realloc(R.ring, ncap * sizeof *n);
    if (n) {
      R.ring = n;
      R.ring_cap = ncap;
    }
  }
  ent_t *e;
  if (ms_likely(R.ring_len < R.ring_cap)) { /* not full: never wrapped, head 0 */
    e = &R.ring[R.ring_len++];
  } else if (R.ring_cap) { /* full: the oldest entry goes */
    e = &R.ring[R.ring_head];
    R.dropped[e->device]++;
    if (++R.ring_head == R.ring_cap) R.ring_head = 0;
  } else { /* no host memory for a ring at all */
    R.dropped[device]++;
    return;
  }
  e->action = (uint8_t)action;
  e->device = (uint8_t)device;
  e->addr = addr;
  e->size = size;
  e->stream = stream;
  e->time = now;
  e->pool_id[0] = pool_id ? pool_id[0] : 0;
  e->pool_id[1] = pool_id ? pool_id[1] : 0;
  e->stack = stack;
}

static void stats_alloc(int device, uint64_t size) {
  ms_stats_t *st = &R.stats[device];
  enum ms_stat_type pool = ms__stat_pool_of_size(size);
  int64_t n = (int64_t)size;
  ms__stat_array_increase(st->allocation, pool, 1);
  ms__stat_array_increase(st->segment, pool, 1);
  ms__stat_array_increase(st->active, pool, 1);
  ms__stat_array_increase(st->allocated_bytes, pool, n);
  ms__stat_array_increase(st->reserved_bytes, pool, n);
  ms__stat_array_increase(st->active_bytes, pool, n);
  ms__stat_array_increase(st->requested_bytes, pool, n);
  st->num_device_alloc++;
}

static void stats_free(int device, uint64_t size) {
  ms_stats_t *st = &R.stats[device];
  enum ms_stat_type pool = ms__stat_pool_of_size(size);
  int64_t n = (int64_t)size;
  ms__stat_array_decrease(st->allocation, pool, 1);
  ms__stat_array_decrease(st->segment, pool, 1);
  ms__stat_array_decrease(st->active, pool, 1);
  ms__stat_array_decrease(st->allocated_bytes, pool, n);
  ms__stat_array_decrease(st->reserved_bytes, pool, n);
  ms__stat_array_decrease(st->active_bytes, pool, n);
  ms__stat_array_decrease(st->requested_bytes, pool, n);
  st->num_device_free++;
}

/* Traces the free of a live entry and removes it. The entries carry the allocation's stream, as
 * PyTorch's (a block's stream), whatever stream freed it. */
static void complete_free(live_t *e, int64_t now) {
  int d = e->device;
  trace_push(MS_TRACE_FREE_REQUESTED, d, e->addr, e->size, e->stream, e->pool_id, 0, now);
  trace_push(MS_TRACE_FREE_COMPLETED, d, e->addr, e->size, e->stream, e->pool_id, 0, now);
  trace_push(MS_TRACE_SEGMENT_FREE, d, e->addr, e->size, e->stream, e->pool_id, 0, now);
  stats_free(d, e->size);
  tab_remove(e);
}

/* ---- recording ------------------------------------------------------------------------------ */

ms__stacktab_t *ms__run_stacks(void) {
  return R.stacks;
}

MS_NOINLINE uint32_t ms__run_stack(unsigned skip) {
  const ms__run_opts_t *o = ms__run_opts();
  if (!o->depth || !R.stacks) return 0;
  uintptr_t pcs[MS__MAX_FRAMES];
  size_t max = o->depth < MS__MAX_FRAMES ? o->depth : MS__MAX_FRAMES;
  /* skip + 2: pcs[0] is then inside the caller of the hook that called us. */
  size_t n = o->unwinder == MS_UNWIND_BACKTRACE ? ms__capture_backtrace(pcs, max, skip + 2)
                                                : ms__capture_fp(pcs, max, skip + 2);
  return n ? ms__stacktab_intern(R.stacks, pcs, n) : 0;
}

void ms__run_on_alloc(int device, uint64_t addr, uint64_t size, uint64_t stream,
                      const int64_t pool_id[2], uint32_t stack, ms__run_kind kind) {
  if (device < 0 || device >= MS__RUN_MAX_DEVICES || addr == 0 || addr == TOMB) return;
  int64_t now = (int64_t)rec_ticks();
  pthread_mutex_lock(&R.mu);
  R.ncalls++;
  note_device(device);
  live_t *old = tab_find(addr);
  if (old) {
    /* The driver handed out an address whose free has not been recorded yet: that free
     * happened (its cudaFree returned, and its thread has not recorded it yet; or it went
     * through an API we do not intercept), so it is completed here, before this allocation. */
    complete_free(old, now);
  }
  live_t *e = tab_insert(addr);
  if (e) {
    e->size = size;
    e->stream = stream;
    e->seq = atomic_load_explicit(&R.next_seq, memory_order_relaxed) + 1;
    atomic_store_explicit(&R.next_seq, e->seq, memory_order_release);
    e->pool_id[0] = pool_id ? pool_id[0] : 0;
    e->pool_id[1] = pool_id ? pool_id[1] : 0;
    e->stack = stack;
    e->device = (int16_t)device;
    e->kind = (uint8_t)kind;
    trace_push(MS_TRACE_SEGMENT_ALLOC, device, addr, size, stream, pool_id, stack, now);
    trace_push(MS_TRACE_ALLOC, device, addr, size, stream, pool_id, stack, now);
    stats_alloc(device, size);
  }
  pthread_mutex_unlock(&R.mu);
}

uint64_t ms__run_free_begin(void) {
  return atomic_load_explicit(&R.next_seq, memory_order_acquire);
}

void ms__run_free_end(uint64_t addr, uint64_t begin, bool ok) {
  if (!ok || addr == 0 || addr == TOMB) return; /* a failed free changed nothing */
  int64_t now = (int64_t)rec_ticks();
  pthread_mutex_lock(&R.mu);
  live_t *e = tab_find(addr);
  /* Only an allocation made before the free began is the one freed; a newer one at the same
   * address (the driver reused it at once) already completed this free in ms__run_on_alloc. */
  if (e && e->seq <= begin) {
    R.ncalls++;
    complete_free(e, now);
  }
  pthread_mutex_unlock(&R.mu);
}

void ms__run_on_reset(int device) {
  int64_t now = (int64_t)rec_ticks();
  pthread_mutex_lock(&R.mu);
  R.ncalls++;
  for (size_t i = 0; i < R.cap; i++) {
    live_t *e = &R.tab[i];
    if (e->addr != 0 && e->addr != TOMB && e->device == device) complete_free(e, now);
  }
  pthread_mutex_unlock(&R.mu);
}

void ms__run_writer_lock(void) {
  pthread_mutex_lock(&R.snap_mu);
}
void ms__run_writer_unlock(void) {
  pthread_mutex_unlock(&R.snap_mu);
}

void ms__run_set_capacity(int device, uint64_t total) {
  if (device < 0 || device >= MS__RUN_MAX_DEVICES) return;
  pthread_mutex_lock(&R.mu);
  R.capacity[device] = total;
  pthread_mutex_unlock(&R.mu);
}

bool ms__run_capacity_known(int device) {
  if (device < 0 || device >= MS__RUN_MAX_DEVICES) return true;
  pthread_mutex_lock(&R.mu);
  bool k = R.capacity[device] != 0;
  pthread_mutex_unlock(&R.mu);
  return k;
}

static void held_bytes(int device, uint64_t *bytes, uint64_t *n) {
  *bytes = 0;
  *n = 0;
  for (size_t i = 0; i < R.cap; i++) {
    const live_t *e = &R.tab[i];
    if (e->addr == 0 || e->addr == TOMB || e->device != device) continue;
    *bytes += e->size;
    (*n)++;
  }
}

void ms__run_on_oom(const char *call, int device, uint64_t size, uint64_t stream,
                    uint64_t device_free, uint64_t device_total, uint32_t stack, bool from_cache) {
  if (device < 0 || device >= MS__RUN_MAX_DEVICES) device = 0;
  int64_t now = (int64_t)rec_ticks();
  uint64_t held = 0, nheld = 0;
  bool cache = from_cache;
  pthread_mutex_lock(&R.mu);
  R.ncalls++;
  note_device(device);
  if (device_total) R.capacity[device] = device_total;
  if (!cache) {
    trace_push(MS_TRACE_OOM, device, device_free, size, stream, NULL, stack, now);
    R.stats[device].num_ooms++;
  }
  held_bytes(device, &held, &nheld);
  uint64_t nth = ++R.nooms; /* 1 for the first OOM of the process */
  pthread_mutex_unlock(&R.mu);

  /* A program that probes for the largest allocation that fits fails many times in a row: the
   * first max_oom failures get a snapshot and a message, later ones are in the trace only. */
  unsigned max = ms__run_opts()->max_oom;
  if (nth > max) {
    if (nth == (uint64_t)max + 1)
      ms__message("memsnap: ",
                  "%llu out-of-memory errors: later ones are recorded in the trace "
                  "only, without snapshot or message (--max-oom-snapshots)",
                  (unsigned long long)nth);
    return;
  }
  char path[4096] = "";
  int err = ms__run_write("oom", device, path, sizeof path);
  char sz[32], fr[32], tot[32], hd[32];
  ms_format_size(size, sz, sizeof sz);
  ms_format_size(device_free, fr, sizeof fr);
  ms_format_size(device_total, tot, sizeof tot);
  ms_format_size(held, hd, sizeof hd);
  char where[4200];
  if (err == MS_OK)
    snprintf(where, sizeof where, "snapshot written to '%s'", path);
  else
    snprintf(where, sizeof where, "no snapshot written");
  if (cache)
    ms__message("memsnap: ",
                "out of memory: %s of %s on device %d failed "
                "(cudaErrorMemoryAllocation); the device has %s free of %s; %s",
                call, sz, device, fr, device_total ? tot : "?", where);
  else
    ms__message("memsnap: ",
                "out of memory: %s of %s on device %d failed "
                "(cudaErrorMemoryAllocation); the device has %s free of %s; the program holds "
                "%s in %llu allocation%s on it; %s",
                call, sz, device, fr, device_total ? tot : "?", hd, (unsigned long long)nheld,
                nheld == 1 ? "" : "s", where);
}

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
  tr.action = (ms_trace_action)e->action;
  if (!names[tr.action]) {
    const char *nm = ms_trace_action_name(tr.action);
    MS_FORWARD_IF_ERROR(ms__snapbuild_str(&t->b, nm, strlen(nm), &names[tr.action]));
  }
  tr.action_name = names[tr.action];
  tr.addr = e->addr;
  tr.size = e->size;
  tr.stream = e->stream;
  tr.time_us = time_us;
  tr.pool_id[0] = e->pool_id[0];
  tr.pool_id[1] = e->pool_id[1];
  tr.compile_context = "";
  tr.user_metadata = "";
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

/* Whether frame f is one of the interposer's hooks that call the cache mode's allocators. */
static bool is_hook_frame(const ms_snap_frame_t *f) {
  static const char *const hooks[] = {"cudaMalloc", "cudaMallocAsync", "cudaMallocAsync_ptsz"};
  bool named = false;
  for (size_t i = 0; i < sizeof hooks / sizeof *hooks; i++)
    if (strcmp(f->name, hooks[i]) == 0) named = true;
  if (!named) return false;
  size_t n = strlen(f->filename);
  return (n >= 9 && strcmp(f->filename + n - 9, "preload.c") == 0) ||
         (n >= 21 && strcmp(f->filename + n - 21, "libmemsnap_preload.so") == 0);
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
  for (uint32_t k = 0; k < st->nframes; k++)
    if (is_hook_frame(ms_snap_stack_frame(a, i, k))) {
      k0 = k + 1;
      break;
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
  MS_FORWARD_IF_ERROR(copy_str(t, src->action_name, &tr.action_name));
  MS_FORWARD_IF_ERROR(copy_str(t, src->compile_context, &tr.compile_context));
  MS_FORWARD_IF_ERROR(copy_str(t, src->user_metadata, &tr.user_metadata));
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
static int build(const copy_t *c, const ms_snapshot_t *a, int device, ms_snapshot_t **out,
                 ms_errbuf_t *eb) {
  clock_pair_t now = clock_pair();
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

  /* Segments by device and address: a's (already so) and the recorded ones, merged. */
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
      err = add_live_segment(&t, e, st_alloc);
      i++;
    } else {
      err = copy_segment(&t, a, map, g);
      k++;
    }
  }
  /* One device entry per index up to the highest, as PyTorch's device_traces. */
  int ndev = c->ndev;
  if (a && (int)a->ndevices > ndev) ndev = (int)a->ndevices;
  if (device >= 0) ndev = device + 1;
  for (int d = 0; d < ndev && err == MS_OK; d++) {
    ms_snap_device_t dev;
    memset(&dev, 0, sizeof dev);
    dev.first_trace = (uint32_t)t.b.trace.len;
    dev.first_stat = (uint32_t)t.b.stats.len;
    if (device >= 0 && d != device) {
      err = ms__snapbuild_add_device(&t.b, &dev);
      continue;
    }
    const ms_snap_device_t *ad = a && (size_t)d < a->ndevices ? &a->devices[d] : NULL;
    /* the trace: both oldest first, merged by time (a's first on a tie) */
    size_t ke = 0, ka = 0, nae = ad ? ad->ntrace : 0;
    while (err == MS_OK) {
      while (ke < c->nents && c->ents[ke].device != d)
        ke++;
      const ent_t *e = ke < c->nents ? &c->ents[ke] : NULL;
      const ms_snap_trace_t *x = ka < nae ? &a->trace[ad->first_trace + ka] : NULL;
      if (!e && !x) break;
      int64_t te = e ? ticks_to_us((uint64_t)e->time, now) : 0;
      if (e && (!x || te < x->time_us)) {
        err = add_ent_trace(&t, e, te, an);
        ke++;
      } else {
        err = copy_trace(&t, a, map, x);
        ka++;
      }
    }
    dev.ntrace = (uint32_t)(t.b.trace.len - dev.first_trace);
    dev.trace_dropped = c->dropped[d] + (ad ? ad->trace_dropped : 0);
    if (ad) { /* the allocator's statistics and capacity */
      for (uint32_t s2 = 0; s2 < ad->nstats && err == MS_OK; s2++) {
        ms_snap_kv_t kv = a->stats[ad->first_stat + s2];
        err = copy_str(&t, kv.key, &kv.key);
        if (err == MS_OK && kv.kind == MS_SNAP_VAL_STR) err = copy_str(&t, kv.s, &kv.s);
        if (err == MS_OK) err = ms__snapbuild_add_stat(&t.b, &kv);
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
        err = ms__snapbuild_str(&t.b, kv[s2].name, strlen(kv[s2].name), &e.key);
        e.kind = MS_SNAP_VAL_INT;
        e.i = kv[s2].value;
        if (err == MS_OK) err = ms__snapbuild_add_stat(&t.b, &e);
      }
      dev.nstats = (uint32_t)nkv;
      dev.present = MS_DEV_HAS_STATS;
    }
    if (!(dev.present & MS_DEV_HAS_CAPACITY) && c->capacity[d]) {
      dev.capacity = c->capacity[d];
      dev.present |= MS_DEV_HAS_CAPACITY;
    }
    if (err == MS_OK) err = ms__snapbuild_add_device(&t.b, &dev);
  }
  if (err == MS_OK && a) err = copy_settings(&t, a);
  if (err != MS_OK) goto out;

  char host[256];
  if (gethostname(host, sizeof host) != 0) host[0] = 0;
  host[sizeof host - 1] = 0;
  if ((err = ms__snapbuild_str(&t.b, host, strlen(host), &t.b.hdr.hostname)) != MS_OK) goto out;
  t.b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  t.b.hdr.pid = (int64_t)getpid();
  t.b.hdr.time_us = ms__now_us();
  t.b.hdr.rank = -1;
  t.b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_PROCESS;
  if (a && (a->present & MS_SNAP_HAS_SETTINGS)) t.b.hdr.present |= MS_SNAP_HAS_SETTINGS;
  const char *rank = getenv("RANK");
  if (rank && *rank) {
    char *end;
    long long v = strtoll(rank, &end, 10);
    if (!*end && v >= 0) {
      t.b.hdr.rank = v;
      t.b.hdr.present |= MS_SNAP_HAS_RANK;
    }
  }
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
    ms__warning("cannot write '%s': %s", path, eb.msg[0] ? eb.msg : ms_strerror(err));
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

int ms__run_write(const char *why, int device, char *path_out, size_t cap) {
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

/* ---- when snapshots are written ------------------------------------------------------------- */

void ms__run_stop(void) {
  pthread_mutex_lock(&R.snap_mu);
  R.exiting = true;
  pthread_mutex_unlock(&R.snap_mu);
}

static void on_exit_snapshot(void) {
  pthread_mutex_lock(&R.snap_mu);
  bool stopped = R.exiting;
  pthread_mutex_unlock(&R.snap_mu);
  if (stopped) return;
  pthread_mutex_lock(&R.mu);
  uint64_t calls = R.ncalls;
  pthread_mutex_unlock(&R.mu);
  if (calls == 0 && !(ms__run_cache_active() && ms__run_cache_devices())) return;
  ms__run_write("exit", -1, NULL, 0);
  pthread_mutex_lock(&R.snap_mu);
  R.exiting = true; /* the writer thread writes nothing after this */
  pthread_mutex_unlock(&R.snap_mu);
}

static void on_sigusr1(int sig) {
  (void)sig;
  int saved = errno;
  sem_post(&R.sem);
  errno = saved;
}

static void *writer_main(void *arg) {
  (void)arg;
  double every = ms__run_opts()->every;
  struct timespec next;
  clock_gettime(CLOCK_REALTIME, &next);
  for (;;) {
    int r;
    if (every > 0) {
      double secs = (double)next.tv_sec + next.tv_nsec / 1e9 + every;
      struct timespec now;
      clock_gettime(CLOCK_REALTIME, &now);
      if (secs < (double)now.tv_sec + now.tv_nsec / 1e9) /* fell behind: no catch-up burst */
        secs = (double)now.tv_sec + now.tv_nsec / 1e9 + every;
      next.tv_sec = (time_t)secs;
      next.tv_nsec = (long)((secs - (double)next.tv_sec) * 1e9);
      if (next.tv_nsec >= 1000000000L) next.tv_nsec = 999999999L;
      do
        r = sem_timedwait(&R.sem, &next);
      while (r != 0 && errno == EINTR);
      if (r != 0) {
        if (errno == ETIMEDOUT) ms__run_write("every", -1, NULL, 0);
        continue;
      }
    } else {
      do
        r = sem_wait(&R.sem);
      while (r != 0 && errno == EINTR);
      if (r != 0) return NULL;
    }
    ms__run_write("signal", -1, NULL, 0);
  }
  return NULL;
}

/* In a child of fork(), the parent's allocations are not the child's: start afresh (a child that
 * never calls CUDA writes nothing; one that does records its own calls under its own pid). */
static void atfork_child(void) {
  pthread_mutex_init(&R.mu, NULL);
  pthread_mutex_init(&R.snap_mu, NULL);
  R.count = R.used = 0;
  if (R.tab) memset(R.tab, 0, R.cap * sizeof *R.tab);
  R.ring_len = R.ring_head = 0;
  memset(R.dropped, 0, sizeof R.dropped);
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
    ms_stats_init(&R.stats[d]);
  R.ndev = 0;
  R.ncalls = 0;
  R.nooms = 0;
  R.thread_started = false;
  atomic_store(&R.nseq, 0);
}

static void start_once_fn(void) {
  const ms__run_opts_t *o = ms__run_opts();
  clock_base = clock_pair();
  pthread_mutex_lock(&R.mu);
  R.ring_max = o->max_entries;
  pthread_mutex_unlock(&R.mu);
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
    ms_stats_init(&R.stats[d]);
  if (o->depth) {
    ms__backtrace_init(); /* loads libgcc now, not inside a capture */
    if (ms__stacktab_create(&R.stacks) != MS_OK) R.stacks = NULL;
  }
  pthread_atfork(NULL, NULL, atfork_child);
  atexit(on_exit_snapshot);
  if (sem_init(&R.sem, 0, 0) != 0) return;
  bool want_signal = false;
  if (o->signal) {
    struct sigaction old;
    if (sigaction(SIGUSR1, NULL, &old) == 0 && old.sa_handler == SIG_DFL &&
        !(old.sa_flags & SA_SIGINFO)) {
      struct sigaction sa;
      memset(&sa, 0, sizeof sa);
      sa.sa_handler = on_sigusr1;
      sa.sa_flags = SA_RESTART;
      sigemptyset(&sa.sa_mask);
      want_signal = sigaction(SIGUSR1, &sa, NULL) == 0;
    } else {
      ms__warning("SIGUSR1 already has a handler in this program; 'kill -USR1' will not write "
                  "snapshots");
    }
  }
  if (want_signal || o->every > 0) {
    sigset_t all, old;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old); /* the thread takes none of the program's signals */
    pthread_t th;
    pthread_attr_t at;
    pthread_attr_init(&at);
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    R.thread_started = pthread_create(&th, &at, writer_main, NULL) == 0;
    pthread_attr_destroy(&at);
    pthread_sigmask(SIG_SETMASK, &old, NULL);
    if (!R.thread_started)
      ms__warning("cannot start the snapshot thread: no periodic or SIGUSR1 snapshots");
  }
}

void ms__run_start(void) {
  int saved = ms__run_in_hook;
  ms__run_in_hook = 1;
  pthread_once(&start_once, start_once_fn);
  ms__run_in_hook = saved;
}
