"""What a target is: the contracts kvhit checks code through, and what each declares it
can be asked (docs/design.md §5.2, §5.6).

A *lookup target* answers one query (:class:`LookupTarget`); a *stateful engine* is a
prefix cache driven by a program of requests (:class:`StatefulEngine`, made by an
:data:`EngineFactory` from an :class:`EngineConfig`). Both declare their
:class:`Capabilities`: which kinds, drafters, window conventions, hash units and tiers
they can be asked, and rules (each with its reason) for the rest. kvhit draws only
what a target declares; a query outside it is refused before the target is called, with
the rule's reason, so ``unsupported`` is left for what a target refuses at run time.

In process the values are typed: a target gets a :class:`~kvhit.model.spec.Query`, a
factory an :class:`EngineConfig`. JSON is only for a process boundary
(``--target-cmd``, ``--isolate``).

A user's function declares what it can be asked with :func:`declare`; undeclared, it
is asked the base language (:data:`BASE`: every kind, drafter, window convention and
hash unit, no tiers):

    >>> @declare(kinds=["full", "sliding_window"], tiers=True)
    ... def find_hit(query):
    ...     return 0
    >>> capabilities_of(find_hit).kinds == {Kind.FULL, Kind.SLIDING_WINDOW}
    True
    >>> capabilities_of(lambda query: 0) == BASE
    True

A step-level engine (a scheduler's loop, :class:`StepEngine`) shares the stateful
engine's configuration, capabilities and snapshot; its requests arrive, are aborted,
and run in the steps it schedules.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import StrEnum
from typing import Any, Protocol, runtime_checkable

from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import DRAFTERS, Drafter, Group, Kind, Query, Tier, Upto, WindowConvention

Refusal = Callable[[Query], str | None]
"""A rule of what a target can be asked: why it cannot be asked a query, or None."""


@dataclass(frozen=True)
class Rule:
    """One capability predicate beyond the declared data: its ``name`` (for reports)
    and the function saying why a query cannot be asked (None: it can). A rule reads a
    query's configuration (groups, alignment, hash unit, lengths, which tiers), so a
    drawn configuration is kept or redrawn as a whole; one that ``reads_rows`` (what
    one engine's index can hold, say SGLang's radix tree) is also checked on every
    drawn state."""

    name: str
    refuses: Refusal
    reads_rows: bool = False


@dataclass(frozen=True)
class Option:
    """An option a built-in takes (``--option NAME=VALUE``): its ``name``, the
    ``values`` it may have (the first is the default) and what it means."""

    name: str
    values: tuple[str, ...]
    help: str = ""

    @property
    def default(self) -> str:
        """The value when it is not given."""
        return self.values[0]


@dataclass(frozen=True)
class StepLoop:
    """What a step-level engine (:class:`StepEngine`) can be driven through: whether
    its executor may ``cut`` a scheduled step short (an engine that publishes a block
    at schedule time relies on every scheduled step running, so it declares no cuts),
    whether it runs ``asynchronous``ly (each step reported one late), whether it
    loads blocks from outside whose load may fail (``load_failures``), and whether its
    model writes a Mamba state at every block end a step passes (``boundary_states``,
    as kvhit's tiny model does) or only at the step's last token (vLLM's ``align``
    mode, which splits chunks at block ends instead)."""

    cuts: bool = True
    asynchronous: bool = True
    load_failures: bool = False
    boundary_states: bool = False

    def to_json(self) -> dict[str, bool]:
        """The protocol form."""
        return {"cuts": self.cuts, "asynchronous": self.asynchronous,
                "load_failures": self.load_failures,
                "boundary_states": self.boundary_states}  # fmt: skip


@dataclass(frozen=True)
class Capabilities:
    """What a target can be asked (docs/design.md §5.2).

    ``kinds``, ``drafters`` (None stands for a group with no drafter, always allowed)
    and ``conventions`` are the groups it takes; ``hash_units`` whether a query may
    have a hash unit finer than its blocks; ``tiers`` whether a query may name
    external tiers; ``rules`` the rest, each with its reason. ``loop`` says what a
    step-level engine's loop can be driven through (None: it is no step-level engine).

    >>> from kvhit.model.protocol import parse_query
    >>> caps = Capabilities(kinds=frozenset({Kind.FULL}))
    >>> caps.refusal(parse_query({"groups": [{"kind": "mamba", "block_size": 1}],
    ...                           "cached": ["1"], "max_length": 1}))
    'declares no mamba groups (it takes full)'
    """

    kinds: frozenset[Kind] = frozenset(Kind)
    drafters: frozenset[Drafter] = frozenset(Drafter)
    conventions: frozenset[WindowConvention] = frozenset(WindowConvention)
    hash_units: bool = True
    tiers: bool = False
    rules: tuple[Rule, ...] = ()
    loop: StepLoop | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "kinds", frozenset(map(Kind, self.kinds)))
        object.__setattr__(self, "drafters", frozenset(map(Drafter, self.drafters)))
        object.__setattr__(self, "conventions", frozenset(map(WindowConvention, self.conventions)))
        if not self.kinds:
            raise ValueError("a target must take at least one kind")

    def drafters_for(self, kind: Kind) -> tuple[Drafter, ...]:
        """The drafters a group of ``kind`` may carry here."""
        return tuple(d for d in DRAFTERS[kind] if d in self.drafters)

    def group_refusal(self, g: Group) -> str | None:
        """Why a group like ``g`` cannot be asked, or None."""
        if g.kind not in self.kinds:
            taken = ", ".join(k.value for k in Kind if k in self.kinds)
            return f"declares no {g.kind} groups (it takes {taken})"
        if g.drafter is not None and g.drafter not in self.drafters:
            return f"declares no {g.drafter} drafters"
        if g.kind == Kind.SLIDING_WINDOW and g.window_convention not in self.conventions:
            return f"declares no {g.window_convention} windows"
        return None

    def refusal(self, q: Query) -> str | None:
        """Why ``q`` cannot be asked of a target with these capabilities, or None."""
        return self.configuration_refusal(q) or self.rows_refusal(q)

    def configuration_refusal(self, q: Query) -> str | None:
        """Why no state of ``q``'s configuration can be asked (its rows unread), or None."""
        for g in q.groups:
            why = self.group_refusal(g)
            if why is not None:
                return why
        if q.hash_unit is not None and not self.hash_units:
            return "declares no hash units"
        if q.tiers and not self.tiers:
            names = ", ".join(t.name for t in q.tiers)
            return f"reads its own pool only: a query with tiers ({names}) is not asked of it"
        return self.rules_refusal(q, reads_rows=False)

    def rows_refusal(self, q: Query) -> str | None:
        """Why ``q``'s rows cannot be asked (the rules that read rows), or None."""
        return self.rules_refusal(q, reads_rows=True)

    def rules_refusal(self, q: Query, reads_rows: bool) -> str | None:
        """The first reason of the rules that do (or do not) read rows, or None."""
        for rule in self.rules:
            if rule.reads_rows == reads_rows:
                why = rule.refuses(q)
                if why is not None:
                    return why
        return None

    @property
    def reads_rows(self) -> bool:
        """Whether some rule reads rows (so every drawn state is checked)."""
        return any(rule.reads_rows for rule in self.rules)

    def allows(self, q: Query) -> bool:
        """Whether ``q`` may be asked."""
        return self.refusal(q) is None

    def with_rules(self, *rules: Rule) -> Capabilities:
        """These capabilities with ``rules`` added."""
        return replace(self, rules=self.rules + rules)

    def to_json(self) -> dict[str, Any]:
        """The declared data (rules by name: they are code and stay in their process)."""
        return {
            "kinds": [k.value for k in Kind if k in self.kinds],
            "drafters": [d.value for d in Drafter if d in self.drafters],
            "conventions": [c.value for c in WindowConvention if c in self.conventions],
            "hash_units": self.hash_units,
            "tiers": self.tiers,
            "rules": [r.name for r in self.rules],
            "loop": self.loop.to_json() if self.loop is not None else None,
        }

    @staticmethod
    def from_json(obj: Mapping[str, Any]) -> Capabilities:
        """The data of :meth:`to_json` (rules stay with the target that has them)."""
        return Capabilities(
            kinds=frozenset(obj["kinds"]),
            drafters=frozenset(obj["drafters"]),
            conventions=frozenset(obj["conventions"]),
            hash_units=bool(obj["hash_units"]),
            tiers=bool(obj["tiers"]),
            loop=StepLoop(**obj["loop"]) if obj.get("loop") else None,
        )


BASE = Capabilities()
"""The base language: what an undeclared target is asked."""

CAPABILITIES_ATTR = "kvhit_capabilities"
"""The attribute :func:`declare` sets on a function."""


def declare(
    kinds: Iterable[Kind | str] = tuple(Kind),
    drafters: Iterable[Drafter | str] = tuple(Drafter),
    conventions: Iterable[WindowConvention | str] = tuple(WindowConvention),
    hash_units: bool = True,
    tiers: bool = False,
    rules: Sequence[Rule] = (),
    loop: StepLoop | None = None,
) -> Callable[[Any], Any]:
    """A decorator: the function (a lookup, or an engine factory) can be asked these
    (:class:`Capabilities`); kvhit draws nothing else for it. A factory of step-level
    engines declares its ``loop``."""
    caps = Capabilities(
        frozenset(map(Kind, kinds)),
        frozenset(map(Drafter, drafters)),
        frozenset(map(WindowConvention, conventions)),
        hash_units,
        tiers,
        tuple(rules),
        loop,
    )

    def mark(func: Any) -> Any:
        setattr(func, CAPABILITIES_ATTR, caps)
        return func

    return mark


def capabilities_of(target: Any) -> Capabilities:
    """What ``target`` declares: its ``capabilities`` (a built-in), what :func:`declare`
    set, else :data:`BASE`."""
    found = getattr(target, "capabilities", None) or getattr(target, CAPABILITIES_ATTR, None)
    return found if isinstance(found, Capabilities) else BASE


@runtime_checkable
class LookupTarget(Protocol):
    """A target that answers one query: its :class:`Capabilities` and its answer (an
    int, or ``{"length": L, "blocks": [[j, ...] per group]}``); it raises
    :class:`~kvhit.errors.Unsupported` for what it refuses at run time."""

    @property
    def capabilities(self) -> Capabilities:
        """What it can be asked."""
        ...

    def ask(self, q: Query) -> Any:
        """The answer to ``q``."""
        ...


@dataclass(frozen=True)
class QueryTarget:
    """A lookup written over parsed queries, as the built-ins are. Called with a
    protocol message, as a user's function is, it parses the message first; a runner in
    this process hands it the :class:`~kvhit.model.spec.Query` itself (:meth:`ask`).

    >>> QueryTarget(lambda q: {"length": q.max_length})({"groups": [{"kind": "full", "block_size": 1}],
    ...                                                  "cached": ["1"], "max_length": 1})
    {'length': 1}
    """

    answer: Callable[[Query], Any]
    capabilities: Capabilities = BASE

    def __call__(self, message: dict[str, Any]) -> Any:
        return self.ask(parse_query(message))

    def ask(self, q: Query) -> Any:
        """Its answer to ``q``; :class:`~kvhit.errors.Unsupported` with the reason when
        its capabilities refuse ``q``.

        >>> from kvhit.model.protocol import parse_query
        >>> QueryTarget(lambda q: {"length": 0}).ask(parse_query(
        ...     {"groups": [{"kind": "full", "block_size": 1}], "cached": [""], "max_length": 1,
        ...      "tiers": [{"name": "cpu", "holds": ["full"], "cached": {"0": "1"}}]}))
        Traceback (most recent call last):
        ...
        kvhit.errors.Unsupported: reads its own pool only: a query with tiers (cpu) is not asked of it
        """
        why = self.capabilities.refusal(q)
        if why is not None:
            raise Unsupported(why)
        return self.answer(q)


@dataclass(frozen=True)
class FunctionTarget:
    """A user's function of protocol messages as a :class:`LookupTarget`: it gets the
    normalized query (``Query.to_json()``) and declares what :func:`capabilities_of`
    finds on it."""

    func: Callable[[dict[str, Any]], Any]
    capabilities: Capabilities = BASE

    def ask(self, q: Query) -> Any:
        """The function's answer to ``q`` as a message."""
        return self.func(q.to_json())


def lookup_target(obj: Any) -> LookupTarget:
    """``obj`` as a :class:`LookupTarget`: itself if it is one, else a function of
    protocol messages (:class:`FunctionTarget`)."""
    if isinstance(obj, LookupTarget):
        return obj
    return FunctionTarget(obj, capabilities_of(obj))


# The stateful contract (docs/design.md §5.6).


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


@dataclass(frozen=True)
class EngineConfig:
    """What a stateful engine is made for: its groups, a pool of ``num_blocks``
    physical blocks, the alignment A, perhaps a hash unit, and its external stores."""

    groups: tuple[Group, ...]
    num_blocks: int
    alignment: int
    hash_unit: int | None = None
    stores: tuple[Store, ...] = ()
    budget: int | None = None
    """A step-level engine's token budget per step (None: the engine's own)."""
    asynchronous: bool = False
    """Whether a step-level engine schedules a step before the last one is reported."""

    def to_json(self) -> dict[str, Any]:
        """The ``create`` message without its ``op`` (the protocol's form)."""
        out: dict[str, Any] = {
            "groups": [g.to_json() for g in self.groups],
            "num_blocks": self.num_blocks,
            "alignment": self.alignment,
        }
        if self.hash_unit is not None:
            out["hash_unit"] = self.hash_unit
        if self.stores:
            out["tiers"] = [s.to_json() for s in self.stores]
        if self.budget is not None:
            out["budget"] = self.budget
        if self.asynchronous:
            out["asynchronous"] = True
        return out

    def as_query(self, num_tokens: int) -> Query:
        """The configuration as a query with nothing cached, for a request of
        ``num_tokens`` tokens (what a capability rule reads)."""
        tiers = tuple(Tier(s.name, s.holds, (None,) * len(self.groups)) for s in self.stores)
        rows = ((),) * len(self.groups)
        return Query(
            self.groups, rows, num_tokens - 1, num_tokens, self.alignment, self.hash_unit, tiers
        )


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


@dataclass(frozen=True)
class Admitted:
    """An engine's answer to ``admit``: the hit length, the physical blocks each group
    took from the cache, each group's block table (None where the request holds no
    block), whether its served output matched a computation from scratch (None: it
    cannot tell) and, with stores, the moves it made, in order."""

    length: int
    reused: tuple[tuple[int, ...], ...]
    tables: tuple[tuple[int | None, ...], ...]
    outputs_match: bool | None = None
    moves: tuple[TierMove, ...] = ()

    def to_json(self) -> dict[str, Any]:
        """The protocol form."""
        out: dict[str, Any] = {
            "length": self.length,
            "reused": [list(r) for r in self.reused],
            "tables": [list(t) for t in self.tables],
        }
        if self.outputs_match is not None:
            out["outputs_match"] = self.outputs_match
        if self.moves:
            out["moves"] = [m.to_json() for m in self.moves]
        return out


@dataclass(frozen=True)
class Rejected:
    """The pool cannot hold the request now (the engine must be unchanged)."""

    reason: str

    def to_json(self) -> dict[str, Any]:
        """The protocol form."""
        return {"rejected": self.reason}


@dataclass(frozen=True)
class Snapshot:
    """Which blocks of some tokens an engine finds cached: one row per group (with a
    hash unit, a partially filled block as :class:`~kvhit.model.spec.Upto`) and, with
    stores, what each holds as a tier of the query."""

    cached: tuple[tuple[bool | Upto, ...], ...]
    tiers: tuple[Tier, ...] = field(default=())

    def to_json(self) -> dict[str, Any]:
        """The protocol form."""
        out: dict[str, Any] = {
            "cached": [
                [e.to_json() if isinstance(e, Upto) else e for e in row] for row in self.cached
            ]
        }
        if self.tiers:
            out["tiers"] = [t.to_json() for t in self.tiers]
        return out


@runtime_checkable
class StatefulEngine(Protocol):
    """A prefix cache driven by a program (docs/design.md §5.6): ``admit`` looks up,
    allocates, computes and caches one new prompt; ``finish`` frees a request;
    ``snapshot`` says what the cache holds of some tokens."""

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """Serve a new prompt."""
        ...

    def finish(self, request: int) -> None:
        """Free the request's blocks."""
        ...

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """What the cache holds of ``tokens``."""
        ...


EngineFactory = Callable[[EngineConfig], StatefulEngine]
"""What a stateful target is: a function making an engine for a configuration; it may
declare :class:`Capabilities` (an attribute ``capabilities``, or :func:`declare`)."""


# The step contract: a prefix cache inside its scheduler's loop (docs/design.md §5.7).


@dataclass(frozen=True)
class Scheduled:
    """One request's part of a step as the engine scheduled it.

    The step computes the request's tokens ``[computed, computed + new)`` (its prompt,
    then the tokens sampled so far), reading its KV before ``computed`` through
    ``tables`` (one block table per group, None where the request holds no block), and
    then ``drafts`` speculative tokens past them. ``hit`` is set on the step that
    (re)starts the request, after its arrival or a preemption: the tokens it took from
    the cache. ``loaded`` lists, per group, the physical blocks of that hit loaded from
    outside the pool in this step (a connector's load), the ones a load failure may
    name.

        >>> Scheduled(0, computed=4, new=2, tables=((7, 8, 9),), hit=4).end
        6
    """

    request: int
    computed: int
    new: int
    tables: tuple[tuple[int | None, ...], ...]
    hit: int | None = None
    drafts: int = 0
    loaded: tuple[tuple[int, ...], ...] = ()

    @property
    def end(self) -> int:
        """The first token this step does not compute (drafts aside)."""
        return self.computed + self.new


@dataclass(frozen=True)
class StepPlan:
    """What an engine decided for one step: the requests it runs, those it
    preempted to make room (their blocks freed; each restarts later from a hit), the
    blocks it copied since its last plan, before this step runs (``copies``: source,
    destination; the destination then holds what the source held, e.g. SGLang's copy
    of a request's Mamba state into a slot for its tree), and the parts it still runs
    for requests already aborted (``draining``: their writes happen, what they sample
    is dropped; SGLang runs an aborted request's next step before it frees it)."""

    scheduled: tuple[Scheduled, ...]
    preempted: tuple[int, ...] = ()
    copies: tuple[tuple[int, int], ...] = ()
    draining: tuple[Scheduled, ...] = ()


@dataclass(frozen=True)
class Ran:
    """The executor's report of one request's part of a step: the tokens it sampled
    (none for a prompt chunk that does not reach the prompt's end; one plus the drafts
    accepted otherwise)."""

    request: int
    sampled: tuple[int, ...]


@dataclass(frozen=True)
class StepResult:
    """The executor's report of one step (what a model runner returns): what each
    request that ran sampled, the requests whose part was cut short and never ran, and
    the loaded blocks whose load failed (reported after the fact)."""

    ran: tuple[Ran, ...]
    cut: tuple[int, ...] = ()
    invalid: tuple[int, ...] = ()


@runtime_checkable
class StepEngine(Protocol):
    """A prefix cache inside its scheduler's loop (docs/design.md §5.7): requests
    arrive and may be aborted; the engine decides each step (:meth:`schedule`), kvhit
    runs it as the model executor and reports it (:meth:`executed`), possibly one step
    late (asynchronous scheduling). ``snapshot`` is the stateful contract's."""

    def arrive(self, request: int, prompt: Sequence[int], max_new: int) -> None:
        """A new request: its prompt, and how many tokens it generates before it
        finishes."""
        ...

    def abort(self, request: int) -> None:
        """The client gave up on the request: free it."""
        ...

    def schedule(self) -> StepPlan:
        """Decide the next step."""
        ...

    def executed(self, result: StepResult) -> tuple[int, ...]:
        """The oldest step not yet reported has run: update from ``result``; the
        requests now finished (all their tokens generated)."""
        ...

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """What the cache holds of ``tokens``."""
        ...


StepFactory = Callable[[EngineConfig], StepEngine]
"""What a step-level target is: a function making a :class:`StepEngine` for a
configuration (the configuration says whether steps are reported one late:
:attr:`EngineConfig.asynchronous`)."""
