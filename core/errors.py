"""The errors every layer of kvhit shares, at the bottom of the stack.

- :class:`BadInput`: bad usage or bad input; the command line prints one line,
  ``error: ...``, and exits 2.
- :class:`TargetError`: a target that cannot be found or loaded;
  :class:`UndrivableTarget`: one that is installed but cannot be driven.
- :class:`Unsupported`: a target refuses a configuration (counted, not a disagreement).
- :func:`described`: an exception a target raised, for people: its type, its message
  and the file and line that raised it.

Nothing here imports the rest of kvhit, so every module may import it.
"""

from __future__ import annotations

import os
import traceback


class BadInput(Exception):
    """Bad input: one line naming the problem (the command line exits 2).

    >>> str(BadInput("q.json: max_length: missing"))
    'q.json: max_length: missing'
    """


class TargetError(Exception):
    """A target that cannot be found or loaded."""


class UndrivableTarget(TargetError):
    """A target that is installed but cannot be driven (say, an engine release that
    lacks what the target calls); its message says why."""


class Unsupported(Exception):
    """Raised by a target for a configuration it refuses (an engine's own limits).

    The harness reports it as the class ``unsupported``, not as a disagreement.
    """


def raised_at(err: BaseException) -> traceback.FrameSummary | None:
    """The frame that raised ``err``: the innermost of its traceback outside Python's
    import machinery (a SyntaxError: the line it names); None if there is none."""
    if isinstance(err, SyntaxError) and err.filename and err.lineno:
        return traceback.FrameSummary(err.filename, err.lineno, "<module>")
    frames = [
        f for f in traceback.extract_tb(err.__traceback__) if not f.filename.startswith("<frozen ")
    ]
    return frames[-1] if frames else None


def shown_path(path: str) -> str:
    """``path`` relative to the current directory when it lies inside it.

    >>> shown_path(os.path.join(os.getcwd(), "pkg", "m.py")) == os.path.join("pkg", "m.py")
    True
    """
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive
        return path
    return path if relative.startswith(os.pardir) else relative


def described(err: BaseException) -> str:
    """``err`` for people: its type, its message (if any) and where it was raised.

    >>> def lookup():
    ...     raise KeyError("groups")
    >>> try:
    ...     lookup()
    ... except KeyError as err:
    ...     print(described(err))
    KeyError: 'groups' (raised at <doctest ...described[0]>:2 in lookup)
    """
    text = type(err).__name__ + (f": {err}" if str(err) else "")
    frame = raised_at(err)
    if frame is None:
        return text
    where = f"{shown_path(frame.filename)}:{frame.lineno}"
    return f"{text} (raised at {where}{'' if frame.name == '<module>' else f' in {frame.name}'})"
