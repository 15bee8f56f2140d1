"""Which of vLLM's three outputs depend on the order of the groups."""

from __future__ import annotations

import random

import pytest
from cases import mixed_queries, reordered, try_lookup

from kvhit.engines.vllm.divergences import DIVERGENCES, documented, eagle_windows
from kvhit.engines.vllm.target import RELEASE, lookup
from kvhit.model.protocol import parse_query


def test_length_and_blocks_do_not_depend_on_group_order_outside_the_divergences():
    rng = random.Random(7)
    compared = 0
    for q in mixed_queries(seed=7, count=1500):
        if len(q.groups) < 2 or documented(q, RELEASE.name):
            continue
        order = rng.sample(range(len(q.groups)), len(q.groups))
        first, second = try_lookup(q), try_lookup(reordered(q, order))
        if first is None:
            continue
        assert second.length == first.length
        assert second.blocks == [first.blocks[i] for i in order]
        compared += 1
    assert compared > 300


UNSAFE_EAGLE = [d for d in DIVERGENCES if d.scope is eagle_windows and d.verdict == "unsafe"]


@pytest.mark.parametrize("divergence", UNSAFE_EAGLE, ids=lambda d: d.name)
def test_the_unsafe_eagle_answer_depends_on_group_order_in_the_releases_that_have_it(divergence):
    swapped = reordered(divergence.query, [1, 0])
    differ = lookup(divergence.query).length != lookup(swapped).length
    assert differ == divergence.in_release(RELEASE.name)


def test_the_uncached_common_prefix_depends_on_group_order():
    q = parse_query(
        {
            "groups": [
                {"kind": "sliding_window", "block_size": 1, "window": 2},
                {"kind": "chunked_local", "block_size": 1, "chunk": 1},
            ],
            "cached": ["0", "0"],
            "max_length": 1,
        }
    )
    assert not documented(q)
    first, second = lookup(q), lookup(reordered(q, [1, 0]))
    assert (first.length, first.blocks) == (second.length, second.blocks[::-1])
    if first.uncached_common_prefix is None:  # a release that does not return it
        assert second.uncached_common_prefix is None
    else:
        assert first.uncached_common_prefix != second.uncached_common_prefix
