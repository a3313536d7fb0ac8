/* SPDX-License-Identifier: MIT
 * Tests for allocation history and snapshots of the allocator (issue #3 §1-3, §5, §6): stacks of
 * a test's own allocations name its functions and, with debug information, its file and line;
 * the allocator's own frames are left out; the trace holds PyTorch's actions and fields; the ring
 * buffer wraps and counts what it dropped; recording switched on midway, state-only, the context
 * levels, switching off; the process fields; several devices; threads; the OOM observer's file,
 * read back; take -> write -> read.
 * Compiled with -fno-omit-frame-pointer (tests/CMakeLists.txt), linked with -rdynamic. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "alloc/alloc_internal.h"
#include "helpers.h"
#include "history/history_internal.h"
#include "memsnap/allocator.h"
#include "memsnap/history.h"
#include "memsnap/serialize.h"

/* These tests check that stacks name the test's own static functions, which needs libdw
 * (docs/history.md); a build without it (MEMSNAP_WITH_LIBDW=OFF) says SKIP for them. */
#ifdef MS_HAVE_LIBDW
#define NEED_LIBDW() ((void)0)
#else
#define NEED_LIBDW() cr_skip_test("SKIP: built without libdw: static function names unresolved")
#endif

#define NOINLINE __attribute__((noinline))
#define KEEP_FRAME() __asm__ volatile("" ::: "memory")
#define MiB ((size_t)1 << 20)

static ms_backend_t *be;
static ms_allocator_t *al;

static void setup_n(int ndev, size_t capacity) {
  ms_sim_config_t c = {.ndevices = ndev, .capacity = capacity};
  cr_assert_eq(ms_backend_sim_create(&c, &be), MS_OK);
  ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_create(&ac, &al, &eb), MS_OK, "%s", eb.msg);
}
static void setup(void) { setup_n(1, 1024 * MiB); }
static void teardown(void) {
  ms_allocator_destroy(al);
  ms_backend_destroy(be);
}

static void record(ms_history_record en, ms_history_context ctx, size_t max_entries,
                   ms_unwinder uw) {
  ms_history_config_t c;
  ms_history_config_init(&c);
  c.enabled = en;
  c.context = ctx;
  c.max_entries = max_entries;
  c.unwinder = uw;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_record_history(al, &c, &eb), MS_OK, "%s", eb.msg);
}

static ms_snapshot_t *take(void) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  eb.msg[0] = 0;
  cr_assert_eq(ms_allocator_snapshot(&al, 1, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static const ms_snap_block_t *block_at(const ms_snapshot_t *s, uint64_t addr) {
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].address == addr) return &s->blocks[i];
  cr_assert_fail("no block at 0x%llx", (unsigned long long)addr);
  return NULL;
}

static int ends_with(const char *s, const char *suffix) {
  size_t a = strlen(s), b = strlen(suffix);
  return a >= b && strcmp(s + a - b, suffix) == 0;
}

/* ---- stacks of our own allocations ---------------------------------------------------------- */

static int malloc_line;

NOINLINE static ms_devptr_t alloc_inner(size_t size) {
  ms_devptr_t p = 0;
  malloc_line = __LINE__ + 1;
  int r = ms_allocator_malloc(al, size, 0, &p);
  cr_assert_eq(r, MS_OK);
  KEEP_FRAME();
  return p;
}

NOINLINE static ms_devptr_t alloc_outer(size_t size) {
  ms_devptr_t p = alloc_inner(size);
  KEEP_FRAME();
  return p;
}

static void check_own_frames(ms_unwinder uw) {
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, uw);
  ms_devptr_t p = alloc_outer(1000);
  ms_snapshot_t *s = take();
  const ms_snap_block_t *b = block_at(s, p);
  cr_assert_eq(b->state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_neq(b->stack, MS_SNAP_NO_STACK);
  uint32_t depth = ms_snap_stack_depth(s, b->stack);
  cr_assert_geq(depth, 3, "depth %u", depth);
  const ms_snap_frame_t *f0 = ms_snap_stack_frame(s, b->stack, 0);
  const ms_snap_frame_t *f1 = ms_snap_stack_frame(s, b->stack, 1);
  /* innermost first, the allocator's own frames left out */
  cr_assert_str_eq(f0->name, "alloc_inner");
  cr_assert_str_eq(f1->name, "alloc_outer");
  for (uint32_t i = 0; i < depth; i++) {
    const char *n = ms_snap_stack_frame(s, b->stack, i)->name;
    cr_assert(strncmp(n, "ms_", 3) != 0 && strcmp(n, "ms__gather") != 0, "frame %u: %s", i,
              n);
  }
  if (strcmp(ms__symbolizer_kind(), "libdw") == 0) {
    cr_assert(ends_with(f0->filename, "tests/test_history.c"), "file %s", f0->filename);
    cr_assert_eq(f0->line, malloc_line);
  } else {
    cr_log_warn("SKIP: file:line needs libdw");
  }
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
}

Test(history, frames_name_own_functions_backtrace, .init = setup, .fini = teardown) {
  NEED_LIBDW();
  check_own_frames(MS_UNWIND_BACKTRACE);
}

Test(history, frames_name_own_functions_frame_pointers, .init = setup, .fini = teardown) {
  NEED_LIBDW();
  check_own_frames(MS_UNWIND_FRAME_POINTER);
  /* the second allocation from the same site: the walk is complete, no fallback */
  ms__fp_stats_t s0, s1;
  ms__fp_stats(&s0);
  ms_devptr_t p = alloc_outer(1000);
  ms__fp_stats(&s1);
  cr_assert_eq(s1.walks - s0.walks, 1);
  cr_assert_eq(s1.fallbacks - s0.fallbacks, 0);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
}

/* ---- the trace ------------------------------------------------------------------------------ */

static const ms_snap_trace_t *dev_trace(const ms_snapshot_t *s, int dev, size_t i) {
  cr_assert_lt(i, s->devices[dev].ntrace);
  return &s->trace[s->devices[dev].first_trace + i];
}

Test(history, trace_has_pytorchs_actions_and_fields, .init = setup, .fini = teardown) {
  NEED_LIBDW();
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, MS_UNWIND_BACKTRACE);
  int64_t t0 = ms__now_us();
  ms_devptr_t p = alloc_outer(1000);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  cr_assert_eq(ms_allocator_empty_cache(al), MS_OK);
  ms_snapshot_t *s = take();
  int64_t t1 = ms__now_us();
  cr_assert_eq(s->origin, MS_SNAP_ORIGIN_MEMSNAP);
  cr_assert(s->present & MS_SNAP_HAS_DEVICE_TRACES);
  cr_assert_eq(s->ndevices, 1);
  static const ms_trace_action want[] = {MS_TRACE_SEGMENT_ALLOC, MS_TRACE_ALLOC,
                                         MS_TRACE_FREE_REQUESTED, MS_TRACE_FREE_COMPLETED,
                                         MS_TRACE_SEGMENT_FREE, MS_TRACE_SNAPSHOT};
  cr_assert_eq(s->devices[0].ntrace, 6);
  cr_assert_eq(s->devices[0].trace_dropped, 0);
  /* times are ticks converted at snapshot time (as PyTorch's): exact to the precision of reading
   * two clocks together; allow 100 us */
  int64_t prev = t0 - 100;
  for (size_t i = 0; i < 6; i++) {
    const ms_snap_trace_t *t = dev_trace(s, 0, i);
    cr_assert_eq(t->action, want[i], "entry %zu is %s", i, ms_snap_trace_action_name(t));
    cr_assert_str_eq(ms_snap_trace_action_name(t), ms_trace_action_name(want[i]));
    cr_assert(t->present & MS_TRACE_HAS_TIME);
    cr_assert_geq(t->time_us, prev);
    cr_assert_leq(t->time_us, t1);
    prev = t->time_us;
  }
  /* PyTorch's fields per action (docs/pytorch-allocator.md, "Trace entries") */
  cr_assert_eq(dev_trace(s, 0, 0)->size, 2 * MiB); /* the small pool's segment */
  cr_assert_eq(dev_trace(s, 0, 1)->addr, p);
  cr_assert_eq(dev_trace(s, 0, 1)->size, 1000); /* the user's size */
  cr_assert_eq(dev_trace(s, 0, 2)->addr, p);
  cr_assert_eq(dev_trace(s, 0, 2)->size, 1000);
  cr_assert_eq(dev_trace(s, 0, 3)->addr, p);
  cr_assert_eq(dev_trace(s, 0, 4)->addr, dev_trace(s, 0, 0)->addr);
  cr_assert_eq(dev_trace(s, 0, 4)->size, 2 * MiB);
  cr_assert_eq(dev_trace(s, 0, 5)->addr, 0);
  /* stacks: alloc and segment_alloc have the malloc stack; free_requested the free's; the
   * snapshot entry none */
  const ms_snap_trace_t *a = dev_trace(s, 0, 1);
  cr_assert(a->present & MS_TRACE_HAS_FRAMES);
  cr_assert_str_eq(ms_snap_stack_frame(s, a->stack, 0)->name, "alloc_inner");
  cr_assert_eq(dev_trace(s, 0, 0)->stack, a->stack);
  const ms_snap_trace_t *fr = dev_trace(s, 0, 2);
  cr_assert_neq(fr->stack, MS_SNAP_NO_STACK);
  cr_assert(strstr(ms_snap_stack_frame(s, fr->stack, 0)->name, "trace_has_pytorchs") != NULL,
            "free stack starts at %s", ms_snap_stack_frame(s, fr->stack, 0)->name);
  cr_assert_eq(dev_trace(s, 0, 5)->stack, MS_SNAP_NO_STACK);
  cr_assert_eq(dev_trace(s, 0, 5)->present & MS_TRACE_HAS_FRAMES, 0);
  ms_snapshot_free(s);
}

Test(history, ring_buffer_wraps_and_counts_dropped_entries, .init = setup, .fini = teardown) {
  record(MS_HISTORY_ALL, MS_CONTEXT_NONE, 5, MS_UNWIND_BACKTRACE);
  /* 1 segment_alloc + 10 x (alloc, free_requested, free_completed) = 31 entries, + snapshot */
  for (int i = 0; i < 10; i++) {
    ms_devptr_t p = alloc_outer(512 * (size_t)(i + 1));
    cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  }
  ms_snapshot_t *s = take();
  cr_assert_eq(s->devices[0].ntrace, 5);
  cr_assert_eq(s->devices[0].trace_dropped, 32 - 5);
  /* the newest five, oldest first: ..., alloc(5120), free_requested, free_completed, snapshot */
  cr_assert_eq(dev_trace(s, 0, 0)->action, MS_TRACE_FREE_COMPLETED);
  cr_assert_eq(dev_trace(s, 0, 1)->action, MS_TRACE_ALLOC);
  cr_assert_eq(dev_trace(s, 0, 1)->size, 5120);
  cr_assert_eq(dev_trace(s, 0, 2)->action, MS_TRACE_FREE_REQUESTED);
  cr_assert_eq(dev_trace(s, 0, 3)->action, MS_TRACE_FREE_COMPLETED);
  cr_assert_eq(dev_trace(s, 0, 4)->action, MS_TRACE_SNAPSHOT);
  for (size_t i = 0; i < 5; i++) cr_assert_eq(dev_trace(s, 0, i)->stack, MS_SNAP_NO_STACK);
  ms_snapshot_free(s);

  /* a smaller buffer keeps the newest entries; a larger one keeps them all and grows */
  record(MS_HISTORY_ALL, MS_CONTEXT_NONE, 2, MS_UNWIND_BACKTRACE);
  s = take();
  cr_assert_eq(s->devices[0].ntrace, 2);
  cr_assert_eq(dev_trace(s, 0, 0)->action, MS_TRACE_SNAPSHOT);
  cr_assert_eq(dev_trace(s, 0, 1)->action, MS_TRACE_SNAPSHOT);
  ms_snapshot_free(s);
  record(MS_HISTORY_ALL, MS_CONTEXT_NONE, 100000, MS_UNWIND_BACKTRACE);
  for (int i = 0; i < 3000; i++) {
    ms_devptr_t p = alloc_outer(512);
    cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  }
  s = take();
  cr_assert_eq(s->devices[0].ntrace, 2 + 9000 + 1);
  ms_snapshot_free(s);
}

Test(history, recording_switched_on_midway, .init = setup, .fini = teardown) {
  ms_devptr_t before = alloc_outer(4096);
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 100, MS_UNWIND_BACKTRACE);
  ms_devptr_t after = alloc_outer(4096);
  ms_snapshot_t *s = take();
  cr_assert_eq(block_at(s, before)->stack, MS_SNAP_NO_STACK, "earlier blocks have no stack");
  cr_assert_neq(block_at(s, after)->stack, MS_SNAP_NO_STACK);
  /* the trace starts when recording did */
  cr_assert_eq(s->devices[0].ntrace, 2);
  cr_assert_eq(dev_trace(s, 0, 0)->action, MS_TRACE_ALLOC);
  cr_assert_eq(dev_trace(s, 0, 0)->addr, after);
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, before), MS_OK);
  cr_assert_eq(ms_allocator_free(al, after), MS_OK);
}

Test(history, state_only_records_stacks_but_no_trace, .init = setup, .fini = teardown) {
  NEED_LIBDW();
  record(MS_HISTORY_STATE, MS_CONTEXT_STATE, 100, MS_UNWIND_BACKTRACE);
  ms_devptr_t p = alloc_outer(4096);
  ms_snapshot_t *s = take();
  cr_assert_neq(block_at(s, p)->stack, MS_SNAP_NO_STACK);
  cr_assert_str_eq(ms_snap_stack_frame(s, block_at(s, p)->stack, 0)->name, "alloc_inner");
  cr_assert_eq(s->devices[0].ntrace, 0);
  /* the segment remembers the malloc that created it */
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->segments[0].stack, block_at(s, p)->stack);
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
}

Test(history, context_levels_follow_pytorch, .init = setup, .fini = teardown) {
  /* state: blocks have stacks, trace entries none */
  record(MS_HISTORY_ALL, MS_CONTEXT_STATE, 100, MS_UNWIND_BACKTRACE);
  ms_devptr_t p = alloc_outer(4096);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  p = alloc_outer(4096);
  ms_snapshot_t *s = take();
  cr_assert_neq(block_at(s, p)->stack, MS_SNAP_NO_STACK);
  for (size_t i = 0; i < s->devices[0].ntrace; i++)
    cr_assert_eq(dev_trace(s, 0, i)->stack, MS_SNAP_NO_STACK, "entry %zu", i);
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);

  /* alloc: alloc entries have stacks, free entries none */
  record(MS_HISTORY_ALL, MS_CONTEXT_ALLOC, 100, MS_UNWIND_BACKTRACE);
  record(MS_HISTORY_ALL, MS_CONTEXT_ALLOC, 100, MS_UNWIND_BACKTRACE);
  ms_history_config_t clear;
  ms_history_config_init(&clear);
  clear.context = MS_CONTEXT_ALLOC;
  clear.max_entries = 100;
  clear.clear_history = true;
  cr_assert_eq(ms_allocator_record_history(al, &clear, NULL), MS_OK);
  p = alloc_outer(4096);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  s = take();
  cr_assert_eq(s->devices[0].ntrace, 4);
  cr_assert_eq(dev_trace(s, 0, 0)->action, MS_TRACE_ALLOC);
  cr_assert_neq(dev_trace(s, 0, 0)->stack, MS_SNAP_NO_STACK);
  cr_assert_eq(dev_trace(s, 0, 1)->action, MS_TRACE_FREE_REQUESTED);
  cr_assert_eq(dev_trace(s, 0, 1)->stack, dev_trace(s, 0, 0)->stack,
               "without a free stack, free_requested shows the allocation's");
  ms_snapshot_free(s);
}

Test(history, switching_off_clears_the_trace_and_keeps_block_stacks, .init = setup,
     .fini = teardown) {
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 100, MS_UNWIND_BACKTRACE);
  ms_devptr_t p = alloc_outer(4096);
  record(MS_HISTORY_OFF, MS_CONTEXT_NONE, 100, MS_UNWIND_BACKTRACE);
  ms_devptr_t q = alloc_outer(4096);
  ms_snapshot_t *s = take();
  cr_assert_eq(s->devices[0].ntrace, 0);
  cr_assert_neq(block_at(s, p)->stack, MS_SNAP_NO_STACK);
  cr_assert_eq(block_at(s, q)->stack, MS_SNAP_NO_STACK);
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
  cr_assert_eq(ms_allocator_free(al, q), MS_OK);
}

Test(history, off_on_an_allocator_never_recorded_is_a_no_op, .init = setup, .fini = teardown) {
  record(MS_HISTORY_OFF, MS_CONTEXT_NONE, 1, MS_UNWIND_BACKTRACE);
  cr_assert_null(ms__allocator_get_hooks(al));
  ms_snapshot_t *s = take();
  cr_assert_eq(s->ndevices, 1);
  cr_assert_eq(s->devices[0].ntrace, 0);
  ms_snapshot_free(s);
}

typedef struct bad_cfg_s {
  const char *what;
  ms_history_config_t cfg;
  const char *msg;
} bad_cfg_t;

Test(history, bad_configurations_are_refused, .init = setup, .fini = teardown) {
  ms_history_config_t d;
  ms_history_config_init(&d);
  bad_cfg_t cases[5];
  for (int i = 0; i < 5; i++) cases[i].cfg = d;
  cases[0].cfg.max_frames = 0;
  cases[0].msg = "max_frames must be in [1, 128], got 0";
  cases[1].cfg.max_frames = 129;
  cases[1].msg = "max_frames must be in [1, 128], got 129";
  cases[2].cfg.context = (ms_history_context)7;
  cases[2].msg = "expected context to be none, state, alloc or all, got 7";
  cases[3].cfg.enabled = (ms_history_record)3;
  cases[3].msg = "expected enabled to be off, state or all, got 3";
  cases[4].cfg.max_entries = 0;
  cases[4].msg = "max_entries must be at least 1";
  for (int i = 0; i < 5; i++) {
    ms_errbuf_t eb;
    cr_assert_eq(ms_allocator_record_history(al, &cases[i].cfg, &eb), MS_EINVAL);
    cr_assert_str_eq(eb.msg, cases[i].msg);
  }
  cr_assert_null(ms__allocator_get_hooks(al), "nothing changed");
  cr_assert_eq(ms_allocator_record_history(NULL, NULL, NULL), MS_EINVAL);
  cr_assert_eq(ms_allocator_record_history(al, NULL, NULL), MS_OK, "NULL = defaults");
}

/* ---- the snapshot --------------------------------------------------------------------------- */

Test(history, snapshot_has_process_identity_capacity_and_stats, .init = setup, .fini = teardown) {
  ms_snapshot_set_rank(3);
  ms_devptr_t p = alloc_outer(3 * MiB);
  int64_t t0 = ms__now_us();
  ms_snapshot_t *s = take();
  cr_assert(s->present & MS_SNAP_HAS_PROCESS);
  cr_assert_eq(s->pid, getpid());
  char host[256] = "";
  gethostname(host, sizeof host);
  cr_assert_str_eq(s->hostname, host);
  cr_assert_geq(s->time_us, t0);
  cr_assert_leq(s->time_us, ms__now_us());
  cr_assert(s->present & MS_SNAP_HAS_RANK);
  cr_assert_eq(s->rank, 3);
  cr_assert(s->devices[0].present & MS_DEV_HAS_CAPACITY);
  cr_assert_eq(s->devices[0].capacity, 1024 * MiB);
  cr_assert(s->devices[0].present & MS_DEV_HAS_STATS);
  cr_assert_eq(s->devices[0].nstats, MS_STATS_NKEYS);
  int found = 0;
  for (uint32_t i = 0; i < s->devices[0].nstats; i++) {
    const ms_snap_kv_t *kv = &s->stats[s->devices[0].first_stat + i];
    if (strcmp(kv->key, "allocated_bytes.all.current") == 0) {
      cr_assert_eq(kv->kind, MS_SNAP_VAL_INT);
      cr_assert_eq(kv->i, (int64_t)(3 * MiB));
      found = 1;
    }
  }
  cr_assert(found);
  cr_assert(s->present & MS_SNAP_HAS_SETTINGS);
  cr_assert_gt(s->nsettings_top, 0);
  ms_snapshot_free(s);
  ms_snapshot_set_rank(-1);
  s = take();
  cr_assert_eq(s->present & MS_SNAP_HAS_RANK, 0);
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, p), MS_OK);
}

Test(history, rank_comes_from_the_environment, .init = setup, .fini = teardown) {
  setenv("RANK", "7", 1);
  ms_snapshot_t *s = take();
  cr_assert(s->present & MS_SNAP_HAS_RANK);
  cr_assert_eq(s->rank, 7);
  ms_snapshot_free(s);
  setenv("RANK", "seven", 1);
  s = take();
  cr_assert_eq(s->present & MS_SNAP_HAS_RANK, 0);
  ms_snapshot_free(s);
}

Test(history, snapshot_covers_several_devices) {
  ms_sim_config_t c = {.ndevices = 3, .capacity = 256 * MiB};
  ms_backend_t *b3;
  cr_assert_eq(ms_backend_sim_create(&c, &b3), MS_OK);
  ms_allocator_t *a[2];
  int devs[2] = {2, 0};
  for (int i = 0; i < 2; i++) {
    ms_allocator_config_t ac = {.backend = b3, .device = devs[i], .alloc = NULL};
    cr_assert_eq(ms_allocator_create(&ac, &a[i], NULL), MS_OK);
    ms_history_config_t hc;
    ms_history_config_init(&hc);
    hc.max_entries = 10;
    cr_assert_eq(ms_allocator_record_history(a[i], &hc, NULL), MS_OK);
  }
  ms_devptr_t p0, p2;
  cr_assert_eq(ms_allocator_malloc(a[1], 4096, 0, &p0), MS_OK);
  cr_assert_eq(ms_allocator_malloc(a[0], 40 * MiB, 0, &p2), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_allocator_snapshot(a, 2, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(s->ndevices, 3, "device_traces has one list per device index");
  cr_assert_eq(s->nsegments, 2);
  cr_assert_eq(s->segments[0].device, 0, "devices in order");
  cr_assert_eq(s->segments[1].device, 2);
  cr_assert_eq(s->devices[0].ntrace, 3); /* segment_alloc, alloc, snapshot */
  cr_assert_eq(s->devices[1].ntrace, 0);
  cr_assert_eq(s->devices[1].present, 0);
  cr_assert_eq(s->devices[2].ntrace, 3);
  cr_assert_eq(dev_trace(s, 2, 1)->addr, p2);
  cr_assert_eq(s->devices[2].capacity, 256 * MiB);
  ms_snapshot_free(s);
  /* the same allocator twice is refused */
  ms_allocator_t *twice[2] = {a[0], a[0]};
  s = (ms_snapshot_t *)0x1;
  cr_assert_eq(ms_allocator_snapshot(twice, 2, &s, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "two allocators for device 2");
  cr_assert_eq(s, (ms_snapshot_t *)0x1, "out-param untouched");
  cr_assert_eq(ms_allocator_snapshot(NULL, 0, &s, &eb), MS_EINVAL);
  cr_assert_eq(ms_allocator_free(a[1], p0), MS_OK);
  cr_assert_eq(ms_allocator_free(a[0], p2), MS_OK);
  for (int i = 0; i < 2; i++) ms_allocator_destroy(a[i]);
  ms_backend_destroy(b3);
}

/* ---- threads -------------------------------------------------------------------------------- */

NOINLINE static void *thread_work(void *arg) {
  (void)arg;
  ms_devptr_t live[16] = {0};
  for (int i = 0; i < 2000; i++) {
    int k = i % 16;
    if (live[k]) cr_assert_eq(ms_allocator_free(al, live[k]), MS_OK);
    cr_assert_eq(ms_allocator_malloc(al, 512 * (size_t)(1 + (i * 7) % 64), 0, &live[k]), MS_OK);
  }
  for (int k = 0; k < 16; k++) cr_assert_eq(ms_allocator_free(al, live[k]), MS_OK);
  return NULL;
}

Test(history, threads_record_concurrently, .init = setup, .fini = teardown, .timeout = 60) {
  NEED_LIBDW();
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, MS_UNWIND_FRAME_POINTER);
  pthread_t th[3];
  for (int i = 0; i < 3; i++) cr_assert_eq(pthread_create(&th[i], NULL, thread_work, NULL), 0);
  /* snapshots while the threads run */
  for (int i = 0; i < 5; i++) {
    ms_snapshot_t *s = take();
    ms_snapshot_free(s);
  }
  for (int i = 0; i < 3; i++) pthread_join(th[i], NULL);
  ms_snapshot_t *s = take();
  cr_assert_eq(s->devices[0].ntrace, 1000);
  cr_assert_gt(s->devices[0].trace_dropped, 0);
  for (size_t i = 0; i + 1 < s->devices[0].ntrace; i++) {
    const ms_snap_trace_t *t = dev_trace(s, 0, i);
    if (t->action == MS_TRACE_ALLOC) {
      cr_assert_neq(t->stack, MS_SNAP_NO_STACK);
      cr_assert_str_eq(ms_snap_stack_frame(s, t->stack, 0)->name, "thread_work");
    }
  }
  ms_snapshot_free(s);
  ms_errbuf_t eb;
  cr_assert_eq(ms__allocator_check(al, &eb), MS_OK, "%s", eb.msg);
}

/* Recording switched on, off and between unwinders while threads allocate: no crash, no lost
 * block, and the allocator's invariants hold (run under the sanitizers too). */
static volatile int toggling;

NOINLINE static void *toggle_work(void *arg) {
  (void)arg;
  ms_devptr_t live[8] = {0};
  for (int i = 0; toggling && i < 200000; i++) {
    int k = i % 8;
    if (live[k]) cr_assert_eq(ms_allocator_free(al, live[k]), MS_OK);
    cr_assert_eq(ms_allocator_malloc(al, 512 * (size_t)(1 + i % 16), 0, &live[k]), MS_OK);
  }
  for (int k = 0; k < 8; k++) cr_assert_eq(ms_allocator_free(al, live[k]), MS_OK);
  return NULL;
}

Test(history, reconfiguring_while_threads_allocate, .init = setup, .fini = teardown,
     .timeout = 60) {
  toggling = 1;
  pthread_t th[2];
  for (int i = 0; i < 2; i++) cr_assert_eq(pthread_create(&th[i], NULL, toggle_work, NULL), 0);
  for (int i = 0; i < 60; i++) {
    ms_history_record en = (ms_history_record)(i % 3);
    record(en, (ms_history_context)(i % 4), 1 + (size_t)(i * 37) % 500,
           i % 2 ? MS_UNWIND_FRAME_POINTER : MS_UNWIND_BACKTRACE);
    if (i % 10 == 0) ms_snapshot_free(take());
  }
  toggling = 0;
  for (int i = 0; i < 2; i++) pthread_join(th[i], NULL);
  ms_errbuf_t eb;
  cr_assert_eq(ms__allocator_check(al, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_t *s = take();
  for (size_t i = 0; i < s->nblocks; i++)
    cr_assert_neq(s->blocks[i].state, MS_BLOCK_ACTIVE_ALLOCATED, "block %zu still live", i);
  ms_snapshot_free(s);
}

/* An allocation made from a callback of code built without frame pointers (libc's qsort): the
 * frame-pointer unwinder still names the callback and the test, whether it skips libc's frames or
 * falls back to backtrace(3). */
static ms_devptr_t cmp_ptr;

NOINLINE static int cmp_alloc(const void *x, const void *y) {
  if (!cmp_ptr) cr_assert_eq(ms_allocator_malloc(al, 4096, 0, &cmp_ptr), MS_OK);
  KEEP_FRAME();
  return (*(const int *)x > *(const int *)y) - (*(const int *)x < *(const int *)y);
}

Test(history, frame_pointers_through_code_without_them, .init = setup, .fini = teardown) {
  NEED_LIBDW();
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 100, MS_UNWIND_FRAME_POINTER);
  int v[16];
  for (int i = 0; i < 16; i++) v[i] = (i * 7) % 16;
  qsort(v, 16, sizeof *v, cmp_alloc);
  cr_assert_neq(cmp_ptr, 0);
  ms_snapshot_t *s = take();
  const ms_snap_block_t *b = block_at(s, cmp_ptr);
  uint32_t d = ms_snap_stack_depth(s, b->stack);
  cr_assert_geq(d, 2);
  cr_assert_str_eq(ms_snap_stack_frame(s, b->stack, 0)->name, "cmp_alloc");
  int found = 0;
  for (uint32_t i = 1; i < d; i++)
    found |= strstr(ms_snap_stack_frame(s, b->stack, i)->name,
                    "frame_pointers_through_code_without_them") != NULL;
  cr_assert(found, "the test's own frame is missing");
  ms_snapshot_free(s);
  cr_assert_eq(ms_allocator_free(al, cmp_ptr), MS_OK);
}

/* ---- OOM snapshots -------------------------------------------------------------------------- */

Test(history, oom_path_patterns) {
  char buf[256];
  char want[256];
  cr_assert_eq(ms_oom_path_format("oom-%p-dev%d-%n.msgpack", 3, 12, buf, sizeof buf), MS_OK);
  snprintf(want, sizeof want, "oom-%ld-dev3-12.msgpack", (long)getpid());
  cr_assert_str_eq(buf, want);
  cr_assert_eq(ms_oom_path_format("a%%b", 0, 0, buf, sizeof buf), MS_OK);
  cr_assert_str_eq(buf, "a%b");
  cr_assert_eq(ms_oom_path_format("plain", 0, 0, buf, sizeof buf), MS_OK);
  cr_assert_str_eq(buf, "plain");
  strcpy(buf, "untouched");
  cr_assert_eq(ms_oom_path_format("x%q", 0, 0, buf, sizeof buf), MS_EINVAL);
  cr_assert_eq(ms_oom_path_format("x%", 0, 0, buf, sizeof buf), MS_EINVAL);
  cr_assert_eq(ms_oom_path_format("", 0, 0, buf, sizeof buf), MS_EINVAL);
  cr_assert_eq(ms_oom_path_format("abcdef", 0, 0, buf, 6), MS_ELIMIT);
  cr_assert_eq(ms_oom_path_format("abcde", 0, 0, buf, 6), MS_OK);
  cr_assert_eq(ms_oom_path_format("%n", 0, 123456, buf, 6), MS_ELIMIT);
}

static char *tmpdir_new(void) {
  char tmpl[] = "/tmp/memsnap-history-XXXXXX";
  char *d = mkdtemp(tmpl);
  cr_assert_not_null(d);
  return strdup(d);
}

static void rm_tree(const char *dir) {
  char cmd[512];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
  cr_assert_eq(system(cmd), 0);
}

NOINLINE static int too_big_request(ms_devptr_t *out) {
  int r = ms_allocator_malloc(al, 300 * MiB, 0, out);
  KEEP_FRAME();
  return r;
}

Test(history, oom_observer_writes_a_snapshot_showing_the_failure, .init = setup,
     .fini = teardown) {
  NEED_LIBDW();
  ms_sim_set_capacity(be, 0, 512 * MiB);
  char *dir = tmpdir_new();
  char pattern[512];
  snprintf(pattern, sizeof pattern, "%s/oom-%%p-dev%%d-%%n.msgpack", dir);
  cr_assert_eq(ms_oom_snapshot_install(al, "bad%y"), MS_EINVAL);
  cr_assert_eq(ms_oom_snapshot_install(al, pattern), MS_OK);
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, MS_UNWIND_BACKTRACE);
  ms_devptr_t held = alloc_outer(250 * MiB);
  ms_devptr_t q = 0;
  cr_assert_eq(too_big_request(&q), MS_EOOM);
  cr_assert_eq(q, 0);
  char path[600];
  snprintf(path, sizeof path, "%s/oom-%ld-dev0-0.msgpack", dir, (long)getpid());
  cr_assert_eq(access(path, R_OK), 0, "no file %s", path);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  eb.msg[0] = 0;
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s", eb.msg);
  /* the state at the failure: the 250 MiB block held, with its stack */
  const ms_snap_block_t *b = block_at(s, held);
  cr_assert_eq(b->state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_str_eq(ms_snap_stack_frame(s, b->stack, 0)->name, "alloc_inner");
  /* the failing request: the oom entry, then the observer's snapshot entry */
  uint32_t nt = s->devices[0].ntrace;
  cr_assert_geq(nt, 2);
  const ms_snap_trace_t *oom = dev_trace(s, 0, nt - 2);
  cr_assert_eq(oom->action, MS_TRACE_OOM);
  cr_assert_str_eq(ms_snap_trace_action_name(oom), "oom");
  cr_assert_eq(oom->size, 300 * MiB);
  cr_assert_eq(oom->addr, 512 * MiB - 250 * MiB, "device_free");
  cr_assert_neq(oom->stack, MS_SNAP_NO_STACK);
  cr_assert_str_eq(ms_snap_stack_frame(s, oom->stack, 0)->name, "too_big_request");
  cr_assert_eq(dev_trace(s, 0, nt - 1)->action, MS_TRACE_SNAPSHOT);
  ms_snapshot_free(s);
  /* a second OOM gets the next counter */
  cr_assert_eq(too_big_request(&q), MS_EOOM);
  snprintf(path, sizeof path, "%s/oom-%ld-dev0-1.msgpack", dir, (long)getpid());
  cr_assert_eq(access(path, R_OK), 0, "no file %s", path);
  cr_assert_eq(ms_allocator_free(al, held), MS_OK);
  rm_tree(dir);
  free(dir);
}

static char oom_said[1024];
static void oom_capture(const char *msg, void *arg) {
  (void)arg;
  snprintf(oom_said, sizeof oom_said, "%s", msg);
}

Test(history, oom_observer_alone_turns_on_the_trace, .init = setup, .fini = teardown) {
  ms_sim_set_capacity(be, 0, 64 * MiB);
  char *dir = tmpdir_new();
  char pattern[512];
  snprintf(pattern, sizeof pattern, "%s/o%%n", dir);
  cr_assert_eq(ms_oom_snapshot_install(al, pattern), MS_OK);
  ms_devptr_t q = 0;
  oom_said[0] = 0;
  ms_set_output(oom_capture, NULL);
  cr_assert_eq(too_big_request(&q), MS_EOOM);
  ms_set_output(NULL, NULL);
  char path[600];
  snprintf(path, sizeof path, "%s/o0", dir);
  /* the observer says where the snapshot went (issue #16) */
  char want[800];
  snprintf(want, sizeof want, "snapshot written to '%s'", path);
  cr_assert(strncmp(oom_said, "memsnap: out of memory on device 0 (", 36) == 0 && strstr(oom_said, want),
            "%s", oom_said);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s", eb.msg);
  /* and records the device's capacity, which replay takes as the device's size */
  cr_assert(s->devices[0].present & MS_DEV_HAS_CAPACITY);
  cr_assert_eq(s->devices[0].capacity, 64 * MiB, "capacity %llu", (unsigned long long)s->devices[0].capacity);
  uint32_t nt = s->devices[0].ntrace;
  cr_assert_eq(nt, 2);
  cr_assert_eq(dev_trace(s, 0, 0)->action, MS_TRACE_OOM);
  cr_assert_eq(dev_trace(s, 0, 0)->stack, MS_SNAP_NO_STACK);
  ms_snapshot_free(s);
  rm_tree(dir);
  free(dir);
}

/* ---- take -> write -> read ------------------------------------------------------------------ */

Test(history, take_write_read_gives_the_same_model, .init = setup, .fini = teardown) {
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 10000, MS_UNWIND_BACKTRACE);
  ms_devptr_t live[200];
  for (int i = 0; i < 200; i++) live[i] = alloc_outer(512 * (size_t)(1 + i % 37) + (i % 3) * MiB);
  for (int i = 0; i < 200; i += 3) cr_assert_eq(ms_allocator_free(al, live[i]), MS_OK);
  ms_snapshot_t *s = take();
  char *dir = tmpdir_new();
  for (int z = 0; z <= 1; z++) {
    char path[600];
    snprintf(path, sizeof path, "%s/snap%d.msgpack", dir, z);
    ms_write_opts_t o = {.compress = z ? 6 : 0};
    ms_errbuf_t eb;
    cr_assert_eq(ms_snapshot_write_file(s, path, &o, &eb), MS_OK, "%s", eb.msg);
    ms_snapshot_t *r = NULL;
    cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_OK, "%s", eb.msg);
    TH_ASSERT_SNAP_EQ(s, r);
    ms_snapshot_free(r);
  }
  ms_snapshot_free(s);
  for (int i = 0; i < 200; i++)
    if (i % 3) cr_assert_eq(ms_allocator_free(al, live[i]), MS_OK);
  rm_tree(dir);
  free(dir);
}

/* 100,000 blocks: take -> write -> read, plain and compressed, gives an equal model. */
Test(history, take_write_read_of_100000_blocks, .init = setup, .fini = teardown, .timeout = 120) {
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, MS_UNWIND_FRAME_POINTER);
  enum { N = 100000 };
  ms_devptr_t *live = malloc(N * sizeof *live);
  for (int i = 0; i < N; i++) live[i] = alloc_outer(512);
  ms_snapshot_t *s = take();
  cr_assert_geq(s->nblocks, N);
  char *dir = tmpdir_new();
  for (int z = 0; z <= 1; z++) {
    char path[600];
    snprintf(path, sizeof path, "%s/big%d.msgpack", dir, z);
    ms_write_opts_t o = {.compress = z ? 1 : 0};
    ms_errbuf_t eb;
    cr_assert_eq(ms_snapshot_write_file(s, path, &o, &eb), MS_OK, "%s", eb.msg);
    ms_snapshot_t *r = NULL;
    cr_assert_eq(ms_snapshot_load(path, &r, &eb), MS_OK, "%s", eb.msg);
    TH_ASSERT_SNAP_EQ(s, r);
    ms_snapshot_free(r);
  }
  ms_snapshot_free(s);
  for (int i = 0; i < N; i++) cr_assert_eq(ms_allocator_free(al, live[i]), MS_OK);
  free(live);
  rm_tree(dir);
  free(dir);
}

/* ---- the recorder's lifetime ------------------------------------------------------------------ */

Test(history, destroying_the_allocator_frees_its_recorder) {
  ms_sim_config_t c = {.ndevices = 1, .capacity = 1024 * MiB};
  cr_assert_eq(ms_backend_sim_create(&c, &be), MS_OK);
  size_t before = ms__recorder_live_count();
  char dir[] = "/tmp/ms_hist_release_XXXXXX";
  cr_assert_not_null(mkdtemp(dir));
  char pattern[128];
  snprintf(pattern, sizeof pattern, "%s/oom-%%n.msgpack", dir);
  for (int i = 0; i < 200; i++) {
    ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
    ms_errbuf_t eb;
    cr_assert_eq(ms_allocator_create(&ac, &al, &eb), MS_OK, "%s", eb.msg);
    record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, MS_UNWIND_BACKTRACE);
    if (i % 2) cr_assert_eq(ms_oom_snapshot_install(al, pattern), MS_OK);
    cr_assert_eq(ms__recorder_live_count(), before + 1);
    ms_devptr_t p = alloc_outer(512 * (size_t)(1 + i % 7));
    ms_devptr_t q = alloc_outer(3 * MiB);
    cr_assert_eq(ms_allocator_free(al, p), MS_OK);
    if (i % 40) cr_assert_eq(ms_allocator_free(al, q), MS_OK); /* else destroyed while live */
    ms_allocator_destroy(al); /* segment_free entries go to the recorder, then it is freed */
    al = NULL;
    cr_assert_eq(ms__recorder_live_count(), before, "recorder of allocator %d not freed", i);
  }
  /* An allocator never recorded on has no recorder to free. */
  ms_allocator_config_t ac = {.backend = be, .device = 0, .alloc = NULL};
  cr_assert_eq(ms_allocator_create(&ac, &al, NULL), MS_OK);
  ms_allocator_destroy(al);
  cr_assert_eq(ms__recorder_live_count(), before);
  rmdir(dir);
  ms_backend_destroy(be);
}

/* ms_snapshot_dump: a snapshot now, in one call, as PyTorch's _dump_snapshot (issue #32 item 12) */
Test(history, snapshot_dump_writes_one_now, .init = setup, .fini = teardown) {
  char *dir = tmpdir_new();
  char path[600], bad[600];
  snprintf(path, sizeof path, "%s/now.msgpack", dir);
  snprintf(bad, sizeof bad, "%s/no/such/dir/now.msgpack", dir);
  record(MS_HISTORY_ALL, MS_CONTEXT_ALL, 1000, MS_UNWIND_BACKTRACE);
  ms_devptr_t p = alloc_outer(3 * MiB);
  cr_assert_eq(ms_snapshot_dump(NULL, path), MS_EINVAL);
  cr_assert_eq(ms_snapshot_dump(al, ""), MS_EINVAL);
  cr_assert_eq(ms_snapshot_dump(al, path), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(ms_snapshot_load(path, &s, &eb), MS_OK, "%s", eb.msg);
  uint64_t held = 0;
  for (size_t i = 0; i < s->nblocks; i++)
    if (s->blocks[i].state == MS_BLOCK_ACTIVE_ALLOCATED) held += s->blocks[i].size;
  cr_assert_eq(held, 3 * MiB);
  ms_snapshot_free(s);
  /* a failure is returned and said through the output hook */
  oom_said[0] = 0;
  ms_set_output(oom_capture, NULL);
  cr_assert_neq(ms_snapshot_dump(al, bad), MS_OK);
  ms_set_output(NULL, NULL);
  cr_assert(strstr(oom_said, "cannot write '") && strstr(oom_said, "no/such/dir"), "%s", oom_said);
  ms_allocator_free(al, p);
  rm_tree(dir);
  free(dir);
}

/* An entry has the same time_us in every snapshot that holds it (issue #31 item 9: the demo's
 * snapshots after steps 2 and 5 gave 5 of 163 entries 1 us apart: each copy converted the clock
 * ticks with the rate up to its own reading). Three snapshots, 20 ms apart, of one growing trace. */
Test(history, an_entry_keeps_its_time_in_every_snapshot, .init = setup, .fini = teardown) {
  record(MS_HISTORY_ALL, MS_CONTEXT_NONE, 1000000, MS_UNWIND_BACKTRACE);
  ms_snapshot_t *s[3];
  for (int k = 0; k < 3; k++) {
    for (int i = 0; i < 3000; i++) {
      ms_devptr_t p;
      cr_assert_eq(ms_allocator_malloc(al, 512 * (size_t)(1 + i % 7), 0, &p), MS_OK);
      cr_assert_eq(ms_allocator_free(al, p), MS_OK);
    }
    s[k] = take();
    int64_t t = ms__now_us();
    while (ms__now_us() < t + 20000) {
    }
  }
  size_t same = 0;
  for (int k = 1; k < 3; k++) {
    cr_assert_gt(s[k]->devices[0].ntrace, s[k - 1]->devices[0].ntrace);
    for (size_t i = 0; i < s[k - 1]->devices[0].ntrace; i++) {
      const ms_snap_trace_t *a = dev_trace(s[k - 1], 0, i), *b = dev_trace(s[k], 0, i);
      cr_assert_eq(a->addr, b->addr);
      cr_assert_eq(a->time_us, b->time_us, "entry %zu: %lld in snapshot %d, %lld in %d", i,
                   (long long)a->time_us, k - 1, (long long)b->time_us, k);
      same++;
    }
  }
  cr_assert_geq(same, 12000);
  for (int k = 0; k < 3; k++) ms_snapshot_free(s[k]);
}
