"""A target for the gate: vLLM, with the documented divergences set aside.

States inside a documented divergence's scope are answered as ``unsupported``, so
any disagreement the gate reports against this target is a new finding:

    cd tests_vllm && kvhit gate --target undocumented:vllm_outside_divergences
"""

from __future__ import annotations

from typing import Any

from divergences import documented

from kvhit.adapters.vllm import vllm_target
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query


def vllm_outside_divergences(query: dict[str, Any]) -> dict[str, Any]:
    """vLLM's answer, or :class:`Unsupported` naming the documented divergence."""
    names = documented(parse_query(query))
    if names:
        raise Unsupported(f"documented divergence: {names[0]}")
    return vllm_target(query)
