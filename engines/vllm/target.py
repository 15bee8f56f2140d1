"""The ``vllm`` target: the installed vLLM's own prefix-cache coordinator.

For each query this builds vLLM's KV cache config (one ``KVCacheGroupSpec`` per
protocol group), gets the coordinator through ``get_kv_cache_coordinator``, marks in
its block pool exactly the queried blocks as cached (under the chained block hashes
vLLM computes for a request of ``num_tokens`` tokens), and asks
``find_longest_cache_hit``. Nothing of vLLM is copied here; only its API is called.

It runs, unchanged, against every vLLM release from 0.14.0 to 0.34.0: what differs
between releases is detected by :mod:`kvhit.engines.vllm.release`, and a query a
release cannot be asked is refused before vLLM is called.

How the protocol maps onto vLLM (docs/design.md §1, against vLLM 0.34):

- ``alignment`` A is vLLM's ``scheduler_block_size`` (before 0.23 vLLM aligns to the
  lcm of the block sizes, so only that A is asked); the hash block size is the gcd
  of the block sizes (vLLM's own choice for several groups), so it divides each.
- vLLM's fine-grained "partial hash hits" (hits on hash boundaries inside a mamba
  block, 0.30+) are turned off, so every hit is a multiple of A as the spec asks.
- Token ids are the positions 0 … T-1: any request of T tokens whose blocks are all
  distinct would do, since the cache is keyed by chained hashes.
- Only whole blocks of the request have hashes: a cached bit past block
  ⌊T/b⌋ - 1 cannot be marked (the spec never needs it either).
- a sliding window is given to vLLM as the inclusive window that needs the same KV
  (vLLM's ``sliding_window`` counts the token itself): an exclusive window w is
  ``sliding_window=w+1`` (:func:`kvhit.model.spec.inclusive_window`).
- ``eagle`` groups get vLLM's ``is_eagle_group`` flag and the coordinator is built
  with ``use_eagle`` when any group has it; drafter specs carry ``is_draft`` (where
  the release has these fields; before 0.20 eagle is all groups or none).
- A single group goes to vLLM's unitary coordinator, which aligns hits to the
  group's block size; vLLM only ever builds it with A = b, so other A are refused.
- vLLM refuses some configurations outright (its own asserts, e.g. chunked local
  attention with mixed block sizes): the adapter knows them from the configuration
  (:func:`kvhit.engines.vllm.release.refusal`) and raises
  :class:`kvhit.errors.Unsupported` before calling vLLM. Any other assert or error
  inside vLLM is left to surface as a ``crash``.

    >>> vllm_target({"groups": [{"kind": "full", "block_size": 2, "eagle": False}],
    ...              "cached": [[True, True, False]], "max_length": 5,
    ...              "num_tokens": 6, "alignment": 2})
    {'length': 4, 'blocks': [[0, 1]]}
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import reduce
from math import gcd
from types import SimpleNamespace
from typing import Any

import torch

from kvhit.engines.vllm.release import detect, import_failure, refusal
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Kind, Query, inclusive_window

try:
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
except ImportError as err:
    raise import_failure(err) from None

RELEASE = detect()
kv_cache_utils.init_none_hash(sha256)

# Tiny shapes: the lookup never touches KV memory, only the specs' kinds and sizes.
ATTENTION = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
MAMBA_STATE = {"shapes": ((1, 8),), "dtypes": (torch.float32,)}


@dataclass(frozen=True)
class Lookup:
    """vLLM's outputs of one ``find_longest_cache_hit`` (the uncached common prefix
    only from 0.26 on; None before)."""

    length: int
    blocks: list[list[int]]
    uncached_common_prefix: int | None


def draft_flag(g: Group) -> dict[str, bool]:
    """The spec's ``is_draft`` keyword, where the release has it."""
    return {"is_draft": g.eagle} if RELEASE.draft_flag else {}


def full_spec(g: Group) -> KVCacheSpec:
    """A full attention group's spec (a drafter's spec is flagged)."""
    return FullAttentionSpec(block_size=g.block_size, **ATTENTION, **draft_flag(g))


def sliding_window_spec(g: Group) -> KVCacheSpec:
    """A sliding window group's spec, its window inclusive (a drafter's is flagged)."""
    return SlidingWindowSpec(
        block_size=g.block_size, sliding_window=inclusive_window(g), **ATTENTION, **draft_flag(g)
    )


def chunked_local_spec(g: Group) -> KVCacheSpec:
    """A chunked local attention group's spec."""
    return ChunkedLocalAttentionSpec(
        block_size=g.block_size, attention_chunk_size=g.chunk, **ATTENTION
    )


def mamba_spec(g: Group) -> KVCacheSpec:
    """A Mamba group's spec, its states cached at block boundaries."""
    mode = {"mamba_cache_mode": "align"} if RELEASE.mamba_cache_mode else {}
    return MambaSpec(block_size=g.block_size, **MAMBA_STATE, **mode)


SPECS: dict[Kind, Callable[[Group], KVCacheSpec]] = {
    Kind.FULL: full_spec,
    Kind.SLIDING_WINDOW: sliding_window_spec,
    Kind.CHUNKED_LOCAL: chunked_local_spec,
    Kind.MAMBA: mamba_spec,
}
"""Each kind's vLLM KV cache spec; the kinds a drafter can have
(:data:`kvhit.model.spec.EAGLE_KINDS`) carry ``is_draft``."""


def group_spec(g: Group) -> KVCacheSpec:
    """vLLM's KV cache spec for one protocol group."""
    return SPECS[g.kind](g)


def hash_block_size(q: Query) -> int:
    """The hash granularity: the gcd of the block sizes (divides every one)."""
    return reduce(gcd, (g.block_size for g in q.groups))


def pool_size(q: Query) -> int:
    """Enough blocks for every cached bit, plus vLLM's null block."""
    return sum(sum(row) for row in q.cached) + 1


def kv_cache_config(q: Query) -> KVCacheConfig:
    """The KV cache config: one group per protocol group, eagle groups flagged."""
    groups = [
        KVCacheGroupSpec([f"layer.{i}"], group_spec(g), **eagle_flag(g))
        for i, g in enumerate(q.groups)
    ]
    return KVCacheConfig(num_blocks=pool_size(q), kv_cache_tensors=[], kv_cache_groups=groups)


def eagle_flag(g: Group) -> dict[str, bool]:
    """The group's ``is_eagle_group`` keyword, where the release has it."""
    return {"is_eagle_group": g.eagle} if RELEASE.group_eagle_flag else {}


def coordinator_options(q: Query) -> dict[str, Any]:
    """The keywords of ``get_kv_cache_coordinator`` this release takes, for query ``q``."""
    options: dict[str, Any] = {
        "max_model_len": q.num_tokens,
        "use_eagle": any(g.eagle for g in q.groups),
        "enable_caching": True,
        "enable_kv_cache_events": False,
        "dcp_world_size": 1,
        "pcp_world_size": 1,
        "hash_block_size": hash_block_size(q),
        "scheduler_block_size": q.alignment,
        "allow_partial_hash_hits": False,
    }
    if RELEASE.token_budget_param:
        options[RELEASE.token_budget_param] = q.num_tokens
    return {k: v for k, v in options.items() if k in RELEASE.coordinator_params}


def build_coordinator(q: Query) -> KVCacheCoordinator:
    """vLLM's coordinator for the query's groups, as the engine would build it;
    :class:`Unsupported` if this release cannot be asked the query."""
    reason = refusal(q, RELEASE)
    if reason is not None:
        raise Unsupported(reason)
    return get_kv_cache_coordinator(kv_cache_config(q), **coordinator_options(q))


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
    """vLLM's coordinator holding the query's cache state, and the request's hashes."""
    coordinator = build_coordinator(q)
    hashes = request_hashes(q.num_tokens, coordinator.block_pool.hash_block_size)
    mark_cached(coordinator, q, hashes)
    return coordinator, hashes


def lookup(q: Query) -> Lookup:
    """Run vLLM's ``find_longest_cache_hit`` on the query's cache state.

    Configurations the release refuses raise :class:`Unsupported` before the call;
    anything vLLM raises during it (its asserts included) surfaces as a crash.
    """
    coordinator, hashes = prepare(q)
    blocks, length, *uncached = coordinator.find_longest_cache_hit(hashes, q.max_length)
    reused = [[j for j, block in enumerate(group) if not block.is_null] for group in blocks]
    return Lookup(length, reused, uncached[0] if uncached else None)


def vllm_target(query: dict[str, Any]) -> dict[str, Any]:
    """The ``vllm`` target: vLLM's hit length and each group's non-null block indices."""
    found = lookup(parse_query(query))
    return {"length": found.length, "blocks": found.blocks}
