"""The ``sglang`` target: SGLang's own hybrid radix caches, on CPU, one per query.

SGLang (0.5.23) keeps its prefix cache as one radix tree, ``UnifiedRadixCache``
(``sglang.srt.mem_cache.unified_radix_cache``), whose nodes always hold full KV and,
per component, sliding-window KV (a node whose window KV was freed is a *tombstone*)
and a Mamba state checkpoint (``unified_cache/components/swa.py`` and ``mamba.py``);
a hybrid model with both (``mem_cache/registry.py:165-169``) gets all three
components in one tree. The tree itself is SGLang's default Rust tree core. For each
query this builds that cache with a tiny pool, puts exactly the query's state in it
through SGLang's own ``insert``, ``inc_lock_ref`` and ``evict``, asks its own
``match_prefix`` for the first M tokens, and returns the hit and the blocks SGLang's
result reuses. Nothing of SGLang is copied.

How the protocol maps onto SGLang (docs/design.md §1):

- one ``full`` group is the tree; with it at most one ``mamba`` group (the Mamba
  component) and one sliding window (the SWA component), or two sliding windows
  with the same row: the target's window and its EAGLE drafter's
  (``draft_swa_window``), whose KV shares the target's window slots, so SGLang
  keeps and matches ``max`` of the two (``cache_init_params.py:76-83``). Every block
  size is SGLang's ``page_size`` and the alignment must equal it (matches end on
  pages). No hash unit: SGLang's page is the finest unit it matches and checkpoints
  at.
- a sliding window follows its query's convention (§1.2): SGLang's
  ``sliding_window_size`` is exclusive (its model code passes the inclusive window
  minus one, e.g. ``models/gpt_oss.py``), so an inclusive window w becomes w - 1.
- Mamba at page size 1 runs without SGLang's extra buffer; at page size > 1 with it
  (``components/mamba.py:77``: without it a cached state needs page size 1). Its
  states sit on node ends, which are pages: one bit per page.
- the full row must be blocks 0 … F-1 with no hole; window and Mamba bits only
  within those blocks (a tree node holds full KV for every token under it).
- the state is inserted page by page, as a request's prefill would insert it: an
  uncached window page has its window slots freed first and ``swa_evicted_seqlen``
  at its end (a tombstone); every page end gets a Mamba state, then the cached
  states' nodes are locked (``inc_lock_ref``), ``evict`` takes exactly the
  uncached ones, and the locks are released. The leaf's state cannot be evicted
  alone (SGLang drops the leaf with it), so the last full block needs a cached state.

What the target can be asked is :data:`TREE_CAPABILITIES`, read from the installed SGLang
(:func:`installed_capabilities`); kvhit draws nothing else for it. Rows the tree cannot
hold (the last three points), or what SGLang refuses at run time, raise
:class:`kvhit.errors.Unsupported` with the reason.
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import warnings
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvhit.contract import Capabilities, QueryTarget
from kvhit.engines.sglang.layout import (
    TREE_ROWS,
    Layout,
    layout,
    mamba_at_page_one,
    tree_capabilities,
)
from kvhit.errors import Unsupported
from kvhit.model.spec import Answer, Group, Kind, Query, window_before


def _import_torchvision() -> None:
    """Import torchvision as SGLang's model configs do, even where its compiled ops
    cannot load: the only torchvision wheel on the package index is a CUDA build,
    whose ops do not load next to the CPU torch, and torchvision 0.28 then fails its
    own import registering a fake ``nms``. Declaring the two ops' schemas first lets
    the import finish; no torchvision op is ever run by the cache."""
    try:
        import torchvision  # noqa: F401
    except RuntimeError:
        for name in [m for m in sys.modules if m.split(".")[0] == "torchvision"]:
            del sys.modules[name]
        library = torch.library.Library("torchvision", "DEF")  # kept for the process
        for op in ("nms", "qnms"):
            library.define(f"{op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
        _PLACEHOLDERS.append(library)
        import torchvision  # noqa: F401


_PLACEHOLDERS: list[Any] = []
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # SGLang warns that CUDA-only kernels are absent
    _import_torchvision()
    from sglang.srt.configs.mamba_utils import Mamba2CacheParams, Mamba2StateShape
    from sglang.srt.mem_cache.allocator import TokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import (
        HybridLinearKVPool,
        HybridReqToTokenPool,
        MHATokenToKVPool,
        ReqToTokenPool,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.swa_memory_pool import SWAKVPool
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

logging.getLogger("sglang").setLevel(logging.WARNING)

TREE_CORE: str | None = None
"""SGLang's tree core: None for its default (the Rust one), or ``"python"``."""

# Tiny shapes: the tree never reads KV or state memory, only slot indices.
KV = {"dtype": torch.float32, "head_num": 1, "head_dim": 8, "device": "cpu"}
MAMBA_SHAPE = {"intermediate_size": 8, "n_groups": 1, "num_heads": 1, "head_dim": 4}


def _server_args() -> Any:
    """The process-wide server args SGLang's Mamba component reads. The Mamba state
    chunk size is given, as SGLang's own fixtures do, so no model config is loaded."""
    args = ServerArgs(model_path="dummy", page_size=1, skip_tokenizer_init=True)
    args._mamba_cache_chunk_size = 1
    set_global_server_args_for_scheduler(args)
    return args


_SERVER_ARGS = _server_args()


def key(tokens: int) -> Any:
    """SGLang's radix key for the request's first ``tokens`` tokens (ids 0, 1, …)."""
    return RadixKey(array("q", range(tokens)))


@dataclass
class Built:
    """SGLang's cache holding a layout, the full KV slot of each token, and the Mamba
    slot inserted at each page end."""

    cache: Any
    slots: torch.Tensor
    mamba_slots: dict[int, int]


@dataclass(frozen=True)
class Pools:
    """The sizes of an SGLang cache's pools: ``tokens`` KV slots and ``window_tokens``
    window KV slots (whole numbers of pages; None: as many), ``rows`` request rows of
    ``context`` tokens each, and ``states`` Mamba state slots."""

    tokens: int
    rows: int
    context: int
    states: int = 0
    window_tokens: int | None = None


COMPONENT_KINDS = {"FULL": Kind.FULL, "SWA": Kind.SLIDING_WINDOW, "MAMBA": Kind.MAMBA}
"""SGLang's tree components (``ComponentType``) and the kind each holds."""


def installed_capabilities() -> Capabilities:
    """The configurations the installed SGLang's tree can be asked, read from its code:
    the kinds its ``ComponentType`` has (0.5.23: ``unified_cache/component_type.py``),
    a drafter's window beside the target's where ``CacheInitParams`` has
    ``draft_swa_window``, and Mamba at page size > 1 where it has
    ``enable_mamba_extra_buffer`` (``cache_init_params.py``; without the buffer
    ``MambaComponent`` needs page size 1, ``components/mamba.py:77-80``).

    >>> caps = installed_capabilities()  # SGLang 0.5.23
    >>> sorted(k.value for k in caps.kinds), caps.hash_units, caps.tiers
    (['full', 'mamba', 'sliding_window'], False, False)
    >>> [rule.name for rule in caps.rules]
    ['full_group', 'one_mamba_group', 'one_window_pool', 'one_page_size', 'positive_window']
    """
    members = ComponentType.__members__
    kinds = frozenset(kind for name, kind in COMPONENT_KINDS.items() if name in members)
    fields = {f.name for f in dataclasses.fields(CacheInitParams)}
    caps = tree_capabilities(kinds, 2 if "draft_swa_window" in fields else 1)
    if "enable_mamba_extra_buffer" in fields:
        return caps
    return caps.with_rules(
        mamba_at_page_one("this SGLang has no Mamba extra buffer: a cached state needs page size 1")
    )


TREE_CONFIG = installed_capabilities()
"""The configurations the installed SGLang's tree can be asked (the stateful engine and
HiCache build on it)."""

TREE_CAPABILITIES = TREE_CONFIG.with_rules(TREE_ROWS)
"""What the ``sglang`` target can be asked: the tree's configurations, and the rows a
tree holds."""


def cache_params(
    page: int, windows: tuple[int | None, int], mamba: bool, requests: Any, allocator: Any
) -> Any:
    """SGLang's ``CacheInitParams`` for a tree at page size ``page`` with full KV, an
    SWA component when ``windows`` (``sliding_window_size`` and ``draft_swa_window``)
    has a window, and a Mamba component when ``mamba`` (with SGLang's extra buffer at
    page size > 1); the optional fields are given only when used."""
    window, draft_window = windows
    components = [ComponentType.FULL]
    components += [ComponentType.SWA] * (window is not None) + [ComponentType.MAMBA] * mamba
    optional: dict[str, Any] = {"draft_swa_window": draft_window} if draft_window else {}
    if mamba and page > 1:
        optional["enable_mamba_extra_buffer"] = True
    return CacheInitParams(
        disable=False,
        req_to_token_pool=requests,
        token_to_kv_pool_allocator=allocator,
        page_size=page,
        sliding_window_size=window,
        tree_components=tuple(components),
        tree_core_backend=TREE_CORE,
        **optional,
    )


def new_cache(page: int, windows: tuple[int | None, int], mamba: bool, pools: Pools) -> Any:
    """An empty ``UnifiedRadixCache`` on CPU: full KV, with an SWA component when
    ``windows`` (SGLang's ``sliding_window_size`` and ``draft_swa_window``) has a
    window, and a Mamba component when ``mamba`` (with SGLang's extra buffer at page
    size > 1)."""
    requests = _mamba_rows(pools, mamba and page > 1) if mamba else _rows(pools)
    if windows[0] is not None:
        allocator = _window_allocator(page, pools, requests if mamba else None)
    elif mamba:
        allocator = _mamba_allocator(page, pools, requests)
    else:
        allocator = _full_allocator(page, pools)
    return UnifiedRadixCache(cache_params(page, windows, mamba, requests, allocator))


def _rows(pools: Pools) -> Any:
    return ReqToTokenPool(
        size=pools.rows, max_context_len=pools.context, device="cpu", enable_memory_saver=False
    )


def _window_allocator(page: int, pools: Pools, requests: Any) -> Any:
    """SGLang's full + window KV allocator (``kv_cache_configurator.py:2874``); with a
    Mamba request pool for a model with both (its ``req_to_token_pool``)."""
    size = pools.tokens
    size_swa = size if pools.window_tokens is None else pools.window_tokens
    kv = SWAKVPool(
        size=size,
        size_swa=size_swa,
        page_size=page,
        swa_attention_layer_ids=[1],
        full_attention_layer_ids=[0],
        **KV,
    )
    return SWATokenToKVPoolAllocator(
        size=size,
        size_swa=size_swa,
        page_size=page,
        dtype=KV["dtype"],
        device="cpu",
        kvcache=kv,
        need_sort=False,
        req_to_token_pool=requests,
    )


def _mamba_rows(pools: Pools, extra_buffer: bool) -> Any:
    shape = Mamba2StateShape.create(tp_world_size=1, state_size=4, conv_kernel=2, **MAMBA_SHAPE)
    return HybridReqToTokenPool(
        size=pools.rows,
        mamba_size=pools.states,
        mamba_spec_state_size=1,
        max_context_len=pools.context,
        device="cpu",
        enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[2]),
        mamba_layer_ids=[2],
        enable_mamba_extra_buffer=extra_buffer,
    )


def _mamba_allocator(page: int, pools: Pools, requests: Any) -> Any:
    kv = HybridLinearKVPool(
        size=pools.tokens,
        page_size=page,
        full_attention_layer_ids=[0],
        mamba_pool=requests.mamba_pool,
        **KV,
    )
    return _allocator(page, pools.tokens, kv)


def _full_allocator(page: int, pools: Pools) -> Any:
    size = pools.tokens
    kv = MHATokenToKVPool(size=size, page_size=page, layer_num=1, enable_memory_saver=False, **KV)
    return _allocator(page, size, kv)


def _allocator(page: int, size: int, kv: Any) -> Any:
    """SGLang's token allocator at page size 1, its paged one above."""
    if page == 1:
        return TokenToKVPoolAllocator(
            size=size, dtype=KV["dtype"], device="cpu", kvcache=kv, need_sort=False
        )
    return PagedTokenToKVPoolAllocator(size, page, KV["dtype"], "cpu", kvcache=kv, need_sort=False)


def _built_cache(lay: Layout) -> Any:
    """An empty cache big enough for the layout's one request."""
    size = lay.tokens + 2 * lay.page
    pools = Pools(size, 1, size, 2 * (lay.full_blocks + 1))
    return new_cache(lay.page, lay.window_sizes, lay.mamba_row is not None, pools)


def allocate(allocator: Any, lay: Layout) -> torch.Tensor:
    """The full KV slots of the tree's tokens, taken as SGLang's scheduler takes them
    for one request from scratch (``alloc`` at page size 1, else ``alloc_extend``)."""
    if not lay.tokens:
        return torch.zeros(0, dtype=torch.int64)
    if lay.page == 1:
        return allocator.alloc(lay.tokens)
    zero, tokens = torch.tensor([0]), torch.tensor([lay.tokens])
    return allocator.alloc_extend(zero, zero, tokens, tokens, torch.tensor([-1]), lay.tokens)


def build(lay: Layout) -> Built:
    """SGLang's cache holding exactly the layout: the tree inserted page by page (an
    uncached window page freed first and marked evicted, a Mamba state at every page
    end), then the uncached Mamba states evicted with the cached ones locked."""
    cache = _built_cache(lay)
    allocator = cache.token_to_kv_pool_allocator
    slots = allocate(allocator, lay)
    mamba_slots: dict[int, int] = {}
    for j in range(lay.full_blocks):
        start, end = j * lay.page, (j + 1) * lay.page
        params = InsertParams(key=key(end), value=slots[:end].clone(), prev_prefix_len=start)
        if lay.windows:
            if not lay.window_row[j]:
                allocator.free_swa(slots[start:end])
            params.set_evicted_seqlen(ComponentType.SWA, start if lay.window_row[j] else end)
        if lay.mamba_row is not None:
            state = cache.req_to_token_pool.mamba_allocator.alloc(1)
            mamba_slots[end] = int(state[0])
            params.mamba_value = state
        cache.insert(params)
    if lay.mamba_row is not None:
        _evict_states(cache, lay)
    built = Built(cache, slots, mamba_slots)
    if lay.mamba_row is not None:
        held = set(cache.all_mamba_values_flatten().tolist())
        kept = {mamba_slots[(j + 1) * lay.page] for j, bit in enumerate(lay.mamba_row) if bit}
        if held != kept:
            raise Unsupported("SGLang's evict did not take exactly the uncached Mamba states")
    return built


def _evict_states(cache: Any, lay: Layout) -> None:
    """Evict the Mamba states of the uncached page ends: the cached ones' nodes are
    locked first (``inc_lock_ref`` locks a node's own state), so ``evict`` can take
    only the others."""
    assert lay.mamba_row is not None
    core = cache.tree_core
    kept = [j for j, bit in enumerate(lay.mamba_row) if bit]
    nodes = [core.match_full_device_prefix(key((j + 1) * lay.page))[1] for j in kept]
    locks = [cache.inc_lock_ref(node) for node in nodes]
    dropped = len(lay.mamba_row) - len(kept)
    if dropped:
        cache.evict(EvictParams(num_tokens=0, mamba_num=dropped))
    for node, lock in zip(nodes, locks):
        cache.dec_lock_ref(node, lock.to_dec_params())


def full_reused(g: Group, lay: Layout, built: Built, length: int, full: list[int]) -> list[int]:
    """The full KV blocks on the matched path."""
    return full


def window_reused(g: Group, lay: Layout, built: Built, length: int, full: list[int]) -> list[int]:
    """The window blocks the group's window reads (the t tokens before the hit)
    whose window KV SGLang still holds."""
    first = max(0, length - window_before(g)) // lay.page
    mapping = built.cache.token_to_kv_pool_allocator.full_to_swa_index_mapping
    return [j for j in full if j >= first and int(mapping[built.slots[j * lay.page]]) > 0]


def mamba_reused(g: Group, lay: Layout, built: Built, length: int, full: list[int]) -> list[int]:
    """The Mamba state at the hit, if SGLang still holds it."""
    held = set(built.cache.all_mamba_values_flatten().tolist())
    state = built.mamba_slots.get(length)
    return [length // lay.page - 1] if state is not None and state in held else []


REUSED: dict[Kind, Callable[[Group, Layout, Built, int, list[int]], list[int]]] = {
    Kind.FULL: full_reused,
    Kind.SLIDING_WINDOW: window_reused,
    Kind.MAMBA: mamba_reused,
}
"""Each kind SGLang's tree holds, and the blocks its match reuses for a group of that
kind at a hit (given the full blocks on the matched path); :func:`shape` refuses the
other kinds (chunked local)."""


def reused(q: Query, lay: Layout, built: Built, length: int, path: torch.Tensor) -> list[list[int]]:
    """Per group, the blocks SGLang's match reuses at ``length`` (:data:`REUSED`)."""
    position = {int(slot): p for p, slot in enumerate(built.slots.tolist())}
    full = sorted({position[int(s)] // lay.page for s in path[:length].tolist()})
    return [REUSED[g.kind](g, lay, built, length, full) for g in q.groups]


def sglang_answer(q: Query) -> dict[str, Any]:
    """The ``sglang`` target: SGLang's hit length for the first M tokens and the blocks
    its match reuses.

    >>> sglang_target({"groups": [{"kind": "full", "block_size": 1},
    ...                           {"kind": "sliding_window", "block_size": 1, "window": 3}],
    ...                "cached": ["1111", "0110"], "max_length": 4})
    {'length': 3, 'blocks': [[0, 1, 2], [1, 2]]}
    >>> sglang_target({"groups": [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 2}],
    ...                "cached": ["111", "011"], "max_length": 7})
    {'length': 6, 'blocks': [[0, 1, 2], [2]]}
    """
    lay = layout(q)
    try:
        built = build(lay)
    except (AssertionError, ValueError) as err:
        raise Unsupported(f"SGLang refuses this configuration: {err}") from err
    result = built.cache.match_prefix(MatchPrefixParams(key=key(q.max_length)))
    length = result.device_prefix_len
    path = built.cache.path_device_indices(result.last_device_node)
    blocks = reused(q, lay, built, length, path)
    return Answer(length, tuple(map(tuple, blocks))).to_json()


sglang_target = QueryTarget(sglang_answer, TREE_CAPABILITIES)
"""The ``sglang`` target."""
