#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a small PyTorch-style snapshot for the stacks and the axes (tests/browser/view.sh, issue
# #30 defects 6 and 7): entry 0 (the largest, 1 MiB) has the frames PyTorch's viewer hides (the
# unwinder, the traceback gatherer, the caching allocator, a Register... file, the interpreter's
# _PyEval_EvalFrameDefault) around two of its own; entry 1 (512 KiB) a stack 150 frames deep;
# entry 2 (256 KiB) names with bidirectional controls (a right-to-left override); then 1,097
# allocations of 4 KiB. Nothing is freed (the peak is at the right edge, past step 1,000) and no
# entry has a time. usage: view_frames.py OUT.pickle
import pickle
import sys

KIB, BASE = 1024, 0x7F0000000000
def fr(file, line, name):
    return {"filename": file, "line": line, "name": name}
hidden = [fr("unwind.cpp", 1, "torch::unwind::unwind()"),
          fr("combined_traceback.cpp", 2, "torch::CapturedTraceback::gather(bool, bool, bool)"),
          fr("CUDACachingAllocator.cpp", 3, "c10::cuda::CUDACachingAllocator::Native::DeviceCachingAllocator::malloc"),
          fr("build/aten/src/ATen/RegisterCUDA.cpp", 4, "at::empty_cuda"),
          fr("user.py", 10, "layer"),
          fr("Python/ceval.c", 5, "_PyEval_EvalFrameDefault"),
          fr("train.py", 1, "main")]
deep = [fr("deep.py", k, "d%d" % k) for k in range(150)]
bidi = [fr("x\u2067y.py", 7, "evil\u202egnp.exe"), fr("train.py", 1, "main")]
plain = [fr("train.py", 1, "main")]
allocs = [(1024 * KIB, hidden), (512 * KIB, deep), (256 * KIB, bidi)] + [(4 * KIB, plain)] * 1097
trace, blocks, addr = [], [], BASE
for size, frames in allocs:
    trace.append({"action": "alloc", "addr": addr, "size": size, "stream": 0, "frames": frames})
    blocks.append({"size": size, "requested_size": size, "state": "active_allocated", "frames": frames})
    addr += size
total = addr - BASE
seg = {"device": 0, "address": BASE, "total_size": total, "allocated_size": total,
       "active_size": total, "requested_size": total, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": [], "blocks": blocks}
with open(sys.argv[1], "wb") as f:
    pickle.dump({"segments": [seg], "device_traces": [trace], "allocator_settings": {}}, f, protocol=4)
