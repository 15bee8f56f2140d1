"""What ``kvhit export`` turns into an engine's own test, and what every engine's
generator shares: the saved counterexample, the correct answer, and the docstring.

A generator (``generate`` in :mod:`kvhit.engines.vllm.vllm_pytest` and
:mod:`kvhit.engines.sglang.sglang_pytest`, chosen by ``kvhit export``) takes a
:class:`SavedLookup` or a :class:`SavedProgram` and returns the text of one pytest file that imports only
the engine and pytest, asserts the spec's answer (computed here, written into the
file as literals) and fails where the engine has the counterexample's class.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
    ...                  "cached": ["01", "10"], "max_length": 2})
    >>> saved = SavedLookup("x.json", q, ExportEngine.VLLM, "unsafe", {"length": 1}, "group 0 needs block 0")
    >>> print(lookup_story(saved, "vLLM"))
    The request has T=3 tokens, ids 0 … 2; a hit is at most M=2 tokens and a multiple of
    A=1. One row per KV cache group, one cell per block: # cached, . not, @ reused by the
    correct hit.
    <BLANKLINE>
        query: M=2 A=1
        group 0  sliding_window w=2 b=1   . #
        group 1  sliding_window w=2 b=1   # .
    <BLANKLINE>
    The correct hit (kvhit's spec, computed by `kvhit export`): L* = 0.
    When saved, vLLM answered 1 (unsafe): group 0 needs block 0.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvhit.draw import draw
from kvhit.model.spec import Answer, Query, longest_hit
from kvhit.targets.stateful import Finish, Op, Program
from kvhit.targets.target_record import TargetRecord


class ExportEngine(StrEnum):
    """An engine ``kvhit export`` writes tests for."""

    VLLM = "vllm"
    SGLANG = "sglang"


def engine_of(target: TargetRecord | None) -> ExportEngine | None:
    """The engine a recorded target drives (the built-ins ``vllm``,
    ``vllm-undocumented``, ``vllm-connector``, ``sglang``, ``sglang-hicache``), or None.

    >>> engine_of(TargetRecord("vllm", (("eagle", "drop"),))), engine_of(TargetRecord("impl"))
    (<ExportEngine.VLLM: 'vllm'>, None)
    """
    name = target.name if target is not None else None
    for engine in ExportEngine:
        if name is not None and (name == engine or name.startswith(f"{engine}-")):
            return engine
    return None


@dataclass(frozen=True)
class SavedLookup:
    """A saved stateless counterexample (or a plain query: no class, no answer)."""

    source: str
    query: Query
    engine: ExportEngine
    cls: str | None = None
    answer: Any = None
    reason: str | None = None

    @property
    def correct(self) -> Answer:
        """The spec's answer: L* and the blocks each group reuses there."""
        return longest_hit(self.query)


@dataclass(frozen=True)
class SavedProgram:
    """A saved stateful counterexample: the program, cut after the operation that
    disagreed, and the engine's own snapshot at that lookup (None when the failing
    operation was no lookup)."""

    source: str
    program: Program
    engine: ExportEngine
    cls: str
    reason: str
    snapshot: Query | None
    answer: Any = None

    @property
    def correct(self) -> Answer | None:
        """The spec's answer on the engine's snapshot at the failing lookup."""
        return longest_hit(self.snapshot) if self.snapshot is not None else None


def said(answer: Any) -> str:
    """The hit length an engine gave, as saved (a bare int or an answer object)."""
    return str(answer.get("length") if isinstance(answer, dict) else answer)


def indented(text: str) -> str:
    """A drawing indented as a literal block in a docstring."""
    return textwrap.indent(text, "    ")


def wrapped(text: str, hang: str = "") -> str:
    """A paragraph of a generated docstring, wrapped at 88 columns (later lines
    indented by ``hang``)."""
    return textwrap.fill(text, 88, subsequent_indent=hang, break_on_hyphens=False)


def lookup_story(saved: SavedLookup, engine_name: str) -> str:
    """A few lines that explain the state, the drawn query (``@``: the correct
    hit's blocks), the correct answer and what the engine answered when saved."""
    q, best = saved.query, saved.correct
    units = "" if q.hash_unit is None else ", or with hash unit h one per unit, blocks parted by |"
    intro = (
        f"The request has T={q.num_tokens} tokens, ids 0 … {q.num_tokens - 1}; a hit is at most "
        f"M={q.max_length} tokens and a multiple of A={q.alignment}. One row per KV cache group, "
        f"one cell per block{units}: # cached, . not, @ reused by the correct hit."
    )
    lines = [
        wrapped(intro),
        "",
        indented(draw(q, best)),
        "",
        f"The correct hit (kvhit's spec, computed by `kvhit export`): L* = {best.length}.",
    ]
    if saved.cls is not None:
        answered = f"When saved, {engine_name} answered {said(saved.answer)} ({saved.cls}): "
        lines.append(wrapped(f"{answered}{saved.reason}."))
    return "\n".join(lines)


def program_story(saved: SavedProgram, engine_name: str) -> str:
    """The engine, the operations (the last one disagreed), and the failing lookup:
    the engine's own cache at it drawn (``@``: the correct hit's blocks), the correct
    answer and what the engine answered when saved."""
    p = saved.program
    unit = "" if p.hash_unit is None else f", hash unit h={p.hash_unit}"
    lines = [
        f"The engine: a pool of {p.num_blocks} blocks, hits multiples of A={p.alignment}{unit}.",
        *(f"    group {i}  {g.describe()}" for i, g in enumerate(p.groups)),
        "",
        "The program (the test makes the same calls):",
        *(f"    {n}. {op_text(op)}" for n, op in enumerate(p.ops, 1)),
        "",
        wrapped(f"Operation {len(p.ops)} disagreed ({saved.cls}): {saved.reason}."),
    ]
    if saved.snapshot is not None and saved.correct is not None:
        lines += [
            "",
            wrapped(
                f"{engine_name}'s own cache at that lookup, as kvhit read it from the engine "
                "(# cached, . not, @ reused by the correct hit):"
            ),
            "",
            indented(draw(saved.snapshot, saved.correct)),
            "",
            f"The correct hit there (kvhit's spec, computed by `kvhit export`): "
            f"L* = {saved.correct.length}; {engine_name} answered {said(saved.answer)}.",
        ]
    return "\n".join(lines)


def op_text(op: Op) -> str:
    """One operation for people: ``admit r0 [1 2 3]`` or ``finish r0``."""
    if isinstance(op, Finish):
        return f"finish r{op.request}"
    return f"admit r{op.request} [{' '.join(map(str, op.tokens))}]"
