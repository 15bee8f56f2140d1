"""The worker process behind ``--isolate``: ``python -m kvhit.targets.worker TARGET``.

It loads TARGET (a built-in or ``module:function``), writes ``{"ready": true}`` (or
``{"error": why}`` and exits 2), then reads one normalized query per line on stdin and
writes one line per query on stdout: ``{"answer": value}``, ``{"unsupported": why}``,
or ``{"crash": "TypeError: ..."}`` when the target raised. Anything the target
prints, from Python or from native code, goes to stderr, so stdout carries only
these lines. If the target kills the process, the parent sees the worker end.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from typing import Any, TextIO

from kvhit.errors import TargetError, Unsupported
from kvhit.targets.registry import load


def answer_line(func: Callable[[dict[str, Any]], Any], query: dict[str, Any]) -> str:
    """The reply line for one query."""
    try:
        out = {"answer": func(query)}
    except Unsupported as err:
        out = {"unsupported": str(err)}
    except Exception as err:  # the target's own bug: the parent reports it as a crash
        out = {"crash": f"{type(err).__name__}: {err}"}
    return json.dumps(out, default=repr)


def protocol_stdout() -> TextIO:
    """A private copy of stdout for the protocol; fd 1 then points at stderr."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(name: str) -> int:
    """Load the target and answer queries until stdin ends; the exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    out = protocol_stdout()
    try:
        func = load(name)
    except TargetError as err:
        print(json.dumps({"error": str(err)}), file=out, flush=True)
        return 2
    print(json.dumps({"ready": True}), file=out, flush=True)
    for line in sys.stdin:
        print(answer_line(func, json.loads(line)), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1]))
