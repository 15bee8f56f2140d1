"""The impl's lookup against vLLM's ``find_longest_cache_hit``, on identical states.

Run in the vLLM environment (scripts/install-vllm.sh):
``VENV/bin/python benchmarks/vllm_side_by_side.py [--repeats N]``.

Each state (:func:`bench_states.bench_states`: a 131,072-token prompt, block size
16, full + sliding window 128 + sliding window 1024, with and without a mamba group,
in three cases) is built once as the impl's pool and once as vLLM's block pool
holding exactly the same cached blocks (:func:`kvhit.adapters.vllm.prepare`). Both
lookups then run in this one process, taking turns; each time is the fastest of N
runs, and the ratio is vLLM time / impl time. The last column times what the impl
prepares for the lookup when a request arrives (besides its block hashes): the plan
of the request's shape (:meth:`kvhit.impl.coordinator.Coordinator.plan_for`).
"""

from __future__ import annotations

import click
import torch
from bench_states import NUM_TOKENS, BenchState, side_by_side

from kvhit.adapters.vllm import prepare


def vllm_lookup(state: BenchState):
    """vLLM's lookup on the state, ready to be timed; and the hit length it finds."""
    coordinator, hashes = prepare(state.query)

    def run():
        return coordinator.find_longest_cache_hit(hashes, state.query.max_length)

    return run, run()[1]


@click.command()
@click.option("--repeats", default=5, show_default=True, help="runs per lookup; the best counts")
@click.option("--tokens", default=NUM_TOKENS, show_default=True, help="prompt length")
def main(repeats: int, tokens: int) -> None:
    """Print the side-by-side table; exit 1 if the two lookups ever disagree."""
    torch.set_num_threads(1)
    if not side_by_side("vLLM", vllm_lookup, tokens, repeats):
        raise SystemExit("the impl and vLLM disagree on a benchmark state")


if __name__ == "__main__":
    main()
