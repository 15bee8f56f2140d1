"""Inputs that used to kill or hang kvhit: each gets its answer or one clear line."""

from __future__ import annotations

import importlib.metadata
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvhit.analysis import Analysis
from kvhit.cli import main as cli
from kvhit.harness.random_cases import random_queries
from kvhit.model.algorithms import fixed_point, per_group
from kvhit.model.spec import Query, longest_hit, reduced, valid_all

HERE = Path(__file__).parent
HANG = 600  # seconds: far past what any of these takes, busy or not; reaching it is a hang


def kvhit(*args: str, cwd: Path, timeout: float = HANG) -> subprocess.CompletedProcess[str]:
    """Run the kvhit command line in a fresh process from ``cwd``."""
    return subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def ctrl_c_once(
    args: list[str],
    cwd: Path,
    ready: Callable[[], bool],
    settle: float = 0.0,
    env: dict[str, str] | None = None,
    timeout: float = HANG,
) -> tuple[int, str, str]:
    """Run kvhit in a fresh process from ``cwd``, send it Ctrl-C ``settle`` seconds
    after ``ready()`` first holds, and wait at most ``timeout`` for it to end: its exit
    code, stdout and stderr."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "kvhit.cli", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + HANG
        while not ready():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr
            time.sleep(0.1)
        time.sleep(settle)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=timeout)
    finally:
        proc.kill()
    return proc.returncode, out, err


def unsafe_saved_in(folder: Path) -> Callable[[], bool]:
    """Whether an unsafe case has been saved in ``folder``."""
    return lambda: bool(list(folder.glob("unsafe-*.json")))


# Item: huge max_length.

HUGE = [
    {"groups": [{"kind": "full", "block_size": 1}], "cached": ["1"], "max_length": 10**12},
    {
        "groups": [{"kind": "sliding_window", "block_size": 1, "window": 3}],
        "cached": ["1"],
        "max_length": 3 * 10**8,
    },
    {
        "groups": [
            {"kind": "chunked_local", "block_size": 2, "chunk": 6},
            {"kind": "sliding_window", "block_size": 1, "window": 1},
        ],
        "cached": ["1101", ""],
        "max_length": 10**12 + 7,
    },
    {
        "groups": [
            {"kind": "full", "block_size": 4, "eagle": True},
            {"kind": "mamba", "block_size": 2},
        ],
        "cached": ["111", "0101"],
        "max_length": 10**15,
    },
]


@pytest.mark.parametrize("query", HUGE)
def test_check_on_a_huge_max_length_answers(query: dict, tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps(query))
    result = kvhit(
        "check", str(path), "--json", "--explain", str(query["max_length"] // 2 * 2), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["length"] == report["fixed_point"] <= report["min_of_groups"]


@pytest.mark.parametrize("query", HUGE[:2])
def test_gate_targets_on_a_huge_max_length_answer(query: dict, tmp_path: Path) -> None:
    path = tmp_path / "q.json"
    path.write_text(json.dumps(query))
    for target in ("model", "seed-min"):
        result = kvhit("replay", str(path), "--target", target, cwd=tmp_path)
        assert result.returncode == 0 and "ok now" in result.stdout, result.stdout + result.stderr


def plain_longest(q: Query) -> int:
    """L* by every candidate of the query itself, not reduced."""
    return next(L for L in q.candidates() if valid_all(q, L))


@pytest.mark.parametrize(
    "kinds",
    [
        ("full", "sliding_window", "chunked_local", "mamba", "eagle"),
        ("chunked_local",),
        ("chunked_local", "sliding_window"),
    ],
)
def test_the_reduced_query_gives_every_answer_unchanged(kinds: tuple[str, ...]) -> None:
    """On random queries, and on the same queries with M (and T) raised, L*, its blocks,
    the fixed point and every group's finder are the same reduced and not."""
    checked = shifted = 0
    for base in random_queries(seed=5, count=150, max_blocks=6, kinds=kinds):
        for extra in (0, 1, 7, 40):
            q = Query(
                base.groups,
                base.cached,
                base.max_length + extra,
                base.num_tokens + extra,
                base.alignment,
            )
            best = longest_hit(q)
            analysis = Analysis(q)
            assert best.length == plain_longest(q)
            assert best == analysis.longest_hit == analysis.fixed_point
            assert fixed_point(q) == best.length
            assert list(analysis.finder_results) == per_group(q)
            checked += 1
            shifted += reduced(q)[1] > 0
    assert checked == 600 and shifted > 0


# Item: files that are not queries.


@pytest.mark.parametrize(
    ("content", "reason"),
    [(b"[" * 100_000, "nested too deeply"), (b"\xff\xfe\x00garbage\x80", "not UTF-8")],
)
@pytest.mark.parametrize(
    "command",
    [("check",), ("replay", "--target", "model"), ("fuzz", "--target", "model", "--every-state")],
)
def test_a_file_that_is_no_query_is_one_line_and_exit_2(
    content: bytes, reason: str, command: tuple[str, ...], tmp_path: Path
) -> None:
    path = tmp_path / "bad.json"
    path.write_bytes(content)
    result = kvhit(*command, str(path), cwd=tmp_path)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and str(path) in lines[0] and reason in lines[0], result.stderr


# Item: a Python target that kills its process.


@pytest.mark.parametrize("target", ["segfaults_on_mamba", "exits_on_two_windows"])
def test_an_isolated_target_that_dies_is_a_saved_crash(target: str, tmp_path: Path) -> None:
    (tmp_path / "broken_targets.py").write_text((HERE / "broken_targets.py").read_text())
    result = kvhit(
        "fuzz",
        "--target",
        f"broken_targets:{target}",
        "--isolate",
        "--cases",
        "300",
        "--seed",
        "3",
        "--json",
        "--out",
        "found",
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    assert report["cases"] == 300 and report["counts"]["crash"] >= 1
    assert report["counts"]["ok"] > 0  # the campaign went on after the crash
    (path,) = report["files"]
    saved = json.loads((tmp_path / path).read_text())
    assert (
        saved["class"] == "crash"
        and "killed by SIGSEGV" in saved["reason"]
        or "code 7" in saved["reason"]
    )
    replayed = kvhit(
        "replay", path, "--target", f"broken_targets:{target}", "--isolate", cwd=tmp_path
    )
    assert replayed.returncode == 1 and "still crash" in replayed.stdout


def test_an_isolated_target_that_cannot_load_is_bad_input(tmp_path: Path) -> None:
    result = kvhit(
        "fuzz", "--target", "no_such_module:f", "--isolate", "--cases", "1", cwd=tmp_path
    )
    assert result.returncode == 2 and "cannot import no_such_module" in result.stderr


# Item: a program's stderr.


def test_a_program_crash_keeps_its_last_stderr_lines(tmp_path: Path) -> None:
    program = f"{sys.executable} {HERE / 'cmd_target.py'} dies"
    result = kvhit(
        "fuzz", "--target-cmd", program, "--cases", "100", "--json", "--out", "found", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    (found,) = json.loads(result.stdout)["disagreements"]
    assert found["class"] == "crash"
    assert "exited with code 3" in found["reason"]
    assert "lookup.c:42: no state for block -1" in found["reason"]
    (path,) = (tmp_path / "found").glob("crash-*.json")
    assert "lookup.c:42" in json.loads(path.read_text())["reason"]


# Item: Ctrl-C.


@pytest.mark.parametrize(
    ("command", "jobs"), [(("fuzz",), "1"), (("fuzz",), "2"), (("gate", "--keep-going"), "2")]
)
def test_ctrl_c_ends_a_run_with_its_summary(
    command: tuple[str, ...], jobs: str, tmp_path: Path
) -> None:
    """Interrupted once it has saved a counterexample: the summary says what was checked
    and where the counterexample is, and the exit code is 130."""
    args = [*command, "--target", "seed-min", "--seconds", "600", "--out", "found", "--jobs", jobs]
    code, out, err = ctrl_c_once(args, tmp_path, unsafe_saved_in(tmp_path / "found"))
    assert code == 130, err
    assert "Aborted" not in out + err
    assert re.search(r"seed-min: interrupted after \d+ cases in [\d.]+ s: ok \d+  unsafe \d+", out)
    saved = list((tmp_path / "found").glob("unsafe-*.json"))  # two jobs may each save one
    assert saved
    for path in saved:
        assert f"replay with: kvhit replay found/{path.name} --target seed-min" in out


def test_ctrl_c_before_a_run_has_begun_is_one_line_and_130(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def interrupted(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "read_queries", interrupted)
    result = CliRunner().invoke(cli.main, ["check", "-"], input="{}")
    assert (result.exit_code, result.stderr, result.stdout) == (130, "interrupted\n", "")


# Item: nothing but kvhit's own output.


def test_a_command_that_loads_torch_prints_only_kvhit_output(tmp_path: Path) -> None:
    """torch warns "Failed to initialize NumPy" on import without NumPy, so kvhit
    depends on it; then a command that loads torch prints nothing but its answer."""
    assert any(re.match(r"numpy\b", r) for r in importlib.metadata.requires("kvhit") or [])
    example = HERE.parent / "examples" / "seed_minimal.json"
    result = kvhit("replay", str(example), "--target", "impl", cwd=tmp_path)
    assert result.returncode == 0
    assert result.stderr == ""
    assert result.stdout.splitlines() == [f"{example}: ok now, L* = 0"]
