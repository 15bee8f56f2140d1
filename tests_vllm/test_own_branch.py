"""Gate your own branch (docs/engines/vllm.md): a vLLM build that is no release, a
copy of 0.34.0 with a dev version string, is gated as a release is, since what it can
be asked is read from its code. With docs/upstream's lookahead-hashes.patch applied,
``kvhit gate --target vllm`` finds no crash (the one crash class of 0.34.0: a lookup
bounded by M reads past the request's lookahead hashes); as shipped it finds it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "upstream"))

from evidence import apply, copy_release  # noqa: E402

SOURCE = Path(sys.prefix) / "vllm" / "0.34.0"
PATCH = Path(__file__).resolve().parents[1] / "docs" / "upstream" / "lookahead-hashes.patch"
DEV_VERSION = "0.35.0.dev7+g0123abc"


def dev_build(into: Path, patched: bool) -> Path:
    """A copy of 0.34.0 whose ``vllm.__version__`` is :data:`DEV_VERSION` (vLLM reads
    it from ``vllm/_version.py``), with :data:`PATCH` applied if ``patched``."""
    folder = copy_release(SOURCE, into)
    version = folder / "vllm" / "_version.py"
    version.unlink()  # a hard link to the release's own file
    version.write_text(f"__version__ = version = {DEV_VERSION!r}\n__version_tuple__ = (0, 35, 0)\n")
    if patched:
        done = apply(PATCH, folder)
        assert done.returncode == 0, done.stdout + done.stderr
    return folder


def gate(folder: Path, out: Path) -> dict:
    """``kvhit gate --target vllm`` against the build in ``folder`` (its exhaustive
    scopes and solver corpus, no random phase): its JSON report."""
    done = subprocess.run(
        [sys.executable, "-m", "kvhit.cli", "gate", "--target", "vllm", "--keep-going"]
        + ["--json", "--jobs", "1", "--seconds", "0"]
        + ["--out", str(out)],
        env={**os.environ, "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout.splitlines()[-1])


@pytest.mark.skipif(not SOURCE.is_dir(), reason="vLLM 0.34.0 is not in this environment")
def test_a_dev_build_with_the_patch_passes_the_class_and_fails_as_shipped(tmp_path: Path) -> None:
    shipped = gate(dev_build(tmp_path / "shipped", patched=False), tmp_path / "out-shipped")
    fixed = gate(dev_build(tmp_path / "patched", patched=True), tmp_path / "out-patched")
    assert shipped["counts"].get("crash", 0) > 0
    assert fixed["counts"].get("crash", 0) == 0
    assert fixed["counts"].get("ok", 0) > 10_000
