"""The stateful gate's signals: a running request's blocks are watched at every
operation, long prompts reach deep-prefix bugs, a saved program replays as saved, and
an engine that cannot be created is a finding like any other (issue 31, items 10, 11,
12 and 14)."""

from __future__ import annotations

import json
from contextlib import chdir
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from test_harness_cli import HERE, kvhit
from test_stateful import Recorder, admit, open_stateful, program

from kvhit.cli.main import main
from kvhit.contract import Admitted
from kvhit.harness import tally as tally_module
from kvhit.harness.ledger import Ledger
from kvhit.harness.random_cases import Choice
from kvhit.harness.saved import ProgramFile, decode
from kvhit.harness.stateful import ProgramDisagreement, disagreement_of, run_program
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.model.spec import Group
from kvhit.targets.stateful import Admission
from kvhit.targets.target_record import TargetRecord

BROKEN = "broken_stateful"
STOLEN = f"{BROKEN}:freed_after_prefill"
SHORT_KEYS = f"{BROKEN}:short_context_keys"
TWO_REQUESTS = {"groups": [{"kind": "full", "block_size": 2}], "num_blocks": 3}


@pytest.fixture(autouse=True)
def broken_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def write_program(path: Path, config: dict[str, Any], *ops: dict[str, Any]) -> str:
    path.write_text(json.dumps({**config, "ops": list(ops)}))
    return str(path)


# --- item 10: a block a running request still reads ----------------------------------


def test_the_ledger_watches_the_blocks_a_running_request_reads() -> None:
    groups = (Group("full", 2),)
    ledger = Ledger()
    first = Admission(Admitted(0, ((),), ((5, 6),)))
    ledger.record(groups, (1, 2, 3), first, request=0, op=1)
    ledger.hold(groups, (1, 2, 3), first, request=0)
    assert ledger.overwritten() == ""
    # block 6 is handed to r1, which writes its own tokens there
    ledger.record(groups, (7, 7, 7, 7), Admission(Admitted(0, ((),), ((8, 6),))), request=1, op=2)
    assert ledger.overwritten() == (
        "overwritten block: r0, still running, reads group 0 block 1, physical block 6, "
        "which holds [7 7 7 7] (written by r1 at op 2); r0 needs [1 2 3]"
    )
    ledger.release(0)  # once r0 has finished, its blocks may go anywhere
    assert ledger.overwritten() == ""


def test_a_window_reads_only_its_last_blocks_while_it_runs() -> None:
    groups = (Group("sliding_window", 1, window=2),)
    ledger = Ledger()
    first = Admission(Admitted(0, ((),), ((5, 6, 7),)))
    ledger.record(groups, (1, 2, 3), first, request=0, op=1)
    ledger.hold(groups, (1, 2, 3), first, request=0)
    # blocks 5 and 6 left the window: another request may take them
    ledger.record(groups, (4, 4), Admission(Admitted(0, ((),), ((5, 6),))), request=1, op=2)
    assert ledger.overwritten() == ""
    ledger.record(
        groups, (4, 4, 4), Admission(Admitted(2, ((5, 6),), ((5, 6, 7),))), request=2, op=3
    )
    assert ledger.overwritten().startswith("overwritten block: r0, still running, reads group 0")


def test_a_block_found_at_another_position_is_stale() -> None:
    groups = (Group("full", 1),)
    ledger = Ledger()
    ledger.record(groups, (0, 0), Admission(Admitted(0, ((),), ((5, 6),))), request=0, op=1)
    # block 6 holds the KV of token 1 of [0 0]; a hit reading it as token 0 is stale
    stale = ledger.problem(groups, (0, 1), Admission(Admitted(1, ((6,),), ((6, 7),))))
    assert stale == (
        "stale block: group 0 block 0 is physical block 6, which holds [0 0] from token 1 "
        "(written by r0 at op 1); this request needs [0]"
    )


def test_a_block_handed_away_while_its_request_runs_is_unsafe(tmp_path: Path) -> None:
    prog = program(admit(0, 1, 2, 3), admit(1, 4, 5, 6), config=TWO_REQUESTS)
    steps = run_program(open_stateful(STOLEN), prog)
    assert [s.outcome.cls for s in steps] == ["ok", "unsafe"]
    assert steps[1].outcome.reason.startswith(
        "overwritten block: r0, still running, reads group 0 block 0, physical block 1"
    )
    # the correct impl has no room for r1 while r0 runs
    assert [s.outcome.cls for s in run_program(open_stateful("impl"), prog)] == ["ok", "rejected"]
    file = write_program(tmp_path / "two.json", TWO_REQUESTS, admit(0, 1, 2, 3), admit(1, 4, 5, 6))
    code, replayed, _ = kvhit("replay", file, "--target", STOLEN, "--json", cwd=tmp_path)
    assert code == 1 and replayed is not None and replayed["class"] == "unsafe"
    code, _, _ = kvhit("replay", file, "--target", "impl", cwd=tmp_path)
    assert code == 0


def test_the_gate_catches_a_block_handed_away_while_its_request_runs(tmp_path: Path) -> None:
    args = ("gate", "--stateful", "--target", STOLEN, "--seconds", "600", "--cases", "100")
    code, report, _ = kvhit(*args, "--json", cwd=tmp_path)
    assert code == 1 and report is not None
    (found,) = report["disagreements"]
    assert found["class"] == "unsafe" and found["reason"].startswith("overwritten block")
    assert len(found["program"]["ops"]) <= 4
    (file,) = report["files"]
    code, again, _ = kvhit("replay", file, "--target", STOLEN, "--json", cwd=tmp_path)
    assert code == 1 and again is not None and again["reason"] == found["reason"]


# --- item 11: long prompts that differ early (by default since issue 41) -----------------------------------------


def test_keys_of_the_last_16_blocks_only_are_caught_by_default_within_60_programs() -> None:
    # up to 16 tokens, 16 blocks of context are the whole prefix: nothing to catch
    only_short = ProgramPlan(max_tokens=16)
    short = run_programs(
        open_stateful(SHORT_KEYS), TargetRecord(SHORT_KEYS), only_short, programs=60
    )
    assert not short.found and short.counts["ok"] > 100
    # the default plan gives one program in four prompts of up to 64 tokens
    plan = ProgramPlan(shrink_seconds=600)  # a hang guard: shrinking ends by itself
    long = run_programs(open_stateful(SHORT_KEYS), TargetRecord(SHORT_KEYS), plan, programs=60)
    (found,) = long.found
    assert found.cls == "unsafe" and "stale block" in found.reason
    assert long.found_at[0][1] < 60
    assert run_program(open_stateful("impl"), found.program)[-1].outcome.cls in ("ok", "rejected")


def test_the_gate_takes_a_prompt_size(tmp_path: Path) -> None:
    # budgets of programs, not of seconds: the same programs however busy the machine
    args = ("gate", "--stateful", "--target", SHORT_KEYS, "--seconds", "600", "--cases", "60")
    code, report, _ = kvhit(*args, "--json", "--prompt-tokens", "64", cwd=tmp_path)
    assert code == 1 and report is not None and report["disagreements"][0]["class"] == "unsafe"
    code, report, _ = kvhit(*args, "--json", "--prompt-tokens", "16", cwd=tmp_path)
    assert code == 0 and report is not None and report["cases"] == 60
    code, _, err = kvhit(*args, "--prompt-tokens", "0", cwd=tmp_path)
    assert code == 2 and "--prompt-tokens" in err


def one_token_apart(a: list[int], b: list[int]) -> int | None:
    """Where two prompts of one length differ, if in exactly one token."""
    apart = [i for i, (x, y) in enumerate(zip(a, b)) if x != y]
    return apart[0] if len(a) == len(b) and len(apart) == 1 else None


def test_programs_hold_long_prompts_that_differ_early() -> None:
    recorder = Recorder(open_stateful("impl"))
    run_programs(recorder, TargetRecord("impl"), ProgramPlan(max_tokens=64, steps=8), programs=30)
    prompts = [m["tokens"] for m in map(json.loads, recorder.messages) if m["op"] == "admit"]
    assert max(map(len, prompts)) <= 64 and sum(len(p) >= 32 for p in prompts) > 10
    early = {one_token_apart(a, b) for a in prompts for b in prompts if len(a) >= 32 and a is not b}
    assert early & set(range(8))


# --- item 12: a saved program replays as saved ----------------------------------------


def test_every_saved_program_replays_with_the_failure_saved(tmp_path: Path) -> None:
    # full attention only: a block is freed only by a finish, so every program that
    # reaches a stale block has crashed on a finish before
    target = f"{BROKEN}:forgetful_and_falls_over"
    plan = ProgramPlan([Choice.FULL], out_dir=tmp_path, stop_at_first=False, shrink_seconds=5)
    tally = run_programs(open_stateful(target), TargetRecord(target), plan, programs=150)
    assert tally.found
    for path in tally.files:
        saved = decode(path.read_text())
        assert isinstance(saved, ProgramFile) and saved.target == TargetRecord(target)
        steps = run_program(open_stateful(target), saved.program)
        again = disagreement_of(saved.target, saved.program, steps)
        assert (again.cls, again.reason) == (saved.cls, saved.reason)
        assert json.loads(path.read_text())["failing_op"] == len(saved.program.ops) == len(steps)
    assert [d.cls for d in tally.found] == ["crash"]


# --- item 14: an engine that cannot be created ----------------------------------------


def test_an_engine_that_cannot_be_created_is_saved_drawn_and_replayed(tmp_path: Path) -> None:
    target = f"{BROKEN}:fails_to_start"
    code, report, _ = kvhit(
        "gate", "--stateful", "--target", target, "--keep-going", "--seconds", "3", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert code == 1 and report is not None
    (found,) = report["disagreements"]
    assert found["class"] == "crash" and "no engine today" in found["reason"]
    assert found["failing_op"] == 0 and found["program"]["ops"] == []
    (file,) = report["files"]
    code, _, _ = kvhit("replay", file, "--target", target, cwd=tmp_path)
    assert code == 1
    tally = run_programs(open_stateful(target), TargetRecord(target), ProgramPlan(), programs=5)
    (d,) = tally.found
    assert "  1. create   <- crash" in d.render().splitlines()


def test_a_program_of_no_operation_replays_clean(tmp_path: Path) -> None:
    file = write_program(tmp_path / "empty.json", TWO_REQUESTS)
    code, replayed, _ = kvhit("replay", file, "--target", "impl", "--json", cwd=tmp_path)
    assert code == 0 and replayed is not None and replayed["class"] == "ok"
    code, _, _ = kvhit("replay", file, "--target", f"{BROKEN}:fails_to_start", cwd=tmp_path)
    assert code == 1


def test_ctrl_c_in_a_program_exits_130_with_what_was_found(tmp_path: Path) -> None:
    args = ["gate", "--stateful", "--target", f"{BROKEN}:Interrupted", "--json"]
    with chdir(tmp_path):
        result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 130 and json.loads(result.stdout)["interrupted"] is True


def read_only(*args: object) -> Path:
    """A save on a read-only file system."""
    raise OSError(30, "Read-only file system", "RO/.tmp-1.json")


def test_a_save_that_fails_mid_run_keeps_the_finding_and_exit_1(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tally_module, "save", read_only)
    args = ["gate", "--stateful", "--target", STOLEN, "--json", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--cases", "200"], catch_exceptions=False)
    report = json.loads(result.stdout)
    assert result.exit_code == 1, result.output
    assert report["save_error"] == "RO/.tmp-1.json: Read-only file system"
    assert report["files"] == [] and report["disagreements"][0]["class"] == "unsafe"


def test_ctrl_c_while_shrinking_saves_the_shortest_program_so_far(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``size`` is asked only while shrinking, when a second failing program is
    compared with the best so far: Ctrl-C there."""

    def ctrl_c(*args: object) -> int:
        raise KeyboardInterrupt

    monkeypatch.setattr(ProgramDisagreement, "size", ctrl_c)
    args = ["gate", "--stateful", "--target", STOLEN, "--json", "--out", str(tmp_path)]
    result = CliRunner().invoke(main, [*args, "--cases", "200"], catch_exceptions=False)
    report = json.loads(result.stdout)
    assert result.exit_code == 130 and report["interrupted"] is True
    assert [d["class"] for d in report["disagreements"]] == ["unsafe"]
    saved = decode(Path(report["files"][0]).read_text())
    assert isinstance(saved, ProgramFile) and saved.program.ops and saved.cls == "unsafe"
