#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a small PyTorch-style snapshot with a private memory pool (a CUDA graph / MemPool pool,
# segment_pool_id (1, 2)) beside the default pool (tests/browser/view.sh; the expected numbers of
# the "Allocated Memory (incl. Private Pools)" view are worked out by hand in view_test.js).
# usage: view_pools.py OUT.pickle
import pickle
import sys

MIB = 1 << 20
S0, P = 0x7F0000000000, 0x7F0000400000
fr = [{"filename": "graph.py", "line": 3, "name": "capture"}]
def blk(size, req, state):
    return {"size": size, "requested_size": req, "state": state, "frames": fr if state != "inactive" else []}
seg0 = {"device": 0, "address": S0, "total_size": 2 * MIB, "allocated_size": MIB // 2,
        "active_size": MIB // 2, "requested_size": MIB // 2, "stream": 0, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": fr,
        "blocks": [blk(MIB, 0, "inactive"), blk(MIB // 2, MIB // 2, "active_allocated"),
                   blk(MIB // 2, 0, "inactive")]}
segp = {"device": 0, "address": P, "total_size": 4 * MIB, "allocated_size": 3 * MIB // 2,
        "active_size": 3 * MIB // 2, "requested_size": 3 * MIB // 2, "stream": 0,
        "segment_type": "large", "segment_pool_id": (1, 2), "is_expandable": False, "frames": fr,
        "blocks": [blk(MIB, 0, "inactive"), blk(MIB // 2, MIB // 2, "active_allocated"),
                   blk(3 * MIB // 2, 0, "inactive"), blk(MIB, MIB, "active_allocated")]}
def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": fr}
trace = [ev("segment_alloc", S0, 2 * MIB),             # 0
         ev("alloc", S0, MIB),                          # 1  A (default pool)
         ev("segment_alloc", P, 4 * MIB),               # 2  the private pool reserves 4 MiB
         ev("alloc", P, MIB),                           # 3  B (private pool)
         ev("alloc", P + MIB, MIB // 2),                # 4  C (private pool)
         ev("alloc", S0 + MIB, MIB // 2),               # 5  D (default pool)
         ev("free_requested", P, MIB), ev("free_completed", P, MIB),        # 6, 7  B freed
         ev("free_requested", S0, MIB), ev("free_completed", S0, MIB)]      # 8, 9  A freed
snap = {"segments": [seg0, segp], "device_traces": [trace], "allocator_settings": {}}
with open(sys.argv[1], "wb") as f:
    pickle.dump(snap, f, protocol=4)
