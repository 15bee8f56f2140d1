"""What one request costs from arrival to hit: the impl against vLLM, in one run.

Run in the vLLM environment (scripts/install-vllm.sh):
``VENV/bin/python benchmarks/request_cost.py [--repeats N] [--tokens 8192,32768]``.

Every row is one prompt of random token ids (a Python list, as an engine holds it),
block size 16, fully cached in both engines' pools, looked up with M = T - 1:

- *impl arrival*: :meth:`~kvhit.impl.coordinator.Coordinator.request`: the block
  hashes of every block size, the lookup keys, and the plan of the request's shape,
  built fresh (the plan cache is cleared first: nearly every real request has a length
  not seen before).
- *impl lookup*: :meth:`~kvhit.impl.coordinator.Coordinator.find_longest_cache_hit`.
- *vLLM arrival*: vLLM's own request block hasher (``get_request_block_hasher`` with
  its default ``sha256``) over the request.
- *vLLM lookup*: vLLM's ``find_longest_cache_hit`` on the coordinator holding the same
  cached blocks.
- *floor*: the essential work done as tightly as this machine does it in Python: one
  pass over the tokens cutting them into blocks (``zip``), one exact membership test
  per block (a set of the blocks' token tuples), and one gather from a table per
  group for the lookup.
- *impl plan*: the part of the impl's arrival that is the lookup's plan; "lookup
  with plan" adds it to the lookup, for the ratio of the lookups alone.

Before the timings each row freezes the heap built so far (``gc.collect()`` then
``gc.freeze()``), as vLLM's engine core does after start-up (``freeze_gc_heap`` in
``vllm/v1/engine/core.py``): the garbage collector then scans only what the request
itself allocates, not the pools and prompts of the set-up.

Left out on both sides: allocating and caching blocks after the hit, and whatever the
scheduler does around the lookup. Each time is the fastest of N runs, the engines
taking turns; ratios are vLLM time / impl time within the row.
"""

from __future__ import annotations

import gc
import random
from array import array
from types import SimpleNamespace

import click
import torch
from bench_states import best_times
from rich.console import Console
from rich.table import Table
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher

from kvhit.engines.vllm.target import build_coordinator, mark_cached
from kvhit.impl.coordinator import Coordinator, lookup_plan
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group

BLOCK = 16
TOKENS = (8192, 32768, 131072, 1 << 20)
KINDS = (
    Group("full", BLOCK),
    Group("sliding_window", BLOCK, window=128),
    Group("sliding_window", BLOCK, window=1024),
    Group("sliding_window", BLOCK, window=4096),
)


def groups_of(count: int) -> list[Group]:
    """``count`` groups: full, sw128, sw1024, sw4096, then again from the start."""
    return [KINDS[i % len(KINDS)] for i in range(count)]


def vllm_request(tokens: list[int]) -> SimpleNamespace:
    """What vLLM's block hasher reads of a request (no LoRA, media, salt or embeds)."""
    return SimpleNamespace(
        block_hashes=[],
        num_tokens=len(tokens),
        _all_token_ids=tokens,
        all_token_ids=tokens,
        mm_features=[],
        lora_request=None,
        cache_salt=None,
        prompt_embeds=None,
    )


def floor_run(tokens: list[int], known: set[tuple[int, ...]], table: torch.Tensor) -> None:
    """The essential work: cut the tokens into blocks, test each block against
    ``known``, then one gather of ``table`` per group (its rows)."""
    hits = array("q", [block in known for block in zip(*[iter(tokens)] * BLOCK)])
    ids = torch.frombuffer(hits, dtype=torch.int64)
    for row in table:
        row.index_select(0, ids)


def row(tokens: list[int], count: int, repeats: int) -> list[str]:
    """Time one prompt on ``count`` groups; the table row."""
    groups = groups_of(count)
    num_blocks = len(tokens) // BLOCK
    coord = Coordinator(groups, count * num_blocks + 1)
    request = coord.request(tokens)
    coord.preload(request, [[True] * num_blocks for _ in groups])
    query = parse_query(coord.snapshot(request))

    coordinator = build_coordinator(query)
    hasher = get_request_block_hasher(coordinator.block_pool.hash_block_size, sha256)
    hashes = hasher(vllm_request(tokens))
    mark_cached(coordinator, query, hashes)
    top = len(tokens) - 1

    def impl_arrival() -> None:
        lookup_plan.cache_clear()
        coord.free(coord.request(tokens))

    def impl_plan() -> None:
        lookup_plan.cache_clear()
        coord.plan_for(len(tokens), top)

    known = set(zip(*[iter(tokens)] * BLOCK))
    table = torch.zeros(count, 2, dtype=torch.int64)

    mine = coord.find_longest_cache_hit(request, top).length
    theirs = coordinator.find_longest_cache_hit(hashes, top)[1]
    if mine != theirs:
        raise SystemExit(f"{len(tokens)} tokens, {count} groups: impl {mine}, vLLM {theirs}")
    gc.collect()
    gc.freeze()
    arrive, plan, look, v_arrive, v_look, floor = best_times(
        (
            impl_arrival,
            impl_plan,
            lambda: coord.find_longest_cache_hit(request, top),
            lambda: hasher(vllm_request(tokens)),
            lambda: coordinator.find_longest_cache_hit(hashes, top),
            lambda: floor_run(tokens, known, table),
        ),
        repeats,
    )
    gc.unfreeze()
    times = (arrive, plan, look, arrive + look, v_arrive, v_look, v_arrive + v_look, floor)
    return [
        f"{len(tokens):,}",
        str(count),
        *(f"{t * 1e3:.2f}" for t in times),
        f"{(v_arrive + v_look) / (arrive + look):.1f}x",
        f"{v_look / (look + plan):.1f}x",
        f"{(v_arrive + v_look) / floor:.1f}x",
        f"{(arrive + look) / floor:.1f}x",
    ]


@click.command()
@click.option("--repeats", default=5, show_default=True, help="runs per timing; the best counts")
@click.option("--tokens", default=",".join(map(str, TOKENS)), show_default=True)
@click.option("--groups", default="2,4,8", show_default=True, help="group counts")
def main(repeats: int, tokens: str, groups: str) -> None:
    """Print the table; exit 1 if the impl and vLLM ever find different hits."""
    torch.set_num_threads(1)
    rng = random.Random(0)
    table = Table(title=f"one request, arrival to hit (block size {BLOCK}, all cached, ms)")
    columns = (
        "tokens",
        "groups",
        "impl arrival",
        "of which plan",
        "impl lookup",
        "impl total",
        "vLLM arrival",
        "vLLM lookup",
        "vLLM total",
        "floor",
        "total: vLLM / impl",
        "lookup with plan: vLLM / impl",
        "vLLM / floor",
        "impl / floor",
    )
    for column in columns:
        table.add_column(column, justify="right")
    for size in (int(t) for t in tokens.split(",")):
        prompt = [rng.randrange(1 << 17) for _ in range(size)]
        for count in (int(g) for g in groups.split(",")):
            table.add_row(*row(prompt, count, repeats))
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
