"""The vectorized validity formula: the spec's own ``valid``, run on prefix sums.

The impl does not restate the rule of any kind. It calls
:func:`kvhit.model.spec.valid` unchanged, with every candidate length at once in one
tensor, through :class:`TorchOps`. The one operation that changes is "are blocks
``[lo, hi)`` all cached": with ``prefix[i]`` the number of cached blocks below i,
they are iff ``prefix[hi] - prefix[lo] == hi - lo`` (:func:`covered`). Theorem 8
(``proofs/impl_formula.py``) proves that this equals the spec's blockwise check.

    >>> import torch
    >>> from kvhit.model.spec import Group
    >>> bits = torch.tensor([False, True, True, False])
    >>> prefix = prefix_sums(bits, 4)
    >>> prefix.tolist()
    [0, 0, 1, 2, 2]
    >>> sw = Group("sliding_window", block_size=1, window=2)
    >>> valid_lengths(sw, prefix, torch.arange(0, 4), num_tokens=5).tolist()
    [True, False, True, True]
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from kvhit.model.ops import Ops
from kvhit.model.spec import Group, valid


def covered(prefix_at: Callable[[Any], Any], lo: Any, hi: Any) -> Any:
    """Whether every block in ``[lo, hi)`` is cached, from the prefix sums of the bits.

    ``prefix_at(i)`` is the number of cached blocks below block i. Both the torch
    lookup and the z3 proof of theorem 8 evaluate this same function.
    """
    return prefix_at(hi) - prefix_at(lo) == hi - lo


def prefix_sums(bits: torch.Tensor, size: int) -> torch.Tensor:
    """``prefix[i]`` = cached blocks below i, for i = 0 … size; blocks past the row
    are not cached."""
    padded = torch.zeros(size, dtype=torch.int64)
    count = min(size, bits.numel())
    padded[:count] = bits[:count]
    return torch.cat([torch.zeros(1, dtype=torch.int64), padded.cumsum(0)])


class TorchOps(Ops):
    """The model's operations on tensors of candidates (plain values pass through).

    A cache "row" is a prefix-sum tensor (:func:`prefix_sums`) long enough for every
    block index the candidates reach.
    """

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(cond, torch.Tensor):
            return torch.where(cond, then, other)
        return then if cond else other

    def and_(self, *terms: Any) -> Any:
        out: Any = True
        for t in terms:
            out = out & t
        return out

    def or_(self, *terms: Any) -> Any:
        out: Any = False
        for t in terms:
            out = out | t
        return out

    def not_(self, term: Any) -> Any:
        return ~term if isinstance(term, torch.Tensor) else not term

    def all_cached(self, row: Any, lo: Any, hi: Any) -> Any:
        # A mamba group's lo is -1 at L = 0; that lane is decided by L == 0, so clamp.
        return covered(lambda i: row[torch.as_tensor(i).clamp(min=0)], lo, hi)


TORCH = TorchOps()


def valid_lengths(
    g: Group, prefix: torch.Tensor, lengths: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """valid_g(L) for every candidate in ``lengths`` at once (a bool tensor)."""
    return valid(g, prefix, lengths, num_tokens, TORCH)
