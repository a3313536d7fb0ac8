#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes the viewer data's worst shape as a PyTorch-style pickle (issue #35 item 1; the C twin is
# bench/synth.c, synth_stacked): NLONG blocks of 512 bytes kept, then NROUNDS rounds of
# allocating one and freeing a random live one, in one segment. Exact, the timeline has about
# NLONG x NROUNDS points, past the page's budget from 2,000 x 2,000 (tests/browser/view.sh).
# usage: view_stacked.py OUT.pickle [NLONG NROUNDS]
import pickle
import random
import sys

nlong = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
nrounds = int(sys.argv[3]) if len(sys.argv) > 3 else 2000
rng = random.Random(7)
base, B = 0x7F0000000000, 512
nslots = nlong + 1
segsize = (nslots * B + (2 << 20) - 1) // (2 << 20) * (2 << 20)
frames = [{"filename": "model.py", "line": 42, "name": "forward"}]
free_slots = list(range(nslots - 1, -1, -1))
live, trace = [], []
t = 1700000000000000


def entry(action, slot):
    global t
    t += 1
    return {"action": action, "addr": base + slot * B, "size": B, "stream": 0, "frames": frames,
            "time_us": t}


for k in range(nlong + 2 * nrounds):
    if k < nlong or (k - nlong) % 2 == 0:
        slot = free_slots.pop()
        live.append(slot)
        trace.append(entry("alloc", slot))
    else:
        at = rng.randrange(len(live))
        slot = live[at]
        live[at] = live[-1]
        live.pop()
        free_slots.append(slot)
        trace.append(entry("free_requested", slot))
        trace.append(entry("free_completed", slot))
used = set(live)
blocks, i = [], 0
while i < nslots:
    if i in used:
        blocks.append({"size": B, "requested_size": B, "state": "active_allocated", "frames": frames})
        i += 1
        continue
    j = i
    while j < nslots and j not in used:
        j += 1
    blocks.append({"size": (segsize if j == nslots else j * B) - i * B, "requested_size": 0,
                   "state": "inactive", "frames": []})
    i = j
if nslots - 1 in used and segsize > nslots * B:
    blocks.append({"size": segsize - nslots * B, "requested_size": 0, "state": "inactive", "frames": []})
seg = {"device": 0, "address": base, "total_size": segsize, "allocated_size": len(live) * B,
       "active_size": len(live) * B, "requested_size": len(live) * B, "stream": 0,
       "segment_type": "large", "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
       "blocks": blocks}
with open(sys.argv[1], "wb") as f:
    pickle.dump({"segments": [seg], "device_traces": [trace]}, f, protocol=4)
