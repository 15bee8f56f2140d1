"""The lifecycle gate (harness/lifecycle.py, docs/design.md §5.7): kvhit's own step
engine passes, and each broken one (tests/broken_steps.py) is caught, with the reason
that names its bug."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvhit.analysis import Verdict
from kvhit.harness.lifecycle import run_steps
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.targets.registry import Mode
from kvhit.targets.steps import StepProgram
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec

FULL2 = {"kind": "full", "block_size": 2}
MAMBA2 = {"kind": "mamba", "block_size": 2}


def program(
    groups: list[dict[str, Any]], num_blocks: int, budget: int, *events: dict
) -> StepProgram:
    obj = {"groups": groups, "num_blocks": num_blocks, "budget": budget, "events": list(events)}
    return StepProgram.from_json(obj)


def arrive(request: int, prompt: list[int], output: list[int]) -> dict[str, Any]:
    return {"op": "arrive", "request": request, "prompt": prompt, "output": output}


STEP = {"op": "step"}

CUT_THEN_HIT = program(
    [FULL2], 8, 8,
    arrive(0, [1, 2, 3, 4, 5], [6]), {"op": "step", "cut": [0]}, arrive(1, [1, 2, 3, 4, 9], [7]), STEP,
)  # fmt: skip
SAME_STEP = program(
    [MAMBA2], 16, 10, arrive(0, list(range(16)), [16]), STEP, arrive(1, [*range(12), 99], [5]), STEP
)
CROWDED = program(
    [FULL2, MAMBA2],
    8,
    8,
    arrive(0, [1, 2], [5, 5, 5, 5, 5]),
    arrive(1, [3, 4], [6, 6, 6, 6, 6]),
    STEP,
    STEP,
)
FAILED_LOAD = program(
    [FULL2, MAMBA2], 16, 8,
    arrive(0, [1, 2, 3, 4, 5, 6, 7, 8], [9]), STEP, arrive(1, [1, 2, 3, 4, 5, 6, 7, 8, 10], [11]),
    {"op": "step", "fail": [[1, 0, 2]]}, STEP,
)  # fmt: skip

CAUGHT = [
    ("PublishesAtSchedule", CUT_THEN_HIT, "unwritten block: r1 reads group 0 block 0"),
    ("SameStepMamba", SAME_STEP, "same-step state: r1 reads the Mamba state of group 0 block 5"),
    (
        "EvictsReferencedMamba",
        CROWDED,
        "same-step state: r0 reads the Mamba state of group 1 block 0",
    ),
    (
        "TruncationRecovery",
        FAILED_LOAD,
        "stale block: r1 reads group 1 block 1, but its table holds no block there",
    ),
]


def verdict(target: str, p: StepProgram) -> tuple[Verdict, str]:
    run = run_steps(TargetSpec(target).open(Mode.STATEFUL), p)
    return run.verdict.cls, run.verdict.reason


@pytest.mark.parametrize(("engine", "p", "reason"), CAUGHT, ids=[c[0] for c in CAUGHT])
def test_each_broken_engine_is_caught_where_the_impl_is_not(
    engine: str, p: StepProgram, reason: str
) -> None:
    assert verdict("impl-steps", p) == (Verdict.OK, "")
    cls, why = verdict(f"tests.broken_steps:{engine}", p)
    assert cls == Verdict.UNSAFE and why.startswith(reason), why


def test_a_cut_step_is_safe_when_its_blocks_were_never_published() -> None:
    """StepImpl publishes on the step's report: after the cut, r1 computes from 0."""
    run = run_steps(TargetSpec("impl-steps").open(Mode.STATEFUL), CUT_THEN_HIT)
    steps = [e.label for e in run.records if e.label.startswith("step")]
    assert steps == ["step 1: r0 0..5 (hit 0)", "step 2: r1 0..5 (hit 0)"]
    assert run.verdict.cls == Verdict.OK


def test_asynchronous_steps_read_what_earlier_unreported_steps_write() -> None:
    """Step 2 decodes the token step 1 samples, scheduled before step 1 is reported."""
    late = program([FULL2], 8, 8, arrive(0, [1, 2, 3, 4, 5], [6, 7]), STEP, STEP)
    late = replace(late, config=replace(late.config, asynchronous=True))
    run = run_steps(TargetSpec("impl-steps").open(Mode.STATEFUL), late)
    assert run.verdict.cls == Verdict.OK
    assert [e.label for e in run.records][1:3] == ["step 1: r0 0..5 (hit 0)", "step 2: r0 5..6"]


def test_the_impl_passes_a_campaign_of_step_programs() -> None:
    tally = run_programs(
        TargetSpec("impl-steps").open(Mode.STATEFUL), TargetRecord("impl-steps"),
        ProgramPlan(seed=7), programs=60,
    )  # fmt: skip
    assert tally.cases == 60 and tally.disagreements == 0 and tally.counts[Verdict.OK] > 60


def test_a_campaign_finds_a_published_step_that_never_ran(tmp_path: Any) -> None:
    tally = run_programs(
        TargetSpec("tests.broken_steps:PublishesAtSchedule").open(Mode.STATEFUL),
        TargetRecord("tests.broken_steps:PublishesAtSchedule"),
        ProgramPlan(seed=0, out_dir=tmp_path), programs=400,
    )  # fmt: skip
    assert [f.cls for f in tally.found] == [Verdict.UNSAFE]
    assert "was cut and never ran" in tally.found[0].reason
    assert [p.name.startswith("steps-unsafe-") for p in tmp_path.iterdir()] == [True]
