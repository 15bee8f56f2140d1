"""An engine: the coordinator and the tiny model serving requests one after another.

:meth:`Engine.serve` does what a serving engine does for a prompt: look up the cache,
allocate, prefill from the hit reading the past through the paged cache, cache the
new full blocks, drop the blocks that left a window or chunk, and free the request.

    >>> from kvhit.model.spec import Group
    >>> engine = Engine([Group("full", 2), Group("sliding_window", 2, window=3)], num_blocks=12)
    >>> engine.serve([1, 2, 3, 4, 5, 6, 7]).hit.length
    0
    >>> served = engine.serve([1, 2, 3, 4, 5, 6, 9])
    >>> served.hit.length, served.prefill.reads
    (6, [[0, 1, 2], [2]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvhit.impl.coordinator import CacheHit, Coordinator
from kvhit.impl.pool import NULL_BLOCK
from kvhit.impl.tiny_model import PagedStore, Prefill, TinyHybrid
from kvhit.model.spec import Group


@dataclass
class Served:
    """One served request: the cache state its lookup saw (a protocol query), the hit,
    and the prefill from the hit."""

    snapshot: dict[str, Any]
    hit: CacheHit
    prefill: Prefill


class Engine:
    """A block pool, its coordinator, the KV store and the model over the same groups."""

    def __init__(
        self,
        groups: Sequence[Group],
        num_blocks: int,
        alignment: int | None = None,
        seed: int = 0,
        dim: int = 8,
    ):
        self.coord = Coordinator(groups, num_blocks, alignment)
        self.model = TinyHybrid(groups, seed, dim)
        self.store = PagedStore(groups, num_blocks, dim)

    def serve(self, tokens: Sequence[int]) -> Served:
        """Serve a prompt from its longest cache hit (at most T - 1 tokens)."""
        request = self.coord.request(tokens)
        snapshot = self.coord.snapshot(request)
        hit = self.coord.find_longest_cache_hit(request, request.num_tokens - 1)
        self.coord.allocate(request, hit)
        result = self.model.prefill(request.tokens, hit.length, request.tables, self.store)
        self.store.write(request.tables, result)
        self.coord.cache_full_blocks(request)
        self.coord.drop_skipped(request)
        self.coord.free(request)
        return Served(snapshot, hit, result)

    def serve_from(self, tokens: Sequence[int], length: int) -> Prefill:
        """Prefill from ``length`` whatever the cache holds, without changing it: every
        block below ``length`` is its cached copy or, when not cached, the null block."""
        request = self.coord.request(tokens)
        tables = [
            torch.where(ids >= 0, ids, NULL_BLOCK).tolist()
            for ids in self.coord.cached_ids(request)
        ]
        self.coord.free(request)
        return self.model.prefill(request.tokens, length, tables, self.store)

    def scratch(self, tokens: Sequence[int]) -> torch.Tensor:
        """The logits of every token computed from scratch, reading no cache."""
        return self.model.prefill(list(tokens), 0, [], self.store).logits
