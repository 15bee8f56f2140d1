"""``kvhit fuzz``, ``kvhit gate`` and ``kvhit replay``, and the harness part of ``kvhit verify``.

A campaign checks stateless cases (exhaustive scopes, the solver corpus, random
queries) or, with ``--stateful``, programs of requests on a stateful engine. Both
are one path: one progress bar, one summary line or JSON report, one replay hint and
one exit code (:func:`exit_code`). With ``--stateful`` the other options keep their
meaning: ``--cases`` bounds the programs, ``--seconds`` the time, ``--seed`` fixes
the programs; counts are per lookup (one ``admit``, or one engine that could not be
created). A campaign of programs runs in one process: ``--jobs`` is ignored,
``--ray``, ``--isolate`` and ``--every-state`` are refused.

Exit codes: 0 nothing found, 1 a disagreement, 2 bad usage or bad input, 130 Ctrl-C.
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
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.text import Text

from kvhit.cli.display import campaign_bar, counts_text
from kvhit.cli.options import (
    DEFAULT_STEPS,
    RunSettings,
    TargetChoice,
    check_kinds,
    refuse_with_stateful,
    refuse_without_stateful,
    run_options,
    stateful_options,
    target_choice_options,
)
from kvhit.contract import BASE, Capabilities
from kvhit.errors import BadInput, TargetError
from kvhit.harness import driver, exhaustive
from kvhit.harness.checker import Phase
from kvhit.harness.driver import Campaign, gate_campaign
from kvhit.harness.exhaustive import Scope
from kvhit.harness.gate import DEFAULT_SECONDS, random_phases
from kvhit.harness.random_cases import CHOICES
from kvhit.harness.report import Record, junit_xml
from kvhit.harness.saved import CaseFile, SavedFile, decode, read_queries
from kvhit.harness.stateful_machine import ProgramPlan
from kvhit.harness.strategies import hypothesis_files_in
from kvhit.harness.tally import Tally
from kvhit.inputs import read_text, writable
from kvhit.model.protocol import QueryError
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec

FUZZ_SECONDS = 10.0
MAX_STATES = 1 << 24


def campaign_of(options: RunSettings, **what: Any) -> Campaign:
    """The campaign of ``what`` (its phases or programs, and their limits) on the target
    the options name, saving to --out, on --jobs (or --ray)."""
    return Campaign(
        options.spec,
        out=Path(options.out),
        jobs=options.jobs,
        ray_address=options.ray_address,
        **what,
    )


def run_with_progress(
    campaign: Campaign, console: Console, description: str, total: int | None = None
) -> tuple[Tally, float]:
    """Run a campaign with a progress bar (of ``total`` cases or programs, when known)
    and live counts, then draw each disagreement kept; the tally and the seconds taken."""
    start = time.monotonic()
    with campaign_bar(console, description, total) as (tick, done):
        try:
            tally = driver.run(campaign, tick)
        except TargetError as err:
            raise BadInput(str(err)) from None
        done(tally)
    for d, path in zip(tally.found, tally.saved):
        where = f" saved to {path}" if path else f" not saved: {tally.save_error}"
        console.print(Text.assemble((d.cls, "bold red"), where))
        console.print(Text(d.render()))
    return tally, time.monotonic() - start


def summary(tally: Tally, seconds: float) -> dict[str, Any]:
    """The JSON report of a run (a campaign of programs adds ``operations``)."""
    report = {
        "target": tally.target,
        "cases": tally.cases,
        "seconds": round(seconds, 3),
        "counts": dict(tally.counts),
        "phases": dict(tally.by_phase),
        "unsupported_reasons": dict(tally.refused.most_common()),
        "withheld": dict(tally.withheld.most_common()),
        "disagreements": [d.saved().to_json() for d in tally.found],
        "files": [str(path) for path in tally.files],
        "interrupted": tally.interrupted,
        "save_error": tally.save_error,
        "load_seconds": None if tally.load_seconds is None else round(tally.load_seconds, 3),
    }
    if tally.operations is not None:
        report["operations"] = tally.operations
    return report


def untimed(report: dict[str, Any]) -> dict[str, Any]:
    """A :func:`summary` without its times (the run's and the target's loading): what
    two runs of one campaign, on any number of jobs, must agree on.

    >>> untimed({"cases": 3, "seconds": 0.5, "load_seconds": 0.1})
    {'cases': 3}
    """
    return {key: value for key, value in report.items() if key not in ("seconds", "load_seconds")}


def exit_code(tally: Tally) -> int:
    """130 if Ctrl-C stopped the run, 1 if anything disagreed, else 0."""
    if tally.interrupted:
        return 130
    return 1 if tally.disagreements or tally.found else 0


SHOWN_REASONS = 3
"""How many reasons for ``unsupported`` the summary shows, the most frequent first."""

SHOWN_LOAD = 1.0
"""Seconds of loading from which the summary line says how long loading took."""


def loading_text(tally: Tally) -> str:
    """`` (loading the target took 12.7 s)`` when loading took :data:`SHOWN_LOAD` or more.

    >>> loading_text(Tally("vllm", load_seconds=12.71)), loading_text(Tally("model"))
    (' (loading the target took 12.7 s)', '')
    """
    if tally.load_seconds is None or tally.load_seconds < SHOWN_LOAD:
        return ""
    return f" (loading the target took {tally.load_seconds:.1f} s)"


def report(tally: Tally, seconds: float, as_json: bool, console: Console, spec: TargetSpec) -> int:
    """Print the summary and the replay hint (or the JSON report); the exit code."""
    if as_json:
        click.echo(json.dumps(summary(tally, seconds)))
    else:
        stopped = "interrupted after " if tally.interrupted else ""
        console.print(
            Text(
                f"{tally.target}: {stopped}{tally.checked()} in {seconds:.1f} s: "
                f"{counts_text(tally.counts)}{loading_text(tally)}"
            )
        )
        withheld = sum(tally.withheld.values())
        if withheld:
            console.print(Text(f"  not asked {withheld}: the target's declared rules refuse them"))
        for reason, n in tally.refused.most_common(SHOWN_REASONS):
            console.print(Text(f"  unsupported {n}: {reason}"))
        if len(tally.refused) > SHOWN_REASONS:
            console.print(
                Text(
                    f"  unsupported: {len(tally.refused) - SHOWN_REASONS} more reasons (--json lists all)"
                )
            )
        if tally.files:
            files = " ".join(shlex.quote(str(path)) for path in tally.files)
            console.print(Text(f"replay with: kvhit replay {files} {spec.replay_flag}"))
        elif not tally.found:
            console.print("no disagreement found")
        if tally.save_error:
            console.print(Text(f"could not save a replay file: {tally.save_error}"))
    return exit_code(tally)


@contextmanager
def files_only_in(out: Path, junit: str | None) -> Iterator[None]:
    """A run that writes files only where the user asked: --out (and --junit's folder)
    made and checked writable before any work (BadInput if not), Hypothesis' own
    files in a temporary directory, and --out removed again when this run made it and
    saved nothing there."""
    if junit:
        writable(Path(junit).parent, "--junit")
    made = not out.exists()
    writable(out, "--out")
    try:
        with tempfile.TemporaryDirectory(prefix="kvhit-") as tmp, hypothesis_files_in(Path(tmp)):
            yield
    finally:
        if made and out.is_dir() and not any(out.iterdir()):
            out.rmdir()


def run_and_report(
    options: RunSettings,
    campaign: Campaign,
    stateful: bool,
    total: int | None = None,
    junit: str | None = None,
) -> None:
    """Run the campaign (of programs, if ``stateful``) with progress, write ``junit``,
    print the report and exit with :func:`exit_code`."""
    console = Console(stderr=options.as_json, highlight=False, soft_wrap=True)
    with files_only_in(Path(options.out), junit):
        tally, took = run_with_progress(campaign, console, description(options, stateful), total)
    if junit:
        Path(junit).write_text(junit_xml(tally.target, tally.checked(), took, tally.found))
    sys.exit(report(tally, took, options.as_json, console, options.spec))


def description(options: RunSettings, stateful: bool) -> str:
    """The progress bar's description of a campaign."""
    if stateful:
        return "checking programs"
    return (
        f"checking on {options.jobs} jobs"
        if options.jobs > 1 or options.ray_address
        else "checking"
    )


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
        (label, Scope.of(q.groups, q.max_length, q.num_tokens, q.alignment, q.hash_unit))
        for label, q in read_queries(path)
    ]
    total = sum(scope.states for _, scope in scopes)
    if total > MAX_STATES:
        raise BadInput(f"{path}: {total:,} cache states; at most {MAX_STATES:,} (2^24) are checked")
    return scopes


def scope_phases(
    scopes: list[tuple[str, Scope]],
    seconds: float | None,
    cases: int | None,
    capabilities: Capabilities = BASE,
    redrawn: Counter[str] | None = None,
) -> list[Phase]:
    """One exhaustive phase per scope, each bounded by ``seconds`` and ``cases`` (the
    scopes are the user's: every one is checked, whatever the target declares)."""
    return [Phase(label, exhaustive.cases(scope), seconds, cases) for label, scope in scopes]


def every_state_run(
    options: RunSettings, scope_file: str, seconds: float | None, cases: int | None
) -> tuple[Campaign, int]:
    """``fuzz --every-state``: every state of the file's groups; the campaign and its cases."""
    scopes = every_state_scopes(scope_file)
    states = sum(scope.states for _, scope in scopes)
    total = states if cases is None else min(states, cases * len(scopes))
    phases = functools.partial(scope_phases, scopes, seconds, cases)
    return campaign_of(options, phases=phases), total


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
    steps: int | None,
    prompt_tokens: int | None,
) -> None:
    """Check random queries against the reference until --seconds pass or --cases are done
    (or, with --every-state, every cache state of the given groups).

    The first disagreement of each class is shrunk, saved to --out and drawn.
    """
    o = options
    refuse_without_stateful(stateful, steps=steps, prompt_tokens=prompt_tokens)
    picked = check_kinds(kinds)
    seconds, cases = o.seconds, o.cases
    if seconds is None and cases is None and scope_file is None:
        seconds = FUZZ_SECONDS
    total: int | None = cases
    if stateful:
        refuse_with_stateful(isolate=o.spec.isolate, ray=o.ray_address, every_state=scope_file)
        plan = ProgramPlan(
            picked,
            o.drawn_shape(),
            max_tokens=prompt_tokens or ProgramPlan.max_tokens,
            steps=steps or DEFAULT_STEPS,
            seed=o.seed,
            stop_at_first=False,
            out_dir=Path(o.out),
        )
        campaign = campaign_of(o, programs=plan, seconds=seconds, cases=cases)
    elif scope_file is not None:
        if o.shape or kinds:
            raise BadInput(
                "--shape and --kinds choose random queries; --every-state checks "
                "every state of FILE's groups instead"
            )
        campaign, total = every_state_run(o, scope_file, seconds, cases)
    else:
        shape = o.drawn_shape()
        phases = functools.partial(random_phases, o.seed, max_blocks, picked, seconds, cases, shape)
        campaign = campaign_of(o, phases=phases)
    run_and_report(o, campaign, stateful, total)


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
    steps: int | None,
    prompt_tokens: int | None,
) -> None:
    """The CI gate: every state of small scopes, the solver corpus, then random queries
    (of --shape) for --seconds (default 20). Stops at the first disagreement unless
    --keep-going."""
    o = options
    refuse_without_stateful(stateful, steps=steps, prompt_tokens=prompt_tokens)
    budget = DEFAULT_SECONDS if o.seconds is None else o.seconds
    if stateful:
        refuse_with_stateful(isolate=o.spec.isolate, ray=o.ray_address)
        plan = ProgramPlan(
            shape=o.drawn_shape(),
            max_tokens=prompt_tokens or ProgramPlan.max_tokens,
            steps=steps or DEFAULT_STEPS,
            seed=o.seed,
            stop_at_first=not keep_going,
            out_dir=Path(o.out),
        )
        campaign = campaign_of(o, programs=plan, seconds=budget, cases=o.cases)
    else:
        campaign = gate_campaign(
            o.spec,
            budget,
            o.seed,
            Path(o.out),
            not keep_going,
            o.cases,
            o.drawn_shape(),
            o.jobs,
            o.ray_address,
        )
    run_and_report(o, campaign, stateful, o.cases if stateful else None, junit)


def replayed(
    name: str, saved: str | None, d: Record, disagrees: bool, now: str, as_json: bool
) -> None:
    """Say how a replayed file ends now: its record as JSON, the drawing of what
    disagrees (``still``, when the file was saved as a disagreement), or ``now``."""
    was = f" (saved as {saved})" if saved else ""
    if as_json:
        click.echo(json.dumps({"file": name, "saved_class": saved, **d.saved().to_json()}))
    elif disagrees:
        said = f"still {d.cls}{was}" if saved else f"{d.cls} now"
        click.echo(f"{name}: {said}\n{d.render()}")
    else:
        click.echo(f"{name}: {now}{was}")


def replay_file(name: str) -> SavedFile:
    """The saved case file ``name`` holds (a saved disagreement, a plain query or a
    plain program, :func:`kvhit.harness.saved.decode`); BadInput naming the file."""
    text = read_text(name)
    try:
        return decode(text)
    except QueryError as err:
        raise BadInput(f"{name}: {err}") from None


def replay_target(name: str, recorded: TargetRecord | None, choice: TargetChoice) -> TargetSpec:
    """The target to replay file ``name`` on: the one given, else the one it records,
    with the options it records (said on stderr); BadInput if neither names one."""
    if choice.given:
        return choice.spec()
    if recorded is None:
        raise BadInput(f"{name} records no target: give --target or --target-cmd")
    c = choice
    try:
        spec = TargetSpec(
            recorded.name, recorded.command, c.timeout, c.isolate, recorded.options, c.load_timeout
        )
    except TargetError as err:
        raise BadInput(f"{name}: {err}") from None
    click.echo(f"{name}: replayed on {spec.replay_flag}, the target it records", err=True)
    return spec


@click.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@target_choice_options
@click.option("--json", "as_json", is_flag=True, help="One JSON object per file.")
@harness_command
def replay(files: tuple[str, ...], target: TargetChoice, as_json: bool) -> None:
    """Rerun saved disagreements (or plain queries, or stateful programs) against a
    target: the one given, else the one each saved file records."""
    items = []
    for name in files:
        saved = replay_file(name)
        item = saved.query if isinstance(saved, CaseFile) else saved.program
        items.append((replay_target(name, saved.target, target), item, (name, saved.cls)))

    def show(tag: tuple[str, str | None], shown: driver.Replayed) -> None:
        name, saved = tag
        replayed(name, saved, shown.record, shown.disagrees, shown.now, as_json)

    try:
        failed = driver.replay_all(items, show)
    except TargetError as err:
        raise BadInput(str(err)) from None
    sys.exit(1 if failed else 0)


def verify_section(console: Console, quick: bool) -> bool:
    """Gate ``impl``, then show ``seed-min`` being caught; True iff impl is clean and
    seed-min is caught."""
    seconds = 3.0 if quick else 15.0
    with tempfile.TemporaryDirectory() as tmp:
        console.rule("the gate on impl")
        impl = shown_gate(console, "impl", seconds, Path(tmp))
        impl_clean = impl is not None and not impl.disagreements
        console.rule("the gate catches seed-min")
        seed_min = shown_gate(console, "seed-min", seconds, Path(tmp))
        caught = seed_min is not None and bool(seed_min.found)
        console.print("[green]caught[/green]" if caught else "[red]not caught[/red]")
    return impl_clean and caught


def shown_gate(console: Console, name: str, seconds: float, out: Path) -> Tally | None:
    """Gate the built-in ``name`` for ``seconds`` (:func:`kvhit.harness.driver.gate`),
    stopping at the first disagreement, and show what it found and its counts; None
    (said in red) if it cannot be opened."""
    try:
        tally = driver.gate(TargetSpec(name), seconds, out=out)
    except TargetError as err:
        console.print(Text.assemble((f"{name} cannot be gated", "red"), f": {err}"))
        return None
    if tally.interrupted:
        raise KeyboardInterrupt  # verify's own handling: its summary so far, exit 130
    for d in tally.found:
        console.print(Text(d.render()))
    console.print(Text(f"{name}: {tally.checked()}: {counts_text(tally.counts)}"))
    return tally
