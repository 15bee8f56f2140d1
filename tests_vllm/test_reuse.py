"""The vllm target keeps one coordinator per shape of query and resets its block pool
after each lookup: a reset pool is in the state a fresh build gives, and a kept
coordinator answers every case of a campaign as a freshly built one does. (Run under
each release, e.g. ``PYTHONPATH=VENV/vllm/0.14.0 pytest tests_vllm/test_reuse.py``.)"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from dataclasses import fields
from itertools import islice
from typing import Any

import pytest
from vllm.v1.core.block_pool import BlockHashToBlockMap, BlockPool
from vllm.v1.core.kv_cache_utils import FreeKVCacheBlockQueue, KVCacheBlock

from kvhit.analysis import Analysis, Verdict
from kvhit.engines.vllm.options import EaglePath
from kvhit.engines.vllm.target import (
    Coordinators,
    Lookup,
    build_coordinator,
    lookup,
    mark_cached,
    request_hashes,
    reset_pool,
)
from kvhit.errors import Unsupported
from kvhit.harness.checker import CaseChecker
from kvhit.harness.gate import corpus_cases, exhaustive_cases, random_cases
from kvhit.harness.random_cases import CHOICES
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Query
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec

RANDOM_CASES = 2000
SCOPE_CASES = 3000


def campaign() -> Iterator[Query]:
    """A campaign's cases: the first of the gate's exhaustive scopes (where shapes
    repeat), the solver corpus, then random queries."""
    yield from (q for q, _ in islice(exhaustive_cases(), SCOPE_CASES))
    yield from (q for q, _ in corpus_cases())
    yield from (q for q, _ in islice(random_cases(0, 8, CHOICES), RANDOM_CASES))


def value(item: Any) -> Any:
    """A pool's part as plain, comparable data: blocks by their fields (links to other
    blocks by id), the free queue by the ids in it, a hash map by its entries."""
    if isinstance(item, KVCacheBlock):
        return item.block_id
    if isinstance(item, list) and item and isinstance(item[0], KVCacheBlock):
        return [block_fields(b) for b in item]
    if isinstance(item, FreeKVCacheBlockQueue):
        free = [b.block_id for b in item.get_all_free_blocks()]
        return free, item.num_free_blocks
    if isinstance(item, BlockHashToBlockMap):
        return {k: v for k, v in vars(item).items() if k != "_blocks"}
    if isinstance(item, weakref.ref):
        return "weakref"
    return item


def block_fields(block: KVCacheBlock) -> dict[str, Any]:
    """A block's fields, other blocks named by id."""
    found = {f.name: getattr(block, f.name) for f in fields(block)}
    return {
        k: value(v) if isinstance(v, KVCacheBlock | weakref.ref) else v for k, v in found.items()
    }


def pool_state(pool: BlockPool) -> dict[str, Any]:
    """Everything a block pool holds, as plain data."""
    return {name: value(item) for name, item in vars(pool).items()}


STATE_QUERIES = [
    {  # rows past the request's hashed blocks: part of the pool is never handed out
        "groups": [{"kind": "full", "block_size": 1}, {"kind": "mamba", "block_size": 1}],
        "cached": ["11111", "11011"],
        "max_length": 2,
    },
    {
        "groups": [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 4}],
        "cached": ["1101", "10"],
        "max_length": 8,
        "alignment": 4,
    },
    {
        "groups": [
            {"kind": "sliding_window", "block_size": 1, "window": 2, "eagle": True},
            {"kind": "sliding_window", "block_size": 1, "window": 3, "eagle": True},
        ],
        "cached": ["1011", "1100"],
        "max_length": 3,
    },
    {
        "groups": [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
        "cached": ["11", [True, {"upto": 6}]],
        "max_length": 7,
        "hash_unit": 2,
    },
]


def test_a_reset_pool_is_in_the_state_of_a_fresh_one() -> None:
    checked = 0
    for q in map(parse_query, STATE_QUERIES):
        try:
            used, fresh = build_coordinator(q), build_coordinator(q)
        except Unsupported:  # not a query this release can be asked (a hash unit before 0.26)
            continue
        hashes = request_hashes(q.num_tokens, used.block_pool.hash_block_size)
        mark_cached(used, q, hashes)
        used.find_longest_cache_hit(list(hashes), q.max_length)
        assert pool_state(used.block_pool) != pool_state(fresh.block_pool)
        reset_pool(used.block_pool)
        assert pool_state(used.block_pool) == pool_state(fresh.block_pool), q.to_json()
        checked += 1
    assert checked >= 3


def answer(q: Query, coordinators: Coordinators) -> Lookup | str:
    """The lookup's answer, or what it raised."""
    try:
        return lookup(q, EaglePath.DEFAULT, coordinators)
    except Exception as err:  # a refusal or vLLM's own error: both must match
        return f"{type(err).__name__}: {err}"


def test_a_kept_coordinator_answers_every_case_as_a_fresh_one() -> None:
    kept, fresh = Coordinators(), Coordinators(size=0)
    cases = 0
    for q in campaign():
        assert answer(q, kept) == answer(q, fresh), q.to_json()
        cases += 1
    assert cases > SCOPE_CASES + RANDOM_CASES
    assert kept.kept, "no coordinator was kept"
    assert not fresh.kept


def test_a_reply_without_an_answer_is_judged_without_the_reference(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def no_reference(a: Analysis) -> None:
        raise AssertionError("L* worked out for a reply that holds no answer")

    monkeypatch.setattr(Analysis, "longest_hit", property(no_reference))
    checker = CaseChecker(TargetSpec("vllm").open(), TargetRecord("vllm"))
    refused = parse_query(  # vLLM aligns a single group's hits to its block: refused
        {"groups": [{"kind": "full", "block_size": 2}], "cached": ["11"], "max_length": 4}
        | {"alignment": 4}
    )
    assert checker.check(refused).cls == Verdict.UNSUPPORTED
