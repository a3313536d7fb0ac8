#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""Checks that the user documents speak to users (issue #32 item 13).

    scripts/check-docs.py [ROOT]        (ROOT: the source tree, default: this script's ../)

The user documents are README.md and docs/*.md but the ones for whoever works on memsnap
(DEV_DOCS) and docs/dev/, where development history and measurement logs belong. Fails (exit 1),
naming the file and line, on:
  - "stop N": a step of the development history;
  - a word that looks like a commit hash (7 to 40 hex digits, with a letter and a digit);
  - an issue number of the project: "#N" or "issue N" (PyTorch's, written "PyTorch #N" or
    "PyTorch issue #N", are references for users and pass, as PyTorch's commits written
    "PyTorch commit HASH" do);
  - the development machine ("2-core", "development VM").
"""
import glob
import os
import re
import sys

DEV_DOCS = {"contributing.md", "architecture.md", "adding-a-backend.md", "adding-a-subcommand.md"}

RULES = [
    ("a development step ('stop N')", re.compile(r"\b[Ss]top \d+\b")),
    ("a commit hash", re.compile(r"(?<!PyTorch commit )(?<!PyTorch commit `)"
                                 r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")),
    ("an issue number", re.compile(r"(?<!PyTorch )(?<!PyTorch issue )(?<![\w&/#])#\d+\b|"
                                   r"(?<!PyTorch )\b[Ii]ssues? #?\d+")),
    ("the development machine", re.compile(r"\b2-core\b|\bdevelopment (VM|machine)\b")),
]


def user_docs(root):
    docs = [os.path.join(root, "README.md")]
    for p in sorted(glob.glob(os.path.join(root, "docs", "*.md"))):
        if os.path.basename(p) not in DEV_DOCS:
            docs.append(p)
    return docs


def check(root):
    bad = 0
    for path in user_docs(root):
        rel = os.path.relpath(path, root)
        with open(path, encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                for what, rx in RULES:
                    m = rx.search(line)
                    if m:
                        print(f"{rel}:{n}: {what} in a user document: '{m.group(0)}' "
                              "(development history belongs in docs/dev/)")
                        bad += 1
    return bad


def main():
    root = sys.argv[1] if len(sys.argv) > 1 else os.path.join(os.path.dirname(__file__), "..")
    bad = check(root)
    if bad:
        print(f"check-docs: {bad} problem(s)", file=sys.stderr)
        return 1
    print("check-docs: the user documents speak to users")
    return 0


if __name__ == "__main__":
    sys.exit(main())
