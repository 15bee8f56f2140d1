"""The impl's offload tier (docs/design.md §4), grounded by the tiny model.

The pool spills every block it evicts to an offload store (bounded, its own LRU), and
a lookup counts a unit as held when the pool or a store has it; a reused block only a
store holds is restored into the pool before the request runs. A hit assembled across
the tiers gives the output from scratch; an assembly the spec does not allow (the
answer of a known-wrong combination, a Mamba state the store does not hold) reads NaN.
The ``impl`` target answers tiered queries (one store per tier) as the model does, and
the stateful impl reports its spills and restores, which a ledger follows into the
stores and back.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from test_impl_fine import spec_answer
from test_impl_workloads import Workload, check_every_candidate, random_workload, servable

from kvhit.analysis import Analysis, Verdict
from kvhit.contract import Direction, EngineConfig, Store
from kvhit.harness.compare import judge_reply
from kvhit.harness.ledger import Ledger
from kvhit.harness.random_cases import random_queries
from kvhit.impl.coordinator import Coordinator
from kvhit.impl.engine import Engine, Served
from kvhit.impl.offload import Move
from kvhit.impl.stateful_target import StatefulImpl
from kvhit.model.algorithms import (
    WRONG_TIER_COMBINATIONS,
    dense_min_mamba_trimmed,
    full_attention_alone,
)
from kvhit.model.protocol import parse_query
from kvhit.model.spec import LOCAL, Group, Kind, Query, local_query, longest_hit
from kvhit.model.tiers import Load, hit_plan
from kvhit.targets.registry import get, model_target
from kvhit.targets.runner import Reply
from kvhit.targets.stateful import Admission, check_admit, check_snapshot

impl_target = get("impl")
ALL = frozenset(Kind)
HYBRID = [Group("full", 2), Group("sliding_window", 2, window=3), Group("mamba", 2)]
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2, 3]
OTHER = [3, 3, 3, 2, 2, 2, 1, 1, 1]
LONGER = [*PROMPT, 0]


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
    assert again.hit.length == 8
    assert all(m.direction == Direction.SPILL for m in engine.transfers.take_log())


def test_without_the_mamba_states_no_hit_and_trusting_the_attention_groups_reads_nan() -> None:
    """The store holds full and window KV but no Mamba state: PROMPT's attention KV is
    all held, no state is, so L* = 0. Full attention alone (and the dense min with the
    Mamba list trimmed) answer 8, and a prefill from 8 reads a state held nowhere."""
    engine = spilled(engine_with_store(frozenset({Kind.FULL, Kind.SLIDING_WINDOW})))
    request = engine.coord.request(LONGER)
    q = parse_query(engine.coord.snapshot(request))
    engine.coord.free(request)
    assert longest_hit(q).length == 0
    assert full_attention_alone(q) == dense_min_mamba_trimmed(q) == 8
    assert engine.serve_from(LONGER, 8).logits.isnan().all()
    assert engine.serve(LONGER).hit.length == 0


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


@dataclass
class TieredWorkload(Workload):
    """A workload whose engine has offload stores: (kinds held, slots) each."""

    stores: list[tuple[frozenset[Kind], int]] = field(default_factory=list)

    def engine(self, seed: int) -> Engine:
        """A fresh engine for this workload, with its stores."""
        engine = super().engine(seed)
        for i, (holds, slots) in enumerate(self.stores):
            engine.add_store(f"store{i}", holds, slots)
        return engine


def tiered_workload(rng: random.Random, fine: bool = False) -> TieredWorkload:
    """A :func:`random_workload` of 8 prompts over the smallest pool that holds the
    longest (so most blocks are evicted), with one or two stores, each holding some of
    its kinds in a few slots."""
    w = random_workload(rng, requests=8, fine=fine)
    longest = max(map(len, w.prompts))
    need = sum(-(-longest // g.block_size) for g in w.groups) + 1
    kinds = sorted({g.kind for g in w.groups})
    stores = [
        (
            frozenset(k for k in kinds if rng.random() < 0.7) or frozenset(kinds[:1]),
            rng.randint(2, 2 * need),
        )
        for _ in range(rng.randint(1, 2))
    ]
    return TieredWorkload(**{**vars(w), "num_blocks": need}, stores=stores)


def restored_from(engine: Engine, served: Served, restores: list[Move]) -> set[Load]:
    """Each block the admit restored: its group, block index and store."""
    out = set()
    for m in restores:
        index = served.hit.first[m.group] + served.hit.blocks[m.group].index(m.block)
        out.add(Load(m.group, index, engine.coord.stores[m.tier].name))
    return out


def check_sources(q: Query, length: int, restored: set[Load]) -> None:
    """The admit restored what the spec's plan at ``length`` loads from a tier
    (:func:`~kvhit.model.tiers.hit_plan`). With a hash unit the plan loads unit by
    unit: a block whose last needed unit is in a store is restored whole from the
    first store holding that unit (its copy holds every unit of the block before it)."""
    loads = hit_plan(q, length).loads
    tier = {x for x in loads if x.source != LOCAL}
    if q.hash_unit is None:
        assert restored == tier
        return
    local = {(x.group, x.block) for x in loads if x.source == LOCAL}
    blocks = {(x.group, x.block) for x in restored}
    assert restored <= tier and {(x.group, x.block) for x in tier} - local <= blocks


def serve_tiered(workload: TieredWorkload, seed: int) -> Counter[str]:
    """Serve every prompt of the workload, checking each against the spec on its tiered
    snapshot and the output from scratch, and every candidate as
    :func:`check_every_candidate` does; an answer of a known-wrong tier combination
    longer than L* reads NaN. Counts what was seen."""
    engine = workload.engine(seed)
    seen: Counter[str] = Counter()
    for prompt in workload.prompts:
        scratch = engine.scratch(prompt)
        request = engine.coord.request(prompt)
        q = parse_query(engine.coord.snapshot(request))
        engine.coord.free(request)
        seen["poisoned"] += check_every_candidate(engine, prompt, scratch)
        best = longest_hit(q).length
        for name, wrong in WRONG_TIER_COMBINATIONS.items():
            # Too long only by a drafter's rule, a wrong answer reads what the tiny
            # model (which has no drafter) needs: check_every_candidate checks that.
            if wrong(q) > best and not servable(q, wrong(q)):
                assert engine.serve_from(prompt, wrong(q)).logits.isnan().any(), name
                seen[name] += 1
        served = engine.serve(prompt)
        assert {"length": served.hit.length, "blocks": served.hit.indices()} == spec_answer(q)
        assert not served.prefill.logits.isnan().any()
        assert (served.prefill.logits - scratch[served.hit.length :]).abs().max() <= 1e-12
        restores = [m for m in engine.transfers.take_log() if m.direction == Direction.RESTORE]
        seen["restored"] += bool(restores)
        check_sources(q, served.hit.length, restored_from(engine, served, restores))
        seen["beyond the pool"] += served.hit.length > longest_hit(local_query(q)).length
    return seen


def test_hits_assembled_across_the_tiers_equal_scratch_and_wrong_ones_read_nan() -> None:
    rng = random.Random(29)
    seen: Counter[str] = Counter()
    for seed in range(24):
        seen += serve_tiered(tiered_workload(rng, fine=seed % 2 == 1), seed)
    assert seen["restored"] > 10 and seen["beyond the pool"] > 10 and seen["poisoned"] > 0
    assert all(seen[name] > 0 for name in WRONG_TIER_COMBINATIONS), seen


def test_the_impl_target_answers_tiered_queries_like_the_model() -> None:
    """One store per tier: the lookup finds the reconciled hit itself (length and
    blocks), on queries where the tiers often lengthen it."""
    queries = list(random_queries(seed=11, count=1500, capabilities=impl_target.capabilities))
    lengthened = sum(longest_hit(q).length > longest_hit(local_query(q)).length for q in queries)
    assert lengthened > 200 and any(q.hash_unit for q in queries if q.tiers)
    for q in queries:
        query = q.to_json()
        assert impl_target(query) == model_target(query), query


def program_config(workload: TieredWorkload, alignment: int, num_blocks: int) -> EngineConfig:
    """The configuration of the workload's stateful engine, of ``num_blocks`` blocks."""
    stores = tuple(
        Store(f"store{i}", frozenset(map(Kind, holds)), slots)
        for i, (holds, slots) in enumerate(workload.stores)
    )
    groups = tuple(workload.groups)
    return EngineConfig(groups, num_blocks, alignment, workload.hash_unit, stores)


def run_stateful(workload: TieredWorkload, seed: int, engine: StatefulImpl) -> Counter[str]:
    """Admit the prompts through the stateful impl, two requests running at a time;
    judge every admit by the ledger (following the moves through the stores), on its
    own tiered snapshot, and by its outputs, and check that no running request's block
    is overwritten. Counts the admits that restored, and each kind of failure."""
    config = program_config(workload, engine.engine.coord.alignment, workload.num_blocks)
    groups = config.groups
    ledger = Ledger(workload.hash_unit)
    seen: Counter[str] = Counter()
    running: list[int] = []
    for request, prompt in enumerate(workload.prompts):
        t = len(prompt)
        own = check_snapshot(engine.snapshot(prompt), config)
        q = Query(groups, own.cached, t - 1, t, config.alignment, config.hash_unit, own.tiers)
        checked = check_admit(engine.admit(request, prompt), config)
        assert isinstance(checked, Admission), "the pool holds two of the longest prompt"
        admitted = checked.admitted
        ledger.move(admitted.moves)
        seen["stale"] += ledger.problem(groups, prompt, checked).startswith("stale block")
        listed = Reply("answer", checked.listed())
        seen["wrong hit"] += judge_reply(Analysis(q), listed).cls != Verdict.OK
        seen["outputs differ"] += not admitted.outputs_match
        ledger.record(groups, prompt, checked, request, request)
        ledger.hold(groups, prompt, checked, request)
        running.append(request)
        if len(running) > 1:
            finished = running.pop(0)
            engine.finish(finished)
            ledger.release(finished)
        seen["overwritten"] += bool(ledger.overwritten())
        seen["restored"] += any(m.direction == Direction.RESTORE for m in admitted.moves)
    return seen


def stateful_engine(workload: TieredWorkload, seed: int) -> StatefulImpl:
    """The stateful impl of the workload, its pool large enough for two of the longest
    prompt."""
    alignment = workload.engine(seed).coord.alignment
    return StatefulImpl(program_config(workload, alignment, 2 * workload.num_blocks - 1), seed)


FAILURES = ("stale", "wrong hit", "outputs differ", "overwritten")


def test_the_stateful_impl_spills_and_restores_what_the_ledger_follows() -> None:
    rng = random.Random(5)
    seen: Counter[str] = Counter()
    for seed in range(40):
        workload = tiered_workload(rng, fine=seed % 2 == 1)
        seen += run_stateful(workload, seed, stateful_engine(workload, seed))
    assert seen["restored"] > 10 and not any(seen[f] for f in FAILURES), seen


def test_the_ledger_sees_a_store_that_keeps_the_keys_of_what_it_evicted() -> None:
    """A broken store whose eviction forgets nothing: a slot given to another block is
    still found under the keys of the one it held. What it restores is stale."""
    rng = random.Random(5)
    seen: Counter[str] = Counter()
    for seed in range(40):
        workload = tiered_workload(rng, fine=seed % 2 == 1)
        engine = stateful_engine(workload, seed)
        for store in engine.engine.coord.stores:
            store.slots.uncache = lambda block: None  # type: ignore[method-assign]
        seen += run_stateful(workload, seed, engine)
    assert seen["stale"] > 0 and seen["outputs differ"] > 0, seen
