"""The built-in stateful target ``impl``: kvhit's torch cache serving a program.

Each ``admit`` runs :meth:`kvhit.impl.engine.Engine.admit` (lookup, allocate, the tiny
model's prefill from the hit through the paged store, cache, drop) and also computes
the prompt from scratch: ``outputs_match`` says whether the logits served from the
cache equal it (no NaN, max abs difference ≤ 1e-12), so the hit is grounded in real
attention as well as judged by the ledger.

    >>> from kvhit.model.spec import Group
    >>> engine = StatefulImpl(EngineConfig((Group("full", 2),), num_blocks=6, alignment=2))
    >>> engine.admit(0, [1, 2, 3])
    Admitted(length=0, reused=((),), tables=((1, 2),), outputs_match=True, moves=())
    >>> engine.snapshot([1, 2, 4])
    Snapshot(cached=((True,),), tiers=())
    >>> engine.admit(1, [1, 2, 4]).to_json()
    {'length': 2, 'reused': [[1]], 'tables': [[1, 3]], 'outputs_match': True}
    >>> engine.finish(0)

With offload stores (a name, the kinds it holds and its ``num_blocks`` slots each;
docs/design.md §4), the pool spills what it evicts to them and a hit restores from
them: the snapshot shows each store as a tier of the query (docs/design.md §1.7), and
each admit lists its moves in order, a spill of a block to a store's slot and a
restore of a slot into a block, so a ledger can follow each block's content into a
store and back (shown here in their protocol form).

    >>> from kvhit.contract import Capabilities, Store
    >>> from kvhit.model.spec import Kind
    >>> cpu = Store("cpu", frozenset({Kind.FULL}), 4)
    >>> engine = StatefulImpl(EngineConfig((Group("full", 2),), 3, 2, stores=(cpu,)))
    >>> engine.admit(0, [1, 2, 3]).moves, engine.finish(0)
    ((), None)
    >>> engine.admit(1, [5, 6, 7]).to_json()["moves"], engine.finish(1)
    ([['spill', 1, [0, 1]]], None)
    >>> engine.snapshot([1, 2, 4]).to_json()
    {'cached': [[False]], 'tiers': [{'name': 'cpu', 'holds': ['full'], 'cached': {'0': [True]}}]}
    >>> engine.admit(2, [1, 2, 4]).to_json()
    {'length': 2, 'reused': [[1]], 'tables': [[1, 2]], 'outputs_match': True, 'moves': [['restore', [0, 1], 1], ['spill', 2, [0, 2]]]}
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from kvhit.contract import Admitted, Capabilities, EngineConfig, Rejected, Snapshot
from kvhit.impl.coordinator import Request
from kvhit.impl.engine import Engine
from kvhit.impl.pool import NULL_BLOCK

TOLERANCE = 1e-12


class StatefulImpl:
    """The impl as a :class:`~kvhit.contract.StatefulEngine`: every kind, drafter,
    window convention and hash unit, and offload stores."""

    capabilities = Capabilities(tiers=True)

    def __init__(self, config: EngineConfig, seed: int = 0):
        # The tiny model's tensors are far too small for intra-op threads: with two
        # threads on a busy 2-core machine, one softmax took 12 ms instead of 2 µs.
        # (This sets torch's thread count for the whole process.)
        torch.set_num_threads(1)
        self.engine = Engine(
            config.groups, config.num_blocks, config.alignment, seed, dim=4,
            hash_unit=config.hash_unit,
        )  # fmt: skip
        for store in config.stores:
            self.engine.add_store(store.name, store.holds, store.num_blocks)
        self.requests: dict[int, Request] = {}

    def snapshot(self, tokens: Sequence[int]) -> Snapshot:
        """Which blocks of ``tokens`` each group finds cached (with a hash unit, a
        partially filled one as an :class:`~kvhit.model.spec.Upto`), and, with offload
        stores, which each store holds."""
        coord = self.engine.coord
        request = coord.request(tokens)
        state = coord.state(request)
        coord.free(request)
        return Snapshot(state.cached, state.tiers)

    def admit(self, request: int, tokens: Sequence[int]) -> Admitted | Rejected:
        """Serve a new prompt from its hit; its blocks stay held until :meth:`finish`."""
        scratch = self.engine.scratch(tokens)
        admitted = self.engine.admit(tokens)
        if admitted is None:
            return Rejected("too few free blocks")
        self.requests[request], served = admitted
        logits = served.prefill.logits
        error = (logits - scratch[served.hit.length :]).abs().max()
        return Admitted(
            served.hit.length,
            tuple(tuple(blocks) for blocks in served.hit.blocks),
            tuple(tuple(None if b == NULL_BLOCK else b for b in t) for t in served.tables),
            bool(not logits.isnan().any() and error <= TOLERANCE),
            tuple(m.tier_move() for m in self.engine.transfers.take_log()),
        )

    def finish(self, request: int) -> None:
        """Free the request's blocks."""
        self.engine.finish(self.requests.pop(request))
