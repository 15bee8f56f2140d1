"""Theorem 5: min-of-groups is only ever unsafe, and wrong (docs/design.md §3).

Both claims run the model's own :func:`~kvhit.model.algorithms.min_of_groups` on a
symbolic query (:func:`kvhit.proofs.common.sym_query`) against L*, the spec's ``valid``
over every candidate (:func:`kvhit.proofs.common.spec_answer`):

- ``min_at_least_longest``: min ≥ L* for every cache state of 1 or 2 groups of every
  kind (and the eagle wrapper) and of 3 non-closed groups, every M of at most N
  blocks, every cache row, T, window and chunk;
  proved. (Each group's hit from the top is at least L*, since L* is valid for it.)
- ``min_is_longest``: "min == L*", refuted. Goals go from 1 group up, so the first
  counterexample has the fewest groups; within it z3 ``Optimize`` minimizes M, then
  the cached blocks. What comes out is as small as docs/design.md §1.5's case: two groups,
  two cached blocks, M = 2.

    >>> [goal.name for goal in refutation_goals(4)][:2]
    ['1 group: full b=1 (A=1)', '1 group: sliding_window b=1 (A=1)']
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import combinations_with_replacement
from operator import lt

from kvhit.model.algorithms import min_of_groups
from kvhit.model.spec import Drafter, Kind
from kvhit.proofs.common import (
    DISTINCT_FINDERS,
    NOT_CLOSED,
    FinderKind,
    SymQuery,
    finder_label,
    fine_sym_query,
    sym_query,
)
from kvhit.proofs.registry import Goal, Status, Theorem
from kvhit.proofs.witness import spec_goal

SizedFinder = tuple[Kind, Drafter | None, int]
"""A group's kind, drafter and block size."""


CONFIGS: tuple[tuple[int, int], ...] = ((1, 1), (2, 2))
"""(block size, alignment) pairs the lower-bound proof runs at."""

NOT_CLOSED_FINDERS: tuple[FinderKind, ...] = tuple((kind, None) for kind in NOT_CLOSED)
"""The kinds that are not downward closed: three of them are where min can go wrong
in ways two cannot show, so 3-group sets are drawn from these (at b = A = 1)."""

MAX_GROUPS = 3


BASE_FINDERS: tuple[FinderKind, ...] = tuple(
    f for f in DISTINCT_FINDERS if f[1] != Drafter.LOOKAHEAD
)
"""Every kind and the eagle wrapper: a lookahead drafter only lowers a group's top to
T - La, which min and the fixed point see alike (its finder meets the contract:
``finder_contracts``)."""


def group_sets(
    count: int, b: int, finders: tuple[FinderKind, ...] = BASE_FINDERS
) -> Iterator[tuple[SizedFinder, ...]]:
    """Every multiset of ``count`` finders at block size b (group order does not
    matter to a min)."""
    for chosen in combinations_with_replacement(finders, count):
        yield tuple((kind, drafter, b) for kind, drafter in chosen)


def sized_label(finder: SizedFinder) -> str:
    """``sliding_window eagle b=1``."""
    kind, drafter, b = finder
    return f"{finder_label((kind, drafter))} b={b}"


def query_for(group_set: tuple[SizedFinder, ...], alignment: int, blocks: int) -> SymQuery:
    """A symbolic query of these groups, M of at most ``blocks`` blocks."""
    return sym_query(
        [(kind, drafter) for kind, drafter, _ in group_set],
        max_top=blocks * min(b for _, _, b in group_set),
        name="min",
        block_sizes=[b for _, _, b in group_set],
        alignment=alignment,
    )


def label(group_set: tuple[SizedFinder, ...], alignment: int) -> str:
    """``2 groups: full b=1, mamba b=1 (A=1)``."""
    noun = "group" if len(group_set) == 1 else "groups"
    return f"{len(group_set)} {noun}: {', '.join(map(sized_label, group_set))} (A={alignment})"


def lower_bound_goal(group_set: tuple[SizedFinder, ...], alignment: int, blocks: int) -> Goal:
    """A counterexample to min ≥ L*: min answers less than L*."""
    sq = query_for(group_set, alignment, blocks)
    return spec_goal(label(group_set, alignment), sq, "min of groups", min_of_groups, breaks=lt)


def exactness_goal(group_set: tuple[SizedFinder, ...], alignment: int, blocks: int) -> Goal:
    """A counterexample to min == L*, as small as z3 can make it."""
    sq = query_for(group_set, alignment, blocks)
    note = "fewest groups, then smallest M, then fewest cached blocks"
    return spec_goal(
        label(group_set, alignment), sq, "min of groups", min_of_groups, note=note, smallest=True
    )


def lower_bound_goals(bound: int | None) -> list[Goal]:
    """min ≥ L* for every set of 1 or 2 finders at every (b, A) of :data:`CONFIGS`,
    and every set of 3 non-closed ones at b = A = 1."""
    blocks = bound or 5
    pairs = [
        lower_bound_goal(group_set, a, blocks)
        for b, a in CONFIGS
        for count in (1, 2)
        for group_set in group_sets(count, b)
    ]
    triples = [
        lower_bound_goal(group_set, 1, blocks) for group_set in group_sets(3, 1, NOT_CLOSED_FINDERS)
    ]
    return pairs + triples


def refutation_goals(bound: int | None) -> list[Goal]:
    """min == L*, fewest groups first (the runner stops at the first counterexample)."""
    blocks = bound or 6
    return [
        exactness_goal(group_set, 1, blocks)
        for count in range(1, MAX_GROUPS + 1)
        for group_set in group_sets(count, 1)
    ]


HASH_UNIT_SETS: tuple[tuple[SizedFinder, ...], ...] = (
    ((Kind.FULL, None, 2), (Kind.MAMBA, None, 2)),
    ((Kind.FULL, None, 2), (Kind.SLIDING_WINDOW, None, 2)),
    ((Kind.MAMBA, None, 2), (Kind.SLIDING_WINDOW, None, 2)),
    ((Kind.MAMBA, None, 2), (Kind.MAMBA, None, 2)),
)
"""Two groups of block size 2 with hash unit 1: a hybrid Mamba model and its kin."""


def hash_unit_goals(bound: int | None) -> list[Goal]:
    """min == L* on a query with hash unit 1 that has a partially filled block
    (every (true, false, partial) row of its groups), with the smallest M and
    fewest held units."""
    blocks = bound or 3
    note = "hash unit 1, a partial block; smallest M, then fewest held units"
    goals = []
    for group_set in HASH_UNIT_SETS:
        sq = fine_sym_query(
            [(kind, drafter) for kind, drafter, _ in group_set],
            [b for _, _, b in group_set],
            unit=1,
            max_top=blocks * 2,
            name="minh",
        )
        sq.pre.append(sq.partial_somewhere())
        goals.append(
            spec_goal(
                label(group_set, 1) + " h=1",
                sq,
                "min of groups",
                min_of_groups,
                note=note,
                smallest=True,
            )
        )
    return goals


THEOREMS = [
    Theorem(
        name="min_at_least_longest",
        statement=(
            "Min-of-groups never answers less than L* (it is only ever unsafe): 1-2 groups "
            "of every kind and the eagle wrapper at b/A = 1/1 and 2/2, and 3 groups of "
            "the non-closed kinds, every cache state with M up to N blocks."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=5,
        quick_bound=3,
        build=lower_bound_goals,
        rests_on="model code: min_of_groups, finders",
        scope="M <= N blocks; 1-2 groups at b/A 1/1, 2/2; 3 non-closed",
    ),
    Theorem(
        name="min_is_longest",
        statement=(
            "Min-of-groups answers L* (known wrong): refuted by a minimized counterexample "
            "(fewest groups, smallest M, fewest cached blocks)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=6,
        quick_bound=4,
        build=refutation_goals,
        rests_on="model code: min_of_groups, finders",
        scope="M <= N; 1-3 groups, b = A = 1",
    ),
    Theorem(
        name="min_is_longest_hash_unit",
        statement=(
            "Min-of-groups answers L* on queries with a hash unit and a partially filled "
            "block (known wrong): refuted on the fine query, drawn as the coarse query "
            'with its {"upto": p} entry.'
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=3,
        quick_bound=2,
        build=hash_unit_goals,
        rests_on="model code: min_of_groups, finders, fine_query, fine_row",
        scope="M <= 2N; 2 groups of b = 2, h = A = 1, a partial block",
    ),
]
