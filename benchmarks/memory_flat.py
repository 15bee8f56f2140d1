"""Memory over a long workload: the impl's hashing state stays as big as what the cache holds.

Run: ``python benchmarks/memory_flat.py [--requests N] [--pool BLOCKS]``.
Serves N requests through a small pool (full attention + a sliding window of 64,
block size 16): prompts of 64-512 tokens that branch off a few shared roots and end in
fresh random tokens, so nearly every request brings keys never seen before and evicts
others. Every 10% of the run it prints the process's resident memory, the live hash
keys, the largest hash id and the table size; with keys released on eviction, all
four stay flat. Each request is the whole engine path without the model: arrival,
lookup, allocation, caching, dropping skipped blocks and freeing.
"""

from __future__ import annotations

import os
import random

import click
import torch
from rich.console import Console
from rich.table import Table

from kvhit.impl.coordinator import Coordinator
from kvhit.model.spec import Group

GROUPS = [Group("full", 16), Group("sliding_window", 16, window=64)]


def rss_mib() -> float:
    """This process's resident memory, in MiB."""
    with open("/proc/self/statm") as f:
        pages = int(f.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20


def serve(coord: Coordinator, tokens: list[int]) -> None:
    """One request through the coordinator, from arrival to free."""
    request = coord.request(tokens)
    hit = coord.find_longest_cache_hit(request, request.num_tokens - 1)
    coord.allocate(request, hit)
    coord.cache_full_blocks(request)
    coord.drop_skipped(request)
    coord.free(request)


@click.command()
@click.option("--requests", default=100_000, show_default=True)
@click.option("--pool", default=256, show_default=True, help="blocks in the pool")
def main(requests: int, pool: int) -> None:
    """Print memory and hashing state at every tenth of the run."""
    torch.set_num_threads(1)
    rng = random.Random(0)
    roots = [[rng.randrange(50_000) for _ in range(512)] for _ in range(8)]
    coord = Coordinator(GROUPS, pool)
    (hasher,) = coord.hashers.values()
    table = Table(title=f"{requests:,} requests through a pool of {pool} blocks")
    for column in ("requests", "RSS (MiB)", "live keys", "largest id", "table entries"):
        table.add_column(column, justify="right")
    for done in range(1, requests + 1):
        root = rng.choice(roots)
        cut = rng.randrange(0, 448)
        serve(coord, root[:cut] + [rng.randrange(50_000) for _ in range(rng.randint(64, 128))])
        if done % max(1, requests // 10) == 0:
            table.add_row(
                f"{done:,}",
                f"{rss_mib():.1f}",
                f"{len(hasher):,}",
                f"{hasher.bound - 1:,}",
                f"{coord.pool.tables[0].numel():,}",
            )
    Console(width=120).print(table)


if __name__ == "__main__":
    main()
