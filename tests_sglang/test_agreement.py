"""SGLang's radix caches agree with the model on every small state they can hold."""

from __future__ import annotations

import doctest
import itertools
from collections import Counter
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from cases import bits, mamba_queries, query, unified_queries, window_queries

import kvhit.engines.sglang.target as adapter
from kvhit.engines.sglang.target import build, key, layout, sglang_target
from kvhit.errors import Unsupported
from kvhit.harness.random_cases import QueryShape, random_queries
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Drafter, Group, Kind, Query, group_of
from kvhit.targets.registry import model_target

Answer = dict[str, Any]


def agreeing(queries: Iterable[dict[str, Any]]) -> list[Answer]:
    """SGLang's answer to each query, each asserted equal to the model's."""
    answers = []
    for q in queries:
        answer = sglang_target(q)
        assert answer == model_target(q), q
        answers.append(answer)
    return answers


def hits(answers: list[Answer]) -> int:
    """How many answers reuse something."""
    return sum(a["length"] > 0 for a in answers)


@pytest.mark.parametrize("convention", ["inclusive", "exclusive"])
def test_the_window_cache_agrees_under_both_conventions(convention: str) -> None:
    answers = agreeing(
        q
        for q in window_queries(convention)
        # SGLang's window must be positive: pinned in test_findings
        if not (convention == "inclusive" and q["groups"][1]["window"] == 1)
    )
    assert len(answers) > 2000 and hits(answers) > 500


def test_the_mamba_cache_agrees() -> None:
    answers = agreeing(mamba_queries())
    assert len(answers) > 150 and hits(answers) > 100


def test_sglang_shaped_random_queries_are_all_answered_and_agree() -> None:
    """``--shape sglang`` (the gate's default for this target) draws only states the
    tree holds: every one answered, none ``unsupported``; windows in both conventions."""
    drawn: Counter[str] = Counter()
    queries = list(random_queries(19, 1500, shape=QueryShape.SGLANG))
    assert all(map(sglang_target.capabilities.allows, queries))
    answers = agreeing(q.to_json() for q in queries)
    for q in queries:
        drawn.update(g.kind for g in q.groups)
        drawn["exclusive"] += any(g.exclusive for g in q.groups)
    drawn["hit"] = hits(answers)
    assert min(drawn["sliding_window"], drawn["mamba"], drawn["exclusive"]) > 150, drawn
    assert drawn["hit"] > 500, drawn


def test_a_full_attention_tree_alone_agrees() -> None:
    answers = agreeing(
        query([{"kind": "full", "block_size": b}], ["1" * full], m)
        for b in (1, 2, 4)
        for full in range(4)
        for m in range(0, (full + 1) * b + 1)
    )
    assert hits(answers) > 10


def test_the_tree_holds_exactly_the_query_window_state() -> None:
    """Read back through SGLang's own API: its tombstones are the uncached blocks."""
    q = parse_query(
        query(
            [
                {"kind": "full", "block_size": 2},
                {"kind": "sliding_window", "block_size": 2, "window": 3},
            ],
            ["111111", "011001"],
            11,
        )
    )
    lay = layout(q)
    built = build(lay)
    tombstones = built.cache.tree_core.swa_tombstone_ranges(key(lay.tokens), 0, lay.tokens)
    assert [tuple(r) for r in tombstones] == [(0, 2), (6, 10)]


def test_sglang_python_tree_core_answers_as_its_rust_one(monkeypatch: pytest.MonkeyPatch) -> None:
    queries = [q for i, q in enumerate(window_queries("exclusive")) if i % 7 == 0]
    queries += list(mamba_queries())[::5]
    rust = [sglang_target(q) for q in queries]
    monkeypatch.setattr(adapter, "TREE_CORE", "python")
    assert [sglang_target(q) for q in queries] == rust
    assert (
        type(build(layout(parse_query(queries[1]))).cache.tree_core).__name__ == "UnifiedTreeCore"
    )


def test_the_adapter_docstring_examples_hold() -> None:
    result = doctest.testmod(adapter, optionflags=doctest.ELLIPSIS)
    assert result.failed == 0 and result.attempted >= 2


@pytest.mark.parametrize("kind", [k for k in Kind if k != Kind.FULL])
def test_the_tree_holds_each_kind_it_has_a_reuse_for_and_declares_no_other(kind: Kind) -> None:
    """Every kind the target declares is in :data:`adapter.REUSED` (the tree holds it
    beside a full group); the others are refused before SGLang is asked
    (tests/test_kind_registries.py checks the other per-kind maps)."""
    q = Query((Group(Kind.FULL, 1), group_of(kind, 1, 3)), ((), ()), 0, 1, 1)
    assert (kind in adapter.REUSED) == (kind in sglang_target.capabilities.kinds)
    assert (kind in adapter.REUSED) == sglang_target.capabilities.allows(q)


def test_hash_units_and_drafters_are_not_declared() -> None:
    """SGLang's page is its finest unit, and its EAGLE tree keys token pairs: a query
    with a hash unit or a drafter key is never drawn for it, and refused if asked."""
    caps = sglang_target.capabilities
    assert not caps.hash_units and caps.drafters == {Drafter.NONE}
    unit = {"groups": [{"kind": "full", "block_size": 2}], "cached": [[{"upto": 1}]],
            "max_length": 2, "hash_unit": 1}  # fmt: skip
    with pytest.raises(Unsupported, match="declares no hash units"):
        sglang_target(unit)


def test_full_window_and_mamba_in_one_tree_agree() -> None:
    """SGLang's UnifiedRadixCache with all three components: every small state."""
    answers = agreeing(unified_queries())
    both = sum(bool(a["blocks"][1]) and bool(a["blocks"][2]) for a in answers)
    assert len(answers) > 1500 and hits(answers) > 500 and both > 300


@pytest.mark.parametrize("page", [2, 4])
def test_mamba_at_page_size_above_one_agrees(page: int) -> None:
    """With SGLang's extra buffer the Mamba component takes any page size; its states
    sit on page ends, one bit per page."""
    groups = [{"kind": "full", "block_size": page}, {"kind": "mamba", "block_size": page}]

    def states() -> Iterator[dict[str, Any]]:
        for full in range(0, 5):
            for row in bits(full):
                if full and row[-1] == "0":
                    continue
                for m in range(0, (full + 1) * page + 1):
                    yield query(groups, ["1" * full, row], m)

    answers = agreeing(states())
    assert len(answers) > 100 and hits(answers) > 50


def test_a_drafter_window_beside_the_target_window_agrees() -> None:
    """Two windows on one row: SGLang's sliding_window_size and draft_swa_window, whose
    KV shares the window slots; SGLang keeps and matches the larger."""
    pairs = []
    for full in range(0, 5):
        for row in bits(full):
            for s, d in itertools.product(range(1, 4), range(1, 5)):
                windows = [{"kind": "sliding_window", "block_size": 1, "window": w} for w in (s, d)]
                groups = [{"kind": "full", "block_size": 1}] + [
                    {**g, "window_convention": "exclusive"} for g in windows
                ]
                for m in range(0, full + 2):
                    alone = query(groups[:2], ["1" * full, row], m)
                    pairs.append((query(groups, ["1" * full, row, row], m), alone))
    answers = agreeing(q for q, _ in pairs)
    differ = sum(
        a["length"] != model_target(alone)["length"] for a, (_, alone) in zip(answers, pairs)
    )
    assert len(answers) > 1000 and differ > 100
