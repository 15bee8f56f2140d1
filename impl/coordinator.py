"""The coordinator: one request's blocks across every group, and the cache lookup.

:meth:`Coordinator.find_longest_cache_hit` is vectorized. What does not depend on the
cache is computed when the request arrives, as engines do with block hashes: its
block hash keys, and per group the staged ``valid`` of every candidate length
(:func:`kvhit.impl.formula.torch_plan`), kept per request shape by :func:`lookup_plan`. A lookup then
does, per group, one indexing operation to find which of the request's blocks are
cached, one cumulative sum of the misses, and the plan's two gathers, comparison and
select; one reduction takes the longest candidate valid in every group. The only
Python loop is over the groups.

With a hash unit h (the query's ``hash_unit``), every group is looked up in units of
h tokens instead of blocks: a unit's key is the key of the prefix through its end
(and, for a lookahead drafter, La tokens more), the plan is the spec's ``valid`` of
the group at block size h (:func:`kvhit.model.spec.fine_query`), and a hit inside a
block reuses that block's cached copy up to the hit. Without a hash unit a unit is a
block and everything is as before.

    >>> from kvhit.model.spec import Group
    >>> coord = Coordinator([Group("full", 2), Group("sliding_window", 2, window=3)], 16)
    >>> req = coord.request(list(range(9)))
    >>> coord.preload(req, [[True, True, True, False], [False, True, False, True]])
    >>> hit = coord.find_longest_cache_hit(req, max_length=8)
    >>> hit.length, hit.indices(), hit.blocks
    (4, [[0, 1], [1]], ((1, 2), (4,)))
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from functools import cached_property, lru_cache
from math import gcd
from typing import Any

import torch

from kvhit.impl.formula import Plan, miss_sums, stack, torch_plan, valid_at
from kvhit.impl.hashing import ROOT, BlockHasher, key_offset, keyed_units
from kvhit.impl.managers import manager_for
from kvhit.impl.offload import OffloadStore, Restore, Transfer
from kvhit.impl.pool import NULL_BLOCK, BlockPool, Entry
from kvhit.model.spec import (
    Group,
    Kind,
    Query,
    Tier,
    Upto,
    default_alignment,
    fine_row,
    reused_range,
)

Copy = Callable[[int, int, int], None]
"""``copy(group, source, destination)``: copy one block's data to another."""


@dataclass
class Request:
    """A request's tokens, its unit keys per group, and (once allocated) its block
    table per group.

    ``hashes[g]`` holds the key of each of the request's units that has one (a unit
    is a block without a hash unit). ``keys[g]`` is ``hashes[g]`` followed by
    :data:`~kvhit.impl.hashing.ROOT`, which is never cached, through unit T // u: the
    lookup key of every unit a lookup may look at. ``key_bound`` exceeds every hash
    id in them. ``held`` is what the request holds in each hasher (by its granularity).
    """

    tokens: list[int]
    hashes: list[torch.Tensor]
    tables: list[list[int]]
    keys: list[torch.Tensor]
    key_bound: int
    held: dict[int, torch.Tensor]
    filled_from: list[int] = field(default_factory=list)
    """Per group, the first block the request holds from its first token on (set by
    :meth:`Coordinator.allocate`): the blocks it may cache."""
    holding: bool = True
    """Whether the request still holds its hashes (until :meth:`Coordinator.free`)."""

    @property
    def num_tokens(self) -> int:
        """How many tokens the request has."""
        return len(self.tokens)


class CacheHit:
    """A hit length and, per group, the cached blocks reused: the physical block ids
    of the block indices ``first[g]`` onward, -1 for a block only an offload store
    holds, and then (``slots[g][t]``) the slot of store t holding each, or -1.

    The lookup hands the ids over as tensor views; :attr:`blocks` turns them into
    Python ints the first time it is read.
    """

    def __init__(
        self,
        length: int,
        first: tuple[int, ...],
        reused: Sequence[torch.Tensor | Sequence[int]],
        slots: Sequence[Sequence[torch.Tensor]] = (),
    ):
        self.length = length
        self.first = first
        self.reused = tuple(reused)
        self.slots = tuple(slots)

    @cached_property
    def blocks(self) -> tuple[tuple[int, ...], ...]:
        """Each group's reused physical block ids."""
        return tuple(
            tuple(b.tolist()) if isinstance(b, torch.Tensor) else tuple(b) for b in self.reused
        )

    def restores(self) -> list[Restore]:
        """Every reused block the pool lacks, from the first store (in order) holding it."""
        out = []
        for group, (blocks, tiers) in enumerate(zip(self.blocks, self.slots)):
            for index in (k for k, block in enumerate(blocks) if block < 0):
                tier, slot = next((t, int(s[index])) for t, s in enumerate(tiers) if s[index] >= 0)
                out.append(Restore(group, index, tier, slot))
        return out

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
    """Every group's manager over one shared block pool, looked up in units of the hash
    unit (or, without one, of each group's block)."""

    def __init__(
        self,
        groups: Sequence[Group],
        num_blocks: int,
        alignment: int | None = None,
        hash_unit: int | None = None,
    ):
        self.groups = tuple(groups)
        self.hash_unit = hash_unit
        self.units = tuple(hash_unit or g.block_size for g in self.groups)
        self.unit_groups = tuple(replace(g, block_size=u) for g, u in zip(self.groups, self.units))
        """Each group at block size u (its :func:`~kvhit.model.spec.fine_query` group)."""
        self.alignment = alignment or hash_unit or default_alignment(self.groups)
        # A key covering La tokens past a unit's end is a key at granularity gcd(u, La).
        self.key_sizes = tuple(gcd(u, key_offset(g)) for g, u in zip(self.groups, self.units))
        self.hashers = {d: BlockHasher(d) for d in self.key_sizes}
        self.pool = BlockPool(num_blocks, len(self.groups), self.group_hashers)
        self.managers = [manager_for(g, i, self.pool) for i, g in enumerate(self.groups)]
        self.stores: list[OffloadStore] = []
        """The offload stores (docs/design.md §4), in the order a restore prefers them."""
        self.transfer: Transfer | None = None
        """What moves the data of a spill or a restore (none: keys only)."""

    @property
    def group_hashers(self) -> list[BlockHasher]:
        """Each group's hasher (by its key granularity)."""
        return [self.hashers[d] for d in self.key_sizes]

    def add_store(self, name: str, holds: frozenset[Kind], num_slots: int) -> OffloadStore:
        """A new offload store of ``num_slots`` slots for the groups of the kinds it
        holds; from now on the pool spills every block it evicts to the stores."""
        store = OffloadStore(name, holds, self.groups, num_slots, self.group_hashers)
        self.stores.append(store)
        self.pool.on_evict = self.spill
        return store

    def spill(self, block: int, entry: Entry) -> None:
        """The pool evicts ``block``, cached as ``entry``: each store holding its group
        keeps a copy."""
        for tier, store in enumerate(self.stores):
            slot = store.keep(entry)
            if slot is not None and self.transfer is not None:
                self.transfer.spill(tier, entry.group, block, slot)

    def per_block(self, group: int) -> int:
        """How many units a block of group ``group`` has."""
        return self.groups[group].block_size // self.units[group]

    def request(self, tokens: Sequence[int]) -> Request:
        """A new request, with its unit keys and lookup keys for every group; it holds
        its hashes until :meth:`free`."""
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        num_tokens = len(tokens)
        held = {d: hasher.hashes(tokens) for d, hasher in self.hashers.items()}
        by_shape: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        for g, u in zip(self.groups, self.units):
            shape = (u, key_offset(g))
            if shape not in by_shape:
                by_shape[shape] = unit_keys(held[gcd(*shape)], *shape, num_tokens)
        shapes = [by_shape[u, key_offset(g)] for g, u in zip(self.groups, self.units)]
        key_bound = max(h.bound for h in self.hashers.values())
        self.pool.reserve(key_bound)
        for store in self.stores:
            store.slots.reserve(key_bound)
        # Like the hashes, the plan of the usual lookup (max_length = T - 1) is made
        # when the request arrives.
        self.plan_for(num_tokens, num_tokens - 1)
        return Request(
            tokens,
            [hashes for hashes, _ in shapes],
            [[] for _ in self.groups],
            [keys for _, keys in shapes],
            key_bound,
            held,
        )

    def plan_for(self, num_tokens: int, max_length: int) -> LookupPlan:
        """The plan of a lookup of at most ``max_length`` tokens for a request of
        ``num_tokens`` (a hit always leaves the request at least one token to compute)."""
        top = min(max_length, num_tokens - 1) // self.alignment * self.alignment
        return lookup_plan(self.unit_groups, self.alignment, top, num_tokens)

    def cached_ids(self, request: Request) -> list[torch.Tensor]:
        """Per group, the cached block holding each of the request's keyed units, or -1."""
        return [self.pool.lookup(i, h) for i, h in enumerate(request.hashes)]

    def find_longest_cache_hit(self, request: Request, max_length: int) -> CacheHit:
        """The longest hit of at most ``max_length`` tokens every group can serve, a
        unit counting as held when the pool or some offload store has it."""
        plan = self.plan_for(request.num_tokens, max_length)
        ids = [
            self.pool.lookup(i, keys[:size], request.key_bound)
            for i, (keys, size) in enumerate(zip(request.keys, plan.sizes))
        ]
        tiers = [
            [
                store.lookup(i, keys[:size], request.key_bound)
                for i, (keys, size) in enumerate(zip(request.keys, plan.sizes))
            ]
            for store in self.stores
        ]
        missing = torch.cat(ids) < 0
        for slots in tiers:
            missing &= torch.cat(slots) < 0
        # amin: whether every group can serve each candidate (all(0) is slower on bools).
        ok = valid_at(plan.plan, miss_sums(missing)).amin(0)
        length = int(torch.where(ok, plan.lengths, 0).max())
        first, reused, held = [], [], []
        for i, (g, group_ids) in enumerate(zip(self.unit_groups, ids)):
            lo, hi = reused_range(g, length) if length else (0, 0)
            block_first, unit_ids = self.reused_blocks(i, lo, hi, group_ids)
            first.append(block_first)
            reused.append(unit_ids)
            held.append([self.reused_blocks(i, lo, hi, slots[i])[1] for slots in tiers])
        return CacheHit(length, tuple(first), reused, held if tiers else ())

    def reused_blocks(
        self, group: int, lo: int, hi: int, ids: torch.Tensor
    ) -> tuple[int, torch.Tensor]:
        """The blocks holding the units ``[lo, hi)`` of a group, given each unit's cached
        block ``ids``: the first block index, and each block's physical id, that of the
        block found through its last unit in the range (which holds every unit of the
        block before it)."""
        per = self.per_block(group)
        if per == 1:
            return lo, ids[lo:hi]
        first = lo // per
        end = -(-hi // per) if hi > lo else first
        last = torch.clamp(torch.arange(first, end) * per + per - 1, max=hi - 1)
        return first, ids[last]

    def snapshot(self, request: Request, max_length: int | None = None) -> dict[str, Any]:
        """The cache state the request sees, as a normalized protocol query
        (:meth:`state`)."""
        return self.state(request, max_length).to_json()

    def state(self, request: Request, max_length: int | None = None) -> Query:
        """The cache state the request sees, as a query: the pool's rows, and each
        offload store as a tier with a row for every group it holds."""
        rows = self.rows(self.cached_ids(request))
        tiers = tuple(
            Tier(
                store.name,
                store.holds,
                tuple(
                    row if held else None
                    for row, held in zip(self.rows(store.ids(request.hashes)), store.held)
                ),
            )
            for store in self.stores
        )
        if max_length is None:
            max_length = request.num_tokens - 1
        return Query(
            self.groups,
            rows,
            max_length,
            request.num_tokens,
            self.alignment,
            self.hash_unit,
            tiers,
        )

    def rows(self, ids: Sequence[torch.Tensor]) -> tuple[tuple[Any, ...], ...]:
        """Protocol rows of each group's blocks, from where each keyed unit is held
        (-1: nowhere)."""
        return tuple(
            coarse_row(g, u, tuple((i >= 0).tolist()))
            for g, u, i in zip(self.groups, self.units, ids)
        )

    def held_ids(self, request: Request) -> list[torch.Tensor]:
        """Per group, where each of the request's keyed units is held, or -1: its
        cached pool block, else the slot of the first store holding it, counted after
        the pool's blocks and the slots of the stores before it
        (:meth:`~kvhit.impl.offload.Transfers.view`)."""
        out = self.cached_ids(request)
        offset = len(self.pool.ref_cnt)
        for store in self.stores:
            for i, slots in enumerate(store.ids(request.hashes)):
                out[i] = torch.where((out[i] < 0) & (slots >= 0), slots + offset, out[i])
            offset += len(store.slots.ref_cnt)
        return out

    def tables_at(self, request: Request, length: int) -> list[list[int]]:
        """Per group, the block table that reads the cache as a hit of ``length`` would:
        each block before ``length`` is the block found through its last unit before
        ``length`` (in the pool, else in a store: :meth:`held_ids`), or the null block
        when that unit is held nowhere."""
        tables = []
        for i, (ids, u) in enumerate(zip(self.held_ids(request), self.units)):
            _, blocks = self.reused_blocks(i, 0, min(length // u, ids.numel()), ids)
            table = torch.where(blocks >= 0, blocks, NULL_BLOCK).tolist()
            count = -(-length // self.groups[i].block_size)
            tables.append(table + [NULL_BLOCK] * (count - len(table)))
        return tables

    def restore(self, hit: CacheHit) -> CacheHit:
        """Bring every reused block the pool lacks into a new pool block (the request
        holds it), from the first store holding it, cached in the pool again under the
        store's keys; the hit with those blocks. The hit's pool blocks must be held
        already: a new block may evict (and spill) any other."""
        restores = hit.restores()
        # A spill may still uncache a pinned slot (a longer chain of its anchor takes
        # its keys), never its data: its entry is read first.
        entries = []
        for r in restores:
            self.stores[r.tier].slots.touch([r.slot])
            entries.append(self.stores[r.tier].slots.key[r.slot])
        blocks = [list(b) for b in hit.blocks]
        for r, entry in zip(restores, entries):
            assert entry is not None, "the lookup found the slot through its entry"
            block = self.pool.allocate()
            if self.transfer is not None:
                self.transfer.load(r.tier, r.group, r.slot, block)
            self.pool.cache(block, r.group, entry.chain, entry.findable)
            blocks[r.group][r.index] = block
        for r in restores:
            self.stores[r.tier].slots.free([r.slot])
        return CacheHit(hit.length, hit.first, blocks) if restores else hit

    def allocate(
        self, request: Request, hit: CacheHit, copy: Copy | None = None, upto: int | None = None
    ) -> CacheHit:
        """Give the request its block tables: the hit's blocks (a block only a store
        holds restored first: :meth:`restore`), then new ones through token ``upto``
        (default: every token; a scheduler that computes a prompt in chunks grows them
        later: :meth:`extend`); the hit as allocated.

        Every group's hit blocks are taken before any group's new blocks: a new block
        comes from the free queue, which also holds the cached blocks nobody runs on,
        and taking one of another group's hit blocks there would overwrite what that
        group is about to reuse.

        A block the hit ends inside (a hit that is not a multiple of b) is reused by a
        copy, since the request writes the rest of it: the request gets a new block,
        ``copy`` fills it from the cached one, which is then released. Without ``copy``
        (no data to move) only the blocks change.
        """
        for blocks in hit.blocks:
            self.pool.touch(b for b in blocks if b >= 0)
        hit = self.restore(hit)
        request.tables, request.filled_from = [], []
        for i, (m, first, blocks) in enumerate(zip(self.managers, hit.first, hit.blocks)):
            b = self.groups[i].block_size
            partial = bool(hit.length % b and blocks)
            kept = blocks[:-1] if partial else blocks
            table = m.allocate(kept, first, request.num_tokens if upto is None else upto)
            if partial:
                if copy is not None:
                    copy(i, blocks[-1], table[first + len(kept)])
                self.pool.free(blocks[-1:])
            request.tables.append(table)
            # A hit inside a block that reuses nothing of it (a one-token window, a
            # chunk starting there) leaves the block's first tokens uncomputed.
            request.filled_from.append(first if blocks else -(-hit.length // b))
        return hit

    def extend(self, request: Request, num_tokens: int) -> None:
        """Grow every group's table with new blocks to hold ``num_tokens`` tokens."""
        for m, table in zip(self.managers, request.tables):
            m.extend(table, num_tokens)

    def grown(self, request: Request, tokens: Sequence[int]) -> Request:
        """The request with more tokens (those it generated): a new request over
        ``tokens`` holding the same blocks; the old one lets go of its hashes."""
        longer = self.request(tokens)
        longer.tables, longer.filled_from = request.tables, request.filled_from
        request.tables = [[] for _ in self.groups]
        self.free(request)
        return longer

    def cache_full_blocks(self, request: Request, upto: int | None = None) -> None:
        """After prefill: cache every block the request filled, a partially filled one
        up to its last keyed unit; with ``upto``, only the units that end by token
        ``upto`` (what the steps run so far wrote)."""
        for i, (m, table, hashes) in enumerate(zip(self.managers, request.tables, request.hashes)):
            keys = hashes if upto is None else hashes[: upto // self.units[i]]
            m.cache_full_blocks(table, keys, self.per_block(i), request.filled_from[i])

    def drop_skipped(self, request: Request, upto: int | None = None) -> None:
        """Free the blocks no token after the request's last one (with ``upto``: after
        its first ``upto`` tokens) reads."""
        for m, table in zip(self.managers, request.tables):
            m.drop_skipped(table, request.num_tokens if upto is None else upto)

    def free(self, request: Request) -> None:
        """The request is finished: free all its blocks and release its hashes."""
        for m, table in zip(self.managers, request.tables):
            m.free(table)
        if request.holding:
            request.holding = False
            for d, hashes in request.held.items():
                self.hashers[d].release(hashes)

    def preload(
        self, request: Request, rows: Sequence[Sequence[bool]], pool: BlockPool | None = None
    ) -> None:
        """Make the pool (or a store's ``pool`` of slots) hold exactly the units
        ``rows[g][i]`` of the request's keyed units (one bit per unit, as in
        :func:`~kvhit.model.spec.fine_query`; a unit past the request's keyed units is
        ignored), cached and free. Each block is cached through its last held unit:
        its chain from its first unit to that one."""
        pool = self.pool if pool is None else pool
        held = []
        for i, (row, hashes) in enumerate(zip(rows, request.hashes)):
            per, ids = self.per_block(i), hashes.tolist()
            for start in range(0, min(len(row), len(ids)), per):
                bits = row[start : min(start + per, len(ids))]
                last = max((k for k, bit in enumerate(bits) if bit), default=None)
                if last is not None:
                    chain = ids[start : start + last + 1]
                    block = pool.allocate()
                    pool.cache(block, i, chain, self.managers[i].findable(chain))
                    held.append(block)
        pool.free(held)


def unit_keys(
    hashes: torch.Tensor, unit: int, offset: int, num_tokens: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """A request's unit keys from its chained hashes at granularity d = gcd(unit,
    offset) (``hashes[k]``: the key of its first (k+1)·d tokens): the key of each unit
    that has one (unit i's covers the first (i+1)·unit + offset tokens), and the lookup
    keys, those followed by :data:`~kvhit.impl.hashing.ROOT` through unit T // unit."""
    d = gcd(unit, offset)
    count = keyed_units(unit, offset, num_tokens)
    if d == unit and offset == 0:
        keyed = hashes[:count]
    else:
        keyed = hashes[torch.arange(count) * (unit // d) + (unit + offset) // d - 1]
    pad = torch.full((num_tokens // unit + 1 - count,), ROOT, dtype=torch.int64)
    return keyed, torch.cat([keyed, pad])


def coarse_row(g: Group, unit: int, bits: Sequence[bool]) -> tuple[Any, ...]:
    """A row of group g's blocks from one bit per unit: a block is ``True``, ``False``
    or partially filled (:class:`~kvhit.model.spec.Upto`), whichever has these bits as
    its :func:`~kvhit.model.spec.fine_row`."""
    per = g.block_size // unit
    if per == 1:
        return tuple(bits)
    row: list[Any] = []
    for j in range(0, len(bits), per):
        held = [k for k, bit in enumerate(bits[j : j + per]) if bit]
        if not held:
            row.append(False)
        elif held[-1] == per - 1:
            row.append(True)
        else:
            row.append(Upto(j * unit + (held[-1] + 1) * unit))
    # A block's bits are what one cached block holds (BlockPool.cache), so they are
    # always one entry's; a partial last block past the keyed units reads as not held.
    shown = fine_row(g, row, unit)
    assert shown[: len(bits)] == tuple(bits), f"units {bits} are no row of {g.describe()}"
    return tuple(row)
