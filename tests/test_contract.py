"""The contracts of a target (kvhit.contract): what a target declares reaches every
runner, refuses what it leaves out before the target is called, and a built-in's
options are checked against what it declares."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from test_harness_cli import HERE, kvhit

from kvhit.contract import (
    BASE,
    Capabilities,
    EngineConfig,
    FunctionTarget,
    LookupTarget,
    QueryTarget,
    Rule,
    Store,
    capabilities_of,
    declare,
    lookup_target,
)
from kvhit.errors import TargetError, Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Kind
from kvhit.targets.runner import CallableRunner, IsolatedRunner
from kvhit.targets.target_spec import TargetSpec

MAMBA = parse_query(
    {"groups": [{"kind": "mamba", "block_size": 1}], "cached": ["1"], "max_length": 1}
)
TIERED = parse_query(
    {
        "groups": [{"kind": "full", "block_size": 1}],
        "cached": [""],
        "max_length": 1,
        "tiers": [{"name": "cpu", "holds": ["full"], "cached": {"0": "1"}}],
    }
)


def two_sizes(q: Any) -> str | None:
    return "one block size only" if len({g.block_size for g in q.groups}) > 1 else None


@declare(kinds=["full"], rules=[Rule("one block size", two_sizes)])
def full_only(query: dict[str, Any]) -> int:
    """A user's target that takes full attention of one block size."""
    return 0


def test_undeclared_is_the_base_language_without_tiers() -> None:
    caps = capabilities_of(lambda query: 0)
    assert caps == BASE and caps.refusal(MAMBA) is None
    assert "tiers (cpu)" in str(caps.refusal(TIERED))


def test_declared_kinds_and_rules_refuse_with_their_reason() -> None:
    caps = capabilities_of(full_only)
    assert caps.refusal(MAMBA) == "declares no mamba groups (it takes full)"
    two = parse_query(
        {
            "groups": [{"kind": "full", "block_size": 1}, {"kind": "full", "block_size": 2}],
            "cached": ["", ""],
            "max_length": 2,
        }
    )
    assert caps.refusal(two) == "one block size only"
    assert caps.with_rules().refusal(TIERED) is not None


def test_a_query_target_refuses_before_its_answer_runs() -> None:
    called = []
    target = QueryTarget(
        lambda q: called.append(q) or 0, Capabilities(kinds=frozenset({Kind.FULL}))
    )
    with pytest.raises(Unsupported, match="no mamba"):
        target.ask(MAMBA)
    assert called == []


def test_a_runner_carries_what_its_target_declares() -> None:
    runner = CallableRunner(full_only, 5.0)
    assert isinstance(runner.func, FunctionTarget) and runner.capabilities.kinds == {Kind.FULL}
    assert runner.ask(MAMBA).status == "answer"  # a runner asks; refusing is the sources' job
    assert TargetSpec("model").open().capabilities.tiers


def test_an_isolated_worker_sends_its_capabilities_data() -> None:
    runner = IsolatedRunner("seed-min", 10.0)
    try:
        assert runner.capabilities.tiers and runner.capabilities.kinds == frozenset(Kind)
    finally:
        runner.close()


def test_lookup_target_keeps_a_lookup_and_wraps_a_function() -> None:
    model = TargetSpec("model").open().func
    assert lookup_target(model) is model and isinstance(model, LookupTarget)
    assert isinstance(lookup_target(lambda q: 0), FunctionTarget)


@pytest.mark.parametrize(
    ("name", "options", "message"),
    [
        ("model", (("eagle", "drop"),), "target 'model' takes no options"),
        ("vllm", (("eagel", "drop"),), "has no option 'eagel'; its options: eagle"),
        ("vllm", (("eagle", "sideways"),), "option eagle takes default, drop, not 'sideways'"),
    ],
)
def test_options_a_target_does_not_declare_are_refused(
    name: str, options: tuple[tuple[str, str], ...], message: str
) -> None:
    with pytest.raises(TargetError, match=message):
        TargetSpec(name, options=options)


def test_options_name_the_target_and_replay_it() -> None:
    spec = TargetSpec("vllm-connector", options=(("divergent", "on"),))
    assert spec.label == "vllm-connector[divergent=on]"
    assert spec.replay_flag == "--target vllm-connector --option divergent=on"


def test_an_engine_config_reads_as_a_query_of_its_configuration() -> None:
    config = EngineConfig(
        (Group(Kind.FULL, 2),), 8, 2, None, (Store("cpu", frozenset({Kind.FULL}), 4),)
    )
    q = config.as_query(9)
    assert (q.max_length, q.num_tokens, [t.name for t in q.tiers]) == (8, 9, ["cpu"])
    assert BASE.refusal(q) is not None and Capabilities(tiers=True).refusal(q) is None
    assert config.to_json()["tiers"] == [{"name": "cpu", "holds": ["full"], "num_blocks": 4}]


def test_the_gate_asks_a_declared_function_only_what_it_declares(tmp_path: Path) -> None:
    code, report, _ = kvhit(
        "gate", "--target", "declared_targets:windows_of_one_size", "--cases", "2000",
        "--seconds", "600", "--json", "--out", str(tmp_path), cwd=HERE,
    )  # fmt: skip
    assert code == 0 and report is not None
    assert set(report["counts"]) == {"ok"} and report["cases"] > 2000
    assert report["withheld"]["one block size only"] > 0


def test_a_function_declaring_tiers_is_drawn_them_and_caught_ignoring_them(
    tmp_path: Path,
) -> None:
    code, report, _ = kvhit(
        "gate", "--target", "declared_targets:pool_only", "--seconds", "0", "--json",
        "--out", str(tmp_path), cwd=HERE,
    )  # fmt: skip
    assert code == 1 and report is not None and report["phases"].get("random", 0) == 0
    (found,) = report["disagreements"]
    assert found["query"]["tiers"]


def test_what_the_rules_withheld_does_not_grow_with_the_jobs(tmp_path: Path) -> None:
    """Every job draws the whole stream: the run counts each withheld case once."""
    withheld = []
    for jobs in ("1", "2"):
        code, report, _ = kvhit(
            "gate", "--target", "declared_targets:windows_of_one_size", "--cases", "500",
            "--seconds", "600", "--jobs", jobs, "--json", "--out", str(tmp_path), cwd=HERE,
        )  # fmt: skip
        assert code == 0 and report is not None
        withheld.append(report["withheld"])
    assert withheld[0] == withheld[1] and withheld[0]["one block size only"] > 0
