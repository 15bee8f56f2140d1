"""The offload tier: stores outside the pool that evicted blocks spill to and a later
lookup restores from (docs/design.md §4).

An :class:`OffloadStore` keeps blocks the way the pool does: each under its chain of
unit keys and found through the same keys (every unit of attention, a Mamba block's
last), in slots with reference counts and an LRU order of their own (a
:class:`~kvhit.impl.pool.BlockPool` of its capacity; slot 0, the null block, holds
nothing). It holds only the groups of the kinds its tier ``holds``.

When the pool evicts a cached block, each store that holds its group keeps a copy
(:meth:`OffloadStore.keep`, evicting its own least recently used slot). A lookup
counts a unit as held when the pool or some store has it
(:meth:`~kvhit.impl.coordinator.Coordinator.find_longest_cache_hit`), and a reused
block the pool lacks is restored from the first store that has it into a new pool
block, cached there again, before the request runs
(:meth:`~kvhit.impl.coordinator.Coordinator.restore`). The keys say where a block is;
:class:`Transfers` moves the data (the tiny model's KV and states) and logs each move.

    >>> from kvhit.impl.pool import Entry
    >>> from kvhit.model.spec import Group, Kind
    >>> groups = (Group("full", 2), Group("mamba", 2))
    >>> store = OffloadStore("host", frozenset({Kind.FULL}), groups, num_slots=2)
    >>> store.keep(Entry(0, (5,), (5,))), store.keep(Entry(1, (5,), (5,)))
    (1, None)
    >>> store.lookup(0, torch.tensor([5, 6])).tolist(), store.lookup(1, torch.tensor([5])).tolist()
    ([1, -1], [-1])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from kvhit.contract import Direction, TierMove
from kvhit.impl.hashing import BlockHasher
from kvhit.impl.pool import BlockPool, Entry
from kvhit.impl.tiny_model import PagedStore
from kvhit.model.spec import Group, Kind


class OffloadStore:
    """One tier's store: ``num_slots`` slots of blocks of the groups whose kind it holds."""

    def __init__(
        self,
        name: str,
        holds: frozenset[Kind],
        groups: Sequence[Group],
        num_slots: int,
        hashers: Sequence[BlockHasher] | None = None,
    ):
        self.name = name
        self.holds = holds
        self.held = tuple(g.kind in holds for g in groups)
        """Per group, whether this store holds it."""
        self.slots = BlockPool(num_slots + 1, len(groups), hashers)

    def lookup(self, group: int, keys: torch.Tensor, bound: int | None = None) -> torch.Tensor:
        """The slot holding each unit key of ``group``, or -1 (all -1 for a group this
        store does not hold)."""
        if not self.held[group]:
            return torch.full_like(keys, -1)
        return self.slots.lookup(group, keys, bound)

    def ids(self, hashes: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """Per group, the slot holding each of these unit keys, or -1."""
        return [self.lookup(i, h) for i, h in enumerate(hashes)]

    def keep(self, entry: Entry) -> int | None:
        """Cache a copy of the block ``entry`` describes in a slot (the least recently
        used one goes) and return it for the data; None when this store does not hold
        the group, already holds the chain or one it does not extend, or every slot
        is pinned by a restore."""
        if not self.held[entry.group] or not self.slots.free_queue:
            return None
        if not self.slots.can_cache(entry.group, entry.chain):
            return None
        slot = self.slots.allocate()
        self.slots.cache(slot, entry.group, entry.chain, entry.findable)
        self.slots.free([slot])
        return slot


class Transfer(Protocol):
    """Moves a block's data between the pool and a store (the coordinator only moves
    keys)."""

    def spill(self, tier: int, group: int, block: int, slot: int) -> None:
        """Copy pool block ``block`` of ``group`` into slot ``slot`` of store ``tier``."""

    def load(self, tier: int, group: int, slot: int, block: int) -> None:
        """Copy slot ``slot`` of store ``tier`` into pool block ``block`` of ``group``."""


@dataclass(frozen=True)
class Move:
    """One block's data moved between pool block ``block`` and slot ``slot`` of store
    ``tier``, in group ``group``."""

    direction: Direction
    tier: int
    group: int
    block: int
    slot: int

    def tier_move(self) -> TierMove:
        """The stateful contract's form (its group left out: a block id names it)."""
        return TierMove(self.direction, self.block, self.tier, self.slot)


class Transfers:
    """The data side of the tiers: the pool's :class:`PagedStore` and one per store,
    with a log of every move since :meth:`take_log`."""

    def __init__(self, pool: PagedStore, stores: Sequence[PagedStore] = ()):
        self.pool = pool
        self.stores = list(stores)
        self.log: list[Move] = []

    def spill(self, tier: int, group: int, block: int, slot: int) -> None:
        """Copy pool block ``block`` of ``group`` into slot ``slot`` of store ``tier``."""
        self.stores[tier].data[group][slot] = self.pool.data[group][block]
        self.log.append(Move(Direction.SPILL, tier, group, block, slot))

    def load(self, tier: int, group: int, slot: int, block: int) -> None:
        """Copy slot ``slot`` of store ``tier`` into pool block ``block`` of ``group``."""
        self.pool.data[group][block] = self.stores[tier].data[group][slot]
        self.log.append(Move(Direction.RESTORE, tier, group, block, slot))

    def take_log(self) -> list[Move]:
        """The moves since the last call, in order."""
        log, self.log = self.log, []
        return log

    def view(self) -> PagedStore:
        """The pool's blocks followed by every store's slots as one store (ids as
        :meth:`~kvhit.impl.coordinator.Coordinator.tables_at` gives them)."""
        if not self.stores:
            return self.pool
        view = PagedStore(self.pool.groups, 1, 1)
        view.data = [
            torch.cat([self.pool.data[g], *(s.data[g] for s in self.stores)])
            for g in range(len(self.pool.groups))
        ]
        return view


@dataclass(frozen=True)
class Restore:
    """A reused block the pool lacks: the ``index``-th reused block of ``group``,
    restored from slot ``slot`` of store ``tier``."""

    group: int
    index: int
    tier: int
    slot: int
