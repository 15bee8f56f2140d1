"""``kvhit prove``: run the theorem registry and report, and the proof section of
``kvhit verify``.

One table row per theorem (name, status, bound, seconds, and cvc5's agreement with
``--cross-check``); each refutation is followed by its counterexample, drawn with
:func:`kvhit.draw.draw` and judged with :func:`kvhit.draw.judge`; then a closing count.
Exit 0 only if every theorem got its expected status (and cvc5 never disagreed),
1 otherwise, 2 on bad usage.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import click
from rich.console import Console
from rich.progress import MofNCompleteColumn
from rich.table import Table

from kvhit.cli.display import progress_bar
from kvhit.draw import draw, judge
from kvhit.errors import BadInput
from kvhit.inputs import writable
from kvhit.proofs.registry import Status, Theorem, all_theorems
from kvhit.proofs.runner import SOLVER_TIMEOUT, Result, run_theorem

STATUS_STYLE = {Status.PROVED: "green", Status.REFUTED: "yellow"}
"""Colours of the statuses that can be expected; every other status is red."""

FILE_WIDTH = 200
"""Columns of the report when it goes to a file or a pipe (a CI log), not a terminal:
wide enough that each row's "rests on" and "range" stay on one or two lines."""


class MissingModule(click.ClickException):
    """A module listed in THEOREM_MODULES cannot be imported: a bug, exit 1."""

    exit_code = 1


def registered() -> list[Theorem]:
    """Every registered theorem (a module in THEOREM_MODULES that is missing is a bug)."""
    try:
        return all_theorems()
    except ModuleNotFoundError as err:
        raise MissingModule(f"theorem module {err.name} is listed but missing") from None


def select(theorems: list[Theorem], only: Sequence[str]) -> list[Theorem]:
    """The theorems named in ``only`` (repeated and/or comma-separated), in registry order;
    all of them when ``only`` is empty. An unknown name is bad usage."""
    names = {name.strip() for item in only for name in item.split(",") if name.strip()}
    known = [t.name for t in theorems]
    unknown = sorted(names - set(known))
    if unknown:
        raise BadInput(f"--only: no theorem {', '.join(unknown)}; known: {', '.join(known)}")
    return [t for t in theorems if not names or t.name in names]


def run_all(
    theorems: list[Theorem],
    bound: int | None = None,
    quick: bool = False,
    timeout: float = SOLVER_TIMEOUT,
    cross_check: bool = False,
    emit_dir: Path | None = None,
) -> list[Result]:
    """Run each theorem in turn, with a progress bar on stderr."""
    progress = progress_bar(Console(stderr=True), MofNCompleteColumn(), transient=True)
    results = []
    with progress:
        task = progress.add_task("proving", total=len(theorems))
        for theorem in theorems:
            progress.update(task, description=f"proving {theorem.name}")
            results.append(
                run_theorem(
                    theorem,
                    bound=bound,
                    quick=quick,
                    timeout=timeout,
                    cross_check=cross_check,
                    emit_dir=emit_dir,
                )
            )
            progress.advance(task)
    return results


def results_table(results: list[Result], cross_check: bool) -> Table:
    """One row per theorem: name, status (and expected, when it differs), what it
    rests on, over what range, seconds (and cvc5's agreement)."""
    table = Table(title="kvhit prove")
    for column in ("theorem", "status", "rests on", "range", "seconds"):
        table.add_column(
            column,
            justify="right" if column == "seconds" else "left",
            no_wrap=column in ("theorem", "status", "seconds"),
        )
    if cross_check:
        table.add_column("cvc5", no_wrap=True)
    for r in results:
        status = f"[{STATUS_STYLE.get(r.status, 'red')}]{r.status}[/]"
        if r.status != r.expected:
            status += f" [red](expected {r.expected})[/]"
        row = [r.name, status, r.rests_on, r.range, f"{r.seconds:.2f}"]
        if cross_check:
            row.append(r.cross_check or "-")
        table.add_row(*row)
    return table


def closing_count(results: list[Result]) -> str:
    """``5 proved, 3 refuted as expected, 0 failed, 0 unknown``; vacuous theorems and
    timeouts are counted among the failed and named when there are any."""
    proved = sum(r.ok and r.status == Status.PROVED for r in results)
    refuted = sum(r.ok and r.status == Status.REFUTED for r in results)
    unknown = sum(r.status == Status.UNKNOWN for r in results)
    failed = sum(not r.ok for r in results) - unknown
    text = f"{proved} proved, {refuted} refuted as expected, {failed} failed, {unknown} unknown"
    for status in (Status.VACUOUS, Status.TIMEOUT):
        count = sum(r.status == status for r in results)
        if count:
            text += f" ({count} {status})"
    return text


def report(console: Console, results: list[Result], cross_check: bool) -> None:
    """The table, each counterexample drawn and judged, what went wrong, the count."""
    console.print(results_table(results, cross_check))
    for r in results:
        cx = r.counterexample
        if cx is not None:
            console.print(f"\n[bold]{r.name}[/bold]: {r.status}", highlight=False)
            console.print(draw(cx.query), markup=False, highlight=False)
            console.print(judge(cx.query, cx.algorithm, cx.length), markup=False)
            answers = ", ".join(f"{name} {value}" for name, value in cx.answers.items())
            console.print(f"answers: {answers}" + (f" ({cx.note})" if cx.note else ""))
        if not r.ok and r.detail:
            console.print(f"[red]{r.name}[/red]: {r.detail.strip()}", markup=True)
    console.print(closing_count(results))


@click.command()
@click.option("--only", "only", multiple=True, metavar="NAME", help="Run only these theorems.")
@click.option("--bound", type=click.IntRange(min=1), help="Bound for every bounded theorem.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    default=SOLVER_TIMEOUT,
    show_default=True,
    help="Seconds per solver query.",
)
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object.")
@click.option(
    "--emit-smt2",
    "emit_dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write every query as an SMT-LIB2 file in DIR.",
)
@click.option("--cross-check", is_flag=True, help="Re-check every unsat query with cvc5.")
@click.option("--quick", is_flag=True, help="The smaller quick bounds.")
def prove(
    only: tuple[str, ...],
    bound: int | None,
    timeout: float,
    as_json: bool,
    emit_dir: Path | None,
    cross_check: bool,
    quick: bool,
) -> None:
    """Prove the theorems of docs/design.md §3 and refute the known-wrong algorithms."""
    if emit_dir is not None:
        writable(emit_dir, "--emit-smt2")
    theorems = select(registered(), only)
    results = run_all(theorems, bound, quick, timeout, cross_check, emit_dir)
    ok = all(r.ok for r in results)
    if as_json:
        click.echo(json.dumps({"ok": ok, "theorems": [r.to_json() for r in results]}))
    else:
        width = None if sys.stdout.isatty() else FILE_WIDTH
        report(Console(highlight=False, soft_wrap=True, width=width), results, cross_check)
    raise SystemExit(0 if ok else 1)


def verify_section(console: Console, quick: bool) -> bool:
    """``kvhit verify``'s proof section: every theorem at its default (or quick) bound,
    cross-checked by cvc5; True when all got their expected status."""
    console.rule("the proof suite")
    try:
        theorems = registered()
    except MissingModule as err:
        console.print(f"[red]{err.format_message()}[/red]")
        return False
    results = run_all(theorems, quick=quick, cross_check=True)
    report(console, results, cross_check=True)
    return all(r.ok for r in results)
