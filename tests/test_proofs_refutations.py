"""Theorems 5, 7 and 11 at small bounds, and their counterexamples run through the plain
model."""

from __future__ import annotations

import pytest
import z3

from kvhit.model import recovery
from kvhit.model.algorithms import brute_force, fixed_point, min_of_groups, single_pass
from kvhit.model.spec import Drafter, Kind, Upto, fine_query
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem, all_theorems, get
from kvhit.proofs.runner import run_theorem
from kvhit.proofs.theorems import eagle, min_groups

THEOREMS = {
    t.name: t
    for t in all_theorems(["kvhit.proofs.theorems.min_groups", "kvhit.proofs.theorems.eagle"])
}


@pytest.mark.parametrize("name", sorted(THEOREMS))
def test_theorem_has_its_expected_status_at_a_small_bound(name: str) -> None:
    result = run_theorem(THEOREMS[name], bound=3)
    assert result.status == THEOREMS[name].expected, result.detail
    assert (result.counterexample is not None) == (result.status == "refuted")


def refutation(name: str, bound: int = 4) -> Counterexample:
    result = run_theorem(THEOREMS[name], bound=bound)
    assert result.status == "refuted", result.detail
    assert result.counterexample is not None and result.counterexample.broken
    return result.counterexample


def test_min_counterexample_is_unsafe_and_as_small_as_the_seed() -> None:
    q = refutation("min_is_longest").query
    assert min_of_groups(q) > brute_force(q) == fixed_point(q)
    assert len(q.groups) == 2
    assert sum(map(sum, q.cached)) == 2
    assert q.max_length == 2


def test_spiral_inside_the_fixed_point_loses_reuse_concretely() -> None:
    cx = refutation("eagle_spiral")
    q = cx.query
    assert any(g.eagle for g in q.groups)
    assert eagle.spiral_fixed_point(q) < brute_force(q) == fixed_point(q)
    assert cx.length == eagle.spiral_fixed_point(q)


def test_single_pass_is_wrong_for_two_sliding_windows_concretely() -> None:
    q = refutation("single_pass_two_windows").query
    assert [g.kind for g in q.groups] == ["sliding_window", "sliding_window"]
    assert single_pass(q) != brute_force(q) == fixed_point(q)


def test_the_same_goals_prove_the_single_drop_wrapper_and_refute_the_spiral() -> None:
    """The spiral differs from the model only in the eagle finder: swapping it back in
    (the single-drop wrapper) makes the same claim provable."""
    kinds = ((Kind.FULL, Drafter.DROP),)
    right = eagle.single_drop_goals(3)[0]
    assert right.name == eagle.label(kinds)
    solver = z3.Solver()
    solver.add(*right.assertions)
    assert solver.check() == z3.unsat
    wrong = eagle.spiral_goals(3)[0]
    solver = z3.Solver()
    solver.add(*wrong.assertions)
    assert solver.check() == z3.sat


def test_lower_bound_proof_covers_three_groups() -> None:
    names = [goal.name for goal in min_groups.lower_bound_goals(3)]
    assert any(name.startswith("3 groups") for name in names)
    assert any("eagle" in name for name in names)


def test_a_counterexample_that_does_not_break_the_model_is_an_error() -> None:
    x = z3.Int("x")
    q = refutation("eagle_spiral", bound=2).query

    def witness(model: z3.ModelRef) -> Counterexample:
        return Counterexample(q, "nothing", 0, {}, broken=False)

    t = Theorem(
        "bogus", "x is never 1.", Status.REFUTED, False, lambda b: [Goal("x", [], x == 1, witness)]
    )
    assert run_theorem(t).status == "error"


def test_min_with_a_hash_unit_is_unsafe_on_a_partial_block() -> None:
    cx = refutation("min_is_longest_hash_unit", bound=2)
    q = cx.query
    assert q.hash_unit == 1 and q.alignment == 1
    assert any(isinstance(e, Upto) for row in q.cached for e in row)
    assert min_of_groups(q) > brute_force(q) == fixed_point(q)
    assert cx.length == min_of_groups(q)


@pytest.mark.parametrize(
    ("name", "unsafe"), [("mamba_eagle_margin", False), ("mamba_eagle_margin_unsafe", True)]
)
def test_the_eagle_margin_on_mamba_breaks_a_mamba_group_without_a_drop(
    name: str, unsafe: bool
) -> None:
    """The counterexample's Mamba group carries drafter none, as the spec says; the
    margin (the Mamba group treated as a drop drafter) answers otherwise than L*:
    less (lost reuse) or more (unsafe, a state that is not held)."""
    cx = refutation(name, bound=3)
    q = cx.query
    mamba = [g for g in q.groups if g.kind == Kind.MAMBA]
    assert mamba and all(g.drafter == Drafter.NONE for g in mamba)
    got, best = eagle.mamba_margin_fixed_point(q), brute_force(q)
    assert (got > best) if unsafe else (got < best)
    assert fixed_point(q) == best
    assert all(g.eagle for g in eagle.margin_groups(fine_query(q)).groups if g.kind == Kind.MAMBA)


def test_the_recovery_theorem_is_proved_at_a_small_bound() -> None:
    result = run_theorem(get("recovered_is_longest"), bound=2)
    assert result.status == Status.PROVED, result.detail
    assert all(g.status == "unsat" and g.context for g in result.goals)
    assert any(g.name.endswith("recovered_length") for g in result.goals)


RULE_VERDICTS = {
    "truncate at the first invalid block": (1, True),
    "per-group truncation, then the min": (2, True),
    "full attention alone": (2, True),
    "replay from zero": (1, False),
}
"""Each wrong recovery rule: the fewest groups its counterexample can have, and whether
it is unsafe (else it loses reuse)."""


@pytest.mark.parametrize("name", sorted(recovery.WRONG_RECOVERY_RULES))
def test_each_wrong_recovery_rule_is_refuted_concretely(name: str) -> None:
    """The counterexample is drawn as the pruned query (so its L* is the recovered
    one), and its note names the invalid blocks; run through the plain model, the rule
    answers otherwise than the recovered length, in the direction the rule errs."""
    run = recovery.WRONG_RECOVERY_RULES[name]
    result = run_theorem(get(f"{run.__name__}_recovers"), bound=3)
    assert result.status == Status.REFUTED, result.detail
    cx = result.counterexample
    assert cx is not None and cx.broken and cx.algorithm == name
    assert cx.answers["recovered L*"] == brute_force(cx.query) == fixed_point(cx.query)
    assert "reported invalid, drawn as not cached: group" in cx.note
    groups, unsafe = RULE_VERDICTS[name]
    assert len(cx.query.groups) == groups
    assert (cx.length > brute_force(cx.query)) if unsafe else (cx.length < brute_force(cx.query))
    assert cx.answers["hit before the failure"] >= cx.answers["recovered L*"]
    if name == "full attention alone":
        assert Kind.FULL in [g.kind for g in cx.query.groups]
