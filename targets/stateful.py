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
    >>> Create(Program.from_json({"groups": [{"kind": "full", "block_size": 4}],
    ...                           "num_blocks": 4, "hash_unit": 2}).config()).to_json()
    {'op': 'create', 'groups': [{'kind': <Kind.FULL: 'full'>, 'block_size': 4, 'eagle': False}], 'num_blocks': 4, 'alignment': 2, 'hash_unit': 2}

In this process the messages and answers are typed (:mod:`kvhit.contract`): a factory
is called with an :class:`~kvhit.contract.EngineConfig`, an engine answers
:class:`~kvhit.contract.Admitted` or :class:`~kvhit.contract.Rejected` and
:class:`~kvhit.contract.Snapshot`, and :class:`EngineHost` passes them through. JSON is
for a program (``--target-cmd``) alone: its runner sends each message's ``to_json()``
and reads the line back with the message's ``decode``. Either way the harness checks
the typed answer once (:func:`check_admit`, :func:`check_snapshot`): a malformed one is
``bad_return``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kvhit.contract import (
    Admitted,
    Direction,
    EngineConfig,
    EngineFactory,
    Rejected,
    Snapshot,
    StatefulEngine,
    StepEngine,
    StepFactory,
    Store,
    TierMove,
    capabilities_of,
)
from kvhit.model.protocol import (
    QueryError,
    parse_alignment,
    parse_group,
    parse_hash_unit,
    parse_row,
    parse_tier_name,
    parse_tiers,
    partial_problem,
)
from kvhit.model.spec import Group, Tier, Upto
from kvhit.targets.wire import BadReturn, shown


@dataclass(frozen=True)
class Admit:
    """A new request ``request`` of these tokens."""

    request: int
    tokens: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        """The operation as a protocol message."""
        return {"op": "admit", "request": self.request, "tokens": list(self.tokens)}

    def decode(self, value: Any) -> Admitted | Rejected:
        """A program's answer line (:func:`decode_admit`)."""
        return decode_admit(value)

    def call(self, engine: StatefulEngine) -> Admitted | Rejected:
        """Ask a Python engine."""
        return engine.admit(self.request, self.tokens)


@dataclass(frozen=True)
class Finish:
    """Request ``request`` is done: its blocks are freed."""

    request: int

    def to_json(self) -> dict[str, Any]:
        """The operation as a protocol message."""
        return {"op": "finish", "request": self.request}

    def decode(self, value: Any) -> None:
        """A program's answer line: anything, ignored."""

    def call(self, engine: StatefulEngine) -> None:
        """Tell a Python engine."""
        engine.finish(self.request)


Op = Admit | Finish


@dataclass(frozen=True)
class Create:
    """Make the engine for ``config``."""

    config: EngineConfig

    def to_json(self) -> dict[str, Any]:
        """The ``create`` message."""
        return {"op": "create", **self.config.to_json()}

    def decode(self, value: Any) -> None:
        """A program's answer line: anything, ignored."""


@dataclass(frozen=True)
class Look:
    """Ask what the engine holds of ``tokens`` (the ``snapshot`` message), answered in
    rows of ``config``'s groups."""

    tokens: tuple[int, ...]
    config: EngineConfig

    def to_json(self) -> dict[str, Any]:
        """The ``snapshot`` message."""
        return {"op": "snapshot", "tokens": list(self.tokens)}

    def decode(self, value: Any) -> Snapshot:
        """A program's answer line (:func:`decode_snapshot`)."""
        return decode_snapshot(value, self.config)

    def call(self, engine: StatefulEngine | StepEngine) -> Snapshot:
        """Ask a Python engine."""
        return engine.snapshot(self.tokens)


Message = Create | Look | Admit | Finish
"""What kvhit sends a stateful engine."""


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


def parse_config(obj: Any) -> EngineConfig:
    """Check a ``create`` message (or a program's configuration) and build its
    :class:`~kvhit.contract.EngineConfig`; :class:`QueryError` naming the field.

    >>> parse_config({"groups": [{"kind": "full", "block_size": 2}], "num_blocks": 4}).alignment
    2
    """
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
    stores = parse_stores(obj.get("tiers", []))
    return EngineConfig(groups, num_blocks, alignment, hash_unit, stores)


@dataclass(frozen=True)
class Program:
    """An engine's configuration and the operations to run on it, in order."""

    groups: tuple[Group, ...]
    num_blocks: int
    alignment: int
    ops: tuple[Op, ...] = ()
    hash_unit: int | None = None
    tiers: tuple[Store, ...] = ()

    def config(self) -> EngineConfig:
        """The engine it runs on (what a factory is called with)."""
        return EngineConfig(
            self.groups, self.num_blocks, self.alignment, self.hash_unit, self.tiers
        )

    def to_json(self) -> dict[str, Any]:
        """The program as JSON (the replay file's ``program``)."""
        return {**self.config().to_json(), "ops": [op.to_json() for op in self.ops]}

    @staticmethod
    def from_json(obj: Any) -> Program:
        """Check a program object and build it; :class:`QueryError` naming the field."""
        c = parse_config(obj)
        ops = obj.get("ops", [])
        if not isinstance(ops, list):
            raise QueryError("ops", "must be a list of operations")
        parsed = tuple(parse_op(o, i) for i, o in enumerate(ops))
        return Program(c.groups, c.num_blocks, c.alignment, parsed, c.hash_unit, c.stores)


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
    if not isinstance(tokens, list) or not tokens or not all(_is_id(t) for t in tokens):
        raise QueryError(f"{field}.tokens", "must be a non-empty list of non-negative integers")
    return Admit(request, tuple(tokens))


def _is_id(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


# --- a program's answer lines, decoded into the contract's values ---------------------


def decode_admit(value: Any) -> Admitted | Rejected:
    """An ``admit`` answer line as the typed answer; :class:`BadReturn` if it is not
    shaped as the protocol says (what it claims is checked by :func:`check_admit`).

    >>> decode_admit({"length": 2, "reused": [[1]], "tables": [[1, 3]],
    ...               "moves": [["restore", [0, 1], 3]]})
    Admitted(length=2, reused=((1,),), tables=((1, 3),), outputs_match=None, moves=(TierMove(direction=<Direction.RESTORE: 'restore'>, block=3, tier=0, slot=1),))
    >>> decode_admit({"rejected": "full"})
    Rejected(reason='full')
    """
    if isinstance(value, dict) and "rejected" in value:
        return Rejected(str(value["rejected"]))
    if not isinstance(value, dict) or not {"length", "reused", "tables"} <= set(value):
        raise BadReturn(f"admit must answer {{'length', 'reused', 'tables'}}, got {shown(value)}")
    rows = {}
    for name in ("reused", "tables"):
        if not isinstance(value[name], list):
            raise BadReturn(f"{name} must hold one list per group, got {shown(value[name])}")
        rows[name] = tuple(
            _id_list(r, f"{name}[{i}]", name == "tables") for i, r in enumerate(value[name])
        )
    outputs_match = value.get("outputs_match")
    shown_match = outputs_match if isinstance(outputs_match, bool) else None
    moves = decode_moves(value.get("moves", []))
    return Admitted(value["length"], rows["reused"], rows["tables"], shown_match, moves)


def decode_moves(value: Any) -> tuple[TierMove, ...]:
    """An admit's ``moves``; :class:`BadReturn` if malformed.

    >>> decode_moves([["spill", 3, [0, 1]]])
    (TierMove(direction=<Direction.SPILL: 'spill'>, block=3, tier=0, slot=1),)
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
        if not (isinstance(there, list) and len(there) == 2):
            raise BadReturn(f"a move names a block id and a [tier, slot], got {shown(move)}")
        out.append(TierMove(direction, block, there[0], there[1]))
    return tuple(out)


def decode_snapshot(value: Any, config: EngineConfig) -> Snapshot:
    """A ``snapshot`` answer line of an engine of ``config``: its rows read as a
    query's rows are (with the hash unit, partial blocks too) and, with stores, its
    ``tiers``; :class:`BadReturn` if malformed."""
    groups, unit = config.groups, config.hash_unit
    rows = value.get("cached") if isinstance(value, dict) else value
    if not isinstance(rows, list) or len(rows) != len(groups):
        raise BadReturn(
            f"snapshot must answer {{'cached': [one row per group]}}, got {shown(value)}"
        )
    tiers = value.get("tiers") if isinstance(value, dict) else None
    try:
        cached = tuple(
            parse_row(r, f"cached[{i}]", g, unit) for i, (g, r) in enumerate(zip(groups, rows))
        )
        return Snapshot(cached, parse_tiers(tiers, groups, unit) if config.stores else ())
    except QueryError as err:
        raise BadReturn(f"snapshot: {err}") from None


# --- the typed answers, checked against the engine's configuration --------------------


@dataclass(frozen=True)
class Admission:
    """An admit kvhit accepted: the engine's :class:`~kvhit.contract.Admitted` and, per
    group, the copy of the block the hit ends inside that it implies (its table index
    and the cached block copied; None: no copy, and empty: none in any group)."""

    admitted: Admitted
    copied: tuple[tuple[int, int] | None, ...] = ()

    def copy_of(self, group: int) -> tuple[int, int] | None:
        """Group ``group``'s copy: (table index, cached block copied there), or None."""
        return self.copied[group] if self.copied else None

    def read_block(self, group: int, j: int) -> int | None:
        """The physical block the hit reads at index j of group ``group``: the table's,
        or the cached block copied there."""
        copy = self.copy_of(group)
        if copy is not None and copy[0] == j:
            return copy[1]
        table = self.admitted.tables[group]
        return table[j] if j < len(table) else None

    def reused_indices(self) -> list[list[int]]:
        """Per group, the block indices whose table entry was taken from the cache (a
        copy's index included)."""
        out = []
        a = self.admitted
        for i, (table, reused) in enumerate(zip(a.tables, map(set, a.reused))):
            taken = {j for j, block in enumerate(table) if block is not None and block in reused}
            copy = self.copy_of(i)
            out.append(sorted(taken if copy is None else {*taken, copy[0]}))
        return out

    def listed(self) -> dict[str, Any]:
        """The admit as a stateless answer: the length and the reused block indices."""
        return {"length": self.admitted.length, "blocks": self.reused_indices()}


def _id_list(value: Any, field: str, nullable: bool) -> tuple[Any, ...]:
    if not isinstance(value, list | tuple):
        raise BadReturn(f"{field} must be a list of block ids")
    for block in value:
        if block is None and nullable:
            continue
        if not _is_id(block):
            raise BadReturn(f"{field} holds {shown(block)}, not a block id")
    return tuple(value)


def check_admit(value: Any, config: EngineConfig) -> Admission | Rejected:
    """An engine's ``admit`` answer, checked against its ``config``: an
    :class:`~kvhit.contract.Admitted` with a length, one list of block ids per group
    (a table may hold None), at most a copy's block outside a table (:func:`copy_in`),
    and moves between blocks and the slots of its stores; or a
    :class:`~kvhit.contract.Rejected`. :class:`BadReturn` otherwise.

    >>> from kvhit.model.spec import Group
    >>> config = EngineConfig((Group("full", 4),), 8, 2, 2)
    >>> check_admit(Admitted(6, ((10, 11),), ((10, 12),)), config).copied
    ((1, 11),)
    >>> check_admit(Admitted(4, ((10, 11),), ((10, 12),)), config)
    Traceback (most recent call last):
    ...
    kvhit.targets.wire.BadReturn: group 0 reuses block 11, which is not in its table
    """
    if isinstance(value, Rejected):
        return value
    if not isinstance(value, Admitted):
        raise BadReturn(f"admit must answer Admitted or Rejected, got {shown(value)}")
    length, groups = value.length, config.groups
    if not isinstance(length, int) or isinstance(length, bool):
        raise BadReturn(f"the length must be an integer, got {shown(length)}")
    for name, rows in (("reused", value.reused), ("tables", value.tables)):
        if not isinstance(rows, list | tuple) or len(rows) != len(groups):
            raise BadReturn(f"{name} must hold one list per group ({len(groups)})")
    reused = tuple(_id_list(r, f"reused[{i}]", False) for i, r in enumerate(value.reused))
    tables = tuple(_id_list(t, f"tables[{i}]", True) for i, t in enumerate(value.tables))
    copied = tuple(
        copy_in(i, g, ids, table, length)
        for i, (g, ids, table) in enumerate(zip(groups, reused, tables))
    )
    if value.outputs_match is not None and not isinstance(value.outputs_match, bool):
        raise BadReturn(f"outputs_match must be a bool or None, got {shown(value.outputs_match)}")
    moves = check_moves(value.moves, config.stores)
    checked = Admitted(length, reused, tables, value.outputs_match, moves)
    return Admission(checked, copied if any(copied) else ())


def check_moves(moves: Any, stores: tuple[Store, ...]) -> tuple[TierMove, ...]:
    """An admit's moves, each between a block and a slot of one of ``stores``;
    :class:`BadReturn` otherwise."""
    if not isinstance(moves, list | tuple):
        raise BadReturn(f"moves must be a list, got {shown(moves)}")
    for m in moves:
        if not isinstance(m, TierMove) or not all(map(_is_id, (m.block, m.tier, m.slot))):
            raise BadReturn(f"a move names a block id and a [tier, slot], got {shown(m)}")
        if m.tier >= len(stores):
            raise BadReturn(f"a move names tier {m.tier}; the engine has {len(stores)}")
    return tuple(moves)


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


def check_snapshot(value: Any, config: EngineConfig) -> Snapshot:
    """An engine's ``snapshot`` answer, checked against its ``config``: a
    :class:`~kvhit.contract.Snapshot` with one row per group (booleans, and with a hash
    unit partial blocks inside their block) and, with stores, one tier per store, in
    order, named and holding as created, with rows of the groups of the kinds it holds.
    :class:`BadReturn` otherwise.

    >>> from kvhit.model.spec import Group
    >>> config = EngineConfig((Group("full", 4),), 8, 2, 2)
    >>> check_snapshot(Snapshot(((True, Upto(6)),)), config).cached
    ((True, Upto(end=6)),)
    >>> check_snapshot(Snapshot(((Upto(4),),)), config)
    Traceback (most recent call last):
    ...
    kvhit.targets.wire.BadReturn: snapshot: cached[0][0].upto: 4 is not a fine boundary inside block 0 (tokens 0 … 3)
    """
    if not isinstance(value, Snapshot):
        raise BadReturn(f"snapshot must answer a Snapshot, got {shown(value)}")
    groups = config.groups
    if not isinstance(value.cached, list | tuple) or len(value.cached) != len(groups):
        raise BadReturn(f"snapshot must hold one row per group ({len(groups)})")
    rows = tuple(
        check_row(r, f"cached[{i}]", g, config.hash_unit)
        for i, (g, r) in enumerate(zip(groups, value.cached))
    )
    names = [t.name if isinstance(t, Tier) else None for t in value.tiers]
    if names != [s.name for s in config.stores]:
        expected = ", ".join(s.name for s in config.stores) or "none"
        raise BadReturn(f"snapshot: tiers must name the engine's stores in order ({expected})")
    tiers = tuple(check_tier(t, s, config) for t, s in zip(value.tiers, config.stores))
    return Snapshot(rows, tiers)


def check_tier(tier: Tier, store: Store, config: EngineConfig) -> Tier:
    """A snapshot's tier for ``store``: its kinds, and a row (or None) per group, rows
    only for groups of the kinds it holds."""
    if tier.holds != store.holds or len(tier.cached) != len(config.groups):
        raise BadReturn(
            f"snapshot: tier {store.name} must hold its store's kinds and one entry per group"
        )
    rows: list[tuple[bool | Upto, ...] | None] = []
    for i, (g, row) in enumerate(zip(config.groups, tier.cached)):
        if row is not None and g.kind not in store.holds:
            raise BadReturn(f"snapshot: tier {store.name} holds a row of {g.kind} group {i}")
        field = f"tiers[{store.name}].cached[{i}]"
        rows.append(None if row is None else check_row(row, field, g, config.hash_unit))
    return Tier(tier.name, tier.holds, tuple(rows))


def check_row(row: Any, field: str, g: Group, hash_unit: int | None) -> tuple[bool | Upto, ...]:
    """A snapshot's row of group g: booleans, and with a hash unit partial blocks
    (:class:`~kvhit.model.spec.Upto`) inside their block."""
    if not isinstance(row, list | tuple):
        raise BadReturn(f"snapshot: {field} must be a row, got {shown(row)}")
    for j, entry in enumerate(row):
        if isinstance(entry, bool):
            continue
        if not isinstance(entry, Upto):
            raise BadReturn(f"snapshot: {field}[{j}] must be a bool or an Upto, got {shown(entry)}")
        if hash_unit is None:
            raise BadReturn(f"snapshot: {field}[{j}]: a partial block needs a hash unit")
        problem = partial_problem(entry.end, j, g, hash_unit)
        if problem is not None:
            raise BadReturn(f"snapshot: {field}[{j}].upto: {problem}")
    return tuple(row)


class EngineHost:
    """A Python engine behind the stateful (or step) messages: ``create`` makes it with
    ``factory`` (called with the :class:`~kvhit.contract.EngineConfig`), the others are
    calls on it (each message's ``call``), and its typed answers pass through as they
    are (the harness checks them: :func:`check_admit`, :func:`check_snapshot`).
    ``capabilities`` is what the factory declares."""

    def __init__(self, factory: EngineFactory | StepFactory):
        self.factory = factory
        self.capabilities = capabilities_of(factory)
        self.engine: Any = None

    def __call__(self, message: Any) -> Any:
        if isinstance(message, Create):
            self.engine = self.factory(message.config)
            return None
        assert self.engine is not None, "an engine is created before it is used"
        return message.call(self.engine)
