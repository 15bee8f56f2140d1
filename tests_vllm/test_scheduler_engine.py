"""The ``vllm-scheduler`` target (kvhit.engines.vllm.scheduler_engine): vLLM's own
scheduler step loop driven through the StepEngine API, on the installed release (run
it under another with ``PYTHONPATH=<release dir>``)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from kvhit.contract import EngineConfig, Ran, StepEngine, StepPlan, StepResult
from kvhit.engines.vllm.scheduler_engine import ALIGN_MODE, VllmSchedulerEngine
from kvhit.errors import BadInput, Unsupported
from kvhit.model.spec import Group
from kvhit.targets.registry import Mode, load

FULL = (Group("full", 2),)
TOKEN = 99
"""The token kvhit's executor samples."""


def engine(num_blocks: int = 16, budget: int = 4, asynchronous: bool = False) -> StepEngine:
    """vLLM's scheduler for one full attention group of blocks of 2 tokens."""
    config = EngineConfig(FULL, num_blocks, 2, budget=budget, asynchronous=asynchronous)
    return VllmSchedulerEngine(config)


def result(plan: StepPlan, prompts: dict[int, int]) -> StepResult:
    """What an executor reports for ``plan``: a token for each request whose step
    reaches the end of its prompt (``prompts``: lengths), none for a prompt chunk."""
    ran = tuple(
        Ran(s.request, (TOKEN,) if s.end >= prompts[s.request] else ()) for s in plan.scheduled
    )
    return StepResult(ran)


def steps(e: StepEngine, prompts: dict[int, int], n: int) -> tuple[list[StepPlan], list[int]]:
    """Run ``n`` steps, each reported at once: the plans, and who finished."""
    plans, finished = [], []
    for _ in range(n):
        plan = e.schedule()
        plans.append(plan)
        finished += e.executed(result(plan, prompts))
    return plans, finished


def ids(n: int, start: int = 0) -> Sequence[int]:
    """n distinct tokens."""
    return list(range(start, start + n))


def test_a_prompt_completes_over_chunked_steps() -> None:
    e = engine(budget=4)
    e.arrive(0, ids(10), max_new=2)
    plans, finished = steps(e, {0: 10}, 4)
    parts = [p.scheduled[0] for p in plans]
    assert [(s.computed, s.new) for s in parts] == [(0, 4), (4, 4), (8, 2), (10, 1)]
    assert [len(s.tables[0]) for s in parts] == [2, 4, 5, 6]
    assert all(s.tables[0][: len(parts[0].tables[0])] == parts[0].tables[0] for s in parts)
    assert [s.hit for s in parts] == [0, None, None, None]
    assert finished == [0]


def test_a_later_request_with_the_same_prefix_reads_the_first_ones_blocks() -> None:
    e = engine(budget=16)
    e.arrive(0, ids(8), max_new=1)
    (first,), _ = steps(e, {0: 8}, 1)
    e.arrive(1, [*ids(6), 50, 51], max_new=1)
    (second,), finished = steps(e, {1: 8}, 1)
    part = second.scheduled[0]
    assert (part.request, part.hit, part.computed, part.new) == (1, 6, 6, 2)
    assert part.tables[0][:3] == first.scheduled[0].tables[0][:3]
    assert part.tables[0][3] != first.scheduled[0].tables[0][3]
    assert finished == [1]
    assert e.snapshot(ids(8)).cached == ((True, True, True, True),)


def test_an_abort_frees_the_request_and_keeps_its_blocks_cached() -> None:
    e = engine(budget=4)
    assert isinstance(e, VllmSchedulerEngine)
    free = e.pool.get_num_free_blocks()
    e.arrive(0, ids(6), max_new=1)
    steps(e, {0: 6}, 1)
    assert e.pool.get_num_free_blocks() == free - 2
    e.abort(0)
    assert e.pool.get_num_free_blocks() == free
    assert e.schedule().scheduled == ()
    assert e.snapshot(ids(6)).cached == ((True, True, False),)


def test_a_small_pool_preempts_and_the_request_restarts_later() -> None:
    e = engine(num_blocks=4, budget=8)
    e.arrive(0, ids(4), max_new=4)
    e.arrive(1, ids(4, 20), max_new=4)
    plans, finished = steps(e, {0: 4, 1: 4}, 8)
    assert [p.preempted for p in plans].count((1,)) == 1
    at = next(i for i, p in enumerate(plans) if p.preempted)
    assert [s.request for s in plans[at].scheduled] == [0]
    restart = next(
        s for p in plans[at + 1 :] for s in p.scheduled if s.request == 1 and s.hit is not None
    )
    assert restart.computed == restart.hit
    assert restart.computed + restart.new == 5  # the prompt and the token sampled before
    assert finished == [0, 1]


def test_asynchronous_scheduling_reports_each_step_one_late() -> None:
    e = engine(budget=4, asynchronous=True)
    assert type(e.scheduler).__name__ == "AsyncScheduler"
    e.arrive(0, ids(6), max_new=3)
    plans = [e.schedule()]
    finished: list[int] = []
    for _ in range(5):
        plans.append(e.schedule())  # step n + 1 is scheduled before step n is reported
        finished += e.executed(result(plans[-2], {0: 6}))
    parts = [(s.computed, s.new) for p in plans for s in p.scheduled]
    assert parts == [(0, 4), (4, 2), (6, 1), (7, 1)]
    assert finished == [0]


def test_a_cut_step_is_an_abort_and_its_published_blocks_stay_cached() -> None:
    e = engine(budget=4)
    e.arrive(0, ids(6), max_new=1)
    plan = e.schedule()
    assert e.executed(StepResult((), cut=(0,))) == ()
    assert plan.scheduled[0].end == 4
    assert e.snapshot(ids(6)).cached == ((True, True, False),)  # published, never written
    assert e.schedule().scheduled == ()


def test_mamba_prefill_chunks_and_the_states_a_later_request_reads() -> None:
    groups = (Group("full", 4), Group("mamba", 4))
    config = EngineConfig(groups, 16, 4, budget=3)
    if not ALIGN_MODE:  # 0.14.0, 0.15.0: which states a chunk writes is not modelled
        with pytest.raises(Unsupported, match="no mamba_cache_mode"):
            VllmSchedulerEngine(config)
        return
    e = VllmSchedulerEngine(config)
    e.arrive(0, ids(10), max_new=1)
    plans, _ = steps(e, {0: 10}, 5)
    ends = [s.end for p in plans for s in p.scheduled]
    e.arrive(1, ids(11), max_new=1)
    (plan,), _ = steps(e, {1: 11}, 1)
    assert ends == [3, 4, 7, 8, 10]  # split at each Mamba block's end
    assert plan.scheduled[0].hit == 8
    assert plan.scheduled[0].tables[1][1] is not None


def test_results_that_do_not_match_a_step_are_bad_input() -> None:
    e = engine()
    with pytest.raises(BadInput, match="no scheduled step"):
        e.executed(StepResult(()))
    e.arrive(0, ids(4), max_new=1)
    e.schedule()
    with pytest.raises(BadInput, match="request 7 was not scheduled"):
        e.executed(StepResult((Ran(7, (1,)),)))


def test_what_vllm_refuses_is_unsupported() -> None:
    with pytest.raises(Unsupported, match="max_model_len"):
        engine().arrive(0, ids(5000), max_new=1)
    with pytest.raises(Unsupported, match="drafters"):
        VllmSchedulerEngine(EngineConfig((Group("full", 2, drafter="drop"),), 8, 2))


def test_the_registry_names_the_factory() -> None:
    assert load("vllm-scheduler", Mode.STATEFUL) is VllmSchedulerEngine
