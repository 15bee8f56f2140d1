"""Theorems proved in worker processes: both cores busy, and Ctrl-C stops at once.

z3's C call does not return to Python on SIGINT, so a theorem runs in a worker
process (started fresh, not forked: z3 may hold threads) that the parent can end at
any moment. :func:`prove_all` hands each worker one theorem at a time and yields what
happens as it happens: a theorem started, a theorem finished (its
:class:`~kvhit.proofs.runner.Result`), or, on a long step, that a theorem is still
being proved. Leaving the loop early, or Ctrl-C inside it, ends every worker.
"""

from __future__ import annotations

import multiprocessing
import signal
import time
from collections import deque
from collections.abc import Generator
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from pathlib import Path

import z3

from kvhit.proofs.registry import Status, Theorem
from kvhit.proofs.runner import SOLVER_TIMEOUT, Result, blank_result, run_theorem

STILL_EVERY = 30.0
"""Seconds without a finished theorem after which :func:`prove_all` says which one
is still being proved (so a piped log is never silent for minutes)."""


@dataclass(frozen=True)
class ProofSettings:
    """How every theorem of a run is proved (:func:`~kvhit.proofs.runner.run_theorem`'s
    options)."""

    bound: int | None = None
    quick: bool = False
    timeout: float = SOLVER_TIMEOUT
    cross_check: bool = False
    emit_dir: Path | None = None

    def run(self, theorem: Theorem) -> Result:
        """The theorem proved in this process with these settings."""
        return run_theorem(
            theorem, self.bound, self.quick, self.timeout, self.cross_check, self.emit_dir
        )


@dataclass(frozen=True)
class Started:
    """A worker began proving the theorem ``name``."""

    name: str


@dataclass(frozen=True)
class Still:
    """The theorem ``name`` has been proved for ``seconds`` and is not finished."""

    name: str
    seconds: float


Event = Started | Result | Still
"""What :func:`prove_all` yields: a theorem started, finished (its result), or still running."""


def _serve(conn: Connection) -> None:
    """A worker: prove each theorem sent, send its result back, until told to stop.
    Ctrl-C is the parent's to handle (it ends the worker)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    z3.set_param("ctrl_c", False)
    while (job := conn.recv()) is not None:
        theorem, settings = job
        conn.send(settings.run(theorem))


@dataclass
class _Worker:
    process: BaseProcess
    conn: Connection
    theorem: Theorem | None = None
    since: float = 0.0

    @staticmethod
    def start() -> _Worker:
        context = multiprocessing.get_context("spawn")
        mine, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs,), daemon=True)
        process.start()
        theirs.close()
        return _Worker(process, mine)

    def give(self, theorem: Theorem, settings: ProofSettings) -> Started:
        self.conn.send((theorem, settings))
        self.theorem, self.since = theorem, time.monotonic()
        return Started(theorem.name)

    def end(self) -> None:
        self.process.terminate()
        self.process.join(timeout=5)
        self.conn.close()


def _died(worker: _Worker, settings: ProofSettings) -> Result:
    """The error result of a theorem whose worker process died under it (a solver crash)."""
    assert worker.theorem is not None
    theorem = worker.theorem
    result = blank_result(theorem, theorem.bound_for(settings.bound, settings.quick), Status.ERROR)
    result.seconds = time.monotonic() - worker.since
    result.detail = f"the worker process died (exit code {worker.process.exitcode}) proving it"
    return result


def prove_all(
    theorems: list[Theorem], settings: ProofSettings, jobs: int, heartbeat: float = STILL_EVERY
) -> Generator[Event, None, None]:
    """Prove every theorem in ``jobs`` worker processes, taking them in order; yield
    each start, each result as it comes, and a :class:`Still` for the longest-running
    theorem after ``heartbeat`` seconds without a result."""
    todo = deque(theorems)
    workers = [_Worker.start() for _ in range(min(jobs, len(theorems)))]
    quiet_since = time.monotonic()
    try:
        for worker in workers:
            yield worker.give(todo.popleft(), settings)
        while busy := [w for w in workers if w.theorem is not None]:
            pause = max(0.0, quiet_since + heartbeat - time.monotonic())
            ready = set(wait([w.conn for w in busy] + [w.process.sentinel for w in busy], pause))
            for worker in busy:
                if worker.conn not in ready and worker.process.sentinel not in ready:
                    continue
                try:
                    result: Result = worker.conn.recv()
                except (EOFError, OSError):  # it died before sending a result
                    worker.end()
                    result = _died(worker, settings)
                    workers[workers.index(worker)] = worker = _Worker.start()
                worker.theorem, quiet_since = None, time.monotonic()
                yield result
                if todo:
                    yield worker.give(todo.popleft(), settings)
            if not ready:
                oldest = min(busy, key=lambda w: w.since)
                assert oldest.theorem is not None
                quiet_since = time.monotonic()
                yield Still(oldest.theorem.name, quiet_since - oldest.since)
    finally:
        for worker in workers:
            worker.end()
