"""Each documented divergence of the installed release still happens, on its own
example, as documented; those of other releases do not."""

from __future__ import annotations

import pytest
from cases import disagreement, try_lookup

from kvhit.analysis import Verdict
from kvhit.engines.vllm.divergences import DIVERGENCES, documented, in_release
from kvhit.engines.vllm.target import RELEASE, lookup

HERE = in_release(RELEASE.name)
ELSEWHERE = [d for d in DIVERGENCES if d not in HERE]


def name(divergence) -> str:
    """A test id: the divergence and the releases that have it."""
    return f"{divergence.name} ({divergence.first} … {divergence.last})"


def test_the_installed_release_has_documented_divergences():
    assert HERE, f"vLLM {RELEASE.name} is outside every documented release range"


def reply(divergence) -> tuple[int, list[list[int]]] | str | None:
    """What the installed release gives on the example: its length and blocks, the
    error it raises (type and message), or None where it refuses the configuration."""
    try:
        found = try_lookup(divergence.query)
    except Exception as err:  # a crash: vLLM's own assert or error
        return f"{type(err).__name__}: {err}"
    return None if found is None else (found.length, found.blocks)


def documented_reply(divergence) -> tuple[int, list[list[int]]] | str:
    """What the catalogue says vLLM gives on the example."""
    return divergence.error or (divergence.vllm_length, divergence.vllm_blocks)


@pytest.mark.parametrize("divergence", HERE, ids=name)
def test_vllm_still_answers_as_documented(divergence):
    assert reply(divergence) == documented_reply(divergence)


@pytest.mark.parametrize("divergence", HERE, ids=name)
def test_the_example_has_the_documented_verdict(divergence):
    found = reply(divergence)
    verdict = (
        Verdict.CRASH
        if isinstance(found, str)
        else disagreement(divergence.query, lookup(divergence.query))
    )
    assert verdict == divergence.verdict


@pytest.mark.parametrize("divergence", ELSEWHERE, ids=name)
def test_a_divergence_of_other_releases_answers_otherwise_here(divergence):
    assert reply(divergence) != documented_reply(divergence)


@pytest.mark.parametrize("divergence", HERE, ids=name)
def test_the_example_belongs_to_its_own_class_only(divergence):
    scopes = {d.name for d in HERE if d.scope is divergence.scope}
    assert set(documented(divergence.query, RELEASE.name)) == scopes
