"""Theorem 8: the impl's vectorized validity formula equals the spec, for every kind.

The impl's lookup (:mod:`kvhit.impl.formula`) stages the spec's own
:func:`kvhit.model.spec.valid` (:func:`~kvhit.impl.formula.stage`: its one cache read
answered True, then False) into a :class:`~kvhit.impl.formula.Plan`, and evaluates
the plan on the prefix sums of the misses, where "blocks ``[lo, hi)`` are all cached"
is :func:`kvhit.impl.formula.covered`. Here the same functions run on z3 terms: the
plan staged by the plain :class:`~kvhit.proofs.symbolic.Z3Ops`, evaluated on the miss
counts of a symbolic row, against ``valid`` evaluated blockwise. The claim: they agree
for every row of at most N blocks, every hit length whose blocks (and an eagle
group's next block) lie within the N blocks, every request length T > L, every
window, chunk and La (all unbounded), for each kind, drafter and block size
1 … 4.

    >>> [goal.name for goal in build(4)][:2]
    ['full b=1', 'sliding_window b=1']
"""

from __future__ import annotations

from typing import Any

import torch
import z3

from kvhit.impl.formula import prefix_sums, stage, valid_lengths
from kvhit.model.spec import Drafter, Kind, Query, valid
from kvhit.proofs.common import DISTINCT_FINDERS, finder_group, finder_label
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.symbolic import SymRow, Z3Ops

FORMULA_BLOCK_SIZES = (1, 2, 3, 4)


def at_index(terms: list[Any], i: Any) -> Any:
    """``terms[i]`` for a symbolic i in range, as a chain of ifs (no arrays, so the
    exported goal is plain linear arithmetic for a second solver)."""
    out = terms[-1]
    for k in range(len(terms) - 2, -1, -1):
        out = z3.If(i == k, terms[k], out)
    return out


def miss_terms(row: SymRow, size: int, ops: Z3Ops) -> list[Any]:
    """``misses[i]`` = uncached blocks of ``row`` below i, for i = 0 … size."""
    misses: list[Any] = [z3.IntVal(0)]
    for j in range(size):
        misses.append(misses[-1] + z3.If(ops.bit(row, j), 0, 1))
    return misses


def goal_for(kind: Kind, drafter: Drafter | None, b: int, bound: int) -> Goal:
    """The negated claim for one kind, drafter and block size."""
    span = z3.Int("span")  # the window or chunk, if the kind reads one
    length, num_tokens, la = z3.Int("L"), z3.Int("T"), z3.Int("La")
    g = finder_group((kind, drafter), b, span, la)
    ops = Z3Ops(bound)
    # A row of N blocks with free bits covers every shorter row (trailing misses).
    row = SymRow.fresh("cached", bound)
    misses = miss_terms(row, bound, ops)
    staged = stage(g, length, num_tokens, ops).holds(lambda i: at_index(misses, i), ops)
    blockwise = valid(g, row, length, num_tokens, ops)
    assertions = [
        span >= 1,
        la >= 0,
        length >= 0,
        length / b + 1 <= bound,
        num_tokens > length,
    ]
    name = f"{finder_label((kind, drafter))} b={b}"

    def witness(model: z3.ModelRef) -> Counterexample:
        def value(term: Any) -> int:
            return model.eval(term, model_completion=True).as_long()

        concrete = finder_group((kind, drafter), b, value(span), value(la))
        bits = row.values(model, bound)
        at, total = value(length), value(num_tokens)
        spec = valid(concrete, bits, at, total)
        formula = bool(
            valid_lengths(
                concrete, prefix_sums(torch.tensor(bits), bound), torch.tensor([at]), total
            )
        )
        q = Query((concrete,), (tuple(bits),), at, total, b)
        answers = {"formula": formula, "spec": spec}
        return Counterexample(q, "impl formula", at, answers, broken=formula != spec)

    return Goal(name, assertions, staged != blockwise, witness=witness)


def build(bound: int | None) -> list[Goal]:
    """One goal per kind, drafter and block size, at rows of ``bound`` blocks."""
    n = bound or 8
    return [goal_for(kind, d, b, n) for b in FORMULA_BLOCK_SIZES for kind, d in DISTINCT_FINDERS]


THEOREMS = [
    Theorem(
        name="impl_formula",
        statement=(
            "The impl's vectorized validity (the spec's valid staged on its one cache read, "
            "evaluated on prefix sums of the misses) equals the "
            "spec's blockwise valid for every kind and drafter (drop; lookahead, any La; none is no drafter), block size 1-4, "
            "any window and chunk, rows of up to N blocks."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=8,
        quick_bound=6,
        build=build,
        tags=("impl",),
        rests_on="impl code: stage, Plan.holds vs spec valid",
        scope="rows of N blocks; 1 group: every kind and drafter, b = 1-4",
    ),
]
