"""The reference algorithms over all groups (docs/design.md §2).

- :func:`fixed_point` — the correct one (vLLM's): start at the longest candidate and
  let every group's finder lower L in turn until a whole pass changes nothing.
- :func:`brute_force` — try every candidate from the top: the spec itself.
- :func:`min_of_groups` — the rejected PR: each group's hit from the top, take the
  min. Only ever too long (unsafe), never too short.
- :func:`single_pass` — the fixed point without the repeat; also wrong.

The seed's minimal counterexample (two window-2 groups, b = 1, M = 2):

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
    ...                  "cached": ["01", "10"], "max_length": 2})
    >>> per_group(q), min_of_groups(q), fixed_point(q), brute_force(q)
    ([2, 1], 1, 0, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvhit.model.finders import find
from kvhit.model.ops import PY, Ops
from kvhit.model.spec import Query, longest_hit

Finder = Callable[[Any], Any]


def group_finders(q: Query, ops: Ops = PY) -> list[Finder]:
    """Each group's finder m -> f_g(m), in group order."""
    return [
        lambda m, g=g, row=row: find(g, row, m, q.alignment, q.num_tokens, ops)
        for g, row in zip(q.groups, q.cached)
    ]


def top_length(q: Query, ops: Ops = PY) -> Any:
    """The longest candidate, floor(M/A)·A."""
    return ops.div(q.max_length, q.alignment) * q.alignment


def max_passes(q: Query, ops: Ops = PY) -> Any:
    """floor(M/A) + 1: a pass that changes L lowers it by at least A."""
    return ops.div(q.max_length, q.alignment) + 1


def fixed_point_of(finders: Sequence[Finder], top: Any, passes: Any, ops: Ops = PY) -> Any:
    """Lower L through every finder in turn until a whole pass leaves it unchanged.

    ``passes`` bounds the number of passes; a pass over a fixed point changes
    nothing, so running extra passes is harmless.
    """
    length = top
    for _ in ops.passes(passes):
        before = length
        for f in finders:
            length = f(length)
        if ops.settled(before, length):
            break
    return length


def fixed_point(q: Query, ops: Ops = PY) -> Any:
    """The fixed-point algorithm over the query's groups."""
    return fixed_point_of(group_finders(q, ops), top_length(q, ops), max_passes(q, ops), ops)


def single_pass(q: Query, ops: Ops = PY) -> Any:
    """One pass of the fixed point, no repeat (known wrong)."""
    return fixed_point_of(group_finders(q, ops), top_length(q, ops), 1, ops)


def per_group(q: Query, ops: Ops = PY) -> list[Any]:
    """Each group's own finder result from the longest candidate."""
    top = top_length(q, ops)
    return [f(top) for f in group_finders(q, ops)]


def min_of_groups(q: Query, ops: Ops = PY) -> Any:
    """The min of the per-group hits (the rejected PR; known wrong)."""
    hits = per_group(q, ops)
    out = hits[0]
    for h in hits[1:]:
        out = ops.min(out, h)
    return out


def brute_force(q: Query) -> int:
    """L* by trying every candidate from the top."""
    return longest_hit(q).length
