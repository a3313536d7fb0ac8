# SPDX-License-Identifier: MIT
"""memsnap for Python: PyTorch GPU-memory snapshots, answered offline by memsnap's C library.

    import memsnap
    snap = memsnap.load("oom.pickle")          # or bytes, or torch.cuda.memory._snapshot()
    snap.explain()["recommendation"]           # why it ran out, and which setting would avoid it
    snap.top(n=5)                              # the biggest holders at the peak
    snap.view()                                # the offline viewer, inline in Jupyter

    with memsnap.record("run.pickle"):         # record a PyTorch program's allocations
        train()

Standard library only: the C library through ctypes and the bundled `memsnap` program. In
IPython or Jupyter, `%load_ext memsnap` adds `%memsnap_view FILE|VARIABLE`. See docs/python.md.
"""
from ._errors import Error
from ._snapshot import Snapshot, View, load
from ._record import record
from ._magic import load_ipython_extension

__all__ = ["Error", "Snapshot", "View", "load", "record", "load_ipython_extension"]


def __getattr__(name):
    if name == "__version__":  # the C library's own, so that the two can never disagree
        from . import _native
        return _native.version()
    raise AttributeError(f"module 'memsnap' has no attribute {name!r}")
