"""Theorem 7: eagle groups drop once per candidate; the spiral and one pass are wrong.

All three run the model's own loop (:func:`~kvhit.model.algorithms.fixed_point_of`)
on a symbolic query (:func:`kvhit.proofs.common.sym_query`) against L*, the spec's
``valid`` over every candidate (:func:`kvhit.proofs.common.spec_answer`):

- ``eagle_single_drop``: the model's finders (the single-drop wrapper for eagle
  groups) inside the fixed point return L*, for an eagle group alone or next to any
  other finder; proved.
- ``eagle_spiral``: an eagle finder that drops a block on *every* call — the base
  finder's hit minus one block, rounded down to A — inside the
  same loop answers L*; refuted: each pass drops another block, down to 0. The
  spiral lives with the model's other known-wrong algorithms
  (:func:`kvhit.model.algorithms.spiral_fixed_point`).
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

from typing import Any

from kvhit.model.algorithms import fixed_point, single_pass, spiral_fixed_point
from kvhit.model.spec import EAGLE_KINDS, Kind
from kvhit.proofs.common import FINDERS, FinderKind, SymQuery, sym_query
from kvhit.proofs.registry import Goal, Status, Theorem
from kvhit.proofs.witness import spec_goal

EAGLES: tuple[FinderKind, ...] = tuple((kind, True) for kind in EAGLE_KINDS)
"""The eagle wrapper on each kind a drafter can have."""


def label(kinds: tuple[FinderKind, ...]) -> str:
    """``sliding_window eagle + mamba``."""
    return " + ".join(f"{kind}{' eagle' if eagle else ''}" for kind, eagle in kinds)


def query_for(kinds: tuple[FinderKind, ...], blocks: int, name: str) -> SymQuery:
    """A symbolic query of these groups at b = A = 1, M of at most ``blocks`` blocks."""
    return sym_query(list(kinds), max_top=blocks, name=name)


def single_drop_goals(bound: int | None) -> list[Goal]:
    """fixed point != L*, for an eagle group alone and next to every finder."""
    blocks = bound or 4
    sets = [(e,) for e in EAGLES] + [
        (e, other) for i, e in enumerate(EAGLES) for other in FINDERS if other not in EAGLES[:i]
    ]
    return [
        spec_goal(label(kinds), query_for(kinds, blocks, "eagle"), "fixed point", fixed_point)
        for kinds in sets
    ]


def wrong_goal(
    kinds: tuple[FinderKind, ...], blocks: int, algorithm: str, run: Any, note: str
) -> Goal:
    """``run`` (an algorithm over a query) != L*, with the smallest M and cache."""
    sq = query_for(kinds, blocks, "wrong")
    others = {"fixed point": fixed_point}
    return spec_goal(label(kinds), sq, algorithm, run, others, note=note, smallest=True)


def spiral_goals(bound: int | None) -> list[Goal]:
    """The spiral inside the fixed point != L*, for each eagle kind alone."""
    note = "the spiral drops a block on every pass: lost reuse"
    return [
        wrong_goal((e,), bound or 5, "spiral fixed point", spiral_fixed_point, note) for e in EAGLES
    ]


def single_pass_goals(bound: int | None) -> list[Goal]:
    """One pass != L* for two sliding windows."""
    kinds = ((Kind.SLIDING_WINDOW, False), (Kind.SLIDING_WINDOW, False))
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
        expected=Status.PROVED,
        bounded=True,
        bound=4,
        quick_bound=3,
        build=single_drop_goals,
        rests_on="model code: fixed_point, eagle wrapper",
        scope="M <= N; b = A = 1; eagle + any finder",
    ),
    Theorem(
        name="eagle_spiral",
        statement=(
            "An eagle finder that drops a block on every call (the spiral) inside the "
            "fixed point returns L* (known wrong)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=5,
        quick_bound=3,
        build=spiral_goals,
        rests_on="model code: spiral_fixed_point",
        scope="M <= N; b = A = 1; 1 eagle group",
    ),
    Theorem(
        name="single_pass_two_windows",
        statement=(
            "One pass of the fixed point, without the repeat, returns L* for two "
            "sliding-window groups (known wrong)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=5,
        quick_bound=3,
        build=single_pass_goals,
        rests_on="model code: single_pass",
        scope="M <= N; 2 windows, b = A = 1",
    ),
]
