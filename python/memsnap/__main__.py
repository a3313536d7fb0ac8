# SPDX-License-Identifier: MIT
"""The `memsnap` command that pip puts on PATH (and `python -m memsnap`): the bundled program, run
in place of this process with the same arguments, so its exit status and output are the
program's own."""
import os
import sys

from . import _native
from ._errors import Error


def main():
    try:
        path = _native.binary()
    except Error as e:
        sys.stderr.write(f"memsnap: error: {e}\n")
        return 1
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execv(path, ["memsnap"] + sys.argv[1:])
    except OSError as e:
        sys.stderr.write(f"memsnap: error: cannot run '{path}': {e.strerror or e}\n")
    return 1


if __name__ == "__main__":
    sys.exit(main())
