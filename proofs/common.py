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
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Any

import z3

from kvhit.model.algorithms import longest_of
from kvhit.model.protocol import parse_query
from kvhit.model.spec import (
    DRAFTERS,
    PARAMETERS,
    Drafter,
    Group,
    Kind,
    Query,
    Upto,
    WindowConvention,
    fine_query,
    fine_row,
    group_of,
)
from kvhit.proofs.symbolic import SymRow, Z3Ops

FinderKind = tuple[Kind, Drafter | None]
"""A finder: a kind, and the drafter its group carries (None: no drafter)."""

FINDERS: tuple[FinderKind, ...] = tuple(
    (kind, drafter)
    for drafter in (None, *Drafter)
    for kind in Kind
    if drafter is None or drafter in DRAFTERS[kind]
)
"""Every finder: each kind without a drafter, then each kind with each drafter
:data:`~kvhit.model.spec.DRAFTERS` allows it (drop, none, lookahead).

    >>> [finder_label(f) for f in FINDERS][3:7]
    ['mamba', 'full eagle', 'sliding_window eagle', 'full drafter=none']
"""

DISTINCT_FINDERS: tuple[FinderKind, ...] = tuple(f for f in FINDERS if f[1] != Drafter.NONE)
"""The finders up to the ``none`` drafter, which the theorem ``drafter_none_same``
proves behaves exactly as no drafter (same scan, same ``valid``): the theorems that
range over sets of finders draw from these.

    >>> [finder_label(f) for f in DISTINCT_FINDERS][6:]
    ['full lookahead', 'sliding_window lookahead', 'chunked_local lookahead', 'mamba lookahead']
"""

DRAFTED_FINDERS: tuple[FinderKind, ...] = tuple(f for f in DISTINCT_FINDERS if f[1] is not None)
"""The finders whose drafter changes what they find: drop (eagle) and lookahead."""


def finder_label(finder: FinderKind) -> str:
    """``kind``, ``kind eagle``, ``kind drafter=none`` or ``kind lookahead``.

    >>> finder_label((Kind.MAMBA, Drafter.LOOKAHEAD))
    'mamba lookahead'
    """
    kind, drafter = finder
    if drafter is None:
        return str(kind)
    if drafter == Drafter.DROP:
        return f"{kind} eagle"
    if drafter == Drafter.LOOKAHEAD:
        return f"{kind} lookahead"
    return f"{kind} drafter={drafter}"


def finder_group(
    finder: FinderKind,
    block_size: Any,
    span: Any = None,
    lookahead: Any = 0,
    convention: WindowConvention = WindowConvention.INCLUSIVE,
) -> Group:
    """The group of this finder: its window or chunk (if its kind reads one) ``span``,
    its La (if its drafter is lookahead) ``lookahead``."""
    kind, drafter = finder
    g = group_of(kind, block_size, span, drafter, convention)
    return replace(g, lookahead=lookahead) if drafter == Drafter.LOOKAHEAD else g


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
        g,
        block_size=num(g.block_size),
        window=num(g.window),
        chunk=num(g.chunk),
        lookahead=num(g.lookahead),
    ).to_json()


@dataclass
class SymQuery:
    """A query with symbolic rows (``blocks`` concrete blocks each), windows, chunks, M."""

    query: Query
    ops: Z3Ops
    pre: list[Any]
    blocks: list[int]
    max_top: int
    past: int = 0
    """Blocks past those a hit of at most M can need that the counterexample still
    shows (a known-wrong algorithm may read further)."""

    def concrete(self, model: z3.ModelRef) -> Query:
        """The protocol query the solver's model describes (checked by the parser)."""
        q = self.query
        rows = [self.shown_row(model, i, row) for i, row in enumerate(q.cached)]
        return parse_query(
            {
                "groups": [protocol_group(g, model) for g in q.groups],
                "cached": rows,
                "max_length": model_int(model, q.max_length),
                "num_tokens": model_int(model, q.num_tokens),
                "alignment": model_int(model, q.alignment),
            }
        )

    def shown_row(self, model: z3.ModelRef, i: int, row: SymRow) -> list[bool]:
        """A row of group i in the solver's model: only the blocks a hit of at most M
        can look at, its trailing misses dropped."""
        g = self.query.groups[i]
        bits = row.values(model, self.blocks[i])
        need = model_int(model, self.query.max_length) // model_int(model, g.block_size)
        bits = bits[: max(need + int(g.eagle) + self.past, 0)]
        while bits and not bits[-1]:
            bits.pop()
        return bits

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
    """Groups of the given kinds (a kind, or (kind, drafter); a string naming a kind
    will do), block size 1 unless given,
    rows long enough for any hit of at most ``max_top`` tokens, 0 ≤ M ≤ ``max_top``,
    T = M + 1 unless a drop or lookahead drafter makes it free
    (M < T ≤ max_top + the largest block + 1).

    Windows, chunks and lookaheads La are symbolic: a window or chunk at least 1, La
    at least 0, each at most ``max_param`` (default: enough to reach past every block).
    """
    sizes = list(block_sizes) if block_sizes is not None else [1] * len(kinds)
    top_blocks = max(max_top // b for b in sizes) + 2
    ops = Z3Ops(bound=top_blocks, passes=passes if passes is not None else max_top + 1)
    m = z3.Int(f"{name}_M")
    pre: list[Any] = [m >= 0, m <= max_top]
    limit = max_param if max_param is not None else max_top + 2
    groups, rows, blocks = [], [], []
    for i, (spec, b) in enumerate(zip(kinds, sizes)):
        kind, drafter = (Kind(spec), None) if isinstance(spec, str) else spec
        parameter = PARAMETERS[kind]
        span = z3.Int(f"{name}_{parameter[0]}{i}") if parameter is not None else None
        if span is not None:
            pre += [span >= 1, span <= limit]
        la = z3.Int(f"{name}_La{i}")
        if drafter == Drafter.LOOKAHEAD:
            pre += [la >= 0, la <= limit]
        group = finder_group((kind, drafter), b, span, la)
        groups.append(group)
        count = max_top // b + (1 if group.eagle else 0)
        rows.append(SymRow.fresh(f"{name}_row{i}", count))
        blocks.append(count)
    if any(g.drafter in READS_T for g in groups):
        t = z3.Int(f"{name}_T")
        pre += [t > m, t <= max_top + max(sizes) + 1]
    else:
        t = m + 1
    q = Query(tuple(groups), tuple(rows), m, t, alignment)
    return SymQuery(q, ops, pre, blocks, max_top)


READS_T = (Drafter.DROP, Drafter.LOOKAHEAD)
"""The drafters whose validity reads the request length T."""


def block_entries(g: Group, unit: int, j: int) -> list[Any]:
    """Every entry block j of group g can have with hash unit ``unit``, by how many
    units it holds: ``False`` (0), ``Upto(j·b + d·unit)`` (d = 1 … k-1) and ``True``
    (k), k = b / unit."""
    k = g.block_size // unit
    start = j * g.block_size
    return [False, *(Upto(start + d * unit) for d in range(1, k)), True]


def fine_bits(g: Group, unit: int, choices: Sequence[Any]) -> list[Any]:
    """The fine row of a coarse row whose block j holds ``choices[j]`` units (a z3
    integer, 0 … k; :func:`block_entries`): bit i is true iff block j's choice is one
    whose entry the model's own :func:`~kvhit.model.spec.fine_row` expands with bit i
    set (it runs on every concrete entry of every block)."""
    k = g.block_size // unit
    out: list[Any] = []
    for j, choice in enumerate(choices):
        expanded = [
            fine_row(g, (False,) * j + (entry,), unit)[j * k :]
            for entry in block_entries(g, unit, j)
        ]
        for r in range(k):
            out.append(z3.Or(*[choice == d for d, bits in enumerate(expanded) if bits[r]]))
    return out


def row_of(bits: Sequence[Any]) -> SymRow:
    """A :class:`SymRow` of these bit terms."""
    arr = z3.K(z3.IntSort(), z3.BoolVal(False))
    for i, bit in enumerate(bits):
        arr = z3.Store(arr, i, bit)
    return SymRow(arr, len(bits))


@dataclass
class FineSymQuery(SymQuery):
    """A symbolic query with a hash unit: ``query`` is its fine query (every group at
    block size h, each row the model's :func:`fine_row` of a coarse row whose entries
    are z3 choices), ``coarse`` the groups at their own block sizes and ``choices``
    their rows (:func:`fine_bits`)."""

    coarse: tuple[Group, ...] = ()
    choices: list[list[Any]] = field(default_factory=list)

    def concrete(self, model: z3.ModelRef) -> Query:
        """The protocol query with its hash unit, partial blocks as ``{"upto": p}``."""
        q = self.query
        rows = []
        for g, choices in zip(self.coarse, self.choices):
            row = [
                block_entries(g, q.groups[0].block_size, j)[model_int(model, c)]
                for j, c in enumerate(choices)
            ]
            while row and row[-1] is False:
                row.pop()
            rows.append([e.to_json() if isinstance(e, Upto) else e for e in row])
        fine = [protocol_group(g, model) for g in q.groups]
        groups = [{**obj, "block_size": g.block_size} for obj, g in zip(fine, self.coarse)]
        return parse_query(
            {
                "groups": groups,
                "cached": rows,
                "max_length": model_int(model, q.max_length),
                "num_tokens": model_int(model, q.num_tokens),
                "alignment": model_int(model, q.alignment),
                "hash_unit": q.groups[0].block_size,
            }
        )

    def cached_count(self) -> Any:
        """How many units the rows hold, over every group (a term to minimize)."""
        return z3.Sum([c for row in self.choices for c in row])

    def partial_somewhere(self) -> Any:
        """Some block is partially filled (holds more than 0 and fewer than k units)."""
        unit = self.query.groups[0].block_size
        return z3.Or(
            *[
                z3.And(c > 0, c < g.block_size // unit)
                for g, row in zip(self.coarse, self.choices)
                for c in row
            ]
        )


def fine_sym_query(
    kinds: Sequence[Kind | FinderKind],
    block_sizes: Sequence[int],
    unit: int,
    max_top: int,
    name: str,
    alignment: int | None = None,
) -> FineSymQuery:
    """:func:`sym_query`'s groups at these block sizes with hash unit ``unit``, as a
    :class:`FineSymQuery`: the fine query the model's own :func:`fine_query` makes of
    them, rows from every choice of entries (true, false, partial) of enough blocks
    for a hit of at most ``max_top`` tokens; A = ``unit`` unless given."""
    coarse = sym_query(kinds, max_top, name, block_sizes, alignment or unit)
    fine_groups = fine_query(
        replace(coarse.query, cached=((),) * len(block_sizes), hash_unit=unit)
    ).groups
    pre = list(coarse.pre)
    rows, choices = [], []
    for i, g in enumerate(coarse.query.groups):
        count = -(-(max_top + (unit if g.eagle else 0)) // g.block_size)
        held = [z3.Int(f"{name}_units{i}_{j}") for j in range(count)]
        pre += [z3.And(c >= 0, c <= g.block_size // unit) for c in held]
        rows.append(row_of(fine_bits(g, unit, held)))
        choices.append(held)
    q = replace(coarse.query, groups=fine_groups, cached=tuple(rows))
    ops = Z3Ops(bound=max_top // unit + 2, passes=max_top // unit + 1)
    blocks = [len(r) for r in choices]
    return FineSymQuery(q, ops, pre, blocks, max_top, coarse=coarse.query.groups, choices=choices)


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
