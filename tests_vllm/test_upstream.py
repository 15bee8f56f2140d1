"""The patches of docs/upstream/: each applies to its release, and the patched copy
answers the class's example as the spec does, where the release is installed
(scripts/install-vllm.sh puts releases in this environment's ``vllm/`` folder).

The committed test of each class (docs/upstream/tests/, kept as ``kvhit export``
writes it: tests/test_generated_files.py) passes on the patched copy (7's skips,
saying why) and fails on the release as shipped.

CI installs 0.34.0 and 0.14.0: there the patches of 1, 2, 3, 4 and the lookahead
hashes are checked on 0.34.0, and 1a (whose newest release is 0.19.0) on 0.14.0, the
oldest release of its class, where it applies with patch's default fuzz.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "docs" / "upstream"))

from evidence import FIXES, TESTS, Fix, apply, copy_release, patched_copy  # noqa: E402

from kvhit.engines.vllm.divergences import release_key  # noqa: E402

ROOT = Path(sys.prefix) / "vllm"
INSTALLED = sorted(
    (p.name for p in ROOT.glob("*") if (p / "vllm" / "v1" / "core").is_dir()), key=release_key
)


def checked_release(fix: Fix) -> str | None:
    """The installed release to check the fix on: its own, else the newest installed
    release that has the class."""
    if fix.release in INSTALLED:
        return fix.release
    having = [r for r in INSTALLED if fix.in_release(r)]
    return having[-1] if having else None


OWN = [f for f in FIXES if f.release in INSTALLED]
CHECKED = [(f, r) for f in FIXES if (r := checked_release(f)) is not None]


def fix_id(fix: Fix) -> str:
    """A test id: the class and its release."""
    return f"{fix.key}@{fix.release}"


def replay(fixes: list[Fix], folder: Path, tmp_path: Path) -> list[dict]:
    """``kvhit replay`` of the classes' examples against vLLM in ``folder``, in one
    process: one report each."""
    examples = []
    for fix in fixes:
        examples.append(tmp_path / f"example-{fix.key}.json")
        examples[-1].write_text(json.dumps(fix.example))
    done = subprocess.run(
        [sys.executable, "-m", "kvhit.cli", "replay", *map(str, examples), "--target", "vllm"]
        + ["--json"],
        env={**os.environ, "PYTHONPATH": str(folder)},
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode in (0, 1), done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_the_installed_releases_check_some_patch():
    assert CHECKED, f"no release of any patched class is installed in {ROOT}"


@pytest.mark.parametrize("fix", OWN, ids=fix_id)
def test_the_patch_applies_cleanly_to_its_release(fix, tmp_path):
    done = apply(fix.patch_path, copy_release(ROOT / fix.release, tmp_path))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "offset" not in done.stdout, done.stdout


@pytest.mark.parametrize(("fix", "release"), CHECKED, ids=lambda x: getattr(x, "key", x))
def test_the_patched_copy_answers_the_example(fix, release, tmp_path):
    folder = patched_copy(fix, ROOT / release, tmp_path / "patched", fuzz=2)
    [answer] = replay([fix], folder, tmp_path)
    assert answer["class"] == fix.patched, answer
    if fix.patched == "ok":
        assert answer["target_answer"] == answer["reference"]


@pytest.mark.parametrize("release", sorted({r for _, r in CHECKED}, key=release_key))
def test_the_release_as_shipped_has_each_class(release, tmp_path):
    fixes = [f for f, r in CHECKED if r == release]
    answers = replay(fixes, ROOT / release, tmp_path)
    assert [a["class"] for a in answers] == [f.verdict for f in fixes]


def pytest_exit(test: Path, folder: Path, cwd: Path) -> int:
    """The exit code of pytest running ``test`` with vLLM from ``folder``."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
        env={**os.environ, "PYTHONPATH": str(folder)},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode


@pytest.mark.parametrize(("fix", "release"), CHECKED, ids=lambda x: getattr(x, "key", x))
def test_the_committed_test_passes_patched_and_fails_as_shipped(fix, release, tmp_path):
    test = TESTS / f"test_upstream_{fix.key}.py"
    folder = patched_copy(fix, ROOT / release, tmp_path / "patched", fuzz=2)
    assert pytest_exit(test, folder, tmp_path) == 0
    assert pytest_exit(test, ROOT / release, tmp_path) == 1
