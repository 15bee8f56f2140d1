"""kvhit's own step-level engine (impl/step_engine.py) driven through the step contract."""

from __future__ import annotations

import doctest
from collections.abc import Sequence

import broken_steps

from kvhit.contract import EngineConfig, Ran, StepPlan, StepResult
from kvhit.impl.step_engine import StepImpl
from kvhit.model.spec import Group

FULL = (Group("full", 2),)
HYBRID = (Group("full", 2), Group("mamba", 2))


def engine_for(groups: Sequence[Group], num_blocks: int = 16, budget: int = 8) -> StepImpl:
    """A StepImpl over ``groups`` at alignment 2."""
    return StepImpl(EngineConfig(tuple(groups), num_blocks, 2, budget=budget))


def ran(plan: StepPlan, cut: Sequence[int] = (), invalid: Sequence[int] = ()) -> StepResult:
    """Every part of ``plan`` but the cut ones ran and sampled 100 + its end (taken only
    by a part that samples)."""
    return StepResult(
        tuple(Ran(s.request, (100 + s.end,)) for s in plan.scheduled if s.request not in cut),
        tuple(cut),
        tuple(invalid),
    )


def step(engine: StepImpl) -> tuple[StepPlan, tuple[int, ...]]:
    """Schedule one step and report it run."""
    plan = engine.schedule()
    return plan, engine.executed(ran(plan))


def test_chunks_advance_by_the_budget_then_decode_one_token_each():
    engine = engine_for(FULL, budget=4)
    engine.arrive(0, list(range(10)), max_new=2)
    parts, finished = [], ()
    while not finished:
        plan, finished = step(engine)
        parts += [(s.computed, s.new, s.hit) for s in plan.scheduled]
    assert parts == [(0, 4, 0), (4, 4, None), (8, 2, None), (10, 1, None)]
    assert finished == (0,)
    assert engine.schedule().scheduled == ()


def test_a_shared_prefix_hits_only_once_the_writing_step_is_reported():
    engine = engine_for(FULL)
    engine.arrive(0, list(range(8)), max_new=2)
    first = engine.schedule()
    engine.arrive(1, list(range(8)) + [99], max_new=1)
    second = engine.schedule()  # asynchronous: before the first step is reported
    assert [(s.request, s.hit) for s in second.scheduled] == [(0, None), (1, 0)]
    assert engine.snapshot(list(range(9))).cached == ((False,) * 4,)
    engine.executed(ran(first))
    assert engine.snapshot(list(range(9))).cached == ((True,) * 4,)
    engine.executed(ran(second))
    engine.arrive(2, list(range(8)) + [98], max_new=1)
    assert [(s.request, s.hit) for s in engine.schedule().scheduled] == [(1, None), (2, 8)]


def test_a_cut_part_publishes_nothing_and_is_computed_again():
    engine = engine_for(FULL)
    engine.arrive(0, list(range(6)), max_new=1)
    plan = engine.schedule()
    assert engine.executed(ran(plan, cut=(0,))) == ()
    assert engine.snapshot(list(range(7))).cached == ((False,) * 3,)
    again = engine.schedule().scheduled
    assert [(s.computed, s.new) for s in again] == [(0, 6)]


def test_a_cut_part_voids_the_parts_scheduled_after_it():
    engine = engine_for(FULL, budget=4)
    engine.arrive(0, list(range(8)), max_new=1)
    first, second = engine.schedule(), engine.schedule()
    assert [s.computed for s in second.scheduled] == [4]
    engine.executed(ran(first, cut=(0,)))
    engine.executed(ran(second))  # it read what the cut part never wrote
    assert engine.snapshot(list(range(9))).cached == ((False,) * 4,)
    assert [s.computed for s in engine.schedule().scheduled] == [0]


def test_preemption_frees_the_newest_and_restarts_it_from_a_hit():
    engine = engine_for(FULL, num_blocks=6)
    engine.arrive(0, [1, 2, 3, 4], max_new=4)
    engine.arrive(1, [5, 6, 7, 8], max_new=2)
    step(engine)
    plan, _ = step(engine)  # each needs a third block; the pool has one
    assert plan.preempted == (1,)
    assert [s.request for s in plan.scheduled] == [0]
    held = {b for s in plan.scheduled for t in s.tables for b in t}
    assert len(held) + len(engine.coord.pool.free_queue) == 5  # request 1 holds nothing
    restarts = []
    for _ in range(8):
        plan, _ = step(engine)
        restarts += [s.hit for s in plan.scheduled if s.request == 1 and s.hit is not None]
    assert restarts and restarts[0] > 0


def test_a_mamba_state_is_not_reused_in_the_step_that_computes_it():
    engine = engine_for((Group("mamba", 2),), budget=10)
    engine.arrive(0, list(range(16)), max_new=1)
    step(engine)
    engine.arrive(1, list(range(12)) + [99], max_new=1)
    plan = engine.schedule()
    assert [(s.request, s.computed, s.hit) for s in plan.scheduled] == [(0, 10, None), (1, 10, 10)]


def test_blocks_leave_a_window_once_the_step_passing_them_is_reported():
    engine = engine_for((Group("sliding_window", 2, window=2),), budget=4)
    engine.arrive(0, list(range(10)), max_new=1)
    first, second = engine.schedule(), engine.schedule()
    assert second.scheduled[0].tables == ((1, 2, 3, 4),)
    engine.executed(ran(first))
    engine.executed(ran(second))
    assert engine.schedule().scheduled[0].tables == ((None, None, None, 4, 5),)


def test_decoded_tokens_are_published_with_the_prompt():
    engine = engine_for(FULL)
    engine.arrive(0, [1, 2, 3], max_new=3)
    tokens, finished = [1, 2, 3], ()
    while not finished:
        plan, finished = step(engine)
        tokens += [100 + s.end for s in plan.scheduled if s.end == len(tokens)]
    assert tokens == [1, 2, 3, 103, 104, 105]
    assert engine.snapshot(tokens + [0]).cached == ((True, True, False),)


def test_an_aborted_request_keeps_its_blocks_while_its_part_is_in_flight():
    engine = engine_for(FULL, num_blocks=8)
    engine.arrive(0, list(range(6)), max_new=1)
    plan = engine.schedule()
    engine.abort(0)
    assert len(engine.coord.pool.free_queue) == 4
    engine.executed(ran(plan))
    assert len(engine.coord.pool.free_queue) == 7
    assert engine.snapshot(list(range(7))).cached == ((False,) * 3,)


def hit_then_fail(groups: Sequence[Group], group: int, index: int) -> StepImpl:
    """Request 0 writes [1..8] and finishes; request 1 hits 8 of it, and block
    ``index`` of group ``group`` of its table fails to load."""
    engine = engine_for(groups)
    engine.arrive(0, [1, 2, 3, 4, 5, 6, 7, 8], max_new=1)
    step(engine)
    engine.arrive(1, [1, 2, 3, 4, 5, 6, 7, 8, 10], max_new=1)
    plan = engine.schedule()
    (part,) = plan.scheduled
    assert part.hit == 8
    failed = part.tables[group][index]
    assert failed is not None and failed in part.loaded[group]
    engine.executed(ran(plan, invalid=(failed,)))
    assert engine.snapshot(list(range(1, 10))).cached[group][index] is False
    return engine


def test_a_failed_load_of_full_attention_resumes_at_the_block():
    (part,) = hit_then_fail(FULL, 0, 2).schedule().scheduled
    assert (part.computed, part.tables[0][:2]) == (4, (1, 2))


def test_a_failed_load_of_a_hybrid_resumes_at_l_star_of_what_it_holds():
    (part,) = hit_then_fail(HYBRID, 0, 2).schedule().scheduled
    assert part.computed == 0  # at 4 it would need the Mamba state at 4, which it lacks


def test_each_broken_engine_shows_its_bug_through_the_contract():
    """The examples of tests/broken_steps.py, each beside StepImpl's answer above."""
    result = doctest.testmod(broken_steps)
    assert result.attempted >= 4 * 5 and result.failed == 0
