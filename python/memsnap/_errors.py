# SPDX-License-Identifier: MIT
"""memsnap.Error: every failure of this package, with the C library's or the command's message."""


class Error(Exception):
    """A snapshot that cannot be read, an answer that cannot be given, a missing dependency.
    str(e) is the library's own message, e.g. "'x.pickle': truncated at byte 42 ..."."""
