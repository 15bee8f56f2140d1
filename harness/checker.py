"""The case checker: feed stateless cases to a target, judge each reply, shrink and
save disagreements.

Cases come from the sources (exhaustive scopes, the solver corpus, random queries,
Hypothesis); the checker knows nothing about where they come from. The first
disagreement of each class is shrunk (keeping its class), saved, then reported to
``on_found``; later ones of the same class are only counted.

    >>> from kvhit.targets.target_spec import TargetSpec
    >>> from kvhit.harness.random_cases import random_queries
    >>> from kvhit.targets.target_record import TargetRecord
    >>> checker = CaseChecker(TargetSpec("seed-min").open(), TargetRecord("seed-min"))
    >>> checker.run(Phase("random", ((q, None) for q in random_queries(1, 300))))
    True
    >>> found = checker.tally.found
    >>> [str(d.cls) for d in found], len(found[0].query.groups)
    (['unsafe'], 2)
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from itertools import islice
from pathlib import Path
from typing import Any

from kvhit.analysis import Analysis, Verdict
from kvhit.harness.compare import Outcome, judge_reply
from kvhit.harness.report import Disagreement
from kvhit.harness.shrink import SHRINK_SECONDS, shrink
from kvhit.harness.tally import Tally
from kvhit.model.spec import Answer, Query
from kvhit.targets.runner import Runner, alarm_handler, on_main_thread
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.wire import json_safe


@contextmanager
def interrupts_deferred() -> Iterator[None]:
    """Ctrl-C (SIGINT) held back until the block ends, on the main thread: a swap of
    saved files is never cut in half, leaving a file no report names. The block's own
    handler notes the signal and the one before it runs at the end; a signal already
    pending when the block starts reaches that handler too (blocking the signal at the
    OS would not hold back one Python has already noted)."""
    if not on_main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        if callable(previous):
            previous(signal.SIGINT, None)
        else:
            raise KeyboardInterrupt


Case = tuple[Query, Answer | None]  # the query and, when the source knows it, L*'s answer


@dataclass
class Phase:
    """A named stream of cases, checked until it ends, the cases numbered ``limit`` and
    on are reached, or ``seconds`` pass (None: no bound).

    ``start`` and ``step`` pick one job's share of the stream (:mod:`kvhit.harness.jobs`):
    the cases numbered ``start``, ``start + step``, … Cases keep their numbers in the
    whole stream, so ``limit`` bounds all jobs together.
    """

    name: str
    cases: Iterable[Case]
    seconds: float | None = None
    limit: int | None = None
    start: int = 0
    step: int = 1

    def share(self, job: int, jobs: int) -> Phase:
        """Job ``job``'s share of this phase when ``jobs`` jobs split it."""
        return replace(self, start=job, step=jobs)


@dataclass
class CaseChecker:
    """Checks cases against one target and keeps the :class:`Tally`."""

    runner: Runner
    target: TargetRecord
    out_dir: Path | None = None
    on_found: Callable[[Disagreement, Path | None], None] = lambda d, path: None
    on_case: Callable[[Tally], None] = lambda tally: None
    on_saved: Callable[[Tally], None] = lambda tally: None
    """Told each time a disagreement is put in the tally and saved (as seen, then shrunk)."""
    proceed: Callable[[tuple[int, int]], bool] = lambda position: True
    """Asked before each case with its :attr:`position`; False stops the run."""
    stop_at_first: bool = False
    shrink_seconds: float = SHRINK_SECONDS
    tally: Tally = field(init=False)
    phase: str = field(init=False, default="")
    phases_run: int = field(init=False, default=0)
    position: tuple[int, int] = field(init=False, default=(0, 0))
    """The case being checked: (its phase's place in the run, its number in the phase)."""

    def __post_init__(self) -> None:
        self.tally = Tally(self.target.label)

    def judge(self, a: Analysis) -> tuple[Outcome, Any]:
        """Run the target on the analysed query and classify its reply; also the raw
        answer. L* is worked out (when the analysis does not hold it yet) only for a
        reply that holds an answer."""
        reply = self.runner.ask(a.query)
        return judge_reply(a, reply), reply.value

    def check(self, q: Query, best: Answer | None = None) -> Outcome:
        """Check one case (``best``: L*'s answer, when its source knows it); shrink,
        save and report it if it is a new class."""
        a = Analysis.knowing(q, best)
        outcome, answer = self.judge(a)
        tally = self.tally
        tally.cases += 1
        tally.counts[outcome.cls] += 1
        tally.by_phase[self.phase] += 1
        if outcome.cls == Verdict.UNSUPPORTED:
            tally.refused[outcome.reason] += 1
        if outcome.disagrees and tally.found_new(outcome.cls):
            tally.found_at.append(self.position)
            self.report(
                Disagreement(self.target, outcome.cls, a, json_safe(answer), outcome.reason)
            )
        return outcome

    def keep(self, d: Disagreement) -> Path | None:
        """Save ``d`` into the out dir (when there is one); the path (None if not saved)."""
        return self.tally.keep(d, self.out_dir)

    def report(self, seen: Disagreement) -> Disagreement:
        """Save the disagreement as seen, shrink it keeping its class, save the shrunk
        one in its place, then hand it to ``on_found``. What was seen is on disk (and
        in the tally) before shrinking starts, so a run stopped while shrinking keeps it."""
        tally = self.tally
        with interrupts_deferred():
            tally.found.append(seen)
            tally.saved.append(first := self.keep(seen))
            self.on_saved(tally)
        cls = seen.cls
        small = shrink(seen.analysis, lambda c: self.judge(c)[0].cls == cls, self.shrink_seconds)
        outcome, answer = self.judge(small)
        found = seen  # kept when the target is not deterministic
        if outcome.cls == cls:
            found = Disagreement(self.target, cls, small, json_safe(answer), outcome.reason)
        with interrupts_deferred():  # the files on disk and the tally change together
            path = self.keep(found)
            tally.found[-1], tally.saved[-1] = found, path
            if first is not None and first != path:
                first.unlink(missing_ok=True)
            self.on_saved(tally)
        self.on_found(found, path)
        return found

    def run(self, phase: Phase) -> bool:
        """Check a phase's cases; False if it stopped at a disagreement (``stop_at_first``)."""
        self.phase = phase.name
        self.phases_run += 1
        with alarm_handler():
            return self.run_cases(phase)

    def run_cases(self, phase: Phase) -> bool:
        """:meth:`run`'s loop over the phase's cases."""
        deadline = None if phase.seconds is None else time.monotonic() + phase.seconds
        numbered = islice(enumerate(phase.cases), phase.start, None, phase.step)
        for number, (q, best) in numbered:
            if phase.limit is not None and number >= phase.limit:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            self.position = (self.phases_run - 1, number)
            if not self.proceed(self.position):
                return False
            self.check(q, best)
            self.on_case(self.tally)
            if self.stop_at_first and self.tally.found:
                return False
        return True
