"""Make a quantified goal quantifier-free by instantiating it by hand.

A goal's assertions describe a counterexample, so an unsat answer is the proof.
:func:`ground` rewrites them into a quantifier-free set that is unsat whenever it
can be, and whose unsat answer still proves the claim:

- a ``ForAll`` in a negative position (under an odd number of negations) is false
  on a counterexample, so it has a witness: its body at fresh constants;
- a ``ForAll`` in a positive position is a hypothesis: it is replaced by its body at
  a finite set of ground terms. A weaker hypothesis only makes the goal easier to
  satisfy, so if the weaker goal is unsat, the original one is too.

The ground terms are the witnesses, the indices the goal reads its cache rows at,
and the arguments and values of the rows' last-miss functions (``*_below``). With
those, both z3 and cvc5 settle the loop-invariant goals of
:mod:`kvhit.proofs.theorems.contracts` quickly; cvc5 cannot find the instances on its own.
If the instances are too few, the grounded goal is sat and the theorem fails as an
error (its "counterexample" does not break the plain model), never as a proof.

    >>> import z3
    >>> x, y = z3.Ints("x y")
    >>> f = z3.Function("f", z3.IntSort(), z3.IntSort())
    >>> goal = [z3.ForAll([x], f(x) > x), z3.Not(z3.ForAll([y], f(y) >= y))]
    >>> grounded = ground(goal)
    >>> any(has_quantifier(a) for a in grounded)
    False
    >>> s = z3.Solver(); s.add(*grounded); s.check()
    unsat
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

import z3

_CONNECTIVES = (z3.Z3_OP_AND, z3.Z3_OP_OR)


def _occurs(term: Any, test: Any) -> bool:
    seen: set[int] = set()
    todo = [term]
    while todo:
        e = todo.pop()
        if e.get_id() in seen:
            continue
        seen.add(e.get_id())
        if test(e):
            return True
        if not z3.is_quantifier(e):
            todo.extend(e.children())
    return False


def _is_miss_lookup(e: Any) -> bool:
    return z3.is_app(e) and e.decl().name().endswith("_below") and e.num_args() == 1


def _reads_miss_function(h: Any) -> bool:
    """Whether a hypothesis looks up a last-miss function at one of its bound variables."""
    return _occurs(h.body(), lambda e: _is_miss_lookup(e) and z3.is_var(e.arg(0)))


def has_quantifier(term: Any) -> bool:
    """Whether a quantifier occurs anywhere in ``term``."""
    return _occurs(term, z3.is_quantifier)


class _Grounding:
    def __init__(self) -> None:
        self.witnesses: list[Any] = []
        self.hypotheses: list[tuple[Any, Any]] = []  # (placeholder, quantifier)

    def rewrite(self, e: Any, positive: bool) -> Any:
        if z3.is_quantifier(e) and e.is_forall():
            if positive:
                placeholder = z3.FreshBool("forall")
                self.hypotheses.append((placeholder, e))
                return placeholder
            fresh = [z3.FreshConst(e.var_sort(i), "witness") for i in range(e.num_vars())]
            self.witnesses.extend(fresh)
            # de Bruijn index 0 is the innermost (last) bound variable
            return self.rewrite(z3.substitute_vars(e.body(), *reversed(fresh)), positive)
        if not z3.is_app(e) or not z3.is_bool(e):
            return e
        kind, args = e.decl().kind(), e.children()
        if kind == z3.Z3_OP_NOT:
            return z3.Not(self.rewrite(args[0], not positive))
        if kind in _CONNECTIVES:
            return e.decl()(*[self.rewrite(a, positive) for a in args])
        if kind == z3.Z3_OP_IMPLIES:
            return z3.Implies(self.rewrite(args[0], not positive), self.rewrite(args[1], positive))
        if kind == z3.Z3_OP_ITE:
            return z3.If(args[0], self.rewrite(args[1], positive), self.rewrite(args[2], positive))
        return e  # anything else keeps its quantifiers, if any: still sound


def _ground_terms(terms: Sequence[Any]) -> tuple[list[Any], list[Any]]:
    """(last-miss arguments, every integer term worth instantiating at)."""
    arguments: dict[int, Any] = {}
    pool: dict[int, Any] = {}
    seen: set[int] = set()
    todo = list(terms)
    while todo:
        e = todo.pop()
        if e.get_id() in seen or not z3.is_app(e):
            continue
        seen.add(e.get_id())
        if _is_miss_lookup(e):
            arguments[e.arg(0).get_id()] = e.arg(0)
            pool[e.arg(0).get_id()] = e.arg(0)
            pool[e.get_id()] = e
        if e.decl().kind() == z3.Z3_OP_SELECT:
            pool[e.arg(1).get_id()] = e.arg(1)
        todo.extend(e.children())
    return list(arguments.values()), list(pool.values())


def ground(assertions: Sequence[Any]) -> list[Any]:
    """The goal with every universal quantifier skolemized or instantiated.

    A hypothesis that reads a last-miss function (the axioms ``∀e`` and ``∀e, q``)
    takes e from the last-miss arguments and any further variable from the whole
    pool; every other hypothesis is instantiated at the witnesses. Only integer
    variables are instantiated.
    """
    g = _Grounding()
    out = [g.rewrite(a, True) for a in assertions]
    bodies = [h.body() for _, h in g.hypotheses]
    arguments, pool = _ground_terms([*out, *bodies])
    # terms read off a hypothesis' body may mention its bound variables: not ground
    arguments = [t for t in arguments if not _occurs(t, z3.is_var)]
    pool = [t for t in pool if not _occurs(t, z3.is_var)]
    pool = list({t.get_id(): t for t in [*g.witnesses, *pool]}.values())
    for placeholder, h in g.hypotheses:
        if any(h.var_sort(i) != z3.IntSort() for i in range(h.num_vars())):
            raise ValueError(f"cannot ground a quantifier over {h.var_sort(0)}: {h}")
        if _reads_miss_function(h):
            choices = [arguments] + [pool] * (h.num_vars() - 1)
        else:
            choices = [g.witnesses] * h.num_vars()
        instances = [
            z3.substitute_vars(h.body(), *reversed(combo)) for combo in itertools.product(*choices)
        ]
        if instances:  # with none, the placeholder is left free: no assumption at all
            out.append(z3.Implies(placeholder, z3.And(*instances)))
    return out
