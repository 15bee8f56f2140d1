"""Outside the documented divergences and refusals, vLLM agrees with the model."""

from __future__ import annotations

import pytest
from cases import disagreement, mixed_queries, refused, try_lookup

from kvhit.analysis import Analysis
from kvhit.draw import draw, judge
from kvhit.engines.vllm.divergences import documented
from kvhit.engines.vllm.target import RELEASE
from kvhit.model.spec import Answer

SEEDS = range(4)
CASES_PER_SOURCE = 1500


@pytest.mark.parametrize("seed", SEEDS)
def test_vllm_agrees_with_the_model_on_undocumented_states(seed):
    checked = 0
    for q in mixed_queries(seed, CASES_PER_SOURCE):
        if documented(q, RELEASE.name):
            continue
        found = try_lookup(q)
        assert (found is None) == refused(q), draw(q)
        if found is None:
            continue
        problem = disagreement(q, found)
        assert problem is None, (
            f"{problem}\n{draw(q, Answer(found.length, tuple(map(tuple, found.blocks))))}\n"
            f"{judge(Analysis(q), 'vLLM', found.length)}"
        )
        checked += 1
    assert checked > CASES_PER_SOURCE // 3  # 0.14.0 refuses half of them (no scheduler_block_size)
