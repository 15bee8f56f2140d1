"""Each documented divergence still happens, on its own example, as documented."""

from __future__ import annotations

import pytest
from cases import disagreement

from kvhit.adapters.vllm import lookup
from kvhit.adapters.vllm_divergences import DIVERGENCES, documented


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=lambda d: d.name)
def test_vllm_still_answers_as_documented(divergence):
    found = lookup(divergence.query)
    assert (found.length, found.blocks) == (divergence.vllm_length, divergence.vllm_blocks)


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=lambda d: d.name)
def test_the_example_has_the_documented_verdict(divergence):
    assert disagreement(divergence.query, lookup(divergence.query)) == divergence.verdict


@pytest.mark.parametrize("divergence", DIVERGENCES, ids=lambda d: d.name)
def test_the_example_belongs_to_its_own_class_only(divergence):
    scopes = {d.name for d in DIVERGENCES if d.scope is divergence.scope}
    assert set(documented(divergence.query)) == scopes
