#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a small PyTorch-style snapshot of a run that ran out of memory from fragmentation
# (tests/browser/view.sh, the Explain panel): a 100 MiB segment is freed whole, split by 40 and
# 20 MiB tensors, then 50 MiB are asked for with 20 MiB free on the device (`oom` entry with
# device_free); annotations name the step and a phase full of markup. The answer worked out by
# hand: capacity 120 MiB inferred from the OOM, verdict fragmentation, expandable segments avoid it.
# usage: view_oom.py OUT.pickle
import pickle
import sys

MIB = 1 << 20
S = 0x7F0000000000
fr = [{"filename": "train.py", "line": 7, "name": "forward"}]
def ev(action, addr, size, t, key="addr"):
    return {"action": action, key: addr, "size": size, "stream": 0, "time_us": t, "frames": fr}
trace = [ev("segment_alloc", S, 100 * MIB, 10), ev("alloc", S, 100 * MIB, 11),
         ev("free_requested", S, 100 * MIB, 12), ev("free_completed", S, 100 * MIB, 13),
         ev("alloc", S, 40 * MIB, 14), ev("alloc", S + 40 * MIB, 20 * MIB, 15),
         ev("oom", 20 * MIB, 50 * MIB, 16, key="device_free")]
def blk(size, state):
    return {"address": 0, "size": size, "requested_size": size if state != "inactive" else 0,
            "state": state, "frames": fr if state != "inactive" else []}
b = [blk(40 * MIB, "active_allocated"), blk(20 * MIB, "active_allocated"), blk(40 * MIB, "inactive")]
addr = S
for x in b:
    x["address"] = addr
    addr += x["size"]
seg = {"device": 0, "address": S, "total_size": 100 * MIB, "allocated_size": 60 * MIB,
       "active_size": 60 * MIB, "requested_size": 60 * MIB, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": fr, "blocks": b}
ann = [{"name": "ProfilerStep#4", "stage": "START", "device": 0, "time_us": 9},
       {"name": "<img src=x onerror=alert(1)>## forward ##", "stage": "START", "device": 0, "time_us": 13},
       {"name": "ProfilerStep#4", "stage": "END", "device": 0, "time_us": 99}]
snap = {"segments": [seg], "device_traces": [trace], "allocator_settings": {},
        "external_annotations": ann}
with open(sys.argv[1], "wb") as f:
    pickle.dump(snap, f, protocol=4)
