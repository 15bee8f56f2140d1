"""``kvhit fuzz``, ``kvhit gate`` and ``kvhit replay``, and the harness part of ``kvhit verify``.

Exit codes: 0 nothing found, 1 a disagreement, 2 bad usage or bad input.
"""

from __future__ import annotations

import functools
import json
import shlex
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvhit.errors import BadInput, TargetError
from kvhit.harness import exhaustive
from kvhit.harness.compare import CLASSES, json_safe, judge_reply
from kvhit.harness.engine import Engine, Phase
from kvhit.harness.exhaustive import Scope
from kvhit.harness.gate import DEFAULT_SECONDS, gate_phases, random_cases, run_gate, run_phases
from kvhit.harness.random_cases import CHOICES
from kvhit.harness.report import Disagreement, junit_xml, load_disagreement
from kvhit.harness.runner import DEFAULT_TIMEOUT, Runner, open_target
from kvhit.inputs import read_queries, read_text
from kvhit.model.protocol import QueryError
from kvhit.model.spec import longest_hit

DEFAULT_OUT = "kvhit-disagreements"
FUZZ_SECONDS = 10.0
MAX_STATES = 1 << 24


def target_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """``--target``, ``--target-cmd`` and ``--timeout``."""
    for option in reversed(
        [
            click.option("--target", help="A built-in target or module:function."),
            click.option("--target-cmd", help="A program speaking JSON lines on stdin/stdout."),
            click.option(
                "--timeout",
                type=click.FloatRange(min=0, min_open=True),
                default=DEFAULT_TIMEOUT,
                show_default=True,
                help="Per-call limit in seconds.",
            ),
            click.option(
                "--isolate",
                is_flag=True,
                help="Run a --target in a worker process, so a target that crashes the "
                "interpreter (native code, os._exit) is a crash, not the end of the run.",
            ),
        ]
    ):
        func = option(func)
    return func


def run_options(func: Callable[..., Any]) -> Callable[..., Any]:
    """The options fuzz and gate share."""
    for option in reversed(
        [
            click.option(
                "--seconds",
                type=click.FloatRange(min=0),
                help="Time for random queries (fuzz: 10 unless --cases; gate: 20).",
            ),
            click.option("--cases", type=click.IntRange(min=1), help="At most N random cases."),
            click.option(
                "--seed",
                type=int,
                default=0,
                show_default=True,
                help="Same seed and options, same cases.",
            ),
            click.option(
                "--out", default=DEFAULT_OUT, show_default=True, help="Replay files go here."
            ),
            click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
        ]
    ):
        func = option(func)
    return target_options(func)


def label_of(target: str | None, target_cmd: str | None) -> str:
    """How the report names the target."""
    return target if target is not None else f"cmd:{target_cmd}"


def target_flag(target: str | None, target_cmd: str | None) -> str:
    """The option that names the same target again, for the replay hint."""
    return (
        f"--target {target}"
        if target is not None
        else f"--target-cmd {shlex.quote(target_cmd or '')}"
    )


@contextmanager
def opened(
    target: str | None, target_cmd: str | None, timeout: float, isolate: bool = False
) -> Iterator[Runner]:
    """The target's runner, closed afterwards; BadInput if it cannot be loaded."""
    try:
        runner = open_target(target, target_cmd, timeout, isolate)
    except TargetError as err:
        raise BadInput(str(err)) from None
    try:
        yield runner
    except TargetError as err:
        raise BadInput(str(err)) from None
    finally:
        runner.close()


def counts_text(engine: Engine) -> str:
    """Live counts by class, e.g. ``ok 120  unsafe 3``."""
    order = ["ok", *CLASSES, "unsupported"]
    return "  ".join(f"{cls} {engine.counts[cls]}" for cls in order if engine.counts[cls])


def summary(engine: Engine, seconds: float) -> dict[str, Any]:
    """The JSON report of a run."""
    return {
        "target": engine.target,
        "cases": engine.cases,
        "seconds": round(seconds, 3),
        "counts": dict(engine.counts),
        "phases": dict(engine.by_phase),
        "disagreements": [d.to_json() for d in engine.found],
        "files": [str(path) for path in engine.saved],
        "interrupted": engine.interrupted,
    }


def run_with_progress(
    engine: Engine, phases: list[Phase], console: Console, total: int | None = None
) -> float:
    """Run the phases with a progress bar (of ``total`` cases, when known) and live
    counts; the seconds taken."""
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>8.0f} cases"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
    ]
    start = time.monotonic()
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task("starting", total=total, counts="")
        shown = [0.0]

        def tick(e: Engine) -> None:
            now = time.monotonic()
            if now - shown[0] > 0.1:
                shown[0] = now
                progress.update(task, description=e.phase, completed=e.cases, counts=counts_text(e))

        def found(d: Disagreement, path: Path | None) -> None:
            progress.console.print(f"[bold red]{d.cls}[/bold red] saved to {path}")
            progress.console.print(d.render(), markup=False)

        engine.on_case, engine.on_found = tick, found
        try:
            run_phases(engine, phases)
        except KeyboardInterrupt:
            engine.interrupted = True
        progress.update(
            task, completed=engine.cases, counts=counts_text(engine), total=engine.cases
        )
    return time.monotonic() - start


def finish(engine: Engine, seconds: float, as_json: bool, console: Console, flag: str) -> None:
    """Print the summary (or the JSON report) and exit 1 if anything disagreed, 130 if
    the run was interrupted (Ctrl-C); ``flag`` names the target in the replay hint."""
    if as_json:
        click.echo(json.dumps(summary(engine, seconds)))
    else:
        stopped = "interrupted after " if engine.interrupted else ""
        console.print(
            f"{engine.target}: {stopped}{engine.cases} cases in {seconds:.1f} s: "
            f"{counts_text(engine)}"
        )
        if engine.saved:
            files = " ".join(map(str, engine.saved))
            console.print(f"replay with: kvhit replay {files} {flag}")
        else:
            console.print("no disagreement found")
    sys.exit(130 if engine.interrupted else 1 if engine.disagreements else 0)


def check_kinds(kinds: str | None) -> tuple[str, ...]:
    """``--kinds full,mamba,eagle`` as a tuple; BadInput naming an unknown kind."""
    if kinds is None:
        return CHOICES
    picked = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in picked if k not in CHOICES]
    if unknown or not picked:
        raise BadInput(
            f"--kinds: unknown kind {unknown[0] if unknown else '(none)'!r}; "
            f"choose from {', '.join(CHOICES)}"
        )
    return picked


def reporting_console(as_json: bool) -> Console:
    """Progress and drawings go to stderr when stdout carries JSON."""
    return Console(stderr=as_json, highlight=False, soft_wrap=True)


def harness_command(func: Callable[..., Any]) -> Callable[..., Any]:
    """Turn a bad query, or a file that cannot be read or written, into BadInput (exit 2)."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except QueryError as err:
            raise BadInput(str(err)) from None
        except UnicodeDecodeError as err:
            raise BadInput(f"a file is not UTF-8 text ({err.reason})") from None
        except OSError as err:
            raise BadInput(f"{err.filename or 'file'}: {err.strerror or err}") from None

    return wrapper


def every_state_phases(
    path: str, seconds: float | None, cases: int | None
) -> tuple[list[Phase], int]:
    """One exhaustive phase per query in ``path``, and the number of states in all;
    BadInput if the file is bad or holds more than :data:`MAX_STATES` states."""
    scopes = [
        (label, Scope.of(q.groups, q.max_length, q.num_tokens, q.alignment))
        for label, q in read_queries(path)
    ]
    total = sum(scope.states for _, scope in scopes)
    if total > MAX_STATES:
        raise BadInput(f"{path}: {total:,} cache states; at most {MAX_STATES:,} (2^24) are checked")
    phases = [Phase(label, exhaustive.cases(scope), seconds, cases) for label, scope in scopes]
    return phases, total if cases is None else min(total, cases)


@click.command()
@run_options
@click.option(
    "--max-blocks",
    type=click.IntRange(min=1),
    default=8,
    show_default=True,
    help="Most blocks per group that a hit can reach.",
)
@click.option("--kinds", help=f"Comma-separated, from: {', '.join(CHOICES)}.")
@click.option(
    "--every-state",
    "scope_file",
    type=click.Path(dir_okay=False, allow_dash=True),
    help="Instead of random queries, every cache state of the groups and limits of the "
    "queries in FILE (their rows are ignored).",
)
@harness_command
def fuzz(
    target: str | None,
    target_cmd: str | None,
    timeout: float,
    isolate: bool,
    seconds: float | None,
    cases: int | None,
    seed: int,
    out: str,
    as_json: bool,
    max_blocks: int,
    kinds: str | None,
    scope_file: str | None,
) -> None:
    """Check random queries against the reference until --seconds pass or --cases are done
    (or, with --every-state, every cache state of the given groups).

    The first disagreement of each class is shrunk, saved to --out and drawn.
    """
    picked = check_kinds(kinds)
    if seconds is None and cases is None and scope_file is None:
        seconds = FUZZ_SECONDS
    if scope_file is not None:
        phases, total = every_state_phases(scope_file, seconds, cases)
    else:
        phases = [Phase("random", random_cases(seed, max_blocks, picked), seconds, cases)]
        total = cases
    console = reporting_console(as_json)
    with opened(target, target_cmd, timeout, isolate) as runner:
        engine = Engine(runner, label_of(target, target_cmd), Path(out))
        took = run_with_progress(engine, phases, console, total=total)
    finish(engine, took, as_json, console, target_flag(target, target_cmd))


@click.command()
@run_options
@click.option("--junit", type=click.Path(dir_okay=False), help="Write a JUnit XML report.")
@click.option("--keep-going", is_flag=True, help="Do not stop at the first disagreement.")
@harness_command
def gate(
    target: str | None,
    target_cmd: str | None,
    timeout: float,
    isolate: bool,
    seconds: float | None,
    cases: int | None,
    seed: int,
    out: str,
    as_json: bool,
    junit: str | None,
    keep_going: bool,
) -> None:
    """The CI gate: every state of small scopes, the solver corpus, then random queries
    for --seconds (default 20). Stops at the first disagreement unless --keep-going."""
    console = reporting_console(as_json)
    budget = DEFAULT_SECONDS if seconds is None else seconds
    with opened(target, target_cmd, timeout, isolate) as runner:
        engine = Engine(
            runner, label_of(target, target_cmd), Path(out), stop_at_first=not keep_going
        )
        took = run_with_progress(engine, gate_phases(budget, seed, cases=cases), console)
    if junit:
        Path(junit).write_text(junit_xml(engine.target, engine.cases, took, engine.found))
    finish(engine, took, as_json, console, target_flag(target, target_cmd))


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@target_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file.")
@harness_command
def replay(
    files: tuple[str, ...],
    target: str | None,
    target_cmd: str | None,
    timeout: float,
    isolate: bool,
    as_json: bool,
) -> None:
    """Rerun saved disagreements (or plain queries) against a target."""
    loaded = []
    for name in files:
        try:
            loaded.append((name, *load_disagreement(read_text(name))))
        except QueryError as err:
            raise BadInput(f"{name}: {err}") from None
    label = label_of(target, target_cmd)
    failed = 0
    with opened(target, target_cmd, timeout, isolate) as runner:
        for name, q, saved in loaded:
            reply = runner(q.to_json())
            outcome = judge_reply(q, reply, longest_hit(q))
            failed += outcome.disagrees
            d = Disagreement(label, outcome.cls, q, json_safe(reply.value), outcome.reason)
            was = f" (saved as {saved})" if saved else ""
            if as_json:
                click.echo(json.dumps({"file": name, "saved_class": saved, **d.to_json()}))
            elif outcome.disagrees:
                click.echo(f"{name}: still {outcome.cls}{was}\n{d.render()}")
            else:
                click.echo(f"{name}: {outcome.cls} now{was}, L* = {outcome.length}")
    sys.exit(1 if failed else 0)


def verify_section(console: Console, quick: bool) -> bool:
    """Gate ``impl``, then show ``seed-min`` being caught; True iff impl is clean and
    seed-min is caught."""
    seconds = 3.0 if quick else 15.0
    with tempfile.TemporaryDirectory() as tmp:
        console.rule("the gate on impl")
        try:
            impl = open_target("impl")
        except TargetError as err:
            console.print(f"[red]impl cannot be gated[/red]: {err}")
            impl_clean = False
        else:
            engine = run_gate(Engine(impl, "impl", Path(tmp), stop_at_first=True), seconds)
            impl_clean = not engine.disagreements
            console.print(f"impl: {engine.cases} cases: {counts_text(engine)}")
            for d in engine.found:
                console.print(d.render(), markup=False)
        console.rule("the gate catches seed-min")
        engine = run_gate(
            Engine(open_target("seed-min"), "seed-min", Path(tmp), stop_at_first=True), seconds
        )
        for d in engine.found:
            console.print(d.render(), markup=False)
        caught = bool(engine.found)
        console.print(f"seed-min: {engine.cases} cases: {counts_text(engine)}")
        console.print("[green]caught[/green]" if caught else "[red]not caught[/red]")
    return impl_clean and caught
