"""The errors every layer of kvhit shares, at the bottom of the stack.

- :class:`BadInput`: bad usage or bad input; the command line prints one line and
  exits 2.
- :class:`TargetError`: a target that cannot be found or loaded;
  :class:`UndrivableTarget`: one that is installed but cannot be driven.
- :class:`Unsupported`: a target refuses a configuration (counted, not a disagreement).

Nothing here imports the rest of kvhit, so every module may import it.
"""

from __future__ import annotations

from typing import Any

import click


class BadInput(click.ClickException):
    """Bad input: one line naming the problem, exit code 2.

    >>> BadInput("q.json: max_length: missing").format_message()
    'q.json: max_length: missing'
    """

    exit_code = 2

    def show(self, file: Any = None) -> None:
        """Print ``error: ...`` on stderr."""
        click.echo(f"error: {self.format_message()}", err=True)


class TargetError(Exception):
    """A target that cannot be found or loaded."""


class UndrivableTarget(TargetError):
    """A target that is installed but cannot be driven (say, an engine release that
    lacks what the target calls); its message says why."""


class Unsupported(Exception):
    """Raised by a target for a configuration it refuses (an engine's own limits).

    The harness reports it as the class ``unsupported``, not as a disagreement.
    """
