"""The stateful gate against vLLM's own KVCacheManager (kvhit.engines.vllm.manager)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from stateful_undocumented import manager_outside_divergences

from kvhit.engines.vllm.manager import VllmManagerEngine
from kvhit.engines.vllm.target import RELEASE
from kvhit.errors import UndrivableTarget, Unsupported
from kvhit.harness.saved import ProgramFile, decode
from kvhit.harness.stateful import run_program
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.model.spec import Upto
from kvhit.targets.registry import Mode, load
from kvhit.targets.runner import CallableRunner, Runner
from kvhit.targets.stateful import EngineHost, Program, parse_config
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec

PROGRAMS = 150


def open_stateful(name: str) -> Runner:
    return TargetSpec(name).open(Mode.STATEFUL)


def admit(request: int, *tokens: int) -> dict[str, Any]:
    return {"op": "admit", "request": request, "tokens": list(tokens)}


def finish(request: int) -> dict[str, Any]:
    return {"op": "finish", "request": request}


def program(groups: list[dict[str, Any]], num_blocks: int, *ops: dict[str, Any]) -> Program:
    return Program.from_json({"groups": groups, "num_blocks": num_blocks, "ops": list(ops)})


def test_vllm_reuses_a_prefix_then_evicts_it_for_a_new_request() -> None:
    full = [{"kind": "full", "block_size": 2}]
    steps = run_program(
        open_stateful("vllm"),
        program(full, 3, admit(0, 1, 2, 3, 4, 5), finish(0), admit(1, 1, 2, 3, 4, 6), finish(1),
                admit(2, 7, 7, 7, 7, 7), finish(2), admit(3, 1, 2, 3, 4, 5)),
    )  # fmt: skip
    assert [str(s.outcome.cls) for s in steps] == ["ok"] * 7
    assert [s.outcome.length for s in steps[::2]] == [0, 4, 0, 0]
    # the third request took the cached blocks: the fourth finds nothing of its prefix
    assert steps[6].snapshot is not None and steps[6].snapshot.cached == ((False, False),)


def test_vllm_runs_a_hybrid_program_on_the_release_installed() -> None:
    """Full attention, a sliding window and Mamba (equal blocks, so no partial hits):
    the second request extends the first and finds all of it (Mamba holds the state
    at the first prompt's end), on whichever release runs this."""
    groups = [
        {"kind": "full", "block_size": 2},
        {"kind": "sliding_window", "block_size": 2, "window": 3},
        {"kind": "mamba", "block_size": 2},
    ]
    steps = run_program(
        open_stateful("vllm"),
        program(groups, 64, admit(0, *range(8)), finish(0), admit(1, *range(8), 9, 9)),
    )
    assert [str(s.outcome.cls) for s in steps] == ["ok"] * 3, RELEASE.name
    assert steps[2].outcome.length == 8


def test_a_missing_vllm_name_is_named_with_the_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM importable but without a name the adapter imports: the error says which
    name and which release, not that vLLM is missing."""
    from vllm.v1.core import kv_cache_utils

    monkeypatch.delattr(kv_cache_utils, "get_request_block_hasher")
    monkeypatch.delitem(sys.modules, "kvhit.engines.vllm.manager", raising=False)
    with pytest.raises(UndrivableTarget) as err:
        load("vllm", Mode.STATEFUL)
    assert "get_request_block_hasher" in str(err.value) and RELEASE.name in str(err.value)
    assert "not installed" not in str(err.value)


def test_vllm_refuses_a_single_group_aligned_past_its_block() -> None:
    config = {"groups": [{"kind": "full", "block_size": 2}], "num_blocks": 4, "alignment": 4}
    steps = run_program(open_stateful("vllm"), Program.from_json({**config, "ops": []}))
    assert str(steps[0].outcome.cls) == "unsupported"
    assert "block size" in steps[0].outcome.reason


def test_a_documented_lookup_divergence_is_caught_and_shrunk(tmp_path: Path) -> None:
    """Chunks that are not a multiple of the block size (findings-vllm.md class 2):
    vLLM claims a hit whose block it does not hold."""
    plan = ProgramPlan(kinds=("chunked_local",), shrink_seconds=20, out_dir=tmp_path)
    tally = run_programs(open_stateful("vllm"), TargetRecord("vllm"), plan, programs=PROGRAMS)
    (found,) = tally.found
    assert found.cls == "unsafe" and len(found.program.ops) <= 3
    (path,) = tally.files
    saved_file = decode(path.read_text())
    assert isinstance(saved_file, ProgramFile)
    saved = saved_file.program
    assert all(g.chunk % g.block_size for g in saved.groups)
    assert str(run_program(open_stateful("vllm"), saved)[-1].outcome.cls) == "unsafe"


def test_the_stateful_gate_finds_nothing_outside_the_documented_divergences() -> None:
    runner = CallableRunner(EngineHost(manager_outside_divergences), timeout=30.0)
    plan = ProgramPlan(stop_at_first=False, seed=1)
    tally = run_programs(runner, TargetRecord("vllm"), plan, programs=PROGRAMS)
    assert tally.found == []
    # Old releases refuse the programs with a hash unit or a lookahead drafter.
    assert tally.counts["ok"] > PROGRAMS // 2 and tally.counts["rejected"] > 0


@pytest.mark.parametrize("seed", [0, 1])
def test_same_seed_same_vllm_campaign(seed: int) -> None:
    def tally() -> tuple[int, dict[str, int]]:
        runner = CallableRunner(EngineHost(manager_outside_divergences), timeout=30.0)
        plan = ProgramPlan(stop_at_first=False, seed=seed)
        tally = run_programs(runner, TargetRecord("vllm"), plan, programs=20)
        return tally.operations or 0, dict(tally.counts)

    assert tally() == tally()


def test_the_adapters_docstring_examples_hold() -> None:
    import doctest

    from kvhit.engines.vllm import manager as vllm_manager

    result = doctest.testmod(vllm_manager)
    assert result.attempted > 0 and result.failed == 0


def test_a_lookup_in_a_documented_class_is_refused_request_by_request() -> None:
    """An eagle group of blocks of 2 hashed per token beside a window (hash unit 1):
    partial hash hits are off, so vLLM drops a whole block (findings-vllm.md, class
    10). The undocumented target refuses each request as the stateless one refuses
    its lookup (releases before 0.26.0 refuse the hash unit)."""
    groups = [
        {"kind": "full", "block_size": 2, "eagle": True},
        {"kind": "sliding_window", "block_size": 4, "window": 4},
    ]
    config = {"groups": groups, "num_blocks": 16, "alignment": 4, "hash_unit": 1}
    ops = [admit(0, *range(7)), admit(1, *range(7))]
    runner = CallableRunner(EngineHost(manager_outside_divergences), timeout=30.0)
    steps = run_program(runner, Program.from_json({**config, "ops": ops}))
    assert {str(s.outcome.cls) for s in steps} == {"unsupported"}, steps[-1].outcome.reason


def test_the_snapshot_reads_a_partial_entry_in_the_block_past_the_whole_ones() -> None:
    """Hash unit 2, blocks of 4: a 3-token prompt registers its tail at 2, inside block
    0, which the request never hashes whole; the snapshot must still see that entry
    (vLLM's lookup reads it)."""
    config = {
        "groups": [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
        "num_blocks": 8,
        "alignment": 2,
        "hash_unit": 2,
    }
    if not RELEASE.partial_hash_hits:  # no hash unit before 0.26.0
        with pytest.raises(Unsupported):
            VllmManagerEngine(parse_config(config))
        return
    engine = VllmManagerEngine(parse_config(config))
    engine.admit(0, [0, 0, 1])
    assert engine.snapshot([0, 0, 1]).cached[0] == (Upto(2),)
