# SPDX-License-Identifier: MIT
"""The IPython extension: `%load_ext memsnap`, then `%memsnap_view snap.pickle` or
`%memsnap_view VARIABLE` (a snapshot dict, bytes, a path or a memsnap.Snapshot), optionally with
`--device N`, `--view NAME` (timeline, pools, segments, history, settings, flame) and
`--height PX`."""
import shlex

from ._errors import Error
from ._snapshot import Snapshot, load


def _parse(line):
    try:
        args = shlex.split(line)
    except ValueError as e:
        raise Error(f"%memsnap_view: {e}") from None
    opts, rest = {}, []
    it = iter(args)
    for a in it:
        if a in ("--device", "--view", "--height"):
            try:
                opts[a[2:]] = next(it)
            except StopIteration:
                raise Error(f"%memsnap_view: {a} needs a value") from None
        else:
            rest.append(a)
    if len(rest) != 1:
        raise Error("usage: %memsnap_view FILE|VARIABLE [--device N] [--view NAME] [--height PX]")
    return rest[0], opts


def memsnap_view(line, user_ns):
    """The viewer of a snapshot file or of the snapshot a variable holds, as a memsnap.View."""
    target, opts = _parse(line)
    if target.isidentifier() and target in user_ns:
        value = user_ns[target]
        snap = value if isinstance(value, Snapshot) else load(value)
    else:
        snap = load(target)
    view = snap.view(device=opts.get("device"), view=opts.get("view"))
    if "height" in opts:
        try:
            view.height = int(opts["height"])
        except ValueError:
            raise Error(f"%memsnap_view: --height needs a number of pixels, not {opts['height']!r}") from None
    return view


def load_ipython_extension(ipython):
    """Called by `%load_ext memsnap`: registers the %memsnap_view line magic."""

    from IPython.core.error import UsageError  # the message alone, without a traceback

    def magic(line):
        try:
            return memsnap_view(line, ipython.user_ns)
        except Error as e:
            raise UsageError(f"memsnap: {e}") from None

    magic.__doc__ = memsnap_view.__doc__ + "\n\n" + __doc__
    ipython.register_magic_function(magic, magic_kind="line", magic_name="memsnap_view")
