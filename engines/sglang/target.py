"""The ``sglang`` target: SGLang's own hybrid radix caches, on CPU, one per query.

SGLang (0.5.23) keeps its prefix cache as one radix tree, ``UnifiedRadixCache``
(``sglang.srt.mem_cache.unified_radix_cache``), whose nodes always hold full KV and,
per component, sliding-window KV (a node whose window KV was freed is a *tombstone*)
or a Mamba state checkpoint (``unified_cache/components/swa.py`` and ``mamba.py``).
The tree itself is SGLang's default Rust tree core. For each query this builds that
cache with a tiny pool, puts exactly the query's state in it through SGLang's own
``insert`` and ``evict``, asks its own ``match_prefix`` for the first M tokens, and
returns the hit and the blocks SGLang's result reuses. Nothing of SGLang is copied.

How the protocol maps onto SGLang (docs/design.md §1):

- one ``full`` group is the tree; with it at most one ``sliding_window`` group (the
  SWA component) or one ``mamba`` group (the Mamba component). Every block size is
  SGLang's ``page_size`` and the alignment must equal it (matches end on pages).
- a sliding window follows its query's convention (§1.2): SGLang's
  ``sliding_window_size`` is exclusive (its model code passes the inclusive window
  minus one, e.g. ``models/gpt_oss.py``), so an inclusive window w becomes w - 1.
- the full row must be blocks 0 … F-1 with no hole; window and Mamba bits only
  within those blocks (a tree node holds full KV for every token under it).
- window KV: each run of cached window blocks is inserted as SGLang inserts a
  request whose older window KV it already freed (``swa_evicted_seqlen`` at the run's
  start, the SWA slots before it freed first), so uncached blocks are tombstones.
- Mamba (page size 1, SGLang's rule without its extra buffer): every boundary gets a
  state through ``insert``, the uncached ones first, and then ``evict`` takes exactly
  those (the least recently used). The leaf's state cannot be evicted alone (SGLang
  drops the leaf with it), so the last full block needs a cached state.

Anything else the tree cannot hold, or SGLang refuses, raises
:class:`kvhit.errors.Unsupported` with the reason.
"""

from __future__ import annotations

import logging
import sys
import warnings
from array import array
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Kind, Query, window_before


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
    args = ServerArgs(model_path="dummy", page_size=1)
    args._mamba_cache_chunk_size = 1
    set_global_server_args_for_scheduler(args)
    return args


_SERVER_ARGS = _server_args()


@dataclass(frozen=True)
class Layout:
    """The query as SGLang's tree holds it: ``full_blocks`` F (the tree is tokens
    0 … F·page-1) and, per block, whether its window KV or Mamba state is cached."""

    page: int
    full_blocks: int
    window: Group | None
    window_row: tuple[bool, ...]
    mamba_row: tuple[bool, ...] | None

    @property
    def tokens(self) -> int:
        """How many tokens the tree holds."""
        return self.full_blocks * self.page


def _row_prefix(row: tuple[bool, ...]) -> int:
    """F, if ``row`` is blocks 0 … F-1 and nothing after; else Unsupported."""
    full = next((j for j, bit in enumerate(row) if not bit), len(row))
    if any(row[full:]):
        raise Unsupported(
            f"SGLang's tree holds full KV for a prefix only: full block {full} is "
            f"missing but block {row.index(True, full)} is cached"
        )
    return full


def _within(row: tuple[bool, ...], full: int, what: str) -> tuple[bool, ...]:
    """``row`` cut to the tree's F blocks; Unsupported if a bit lies past them."""
    if any(row[full:]):
        raise Unsupported(
            f"{what} block {row.index(True, full)} is cached past the full KV "
            f"(blocks 0 … {full - 1}): a tree node always holds full KV"
        )
    return tuple(row[:full]) + (False,) * (full - len(row[:full]))


@dataclass(frozen=True)
class TreeGroups:
    """The groups as one SGLang tree: its page size, the full group's index, and the
    window group or the Mamba group's index if there is one."""

    page: int
    full: int
    window: Group | None = None
    window_index: int | None = None
    mamba_index: int | None = None


def shape(groups: tuple[Group, ...], alignment: int) -> TreeGroups:
    """How SGLang's tree holds these groups; Unsupported if it cannot.

    >>> tree = shape((Group("sliding_window", 2, window=3), Group("full", 2)), 2)
    >>> tree.page, tree.full, tree.window_index, tree.mamba_index
    (2, 1, 0, None)
    """
    kinds = [g.kind for g in groups]
    if any(g.eagle for g in groups):
        raise Unsupported("SGLang's EAGLE cache keys its tree by token pairs; no block is dropped")
    if kinds.count(Kind.FULL) != 1 or len(kinds) > 2 or any(k not in REUSED for k in kinds):
        raise Unsupported(
            "SGLang's hybrid radix caches hold one full group plus at most one "
            f"sliding_window or mamba group; got {', '.join(kinds)}"
        )
    page = groups[0].block_size
    if any(g.block_size != page for g in groups) or alignment != page:
        raise Unsupported("SGLang has one page size: every block size and A must be equal")
    window = kinds.index(Kind.SLIDING_WINDOW) if Kind.SLIDING_WINDOW in kinds else None
    mamba = kinds.index(Kind.MAMBA) if Kind.MAMBA in kinds else None
    if window is not None and window_before(groups[window]) < 1:
        raise Unsupported("SGLang needs a positive sliding_window_size (exclusive window)")
    if mamba is not None and page != 1:
        raise Unsupported("SGLang's Mamba cache without its extra buffer needs page size 1")
    window_group = groups[window] if window is not None else None
    return TreeGroups(page, kinds.index(Kind.FULL), window_group, window, mamba)


def layout(q: Query) -> Layout:
    """Check that SGLang's tree can hold the query's state, and how."""
    tree = shape(q.groups, q.alignment)
    full = _row_prefix(q.cached[tree.full])
    window_row: tuple[bool, ...] = ()
    mamba_row: tuple[bool, ...] | None = None
    if tree.window_index is not None:
        window_row = _within(q.cached[tree.window_index], full, "window")
    if tree.mamba_index is not None:
        mamba_row = _within(q.cached[tree.mamba_index], full, "Mamba")
        if full and not mamba_row[-1]:
            raise Unsupported(
                f"SGLang keeps a Mamba state on every leaf: the last full block {full - 1} "
                "needs a cached state (evicting it drops the leaf's full KV too)"
            )
    return Layout(tree.page, full, tree.window, window_row, mamba_row)


def key(tokens: int) -> Any:
    """SGLang's radix key for the request's first ``tokens`` tokens (ids 0, 1, …)."""
    return RadixKey(array("q", range(tokens)))


@dataclass
class Built:
    """SGLang's cache holding a layout, the full KV slot of each token, and the Mamba
    slot inserted at each boundary."""

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


def new_cache(page: int, window: Group | None, mamba: bool, pools: Pools) -> Any:
    """An empty ``UnifiedRadixCache`` on CPU: full KV alone, with an SWA component
    for ``window``, or with a Mamba component (page size 1)."""
    components: tuple[Any, ...]
    if mamba:
        requests, allocator = _mamba_pools(pools)
        components = (ComponentType.FULL, ComponentType.MAMBA)
    elif window is not None:
        requests, allocator = _window_pools(page, pools)
        components = (ComponentType.FULL, ComponentType.SWA)
    else:
        requests, allocator = _full_pools(page, pools)
        components = (ComponentType.FULL,)
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=requests,
        token_to_kv_pool_allocator=allocator,
        page_size=page,
        sliding_window_size=window_before(window) if window is not None else None,
        tree_components=components,
        tree_core_backend=TREE_CORE,
    )
    return UnifiedRadixCache(params)


def _rows(pools: Pools) -> Any:
    return ReqToTokenPool(
        size=pools.rows, max_context_len=pools.context, device="cpu", enable_memory_saver=False
    )


def _window_pools(page: int, pools: Pools) -> tuple[Any, Any]:
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
    allocator = SWATokenToKVPoolAllocator(
        size=size,
        size_swa=size_swa,
        page_size=page,
        dtype=KV["dtype"],
        device="cpu",
        kvcache=kv,
        need_sort=False,
    )
    return _rows(pools), allocator


def _mamba_pools(pools: Pools) -> tuple[Any, Any]:
    shape = Mamba2StateShape.create(tp_world_size=1, state_size=4, conv_kernel=2, **MAMBA_SHAPE)
    requests = HybridReqToTokenPool(
        size=pools.rows,
        mamba_size=pools.states,
        mamba_spec_state_size=1,
        max_context_len=pools.context,
        device="cpu",
        enable_memory_saver=False,
        cache_params=Mamba2CacheParams(shape=shape, layers=[1]),
        mamba_layer_ids=[1],
        enable_mamba_extra_buffer=False,
    )
    kv = HybridLinearKVPool(
        size=pools.tokens,
        page_size=1,
        full_attention_layer_ids=[0],
        mamba_pool=requests.mamba_pool,
        **KV,
    )
    allocator = TokenToKVPoolAllocator(
        size=pools.tokens, dtype=KV["dtype"], device="cpu", kvcache=kv, need_sort=False
    )
    return requests, allocator


def _full_pools(page: int, pools: Pools) -> tuple[Any, Any]:
    size = pools.tokens
    kv = MHATokenToKVPool(size=size, page_size=page, layer_num=1, enable_memory_saver=False, **KV)
    if page == 1:
        allocator = TokenToKVPoolAllocator(
            size=size, dtype=KV["dtype"], device="cpu", kvcache=kv, need_sort=False
        )
    else:
        allocator = PagedTokenToKVPoolAllocator(
            size, page, KV["dtype"], "cpu", kvcache=kv, need_sort=False
        )
    return _rows(pools), allocator


def _built_cache(lay: Layout) -> Any:
    """An empty cache big enough for the layout's one request."""
    size = lay.tokens + 2 * lay.page
    pools = Pools(size, 1, size, lay.full_blocks + 1)
    return new_cache(lay.page, lay.window, lay.mamba_row is not None, pools)


def allocate(allocator: Any, lay: Layout) -> torch.Tensor:
    """The full KV slots of the tree's tokens, taken as SGLang's scheduler takes them
    for one request from scratch (``alloc`` at page size 1, else ``alloc_extend``)."""
    if not lay.tokens:
        return torch.zeros(0, dtype=torch.int64)
    if lay.page == 1:
        return allocator.alloc(lay.tokens)
    zero, tokens = torch.tensor([0]), torch.tensor([lay.tokens])
    return allocator.alloc_extend(zero, zero, tokens, tokens, torch.tensor([-1]), lay.tokens)


def build_window_cache(lay: Layout) -> Built:
    """A full + sliding window tree: the window runs inserted in order, each with the
    window KV before it freed and ``swa_evicted_seqlen`` at its start."""
    cache = _built_cache(lay)
    allocator = cache.token_to_kv_pool_allocator
    slots = allocate(allocator, lay)
    inserted = 0
    for start, end in window_runs(lay.window_row) + [(lay.full_blocks, lay.full_blocks)]:
        start, end = start * lay.page, end * lay.page
        if end <= inserted:
            continue
        allocator.free_swa(slots[inserted:start])
        params = InsertParams(key=key(end), value=slots[:end].clone(), prev_prefix_len=inserted)
        params.set_evicted_seqlen(ComponentType.SWA, start)
        cache.insert(params)
        inserted = end
    return Built(cache, slots, {})


def window_runs(row: tuple[bool, ...]) -> list[tuple[int, int]]:
    """The runs ``(start, end)`` of cached blocks of a row.

    >>> window_runs((False, True, True, False, True))
    [(1, 3), (4, 5)]
    """
    runs: list[tuple[int, int]] = []
    for j, bit in enumerate(row):
        if bit and runs and runs[-1][1] == j:
            runs[-1] = (runs[-1][0], j + 1)
        elif bit:
            runs.append((j, j + 1))
    return runs


def build_mamba_cache(lay: Layout) -> Built:
    """A full + Mamba tree: a state inserted at every boundary, the uncached ones
    first, then ``evict`` of exactly that many states (the least recently used)."""
    assert lay.mamba_row is not None
    cache = _built_cache(lay)
    requests = cache.req_to_token_pool
    slots = allocate(cache.token_to_kv_pool_allocator, lay)
    ends = range(1, lay.full_blocks + 1)
    dropped = [e for e in ends if not lay.mamba_row[e - 1]]
    mamba_slots = {}
    for end in dropped + [e for e in ends if lay.mamba_row[e - 1]]:
        state = requests.mamba_allocator.alloc(1)
        mamba_slots[end] = int(state[0])
        cache.insert(InsertParams(key=key(end), value=slots[:end].clone(), mamba_value=state))
    if dropped:
        cache.evict(EvictParams(mamba_num=len(dropped)))
    built = Built(cache, slots, mamba_slots)
    held = set(built.cache.all_mamba_values_flatten().tolist())
    if held != {mamba_slots[e] for e in ends if lay.mamba_row[e - 1]}:
        raise Unsupported("SGLang's evict did not take exactly the uncached Mamba states")
    return built


def build_full_cache(lay: Layout) -> Built:
    """A full attention tree alone: one insert of the cached prefix."""
    cache = _built_cache(lay)
    slots = allocate(cache.token_to_kv_pool_allocator, lay)
    if lay.tokens:
        cache.insert(InsertParams(key=key(lay.tokens), value=slots.clone()))
    return Built(cache, slots, {})


def build(lay: Layout) -> Built:
    """SGLang's cache holding exactly the layout."""
    if lay.mamba_row is not None:
        return build_mamba_cache(lay)
    if lay.window is not None:
        return build_window_cache(lay)
    return build_full_cache(lay)


def full_reused(g: Group, lay: Layout, built: Built, length: int, full: list[int]) -> list[int]:
    """The full KV blocks on the matched path."""
    return full


def window_reused(g: Group, lay: Layout, built: Built, length: int, full: list[int]) -> list[int]:
    """The window blocks SGLang's window reads (the t tokens before the hit) whose
    window KV it still holds."""
    first = max(0, length - window_before(g)) // lay.page
    mapping = built.cache.token_to_kv_pool_allocator.full_to_swa_index_mapping
    return [j for j in full if j >= first and int(mapping[built.slots[j * lay.page]]) > 0]


def mamba_reused(g: Group, lay: Layout, built: Built, length: int, full: list[int]) -> list[int]:
    """The Mamba state at the hit, if SGLang still holds it."""
    held = set(built.cache.all_mamba_values_flatten().tolist())
    state = built.mamba_slots.get(length)
    return [length - 1] if state is not None and state in held else []


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


def sglang_target(query: dict[str, Any]) -> dict[str, Any]:
    """The ``sglang`` target: SGLang's hit length for the first M tokens and the blocks
    its match reuses.

    >>> sglang_target({"groups": [{"kind": "full", "block_size": 1},
    ...                           {"kind": "sliding_window", "block_size": 1, "window": 3}],
    ...                "cached": ["1111", "0110"], "max_length": 4})
    {'length': 3, 'blocks': [[0, 1, 2], [1, 2]]}
    """
    q = parse_query(query)
    lay = layout(q)
    try:
        built = build(lay)
    except (AssertionError, ValueError) as err:
        raise Unsupported(f"SGLang refuses this configuration: {err}") from err
    result = built.cache.match_prefix(MatchPrefixParams(key=key(q.max_length)))
    length = result.device_prefix_len
    path = built.cache.path_device_indices(result.last_device_node)
    return {"length": length, "blocks": reused(q, lay, built, length, path)}
