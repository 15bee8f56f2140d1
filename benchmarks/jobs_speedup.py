"""What ``--jobs N`` buys: the same fuzz campaign on one job and on N, in one run.

Run: ``python benchmarks/jobs_speedup.py [--cases N] [--jobs N] [--targets impl,model]``
(in the vLLM environment, ``--targets vllm`` too). Each row is the whole campaign as
``kvhit fuzz --cases N`` runs it: forking the jobs, opening the target in each, the
cases (query, call, L*, judgement) and the merge; the two runs check exactly the same
cases. Cases per second per core divides by the jobs used.
"""

from __future__ import annotations

import time
from functools import partial

import click
import torch
from rich.console import Console
from rich.table import Table

from kvhit.harness.gate import random_phases
from kvhit.harness.jobs import Campaign, default_jobs, run_campaign
from kvhit.harness.random_cases import CHOICES


def campaign_seconds(target: str, cases: int, jobs: int) -> float:
    """Seconds for ``cases`` random cases of ``target`` on ``jobs`` jobs."""
    phases = partial(random_phases, 0, 8, CHOICES, None, cases)
    start = time.perf_counter()
    tally = run_campaign(Campaign(target, None, 60.0, phases), jobs)
    seconds = time.perf_counter() - start
    if tally.cases != cases:
        raise SystemExit(f"{target}: {tally.cases} cases checked, {cases} asked")
    return seconds


@click.command()
@click.option("--cases", default=4000, show_default=True, help="random cases per run")
@click.option("--jobs", default=default_jobs(), show_default=True, help="jobs of the split run")
@click.option("--targets", default="model,impl", show_default=True, help="comma-separated")
def main(cases: int, jobs: int, targets: str) -> None:
    """Print the table: one job against ``--jobs`` jobs, per target."""
    torch.set_num_threads(1)
    table = Table(title=f"fuzz --cases {cases:,}: one job against {jobs}")
    columns = ("target", "1 job (s)", f"{jobs} jobs (s)", "speed-up", "cases/s/core, 1 / N")
    for column in columns:
        table.add_column(column, justify="left" if column == "target" else "right")
    for target in targets.split(","):
        one, many = (campaign_seconds(target, cases, n) for n in (1, jobs))
        table.add_row(
            target,
            f"{one:.2f}",
            f"{many:.2f}",
            f"{one / many:.2f}x",
            f"{cases / one:,.0f} / {cases / many / jobs:,.0f}",
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
