/* SPDX-License-Identifier: MIT
 * libFuzzer target for the rules text of the classifier (memsnap/attribution.h, issue #27): the
 * input is a `--categories` file. On a small training-shaped snapshot built once (frames of
 * forward, backward and the optimizer; allocations and frees; an annotation range), for every
 * input:
 *  - ms_attr_create returns MS_OK, or MS_EINVAL / MS_ELIMIT with a message that names the line
 *    ("rules:N: ...") or the size, and no classifier;
 *  - an accepted text (tried before the defaults, and with `replace`) gives every allocated block
 *    exactly one category at every step: the rows by category sum to allocated, and the series
 *    agrees; sources and the rows by source and stack are computed (NUL-terminated, no crash).
 * Matching is glob only, linear in the pattern times the text, so no input makes it slow.
 *
 * Built and run by scripts/fuzz.sh (make fuzz); seeds in tests/fuzz/corpus/fuzz_rules/.
 * fuzz-flags: -max_len=4096
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz_util.h"
#include "memsnap/attribution.h"
#include "memsnap/timeline.h"
#include "model/snapbuild.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* An invariant, named by its text in the report. */
#define FZ_OK(cond) FZ_CHECK(cond, "%s", #cond)

static ms_snapshot_t *fz_snap;
static ms_timeline_t *fz_tl;

static uint32_t fz_stack(ms__snapbuild_t *b, const char *const (*fr)[2], size_t n) {
  uint32_t idx[8], st;
  for (size_t i = 0; i < n; i++)
    FZ_OK(ms__snapbuild_frame(b, fr[i][0], strlen(fr[i][0]), fr[i][1], strlen(fr[i][1]),
                                 (int64_t)(10 + i), &idx[i]) == MS_OK);
  FZ_OK(ms__snapbuild_stack(b, idx, n, &st) == MS_OK);
  return st;
}

static void fz_trace(ms__snapbuild_t *b, int action, uint64_t addr, uint64_t size, uint32_t stack,
                     int64_t t) {
  ms_snap_trace_t e;
  memset(&e, 0, sizeof e);
  e.action = (uint8_t)action;
  e.addr = addr;
  e.size = size;
  e.stack = stack;
  e.time_us = t;
  e.present = MS_TRACE_HAS_TIME | (stack != MS_SNAP_NO_STACK ? MS_TRACE_HAS_FRAMES : 0);
  FZ_OK(ms__snapbuild_add_trace(b, &e) == MS_OK);
}

/* One segment of 1 MiB; a parameter alive throughout (no frames), then forward, backward and
 * optimizer allocations, some freed; the optimizer's inside an annotation range. */
static void fz_build(void) {
  static const char *const fwd[][2] = {{"at::_ops::mm::call(x)", "??"},
                                       {"forward", "/u/model.py"},
                                       {"_call_impl", "/v/torch/nn/modules/module.py"}};
  static const char *const bwd[][2] = {{"at::_ops::mm::call(x)", "??"},
                                       {"torch::autograd::generated::MmBackward0::apply(x)", "??"},
                                       {"torch::autograd::Engine::evaluate_function(x)", "??"}};
  static const char *const opt[][2] = {{"at::_ops::zeros_like::call(x)", "??"},
                                       {"_init_group", "/v/torch/optim/adamw.py"},
                                       {"<module>", "/u/train.py"}};
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_ANNOTATIONS;
  uint32_t sf = fz_stack(&b, fwd, 3), sb = fz_stack(&b, bwd, 3), so = fz_stack(&b, opt, 3), se;
  FZ_OK(ms__snapbuild_stack(&b, NULL, 0, &se) == MS_OK);
  const uint64_t base = 0x7f0000000000ull, K = 4096;
  /* entries: alloc A (fwd) B (fwd) ; free B ; alloc G (bwd) ; free A ; alloc S (opt) T (opt);
   * free T */
  int64_t t = 100;
  fz_trace(&b, MS_TRACE_ALLOC, base + 1 * K, K, sf, t++);
  fz_trace(&b, MS_TRACE_ALLOC, base + 2 * K, K, sf, t++);
  fz_trace(&b, MS_TRACE_FREE_REQUESTED, base + 2 * K, K, MS_SNAP_NO_STACK, t++);
  fz_trace(&b, MS_TRACE_FREE_COMPLETED, base + 2 * K, K, MS_SNAP_NO_STACK, t++);
  fz_trace(&b, MS_TRACE_ALLOC, base + 3 * K, K, sb, t++);
  fz_trace(&b, MS_TRACE_FREE_REQUESTED, base + 1 * K, K, MS_SNAP_NO_STACK, t++);
  fz_trace(&b, MS_TRACE_FREE_COMPLETED, base + 1 * K, K, MS_SNAP_NO_STACK, t++);
  ms_snap_annotation_t an = {"Optimizer.step#AdamW.step", "START", 0, t};
  FZ_OK(MS_VEC_PUSH(&b.annotations, an) == 0);
  fz_trace(&b, MS_TRACE_ALLOC, base + 4 * K, K, so, t++);
  fz_trace(&b, MS_TRACE_ALLOC, base + 5 * K, K, so, t++);
  fz_trace(&b, MS_TRACE_FREE_REQUESTED, base + 5 * K, K, MS_SNAP_NO_STACK, t++);
  fz_trace(&b, MS_TRACE_FREE_COMPLETED, base + 5 * K, K, MS_SNAP_NO_STACK, t++);
  ms_snap_annotation_t en = {"Optimizer.step#AdamW.step", "END", 0, t};
  FZ_OK(MS_VEC_PUSH(&b.annotations, en) == 0);
  /* the end state: P (no frames), G, S */
  ms_snap_segment_t g;
  memset(&g, 0, sizeof g);
  g.address = base;
  g.total_size = 1 << 20;
  g.stack = MS_SNAP_NO_STACK;
  g.is_large = true;
  const struct { uint64_t at, size; uint32_t stack; bool live; } bl[] = {
      {base, K, se, true},          {base + K, 2 * K, MS_SNAP_NO_STACK, false},
      {base + 3 * K, K, sb, true},  {base + 4 * K, K, so, true},
      {base + 5 * K, (1 << 20) - 5 * K, MS_SNAP_NO_STACK, false}};
  for (size_t i = 0; i < sizeof bl / sizeof *bl; i++) {
    ms_snap_block_t k;
    memset(&k, 0, sizeof k);
    k.address = bl[i].at;
    k.size = bl[i].size;
    k.requested_size = bl[i].live ? bl[i].size : 0;
    k.state = bl[i].live ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
    k.state_name = bl[i].live ? "active_allocated" : "inactive";
    k.stack = bl[i].stack;
    k.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
    FZ_OK(ms__snapbuild_add_block(&b, &k) == MS_OK);
    if (bl[i].live) g.allocated_size += bl[i].size;
  }
  g.active_size = g.requested_size = g.allocated_size;
  g.nblocks = (uint32_t)(sizeof bl / sizeof *bl);
  FZ_OK(ms__snapbuild_add_segment(&b, &g) == MS_OK);
  ms_snap_device_t d;
  memset(&d, 0, sizeof d);
  d.ntrace = (uint32_t)b.trace.len;
  FZ_OK(ms__snapbuild_add_device(&b, &d) == MS_OK);
  ms_errbuf_t eb = {{0}};
  FZ_OK(ms__snapbuild_finish(&b, &fz_snap, &eb) == MS_OK);
  FZ_OK(ms_timeline_create(fz_snap, NULL, &fz_tl, &eb) == MS_OK);
}

static void fz_check(const ms_attr_t *a) {
  size_t n = ms_timeline_nentries(fz_tl, 0);
  const uint64_t *alloc = ms_timeline_series(fz_tl, 0, MS_TL_ALLOCATED);
  uint64_t *ser = NULL;
  FZ_OK(ms_attr_category_series(a, 0, &ser) == MS_OK);
  for (size_t s = 0; s <= n; s++) {
    uint64_t sum = 0;
    for (int c = 0; c < MS_CAT_COUNT; c++) sum += ser[s * MS_CAT_COUNT + c];
    FZ_OK(sum == alloc[s]);
    for (int by = 0; by < 3; by++) {
      ms_attr_rows_t r;
      FZ_OK(ms_attr_aggregate(a, 0, s, NULL, (ms_attr_by)by, &r) == MS_OK);
      FZ_OK(r.total_bytes == alloc[s]);
      if (by == MS_ATTR_BY_CATEGORY) {
        FZ_OK(r.nrows == MS_CAT_COUNT);
        for (size_t i = 0; i < r.nrows; i++) {
          ms_category c = ms_category_parse(r.rows[i].key);
          FZ_OK(c < MS_CAT_COUNT && r.rows[i].bytes == ser[s * MS_CAT_COUNT + c]);
        }
      }
      for (size_t i = 0; i < r.nrows; i++) FZ_OK(strlen(r.rows[i].key) < 1u << 20);
      ms_attr_rows_free(&r);
    }
  }
  free(ser);
  char buf[256];
  for (uint32_t st = 0; st < fz_snap->nstacks; st++) {
    size_t len = ms_attr_source(a, st, buf, sizeof buf);
    FZ_OK(strlen(buf) == (len < sizeof buf ? len : sizeof buf - 1));
  }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!fz_snap) fz_build();
  for (int replace = 0; replace < 2; replace++) {
    ms_attr_config_t cfg;
    ms_attr_config_init(&cfg);
    cfg.rules = (const char *)data;
    cfg.rules_len = size;
    cfg.replace = replace != 0;
    ms_attr_t *a = NULL;
    ms_errbuf_t eb = {{0}};
    int rc = ms_attr_create(fz_snap, fz_tl, &cfg, &a, &eb);
    if (rc != MS_OK) {
      FZ_OK(a == NULL);
      FZ_OK(rc == MS_EINVAL || rc == MS_ELIMIT || rc == MS_ENOMEM);
      FZ_OK(rc == MS_ENOMEM || strncmp(eb.msg, "rules", 5) == 0);
      return 0; /* the same text fails the same with replace */
    }
    fz_check(a);
    ms_attr_destroy(a);
  }
  return 0;
}
