"""The stateful target protocol: an engine driven by a program of requests.

A stateless target answers one lookup on a cache state kvhit builds. A *stateful*
target is a whole prefix cache: kvhit creates it for a list of groups (the query
protocol's group objects, drafters included), a pool of ``num_blocks`` physical
blocks, an alignment and perhaps a hash unit, then drives it with a program of
operations and watches how its cache evolves (docs/design.md §5.6; the checks are
in :mod:`kvhit.harness.stateful`).

Messages, one JSON object each (a Python engine gets the same as method calls):

=========================================================  ==========================
message                                                    answer
=========================================================  ==========================
``{"op": "create", "groups": [...], "num_blocks": N,``     anything (ignored)
``"alignment": A}`` (and ``"hash_unit": h``, if any)
``{"op": "snapshot", "tokens": [t, ...]}``                 ``{"cached": [row per
                                                           group]}``: which full
                                                           blocks of these tokens
                                                           the engine finds cached
                                                           (with h, a partially
                                                           filled one as ``{"upto":
                                                           p}``)
``{"op": "admit", "request": r, "tokens": [t, ...]}``      ``{"length": L, "reused":
                                                           [[id, ...] per group],
                                                           "tables": [[id or null,
                                                           ...] per group]}``, or
                                                           ``{"rejected": "why"}``
``{"op": "finish", "request": r}``                         anything (ignored)
=========================================================  ==========================

An engine may also have external stores (``"tiers"`` in ``create``: each a name, the
kinds it holds and its ``num_blocks`` slots; docs/design.md §1.7). Its snapshot then
adds ``"tiers"``, what each store holds of these tokens in the query protocol's form,
and each admit lists its ``"moves"`` in the order they happened: a spill of a pool
block to a store's slot, ``["spill", block, [tier, slot]]``, and a restore,
``["restore", [tier, slot], block]`` (``tier`` counts the create message's tiers
from 0). The content ledger follows each block's content through them.

``admit`` does what a serving engine does for a new prompt: look up its prefix hit
(at most T - 1 tokens), allocate, "compute" tokens L … T-1 (writing every block
from index L // b on), cache its full blocks and drop the blocks that left a window.
It answers the hit length, the physical blocks each group took from the cache, and
each group's block table as it stood for the prefill: the physical block at every
block index of the request, ``null`` where the request holds none. An engine may
add ``"outputs_match": false`` when it can tell that its served output differs from
a computation from scratch. ``{"rejected": ...}`` means the pool cannot hold the
request now; the engine must then be unchanged. ``finish`` frees the request's blocks.

With a hash unit h, a hit is a multiple of A, which may end inside a block, and a
prompt that ends inside a block leaves that block cached at its fine boundaries
(its tokens up to the last multiple of h its keys reach; for Mamba, the state
there). A block the hit ends inside may be reused in place or *copied* (the
request writes the rest of it): then ``reused`` lists the cached block and the
table holds the copy, the one block of a group that ``reused`` may list outside
its table. A lookahead drafter's keys cover La tokens past a block's end too, so a
block it finds must hold the request's next La tokens (docs/design.md §1.3).

    >>> program = Program.from_json({"groups": [{"kind": "full", "block_size": 2}],
    ...     "num_blocks": 4, "ops": [{"op": "admit", "request": 0, "tokens": [1, 2, 3]},
    ...                              {"op": "finish", "request": 0}]})
    >>> program.ops[0], program.num_blocks, program.alignment
    (Admit(request=0, tokens=(1, 2, 3)), 4, 2)
    >>> Program.from_json({"groups": [{"kind": "full", "block_size": 4}], "num_blocks": 4,
    ...                    "hash_unit": 2}).config()
    {'groups': [{'kind': <Kind.FULL: 'full'>, 'block_size': 4, 'eagle': False}], 'num_blocks': 4, 'alignment': 2, 'hash_unit': 2}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvhit.contract import capabilities_of
from kvhit.model.protocol import (
    QueryError,
    decode_json,
    parse_alignment,
    parse_group,
    parse_hash_unit,
    parse_row,
    parse_tier_name,
    parse_tiers,
)
from kvhit.model.spec import Group, Kind, Tier, Upto
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
class Store:
    """An external store of a stateful engine: ``name``, the kinds it ``holds`` and
    its ``num_blocks`` slots."""

    name: str
    holds: frozenset[Kind]
    num_blocks: int

    def to_json(self) -> dict[str, Any]:
        """The ``create`` message's form."""
        kinds = [k.value for k in Kind if k in self.holds]
        return {"name": self.name, "holds": kinds, "num_blocks": self.num_blocks}


def parse_stores(value: Any) -> tuple[Store, ...]:
    """A program's ``tiers``: distinct names other than ``local``, kinds, slots >= 1."""
    if not isinstance(value, list):
        raise QueryError("tiers", "must be a list of stores")
    out: list[Store] = []
    for i, obj in enumerate(value):
        field = f"tiers[{i}]"
        if not isinstance(obj, dict) or set(obj) != {"name", "holds", "num_blocks"}:
            raise QueryError(field, "must be {'name': ..., 'holds': [kinds], 'num_blocks': N}")
        name, holds = parse_tier_name(obj, field)
        if name in {s.name for s in out}:
            raise QueryError(f"{field}.name", f"{name!r} names an earlier store too")
        slots = obj["num_blocks"]
        if not isinstance(slots, int) or isinstance(slots, bool) or slots < 1:
            raise QueryError(
                f"{field}.num_blocks", f"must be an integer of at least 1, got {slots!r}"
            )
        out.append(Store(name, holds, slots))
    return tuple(out)


class Direction(StrEnum):
    """Which way a block's content moved between the pool and a store."""

    SPILL = "spill"
    RESTORE = "restore"


@dataclass(frozen=True)
class TierMove:
    """Pool block ``block``'s content copied to slot ``slot`` of store ``tier`` (a
    spill), or that slot's content copied into the block (a restore)."""

    direction: Direction
    block: int
    tier: int
    slot: int

    def to_json(self) -> list[Any]:
        """``[direction, source, destination]``: a block is its id, a slot ``[tier, slot]``."""
        there = [self.tier, self.slot]
        if self.direction == Direction.SPILL:
            return [str(self.direction), self.block, there]
        return [str(self.direction), there, self.block]


def decode_moves(value: Any, stores: int) -> tuple[TierMove, ...]:
    """An admit's ``moves`` of an engine of ``stores`` stores; :class:`BadReturn` if malformed.

    >>> decode_moves([["spill", 3, [0, 1]], ["restore", [0, 1], 5]], 1)
    (TierMove(direction=<Direction.SPILL: 'spill'>, block=3, tier=0, slot=1), TierMove(direction=<Direction.RESTORE: 'restore'>, block=5, tier=0, slot=1))
    """
    if not isinstance(value, list):
        raise BadReturn(f"moves must be a list, got {shown(value)}")
    out = []
    for move in value:
        if not (isinstance(move, list) and len(move) == 3 and move[0] in set(Direction)):
            raise BadReturn(
                f'a move is ["spill" | "restore", source, destination], got {shown(move)}'
            )
        direction = Direction(move[0])
        block, there = (move[1], move[2]) if direction == Direction.SPILL else (move[2], move[1])
        if not (
            _is_id(block)
            and isinstance(there, list)
            and len(there) == 2
            and all(map(_is_id, there))
        ):
            raise BadReturn(f"a move names a block id and a [tier, slot], got {shown(move)}")
        if there[0] >= stores:
            raise BadReturn(f"a move names tier {there[0]}; the engine has {stores}")
        out.append(TierMove(direction, block, there[0], there[1]))
    return tuple(out)


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


@dataclass(frozen=True)
class Program:
    """An engine's configuration and the operations to run on it, in order."""

    groups: tuple[Group, ...]
    num_blocks: int
    alignment: int
    ops: tuple[Op, ...] = ()
    hash_unit: int | None = None
    tiers: tuple[Store, ...] = ()

    def config(self) -> dict[str, Any]:
        """The ``create`` message without its ``op`` (what a factory receives)."""
        out: dict[str, Any] = {
            "groups": [g.to_json() for g in self.groups],
            "num_blocks": self.num_blocks,
            "alignment": self.alignment,
        }
        if self.hash_unit is not None:
            out["hash_unit"] = self.hash_unit
        if self.tiers:
            out["tiers"] = [t.to_json() for t in self.tiers]
        return out

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
        hash_unit = parse_hash_unit(obj, groups)
        alignment = parse_alignment(obj, groups, hash_unit)
        ops = obj.get("ops", [])
        if not isinstance(ops, list):
            raise QueryError("ops", "must be a list of operations")
        parsed = tuple(parse_op(o, i) for i, o in enumerate(ops))
        stores = parse_stores(obj.get("tiers", []))
        return Program(groups, num_blocks, alignment, parsed, hash_unit, stores)


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
    its block tables (None where the request holds no block) and, per group, the copy
    of the block the hit ends inside (its table index and the cached block copied;
    None: no copy, and empty: none in any group)."""

    length: int
    reused: tuple[tuple[int, ...], ...]
    tables: tuple[tuple[int | None, ...], ...]
    outputs_match: bool | None = None
    copied: tuple[tuple[int, int] | None, ...] = ()
    moves: tuple[TierMove, ...] = ()

    def copy_of(self, group: int) -> tuple[int, int] | None:
        """Group ``group``'s copy: (table index, cached block copied there), or None."""
        return self.copied[group] if self.copied else None

    def read_block(self, group: int, j: int) -> int | None:
        """The physical block the hit reads at index j of group ``group``: the table's,
        or the cached block copied there."""
        copy = self.copy_of(group)
        if copy is not None and copy[0] == j:
            return copy[1]
        table = self.tables[group]
        return table[j] if j < len(table) else None

    def reused_indices(self) -> list[list[int]]:
        """Per group, the block indices whose table entry was taken from the cache (a
        copy's index included)."""
        out = []
        for i, (table, reused) in enumerate(zip(self.tables, map(set, self.reused))):
            taken = {j for j, block in enumerate(table) if block is not None and block in reused}
            copy = self.copy_of(i)
            out.append(sorted(taken if copy is None else {*taken, copy[0]}))
        return out


def _id_list(value: Any, field: str, nullable: bool) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise BadReturn(f"{field} must be a list of block ids")
    for block in value:
        if block is None and nullable:
            continue
        if not isinstance(block, int) or isinstance(block, bool) or block < 0:
            raise BadReturn(f"{field} holds {shown(block)}, not a block id")
    return tuple(value)


def decode_admitted(value: Any, groups: tuple[Group, ...], stores: int = 0) -> Admitted | None:
    """An ``admit`` answer of an engine of ``groups`` (and ``stores`` external stores),
    or None for ``{"rejected": ...}``; :class:`BadReturn` if it does not follow the
    protocol."""
    num_groups = len(groups)
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
    copied = tuple(
        copy_in(i, g, ids, table, length)
        for i, (g, ids, table) in enumerate(zip(groups, reused, tables))
    )
    outputs_match = value.get("outputs_match")
    shown_match = outputs_match if isinstance(outputs_match, bool) else None
    moves = decode_moves(value.get("moves", []), stores)
    return Admitted(length, reused, tables, shown_match, copied if any(copied) else (), moves)


def copy_in(
    i: int, g: Group, reused: tuple[int, ...], table: tuple[int | None, ...], length: int
) -> tuple[int, int] | None:
    """Group i's copy: the one reused block outside its table, which must be the block
    a hit of ``length`` ends inside, copied to a block of the table there; None when
    every reused block is in the table. :class:`BadReturn` for any other stray."""
    stray = sorted(set(reused) - set(table))
    if not stray:
        return None
    index = length // g.block_size
    inside = length % g.block_size and index < len(table) and table[index] is not None
    if len(stray) > 1 or not inside:
        raise BadReturn(f"group {i} reuses block {stray[0]}, which is not in its table")
    return index, stray[0]


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


def decode_snapshot_tiers(
    value: Any, groups: tuple[Group, ...], stores: tuple[Store, ...], hash_unit: int | None
) -> tuple[Tier, ...]:
    """What a ``snapshot`` answer says each store holds (its ``tiers``, one per store,
    in order, named as created); :class:`BadReturn` if malformed."""
    if not stores:
        return ()
    tiers = value.get("tiers") if isinstance(value, dict) else None
    try:
        parsed = parse_tiers(tiers, groups, hash_unit)
    except QueryError as err:
        raise BadReturn(f"snapshot: {err}") from None
    if [t.name for t in parsed] != [s.name for s in stores]:
        names = ", ".join(s.name for s in stores)
        raise BadReturn(f"snapshot: tiers must name the engine's stores in order ({names})")
    return parsed


class EngineHost:
    """Turns protocol messages into calls on a Python engine made by ``factory``.

    The factory gets the ``create`` message without its ``op`` and returns an object
    with ``admit(request, tokens)``, ``finish(request)`` and ``snapshot(tokens)``.
    """

    def __init__(self, factory: Callable[[dict[str, Any]], Any]):
        self.factory = factory
        self.capabilities = capabilities_of(factory)
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
