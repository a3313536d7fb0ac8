/* SPDX-License-Identifier: MIT
 * Tests for the snapshot views (memsnap/views.h) on hand-built models: the folded lines of
 * `_memory_viz.py memory`, `segments` and `compare` for every era (frames, legacy history,
 * history-less legacy blocks) and state, PyTorch's frame filter and format, the quirks (negative
 * <gaps> left out, all-filtered stacks, <non-python>, <no-context>), hostile names passing through
 * as data, and the segment diff. */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "helpers.h"
#include "memsnap/views.h"
#include "model/snapbuild.h"

/* ---- helpers ----------------------------------------------------------------------------------
 */

/* Runs a view into folded text; the caller frees the result. */
static char *folded(const ms_snapshot_t *s, ms_view_kind kind) {
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  cr_assert_eq(ms_view_emit(s, kind, ms_view_folded_emit, &sink), MS_OK);
  return m.data ? m.data : calloc(1, 1);
}

static char *folded_compare(const ms_snapshot_t *a, const ms_snapshot_t *b) {
  th_memsink_t m;
  ms_sink_t sink;
  th_memsink_init(&sink, &m);
  cr_assert_eq(ms_view_compare_emit(a, b, ms_view_folded_emit, &sink), MS_OK);
  return m.data ? m.data : calloc(1, 1);
}

static uint32_t frame(ms__snapbuild_t *b, const char *name, const char *file, int64_t line) {
  uint32_t f;
  cr_assert_eq(ms__snapbuild_frame(b, name, strlen(name), file, strlen(file), line, &f), MS_OK);
  return f;
}

/* A stack of n frames given innermost first. */
static uint32_t stack(ms__snapbuild_t *b, const uint32_t *fr, size_t n) {
  uint32_t s;
  cr_assert_eq(ms__snapbuild_stack(b, fr, n, &s), MS_OK);
  return s;
}

static void block(ms__snapbuild_t *b, ms_block_state st, uint64_t size, uint64_t req, uint32_t stk,
                  uint32_t present) {
  ms_snap_block_t blk = {.size = size,
                         .requested_size = req,
                         .state = st,
                         .state_name = ms_block_state_name(st),
                         .stack = stk,
                         .present = present};
  cr_assert_eq(ms__snapbuild_add_block(b, &blk), MS_OK);
}

static void segment(ms__snapbuild_t *b, uint64_t addr, uint64_t stream, uint32_t first) {
  uint64_t total = 0;
  for (size_t i = first; i < b->blocks.len; i++) total += b->blocks.ptr[i].size;
  ms_snap_segment_t seg = {.address = addr,
                           .total_size = total,
                           .stream = stream,
                           .stack = MS_SNAP_NO_STACK,
                           .first_block = first,
                           .nblocks = (uint32_t)(b->blocks.len - first)};
  cr_assert_eq(ms__snapbuild_add_segment(b, &seg), MS_OK);
}

static ms_snapshot_t *finish(ms__snapbuild_t *b) {
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(b, &s, &eb), MS_OK, "%s", eb.msg);
  ms__snapbuild_release(b);
  return s;
}

#define FR (MS_BLOCK_HAS_FRAMES | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_ADDRESS)

/* A frames-era snapshot with every state, a filtered C++ frame, a Windows path, `??` file names,
 * a stale inactive block and a second stream. */
static ms_snapshot_t *frames_era(void) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  uint32_t unwind = frame(&b, "torch::unwind::unwind()", "??", 0);
  uint32_t alloc = frame(&b, "allocate", "/usr/lib/python3/torch/alloc.py", 12);
  uint32_t fwd = frame(&b, "forward", "C:\\Users\\me\\model.py", 7);
  uint32_t main_ = frame(&b, "<module>", "/home/u/train.py", 3);
  uint32_t s1[] = {unwind, alloc, fwd, main_};
  uint32_t st1 = stack(&b, s1, 4);
  uint32_t st_filtered = stack(&b, &unwind, 1);
  uint32_t st_empty = stack(&b, NULL, 0);
  block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 1024, 1000, st1, FR);       /* + <gaps> 24 */
  block(&b, MS_BLOCK_INACTIVE, 512, 4096, st1, FR);                /* stale: no <gaps> line */
  block(&b, MS_BLOCK_ACTIVE_PENDING_FREE, 512, 512, st_empty, FR); /* <non-python> */
  block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 2048, 0, st_filtered, FR);  /* "state; 0" + gaps */
  segment(&b, 4096, 0, 0);
  uint32_t first = (uint32_t)b.blocks.len;
  block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 1 << 20, 1 << 20, st1, FR);
  segment(&b, 1 << 30, 7, first);
  return finish(&b);
}

/* ---- the frame filter and format --------------------------------------------------------------
 */

Test(views, frame_filter_matches_pytorch) {
  static const struct {
    const char *name, *file;
    bool kept;
  } cases[] = {
      {"torch::unwind::unwind()", "??", false},
      {"torch::CapturedTraceback::gather(bool, bool, bool)", "", false},
      {"gather_with_cpp", "x.cpp", false},
      {"_start", "", false},
      {"thread_start", "", false}, /* plain substring: also removes thread_start */
      {"__libc_start_main", "", false},
      {"_PyEval_EvalFrameDefault", "", false},
      {"PyObject_Call", "", false},
      {"_PyFunction_Vectorcall", "", false},
      {"at::foo", "aten/src/ATen/core/boxing/impl.h", false},
      {"wrapper", "build/aten/src/ATen/RegisterCUDA.cpp", false},
      {"wrapper", "RegisterCUDA.cpp", true}, /* "/Register" needs a directory part */
      {"redispatch", "ATen/RedispatchFunctions.h", false},
      {"f", "Python/pythonrun.c", false},
      {"f", "Modules/main.c", false},
      {"f", "Objects/call.c", false},
      {"f", "Objects/methodobject.c", false},
      {"f", "Include/internal/pycore_ceval.h", false},
      {"f", "Python/ceval.c", false},
      {"f", "Include/cpython/abstract.h", false},
      {"forward", "/home/u/model.py", true},
      {"<module>", "C:\\x\\y.py", true},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    cr_expect_eq(ms_view_frame_kept(cases[i].name, cases[i].file), cases[i].kept, "%s / %s",
                 cases[i].name, cases[i].file);
}

Test(views, frame_format_keeps_basename_only_for_slashes) {
  char buf[128];
  ms_snap_frame_t f = {"forward", "/a/b/model.py", 12};
  cr_assert_eq(ms_view_frame_format(buf, sizeof buf, &f), strlen("model.py:12:forward"));
  cr_assert_str_eq(buf, "model.py:12:forward");
  f = (ms_snap_frame_t){"forward", "C:\\Users\\me\\model.py", 7};
  ms_view_frame_format(buf, sizeof buf, &f);
  cr_assert_str_eq(buf, "C:\\Users\\me\\model.py:7:forward");
  f = (ms_snap_frame_t){"at::empty()", "??", 0};
  ms_view_frame_format(buf, sizeof buf, &f);
  cr_assert_str_eq(buf, "??:0:at::empty()");
  f = (ms_snap_frame_t){"f", "dir/", -3};
  ms_view_frame_format(buf, sizeof buf, &f);
  cr_assert_str_eq(buf, ":-3:f");
  /* truncation: like snprintf, the full length is returned and the text is cut */
  f = (ms_snap_frame_t){"forward", "/a/model.py", 12};
  cr_assert_eq(ms_view_frame_format(buf, 6, &f), strlen("model.py:12:forward"));
  cr_assert_str_eq(buf, "model");
}

/* ---- memory and segments --------------------------------------------------------------------- */

Test(views, memory_frames_era_every_state) {
  ms_snapshot_t *s = frames_era();
  char *t = folded(s, MS_VIEW_MEMORY);
  const char *want =
      "stream_0;active_allocated;train.py:3:<module>;C:\\Users\\me\\model.py:7:forward;"
      "alloc.py:12:allocate 1000\n"
      "stream_0;active_allocated;<gaps> 24\n"
      "stream_0;inactive;train.py:3:<module>;C:\\Users\\me\\model.py:7:forward;"
      "alloc.py:12:allocate 4096\n"
      "stream_0;active_pending_free;<non-python> 512\n"
      "stream_0;active_allocated; 0\n"
      "stream_0;active_allocated;<gaps> 2048\n"
      "stream_7;active_allocated;train.py:3:<module>;C:\\Users\\me\\model.py:7:forward;"
      "alloc.py:12:allocate 1048576\n";
  cr_assert_str_eq(t, want);
  free(t);
  ms_snapshot_free(s);
}

Test(views, segments_adds_the_segment_address) {
  ms_snapshot_t *s = frames_era();
  char *t = folded(s, MS_VIEW_SEGMENTS);
  cr_assert(strncmp(t, "stream_0;seg_4096;active_allocated;train.py:3:<module>;", 55) == 0, "%s",
            t);
  cr_assert(strstr(t, "\nstream_0;seg_4096;active_pending_free;<non-python> 512\n"));
  cr_assert(strstr(t, "\nstream_7;seg_1073741824;active_allocated;train.py:3:<module>;"));
  size_t lines = 0;
  for (const char *p = t; *p; p++) lines += *p == '\n';
  cr_assert_eq(lines, 7);
  free(t);
  ms_snapshot_free(s);
}

Test(views, legacy_history_blocks) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  uint32_t f1 = frame(&b, "allocate", "/x/pytorch_backend.py", 190);
  uint32_t f2 = frame(&b, "<module>", "/x/flex_opt.py", 1345);
  uint32_t fr[] = {f1, f2};
  uint32_t st = stack(&b, fr, 2);
  uint32_t st_empty = stack(&b, NULL, 0);
  /* block 0: two history entries (newest first), one without frames, 100 bytes of gaps */
  ms_snap_history_t h1 = {.addr = 0, .real_size = 600, .stack = st, .present = MS_HIST_HAS_FRAMES};
  ms_snap_history_t h2 = {.addr = 600, .real_size = 300, .stack = MS_SNAP_NO_STACK, .present = 0};
  cr_assert_eq(ms__snapbuild_add_history(&b, &h1), MS_OK);
  cr_assert_eq(ms__snapbuild_add_history(&b, &h2), MS_OK);
  ms_snap_block_t b0 = {.size = 1000,
                        .requested_size = 600,
                        .state = MS_BLOCK_ACTIVE_ALLOCATED,
                        .state_name = "active_allocated",
                        .stack = MS_SNAP_NO_STACK,
                        .first_history = 0,
                        .nhistory = 2,
                        .present = MS_BLOCK_HAS_HISTORY | MS_BLOCK_HAS_REQUESTED_SIZE};
  cr_assert_eq(ms__snapbuild_add_block(&b, &b0), MS_OK);
  /* block 1: history entry with an empty frame list -> <non-python>; exactly accounted */
  ms_snap_history_t h3 = {.real_size = 512, .stack = st_empty, .present = MS_HIST_HAS_FRAMES};
  cr_assert_eq(ms__snapbuild_add_history(&b, &h3), MS_OK);
  ms_snap_block_t b1 = b0;
  b1.size = 512;
  b1.first_history = 2;
  b1.nhistory = 1;
  cr_assert_eq(ms__snapbuild_add_block(&b, &b1), MS_OK);
  /* block 2: no history, no requested_size key -> size, <non-python>, no gaps */
  ms_snap_block_t b2 = {.size = 2048,
                        .state = MS_BLOCK_INACTIVE,
                        .state_name = "inactive",
                        .stack = MS_SNAP_NO_STACK};
  cr_assert_eq(ms__snapbuild_add_block(&b, &b2), MS_OK);
  /* block 3: no history, requested_size key -> requested, then gaps */
  ms_snap_block_t b3 = b2;
  b3.requested_size = 48;
  b3.size = 64;
  b3.present = MS_BLOCK_HAS_REQUESTED_SIZE;
  cr_assert_eq(ms__snapbuild_add_block(&b, &b3), MS_OK);
  /* block 4: history summing to more than the size -> the negative gap is left out */
  ms_snap_history_t h4 = {.real_size = 9000, .stack = st, .present = MS_HIST_HAS_FRAMES};
  cr_assert_eq(ms__snapbuild_add_history(&b, &h4), MS_OK);
  ms_snap_block_t b4 = b0;
  b4.state = MS_BLOCK_INACTIVE;
  b4.state_name = "inactive";
  b4.size = 4096;
  b4.first_history = 3;
  b4.nhistory = 1;
  cr_assert_eq(ms__snapbuild_add_block(&b, &b4), MS_OK);
  segment(&b, 139686137346048ull, 0, 0);
  ms_snapshot_t *s = finish(&b);
  char *t = folded(s, MS_VIEW_SEGMENTS);
  const char *want =
      "stream_0;seg_139686137346048;active_allocated;flex_opt.py:1345:<module>;"
      "pytorch_backend.py:190:allocate 600\n"
      "stream_0;seg_139686137346048;active_allocated;<no-context> 300\n"
      "stream_0;seg_139686137346048;active_allocated;<gaps> 100\n"
      "stream_0;seg_139686137346048;active_allocated;<non-python> 512\n"
      "stream_0;seg_139686137346048;inactive;<non-python> 2048\n"
      "stream_0;seg_139686137346048;inactive;<non-python> 48\n"
      "stream_0;seg_139686137346048;inactive;<gaps> 16\n"
      "stream_0;seg_139686137346048;inactive;flex_opt.py:1345:<module>;"
      "pytorch_backend.py:190:allocate 9000\n";
  cr_assert_str_eq(t, want);
  free(t);
  ms_snapshot_free(s);
}

Test(views, unknown_state_names_are_echoed) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  ms_snap_block_t blk = {.size = 64,
                         .requested_size = 64,
                         .state = MS_BLOCK_STATE_OTHER,
                         .state_name = "active_awaiting_free",
                         .stack = MS_SNAP_NO_STACK,
                         .present = MS_BLOCK_HAS_REQUESTED_SIZE};
  cr_assert_eq(ms__snapbuild_add_block(&b, &blk), MS_OK);
  segment(&b, 0, 0, 0);
  ms_snapshot_t *s = finish(&b);
  char *t = folded(s, MS_VIEW_MEMORY);
  cr_assert_str_eq(t, "stream_0;active_awaiting_free;<non-python> 64\n");
  free(t);
  ms_snapshot_free(s);
}

Test(views, memsnap_snapshots_count_requested_bytes) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  uint32_t f = frame(&b, "train_step", "/src/train.c", 42);
  uint32_t st = stack(&b, &f, 1);
  block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 512, 500, st, 0); /* present bits not set by the producer */
  block(&b, MS_BLOCK_INACTIVE, 1536, 0, MS_SNAP_NO_STACK, 0);
  segment(&b, 1 << 21, 0, 0);
  ms_snapshot_t *s = finish(&b);
  char *t = folded(s, MS_VIEW_MEMORY);
  cr_assert_str_eq(t,
                   "stream_0;active_allocated;train.c:42:train_step 500\n"
                   "stream_0;active_allocated;<gaps> 12\n"
                   "stream_0;inactive;<non-python> 0\n"
                   "stream_0;inactive;<gaps> 1536\n");
  free(t);
  ms_snapshot_free(s);
}

Test(views, hostile_names_pass_through_as_data) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  const char *evil = "</title><script>alert(1)</script>&\"'\x01\xff";
  uint32_t f = frame(&b, evil, "a/<b>.py", 1);
  uint32_t st = stack(&b, &f, 1);
  block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 8, 8, st, FR);
  segment(&b, 0, 0, 0);
  ms_snapshot_t *s = finish(&b);
  char *t = folded(s, MS_VIEW_MEMORY);
  char want[256];
  snprintf(want, sizeof want, "stream_0;active_allocated;<b>.py:1:%s 8\n", evil);
  cr_assert_str_eq(t, want);
  free(t);
  ms_snapshot_free(s);
}

Test(views, long_names_and_deep_stacks) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  char *name = malloc(10001);
  memset(name, 'x', 10000);
  name[10000] = 0;
  uint32_t fr[300];
  for (int i = 0; i < 300; i++) fr[i] = frame(&b, i == 0 ? name : "f", "m.py", i);
  uint32_t st = stack(&b, fr, 300);
  block(&b, MS_BLOCK_ACTIVE_ALLOCATED, 8, 8, st, FR);
  segment(&b, 0, 0, 0);
  ms_snapshot_t *s = finish(&b);
  char *t = folded(s, MS_VIEW_MEMORY);
  size_t semis = 0;
  for (const char *p = t; *p; p++) semis += *p == ';';
  cr_assert_eq(semis, 301);
  cr_assert(strstr(t, name) != NULL);
  cr_assert(strncmp(t, "stream_0;active_allocated;m.py:299:f;", 37) == 0);
  free(t);
  free(name);
  ms_snapshot_free(s);
}

static int stop_after_two(void *ctx, const char *const *frames, size_t n, uint64_t count) {
  (void)frames;
  (void)count;
  cr_assert_geq(n, 2);
  int *calls = ctx;
  return ++*calls == 2 ? MS_EIO : 0;
}

Test(views, emit_errors_stop_the_view) {
  ms_snapshot_t *s = frames_era();
  int calls = 0;
  cr_assert_eq(ms_view_emit(s, MS_VIEW_MEMORY, stop_after_two, &calls), MS_EIO);
  cr_assert_eq(calls, 2);
  ms_snapshot_free(s);
}

Test(views, empty_snapshot_emits_nothing) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  ms_snapshot_t *s = finish(&b);
  char *t = folded(s, MS_VIEW_SEGMENTS);
  cr_assert_str_eq(t, "");
  free(t);
  ms_snapshot_free(s);
}

/* ---- compare -----------------------------------------------------------------------------------
 */

static ms_snapshot_t *segs(const uint64_t *addr, const uint64_t *size, size_t n) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  for (size_t i = 0; i < n; i++) {
    uint32_t first = (uint32_t)b.blocks.len;
    block(&b, MS_BLOCK_ACTIVE_ALLOCATED, size[i], size[i], MS_SNAP_NO_STACK,
          MS_BLOCK_HAS_REQUESTED_SIZE);
    segment(&b, addr[i], 0, first);
  }
  return finish(&b);
}

Test(views, segdiff_keys_by_address_and_size_sorted) {
  uint64_t a1[] = {300, 100, 200, 100}, s1[] = {10, 10, 10, 10};
  uint64_t a2[] = {200, 400, 100, 50}, s2[] = {10, 10, 20, 10};
  ms_snapshot_t *x = segs(a1, s1, 4), *y = segs(a2, s2, 4);
  ms_view_segdiff_t d = {0};
  cr_assert_eq(ms_view_segdiff(x, y, &d), MS_OK);
  cr_assert_eq(d.n_before, 2); /* (100,10) once, (300,10) */
  cr_assert_eq(d.only_before[0], 100);
  cr_assert_eq(d.only_before[1], 300);
  cr_assert_eq(d.n_after, 3); /* (50,10) (100,20) (400,10) */
  cr_assert_eq(d.only_after[0], 50);
  cr_assert_eq(d.only_after[1], 100);
  cr_assert_eq(d.only_after[2], 400);
  ms_view_segdiff_release(&d);
  ms_view_segdiff_release(&d); /* idempotent */

  char *t = folded_compare(x, y);
  cr_assert_str_eq(t,
                   "only_before;stream_0;seg_300;active_allocated;<non-python> 10\n"
                   "only_before;stream_0;seg_100;active_allocated;<non-python> 10\n"
                   "only_before;stream_0;seg_100;active_allocated;<non-python> 10\n"
                   "only_after;stream_0;seg_400;active_allocated;<non-python> 10\n"
                   "only_after;stream_0;seg_100;active_allocated;<non-python> 20\n"
                   "only_after;stream_0;seg_50;active_allocated;<non-python> 10\n");
  free(t);
  t = folded_compare(x, x);
  cr_assert_str_eq(t, "");
  free(t);
  ms_snapshot_free(x);
  ms_snapshot_free(y);
}
