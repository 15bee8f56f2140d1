"""``kvhit gate --stateful`` and ``kvhit fuzz --stateful``, and replaying saved programs.

The commands' other options keep their meaning: ``--cases`` bounds the programs,
``--seconds`` the time, ``--seed`` fixes the programs, ``--out`` receives the replay
files, ``--json`` and ``--junit`` give the same reports (counts per class are counted
per lookup: one ``admit``, or one engine that could not be created). A stateful
campaign runs in one process: ``--jobs`` is ignored, ``--ray``, ``--isolate`` and
``--every-state`` are refused.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvhit.errors import BadInput, TargetError
from kvhit.harness.report import junit_xml
from kvhit.harness.stateful import ProgramDisagreement, disagreement_of, run_program
from kvhit.harness.stateful_machine import Campaign
from kvhit.model.protocol import QueryError
from kvhit.targets.runner import DEFAULT_TIMEOUT, Runner, label_of
from kvhit.targets.stateful import load_program_file, open_stateful

DEFAULT_STEPS = 20


def stateful_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--stateful`` and ``--steps``."""
    func = click.option(
        "--steps",
        type=click.IntRange(min=1),
        default=DEFAULT_STEPS,
        show_default=True,
        help="With --stateful: the most operations per program.",
    )(func)
    return click.option(
        "--stateful",
        is_flag=True,
        help="Drive a stateful engine (module:factory, or impl, vllm, sglang) with programs of "
        "requests and check every lookup against a content ledger; see the README.",
    )(func)


def refuse(**given: Any) -> None:
    """BadInput if an option that a stateful campaign does not take was given."""
    for option, value in given.items():
        if value:
            raise BadInput(f"--{option.replace('_', '-')} is not available with --stateful")


@contextmanager
def opened_stateful(target: str | None, target_cmd: str | None, timeout: float) -> Iterator[Runner]:
    """The stateful target's runner, closed afterwards; BadInput if it cannot be loaded."""
    try:
        runner = open_stateful(target, target_cmd, timeout)
    except TargetError as err:
        raise BadInput(str(err)) from None
    try:
        yield runner
    finally:
        runner.close()


def counts_text(campaign: Campaign) -> str:
    """Live counts by class, e.g. ``ok 120  rejected 3``."""
    return "  ".join(f"{cls} {n}" for cls, n in sorted(campaign.counts.items()) if n)


def run_stateful(
    target: str | None,
    target_cmd: str | None,
    timeout: float,
    options: dict[str, Any],
    seconds: float | None,
    programs: int | None,
    as_json: bool,
    junit: str | None = None,
) -> None:
    """Run a stateful campaign with progress, draw and save what it finds, print the
    summary (or JSON), write ``junit``, and exit 1 if anything disagreed (130 on Ctrl-C).

    ``options`` are :class:`Campaign` fields (``out_dir``, ``seed``, ``steps``, ...)."""
    console = Console(stderr=as_json, highlight=False, soft_wrap=True)
    label = label_of(target, target_cmd)
    start = time.monotonic()
    interrupted = False
    with opened_stateful(target, target_cmd, timeout) as runner:
        campaign = Campaign(runner, label, **options)
        with progress_of(campaign, console, programs):
            try:
                campaign.run(seconds, programs)
            except KeyboardInterrupt:
                interrupted = True
    took = time.monotonic() - start
    if junit:
        Path(junit).write_text(junit_xml(label, campaign.ops, took, campaign.found))
    report(campaign, took, interrupted, as_json, console, target, target_cmd)
    sys.exit(130 if interrupted else 1 if campaign.found else 0)


@contextmanager
def progress_of(campaign: Campaign, console: Console, programs: int | None) -> Iterator[None]:
    """A progress bar of programs, with operations and counts, fed by the campaign; each
    disagreement drawn (after its file is written) as it is found."""
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>6.0f} programs  {task.fields[ops]} ops"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("stateful", total=programs, ops=0, counts="")
        shown = [0.0]

        def tick(c: Campaign) -> None:
            now = time.monotonic()
            if now - shown[0] > 0.1:
                shown[0] = now
                progress.update(task, completed=c.programs, ops=c.ops, counts=counts_text(c))

        def found(d: ProgramDisagreement, path: Path | None) -> None:
            console.print(f"[bold red]{d.cls}[/bold red] saved to {path}")
            console.print(d.render(), markup=False)

        campaign.on_step, campaign.on_found = tick, found
        yield
        progress.update(
            task, completed=campaign.programs, ops=campaign.ops, counts=counts_text(campaign)
        )


def report(
    campaign: Campaign,
    seconds: float,
    interrupted: bool,
    as_json: bool,
    console: Console,
    target: str | None,
    target_cmd: str | None,
) -> None:
    """The summary line and the replay hint, or the JSON report."""
    if as_json:
        summary = {
            "target": campaign.target,
            "stateful": True,
            "programs": campaign.programs,
            "operations": campaign.ops,
            "seconds": round(seconds, 3),
            "counts": dict(campaign.counts),
            "disagreements": [d.to_json() for d in campaign.found],
            "files": [str(path) for path in campaign.saved],
            "interrupted": interrupted,
        }
        click.echo(json.dumps(summary))
        return
    stopped = "interrupted after " if interrupted else ""
    console.print(
        f"{campaign.target}: {stopped}{campaign.programs} programs, {campaign.ops} operations "
        f"in {seconds:.1f} s: {counts_text(campaign)}"
    )
    if campaign.saved:
        flag = f"--target {target}" if target is not None else f"--target-cmd '{target_cmd}'"
        console.print(f"replay with: kvhit replay {' '.join(map(str, campaign.saved))} {flag}")
    elif not campaign.found:
        console.print("no disagreement found")


def replay_program(
    name: str,
    text: str,
    target: str | None,
    target_cmd: str | None,
    timeout: float = DEFAULT_TIMEOUT,
    as_json: bool = False,
) -> bool:
    """Rerun a saved stateful program on a fresh engine and say how it ends now; True
    if it still disagrees."""
    try:
        program, saved = load_program_file(text)
    except QueryError as err:
        raise BadInput(f"{name}: {err}") from None
    with opened_stateful(target, target_cmd, timeout) as runner:
        steps = run_program(runner, program)
    disagrees = bool(steps) and steps[-1].outcome.disagrees
    was = f" (saved as {saved['class']})" if saved.get("class") else ""
    d = disagreement_of(label_of(target, target_cmd), program, steps) if steps else None
    if as_json:
        record = d.to_json() if d else {"program": program.to_json(), "class": "ok"}
        click.echo(json.dumps({"file": name, "saved_class": saved.get("class"), **record}))
    elif d and disagrees:
        click.echo(f"{name}: still {d.cls}{was}\n{d.render()}")
    else:
        click.echo(f"{name}: every operation ok now{was} ({len(steps)} operations)")
    return disagrees
