"""kvhit gate / fuzz / replay from the command line, against good and broken targets."""

from __future__ import annotations

import json
import sys
from contextlib import chdir
from pathlib import Path
from xml.etree import ElementTree

import pytest
from click.testing import CliRunner

from kvhit.cli.campaign import untimed
from kvhit.cli.main import main

HERE = Path(__file__).parent
BROKEN = "broken_targets"


def kvhit(*args: str, cwd: Path) -> tuple[int, dict | None, str]:
    """Run kvhit in-process from ``cwd``; exit code, the JSON report (if --json), stderr."""
    with chdir(cwd):
        result = CliRunner().invoke(main, list(args), catch_exceptions=False)
    report = json.loads(result.stdout) if "--json" in args and result.exit_code < 2 else None
    return result.exit_code, report, result.stderr


def gate(target: str, tmp_path: Path, *extra: str) -> tuple[int, dict]:
    """A quick gate (one second of random queries) with the JSON report."""
    code, report, _ = kvhit(
        "gate", "--target", target, "--seconds", "1", "--json", *extra, cwd=tmp_path
    )
    assert report is not None
    return code, report


@pytest.fixture(autouse=True)
def broken_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


@pytest.mark.parametrize("target", ["model", "impl"])
def test_gate_finds_nothing_on_the_references(target: str, tmp_path: Path) -> None:
    code, report = gate(target, tmp_path)
    assert code == 0
    assert report["disagreements"] == []
    assert report["counts"] == {"ok": report["cases"]}
    assert report["phases"]["exhaustive"] > 7000 and report["phases"]["corpus"] > 2000


def test_gate_catches_seed_min_small(tmp_path: Path) -> None:
    code, report, _ = kvhit("gate", "--target", "seed-min", "--json", cwd=tmp_path)
    assert code == 1
    (found,) = report["disagreements"]
    assert found["class"] == "unsafe"
    assert found["target_answer"]["length"] > found["reference"]["length"]
    query = found["query"]
    assert len(query["groups"]) <= 2
    assert all(len(row) <= 3 for row in query["cached"])


ONE_PER_CLASS = [
    ("always_top", "unsafe"),
    ("one_short", "lost_reuse"),
    ("whole_prefix_blocks", "wrong_blocks"),
    ("crashes_on_mamba", "crash"),
    ("hangs_on_chunks", "timeout"),
    ("returns_text", "bad_return"),
    ("window_counts_w_before", "lost_reuse"),
    ("no_short_prefix", "lost_reuse"),
    ("eagle_drops_every_pass", "lost_reuse"),
]


@pytest.mark.parametrize(("name", "cls"), ONE_PER_CLASS)
def test_broken_target_caught_with_its_class(name: str, cls: str, tmp_path: Path) -> None:
    # Only the hanging target gets a short per-call limit: a busy machine must not
    # turn a slow answer of the others into a timeout.
    limit = "0.2" if cls == "timeout" else "10"
    code, report = gate(f"{BROKEN}:{name}", tmp_path, "--timeout", limit)
    assert code == 1
    (found,) = report["disagreements"]
    assert found["class"] == cls
    assert len(found["query"]["groups"]) <= 2


def test_mamba_wrong_block_is_both_unsafe_and_lost_reuse(tmp_path: Path) -> None:
    code, report = gate(f"{BROKEN}:mamba_state_after", tmp_path, "--keep-going", "--seconds", "0.2")
    assert code == 1
    assert {d["class"] for d in report["disagreements"]} == {"unsafe", "lost_reuse"}


def test_saved_file_written_before_it_is_drawn_and_replays(tmp_path: Path) -> None:
    code, report, _ = kvhit(
        "gate", "--target", "seed-min", "--out", str(tmp_path / "out"), "--json", cwd=tmp_path
    )
    (path,) = report["files"]
    saved = json.loads(Path(path).read_text())
    assert saved["query"] == report["disagreements"][0]["query"]
    code, _, _ = kvhit("replay", path, "--target", "seed-min", cwd=tmp_path)
    assert code == 1
    code, replayed, _ = kvhit("replay", path, "--target", "model", "--json", cwd=tmp_path)
    assert code == 0 and replayed["class"] == "ok" and replayed["saved_class"] == "unsafe"


def test_replay_prints_the_drawing(tmp_path: Path) -> None:
    _, report, _ = kvhit(
        "gate", "--target", "seed-min", "--out", str(tmp_path / "o"), "--json", cwd=tmp_path
    )
    result = CliRunner().invoke(main, ["replay", report["files"][0], "--target", "seed-min"])
    assert "(unsafe): group" in result.stdout and "reference answer L* = 0" in result.stdout


def test_fuzz_is_deterministic(tmp_path: Path) -> None:
    args = (
        "fuzz",
        "--target",
        f"{BROKEN}:no_short_prefix",
        "--cases",
        "400",
        "--seed",
        "5",
        "--json",
    )
    runs = [untimed(kvhit(*args, cwd=tmp_path)[1] or {}) for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0]["cases"] == 400 and runs[0]["counts"]["lost_reuse"] > 0
    other = kvhit(*args[:-3], "--seed", "6", "--json", cwd=tmp_path)[1]
    assert other["counts"] != runs[0]["counts"]


def test_junit_report(tmp_path: Path) -> None:
    junit = tmp_path / "gate.xml"
    code, _, _ = kvhit("gate", "--target", "seed-min", "--junit", str(junit), cwd=tmp_path)
    suite = ElementTree.parse(junit).getroot()
    assert code == 1 and suite.get("failures") == "1"
    assert "unsafe" in suite.find("testcase/failure").get("message")


def command(mode: str) -> str:
    return f"{sys.executable} {HERE / 'cmd_target.py'} {mode}"


def test_target_cmd_good_program(tmp_path: Path) -> None:
    code, report, _ = kvhit(
        "fuzz", "--target-cmd", command("good"), "--cases", "300", "--json", cwd=tmp_path
    )
    assert code == 0 and report["counts"] == {"ok": 300}


@pytest.mark.parametrize(("mode", "cls"), [("hang", "timeout"), ("garbage", "bad_return")])
def test_target_cmd_hang_and_garbage(mode: str, cls: str, tmp_path: Path) -> None:
    limit = "0.2" if cls == "timeout" else "10"
    args = ("--target-cmd", command(mode), "--timeout", limit, "--json")
    code, report, _ = kvhit("fuzz", *args, "--cases", "150", "--seed", "2", cwd=tmp_path)
    assert code == 1
    assert [d["class"] for d in report["disagreements"]] == [cls]
    assert report["counts"]["ok"] > 50  # answers keep coming after each hang or bad line


def test_target_cmd_unsupported_is_not_a_disagreement(tmp_path: Path) -> None:
    args = ("fuzz", "--target-cmd", command("refuse"), "--cases", "200", "--json")
    code, report, _ = kvhit(*args, cwd=tmp_path)
    assert code == 0 and report["counts"]["unsupported"] > 0 and report["disagreements"] == []


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("gate",), "exactly one of --target and --target-cmd"),
        (("gate", "--target", "nope"), "unknown target 'nope'"),
        (("gate", "--target", "no_such_module:f"), "cannot import no_such_module"),
        (("fuzz", "--target", "model", "--kinds", "full,spiral"), "unknown kind 'spiral'"),
        (("gate", "--target-cmd", "/no/such/program"), "cannot start"),
        (
            ("fuzz", "--target", "model", "--prompt-tokens", "64"),
            "--prompt-tokens needs --stateful",
        ),
        (("gate", "--target", "model", "--steps", "5"), "--steps needs --stateful"),
        (("fuzz", "--target", "impl", "--stateful", "--isolate"), "--isolate is not available"),
    ],
)
def test_bad_usage_exits_2(args: tuple[str, ...], message: str, tmp_path: Path) -> None:
    code, _, stderr = kvhit(*args, cwd=tmp_path)
    assert code == 2 and message in stderr and "Traceback" not in stderr


def test_a_module_that_fails_on_import_exits_2(tmp_path: Path) -> None:
    (tmp_path / "broken_module.py").write_text("def lookup(query)\n")
    code, _, stderr = kvhit("gate", "--target", "broken_module:lookup", cwd=tmp_path)
    assert code == 2 and "SyntaxError" in stderr and "Traceback" not in stderr


def test_an_unwritable_out_folder_exits_2(tmp_path: Path) -> None:
    (tmp_path / "taken").write_text("a file, not a folder")
    code, _, stderr = kvhit("gate", "--target", "seed-min", "--out", "taken", cwd=tmp_path)
    assert code == 2 and "taken" in stderr and "Traceback" not in stderr


def test_replay_of_a_bad_file_exits_2(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"groups": [], "cached": [], "max_length": 1}')
    code, _, stderr = kvhit("replay", str(bad), "--target", "model", cwd=tmp_path)
    assert code == 2 and "groups" in stderr


def test_a_users_own_function_from_the_current_directory(tmp_path: Path) -> None:
    (tmp_path / "my_engine.py").write_text(
        "from kvhit.targets.registry import model_target\n\n"
        "def lookup(query):\n"
        "    return model_target(query)['length']\n"
    )
    code, report = gate("my_engine:lookup", tmp_path, "--seconds", "0.2")
    assert code == 0 and report["target"] == "my_engine:lookup" and report["cases"] > 9000


def test_fuzz_every_state_of_a_users_groups(tmp_path: Path) -> None:
    example = Path(__file__).parents[1] / "examples" / "seed_reviewer_exact.json"
    args = ("fuzz", "--every-state", str(example), "--json")
    code, report, _ = kvhit(*args, "--target", "model", cwd=tmp_path)
    assert code == 0 and report["cases"] == 2**10  # 5 blocks per group reach M = 5
    code, report, _ = kvhit(*args, "--target", "seed-min", cwd=tmp_path)
    assert code == 1 and report["counts"]["unsafe"] > 0
    big = tmp_path / "big.json"
    big.write_text(
        json.dumps(
            {"groups": [{"kind": "full", "block_size": 1}] * 3, "cached": [[]] * 3, "max_length": 9}
        )
    )
    code, _, stderr = kvhit("fuzz", "--every-state", str(big), "--target", "model", cwd=tmp_path)
    assert code == 2 and "134,217,728 cache states" in stderr
    for option in (("--shape", "sglang"), ("--kinds", "full")):
        code, _, stderr = kvhit(*args, *option, "--target", "model", cwd=tmp_path)
        assert code == 2 and "--every-state checks every state" in stderr
