"""The window convention (docs/design.md §1.1): inclusive (vLLM's) and exclusive
(SGLang's ``sliding_window_size``). An exclusive window of w needs exactly the KV of
an inclusive window of w+1, in the spec, every finder, the fixed point and the impl."""

from __future__ import annotations

import itertools
import random
from dataclasses import replace

import pytest
from test_impl_workloads import Workload, serve_and_check

from kvhit.analysis import Analysis
from kvhit.impl.target import impl_target
from kvhit.model.finders import find
from kvhit.model.protocol import QueryError, parse_query
from kvhit.model.spec import Drafter, Group, Query, longest_hit, window_span

EXCLUSIVE = "exclusive"


def as_inclusive(g: Group) -> Group:
    """The inclusive group that needs the same KV as the exclusive group g."""
    return replace(g, window=g.window + 1, window_convention="inclusive")


def rows(n: int) -> list[tuple[bool, ...]]:
    return [tuple(bits) for bits in itertools.product((False, True), repeat=n)]


@pytest.mark.parametrize("b", [1, 2, 3])
@pytest.mark.parametrize("eagle", [False, True])
def test_every_finder_reads_exclusive_w_as_inclusive_w_plus_one(b: int, eagle: bool) -> None:
    checked = 0
    for w in range(1, 3 * b + 2):
        g = Group(
            "sliding_window",
            b,
            window=w,
            drafter=Drafter.DROP if eagle else None,
            window_convention=EXCLUSIVE,
        )
        assert window_span(g) == window_span(as_inclusive(g)) == -(-w // b)
        for row in rows(5):
            for m in range(0, 5 * b + 1):
                got = find(g, row, m, b, 6 * b)
                assert got == longest_hit(Query((g,), (row,), m, 6 * b, b)).length
                assert got == find(as_inclusive(g), row, m, b, 6 * b)
                checked += 1
    assert checked > 500


def test_an_exclusive_window_needs_one_more_token_than_the_same_inclusive_number() -> None:
    inclusive = parse_query(
        {
            "groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}],
            "cached": ["0110"],
            "max_length": 3,
        }
    )
    g = replace(inclusive.groups[0], window_convention=EXCLUSIVE)
    exclusive = replace(inclusive, groups=(g,))
    assert longest_hit(inclusive).blocks == ((2,),)
    assert longest_hit(exclusive).blocks == ((1, 2),)
    exclusive = replace(exclusive, cached=((False, False, True, False),))
    assert (
        longest_hit(exclusive).length == 0
        and longest_hit(replace(exclusive, groups=inclusive.groups)).length == 3
    )


def random_query(rng: random.Random) -> Query:
    groups = [
        {
            "kind": "sliding_window",
            "block_size": rng.choice((1, 2)),
            "window": rng.randint(1, 5),
            "window_convention": rng.choice(("inclusive", EXCLUSIVE)),
        },
        {"kind": rng.choice(("full", "mamba")), "block_size": 2},
    ]
    return parse_query(
        {
            "groups": groups,
            "cached": ["".join(rng.choice("01") for _ in range(6)) for _ in groups],
            "max_length": rng.randint(0, 11),
        }
    )


def test_fixed_point_and_impl_agree_with_the_spec_under_both_conventions() -> None:
    rng = random.Random(19)
    exclusive_hits = 0
    for _ in range(400):
        q = random_query(rng)
        best = longest_hit(q)
        assert Analysis(q).fixed_point == best
        assert impl_target(q.to_json()) == best.to_json()
        exclusive_hits += q.groups[0].exclusive and best.length > 0
    assert exclusive_hits > 20


def test_the_tiny_model_serves_exclusive_windows_from_the_spec_blocks() -> None:
    groups = [
        Group("full", 2),
        Group("sliding_window", 2, window=3, window_convention=EXCLUSIVE),
        Group("sliding_window", 1, window=2, window_convention=EXCLUSIVE),
    ]
    rng = random.Random(7)
    root = [rng.randrange(4) for _ in range(20)]
    prompts = [root[: rng.randint(4, 20)] + [rng.randrange(4)] for _ in range(6)]
    assert serve_and_check(Workload(groups, 40, None, prompts), seed=3, every_candidate=True) > 0


def test_the_protocol_states_the_convention_on_sliding_window_groups() -> None:
    obj = {
        "groups": [
            {"kind": "sliding_window", "block_size": 1, "window": 3, "window_convention": EXCLUSIVE}
        ],
        "cached": ["1"],
        "max_length": 1,
    }
    q = parse_query(obj)
    assert q.groups[0].exclusive and q.groups[0].describe() == "sliding_window w=3 exclusive b=1"
    assert parse_query(q.to_json()) == q
    assert (
        "window_convention"
        not in parse_query(
            {**obj, "groups": [{**obj["groups"][0], "window_convention": "inclusive"}]}
        ).to_json()["groups"][0]
    )
    with pytest.raises(QueryError, match=r"groups\[0\].window_convention: expected one of"):
        parse_query({**obj, "groups": [{**obj["groups"][0], "window_convention": "both"}]})
