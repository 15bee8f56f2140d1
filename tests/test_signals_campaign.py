"""The campaign commands' signals (gate, fuzz, replay): a bad --out is found before
any work and a save that fails later hides nothing; user text is printed as written;
saved files are inputs; nothing is written to the working directory unasked; Ctrl-C
ends a run at any point with exit 130; piped output is plain lines."""

from __future__ import annotations

import errno
import io
import json
import os
import re
import time
from collections import Counter
from pathlib import Path

import pytest
from click.testing import CliRunner
from rich.console import Console
from test_reliability import HANG, ctrl_c_once, kvhit, unsafe_saved_in

from kvhit.cli import main as cli
from kvhit.cli.display import campaign_bar
from kvhit.harness import tally as tally_module
from kvhit.harness.checker import CaseChecker
from kvhit.harness.tally import Tally

# Item: --out.


def test_an_out_that_is_a_file_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("")
    result = kvhit("fuzz", "--target", "seed-min", "--out", "afile", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == "error: --out: afile is not a directory\n"
    assert result.stdout == ""


def test_an_out_that_cannot_be_made_is_refused_before_any_work(tmp_path: Path) -> None:
    """An --out inside a regular file cannot be made (whoever runs the test, root
    included); the run is refused before the first case."""
    (tmp_path / "afile").write_text("")
    result = kvhit("gate", "--target", "seed-min", "--out", "afile/found", cwd=tmp_path)
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


# Item: saved files are inputs.

SEED_MINIMAL = Path(__file__).parent.parent / "examples" / "seed_minimal.json"


def saved_unsafe(tmp_path: Path) -> Path:
    """The counterexample ``gate --target seed-min`` saves."""
    result = kvhit("gate", "--target", "seed-min", "--jobs", "1", "--out", "found", cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    (path,) = (tmp_path / "found").glob("unsafe-*.json")
    return path


def test_replay_without_a_target_uses_the_one_the_file_records(tmp_path: Path) -> None:
    path = saved_unsafe(tmp_path)
    result = kvhit("replay", str(path), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(f"{path}: still unsafe (saved as unsafe)\n")
    assert result.stderr == f"{path}: replayed on --target seed-min, the target it records\n"


def test_replay_of_a_saved_program_without_a_target_uses_its_target(tmp_path: Path) -> None:
    (tmp_path / "broken_stateful.py").write_text(
        (Path(__file__).parent / "broken_stateful.py").read_text()
    )
    record = {
        "format": "kvhit-stateful/1",
        "target": "broken_stateful:first_full_truncated",
        "class": "wrong_blocks",
        "program": {
            "groups": [
                {"kind": "full", "block_size": 1, "eagle": True, "drafter": "drop"},
                {"kind": "full", "block_size": 1},
            ],
            "num_blocks": 33,
            "alignment": 1,
            "ops": [
                {"op": "admit", "request": 0, "tokens": [0, 0]},
                {"op": "admit", "request": 1, "tokens": [0, 0, 0]},
            ],
        },
    }
    path = tmp_path / "program.json"
    path.write_text(json.dumps(record))
    result = kvhit("replay", str(path), cwd=tmp_path)
    assert result.returncode == 1, result.stderr
    assert result.stdout.startswith(f"{path}: still wrong_blocks (saved as wrong_blocks)\n")
    assert "--target broken_stateful:first_full_truncated, the target it records" in result.stderr


def test_replay_of_a_plain_query_without_a_target_is_bad_usage(tmp_path: Path) -> None:
    result = kvhit("replay", str(SEED_MINIMAL), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        f"error: {SEED_MINIMAL} records no target: give --target or --target-cmd\n"
    )


def test_a_plain_query_replayed_says_what_the_target_answers_now(tmp_path: Path) -> None:
    """Nothing was saved before: the class it has now, never "still"."""
    unsafe = kvhit("replay", str(SEED_MINIMAL), "--target", "seed-min", cwd=tmp_path)
    assert unsafe.returncode == 1
    assert unsafe.stdout.startswith(f"{SEED_MINIMAL}: unsafe now\nquery: M=2 A=1\n")
    assert "still" not in unsafe.stdout
    ok = kvhit("replay", str(SEED_MINIMAL), "--target", "model", cwd=tmp_path)
    assert (ok.returncode, ok.stdout) == (0, f"{SEED_MINIMAL}: ok now, L* = 0\n")


def test_check_reads_a_saved_counterexample_as_its_query(tmp_path: Path) -> None:
    path = saved_unsafe(tmp_path)
    result = kvhit("check", str(path), "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["query"] == json.loads(path.read_text())["query"]
    assert report["length"] == 0 and report["min_of_groups_verdict"] == "unsafe"


def test_check_on_a_saved_program_says_what_the_file_is(tmp_path: Path) -> None:
    path = tmp_path / "program.json"
    path.write_text(json.dumps({"format": "kvhit-stateful/1", "program": {}}))
    result = kvhit("check", str(path), cwd=tmp_path)
    assert result.returncode == 2
    assert "a 'kvhit-stateful/1' file, not a query or a saved disagreement" in result.stderr


# Item: nothing written in the working directory unasked.


@pytest.mark.parametrize(
    "command",
    [
        ("gate", "--stateful", "--target", "impl", "--cases", "5"),
        ("fuzz", "--stateful", "--target", "impl", "--cases", "5"),
        ("gate", "--target", "model", "--seconds", "0.5", "--jobs", "2"),
    ],
)
def test_a_campaign_that_finds_nothing_leaves_nothing(
    command: tuple[str, ...], tmp_path: Path
) -> None:
    """No replay folder and no Hypothesis files (it draws the programs) in the working
    directory."""
    result = kvhit(*command, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == []


def test_hypothesis_files_stay_out_of_a_given_out(tmp_path: Path) -> None:
    out = tmp_path / "found"
    out.mkdir()
    result = kvhit(
        "gate", "--stateful", "--target", "impl", "--cases", "5", "--out", "found", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert list(tmp_path.iterdir()) == [out] and list(out.iterdir()) == []


# Item: Ctrl-C at any point.

SLOW = """
import os
import time
from collections import Counter
from pathlib import Path

from kvhit.impl.stateful_target import StatefulImpl
from kvhit.targets.registry import seed_min_target


def mark(name):
    Path(os.environ["MARKS"], name).touch()
    time.sleep(float(os.environ.get(name.upper(), "0")))


mark("loading")


def sleepy(query):
    mark("calling")
    return seed_min_target(query)


def sleepy_engine(config):
    engine = StatefulImpl(config)
    admit = engine.admit

    def slow_admit(request, tokens):
        mark("calling")
        return admit(request, tokens)

    engine.admit = slow_admit
    return engine
"""
LIVENESS = 30.0  # seconds from Ctrl-C to the end: generous, far below the target's sleep
ASLEEP = "600"  # seconds the slow target sleeps where it is interrupted


def interrupted(args: list[str], where: str, tmp_path: Path) -> tuple[str, str]:
    """Run kvhit on the slow target, send Ctrl-C once it sleeps ``where`` (loading or
    calling), and check it ends within LIVENESS with exit 130; its stdout and stderr."""
    (tmp_path / "slow.py").write_text(SLOW)
    marks = tmp_path / "marks"
    marks.mkdir()
    env = {**os.environ, "MARKS": str(marks), where.upper(): ASLEEP}
    # settle: inside the sleep, not on its way there
    code, out, err = ctrl_c_once(args, tmp_path, (marks / where).exists, 0.5, env, LIVENESS)
    assert code == 130, out + err
    assert "Traceback" not in err
    return out, err


@pytest.mark.parametrize(
    ("args", "where"),
    [
        (["gate", "--target", "slow:sleepy", "--jobs", "1"], "loading"),
        (["gate", "--target", "slow:sleepy", "--jobs", "2"], "loading"),
        (["gate", "--target", "slow:sleepy", "--jobs", "1", "--timeout", "900"], "calling"),
        (["fuzz", "--target", "slow:sleepy", "--jobs", "2", "--timeout", "900"], "calling"),
        (["gate", "--stateful", "--target", "slow:sleepy_engine"], "loading"),
        (["fuzz", "--stateful", "--target", "slow:sleepy_engine", "--timeout", "900"], "calling"),
    ],
)
def test_ctrl_c_ends_a_campaign_at_any_point(args: list[str], where: str, tmp_path: Path) -> None:
    out, _ = interrupted([*args, "--out", "found"], where, tmp_path)
    assert re.search(
        r"^slow:sleepy(_engine)?: interrupted after [01] (cases|programs)", out, re.MULTILINE
    ), out


def test_ctrl_c_ends_a_replay_inside_a_call(tmp_path: Path) -> None:
    query = tmp_path / "q.json"
    query.write_text(SEED_MINIMAL.read_text())
    _, err = interrupted(
        ["replay", str(query), "--target", "slow:sleepy", "--timeout", "900"], "calling", tmp_path
    )
    assert err == "interrupted\n"


def test_ctrl_c_in_verify_s_gate_section_is_130(monkeypatch: pytest.MonkeyPatch) -> None:
    def ctrl_c(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "VERIFY_SECTIONS", [("gate", "kvhit.cli.campaign:verify_section")])
    monkeypatch.setattr(CaseChecker, "check", ctrl_c)
    result = CliRunner().invoke(cli.main, ["verify", "--quick"])
    assert result.exit_code == 130 and result.stderr.endswith("interrupted\n")


# Item: output that is not a terminal.


def test_a_piped_campaign_prints_plain_lines(tmp_path: Path) -> None:
    result = kvhit("gate", "--target", "seed-min", "--jobs", "1", "--out", "found", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert lines[0] == "checking: started (a line every 15 s)"
    assert lines[1].startswith("unsafe saved to found/unsafe-")
    assert "\N{BOX DRAWINGS HEAVY HORIZONTAL}" not in result.stdout + result.stderr


def test_a_heartbeat_tells_the_counts_while_a_run_is_long() -> None:
    """Lines come while nothing new is reported (a target loading, a long call)."""
    out = io.StringIO()
    console = Console(file=out, highlight=False, soft_wrap=True)
    with campaign_bar(console, "checking", None, every=0.05) as (tick, done):
        deadline = time.monotonic() + HANG
        while out.getvalue().count("\n") < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        tick(Tally("t", cases=3, counts=Counter({"ok": 3})))
        while "3 cases: ok 3" not in out.getvalue() and time.monotonic() < deadline:
            time.sleep(0.05)
        done(Tally("t", cases=3, counts=Counter({"ok": 3})))
    lines = out.getvalue().splitlines()
    assert lines[0] == "checking: started (a line every 0.05 s)"
    assert re.fullmatch(r"checking: \d+ s, no case yet", lines[1])
    assert re.fullmatch(r"checking: \d+ s, 3 cases: ok 3", lines[-1])


STUCK = """
import signal
import time

from kvhit.model.protocol import parse_query
from kvhit.model.spec import longest_hit
from kvhit.targets.registry import seed_min_target

FOUND = []


def stuck_after_unsafe(query):
    if FOUND:  # shrinking: Ctrl-C can no longer reach this job
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        time.sleep(600)
    answer = seed_min_target(query)
    FOUND.extend([True] * (answer["length"] > longest_hit(parse_query(query)).length))
    return answer
"""


def test_a_job_that_cannot_stop_loses_nothing_it_saved(tmp_path: Path) -> None:
    """A job stuck where Ctrl-C cannot reach it is ended after a grace; what it had
    saved is still reported, drawn and named in the replay hint."""
    (tmp_path / "stuck.py").write_text(STUCK)
    args = ["gate", "--target", "stuck:stuck_after_unsafe", "--jobs", "2", "--timeout", "900"]
    found = unsafe_saved_in(tmp_path / "found")
    # settle: the job is asleep in its next call
    code, out, err = ctrl_c_once([*args, "--out", "found"], tmp_path, found, 1.0, None, LIVENESS)
    assert code == 130, out + err
    (saved,) = (tmp_path / "found").glob("unsafe-*.json")
    assert f"replay with: kvhit replay found/{saved.name}" in out, out
    assert "reference answer L* =" in out and "no disagreement found" not in out
