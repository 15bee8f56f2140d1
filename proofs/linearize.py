"""Nonlinear arithmetic as uninterpreted functions plus proved lemmas.

With the block size b and the alignment A symbolic, the model's code multiplies and
divides by them (``end * b``, ``m // b``, ``L % A``), and z3 and cvc5 answer
unknown on such integer goals. :func:`linearize` makes such a goal linear without
changing what its unsat answer means:

- every product ``x * d``, quotient ``x / d`` and remainder ``x % d`` by a symbolic
  *scale* d (b, A, a chunk) becomes an application of an uninterpreted function,
  ``mul_d(x)`` or ``div_d(x)`` (a remainder is ``x - mul_d(div_d(x))``), so equal
  arguments still give equal results;
- then it adds instances of the lemmas of :func:`lemmas` at the terms the goal
  holds: the floor bounds of every quotient; for every two products by one scale,
  how their difference compares with the difference of their arguments (order, and
  exactly at small gaps); and, where A = a·b, that every multiple of A is a
  multiple of b. Each instance is guarded by the lemma's premise (d ≥ 1, A = a·b).

Each lemma is a true fact about integer arithmetic, proved as its own nonlinear
goal (the ``arithmetic_lemmas`` theorem, :func:`lemmas`). So a counterexample to the
original goal, with the functions read as the real operations, satisfies the linear
goal too: if the linear goal is unsat, so is the original.

    >>> import z3
    >>> b, e, q = z3.Ints("b e q")
    >>> goal = [b >= 1, q == (e * b) / b, q != e]
    >>> s = z3.Solver(); s.add(*linearize(goal, [b])); s.check()
    unsat
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import z3

GAPS = (-2, -1, 0, 1, 2)
"""Differences g of the arguments at which products are compared exactly:
``y - x ≥ g ⇒ y·d - x·d ≥ g·d``, and the same with ≤."""


def floor_bounds(x: Any, dq: Any, d: Any) -> Any:
    """``dq = d·(x / d)`` lies in ``(x - d, x]`` (d ≥ 1)."""
    return z3.And(dq <= x, x < dq + d)


def scaling(x: Any, y: Any, mx: Any, my: Any, d: Any) -> Any:
    """``mx = x·d`` and ``my = y·d`` (d ≥ 1), compared linearly: a difference of at
    least (at most) g in the arguments is one of at least (at most) g·d."""
    apart, scaled = y - x, my - mx  # built once: a goal has thousands of these
    return z3.And(
        z3.Implies(y >= x, scaled >= apart),
        *[z3.Implies(apart >= g, scaled >= g * d) for g in GAPS],
        *[z3.Implies(apart <= g, scaled <= g * d) for g in GAPS],
    )


def lemmas() -> dict[str, Any]:
    """Each lemma the instances come from, as one nonlinear formula over fresh integers."""
    d, x, y, k, a = z3.Ints("lemma_d lemma_x lemma_y lemma_k lemma_a")
    return {
        "floor": z3.Implies(d >= 1, floor_bounds(x, d * (x / d), d)),
        "scaling": z3.Implies(d >= 1, scaling(x, y, x * d, y * d, d)),
        "remainder": z3.Implies(d >= 1, x % d == x - d * (x / d)),
        "multiple": z3.Implies(z3.And(d >= 1, k == a * d), d * ((k * x) / d) == k * x),
    }


class _Linearizer:
    """One goal's rewrite: the function applications it made, per scale."""

    def __init__(self, scales: Sequence[Any]) -> None:
        self.scales = {s.get_id(): s for s in scales}
        self.mul_f = {
            i: z3.Function(f"mul_{s}", z3.IntSort(), z3.IntSort()) for i, s in self.scales.items()
        }
        self.div_f = {
            i: z3.Function(f"div_{s}", z3.IntSort(), z3.IntSort()) for i, s in self.scales.items()
        }
        self.muls: dict[int, dict[int, tuple[Any, Any]]] = {i: {} for i in self.scales}
        self.divs: dict[int, dict[int, tuple[Any, Any]]] = {i: {} for i in self.scales}
        self.cache: dict[int, Any] = {}

    def mul(self, x: Any, scale: Any) -> Any:
        i = scale.get_id()
        app = self.mul_f[i](x)
        self.muls[i].setdefault(x.get_id(), (x, app))
        return app

    def div(self, x: Any, scale: Any) -> Any:
        i = scale.get_id()
        app = self.div_f[i](x)
        if x.get_id() not in self.divs[i]:
            self.divs[i][x.get_id()] = (x, app)
            self.mul(app, scale)
        return app

    def rewrite(self, e: Any) -> Any:
        if e.get_id() not in self.cache:
            self.cache[e.get_id()] = self._rewrite(e)
        return self.cache[e.get_id()]

    def _rewrite(self, e: Any) -> Any:
        if z3.is_quantifier(e):
            raise ValueError("linearize takes quantifier-free goals (ground them first)")
        if not z3.is_app(e) or e.num_args() == 0:
            return e
        args = [self.rewrite(a) for a in e.children()]
        kind = e.decl().kind()
        if kind == z3.Z3_OP_MUL:
            return self._product(e, args)
        if kind in (z3.Z3_OP_IDIV, z3.Z3_OP_MOD) and not z3.is_int_value(args[1]):
            if args[1].get_id() not in self.scales:
                raise ValueError(f"cannot linearize {e}: its divisor is not a scale")
            q = self.div(args[0], args[1])
            return q if kind == z3.Z3_OP_IDIV else args[0] - self.mul(q, args[1])
        return e.decl()(*args)

    def _product(self, e: Any, args: list[Any]) -> Any:
        others = [a for a in args if not z3.is_int_value(a)]
        if len(others) <= 1:
            return e.decl()(*args)
        scales = [a for a in others if a.get_id() in self.scales]
        if len(others) != 2 or not scales:
            raise ValueError(f"cannot linearize {e}: not a product by one scale")
        scale = scales[-1]
        out = self.mul(others[0] if others[1] is scale else others[1], scale)
        for n in args:
            if z3.is_int_value(n):
                out = n * out
        return out

    def instances(self, multiples: Sequence[tuple[Any, Any, Any]]) -> list[Any]:
        out: list[Any] = []
        for small, big, ratio in multiples:  # first: they add quotients and products
            premise = z3.And(small >= 1, big == self.mul(ratio, small))
            for _, m in list(self.muls[big.get_id()].values()):
                out.append(z3.Implies(premise, self.mul(self.div(m, small), small) == m))
        for i, d in self.scales.items():
            each = [floor_bounds(x, self.mul_f[i](q), d) for x, q in self.divs[i].values()]
            terms = [*self.muls[i].values(), (z3.IntVal(0), z3.IntVal(0))]
            for (x, mx), (y, my) in itertools.combinations(terms, 2):
                each += [scaling(x, y, mx, my, d), scaling(y, x, my, mx, d)]
            if each:
                out.append(z3.Implies(d >= 1, z3.And(*each)))
        return out


def linearize(
    assertions: Sequence[Any],
    scales: Sequence[Any],
    multiples: Sequence[tuple[Any, Any, Any]] = (),
) -> list[Any]:
    """A quantifier-free goal with products, quotients and remainders by ``scales``
    replaced by uninterpreted functions, plus the lemma instances at its terms (see
    the module docstring). ``multiples`` lists triples (b, A, a) of terms, b and A
    scales, for which the instances of "a multiple of A = a·b is a multiple of b" are
    added."""
    lin = _Linearizer(scales)
    out = [lin.rewrite(a) for a in assertions]
    return out + lin.instances(multiples)
