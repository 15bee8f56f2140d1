"""Campaigns split over several processes (``--jobs N``) or a Ray cluster (``--ray ADDRESS``).

Job k of N checks the cases numbered k, k + N, k + 2N, … of every phase
(:meth:`~kvhit.harness.checker.Phase.share`), so the split depends only on N and the
same seed and N give the same cases. Each job opens the target in its own process,
shrinks and saves the first disagreement of each class it meets, and sends its counts
for the progress bar. The merged report keeps, per class, the disagreement met first
in case order (the one a single job would have found) and removes the other jobs'
files of that class. A case budget (``--cases``) bounds all jobs together; a time
budget (``--seconds``) is each job's.

With ``stop_at_first`` (the gate), local jobs share the place of the earliest
disagreement found so far and stop when their next case comes after it, so the run
reports the disagreement one job would have stopped at; the counts also hold the
cases that other jobs had checked past it before they heard.

    >>> from functools import partial
    >>> from kvhit.harness.gate import gate_phases
    >>> from kvhit.targets.target_spec import TargetSpec
    >>> campaign = CaseCampaign(TargetSpec("seed-min"), partial(gate_phases, None, cases=300))
    >>> one, two = run_campaign(campaign, jobs=1), run_campaign(campaign, jobs=2)
    >>> (one.cases, one.counts) == (two.cases, two.counts)
    True
    >>> [d.query for d in one.found] == [d.query for d in two.found]
    True
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterator
from contextlib import closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvhit.errors import TargetError
from kvhit.harness.checker import CaseChecker, Phase
from kvhit.harness.report import Record
from kvhit.harness.shrink import SHRINK_SECONDS
from kvhit.harness.tally import Finding, OnProgress, Tally
from kvhit.targets.target_spec import TargetSpec

PLACE = 1 << 40
"""Positions are compared as ``phase * PLACE + number``."""
NEVER = 1 << 62
INTERRUPTED = -1
"""The stop place the parent sets on Ctrl-C: every local job stops at its next case."""
SEND_EVERY = 1.0
"""A job sends its counts every 50 cases, or after this many seconds (a slow target)."""
GRACE = 3.0
"""Seconds the jobs have after Ctrl-C to report before they are ended."""


@dataclass(frozen=True)
class CaseCampaign:
    """A campaign of stateless cases: what every job needs to rebuild the run in its
    own process.

    ``phases`` makes the run's phases for the target's capabilities, given as the
    keywords ``capabilities`` and ``redrawn`` (a counter of what its rules refused) (a picklable function, such as a :func:`functools.partial`
    of a module-level one); ``out`` is where replay files go (None: nowhere).
    """

    spec: TargetSpec
    phases: Callable[..., list[Phase]]
    out: Path | None = None
    stop_at_first: bool = False
    shrink_seconds: float = SHRINK_SECONDS


@dataclass(frozen=True)
class JobReport:
    """A job's counts and findings so far (so a job that never gets to report its end
    loses nothing it saved); ``done`` holds its tally once it has finished."""

    job: int
    cases: int
    counts: dict[str, int]
    found: tuple[Finding, ...] = ()
    done: Tally | None = None
    error: str | None = None


Send = Callable[[JobReport], None]


def place(position: tuple[int, int]) -> int:
    """A position as one comparable number."""
    return position[0] * PLACE + position[1]


def run_job(campaign: CaseCampaign, job: int, jobs: int, send: Send, stop: Any = None) -> Tally:
    """Run job ``job`` of ``jobs`` here, sending progress; its tally. Ctrl-C (a
    KeyboardInterrupt) at any point, the target's loading included, ends the job with
    what it checked, marked interrupted.

    ``stop`` (a shared ``multiprocessing.Value``, or None) holds the place of the
    earliest disagreement any job has found, when ``campaign.stop_at_first``, or
    :data:`INTERRUPTED`.
    """
    label = campaign.spec.label
    try:
        if stop is not None and stop.value == INTERRUPTED:
            raise KeyboardInterrupt  # Ctrl-C came before this job started
        runner = campaign.spec.open()
    except KeyboardInterrupt:
        return Tally(label, interrupted=True)
    last = [0, time.monotonic()]

    def so_far(tally: Tally) -> None:
        send(JobReport(job, tally.cases, dict(tally.counts), tally.findings()))

    def tick(tally: Tally) -> None:
        now = time.monotonic()
        if tally.cases - last[0] >= 50 or now - last[1] >= SEND_EVERY:
            last[:] = [tally.cases, now]
            so_far(tally)

    def heard(position: tuple[int, int]) -> bool:
        return stop is None or place(position) < stop.value

    def found(_: Any, __: Any) -> None:
        if stop is not None and campaign.stop_at_first:
            with stop.get_lock():
                stop.value = min(stop.value, place(checker.tally.found_at[-1]))

    checker = CaseChecker(
        runner,
        campaign.spec.record,
        campaign.out,
        on_found=found,
        on_case=tick,
        on_saved=so_far,
        proceed=heard,
        stop_at_first=campaign.stop_at_first,
        shrink_seconds=campaign.shrink_seconds,
    )
    checker.tally.load_seconds = runner.load_seconds
    interrupted = False
    try:
        phases = campaign.phases(capabilities=runner.capabilities, redrawn=checker.tally.withheld)
        for phase in phases:
            if not checker.run(phase.share(job, jobs)):
                break
    except KeyboardInterrupt:  # report what was checked
        interrupted = True
    finally:
        runner.close()
    tally = checker.tally
    tally.interrupted = interrupted or (stop is not None and stop.value == INTERRUPTED)
    return tally


def merge(label: str, tallies: list[Tally]) -> Tally:
    """One tally of all jobs: counts added, and per class the disagreement met first in
    case order; the other jobs' replay files of that class are removed."""
    total = Tally(label)
    seen: list[tuple[tuple[int, int], Record, Path | None]] = []
    for tally in tallies:
        total.cases += tally.cases
        total.counts.update(tally.counts)
        total.by_phase.update(tally.by_phase)
        total.refused.update(tally.refused)
        # every job draws the whole stream and checks its share: each counted the same
        # withheld cases up to where it stopped, so the furthest job's count is the run's
        total.withheld |= tally.withheld
        total.interrupted |= tally.interrupted
        total.save_error = total.save_error or tally.save_error
        seen += tally.findings()
    loads = [t.load_seconds for t in tallies if t.load_seconds is not None]
    total.load_seconds = max(loads, default=None)
    first: dict[str, tuple[tuple[int, int], Record, Path | None]] = {}
    for at, d, path in sorted(seen, key=lambda s: s[0]):
        first.setdefault(d.cls, (at, d, path))
    for at, d, path in first.values():
        total.found_at.append(at)
        total.found.append(d)
        total.saved.append(path)
    for _, _, path in seen:
        if path is not None and path not in total.saved:
            path.unlink(missing_ok=True)
    return total


def local_job(campaign: CaseCampaign, job: int, jobs: int, channel: Any, stop: Any) -> None:
    """A child process's body: run the job, send its tally (or why it could not run).

    Ctrl-C reaches the job as one KeyboardInterrupt (from the terminal, or sent on by
    the parent), wherever it is, loading the target or inside a call; the job then
    reports what it checked."""
    signal.signal(signal.SIGINT, interrupt_once)
    try:
        tally = run_job(campaign, job, jobs, channel.put, stop)
    except Exception as err:  # sent to the parent, which reports it
        channel.put(JobReport(job, 0, {}, error=why(err)))
        return
    channel.put(JobReport(job, tally.cases, dict(tally.counts), done=tally))


def interrupt_once(signum: int, frame: Any) -> None:
    """Raise KeyboardInterrupt, and ignore later Ctrl-Cs (the terminal's and the one the
    parent sends on both arrive)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    raise KeyboardInterrupt


def why(err: Exception) -> str:
    """What a job that failed says: the target's or the file's problem, in one line."""
    if isinstance(err, OSError):
        return f"{err.filename or 'file'}: {err.strerror or err}"
    if isinstance(err, TargetError):
        return str(err)
    return f"a job failed: {type(err).__name__}: {err}"


@contextmanager
def ctrl_c_sets(stop: Any, procs: list[Any]) -> Iterator[None]:
    """While inside, Ctrl-C sets the shared stop place to INTERRUPTED and is sent on to
    the jobs started (each stops at once and reports) instead of raising, whenever it
    comes: also while the jobs are being started. Outside the main thread (no signals
    there) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    parent = os.getpid()

    def interrupted(signum: int, frame: Any) -> None:
        if os.getpid() != parent:  # a job just forked, before it set its own handler
            return
        stop.value = INTERRUPTED
        for proc in procs:
            if proc.pid is not None and proc.exitcode is None:
                os.kill(proc.pid, signal.SIGINT)

    previous = signal.signal(signal.SIGINT, interrupted)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def local_messages(campaign: CaseCampaign, jobs: int) -> Generator[JobReport, None, None]:
    """Run the jobs as forked processes on this machine; their messages as they come.

    A job that dies without a word (a target that kills its process) ends the run
    with an error naming it.
    """
    context = multiprocessing.get_context("fork")
    channel = context.Queue()
    stop = context.Value("q", NEVER)
    procs = [
        context.Process(target=local_job, args=(campaign, job, jobs, channel, stop), daemon=True)
        for job in range(jobs)
    ]
    with ctrl_c_sets(stop, procs):
        for proc in procs:
            proc.start()
        yield from messages_of(procs, channel, stop)


def messages_of(procs: list[Any], channel: Any, stop: Any) -> Iterator[JobReport]:
    """The started jobs' messages until every job has finished, or :data:`GRACE`
    seconds after Ctrl-C. A job that dies without a word is a TargetError. The
    processes end with the iteration."""
    finished: set[int] = set()
    interrupted_at: float | None = None
    try:
        while len(finished) < len(procs):
            if stop.value == INTERRUPTED:
                interrupted_at = interrupted_at or time.monotonic()
                if time.monotonic() - interrupted_at > GRACE:
                    return  # a job stuck where Ctrl-C cannot reach: its files are saved
            try:
                message = channel.get(timeout=0.5)
            except queue.Empty:
                dead = [j for j, p in enumerate(procs) if j not in finished and not p.is_alive()]
                if dead and stop.value != INTERRUPTED:
                    code = procs[dead[0]].exitcode
                    raise TargetError(f"job {dead[0]} died (exit code {code})") from None
                continue
            if message.done is not None or message.error is not None:
                finished.add(message.job)
            yield message
    finally:
        for proc in procs:
            if proc.is_alive():
                proc.terminate()
            proc.join()


def ray_messages(
    campaign: CaseCampaign, jobs: int, address: str
) -> Generator[JobReport, None, None]:
    """Run the jobs as Ray tasks on the cluster at ``address`` (``local`` starts one
    on this machine); their messages as they come.

    Each task opens the target on its own node, with this directory on its import
    path (a ``module:function`` target must be importable there: on a cluster without
    a shared file system, install it on every node), and saves replay files there;
    the report saves the kept disagreements again on this machine.
    """
    try:
        import ray
        from ray.util.queue import Empty, Queue
    except ImportError:
        raise TargetError("--ray needs Ray: pip install 'kvhit[ray]'") from None
    if not ray.is_initialized():
        ray.init(
            address=None if address == "local" else address,
            log_to_driver=False,
            logging_level=logging.ERROR,
            runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}},
        )
    channel = Queue()

    @ray.remote
    def task(job: int) -> Tally:
        return run_job(campaign, job, jobs, channel.put)

    pending = {task.remote(job): job for job in range(jobs)}
    while pending:
        done, _ = ray.wait(list(pending), timeout=0.5)
        for ref in done:
            job = pending.pop(ref)
            try:
                tally = ray.get(ref)
            except ray.exceptions.RayTaskError as err:
                raise TargetError(f"job {job} failed on Ray: {err.cause}") from None
            yield JobReport(job, tally.cases, dict(tally.counts), done=tally)
        while True:
            try:
                yield channel.get(block=False)
            except Empty:
                break


def final_tally(label: str, last: JobReport | None) -> Tally:
    """A job's tally: the one it sent when it finished or, for a job ended after
    Ctrl-C before it could report, its last counts and findings, interrupted."""
    if last is not None and last.done is not None:
        return last.done
    if last is None:
        return Tally(label, interrupted=True)
    tally = Tally(label, last.cases, counts=Counter(last.counts), interrupted=True)
    for at, d, path in last.found:
        tally.found_at.append(at)
        tally.found.append(d)
        tally.saved.append(path)
    return tally


def default_jobs() -> int:
    """The number of cores this process may use."""
    return len(os.sched_getaffinity(0))


def run_campaign(
    campaign: CaseCampaign,
    jobs: int,
    ray_address: str | None = None,
    on_progress: OnProgress = lambda tally: None,
) -> Tally:
    """Run ``campaign`` as ``jobs`` jobs (forked here, or on Ray); the merged tally.

    One local job runs in this process. ``on_progress`` gets the cases and counts of
    all jobs together whenever one reports. Raises
    :class:`~kvhit.errors.TargetError` if a job cannot open the target or dies.
    """
    label = campaign.spec.label
    if jobs == 1 and ray_address is None:
        return run_job(
            campaign, 0, 1, lambda p: on_progress(Tally(label, p.cases, counts=Counter(p.counts)))
        )
    messages = (
        ray_messages(campaign, jobs, ray_address)
        if ray_address is not None
        else local_messages(campaign, jobs)
    )
    latest: dict[int, JobReport] = {}
    with closing(messages):  # a job's error ends the jobs here, not when collected
        for message in messages:
            if message.error is not None:
                raise TargetError(message.error)
            if message.job in latest and latest[message.job].done is not None:
                continue  # a late progress message of a job that has finished
            latest[message.job] = message
            so_far = Tally(label, sum(p.cases for p in latest.values()))
            for report in latest.values():
                so_far.counts.update(report.counts)
            on_progress(so_far)
    total = merge(label, [final_tally(label, latest.get(job)) for job in range(jobs)])
    if ray_address is not None and campaign.out is not None:
        total.saved = [total.keep(d, campaign.out) for d in total.found]
    return total
