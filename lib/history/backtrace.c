/* SPDX-License-Identifier: MIT
 * memsnap core: raw stack capture and the stack table (the only user of <execinfo.h>).
 *
 * Stacks are captured as raw return addresses and symbolised only when a snapshot is taken
 * (style.md §20; docs/dev/measurements.md, "Stack capture"). Two unwinders:
 *  - backtrace(3): works on any build, about 0.1 us per frame (3.3 us at depth 32 here);
 *  - a frame-pointer walk: about 1 ns per frame, for programs built with -fno-omit-frame-pointer.
 *    Each step is checked; a chain that stops short of the thread's outermost frame (a frame
 *    without a frame pointer clobbered rbp) falls back to backtrace(3) for that stack.
 *
 * The stack table interns stacks with the strong hash of util/hash.h (heaptrack's weak hash once
 * made its interning blow up: docs/dev/measurements.md, "Interning stacks"). It is split into 16
 * stripes, each with its own mutex, open-addressing table (load <= 1/2, the hash's high bits kept
 * beside the id so that a probe rarely touches the stored pcs) and arena; stored stacks never
 * move. Its memory comes straight from mmap, never from malloc, so that interning is
 * async-signal-safe but for the stripe's mutex: `memsnap run`'s interposer interns the stack of a
 * CUDA call that a signal handler made, maybe while the thread it interrupted held malloc's lock
 * (issue #35 item 6).
 */
#include <execinfo.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "history/history_internal.h"
#include "common/internal.h"
#include "common/hash.h"

/* ---- backtrace(3) ---------------------------------------------------------------------------- */

static pthread_once_t bt_once = PTHREAD_ONCE_INIT;
static int bt_extra = 0; /* frames an interposed backtrace adds before its caller's (set once) */

/* Finds how many frames backtrace(3) reports before its caller's: 0 with glibc's, 1 when
 * AddressSanitizer interposes it. */
__attribute__((noinline)) static int bt_calibrate(void) {
  void *buf[16];
  uintptr_t ret0 = (uintptr_t)__builtin_return_address(0);
  int n = backtrace(buf, 16);
  int extra = 0;
  for (int j = 1; j < n; j++)
    if ((uintptr_t)buf[j] == ret0) {
      extra = j - 1;
      break;
    }
  __asm__ volatile("" ::: "memory");
  return extra;
}

static void bt_warm(void) { bt_extra = bt_calibrate(); }

void ms__backtrace_init(void) { pthread_once(&bt_once, bt_warm); }

/* backtrace(3) reports the frames of whatever implements it first (AddressSanitizer intercepts
 * it, adding its own frame), then the caller's. The first entry that equals our own return
 * address is our caller's frame: counting from there makes `skip` exact whatever sits in
 * between. @return the index in buf of the caller's frame, skip applied. */
static int bt_start(void *const *buf, int n, uintptr_t ret0, size_t skip) {
  int j = 0;
  while (j < n && (uintptr_t)buf[j] != ret0) j++;
  if (j == n) j = 1; /* not found (cannot happen with a sound unwinder): glibc's layout */
  return j + (int)skip;
}

#define BT_SLACK 8 /* the most frames an interposed backtrace may add */

/* backtrace(3) into pcs, from the frame whose return address is ret0 (the caller of the function
 * that inlines this), skip applied. */
static inline __attribute__((always_inline)) size_t bt_capture(uintptr_t *pcs, size_t max,
                                                               size_t skip, uintptr_t ret0) {
  void *buf[MS__MAX_FRAMES + 16 + BT_SLACK + 1];
  if (max > MS__MAX_FRAMES) max = MS__MAX_FRAMES;
  if (skip > 16) skip = 16;
  ms__backtrace_init();
  int n = backtrace(buf, (int)(max + skip + 1 + (bt_extra < BT_SLACK ? bt_extra : BT_SLACK)));
  size_t got = 0;
  for (int i = bt_start(buf, n, ret0, skip); i < n && got < max; i++)
    pcs[got++] = (uintptr_t)buf[i];
  return got;
}

__attribute__((noinline)) size_t ms__capture_backtrace(uintptr_t *pcs, size_t max, size_t skip) {
  size_t got = bt_capture(pcs, max, skip, (uintptr_t)__builtin_return_address(0));
  __asm__ volatile("" ::: "memory"); /* keeps this frame (no tail call) */
  return got;
}

/* ---- frame-pointer walk ---------------------------------------------------------------------- */

struct fp_frame {
  struct fp_frame *next; /* the caller's saved frame pointer */
  void *ret;             /* the return address into the caller */
};

/* Where a thread's frame chain legitimately ends. Outer frames often belong to code built
 * without frame pointers (libc's __libc_start_call_main, a test harness, an interpreter): there
 * the saved-rbp slot holds anything, and the chain stops or goes astray. An end is learnt by
 * checking a walk against backtrace(3): the last frame whose return address agreed becomes an
 * end, identified by its address and return address. Later walks that reach a known end are
 * complete; walks that stop anywhere else fall back to backtrace(3) (and teach a new end). */
#define FP_ENDS 8
typedef struct fp_end_s {
  uintptr_t frame;
  uintptr_t ret;
} fp_end_t;

static __thread uintptr_t fp_lo, fp_hi; /* this thread's stack */
static __thread int fp_bounds_known;
static __thread fp_end_t fp_ends[FP_ENDS];
static __thread unsigned fp_nends, fp_next_end;
static __thread uintptr_t fp_min_end = UINTPTR_MAX; /* lowest frame address of an end */
static atomic_ulong fp_walks, fp_fallbacks;

static void fp_bounds(void) {
  pthread_attr_t attr;
  void *addr = NULL;
  size_t size = 0;
  fp_bounds_known = 1;
  if (pthread_getattr_np(pthread_self(), &attr) != 0) return;
  if (pthread_attr_getstack(&attr, &addr, &size) == 0) {
    fp_lo = (uintptr_t)addr;
    fp_hi = (uintptr_t)addr + size;
  }
  pthread_attr_destroy(&attr);
}

static int fp_is_end(uintptr_t frame, uintptr_t ret) {
  for (unsigned i = 0; i < fp_nends; i++)
    if (fp_ends[i].frame == frame && fp_ends[i].ret == ret) return 1;
  return 0;
}

static void fp_add_end(uintptr_t frame, uintptr_t ret) {
  if (fp_is_end(frame, ret)) return;
  fp_ends[fp_next_end] = (fp_end_t){frame, ret};
  fp_next_end = (fp_next_end + 1) % FP_ENDS;
  if (fp_nends < FP_ENDS) fp_nends++;
  fp_min_end = UINTPTR_MAX;
  for (unsigned i = 0; i < fp_nends; i++)
    if (fp_ends[i].frame < fp_min_end) fp_min_end = fp_ends[i].frame;
}

/* Walks from frame f, storing up to max return addresses after dropping `skip`, and the frame
 * address of each stored one in frames[]. @return the count; *complete says whether the walk
 * ended properly (max reached, a known end, or a null link: the outermost frame of a thread). */
static size_t fp_walk(struct fp_frame *f, uintptr_t *pcs, uintptr_t *frames, size_t max,
                      size_t skip, int *complete) {
  size_t got = 0, seen = 0;
  uintptr_t lo = fp_lo, hi = fp_hi, min_end = fp_min_end;
  *complete = 0;
  while (got < max) {
    uintptr_t fa = (uintptr_t)f;
    if (fa < lo || fa > hi - sizeof *f || (fa & (sizeof(void *) - 1))) return got;
    uintptr_t ret = (uintptr_t)f->ret;
    if (ret == 0) return got;
    if (seen++ >= skip) {
      frames[got] = fa;
      pcs[got++] = ret;
    }
    if (fa >= min_end && fp_is_end(fa, ret)) break;
    uintptr_t next = (uintptr_t)f->next;
    if (next == 0) break; /* the outermost frame of a thread (clone zeroes rbp) */
    if (next <= fa) return got; /* frames lie at higher addresses as the walk goes out */
    f = (struct fp_frame *)next;
  }
  *complete = 1;
  return got;
}

__attribute__((noinline)) size_t ms__capture_fp(uintptr_t *pcs, size_t max, size_t skip) {
  if (max > MS__MAX_FRAMES) max = MS__MAX_FRAMES;
  if (skip > 16) skip = 16;
  if (ms_unlikely(!fp_bounds_known)) fp_bounds();
  atomic_fetch_add_explicit(&fp_walks, 1, memory_order_relaxed);
  uintptr_t frames[MS__MAX_FRAMES];
  int complete = 0;
  size_t got = 0;
  if (fp_hi)
    got = fp_walk((struct fp_frame *)__builtin_frame_address(0), pcs, frames, max, skip,
                  &complete);
  if (complete) {
    __asm__ volatile("" ::: "memory");
    return got;
  }
  /* Broken (or not yet known) end: take backtrace(3), and learn the last frame on which the walk
   * agreed with it. backtrace's buf[0] lies in this function, the walk's first pc in our caller. */
  atomic_fetch_add_explicit(&fp_fallbacks, 1, memory_order_relaxed);
  void *buf[MS__MAX_FRAMES + 16 + BT_SLACK + 1];
  uintptr_t ret0 = (uintptr_t)__builtin_return_address(0);
  ms__backtrace_init();
  int n = backtrace(buf, (int)(max + skip + 1 + (bt_extra < BT_SLACK ? bt_extra : BT_SLACK)));
  int start = bt_start(buf, n, ret0, skip);
  size_t bt = 0;
  if (start < n) bt = (size_t)(n - start) < max ? (size_t)(n - start) : max;
  size_t agree = 0;
  while (agree < got && agree < bt && pcs[agree] == (uintptr_t)buf[start + (int)agree]) agree++;
  if (agree > 0) fp_add_end(frames[agree - 1], pcs[agree - 1]);
  for (size_t i = 0; i < bt; i++) pcs[i] = (uintptr_t)buf[start + (int)i];
  __asm__ volatile("" ::: "memory");
  return bt;
}

void ms__fp_stats(ms__fp_stats_t *out) {
  out->walks = atomic_load(&fp_walks);
  out->fallbacks = atomic_load(&fp_fallbacks);
}

/* The gather hook. backtrace(3) is called from this very frame (bt_capture is inlined), so the
 * unwind costs exactly what a plain backtrace of max_frames does plus this one frame; the
 * frame-pointer walk goes through ms__capture_fp, whose extra frame costs a nanosecond. */
__attribute__((noinline)) uint32_t ms__gather(void *ctx) {
  ms__gather_ctx_t *g = ctx;
  uintptr_t pcs[MS__MAX_FRAMES];
  unsigned depth = atomic_load_explicit(&g->depth, memory_order_relaxed);
  size_t n;
  if (atomic_load_explicit(&g->unwinder, memory_order_relaxed) == MS_UNWIND_FRAME_POINTER)
    n = ms__capture_fp(pcs, depth, 1);
  else
    n = bt_capture(pcs, depth, 0, (uintptr_t)__builtin_return_address(0));
  uint32_t id = ms__stacktab_intern(g->stacks, pcs, n);
  __asm__ volatile("" ::: "memory");
  return id;
}

/* ---- stack table ----------------------------------------------------------------------------- */

#ifndef ST_STRIPES
#define ST_STRIPES 16 /* a power of two, at most 1 << ST_STRIPE_BITS */
#endif
#define ST_STRIPE_BITS 4
#define ST_LOCAL_MAX ((UINT32_MAX >> ST_STRIPE_BITS) - 1)
#define ST_CHUNK_BYTES 65536 /* an arena chunk: 64 KiB with its header */

typedef struct st_slot_s {
  uint32_t tag; /* high 32 bits of the hash */
  uint32_t idx; /* local index + 1; 0 = empty */
} st_slot_t;

typedef struct st_chunk_s {
  struct st_chunk_s *next;
  size_t used, cap;
  uintptr_t words[];
} st_chunk_t;

typedef struct st_stripe_s {
  pthread_mutex_t lock;
  st_slot_t *slots;
  size_t cap; /* power of two */
  struct {
    const uintptr_t **ptr;
    size_t len, cap;
  } recs; /* local index -> record: [n, pcs...] */
  st_chunk_t *chunks;
  size_t bytes;
  char pad[64];
} st_stripe_t;

struct ms__stacktab_s {
  uint64_t serial; /* unique in the process: keys the per-thread cache */
  st_stripe_t stripes[ST_STRIPES];
};

/* Each thread remembers the last stack it interned: an allocation loop captures the same stack
 * again and again, and a plain comparison then replaces the hash, the lock and the probe. */
static atomic_ulong st_serials;
static __thread struct {
  uint64_t serial; /* table of the cached stack; 0 = none */
  uint32_t id;
  uint32_t n;
  uintptr_t pcs[MS__MAX_FRAMES];
} st_last;

static uint64_t st_hash(const uintptr_t *pcs, size_t n) {
  return ms_hash_bytes(pcs, n * sizeof *pcs, 0x5ac4ab1eULL);
}

/* Zeroed memory from the kernel (NULL when there is none). */
static void *st_map(size_t bytes) {
  void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? NULL : p;
}

static void st_unmap(void *p, size_t bytes) {
  if (p && bytes) munmap(p, bytes);
}

int ms__stacktab_create(ms__stacktab_t **out) {
  ms__stacktab_t *t = calloc(1, sizeof *t);
  if (!t) return MS_ENOMEM;
  for (int i = 0; i < ST_STRIPES; i++) pthread_mutex_init(&t->stripes[i].lock, NULL);
  t->serial = atomic_fetch_add(&st_serials, 1) + 1;
  *out = t;
  return MS_OK;
}

void ms__stacktab_destroy(ms__stacktab_t *t) {
  if (!t) return;
  for (int i = 0; i < ST_STRIPES; i++) {
    st_stripe_t *s = &t->stripes[i];
    st_unmap(s->slots, s->cap * sizeof *s->slots);
    st_unmap(s->recs.ptr, s->recs.cap * sizeof *s->recs.ptr);
    for (st_chunk_t *c = s->chunks, *n; c; c = n) {
      n = c->next;
      st_unmap(c, sizeof *c + c->cap * sizeof(uintptr_t));
    }
    pthread_mutex_destroy(&s->lock);
  }
  free(t);
}

static uintptr_t *st_alloc(st_stripe_t *s, size_t words) {
  st_chunk_t *c = s->chunks;
  if (!c || c->cap - c->used < words) {
    size_t cap = (ST_CHUNK_BYTES - sizeof(st_chunk_t)) / sizeof(uintptr_t);
    if (words > cap) cap = words;
    st_chunk_t *nc = st_map(sizeof *nc + cap * sizeof(uintptr_t));
    if (!nc) return NULL;
    nc->used = 0;
    nc->cap = cap;
    nc->next = c;
    s->chunks = c = nc;
    s->bytes += cap * sizeof(uintptr_t);
  }
  uintptr_t *p = c->words + c->used;
  c->used += words;
  return p;
}

static int st_grow(st_stripe_t *s) {
  if ((s->recs.len + 1) * 2 <= s->cap) return MS_OK;
  size_t ncap = s->cap ? s->cap * 2 : 256;
  st_slot_t *ns = st_map(ncap * sizeof *ns);
  if (!ns) return MS_ENOMEM;
  for (size_t i = 0; i < s->cap; i++) {
    st_slot_t v = s->slots[i];
    if (!v.idx) continue;
    const uintptr_t *r = s->recs.ptr[v.idx - 1];
    size_t j = (size_t)st_hash(r + 1, r[0]) & (ncap - 1);
    while (ns[j].idx) j = (j + 1) & (ncap - 1);
    ns[j] = v;
  }
  st_unmap(s->slots, s->cap * sizeof *s->slots);
  s->slots = ns;
  s->cap = ncap;
  return MS_OK;
}

/* Room for one more record index. */
static int st_recs_reserve(st_stripe_t *s) {
  if (s->recs.len < s->recs.cap) return MS_OK;
  size_t ncap = s->recs.cap ? s->recs.cap * 2 : 512;
  const uintptr_t **n = st_map(ncap * sizeof *n);
  if (!n) return MS_ENOMEM;
  if (s->recs.len) memcpy(n, s->recs.ptr, s->recs.len * sizeof *n);
  st_unmap(s->recs.ptr, s->recs.cap * sizeof *s->recs.ptr);
  s->recs.ptr = n;
  s->recs.cap = ncap;
  return MS_OK;
}

uint32_t ms__stacktab_intern(ms__stacktab_t *t, const uintptr_t *pcs, size_t n) {
  if (st_last.serial == t->serial && st_last.n == n &&
      memcmp(st_last.pcs, pcs, n * sizeof *pcs) == 0)
    return st_last.id;
  uint64_t h = st_hash(pcs, n);
  unsigned si = (unsigned)(h >> 60) & (ST_STRIPES - 1);
  uint32_t tag = (uint32_t)(h >> 32);
  st_stripe_t *s = &t->stripes[si];
  uint32_t id = 0;
  pthread_mutex_lock(&s->lock);
  if (s->cap) {
    size_t mask = s->cap - 1;
    for (size_t j = (size_t)h & mask;; j = (j + 1) & mask) {
      st_slot_t v = s->slots[j];
      if (!v.idx) break;
      if (v.tag != tag) continue;
      const uintptr_t *r = s->recs.ptr[v.idx - 1];
      if (r[0] == n && memcmp(r + 1, pcs, n * sizeof *pcs) == 0) {
        id = ((v.idx - 1) << ST_STRIPE_BITS | si) + 1;
        goto out;
      }
    }
  }
  if (s->recs.len >= ST_LOCAL_MAX || st_grow(s) != MS_OK || st_recs_reserve(s) != MS_OK)
    goto out;
  uintptr_t *r = st_alloc(s, n + 1);
  if (!r) goto out;
  r[0] = n;
  if (n) memcpy(r + 1, pcs, n * sizeof *pcs);
  size_t mask = s->cap - 1, j = (size_t)h & mask;
  while (s->slots[j].idx) j = (j + 1) & mask;
  s->recs.ptr[s->recs.len++] = r;
  s->slots[j].tag = tag;
  s->slots[j].idx = (uint32_t)s->recs.len;
  id = ((uint32_t)(s->recs.len - 1) << ST_STRIPE_BITS | si) + 1;
out:
  pthread_mutex_unlock(&s->lock);
  if (id && n <= MS__MAX_FRAMES) {
    st_last.serial = t->serial;
    st_last.id = id;
    st_last.n = (uint32_t)n;
    memcpy(st_last.pcs, pcs, n * sizeof *pcs);
  }
  return id;
}

const uintptr_t *ms__stacktab_get(ms__stacktab_t *t, uint32_t id, size_t *n) {
  if (id == 0) return NULL;
  uint32_t v = id - 1;
  st_stripe_t *s = &t->stripes[v & (ST_STRIPES - 1)];
  size_t local = v >> ST_STRIPE_BITS;
  const uintptr_t *r = NULL;
  pthread_mutex_lock(&s->lock);
  if (local < s->recs.len) r = s->recs.ptr[local];
  pthread_mutex_unlock(&s->lock);
  if (!r) return NULL;
  *n = r[0];
  return r + 1;
}

size_t ms__stacktab_count(ms__stacktab_t *t) {
  size_t c = 0;
  for (int i = 0; i < ST_STRIPES; i++) {
    pthread_mutex_lock(&t->stripes[i].lock);
    c += t->stripes[i].recs.len;
    pthread_mutex_unlock(&t->stripes[i].lock);
  }
  return c;
}

size_t ms__stacktab_bytes(ms__stacktab_t *t) {
  size_t c = 0;
  for (int i = 0; i < ST_STRIPES; i++) {
    st_stripe_t *s = &t->stripes[i];
    pthread_mutex_lock(&s->lock);
    c += s->bytes + s->cap * sizeof(st_slot_t) + s->recs.cap * sizeof(void *);
    pthread_mutex_unlock(&s->lock);
  }
  return c;
}
