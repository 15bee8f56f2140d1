"""The vLLM targets' declared capabilities are what the installed release does: a query
they allow is built by vLLM without a refusal (no rule missing), one they refuse is
refused before vLLM is called, and a rule is there only where its release has the
feature it reads (kvhit.engines.vllm.release)."""

from __future__ import annotations

import re
from itertools import islice

import pytest
from cases import eagle_queries

from kvhit.contract import EngineConfig
from kvhit.engines.vllm.divergences import documented_release, in_release
from kvhit.engines.vllm.manager import VllmManagerEngine
from kvhit.engines.vllm.options import EaglePath
from kvhit.engines.vllm.release import Asker, manager_capabilities
from kvhit.engines.vllm.target import (
    LOOKUP_CAPABILITIES,
    RELEASE,
    build_coordinator,
    partial_hits_on,
    vllm_lookup,
)
from kvhit.errors import Unsupported
from kvhit.harness.random_cases import random_queries
from kvhit.model.spec import Drafter, Query

CASES = 1500


def drawn() -> list[Query]:
    """Random queries of every kind, drafter and hash unit, and eagle-heavy ones."""
    return [*random_queries(seed=41, count=CASES), *islice(eagle_queries(41), CASES // 3)]


@pytest.mark.parametrize("path", list(EaglePath))
def test_what_the_rules_allow_vllm_builds_and_aligns_as_they_say(path: EaglePath) -> None:
    caps, asker = LOOKUP_CAPABILITIES[path], Asker(RELEASE, path, partial_off_without_unit=True)
    allowed = [q for q in drawn() if caps.allows(q)]
    missed = []
    for q in allowed:
        try:
            coordinator = build_coordinator(q, path)
        except Unsupported as err:
            missed.append((q.to_json(), str(err)))
            continue
        if len(q.groups) > 1:
            assert partial_hits_on(coordinator) == asker.partial_hits(q), q.to_json()
    assert not missed, missed[:3]
    assert len(allowed) > CASES // 10


def test_a_refused_query_is_refused_with_its_rule_before_vllm_is_called() -> None:
    caps = LOOKUP_CAPABILITIES[EaglePath.DEFAULT]
    refused = [q for q in drawn() if not caps.allows(q)]
    assert refused
    for q in refused[:200]:
        with pytest.raises(Unsupported, match=re.escape(caps.refusal(q) or "(no reason)")):
            build_coordinator(q)


def test_what_the_manager_declares_it_builds() -> None:
    caps = manager_capabilities(RELEASE)
    declared = VllmManagerEngine.capabilities
    assert [r.name for r in declared.rules] == [r.name for r in caps.rules]
    assert "one_lookahead" in {r.name for r in caps.rules}
    built = 0
    for q in random_queries(seed=7, count=CASES):
        if not caps.allows(q):
            continue
        VllmManagerEngine(
            EngineConfig(q.groups, 8, q.alignment, q.hash_unit)
        )  # Unsupported: a rule missed
        built += 1
    assert built > CASES // 10


def test_the_drafters_are_the_releases_data() -> None:
    default = vllm_lookup({"eagle": "default"}).capabilities
    drop = vllm_lookup({"eagle": "drop"}).capabilities
    assert (Drafter.LOOKAHEAD in default.drafters) == RELEASE.lookahead_hashes
    assert Drafter.LOOKAHEAD not in drop.drafters
    assert default.hash_units == RELEASE.partial_hash_hits
    names = {r.name for r in default.rules}
    assert ("two_specs" in names) == RELEASE.hybrid_needs_two_specs
    assert ("eagle_everywhere" in names) != RELEASE.group_eagle_flag


def test_a_dev_build_has_the_classes_of_the_newest_release_it_is_not_older_than() -> None:
    assert documented_release("0.35.0.dev12+g0123abc") == "0.34.0"
    assert in_release("0.35.0.dev12+g0123abc") == in_release("0.34.0")
    assert in_release("0.20.0rc1") == in_release("0.19.0") != in_release("0.20.0")
    assert documented_release("0.13.0") is None and in_release("0.13.0") == []
