"""``kvhit prove``: options, exit codes, the JSON schema, SMT-LIB2 export, cvc5."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import z3
from click.testing import CliRunner, Result

from kvhit.cli import prove as command
from kvhit.cli.main import main
from kvhit.proofs import registry, runner
from kvhit.proofs.registry import Goal, Status, Theorem
from kvhit.proofs.theorems import eagle
from kvhit.proofs.workers import Event, ProofSettings, Started

MODULES = ["kvhit.proofs.theorems.min_groups", "kvhit.proofs.theorems.eagle"]
ALL_REGISTERED = command.registered
FIELDS = {
    "name",
    "statement",
    "status",
    "expected",
    "bound",
    "rests_on",
    "range",
    "seconds",
    "cross_check",
    "goals",
}


@pytest.fixture(autouse=True)
def registered(monkeypatch: pytest.MonkeyPatch) -> None:
    """Theorems from these modules only, so each test stays small."""
    monkeypatch.setattr(command, "registered", lambda: registry.all_theorems(MODULES))


def prove(*args: str) -> Result:
    return CliRunner().invoke(main, ["prove", *args])


def in_process(theorems: list[Theorem], settings: ProofSettings, jobs: int) -> Iterator[Event]:
    """:func:`~kvhit.proofs.workers.prove_all` in this process, so a test's patches
    (a theorem not in the registry, a fake cvc5) reach the runner."""
    for theorem in theorems:
        yield Started(theorem.name)
        yield settings.run(theorem)


def test_json_is_one_object_in_the_schema() -> None:
    run = prove("--only", "eagle_spiral,single_pass_two_windows", "--bound", "3", "--json")
    assert run.exit_code == 0, run.output
    out = json.loads(run.stdout)
    assert set(out) == {"ok", "interrupted", "theorems"} and out["ok"] is True
    assert out["interrupted"] is False
    assert [t["name"] for t in out["theorems"]] == ["eagle_spiral", "single_pass_two_windows"]
    for t in out["theorems"]:
        assert set(t) == FIELDS | {"counterexample"}
        assert t["status"] == t["expected"] == "refuted" and t["bound"] == 3
        cx = t["counterexample"]
        assert cx["broken"] is True and "L*" in cx["answers"] and cx["query"]["groups"]


def test_text_report_draws_the_counterexample_and_counts() -> None:
    run = prove("--only", "min_is_longest", "--only", "eagle_spiral", "--bound", "3")
    assert run.exit_code == 0, run.output
    assert "query: M=2 A=1" in run.stdout
    assert "min of groups answered 1 (unsafe)" in run.stdout
    assert "0 proved, 2 refuted as expected, 0 failed, 0 unknown" in run.stdout


def test_unknown_name_is_bad_usage_listing_the_known_ones() -> None:
    run = prove("--only", "no_such_theorem")
    assert run.exit_code == 2
    assert "no_such_theorem" in run.stderr and "eagle_spiral" in run.stderr


def test_a_broken_claim_fails_the_run(monkeypatch: pytest.MonkeyPatch) -> None:
    claim = Theorem(
        "single_pass_is_longest",
        "One pass answers L* for two sliding windows (wrongly expected proved).",
        Status.PROVED,
        True,
        eagle.single_pass_goals,
        bound=3,
    )
    monkeypatch.setattr(command, "registered", lambda: [claim])
    monkeypatch.setattr(command, "prove_all", in_process)
    run = prove("--json")
    assert run.exit_code == 1
    out = json.loads(run.stdout)
    assert out["ok"] is False and out["theorems"][0]["status"] == "refuted"


def test_a_listed_module_that_is_missing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(command, "registered", ALL_REGISTERED)
    monkeypatch.setattr(registry, "THEOREM_MODULES", [*MODULES, "kvhit.proofs.not_written"])
    run = prove("--only", "eagle_spiral")
    assert run.exit_code == 1
    assert "kvhit.proofs.not_written" in run.stderr and "Traceback" not in run.output


def test_emit_smt2_writes_every_query(tmp_path: Path) -> None:
    run = prove("--only", "eagle_single_drop", "--bound", "2", "--emit-smt2", str(tmp_path))
    assert run.exit_code == 0, run.output
    files = sorted(tmp_path.glob("*.smt2"))
    assert len(files) == len(eagle.single_drop_goals(2))
    assert all("(check-sat)" in f.read_text() for f in files)


def test_an_unwritable_emit_dir_is_bad_usage_before_any_proof(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    def no_proof(*args: object, **kwargs: object) -> None:
        raise AssertionError("a proof ran before --emit-smt2 was checked")

    monkeypatch.setattr(command, "run_all", no_proof)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    run = prove("--only", "eagle_single_drop", "--emit-smt2", str(blocker / "smt2"))
    assert run.exit_code == 2
    assert "--emit-smt2: cannot write in" in run.stderr


def test_json_shows_each_goals_satisfying_context() -> None:
    run = prove("--only", "eagle_single_drop", "--bound", "2", "--json")
    (t,) = json.loads(run.stdout)["theorems"]
    assert t["status"] == "proved" and t["goals"]
    for goal in t["goals"]:
        assert goal["status"] == "unsat" and isinstance(goal["context"], dict)
        assert 0 <= goal["context"]["eagle_M"] <= 2


def test_cross_check_agrees_on_a_proved_theorem() -> None:
    run = prove("--only", "eagle_single_drop", "--bound", "2", "--cross-check", "--json")
    assert run.exit_code == 0, run.output
    (t,) = json.loads(run.stdout)["theorems"]
    assert t["status"] == "proved" and t["cross_check"] == "agree"


@pytest.mark.parametrize("answer", ["unknown", "sat", "error"])
def test_a_goal_cvc5_does_not_prove_fails_the_theorem(
    monkeypatch: pytest.MonkeyPatch, answer: str
) -> None:
    monkeypatch.setattr(runner, "cvc5_check", lambda text, timeout, options: answer)
    monkeypatch.setattr(command, "prove_all", in_process)
    run = prove("--only", "eagle_single_drop", "--bound", "2", "--cross-check", "--json")
    assert run.exit_code == 1, run.output
    out = json.loads(run.stdout)
    (t,) = out["theorems"]
    goals = len(eagle.single_drop_goals(2))
    assert out["ok"] is False and t["status"] == "proved"
    assert t["cross_check"] == f"0 of {goals} agree, {goals} {answer}"


class UnknownSolver:
    """A solver that answers unknown for the given reason."""

    def __init__(self, reason: str) -> None:
        self.reason = reason

    def set(self, *options: object) -> None:
        pass

    def add(self, *assertions: object) -> None:
        pass

    def check(self) -> object:
        return runner.z3.unknown

    def reason_unknown(self) -> str:
        return self.reason


@pytest.mark.parametrize(("reason", "checks"), [("timeout", 1), ("incomplete quantifiers", 3)])
def test_a_timeout_is_final_but_other_unknowns_get_more_seeds(
    monkeypatch: pytest.MonkeyPatch, reason: str, checks: int
) -> None:
    made: list[UnknownSolver] = []
    monkeypatch.setattr(runner.z3, "Solver", lambda: made.append(UnknownSolver(reason)) or made[-1])
    expected = "timeout" if reason == "timeout" else "unknown"
    assert runner.z3_check(Goal("g", [], z3.BoolVal(True)), timeout=1)[0] == expected
    assert len(made) == checks


def test_the_default_suite_leaves_the_deep_theorems_to_deep() -> None:
    everything = registry.all_theorems()
    deep = [t.name for t in everything if t.deep]
    assert deep == ["finder_contracts_bounded", "finder_contracts_bounded_unit_blocks"]
    default = command.chosen(everything, (), deep=False)
    assert not {t.name for t in default} & set(deep)
    assert command.chosen(everything, (), deep=True) == everything
    named = command.chosen(everything, ("finder_contracts_bounded",), deep=False)
    assert [t.name for t in named] == ["finder_contracts_bounded"]
    note = command.not_run_note(everything, default, cross_check=False)
    assert note == (
        "not run (kvhit prove --deep runs them): the deep cross-checks "
        "finder_contracts_bounded, finder_contracts_bounded_unit_blocks; "
        "cvc5's second opinion on every goal"
    )
    assert command.not_run_note(everything, everything, cross_check=True) == ""
