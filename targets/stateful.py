"""The stateful target protocol: an engine driven by a program of requests.

A stateless target answers one lookup on a cache state kvhit builds. A *stateful*
target is a whole prefix cache: kvhit creates it for a list of groups (the query
protocol's group objects), a pool of ``num_blocks`` physical blocks and an
alignment, then drives it with a program of operations and watches how its cache
evolves (docs/design.md §5.6; the checks are in :mod:`kvhit.harness.stateful`).

Messages, one JSON object each (a Python engine gets the same as method calls):

=========================================================  ==========================
message                                                    answer
=========================================================  ==========================
``{"op": "create", "groups": [...], "num_blocks": N,``     anything (ignored)
``"alignment": A}``
``{"op": "snapshot", "tokens": [t, ...]}``                 ``{"cached": [row per
                                                           group]}``: which full
                                                           blocks of these tokens
                                                           the engine finds cached
``{"op": "admit", "request": r, "tokens": [t, ...]}``      ``{"length": L, "reused":
                                                           [[id, ...] per group],
                                                           "tables": [[id or null,
                                                           ...] per group]}``, or
                                                           ``{"rejected": "why"}``
``{"op": "finish", "request": r}``                         anything (ignored)
=========================================================  ==========================

``admit`` does what a serving engine does for a new prompt: look up its prefix hit
(at most T - 1 tokens), allocate, "compute" tokens L … T-1 (writing every block
from index L // b on), cache its full blocks and drop the blocks that left a window.
It answers the hit length, the physical blocks each group took from the cache, and
each group's block table as it stood for the prefill: the physical block at every
block index of the request, ``null`` where the request holds none. An engine may
add ``"outputs_match": false`` when it can tell that its served output differs from
a computation from scratch. ``{"rejected": ...}`` means the pool cannot hold the
request now; the engine must then be unchanged. ``finish`` frees the request's blocks.

    >>> program = Program.from_json({"groups": [{"kind": "full", "block_size": 2}],
    ...     "num_blocks": 4, "ops": [{"op": "admit", "request": 0, "tokens": [1, 2, 3]},
    ...                              {"op": "finish", "request": 0}]})
    >>> program.ops[0], program.num_blocks, program.alignment
    (Admit(request=0, tokens=(1, 2, 3)), 4, 2)
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvhit.model.protocol import QueryError, decode_json, parse_group, parse_row
from kvhit.model.spec import Group, Upto, default_alignment
from kvhit.targets.wire import BadReturn, shown

PROGRAM_FORMAT = "kvhit-stateful/1"


@dataclass(frozen=True)
class Admit:
    """A new request ``request`` of these tokens."""

    request: int
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """The operation as a protocol message."""
        return {"op": "admit", "request": self.request, "tokens": list(self.tokens)}


@dataclass(frozen=True)
class Finish:
    """Request ``request`` is done: its blocks are freed."""

    request: int

    def to_json(self) -> dict[str, Any]:
        """The operation as a protocol message."""
        return {"op": "finish", "request": self.request}


Op = Admit | Finish


@dataclass(frozen=True)
class Program:
    """An engine's configuration and the operations to run on it, in order."""

    groups: tuple[Group, ...]
    num_blocks: int
    alignment: int
    ops: tuple[Op, ...] = ()

    def config(self) -> dict[str, Any]:
        """The ``create`` message without its ``op`` (what a factory receives)."""
        return {
            "groups": [g.to_json() for g in self.groups],
            "num_blocks": self.num_blocks,
            "alignment": self.alignment,
        }

    def to_json(self) -> dict[str, Any]:
        """The program as JSON (the replay file's ``program``)."""
        return {**self.config(), "ops": [op.to_json() for op in self.ops]}

    @staticmethod
    def from_json(obj: Any) -> Program:
        """Check a program object and build it; :class:`QueryError` naming the field."""
        if not isinstance(obj, dict):
            raise QueryError("program", "must be a JSON object")
        if not isinstance(obj.get("groups"), list) or not obj["groups"]:
            raise QueryError("groups", "must be a non-empty list of group objects")
        groups = tuple(parse_group(g, f"groups[{i}]") for i, g in enumerate(obj["groups"]))
        num_blocks = obj.get("num_blocks")
        if not isinstance(num_blocks, int) or isinstance(num_blocks, bool) or num_blocks < 2:
            raise QueryError("num_blocks", f"must be an integer of at least 2, got {num_blocks!r}")
        alignment = obj.get("alignment", default_alignment(groups))
        if not isinstance(alignment, int) or alignment < 1:
            raise QueryError("alignment", f"must be a positive integer, got {alignment!r}")
        if any(alignment % g.block_size for g in groups):
            raise QueryError("alignment", f"{alignment} is not a multiple of every block size")
        ops = obj.get("ops", [])
        if not isinstance(ops, list):
            raise QueryError("ops", "must be a list of operations")
        return Program(
            groups, num_blocks, alignment, tuple(parse_op(o, i) for i, o in enumerate(ops))
        )


def parse_op(obj: Any, index: int) -> Op:
    """One operation of a program; :class:`QueryError` naming it."""
    field = f"ops[{index}]"
    if not isinstance(obj, dict) or obj.get("op") not in ("admit", "finish"):
        raise QueryError(field, "must be {'op': 'admit' | 'finish', 'request': r, ...}")
    request = obj.get("request")
    if not isinstance(request, int) or isinstance(request, bool):
        raise QueryError(f"{field}.request", "must be an integer")
    if obj["op"] == "finish":
        return Finish(request)
    tokens = obj.get("tokens")
    if not isinstance(tokens, list) or not tokens or not all(_is_token(t) for t in tokens):
        raise QueryError(f"{field}.tokens", "must be a non-empty list of non-negative integers")
    return Admit(request, tuple(tokens))


def _is_token(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Admitted:
    """An engine's answer to ``admit``: the hit, the blocks it took from the cache,
    and its block tables (None where the request holds no block)."""

    length: int
    reused: tuple[tuple[int, ...], ...]
    tables: tuple[tuple[int | None, ...], ...]
    outputs_match: bool | None = None

    def reused_indices(self) -> list[list[int]]:
        """Per group, the block indices whose table entry was taken from the cache."""
        return [
            [j for j, block in enumerate(table) if block is not None and block in reused]
            for table, reused in zip(self.tables, map(set, self.reused))
        ]


def _id_list(value: Any, field: str, nullable: bool) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise BadReturn(f"{field} must be a list of block ids")
    for block in value:
        if block is None and nullable:
            continue
        if not isinstance(block, int) or isinstance(block, bool) or block < 0:
            raise BadReturn(f"{field} holds {shown(block)}, not a block id")
    return tuple(value)


def decode_admitted(value: Any, num_groups: int) -> Admitted | None:
    """An ``admit`` answer, or None for ``{"rejected": ...}``; :class:`BadReturn` if
    it does not follow the protocol."""
    if isinstance(value, dict) and "rejected" in value:
        return None
    if not isinstance(value, dict) or not {"length", "reused", "tables"} <= set(value):
        raise BadReturn(f"admit must answer {{'length', 'reused', 'tables'}}, got {shown(value)}")
    length, reused, tables = value["length"], value["reused"], value["tables"]
    if not isinstance(length, int) or isinstance(length, bool):
        raise BadReturn(f"the length must be an integer, got {shown(length)}")
    for name, rows in (("reused", reused), ("tables", tables)):
        if not isinstance(rows, list) or len(rows) != num_groups:
            raise BadReturn(f"{name} must hold one list per group ({num_groups})")
    reused = tuple(_id_list(r, f"reused[{i}]", False) for i, r in enumerate(reused))
    tables = tuple(_id_list(t, f"tables[{i}]", True) for i, t in enumerate(tables))
    for i, (ids, table) in enumerate(zip(reused, tables)):
        stray = set(ids) - set(table)
        if stray:
            raise BadReturn(f"group {i} reuses block {min(stray)}, which is not in its table")
    outputs_match = value.get("outputs_match")
    return Admitted(
        length, reused, tables, outputs_match if isinstance(outputs_match, bool) else None
    )


def decode_snapshot(
    value: Any, groups: tuple[Group, ...], hash_unit: int | None = None
) -> tuple[tuple[bool | Upto, ...], ...]:
    """A ``snapshot`` answer's rows, read as a query's rows are (with the hash unit,
    partial blocks too); :class:`BadReturn` if malformed."""
    rows = value.get("cached") if isinstance(value, dict) else value
    if not isinstance(rows, list) or len(rows) != len(groups):
        raise BadReturn(
            f"snapshot must answer {{'cached': [one row per group]}}, got {shown(value)}"
        )
    try:
        return tuple(
            parse_row(r, f"cached[{i}]", g, hash_unit) for i, (g, r) in enumerate(zip(groups, rows))
        )
    except QueryError as err:
        raise BadReturn(f"snapshot: {err}") from None


class EngineHost:
    """Turns protocol messages into calls on a Python engine made by ``factory``.

    The factory gets the ``create`` message without its ``op`` and returns an object
    with ``admit(request, tokens)``, ``finish(request)`` and ``snapshot(tokens)``.
    """

    def __init__(self, factory: Callable[[dict[str, Any]], Any]):
        self.factory = factory
        self.engine: Any = None

    def __call__(self, message: dict[str, Any]) -> Any:
        op = message["op"]
        if op == "create":
            self.engine = self.factory({k: v for k, v in message.items() if k != "op"})
            return {"created": True}
        if op == "snapshot":
            return self.engine.snapshot(message["tokens"])
        if op == "admit":
            return self.engine.admit(message["request"], message["tokens"])
        return self.engine.finish(message["request"])


def load_program_file(text: str) -> tuple[Program, dict[str, Any]]:
    """A saved stateful disagreement (or a plain program) and its record ({} for a
    plain program); :class:`QueryError` naming the problem."""
    obj = decode_json(text, "file")
    if isinstance(obj, dict) and obj.get("format") == PROGRAM_FORMAT:
        return Program.from_json(obj.get("program")), obj
    return Program.from_json(obj), {}


def is_program_file(text: str) -> bool:
    """Whether ``text`` is a saved stateful disagreement or a plain program (has ``ops``)."""
    try:
        obj = decode_json(text, "file")
    except QueryError:
        return False  # the stateless loader says what is wrong with it
    return isinstance(obj, dict) and (obj.get("format") == PROGRAM_FORMAT or "ops" in obj)
