"""A stateful target for the gate: vLLM's KVCacheManager, with the documented lookup
divergences set aside.

Before each ``admit`` the engine reads its own cache state for the request (the
snapshot the stateful gate judges the hit against) and refuses the request as
``unsupported`` when that lookup, as a stateless query, is inside a documented
divergence's scope (:mod:`kvhit.engines.vllm.divergences`, for the installed release):
the same filter as the stateless target ``vllm-undocumented``, so anything the stateful
gate reports against this target is a new finding:

    cd tests_vllm && kvhit gate --stateful --target stateful_undocumented:manager_outside_divergences
"""

from __future__ import annotations

from collections.abc import Sequence

from kvhit.contract import Admitted, EngineConfig, Rejected
from kvhit.engines.vllm.divergences import documented
from kvhit.engines.vllm.manager import VllmManagerEngine
from kvhit.engines.vllm.target import RELEASE
from kvhit.errors import Unsupported
from kvhit.model.spec import Query


class ManagerOutsideDivergences(VllmManagerEngine):
    """vLLM's manager, refusing each request whose lookup a documented divergence of the
    installed release covers."""

    def __init__(self, config: EngineConfig):
        self.config = config
        super().__init__(config)

    def lookup_query(self, tokens: Sequence[int]) -> Query:
        """The request's lookup as the stateful gate judges it: the engine's own cache
        state for these tokens, M = T - 1."""
        c, t = self.config, len(tokens)
        return Query(c.groups, self.snapshot(tokens).cached, t - 1, t, c.alignment, c.hash_unit)

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """vLLM's admit, or :class:`Unsupported` naming the documented divergence whose
        scope holds the request's lookup."""
        names = documented(self.lookup_query(tokens), RELEASE.name)
        if names:
            raise Unsupported(f"documented divergence: {names[0]}")
        return super().admit(request, tokens)


def manager_outside_divergences(config: EngineConfig) -> ManagerOutsideDivergences:
    """vLLM's manager for ``config``, refusing the requests of documented divergences."""
    return ManagerOutsideDivergences(config)
