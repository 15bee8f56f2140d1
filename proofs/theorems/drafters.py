"""The ``none`` drafter is no drafter (docs/design.md §1.3).

A group may carry drafter ``none`` (vLLM's DFlash and DSpark, which drop nothing).
Such a group must need exactly what a group without a drafter needs, and its finder
must find exactly what the drafter-less one finds. ``drafter_none_same`` proves it
over the model's own code, for every kind (a sliding window under both window
conventions), with everything symbolic: block size b, alignment A = a·b, window or
chunk, m, T, the hit L, a cache row of any length and the scan's state, index and
cached bit:

- ``valid`` at L is the same term for both groups;
- ``frame_for`` gives the same frame (alignment, block size, shift, limit);
- ``scan_for`` gives the same scan: direction, limit, start state, one ``step``
  from any state and ``finish`` of any state.

So every theorem about the no-drafter finders (contracts, the fixed point over them,
the impl formula, the lookup) covers the ``none`` drafter, and the theorems that
range over sets of finders draw from :data:`kvhit.proofs.common.DISTINCT_FINDERS`.

    >>> [goal.name for goal in build(None)][:2]
    ['full', 'sliding_window']
"""

from __future__ import annotations

from typing import Any

import z3

from kvhit.model.finders import frame_for, scan_for
from kvhit.model.spec import Drafter, Kind, group_of, valid
from kvhit.proofs.registry import Goal, Status, Theorem
from kvhit.proofs.symbolic import SymRow, Z3Ops
from kvhit.proofs.theorems.contracts import ContractFinder, conventions, fresh_state


def differ(a: Any, b: Any) -> Any:
    """Whether two model values (ints, bools or z3 terms) differ, as a z3 term."""
    if isinstance(a, bool) and isinstance(b, bool):
        return z3.BoolVal(a != b)
    return a != b


def goal_for(finder: ContractFinder) -> Goal:
    """The ``none`` group differs from the drafter-less one somewhere."""
    tag = f"none_{finder.label.replace(' ', '_')}"
    b, a, span, m, t, length, j = z3.Ints(
        f"{tag}_b {tag}_A {tag}_span {tag}_m {tag}_T {tag}_L {tag}_j"
    )
    cached = z3.Bool(f"{tag}_bit")
    ops = Z3Ops(bound=1)
    row = SymRow.fresh(f"{tag}_row", z3.Int(f"{tag}_rows"))
    plain = group_of(finder.kind, b, span, None, finder.convention)
    drafted = group_of(finder.kind, b, span, Drafter.NONE, finder.convention)
    fr = [frame_for(g, m, a, t, ops) for g in (plain, drafted)]
    sc = [scan_for(g, m, a, t, ops) for g in (plain, drafted)]
    state = fresh_state(sc[0].start, f"{tag}_s")
    diffs = [
        differ(valid(plain, row, length, t, ops), valid(drafted, row, length, t, ops)),
        *(differ(getattr(fr[0], f), getattr(fr[1], f)) for f in ("alignment", "block_size")),
        *(differ(getattr(fr[0], f), getattr(fr[1], f)) for f in ("shift", "limit")),
        z3.BoolVal(sc[0].direction != sc[1].direction),
        differ(sc[0].limit, sc[1].limit),
        z3.BoolVal(len(sc[0].start) != len(sc[1].start)),
        *(differ(x, y) for x, y in zip(sc[0].start, sc[1].start)),
        *(differ(x, y) for x, y in zip(sc[0].step(state, j, cached), sc[1].step(state, j, cached))),
        differ(sc[0].finish(state), sc[1].finish(state)),
    ]
    pre = [b >= 1, a >= 1, span >= 1, m >= 0, t > m, length >= 0, j >= 0]
    return Goal(finder.label, pre, z3.Or(*diffs))


def build(bound: int | None) -> list[Goal]:
    """One goal per kind (a sliding window under each convention)."""
    return [
        goal_for(ContractFinder(kind, None, convention))
        for kind in Kind
        for convention in conventions(kind)
    ]


THEOREMS = [
    Theorem(
        name="drafter_none_same",
        statement=(
            "A group with drafter none needs what a group without a drafter needs, and "
            "its finder is the same scan: the model's valid, frame_for and scan_for "
            "(start, step, finish) give the same terms, for every kind."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=build,
        rests_on="model code: valid, frame_for, each finder's Scan",
        scope="every kind, both window conventions; any b >= 1, A >= 1, row, window, "
        "chunk, m, T, L",
    ),
]
