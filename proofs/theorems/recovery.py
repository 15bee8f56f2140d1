"""Theorem 11: recovery after a failed KV load (docs/design.md §1.8).

Every goal runs on a symbolic query (:func:`kvhit.proofs.common.sym_query`: rows, M,
windows and chunks are z3 terms) with, per group, symbolic block indices reported
invalid (:func:`invalid_slots`; -1 names no block).

- ``recovered_is_longest``: the model's own ``recovered_length`` (``fixed_point`` over
  ``pruned``, on z3 terms) returns L* of the pruned rows, and that is the longest
  valid prefix given the invalid blocks read off the query itself (:func:`intact`:
  every block each group reuses, by the model's ``reused_range``, is cached and not
  named invalid), for every cache state and every set of invalid blocks.
- ``<rule>_recovers``, one per rule of
  :data:`~kvhit.model.recovery.WRONG_RECOVERY_RULES`: "the rule answers the recovered
  L*", refuted on a state where the cache holds exactly the blocks the request
  loaded at its hit (so an engine that recovers in place and one that looks up
  again agree on L*), with at least one loaded block invalid; goals go from one
  group up, and the counterexample has the smallest M, then the fewest cached
  blocks, then the fewest invalid ones.

    >>> [goal.name for goal in longest_goals(2)][:2]
    ['1 group: full b=1 (A=1)', '1 group: sliding_window b=1 (A=1)']
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

import z3

from kvhit.model import recovery
from kvhit.model.algorithms import fixed_point
from kvhit.model.ops import PY, Ops
from kvhit.model.recovery import Invalid, RecoveryRule, pruned, recovered_length
from kvhit.model.spec import Kind, Query, reused_range
from kvhit.proofs.common import SymQuery, model_int, spec_answer, sym_query
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.theorems.tiers import ALL_SETS, HYBRID, GroupSet, label

Slots = list[list[Any]]
"""Per group, z3 integers: the indices of its blocks reported invalid."""


def invalid_slots(sq: SymQuery, name: str, per_group: int | None = None) -> tuple[Slots, list[Any]]:
    """Symbolic indices per group and their bounds: by default one per block of its
    row, slot k naming block k or nothing (-1), so every set of blocks once; with
    ``per_group``, that many slots, each any block of the row or -1."""
    slots, pre = [], []
    for i, count in enumerate(sq.blocks):
        group = [z3.Int(f"{name}_bad{i}_{k}") for k in range(per_group or count)]
        if per_group is None:
            pre += [z3.Or(s == -1, s == k) for k, s in enumerate(group)]
        else:
            pre += [z3.And(s >= -1, s < count) for s in group]
        slots.append(group)
    return slots, pre


def kept(q: Query, invalid: Invalid, ops: Ops = PY) -> list[list[Any]]:
    """Per group, per block of its row: cached and named by none of its invalid
    indices (read off the query, not through ``pruned``)."""
    return [
        [ops.and_(ops.bit(row, j), *(ops.not_(s == j) for s in blocks)) for j in range(len(row))]
        for row, blocks in zip(q.cached, invalid)
    ]


def intact(q: Query, held: list[list[Any]], length: Any, ops: Ops = PY) -> Any:
    """§1.8 read off the query itself: ``length`` is 0, or every block each group
    reuses at it (the model's ``reused_range``) is ``held`` (:func:`kept`). No hash
    unit, no drafter, no tiers."""
    served = []
    for g, row in zip(q.groups, held):
        lo, hi = reused_range(g, length, ops)
        served.append(hi <= len(row))
        served += [ops.or_(ops.not_(ops.and_(lo <= j, j < hi)), bit) for j, bit in enumerate(row)]
    return ops.or_(length == 0, ops.and_(*served))


def longest_intact(q: Query, invalid: Invalid, top: int, ops: Ops = PY) -> Any:
    """The longest multiple of A, at most M and ``top``, that is :func:`intact`."""
    held = kept(q, invalid, ops)
    best: Any = 0
    for length in range(0, top + 1, q.alignment):
        fits = ops.and_(length <= q.max_length, intact(q, held, length, ops))
        best = ops.ite(fits, length, best)
    return best


def concrete_invalid(sq: SymQuery, q: Query, slots: Slots, model: z3.ModelRef) -> list[list[int]]:
    """The invalid blocks the solver's model names, per group, within the concrete
    query's rows (a block past them is one no hit of at most M looks at)."""
    return [
        sorted({j for s in group if 0 <= (j := model_int(model, s)) < len(row)})
        for group, row in zip(slots, q.cached)
    ]


def invalid_note(invalid: Sequence[Sequence[int]]) -> str:
    """``reported invalid, drawn as not cached: group 0 block 2``."""
    parts = [
        f"group {i} block{'s' if len(blocks) > 1 else ''} {', '.join(map(str, blocks))}"
        for i, blocks in enumerate(invalid)
        if blocks
    ]
    return "reported invalid, drawn as not cached: " + ("; ".join(parts) or "none")


def longest_witness(sq: SymQuery, slots: Slots) -> Callable[[z3.ModelRef], Counterexample]:
    """``recovered_length`` against the longest intact prefix on the concrete query."""

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        invalid = concrete_invalid(sq, q, slots, model)
        got, best = recovered_length(q, invalid), longest_intact(q, invalid, q.top)
        answers = {"recovered": got, "longest intact prefix": best}
        return Counterexample(
            pruned(q, invalid), "recovered", got, answers, got != best, invalid_note(invalid)
        )

    return witness


def longest_goal(
    kinds: GroupSet, block_size: int, alignment: int, blocks: int, end_to_end: bool
) -> Goal:
    """A counterexample to "L* of the pruned rows is the longest intact prefix" and,
    ``end_to_end``, "so is the recovered hit" (the model's fixed point over them)."""
    sq = sym_query(kinds, blocks * block_size, "rec", [block_size] * len(kinds), alignment)
    slots, pre = invalid_slots(sq, "rec")
    best = longest_intact(sq.query, slots, sq.max_top, sq.ops)
    claim = spec_answer(replace(sq, query=pruned(sq.query, slots, sq.ops))) == best
    if end_to_end:
        claim = z3.And(claim, recovered_length(sq.query, slots, sq.ops) == best)
    name = label(kinds, block_size, alignment) + (", recovered_length" if end_to_end else "")
    return Goal(name, sq.pre + pre, z3.Not(claim), longest_witness(sq, slots))


PRUNED_SETS: tuple[tuple[int, int, tuple[GroupSet, ...], bool], ...] = (
    (1, 1, (*ALL_SETS, HYBRID), False),
    (2, 2, (*ALL_SETS, HYBRID), False),
    (2, 4, (*ALL_SETS, HYBRID), False),
    (1, 1, (HYBRID,), True),
    (2, 2, ((Kind.SLIDING_WINDOW, Kind.MAMBA),), True),
)
"""(block size, alignment, group sets, end to end) ``recovered_is_longest`` runs at:
L* of the pruned rows for every set of one or two groups and a three-group hybrid at
b/A = 1/1, 2/2 and 2/4 (hundredths of a second a goal); the recovered hit itself
(``recovered_length``: the model's fixed point, unrolled, about half a second a
goal) for the hybrid at b = A = 1 and a window beside a Mamba group at b = A = 2. That the
fixed point returns L* of any query is theorems 1-3."""


def longest_goals(bound: int | None) -> list[Goal]:
    """The goals at each row of :data:`PRUNED_SETS`, M of at most ``bound`` blocks."""
    blocks = bound or 3
    return [longest_goal(s, b, a, blocks, whole) for b, a, sets, whole in PRUNED_SETS for s in sets]


RULE_SETS: tuple[GroupSet, ...] = (
    *((kind,) for kind in Kind),
    (Kind.FULL, Kind.SLIDING_WINDOW),
    (Kind.FULL, Kind.MAMBA),
    (Kind.SLIDING_WINDOW, Kind.MAMBA),
    HYBRID,
)
"""One group of each kind, then hybrids, fewest groups first."""

INVALID_PER_GROUP = 2
"""How many blocks of each group the refutations may report invalid."""


def loaded_only(sq: SymQuery, hit: Any) -> list[Any]:
    """Every cached block is one the request loaded: reused at ``hit``."""
    out = []
    for g, row, count in zip(sq.query.groups, sq.query.cached, sq.blocks):
        lo, hi = reused_range(g, hit, sq.ops)
        out += [z3.Implies(sq.ops.bit(row, j), z3.And(lo <= j, j < hi)) for j in range(count)]
    return out


def rule_witness(
    sq: SymQuery, slots: Slots, name: str, run: RecoveryRule
) -> Callable[[z3.ModelRef], Counterexample]:
    """The rule against ``recovered_length`` on the concrete query (both plainly)."""

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        invalid = concrete_invalid(sq, q, slots, model)
        got, best = run(q, invalid, PY), recovered_length(q, invalid)
        answers = {name: got, "recovered L*": best, "hit before the failure": fixed_point(q)}
        note = f"{invalid_note(invalid)}; smallest M, then fewest cached, then fewest invalid"
        return Counterexample(pruned(q, invalid), name, got, answers, got != best, note)

    return witness


def rule_goal(kinds: GroupSet, name: str, run: RecoveryRule, blocks: int) -> Goal:
    """A counterexample to "``run`` answers the recovered L*": the cache holds exactly
    the blocks the request loaded at its hit, and some of them are invalid."""
    sq = sym_query(kinds, blocks, "rrule")
    slots, pre = invalid_slots(sq, "rrule", INVALID_PER_GROUP)
    hit = spec_answer(sq)
    pre += loaded_only(sq, hit)
    pre += [
        z3.Or(s == -1, sq.ops.bit(row, s))
        for row, group in zip(sq.query.cached, slots)
        for s in group
    ]
    named = [z3.If(s >= 0, 1, 0) for group in slots for s in group]
    pre.append(z3.Sum(named) > 0)
    return Goal(
        label(kinds, 1, 1),
        sq.pre + pre,
        run(sq.query, slots, sq.ops)
        != spec_answer(replace(sq, query=pruned(sq.query, slots, sq.ops))),
        witness=rule_witness(sq, slots, name, run),
        minimize=[sq.query.max_length, sq.cached_count(), z3.Sum(named)],
    )


def rule_goals(name: str) -> Callable[[int | None], list[Goal]]:
    """The goals of one known-wrong rule, by its name in
    :data:`~kvhit.model.recovery.WRONG_RECOVERY_RULES` (looked up when the goals are
    built)."""

    def build(bound: int | None) -> list[Goal]:
        run: RecoveryRule = recovery.WRONG_RECOVERY_RULES[name]
        return [rule_goal(kinds, name, run, bound or 4) for kinds in RULE_SETS]

    return build


def rule_theorem(name: str, run: RecoveryRule) -> Theorem:
    """The theorem "the rule ``name`` (the model's ``run``) answers the recovered L*",
    expected refuted."""
    return Theorem(
        name=f"{run.__name__}_recovers",
        statement=(
            f"The recovery rule '{name}' answers L* of the pruned rows after a failed load "
            "(known wrong): refuted on a cache holding exactly the blocks the request "
            "loaded, some reported invalid, minimized (fewest groups, smallest M, fewest "
            "cached, fewest invalid)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=4,
        quick_bound=3,
        build=rule_goals(name),
        rests_on=f"model code: {run.__name__}, recovered_length, pruned, finders",
        scope="M <= N; 1 group of each kind, full+sliding_window, full+mamba, "
        f"sliding_window+mamba, full+sliding_window+mamba; b = A = 1; "
        f"<= {INVALID_PER_GROUP} invalid blocks per group",
    )


THEOREMS = [
    Theorem(
        name="recovered_is_longest",
        statement=(
            "After a failed load, the model's recovered_length (the fixed point over the "
            "pruned rows, on z3 terms) returns L* of the pruned rows, and that is the "
            "longest prefix at which every block each group reuses is cached and not "
            "reported invalid (read off the query), for every cache state and every set "
            "of invalid blocks."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=3,
        quick_bound=2,
        build=longest_goals,
        rests_on="model code: recovered_length, pruned, fixed_point, finders; reused_range",
        scope="M <= N blocks; every set of invalid blocks; L* of the pruned rows: 1-2 groups "
        "of every kind and full+sliding_window+mamba at b/A 1/1, 2/2, 2/4; recovered_length "
        "too: full+sliding_window+mamba at 1/1, sliding_window+mamba at 2/2",
    ),
    *(rule_theorem(name, run) for name, run in recovery.WRONG_RECOVERY_RULES.items()),
]
