#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks the module rule of docs/architecture.md on the #include lines of memsnap's own files.

    scripts/check-deps.py [ROOT]        (ROOT: the source tree, default: this script's ../)

Fails (exit 1), naming the file, line and include, on:
  - an include that points up: from a module to one of a higher layer, or to a sibling module of
    the same layer (the layers are LAYERS below, lowest first);
  - a private header of lib/ included from viz/ or cli/ (they see include/memsnap/ only);
  - a third-party header outside the one file allowed to include it (THIRD_PARTY);
  - a quoted include that resolves to no file of the tree, or a file in no known module;
  - a circle of includes between files (a file's .c and .h count as one node).
Files under tests/, bench/ and samples/, and the umbrella include/memsnap.h, may include anything:
they sit above every module.
"""
import os
import re
import sys
from fnmatch import fnmatch

# The layers, lowest first. A module may include its own files and those of lower layers.
LAYERS = [
    ["common"],
    ["model"],
    ["backend"],
    ["alloc"],
    ["history"],
    ["snapshot"],
    ["timeline"],
    ["attribution"],
    ["replay", "export", "interpose", "cache"],
    ["explain"],
    ["viz/flamegraph"],
    ["viz/views", "viz/view"],
    ["cli"],
]

# Public headers: the module each belongs to (a new header must be added here).
PUBLIC = {
    "common.h": "common", "error.h": "common", "options.h": "common",
    "snapshot.h": "model",
    "backend.h": "backend",
    "allocator.h": "alloc", "config.h": "alloc", "stats.h": "alloc",
    "history.h": "history",
    "serialize.h": "snapshot", "pickle.h": "snapshot",
    "timeline.h": "timeline", "attribution.h": "attribution",
    "replay.h": "replay", "export.h": "export", "interpose.h": "interpose",
    "explain.h": "explain", "compare.h": "explain", "cache.h": "cache",
    "viz.h": "viz/flamegraph", "views.h": "viz/views", "view.h": "viz/view",
}

# Third-party headers (glob) -> the files (glob, relative to ROOT) allowed to include them.
THIRD_PARTY = {
    "msgpack.h": ["lib/snapshot/msgpack*"],
    "zlib.h": ["lib/snapshot/zio.c", "lib/export/pprof.c", "lib/export/pgzip.c"],
    "cuda*.h": ["lib/backend/cuda.c", "lib/backend/cudart.[ch]", "lib/interpose/*.c"],
    "execinfo.h": ["lib/history/backtrace.c"],
    "elfutils/*": ["lib/history/symbolize.c"],
    "libxml/*": ["viz/flamegraph/svg.c"],
    "sqlite3.h": ["lib/export/sqlite.c"],
}

TOP = ("tests/", "bench/", "samples/")
INCLUDE_RE = re.compile(r'^\s*#\s*include\s*([<"])([^>"]+)[>"]')


def layer_of(module):
    for i, mods in enumerate(LAYERS):
        if module in mods:
            return i
    return None


def module_of(rel):
    """The module of a file path relative to ROOT, 'top' for tests/bench/samples, or None."""
    parts = rel.split("/")
    if rel.startswith(TOP) or rel == "include/memsnap.h":  # the umbrella header includes all
        return "top"
    if parts[0] == "include" and len(parts) == 3 and parts[1] == "memsnap":
        return PUBLIC.get(parts[2])
    if parts[0] == "lib" and len(parts) >= 3:
        return parts[1]
    if parts[0] == "viz" and len(parts) >= 3:
        return "viz/" + parts[1]
    if parts[0] == "cli":
        return "cli"
    return None


def sources(root):
    for top in ("lib", "viz", "cli", "include", "tests", "bench", "samples"):
        base = os.path.join(root, top)
        for dp, dn, fn in os.walk(base):
            dn[:] = sorted(d for d in dn if not d.startswith("."))
            for f in sorted(fn):
                if f.endswith((".c", ".h")):
                    yield os.path.relpath(os.path.join(dp, f), root)


def resolve(root, rel, inc):
    """Where a quoted include of file rel lands, as the build's include paths find it."""
    here = os.path.dirname(rel)
    for base in (here, "lib", "viz", "include", "cli", "tests", "bench", "samples/cuda"):
        cand = os.path.normpath(os.path.join(base, inc))
        if os.path.isfile(os.path.join(root, cand)):
            return cand
    return None


def node(rel):
    return rel[:-2] if rel.endswith((".c", ".h")) else rel


def find_cycles(graph):
    """Tarjan's strongly connected components; returns the components of more than one node."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        while work:
            u, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[u])
                if low[u] == index[u]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == u:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
            elif nxt not in index:
                index[nxt] = low[nxt] = counter[0]
                counter[0] += 1
                stack.append(nxt)
                on.add(nxt)
                work.append((nxt, iter(sorted(graph.get(nxt, ())))))
            elif nxt in on:
                low[u] = min(low[u], index[nxt])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def check(root):
    errors = []
    graph = {}
    nfiles = nincludes = 0
    for rel in sources(root):
        nfiles += 1
        mod = module_of(rel)
        if mod is None or (mod != "top" and layer_of(mod) is None):
            errors.append(f"{rel}: in no module of the rule (scripts/check-deps.py LAYERS/PUBLIC)")
            continue
        with open(os.path.join(root, rel), encoding="utf-8", errors="replace") as fh:
            lines = fh.readlines()
        for ln, line in enumerate(lines, 1):
            m = INCLUDE_RE.match(line)
            if not m:
                continue
            nincludes += 1
            kind, inc = m.groups()
            where = f"{rel}:{ln}: #include {kind}{inc}{'>' if kind == '<' else kind}"
            if kind == "<":
                for pat, allowed in THIRD_PARTY.items():
                    if fnmatch(inc, pat) and mod != "top" and \
                            not any(fnmatch(rel, a) for a in allowed):
                        errors.append(f"{where}: third-party header outside {', '.join(allowed)}")
                continue
            target = resolve(root, rel, inc)
            if target is None:
                errors.append(f"{where}: no such file in the tree")
                continue
            graph.setdefault(node(rel), set()).add(node(target))
            if mod == "top":
                continue
            tmod = module_of(target)
            if tmod is None or tmod == "top" or layer_of(tmod) is None:
                errors.append(f"{where}: {target} is in no module of the rule")
                continue
            if tmod == mod:
                continue
            if (mod.startswith("viz/") or mod == "cli") and not target.startswith(
                    ("include/", "viz/" if mod.startswith("viz/") else "cli/")):
                errors.append(f"{where}: {mod} sees only the public headers, not {target}")
                continue
            lf, lt = layer_of(mod), layer_of(tmod)
            if lt > lf:
                errors.append(f"{where}: points up, from {mod} to {tmod} (the rule: "
                              + " <- ".join("/".join(x) for x in LAYERS) + ")")
            elif lt == lf:
                errors.append(f"{where}: {mod} and {tmod} are siblings of one layer")
    for comp in find_cycles(graph):
        errors.append("circle of includes: " + " -> ".join(comp + [comp[0]]))
    return errors, nfiles, nincludes


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    root = os.path.abspath(root)
    errors, nfiles, nincludes = check(root)
    for e in errors:
        print("check-deps: " + e, file=sys.stderr)
    if errors:
        print(f"check-deps: {len(errors)} problem(s) in {nfiles} files", file=sys.stderr)
        return 1
    print(f"check-deps: {nfiles} files, {nincludes} includes follow the rule")
    return 0


if __name__ == "__main__":
    sys.exit(main())
