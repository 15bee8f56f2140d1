"""kvhit's own vLLM KV connector: a scheduler-role ``KVConnectorBase_V1`` that reports
the external hit a tiered query says.

vLLM's scheduler asks its connector one question per new request
(``get_num_new_matched_tokens(request, num_computed_tokens)``): how many tokens past
the local boundary vLLM hands it can be loaded from outside the pool. This connector
answers from the query's tiers (docs/design.md §1.7), for the groups whose kind some
tier holds, and for those only, as a real connector does (LMCache holds attention KV,
not Mamba states): the answer is the longest extension E such that the local
boundary B plus E is a candidate (a multiple of A, at most M) through which the tiers
hold those groups' tokens contiguously, every unit of attention KV from B to B + E and
the Mamba state at B + E (:func:`external_hit`; the connector cannot see the pool, so
it trusts vLLM's boundary). Groups no tier holds are not looked at: whether the hit is
valid for them is left to vLLM's scheduler, which is what kvhit checks.

Capability flags are switchable (vLLM reads them; kvhit's target sets them from its
option ``divergent``, :data:`kvhit.engines.vllm.options.DIVERGENT`):

- ``supports_divergent_local_hybrid_hits`` (``KVConnectorBase_V1``, vLLM 0.28.0+;
  ``v1/core/sched/scheduler.py`` ``_get_local_prefix_cache_hit``): ``on``, ``off``, or
  ``auto`` (the default), which claims it when some tier holds the Mamba kind, as
  vLLM's NIXL, Mooncake and MoRIIO connectors claim it when they carry the recurrent
  state.
- ``SupportsHMA`` (every release): always, since vLLM turns its hybrid KV cache
  manager off for a connector without it, and a Mamba model cannot run then.

The connector never transfers KV (the scheduler role only decides); its worker-role
methods refuse to run. What it was asked and what it answered are kept
(:attr:`TieredConnector.asked`, :attr:`TieredConnector.loaded`) for the target to
report.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvhit.engines.vllm.options import DivergentHits
from kvhit.engines.vllm.release import import_failure
from kvhit.model.ops import PY
from kvhit.model.spec import Group, Kind, Query, fine_query, held_query, reused_blocks

try:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import (
        KVConnectorBase_V1,
        KVConnectorMetadata,
        KVConnectorRole,
        SupportsHMA,
    )
except ImportError as err:
    raise import_failure(err) from None


def tier_held(q: Query) -> tuple[bool, ...]:
    """Per group, whether some tier of ``q`` holds its kind."""
    return tuple(any(g.kind in t.holds for t in q.tiers) for g in q.groups)


def external_query(q: Query) -> Query:
    """What ``q``'s tiers hold, at hash-unit granularity (:func:`fine_query`): each
    local row emptied, the tiers folded in (:func:`kvhit.model.spec.held_query`)."""
    return fine_query(held_query(replace(q, cached=tuple(() for _ in q.cached))))


def holds_through(g: Group, row: Any, boundary: int, length: int) -> bool:
    """Whether a tier's fine row (block size h) holds group g's tokens from
    ``boundary`` to ``length``: every unit of attention KV in between (as a store of
    chunks counts them), or a Mamba group's state at ``length``."""
    h = g.block_size
    if g.kind == Kind.MAMBA:
        return PY.bit(row, length // h - 1)
    return bool(PY.all_cached(row, boundary // h, -(-length // h)))


def extends_to(q: Query, boundary: int, length: int) -> bool:
    """Whether the tiers hold every group they hold a kind of from ``boundary`` to
    ``length`` (:func:`holds_through`)."""
    ext = external_query(q)
    return all(
        holds_through(g, row, boundary, length)
        for g, row, held in zip(ext.groups, ext.cached, tier_held(q))
        if held
    )


def external_hit(q: Query, boundary: int) -> int:
    """The tokens the tiers hold contiguously past the local ``boundary``, for the
    groups whose kind they hold: the longest E ≥ 0 such that ``boundary + E`` is a
    candidate through which they hold them (:func:`extends_to`), E = 0 if none is.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 2}],
    ...                  "cached": ["1"], "max_length": 7, "alignment": 2,
    ...                  "tiers": [{"name": "host", "holds": ["full"], "cached": {"0": "0110"}}]})
    >>> external_hit(q, 2)
    4
    """
    if not any(tier_held(q)):
        return 0
    longer = (length for length in q.candidates() if length > boundary)
    return next((n - boundary for n in longer if extends_to(q, boundary, n)), 0)


def loaded_blocks(q: Query, local: int, length: int) -> list[list[int]]:
    """Per group, the blocks the connector loads for a hit of ``length`` that vLLM
    settled on with ``local`` tokens from its pool: for the groups a tier holds, those
    the group reads at ``length`` (:func:`kvhit.model.spec.reused_blocks`, unit by
    unit) from the local boundary on, where a tier holds them; in the query's own
    blocks."""
    ext = external_query(q)
    loads: list[list[int]] = []
    for g, unit, row, held in zip(q.groups, ext.groups, ext.cached, tier_held(q)):
        h = unit.block_size
        read = reused_blocks(unit, length) if held and length > local else []
        units = [u for u in read if u >= local // h and u < len(row) and row[u]]
        loads.append(sorted({u * h // g.block_size for u in units}))
    return loads


class TieredConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """The connector (module docstring). vLLM builds it from ``kv_transfer_config``
    (``kv_connector_module_path`` = this module); kvhit hands it each query with
    :meth:`serve` before the scheduler runs."""

    def __init__(self, vllm_config: Any, role: KVConnectorRole, kv_cache_config: Any = None):
        super().__init__(vllm_config, role, kv_cache_config)
        extra = self._kv_transfer_config.kv_connector_extra_config or {}
        self.divergent = DivergentHits(extra.get("divergent_hits", DivergentHits.AUTO))
        self.query: Query | None = None
        self.asked: int | None = None
        self.loaded = 0

    def serve(self, q: Query) -> None:
        """Answer for query ``q`` from now on (nothing asked or loaded yet)."""
        self.query, self.asked, self.loaded = q, None, 0

    def served(self) -> Query:
        """The query being served; RuntimeError if the target handed none."""
        if self.query is None:
            raise RuntimeError("kvhit's connector was asked before it was handed a query")
        return self.query

    @property
    def supports_divergent_local_hybrid_hits(self) -> bool:
        """``on``, ``off``, or with ``auto`` whether a tier holds the Mamba kind."""
        if self.divergent == DivergentHits.AUTO:
            return any(Kind.MAMBA in t.holds for t in self.served().tiers)
        return self.divergent == DivergentHits.ON

    def get_loaded_kv_cache_group_ids(self, request: Any) -> tuple[int, ...]:
        """The groups a load restores: those whose kind some tier holds (vLLM 0.32+ asks,
        to skip zeroing their blocks and for a sliding window's bounded replay; the hit is
        never bounded by them)."""
        return tuple(i for i, held in enumerate(tier_held(self.served())) if held)

    def get_num_new_matched_tokens(
        self, request: Any, num_computed_tokens: int
    ) -> tuple[int, bool]:
        """The tokens past ``num_computed_tokens`` the tiers supply
        (:func:`external_hit`), loaded synchronously."""
        self.asked = num_computed_tokens
        return external_hit(self.served(), num_computed_tokens), False

    def update_state_after_alloc(self, request: Any, blocks: Any, num_external_tokens: int) -> None:
        """Keep how many tokens the scheduler settled on loading."""
        self.loaded = num_external_tokens

    def build_connector_meta(self, scheduler_output: Any) -> KVConnectorMetadata:
        """Nothing to hand a worker: no KV moves."""
        return KVConnectorMetadata()

    def request_finished_all_groups(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        """Nothing is saved asynchronously: the blocks are freed at once."""
        return False, None

    def request_finished(self, request: Any, block_ids: Any) -> tuple[bool, None]:
        """As :meth:`request_finished_all_groups`."""
        return False, None

    def start_load_kv(self, forward_context: Any, **kwargs: Any) -> None:
        """Worker role: never run (see the module docstring)."""
        raise NotImplementedError("kvhit's connector runs in the scheduler role only")

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Worker role: never run."""
        raise NotImplementedError("kvhit's connector runs in the scheduler role only")

    def save_kv_layer(
        self, layer_name: str, kv_layer: Any, attn_metadata: Any, **kwargs: Any
    ) -> None:
        """Worker role: never run."""
        raise NotImplementedError("kvhit's connector runs in the scheduler role only")

    def wait_for_save(self) -> None:
        """Worker role: never run."""
        raise NotImplementedError("kvhit's connector runs in the scheduler role only")
