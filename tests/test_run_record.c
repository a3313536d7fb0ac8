/* SPDX-License-Identifier: MIT
 * Tests of `memsnap run`'s recorder (lib/interpose/record.c) in-process, so that it also runs
 * under the sanitizers (the interposer library itself is built without them in sanitizer builds,
 * docs/run.md): the live table through growth and tombstones, the trace ring wrapping at
 * max_entries with the drops counted per device, frees (failed, unknown, twice, completed by the
 * driver reusing the address first), devices, stacks, one file per device, and eight threads
 * recording at once. Each Criterion test runs in its own process: fresh recorder state.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "helpers.h"
#include "interpose/run_internal.h"
#include "memsnap/serialize.h"

static ms_snapshot_t *rr_take(int device) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {0};
  int err = ms__run_take(device, &s, &eb);
  cr_assert_eq(err, MS_OK, "%s", eb.msg);
  return s;
}

static void rr_fini(void) {
  ms__run_stop(); /* no exit snapshot from the test's process */
}

static void rr_start(const char *max_entries, const char *stacks) {
  setenv("MEMSNAP_RUN_MAX_ENTRIES", max_entries, 1);
  setenv("MEMSNAP_RUN_STACKS", stacks, 1);
  setenv("MEMSNAP_RUN_SIGNAL", "0", 1);
  setenv("MEMSNAP_RUN_QUIET", "1", 1);
  ms__run_start();
}

#define ADDR(i) (0x7f0000000000ULL + (uint64_t)(i)*0x1000)

static void rr_free(uint64_t addr) {
  uint64_t begin = ms__run_free_begin();
  ms__run_free_end(addr, begin, true);
}

Test(run_record, ring_wraps_at_max_entries_and_counts_drops, .fini = rr_fini) {
  rr_start("50", "0");
  for (int i = 0; i < 100; i++)
    ms__run_on_alloc(0, ADDR(i), 1000 + (uint64_t)i, 0, NULL, 0, 0);
  for (int i = 0; i < 50; i++)
    rr_free(ADDR(i));
  ms_snapshot_t *s = rr_take(-1);
  cr_assert_eq(s->nsegments, 50);
  for (size_t k = 0; k < 50; k++) {
    cr_assert_eq(s->segments[k].address, ADDR(50 + k));
    cr_assert_eq(s->segments[k].total_size, 1050 + k);
  }
  cr_assert_eq(s->ndevices, 1);
  cr_assert_eq(s->devices[0].ntrace, 50);
  cr_assert_eq(s->devices[0].trace_dropped, 100 * 2 + 50 * 3 - 50);
  /* the newest 50 entries, oldest first: the last ~16 frees, three entries each */
  const ms_snap_trace_t *last = &s->trace[49];
  cr_assert_eq(last->action, MS_TRACE_SEGMENT_FREE);
  cr_assert_eq(last->addr, ADDR(49));
  /* 50 = 2 + 16 * 3: the last two entries of one free, then 16 whole frees */
  cr_assert_eq(s->trace[0].action, MS_TRACE_FREE_COMPLETED);
  cr_assert_eq(s->trace[1].action, MS_TRACE_SEGMENT_FREE);
  cr_assert_eq(s->trace[2].action, MS_TRACE_FREE_REQUESTED);
  cr_assert_eq(s->trace[2].addr, ADDR(34));
  for (size_t k = 1; k < 50; k++)
    cr_assert_geq(s->trace[k].time_us, s->trace[k - 1].time_us);
  ms_snapshot_free(s);
}

Test(run_record, the_live_table_survives_growth_and_tombstones, .fini = rr_fini) {
  rr_start("1000000", "0");
  /* 20,000 allocations, every one but each 7th freed, then the freed addresses reused */
  for (int i = 0; i < 20000; i++)
    ms__run_on_alloc(0, ADDR(i), 512, 0, NULL, 0, 0);
  int live = 0;
  for (int i = 0; i < 20000; i++)
    if (i % 7)
      rr_free(ADDR(i));
    else
      live++;
  for (int i = 0; i < 20000; i++)
    if (i % 7) ms__run_on_alloc(0, ADDR(i), 1024, 0, NULL, 0, 0);
  ms_snapshot_t *s = rr_take(-1);
  cr_assert_eq(s->nsegments, 20000);
  for (size_t k = 0; k < s->nsegments; k++) {
    cr_assert_eq(s->segments[k].address, ADDR(k)); /* by address */
    cr_assert_eq(s->segments[k].total_size, k % 7 ? 1024 : 512);
  }
  cr_assert_eq(s->devices[0].ntrace, 20000 * 2 + (20000 - live) * 5);
  ms_snapshot_free(s);
}

Test(run_record, only_successful_frees_of_known_allocations_are_recorded, .fini = rr_fini) {
  rr_start("1000", "0");
  ms__run_on_alloc(0, ADDR(1), 4096, 7, NULL, 0, 0);
  rr_free(ADDR(2));                                       /* never allocated: nothing to record */
  ms__run_free_end(ADDR(1), ms__run_free_begin(), false); /* the real free failed */
  ms_snapshot_t *s = rr_take(-1);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->blocks[0].state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_eq(s->devices[0].ntrace, 2);
  ms_snapshot_free(s);
  rr_free(ADDR(1));
  rr_free(ADDR(1)); /* twice: the second is not recorded */
  s = rr_take(-1);
  cr_assert_eq(s->nsegments, 0);
  cr_assert_eq(s->devices[0].ntrace, 5);
  cr_assert_eq(s->trace[4].action, MS_TRACE_SEGMENT_FREE);
  cr_assert_eq(ms_snap_trace_stream(&s->trace[4]), 7); /* the allocation's stream, as PyTorch's */
  ms_snapshot_free(s);
}

Test(run_record, an_address_reused_before_its_free_returned_completes_that_free, .fini = rr_fini) {
  rr_start("1000", "0");
  ms__run_on_alloc(0, ADDR(1), 4096, 0, NULL, 0, 0);
  uint64_t begin = ms__run_free_begin();
  /* the driver freed it and another thread got the same address before this one recorded */
  ms__run_on_alloc(0, ADDR(1), 8192, 0, NULL, 0, 0);
  ms__run_free_end(ADDR(1), begin, true); /* already completed: the new one stays */
  ms_snapshot_t *s = rr_take(-1);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->segments[0].total_size, 8192);
  cr_assert_eq(s->blocks[0].state, MS_BLOCK_ACTIVE_ALLOCATED);
  static const ms_trace_action want[7] = {MS_TRACE_SEGMENT_ALLOC,  MS_TRACE_ALLOC,
                                          MS_TRACE_FREE_REQUESTED, MS_TRACE_FREE_COMPLETED,
                                          MS_TRACE_SEGMENT_FREE,   MS_TRACE_SEGMENT_ALLOC,
                                          MS_TRACE_ALLOC};
  cr_assert_eq(s->devices[0].ntrace, 7);
  for (int i = 0; i < 7; i++)
    cr_assert_eq(s->trace[i].action, want[i], "entry %d", i);
  cr_assert_eq(s->trace[4].size, 4096);
  ms_snapshot_free(s);
}

/* Stand-ins for a hook and the program's function that calls it (no tail calls: a tail call
 * leaves no frame, and the real hooks use the stack id after the capture). */
static volatile uint32_t rr_sink;
__attribute__((noinline)) static uint32_t rr_hook(void) {
  uint32_t id = ms__run_stack(0);
  rr_sink = id;
  return id;
}
__attribute__((noinline)) uint32_t rr_program_function(void);
__attribute__((noinline)) uint32_t rr_program_function(void) {
  uint32_t id = rr_hook();
  rr_sink = id;
  return id;
}

Test(run_record, devices_stacks_and_one_file_per_device, .fini = rr_fini) {
  char *dir = th_tmpdir();
  char pattern[4096];
  snprintf(pattern, sizeof pattern, "%s/d%%d-%%n.msgpack", dir);
  setenv("MEMSNAP_RUN_OUTPUT", pattern, 1);
  rr_start("1000", "16");
  uint32_t st = rr_program_function();
  cr_assert_neq(st, 0);
  int64_t pool[2] = {0, 3};
  ms__run_on_alloc(3, ADDR(1), 100, 9, pool, st, 0);
  ms__run_on_alloc(1, ADDR(2), 200, 0, NULL, st, 0);
  ms__run_set_capacity(3, 1u << 30);
  ms_snapshot_t *s = rr_take(-1);
  cr_assert_eq(s->ndevices, 4);
  cr_assert_eq(s->devices[0].ntrace, 0);
  cr_assert_eq(s->devices[3].ntrace, 2);
  cr_assert_eq(s->devices[3].capacity, 1u << 30);
  cr_assert_eq(ms_snap_trace_pool(&s->trace[s->devices[3].first_trace], 1), 3);
  cr_assert_eq(s->segments[1].device, 3);
  cr_assert_eq(s->segments[1].stream, 9);
  cr_assert_eq(s->segments[1].pool_id[1], 3);
  const ms_snap_block_t *b = &s->blocks[1];
  /* the hook's own frame is left out: the innermost is its caller (named through libdw, or
   * dladdr: the test program exports its symbols) */
  cr_assert_geq(ms_snap_stack_depth(s, b->stack), 1);
  cr_assert_str_eq(ms_snap_stack_frame(s, b->stack, 0)->name, "rr_program_function");
  ms_snapshot_free(s);
  char path[4096] = "";
  cr_assert_eq(ms__run_write("test", -1, path, sizeof path), MS_OK);
  for (int d = 0; d < 4; d++) {
    char p[4096];
    snprintf(p, sizeof p, "%s/d%d-0.msgpack", dir, d);
    cr_assert_eq(access(p, F_OK) == 0, d == 1 || d == 3, "%s", p);
    if (d != 1 && d != 3) continue;
    ms_snapshot_t *f = NULL;
    ms_errbuf_t eb = {0};
    cr_assert_eq(ms_snapshot_load(p, &f, &eb), MS_OK, "%s", eb.msg);
    cr_assert_eq(f->nsegments, 1);
    cr_assert_eq(f->segments[0].device, d);
    ms_snapshot_free(f);
  }
  th_rmdir(dir);
  free(dir);
}

typedef struct {
  int t;
} rr_arg_t;

static void *rr_worker(void *arg) {
  int t = ((rr_arg_t *)arg)->t;
  for (int i = 0; i < 2000; i++) {
    uint64_t a = ADDR(t * 100000 + i);
    uint32_t st = ms__run_stack(0);
    ms__run_on_alloc(0, a, 256 + (uint64_t)t, (uint64_t)t + 1, NULL, st, 0);
    if (i % 2 == 0) {
      uint64_t begin = ms__run_free_begin();
      ms__run_free_end(a, begin, true);
    }
  }
  return NULL;
}

Test(run_record, eight_threads_record_every_event, .fini = rr_fini, .timeout = 60) {
  rr_start("1000000", "8");
  pthread_t th[8];
  rr_arg_t args[8];
  for (int t = 0; t < 8; t++) {
    args[t].t = t;
    pthread_create(&th[t], NULL, rr_worker, &args[t]);
  }
  for (int t = 0; t < 8; t++)
    pthread_join(th[t], NULL);
  ms_snapshot_t *s = rr_take(-1);
  cr_assert_eq(s->nsegments, 8 * 1000);
  cr_assert_eq(s->devices[0].ntrace, 8 * (2000 * 2 + 1000 * 3));
  cr_assert_eq(s->devices[0].trace_dropped, 0);
  size_t per_stream[9] = {0};
  for (uint32_t i = 0; i < s->devices[0].ntrace; i++)
    if (s->trace[i].action == MS_TRACE_ALLOC) per_stream[ms_snap_trace_stream(&s->trace[i])]++;
  for (int t = 1; t <= 8; t++)
    cr_assert_eq(per_stream[t], 2000, "stream %d", t);
  ms_snapshot_free(s);
}

extern ms_allocator_t *record_stub_allocs[4];
extern size_t record_stub_nallocs;

/* The cache mode's snapshot: the allocators' (here on the sim backend, device 1) merged with the
 * passthrough allocations the recorder holds: segments by device and address, traces by time,
 * the allocators' statistics and settings kept. */
Test(run_record, the_cache_snapshot_merges_the_passthrough_allocations, .fini = rr_fini) {
  rr_start("1000", "8");
  ms_sim_config_t sc = {.ndevices = 2, .capacity = (size_t)1 << 30};
  ms_backend_t *be;
  cr_assert_eq(ms_backend_sim_create(&sc, &be), MS_OK);
  ms_allocator_config_t ac = {.backend = be, .device = 1};
  ms_allocator_t *a;
  cr_assert_eq(ms_allocator_create(&ac, &a, NULL), MS_OK);
  cr_assert_eq(ms_allocator_record_history(a, NULL, NULL), MS_OK);
  record_stub_allocs[0] = a;
  record_stub_nallocs = 1;

  int64_t managed[2] = {0, -1};
  ms__run_on_alloc(1, 0x1000, 777, 0, managed, rr_program_function(), MS__RUN_KIND_MANAGED);
  ms_devptr_t p, q;
  cr_assert_eq(ms_allocator_malloc(a, 3u << 20, 0, &p), MS_OK);
  ms__run_on_alloc(0, 0x2000, 555, 0, managed, 0, MS__RUN_KIND_MANAGED);
  cr_assert_eq(ms_allocator_malloc(a, 1000, 0, &q), MS_OK);
  cr_assert_eq(ms_allocator_free(a, q), MS_OK);
  ms__run_on_alloc(1, 0xfff1000000000000ULL, 999, 0, managed, 0, MS__RUN_KIND_MANAGED);

  ms_snapshot_t *s = rr_take(-1);
  /* device 0: the passthrough 555; device 1: 0x1000 first, the allocator's 20 MiB and 2 MiB
   * segments, then the one above them */
  cr_assert_eq(s->nsegments, 5);
  cr_assert_eq(s->segments[0].device, 0);
  cr_assert_eq(s->segments[0].total_size, 555);
  cr_assert_eq(s->segments[1].address, 0x1000);
  cr_assert_str_eq(ms_snap_stack_frame(s, s->segments[1].stack, 0)->name, "rr_program_function");
  for (size_t i = 2; i < 4; i++) {
    cr_assert_eq(s->segments[i].device, 1);
    cr_assert_eq(s->segments[i].pool_id[1], 0);
    cr_assert_gt(s->segments[i].address, s->segments[i - 1].address);
  }
  cr_assert_eq(s->segments[4].total_size, 999);
  uint64_t sizes = s->segments[2].total_size + s->segments[3].total_size;
  cr_assert_eq(sizes, (20u << 20) + (2u << 20));
  /* device 1's trace: two entries per passthrough allocation there (4), and the allocator's
   * seven (segment_alloc, alloc, segment_alloc, alloc, free_requested, free_completed, snapshot),
   * by time */
  const ms_snap_device_t *d1 = &s->devices[1];
  cr_assert_eq(d1->ntrace, 4 + 7, "%u entries", d1->ntrace);
  for (uint32_t i = 1; i < d1->ntrace; i++)
    cr_assert_geq(s->trace[d1->first_trace + i].time_us, s->trace[d1->first_trace + i - 1].time_us);
  cr_assert_eq(ms_snap_trace_pool(&s->trace[d1->first_trace], 1), -1); /* the first call was passed through */
  /* the allocator's statistics and settings */
  bool seen = false;
  for (uint32_t i = 0; i < d1->nstats; i++)
    if (strcmp(s->stats[d1->first_stat + i].key, "allocation.all.allocated") == 0) {
      cr_assert_eq(s->stats[d1->first_stat + i].i, 2);
      seen = true;
    }
  cr_assert(seen);
  cr_assert(s->present & MS_SNAP_HAS_SETTINGS);
  cr_assert_gt(s->nsettings_top, 0);
  /* it writes and reads back */
  ms_sink_t sink;
  th_memsink_t m;
  th_memsink_init(&sink, &m);
  ms_errbuf_t eb = {0};
  cr_assert_eq(ms_snapshot_write(s, NULL, &sink, &eb), MS_OK, "%s", eb.msg);
  ms_source_t src;
  ms_membuf_t mb;
  ms_source_init_mem(&src, &mb, m.data, m.len);
  ms_snapshot_t *back = NULL;
  cr_assert_eq(ms_snapshot_read(&src, &back, &eb), MS_OK, "%s", eb.msg);
  TH_ASSERT_SNAP_EQ(s, back);
  ms_snapshot_free(back);
  th_memsink_free(&m);
  ms_snapshot_free(s);
  record_stub_nallocs = 0;
  ms_allocator_free(a, p);
  ms_allocator_destroy(a);
  ms_backend_destroy(be);
}
