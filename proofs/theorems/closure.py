"""Theorem 4: full attention is downward closed, and what that buys (docs/design.md §3).

Every claim runs the model's own code on a symbolic query
(:func:`kvhit.proofs.common.sym_query`): the spec's ``valid``, the full finder
(:func:`~kvhit.model.finders.find`) and the loop
(:func:`~kvhit.model.algorithms.fixed_point_of`). Block size / alignment pairs are
those of :data:`CONFIGS`; rows, M, windows and chunks are symbolic.

- ``full_downward_closed``: valid at L ⇒ valid at every smaller multiple of A.
- ``full_evaluate_once``: at or below the top, the valid lengths are exactly the
  multiples of A up to f(top), so f(m) = min(⌊m/A⌋·A, f(top)): one scan at the top
  and a trim answer every later call.
- ``one_pass_shortcut``: full groups first and one non-closed group last, a single
  pass of the loop returns L* (vLLM's "simple hybrid" shortcut).
- ``window_downward_closed``: the same closure for a sliding window; refuted.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}],
    ...                  "cached": ["01"], "max_length": 2})
    >>> [valid_lengths(q)[length] for length in (1, 2)]
    [False, True]
"""

from __future__ import annotations

from typing import Any

import z3

from kvhit.model.algorithms import fixed_point, single_pass, top_length
from kvhit.model.finders import find
from kvhit.model.spec import Kind, Query, valid
from kvhit.proofs.common import NOT_CLOSED, SymQuery, sym_query
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.witness import spec_goal

CONFIGS: tuple[tuple[int, int], ...] = ((1, 1), (2, 4))
"""(block size, alignment) pairs every claim runs at."""


def valid_lengths(q: Query) -> dict[int, bool]:
    """Whether group 0 is valid at each candidate of the plain query q."""
    g, row = q.groups[0], q.cached[0]
    return {length: valid(g, row, length, q.num_tokens) for length in q.candidates()}


def one_group(kind: Kind, b: int, a: int, blocks: int, name: str) -> SymQuery:
    """A symbolic query of one group, M of at most ``blocks`` units of A."""
    return sym_query([kind], max_top=blocks * a, name=name, block_sizes=[b], alignment=a)


def closure_witness(sq: SymQuery, lower: Any) -> Any:
    """Reads off the query (M = the valid L) and the smaller L that is not valid."""

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        shorter = model.eval(lower, model_completion=True).as_long()
        ok = valid_lengths(q)
        answers = {f"valid at {q.max_length}": ok[q.max_length], f"valid at {shorter}": ok[shorter]}
        broken = ok[q.max_length] and not ok[shorter]
        note = f"valid at L = {q.max_length} but not at {shorter}"
        return Counterexample(q, "valid", shorter, answers, broken, note)

    return witness


def closure_goal(kind: Kind, b: int, a: int, blocks: int) -> Goal:
    """valid at L = M (a multiple of A) and not at a smaller multiple of A."""
    sq = one_group(kind, b, a, blocks, "dc")
    q, ops = sq.query, sq.ops
    g, row, m = q.groups[0], q.cached[0], q.max_length
    lower = z3.Int("dc_lower")
    return Goal(
        f"{kind} b={b} A={a}",
        [
            *sq.pre,
            m % a == 0,
            lower >= 0,
            lower < m,
            lower % a == 0,
            valid(g, row, m, q.num_tokens, ops),
        ],
        z3.Not(valid(g, row, lower, q.num_tokens, ops)),
        witness=closure_witness(sq, lower),
        minimize=[m, sq.cached_count()],
    )


def closure_goals(kind: Kind) -> Any:
    """The closure claim for ``kind`` at every config of :data:`CONFIGS`."""
    return lambda bound: [closure_goal(kind, b, a, bound or 8) for b, a in CONFIGS]


def evaluate_once_goals(bound: int | None) -> list[Goal]:
    """For a full group and any m at most M: valid(L) ⇔ L ≤ f(top) for candidates
    L ≤ top, and f(m) = min(⌊m/A⌋·A, f(top))."""
    goals = []
    for b, a in CONFIGS:
        sq = one_group(Kind.FULL, b, a, bound or 8, "eo")
        q, ops = sq.query, sq.ops
        g, row = q.groups[0], q.cached[0]
        top = top_length(q, ops)
        at_top = find(g, row, top, a, q.num_tokens, ops)
        m, length = z3.Ints("eo_m eo_L")
        trimmed = z3.If(m / a * a < at_top, m / a * a, at_top)
        goals += [
            Goal(
                f"valid lengths are the multiples of A up to f(top), b={b} A={a}",
                [*sq.pre, length >= 0, length <= top, length % a == 0],
                valid(g, row, length, q.num_tokens, ops) != (length <= at_top),
            ),
            Goal(
                f"f(m) = min(m rounded to A, f(top)), b={b} A={a}",
                [*sq.pre, m >= 0, m <= q.max_length],
                find(g, row, m, a, q.num_tokens, ops) != trimmed,
            ),
        ]
    return goals


def one_pass_goal(kinds: tuple[Kind, ...], b: int, a: int, blocks: int) -> Goal:
    """One pass over ``kinds`` (in this order) != L*."""
    sq = sym_query(list(kinds), blocks * a, "op", block_sizes=[b] * len(kinds), alignment=a)
    others = {"fixed point": fixed_point}
    label = f"{' + '.join(kinds)} b={b} A={a}"
    return spec_goal(label, sq, "single pass", single_pass, others, smallest=True)


def shortcut_orders() -> list[tuple[Kind, ...]]:
    """One or two full groups, then one non-closed group."""
    return [(Kind.FULL,) * count + (last,) for count in (1, 2) for last in NOT_CLOSED]


def one_pass_goals(orders: list[tuple[Kind, ...]]) -> Any:
    """The one-pass claim for every order in ``orders`` and every config."""
    return lambda bound: [
        one_pass_goal(kinds, b, a, bound or 8) for kinds in orders for b, a in CONFIGS
    ]


THEOREMS = [
    Theorem(
        name="full_downward_closed",
        statement=(
            "Full attention is downward closed: valid at L implies valid at every smaller "
            "multiple of A (b/A = 1/1 and 2/4, every cache row, L up to N units of A)."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=16,
        quick_bound=8,
        build=closure_goals(Kind.FULL),
        rests_on="model code: spec valid",
        scope="M <= N units of A; b/A 1/1, 2/4",
    ),
    Theorem(
        name="full_evaluate_once",
        statement=(
            "For a full group the valid lengths up to the top are exactly the multiples of "
            "A up to f(top), so f(m) = min(floor(m/A)*A, f(top)): evaluating once and "
            "trimming is sound (b/A = 1/1 and 2/4, M up to N units of A)."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=16,
        quick_bound=8,
        build=evaluate_once_goals,
        rests_on="model code: spec valid, full finder",
        scope="M <= N units of A; b/A 1/1, 2/4",
    ),
    Theorem(
        name="one_pass_shortcut",
        statement=(
            "With one or two full groups first and one sliding-window, chunked-local or "
            "mamba group last, a single pass returns L* (b/A = 1/1 and 2/4, every cache "
            "state, window and chunk, M up to N units of A)."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=7,
        quick_bound=3,
        build=one_pass_goals(shortcut_orders()),
        rests_on="model code: single_pass, finders",
        scope="M <= N units of A; full first, 1 non-closed last; b/A 1/1, 2/4",
    ),
    Theorem(
        name="window_downward_closed",
        statement=(
            "A sliding window is downward closed like full attention (known wrong: valid "
            "at L says nothing about smaller L)."
        ),
        expected=Status.REFUTED,
        bounded=True,
        bound=8,
        quick_bound=4,
        build=closure_goals(Kind.SLIDING_WINDOW),
        rests_on="model code: spec valid",
        scope="M <= N units of A; b/A 1/1, 2/4",
    ),
]
