#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
# Writes a small PyTorch-style snapshot pickle whose frame names, file names and addresses are
# hostile markup, and whose innermost frame's names are not ASCII (an emoji, and a lone surrogate,
# which pickle writes as invalid UTF-8) (tests/browser/view.sh).
# usage: view_hostile.py OUT.pickle [--no-trace]
import pickle
import sys

NAME = '</script><img src=x onerror="window.pwned=1">'
FILE = '"><svg onload="window.pwned=2"><script>window.pwned=3</script>.py'
frames = [{"filename": "d\u00e9j\u00e0/\u4e2d.py", "line": 3, "name": "f\u00fc\U0001F600\udcff"},
          {"filename": FILE, "line": 7, "name": NAME},
          {"filename": "train.py", "line": 1, "name": "main"}]
seg = {"device": 0, "address": 0x7f0000000000, "total_size": 2097152, "allocated_size": 1048576,
       "active_size": 1048576, "requested_size": 1000000, "stream": 0, "segment_type": "large",
       "segment_pool_id": (0, 0), "is_expandable": False, "frames": frames,
       "blocks": [{"size": 1048576, "requested_size": 1000000, "state": "active_allocated",
                   "frames": frames},
                  {"size": 1048576, "requested_size": 0, "state": "inactive", "frames": []}]}
trace = [
    {"action": "segment_alloc", "addr": 0x7f0000000000, "size": 2097152, "stream": 0, "frames": frames},
    {"action": "alloc", "addr": 0x7f0000100000, "size": 1048576, "stream": 0, "frames": frames},
    {"action": "alloc", "addr": 0x7f0000000000, "size": 1048576, "stream": 0, "frames": frames},
    {"action": "free_requested", "addr": 0x7f0000100000, "size": 1048576, "stream": 0, "frames": frames},
    {"action": "free_completed", "addr": 0x7f0000100000, "size": 1048576, "stream": 0, "frames": frames},
]
# a second device, so that the page's device selector is exercised
seg1 = dict(seg, device=1, address=0x7e0000000000,
            blocks=[dict(seg["blocks"][0]), dict(seg["blocks"][1])])
trace1 = [{"action": "alloc", "addr": 0x7e0000000000, "size": 1048576, "stream": 0, "frames": frames}]
no_trace = "--no-trace" in sys.argv
snap = {"segments": [seg, seg1], "device_traces": [[] if no_trace else trace, [] if no_trace else trace1],
        "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": NAME}}
with open(sys.argv[1], "wb") as f:
    pickle.dump(snap, f, protocol=4)
