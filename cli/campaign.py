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
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from kvhit.cli.stateful import refuse, replay_program, run_stateful, stateful_options
from kvhit.errors import BadInput, TargetError
from kvhit.harness import exhaustive
from kvhit.harness.compare import CLASSES, ReplyClass, judge_reply
from kvhit.harness.engine import Engine, Phase, Tally
from kvhit.harness.exhaustive import Scope
from kvhit.harness.gate import DEFAULT_SECONDS, gate_phases, random_phases, run_gate
from kvhit.harness.jobs import Campaign, default_jobs, run_campaign
from kvhit.harness.random_cases import CHOICES, Choice, QueryShape, choices
from kvhit.harness.report import Disagreement, junit_xml, load_disagreement
from kvhit.inputs import read_queries, read_text
from kvhit.model.protocol import QueryError
from kvhit.model.spec import longest_hit
from kvhit.targets.registry import SHAPES
from kvhit.targets.runner import DEFAULT_TIMEOUT, Runner, label_of, open_target
from kvhit.targets.stateful import is_program_file
from kvhit.targets.wire import json_safe

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
    """The options fuzz and gate share, given to ``func`` as one :class:`RunSettings`."""
    func = packed_run(func)
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
            click.option(
                "--shape",
                type=click.Choice([str(s) for s in QueryShape]),
                help="What is drawn: queries (or, with --stateful, engine configurations) of "
                "every kind and mix (any), or only what SGLang's one radix tree holds "
                "(sglang). Default: sglang for --target sglang, else any.",
            ),
            click.option("--json", "as_json", is_flag=True, help="Print the report as JSON."),
            click.option(
                "--jobs",
                type=click.IntRange(min=1),
                default=default_jobs,
                show_default="the cores",
                help="Split the cases over N processes (same seed and N, same cases).",
            ),
            click.option(
                "--ray",
                "ray_address",
                metavar="ADDRESS",
                help="Run the --jobs on the Ray cluster at ADDRESS ('local': start one here).",
            ),
        ]
    ):
        func = option(func)
    return target_options(func)


@dataclass(frozen=True)
class RunSettings:
    """The options fuzz and gate share, as :func:`run_options` hands them over."""

    target: str | None
    target_cmd: str | None
    timeout: float
    isolate: bool
    seconds: float | None
    cases: int | None
    seed: int
    shape: str | None
    out: str
    as_json: bool
    jobs: int
    ray_address: str | None

    def campaign(self, phases: Callable[[], list[Phase]], stop_at_first: bool = False) -> Campaign:
        """The campaign of ``phases`` against this target, saving to --out."""
        return Campaign(
            self.target,
            self.target_cmd,
            self.timeout,
            phases,
            Path(self.out),
            stop_at_first,
            isolate=self.isolate,
        )

    def drawn_shape(self) -> QueryShape:
        """--shape, or the shape the built-in target declares (:data:`kvhit.targets.registry.SHAPES`)."""
        if self.shape is not None:
            return QueryShape(self.shape)
        return QueryShape(SHAPES.get(self.target or "", QueryShape.ANY))

    def run(self, campaign: Campaign, total: int | None = None) -> tuple[Tally, float, Console]:
        """Run ``campaign`` on the --jobs with a progress bar; the tally, the seconds
        taken and the console the report goes on."""
        console = reporting_console(self.as_json)
        tally, took = run_with_progress(campaign, self.jobs, self.ray_address, console, total)
        return tally, took, console

    def finish(self, tally: Tally, took: float, console: Console) -> None:
        """Print the summary and exit (see :func:`finish`)."""
        finish(tally, took, self.as_json, console, target_flag(self.target, self.target_cmd))


def packed_run(func: Callable[..., Any]) -> Callable[..., Any]:
    """Hand ``func`` the shared options as one :class:`RunSettings` argument."""
    names = [f.name for f in fields(RunSettings)]

    @functools.wraps(func)
    def wrapper(**kwargs: Any) -> Any:
        settings = RunSettings(**{name: kwargs.pop(name) for name in names})
        return func(settings, **kwargs)

    return wrapper


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


def counts_text(engine: Engine | Tally) -> str:
    """Live counts by class, e.g. ``ok 120  unsafe 3``."""
    return text_of(engine.counts)


def text_of(counts: Counter[str]) -> str:
    """Counts by class, e.g. ``ok 120  unsafe 3``."""
    order = [ReplyClass.OK, *CLASSES, ReplyClass.UNSUPPORTED]
    return "  ".join(f"{cls} {counts[cls]}" for cls in order if counts[cls])


def summary(engine: Tally, seconds: float) -> dict[str, Any]:
    """The JSON report of a run."""
    return {
        "target": engine.target,
        "cases": engine.cases,
        "seconds": round(seconds, 3),
        "counts": dict(engine.counts),
        "phases": dict(engine.by_phase),
        "disagreements": [d.to_json() for d in engine.found],
        "files": [str(path) for path in engine.files],
        "interrupted": engine.interrupted,
    }


def run_with_progress(
    campaign: Campaign,
    jobs: int,
    ray_address: str | None,
    console: Console,
    total: int | None = None,
) -> tuple[Tally, float]:
    """Run the campaign with a progress bar (of ``total`` cases, when known) and live
    counts, then draw each disagreement kept; the tally and the seconds taken."""
    columns = [
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed:>8.0f} cases"),
        TimeElapsedColumn(),
        TextColumn("{task.fields[counts]}"),
    ]
    start = time.monotonic()
    where = f" on {jobs} jobs" if jobs > 1 or ray_address else ""
    with Progress(*columns, console=console, transient=False) as progress:
        task = progress.add_task(f"checking{where}", total=total, counts="")
        shown = [0.0]

        def tick(cases: int, counts: Counter[str]) -> None:
            now = time.monotonic()
            if now - shown[0] > 0.1:
                shown[0] = now
                progress.update(task, completed=cases, counts=text_of(counts))

        try:
            tally = run_campaign(campaign, jobs, ray_address, tick)
        except TargetError as err:
            raise BadInput(str(err)) from None
        progress.update(task, completed=tally.cases, counts=counts_text(tally), total=tally.cases)
    for d, path in zip(tally.found, tally.saved):
        console.print(f"[bold red]{d.cls}[/bold red] saved to {path}")
        console.print(d.render(), markup=False)
    return tally, time.monotonic() - start


def finish(engine: Tally, seconds: float, as_json: bool, console: Console, flag: str) -> None:
    """Print the summary (or the JSON report) and exit 1 if anything disagreed, 130 if
    Ctrl-C stopped the run; ``flag`` names the target in the replay hint."""
    if as_json:
        click.echo(json.dumps(summary(engine, seconds)))
    else:
        stopped = "interrupted after " if engine.interrupted else ""
        console.print(
            f"{engine.target}: {stopped}{engine.cases} cases in {seconds:.1f} s: "
            f"{counts_text(engine)}"
        )
        if engine.files:
            files = " ".join(map(str, engine.files))
            console.print(f"replay with: kvhit replay {files} {flag}")
        else:
            console.print("no disagreement found")
    sys.exit(130 if engine.interrupted else 1 if engine.disagreements else 0)


def check_kinds(kinds: str | None) -> tuple[Choice, ...]:
    """``--kinds full,mamba,eagle`` as choices; BadInput naming an unknown kind."""
    if kinds is None:
        return CHOICES
    try:
        picked = choices(k.strip() for k in kinds.split(",") if k.strip())
    except ValueError as err:
        raise BadInput(f"--kinds: {err}") from None
    if not picked:
        raise BadInput(f"--kinds: no kind given; choose from {', '.join(CHOICES)}")
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


def every_state_scopes(path: str) -> list[tuple[str, Scope]]:
    """The scope of each query in ``path``; BadInput if the file is bad or they hold
    more than :data:`MAX_STATES` states in all."""
    scopes = [
        (label, Scope.of(q.groups, q.max_length, q.num_tokens, q.alignment))
        for label, q in read_queries(path)
    ]
    total = sum(scope.states for _, scope in scopes)
    if total > MAX_STATES:
        raise BadInput(f"{path}: {total:,} cache states; at most {MAX_STATES:,} (2^24) are checked")
    return scopes


def scope_phases(
    scopes: list[tuple[str, Scope]], seconds: float | None, cases: int | None
) -> list[Phase]:
    """One exhaustive phase per scope, each bounded by ``seconds`` and ``cases``."""
    return [Phase(label, exhaustive.cases(scope), seconds, cases) for label, scope in scopes]


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
@stateful_options
@harness_command
def fuzz(
    options: RunSettings,
    max_blocks: int,
    kinds: str | None,
    scope_file: str | None,
    stateful: bool,
    steps: int,
) -> None:
    """Check random queries against the reference until --seconds pass or --cases are done
    (or, with --every-state, every cache state of the given groups).

    The first disagreement of each class is shrunk, saved to --out and drawn.
    """
    picked = check_kinds(kinds)
    seconds, cases = options.seconds, options.cases
    if seconds is None and cases is None and scope_file is None:
        seconds = FUZZ_SECONDS
    if stateful:
        o = options
        refuse(isolate=o.isolate, ray=o.ray_address, every_state=scope_file)
        plan = {"out_dir": Path(o.out), "seed": o.seed, "steps": steps, "kinds": picked}
        plan["shape"] = o.drawn_shape()
        plan |= {"max_tokens": 2 * max_blocks, "stop_at_first": False}
        run_stateful(o.target, o.target_cmd, o.timeout, plan, seconds, cases, o.as_json)
    phases: Callable[[], list[Phase]]
    total: int | None
    if scope_file is not None:
        if options.shape or kinds:
            raise BadInput(
                "--shape and --kinds choose random queries; --every-state checks "
                "every state of FILE's groups instead"
            )
        scopes = every_state_scopes(scope_file)
        states = sum(scope.states for _, scope in scopes)
        total = states if cases is None else min(states, cases * len(scopes))
        phases = functools.partial(scope_phases, scopes, seconds, cases)
    else:
        shape = options.drawn_shape()
        phases = functools.partial(
            random_phases, options.seed, max_blocks, picked, seconds, cases, shape
        )
        total = cases
    tally, took, console = options.run(options.campaign(phases), total)
    options.finish(tally, took, console)


@click.command()
@run_options
@click.option("--junit", type=click.Path(dir_okay=False), help="Write a JUnit XML report.")
@click.option("--keep-going", is_flag=True, help="Do not stop at the first disagreement.")
@stateful_options
@harness_command
def gate(
    options: RunSettings,
    junit: str | None,
    keep_going: bool,
    stateful: bool,
    steps: int,
) -> None:
    """The CI gate: every state of small scopes, the solver corpus, then random queries
    (of --shape) for --seconds (default 20). Stops at the first disagreement unless
    --keep-going."""
    o = options
    budget = DEFAULT_SECONDS if o.seconds is None else o.seconds
    if stateful:
        refuse(isolate=o.isolate, ray=o.ray_address)
        plan = {"out_dir": Path(o.out), "seed": o.seed, "steps": steps, "shape": o.drawn_shape()}
        plan["stop_at_first"] = not keep_going
        run_stateful(o.target, o.target_cmd, o.timeout, plan, budget, o.cases, o.as_json, junit)
    phases = functools.partial(gate_phases, budget, o.seed, cases=o.cases, shape=o.drawn_shape())
    tally, took, console = o.run(o.campaign(phases, stop_at_first=not keep_going))
    if junit:
        Path(junit).write_text(junit_xml(tally.target, tally.cases, took, tally.found))
    options.finish(tally, took, console)


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
    """Rerun saved disagreements (or plain queries, or stateful programs) against a target."""
    loaded = []
    failed = 0
    for name in files:
        text = read_text(name)
        if is_program_file(text):
            failed += replay_program(name, text, target, target_cmd, timeout, as_json)
            continue
        try:
            loaded.append((name, *load_disagreement(text)))
        except QueryError as err:
            raise BadInput(f"{name}: {err}") from None
    if not loaded:
        sys.exit(1 if failed else 0)
    label = label_of(target, target_cmd)
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
