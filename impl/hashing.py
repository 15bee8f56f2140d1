"""Chained block hashes of token ids, kept exact.

A block's key is ``(parent key, its tokens)``, so two blocks have the same key iff
the whole token prefixes up to their ends are equal. Keys are interned: the first
time a key is seen it gets the next small integer, its *hash id*. Equal ids mean
equal prefixes, with no collision to resolve, and the ids fit in an int64 tensor
for vectorized membership.

    >>> hasher = BlockHasher(block_size=2)
    >>> hasher.hashes([7, 7, 7, 7, 5]).tolist()
    [1, 2]
    >>> hasher.hashes([7, 7, 3, 3]).tolist()
    [1, 3]
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

ROOT = 0
"""The parent id of block 0."""


class BlockHasher:
    """Interned chained hashes for one block size."""

    def __init__(self, block_size: int):
        self.block_size = block_size
        self.ids: dict[tuple[int, tuple[int, ...]], int] = {}

    def hashes(self, tokens: Sequence[int]) -> torch.Tensor:
        """The hash id of every full block of ``tokens`` (a partial last block has none)."""
        b = self.block_size
        out = []
        parent = ROOT
        for start in range(0, len(tokens) - b + 1, b):
            key = (parent, tuple(tokens[start : start + b]))
            parent = self.ids.setdefault(key, len(self.ids) + 1)
            out.append(parent)
        return torch.tensor(out, dtype=torch.int64)
