"""``kvhit verify``: the main job, as a list of sections.

A section is a function ``(console, quick) -> bool`` that prints its own part of the
report and says whether everything in it held. The first section reproduces the three
facts of docs/design.md §1.5 ("the seed example, made exact") from the files in
examples/, the second the facts §1.7 states of the tier examples.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

from rich.console import Console

from kvhit.analysis import Analysis
from kvhit.cli.check import check_report, check_text
from kvhit.importing import import_attr
from kvhit.model.protocol import parse_query

# The facts docs/design.md §1.5 states about each example: what min-of-groups says, and L*.
SEED_FACTS = {
    "seed_reviewer_as_written.json": (
        "as the reviewer wrote it, windows 2 and 3: not a counterexample",
        {"per_group": [5, 4], "min_of_groups": 4, "length": 4},
    ),
    "seed_reviewer_exact.json": (
        "with windows 3 and 4 the reviewer's example is exact: min says 4, L* is 0",
        {"per_group": [5, 4], "min_of_groups": 4, "length": 0},
    ),
    "seed_minimal.json": (
        "the smallest counterexample to min: per-group hits 2 and 1, min 1, L* 0",
        {"per_group": [2, 1], "min_of_groups": 1, "length": 0},
    ),
}


# The facts docs/design.md §1.7 states about each tier example: L*, and what the
# known-wrong combinations answer.
TIER_FACTS = {
    "tiers_max_of_groups.json": (
        "full attention's tail evicted, a deeper Mamba state kept: max of groups says 8, L* is 0",
        {"length": 0, "wrong_combinations": {"max of groups": 8}},
    ),
    "tiers_restored.json": (
        "the same pool, full attention's blocks held by a connector: L* is 8",
        {
            "length": 8,
            "loads": [
                [0, 0, "local"],
                [0, 1, "lmcache"],
                [0, 2, "lmcache"],
                [0, 3, "lmcache"],
                [1, 3, "local"],
            ],
        },
    ),
    "tiers_local_then_external.json": (
        "the local hit extended by the tier without re-checking Mamba says 4, L* is 2",
        {"length": 2, "wrong_combinations": {"local then external": 4}},
    ),
}


def facts_section(
    console: Console, title: str, facts: dict[str, tuple[str, dict[str, Any]]]
) -> bool:
    """Check each example file reproduces the facts the design states of it (each
    expected key of its report, nested dicts compared key by key)."""
    console.rule(title)
    ok = True
    for name, (fact, expected) in facts.items():
        text = resources.files("kvhit.examples").joinpath(name).read_text(encoding="utf-8")
        analysis = Analysis(parse_query(json.loads(text)))
        report = check_report(analysis)
        got = {key: picked(report[key], expected[key]) for key in expected}
        held = got == expected and report["fixed_point"] == report["length"]
        ok &= held
        console.print(f"[bold]{name}[/bold]: {fact}", highlight=False)
        console.print(check_text(analysis, report), highlight=False, markup=False)
        console.print("[green]holds[/green]" if held else f"[red]does not hold[/red]: {got}")
    return ok


def picked(value: Any, expected: Any) -> Any:
    """``value`` narrowed to the keys ``expected`` names, when both are dicts."""
    if isinstance(value, dict) and isinstance(expected, dict):
        return {key: value.get(key) for key in expected}
    return value


def examples_section(console: Console, quick: bool) -> bool:
    """Check each seed example reproduces the fact docs/design.md §1.5 states."""
    return facts_section(console, "the seed example, made exact", SEED_FACTS)


def tiers_section(console: Console, quick: bool) -> bool:
    """Check each tier example reproduces the fact docs/design.md §1.7 states."""
    return facts_section(console, "tiers: hits restored from outside the pool", TIER_FACTS)


def run_sections(sections: list[tuple[str, str]], quick: bool) -> bool:
    """Run every ``(name, module:function)`` section in order, even after a failure,
    then print the summary. Ctrl-C prints the summary of the sections that finished,
    then goes on up (``kvhit`` exits 130)."""
    console = Console(highlight=False, soft_wrap=True)
    results = []
    try:
        for name, spec in sections:
            results.append((name, import_attr(spec)(console, quick)))
    except KeyboardInterrupt:
        summary(console, results, len(sections))
        raise
    return summary(console, results, len(sections))


def summary(console: Console, results: list[tuple[str, bool]], total: int) -> bool:
    """Each section's verdict and the count; ``interrupted`` when Ctrl-C stopped the
    run before all ``total`` sections ran. True when all ran and held."""
    console.rule("summary")
    for name, held in results:
        console.print(f"{name:12} {'[green]ok[/green]' if held else '[red]FAILED[/red]'}")
    passed = sum(held for _, held in results)
    console.print(f"{passed} of {len(results)} sections ok")
    if len(results) < total:
        console.print(f"interrupted: {total - len(results)} of {total} sections did not finish")
    return passed == total
