"""Theorems 1 and 2: the fixed point returns L*, within floor(M/A)+1 passes.

Both are proved over the model's own :class:`~kvhit.model.algorithms.Loop`, the two
folds :func:`~kvhit.model.algorithms.fixed_point_of` runs, for any number of groups
G (a z3 integer), any order and any M, with finders that are any functions at all
meeting the contract (:class:`kvhit.proofs.common.AbstractFinders`; lengths in units
of A). Each step of the code runs once on symbolic values against a loop invariant:

- the pass (fold of ``visit`` over groups 0 … G-1, from x): L* ≤ L ≤ x, and while L
  is still x the group that L*'s definition blames for x (some group is invalid at
  every candidate above L*) has not been visited. It holds at the start, one
  ``visit`` keeps it (the finder's contract), and at the end it gives the *pass
  contract*: L* ≤ after ≤ x, and after = x only when x = L*;
- the loop (fold of ``settle`` over passes, given the pass contract): after p passes
  L* ≤ L ≤ top, settled means L = L*, unsettled means L ≤ top - p. It holds at the
  start, one pass keeps it, and after ``max_passes`` = floor(M/A)+1 passes it gives
  settled at L = L*.

Theorem 1 (``fixed_point_maximal``) is those six goals. ``fixed_point_driver`` proves
the driver that runs the loop (``Loop.run``, all of ``fixed_point_of``): one ``turn``
of its own code (a pass, settle, the stop test) keeps the loop invariant, and a turn
that stops it has settled at L*, so it returns L* whether it stops early or not. Theorem 2 (``termination``)
is the same six (it rests on the pass contract and the loop invariant, so it proves
them itself) plus two: a pass that does not settle lowers L by at least one unit,
and a settled state stays settled (so the early stop of ``fixed_point_of`` changes
nothing). ``fixed_point_model_code`` runs ``fixed_point_of`` itself, unchanged, over
1-3 such finders for every top up to the bound: a bounded cross-check of the driver.
``many_passes``: no two-group state needs more than floor(n/2)+2 passes. That the
bound floor(M/A)+1 is reached (G groups, group g missing blocks j ≡ g mod G) is
checked by the tests on concrete states.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import z3

from kvhit.model import algorithms
from kvhit.model.algorithms import Loop
from kvhit.model.ops import Ops
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Kind, Query
from kvhit.proofs.common import AbstractFinders, SymQuery, sym_query
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.symbolic import Z3Ops


@dataclass
class LoopSetting:
    """Everything the loop-invariant goals share: G groups behind uninterpreted
    contract-meeting finders, M (A = 1: lengths in units of A), the model's own
    :class:`~kvhit.model.algorithms.Loop` over them, and L* with its blame function."""

    af: AbstractFinders
    loop: Loop
    groups: Any
    top: Any
    passes: Any
    best: Any
    blame: Any
    facts: list[Any]

    def contract_at(self, g: Any, m: Any) -> list[Any]:
        """The contract of group g's finder at input m, and L*'s validity for g: the
        instances the goals rest on (stated outright, so no solver has to find them)."""
        F, V, ls = self.af.F, self.af.V, self.best
        inside = z3.And(g >= 0, g < self.groups)
        return [
            z3.Implies(m >= 0, z3.And(F(g, m) >= 0, F(g, m) <= m, V(g, F(g, m)))),
            z3.Implies(z3.And(m >= 0, F(g, m) < ls, ls <= m), z3.Not(V(g, ls))),
            z3.Implies(inside, V(g, ls)),
        ]

    def blamed(self, x: Any) -> Any:
        """L*'s definition at x: a candidate above L* is invalid for some group,
        ``blame(x)``."""
        b = self.blame(x)
        return z3.Implies(
            z3.And(self.best < x, x <= self.top),
            z3.And(b >= 0, b < self.groups, z3.Not(self.af.V(b, x))),
        )

    def pass_invariant(self, start: Any, g: Any, length: Any) -> Any:
        """After the first g finders of a pass that began at ``start``: L* ≤ L ≤ start,
        and if L is still ``start``, the group to blame for it is not among them."""
        return z3.And(
            0 <= g,
            g <= self.groups,
            self.best <= length,
            length <= start,
            z3.Implies(length == start, z3.Or(start <= self.best, self.blame(start) >= g)),
        )

    def pass_contract(self, start: Any, after: Any) -> Any:
        """What a whole pass gives: L* ≤ after ≤ start, and a pass that changed
        nothing began at L*."""
        return z3.And(
            self.best <= after,
            after <= start,
            z3.Implies(after == start, start == self.best),
        )

    def loop_invariant(self, p: Any, state: Any) -> Any:
        """After p passes: L* ≤ L ≤ top; settled means L = L*; unsettled means every
        pass so far lowered L, so L ≤ top - p."""
        length, done = state
        return z3.And(
            0 <= p,
            p <= self.passes,
            self.best <= length,
            length <= self.top,
            z3.Implies(done, length == self.best),
            z3.Implies(z3.Not(done), length <= self.top - p),
        )


def loop_setting() -> LoopSetting:
    """Any number of groups, any M, any contract-meeting finders, as z3 terms."""
    af = AbstractFinders("fp")
    G, m = z3.Ints("fp_G fp_M")
    q = Query((), (), m, m + 1, 1)  # the limits only: A = 1, lengths in units of A
    ops = Z3Ops(bound=1)
    top, passes = algorithms.top_length(q, ops), algorithms.max_passes(q, ops)
    ls = z3.Int("fp_Lstar")
    blame = z3.Function("fp_blame", z3.IntSort(), z3.IntSort())
    loop = Loop(af.F, G, ops)
    facts = [G >= 1, m >= 0, ls >= 0, ls <= top]
    return LoopSetting(af, loop, G, top, passes, ls, blame, facts)


def loop_goals() -> dict[str, Goal]:
    """Every obligation of the two loop invariants, by name (see the module docstring)."""
    s = loop_setting()
    loop = s.loop
    x, length, g, p, after = z3.Ints("fp_x fp_L fp_g fp_p fp_after")
    done = z3.Bool("fp_done")
    state = (length, done)
    at_x = [*s.facts, s.best <= x, x <= s.top, s.blamed(x)]
    stepped = loop.visit(length, g)
    settled = loop.settle(state, after)
    return {
        "pass start": Goal(
            "a pass starts inside its invariant", at_x, z3.Not(s.pass_invariant(x, 0, x))
        ),
        "pass step": Goal(
            "one finder of a pass keeps the pass invariant",
            [*at_x, s.pass_invariant(x, g, length), g < s.groups, *s.contract_at(g, length)],
            z3.Not(s.pass_invariant(x, g + 1, stepped)),
        ),
        "pass end": Goal(
            "a whole pass meets the pass contract",
            [*at_x, s.pass_invariant(x, s.groups, length)],
            z3.Not(s.pass_contract(x, length)),
        ),
        "loop start": Goal(
            "the loop starts inside its invariant",
            s.facts,
            z3.Not(s.loop_invariant(0, loop.start(s.top))),
        ),
        "loop step": Goal(
            "one pass (settle after the pass contract) keeps the loop invariant",
            [*s.facts, s.loop_invariant(p, state), p < s.passes, s.pass_contract(length, after)],
            z3.Not(s.loop_invariant(p + 1, settled)),
        ),
        "loop end": Goal(
            "after floor(M/A)+1 passes the loop has settled at L*",
            [*s.facts, s.loop_invariant(s.passes, state)],
            z3.Not(z3.And(done, loop.finish(state) == s.best)),
        ),
        "lowers": Goal(
            "a pass that does not settle lowers L by at least one unit of A",
            [*s.facts, s.loop_invariant(p, state), p < s.passes, s.pass_contract(length, after)],
            z3.Not(z3.Or(settled[1], loop.finish(settled) <= length - 1)),
        ),
        "stays": Goal(
            "a settled state stays settled: stopping early changes nothing",
            [*s.facts, done],
            z3.Not(z3.And(settled[0] == length, settled[1])),
        ),
        **driver_goals(s, p, state, after),
    }


@dataclass(frozen=True)
class PassOf(Loop):
    """The model's Loop with its pass standing for any pass that meets the pass
    contract (a fresh ``after``, which the pass goals prove of ``run_pass``): the
    driver's goals run the model's own ``turn`` (step, settle, the stop test) on it."""

    after: Any = None

    def run_pass(self, length: Any) -> Any:
        return self.after


def driver_goals(s: LoopSetting, p: Any, state: Any, after: Any) -> dict[str, Goal]:
    """The driver (``Loop.run``, what ``fixed_point_of`` runs): from any state inside
    the loop invariant, one ``turn`` keeps it, and a turn that says stop has settled
    at L*. With "loop start" and "loop end", the driver returns L* whether it stops
    early or runs all its floor(M/A)+1 turns, for any G and M."""
    turned, stop = PassOf(s.loop.finder, s.groups, s.loop.ops, after).turn(state)
    inside = [*s.facts, s.loop_invariant(p, state), p < s.passes, s.pass_contract(state[0], after)]
    return {
        "turn": Goal(
            "one turn of the driver keeps the loop invariant",
            inside,
            z3.Not(s.loop_invariant(p + 1, turned)),
        ),
        "stop": Goal(
            "a turn that stops the driver has settled at L*",
            inside,
            z3.Not(z3.Implies(stop, z3.And(turned[1], s.loop.finish(turned) == s.best))),
        ),
    }


MAXIMAL = ("pass start", "pass step", "pass end", "loop start", "loop step", "loop end")
TERMINATION = (*MAXIMAL[:5], "lowers", "loop end", "stays")
"""Termination rests on the same pass contract and loop invariant, so it proves them
too: no goal of one theorem is assumed by the other."""
DRIVER = (*MAXIMAL[:4], "turn", "stop", "loop end")
"""The driver's own goals, and the pass contract and loop invariant they rest on."""


def invariant_goals(names: tuple[str, ...]) -> Callable[[int | None], list[Goal]]:
    """The goals of ``names`` (a fresh set of terms on each build)."""
    return lambda bound: [loop_goals()[name] for name in names]


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
                "groups": [{"kind": Kind.MAMBA, "block_size": 1}] * groups,
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
                    [*af.ground_contract(groups, top), *best],
                    got != ls,
                    witness=mamba_witness(af, groups, top, algorithms.fixed_point),
                )
            )
    return goals


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


def many_passes_goals(bound: int | None) -> list[Goal]:
    """Two groups, M = n blocks: one pass more than floor(n/2)+2 never changes L."""
    assert bound is not None
    goals = []
    for n in range(1, min(bound, 8) + 1):
        sq = sym_query([Kind.MAMBA, Kind.MAMBA], n, f"mp{n}")
        q = sq.query
        finders = algorithms.group_finders(q, sq.ops)
        need = n // 2 + 3  # one more than the claimed most
        before = algorithms.fixed_point_of(finders, z3.IntVal(n), need - 2, sq.ops)
        after = algorithms.fixed_point_of(finders, z3.IntVal(n), need - 1, sq.ops)
        goals.append(
            Goal(
                f"two groups, M = {n}: no state needs {need} passes",
                [*sq.pre, q.max_length == n],
                before != after,
                witness=passes_witness(sq, need - 2),
            )
        )
    return goals


def passes_witness(sq: SymQuery, most: int) -> Any:
    """The state as a query; broken when the plain fixed point runs more than ``most``
    passes on it."""

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        got, passes = algorithms.fixed_point(q), passes_of(q)
        answers = {"fixed point": got, "passes": passes, "L*": algorithms.brute_force(q)}
        note = f"{passes} passes, more than {most}"
        return Counterexample(q, "fixed point", got, answers, broken=passes > most, note=note)

    return witness


THEOREMS = [
    Theorem(
        name="fixed_point_maximal",
        statement=(
            "For any number of groups in any order and any M, if every finder meets its "
            "contract, the model's Loop (the fold fixed_point_of runs) returns L* after "
            "its floor(M/A)+1 passes: a loop invariant per fold, over one symbolic step "
            "of the model's own visit and settle (lengths in units of A)."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=invariant_goals(MAXIMAL),
        rests_on="model code: Loop (finders abstract)",
        scope="any G, order, M",
    ),
    Theorem(
        name="fixed_point_model_code",
        statement=(
            "The model's own fixed_point_of, run on 1 to 3 arbitrary contract-meeting "
            "finders, returns L* for every top up to N units of A."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=6,
        quick_bound=4,
        build=model_code_goals,
        rests_on="model code: fixed_point_of (finders abstract)",
        scope="G = 1-3, top <= N units of A",
    ),
    Theorem(
        name="fixed_point_driver",
        statement=(
            "The model's driver (Loop.run, what fixed_point_of runs) returns L* for any "
            "number of groups in any order and any M, whether it stops early or runs all "
            "floor(M/A)+1 turns: from any state in the loop invariant one turn of its own "
            "code keeps it, and a turn that stops it has settled at L*."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=invariant_goals(DRIVER),
        rests_on="model code: Loop.run, turn (finders abstract)",
        scope="any G, order, M",
    ),
    Theorem(
        name="termination",
        statement=(
            "A pass of the model's Loop that does not settle lowers L by at least A, L "
            "stays at or above L* >= 0, and a settled state stays settled, so the loop "
            "settles within floor(M/A)+1 passes (any groups, order, M)."
        ),
        expected=Status.PROVED,
        bounded=False,
        build=invariant_goals(TERMINATION),
        rests_on="model code: Loop (finders abstract)",
        scope="any G, order, M",
    ),
    Theorem(
        name="many_passes",
        statement=(
            "No two-group cache state (mamba, b = 1, M = n blocks) needs more than "
            "floor(n/2)+2 passes of the model's fixed point."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=8,
        quick_bound=6,
        build=many_passes_goals,
        rests_on="model code: fixed_point_of, mamba finders",
        scope="2 groups, b = A = 1, M <= min(N, 8)",
    ),
]
