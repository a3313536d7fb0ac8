/* SPDX-License-Identifier: MIT
 * Tests of the PyTorch pickle reader and writer (memsnap/pickle.h, issue #4): every fixture's
 * counts as listed in fixtures/torch/SOURCES.md, spot checks of fields, round trips (fixture ->
 * pickle -> model, synthetic snapshots covering what the fixtures lack), pickles of protocols
 * 1 to 5 made by Python, Python loading what we write, and hostile input: every truncation of a
 * small fixture, code-running opcodes, deep nesting, absurd lengths, bad memo indices and a wrong
 * type at every key, each with its exact message.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "helpers.h"
#include "memsnap/pickle.h"
#include "common/internal.h"
#include "model/snapbuild.h"

/* ---- helpers ------------------------------------------------------------------------------- */

/* Reads a fixture, or skips the test with a visible SKIP line when the fixtures are absent. */
static char *fixture(const char *name, size_t *len) {
  char path[4096];
  snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), name);
  char *p = th_read_text(path, len);
  if (!p) {
    printf("SKIP: PyTorch fixture %s not found (set MEMSNAP_TORCH_FIXTURES)\n", path);
    fflush(stdout);
    cr_skip_test("fixture %s not found", path);
  }
  return p;
}

static ms_snapshot_t *read_ok(const void *data, size_t len) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  int rc = th_pickle_read_mem(data, len, 0, &s, &eb);
  cr_assert_eq(rc, MS_OK, "read failed: %s", eb.msg);
  return s;
}

/* A growable byte buffer (tests/helpers.h); also used as the writer's sink. */
typedef th_bytes_t pk_t;

static pk_t write_mem(const ms_snapshot_t *s) {
  pk_t k = {0};
  ms_sink_t sink = {th_bytes_sink_write, &k};
  ms_errbuf_t eb = {{0}};
  int rc = ms_pickle_write(s, &sink, &eb);
  cr_assert_eq(rc, MS_OK, "write failed: %s", eb.msg);
  return k;
}

/* Expects a failure with code `code` and exactly the message `msg`. */
static void expect_err(const void *data, size_t len, int code, const char *msg) {
  ms_snapshot_t *s = (ms_snapshot_t *)0x1;
  ms_errbuf_t eb;
  int rc = th_pickle_read_mem(data, len, 0, &s, &eb);
  cr_assert_eq(rc, code, "expected %s, got %s (%s)", ms_err_name(code), ms_err_name(rc), eb.msg);
  cr_assert_eq(s, (ms_snapshot_t *)0x1, "out-parameter touched on failure");
  if (msg) cr_assert_str_eq(eb.msg, msg);
}

/* ---- model equality --------------------------------------------------------------------------- */

/* Set by eq_model(check_present = false): a memsnap snapshot's "no stack" on a block or segment
 * is written as PyTorch's empty frames list and reads back as a recorded empty stack. */
static bool eq_loose_stacks;

static void eq_stack(const ms_snapshot_t *a, uint32_t sa, const ms_snapshot_t *b, uint32_t sb,
                     const char *what, size_t i) {
  if (eq_loose_stacks && (sa == MS_SNAP_NO_STACK) != (sb == MS_SNAP_NO_STACK)) {
    cr_assert_eq(ms_snap_stack_depth(a, sa), 0, "%s %zu", what, i);
    cr_assert_eq(ms_snap_stack_depth(b, sb), 0, "%s %zu", what, i);
    return;
  }
  cr_assert_eq(sa == MS_SNAP_NO_STACK, sb == MS_SNAP_NO_STACK, "%s %zu: stack presence", what, i);
  if (sa == MS_SNAP_NO_STACK) return;
  uint32_t n = ms_snap_stack_depth(a, sa);
  cr_assert_eq(n, ms_snap_stack_depth(b, sb), "%s %zu: stack depth", what, i);
  for (uint32_t k = 0; k < n; k++) {
    const ms_snap_frame_t *fa = ms_snap_stack_frame(a, sa, k), *fb = ms_snap_stack_frame(b, sb, k);
    cr_assert_str_eq(fa->name, fb->name, "%s %zu frame %u", what, i, k);
    cr_assert_str_eq(fa->filename, fb->filename, "%s %zu frame %u", what, i, k);
    cr_assert_eq(fa->line, fb->line, "%s %zu frame %u", what, i, k);
  }
}

static void eq_kv(const ms_snapshot_t *a, const ms_snap_kv_t *x, const ms_snapshot_t *b,
                  const ms_snap_kv_t *y) {
  cr_assert_str_eq(x->key, y->key);
  cr_assert_eq(x->kind, y->kind, "setting %s", x->key);
  switch (x->kind) {
  case MS_SNAP_VAL_BOOL: cr_assert_eq(x->b, y->b); break;
  case MS_SNAP_VAL_INT: cr_assert_eq(x->i, y->i); break;
  case MS_SNAP_VAL_FLOAT: cr_assert_eq(x->f, y->f); break;
  case MS_SNAP_VAL_STR: cr_assert_str_eq(x->s, y->s); break;
  case MS_SNAP_VAL_MAP:
    cr_assert_eq(x->count, y->count);
    for (uint32_t i = 0; i < x->count; i++)
      eq_kv(a, &a->settings[x->first + i], b, &b->settings[y->first + i]);
    break;
  default: break;
  }
}

/* Compares two models field by field (strings by content, stacks by their frames).
 * check_present: also compare origin and the present bits. */
static void eq_model(const ms_snapshot_t *a, const ms_snapshot_t *b, bool check_present) {
  eq_loose_stacks = !check_present;
  if (check_present) {
    cr_assert_eq(a->origin, b->origin);
    cr_assert_eq(a->present, b->present);
  }
  cr_assert_eq(a->nsegments, b->nsegments);
  cr_assert_eq(a->nblocks, b->nblocks);
  cr_assert_eq(a->nhistory, b->nhistory);
  cr_assert_eq(a->ndevices, b->ndevices);
  cr_assert_eq(a->ntrace, b->ntrace);
  cr_assert_eq(a->nsettings_top, b->nsettings_top);
  cr_assert_eq(a->nannotations, b->nannotations);
  for (size_t i = 0; i < a->nsegments; i++) {
    const ms_snap_segment_t *x = &a->segments[i], *y = &b->segments[i];
    cr_assert_eq(x->device, y->device, "segment %zu", i);
    cr_assert_eq(x->address, y->address, "segment %zu", i);
    cr_assert_eq(x->total_size, y->total_size, "segment %zu", i);
    cr_assert_eq(x->allocated_size, y->allocated_size, "segment %zu", i);
    cr_assert_eq(x->active_size, y->active_size, "segment %zu", i);
    cr_assert_eq(x->requested_size, y->requested_size, "segment %zu", i);
    cr_assert_eq(x->stream, y->stream, "segment %zu", i);
    cr_assert_eq(x->is_large, y->is_large, "segment %zu", i);
    cr_assert_eq(x->is_expandable, y->is_expandable, "segment %zu", i);
    cr_assert_eq(x->pool_id[0], y->pool_id[0], "segment %zu", i);
    cr_assert_eq(x->pool_id[1], y->pool_id[1], "segment %zu", i);
    cr_assert_eq(x->first_block, y->first_block, "segment %zu", i);
    cr_assert_eq(x->nblocks, y->nblocks, "segment %zu", i);
    if (check_present) cr_assert_eq(x->present, y->present, "segment %zu", i);
    eq_stack(a, x->stack, b, y->stack, "segment", i);
  }
  for (size_t i = 0; i < a->nblocks; i++) {
    const ms_snap_block_t *x = &a->blocks[i], *y = &b->blocks[i];
    cr_assert_eq(x->address, y->address, "block %zu", i);
    cr_assert_eq(x->size, y->size, "block %zu", i);
    cr_assert_eq(x->requested_size, y->requested_size, "block %zu", i);
    cr_assert_eq(x->state, y->state, "block %zu", i);
    if (x->state == MS_BLOCK_STATE_OTHER) cr_assert_str_eq(x->state_name, y->state_name);
    cr_assert_eq(x->first_history, y->first_history, "block %zu", i);
    cr_assert_eq(x->nhistory, y->nhistory, "block %zu", i);
    if (check_present) cr_assert_eq(x->present, y->present, "block %zu", i);
    eq_stack(a, x->stack, b, y->stack, "block", i);
  }
  for (size_t i = 0; i < a->nhistory; i++) {
    cr_assert_eq(a->history[i].addr, b->history[i].addr);
    cr_assert_eq(a->history[i].real_size, b->history[i].real_size);
    cr_assert_eq(a->history[i].present, b->history[i].present);
    eq_stack(a, a->history[i].stack, b, b->history[i].stack, "history", i);
  }
  for (size_t d = 0; d < a->ndevices; d++) {
    cr_assert_eq(a->devices[d].first_trace, b->devices[d].first_trace);
    cr_assert_eq(a->devices[d].ntrace, b->devices[d].ntrace);
  }
  eq_loose_stacks = false; /* trace entries without frames are written without the key */
  for (size_t i = 0; i < a->ntrace; i++) {
    const ms_snap_trace_t *x = &a->trace[i], *y = &b->trace[i];
    cr_assert_eq(x->action, y->action, "trace %zu", i);
    if (x->action == MS_TRACE_OTHER) cr_assert_str_eq(ms_snap_trace_action_name(x), ms_snap_trace_action_name(y));
    cr_assert_eq(x->addr, y->addr, "trace %zu", i);
    cr_assert_eq(x->size, y->size, "trace %zu", i);
    cr_assert_eq(ms_snap_trace_stream(x), ms_snap_trace_stream(y), "trace %zu", i);
    cr_assert_eq(x->time_us, y->time_us, "trace %zu", i);
    cr_assert_str_eq(ms_snap_trace_compile_context(x), ms_snap_trace_compile_context(y), "trace %zu", i);
    cr_assert_str_eq(ms_snap_trace_user_metadata(x), ms_snap_trace_user_metadata(y), "trace %zu", i);
    if (check_present || (x->present & MS_TRACE_HAS_POOL_ID)) {
      cr_assert_eq(ms_snap_trace_pool(x, 0), ms_snap_trace_pool(y, 0), "trace %zu", i);
      cr_assert_eq(ms_snap_trace_pool(x, 1), ms_snap_trace_pool(y, 1), "trace %zu", i);
    }
    if (check_present) cr_assert_eq(x->present, y->present, "trace %zu", i);
    eq_stack(a, x->stack, b, y->stack, "trace", i);
  }
  for (size_t i = 0; i < a->nsettings_top; i++) eq_kv(a, &a->settings[i], b, &b->settings[i]);
  for (size_t i = 0; i < a->nannotations; i++) {
    cr_assert_str_eq(a->annotations[i].name, b->annotations[i].name);
    cr_assert_str_eq(a->annotations[i].stage, b->annotations[i].stage);
    cr_assert_eq(a->annotations[i].device, b->annotations[i].device);
    cr_assert_eq(a->annotations[i].time_us, b->annotations[i].time_us);
  }
}

/* ---- fixtures: counts and spot checks ------------------------------------------------------- */

typedef struct fixture_counts_s {
  const char *name;
  size_t segs, blocks, active, inactive, trace;
} fixture_counts_t;

/* From fixtures/torch/SOURCES.md. */
static const fixture_counts_t fixture_table[] = {
    {"jogregoire_diffusion_tiny", 7, 168, 161, 7, 1},
    {"a0kuma_adamw_small", 7, 21, 13, 8, 35},
    {"yiyi_flexgen_oom_legacy", 176, 463, 460, 3, 1},
    {"yiyi_flexgen_1.3b_legacy_a", 266, 791, 715, 76, 1},
    {"maphsge_select_n_4dev", 82, 415, 400, 15, 4496},
    {"cranberrii_ftcourse", 215, 1079, 802, 277, 10307},
    {"wedsonlin_cs336_medium_1024_training", 234, 1031, 885, 146, 22331},
};
#define NFIXTURES (sizeof fixture_table / sizeof fixture_table[0])

Test(pickle, fixture_counts) {
  for (size_t i = 0; i < NFIXTURES; i++) {
    const fixture_counts_t *f = &fixture_table[i];
    size_t len;
    char *data = fixture(f->name, &len);
    ms_snapshot_t *s = read_ok(data, len);
    cr_assert_eq(s->nsegments, f->segs, "%s", f->name);
    cr_assert_eq(s->nblocks, f->blocks, "%s", f->name);
    size_t active = 0;
    for (size_t k = 0; k < s->nblocks; k++) {
      cr_assert_neq(s->blocks[k].state, MS_BLOCK_STATE_OTHER, "%s", f->name);
      active += s->blocks[k].state != MS_BLOCK_INACTIVE;
    }
    cr_assert_eq(active, f->active, "%s", f->name);
    cr_assert_eq(s->nblocks - active, f->inactive, "%s", f->name);
    cr_assert_eq(s->ntrace, f->trace, "%s", f->name);
    cr_assert_eq(s->origin, MS_SNAP_ORIGIN_TORCH_DICT);
    /* blocks tile their segments */
    for (size_t g = 0; g < s->nsegments; g++) {
      const ms_snap_segment_t *seg = &s->segments[g];
      uint64_t sum = 0, addr = seg->address;
      for (uint32_t k = 0; k < seg->nblocks; k++) {
        const ms_snap_block_t *b = ms_snap_segment_block(s, seg, k);
        cr_assert_eq(b->address, addr, "%s segment %zu block %u", f->name, g, k);
        addr += b->size;
        sum += b->size;
      }
      cr_assert_eq(sum, seg->total_size, "%s segment %zu", f->name, g);
    }
    ms_snapshot_free(s);
    free(data);
  }
}

Test(pickle, spot_newest_a0kuma) {
  size_t len;
  char *data = fixture("a0kuma_adamw_small", &len);
  ms_snapshot_t *s = read_ok(data, len);
  cr_assert_eq(s->present, MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_SETTINGS |
                               MS_SNAP_HAS_ANNOTATIONS);
  const ms_snap_segment_t *g = &s->segments[0];
  cr_assert_eq(g->address, 140229407145984ull);
  cr_assert_eq(g->total_size, 41943040u);
  cr_assert_eq(g->allocated_size, 40000000u);
  cr_assert(g->is_large);
  cr_assert_not(g->is_expandable);
  cr_assert_eq(g->pool_id[0], 0);
  cr_assert_eq(g->present, MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE |
                               MS_SEG_HAS_REQUESTED_SIZE | MS_SEG_HAS_SEGMENT_TYPE);
  const ms_snap_block_t *b = ms_snap_segment_block(s, g, 0);
  cr_assert_eq(b->address, 140229407145984ull);
  cr_assert_eq(b->size, 40000000u);
  cr_assert_eq(b->state, MS_BLOCK_ACTIVE_ALLOCATED);
  cr_assert_str_eq(b->state_name, "active_allocated");
  cr_assert_eq(b->present, MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE |
                               MS_BLOCK_HAS_FRAMES);
  const ms_snap_frame_t *f0 = ms_snap_stack_frame(s, b->stack, 0);
  cr_assert_str_eq(f0->name, "torch::unwind::unwind()");
  cr_assert_str_eq(f0->filename, "??");
  cr_assert_eq(f0->line, 0);
  cr_assert_str_eq(ms_snap_stack_frame(s, b->stack, 2)->filename, "memory_snapshot.cpp");
  const ms_snap_trace_t *t = &s->trace[0];
  cr_assert_eq(t->action, MS_TRACE_SEGMENT_ALLOC);
  cr_assert_eq(t->addr, 140229407145984ull);
  cr_assert_eq(t->size, 41943040u);
  cr_assert_eq(t->time_us, 1777365830342270ll);
  cr_assert_eq(ms_snap_stack_depth(s, t->stack), 49);
  cr_assert_eq(s->trace[1].time_us, 1777365830342272ll);
  /* allocator_settings: 8 top-level entries, roundup_power2_divisions a map of 16 */
  cr_assert_eq(s->nsettings_top, 8);
  cr_assert_str_eq(s->settings[0].key, "PYTORCH_CUDA_ALLOC_CONF");
  cr_assert_eq(s->settings[0].kind, MS_SNAP_VAL_STR);
  cr_assert_str_eq(s->settings[1].key, "max_split_size");
  cr_assert_eq(s->settings[1].i, -1);
  cr_assert_eq(s->settings[2].kind, MS_SNAP_VAL_FLOAT);
  cr_assert_eq(s->settings[3].kind, MS_SNAP_VAL_BOOL);
  const ms_snap_kv_t *rp = &s->settings[7];
  cr_assert_str_eq(rp->key, "roundup_power2_divisions");
  cr_assert_eq(rp->kind, MS_SNAP_VAL_MAP);
  cr_assert_eq(rp->count, 16);
  cr_assert_str_eq(s->settings[rp->first].key, "1");
  cr_assert_str_eq(s->settings[rp->first + 15].key, "32768");
  cr_assert_eq(s->nannotations, 2);
  cr_assert_str_eq(s->annotations[0].stage, "START");
  cr_assert_str_eq(s->annotations[0].name, "Optimizer.step#AdamW.step");
  cr_assert_eq(s->annotations[0].time_us, 1777365830753774ll);
  ms_snapshot_free(s);
  free(data);
}

Test(pickle, spot_windows_paths_jogregoire) {
  size_t len;
  char *data = fixture("jogregoire_diffusion_tiny", &len);
  ms_snapshot_t *s = read_ok(data, len);
  const ms_snap_block_t *b = &s->blocks[0];
  cr_assert_eq(b->address, 81646321664ull);
  cr_assert_eq(b->size, 8519680u);
  cr_assert_eq(ms_snap_stack_depth(s, b->stack), 17);
  const ms_snap_frame_t *f = ms_snap_stack_frame(s, b->stack, 0);
  cr_assert_str_eq(f->name, "forward");
  cr_assert_str_eq(f->filename, "C:\\Users\\jgregoire\\AppData\\Local\\Programs\\Python\\Python310"
                                "\\lib\\site-packages\\torch\\nn\\modules\\linear.py");
  cr_assert_eq(f->line, 116);
  cr_assert_eq(s->trace[0].action, MS_TRACE_FREE_COMPLETED);
  cr_assert_eq(s->trace[0].time_us, 1709895075849930ll);
  cr_assert_eq(s->trace[0].present, MS_TRACE_HAS_STREAM | MS_TRACE_HAS_TIME);
  ms_snapshot_free(s);
  free(data);
}

Test(pickle, spot_legacy_history) {
  size_t len;
  char *data = fixture("yiyi_flexgen_1.3b_legacy_a", &len);
  ms_snapshot_t *s = read_ok(data, len);
  cr_assert_eq(s->nhistory, 1248);
  cr_assert_eq(s->present, MS_SNAP_HAS_DEVICE_TRACES);
  const ms_snap_segment_t *g = &s->segments[28];
  cr_assert_eq(g->address, 139687234633728ull);
  cr_assert_eq(g->present & (MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID), 0);
  const ms_snap_block_t *b1 = ms_snap_segment_block(s, g, 1);
  /* 2.0 blocks have no address: computed from the segment and the preceding sizes */
  cr_assert_eq(b1->present & MS_BLOCK_HAS_ADDRESS, 0);
  cr_assert(b1->present & MS_BLOCK_HAS_HISTORY);
  cr_assert_eq(b1->address, 139687234633728ull + 33554432ull);
  cr_assert_eq(b1->nhistory, 1);
  cr_assert_eq(s->history[b1->first_history].addr, 139687268188160ull);
  cr_assert_eq(s->history[b1->first_history].real_size, 8519680u);
  const ms_snap_block_t *b0 = ms_snap_segment_block(s, g, 0);
  cr_assert_eq(b0->state, MS_BLOCK_INACTIVE);
  cr_assert_eq(b0->nhistory >= 2, 1);
  cr_assert_eq(s->history[b0->first_history + 1].addr, 139687243530240ull);
  cr_assert(s->history[b0->first_history].present & MS_HIST_HAS_FRAMES);
  ms_snapshot_free(s);
  free(data);

  data = fixture("yiyi_flexgen_oom_legacy", &len);
  s = read_ok(data, len);
  const ms_snap_history_t *h = &s->history[s->blocks[0].first_history];
  const ms_snap_frame_t *f = ms_snap_stack_frame(s, h->stack, 0);
  cr_assert_str_eq(f->name, "allocate");
  cr_assert_str_eq(f->filename, "/home/dingyiran/FlexGen/flexgen/pytorch_backend.py");
  cr_assert_eq(f->line, 190);
  cr_assert_eq(s->trace[0].action, MS_TRACE_SNAPSHOT);
  cr_assert_eq(s->trace[0].size, 11840159744ull);
  ms_snapshot_free(s);
  free(data);
}

Test(pickle, spot_four_devices_maphsge) {
  size_t len;
  char *data = fixture("maphsge_select_n_4dev", &len);
  ms_snapshot_t *s = read_ok(data, len);
  cr_assert_eq(s->ndevices, 4);
  cr_assert_eq(s->devices[0].ntrace, 4496);
  for (int d = 1; d < 4; d++) cr_assert_eq(s->devices[d].ntrace, 0);
  cr_assert_eq(s->trace[0].action, MS_TRACE_ALLOC);
  cr_assert_eq(s->trace[0].addr, 140650101468672ull);
  cr_assert_eq(s->trace[0].size, 32768u);
  cr_assert_eq(s->trace[0].present & MS_TRACE_HAS_TIME, 0);
  cr_assert_eq(ms_snap_stack_depth(s, s->trace[0].stack), 55);
  /* the segment's recorded stack is an empty list, distinct from "no stack" */
  cr_assert_neq(s->segments[0].stack, MS_SNAP_NO_STACK);
  cr_assert_eq(ms_snap_stack_depth(s, s->segments[0].stack), 0);
  ms_snapshot_free(s);
  free(data);
}

Test(pickle, spot_compile_context_wedsonlin) {
  size_t len;
  char *data = fixture("wedsonlin_cs336_medium_1024_training", &len);
  ms_snapshot_t *s = read_ok(data, len);
  const ms_snap_trace_t *t = &s->trace[0];
  cr_assert_eq(t->addr, 32031899648ull);
  cr_assert_eq(t->time_us, 1783874422287973ll);
  cr_assert_str_eq(ms_snap_trace_compile_context(t), "N/A");
  cr_assert_str_eq(ms_snap_trace_user_metadata(t), "");
  cr_assert_eq(t->present, MS_TRACE_HAS_STREAM | MS_TRACE_HAS_TIME |
                               MS_TRACE_HAS_COMPILE_CONTEXT | MS_TRACE_HAS_USER_METADATA |
                               MS_TRACE_HAS_FRAMES);
  cr_assert_eq(ms_snap_stack_depth(s, t->stack), 58);
  const ms_snap_trace_t *last = &s->trace[s->ntrace - 1];
  cr_assert_eq(last->action, MS_TRACE_FREE_COMPLETED);
  cr_assert_eq(last->addr, 46630305792ull);
  cr_assert_eq(last->size, 40960000u);
  cr_assert_eq(s->segments[233].address, 55314481152ull);
  ms_snapshot_free(s);
  free(data);
}

/* ---- round trips ------------------------------------------------------------------------------ */

Test(pickle, roundtrip_fixtures) {
  for (size_t i = 0; i < NFIXTURES; i++) {
    size_t len;
    char *data = fixture(fixture_table[i].name, &len);
    ms_snapshot_t *a = read_ok(data, len);
    pk_t w1 = write_mem(a);
    ms_snapshot_t *b = read_ok(w1.p, w1.n);
    eq_model(a, b, true);
    /* writing the re-read model gives the same bytes */
    pk_t w2 = write_mem(b);
    cr_assert_eq(w1.n, w2.n, "%s", fixture_table[i].name);
    cr_assert(memcmp(w1.p, w2.p, w1.n) == 0, "%s", fixture_table[i].name);
    /* shared frames through the memo: never larger than PyTorch's own file */
    cr_assert_leq(w1.n, len, "%s", fixture_table[i].name);
    ms_snapshot_free(a);
    ms_snapshot_free(b);
    free(w1.p);
    free(w2.p);
    free(data);
  }
}

/* A memsnap-origin snapshot covering what the fixtures lack: several streams and devices,
 * active_pending_free, expandable segments, segment_map/unmap, oom, private pools, unsigned
 * 64-bit streams, negative times, long strings, lists longer than one batch of 1000, nested
 * settings, unknown states and actions. */
static ms_snapshot_t *synthetic(size_t ntrace) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  char longname[600];
  memset(longname, 'x', sizeof longname - 1);
  longname[sizeof longname - 1] = 0;
  memcpy(longname, "at::native::", 12);
  uint32_t fr[3], st[4];
  cr_assert_eq(ms__snapbuild_frame(&b, "forward", 7, "/m/model.py", 11, 12, &fr[0]), MS_OK);
  cr_assert_eq(ms__snapbuild_frame(&b, longname, strlen(longname), "", 0, 0, &fr[1]), MS_OK);
  cr_assert_eq(ms__snapbuild_frame(&b, "neg", 3, "n.py", 4, -3, &fr[2]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 3, &st[0]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr + 1, 1, &st[1]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, NULL, 0, &st[2]), MS_OK);
  uint32_t deep[1200];
  for (int i = 0; i < 1200; i++) deep[i] = fr[i % 3];
  cr_assert_eq(ms__snapbuild_stack(&b, deep, 1200, &st[3]), MS_OK);
  const char *states[] = {"active_allocated", "active_pending_free", "inactive", "weird_state"};
  for (int g = 0; g < 3; g++) {
    ms_snap_segment_t seg = {0};
    seg.device = g;
    seg.address = 0x7f0000000000ull + (uint64_t)g * 0x10000000ull;
    seg.stream = g == 2 ? UINT64_MAX : (uint64_t)g * 7;
    seg.is_large = g != 1;
    seg.is_expandable = g == 2;
    seg.pool_id[0] = g == 1 ? 3 : 0;
    seg.pool_id[1] = g == 1 ? -5 : 0;
    seg.stack = g == 0 ? st[0] : MS_SNAP_NO_STACK;
    seg.first_block = (uint32_t)b.blocks.len;
    size_t nb = g == 0 ? 1500 : 4;
    uint64_t addr = seg.address;
    for (size_t k = 0; k < nb; k++) {
      ms_snap_block_t blk = {0};
      blk.address = addr;
      blk.size = 512 * (k + 1);
      blk.requested_size = 500 * (k + 1);
      const char *sn = states[k % 4];
      blk.state = ms_block_state_parse(sn);
      cr_assert_eq(ms__snapbuild_str(&b, sn, strlen(sn), &blk.state_name), MS_OK);
      blk.stack = k % 3 == 0 ? st[k % 4] : MS_SNAP_NO_STACK;
      if (blk.state == MS_BLOCK_ACTIVE_ALLOCATED) seg.allocated_size += blk.size;
      if (blk.state == MS_BLOCK_ACTIVE_ALLOCATED || blk.state == MS_BLOCK_ACTIVE_PENDING_FREE) {
        seg.active_size += blk.size;
        seg.requested_size += blk.requested_size;
      }
      seg.total_size += blk.size;
      addr += blk.size;
      cr_assert_eq(ms__snapbuild_add_block(&b, &blk), MS_OK);
    }
    seg.nblocks = (uint32_t)nb;
    cr_assert_eq(ms__snapbuild_add_segment(&b, &seg), MS_OK);
  }
  const char *actions[] = {"alloc", "free_requested", "free_completed", "segment_alloc",
                           "segment_free", "segment_map", "segment_unmap", "snapshot", "oom",
                           "annotate", "future_action"};
  for (int d = 0; d < 3; d++) {
    ms_snap_device_t dev = {0};
    dev.first_trace = (uint32_t)b.trace.len;
    size_t n = d == 0 ? ntrace : d == 1 ? 0 : 11;
    for (size_t i = 0; i < n; i++) {
      ms_snap_trace_t t = {0};
      const char *an = actions[i % 11];
      t.action = (uint8_t)ms_trace_action_parse(an);
      ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
      cr_assert_eq(ms__snapbuild_str(&b, an, strlen(an), &x.action_name), MS_OK);
      t.addr = 0x7f0000000000ull + i * 512;
      t.size = i * 1000;
      x.stream = i % 5 == 0 ? UINT64_MAX - i : i;
      t.time_us = i == 3 ? -1 : 1700000000000000ll + (int64_t)i;
      t.stack = i % 4 == 0 ? MS_SNAP_NO_STACK : st[i % 4];
      x.compile_context = i % 2 ? "N/A" : "";
      x.user_metadata = i % 3 ? "" : "step=1";
      cr_assert_eq(ms__snapbuild_trace_extra(&b, &t, &x), MS_OK);
      cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
    }
    dev.ntrace = (uint32_t)n;
    cr_assert_eq(ms__snapbuild_add_device(&b, &dev), MS_OK);
  }
  ms_snap_kv_t kv = {0};
  kv.key = "PYTORCH_CUDA_ALLOC_CONF", kv.kind = MS_SNAP_VAL_STR, kv.s = "expandable_segments:True";
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  kv = (ms_snap_kv_t){0};
  kv.key = "max_split_size", kv.kind = MS_SNAP_VAL_INT, kv.i = -1;
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  kv = (ms_snap_kv_t){0};
  kv.key = "garbage_collection_threshold", kv.kind = MS_SNAP_VAL_FLOAT, kv.f = 0.6;
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  kv = (ms_snap_kv_t){0};
  kv.key = "expandable_segments", kv.kind = MS_SNAP_VAL_BOOL, kv.b = true;
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  kv = (ms_snap_kv_t){0};
  kv.key = "nothing", kv.kind = MS_SNAP_VAL_NONE;
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  uint32_t first = 0, ix;
  for (int i = 0; i < 3; i++) {
    ms_snap_kv_t c = {0};
    static const char *keys[] = {"1", "2", "4"};
    c.key = keys[i], c.kind = MS_SNAP_VAL_INT, c.i = i * 4;
    cr_assert_eq(ms__snapbuild_add_setting_child(&b, &c, &ix), MS_OK);
    if (i == 0) first = ix;
  }
  kv = (ms_snap_kv_t){0};
  kv.key = "roundup_power2_divisions", kv.kind = MS_SNAP_VAL_MAP, kv.first = first, kv.count = 3;
  cr_assert_eq(ms__snapbuild_add_setting(&b, &kv), MS_OK);
  ms_snap_annotation_t an = {"Optimizer.step#AdamW.step", "START", 1, 1700000000000001ll};
  cr_assert_eq(ms__snapbuild_add_annotation(&b, &an), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

Test(pickle, roundtrip_synthetic_newest) {
  ms_snapshot_t *a = synthetic(2500);
  pk_t w = write_mem(a);
  ms_snapshot_t *b = read_ok(w.p, w.n);
  eq_model(a, b, false);
  /* a memsnap snapshot is written in the newest format: every key present */
  cr_assert_eq(b->origin, MS_SNAP_ORIGIN_TORCH_DICT);
  cr_assert_eq(b->present, MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_SETTINGS |
                               MS_SNAP_HAS_ANNOTATIONS);
  cr_assert_eq(b->segments[0].present, MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID |
                                           MS_SEG_HAS_EXPANDABLE | MS_SEG_HAS_REQUESTED_SIZE |
                                           MS_SEG_HAS_SEGMENT_TYPE);
  cr_assert_eq(b->blocks[0].present, MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE |
                                         MS_BLOCK_HAS_FRAMES);
  /* oom keeps device_free in addr; the unknown action and state keep their strings */
  cr_assert_eq(b->trace[8].action, MS_TRACE_OOM);
  cr_assert_eq(b->trace[8].addr, a->trace[8].addr);
  cr_assert_eq(b->trace[10].action, MS_TRACE_OTHER);
  cr_assert_str_eq(ms_snap_trace_action_name(&b->trace[10]), "future_action");
  cr_assert_str_eq(b->blocks[3].state_name, "weird_state");
  cr_assert_eq(b->segments[2].stream, UINT64_MAX);
  cr_assert_eq(b->trace[3].time_us, -1);
  cr_assert_eq(b->segments[1].pool_id[1], -5);
  /* written again from the re-read model: identical bytes */
  pk_t w2 = write_mem(b);
  ms_snapshot_t *c = read_ok(w2.p, w2.n);
  eq_model(b, c, true);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  ms_snapshot_free(c);
  free(w.p);
  free(w2.p);
}

Test(pickle, roundtrip_pre2_list) {
  size_t len;
  char *data = fixture("yiyi_flexgen_oom_legacy", &len);
  ms_snapshot_t *a = read_ok(data, len);
  a->origin = MS_SNAP_ORIGIN_TORCH_LIST; /* as if read from a bare list of segments */
  pk_t w = write_mem(a);
  ms_snapshot_t *b = read_ok(w.p, w.n);
  cr_assert_eq(b->origin, MS_SNAP_ORIGIN_TORCH_LIST);
  cr_assert_eq(b->ndevices, 0);
  cr_assert_eq(b->ntrace, 0);
  cr_assert_eq(b->nsegments, 176);
  cr_assert_eq(b->nhistory, a->nhistory);
  for (size_t i = 0; i < a->nblocks; i++) cr_assert_eq(a->blocks[i].address, b->blocks[i].address);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  free(w.p);
  free(data);
}

/* ---- Python: what it writes we read, what we write it loads ---------------------------------- */

static void tmp_path(char *out, size_t cap, const char *name) {
  snprintf(out, cap, "%s/ms_test_pickle_%d_%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp",
           (int)getpid(), name);
}

Test(pickle, python_loads_what_we_write) {
  if (!th_have_python()) {
    printf("SKIP: python3 not available\n");
    cr_skip_test("python3 not available");
  }
  ms_snapshot_t *a = synthetic(1200);
  char path[512];
  tmp_path(path, sizeof path, "py.pickle");
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write_file(a, path, &eb), MS_OK, "%s", eb.msg);
  char cmd[2048];
  snprintf(cmd, sizeof cmd,
           "python3 -c \"import pickle,sys\n"
           "d=pickle.load(open(sys.argv[1],'rb'))\n"
           "assert list(d)==['segments','device_traces','allocator_settings','external_annotations']\n"
           "s=d['segments'][0]\n"
           "assert list(s)==['device','address','total_size','allocated_size','active_size',"
           "'requested_size','stream','segment_type','segment_pool_id','is_expandable','frames','blocks']\n"
           "assert list(s['blocks'][0])==['address','size','requested_size','state','frames']\n"
           "assert len(s['blocks'])==1500 and s['blocks'][1]['address']==s['address']+512\n"
           "assert s['frames'][0]=={'name':'forward','filename':'/m/model.py','line':12}\n"
           "assert s['blocks'][0]['frames'] is s['frames']\n"
           "assert d['segments'][2]['stream']==2**64-1 and d['segments'][1]['segment_pool_id']==(3,-5)\n"
           "t=d['device_traces'][0]\n"
           "assert len(d['device_traces'])==3 and len(t)==1200 and d['device_traces'][1]==[]\n"
           "assert list(t[1])==['action','addr','size','stream','time_us','compile_context','user_metadata','frames']\n"
           "assert 'frames' not in t[0] and t[8]['action']=='oom' and 'device_free' in t[8]\n"
           "assert d['allocator_settings']['roundup_power2_divisions']=={'1':0,'2':4,'4':8}\n"
           "assert d['allocator_settings']['garbage_collection_threshold']==0.6\n"
           "assert d['external_annotations'][0]['stage']=='START'\n"
           "\" %s",
           path);
  cr_assert_eq(system(cmd), 0, "python3 could not load or validate %s", path);
  unlink(path);
  ms_snapshot_free(a);
}

/* The same dict pickled by Python with protocols 1 to 5 reads to the same model. */
Test(pickle, python_protocols) {
  if (!th_have_python()) {
    printf("SKIP: python3 not available\n");
    cr_skip_test("python3 not available");
  }
  char path[512];
  tmp_path(path, sizeof path, "proto");
  char cmd[4096];
  snprintf(cmd, sizeof cmd,
           "python3 -c \"import pickle,sys\n"
           "fr=[{'name':'f%%d'%%i,'filename':'a.py','line':i} for i in range(3)]\n"
           "seg={'device':0,'address':2**47,'total_size':3072,'allocated_size':1024,"
           "'active_size':2048,'requested_size':1500,'stream':2**64-2,'segment_type':'small',"
           "'segment_pool_id':(1,2),'is_expandable':True,'frames':fr,'blocks':["
           "{'address':2**47,'size':1024,'requested_size':1000,'state':'active_allocated','frames':fr},"
           "{'address':2**47+1024,'size':1024,'requested_size':500,'state':'active_pending_free','frames':fr[1:]},"
           "{'address':2**47+2048,'size':1024,'requested_size':0,'state':'inactive','frames':[]}],"
           "'unknown':{'x':[1,2,{'y':(3,)}],'big':2**100,'neg':-2**70,'b':b'\\\\x00\\\\x01','s':{1,2},'fs':frozenset([3])}}\n"
           "tr=[{'action':'alloc','addr':2**47,'size':1000,'stream':2**64-2,'time_us':-5,'frames':fr},"
           "{'action':'oom','device_free':12345,'size':99,'stream':0}]+"
           "[{'action':'free_completed','addr':i,'size':i,'stream':0} for i in range(1001)]\n"
           "d={'segments':[seg],'device_traces':[tr,[]],'allocator_settings':{'a':None,'b':1.5,'m':{'1':2}},"
           "'external_annotations':[{'stage':'END','name':'n','device':0,'time_us':7}],'extra':[[],{}]}\n"
           "import copy\n"
           "for p in range(1,6):\n"
           " x=copy.deepcopy(d); u=x['segments'][0]['unknown']\n"
           " if p<4: u.pop('s'); u.pop('fs')\n"
           " if p<3: u.pop('b')\n"
           " pickle.dump(x,open(sys.argv[1]+str(p),'wb'),protocol=p)\n"
           "\" %s",
           path);
  cr_assert_eq(system(cmd), 0, "python3 failed to write the protocol samples");
  ms_snapshot_t *ref = NULL;
  for (int p = 1; p <= 5; p++) {
    char f[600];
    snprintf(f, sizeof f, "%s%d", path, p);
    size_t len;
    char *data = th_read_text(f, &len);
    cr_assert(data);
    unlink(f);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb;
    int rc = th_pickle_read_mem(data, len, 0, &s, &eb);
    if (p == 1) {
      /* protocol 1 has no PROTO opcode: not a PyTorch snapshot file */
      cr_assert_eq(rc, MS_EFORMAT);
      cr_assert_str_eq(eb.msg, "offset 0: not a pickle of protocol 2 or later (PyTorch snapshots "
                               "start with 0x80 0x02..0x05)");
      free(data);
      continue;
    }
    cr_assert_eq(rc, MS_OK, "protocol %d: %s", p, eb.msg);
    cr_assert_eq(s->nsegments, 1);
    cr_assert_eq(s->nblocks, 3);
    cr_assert_eq(s->segments[0].stream, UINT64_MAX - 1);
    cr_assert_eq(s->segments[0].address, 1ull << 47);
    cr_assert_not(s->segments[0].is_large);
    cr_assert(s->segments[0].is_expandable);
    cr_assert_eq(s->segments[0].pool_id[1], 2);
    cr_assert_eq(s->blocks[1].state, MS_BLOCK_ACTIVE_PENDING_FREE);
    cr_assert_eq(ms_snap_stack_depth(s, s->blocks[1].stack), 2);
    cr_assert_str_eq(ms_snap_stack_frame(s, s->blocks[1].stack, 0)->name, "f1");
    cr_assert_eq(s->ndevices, 2);
    cr_assert_eq(s->ntrace, 1003);
    cr_assert_eq(s->trace[0].time_us, -5);
    cr_assert_eq(s->trace[1].action, MS_TRACE_OOM);
    cr_assert_eq(s->trace[1].addr, 12345u);
    cr_assert_eq(s->trace[1002].addr, 1000u);
    cr_assert_eq(s->nsettings_top, 3);
    cr_assert_eq(s->settings[1].f, 1.5);
    cr_assert_eq(s->nannotations, 1);
    if (ref) {
      eq_model(ref, s, true);
      ms_snapshot_free(s);
    } else {
      ref = s;
    }
    free(data);
  }
  ms_snapshot_free(ref);
}

/* ---- hostile input ---------------------------------------------------------------------------- */

Test(pickle, every_truncation, .timeout = 120) {
  size_t len;
  char *data = fixture("jogregoire_diffusion_tiny", &len);
  for (size_t n = 0; n < len; n++) {
    ms_snapshot_t *s = (ms_snapshot_t *)0x1;
    ms_errbuf_t eb;
    int rc = th_pickle_read_mem(data, n, 0, &s, &eb);
    cr_assert_neq(rc, MS_OK, "prefix of %zu bytes was accepted", n);
    cr_assert_eq(s, (ms_snapshot_t *)0x1);
    cr_assert(rc == MS_ETRUNCATED || rc == MS_EFORMAT, "prefix %zu: %s", n, eb.msg);
    cr_assert(strncmp(eb.msg, "offset ", 7) == 0, "prefix %zu: '%s'", n, eb.msg);
  }
  expect_err(data, 100, MS_ETRUNCATED,
             "offset 99: pickle truncated: the input ends inside a string length");
  expect_err(data, 0, MS_ETRUNCATED,
             "offset 0: pickle truncated: the input ends inside the pickle header");
  free(data);
}

#define BIN(s) (s), sizeof(s) - 1

Test(pickle, refuses_code) {
  /* os.system through GLOBAL + REDUCE (protocol 2) */
  expect_err(BIN("\x80\x02" "cos\nsystem\nq\x00X\x02\x00\x00\x00lsq\x01\x85q\x02Rq\x03."),
             MS_EREFUSED,
             "offset 2: opcode GLOBAL refused: it would import or call Python code, and memsnap "
             "never executes anything from a pickle");
  /* the same through STACK_GLOBAL (protocol 4) */
  expect_err(BIN("\x80\x04\x95\x1a\x00\x00\x00\x00\x00\x00\x00\x8c\x02os\x94\x8c\x06system\x94"
                 "\x93\x94\x8c\x02ls\x94\x85\x94R\x94."),
             MS_EREFUSED,
             "offset 25: opcode STACK_GLOBAL refused: it would import or call Python code, and "
             "memsnap never executes anything from a pickle");
  /* REDUCE on values that are already there, and the other code opcodes */
  static const struct {
    const char *bytes;
    size_t len;
    const char *name;
    int off;
  } t[] = {
      {BIN("\x80\x04})R."), "REDUCE", 4},       {BIN("\x80\x04}}b."), "BUILD", 4},
      {BIN("\x80\x04(imod\nC\n."), "INST", 3},  {BIN("\x80\x04(}o."), "OBJ", 4},
      {BIN("\x80\x04})\x81."), "NEWOBJ", 4},    {BIN("\x80\x04}))\x92."), "NEWOBJ_EX", 5},
      {BIN("\x80\x04P1\n."), "PERSID", 2},      {BIN("\x80\x04K\x01Q."), "BINPERSID", 4},
      {BIN("\x80\x04\x82\x01."), "EXT1", 2},    {BIN("\x80\x04\x83\x01\x00."), "EXT2", 2},
      {BIN("\x80\x04\x84\x01\x00\x00\x00."), "EXT4", 2},
      {BIN("\x80\x05\x97."), "NEXT_BUFFER", 2}, {BIN("\x80\x05}\x98."), "READONLY_BUFFER", 3},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    char msg[300];
    snprintf(msg, sizeof msg,
             "offset %d: opcode %s refused: it would import or call Python code, and memsnap "
             "never executes anything from a pickle",
             t[i].off, t[i].name);
    expect_err(t[i].bytes, t[i].len, MS_EREFUSED, msg);
  }
}

Test(pickle, million_levels_of_nesting, .timeout = 60) {
  size_t n = 1000000;
  char *p = malloc(2 + 2 * n + 1);
  p[0] = (char)0x80, p[1] = 4;
  memset(p + 2, ']', n);
  memset(p + 2 + n, 'a', n);
  p[2 + 2 * n] = '.';
  expect_err(p, 3 + 2 * n, MS_ELIMIT, "offset 262146: pickle stack deeper than 262144 values");
  memset(p + 2, '(', n);
  expect_err(p, 3 + 2 * n, MS_ELIMIT, "offset 262146: more than 262144 nested MARKs");
  /* dicts in dicts: {'k': {'k': {...}}} one SETITEM at a time */
  char *q = malloc(2 + 5 * n + n + 1);
  size_t w = 0;
  q[w++] = (char)0x80, q[w++] = 4, q[w++] = '}';
  for (size_t i = 0; i < n; i++) q[w++] = (char)0x8c, q[w++] = 1, q[w++] = 'k', q[w++] = '}';
  memset(q + w, 's', n);
  w += n;
  q[w++] = '.';
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(q, w, 0, &s, &eb), MS_ELIMIT);
  cr_assert(strstr(eb.msg, "pickle stack deeper than 262144 values"), "%s", eb.msg);
  free(p);
  free(q);
}

Test(pickle, absurd_lengths) {
  expect_err(BIN("\x80\x04\x8d\x00\x00\x00\x00\x00\x00\x00\x40" "abc"), MS_ELIMIT,
             "offset 2: declared length 4611686018427387904 is beyond the reader's limit");
  expect_err(BIN("\x80\x04\x8e\x00\x00\x00\x00\x00\x00\x00\x40" "abc"), MS_ELIMIT,
             "offset 2: declared length 4611686018427387904 is beyond the reader's limit");
  /* 4 GiB - 2 declared in a tiny file: read as the bytes come, fails at the end of the input */
  expect_err(BIN("\x80\x04X\xfe\xff\xff\xff" "abc"), MS_ETRUNCATED,
             "offset 2: pickle truncated: the input ends inside a string");
  expect_err(BIN("\x80\x04\x8b\xff\xff\xff\x7f\x01"), MS_ELIMIT,
             "offset 2: integer of 2147483647 bytes is beyond the reader's limit");
  expect_err(BIN("\x80\x04\x8b\xff\xff\xff\xff\x01"), MS_EFORMAT,
             "offset 2: LONG4 with a negative length (-1)");
  expect_err(BIN("\x80\x04T\xff\xff\xff\xff" "a"), MS_EFORMAT,
             "offset 2: BINSTRING with a negative length");
  /* a large but truthful string goes through the streaming path */
  size_t n = 3u << 20;
  char *p = malloc(n + 32);
  memcpy(p, "\x80\x04\x8d", 3);
  for (int i = 0; i < 8; i++) p[3 + i] = (char)((uint64_t)n >> (8 * i));
  memset(p + 11, 'z', n);
  p[11 + n] = '.';
  expect_err(p, 12 + n, MS_EFORMAT,
             "offset 3145739: not a PyTorch memory snapshot: the top-level object is a str, not a "
             "dict or a list of segments");
  free(p);
}

Test(pickle, memo_errors) {
  expect_err(BIN("\x80\x04h\x05."), MS_EFORMAT, "offset 2: BINGET 5: memo entry 5 was never stored");
  expect_err(BIN("\x80\x04j\x00\x01\x00\x00."), MS_EFORMAT,
             "offset 2: LONG_BINGET 256: memo entry 256 was never stored");
  expect_err(BIN("\x80\x04}q\x03h\x02."), MS_EFORMAT,
             "offset 5: BINGET 2: memo entry 2 was never stored");
  expect_err(BIN("\x80\x04}r\x00\x00\x00\x80."), MS_ELIMIT,
             "offset 3: memo index 2147483648 is far beyond the 0 entries stored (sparse memos are "
             "not supported)");
  expect_err(BIN("\x80\x04\x94."), MS_EFORMAT, "offset 2: memo put with nothing on the stack");
  expect_err(BIN("\x80\x04(\x94."), MS_EFORMAT, "offset 3: memo put with nothing on the stack");
}

Test(pickle, structural_errors) {
  expect_err(BIN("\x80\x06}."), MS_EUNSUPPORTED,
             "offset 0: unsupported pickle protocol 6 (0 to 5 are known)");
  expect_err(BIN("PK\x03\x04"), MS_EFORMAT,
             "offset 0: not a pickle of protocol 2 or later (PyTorch snapshots start with 0x80 "
             "0x02..0x05)");
  expect_err(BIN("\x80\x04}."), MS_EFORMAT,
             "offset 3: not a PyTorch memory snapshot: the top-level dict has no 'segments' key");
  expect_err(BIN("\x80\x04K\x01."), MS_EFORMAT,
             "offset 4: not a PyTorch memory snapshot: the top-level object is an int, not a dict "
             "or a list of segments");
  /* a dict, but not the first container: said without contradicting itself (issue #16) */
  expect_err(BIN("\x80\x04}}."), MS_EFORMAT,
             "offset 4: not a PyTorch memory snapshot: the pickle returns a dict that is not its "
             "first container (a snapshot's dict or list of segments comes first)");
  expect_err(BIN("\x80\x04."), MS_EFORMAT, "offset 2: STOP with an empty stack");
  expect_err(BIN("\x80\x04\xff"), MS_EFORMAT, "offset 2: unknown opcode 0xff");
  expect_err(BIN("\x80\x04]K\x01K\x02u."), MS_EFORMAT, "offset 7: SETITEMS without a MARK");
  expect_err(BIN("\x80\x04](K\x01K\x02u."), MS_EFORMAT, "offset 8: SETITEMS on a list");
  expect_err(BIN("\x80\x04}(K\x01u."), MS_EFORMAT,
             "offset 6: SETITEMS with an odd number of values (1)");
  expect_err(BIN("\x80\x04K\x01" "a."), MS_EFORMAT,
             "offset 4: APPEND needs 2 values on the stack above the mark, found 1");
  expect_err(BIN("\x80\x04S'x'\n."), MS_EUNSUPPORTED,
             "offset 2: opcode STRING (protocol 0 text strings) is not supported; PyTorch writes "
             "protocol 2 or later");
  /* no STOP */
  expect_err(BIN("\x80\x04]"), MS_ETRUNCATED,
             "offset 3: pickle truncated: the input ends inside an opcode (no STOP)");
  /* protocol 0/1 DICT and LIST from a mark (found by fuzzing: an empty one) */
  expect_err(BIN("\x80\x02(d."), MS_EFORMAT,
             "offset 4: not a PyTorch memory snapshot: the top-level dict has no 'segments' key");
  ms_snapshot_t *e = read_ok(BIN("\x80\x02(l."));
  cr_assert_eq(e->nsegments, 0);
  ms_snapshot_free(e);
  /* an empty bare list is a valid (empty) pre-2.0 snapshot */
  ms_snapshot_t *s = read_ok(BIN("\x80\x02]."));
  cr_assert_eq(s->origin, MS_SNAP_ORIGIN_TORCH_LIST);
  cr_assert_eq(s->nsegments, 0);
  ms_snapshot_free(s);
}

/* ---- a wrong type at every key ---------------------------------------------------------------- */

typedef enum { T_INT, T_STR, T_BOOL, T_PAIR, T_LIST, T_DICT } field_type;

/* One field: the right value, or a wrong one when path == bad. */
static bool field(pk_t *k, const char *bad, const char *path, const char *key, field_type t,
                  int64_t iv, const char *sv) {
  th_pickle_str(k, key);
  if (bad && strcmp(bad, path) == 0) {
    if (t == T_STR)
      th_pickle_int(k, 7);
    else
      th_pickle_str(k, "x");
    return false;
  }
  switch (t) {
  case T_INT: th_pickle_int(k, iv); break;
  case T_STR: th_pickle_str(k, sv); break;
  case T_BOOL: th_pickle_op(k, 0x89); break;
  case T_PAIR: th_pickle_int(k, 0), th_pickle_int(k, 0), th_pickle_op(k, 0x86); break;
  default: return true; /* the caller writes the container */
  }
  return false;
}

static void frames_list(pk_t *k) {
  th_pickle_op(k, ']');
  th_pickle_op(k, '(');
  th_pickle_op(k, '}');
  th_pickle_op(k, '(');
  th_pickle_str(k, "name"), th_pickle_str(k, "f");
  th_pickle_str(k, "filename"), th_pickle_str(k, "a.py");
  th_pickle_str(k, "line"), th_pickle_int(k, 3);
  th_pickle_op(k, 'u');
  th_pickle_op(k, '}'); /* a frame dict without keys: name "", filename "", line 0 */
  th_pickle_op(k, 'e');
}

/* A small newest-format snapshot; the field at path `bad` gets a value of the wrong type. */
static pk_t emit_snapshot(const char *bad, bool with_frames_dict_bad) {
  (void)with_frames_dict_bad;
  pk_t k = {0};
  th_pickle_op(&k, 0x80), th_pickle_op(&k, 4);
  th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  if (field(&k, bad, "segments", "segments", T_LIST, 0, NULL)) {
    th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
    field(&k, bad, "segments[0].device", "device", T_INT, 0, NULL);
    field(&k, bad, "segments[0].address", "address", T_INT, 4096, NULL);
    field(&k, bad, "segments[0].total_size", "total_size", T_INT, 512, NULL);
    field(&k, bad, "segments[0].allocated_size", "allocated_size", T_INT, 512, NULL);
    field(&k, bad, "segments[0].active_size", "active_size", T_INT, 512, NULL);
    field(&k, bad, "segments[0].requested_size", "requested_size", T_INT, 500, NULL);
    field(&k, bad, "segments[0].stream", "stream", T_INT, 0, NULL);
    field(&k, bad, "segments[0].segment_type", "segment_type", T_STR, 0, "small");
    field(&k, bad, "segments[0].segment_pool_id", "segment_pool_id", T_PAIR, 0, NULL);
    field(&k, bad, "segments[0].is_expandable", "is_expandable", T_BOOL, 0, NULL);
    if (field(&k, bad, "segments[0].frames", "frames", T_LIST, 0, NULL)) th_pickle_op(&k, ']');
    if (field(&k, bad, "segments[0].blocks", "blocks", T_LIST, 0, NULL)) {
      th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
      field(&k, bad, "segments[0].blocks[0].address", "address", T_INT, 4096, NULL);
      field(&k, bad, "segments[0].blocks[0].size", "size", T_INT, 512, NULL);
      field(&k, bad, "segments[0].blocks[0].requested_size", "requested_size", T_INT, 500, NULL);
      field(&k, bad, "segments[0].blocks[0].state", "state", T_STR, 0, "active_allocated");
      if (field(&k, bad, "segments[0].blocks[0].frames", "frames", T_LIST, 0, NULL)) {
        th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
        field(&k, bad, "segments[0].blocks[0].frames[0].name", "name", T_STR, 0, "f");
        field(&k, bad, "segments[0].blocks[0].frames[0].filename", "filename", T_STR, 0, "a.py");
        field(&k, bad, "segments[0].blocks[0].frames[0].line", "line", T_INT, 3, NULL);
        th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a');
      }
      if (field(&k, bad, "segments[0].blocks[0].history", "history", T_LIST, 0, NULL)) {
        th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
        field(&k, bad, "segments[0].blocks[0].history[0].addr", "addr", T_INT, 4096, NULL);
        field(&k, bad, "segments[0].blocks[0].history[0].real_size", "real_size", T_INT, 500,
              NULL);
        if (field(&k, bad, "segments[0].blocks[0].history[0].frames", "frames", T_LIST, 0, NULL))
          th_pickle_op(&k, ']');
        th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a');
      }
      th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a');
    }
    th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a');
  }
  if (field(&k, bad, "device_traces", "device_traces", T_LIST, 0, NULL)) {
    th_pickle_op(&k, ']'), th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
    field(&k, bad, "device_traces[0][0].action", "action", T_STR, 0, "alloc");
    field(&k, bad, "device_traces[0][0].addr", "addr", T_INT, 4096, NULL);
    field(&k, bad, "device_traces[0][0].size", "size", T_INT, 500, NULL);
    field(&k, bad, "device_traces[0][0].stream", "stream", T_INT, 0, NULL);
    field(&k, bad, "device_traces[0][0].time_us", "time_us", T_INT, 1, NULL);
    field(&k, bad, "device_traces[0][0].compile_context", "compile_context", T_STR, 0, "N/A");
    field(&k, bad, "device_traces[0][0].user_metadata", "user_metadata", T_STR, 0, "");
    field(&k, bad, "device_traces[0][0].pool_id", "pool_id", T_PAIR, 0, NULL);
    if (field(&k, bad, "device_traces[0][0].frames", "frames", T_LIST, 0, NULL)) frames_list(&k);
    th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a'), th_pickle_op(&k, 'a');
  }
  if (field(&k, bad, "allocator_settings", "allocator_settings", T_DICT, 0, NULL)) {
    th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
    th_pickle_str(&k, "max_split_size"), th_pickle_int(&k, -1);
    th_pickle_str(&k, "roundup_power2_divisions"), th_pickle_op(&k, '}'), th_pickle_str(&k, "1"), th_pickle_int(&k, 4);
    th_pickle_op(&k, 's');
    th_pickle_op(&k, 'u');
  }
  if (field(&k, bad, "external_annotations", "external_annotations", T_LIST, 0, NULL)) {
    th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
    field(&k, bad, "external_annotations[0].stage", "stage", T_STR, 0, "START");
    field(&k, bad, "external_annotations[0].name", "name", T_STR, 0, "n");
    field(&k, bad, "external_annotations[0].device", "device", T_INT, 0, NULL);
    field(&k, bad, "external_annotations[0].time_us", "time_us", T_INT, 9, NULL);
    th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a');
  }
  th_pickle_op(&k, 'u');
  th_pickle_op(&k, '.');
  return k;
}

Test(pickle, wrong_type_at_every_key) {
  /* the well-typed file reads */
  pk_t good = emit_snapshot(NULL, false);
  ms_snapshot_t *s = read_ok(good.p, good.n);
  cr_assert_eq(s->nsegments, 1);
  cr_assert_eq(s->nblocks, 1);
  cr_assert_eq(s->nhistory, 1);
  cr_assert_eq(s->ntrace, 1);
  cr_assert_eq(ms_snap_stack_depth(s, s->trace[0].stack), 2);
  cr_assert_str_eq(ms_snap_stack_frame(s, s->trace[0].stack, 1)->name, "");
  cr_assert_str_eq(ms_snap_stack_frame(s, s->blocks[0].stack, 0)->filename, "a.py");
  cr_assert_eq(s->nsettings, 3);
  cr_assert_eq(s->nannotations, 1);
  ms_snapshot_free(s);
  free(good.p);
  static const struct {
    const char *path, *want, *got;
  } t[] = {
      {"segments", "list", "str"},
      {"segments[0].device", "int", "str"},
      {"segments[0].address", "int", "str"},
      {"segments[0].total_size", "int", "str"},
      {"segments[0].allocated_size", "int", "str"},
      {"segments[0].active_size", "int", "str"},
      {"segments[0].requested_size", "int", "str"},
      {"segments[0].stream", "int", "str"},
      {"segments[0].segment_type", "str", "int"},
      {"segments[0].segment_pool_id", "a tuple of two ints", "str"},
      {"segments[0].is_expandable", "bool", "str"},
      {"segments[0].frames", "list", "str"},
      {"segments[0].blocks", "list", "str"},
      {"segments[0].blocks[0].address", "int", "str"},
      {"segments[0].blocks[0].size", "int", "str"},
      {"segments[0].blocks[0].requested_size", "int", "str"},
      {"segments[0].blocks[0].state", "str", "int"},
      {"segments[0].blocks[0].frames", "list", "str"},
      {"segments[0].blocks[0].frames[0].name", "str", "int"},
      {"segments[0].blocks[0].frames[0].filename", "str", "int"},
      {"segments[0].blocks[0].frames[0].line", "int", "str"},
      {"segments[0].blocks[0].history", "list", "str"},
      {"segments[0].blocks[0].history[0].addr", "int", "str"},
      {"segments[0].blocks[0].history[0].real_size", "int", "str"},
      {"segments[0].blocks[0].history[0].frames", "list", "str"},
      {"device_traces", "list", "str"},
      {"device_traces[0][0].action", "str", "int"},
      {"device_traces[0][0].addr", "int", "str"},
      {"device_traces[0][0].size", "int", "str"},
      {"device_traces[0][0].stream", "int", "str"},
      {"device_traces[0][0].time_us", "int", "str"},
      {"device_traces[0][0].compile_context", "str", "int"},
      {"device_traces[0][0].user_metadata", "str", "int"},
      {"device_traces[0][0].pool_id", "a tuple of two ints", "str"},
      {"device_traces[0][0].frames", "list", "str"},
      {"allocator_settings", "dict", "str"},
      {"external_annotations", "list", "str"},
      {"external_annotations[0].stage", "str", "int"},
      {"external_annotations[0].name", "str", "int"},
      {"external_annotations[0].device", "int", "str"},
      {"external_annotations[0].time_us", "int", "str"},
  };
  for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
    pk_t k = emit_snapshot(t[i].path, false);
    ms_snapshot_t *out = (ms_snapshot_t *)0x1;
    ms_errbuf_t eb;
    int rc = th_pickle_read_mem(k.p, k.n, 0, &out, &eb);
    cr_assert_eq(rc, MS_EFORMAT, "%s: %s", t[i].path, eb.msg);
    cr_assert_eq(out, (ms_snapshot_t *)0x1);
    char want[300];
    snprintf(want, sizeof want, ": %s: expected %s, got %s", t[i].path, t[i].want, t[i].got);
    const char *colon = strchr(eb.msg, ':');
    cr_assert(strncmp(eb.msg, "offset ", 7) == 0 && colon, "%s", eb.msg);
    cr_assert_str_eq(colon, want);
    free(k.p);
  }
}

/* LONG1 of 1 to 8 bytes: the same value when the reader's buffer holds 8 bytes from the integer
 * (its one-load path) and when a frame ends right after it (the byte loops). */
Test(pickle, long1_every_width_and_sign) {
  static const unsigned char pats[][8] = {
      {0, 0, 0, 0, 0, 0, 0, 0},          {0x7f, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f},
      {0x80, 0, 0, 0, 0, 0, 0, 0x80},    {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff},
      {0x12, 0x34, 0x56, 0x78, 0x9a, 0xbc, 0xde, 0xf0}, {0xfe, 0x01, 0xfe, 0x01, 0xfe, 0x01, 0xfe, 0x81},
  };
  for (size_t n = 1; n <= 8; n++)
    for (size_t k = 0; k < sizeof pats / sizeof *pats; k++)
      for (int framed = 0; framed < 2; framed++) {
        /* the value Python gives: int.from_bytes(b, 'little', signed=True) */
        uint64_t u = 0;
        for (size_t i = n; i-- > 0;) u = u << 8 | pats[k][i];
        if (n < 8 && (pats[k][n - 1] & 0x80)) u |= ~(uint64_t)0 << (8 * n);
        int64_t want;
        memcpy(&want, &u, sizeof want);
        /* {'segments': [{'device': LONG1, 'blocks': []}]}, with the frame's end right after the
         * integer when framed */
        pk_t head = {0}, tail = {0}, k2 = {0};
        th_pickle_op(&head, '}'), th_pickle_op(&head, '('), th_pickle_str(&head, "segments");
        th_pickle_op(&head, ']'), th_pickle_op(&head, '}'), th_pickle_op(&head, '(');
        th_pickle_str(&head, "device");
        th_pickle_op(&head, 0x8a), th_pickle_op(&head, (int)n);
        th_bytes_put(&head, pats[k], n);
        th_pickle_str(&tail, "blocks"), th_pickle_op(&tail, ']');
        th_pickle_op(&tail, 'u'), th_pickle_op(&tail, 'a'), th_pickle_op(&tail, 'u');
        th_pickle_op(&tail, '.');
        th_pickle_op(&k2, 0x80), th_pickle_op(&k2, 4);
        if (framed) {
          th_pickle_op(&k2, 0x95), th_bytes_put_le(&k2, head.n, 8);
          th_bytes_put(&k2, head.p, head.n);
          th_pickle_op(&k2, 0x95), th_bytes_put_le(&k2, tail.n, 8);
        } else {
          th_bytes_put(&k2, head.p, head.n);
        }
        th_bytes_put(&k2, tail.p, tail.n);
        ms_snapshot_t *s = read_ok(k2.p, k2.n);
        cr_assert_eq(s->segments[0].device, want, "width %zu pattern %zu framed %d: %" PRId64
                     " not %" PRId64, n, k, framed, s->segments[0].device, want);
        ms_snapshot_free(s);
        free(head.p), free(tail.p), free(k2.p);
      }
}

Test(pickle, integers) {
  /* {'segments': [{'address': 2**64-1, 'stream': -1, 'device': -2**63, 'blocks': []}]} and
   * an unknown key holding a 100-byte integer */
  pk_t k = {0};
  th_pickle_op(&k, 0x80), th_pickle_op(&k, 4), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "segments"), th_pickle_op(&k, ']'), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "address");
  th_bytes_sink_write(&k, "\x8a\x09\xff\xff\xff\xff\xff\xff\xff\xff\x00", 11);
  th_pickle_str(&k, "stream");
  th_bytes_sink_write(&k, "\x8a\x01\xff", 3);
  th_pickle_str(&k, "device");
  th_bytes_sink_write(&k, "\x8a\x08\x00\x00\x00\x00\x00\x00\x00\x80", 10);
  th_pickle_str(&k, "total_size");
  th_bytes_sink_write(&k, "\x8b\x02\x00\x00\x00\x00\x01", 7); /* LONG4: 256 */
  th_pickle_str(&k, "huge");
  th_pickle_op(&k, 0x8a), th_pickle_op(&k, 100);
  for (int i = 0; i < 100; i++) th_pickle_op(&k, 0x7f);
  th_pickle_str(&k, "blocks"), th_pickle_op(&k, ']');
  th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a'), th_pickle_op(&k, 'u'), th_pickle_op(&k, '.');
  ms_snapshot_t *s = read_ok(k.p, k.n);
  cr_assert_eq(s->segments[0].address, UINT64_MAX);
  cr_assert_eq(s->segments[0].stream, UINT64_MAX);
  cr_assert_eq(s->segments[0].device, INT64_MIN);
  cr_assert_eq(s->segments[0].total_size, 256u);
  ms_snapshot_free(s);
  free(k.p);
  /* a negative address, and an address beyond 64 bits */
  static const char *const bad[] = {"\x8a\x01\xff", "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x00\x01"};
  static const size_t badlen[] = {3, 11};
  for (int i = 0; i < 2; i++) {
    pk_t q = {0};
    th_pickle_op(&q, 0x80), th_pickle_op(&q, 4), th_pickle_op(&q, '}'), th_pickle_str(&q, "segments"), th_pickle_op(&q, ']');
    th_pickle_op(&q, '}'), th_pickle_str(&q, "address"), th_bytes_sink_write(&q, bad[i], badlen[i]), th_pickle_op(&q, 's');
    th_pickle_op(&q, 'a'), th_pickle_op(&q, 's'), th_pickle_op(&q, '.');
    ms_snapshot_t *o = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(th_pickle_read_mem(q.p, q.n, 0, &o, &eb), MS_EFORMAT);
    cr_assert(strstr(eb.msg, ": segments[0].address: int out of range: expected an int in [0, 2^64)"),
              "%s", eb.msg);
    free(q.p);
  }
  /* a device of 2^63: an int, out of range (issue #35 item 15: it said "expected a 64-bit
   * signed int, got int") */
  pk_t q = {0};
  th_pickle_op(&q, 0x80), th_pickle_op(&q, 4), th_pickle_op(&q, '}'), th_pickle_str(&q, "segments"), th_pickle_op(&q, ']');
  th_pickle_op(&q, '}'), th_pickle_str(&q, "device");
  th_bytes_sink_write(&q, "\x8a\x09\x00\x00\x00\x00\x00\x00\x00\x80\x00", 11), th_pickle_op(&q, 's');
  th_pickle_op(&q, 'a'), th_pickle_op(&q, 's'), th_pickle_op(&q, '.');
  ms_snapshot_t *o = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(q.p, q.n, 0, &o, &eb), MS_EFORMAT);
  cr_assert(strstr(eb.msg, ": segments[0].device: int out of range: expected a 64-bit signed int"),
            "%s", eb.msg);
  cr_assert(!strstr(eb.msg, "got int"), "%s", eb.msg);
  free(q.p);
}

Test(pickle, shared_objects) {
  /* one frames list shared by two blocks (memo get) gives one interned stack; a block dict
   * stored twice is refused */
  pk_t k = {0};
  th_pickle_op(&k, 0x80), th_pickle_op(&k, 4), th_pickle_op(&k, '}'), th_pickle_str(&k, "segments"), th_pickle_op(&k, ']');
  th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "address"), th_pickle_int(&k, 0);
  th_pickle_str(&k, "blocks"), th_pickle_op(&k, ']'), th_pickle_op(&k, '(');
  th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "size"), th_pickle_int(&k, 10);
  th_pickle_str(&k, "frames");
  frames_list(&k);
  th_pickle_op(&k, 0x94); /* memo 0: the frames list */
  th_pickle_op(&k, 'u');
  th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "size"), th_pickle_int(&k, 20);
  th_pickle_str(&k, "frames"), th_pickle_op(&k, 'h'), th_pickle_op(&k, 0);
  th_pickle_op(&k, 'u');
  th_pickle_op(&k, 'e'), th_pickle_op(&k, 'u'), th_pickle_op(&k, 'a'), th_pickle_op(&k, 's'), th_pickle_op(&k, '.');
  ms_snapshot_t *s = read_ok(k.p, k.n);
  cr_assert_eq(s->nblocks, 2);
  cr_assert_eq(s->blocks[0].stack, s->blocks[1].stack);
  cr_assert_eq(s->blocks[1].address, 10u);
  cr_assert_eq(s->segments[0].total_size, 30u);
  ms_snapshot_free(s);
  free(k.p);

  pk_t q = {0};
  th_pickle_op(&q, 0x80), th_pickle_op(&q, 4), th_pickle_op(&q, '}'), th_pickle_str(&q, "segments"), th_pickle_op(&q, ']');
  th_pickle_op(&q, '}'), th_pickle_op(&q, '(');
  th_pickle_str(&q, "blocks"), th_pickle_op(&q, ']'), th_pickle_op(&q, '(');
  th_pickle_op(&q, '}'), th_pickle_op(&q, 0x94), th_pickle_str(&q, "size"), th_pickle_int(&q, 10), th_pickle_op(&q, 's');
  th_pickle_op(&q, 'h'), th_pickle_op(&q, 0);
  th_pickle_op(&q, 'e'), th_pickle_op(&q, 'u'), th_pickle_op(&q, 'a'), th_pickle_op(&q, 's'), th_pickle_op(&q, '.');
  expect_err(q.p, q.n, MS_EFORMAT,
             "offset 39: segments[0].blocks[0]: the same dict is stored twice (shared through "
             "the memo)");
  free(q.p);
}

/* ---- files ------------------------------------------------------------------------------------ */

Test(pickle, write_file_atomic) {
  ms_snapshot_t *a = synthetic(10);
  char path[512];
  tmp_path(path, sizeof path, "atomic.pickle");
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write_file(a, path, &eb), MS_OK, "%s", eb.msg);
  size_t len;
  char *data = th_read_text(path, &len);
  cr_assert(data);
  ms_snapshot_t *b = read_ok(data, len);
  eq_model(a, b, false);
  free(data);
  ms_snapshot_free(b);
  /* a directory that does not exist: an error naming it, nothing written */
  char bad[600];
  snprintf(bad, sizeof bad, "%s.d/none/x.pickle", path);
  memset(&eb, 0, sizeof eb);
  cr_assert_neq(ms_pickle_write_file(a, bad, &eb), MS_OK);
  cr_assert(strstr(eb.msg, "x.pickle"), "%s", eb.msg);
  struct stat st;
  cr_assert_neq(stat(bad, &st), 0);
  unlink(path);
  ms_snapshot_free(a);
}

/* ---- through memsnap's own format, and `memsnap convert` ----------------------------------- */

Test(pickle, roundtrip_through_memsnap_format) {
  for (size_t i = 0; i < NFIXTURES; i++) {
    size_t len;
    char *data = fixture(fixture_table[i].name, &len);
    ms_snapshot_t *a = read_ok(data, len);
    for (int compress = 0; compress <= 1; compress++) {
      pk_t m = {0};
      ms_sink_t sink = {th_bytes_sink_write, &m};
      ms_write_opts_t wo = {compress ? 6 : 0};
      ms_errbuf_t eb = {{0}};
      cr_assert_eq(ms_snapshot_write(a, &wo, &sink, &eb), MS_OK, "%s", eb.msg);
      ms_membuf_t mb;
      ms_source_t src;
      ms_source_init_mem(&src, &mb, m.p, m.n);
      ms_snapshot_t *b = NULL;
      cr_assert_eq(ms_snapshot_read(&src, &b, &eb), MS_OK, "%s", eb.msg);
      pk_t w = write_mem(b);
      ms_snapshot_t *c = read_ok(w.p, w.n);
      eq_model(a, c, true); /* fixture -> memsnap format -> pickle -> the same model */
      ms_snapshot_free(b);
      ms_snapshot_free(c);
      free(m.p);
      free(w.p);
    }
    ms_snapshot_free(a);
    free(data);
  }
}

static const char *memsnap_bin(void) {
  const char *b = getenv("MEMSNAP_BIN");
  if (!b || access(b, X_OK) != 0) {
    printf("SKIP: memsnap binary not found (MEMSNAP_BIN=%s)\n", b ? b : "");
    fflush(stdout);
    cr_skip_test("memsnap binary not built");
  }
  return b;
}

Test(pickle, convert_cli) {
  const char *bin = memsnap_bin();
  size_t len;
  char *data = fixture("a0kuma_adamw_small", &len);
  free(data);
  char in[4096], z[600], pk[600], cmd[8192];
  snprintf(in, sizeof in, "%s/a0kuma_adamw_small.pickle", th_fixture_dir());
  tmp_path(z, sizeof z, "conv.msnap.gz");
  tmp_path(pk, sizeof pk, "conv.pkl");
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' && '%s' convert '%s' '%s'", bin, in, z, bin, z,
           pk);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  char *orig = th_read_text(in, &len);
  ms_snapshot_t *a = read_ok(orig, len);
  size_t plen;
  char *back = th_read_text(pk, &plen);
  cr_assert(back);
  ms_snapshot_t *b = read_ok(back, plen);
  eq_model(a, b, true);
  ms_snapshot_free(a);
  ms_snapshot_free(b);
  free(orig);
  free(back);
  /* the format of OUT: unknown name without --to, unknown --to: usage errors, nothing written */
  char bad[600];
  tmp_path(bad, sizeof bad, "conv.bin");
  snprintf(cmd, sizeof cmd, "'%s' convert '%s' '%s' 2>/dev/null", bin, in, bad);
  int st = system(cmd);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "exit %d", st);
  snprintf(cmd, sizeof cmd, "'%s' convert --to foo '%s' '%s' 2>/dev/null", bin, in, bad);
  st = system(cmd);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "exit %d", st);
  struct stat sb;
  cr_assert_neq(stat(bad, &sb), 0);
  /* --to wins over the name; a hostile input fails with exit 1 and leaves no output */
  snprintf(cmd, sizeof cmd, "'%s' convert --to pickle '%s' '%s'", bin, z, bad);
  cr_assert_eq(system(cmd), 0);
  back = th_read_text(bad, &plen);
  cr_assert(back && plen > 2 && (unsigned char)back[0] == 0x80 && back[1] == 4);
  free(back);
  unlink(bad);
  char evil[600];
  tmp_path(evil, sizeof evil, "evil.pickle");
  FILE *f = fopen(evil, "wb");
  fwrite("\x80\x02" "cos\nsystem\n", 1, 13, f);
  fclose(f);
  snprintf(cmd, sizeof cmd, "'%s' convert --to pickle '%s' '%s' 2>/dev/null", bin, evil, bad);
  st = system(cmd);
  cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "exit %d", st);
  cr_assert_neq(stat(bad, &sb), 0);
  unlink(evil);
  unlink(z);
  unlink(pk);
}

Test(pickle, settings_nesting) {
  /* {'segments': [], 'allocator_settings': {'k': {'k': {... 40 levels}}}}: the first map is
   * kept, maps inside it are dropped (the model keeps one level, as PyTorch writes) */
  pk_t k = {0};
  th_pickle_op(&k, 0x80), th_pickle_op(&k, 4), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "segments"), th_pickle_op(&k, ']');
  th_pickle_str(&k, "allocator_settings"), th_pickle_op(&k, '}');
  for (int i = 0; i < 40; i++) th_pickle_str(&k, "\x1b[31m"), th_pickle_op(&k, '}');
  th_pickle_str(&k, "x"), th_pickle_int(&k, 1), th_pickle_op(&k, 's');
  for (int i = 0; i < 40; i++) th_pickle_op(&k, 's');
  th_pickle_op(&k, 'u'), th_pickle_op(&k, '.');
  ms_snapshot_t *s = read_ok(k.p, k.n);
  cr_assert_eq(s->nsettings_top, 1);
  cr_assert_eq(s->nsettings, 1);
  cr_assert_eq(s->settings[0].kind, MS_SNAP_VAL_MAP);
  cr_assert_eq(s->settings[0].count, 0);
  pk_t w = write_mem(s);
  ms_snapshot_t *b = read_ok(w.p, w.n);
  eq_model(s, b, true);
  ms_snapshot_free(s);
  ms_snapshot_free(b);
  free(w.p);
  free(k.p);
}

/* ---- stacks written in place (the reader's frames lists) ------------------------------------ */

Test(pickle, frames_lists_interleaved) {
  /* A segment's frames list is filled, then one of its blocks stores an empty frames list before
   * the segment itself is stored: the empty stack is interned while the segment's frames wait at
   * the builder's stack tail, and both come out right. */
  pk_t k = {0};
  th_pickle_op(&k, 0x80), th_pickle_op(&k, 4), th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "segments"), th_pickle_op(&k, ']'), th_pickle_op(&k, '(');
  th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "address"), th_pickle_int(&k, 0);
  th_pickle_str(&k, "frames");
  frames_list(&k);
  th_pickle_str(&k, "blocks"), th_pickle_op(&k, ']'), th_pickle_op(&k, '(');
  th_pickle_op(&k, '}'), th_pickle_op(&k, '(');
  th_pickle_str(&k, "size"), th_pickle_int(&k, 10);
  th_pickle_str(&k, "frames"), th_pickle_op(&k, ']');
  th_pickle_op(&k, 'u');
  th_pickle_op(&k, 'e');
  th_pickle_op(&k, 'u');
  th_pickle_op(&k, 'e'), th_pickle_op(&k, 'u'), th_pickle_op(&k, '.');
  ms_snapshot_t *s = read_ok(k.p, k.n);
  cr_assert_eq(s->nstacks, 2);
  cr_assert_eq(s->nstack_frames, 2);
  cr_assert_eq(ms_snap_stack_depth(s, s->blocks[0].stack), 0);
  cr_assert_eq(ms_snap_stack_depth(s, s->segments[0].stack), 2);
  cr_assert_str_eq(ms_snap_stack_frame(s, s->segments[0].stack, 0)->name, "f");
  cr_assert_eq(ms_snap_stack_frame(s, s->segments[0].stack, 0)->line, 3);
  cr_assert_str_eq(ms_snap_stack_frame(s, s->segments[0].stack, 1)->name, "");
  ms_snapshot_free(s);
  free(k.p);
}

Test(pickle, builder_stacks_in_place) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  uint32_t f[3], *t = NULL, e, s1, s2, s3, s4, s5;
  cr_assert_eq(ms__snapbuild_frame(&b, "a", 1, "a.py", 4, 1, &f[0]), MS_OK);
  cr_assert_eq(ms__snapbuild_frame(&b, "b", 1, "b.py", 4, 2, &f[1]), MS_OK);
  cr_assert_eq(ms__snapbuild_frame(&b, "c", 1, "c.py", 4, 3, &f[2]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack_room(&b, 0, 2, &t), MS_OK);
  t[0] = f[0], t[1] = f[1];
  /* an empty stack meanwhile leaves the frames written at the tail alone */
  cr_assert_eq(ms__snapbuild_stack(&b, NULL, 0, &e), MS_OK);
  cr_assert_eq(e, 0);
  cr_assert_eq(b.nsf, 0);
  cr_assert_eq(ms__snapbuild_stack_tail(&b, 2, &s1), MS_OK);
  cr_assert_eq(s1, 1);
  cr_assert_eq(b.nsf, 2);
  /* interned like ms__snapbuild_stack: a duplicate written in place adds nothing */
  cr_assert_eq(ms__snapbuild_stack_room(&b, 0, 2, &t), MS_OK);
  t[0] = f[0], t[1] = f[1];
  cr_assert_eq(ms__snapbuild_stack_tail(&b, 2, &s2), MS_OK);
  cr_assert_eq(s2, s1);
  cr_assert_eq(b.nsf, 2);
  uint32_t fr[2] = {f[0], f[1]};
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 2, &s3), MS_OK);
  cr_assert_eq(s3, s1);
  /* growing the room moves what was written with it */
  enum { N = 100001 };
  cr_assert_eq(ms__snapbuild_stack_room(&b, 0, 1, &t), MS_OK);
  t[0] = f[2];
  cr_assert_eq(ms__snapbuild_stack_room(&b, 1, N - 1, &t), MS_OK);
  cr_assert_eq(t[0], f[2]);
  uint32_t *big = malloc(N * sizeof *big);
  cr_assert(big);
  for (uint32_t i = 0; i < N; i++)
    big[i] = t[i] = f[i % 3 == 0 ? 2 : i % 2];
  cr_assert_eq(ms__snapbuild_stack_tail(&b, N, &s4), MS_OK);
  cr_assert_eq(s4, 2);
  cr_assert_eq(ms__snapbuild_stack(&b, big, N, &s5), MS_OK);
  cr_assert_eq(s5, s4);
  cr_assert_eq(b.nsf, 2 + (size_t)N);
  /* more than the room made */
  cr_assert_eq(ms__snapbuild_stack_tail(&b, b.stack_frames.cap + 1, &s5),
               MS_EINVAL);
  cr_assert_eq(b.stacks.len, 3);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  cr_assert_eq(s->nstack_frames, 2 + (size_t)N);
  cr_assert_eq(ms_snap_stack_depth(s, s4), N);
  for (uint32_t i = 0; i < N; i += 997)
    cr_assert_eq(ms_snap_frame_index(s, s->stacks[s4].first + i), big[i]);
  ms_snapshot_free(s);
  free(big);
}

/* finish() reads the frame indices of stacks again only when the stack functions did not see
 * them all in range; every invalid index is still reported, with the same message. */
Test(pickle, builder_check_sees_every_frame_index) {
  ms_errbuf_t eb = {{0}};
  ms_snapshot_t *s = NULL;
  ms__snapbuild_t b;
  uint32_t f0, st, *t = NULL;
  /* through ms__snapbuild_stack */
  ms__snapbuild_init(&b);
  cr_assert_eq(ms__snapbuild_frame(&b, "a", 1, "a.py", 4, 1, &f0), MS_OK);
  uint32_t fr[2] = {f0, 5};
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 1, &st), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, fr, 2, &st), MS_OK);
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_EFORMAT);
  cr_assert_null(s);
  cr_assert_str_eq(eb.msg, "stack 1 refers to frame 5 of 1");
  ms__snapbuild_release(&b);
  /* through the tail */
  ms__snapbuild_init(&b);
  cr_assert_eq(ms__snapbuild_frame(&b, "a", 1, "a.py", 4, 1, &f0), MS_OK);
  cr_assert_eq(ms__snapbuild_stack_room(&b, 0, 3, &t), MS_OK);
  t[0] = f0, t[1] = f0, t[2] = 1;
  cr_assert_eq(ms__snapbuild_stack_tail(&b, 3, &st), MS_OK);
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_EFORMAT);
  cr_assert_str_eq(eb.msg, "stack 0 refers to frame 1 of 1");
  /* the frame it refers to added afterwards: valid when finished */
  uint32_t f1;
  cr_assert_eq(ms__snapbuild_frame(&b, "b", 1, "b.py", 4, 2, &f1), MS_OK);
  cr_assert_eq(f1, 1);
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK);
  cr_assert_eq(s->nstack_frames, 3);
  ms_snapshot_free(s);
  s = NULL;
}

/* Frame indices are stored in 2 bytes while every one is below 65,536, then in 4: the stacks
 * stored before the first large index keep their frames, and the snapshot reads the same either
 * way. */
Test(pickle, builder_widens_frame_indices) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  enum { NF = 70000 };
  char name[16];
  for (uint32_t i = 0; i < NF; i++) {
    uint32_t f;
    int n = snprintf(name, sizeof name, "f%u", i);
    cr_assert_eq(ms__snapbuild_frame(&b, name, (size_t)n, "x.py", 4, i, &f), MS_OK);
    cr_assert_eq(f, i);
  }
  uint32_t lo[3] = {0, 65535, 7}, hi[3] = {65536, 3, NF - 1}, s_lo, s_hi, s_lo2, s_hi2;
  cr_assert_eq(ms__snapbuild_stack(&b, lo, 3, &s_lo), MS_OK);
  cr_assert(!b.sf_wide);
  cr_assert_eq(b.sf16.len, 3);
  cr_assert_eq(ms__snapbuild_stack(&b, hi, 3, &s_hi), MS_OK);
  cr_assert(b.sf_wide);
  cr_assert_eq(b.sf16.len, 0);
  cr_assert_eq(b.sf32.len, 6);
  /* interning still finds both */
  cr_assert_eq(ms__snapbuild_stack(&b, lo, 3, &s_lo2), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, hi, 3, &s_hi2), MS_OK);
  cr_assert_eq(s_lo2, s_lo);
  cr_assert_eq(s_hi2, s_hi);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  cr_assert_null(s->stack_frames16);
  cr_assert_not_null(s->stack_frames);
  for (int k = 0; k < 3; k++) {
    cr_assert_eq(ms_snap_frame_index(s, s->stacks[s_lo].first + (size_t)k), lo[k]);
    cr_assert_eq(ms_snap_frame_index(s, s->stacks[s_hi].first + (size_t)k), hi[k]);
  }
  ms_snapshot_free(s);
  /* a snapshot whose frames all fit in 2 bytes keeps them so */
  ms__snapbuild_init(&b);
  uint32_t f0;
  cr_assert_eq(ms__snapbuild_frame(&b, "a", 1, "a.py", 4, 1, &f0), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(&b, &f0, 1, &s_lo), MS_OK);
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  cr_assert_null(s->stack_frames);
  cr_assert_not_null(s->stack_frames16);
  cr_assert_eq(ms_snap_frame_index(s, 0), f0);
  ms_snapshot_free(s);
}

/* A trace entry is 40 bytes on LP64; its rare fields (the stream among them) are shared per
 * distinct combination. */
Test(pickle, builder_trace_extras_shared) {
  if (sizeof(void *) == 8) cr_assert_eq(sizeof(ms_snap_trace_t), 40);
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  const char *na = NULL, *ctx = NULL;
  cr_assert_eq(ms__snapbuild_str(&b, "N/A", 3, &na), MS_OK);
  cr_assert_eq(ms__snapbuild_str(&b, "my_action", 9, &ctx), MS_OK);
  for (int i = 0; i < 1000; i++) {
    ms_snap_trace_t t = {0};
    t.action = (uint8_t)(i % 7 == 6 ? MS_TRACE_OTHER : MS_TRACE_ALLOC);
    t.stack = MS_SNAP_NO_STACK;
    ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
    if (t.action == MS_TRACE_OTHER) x.action_name = ctx;
    else x.action_name = "alloc"; /* the action's own name: not stored */
    if (i % 2) x.compile_context = na;
    if (i % 10 == 3) x.pool_id[1] = 5;
    if (i % 5 == 4) x.stream = 0x7777;
    cr_assert_eq(ms__snapbuild_trace_extra(&b, &t, &x), MS_OK);
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  /* (other?, compile context?, pool?, stream?): at most 16 combinations, and the all-default
   * one is NULL */
  cr_assert_leq(b.extras.len, 15);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  for (size_t i = 0; i < s->ntrace; i++) {
    const ms_snap_trace_t *t = &s->trace[i];
    bool other = i % 7 == 6, cc = i % 2, pool = i % 10 == 3, stream = i % 5 == 4;
    cr_assert_str_eq(ms_snap_trace_action_name(t), other ? "my_action" : "alloc");
    cr_assert_str_eq(ms_snap_trace_compile_context(t), cc ? "N/A" : "");
    cr_assert_str_eq(ms_snap_trace_user_metadata(t), "");
    cr_assert_eq(ms_snap_trace_pool(t, 1), pool ? 5 : 0);
    cr_assert_eq(ms_snap_trace_stream(t), stream ? 0x7777 : 0);
    cr_assert_eq(t->extra == NULL, !other && !cc && !pool && !stream, "entry %zu", i);
    if (i >= 70) cr_assert_eq(t->extra, s->trace[i - 70].extra, "entry %zu shares", i);
  }
  ms_snapshot_free(s);
}

/* The builder answers a call with the same fields as the last one's from that call's answer: a
 * given action name still depends on the entry's action (its own name is not stored). */
Test(pickle, builder_trace_extras_same_fields_another_action) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  static const uint8_t act[] = {MS_TRACE_ALLOC, MS_TRACE_ALLOC, MS_TRACE_FREE_REQUESTED,
                                MS_TRACE_FREE_REQUESTED, MS_TRACE_ALLOC, MS_TRACE_OTHER};
  ms_snap_trace_extra_t x = {"alloc", "", "", {0, 0}, "", 0}; /* one set of fields for every call */
  for (size_t i = 0; i < sizeof act; i++) {
    ms_snap_trace_t t = {0};
    t.action = act[i];
    t.stack = MS_SNAP_NO_STACK;
    cr_assert_eq(ms__snapbuild_trace_extra(&b, &t, &x), MS_OK);
    cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  }
  ms_snap_trace_extra_t none = {NULL, NULL, NULL, {0, 0}, NULL, 0}; /* absent: the defaults */
  ms_snap_trace_t t = {0};
  t.action = MS_TRACE_OTHER;
  t.stack = MS_SNAP_NO_STACK;
  for (int k = 0; k < 2; k++) {
    cr_assert_eq(ms__snapbuild_trace_extra(&b, &t, &none), MS_OK);
    cr_assert_null(t.extra);
  }
  cr_assert_eq(ms__snapbuild_add_trace(&b, &t), MS_OK);
  ms_snapshot_t *s = NULL;
  cr_assert_eq(ms__snapbuild_finish(&b, &s, NULL), MS_OK);
  for (size_t i = 0; i < sizeof act; i++) {
    const ms_snap_trace_t *e = &s->trace[i];
    cr_assert_str_eq(ms_snap_trace_action_name(e), "alloc", "entry %zu", i);
    cr_assert_eq(e->extra == NULL, act[i] == MS_TRACE_ALLOC, "entry %zu", i);
  }
  cr_assert_str_eq(ms_snap_trace_action_name(&s->trace[sizeof act]),
                   ms_trace_action_name(MS_TRACE_OTHER));
  ms_snapshot_free(s);
}

Test(pickle, bigvec_reserve) {
  /* the builder's growth for big tables: contents kept across growth past the huge-page size */
  MS_VEC(uint64_t) v = {0};
  for (uint64_t i = 0; i < (3u << 20); i++) {
    cr_assert_eq(MS_BIGVEC_RESERVE(&v, 1), 0);
    v.ptr[v.len++] = i * 0x9e3779b97f4a7c15ull;
  }
  for (uint64_t i = 0; i < v.len; i += 4099)
    cr_assert_eq(v.ptr[i], i * 0x9e3779b97f4a7c15ull);
  cr_assert_eq(MS_BIGVEC_RESERVE(&v, SIZE_MAX / 2), -1);
  cr_assert_eq(v.len, 3u << 20);
  ms__big_free(v.ptr); /* an array of ms__big_realloc */
}

/* ---- reading without the trace (MS_LOAD_NO_TRACE) -------------------------------------------- */

/* skip must equal full with the trace left out: same segments, blocks, stacks, history, devices
 * (with no entries), settings and annotations. */
static void eq_without_trace(const ms_snapshot_t *full, const ms_snapshot_t *skip) {
  cr_assert(skip->present & MS_SNAP_TRACE_SKIPPED);
  cr_assert_not(full->present & MS_SNAP_TRACE_SKIPPED);
  cr_assert_eq(skip->ntrace, 0);
  ms_snapshot_t want = *full;
  ms_snap_device_t *devs = calloc(full->ndevices + 1, sizeof *devs);
  cr_assert(devs);
  for (size_t d = 0; d < full->ndevices; d++) {
    devs[d] = full->devices[d];
    devs[d].ntrace = 0;
    devs[d].first_trace = 0;
  }
  want.devices = devs;
  want.ntrace = 0;
  want.present |= MS_SNAP_TRACE_SKIPPED;
  eq_model(&want, skip, true);
  free(devs);
}

Test(pickle, skip_trace_same_model_on_every_fixture) {
  for (size_t i = 0; i < NFIXTURES; i++) {
    size_t len;
    char *data = fixture(fixture_table[i].name, &len);
    ms_snapshot_t *full = read_ok(data, len), *skip = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(th_pickle_read_mem(data, len, MS_LOAD_NO_TRACE, &skip, &eb), MS_OK, "%s: %s",
                 fixture_table[i].name, eb.msg);
    eq_without_trace(full, skip);
    ms_snapshot_free(full);
    ms_snapshot_free(skip);
    free(data);
  }
}

Test(pickle, skip_trace_every_truncation, .timeout = 120) {
  /* the trace's bytes are still parsed: no prefix of a file is accepted */
  size_t len;
  char *data = fixture("jogregoire_diffusion_tiny", &len);
  for (size_t n = 0; n < len; n++) {
    ms_snapshot_t *s = (ms_snapshot_t *)0x1;
    ms_errbuf_t eb;
    int rc = th_pickle_read_mem(data, n, MS_LOAD_NO_TRACE, &s, &eb);
    cr_assert_neq(rc, MS_OK, "prefix of %zu bytes was accepted", n);
    cr_assert_eq(s, (ms_snapshot_t *)0x1);
    cr_assert(rc == MS_ETRUNCATED || rc == MS_EFORMAT, "prefix %zu: %s", n, eb.msg);
    cr_assert(strncmp(eb.msg, "offset ", 7) == 0, "prefix %zu: '%s'", n, eb.msg);
  }
  free(data);
}

/* {"device_traces": [[ENTRY]], "segments": [SEG]} or with segments first; ENTRY's frames list is
 * memoized (slot 0) and, with share, memo-got again as SEG's frames. size_op: the entry's size. */
static pk_t trace_pickle(bool traces_first, bool share, const char *size_op, size_t size_len,
                         const char *tail_op, size_t tail_len) {
  pk_t k = {0};
  th_bytes_sink_write(&k, "\x80\x04}(", 4);
  for (int part = 0; part < 2; part++) {
    if ((part == 0) == traces_first) { /* device_traces */
      th_pickle_str(&k, "device_traces");
      th_bytes_sink_write(&k, "](](}(", 6);
      th_pickle_str(&k, "action");
      th_pickle_str(&k, "alloc");
      th_pickle_str(&k, "addr");
      th_pickle_int(&k, 4096);
      th_pickle_str(&k, "size");
      th_bytes_sink_write(&k, size_op, size_len);
      th_pickle_str(&k, "frames");
      th_bytes_sink_write(&k, "]q\x00(}(", 6);
      th_pickle_str(&k, "name");
      th_pickle_str(&k, "f");
      th_pickle_str(&k, "filename");
      th_pickle_str(&k, "a.py");
      th_pickle_str(&k, "line");
      th_pickle_int(&k, 7);
      th_bytes_sink_write(&k, "ue", 2); /* frame dict, frames list */
      th_bytes_sink_write(&k, tail_op, tail_len);
      th_bytes_sink_write(&k, "uee", 3); /* entry, device, device_traces */
    } else { /* one segment of one allocated block */
      th_pickle_str(&k, "segments");
      th_bytes_sink_write(&k, "](}(", 4);
      th_pickle_str(&k, "device");
      th_pickle_int(&k, 0);
      th_pickle_str(&k, "address");
      th_pickle_int(&k, 4096);
      th_pickle_str(&k, "total_size");
      th_pickle_int(&k, 512);
      th_pickle_str(&k, "allocated_size");
      th_pickle_int(&k, 512);
      th_pickle_str(&k, "active_size");
      th_pickle_int(&k, 512);
      th_pickle_str(&k, "stream");
      th_pickle_int(&k, 0);
      if (share) {
        th_pickle_str(&k, "frames");
        th_bytes_sink_write(&k, "h\x00", 2);
      }
      th_pickle_str(&k, "blocks");
      th_bytes_sink_write(&k, "](}(", 4);
      th_pickle_str(&k, "address");
      th_pickle_int(&k, 4096);
      th_pickle_str(&k, "size");
      th_pickle_int(&k, 512);
      th_pickle_str(&k, "state");
      th_pickle_str(&k, "active_allocated");
      th_bytes_sink_write(&k, "ueue", 4); /* block, blocks, segment, segments */
    }
  }
  th_bytes_sink_write(&k, "u.", 2);
  return k;
}

Test(pickle, skip_trace_entries_are_not_examined) {
  /* the deliberate choice: a wrong type inside a trace entry fails a full read, not a read
   * without the trace (which never looks at the entries' fields) */
  pk_t k = trace_pickle(false, false, BIN("\x8c\x01x"), "", 0);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(k.p, k.n, 0, &s, &eb), MS_EFORMAT);
  cr_assert(strstr(eb.msg, "device_traces[0][0].size: expected int, got str"), "%s", eb.msg);
  cr_assert_eq(th_pickle_read_mem(k.p, k.n, MS_LOAD_NO_TRACE, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(s->ndevices, 1);
  cr_assert_eq(s->devices[0].ntrace, 0);
  cr_assert_eq(s->nblocks, 1);
  ms_snapshot_free(s);
  free(k.p);
  /* ... but the pickle itself is checked: an unknown opcode, a code-running opcode, a bad memo
   * get or a stack underflow inside the trace are errors either way */
  static const struct {
    const char *op;
    size_t len;
    int code;
    const char *msg;
  } bad[] = {
      {BIN("\xff"), MS_EFORMAT, "unknown opcode 0xff"},
      {BIN("c"), MS_EREFUSED, "opcode GLOBAL refused"},
      {BIN("h\x09"), MS_EFORMAT, "BINGET 9: memo entry 9 was never stored"},
      {BIN("1"), MS_EFORMAT, "SETITEMS on a list"}, /* POP_MARK took the entry's mark */
      {BIN("K\x01"), MS_EFORMAT, "SETITEMS with an odd number of values (9)"},
  };
  for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
    k = trace_pickle(false, false, BIN("K\x08"), bad[i].op, bad[i].len);
    for (unsigned flags = 0; flags <= MS_LOAD_NO_TRACE; flags += MS_LOAD_NO_TRACE) {
      s = (ms_snapshot_t *)0x1;
      int rc = th_pickle_read_mem(k.p, k.n, flags, &s, &eb);
      cr_assert_neq(rc, MS_OK, "case %zu flags %u accepted", i, flags);
      cr_assert_eq(s, (ms_snapshot_t *)0x1);
      if (flags) cr_assert_eq(rc, bad[i].code, "case %zu: %s", i, eb.msg);
      if (flags) cr_assert(strstr(eb.msg, bad[i].msg), "case %zu: %s", i, eb.msg);
    }
    free(k.p);
  }
  /* a file that ends inside the trace */
  k = trace_pickle(false, false, BIN("K\x08"), "", 0);
  for (size_t cut = 40; cut < k.n; cut += 7) {
    s = (ms_snapshot_t *)0x1;
    int rc = th_pickle_read_mem(k.p, cut, MS_LOAD_NO_TRACE, &s, &eb);
    cr_assert_eq(rc, MS_ETRUNCATED, "cut %zu: %s", cut, eb.msg);
  }
  free(k.p);
}

Test(pickle, skip_trace_shared_with_segments) {
  /* the trace comes first and shares its frames list with a segment through the memo: a read
   * without the trace cannot honour the flag and says so; the loader reads such a file in full */
  pk_t k = trace_pickle(true, true, BIN("K\x08"), "", 0);
  ms_snapshot_t *full = read_ok(k.p, k.n), *s = (ms_snapshot_t *)0x1;
  cr_assert_eq(full->ntrace, 1);
  cr_assert_eq(ms_snap_stack_depth(full, full->segments[0].stack), 1);
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(k.p, k.n, MS_LOAD_NO_TRACE, &s, &eb), MS_EUNSUPPORTED);
  cr_assert_eq(s, (ms_snapshot_t *)0x1);
  cr_assert(strstr(eb.msg, "segments[0].frames: uses a value of device_traces, so the trace cannot "
                           "be skipped"),
            "%s", eb.msg);
  char path[512];
  tmp_path(path, sizeof path, "shared.pickle");
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  cr_assert_eq(fwrite(k.p, 1, k.n, f), k.n);
  fclose(f);
  s = NULL;
  cr_assert_eq(ms_snapshot_load_ex(path, MS_LOAD_NO_TRACE, &s, &eb), MS_OK, "%s", eb.msg);
  unlink(path);
  eq_model(full, s, true); /* read in full: the trace is there */
  ms_snapshot_free(s);
  ms_snapshot_free(full);
  free(k.p);
  /* segments first (PyTorch's order), sharing the other way: skipped fine */
  k = trace_pickle(false, false, BIN("K\x08"), "", 0);
  full = read_ok(k.p, k.n);
  cr_assert_eq(th_pickle_read_mem(k.p, k.n, MS_LOAD_NO_TRACE, &s, &eb), MS_OK, "%s", eb.msg);
  eq_without_trace(full, s);
  ms_snapshot_free(s);
  ms_snapshot_free(full);
  free(k.p);
}

Test(pickle, skip_trace_flags_and_writers) {
  size_t len;
  char *data = fixture("a0kuma_adamw_small", &len);
  ms_snapshot_t *s = (ms_snapshot_t *)0x1;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(data, len, 0x80, &s, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "unknown load flags 0x80");
  cr_assert_eq(th_pickle_read_mem(data, len, 0x10, &s, &eb), MS_EINVAL);
  cr_assert_str_eq(eb.msg, "unknown load flags 0x10");
  cr_assert_eq(s, (ms_snapshot_t *)0x1);
  /* a snapshot read without its trace, or without some of its stacks, is never written out as
   * if it were whole */
  static const struct {
    unsigned flags;
    const char *msg;
  } cases[] = {
      {MS_LOAD_NO_TRACE, "the snapshot was loaded without its trace"},
      {MS_LOAD_NO_TRACE_STACKS, "the snapshot was loaded without its trace's stacks"},
      {MS_LOAD_NO_FREE_STACKS, "the snapshot was loaded without its trace's stacks"},
      {MS_LOAD_DEFER_STACKS, "the snapshot was loaded without its trace's stacks"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    cr_assert_eq(th_pickle_read_mem(data, len, cases[i].flags, &s, &eb), MS_OK, "%s", eb.msg);
    pk_t k = {0};
    ms_sink_t sink = {th_bytes_sink_write, &k};
    cr_assert_eq(ms_pickle_write(s, &sink, &eb), MS_EINVAL);
    cr_assert_str_eq(eb.msg, cases[i].msg);
    cr_assert_eq(ms_snapshot_write(s, NULL, &sink, &eb), MS_EINVAL);
    cr_assert_str_eq(eb.msg, cases[i].msg);
    cr_assert_eq(k.n, 0);
    ms_snapshot_free(s);
  }
  s = (ms_snapshot_t *)0x1;
  cr_assert_eq(ms_snapshot_load_ex("/nonexistent", 0x10, &s, &eb), MS_EINVAL);
  cr_assert_eq(s, (ms_snapshot_t *)0x1);
  free(data);
}

Test(pickle, trace_stacks_match_python) {
  /* trace entries' stacks are interned a few entries late (a queue that hides the intern table's
   * cache misses): every entry must still get its own frames, as Python's pickle sees them */
  if (!th_have_python()) {
    printf("SKIP: python3 not available\n");
    cr_skip_test("python3 not available");
  }
  static const char *const names[] = {"wedsonlin_cs336_medium_1024_training",
                                      "maphsge_select_n_4dev", "a0kuma_adamw_small"};
  for (size_t f = 0; f < sizeof names / sizeof names[0]; f++) {
    size_t len;
    char *data = fixture(names[f], &len);
    char path[512], cmd[2048], fpath[1024];
    tmp_path(path, sizeof path, "stacks.txt");
    snprintf(fpath, sizeof fpath, "%s/%s.pickle", th_fixture_dir(), names[f]);
    snprintf(cmd, sizeof cmd,
             "python3 -c \"import pickle,sys\n"
             "d=pickle.load(open(sys.argv[1],'rb'))\n"
             "with open(sys.argv[2],'w') as o:\n"
             "  for t in d['device_traces']:\n"
             "    for e in t:\n"
             "      o.write(';'.join('%%s|%%s|%%d' %% (x['name'],x['filename'],x['line']) for x in "
             "e.get('frames',[]))+'\\\\n')\" '%s' '%s'",
             fpath, path);
    cr_assert_eq(system(cmd), 0, "python3 failed on %s", names[f]);
    size_t tl;
    char *text = th_read_text(path, &tl);
    unlink(path);
    cr_assert(text);
    text[tl] = 0;
    ms_snapshot_t *s = read_ok(data, len);
    cr_assert_gt(s->ntrace, 0);
    cr_assert_lt(s->nstacks, s->ntrace, "%s: some stacks repeat", names[f]);
    char *line = text;
    for (size_t i = 0; i < s->ntrace; i++) {
      char *nl = strchr(line, '\n');
      cr_assert(nl, "%s: python gave fewer entries", names[f]);
      *nl = 0;
      char want[65536];
      size_t w = 0;
      uint32_t st = s->trace[i].stack, n = ms_snap_stack_depth(s, st);
      want[0] = 0;
      for (uint32_t k = 0; k < n && w < sizeof want - 1; k++) {
        const ms_snap_frame_t *fr = ms_snap_stack_frame(s, st, k);
        w += (size_t)snprintf(want + w, sizeof want - w, "%s%s|%s|%lld", k ? ";" : "", fr->name,
                              fr->filename, (long long)fr->line);
      }
      cr_assert_str_eq(want, line, "%s: trace entry %zu", names[f], i);
      line = nl + 1;
    }
    cr_assert_eq(*line, 0, "%s: python gave more entries", names[f]);
    ms_snapshot_free(s);
    free(text);
    free(data);
  }
}

/* ---- reading without the plain entries' stacks (MS_LOAD_NO_TRACE_STACKS) ---------------------- */

static bool plain_action(uint8_t a) {
  return a == MS_TRACE_ALLOC || a == MS_TRACE_FREE_REQUESTED || a == MS_TRACE_FREE_COMPLETED ||
         a == MS_TRACE_SEGMENT_ALLOC || a == MS_TRACE_SEGMENT_FREE || a == MS_TRACE_OOM;
}

/* stack sa of a and sb of b hold the same frames */
static void eq_stack_frames(const ms_snapshot_t *a, uint32_t sa, const ms_snapshot_t *b, uint32_t sb,
                     const char *what, size_t i) {
  uint32_t n = ms_snap_stack_depth(a, sa);
  cr_assert_eq(ms_snap_stack_depth(b, sb), n, "%s %zu: depth", what, i);
  for (uint32_t k = 0; k < n; k++) {
    const ms_snap_frame_t *x = ms_snap_stack_frame(a, sa, k), *y = ms_snap_stack_frame(b, sb, k);
    cr_assert_str_eq(x->name, y->name, "%s %zu frame %u", what, i, k);
    cr_assert_str_eq(x->filename, y->filename, "%s %zu frame %u", what, i, k);
    cr_assert_eq(x->line, y->line, "%s %zu frame %u", what, i, k);
  }
}

/* part must equal full but for the plain entries' stacks, left out where the file had frames */
static void eq_without_trace_stacks(const ms_snapshot_t *full, const ms_snapshot_t *part,
                                    size_t *dropped) {
  cr_assert(part->present & MS_SNAP_TRACE_STACKS_SKIPPED);
  cr_assert_eq(part->present & ~(uint32_t)MS_SNAP_TRACE_STACKS_SKIPPED, full->present);
  cr_assert_eq(part->ntrace, full->ntrace);
  cr_assert_eq(part->nsegments, full->nsegments);
  cr_assert_eq(part->nblocks, full->nblocks);
  cr_assert_eq(part->ndevices, full->ndevices);
  for (size_t i = 0; i < full->ntrace; i++) {
    const ms_snap_trace_t *a = &full->trace[i], *b = &part->trace[i];
    cr_assert(a->action == b->action && a->addr == b->addr && a->size == b->size &&
                  ms_snap_trace_stream(a) == ms_snap_trace_stream(b) && a->time_us == b->time_us &&
                  a->present == b->present,
              "trace entry %zu differs", i);
    if (plain_action(a->action) && b->stack == MS_SNAP_NO_STACK && a->stack != MS_SNAP_NO_STACK) {
      cr_assert(a->present & MS_TRACE_HAS_FRAMES, "trace entry %zu", i);
      (*dropped)++;
      continue;
    }
    eq_stack_frames(full, a->stack, part, b->stack, "trace entry", i);
  }
  for (size_t i = 0; i < full->nsegments; i++)
    eq_stack_frames(full, full->segments[i].stack, part, part->segments[i].stack, "segment", i);
  for (size_t i = 0; i < full->nblocks; i++)
    eq_stack_frames(full, full->blocks[i].stack, part, part->blocks[i].stack, "block", i);
}

Test(pickle, no_trace_stacks_on_every_fixture) {
  for (size_t i = 0; i < NFIXTURES; i++) {
    size_t len, dropped = 0, plain = 0;
    char *data = fixture(fixture_table[i].name, &len);
    ms_snapshot_t *full = read_ok(data, len), *part = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(th_pickle_read_mem(data, len, MS_LOAD_NO_TRACE_STACKS, &part, &eb), MS_OK, "%s: %s",
                 fixture_table[i].name, eb.msg);
    eq_without_trace_stacks(full, part, &dropped);
    /* a plain entry keeps its stack only when its frames list was a segment's or a block's
     * (segments come first in PyTorch's files; the list is shared through the memo) */
    for (size_t k = 0; k < full->ntrace; k++) {
      uint32_t st = full->trace[k].stack;
      if (!plain_action(full->trace[k].action) || !ms_snap_stack_depth(full, st)) continue;
      plain++;
      if (part->trace[k].stack == MS_SNAP_NO_STACK) continue;
      bool shared = false;
      for (size_t j = 0; j < full->nblocks && !shared; j++) shared = full->blocks[j].stack == st;
      for (size_t j = 0; j < full->nsegments && !shared; j++)
        shared = full->segments[j].stack == st;
      cr_assert(shared, "%s: trace entry %zu kept its stack", fixture_table[i].name, k);
    }
    cr_assert(plain == 0 || dropped > 0, "%s: %zu of %zu left out", fixture_table[i].name,
              dropped, plain);
    /* with MS_LOAD_NO_TRACE the flag changes nothing */
    ms_snapshot_t *a = NULL, *b = NULL;
    cr_assert_eq(th_pickle_read_mem(data, len, MS_LOAD_NO_TRACE, &a, &eb), MS_OK);
    cr_assert_eq(th_pickle_read_mem(data, len, MS_LOAD_NO_TRACE | MS_LOAD_NO_TRACE_STACKS, &b, &eb),
                 MS_OK);
    eq_model(a, b, true);
    ms_snapshot_free(a);
    ms_snapshot_free(b);
    ms_snapshot_free(full);
    ms_snapshot_free(part);
    free(data);
  }
}

/* {"device_traces": [[E1, E2]]}: E1 = {"action": "alloc", "addr": 4096, "size": 8, "frames":
 * [f]} with its frames list memoized (slot 0); E2 = {"action": a2, ..., "frames": [g]}, or the
 * memo's list again (share), or with "action" named a second time after the frames (again). */
static pk_t two_entries(const char *a2, bool share, const char *again) {
  pk_t k = {0};
  th_bytes_sink_write(&k, "\x80\x04}(", 4);
  th_pickle_str(&k, "segments");
  th_bytes_sink_write(&k, "]", 1);
  th_pickle_str(&k, "device_traces");
  th_bytes_sink_write(&k, "](](", 4);
  for (int e = 0; e < 2; e++) {
    th_bytes_sink_write(&k, "}(", 2);
    th_pickle_str(&k, "action");
    th_pickle_str(&k, e ? a2 : "alloc");
    th_pickle_str(&k, "addr");
    th_pickle_int(&k, 4096);
    th_pickle_str(&k, "size");
    th_pickle_int(&k, 8);
    th_pickle_str(&k, "frames");
    if (e && share) {
      th_bytes_sink_write(&k, "h\x00", 2);
    } else {
      th_bytes_sink_write(&k, e ? "](}(" : "]q\x00(}(", e ? 4 : 6);
      th_pickle_str(&k, "name");
      th_pickle_str(&k, e ? "g" : "f");
      th_pickle_str(&k, "filename");
      th_pickle_str(&k, "a.py");
      th_pickle_str(&k, "line");
      th_pickle_int(&k, e ? 9 : 7);
      th_bytes_sink_write(&k, "ue", 2); /* frame dict, frames list */
    }
    if (e && again) {
      th_pickle_str(&k, "action");
      th_pickle_str(&k, again);
    }
    th_bytes_sink_write(&k, "u", 1); /* the entry */
  }
  th_bytes_sink_write(&k, "eeu.", 4); /* device, device_traces, root */
  return k;
}

Test(pickle, no_trace_stacks_keeps_what_trace_prints) {
  /* an alloc loses its stack; a segment_map, a snapshot or an unknown action keeps its own */
  static const char *const kept[] = {"segment_map", "segment_unmap", "snapshot", "annotate",
                                     "something_new"};
  for (size_t i = 0; i < sizeof kept / sizeof kept[0]; i++) {
    pk_t k = two_entries(kept[i], false, NULL);
    ms_snapshot_t *full = read_ok(k.p, k.n), *s = NULL;
    ms_errbuf_t eb;
    cr_assert_eq(th_pickle_read_mem(k.p, k.n, MS_LOAD_NO_TRACE_STACKS, &s, &eb), MS_OK, "%s: %s",
                 kept[i], eb.msg);
    cr_assert_eq(s->ntrace, 2);
    cr_assert_eq(s->trace[0].stack, MS_SNAP_NO_STACK);
    cr_assert(s->trace[0].present & MS_TRACE_HAS_FRAMES);
    cr_assert_eq(ms_snap_stack_depth(s, s->trace[1].stack), 1, "%s", kept[i]);
    cr_assert_str_eq(ms_snap_stack_frame(s, s->trace[1].stack, 0)->name, "g");
    cr_assert_eq(ms_snap_stack_frame(s, s->trace[1].stack, 0)->line, 9);
    size_t dropped = 0;
    eq_without_trace_stacks(full, s, &dropped);
    cr_assert_eq(dropped, 1);
    ms_snapshot_free(s);
    ms_snapshot_free(full);
    free(k.p);
  }
  /* two plain entries sharing one frames list through the memo: both without a stack */
  pk_t k = two_entries("free_requested", true, NULL);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(k.p, k.n, MS_LOAD_NO_TRACE_STACKS, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(s->trace[0].stack, MS_SNAP_NO_STACK);
  cr_assert_eq(s->trace[1].stack, MS_SNAP_NO_STACK);
  ms_snapshot_free(s);
  free(k.p);
}

/* A read with `flags` refuses k (MS_EUNSUPPORTED, msg), and the loader then reads the file in
 * full: the model of a full read, every stack there. */
static void refused_then_read_in_full(const pk_t *k, unsigned flags, const char *msg, size_t i) {
  ms_snapshot_t *full = read_ok(k->p, k->n), *s = (ms_snapshot_t *)0x1;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(k->p, k->n, flags, &s, &eb), MS_EUNSUPPORTED, "case %zu: %s", i,
               eb.msg);
  cr_assert_eq(s, (ms_snapshot_t *)0x1);
  cr_assert(strstr(eb.msg, msg), "case %zu: %s", i, eb.msg);
  char path[512];
  tmp_path(path, sizeof path, "stacks-refused.pickle");
  FILE *f = fopen(path, "wb");
  cr_assert(f);
  cr_assert_eq(fwrite(k->p, 1, k->n, f), k->n);
  fclose(f);
  s = NULL;
  cr_assert_eq(ms_snapshot_load_ex(path, flags, &s, &eb), MS_OK, "%s", eb.msg);
  unlink(path);
  eq_model(full, s, true);
  cr_assert_not(s->present & MS_SNAP_TRACE_STACKS_SKIPPED);
  ms_snapshot_free(s);
  ms_snapshot_free(full);
}

Test(pickle, no_trace_stacks_needed_elsewhere_reads_in_full) {
  /* a stack left out but needed later (a shared frames list, an entry named again after its
   * frames): the read says so; the loader reads the file again in full */
  static const struct {
    const char *a2, *again;
    bool share;
    const char *msg;
  } cases[] = {
      {"segment_map", NULL, true,
       "device_traces[0][1].frames: needs a stack that was left out, so the trace's stacks "
       "cannot be skipped"},
      {"alloc", "snapshot", false,
       "device_traces[0][1].action: needs a stack that was left out, so the trace's stacks "
       "cannot be skipped"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pk_t k = two_entries(cases[i].a2, cases[i].share, cases[i].again);
    refused_then_read_in_full(&k, MS_LOAD_NO_TRACE_STACKS, cases[i].msg, i);
    free(k.p);
  }
}

/* ---- reading without the frees' stacks (MS_LOAD_NO_FREE_STACKS) ---------------------------- */

typedef struct fe_s {
  const char *action;
  int addr;
  int frames;      /* >= 0: a new frames list with one frame of that line; -1 - k: memo slot k */
  int put;         /* memoize the new list in this slot (-1: not) */
  int addr_again;  /* >= 0: "addr" named again, after the frames, with this value */
  bool two_batches; /* the entry's dict filled by two SETITEMS */
} fe_t;

static pk_t free_entries(const fe_t *e, size_t n) {
  pk_t k = {0};
  th_bytes_sink_write(&k, "\x80\x04}(", 4);
  th_pickle_str(&k, "segments");
  th_bytes_sink_write(&k, "]", 1);
  th_pickle_str(&k, "device_traces");
  th_bytes_sink_write(&k, "](](", 4);
  for (size_t i = 0; i < n; i++) {
    th_bytes_sink_write(&k, "}(", 2);
    th_pickle_str(&k, "action");
    th_pickle_str(&k, e[i].action);
    th_pickle_str(&k, "addr");
    th_pickle_int(&k, e[i].addr);
    if (e[i].two_batches) th_bytes_sink_write(&k, "u(", 2);
    th_pickle_str(&k, "size");
    th_pickle_int(&k, 512);
    th_pickle_str(&k, "frames");
    if (e[i].frames < 0) {
      char get[2] = {'h', (char)(-1 - e[i].frames)};
      th_bytes_sink_write(&k, get, 2);
    } else {
      th_bytes_sink_write(&k, "]", 1);
      if (e[i].put >= 0) {
        char put[2] = {'q', (char)e[i].put};
        th_bytes_sink_write(&k, put, 2);
      }
      th_bytes_sink_write(&k, "(}(", 3);
      th_pickle_str(&k, "name");
      th_pickle_str(&k, "f");
      th_pickle_str(&k, "filename");
      th_pickle_str(&k, "a.py");
      th_pickle_str(&k, "line");
      th_pickle_int(&k, e[i].frames);
      th_bytes_sink_write(&k, "ue", 2); /* frame dict, frames list */
    }
    if (e[i].addr_again >= 0) {
      th_pickle_str(&k, "addr");
      th_pickle_int(&k, e[i].addr_again);
    }
    th_bytes_sink_write(&k, "u", 1); /* the entry */
  }
  th_bytes_sink_write(&k, "eeu.", 4); /* device, device_traces, root */
  return k;
}

Test(pickle, no_free_stacks_pairs_as_the_index_does) {
  /* a block's frees share one memoized list (as PyTorch writes them) and lose it when the
   * block's alloc is in the trace; a free_completed whose alloc is not keeps its stack */
  static const fe_t e[] = {
      {"alloc", 4096, 1, -1, -1, false},
      {"free_requested", 4096, 2, 0, -1, false},
      {"free_completed", 4096, -1, -1, -1, false},   /* memo slot 0: the free_requested's */
      {"free_requested", 8192, 3, 1, -1, false},     /* allocated before the trace */
      {"free_completed", 8192, -2, -1, -1, false},   /* slot 1: kept */
      {"free_completed", 4096, 4, -1, -1, false},    /* freed twice: its alloc is closed */
  };
  pk_t k = free_entries(e, sizeof e / sizeof e[0]);
  ms_snapshot_t *full = read_ok(k.p, k.n), *s = NULL;
  ms_errbuf_t eb;
  cr_assert_eq(th_pickle_read_mem(k.p, k.n, MS_LOAD_NO_FREE_STACKS, &s, &eb), MS_OK, "%s", eb.msg);
  cr_assert(s->present & MS_SNAP_TRACE_STACKS_SKIPPED);
  static const int want_line[] = {1, -1, -1, 3, 3, 4}; /* -1: no stack */
  for (size_t i = 0; i < 6; i++) {
    if (want_line[i] < 0) {
      cr_assert_eq(s->trace[i].stack, MS_SNAP_NO_STACK, "entry %zu", i);
      cr_assert(s->trace[i].present & MS_TRACE_HAS_FRAMES);
    } else {
      cr_assert_eq(ms_snap_stack_depth(s, s->trace[i].stack), 1, "entry %zu", i);
      cr_assert_eq(ms_snap_stack_frame(s, s->trace[i].stack, 0)->line, want_line[i], "entry %zu", i);
    }
  }
  ms_snapshot_free(s);
  ms_snapshot_free(full);
  free(k.p);
}

Test(pickle, no_free_stacks_refusals_read_in_full) {
  /* where a stack left out is needed after all, or the entries do not complete one by one in
   * trace order, the read says so and the loader reads the file again in full */
  static const struct {
    fe_t e[3];
    size_t n;
    const char *msg;
  } cases[] = {
      /* the frees' shared list is needed by a free_completed of another address (unpaired) */
      {{{"alloc", 4096, 1, -1, -1, false},
        {"free_requested", 4096, 2, 0, -1, false},
        {"free_completed", 8192, -1, -1, -1, false}},
       3,
       "device_traces[0][2].frames: needs a stack that was left out"},
      /* the address changed after the frames were left out */
      {{{"alloc", 4096, 1, -1, -1, false}, {"free_requested", 4096, 2, -1, 8192, false}},
       2,
       "device_traces[0][1]: needs a stack that was left out"},
      /* an entry filled by two SETITEMS */
      {{{"alloc", 4096, 1, -1, -1, true}, {"free_requested", 4096, 2, -1, -1, false}},
       2,
       "device_traces[0][0].size: needs a stack that was left out"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
    pk_t k = free_entries(cases[i].e, cases[i].n);
    refused_then_read_in_full(&k, MS_LOAD_NO_FREE_STACKS, cases[i].msg, i);
    free(k.p);
  }
}
