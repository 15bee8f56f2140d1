"""``--ray``: the jobs run as Ray tasks on a local Ray instance and give the same result
as one local job. Run in an environment with the extra: ``pip install '.[ray]'``."""

from __future__ import annotations

import json
from contextlib import chdir
from pathlib import Path

from click.testing import CliRunner

from kvhit.cli.campaign import untimed
from kvhit.cli.main import main

BROKEN = Path(__file__).resolve().parents[1] / "tests"


def report(tmp_path: Path, *args: str) -> dict:
    """The JSON report of ``kvhit fuzz`` on a broken target, without its timing."""
    with chdir(BROKEN):  # a user's module:function target, importable from here
        result = CliRunner().invoke(
            main,
            ["fuzz", "--target", "broken_targets:mamba_state_after", "--cases", "400", "--json"]
            + ["--out", str(tmp_path / "out"), *args],
            catch_exceptions=False,
        )
    assert result.exit_code == 1, result.stderr
    return untimed(json.loads(result.stdout))


def test_ray_jobs_give_the_same_result_as_one_job(tmp_path: Path) -> None:
    one = report(tmp_path, "--jobs", "1")
    on_ray = report(tmp_path, "--jobs", "2", "--ray", "local")
    assert {d["class"] for d in on_ray["disagreements"]} == {"unsafe", "lost_reuse"}
    assert on_ray == one
    assert all(Path(f).exists() for f in on_ray["files"])
