"""The theorem registry behind ``kvhit prove`` (docs/design.md §3).

A theorem is a :class:`Theorem`: a name, a one-sentence statement, the status it is
expected to get (:attr:`Status.PROVED`, or :attr:`Status.REFUTED` for a known-wrong
algorithm), whether it is bounded (and its default bound), and a ``build``
function that makes its solver queries at a given bound.

``build(bound)`` returns a list of :class:`Goal`. Each goal is z3 assumptions and
the claim's negation, which together say **the claim is false** (they describe a
counterexample). The runner (:mod:`kvhit.proofs.runner`) checks every goal:

- every goal ``unsat``, and each one's assumptions alone ``sat``: the theorem is
  *proved*; assumptions that are unsat by themselves make it *vacuous*, a failure
  (such a goal could never have failed);
- some goal ``sat``: the theorem is *refuted*; the goal's ``witness`` turns the
  solver's model into a :class:`Counterexample` (a protocol query and each
  algorithm's answer on it), which must really break the claim when run through the
  plain Python model (``Counterexample.broken``), or the result is an *error*;
- ``unknown`` or a timeout: *unknown* or *timeout*, a failure, never a pass.

A goal with ``minimize`` terms is solved with ``z3.Optimize`` and those terms are
minimized in order (lexicographically), so a refutation is as small as it can be.

Writing a theorem module (``proofs/theorems/impl_formula.py`` is one)::

    from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem

    def build(bound: int | None) -> list[Goal]:
        ...                              # z3 terms from the model's own code
        return [Goal("formula == spec", assumptions, claim_is_false, witness=to_counterexample)]

    THEOREMS = [
        Theorem(
            name="impl_formula",
            statement="The vectorized impl formula equals the spec on every cache state.",
            expected=Status.PROVED,
            bounded=True,
            bound=16,
            build=build,
        ),
    ]

then add the module's name to :data:`THEOREM_MODULES` (one line). ``bound`` is the
theorem's default; ``kvhit prove --bound N`` passes N to every bounded theorem, and
``quick_bound`` (when set) is used by ``kvhit verify --quick``. Unbounded theorems get
``None``. Keep each theorem's queries fast: the whole default suite must finish in
about two minutes on two cores. A theorem that only re-proves, in another encoding,
what an unbounded one proves is ``deep=True``: it runs under ``kvhit prove --deep``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from functools import cached_property
from typing import Any

import z3

from kvhit.model.spec import Query


class Status(StrEnum):
    """What a theorem came to (the runner's verdict)."""

    PROVED = "proved"  # every goal unsat, and no goal's assumptions alone unsat
    REFUTED = "refuted"  # a goal sat, its counterexample confirmed by the plain model
    UNKNOWN = "unknown"  # z3 gave up on a goal: a failure
    TIMEOUT = "timeout"  # z3 ran out of time on a goal: a failure
    VACUOUS = "vacuous"  # a goal's assumptions alone are unsat: it proves nothing
    ERROR = "error"  # the goals could not be built, or a counterexample does not reproduce


THEOREM_MODULES = [
    "kvhit.proofs.theorems.fixed_point",
    "kvhit.proofs.theorems.contracts",
    "kvhit.proofs.theorems.drafters",
    "kvhit.proofs.theorems.hash_units",
    "kvhit.proofs.theorems.closure",
    "kvhit.proofs.theorems.min_groups",
    "kvhit.proofs.theorems.rounding",
    "kvhit.proofs.theorems.eagle",
    "kvhit.proofs.theorems.impl_formula",
    "kvhit.proofs.theorems.lookup",
    "kvhit.proofs.theorems.tiers",
    "kvhit.proofs.theorems.recovery",
]
"""Every module that defines ``THEOREMS``, in the order ``kvhit prove`` runs them."""


@dataclass
class Counterexample:
    """A concrete protocol query on which a claim fails, and what each algorithm said.

    ``algorithm`` answered ``length`` on ``query`` (drawn with :func:`kvhit.draw.judge`);
    ``answers`` holds every answer worth showing, by name (``"L*"`` among them).
    ``broken`` says whether the plain Python model, run on ``query``, really breaks
    the claim; a refutation whose counterexample is not broken is an error.
    """

    query: Query
    algorithm: str
    length: int
    answers: dict[str, Any]
    broken: bool
    note: str = ""

    def to_json(self) -> dict[str, Any]:
        """The counterexample as JSON-ready data (``kvhit prove --json``)."""
        return {
            "query": self.query.to_json(),
            "algorithm": self.algorithm,
            "length": self.length,
            "answers": dict(self.answers),
            "broken": self.broken,
            "note": self.note,
        }


Witness = Callable[[z3.ModelRef], Counterexample]


@dataclass
class Goal:
    """One solver query: assumptions and the claim's negation, which together hold
    exactly on a counterexample to the claim.

    The runner checks ``assertions`` (both), and, when they are unsat, the
    ``context`` (the assumptions alone): it must be sat, or the goal is vacuous.
    ``witness`` reads a counterexample off a model (needed for goals that can be sat);
    ``minimize`` lists integer terms to minimize, most important first; ``logic``
    (an SMT-LIB logic such as ``"QF_AUFLIA"``) gives z3 its solver for that logic,
    which skips the general solver's preprocessing: much faster on a large
    quantifier-free goal. ``cvc5_options`` are set on cvc5 when it re-checks the goal.
    ``prepare`` rewrites the assertions before they go to a solver (for instance
    :func:`kvhit.proofs.instantiate.ground`); it may only weaken them.
    """

    name: str
    assumptions: Sequence[Any]
    negation: Any
    witness: Witness | None = None
    minimize: Sequence[Any] = ()
    logic: str | None = None
    cvc5_options: Mapping[str, str] = field(default_factory=dict)
    prepare: Callable[[list[Any]], list[Any]] | None = None

    @cached_property
    def assertions(self) -> list[Any]:
        """What the solver gets: the assumptions and the negated claim (prepared once:
        grounding and linearizing a large goal takes seconds)."""
        return self._prepared([*self.assumptions, self.negation])

    @cached_property
    def context(self) -> list[Any]:
        """The assumptions alone, prepared the same way: the vacuity check's query,
        i.e. what the solver is given without the negated claim. (With quantified
        assumptions grounded by ``prepare``, that is the grounded set the solver's
        unsat answer rests on.)"""
        return self._prepared(list(self.assumptions))

    def _prepared(self, terms: list[Any]) -> list[Any]:
        return self.prepare(terms) if self.prepare is not None else terms


@dataclass(frozen=True)
class Theorem:
    """A named claim and how to build its solver queries (see the module docstring)."""

    name: str
    statement: str
    expected: Status  # PROVED, or REFUTED for a known-wrong algorithm
    bounded: bool  # proved up to a bound N (then ``bound`` is its default), or for all
    build: Callable[[int | None], list[Goal]]
    bound: int | None = None
    quick_bound: int | None = None
    tags: tuple[str, ...] = field(default=())
    rests_on: str = "model code"
    """What the goals are about: the model's own code (which part), or an abstraction."""
    scope: str = ""
    """The range beyond the bound: which groups, block sizes, alignments, lengths."""
    deep: bool = False
    """A cross-check that re-proves, in another encoding, what an unbounded theorem
    of the default suite proves: it runs only under ``kvhit prove --deep`` (or when
    named with ``--only``)."""

    def __post_init__(self) -> None:
        if self.expected not in (Status.PROVED, Status.REFUTED):
            raise ValueError(f"{self.name}: expected must be 'proved' or 'refuted'")
        if self.bounded and self.bound is None:
            raise ValueError(f"{self.name}: a bounded theorem needs a default bound")

    def __reduce__(self) -> tuple[Any, ...]:
        """A theorem goes to a worker process by name (its ``build`` may be a closure)."""
        return get, (self.name,)

    def range_at(self, bound: int | None) -> str:
        """Over what the goals range at ``bound``: unbounded or N, then the scope."""
        reach = "unbounded" if bound is None else f"N={bound}"
        return f"{reach}; {self.scope}" if self.scope else reach

    def bound_for(self, bound: int | None = None, quick: bool = False) -> int | None:
        """The bound this theorem runs at: None when unbounded, else the override,
        the quick bound (if asked and set) or the default."""
        if not self.bounded:
            return None
        if bound is not None:
            return bound
        if quick and self.quick_bound is not None:
            return self.quick_bound
        return self.bound


def all_theorems(modules: Sequence[str] | None = None) -> list[Theorem]:
    """Every registered theorem, in module order; names are unique."""
    out: list[Theorem] = []
    for name in modules if modules is not None else THEOREM_MODULES:
        out.extend(importlib.import_module(name).THEOREMS)
    seen: set[str] = set()
    for t in out:
        if t.name in seen:
            raise ValueError(f"two theorems are named {t.name!r}")
        seen.add(t.name)
    return out


def get(name: str) -> Theorem:
    """The registered theorem called ``name`` (KeyError with the known names if none)."""
    theorems = {t.name: t for t in all_theorems()}
    if name not in theorems:
        raise KeyError(f"no theorem {name!r}; known: {', '.join(theorems)}")
    return theorems[name]
