"""SGLang's HiCache host tier under its hybrid radix tree (the ``sglang-hicache``
target) against the model, on tiered queries."""

from __future__ import annotations

import doctest
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
import torch

import kvhit.engines.sglang.hicache as hicache
import kvhit.engines.sglang.target as adapter
from kvhit.engines.sglang.hicache import (
    sglang_hicache_target,
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_direct,
    transfer_kv_per_layer_direct_pf_lf,
)
from kvhit.errors import Unsupported
from kvhit.harness.random_cases import QueryShape, random_queries
from kvhit.model.algorithms import longest_hit
from kvhit.model.protocol import parse_query
from kvhit.model.spec import local_query
from kvhit.targets.registry import model_target

FULL1 = {"kind": "full", "block_size": 1}
MAMBA1 = {"kind": "mamba", "block_size": 1}


def window(w: int, b: int = 1) -> dict[str, object]:
    return {"kind": "sliding_window", "block_size": b, "window": w}


def tiered(
    groups: list[dict[str, Any]], rows: list[str], host: dict[str, str], max_length: int
) -> dict[str, Any]:
    """A normalized query whose one tier, ``host``, holds the given rows."""
    kinds = sorted({g["kind"] for g in groups})
    tier = {"name": "host", "holds": kinds, "cached": host}
    message = {"groups": groups, "cached": rows, "max_length": max_length, "tiers": [tier]}
    return parse_query(message).to_json()


@pytest.fixture
def every_load() -> Iterator[None]:
    """SGLang loading back every host hit, however short (its threshold at 0)."""
    hicache.LOAD_BACK_THRESHOLD = 0
    try:
        yield
    finally:
        hicache.LOAD_BACK_THRESHOLD = None


def test_the_module_examples_hold() -> None:
    result = doctest.testmod(hicache)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.usefixtures("every_load")
def test_shaped_tiered_queries_are_all_answered_and_agree() -> None:
    """``--shape sglang-hicache`` draws only what SGLang's tree and host tier hold:
    every query answered, each equal to the model's, many hits served partly from the
    host (longer than the device alone could serve), windows and Mamba among them."""
    drawn: Counter[str] = Counter()
    for q in random_queries(5, 400, shape=QueryShape.SGLANG_HICACHE):
        assert sglang_hicache_target.capabilities.allows(q), q
        message = q.to_json()
        answer = sglang_hicache_target(message)
        assert answer == model_target(message), message
        drawn.update(g.kind for g in q.groups)
        drawn["from host"] += answer["length"] > longest_hit(local_query(q)).length
    assert drawn["from host"] > 60, drawn
    assert min(drawn["sliding_window"], drawn["mamba"]) > 100, drawn


@pytest.mark.usefixtures("every_load")
def test_sglang_python_tree_core_answers_as_its_rust_one(monkeypatch: pytest.MonkeyPatch) -> None:
    messages = [q.to_json() for q in random_queries(7, 80, shape=QueryShape.SGLANG_HICACHE)]
    rust = [sglang_hicache_target(m) for m in messages]
    monkeypatch.setattr(adapter, "TREE_CORE", "python")
    assert (
        [sglang_hicache_target(m) for m in messages] == rust == [model_target(m) for m in messages]
    )


@pytest.mark.usefixtures("every_load")
@pytest.mark.parametrize(
    ("groups", "rows", "host", "m", "length"),
    [
        # the device holds block 0, the host blocks 1 … 3 and the Mamba state at 4
        ([FULL1, MAMBA1], ["1", "0"], {"0": "1111", "1": "0001"}, 4, 4),
        # the window's KV before 3 is on the host only: loaded back with its full KV
        ([FULL1, window(3)], ["1", "1"], {"0": "111", "1": "011"}, 3, 3),
        # the host's window KV misses block 2: the hit stops where the window holds
        ([FULL1, window(2)], ["11", "11"], {"0": "111", "1": "000"}, 3, 2),
        # the host's state at 3 is gone: the device's state at 1 is the hit
        ([FULL1, MAMBA1], ["1", "1"], {"0": "1111", "1": "0001"}, 3, 1),
    ],
)
def test_a_hit_served_from_the_host(
    groups: list[dict[str, Any]], rows: list[str], host: dict[str, str], m: int, length: int
) -> None:
    q = tiered(groups, rows, host, m)
    answer = sglang_hicache_target(q)
    assert answer == model_target(q) and answer["length"] == length


def test_finding_5_a_short_host_hit_with_full_kv_alone_is_recomputed() -> None:
    """SGLang loads a host hit back only from 10 full tokens on, unless window or Mamba
    KV comes with it (``load_back_threshold``): one host token is recomputed."""
    full_only = tiered([FULL1], ["1"], {"0": "11"}, 2)
    assert model_target(full_only)["length"] == 2
    assert sglang_hicache_target(full_only) == {"length": 1, "blocks": [[0]]}
    with_window = tiered([FULL1, window(2)], ["1", "1"], {"0": "11", "1": "11"}, 2)
    assert sglang_hicache_target(with_window) == model_target(with_window)
    assert model_target(with_window)["length"] == 2


@pytest.mark.usefixtures("every_load")
def test_finding_5_with_the_threshold_at_zero_the_short_hit_is_served() -> None:
    full_only = tiered([FULL1], ["1"], {"0": "11"}, 2)
    assert (
        sglang_hicache_target(full_only)
        == model_target(full_only)
        == {
            "length": 2,
            "blocks": [[0, 1]],
        }
    )


@pytest.mark.parametrize(
    ("groups", "rows", "host", "reason"),
    [
        ([FULL1], ["101"], {"0": "010"}, "a prefix of the tree"),
        ([FULL1, window(2)], ["1", "11"], {"0": "11"}, "holds nothing on the device"),
        ([FULL1, window(2)], ["11", "01"], {"0": "11", "1": "10"}, "host alone"),
        ([FULL1, MAMBA1], ["11", "01"], {"0": "11", "1": "10"}, "host alone"),
    ],
)
def test_states_the_tree_cannot_hold_are_declared_and_unsupported(
    groups: list[dict[str, Any]], rows: list[str], host: dict[str, str], reason: str
) -> None:
    q = tiered(groups, rows, host, 2)
    assert reason in (sglang_hicache_target.capabilities.refusal(parse_query(q)) or "")
    with pytest.raises(Unsupported, match=reason):
        sglang_hicache_target(q)


def test_one_host_tier_only() -> None:
    q = tiered([FULL1], ["1"], {"0": "11"}, 2)
    q["tiers"].append({"name": "remote", "holds": ["full"], "cached": {"0": [True]}})
    assert "one host tier" in (sglang_hicache_target.capabilities.refusal(parse_query(q)) or "")
    with pytest.raises(Unsupported, match="one host tier"):
        sglang_hicache_target(q)


def test_a_query_without_tiers_is_the_device_alone() -> None:
    q = parse_query({"groups": [FULL1, MAMBA1], "cached": ["11", "11"], "max_length": 2})
    assert sglang_hicache_target(q.to_json()) == model_target(q.to_json())


@pytest.mark.usefixtures("every_load")
def test_a_load_back_that_copies_other_tokens_kv_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """What SGLang restores is checked token by token: a host-to-device copy that reads
    the host slots in reverse gives token 1 the KV of token 3."""
    copy = hicache.mha_host.transfer_kv_per_layer_direct_pf_lf

    def reversed_copy(src_ptrs, dst_ptrs, src_indices, dst_indices, layer_id, page_size):  # type: ignore[no-untyped-def]
        copy(src_ptrs, dst_ptrs, src_indices.flip(0), dst_indices, layer_id, page_size)

    q = tiered([FULL1, MAMBA1], ["1", "0"], {"0": "1111", "1": "0001"}, 4)
    assert sglang_hicache_target(q) == model_target(q)
    monkeypatch.setattr(hicache.mha_host, "transfer_kv_per_layer_direct_pf_lf", reversed_copy)
    with pytest.raises(hicache.WrongRestore, match="full KV of token 1 from elsewhere"):
        sglang_hicache_target(q)


@pytest.mark.parametrize("page", [1, 2])
def test_the_cpu_copies_round_trip_device_rows_through_host_pages(page: int) -> None:
    """The ``direct`` copies given where SGLang binds none: two layers of K and V
    (device slot-first) to host pages (page, layer, slot in page) and back."""
    layers = [torch.arange(8 * 3, dtype=torch.float32).reshape(8, 3) + 100 * i for i in range(4)]
    host = [torch.zeros(4, 2, page, 3) for _ in range(2)]  # K's (layers 0, 1), V's (2, 3)
    device, slots, fresh = torch.tensor([5, 1, 6]), torch.tensor([2, 0, 3]), torch.tensor([0, 1, 2])
    transfer_kv_all_layer_direct_lf_pf(layers, host, device, slots, page)
    back = [torch.zeros(8, 3) for _ in range(4)]
    for layer in range(2):
        pair = [back[layer], back[2 + layer]]
        transfer_kv_per_layer_direct_pf_lf(host, pair, slots, fresh, layer, page)
    assert all(torch.equal(b[fresh], x[device]) for b, x in zip(back, layers))
    slot_first = [torch.zeros(8, 3) for _ in range(4)]
    transfer_kv_direct(layers, slot_first, device, fresh, page)
    assert all(torch.equal(s[fresh], x[device]) for s, x in zip(slot_first, layers))
