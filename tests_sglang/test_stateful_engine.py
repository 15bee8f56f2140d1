"""The stateful gate against SGLang's own UnifiedRadixCache (kvhit.engines.sglang.cache)."""

from __future__ import annotations

import doctest
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from broken_sglang import window_freed_behind_the_tree, working_state_reported

from kvhit.contract import EngineConfig, capabilities_of
from kvhit.engines.sglang import cache as sglang_cache
from kvhit.engines.sglang.cache import SglangCacheEngine
from kvhit.harness.saved import ProgramFile, decode
from kvhit.harness.stateful import run_program
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.model.spec import Group, default_alignment, reused_blocks
from kvhit.targets.registry import Mode
from kvhit.targets.runner import CallableRunner, Runner
from kvhit.targets.stateful import EngineHost, Program, parse_config
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec

PROGRAMS = 120
FULL1 = {"kind": "full", "block_size": 1}
MAMBA = {"kind": "mamba", "block_size": 1}


def open_stateful(name: str) -> Runner:
    return TargetSpec(name).open(Mode.STATEFUL)


def admit(request: int, *tokens: int) -> dict[str, Any]:
    return {"op": "admit", "request": request, "tokens": list(tokens)}


def finish(request: int) -> dict[str, Any]:
    return {"op": "finish", "request": request}


def program(groups: list[dict[str, Any]], num_blocks: int, *ops: dict[str, Any]) -> Program:
    return Program.from_json({"groups": groups, "num_blocks": num_blocks, "ops": list(ops)})


def engine(groups: list[dict[str, Any]], num_blocks: int) -> SglangCacheEngine:
    return SglangCacheEngine(parse_config({"groups": groups, "num_blocks": num_blocks}))


def test_a_prefix_is_reused_then_evicted_for_a_new_request() -> None:
    full = [{"kind": "full", "block_size": 2}]
    steps = run_program(
        open_stateful("sglang"),
        program(full, 3, admit(0, 1, 2, 3, 4, 5), finish(0), admit(1, 1, 2, 3, 4, 6), finish(1),
                admit(2, 7, 7, 7, 7, 7), finish(2), admit(3, 1, 2, 3, 4, 5)),
    )  # fmt: skip
    assert [str(s.outcome.cls) for s in steps] == ["ok"] * 7
    assert [s.outcome.length for s in steps[::2]] == [0, 4, 0, 0]
    # the third request needed the whole pool: the fourth finds nothing of its prefix
    assert steps[6].snapshot is not None and steps[6].snapshot.cached == ((),)


def test_window_kv_behind_the_window_is_freed_and_the_hit_reads_only_the_window() -> None:
    """SGLang's window of 2 (exclusive) after a prefill of 6 tokens keeps the window
    KV of the 2 tokens before the last and the last (common.py:116: the threshold is
    pre_len - max(window, page), pre_len = T - 1); a hit of 6 reads blocks 4 and 5."""
    window = {"kind": "sliding_window", "block_size": 1, "window": 2}
    exclusive = {**window, "window_convention": "exclusive"}
    sglang = engine([FULL1, exclusive], 16)
    first = sglang.admit(0, [0, 1, 2, 3, 4, 5]).to_json()
    # after its prefill the request holds window KV only for the last 3 tokens
    assert first["length"] == 0 and first["tables"][1][:3] == [None] * 3
    assert None not in first["tables"][1][3:]
    assert sglang.snapshot([0, 1, 2, 3, 4, 5, 9]).to_json()["cached"] == [
        [True] * 6,
        [False] * 3 + [True] * 3,
    ]
    second = sglang.admit(1, [0, 1, 2, 3, 4, 5, 9]).to_json()
    assert second["length"] == 6
    held = second["tables"][1]
    assert held[:3] == [None, None, None] and held[3:6] == first["tables"][1][3:6]
    needed = reused_blocks(Group("sliding_window", 1, window=2, window_convention="exclusive"), 6)
    assert second["reused"][1] == [held[j] for j in needed] == held[4:6]


def test_window_kv_alone_is_evicted_when_the_window_pool_runs_short() -> None:
    """8 pages of full KV, 4 of window KV: the second request takes the window KV of
    the first one's older tokens (one freed behind its window, one evicted from the
    tree, which keeps the full KV); the third still hits all 3 tokens, reading only
    the window KV of the last."""
    window = {"kind": "sliding_window", "block_size": 1, "window": 1}
    sglang = engine([FULL1, {**window, "window_convention": "exclusive"}], 8)
    first = sglang.admit(0, [1, 2, 3]).to_json()
    sglang.finish(0)
    assert sglang.snapshot([1, 2, 3, 9]).to_json()["cached"] == [[True] * 3, [False, True, True]]
    second = sglang.admit(1, [4, 5, 6]).to_json()
    assert set(second["tables"][1]) & set(first["tables"][1]) == set(first["tables"][1][:2])
    assert sglang.snapshot([1, 2, 3, 9]).to_json()["cached"] == [[True] * 3, [False, False, True]]
    third = sglang.admit(2, [1, 2, 3, 9]).to_json()
    assert third["length"] == 3 and third["reused"][1] == [first["tables"][1][2]]


def test_mamba_hits_only_where_sglang_kept_a_state() -> None:
    sglang = engine([FULL1, MAMBA], 12)
    sglang.admit(0, [1, 2, 3])
    assert sglang.snapshot([1, 2, 3, 4]).to_json()["cached"] == [[True] * 3, [False, False, True]]
    second = sglang.admit(1, [1, 2, 3, 4]).to_json()
    assert second["length"] == 3 and second["reused"][1] == [second["tables"][1][2]]
    # full KV of [1 2] is cached, but no state after it: nothing to resume from
    assert sglang.admit(2, [1, 2, 5]).to_json()["length"] == 0


def test_a_rejected_request_leaves_the_pool_as_it_was() -> None:
    steps = run_program(
        open_stateful("sglang"),
        program([FULL1], 2, admit(0, 1, 2), admit(1, 3, 4, 5), finish(0), admit(1, 1, 7)),
    )
    assert [str(s.outcome.cls) for s in steps] == ["ok", "rejected", "ok", "ok"]
    assert "full KV (0 < 3)" in steps[1].outcome.reason
    # r0's two blocks are still cached: [1] is reused, [2] evicted for 7
    assert steps[3].snapshot is not None and steps[3].snapshot.cached == ((True,),)
    assert steps[3].outcome.length == 1


def test_a_snapshot_does_not_refresh_the_lru_order() -> None:
    """Two cached prompts, the older one snapshotted: a request that needs two
    blocks still evicts the older one (a lookup that touched it would evict the other)."""
    sglang = engine([FULL1], 4)
    for request, tokens in enumerate(([1, 2], [3, 4])):
        sglang.admit(request, tokens)
        sglang.finish(request)
    assert sglang.snapshot([1, 2]).to_json()["cached"] == [[True, True]]
    sglang.admit(2, [5, 6])
    assert sglang.snapshot([1, 2]).to_json()["cached"] == [[]]
    assert sglang.snapshot([3, 4]).to_json()["cached"] == [[True, True]]


@pytest.mark.parametrize(
    ("groups", "reason"),
    [
        ([FULL1, {**FULL1, "eagle": True}], "declares no drop drafters"),
        ([{"kind": "sliding_window", "block_size": 1, "window": 3}], "one full group"),
        ([FULL1, {"kind": "sliding_window", "block_size": 2, "window": 3}], "one page size"),
        ([{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 2}], "extra buffer"),
        ([FULL1, {"kind": "sliding_window", "block_size": 1, "window": 1}], "positive"),
        (
            [FULL1, *[{"kind": "sliding_window", "block_size": 1, "window": 3}] * 2],
            "drafter window",
        ),
    ],
)
def test_configurations_one_tree_cannot_hold_are_declared_and_unsupported(
    groups: list[dict[str, Any]], reason: str
) -> None:
    """Each is refused by the factory's declared capabilities (so kvhit does not draw
    it), and, asked anyway, answered ``unsupported`` with the same reason."""
    engine = program(groups, 4)
    config = EngineConfig(tuple(engine.groups), engine.num_blocks, default_alignment(engine.groups))
    assert reason in (capabilities_of(SglangCacheEngine).refusal(config.as_query(1)) or "")
    (step,) = run_program(open_stateful("sglang"), engine)
    assert str(step.outcome.cls) == "unsupported" and reason in step.outcome.reason


def test_the_stateful_gate_finds_nothing_in_sglang() -> None:
    plan = ProgramPlan(shape="sglang", stop_at_first=False)
    tally = run_programs(open_stateful("sglang"), TargetRecord("sglang"), plan, programs=PROGRAMS)
    assert tally.found == []
    assert tally.counts["ok"] > PROGRAMS and tally.counts["rejected"] > 0
    assert tally.counts["unsupported"] == 0


STALE_READ = ("unsafe", "stale block")
DOUBLE_FREE = ("crash", "admit: AssertionError (raised at ")
"""The window pages freed behind the tree are freed again by SGLang when the tree
lets them go: its allocator's assert, if no request reads one first."""


@pytest.mark.parametrize(
    ("factory", "kind", "shown"),
    [
        (working_state_reported, "mamba", [STALE_READ]),
        (window_freed_behind_the_tree, "sliding_window", [STALE_READ, DOUBLE_FREE]),
    ],
)
def test_a_broken_engine_is_caught_and_shrunk(
    tmp_path: Path, factory: Any, kind: str, shown: list[tuple[str, str]]
) -> None:
    runner = CallableRunner(EngineHost(factory), timeout=30.0)
    plan = ProgramPlan(kinds=(kind,), shape="sglang", shrink_seconds=10, out_dir=tmp_path)
    tally = run_programs(runner, TargetRecord(factory.__name__), plan, programs=PROGRAMS)
    (found,) = tally.found
    assert any(found.cls == cls and found.reason.startswith(why) for cls, why in shown), found
    assert len(found.program.ops) <= 3
    (path,) = tally.files
    saved_file = decode(path.read_text())
    assert isinstance(saved_file, ProgramFile)
    saved = saved_file.program
    assert [g.kind for g in saved.groups if g.kind != "full"] == [kind]
    replayed = run_program(CallableRunner(EngineHost(factory), timeout=30.0), saved)
    assert str(replayed[-1].outcome.cls) == found.cls
    assert str(run_program(open_stateful("sglang"), saved)[-1].outcome.cls) == "ok"


def test_the_command_draws_sglang_shaped_engines_for_sglang(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvhit.cli", "gate", "--stateful", "--target", "sglang",
         "--seconds", "600", "--cases", "20", "--json", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["disagreements"] == [] and report["counts"]["ok"] > 10
    assert "unsupported" not in report["counts"]


def test_the_adapters_docstring_examples_hold() -> None:
    result = doctest.testmod(sglang_cache)
    assert result.attempted > 0 and result.failed == 0
