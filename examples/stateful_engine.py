"""A small stateful engine, written from scratch, for the stateful contract
(:class:`kvhit.contract.StatefulEngine`; docs/protocol.md).

Full attention without drafters or hash units, declared with
:func:`kvhit.contract.declare`, so kvhit draws nothing else for it: one pool of
physical blocks shared by every group, an index from (group, token prefix through a
block's end) to the block that holds it, reference counts, and the least recently
freed block evicted first. Try it with
``kvhit fuzz --stateful --target kvhit.examples.stateful_engine:FullAttentionEngine``.

kvhit makes it with an :class:`~kvhit.contract.EngineConfig` and reads its typed answers:

    >>> from kvhit.model.spec import Group
    >>> engine = FullAttentionEngine(EngineConfig((Group("full", 2),), num_blocks=4, alignment=2))
    >>> engine.admit(0, [5, 6, 7])
    Admitted(length=0, reused=((),), tables=((0, 1),), outputs_match=None, moves=())
    >>> engine.finish(0)
    >>> engine.snapshot([5, 6, 8])
    Snapshot(cached=((True,),), tiers=())
    >>> engine.admit(1, [5, 6, 8])
    Admitted(length=2, reused=((0,),), tables=((0, 2),), outputs_match=None, moves=())
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from kvhit.contract import Admitted, EngineConfig, Rejected, Snapshot, declare

BlockKey = tuple[int, tuple[int, ...]]  # (group, the tokens of the prefix through the block)


@declare(kinds=["full"], drafters=[], hash_units=False)
class FullAttentionEngine:
    """A prefix cache for full-attention groups behind the stateful protocol."""

    def __init__(self, config: EngineConfig):
        self.sizes = [g.block_size for g in config.groups]
        self.alignment = config.alignment
        self.free = dict.fromkeys(range(config.num_blocks))  # in eviction order
        self.refs: Counter[int] = Counter()
        self.index: dict[BlockKey, int] = {}
        self.key_of: dict[int, BlockKey] = {}
        self.tables: dict[int, list[int]] = {}

    def keys(self, g: int, tokens: Sequence[int], blocks: int) -> list[BlockKey]:
        """Group g's index keys of the first ``blocks`` blocks of ``tokens``."""
        b = self.sizes[g]
        return [(g, tuple(tokens[: (j + 1) * b])) for j in range(blocks)]

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """Which full blocks of ``tokens`` each group finds in its index."""
        return Snapshot(
            tuple(
                tuple(key in self.index for key in self.keys(g, tokens, len(tokens) // b))
                for g, b in enumerate(self.sizes)
            )
        )

    def hit(self, tokens: Sequence[int]) -> int:
        """The longest multiple of A below T whose blocks every group has cached."""
        length = (len(tokens) - 1) // self.alignment * self.alignment
        while length and not all(
            key in self.index
            for g, b in enumerate(self.sizes)
            for key in self.keys(g, tokens, length // b)
        ):
            length -= self.alignment
        return length

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """Reuse the hit's blocks, allocate and cache the rest, or reject if too few
        blocks are free."""
        length = self.hit(tokens)
        reused = [
            [self.index[k] for k in self.keys(g, tokens, length // b)]
            for g, b in enumerate(self.sizes)
        ]
        taken = {block for ids in reused for block in ids}
        needed = sum(-(-len(tokens) // b) - length // b for b in self.sizes)
        if needed > sum(block not in taken for block in self.free):
            return Rejected("too few free blocks")
        for block in taken:
            self.take(block)
        tables: list[tuple[int, ...]] = []
        for g, b in enumerate(self.sizes):
            table = list(reused[g])
            for j in range(length // b, -(-len(tokens) // b)):
                block = next(iter(self.free))
                self.take(block)
                self.uncache(block)
                if (j + 1) * b <= len(tokens):
                    self.cache((g, tuple(tokens[: (j + 1) * b])), block)
                table.append(block)
            tables.append(tuple(table))
        self.tables[request] = [block for table in tables for block in table]
        return Admitted(length, tuple(map(tuple, reused)), tuple(tables))

    def finish(self, request: int) -> None:
        """Release the request's blocks; a block nobody holds becomes evictable, most
        recently freed last."""
        for block in self.tables.pop(request):
            self.refs[block] -= 1
            if not self.refs[block]:
                self.free[block] = None

    def take(self, block: int) -> None:
        """One more holder of ``block``; it is no longer evictable."""
        self.refs[block] += 1
        self.free.pop(block, None)

    def cache(self, key: BlockKey, block: int) -> None:
        """Index ``block`` under ``key``, unless another block already holds it."""
        if key not in self.index:
            self.index[key] = block
            self.key_of[block] = key

    def uncache(self, block: int) -> None:
        """``block`` is about to be overwritten: drop its index entry."""
        key = self.key_of.pop(block, None)
        if key is not None:
            del self.index[key]
