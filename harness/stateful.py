"""Running a program on a stateful target and checking every lookup two ways.

Before each ``admit`` the engine is asked for its own snapshot of the request (which
of its blocks it finds cached). The admit's hit is then checked:

1. against the content ledger (:mod:`kvhit.harness.ledger`): every block the hit
   reads must be in the request's table and hold exactly this request's tokens
   through that block. A block that holds anything else is ``unsafe``, reason
   *stale block*: the engine's index says it holds tokens it no longer holds;
2. against the engine's own snapshot, exactly as the stateless gate judges a
   lookup (L* of that snapshot, the same classes: ``unsafe``, ``lost_reuse``,
   ``wrong_blocks``; the listed blocks are the table entries taken from the cache);
3. when the engine reports ``outputs_match: false`` (its served output differs from
   a computation from scratch): ``unsafe``.

After every operation, each block a running request (admitted, not finished) still
reads must hold that request's tokens (:meth:`kvhit.harness.ledger.Ledger.overwritten`):
one handed to another request and written there is ``unsafe``, reason *overwritten
block*, at the operation that wrote it. An engine that cannot be created is the
run's one step (of no operation), a finding like any other.

A failure that is not an answer (``crash``, ``timeout``, ``bad_return``) is its own
class, as for stateless targets; ``rejected`` (the pool cannot hold the request) and
``unsupported`` (the engine refuses the configuration) are counted, not disagreements.

    >>> from kvhit.targets.registry import Mode
    >>> from kvhit.targets.target_spec import TargetSpec
    >>> program = Program.from_json({"groups": [{"kind": "full", "block_size": 2}],
    ...     "num_blocks": 8, "ops": [{"op": "admit", "request": 0, "tokens": [1, 2, 3]},
    ...                              {"op": "admit", "request": 1, "tokens": [1, 2, 4]}]})
    >>> steps = run_program(TargetSpec("impl").open(Mode.STATEFUL), program)
    >>> [(str(s.outcome.cls), s.outcome.length) for s in steps]
    [('ok', 0), ('ok', 2)]
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from kvhit.analysis import Analysis, Verdict
from kvhit.contract import Admitted, EngineConfig, Rejected
from kvhit.draw import draw
from kvhit.harness.compare import EndsInOutcome, Outcome, judge_reply
from kvhit.harness.ledger import Ledger, tokens_text
from kvhit.harness.saved import ProgramFile
from kvhit.model.spec import Answer, Query, longest_hit
from kvhit.targets.runner import Reply, Runner
from kvhit.targets.stateful import (
    Admission,
    Admit,
    Create,
    Finish,
    Look,
    Op,
    Program,
    check_admit,
    check_snapshot,
)
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.wire import BadReturn, decode_answer, json_safe


@dataclass(frozen=True)
class Step:
    """One operation run: its outcome, and for an admit the snapshot it was judged
    on, the engine's answer in its protocol form and, when kvhit accepted it, the
    admission it checked."""

    op: Op | None  # None: the engine's creation
    outcome: Outcome
    snapshot: Query | None = None
    answer: Any = None
    admission: Admission | None = None

    @property
    def counted(self) -> bool:
        """Whether a tally counts its class: an admit, or the engine's creation."""
        return self.op is None or isinstance(self.op, Admit)


def answer_json(value: Any) -> Any:
    """An engine's answer as the saved record holds it: a typed answer's protocol form,
    anything else as plain JSON."""
    return value.to_json() if isinstance(value, Admitted | Rejected) else json_safe(value)


def failed(reply: Reply, what: str) -> Outcome:
    """The outcome of a call that gave no answer."""
    return Outcome(Verdict(reply.status), reason=f"{what}: {reply.detail}")


@dataclass
class ProgramRun:
    """A program being run on one engine: the ledger and the running requests."""

    runner: Runner
    program: Program
    ledger: Ledger = field(init=False)
    config: EngineConfig = field(init=False)
    running: set[int] = field(default_factory=set)
    steps: list[Step] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.ledger = Ledger(self.program.hash_unit)
        self.config = self.program.config()

    def found(self, target: TargetRecord) -> ProgramDisagreement:
        """The run so far as a disagreement on ``target``."""
        return disagreement_of(target, self.program, self.steps)

    def start(self) -> Outcome:
        """Create the engine; ``ok``, or why not (``unsupported``, ``crash``, ...), which
        is then the run's one step."""
        reply = self.runner(Create(self.config))
        if reply.status == "answer":
            return Outcome(Verdict.OK)
        outcome = failed(reply, "create")
        self.steps.append(Step(None, outcome))
        return outcome

    def run(self, op: Op) -> Step:
        """Run one operation and judge it; then check that no running request lost a
        block it still reads."""
        step = self.admit(op) if isinstance(op, Admit) else self.finish(op)
        overwritten = "" if step.outcome.disagrees else self.ledger.overwritten()
        if overwritten:
            unsafe = Outcome(Verdict.UNSAFE, step.outcome.length, overwritten)
            step = replace(step, outcome=unsafe)
        self.steps.append(step)
        return step

    def finish(self, op: Finish) -> Step:
        """Finish a running request (a request that is not running is skipped)."""
        if op.request not in self.running:
            return Step(op, Outcome(Verdict.OK))
        self.running.discard(op.request)
        self.ledger.release(op.request)
        reply = self.runner(op)
        return Step(
            op, Outcome(Verdict.OK) if reply.status == "answer" else failed(reply, "finish")
        )

    def snapshot(self, op: Admit) -> Query | Outcome:
        """The engine's own view of the request's blocks, as a protocol query."""
        reply = self.runner(Look(op.tokens, self.config))
        if reply.status != "answer":
            return failed(reply, "snapshot")
        try:
            seen = check_snapshot(reply.value, self.config)
        except BadReturn as err:
            return Outcome(Verdict.BAD_RETURN, reason=str(err))
        p, t = self.program, len(op.tokens)
        return Query(p.groups, seen.cached, t - 1, t, p.alignment, p.hash_unit, seen.tiers)

    def admit(self, op: Admit) -> Step:
        """Snapshot, admit, and judge the hit against the ledger and the snapshot."""
        q = self.snapshot(op)
        if isinstance(q, Outcome):
            return Step(op, q)
        reply = self.runner(op)
        answer = answer_json(reply.value)
        if reply.status != "answer":
            return Step(op, failed(reply, "admit"), q, answer)
        try:
            checked = check_admit(reply.value, self.config)
            if isinstance(checked, Admission):
                decode_answer(q, checked.listed())
        except BadReturn as err:
            return Step(op, Outcome(Verdict.BAD_RETURN, reason=str(err)), q, answer)
        if isinstance(checked, Rejected):
            return Step(op, Outcome(Verdict.REJECTED, reason=checked.reason), q, answer)
        self.running.add(op.request)
        self.ledger.move(checked.admitted.moves)
        outcome = self.judge(q, op, checked)
        self.ledger.record(q.groups, op.tokens, checked, op.request, len(self.steps) + 1)
        self.ledger.hold(q.groups, op.tokens, checked, op.request)
        return Step(op, outcome, q, answer, checked)

    def judge(self, q: Query, op: Admit, admission: Admission) -> Outcome:
        """Ledger first (a stale block is the worst finding), then the snapshot."""
        length = admission.admitted.length
        stale = self.ledger.problem(q.groups, op.tokens, admission)
        if stale:
            return Outcome(Verdict.UNSAFE, length, stale)
        outcome = judge_reply(Analysis(q), Reply("answer", admission.listed()))
        if outcome.disagrees or admission.admitted.outputs_match is not False:
            return outcome
        return Outcome(Verdict.UNSAFE, length, "served outputs differ from scratch")


def run_program(runner: Runner, program: Program) -> list[Step]:
    """Run every operation of ``program`` on a fresh engine, stopping after the first
    disagreement (a failed creation is one step of no op)."""
    run = ProgramRun(runner, program)
    if run.start().cls != "ok":
        return run.steps
    for op in program.ops:
        if run.run(op).outcome.disagrees:
            break
    return run.steps


def op_line(number: int, step: Step) -> str:
    """One operation as a line of the drawn program."""
    op = step.op
    if op is None:
        text = "create"
    elif isinstance(op, Finish):
        text = f"finish r{op.request}"
    else:
        text = f"admit r{op.request} {tokens_text(op.tokens)}"
        if step.outcome.cls == "rejected":
            text += "  rejected"
        elif step.outcome.length is not None:
            text += f"  hit {step.outcome.length}"
    mark = f"   <- {step.outcome.cls}" if step.outcome.disagrees else ""
    return f"{number:>3}. {text}{mark}"


@dataclass(frozen=True)
class ProgramDisagreement(EndsInOutcome):
    """A (shrunk) program after which the engine's last operation disagrees."""

    target: TargetRecord
    program: Program
    steps: tuple[Step, ...]

    @property
    def last(self) -> Step:
        """The step that disagreed (a program of no operation on an engine that was
        created: that creation, ok)."""
        return self.steps[-1] if self.steps else Step(None, Outcome(Verdict.OK))

    def size(self) -> tuple[int, int, int]:
        """Shorter programs first, then fewer tokens, then fewer groups."""
        ops = self.program.ops
        token_count = sum(len(op.tokens) for op in ops if isinstance(op, Admit))
        return len(ops), token_count, len(self.program.groups)

    def rerun(self, runner: Runner) -> ProgramDisagreement:
        """What the program shows on a fresh engine of ``runner`` (itself if it runs
        clean now)."""
        steps = run_program(runner, self.program)
        if steps and steps[-1].outcome.disagrees:
            return disagreement_of(self.target, self.program, steps)
        return self

    def saved(self) -> ProgramFile:
        """The replayable file (its JSON is also an entry of ``gate --stateful --json``)."""
        last = self.last
        return ProgramFile(
            self.program, self.target, last.outcome.cls, self.reason, last.snapshot, last.answer
        )

    def render(self) -> str:
        """The engine, the operations (the failing one marked), then the failing
        lookup drawn as the stateless gate draws it."""
        p = self.program
        unit = "" if p.hash_unit is None else f", h={p.hash_unit}"
        stores = "".join(
            f", store {t.name} ({', '.join(sorted(t.holds))}): {t.num_blocks} slots"
            for t in p.tiers
        )
        lines = [f"engine: {p.num_blocks} blocks, A={p.alignment}{unit}{stores}"]
        lines += [f"group {i}  {g.describe()}" for i, g in enumerate(p.groups)]
        lines += [op_line(n, s) for n, s in enumerate(self.steps, 1)]
        lines.append(f"{self.cls}: {self.reason}")
        q = self.last.snapshot
        if q is not None:
            admission = self.last.admission
            judged = admission is not None and self.cls in ("unsafe", "lost_reuse", "wrong_blocks")
            shown = None
            if judged and admission is not None:
                reused = tuple(map(tuple, admission.reused_indices()))
                shown = Answer(admission.admitted.length, reused)
            lines.append("the engine's own snapshot at that lookup (@ = reused):")
            lines.append(draw(q, shown))
            lines.append(f"reference answer on that snapshot L* = {longest_hit(q).length}")
        return "\n".join(lines)


def disagreement_of(
    target: TargetRecord, program: Program, steps: list[Step]
) -> ProgramDisagreement:
    """The disagreement of a run whose last step disagreed; the program is cut after it."""
    ops = tuple(s.op for s in steps if s.op is not None)
    cut = replace(program, ops=ops)
    return ProgramDisagreement(target, cut, tuple(steps))
