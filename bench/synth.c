/* SPDX-License-Identifier: MIT
 * Synthetic snapshots for the benchmarks and gen_snapshot (see synth.h).
 */
#include "synth.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memsnap/allocator.h"
#include "memsnap/backend.h"
#include "memsnap/history.h"
#include "memsnap/pickle.h"
#include "model/snapbuild.h"
#include "bench_util.h"

static int fail(ms_errbuf_t *eb, int rc, const char *fmt, ...) {
  if (eb) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(eb->msg, sizeof eb->msg, fmt, ap);
    va_end(ap);
  }
  return rc;
}

#define TRY(expr, what)                                                                            \
  do {                                                                                             \
    int rc_ = (expr);                                                                              \
    if (rc_ != MS_OK) {                                                                            \
      ms__snapbuild_release(&b);                                                                   \
      return fail(eb, rc_, "%s: %s", what, ms_strerror(rc_));                                      \
    }                                                                                              \
  } while (0)

typedef struct rng_s {
  uint64_t s;
} rng_t;

static uint64_t rng_next(rng_t *r) { /* xorshift64* */
  r->s ^= r->s >> 12;
  r->s ^= r->s << 25;
  r->s ^= r->s >> 27;
  return r->s * 0x2545f4914f6cdd1dull;
}

static uint32_t rng_below(rng_t *r, uint32_t n) {
  return (uint32_t)((rng_next(r) >> 32) % n);
}

/* ---- the viewer's worst shape (issue #35 item 1) -------------------------------------------- */

int synth_stacked(size_t nlong, size_t nrounds, uint64_t seed, ms_snapshot_t **out,
                  ms_errbuf_t *eb) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_TORCH_DICT;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES;
  size_t nslots = nlong + 1; /* never more alive at once */
  const uint64_t base = 0x7f0000000000ull, B = 512;
  uint64_t segsize = (nslots * B + (2u << 20) - 1) / (2u << 20) * (2u << 20);
  uint32_t *live = malloc(nslots * sizeof *live), *freeslot = malloc(nslots * sizeof *freeslot);
  uint8_t *used = calloc(nslots, 1);
  if (!live || !freeslot || !used) {
    free(live), free(freeslot), free(used);
    return fail(eb, MS_ENOMEM, "out of memory");
  }
  uint32_t frame, stack;
  size_t nlive = 0, nfree = 0;
  rng_t r = {seed * 2 + 0x9e3779b97f4a7c15ull};
  int64_t t = 1700000000000000ll;
  int rc = ms__snapbuild_frame(&b, "forward", 7, "model.py", 8, 42, &frame);
  if (rc == MS_OK) rc = ms__snapbuild_stack(&b, &frame, 1, &stack);
  for (size_t i = nslots; i-- > 0;) freeslot[nfree++] = (uint32_t)i;
  for (size_t k = 0; rc == MS_OK && k < nlong + 2 * nrounds; k++) {
    ms_snap_trace_t e = {0};
    e.stack = stack;
    e.size = B;
    e.time_us = t++;
    e.present = MS_TRACE_HAS_FRAMES | MS_TRACE_HAS_TIME;
    if (k < nlong || (k - nlong) % 2 == 0) { /* allocate one */
      uint32_t slot = freeslot[--nfree];
      used[slot] = 1;
      live[nlive++] = slot;
      e.action = MS_TRACE_ALLOC;
      e.addr = base + slot * B;
      rc = ms__snapbuild_add_trace(&b, &e);
      continue;
    }
    size_t at = rng_below(&r, (uint32_t)nlive); /* free a random one */
    uint32_t slot = live[at];
    live[at] = live[--nlive];
    used[slot] = 0;
    freeslot[nfree++] = slot;
    e.addr = base + slot * B;
    e.action = MS_TRACE_FREE_REQUESTED;
    rc = ms__snapbuild_add_trace(&b, &e);
    e.action = MS_TRACE_FREE_COMPLETED;
    if (rc == MS_OK) rc = ms__snapbuild_add_trace(&b, &e);
  }
  ms_snap_device_t dev = {0};
  dev.ntrace = (uint32_t)b.trace.len;
  if (rc == MS_OK) rc = ms__snapbuild_add_device(&b, &dev);
  ms_snap_segment_t seg = {0};
  seg.address = base;
  seg.total_size = segsize;
  seg.stack = MS_SNAP_NO_STACK;
  seg.first_block = (uint32_t)b.blocks.len;
  seg.is_large = true;
  seg.present = MS_SEG_HAS_FRAMES | MS_SEG_HAS_SEGMENT_TYPE;
  for (size_t i = 0; rc == MS_OK && i < nslots;) { /* live blocks, and the free runs between */
    ms_snap_block_t bl = {0};
    bl.address = base + i * B;
    bl.present = MS_BLOCK_HAS_ADDRESS | MS_BLOCK_HAS_REQUESTED_SIZE | MS_BLOCK_HAS_FRAMES;
    size_t j = i + 1;
    if (used[i]) {
      bl.size = bl.requested_size = B;
      bl.state = MS_BLOCK_ACTIVE_ALLOCATED;
      bl.stack = stack;
      seg.allocated_size += B, seg.active_size += B, seg.requested_size += B;
    } else {
      while (j < nslots && !used[j]) j++;
      bl.size = (j == nslots ? segsize : j * B) - i * B;
      bl.state = MS_BLOCK_INACTIVE;
      bl.stack = MS_SNAP_NO_STACK;
    }
    bl.state_name = ms_block_state_name(bl.state);
    rc = ms__snapbuild_add_block(&b, &bl);
    i = j;
  }
  if (rc == MS_OK && used[nslots - 1]) { /* the segment's room past the last slot */
    ms_snap_block_t bl = {0};
    bl.address = base + nslots * B;
    bl.size = segsize - nslots * B;
    bl.present = MS_BLOCK_HAS_ADDRESS;
    bl.state = MS_BLOCK_INACTIVE;
    bl.state_name = ms_block_state_name(bl.state);
    bl.stack = MS_SNAP_NO_STACK;
    if (bl.size) rc = ms__snapbuild_add_block(&b, &bl);
  }
  seg.nblocks = (uint32_t)(b.blocks.len - seg.first_block);
  if (rc == MS_OK) rc = ms__snapbuild_add_segment(&b, &seg);
  free(live), free(freeslot), free(used);
  if (rc != MS_OK) {
    ms__snapbuild_release(&b);
    return fail(eb, rc, "stacked shape: %s", ms_strerror(rc));
  }
  return ms__snapbuild_finish(&b, out, eb);
}

/* ---- the wide shape (bench_pickle) --------------------------------------------------------------
 */

#define WIDE_POOL 4000 /* distinct code locations (Python and C++ frames) */
#define WIDE_DEPTH 160 /* frames per stack: 160 .. 223 */

/* A name like the C++ frames of real snapshots (about 200 characters). */
static int wide_cpp_name(char *out, size_t cap, int i) {
  return snprintf(out, cap,
                  "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc_%d"
                  "<at::native::(anonymous namespace)::TensorIteratorBase, std::vector<long, "
                  "std::allocator<long> > >(signed char, unsigned long, CUstream_st*)",
                  i);
}

int synth_wide(size_t ntrace, size_t nsegments, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  if (ntrace == 0) ntrace = 1;
  static uint32_t pool[WIDE_POOL];
  char name[512], file[256];
  for (int i = 0; i < WIDE_POOL; i++) {
    int n =
        i % 2 ? snprintf(name, sizeof name, "forward_%d", i) : wide_cpp_name(name, sizeof name, i);
    int m = snprintf(file, sizeof file,
                     i % 2 ? "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module_%d.py"
                           : "CUDACachingAllocator_%d.cpp",
                     i % 97);
    TRY(ms__snapbuild_frame(&b, name, (size_t)n, file, (size_t)m, i % 2 ? 100 + i : 0, &pool[i]),
        "frame");
  }
  uint32_t fr[WIDE_DEPTH + 64];
  uint64_t x = 0x9e3779b97f4a7c15ull;
  ms_snap_device_t dev = {0};
  for (size_t i = 0; i < ntrace; i++) {
    int depth = WIDE_DEPTH + (int)(i % 64);
    for (int k = 0; k < depth; k++) {
      x ^= x << 13, x ^= x >> 7, x ^= x << 17;
      fr[k] = k < 4 ? pool[2 * k] : pool[(x >> 11) % WIDE_POOL];
    }
    ms_snap_trace_t t = {0};
    static const ms_trace_action acts[] = {MS_TRACE_ALLOC, MS_TRACE_FREE_REQUESTED,
                                           MS_TRACE_FREE_COMPLETED};
    t.action = (uint8_t)acts[i % 3];
    t.addr = 0x7f3a00000000ull + (i / 3) * 4096;
    t.size = 512 * (1 + i % 4096);
    t.time_us = 1783874422287973ll + (int64_t)i;
    ms_snap_trace_extra_t tx = ms__trace_extra_of(&t);
    tx.compile_context = "N/A";
    TRY(ms__snapbuild_trace_extra(&b, &t, &tx), "trace");
    TRY(ms__snapbuild_stack(&b, fr, (size_t)depth, &t.stack), "stack");
    TRY(ms__snapbuild_add_trace(&b, &t), "trace");
  }
  dev.ntrace = (uint32_t)ntrace;
  TRY(ms__snapbuild_add_device(&b, &dev), "device");
  for (size_t g = 0; g < nsegments; g++) {
    ms_snap_segment_t seg = {0};
    seg.address = 0x7f3a00000000ull + g * (64ull << 20);
    seg.is_large = true;
    seg.first_block = (uint32_t)b.blocks.len;
    seg.stack = b.trace.ptr[g % ntrace].stack;
    for (int k = 0; k < 8; k++) {
      ms_snap_block_t blk = {0};
      blk.address = seg.address + (uint64_t)k * (8ull << 20);
      blk.size = 8ull << 20;
      blk.requested_size = blk.size - 512;
      blk.state = k % 3 ? MS_BLOCK_ACTIVE_ALLOCATED : MS_BLOCK_INACTIVE;
      blk.state_name = ms_block_state_name(blk.state);
      blk.stack = b.trace.ptr[(g * 8 + (size_t)k) % ntrace].stack;
      seg.total_size += blk.size;
      if (blk.state == MS_BLOCK_ACTIVE_ALLOCATED) {
        seg.allocated_size += blk.size;
        seg.active_size += blk.size;
        seg.requested_size += blk.requested_size;
      }
      TRY(ms__snapbuild_add_block(&b, &blk), "block");
    }
    seg.nblocks = 8;
    TRY(ms__snapbuild_add_segment(&b, &seg), "segment");
  }
  return ms__snapbuild_finish(&b, out, eb);
}

/* ---- the workload --------------------------------------------------------------------------- */

/* The code locations stacks are made of. */
typedef struct frames_s {
  uint32_t unwind[3]; /* torch::unwind::unwind() ... gather_with_cpp() */
  uint32_t dca_malloc, dca_free, nca_malloc, nca_free, empty_cuda, empty_generic;
  uint32_t glue[6];  /* the interpreter's C frames between Python frames */
  uint32_t ops[240]; /* ATen operators (C++) */
  uint32_t py[3000]; /* Python frames: modules, functional, user code */
  uint32_t tail[5];  /* <module>, Py_RunMain, main, __libc_start_main, _start */
} frames_t;

static int add_frame(ms__snapbuild_t *b, const char *name, const char *file, int64_t line,
                     uint32_t *out) {
  return ms__snapbuild_frame(b, name, strlen(name), file, strlen(file), line, out);
}

static int make_frames(ms__snapbuild_t *b, rng_t *rng, frames_t *f) {
  static const char *const unwind[3] = {"torch::unwind::unwind()",
                                        "torch::CapturedTraceback::gather(bool, bool, bool)",
                                        "torch::cuda::(anonymous namespace)::gather_with_cpp()"};
  static const char *const unwind_file[3] = {"??", "??", "memory_snapshot.cpp"};
  int rc = MS_OK;
  for (int i = 0; i < 3 && rc == MS_OK; i++)
    rc = add_frame(b, unwind[i], unwind_file[i], 0, &f->unwind[i]);
  if (rc == MS_OK)
    rc = add_frame(b,
                   "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc(signed "
                   "char, unsigned long, CUstream_st*)",
                   "CUDACachingAllocator.cpp", 0, &f->dca_malloc);
  if (rc == MS_OK)
    rc = add_frame(b,
                   "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::free(c10::"
                   "cuda::CUDACachingAllocator::Native::(anonymous namespace)::Block*)",
                   "CUDACachingAllocator.cpp", 0, &f->dca_free);
  if (rc == MS_OK)
    rc =
        add_frame(b,
                  "c10::cuda::CUDACachingAllocator::Native::NativeCachingAllocator::malloc(void**, "
                  "signed char, unsigned long, CUstream_st*)",
                  "CUDACachingAllocator.cpp", 0, &f->nca_malloc);
  if (rc == MS_OK)
    rc = add_frame(b,
                   "c10::intrusive_ptr<c10::StorageImpl, c10::detail::intrusive_target_default_"
                   "null_type<c10::StorageImpl> >::reset_not_null_(c10::StorageImpl*)",
                   "", 0, &f->nca_free);
  if (rc == MS_OK)
    rc = add_frame(b,
                   "at::detail::empty_cuda(c10::ArrayRef<long>, c10::ScalarType, "
                   "std::optional<c10::Device>, std::optional<c10::MemoryFormat>)",
                   "EmptyTensor.cpp", 0, &f->empty_cuda);
  if (rc == MS_OK)
    rc = add_frame(b,
                   "at::TensorBase at::detail::_empty_generic<long>(c10::ArrayRef<long>, "
                   "c10::Allocator*, c10::DispatchKeySet, c10::ScalarType, "
                   "std::optional<c10::MemoryFormat>)",
                   "EmptyTensor.cpp", 0, &f->empty_generic);
  static const char *const glue[6] = {
      "_PyEval_EvalFrameDefault", "PyMethod_New",  "_PyObject_MakeTpCall",
      "_PyObject_Call_Prepend",   "PyObject_Call", "PyType_GetModule"};
  for (int i = 0; i < 6 && rc == MS_OK; i++)
    rc = add_frame(b, glue[i], "??", 0, &f->glue[i]);
  static const char *const opname[] = {
      "addmm",     "mm",   "bmm",           "baddbmm", "conv2d",
      "add",       "mul",  "gelu",          "softmax", "layer_norm",
      "embedding", "cat",  "index_select",  "copy_",   "div",
      "sum",       "mean", "cross_entropy", "dropout", "scaled_dot_product_attention"};
  char name[512], file[256];
  for (int i = 0; i < 240 && rc == MS_OK; i++) {
    const char *op = opname[i % 60 % 20];
    switch (i / 60) {
    case 0:
      snprintf(name, sizeof name,
               "at::native::%s_out_cuda(at::Tensor const&, at::Tensor const&, "
               "c10::Scalar const&, at::Tensor&) [variant %d]",
               op, i);
      snprintf(file, sizeof file, "%s.cu", op);
      break;
    case 1:
      snprintf(name, sizeof name,
               "at::_ops::%s::call(at::Tensor const&, at::Tensor const&) "
               "[variant %d]",
               op, i);
      snprintf(file, sizeof file, "Operators_%d.cpp", i % 5);
      break;
    case 2:
      snprintf(name, sizeof name,
               "torch::autograd::VariableType::(anonymous namespace)::%s("
               "c10::DispatchKeySet, at::Tensor const&) [variant %d]",
               op, i);
      snprintf(file, sizeof file, "VariableType_%d.cpp", i % 4);
      break;
    default:
      snprintf(name, sizeof name,
               "torch::autograd::generated::%sBackward0::apply(std::vector<"
               "at::Tensor, std::allocator<at::Tensor> >&&) [variant %d]",
               op, i);
      snprintf(file, sizeof file, "Functions.cpp");
      break;
    }
    rc = add_frame(b, name, file, 0, &f->ops[i]);
  }
  static const char *const pyname[] = {"forward",
                                       "_call_impl",
                                       "_wrapped_call_impl",
                                       "backward",
                                       "step",
                                       "_conv_forward",
                                       "linear",
                                       "attention",
                                       "_forward",
                                       "run_backward",
                                       "_single_tensor_adamw",
                                       "train_step",
                                       "checkpoint",
                                       "_fn",
                                       "inner",
                                       "__call__"};
  static const char *const pyfile[] = {
      "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/module.py",
      "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/linear.py",
      "/opt/conda/lib/python3.11/site-packages/torch/nn/modules/conv.py",
      "/opt/conda/lib/python3.11/site-packages/torch/nn/functional.py",
      "/opt/conda/lib/python3.11/site-packages/torch/autograd/graph.py",
      "/opt/conda/lib/python3.11/site-packages/torch/optim/adamw.py",
      "/opt/conda/lib/python3.11/site-packages/torch/_tensor.py",
      "/home/user/project/model/transformer.py",
      "/home/user/project/model/attention.py",
      "/home/user/project/train.py"};
  for (int i = 0; i < 3000 && rc == MS_OK; i++)
    rc = add_frame(b, pyname[rng_below(rng, 16)], pyfile[rng_below(rng, 10)],
                   1 + (int64_t)rng_below(rng, 2000), &f->py[i]);
  static const char *const tail[5] = {"<module>", "Py_RunMain", "main", "__libc_start_main",
                                      "_start"};
  for (int i = 0; i < 5 && rc == MS_OK; i++)
    rc = add_frame(b, tail[i], i == 0 ? "/home/user/project/train.py" : "??", i == 0 ? 249 : 0,
                   &f->tail[i]);
  return rc;
}

/* A stack, innermost first: the allocator's frames, an operator (its kernel, its dispatcher entry,
 * its autograd wrapper), 4-12 Python levels each with two interpreter frames, the program's
 * entry. 25-53 frames, 38 on average. */
static size_t make_stack(rng_t *rng, const frames_t *f, bool is_free, uint32_t *out) {
  size_t n = 0;
  for (int i = 0; i < 3; i++)
    out[n++] = f->unwind[i];
  if (is_free) {
    out[n++] = f->dca_free;
    out[n++] = f->nca_free;
  } else {
    out[n++] = f->dca_malloc;
    out[n++] = f->nca_malloc;
    out[n++] = f->empty_generic;
    out[n++] = f->empty_cuda;
  }
  uint32_t op = rng_below(rng, 60);
  for (int i = 0; i < 3; i++)
    out[n++] = f->ops[op + 60 * (uint32_t)i];
  uint32_t levels = 4 + rng_below(rng, 9);
  for (uint32_t l = 0; l < levels; l++) {
    out[n++] = f->glue[0];
    out[n++] = f->glue[1 + rng_below(rng, 5)];
    out[n++] = f->py[rng_below(rng, 3000)];
  }
  for (int i = 0; i < 5; i++)
    out[n++] = f->tail[i];
  return n;
}

/* Address -> stack of the newest alloc (or segment_alloc) there: open addressing. */
typedef struct addrmap_s {
  uint64_t *key; /* address + 1; 0 = empty */
  uint32_t *val;
  size_t cap, len;
} addrmap_t;

static size_t addr_slot(const addrmap_t *m, uint64_t a) {
  uint64_t h = (a >> 9) * 0x9e3779b97f4a7c15ull;
  size_t i = (size_t)(h >> 20) & (m->cap - 1);
  while (m->key[i] && m->key[i] != a + 1)
    i = (i + 1) & (m->cap - 1);
  return i;
}

static int addr_put(addrmap_t *m, uint64_t a, uint32_t v) {
  if ((m->len + 1) * 2 > m->cap) {
    addrmap_t n = {0};
    n.cap = m->cap ? m->cap * 2 : 1024;
    n.key = calloc(n.cap, sizeof *n.key);
    n.val = malloc(n.cap * sizeof *n.val);
    if (!n.key || !n.val) {
      free(n.key);
      free(n.val);
      return MS_ENOMEM;
    }
    for (size_t i = 0; i < m->cap; i++)
      if (m->key[i]) {
        size_t j = addr_slot(&n, m->key[i] - 1);
        n.key[j] = m->key[i];
        n.val[j] = m->val[i];
        n.len++;
      }
    free(m->key);
    free(m->val);
    *m = n;
  }
  size_t i = addr_slot(m, a);
  if (!m->key[i]) m->len++;
  m->key[i] = a + 1;
  m->val[i] = v;
  return MS_OK;
}

static uint32_t addr_get(const addrmap_t *m, uint64_t a) {
  if (!m->cap) return MS_SNAP_NO_STACK;
  size_t i = addr_slot(m, a);
  return m->key[i] ? m->val[i] : MS_SNAP_NO_STACK;
}

/* A tensor size: 60% small (512 B .. 1 MiB), 40% large (1 .. 64 MiB), log-uniform-ish, with the
 * odd sizes real tensors have. */
static size_t draw_size(rng_t *rng) {
  if (rng_below(rng, 10) < 6) {
    size_t base = (size_t)512 << rng_below(rng, 11);
    return base + rng_below(rng, (uint32_t)base);
  }
  size_t base = (size_t)1 << (20 + rng_below(rng, 6));
  return base + 4096 * (size_t)rng_below(rng, (uint32_t)(base / 4096));
}

typedef struct live_s {
  ms_devptr_t p;
} live_t;

/* Runs the workload through the allocator; *snap is the allocator's snapshot (no stacks). */
static int run_workload(const synth_opts_t *o, ms_snapshot_t **snap, ms_errbuf_t *eb) {
  ms_backend_t *be = NULL;
  ms_allocator_t *a = NULL;
  live_t *acts = NULL;
  int rc = ms_backend_sim_create(NULL, &be);
  if (rc != MS_OK) return fail(eb, rc, "simulated device: %s", ms_strerror(rc));
  ms_allocator_config_t cfg = {.backend = be, .device = 0, .alloc = NULL, .no_caching = false};
  ms_alloc_config_t acfg;
  ms_alloc_config_init(&acfg);
  cfg.alloc = &acfg;
  rc = ms_allocator_create(&cfg, &a, eb);
  if (rc != MS_OK) goto out;
  ms_history_config_t h;
  ms_history_config_init(&h);
  h.enabled = MS_HISTORY_ALL;
  h.context = MS_CONTEXT_NONE; /* stacks are made up afterwards */
  h.max_entries = o->entries + o->entries / 4 + 100000;
  rc = ms_allocator_record_history(a, &h, eb);
  if (rc != MS_OK) goto out;
  rng_t rng = {o->seed * 0x9e3779b97f4a7c15ull + 0x2545f4914f6cdd1dull};
  int nstreams = o->streams < 1 ? 1 : o->streams > 8 ? 8 : o->streams;
  ms_stream_t streams[8] = {0};
  const ms_backend_ops_t *ops = ms_backend_ops(be);
  (void)ops;
  for (int i = 1; i < nstreams; i++)
    streams[i] = (ms_stream_t)i;
  size_t entries = 0, cap = 4096;
  acts = malloc(cap * sizeof *acts);
  if (!acts) {
    rc = fail(eb, MS_ENOMEM, "out of memory");
    goto out;
  }
  /* parameters and optimizer state: alive to the end */
  for (int i = 0; i < 300; i++) {
    ms_devptr_t p;
    rc = ms_allocator_malloc(
        a, ((size_t)1 << 20) * (1 + rng_below(&rng, 24)) + 512 * rng_below(&rng, 64), 0, &p);
    if (rc != MS_OK) goto alloc_failed;
    entries++;
  }
  size_t want = o->entries;
  for (unsigned step = 0; entries < want; step++) {
    /* forward: activations, some temporaries freed at once */
    size_t n = 0, nact = 150 + rng_below(&rng, 250);
    bool last = false;
    for (size_t i = 0; i < nact; i++) {
      ms_stream_t s = nstreams > 1 && rng_below(&rng, 10) == 0
                          ? streams[1 + rng_below(&rng, (uint32_t)nstreams - 1)]
                          : 0;
      ms_devptr_t p;
      rc = ms_allocator_malloc(a, draw_size(&rng), s, &p);
      if (rc != MS_OK) goto alloc_failed;
      entries++;
      if (rng_below(&rng, 10) < 3) {
        ms_allocator_free(a, p);
        entries += 2;
      } else {
        if (n == cap) {
          live_t *g = realloc(acts, 2 * cap * sizeof *acts);
          if (!g) {
            rc = fail(eb, MS_ENOMEM, "out of memory");
            goto out;
          }
          acts = g;
          cap *= 2;
        }
        acts[n++].p = p;
      }
      /* the snapshot is taken in the middle of the last step's forward pass */
      if (entries >= want && i >= nact / 2) {
        last = true;
        break;
      }
    }
    if (last) break;
    /* backward: activations freed newest first, gradients made and freed on the way */
    while (n > 0) {
      ms_allocator_free(a, acts[--n].p);
      entries += 2;
      if (rng_below(&rng, 4) == 0) {
        ms_devptr_t g;
        rc = ms_allocator_malloc(a, draw_size(&rng), 0, &g);
        if (rc != MS_OK) goto alloc_failed;
        ms_allocator_free(a, g);
        entries += 3;
      }
    }
    if (step % 40 == 39) {
      rc = ms_allocator_empty_cache(a);
      if (rc != MS_OK) {
        rc = fail(eb, rc, "empty_cache: %s", ms_strerror(rc));
        goto out;
      }
    }
  }
  rc = ms_allocator_snapshot(&a, 1, snap, eb);
  goto out;
alloc_failed:
  fail(eb, rc, "the workload's allocation failed: %s", ms_strerror(rc));
out:
  free(acts);
  ms_allocator_destroy(a); /* live blocks are leaked on the simulated device, which goes too */
  ms_backend_destroy(be);
  return rc;
}

/* A setting with its strings copied into b (s is freed before b is finished). */
static int copy_kv(ms__snapbuild_t *b, ms_snap_kv_t *kv) {
  int rc = ms__snapbuild_str(b, kv->key, strlen(kv->key), &kv->key);
  if (rc == MS_OK && kv->s) rc = ms__snapbuild_str(b, kv->s, strlen(kv->s), &kv->s);
  return rc;
}

static int copy_settings(ms__snapbuild_t *b, const ms_snapshot_t *s) {
  for (size_t i = 0; i < s->nsettings_top; i++) {
    ms_snap_kv_t kv = s->settings[i];
    int rc = copy_kv(b, &kv);
    if (rc != MS_OK) return rc;
    if (kv.kind == MS_SNAP_VAL_MAP) {
      uint32_t first = 0;
      for (uint32_t j = 0; j < kv.count; j++) {
        ms_snap_kv_t c = s->settings[kv.first + j];
        if (c.kind == MS_SNAP_VAL_MAP) continue; /* no deeper maps in the allocator's settings */
        uint32_t ix;
        rc = copy_kv(b, &c);
        if (rc == MS_OK) rc = ms__snapbuild_add_setting_child(b, &c, &ix);
        if (rc != MS_OK) return rc;
        if (j == 0) first = ix;
      }
      kv.first = first;
    }
    rc = ms__snapbuild_add_setting(b, &kv);
    if (rc != MS_OK) return rc;
  }
  return MS_OK;
}

int synth_workload(const synth_opts_t *opts, ms_snapshot_t **out, ms_errbuf_t *eb) {
  ms_snapshot_t *s = NULL;
  int rc0 = run_workload(opts, &s, eb);
  if (rc0 != MS_OK) return rc0;
  if (s->ndevices != 1 || s->devices[0].trace_dropped) {
    ms_snapshot_free(s);
    return fail(eb, MS_ELIMIT, "the allocator's trace wrapped");
  }
  ms__snapbuild_t b;
  ms__snapbuild_init(&b);
  b.hdr.origin = MS_SNAP_ORIGIN_MEMSNAP;
  b.hdr.present = MS_SNAP_HAS_DEVICE_TRACES | MS_SNAP_HAS_SETTINGS;
  rng_t rng = {opts->seed * 0xbf58476d1ce4e5b9ull + 0x94d049bb133111ebull};
  static frames_t f;
  addrmap_t blocks = {0}, segs = {0};
  int rc = make_frames(&b, &rng, &f);
  /* the trace: times 1-40 us apart from a fixed start, a stack of its own for every entry, or one
   * of code_paths stacks made up front (for allocations and for frees) */
  int64_t t_us = 1783874422287973ll;
  uint32_t fr[64];
  size_t npaths = opts->code_paths;
  uint32_t *paths = npaths ? malloc(2 * npaths * sizeof *paths) : NULL;
  if (npaths && !paths) rc = MS_ENOMEM;
  for (size_t k = 0; k < 2 * npaths && rc == MS_OK; k++) {
    size_t n = make_stack(&rng, &f, k >= npaths, fr);
    rc = ms__snapbuild_stack(&b, fr, n, &paths[k]);
  }
  for (size_t i = 0; i < s->ntrace && rc == MS_OK; i++) {
    ms_snap_trace_t t = s->trace[i];
    uint64_t stream = ms_snap_trace_stream(&t);
    t.extra = NULL; /* s's extras are freed first: the fields below are static strings */
    t_us += 1 + rng_below(&rng, 40);
    t.time_us = t_us;
    t.present |= MS_TRACE_HAS_TIME | MS_TRACE_HAS_FRAMES | MS_TRACE_HAS_COMPILE_CONTEXT |
                 MS_TRACE_HAS_USER_METADATA | MS_TRACE_HAS_STREAM;
    ms_snap_trace_extra_t x = ms__trace_extra_of(&t);
    x.compile_context = "N/A";
    x.stream = stream;
    rc = ms__snapbuild_trace_extra(&b, &t, &x);
    if (rc != MS_OK) break;
    bool is_free = t.action == MS_TRACE_FREE_REQUESTED || t.action == MS_TRACE_FREE_COMPLETED ||
                   t.action == MS_TRACE_SEGMENT_FREE;
    if (npaths) {
      t.stack = paths[(is_free ? npaths : 0) + rng_below(&rng, (uint32_t)npaths)];
    } else {
      size_t n = make_stack(&rng, &f, is_free, fr);
      rc = ms__snapbuild_stack(&b, fr, n, &t.stack);
    }
    if (rc == MS_OK && t.action == MS_TRACE_ALLOC) rc = addr_put(&blocks, t.addr, t.stack);
    if (rc == MS_OK && t.action == MS_TRACE_SEGMENT_ALLOC) rc = addr_put(&segs, t.addr, t.stack);
    if (rc == MS_OK) rc = ms__snapbuild_add_trace(&b, &t);
  }
  ms_snap_device_t dev = s->devices[0];
  dev.first_trace = 0;
  dev.ntrace = (uint32_t)s->ntrace;
  dev.nstats = 0;
  dev.first_stat = 0;
  if (rc == MS_OK) rc = ms__snapbuild_add_device(&b, &dev);
  /* segments and blocks: the stacks of the allocations that made them */
  for (size_t g = 0; g < s->nsegments && rc == MS_OK; g++) {
    ms_snap_segment_t seg = s->segments[g];
    uint32_t first = (uint32_t)b.blocks.len;
    for (uint32_t k = 0; k < seg.nblocks && rc == MS_OK; k++) {
      ms_snap_block_t blk = s->blocks[seg.first_block + k];
      blk.state_name = ms_block_state_name(blk.state);
      bool live =
          blk.state == MS_BLOCK_ACTIVE_ALLOCATED || blk.state == MS_BLOCK_ACTIVE_PENDING_FREE;
      blk.stack = live ? addr_get(&blocks, blk.address) : MS_SNAP_NO_STACK;
      blk.nhistory = 0;
      blk.first_history = 0;
      rc = ms__snapbuild_add_block(&b, &blk);
    }
    seg.first_block = first;
    seg.stack = addr_get(&segs, seg.address);
    if (rc == MS_OK) rc = ms__snapbuild_add_segment(&b, &seg);
  }
  if (rc == MS_OK) rc = copy_settings(&b, s);
  free(paths);
  free(blocks.key);
  free(blocks.val);
  free(segs.key);
  free(segs.val);
  ms_snapshot_free(s);
  if (rc != MS_OK) {
    ms__snapbuild_release(&b);
    return fail(eb, rc, "building the snapshot: %s", ms_strerror(rc));
  }
  return ms__snapbuild_finish(&b, out, eb);
}

static int file_write(void *ctx, const char *buf, size_t len) {
  return fwrite(buf, 1, len, ctx) == len ? MS_OK : MS_EIO;
}

int synth_write_pickle(const ms_snapshot_t *snap, const char *path, ms_errbuf_t *eb) {
  FILE *fp = fopen(path, "wb");
  if (!fp) return fail(eb, MS_EIO, "cannot create '%s': %s", path, strerror(errno));
  static char buf[1 << 20];
  setvbuf(fp, buf, _IOFBF, sizeof buf);
  ms_sink_t sink = {file_write, fp};
  int rc = ms_pickle_write(snap, &sink, eb);
  if (fclose(fp) != 0 && rc == MS_OK) rc = fail(eb, MS_EIO, "cannot write '%s'", path);
  if (rc != MS_OK) remove(path);
  return rc;
}

typedef struct synth_job_s {
  const synth_opts_t *opts;
  const char *path;
} synth_job_t;

static void synth_generate_child(void *ctx) {
  const synth_job_t *job = ctx;
  ms_snapshot_t *s = NULL;
  ms_errbuf_t eb = {{0}};
  if (synth_workload(job->opts, &s, &eb) != MS_OK) bench_die("synthetic snapshot", eb.msg);
  if (synth_write_pickle(s, job->path, &eb) != MS_OK) bench_die(job->path, eb.msg);
  ms_snapshot_free(s);
}

void synth_generate_pickle(const synth_opts_t *opts, const char *path) {
  synth_job_t job = {opts, path};
  bench_in_child(synth_generate_child, &job, "generating the synthetic snapshot");
}
