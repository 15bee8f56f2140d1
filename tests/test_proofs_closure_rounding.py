"""Theorems 4 and 6 (downward closure, own-block rounding): each gets its expected
status at a small bound, and broken variants are refuted by counterexamples that
really break them when run on the plain model."""

from __future__ import annotations

import pytest

from kvhit.model.algorithms import brute_force, single_pass
from kvhit.proofs.registry import Status, Theorem
from kvhit.proofs.runner import run_theorem
from kvhit.proofs.theorems import closure, rounding


def theorem(module, name: str) -> Theorem:
    return next(t for t in module.THEOREMS if t.name == name)


@pytest.mark.parametrize(
    ("module", "name", "bound", "expected"),
    [
        (closure, "full_downward_closed", 4, "proved"),
        (closure, "full_evaluate_once", 3, "proved"),
        (closure, "one_pass_shortcut", 2, "proved"),
        (closure, "window_downward_closed", 3, "refuted"),
        (rounding, "own_block_rounding", 4, "proved"),
        (rounding, "own_block_rounding_coarse_alignment", 3, "refuted"),
    ],
)
def test_theorem_gets_its_expected_status(module, name: str, bound: int, expected: str) -> None:
    result = run_theorem(theorem(module, name), bound=bound, timeout=30)
    assert result.status == expected, result.detail
    if expected == "refuted":
        assert result.counterexample is not None and result.counterexample.broken


def refuted_counterexample(t: Theorem, bound: int):
    result = run_theorem(t, bound=bound, timeout=30)
    assert result.status == "refuted", result.detail
    cx = result.counterexample
    assert cx is not None and cx.broken
    return cx


def test_window_closure_counterexample_is_valid_above_a_gap() -> None:
    cx = refuted_counterexample(theorem(closure, "window_downward_closed"), 3)
    ok = closure.valid_lengths(cx.query)
    assert ok[cx.query.max_length] and not ok[cx.length]


def test_shortcut_with_the_non_closed_group_first_is_refuted() -> None:
    orders = [(last, "full") for last in closure.NOT_CLOSED]
    broken = Theorem(
        "shortcut_wrong_order",
        "one pass, non-closed group first",
        Status.PROVED,
        True,
        closure.one_pass_goals(orders),
        bound=3,
    )
    cx = refuted_counterexample(broken, 3)
    assert cx.query.groups[0].kind in closure.NOT_CLOSED
    assert single_pass(cx.query) != brute_force(cx.query)


def test_shortcut_with_two_non_closed_groups_is_refuted() -> None:
    broken = Theorem(
        "shortcut_two_windows",
        "one pass, two windows",
        Status.PROVED,
        True,
        closure.one_pass_goals([("full", "sliding_window", "sliding_window")]),
        bound=3,
    )
    cx = refuted_counterexample(broken, 3)
    assert single_pass(cx.query) != brute_force(cx.query)


def test_coarse_alignment_counterexample_settles_off_a_multiple_of_a() -> None:
    cx = refuted_counterexample(theorem(rounding, "own_block_rounding_coarse_alignment"), 3)
    got = rounding.own_block_fixed_point(cx.query)
    assert got % cx.query.alignment != 0 and got != brute_force(cx.query)
