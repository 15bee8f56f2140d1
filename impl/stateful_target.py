"""The built-in stateful target ``impl``: kvhit's torch cache serving a program.

Each ``admit`` runs :meth:`kvhit.impl.engine.Engine.admit` (lookup, allocate, the tiny
model's prefill from the hit through the paged store, cache, drop) and also computes
the prompt from scratch: ``outputs_match`` says whether the logits served from the
cache equal it (no NaN, max abs difference ≤ 1e-12), so the hit is grounded in real
attention as well as judged by the ledger.

    >>> engine = StatefulImpl({"groups": [{"kind": "full", "block_size": 2}], "num_blocks": 6})
    >>> engine.admit(0, [1, 2, 3])
    {'length': 0, 'reused': [[]], 'tables': [[1, 2]], 'outputs_match': True}
    >>> engine.snapshot([1, 2, 4])
    {'cached': [[True]]}
    >>> engine.admit(1, [1, 2, 4])
    {'length': 2, 'reused': [[1]], 'tables': [[1, 3]], 'outputs_match': True}
    >>> engine.finish(0)

With offload stores (``"tiers"``: a name, the kinds it holds and its ``num_blocks``
slots each; docs/design.md §4), the pool spills what it evicts to them and a hit
restores from them: the snapshot shows each store as a tier of the query
(docs/design.md §1.7), and each admit lists its ``moves`` in order, a spill as
``["spill", block, [tier, slot]]`` and a restore as ``["restore", [tier, slot],
block]``, so a ledger can follow each block's content into a store and back.

    >>> engine = StatefulImpl({"groups": [{"kind": "full", "block_size": 2}], "num_blocks": 3,
    ...                        "tiers": [{"name": "cpu", "holds": ["full"], "num_blocks": 4}]})
    >>> engine.admit(0, [1, 2, 3])["moves"], engine.finish(0)
    ([], None)
    >>> engine.admit(1, [5, 6, 7])["moves"], engine.finish(1)
    ([['spill', 1, [0, 1]]], None)
    >>> engine.snapshot([1, 2, 4])
    {'cached': [[False]], 'tiers': [{'name': 'cpu', 'holds': ['full'], 'cached': {'0': [True]}}]}
    >>> engine.admit(2, [1, 2, 4])
    {'length': 2, 'reused': [[1]], 'tables': [[1, 2]], 'outputs_match': True, 'moves': [['restore', [0, 1], 1], ['spill', 2, [0, 2]]]}
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from kvhit.impl.coordinator import Request
from kvhit.impl.engine import Engine
from kvhit.impl.pool import NULL_BLOCK
from kvhit.model.protocol import parse_group
from kvhit.model.spec import Kind

TOLERANCE = 1e-12


class StatefulImpl:
    """The impl behind the stateful protocol (:mod:`kvhit.targets.stateful`)."""

    def __init__(self, config: dict[str, Any], seed: int = 0):
        # The tiny model's tensors are far too small for intra-op threads: with two
        # threads on a busy 2-core machine, one softmax took 12 ms instead of 2 µs.
        # (This sets torch's thread count for the whole process.)
        torch.set_num_threads(1)
        groups = [parse_group(g, f"groups[{i}]") for i, g in enumerate(config["groups"])]
        self.engine = Engine(
            groups,
            config["num_blocks"],
            config.get("alignment"),
            seed,
            dim=4,
            hash_unit=config.get("hash_unit"),
        )
        for tier in config.get("tiers", ()):
            holds = frozenset(Kind(k) for k in tier["holds"])
            self.engine.add_store(tier["name"], holds, tier["num_blocks"])
        self.requests: dict[int, Request] = {}

    def snapshot(self, tokens: Sequence[int]) -> dict[str, Any]:
        """Which blocks of ``tokens`` each group finds cached (with a hash unit, a
        partially filled one as ``{"upto": p}``), and, with offload stores, ``tiers``:
        which each store holds."""
        coord = self.engine.coord
        request = coord.request(tokens)
        snapshot = coord.snapshot(request)
        coord.free(request)
        return {key: snapshot[key] for key in ("cached", "tiers") if key in snapshot}

    def admit(self, request: int, tokens: Sequence[int]) -> dict[str, Any]:
        """Serve a new prompt from its hit; its blocks stay held until :meth:`finish`."""
        scratch = self.engine.scratch(tokens)
        admitted = self.engine.admit(tokens)
        if admitted is None:
            return {"rejected": "too few free blocks"}
        self.requests[request], served = admitted
        logits = served.prefill.logits
        error = (logits - scratch[served.hit.length :]).abs().max()
        answer = {
            "length": served.hit.length,
            "reused": [list(blocks) for blocks in served.hit.blocks],
            "tables": [[None if b == NULL_BLOCK else b for b in t] for t in served.tables],
            "outputs_match": bool(not logits.isnan().any() and error <= TOLERANCE),
        }
        moves = self.engine.transfers.take_log()
        return (
            {**answer, "moves": [m.to_json() for m in moves]}
            if self.engine.coord.stores
            else answer
        )

    def finish(self, request: int) -> None:
        """Free the request's blocks."""
        self.engine.finish(self.requests.pop(request))
