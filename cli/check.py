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
from kvhit.model.spec import Kind, Query, longest_hit
from kvhit.model.tiers import hit_plan
from kvhit.reference import finder_results, fixed_point_answer, wrong_tier_answers


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
        **(tier_report(q, best.length) if q.tiers else {}),
        **(wrong_combinations(q) if diverging(q) else {}),
    }


def diverging(q: Query) -> bool:
    """Whether per-group hits can diverge the way the known-wrong tier combinations
    mishandle: the query has tiers or a Mamba group."""
    return bool(q.tiers) or any(g.kind == Kind.MAMBA for g in q.groups)


def tier_report(q: Query, length: int) -> dict[str, Any]:
    """A tiered query's part of the report: where each reused block is loaded from,
    and the tokens computed."""
    work = hit_plan(q, length)
    return {
        "loads": [[x.group, x.block, x.source] for x in work.loads],
        "recompute": [work.recompute.start, work.recompute.stop],
    }


def wrong_combinations(q: Query) -> dict[str, Any]:
    """What each known-wrong combination of per-group hits answers (docs/design.md §1.7)."""
    return {"wrong_combinations": wrong_tier_answers(q)}


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
    if q.tiers:
        lines.append(
            f"loads {loads_text(report['loads'])}; computes tokens {report['recompute'][0]} … {report['recompute'][1] - 1}"
        )
    lines.append(judge(q, "min of groups", report["min_of_groups"]))
    for name, length in report.get("wrong_combinations", {}).items():
        lines.append(judge(q, name, length))
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


def explain_text(q: Query, length: int, label: str) -> str:
    """``--explain L``: which group needs which missing block at L."""
    if length > q.max_length or length % q.alignment:
        raise BadInput(
            f"{label}: --explain {length} is not a candidate: hits are multiples of "
            f"A={q.alignment} up to M={q.max_length}"
        )
    return explain(q, length)
