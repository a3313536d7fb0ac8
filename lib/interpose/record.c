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
#include <fcntl.h>
#include <pthread.h>
#include <semaphore.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/mman.h>
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

/* The recorder's state (run_internal.h); R within the module's files. */
ms__run_rec_t ms__run_R = {.mu = PTHREAD_MUTEX_INITIALIZER, .snap_mu = PTHREAD_MUTEX_INITIALIZER};
#define R ms__run_R

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

static clock_pair_t clock_base;

clock_pair_t ms__run_clock_pair(void) {
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

int64_t ms__run_ticks_to_us(uint64_t ticks, clock_pair_t now) {
  if (now.us <= clock_base.us || now.ticks <= clock_base.ticks) return now.us;
  double per_us = (double)(now.ticks - clock_base.ticks) / (double)(now.us - clock_base.us);
  double back = (double)(int64_t)(now.ticks - ticks) / per_us;
  return now.us - (int64_t)(back + 0.5);
}

/* ---- the live table (pre: R.mu held) ------------------------------------------------------ */

static live_t *tab_find(uint64_t addr) {
  if (!R.cap) return NULL;
  size_t mask = R.cap - 1;
  for (size_t j = slot_of(addr, mask);; j = (j + 1) & mask) {
    if (R.tab[j].addr == addr) return &R.tab[j];
    if (R.tab[j].addr == 0) return NULL;
  }
}

/* The live table and the ring take their memory straight from mmap, never from malloc, so that a
 * CUDA call made from a signal handler that interrupted malloc (issue #35 item 6) is recorded
 * without calling it: the recorded path is async-signal-safe but for the recorder's own mutex,
 * which the re-entrancy guard keeps a thread from taking twice (docs/run.md). */
static void *rec_map(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void rec_unmap(void *p, size_t bytes) {
  if (p && bytes) munmap(p, bytes);
}

/* Rehashes into a table of twice the size, or of the same size when tombstones filled it (a
 * program that allocates and frees in a loop does so every few hundred calls): that one reuses
 * the spare table of the last rehash, so the loop costs no system call. */
static int tab_grow(void) {
  size_t ncap = R.cap ? (R.count * 4 > R.cap ? R.cap * 2 : R.cap) : 1024;
  live_t *nt;
  if (ncap == R.cap && R.spare) {
    nt = R.spare;
    memset(nt, 0, ncap * sizeof *nt);
  } else {
    nt = rec_map(ncap * sizeof *nt); /* zeroed */
  }
  if (!nt) return MS_ENOMEM;
  for (size_t i = 0; i < R.cap; i++) {
    if (R.tab[i].addr == 0 || R.tab[i].addr == TOMB) continue;
    size_t j = slot_of(R.tab[i].addr, ncap - 1);
    while (nt[j].addr)
      j = (j + 1) & (ncap - 1);
    nt[j] = R.tab[i];
  }
  if (ncap == R.cap) {
    R.spare = R.tab;
  } else {
    rec_unmap(R.spare, R.cap * sizeof *R.spare);
    rec_unmap(R.tab, R.cap * sizeof *R.tab);
    R.spare = NULL;
  }
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
    ent_t *n = R.ring ? mremap(R.ring, R.ring_cap * sizeof *n, ncap * sizeof *n, MREMAP_MAYMOVE)
                      : rec_map(ncap * sizeof *n);
    if (n == MAP_FAILED) n = NULL;
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

/* Reads a small /proc file whole (no stdio: no allocation). @return its length, -1 on error. */
static ssize_t read_small(const char *path, char *buf, size_t cap) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return -1;
  ssize_t n = read(fd, buf, cap - 1);
  close(fd);
  if (n >= 0) buf[n] = 0;
  return n;
}

/* Whether the program's own threads have all ended, so that only the writer thread (the caller)
 * keeps the process alive: the main thread ended with pthread_exit (it stays a zombie until the
 * process ends) and no other thread is left. glibc's last thread would have called exit(0). */
static bool program_ended(void) {
  char buf[1024], path[64];
  if (read_small("/proc/self/stat", buf, sizeof buf) <= 0) return false;
  const char *p = strrchr(buf, ')'); /* after the command name, which may hold anything */
  long num_threads = 0;
  /* fields after ')': state (3), ..., num_threads (20) */
  for (int field = 2; p && *p; p++) {
    if (*p != ' ') continue;
    if (++field == 20) {
      num_threads = strtol(p + 1, NULL, 10);
      break;
    }
  }
  if (num_threads != 2) return false; /* the writer and a zombie main thread, nothing else */
  snprintf(path, sizeof path, "/proc/self/task/%ld/stat", (long)getpid());
  if (read_small(path, buf, sizeof buf) <= 0) return false;
  p = strrchr(buf, ')');
  return p && p[1] == ' ' && (p[2] == 'Z' || p[2] == 'X');
}

static double now_s(void) {
  struct timespec t;
  clock_gettime(CLOCK_REALTIME, &t);
  return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* How often the writer looks whether the program has ended (item 2 of issue #35). */
#define WRITER_POLL_S 0.1

static void *writer_main(void *arg) {
  (void)arg;
  double every = ms__run_opts()->every;
  double next_every = every > 0 ? now_s() + every : 0;
  double next_poll = now_s() + WRITER_POLL_S;
  for (;;) {
    double now = now_s();
    double until = next_poll > now ? next_poll : now + WRITER_POLL_S;
    if (every > 0 && next_every < until) until = next_every;
    struct timespec ts;
    ts.tv_sec = (time_t)until;
    ts.tv_nsec = (long)((until - (double)ts.tv_sec) * 1e9);
    if (ts.tv_nsec >= 1000000000L) ts.tv_nsec = 999999999L;
    int r;
    do
      r = sem_timedwait(&R.sem, &ts);
    while (r != 0 && errno == EINTR);
    if (r == 0) {
      ms__run_write("signal", -1, NULL, 0);
      continue;
    }
    if (errno != ETIMEDOUT) return NULL;
    now = now_s();
    if (every > 0 && now >= next_every) {
      ms__run_write("every", -1, NULL, 0);
      next_every += every;
      if (next_every < now_s()) next_every = now_s() + every; /* fell behind: no catch-up burst */
    }
    /* The program's threads are gone: end the process as its last thread would have (glibc
     * calls exit(0) there), which also writes the exit snapshot. */
    if (now >= next_poll) {
      next_poll = now + WRITER_POLL_S;
      /* under the writer's lock, which fork's prepare handler takes: a child never inherits
       * the state of a half-done look (a sanitizer's allocator lock, say) */
      pthread_mutex_lock(&R.snap_mu);
      bool ended = program_ended();
      pthread_mutex_unlock(&R.snap_mu);
      if (ended) exit(0);
    }
  }
  return NULL;
}

/* ---- fork: the child's record is its own ----------------------------------------------------
 * Before fork, the forking thread takes the interposer's locks (preload.c's, then the writer's,
 * then the recorder's, in the order the interposer nests them), so that no other thread is halfway
 * through a snapshot or a recorded call when the process is copied. The parent releases them. The
 * child starts afresh: an empty record, a fresh stack table (another thread of the parent may have
 * held one of the old table's locks), no writer thread, SIGUSR1 back to its default action when
 * the handler was ours, and no cache-mode allocator (preload.c): it behaves as a program that has
 * not called CUDA yet. Its first CUDA call starts the recorder again, under its own pid. */
static bool proc_started; /* the per-process part of ms__run_start ran (under start_mu) */
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;

static void fork_prepare(void) {
  ms__run_preload_fork(MS__RUN_FORK_PREPARE);
  pthread_mutex_lock(&start_mu);
  pthread_mutex_lock(&R.snap_mu);
  pthread_mutex_lock(&R.mu);
}

static void fork_parent(void) {
  pthread_mutex_unlock(&R.mu);
  pthread_mutex_unlock(&R.snap_mu);
  pthread_mutex_unlock(&start_mu);
  ms__run_preload_fork(MS__RUN_FORK_PARENT);
}

/* In a child of fork, the parent's stack table (volatile: kept, though never read again). */
static ms__stacktab_t *volatile stacks_forked_away;

static void fork_child(void) {
  pthread_mutex_init(&R.mu, NULL);
  pthread_mutex_init(&R.snap_mu, NULL);
  pthread_mutex_init(&start_mu, NULL);
  R.count = R.used = 0;
  if (R.tab) memset(R.tab, 0, R.cap * sizeof *R.tab);
  R.ring_len = R.ring_head = 0;
  memset(R.dropped, 0, sizeof R.dropped);
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
    ms_stats_init(&R.stats[d]);
  memset(R.capacity, 0, sizeof R.capacity);
  R.ndev = 0;
  R.ncalls = 0;
  R.nooms = 0;
  atomic_store(&R.next_seq, 0);
  atomic_store(&R.nseq, 0);
  if (R.stacks) { /* the parent's table is left as it is: one of its locks may be held */
    stacks_forked_away = R.stacks;
    ms__stacktab_t *t = NULL;
    R.stacks = ms__stacktab_create(&t) == MS_OK ? t : NULL;
  }
  struct sigaction cur;
  if (sigaction(SIGUSR1, NULL, &cur) == 0 && !(cur.sa_flags & SA_SIGINFO) &&
      cur.sa_handler == on_sigusr1) {
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigemptyset(&dfl.sa_mask);
    sigaction(SIGUSR1, &dfl, NULL);
  }
  R.thread_started = false;
  proc_started = false;
  ms__run_preload_fork(MS__RUN_FORK_CHILD);
}

/* Once per process image: the exit snapshot and the fork handlers (both inherited by children). */
static void start_once_fn(void) {
  const ms__run_opts_t *o = ms__run_opts();
  clock_base = ms__run_clock_pair();
  pthread_mutex_lock(&R.mu);
  R.ring_max = o->max_entries;
  pthread_mutex_unlock(&R.mu);
  for (int d = 0; d < MS__RUN_MAX_DEVICES; d++)
    ms_stats_init(&R.stats[d]);
  if (o->depth) {
    ms__backtrace_init(); /* loads libgcc now, not inside a capture */
    if (ms__stacktab_create(&R.stacks) != MS_OK) R.stacks = NULL;
  }
  pthread_atfork(fork_prepare, fork_parent, fork_child);
  atexit(on_exit_snapshot);
}

/* Once per process (again in a child of fork): the SIGUSR1 handler and the writer thread. */
static void start_process(void) {
  const ms__run_opts_t *o = ms__run_opts();
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
  if (ms_unlikely(!__atomic_load_n(&proc_started, __ATOMIC_ACQUIRE))) {
    pthread_mutex_lock(&start_mu);
    if (!proc_started) {
      start_process();
      __atomic_store_n(&proc_started, true, __ATOMIC_RELEASE);
    }
    pthread_mutex_unlock(&start_mu);
  }
  ms__run_in_hook = saved;
}
