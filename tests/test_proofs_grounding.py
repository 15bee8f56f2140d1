"""Grounding quantified goals by hand: sound, quantifier-free, and enough for cvc5."""

from __future__ import annotations

import pytest
import z3

from kvhit.model.spec import WINDOW_CONVENTIONS, Drafter
from kvhit.proofs.instantiate import ground, has_quantifier
from kvhit.proofs.runner import cvc5_check, smt2, z3_check
from kvhit.proofs.theorems import contracts

x, y = z3.Ints("x y")
f = z3.Function("f", z3.IntSort(), z3.IntSort())


def check(assertions: list) -> z3.CheckSatResult:
    s = z3.Solver()
    s.add(*assertions)
    return s.check()


def test_a_satisfiable_goal_stays_satisfiable() -> None:
    # f(v) = v + 1 satisfies both: a grounding that assumed too much would make it unsat
    goal = [z3.ForAll([x], f(x) > x), z3.Not(z3.ForAll([y], f(y) > y + 5))]
    assert check(ground(goal)) == z3.sat


def test_a_negated_universal_becomes_its_witness() -> None:
    goal = [z3.Not(z3.ForAll([y], y + 1 > y))]
    grounded = ground(goal)
    assert not any(has_quantifier(a) for a in grounded)
    assert check(grounded) == z3.unsat


EAGLE_WINDOWS = [
    contracts.ContractFinder("sliding_window", Drafter.DROP, c) for c in WINDOW_CONVENTIONS
]
LOOKAHEAD_WINDOW = contracts.ContractFinder("sliding_window", Drafter.LOOKAHEAD)


@pytest.mark.parametrize("finder", [*EAGLE_WINDOWS, LOOKAHEAD_WINDOW], ids=lambda f: f.label)
def test_contract_goals_are_quantifier_free_and_cvc5_proves_them(
    finder: contracts.ContractFinder,
) -> None:
    goals = contracts.unbounded_goals(finder, 2, 4)
    assert len(goals) == 3
    for goal in goals:
        assert not any(has_quantifier(a) for a in goal.assertions), goal.name
        assert cvc5_check(smt2(goal), 30) == "unsat", goal.name


@pytest.mark.parametrize("finder", EAGLE_WINDOWS, ids=lambda f: f.label)
def test_unrolled_goals_are_quantifier_free_and_both_solvers_prove_them(
    finder: contracts.ContractFinder,
) -> None:
    # the unrolled goals are solved with their own z3 logic and cvc5 options
    for goal in contracts.unrolled_goals(finder, 2, 4, 16):
        assert goal.logic == "QF_AUFLIA" and goal.cvc5_options, goal.name
        assert not any(has_quantifier(a) for a in goal.assertions), goal.name
        assert z3_check(goal, 30)[0] == "unsat", goal.name
        assert cvc5_check(smt2(goal), 30, goal.cvc5_options) == "unsat", goal.name
