"""Disagreements: the drawing, the JSON and JUnit reports; each saves as the file
:meth:`Disagreement.saved` makes (:mod:`kvhit.harness.saved` writes and reads them).

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
    ...                  "cached": ["01", "10"], "max_length": 2})
    >>> d = Disagreement(TargetRecord("seed-min"), Verdict.UNSAFE, Analysis(q),
    ...                  {"length": 1, "blocks": [[0], [0]]}, "group 0 needs block 0 at L=1, not cached")
    >>> print(d.render())
    query: M=2 A=1
    group 0  sliding_window w=2 b=1   . #
    group 1  sliding_window w=2 b=1   @ .
    target answered 1 (unsafe): group 0 needs block 0 at L=1, not cached
    reference answer L* = 0
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol
from xml.etree import ElementTree

from kvhit.analysis import Analysis, Verdict
from kvhit.draw import draw, judge
from kvhit.harness.saved import CaseFile, SavedFile
from kvhit.model.spec import Answer, Query
from kvhit.targets.target_record import TargetRecord


class Record(Protocol):
    """What is saved and put in JUnit: a :class:`Disagreement`, or a stateful one
    (:class:`kvhit.harness.stateful.ProgramDisagreement`)."""

    @property
    def cls(self) -> Verdict: ...
    @property
    def reason(self) -> str: ...
    def saved(self) -> SavedFile: ...
    def render(self) -> str: ...


@dataclass(frozen=True)
class Disagreement:
    """A (shrunk) query, analysed, on which the target disagrees with the reference."""

    target: TargetRecord
    cls: Verdict
    analysis: Analysis
    target_answer: Any
    reason: str

    @property
    def query(self) -> Query:
        """The query the target disagrees on."""
        return self.analysis.query

    def reference(self) -> dict[str, Any]:
        """The reference answer: L* and the blocks each group reuses there."""
        return self.analysis.longest_hit.to_json()

    def saved(self) -> CaseFile:
        """The replayable file (its JSON is also an entry of ``gate --json``)."""
        return CaseFile(self.query, self.target, self.cls, self.target_answer, self.reason)

    def render(self) -> str:
        """The query drawn (``@`` marks the blocks the target says it reuses), what
        the target answered and why that is wrong, and L*."""
        answer = self.target_answer
        said: Any = answer.get("length") if isinstance(answer, dict) else answer
        # Blocks are only drawn when they passed the protocol's checks.
        blocks = answer.get("blocks") if isinstance(answer, dict) else None
        shown = None
        if blocks is not None and self.cls != Verdict.BAD_RETURN:
            shown = Answer(said, tuple(map(tuple, blocks)))
        if self.cls in (Verdict.UNSAFE, Verdict.LOST_REUSE):
            line = judge(self.analysis, "target", said)
        elif self.cls == Verdict.WRONG_BLOCKS:
            line = f"target answered {said} ({self.cls.label}): {self.reason}"
        elif self.cls == Verdict.BAD_RETURN:
            line = f"target returned {json.dumps(answer)[:80]} ({self.cls.label}): {self.reason}"
        else:
            line = f"target {self.cls}: {self.reason}"
        best = self.analysis.longest_hit.length
        return "\n".join([draw(self.query, shown), line, f"reference answer L* = {best}"])


def junit_xml(target: str, checked: str, seconds: float, found: Sequence[Record]) -> str:
    """A JUnit report: one test case per disagreement, or one passing case named for
    what was ``checked`` (``120 cases``)."""
    suite = ElementTree.Element(
        "testsuite",
        name=f"kvhit gate {target}",
        tests=str(max(1, len(found))),
        failures=str(len(found)),
        time=f"{seconds:.3f}",
    )
    if not found:
        case = ElementTree.SubElement(suite, "testcase", name=checked, classname="kvhit")
        case.set("time", f"{seconds:.3f}")
    for d in found:
        case = ElementTree.SubElement(
            suite, "testcase", name=d.saved().file_name(), classname="kvhit"
        )
        failure = ElementTree.SubElement(case, "failure", message=f"{d.cls}: {d.reason}")
        failure.text = d.render()
    return ElementTree.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
