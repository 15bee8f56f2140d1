"""Running a step program on a step-level engine and checking every step against the
ledger (docs/design.md §5.7).

kvhit plays the model executor. Each ``step`` event asks the engine to schedule one
step (:class:`~kvhit.contract.StepPlan`); before the step runs, every scheduled
request's reads are checked: each block it reads for its tokens ``[computed, end)``
(:func:`~kvhit.harness.ledger.still_read` at ``computed``) must be in its table and
hold this request's tokens there, written by a step that ran. The step's writes then
go into the ledger (through ``end``; a Mamba block holds the state at ``end``), and
the executor reports the step (:class:`~kvhit.contract.StepResult`), one step late
when the engine is asynchronous. Steps run in the order they were scheduled, so a
step may read what an earlier step, reported or not, writes; attention KV written in
this very step is readable too (every layer writes before it reads), a Mamba state is
not (it exists once its step is over).

What makes a read ``unsafe``, each its own reason:

- **unwritten block**: the step that was to write it never ran (its part was cut) or
  its load failed;
- **same-step state**: a Mamba state another request writes in this same step;
- **stale block**: it holds other tokens, or none (the ledger's reason);
- **overwritten block**: a block a running request still reads, written over by
  another request's step.

A request the engine never finishes, or a loop that stops scheduling while requests
wait, is ``stuck``. A plan that names an unknown or finished request, computes tokens
the request does not have or lacks a table per group is ``bad_return``.

    >>> from kvhit.targets.registry import Mode
    >>> from kvhit.targets.target_spec import TargetSpec
    >>> program = StepProgram.from_json({"groups": [{"kind": "full", "block_size": 2}],
    ...     "num_blocks": 8, "budget": 4, "events": [
    ...         {"op": "arrive", "request": 0, "prompt": [1, 2, 3, 4, 5], "output": [6]},
    ...         {"op": "step"}, {"op": "step"},
    ...         {"op": "arrive", "request": 1, "prompt": [1, 2, 3, 4, 9], "output": [7]}]})
    >>> run = run_steps(TargetSpec("impl-steps").open(Mode.STATEFUL), program)
    >>> [r.label for r in run.records]
    ['arrive r0 [1 2 3 4 5]', 'step 1: r0 0..4 (hit 0)', 'step 2: r0 4..5', 'arrive r1 [1 2 3 4 9]', 'step 3: r1 4..5 (hit 4)']
    >>> str(run.verdict.cls)
    'ok'

The second request hits the 4 tokens the first wrote, once the step that wrote them
was reported (``tests/broken_steps.py`` has engines that break each rule).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from kvhit.analysis import Verdict
from kvhit.contract import Ran, Scheduled, StepPlan, StepResult, capabilities_of
from kvhit.harness.compare import EndsInOutcome, Outcome
from kvhit.harness.ledger import Content, Need, describe, still_read, tokens_text
from kvhit.harness.saved import StepsFile
from kvhit.model.spec import Group, Kind
from kvhit.targets.runner import Reply, Runner
from kvhit.targets.stateful import Create
from kvhit.targets.steps import (
    Abort,
    Arrive,
    ProgramEvent,
    Report,
    Schedule,
    StepEvent,
    StepProgram,
)
from kvhit.targets.target_record import TargetRecord

IDLE_STEPS = 3
"""Steps in a row that schedule nothing while requests wait: the loop is stuck."""


@dataclass
class Running:
    """A request kvhit has sent: its arrival, what it sampled so far, and what its
    last step left it reading."""

    arrival: Arrive
    sampled: list[int] = field(default_factory=list)
    needs: tuple[Need, ...] = ()

    @property
    def tokens(self) -> tuple[int, ...]:
        """Its prompt, then what it sampled."""
        return self.arrival.prompt + tuple(self.sampled)

    @property
    def sequence(self) -> tuple[int, ...]:
        """Its prompt, then everything the executor will sample for it (a step
        scheduled before the last one is reported computes a token not sampled yet)."""
        return self.arrival.prompt + self.arrival.output


@dataclass(frozen=True)
class LogEntry:
    """One event or step as run: a label for people, and its outcome; ``counted``
    whether it is one of the answers a tally counts (a step, or the engine's
    creation)."""

    label: str
    outcome: Outcome
    counted: bool = True


@dataclass
class Pending:
    """A step scheduled and not yet reported: its number, plan and mishaps, and each
    scheduled request's tokens as the step saw them."""

    number: int
    plan: StepPlan
    step: StepEvent
    tokens: dict[int, tuple[int, ...]]
    void: set[int] = field(default_factory=set)
    """Requests whose part of this step computes from what an earlier step lost (its
    part cut, or a load it read failed): its writes are lost and it samples nothing."""


@dataclass
class StepLedger:
    """What every physical block holds (:class:`~kvhit.harness.ledger.Content`, its
    ``op`` the step that writes it) and why a block holds nothing usable."""

    groups: tuple[Group, ...]
    boundary_states: bool = False
    """Whether a step writes a Mamba state at every block end it passes, not only at
    its last token (:class:`~kvhit.contract.StepLoop`)."""
    blocks: dict[int, Content] = field(default_factory=dict)
    lost: dict[int, str] = field(default_factory=dict)

    def reads(self, s: Scheduled, tokens: tuple[int, ...]) -> Iterator[Need]:
        """What ``s`` reads: every block below ``computed`` its tokens attend to (a
        Mamba group: its state at exactly ``computed``)."""
        for i, g in enumerate(self.groups):
            b, c = g.block_size, s.computed
            for j in still_read(g, c):
                if j < 0 or j * b >= c:
                    continue
                block = s.tables[i][j] if j < len(s.tables[i]) else None
                end = min((j + 1) * b, c)
                yield Need(i, j, -1 if block is None else block, j * b, end, tokens[:end],
                           g.kind == Kind.MAMBA)  # fmt: skip

    def writes(self, s: Scheduled, tokens: tuple[int, ...], number: int) -> dict[int, Content]:
        """What ``s``'s step writes: its tokens' KV through ``end`` (then garbage for
        its drafts, which the executor rejects); a Mamba group its state at ``end``
        (and, with ``boundary_states``, at every block end before it)."""
        out: dict[int, Content] = {}
        written = tokens[: s.end] + (-1,) * s.drafts
        for i, g in enumerate(self.groups):
            b, table = g.block_size, s.tables[i]
            top = s.end if g.kind == Kind.MAMBA else len(written)
            first = s.computed // b
            if g.kind == Kind.MAMBA and not self.boundary_states:
                first = (s.end - 1) // b
            for j in range(first, -(-top // b)):
                block = table[j] if j < len(table) else None
                if block is not None:
                    end = min((j + 1) * b, top)
                    out[block] = Content(i, written[:end], -1, number, end, j * b)
        return out

    def problem(self, need: Need, request: int, step: dict[int, Content]) -> str:
        """Why ``need`` is not met when this step writes ``step`` (by block), or ''."""
        where = f"group {need.group} block {need.index}"
        if need.block < 0:
            return f"stale block: r{request} reads {where}, but its table holds no block there"
        mine = f"{where}, physical block {need.block}"
        if need.block in step and step[need.block].request != request:
            if need.exact:
                return (f"same-step state: r{request} reads the Mamba state of {mine}, which "
                        f"r{step[need.block].request} writes in this same step")  # fmt: skip
            held: Content | None = step[need.block]
        else:
            held = self.blocks.get(need.block)
        if held is None and need.block in self.lost:
            return f"unwritten block: r{request} reads {mine}, {self.lost[need.block]}"
        if need.met_by(held):
            return ""
        return (f"stale block: r{request} reads {mine}, which {describe(held, need)}; "
                f"it needs {tokens_text(need.tokens)}")  # fmt: skip

    def write(self, contents: dict[int, Content], request: int) -> None:
        """The step writes these (each block's ``request`` set to the writer)."""
        for block, c in contents.items():
            self.blocks[block] = Content(c.group, c.tokens, request, c.op, c.end, c.start)
            self.lost.pop(block, None)

    def copy(self, copies: Sequence[tuple[int, int]]) -> None:
        """The engine copied these blocks (source, destination), in order."""
        for source, destination in copies:
            if source in self.blocks:
                self.blocks[destination] = self.blocks[source]
                self.lost.pop(destination, None)
            else:
                self.blocks.pop(destination, None)
                if source in self.lost:
                    self.lost[destination] = self.lost[source]

    def lose(self, block: int, why: str) -> None:
        """The block holds nothing usable any more, for ``why``."""
        self.blocks.pop(block, None)
        self.lost[block] = why


class StepRun:
    """A step program being run on one engine."""

    def __init__(self, runner: Runner, program: StepProgram):
        self.runner = runner
        self.program = program
        self.groups = program.config.groups
        loop = capabilities_of(runner).loop
        self.ledger = StepLedger(self.groups, loop is not None and loop.boundary_states)
        self.live: dict[int, Running] = {}
        self.gone: dict[int, Running] = {}
        self.pending: list[Pending] = []
        self.last: StepPlan = StepPlan(())
        self.records: list[LogEntry] = []
        self.events: list[ProgramEvent] = []
        self.number = 0

    @property
    def verdict(self) -> Outcome:
        """The run's outcome: its first disagreement, else ok."""
        return next((r.outcome for r in self.records if r.outcome.disagrees), Outcome(Verdict.OK))

    def fail(self, label: str, reply: Reply, what: str) -> bool:
        """Record a call that gave no answer; whether the run goes on (it does not)."""
        self.records.append(
            LogEntry(label, Outcome(Verdict(reply.status), reason=f"{what}: {reply.detail}"))
        )
        return False

    def note(self, label: str, outcome: Outcome, counted: bool = True) -> bool:
        """Record ``outcome``; whether the run goes on."""
        self.records.append(LogEntry(label, outcome, counted or outcome.disagrees))
        return not outcome.disagrees

    def start(self) -> bool:
        """Create the engine."""
        reply = self.runner(Create(self.program.config))
        return reply.status == "answer" or self.fail("create", reply, "create")

    def found(self, target: TargetRecord) -> StepDisagreement:
        """The run so far as a disagreement on ``target`` (its program: the events run,
        the steps of the drain included)."""
        return StepDisagreement(target, self.program.with_events(self.events), tuple(self.records))

    def event(self, event: ProgramEvent) -> bool:
        """Run one event; whether the run goes on."""
        if isinstance(event, StepEvent):
            return self.step(event)
        self.events.append(event)
        label = (f"arrive r{event.request} {tokens_text(event.prompt)}" if isinstance(event, Arrive)
                 else f"abort r{event.request}")  # fmt: skip
        if isinstance(event, Abort) and event.request not in self.live:
            return self.note(label + " (not running)", Outcome(Verdict.OK), counted=False)
        reply = self.runner(event)
        if reply.status != "answer":
            return self.fail(label, reply, label.split()[0])
        if isinstance(event, Arrive):
            self.live[event.request] = Running(event)
        else:
            self.end(event.request)
        return self.note(label, Outcome(Verdict.OK), counted=False)

    def end(self, request: int) -> None:
        """The request is over (finished or aborted)."""
        running = self.live.pop(request, None)
        if running is not None:
            self.gone[request] = running

    def step(self, step: StepEvent) -> bool:
        """Schedule a step, check it, write it; report the oldest unreported one."""
        self.events.append(step)
        self.number += 1
        reply = self.runner(Schedule())
        label = f"step {self.number}"
        if reply.status != "answer":
            return self.fail(label, reply, "schedule")
        plan = reply.value
        problem = self.malformed(plan)
        if problem:
            return self.note(label, Outcome(Verdict.BAD_RETURN, reason=problem))
        self.last, label = plan, plan_label(self.number, plan)
        for r in plan.preempted:
            self.live[r].needs = ()
        outcome = self.check(plan)
        if outcome.disagrees:
            return self.note(label, outcome)
        tokens = {s.request: self.live[s.request].sequence for s in plan.scheduled}
        self.pending.append(Pending(self.number, plan, step, tokens))
        if len(self.pending) > int(self.program.config.asynchronous):
            return self.note(label, self.report(self.pending.pop(0)))
        return self.note(label, Outcome(Verdict.OK))

    def malformed(self, plan: object) -> str:
        """Why ``plan`` is no plan this run can take, or ''."""
        if not isinstance(plan, StepPlan):
            return f"schedule: answered {type(plan).__name__}, not a StepPlan"
        for r in plan.preempted:
            if r not in self.live:
                return f"schedule: preempts r{r}, which is not running"
        for s in plan.draining:
            if s.request not in self.gone:
                return f"schedule: drains r{s.request}, which was not aborted"
        for s in plan.scheduled:
            live = self.live.get(s.request)
            if live is None:
                return f"schedule: schedules r{s.request}, which is not running"
            if s.computed < 0 or s.new < 1 or s.end > len(live.tokens) + len(self.pending):
                return (f"schedule: r{s.request} computes {s.computed}..{s.end} of its "
                        f"{len(live.tokens)} tokens")  # fmt: skip
            if len(s.tables) != len(self.groups):
                return f"schedule: r{s.request} has {len(s.tables)} tables for {len(self.groups)} groups"
            if s.hit is not None and s.hit != s.computed:
                return f"schedule: r{s.request}'s hit is {s.hit} but it computes from {s.computed}"
        return ""

    def check(self, plan: StepPlan) -> Outcome:
        """The engine's copies, every scheduled request's reads, then the writes (those
        of parts run for aborted requests too), then what running requests still read."""
        self.ledger.copy(plan.copies)
        tokens = {s.request: self.live[s.request].sequence for s in plan.scheduled}
        tokens |= {s.request: self.gone[s.request].sequence for s in plan.draining}
        writes = {s.request: self.ledger.writes(s, tokens[s.request], self.number)
                  for s in (*plan.scheduled, *plan.draining)}  # fmt: skip
        step = {block: Content(c.group, c.tokens, r, c.op, c.end, c.start)
                for r, w in writes.items() for block, c in w.items()}  # fmt: skip
        for s in plan.scheduled:
            for need in self.ledger.reads(s, tokens[s.request]):
                problem = self.ledger.problem(need, s.request, step)
                if problem:
                    return Outcome(Verdict.UNSAFE, s.hit, problem)
        for r, w in writes.items():
            self.ledger.write(w, r)
        for s in plan.scheduled:
            self.live[s.request].needs = tuple(self.holds(s))
        overwritten = self.overwritten()
        return Outcome(Verdict.UNSAFE, reason=overwritten) if overwritten else Outcome(Verdict.OK)

    def holds(self, s: Scheduled) -> Iterator[Need]:
        """What the request reads for its next step once this one ran."""
        tokens = self.live[s.request].sequence
        for i, g in enumerate(self.groups):
            for j in still_read(g, s.end):
                block = s.tables[i][j] if j < len(s.tables[i]) else None
                if block is not None:
                    end = min((j + 1) * g.block_size, s.end)
                    yield Need(
                        i, j, block, j * g.block_size, end, tokens[:end], g.kind == Kind.MAMBA
                    )

    def overwritten(self) -> str:
        """A block a running request still reads that no longer holds what it needs."""
        for r, live in self.live.items():
            for need in live.needs:
                held = self.ledger.blocks.get(need.block)
                if not need.met_by(held):
                    return (f"overwritten block: r{r}, still running, reads group {need.group} "
                            f"block {need.index}, physical block {need.block}, which "
                            f"{describe(held, need)}; r{r} needs {tokens_text(need.tokens)}")  # fmt: skip
        return ""

    def report(self, pending: Pending) -> Outcome:
        """Run the step's mishaps and report it to the engine."""
        scheduled = {s.request for s in pending.plan.scheduled}
        cut, invalid = set(pending.step.cut) & scheduled, self.failed_loads(pending)
        spoiled = {s.request for s in pending.plan.scheduled if self.reads_any(s, invalid)}
        newly = (cut | spoiled) - pending.void
        unrun = self.voided(pending, cut - pending.void, "was cut and never ran")
        lost = {block: f"whose load failed in step {pending.number}" for block in invalid}
        lost |= unrun | self.voided(
            pending, spoiled - cut - pending.void, "read a block whose load failed"
        )
        for later in self.pending:  # scheduled already: computes from what is lost now
            readers = {s.request for s in later.plan.scheduled if self.reads_any(s, invalid)}
            fresh = (newly | readers) - later.void
            lost |= self.voided(later, fresh, "computes from what an earlier step lost")
            later.void |= fresh
        void = newly | pending.void
        for block, why in lost.items():
            self.ledger.lose(block, why)
        for running in self.live.values():  # what a failed load spoiled is recovered
            running.needs = tuple(n for n in running.needs if n.block not in lost)
        read = self.read_since(unrun)
        if read:
            return Outcome(Verdict.UNSAFE, reason=read)
        ran = tuple(
            Ran(s.request, ()) if s.request in void else self.ran(s)
            for s in pending.plan.scheduled
            if s.request in self.live and s.request not in cut
        )
        reply = self.runner(Report(StepResult(ran, tuple(sorted(cut)), tuple(sorted(invalid)))))
        if reply.status != "answer":
            return Outcome(Verdict(reply.status), reason=f"executed: {reply.detail}")
        for r in ran:
            self.live[r.request].sampled.extend(r.sampled)
        for request in reply.value or ():
            self.end(request)
        for request in sorted(cut & set(self.live)):
            reply = self.runner(Abort(request))
            if reply.status != "answer":
                return Outcome(Verdict(reply.status), reason=f"abort r{request}: {reply.detail}")
            self.end(request)
        return Outcome(Verdict.OK)

    @staticmethod
    def reads_any(s: Scheduled, blocks: set[int]) -> bool:
        """Whether ``s``'s tables hold one of ``blocks``."""
        return any(b in blocks for table in s.tables for b in table)

    def voided(self, pending: Pending, requests: set[int], why: str) -> dict[int, str]:
        """The blocks the parts of ``requests`` in ``pending`` wrote and that still
        hold what they wrote, each with why it holds nothing usable."""
        out: dict[int, str] = {}
        for s in pending.plan.scheduled:
            if s.request not in requests:
                continue
            said = f"which r{s.request}'s part of step {pending.number} wrote; that part {why}"
            for block in self.ledger.writes(s, pending.tokens[s.request], 0):
                held = self.ledger.blocks.get(block)
                if held is not None and (held.request, held.op) == (s.request, pending.number):
                    out[block] = said
        return out

    def read_since(self, lost: dict[int, str]) -> str:
        """Why a step scheduled after the one being reported (asynchronous scheduling)
        read a block that step was to write and never did (its part was cut: the engine
        published the block before the step ran), or ''. A later read of a block whose
        load fails is voided instead: the engine could not know yet, and recovers it."""
        for later in self.pending:
            for s in later.plan.scheduled:
                if s.request in later.void:
                    continue
                for need in self.ledger.reads(s, later.tokens[s.request]):
                    if need.block in lost:
                        where = (
                            f"group {need.group} block {need.index}, physical block {need.block}"
                        )
                        return f"unwritten block: r{s.request} in step {later.number} reads {where}, {lost[need.block]}"
        return ""

    def failed_loads(self, pending: Pending) -> set[int]:
        """The physical blocks whose load the step's ``fail`` makes fail."""
        out = set()
        for f in pending.step.fail:
            for s in pending.plan.scheduled:
                loaded = s.loaded[f.group] if f.group < len(s.loaded) else ()
                block = s.tables[f.group][f.index] if f.index < len(s.tables[f.group]) else None
                if s.request == f.request and block is not None and block in loaded:
                    out.add(block)
        return out

    def ran(self, s: Scheduled) -> Ran:
        """What the executor samples for ``s``: the request's next output token once
        its step reaches the last token it has."""
        live = self.live[s.request]
        output = live.arrival.output
        if s.end < len(live.tokens) or len(live.sampled) >= len(output):
            return Ran(s.request, ())
        return Ran(s.request, (output[len(live.sampled)],))

    def drained(self) -> bool:
        """Run steps until every request is over; ``stuck`` if they never are: after
        :data:`IDLE_STEPS` steps in a row that schedule nothing, or after four steps per
        token the running requests have left to compute (and eight more)."""
        idle = 0
        left = sum(len(r.arrival.prompt) + len(r.arrival.output) for r in self.live.values())
        limit = 4 * left + 8
        for _ in range(limit):
            if not self.live:
                return self.flushed()
            if not self.step(StepEvent()):
                return False
            idle = 0 if self.last.scheduled else idle + 1
            if idle >= IDLE_STEPS:
                return self.stuck(f"{IDLE_STEPS} steps in a row scheduled nothing")
        return self.flushed() if not self.live else self.stuck(f"after {limit} more steps")

    def flushed(self) -> bool:
        """Report the steps still unreported (asynchronous scheduling)."""
        while self.pending:
            pending = self.pending.pop(0)
            if not self.note(
                f"report of step {pending.number}", self.report(pending), counted=False
            ):
                return False
        return True

    def stuck(self, why: str) -> bool:
        """Record that the loop makes no progress."""
        waiting = ", ".join(f"r{r}" for r in sorted(self.live))
        return self.note("drain", Outcome(Verdict.STUCK, reason=f"{waiting} never finished: {why}"))


def plan_label(number: int, plan: StepPlan) -> str:
    """``step 3: r1 4..5 (hit 4), r0 5..6``."""
    parts = [f"r{s.request} {s.computed}..{s.end}" + (f" (hit {s.hit})" if s.hit is not None else "")
             for s in plan.scheduled]  # fmt: skip
    parts += [f"r{r} preempted" for r in plan.preempted]
    return f"step {number}: {', '.join(parts)}"


def run_steps(runner: Runner, program: StepProgram) -> StepRun:
    """Run every event of ``program`` on a fresh engine, then steps until every
    request is over, stopping at the first disagreement."""
    run = StepRun(runner, program)
    if run.start() and all(run.event(e) for e in program.events):
        run.drained()
    return run


@dataclass(frozen=True)
class StepDisagreement(EndsInOutcome):
    """A (shrunk) step program whose run ends in a disagreement."""

    target: TargetRecord
    program: StepProgram
    records: tuple[LogEntry, ...]

    @property
    def last(self) -> LogEntry:
        """The entry that disagreed."""
        return self.records[-1] if self.records else LogEntry("create", Outcome(Verdict.OK))

    def size(self) -> tuple[int, int, int]:
        """Fewer events first, then fewer tokens, then fewer groups."""
        arrivals = self.program.requests.values()
        tokens = sum(len(a.prompt) + len(a.output) for a in arrivals)
        return len(self.program.events), tokens, len(self.program.config.groups)

    def saved(self) -> StepsFile:
        """The replayable file."""
        log = tuple(e.label for e in self.records)
        return StepsFile(self.program, self.target, self.cls, self.reason, log)

    def render(self) -> str:
        """The engine, what happened (the failing entry marked), and why."""
        c = self.program.config
        budget = "" if c.budget is None else f", budget {c.budget} tokens"
        timing = ", asynchronous" if c.asynchronous else ""
        lines = [f"engine: {c.num_blocks} blocks, A={c.alignment}{budget}{timing}"]
        lines += [f"group {i}  {g.describe()}" for i, g in enumerate(c.groups)]
        for n, entry in enumerate(self.records, 1):
            mark = f"   <- {entry.outcome.cls}" if entry.outcome.disagrees else ""
            lines.append(f"{n:>3}. {entry.label}{mark}")
        lines.append(f"{self.cls}: {self.reason}")
        return "\n".join(lines)

    def rerun(self, runner: Runner) -> StepDisagreement:
        """What the program shows on a fresh engine of ``runner`` (itself if it runs
        clean now)."""
        run = run_steps(runner, self.program)
        return run.found(self.target) if run.verdict.disagrees else self
