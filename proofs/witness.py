"""Reading a refutation off a solver model: a checked protocol query, run concretely.

:func:`witness_for` makes a goal's ``witness``: it reads the concrete query off the
model (:meth:`kvhit.proofs.common.SymQuery.concrete`), runs each named algorithm of the
plain Python model on it, adds L* (brute force), and sets ``broken`` by asking
whether the claimed algorithm's answer really breaks the claim there.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import z3

from kvhit.model.algorithms import brute_force
from kvhit.model.spec import Query
from kvhit.proofs.common import SymQuery
from kvhit.proofs.registry import Counterexample

Algorithm = Callable[[Query], int]


def witness_for(
    sq: SymQuery,
    algorithm: str,
    algorithms: dict[str, Algorithm],
    breaks: Callable[[int, int], bool],
    note: str = "",
) -> Callable[[z3.ModelRef], Counterexample]:
    """A witness for claims about ``algorithms[algorithm]`` against L*.

    ``breaks(answer, L*)`` says whether an answer contradicts the claim, e.g.
    ``lambda got, best: got != best`` for "answers L*".
    """

    def witness(model: z3.ModelRef) -> Counterexample:
        q = sq.concrete(model)
        answers: dict[str, Any] = {name: run(q) for name, run in algorithms.items()}
        answers["L*"] = brute_force(q)
        length = answers[algorithm]
        return Counterexample(q, algorithm, length, answers, breaks(length, answers["L*"]), note)

    return witness
