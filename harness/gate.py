"""The gate's plan: exhaustive small scopes, then the solver corpus, then random
queries for the time budget. Used by ``kvhit gate``, ``kvhit verify`` and the
pytest plugin.

    >>> from kvhit.targets.spec import TargetSpec
    >>> tally = run_gate(CaseChecker(TargetSpec("model").open(), "model"), seconds=0.2)
    >>> tally.disagreements, tally.cases > 7000
    (0, True)
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from kvhit.contract import BASE, Capabilities
from kvhit.harness import corpus, exhaustive
from kvhit.harness.checker import Case, CaseChecker, Phase
from kvhit.harness.random_cases import CHOICES, QueryShape, random_queries
from kvhit.harness.tally import Tally

DEFAULT_SECONDS = 20.0


def exhaustive_cases() -> Iterator[Case]:
    """Every state of every gate scope, with L* from the vectorized reference."""
    for scope in exhaustive.gate_scopes():
        yield from exhaustive.cases(scope)


def corpus_cases() -> Iterator[Case]:
    """The solver and boundary states (L* worked out by the engine)."""
    return ((q, None) for q in corpus.corpus_queries())


def random_cases(
    seed: int, max_blocks: int, kinds: Sequence[str], shape: str = QueryShape.ANY
) -> Iterator[Case]:
    """Endless seeded random queries of ``shape``."""
    return ((q, None) for q in random_queries(seed, None, max_blocks, kinds, shape))


def random_phases(
    seed: int,
    max_blocks: int,
    kinds: Sequence[str],
    seconds: float | None,
    cases: int | None,
    shape: str = QueryShape.ANY,
    capabilities: Capabilities = BASE,
) -> list[Phase]:
    """``kvhit fuzz``'s one phase: seeded random queries of ``shape`` for ``seconds``
    or ``cases``."""
    return [Phase("random", random_cases(seed, max_blocks, kinds, shape), seconds, cases)]


def gate_phases(
    seconds: float = DEFAULT_SECONDS,
    seed: int = 0,
    max_blocks: int = 8,
    kinds: Sequence[str] = CHOICES,
    cases: int | None = None,
    shape: str = QueryShape.ANY,
    capabilities: Capabilities = BASE,
) -> list[Phase]:
    """The three phases; the random one draws queries of ``shape`` for ``seconds``
    (and at most ``cases`` cases)."""
    return [
        Phase("exhaustive", exhaustive_cases()),
        Phase("corpus", corpus_cases()),
        Phase("random", random_cases(seed, max_blocks, kinds, shape), seconds, cases),
    ]


def run_phases(checker: CaseChecker, phases: Sequence[Phase]) -> Tally:
    """Run the phases in order on ``checker``; stop early if it stops at a
    disagreement. Its tally."""
    for phase in phases:
        if not checker.run(phase):
            break
    return checker.tally


def run_gate(
    checker: CaseChecker,
    seconds: float = DEFAULT_SECONDS,
    seed: int = 0,
    shape: str = QueryShape.ANY,
) -> Tally:
    """The gate with its defaults on ``checker``, random queries of ``shape``; its tally."""
    return run_phases(checker, gate_phases(seconds, seed, shape=shape))
