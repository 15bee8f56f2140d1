"""Where a campaign's time goes: one job of ``kvhit fuzz``, profiled, by whose code runs.

Run: ``python benchmarks/campaign_profile.py [--target vllm] [--cases N]`` (the vLLM
target in the vLLM environment). The campaign runs in this process, as one job does,
under :mod:`cProfile`; every function's own time (not its callees') is given to the
part of the code it belongs to:

- *the target*: the engine under test (vLLM's modules, or kvhit's impl);
- *adapter*: kvhit's code that builds the engine's state for each query (for vLLM:
  its coordinator, block pool and cached blocks);
- *reference*: the model (L*, validity, the finders) that judges each answer;
- *harness*: drawing queries, calling the target, judging, counting, shrinking;
- *torch*.

Time in code of none of these (Python's builtins and library, pydantic, ...) counts
for the part of its main caller; *the rest* is what no such caller explains.

Left out: starting Python and importing the target (see ``jobs_speedup.py``'s
start-up column). Profiling slows small functions more than large ones, so the shares
are a guide, not a measurement of the unprofiled run.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import time
from collections import Counter
from functools import partial
from pathlib import Path
from types import ModuleType

import click
from rich.console import Console
from rich.table import Table

import kvhit
import kvhit.adapters
import kvhit.harness
import kvhit.impl
import kvhit.model
from kvhit.harness.gate import random_phases
from kvhit.harness.jobs import Campaign, run_job
from kvhit.harness.random_cases import CHOICES


def folder(module: ModuleType) -> str:
    """The folder a package's files are in (kvhit's folders map to ``kvhit.*``)."""
    return str(Path(module.__file__ or "").parent) + os.sep


PARTS = (
    ("/vllm/", "the target (vLLM)"),
    (folder(kvhit.impl), "the target (impl)"),
    (folder(kvhit.adapters), "adapter"),
    (folder(kvhit.model), "reference"),
    (folder(kvhit.harness), "harness"),
    (folder(kvhit), "harness"),
    ("/torch/", "torch"),
)


def part_of(filename: str) -> str:
    """The part of the code a profiled function's file belongs to."""
    return next((part for marker, part in PARTS if marker in filename), "the rest")


def owner(func: tuple, stats: dict, seen: set) -> str:
    """The part a profiled function's own time counts for: its file's, or for code of
    no part, that of the caller it spent the most time under."""
    part = part_of(func[0])
    callers = stats[func][4]
    if part != "the rest" or func in seen or not callers:
        return part
    seen.add(func)
    caller = max(callers, key=lambda c: callers[c][2])
    return owner(caller, stats, seen) if caller in stats else part


def profile(target: str, cases: int) -> tuple[float, Counter[str]]:
    """Seconds of one job's ``cases`` random cases, unprofiled, and the profiled own
    time of each part."""
    phases = partial(random_phases, 0, 8, CHOICES, None, cases)
    campaign = Campaign(target, None, 60.0, phases)
    start = time.perf_counter()
    run_job(campaign, 0, 1, lambda _: None)
    seconds = time.perf_counter() - start
    profiler = cProfile.Profile()
    profiler.runcall(run_job, campaign, 0, 1, lambda _: None)
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    shares: Counter[str] = Counter()
    for func, (_, _, own, _, _) in stats.items():
        shares[owner(func, stats, set())] += own
    return seconds, shares


@click.command()
@click.option("--target", default="impl", show_default=True)
@click.option("--cases", default=5000, show_default=True, help="random cases")
def main(target: str, cases: int) -> None:
    """Print each part's share of one job's time."""
    seconds, shares = profile(target, cases)
    total = sum(shares.values())
    table = Table(title=f"fuzz --target {target} --cases {cases:,}, one job: {seconds:.2f} s")
    for column in ("part", "share of the profiled time", "per case (µs, profiled)"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part, own in shares.most_common():
        table.add_row(part, f"{own / total:.0%}", f"{own / cases * 1e6:,.0f}")
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
