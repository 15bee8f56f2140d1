"""vLLM's scheduler loop under the lifecycle gate (docs/design.md §5.7): its own
publish-at-schedule order raises no alarm while every scheduled step runs, and an
executor that drops an aborted request's step in flight (vLLM #56525) is caught."""

from __future__ import annotations

from pathlib import Path

from kvhit.analysis import Verdict
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.targets.registry import Mode
from kvhit.targets.target_spec import TargetSpec

KINDS = ("full", "sliding_window", "mamba")


def test_publishing_at_schedule_raises_no_alarm_when_every_step_runs() -> None:
    spec = TargetSpec("vllm-scheduler")
    tally = run_programs(
        spec.open(Mode.STATEFUL), spec.record, ProgramPlan(kinds=KINDS, seed=5), programs=80
    )
    assert tally.cases == 80 and tally.disagreements == 0, [f.render() for f in tally.found]
    assert tally.counts[Verdict.OK] > 400


def test_a_step_dropped_in_flight_leaves_published_blocks_unwritten(tmp_path: Path) -> None:
    spec = TargetSpec("vllm-scheduler", options=(("cuts", "drop"),))
    plan = ProgramPlan(kinds=KINDS, seed=0, out_dir=tmp_path)
    tally = run_programs(spec.open(Mode.STATEFUL), spec.record, plan, programs=600)
    assert [f.cls for f in tally.found] == [Verdict.UNSAFE]
    assert "was cut and never ran" in tally.found[0].reason
    assert [p.name.startswith("steps-unsafe-") for p in tmp_path.iterdir()] == [True]
