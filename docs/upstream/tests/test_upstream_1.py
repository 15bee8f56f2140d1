"""vLLM's find_longest_cache_hit on one cache state, against the longest valid hit.

The request has T=4 tokens, ids 0 … 3; a hit is at most M=3 tokens and a multiple of
A=1. One row per KV cache group, one cell per block: # cached, . not, @ reused by the
correct hit.

    query: M=3 A=1
    group 0  sliding_window w=2 b=1 eagle   # . # #
    group 1  sliding_window w=3 b=1 eagle   # # . .

The correct hit (kvhit's spec, computed by `kvhit export`): L* = 0.

kvhit documents this state's class (kvhit.engines.vllm.divergences):
- eagle drop not re-checked after another eagle group lowers the hit (unsafe; vLLM
  0.32.0 … 0.34.0)
- eagle drop not re-checked, at model sizes (windows 128 and 1024, block size 16)
  (unsafe; vLLM 0.20.0 … 0.34.0)
- eagle lookup not widened by the margin, and the drop repeated on every pass (lost
  reuse; vLLM 0.14.0 … 0.19.0)

Exported by `kvhit export example-1.json`; kvhit's `vllm` target asks vLLM this query
the same way (kvhit.engines.vllm.target).
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
        SlidingWindowSpec,
    )
    from vllm.v1.request import Request
except ImportError as err:
    pytest.skip(f"vLLM's prefix-cache code cannot be imported: {err}", allow_module_level=True)

ALIGNMENT = 1  # A: a hit is a multiple of it
HASH_BLOCK_SIZE = 1
SCHEDULER_BLOCK_SIZE = 1
LOOKAHEAD_TOKENS = 0  # num_hash_lookahead_tokens
NUM_TOKENS = 4  # T: the request is tokens 0 … T-1
MAX_LENGTH = 3  # M: the longest hit asked for (vLLM's max_cache_hit_length)
NUM_BLOCKS = 9  # enough for the cached blocks, and vLLM's null block
CACHED = [[0, 2, 3], [0, 1]]  # per group: the whole blocks in vLLM's prefix cache
PARTIAL = {}  # per group: the fine boundary of a partially filled block
# The correct answer, computed by `kvhit export` (kvhit.model.spec.longest_hit, the
# spec, on this state): the longest valid hit L* and the blocks each group reuses there.
EXPECTED_LENGTH = 0
EXPECTED_BLOCKS = [[], []]

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
]
MISSING = "; ".join(why for present, why in NEEDED if not present)
if MISSING:
    pytest.skip(f"vLLM {vllm.__version__} cannot be asked this query: {MISSING}", allow_module_level=True)


def kv_cache_groups():
    """One KV cache group per row of the drawing."""
    return [
        KVCacheGroupSpec(["layer.0"], SlidingWindowSpec(block_size=1, sliding_window=2, **ATTENTION, **accepted(SlidingWindowSpec, is_draft=True)), **accepted(KVCacheGroupSpec, is_eagle_group=True)),  # sliding_window w=2 b=1 eagle
        KVCacheGroupSpec(["layer.1"], SlidingWindowSpec(block_size=1, sliding_window=3, **ATTENTION, **accepted(SlidingWindowSpec, is_draft=True)), **accepted(KVCacheGroupSpec, is_eagle_group=True)),  # sliding_window w=3 b=1 eagle
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
        max_model_len=4,
        max_in_flight_tokens=4,
        max_num_batched_tokens=4,
        use_eagle=True,
        enable_caching=True,
        enable_kv_cache_events=False,
        dcp_world_size=1,
        pcp_world_size=1,
        hash_block_size=1,
        scheduler_block_size=1,
        num_hash_lookahead_tokens=0,
        num_prefill_lookahead=0,
        allow_partial_hash_hits=False,
    )
    get_coordinator = kv_cache_coordinator.get_kv_cache_coordinator
    try:
        coordinator = get_coordinator(config, **accepted(get_coordinator, **options))
    except ValueError as err:  # vLLM's own checks of a configuration
        pytest.skip(f"vLLM {vllm.__version__} refuses this configuration: {err}")
    req = request("0", range(NUM_TOKENS))
    for group_id, group in enumerate(config.kv_cache_groups):
        put_in_cache(coordinator.block_pool, req, group_id, group.kv_cache_spec.block_size)

    blocks, length, *_ = coordinator.find_longest_cache_hit(req.block_hashes, MAX_LENGTH)

    reused = [[j for j, block in enumerate(group) if not block.is_null] for group in blocks]
    assert (length, reused) == (EXPECTED_LENGTH, EXPECTED_BLOCKS), (
        f"vLLM {vllm.__version__} reuses {length} tokens, blocks {reused}; the longest "
        f"valid hit is {EXPECTED_LENGTH} tokens, blocks {EXPECTED_BLOCKS}"
    )
