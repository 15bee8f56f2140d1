"""Per-theorem proof time before and after, side by side in one run.

Runs ``kvhit prove --json --only NAME`` for every registered theorem with two
installations of kvhit, alternately (before, after, before, after ...) so both see
the same machine load, then each whole suite once: before as ``kvhit prove`` ran it
(every theorem, one process), after as it runs now (the default suite on every core;
the deep ones, which the default suite no longer runs, are timed on their own).
Prints wall seconds, CPU seconds (the process and its workers) and the load average.

    python benchmarks/proof_times.py --before /path/to/main/venv/bin/python [--after PY]
        [--default-only] [--no-suites]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time

from kvhit.proofs.registry import all_theorems


def timed(python: str, args: list[str]) -> tuple[float, float, str]:
    """Wall seconds, CPU seconds (user + system of the run and its children) and the
    status of one ``kvhit prove --json`` run (its only theorem's status, or "ok"/"failed")."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    run = subprocess.run(
        [python, "-m", "kvhit.cli", "prove", "--json", *args], capture_output=True, text=True
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    try:
        out = json.loads(run.stdout)
    except json.JSONDecodeError:
        return wall, cpu, f"exit {run.returncode}"
    theorems = out["theorems"]
    status = theorems[0]["status"] if len(theorems) == 1 else ("ok" if out["ok"] else "failed")
    return wall, cpu, status


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", required=True, help="python of the installation before")
    parser.add_argument("--after", default=sys.executable, help="python of the one after")
    parser.add_argument("--no-suites", action="store_true", help="per theorem only")
    parser.add_argument(
        "--default-only", action="store_true", help="skip the deep theorems (minutes each)"
    )
    options = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f}")
    print(f"{'theorem':40} {'before wall':>11} {'cpu':>7} {'after wall':>11} {'cpu':>7}  status")
    totals = [0.0, 0.0, 0.0, 0.0]
    for theorem in all_theorems():
        if theorem.deep and options.default_only:
            continue
        only = ["--only", theorem.name]
        b_wall, b_cpu, b_status = timed(options.before, only)
        a_wall, a_cpu, a_status = timed(options.after, [*only, "--jobs", "1"])
        for i, x in enumerate((b_wall, b_cpu, a_wall, a_cpu)):
            totals[i] += 0 if theorem.deep and i >= 2 else x
        deep = " (deep: not in the default suite)" if theorem.deep else ""
        print(
            f"{theorem.name:40} {b_wall:11.1f} {b_cpu:7.1f} {a_wall:11.1f} {a_cpu:7.1f}"
            f"  {b_status}/{a_status}{deep}",
            flush=True,
        )
    print(f"{'sum (after: default suite only)':40} " + " ".join(f"{x:11.1f}" for x in totals))
    print(f"load average after the theorems: {os.getloadavg()[0]:.1f}")
    if options.no_suites:
        return
    for label, python, args in (
        ("whole suite before: kvhit prove", options.before, []),
        ("whole suite after: kvhit prove", options.after, []),
    ):
        wall, cpu, status = timed(python, args)
        print(f"{label:40} wall {wall:7.1f} s  cpu {cpu:7.1f} s  {status}", flush=True)
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
