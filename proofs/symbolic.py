"""Run the model's own code on Z3 terms.

:class:`Z3Ops` reinterprets the operations of :class:`kvhit.model.ops.Ops` so that a
finder, the fixed point or a validity predicate, called unchanged, returns a Z3 term
instead of a value. A symbolic cache row is a :class:`SymRow`: a Z3 array of bits
and how many of its blocks may be cached.

    >>> import z3
    >>> from kvhit.model.finders import find
    >>> from kvhit.model.spec import Group
    >>> ops = Z3Ops(bound=4)
    >>> row = SymRow.fresh("r", 4)
    >>> m = z3.Int("m")
    >>> hit = find(Group("full", 1), row, m, 1, m + 1, ops)
    >>> z3.is_expr(hit)
    True
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import z3

from kvhit.model.ops import Ops


@dataclass(frozen=True)
class SymRow:
    """A symbolic cache row: ``bits[j]`` for block j, cached only when j < length."""

    bits: z3.ArrayRef
    length: Any

    @staticmethod
    def fresh(name: str, length: Any) -> SymRow:
        """A row whose bits are all unknown."""
        return SymRow(z3.Array(name, z3.IntSort(), z3.BoolSort()), length)

    @staticmethod
    def of(bits: Sequence[Any]) -> SymRow:
        """The row of these bits (plain bools or z3 terms, such as the rows
        :func:`kvhit.model.spec.held_query` folds), as a Z3 array."""
        arr = z3.K(z3.IntSort(), z3.BoolVal(False))
        for j, bit in enumerate(bits):
            if z3.is_expr(bit) or bit:
                arr = z3.Store(arr, j, bit)
        return SymRow(arr, len(bits))

    def __len__(self) -> int:
        """The row's length, when it is concrete (as the model's ``len(row)`` reads it)."""
        return int(self.length)

    def values(self, model: z3.ModelRef, count: int) -> list[bool]:
        """The row's first ``count`` bits in a solver model."""
        bit = Z3Ops(count).bit
        return [z3.is_true(model.eval(bit(self, j), model_completion=True)) for j in range(count)]


def _concrete(*xs: Any) -> bool:
    return all(isinstance(x, (int, bool)) for x in xs)


class Z3Ops(Ops):
    """Operations that build Z3 terms; plain values pass through where they can.

    ``bound`` is the concrete number of block indices a scan is unrolled over when
    its limit is symbolic, and the number of fixed-point passes when that is.
    """

    def __init__(self, bound: int, passes: int | None = None):
        self.bound = bound
        self.pass_bound = passes if passes is not None else bound + 1

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(cond, bool):
            return then if cond else other
        return z3.If(cond, then, other)

    def and_(self, *terms: Any) -> Any:
        if any(t is False for t in terms):
            return False
        rest = [t for t in terms if t is not True]
        return z3.And(*rest) if rest else True

    def or_(self, *terms: Any) -> Any:
        if any(t is True for t in terms):
            return True
        rest = [t for t in terms if t is not False]
        return z3.Or(*rest) if rest else False

    def not_(self, term: Any) -> Any:
        return (not term) if isinstance(term, bool) else z3.Not(term)

    def div(self, a: Any, b: Any) -> Any:
        return a // b if _concrete(a, b) else a / b

    def indices(self, limit: Any) -> Iterable[int]:
        return range(limit) if _concrete(limit) else range(self.bound)

    def passes(self, limit: Any) -> Iterable[int]:
        return range(limit) if _concrete(limit) else range(self.pass_bound)

    def settled(self, before: Any, after: Any) -> bool:
        if _concrete(before, after):
            return before == after
        return z3.is_true(z3.simplify(before == after))

    def bit(self, row: Any, j: Any) -> Any:
        if not isinstance(row, SymRow):
            row = SymRow.of(row)
        return self.and_(j >= 0, j < row.length, z3.Select(row.bits, j))

    def all_cached(self, row: Any, lo: Any, hi: Any) -> Any:
        if not isinstance(row, SymRow):
            row = SymRow.of(row)
        inside = self.and_(lo >= 0, hi <= row.length)
        if _concrete(row.length):
            each = [
                z3.Implies(z3.And(lo <= j, j < hi), z3.Select(row.bits, j))
                for j in range(row.length)
            ]
        else:
            j = z3.FreshInt("j")
            each = [z3.ForAll([j], z3.Implies(z3.And(lo <= j, j < hi), z3.Select(row.bits, j)))]
        return self.or_(lo >= hi, self.and_(inside, *each))
