"""What ``kvhit check`` says about one query: the report as data, and drawn. Both are
made from one :class:`~kvhit.analysis.Analysis` of the query.

>>> from kvhit.model.protocol import parse_query
>>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
...                  "cached": ["01", "10"], "max_length": 2})
>>> report = check_report(Analysis(q))
>>> report["length"], report["per_group"], report["min_of_groups_verdict"]
(0, [2, 1], <Verdict.UNSAFE: 'unsafe'>)
"""

from __future__ import annotations

from typing import Any

from kvhit.analysis import Analysis
from kvhit.draw import draw, explain, judge
from kvhit.errors import BadInput
from kvhit.model.spec import Kind


def check_report(a: Analysis) -> dict[str, Any]:
    """Everything ``kvhit check`` says about the analysed query, as JSON-ready data."""
    best = a.longest_hit
    min_length = a.min_of_groups.length
    return {
        "query": a.query.to_json(),
        "length": best.length,
        "blocks": [list(b) for b in best.blocks],
        "fixed_point": a.fixed_point.length,
        "brute_force": best.length,
        "min_of_groups": min_length,
        "min_of_groups_verdict": a.verdict(min_length),
        "per_group": list(a.finder_results),
        **(tier_report(a) if a.query.tiers else {}),
        **({"wrong_combinations": a.wrong_tier_answers} if diverging(a) else {}),
    }


def diverging(a: Analysis) -> bool:
    """Whether per-group hits can diverge the way the known-wrong tier combinations
    (docs/design.md §1.7) mishandle: the query has tiers or a Mamba group."""
    q = a.query
    return bool(q.tiers) or any(g.kind == Kind.MAMBA for g in q.groups)


def tier_report(a: Analysis) -> dict[str, Any]:
    """A tiered query's part of the report: where each block reused at L* is loaded
    from, and the tokens computed."""
    work = a.hit_plan
    return {
        "loads": [[x.group, x.block, x.source] for x in work.loads],
        "recompute": [work.recompute.start, work.recompute.stop],
    }


def check_text(a: Analysis, report: dict[str, Any]) -> str:
    """The drawn form of a check report."""
    q = a.query
    notes = [f"own finder: {hit}" for hit in report["per_group"]]
    lines = [draw(q, a.longest_hit, notes)]
    reused = "; ".join(
        f"group {i} blocks {', '.join(map(str, b))}" for i, b in enumerate(report["blocks"]) if b
    )
    lines.append(
        f"L* = {report['length']} (fixed point {report['fixed_point']}, "
        f"brute force {report['brute_force']}): reuses {reused or 'nothing'}"
    )
    if q.tiers:
        lines.append(
            f"loads {loads_text(report['loads'])}; computes tokens {report['recompute'][0]} … {report['recompute'][1] - 1}"
        )
    lines.append(judge(a, "min of groups", report["min_of_groups"]))
    for name, length in report.get("wrong_combinations", {}).items():
        lines.append(judge(a, name, length))
    return "\n".join(lines)


def loads_text(loads: list[list[Any]]) -> str:
    """Where the reused blocks come from, group by group.

    >>> loads_text([[0, 0, "local"], [0, 1, "cpu"], [0, 2, "cpu"], [1, 2, "local"]])
    'group 0: block 0 from local, blocks 1, 2 from cpu; group 1: block 2 from local'
    """
    parts: list[str] = []
    for g in sorted({x[0] for x in loads}):
        runs: list[tuple[str, list[int]]] = []
        for _, block, source in (x for x in loads if x[0] == g):
            if runs and runs[-1][0] == source:
                runs[-1][1].append(block)
            else:
                runs.append((source, [block]))
        said = ", ".join(
            f"block{'s' if len(b) > 1 else ''} {', '.join(map(str, b))} from {src}"
            for src, b in runs
        )
        parts.append(f"group {g}: {said}")
    return "; ".join(parts) or "nothing"


def explain_text(a: Analysis, length: int, label: str) -> str:
    """``--explain L``: which group needs which missing block at L."""
    q = a.query
    if length > q.max_length or length % q.alignment:
        raise BadInput(
            f"{label}: --explain {length} is not a candidate: hits are multiples of "
            f"A={q.alignment} up to M={q.max_length}"
        )
    return explain(a, length)
