/* SPDX-License-Identifier: MIT
 * memsnap core: the history recorder of one allocator (one device): the hooks the allocator calls
 * (alloc/hooks.h), the trace ring buffer, the recording switches, and the OOM snapshot pattern
 * (the observer that writes the file is snapshot/oom.c).
 *
 * A recorder is created by the first ms_allocator_record_history (or ms_oom_snapshot_install) on
 * an allocator and installed as its hooks; it is found again through ms__allocator_get_hooks. It
 * is never uninstalled: switching recording off sets the hooks' context level and trace switch to
 * 0 (the allocator then calls nothing), so the stack ids kept in blocks stay valid. The recorder
 * lives as long as its allocator: ms_allocator_destroy calls the hooks' release, which takes it
 * off the process-wide list and frees it (ring, stack table, OOM pattern).
 *
 * Locks: the gather hook runs outside the allocator's lock from any thread (the stack table is
 * lock-striped); the trace hook runs under the allocator's lock and takes the ring's own mutex,
 * which snapshots also take to copy the ring. The ring grows on demand up to max_entries.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc/alloc_internal.h"
#include "history/history_internal.h"
#include "common/internal.h"

struct ms__recorder_s {
  ms__gather_ctx_t g;      /* first: hooks.ctx == this recorder == its gather context */
  ms__alloc_hooks_t hooks;
  ms_allocator_t *alloc;
  int device;

  pthread_mutex_t lock;    /* guards everything below */
  ms_history_config_t cfg;
  ms__trace_ent_t *ring;
  size_t ring_alloc;       /* allocated entries (grows up to ring_cap) */
  size_t ring_cap;         /* max_entries while tracing */
  size_t ring_head;        /* next slot to write, once the ring is full */
  size_t ring_len;
  uint64_t dropped;
  int64_t last_time;       /* ticks of the newest entry */
  char *oom_pattern;       /* NULL until ms_oom_snapshot_install */

  struct ms__recorder_s *next; /* process-wide list */
};

static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static ms__recorder_t *reg_head;
static atomic_size_t live_recorders; /* recorders created and not yet released */

int64_t ms__now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (int64_t)ts.tv_sec * 1000000 + ts.tv_nsec / 1000;
}

/* ---- time of trace entries --------------------------------------------------------------------
 * Like PyTorch (approximate TSC converted to unix time at snapshot time), an entry stores clock
 * ticks, cheaper to read than the wall clock (rdtsc on x86-64; the monotonic clock elsewhere),
 * and copies convert them with the rates measured between the first recorder's creation and the
 * copies (below): the error of a converted time is about that of reading the two clocks
 * together. */
#if defined(__x86_64__) || defined(__i386__)
static inline uint64_t hist_ticks(void) { return __builtin_ia32_rdtsc(); }
#else
static inline uint64_t hist_ticks(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}
#endif

typedef struct clock_pair_s {
  uint64_t ticks;
  int64_t us;
} clock_pair_t;

/* Reads ticks and the wall clock together (the tightest of three tries). */
static clock_pair_t clock_pair(void) {
  clock_pair_t best = {0, 0};
  uint64_t gap = UINT64_MAX;
  for (int i = 0; i < 3; i++) {
    uint64_t t0 = hist_ticks();
    int64_t us = ms__now_us();
    uint64_t t1 = hist_ticks();
    if (t1 - t0 < gap) {
      gap = t1 - t0;
      best.ticks = t0 + (t1 - t0) / 2;
      best.us = us;
    }
  }
  return best;
}

static pthread_once_t clock_once = PTHREAD_ONCE_INIT;
static clock_pair_t clock_base;
static void clock_init(void) { clock_base = clock_pair(); }

/* The calibration points: the base, then the two clocks read at each copy, kept for good. The
 * ticks between two points are converted with the rate between them, so that an entry has the
 * same time in every copy that holds it. (Converting each copy with the rate from the base to
 * its own reading gave an entry's time in two snapshots 1 us apart, now and then.) */
static pthread_mutex_t clock_lock = PTHREAD_MUTEX_INITIALIZER;
static clock_pair_t *clock_points;
static size_t clock_npoints, clock_cap;

/* Adds the reading now as the newest point (when both clocks moved on). Lock held. */
static void clock_mark_locked(void) {
  if (!clock_npoints) {
    clock_points = malloc(16 * sizeof *clock_points);
    if (!clock_points) return;
    clock_cap = 16;
    clock_points[clock_npoints++] = clock_base;
  }
  clock_pair_t now = clock_pair(), last = clock_points[clock_npoints - 1];
  if (now.us <= last.us || now.ticks <= last.ticks) return;
  if (clock_npoints == clock_cap) {
    clock_pair_t *p = realloc(clock_points, 2 * clock_cap * sizeof *p);
    if (!p) return; /* the newest entries are then placed from the last point's rate */
    clock_points = p;
    clock_cap *= 2;
  }
  clock_points[clock_npoints++] = now;
}

/* Unix microseconds of ticks: from the point at or after it, back with the rate of the segment
 * it lies in (past the newest point: forward with the newest segment's rate). Lock held. */
static int64_t ticks_to_us_locked(uint64_t ticks) {
  if (clock_npoints < 2) return clock_npoints ? clock_points[0].us : ms__now_us();
  size_t lo = 1, hi = clock_npoints - 1; /* the first point k >= 1 with ticks <= its ticks */
  if (ticks > clock_points[hi].ticks) {
    lo = hi;
  } else {
    while (lo < hi) {
      size_t mid = lo + (hi - lo) / 2;
      if (clock_points[mid].ticks >= ticks)
        hi = mid;
      else
        lo = mid + 1;
    }
  }
  clock_pair_t a = clock_points[lo - 1], b = clock_points[lo];
  double per_us = (double)(b.ticks - a.ticks) / (double)(b.us - a.us);
  double back = (double)(int64_t)(b.ticks - ticks) / per_us;
  return b.us - (int64_t)(back + (back < 0 ? -0.5 : 0.5));
}

void ms_history_config_init(ms_history_config_t *cfg) {
  memset(cfg, 0, sizeof *cfg);
  cfg->enabled = MS_HISTORY_ALL;
  cfg->context = MS_CONTEXT_ALL;
  cfg->max_entries = 1000000;
  cfg->max_frames = 32;
  cfg->unwinder = MS_UNWIND_BACKTRACE;
  cfg->clear_history = false;
}

/* ---- hooks --------------------------------------------------------------------------------- */

/* Appends one entry; pre: r->lock held. */
static void ring_push(ms__recorder_t *r, const ms__trace_ent_t *e) {
  if (r->ring_cap == 0) return;
  if (r->ring_len < r->ring_cap) {
    if (r->ring_len == r->ring_alloc) {
      size_t na = r->ring_alloc ? r->ring_alloc * 2 : 1024;
      if (na > r->ring_cap) na = r->ring_cap;
      ms__trace_ent_t *nr = realloc(r->ring, na * sizeof *nr);
      if (!nr) { /* host memory is short: treat the ring as full at its current size */
        if (r->ring_len == 0) {
          r->dropped++;
          return;
        }
        r->ring_cap = r->ring_len;
        r->ring_head = 0; /* not wrapped yet: the oldest entry is in slot 0 */
        goto wrap;
      }
      r->ring = nr;
      r->ring_alloc = na;
    }
    r->ring[r->ring_len++] = *e;
    r->ring_head = r->ring_len % r->ring_cap;
    return;
  }
wrap:
  r->ring[r->ring_head] = *e;
  r->ring_head = (r->ring_head + 1) % r->ring_cap;
  r->dropped++;
}

void ms__recorder_trace(ms__recorder_t *r, const ms__trace_rec_t *rec) {
  ms__trace_ent_t e;
  e.addr = rec->addr;
  e.size = rec->size;
  e.stream = rec->stream;
  e.time = (int64_t)hist_ticks();
  e.pool_id[0] = rec->pool_id[0];
  e.pool_id[1] = rec->pool_id[1];
  e.ctx = rec->ctx;
  e.action = (uint8_t)rec->action;
  pthread_mutex_lock(&r->lock);
  if (e.time < r->last_time) e.time = r->last_time; /* entries stay in time order */
  r->last_time = e.time;
  ring_push(r, &e);
  pthread_mutex_unlock(&r->lock);
}

static void history_trace(void *ctx, const ms__trace_rec_t *rec) { ms__recorder_trace(ctx, rec); }

/* The release hook: ms_allocator_destroy is done with the recorder (no call of the allocator can
 * be running or follow, so no hook either). */
static void history_release(void *ctx) {
  ms__recorder_t *r = ctx;
  pthread_mutex_lock(&reg_lock);
  for (ms__recorder_t **link = &reg_head; *link; link = &(*link)->next) {
    if (*link == r) {
      *link = r->next;
      break;
    }
  }
  atomic_fetch_sub_explicit(&live_recorders, 1, memory_order_relaxed);
  pthread_mutex_unlock(&reg_lock);
  ms__stacktab_destroy(r->g.stacks);
  free(r->ring);
  free(r->oom_pattern);
  pthread_mutex_destroy(&r->lock);
  free(r);
}

size_t ms__recorder_live_count(void) {
  return atomic_load_explicit(&live_recorders, memory_order_relaxed);
}

/* ---- the recorder -------------------------------------------------------------------------- */

ms__recorder_t *ms__recorder_of(ms_allocator_t *a) {
  const ms__alloc_hooks_t *h = ms__allocator_get_hooks(a);
  if (!h || h->gather != ms__gather) return NULL;
  return (ms__recorder_t *)h->ctx;
}

ms__stacktab_t *ms__recorder_stacks(ms__recorder_t *r) { return r->g.stacks; }

int ms__recorder_tracing(ms__recorder_t *r) {
  pthread_mutex_lock(&r->lock);
  int on = r->ring_cap > 0;
  pthread_mutex_unlock(&r->lock);
  return on;
}

void ms__recorder_config(ms__recorder_t *r, ms_history_config_t *out) {
  pthread_mutex_lock(&r->lock);
  *out = r->cfg;
  pthread_mutex_unlock(&r->lock);
}

int ms__recorder_copy_trace(ms__recorder_t *r, ms__trace_ent_t **out, size_t *n,
                            uint64_t *dropped) {
  pthread_mutex_lock(&r->lock);
  size_t len = r->ring_len;
  ms__trace_ent_t *copy = NULL;
  if (len) {
    copy = malloc(len * sizeof *copy);
    if (!copy) {
      pthread_mutex_unlock(&r->lock);
      return MS_ENOMEM;
    }
    /* Oldest first: from the write position when the ring is full, else from slot 0. */
    size_t start = len == r->ring_cap ? r->ring_head : 0;
    size_t first = len - start;
    memcpy(copy, r->ring + start, first * sizeof *copy);
    memcpy(copy + first, r->ring, start * sizeof *copy);
    pthread_mutex_lock(&clock_lock);
    clock_mark_locked();
    for (size_t i = 0; i < len; i++) copy[i].time = ticks_to_us_locked((uint64_t)copy[i].time);
    pthread_mutex_unlock(&clock_lock);
  }
  *dropped = r->dropped;
  pthread_mutex_unlock(&r->lock);
  *out = copy;
  *n = len;
  return MS_OK;
}

/* Empties the ring and releases its memory; pre: r->lock held. */
static void ring_clear(ms__recorder_t *r) {
  free(r->ring);
  r->ring = NULL;
  r->ring_alloc = r->ring_len = r->ring_head = 0;
  r->dropped = 0;
}

/* Changes the capacity, keeping the newest entries that fit; pre: r->lock held. */
static int ring_resize(ms__recorder_t *r, size_t cap) {
  if (cap == r->ring_cap) return MS_OK;
  size_t keep = r->ring_len < cap ? r->ring_len : cap;
  ms__trace_ent_t *nr = NULL;
  if (keep) {
    nr = malloc(keep * sizeof *nr);
    if (!nr) return MS_ENOMEM;
    size_t start = r->ring_len == r->ring_cap ? r->ring_head : 0; /* oldest */
    for (size_t i = 0; i < keep; i++)
      nr[i] = r->ring[(start + r->ring_len - keep + i) % r->ring_cap];
  }
  r->dropped += r->ring_len - keep;
  free(r->ring);
  r->ring = nr;
  r->ring_alloc = r->ring_len = keep;
  r->ring_cap = cap;
  r->ring_head = cap ? keep % cap : 0;
  return MS_OK;
}

/* Finds or creates the recorder of a; pre: reg_lock held. */
static int recorder_get(ms_allocator_t *a, ms__recorder_t **out) {
  ms__recorder_t *r = ms__recorder_of(a);
  if (r) {
    *out = r;
    return MS_OK;
  }
  pthread_once(&clock_once, clock_init);
  r = calloc(1, sizeof *r);
  if (!r) return MS_ENOMEM;
  if (ms__stacktab_create(&r->g.stacks) != MS_OK) {
    free(r);
    return MS_ENOMEM;
  }
  pthread_mutex_init(&r->lock, NULL);
  r->alloc = a;
  r->device = ms_allocator_device(a);
  ms_history_config_init(&r->cfg);
  r->cfg.enabled = MS_HISTORY_OFF;
  r->cfg.context = MS_CONTEXT_NONE;
  atomic_store(&r->g.depth, r->cfg.max_frames);
  r->hooks.ctx = r;
  r->hooks.gather = ms__gather;
  r->hooks.trace = history_trace;
  r->hooks.release = history_release;
  r->next = reg_head;
  reg_head = r;
  atomic_fetch_add_explicit(&live_recorders, 1, memory_order_relaxed);
  ms__allocator_set_hooks(a, &r->hooks);
  *out = r;
  return MS_OK;
}

static int config_check(const ms_history_config_t *c, ms_errbuf_t *eb) {
  if ((unsigned)c->enabled > MS_HISTORY_ALL)
    return ms__errbuf_set(eb, MS_EINVAL, "expected enabled to be off, state or all, got %d",
                          (int)c->enabled);
  if ((unsigned)c->context > MS_CONTEXT_ALL)
    return ms__errbuf_set(eb, MS_EINVAL,
                          "expected context to be none, state, alloc or all, got %d",
                          (int)c->context);
  if ((unsigned)c->unwinder > MS_UNWIND_FRAME_POINTER)
    return ms__errbuf_set(eb, MS_EINVAL, "unknown unwinder %d", (int)c->unwinder);
  if (c->max_frames < 1 || c->max_frames > MS_HISTORY_MAX_FRAMES)
    return ms__errbuf_set(eb, MS_EINVAL, "max_frames must be in [1, %d], got %u",
                          MS_HISTORY_MAX_FRAMES, c->max_frames);
  if (c->enabled == MS_HISTORY_ALL && c->max_entries < 1)
    return ms__errbuf_set(eb, MS_EINVAL, "max_entries must be at least 1");
  if (c->max_entries > SIZE_MAX / sizeof(ms__trace_ent_t))
    return ms__errbuf_set(eb, MS_EINVAL, "max_entries %zu is too large", c->max_entries);
  return MS_OK;
}

/* Applies cfg to r; pre: reg_lock held (serialises reconfigurations). */
static int recorder_apply(ms__recorder_t *r, const ms_history_config_t *cfg) {
  pthread_mutex_lock(&r->lock);
  int err = MS_OK;
  if (cfg->enabled == MS_HISTORY_ALL) {
    err = ring_resize(r, cfg->max_entries);
    if (err == MS_OK && cfg->clear_history) ring_clear(r);
  } else {
    ring_clear(r);
    r->ring_cap = 0;
  }
  if (err == MS_OK) r->cfg = *cfg;
  r->cfg.clear_history = false;
  pthread_mutex_unlock(&r->lock);
  if (err != MS_OK) return err;
  atomic_store(&r->g.depth, cfg->max_frames);
  atomic_store(&r->g.unwinder, (int)cfg->unwinder);
  /* The allocator reads these two fields at each call. */
  int level = cfg->enabled == MS_HISTORY_OFF ? MS__CTX_NEVER : (int)cfg->context;
  __atomic_store_n(&r->hooks.context_level, level, __ATOMIC_RELAXED);
  __atomic_store_n(&r->hooks.trace_enabled, cfg->enabled == MS_HISTORY_ALL, __ATOMIC_RELAXED);
  return MS_OK;
}

int ms_allocator_record_history(ms_allocator_t *a, const ms_history_config_t *cfg,
                                ms_errbuf_t *eb) {
  if (!a) return ms__errbuf_set(eb, MS_EINVAL, "no allocator");
  ms_history_config_t def;
  if (!cfg) {
    ms_history_config_init(&def);
    cfg = &def;
  }
  MS_FORWARD_IF_ERROR(config_check(cfg, eb));
  if (cfg->context != MS_CONTEXT_NONE && cfg->enabled != MS_HISTORY_OFF) ms__backtrace_init();
  pthread_mutex_lock(&reg_lock);
  ms__recorder_t *r = ms__recorder_of(a);
  int err = MS_OK;
  if (r || cfg->enabled != MS_HISTORY_OFF) {
    err = recorder_get(a, &r);
    if (err == MS_OK) err = recorder_apply(r, cfg);
  }
  pthread_mutex_unlock(&reg_lock);
  if (err != MS_OK) return ms__errbuf_set(eb, err, "cannot record history: %s", ms_strerror(err));
  return MS_OK;
}

/* ---- the OOM snapshot pattern (the observer is snapshot/oom.c's) ----------------------------- */

int ms__recorder_set_oom(ms_allocator_t *a, char *pattern, ms_oom_observer_fn *fn) {
  pthread_mutex_lock(&reg_lock);
  ms__recorder_t *r = ms__recorder_of(a);
  int err = MS_OK;
  if (!r) {
    /* No recording yet: the trace without stacks, so the file shows the oom entry. */
    err = recorder_get(a, &r);
    if (err == MS_OK) {
      ms_history_config_t cfg;
      ms_history_config_init(&cfg);
      cfg.context = MS_CONTEXT_NONE;
      err = recorder_apply(r, &cfg);
    }
  }
  int attach = 0;
  if (err == MS_OK) {
    pthread_mutex_lock(&r->lock);
    attach = r->oom_pattern == NULL;
    char *old = r->oom_pattern;
    r->oom_pattern = pattern;
    pattern = old; /* freed below (NULL on the first install) */
    pthread_mutex_unlock(&r->lock);
    if (attach) err = ms_allocator_attach_oom_observer(a, fn, r);
    if (err != MS_OK) {
      pthread_mutex_lock(&r->lock);
      pattern = r->oom_pattern;
      r->oom_pattern = NULL;
      pthread_mutex_unlock(&r->lock);
    }
  }
  pthread_mutex_unlock(&reg_lock);
  free(pattern);
  return err;
}

void ms__recorder_oom_pattern(ms__recorder_t *r, char *buf, size_t cap) {
  buf[0] = 0;
  pthread_mutex_lock(&r->lock);
  if (r->oom_pattern) snprintf(buf, cap, "%s", r->oom_pattern);
  pthread_mutex_unlock(&r->lock);
}

ms_allocator_t *ms__recorder_allocator(ms__recorder_t *r) { return r->alloc; }
