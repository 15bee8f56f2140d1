"""``--jobs N``: the same cases and the same result as one job, one file per class."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path

import pytest
from test_harness_cli import BROKEN, HERE, kvhit

from kvhit.cli.campaign import untimed
from kvhit.harness.gate import random_phases
from kvhit.harness.jobs import CaseCampaign, run_campaign
from kvhit.harness.random_cases import CHOICES
from kvhit.targets.target_spec import TargetSpec


@pytest.fixture(autouse=True)
def broken_importable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(HERE))


def report_of(tmp_path: Path, out: str, *args: str) -> dict:
    """The JSON report of a kvhit run writing its files to ``tmp_path/out``."""
    code, report, stderr = kvhit(*args, "--out", out, "--json", cwd=tmp_path)
    assert code in (0, 1), stderr
    assert report is not None
    return untimed(report)


def test_fuzz_on_two_jobs_checks_the_same_cases_as_one(tmp_path: Path) -> None:
    args = ("fuzz", "--target", f"{BROKEN}:mamba_state_after", "--cases", "600", "--seed", "3")
    one = report_of(tmp_path, "one", *args, "--jobs", "1")
    two = report_of(tmp_path, "two", *args, "--jobs", "2")
    assert {d["class"] for d in one["disagreements"]} == {"unsafe", "lost_reuse"}
    assert [f.split("/")[-1] for f in one["files"]] == [f.split("/")[-1] for f in two["files"]]
    del one["files"], two["files"]
    assert one == two
    assert len(list((tmp_path / "two").glob("*.json"))) == 2  # the other job's copies removed


def test_gate_on_two_jobs_stops_at_the_same_first_disagreement(tmp_path: Path) -> None:
    args = ("gate", "--target", f"{BROKEN}:no_short_prefix", "--seconds", "1")
    one = report_of(tmp_path, "one", *args, "--jobs", "1")
    two = report_of(tmp_path, "two", *args, "--jobs", "2")
    assert [d["query"] for d in two["disagreements"]] == [d["query"] for d in one["disagreements"]]
    assert len(two["disagreements"]) == 1 and two["cases"] >= one["cases"]


def test_every_state_on_two_jobs_counts_every_state_once(tmp_path: Path) -> None:
    scope = {"groups": [{"kind": "sliding_window", "block_size": 1, "window": 3}] * 2}
    (tmp_path / "scope.json").write_text(json.dumps({**scope, "cached": ["", ""], "max_length": 5}))
    args = ("fuzz", "--target", "seed-min", "--every-state", "scope.json")
    one = report_of(tmp_path, "one", *args, "--jobs", "1")
    two = report_of(tmp_path, "two", *args, "--jobs", "2")
    assert one["cases"] == 2**10 and two["counts"] == one["counts"]


def test_a_job_that_cannot_open_the_target_is_one_message_and_exit_2(tmp_path: Path) -> None:
    code, _, stderr = kvhit("gate", "--target", "nosuch:thing", "--jobs", "2", cwd=tmp_path)
    assert code == 2 and "nosuch" in stderr and "Traceback" not in stderr


def test_the_case_budget_bounds_all_jobs_together() -> None:
    phases = partial(random_phases, 0, 8, CHOICES, None, 101)
    tallies = [run_campaign(CaseCampaign(TargetSpec("model"), phases), jobs) for jobs in (1, 3)]
    assert [t.cases for t in tallies] == [101, 101]
    assert tallies[0].counts == tallies[1].counts == {"ok": 101}
