"""Theorem 8, the whole lookup: what ``Coordinator.find_longest_cache_hit`` computes is L*.

The coordinator's lookup (:mod:`kvhit.impl.coordinator`) reads a :class:`LookupPlan`
made by :func:`~kvhit.impl.coordinator.lookup_plan`: every group's staged ``valid``
at every candidate, stacked with each group's offset into one row of miss flags
(:func:`~kvhit.impl.formula.stack`). A lookup then takes the prefix sums of the miss
flags of all groups' blocks laid end to end, evaluates the stacked plan on them
(:meth:`~kvhit.impl.formula.Plan.holds`, through :func:`~kvhit.impl.formula.covered`),
keeps the candidates valid in every group (``amin`` over the group axis) and answers
the longest of them (``where`` and ``max``).

Here the plan is the impl's own: :func:`lookup_plan` is called as the coordinator
calls it, and each of its entries (group g, candidate c: ``lo``, ``hi`` with the
offset, and the two verdicts) is evaluated by the impl's ``Plan.holds`` on z3 prefix
sums of symbolic miss flags. The two tensor lines of the reduction are restated on
z3 terms (:func:`reduce_lookup`; the tests check the restatement against the real
coordinator on random states). The claim: for every cache state (every bit of every
group's row), the answer is L*, the spec's ``valid`` over every candidate
(:func:`kvhit.model.algorithms.longest_of`), for a request of 16 blocks of the
largest block size b, T = 16·b and 16·b + 1 (:func:`request_lengths`), for every
M < T (one goal per multiple of A: each has its own plan, with its own sizes and
offsets), for each configuration of :data:`CONFIGS`: 3 groups, every kind, the
eagle wrapper, block sizes 1 and 2; and for :data:`FINE_CONFIGS`, the fine queries
of hybrid Mamba models with a hash unit (lookahead drafters, an eagle window): the
lookups with sub-block hits. A counterexample is run through the real coordinator
(its block pool preloaded with the state).

    >>> [goal.name for goal in build(CONFIGS, BLOCKS)][:1]
    ['full b=1 + sliding_window w=3 b=1 + mamba b=1 (A=1, T=16, M=0)']
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any

import z3

from kvhit.impl import coordinator
from kvhit.impl.formula import Plan
from kvhit.model.algorithms import brute_force, longest_of
from kvhit.model.spec import Drafter, Group, Kind, Query, default_alignment, fine_query
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.symbolic import SymRow, Z3Ops
from kvhit.proofs.theorems.impl_formula import at_index

BLOCKS = 16
"""Blocks per group a lookup reads (at the default bound)."""

CONFIGS: tuple[tuple[Group, ...], ...] = (
    (Group(Kind.FULL, 1), Group(Kind.SLIDING_WINDOW, 1, window=3), Group(Kind.MAMBA, 1)),
    (
        Group(Kind.SLIDING_WINDOW, 1, window=2),
        Group(Kind.SLIDING_WINDOW, 1, window=5),
        Group(Kind.CHUNKED_LOCAL, 1, chunk=4),
    ),
    (
        Group(Kind.SLIDING_WINDOW, 2, window=4, drafter=Drafter.DROP),
        Group(Kind.CHUNKED_LOCAL, 2, chunk=6),
        Group(Kind.FULL, 2, drafter=Drafter.DROP),
    ),
    (
        Group(Kind.FULL, 1),
        Group(Kind.MAMBA, 2),
        Group(Kind.SLIDING_WINDOW, 2, window=3, drafter=Drafter.DROP),
    ),
)
"""Three groups each: every kind, both eagle kinds, equal and mixed block sizes."""

HASH_UNIT = 2
"""The hash unit the fine configurations are taken at."""

FINE_CONFIGS: tuple[tuple[Group, ...], ...] = tuple(
    fine_query(Query(groups, ((),) * len(groups), 0, 1, HASH_UNIT, hash_unit=HASH_UNIT)).groups
    for groups in (
        (Group(Kind.FULL, 4), Group(Kind.MAMBA, 4), Group(Kind.SLIDING_WINDOW, 2, window=3)),
        (
            Group(Kind.FULL, 4, drafter=Drafter.LOOKAHEAD, lookahead=3),
            Group(Kind.MAMBA, 8, drafter=Drafter.LOOKAHEAD, lookahead=3),
            Group(Kind.SLIDING_WINDOW, 4, window=5, drafter=Drafter.DROP),
        ),
    )
)
"""The fine queries (:func:`~kvhit.model.spec.fine_query`: every group at block size
h, A = h) of two hybrid Mamba models with hash unit 2: plain, and with lookahead
drafters and an eagle window (whose drop is one hash unit). Every cache state of the
fine groups covers every coarse row with partial blocks (its :func:`fine_row`), so
these are the lookups with sub-block hits."""


def reduce_lookup(ok: Sequence[Any], lengths: Sequence[int]) -> Any:
    """The coordinator's reduction on z3 terms: ``where(ok, lengths, 0).max()``,
    where ``ok[c]`` says candidate c is valid in every group (``amin`` over groups)."""
    best: Any = z3.IntVal(0)
    for good, length in zip(ok, lengths):
        best = z3.If(z3.And(good, length > best), length, best)
    return best


def entry(plan: Plan, g: int, c: int) -> Plan:
    """Entry (group g, candidate c) of the stacked torch plan, as plain Python values."""
    return Plan(
        int(plan.lo[g, c]), int(plan.hi[g, c]), bool(plan.if_covered[g, c]), bool(plan.if_not[g, c])
    )


@dataclass
class LookupTerms:
    """One lookup on a symbolic cache state: the query (its rows z3 arrays), the
    coordinator's answer and L*, both as z3 terms over the rows' bits."""

    query: Query
    rows: list[SymRow]
    answer: Any
    best: Any


def lookup_terms(groups: tuple[Group, ...], num_tokens: int, max_length: int) -> LookupTerms:
    """The lookup of at most ``max_length`` tokens for a request of ``num_tokens``, as
    the coordinator makes and reads it."""
    alignment = default_alignment(groups)
    lookup = coordinator.Coordinator(groups, 1, alignment).plan_for(num_tokens, max_length)
    lengths = [int(x) for x in lookup.lengths]
    ops = Z3Ops(bound=1)
    # Blocks past the request's whole blocks have the never-cached key: not cached.
    rows = [
        SymRow.fresh(f"lk_row{i}", min(size, num_tokens // g.block_size))
        for i, (g, size) in enumerate(zip(groups, lookup.sizes))
    ]
    missing = [
        z3.Not(ops.bit(row, j)) for row, size in zip(rows, lookup.sizes) for j in range(size)
    ]
    misses: list[Any] = [z3.IntVal(0)]
    for flag in missing:
        misses.append(misses[-1] + z3.If(flag, 1, 0))
    ok = [
        z3.And(
            *[
                entry(lookup.plan, g, c).holds(lambda i: at_index(misses, i), ops)
                for g in range(len(groups))
            ]
        )
        for c in range(len(lengths))
    ]
    q = Query(groups, tuple(rows), max_length, num_tokens, alignment)
    best = z3.IntVal(0) + longest_of(q, lengths, ops)
    return LookupTerms(q, rows, reduce_lookup(ok, lengths), best)


def goal_for(groups: tuple[Group, ...], num_tokens: int, max_length: int) -> Goal:
    """The lookup's answer != L*, for every cache state of ``groups``."""
    t = lookup_terms(groups, num_tokens, max_length)
    q = t.query
    name = (
        " + ".join(g.describe() for g in groups)
        + f" (A={q.alignment}, T={q.num_tokens}, M={max_length})"
    )
    return Goal(name, [], t.answer != t.best, witness=witness(q, t.rows))


def coordinator_answer(q: Query) -> int:
    """What the real coordinator answers on a concrete query (its pool preloaded with
    the query's cache state)."""
    engine = coordinator.Coordinator(q.groups, 4 * sum(len(r) for r in q.cached) + 8, q.alignment)
    request = engine.request(list(range(q.num_tokens)))
    engine.preload(request, [list(r) for r in q.cached])
    return engine.find_longest_cache_hit(request, q.max_length).length


def witness(q: Query, rows: list[SymRow]) -> Any:
    """The state run through the real coordinator; broken when it does not answer L*."""

    def read(model: z3.ModelRef) -> Counterexample:
        bits = tuple(tuple(row.values(model, row.length)) for row in rows)
        concrete = Query(q.groups, bits, q.max_length, q.num_tokens, q.alignment)
        got, best = coordinator_answer(concrete), brute_force(concrete)
        answers = {"impl lookup": got, "L*": best}
        return Counterexample(concrete, "impl lookup", got, answers, broken=got != best)

    return read


def request_lengths(groups: tuple[Group, ...], blocks: int) -> tuple[int, int]:
    """The request lengths T a lookup of ``blocks`` blocks of the largest block size is
    checked at: ending on a block boundary, and one token into the next block (the
    eagle rule's block after the hit, and the last whole block, differ between them)."""
    whole = blocks * max(g.block_size for g in groups)
    return whole, whole + 1


def limits(groups: tuple[Group, ...], num_tokens: int) -> list[int]:
    """Every M that gives the lookup its own plan: each multiple of A below T (a plan
    depends on M only through the top candidate, M rounded down to A)."""
    return list(range(0, num_tokens, default_alignment(groups)))


def build(configs: tuple[tuple[Group, ...], ...], bound: int | None) -> list[Goal]:
    """One goal per configuration, T and M, ``bound`` blocks per group."""
    assert bound is not None
    coordinator.lookup_plan.cache_clear()  # plans made now, from the code as it is now
    return [
        goal_for(g, t, m) for g in configs for t in request_lengths(g, bound) for m in limits(g, t)
    ]


THEOREMS = [
    Theorem(
        name="impl_lookup",
        statement=(
            "The impl's whole lookup (the coordinator's stacked plan with its offsets, "
            "evaluated on prefix sums of the misses, reduced to the longest candidate "
            "valid in every group) answers L* for every cache state and every M < T."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=BLOCKS,
        quick_bound=8,
        build=partial(build, CONFIGS),
        tags=("impl",),
        rests_on="impl code: lookup_plan, stack, Plan.holds; reduction restated",
        scope="N blocks per group, T = N*b or N*b+1, every M < T; 4 sets of 3 groups",
    ),
    Theorem(
        name="impl_lookup_fine",
        statement=(
            "The impl's whole lookup answers L* on the fine query of a query with a hash "
            "unit (every group at block size h, A = h: sub-block hits, partial blocks, "
            "an eagle drop of one unit, lookahead drafters) for every cache state of the "
            "fine groups, so for every coarse row of true, false and partial entries, "
            "and every M < T."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=8,
        quick_bound=4,
        build=partial(build, FINE_CONFIGS),
        tags=("impl",),
        rests_on="impl code: lookup_plan, stack, Plan.holds on fine_query's groups; "
        "reduction restated",
        scope="N units per group, T = N*h or N*h+1, every M < T; fine queries (h = A = 2) "
        "of 2 hybrid Mamba sets (plain; lookahead La = 3 + eagle window)",
    ),
]
