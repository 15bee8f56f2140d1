"""Saved files (kvhit.harness.saved): what a campaign writes reads back as the same
typed record; the files of format 1 (a stateless and a stateful one, as kvhit wrote
them before the target was a structured record) still load, their target label
parsed into a record; replay and export run a file on the target it records."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvhit.analysis import Verdict
from kvhit.cli.main import main
from kvhit.harness.saved import CaseFile, ProgramFile, SavedFormat, decode, save
from kvhit.model.protocol import QueryError, parse_query
from kvhit.targets.stateful import Admit, Program
from kvhit.targets.target_record import TargetRecord

QUERY = {
    "groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
    "cached": ["01", "10"],
    "max_length": 2,
}
PROGRAM = {
    "groups": [{"kind": "full", "block_size": 2}],
    "num_blocks": 4,
    "ops": [{"op": "admit", "request": 0, "tokens": [1, 2, 3]}],
}
OLD_CASE = {  # as kvhit wrote a stateless disagreement in format 1
    "format": "kvhit-disagreement/1",
    "target": "vllm[eagle=drop]",
    "class": "unsafe",
    "query": QUERY,
    "target_answer": {"length": 1, "blocks": [[0], [0]]},
    "reference": {"length": 0, "blocks": [[], []]},
    "reason": "group 0 needs block 0 at L=1, not cached",
}
OLD_PROGRAM = {  # as kvhit wrote a stateful disagreement in format 1
    "format": "kvhit-stateful/1",
    "target": "cmd:./engine --fast",
    "class": "lost_reuse",
    "reason": "a reason",
    "program": PROGRAM,
    "failing_op": 1,
    "snapshot": {**QUERY, "groups": PROGRAM["groups"], "cached": [[True]], "max_length": 2},
    "target_answer": {"length": 0, "reused": [[]], "tables": [[1, 2]]},
    "reference": {"length": 2, "blocks": [[0]]},
}


def test_a_case_file_of_format_1_loads_with_its_label_as_a_record() -> None:
    saved = decode(json.dumps(OLD_CASE))
    assert isinstance(saved, CaseFile)
    assert saved.target == TargetRecord("vllm", (("eagle", "drop"),))
    assert (saved.cls, saved.reason) == (Verdict.UNSAFE, OLD_CASE["reason"])
    assert saved.query == parse_query(QUERY)
    assert saved.target_answer == OLD_CASE["target_answer"]


def test_a_program_file_of_format_1_loads_with_its_label_as_a_record() -> None:
    saved = decode(json.dumps(OLD_PROGRAM))
    assert isinstance(saved, ProgramFile)
    assert saved.target == TargetRecord(command="./engine --fast")
    assert saved.cls == Verdict.LOST_REUSE and saved.program.ops == (Admit(0, (1, 2, 3)),)
    assert saved.snapshot == parse_query(OLD_PROGRAM["snapshot"])


def test_an_old_file_is_written_again_in_format_2_with_a_structured_target() -> None:
    for old, form in ((OLD_CASE, SavedFormat.CASE), (OLD_PROGRAM, SavedFormat.PROGRAM)):
        saved = decode(json.dumps(old))
        again = saved.to_json()
        assert again["format"] == form and isinstance(again["target"], dict)
        assert decode(json.dumps(again)) == saved
        assert again["reference"] == old["reference"]


def test_what_is_saved_reads_back_the_same(tmp_path: Path) -> None:
    record = TargetRecord("vllm-connector", (("divergent", "on"),))
    case = CaseFile(parse_query(QUERY), record, Verdict.UNSAFE, {"length": 1}, "why")
    program = ProgramFile(Program.from_json(PROGRAM), record, Verdict.CRASH, "it fell over")
    for saved in (case, program):
        path = save(saved, tmp_path)
        assert path.name == saved.file_name() and decode(path.read_text()) == saved
        assert json.loads(path.read_text())["target"] == {
            "name": "vllm-connector",
            "options": {"divergent": "on"},
        }
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [case.file_name(), program.file_name()]
    )  # no temporary file left


def test_plain_queries_and_programs_are_saved_cases_of_no_target() -> None:
    assert decode(json.dumps(QUERY)) == CaseFile(parse_query(QUERY))
    assert decode(json.dumps(PROGRAM)) == ProgramFile(Program.from_json(PROGRAM))


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"format": "kvhit-case/9"}, "format"),
        ({"format": "kvhit-case/2", "target": "vllm[eagle=drop]"}, "target"),
        ({"format": "kvhit-case/2", "target": {"name": "vllm", "command": "x"}}, "target"),
        ({"format": "kvhit-case/2", "target": {"command": "x", "options": {"a": "b"}}}, "target"),
        ({"class": "wrong"}, "class"),
        ({"reason": 3}, "reason"),
        ({"query": {"groups": []}}, "groups"),
    ],
)
def test_a_bad_saved_file_names_what_is_wrong(change: dict, field: str) -> None:
    with pytest.raises(QueryError) as err:
        decode(json.dumps({**OLD_CASE, **change}))
    assert err.value.field.startswith(field)


def test_target_records_and_their_labels() -> None:
    for record in (
        TargetRecord("impl"),
        TargetRecord("vllm", (("eagle", "drop"),)),
        TargetRecord("my_module:find_hit"),
        TargetRecord(command="./engine --fast"),
    ):
        assert TargetRecord.from_json(record.to_json()) == record
        assert TargetRecord.from_label(record.label) == record


def test_replay_runs_an_old_file_on_the_target_its_label_names(tmp_path: Path) -> None:
    old = {**OLD_CASE, "target": "seed-min"}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    result = CliRunner().invoke(main, ["replay", str(path), "--json"])
    assert result.exit_code == 1, result.output
    replayed = json.loads(result.stdout)
    assert replayed["target"] == {"name": "seed-min"} and replayed["saved_class"] == "unsafe"
    assert "replayed on --target seed-min, the target it records" in result.stderr


def test_replay_runs_a_new_file_on_the_recorded_target_with_its_options(tmp_path: Path) -> None:
    record = TargetRecord("model")
    path = save(CaseFile(parse_query(QUERY), record, Verdict.UNSAFE, 1, "why"), tmp_path)
    result = CliRunner().invoke(main, ["replay", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["class"] == "ok"
    on_options = {"target": {"name": "model", "options": {"eagle": "drop"}}}
    path.write_text(json.dumps({**json.loads(path.read_text()), **on_options}))
    result = CliRunner().invoke(main, ["replay", str(path)])
    assert result.exit_code == 2 and "takes no options" in result.stderr
