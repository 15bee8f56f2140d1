"""Theorem 6: rounding each group to its own block size gives the same fixed point.

Engines may let each group's finder round to its own block size b_g instead of the
alignment A (:func:`own_block_finders`): the finder ``find(g, row, m, b_g, T)``. The
loop (:func:`~kvhit.model.algorithms.fixed_point_of`), started at ⌊M/A⌋·A, then
settles at a length valid for every group and a multiple of every b_g. Exactly when
A is the lcm of the block sizes (the default alignment) that is a multiple of A, so
the loop returns L*:

- ``own_block_rounding``: with A = lcm(b_g), the own-block fixed point equals L*, for
  two groups of every kind pair at block sizes {1, 2} (A = 2) and {2, 3} (A = 6);
  proved. Passes: after the first, L is a multiple of the last group's block size
  b_last, so a changing pass lowers it by at least b_last and ⌊M/b_last⌋ + 2 passes
  are enough.
- ``own_block_rounding_coarse_alignment``: the same with A a proper multiple of the
  lcm (block sizes {1, 1}, A = 2); refuted: the loop can settle on an odd length.

A brute-force run on random concrete states of the plain model found the same split
before the proof was written.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "mamba", "block_size": 1}],
    ...                  "cached": ["1"], "max_length": 2, "alignment": 2})
    >>> own_block_fixed_point(q), fixed_point(q)
    (1, 0)
"""

from __future__ import annotations

from functools import partial
from itertools import combinations_with_replacement
from typing import Any

from kvhit.model.algorithms import Finder, fixed_point, fixed_point_of, top_length
from kvhit.model.finders import find
from kvhit.model.ops import PY, Ops
from kvhit.model.spec import KINDS, Kind, Query
from kvhit.proofs.common import sym_query
from kvhit.proofs.registry import Goal, Status, Theorem
from kvhit.proofs.witness import spec_goal

CONFIGS: tuple[tuple[tuple[int, int], int], ...] = (((1, 2), 2), ((2, 3), 6))
"""(block sizes of the two groups, alignment = their lcm)."""

COARSE: tuple[tuple[int, int], int] = ((1, 1), 2)
"""Block sizes whose lcm is a proper divisor of the alignment."""


def own_block_finders(q: Query, ops: Ops = PY) -> list[Finder]:
    """Each group's finder, rounding to its own block size instead of A."""
    return [
        partial(find, g, row, alignment=g.block_size, num_tokens=q.num_tokens, ops=ops)
        for g, row in zip(q.groups, q.cached)
    ]


def own_block_passes(q: Query, ops: Ops = PY) -> Any:
    """⌊M/b_last⌋ + 2: enough passes for the own-block loop (see the module docstring)."""
    return ops.div(q.max_length, q.groups[-1].block_size) + 2


def own_block_fixed_point(q: Query, ops: Ops = PY) -> Any:
    """The fixed point over :func:`own_block_finders`, from ⌊M/A⌋·A."""
    return fixed_point_of(
        own_block_finders(q, ops), top_length(q, ops), own_block_passes(q, ops), ops
    )


def rounding_goal(kinds: tuple[Kind, Kind], sizes: tuple[int, int], a: int, max_top: int) -> Goal:
    """The own-block fixed point != L*, M up to ``max_top`` tokens."""
    sq = sym_query(
        list(kinds),
        max_top,
        "rb",
        block_sizes=list(sizes),
        alignment=a,
        passes=max_top // sizes[-1] + 2,
    )
    return spec_goal(
        f"{kinds[0]} b={sizes[0]} + {kinds[1]} b={sizes[1]} (A={a})",
        sq,
        "own-block fixed point",
        own_block_fixed_point,
        {"fixed point": fixed_point},
        smallest=True,
    )


def rounding_goals(configs: tuple[tuple[tuple[int, int], int], ...]) -> Any:
    """The claim for every pair of kinds (both orders of the block sizes) at ``configs``."""

    def build(bound: int | None) -> list[Goal]:
        return [
            rounding_goal(kinds, order, a, bound or 6)
            for sizes, a in configs
            for order in dict.fromkeys((sizes, sizes[::-1]))
            for kinds in combinations_with_replacement(KINDS, 2)
        ]

    return build


THEOREMS = [
    Theorem(
        name="own_block_rounding",
        statement=(
            "With A = lcm of the block sizes, the fixed point where each group rounds to "
            "its own block size, started at floor(M/A)*A, returns L* (two groups of every "
            "kind pair, block sizes {1,2} with A = 2 and {2,3} with A = 6, every cache "
            "state, window and chunk, M up to N tokens)."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=6,
        quick_bound=4,
        build=rounding_goals(CONFIGS),
        rests_on="model code: fixed_point_of, finders",
        scope="M <= N; 2 groups; b 1,2 A=2; b 2,3 A=6",
    ),
    Theorem(
        name="own_block_rounding_coarse_alignment",
        statement=(
            "Own-block rounding returns L* also when A is a proper multiple of the lcm of "
            "the block sizes (known wrong: the loop can settle off a multiple of A)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=8,
        quick_bound=4,
        build=rounding_goals((COARSE,)),
        rests_on="model code: fixed_point_of, finders",
        scope="M <= N; 2 groups; b 1,1 A=2",
    ),
]
