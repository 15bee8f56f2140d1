"""The stateful ``vllm`` target: vLLM's own ``KVCacheManager`` serving a program.

The stateless ``vllm`` target (:mod:`kvhit.engines.vllm.target`) asks vLLM's coordinator
for one lookup on a cache state kvhit builds. This one lets vLLM build its cache
state itself: it creates a ``KVCacheManager`` for the program's groups and drives it
on CPU through the calls vLLM's scheduler makes, so that allocation, caching,
freeing, eviction and sliding-window drops are all vLLM's own
(the stateful protocol: :mod:`kvhit.targets.stateful`).

``admit(r, tokens)`` does what the scheduler does for a new prompt that fits:

1. a ``Request`` of these tokens, with vLLM's own block hasher;
2. ``get_computed_blocks``: the prefix hit (at most T - 1 tokens) and its blocks;
3. ``allocate_slots(request, T - L, L, blocks, full_sequence_must_fit=True)``, which
   also caches the request's full blocks; ``None`` means the pool cannot hold it
   (answered as ``rejected``);
4. the block tables (``get_block_ids``) are reported as they stand for the prefill,
   then ``remove_skipped_blocks`` drops the blocks that left a window, as the next
   step's allocation would.

``finish`` is ``free``. ``snapshot`` looks each full block's hash up in vLLM's block
pool (``get_cached_block``), group by group.

How the configuration maps onto vLLM (docs/design.md §1 against vLLM 0.34):

- ``num_blocks`` N usable blocks: vLLM's pool gets N + 1, block 0 being its null block
  (reported as ``null`` in the tables);
- the alignment A is vLLM's ``scheduler_block_size``, the hash block size the gcd of
  the block sizes, as vLLM picks them (:mod:`kvhit.engines.vllm.target`);
- vLLM refuses some configurations while building the manager or in its first
  lookup; those are
  ``unsupported``, and so are two that vLLM would serve outside the protocol: a single
  group with A ≠ b (vLLM's unitary coordinator aligns to b), and a manager whose
  coordinator turned on "partial hash hits" (hits inside a mamba block larger than
  the hash block; the manager's constructor cannot turn them off).

    >>> engine = VllmManagerEngine({"groups": [{"kind": "full", "block_size": 2}],
    ...                             "num_blocks": 6, "alignment": 2})
    >>> engine.admit(0, [1, 2, 3])
    {'length': 0, 'reused': [[]], 'tables': [[1, 2]]}
    >>> engine.snapshot([1, 2, 4])
    {'cached': [[True]]}
    >>> engine.admit(1, [1, 2, 4])
    {'length': 2, 'reused': [[1]], 'tables': [[1, 3]]}
    >>> engine.finish(0)
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import reduce
from math import gcd
from typing import Any

from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_manager import KVCacheManager
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, resolve_block_hashes
from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
from vllm.v1.request import Request

from kvhit.engines.vllm.target import group_spec  # also sets vLLM's hash seed
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_group
from kvhit.model.spec import default_alignment

MAX_MODEL_LEN = 4096  # longer prompts are rejected


class VllmManagerEngine:
    """vLLM's ``KVCacheManager`` behind the stateful protocol (see the module docstring)."""

    def __init__(self, config: dict[str, Any]):
        self.groups = tuple(parse_group(g, f"groups[{i}]") for i, g in enumerate(config["groups"]))
        alignment = config.get("alignment") or default_alignment(self.groups)
        self.hash_block_size = reduce(gcd, (g.block_size for g in self.groups))
        if len(self.groups) == 1 and alignment != self.groups[0].block_size:
            raise Unsupported(
                "vLLM aligns a single group's hits to its block size (scheduler block size = b)"
            )
        specs = [
            KVCacheGroupSpec([f"layer.{i}"], group_spec(g), is_eagle_group=g.eagle)
            for i, g in enumerate(self.groups)
        ]
        pool = KVCacheConfig(
            num_blocks=config["num_blocks"] + 1, kv_cache_tensors=[], kv_cache_groups=specs
        )
        try:
            self.manager = KVCacheManager(
                pool,
                max_model_len=MAX_MODEL_LEN,
                scheduler_block_size=alignment,
                hash_block_size=self.hash_block_size,
                enable_caching=True,
                use_eagle=any(g.eagle for g in self.groups),
            )
        except (AssertionError, ValueError) as err:
            raise Unsupported(f"vLLM refuses this configuration: {err}") from err
        if self.manager.coordinator.enable_partial_hash_hits:
            raise Unsupported(
                "vLLM lands hits inside a mamba block here (partial hash hits), "
                "which the protocol does not model"
            )
        self.hasher = get_request_block_hasher(self.hash_block_size, sha256)
        self.requests: dict[int, Request] = {}
        self.probe(alignment)

    def probe(self, alignment: int) -> None:
        """Some refusals are asserts in vLLM's lookup itself (chunked local attention
        with mixed block sizes): one lookup that changes nothing, ``Unsupported`` if
        vLLM refuses it."""
        try:
            self.manager.get_num_cached_tokens(self.request("probe", [0] * (2 * alignment + 1)))
        except AssertionError as err:
            raise Unsupported(f"vLLM refuses this configuration: {err}") from err

    def request(self, request_id: str, tokens: Sequence[int]) -> Request:
        """A vLLM request of these tokens, its block hashes computed by vLLM."""
        params = SamplingParams(max_tokens=1)
        return Request(request_id, list(tokens), params, None, block_hasher=self.hasher)

    def snapshot(self, tokens: Sequence[int]) -> dict[str, Any]:
        """Which full blocks of ``tokens`` vLLM's block pool finds cached, per group."""
        hashes = self.request("snapshot", tokens).block_hashes
        pool = self.manager.block_pool
        cached = []
        for group_id, g in enumerate(self.groups):
            view = resolve_block_hashes(hashes, self.hash_block_size, g.block_size)
            row = [pool.get_cached_block(view[j], [group_id]) is not None for j in range(len(view))]
            cached.append(row)
        return {"cached": cached}

    def admit(self, request: int, tokens: Sequence[int]) -> dict[str, Any]:
        """Look up, allocate and cache as vLLM's scheduler does; then drop the blocks
        that left a window. ``rejected`` when the pool cannot hold the request."""
        if len(tokens) > MAX_MODEL_LEN:
            return {"rejected": f"longer than max_model_len ({MAX_MODEL_LEN})"}
        req = self.request(str(request), tokens)
        hit, length, _ = self.manager.get_computed_blocks(req)
        allocated = self.manager.allocate_slots(
            req, len(tokens) - length, length, hit, full_sequence_must_fit=True
        )
        if allocated is None:
            return {"rejected": "vLLM's allocate_slots found too few free blocks"}
        null = self.manager.block_pool.null_block.block_id
        tables = [
            [None if b == null else b for b in t] for t in self.manager.get_block_ids(str(request))
        ]
        reused = [[b for b in ids if b != null] for ids in hit.get_block_ids()]
        req.num_computed_tokens = len(tokens)
        self.manager.remove_skipped_blocks(req.request_id, len(tokens))
        self.requests[request] = req
        return {"length": length, "reused": reused, "tables": tables}

    def finish(self, request: int) -> None:
        """Free the request's blocks (they stay cached until evicted)."""
        self.manager.free(self.requests.pop(request))
