"""The campaign commands' signals (gate, fuzz, replay): a bad --out is found before
any work and a save that fails later hides nothing; user text is printed as written;
saved files are inputs; nothing is written to the working directory unasked; Ctrl-C
ends a run at any point with exit 130; piped output is plain lines."""

from __future__ import annotations

import errno
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner
from test_reliability import kvhit

from kvhit.cli import main as cli
from kvhit.harness import tally as tally_module

# Item: --out.


@pytest.mark.parametrize("command", ["gate", "fuzz"])
def test_an_out_that_is_a_file_is_not_a_directory(command: str, tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    result = kvhit(command, "--target", "seed-min", "--out", "afile", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "error: --out: afile is not a directory\n"
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["gate", "fuzz"])
def test_an_out_that_cannot_be_made_is_refused_before_any_work(
    command: str, tmp_path: Path
) -> None:
    """An --out inside a regular file cannot be made (whoever runs the test, root
    included); the run is refused before the first case."""
    (tmp_path / "afile").write_text("")
    result = kvhit(command, "--target", "seed-min", "--out", "afile/found", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "error: --out: cannot write in afile/found: Not a directory\n"
    assert result.stdout == ""


def read_only(*args: object) -> Path:
    """A save on a read-only file system."""
    raise OSError(errno.EROFS, "Read-only file system", "RO/.tmp-1.json")


@pytest.mark.parametrize("jobs", ["1", "2"])
def test_a_save_that_fails_mid_run_draws_the_case_and_exits_1(
    jobs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tally_module, "save", read_only)
    args = ["gate", "--target", "seed-min", "--jobs", jobs, "--out", str(tmp_path / "RO")]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 1, result.output
    assert "unsafe not saved: RO/.tmp-1.json: Read-only file system" in result.stdout
    assert "target answered" in result.stdout and "reference answer L* = 0" in result.stdout
    assert "could not save a replay file: RO/.tmp-1.json: Read-only file system" in result.stdout
    assert "no disagreement found" not in result.stdout


def test_a_save_that_fails_is_in_the_json_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(tally_module, "save", read_only)
    args = ["gate", "--target", "seed-min", "--jobs", "1", "--json", "--out", str(tmp_path)]
    result = CliRunner().invoke(cli.main, args)
    assert result.exit_code == 1
    report = json.loads(result.stdout)
    assert report["save_error"] == "RO/.tmp-1.json: Read-only file system"
    assert report["files"] == [] and report["disagreements"][0]["class"] == "unsafe"


# Item: user text is printed as written.

BOOM = """
from kvhit.targets.registry import seed_min_target


def boom(query):
    return seed_min_target(query)
"""


def test_names_and_paths_are_printed_literally(tmp_path: Path) -> None:
    """A target whose name ends in ``:boom`` (``:boom:`` with the summary's colon) and
    an --out holding ``[red]`` print as they are: no emoji, no markup."""
    (tmp_path / "chatty.py").write_text(BOOM)
    result = kvhit(
        "gate", "--target", "chatty:boom", "--out", "[red]x", "--jobs", "1", cwd=tmp_path
    )
    assert result.returncode == 1, result.stderr
    (saved,) = (tmp_path / "[red]x").glob("unsafe-*.json")
    assert f"unsafe saved to [red]x/{saved.name}" in result.stdout
    assert re.search(r"^chatty:boom: \d+ cases in", result.stdout, re.MULTILINE)
    assert f"kvhit replay '[red]x/{saved.name}' --target chatty:boom" in result.stdout
    assert "\N{COLLISION SYMBOL}" not in result.stdout
