#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes the snapshot of test_view_memory.c's pools_expandable_by_hand as a PyTorch pickle
# (tests/browser/features.sh): a default-pool segment, a private pool (1, 2) and an expandable
# segment mapped (12 KiB) and partly unmapped (4 KiB); the "Memory over time" view's figures and
# pixels are worked out by hand in features_test.js (the table in test_view_memory.c).
# usage: view_memory.py OUT.pickle
import pickle
import sys

S1, S2, S3 = 0x100000, 0x200000, 0x300000
fr = [{"filename": "train.py", "line": 7, "name": "step"}]
def blk(size, state):
    return {"size": size, "requested_size": size if state != "inactive" else 0, "state": state,
            "frames": fr if state != "inactive" else []}
def seg(addr, size, pool, expandable, used):
    return {"device": 0, "address": addr, "total_size": size, "allocated_size": used,
            "active_size": used, "requested_size": used, "stream": 0, "segment_type": "small",
            "segment_pool_id": pool, "is_expandable": expandable, "frames": fr,
            "blocks": [blk(used, "active_allocated"), blk(size - used, "inactive")]}
def ev(action, addr, size):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": fr}
trace = [ev("segment_alloc", S1, 8192), ev("alloc", S1, 4096),
         ev("segment_alloc", S2, 8192), ev("alloc", S2, 2048),
         ev("segment_map", S3, 12288), ev("alloc", S3, 4096),
         ev("alloc", S3 + 4096, 4096), ev("free_requested", S3 + 4096, 4096),
         ev("free_completed", S3 + 4096, 4096), ev("segment_unmap", S3 + 8192, 4096)]
snap = {"segments": [seg(S1, 8192, (0, 0), False, 4096), seg(S2, 8192, (1, 2), False, 2048),
                     seg(S3, 8192, (0, 0), True, 4096)],
        "device_traces": [trace], "allocator_settings": {"expandable_segments": True}}
with open(sys.argv[1], "wb") as f:
    pickle.dump(snap, f, protocol=4)
