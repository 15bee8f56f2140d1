"""The engine: feed cases to a target, judge each reply, shrink and save disagreements.

Cases come from the sources (exhaustive scopes, the solver corpus, random queries,
Hypothesis); the engine knows nothing about where they come from. The first
disagreement of each class is shrunk (keeping its class), saved, then reported to
``on_found``; later ones of the same class are only counted.

    >>> from kvhit.harness.runner import open_target
    >>> from kvhit.harness.random_cases import random_queries
    >>> engine = Engine(open_target("seed-min"), "seed-min")
    >>> engine.run(Phase("random", ((q, None) for q in random_queries(1, 300))))
    True
    >>> [d.cls for d in engine.found], len(engine.found[0].query.groups)
    (['unsafe'], 2)
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvhit.harness.compare import NOT_DISAGREEMENTS, Outcome, json_safe, judge_reply
from kvhit.harness.report import Disagreement, save
from kvhit.harness.runner import Runner
from kvhit.harness.shrink import shrink
from kvhit.model.spec import Answer, Query, longest_hit

Case = tuple[Query, Answer | None]  # the query and, when the source knows it, L*'s answer


@dataclass
class Phase:
    """A named stream of cases, checked until it ends, ``limit`` cases are checked or
    ``seconds`` pass (None: no bound)."""

    name: str
    cases: Iterable[Case]
    seconds: float | None = None
    limit: int | None = None


@dataclass
class Engine:
    """Checks cases against one target and keeps the tally."""

    runner: Runner
    target: str
    out_dir: Path | None = None
    on_found: Callable[[Disagreement, Path | None], None] = lambda d, path: None
    on_case: Callable[[Engine], None] = lambda engine: None
    stop_at_first: bool = False
    shrink_seconds: float = 10.0
    cases: int = 0
    counts: Counter[str] = field(default_factory=Counter)
    by_phase: Counter[str] = field(default_factory=Counter)
    found: list[Disagreement] = field(default_factory=list)
    saved: list[Path] = field(default_factory=list)
    phase: str = ""
    interrupted: bool = False  # set by a caller that stopped the run (Ctrl-C)

    def judge(self, q: Query, best: Answer | None = None) -> tuple[Outcome, Any]:
        """Run the target on ``q`` and classify its reply; also the raw answer."""
        reply = self.runner(q.to_json())
        outcome = judge_reply(q, reply, best if best is not None else longest_hit(q))
        return outcome, reply.value

    def check(self, q: Query, best: Answer | None = None) -> Outcome:
        """Check one case; shrink, save and report it if it is a new class."""
        outcome, answer = self.judge(q, best)
        self.cases += 1
        self.counts[outcome.cls] += 1
        self.by_phase[self.phase] += 1
        if outcome.disagrees and outcome.cls not in {d.cls for d in self.found}:
            self.report(
                Disagreement(self.target, outcome.cls, q, json_safe(answer), outcome.reason)
            )
        return outcome

    def keep(self, d: Disagreement, replacing: Path | None = None) -> Path | None:
        """Save ``d`` (when there is an out dir) in place of the file ``replacing``."""
        if self.out_dir is None:
            return None
        path = save(d, self.out_dir)
        if replacing is not None:
            self.saved.remove(replacing)
            if replacing != path:
                replacing.unlink(missing_ok=True)
        self.saved.append(path)
        return path

    def report(self, seen: Disagreement) -> Disagreement:
        """Save the disagreement as seen, shrink it keeping its class, save the shrunk
        one in its place, then hand it to ``on_found``. What was seen is on disk before
        shrinking starts, so a run that is stopped or killed while shrinking keeps it."""
        first = self.keep(seen)
        cls = seen.cls
        small = shrink(seen.query, lambda c: self.judge(c)[0].cls == cls, self.shrink_seconds)
        outcome, answer = self.judge(small)
        if outcome.cls != cls:  # a target that is not deterministic: keep what was seen
            found = seen
        else:
            found = Disagreement(self.target, cls, small, json_safe(answer), outcome.reason)
        self.found.append(found)
        path = self.keep(found, replacing=first)
        self.on_found(found, path)
        return found

    def run(self, phase: Phase) -> bool:
        """Check a phase's cases; False if it stopped at a disagreement (``stop_at_first``)."""
        self.phase = phase.name
        deadline = None if phase.seconds is None else time.monotonic() + phase.seconds
        for number, (q, best) in enumerate(phase.cases):
            if phase.limit is not None and number >= phase.limit:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            self.check(q, best)
            self.on_case(self)
            if self.stop_at_first and self.found:
                return False
        return True

    @property
    def disagreements(self) -> int:
        """How many cases disagreed (all classes, shrunk or not)."""
        return sum(n for cls, n in self.counts.items() if cls not in NOT_DISAGREEMENTS)
