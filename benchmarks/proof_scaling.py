"""Proof time of the finder contracts against the bound, per finder.

For each finder (b=2, A=4) it times the unrolled proof (the model's scan unrolled over
N symbolic blocks, z3) at N = 16, 32, 64, 128, and the unbounded proof (loop invariant,
any number of blocks) once. Prints a table and writes docs/proof-scaling.png.

    python benchmarks/proof_scaling.py [--timeout S] [--bounds 16,32,64,128]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from kvhit.model.spec import Drafter  # noqa: E402
from kvhit.proofs.runner import z3_check  # noqa: E402
from kvhit.proofs.theorems.contracts import CONTRACT_FINDERS, unbounded_goals, unrolled_goals  # noqa: E402

B, A = 2, 4


def seconds(goals, timeout: float) -> float | None:
    """Wall time to prove every goal, or None if one is not proved within the timeout."""
    start = time.perf_counter()
    for goal in goals:
        status, _ = z3_check(goal, timeout)
        if status != "unsat":
            return None
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timeout", type=float, default=60.0)
    parser.add_argument("--bounds", default="16,32,64,128")
    parser.add_argument(
        "--out", default=str(Path(__file__).parent.parent / "docs/proof-scaling.png")
    )
    args = parser.parse_args()
    bounds = [int(x) for x in args.bounds.split(",")]

    def cell(t: float | None) -> str:
        return f">{args.timeout:.0f}" if t is None else f"{t:.2f}"

    header = ["finder (b=2, A=4)", *[f"N={n} s" for n in bounds], "unbounded s"]
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header), flush=True)
    rows = []
    for finder in CONTRACT_FINDERS:
        if finder.drafter == Drafter.LOOKAHEAD:
            continue  # no unrolled proof: their frame's T - La clamp is a symbolic bound
        times = [seconds(unrolled_goals(finder, B, A, n), args.timeout) for n in bounds]
        unbounded = seconds(unbounded_goals(finder, B, A), args.timeout)
        rows.append((finder.label, times, unbounded))
        row = [finder.label, *map(cell, times), cell(unbounded)]
        print("| " + " | ".join(row) + " |", flush=True)

    fig, ax = plt.subplots(figsize=(7, 4))
    for label, times, _unbounded in rows:
        shown = [(n, t if t is not None else args.timeout) for n, t in zip(bounds, times)]
        ax.plot([n for n, _ in shown], [t for _, t in shown], marker="o", label=label)
    ax.axhline(args.timeout, color="grey", linestyle=":", linewidth=1)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bound N (blocks per row)")
    ax.set_ylabel("seconds to prove (z3); dotted: timeout")
    ax.set_title("Finder contract, bounded proof time vs bound")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(args.out, dpi=120)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
