#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a small snapshot whose allocations come from three source lines (tests/browser/
# features.sh; "Compare two moments" is worked out by hand in features_test.js): in one 1 MiB
# segment, X1 (256 KiB, model.py:10 forward), X2 (128 KiB, optim.py:20 step), X3 (64 KiB,
# model.py:10 forward), X2 freed, X4 (512 KiB, data.py:30 load); X1, X3 and X4 alive at the end.
# usage: view_diff.py OUT.pickle
import pickle
import sys

KIB = 1024
S = 0x7F0000000000
def fr(f, line, name):
    return [{"filename": f, "line": line, "name": name}]
FWD, STEP, LOAD = fr("model.py", 10, "forward"), fr("optim.py", 20, "step"), fr("data.py", 30, "load")
def blk(size, state, frames):
    return {"size": size, "requested_size": size if state != "inactive" else 0, "state": state, "frames": frames}
seg = {"device": 0, "address": S, "total_size": 1024 * KIB, "allocated_size": 832 * KIB,
       "active_size": 832 * KIB, "requested_size": 832 * KIB, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": FWD,
       "blocks": [blk(256 * KIB, "active_allocated", FWD), blk(128 * KIB, "inactive", []),
                  blk(64 * KIB, "active_allocated", FWD), blk(512 * KIB, "active_allocated", LOAD),
                  blk(64 * KIB, "inactive", [])]}
def ev(action, addr, size, frames):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": frames}
trace = [ev("segment_alloc", S, 1024 * KIB, FWD),
         ev("alloc", S, 256 * KIB, FWD),                          # X1
         ev("alloc", S + 256 * KIB, 128 * KIB, STEP),             # X2
         ev("alloc", S + 384 * KIB, 64 * KIB, FWD),               # X3
         ev("free_requested", S + 256 * KIB, 128 * KIB, STEP),
         ev("free_completed", S + 256 * KIB, 128 * KIB, STEP),    # X2 freed
         ev("alloc", S + 448 * KIB, 512 * KIB, LOAD)]             # X4
snap = {"segments": [seg], "device_traces": [trace], "allocator_settings": {}}
with open(sys.argv[1], "wb") as f:
    pickle.dump(snap, f, protocol=4)
