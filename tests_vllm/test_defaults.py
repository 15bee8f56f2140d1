"""vLLM on its defaults: sub-block hits through partial hash hits, lookahead block
hashes and drafters, each compared with the spec (ok, or a documented divergence), and
refused where the installed release lacks the feature."""

from __future__ import annotations

from dataclasses import replace
from itertools import islice

import pytest
from cases import disagreement, fine_queries, refused

from kvhit.engines.vllm.divergences import documented
from kvhit.engines.vllm.options import EaglePath
from kvhit.engines.vllm.target import RELEASE, build_coordinator, lookup
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Drafter, Query, longest_hit
from kvhit.targets.target_spec import TargetSpec

FULL_MAMBA = [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}]

SUB_BLOCK = {
    "a partial full block found at its fine boundary": {
        "groups": FULL_MAMBA,
        "cached": [[True, {"upto": 6}], [True, {"upto": 6}]],
        "max_length": 7,
        "hash_unit": 2,
    },
    "a Mamba state inside a block, full attention whole": {
        "groups": [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 8}],
        "cached": ["111", [{"upto": 6}]],
        "max_length": 11,
        "hash_unit": 2,
    },
    "an eagle group drops one hash unit": {
        "groups": [{"kind": "full", "block_size": 2, "eagle": True}, FULL_MAMBA[1]],
        "cached": ["1111", [True, {"upto": 6}]],
        "max_length": 7,
        "hash_unit": 2,
    },
}

LOOKAHEAD = {
    "groups": [
        {"kind": "full", "block_size": 2, "drafter": "lookahead", "lookahead": 2},
        {"kind": "mamba", "block_size": 2, "drafter": "lookahead", "lookahead": 2},
    ],
    "cached": ["11111", "11111"],
    "max_length": 9,
    "num_tokens": 10,
}
"""Keys cover the next 2 tokens: the block ending at 8 has one (8 + 2 <= T = 10), so
L* = 8; with T = 9 it has none, and L* = 6."""


def q_of(obj: dict) -> Query:
    """The parsed query."""
    return parse_query(obj)


@pytest.mark.parametrize("name", SUB_BLOCK)
def test_a_sub_block_hit_agrees_with_the_spec(name):
    q = q_of(SUB_BLOCK[name])
    if not RELEASE.partial_hash_hits:
        with pytest.raises(Unsupported, match="declares no hash units"):
            lookup(q)
        return
    found = lookup(q)
    if disagreement(q, found) is None:
        assert found.length % 4  # inside a block
    else:
        assert documented(q, RELEASE.name)  # before 0.32: the eagle margin capped at M


def test_a_query_with_a_hash_unit_is_unsupported_without_partial_hash_hits():
    q = q_of(SUB_BLOCK["a partial full block found at its fine boundary"])
    assert refused(q) is not RELEASE.partial_hash_hits


def test_a_lookahead_drafter_is_driven_through_lookahead_hashes():
    q = q_of(LOOKAHEAD)
    if not RELEASE.lookahead_hashes:
        with pytest.raises(Unsupported, match="declares no lookahead drafters"):
            lookup(q)
        return
    found = lookup(q)
    assert found.length == longest_hit(q).length == 8
    shorter = replace(q, num_tokens=9, max_length=8)  # no key for the block ending at 8
    assert lookup(shorter).length == longest_hit(shorter).length == 6


def test_lookahead_hashes_turn_the_eagle_drop_off():
    if not RELEASE.lookahead_hashes:
        assert refused(q_of(LOOKAHEAD))
        return
    coordinator = build_coordinator(q_of(LOOKAHEAD), EaglePath.DEFAULT)
    assert not any(m.use_eagle for m in coordinator.single_type_managers)


def test_the_drop_path_never_asks_a_lookahead_query_as_another():
    """On the drop path vLLM would answer a lookahead query as the query whose drafter
    drops, which the spec of this one does not judge: it is refused; its drop twin is
    asked as it is, on both paths."""
    q = q_of(
        {
            "groups": [
                {"kind": "full", "block_size": 2, "drafter": "lookahead", "lookahead": 1},
                {"kind": "mamba", "block_size": 2},
            ],
            "cached": ["11110", "1111"],
            "max_length": 9,
            "num_tokens": 10,
        }
    )
    with pytest.raises(Unsupported, match="declares no lookahead drafters"):
        lookup(q, EaglePath.DROP)
    as_drop = replace(q, groups=(replace(q.groups[0], drafter=Drafter.DROP), q.groups[1]))
    assert lookup(as_drop, EaglePath.DROP) == lookup(as_drop, EaglePath.DEFAULT)
    if not documented(as_drop, RELEASE.name):
        assert lookup(as_drop, EaglePath.DROP).length == longest_hit(as_drop).length == 6


def test_a_drafter_on_mamba_is_driven():
    q = q_of(
        {
            "groups": [
                {"kind": "full", "block_size": 2},
                {"kind": "mamba", "block_size": 2, "drafter": "none"},
            ],
            "cached": ["111", "011"],
            "max_length": 6,
        }
    )
    assert disagreement(q, lookup(q)) is None


def test_a_query_with_both_drop_and_lookahead_is_unsupported():
    q = q_of(
        {
            "groups": [
                {"kind": "full", "block_size": 2, "eagle": True},
                {"kind": "mamba", "block_size": 2, "drafter": "lookahead", "lookahead": 1},
            ],
            "cached": ["11", "11"],
            "max_length": 3,
        }
    )
    for path in EaglePath:
        asked = path == EaglePath.DEFAULT and RELEASE.lookahead_hashes
        says = "never both" if asked else "declares no lookahead drafters"
        with pytest.raises(Unsupported, match=says):
            lookup(q, path)


def test_a_lookahead_past_the_scheduler_block_is_refused_by_vllm_itself():
    q = q_of({**LOOKAHEAD, "groups": [{**g, "lookahead": 3} for g in LOOKAHEAD["groups"]]})
    says = "Multi-module MTP" if RELEASE.lookahead_hashes else "declares no lookahead drafters"
    with pytest.raises(Unsupported, match=says):
        lookup(q)


@pytest.mark.parametrize("path", list(EaglePath))
def test_vllm_agrees_with_the_model_on_fine_queries_outside_the_divergences(path):
    """On the drop path, a query with a lookahead drafter asks another query (its
    drafters dropping), so only the others are compared there."""
    checked = 0
    for q in islice(fine_queries(3), 400):
        if documented(q, RELEASE.name) or (
            path == EaglePath.DROP and any(g.drafter == Drafter.LOOKAHEAD for g in q.groups)
        ):
            continue
        try:
            found = lookup(q, path)
        except Unsupported:
            continue
        assert disagreement(q, found) is None, q.to_json()
        checked += 1
    assert checked > 100 if RELEASE.partial_hash_hits else checked == 0


def test_the_drop_path_is_named_in_the_label_and_the_replay_hint():
    spec = TargetSpec("vllm", options=(("eagle", str(EaglePath.DROP)),))
    assert spec.label == "vllm[eagle=drop]"
    assert spec.replay_flag == "--target vllm --option eagle=drop"
    assert TargetSpec("vllm").label == "vllm"
