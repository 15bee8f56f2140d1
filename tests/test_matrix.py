"""kvhit matrix: bad usage, missing releases and releases the target cannot drive.

The matrix over real vLLM releases runs in tests_vllm/test_matrix.py; here, with no
vLLM installed, a release folder is a fake ``vllm`` package.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvhit.cli.main import main


def matrix(*args: str) -> tuple[int, str, str]:
    """Run ``kvhit matrix`` in-process: exit code, stdout, stderr."""
    result = CliRunner().invoke(main, ["matrix", *args], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def fake_release(root: Path, folder: str, version: str) -> Path:
    """A release folder holding a ``vllm`` package with only a version number."""
    package = root / folder / "vllm"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(f"__version__ = {version!r}\n")
    return root


@pytest.mark.parametrize("releases", ["", "0.34.0,latest", " , "])
def test_a_bad_release_list_is_bad_usage(releases: str, tmp_path: Path) -> None:
    code, _, err = matrix("--vllm", releases, "--releases-dir", str(tmp_path))
    assert code == 2
    assert err.startswith("error: --vllm:")


def test_a_release_not_installed_says_how_to_install_it(tmp_path: Path) -> None:
    code, _, err = matrix("--vllm", "0.34.0", "--releases-dir", str(tmp_path / "vllm"))
    assert code == 2
    assert "vLLM 0.34.0 is not installed" in err
    assert f"scripts/install-vllm.sh {tmp_path} 0.34.0" in err


def test_a_release_the_target_cannot_drive_is_one_line_and_exit_2(tmp_path: Path) -> None:
    root = fake_release(tmp_path, "0.99.0", "0.99.0")
    code, out, _ = matrix(
        "--vllm",
        "0.99.0",
        "--releases-dir",
        str(root),
        "--cases",
        "1",
        "--out",
        str(tmp_path / "out"),
    )
    assert code == 2
    row = out.splitlines()[1]
    release, reason = row.split(maxsplit=1)
    assert release == "0.99.0"
    assert reason.startswith("cannot be gated: error: vLLM 0.99.0 lacks what kvhit calls")
    assert "Traceback" not in out


def test_a_folder_holding_another_release_is_refused(tmp_path: Path) -> None:
    root = fake_release(tmp_path, "0.98.0", "0.97.0")
    code, out, _ = matrix(
        "--vllm", "0.98.0", "--releases-dir", str(root), "--json", "--out", str(tmp_path / "out")
    )
    assert code == 2
    (row,) = json.loads(out)["rows"]
    assert row["error"].endswith("is vLLM 0.97.0, not 0.98.0")
    assert sum(row["counts"].values()) == 0
