# SPDX-License-Identifier: MIT
"""memsnap.load() and the Snapshot it returns: answers as plain data, exports, the viewer."""
import html
import io
import os
import pickle
import shutil
import tempfile
import weakref

from . import _native
from ._errors import Error

# the answers' defaults, as the command line's
_TOP_N = 20


def load(source, *, check=None):
    """Opens a snapshot: a path (str or os.PathLike) to a PyTorch pickle (also gzip-compressed) or a
    memsnap file, the bytes of one, or the dict that torch.cuda.memory._snapshot() returns.

    A dict or bytes are written to a private temporary file (removed with the Snapshot) and read in
    full at once by the library, so a snapshot that cannot be read raises here. A file is checked
    at once for a format memsnap knows (its first bytes) and read by each answer; check=True reads
    it in full here too (a refused file raises here, at the cost of one more reading).
    Raises memsnap.Error with the library's message."""
    if isinstance(source, Snapshot):
        return source
    if isinstance(source, dict) or isinstance(source, list):
        name = "<dict>" if isinstance(source, dict) else "<list>"
        return Snapshot._from_bytes(_pickle_dict(source, name), name)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return Snapshot._from_bytes(bytes(source), "<bytes>", check=True if check is None else check)
    if isinstance(source, (str, os.PathLike)):
        return Snapshot._from_path(os.fspath(source), check=bool(check))
    raise TypeError("memsnap.load() takes a path, bytes, or the dict of "
                    f"torch.cuda.memory._snapshot(), not {type(source).__name__}")


_PLAIN = (dict, list, tuple, str, bytes, int, float, bool, type(None))


class _PlainPickler(pickle.Pickler):
    """pickle.Pickler that writes only what torch.cuda.memory._snapshot() holds; anything else
    would be a reference to Python code, which memsnap's reader refuses."""

    def reducer_override(self, obj):  # not called for exact dicts, lists, strings, numbers, None
        if type(obj) in _PLAIN:
            return NotImplemented
        raise pickle.PicklingError(f"it holds a value of type {type(obj).__name__!r}")


def _pickle_dict(obj, name):
    """The dict as torch.cuda.memory._dump_snapshot() would write it (pickle.dump), in memory."""
    buf = io.BytesIO()
    try:
        _PlainPickler(buf, protocol=4).dump(obj)
    except (pickle.PicklingError, TypeError, AttributeError, RecursionError, ValueError) as e:
        where, what = _find_junk(obj)
        if where is None:
            raise Error(f"{name}: the snapshot cannot be pickled: {e}") from None
        raise Error(f"{name}: {where} is of type {what!r}, which no snapshot of "
                    "torch.cuda.memory._snapshot() holds (only dicts, lists, strings, numbers, "
                    "booleans and None): was the dict changed after it was taken?") from None
    return buf.getvalue()


def _find_junk(obj, limit=1_000_000):
    """The place (as a Python subscript path) and type name of the first value that is not plain
    data, walking depth first; (None, None) when there is none."""
    stack, seen = [("snapshot", obj)], set()
    while stack and limit > 0:
        limit -= 1
        where, v = stack.pop()
        if type(v) not in _PLAIN:
            return where, type(v).__name__
        if isinstance(v, (dict, list, tuple)) and id(v) not in seen:
            seen.add(id(v))
            items = list(v.items()) if isinstance(v, dict) else list(enumerate(v))
            for k, x in reversed(items):
                if isinstance(v, dict) and type(k) not in _PLAIN:
                    return f"a key of {where}", type(k).__name__
                stack.append((f"{where}[{k!r}]", x))
    return None, None


def _detect(path):
    try:
        with open(path, "rb") as f:
            head = f.read(4096)
    except OSError as e:
        raise Error(f"cannot open '{path}': {e.strerror or e}") from None
    fmt = _native.format_detect(head)
    if fmt == "unknown" and head[:2] != b"\x1f\x8b":  # gzip: a compressed pickle, read inflated
        raise Error(f"'{path}': not a memsnap snapshot or PyTorch pickle")
    return fmt if fmt != "unknown" else "pickle.gz"


class Snapshot:
    """One snapshot. Every answer is plain data (dicts and lists, as the command line's --json
    gives it); the snapshot itself is never changed. Usable as a context manager, which removes
    the temporary file of a dict or bytes at exit (otherwise done when the object is collected)."""

    def __init__(self):
        raise TypeError("use memsnap.load()")

    @classmethod
    def _new(cls, path, name, fmt, tmpdir=None):
        self = object.__new__(cls)
        self._path, self._name, self.format, self._tmpdir = path, name, fmt, tmpdir
        self._cleanup = weakref.finalize(self, shutil.rmtree, tmpdir, True) if tmpdir else None
        return self

    @classmethod
    def _from_path(cls, path, check):
        fmt = _detect(path)
        if check:
            _native.check_file(path)
        return cls._new(os.path.abspath(path), path, fmt)  # (the answers survive a chdir)

    @classmethod
    def _from_bytes(cls, data, name, check=True):
        tmpdir = tempfile.mkdtemp(prefix="memsnap-")
        path = os.path.join(tmpdir, "snapshot")
        try:
            with open(path, "wb") as f:
                f.write(data)
            fmt = _native.format_detect(data[:4096])
            if fmt == "unknown" and data[:2] != b"\x1f\x8b":
                raise Error(f"{name}: not a memsnap snapshot or PyTorch pickle")
            if check:
                try:
                    _native.check_file(path)
                except Error as e:  # the message names the temporary file: name the input instead
                    raise Error(str(e).replace(f"'{path}'", name).replace(path, name)) from None
        except BaseException:
            shutil.rmtree(tmpdir, True)
            raise
        return cls._new(path, name, fmt if fmt != "unknown" else "pickle.gz", tmpdir)

    # ---- lifetime ---------------------------------------------------------------------------
    @property
    def path(self):
        """The file the answers read (a temporary one for a dict or bytes)."""
        return self._path

    def close(self):
        """Removes the temporary file of a dict or bytes; the Snapshot cannot answer after it."""
        if self._cleanup:
            self._cleanup()
        self._path = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return f"<memsnap.Snapshot {self._name!r} ({self.format})>"

    def _file(self):
        if self._path is None:
            raise Error(f"{self._name}: the snapshot was closed")
        return self._path

    def _run(self, cmd, *args, ok_codes=(0,), flag="--json"):
        return self._named(_native.run_json([cmd, self._file(), *args], ok_codes, flag))

    def _named(self, doc):
        """The answer with the file named as the input was: "<dict>" for the temporary file of a
        dict, a relative path as given."""
        if self._path == self._name:
            return doc
        if isinstance(doc, dict):
            for k, v in doc.items():
                if v == self._path:
                    doc[k] = self._name
                elif isinstance(v, (dict, list)):
                    self._named(v)
        elif isinstance(doc, list):
            for v in doc:
                if isinstance(v, (dict, list)):
                    self._named(v)
        return doc

    # ---- answers ------------------------------------------------------------------------------
    def stats(self, at=None, device=None):
        """The segments and totals (`memsnap stats --json`): per device, reserved, allocated and
        free memory and the segment list; at="peak" etc. for an earlier moment."""
        return self._run("stats", *_opt("--at", at), *_opt("--device", device))

    def top(self, at="peak", by=None, n=_TOP_N, device=None):
        """The biggest consumers of allocated memory at a moment (`memsnap top --json`).
        at: "peak" (default), "peak-reserved", "end", "oom", an entry index or "t=US".
        by: what to group by, passed to `memsnap top --by` unchanged (stack, the default, frame,
        file, size, and whatever that command accepts). n: rows (0 = all)."""
        return self._run("top", *_opt("--at", at), *_opt("--by", by), *_opt("-n", n),
                         *_opt("--device", device))

    def timeline(self, segments=False, max_entries=None, device=None):
        """Memory over time: the data of PyTorch's viewer "Active Memory Timeline" (or with
        segments=True "Active Cached Segment Timeline"), as `memsnap timeline --viewer-data`."""
        return self._run("timeline", *(["--segments"] if segments else []),
                         *_opt("--max-entries", max_entries), *_opt("--device", device),
                         flag="--viewer-data")

    def timeline_report(self, steps=False, by_category=False, device=None):
        """What `memsnap timeline` prints, per device: the peaks of allocated and reserved memory
        (entry, time, the stacks alive then), the out-of-memory errors, with steps=True the peak
        of each step, the final state (`memsnap timeline --json`; docs/timeline.md)."""
        return self._run("timeline", *(["--steps"] if steps else []),
                         *(["--by", "category"] if by_category else []),
                         *_opt("--device", device))

    def explain(self, at=None, capacity=None, device=None):
        """Why memory ran out (or peaked) and which setting would have avoided it, proven by
        replays (`memsnap explain --json`; docs/explain.md names every field)."""
        return self._run("explain", *_opt("--at", at), *_opt("--capacity", capacity),
                         *_opt("--device", device))

    def replay(self, config=None, capacity=None, sweep=None, min_capacity=False, device=None):
        """Replays the trace through memsnap's allocator (`memsnap replay --json`): what-if under
        config (PYTORCH_CUDA_ALLOC_CONF syntax, e.g. "expandable_segments:True") or every
        combination of sweep ("max_split_size_mb=64,128;expandable_segments=False,True"); with
        neither, the fidelity check. Verdicts are in the result (FAIL, UNREPLAYABLE included), as
        the command prints them with exit status 1.
        capacity: "24GiB", a number of bytes, or "unlimited"."""
        if config is not None and sweep is not None:
            raise Error("replay: config and sweep exclude each other")
        if config is not None:
            mode = ["--config", config]
        elif sweep is not None:
            mode = ["--sweep", sweep]
        else:
            if min_capacity:
                raise Error("replay: min_capacity needs config or sweep")
            mode = ["--check"]
        return self._run("replay", *mode, *_opt("--capacity", capacity),
                         *(["--min-capacity"] if min_capacity else []), *_opt("--device", device),
                         ok_codes=(0, 1))

    def compare(self, other, stacks=False):
        """What differs between this snapshot (before) and other (after: a Snapshot, a path,
        bytes or a dict), as `memsnap compare --json` (with stacks=True: by stack)."""
        other = load(other)
        return other._named(self._named(_native.run_json(
            ["compare", self._file(), other._file(), *(["--stacks"] if stacks else [])])))

    # ---- exports ------------------------------------------------------------------------------
    def to_sqlite(self, path):
        """Writes a SQLite database (`memsnap export --sqlite`; docs/exports.md); returns path."""
        _native.run(["export", self._file(), "--sqlite", path])
        return os.fspath(path)

    def to_pprof(self, path, at=None, device=None):
        """Writes a gzipped pprof profile (`memsnap export --pprof`); returns path."""
        _native.run(["export", self._file(), "--pprof", path, *_opt("--at", at),
                     *_opt("--device", device)])
        return os.fspath(path)

    def save(self, path, format=None):
        """Writes the snapshot to path, complete or not at all: a PyTorch pickle for .pickle/.pkl,
        memsnap's format for .msgpack/.msnap, compressed for .gz/.msnapz (or format= "pickle",
        "memsnap", "memsnap-z"); returns path."""
        _native.run(["convert", self._file(), path, *_opt("--to", format)])
        return os.fspath(path)

    def view(self, device=None, view=None):
        """The offline viewer (`memsnap view`): a View, shown inline by Jupyter, or written to a
        file with .save("report.html")."""
        page = _native.run(["view", self._file(), "-o", "-", *_opt("--device", device),
                            *_opt("--view", view)])
        return View(page, self._name)


def _opt(flag, value):
    return [] if value is None else [flag, str(value)]


class View:
    """The viewer's page, whole and offline. In Jupyter it is shown in an iframe whose srcdoc is
    the page; .page is the page's bytes, .html its text; .save(path) writes it."""

    def __init__(self, page, name="snapshot", height=720):
        self.page, self.name, self.height = bytes(page), name, height

    @property
    def html(self):
        """The page as text. Its binary data is raw bytes under a windows-1252 declaration
        (docs/view.md, "The bytes of the page"): each byte becomes the character of the same code
        (latin-1), which the page's decoder reads back as that byte, in an iframe's srcdoc too."""
        return self.page.decode("latin-1")

    def save(self, path):
        """Writes the page to path (open it with a double-click: it needs no network)."""
        with open(path, "wb") as f:
            f.write(self.page)
        return os.fspath(path)

    def _repr_html_(self):
        doc = html.escape(self.html, quote=True)
        title = html.escape(f"memsnap view: {self.name}", quote=True)
        return (f'<iframe class="memsnap-view" title="{title}" srcdoc="{doc}" '
                f'style="width:100%;height:{int(self.height)}px;border:1px solid #ccc"></iframe>')

    def __repr__(self):
        return f"<memsnap.View of {self.name!r}: a page of {len(self.page)} bytes>"
