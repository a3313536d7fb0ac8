#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a small PyTorch-style snapshot whose stacks need wide ranks in the page's
# stack encoding (viz/view/stacks.h: a high and a low byte after a frame that more than 256
# others follow): 300 allocations, the k-th with the stack [f<k+1>, f0] (innermost first), so
# that 300 different frames follow f0 (tests/browser/view.sh checks that the page reads every
# stack back; test_view.c checks the big ranks, from 65,280, which need as many stacks). usage: view_stacks.py OUT.pickle
import pickle
import sys

N, BASE = 300, 0x7F0000000000
def fr(k):
    return {"filename": "s.py", "line": k, "name": "f%d" % k}
trace = [{"action": "alloc", "addr": BASE + 512 * k, "size": 512, "stream": 0,
          "frames": [fr(k + 1), fr(0)]} for k in range(N)]
seg = {"device": 0, "address": BASE, "total_size": 512 * N, "allocated_size": 512 * N,
       "active_size": 512 * N, "requested_size": 512 * N, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": [],
       "blocks": [{"size": 512, "requested_size": 512, "state": "active_allocated",
                   "frames": [fr(k + 1), fr(0)]} for k in range(N)]}
with open(sys.argv[1], "wb") as f:
    pickle.dump({"segments": [seg], "device_traces": [trace], "allocator_settings": {}}, f, protocol=4)
