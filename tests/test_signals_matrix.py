"""kvhit matrix's signals: its exit code says whether a release disagreed, and Ctrl-C
stops it at once with exit code 130, keeping the releases that finished.

No vLLM is needed: a release folder is a fake ``vllm`` package, and where a test needs
a gate's report, the gate each release runs is replaced by a program printing one.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from kvhit.cli import matrix as matrix_module
from kvhit.cli.main import main

HANG = 600.0
"""Seconds a test waits for the matrix to start its gates (each imports kvhit first:
seconds on a quiet machine), or for it to end, before calling it hung."""
LIVENESS = 60.0
"""Seconds from Ctrl-C to the end of the matrix: a second or two on a quiet machine,
far below the 600 s its hanging gates sleep."""


def fake_release(root: Path, release: str, init: str = "") -> None:
    """A release folder whose ``vllm`` package has the release's number and runs
    ``init`` when imported."""
    package = root / release / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {release!r}\n{init}")


def report_of(counts: dict[str, int]) -> str:
    """A gate's JSON report holding ``counts``."""
    return json.dumps({"counts": counts, "files": [], "seconds": 0.0})


def with_reports(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, reports: dict[str, dict[str, int]]
) -> Path:
    """Release folders for ``reports``, each release's gate replaced by a program that
    prints its report; the releases' root."""
    root = tmp_path / "vllm"
    for release in reports:
        fake_release(root, release)

    def command(release: str, out: Path, settings: Any) -> list[str]:
        return [sys.executable, "-c", f"print({report_of(reports[release])!r})"]

    monkeypatch.setattr(matrix_module, "gate_command", command)
    return root


def run_matrix(root: Path, tmp_path: Path, releases: str, *args: str) -> tuple[int, Any]:
    """``kvhit matrix --json`` in-process on ``releases``: the exit code and the JSON."""
    result = CliRunner().invoke(
        main,
        ["matrix", "--vllm", releases, "--releases-dir", str(root), "--out", str(tmp_path)]
        + ["--json", *args],
        catch_exceptions=False,
    )
    return result.exit_code, json.loads(result.stdout)


def test_a_class_no_documented_divergence_gives_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reports = {"0.14.0": {"ok": 5, "unsafe": 2}, "0.34.0": {"ok": 5, "timeout": 1}}
    root = with_reports(monkeypatch, tmp_path, reports)
    code, found = run_matrix(root, tmp_path, "0.14.0,0.34.0")
    assert code == 1
    assert found["failing"] == ["0.34.0"]
    assert [row["counts"]["timeout"] for row in found["rows"]] == [0, 1]


def test_documented_classes_alone_exit_0_and_fail_on_any_exits_1(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    reports = {"0.14.0": {"ok": 5, "unsafe": 2, "lost_reuse": 3, "wrong_blocks": 1}}
    root = with_reports(monkeypatch, tmp_path, reports)
    assert run_matrix(root, tmp_path, "0.14.0")[0] == 0
    code, found = run_matrix(root, tmp_path, "0.14.0", "--fail-on", "any")
    assert (code, found["failing"]) == (1, ["0.14.0"])


def test_against_vllm_undocumented_every_disagreement_fails(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = with_reports(monkeypatch, tmp_path, {"0.14.0": {"ok": 5, "unsafe": 1}})
    code, found = run_matrix(root, tmp_path, "0.14.0", "--target", "vllm-undocumented")
    assert (code, found["failing"]) == (1, ["0.14.0"])


def test_a_disagreement_is_not_hidden_behind_a_release_that_could_not_be_gated(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = with_reports(monkeypatch, tmp_path, {"0.34.0": {"timeout": 1}})
    fake_release(root, "0.33.0")  # no report: its gate prints nothing and fails
    monkeypatch.setattr(
        matrix_module,
        "gate_command",
        lambda release, out, settings: (
            [sys.executable, "-c", f"print({report_of({'timeout': 1})!r})"]
            if release == "0.34.0"
            else [sys.executable, "-c", "import sys; sys.exit('error: cannot drive it')"]
        ),
    )
    code, found = run_matrix(root, tmp_path, "0.33.0,0.34.0")
    assert code == 1
    assert [row["error"] for row in found["rows"]] == ["error: cannot drive it", None]


def test_releases_run_side_by_side_and_keep_their_order(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    root = tmp_path / "vllm"
    for release in ("0.14.0", "0.15.0"):
        fake_release(root, release)
    started = tmp_path / "started"
    started.mkdir()
    # Each gate says it started, then waits until both have: only gates run at once end.
    wait_both = (
        "import pathlib, sys, time\n"
        f"d = pathlib.Path({str(started)!r}); (d / sys.argv[1]).touch()\n"
        "end = time.monotonic() + 30\n"
        "while len(list(d.iterdir())) < 2 and time.monotonic() < end: time.sleep(0.05)\n"
        "if len(list(d.iterdir())) < 2: sys.exit('error: ran alone')\n"
        f"print({report_of({})!r})"
    )
    monkeypatch.setattr(
        matrix_module,
        "gate_command",
        lambda release, out, settings: [sys.executable, "-c", wait_both, release],
    )
    code, found = run_matrix(root, tmp_path, "0.15.0,0.14.0", "--parallel", "2")
    assert [row["release"] for row in found["rows"]] == ["0.15.0", "0.14.0"]
    assert [row["error"] for row in found["rows"]] == [None, None]
    assert code == 0


def alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (a zombie counts as ended)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def test_ctrl_c_stops_the_gates_at_once_and_keeps_what_finished(tmp_path: Path) -> None:
    root = tmp_path / "vllm"
    pids = tmp_path / "pids"
    pids.mkdir()
    fake_release(root, "0.14.0")  # imports, then its gate fails at once: a finished row
    hang = f"import os, time\nopen({str(pids)!r} + f'/{{os.getpid()}}', 'w').close()\ntime.sleep(600)\n"
    fake_release(root, "0.15.0", hang)
    fake_release(root, "0.16.0", hang)
    command = [sys.executable, "-m", "kvhit.cli", "matrix", "--vllm", "0.14.0,0.15.0,0.16.0"]
    options = ["--releases-dir", str(root), "--out", str(tmp_path / "out"), "--parallel", "3"]
    matrix = subprocess.Popen(
        [*command, *options, "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    progress: list[str] = []
    reader = threading.Thread(target=lambda: progress.extend(matrix.stderr), daemon=True)
    reader.start()  # type: ignore[arg-type]
    deadline = time.monotonic() + HANG
    while time.monotonic() < deadline and not (
        len(list(pids.iterdir())) == 2 and any(line.startswith("[1/3]") for line in progress)
    ):
        time.sleep(0.1)
    gates = [int(p.name) for p in pids.iterdir()]
    assert len(gates) == 2, "the hanging gates did not start"
    matrix.send_signal(signal.SIGINT)
    stopping = time.monotonic()
    assert matrix.stdout is not None
    out = matrix.stdout.read()
    matrix.wait(timeout=HANG)
    assert time.monotonic() - stopping < LIVENESS
    reader.join(timeout=HANG)
    err = "".join(progress)
    assert matrix.returncode == 130
    assert "interrupted" in err.splitlines()
    assert not any(alive(pid) for pid in gates)
    found = json.loads(out)
    assert found["interrupted"] is True
    assert [row["release"] for row in found["rows"]] == ["0.14.0"]
    assert "Traceback" not in err
