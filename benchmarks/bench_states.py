"""The speed benchmark's cache states, and timers for the lookups on them.

The states (docs/design.md §4): a 131,072-token prompt, block size 16, groups full +
sliding window 128 + sliding window 1024 (and a variant with a mamba group too), in
three cases: everything cached, one full-attention block missing near the end, and
the window-128 group missing every 64th block. :func:`bench_states` builds each one
as a real pool (:meth:`~kvhit.impl.coordinator.Coordinator.preload`) and as the
protocol query of the same state, so any other lookup can be timed side by side.

    >>> state = bench_states(num_tokens=4096)[1]
    >>> state.name, state.impl_lookup().length == state.model_lookup()
    ('miss near the end', True)
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvhit.impl.coordinator import CacheHit, Coordinator, LookupPlan, Request, lookup_plan
from kvhit.model.algorithms import fixed_point
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Query

NUM_TOKENS = 131_072
BLOCK_SIZE = 16
MISS_FROM_END = 8
"""Case (b): the full group misses the block this many blocks before the last."""
HOLE_EVERY = 64
"""Case (c): the window-128 group misses blocks 63, 127, … (every 64th)."""


def bench_groups(with_mamba: bool) -> list[Group]:
    """full + sliding window 128 + sliding window 1024 (+ mamba), block size 16."""
    groups = [
        Group("full", BLOCK_SIZE),
        Group("sliding_window", BLOCK_SIZE, window=128),
        Group("sliding_window", BLOCK_SIZE, window=1024),
    ]
    return groups + [Group("mamba", BLOCK_SIZE)] if with_mamba else groups


def case_rows(case: str, num_groups: int, num_blocks: int) -> list[list[bool]]:
    """The cached bits of each group in one of the three cases."""
    rows = [[True] * num_blocks for _ in range(num_groups)]
    if case == "miss near the end":
        rows[0][num_blocks - 1 - MISS_FROM_END] = False
    if case == "sw missing every 64th block":
        rows[1] = [j % HOLE_EVERY != HOLE_EVERY - 1 for j in range(num_blocks)]
    return rows


CASES = ("all cached", "miss near the end", "sw missing every 64th block")


@dataclass
class BenchState:
    """One benchmark state, both as a pool with a request and as a protocol query."""

    name: str
    with_mamba: bool
    coord: Coordinator
    request: Request
    query: Query

    def impl_lookup(self) -> CacheHit:
        """The torch coordinator's lookup on this state."""
        return self.coord.find_longest_cache_hit(self.request, self.query.max_length)

    def impl_plan(self) -> LookupPlan:
        """What the coordinator prepares for the lookup when the request arrives: the
        plan of its shape (:meth:`~kvhit.impl.coordinator.Coordinator.plan_for`)."""
        lookup_plan.cache_clear()
        return self.coord.plan_for(self.request.num_tokens, self.query.max_length)

    def model_lookup(self) -> int:
        """The model's plain-Python fixed point over its finders on this state."""
        return fixed_point(self.query)


def bench_states(num_tokens: int = NUM_TOKENS, with_mamba: bool = False) -> list[BenchState]:
    """The three cases for one group set, each built as a real pool and a query."""
    groups = bench_groups(with_mamba)
    states = []
    for case in CASES:
        coord = Coordinator(groups, len(groups) * (num_tokens // BLOCK_SIZE) + 1)
        request = coord.request([7] * num_tokens)
        coord.preload(request, case_rows(case, len(groups), num_tokens // BLOCK_SIZE))
        query = parse_query(coord.snapshot(request))
        states.append(BenchState(case, with_mamba, coord, request, query))
    return states


def best_times(runs: Sequence[Callable[[], Any]], repeats: int) -> list[float]:
    """The fastest of ``repeats`` runs of each function, in seconds of this thread's CPU
    time (run torch on one thread).

    CPU time, not wall time: on a machine shared with other jobs, a long run is
    preempted in every repeat while a short one often is not, which would flatter the
    faster side. The functions take turns, one run each per round, so what load still
    does (to caches) falls on all of them alike.
    """
    best = [float("inf")] * len(runs)
    for _ in range(repeats):
        for i, run in enumerate(runs):
            started = time.thread_time()
            run()
            best[i] = min(best[i], time.thread_time() - started)
    return best


Other = Callable[[BenchState], tuple[Callable[[], Any], int]]
"""Prepares another engine's lookup on a state: (a timed run, the hit length it finds)."""


def side_by_side(other_name: str, other: Other, tokens: int, repeats: int) -> bool:
    """Print the impl's lookup against ``other`` on every benchmark state, in one run;
    True when the two always find the same hit length."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"lookup on a {tokens:,}-token prompt, block size {BLOCK_SIZE}")
    columns = ("groups", "case", "L*", "impl (ms)", f"{other_name} (ms)", f"{other_name} / impl")
    for column in (*columns, "impl plan, at arrival (ms)"):
        table.add_column(column, justify="left" if column in ("groups", "case") else "right")
    agree = True
    for with_mamba in (False, True):
        label = "full + sw128 + sw1024" + (" + mamba" if with_mamba else "")
        for state in bench_states(tokens, with_mamba):
            length = state.impl_lookup().length
            run_other, other_length = other(state)
            agree &= length == other_length
            impl, theirs, plan = best_times(
                (state.impl_lookup, run_other, state.impl_plan), repeats
            )
            table.add_row(
                label,
                state.name,
                f"{length:,}",
                f"{impl * 1e3:.2f}",
                f"{theirs * 1e3:.2f}",
                f"{theirs / impl:.1f}x",
                f"{plan * 1e3:.2f}",
            )
    Console(width=150).print(table)
    return agree
