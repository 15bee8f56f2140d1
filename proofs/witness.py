"""Goals about an algorithm against L*, and reading their refutations off a model.

:func:`spec_goal` is the one builder for "this algorithm of the model, run on a
symbolic query, answers L*" (or any other comparison with L*): the model's own
algorithm against :func:`kvhit.proofs.common.spec_answer`. :func:`witness_for` makes
a goal's ``witness``: it reads the concrete query off the model
(:meth:`kvhit.proofs.common.SymQuery.concrete`), runs each named algorithm of the
plain Python model on it, adds L* (brute force), and sets ``broken`` by asking
whether the claimed algorithm's answer really breaks the claim there.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

import z3

from kvhit.model.algorithms import brute_force
from kvhit.proofs.common import SymQuery, spec_answer
from kvhit.proofs.registry import Counterexample, Goal

Algorithm = Callable[..., Any]
"""An algorithm of the model: ``run(query)``, or ``run(query, ops)`` on z3 terms."""

Breaks = Callable[[Any, Any], Any]
"""``breaks(answer, L*)``: whether an answer contradicts the claim (ints or z3 terms)."""


def witness_for(
    sq: SymQuery,
    algorithm: str,
    algorithms: dict[str, Algorithm],
    breaks: Breaks,
    note: str = "",
) -> Callable[[z3.ModelRef], Counterexample]:
    """A witness for claims about ``algorithms[algorithm]`` against L*.

    ``breaks(answer, L*)`` says whether an answer contradicts the claim, e.g.
    ``operator.ne`` for "answers L*".
    """

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        answers: dict[str, Any] = {name: run(q) for name, run in algorithms.items()}
        answers["L*"] = brute_force(q)
        length = answers[algorithm]
        return Counterexample(q, algorithm, length, answers, breaks(length, answers["L*"]), note)

    return witness


def spec_goal(
    label: str,
    sq: SymQuery,
    algorithm: str,
    run: Algorithm,
    others: dict[str, Algorithm] | None = None,
    breaks: Breaks = operator.ne,
    note: str = "",
    smallest: bool = False,
) -> Goal:
    """The goal "``run`` breaks the claim against L*" (``breaks(run(q), L*)``) on the
    symbolic query ``sq``; ``others`` are shown next to it in a counterexample, and
    ``smallest`` asks for the smallest M, then the fewest cached blocks."""
    found = run(sq.query, sq.ops)
    shown = {algorithm: run, **(others or {})}
    return Goal(
        label,
        sq.pre,
        breaks(found, spec_answer(sq)),
        witness=witness_for(sq, algorithm, shown, breaks, note),
        minimize=[sq.query.max_length, sq.cached_count()] if smallest else (),
    )
