"""A stateful target for the gate: vLLM's KVCacheManager, with the documented lookup
divergences set aside.

An engine whose configuration (groups and alignment) is inside a documented
divergence's scope (:mod:`kvhit.engines.vllm.divergences`, for the installed
release) is refused as ``unsupported``, so anything
the stateful gate reports against this target is a new finding:

    cd tests_vllm && kvhit gate --stateful --target stateful_undocumented:manager_outside_divergences
"""

from __future__ import annotations

from typing import Any

from kvhit.engines.vllm.divergences import documented
from kvhit.engines.vllm.manager import VllmManagerEngine
from kvhit.engines.vllm.target import RELEASE
from kvhit.errors import Unsupported
from kvhit.model.spec import Query
from kvhit.targets.stateful import Program


def manager_outside_divergences(config: dict[str, Any]) -> VllmManagerEngine:
    """vLLM's manager for ``config``, or :class:`Unsupported` naming the documented
    divergence whose scope holds it (the scopes only read the groups and alignment)."""
    program = Program.from_json(config)
    empty = Query(program.groups, tuple(() for _ in program.groups), 0, 1, program.alignment)
    names = documented(empty, RELEASE.name)
    if names:
        raise Unsupported(f"documented divergence: {names[0]}")
    return VllmManagerEngine(config)
