"""vLLM's find_longest_cache_hit on one cache state, against the longest valid hit.

The request has T=5 tokens, ids 0 … 4; a hit is at most M=4 tokens and a multiple of
A=4. One row per KV cache group, one cell per block: # cached, . not, @ reused by the
correct hit.

    query: M=4 A=4
    group 0  mamba b=4 lookahead=4   #

The correct hit (kvhit's spec, computed by `kvhit export`): L* = 0.

kvhit documents this state's class (kvhit.engines.vllm.divergences):
- with lookahead hashes, a lookup bounded by M reads past the request's hashes (crash;
  vLLM 0.33.0 … 0.34.0)
- with lookahead hashes, a chunk start at M is a hit past the request's hashes (unsafe;
  vLLM 0.33.0 … 0.34.0)

Exported by `kvhit export example-lookahead.json`; kvhit's `vllm` target asks vLLM this
query the same way (kvhit.engines.vllm.target).
"""

from __future__ import annotations

import inspect

import pytest
import torch

try:
    import vllm
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_coordinator
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.kv_cache_interface import (
        KVCacheConfig,
        KVCacheGroupSpec,
        MambaSpec,
    )
    from vllm.v1.request import Request
except ImportError as err:
    pytest.skip(f"vLLM's prefix-cache code cannot be imported: {err}", allow_module_level=True)

ALIGNMENT = 4  # A: a hit is a multiple of it
HASH_BLOCK_SIZE = 4
SCHEDULER_BLOCK_SIZE = 4
LOOKAHEAD_TOKENS = 4  # num_hash_lookahead_tokens
NUM_TOKENS = 5  # T: the request is tokens 0 … T-1
MAX_LENGTH = 4  # M: the longest hit asked for (vLLM's max_cache_hit_length)
NUM_BLOCKS = 2  # enough for the cached blocks, and vLLM's null block
CACHED = [[]]  # per group: the whole blocks in vLLM's prefix cache
PARTIAL = {}  # per group: the fine boundary of a partially filled block
# The correct answer, computed by `kvhit export` (kvhit.model.spec.longest_hit, the
# spec, on this state): the longest valid hit L* and the blocks each group reuses there.
EXPECTED_LENGTH = 0
EXPECTED_BLOCKS = [[]]

ATTENTION = {"num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
MAMBA_STATE = {"shapes": ((1, 8),), "dtypes": (torch.float32,)}
init_none_hash(sha256)  # the seed of every request's hashes: once, as vLLM's tests do


def accepted(func, **options):
    """The keyword options that `func` takes in the installed vLLM (releases differ)."""
    params = inspect.signature(func).parameters
    return {name: value for name, value in options.items() if name in params}


COORDINATOR_PARAMS = inspect.signature(kv_cache_coordinator.get_kv_cache_coordinator).parameters
# What this query needs of vLLM's API (a release without it cannot be asked the query)
NEEDED = [
    ("hash_block_size" in COORDINATOR_PARAMS, "get_kv_cache_coordinator takes no hash_block_size (0.14.0 and later)"),
    ("num_hash_lookahead_tokens" in COORDINATOR_PARAMS, "no lookahead block hashes (num_hash_lookahead_tokens, 0.33.0 and later)"),
]
MISSING = "; ".join(why for present, why in NEEDED if not present)
if MISSING:
    pytest.skip(f"vLLM {vllm.__version__} cannot be asked this query: {MISSING}", allow_module_level=True)


def kv_cache_groups():
    """One KV cache group per row of the drawing."""
    return [
        KVCacheGroupSpec(["layer.0"], MambaSpec(block_size=4, **MAMBA_STATE, **accepted(MambaSpec, mamba_cache_mode="align"), **accepted(MambaSpec, is_draft=True)), **accepted(KVCacheGroupSpec, is_eagle_group=True)),  # mamba b=4 lookahead=4
    ]


def request(request_id, tokens):
    """A request of these tokens, its block hashes computed by vLLM's own hasher."""
    hasher = get_request_block_hasher(
        HASH_BLOCK_SIZE, sha256, **accepted(get_request_block_hasher, num_hash_lookahead_tokens=LOOKAHEAD_TOKENS)
    )
    options = accepted(Request, pooling_params=None, eos_token_id=None, block_hasher=hasher)
    return Request(request_id, list(tokens), SamplingParams(max_tokens=1), **options)


def put_in_cache(pool, req, group_id, block_size):
    """Cache group `group_id`'s blocks of CACHED and PARTIAL under the request's hashes,
    as vLLM caches a request's blocks (a null block in between is skipped)."""
    cached = CACHED[group_id]
    fresh = iter(pool.get_new_blocks(len(cached)))
    blocks = [next(fresh) if j in cached else pool.null_block for j in range(max(cached, default=-1) + 1)]
    pool.cache_full_blocks(req, blocks, 0, len(blocks), block_size, group_id)
    if group_id in PARTIAL:
        (block,) = pool.get_new_blocks(1)
        pool.cache_partial_block(req, block, PARTIAL[group_id], group_id, block_size)


def test_find_longest_cache_hit_is_the_longest_valid_hit():
    config = KVCacheConfig(num_blocks=NUM_BLOCKS, kv_cache_tensors=[], kv_cache_groups=kv_cache_groups())
    options = dict(
        max_model_len=5,
        max_in_flight_tokens=5,
        max_num_batched_tokens=5,
        use_eagle=False,
        enable_caching=True,
        enable_kv_cache_events=False,
        dcp_world_size=1,
        pcp_world_size=1,
        hash_block_size=4,
        scheduler_block_size=4,
        num_hash_lookahead_tokens=4,
        num_prefill_lookahead=4,
        allow_partial_hash_hits=False,
    )
    get_coordinator = kv_cache_coordinator.get_kv_cache_coordinator
    try:
        coordinator = get_coordinator(config, **accepted(get_coordinator, **options))
    except ValueError as err:  # vLLM's own checks of a configuration
        pytest.skip(f"vLLM {vllm.__version__} refuses this configuration: {err}")
    # With partial hash hits on, vLLM lands hits on hash units, else on the scheduler
    # block size; the query is asked only where that is A.
    partial = bool(getattr(coordinator, "enable_partial_hash_hits", False))
    if (HASH_BLOCK_SIZE if partial else SCHEDULER_BLOCK_SIZE) != ALIGNMENT:
        pytest.skip(f"vLLM {vllm.__version__} aligns these hits elsewhere (partial hash hits: {partial})")
    req = request("0", range(NUM_TOKENS))
    for group_id, group in enumerate(config.kv_cache_groups):
        put_in_cache(coordinator.block_pool, req, group_id, group.kv_cache_spec.block_size)

    blocks, length, *_ = coordinator.find_longest_cache_hit(req.block_hashes, MAX_LENGTH)

    reused = [[j for j, block in enumerate(group) if not block.is_null] for group in blocks]
    assert (length, reused) == (EXPECTED_LENGTH, EXPECTED_BLOCKS), (
        f"vLLM {vllm.__version__} reuses {length} tokens, blocks {reused}; the longest "
        f"valid hit is {EXPECTED_LENGTH} tokens, blocks {EXPECTED_BLOCKS}"
    )
