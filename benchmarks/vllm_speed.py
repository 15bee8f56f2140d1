"""Cases per second against vLLM, one core: before (a coordinator built for every
query, L* worked out for every reply, each query sent to the target as JSON and parsed
back, SIGALRM's handler set up for every call), now (one coordinator per shape of query,
its pool reset between queries; L* only for a reply holding an answer; the parsed query
handed to the built-in; the handler set up once per phase), and the ceiling (vLLM's
``find_longest_cache_hit`` alone).

Run in the vLLM environment: ``python benchmarks/vllm_speed.py [--cases N] [--rounds R]``.

The cases are the gate's, as ``kvhit matrix`` runs them on each release: the
exhaustive scopes, the solver corpus, then ``--cases`` random queries (seed 0); and,
apart, ``kvhit fuzz``'s random queries alone. Both paths check the same cases in this
process, alternately, ``--rounds`` times, and must count the same classes (else the
script exits 1); each path's best round is shown. The ceiling times only vLLM's lookup
calls, on the same states built outside the clock: the rate a campaign would reach if
everything but the engine under test were free.

Left out: starting Python and importing vLLM (see ``jobs_speedup.py``'s start-up column).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvhit.analysis import Analysis
from kvhit.engines.vllm import target
from kvhit.engines.vllm.options import EaglePath
from kvhit.errors import Unsupported
from kvhit.harness.checker import CaseChecker, Phase
from kvhit.harness.compare import judge_reply
from kvhit.harness.gate import gate_phases, random_phases
from kvhit.harness.random_cases import CHOICES
from kvhit.targets.target_spec import TargetSpec

Campaign = Callable[[], list[Phase]]
NO_TIME_BOUND = 86_400.0


class BeforeChecker(CaseChecker):
    """The checker before: L* worked out for every reply, whatever it holds; the query
    sent as JSON; the alarm handler set up by each call's time limit."""

    def judge(self, a: Analysis) -> tuple[Any, Any]:
        reply = self.runner(a.query.to_json())
        _ = a.longest_hit  # worked out whatever the reply holds
        return judge_reply(a, reply), reply.value

    def run(self, phase: Phase) -> bool:
        self.phase, self.phases_run = phase.name, self.phases_run + 1
        return self.run_cases(phase)


def run(campaign: Campaign, before: bool) -> tuple[float, int, dict[str, int]]:
    """Seconds, cases and counts of one run of ``campaign`` on the path before or now."""
    target.COORDINATORS.kept.clear()
    target.COORDINATORS.size = 0 if before else target.Coordinators.size
    checker_type = BeforeChecker if before else CaseChecker
    checker = checker_type(TargetSpec("vllm", timeout=60.0).open(), "vllm")
    start = time.perf_counter()
    for phase in campaign():
        checker.run(phase)
    seconds = time.perf_counter() - start
    target.COORDINATORS.size = target.Coordinators.size
    return seconds, checker.tally.cases, {str(c): n for c, n in checker.tally.counts.items()}


def lookup_seconds(campaign: Campaign) -> tuple[float, int]:
    """Seconds spent in vLLM's lookup alone over the campaign's cases (each state
    built outside the clock), and the number of cases."""
    path = EaglePath.DEFAULT
    spent, cases = 0.0, 0
    for phase in campaign():
        for q, _ in islice(phase.cases, phase.limit):
            cases += 1
            try:
                coordinator = target.build_coordinator(q, path)
            except Unsupported:
                continue
            hashes = list(
                target.request_hashes(
                    q.num_tokens,
                    coordinator.block_pool.hash_block_size,
                    target.hash_lookahead(q, path),
                )
            )
            target.mark_cached(coordinator, q, hashes)
            start = time.perf_counter()
            try:
                coordinator.find_longest_cache_hit(hashes, q.max_length)
            except Exception:  # vLLM's own crash: its time counts all the same
                pass
            spent += time.perf_counter() - start
    return spent, cases


def measure(name: str, campaign: Campaign, rounds: int, table: Table) -> bool:
    """Add the campaign's rows to ``table``; False if the two paths counted differently."""
    best: dict[bool, float] = {}
    counts: dict[bool, dict[str, int]] = {}
    cases = 0
    for _ in range(rounds):
        for before in (True, False):
            seconds, cases, counts[before] = run(campaign, before)
            best[before] = min(best.get(before, seconds), seconds)
    ceiling, _ = lookup_seconds(campaign)
    rows = [
        ("before: a coordinator per query", best[True]),
        ("now: one per shape, pool reset", best[False]),
        ("ceiling: vLLM's lookup alone", ceiling),
    ]
    for label, seconds in rows:
        speedup = best[True] / seconds
        table.add_row(name, label, f"{seconds:.2f}", f"{cases / seconds:,.0f}", f"{speedup:.1f}×")
    return counts[True] == counts[False]


@click.command()
@click.option("--cases", default=5000, show_default=True, help="random cases after the scopes")
@click.option("--rounds", default=2, show_default=True, help="runs of each path, alternating")
def main(cases: int, rounds: int) -> None:
    """Print cases per second on each path and the ceiling."""
    gate: Campaign = lambda: gate_phases(NO_TIME_BOUND, 0, 8, CHOICES, cases)  # noqa: E731
    fuzz: Campaign = lambda: random_phases(0, 8, CHOICES, None, cases)  # noqa: E731
    table = Table(title=f"vLLM {target.RELEASE.name}: cases per second, one core")
    for column in ("campaign", "path", "seconds", "cases/s", "vs before"):
        table.add_column(column, justify="left" if column in ("campaign", "path") else "right")
    same = [
        measure(f"gate (matrix): scopes, corpus, {cases:,} random", gate, rounds, table),
        measure(f"fuzz: {cases:,} random", fuzz, rounds, table),
    ]
    Console(width=140).print(table)
    if not all(same):
        print("the two paths counted different classes", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
