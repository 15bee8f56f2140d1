"""Step-level engines made from :class:`~kvhit.impl.step_engine.StepImpl`, each with one
bug of a class engines have shipped (issue 42). Each is a step factory (the class
itself, which declares StepImpl's capabilities): ``tests.broken_steps:NAME``.
"""

from __future__ import annotations

from kvhit.contract import StepFactory, StepPlan
from kvhit.impl.step_engine import Draft, Live, StepImpl
from kvhit.model.spec import Kind


class PublishesAtSchedule(StepImpl):
    """Publishes a step's blocks when it schedules the step, not once the step is
    reported run, and keeps them published when the step is cut: a cut part's blocks
    are hittable though nothing wrote them. The shape of vLLM #56525 (Mamba state hashes
    published at schedule time; after a client abort a retry hits state never written).
    The blocks are published after the step's lookups, so no state is reused in the
    step that computes it (that is :class:`SameStepMamba`).

        >>> from kvhit.contract import EngineConfig, StepResult
        >>> from kvhit.model.spec import Group
        >>> engine = PublishesAtSchedule(EngineConfig((Group("full", 2),), 8, 2, budget=8))
        >>> engine.arrive(0, [1, 2, 3, 4, 5], max_new=1)
        >>> engine.schedule().scheduled[0].end
        5
        >>> engine.executed(StepResult((), cut=(0,)))  # the part never ran
        ()
        >>> engine.snapshot([1, 2, 3, 4, 9]).cached  # StepImpl: ((False, False),)
        ((True, True),)
    """

    def schedule(self) -> StepPlan:
        plan = super().schedule()
        for part in self.in_flight[-1]:
            held = self.lives[part.request].held
            assert held is not None, "a scheduled request holds its blocks"
            self.coord.cache_full_blocks(held, part.end)
        return plan


class SameStepMamba(StepImpl):
    """Publishes the Mamba states a step computes for the running requests before the
    waiting ones look up their hits, so a request admitted in that step reuses a state
    the step has not computed yet. vLLM forbids this (``single_type_kv_cache_manager.py``,
    Mamba's no same-step reuse); vllm-omni #7877 is the attention form (a same-step
    hit planning reads of rows written later in the step).

        >>> from kvhit.contract import EngineConfig, Ran, StepResult
        >>> from kvhit.model.spec import Group
        >>> engine = SameStepMamba(EngineConfig((Group("mamba", 2),), 16, 2, budget=10))
        >>> engine.arrive(0, list(range(16)), max_new=1)
        >>> _ = engine.schedule(), engine.executed(StepResult((Ran(0, ()),)))
        >>> engine.arrive(1, list(range(12)) + [99], max_new=1)
        >>> [(s.request, s.computed, s.hit) for s in engine.schedule().scheduled]
        [(0, 10, None), (1, 12, 12)]

    Request 1's hit of 12 reads the state at 12, which request 0 computes in this very
    step; StepImpl gives it 10, the state its last reported step wrote.
    """

    def admit_waiting(self, draft: Draft) -> None:
        for part in draft.parts:
            held = self.lives[part.request].held
            assert held is not None, "a scheduled request holds its blocks"
            for i, (g, m) in enumerate(zip(self.coord.groups, self.coord.managers)):
                if g.kind == Kind.MAMBA:
                    keys = held.hashes[i][: part.end // g.block_size]
                    m.cache_full_blocks(held.tables[i], keys, 1, held.filled_from[i])
        super().admit_waiting(draft)


class EvictsReferencedMamba(StepImpl):
    """When the pool is short, takes a cached Mamba state another running request
    still holds as if nobody held it: the block goes back to the free queue and to the
    next allocation while the holder's table still names it. TensorRT-LLM nvbug
    6625710 (kv_cache_manager_v2: evicting a Mamba snapshot detaches a block a
    suspended request still references).

        >>> from kvhit.contract import EngineConfig, Ran, StepResult
        >>> from kvhit.model.spec import Group
        >>> groups = (Group("full", 2), Group("mamba", 2))
        >>> engine = EvictsReferencedMamba(EngineConfig(groups, 8, 2, budget=8))
        >>> engine.arrive(0, [1, 2], max_new=5)
        >>> engine.arrive(1, [3, 4], max_new=5)
        >>> [s.tables for s in engine.schedule().scheduled]
        [((1,), (2,)), ((3,), (4,))]
        >>> engine.executed(StepResult((Ran(0, (5,)), Ran(1, (6,)))))
        ()
        >>> [s.tables for s in engine.schedule().scheduled]
        [((1, 5), (2, 6)), ((3, 7), (4, 2))]

    Block 2, the Mamba state at token 2 that request 0 reads, is now request 1's too
    (StepImpl preempts request 1 instead).
    """

    def make_room(self, request: int, draft: Draft) -> bool:
        for other in self.running:
            held = self.lives[other].held
            if other == request or held is None:
                continue
            pool = self.coord.pool
            for g, table in zip(self.coord.groups, held.tables):
                cached = [b for b in table if pool.key[b] and pool.ref_cnt[b] > 0]
                if g.kind == Kind.MAMBA and cached:
                    pool.free(cached[:1])
                    return True
        return super().make_room(request, draft)


class TruncationRecovery(StepImpl):
    """After a failed load, truncates every group at the first invalid block (of any
    group): vLLM's single-group rule (0.34.0
    ``Scheduler._update_requests_with_invalid_blocks``) applied to a hybrid. For full
    attention alone that is the recovered hit; for a hybrid the groups that hold only
    some blocks (a window, a Mamba state) may hold nothing at that length (issue 42;
    vLLM RFC #47812, #56135).

        >>> from kvhit.contract import EngineConfig, Ran, StepResult
        >>> from kvhit.model.spec import Group
        >>> groups = (Group("full", 2), Group("mamba", 2))
        >>> engine = TruncationRecovery(EngineConfig(groups, 16, 2, budget=8))
        >>> engine.arrive(0, [1, 2, 3, 4, 5, 6, 7, 8], max_new=1)
        >>> _ = engine.schedule(), engine.executed(StepResult((Ran(0, (9,)),)))
        >>> engine.arrive(1, [1, 2, 3, 4, 5, 6, 7, 8, 10], max_new=1)
        >>> engine.schedule().scheduled[0].loaded
        ((1, 2, 3, 4), (8,))
        >>> engine.executed(StepResult((), invalid=(3,)))
        ()
        >>> step = engine.schedule().scheduled[0]
        >>> step.computed, step.tables[1][1]
        (4, None)

    Request 1 resumes at 4 with no Mamba state at 4 (its table holds none there);
    StepImpl resumes it at 0, the L* of what it holds.
    """

    def recovered(self, live: Live, invalid: set[int]) -> int:
        assert live.held is not None, "only a request holding blocks recovers"
        return min(
            (
                j * g.block_size
                for g, table in zip(self.coord.groups, live.held.tables)
                for j, b in enumerate(table)
                if b in invalid
            ),
            default=live.written,
        )


publishes_at_schedule: StepFactory = PublishesAtSchedule
same_step_mamba: StepFactory = SameStepMamba
evicts_referenced_mamba: StepFactory = EvictsReferencedMamba
truncation_recovery: StepFactory = TruncationRecovery
