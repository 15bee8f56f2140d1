"""``kvhit prove``: run the theorem registry and report, and the proof section of
``kvhit verify``.

Theorems are proved in worker processes (``--jobs``, :mod:`kvhit.proofs.workers`).
On a terminal: a progress bar, then one table row per theorem (name, status, what it
rests on, range, seconds, and cvc5's agreement with ``--cross-check``); piped or
redirected: one plain line per theorem as it finishes, and a heartbeat on a long
step. Each refutation is followed by its counterexample, drawn with
:func:`kvhit.draw.draw` and judged with :func:`kvhit.draw.judge`; then what did not
run (without ``--deep``) and a closing count. Exit 0 only if every theorem got its
expected status (and cvc5 never disagreed), 1 otherwise, 2 on bad usage, 130 when
Ctrl-C stopped the run (the theorems finished before it are reported, no others).
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import Sequence
from contextlib import closing
from pathlib import Path

import click
from rich.console import Console
from rich.progress import MofNCompleteColumn
from rich.table import Table
from rich.text import Text

from kvhit.analysis import Analysis
from kvhit.cli.display import progress_bar
from kvhit.draw import draw, judge
from kvhit.errors import BadInput
from kvhit.inputs import writable
from kvhit.proofs.registry import Status, Theorem, all_theorems
from kvhit.proofs.runner import SOLVER_TIMEOUT, Result
from kvhit.proofs.workers import ProofSettings, Started, Still, prove_all

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


def cores() -> int:
    """The cores this process may use: ``--jobs``'s default."""
    return len(os.sched_getaffinity(0))


def chosen(theorems: list[Theorem], only: Sequence[str], deep: bool) -> list[Theorem]:
    """What a run proves: the theorems named in ``only`` (deep or not), else the
    default suite, and the deep cross-checks too when ``deep``."""
    if only:
        return select(theorems, only)
    return [t for t in theorems if deep or not t.deep]


def not_run_note(theorems: list[Theorem], ran: list[Theorem], cross_check: bool) -> str:
    """What a default run leaves to ``--deep``: the deep theorems it skipped, and cvc5's
    second opinion when it was off ("" when nothing was left out)."""
    names = [t.name for t in theorems if t.deep and t not in ran]
    parts = [f"the deep cross-checks {', '.join(names)}"] if names else []
    if not cross_check:
        parts.append("cvc5's second opinion on every goal")
    if not parts:
        return ""
    return f"not run (kvhit prove --deep runs them): {'; '.join(parts)}"


def line(r: Result, cross_check: bool) -> str:
    """A theorem as one plain line: name, status (and the expected one when it
    differs), range, seconds (and cvc5's agreement)."""
    status = str(r.status) if r.status == r.expected else f"{r.status} (expected {r.expected})"
    text = f"{r.name}: {status}; {r.range}; {r.seconds:.1f} s"
    return text + (f"; cvc5 {r.cross_check or '-'}" if cross_check else "")


def run_all(
    theorems: list[Theorem], settings: ProofSettings, jobs: int, lines: Console | None = None
) -> tuple[list[Result], bool]:
    """Prove the theorems in ``jobs`` worker processes, with a progress bar on stderr;
    ``lines`` (output that is not a terminal) gets a line per theorem as it finishes
    and a heartbeat on a long step. The results in registry order, and whether Ctrl-C
    stopped the run (then only the theorems finished before it are returned)."""
    done: dict[str, Result] = {}
    running: list[str] = []
    progress = progress_bar(Console(stderr=True), MofNCompleteColumn(), transient=True)
    interrupted = False
    # A script's background job starts with SIGINT ignored; `timeout -s INT` and
    # Ctrl-C must still stop a proof, so Python's own handler is put back meanwhile.
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with progress, closing(prove_all(theorems, settings, jobs)) as events:
            task = progress.add_task("proving", total=len(theorems))
            for event in events:
                if isinstance(event, Started):
                    running.append(event.name)
                elif isinstance(event, Still):
                    if lines is not None:
                        lines.print(f"still proving {event.name} ({event.seconds:.0f} s)")
                else:
                    done[event.name] = event
                    running.remove(event.name)
                    progress.advance(task)
                    if lines is not None:
                        lines.print(line(event, settings.cross_check), markup=False)
                progress.update(task, description=f"proving {', '.join(running)}")
    except KeyboardInterrupt:
        interrupted = True
    finally:
        signal.signal(signal.SIGINT, previous)
    return [done[t.name] for t in theorems if t.name in done], interrupted


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


def report(
    console: Console,
    results: list[Result],
    cross_check: bool,
    as_lines: bool = False,
    note: str = "",
    total: int = 0,
) -> None:
    """The table (unless ``as_lines``: each theorem's line was printed as it finished),
    each counterexample drawn and judged, what went wrong, what did not run (``note``),
    whether Ctrl-C stopped the run before all ``total`` theorems finished, the count."""
    if not as_lines:
        console.print(results_table(results, cross_check))
    for r in results:
        cx = r.counterexample
        if cx is not None:
            console.print(f"\n[bold]{r.name}[/bold]: {r.status}", highlight=False)
            console.print(draw(cx.query), markup=False, highlight=False)
            console.print(judge(Analysis(cx.query), cx.algorithm, cx.length), markup=False)
            answers = ", ".join(f"{name} {value}" for name, value in cx.answers.items())
            console.print(f"answers: {answers}" + (f" ({cx.note})" if cx.note else ""))
        if not r.ok and r.detail:
            console.print(Text.assemble((r.name, "red"), ": ", r.detail.strip()))
    if note:
        console.print(note, markup=False)
    if total > len(results):
        console.print(
            f"interrupted: {len(results)} of {total} theorems finished; the others were not proved",
            markup=False,
        )
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
@click.option(
    "--deep",
    is_flag=True,
    help="Also the deep cross-checks (the unrolled contracts) and cvc5 on every query.",
)
@click.option("--quick", is_flag=True, help="The smaller quick bounds.")
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=cores,
    show_default="the cores",
    help="Worker processes proving theorems side by side.",
)
def prove(
    only: tuple[str, ...],
    bound: int | None,
    timeout: float,
    as_json: bool,
    emit_dir: Path | None,
    cross_check: bool,
    deep: bool,
    quick: bool,
    jobs: int,
) -> None:
    """Prove the theorems of docs/design.md §3 and refute the known-wrong algorithms."""
    if emit_dir is not None:
        writable(emit_dir, "--emit-smt2")
    everything = registered()
    theorems = chosen(everything, only, deep)
    settings = ProofSettings(bound, quick, timeout, cross_check or deep, emit_dir)
    console = Console(highlight=False, soft_wrap=True)
    as_lines = not as_json and not console.is_terminal
    results, interrupted = run_all(theorems, settings, jobs, console if as_lines else None)
    ok = all(r.ok for r in results) and not interrupted
    if as_json:
        out = {"ok": ok, "interrupted": interrupted, "theorems": [r.to_json() for r in results]}
        click.echo(json.dumps(out))
    else:
        if not console.is_terminal:
            console.width = FILE_WIDTH
        note = "" if only else not_run_note(everything, theorems, settings.cross_check)
        report(console, results, settings.cross_check, as_lines, note, len(theorems))
    raise SystemExit(130 if interrupted else 0 if ok else 1)


def verify_section(console: Console, quick: bool) -> bool:
    """``kvhit verify``'s proof section: the default suite at its default (or quick)
    bounds, in worker processes on every core; True when every theorem got its
    expected status. Ctrl-C reports what finished, then goes on up as KeyboardInterrupt."""
    console.rule("the proof suite")
    try:
        everything = registered()
    except MissingModule as err:
        console.print(f"[red]{err.format_message()}[/red]")
        return False
    theorems = chosen(everything, (), deep=False)
    as_lines = not console.is_terminal
    settings = ProofSettings(quick=quick)
    results, interrupted = run_all(theorems, settings, cores(), console if as_lines else None)
    note = not_run_note(everything, theorems, cross_check=False)
    report(console, results, False, as_lines, note, len(theorems))
    if interrupted:
        raise KeyboardInterrupt
    return all(r.ok for r in results)
