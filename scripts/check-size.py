#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks the size rule of docs/architecture.md on memsnap's own C sources.

    scripts/check-size.py [ROOT]

Fails (exit 1), naming the file (and function), on a source file of lib/, viz/ or cli/ longer than
MAX_FILE lines, or a function longer than MAX_FUNC lines. Tables (initialisers) are not functions
and are not counted. A function is found the way the house style writes one: its declarator starts
in column 0, its body opens with `{` at the end of the declarator's last line and closes with `}` in
column 0.
"""
import os
import re
import sys

MAX_FILE = 1000
MAX_FUNC = 120
DIRS = ("lib", "viz", "cli")

DECL_START = re.compile(r"^[A-Za-z_][\w \t\*]*\b(\w+)\s*\(")
NOT_FUNC = re.compile(r"^(typedef|struct\s+\w+\s*\{|enum|union|#|extern\s+\"C\")")


def functions(lines):
    """Yields (name, first line, number of lines) of each function definition."""
    cand = None
    start = None
    for i, line in enumerate(lines):
        if start is None:
            m = DECL_START.match(line)
            if m and not NOT_FUNC.match(line) and not line.rstrip().endswith(";"):
                cand = (i, m.group(1))
            if cand and line.rstrip().endswith("{") and "=" not in line.split("(")[0]:
                start, cand = cand, None
            elif line.rstrip().endswith(";"):
                cand = None
        elif line.startswith("}"):
            yield start[1], start[0] + 1, i - start[0] + 1
            start = None


def check(root):
    errors = []
    nfiles = nfuncs = 0
    for top in DIRS:
        for dp, dn, fn in os.walk(os.path.join(root, top)):
            dn[:] = sorted(dn)
            for f in sorted(fn):
                if not f.endswith((".c", ".h")):
                    continue
                path = os.path.join(dp, f)
                rel = os.path.relpath(path, root)
                with open(path, encoding="utf-8", errors="replace") as fh:
                    lines = fh.read().splitlines()
                nfiles += 1
                if len(lines) > MAX_FILE:
                    errors.append(f"{rel}: {len(lines)} lines (the rule: at most {MAX_FILE}; "
                                  "split it by concern)")
                for name, first, n in functions(lines):
                    nfuncs += 1
                    if n > MAX_FUNC:
                        errors.append(f"{rel}:{first}: {name}() is {n} lines (the rule: at most "
                                      f"{MAX_FUNC})")
    return errors, nfiles, nfuncs


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    errors, nfiles, nfuncs = check(os.path.abspath(root))
    for e in errors:
        print("check-size: " + e, file=sys.stderr)
    if errors:
        print(f"check-size: {len(errors)} problem(s)", file=sys.stderr)
        return 1
    print(f"check-size: {nfiles} files, {nfuncs} functions within {MAX_FILE} and {MAX_FUNC} lines")
    return 0


if __name__ == "__main__":
    sys.exit(main())
