"""The worker process behind ``--isolate``: ``python -m kvhit.targets.worker TARGET
OPTIONS`` (OPTIONS: the built-in's options as a JSON object).

It loads TARGET (a built-in or ``module:function``), writes ``{"ready": true,
"capabilities": {...}}`` (the data of what it declares, :class:`kvhit.contract.Capabilities`; or
``{"error": why}`` and exits 2), then reads one normalized query per line on stdin and
writes one line per query on stdout: ``{"answer": value}``, ``{"unsupported": why}``,
or ``{"crash": "TypeError: ..."}`` when the target raised. Stdout carries only these
lines: what the target prints from Python while it is loaded or called is kept aside
as in kvhit's own process (and the end of it goes into a crash's line), and anything
else written to the process's stdout (native code, other threads) goes to stderr. If
the target kills the process, the parent sees the worker end. The parent times the
loading (``--load-timeout``) and each call (``--timeout``).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from typing import Any, TextIO

from kvhit.contract import LookupTarget
from kvhit.errors import TargetError
from kvhit.targets.registry import load
from kvhit.targets.runner import call_target, captured


def answer_line(func: LookupTarget, query: dict[str, Any]) -> str:
    """The reply line for one query.

    >>> from kvhit.contract import lookup_target
    >>> answer_line(lookup_target(lambda q: 1 // 0), {"groups": [{"kind": "full", "block_size": 1}],
    ...                                               "cached": [""], "max_length": 1})
    '{"crash": "ZeroDivisionError: integer division or modulo by zero (raised at ...)"}'
    """
    reply = call_target(func, query)
    out = {"answer": reply.value} if reply.status == "answer" else {reply.status: reply.detail}
    return json.dumps(out, default=repr)


def protocol_stdout() -> TextIO:
    """A private copy of stdout for the protocol; fd 1 then points at stderr."""
    out = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    return out


def serve(name: str, options: dict[str, str]) -> int:
    """Load the target with ``options`` and answer queries until stdin ends; the exit code."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    out = protocol_stdout()
    try:
        with captured():
            func = load(name, options=options)
    except TargetError as err:
        print(json.dumps({"error": str(err)}), file=out, flush=True)
        return 2
    hello = {"ready": True, "capabilities": func.capabilities.to_json()}
    print(json.dumps(hello), file=out, flush=True)
    for line in sys.stdin:
        print(answer_line(func, json.loads(line)), file=out, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve(sys.argv[1], json.loads(sys.argv[2]) if len(sys.argv) > 2 else {}))
