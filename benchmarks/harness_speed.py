"""How fast the harness checks cases: per call for the model and impl targets, and the
exhaustive mode's vectorized reference over every state of 3 groups x 8 blocks.

Run: ``python benchmarks/harness_speed.py [--cases N] [--threads T]``.
All rows come from one run, so their ratios compare like with like. A per-call row
is the whole loop: building the query, calling the target, L* and the judgement.
The exhaustive row is the reference side alone (L* of every state, by one mask test
per candidate); a per-call target checked on those states runs at its own row's rate.

One torch thread by default: each mask test is a single pass over memory, and on a
machine shared with other jobs a second thread costs more than it brings.
"""

from __future__ import annotations

import time

import click
import torch
from rich.console import Console
from rich.table import Table

from kvhit.harness import exhaustive
from kvhit.harness.checker import CaseChecker, Phase
from kvhit.harness.gate import exhaustive_cases, random_cases
from kvhit.harness.random_cases import CHOICES
from kvhit.model.spec import Group
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec

BIG_SCOPE = exhaustive.Scope.of(
    (Group("full", 1), Group("sliding_window", 1, window=3), Group("mamba", 1)), max_length=8
)


def per_call_rate(target: str, phase: Phase) -> tuple[int, float]:
    """Cases checked and seconds taken for one phase on a built-in target."""
    checker = CaseChecker(TargetSpec(target).open(), TargetRecord(target))
    start = time.perf_counter()
    checker.run(phase)
    seconds = time.perf_counter() - start
    tally = checker.tally
    if tally.disagreements:
        raise SystemExit(f"{target} disagrees with the reference: {tally.counts}")
    return tally.cases, seconds


def vectorized_rate(scope: exhaustive.Scope) -> tuple[int, float]:
    """States and seconds for L* of every state of ``scope``, batch by batch."""
    start = time.perf_counter()
    for first in range(0, scope.states, exhaustive.STATES_PER_BATCH):
        codes = torch.arange(first, min(first + exhaustive.STATES_PER_BATCH, scope.states))
        exhaustive.reference_lengths(scope, codes)
    return scope.states, time.perf_counter() - start


@click.command()
@click.option("--cases", default=3000, show_default=True, help="random cases per target")
@click.option("--threads", default=1, show_default=True, help="torch intra-op threads")
def main(cases: int, threads: int) -> None:
    """Print the speed table."""
    torch.set_num_threads(threads)
    rows = [
        (
            "model, random queries",
            *per_call_rate("model", Phase("r", random_cases(0, 8, CHOICES), None, cases)),
        ),
        ("model, exhaustive gate scopes", *per_call_rate("model", Phase("e", exhaustive_cases()))),
        (
            "impl, random queries",
            *per_call_rate("impl", Phase("r", random_cases(0, 8, CHOICES), None, cases)),
        ),
        ("impl, exhaustive gate scopes", *per_call_rate("impl", Phase("e", exhaustive_cases()))),
        (
            f"vectorized L*, 3 groups x 8 blocks (2^{BIG_SCOPE.states.bit_length() - 1})",
            *vectorized_rate(BIG_SCOPE),
        ),
    ]
    fastest_call = max(n / s for _, n, s in rows[:-1])
    table = Table(title=f"harness speed (torch threads: {threads})")
    for column in ("mode", "cases", "seconds", "cases/s", "vs fastest per-call row"):
        table.add_column(column, justify="left" if column == "mode" else "right")
    for label, n, seconds in rows:
        rate = n / seconds
        table.add_row(
            label, f"{n:,}", f"{seconds:.2f}", f"{rate:,.0f}", f"{rate / fastest_call:.2f}x"
        )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
