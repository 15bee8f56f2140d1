"""The errors every layer of kvhit shares, at the bottom of the stack.

- :class:`BadInput`: bad usage or bad input; the command line prints one line,
  ``error: ...``, and exits 2.
- :class:`TargetError`: a target that cannot be found or loaded;
  :class:`UndrivableTarget`: one that is installed but cannot be driven.
- :class:`Unsupported`: a target refuses a configuration (counted, not a disagreement).

Nothing here imports the rest of kvhit, so every module may import it.
"""

from __future__ import annotations


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
