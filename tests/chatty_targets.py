"""Targets that print, log, or run out of memory, for tests/test_signals_targets.py.

Each answers one normalized protocol query as a lookup target does. The module
prints a line and sets up a logger on stdout when it is imported, as engines do.
"""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

from kvhit.errors import Unsupported
from kvhit.targets.registry import model_target

print("chatty_targets: loading the engine")
LOG = logging.getLogger("chatty_targets")
LOG.addHandler(logging.StreamHandler(sys.stdout))  # the stream as it is at import
LOG.propagate = False
LIBC = ctypes.CDLL(None)


def one_group(query: dict[str, Any]) -> None:
    """Refuse queries of more than one group (keeps the runs short)."""
    if len(query["groups"]) > 1:
        raise Unsupported("one group only")


def chatty(query: dict[str, Any]) -> Any:
    """The reference, printing and logging a debug line on every call."""
    print(f"debug: M={query['max_length']}")
    LOG.warning("chatty_targets: looked up M=%d", query["max_length"])
    one_group(query)
    return model_target(query)


def boom(query: dict[str, Any]) -> Any:
    """Prints what it is about to do, then crashes on a mamba group."""
    one_group(query)
    print(f"boom: about to look up {query['groups'][0]['kind']}")
    if query["groups"][0]["kind"] == "mamba":
        raise RuntimeError("no state for block -1")
    return model_target(query)


def native_chatty(query: dict[str, Any]) -> Any:
    """The reference, printing from native code (C's printf, buffered by C) on every call."""
    LIBC.printf(b"native: looked up\n")
    one_group(query)
    return model_target(query)


def allocates(query: dict[str, Any]) -> Any:
    """Asks for far more memory than any machine has: a MemoryError with no message."""
    history = bytearray(query["max_length"] << 50)
    return len(history)
