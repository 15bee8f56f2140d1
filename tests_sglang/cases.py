"""Small cache states SGLang's tree can hold, for the SGLang tests."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

from kvhit.model.protocol import parse_query


def bits(n: int) -> Iterator[str]:
    """Every row of n blocks, as a '1'/'0' string."""
    for row in itertools.product("01", repeat=n):
        yield "".join(row)


def query(groups: list[dict[str, Any]], rows: list[str], max_length: int) -> dict[str, Any]:
    """A normalized protocol query."""
    return parse_query({"groups": groups, "cached": rows, "max_length": max_length}).to_json()


def window_queries(convention: str) -> Iterator[dict[str, Any]]:
    """A full group of F blocks and a window group over them: every row of up to 4
    blocks, windows 1 … 3b+1, b = 1 and 2, every M up to one block past the rows."""
    for b in (1, 2):
        for full in range(0, 5):
            for row in bits(full):
                for w in range(1, 3 * b + 2):
                    groups = [
                        {"kind": "full", "block_size": b},
                        {
                            "kind": "sliding_window",
                            "block_size": b,
                            "window": w,
                            "window_convention": convention,
                        },
                    ]
                    for m in range(0, (full + 1) * b + 1):
                        yield query(groups, ["1" * full, row], m)


def mamba_queries() -> Iterator[dict[str, Any]]:
    """A full group of F blocks and a Mamba group whose last state is cached (b = 1)."""
    groups = [{"kind": "full", "block_size": 1}, {"kind": "mamba", "block_size": 1}]
    for full in range(0, 6):
        for row in bits(full):
            if full and row[-1] == "0":
                continue
            for m in range(0, full + 2):
                yield query(groups, ["1" * full, row], m)


def unified_queries() -> Iterator[dict[str, Any]]:
    """Full, sliding window and Mamba in one tree (b = 1 and 2): every window and
    Mamba row of up to 3 blocks (the last state cached), windows of 1 … 2b+1 tokens
    (exclusive), every M up to one block past the rows."""
    for b in (1, 2):
        for full in range(0, 4):
            for window_row, states in itertools.product(bits(full), bits(full)):
                if full and states[-1] == "0":
                    continue
                for w in range(1, 2 * b + 2):
                    groups = [
                        {"kind": "full", "block_size": b},
                        {
                            "kind": "sliding_window",
                            "block_size": b,
                            "window": w,
                            "window_convention": "exclusive",
                        },
                        {"kind": "mamba", "block_size": b},
                    ]
                    for m in range(0, (full + 1) * b + 1):
                        yield query(groups, ["1" * full, window_row, states], m)
