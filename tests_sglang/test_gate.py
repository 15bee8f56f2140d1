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
    assert set(report["counts"]) == {"ok", "unsupported"}
    # The random queries are shaped for SGLang by default, so every one is answered:
    # the refused states all come from the exhaustive scopes and the corpus (most of
    # theirs mix kinds or block sizes; about 2% of unshaped random queries are answered).
    phases = report["phases"]
    assert phases["random"] == 300
    assert report["counts"]["unsupported"] < phases["exhaustive"] + phases["corpus"]
    assert report["counts"]["ok"] > phases["random"]
