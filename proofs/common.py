"""Shared pieces of the theorem modules: symbolic queries and abstract finders.

:func:`sym_query` builds a :class:`kvhit.model.spec.Query` whose cache rows,
windows, chunks and M are z3 terms, so the model's own ``fixed_point``,
``min_of_groups``, ``single_pass`` and ``valid`` run on it unchanged; the
:class:`SymQuery` it returns also reads a concrete protocol query back off a solver
model. :func:`spec_answer` is L* over it, straight from the spec's ``valid``.

:class:`AbstractFinders` is the other kind of finder the suite reasons about: any
finder at all that meets the contract, as uninterpreted functions (lengths in units
of the alignment).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import z3

from kvhit.model.algorithms import longest_of
from kvhit.model.protocol import parse_query
from kvhit.model.spec import EAGLE_KINDS, PARAMETERS, Drafter, Group, Kind, Query, group_of
from kvhit.proofs.symbolic import SymRow, Z3Ops

FinderKind = tuple[Kind, bool]
"""A finder: a kind, and whether the eagle wrapper is on."""

FINDERS: tuple[FinderKind, ...] = (
    *((kind, False) for kind in Kind),
    *((kind, True) for kind in EAGLE_KINDS),
)
"""Every finder: each kind, then the eagle wrapper on each kind a drafter can have.

    >>> [f"{kind}{' eagle' if eagle else ''}" for kind, eagle in FINDERS][3:]
    ['mamba', 'full eagle', 'sliding_window eagle']
"""

NOT_CLOSED: tuple[Kind, ...] = tuple(kind for kind in Kind if kind != Kind.FULL)
"""The kinds that are not downward closed (only full attention is: theorem 4)."""


def model_int(model: z3.ModelRef, x: Any) -> int:
    """The value of ``x`` (a plain int or an integer term) in the solver's model."""
    return x if isinstance(x, int) else model.eval(x, model_completion=True).as_long()


def protocol_group(g: Group, model: z3.ModelRef) -> dict[str, Any]:
    """Group g as a protocol object, its symbolic fields read off the model. The
    window convention is kept, so a counterexample replays under the same reading.

    >>> w = z3.Int("w")
    >>> s = z3.Solver()
    >>> s.add(w == 3)
    >>> _ = s.check()
    >>> g = Group("sliding_window", 2, window=w, window_convention="exclusive")
    >>> obj = protocol_group(g, s.model())
    >>> obj["window"], str(obj["window_convention"])
    (3, 'exclusive')
    """

    def num(x: Any) -> Any:
        return None if x is None else model_int(model, x)

    return replace(
        g, block_size=num(g.block_size), window=num(g.window), chunk=num(g.chunk)
    ).to_json()


@dataclass
class SymQuery:
    """A query with symbolic rows (``blocks`` concrete blocks each), windows, chunks, M."""

    query: Query
    ops: Z3Ops
    pre: list[Any]
    blocks: list[int]
    max_top: int

    def concrete(self, model: z3.ModelRef) -> Query:
        """The protocol query the solver's model describes (checked by the parser)."""
        q = self.query
        groups = [protocol_group(g, model) for g in q.groups]
        max_length = model_int(model, q.max_length)
        rows = []
        for g, row, count in zip(q.groups, q.cached, self.blocks):
            bits = row.values(model, count)
            # only the blocks a hit of at most M can look at are shown
            need = max_length // model_int(model, g.block_size) + (1 if g.eagle else 0)
            bits = bits[: max(need, 0)]
            while bits and not bits[-1]:
                bits.pop()
            rows.append(bits)
        return parse_query(
            {
                "groups": groups,
                "cached": rows,
                "max_length": max_length,
                "num_tokens": model_int(model, q.num_tokens),
                "alignment": model_int(model, q.alignment),
            }
        )

    def cached_count(self) -> Any:
        """How many blocks are cached, over every group (a term to minimize)."""
        terms = []
        for row, count in zip(self.query.cached, self.blocks):
            terms += [z3.If(self.ops.bit(row, j), 1, 0) for j in range(count)]
        return z3.Sum(terms) if terms else z3.IntVal(0)


def sym_query(
    kinds: Sequence[Kind | FinderKind],
    max_top: int,
    name: str,
    block_sizes: Sequence[int] | None = None,
    alignment: int = 1,
    max_param: int | None = None,
    passes: int | None = None,
) -> SymQuery:
    """Groups of the given kinds (a kind, or (kind, eagle); a string naming a kind
    will do), block size 1 unless given,
    rows long enough for any hit of at most ``max_top`` tokens, 0 ≤ M ≤ ``max_top``,
    T = M + 1 unless an eagle group makes it free (M < T ≤ max_top + its block).

    Windows and chunks are symbolic, at least 1 and at most ``max_param`` (default:
    enough to reach past every block).
    """
    sizes = list(block_sizes) if block_sizes is not None else [1] * len(kinds)
    top_blocks = max(max_top // b for b in sizes) + 2
    ops = Z3Ops(bound=top_blocks, passes=passes if passes is not None else max_top + 1)
    m = z3.Int(f"{name}_M")
    pre: list[Any] = [m >= 0, m <= max_top]
    limit = max_param if max_param is not None else max_top + 2
    groups, rows, blocks = [], [], []
    eagle_any = False
    for i, (spec, b) in enumerate(zip(kinds, sizes)):
        kind, eagle = (spec, False) if isinstance(spec, str) else spec
        eagle_any |= eagle
        parameter = PARAMETERS[Kind(kind)]
        span = z3.Int(f"{name}_{parameter[0]}{i}") if parameter is not None else None
        if span is not None:
            pre += [span >= 1, span <= limit]
        groups.append(group_of(Kind(kind), b, span, Drafter.DROP if eagle else None))
        count = max_top // b + (1 if eagle else 0)
        rows.append(SymRow.fresh(f"{name}_row{i}", count))
        blocks.append(count)
    if eagle_any:
        t = z3.Int(f"{name}_T")
        pre += [t > m, t <= max_top + max(sizes) + 1]
    else:
        t = m + 1
    q = Query(tuple(groups), tuple(rows), m, t, alignment)
    return SymQuery(q, ops, pre, blocks, max_top)


def spec_answer(sq: SymQuery) -> Any:
    """L*: the longest candidate at most M valid for every group, as a z3 term
    (:func:`kvhit.model.algorithms.longest_of` over every candidate up to the top)."""
    lengths = range(0, sq.max_top + 1, sq.query.alignment)
    return z3.IntVal(0) + longest_of(sq.query, lengths, sq.ops)


class AbstractFinders:
    """Any finders meeting the contract, lengths in units of A (docs/design.md §3, theorem 1).

    ``F(g, m)`` is group g's finder, ``V(g, L)`` its validity. :meth:`contract` are
    the axioms: 0 ≤ F(g, m) ≤ m, V(g, F(g, m)), and no valid L in (F(g, m), m].
    """

    def __init__(self, name: str):
        self.F = z3.Function(f"{name}_F", z3.IntSort(), z3.IntSort(), z3.IntSort())
        self.V = z3.Function(f"{name}_V", z3.IntSort(), z3.IntSort(), z3.BoolSort())
        self.name = name

    def contract(self) -> list[Any]:
        g, m, L = z3.Ints(f"{self.name}_g {self.name}_m {self.name}_L")
        F, V = self.F, self.V
        return [
            z3.ForAll(
                [g, m],
                z3.Implies(m >= 0, z3.And(F(g, m) >= 0, F(g, m) <= m, V(g, F(g, m)))),
                patterns=[F(g, m)],
            ),
            z3.ForAll(
                [g, m, L],
                z3.Implies(z3.And(m >= 0, F(g, m) < L, L <= m), z3.Not(V(g, L))),
                patterns=[z3.MultiPattern(F(g, m), V(g, L))],
            ),
        ]

    def finders(self, count: int) -> list[Callable[[Any], Any]]:
        """Python callables for groups 0 … count-1, to run the model's loop over."""
        return [partial(self.F, g) for g in range(count)]

    def best(self, groups: Any, top: Any, name: str) -> tuple[Any, list[Any]]:
        """L* for ``groups`` groups below ``top``, as a fresh constant and its definition."""
        ls = z3.Int(f"{name}_Lstar")
        g, L = z3.Ints(f"{name}_bg {name}_bL")
        blame = z3.Function(f"{name}_blame", z3.IntSort(), z3.IntSort())
        V = self.V
        facts = [
            ls >= 0,
            ls <= top,
            z3.ForAll([g], z3.Implies(z3.And(g >= 0, g < groups), V(g, ls))),
            # every longer candidate is invalid for some group: blame(L) names it
            z3.ForAll(
                [L],
                z3.Implies(
                    z3.And(ls < L, L <= top),
                    z3.And(blame(L) >= 0, blame(L) < groups, z3.Not(V(blame(L), L))),
                ),
            ),
        ]
        return ls, facts

    def ground_contract(self, groups: int, top: int) -> list[Any]:
        """The contract for groups 0 … groups-1 and inputs 0 … top, quantifier-free
        (all a fixed point from top can use: every finder maps [0, top] into itself)."""
        F, V = self.F, self.V
        out: list[Any] = []
        for g in range(groups):
            for m in range(top + 1):
                f = F(g, m)
                out += [f >= 0, f <= m, V(g, f)]
                out += [z3.Implies(f < L, z3.Not(V(g, L))) for L in range(1, m + 1)]
        return out

    def ground_best(self, groups: int, top: int, name: str) -> tuple[Any, list[Any]]:
        """L* for ``groups`` groups below a concrete ``top``, quantifier-free."""
        ls = z3.Int(f"{name}_Lstar")
        V = self.V
        facts = [ls >= 0, ls <= top, *[V(g, ls) for g in range(groups)]]
        facts += [
            z3.Implies(ls < L, z3.Or(*[z3.Not(V(g, L)) for g in range(groups)]))
            for L in range(top + 1)
        ]
        return ls, facts
