"""Naming objects as ``module:attr`` strings, so a layer can name a higher one (a
command, a target) without importing it until it is used.

    >>> import_attr("kvhit.errors:BadInput").__name__
    'BadInput'
    >>> import_attr("kvhit.errors:nothing") is None
    True
"""

from __future__ import annotations

import gc
import importlib
from typing import Any


def import_attr(spec: str) -> Any:
    """Import the module of ``module:attr`` and return its attribute (None if it has
    none); ValueError if ``spec`` is not of that form. Import errors propagate."""
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise ValueError(f"{spec!r}: expected module:attr")
    # The collector waits while the module is imported: on Python 3.11 a finalizer
    # that imports something while this import holds importlib's per-thread record
    # of the lock it waits on deletes that record, and the import fails with a
    # KeyError naming the thread id (seen once in the test suite).
    paused = gc.isenabled()
    gc.disable()
    try:
        module = importlib.import_module(module_name)
    finally:
        if paused:
            gc.enable()
    return getattr(module, attr, None)
