"""The impl's offload tier (docs/design.md §4), grounded by the tiny model.

The pool spills every block it evicts to an offload store (bounded, its own LRU), and
a lookup counts a unit as held when the pool or a store has it; a reused block only a
store holds is restored into the pool before the request runs. A hit assembled across
the tiers gives the output from scratch; an assembly the spec does not allow (a length
no group set can serve, a Mamba state the store does not hold) reads NaN.
"""

from __future__ import annotations

from kvhit.impl.engine import Engine
from kvhit.impl.offload import Direction
from kvhit.model.spec import Group, Kind

ALL = frozenset(Kind)
HYBRID = [Group("full", 2), Group("sliding_window", 2, window=3), Group("mamba", 2)]
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2, 3]
OTHER = [3, 3, 3, 2, 2, 2, 1, 1, 1]
LONGER = [*PROMPT, 0, 0]


def engine_with_store(holds: frozenset[Kind], num_slots: int = 16) -> Engine:
    """The hybrid groups over a pool that holds one prompt, and a store."""
    engine = Engine(HYBRID, num_blocks=16, dim=4)
    engine.add_store("host", holds, num_slots)
    return engine


def spilled(engine: Engine) -> Engine:
    """Serve PROMPT, then OTHER, whose blocks evict (and spill) PROMPT's."""
    engine.serve(PROMPT)
    engine.serve(OTHER)
    return engine


def test_evicted_blocks_are_spilled_and_a_later_hit_restores_them() -> None:
    engine = spilled(engine_with_store(ALL))
    moves = engine.transfers.take_log()
    assert moves and {m.direction for m in moves} == {Direction.SPILL}
    scratch = engine.scratch(LONGER)
    served = engine.serve(LONGER)
    restored = [m for m in engine.transfers.take_log() if m.direction == Direction.RESTORE]
    assert served.hit.length == 8 and restored
    assert not served.prefill.logits.isnan().any()
    assert (served.prefill.logits - scratch[8:]).abs().max() <= 1e-12
    # The restored blocks are cached in the pool again: the next hit needs no store.
    again = engine.serve(LONGER)
    assert again.hit.length == 10
    assert all(m.direction == Direction.SPILL for m in engine.transfers.take_log())
