"""The small set of operations the reference model is written in.

Every finder, the fixed point and the validity predicates use only Python's
arithmetic and comparison operators plus the methods of an ``Ops`` object. With
:data:`PY` they run on plain ints and bools. The proof suite passes an ``Ops``
whose methods build Z3 terms instead, so the code that is proved is the code
that runs. That is why the model never writes ``if x:``, ``and``, ``or``,
``not``, ``min``, ``max`` or ``//`` on a value that may be symbolic.

    >>> PY.ite(3 < 4, "yes", "no")
    'yes'
    >>> PY.div(7, 2), PY.max(0, -1)
    (3, 0)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any


class Ops:
    """Operations on concrete Python values (the default interpretation).

    Subclasses reinterpret each method; the model calls nothing else.
    """

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        """``then`` if ``cond`` holds, else ``other``."""
        return then if cond else other

    def and_(self, *terms: Any) -> Any:
        """Conjunction."""
        return all(terms)

    def or_(self, *terms: Any) -> Any:
        """Disjunction."""
        return any(terms)

    def not_(self, term: Any) -> Any:
        """Negation."""
        return not term

    def min(self, a: Any, b: Any) -> Any:
        """The smaller of two integers."""
        return self.ite(a <= b, a, b)

    def max(self, a: Any, b: Any) -> Any:
        """The larger of two integers."""
        return self.ite(a >= b, a, b)

    def div(self, a: Any, b: Any) -> Any:
        """Floor division by a positive divisor."""
        return a // b

    def indices(self, limit: Any) -> Iterable[int]:
        """Concrete block indices a scan with ``limit`` blocks visits.

        Every visit is still guarded by ``j < limit``, so an interpretation with a
        symbolic limit may return a fixed bound here.
        """
        return range(limit)

    def passes(self, limit: Any) -> Iterable[int]:
        """Concrete pass numbers for a loop that runs at most ``limit`` passes."""
        return range(limit)

    def settled(self, before: Any, after: Any) -> bool:
        """True when a loop may stop: known, concretely, to have reached a fixed point."""
        return before == after

    def bit(self, row: Sequence[Any], j: Any) -> Any:
        """Whether block ``j`` of a group is cached (absent blocks are not)."""
        return 0 <= j < len(row) and bool(row[j])

    def all_cached(self, row: Sequence[Any], lo: Any, hi: Any) -> Any:
        """Whether every block in ``[lo, hi)`` is cached."""
        return all(self.bit(row, j) for j in range(lo, hi))


PY = Ops()
