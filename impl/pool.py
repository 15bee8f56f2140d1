"""The block pool: physical blocks, reference counts, the prefix cache and eviction.

Block 0 is the *null block*: it stands in a block table for a block a request does
not hold (one that left its window), is never cached and never freed. Every other
block is either in use (reference count > 0) or in the free queue. The free queue is
in LRU order: a freed block goes to the back, a new block comes from the front. A
freed block keeps its hash, so it can still be hit, until it is taken for new data:
that is eviction.

Each group has its own table from hash id to block id, a tensor, so the lookup asks
for all of a request's blocks in one indexing operation. When the pool is given each
group's :class:`~kvhit.impl.hashing.BlockHasher`, a cached block holds its hash id
there, so an evicted block's key is released.

A block is cached under a *chain*: the keys of its hash units, from the block's first
unit to the last one it holds (one key per block without a hash unit; with one, a
partially filled block's chain stops at its fine boundary). Attention is found
through every key of its chain, a Mamba state only through the last (the unit it is
the state at). The chain's first key is the block's *anchor*: among the blocks of
one prefix at one block position, at most one is cached, so what a request finds of
a block is always one block's chain (a prefix of its units, or one state), which
is what a protocol row can say (``true``, ``{"upto": p}``, ``false``).

    >>> pool = BlockPool(num_blocks=3, num_groups=1)
    >>> a, b = pool.allocate(), pool.allocate()
    >>> pool.cache(a, group=0, chain=[5])
    True
    >>> pool.free([a, b])
    >>> pool.lookup(0, torch.tensor([5, 6])).tolist()
    [1, -1]
    >>> pool.allocate(), pool.lookup(0, torch.tensor([5])).tolist()
    (1, [-1])
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from kvhit.impl.hashing import BlockHasher

NULL_BLOCK = 0


@dataclass(frozen=True)
class Entry:
    """How a block is cached: in ``group``, under the keys ``chain`` (its units from
    the block's first on), found through ``findable`` (all of them, or the last)."""

    group: int
    chain: tuple[int, ...]
    findable: tuple[int, ...]


class PoolExhausted(RuntimeError):
    """No free block is left: every block is in use by a running request."""


class BlockPool:
    """Physical blocks shared by every group (see the module docstring)."""

    def __init__(
        self, num_blocks: int, num_groups: int, hashers: Sequence[BlockHasher] | None = None
    ):
        if num_blocks < 1:
            raise ValueError("a pool needs at least the null block")
        self.hashers = hashers
        self.ref_cnt = [0] * num_blocks
        self.key: list[Entry | None] = [None] * num_blocks
        self.anchors: list[dict[int, tuple[int, tuple[int, ...]]]] = [{} for _ in range(num_groups)]
        """Per group, anchor key -> the block cached there and its chain."""
        self.free_queue: OrderedDict[int, None] = OrderedDict.fromkeys(range(1, num_blocks))
        self.tables = [torch.full((0,), -1, dtype=torch.int64) for _ in range(num_groups)]
        self.on_evict: Callable[[int, Entry], None] | None = None
        """Called with a cached block and its entry just before :meth:`allocate` evicts
        it (an offload store spills it there: :mod:`kvhit.impl.offload`)."""

    def lookup(self, group: int, hashes: torch.Tensor, bound: int | None = None) -> torch.Tensor:
        """The cached block holding each hash id of ``group``, or -1 (vectorized).

        ``bound``, when the caller knows one, exceeds every id in ``hashes``: if the
        table already covers it (:meth:`reserve`), the lookup is a single gather.
        """
        table = self.tables[group]
        if bound is not None and bound <= table.numel():
            return table.index_select(0, hashes)
        known = hashes < table.numel()
        found = table[torch.where(known, hashes, 0)] if table.numel() else hashes
        return torch.where(known, found, -1)

    def reserve(self, bound: int) -> None:
        """Grow every group's table to cover hash ids below ``bound``."""
        for group, table in enumerate(self.tables):
            if table.numel() < bound:
                grown = torch.full((max(2 * table.numel(), bound),), -1, dtype=torch.int64)
                grown[: table.numel()] = table
                self.tables[group] = grown

    def allocate(self) -> int:
        """Take the least recently freed block, evicting its cached data if any."""
        if not self.free_queue:
            raise PoolExhausted("every block is in use")
        block, _ = self.free_queue.popitem(last=False)
        entry = self.key[block]
        if entry is not None and self.on_evict is not None:
            self.on_evict(block, entry)
        self.uncache(block)
        self.ref_cnt[block] = 1
        return block

    def touch(self, blocks: Iterable[int]) -> None:
        """Take a reference to cached blocks a request reuses."""
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            if self.ref_cnt[block] == 0:
                del self.free_queue[block]
            self.ref_cnt[block] += 1

    def free(self, blocks: Iterable[int]) -> None:
        """Drop a reference; a block nobody holds goes to the back of the free queue."""
        for block in blocks:
            if block == NULL_BLOCK:
                continue
            self.ref_cnt[block] -= 1
            if self.ref_cnt[block] == 0:
                self.free_queue[block] = None

    def cache(
        self,
        block: int,
        group: int,
        chain: Sequence[int],
        findable: Sequence[int] | None = None,
    ) -> bool:
        """Make ``block`` the cached copy of the units ``chain`` (their keys, from the
        block's first unit on) in ``group``, found through ``findable`` (default: every
        key of the chain).

        Returns False (and caches nothing) when a block of the same anchor is cached
        that this one does not extend: the earlier copy stays the one that is hit. A
        cached block whose chain is a strict prefix of this one's (a partially filled
        block this one completes further) gives way to it.
        """
        chain = tuple(chain)
        if not self.can_cache(group, chain):
            return False
        anchored = self.anchors[group].get(chain[0])
        if anchored is not None:
            self.uncache(anchored[0])
        entry = Entry(group, chain, chain if findable is None else tuple(findable))
        self.reserve(max(entry.findable) + 1)
        table = self.tables[group]
        for hash_id in entry.findable:
            table[hash_id] = block
        self.anchors[group][chain[0]] = (block, chain)
        self.key[block] = entry
        if self.hashers is not None:
            self.hashers[group].hold(chain[-1])
        return True

    def can_cache(self, group: int, chain: Sequence[int]) -> bool:
        """Whether :meth:`cache` would cache a block under ``chain`` in ``group``: no
        block of its anchor is cached, or only one whose chain this one extends."""
        anchored = self.anchors[group].get(chain[0])
        if anchored is None:
            return True
        theirs = anchored[1]
        return len(theirs) < len(chain) and theirs == tuple(chain[: len(theirs)])

    def uncache(self, block: int) -> None:
        """Forget the cached data of ``block`` (eviction)."""
        entry = self.key[block]
        if entry is not None:
            table = self.tables[entry.group]
            for hash_id in entry.findable:
                table[hash_id] = -1
            del self.anchors[entry.group][entry.chain[0]]
            self.key[block] = None
            if self.hashers is not None:
                self.hashers[entry.group].drop(entry.chain[-1])
