"""Each documented divergence of the installed release still happens, on its own
example, as documented; those of other releases do not."""

from __future__ import annotations

import pytest
from cases import disagreement, try_lookup

from kvhit.engines.vllm.divergences import DIVERGENCES, documented, in_release
from kvhit.engines.vllm.target import RELEASE, lookup

HERE = in_release(RELEASE.name)
ELSEWHERE = [d for d in DIVERGENCES if d not in HERE]


def name(divergence) -> str:
    """A test id: the divergence and the releases that have it."""
    return f"{divergence.name} ({divergence.first} … {divergence.last})"


def test_the_installed_release_has_documented_divergences():
    assert HERE, f"vLLM {RELEASE.name} is outside every documented release range"


@pytest.mark.parametrize("divergence", HERE, ids=name)
def test_vllm_still_answers_as_documented(divergence):
    found = lookup(divergence.query)
    assert (found.length, found.blocks) == (divergence.vllm_length, divergence.vllm_blocks)


@pytest.mark.parametrize("divergence", HERE, ids=name)
def test_the_example_has_the_documented_verdict(divergence):
    assert disagreement(divergence.query, lookup(divergence.query)) == divergence.verdict


@pytest.mark.parametrize("divergence", ELSEWHERE, ids=name)
def test_a_divergence_of_other_releases_answers_otherwise_here(divergence):
    found = try_lookup(divergence.query)
    documented_answer = (divergence.vllm_length, divergence.vllm_blocks)
    assert found is None or (found.length, found.blocks) != documented_answer


@pytest.mark.parametrize("divergence", HERE, ids=name)
def test_the_example_belongs_to_its_own_class_only(divergence):
    scopes = {d.name for d in HERE if d.scope is divergence.scope}
    assert set(documented(divergence.query, RELEASE.name)) == scopes
