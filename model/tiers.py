"""What an engine does at a hit assembled across tiers (docs/design.md §1.7).

A tiered query's hit is one length valid for every group over the *held* rows
(:func:`kvhit.model.spec.held_query`). At that length the engine reuses each group's
blocks (:func:`kvhit.model.spec.reused_blocks`): a block the pool holds is taken from
the pool, any other from the first tier, in the query's order, that holds it, and the
tokens from the hit to the end of the request are computed.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 2},
    ...                             {"kind": "mamba", "block_size": 2}],
    ...                  "cached": ["10", "00"], "max_length": 4,
    ...                  "tiers": [{"name": "cpu", "holds": ["full", "mamba"],
    ...                             "cached": {"0": "01", "1": "01"}}]})
    >>> p = hit_plan(q, 4)
    >>> [(x.group, x.block, x.source) for x in p.loads], p.recompute
    ([(0, 0, 'local'), (0, 1, 'cpu'), (1, 1, 'cpu')], range(4, 5))
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from kvhit.model.spec import (
    LOCAL,
    Query,
    fine_query,
    local_query,
    reused_blocks,
    tier_rows,
    valid_all,
)


@dataclass(frozen=True)
class Load:
    """Block ``block`` of group ``group`` (in the query's own blocks) comes from
    ``source``: :data:`~kvhit.model.spec.LOCAL` (the pool) or a tier's name."""

    group: int
    block: int
    source: str


@dataclass(frozen=True)
class HitPlan:
    """What the engine does at a hit of ``length``: the blocks it loads, from where,
    and the tokens it computes (``recompute``, to the end of the request)."""

    length: int
    loads: tuple[Load, ...]
    recompute: range


def hit_plan(q: Query, length: int) -> HitPlan:
    """The engine's work at a valid hit of ``length`` tokens; ValueError when no tier
    holds a block the hit needs. With a hash unit, each unit is taken where it is held,
    so a block may come from two places (one :class:`Load` for each)."""
    if not valid_all(q, length):
        raise ValueError(f"L={length} is not valid: a block it needs is held nowhere")
    places = [(LOCAL, fine_query(local_query(q)).cached)]
    places += [
        (t.name, fine_query(replace(q, cached=tier_rows(t), tiers=())).cached) for t in q.tiers
    ]
    fine = fine_query(local_query(q))
    loads: list[Load] = []
    for i, g in enumerate(fine.groups):
        for j in reused_blocks(g, length):
            source = next(name for name, rows in places if j < len(rows[i]) and rows[i][j])
            load = Load(i, j * g.block_size // q.groups[i].block_size, source)
            if load not in loads:
                loads.append(load)
    return HitPlan(length, tuple(loads), range(length, q.num_tokens))
