"""Integers given by cases, so an unrolled scan stays (almost) propositional.

A scan unrolled over symbolic cache bits carries integers such as a run length or
the best hit so far. As plain Z3 ``If`` terms they grow into deep nests, and every
``run + 1 >= k`` becomes arithmetic the solver must reason through. But those
integers only ever take a few concrete values, each under some condition on the
bits. :class:`Cases` keeps them that way: a list of arms ``(value, guard)``, whose
guards are disjoint and cover every case. Arithmetic works arm by arm, so
``run + 1`` stays a list of concrete numbers, and a comparison becomes a
disjunction of guards, each with a fact about concrete numbers (``k <= 5``, a bound
on a single variable). This is the state merging of symbolic-execution tools
(value summaries), applied to the model's own code through :class:`CaseOps`.

    >>> import z3
    >>> ops = CaseOps(bound=4)
    >>> c, d = z3.Bools("c d")
    >>> run = ops.ite(c, 3, 0)
    >>> run + 1
    Cases(arms=((4, c), (1, Not(c))))
    >>> run + 1 >= 2
    c
    >>> ops.ite(d, run, 0)  # the two ways to 0 merge into one arm
    Cases(arms=((3, And(d, c)), (0, Or(And(d, Not(c)), Not(d)))))
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import product
from typing import Any

import z3

from kvhit.proofs.symbolic import Z3Ops

Arm = tuple[Any, Any]  # (integer value, guard)


def _join(connective: Any, terms: Iterable[Any], unit: bool) -> Any:
    """``connective`` over the distinct terms, Python bools folded: True and … and x is
    x, and a single term stays itself (so guards stay small and readable)."""
    distinct: dict[int, Any] = {}
    for t in terms:
        if t is (not unit):
            return not unit
        if t is not unit:
            distinct.setdefault(t.get_id(), t)
    if not distinct:
        return unit
    (first, *rest) = distinct.values()
    return connective(first, *rest) if rest else first


def _and(*terms: Any) -> Any:
    return _join(z3.And, terms, True)


def _or(*terms: Any) -> Any:
    return _join(z3.Or, terms, False)


def _same(a: Any, b: Any) -> bool:
    if z3.is_expr(a) or z3.is_expr(b):
        return z3.is_expr(a) and z3.is_expr(b) and a.eq(b)
    return a == b


@dataclass(frozen=True)
class Cases:
    """An integer that is ``value`` when ``guard`` holds, for each of its arms."""

    arms: tuple[Arm, ...]

    @staticmethod
    def arms_of(x: Any) -> tuple[Arm, ...]:
        """The arms of a :class:`Cases`, or the one arm of a plain value."""
        return x.arms if isinstance(x, Cases) else ((x, True),)

    @staticmethod
    def make(arms: Iterable[Arm]) -> Any:
        """Cases from arms, equal values merged and impossible arms dropped; a plain
        value when only one is left."""
        merged: list[list[Any]] = []
        for value, guard in arms:
            if guard is False:
                continue
            for arm in merged:
                if _same(arm[0], value):
                    arm[1] = _or(arm[1], guard)
                    break
            else:
                merged.append([value, guard])
        if len(merged) == 1:
            return merged[0][0]
        return Cases(tuple((v, g) for v, g in merged))

    @staticmethod
    def apply(f: Callable[..., Any], *args: Any) -> Any:
        """f on every combination of the arguments' arms, as Cases."""
        return Cases.make(
            (f(*(v for v, _ in combo)), _and(*(g for _, g in combo)))
            for combo in product(*map(Cases.arms_of, args))
        )

    @staticmethod
    def holds(test: Callable[..., Any], *args: Any) -> Any:
        """The condition under which ``test`` (a Boolean function) holds of the arguments."""
        return _or(
            *(
                _and(*(g for _, g in combo), test(*(v for v, _ in combo)))
                for combo in product(*map(Cases.arms_of, args))
            )
        )

    def __bool__(self) -> bool:
        raise TypeError("a symbolic integer has no truth value; use ops.ite")

    def __add__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: a + b, self, o)

    def __radd__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: b + a, self, o)

    def __sub__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: a - b, self, o)

    def __rsub__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: b - a, self, o)

    def __mul__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: a * b, self, o)

    def __rmul__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: b * a, self, o)

    def __mod__(self, o: Any) -> Any:
        return Cases.apply(lambda a, b: a % b, self, o)

    def __truediv__(self, o: Any) -> Any:
        return Cases.apply(_Z3.div, self, o)

    def __lt__(self, o: Any) -> Any:
        return Cases.holds(lambda a, b: a < b, self, o)

    def __le__(self, o: Any) -> Any:
        return Cases.holds(lambda a, b: a <= b, self, o)

    def __gt__(self, o: Any) -> Any:
        return Cases.holds(lambda a, b: a > b, self, o)

    def __ge__(self, o: Any) -> Any:
        return Cases.holds(lambda a, b: a >= b, self, o)

    def __eq__(self, o: object) -> Any:  # type: ignore[override]
        return Cases.holds(lambda a, b: a == b, self, o)

    def __ne__(self, o: object) -> Any:  # type: ignore[override]
        return Cases.holds(lambda a, b: a != b, self, o)

    __hash__ = None  # type: ignore[assignment]

    def term(self) -> Any:
        """The same integer as one z3 ``If`` chain."""
        (last, _), *rest = reversed(self.arms)
        out = last
        for value, guard in rest:
            out = z3.If(guard, value, out)
        return out


_Z3 = Z3Ops(bound=1)


def is_boolean(x: Any) -> bool:
    """Whether x is a truth value (a Python bool or a z3 Boolean term)."""
    return isinstance(x, bool) or (z3.is_expr(x) and z3.is_bool(x))


class CaseOps(Z3Ops):
    """:class:`Z3Ops` whose ``ite`` on integers builds :class:`Cases`.

    ``bit`` and ``all_cached`` (and anything a subclass puts behind them) see one
    arm's values at a time, so they never get a :class:`Cases`.
    """

    def ite(self, cond: Any, then: Any, other: Any) -> Any:
        if isinstance(cond, bool) or is_boolean(then):
            return super().ite(cond, then, other)
        return Cases.make(
            [
                *((v, _and(cond, g)) for v, g in Cases.arms_of(then)),
                *((v, _and(z3.Not(cond), g)) for v, g in Cases.arms_of(other)),
            ]
        )

    def bit(self, row: Any, j: Any) -> Any:
        return Cases.holds(lambda k: super(CaseOps, self).bit(row, k), j)

    def all_cached(self, row: Any, lo: Any, hi: Any) -> Any:
        return Cases.holds(lambda a, b: super(CaseOps, self).all_cached(row, a, b), lo, hi)
