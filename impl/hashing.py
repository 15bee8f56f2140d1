"""Chained block hashes of token ids, kept exact, and released when nothing needs them.

A block's key is ``(parent key, its tokens)``, so two blocks have the same key iff
the whole token prefixes up to their ends are equal. Keys are interned: a key gets a
small integer, its *hash id*. Equal ids mean equal prefixes, with no collision to
resolve, and the ids fit in an int64 tensor for vectorized membership.

An id is held while something needs its key: a running request whose last block it
is (:meth:`BlockHasher.hashes` takes the hold, :meth:`BlockHasher.release` drops it),
a cached block holding it (:meth:`BlockHasher.hold`, :meth:`BlockHasher.drop`, called
by the pool), or a child key whose parent it is. So one hold keeps a whole prefix
chain. An id nothing holds is forgotten and handed out again: the table holds the
keys of the prefixes the cache and the running requests hold, not every prefix ever
seen.

    >>> hasher = BlockHasher(block_size=2)
    >>> first = hasher.hashes([7, 7, 7, 7, 5])
    >>> first.tolist(), hasher.hashes([7, 7, 3, 3]).tolist()
    ([1, 2], [1, 3])
    >>> hasher.release(first)
    >>> hasher.hashes([7, 7, 6, 6]).tolist()  # the id of [7, 7, 7, 7] is free again
    [1, 2]
"""

from __future__ import annotations

from array import array
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import torch

from kvhit.model.spec import Drafter, Group

ROOT = 0
"""The parent id of block 0 (never a block's id)."""

Key = tuple[int, tuple[int, ...]]


def key_offset(g: Group) -> int:
    """How many tokens past its end a unit's key covers: a lookahead drafter's La
    (the key of the unit ending at e is the key of the prefix of e + La tokens), else 0."""
    return g.lookahead if g.drafter == Drafter.LOOKAHEAD else 0


def keyed_units(unit: int, offset: int, num_tokens: int) -> int:
    """How many of a request's units of ``unit`` tokens have a key covering ``offset``
    tokens more: those ending by T - offset.

    >>> keyed_units(4, 3, 10), keyed_units(4, 0, 10), keyed_units(2, 9, 4)
    (1, 2, 0)
    """
    return max(0, (num_tokens - offset) // unit)


NO_CHILDREN: Mapping[tuple[int, ...], int] = MappingProxyType({})
"""The children of an id that has none (shared, read-only)."""


class BlockHasher:
    """Interned chained hashes for one block size, with holds (see the module docstring).

    The table is a trie: ``children[i]`` maps a block's tokens to the id of the key
    ``(i, tokens)``, so finding a block costs one hash of its tokens.
    """

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.children: list[Mapping[tuple[int, ...], int]] = [NO_CHILDREN]
        self.key_of: list[Key | None] = [None]
        self.holds = [0]
        self.spare: list[int] = []

    @property
    def bound(self) -> int:
        """Every id handed out is below this."""
        return len(self.key_of)

    def __len__(self) -> int:
        """How many keys the table holds."""
        return len(self.key_of) - 1 - len(self.spare)

    def hashes(self, tokens: Sequence[int]) -> torch.Tensor:
        """The hash id of every full block of ``tokens`` (a partial last block has
        none), held until :meth:`release`."""
        out = array("q")
        parent = ROOT
        children = self.children
        blocks = zip(*[iter(tokens)] * self.block_size)  # the full blocks, as tuples
        for block in blocks:
            found = children[parent].get(block)
            if found is None:
                # A fresh id has no children, so every later key is new as well.
                out.append(parent := self.intern(parent, block))
                for block in blocks:
                    out.append(parent := self.intern(parent, block))
                break
            out.append(parent := found)
        self.hold(parent)
        return (
            torch.frombuffer(out, dtype=torch.int64) if out else torch.zeros(0, dtype=torch.int64)
        )

    def intern(self, parent: int, block: tuple[int, ...]) -> int:
        """A fresh id for the key ``(parent, block)``; the key holds its parent."""
        if self.spare:
            new = self.spare.pop()
            self.key_of[new] = (parent, block)
        else:
            new = len(self.key_of)
            self.key_of.append((parent, block))
            self.children.append(NO_CHILDREN)
            self.holds.append(0)
        if self.children[parent] is NO_CHILDREN:
            self.children[parent] = {}
        self.children[parent][block] = new  # type: ignore[index]
        self.hold(parent)
        return new

    def hold(self, hash_id: int) -> None:
        """Take a hold on ``hash_id`` (a cached block now holds it)."""
        if hash_id != ROOT:
            self.holds[hash_id] += 1

    def drop(self, hash_id: int) -> None:
        """Drop a hold on ``hash_id``; an id nothing holds is forgotten, and so, in
        turn, is a parent only it held."""
        while hash_id != ROOT:
            self.holds[hash_id] -= 1
            if self.holds[hash_id]:
                return
            key = self.key_of[hash_id]
            assert key is not None, f"hash id {hash_id} dropped more often than held"
            parent, block = key
            del self.children[parent][block]  # type: ignore[attr-defined]
            self.key_of[hash_id] = None
            self.children[hash_id] = NO_CHILDREN  # nothing holds it, so no child is left
            self.spare.append(hash_id)
            hash_id = parent

    def release(self, hash_ids: torch.Tensor) -> None:
        """Drop the hold a request took on its hashes (what :meth:`hashes` gave it)."""
        if hash_ids.numel():
            self.drop(int(hash_ids[-1]))
