"""The README's main job, run as its set-up says, with its output in a pipe (as in CI
or ``kvhit verify | tee log``): plain lines a reader can follow, one per theorem with
its status, range and time, nothing cut to fit a terminal, and the closing summary."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from test_docs_commands import ROOT, kvhit_segments

from kvhit.cli.main import VERIFY_SECTIONS
from kvhit.proofs.registry import all_theorems

MAIN_JOB = re.compile(r"^python3 -m venv .*kvhit verify.*$", re.MULTILINE)
THEOREM_LINE = re.compile(r"^(?P<name>\w+): (?P<status>\w+)(?: \(expected \w+\))?; .+; [\d.]+ s$")
BUDGET = 900.0  # seconds: a liveness bound for the run, not a benchmark


def readme_main_job() -> list[str]:
    """The arguments of the ``kvhit`` command in the README's main-job line."""
    (line,) = MAIN_JOB.findall((ROOT / "README.md").read_text(encoding="utf-8"))
    (segment,) = kvhit_segments(line)
    return segment[2]


def test_the_readme_names_the_main_job() -> None:
    assert readme_main_job() == ["verify"]


def test_the_main_job_piped_prints_plain_lines(tmp_path: Path) -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *readme_main_job()],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=BUDGET,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    lines = run.stdout.splitlines()
    assert not [line for line in lines if line.endswith("…") or "\x1b[" in line]
    shown = {m["name"]: m["status"] for m in map(THEOREM_LINE.match, lines) if m}
    default = {t.name: str(t.expected) for t in all_theorems() if not t.deep}
    assert shown == default
    assert any(line.startswith("not run (kvhit prove --deep runs them)") for line in lines)
    assert re.search(
        r"^\d+ proved, \d+ refuted as expected, 0 failed, 0 unknown$", run.stdout, re.M
    )
    assert lines[-1] == f"{len(VERIFY_SECTIONS)} of {len(VERIFY_SECTIONS)} sections ok"
    assert list(tmp_path.iterdir()) == []  # the main job writes nothing where it runs
