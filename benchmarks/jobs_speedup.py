"""What ``--jobs N`` buys: the same ``kvhit fuzz`` campaign on one job and on N, in one run.

Run: ``python benchmarks/jobs_speedup.py [--cases N] [--jobs N] [--targets impl,model]``
(in the vLLM environment, ``--targets vllm`` too). Each row times the command a user
runs, ``kvhit fuzz --target T --cases N --jobs n``, as a fresh process: starting
Python, importing the target in every job, the cases (query, call, L*, judgement),
shrinking and saving the first disagreement of each class, and the merge. Both runs
check exactly the same cases (same seed), which the report's counts confirm. Cases
per second per core divides by the jobs used. *Start-up* is the same command with
``--cases 1``: Python, the imports (vLLM's take seconds) and the jobs' start; the
speed-up of the cases alone leaves it out.
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time

import click
from rich.console import Console
from rich.table import Table

from kvhit.harness.jobs import default_jobs

CLI = [sys.executable, "-c", "from kvhit.cli.main import main; main()"]


def campaign(target: str, cases: int, jobs: int) -> tuple[float, dict]:
    """Seconds for ``kvhit fuzz`` over ``cases`` random cases of ``target`` on ``jobs``
    jobs, and its JSON report."""
    with tempfile.TemporaryDirectory() as out:
        command = ["fuzz", "--target", target, "--cases", str(cases), "--jobs", str(jobs)]
        start = time.perf_counter()
        done = subprocess.run(
            [*CLI, *command, "--out", out, "--json"], capture_output=True, text=True
        )
        seconds = time.perf_counter() - start
    if done.returncode not in (0, 1):
        raise SystemExit(f"{target}, {jobs} jobs: exit {done.returncode}\n{done.stderr}")
    report = json.loads(done.stdout)
    return seconds, report


@click.command()
@click.option("--cases", default=4000, show_default=True, help="random cases per run")
@click.option("--jobs", default=default_jobs(), show_default=True, help="jobs of the split run")
@click.option("--targets", default="model,impl", show_default=True, help="comma-separated")
def main(cases: int, jobs: int, targets: str) -> None:
    """Print the table: one job against ``--jobs`` jobs, per target."""
    table = Table(title=f"fuzz --cases {cases:,}: one job against {jobs}")
    columns = (
        "target",
        "1 job (s)",
        f"{jobs} jobs (s)",
        "speed-up",
        f"start-up, 1 / {jobs} jobs (s)",
        "speed-up of the cases alone",
        "cases/s/core, 1 / N",
    )
    for column in columns:
        table.add_column(column, justify="left" if column == "target" else "right")
    for target in targets.split(","):
        (one, first), (many, split) = (campaign(target, cases, n) for n in (1, jobs))
        if (first["cases"], first["counts"]) != (split["cases"], split["counts"]):
            raise SystemExit(f"{target}: one job and {jobs} jobs checked different cases")
        start_one, start_many = (campaign(target, 1, n)[0] for n in (1, jobs))
        table.add_row(
            target,
            f"{one:.2f}",
            f"{many:.2f}",
            f"{one / many:.2f}x",
            f"{start_one:.2f} / {start_many:.2f}",
            f"{(one - start_one) / (many - start_many):.2f}x",
            f"{cases / one:,.0f} / {cases / many / jobs:,.0f}",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
