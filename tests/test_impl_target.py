"""The built-in target ``impl`` answers every protocol query like the model."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.harness.random_cases import random_queries
from kvhit.model.protocol import parse_query
from kvhit.targets.registry import get, model_target

impl_target = get("impl")


def test_impl_target_matches_the_model_on_random_queries() -> None:
    queries = list(random_queries(seed=8, count=1500))
    assert any(g.eagle for q in queries for g in q.groups)
    assert any(q.alignment > max(g.block_size for g in q.groups) for q in queries)
    assert any(len({g.block_size for g in q.groups}) > 1 for q in queries)
    for q in queries:
        query = q.to_json()
        assert impl_target(query) == model_target(query), query


group = st.one_of(
    st.builds(
        lambda b, w, e: {"kind": "sliding_window", "block_size": b, "window": w, "eagle": e},
        st.sampled_from([1, 2, 3]),
        st.integers(1, 10),
        st.booleans(),
    ),
    st.builds(
        lambda b, c: {"kind": "chunked_local", "block_size": b, "chunk": c},
        st.sampled_from([1, 2, 3]),
        st.integers(1, 10),
    ),
    st.builds(
        lambda k, b, e: {"kind": k, "block_size": b, "eagle": e and k == "full"},
        st.sampled_from(["full", "mamba"]),
        st.sampled_from([1, 2, 3]),
        st.booleans(),
    ),
)


@st.composite
def queries(draw: st.DrawFn) -> dict:
    """A protocol query: groups, rows of up to 12 blocks, M, T and an alignment."""
    groups = draw(st.lists(group, min_size=1, max_size=3))
    step = parse_query({"groups": groups, "cached": [[]] * len(groups), "max_length": 0}).alignment
    max_length = draw(st.integers(0, 24))
    return {
        "groups": groups,
        "cached": [draw(st.lists(st.booleans(), max_size=12)) for _ in groups],
        "max_length": max_length,
        "num_tokens": max_length + draw(st.integers(1, 4)),
        "alignment": step * draw(st.sampled_from([1, 1, 2])),
    }


@settings(max_examples=300, deadline=None)
@given(queries())
def test_impl_target_matches_the_model_on_hypothesis_queries(query: dict) -> None:
    normalized = parse_query(query).to_json()
    assert impl_target(normalized) == model_target(normalized)
