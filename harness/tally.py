"""What a campaign checked and found, for both case sources: stateless cases and
stateful programs. The command line's progress, summary, JSON report and exit code
are all made from a :class:`Tally`.

    >>> tally = Tally("impl", cases=3, operations=12)
    >>> tally.counts.update({"ok": 10, "rejected": 1, "unsafe": 1})
    >>> tally.disagreements, tally.checked()
    (1, '3 programs, 12 operations')
    >>> Tally("model", cases=5).checked()
    '5 cases'
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from kvhit.analysis import Verdict
from kvhit.harness.report import Record
from kvhit.harness.saved import save

Finding = tuple[tuple[int, int], Record, Path | None]
"""Where a disagreement was first seen (see :class:`Tally`), the record, its file."""


@dataclass
class Tally:
    """The counts and findings of a run.

    ``cases`` counts the cases checked, or the programs run (``operations`` then counts
    their operations; it is None for stateless cases). ``counts`` is by reply class
    (one per case, or per lookup of a program), ``by_phase`` the cases of each phase.
    ``found[i]`` was first seen at ``found_at[i]`` (the phase's place in the run, the
    case's number in it) and saved to ``saved[i]`` (None when the run keeps no files).
    ``refused`` counts the ``unsupported`` replies by the reason the target gave;
    ``withheld`` the drawn cases the target's declared rules refuse, by reason: drawn
    again (random queries, programs) or skipped (exhaustive and corpus states), never
    asked.
    """

    target: str
    cases: int = 0
    operations: int | None = None
    counts: Counter[str] = field(default_factory=Counter)
    by_phase: Counter[str] = field(default_factory=Counter)
    refused: Counter[str] = field(default_factory=Counter)
    withheld: Counter[str] = field(default_factory=Counter)
    found: list[Record] = field(default_factory=list)
    found_at: list[tuple[int, int]] = field(default_factory=list)
    saved: list[Path | None] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C stopped the run before its end
    save_error: str | None = None  # why a replay file could not be written
    load_seconds: float | None = None  # loading the target (the slowest job's), if known

    def keep(self, d: Record, out_dir: Path | None) -> Path | None:
        """Save ``d`` into ``out_dir`` (None: nowhere), atomically, before it is
        reported; the path written, or None when it cannot be written: ``save_error`` then says why, and the run goes on (what
        was found is still reported and drawn)."""
        if out_dir is None:
            return None
        try:
            return save(d.saved(), out_dir)
        except OSError as err:
            self.save_error = f"{err.filename or out_dir}: {err.strerror or err}"
            return None

    @property
    def disagreements(self) -> int:
        """How many cases (or lookups) disagreed, all classes, before any shrinking."""
        return sum(n for cls, n in self.counts.items() if Verdict(cls).disagrees)

    @property
    def files(self) -> list[Path]:
        """The replay files written."""
        return [path for path in self.saved if path is not None]

    def findings(self) -> tuple[Finding, ...]:
        """Each disagreement kept so far, with where it was first seen and its file."""
        return tuple(zip(self.found_at, self.found, self.saved))

    def found_new(self, cls: str) -> bool:
        """Whether no disagreement of class ``cls`` has been found yet."""
        return all(d.cls != cls for d in self.found)

    def checked(self) -> str:
        """What was checked, for people: ``120 cases`` or ``3 programs, 40 operations``."""
        if self.operations is None:
            return f"{self.cases} cases"
        return f"{self.cases} programs, {self.operations} operations"


OnProgress = Callable[[Tally], None]
"""Told a run's counts so far, whenever they change."""
