"""The built-in target ``impl``: the torch cache's own lookup on a protocol query.

>>> impl_target({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2,
...                          "eagle": False}] * 2,
...              "cached": [[False, True], [True, False]], "max_length": 2,
...              "num_tokens": 3, "alignment": 1})
{'length': 0, 'blocks': [[], []]}
>>> impl_target({"groups": [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
...              "cached": [[True, {"upto": 6}], [True, {"upto": 6}]], "max_length": 7,
...              "num_tokens": 8, "alignment": 2, "hash_unit": 2})
{'length': 6, 'blocks': [[0, 1], [1]]}

A tiered query (docs/design.md §1.7) gets one offload store per tier:

>>> impl_target({"groups": [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 2}],
...              "cached": ["10", "01"], "max_length": 4,
...              "tiers": [{"name": "cpu", "holds": ["full"], "cached": {"0": "01"}}]})
{'length': 4, 'blocks': [[0, 1], [1]]}
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from kvhit.contract import Capabilities, QueryTarget
from kvhit.impl.coordinator import Coordinator
from kvhit.model.spec import Query, fine_query, local_query, tier_rows


def impl_answer(q: Query) -> dict[str, Any]:
    """Build a pool holding exactly the query's cached blocks for a request of
    ``num_tokens`` tokens (with a hash unit, its units: a partially filled block is a
    block cached up to its fine boundary), and an offload store per tier holding its
    rows, then answer with the coordinator's lookup."""
    local = local_query(q)
    coord = Coordinator(q.groups, sum(map(len, q.cached)) + 1, q.alignment, q.hash_unit)
    stores = [coord.add_store(t.name, t.holds, sum(map(len, tier_rows(t)))) for t in q.tiers]
    request = coord.request([0] * q.num_tokens)
    coord.preload(request, fine_query(local).cached)
    for t, store in zip(q.tiers, stores):
        coord.preload(request, fine_query(replace(local, cached=tier_rows(t))).cached, store.slots)
    hit = coord.find_longest_cache_hit(request, q.max_length)
    return {"length": hit.length, "blocks": hit.indices()}


impl_target = QueryTarget(impl_answer, Capabilities(tiers=True))
"""The ``impl`` target."""
