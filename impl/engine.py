"""An engine: the coordinator and the tiny model serving requests.

:meth:`Engine.admit` does what a serving engine does for a new prompt: look up the
cache, allocate, prefill from the hit reading the past through the paged cache, cache
the new full blocks and drop the blocks that left a window or chunk; the request
keeps its other blocks until :meth:`Engine.finish`. :meth:`Engine.serve` is both, one
request after another.

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

from kvhit.impl.coordinator import CacheHit, Coordinator, Request
from kvhit.impl.offload import OffloadStore, Transfers
from kvhit.impl.pool import NULL_BLOCK, BlockPool, PoolExhausted
from kvhit.impl.tiny_model import PagedStore, Prefill, TinyHybrid
from kvhit.model.spec import Group, Kind


@dataclass
class Served:
    """One served request: the cache state its lookup saw (a protocol query), the hit,
    and the prefill from the hit."""

    snapshot: dict[str, Any]
    hit: CacheHit
    prefill: Prefill
    tables: list[list[int]]
    """The request's block tables as the prefill used them (before the drops)."""


class Engine:
    """A block pool, its coordinator, the KV store and the model over the same groups."""

    def __init__(
        self,
        groups: Sequence[Group],
        num_blocks: int,
        alignment: int | None = None,
        seed: int = 0,
        dim: int = 8,
        hash_unit: int | None = None,
    ):
        self.coord = Coordinator(groups, num_blocks, alignment, hash_unit)
        self.model = TinyHybrid(groups, seed, dim, units=self.coord.units)
        self.store = PagedStore(groups, num_blocks, dim)
        self.transfers = Transfers(self.store)
        self.coord.transfer = self.transfers

    def add_store(self, name: str, holds: frozenset[Kind], num_slots: int) -> OffloadStore:
        """An offload store of ``num_slots`` slots for the groups of the kinds it holds,
        with its data (:meth:`Coordinator.add_store`)."""
        self.transfers.stores.append(PagedStore(self.model.groups, num_slots + 1, self.model.dim))
        return self.coord.add_store(name, holds, num_slots)

    def admit(self, tokens: Sequence[int]) -> tuple[Request, Served] | None:
        """Admit a prompt and prefill it from its longest cache hit (at most T - 1
        tokens); None, with nothing changed, when the pool has too few free blocks."""
        request = self.coord.request(tokens)
        snapshot = self.coord.snapshot(request)
        hit = self.coord.find_longest_cache_hit(request, request.num_tokens - 1)
        if fresh_blocks(self.coord, request, hit) > free_blocks(self.coord.pool, hit):
            return None
        hit = self.coord.allocate(request, hit, self.store.copy)
        tables = [list(table) for table in request.tables]
        result = self.model.prefill(request.tokens, hit.length, request.tables, self.store)
        self.store.write(request.tables, result)
        self.coord.cache_full_blocks(request)
        self.coord.drop_skipped(request)
        return request, Served(snapshot, hit, result, tables)

    def finish(self, request: Request) -> None:
        """The request is done: free its blocks (they stay cached until evicted)."""
        self.coord.free(request)

    def serve(self, tokens: Sequence[int]) -> Served:
        """Admit a prompt, then finish it; :class:`PoolExhausted` if it does not fit."""
        admitted = self.admit(tokens)
        if admitted is None:
            raise PoolExhausted("the pool cannot hold this request")
        request, served = admitted
        self.finish(request)
        return served

    def serve_from(self, tokens: Sequence[int], length: int) -> Prefill:
        """Prefill from ``length`` whatever the cache holds, without changing it: every
        block below ``length`` is its cached copy (in the pool, else in an offload
        store) or, when held nowhere, the null block (:meth:`Coordinator.tables_at`)."""
        request = self.coord.request(tokens)
        tables = self.coord.tables_at(request, length)
        self.coord.free(request)
        return self.model.prefill(request.tokens, length, tables, self.transfers.view())

    def scratch(self, tokens: Sequence[int]) -> torch.Tensor:
        """The logits of every token computed from scratch, reading no cache."""
        return self.model.prefill(list(tokens), 0, [], self.store).logits


def fresh_blocks(
    coord: Coordinator, request: Request, hit: CacheHit, upto: int | None = None
) -> int:
    """How many new blocks the request needs after its hit to hold its tokens (with
    ``upto``, its first ``upto``), over every group (a block the hit ends inside is
    copied into a new one, a block only a store holds is restored into one)."""
    num_tokens = request.num_tokens if upto is None else upto
    return len(hit.restores()) + sum(
        -(-num_tokens // g.block_size)
        - first
        - len(blocks)
        + bool(hit.length % g.block_size and blocks)
        for g, first, blocks in zip(coord.groups, hit.first, hit.blocks)
    )


def free_blocks(pool: BlockPool, hit: CacheHit) -> int:
    """The free blocks left once the hit's blocks are taken out of the free queue."""
    # A block only a store holds (-1) is restored into a new block (fresh_blocks).
    reused = {b for blocks in hit.blocks for b in blocks if b > NULL_BLOCK}
    return len(pool.free_queue) - sum(1 for b in reused if pool.ref_cnt[b] == 0)
