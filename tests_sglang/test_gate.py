"""``kvhit gate --target sglang`` runs, draws states SGLang can hold, and finds nothing."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_gate_finds_no_disagreement(tmp_path: Path) -> None:
    run = subprocess.run(
        [
            sys.executable,
            "-m",
            "kvhit.cli",
            "gate",
            "--target",
            "sglang",
            "--seconds",
            "600",  # a hang guard: the random phase ends at --cases
            "--cases",
            "300",
            "--jobs",
            "1",
            "--json",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    report = json.loads(run.stdout)
    assert report["disagreements"] == [] and report["counts"]["ok"] > 100
    # SGLang's targets declare what its tree can hold (configurations and rows), so
    # nothing drawn is refused: the states of the exhaustive scopes and the corpus
    # whose rows no tree holds are withheld, never asked.
    assert set(report["counts"]) == {"ok"}
    phases = report["phases"]
    assert phases["random"] == 300
    assert sum(report["withheld"].values()) > 0
    assert report["counts"]["ok"] > phases["random"]
