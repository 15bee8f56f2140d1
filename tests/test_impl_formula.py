"""Theorem 8 and the torch evaluation of the same formula."""

from __future__ import annotations

import random
from dataclasses import replace
from itertools import product

import torch
import z3

from kvhit.impl.formula import prefix_sums, valid_lengths
from kvhit.model.spec import Drafter, Group, valid
from kvhit.proofs.theorems import lookup
from kvhit.proofs.theorems.impl_formula import THEOREMS, build


def test_theorem_8_every_goal_is_unsat() -> None:
    goals = build(8)
    assert len(goals) == 40  # 10 (kind, drafter) finders (none is no drafter) × b = 1-4
    for goal in goals:
        solver = z3.Solver()
        solver.add(*goal.assertions)
        assert solver.check() == z3.unsat, goal.name


def test_theorem_8_is_registered_as_proved() -> None:
    from kvhit.proofs.registry import THEOREM_MODULES

    assert "kvhit.proofs.theorems.impl_formula" in THEOREM_MODULES
    assert [t.expected for t in THEOREMS] == ["proved"]


def test_the_goals_describe_a_reachable_domain() -> None:
    """Without the negated claim the assertions are satisfiable, so unsat means the claim."""
    for goal in build(6):
        solver = z3.Solver()
        solver.add(*goal.assertions[:-1])
        assert solver.check() == z3.sat, goal.name


def small_groups() -> list[Group]:
    """Every kind and eagle flag with small parameters, block sizes 1 and 2."""
    out = []
    for b in (1, 2):
        out += [Group("full", b), Group("full", b, drafter="drop"), Group("mamba", b)]
        out += [
            Group("sliding_window", b, window=w, drafter=e)
            for w in (1, 2, 3, 5)
            for e in (None, Drafter.DROP)
        ]
        out += [Group("chunked_local", b, chunk=c) for c in (1, 2, 3, 5)]
    return out


def test_torch_formula_equals_the_spec_on_every_small_row() -> None:
    lengths = torch.arange(0, 12)
    for g in small_groups():
        for n in range(6):
            for bits in product((False, True), repeat=n):
                prefix = prefix_sums(torch.tensor(bits, dtype=torch.bool), 12 // g.block_size + 1)
                for num_tokens in (12, 13):
                    got = valid_lengths(g, prefix, lengths, num_tokens).tolist()
                    want = [valid(g, bits, int(L), num_tokens) for L in lengths]
                    assert got == want, (g, bits, num_tokens)


def test_the_lookup_terms_answer_what_the_coordinator_answers() -> None:
    # impl_lookup restates the coordinator's reduction (amin over groups, then the
    # longest valid candidate) and its prefix sums on z3 terms: on concrete cache
    # states both must answer what the real coordinator does.
    rng = random.Random(8)
    for groups in lookup.CONFIGS:
        for num_tokens in lookup.request_lengths(groups, 6):
            for max_length in rng.sample(lookup.limits(groups, num_tokens), 3):
                t = lookup.lookup_terms(groups, num_tokens, max_length)
                for _ in range(8):
                    bits = tuple(tuple(rng.random() < 0.7 for _ in range(r.length)) for r in t.rows)
                    q = replace(t.query, cached=bits)
                    assert said(t, bits) == lookup.coordinator_answer(q), (q, bits)


def said(t: lookup.LookupTerms, bits: tuple[tuple[bool, ...], ...]) -> int:
    """The lookup term's value with the rows' bits fixed to ``bits``."""
    solver = z3.Solver()
    solver.add(
        *[z3.Select(r.bits, j) == bit for r, row in zip(t.rows, bits) for j, bit in enumerate(row)]
    )
    assert solver.check() == z3.sat
    return solver.model().eval(t.answer, model_completion=True).as_long()
