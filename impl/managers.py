"""One manager per attention kind, behind one interface, chosen by a registry.

A manager keeps one group's part of a running request: its block table (a list of
physical block ids, the null block where the request holds nothing). It allocates
the blocks a request needs after its hit, caches full blocks after prefill, drops
the blocks no later token will read (as engines do: this is what leaves holes in
real caches), and frees the rest when the request ends.

The kinds differ only in :meth:`GroupManager.first_kept`: the first block the next
token still reads.

    >>> from kvhit.model.spec import Group, Kind, window_before
    >>> pool = BlockPool(num_blocks=8, num_groups=1)
    >>> sw = manager_for(Group("sliding_window", block_size=2, window=3), 0, pool)
    >>> sw.first_kept(num_computed=7)
    2
    >>> table = sw.allocate(reused=[], first=0, num_tokens=7)
    >>> table
    [1, 2, 3, 4]
    >>> sw.drop_skipped(table, num_computed=7)
    >>> table, pool.ref_cnt[1:5]
    ([0, 0, 3, 4], [0, 0, 1, 1])
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from kvhit.impl.pool import NULL_BLOCK, BlockPool
from kvhit.model.spec import Group, Kind, window_before


class GroupManager(ABC):
    """The blocks of one KV cache group (see the module docstring)."""

    def __init__(self, group: Group, index: int, pool: BlockPool):
        self.group = group
        self.index = index
        self.pool = pool

    @abstractmethod
    def first_kept(self, num_computed: int) -> int:
        """The first block the token at position ``num_computed`` reads."""

    def allocate(self, reused: Sequence[int], first: int, num_tokens: int) -> list[int]:
        """The block table of a request of ``num_tokens`` tokens that reuses the cached
        blocks ``reused`` (already touched: :meth:`BlockPool.touch`) from block index
        ``first`` on: null blocks before them, new blocks after them."""
        table = [NULL_BLOCK] * first + list(reused)
        self.extend(table, num_tokens)
        return table

    def extend(self, table: list[int], num_tokens: int) -> None:
        """Append new blocks to ``table`` until it holds ``num_tokens`` tokens."""
        count = -(-num_tokens // self.group.block_size)
        table.extend(self.pool.allocate() for _ in range(count - len(table)))

    def cache_full_blocks(
        self, table: list[int], keys: torch.Tensor, per_block: int, start: int = 0
    ) -> None:
        """Cache the request's blocks from block index ``start`` on (those it holds from
        their first token), each under the keys of its units (``keys``: one per unit
        that has a key, ``per_block`` units a block); a partially filled block is
        cached up to its last keyed unit. Already cached blocks are kept
        (:meth:`BlockPool.cache`)."""
        ids = keys.tolist()
        for j in range(start, len(table)):
            chain = ids[j * per_block : (j + 1) * per_block]
            if not chain:
                return
            if table[j] != NULL_BLOCK:
                self.pool.cache(table[j], self.index, chain, self.findable(chain))

    def findable(self, chain: list[int]) -> list[int]:
        """The keys a block cached under ``chain`` is found through: every unit it
        holds (attention)."""
        return chain

    def drop_skipped(self, table: list[int], num_computed: int) -> None:
        """Free the blocks before :meth:`first_kept`; they stay cached until evicted."""
        first = min(self.first_kept(num_computed), len(table))
        self.pool.free(table[:first])
        table[:first] = [NULL_BLOCK] * first

    def free(self, table: list[int]) -> None:
        """Free every block of a finished request, last block first, so a request's
        tail is evicted before the prefix other requests share."""
        self.pool.free(reversed(table))
        table[:] = []


class FullManager(GroupManager):
    """Full attention reads every earlier block."""

    def first_kept(self, num_computed: int) -> int:
        return 0


class SlidingWindowManager(GroupManager):
    """The token at p reads from p - t on (t = w - 1 for an inclusive window of w)."""

    def first_kept(self, num_computed: int) -> int:
        return max(0, num_computed - window_before(self.group)) // self.group.block_size


class ChunkedLocalManager(GroupManager):
    """The token at p reads from the start of its chunk on."""

    def first_kept(self, num_computed: int) -> int:
        return num_computed // self.group.chunk * self.group.chunk // self.group.block_size


class MambaManager(GroupManager):
    """The token at p reads only the state at the last block boundary before it. A
    block holds one state, at its end or (partially filled) at its last keyed unit,
    so it is found through that unit's key only."""

    def findable(self, chain: list[int]) -> list[int]:
        return chain[-1:]

    def first_kept(self, num_computed: int) -> int:
        return max(0, num_computed // self.group.block_size - 1)


MANAGERS: dict[Kind, type[GroupManager]] = {
    Kind.FULL: FullManager,
    Kind.SLIDING_WINDOW: SlidingWindowManager,
    Kind.CHUNKED_LOCAL: ChunkedLocalManager,
    Kind.MAMBA: MambaManager,
}
"""Each kind's manager class."""


def manager_for(group: Group, index: int, pool: BlockPool) -> GroupManager:
    """The manager for ``group`` (the ``index``-th group), by its kind."""
    return MANAGERS[group.kind](group, index, pool)
