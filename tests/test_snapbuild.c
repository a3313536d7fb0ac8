/* SPDX-License-Identifier: MIT
 * Tests for the snapshot builder: interning, settings rebasing, validation, ownership. */
#include <criterion/criterion.h>
#include <string.h>

#include "model/snapbuild.h"

Test(snapbuild, frames_and_stacks_are_interned) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  uint32_t f1, f2, f3;
  cr_assert_eq(ms__snapbuild_frame(&b, "forward", 7, "model.py", 8, 12, &f1), MS_OK);
  cr_assert_eq(ms__snapbuild_frame(&b, "forward", 7, "model.py", 8, 12, &f2), MS_OK);
  cr_assert_eq(ms__snapbuild_frame(&b, "forward", 7, "model.py", 8, 13, &f3), MS_OK);
  cr_assert_eq(f1, f2);
  cr_assert_neq(f1, f3);
  uint32_t fr[2] = {f1, f3}, s1, s2, s3;
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 2, &s1), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 2, &s2), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 0, &s3), MS_OK);
  cr_assert_eq(s1, s2);
  cr_assert_neq(s1, s3);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  cr_assert_eq(s->nframes, 2);
  cr_assert_eq(s->nstacks, 2);
  cr_assert_eq(ms_snap_stack_depth(s, s1), 2);
  cr_assert_str_eq(ms_snap_stack_frame(s, s1, 1)->name, "forward");
  cr_assert_eq(ms_snap_stack_frame(s, s1, 1)->line, 13);
  ms_snapshot_free(s);
  ms__snapbuild_release(&b);
}

Test(snapbuild, many_stacks_stay_distinct) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  for (uint32_t i = 0; i < 100000; i++) {
    uint32_t fr[3] = {i, i + 1, i * 7}, id;
    cr_assert_eq(ms__snapbuild_stack(&b, fr, 3, &id), MS_OK);
    cr_assert_eq(id, i);
  }
  for (uint32_t i = 0; i < 100000; i += 997) {
    uint32_t fr[3] = {i, i + 1, i * 7}, id;
    cr_assert_eq(ms__snapbuild_stack(&b, fr, 3, &id), MS_OK);
    cr_assert_eq(id, i);
  }
  ms__snapbuild_release(&b);
}

Test(snapbuild, settings_maps_are_rebased) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  ms_snap_kv_t a = {.key = "max_split_size", .kind = MS_SNAP_VAL_INT, .i = 7};
  cr_assert_eq(ms__snapbuild_add_setting(&b, &a), MS_OK);
  uint32_t first = 0, idx;
  for (int i = 0; i < 3; i++) {
    ms_snap_kv_t c = {.key = i == 0 ? "1" : i == 1 ? "2" : "4", .kind = MS_SNAP_VAL_INT, .i = i};
    cr_assert_eq(ms__snapbuild_add_setting_child(&b, &c, &idx), MS_OK);
    if (i == 0) first = idx;
  }
  ms_snap_kv_t m = {.key = "roundup_power2_divisions", .kind = MS_SNAP_VAL_MAP, .first = first, .count = 3};
  cr_assert_eq(ms__snapbuild_add_setting(&b, &m), MS_OK);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  cr_assert_eq(s->nsettings_top, 2);
  cr_assert_eq(s->nsettings, 5);
  const ms_snap_kv_t *map = &s->settings[1];
  cr_assert_eq(map->first, 2);
  cr_assert_str_eq(s->settings[map->first + 2].key, "4");
  ms_snapshot_free(s);
}

Test(snapbuild, finish_rejects_dangling_references) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  ms_snap_segment_t seg = {.first_block = 0, .nblocks = 2, .stack = MS_SNAP_NO_STACK};
  cr_assert_eq(ms__snapbuild_add_segment(&b, &seg), MS_OK);
  ms_errbuf_t eb = {{0}};
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_EFORMAT);
  cr_assert_null(s);
  cr_assert_str_eq(eb.msg, "segment 0: blocks out of range");
  ms__snapbuild_release(&b);
}

Test(snapbuild, names_round_trip) {
  for (int a = 0; a < MS_TRACE_OTHER; a++)
    cr_assert_eq(ms_trace_action_parse(ms_trace_action_name((ms_trace_action)a)), a);
  cr_assert_eq(ms_trace_action_parse("bogus"), MS_TRACE_OTHER);
  cr_assert_eq(ms_block_state_parse("active_pending_free"), MS_BLOCK_ACTIVE_PENDING_FREE);
  cr_assert_eq(ms_block_state_parse("active_awaiting_free"), MS_BLOCK_STATE_OTHER);
}

/* ---- the big tables' pages (common/internal.h, "bigmem.c") ---------------------------------- */

#include <sys/mman.h>
#include <unistd.h>

#include "common/internal.h"
#include "memsnap/options.h"

/* Whether the page of p is mapped (mincore fails with ENOMEM on a hole). */
static bool sb_mapped(const void *p) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  unsigned char v;
  return mincore((void *)((uintptr_t)p & ~(uintptr_t)(pg - 1)), 1, &v) == 0;
}

/* A snapshot of n trace entries, made by the builder. */
static ms_snapshot_t *sb_trace_snapshot(size_t n) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  for (size_t i = 0; i < n; i++) {
    ms_snap_trace_t t = {0};
    t.action = MS_TRACE_ALLOC;
    t.addr = 0x1000 * (i + 1);
    t.size = 512;
    t.stack = MS_SNAP_NO_STACK;
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  cr_assert_eq(s->ntrace, n);
  return s;
}

/* The trace of a snapshot made by the builder is a big array: freed with the snapshot, its pages
 * are kept for the next file's tables when the process reuses memory, and given back otherwise. */
Test(snapbuild, the_trace_pages_are_kept_for_the_next_file) {
  ms_option_set(MS_OPTION_REUSE_MEMORY, 1);
  enum { N = 16 << 13 }; /* a vector's capacity exactly (from 16, doubled): every page written */
  ms_snapshot_t *s = sb_trace_snapshot(N);
  const ms_snap_trace_t *t = s->trace;
  cr_assert_eq(t[N - 1].addr, 0x1000 * (uint64_t)N);
  ms_snapshot_free(s);
  cr_assert(sb_mapped(t), "kept");
  ms_snapshot_t *s2 = sb_trace_snapshot(N);
  cr_assert_eq(s2->trace, t, "the next snapshot's trace takes the same pages");
  cr_assert_eq(s2->trace[5].addr, 0x6000);
  ms_option_set(MS_OPTION_REUSE_MEMORY, 0);
  ms_snapshot_free(s2);
  cr_assert(!sb_mapped(t), "given back");
}
