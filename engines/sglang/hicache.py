"""The ``sglang-hicache`` target: SGLang's HiCache host tier under a hybrid radix tree,
on CPU, one cache per query.

SGLang (0.5.23) backs the nodes of its ``UnifiedRadixCache`` up to a host pool
(``init_hicache``: ``mem_cache/unified_radix_cache.py:455``; the pools and the
``HybridCacheController`` come from ``hybrid_cache/hybrid_pool_assembler.py``: full KV,
window KV and Mamba states each get a host pool). Device eviction then *demotes* a
backed-up leaf (its device KV freed, its host copy kept:
``unified_cache/unified_tree_core.py:1788-1821``), ``match_prefix`` accepts host-only
nodes (each component's validator takes a host value as a match:
``components/mamba.py:151-162``), and the scheduler's ``init_load_back``
(``unified_radix_cache.py:3586``) copies the host part back before the prefill
(``managers/schedule_policy.py:1470-1560``).

A tiered query with one tier is such a tree: the local rows are what the device
holds, the tier's rows what the host pool holds. For each query this builds the
tree holding every held block (:func:`kvhit.engines.sglang.target.build` over the
held rows), attaches HiCache to it (``init_hicache``, write-through, host layout
``page_first_direct`` with the ``direct`` copy backend), backs the host blocks' nodes up
(``backup_node_for_write_back``), demotes them (``evict`` with the device part locked),
checks that SGLang now holds exactly the query's two row sets, and asks as the
scheduler does: ``Req.init_next_round_input`` (``match_prefix``), then
``init_load_back`` and the load's completion (``ready_to_load_host_cache``,
``loading_check``). The hit is the device prefix plus what the load brought back; the
blocks are those SGLang then holds on the device where the request reads them, each
checked to hold its own tokens' KV (every slot is stamped with its token before the
backup, every Mamba state with its length; :class:`WrongRestore` otherwise).

What the target can be asked (:data:`HICACHE_CAPABILITIES`, each a rule with its reason): the
configurations of the ``sglang`` target's tree, one tier, and the tree over the held rows; the device's full row a prefix, blocks 0 … D-1;
past it, no local bit (a demoted node holds nothing on the device); before it, no
window or Mamba bit on the tier alone (a device node's state held only on the host
is not built). The tier may hold ``full``, ``sliding_window`` and ``mamba``.

On CPU two pieces of SGLang need a stand-in, both on the copy path only, nothing of
the tree or the controller (docs/findings-sglang.md, "HiCache host tier"):

- host pools pin their memory with ``cudaHostRegister``
  (``pool_host/common.py:349``, ``:147``); here they are allocated unpinned
  (``pin_memory=False``, an argument of SGLang's own host pools);
- the ``direct`` copy ops (``transfer_kv_direct``, ``transfer_kv_all_layer_direct_lf_pf``,
  ``transfer_kv_per_layer_direct_pf_lf``) are bound from ``sgl_kernel`` on CUDA and
  ROCm only (``pool_host/mha.py:60-90``, ``pool_host/mamba.py:31-37``); here, where
  they are absent, they are indexed torch copies with the same arguments
  (:func:`transfer_kv_direct` and its two layouts).
"""

from __future__ import annotations

import atexit
import logging
from array import array
from collections.abc import Sequence
from dataclasses import dataclass, replace
from functools import partialmethod
from typing import Any

import torch

from kvhit.contract import Capabilities, QueryTarget, Rule
from kvhit.engines.sglang import target
from kvhit.engines.sglang.layout import Layout, layout, prefix_blocks, tree_rows
from kvhit.engines.sglang.target import Built, build, cache_params, key
from kvhit.errors import Unsupported
from kvhit.model.spec import (
    Answer,
    Group,
    Kind,
    Query,
    held_query,
    tier_rows,
    window_before,
)

# isort: split
# After kvhit.engines.sglang.target, which prepares SGLang's imports and server args.
import sglang.srt.mem_cache.pool_host.mamba as mamba_host
import sglang.srt.mem_cache.pool_host.mha as mha_host
from sglang.srt.managers.schedule_batch import Req
from sglang.srt.mem_cache.base_prefix_cache import EvictParams, InitLoadBackParams
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

logging.getLogger("sglang.srt.mem_cache.l2_transfer").setLevel(
    logging.ERROR
)  # CPU events: no timing

HOLDS = frozenset({Kind.FULL, Kind.SLIDING_WINDOW, Kind.MAMBA})
"""The kinds SGLang's host pools hold (full and window KV, Mamba states:
``hybrid_cache/hybrid_pool_assembler.py``, ``_SwaStrategy``, ``_MambaStrategy``,
``_MambaSwaStrategy``)."""


def one_host_tier(q: Query) -> str | None:
    """HiCache backs the tree up to one host pool per component (``init_hicache``)."""
    if len(q.tiers) <= 1:
        return None
    return "SGLang's HiCache has one host tier: a query may give one tier"


def host_kinds(q: Query) -> str | None:
    """The tier holds only kinds SGLang's host pools hold (:data:`HOLDS`)."""
    extra = {k for t in q.tiers for k in t.holds} - HOLDS
    if not extra:
        return None
    named = ", ".join(sorted(k.value for k in extra))
    return f"SGLang's host pools hold full, window and Mamba KV, not {named}"


def _indices(indices: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    return indices.to(device=like.device, dtype=torch.int64)


def transfer_kv_direct(
    src_layers: Sequence[torch.Tensor],
    dst_layers: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Copy slots ``src_indices`` of each source layer to slots ``dst_indices`` of
    the matching destination layer (both layouts slot-first)."""
    for src, dst in zip(src_layers, dst_layers):
        dst[_indices(dst_indices, dst)] = src[_indices(src_indices, src)].to(dst.device)


def transfer_kv_all_layer_direct_lf_pf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    page_size: int,
) -> None:
    """Device layers (slot-first) to host buffers laid out page, layer, slot in page:
    the source layers are split evenly among the destinations (K's, then V's)."""
    per = len(src_ptrs) // len(dst_ptrs)
    for i, dst in enumerate(dst_ptrs):
        host = _indices(dst_indices, dst)
        for layer in range(per):
            src = src_ptrs[i * per + layer]
            rows = src[_indices(src_indices, src)].to(dst.device)
            dst[host // page_size, layer, host % page_size] = rows


def transfer_kv_per_layer_direct_pf_lf(
    src_ptrs: Sequence[torch.Tensor],
    dst_ptrs: Sequence[torch.Tensor],
    src_indices: torch.Tensor,
    dst_indices: torch.Tensor,
    layer_id: int,
    page_size: int,
) -> None:
    """One layer from host buffers laid out page, layer, slot in page to device
    layers (slot-first)."""
    for src, dst in zip(src_ptrs, dst_ptrs):
        host = _indices(src_indices, src)
        rows = src[host // page_size, layer_id, host % page_size]
        dst[_indices(dst_indices, dst)] = rows.to(dst.device)


COPIES = (
    transfer_kv_direct,
    transfer_kv_all_layer_direct_lf_pf,
    transfer_kv_per_layer_direct_pf_lf,
)


def _stand_in() -> None:
    """Where SGLang bound no copy op (no CUDA, ROCm or XPU build): host pools
    unpinned, and the ``direct`` copy ops given. A GPU build keeps its own."""
    if getattr(mha_host, transfer_kv_direct.__name__, None) is not None:
        return
    for pool in (mha_host.MHATokenToKVPoolHost, mamba_host.MambaPoolHost):
        pool.__init__ = partialmethod(pool.__init__, pin_memory=False)  # type: ignore[method-assign]
    for module in (mha_host, mamba_host):
        for op in COPIES:
            setattr(module, op.__name__, op)


_stand_in()


def _hicache_args() -> Any:
    """Server args with HiCache on: write-through, a host pool twice the device's,
    ``page_first_direct`` host layout (the one layout Mamba's host pool shares with
    the KV pools, ``pool_host/mamba.py:103``) copied with the ``direct`` backend."""
    args = ServerArgs(model_path="dummy", page_size=1)
    args._mamba_cache_chunk_size = 1
    args.enable_hierarchical_cache = True
    args.hicache_ratio = 2.0
    args.hicache_write_policy = "write_through"
    args.hicache_io_backend = "direct"
    args.hicache_mem_layout = "page_first_direct"
    return args


HICACHE_ARGS = _hicache_args()

LOAD_BACK_THRESHOLD: int | None = None
"""SGLang's ``load_back_threshold`` for the caches built here: None for its own (10
tokens: a host hit of fewer full tokens, with no window or Mamba KV to load, is
recomputed, ``unified_radix_cache.py:576``, ``:1879``), or a number."""


@dataclass(frozen=True)
class HostLayout:
    """A query as SGLang's tree with its host tier holds it: the tree over the held
    rows, and D, the full blocks still on the device (the rest only on the host)."""

    tree: Layout
    device_blocks: int


def host_rows(q: Query) -> tuple[Any, ...]:
    """The rows of the query's one tier (none held without one)."""
    return tier_rows(q.tiers[0]) if q.tiers else ((),) * len(q.groups)


def device_rows(q: Query) -> str | None:
    """Why the device's rows of the one-tier query ``q`` are not what SGLang's HiCache
    holds after demoting a tree's tail (see the module docstring), or None."""
    host = host_rows(q)
    full_row = q.cached[_full(q.groups)]
    device = prefix_blocks(full_row)
    if any(full_row[device:]):
        return "SGLang's device holds full KV for a prefix of the tree only"
    for i, g in enumerate(q.groups):
        if g.kind == Kind.FULL:
            continue
        if any(q.cached[i][device:]):
            return (
                f"group {i}: a block past the device's full KV (block {device} on) is "
                "on the host only: it holds nothing on the device"
            )
        if any(bit and not mine for bit, mine in zip(host[i][:device], q.cached[i])):
            return (
                f"group {i}: a {g.kind.value} block under the device's full KV held on the "
                "host alone is not built"
            )
    return None


def held_rows(q: Query) -> str | None:
    """Why one tree cannot hold every block the device and the host hold, or None."""
    return tree_rows(held_query(q))


HICACHE_CAPABILITIES: Capabilities = replace(target.TREE_CONFIG, tiers=True).with_rules(
    Rule("one_host_tier", one_host_tier),
    Rule("host_kinds", host_kinds),
    Rule("held_rows", held_rows, reads_rows=True),
    Rule("device_rows", device_rows, reads_rows=True),
)
"""What the ``sglang-hicache`` target can be asked: the ``sglang`` target's tree over
the held rows, with one host tier holding its tail and perhaps copies of the rest."""


def host_layout(q: Query) -> HostLayout:
    """How SGLang's tree and host tier hold a one-tier query its capabilities allow
    (:data:`HICACHE_CAPABILITIES`)."""
    tree = layout(held_query(q))
    device = prefix_blocks(q.cached[_full(q.groups)])
    return HostLayout(tree, min(device, tree.full_blocks))


def _full(groups: tuple[Group, ...]) -> int:
    return next(i for i, g in enumerate(groups) if g.kind == Kind.FULL)


def attach(built: Built, tree: Layout) -> Any:
    """HiCache attached to the built tree as SGLang's cache registry attaches it
    (``mem_cache/registry.py:196``), with :data:`HICACHE_ARGS` process-wide while it
    is built; returns the cache."""
    cache = built.cache
    mamba = tree.mamba_row is not None
    requests, allocator = cache.req_to_token_pool, cache.token_to_kv_pool_allocator
    params = cache_params(tree.page, tree.window_sizes, mamba, requests, allocator)
    set_global_server_args_for_scheduler(HICACHE_ARGS)
    try:
        cache.init_hicache(HICACHE_ARGS, params)
    finally:
        set_global_server_args_for_scheduler(target._SERVER_ARGS)
    if LOAD_BACK_THRESHOLD is not None:
        cache.load_back_threshold = LOAD_BACK_THRESHOLD
    return cache


def page_nodes(cache: Any, tree: Layout) -> list[Any]:
    """The tree node ending at each page (the tree is inserted page by page)."""
    core = cache.tree_core
    return [
        core.match_full_device_prefix(key((j + 1) * tree.page))[1] for j in range(tree.full_blocks)
    ]


def demote(cache: Any, nodes: list[Any], device: int, tree: Layout) -> None:
    """Back the host part's nodes up, then evict their device KV with the device part
    locked: SGLang demotes them to host-only nodes."""
    for node in nodes[device:]:
        if not cache.backup_node_for_write_back(node):
            raise Unsupported("SGLang's host pool refused a backup")
    if device == len(nodes):
        return
    lock = cache.inc_lock_ref(nodes[device - 1]) if device else None
    cache.evict(EvictParams(num_tokens=(len(nodes) - device) * tree.page))
    if lock is not None:
        cache.dec_lock_ref(nodes[device - 1], lock.to_dec_params())


COMPONENT = {
    Kind.FULL: ComponentType.FULL,
    Kind.SLIDING_WINDOW: ComponentType.SWA,
    Kind.MAMBA: ComponentType.MAMBA,
}


def on_device(cache: Any, node: Any, kind: Kind) -> bool:
    """Whether the node holds its ``kind`` KV (or state) on the device."""
    return cache.tree_core.get_component_device_value(node, COMPONENT[kind]) is not None


def on_host(cache: Any, node: Any, kind: Kind) -> bool:
    """Whether the node holds its ``kind`` KV (or state) on the host only."""
    return bool(cache.tree_core.component_has_host_value_only(node, COMPONENT[kind]))


def check_held(cache: Any, nodes: list[Any], hl: HostLayout) -> None:
    """Unsupported unless SGLang holds exactly the layout: the full KV of pages below
    D on the device and the rest on the host only, window KV and Mamba states where
    the held rows have them, on the device below D and on the host from D on."""
    tree, device = hl.tree, hl.device_blocks
    rows = {Kind.FULL: (True,) * tree.full_blocks, Kind.SLIDING_WINDOW: tree.window_row}
    if tree.mamba_row is not None:
        rows[Kind.MAMBA] = tree.mamba_row
    if not tree.windows:
        del rows[Kind.SLIDING_WINDOW]
    for kind, row in rows.items():
        for j, (node, bit) in enumerate(zip(nodes, row)):
            held = (on_device if j < device else on_host)(cache, node, kind)
            if held != bit:
                raise Unsupported(f"SGLang did not keep {kind.value} page {j} as built")


def served(cache: Any, max_length: int) -> int:
    """The hit SGLang's scheduler serves a request of ``max_length + 1`` tokens: its
    device match, plus what ``init_load_back`` loads back once the load completes."""
    params = SamplingParams(max_new_tokens=1)
    params.normalize(None)
    req = Req("0", "", array("q", range(max_length + 1)), params)
    req.init_next_round_input(cache)
    loaded = 0
    if req.needs_host_load_back():
        loaded, _ = cache.init_load_back(
            InitLoadBackParams(req.best_match_node, req.host_hit_length, req=req)
        )
        cache.ready_to_load_host_cache()
        cache.loading_check(finish_count=len(cache.cache_controller.ack_load_queue))
    return int(req.prefix_len) + int(loaded)


def reused(cache: Any, nodes: list[Any], q: Query, tree: Layout, length: int) -> list[list[int]]:
    """Per group, the blocks SGLang holds on the device where a request of hit
    ``length`` reads them: full KV before it, the window's tokens before it, the
    Mamba state at it."""
    n = length // tree.page
    out = []
    for g in q.groups:
        if g.kind == Kind.FULL:
            out.append([j for j in range(n) if on_device(cache, nodes[j], g.kind)])
        elif g.kind == Kind.SLIDING_WINDOW:
            first = max(0, length - window_before(g)) // tree.page
            out.append([j for j in range(first, n) if on_device(cache, nodes[j], g.kind)])
        else:
            out.append([n - 1] if n and on_device(cache, nodes[n - 1], g.kind) else [])
    return out


class WrongRestore(Exception):
    """SGLang gave a request KV (or a Mamba state) other than its own tokens'."""


def kv_pools(cache: Any) -> tuple[Any, Any]:
    """The device's full KV pool and its window KV pool (None without a window)."""
    kv = cache.token_to_kv_pool_allocator.get_kvcache()
    return getattr(kv, "full_kv_pool", kv), getattr(kv, "swa_kv_pool", None)


def stamp(built: Built) -> None:
    """Write into the device's KV which token each slot holds (token p: p + 1, in
    the first layer's keys, full and window) and into each Mamba state slot the length
    it is the state at, so that what SGLang restores can be told apart."""
    cache = built.cache
    full, window = kv_pools(cache)
    tokens = torch.arange(1, len(built.slots) + 1, dtype=torch.float32)
    full.k_buffer[0][built.slots] = tokens.view(-1, 1, 1)
    if window is not None:
        slots = cache.token_to_kv_pool_allocator.full_to_swa_index_mapping[built.slots]
        window.k_buffer[0][slots[slots > 0]] = tokens[slots > 0].view(-1, 1, 1)
    for end, slot in built.mamba_slots.items():
        cache.req_to_token_pool.mamba_pool.mamba_cache.temporal[:, slot] = float(end)


def check_restored(
    cache: Any, nodes: list[Any], q: Query, length: int, blocks: list[list[int]], page: int
) -> None:
    """:class:`WrongRestore` unless each block SGLang reads at hit ``length`` holds
    its own tokens (:func:`stamp`): full and window KV token by token, the Mamba state
    the one at the block's end."""
    if not length:
        return
    path = cache.path_device_indices(nodes[length // page - 1])[:length]
    for g, reads in zip(q.groups, blocks):
        for j in reads:
            if g.kind == Kind.MAMBA:
                end = (j + 1) * page
                _same(mamba_stamp(cache, nodes[j]), end, f"the Mamba state at {end}")
                continue
            for t in range(j * page, (j + 1) * page):
                _same(kv_stamp(cache, g.kind, path[t]), t + 1, f"{g.kind.value} KV of token {t}")


def kv_stamp(cache: Any, kind: Kind, slot: torch.Tensor) -> int:
    """The stamp in the full (or window) KV that full KV slot ``slot`` reads."""
    full, window = kv_pools(cache)
    if kind == Kind.SLIDING_WINDOW:
        swa = cache.token_to_kv_pool_allocator.full_to_swa_index_mapping[slot]
        return int(window.k_buffer[0][swa, 0, 0])
    return int(full.k_buffer[0][slot, 0, 0])


def mamba_stamp(cache: Any, node: Any) -> int:
    """The stamp in the Mamba state the node holds on the device."""
    state = cache.tree_core.get_component_device_value(node, ComponentType.MAMBA)
    return int(cache.req_to_token_pool.mamba_pool.mamba_cache.temporal[0, state].flatten()[0])


def _same(value: int, expected: int, what: str) -> None:
    if value != expected:
        raise WrongRestore(
            f"SGLang gave the request {what} from elsewhere ({value}, not {expected})"
        )


def hicache_answer(q: Query) -> dict[str, Any]:
    """The ``sglang-hicache`` target: the hit SGLang serves with its host tier
    holding the query's tier, and the blocks it reads on the device.

    >>> sglang_hicache_target({"groups": [{"kind": "full", "block_size": 1},
    ...                                   {"kind": "mamba", "block_size": 1}],
    ...                        "cached": ["11", "01"], "max_length": 4,
    ...                        "tiers": [{"name": "host", "holds": ["full", "mamba"],
    ...                                   "cached": {"0": "1111", "1": "0001"}}]})
    {'length': 4, 'blocks': [[0, 1, 2, 3], [3]]}
    """
    hl = host_layout(q)
    try:
        built = build(hl.tree)
        stamp(built)
        cache = attach(built, hl.tree)
    except (AssertionError, ValueError) as err:
        raise Unsupported(f"SGLang refuses this configuration: {err}") from err
    try:
        return asked(cache, q, hl)
    finally:
        # init_hicache registers an exit hook per cache (unified_radix_cache.py:580),
        # which would keep every cache of a campaign alive.
        atexit.unregister(cache.shutdown)


def asked(cache: Any, q: Query, hl: HostLayout) -> dict[str, Any]:
    """The answer of the cache holding ``q`` with HiCache attached: the host part
    demoted, the state checked, the request served and its KV checked."""
    nodes = page_nodes(cache, hl.tree)
    try:
        demote(cache, nodes, hl.device_blocks, hl.tree)
    except (AssertionError, ValueError) as err:
        raise Unsupported(f"SGLang refuses this configuration: {err}") from err
    check_held(cache, nodes, hl)
    length = served(cache, q.max_length)
    blocks = reused(cache, nodes, q, hl.tree, length)
    check_restored(cache, nodes, q, length, blocks, hl.tree.page)
    return Answer(length, tuple(map(tuple, blocks))).to_json()


sglang_hicache_target = QueryTarget(hicache_answer, HICACHE_CAPABILITIES)
"""The ``sglang-hicache`` target."""
