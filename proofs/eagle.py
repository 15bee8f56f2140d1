"""Theorem 7: eagle groups drop once per candidate; the spiral and one pass are wrong.

All three run the model's own loop (:func:`~kvhit.model.algorithms.fixed_point_of`)
on a symbolic query (:func:`kvhit.proofs.common.sym_query`) against L*, the spec's
``valid`` over every candidate (:func:`kvhit.proofs.common.spec_answer`):

- ``eagle_single_drop``: the model's finders (the single-drop wrapper for eagle
  groups) inside the fixed point return L*, for an eagle group alone or next to any
  other finder; proved.
- ``eagle_spiral``: an eagle finder that drops a block on *every* call — the base
  finder's hit minus one block, rounded down to A (:func:`spiral_finder`) — inside the
  same loop answers L*; refuted: each pass drops another block, down to 0.
- ``single_pass_two_windows``: one pass, no repeat
  (:func:`~kvhit.model.algorithms.single_pass`), answers L* for two sliding windows;
  refuted.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1, "eagle": True}],
    ...                  "cached": ["111"], "max_length": 2, "num_tokens": 3})
    >>> fixed_point(q), spiral_fixed_point(q)
    (2, 0)
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvhit.model.algorithms import (
    Finder,
    fixed_point,
    fixed_point_of,
    group_finders,
    max_passes,
    single_pass,
    top_length,
)
from kvhit.model.finders import find
from kvhit.model.ops import PY, Ops
from kvhit.model.spec import Group, Query
from kvhit.proofs.common import FINDERS, SymQuery, spec_answer, sym_query
from kvhit.proofs.registry import Goal, Theorem
from kvhit.proofs.witness import witness_for

EAGLES: tuple[tuple[str, bool], ...] = (("full", True), ("sliding_window", True))


def spiral_finder(g: Group, row: Any, q: Query, ops: Ops = PY) -> Finder:
    """The known-wrong eagle finder: the base kind's hit at m, minus one block, rounded
    down to A — on every call, so every pass of the fixed point drops again."""
    base = replace(g, eagle=False)
    b, a = g.block_size, q.alignment

    def spiral(m: Any) -> Any:
        hit = find(base, row, m, a, q.num_tokens, ops)
        return ops.ite(hit >= b, ops.div(hit - b, a) * a, 0)

    return spiral


def spiral_finders(q: Query, ops: Ops = PY) -> list[Finder]:
    """The model's finders, with every eagle group's replaced by the spiral."""
    right = group_finders(q, ops)
    return [
        spiral_finder(g, row, q, ops) if g.eagle else f
        for g, row, f in zip(q.groups, q.cached, right)
    ]


def spiral_fixed_point(q: Query, ops: Ops = PY) -> Any:
    """The fixed point over :func:`spiral_finders`."""
    return fixed_point_of(spiral_finders(q, ops), top_length(q, ops), max_passes(q, ops), ops)


def label(kinds: tuple[tuple[str, bool], ...]) -> str:
    """``sliding_window eagle + mamba``."""
    return " + ".join(f"{kind}{' eagle' if eagle else ''}" for kind, eagle in kinds)


def query_for(kinds: tuple[tuple[str, bool], ...], blocks: int, name: str) -> SymQuery:
    """A symbolic query of these groups at b = A = 1, M of at most ``blocks`` blocks."""
    return sym_query(list(kinds), max_top=blocks, name=name)


def single_drop_goals(bound: int | None) -> list[Goal]:
    """fixed point != L*, for an eagle group alone and next to every finder."""
    blocks = bound or 4
    sets = [(e,) for e in EAGLES] + [
        (e, other) for i, e in enumerate(EAGLES) for other in FINDERS if other not in EAGLES[:i]
    ]
    goals = []
    for kinds in sets:
        sq = query_for(kinds, blocks, "eagle")
        algorithms = {"fixed point": fixed_point}
        goals.append(
            Goal(
                label(kinds),
                [*sq.pre, fixed_point(sq.query, sq.ops) != spec_answer(sq)],
                witness=witness_for(sq, "fixed point", algorithms, lambda got, best: got != best),
            )
        )
    return goals


def wrong_goal(
    kinds: tuple[tuple[str, bool], ...], blocks: int, algorithm: str, run: Any, note: str
) -> Goal:
    """``run`` (an algorithm over a query) != L*, with the smallest M and cache."""
    sq = query_for(kinds, blocks, "wrong")
    algorithms = {algorithm: run, "fixed point": fixed_point}
    return Goal(
        label(kinds),
        [*sq.pre, run(sq.query, sq.ops) != spec_answer(sq)],
        witness=witness_for(sq, algorithm, algorithms, lambda got, best: got != best, note),
        minimize=[sq.query.max_length, sq.cached_count()],
    )


def spiral_goals(bound: int | None) -> list[Goal]:
    """The spiral inside the fixed point != L*, for each eagle kind alone."""
    note = "the spiral drops a block on every pass: lost reuse"
    return [
        wrong_goal((e,), bound or 5, "spiral fixed point", spiral_fixed_point, note) for e in EAGLES
    ]


def single_pass_goals(bound: int | None) -> list[Goal]:
    """One pass != L* for two sliding windows."""
    kinds = (("sliding_window", False), ("sliding_window", False))
    note = "a later group lowered L below what an earlier group had checked"
    return [wrong_goal(kinds, bound or 5, "single pass", single_pass, note)]


THEOREMS = [
    Theorem(
        name="eagle_single_drop",
        statement=(
            "With the single-drop wrapper for eagle groups, the fixed point returns L* "
            "for an eagle group alone or next to any other finder (b = A = 1, every "
            "cache state with M up to N blocks, every T, window and chunk)."
        ),
        expected="proved",
        kind="bounded",
        bound=4,
        quick_bound=3,
        build=single_drop_goals,
    ),
    Theorem(
        name="eagle_spiral",
        statement=(
            "An eagle finder that drops a block on every call (the spiral) inside the "
            "fixed point returns L* (known wrong)."
        ),
        expected="refuted",
        kind="bounded",
        bound=5,
        quick_bound=3,
        build=spiral_goals,
    ),
    Theorem(
        name="single_pass_two_windows",
        statement=(
            "One pass of the fixed point, without the repeat, returns L* for two "
            "sliding-window groups (known wrong)."
        ),
        expected="refuted",
        kind="bounded",
        bound=5,
        quick_bound=3,
        build=single_pass_goals,
    ),
]
