/* SPDX-License-Identifier: MIT
 * Tests of the classifier (memsnap/attribution.h, issue #27): a built training step in both
 * formats with exact bytes per category at the peak and at the end; sources; every PyTorch
 * fixture (each live byte in exactly one category, categories summing to allocated at every
 * step; AdamW state ~ 2x parameters; parameters unchanged); hostile rules texts.
 */
#include <criterion/criterion.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "attribution/internal.h"
#include "helpers.h"
#include "memsnap/attribution.h"
#include "memsnap/pickle.h"
#include "memsnap/serialize.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"
#include "snapshot/deferred.h"
#include "timeline/internal.h"

/* ---- a training step, built ---------------------------------------------------------------- */

typedef struct fr_s {
  const char *name, *file;
  int line;
} fr_t;

#define PY_TAIL {"_PyEval_EvalFrameDefault", "/usr/src/python-3.12/Python/bytecodes.c", 2706}, \
                {"<unwind unsupported>", "??", 0}
#define ALLOC_HEAD                                                                           \
  {"torch::unwind::unwind()", "??", 0},                                                      \
  {"torch::CapturedTraceback::gather(bool, bool, bool)", "??", 0},                           \
  {"torch::cuda::(anonymous namespace)::gather_with_cpp()", "memory_snapshot.cpp", 0},       \
  {"c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed char, "   \
   "unsigned long, CUstream_st*)", "CUDACachingAllocator.cpp", 0},                           \
  {"at::detail::empty_strided_cuda(c10::ArrayRef<long>, c10::ArrayRef<long>, "               \
   "c10::ScalarType)", "??", 0},                                                             \
  {"at::_ops::empty_strided::call(c10::ArrayRef<c10::SymInt>)", "??", 0}
#define OP(name) {"at::_ops::" name "::call(at::Tensor const&)", "??", 0}
#define MODULE "/venv/lib/python3.12/site-packages/torch/nn/modules/module.py"
#define FWD(line, fn) {fn, "/home/u/model.py", line}, {"_call_impl", MODULE, 1750}, \
                      {"<module>", "/home/u/train.py", 21}
#define ENGINE {"torch::autograd::Engine::evaluate_function(std::shared_ptr<torch::autograd::" \
                "GraphTask>&, torch::autograd::Node*)", "??", 0},                              \
               {"torch::autograd::Engine::thread_main(std::shared_ptr<torch::autograd::"       \
                "GraphTask> const&)", "??", 0}
#define ADAMW "/venv/lib/python3.12/site-packages/torch/optim/adamw.py"
#define OPTIM "/venv/lib/python3.12/site-packages/torch/optim/optimizer.py"

enum { S_INIT, S_INPUT, S_FWD30, S_FWD31, S_SIGMOID, S_MUL, S_FWD33, S_LOSS, S_MMB, S_MMB_SUM,
       S_ACC, S_STATE, S_OPTTMP, S_NSTACKS };

static const fr_t st_init[] = {ALLOC_HEAD, OP("_to_copy"), PY_TAIL,
                               {"convert", MODULE, 1329}, {"_apply", MODULE, 930},
                               {"to", MODULE, 1343}, {"<module>", "/home/u/train.py", 10}};
static const fr_t st_input[] = {ALLOC_HEAD, OP("_to_copy"), PY_TAIL,
                                {"<module>", "/home/u/train.py", 20}};
static const fr_t st_fwd30[] = {ALLOC_HEAD, OP("mm"), PY_TAIL, FWD(30, "forward")};
static const fr_t st_fwd31[] = {ALLOC_HEAD, OP("add_Tensor"), PY_TAIL, FWD(31, "forward")};
static const fr_t st_sigmoid[] = {ALLOC_HEAD, OP("sigmoid"), PY_TAIL, FWD(32, "silu")};
static const fr_t st_mul[] = {ALLOC_HEAD, OP("mul_Tensor"), PY_TAIL, FWD(32, "silu")};
static const fr_t st_fwd33[] = {ALLOC_HEAD, OP("mm"), PY_TAIL, FWD(33, "forward")};
static const fr_t st_loss[] = {ALLOC_HEAD, OP("mean"), PY_TAIL,
                               {"<module>", "/home/u/train.py", 22}};
static const fr_t st_mmb[] = {ALLOC_HEAD, OP("mm"),
                              {"torch::autograd::generated::MmBackward0::apply(std::vector<at::"
                               "Tensor>&&)", "??", 0}, ENGINE};
static const fr_t st_mmb_sum[] = {ALLOC_HEAD, OP("sum_dim_IntList"),
                                  {"torch::autograd::generated::MmBackward0::apply(std::vector<"
                                   "at::Tensor>&&)", "??", 0}, ENGINE};
static const fr_t st_acc[] = {ALLOC_HEAD, OP("clone"),
                              {"void torch::autograd::AccumulateGrad::accumulateGrad<torch::"
                               "autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)::"
                               "{lambda(at::Tensor&&)#1}>(at::Tensor const&, at::Tensor&)", "??",
                               0},
                              {"torch::autograd::AccumulateGrad::apply(std::vector<at::Tensor>&&)",
                               "??", 0}, ENGINE};
static const fr_t st_state[] = {ALLOC_HEAD, OP("zeros_like"), PY_TAIL,
                                {"_init_group", ADAMW, 171}, {"step", ADAMW, 232},
                                {"wrapper", OPTIM, 493}, {"<module>", "/home/u/train.py", 30}};
static const fr_t st_opttmp[] = {ALLOC_HEAD, OP("_foreach_sqrt"), PY_TAIL,
                                 {"_multi_tensor_adamw", ADAMW, 699}, {"step", ADAMW, 243},
                                 {"wrapper", OPTIM, 493}, {"<module>", "/home/u/train.py", 30}};

static const struct {
  const fr_t *f;
  size_t n;
} stack_defs[S_NSTACKS] = {
#define SD(x) {x, sizeof x / sizeof *x}
    SD(st_init), SD(st_input), SD(st_fwd30), SD(st_fwd31), SD(st_sigmoid), SD(st_mul),
    SD(st_fwd33), SD(st_loss), SD(st_mmb), SD(st_mmb_sum), SD(st_acc), SD(st_state),
    SD(st_opttmp)};

/* The step: 'a' allocates block id with a stack, 'f' frees it (free_requested, free_completed). */
typedef struct ev_s {
  char kind;
  int id;
  uint64_t size;
  int stack;
} ev_t;

enum { P1, P2, X, A1, T1, S1, S2, A2, L, G1, BT, G2, G3, ST0, ST1, ST2, ST3, ST4, ST5, OT1, OT2,
       P3, NBLK };
static const ev_t step_events[] = {
    {'a', P1, 262144, S_INIT},     {'a', P2, 131072, S_INIT},      {'a', X, 65536, S_INPUT},
    {'a', A1, 524288, S_FWD30},    {'a', T1, 32768, S_FWD31},      {'f', T1, 0, 0},
    {'a', S1, 98304, S_SIGMOID},   {'a', S2, 98304, S_MUL},        {'f', S2, 0, 0},
    {'a', A2, 196608, S_FWD33},    {'a', L, 512, S_LOSS},          {'a', G1, 262144, S_MMB},
    {'a', BT, 65536, S_MMB_SUM},   {'f', BT, 0, 0},                {'f', A1, 0, 0},
    {'a', G2, 131072, S_ACC},      {'a', G3, 65536, S_ACC},        {'f', S1, 0, 0},
    {'f', A2, 0, 0},               {'a', ST0, 262144, S_STATE},    {'a', ST1, 262144, S_STATE},
    {'a', ST2, 131072, S_STATE},   {'a', ST3, 131072, S_STATE},    {'a', ST4, 65536, S_STATE},
    {'a', ST5, 65536, S_STATE},    {'a', OT1, 262144, S_OPTTMP},   {'f', OT1, 0, 0},
    {'a', OT2, 131072, S_OPTTMP},  {'f', OT2, 0, 0},
};
#define SEG_BASE 0x7f0000000000ull
#define SEG_SIZE (8ull << 20)
#define T0 1777000000000000ll

static uint32_t build_stack(ms__snapbuild_t *b, int which) {
  uint32_t fr[64], st;
  for (size_t i = 0; i < stack_defs[which].n; i++) {
    const fr_t *f = &stack_defs[which].f[i];
    cr_assert_eq(ms__snapbuild_frame(b, f->name, strlen(f->name), f->file, strlen(f->file),
                                     f->line, &fr[i]), MS_OK);
  }
  cr_assert_eq(ms__snapbuild_stack(b, fr, stack_defs[which].n, &st), MS_OK);
  return st;
}

static void add_trace(ms__snapbuild_t *b, ms_trace_action act, uint64_t addr, uint64_t size,
                      uint32_t stack, int64_t t) {
  ms_snap_trace_t e;
  memset(&e, 0, sizeof e);
  e.action = (uint8_t)act;
  e.addr = addr;
  e.size = size;
  e.stack = stack;
  e.time_us = T0 + t;
  e.present = MS_TRACE_HAS_TIME | (stack != MS_SNAP_NO_STACK ? MS_TRACE_HAS_FRAMES : 0);
  cr_assert_eq(ms__snapbuild_add_trace(b, &e), MS_OK);
}

static void add_block(ms__snapbuild_t *b, uint64_t addr, uint64_t size, bool live, uint32_t stack) {
  ms_snap_block_t bl;
  memset(&bl, 0, sizeof bl);
  bl.address = addr;
  bl.size = size;
  bl.requested_size = live ? size : 0;
  bl.state = live ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
  bl.state_name = live ? "active_allocated" : "inactive";
  bl.stack = stack;
  bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
  cr_assert_eq(ms__snapbuild_add_block(b, &bl), MS_OK);
}

static void add_annotation(ms__snapbuild_t *b, const char *stage, int64_t t) {
  ms_snap_annotation_t a = {"Optimizer.step#AdamW.step", stage, 0, T0 + t};
  cr_assert_eq(MS_VEC_PUSH(&b->annotations, a), 0);
}

/* Stacks that only frees have (build_step_ex(true)): S2's free through silu's line but another
 * op and an outer frame of its own; T1's free from a line no allocation has. */
static const fr_t st_free_s2[] = {OP("sigmoid"), PY_TAIL, FWD(32, "silu"),
                                  {"main", "/home/u/train.py", 40}};
static const fr_t st_free_t1[] = {OP("mm"), PY_TAIL, FWD(34, "forward")};

static uint32_t build_frames(ms__snapbuild_t *b, const fr_t *f, size_t n) {
  uint32_t fr[64], st;
  for (size_t i = 0; i < n; i++)
    cr_assert_eq(ms__snapbuild_frame(b, f[i].name, strlen(f[i].name), f[i].file,
                                     strlen(f[i].file), f[i].line, &fr[i]), MS_OK);
  cr_assert_eq(ms__snapbuild_stack(b, fr, n, &st), MS_OK);
  return st;
}

/* The snapshot of one training step: P3 (64 KiB, no frames) alive before recording began, then
 * step_events; addresses bump through one 8 MiB segment that exists before recording. With
 * free_stacks, the free_completed entries of S2 and T1 have stacks of their own. */
static ms_snapshot_t *build_step_ex(bool free_stacks) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_ANNOTATIONS;
  uint32_t stacks[S_NSTACKS], empty;
  for (int i = 0; i < S_NSTACKS; i++) stacks[i] = build_stack(&b, i);
  cr_assert_eq(ms__snapbuild_stack(&b, NULL, 0, &empty), MS_OK);
  uint32_t free_stack[NBLK];
  for (int k = 0; k < NBLK; k++) free_stack[k] = MS_SNAP_NO_STACK;
  if (free_stacks) {
    free_stack[S2] = build_frames(&b, st_free_s2, sizeof st_free_s2 / sizeof *st_free_s2);
    free_stack[T1] = build_frames(&b, st_free_t1, sizeof st_free_t1 / sizeof *st_free_t1);
  }
  uint64_t addr[NBLK], size[NBLK];
  uint32_t bstack[NBLK];
  bool live[NBLK] = {0};
  addr[P3] = SEG_BASE;
  size[P3] = 65536;
  bstack[P3] = empty;
  live[P3] = true;
  uint64_t next = SEG_BASE + 65536;
  size_t nev = sizeof step_events / sizeof *step_events;
  int64_t t = 0;
  for (size_t i = 0; i < nev; i++) {
    const ev_t *e = &step_events[i];
    if (e->kind == 'a') {
      if (e->id == ST0) add_annotation(&b, "START", t);
      addr[e->id] = next;
      size[e->id] = e->size;
      bstack[e->id] = stacks[e->stack];
      live[e->id] = true;
      next += e->size;
      add_trace(&b, MS_TRACE_ALLOC, addr[e->id], e->size, stacks[e->stack], t++);
    } else {
      add_trace(&b, MS_TRACE_FREE_REQUESTED, addr[e->id], size[e->id], MS_SNAP_NO_STACK, t++);
      add_trace(&b, MS_TRACE_FREE_COMPLETED, addr[e->id], size[e->id], free_stack[e->id], t++);
      live[e->id] = false;
    }
  }
  add_annotation(&b, "END", t);
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = SEG_BASE;
  g.total_size = SEG_SIZE;
  g.stream = 0;
  g.is_large = true;
  g.stack = MS_SNAP_NO_STACK;
  g.first_block = (uint32_t)b.blocks.len;
  uint64_t at = SEG_BASE;
  for (uint64_t a = SEG_BASE; a < next;) { /* blocks in address order: ids are in bump order */
    int id = -1;
    for (int k = 0; k < NBLK; k++)
      if (addr[k] == a) id = k;
    cr_assert(id >= 0);
    if (live[id]) {
      if (a > at) add_block(&b, at, a - at, false, MS_SNAP_NO_STACK);
      add_block(&b, a, size[id], true, bstack[id]);
      g.allocated_size += size[id];
      at = a + size[id];
    }
    a += size[id];
  }
  if (at < SEG_BASE + SEG_SIZE) add_block(&b, at, SEG_BASE + SEG_SIZE - at, false, MS_SNAP_NO_STACK);
  g.active_size = g.requested_size = g.allocated_size;
  g.nblocks = (uint32_t)(b.blocks.len - g.first_block);
  g.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = (uint32_t)b.trace.len;
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

static ms_snapshot_t *build_step(void) { return build_step_ex(false); }

/* ---- checks -------------------------------------------------------------------------------- */

typedef struct cls_s {
  ms_snapshot_t *snap;
  ms_timeline_t *tl;
  ms_attr_t *a;
} cls_t;

static cls_t cls_open(ms_snapshot_t *s, const char *rules) {
  cls_t c = {s, NULL, NULL};
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &c.tl, &eb), MS_OK, "%s", eb.msg);
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  if (rules) {
    cfg.rules = rules;
    cfg.rules_len = strlen(rules);
  }
  cr_assert_eq(ms_attr_create(s, c.tl, &cfg, &c.a, &eb), MS_OK, "%s", eb.msg);
  return c;
}

static void cls_close(cls_t *c) {
  ms_attr_destroy(c->a);
  ms_timeline_destroy(c->tl);
  ms_snapshot_free(c->snap);
}

/* Bytes per category at step (rows by category), and a check that they sum to allocated. */
static void bytes_at(const cls_t *c, size_t dev, size_t step, uint64_t out[MS_CAT_COUNT]) {
  ms_attr_rows_t r;
  cr_assert_eq(ms_attr_aggregate(c->a, dev, step, NULL, MS_ATTR_BY_CATEGORY, &r), MS_OK);
  cr_assert_eq(r.nrows, MS_CAT_COUNT, "every category has a row");
  memset(out, 0, MS_CAT_COUNT * sizeof *out);
  for (size_t i = 0; i < r.nrows; i++) {
    ms_category k = ms_category_parse(r.rows[i].key);
    cr_assert_lt(k, MS_CAT_COUNT);
    out[k] = r.rows[i].bytes;
  }
  const uint64_t *alloc = ms_timeline_series(c->tl, dev, MS_TL_ALLOCATED);
  cr_assert_eq(r.total_bytes, alloc[step], "step %zu: categories sum to allocated", step);
  ms_attr_rows_free(&r);
}

static void expect_bytes(const cls_t *c, size_t step, const uint64_t want[MS_CAT_COUNT]) {
  uint64_t got[MS_CAT_COUNT];
  bytes_at(c, 0, step, got);
  for (int k = 0; k < MS_CAT_COUNT; k++)
    cr_assert_eq(got[k], want[k], "step %zu: %s: %llu bytes, expected %llu", step,
                 ms_category_name((ms_category)k), (unsigned long long)got[k],
                 (unsigned long long)want[k]);
}

/* The series agrees with the rows and with allocated at every step. */
static void check_series(const cls_t *c, size_t dev) {
  uint64_t *ser = NULL;
  cr_assert_eq(ms_attr_category_series(c->a, dev, &ser), MS_OK);
  size_t n = ms_timeline_nentries(c->tl, dev);
  const uint64_t *alloc = ms_timeline_series(c->tl, dev, MS_TL_ALLOCATED);
  for (size_t s = 0; s <= n; s++) {
    uint64_t sum = 0;
    for (int k = 0; k < MS_CAT_COUNT; k++) sum += ser[s * MS_CAT_COUNT + k];
    cr_assert_eq(sum, alloc[s], "device %zu step %zu: categories %llu != allocated %llu", dev, s,
                 (unsigned long long)sum, (unsigned long long)alloc[s]);
  }
  free(ser);
}

/* The built step's answers, in whichever format it went through. */
static void check_step(ms_snapshot_t *s) {
  cls_t c = cls_open(s, NULL);
  size_t n = ms_timeline_nentries(c.tl, 0);
  ms_tl_peak_t pk;
  cr_assert_eq(ms_timeline_peak(c.tl, 0, MS_TL_ALLOCATED, 0, n, &pk), MS_OK);
  cr_assert_eq(pk.bytes, 2163200);
  enum { PA = MS_CAT_PARAMETER, OS = MS_CAT_OPTIMIZER_STATE, IN = MS_CAT_INPUT,
         TM = MS_CAT_TEMPORARY, AC = MS_CAT_ACTIVATION, GR = MS_CAT_GRADIENT,
         AD = MS_CAT_AUTOGRAD_DETAIL };
  uint64_t peak[MS_CAT_COUNT] = {0}, end[MS_CAT_COUNT] = {0}, fwd[MS_CAT_COUNT] = {0};
  peak[PA] = end[PA] = 65536 + 262144 + 131072; /* P3 (matched to G3's size), P1, P2 */
  peak[IN] = end[IN] = 65536;
  peak[AC] = end[AC] = 512;                     /* the loss, made after forward */
  peak[GR] = end[GR] = 262144 + 131072 + 65536;
  peak[OS] = end[OS] = 2 * (262144 + 131072 + 65536); /* AdamW: 2x the parameters */
  peak[TM] = 262144;                            /* _foreach_sqrt's result */
  expect_bytes(&c, pk.step, peak);
  expect_bytes(&c, n, end);
  /* after entry 13 (BT's alloc): the forward's activations and a backward temporary */
  fwd[PA] = 458752;
  fwd[IN] = 65536;
  fwd[AC] = 524288 + 98304 + 196608 + 512;
  fwd[GR] = 262144;
  fwd[AD] = 65536;
  expect_bytes(&c, 15, fwd);
  /* after entry 4 (T1's alloc) and 8 (S2's): temporaries of forward */
  uint64_t got[MS_CAT_COUNT];
  bytes_at(&c, 0, 5, got);
  cr_assert_eq(got[TM], 32768);
  bytes_at(&c, 0, 9, got);
  cr_assert_eq(got[TM], 98304);
  cr_assert_eq(got[AC], 524288 + 98304);
  check_series(&c, 0);
  /* sources: one line, two ops; an autograd node, two ops; accumulation; no frame */
  ms_attr_rows_t r;
  cr_assert_eq(ms_attr_aggregate(c.a, 0, 9, NULL, MS_ATTR_BY_SOURCE, &r), MS_OK);
  const char *want9[][2] = {{"model.py:30 forward", "524288"},
                            {"<no frame>", "65536"},
                            {"train.py:10 <module>", "393216"},
                            {"model.py:32 silu \xe2\x86\x92 at::sigmoid", "98304"},
                            {"model.py:32 silu \xe2\x86\x92 at::mul_Tensor", "98304"},
                            {"train.py:20 <module>", "65536"}};
  cr_assert_eq(r.nrows, 6, "%zu rows", r.nrows);
  for (size_t i = 0; i < 6; i++) {
    bool found = false;
    for (size_t k = 0; k < r.nrows; k++)
      if (strcmp(r.rows[k].key, want9[i][0]) == 0) {
        found = true;
        cr_assert_eq(r.rows[k].bytes, strtoull(want9[i][1], NULL, 10), "%s", want9[i][0]);
      }
    cr_assert(found, "no row '%s'", want9[i][0]);
  }
  cr_assert_str_eq(r.rows[0].key, "model.py:30 forward");
  cr_assert_eq(r.rows[0].category, MS_CAT_ACTIVATION);
  ms_attr_rows_free(&r);
  cr_assert_eq(ms_attr_aggregate(c.a, 0, 15, NULL, MS_ATTR_BY_SOURCE, &r), MS_OK);
  bool mm = false, sum = false;
  for (size_t k = 0; k < r.nrows; k++) {
    mm |= strcmp(r.rows[k].key, "MmBackward0 \xe2\x86\x92 at::mm") == 0;
    sum |= strcmp(r.rows[k].key, "MmBackward0 \xe2\x86\x92 at::sum_dim_IntList") == 0;
  }
  cr_assert(mm && sum);
  ms_attr_rows_free(&r);
  cr_assert_eq(ms_attr_aggregate(c.a, 0, n, NULL, MS_ATTR_BY_SOURCE, &r), MS_OK);
  bool acc = false;
  for (size_t k = 0; k < r.nrows; k++)
    if (strcmp(r.rows[k].key, "AccumulateGrad::accumulateGrad") == 0) {
      acc = true;
      cr_assert_eq(r.rows[k].bytes, 131072 + 65536);
      cr_assert_eq(r.rows[k].category, MS_CAT_GRADIENT);
    }
  cr_assert(acc);
  ms_attr_rows_free(&r);
  /* by stack: torch's and the interpreter's frames are left out, outermost first */
  cr_assert_eq(ms_attr_aggregate(c.a, 0, n, NULL, MS_ATTR_BY_STACK, &r), MS_OK);
  bool st = false;
  for (size_t k = 0; k < r.nrows; k++)
    st |= strcmp(r.rows[k].key, "train.py:22:<module>") == 0 && r.rows[k].bytes == 512;
  cr_assert(st);
  ms_attr_rows_free(&r);
  cls_close(&c);
}

Test(attribution, built_step_in_memory) { check_step(build_step()); }

static ms_snapshot_t *through(ms_snapshot_t *s, bool pickle) {
  char *dir = th_tmpdir();
  char path[512];
  snprintf(path, sizeof path, "%s/step.%s", dir, pickle ? "pickle" : "msnap");
  ms_errbuf_t eb = {{0}};
  if (pickle)
    cr_assert_eq(ms_pickle_write_file(s, path, &eb), MS_OK, "%s", eb.msg);
  else
    cr_assert_eq(ms_snapshot_write_file(s, path, NULL, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  ms_snapshot_t *r = NULL;
  cr_assert_eq(ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS, &r, &eb), MS_OK, "%s", eb.msg);
  th_rmdir(dir);
  free(dir);
  return r;
}

/* The step as a pickle read with its stacks left for later (MS_LOAD_DEFER_STACKS): the classifier
 * reads those allocations' frames from the file again, without interning their stacks, and gives
 * the step's exact figures, model.py:32's two operators and MmBackward0's included, as a full
 * read does. The pickle is Python's, written as PyTorch writes one: a list of frames per entry,
 * each frame dict memoized (memsnap's writer shares a stack's list between its entries, and a
 * list met again is never left for later). */
Test(attribution, step_read_with_stacks_left_for_later) {
  if (!th_have_python()) cr_skip_test("no python3");
  char *dir = th_tmpdir(), ours[512], path[512], cmd[2048];
  snprintf(ours, sizeof ours, "%s/ours.pickle", dir);
  snprintf(path, sizeof path, "%s/step.pickle", dir);
  ms_snapshot_t *s = build_step_ex(true);
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write_file(s, ours, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  snprintf(cmd, sizeof cmd,
           "python3 -c 'import pickle, sys\n"
           "d = pickle.load(open(sys.argv[1], \"rb\"))\n"
           "for t in d[\"device_traces\"]:\n"
           "    for e in t:\n"
           "        if \"frames\" in e: e[\"frames\"] = list(e[\"frames\"])\n"
           "pickle.dump(d, open(sys.argv[2], \"wb\"), protocol=4)' '%s' '%s'",
           ours, path);
  cr_assert_eq(system(cmd), 0, "%s", cmd);
  const unsigned later = MS_LOAD_NO_FREE_STACKS | MS_LOAD_DEFER_STACKS;
  ms_snapshot_t *e = NULL, *d = NULL;
  cr_assert_eq(ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS, &e, &eb), MS_OK, "%s", eb.msg);
  cr_assert_eq(ms_snapshot_load_ex(path, later, &d, &eb), MS_OK, "%s", eb.msg);
  cr_assert(ms__snapshot_has_deferred(d), "the pickle leaves stacks for later");
  cls_t x = cls_open(e, NULL), y = cls_open(d, NULL);
  char why[512] = "";
  cr_assert(th_attr_same(x.tl, x.a, y.tl, y.a, why, sizeof why), "%s", why);
  cls_close(&x);
  cls_close(&y);
  cr_assert_eq(ms_snapshot_load_ex(path, later, &d, &eb), MS_OK, "%s", eb.msg);
  check_step(d);
  th_rmdir(dir);
  free(dir);
}

/* A stack that only frees have is no allocation's: it does not decide whether a line shows its op
 * (model.py:32 has two, sigmoid and mul, from S1's and S2's allocations; model.py:34 none), and
 * its source is found when asked. The categories and sources of the step are unchanged. */
Test(attribution, source_of_a_free_stack) {
  check_step(build_step_ex(true));
  cls_t c = cls_open(build_step_ex(true), NULL);
  const ms_snapshot_t *s = c.snap;
  const char *want[] = {"model.py:34 forward", "model.py:32 silu \xe2\x86\x92 at::sigmoid"};
  size_t k = 0;
  for (size_t i = 0; i < s->ntrace; i++) {
    if (s->trace[i].action != MS_TRACE_FREE_COMPLETED || s->trace[i].stack == MS_SNAP_NO_STACK)
      continue;
    cr_assert_lt(k, 2);
    char buf[128];
    ms_attr_source(c.a, s->trace[i].stack, buf, sizeof buf);
    cr_assert_str_eq(buf, want[k], "free %zu: '%s'", k, buf);
    k++;
  }
  cr_assert_eq(k, 2);
  cls_close(&c);
}

static void check_lazy(const ms_snapshot_t *s, const char *name);

Test(attribution, built_step_as_pytorch_pickle) { check_step(through(build_step(), true)); }
Test(attribution, built_step_as_memsnap_msgpack) { check_step(through(build_step(), false)); }

/* A snapshot made from PyTorch's profiler carries each allocation's category on its `alloc`
 * entry ("category": "input", as _memory_viz.py's conversion writes it): it wins over the rules,
 * through the pickle; a name that is no category is left to the rules. */
Test(attribution, a_category_the_snapshot_carries_wins) {
  for (int bogus = 0; bogus < 2; bogus++) {
    ms_snapshot_t *s = build_step();
    static ms_snap_trace_extra_t given = {NULL, "", "", {0, 0}, "input"};
    static ms_snap_trace_extra_t weird = {NULL, "", "", {0, 0}, "<b>weird</b>"};
    for (size_t i = 0; i < s->ntrace; i++) {
      ms_snap_trace_t *t = (ms_snap_trace_t *)&s->trace[i];
      if (t->action != MS_TRACE_ALLOC) continue;
      t->extra = bogus ? &weird : &given;
      t->present |= MS_TRACE_HAS_CATEGORY;
    }
    ms_snapshot_t *back = through(s, true);
    size_t nalloc = 0;
    for (size_t i = 0; i < back->ntrace; i++)
      if (back->trace[i].action == MS_TRACE_ALLOC) {
        nalloc++;
        cr_assert_str_eq(ms_snap_trace_category(&back->trace[i]), bogus ? "<b>weird</b>" : "input");
      }
    cr_assert_gt(nalloc, 0);
    if (bogus) {
      check_step(back); /* the rules decide, as without the field */
      continue;
    }
    check_lazy(back, "categories carried"); /* found alone, the carried category wins too */
    cls_t c = cls_open(back, NULL);
    size_t n = ms_timeline_nentries(c.tl, 0);
    for (size_t i = 0; i < n; i++)
      if (ms_timeline_entry(c.tl, 0, i)->action == MS_TRACE_ALLOC)
        cr_expect_eq(ms_attr_entry_category(c.a, 0, i), MS_CAT_INPUT, "entry %zu", i);
    cls_close(&c);
  }
}

Test(attribution, no_trace_end_state_alone) {
  /* a snapshot without its trace still has categories, from the stacks */
  ms_snapshot_t *s = build_step();
  s->devices[0].ntrace = 0;
  s->nannotations = 0;
  cls_t c = cls_open(s, NULL);
  uint64_t got[MS_CAT_COUNT];
  bytes_at(&c, 0, 0, got);
  cr_assert_eq(got[MS_CAT_PARAMETER], 458752);     /* P1, P2 by _apply; P3 by G3's size */
  cr_assert_eq(got[MS_CAT_GRADIENT], 458752);
  cr_assert_eq(got[MS_CAT_OPTIMIZER_STATE], 917504); /* alive, from before: after their phase */
  cls_close(&c);
}

Test(attribution, rules_extend_and_replace) {
  /* a rule of the user's comes first; `defaults none` leaves only the user's */
  cls_t c = cls_open(build_step(), "input file=*/train.py frame=<module>@*train.py\n");
  uint64_t got[MS_CAT_COUNT];
  bytes_at(&c, 0, ms_timeline_nentries(c.tl, 0), got);
  cr_assert_eq(got[MS_CAT_INPUT], 65536 + 512 + 393216 + 917504,
               "every block whose stack has train.py's <module>: %llu",
               (unsigned long long)got[MS_CAT_INPUT]);
  cls_close(&c);
  c = cls_open(build_step(), "defaults none\nparameter phase=init\n");
  bytes_at(&c, 0, ms_timeline_nentries(c.tl, 0), got);
  cr_assert_eq(got[MS_CAT_PARAMETER], 0, "no phase rules: no init phase");
  cr_assert_eq(got[MS_CAT_UNKNOWN], 1901056);
  cls_close(&c);
  c = cls_open(build_step(), "defaults none\nphase init func=*_apply*\nparameter phase=init\n");
  bytes_at(&c, 0, ms_timeline_nentries(c.tl, 0), got);
  cr_assert_eq(got[MS_CAT_PARAMETER], 393216);
  char buf[64];
  ms_attr_source(c.a, MS_SNAP_NO_STACK, buf, sizeof buf);
  cr_assert_str_eq(buf, "<no stack recorded>");
  cls_close(&c);
}

/* ---- hostile rules ------------------------------------------------------------------------- */

static void expect_rules_error(const char *text, size_t len, int err, const char *msg) {
  ms_snapshot_t *s = build_step();
  ms_timeline_t *tl = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK);
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  cfg.rules = text;
  cfg.rules_len = len;
  cfg.rules_name = "my.rules";
  ms_attr_t *a = NULL;
  int rc = ms_attr_create(s, tl, &cfg, &a, &eb);
  cr_assert_eq(rc, err, "'%.60s': %d (%s)", text, rc, eb.msg);
  cr_assert_null(a);
  cr_assert(strstr(eb.msg, msg), "'%s' lacks '%s'", eb.msg, msg);
  ms_timeline_destroy(tl);
  ms_snapshot_free(s);
}

Test(attribution, hostile_rules_name_the_line) {
  struct {
    const char *text, *msg;
  } cases[] = {
      {"# fine\n\nparamter phase=init\n", "my.rules:3: unknown category or kind of line"},
      {"gradient phase\n", "my.rules:1: a condition is KEY=VALUE, not 'phase'"},
      {"gradient phase=sideways\n", "my.rules:1: unknown phase"},
      {"gradient colour=blue\n", "my.rules:1: unknown condition 'colour=blue'"},
      {"gradient freed=sometimes\n", "my.rules:1: freed= takes within, after or never"},
      {"skip phase=forward\n", "my.rules:1: this kind of rule takes only"},
      {"skip\n", "my.rules:1: this rule needs a func=, file= or frame= condition"},
      {"phase\n", "my.rules:1: phase needs a phase"},
      {"gradient frame=nofile\n", "my.rules:1: frame= needs FUNC@FILE"},
      {"gradient !annotation=x\n", "my.rules:1: only func=, file= and frame= take '!'"},
      {"phase init annotation=a func=b\n", "my.rules:1: annotation= stands alone"},
      {"defaults some\n", "my.rules:1: the only defaults line is 'defaults none'"},
  };
  for (size_t i = 0; i < sizeof cases / sizeof *cases; i++)
    expect_rules_error(cases[i].text, strlen(cases[i].text), MS_EINVAL, cases[i].msg);
  expect_rules_error("gradient\0 x\n", 12, MS_EINVAL, "my.rules:1: a NUL byte");
}

Test(attribution, hostile_rules_too_big) {
  size_t big = (1u << 20) + 1;
  char *t = malloc(big + 1);
  memset(t, '#', big);
  t[big] = 0;
  expect_rules_error(t, big, MS_ELIMIT, "my.rules: more than 1 MiB");
  memset(t, 'x', 5000);
  t[5000] = '\n';
  expect_rules_error(t, 5001, MS_ELIMIT, "my.rules:1: line longer than 4096 bytes");
  /* 1025 rules */
  size_t len = 0;
  for (int i = 0; i < 1025; i++) len += (size_t)sprintf(t + len, "unknown phase=none\n");
  expect_rules_error(t, len, MS_ELIMIT, "my.rules:1025: too many rules (at most 1024)");
  len = 0;
  for (int i = 0; i < 257; i++) len += (size_t)sprintf(t + len, "unknown func=f%d\n", i);
  expect_rules_error(t, len, MS_ELIMIT, "my.rules:257: too many distinct patterns");
  free(t);
}

Test(attribution, glob_bomb_is_linear) {
  /* a pattern that makes backtracking matchers exponential, on long names */
  char text[4097];
  memset(text, 'a', 4096);
  text[4096] = 0;
  const char *bomb = "*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*a*b";
  clock_t t0 = clock();
  for (int i = 0; i < 20; i++) cr_assert_not(ms__attr_glob(bomb, text, false));
  double s = (double)(clock() - t0) / CLOCKS_PER_SEC;
  cr_assert_lt(s, 2.0, "20 matches took %.2f s", s);
  cr_assert(ms__attr_glob("*torch/optim/*", "C:\\venv\\torch\\optim\\adamw.py", true));
  cr_assert_not(ms__attr_glob("*torch/optim/*", "C:\\venv\\torch\\optim\\adamw.py", false));
  cr_assert(ms__attr_glob("a?c*", "abcdef", false));
  cr_assert_not(ms__attr_glob("a?c", "abcd", false));
  cr_assert(ms__attr_glob("**", "", false));
}

Test(attribution, category_names) {
  for (int k = 0; k < MS_CAT_COUNT; k++)
    cr_assert_eq(ms_category_parse(ms_category_name((ms_category)k)), k);
  cr_assert_eq(ms_category_parse("weights"), MS_CAT_COUNT);
  cr_assert_str_eq(ms_category_color(MS_CAT_PARAMETER), "darkgreen");
  cr_assert_str_eq(ms_category_name(MS_CAT_UNKNOWN), "unknown");
}

/* ---- every fixture ------------------------------------------------------------------------- */

static const char *const fixtures[] = {
    "jogregoire_diffusion_tiny", "a0kuma_adamw_small", "yiyi_flexgen_oom_legacy",
    "yiyi_flexgen_1.3b_legacy_a", "maphsge_select_n_4dev", "cranberrii_ftcourse",
    "wedsonlin_cs336_medium_1024_training"};

/* Whether the snapshot is training with AdamW: an AdamW annotation or frame. */
static bool uses_adamw(const ms_snapshot_t *s) {
  for (size_t i = 0; i < s->nannotations; i++)
    if (strstr(s->annotations[i].name, "AdamW")) return true;
  for (size_t i = 0; i < s->nframes; i++)
    if (strstr(s->frames[i].filename, "torch/optim/adamw.py")) return true;
  return false;
}

Test(attribution, every_fixture) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[0]);
  if (access(path, R_OK) != 0) {
    printf("SKIP: PyTorch fixtures not found in %s\n", th_fixture_dir());
    cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  }
  int adamw = 0;
  for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[f]);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS, &s, &eb), MS_OK, "%s", eb.msg);
    cls_t c = cls_open(s, NULL);
    for (size_t d = 0; d < ms_timeline_ndevices(c.tl); d++) {
      size_t n = ms_timeline_nentries(c.tl, d);
      check_series(&c, d); /* every step: categories sum to allocated */
      ms_tl_peak_t pk;
      cr_assert_eq(ms_timeline_peak(c.tl, d, MS_TL_ALLOCATED, 0, n, &pk), MS_OK);
      uint64_t at_peak[MS_CAT_COUNT], at_end[MS_CAT_COUNT];
      bytes_at(&c, d, pk.step, at_peak); /* rows: each block in one category, summing up */
      bytes_at(&c, d, n, at_end);
      if (!uses_adamw(s) || d != 0) continue;
      adamw++;
      /* the optimizer stepped before the end: its state is 2x the parameters, +-5% */
      double p = (double)at_end[MS_CAT_PARAMETER], o = (double)at_end[MS_CAT_OPTIMIZER_STATE];
      cr_assert(p > 0 && o >= 0.95 * 2 * p && o <= 1.05 * 2 * p,
                "%s: optimizer_state %.0f vs parameter %.0f", fixtures[f], o, p);
      /* parameters do not change once the model is built (from the first forward on) */
      uint64_t *ser = NULL;
      cr_assert_eq(ms_attr_category_series(c.a, d, &ser), MS_OK);
      const attr_dev_t *ad = &c.a->dev[d];
      size_t from = n;
      for (size_t k = 0; k < ad->nspans; k++)
        if (ad->spans[k].phase == ATTR_PH_FORWARD) {
          from = ad->spans[k].first;
          break;
        }
      cr_assert_lt(from, n, "%s: a forward phase", fixtures[f]);
      for (size_t st = from; st <= n; st++)
        cr_assert_eq(ser[st * MS_CAT_COUNT + MS_CAT_PARAMETER], at_end[MS_CAT_PARAMETER],
                     "%s: parameters at step %zu", fixtures[f], st);
      free(ser);
    }
    cls_close(&c);
  }
  cr_assert_geq(adamw, 2, "a0kuma and wedsonlin train with AdamW");
}

/* ---- each alloc entry's category: found alone, or from the whole cache ---------------------- */

static void rows_eq(const ms_attr_rows_t *x, const ms_attr_rows_t *y, const char *name, size_t step) {
  cr_assert_eq(x->nrows, y->nrows, "%s: step %zu: rows", name, step);
  cr_assert_eq(x->total_bytes, y->total_bytes, "%s: step %zu", name, step);
  cr_assert_eq(x->total_blocks, y->total_blocks, "%s: step %zu", name, step);
  for (size_t k = 0; k < x->nrows; k++) {
    cr_assert_str_eq(x->rows[k].key, y->rows[k].key, "%s: step %zu row %zu", name, step, k);
    cr_assert_eq(x->rows[k].bytes, y->rows[k].bytes, "%s: step %zu row %zu", name, step, k);
    cr_assert_eq(x->rows[k].blocks, y->rows[k].blocks, "%s: step %zu row %zu", name, step, k);
    cr_assert_eq(x->rows[k].category, y->rows[k].category, "%s: step %zu row %zu", name, step, k);
    cr_assert_eq(x->rows[k].stack, y->rows[k].stack, "%s: step %zu row %zu", name, step, k);
  }
}

/* The classifier builds the cache of every alloc entry's category (attr_dev_t.ecat) when a walk
 * of the trace asks, after ATTR_DIRECT_MAX blocks asked one by one, or at creation where blocks
 * older than the trace read the gradient sizes; until then a block's category is found from its
 * alloc entry alone (what `compare` asks: the blocks alive at two moments). The answers found
 * alone are the cache's: every alloc entry, every block alive at five steps, the rows by
 * category, source and stack there, the category series; and the cache is built exactly when
 * said. */
static void check_lazy(const ms_snapshot_t *s, const char *name) {
  ms_errbuf_t eb = {{0}};
  ms_timeline_t *tl = NULL;
  ms_attr_t *lazy = NULL, *eager = NULL, *counted = NULL;
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s: %s", name, eb.msg);
  cr_assert_eq(ms_attr_create(s, tl, NULL, &lazy, &eb), MS_OK, "%s: %s", name, eb.msg);
  cr_assert_eq(ms_attr_create(s, tl, NULL, &eager, &eb), MS_OK, "%s: %s", name, eb.msg);
  cr_assert_eq(ms_attr_create(s, tl, NULL, &counted, &eb), MS_OK, "%s: %s", name, eb.msg);
  size_t ndev = ms_timeline_ndevices(tl);
  for (size_t d = 0; d < ndev; d++) {
    cr_assert_eq(atomic_load(&lazy->dev[d].ecat_ready), lazy->dev[d].has_old ? 1 : 0,
                 "%s: device %zu: the cache at creation", name, d);
    cr_assert(ms__attr_ecat_ready(eager, d), "%s: device %zu", name, d);
    cr_assert_eq(atomic_load(&eager->dev[d].ecat_ready), 1);
  }
  static const ms_attr_by by[3] = {MS_ATTR_BY_CATEGORY, MS_ATTR_BY_SOURCE, MS_ATTR_BY_STACK};
  for (size_t d = 0; d < ndev; d++) {
    size_t n = ms_timeline_nentries(tl, d);
    ms_tl_peak_t pk;
    cr_assert_eq(ms_timeline_peak(tl, d, MS_TL_ALLOCATED, 0, n, &pk), MS_OK);
    size_t steps[5] = {0, n / 3, 2 * n / 3, pk.step, n};
    for (int k = 0; k < 5; k++) {
      ms_tl_state_t st;
      ms_timeline_state_init(&st);
      cr_assert_eq(ms_timeline_state_at(tl, d, steps[k], &st), MS_OK);
      for (size_t b = 0; b < st.nblocks; b++)
        cr_assert_eq(ms_attr_block_category(lazy, d, &st.blocks[b]),
                     ms_attr_block_category(eager, d, &st.blocks[b]), "%s: device %zu step %zu "
                     "block %zu", name, d, steps[k], b);
      for (int w = 0; w < 3; w++) {
        ms_attr_rows_t x, y;
        cr_assert_eq(ms_attr_aggregate_state(lazy, &st, NULL, by[w], &x), MS_OK);
        cr_assert_eq(ms_attr_aggregate_state(eager, &st, NULL, by[w], &y), MS_OK);
        rows_eq(&x, &y, name, steps[k]);
        ms_attr_rows_free(&x);
        ms_attr_rows_free(&y);
      }
      ms_timeline_state_release(&st);
    }
    /* no walk asked and too few blocks asked one by one: still no cache */
    if (!lazy->dev[d].has_old && atomic_load(&lazy->ndirect) <= ATTR_DIRECT_MAX)
      cr_assert_eq(atomic_load(&lazy->dev[d].ecat_ready), 0, "%s: device %zu", name, d);
    for (size_t i = 0; i < n; i++)
      if (ms_timeline_entry(tl, d, i)->action == MS_TRACE_ALLOC)
        cr_assert_eq(ms__attr_entry_alone(lazy, d, i), ms_attr_entry_category(eager, d, i),
                     "%s: device %zu entry %zu", name, d, i);
  }
  /* blocks asked one by one (each alloc entry's, freed where the index pairs it): the first
   * ATTR_DIRECT_MAX found alone, then the cache is built; the same answers throughout */
  size_t asked = 0;
  for (size_t d = 0; d < ndev; d++) {
    const tl_dev_t *td = &tl->dev[d];
    for (size_t i = 0; i < td->n; i++) {
      if (td->trace[i].action != MS_TRACE_ALLOC) continue;
      int64_t fe = td->pair[i] == TL_NONE ? -1 : (int64_t)td->pair[i];
      cr_assert_eq(ms__attr_classify(counted, d, (int64_t)i, fe, td->trace[i].stack,
                                     td->trace[i].addr, false),
                   ms_attr_entry_category(eager, d, i), "%s: device %zu entry %zu", name, d, i);
      asked++;
      if (!counted->dev[d].has_old)
        cr_assert_eq(atomic_load(&counted->dev[d].ecat_ready), asked > ATTR_DIRECT_MAX ? 1 : 0,
                     "%s: device %zu after %zu asked", name, d, asked);
    }
  }
  /* a walk of the trace builds the cache: the series is the eager classifier's */
  for (size_t d = 0; d < ndev; d++) {
    uint64_t *x = NULL, *y = NULL;
    cr_assert_eq(ms_attr_category_series(lazy, d, &x), MS_OK);
    cr_assert_eq(ms_attr_category_series(eager, d, &y), MS_OK);
    size_t n = ms_timeline_nentries(tl, d);
    cr_assert_eq(memcmp(x, y, (n + 1) * MS_CAT_COUNT * sizeof *x), 0, "%s: device %zu", name, d);
    cr_assert_eq(atomic_load(&lazy->dev[d].ecat_ready), 1, "%s: device %zu", name, d);
    free(x);
    free(y);
  }
  ms_attr_destroy(counted);
  ms_attr_destroy(eager);
  ms_attr_destroy(lazy);
  ms_timeline_destroy(tl);
}

/* Every fixture, and BEFORE of a pair made from it as bench_compare makes its pair (the state of
 * device 0 1,000 entries before the end, the trace cut there). */
Test(attribution, entries_alone_equal_the_cache) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[0]);
  if (access(path, R_OK) != 0) {
    printf("SKIP: PyTorch fixtures not found in %s\n", th_fixture_dir());
    cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  }
  int old = 0, over = 0;
  for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[f]);
    ms_snapshot_t *s = NULL;
    ms_errbuf_t eb = {{0}};
    cr_assert_eq(ms_snapshot_load_ex(path, MS_LOAD_NO_FREE_STACKS, &s, &eb), MS_OK, "%s", eb.msg);
    check_lazy(s, fixtures[f]);
    ms_timeline_t *tl = NULL;
    cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
    ms_attr_t *a = NULL;
    cr_assert_eq(ms_attr_create(s, tl, NULL, &a, &eb), MS_OK, "%s", eb.msg);
    size_t nalloc = 0;
    for (size_t d = 0; d < a->ndev; d++) {
      old += a->dev[d].has_old;
      for (size_t i = 0; i < a->dev[d].n; i++)
        nalloc += ms_timeline_entry(tl, d, i)->action == MS_TRACE_ALLOC;
    }
    over += nalloc > ATTR_DIRECT_MAX;
    ms_attr_destroy(a);
    size_t n = ms_timeline_nentries(tl, 0);
    if (n > 0) {
      size_t cut = n > 2000 ? n - 1000 : n / 2;
      ms_snapshot_t *at = NULL;
      cr_assert_eq(ms_timeline_snapshot_at(tl, 0, cut, NULL, &at), MS_OK);
      at->devices[0].ntrace = (uint32_t)cut; /* the trace is the source's, cut there */
      for (size_t d = 1; d < at->ndevices; d++) at->devices[d].ntrace = 0;
      char name[300];
      snprintf(name, sizeof name, "%s, cut at %zu", fixtures[f], cut);
      check_lazy(at, name);
      ms_snapshot_free(at);
    }
    ms_timeline_destroy(tl);
    ms_snapshot_free(s);
  }
  /* the paths above were all taken */
  cr_assert_gt(old, 0, "a fixture with blocks older than its trace");
  cr_assert_gt(over, 0, "a fixture with more alloc entries than ATTR_DIRECT_MAX");
}

Test(attribution, entries_alone_equal_the_cache_built_step) {
  ms_snapshot_t *s = build_step();
  check_lazy(s, "built step");
  ms_snapshot_free(s);
  s = build_step_ex(true);
  check_lazy(s, "built step, free stacks");
  ms_snapshot_free(s);
}

/* ---- the command line ---------------------------------------------------------------------- */

typedef struct run_s {
  int status;
  char *out, *err;
} run_t;

static char *slurp(const char *path) {
  size_t len = 0;
  char *b = th_read_file(path, &len);
  char *t = b ? realloc(b, len + 1) : NULL;
  if (!t) {
    free(b);
    return NULL;
  }
  t[len] = 0;
  return t;
}

static run_t run_in(const char *dir, const char *const *args) {
  char outp[600], errp[600];
  snprintf(outp, sizeof outp, "%s/.stdout", dir);
  snprintf(errp, sizeof errp, "%s/.stderr", dir);
  const char *argv[32];
  int n = 0;
  const char *bin = getenv("MEMSNAP_BIN");
  argv[n++] = bin && *bin ? bin : MS_TEST_BINARY_DIR "/bin/memsnap";
  for (; args[n - 1] && n < 31; n++) argv[n] = args[n - 1];
  argv[n] = NULL;
  pid_t pid = fork();
  cr_assert_neq(pid, -1);
  if (pid == 0) {
    int out = open(outp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(errp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0 || chdir(dir) != 0) _exit(126);
    dup2(out, 1);
    dup2(err, 2);
    execv(argv[0], (char *const *)argv);
    _exit(127);
  }
  int st = 0;
  cr_assert_eq(waitpid(pid, &st, 0), pid);
  run_t r = {WIFEXITED(st) ? WEXITSTATUS(st) : 128, slurp(outp), slurp(errp)};
  cr_assert(r.out && r.err);
  return r;
}
#define RUN_IN(dir, ...) run_in(dir, (const char *const[]){__VA_ARGS__, NULL})

static void run_free(run_t *r) {
  free(r->out);
  free(r->err);
}

Test(attribution_cli, top_timeline_memory_by_category) {
  char *dir = th_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/step.pickle", dir);
  ms_snapshot_t *s = build_step();
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write_file(s, path, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  /* top --by category --json at the peak: every category, exact bytes */
  run_t r = RUN_IN(dir, "top", path, "--by", "category", "--json", "-n", "0");
  cr_assert_eq(r.status, 0, "%s", r.err);
  const char *rows[] = {
      "{\"key\": \"optimizer_state\", \"bytes\": 917504, \"blocks\": 6,",
      "{\"key\": \"gradient\", \"bytes\": 458752, \"blocks\": 3,",
      "{\"key\": \"parameter\", \"bytes\": 458752, \"blocks\": 3,",
      "{\"key\": \"temporary\", \"bytes\": 262144, \"blocks\": 1,",
      "{\"key\": \"input\", \"bytes\": 65536, \"blocks\": 1,",
      "{\"key\": \"activation\", \"bytes\": 512, \"blocks\": 1,",
      "{\"key\": \"autograd_detail\", \"bytes\": 0, \"blocks\": 0,",
      "{\"key\": \"unknown\", \"bytes\": 0, \"blocks\": 0,"};
  const char *at = r.out;
  for (size_t i = 0; i < sizeof rows / sizeof *rows; i++) {
    const char *p = strstr(at, rows[i]);
    cr_assert(p, "row %zu (in order) missing: %s", i, r.out);
    at = p + 1;
  }
  cr_assert(strstr(r.out, "\"by\": \"category\", \"total_bytes\": 2163200, \"total_count\": 15"),
            "%s", r.out);
  run_free(&r);
  /* the default is by source; one line, two operators */
  r = RUN_IN(dir, "top", path, "--at", "8");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "7.9%        1  activation       model.py:32 silu "
                          "\xe2\x86\x92 at::sigmoid\n"), "%s", r.out);
  cr_assert(strstr(r.out, "7.9%        1  temporary        model.py:32 silu "
                          "\xe2\x86\x92 at::mul_Tensor\n"), "%s", r.out);
  cr_assert(strstr(r.out, "64.0KiB    5.3%        1  parameter        <no frame>\n"), "%s", r.out);
  run_free(&r);
  /* a rules file: extended, and a bad one naming its line */
  char rules[700];
  snprintf(rules, sizeof rules, "%s/my.rules", dir);
  const char *mine = "# mine\nactivation frame=silu@*model.py\n";
  cr_assert_eq(th_write_file(rules, mine, strlen(mine)), 0);
  r = RUN_IN(dir, "top", path, "--at", "8", "--categories", rules);
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "activation       model.py:32 silu \xe2\x86\x92 at::mul_Tensor"),
            "%s", r.out);
  run_free(&r);
  const char *bad = "activation\nactivation phase=forwards\n";
  cr_assert_eq(th_write_file(rules, bad, strlen(bad)), 0);
  r = RUN_IN(dir, "top", path, "--categories", rules);
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "memsnap: error: "), "%s", r.err);
  cr_assert(strstr(r.err, "my.rules:2: unknown phase (none, forward, backward, optimizer, init): "
                          "'phase=forwards'"), "%s", r.err);
  run_free(&r);
  r = RUN_IN(dir, "top", path, "--by", "size", "--categories", rules);
  cr_assert_eq(r.status, 2);
  run_free(&r);
  /* timeline --by category: the mix at the peak and each category's own peak */
  r = RUN_IN(dir, "timeline", path, "--by", "category");
  cr_assert_eq(r.status, 0, "%s", r.err);
  cr_assert(strstr(r.out, "  by category (allocated bytes): at the peak of allocated (after entry "
                          "31), and each one's own peak:\n"), "%s", r.out);
  cr_assert(strstr(r.out, "    activation           512.0B   0.0%   peak   800.5KiB after entry "
                          "12\n"), "%s", r.out);
  cr_assert(strstr(r.out, "    unknown                0.0B   0.0%   never held\n"), "%s", r.out);
  run_free(&r);
  /* memory --by category: the first level is the category, widths sum to allocated */
  r = RUN_IN(dir, "memory", path, "--by", "category", "--folded", "--at", "peak");
  cr_assert_eq(r.status, 0, "%s", r.err);
  uint64_t total = 0, os = 0;
  for (char *line = r.out; line && *line;) {
    char *nl = strchr(line, '\n');
    cr_assert(nl);
    *nl = 0;
    char *sp = strrchr(line, ' ');
    cr_assert(sp);
    uint64_t v = strtoull(sp + 1, NULL, 10);
    total += v;
    if (strncmp(line, "optimizer_state;", 16) == 0) os += v;
    line = nl + 1;
  }
  cr_assert_eq(total, 2163200);
  cr_assert_eq(os, 917504);
  run_free(&r);
  th_rmdir(dir);
  free(dir);
}

/* ---- exports: SQL answers top; pprof labels; slices named by source ------------------------ */

#include <sqlite3.h>

/* Rows of `top --by KEY` at step through SQL on the allocations table: "key bytes blocks\n"... */
static char *sql_top(sqlite3 *db, const char *key, size_t dev, size_t step) {
  char q[800];
  snprintf(q, sizeof q,
           "SELECT %s, sum(size) AS bytes, count(*) AS blocks FROM allocations "
           "WHERE file_id = 0 AND device = %zu AND alloc_entry <= %lld "
           "AND coalesce(free_requested_entry, free_entry, 1 << 62) > %lld "
           "GROUP BY 1 ORDER BY bytes DESC, blocks DESC, 1",
           key, dev, (long long)step - 1, (long long)step - 1);
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, q, -1, &st, NULL), SQLITE_OK, "%s", sqlite3_errmsg(db));
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  out[0] = 0;
  while (sqlite3_step(st) == SQLITE_ROW) {
    if (n + 2048 > cap) out = realloc(out, cap *= 2);
    n += (size_t)snprintf(out + n, cap - n, "%s %lld %lld\n", sqlite3_column_text(st, 0),
                          (long long)sqlite3_column_int64(st, 1),
                          (long long)sqlite3_column_int64(st, 2));
  }
  sqlite3_finalize(st);
  return out;
}

/* The same rows from ms_attr_aggregate (zero rows left out, as SQL has none). */
static char *lib_top(const cls_t *c, ms_attr_by by, size_t dev, size_t step) {
  ms_attr_rows_t r;
  cr_assert_eq(ms_attr_aggregate(c->a, dev, step, NULL, by, &r), MS_OK);
  size_t cap = 1 << 16, n = 0;
  char *out = malloc(cap);
  out[0] = 0;
  for (size_t i = 0; i < r.nrows; i++) {
    if (r.rows[i].blocks == 0) continue;
    if (n + strlen(r.rows[i].key) + 64 > cap) out = realloc(out, cap *= 2);
    n += (size_t)snprintf(out + n, cap - n, "%s %llu %llu\n", r.rows[i].key,
                          (unsigned long long)r.rows[i].bytes,
                          (unsigned long long)r.rows[i].blocks);
  }
  ms_attr_rows_free(&r);
  return out;
}

static void check_sql(const char *dir, const char *file) {
  char db_path[700];
  snprintf(db_path, sizeof db_path, "%s/x.db", dir);
  unlink(db_path);
  run_t r = RUN_IN(dir, "export", file, "--sqlite", db_path);
  cr_assert_eq(r.status, 0, "%s: %s", file, r.err);
  run_free(&r);
  sqlite3 *db = NULL;
  cr_assert_eq(sqlite3_open_v2(db_path, &db, SQLITE_OPEN_READONLY, NULL), SQLITE_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_snapshot_load_ex(file, MS_LOAD_NO_FREE_STACKS, &s, &eb), MS_OK);
  cls_t c = cls_open(s, NULL);
  for (size_t d = 0; d < ms_timeline_ndevices(c.tl); d++) {
    size_t n = ms_timeline_nentries(c.tl, d);
    ms_tl_peak_t pk;
    cr_assert_eq(ms_timeline_peak(c.tl, d, MS_TL_ALLOCATED, 0, n, &pk), MS_OK);
    size_t steps[3] = {pk.step, n, n / 2};
    for (int k = 0; k < 3; k++) {
      for (int by = 0; by < 2; by++) {
        char *a = sql_top(db, by ? "source" : "category", d, steps[k]);
        char *b = lib_top(&c, by ? MS_ATTR_BY_SOURCE : MS_ATTR_BY_CATEGORY, d, steps[k]);
        cr_assert_str_eq(a, b, "%s device %zu step %zu:\n%s---\n%s", file, d, steps[k], a, b);
        free(a);
        free(b);
      }
    }
  }
  /* the end state's blocks carry the same categories */
  sqlite3_stmt *st = NULL;
  cr_assert_eq(sqlite3_prepare_v2(db, "SELECT count(*) FROM blocks WHERE state = "
                                      "'active_allocated' AND category IS NULL", -1, &st, NULL),
               SQLITE_OK);
  cr_assert_eq(sqlite3_step(st), SQLITE_ROW);
  cr_assert_eq(sqlite3_column_int64(st, 0), 0, "%s: allocated blocks without category", file);
  sqlite3_finalize(st);
  /* the range query uses the index */
  cr_assert_eq(sqlite3_prepare_v2(db, "EXPLAIN QUERY PLAN SELECT sum(size) FROM allocations "
                                      "WHERE file_id = 0 AND device = 0 AND alloc_entry <= 5 AND "
                                      "coalesce(free_entry, 1 << 62) > 5", -1, &st, NULL),
               SQLITE_OK);
  bool indexed = false;
  while (sqlite3_step(st) == SQLITE_ROW)
    indexed |= strstr((const char *)sqlite3_column_text(st, 3), "allocations_alive") != NULL;
  sqlite3_finalize(st);
  cr_assert(indexed, "alive-at queries use the allocations_alive index");
  cls_close(&c);
  sqlite3_close(db);
}

Test(attribution_cli, sqlite_reproduces_top) {
  char *dir = th_tmpdir();
  char path[600];
  snprintf(path, sizeof path, "%s/step.pickle", dir);
  ms_snapshot_t *s = build_step();
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write_file(s, path, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  check_sql(dir, path);
  for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[f]);
    if (access(path, R_OK) != 0) {
      printf("SKIP: PyTorch fixtures not found in %s\n", th_fixture_dir());
      break;
    }
    check_sql(dir, path);
  }
  th_rmdir(dir);
  free(dir);
}

Test(attribution_cli, pprof_labels_and_perfetto_names) {
  char *dir = th_tmpdir();
  char path[600], out[700], cmd[2000];
  snprintf(path, sizeof path, "%s/step.pickle", dir);
  ms_snapshot_t *s = build_step();
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms_pickle_write_file(s, path, &eb), MS_OK, "%s", eb.msg);
  ms_snapshot_free(s);
  /* Chrome trace: each allocation slice is named by its source, with its category */
  snprintf(out, sizeof out, "%s/t.json", dir);
  run_t r = RUN_IN(dir, "export", path, "--perfetto", out, "--allocations");
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  char *t = slurp(out);
  cr_assert(strstr(t, "{\"name\": \"model.py:32 silu \xe2\x86\x92 at::sigmoid\", \"cat\": "
                      "\"allocation\", \"ph\": \"b\""), "%.2000s", t);
  cr_assert(strstr(t, "\"category\": \"optimizer_state\", \"source\": \"train.py:30 <module> "
                      "\xe2\x86\x92 at::zeros_like\"}"),
            "%.3000s", t);
  cr_assert_null(strstr(t, "unwind::unwind"));
  free(t);
  /* a rules file for the exports: its error names its line */
  snprintf(cmd, sizeof cmd, "%s/bad.rules", dir);
  const char *badr = "# ok\n\nparameter stack=maybe\n";
  cr_assert_eq(th_write_file(cmd, badr, strlen(badr)), 0);
  r = RUN_IN(dir, "export", path, "--perfetto", out, "--allocations", "--categories", cmd);
  cr_assert_eq(r.status, 1);
  cr_assert(strstr(r.err, "bad.rules:3: stack= takes none or some, not 'stack=maybe'"), "%s", r.err);
  run_free(&r);
  r = RUN_IN(dir, "export", path, "--sqlite", "x.db", "--categories", cmd);
  cr_assert_eq(r.status, 2);
  run_free(&r);
  /* pprof: category and source labels, when go is there to read them */
  snprintf(out, sizeof out, "%s/p.pb.gz", dir);
  r = RUN_IN(dir, "export", path, "--pprof", out);
  cr_assert_eq(r.status, 0, "%s", r.err);
  run_free(&r);
  if (system("go version >/dev/null 2>&1") != 0) {
    printf("SKIP: pprof labels read back: no go\n");
  } else {
    snprintf(cmd, sizeof cmd, "go tool pprof -tags '%s' 2>/dev/null > '%s/tags.txt'", out, dir);
    cr_assert_eq(system(cmd), 0);
    snprintf(cmd, sizeof cmd, "%s/tags.txt", dir);
    t = slurp(cmd);
    cr_assert(t && strstr(t, " category: Total "), "%s", t);
    cr_assert(strstr(t, "(42.41%): optimizer_state"), "%s", t); /* 917504 of 2163200 */
    cr_assert(strstr(t, " source: Total "), "%s", t);
    cr_assert(strstr(t, "): MmBackward0 \xe2\x86\x92 at::mm"), "%s", t);
    free(t);
  }
  th_rmdir(dir);
  free(dir);
}

/* A snapshot without a trace whose live blocks' stacks are one frame each, of the given
 * (function, file) pairs: frames share their function's and their file's stored strings. */
static ms_snapshot_t *build_frames_only(const fr_t *f, const uint64_t *size, size_t n) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = SEG_BASE;
  g.stack = MS_SNAP_NO_STACK;
  g.is_large = true;
  g.first_block = 0;
  uint64_t at = SEG_BASE;
  for (size_t i = 0; i < n; i++) {
    add_block(&b, at, size[i], true, build_frames(&b, &f[i], 1));
    at += size[i];
    g.allocated_size += size[i];
  }
  g.total_size = at - SEG_BASE;
  g.active_size = g.requested_size = g.allocated_size;
  g.nblocks = (uint32_t)n;
  g.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_POOL_ID | MS_SEG_HAS_EXPANDABLE;
  cr_assert_eq(ms__snapbuild_add_segment(&b, &g), MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  cr_assert_eq(ms__snapbuild_add_device(&b, &d), MS_OK);
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  cr_assert_eq(ms__snapbuild_finish(&b, &s, &eb), MS_OK, "%s", eb.msg);
  return s;
}

Test(attribution, shared_function_and_file_strings) {
  /* patterns are matched once per function and per file string: a frame= rule still needs
   * both of one frame's own sides, whichever frames met the strings first */
  static const fr_t f[] = {
      {"forward", "/x/model.py", 10}, /* frame=forward@*model.py */
      {"forward", "/x/other.py", 11}, /* same function, another file: file=*other.py */
      {"helper", "/x/model.py", 12},  /* same file, another function: func=helper */
      {"forward", "/x/model.py", 13}, /* the first frame's strings, another line */
      {"helper2", "/x/lib.py", 14},   /* nothing */
      {"helper", "/x/other.py", 15},  /* func=helper comes before file=*other.py */
  };
  static const uint64_t size[] = {512, 1024, 2048, 4096, 8192, 16384};
  const char *rules = "defaults none\n"
                      "activation frame=forward@*model.py\n"
                      "parameter func=helper\n"
                      "input file=*other.py\n";
  cls_t c = cls_open(build_frames_only(f, size, 6), rules);
  uint64_t got[MS_CAT_COUNT];
  bytes_at(&c, 0, 0, got);
  cr_assert_eq(got[MS_CAT_ACTIVATION], 512 + 4096);
  cr_assert_eq(got[MS_CAT_PARAMETER], 2048 + 16384);
  cr_assert_eq(got[MS_CAT_INPUT], 1024);
  cr_assert_eq(got[MS_CAT_UNKNOWN], 8192);
  cls_close(&c);
}

/* ---- sources found in the stacks' walk (compare's classifier, ms__attr_create_ex) ------------ */

/* The classifier that finds sources while it reads the stacks is the one that finds them on first
 * use: the same pattern sets, sources, op frames, multi-op lines and source texts, for every
 * stack (rules: NULL or a text of the user's). @return the stacks shown with their op. */
static size_t check_sourced_rules(const ms_snapshot_t *s, const char *name, const char *rules,
                                  size_t want_pw) {
  ms_errbuf_t eb = {{0}};
  ms_timeline_t *tl = NULL;
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s: %s", name, eb.msg);
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  if (rules) {
    cfg.rules = rules;
    cfg.rules_len = strlen(rules);
  }
  ms_attr_t *lazy = NULL, *eager = NULL;
  cr_assert_eq(ms_attr_create(s, tl, &cfg, &lazy, &eb), MS_OK, "%s: %s", name, eb.msg);
  cr_assert_eq(ms__attr_create_ex(s, tl, &cfg, true, &eager, &eb), MS_OK, "%s: %s", name, eb.msg);
  cr_assert_eq(lazy->src_state, 0, "%s: sources on first use", name);
  cr_assert_eq(eager->src_state, 1, "%s: sources with the stacks", name);
  cr_assert_eq(ms__attr_sources_ready(lazy), MS_OK);
  cr_assert_eq(lazy->pw, eager->pw);
  cr_assert_eq(eager->pw, want_pw, "%s: words of a pattern set", name);
  cr_assert_eq(lazy->nsets, eager->nsets, "%s", name);
  cr_assert_eq(memcmp(lazy->set_pat, eager->set_pat, lazy->nsets * lazy->pw * sizeof(uint64_t)), 0);
  cr_assert_eq(memcmp(lazy->set_phase, eager->set_phase, lazy->nsets), 0);
  size_t shown = 0;
  for (size_t st = 0; st < s->nstacks; st++) {
    cr_assert_eq(lazy->sset[st], eager->sset[st], "%s: stack %zu", name, st);
    if (eager->sset[st] < eager->nsets) { /* its set: the union of its frames' sets, word by word */
      uint64_t want[ATTR_PW] = {0};
      for (uint32_t j = 0; j < s->stacks[st].nframes; j++) {
        uint32_t f = ms_snap_frame_index(s, s->stacks[st].first + j);
        for (size_t w = 0; w < eager->pw; w++) want[w] |= eager->fpat[(size_t)f * eager->pw + w];
      }
      cr_assert_eq(memcmp(want, &eager->set_pat[(size_t)eager->sset[st] * eager->pw],
                          eager->pw * sizeof *want),
                   0, "%s: stack %zu's pattern set", name, st);
    }
    cr_assert_eq(lazy->ssrc[st], eager->ssrc[st], "%s: stack %zu", name, st);
    cr_assert_eq(lazy->sop[st], eager->sop[st], "%s: stack %zu", name, st);
    shown += eager->sop[st] != ATTR_NONE;
    char x[1024], y[1024];
    ms_attr_source(lazy, (uint32_t)st, x, sizeof x);
    ms_attr_source(eager, (uint32_t)st, y, sizeof y);
    cr_assert_str_eq(x, y, "%s: stack %zu", name, st);
  }
  if (s->nframes) cr_assert_eq(memcmp(lazy->smulti, eager->smulti, s->nframes), 0, "%s", name);
  uint32_t special[2] = {MS_SNAP_NO_STACK, ATTR_STACK_UNRECORDED};
  for (int k = 0; k < 2; k++) {
    char x[256], y[256];
    ms_attr_source(lazy, special[k], x, sizeof x);
    ms_attr_source(eager, special[k], y, sizeof y);
    cr_assert_str_eq(x, y);
  }
  ms_attr_destroy(eager);
  ms_attr_destroy(lazy);
  ms_timeline_destroy(tl);
  return shown;
}

/* With the default rules (pattern sets of 2 words), with 140 more patterns (3 words: the walk's
 * general path), and with a few rules of one's own (1 word). */
static size_t check_sourced(const ms_snapshot_t *s, const char *name) {
  static char many[140 * 40];
  size_t n = 0;
  for (int i = 0; i < 140; i++)
    n += (size_t)snprintf(many + n, sizeof many - n, "temporary func=zz_never_%d_*\n", i);
  size_t shown = check_sourced_rules(s, name, NULL, 2);
  cr_assert_eq(check_sourced_rules(s, name, many, 4), shown, "%s", name);
  check_sourced_rules(s, name,
                      "defaults none\nactivation func=*forward*\nparameter file=*.py\n"
                      "input func=*malloc*\ntemporary file=*c10*\n",
                      1);
  return shown;
}

Test(attribution, sources_with_the_stacks_equal_sources_on_first_use) {
  ms_snapshot_t *s = build_step_ex(true);
  cr_assert_gt(check_sourced(s, "built step"), 0, "a source shown with its op");
  ms_snapshot_free(s);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[0]);
  if (access(path, R_OK) != 0) {
    printf("SKIP: PyTorch fixtures not found in %s\n", th_fixture_dir());
    cr_skip_test("SKIP: PyTorch fixtures not found in %s", th_fixture_dir());
  }
  size_t shown = 0;
  for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++) {
    snprintf(path, sizeof path, "%s/%s.pickle", th_fixture_dir(), fixtures[f]);
    ms_errbuf_t eb = {{0}};
    for (int full = 0; full < 2; full++) { /* frees' stacks left out, and read */
      s = NULL;
      cr_assert_eq(ms_snapshot_load_ex(path, full ? 0 : MS_LOAD_NO_FREE_STACKS, &s, &eb), MS_OK,
                   "%s", eb.msg);
      shown += check_sourced(s, fixtures[f]);
      ms_snapshot_free(s);
    }
  }
  cr_assert_gt(shown, 0, "a fixture's source shown with its op");
}

/* ---- annotation ranges and the phase spans --------------------------------------------------- */

/* The spans of device 0 of s, classified with rules (NULL: the defaults) into out (n spans). */
static size_t spans_of(ms_snapshot_t *s, const char *rules, attr_span_t *out, size_t cap) {
  ms_errbuf_t eb = {{0}};
  ms_timeline_t *tl = NULL;
  cr_assert_eq(ms_timeline_create(s, NULL, &tl, &eb), MS_OK, "%s", eb.msg);
  ms_attr_config_t cfg;
  ms_attr_config_init(&cfg);
  if (rules) {
    cfg.rules = rules;
    cfg.rules_len = strlen(rules);
  }
  ms_attr_t *a = NULL;
  cr_assert_eq(ms_attr_create(s, tl, &cfg, &a, &eb), MS_OK, "%s", eb.msg);
  size_t n = a->dev[0].nspans;
  cr_assert_leq(n, cap);
  memcpy(out, a->dev[0].spans, n * sizeof *out);
  ms_attr_destroy(a);
  ms_timeline_destroy(tl);
  return n;
}

static bool spans_eq(const attr_span_t *x, size_t nx, const attr_span_t *y, size_t ny) {
  if (nx != ny) return false;
  for (size_t i = 0; i < nx; i++)
    if (x[i].first != y[i].first || x[i].phase != y[i].phase) return false;
  return true;
}

/* An annotation range forces the phase of its entries only where a phase rule names it and it is
 * on the device: on another device, or not named, the spans are those of no annotations at all. */
Test(attribution, annotation_ranges_force_phases_on_their_device_only) {
  ms_snapshot_t *s = build_step();
  cr_assert_gt(s->nannotations, 0);
  static const char *const rules[] = {
      NULL, "defaults none\nphase init func=*_apply*\nphase forward annotation=Optimizer.step#*\n"};
  for (int r = 0; r < 2; r++) {
    attr_span_t with[64], other[64], none[64];
    size_t nw = spans_of(s, rules[r], with, 64);
    for (size_t k = 0; k < s->nannotations; k++) s->annotations[k].device = 7;
    size_t no = spans_of(s, rules[r], other, 64);
    size_t nann = s->nannotations;
    s->nannotations = 0;
    size_t nn = spans_of(s, rules[r], none, 64);
    s->nannotations = nann;
    for (size_t k = 0; k < s->nannotations; k++) s->annotations[k].device = 0;
    cr_assert(spans_eq(other, no, none, nn), "rules %d: another device's range forces nothing", r);
    if (r == 1) /* the range's entries are forward, which no stack says here */
      cr_assert_not(spans_eq(with, nw, none, nn), "rules %d: the device's range forces", r);
  }
  attr_span_t x[64], y[64];
  size_t nx = spans_of(s, "defaults none\nphase init func=*_apply*\n", x, 64);
  size_t ny = spans_of(s, "defaults none\nphase init func=*_apply*\nphase forward annotation=zz*\n",
                       y, 64);
  cr_assert(spans_eq(x, nx, y, ny), "a range no rule names forces nothing");
  ms_snapshot_free(s);
}
