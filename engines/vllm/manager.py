"""The stateful ``vllm`` target: vLLM's own ``KVCacheManager`` serving a program.

The stateless ``vllm`` target (:mod:`kvhit.engines.vllm.target`) asks vLLM's coordinator
for one lookup on a cache state kvhit builds. This one lets vLLM build its cache
state itself: it creates a ``KVCacheManager`` for the program's groups and drives it
on CPU through the calls vLLM's scheduler makes, so that allocation, caching,
freeing, eviction and sliding-window drops are all vLLM's own
(the stateful protocol: :mod:`kvhit.targets.stateful`).

It runs, unchanged, on every vLLM release from 0.14.0 to 0.34.0: what differs in the
manager's API is passed only where the installed release takes it
(:mod:`kvhit.engines.vllm.compat`), and what a release cannot be asked is refused as
``unsupported``: it declares what it can be driven with
(:func:`kvhit.engines.vllm.release.manager_capabilities`, the stateless target's rules
as vLLM's scheduler asks, and its own).

``admit(r, tokens)`` does what the scheduler does for a new prompt that fits, in a
step of its own (the previous prompts' prefills are done):

1. ``new_step_starts`` (0.17+; Mamba will not reuse a block cached in the same step)
   and a ``Request`` of these tokens, with vLLM's own block hasher;
2. ``get_computed_blocks``: the prefix hit (at most T - 1 tokens) and its blocks;
3. ``allocate_slots(request, T - L, L, blocks)`` (with ``full_sequence_must_fit``
   from 0.21), which also caches the request's full blocks; ``None`` means the pool
   cannot hold it (answered as ``rejected``);
4. the block tables (``get_block_ids``) are reported as they stand for the prefill,
   then ``remove_skipped_blocks`` drops the blocks that left a window, as the next
   step's allocation would.

``finish`` is ``free``. ``snapshot`` looks each block's hash up in vLLM's block pool
(``get_cached_block``), group by group, and, when vLLM's lookup reads them (partial
hash hits on), inside a block not cached whole the hashes of its fine boundaries
(vLLM's partial entries, 0.26+).

How the configuration maps onto vLLM, as vLLM's scheduler builds its manager
(``vllm/v1/core/sched/scheduler.py``, 0.34.0), on vLLM's defaults:

- ``num_blocks`` N usable blocks: vLLM's pool gets N + 1, block 0 being its null block
  (reported as ``null`` in the tables);
- the alignment A is vLLM's ``scheduler_block_size`` (0.23+; before, the lcm of the
  block sizes, the only A asked); the hash block size is the program's hash unit, or
  without one the gcd of the block sizes;
- drafters: a ``drop`` group is an eagle group (``is_eagle_group``, 0.20+; the
  manager is built with ``use_eagle``); a ``none`` drafter drops nothing, as vLLM's
  DFlash and DSpark, so vLLM is configured as without one; ``lookahead`` La is
  vLLM's lookahead block hashes (``num_hash_lookahead_tokens``, 0.33+), which key
  every group, so every group must carry it with one La;
- partial hash hits are vLLM's default wherever it turns them on (a Mamba group in
  ``align`` mode with a block larger than the hash block, 0.26+: hits are then
  multiples of the hash block, while the scheduler block size stays a multiple of
  every block size); the program must then carry that hash unit as its hash unit
  and alignment, else it is ``unsupported``;
- vLLM refuses some configurations while building the manager: those are
  ``unsupported`` too.

    >>> from kvhit.model.spec import Group
    >>> engine = VllmManagerEngine(EngineConfig((Group("full", 2),), num_blocks=6, alignment=2))
    >>> engine.admit(0, [1, 2, 3])
    Admitted(length=0, reused=((),), tables=((1, 2),), outputs_match=None, moves=())
    >>> engine.snapshot([1, 2, 4])
    Snapshot(cached=((True,),), tiers=())
    >>> engine.admit(1, [1, 2, 4])
    Admitted(length=2, reused=((1,),), tables=((1, 3),), outputs_match=None, moves=())
    >>> engine.finish(0)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from functools import reduce
from math import gcd, lcm
from typing import Any

from kvhit.contract import Admitted, EngineConfig, EngineFactory, Rejected, Snapshot
from kvhit.engines.vllm.release import (
    MAX_MODEL_LEN,
    Asker,
    import_failure,
    manager_capabilities,
    shared_lookahead,
)
from kvhit.errors import TargetError, Unsupported
from kvhit.model.spec import Group, Query, Upto

try:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import (
        BlockHash,
        BlockHashListWithBlockSize,
        get_request_block_hasher,
    )
    from vllm.v1.kv_cache_interface import KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.request import Request

    # also sets vLLM's hash seed; RELEASE: what the installed release accepts
    from kvhit.engines.vllm.target import RELEASE, eagle_flag, foreseen, group_spec
except ImportError as err:
    raise import_failure(err) from None

from kvhit.engines.vllm.compat import accepted


def snapshot_row(
    hashes: list[BlockHash],
    block_size: int,
    hash_block_size: int,
    partial_hits: bool,
    cached: Callable[[BlockHash], bool],
) -> tuple[bool | Upto, ...]:
    """A group's row over a request's block ``hashes``: each block whose key
    ``cached`` finds, or (``partial_hits``) a partial entry ``{"upto": p}`` at the
    longest fine boundary p inside the block that it finds, an
    :class:`~kvhit.model.spec.Upto` (vLLM keys a partial entry
    by the hash of the units before its boundary; without partial hits its lookup
    never reads them). Shared by the stateful targets' snapshots."""
    h, b = hash_block_size, block_size
    view = hashes if b == h else BlockHashListWithBlockSize(hashes, h, b)
    per = b // h
    row: list[bool | Upto] = []
    for j in range(-(-len(hashes) // per)):  # every block with a hashed unit
        if j < len(view) and cached(view[j]):
            row.append(True)
            continue
        units = range(1, min(per, len(hashes) - j * per + 1))
        fine = [k for k in units if partial_hits and cached(hashes[j * per + k - 1])]
        row.append(Upto(j * b + fine[-1] * h) if fine else False)
    return tuple(row)


def pool_rows(
    pool: BlockPool, groups: Sequence[Group], hashes: list[BlockHash], partial_hits: bool
) -> tuple[tuple[bool | Upto, ...], ...]:
    """Each group's :func:`snapshot_row` over ``hashes`` in vLLM's block pool ``pool``:
    a key is cached where ``BlockPool.get_cached_block`` finds it for the group. Shared
    by the stateful and step-level vLLM engines' snapshots."""

    def cached(group_id: int) -> Callable[[BlockHash], bool]:
        return lambda key: pool.get_cached_block(key, [group_id]) is not None

    h = pool.hash_block_size
    return tuple(
        snapshot_row(hashes, g.block_size, h, partial_hits, cached(i)) for i, g in enumerate(groups)
    )


def new_request(
    request_id: str, tokens: Sequence[int], hasher: Callable[..., Any], max_tokens: int = 1
) -> Request:
    """vLLM's ``Request`` of these prompt tokens, hashed by ``hasher`` (vLLM's block
    hasher), generating ``max_tokens`` tokens whatever it samples (``ignore_eos``);
    what each release's constructor takes (:mod:`kvhit.engines.vllm.compat`)."""
    options = {"pooling_params": None, "eos_token_id": None, "block_hasher": hasher}
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True)
    return Request(request_id, list(tokens), params, **accepted(Request, options))


class VllmManagerEngine:
    """vLLM's ``KVCacheManager`` as a :class:`~kvhit.contract.StatefulEngine` (see the
    module docstring)."""

    capabilities = manager_capabilities(RELEASE)

    def __init__(self, config: EngineConfig):
        self.groups = config.groups
        alignment = config.alignment
        self.hash_unit = config.hash_unit
        self.hash_block_size = self.hash_unit or reduce(gcd, (g.block_size for g in self.groups))
        shape = Query(self.groups, tuple(() for _ in self.groups), 0, 1, alignment, self.hash_unit)
        reason = self.capabilities.refusal(shape)
        if reason is not None:
            raise Unsupported(reason)
        lookahead = shared_lookahead(self.groups)
        specs = [
            KVCacheGroupSpec([f"layer.{i}"], group_spec(g), **eagle_flag(g, self.groups))
            for i, g in enumerate(self.groups)
        ]
        pool = KVCacheConfig(
            num_blocks=config.num_blocks + 1, kv_cache_tensors=[], kv_cache_groups=specs
        )
        sizes = [g.block_size for g in self.groups]
        # vLLM's scheduler block size is a multiple of every block size (its assert)
        scheduler = alignment if all(alignment % b == 0 for b in sizes) else lcm(*sizes)
        options = {
            "scheduler_block_size": scheduler,
            "use_eagle": any(g.eagle for g in self.groups),
            "num_hash_lookahead_tokens": lookahead,
        }
        try:
            self.manager = KVCacheManager(
                pool,
                max_model_len=MAX_MODEL_LEN,
                hash_block_size=self.hash_block_size,
                enable_caching=True,
                **accepted(KVCacheManager, options),
            )
        except (AssertionError, ValueError) as err:
            raise Unsupported(f"vLLM refuses this configuration: {err}") from err
        foreseen(self.manager.coordinator, shape, Asker(RELEASE))
        self.partial_hits = getattr(self.manager.coordinator, "enable_partial_hash_hits", False)
        hasher_options = {"num_hash_lookahead_tokens": lookahead}
        self.hasher = get_request_block_hasher(
            self.hash_block_size, sha256, **accepted(get_request_block_hasher, hasher_options)
        )
        self.requests: dict[int, Request] = {}

    def request(self, request_id: str, tokens: Sequence[int]) -> Request:
        """A vLLM request of these tokens, its block hashes computed by vLLM."""
        return new_request(request_id, tokens, self.hasher)

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """What vLLM's block pool finds cached for ``tokens``, per group: each full
        block, or with a hash unit a partial entry (an :class:`~kvhit.model.spec.Upto`)
        at the longest fine boundary inside the block that is cached."""
        hashes = self.request("snapshot", tokens).block_hashes
        pool = self.manager.block_pool
        return Snapshot(pool_rows(pool, self.groups, hashes, self.partial_hits))

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """Look up, allocate and cache as vLLM's scheduler does; then drop the blocks
        that left a window. Rejected when the pool cannot hold the request."""
        if len(tokens) > MAX_MODEL_LEN:
            return Rejected(f"longer than max_model_len ({MAX_MODEL_LEN})")
        if hasattr(self.manager, "new_step_starts"):  # 0.17+: each admit is a step
            self.manager.new_step_starts()
        req = self.request(str(request), tokens)
        hit, length = self.manager.get_computed_blocks(req)[:2]
        allocated = self.manager.allocate_slots(
            req,
            len(tokens) - length,
            length,
            hit,
            **accepted(self.manager.allocate_slots, {"full_sequence_must_fit": True}),
        )
        if allocated is None:
            return Rejected("vLLM's allocate_slots found too few free blocks")
        null = self.manager.block_pool.null_block.block_id
        tables = tuple(
            tuple(None if b == null else b for b in t)
            for t in self.manager.get_block_ids(str(request))
        )
        reused = tuple(tuple(b for b in ids if b != null) for ids in hit.get_block_ids())
        req.num_computed_tokens = len(tokens)
        self.manager.remove_skipped_blocks(req.request_id, len(tokens))
        self.requests[request] = req
        return Admitted(length, reused, tables)

    def finish(self, request: int) -> None:
        """Free the request's blocks (they stay cached until evicted)."""
        self.manager.free(self.requests.pop(request))


def vllm_manager_engine(options: Mapping[str, str]) -> EngineFactory:
    """The stateful ``vllm`` built-in for the target's ``options``: the manager runs a
    program's drafters as the program states them, so the eagle option (a lookup's) must
    be left at its default."""
    if options.get("eagle", "default") != "default":
        raise TargetError("--option eagle is for lookups, not for stateful engines")
    return VllmManagerEngine
