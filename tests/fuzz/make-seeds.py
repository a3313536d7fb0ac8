#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Writes the seed corpus of the fuzz targets added by issue #16 item 25 into
tests/fuzz/corpus/<target>/: small hand-made inputs, never copies of the PyTorch fixtures.
The snapshots are built here from plain dicts in the shape of torch.cuda.memory._snapshot()
(docs/pytorch.md) and kept tiny so that the fuzzers run fast; the memsnap-format ones are the same
converted with `memsnap convert`.

    tests/fuzz/make-seeds.py build/bin/memsnap       (run from the project's root)
"""
import gzip
import os
import pickle
import subprocess
import sys
import tempfile

MiB = 1 << 20


def frames(*names):
    return [{"name": n, "filename": "/src/model/%s.py" % n, "line": 10 + i} for i, n in enumerate(names)]


def snapshot(with_trace=True, with_stats=True, expandable=False):
    base = 0x7F0000000000
    f1 = frames("forward", "linear")
    f2 = frames("forward", "attention", "softmax")
    seg = {
        "device": 0, "address": base, "total_size": 2 * MiB, "allocated_size": 1536,
        "active_size": 1536, "requested_size": 1500, "stream": 0, "segment_type": "small",
        "segment_pool_id": (0, 0), "is_expandable": expandable, "frames": f1,
        "blocks": [
            {"address": base, "size": 1024, "requested_size": 1000, "state": "active_allocated", "frames": f1},
            {"address": base + 1024, "size": 512, "requested_size": 500, "state": "active_allocated", "frames": f2},
            {"address": base + 1536, "size": 2 * MiB - 1536, "requested_size": 0, "state": "inactive", "frames": []},
        ],
    }
    seg2 = {
        "device": 0, "address": base + 20 * MiB, "total_size": 12 * MiB, "allocated_size": 0,
        "active_size": 0, "requested_size": 0, "stream": 7, "segment_type": "large",
        "segment_pool_id": (0, 0), "is_expandable": False, "frames": f2,
        "blocks": [{"address": base + 20 * MiB, "size": 12 * MiB, "requested_size": 0, "state": "inactive", "frames": []}],
    }
    trace = []
    if with_trace:
        trace = [
            {"action": "segment_alloc", "addr": base, "size": 2 * MiB, "stream": 0, "time_us": 1, "frames": f1},
            {"action": "alloc", "addr": base, "size": 1024, "stream": 0, "time_us": 2, "frames": f1},
            {"action": "alloc", "addr": base + 1024, "size": 512, "stream": 0, "time_us": 3, "frames": f2},
            {"action": "alloc", "addr": base + 1536, "size": 512, "stream": 0, "time_us": 4, "frames": f2},
            {"action": "free_requested", "addr": base + 1536, "size": 512, "stream": 0, "time_us": 5, "frames": f2},
            {"action": "free_completed", "addr": base + 1536, "size": 512, "stream": 0, "time_us": 6, "frames": f2},
            {"action": "segment_alloc", "addr": base + 20 * MiB, "size": 12 * MiB, "stream": 7, "time_us": 7, "frames": f2},
            {"action": "alloc", "addr": base + 20 * MiB, "size": 12 * MiB, "stream": 7, "time_us": 8, "frames": f2},
            {"action": "free_requested", "addr": base + 20 * MiB, "size": 12 * MiB, "stream": 7, "time_us": 9, "frames": f2},
            {"action": "free_completed", "addr": base + 20 * MiB, "size": 12 * MiB, "stream": 7, "time_us": 10, "frames": f2},
            {"action": "snapshot", "addr": 0, "size": 0, "stream": 0, "time_us": 11, "frames": []},
        ]
    snap = {
        "segments": [seg, seg2],
        "device_traces": [trace],
        "allocator_settings": {
            "PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True" if expandable else "",
            "max_split_size": -1, "garbage_collection_threshold": 0.0, "expandable_segments": expandable,
            "roundup_power2_divisions": {"1": 0, "2": 0, "4": 0},
        },
        "external_annotations": [{"name": "step", "stage": "START", "device": 0, "time_us": 1}],
    }
    if with_stats:
        snap["device_stats"] = [{"allocated_bytes.all.current": 1536, "reserved_bytes.all.current": 14 * MiB,
                                 "allocated_bytes.all.peak": 12 * MiB + 1536, "num_alloc_retries": 0,
                                 "num_ooms": 0, "active.all.current": 2}]
    return snap


def legacy_list():
    """PyTorch before 2.0: a bare list of segments."""
    s = snapshot(with_trace=False)["segments"]
    for seg in s:
        for b in seg["blocks"]:
            b.pop("address")
            b["history"] = [{"addr": seg["address"], "real_size": b["size"], "frames": frames("old")}]
    return s


def snapshots(memsnap, tmp):
    """{name: bytes} of every snapshot seed, pickles and their memsnap conversions."""
    items = {
        "tiny.pickle": (snapshot(), 4),
        "tiny-p2.pickle": (snapshot(with_stats=False), 2),
        "expandable.pickle": (snapshot(expandable=True), 5),
        "notrace.pickle": (snapshot(with_trace=False), 3),
        "legacy-list.pickle": (legacy_list(), 2),
        "empty-dict.pickle": ({"segments": [], "device_traces": []}, 4),
    }
    out = {name: pickle.dumps(obj, protocol=proto) for name, (obj, proto) in items.items()}
    out["tiny.pickle.gz"] = gzip.compress(out["tiny.pickle"], mtime=0)
    for src, dst in (("tiny.pickle", "tiny.msnap"), ("expandable.pickle", "expandable.msnap.gz")):
        with open(os.path.join(tmp, src), "wb") as f:
            f.write(out[src])
        subprocess.run([memsnap, "convert", os.path.join(tmp, src), os.path.join(tmp, dst)], check=True)
        with open(os.path.join(tmp, dst), "rb") as f:
            out[dst] = f.read()
    return out


FOLDED = {
    # two option bytes (see fuzz_folded.c), then folded text
    "plain": b"\x00\x00main;f;g 10\nmain;f;h 5\nmain;k 3\n",
    "diff": b"\x01\x10a;b 1 2\na;c 3 0\nd 0 4\n",
    "memory": b"\x08\x20stream_0;active_allocated;x.py:1:f 1024\nstream_0;inactive;<gaps> 512\n"
              b"stream_0;seg_1;active_pending_free;<non-python> -3\n",
    "chart-crlf": b"\x04\x41a;b 1\r\na;b 1\r\nc;;d 2\r\nlast 7",
    "markup": b"\x80\xff<svg>;&amp;;\x1b[2J;\xc3\x28 9\n]]>;x 1\n",
}

ALLOC_CONF = {
    "defaults": b"",
    "pytorch-doc": b"max_split_size_mb:128,roundup_power2_divisions:[256:1,512:2,>:4],expandable_segments:True",
    "all-keys": b"max_split_size_mb:64,max_non_split_rounding_mb:40,large_segment_size_mb:32,"
                b"garbage_collection_threshold:0.6,roundup_power2_divisions:8,per_process_memory_fraction:0.5,"
                b"expandable_segments:False,release_lock_on_cudamalloc:True,graph_capture_record_stream_reuse:True,"
                b"pinned_use_cuda_host_register:True,pinned_use_background_threads:True,"
                b"pinned_num_register_threads:16,pinned_reserve_segment_size_mb:4,backend:native",
    "bad-value": b"max_split_size_mb:1",
    "async": b"backend:cudaMallocAsync",
}

CLI_VALUES = {
    "capacity": b"24GiB",
    "capacity-frac": b"1.5G",
    "capacity-hex": b"0x10",
    "sweep": b"max_split_size_mb=64,128,256;expandable_segments=False,True",
    "sweep-brackets": b"roundup_power2_divisions=[256:1,>:4],[>:8];garbage_collection_threshold=0.5",
    "sweep-twice": b"a=1;a=2",
    "limit": b"peak_allocated<=20GiB",
    "limit-relative": b"peak_reserved <= +5%",
    "limit-bytes": b"peak_activation<-1.5MiB",
}


def write(root, target, files):
    d = os.path.join(root, "tests", "fuzz", "corpus", target)
    os.makedirs(d, exist_ok=True)
    for name, data in files.items():
        # Plain pickles stay out of the repository (scripts/fuzz.sh seeds every target that reads
        # snapshots with the PyTorch fixtures, read from where they live); the small hand-made ones
        # are kept only gzip-compressed and converted to memsnap's format.
        if name.endswith(".pickle"):
            continue
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)


def main():
    memsnap = os.path.abspath(sys.argv[1])
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with tempfile.TemporaryDirectory() as tmp:
        snaps = snapshots(memsnap, tmp)
    write(root, "fuzz_consumers", snaps)
    # fuzz_load: one flags byte (bit 0: MS_LOAD_NO_TRACE), then the file
    load = {n: b"\x00" + d for n, d in snaps.items()}
    load.update({"notrace-flag-" + n: b"\x01" + d for n, d in snaps.items() if n.endswith((".pickle", ".gz"))})
    load["not-a-snapshot"] = b"\x00hello"
    load["gzip-of-text"] = b"\x00" + gzip.compress(b"not a pickle", mtime=0)
    write(root, "fuzz_load", load)
    write(root, "fuzz_folded", FOLDED)
    write(root, "fuzz_alloc_conf", ALLOC_CONF)
    write(root, "fuzz_cli_values", CLI_VALUES)


if __name__ == "__main__":
    main()
