"""The stateful ``sglang`` target: SGLang's own ``UnifiedRadixCache`` serving a program.

The stateless ``sglang`` target (:mod:`kvhit.engines.sglang.target`) builds one cache per
query. This one lets SGLang 0.5.23 build its cache state itself: one cache on CPU
for the program's groups (:func:`kvhit.engines.sglang.target.new_cache`, ``num_blocks``
pages of KV, half as many window KV pages, as SGLang sizes its window pool smaller
(``swa_full_tokens_ratio``, default 0.8: ``arg_groups/fields/schedule.py:150``,
``model_executor/pool_configurator.py:881``), so that window KV alone runs short too,
and ``num_blocks`` Mamba state slots),
driven with SGLang's own ``Req`` objects through the calls its scheduler makes, so
that matching, locking, allocation, eviction, insertion, the freeing of window KV
that left the window and the Mamba checkpoints are all SGLang's
(a :class:`~kvhit.contract.StatefulEngine`).

``admit(r, tokens)`` does what the scheduler does for a new prompt (file:line in
the sglang 0.5.23 wheel, under ``sglang/srt/``):

1. ``Req.init_next_round_input``: ``match_prefix`` on the first T - 1 tokens
   (``managers/schedule_batch.py:1766``), page-aligned, with the window and Mamba
   validators; for Mamba it copies the matched state into the request's own slot;
2. the admission check of ``PrefillAdder`` (``managers/schedule_policy.py:1395``),
   reduced to this one request: with the matched node locked, the free plus the
   evictable full KV, window KV and Mamba states must cover the request's new pages
   (and two states: its own and the checkpoint); else ``rejected``;
3. ``req.lock = tree_cache.lock(req.last_node)`` (``schedule_policy.py:1690``), then
   ``ScheduleBatch.prepare_for_extend`` (its ``alloc_for_extend`` evicts from the
   tree and allocates the KV slots of tokens L … T-1);
4. ``checkpoint_kv_cache`` (``mem_cache/common.py:271``), which the batch result
   processor calls after a prefill (``scheduler_components/batch_result_processor.py:394``):
   the insert of the request's pages, the window KV freed below the window
   (``swa_evicted_seqlen``), and the Mamba state at T copied into a new slot for the tree;
   then the tables are read off the request's row as the request reads it from then on.
   The insert re-points a page the tree already held at the tree's copy and frees the
   request's own (``unified_radix_cache.py``, ``checkpoint_into_tree``): a row read before
   it names pages the request no longer holds.

``finish`` marks the request finished and calls ``release_kv_cache(checkpoint=True)``
(``common.py:400``). ``snapshot`` reads the tree without touching it: SGLang's
read-only full-KV match (``match_full_device_prefix``) and, per node of its path,
whether the node holds window KV (not a tombstone) or a Mamba state.

Block ids name physical storage, one id space for all groups: full KV page p is p;
window KV page q is ``num_blocks + 1 + q``; Mamba state slot m is
``2 * (num_blocks + 1) + m``. A Mamba group's table holds the state the hit read
at index L - 1 and, at index T - 1, the slot the tree keeps for the state after T
tokens; the other entries are null (SGLang keeps no other state of the request).

Two conventions of this engine: a request that is rejected was still looked up, as
SGLang looks up every waiting request (the lookup refreshes the matched nodes' LRU
time and may split a node); and a request does not decode (its KV is T tokens).

    >>> from kvhit.model.spec import Group
    >>> engine = SglangCacheEngine(EngineConfig((Group("full", 2),), num_blocks=6, alignment=2))
    >>> engine.admit(0, [1, 2, 3])
    Admitted(length=0, reused=((),), tables=((1, 2),), outputs_match=None, moves=())
    >>> engine.snapshot([1, 2, 4])
    Snapshot(cached=((True,),), tiers=())
    >>> engine.admit(1, [1, 2, 4])
    Admitted(length=2, reused=((1,),), tables=((1, 3),), outputs_match=None, moves=())
    >>> engine.finish(0)
"""

from __future__ import annotations

from array import array
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

from kvhit.contract import Admitted, Capabilities, EngineConfig, Rejected, Rule, Snapshot
from kvhit.engines.sglang.layout import TreeGroups, mamba_at_page_one, shape
from kvhit.engines.sglang.target import TREE_CONFIG, Pools, new_cache
from kvhit.errors import Unsupported
from kvhit.model.spec import Kind, Query, window_before

# isort: split
# After kvhit.engines.sglang.target, which prepares SGLang's imports and server args.
from sglang.srt.managers.schedule_batch import FINISH_LENGTH, Req, ScheduleBatch
from sglang.srt.mem_cache.common import checkpoint_kv_cache, release_kv_cache
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
from sglang.srt.sampling.sampling_params import SamplingParams
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

ROWS = 64  # request rows: more running requests are rejected
CONTEXT = 4096  # the longest request; longer ones are rejected
MODEL = SimpleNamespace(vocab_size=1 << 16, is_encoder_decoder=False)  # what a batch reads


def pages(tokens: int, page: int) -> int:
    """How many pages hold ``tokens`` tokens.

    >>> pages(5, 2), pages(4, 2), pages(0, 2)
    (3, 2, 0)
    """
    return -(-tokens // page)


def one_window(q: Query) -> str | None:
    """A drafter's window is not driven here: a request's drafter never runs."""
    windows = sum(g.kind == Kind.SLIDING_WINDOW for g in q.groups)
    return "a drafter window is driven by the stateless sglang target only" if windows > 1 else None


class SglangCacheEngine:
    """SGLang's ``UnifiedRadixCache`` as a :class:`~kvhit.contract.StatefulEngine` (see
    the module docstring)."""

    capabilities: Capabilities = TREE_CONFIG.with_rules(
        Rule("one_window", one_window),
        mamba_at_page_one(
            "SGLang's extra buffer is driven by the stateless sglang target only: its "
            "checkpoints are tracked by the prefill kernels (schedule_batch.py:3105-3121)"
        ),
    )
    """What the stateful ``sglang`` target can be asked: the ``sglang`` target's tree,
    one window, Mamba at page size 1."""

    def __init__(self, config: EngineConfig):
        why = self.capabilities.refusal(config.as_query(1))
        if why is not None:
            raise Unsupported(why)
        self.groups = config.groups
        self.tree: TreeGroups = shape(self.groups)
        self.num_blocks = config.num_blocks
        page = self.tree.page
        self.window_index = self.tree.windows[0] if self.tree.windows else None
        window = self.groups[self.window_index] if self.window_index is not None else None
        windows = (window_before(window) if window is not None else None, 0)
        window_pages = max(1, self.num_blocks // 2)
        pools = Pools(self.num_blocks * page, ROWS, CONTEXT, self.num_blocks, window_pages * page)
        try:
            self.cache = new_cache(page, windows, self.tree.mamba_index is not None, pools)
        except (AssertionError, ValueError) as err:
            raise Unsupported(f"SGLang refuses this configuration: {err}") from err
        self.requests: dict[int, Req] = {}

    # --- ids ------------------------------------------------------------------------

    def window_id(self, swa_slot: int) -> int:
        """The block id of the window KV page holding ``swa_slot``."""
        return self.num_blocks + 1 + swa_slot // self.tree.page

    def state_id(self, state: int) -> int:
        """The block id of Mamba state slot ``state``."""
        return 2 * (self.num_blocks + 1) + state

    # --- snapshot -------------------------------------------------------------------

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """Which full blocks of ``tokens`` SGLang's tree holds, per group, read without
        touching the tree (no LRU update, no split)."""
        core = self.cache.tree_core
        matched, node, _ = core.match_full_device_prefix(RadixKey(array("q", tokens)))
        page = self.tree.page
        rows: list[list[bool]] = [[True] * (matched // page) for _ in self.groups]
        window = [True] * (matched // page)
        states = [False] * matched
        for info in core.collect_path_info([node])[0]:
            end = min(info.path_end, matched)
            if not self.holds(info.node_id, ComponentType.SWA):
                for p in range(info.path_start, end):
                    window[p // page] = False
            if info.path_end <= matched and self.holds(info.node_id, ComponentType.MAMBA):
                states[info.path_end - 1] = True
        if self.window_index is not None:
            rows[self.window_index] = window
        if self.tree.mamba_index is not None:
            rows[self.tree.mamba_index] = states
        return Snapshot(tuple(map(tuple, rows)))

    def holds(self, node: Any, component: Any) -> bool:
        """Whether a tree node holds window KV (``ComponentType.SWA``) or a Mamba
        state (``MAMBA``); False for a component the tree does not have."""
        if component not in self.cache.tree_components:
            return False
        return self.cache.tree_core.get_component_device_value(node, component) is not None

    # --- admit ----------------------------------------------------------------------

    def request(self, request: int, tokens: Sequence[int]) -> Req:
        """An SGLang request of these tokens that stops after its prefill."""
        params = SamplingParams(max_new_tokens=1)
        params.normalize(None)
        return Req(str(request), "", array("q", tokens), params)

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """Look up, lock, allocate, read the tables, and cache, as SGLang's scheduler
        does for a new prompt; Rejected when the pools cannot hold it."""
        if len(tokens) > CONTEXT:
            return Rejected(f"longer than the context ({CONTEXT})")
        req = self.request(request, tokens)
        req.init_next_round_input(self.cache, cow_mamba=False)
        short = self.shortfall(req, len(tokens))
        if short:
            return Rejected(short)
        req.init_next_round_input(self.cache)
        source = req.kv.mamba_cow_src_index  # the prefill's copy consumes it
        req.extend_end = len(tokens)
        req.lock = self.cache.lock(req.last_node)
        batch = ScheduleBatch.init_new(
            [req], self.cache.req_to_token_pool, self.cache.token_to_kv_pool_allocator,
            self.cache, MODEL, False, SpeculativeAlgorithm.NONE,
        )  # fmt: skip
        batch.prepare_for_extend()
        length = req.prefix_len
        checkpoint_kv_cache(req, self.cache)
        reused, tables = self.answer(req, len(tokens), length, source)
        if self.tree.mamba_index is not None:
            tables[self.tree.mamba_index][-1] = self.checkpoint_state(req)
        self.requests[request] = req
        return Admitted(length, tuple(map(tuple, reused)), tuple(map(tuple, tables)))

    def shortfall(self, req: Req, num_tokens: int) -> str:
        """Why the pools cannot hold the request's new pages (and two Mamba states)
        with its matched prefix locked, or ''."""
        cache = self.cache
        allocator = cache.token_to_kv_pool_allocator
        new = (pages(num_tokens, self.tree.page) * self.tree.page) - req.prefix_len
        lock = cache.lock(req.last_node)
        try:
            if self.window_index is not None:
                have = {
                    "full KV": allocator.full_available_size() + cache.full_evictable_size(),
                    "window KV": allocator.swa_available_size() + cache.swa_evictable_size(),
                }
            else:
                have = {"full KV": allocator.available_size() + cache.full_evictable_size()}
            need = dict.fromkeys(have, new)
            if self.tree.mamba_index is not None:
                states = cache.req_to_token_pool.mamba_allocator.available_size()
                have["Mamba states"] = states + cache.mamba_evictable_size()
                need["Mamba states"] = 2
            have["request rows"] = cache.req_to_token_pool.available_size()
            need["request rows"] = 1
        finally:
            cache.unlock(lock)
        short = [
            f"{what} ({have[what]} < {need[what]})" for what in have if have[what] < need[what]
        ]
        return "SGLang cannot hold it: " + ", ".join(short) if short else ""

    def answer(
        self, req: Req, num_tokens: int, length: int, source: Any
    ) -> tuple[list[list[int]], list[list[int | None]]]:
        """The blocks a hit of ``length`` reused and the tables, off the request's row
        as it reads it from now on; ``source`` is the Mamba state the hit copied."""
        page = self.tree.page
        row = self.cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx, :num_tokens]
        starts = row[::page].tolist()
        full = [slot // page for slot in starts]
        tables: list[list[int | None]] = [[] for _ in self.groups]
        reused: list[list[int]] = [[] for _ in self.groups]
        tables[self.tree.full] = list(full)
        reused[self.tree.full] = full[: length // page]
        if self.window_index is not None:
            mapping = self.cache.token_to_kv_pool_allocator.full_to_swa_index_mapping
            window = [int(mapping[slot]) for slot in starts]
            ids = [self.window_id(s) if s > 0 else None for s in window]
            tables[self.window_index] = ids
            first = self.first_window_block(length)
            reused[self.window_index] = [b for b in ids[first : length // page] if b is not None]
        if self.tree.mamba_index is not None:
            states: list[int | None] = [None] * num_tokens
            if length and source is not None:
                state = self.state_id(int(source.view(-1)[0]))
                states[length - 1] = state
                reused[self.tree.mamba_index] = [state]
            tables[self.tree.mamba_index] = states
        return reused, tables

    def first_window_block(self, length: int) -> int:
        """The first block SGLang's window reads at a hit of ``length``: the
        ``sliding_window_size`` tokens before it."""
        window = self.cache.sliding_window_size
        return max(0, length - window) // self.tree.page

    def checkpoint_state(self, req: Req) -> int | None:
        """The block id of the Mamba state the tree keeps after the request's tokens."""
        value = self.cache.tree_core.get_component_device_value(req.last_node, ComponentType.MAMBA)
        return None if value is None else self.state_id(int(value.view(-1)[0]))

    # --- finish ---------------------------------------------------------------------

    def finish(self, request: int) -> None:
        """The request is done: SGLang caches it and frees what it held."""
        req = self.requests.pop(request)
        req.finished_reason = FINISH_LENGTH(length=0)
        release_kv_cache(req, self.cache, checkpoint=True)
