"""What ``kvhit check`` says about one query: the report as data, and drawn.

>>> from kvhit.model.protocol import parse_query
>>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
...                  "cached": ["01", "10"], "max_length": 2})
>>> report = check_report(q)
>>> report["length"], report["per_group"], report["min_of_groups_verdict"]
(0, [2, 1], 'unsafe')
"""

from __future__ import annotations

from typing import Any

from kvhit.draw import draw, explain, judge, verdict
from kvhit.errors import BadInput
from kvhit.model.spec import Query, longest_hit
from kvhit.reference import finder_results, fixed_point_answer


def check_report(q: Query) -> dict[str, Any]:
    """Everything ``kvhit check`` says about one query, as JSON-ready data."""
    best = longest_hit(q)
    per_group = finder_results(q)
    min_length = min(per_group)
    return {
        "query": q.to_json(),
        "length": best.length,
        "blocks": [list(b) for b in best.blocks],
        "fixed_point": fixed_point_answer(q).length,
        "brute_force": best.length,
        "min_of_groups": min_length,
        "min_of_groups_verdict": verdict(min_length, best.length),
        "per_group": per_group,
    }


def check_text(q: Query, report: dict[str, Any]) -> str:
    """The drawn form of a check report."""
    notes = [f"own finder: {hit}" for hit in report["per_group"]]
    lines = [draw(q, report["blocks"], notes)]
    reused = "; ".join(
        f"group {i} blocks {', '.join(map(str, b))}" for i, b in enumerate(report["blocks"]) if b
    )
    lines.append(
        f"L* = {report['length']} (fixed point {report['fixed_point']}, "
        f"brute force {report['brute_force']}): reuses {reused or 'nothing'}"
    )
    lines.append(judge(q, "min of groups", report["min_of_groups"]))
    return "\n".join(lines)


def explain_text(q: Query, length: int, label: str) -> str:
    """``--explain L``: which group needs which missing block at L."""
    if length > q.max_length or length % q.alignment:
        raise BadInput(
            f"{label}: --explain {length} is not a candidate: hits are multiples of "
            f"A={q.alignment} up to M={q.max_length}"
        )
    return explain(q, length)
