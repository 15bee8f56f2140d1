"""The coordinator: one request's blocks across every group, and the cache lookup.

:meth:`Coordinator.find_longest_cache_hit` is vectorized: per group, one indexing
operation finds which of the request's block hashes are cached, one cumulative sum
turns that into prefix sums, the spec's ``valid`` evaluates every candidate length at
once on them (:mod:`kvhit.impl.formula`), and one reduction takes the longest
candidate valid in every group. The only Python loop is over the groups.

    >>> from kvhit.model.spec import Group
    >>> coord = Coordinator([Group("full", 2), Group("sliding_window", 2, window=3)], 16)
    >>> req = coord.request(list(range(9)))
    >>> coord.preload(req, [[True, True, True, False], [False, True, False, True]])
    >>> hit = coord.find_longest_cache_hit(req, max_length=8)
    >>> hit.length, hit.indices()
    (4, [[0, 1], [1]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from kvhit.impl.formula import prefix_sums, valid_lengths
from kvhit.impl.hashing import BlockHasher
from kvhit.impl.managers import manager_for
from kvhit.impl.pool import BlockPool
from kvhit.model.spec import Group, Query, default_alignment, reused_range


@dataclass
class Request:
    """A request's tokens, its block hashes per group, and (once allocated) its block
    table per group."""

    tokens: list[int]
    hashes: list[torch.Tensor]
    tables: list[list[int]]

    @property
    def num_tokens(self) -> int:
        """How many tokens the request has."""
        return len(self.tokens)


@dataclass(frozen=True)
class CacheHit:
    """A hit length and, per group, the cached blocks reused: the physical block ids
    of the block indices ``first[g]`` onward."""

    length: int
    first: tuple[int, ...]
    blocks: tuple[tuple[int, ...], ...]

    def indices(self) -> list[list[int]]:
        """Each group's reused block indices (the target protocol's ``blocks``)."""
        return [list(range(f, f + len(b))) for f, b in zip(self.first, self.blocks)]


class Coordinator:
    """Every group's manager over one shared block pool."""

    def __init__(self, groups: Sequence[Group], num_blocks: int, alignment: int | None = None):
        self.groups = tuple(groups)
        self.alignment = alignment or default_alignment(self.groups)
        self.pool = BlockPool(num_blocks, len(self.groups))
        self.managers = [manager_for(g, i, self.pool) for i, g in enumerate(self.groups)]
        self.hashers = {g.block_size: BlockHasher(g.block_size) for g in self.groups}

    def request(self, tokens: Sequence[int]) -> Request:
        """A new request, with its block hashes for every group."""
        tokens = list(tokens)
        hashes = [self.hashers[g.block_size].hashes(tokens) for g in self.groups]
        return Request(tokens, hashes, [[] for _ in self.groups])

    def cached_ids(self, request: Request) -> list[torch.Tensor]:
        """Per group, the cached block holding each of the request's blocks, or -1."""
        return [self.pool.lookup(i, h) for i, h in enumerate(request.hashes)]

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        """The longest hit of at most ``max_length`` tokens every group can serve."""
        top = max_length // self.alignment * self.alignment
        lengths = torch.arange(0, top + 1, self.alignment)
        ok = torch.ones_like(lengths, dtype=torch.bool)
        ids = self.cached_ids(request)
        for g, group_ids in zip(self.groups, ids):
            # Room for block top/b, the extra block an eagle group looks at.
            prefix = prefix_sums(group_ids >= 0, top // g.block_size + 1)
            ok &= valid_lengths(g, prefix, lengths, request.num_tokens)
        length = int(torch.where(ok, lengths, 0).max())
        first, blocks = [], []
        for g, group_ids in zip(self.groups, ids):
            lo, hi = reused_range(g, length) if length else (0, 0)
            first.append(lo)
            blocks.append(tuple(group_ids[lo:hi].tolist()))
        return CacheHit(length, tuple(first), tuple(blocks))

    def snapshot(self, request: Request, max_length: int | None = None) -> dict[str, Any]:
        """The cache state the request sees, as a normalized protocol query."""
        rows = tuple(tuple((i >= 0).tolist()) for i in self.cached_ids(request))
        if max_length is None:
            max_length = request.num_tokens - 1
        return Query(self.groups, rows, max_length, request.num_tokens, self.alignment).to_json()

    def allocate(self, request: Request, hit: CacheHit) -> None:
        """Give the request its block tables: the hit's blocks, then new ones."""
        request.tables = [
            m.allocate(blocks, first, request.num_tokens)
            for m, first, blocks in zip(self.managers, hit.first, hit.blocks)
        ]

    def cache_full_blocks(self, request: Request) -> None:
        """After prefill: cache every full block of the request."""
        for m, table, hashes in zip(self.managers, request.tables, request.hashes):
            m.cache_full_blocks(table, hashes)

    def drop_skipped(self, request: Request) -> None:
        """Free the blocks no token after the request's last one reads."""
        for m, table in zip(self.managers, request.tables):
            m.drop_skipped(table, request.num_tokens)

    def free(self, request: Request) -> None:
        """The request is finished: free all its blocks."""
        for m, table in zip(self.managers, request.tables):
            m.free(table)

    def preload(self, request: Request, rows: Sequence[Sequence[bool]]) -> None:
        """Make the pool hold exactly the blocks ``rows[g][j]`` of the request's blocks,
        cached and free (block j of a row past the request's full blocks is ignored)."""
        held = []
        for i, (row, hashes) in enumerate(zip(rows, request.hashes)):
            for j, hash_id in enumerate(hashes[: len(row)].tolist()):
                if row[j]:
                    block = self.pool.allocate()
                    self.pool.cache(block, i, hash_id)
                    held.append(block)
        self.pool.free(held)
