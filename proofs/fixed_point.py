"""Theorems 1 and 2: the fixed point is maximal, and how long it takes.

Theorem 1 is unbounded: any number of groups G, in any order, any M, and any
finders at all that meet the contract (:class:`kvhit.proofs.common.AbstractFinders`),
lengths in units of the alignment. The loop of :func:`kvhit.model.algorithms.fixed_point_of`
is argued by induction, one solver query per step of the argument:

1. a finder application keeps L* ≤ L ≤ (its input);
2. so does every prefix of a pass (induction over the groups);
3. a pass that leaves L unchanged went through L at every group (induction down
   the pass), so L is valid for every group, so L ≤ L*, so L = L*.

``fixed_point_model_code`` then runs the model's own ``fixed_point_of``, unchanged,
over G = 1, 2, 3 such finders for every top up to the bound, and checks it returns L*.

Theorem 2: each pass that changes L lowers it by at least one unit and L never goes
below L* ≥ 0, so at most ⌊M/A⌋+1 passes. The bound is reached: with G groups, the
family "group g misses every block j ≡ g (mod G)" (mamba, b = 1) needs
⌊(G−1)·n/G⌋ + 2 passes on n blocks, so M+1 once G ≥ M; and with two groups no cache
state needs more than ⌊n/2⌋ + 2.
"""

from __future__ import annotations

from typing import Any

import z3

from kvhit.model import algorithms
from kvhit.model.ops import Ops
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Query
from kvhit.proofs.common import AbstractFinders, sym_query
from kvhit.proofs.registry import Counterexample, Goal, Theorem
from kvhit.proofs.symbolic import Z3Ops


def maximal_goals(bound: int | None) -> list[Goal]:
    af = AbstractFinders("fp")
    F = af.F
    G, top, x, g, i = z3.Ints("fp_G fp_top fp_x fp_g fp_i")
    ls, best = af.best(G, top, "fp")
    blame = z3.Function("fp_blame", z3.IntSort(), z3.IntSort())  # the one af.best defines
    P = z3.Function("fp_P", z3.IntSort(), z3.IntSort())  # L after the first i finders of a pass
    k = z3.Int("fp_k")
    base = [*af.contract(), G >= 1, top >= 0, *best]
    inside = z3.And(ls <= x, x <= top)
    # each step uses only the instance of "P(i+1) = F(i, P(i))" it is about
    step_i = [i >= 0, i < G, P(i + 1) == F(i, P(i)), ls <= P(i), P(i) <= x]

    def used(group: Any, m: Any) -> list[Any]:
        """The instances of the contract and of L*'s validity the step rests on (stated
        outright so that a second solver need not find them)."""
        return [
            F(group, m) >= 0,
            F(group, m) <= m,
            z3.Implies(z3.And(m >= 0, F(group, m) < ls, ls <= m), z3.Not(af.V(group, ls))),
            z3.Implies(z3.And(group >= 0, group < G), af.V(group, ls)),
        ]

    return [
        Goal("the fixed point starts at or above L*", [*base, top < ls]),
        Goal(
            "a finder keeps L* <= L <= its input",
            [
                *base,
                inside,
                g >= 0,
                g < G,
                *used(g, x),
                z3.Not(z3.And(ls <= F(g, x), F(g, x) <= x)),
            ],
        ),
        Goal(
            "each prefix of a pass keeps L* <= L <= L at the pass start (step i -> i+1)",
            [*base, inside, *step_i, *used(i, P(i)), z3.Not(z3.And(ls <= P(i + 1), P(i + 1) <= x))],
        ),
        Goal(
            "a pass that ends where it started went through L everywhere (step i+1 -> i)",
            [*base, inside, *step_i, P(i + 1) >= x, P(i) < x],
        ),
        Goal(
            "a pass through L everywhere means L is valid for every group, so L = L*",
            [
                *base,
                inside,
                z3.ForAll([k], z3.Implies(z3.And(k >= 0, k <= G), P(k) == x)),
                # the blamed group's own step of the pass
                P(blame(x) + 1) == F(blame(x), P(blame(x))),
                x != ls,
            ],
        ),
    ]


def mamba_witness(af: AbstractFinders, groups: int, top: int, run: Any) -> Any:
    """A counterexample over abstract finders as a real query: G mamba groups, b = 1,
    whose valid lengths are the model's V (mamba can have any set of valid lengths)."""

    def witness(model: z3.ModelRef) -> Counterexample:
        rows = [
            [z3.is_true(model.eval(af.V(g, L), model_completion=True)) for L in range(1, top + 1)]
            for g in range(groups)
        ]
        q = parse_query(
            {
                "groups": [{"kind": "mamba", "block_size": 1}] * groups,
                "cached": rows,
                "max_length": top,
            }
        )
        got, best = run(q), algorithms.brute_force(q)
        return Counterexample(
            q, "fixed point", got, {"fixed point": got, "L*": best}, broken=got != best
        )

    return witness


def model_code_goals(bound: int | None) -> list[Goal]:
    assert bound is not None
    goals = []
    for groups in (1, 2, 3):
        for top in range(bound + 1):
            af = AbstractFinders(f"mc{groups}_{top}")
            ls, best = af.ground_best(groups, top, f"mc{groups}_{top}")
            ops = Z3Ops(bound=1)
            got = algorithms.fixed_point_of(af.finders(groups), z3.IntVal(top), top + 1, ops)
            goals.append(
                Goal(
                    f"G={groups} top={top}",
                    [*af.ground_contract(groups, top), *best, got != ls],
                    witness=mamba_witness(af, groups, top, algorithms.fixed_point),
                )
            )
    return goals


def termination_goals(bound: int | None) -> list[Goal]:
    af = AbstractFinders("tm")
    G, top, x, p = z3.Ints("tm_G tm_top tm_x tm_p")
    ls, best = af.best(G, top, "tm")
    P = z3.Function("tm_P", z3.IntSort(), z3.IntSort())  # L after the first i finders
    X = z3.Function("tm_X", z3.IntSort(), z3.IntSort())  # L after p passes
    base = [*af.contract(), G >= 1, top >= 0, *best]

    def between(n: Any) -> Any:
        """What theorem 1's pass lemmas give for pass n: L* <= X(n+1) <= X(n)."""
        return z3.And(ls <= X(n + 1), X(n + 1) <= X(n))

    return [
        Goal(
            "a pass that changes L lowers it by at least one unit of A",
            [*base, ls <= x, x <= top, P(0) == x, ls <= P(G), P(G) <= x, P(G) != x, P(G) > x - 1],
        ),
        Goal(
            "after p changing passes L <= top - p (step p -> p+1)",
            [*base, p >= 0, between(p), X(p) <= top - p, X(p + 1) != X(p), X(p + 1) > top - p - 1],
        ),
        Goal(
            "so top + 1 changing passes are impossible: at most floor(M/A) + 1 passes",
            [*base, between(top), X(top + 1) <= top - (top + 1)],
        ),
    ]


class CountingOps(Ops):
    """Plain operations that count the fixed point's passes."""

    def __init__(self) -> None:
        self.count = 0

    def settled(self, before: Any, after: Any) -> bool:
        self.count += 1
        return before == after


def passes_of(q: Query) -> int:
    """How many passes the model's fixed point runs on q."""
    ops = CountingOps()
    algorithms.fixed_point_of(
        algorithms.group_finders(q), algorithms.top_length(q), algorithms.max_passes(q), ops
    )
    return ops.count


def family(groups: int, blocks: int) -> Query:
    """Group g (mamba, b = 1) misses every block j with j ≡ g (mod groups); M = blocks."""
    rows = [[j % groups != g for j in range(blocks)] for g in range(groups)]
    return parse_query(
        {
            "groups": [{"kind": "mamba", "block_size": 1}] * groups,
            "cached": rows,
            "max_length": blocks,
        }
    )


def family_passes(groups: int, blocks: int) -> int:
    """The passes the family needs: floor((G-1)·n/G) + 2."""
    return (groups - 1) * blocks // groups + 2


def many_passes_goals(bound: int | None) -> list[Goal]:
    assert bound is not None
    goals = []
    wrong = [
        (groups, n, passes_of(family(groups, n)))
        for groups in (2, 3, 4)
        for n in range(1, bound + 1)
        if passes_of(family(groups, n)) != family_passes(groups, n)
    ]
    goals.append(
        Goal(
            f"the family needs floor((G-1)n/G)+2 passes, G = 2..4, n = 1..{bound}",
            [z3.BoolVal(bool(wrong))],
        )
    )
    tight = min(bound, 8)
    for n in range(1, tight + 1):
        sq = sym_query(["mamba", "mamba"], n, f"mp{n}")
        q = sq.query
        finders = algorithms.group_finders(q, sq.ops)
        need = n // 2 + 3  # one more than the claimed most
        before = algorithms.fixed_point_of(finders, z3.IntVal(n), need - 2, sq.ops)
        after = algorithms.fixed_point_of(finders, z3.IntVal(n), need - 1, sq.ops)
        goals.append(
            Goal(
                f"two groups, M = {n}: no state needs {need} passes",
                [*sq.pre, q.max_length == n, before != after],
            )
        )
    return goals


THEOREMS = [
    Theorem(
        name="fixed_point_maximal",
        statement=(
            "For any number of groups in any order and any M, if every finder meets its "
            "contract, the fixed point returns L* (induction over finders and passes, "
            "lengths in units of A)."
        ),
        expected="proved",
        kind="unbounded",
        build=maximal_goals,
    ),
    Theorem(
        name="fixed_point_model_code",
        statement=(
            "The model's own fixed_point_of, run on 1 to 3 arbitrary contract-meeting "
            "finders, returns L* for every top up to N units of A."
        ),
        expected="proved",
        kind="bounded",
        bound=6,
        quick_bound=4,
        build=model_code_goals,
    ),
    Theorem(
        name="termination",
        statement=(
            "Every pass that changes L lowers it by at least A and L stays at or above "
            "L* >= 0, so the fixed point settles within floor(M/A)+1 passes."
        ),
        expected="proved",
        kind="unbounded",
        build=termination_goals,
    ),
    Theorem(
        name="many_passes",
        statement=(
            "The termination bound is reached: G groups where group g misses blocks "
            "j = g (mod G) need floor((G-1)n/G)+2 passes on n blocks (M+1 once G >= M), "
            "and no two-group state needs more than floor(n/2)+2."
        ),
        expected="proved",
        kind="bounded",
        bound=32,
        quick_bound=16,
        build=many_passes_goals,
    ),
]
