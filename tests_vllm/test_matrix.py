"""kvhit matrix over the oldest and newest release installed next to this environment
(CI installs 0.14.0 and 0.34.0): one row per release, and each saved counterexample replays, under its own
release, in its own class."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from kvhit.engines.vllm.divergences import in_release, release_key

RELEASES_DIR = Path(sys.prefix) / "vllm"
FOUND = sorted((p.name for p in RELEASES_DIR.glob("*") if (p / "vllm").is_dir()), key=release_key)
INSTALLED = sorted({FOUND[0], FOUND[-1]}, key=release_key) if FOUND else []


def kvhit(*args: str, path: Path | None = None) -> subprocess.CompletedProcess[str]:
    """Run this environment's kvhit, with ``path`` first on PYTHONPATH if given."""
    env = {**os.environ, **({"PYTHONPATH": str(path)} if path else {})}
    command = [sys.executable, "-m", "kvhit.cli", *args]
    return subprocess.run(command, env=env, capture_output=True, text=True)


def test_the_matrix_gates_every_installed_release(tmp_path: Path) -> None:
    assert INSTALLED, f"no release folder in {RELEASES_DIR} (scripts/install-vllm.sh)"
    releases = ",".join(INSTALLED)
    done = kvhit("matrix", "--vllm", releases, "--cases", "100", "--json", "--out", str(tmp_path))
    found = json.loads(done.stdout)
    rows = found["rows"]
    assert [row["release"] for row in rows] == INSTALLED
    crashing = [row["release"] for row in rows if row["counts"]["crash"]]
    crash_documented = {r for r in INSTALLED if any(d.verdict == "crash" for d in in_release(r))}
    assert set(crashing) <= set(found["failing"]) | crash_documented
    assert done.returncode == (1 if found["failing"] else 0), done.stderr
    for row in rows:
        assert row["error"] is None
        assert row["counts"]["unsafe"] > 0  # every release has an unsafe class (chunks)
        saved = {Path(f).name.split("-")[0]: f for f in row["files"]}
        assert saved, row
        for cls, file in saved.items():
            replay = kvhit(
                "replay", file, "--target", "vllm", "--json", path=RELEASES_DIR / row["release"]
            )
            assert json.loads(replay.stdout.splitlines()[-1])["class"] == cls
