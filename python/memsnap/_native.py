# SPDX-License-Identifier: MIT
"""Where memsnap's program and libraries are, and the two ways of reaching them.

The wheel holds the command and the libraries inside the package: memsnap/bin/memsnap and
memsnap/lib/ (libmemsnap_core.so.0, libmemsnap_viz.so.0, libmemsnap_preload.so and the third-party
libraries they need, found through RUNPATH $ORIGIN). $MEMSNAP_PREFIX names another tree of the same
layout instead, such as a build directory (build/bin/memsnap, build/lib/...).

- ctypes over libmemsnap_core.so.0 for what the C library answers directly: reading and checking a
  snapshot (ms_snapshot_load), recognising a format (ms_format_detect), the version;
- the bundled `memsnap` program with --json for the answers the command line computes (top,
  explain, replay, ...): each run is a process of its own, so no input can crash the interpreter.
"""
import ctypes
import json
import os
import subprocess
import threading

from ._errors import Error

_HERE = os.path.dirname(os.path.abspath(__file__))
_lock = threading.Lock()
_lib = None

MS_FORMAT_NAMES = {0: "unknown", 1: "memsnap", 2: "memsnap-z", 3: "pickle"}


def prefix():
    """The directory that holds bin/memsnap and lib/."""
    env = os.environ.get("MEMSNAP_PREFIX")
    return os.path.abspath(env) if env else _HERE


def binary():
    """The path of the `memsnap` program this package runs."""
    path = os.path.join(prefix(), "bin", "memsnap")
    if not os.access(path, os.X_OK):
        raise Error(f"cannot find the memsnap program at '{path}' (a broken installation, or "
                    "MEMSNAP_PREFIX names a directory without bin/memsnap)")
    return path


class _ErrBuf(ctypes.Structure):
    _fields_ = [("msg", ctypes.c_char * 512)]


def lib():
    """libmemsnap_core.so.0, loaded once, with the prototypes this package uses."""
    global _lib
    with _lock:
        if _lib is not None:
            return _lib
        path = os.path.join(prefix(), "lib", "libmemsnap_core.so.0")
        try:
            so = ctypes.CDLL(path)
        except OSError as e:
            raise Error(f"cannot load memsnap's library: {e}") from None
        so.ms_snapshot_load.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p),
                                        ctypes.POINTER(_ErrBuf)]
        so.ms_snapshot_load.restype = ctypes.c_int
        so.ms_snapshot_free.argtypes = [ctypes.c_void_p]
        so.ms_snapshot_free.restype = None
        so.ms_format_detect.argtypes = [ctypes.c_char_p, ctypes.c_size_t]
        so.ms_format_detect.restype = ctypes.c_int
        so.ms_strerror.argtypes = [ctypes.c_int]
        so.ms_strerror.restype = ctypes.c_char_p
        so.ms_version_string.argtypes = []
        so.ms_version_string.restype = ctypes.c_char_p
        _lib = so
        return so


def version():
    """The C library's version, e.g. "0.1.0"."""
    return lib().ms_version_string().decode()


def format_detect(head):
    """The format that the first bytes of a file (up to 4096) say: "memsnap", "memsnap-z",
    "pickle" or "unknown"."""
    return MS_FORMAT_NAMES.get(lib().ms_format_detect(head, len(head)), "unknown")


def check_file(path):
    """Reads the whole snapshot at path with the library's reader (every format) and frees it.
    Raises Error with the reader's message (what is wrong and where) when it is refused."""
    so = lib()
    snap = ctypes.c_void_p()
    eb = _ErrBuf()
    rc = so.ms_snapshot_load(os.fsencode(path), ctypes.byref(snap), ctypes.byref(eb))
    if rc != 0:
        msg = eb.msg.decode("utf-8", "replace") or so.ms_strerror(rc).decode()
        raise Error(msg)
    so.ms_snapshot_free(snap)


def run(args, ok_codes=(0,)):
    """Runs `memsnap ARGS...` and returns its standard output (bytes). A failure raises Error with
    the program's own message (its `memsnap: error: ` lines, without the prefix); ok_codes other
    than 0 are answers too where the program printed one (replay: a FAIL or UNREPLAYABLE device)."""
    try:
        p = subprocess.run([binary()] + [os.fspath(a) for a in args], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, check=False)
    except OSError as e:
        raise Error(f"cannot run memsnap: {e}") from None
    if p.returncode not in ok_codes or (p.returncode != 0 and not p.stdout.strip()):
        raise Error(_message(p.stderr, p.returncode))
    return p.stdout


def run_json(args, ok_codes=(0,), flag="--json"):
    """run() with flag appended (--json, or `timeline`'s --viewer-data); the parsed document."""
    out = run(list(args) + [flag], ok_codes)
    try:
        return json.loads(out)
    except ValueError as e:
        raise Error(f"memsnap {args[0]} {flag} printed no JSON document ({e})") from None


def _message(stderr, rc):
    text = stderr.decode("utf-8", "replace").strip()
    lines = [ln for ln in text.splitlines() if ln.strip()]
    errs = [ln.split("memsnap: error: ", 1)[1] for ln in lines if "memsnap: error: " in ln]
    if errs:
        return "; ".join(errs)
    if rc < 0:
        return f"memsnap was killed by signal {-rc}" + (f": {lines[-1]}" if lines else "")
    return lines[-1] if lines else f"memsnap failed (exit status {rc})"
