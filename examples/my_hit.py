"""A plausible but wrong hit function, for the README's "gate your own function".

Each group finds its own longest hit, and the answer is the smallest of them: right
for full attention, unsafe for sliding windows, which are not downward closed
(docs/design.md §1.5). ``kvhit gate --target kvhit.examples.my_hit:find_hit`` finds it.

    >>> find_hit({"groups": [{"kind": "full", "block_size": 1, "eagle": False}],
    ...           "cached": [[True, True, False]], "max_length": 3,
    ...           "num_tokens": 4, "alignment": 1})
    2
"""

from __future__ import annotations

import math
from typing import Any

from kvhit.errors import Unsupported


def find_hit(query: dict[str, Any]) -> int:
    """The hit for a normalized query: the min of each group's own longest hit (wrong)."""
    if "hash_unit" in query:
        raise Unsupported("hash units (partially filled blocks) are not handled here")
    step = query["alignment"]
    top = query["max_length"] // step * step
    groups = zip(query["groups"], query["cached"])
    return min((own_hit(group, row, top, step) for group, row in groups), default=top)


def own_hit(group: dict[str, Any], row: list[bool], top: int, step: int) -> int:
    """The longest hit of at most ``top`` tokens this group alone could serve."""
    for length in range(top, 0, -step):
        if all(j < len(row) and row[j] for j in needed_blocks(group, length)):
            return length
    return 0


def needed_blocks(group: dict[str, Any], length: int) -> range:
    """The blocks a full or sliding-window group reads to serve ``length`` tokens.

    >>> needed_blocks({"kind": "sliding_window", "block_size": 1, "window": 2}, 4)
    range(3, 4)
    """
    if group.get("drafter"):
        raise Unsupported("groups with a drafter are not handled here")
    n = length // group["block_size"]
    if group["kind"] == "full":
        return range(n)
    if group["kind"] == "sliding_window":
        exclusive = group.get("window_convention") == "exclusive"
        tokens_back = group["window"] if exclusive else group["window"] - 1
        return range(max(0, n - math.ceil(tokens_back / group["block_size"])), n)
    raise Unsupported(f"{group['kind']} groups are not handled here")
