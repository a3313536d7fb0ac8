# SPDX-License-Identifier: MIT
"""memsnap.record(): PyTorch's allocation history around a block of code, written as a snapshot
at its end and whenever memory runs out inside it."""
import contextlib
import os

from ._errors import Error


def _torch():
    try:
        import torch  # lazily: memsnap needs PyTorch only to record
    except ImportError as e:
        raise Error("memsnap.record() records PyTorch's CUDA allocator, but torch cannot be "
                    f"imported ({e}); memsnap.load() reads snapshots without it") from None
    cuda = getattr(torch, "cuda", None)
    if cuda is None or not cuda.is_available():
        raise Error("memsnap.record(): torch.cuda.is_available() is False (no CUDA device or a "
                    "PyTorch built without CUDA): there is no allocator to record")
    return torch


def _oom_path(path, n):
    """run.pickle -> run.oom1.pickle (the n-th OOM's snapshot)."""
    root, ext = os.path.splitext(os.fspath(path))
    return f"{root}.oom{n}{ext or '.pickle'}"


class Recording:
    """What record() yields: .path (written at exit), .oom_paths (one per OOM so far)."""

    def __init__(self, path, max_oom_snapshots):
        self.path, self.oom_paths, self.max_oom_snapshots = os.fspath(path), [], max_oom_snapshots
        self.active = True

    def __repr__(self):
        return f"<memsnap.Recording {self.path!r}, {len(self.oom_paths)} OOM snapshot(s)>"


@contextlib.contextmanager
def record(path="snap.pickle", max_entries=100_000, on_oom=True, max_oom_snapshots=3,
           stacks="all", context="all"):
    """Records PyTorch's CUDA allocations inside the with block:

        with memsnap.record("run.pickle") as rec:
            train()
        memsnap.load(rec.path).explain()

    Calls torch.cuda.memory._record_memory_history("all", context=context, stacks=stacks,
    max_entries=max_entries) at entry and writes the snapshot to path at exit (also when the block
    raises), then stops recording. With on_oom, an out-of-memory observer
    (torch._C._cuda_attach_out_of_memory_observer) writes one to run.oomN.pickle at each of the
    first max_oom_snapshots OOMs, while the allocator's state is the failing one.
    Needs PyTorch 2.1 or later (the keyword form of _record_memory_history). Raises memsnap.Error
    when torch cannot be imported or CUDA is not available."""
    torch = _torch()
    mem = torch.cuda.memory
    rec = Recording(path, max_oom_snapshots)

    def on_out_of_memory(device, alloc, device_alloc, device_free):
        if not rec.active or len(rec.oom_paths) >= rec.max_oom_snapshots:
            return
        p = _oom_path(rec.path, len(rec.oom_paths) + 1)
        mem._dump_snapshot(p)
        rec.oom_paths.append(p)

    mem._record_memory_history(enabled="all", context=context, stacks=stacks,
                               max_entries=max_entries)
    if on_oom:  # PyTorch has no call to detach an observer: it stays, inactive after the block
        torch._C._cuda_attach_out_of_memory_observer(on_out_of_memory)
    try:
        yield rec
    finally:
        rec.active = False
        try:
            mem._dump_snapshot(rec.path)
        finally:
            mem._record_memory_history(enabled=None)
