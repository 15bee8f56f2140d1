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
"""

from __future__ import annotations

from typing import Any

from kvhit.impl.coordinator import Coordinator
from kvhit.model.spec import Query, fine_query
from kvhit.targets.wire import QueryTarget


def impl_answer(q: Query) -> dict[str, Any]:
    """Build a pool holding exactly the query's cached blocks for a request of
    ``num_tokens`` tokens (with a hash unit, its units: a partially filled block is a
    block cached up to its fine boundary), then answer with the coordinator's lookup."""
    coord = Coordinator(q.groups, sum(map(len, q.cached)) + 1, q.alignment, q.hash_unit)
    request = coord.request([0] * q.num_tokens)
    coord.preload(request, fine_query(q).cached)
    hit = coord.find_longest_cache_hit(request, q.max_length)
    return {"length": hit.length, "blocks": hit.indices()}


impl_target = QueryTarget(impl_answer)
"""The ``impl`` target."""
