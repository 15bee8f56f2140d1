"""Calling a target: a Python callable or a JSON-lines subprocess, with a limit on its
loading and another on each call.

Every call returns a :class:`Reply`: the target's raw answer, or what went wrong
(``crash``, ``timeout``, ``unsupported``, or ``bad_return`` when a subprocess printed
something that is not JSON). Judging the answer is :mod:`kvhit.harness.compare`'s job.

A Python target runs in this process (:class:`CallableRunner`), or isolated in a
worker process (:class:`IsolatedRunner`, ``--isolate``), where a target that
segfaults or calls ``os._exit`` ends only its worker: that call is a ``crash``, and
the next call starts a new worker. A program (``--target-cmd``) always runs in its
own process (:class:`CommandRunner`); the last lines of its stderr go into a crash's
detail. Child processes get their own process group, so Ctrl-C reaches kvhit only
and the run can end with its summary. Which runner a target gets is
:meth:`kvhit.targets.target_spec.TargetSpec.open`'s choice.

Loading a target (importing it, starting its worker or its program) is not answering
a query: it has its own limit (:data:`LOAD_TIMEOUT`, ``--load-timeout``), and the
per-call limit (:data:`CALL_TIMEOUT`, ``--timeout``) counts the call alone. A Python
target's stdout is never kvhit's: while it is loaded or called, what it prints is
kept aside (:class:`TargetOutput`) and the end of it goes into a crash's detail.

    >>> from kvhit.targets.registry import model_target
    >>> runner = CallableRunner(model_target, CALL_TIMEOUT)
    >>> runner({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...         "cached": [[True]], "max_length": 1, "num_tokens": 2, "alignment": 1})
    Reply(status='answer', value={'length': 1, 'blocks': [[0]]}, detail='')
    >>> runner.capabilities.tiers
    True
"""

from __future__ import annotations

import io
import json
import os
import selectors
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal, TextIO

from kvhit.contract import BASE, Capabilities, LookupTarget, capabilities_of, lookup_target
from kvhit.errors import TargetError, Unsupported, described, raised_at
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Query
from kvhit.targets import registry
from kvhit.targets.registry import Mode
from kvhit.targets.stateful import EngineHost, Message
from kvhit.targets.steps import StepMessage
from kvhit.targets.wire import BadReturn

Target = LookupTarget | EngineHost
"""What a runner in this process calls: a lookup target, or a host of stateful
messages (:class:`kvhit.targets.stateful.EngineHost`)."""

Sent = dict[str, Any] | Query | Message | StepMessage
"""What a runner is handed: a protocol message, a parsed query, or a typed stateful
message (:data:`kvhit.targets.stateful.Message`)."""

CALL_TIMEOUT = 10.0
LOAD_TIMEOUT = 120.0  # importing a target, or starting its worker or program
OUTPUT_LINES = 8  # how much of a program's stderr, or a target's stdout, a crash keeps
KEPT_CHARS = 8192  # how much of what a target prints in one call is kept


ReplyStatus = Literal["answer", "crash", "timeout", "unsupported", "bad_return"]


@dataclass(frozen=True)
class Reply:
    """What one call gave back.

    ``status`` is ``answer`` (``value`` holds the decoded answer), ``crash``,
    ``timeout``, ``unsupported`` or ``bad_return``; ``detail`` says more for a person.
    """

    status: ReplyStatus
    value: Any = None
    detail: str = ""


class CallTimeout(BaseException):
    """A Python target ran past its limit.

    A BaseException, so a target's own ``except Exception`` does not swallow it.
    """


def expire(signum: int, frame: Any) -> None:
    """SIGALRM's handler while a time limit runs: the call is over."""
    raise CallTimeout


@contextmanager
def alarm_handler() -> Iterator[None]:
    """:func:`expire` handles SIGALRM in the block (on the main thread), and what
    handled it before does again after. Time limits inside the block (one per call of a
    campaign) find it in place and leave it there, rather than set it up per call."""
    if signal.getsignal(signal.SIGALRM) is expire or not on_main_thread():
        yield
        return
    previous = signal.signal(signal.SIGALRM, expire)
    try:
        yield
    finally:
        signal.signal(signal.SIGALRM, previous)


def on_main_thread() -> bool:
    """Whether this is the main thread, the only one SIGALRM interrupts."""
    return threading.current_thread() is threading.main_thread()


@contextmanager
def time_limit(seconds: float | None) -> Iterator[None]:
    """Raise :class:`CallTimeout` in the block if it runs longer than ``seconds`` (None:
    no limit).

    Uses SIGALRM, so the limit applies only on the main thread (elsewhere the block
    runs unlimited), and it interrupts Python code, not a single long call into C.
    """
    if seconds is None or not on_main_thread():
        yield
        return
    with alarm_handler():
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)


class TargetOutput(io.TextIOBase):
    """``sys.stdout`` while a Python target is loaded or called (:func:`captured`): what
    the thread running the target writes is kept (its last :data:`KEPT_CHARS`
    characters), and what other threads write (kvhit's progress display) goes on to the
    stdout it stands in for. A logger that took this object as its stream keeps it, so
    the target's later log lines are kept too.
    """

    encoding = "utf-8"
    errors = "strict"

    def __init__(self) -> None:
        super().__init__()
        self.passed: TextIO = sys.stdout
        self.owner: threading.Thread | None = None
        self.kept = ""

    def writable(self) -> bool:
        """It takes text."""
        return True

    def write(self, text: str) -> int:
        """Keep ``text`` if the target's thread wrote it, else pass it on."""
        if threading.current_thread() is self.owner:
            self.kept = (self.kept + text)[-KEPT_CHARS:]
        else:
            self.passed.write(text)
        return len(text)

    def flush(self) -> None:
        """Flush what is passed on."""
        if threading.current_thread() is not self.owner:
            self.passed.flush()

    def isatty(self) -> bool:
        """Whether the stdout it stands in for is a terminal (the progress display
        asks)."""
        return self.passed.isatty()


TARGET_OUTPUT = TargetOutput()


@contextmanager
def captured() -> Iterator[TargetOutput]:
    """While inside, ``sys.stdout`` is :data:`TARGET_OUTPUT`, keeping what this thread
    prints (and only that: it starts empty); the stdout it replaced comes back after."""
    out = TARGET_OUTPUT
    replaced = sys.stdout
    if replaced is not out:
        out.passed = replaced
    out.owner, out.kept = threading.current_thread(), ""
    sys.stdout = out
    try:
        yield out
    finally:
        out.owner = None
        sys.stdout = replaced


def last_lines(text: str, intro: str) -> str:
    """``intro`` and the last :data:`OUTPUT_LINES` lines of ``text``, to end a crash's
    detail; nothing when ``text`` is blank.

    >>> last_lines("a\\nb\\n", "it printed on stdout")
    '; it printed on stdout, ending with:\\na\\nb'
    """
    lines = text.strip().splitlines()
    if not lines:
        return ""
    return f"; {intro}, ending with:\n" + "\n".join(lines[-OUTPUT_LINES:])


def size_of(message: dict[str, Any]) -> str:
    """How large a query (or a stateful message) is, for a message about memory.

    >>> size_of({"groups": [{}, {}], "cached": [[True] * 3, [False] * 3], "max_length": 3000})
    'a query of 2 groups, 6 blocks in all, M=3,000'
    >>> size_of({"op": "admit", "request": 0, "tokens": [1]})
    'an admit of 1 token'
    """
    if "cached" in message:
        blocks = sum(len(row) for row in message["cached"])
        groups = counted(len(message["groups"]), "group")
        return (
            f"a query of {groups}, {counted(blocks, 'block')} in all, M={message['max_length']:,}"
        )
    if "tokens" in message:
        return f"an admit of {counted(len(message['tokens']), 'token')}"
    return f"a message of {counted(len(json.dumps(message, default=repr)), 'character')}"


def counted(n: int, thing: str) -> str:
    """``n`` things, ``1 thing``."""
    return f"{n:,} {thing}{'' if n == 1 else 's'}"


def crash_detail(err: Exception, message: Sent) -> str:
    """What a target's exception says: its type, message and where it was raised; for
    a MemoryError (whose message is often empty) also the line that was running and
    the size of what the target was given."""
    if not isinstance(err, MemoryError):
        return described(err)
    traceback.clear_frames(err.__traceback__)  # free what the target allocated
    frame = raised_at(err)
    running = f" running `{frame.line}`" if frame is not None and frame.line else ""
    as_json = message if isinstance(message, dict) else message.to_json()
    return f"{described(err)}: out of memory{running} on {size_of(as_json)}"


def call_target(func: Target, message: Sent, limit: float | None = None) -> Reply:
    """Call a Python target on one message within ``limit`` seconds (None: no limit),
    its stdout kept aside: its answer, or why there is none."""
    with captured() as out:
        try:
            with time_limit(limit):
                value = answer_of(func, message)
        except CallTimeout:
            return Reply("timeout", detail=f"no answer within {limit:g} s")
        except Unsupported as err:
            return Reply("unsupported", detail=str(err))
        except Exception as err:  # the target's own bug is what we are looking for
            detail = crash_detail(err, message) + last_lines(out.kept, "it printed on stdout")
            return Reply("crash", detail=detail)
    return Reply("answer", value)


def answer_of(func: Target, message: Sent) -> Any:
    """What ``func`` answers to ``message``: a lookup target is asked the query (a
    protocol message is parsed first, at the process boundary), a host of stateful
    messages gets the typed message. (A concrete class is tested first: testing a
    runtime protocol costs more than many a target's answer.)"""
    if isinstance(func, EngineHost):
        assert not isinstance(message, dict | Query), "a stateful host takes typed messages"
        return func(message)
    return func.ask(message if isinstance(message, Query) else parse_query(message))


def load_overrun(name: str, limit: float, where: str = "") -> str:
    """The error of a target whose loading ran past ``limit``."""
    return (
        f"target {name!r}: loading it{where} took longer than the load limit of "
        f"{limit:g} s (--load-timeout)"
    )


def load_within(
    name: str, mode: Mode, limit: float, options: Mapping[str, str] | None = None
) -> tuple[Any, float]:
    """Target ``name`` in ``mode`` with ``options`` loaded here
    (:func:`kvhit.targets.registry.load`) within ``limit`` seconds, what it prints kept
    aside; it and the seconds loading took.

    Raises :class:`~kvhit.errors.TargetError` if it cannot be loaded, or not in time.
    """
    start = time.monotonic()
    with captured():
        try:
            with time_limit(limit):
                func = registry.load(name, mode, options)
        except CallTimeout:
            raise TargetError(load_overrun(name, limit)) from None
    return func, time.monotonic() - start


class CallableRunner:
    """Calls a Python target in this process (a lookup target, or a plain function of
    protocol messages, taken as a :class:`~kvhit.contract.FunctionTarget`; or a host of
    stateful messages); ``capabilities`` is what it declares; ``load_seconds`` is how
    long loading it took (None when it was handed over loaded)."""

    def __init__(self, func: Any, timeout: float, load_seconds: float | None = None):
        self.func: Target = (
            func if isinstance(func, LookupTarget | EngineHost) else lookup_target(func)
        )
        self.capabilities: Capabilities = capabilities_of(self.func)
        self.timeout = timeout
        self.load_seconds = load_seconds

    def __call__(self, query: Sent) -> Reply:
        return call_target(self.func, query, self.timeout)

    def ask(self, q: Query) -> Reply:
        """The target's reply to a parsed lookup query (a built-in is handed it as it is)."""
        return call_target(self.func, q, self.timeout)

    def close(self) -> None:
        """Nothing to release."""


class CommandRunner:
    """Talks to a program over JSON lines: one query per line in, one answer per line out.

    A program that hangs past the limit is killed and started again for the next
    call; one that exits is started again too. The first answer after a start may
    take ``load_timeout`` seconds longer (the program's own start-up: kvhit cannot
    tell it from the answer). An answer ``{"unsupported": "why"}`` is the program's
    way of refusing a configuration. The program's stderr goes to a temporary file; a
    crash's detail ends with its last :data:`OUTPUT_LINES` lines.
    """

    def __init__(
        self, command: str | list[str], timeout: float, load_timeout: float = LOAD_TIMEOUT
    ):
        self.argv = shlex.split(command) if isinstance(command, str) else command
        if not self.argv:
            raise TargetError("--target-cmd: empty command")
        self.timeout = timeout
        self.load_timeout = load_timeout
        self.load_seconds: float | None = None
        self.capabilities: Capabilities = BASE
        self.proc: subprocess.Popen[bytes] | None = None
        self.pending = b""
        self.stderr: Any = None

    def _start(self) -> subprocess.Popen[bytes]:
        self.pending = b""
        self.stderr = tempfile.TemporaryFile()
        try:
            return subprocess.Popen(
                self.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self.stderr,
                process_group=0,
            )
        except OSError as err:
            raise TargetError(
                f"--target-cmd: cannot start {self.argv[0]!r} ({err.strerror})"
            ) from None

    def start_allowance(self) -> float:
        """The time a first answer after a start gets on top of the call limit."""
        return self.load_timeout

    def stderr_tail(self) -> str:
        """The end of what the program wrote to stderr, for a crash's detail."""
        if self.stderr is None:
            return ""
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - KEPT_CHARS))
        return last_lines(self.stderr.read().decode(errors="replace"), "its stderr")

    def crashed(self, what: str) -> Reply:
        """A crash: ``what`` happened, then the program's last stderr lines; the
        program is stopped (the next call starts it again)."""
        tail = self.stderr_tail()
        self.close()
        return Reply("crash", detail=what + tail)

    def reply_for(self, value: Any) -> Reply:
        """The reply a decoded answer line stands for."""
        if isinstance(value, dict) and set(value) == {"unsupported"}:
            return Reply("unsupported", detail=str(value["unsupported"]))
        return Reply("answer", value)

    def _read_line(self, proc: subprocess.Popen[bytes], limit: float) -> bytes | None:
        """One line of output (empty at end of output), or None when the limit passes.

        Reads the pipe unbuffered, so a partial line never blocks the wait.
        """
        assert proc.stdout is not None
        fd = proc.stdout.fileno()
        deadline = time.monotonic() + limit
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            while b"\n" not in self.pending:
                left = deadline - time.monotonic()
                if left <= 0 or not sel.select(left):
                    return None
                chunk = os.read(fd, 1 << 16)
                if not chunk:
                    return b""
                self.pending += chunk
        line, _, self.pending = self.pending.partition(b"\n")
        return line + b"\n"

    def ask(self, q: Query) -> Reply:
        """The program's reply to a parsed lookup query, sent as JSON."""
        return self(q.to_json())

    def __call__(self, query: Sent) -> Reply:
        """The program's reply to a protocol message, or to a stateful message (sent as
        its JSON, the line read back as its typed answer: :meth:`decoded`)."""
        allowance = 0.0
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
            allowance = self.start_allowance()
        proc = self.proc
        assert proc.stdin is not None
        try:
            sent = query if isinstance(query, dict) else query.to_json()
            proc.stdin.write(json.dumps(sent).encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self.crashed("the program exited before reading the query")
        line = self._read_line(proc, self.timeout + allowance)
        if line is None:
            self.close(kill=True)
            started = f" (and {allowance:g} s for its start, --load-timeout)" if allowance else ""
            return Reply(
                "timeout",
                detail=f"no answer within {self.timeout:g} s{started}; program restarted",
            )
        if not line:
            return self.crashed(exit_text(proc.wait()))
        text = line.decode(errors="replace").strip()
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return Reply(
                "bad_return",
                text,
                f"not JSON: {text[:80]!r} (stdout carries only answers; "
                "print anything else to stderr)",
            )
        reply = self.reply_for(value)
        if isinstance(query, dict | Query) or reply.status != "answer":
            return reply
        return self.decoded(query, reply)

    @staticmethod
    def decoded(message: Message | StepMessage, reply: Reply) -> Reply:
        """A stateful answer line as ``message``'s typed answer, or ``bad_return``."""
        try:
            return Reply("answer", message.decode(reply.value))
        except BadReturn as err:
            return Reply("bad_return", reply.value, str(err))

    def close(self, kill: bool = False) -> None:
        """Stop the program: end its input and wait a moment, then kill it (at once
        with ``kill``)."""
        proc, self.proc = self.proc, None
        if self.stderr is not None:
            self.stderr.close()
            self.stderr = None
        if proc is None:
            return
        try:
            proc.stdin.close()  # type: ignore[union-attr]
        except OSError:
            pass
        try:
            proc.wait(timeout=0 if kill else 0.5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def exit_text(code: int) -> str:
    """How a program ended, for people: ``exited with code 3``, ``killed by SIGSEGV``."""
    if code < 0:
        try:
            return f"the program was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"the program was killed by signal {-code}"
    return f"the program exited with code {code}"


class IsolatedRunner(CommandRunner):
    """Calls a Python target in a worker process (:mod:`kvhit.targets.worker`).

    The worker loads the target, says it is ready with the data of its capabilities
    (their rules stay in the worker, which answers what they refuse ``unsupported``),
    then answers one query per line
    with ``{"answer": ...}``, ``{"unsupported": why}`` or ``{"crash": what}`` (the
    target raised). A worker that dies or hangs is a ``crash`` or ``timeout`` of that
    call and is started again for the next. The target is loaded at once, within
    ``load_timeout`` seconds (``load_seconds`` says how long it took), so a target that
    cannot be loaded is a :class:`TargetError` before any query, and each call's limit
    counts the call alone.
    """

    def __init__(
        self,
        name: str,
        timeout: float,
        load_timeout: float = LOAD_TIMEOUT,
        options: Mapping[str, str] | None = None,
    ):
        argv = [sys.executable, "-m", "kvhit.targets.worker", name, json.dumps(options or {})]
        super().__init__(argv, timeout, load_timeout)
        self.name = name
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        start = time.monotonic()
        proc = super()._start()
        try:
            line = self._read_line(proc, self.load_timeout)
        except BaseException:  # Ctrl-C while the worker loads: end the worker too
            self.proc = proc
            self.close(kill=True)
            raise
        hello = json.loads(line) if line else None
        if not isinstance(hello, dict) or "ready" not in hello:
            self.proc = proc
            if line is None:
                reason = load_overrun(self.name, self.load_timeout, " in a worker")
            elif isinstance(hello, dict):
                reason = hello["error"]
            else:
                reason = "the worker did not start"
            tail = self.stderr_tail()
            self.close(kill=True)
            raise TargetError(reason + tail)
        self.capabilities = Capabilities.from_json(hello["capabilities"])
        self.load_seconds = time.monotonic() - start
        return proc

    def start_allowance(self) -> float:
        """Nothing: the worker said it was ready before the query went out."""
        return 0.0

    def reply_for(self, value: Any) -> Reply:
        if isinstance(value, dict) and "crash" in value:
            return Reply("crash", detail=str(value["crash"]))
        if isinstance(value, dict) and "answer" in value:
            return Reply("answer", value["answer"])
        return super().reply_for(value)


Runner = CallableRunner | CommandRunner
