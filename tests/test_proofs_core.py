"""Theorems 1-3 (fixed point, termination, finder contracts): each gets its expected
status at a small bound, and each is refuted when the model is broken on purpose."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest
import z3

from kvhit.model import algorithms, finders
from kvhit.model.finders import Scan, find
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Drafter, Kind, Query, longest_hit, valid
from kvhit.proofs.cases import Cases
from kvhit.proofs.common import DISTINCT_FINDERS, finder_label, sym_query
from kvhit.proofs.registry import Theorem
from kvhit.proofs.runner import run_theorem
from kvhit.proofs.symbolic import SymRow, Z3Ops
from kvhit.proofs.theorems import contracts, fixed_point
from kvhit.proofs.theorems.contracts import MissOps, MissRow, UnrolledOps, miss_axioms


def theorem(module, name: str) -> Theorem:
    return next(t for t in module.THEOREMS if t.name == name)


@pytest.mark.parametrize(
    ("module", "name", "bound"),
    [
        (fixed_point, "fixed_point_maximal", None),
        (fixed_point, "termination", None),
        (fixed_point, "fixed_point_model_code", 3),
        (fixed_point, "many_passes", 6),
        (contracts, "finder_contracts_bounded", 4),
        (contracts, "finder_contracts_bounded_unit_blocks", 4),
    ],
)
def test_theorem_is_proved(module, name: str, bound: int | None) -> None:
    result = run_theorem(theorem(module, name), bound=bound, timeout=30)
    assert result.status == "proved", result.detail


EXCLUSIVE_WINDOWS = {
    "sliding_window exclusive",
    "sliding_window exclusive eagle",
    "sliding_window exclusive lookahead",
}
"""The finders proved under the exclusive window convention, by label."""


def finder_of(goal_name: str) -> str:
    """The finder a contract goal is about: its name before the block size."""
    return goal_name.split(" b")[0]


def test_unbounded_finder_contracts_are_proved() -> None:
    result = run_theorem(theorem(contracts, "finder_contracts"), timeout=30)
    assert result.status == "proved", result.detail
    per_finder = 3 * len(contracts.CONFIGS)
    per_lookahead = 3 * len(contracts.LOOKAHEAD_CONFIGS)
    # 4 kinds and 2 eagle kinds, and both sliding windows once more under the exclusive
    # reading; 4 lookahead kinds and the exclusive window with lookahead
    assert len(result.goals) == 8 * per_finder + 5 * per_lookahead
    exclusive = [g.name for g in result.goals if finder_of(g.name) in EXCLUSIVE_WINDOWS]
    assert len(exclusive) == 2 * per_finder + per_lookahead
    assert {finder_of(g.name) for g in result.goals} == {
        f.label for f in contracts.CONTRACT_FINDERS
    }


@pytest.mark.parametrize(
    "name",
    [
        "finder_contracts",
        "finder_contracts_symbolic",
        "finder_contracts_bounded",
        "finder_contracts_bounded_unit_blocks",
    ],
)
def test_finder_theorems_cover_both_window_conventions(name: str) -> None:
    t = theorem(contracts, name)
    finders = {finder_of(g.name) for g in t.build(t.bound_for(quick=True))}
    unrolled = t.bounded  # the unrolled scans leave out the lookahead finders
    assert finders == {
        f.label
        for f in contracts.CONTRACT_FINDERS
        if not (unrolled and f.drafter == Drafter.LOOKAHEAD)
    }
    assert {"sliding_window exclusive", "sliding_window exclusive eagle"} < finders


def test_an_exclusive_setting_runs_the_exclusive_group() -> None:
    finder = contracts.ContractFinder("sliding_window", Drafter.DROP, "exclusive")
    s = contracts.make_setting(finder, 2, 4, None)
    assert s.group.exclusive and s.group.eagle
    # k = ceil(w/2) + 1 under the exclusive reading: 3 blocks at w = 3 (2 if inclusive)
    w = s.group.window
    assert z3.simplify(z3.substitute(s.window_blocks(), (w, z3.IntVal(3)))).as_long() == 3


def family(groups: int, blocks: int) -> Query:
    """Group g (mamba, b = 1) misses every block j with j ≡ g (mod groups); M = blocks."""
    rows = [[j % groups != g for j in range(blocks)] for g in range(groups)]
    return parse_query(
        {
            "groups": [{"kind": Kind.MAMBA, "block_size": 1}] * groups,
            "cached": rows,
            "max_length": blocks,
        }
    )


def family_passes(groups: int, blocks: int) -> int:
    """The passes the family needs: floor((G-1)·n/G) + 2."""
    return (groups - 1) * blocks // groups + 2


def test_the_family_needs_the_passes_it_claims() -> None:
    for groups, blocks in [(2, 6), (3, 6), (4, 9)]:
        q = family(groups, blocks)
        assert fixed_point.passes_of(q) == family_passes(groups, blocks)
    # with as many groups as blocks the termination bound floor(M/A)+1 is reached
    assert fixed_point.passes_of(family(5, 5)) == 5 + 1


def refuted(module, name: str, bound: int | None):
    result = run_theorem(theorem(module, name), bound=bound, timeout=30)
    assert result.status == "refuted", result.detail
    cx = result.counterexample
    assert cx is not None and cx.broken
    return cx


def test_sliding_window_with_floor_blocks_is_refuted(monkeypatch) -> None:
    monkeypatch.setattr(finders, "window_span", lambda g, ops: ops.div(g.window - 1, g.block_size))
    cx = refuted(contracts, "finder_contracts_bounded", 4)
    g, row = cx.query.groups[0], cx.query.cached[0]
    assert g.kind == "sliding_window"
    q = cx.query
    assert find(g, row, q.max_length, q.alignment, q.num_tokens) != longest_hit(q).length


def test_mamba_accepting_any_earlier_state_is_refuted(monkeypatch) -> None:
    original = finders.SCANS["mamba"]

    def any_earlier_state(g, fr, ops) -> Scan:
        scan = original(g, fr, ops)
        return Scan(
            scan.direction,
            scan.limit,
            scan.start,
            scan.step,
            lambda s: ops.ite(s[0], fr.round_down(fr.limit, ops), 0),
        )

    monkeypatch.setitem(finders.SCANS, "mamba", any_earlier_state)
    cx = refuted(contracts, "finder_contracts_bounded", 4)
    q = cx.query
    assert q.groups[0].kind == "mamba"
    assert find(q.groups[0], q.cached[0], q.max_length, q.alignment, q.num_tokens) > (
        longest_hit(q).length
    )


def test_fixed_point_without_the_repeat_is_refuted(monkeypatch) -> None:
    original = algorithms.fixed_point_of
    monkeypatch.setattr(
        algorithms, "fixed_point_of", lambda fs, top, passes, ops=None: original(fs, top, 1, ops)
    )
    cx = refuted(fixed_point, "fixed_point_model_code", 3)
    assert algorithms.fixed_point(cx.query) != algorithms.brute_force(cx.query)


def random_rows(rng: random.Random, count: int) -> list[list[bool]]:
    return [[rng.random() < 0.7 for _ in range(rng.randint(0, 9))] for _ in range(count)]


def test_last_miss_reading_equals_the_plain_one() -> None:
    rng = random.Random(3)
    for _ in range(30):
        bits = random_rows(rng, 1)[0]
        lo, hi = rng.randint(-1, 10), rng.randint(0, 11)
        plain = Z3Ops(bound=1).all_cached(bits, lo, hi)
        expected = z3.is_true(z3.simplify(plain)) if z3.is_expr(plain) else plain
        for row, extra in [
            (MissRow.fresh("t", len(bits)), None),
            (MissRow.bounded("tb", len(bits)), ()),
        ]:
            ops = MissOps(bound=1)
            s = z3.Solver()
            s.add(*[row.bits[j] == b for j, b in enumerate(bits)])
            if extra is None:
                s.add(*miss_axioms(row, ops))
            s.add(ops.all_cached(row, lo, hi) != expected)
            assert s.check() == z3.unsat, (bits, lo, hi)


def random_query(rng: random.Random, kind: str, drafter: Drafter | None):
    b = rng.choice([1, 2, 3])
    group: dict = {"kind": kind, "block_size": b}
    if drafter is not None:
        group["drafter"] = drafter
    if drafter == Drafter.LOOKAHEAD:
        group["lookahead"] = rng.randint(0, 4)
    if kind == "sliding_window":
        group["window"] = rng.randint(1, 8)
    if kind == "chunked_local":
        group["chunk"] = rng.randint(1, 8)
    m = rng.randint(0, 12)
    return parse_query(
        {
            "groups": [group, {"kind": "sliding_window", "block_size": 1, "window": 2}],
            "cached": random_rows(rng, 2),
            "max_length": m,
            "num_tokens": m + rng.randint(1, 4),
            "alignment": b * rng.choice([1, 2]),
        }
    )


def as_term(x):
    """A plain int, a Cases or a z3 term, as a z3 term."""
    if isinstance(x, Cases):
        return x.term()
    return z3.IntVal(x) if isinstance(x, int) else x


ENCODED = [  # drafter none is no drafter (drafter_none_same)
    *((kind, drafter, Z3Ops(bound=16)) for kind, drafter in DISTINCT_FINDERS),
    *(
        (kind, drafter, UnrolledOps(bound=16))
        for kind, drafter in DISTINCT_FINDERS
        if drafter != Drafter.LOOKAHEAD  # the unrolled scans do not take a lookahead frame
    ),
]


@pytest.mark.parametrize(
    ("kind", "drafter", "ops"),
    ENCODED,
    ids=[f"{finder_label((k, d))}-{type(o).__name__}" for k, d, o in ENCODED],
)
def test_symbolic_encoding_equals_plain_python(
    kind: Kind, drafter: Drafter | None, ops: Z3Ops
) -> None:
    rng = random.Random(hash((kind, drafter)) % 1000)
    for _ in range(25):
        q = random_query(rng, kind, drafter)
        g, row = q.groups[0], q.cached[0]
        sym_row = SymRow.of(row)
        m = z3.Int("m")
        s = z3.Solver()
        s.add(m == q.max_length)
        for length in q.candidates():
            sym = valid(g, sym_row, z3.IntVal(length), q.num_tokens, ops)
            assert z3.is_true(z3.simplify(z3.And(sym))) == valid(g, row, length, q.num_tokens)
        sym_hit = find(g, sym_row, m, q.alignment, q.num_tokens, ops)
        assert s.check() == z3.sat
        assert s.model().eval(as_term(sym_hit)).as_long() == find(
            g, row, q.max_length, q.alignment, q.num_tokens
        )
        sym_fp = algorithms.fixed_point(
            type(q)(q.groups, tuple(SymRow.of(r) for r in q.cached), m, q.num_tokens, q.alignment),
            Z3Ops(bound=16, passes=q.max_length + 1),
        )
        assert s.model().eval(sym_fp).as_long() == algorithms.fixed_point(q)


def test_a_symbolic_query_reads_back_an_exclusive_window() -> None:
    sq = sym_query(["sliding_window"], 3, "conv")
    group = replace(sq.query.groups[0], window_convention="exclusive")
    sq = replace(sq, query=replace(sq.query, groups=(group,)))
    s = z3.Solver()
    s.add(*sq.pre)
    assert s.check() == z3.sat
    assert sq.concrete(s.model()).groups[0].exclusive
