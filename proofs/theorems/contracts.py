"""Theorem 3: every finder meets its contract (docs/design.md §3).

The contract of a finder f for one group, at every m ≥ 0:

    f(m) ≤ m,  f(m) is a multiple of A,  valid(f(m)),  and no multiple L of A
    with f(m) < L ≤ m is valid.

The finders are the model's own scans (:func:`kvhit.model.finders.scan_for`), each
a fold ``step(state, j, cached bit)``. Both proofs here run that very ``step`` on
z3 terms:

- **unbounded** (:func:`unbounded_goals`): ``step`` runs once on a symbolic state at
  a symbolic block index, over a cache row that is a z3 array of any length, against
  a loop invariant written below, one per kind. Three queries per finder: the
  invariant holds at the start, one step keeps it, and at the exit it implies the
  contract. This covers rows of every length, so every bound at once.
- **unrolled** (:func:`unrolled_goals`): the whole fold over rows of N concrete
  blocks of symbolic bits, against the contract, quantifier-free: a cross-check that
  does not rest on the invariants. Its integers (run lengths, hits) are kept as
  :class:`~kvhit.proofs.cases.Cases` of concrete values, and its ``all_cached``
  reads the row's last-miss table spelled out over the bits (:meth:`MissRow.bounded`),
  so each validity test is one lookup. Its cost grows quickly with N (an
  equivalence check over every window at once): see :data:`UNROLLED_CHECKS`.

The invariants state "no valid L in (x, y]" over the spec's own ``valid``. To keep
those quantifiers out of the undecidable ∀∃ shape, the unbounded proofs read each
cache row through its *last-miss function* ``below(e)`` — the largest uncached block
index under e, or −1 — fixed by two axioms (:func:`miss_axioms`) that every row
satisfies with exactly one such function, so they add no assumption. Through it,
``all_cached(lo, hi)`` is ``lo ≥ hi or (lo ≥ 0, hi ≤ length and below(hi) < lo)``
(:class:`MissOps`),
quantifier-free; the test suite checks this reading against the plain one.
The remaining quantifiers (the axioms, and ``none_valid``) are then removed by hand
(:func:`kvhit.proofs.instantiate.ground`), so each goal is quantifier-free and cvc5
settles it as quickly as z3.

Block size b and alignment A are concrete in each query (products of two symbolic
lengths make the arithmetic nonlinear and the solver gives up); the theorem runs a
grid of them (:data:`CONFIGS`, :data:`UNROLLED_CHECKS`). Everything else is
symbolic: cache rows, window, chunk, m and the request length T.

A sliding window finder is proved under both window conventions
(:data:`CONTRACT_FINDERS`): its group is built with that convention, so the scan and
``valid`` read the window through the model's own ``window_before``, as they do when
they run.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import z3

from kvhit.model.finders import Frame, Scan, find, frame_for, run_scan, scan_for
from kvhit.model.protocol import parse_query
from kvhit.model.spec import (
    PARAMETERS,
    WINDOW_CONVENTIONS,
    Drafter,
    Group,
    Kind,
    WindowConvention,
    longest_hit,
    valid,
    window_span,
)
from kvhit.proofs import linearize as linear
from kvhit.proofs.cases import CaseOps, Cases, is_boolean
from kvhit.proofs.common import (
    DISTINCT_FINDERS,
    finder_group,
    finder_label,
    model_int,
    protocol_group,
)
from kvhit.proofs.instantiate import ground
from kvhit.proofs.linearize import linearize
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.symbolic import SymRow, Z3Ops

CONFIGS: tuple[tuple[int, int], ...] = ((1, 1), (2, 2), (2, 4), (3, 6), (4, 4), (4, 8), (16, 16))
"""(block size, alignment) pairs the unbounded contract theorem runs at."""

UNROLLED_CHECKS: tuple[tuple[str, int, int, int], ...] = (
    ("finder_contracts_bounded", 2, 4, 64),
    ("finder_contracts_bounded_unit_blocks", 1, 1, 32),
)
"""(theorem, block size, alignment, default bound) for the unrolled one. Its
cost grows quickly with the bound, and faster at b=1 A=1, where every block end is a
candidate: at 64 blocks, with z3 and cvc5 side by side on a quiet 2-core machine,
about 100 s for (2, 4) and 220 s for (1, 1) with inclusive windows only, so (1, 1)
runs at 32 by default. The exclusive sliding window goals cost as much as the
inclusive ones (z3 alone at (2, 4), 64 blocks: 18 s and 27 s with eagle)."""


@dataclass(frozen=True)
class ContractFinder:
    """One finder the contract is proved for: a kind, the drafter its group carries
    (None, drop: the eagle wrapper, or lookahead with a symbolic La), and the window
    convention its group reads (a sliding window's finder is proved under each)."""

    kind: Kind
    drafter: Drafter | None = None
    convention: WindowConvention = WindowConvention.INCLUSIVE

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", Kind(self.kind))
        object.__setattr__(self, "convention", WindowConvention(self.convention))

    @property
    def label(self) -> str:
        """``kind [exclusive] [eagle|lookahead]``, as :meth:`Group.describe` names them.

        >>> ContractFinder(Kind.SLIDING_WINDOW, Drafter.DROP, WindowConvention.EXCLUSIVE).label
        'sliding_window exclusive eagle'
        """
        convention = " exclusive" if self.convention == WindowConvention.EXCLUSIVE else ""
        drafter = finder_label((self.kind, self.drafter)).removeprefix(self.kind)
        return f"{self.kind}{convention}{drafter}"

    def group(self, block_size: Any, span: Any, lookahead: Any = 0) -> Group:
        """The group this finder runs for, its window or chunk (if its kind reads
        one) ``span``, its La (if its drafter is lookahead) ``lookahead``."""
        return finder_group((self.kind, self.drafter), block_size, span, lookahead, self.convention)


def conventions(kind: Kind) -> tuple[WindowConvention, ...]:
    """The window conventions a finder of this kind is proved under."""
    return WINDOW_CONVENTIONS if kind == Kind.SLIDING_WINDOW else (WindowConvention.INCLUSIVE,)


CONTRACT_FINDERS: tuple[ContractFinder, ...] = tuple(
    ContractFinder(kind, drafter, convention)
    for kind, drafter in DISTINCT_FINDERS
    for convention in conventions(kind)
)
"""Every finder of :data:`~kvhit.proofs.common.DISTINCT_FINDERS` (the ``none``
drafter is the no-drafter finder: ``drafter_none_same``), a sliding window's under
both conventions."""


@dataclass(frozen=True)
class MissRow(SymRow):
    """A symbolic row with its last-miss function ``below`` (see the module docstring)."""

    below: Any = None

    @staticmethod
    def fresh(name: str, length: Any) -> MissRow:
        return MissRow(
            z3.Array(name, z3.IntSort(), z3.BoolSort()),
            length,
            z3.Function(f"{name}_below", z3.IntSort(), z3.IntSort()),
        )

    @staticmethod
    def bounded(name: str, length: int) -> MissRow:
        """A row of ``length`` unknown blocks whose ``below`` is spelled out as a z3
        array of ite terms over its bits (for ends 0 … length + 2), no axiom needed."""
        bits = z3.Array(name, z3.IntSort(), z3.BoolSort())
        # The table holds below(e) + 1, so that its default (ends never looked up) is 0.
        table = z3.K(z3.IntSort(), z3.IntVal(0))
        lasts: list[Any] = [z3.IntVal(0)]
        for e in range(1, length + 3):
            cached = z3.Select(bits, e - 1) if e - 1 < length else z3.BoolVal(False)
            lasts.append(z3.If(cached, lasts[-1], z3.IntVal(e)))
            table = z3.Store(table, e, lasts[-1])

        def below(end: Any) -> Any:
            if isinstance(end, int) and 0 <= end < len(lasts):
                return lasts[end] - 1
            return z3.Select(table, end) - 1

        return MissRow(bits, length, below)


class MissOps(Z3Ops):
    """:class:`Z3Ops` reading ``all_cached`` through the row's last-miss function."""

    def all_cached(self, row: Any, lo: Any, hi: Any) -> Any:
        if not isinstance(row, MissRow):
            return super().all_cached(row, lo, hi)
        return self.or_(lo >= hi, self.and_(lo >= 0, hi <= row.length, row.below(hi) < lo))


class UnrolledOps(CaseOps, MissOps):
    """:class:`MissOps` keeping the unrolled scan's integers as :class:`Cases`."""


def miss_axioms(row: MissRow, ops: Z3Ops) -> list[Any]:
    """``below(e)`` is the largest uncached block index under e ≥ 0, or −1.

    Every row has exactly one function meeting these, so assuming them is free.
    """
    e, q = z3.Ints("miss_e miss_q")
    below = row.below
    return [
        z3.ForAll(
            [e],
            z3.Implies(
                e >= 0,
                z3.And(
                    below(e) < e,
                    below(e) >= -1,
                    z3.Implies(below(e) >= 0, z3.Not(ops.bit(row, below(e)))),
                ),
            ),
        ),
        z3.ForAll([e, q], z3.Implies(z3.And(e >= 0, below(e) < q, q < e), ops.bit(row, q))),
    ]


@dataclass
class FinderSetting:
    """One finder at one (b, A), with its symbolic parameters and the spec around it."""

    block_size: Any
    alignment: Any
    ops: Z3Ops
    row: Any
    m: Any
    num_tokens: Any
    group: Group
    frame: Frame
    scan: Scan
    pre: list[Any]
    candidates: Callable[[Any, Any], list[Any]] | None  # bounded: the concrete candidates

    def is_candidate(self, length: Any) -> Any:
        return z3.And(length >= 0, length % self.alignment == 0)

    def valid(self, length: Any) -> Any:
        return valid(self.group, self.row, length, self.num_tokens, self.ops)

    def none_valid(self, lo: Any, hi: Any) -> Any:
        """No candidate L with lo < L ≤ hi is valid."""
        if self.candidates is not None:
            terms = [
                z3.Implies(z3.And(lo < L, L <= hi), z3.Not(self.valid(L)))
                for L in self.candidates(lo, hi)
            ]
            return z3.And(*terms) if terms else z3.BoolVal(True)
        L = z3.FreshInt("L")
        return z3.ForAll(
            [L],
            z3.Implies(z3.And(lo < L, L <= hi, self.is_candidate(L)), z3.Not(self.valid(L))),
        )

    def contract(self, hit: Any) -> Any:
        """The finder contract for the answer ``hit`` at m (case by case, if it is Cases)."""
        return Cases.holds(
            lambda h: z3.And(
                h <= self.m, self.is_candidate(h), self.valid(h), self.none_valid(h, self.m)
            ),
            hit,
        )

    def window_blocks(self) -> Any:
        return window_span(self.group, self.ops) + (1 if self.group.eagle else 0)


def make_setting(
    finder: ContractFinder, b: Any, a: Any, bound: int | None, tag: str = ""
) -> FinderSetting:
    """Symbolic parameters for one finder at block size b and alignment a.

    ``bound`` None: unbounded (rows of any length, read through ``below``);
    else rows of ``bound`` blocks and m small enough that the scan stays inside them.
    A window is at least 1 under either convention (SGLang's sliding_window_size is
    positive too).
    """
    p = f"{finder.label.replace(' ', '_')}_b{b}_A{a}{tag}_"
    span, m, num_tokens, la = z3.Ints(f"{p}span {p}m {p}T {p}La")
    group = finder.group(b, span, la)
    pre = [m >= 0, num_tokens > m]
    if finder.drafter == Drafter.LOOKAHEAD:
        pre.append(la >= 0)
    if PARAMETERS[finder.kind] is not None:
        pre.append(span >= 1)
    if bound is None:
        ops: Z3Ops = MissOps(bound=1)
        length = z3.Int(f"{p}rows")
        row: Any = MissRow.fresh(f"{p}row", length)
        pre += [length >= 0, *miss_axioms(row, ops)]
        candidates = None
    else:
        ops = UnrolledOps(bound=bound)
        row = MissRow.bounded(f"{p}row", bound)
        top = (bound + 1) * b

        def candidates(lo: Any, hi: Any) -> list[Any]:
            return list(range(0, top + 1, a))

    frame = frame_for(group, m, a, num_tokens, ops)
    if bound is not None:
        pre.append(frame.limit <= bound)
    scan = scan_for(group, m, a, num_tokens, ops)
    return FinderSetting(b, a, ops, row, m, num_tokens, group, frame, scan, pre, candidates)


# --- the loop invariants, one per kind --------------------------------------------
#
# An "up" scan has visited blocks [0, j); a "down" scan has visited [j, limit).


def full_invariant(s: FinderSetting, state: tuple[Any, ...], j: Any) -> Any:
    """run: blocks [0, run) are cached; alive: no miss yet (then run = j), else block run missed."""
    run, alive = state
    ops, row = s.ops, s.row
    return z3.And(
        0 <= j,
        j <= s.scan.limit,
        z3.If(
            alive,
            z3.And(run == j, ops.all_cached(row, 0, j)),
            z3.And(0 <= run, run < j, z3.Not(ops.bit(row, run)), ops.all_cached(row, 0, run)),
        ),
    )


def chunked_local_invariant(s: FinderSetting, state: tuple[Any, ...], j: Any) -> Any:
    """clean_from: blocks [clean_from, j) are cached and block clean_from-1 missed;
    hit: the longest valid candidate ending at or before block j."""
    clean_from, hit = state
    ops, row = s.ops, s.row
    seen = s.frame.length(j)
    return z3.And(
        0 <= j,
        j <= s.scan.limit,
        0 <= clean_from,
        clean_from <= j,
        ops.all_cached(row, clean_from, j),
        z3.Or(clean_from == 0, z3.Not(ops.bit(row, clean_from - 1))),
        hit <= seen,
        s.is_candidate(hit),
        s.valid(hit),
        s.none_valid(hit, seen),
    )


def sliding_window_invariant(s: FinderSetting, state: tuple[Any, ...], j: Any) -> Any:
    """found: hit is the answer. Else, with run > 0: blocks [j, j+run) are cached
    and end j+run is a candidate (hit) needing more than run blocks; with run = 0:
    no candidate above end j is valid."""
    run, found, hit = state
    ops, row = s.ops, s.row
    k = s.window_blocks()
    start = j + run
    return z3.And(
        0 <= j,
        0 <= run,
        start <= s.scan.limit,
        z3.If(
            found,
            s.contract(hit),
            z3.If(
                run > 0,
                z3.And(
                    hit == s.frame.length(start),
                    s.is_candidate(hit),
                    ops.all_cached(row, j, start),
                    run < k,
                    s.none_valid(hit, s.m),
                ),
                z3.And(k > 0, s.none_valid(s.ops.max(0, s.frame.length(j)), s.m)),
            ),
        ),
    )


def mamba_invariant(s: FinderSetting, state: tuple[Any, ...], j: Any) -> Any:
    """found: hit is the answer; else no candidate above end j is valid."""
    found, hit = state
    return z3.And(
        0 <= j,
        j <= s.scan.limit,
        z3.If(
            found,
            s.contract(hit),
            z3.And(hit == 0, s.none_valid(s.ops.max(0, s.frame.length(j)), s.m)),
        ),
    )


INVARIANTS: dict[Kind, Callable[[FinderSetting, tuple[Any, ...], Any], Any]] = {
    Kind.FULL: full_invariant,
    Kind.SLIDING_WINDOW: sliding_window_invariant,
    Kind.CHUNKED_LOCAL: chunked_local_invariant,
    Kind.MAMBA: mamba_invariant,
}
"""Each kind's loop invariant over its scan's state at block index j."""


def fresh_state(template: tuple[Any, ...], prefix: str) -> tuple[Any, ...]:
    """Fresh z3 constants shaped like a scan's start state."""
    out = []
    for i, x in enumerate(template):
        out.append(z3.Bool(f"{prefix}{i}") if is_boolean(x) else z3.Int(f"{prefix}{i}"))
    return tuple(out)


Part = tuple[list[Any], Any]
"""An obligation: its assumptions and the negation of its claim."""


def induction_parts(s: FinderSetting, j: Any, tag: str) -> dict[str, Part]:
    """The three obligations at index j: ``init`` and ``exit`` ignore j; ``step``
    steps from the visited region ending (up) or starting (down) at j."""
    inv = INVARIANTS[s.group.kind]
    scan = s.scan
    state = fresh_state(scan.start, f"{tag}_s")
    bit = s.ops.bit
    if scan.direction == "up":
        first, last, inside = 0, scan.limit, [0 <= j, j < scan.limit]
        index, after = j, j + 1
    else:
        first, last, inside = scan.limit, 0, [0 < j, j <= scan.limit]
        index, after = j - 1, j - 1
    stepped = scan.step(state, index, bit(s.row, index))
    return {
        "init": ([], z3.Not(inv(s, scan.start, first))),
        "step": ([inv(s, state, j), *inside], z3.Not(inv(s, stepped, after))),
        "exit": ([inv(s, state, last)], z3.Not(s.contract(scan.finish(state)))),
    }


GROUNDED = "QF_AUFLIA"
"""The logic of a symbolic goal once :func:`~kvhit.proofs.instantiate.ground` and
:func:`~kvhit.proofs.linearize.linearize` have made it quantifier-free and linear:
z3's solver for it skips the general solver's preprocessing (the 39 symbolic goals:
12 s instead of 21 s). Not for the goals at concrete b and A, where the general
solver's preprocessing pays (198 goals: 42 s, against 73 s)."""


def unbounded_goals(finder: ContractFinder, b: int, a: int) -> list[Goal]:
    """Start, step and exit of the loop invariant, over rows of any length."""
    s = make_setting(finder, b, a, None)
    label = f"{finder.label} b={b} A={a}"
    j = z3.Int(f"{label.replace(' ', '_')}_j")
    return [
        Goal(f"{label}: {name}", [*s.pre, *assumed], negation, prepare=ground)
        for name, (assumed, negation) in induction_parts(s, j, "u").items()
    ]


def symbolic_goals(finder: ContractFinder) -> list[Goal]:
    """Start, step and exit of the loop invariant with b and A symbolic too (b ≥ 1,
    A = a·b, a ≥ 1): products and quotients by b, A and the chunk are made linear by
    :func:`kvhit.proofs.linearize.linearize`, whose lemmas ``arithmetic_lemmas`` proves."""
    label = finder.label
    tag = label.replace(" ", "_")
    b, a, ratio = z3.Ints(f"{tag}_b {tag}_A {tag}_a")
    s = make_setting(finder, b, a, None, tag="_sym")
    scales = [b, a] + ([s.group.chunk] if finder.kind == Kind.CHUNKED_LOCAL else [])
    pre = [*s.pre, b >= 1, ratio >= 1, a == ratio * b]

    def prepare(terms: list[Any]) -> list[Any]:
        return linearize(ground(terms), scales, [(b, a, ratio)])

    j = z3.Int(f"{tag}_sym_j")
    return [
        Goal(
            f"{label} b, A symbolic: {name}",
            [*pre, *assumed],
            negation,
            prepare=prepare,
            logic=GROUNDED,
        )
        for name, (assumed, negation) in induction_parts(s, j, "s").items()
    ]


def lemma_theorem_goals(bound: int | None) -> list[Goal]:
    """Each arithmetic lemma the linear goals rest on, as its own nonlinear goal."""
    return [Goal(f"lemma {name}", [], z3.Not(claim)) for name, claim in linear.lemmas().items()]


def unrolled_goals(finder: ContractFinder, b: int, a: int, bound: int) -> list[Goal]:
    """The whole scan unrolled over rows of ``bound`` blocks, against the contract."""
    s = make_setting(finder, b, a, bound)
    hit = run_scan(s.scan, s.row, s.ops)
    return [
        Goal(
            f"{finder.label} b={b} A={a}: unrolled",
            s.pre,
            z3.Not(s.contract(hit)),
            witness=contract_witness(s, bound),
            logic="QF_AUFLIA",
            # cvc5's default decision order (justification) takes minutes on these
            # large unrolled scans where its SAT solver's own order takes seconds.
            cvc5_options={"decision": "internal"},
        )
    ]


def contract_witness(s: FinderSetting, bound: int) -> Any:
    """A one-group protocol query from a model (the group's window convention kept);
    broken when the plain finder is not L*."""

    def witness(model: z3.ModelRef) -> Counterexample:
        q = parse_query(
            {
                "groups": [protocol_group(s.group, model)],
                "cached": [s.row.values(model, bound)],
                "max_length": model_int(model, s.m),
                "num_tokens": model_int(model, s.num_tokens),
                "alignment": s.alignment,
            }
        )
        g, row = q.groups[0], q.cached[0]
        got = find(g, row, q.max_length, q.alignment, q.num_tokens)
        best = longest_hit(q).length
        return Counterexample(q, "finder", got, {"finder": got, "L*": best}, broken=got != best)

    return witness


LOOKAHEAD_CONFIGS: tuple[tuple[int, int], ...] = ((1, 1), (2, 4))
"""(block size, alignment) pairs the unbounded theorem runs a lookahead finder at
(``finder_contracts_symbolic`` covers every b and A; these are its spot checks)."""


def unbounded_all(bound: int | None) -> list[Goal]:
    """:func:`unbounded_goals` for every finder at :data:`CONFIGS`, a lookahead finder
    at :data:`LOOKAHEAD_CONFIGS`."""
    return [
        goal
        for f in CONTRACT_FINDERS
        for b, a in (LOOKAHEAD_CONFIGS if f.drafter == Drafter.LOOKAHEAD else CONFIGS)
        for goal in unbounded_goals(f, b, a)
    ]


def unrolled_all(b: int, a: int, bound: int | None) -> list[Goal]:
    """:func:`unrolled_goals` for every finder but the lookahead ones (whose frame
    clamps the top to T - La, a symbolic bound the unrolled :class:`Cases` do not
    take; their contract is proved unbounded and with b, A symbolic)."""
    assert bound is not None
    return [
        goal
        for f in CONTRACT_FINDERS
        if f.drafter != Drafter.LOOKAHEAD
        for goal in unrolled_goals(f, b, a, bound)
    ]


def _text(configs: tuple[tuple[int, int], ...]) -> str:
    return ", ".join(f"b={b} A={a}" for b, a in configs)


THEOREMS = [
    Theorem(
        name="finder_contracts",
        statement=(
            "Every finder (full, sliding window under the inclusive and the exclusive "
            "window convention, chunked local, mamba, the eagle wrapper on full and "
            "on both sliding windows, and a lookahead drafter with any La on every kind) "
            "meets its contract for every cache row of any "
            f"length (so every bound N), window, chunk, La, m and T ({_text(CONFIGS)}; "
            f"lookahead at {_text(LOOKAHEAD_CONFIGS)}): "
            "an inductive loop invariant over the model's own scan step."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=unbounded_all,
        rests_on="model code: each finder's Scan (start, step, finish), both window conventions",
        scope="any row length, window (inclusive and exclusive), chunk, La, m, T; b/A "
        + " ".join(f"{b}/{a}" for b, a in CONFIGS)
        + "; lookahead b/A "
        + " ".join(f"{b}/{a}" for b, a in LOOKAHEAD_CONFIGS),
    ),
    Theorem(
        name="finder_contracts_symbolic",
        statement=(
            "Every finder (every kind, the eagle wrapper, a lookahead drafter with any "
            "La on every kind, and sliding windows under both "
            "window conventions) meets its contract for every block size b >= 1 and alignment A with b | A, every cache row of any length, "
            "window, chunk, m and T: the loop invariant over the model's own scan step, "
            "with products and quotients by b, A and the chunk read as functions bound by "
            "the lemmas of arithmetic_lemmas."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=lambda bound: [g for f in CONTRACT_FINDERS for g in symbolic_goals(f)],
        rests_on=(
            "model code: each finder's Scan, both window conventions; "
            "x*b, x/b, x%A as functions + arithmetic_lemmas"
        ),
        scope="any row length, window (inclusive and exclusive), chunk, La, m, T; "
        "every b >= 1, A = a*b",
    ),
    Theorem(
        name="arithmetic_lemmas",
        statement=(
            "The integer facts finder_contracts_symbolic's linear goals are instances of: "
            "floor bounds of x/d, products by d >= 1 keep order and small gaps, the "
            "remainder, and a multiple of a*d is a multiple of d."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=lemma_theorem_goals,
        rests_on="integer arithmetic (nonlinear goals, no abstraction)",
        scope="every integer d >= 1, x, y, k, a",
    ),
    *(
        Theorem(
            name=name,
            statement=(
                "Every finder but the lookahead ones, sliding windows under both window "
                "conventions, meets its "
                "contract for every cache row of up to N blocks, every window, chunk, m "
                f"and T (b={b} A={a}): the model's whole scan unrolled over symbolic bits, "
                "a cross-check that uses no invariant."
            ),
            expected=Status.PROVED,
            bounded=True,
            bound=bound,
            quick_bound=12,
            build=partial(unrolled_all, b, a),
            deep=True,
            rests_on="model code: each finder's whole scan, unrolled, both window conventions",
            scope=f"rows of N blocks; window (inclusive and exclusive); b/A {b}/{a}",
        )
        for name, b, a, bound in UNROLLED_CHECKS
    ),
]
