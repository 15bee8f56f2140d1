"""The ``kvhit`` command line.

Exit codes everywhere: 0 all good, 1 a disagreement or a failed proof, 2 bad usage
or bad input. Commands that live with their subsystem (``prove``, ``fuzz``, ``gate``,
``replay``) are imported only when run, so ``kvhit check`` does not load z3 or torch.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from kvhit.draw import draw, explain, judge, verdict
from kvhit.model.algorithms import brute_force, fixed_point, min_of_groups, per_group
from kvhit.model.protocol import QueryError, load_queries, parse_query
from kvhit.model.spec import Query, answer_at

LAZY_COMMANDS = {
    "prove": "kvhit.proofs.command:prove",
    "fuzz": "kvhit.harness.command:fuzz",
    "gate": "kvhit.harness.command:gate",
    "replay": "kvhit.harness.command:replay",
    "matrix": "kvhit.harness.matrix:matrix",
}


class BadInput(click.ClickException):
    """Bad input: one line naming the problem, exit code 2."""

    exit_code = 2

    def show(self, file: Any = None) -> None:
        click.echo(f"error: {self.format_message()}", err=True)


class KvhitGroup(click.Group):
    """A group that imports a subsystem's command only when it is run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            module, _, attr = LAZY_COMMANDS[name].partition(":")
            return getattr(importlib.import_module(module), attr)
        return super().get_command(ctx, name)


@click.group(cls=KvhitGroup)
@click.version_option(package_name="kvhit")
def main() -> None:
    """kvhit: the verified reference for hybrid-attention prefix-cache hits."""


def read_queries(path: str) -> list[tuple[str, Query]]:
    """Load and check every query in a file (``-`` for stdin); BadInput on any problem."""
    try:
        text = sys.stdin.read() if path == "-" else open(path, encoding="utf-8").read()
    except OSError as err:
        raise BadInput(f"{path}: {err.strerror}") from None
    where = "stdin" if path == "-" else path
    try:
        objects = load_queries(text)
    except QueryError as err:
        raise BadInput(f"{where}: {err}") from None
    out = []
    for number, obj in enumerate(objects, 1):
        label = where if len(objects) == 1 else f"{where} query {number}"
        try:
            out.append((label, parse_query(obj)))
        except QueryError as err:
            raise BadInput(f"{label}: {err}") from None
    return out


def check_report(q: Query) -> dict[str, Any]:
    """Everything ``kvhit check`` says about one query, as JSON-ready data."""
    best = answer_at(q, brute_force(q))
    min_length = min_of_groups(q)
    return {
        "query": q.to_json(),
        "length": best.length,
        "blocks": [list(b) for b in best.blocks],
        "fixed_point": fixed_point(q),
        "brute_force": best.length,
        "min_of_groups": min_length,
        "min_of_groups_verdict": verdict(min_length, best.length),
        "per_group": per_group(q),
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


@main.command()
@click.argument("file", type=click.Path(allow_dash=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per query.")
@click.option("--explain", "explain_at", type=click.IntRange(min=0), help="Say why L is (in)valid.")
def check(file: str, as_json: bool, explain_at: int | None) -> None:
    """Draw each query in FILE (one JSON object or JSON lines; - for stdin) and its answer.

    Shows each group's blocks (# cached, . not, @ reused at L*), each group's own
    finder result, L*, and what min-of-groups would answer.
    """
    queries = read_queries(file)
    for number, (label, q) in enumerate(queries):
        report = check_report(q)
        if explain_at is not None:
            report["explain"] = explain_text(q, explain_at, label)
        if as_json:
            click.echo(json.dumps(report))
            continue
        if number:
            click.echo()
        if len(queries) > 1:
            click.echo(f"# {label}")
        click.echo(check_text(q, report))
        if explain_at is not None:
            click.echo(report["explain"])


VERIFY_SECTIONS = [
    ("seed facts", "kvhit.verify:examples_section"),
    ("proofs", "kvhit.proofs.command:verify_section"),
    ("gate", "kvhit.harness.command:verify_section"),
]


@main.command()
@click.option("--quick", is_flag=True, help="Smaller proof bounds and fuzz budgets.")
def verify(quick: bool) -> None:
    """The main job: the seed facts, the proof suite, the gate on impl, seed-min caught."""
    from kvhit.verify import run_sections

    sys.exit(0 if run_sections(VERIFY_SECTIONS, quick) else 1)


if __name__ == "__main__":
    main()
