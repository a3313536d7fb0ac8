# SPDX-License-Identifier: MIT
"""The Python package against the command line (ctest "python", issue #29): every method on every
PyTorch fixture gives the document of the CLI's --json (or raises memsnap.Error with the CLI's own
message where the CLI fails); a dict equals its file; hostile and truncated bytes raise
memsnap.Error and never take the interpreter down; record() against a fake torch.
Run by tests/python/run.sh: MEMSNAP_PREFIX is the build tree, PYTHONPATH the source's python/."""
import gzip
import json
import os
import pickle
import random
import sqlite3
import subprocess
import sys
import types

import pytest

import memsnap
from memsnap import _native

FIXTURES = os.environ.get("MEMSNAP_TORCH_FIXTURES", "")
PICKLES = sorted(f for f in os.listdir(FIXTURES) if f.endswith(".pickle")) \
    if FIXTURES and os.path.isdir(FIXTURES) else []
BIN = os.path.join(os.environ["MEMSNAP_PREFIX"], "bin", "memsnap")
SMALL = os.path.join(os.path.dirname(__file__), "..", "fuzz", "corpus", "fuzz_msgpack",
                     "small.msgpack")

needs_fixtures = pytest.mark.skipif(not PICKLES, reason="SKIP: no PyTorch fixtures")


def cli(*args):
    """(document or None, error message or None) of `memsnap ARGS --json` (`timeline`'s viewer
    data: ARGS ending in --viewer-data)."""
    flag = [] if args[-1] == "--viewer-data" else ["--json"]
    p = subprocess.run([BIN, *args, *flag], capture_output=True)
    if p.returncode == 0 or (args[0] == "replay" and p.returncode == 1 and p.stdout.strip()):
        return json.loads(p.stdout), None
    lines = [ln.split("memsnap: error: ", 1)[1] for ln in p.stderr.decode().splitlines()
             if "memsnap: error: " in ln]
    return None, "; ".join(lines)


def same(call, args):
    """call() (a method of a Snapshot) answers as `memsnap ARGS --json` does."""
    want, err = cli(*args)
    if err is not None:
        with pytest.raises(memsnap.Error) as e:
            call()
        assert str(e.value) == err
        return None
    got = call()
    assert got == want
    return got


# every method, as (name, python call on a Snapshot, the CLI's arguments after FILE)
METHODS = [
    ("stats", lambda s: s.stats(), ["stats"]),
    ("stats_peak", lambda s: s.stats(at="peak"), ["stats", "--at", "peak"]),
    ("top", lambda s: s.top(), ["top", "--at", "peak", "-n", "20"]),
    ("top_by_file", lambda s: s.top(by="file", n=5), ["top", "--at", "peak", "--by", "file", "-n", "5"]),
    ("top_by_size_end", lambda s: s.top(at="end", by="size", n=0), ["top", "--at", "end", "--by", "size", "-n", "0"]),
    ("timeline", lambda s: s.timeline(), ["timeline", "--viewer-data"]),
    ("timeline_segments", lambda s: s.timeline(segments=True),
     ["timeline", "--segments", "--viewer-data"]),
    ("timeline_report", lambda s: s.timeline_report(), ["timeline"]),
    ("timeline_report_steps", lambda s: s.timeline_report(steps=True, by_category=True),
     ["timeline", "--steps", "--by", "category"]),
    ("explain", lambda s: s.explain(), ["explain"]),
    ("replay_check", lambda s: s.replay(), ["replay", "--check"]),
    ("replay_config", lambda s: s.replay(config="expandable_segments:True", capacity="unlimited"),
     ["replay", "--config", "expandable_segments:True", "--capacity", "unlimited"]),
]


@needs_fixtures
@pytest.mark.parametrize("fixture", PICKLES)
@pytest.mark.parametrize("name,call,args", METHODS, ids=[m[0] for m in METHODS])
def test_method_equals_cli(fixture, name, call, args):
    path = os.path.join(FIXTURES, fixture)
    snap = memsnap.load(path)
    same(lambda: call(snap), [args[0], path, *args[1:]])


@needs_fixtures
@pytest.mark.parametrize("fixture", PICKLES)
def test_compare_equals_cli(fixture):
    a = os.path.join(FIXTURES, fixture)
    b = os.path.join(FIXTURES, PICKLES[0])
    same(lambda: memsnap.load(a).compare(b), ["compare", a, b])
    same(lambda: memsnap.load(a).compare(memsnap.load(b), stacks=True), ["compare", a, b, "--stacks"])


@needs_fixtures
@pytest.mark.parametrize("fixture", PICKLES)
def test_exports_equal_cli(fixture, tmp_path):
    path = os.path.join(FIXTURES, fixture)
    snap = memsnap.load(path, check=True)
    # save: the snapshot converted, as `memsnap convert`; read back, the same answers
    for ext in ("msgpack", "pickle", "msnapz"):
        out = snap.save(tmp_path / f"s.{ext}")
        subprocess.run([BIN, "convert", path, str(tmp_path / f"c.{ext}")], check=True)
        if ext != "msnapz":  # (compressed: the same snapshot, the deflate stream may differ)
            assert open(out, "rb").read() == open(tmp_path / f"c.{ext}", "rb").read()
        assert memsnap.load(out).stats()["segments"] == snap.stats()["segments"]
    # SQLite: the same rows as the CLI's database
    db = snap.to_sqlite(tmp_path / "py.db")
    subprocess.run([BIN, "export", path, "--sqlite", str(tmp_path / "cli.db")], check=True)
    rows = lambda f: sqlite3.connect(f).execute(
        "SELECT count(*), sum(size) FROM blocks").fetchone()
    assert rows(db) == rows(tmp_path / "cli.db")
    # pprof: the same profile bytes (gzip with a fixed header)
    p = subprocess.run([BIN, "export", path, "--pprof", str(tmp_path / "cli.pb.gz")])
    if p.returncode == 0:
        snap.to_pprof(tmp_path / "py.pb.gz")
        assert gzip.open(tmp_path / "py.pb.gz").read() == gzip.open(tmp_path / "cli.pb.gz").read()
    else:
        with pytest.raises(memsnap.Error):
            snap.to_pprof(tmp_path / "py.pb.gz")
    # the viewer: the page of `memsnap view`, whole, and in an iframe's srcdoc
    page = subprocess.run([BIN, "view", path, "-o", "-"], capture_output=True, check=True).stdout
    view = snap.view()
    assert view.page == page
    assert open(view.save(tmp_path / "r.html"), "rb").read() == page
    h = view._repr_html_()
    assert h.startswith("<iframe") and "srcdoc=" in h and "memsnapView" in h
    assert view.html.encode("latin-1") == page


# the answers that read the whole snapshot in different ways (state, trace, time index, replays)
DICT_METHODS = ("stats", "top", "timeline", "timeline_report", "explain", "replay_check")


@needs_fixtures
@pytest.mark.parametrize("fixture", PICKLES)
def test_dict_equals_file(fixture):
    path = os.path.join(FIXTURES, fixture)
    with open(path, "rb") as f:
        obj = pickle.load(f)
        raw = open(path, "rb").read()
    by_file = memsnap.load(path)
    with memsnap.load(obj) as by_dict, memsnap.load(raw) as by_bytes:
        assert by_dict.format == "pickle" and repr(by_dict) == "<memsnap.Snapshot '<dict>' (pickle)>"
        for name, call, args in METHODS:
            if name not in DICT_METHODS:
                continue
            want = err = None
            try:
                want = call(by_file)
            except memsnap.Error as e:
                err = str(e)
            for other, label in ((by_dict, "<dict>"), (by_bytes, "<bytes>")):
                if err is not None:
                    with pytest.raises(memsnap.Error):
                        call(other)
                    continue
                got = call(other)
                if isinstance(want, dict) and want.get("file") == path:
                    assert got.get("file") == label, name
                    got = dict(got, file=path)
                assert got == want, (name, label)
        tmp = by_dict.path
        assert os.path.exists(tmp)
    if isinstance(obj, dict):  # PyTorch 1.x's form: the bare list of segments
        by_list = memsnap.load(obj["segments"])
        assert repr(by_list) == "<memsnap.Snapshot '<list>' (pickle)>"
        assert by_list.stats()["segments"] == by_file.stats()["segments"]
    assert not os.path.exists(tmp)  # removed at the with block's end


@needs_fixtures
def test_truncated_bytes_raise():
    for fixture in PICKLES:
        raw = open(os.path.join(FIXTURES, fixture), "rb").read()
        for cut in sorted({1, 2, 5, 16, 100, len(raw) // 3, len(raw) // 2, len(raw) - 1}):
            if cut >= len(raw):
                continue
            with pytest.raises(memsnap.Error) as e:
                memsnap.load(raw[:cut])
            assert str(e.value).startswith("<bytes>"), str(e.value)
        gz = gzip.compress(raw)
        assert memsnap.load(gz).stats() == memsnap.load(raw).stats()
        with pytest.raises(memsnap.Error):
            memsnap.load(gz[: len(gz) // 2])


def test_hostile_bytes_raise():
    rng = random.Random(29)
    base = open(SMALL, "rb").read()
    cases = [b"", b"\x80", b"\x80\x04\x95", b"\x1f\x8b" + bytes(64), b"not a snapshot at all",
             pickle.dumps({"segments": [1, 2, 3]}), pickle.dumps([[[[[]]]]] * 3),
             b"\x80\x04(" * 100000, pickle.dumps({"segments": [], "device_traces": [[{"action": 7}]]}),
             # code: refused by the reader, never run
             b"cos\nsystem\n(S'echo pwned'\ntR."]
    if PICKLES:
        base = open(os.path.join(FIXTURES, "a0kuma_adamw_small.pickle"), "rb").read() \
            if "a0kuma_adamw_small.pickle" in PICKLES else base
    for _ in range(300):  # random byte mutations: accepted or refused, never a crash
        b = bytearray(base)
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        cases.append(bytes(b))
    refused = 0
    for c in cases:
        try:
            memsnap.load(c).close()
        except memsnap.Error as e:
            refused += 1
            assert str(e) and "<bytes>" in str(e)
    assert refused >= 10


class Tensor:  # what a user might leave in a snapshot dict
    pass


def test_junk_in_dict():
    with pytest.raises(memsnap.Error) as e:
        memsnap.load({"segments": [{"blocks": [{"frames": [object()]}]}]})
    assert "snapshot['segments'][0]['blocks'][0]['frames'][0] is of type 'object'" in str(e.value)
    with pytest.raises(memsnap.Error) as e:
        memsnap.load({"segments": [], "device_traces": [[{"action": "alloc", "x": Tensor()}]]})
    assert "snapshot['device_traces'][0][0]['x'] is of type 'Tensor'" in str(e.value)
    with pytest.raises(memsnap.Error) as e:
        memsnap.load({"segments": [], "device_traces": [[{"action": "alloc", "f": lambda: 0}]]})
    assert "is of type 'function'" in str(e.value)
    with pytest.raises(memsnap.Error) as e:
        memsnap.load({"segments": [], "device_traces": []}).top()  # plain data, but no trace
    with pytest.raises(TypeError):
        memsnap.load(42)


def test_errors_carry_the_message(tmp_path):
    with pytest.raises(memsnap.Error) as e:
        memsnap.load(tmp_path / "missing.pickle")
    assert "missing.pickle" in str(e.value)
    (tmp_path / "x.bin").write_bytes(b"hello world, not a snapshot")
    with pytest.raises(memsnap.Error) as e:
        memsnap.load(tmp_path / "x.bin")
    assert "not a memsnap snapshot or PyTorch pickle" in str(e.value)
    s = memsnap.load(SMALL)
    # `by` passes through unchanged: whatever the CLI refuses, with its message
    want = cli("top", SMALL, "--by", "no-such-key")[1]
    with pytest.raises(memsnap.Error) as e:
        s.top(by="no-such-key")
    assert str(e.value) == want and "no-such-key" in want
    with pytest.raises(memsnap.Error):
        s.save(tmp_path / "out.unknown-extension")
    s.close()
    with pytest.raises(memsnap.Error):
        s.stats()


def test_file_refused_by_the_reader(tmp_path):
    """A file is read by each answer (or at load with check=True): a truncated one raises there
    with the reader's message, as the CLI prints it."""
    raw = open(SMALL, "rb").read()
    bad = tmp_path / "cut.msgpack"
    bad.write_bytes(raw[: len(raw) // 2])
    s = memsnap.load(bad)  # the head says memsnap's format
    want = cli("stats", str(bad))[1]
    assert want and "cut.msgpack" in want
    with pytest.raises(memsnap.Error) as e:
        s.stats()
    assert str(e.value) == want
    with pytest.raises(memsnap.Error) as e:
        memsnap.load(bad, check=True)
    assert "cut.msgpack" in str(e.value)


def test_relative_path_survives_chdir(tmp_path, monkeypatch):
    with open(SMALL, "rb") as f:
        (tmp_path / "s.msgpack").write_bytes(f.read())
    monkeypatch.chdir(tmp_path)
    s = memsnap.load("s.msgpack")
    want = cli("stats", "s.msgpack")[0]
    monkeypatch.chdir("/")
    assert s.stats() == want and want["file"] == "s.msgpack"


def test_version_and_command():
    out = subprocess.run([sys.executable, "-m", "memsnap", "version"], capture_output=True,
                         text=True, check=True).stdout
    assert out.split()[-1] == memsnap.__version__
    p = subprocess.run([sys.executable, "-m", "memsnap", "stats", "/nonexistent"],
                       capture_output=True, text=True)
    assert p.returncode == 1 and "memsnap: error:" in p.stderr


# ---- record(), against a fake torch --------------------------------------------------------
class FakeTorch(types.ModuleType):
    def __init__(self, cuda_ok=True):
        super().__init__("torch")
        self.calls, self.observers = [], []
        memory = types.SimpleNamespace(
            _record_memory_history=lambda **kw: self.calls.append(("record", kw)),
            _dump_snapshot=self._dump)
        self.cuda = types.SimpleNamespace(is_available=lambda: cuda_ok, memory=memory)
        self._C = types.SimpleNamespace(
            _cuda_attach_out_of_memory_observer=self.observers.append)

    def _dump(self, path):
        self.calls.append(("dump", path))
        with open(SMALL, "rb") as src, open(path, "wb") as dst:
            dst.write(src.read())


def test_record_with_fake_torch(tmp_path, monkeypatch):
    torch = FakeTorch()
    monkeypatch.setitem(sys.modules, "torch", torch)
    path = tmp_path / "run.pickle"
    with pytest.raises(RuntimeError):
        with memsnap.record(path, max_entries=1234) as rec:
            assert torch.calls == [("record", {"enabled": "all", "context": "all",
                                               "stacks": "all", "max_entries": 1234})]
            assert len(torch.observers) == 1
            torch.observers[0](0, 1 << 30, 0, 0)  # an OOM inside the block
            raise RuntimeError("CUDA out of memory")
    oom = str(tmp_path / "run.oom1.pickle")
    assert rec.oom_paths == [oom]
    assert torch.calls[1:] == [("dump", oom), ("dump", str(path)), ("record", {"enabled": None})]
    assert memsnap.load(rec.path, check=True).stats() == memsnap.load(SMALL).stats() | {"file": str(path)}
    torch.observers[0](0, 1, 0, 0)  # after the block: inactive
    assert len(torch.calls) == 4
    with memsnap.record(tmp_path / "b.pickle", on_oom=False):
        pass
    assert len(torch.observers) == 1


def test_record_without_torch_or_cuda(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    with pytest.raises(memsnap.Error) as e:
        with memsnap.record():
            pass
    assert "torch cannot be imported" in str(e.value)
    monkeypatch.setitem(sys.modules, "torch", FakeTorch(cuda_ok=False))
    with pytest.raises(memsnap.Error) as e:
        with memsnap.record():
            pass
    assert "torch.cuda.is_available() is False" in str(e.value)


def test_magic_view(tmp_path):
    from memsnap import _magic
    with open(SMALL, "rb") as f:
        ns = {"raw": f.read(), "snap": memsnap.load(SMALL)}
    page = subprocess.run([BIN, "view", SMALL, "-o", "-"], capture_output=True, check=True).stdout
    assert _magic.memsnap_view(SMALL, ns).page == page
    assert b"memsnapView" in _magic.memsnap_view("raw --view segments --height 300", ns).page
    v = _magic.memsnap_view("snap", ns)
    assert v.page == page
    with pytest.raises(memsnap.Error):
        _magic.memsnap_view("", ns)
    with pytest.raises(memsnap.Error):
        _magic.memsnap_view(str(tmp_path / "nothing.pickle"), ns)
