"""Properties of the reference model over all kinds, eagle, mixed block sizes and alignments."""

from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.harness.strategies import queries
from kvhit.model import (
    brute_force,
    find,
    fixed_point,
    longest_hit,
    min_of_groups,
    needed_blocks,
    valid,
)
from kvhit.model.ops import PY
from kvhit.model.spec import Query, fine_query

PROPERTY = settings(max_examples=400, deadline=None)


@PROPERTY
@given(queries())
def test_fixed_point_equals_brute_force(q: Query):
    assert fixed_point(q) == brute_force(q)


@PROPERTY
@given(queries())
def test_min_of_groups_is_never_too_short(q: Query):
    assert min_of_groups(q) >= brute_force(q)


@PROPERTY
@given(queries())
def test_each_finder_returns_the_largest_valid_length_up_to_m(q: Query):
    q = fine_query(q)  # a finder reads bits: with a hash unit, one per unit
    for g, row in zip(q.groups, q.cached):
        for m in range(q.max_length + 1):
            hit = find(g, row, m, q.alignment, q.num_tokens)
            best = max(L for L in range(0, m + 1, q.alignment) if valid(g, row, L, q.num_tokens))
            assert hit == best, (g, row, m)


@PROPERTY
@given(queries(), st.randoms(use_true_random=False))
def test_answer_is_independent_of_group_order(q: Query, rnd):
    q = fine_query(q)
    order = list(range(len(q.groups)))
    rnd.shuffle(order)
    shuffled = Query(
        tuple(q.groups[i] for i in order),
        tuple(q.cached[i] for i in order),
        q.max_length,
        q.num_tokens,
        q.alignment,
    )
    assert fixed_point(shuffled) == fixed_point(q)


@PROPERTY
@given(queries())
def test_every_needed_block_is_cached_at_the_answer(q: Query):
    q = fine_query(q)
    best = longest_hit(q)
    for g, row, reused in zip(q.groups, q.cached, best.blocks):
        needed = needed_blocks(g, best.length)
        assert all(PY.bit(row, j) for j in needed)
        assert set(reused) <= set(needed)
