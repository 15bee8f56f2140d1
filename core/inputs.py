"""Reading input files for the commands: every problem is one :class:`BadInput` line
naming the file (a file of queries or a saved case is read by
:mod:`kvhit.harness.saved`).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as f:
    ...     _ = f.write(b"\\xff\\xfe garbage")
    >>> read_text(f.name)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kvhit.errors.BadInput: ...: not UTF-8 text (invalid start byte at byte 0)
    >>> os.unlink(f.name)
"""

from __future__ import annotations

import sys
from pathlib import Path

from kvhit.errors import BadInput


def read_text(path: str) -> str:
    """A file's text (``-`` for stdin); BadInput if it cannot be read or is not UTF-8."""
    where = "stdin" if path == "-" else path
    try:
        data = sys.stdin.buffer.read() if path == "-" else Path(path).read_bytes()
    except OSError as err:
        raise BadInput(f"{path}: {err.strerror or err}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise BadInput(f"{where}: not UTF-8 text ({err.reason} at byte {err.start})") from None


def writable(directory: Path, option: str) -> None:
    """Make ``directory`` (given as ``option``) and check a file can be written in it,
    before any work: BadInput naming the option if not."""
    if directory.exists() and not directory.is_dir():
        raise BadInput(f"{option}: {directory} is not a directory")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".kvhit-write-check"
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as err:
        raise BadInput(f"{option}: cannot write in {directory}: {err.strerror or err}") from None
