"""The stateful SGLang engine with one bug each, for the tests: the stateful gate
must catch every one (``kvhit gate --stateful --target broken_sglang:NAME``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvhit.contract import Admitted, EngineConfig, Rejected
from kvhit.engines.sglang.cache import SglangCacheEngine


class WorkingStateReported(SglangCacheEngine):
    """Reports the request's own Mamba slot as the state after its tokens, not the
    copy SGLang's tree keeps: the tree's copy is then a block no table ever showed
    being written."""

    def checkpoint_state(self, req: Any) -> int | None:
        return self.state_id(int(req.kv.mamba_pool_idx))


class WindowFreedBehindTheTree(SglangCacheEngine):
    """After each prefill, frees the window KV of every token the window no longer
    reads, including tokens the tree still holds window KV for (the tree is not
    told): a later request is given those window pages while the tree still finds
    them."""

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        answer = super().admit(request, tokens)
        req = self.requests.get(request)
        if isinstance(answer, Admitted) and req is not None and self.window_index is not None:
            allocator = self.cache.token_to_kv_pool_allocator
            row = self.cache.req_to_token_pool.req_to_token[req.kv.req_pool_idx]
            stale = len(tokens) - self.cache.sliding_window_size
            stale -= stale % self.tree.page
            slots = row[: max(0, stale)]
            held = slots[allocator.full_to_swa_index_mapping[slots] > 0]
            allocator.free_swa(held.to(torch.int64))
        return answer


def working_state_reported(config: EngineConfig) -> SglangCacheEngine:
    """A factory for :class:`WorkingStateReported`."""
    return WorkingStateReported(config)


def window_freed_behind_the_tree(config: EngineConfig) -> SglangCacheEngine:
    """A factory for :class:`WindowFreedBehindTheTree`."""
    return WindowFreedBehindTheTree(config)
