"""Saved files: every file kvhit writes for a counterexample, and the one reader of them
(docs/protocol.md, "Saved files").

A file holds a stateless case (:class:`CaseFile`: a query, and what the target
answered there), a stateful one (:class:`ProgramFile`: a program cut after the
operation that disagreed) or a step-level one (:class:`StepsFile`: a step program cut
after the event that disagreed). Each names its :class:`SavedFormat` and, when it was
found on a target, the :class:`~kvhit.targets.target_record.TargetRecord` it was
found on. :func:`decode` reads it into one of the two, once; it also reads a plain
query or a plain program (``ops``), and the files of format 1, whose target was a
display label (``vllm[eagle=drop]``). :func:`save` writes a file atomically (a
temporary file renamed into place), so a crash never leaves half a file and a file
is on disk before it is reported.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 2}], "cached": ["1"],
    ...                  "max_length": 2})
    >>> case = CaseFile(q, TargetRecord("seed-min"), Verdict.UNSAFE, {"length": 2}, "why")
    >>> text = json.dumps(case.to_json())
    >>> json.loads(text)["format"], json.loads(text)["target"]
    ('kvhit-case/2', {'name': 'seed-min'})
    >>> decode(text) == case, case.file_name()
    (True, 'unsafe-88f645e0a7c7.json')
    >>> decode(json.dumps(q.to_json())).cls is None  # a plain query
    True
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

from kvhit.analysis import Verdict
from kvhit.errors import BadInput
from kvhit.inputs import read_text
from kvhit.model.protocol import QueryError, decode_json, load_queries, parse_query
from kvhit.model.spec import Query, longest_hit
from kvhit.targets.stateful import Program
from kvhit.targets.steps import StepProgram
from kvhit.targets.target_record import TargetRecord


class SavedFormat(StrEnum):
    """The ``format`` of a saved file: the current two, and the two of format 1 that
    are still read (their ``target`` was a display label)."""

    CASE = "kvhit-case/2"
    PROGRAM = "kvhit-program/2"
    STEPS = "kvhit-steps/1"
    CASE_1 = "kvhit-disagreement/1"
    PROGRAM_1 = "kvhit-stateful/1"


LABELLED = (SavedFormat.CASE_1, SavedFormat.PROGRAM_1)
"""The formats whose ``target`` is a label, not a :class:`TargetRecord`."""


def digest(*parts: Any) -> str:
    """A short hash of ``parts`` (JSON), the same for the same parts."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]


def label_of(target: TargetRecord | None) -> str | None:
    """The target's label, or None."""
    return target.label if target is not None else None


@dataclass(frozen=True)
class CaseFile:
    """A saved stateless case: ``query`` and, when it was found on a target, the
    ``target``, the class, what the target answered and why that is wrong (a plain
    query has none of them)."""

    query: Query
    target: TargetRecord | None = None
    cls: Verdict | None = None
    target_answer: Any = None
    reason: str | None = None

    def to_json(self) -> dict[str, Any]:
        """The file's JSON; ``reference`` (L* and its blocks) is written for people and
        not read back."""
        return {
            "format": SavedFormat.CASE.value,
            "target": self.target.to_json() if self.target else None,
            "class": self.cls,
            "query": self.query.to_json(),
            "target_answer": self.target_answer,
            "reference": longest_hit(self.query).to_json(),
            "reason": self.reason,
        }

    def file_name(self) -> str:
        """A name that is the same for the same target, class and query."""
        return f"{self.cls}-{digest(label_of(self.target), self.cls, self.query.to_json())}.json"


@dataclass(frozen=True)
class ProgramFile:
    """A saved stateful case: ``program`` (cut after the operation that disagreed)
    and, when it was found on a target, the ``target``, the class and reason, the
    engine's own ``snapshot`` at the failing lookup (None when the failing operation
    was no lookup) and what the engine answered there."""

    program: Program
    target: TargetRecord | None = None
    cls: Verdict | None = None
    reason: str | None = None
    snapshot: Query | None = None
    target_answer: Any = None

    def to_json(self) -> dict[str, Any]:
        """The file's JSON; ``failing_op`` (0: the engine's creation) and ``reference``
        are written for people and not read back."""
        q = self.snapshot
        return {
            "format": SavedFormat.PROGRAM.value,
            "target": self.target.to_json() if self.target else None,
            "class": self.cls,
            "reason": self.reason,
            "program": self.program.to_json(),
            "failing_op": len(self.program.ops),
            "snapshot": q.to_json() if q is not None else None,
            "target_answer": self.target_answer,
            "reference": longest_hit(q).to_json() if q is not None else None,
        }

    def file_name(self) -> str:
        """A name that is the same for the same target, class and program."""
        key = digest(label_of(self.target), self.cls, self.program.to_json())
        return f"stateful-{self.cls}-{key}.json"


@dataclass(frozen=True)
class StepsFile:
    """A saved step-level case: ``program`` (its events cut after the one that
    disagreed) and, when it was found on a target, the ``target``, the class and
    reason, and what happened, a line per event or step, for people (not read back)."""

    program: StepProgram
    target: TargetRecord | None = None
    cls: Verdict | None = None
    reason: str | None = None
    log: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The file's JSON."""
        return {
            "format": SavedFormat.STEPS.value,
            "target": self.target.to_json() if self.target else None,
            "class": self.cls,
            "reason": self.reason,
            "program": self.program.to_json(),
            "log": list(self.log),
        }

    def file_name(self) -> str:
        """A name that is the same for the same target, class and program."""
        key = digest(label_of(self.target), self.cls, self.program.to_json())
        return f"steps-{self.cls}-{key}.json"


SavedFile = CaseFile | ProgramFile | StepsFile


def saved_target(obj: dict[str, Any], form: SavedFormat) -> TargetRecord | None:
    """The target a file records (None: none); a format 1 label is parsed here only."""
    target = obj.get("target")
    if target is None:
        return None
    if form in LABELLED:
        if not isinstance(target, str):
            raise QueryError("target", "must be the target's label in a format 1 file")
        return TargetRecord.from_label(target)
    return TargetRecord.from_json(target)


def saved_class(obj: dict[str, Any]) -> Verdict | None:
    """The class a file records (None: none)."""
    cls = obj.get("class")
    if cls is None:
        return None
    if cls not in tuple(Verdict):
        raise QueryError("class", f"must be one of {', '.join(Verdict)}, got {cls!r}")
    return Verdict(cls)


def optional_text(obj: dict[str, Any], key: str) -> str | None:
    """A string field that may be absent."""
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise QueryError(key, f"must be a string, got {json.dumps(value)}")
    return value


def program_kind(obj: Any) -> str | None:
    """What names ``obj`` a stateful case: its format, ``a plain program`` (it has
    ``ops``), or None for anything else."""
    if not isinstance(obj, dict):
        return None
    if obj.get("format") in (SavedFormat.PROGRAM, SavedFormat.PROGRAM_1, SavedFormat.STEPS):
        return f"a {obj['format']!r} file"
    plain = "format" not in obj and ("ops" in obj or "events" in obj)
    return "a plain program" if plain else None


def decode_object(obj: Any) -> SavedFile:
    """What one decoded JSON object holds; :class:`QueryError` naming the problem."""
    if not isinstance(obj, dict) or "format" not in obj:
        if program_kind(obj):
            steps = "events" in obj
            return (
                StepsFile(StepProgram.from_json(obj))
                if steps
                else ProgramFile(Program.from_json(obj))
            )
        return CaseFile(parse_query(obj))
    if obj["format"] not in tuple(SavedFormat):
        known = ", ".join(SavedFormat)
        raise QueryError("format", f"{obj['format']!r} is no saved file's (known: {known})")
    form = SavedFormat(obj["format"])
    target, cls, reason = saved_target(obj, form), saved_class(obj), optional_text(obj, "reason")
    if form in (SavedFormat.CASE, SavedFormat.CASE_1):
        return CaseFile(
            parse_query(obj.get("query")), target, cls, obj.get("target_answer"), reason
        )
    if form == SavedFormat.STEPS:
        return StepsFile(StepProgram.from_json(obj.get("program")), target, cls, reason)
    snapshot = obj.get("snapshot")
    return ProgramFile(
        Program.from_json(obj.get("program")),
        target,
        cls,
        reason,
        parse_query(snapshot) if snapshot is not None else None,
        obj.get("target_answer"),
    )


def decode(text: str) -> SavedFile:
    """The saved case ``text`` holds (a saved file, a plain query or a plain program);
    :class:`QueryError` naming the problem."""
    return decode_object(decode_json(text, "file"))


def read_queries(path: str) -> list[tuple[str, Query]]:
    """Every query in a file (``-`` for stdin) of queries, one or JSON lines, each with
    a label that names it; a saved case counts as its query. BadInput on any problem."""
    where = "stdin" if path == "-" else path
    try:
        objects = load_queries(read_text(path))
    except QueryError as err:
        raise BadInput(f"{where}: {err}") from None
    out = []
    for number, obj in enumerate(objects, 1):
        label = where if len(objects) == 1 else f"{where} query {number}"
        kind = program_kind(obj)
        if kind is not None:
            raise BadInput(f"{label}: {kind}, not a query or a saved disagreement")
        try:
            saved = decode_object(obj)
        except QueryError as err:
            raise BadInput(f"{label}: {err}") from None
        assert isinstance(saved, CaseFile)
        out.append((label, saved.query))
    return out


def save(saved: SavedFile, out_dir: Path) -> Path:
    """Write ``saved`` into ``out_dir`` (made if missing) atomically; the path written."""
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / saved.file_name()
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(saved.to_json(), f, indent=1)
            f.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path
