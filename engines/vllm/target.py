"""The ``vllm`` target: the installed vLLM's own prefix-cache coordinator.

For each query this builds vLLM's KV cache config (one ``KVCacheGroupSpec`` per
protocol group), gets the coordinator through ``get_kv_cache_coordinator``, marks in
its block pool exactly the queried blocks as cached (under the chained block hashes
vLLM's own request hasher computes for a request of ``num_tokens`` tokens), and asks
``find_longest_cache_hit``. Nothing of vLLM is copied here; only its API is called.

It runs, unchanged, against every vLLM release from 0.14.0 to 0.34.0: what differs
between releases is detected by :mod:`kvhit.engines.vllm.release`, and a query a
release cannot be asked is refused before vLLM is called.

Each query is configured as vLLM configures that model on the release by default
(docs/engines/vllm.md, against vLLM 0.34):

- ``alignment`` A is vLLM's ``scheduler_block_size`` (before 0.23 vLLM aligns to the
  lcm of the block sizes, so only that A is asked). The hash block size is the query's
  hash unit h (vLLM's ``prefix_match_unit``) or else the gcd of the block sizes
  (vLLM's own choice for several groups), so it divides each.
- Partial (fine-grained) hash hits are left to vLLM (``allow_partial_hash_hits`` at its
  default): on where ``partial_hash_hits_enabled`` says so (a Mamba group in align
  mode with a block larger than h, and every other group able to look up fine
  hashes), and then hits are multiples of h. A query is asked only where vLLM's hits
  land on its A. A query without a hash unit says that no hit falls inside a block:
  from 0.30 on it is asked with ``allow_partial_hash_hits=False``, as vLLM's own
  lazy KV offload asks its coordinator (``v1/simple_kv_offload/manager.py``).
- A partially filled block ``{"upto": p}`` is registered as vLLM registers a prompt's
  last hash boundary: ``BlockPool.cache_partial_block`` at p (the prefix hash at p).
- Token ids are the positions 0 … T-1: any request of T tokens whose blocks are all
  distinct would do, since the cache is keyed by chained hashes.
- Only whole hash blocks of the request have hashes (with lookahead, those ending by
  T - La): a cached block past them cannot be marked (the spec never needs it).
- a sliding window is given to vLLM as the inclusive window that needs the same KV
  (vLLM's ``sliding_window`` counts the token itself): an exclusive window w is
  ``sliding_window=w+1`` (:func:`kvhit.model.spec.inclusive_window`).
- Drafters: ``drop`` and ``lookahead`` groups, and a Mamba group carrying ``none``
  beside an eagle drop (as vLLM's "none flagged: all flagged" rule flags it), are
  flagged ``is_eagle_group`` (0.20+; before, ``use_eagle`` applies to every group);
  ``drop`` and ``lookahead`` specs are also ``is_draft``. A
  ``drop`` drafter sets ``use_eagle``; a ``lookahead`` one, La =
  ``num_hash_lookahead_tokens`` with ``use_eagle`` off, as ``sched/scheduler.py``
  builds the KV manager (0.33+). Which of the two a release runs by default, and the
  option ``eagle=drop``: :class:`kvhit.engines.vllm.options.EaglePath`.
- A single group goes to vLLM's unitary coordinator, which aligns hits to the
  group's block size; vLLM only ever builds it with A = b, so other A are refused.
- vLLM's coordinator is built once per *shape* of query (its groups, T, A, h, the
  pool's size and the drafters' path: everything vLLM's configs and coordinator are
  built from) and kept (:class:`Coordinators`); after each lookup its block pool is
  reset to the state a fresh build gives (:func:`reset_pool`), so the next query of
  that shape starts from a fresh pool. A lookup that raises drops its coordinator.
  What a shape cannot be asked is kept too, so it is refused without a build. The
  pool holds a block per entry of the rows, whatever the entries are, so every state of
  rows of the same lengths shares the coordinator.
- What a release cannot be asked (its own asserts, e.g. chunked local attention with
  mixed block sizes; the alignment its hits land on; the ``ValueError`` s of
  ``get_kv_cache_coordinator`` for a configuration) the target declares as its
  capabilities, read from the release's code
  (:func:`kvhit.engines.vllm.release.capabilities`): kvhit draws nothing else, and a
  query outside them is refused with the rule's reason before vLLM is called. What
  vLLM still refuses while building the coordinator is ``unsupported`` at run time.
  Any other assert or error inside vLLM is left to surface as a ``crash``.

The built-in is :func:`vllm_lookup`, called with the target's options
(:data:`kvhit.engines.vllm.options.LOOKUP_OPTIONS`); :data:`vllm_target` is the one
with every option at its default.

    >>> vllm_target({"groups": [{"kind": "full", "block_size": 2, "eagle": False}],
    ...              "cached": [[True, True, False]], "max_length": 5,
    ...              "num_tokens": 6, "alignment": 2})
    {'length': 4, 'blocks': [[0, 1]]}
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial
from types import SimpleNamespace
from typing import Any

import torch

from kvhit.contract import Capabilities, QueryTarget
from kvhit.engines.vllm.options import EAGLE, EaglePath
from kvhit.engines.vllm.release import (
    FINE_LOOKUP_FLAG,
    Asker,
    capabilities,
    coordinator_keywords,
    detect,
    flagged,
    hash_lookahead,
    import_failure,
    is_draft,
    passes_managers,
    pool_size,
    says,
)
from kvhit.errors import Unsupported
from kvhit.model.spec import Group, Kind, Query, Upto, inclusive_window

try:
    from vllm.utils.hashing import sha256
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.core.block_pool import BlockPool
    from vllm.v1.core.kv_cache_coordinator import (
        HybridKVCacheCoordinator,
        KVCacheCoordinator,
        get_kv_cache_coordinator,
    )
    from vllm.v1.core.kv_cache_utils import (
        BlockHash,
        FreeKVCacheBlockQueue,
        get_request_block_hasher,
    )
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
# A pool reset says so at INFO level, once per query here; vLLM's warnings still show.
logging.getLogger(BlockPool.__module__).setLevel(logging.WARNING)

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
    return {"is_draft": is_draft(g)} if RELEASE.draft_flag else {}


def full_spec(g: Group) -> KVCacheSpec:
    """A full attention group's spec (a drafter's spec is flagged)."""
    return FullAttentionSpec(block_size=g.block_size, **ATTENTION, **draft_flag(g))


def sliding_window_spec(g: Group) -> KVCacheSpec:
    """A sliding window group's spec, its window inclusive (a drafter's is flagged)."""
    return SlidingWindowSpec(
        block_size=g.block_size, sliding_window=inclusive_window(g), **ATTENTION, **draft_flag(g)
    )


def chunked_local_spec(g: Group) -> KVCacheSpec:
    """A chunked local attention group's spec (a drafter's is flagged)."""
    return ChunkedLocalAttentionSpec(
        block_size=g.block_size, attention_chunk_size=g.chunk, **ATTENTION, **draft_flag(g)
    )


def mamba_spec(g: Group) -> KVCacheSpec:
    """A Mamba group's spec, its states cached at block boundaries ("align" mode; a
    drafter's is flagged)."""
    mode = {"mamba_cache_mode": "align"} if RELEASE.mamba_cache_mode else {}
    return MambaSpec(block_size=g.block_size, **MAMBA_STATE, **mode, **draft_flag(g))


SPECS: dict[Kind, Callable[[Group], KVCacheSpec]] = {
    Kind.FULL: full_spec,
    Kind.SLIDING_WINDOW: sliding_window_spec,
    Kind.CHUNKED_LOCAL: chunked_local_spec,
    Kind.MAMBA: mamba_spec,
}
"""Each kind's vLLM KV cache spec; a drafter's carries ``is_draft``."""


def group_spec(g: Group) -> KVCacheSpec:
    """vLLM's KV cache spec for one protocol group."""
    return SPECS[g.kind](g)


def fine_lookup_kinds() -> frozenset[Kind] | None:
    """The kinds whose manager has :data:`~kvhit.engines.vllm.release.FINE_LOOKUP_FLAG`
    set (the manager vLLM's ``KVCacheSpecRegistry`` gives each kind's spec), where the
    hybrid coordinator consults its managers: inline in its ``__init__`` (0.28.0), or by
    handing their classes to ``partial_hash_hits_enabled`` (0.34.0); None where it
    consults none (``kv_cache_coordinator.py``, 0.27.0)."""
    hybrid = HybridKVCacheCoordinator.__init__
    if not (says(hybrid, FINE_LOOKUP_FLAG) or passes_managers(hybrid, "partial_hash_hits_enabled")):
        return None
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    return frozenset(
        g.kind
        for g in KIND_EXAMPLES
        if getattr(KVCacheSpecRegistry.get_manager_class(group_spec(g)), FINE_LOOKUP_FLAG)
    )


KIND_EXAMPLES = (
    Group(Kind.FULL, 2),
    Group(Kind.SLIDING_WINDOW, 2, window=3),
    Group(Kind.CHUNKED_LOCAL, 2, chunk=2),
    Group(Kind.MAMBA, 2),
)
"""A group of each kind, whose spec's manager is looked up."""


RELEASE = replace(RELEASE, fine_lookup_kinds=fine_lookup_kinds())
LOOKUP_CAPABILITIES: dict[EaglePath, Capabilities] = {
    path: capabilities(Asker(RELEASE, path, partial_off_without_unit=True)) for path in EaglePath
}
"""What the ``vllm`` target can ask the installed release, on each eagle path."""


def kv_cache_config(q: Query) -> KVCacheConfig:
    """The KV cache config: one group per protocol group, drafter groups flagged."""
    groups = [
        KVCacheGroupSpec([f"layer.{i}"], group_spec(g), **eagle_flag(g, q.groups))
        for i, g in enumerate(q.groups)
    ]
    return KVCacheConfig(num_blocks=pool_size(q), kv_cache_tensors=[], kv_cache_groups=groups)


def eagle_flag(g: Group, groups: tuple[Group, ...]) -> dict[str, bool]:
    """Group g's ``is_eagle_group`` keyword among ``groups``, where the release has it."""
    return {"is_eagle_group": flagged(g, groups)} if RELEASE.group_eagle_flag else {}


def coordinator_options(q: Query, path: EaglePath) -> dict[str, Any]:
    """The keywords of ``get_kv_cache_coordinator`` this release takes, for query ``q``
    with its drafters on ``path``."""
    options = coordinator_keywords(q, path)
    return {k: v for k, v in options.items() if k in RELEASE.coordinator_params}


def partial_hits_on(coordinator: KVCacheCoordinator) -> bool:
    """Whether vLLM turned partial hash hits on for this coordinator (0.26+)."""
    return bool(getattr(coordinator, "enable_partial_hash_hits", False))


def foreseen(coordinator: KVCacheCoordinator, q: Query, asker: Asker) -> None:
    """Check that vLLM turned partial hash hits on exactly where the capability rules
    said (:meth:`kvhit.engines.vllm.release.Asker.partial_hits`, which gave the
    alignment they checked); :class:`Unsupported` saying the rules missed it if not."""
    if len(q.groups) > 1 and partial_hits_on(coordinator) != asker.partial_hits(q):
        raise Unsupported(
            f"vLLM {RELEASE.name} turned partial hash hits "
            f"{'on' if partial_hits_on(coordinator) else 'off'} where the capability rules "
            "said otherwise (kvhit.engines.vllm.release.Asker.partial_hits)"
        )


def build_coordinator(q: Query, path: EaglePath = EaglePath.DEFAULT) -> KVCacheCoordinator:
    """vLLM's coordinator for the query's groups, as the engine would build it, its
    drafters on ``path``; :class:`Unsupported` with the reason if the release cannot be
    asked the query (its capabilities, :data:`LOOKUP_CAPABILITIES`), or if vLLM refuses
    the configuration while building it."""
    reason = LOOKUP_CAPABILITIES[path].refusal(q)
    if reason is not None:
        raise Unsupported(reason)
    try:
        coordinator = get_kv_cache_coordinator(kv_cache_config(q), **coordinator_options(q, path))
    except ValueError as err:
        raise Unsupported(f"vLLM {RELEASE.name} refuses the configuration: {err}") from None
    foreseen(coordinator, q, Asker(RELEASE, path, partial_off_without_unit=True))
    return coordinator


def request(num_tokens: int) -> SimpleNamespace:
    """A plain-text request of tokens 0 … num_tokens-1, as vLLM's hasher reads one."""
    tokens = list(range(num_tokens))
    return SimpleNamespace(
        num_tokens=num_tokens,
        block_hashes=[],
        all_token_ids=tokens,
        _all_token_ids=tokens,
        mm_features=[],
        lora_request=None,
        cache_salt=None,
        prompt_embeds=None,
    )


@lru_cache(maxsize=64)
def request_hashes(num_tokens: int, block_size: int, lookahead: int = 0) -> tuple[BlockHash, ...]:
    """The chained block hashes vLLM's own request hasher gives a request of tokens
    0 … num_tokens-1; with ``lookahead`` La (0.33+), each also covers the La tokens after
    its block, so only blocks ending by num_tokens - La have one. The same arguments
    give the same hashes in a process, so the last 64 requests are kept, not hashed again.

    >>> len(request_hashes(10, 4))  # only whole blocks are hashed
    2
    """
    extra = (lookahead,) if lookahead else ()
    return tuple(get_request_block_hasher(block_size, sha256, *extra)(request(num_tokens)))


def mark_cached(coordinator: KVCacheCoordinator, q: Query, hashes: Sequence[BlockHash]) -> None:
    """Put exactly the query's cached blocks into the coordinator's block pool: whole
    blocks through ``cache_full_blocks``, a partially filled one through
    ``cache_partial_block`` at its fine boundary (as vLLM registers a prompt's tail)."""
    pool = coordinator.block_pool
    owner = SimpleNamespace(block_hashes=hashes)
    hashed = len(hashes) * pool.hash_block_size
    for group_id, (g, row) in enumerate(zip(q.groups, q.cached)):
        whole = [e is True for e in row[: hashed // g.block_size]]
        fresh = iter(pool.get_new_blocks(sum(whole)))
        blocks = [next(fresh) if bit else pool.null_block for bit in whole]
        pool.cache_full_blocks(owner, blocks, 0, len(blocks), g.block_size, group_id)
        for entry in row:
            if isinstance(entry, Upto) and entry.end <= hashed:
                (block,) = pool.get_new_blocks(1)
                pool.cache_partial_block(owner, block, entry.end, group_id, g.block_size)


def reset_pool(pool: BlockPool) -> None:
    """Bring a block pool back to the state a fresh build gives, with vLLM's own calls:
    every block in use freed, the prefix cache reset (no hash anywhere), and the free
    queue rebuilt in block order from block 1 (block 0 is the null block), as
    ``BlockPool.__init__`` leaves it."""
    pool.free_blocks([b for b in pool.blocks if b.ref_cnt and not b.is_null])
    if not pool.reset_prefix_cache():
        raise RuntimeError("vLLM's block pool did not reset (blocks still in use)")
    pool.free_block_queue = FreeKVCacheBlockQueue(pool.blocks[1:])


def shape_key(q: Query, path: EaglePath) -> Hashable:
    """What vLLM's configs and coordinator for ``q`` are built from: all but the cache
    state (the pool's size is the rows' lengths)."""
    return q.groups, q.num_tokens, q.alignment, q.hash_unit, pool_size(q), path


@dataclass
class Coordinators:
    """vLLM's coordinators by :func:`shape_key`, each with a fresh pool, or why the
    shape cannot be asked; the ``size`` shapes used last are kept."""

    size: int = 256
    kept: OrderedDict[Hashable, KVCacheCoordinator | str] = field(default_factory=OrderedDict)

    def take(self, q: Query, path: EaglePath) -> KVCacheCoordinator:
        """The coordinator for ``q``'s shape, taken out until :meth:`give_back`:
        kept, or built (:func:`build_coordinator`); :class:`Unsupported` if the shape
        cannot be asked."""
        key = shape_key(q, path)
        kept = self.kept.pop(key, None)
        if isinstance(kept, str):
            self.keep(key, kept)
            raise Unsupported(kept)
        if kept is not None:
            return kept
        try:
            return build_coordinator(q, path)
        except Unsupported as err:
            self.keep(key, str(err))
            raise

    def give_back(self, q: Query, path: EaglePath, coordinator: KVCacheCoordinator) -> None:
        """Keep a coordinator taken for ``q``, its pool reset (with ``size`` 0 nothing
        is kept: every query builds its coordinator afresh)."""
        if self.size:
            reset_pool(coordinator.block_pool)
            self.keep(shape_key(q, path), coordinator)

    def keep(self, key: Hashable, value: KVCacheCoordinator | str) -> None:
        """Keep ``value`` for ``key``, forgetting the shape used longest ago if full."""
        self.kept[key] = value
        if len(self.kept) > self.size:
            self.kept.popitem(last=False)


COORDINATORS = Coordinators()
"""The coordinators this process keeps."""


def lookup(
    q: Query, path: EaglePath = EaglePath.DEFAULT, coordinators: Coordinators = COORDINATORS
) -> Lookup:
    """Run vLLM's ``find_longest_cache_hit`` on the query's cache state, in the
    coordinator ``coordinators`` keep for its shape.

    Configurations the release refuses raise :class:`Unsupported` before the call;
    anything vLLM raises during it (its asserts included) surfaces as a crash.
    """
    coordinator = coordinators.take(q, path)
    hashes = list(
        request_hashes(
            q.num_tokens, coordinator.block_pool.hash_block_size, hash_lookahead(q, path)
        )
    )
    mark_cached(coordinator, q, hashes)
    blocks, length, *uncached = coordinator.find_longest_cache_hit(hashes, q.max_length)
    reused = [[j for j, block in enumerate(group) if not block.is_null] for group in blocks]
    coordinators.give_back(q, path, coordinator)
    return Lookup(length, reused, uncached[0] if uncached else None)


def vllm_answer(q: Query, path: EaglePath = EaglePath.DEFAULT) -> dict[str, Any]:
    """vLLM's hit length and each group's non-null block indices, its drafters on ``path``."""
    found = lookup(q, path)
    return {"length": found.length, "blocks": found.blocks}


def vllm_lookup(options: Mapping[str, str]) -> QueryTarget:
    """The ``vllm`` target with ``options`` (every one of
    :data:`kvhit.engines.vllm.options.LOOKUP_OPTIONS`): its answer on the eagle path
    they name, and what the installed release can be asked on it.

    >>> from kvhit.model.spec import Drafter
    >>> Drafter.LOOKAHEAD in vllm_lookup({"eagle": "drop"}).capabilities.drafters
    False
    """
    path = EaglePath(options[EAGLE.name])
    return QueryTarget(partial(vllm_answer, path=path), LOOKUP_CAPABILITIES[path])


vllm_target = vllm_lookup({EAGLE.name: EAGLE.default})
"""The ``vllm`` target, its options at their defaults."""
