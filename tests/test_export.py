"""``kvhit export`` without an engine installed: the file it writes (Python that imports
only the engine, torch, pytest and the standard library, the spec's answer written in
it, the state drawn in its docstring, the checks of what the query needs of the
release), and every problem as one ``error:`` line with exit code 2. Running the
files under vLLM's releases: tests_vllm/test_export.py."""

from __future__ import annotations

import ast
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from kvhit.analysis import Analysis, Verdict
from kvhit.cli.main import main
from kvhit.engines.vllm.divergences import DIVERGENCES, below_partial_boundary, eagle_windows
from kvhit.harness.report import Disagreement
from kvhit.harness.saved import save
from kvhit.model.protocol import parse_query
from kvhit.model.spec import longest_hit
from kvhit.targets.target_record import TargetRecord

ALLOWED = {"__future__", "inspect", "pytest", "torch", "vllm"}
"""The top-level modules a generated vLLM test may import."""

EAGLE_WINDOWS = next(d for d in DIVERGENCES if d.scope is eagle_windows)  # unsafe, 0.32.0 …
PARTIAL_BLOCK = next(d for d in DIVERGENCES if d.scope is below_partial_boundary)  # 0.26.0 …


def export(*args: str) -> Result:
    """Run ``kvhit export`` in this process."""
    return CliRunner().invoke(main, ["export", *args])


def saved(tmp_path: Path, example: dict[str, Any], target: str = "vllm") -> str:
    """A query saved as the gate saves a disagreement of ``target`` (answered 0)."""
    record = TargetRecord.from_label(target)
    d = Disagreement(
        record, Verdict.LOST_REUSE, Analysis(parse_query(example)), {"length": 0}, "a reason"
    )
    return str(save(d.saved(), tmp_path / "saved"))


def constants(text: str) -> dict[str, Any]:
    """The literal module-level constants of a generated file."""
    found = {}
    for node in ast.parse(text).body:
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def imported(text: str) -> set[str]:
    """The top-level modules a file imports anywhere."""
    found = set()
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            found.add((node.module or "").split(".")[0])
    return found


def one_error(result: Result) -> str:
    """The one ``error:`` line of a run that exited 2, with nothing on stdout."""
    assert result.exit_code == 2 and result.stdout == "", result.output
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), lines
    return lines[0]


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=lambda d: d.name)
def test_a_saved_lookup_becomes_a_vllm_test_asserting_the_spec(divergence, tmp_path: Path):
    source = saved(tmp_path, divergence.example)
    result = export(source)
    assert result.exit_code == 0, result.output
    text = result.stdout
    best = longest_hit(divergence.query)
    found = constants(text)
    assert (found["EXPECTED_LENGTH"], found["EXPECTED_BLOCKS"]) == (
        best.length,
        [list(b) for b in best.blocks],
    )
    assert (found["MAX_LENGTH"], found["NUM_TOKENS"]) == (
        divergence.query.max_length,
        divergence.query.num_tokens,
    )
    assert imported(text) <= ALLOWED
    assert "group 0  " in ast.get_docstring(ast.parse(text))
    compile(text, "generated.py", "exec")


def test_the_docstring_draws_the_state_and_names_the_class(tmp_path: Path):
    text = export(saved(tmp_path, EAGLE_WINDOWS.example)).stdout
    doc = ast.get_docstring(ast.parse(text))
    assert "    group 0  sliding_window w=2 b=1 eagle   # . # #" in doc
    assert "L* = 0" in doc and "When saved, vLLM answered 0 (lost_reuse): a reason." in doc
    assert f"- {EAGLE_WINDOWS.name} (unsafe; vLLM 0.32.0 … 0.34.0)" in " ".join(doc.split())


def test_the_file_checks_only_what_the_query_needs_of_the_release(tmp_path: Path):
    partial = export(saved(tmp_path, PARTIAL_BLOCK.example)).stdout
    assert "enable_partial_hash_hits" in partial and 'scheduler_block_size" in' in partial
    assert 'is_eagle_group" in' not in partial
    eagle = export(saved(tmp_path, EAGLE_WINDOWS.example)).stdout
    assert "enable_partial_hash_hits" not in eagle and 'is_eagle_group" in' not in eagle


def test_a_lookahead_drafter_needs_lookahead_hashes_and_keys_its_hashes(tmp_path: Path):
    drafter = {"kind": "full", "block_size": 2, "drafter": "lookahead", "lookahead": 2}
    window = {"kind": "sliding_window", "block_size": 2, "window": 3}
    example = {
        "groups": [drafter, window],
        "cached": ["111", "011"],
        "max_length": 5,
        "num_tokens": 8,
    }
    text = export(saved(tmp_path, example)).stdout
    assert '"num_hash_lookahead_tokens" in COORDINATOR_PARAMS' in text
    assert constants(text)["LOOKAHEAD_TOKENS"] == 2


def test_o_writes_the_file_and_says_so(tmp_path: Path):
    out = tmp_path / "test_exported.py"
    source = saved(tmp_path, EAGLE_WINDOWS.example)
    result = export(source, "-o", str(out))
    assert result.exit_code == 0 and result.stdout == ""
    assert out.read_text() == export(source).stdout
    assert result.stderr == f"{source}: vllm test written to {out}\n"


def test_a_plain_query_needs_the_engine_named(tmp_path: Path):
    plain = tmp_path / "q.json"
    plain.write_text(json.dumps(EAGLE_WINDOWS.example))
    assert "records no target: give --engine (vllm, sglang)" in one_error(export(str(plain)))
    result = export(str(plain), "--engine", "vllm")
    assert result.exit_code == 0 and "When saved" not in result.stdout


def test_a_target_of_no_engine_needs_the_engine_named(tmp_path: Path):
    source = saved(tmp_path, EAGLE_WINDOWS.example, target="impl")
    assert "records target 'impl': give --engine" in one_error(export(source))


def test_an_unknown_engine_is_one_line(tmp_path: Path):
    source = saved(tmp_path, EAGLE_WINDOWS.example)
    assert one_error(export(source, "--engine", "trtllm")) == (
        "error: --engine 'trtllm': expected one of vllm, sglang"
    )


def test_an_unreadable_file_is_one_line(tmp_path: Path):
    assert "No such file or directory" in one_error(export(str(tmp_path / "missing.json")))
    assert one_error(export(str(tmp_path))).endswith("Is a directory")
    broken = tmp_path / "broken.json"
    broken.write_bytes(b"\xff\xfe")
    assert "not UTF-8 text" in one_error(export(str(broken)))
    broken.write_text('{"groups": []}')
    assert one_error(export(str(broken))).startswith(f"error: {broken}: ")


def test_an_unwritable_output_is_one_line(tmp_path: Path):
    source = saved(tmp_path, EAGLE_WINDOWS.example)
    message = one_error(export(source, "-o", str(tmp_path / "no" / "such" / "test.py")))
    assert message.startswith("error: -o: cannot write ")
    assert one_error(export(source, "-o", str(tmp_path))).endswith("Is a directory")


def test_a_query_no_release_can_be_asked_is_one_line(tmp_path: Path):
    lone = {
        "groups": [{"kind": "full", "block_size": 2}],
        "cached": ["1"],
        "max_length": 3,
        "alignment": 4,
    }
    message = one_error(export(saved(tmp_path, lone)))
    assert "no vLLM release can be asked this: vLLM aligns a single group's hits" in message


def program_record(cls: str, answer: dict[str, Any], reason: str = "a reason") -> dict:
    """A saved stateful disagreement of one full attention group: a prompt admitted,
    finished, and admitted again with one more token, vLLM's answer ``answer``."""
    group = {"kind": "full", "block_size": 2}
    snapshot = {"groups": [group], "cached": [[True, True]], "max_length": 4, "num_tokens": 5}
    return {
        "format": "kvhit-stateful/1",
        "target": "vllm",
        "class": cls,
        "reason": reason,
        "program": {
            "groups": [group],
            "num_blocks": 8,
            "ops": [
                {"op": "admit", "request": 0, "tokens": [1, 2, 3, 4]},
                {"op": "finish", "request": 0},
                {"op": "admit", "request": 1, "tokens": [1, 2, 3, 4, 5]},
            ],
        },
        "failing_op": 3,
        "snapshot": snapshot,
        "target_answer": answer,
    }


def test_a_saved_program_becomes_manager_calls_asserting_at_its_last_operation(tmp_path: Path):
    source = tmp_path / "program.json"
    answer = {"length": 2, "reused": [[1]], "tables": [[1, 3, 4]]}
    source.write_text(json.dumps(program_record("lost_reuse", answer)))
    text = export(str(source)).stdout
    body = text[text.index("def test_") :]
    calls = [
        line.strip()
        for line in body.splitlines()
        if line.strip().startswith(("admit", "finish", "hit ="))
    ]
    assert calls == [
        "admit(manager, running, 0, [1, 2, 3, 4])  # 1.",
        "finish(manager, running, 0)  # 2.",
        "hit = admit(manager, running, 1, [1, 2, 3, 4, 5])  # 3. <- lost_reuse",
    ]
    found = constants(text)
    assert (found["EXPECTED_LENGTH"], found["EXPECTED_BLOCKS"]) == (4, [[0, 1]])
    assert found["STATE"] == [[True, True]] and found["NUM_BLOCKS"] == 9
    assert imported(text) <= ALLOWED
    compile(text, "generated.py", "exec")


def test_a_finding_in_block_contents_alone_is_not_exported(tmp_path: Path):
    source = tmp_path / "program.json"
    correct = {"length": 4, "reused": [[1, 2]], "tables": [[1, 2, 5]]}
    source.write_text(json.dumps(program_record("unsafe", correct, "stale block: ...")))
    message = one_error(export(str(source)))
    assert "the engine's hit is the correct one" in message and "stale block" in message


def test_a_plain_program_has_nothing_to_export(tmp_path: Path):
    source = tmp_path / "program.json"
    source.write_text(json.dumps(program_record("ok", {})["program"]))
    assert "a plain program, not a saved disagreement" in one_error(export(str(source)))


def test_the_command_is_listed():
    assert "export" in CliRunner().invoke(main, ["--help"]).output
    assert sys.modules.get("vllm") is None


def test_a_tiered_lookup_or_program_is_not_exported_as_a_pool_lookup(tmp_path: Path):
    tier = {"name": "lmcache", "holds": ["full"], "cached": {"0": "11"}}
    query = {"groups": [{"kind": "full", "block_size": 2}], "cached": ["1"], "max_length": 4}
    source = saved(tmp_path, {**query, "tiers": [tier]}, target="vllm-connector")
    assert "a query with tiers cannot be exported" in one_error(export(source))
    record = program_record("unsafe", {"length": 4, "reused": [[1, 2]], "tables": [[1, 2, 5]]})
    record["program"]["tiers"] = [{"name": "cpu", "holds": ["full"], "num_blocks": 2}]
    program = tmp_path / "program.json"
    program.write_text(json.dumps(record))
    assert "an engine with external stores cannot be exported" in one_error(export(str(program)))
