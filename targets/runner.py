"""Calling a target: a Python callable or a JSON-lines subprocess, with a per-call limit.

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
:meth:`kvhit.targets.spec.TargetSpec.open`'s choice.

    >>> from kvhit.targets.registry import model_target
    >>> runner = CallableRunner(model_target, CALL_TIMEOUT)
    >>> runner({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...         "cached": [[True]], "max_length": 1, "num_tokens": 2, "alignment": 1})
    Reply(status='answer', value={'length': 1, 'blocks': [[0]]}, detail='')
"""

from __future__ import annotations

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
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

from kvhit.errors import TargetError, Unsupported

CALL_TIMEOUT = 10.0
STARTUP_GRACE = 5.0  # extra time for a program's first answer after it starts
WORKER_STARTUP = 120.0  # a worker imports kvhit and the target before it is ready
STDERR_LINES = 8  # how much of a program's stderr a crash keeps


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
    """A Python target ran past its per-call limit.

    A BaseException, so a target's own ``except Exception`` does not swallow it.
    """


@contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`CallTimeout` in the block if it runs longer than ``seconds``.

    Uses SIGALRM, so the limit applies only on the main thread (elsewhere the block
    runs unlimited), and it interrupts Python code, not a single long call into C.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def expire(signum: int, frame: Any) -> None:
        raise CallTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


class CallableRunner:
    """Calls a Python target in this process."""

    def __init__(self, func: Callable[[dict[str, Any]], Any], timeout: float):
        self.func = func
        self.timeout = timeout

    def __call__(self, query: dict[str, Any]) -> Reply:
        try:
            with time_limit(self.timeout):
                value = self.func(query)
        except CallTimeout:
            return Reply("timeout", detail=f"no answer within {self.timeout:g} s")
        except Unsupported as err:
            return Reply("unsupported", detail=str(err))
        except Exception as err:  # the target's own bug is what we are looking for
            return Reply("crash", detail=f"{type(err).__name__}: {err}")
        return Reply("answer", value)

    def close(self) -> None:
        """Nothing to release."""


class CommandRunner:
    """Talks to a program over JSON lines: one query per line in, one answer per line out.

    A program that hangs past the limit is killed and started again for the next
    call; one that exits is started again too. The first answer after a start may
    take :data:`STARTUP_GRACE` seconds longer (the program's own start-up). An answer
    ``{"unsupported": "why"}`` is the program's way of refusing a configuration. The
    program's stderr goes to a temporary file; a crash's detail ends with its last
    :data:`STDERR_LINES` lines.
    """

    def __init__(self, command: str | list[str], timeout: float):
        self.argv = shlex.split(command) if isinstance(command, str) else command
        if not self.argv:
            raise TargetError("--target-cmd: empty command")
        self.timeout = timeout
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

    def stderr_tail(self) -> str:
        """The last lines the program wrote to stderr, for a crash's detail."""
        if self.stderr is None:
            return ""
        self.stderr.seek(0, os.SEEK_END)
        self.stderr.seek(max(0, self.stderr.tell() - 8192))
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return "\n".join(lines[-STDERR_LINES:])

    def crashed(self, what: str) -> Reply:
        """A crash: ``what`` happened, then the program's last stderr lines; the
        program is stopped (the next call starts it again)."""
        tail = self.stderr_tail()
        self.close()
        return Reply("crash", detail=f"{what}; its stderr ended with:\n{tail}" if tail else what)

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

    def __call__(self, query: dict[str, Any]) -> Reply:
        limit = self.timeout
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
            limit += STARTUP_GRACE
        proc = self.proc
        assert proc.stdin is not None
        try:
            proc.stdin.write(json.dumps(query).encode() + b"\n")
            proc.stdin.flush()
        except BrokenPipeError:
            return self.crashed("the program exited before reading the query")
        line = self._read_line(proc, limit)
        if line is None:
            self.close(kill=True)
            return Reply(
                "timeout", detail=f"no answer within {self.timeout:g} s (program restarted)"
            )
        if not line:
            return self.crashed(exit_text(proc.wait()))
        text = line.decode(errors="replace").strip()
        try:
            value = json.loads(text)
        except (json.JSONDecodeError, RecursionError):
            return Reply("bad_return", text, f"not JSON: {text[:80]!r}")
        return self.reply_for(value)

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

    The worker loads the target, says it is ready, then answers one query per line
    with ``{"answer": ...}``, ``{"unsupported": why}`` or ``{"crash": what}`` (the
    target raised). A worker that dies or hangs is a ``crash`` or ``timeout`` of that
    call and is started again for the next. The target is loaded at once, so a target
    that cannot be loaded is a :class:`TargetError` before any query.
    """

    def __init__(self, name: str, timeout: float):
        super().__init__([sys.executable, "-m", "kvhit.targets.worker", name], timeout)
        self.proc = self._start()

    def _start(self) -> subprocess.Popen[bytes]:
        proc = super()._start()
        line = self._read_line(proc, WORKER_STARTUP)
        hello = json.loads(line) if line else None
        if not isinstance(hello, dict) or "ready" not in hello:
            self.proc = proc
            reason = hello["error"] if isinstance(hello, dict) else "the worker did not start"
            tail = self.stderr_tail()
            self.close(kill=True)
            raise TargetError(f"{reason}\n{tail}".strip())
        return proc

    def reply_for(self, value: Any) -> Reply:
        if isinstance(value, dict) and "crash" in value:
            return Reply("crash", detail=str(value["crash"]))
        if isinstance(value, dict) and "answer" in value:
            return Reply("answer", value["answer"])
        return super().reply_for(value)


Runner = CallableRunner | CommandRunner
