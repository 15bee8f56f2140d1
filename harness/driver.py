"""The one front door of the harness: run a campaign, replay a saved case. ``kvhit
fuzz``, ``gate``, ``replay`` and ``verify`` and the pytest plugin all come in here, so
"the gate" means one thing everywhere (docs/design.md §6.3).

A :class:`Campaign` is a target and what to check on it: stateless phases (the gate's
exhaustive scopes, corpus and random queries; ``fuzz``'s random queries; every state
of some scopes) or programs of requests on a stateful engine. :func:`run` runs it (on
several jobs or Ray for stateless cases, in this process for programs) and returns
one :class:`~kvhit.harness.tally.Tally`; :func:`gate` is the gate with its defaults.

    >>> from kvhit.targets.target_spec import TargetSpec
    >>> tally = gate(TargetSpec("seed-min"), seconds=0.2)
    >>> [str(d.cls) for d in tally.found]
    ['unsafe']
    >>> replay(TargetSpec("seed-min"), tally.found[0].query).disagrees
    True
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvhit.analysis import Analysis
from kvhit.contract import Capabilities
from kvhit.harness.checker import CaseChecker, Phase
from kvhit.harness.compare import judge_reply
from kvhit.harness.gate import DEFAULT_SECONDS, gate_phases, run_phases
from kvhit.harness.jobs import CaseCampaign, run_campaign
from kvhit.harness.lifecycle import run_steps
from kvhit.harness.report import Disagreement, Record
from kvhit.harness.stateful import disagreement_of, run_program
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.harness.tally import OnProgress, Tally
from kvhit.model.spec import Query
from kvhit.targets.registry import Mode, default_shape
from kvhit.targets.runner import CALL_TIMEOUT, CallableRunner, Runner, alarm_handler
from kvhit.targets.stateful import Program
from kvhit.targets.steps import StepProgram
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec
from kvhit.targets.wire import json_safe

Phases = Callable[[Capabilities], list[Phase]]
"""What makes a stateless campaign's phases for the target's capabilities, in each job
(a picklable function, such as a :func:`functools.partial` of a module-level one)."""


@dataclass(frozen=True)
class Campaign:
    """A target and what to check on it: ``phases`` (stateless cases) or ``programs``
    (a plan of programs on a stateful engine, for ``seconds`` or ``cases`` programs);
    replay files go to ``out`` (None: nowhere); with ``stop_at_first`` the run ends at
    its first disagreement; stateless cases run on ``jobs`` processes or on the Ray
    cluster at ``ray_address``."""

    spec: TargetSpec
    phases: Phases | None = None
    programs: ProgramPlan | None = None
    seconds: float | None = None
    cases: int | None = None
    out: Path | None = None
    stop_at_first: bool = False
    jobs: int = 1
    ray_address: str | None = None

    def __post_init__(self) -> None:
        if (self.phases is None) == (self.programs is None):
            raise ValueError("a campaign checks phases of cases or programs, exactly one")


def run(campaign: Campaign, on_progress: OnProgress = lambda tally: None) -> Tally:
    """Run ``campaign``; its tally. ``on_progress`` is told the counts so far.

    Raises :class:`~kvhit.errors.TargetError` when the target cannot be loaded (or a
    job dies); Ctrl-C ends the run with what was checked, marked interrupted.
    """
    if campaign.programs is not None:
        return run_program_campaign(campaign, campaign.programs, on_progress)
    assert campaign.phases is not None
    cases = CaseCampaign(campaign.spec, campaign.phases, campaign.out, campaign.stop_at_first)
    return run_campaign(cases, campaign.jobs, campaign.ray_address, on_progress)


def run_program_campaign(campaign: Campaign, plan: ProgramPlan, on_progress: OnProgress) -> Tally:
    """Programs on the stateful target, in this process; Ctrl-C while the engine
    loads ends it with nothing run, interrupted."""
    spec = campaign.spec
    try:
        runner = spec.open(Mode.STATEFUL)
    except KeyboardInterrupt:
        return Tally(spec.label, operations=0, interrupted=True)
    try:
        tally = run_programs(
            runner, spec.record, plan, campaign.seconds, campaign.cases, on_progress
        )
    except KeyboardInterrupt:
        return Tally(spec.label, operations=0, interrupted=True)
    finally:
        runner.close()
    tally.load_seconds = runner.load_seconds
    return tally


def gate_campaign(
    spec: TargetSpec,
    seconds: float = DEFAULT_SECONDS,
    seed: int = 0,
    out: Path | None = None,
    stop_at_first: bool = True,
    cases: int | None = None,
    shape: str | None = None,
    jobs: int = 1,
    ray_address: str | None = None,
) -> Campaign:
    """The gate on ``spec``: every state of small scopes, the solver corpus, then random
    queries for ``seconds`` (at most ``cases``), of ``shape`` (default: the target's)."""
    drawn = shape if shape is not None else default_shape(spec.name)
    phases = functools.partial(gate_phases, seconds, seed, cases=cases, shape=drawn)
    return Campaign(
        spec,
        phases=phases,
        out=out,
        stop_at_first=stop_at_first,
        jobs=jobs,
        ray_address=ray_address,
    )


def gate(
    target: TargetSpec | Callable[[dict[str, Any]], Any],
    seconds: float = DEFAULT_SECONDS,
    seed: int = 0,
    out: Path | None = None,
    timeout: float = CALL_TIMEOUT,
) -> Tally:
    """The gate on ``target`` in this process, stopping at the first disagreement
    (:func:`gate_campaign`); its tally. ``target`` is a target to open, or a Python
    function or :class:`~kvhit.contract.LookupTarget` already in hand (called with
    ``timeout`` per call)."""
    if isinstance(target, TargetSpec):
        return run(gate_campaign(target, seconds, seed, out))
    runner = CallableRunner(target, timeout)
    record = TargetRecord(getattr(target, "__name__", "target"))
    checker = CaseChecker(runner, record, out, stop_at_first=True)
    caps = runner.capabilities
    with alarm_handler():
        phases = gate_phases(seconds, seed, capabilities=caps, redrawn=checker.tally.withheld)
        return run_phases(checker, phases)


@dataclass(frozen=True)
class Replayed:
    """What a saved case shows now: its record, whether it disagrees, and what to say
    when it does not."""

    record: Record
    disagrees: bool
    now: str


Replayable = Query | Program | StepProgram
"""What a saved file replays: a query, a program, or a step program."""


def replay(spec: TargetSpec, item: Replayable) -> Replayed:
    """Ask a query again, or run a program again on a fresh engine, on ``spec``."""
    mode = Mode.LOOKUP if isinstance(item, Query) else Mode.STATEFUL
    runner = spec.open(mode)
    try:
        return replayed_on(runner, spec.record, item)
    finally:
        runner.close()


def replayed_on(runner: Runner, target: TargetRecord, item: Replayable) -> Replayed:
    """:func:`replay` on an open runner (of the mode ``item`` needs) of ``target``."""
    if isinstance(item, Query):
        reply = runner.ask(item)
        analysis = Analysis(item)
        outcome = judge_reply(analysis, reply)
        d = Disagreement(target, outcome.cls, analysis, json_safe(reply.value), outcome.reason)
        return Replayed(d, outcome.disagrees, f"{outcome.cls} now, L* = {outcome.length}")
    if isinstance(item, StepProgram):
        run = run_steps(runner, item)
        found = run.found(target)
        return Replayed(found, run.verdict.disagrees, f"every step ok now ({run.number} steps)")
    steps = run_program(runner, item)
    p = disagreement_of(target, item, steps)
    return Replayed(
        p, p.last.outcome.disagrees, f"every operation ok now ({len(steps)} operations)"
    )


def replay_all(
    items: list[tuple[TargetSpec, Replayable, Any]],
    on_replayed: Callable[[Any, Replayed], None],
) -> int:
    """Replay each (target, case, tag), opening each target once per mode, telling
    ``on_replayed`` the tag and what it shows; how many still disagree."""
    runners: dict[tuple[TargetSpec, Mode], Runner] = {}
    failed = 0
    try:
        for spec, item, tag in items:
            mode = Mode.LOOKUP if isinstance(item, Query) else Mode.STATEFUL
            if (spec, mode) not in runners:
                runners[spec, mode] = spec.open(mode)
            shown = replayed_on(runners[spec, mode], spec.record, item)
            on_replayed(tag, shown)
            failed += shown.disagrees
    finally:
        for runner in runners.values():
            runner.close()
    return failed
