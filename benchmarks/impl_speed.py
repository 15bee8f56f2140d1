"""The impl's vectorized lookup against the model's plain-Python finders.

Run: ``python benchmarks/impl_speed.py [--repeats N]``. Every state is
built once (:func:`bench_states.bench_states`) and both lookups run on it in the
same process, taking turns; each time is the fastest of N runs. The ratio is model
time / impl time. The last column times what the impl prepares for the
lookup when a request arrives (besides its block hashes): the plan of the request's
shape (:meth:`kvhit.impl.coordinator.Coordinator.plan_for`).

The lookup is a handful of tensor operations on a few thousand elements, so it runs
with one intra-op thread: on a loaded machine, waking a second thread can cost more
than the whole lookup.
"""

from __future__ import annotations

from collections.abc import Callable

import click
import torch
from bench_states import NUM_TOKENS, BenchState, side_by_side


def model_lookup(state: BenchState) -> tuple[Callable[[], int], int]:
    """The model's plain-Python fixed point on the state, and the hit length it finds."""
    return state.model_lookup, state.model_lookup()


@click.command()
@click.option("--repeats", default=5, show_default=True, help="runs per lookup; the best counts")
@click.option("--tokens", default=NUM_TOKENS, show_default=True, help="prompt length")
def main(repeats: int, tokens: int) -> None:
    """Print the speed table; exit 1 if the two lookups ever disagree."""
    torch.set_num_threads(1)
    if not side_by_side("model", model_lookup, tokens, repeats):
        raise SystemExit("the impl and the model disagree on a benchmark state")


if __name__ == "__main__":
    main()
