#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks that the files of cli/ call each other in no circle (issue #32 item 17).

    scripts/check-calls.py OBJDIR        (OBJDIR: the memsnap program's object files, e.g.
                                          build/cli/CMakeFiles/memsnap.dir)

The module rule (scripts/check-deps.py) orders the #include lines; within cli/ every file
includes cli.h, so the order of calls is checked here, at link level: `nm` gives each object
file's defined and undefined symbols, a call from A to a function that B defines is an edge
A -> B, and the check fails (exit 1) on a circle of edges, naming its files. main.c, which
calls every command, and the commands, which call the helpers, must form a tree of layers: a
helper never calls back into main.c or into a command.
"""
import glob
import os
import subprocess
import sys


def symbols(obj):
    out = subprocess.run(["nm", "-P", obj], check=True, capture_output=True, text=True).stdout
    defined, undefined = set(), set()
    for line in out.splitlines():
        parts = line.split()
        if len(parts) < 2:
            continue
        name, kind = parts[0], parts[1]
        if kind in ("T", "D", "B", "R", "W", "V"):
            defined.add(name)
        elif kind == "U":
            undefined.add(name)
    return defined, undefined


def graph(objdir):
    objs = sorted(glob.glob(os.path.join(objdir, "*.o")))
    if not objs:
        sys.exit(f"check-calls: no object files in {objdir}")
    names = {o: os.path.basename(o)[:-len(".c.o")] + ".c" for o in objs}
    defs, undefs = {}, {}
    for o in objs:
        defs[o], undefs[o] = symbols(o)
    owner = {}
    for o in objs:
        for s in defs[o]:
            owner[s] = o
    edges = {names[o]: set() for o in objs}
    for o in objs:
        for s in undefs[o]:
            t = owner.get(s)
            if t and t != o:
                edges[names[o]].add(names[t])
    return edges


def cycles(edges):
    """The strongly connected components of more than one file (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return out


def main():
    edges = graph(sys.argv[1])
    bad = cycles(edges)
    for comp in bad:
        calls = [f"{a} -> {b}" for a in comp for b in sorted(edges[a]) if b in comp]
        print("check-calls: a circle of calls between " + ", ".join(comp) + ": " + "; ".join(calls))
    if bad:
        return 1
    print(f"check-calls: {len(edges)} files of cli/ call each other in no circle")
    return 0


if __name__ == "__main__":
    sys.exit(main())
