"""The step protocol's programs, plans and files (targets/steps.py, harness/saved.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from kvhit.contract import Scheduled, StepPlan
from kvhit.harness.saved import StepsFile, decode
from kvhit.model.protocol import QueryError
from kvhit.targets.steps import Abort, Arrive, Failure, StepEvent, StepProgram, decode_plan
from kvhit.targets.wire import BadReturn

GROUPS = [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 2}]


def program(*events: dict) -> dict:
    return {"groups": GROUPS, "num_blocks": 8, "budget": 4, "events": list(events)}


ARRIVE = {"op": "arrive", "request": 0, "prompt": [1, 2, 3], "output": [4, 5]}


def test_a_program_parses_and_prints_back() -> None:
    obj = program(
        ARRIVE, {"op": "step", "cut": [0], "fail": [[0, 1, 0]]}, {"op": "abort", "request": 0}
    )
    parsed = StepProgram.from_json(obj)
    assert parsed.events == (
        Arrive(0, (1, 2, 3), (4, 5)),
        StepEvent(cut=(0,), fail=(Failure(0, 1, 0),)),
        Abort(0),
    )
    assert parsed.config.budget == 4 and not parsed.config.asynchronous
    assert StepProgram.from_json(parsed.to_json()) == parsed


@pytest.mark.parametrize(
    ("events", "field", "says"),
    [
        ([{"op": "abort", "request": 1}], "events[0].request", "has not arrived"),
        ([ARRIVE, ARRIVE], "events[1].request", "has arrived already"),
        (
            [ARRIVE, {"op": "abort", "request": 0}, {"op": "abort", "request": 0}],
            "events[2].request",
            "aborted already",
        ),
        ([ARRIVE, {"op": "step", "fail": [[0, 2, 0]]}], "events[1].fail[0][1]", "names group 2"),
        ([ARRIVE, {"op": "step", "fail": [[0, -1, 0]]}], "events[1].fail[0]", "non-negative"),
        ([ARRIVE, {"op": "step", "cut": [7]}], "events[1].cut[0]", "has not arrived"),
        ([ARRIVE, {"op": "step", "late": True}], "events[1].late", "no field of a step"),
        ([{**ARRIVE, "output": []}], "events[0].output", "non-empty"),
        ([{"op": "finish", "request": 0}], "events[0]", "'arrive' | 'abort' | 'step'"),
    ],
)
def test_a_malformed_program_names_the_field(events: list, field: str, says: str) -> None:
    with pytest.raises(QueryError) as err:
        StepProgram.from_json(program(*events))
    assert err.value.field == field and says in str(err.value)


def test_a_negative_budget_is_refused() -> None:
    with pytest.raises(QueryError, match="budget"):
        StepProgram.from_json({**program(), "budget": -1})


def test_a_plan_line_decodes_and_a_malformed_one_is_a_bad_return() -> None:
    line = {"scheduled": [{"request": 3, "computed": 2, "new": 2, "tables": [[1, None], [4]],
                           "hit": 2, "loaded": [[1], []]}], "preempted": [1]}  # fmt: skip
    assert decode_plan(line) == StepPlan(
        (Scheduled(3, 2, 2, ((1, None), (4,)), hit=2, loaded=((1,), ())),), preempted=(1,)
    )
    for bad in (
        {"scheduled": [{"request": 3}]},
        {"scheduled": [{**line["scheduled"][0], "tables": [[-1]]}]},
        [],
    ):
        with pytest.raises(BadReturn):
            decode_plan(bad)


def test_a_steps_file_decodes_to_its_program(tmp_path: Path) -> None:
    parsed = StepProgram.from_json(program(ARRIVE, {"op": "step"}))
    saved = StepsFile(parsed, None, None, None, ("arrive r0 [1 2 3]",))
    back = decode(json.dumps(saved.to_json()))
    assert isinstance(back, StepsFile) and back.program == parsed
    plain = decode(json.dumps(parsed.to_json()))
    assert isinstance(plain, StepsFile) and plain.program == parsed


def test_replaying_a_malformed_program_is_one_line_and_exit_2(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(program({"op": "abort", "request": 5})))
    done = subprocess.run(
        [sys.executable, "-m", "kvhit.cli", "replay", str(path), "--target", "impl"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.strip().splitlines() == [
        f"error: {path}: events[0].request: request 5 has not arrived"
    ]
