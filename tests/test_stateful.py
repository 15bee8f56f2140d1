"""The stateful gate: programs of requests, the content ledger, shrinking and replay."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from test_harness_cli import HERE, kvhit

from kvhit.contract import Admitted, Direction, EngineConfig, Rejected, Snapshot, TierMove
from kvhit.harness.ledger import Ledger
from kvhit.harness.random_cases import CHOICES, Choice, palette
from kvhit.harness.saved import ProgramFile, decode
from kvhit.harness.stateful import run_program
from kvhit.harness.stateful_machine import ProgramPlan, engines, run_programs
from kvhit.impl.stateful_target import StatefulImpl
from kvhit.model.protocol import QueryError
from kvhit.model.spec import Group, Upto
from kvhit.targets.registry import Mode
from kvhit.targets.runner import CallableRunner, CommandRunner, Reply, Runner
from kvhit.targets.stateful import (
    Admission,
    Admit,
    EngineHost,
    Finish,
    Message,
    Program,
    check_admit,
    decode_admit,
)
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec
from kvhit.targets.wire import BadReturn

BROKEN = "broken_stateful"
FULL2 = {"groups": [{"kind": "full", "block_size": 2}], "num_blocks": 8}


@pytest.fixture(autouse=True)
def broken_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def program(*ops: dict[str, Any], config: dict[str, Any] = FULL2) -> Program:
    return Program.from_json({**config, "ops": list(ops)})


def admit(request: int, *tokens: int) -> dict[str, Any]:
    return {"op": "admit", "request": request, "tokens": list(tokens)}


def open_stateful(name: str) -> Runner:
    return TargetSpec(name).open(Mode.STATEFUL)


def host(factory: Any) -> Runner:
    return CallableRunner(EngineHost(factory), 10.0)


# --- the ledger --------------------------------------------------------------------


def admission(length: int, reused: Any, tables: Any) -> Admission:
    return Admission(Admitted(length, reused, tables))


def test_ledger_follows_a_block_into_its_next_request() -> None:
    groups = (Group("full", 2),)
    ledger = Ledger()
    ledger.record(groups, (1, 2, 3, 4), admission(0, ((),), ((5, 6),)), request=0, op=1)
    assert ledger.problem(groups, (1, 2, 3, 4, 9), admission(4, ((5, 6),), ((5, 6, 7),))) == ""
    # block 6 is reallocated to a request that computes other tokens there
    ledger.record(groups, (1, 2, 8, 8), admission(2, ((5,),), ((5, 6),)), request=1, op=2)
    stale = ledger.problem(groups, (1, 2, 3, 4, 9), admission(4, ((5, 6),), ((5, 6, 7),)))
    assert stale.startswith("stale block: group 0 block 1 is physical block 6")
    assert "[1 2 8 8] (written by r1 at op 2)" in stale


def test_ledger_wants_a_block_wherever_the_hit_reads() -> None:
    groups = (Group("sliding_window", 2, window=3),)
    stale = Ledger().problem(groups, (1, 2, 3, 4, 5), admission(4, ((),), ((None, None, 7),)))
    assert stale == "stale block: group 0 reads block 1 at L=4, but its table holds no block there"


# --- running programs ----------------------------------------------------------------


def test_the_impl_reuses_a_shared_prefix_and_stays_grounded() -> None:
    steps = run_program(
        open_stateful("impl"),
        program(admit(0, 1, 2, 3, 4, 5), {"op": "finish", "request": 0}, admit(1, 1, 2, 3, 4, 6)),
    )
    assert [s.outcome.cls for s in steps] == ["ok", "ok", "ok"]
    assert steps[2].outcome.length == 4
    assert steps[2].answer["outputs_match"] is True
    first, last = steps[0].answer["tables"][0], steps[2].answer["tables"][0]
    assert last[:2] == first[:2] and steps[2].answer["reused"] == [first[:2]]


def test_a_full_pool_rejects_and_changes_nothing() -> None:
    tiny = {**FULL2, "num_blocks": 3}
    steps = run_program(
        open_stateful("impl"), program(admit(0, 1, 2, 3), admit(1, 4, 5, 6), config=tiny)
    )
    assert [s.outcome.cls for s in steps] == ["ok", "rejected"]


class Liar(StatefulImpl):
    """Claims a hit of one block on every admit after the first."""

    def admit(self, request: int, tokens: Any) -> Admitted | Rejected:
        answer = super().admit(request, tokens)
        if request and isinstance(answer, Admitted) and not answer.length:
            return replace(answer, length=2, reused=(answer.tables[0][:1],))
        return answer


def test_a_claimed_block_holding_other_tokens_is_unsafe() -> None:
    steps = run_program(host(Liar), program(admit(0, 1, 2, 3), admit(1, 7, 7, 7)))
    assert steps[-1].outcome.cls == "unsafe"
    assert "stale block" in steps[-1].outcome.reason


class Scripted:
    """A factory of one engine that answers its admits with ``answers`` and its
    snapshots with ``snapshots``, in turn."""

    def __init__(self, answers: list[Any], snapshots: list[Any]):
        self.answers, self.snapshots = iter(answers), iter(snapshots)

    def __call__(self, config: EngineConfig) -> Scripted:
        return self

    def admit(self, request: int, tokens: Any) -> Any:
        answer = next(self.answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def snapshot(self, tokens: Any) -> Any:
        return next(self.snapshots)

    def finish(self, request: int) -> None:
        pass


def scripted(answers: list[Any], snapshots: list[Any]) -> Runner:
    return host(Scripted(answers, snapshots))


EMPTY = Snapshot(((),))
SPILL = TierMove(Direction.SPILL, 1, 0, 0)
OFF_PROTOCOL = [  # an answer line, the same typed, and why it is off the protocol
    ({"length": 0}, {"length": 0}, "admit must answer"),
    (
        {"length": 0, "reused": [[]], "tables": [[1], [2]]},
        Admitted(0, ((),), ((1,), (2,))),
        "one list per group",
    ),
    (
        {"length": 0, "reused": [[3]], "tables": [[1, 2]]},
        Admitted(0, ((3,),), ((1, 2),)),
        "not in its table",
    ),
    (
        {"length": 0, "reused": [[]], "tables": [["x"]]},
        Admitted(0, ((),), (("x",),)),
        "not a block id",
    ),
    (
        {"length": 0, "reused": [[]], "tables": [[1]], "moves": [["spill", 1, [0, 0]]]},
        Admitted(0, ((),), ((1,),), moves=(SPILL,)),
        "names tier 0; the engine has 0",
    ),
]


@pytest.mark.parametrize(("line", "typed", "reason"), OFF_PROTOCOL)
def test_a_typed_answer_off_the_contract_is_a_bad_return(
    line: Any, typed: Any, reason: str
) -> None:
    steps = run_program(scripted([typed], [EMPTY]), program(admit(0, 1, 2, 3)))
    assert steps[-1].outcome.cls == "bad_return" and reason in steps[-1].outcome.reason


@pytest.mark.parametrize(("line", "typed", "reason"), OFF_PROTOCOL)
def test_a_programs_answer_line_off_the_protocol_is_a_bad_return(
    line: Any, typed: Any, reason: str
) -> None:
    with pytest.raises(BadReturn, match=reason):
        check_admit(decode_admit(line), program().config())


def test_a_snapshot_off_the_contract_is_a_bad_return() -> None:
    steps = run_program(scripted([], [Snapshot(((Upto(2),),))]), program(admit(0, 1, 2, 3)))
    assert steps[-1].outcome.cls == "bad_return"
    assert "a partial block needs a hash unit" in steps[-1].outcome.reason
    steps = run_program(scripted([], [{"cached": [[]]}]), program(admit(0, 1, 2, 3)))
    assert steps[-1].outcome.reason.startswith("snapshot must answer a Snapshot")


def test_an_engine_that_raises_is_a_crash() -> None:
    steps = run_program(scripted([RuntimeError("boom")], [EMPTY]), program(admit(0, 1, 2, 3)))
    assert steps[-1].outcome.cls == "crash" and "boom" in steps[-1].outcome.reason


PROGRAM = f"{sys.executable} {HERE / 'stateful_cmd.py'}"


def test_a_program_is_judged_as_the_same_engine_in_process() -> None:
    prog = program(
        admit(0, 1, 2, 3, 4, 5), {"op": "finish", "request": 0}, admit(1, 1, 2, 3, 4, 6),
        admit(2, 9, 9),
    )  # fmt: skip
    by_line = run_program(CommandRunner(f"{PROGRAM} {BROKEN}:forgetful_pool", 30.0), prog)
    here = run_program(open_stateful(f"{BROKEN}:forgetful_pool"), prog)
    assert [(s.outcome, s.answer) for s in by_line] == [(s.outcome, s.answer) for s in here]
    assert [s.outcome.length for s in here] == [0, None, 4, 0]
    liar = f"{PROGRAM} test_stateful:Liar"
    steps = run_program(CommandRunner(liar, 30.0), program(admit(0, 1, 2, 3), admit(1, 7, 7, 7)))
    assert steps[-1].outcome.cls == "unsafe" and "stale block" in steps[-1].outcome.reason


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"num_blocks": 1}, "num_blocks"),
        ({"groups": []}, "groups"),
        ({"alignment": 3}, "alignment"),
        ({"ops": [{"op": "admit", "request": 0, "tokens": []}]}, "ops[0].tokens"),
        ({"ops": [{"op": "jump", "request": 0}]}, "ops[0]"),
    ],
)
def test_a_bad_program_names_its_field(change: dict[str, Any], field: str) -> None:
    with pytest.raises(QueryError) as err:
        Program.from_json({**FULL2, **change})
    assert err.value.args[0] == field or field in str(err.value)


# --- campaigns: broken engines caught and shrunk ---------------------------------------


@pytest.mark.parametrize(
    ("factory", "cls"),
    [
        ("forgetful_pool", "unsafe"),
        ("window_drop_keeps_hash", "unsafe"),
        ("first_full_truncated", "wrong_blocks"),
    ],
)
def test_each_broken_engine_is_caught_with_a_short_replayable_program(
    factory: str, cls: str, tmp_path: Path
) -> None:
    target = f"{BROKEN}:{factory}"
    # shrinking ends when nothing shrinks further; its time limit is only a hang guard
    plan = ProgramPlan(out_dir=tmp_path, shrink_seconds=600)
    tally = run_programs(open_stateful(target), TargetRecord(target), plan, programs=400)
    (found,) = tally.found
    assert found.cls == cls
    assert len(found.program.ops) <= 12
    (path,) = tally.files
    saved = decode(path.read_text())
    assert isinstance(saved, ProgramFile) and saved.cls == cls and saved.program == found.program
    assert saved.target == TargetRecord(target)
    saved = saved.program
    assert run_program(open_stateful(target), saved)[-1].outcome.cls == cls
    assert run_program(open_stateful("impl"), saved)[-1].outcome.cls in ("ok", "rejected")


def test_the_impl_passes_a_campaign() -> None:
    tally = run_programs(
        open_stateful("impl"), TargetRecord("impl"), ProgramPlan(steps=25), programs=150
    )
    assert not tally.found and tally.cases == 150
    assert tally.counts["ok"] > 600 and tally.operations > 1200  # copies make pools tighter


class Recorder:
    """A runner that keeps every message it passes on."""

    def __init__(self, runner: Runner):
        self.runner, self.messages = runner, []

    def __call__(self, message: Message) -> Reply:
        self.messages.append(json.dumps(message.to_json()))
        return self.runner(message)

    def close(self) -> None:
        self.runner.close()


def test_the_sglang_shape_is_what_one_radix_tree_holds() -> None:
    recorder = Recorder(open_stateful("impl"))
    plan = ProgramPlan(steps=4, shape="sglang")
    tally = run_programs(recorder, TargetRecord("impl"), plan, programs=60)
    configs = [json.loads(m) for m in recorder.messages if json.loads(m)["op"] == "create"]
    kinds = set()
    for config in configs:
        groups = config["groups"]
        sizes = {g["block_size"] for g in groups}
        assert [g["kind"] for g in groups].count("full") == 1 and len(groups) <= 2
        assert sizes == {config["alignment"]} and not any(g["eagle"] for g in groups)
        assert all(g["block_size"] == 1 for g in groups if g["kind"] == "mamba")
        kinds |= {g["kind"] for g in groups}
    assert kinds == {"full", "sliding_window", "mamba"} and not tally.found


def test_same_seed_same_programs() -> None:
    def messages(seed: int) -> list[str]:
        recorder = Recorder(open_stateful("impl"))
        run_programs(recorder, TargetRecord("impl"), ProgramPlan(steps=8, seed=seed), programs=10)
        return recorder.messages

    assert messages(3) == messages(3) != messages(4)


# --- the command line ----------------------------------------------------------------


def test_gate_stateful_on_the_impl_passes(tmp_path: Path) -> None:
    code, report, _ = kvhit(
        "gate",
        "--stateful",
        "--target",
        "impl",
        "--cases",
        "30",
        "--seconds",
        "600",
        "--json",
        cwd=tmp_path,
    )  # a budget of programs; the seconds only a hang guard
    assert code == 0 and report is not None
    assert report["cases"] == 30 and report["operations"] > 30 and report["disagreements"] == []
    assert set(report["counts"]) <= {"ok", "rejected"} and report["counts"]["ok"] > 100


def test_gate_stateful_catches_saves_and_replays(tmp_path: Path) -> None:
    target = f"{BROKEN}:first_full_truncated"
    junit = tmp_path / "gate.xml"
    # a budget of programs, not of seconds: the same programs however busy the machine
    args = ("--seconds", "600", "--cases", "400", "--json", "--junit", str(junit))
    code, report, _ = kvhit("gate", "--stateful", "--target", target, *args, cwd=tmp_path)
    assert code == 1 and report is not None
    (found,) = report["disagreements"]
    assert found["class"] == "wrong_blocks" and found["program"]["ops"]
    assert "<failure" in junit.read_text()
    (file,) = report["files"]
    code, _, _ = kvhit("replay", file, "--target", target, cwd=tmp_path)
    assert code == 1
    code, again, _ = kvhit("replay", file, "--target", "impl", "--json", cwd=tmp_path)
    assert code == 0 and again is not None and again["saved_class"] == "wrong_blocks"


@pytest.mark.parametrize(
    "args",
    [
        ("gate", "--stateful", "--target", "no_such_module:factory"),
        ("gate", "--stateful", "--target", "impl", "--ray", "local"),
        ("fuzz", "--stateful", "--target", "impl", "--isolate"),
    ],
)
def test_stateful_bad_usage_exits_2(args: tuple[str, ...], tmp_path: Path) -> None:
    code, _, err = kvhit(*args, cwd=tmp_path)
    assert code == 2 and err.strip()


@pytest.mark.parametrize(
    "command, option", [("gate", ("--shape", "sglang")), ("fuzz", ("--kinds", "mamba"))]
)
def test_stateful_takes_the_drawing_options(
    command: str, option: tuple[str, str], tmp_path: Path
) -> None:
    args = (command, "--stateful", "--target", "impl", *option, "--cases", "10", "--json")
    code, report, _ = kvhit(*args, cwd=tmp_path)
    assert code == 0 and report is not None and report["cases"] == 10


def test_finish_of_an_unknown_request_is_skipped() -> None:
    steps = run_program(open_stateful("impl"), program({"op": "finish", "request": 4}))
    assert [s.outcome.cls for s in steps] == ["ok"]
    assert isinstance(program(admit(0, 1)).ops[0], Admit)
    assert program({"op": "finish", "request": 1}).ops == (Finish(1),)


# --- hash units, partially filled blocks, lookahead keys --------------------------------

FINE = {"groups": [{"kind": "full", "block_size": 4}], "num_blocks": 8, "hash_unit": 2}


def test_a_hit_inside_a_block_reads_its_copy_of_the_partial_block() -> None:
    first = Admitted(0, ((),), ((10, 11),))  # [1 … 7]: block 11 to 7
    copied = Admitted(6, ((10, 11),), ((10, 12),))
    prog = program(admit(0, 1, 2, 3, 4, 5, 6, 7), admit(1, 1, 2, 3, 4, 5, 6, 9, 9), config=FINE)
    snapshots = [EMPTY, Snapshot(((True, Upto(6)),))]
    steps = run_program(scripted([first, copied], snapshots), prog)
    assert [s.outcome.cls for s in steps] == ["ok", "ok"]
    assert steps[1].snapshot is not None and steps[1].snapshot.hash_unit == 2
    # the same claim for a request whose tokens differ inside the partial block
    prog = program(admit(0, 1, 2, 3, 4, 5, 6, 7), admit(1, 1, 2, 3, 4, 5, 8, 9, 9), config=FINE)
    steps = run_program(scripted([first, copied], snapshots), prog)
    assert steps[1].outcome.cls == "unsafe"
    assert steps[1].outcome.reason.startswith(
        "stale block: group 0 block 1 is physical block 11, which holds [1 2 3 4 5 6 7]"
    )


def test_only_the_block_a_hit_ends_inside_may_be_a_copy() -> None:
    config = EngineConfig((Group("full", 4),), 8, 4)
    answer = Admitted(4, ((10, 11),), ((10, 12),))
    with pytest.raises(BadReturn, match="reuses block 11, which is not in its table"):
        check_admit(answer, config)
    checked = check_admit(replace(answer, length=6), config)
    assert isinstance(checked, Admission) and checked.copied == ((1, 11),)
    assert checked.read_block(0, 1) == 11 and checked.reused_indices() == [[0, 1]]


def test_a_mamba_block_holds_the_state_at_exactly_its_end() -> None:
    groups = (Group("mamba", 4),)
    ledger = Ledger(hash_unit=2)
    # a prompt of 7 tokens leaves block 1 holding the state at 6, its last fine boundary
    ledger.record(groups, (1, 2, 3, 4, 5, 6, 7), admission(0, ((),), ((10, 11),)), 0, 1)
    tokens = (1, 2, 3, 4, 5, 6, 7, 8, 9)
    assert ledger.problem(groups, tokens, admission(6, ((11,),), ((None, 11, 12),))) == ""
    assert ledger.problem(groups, tokens, admission(4, ((10,),), ((10, 12, 13),))) == ""
    stale = ledger.problem(groups, tokens, admission(8, ((11,),), ((None, 11, 12),)))
    assert stale.startswith("stale block: group 0 block 1 is physical block 11")


def test_a_block_found_by_a_lookahead_key_holds_the_next_tokens_too() -> None:
    groups = (Group("sliding_window", 2, window=2, drafter="lookahead", lookahead=1),)
    ledger = Ledger()
    ledger.record(groups, (1, 2, 3, 4, 5), admission(0, ((),), ((5, 6, 7),)), 0, 1)
    same_next = (1, 2, 3, 4, 6, 6)
    assert ledger.problem(groups, same_next, admission(2, ((5,),), ((5, 8, 9),))) == ""
    other_next = (1, 2, 9, 4, 6, 6)
    stale = ledger.problem(groups, other_next, admission(2, ((5,),), ((5, 8, 9),)))
    assert stale.endswith("needs [1 2 9] (1 tokens past the block for its lookahead key)")


def test_a_program_with_a_hash_unit_keeps_it() -> None:
    p = Program.from_json({**FINE, "alignment": 4, "ops": [admit(0, 1, 2)]})
    assert p.hash_unit == 2 and p.config().hash_unit == 2 and p.alignment == 4
    assert Program.from_json(p.to_json()) == p
    for bad, field in (({"hash_unit": 3}, "hash_unit"), ({"alignment": 3}, "alignment")):
        with pytest.raises(QueryError) as err:
            Program.from_json({**FINE, **bad})
        assert err.value.field == field


def drawn_programs(kinds: Any, count: int = 150) -> list[Program]:
    """``count`` engine configurations the machine draws from ``kinds``."""
    out: list[Program] = []

    @settings(
        max_examples=count, database=None, derandomize=True, suppress_health_check=list(HealthCheck)
    )
    @given(engines(palette(picked=kinds), 16, (1, 2, 4)))
    def collect(p: Program) -> None:
        out.append(p)

    collect()
    return out


def test_the_machine_draws_hash_units_and_drafters_of_every_kind() -> None:
    drawn = drawn_programs(CHOICES)
    fine = [p for p in drawn if p.hash_unit is not None]
    assert len(fine) > 20
    assert all(
        g.block_size % p.hash_unit == 0 and p.alignment % p.hash_unit == 0
        for p in fine
        for g in p.groups
    )
    pairs = {(g.kind, g.drafter) for p in drawn for g in p.groups}
    assert {("mamba", "lookahead"), ("chunked_local", "none"), ("full", "drop")} <= pairs
    plain = drawn_programs([Choice.FULL, Choice.MAMBA, Choice.EAGLE], 60)
    assert not any(p.hash_unit or g.lookahead for p in plain for g in p.groups)
