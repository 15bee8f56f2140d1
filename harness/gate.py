"""The gate's plan: exhaustive small scopes, then the solver corpus, then random
queries for the time budget, each of what the target declares. Run through the front
door (:mod:`kvhit.harness.driver`) by ``kvhit gate``, ``kvhit verify`` and the pytest
plugin.

    >>> from kvhit.targets.target_spec import TargetSpec
    >>> from kvhit.targets.target_record import TargetRecord
    >>> runner = TargetSpec("model").open()
    >>> phases = gate_phases(0.2, capabilities=runner.capabilities)
    >>> tally = run_phases(CaseChecker(runner, TargetRecord("model")), phases)
    >>> tally.disagreements, tally.cases > 7000
    (0, True)
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

from kvhit.contract import BASE, Capabilities
from kvhit.harness import corpus, exhaustive
from kvhit.harness.checker import Case, CaseChecker, Phase
from kvhit.harness.random_cases import CHOICES, QueryShape, random_queries
from kvhit.harness.tally import Tally

DEFAULT_SECONDS = 20.0


def exhaustive_cases(
    capabilities: Capabilities = BASE, redrawn: Counter[str] | None = None
) -> Iterator[Case]:
    """Every state of every gate scope a target of ``capabilities`` can be asked, with
    L* from the vectorized reference (a state its rules that read rows refuse is
    skipped, counted in ``redrawn`` by reason)."""
    for scope in exhaustive.gate_scopes(capabilities=capabilities):
        yield from allowed(exhaustive.cases(scope), capabilities, redrawn)


def allowed(
    cases: Iterable[Case], capabilities: Capabilities, redrawn: Counter[str] | None
) -> Iterator[Case]:
    """The ``cases`` whose rows the rules of ``capabilities`` allow (every one, when no
    rule reads rows); each other one counted in ``redrawn`` by its reason."""
    if not capabilities.reads_rows:
        yield from cases
        return
    for q, best in cases:
        why = capabilities.rows_refusal(q)
        if why is None:
            yield q, best
        elif redrawn is not None:
            redrawn[why] += 1


def corpus_cases(
    capabilities: Capabilities = BASE, redrawn: Counter[str] | None = None
) -> Iterator[Case]:
    """The solver and boundary states a target of ``capabilities`` can be asked (L*
    worked out by the engine)."""
    return allowed(((q, None) for q in corpus.corpus_queries(capabilities)), capabilities, redrawn)


def random_cases(
    seed: int,
    max_blocks: int,
    kinds: Iterable[str],
    shape: str = QueryShape.ANY,
    capabilities: Capabilities = BASE,
    redrawn: Counter[str] | None = None,
) -> Iterator[Case]:
    """Endless seeded random queries of ``shape`` that a target of ``capabilities`` can
    be asked (those its rules refuse drawn again, counted in ``redrawn`` by reason)."""
    drawn = random_queries(seed, None, max_blocks, kinds, shape, capabilities, redrawn)
    return ((q, None) for q in drawn)


def random_phases(
    seed: int,
    max_blocks: int,
    kinds: Iterable[str],
    seconds: float | None,
    cases: int | None,
    shape: str = QueryShape.ANY,
    capabilities: Capabilities = BASE,
    redrawn: Counter[str] | None = None,
) -> list[Phase]:
    """``kvhit fuzz``'s one phase: seeded random queries of ``shape`` for ``seconds``
    or ``cases``, of what ``capabilities`` declare (:func:`random_cases`)."""
    drawn = random_cases(seed, max_blocks, kinds, shape, capabilities, redrawn)
    return [Phase("random", drawn, seconds, cases)]


def gate_phases(
    seconds: float | None = DEFAULT_SECONDS,
    seed: int = 0,
    max_blocks: int = 8,
    kinds: Iterable[str] = CHOICES,
    cases: int | None = None,
    shape: str = QueryShape.ANY,
    capabilities: Capabilities = BASE,
    redrawn: Counter[str] | None = None,
) -> list[Phase]:
    """The three phases, each of what ``capabilities`` declare (tiered states too when
    they take tiers); the random one draws queries of ``shape`` for ``seconds`` (and at
    most ``cases`` cases)."""
    drawn = random_cases(seed, max_blocks, kinds, shape, capabilities, redrawn)
    return [
        Phase("exhaustive", exhaustive_cases(capabilities, redrawn)),
        Phase("corpus", corpus_cases(capabilities, redrawn)),
        Phase("random", drawn, seconds, cases),
    ]


def run_phases(checker: CaseChecker, phases: Sequence[Phase]) -> Tally:
    """Run the phases in order on ``checker``; stop early if it stops at a
    disagreement. Its tally."""
    for phase in phases:
        if not checker.run(phase):
            break
    return checker.tally
