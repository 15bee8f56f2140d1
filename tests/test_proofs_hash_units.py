"""Hash units and drafters in the proofs: the fine rows the theorems read are the
model's own ``fine_row``, ``fine_row_faithful`` and ``drafter_none_same`` are proved
at small bounds, and a counterexample to the expansion lemma replays in the plain
model."""

from __future__ import annotations

from itertools import product

import z3

from kvhit.model.spec import Group, Kind, Upto, fine_row
from kvhit.proofs.common import FINDERS, block_entries, finder_label, fine_bits
from kvhit.proofs.registry import Status, get
from kvhit.proofs.runner import run_theorem
from kvhit.proofs.theorems import hash_units


def test_every_drafter_a_kind_may_carry_is_a_finder() -> None:
    labels = [finder_label(f) for f in FINDERS]
    assert "mamba lookahead" in labels and "mamba drafter=none" in labels
    assert "mamba eagle" not in labels and "chunked_local eagle" not in labels
    assert len(labels) == len(set(labels)) == 4 + 2 + 4 + 4


def test_fine_bits_are_fine_row_for_every_choice_of_entries() -> None:
    """The z3 fine row of a coarse row of choices equals the model's fine_row of the
    entries those choices name, for every choice of two blocks."""
    for kind in (Kind.FULL, Kind.MAMBA):
        g = Group(kind, 4)
        choices = [z3.Int("c0"), z3.Int("c1")]
        bits = fine_bits(g, 2, choices)
        for held in product(range(3), repeat=2):
            entries = tuple(block_entries(g, 2, j)[c] for j, c in enumerate(held))
            fixed = [z3.substitute(b, *zip(choices, map(z3.IntVal, held))) for b in bits]
            assert tuple(z3.is_true(z3.simplify(b)) for b in fixed) == fine_row(g, entries, 2)
    assert block_entries(Group(Kind.FULL, 6), 2, 1) == [False, Upto(8), Upto(10), True]


def test_fine_row_faithful_and_drafter_none_same_are_proved() -> None:
    for name, bound in (("fine_row_faithful", 2), ("drafter_none_same", None)):
        result = run_theorem(get(name), bound=bound, timeout=30)
        assert result.status == Status.PROVED, result.detail
        assert result.goals and all(g.context is not None for g in result.goals)


def test_the_lemma_covers_every_distinct_finder_and_partial_blocks() -> None:
    names = [goal.name for goal in hash_units.build(2)]
    assert {n.split(" h=")[0] for n in names} >= {
        "mamba",
        "mamba lookahead",
        "full eagle",
        "sliding_window exclusive",
    }
    assert any("h=2 b=6" in n for n in names)  # k = 3: two fine boundaries inside a block
