"""The impl's offload tier (docs/design.md §4), grounded by the tiny model.

The pool spills every block it evicts to an offload store (bounded, its own LRU), and
a lookup counts a unit as held when the pool or a store has it; a reused block only a
store holds is restored into the pool before the request runs. A hit assembled across
the tiers gives the output from scratch; an assembly the spec does not allow (a length
no group set can serve, a Mamba state the store does not hold) reads NaN.
"""

from __future__ import annotations

from kvhit.impl.coordinator import Coordinator
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


def test_a_store_keeps_its_most_recent_spills_and_only_the_kinds_it_holds() -> None:
    """Two slots, full attention only: of PROMPT's four keyed full blocks, the two
    spilled last stay; no window or Mamba block is spilled."""
    engine = spilled(engine_with_store(frozenset({Kind.FULL}), num_slots=2))
    spills = engine.transfers.take_log()
    assert {m.group for m in spills} == {0}
    request = engine.coord.request(PROMPT)
    slots = [store.tolist() for store in engine.coord.held_ids(request)]
    engine.coord.free(request)
    kept = {m.block for m in spills[-2:]}
    assert sum(s >= 0 for s in slots[0]) == 2 and slots[1:] == [[-1] * 4, [-1] * 4]
    assert len(kept) == 2 and len(spills) > 2


def test_restoring_a_state_survives_a_spill_that_takes_its_slots_keys() -> None:
    """Mamba, b = 4, h = 2. The store holds the state at 2 of prefix [1 2]; the pool
    holds the state at 4 of [1 2 5 5], found only through its own last unit, first in
    line for eviction. A request [1 2 7] hits 2 from the store; restoring it evicts
    the pool's block, whose spill caches the longer chain of the same anchor over the
    pinned slot's keys: the restore still has them."""
    coord = Coordinator([Group("mamba", 4)], num_blocks=3, hash_unit=2)
    store = coord.add_store("host", frozenset({Kind.MAMBA}), num_slots=2)
    other = coord.pool.allocate()
    coord.preload(coord.request([1, 2, 5, 5, 5]), [[False, True]])
    coord.pool.free([other])
    coord.preload(coord.request([1, 2, 3]), [[True]], store.slots)
    request = coord.request([1, 2, 7])
    hit = coord.find_longest_cache_hit(request, 2)
    assert hit.length == 2 and hit.blocks == ((-1,),)
    evicted = coord.pool.free_queue.copy().popitem(last=False)[0]
    assert evicted != other
    allocated = coord.allocate(request, hit)
    # The restored block (the evicted one, reused) is copied into the request's own.
    assert allocated.blocks == ((evicted,),) and request.tables == [[other]]
    assert store.lookup(0, request.hashes[0]).tolist() == [-1]
