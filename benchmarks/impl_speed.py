"""The impl's vectorized lookup against the model's plain-Python finders.

Run: ``python benchmarks/impl_speed.py [--repeats N]``. Every state is
built once (:func:`kvhit.impl.bench.bench_states`) and both lookups run on it in the
same process, taking turns; each time is the fastest of N runs. The ratio is model
time / impl time. The last column times what the impl prepares for the
lookup when a request arrives (besides its block hashes): the plan of the request's
shape (:meth:`kvhit.impl.coordinator.Coordinator.plan_for`).

The lookup is a handful of tensor operations on a few thousand elements, so it runs
with one intra-op thread: on a loaded machine, waking a second thread can cost more
than the whole lookup.
"""

from __future__ import annotations

import click
import torch
from rich.console import Console
from rich.table import Table

from kvhit.impl.bench import BLOCK_SIZE, NUM_TOKENS, bench_states, best_times


@click.command()
@click.option("--repeats", default=5, show_default=True, help="runs per lookup; the best counts")
@click.option("--tokens", default=NUM_TOKENS, show_default=True, help="prompt length")
def main(repeats: int, tokens: int) -> None:
    """Print the speed table; exit 1 if the two lookups ever disagree."""
    torch.set_num_threads(1)
    table = Table(title=f"lookup on a {tokens:,}-token prompt, block size {BLOCK_SIZE}")
    columns = ("groups", "case", "L*", "impl (ms)", "model (ms)", "model / impl")
    for column in columns + ("impl plan, at arrival (ms)",):
        table.add_column(column, justify="left" if column in ("groups", "case") else "right")
    agree = True
    for with_mamba in (False, True):
        label = "full + sw128 + sw1024" + (" + mamba" if with_mamba else "")
        for state in bench_states(tokens, with_mamba):
            length = state.impl_lookup().length
            agree &= length == state.model_lookup()
            runs = (state.impl_lookup, state.model_lookup, state.impl_plan)
            impl, model, plan = best_times(runs, repeats)
            table.add_row(
                label,
                state.name,
                f"{length:,}",
                f"{impl * 1e3:.2f}",
                f"{model * 1e3:.1f}",
                f"{model / impl:.0f}x",
                f"{plan * 1e3:.2f}",
            )
    Console(width=150).print(table)
    if not agree:
        raise SystemExit("the impl and the model disagree on a benchmark state")


if __name__ == "__main__":
    main()
