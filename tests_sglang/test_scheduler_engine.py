"""SGLang's own scheduler as a step-level engine (kvhit.engines.sglang.scheduler_engine),
driven directly through the step contract."""

from __future__ import annotations

import doctest
from typing import Any

import pytest

from kvhit.analysis import Verdict
from kvhit.contract import EngineConfig, Ran, StepEngine, StepPlan, StepResult
from kvhit.engines.sglang import scheduler_engine
from kvhit.engines.sglang.scheduler_engine import SglangSchedulerEngine
from kvhit.errors import Unsupported
from kvhit.harness.lifecycle import run_steps
from kvhit.model.spec import Group
from kvhit.targets.runner import CallableRunner
from kvhit.targets.stateful import EngineHost
from kvhit.targets.steps import StepProgram

FULL = Group("full", 1)
WINDOW = Group("sliding_window", 1, window=3)  # inclusive 3: SGLang's 2
MAMBA = Group("mamba", 1)


def engine(*groups: Group, budget: int | None = 4, num_blocks: int = 32) -> SglangSchedulerEngine:
    return SglangSchedulerEngine(EngineConfig(groups, num_blocks, 1, budget=budget))


def run(engine: SglangSchedulerEngine, outputs: dict[int, list[int]]) -> StepPlan:
    """Schedule one step and report it, each request sampling its next output token
    once its step reaches the last token it has."""
    plan = engine.schedule()
    ran: list[Ran] = []
    for s in plan.scheduled:
        have = len(engine.requests[s.request].req.origin_input_ids) + len(
            engine.requests[s.request].req.output_ids
        )
        ran.append(Ran(s.request, (outputs[s.request].pop(0),) if s.end == have else ()))
    engine.finished = engine.executed(StepResult(tuple(ran)))  # type: ignore[attr-defined]
    return plan


def parts(plan: StepPlan) -> list[tuple[int, int, int, int | None]]:
    return [(s.request, s.computed, s.end, s.hit) for s in plan.scheduled]


def test_it_is_a_step_engine() -> None:
    assert isinstance(engine(FULL), StepEngine)


def test_chunks_advance_by_the_budget_then_decode_finishes() -> None:
    sglang = engine(FULL, budget=4)
    sglang.arrive(0, list(range(10)), max_new=2)
    outputs = {0: [100, 101]}
    steps = [parts(run(sglang, outputs)) for _ in range(4)]
    assert steps == [[(0, 0, 4, 0)], [(0, 4, 8, None)], [(0, 8, 10, None)], [(0, 10, 11, None)]]
    assert sglang.finished == (0,)  # type: ignore[attr-defined]
    assert sglang.schedule().scheduled == ()


def test_a_later_request_hits_the_prefix_an_earlier_one_cached() -> None:
    sglang = engine(FULL, budget=8)
    sglang.arrive(0, list(range(6)), max_new=1)
    first = run(sglang, {0: [50]})
    sglang.arrive(1, [*range(6), 9, 9], max_new=1)
    (part,) = run(sglang, {1: [51]}).scheduled
    assert (part.computed, part.hit) == (6, 6)
    # the hit reads the pages the first request wrote
    assert part.tables[0][:6] == first.scheduled[0].tables[0][:6]


def test_window_kv_behind_the_window_is_freed_during_chunked_prefill() -> None:
    """SGLang's window of 2 (inclusive 3), chunks of 4. Each chunk's result caches it
    in the tree, and frees the request's own window KV behind the window
    (``free_swa_out_of_window_slots``, common.py:75: below T - 1 - 2, T the chunk's
    end), never below what the tree now owns (``swa_dead_lo``,
    schedule_batch.py:994); the tree's own window KV stays until the tree evicts
    it. The full KV all stays."""
    sglang = engine(FULL, WINDOW, budget=4)
    sglang.arrive(0, list(range(12)), max_new=1)
    outputs = {0: [7]}
    run(sglang, outputs)
    second = run(sglang, outputs).scheduled[0]
    assert [j for j, b in enumerate(second.tables[1]) if b is None] == [0]
    third = run(sglang, outputs).scheduled[0]
    assert [j for j, b in enumerate(third.tables[1]) if b is None] == [0, 4]
    assert None not in third.tables[0]
    # the last chunk finished the request: its release caches that chunk whole
    tree = sglang.snapshot(list(range(12))).cached
    assert tree == ((True,) * 12, (False, True, True, True) * 2 + (True,) * 4)


def test_mamba_states_are_copied_into_the_tree_and_read_at_a_hit() -> None:
    sglang = engine(FULL, MAMBA, budget=4)
    sglang.arrive(0, list(range(6)), max_new=1)
    outputs = {0: [7], 1: [8]}
    first = run(sglang, outputs).scheduled[0]
    own = first.tables[1][3]
    assert own is not None and first.tables[1][:3] == (None,) * 3
    second = run(sglang, outputs)
    # the first chunk's state went into a slot of the tree after it ran
    ((source, kept),) = second.copies
    assert source == own and kept != own
    assert second.scheduled[0].tables[1][3] == own  # the chunk reads its own state
    sglang.arrive(1, [0, 1, 2, 3, 9], max_new=1)
    hit = run(sglang, outputs).scheduled[0]
    assert (hit.computed, hit.hit) == (4, 4)
    assert hit.tables[1][3] == kept  # it reads the tree's copy
    assert hit.tables[1][4] not in (own, kept)


def test_abort_of_a_request_being_chunked_frees_what_it_held() -> None:
    """Released at the next step's ``process_pending_chunked_abort``
    (scheduler.py:3778), its chunk not cached."""
    sglang = engine(FULL, budget=4, num_blocks=24)
    free = sglang.scheduler.token_to_kv_pool_allocator.available_size()
    sglang.arrive(0, list(range(10)), max_new=4)
    run(sglang, {0: []})
    assert sglang.scheduler.token_to_kv_pool_allocator.available_size() < free
    sglang.abort(0)
    assert sglang.schedule().scheduled == ()  # the chunk is released, not continued
    assert sglang.scheduler.tree_cache.full_evictable_size() == 0
    assert sglang.scheduler.token_to_kv_pool_allocator.available_size() == free
    assert sglang.scheduler.chunked_req is None


def test_an_aborted_running_request_runs_one_more_step_as_draining() -> None:
    """SGLang runs a running request's next step after its abort and frees it with
    that step's result (scheduler.py:5799): the step is in the plan as draining, the
    request is never reported finished, and its KV is freed into the tree."""
    sglang = engine(FULL, budget=8, num_blocks=16)
    free = sglang.scheduler.token_to_kv_pool_allocator.available_size()
    sglang.arrive(0, list(range(4)), max_new=3)
    run(sglang, {0: [9]})
    sglang.abort(0)
    plan = run(sglang, {})
    assert plan.scheduled == () and [(s.request, s.computed, s.end) for s in plan.draining] == [
        (0, 4, 5)
    ]
    assert sglang.finished == ()  # type: ignore[attr-defined]
    assert sglang.schedule() == StepPlan(())
    held = sglang.scheduler.tree_cache.full_evictable_size()
    assert sglang.scheduler.token_to_kv_pool_allocator.available_size() + held == free


def test_a_waiting_request_is_aborted_before_it_runs() -> None:
    sglang = engine(FULL, budget=4)
    sglang.arrive(0, list(range(4)), max_new=1)
    sglang.arrive(1, list(range(4)), max_new=1)
    sglang.abort(1)
    assert [s.request for s in sglang.schedule().scheduled] == [0]


def test_asynchronous_steps_are_refused() -> None:
    with pytest.raises(Unsupported, match="overlap"):
        SglangSchedulerEngine(EngineConfig((FULL,), 8, 1, asynchronous=True))


def test_a_budget_off_the_page_grid_is_refused_as_sglang_refuses_it() -> None:
    with pytest.raises(Unsupported, match="multiple of its page size"):
        SglangSchedulerEngine(EngineConfig((Group("full", 4),), 8, 4, budget=6))


def test_a_prompt_too_long_for_the_pool_is_refused_as_sglang_refuses_it() -> None:
    """16 pages of one token: SGLang's longest request is 15 tokens, its longest
    prompt 10 (tp_worker.py:568-572), and it clips what a request may generate to
    what is left, finishing it sooner."""
    sglang = engine(FULL, budget=4, num_blocks=16)
    with pytest.raises(Unsupported, match="exceeds the maximum allowed length"):
        sglang.arrive(0, list(range(10)), max_new=1)
    sglang.arrive(1, list(range(9)), max_new=20)
    outputs = {1: list(range(20))}
    for _ in range(10):
        run(sglang, outputs)
        if sglang.finished:  # type: ignore[attr-defined]
            break
    assert sglang.finished == (1,)  # type: ignore[attr-defined]
    assert len(outputs[1]) == 20 - (15 - 9 - 1)  # max_req_len - input - 1 tokens


def test_the_docstring_examples_hold() -> None:
    result = doctest.testmod(scheduler_engine)
    assert result.attempted > 0 and result.failed == 0


def test_the_loop_is_declared() -> None:
    loop: Any = SglangSchedulerEngine.capabilities.loop
    assert loop is not None and not loop.cuts and not loop.asynchronous


def test_the_lifecycle_gate_reads_sglangs_chunks_and_hits_as_written() -> None:
    """A chunked prompt, then a second one sharing its first two pages: every read of
    every step is of a page a step that ran has written, and the second hits 8 tokens.
    (Drawn campaigns report overwritten blocks not triaged yet:
    docs/engines/sglang.md, "The scheduler's step loop".)"""
    first, second = list(range(1, 13)), [*range(1, 9), 20, 21, 22, 23]
    program = StepProgram.from_json({
        "groups": [{"kind": "full", "block_size": 4}], "num_blocks": 32, "budget": 4,
        "events": [{"op": "arrive", "request": 0, "prompt": first, "output": [30]},
                   *[{"op": "step"}] * 4,
                   {"op": "arrive", "request": 1, "prompt": second, "output": [31]}],
    })  # fmt: skip
    run = run_steps(CallableRunner(EngineHost(SglangSchedulerEngine), timeout=60.0), program)
    assert run.verdict.cls == Verdict.OK, run.verdict.reason
    labels = [e.label for e in run.records]
    assert "step 1: r0 0..4 (hit 0)" in labels and any("r1 8..12 (hit 8)" in x for x in labels)


def test_a_chunked_prompt_whose_window_fills_the_window_pool_never_finishes() -> None:
    """A finding (stuck): pages of 4, SGLang's window 10, 9 pages of KV and 4 of
    window KV (16 slots: above SGLang's floor of window + page = 14,
    model_executor/pool_configurator.py:210), chunks of 4. After three chunks the
    request holds 12 window slots it still reads (tokens 2..11 are in the next
    chunk's window), 4 are free, nothing is evictable; the last chunk is charged 10
    (``estimate_swa_kv_tokens`` through ``SWAPrefillBudget.fit_chunk``,
    mem_cache/prefill_budget.py:432-451), so ``add_chunked_req`` parks it
    (managers/schedule_policy.py:1176-1181) at every step, forever."""
    groups = (Group("full", 4), Group("sliding_window", 4, window=11))
    sglang = SglangSchedulerEngine(EngineConfig(groups, 9, 4, budget=4))
    prompt = [0, 1, 1, 2, 2, 0, 0, 0, 0, 1, 2, 0, 2, 2, 2, 0]
    sglang.arrive(0, prompt, max_new=2)
    chunks = [parts(run(sglang, {0: [1, 1]})) for _ in range(6)]
    assert chunks == [[(0, 0, 4, 0)], [(0, 4, 8, None)], [(0, 8, 12, None)], [], [], []]
    allocator = sglang.scheduler.token_to_kv_pool_allocator
    assert allocator.swa_available_size() == 4
    assert sglang.scheduler.tree_cache.swa_evictable_size() == 0
    assert sglang.scheduler.chunked_req is sglang.requests[0].req


def test_a_hit_that_pins_window_kv_can_leave_a_request_waiting_forever() -> None:
    """The same class (stuck), no chunk pending: pages of 4, SGLang's window 11, 16
    window KV slots (floor 15). Two requests cached, nothing running, all 16 slots
    free or evictable; a request hitting one cached page (its window KV pinned by the
    admission lock, schedule_policy.py:1431) is charged 13 window slots
    (``estimate_swa_kv_tokens``, mem_cache/prefill_budget.py:27, whose comment names
    this risk for pools of about two windows) and admitted only if 13 < 12, the
    slots left unpinned (prefill_budget.py:250-254): never."""
    groups = (Group("full", 4), Group("sliding_window", 4, window=12))
    sglang = SglangSchedulerEngine(EngineConfig(groups, 9, 4, budget=4))
    sglang.arrive(0, [0] * 11, max_new=2)
    sglang.arrive(1, [0] * 5, max_new=1)
    outputs = {0: [1, 1], 1: [1]}
    while sglang.requests:
        run(sglang, outputs)
    allocator, tree = sglang.scheduler.token_to_kv_pool_allocator, sglang.scheduler.tree_cache
    assert allocator.swa_available_size() + tree.swa_evictable_size() == allocator.size_swa
    sglang.arrive(2, [0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0], max_new=1)
    assert [parts(run(sglang, {2: [1]})) for _ in range(3)] == [[], [], []]
