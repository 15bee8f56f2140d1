"""The coordinator: one request's blocks across every group, and the cache lookup.

:meth:`Coordinator.find_longest_cache_hit` is vectorized. What does not depend on the
cache is computed when the request arrives, as engines do with block hashes: its
block hash keys, and per group the staged ``valid`` of every candidate length
(:func:`kvhit.impl.formula.torch_plan`), kept per request shape by :func:`lookup_plan`. A lookup then
does, per group, one indexing operation to find which of the request's blocks are
cached, one cumulative sum of the misses, and the plan's two gathers, comparison and
select; one reduction takes the longest candidate valid in every group. The only
Python loop is over the groups.

    >>> from kvhit.model.spec import Group
    >>> coord = Coordinator([Group("full", 2), Group("sliding_window", 2, window=3)], 16)
    >>> req = coord.request(list(range(9)))
    >>> coord.preload(req, [[True, True, True, False], [False, True, False, True]])
    >>> hit = coord.find_longest_cache_hit(req, max_length=8)
    >>> hit.length, hit.indices(), hit.blocks
    (4, [[0, 1], [1]], ((1, 2), (4,)))
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

import torch

from kvhit.impl.formula import Plan, miss_sums, stack, torch_plan, valid_at
from kvhit.impl.hashing import ROOT, BlockHasher
from kvhit.impl.managers import manager_for
from kvhit.impl.pool import BlockPool
from kvhit.model.spec import Group, Query, default_alignment, reused_range


@dataclass
class Request:
    """A request's tokens, its block hashes per group, and (once allocated) its block
    table per group.

    ``keys[g]`` is ``hashes[g]`` followed by :data:`~kvhit.impl.hashing.ROOT`, which
    is never cached: the lookup key of every block an eagle group may look at (block
    T // b included). ``key_bound`` exceeds every hash id in them.
    """

    tokens: list[int]
    hashes: list[torch.Tensor]
    tables: list[list[int]]
    keys: list[torch.Tensor]
    key_bound: int
    holding: bool = True
    """Whether the request still holds its hashes (until :meth:`Coordinator.free`)."""

    @property
    def num_tokens(self) -> int:
        """How many tokens the request has."""
        return len(self.tokens)


class CacheHit:
    """A hit length and, per group, the cached blocks reused: the physical block ids
    of the block indices ``first[g]`` onward.

    The lookup hands the ids over as tensor views; :attr:`blocks` turns them into
    Python ints the first time it is read.
    """

    def __init__(
        self,
        length: int,
        first: tuple[int, ...],
        reused: Sequence[torch.Tensor | Sequence[int]],
    ):
        self.length = length
        self.first = first
        self.reused = tuple(reused)

    @cached_property
    def blocks(self) -> tuple[tuple[int, ...], ...]:
        """Each group's reused physical block ids."""
        return tuple(
            tuple(b.tolist()) if isinstance(b, torch.Tensor) else tuple(b) for b in self.reused
        )

    def indices(self) -> list[list[int]]:
        """Each group's reused block indices (the target protocol's ``blocks``)."""
        return [list(range(f, f + len(b))) for f, b in zip(self.first, self.reused)]


@dataclass(frozen=True)
class LookupPlan:
    """Everything a lookup needs that does not depend on the cache: the candidate
    lengths, and every group's staged ``valid`` at them, stacked (:func:`stack`)."""

    lengths: torch.Tensor
    sizes: tuple[int, ...]
    """Per group, how many block keys the plan reads (through block top // b)."""
    plan: Plan


@lru_cache(maxsize=64)
def lookup_plan(groups: tuple[Group, ...], alignment: int, top: int, num_tokens: int) -> LookupPlan:
    """The plan of a lookup of at most ``top`` tokens for a request of ``num_tokens``."""
    lengths = torch.arange(0, top + 1, alignment)
    sizes = tuple(top // g.block_size + 1 for g in groups)
    # Groups with the same spec (models split layers of one kind into equal groups)
    # share one plan.
    plans = {g: torch_plan(g, lengths, num_tokens) for g in dict.fromkeys(groups)}
    return LookupPlan(lengths, sizes, stack([plans[g] for g in groups], sizes))


class Coordinator:
    """Every group's manager over one shared block pool."""

    def __init__(self, groups: Sequence[Group], num_blocks: int, alignment: int | None = None):
        self.groups = tuple(groups)
        self.alignment = alignment or default_alignment(self.groups)
        self.hashers = {g.block_size: BlockHasher(g.block_size) for g in self.groups}
        group_hashers = [self.hashers[g.block_size] for g in self.groups]
        self.pool = BlockPool(num_blocks, len(self.groups), group_hashers)
        self.managers = [manager_for(g, i, self.pool) for i, g in enumerate(self.groups)]

    def request(self, tokens: Sequence[int]) -> Request:
        """A new request, with its block hashes and lookup keys for every group; it
        holds its hashes until :meth:`free`."""
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        by_size = {b: hasher.hashes(tokens) for b, hasher in self.hashers.items()}
        keys_by_size = {b: torch.cat([h, torch.tensor([ROOT])]) for b, h in by_size.items()}
        hashes = [by_size[g.block_size] for g in self.groups]
        keys = [keys_by_size[g.block_size] for g in self.groups]
        key_bound = max(h.bound for h in self.hashers.values())
        self.pool.reserve(key_bound)
        # Like the hashes, the plan of the usual lookup (max_length = T - 1) is made
        # when the request arrives.
        self.plan_for(len(tokens), len(tokens) - 1)
        return Request(tokens, hashes, [[] for _ in self.groups], keys, key_bound)

    def plan_for(self, num_tokens: int, max_length: int) -> LookupPlan:
        """The plan of a lookup of at most ``max_length`` tokens for a request of
        ``num_tokens`` (a hit always leaves the request at least one token to compute)."""
        top = min(max_length, num_tokens - 1) // self.alignment * self.alignment
        return lookup_plan(self.groups, self.alignment, top, num_tokens)

    def cached_ids(self, request: Request) -> list[torch.Tensor]:
        """Per group, the cached block holding each of the request's blocks, or -1."""
        return [self.pool.lookup(i, h) for i, h in enumerate(request.hashes)]

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        """The longest hit of at most ``max_length`` tokens every group can serve."""
        plan = self.plan_for(request.num_tokens, max_length)
        ids = [
            self.pool.lookup(i, keys[:size], request.key_bound)
            for i, (keys, size) in enumerate(zip(request.keys, plan.sizes))
        ]
        # amin: whether every group can serve each candidate (all(0) is slower on bools).
        ok = valid_at(plan.plan, miss_sums(torch.cat(ids) < 0)).amin(0)
        length = int(torch.where(ok, plan.lengths, 0).max())
        first, reused = [], []
        for g, group_ids in zip(self.groups, ids):
            lo, hi = reused_range(g, length) if length else (0, 0)
            first.append(lo)
            reused.append(group_ids[lo:hi])
        return CacheHit(length, tuple(first), reused)

    def snapshot(self, request: Request, max_length: int | None = None) -> dict[str, Any]:
        """The cache state the request sees, as a normalized protocol query."""
        rows = tuple(tuple((i >= 0).tolist()) for i in self.cached_ids(request))
        if max_length is None:
            max_length = request.num_tokens - 1
        return Query(self.groups, rows, max_length, request.num_tokens, self.alignment).to_json()

    def allocate(self, request: Request, hit: CacheHit) -> None:
        """Give the request its block tables: the hit's blocks, then new ones.

        Every group's hit blocks are taken before any group's new blocks: a new block
        comes from the free queue, which also holds the cached blocks nobody runs on,
        and taking one of another group's hit blocks there would overwrite what that
        group is about to reuse.
        """
        for blocks in hit.blocks:
            self.pool.touch(blocks)
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
        """The request is finished: free all its blocks and release its hashes."""
        for m, table in zip(self.managers, request.tables):
            m.free(table)
        if request.holding:
            request.holding = False
            by_size = {g.block_size: hashes for g, hashes in zip(self.groups, request.hashes)}
            for b, hashes in by_size.items():
                self.hashers[b].release(hashes)

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
