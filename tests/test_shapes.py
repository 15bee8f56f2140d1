"""Random queries shaped for one target: ``--shape sglang`` draws only states SGLang's
radix tree can hold (docs/engines/sglang.md), and is the default for
``--target sglang``."""

from __future__ import annotations

from collections import Counter
from itertools import islice

from kvhit.cli.options import RunSettings
from kvhit.harness.gate import gate_phases
from kvhit.harness.random_cases import QueryShape, prefix_blocks, random_queries
from kvhit.model.spec import Kind, Query, longest_hit
from kvhit.targets.target_spec import TargetSpec


def tree_holds(q: Query) -> bool:
    """The adapter's rules (engines/sglang/target.py ``layout``), restated: one full group and
    at most two windows (reaching back >= 1 token; a second one is the drafter's, on the
    same row) and one Mamba group (the state after the last full block cached); one
    block size, A = b; a full row that is a prefix; the other rows' bits within it;
    no drafter, no hash unit."""
    kinds = [g.kind for g in q.groups]
    b = q.groups[0].block_size
    if q.hash_unit is not None or any(g.drafter for g in q.groups):
        return False
    if kinds.count(Kind.FULL) != 1:
        return False
    windows = {row for g, row in zip(q.groups, q.cached) if g.kind == Kind.SLIDING_WINDOW}
    if kinds.count(Kind.SLIDING_WINDOW) > 2 or kinds.count(Kind.MAMBA) > 1 or len(windows) > 1:
        return False
    if any(g.block_size != b for g in q.groups) or q.alignment != b:
        return False
    full_row = q.cached[kinds.index(Kind.FULL)]
    full = prefix_blocks(full_row)
    if any(full_row[full:]):
        return False
    for g, row in zip(q.groups, q.cached):
        if any(row[full:]) or (g.kind == Kind.SLIDING_WINDOW and g.window < 2 and not g.exclusive):
            return False
        last_state = full == 0 or (len(row) >= full and row[full - 1])
        if g.kind == Kind.MAMBA and not last_state:
            return False
    return kinds.count(Kind.CHUNKED_LOCAL) == 0


def test_every_sglang_shaped_query_is_one_the_tree_holds_and_most_any_are_not() -> None:
    shaped = list(random_queries(5, 3000, shape=QueryShape.SGLANG))
    assert all(map(tree_holds, shaped))
    mixes = Counter(tuple(sorted(g.kind for g in q.groups)) for q in shaped)
    assert set(mixes) == {
        (Kind.FULL,),
        (Kind.FULL, Kind.SLIDING_WINDOW),
        (Kind.FULL, Kind.MAMBA),
        (Kind.FULL, Kind.MAMBA, Kind.SLIDING_WINDOW),
        (Kind.FULL, Kind.SLIDING_WINDOW, Kind.SLIDING_WINDOW),
        (Kind.FULL, Kind.MAMBA, Kind.SLIDING_WINDOW, Kind.SLIDING_WINDOW),
    }
    assert Counter(q.groups[0].kind for q in shaped)[Kind.FULL] < 0.75 * len(shaped)
    assert sum(longest_hit(q).length > 0 for q in shaped) > len(shaped) // 3
    assert sum(map(tree_holds, random_queries(5, 3000))) < 300


def test_the_sglang_shape_draws_only_the_kinds_asked_for() -> None:
    shaped = list(random_queries(6, 500, kinds=["mamba"], shape=QueryShape.SGLANG))
    assert {g.kind for q in shaped for g in q.groups} == {Kind.FULL, Kind.MAMBA}
    assert any(q.alignment > 1 for q in shaped if len(q.groups) == 2)


def test_the_gate_draws_the_shape_it_is_given() -> None:
    random_phase = gate_phases(seconds=None, seed=2, cases=200, shape=QueryShape.SGLANG)[-1]
    drawn = [q for q, _ in islice(random_phase.cases, 200)]
    assert random_phase.limit == 200 and all(map(tree_holds, drawn))


def settings(target: str, shape: str | None) -> RunSettings:
    return RunSettings(TargetSpec(target), None, 10, 0, shape, "out", False, 1, None)


def test_each_built_in_gets_its_shape_by_default() -> None:
    assert settings("sglang", None).drawn_shape() == QueryShape.SGLANG
    assert settings("sglang", "any").drawn_shape() == QueryShape.ANY
    assert settings("impl", None).drawn_shape() == QueryShape.ANY
    assert settings("sglang-hicache", None).drawn_shape() == QueryShape.SGLANG_HICACHE
    assert settings("vllm", None).drawn_shape() == QueryShape.ANY
    assert settings("impl", "sglang").drawn_shape() == QueryShape.SGLANG
