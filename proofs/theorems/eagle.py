"""Theorem 7: eagle groups drop once per candidate; the spiral and one pass are wrong.

All three run the model's own loop (:func:`~kvhit.model.algorithms.fixed_point_of`)
on a symbolic query (:func:`kvhit.proofs.common.sym_query`) against L*, the spec's
``valid`` over every candidate (:func:`kvhit.proofs.common.spec_answer`):

- ``eagle_single_drop``: the model's finders (the single-drop wrapper for eagle
  groups, the T - La clamp for lookahead ones) inside the fixed point return L*, for
  an eagle group alone or next to any other finder, and a lookahead group alone or
  next to a lookahead Mamba group; proved.
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

import operator
from dataclasses import replace
from functools import partial
from typing import Any

from kvhit.model.algorithms import fixed_point, single_pass, spiral_fixed_point
from kvhit.model.ops import PY, Ops
from kvhit.model.spec import EAGLE_KINDS, Drafter, Kind, Query, fine_query
from kvhit.proofs.common import (
    DISTINCT_FINDERS,
    DRAFTED_FINDERS,
    FinderKind,
    SymQuery,
    finder_label,
    sym_query,
)
from kvhit.proofs.registry import Goal, Status, Theorem
from kvhit.proofs.witness import Breaks, spec_goal

EAGLES: tuple[FinderKind, ...] = tuple((kind, Drafter.DROP) for kind in EAGLE_KINDS)
"""The eagle wrapper on each kind a drafter can have."""


def label(kinds: tuple[FinderKind, ...]) -> str:
    """``sliding_window eagle + mamba``."""
    return " + ".join(map(finder_label, kinds))


def query_for(kinds: tuple[FinderKind, ...], blocks: int, name: str) -> SymQuery:
    """A symbolic query of these groups at b = A = 1, M of at most ``blocks`` blocks."""
    return sym_query(list(kinds), max_top=blocks, name=name)


def single_drop_goals(bound: int | None) -> list[Goal]:
    """fixed point != L*, for an eagle group alone and next to every finder without a
    lookahead drafter, and for a lookahead group alone and next to a lookahead Mamba
    group (a hybrid model with lookahead hashes)."""
    blocks = bound or 4
    others = [f for f in DISTINCT_FINDERS if f[1] != Drafter.LOOKAHEAD]
    lookaheads = [f for f in DRAFTED_FINDERS if f[1] == Drafter.LOOKAHEAD]
    mamba = (Kind.MAMBA, Drafter.LOOKAHEAD)
    sets = [
        *((e,) for e in EAGLES),
        *((e, other) for i, e in enumerate(EAGLES) for other in others if other not in EAGLES[:i]),
        *((d,) for d in lookaheads),
        *((d, mamba) for d in lookaheads if d != mamba),
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
    kinds: tuple[FinderKind, ...] = ((Kind.SLIDING_WINDOW, None), (Kind.SLIDING_WINDOW, None))
    note = "a later group lowered L below what an earlier group had checked"
    return [wrong_goal(kinds, bound or 5, "single pass", single_pass, note)]


def margin_groups(q: Query) -> Query:
    """q with every Mamba group given the eagle drop margin (treated as a drop
    drafter): what vLLM 0.20-0.25 did when it flagged a Mamba group (#45614)."""
    groups = tuple(
        replace(g, drafter=Drafter.DROP) if g.kind == Kind.MAMBA else g for g in q.groups
    )
    return replace(q, groups=groups)


def mamba_margin_fixed_point(q: Query, ops: Ops = PY) -> Any:
    """The fixed point with the eagle margin on every Mamba group (known wrong)."""
    return fixed_point(margin_groups(fine_query(q)), ops)


MARGIN_SETS: tuple[tuple[FinderKind, ...], ...] = (
    ((Kind.MAMBA, Drafter.NONE),),
    ((Kind.FULL, Drafter.DROP), (Kind.MAMBA, Drafter.NONE)),
)
"""A Mamba group carrying drafter none (the spec: no drop), alone and beside an
eagle full-attention group (the model vLLM flagged every group of)."""


MARGIN_BREAKS: dict[str, tuple[Breaks, str]] = {
    "lost reuse": (operator.lt, "the margin asks for the state one block past the hit"),
    "unsafe": (operator.gt, "the margin answers a hit whose state is not held"),
}
"""The two ways the margin breaks: answering less than L* (lost reuse), and
answering more than L*, reading a Mamba state that is not there (unsafe)."""


def margin_goals(way: str, bound: int | None) -> list[Goal]:
    """The margin on Mamba breaks L* the given way, with the smallest M and cache."""
    breaks, why = MARGIN_BREAKS[way]
    note = f"Mamba carries drafter none; {why} ({way})"
    return [
        spec_goal(
            label(kinds),
            replace(query_for(kinds, bound or 3, "margin"), past=1),
            "mamba eagle margin",
            mamba_margin_fixed_point,
            {"fixed point": fixed_point},
            breaks=breaks,
            note=note,
            smallest=True,
        )
        for kinds in MARGIN_SETS
    ]


THEOREMS = [
    Theorem(
        name="eagle_single_drop",
        statement=(
            "With the single-drop wrapper for eagle groups, the fixed point returns L* "
            "for an eagle group alone or next to any other finder, and for a lookahead "
            "group of each kind alone or next to a lookahead Mamba group (b = A = 1, every "
            "cache state with M up to N blocks, every T, La, window and chunk)."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=4,
        quick_bound=3,
        build=single_drop_goals,
        rests_on="model code: fixed_point, eagle wrapper",
        scope="M <= N; b = A = 1; eagle + any finder; lookahead alone, + mamba lookahead",
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
    *(
        Theorem(
            name=name,
            statement=(
                "A Mamba group given the eagle drop margin (treated as a drop drafter, "
                "vLLM 0.20-0.25, #45614) never answers "
                + ("less than" if way == "lost reuse" else "more than")
                + " L*, where the spec has Mamba carry drafter none (known wrong: "
                + way
                + ")."
            ),
            expected=Status.REFUTED,
            bounded=True,
            bound=3,
            quick_bound=2,
            build=partial(margin_goals, way),
            rests_on="model code: fixed_point, eagle wrapper on a Mamba group",
            scope="M <= N; b = A = 1; mamba none, alone and beside full eagle",
        )
        for name, way in (
            ("mamba_eagle_margin", "lost reuse"),
            ("mamba_eagle_margin_unsafe", "unsafe"),
        )
    ),
]
