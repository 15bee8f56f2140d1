"""Reading query files for the commands: every problem is one :class:`BadInput` line
naming the file (and the query, in a file of JSON lines).

    >>> import tempfile, os
    >>> with tempfile.NamedTemporaryFile("wb", suffix=".json", delete=False) as f:
    ...     _ = f.write(b"\\xff\\xfe garbage")
    >>> read_queries(f.name)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    kvhit.errors.BadInput: ...: not UTF-8 text (invalid start byte at byte 0)
    >>> os.unlink(f.name)
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kvhit.errors import BadInput
from kvhit.model.protocol import QueryError, load_queries, parse_query
from kvhit.model.spec import Query

DISAGREEMENT_FORMAT = "kvhit-disagreement/1"
"""The ``format`` of a saved stateless disagreement (:mod:`kvhit.harness.report`)."""


def saved_query(obj: Any) -> tuple[Any, dict[str, Any] | None]:
    """The query an input object holds, and the record it came in: a saved
    disagreement's ``query`` and the whole record (its target, class, reason and
    answers, which ``kvhit replay`` reads and ``kvhit check`` leaves aside), or a
    plain query and None. :class:`QueryError` for a file of another kind (a saved
    stateful program)."""
    if not isinstance(obj, dict) or "format" not in obj:
        return obj, None
    if obj["format"] != DISAGREEMENT_FORMAT:
        raise QueryError("file", f"a {obj['format']!r} file, not a query or a saved disagreement")
    return obj.get("query"), obj


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


def read_queries(path: str) -> list[tuple[str, Query]]:
    """Load and check every query in a file (``-`` for stdin), each with a label that
    names it; a saved disagreement counts as its query. BadInput on any problem."""
    where = "stdin" if path == "-" else path
    try:
        objects = load_queries(read_text(path))
    except QueryError as err:
        raise BadInput(f"{where}: {err}") from None
    out = []
    for number, obj in enumerate(objects, 1):
        label = where if len(objects) == 1 else f"{where} query {number}"
        try:
            out.append((label, parse_query(saved_query(obj)[0])))
        except QueryError as err:
            raise BadInput(f"{label}: {err}") from None
    return out
