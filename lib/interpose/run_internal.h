/* SPDX-License-Identifier: MIT
 * memsnap run: internal interface of the interposer (libmemsnap_preload.so, issue #18), shared by
 * preload.c (the exported CUDA runtime functions, forwarding, the cache mode) and record.c (the
 * observe-mode recorder: live allocations, the trace, statistics, snapshots and when they are
 * written). docs/run.md describes the whole.
 *
 * Vocabulary:
 *  - a call: one device-memory call of the program (cudaMalloc, cudaFreeAsync, ...), recorded
 *    only when it succeeded (or failed with out-of-memory, an `oom` entry);
 *  - a live entry: one allocation the program holds, keyed by address;
 *  - a stack id: an id of the recorder's interned stack table (0 = none).
 *
 * Thread-safety: every function here may be called from any thread. One mutex guards the live
 * table, the trace and the statistics; it is taken only inside intercepted CUDA calls, never on
 * the program's other paths. Snapshots are built outside it (a copy is taken under it).
 */
#ifndef MEMSNAP_LIB_INTERPOSE_RUN_INTERNAL_H
#define MEMSNAP_LIB_INTERPOSE_RUN_INTERNAL_H

#include <pthread.h>
#include <semaphore.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "history/history_internal.h"
#include "memsnap/allocator.h"
#include "memsnap/history.h"
#include "memsnap/snapshot.h"
#include "memsnap/stats.h"

/* Highest device index recorded + 1. */
#define MS__RUN_MAX_DEVICES 64

typedef enum ms__run_mode { MS__RUN_OBSERVE = 0, MS__RUN_CACHE = 1 } ms__run_mode;

/* What kind of call made an allocation. */
typedef enum ms__run_kind {
  MS__RUN_KIND_MALLOC = 0,  /* cudaMalloc */
  MS__RUN_KIND_ASYNC = 1,   /* cudaMallocAsync / cudaMallocFromPoolAsync */
  MS__RUN_KIND_MANAGED = 2, /* cudaMallocManaged (recorded, never cached) */
} ms__run_kind;

/* The private pool id under which cudaMallocManaged allocations are recorded, so that views can
 * tell them apart (--pool) from device memory. */
#define MS__RUN_MANAGED_POOL_FIRST 0
#define MS__RUN_MANAGED_POOL_SECOND (-1)

/* Options, from the environment (MEMSNAP_RUN_*, set by `memsnap run`). */
typedef struct ms__run_opts_s {
  ms__run_mode mode;
  char pattern[4096]; /* -o: %p pid, %n sequence, %d device, %% */
  double every;       /* seconds between periodic snapshots, 0 = none */
  unsigned depth;     /* frames per stack, 0 = no stacks */
  int unwinder;       /* ms_unwinder */
  size_t max_entries; /* trace ring capacity (all devices) */
  bool quiet;         /* no "snapshot written" lines (OOM messages are always printed) */
  bool signal;        /* SIGUSR1 writes a snapshot */
  unsigned max_oom;   /* OOM snapshots and messages written at most; later OOMs are traced only */
} ms__run_opts_t;

/* Reads the options from the environment (invalid values: a warning, the default kept). */
void ms__run_opts_read(ms__run_opts_t *o);

/* The options in force (read once). */
const ms__run_opts_t *ms__run_opts(void);

/* Starts the recorder (the stack table, the writer thread when --every or SIGUSR1 want it, the
 * exit snapshot). Called at the first intercepted call that records; idempotent. */
void ms__run_start(void);

/* Captures the calling thread's stack and interns it, as a hook does: the innermost frame is a
 * return address inside the caller of the function that called ms__run_stack (skip = 0; each
 * unit of skip leaves out one more frame). @return its id, 0 when stacks are off or host memory
 * ran out. */
uint32_t ms__run_stack(unsigned skip);

/* The recorder's stack table (NULL when stacks are off). */
ms__stacktab_t *ms__run_stacks(void);

/* ms__run_stack(0) inlined into its caller: the hooks use it, so that a backtrace(3) capture
 * unwinds one frame less (about 0.1 us a frame). The hook's own frame is left out: the innermost
 * frame is the program's call of the CUDA function, so that views grouping by the innermost frame
 * (`top --by frame`, the timeline's top stacks) name the program's functions. */
#define MS__RUN_STACK_HERE(out)                                                                    \
  do {                                                                                             \
    const ms__run_opts_t *o_ = ms__run_opts();                                                     \
    ms__stacktab_t *t_ = ms__run_stacks();                                                         \
    (out) = 0;                                                                                     \
    if (o_->depth && t_) {                                                                         \
      uintptr_t pcs_[MS__MAX_FRAMES];                                                              \
      size_t max_ = o_->depth < MS__MAX_FRAMES ? o_->depth : MS__MAX_FRAMES;                       \
      size_t n_ = o_->unwinder == MS_UNWIND_BACKTRACE ? ms__capture_backtrace(pcs_, max_, 1)       \
                                                      : ms__capture_fp(pcs_, max_, 1);             \
      if (n_) (out) = ms__stacktab_intern(t_, pcs_, n_);                                           \
    }                                                                                              \
  } while (0)

/* Records a successful allocation. */
void ms__run_on_alloc(int device, uint64_t addr, uint64_t size, uint64_t stream,
                      const int64_t pool_id[2], uint32_t stack, ms__run_kind kind);

/* A free begins: @return a token (the newest allocation's sequence number), taken without a
 * lock, to pass to ms__run_free_end. */
uint64_t ms__run_free_begin(void);
/* The free of addr that began with token `begin` returned: ok = the real call succeeded (the
 * allocation is traced as freed and removed; nothing happens for an address never recorded, or
 * when the call failed). */
void ms__run_free_end(uint64_t addr, uint64_t begin, bool ok);

/* Records an out-of-memory error of `call` (e.g. "cudaMalloc") for size bytes on device, writes
 * the OOM snapshot and prints the OOM message on stderr. device_free/total: the device's memory
 * as cudaMemGetInfo said right after the failure (total 0 = unknown). from_cache: the cache mode's
 * allocator failed (it recorded the `oom` entry and counted it itself). Called by the failing
 * thread before the error is returned to the program. */
void ms__run_on_oom(const char *call, int device, uint64_t size, uint64_t stream,
                    uint64_t device_free, uint64_t device_total, uint32_t stack, bool from_cache);

/* cudaDeviceReset succeeded on device: every allocation recorded on it was freed by the reset
 * (traced as freed now). */
void ms__run_on_reset(int device);

/* Excludes snapshot writing (while a cache-mode allocator is destroyed). */
void ms__run_writer_lock(void);
void ms__run_writer_unlock(void);

/* The device's total memory, once known (from cudaMemGetInfo). */
void ms__run_set_capacity(int device, uint64_t total);
/* @return whether the device's total memory is known. */
bool ms__run_capacity_known(int device);

/* Builds a snapshot of what the recorder holds (device < 0: every device; else that one). In
 * cache mode the allocators' snapshot (ms__run_cache_snapshot) is merged with the recorder's
 * passthrough allocations (cudaMallocManaged, explicit pools, pitched). */
int ms__run_take(int device, ms_snapshot_t **out, ms_errbuf_t *eb);

/* Writes the snapshot(s) for `why` ("exit", "oom", "signal", "every"): one file, or one per
 * device when the pattern has %d (device >= 0: only that device). *path_out (may be NULL)
 * receives the last path written. @return MS_OK or an error (a warning was printed). */
int ms__run_write(const char *why, int device, char *path_out, size_t cap);

/* Stops writing: no snapshot is written after this, not even at exit (tests). */
void ms__run_stop(void);

/* ---- cache mode (preload.c) ---------------------------------------------------------------- */

/* Whether the cache mode serves allocations. */
bool ms__run_cache_active(void);
/* Snapshot of the cache mode's allocators (device < 0: all of them); *out = NULL when none has
 * been created yet. */
int ms__run_cache_snapshot(int device, ms_snapshot_t **out, ms_errbuf_t *eb);
/* Device indices served by the cache mode (bit d set for device d < 64). */
uint64_t ms__run_cache_devices(void);

/* The phases of fork() (pthread_atfork's handlers, registered by record.c at the first call). */
typedef enum ms__run_fork_phase {
  MS__RUN_FORK_PREPARE = 0, /* in the forking thread, before: take the locks */
  MS__RUN_FORK_PARENT = 1,  /* in the parent, after: release them */
  MS__RUN_FORK_CHILD = 2,   /* in the child: forget the parent's allocators, reset the locks */
} ms__run_fork_phase;
/* preload.c's part of the fork handlers; its locks are taken before the recorder's. */
void ms__run_preload_fork(ms__run_fork_phase phase);

/* Whether a loaded object other than the interposer defines the function name (visible.c): the
 * exported functions' resolvers ask it. Calls no function (it may run before libc is set up). */
bool ms__run_defined_elsewhere(const char *name);

/* Thread-local re-entrancy guard of the hooks: set while the interposer itself works (a CUDA
 * call made then goes straight to the real function, unrecorded). */
extern __thread int ms__run_in_hook __attribute__((tls_model("initial-exec")));

/* ---- the recorder's state (record.c; snapshot.c copies it) -------------------------------- */

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

/* One mutex, mu, guards the live table, the ring and the statistics; snap_mu serialises the
 * writers (record.c's file comment). */
typedef struct ms__run_rec_s {
  pthread_mutex_t mu;
  /* live table */
  live_t *tab;
  live_t *spare;             /* a table of cap slots kept for the next rehash at the same size */
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
} ms__run_rec_t;
extern ms__run_rec_t ms__run_R;

/* The slot of a key in an open-addressing table of mask + 1 slots. */
static inline size_t slot_of(uint64_t addr, size_t mask) {
  uint64_t h = addr * 0x9E3779B97F4A7C15ULL;
  return (size_t)(h >> 17) & mask;
}

/* A clock reading in ticks and in unix microseconds, taken together. */
typedef struct clock_pair_s {
  uint64_t ticks;
  int64_t us;
} clock_pair_t;

clock_pair_t ms__run_clock_pair(void);
/* A trace entry's ticks as unix microseconds, at the rate measured between the start and now. */
int64_t ms__run_ticks_to_us(uint64_t ticks, clock_pair_t now);

#endif /* MEMSNAP_LIB_INTERPOSE_RUN_INTERNAL_H */
