"""The command line as a run keeps it."""

from __future__ import annotations

import shlex

from tuner.exec.sandbox import SECRET_FLAGS


def redacted_argv(argv: list[str]) -> str:
    """The command line as a run keeps it: the value of a key flag never reaches the disk."""
    out, hide = [], False
    for a in argv:
        if hide:
            out.append("***")
            hide = False
            continue
        flag, eq, _ = a.partition("=")
        if flag in SECRET_FLAGS:
            out.append(f"{flag}=***" if eq else a)
            hide = not eq
        else:
            out.append(a)
    return shlex.join(out)
