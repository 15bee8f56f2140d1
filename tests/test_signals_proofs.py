"""Signals of ``kvhit prove`` and the proof section of ``kvhit verify``: Ctrl-C stops
them at once with ``interrupted`` and exit 130, piped output is plain lines with a
heartbeat, a worker that dies is an error. The commands run as real processes, as a
user runs them (no terminal: stdout is a pipe)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kvhit.cli.prove import line
from kvhit.proofs.registry import Status, get
from kvhit.proofs.workers import ProofSettings, Started, Still, prove_all

KVHIT = [sys.executable, "-m", "kvhit.cli"]
SLOW = ["--only", "full_evaluate_once", "--bound", "1000"]
"""A theorem built in seconds whose goals then take z3 minutes: Ctrl-C comes inside z3."""
HANG = 600.0
"""Seconds a run may take to start its workers, or to end, before the test calls it
hung: far above the seconds either takes, on a quiet machine or a busy one."""
LIVENESS = 30.0
"""Seconds from Ctrl-C to the end: under a second on a quiet machine, far below the
minutes the interrupted proof would still take."""


def workers_of(pid: int) -> set[int]:
    """The processes whose parent is ``pid`` (its proof workers)."""
    children = set()
    for status in Path("/proc").glob("[0-9]*/status"):
        try:
            fields = dict(
                row.split(":\t", 1) for row in status.read_text().splitlines() if ":\t" in row
            )
        except OSError:
            continue
        cmdline = status.with_name("cmdline").read_bytes() if status.exists() else b""
        if fields.get("PPid", "").strip() == str(pid) and b"spawn_main" in cmdline:
            children.add(int(status.parent.name))
    return children


def alive(pid: int) -> bool:
    """Whether the process is still running (not gone, not a zombie)."""
    try:
        return " Z " not in Path(f"/proc/{pid}/stat").read_text().split(")", 1)[1][:4]
    except OSError:
        return False


def interrupt(args: list[str], settle: float) -> tuple[subprocess.CompletedProcess[str], float]:
    """Run kvhit with ``args``, send SIGINT ``settle`` seconds after its proof workers
    have started (however long that takes on a busy machine); the finished process and
    how long it took to end after the signal. Its workers must be gone."""
    proc = subprocess.Popen(
        [*KVHIT, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + HANG
    while not (workers := workers_of(proc.pid)):
        assert proc.poll() is None, "the run ended before it could be interrupted"
        assert time.monotonic() < deadline, "no worker process started"
        time.sleep(0.1)
    time.sleep(settle)
    assert proc.poll() is None, "the run ended before it could be interrupted"
    proc.send_signal(signal.SIGINT)
    sent = time.monotonic()
    out, err = proc.communicate(timeout=HANG)
    took = time.monotonic() - sent
    assert not {pid for pid in workers_of(proc.pid) | workers if alive(pid)}, "workers left running"
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), took


def test_ctrl_c_stops_prove_inside_a_long_solver_call() -> None:
    run, took = interrupt(["prove", *SLOW], settle=5)
    assert run.returncode == 130, run.stdout + run.stderr
    assert took < LIVENESS
    assert "interrupted: 0 of 1 theorems finished" in run.stdout
    assert "0 proved" in run.stdout and "proved;" not in run.stdout


def test_ctrl_c_with_json_says_interrupted() -> None:
    run, _ = interrupt(["prove", "--json", *SLOW], settle=5)
    assert run.returncode == 130, run.stderr
    out = json.loads(run.stdout)
    assert out["interrupted"] is True and out["ok"] is False and out["theorems"] == []


def test_ctrl_c_stops_verify_in_its_proof_section() -> None:
    run, took = interrupt(["verify"], settle=2)
    assert run.returncode == 130, run.stdout + run.stderr
    assert took < LIVENESS
    assert "the proof suite" in run.stdout
    assert "interrupted" in run.stdout


def test_piped_prove_prints_a_plain_line_per_theorem() -> None:
    names = ["eagle_spiral", "fixed_point_maximal"]
    run = subprocess.run(
        [*KVHIT, "prove", "--quick", "--only", ",".join(names)],
        capture_output=True,
        text=True,
        timeout=HANG,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    rows = [row for row in run.stdout.splitlines() if row.endswith(" s")]
    assert sorted(row.split(":")[0] for row in rows) == sorted(names)
    for row in rows:
        name, rest = row.split(": ", 1)
        status, reach, seconds = rest.split("; ")[0], rest.split("; ")[1], rest.split("; ")[-1]
        assert status == get(name).expected
        theorem = get(name)
        assert reach == ("unbounded" if not theorem.bounded else f"N={theorem.quick_bound}")
        assert seconds.endswith(" s") and float(seconds[:-2]) >= 0
    assert "┃" not in run.stdout and "…" not in run.stdout
    assert run.stdout.rstrip().endswith("1 proved, 1 refuted as expected, 0 failed, 0 unknown")


def test_a_long_step_gets_a_heartbeat() -> None:
    theorem = get("many_passes")
    events = list(prove_all([theorem], ProofSettings(bound=8), jobs=1, heartbeat=0.2))
    assert events[0] == Started("many_passes")
    assert any(isinstance(e, Still) and e.name == "many_passes" for e in events)
    assert events[-1].status == Status.PROVED


class Dying(ProofSettings):
    """ProofSettings whose worker dies under the theorem (as if a solver crashed)."""

    def run(self, theorem: object) -> object:
        os._exit(3)


def test_a_worker_that_dies_is_an_error_and_the_run_goes_on() -> None:
    theorems = [get("eagle_spiral"), get("single_pass_two_windows")]
    results = [e for e in prove_all(theorems, Dying(), jobs=1) if not isinstance(e, Started)]
    assert [r.name for r in results] == ["eagle_spiral", "single_pass_two_windows"]
    for r in results:
        assert r.status == Status.ERROR and not r.ok
        assert "worker process died (exit code 3)" in r.detail
    assert line(results[0], False).startswith("eagle_spiral: error (expected refuted); N=5")
