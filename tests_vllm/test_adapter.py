"""The vllm target builds vLLM's state as the protocol describes it."""

from __future__ import annotations

import doctest
import re

import pytest
from cases import disagreement, mixed_queries, refused, try_lookup
from vllm.v1.core.kv_cache_utils import BlockHashListWithBlockSize

from kvhit.engines.vllm import target as vllm_adapter
from kvhit.engines.vllm.divergences import documented
from kvhit.engines.vllm.target import (
    RELEASE,
    build_coordinator,
    group_spec,
    lookup,
    mark_cached,
    request_hashes,
)
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import EAGLE_KINDS, Drafter, Kind, group_of, longest_hit
from kvhit.targets import registry as targets
from kvhit.targets.runner import CallableRunner

HYBRID = {
    "groups": [
        {"kind": "full", "block_size": 4},
        {"kind": "sliding_window", "block_size": 2, "window": 5},
        {"kind": "mamba", "block_size": 2, "eagle": False},
    ],
    "cached": ["1101", "11011110", "01010110"],
    "max_length": 15,
}


def test_the_builtin_target_is_the_adapter():
    q = parse_query(HYBRID)
    assert targets.get("vllm")(q.to_json()) == longest_hit(q).to_json()


def test_an_exclusive_window_is_given_to_vllm_one_token_longer():
    """Exclusive w = 2 reaches 2 tokens back: vLLM's (inclusive) sliding_window 3. Given
    2, vLLM would reuse block 1 alone and answer 2 (unsafe: token 0 is not cached)."""
    q = parse_query(
        {
            "groups": [
                {"kind": "full", "block_size": 1},
                {
                    "kind": "sliding_window",
                    "block_size": 1,
                    "window": 2,
                    "window_convention": "exclusive",
                },
            ],
            "cached": ["11", "01"],
            "max_length": 2,
        }
    )
    assert group_spec(q.groups[1]).sliding_window == 3
    assert lookup(q).length == longest_hit(q).length == 0


def test_vllm_agrees_with_the_model_on_exclusive_windows():
    """Releases document different classes (0.14.0 documents most of these states and
    refuses mixed block sizes), so the floor is a share of the undocumented ones."""
    undocumented = checked = 0
    for q in mixed_queries(11, 1500):
        if not any(g.exclusive for g in q.groups) or documented(q, RELEASE.name):
            continue
        undocumented += 1
        found = try_lookup(q)
        assert (found is None) == refused(q), q.to_json()
        if found is not None:
            assert disagreement(q, found) is None, q.to_json()
            checked += 1
    assert checked > 100 and checked > undocumented // 2


def test_exactly_the_queried_blocks_are_cached():
    q = parse_query(HYBRID)
    coordinator = build_coordinator(q)
    pool = coordinator.block_pool
    hashes = request_hashes(q.num_tokens, pool.hash_block_size)
    mark_cached(coordinator, q, hashes)
    for group_id, (g, row) in enumerate(zip(q.groups, q.cached)):
        view = (
            hashes
            if g.block_size == pool.hash_block_size
            else BlockHashListWithBlockSize(hashes, pool.hash_block_size, g.block_size)
        )
        marked = [pool.get_cached_block(view[j], [group_id]) is not None for j in range(len(row))]
        assert marked == list(row)


def test_hashes_chain_over_the_whole_prefix():
    assert len(request_hashes(10, 4)) == 2
    assert len(set(request_hashes(12, 1))) == 12
    assert request_hashes(8, 2)[:2] == request_hashes(4, 2)


def test_cached_bits_past_the_requests_whole_blocks_are_ignored():
    q = parse_query(
        {"groups": [{"kind": "full", "block_size": 2}], "cached": ["111"], "max_length": 3}
    )
    assert lookup(q).length == 2


@pytest.mark.parametrize(
    "query",
    [
        {
            "groups": [
                {"kind": "chunked_local", "block_size": 2, "chunk": 4},
                {"kind": "full", "block_size": 4},
            ],
            "cached": ["11", "1"],
            "max_length": 4,
        },
        {
            "groups": [{"kind": "full", "block_size": 2}],
            "cached": ["11"],
            "max_length": 4,
            "alignment": 4,
        },
    ],
    ids=["chunked local with mixed block sizes", "one group aligned past its block size"],
)
def test_configurations_vllm_refuses_are_unsupported(query):
    q = parse_query(query)
    assert refused(q)
    with pytest.raises(Unsupported):
        lookup(q)


def test_an_assert_inside_vllm_on_a_supported_query_is_a_crash(monkeypatch):
    q = parse_query(HYBRID)
    coordinator = type(build_coordinator(q))

    def asserts(self, *args, **kwargs):
        raise AssertionError("an invariant of vLLM's")

    monkeypatch.setattr(coordinator, "find_longest_cache_hit", asserts)
    reply = CallableRunner(targets.get("vllm"), timeout=10.0)(q.to_json())
    assert reply.status == "crash"
    assert re.fullmatch(
        r"AssertionError: an invariant of vLLM's \(raised at \S*test_adapter\.py:\d+ in asserts\)",
        reply.detail,
    ), reply.detail


def test_a_refused_configuration_never_reaches_vllm(monkeypatch):
    monkeypatch.setattr(vllm_adapter, "get_kv_cache_coordinator", None)
    q = parse_query(
        {
            "groups": [{"kind": "full", "block_size": 2}],
            "cached": ["1"],
            "max_length": 4,
            "alignment": 4,
        }
    )
    with pytest.raises(Unsupported, match="single group"):
        lookup(q)


def test_the_adapter_examples_hold():
    assert doctest.testmod(vllm_adapter).failed == 0


def test_every_kind_has_its_vllm_spec():
    """One spec builder per kind (tests/test_kind_registries.py checks the others);
    a drafter's spec is flagged where the release has the flag."""
    assert list(vllm_adapter.SPECS) == list(Kind)
    for kind in EAGLE_KINDS:
        spec = group_spec(group_of(kind, 2, 3, Drafter.DROP))
        assert getattr(spec, "is_draft", True) is True
