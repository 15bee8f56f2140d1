"""Theorem 10: a hit assembled across tiers (docs/design.md §1.7).

A tiered query names external tiers (a KV connector's store, a host cache), each
holding rows for the groups of the kinds it can hold. Every goal here runs on a
symbolic tiered query (:func:`tiered_sym_query`): symbolic local rows and, for each
group, a symbolic row in every tier of :data:`TIERS` that holds its kind (one or
two tier rows per group).

- ``tiered_fixed_point_longest``: the model's own ``fixed_point``, run on the tiered
  query unchanged (it folds the tiers in through ``held_query`` on z3 terms), returns
  L* of §1.7 and that hit can be served. L* is read here off the query itself, not
  through ``held_query`` (:func:`loadable`): a hit is served when every block each
  group reuses at it (the model's ``reused_range``) is in the pool or in the row of a
  tier that holds the group's kind. So a merge that drops a tier's row, or lends a
  tier's row to a group of a kind it does not hold, is refuted.
- ``max_of_groups_safe``, ``full_attention_alone_safe``,
  ``dense_min_mamba_trimmed_safe``, ``local_then_external_safe``: the known-wrong
  combinations (:data:`~kvhit.model.algorithms.WRONG_TIER_COMBINATIONS`) never
  answer more than L*, each refuted by an unsafe counterexample on a hybrid Mamba
  set whose pool alone has a hit, which the algorithm answers right (the tiers are
  what it gets wrong), with the smallest M, then the fewest held blocks, local and
  tier alike.

    >>> [goal.name for goal in longest_goals(2)][:2]
    ['1 group: full b=1 (A=1)', '1 group: sliding_window b=1 (A=1)']
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from itertools import combinations_with_replacement
from typing import Any

import z3

from kvhit.model import algorithms
from kvhit.model.algorithms import fixed_point
from kvhit.model.ops import PY, Ops
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Kind, Query, Tier, local_query, reused_range
from kvhit.proofs.common import SymQuery, model_int, protocol_group, spec_answer, sym_query
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.symbolic import SymRow
from kvhit.proofs.witness import Algorithm, witness_for

TIERS: tuple[tuple[str, frozenset[Kind]], ...] = (
    ("connector", frozenset({Kind.FULL, Kind.SLIDING_WINDOW, Kind.CHUNKED_LOCAL})),
    ("host", frozenset(Kind)),
)
"""The tiers of every symbolic query, in query order: a connector that holds
attention KV only (as LMCache does) and a host cache that holds every kind, Mamba
states too. An attention group has a row in both, a Mamba group in the host's."""

TIERS_SCOPE = "tiers connector (attention kinds), host (every kind)"


@dataclass
class TieredSymQuery(SymQuery):
    """A symbolic query whose ``query`` carries the tiers of :data:`TIERS`, each row a
    :class:`SymRow` of as many blocks as the group's local row."""

    def concrete(self, model: z3.ModelRef) -> Query:
        """The protocol query the solver's model describes, its tiers included (a tier
        row that holds nothing a hit can look at is left out, and so is a tier left
        with no row)."""
        q = self.query
        tiers = []
        for t in q.tiers:
            rows = {
                str(i): bits
                for i, row in enumerate(t.cached)
                if row is not None and (bits := self.shown_row(model, i, row))
            }
            if rows:
                holds = [k.value for k in Kind if k in t.holds]
                tiers.append({"name": t.name, "holds": holds, "cached": rows})
        return parse_query(
            {
                "groups": [protocol_group(g, model) for g in q.groups],
                "cached": [self.shown_row(model, i, row) for i, row in enumerate(q.cached)],
                "tiers": tiers,
                "max_length": model_int(model, q.max_length),
                "num_tokens": model_int(model, q.num_tokens),
                "alignment": model_int(model, q.alignment),
            }
        )

    def cached_count(self) -> Any:
        """How many blocks the pool and the tiers hold, over every group."""
        tiers = (row for t in self.query.tiers for row in t.cached if row is not None)
        rows = [*self.query.cached, *tiers]
        return z3.Sum([z3.If(self.ops.bit(row, j), 1, 0) for row in rows for j in range(len(row))])


def tiered_sym_query(
    kinds: Sequence[Kind], max_top: int, name: str, block_size: int = 1, alignment: int = 1
) -> TieredSymQuery:
    """:func:`kvhit.proofs.common.sym_query`'s groups of these kinds (windows, chunks,
    M symbolic), every group at ``block_size``, with a symbolic row in each tier of
    :data:`TIERS` that holds its kind."""
    sq = sym_query(kinds, max_top, name, [block_size] * len(kinds), alignment)
    tiers = tuple(
        Tier(
            tier,
            holds,
            tuple(
                SymRow.fresh(f"{name}_{tier}{i}", count) if g.kind in holds else None
                for i, (g, count) in enumerate(zip(sq.query.groups, sq.blocks))
            ),
        )
        for tier, holds in TIERS
    )
    return TieredSymQuery(replace(sq.query, tiers=tiers), sq.ops, sq.pre, sq.blocks, max_top)


def loadable(q: Query, length: Any, ops: Ops = PY) -> Any:
    """§1.7 read off the query itself: ``length`` is 0, or every block each group
    reuses at it (the model's ``reused_range``) is in the pool or in the row of some
    tier that holds the group's kind. Plain values or z3 terms (``ops``); the
    query has no hash unit and no drafter."""
    served = []
    for i, g in enumerate(q.groups):
        tiers = (t.cached[i] for t in q.tiers if g.kind in t.holds and t.cached[i] is not None)
        rows = [q.cached[i], *tiers]
        width = max(len(row) for row in rows)
        lo, hi = reused_range(g, length, ops)
        served.append(hi <= width)
        for j in range(width):
            held = ops.or_(*(ops.bit(row, j) for row in rows))
            served.append(ops.or_(ops.not_(ops.and_(lo <= j, j < hi)), held))
    return ops.or_(length == 0, ops.and_(*served))


def longest_loadable(q: Query, top: int, ops: Ops = PY) -> Any:
    """L* of §1.7: the longest multiple of A, at most M and at most ``top``, that is
    :func:`loadable`."""
    best: Any = 0
    for length in range(0, top + 1, q.alignment):
        best = ops.ite(ops.and_(length <= q.max_length, loadable(q, length, ops)), length, best)
    return best


GroupSet = tuple[Kind, ...]

HYBRID: GroupSet = (Kind.FULL, Kind.SLIDING_WINDOW, Kind.MAMBA)
"""A three-group hybrid Mamba set."""

ALL_SETS: tuple[GroupSet, ...] = tuple(
    s for count in (1, 2) for s in combinations_with_replacement(Kind, count)
)
"""Every set of one or two groups (order does not matter to the held rows)."""

LONGEST_SETS: tuple[tuple[int, int, tuple[GroupSet, ...]], ...] = (
    (1, 1, (*ALL_SETS, HYBRID)),
    (2, 2, ((Kind.FULL, Kind.MAMBA), (Kind.SLIDING_WINDOW, Kind.MAMBA))),
)
"""(block size, alignment, group sets) ``tiered_fixed_point_longest`` runs at: every
set of one or two groups and :data:`HYBRID` at b = A = 1, the hybrid Mamba pairs at
b = A = 2 (with a chunked local group over blocks of two, the symbolic chunk makes
z3's nonlinear search slow, up to a timeout at N = 4; the chunked finder's contract at
every b is theorem 3's)."""


def label(kinds: GroupSet, block_size: int, alignment: int) -> str:
    """``2 groups: full b=1, mamba b=1 (A=1)``."""
    noun = "group" if len(kinds) == 1 else "groups"
    listed = ", ".join(f"{kind} b={block_size}" for kind in kinds)
    return f"{len(kinds)} {noun}: {listed} (A={alignment})"


def longest_witness(sq: TieredSymQuery) -> Callable[[z3.ModelRef], Counterexample]:
    """The fixed point against L* of §1.7 on the concrete query (both run plainly)."""

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        got, best = fixed_point(q), longest_loadable(q, q.top)
        answers = {"fixed point": got, "L* (§1.7)": best, "served": loadable(q, got)}
        broken = got != best or not answers["served"]
        return Counterexample(q, "fixed point", got, answers, broken)

    return witness


def longest_goal(kinds: GroupSet, block_size: int, alignment: int, blocks: int) -> Goal:
    """A counterexample to "the fixed point over the tiered query is L* of §1.7 and
    can be served"."""
    sq = tiered_sym_query(kinds, blocks * block_size, "tfp", block_size, alignment)
    got = fixed_point(sq.query, sq.ops)
    best = longest_loadable(sq.query, sq.max_top, sq.ops)
    claim = z3.And(got == best, loadable(sq.query, got, sq.ops))
    return Goal(label(kinds, block_size, alignment), sq.pre, z3.Not(claim), longest_witness(sq))


def longest_goals(bound: int | None) -> list[Goal]:
    """The goals at each (b, A) of :data:`LONGEST_SETS`, for each of its group sets,
    M of at most ``bound`` blocks."""
    blocks = bound or 3
    return [longest_goal(s, b, a, blocks) for b, a, sets in LONGEST_SETS for s in sets]


REFUTATION_SETS: tuple[GroupSet, ...] = (
    (Kind.FULL, Kind.MAMBA),
    (Kind.SLIDING_WINDOW, Kind.MAMBA),
    HYBRID,
)
"""Hybrid Mamba sets, fewest groups first: where engines shipped these combinations."""


def safety_goal(kinds: GroupSet, name: str, run: Algorithm, blocks: int) -> Goal:
    """A counterexample to "``run`` never answers more than L*" on a tiered query
    whose pool alone has a hit (L* > 0), which ``run`` answers right; the smallest M,
    then the fewest held blocks."""
    sq = tiered_sym_query(kinds, blocks, "tsafe")
    local = replace(sq, query=local_query(sq.query))
    pool_best = spec_answer(local)
    sq.pre += [pool_best > 0, run(local.query, sq.ops) == pool_best]
    note = "right on the pool alone, which has a hit; smallest M, then fewest held blocks"
    return Goal(
        label(kinds, 1, 1),
        sq.pre,
        run(sq.query, sq.ops) > spec_answer(sq),
        witness=witness_for(
            sq, name, {name: run, "pool alone": pool_alone(run)}, operator.gt, note
        ),
        minimize=[sq.query.max_length, sq.cached_count()],
    )


def pool_alone(run: Algorithm) -> Algorithm:
    """``run`` on the query without its tiers (shown beside a counterexample)."""
    return lambda q: run(local_query(q))


def safety_goals(name: str) -> Callable[[int | None], list[Goal]]:
    """The goals of one known-wrong combination, by its name in
    :data:`~kvhit.model.algorithms.WRONG_TIER_COMBINATIONS` (looked up when the goals
    are built)."""

    def build(bound: int | None) -> list[Goal]:
        run: Algorithm = algorithms.WRONG_TIER_COMBINATIONS[name]
        return [safety_goal(kinds, name, run, bound or 4) for kinds in REFUTATION_SETS]

    return build


def safety_theorem(name: str, run: Algorithm) -> Theorem:
    """The theorem "the combination ``name`` (the model's ``run``) is safe on tiered
    queries", expected refuted."""
    return Theorem(
        name=f"{run.__name__}_safe",
        statement=(
            f"The {name} combination never answers more than L* on a tiered query (known "
            "wrong): refuted by an unsafe counterexample whose pool alone has a hit it "
            "answers right, minimized (smallest M, then fewest held blocks, local and tier)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=4,
        quick_bound=3,
        build=safety_goals(name),
        rests_on=f"model code: {run.__name__}, held_query, finders",
        scope="M <= N; full+mamba, sliding_window+mamba, full+sliding_window+mamba; "
        f"b = A = 1; {TIERS_SCOPE}",
    )


THEOREMS = [
    Theorem(
        name="tiered_fixed_point_longest",
        statement=(
            "The model's fixed point, run on a tiered query (its tiers folded in by "
            "held_query on z3 terms), returns L* of docs/design.md §1.7 and that hit can be "
            "served: every block each group reuses is in the pool or in a tier that holds "
            "the group's kind (read off the query, not through held_query)."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=3,
        quick_bound=2,
        build=longest_goals,
        rests_on="model code: fixed_point, held_query, finders; reused_range",
        scope="M <= N blocks; 1-2 groups of every kind and full+sliding_window+mamba at "
        f"b/A 1/1, full+mamba and sliding_window+mamba at 2/2; {TIERS_SCOPE}",
    ),
    *(safety_theorem(name, run) for name, run in algorithms.WRONG_TIER_COMBINATIONS.items()),
]
