"""Theorem 10 (tiers) at small bounds: the fixed point over a tiered query is L* of
§1.7, each known-wrong combination's counterexample breaks it in the plain model,
and a wrong merge of the tiers is refuted."""

from __future__ import annotations

from typing import Any

import pytest

from kvhit.model import algorithms, spec
from kvhit.model.algorithms import brute_force, fixed_point
from kvhit.model.ops import PY, Ops
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Kind, Tier, local_query
from kvhit.proofs.registry import Counterexample, Status, get
from kvhit.proofs.runner import run_theorem
from kvhit.proofs.theorems import tiers
from kvhit.proofs.theorems.tiers import loadable, longest_loadable

HELD_ROW = spec.held_row


def held_row_but_last_tier(rows: list[Any], ops: Ops = PY) -> tuple[Any, ...]:
    """A merge that ignores the last tier's row (the host cache, the one tier that
    holds Mamba states, when the query has both)."""
    return HELD_ROW(rows[:-1], ops)


def tier_rows_lent(t: Tier) -> tuple[Any, ...]:
    """A tier's first row lent to every group it has no row for, whatever the group's
    kind: a tier used for a kind it does not hold."""
    first = next((row for row in t.cached if row is not None), ())
    return tuple(first if row is None else row for row in t.cached)


def test_the_fixed_point_over_tiers_is_proved_at_a_small_bound() -> None:
    result = run_theorem(get("tiered_fixed_point_longest"), bound=2)
    assert result.status == Status.PROVED, result.detail
    # every goal unsat, and its assumptions alone sat (the vacuity check's context)
    assert all(g.status == "unsat" and g.context for g in result.goals)
    names = [g.name for g in result.goals]
    assert "3 groups: full b=1, sliding_window b=1, mamba b=1 (A=1)" in names
    assert "2 groups: full b=2, mamba b=2 (A=2)" in names


def refutation(attribute: str) -> Counterexample:
    result = run_theorem(get(f"{attribute}_safe"), bound=3)
    assert result.status == Status.REFUTED, result.detail
    assert result.counterexample is not None and result.counterexample.broken
    return result.counterexample


@pytest.mark.parametrize("name", sorted(algorithms.WRONG_TIER_COMBINATIONS))
def test_each_wrong_combination_is_unsafe_on_its_counterexample(name: str) -> None:
    """Run through the plain model: the combination answers more than L* (which the
    fixed point, brute force and §1.7 read off the query all give), and it answers
    L* on the pool alone, which has a hit, so the tiers are what it gets wrong."""
    run = algorithms.WRONG_TIER_COMBINATIONS[name]
    cx = refutation(run.__name__)
    q = cx.query
    assert cx.algorithm == name and cx.length == run(q) == cx.answers[name]
    best = brute_force(q)
    assert run(q) > best == cx.answers["L*"] == fixed_point(q) == longest_loadable(q, q.top)
    assert not loadable(q, run(q))
    assert q.tiers and any(row for t in q.tiers for row in t.cached if row is not None)
    pool = local_query(q)
    assert run(pool) == brute_force(pool) == cx.answers["pool alone"] > 0
    assert any(g.kind == Kind.MAMBA for g in q.groups)


def test_a_counterexample_is_as_small_as_can_be() -> None:
    """The pool has a hit, so M = 1 cannot go wrong: M = 2, and three held blocks
    (the pool's hit of 1 in both groups, one block past it in a tier)."""
    q = refutation("max_of_groups").query
    assert q.max_length == 2
    held = sum(bool(b) for t in q.tiers for row in t.cached if row is not None for b in row)
    assert held + sum(map(sum, q.cached)) == 3


@pytest.mark.parametrize(
    ("where", "attribute", "wrong", "unsafe"),
    [
        (spec, "held_row", held_row_but_last_tier, False),
        (spec, "tier_rows", tier_rows_lent, True),
    ],
    ids=["a tier ignored", "a tier used for a kind it does not hold"],
)
def test_a_wrong_merge_is_refuted(
    where: Any, attribute: str, wrong: Any, unsafe: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The merge is the model's (held_query); L* is read off the query, so a merge
    that ignores a tier loses reuse and one that lends a tier's row to a kind it does
    not hold is unsafe, on a counterexample the plain model confirms."""
    theorem = get("tiered_fixed_point_longest")
    monkeypatch.setattr(where, attribute, wrong)
    result = run_theorem(theorem, bound=2)
    assert result.status == Status.REFUTED, result.detail
    cx = result.counterexample
    assert cx is not None and cx.broken
    q = cx.query
    got, best = fixed_point(q), longest_loadable(q, q.top)
    assert (got > best) if unsafe else (got < best)


def test_the_tiers_of_a_counterexample_are_the_theorem_s() -> None:
    """A counterexample names its tiers and what each holds, as the query protocol
    reads them back."""
    q = refutation("local_then_external").query
    names = dict(tiers.TIERS)
    assert all(t.holds == names[t.name] for t in q.tiers)
    assert parse_query(q.to_json()) == q
