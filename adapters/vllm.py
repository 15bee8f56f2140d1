"""The ``vllm`` target: the installed vLLM's own prefix-cache coordinator.

For each query this builds vLLM's KV cache config (one ``KVCacheGroupSpec`` per
protocol group), gets the coordinator through ``get_kv_cache_coordinator``, marks in
its block pool exactly the queried blocks as cached (under the chained block hashes
vLLM computes for a request of ``num_tokens`` tokens), and asks
``find_longest_cache_hit``. Nothing of vLLM is copied here; only its API is called.

How the protocol maps onto vLLM (docs/design.md §1 against vLLM 0.34):

- ``alignment`` A is vLLM's ``scheduler_block_size``; the hash block size is the gcd
  of the block sizes (vLLM's own choice for several groups), so it divides each.
- vLLM's fine-grained "partial hash hits" (hits on hash boundaries inside a mamba
  block) are turned off, so every hit is a multiple of A as the spec asks.
- Token ids are the positions 0 … T-1: any request of T tokens whose blocks are all
  distinct would do, since the cache is keyed by chained hashes.
- Only whole blocks of the request have hashes: a cached bit past block
  ⌊T/b⌋ - 1 cannot be marked (the spec never needs it either).
- ``eagle`` groups get vLLM's ``is_eagle_group`` flag and the coordinator is built
  with ``use_eagle`` when any group has it; drafter specs carry ``is_draft``.
- A single group goes to vLLM's unitary coordinator, which aligns hits to the
  group's block size; vLLM only ever builds it with A = b, so other A are refused.
- vLLM refuses some configurations outright (its own asserts and errors while
  building the coordinator or during the lookup, e.g. chunked local attention with
  mixed block sizes): they raise :class:`kvhit.targets.Unsupported`.

    >>> vllm_target({"groups": [{"kind": "full", "block_size": 2, "eagle": False}],
    ...              "cached": [[True, True, False]], "max_length": 5,
    ...              "num_tokens": 6, "alignment": 2})
    {'length': 4, 'blocks': [[0, 1]]}
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import reduce
from math import gcd
from types import SimpleNamespace
from typing import Any

import torch
from vllm.utils.hashing import sha256
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_coordinator import KVCacheCoordinator, get_kv_cache_coordinator
from vllm.v1.core.kv_cache_utils import BlockHash, hash_block_tokens
from vllm.v1.kv_cache_interface import (
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    KVCacheSpec,
    MambaSpec,
    SlidingWindowSpec,
)

from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Query

kv_cache_utils.init_none_hash(sha256)

# Tiny shapes: the lookup never touches KV memory, only the specs' kinds and sizes.
ATTENTION = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
MAMBA_STATE = {"shapes": ((1, 8),), "dtypes": (torch.float32,)}


@dataclass(frozen=True)
class Lookup:
    """vLLM's three outputs of one ``find_longest_cache_hit``."""

    length: int
    blocks: list[list[int]]
    uncached_common_prefix: int


def group_spec(g: Group) -> KVCacheSpec:
    """vLLM's KV cache spec for one protocol group."""
    draft = {"is_draft": g.eagle}
    if g.kind == "full":
        return FullAttentionSpec(block_size=g.block_size, **ATTENTION, **draft)
    if g.kind == "sliding_window":
        return SlidingWindowSpec(
            block_size=g.block_size, sliding_window=g.window, **ATTENTION, **draft
        )
    if g.kind == "chunked_local":
        return ChunkedLocalAttentionSpec(
            block_size=g.block_size, attention_chunk_size=g.chunk, **ATTENTION
        )
    return MambaSpec(block_size=g.block_size, mamba_cache_mode="align", **MAMBA_STATE)


def hash_block_size(q: Query) -> int:
    """The hash granularity: the gcd of the block sizes (divides every one)."""
    return reduce(gcd, (g.block_size for g in q.groups))


def pool_size(q: Query) -> int:
    """Enough blocks for every cached bit, plus vLLM's null block."""
    return sum(sum(row) for row in q.cached) + 1


def kv_cache_config(q: Query) -> KVCacheConfig:
    """The KV cache config: one group per protocol group, eagle groups flagged."""
    groups = [
        KVCacheGroupSpec([f"layer.{i}"], group_spec(g), is_eagle_group=g.eagle)
        for i, g in enumerate(q.groups)
    ]
    return KVCacheConfig(num_blocks=pool_size(q), kv_cache_tensors=[], kv_cache_groups=groups)


def build_coordinator(q: Query) -> KVCacheCoordinator:
    """vLLM's coordinator for the query's groups, as the engine would build it."""
    if len(q.groups) == 1 and q.alignment != q.groups[0].block_size:
        raise Unsupported(
            "vLLM aligns a single group's hits to its block size (scheduler block size = b)"
        )
    return get_kv_cache_coordinator(
        kv_cache_config(q),
        max_model_len=q.num_tokens,
        max_in_flight_tokens=q.num_tokens,
        use_eagle=any(g.eagle for g in q.groups),
        enable_caching=True,
        enable_kv_cache_events=False,
        dcp_world_size=1,
        pcp_world_size=1,
        scheduler_block_size=q.alignment,
        hash_block_size=hash_block_size(q),
        allow_partial_hash_hits=False,
    )


def request_hashes(num_tokens: int, block_size: int) -> list[BlockHash]:
    """The chained block hashes of a request of tokens 0 … num_tokens-1.

    >>> len(request_hashes(10, 4))  # only whole blocks are hashed
    2
    """
    hashes: list[BlockHash] = []
    for start in range(0, num_tokens - block_size + 1, block_size):
        parent = hashes[-1] if hashes else None
        hashes.append(hash_block_tokens(sha256, parent, range(start, start + block_size)))
    return hashes


def mark_cached(coordinator: KVCacheCoordinator, q: Query, hashes: list[BlockHash]) -> None:
    """Put exactly the query's cached blocks into the coordinator's block pool."""
    pool = coordinator.block_pool
    request = SimpleNamespace(block_hashes=hashes)
    whole = len(hashes) * pool.hash_block_size
    for group_id, (g, row) in enumerate(zip(q.groups, q.cached)):
        bits = row[: whole // g.block_size]
        fresh = iter(pool.get_new_blocks(sum(bits)))
        blocks = [next(fresh) if bit else pool.null_block for bit in bits]
        pool.cache_full_blocks(request, blocks, 0, len(blocks), g.block_size, group_id)


def prepare(q: Query) -> tuple[KVCacheCoordinator, list[BlockHash]]:
    """vLLM's coordinator holding the query's cache state, and the request's hashes.

    vLLM refuses some configurations while building the coordinator (its asserts
    and errors): they raise :class:`Unsupported`.
    """
    try:
        coordinator = build_coordinator(q)
    except (AssertionError, ValueError) as err:
        raise Unsupported(f"vLLM refuses this configuration: {err}") from err
    hashes = request_hashes(q.num_tokens, coordinator.block_pool.hash_block_size)
    mark_cached(coordinator, q, hashes)
    return coordinator, hashes


def lookup(q: Query) -> Lookup:
    """Run vLLM's ``find_longest_cache_hit`` on the query's cache state.

    Some refusals come from asserts in the lookup itself (chunked local attention
    with a block size other than the alignment): they raise :class:`Unsupported`
    too. Anything else that goes wrong is left to surface as a crash.
    """
    coordinator, hashes = prepare(q)
    try:
        blocks, length, uncached = coordinator.find_longest_cache_hit(hashes, q.max_length)
    except AssertionError as err:
        raise Unsupported(f"vLLM refuses this configuration: {err}") from err
    reused = [[j for j, block in enumerate(group) if not block.is_null] for group in blocks]
    return Lookup(length, reused, uncached)


def vllm_target(query: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm`` target: vLLM's hit length and each group's non-null block indices."""
    found = lookup(parse_query(query))
    return {"length": found.length, "blocks": found.blocks}
