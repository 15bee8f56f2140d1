"""Running theorems: z3 on every goal, cvc5 on every unsat one (when asked),
counterexamples checked.

:func:`run_theorem` gives a :class:`Result` per theorem (see
:mod:`kvhit.proofs.registry` for what proved / refuted / unknown / error mean), in
this process, goal after goal. ``kvhit prove`` runs it in worker processes, one
theorem per worker at a time (:mod:`kvhit.proofs.workers`).
"""

from __future__ import annotations

import time
import traceback
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import z3

from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem

CONTEXT_SIZE = 12
"""How many constants of a goal's satisfying context are kept for the report."""


@dataclass
class GoalResult:
    """What z3 (and cvc5, if asked) said about one goal."""

    name: str
    status: str  # "unsat", "sat", "unknown", "timeout"
    seconds: float
    cvc5: str | None = None  # "unsat", "sat", "unknown", or None when not re-checked
    context: dict[str, Any] | None = None  # for an unsat goal: its assumptions satisfied

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "status": self.status,
            "seconds": round(self.seconds, 3),
            "cvc5": self.cvc5,
            "context": self.context,
        }


@dataclass
class Result:
    """What one theorem came to."""

    name: str
    statement: str
    status: Status
    expected: Status
    bound: int | None
    seconds: float
    rests_on: str = ""
    range: str = ""
    cross_check: str | None = None  # None (not asked), "agree", or what went otherwise
    unconfirmed: int = 0  # unsat goals cvc5 did not also find unsat
    counterexample: Counterexample | None = None
    detail: str = ""
    goals: list[GoalResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """The expected status, and cvc5 (when asked) also answering unsat on every
        goal z3 found unsat: a cvc5 sat, unknown or timeout is a failure. An expected
        refutation needs a counterexample the plain model confirms."""
        if self.expected == Status.REFUTED and self.counterexample is None:
            return False
        return self.status == self.expected and not self.unconfirmed

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "statement": self.statement,
            "status": self.status,
            "expected": self.expected,
            "bound": self.bound,
            "rests_on": self.rests_on,
            "range": self.range,
            "seconds": round(self.seconds, 3),
            "cross_check": self.cross_check,
            "counterexample": self.counterexample.to_json() if self.counterexample else None,
            "goals": [g.to_json() for g in self.goals],
        }


def smt2(goal: Goal) -> str:
    """The goal as an SMT-LIB2 script (set-logic ALL ... check-sat)."""
    s = z3.Solver()
    s.add(*goal.assertions)
    return f"; {goal.name}\n(set-logic ALL)\n{s.to_smt2()}"


def z3_check(
    goal: Goal, timeout: float, assertions: list[Any] | None = None
) -> tuple[str, z3.ModelRef | None]:
    """sat / unsat / unknown / timeout for the goal's assertions (or ``assertions``),
    and the model when sat (minimized when the goal asks)."""
    ms = max(1, int(timeout * 1000))
    terms = goal.assertions if assertions is None else assertions
    if goal.minimize and assertions is None:
        opt = z3.Optimize()
        opt.set("timeout", ms)
        opt.add(*terms)
        for term in goal.minimize:
            opt.minimize(term)
        result = opt.check()
        return str(result), opt.model() if result == z3.sat else None
    # Quantifier instantiation depends on the random seed: an unknown gets two more
    # seeds. A timeout does not, so a goal that hangs costs one timeout, not three.
    for seed in range(3):
        s = z3.SolverFor(goal.logic) if goal.logic else z3.Solver()
        s.set("timeout", ms, "random_seed", seed)
        s.add(*terms)
        result = s.check()
        if result == z3.unknown and s.reason_unknown() in ("timeout", "canceled"):
            return "timeout", None
        if result != z3.unknown:
            break
    return str(result), s.model() if result == z3.sat else None


def context_of(model: z3.ModelRef) -> dict[str, Any]:
    """A satisfying context, readable: the model's integer and boolean constants
    (the first :data:`CONTEXT_SIZE` by name)."""
    out: dict[str, Any] = {}
    for decl in sorted(model.decls(), key=lambda d: d.name()):
        if decl.arity() != 0 or len(out) >= CONTEXT_SIZE:
            continue
        value = model[decl]
        if z3.is_int_value(value):
            out[decl.name()] = value.as_long()
        elif z3.is_true(value) or z3.is_false(value):
            out[decl.name()] = z3.is_true(value)
    return out


def cvc5_check(text: str, timeout: float, options: Mapping[str, str] | None = None) -> str:
    """Re-check an SMT-LIB2 script with cvc5 (from PyPI): sat / unsat / unknown, or
    error if cvc5 cannot read it. ``options`` are extra cvc5 options (name to value).
    """
    import cvc5

    tm = cvc5.TermManager()
    solver = cvc5.Solver(tm)
    solver.setOption("tlimit-per", str(max(1, int(timeout * 1000))))
    solver.setOption("arrays-exp", "true")
    for name, value in (options or {}).items():
        solver.setOption(name, value)
    symbols = cvc5.SymbolManager(tm)
    parser = cvc5.InputParser(solver, symbols)
    parser.setStringInput(cvc5.InputLanguage.SMT_LIB_2_6, text, "goal")
    answer = "unknown"
    try:
        while True:
            command = parser.nextCommand()
            if command.isNull():
                break
            out = command.invoke(solver, symbols).strip()
            if out in ("sat", "unsat"):
                answer = out
    except RuntimeError:
        return "error"
    return answer


SOLVER_TIMEOUT = 180.0
"""Seconds per solver query. The largest goal (the unrolled sliding-window eagle scan
at 64 blocks, under ``--deep``) takes cvc5 about 45 s on a quiet 2-core machine;
this leaves room for a busy one."""


def blank_result(theorem: Theorem, bound: int | None, status: Status = Status.PROVED) -> Result:
    """A theorem's result before any goal is settled (``status`` until one says otherwise)."""
    return Result(
        theorem.name,
        theorem.statement,
        status,
        theorem.expected,
        bound,
        0.0,
        rests_on=theorem.rests_on,
        range=theorem.range_at(bound),
    )


def run_theorem(
    theorem: Theorem,
    bound: int | None = None,
    quick: bool = False,
    timeout: float = SOLVER_TIMEOUT,
    cross_check: bool = False,
    emit_dir: str | Path | None = None,
) -> Result:
    """Build the theorem's goals at its bound and settle them."""
    at = theorem.bound_for(bound, quick)
    start = time.perf_counter()
    result = blank_result(theorem, at)
    try:
        goals = theorem.build(at)
        _settle(theorem, goals, result, timeout, cross_check, emit_dir)
    except Exception as err:  # a theorem that cannot be built or read back is an error
        result.status = Status.ERROR
        result.detail = f"{type(err).__name__}: {err}\n{traceback.format_exc(limit=3)}"
    result.seconds = time.perf_counter() - start
    return result


def _settle(
    theorem: Theorem,
    goals: list[Goal],
    result: Result,
    timeout: float,
    cross_check: bool,
    emit_dir: str | Path | None,
) -> None:
    if emit_dir is not None:
        Path(emit_dir).mkdir(parents=True, exist_ok=True)
    for number, goal in enumerate(goals):
        text = smt2(goal) if (cross_check or emit_dir is not None) else ""
        if emit_dir is not None:
            Path(emit_dir, f"{theorem.name}-{number:03d}.smt2").write_text(text, encoding="utf-8")
        begun = time.perf_counter()
        status, model = z3_check(goal, timeout)
        record = GoalResult(goal.name, status, time.perf_counter() - begun)
        result.goals.append(record)
        if status == "unsat":
            if cross_check:
                record.cvc5 = cvc5_check(text, timeout, dict(goal.cvc5_options))
            if not _not_vacuous(goal, record, result, timeout):
                break
            continue
        if status in ("unknown", "timeout"):
            result.status = Status(status)
            result.detail = f"{goal.name}: z3 answered {status}"
            break
        record.context = context_of(model)
        _refute(goal, model, result)
        break
    if cross_check:
        _cross_check_summary(result)


def _not_vacuous(goal: Goal, record: GoalResult, result: Result, timeout: float) -> bool:
    """Whether the goal's assumptions alone are sat (their model kept as its context);
    else the theorem is vacuous (or unknown / timeout when z3 cannot tell)."""
    status, model = z3_check(goal, timeout, goal.context)
    if status == "sat":
        record.context = context_of(model)
        return True
    if status == "unsat":
        result.status = Status.VACUOUS
        result.detail = f"{goal.name}: its assumptions alone are unsat, so it proves nothing"
    else:
        result.status = Status(status)
        result.detail = f"{goal.name}: z3 answered {status} on its assumptions alone"
    return False


def _refute(goal: Goal, model: z3.ModelRef, result: Result) -> None:
    """A sat goal: the claim is false here, if the counterexample reproduces."""
    if goal.witness is None:
        # An obligation of an inductive argument (or a claim about abstract finders)
        # has no protocol query to show: it is refuted at the context it fails in.
        result.status = Status.REFUTED
        context = ", ".join(f"{k}={v}" for k, v in context_of(model).items())
        result.detail = f"{goal.name}: fails at {context or 'a model'} (no concrete query)"
        return
    cx = goal.witness(model)
    result.counterexample = cx
    if cx.broken:
        result.status = Status.REFUTED
        result.detail = f"{goal.name}: counterexample confirmed by the plain model"
    else:
        result.status = Status.ERROR
        result.detail = f"{goal.name}: the solver's counterexample does not break the plain model"


def _cross_check_summary(result: Result) -> None:
    """Fill ``cross_check`` and ``unconfirmed`` from the goals cvc5 re-checked."""
    checked = [g for g in result.goals if g.cvc5 is not None]
    others = [g for g in checked if g.cvc5 != "unsat"]
    result.unconfirmed = len(others)
    if not others:
        result.cross_check = "agree"
        return
    counts = Counter(g.cvc5 for g in others)
    result.cross_check = f"{len(checked) - len(others)} of {len(checked)} agree, " + ", ".join(
        f"{n} {answer}" for answer, n in sorted(counts.items())
    )
    if result.status == result.expected:
        names = ", ".join(f"{g.name} ({g.cvc5})" for g in others[:3])
        result.detail = f"cvc5 did not confirm {len(others)} unsat goal(s): {names}"
