/* SPDX-License-Identifier: MIT
 * memsnap core: internal interfaces of the history recorder, shared by backtrace.c (stack capture
 * and the stack table), symbolize.c (addresses to {name, filename, line}), history.c (the
 * recorder: hooks, ring buffer, OOM observer) and snapshot_take.c (allocators to ms_snapshot_t).
 *
 * Vocabulary:
 *  - pc: a raw return address as captured (backtrace(3) or the frame-pointer walk). Stacks are
 *    arrays of pcs, innermost first.
 *  - stack id: a uint32_t >= 1 naming one distinct interned stack in an ms__stacktab_t; 0 means
 *    "no stack". Ids are the allocator's context ids (lib/alloc_hooks.h): they stay valid until
 *    the table is destroyed, and the pcs of an id never move.
 *  - trace record: one entry of a device's ring buffer (ms__trace_ent_t), 56 bytes.
 */
#ifndef MEMSNAP_LIB_HISTORY_INTERNAL_H
#define MEMSNAP_LIB_HISTORY_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "alloc/hooks.h"
#include "memsnap/history.h"
#include "model/snapbuild.h"

/* ---- "backtrace.c" --------------------------------------------------------------------------- */

/* The deepest stack a capture keeps (frames after the skipped ones). */
#define MS__MAX_FRAMES 128

/* Calls backtrace(3) once so that libgcc is loaded before any allocator lock is held (its first
 * call dlopens libgcc_s, which allocates). Idempotent, thread-safe. */
void ms__backtrace_init(void);

/* Captures the calling thread's stack with backtrace(3). pcs[0] is a return address inside the
 * function that called ms__capture_backtrace when skip == 0, inside its caller when skip == 1,
 * and so on. pre: max <= MS__MAX_FRAMES, skip <= 16. @return the number of pcs stored.
 * Thread-safety: any thread. */
size_t ms__capture_backtrace(uintptr_t *pcs, size_t max, size_t skip);

/* The same with the frame-pointer walk (same skip convention). Every step is checked (the next
 * frame lies above the current one, is aligned, and stays inside the thread's stack as given by
 * pthread_getattr_np). A walk is complete when it reaches max frames, a null link (a thread's
 * first frame), or a known end of this thread's chain; any other stop means the chain is broken
 * (a frame without a frame pointer), and the stack is taken with backtrace(3) instead. Ends are
 * learnt from those fallbacks: the outermost frame on which the walk agreed with backtrace(3).
 * Thread-safety: any thread. */
size_t ms__capture_fp(uintptr_t *pcs, size_t max, size_t skip);

/* What the gather hook needs: where to intern, how deep, which unwinder. The recorder (history.c)
 * starts with one, and installs ms__gather with itself as the hook's ctx. */
typedef struct ms__gather_ctx_s {
  struct ms__stacktab_s *stacks;
  _Atomic unsigned depth; /* frames per stack */
  _Atomic int unwinder;   /* ms_unwinder */
} ms__gather_ctx_t;

/* The allocator's gather hook (lib/alloc_hooks.h): captures the calling thread's stack from the
 * allocator function that called it outwards (the hook's own frame is not kept) and interns it.
 * ctx is an ms__gather_ctx_t. @return the stack id, 0 when host memory ran out.
 * Thread-safety: any thread. */
uint32_t ms__gather(void *ctx);

/* Counters of the frame-pointer walker for this process (tests, docs). */
typedef struct ms__fp_stats_s {
  uint64_t walks;     /* ms__capture_fp calls */
  uint64_t fallbacks; /* stacks taken with backtrace(3) because the chain looked broken */
} ms__fp_stats_t;
void ms__fp_stats(ms__fp_stats_t *out);

/* The stack table: each distinct stack stored once. Lock-striped (16 stripes chosen by hash), so
 * threads capturing different stacks rarely contend. */
typedef struct ms__stacktab_s ms__stacktab_t;

int ms__stacktab_create(ms__stacktab_t **out);
void ms__stacktab_destroy(ms__stacktab_t *t);
/* Interns pcs[0..n). @return the stack's id (>= 1), or 0 when host memory ran out (or the table
 * is full). Thread-safety: any thread. */
uint32_t ms__stacktab_intern(ms__stacktab_t *t, const uintptr_t *pcs, size_t n);
/* The pcs of id; *n receives their number. @return NULL for an unknown id. The array lives until
 * the table is destroyed. Thread-safety: any thread. */
const uintptr_t *ms__stacktab_get(ms__stacktab_t *t, uint32_t id, size_t *n);
/* Number of distinct stacks and bytes of pcs stored. Thread-safety: any thread. */
size_t ms__stacktab_count(ms__stacktab_t *t);
size_t ms__stacktab_bytes(ms__stacktab_t *t);

/* ---- "symbolize.c" --------------------------------------------------------------------------- */

typedef struct ms__symbolizer_s ms__symbolizer_t;

typedef struct ms__sym_s {
  const char *name;     /* function name; "module+0xoffset" when no symbol covers the address */
  const char *filename; /* source file (DWARF), else the module's path, else "??" */
  int64_t line;         /* source line, 0 when unknown */
  const char *module;   /* path of the module, "" when unknown */
} ms__sym_t;

/* Creates a symbolizer for this process (libdw when built with it, else dladdr).
 * Thread-safety: one thread at a time per symbolizer. */
int ms__symbolizer_create(ms__symbolizer_t **out);
void ms__symbolizer_destroy(ms__symbolizer_t *s);
/* The most functions one address expands to when inlined calls are expanded, besides the
 * function that contains it. */
#define MS__SYM_MAX_INLINE 15

/* Describes the return address pc (the call site pc - 1 is looked up) as *n >= 1 frames,
 * innermost first: the functions inlined at the call site (with DWARF), then the function that
 * contains it; *out points to them. Each distinct pc is resolved once and remembered; everything
 * lives until the symbolizer is destroyed. @return MS_OK or MS_ENOMEM. */
int ms__symbolize(ms__symbolizer_t *s, uintptr_t pc, const ms__sym_t **out, size_t *n);
/* @return "libdw" or "dladdr": what resolves names and lines in this build. */
const char *ms__symbolizer_kind(void);

/* ---- "history.c" ----------------------------------------------------------------------------- */

/* One trace entry of the ring buffer (<= 64 bytes; docs/dev/measurements.md, "Trace entry
 * size"). */
typedef struct ms__trace_ent_s {
  uint64_t addr;
  uint64_t size;
  uint64_t stream;
  int64_t time;       /* in the ring: clock ticks (history.c); in copies: unix microseconds */
  int64_t pool_id[2];
  uint32_t ctx;       /* stack id, 0 = none */
  uint8_t action;     /* ms_trace_action */
} ms__trace_ent_t;

typedef struct ms__recorder_s ms__recorder_t;

/* @return the recorder attached to a (NULL when history was never recorded on it). */
ms__recorder_t *ms__recorder_of(ms_allocator_t *a);
/* The recorder's stack table. */
ms__stacktab_t *ms__recorder_stacks(ms__recorder_t *r);
/* Copies the ring buffer, oldest first, into a new array (*out, *n, to free()); *dropped gets the
 * number of entries lost to wrap-around. @return MS_OK or MS_ENOMEM. */
int ms__recorder_copy_trace(ms__recorder_t *r, ms__trace_ent_t **out, size_t *n,
                            uint64_t *dropped);
/* Appends an entry as the trace hook does (used for the `snapshot` entry). */
void ms__recorder_trace(ms__recorder_t *r, const ms__trace_rec_t *rec);
/* Whether trace entries are being recorded. */
int ms__recorder_tracing(ms__recorder_t *r);
/* Sets the OOM snapshot pattern of a's recorder (one tracing without stacks is created when history
 * was never recorded), taking ownership of pattern, and attaches fn (arg: the recorder) the first
 * time. Used by the OOM observer (snapshot/oom.c). @return MS_OK or MS_ENOMEM. */
int ms__recorder_set_oom(ms_allocator_t *a, char *pattern, ms_oom_observer_fn *fn);
/* Copies the OOM pattern into buf ("" when none). */
void ms__recorder_oom_pattern(ms__recorder_t *r, char *buf, size_t cap);
/* The allocator r records. */
ms_allocator_t *ms__recorder_allocator(ms__recorder_t *r);
/* Current config of the recorder. */
void ms__recorder_config(ms__recorder_t *r, ms_history_config_t *out);
/* Number of recorders alive in this process (created by recording on an allocator, freed when it
 * is destroyed); for tests. */
size_t ms__recorder_live_count(void);
/* Unix time in microseconds. */
int64_t ms__now_us(void);

#endif /* MEMSNAP_LIB_HISTORY_INTERNAL_H */
