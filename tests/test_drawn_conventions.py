"""Every case source draws both window conventions (docs/design.md §5.4), the shrinker
keeps an exclusive window unless the failure survives without it, and vLLM's view of
a group (its spec) reads the window as vLLM counts it."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import find

from kvhit.analysis import Analysis
from kvhit.engines.vllm.divergences import eagle_windows, same_spec, window_one
from kvhit.engines.vllm.release import Asker, Release, capabilities, spec_key
from kvhit.harness import corpus, exhaustive
from kvhit.harness.random_cases import EVERY, QueryShape, palette, random_queries
from kvhit.harness.shrink import shrink
from kvhit.harness.stateful_machine import engines
from kvhit.harness.strategies import group_configs, queries
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Kind, Query, longest_hit

EXCLUSIVE = "exclusive"


def windows(qs: list[Query]) -> list[Group]:
    return [g for q in qs for g in q.groups if g.kind == Kind.SLIDING_WINDOW]


def test_random_queries_draw_exclusive_windows_about_a_third_of_the_time() -> None:
    for shape in QueryShape:
        drawn = windows(list(random_queries(3, 4000, shape=shape)))
        share = sum(g.exclusive for g in drawn) / len(drawn)
        assert len(drawn) > 1000 and 0.2 < share < 0.4, (shape, share)
    drawn = windows(list(random_queries(3, 4000)))
    assert any(g.exclusive and g.eagle for g in drawn)
    assert any(g.exclusive and g.block_size > 1 for g in drawn)


def test_hypothesis_draws_exclusive_windows_and_shrinks_towards_inclusive() -> None:
    sliding = group_configs(palette(picked=["sliding_window", "eagle"]))
    assert not find(sliding, lambda g: True).exclusive
    assert find(sliding, lambda g: g.exclusive).window == 1
    # find raises if no example is drawn: the query and stateful program strategies too
    query = find(queries(), lambda q: any(g.exclusive for g in q.groups))
    program = find(engines(EVERY, 16, (1, 2, 4)), lambda p: any(g.exclusive for g in p.groups))
    assert all(g.window == 1 for g in (*query.groups, *program.groups) if g.exclusive)


def test_the_exhaustive_scopes_and_the_corpus_hold_exclusive_windows() -> None:
    assert sum(g.exclusive for g in exhaustive.gate_groups()) == 1
    assert sum(scope.states for scope in exhaustive.gate_scopes()) == 14289
    exclusive = [g for g in corpus.boundary_groups() if g.exclusive]
    assert [(g.block_size, g.window) for g in exclusive] == [(1, 3), (2, 5)]
    solver = [q for q in corpus.solver_queries() if any(g.exclusive for g in q.groups)]
    assert len(solver) > 20


def inclusive_reading(q: Query) -> int:
    """L* with every window read as inclusive (the convention dropped)."""
    groups = tuple(replace(g, window_convention="inclusive") for g in q.groups)
    return longest_hit(Query(groups, q.cached, q.max_length, q.num_tokens, q.alignment)).length


def test_the_shrinker_keeps_an_exclusive_window_unless_the_failure_survives_inclusive() -> None:
    q = parse_query(
        {
            "groups": [
                {"kind": "full", "block_size": 1},
                {"kind": "sliding_window", "block_size": 1, "window": 3},
                {
                    "kind": "sliding_window",
                    "block_size": 2,
                    "window": 3,
                    "window_convention": EXCLUSIVE,
                },
            ],
            "cached": ["111111", "110111", "101"],
            "max_length": 6,
        }
    )

    def convention_matters(c: Query) -> bool:
        return longest_hit(c).length != inclusive_reading(c)

    assert convention_matters(q)
    kept = shrink(Analysis(q), lambda c: convention_matters(c.query)).query
    assert convention_matters(kept) and any(g.exclusive for g in kept.groups)
    only_exclusive = Query(q.groups[::2], q.cached[::2], q.max_length, q.num_tokens, q.alignment)
    windowed = shrink(
        Analysis(only_exclusive),
        lambda c: any(g.kind == Kind.SLIDING_WINDOW for g in c.query.groups),
    ).query
    assert [(g.kind, g.exclusive) for g in windowed.groups] == [(Kind.SLIDING_WINDOW, False)]


def sw(window: int, convention: str = "inclusive", eagle: bool = False) -> Group:
    return Group(
        "sliding_window",
        1,
        window=window,
        drafter="drop" if eagle else None,
        window_convention=convention,
    )


def test_vllm_sees_an_exclusive_window_as_the_inclusive_one_a_token_longer() -> None:
    assert spec_key(sw(2, EXCLUSIVE)) == spec_key(sw(3)) != spec_key(sw(2))
    assert same_spec(sw(2, EXCLUSIVE), sw(3)) and not same_spec(sw(2, EXCLUSIVE), sw(2))
    old = Release("0.28.0", frozenset(), True, True, True, False, True)
    one_spec = parse_query(
        {
            "groups": [sw(2, EXCLUSIVE).to_json(), sw(3).to_json()],
            "cached": ["", ""],
            "max_length": 1,
        }
    )
    assert "at least two different specs" in (capabilities(Asker(old)).refusal(one_spec) or "")
    two_specs = parse_query(
        {**one_spec.to_json(), "groups": [sw(2, EXCLUSIVE).to_json(), sw(2).to_json()]}
    )
    assert capabilities(Asker(old)).refusal(two_specs) is None


def test_the_vllm_divergence_scopes_read_the_convention() -> None:
    def of(*groups: Group) -> Query:
        return parse_query(
            {"groups": [g.to_json() for g in groups], "cached": [""] * len(groups), "max_length": 1}
        )

    assert window_one(of(sw(1))) and not window_one(of(sw(1, EXCLUSIVE)))
    assert not eagle_windows(of(sw(2, EXCLUSIVE, eagle=True), sw(3, eagle=True)))
    assert eagle_windows(of(sw(2, EXCLUSIVE, eagle=True), sw(2, eagle=True)))
