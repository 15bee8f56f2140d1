"""The vectorized validity formula: the spec's own ``valid``, staged on miss counts.

The impl does not restate the rule of any kind. It runs :func:`kvhit.model.spec.valid`
unchanged, with every candidate length at once in one tensor, and reinterprets one
operation: "are blocks ``[lo, hi)`` all cached". With ``misses[i]`` the number of
uncached blocks below i, they are iff ``misses[hi] == misses[lo]`` (:func:`covered`).

``valid`` reads the cache through that one call only, so it is *staged*
(:func:`stage`): run once per set of candidates with the call answering True and once
answering False, it yields a :class:`Plan` (the range ``[lo, hi)`` of every candidate
and the verdict in either case) that depends on nothing cached. A lookup then only
evaluates :meth:`Plan.holds` on the current miss counts: two gathers, one comparison
and one select per group. Theorem 8 (``proofs/theorems/impl_formula.py``) proves that the
staged formula equals the spec's blockwise check.

    >>> import torch
    >>> from kvhit.model.spec import Group
    >>> bits = torch.tensor([False, True, True, False])
    >>> misses = prefix_sums(bits, 4)
    >>> misses.tolist()
    [0, 1, 1, 1, 2]
    >>> sw = Group("sliding_window", block_size=1, window=2)
    >>> valid_lengths(sw, misses, torch.arange(0, 4), num_tokens=5).tolist()
    [True, False, True, True]
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import reduce
from itertools import accumulate
from typing import Any

import torch

from kvhit.model.ops import Ops
from kvhit.model.spec import Group, valid


def covered(misses_at: Callable[[Any], Any], lo: Any, hi: Any) -> Any:
    """Whether every block in ``[lo, hi)`` (lo ≤ hi) is cached: no miss between them.

    ``misses_at(i)`` is the number of uncached blocks below block i. Both the torch
    lookup and the z3 proof of theorem 8 evaluate this same function.
    """
    return misses_at(hi) == misses_at(lo)


def prefix_sums(bits: torch.Tensor, size: int) -> torch.Tensor:
    """The prefix sums of the misses of a row of cached ``bits``: ``misses[i]`` =
    uncached blocks below i, for i = 0 … size; blocks past the row are not cached."""
    missing = torch.ones(size, dtype=torch.bool)
    count = min(size, bits.numel())
    missing[:count] = ~bits[:count]
    return miss_sums(missing)


def miss_sums(missing: torch.Tensor) -> torch.Tensor:
    """``out[i]`` = how many of ``missing[:i]`` are True, for i = 0 … len (int64)."""
    out = torch.zeros(missing.numel() + 1, dtype=torch.int64)
    torch.cumsum(missing, 0, out=out[1:])
    return out


class Staging(Ops):
    """``ops`` with the one cache read answered by a fixed ``answer``; the range it was
    asked about is recorded in :attr:`ranges`."""

    def __init__(self, ops: Ops, answer: bool):
        self.ops = ops
        self.answer = answer
        self.ranges: list[tuple[Any, Any]] = []

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        return self.ops.ite(cond, then, other)

    def and_(self, *terms: Any) -> Any:
        return self.ops.and_(*terms)

    def or_(self, *terms: Any) -> Any:
        return self.ops.or_(*terms)

    def not_(self, term: Any) -> Any:
        return self.ops.not_(term)

    def min(self, a: Any, b: Any) -> Any:
        return self.ops.min(a, b)

    def max(self, a: Any, b: Any) -> Any:
        return self.ops.max(a, b)

    def div(self, a: Any, b: Any) -> Any:
        return self.ops.div(a, b)

    def bit(self, row: Any, j: Any) -> Any:
        raise TypeError("a staged valid may read the cache only through all_cached")

    def all_cached(self, row: Any, lo: Any, hi: Any) -> Any:
        self.ranges.append((lo, hi))
        return self.answer


@dataclass(frozen=True)
class Plan:
    """valid_g at a set of candidates, split on its one cache read: the range
    ``[lo, hi)`` that must be cached, and the verdict when it is and when it is not."""

    lo: Any
    hi: Any
    if_covered: Any
    if_not: Any

    def holds(self, misses_at: Callable[[Any], Any], ops: Ops) -> Any:
        """valid_g at the candidates, for the cache whose miss counts ``misses_at`` reads.

        ``valid`` only gains from a covered range (``if_not`` implies ``if_covered``),
        so no select is needed: on tensors, ands and ors of bools are far cheaper.
        """
        return ops.or_(self.if_not, ops.and_(covered(misses_at, self.lo, self.hi), self.if_covered))


def stage(g: Group, lengths: Any, num_tokens: Any, ops: Ops) -> Plan:
    """Run the spec's ``valid`` with the cache read answered True, then False.

    ``valid`` computes the range before it reads the cache, so both runs ask about the
    same range; each must read exactly once, or staging would be wrong. A range that
    starts before block 0 is decided here (never cached), so the plan's ``lo`` is ≥ 0.
    """
    runs = [Staging(ops, answer) for answer in (True, False)]
    if_covered, if_not = (valid(g, None, lengths, num_tokens, run) for run in runs)
    if any(len(run.ranges) != 1 for run in runs):
        raise TypeError(f"valid of {g.describe()} must read the cache exactly once")
    lo, hi = runs[0].ranges[0]
    # A range that starts before block 0 (a mamba group at L < b) is never cached.
    in_row = lo >= 0
    return Plan(ops.max(lo, 0), hi, ops.ite(in_row, if_covered, if_not), if_not)


class TorchOps(Ops):
    """The model's operations on tensors of candidates (plain values pass through)."""

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(cond, torch.Tensor):
            return torch.where(cond, then, other)
        return then if cond else other

    # Folding from the first term, not from True / False: ``True & tensor`` is a
    # whole extra tensor operation.
    def and_(self, *terms: Any) -> Any:
        return reduce(operator.and_, terms) if terms else True

    def or_(self, *terms: Any) -> Any:
        return reduce(operator.or_, terms) if terms else False

    def not_(self, term: Any) -> Any:
        return ~term if isinstance(term, torch.Tensor) else not term


TORCH = TorchOps()


def torch_plan(g: Group, lengths: torch.Tensor, num_tokens: int) -> Plan:
    """:func:`stage` on a tensor of candidates, every field a contiguous tensor of their
    shape, ready to be evaluated by :func:`valid_at` again and again."""
    plan = stage(g, lengths, num_tokens, TORCH)

    def full(value: Any, dtype: torch.dtype) -> torch.Tensor:
        return torch.as_tensor(value, dtype=dtype).expand(lengths.shape).contiguous()

    return Plan(
        full(plan.lo, torch.int64),
        full(plan.hi, torch.int64),
        full(plan.if_covered, torch.bool),
        full(plan.if_not, torch.bool),
    )


def stack(plans: Sequence[Plan], sizes: Sequence[int]) -> Plan:
    """Several groups' torch plans as one, read from the miss flags of their blocks laid
    end to end (group g's ``sizes[g]`` blocks after those of the groups before it).

    Every field gets a leading group axis and each group's ranges are shifted by its
    offset. Within one group's stretch, the running miss count of the whole row grows
    exactly as that group's own, so :func:`covered` asks the same question.
    """
    offsets = [0, *accumulate(sizes)]
    return Plan(
        torch.stack([p.lo + off for p, off in zip(plans, offsets)]),
        torch.stack([p.hi + off for p, off in zip(plans, offsets)]),
        torch.stack([p.if_covered for p in plans]),
        torch.stack([p.if_not for p in plans]),
    )


def valid_at(plan: Plan, misses: torch.Tensor) -> torch.Tensor:
    """The plan's candidates valid for the cache whose miss counts are ``misses``."""
    return plan.holds(lambda i: misses.index_select(0, i.flatten()).view(i.shape), TORCH)


def valid_lengths(
    g: Group, misses: torch.Tensor, lengths: torch.Tensor, num_tokens: int
) -> torch.Tensor:
    """valid_g(L) for every candidate in ``lengths`` at once (a bool tensor), from the
    miss counts of :func:`prefix_sums`."""
    return valid_at(torch_plan(g, lengths, num_tokens), misses)
