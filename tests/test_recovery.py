"""Recovery after a failed load (docs/design.md §1.8): pruning, the recovered length,
and the known-wrong rules on concrete states."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.contract import BASE
from kvhit.harness.strategies import queries
from kvhit.model.algorithms import fixed_point
from kvhit.model.protocol import parse_query
from kvhit.model.recovery import (
    WRONG_RECOVERY_RULES,
    full_attention_truncation,
    per_group_truncation_min,
    pruned,
    recovered_length,
    replay_from_zero,
    truncate_at_first_invalid,
)
from kvhit.model.spec import Query, answer_at, fine_query, needed_blocks, valid_all

PROPERTY = settings(max_examples=300, deadline=None)


def query(groups: list[dict[str, Any]], rows: list[Any], m: int, **more: Any) -> Query:
    return parse_query({"groups": groups, "cached": rows, "max_length": m, **more})


FULL = {"kind": "full", "block_size": 1}
WINDOW = {"kind": "sliding_window", "block_size": 1, "window": 2}
MAMBA = {"kind": "mamba", "block_size": 1}

DESIGN_EXAMPLE = query([FULL, WINDOW], ["1111", "0101"], 4)
"""docs/design.md §1.8's worked example: full attention's block 3 is reported invalid."""


def test_the_design_example_recovers_two_tokens() -> None:
    invalid = [[3], []]
    assert fixed_point(DESIGN_EXAMPLE) == 4
    assert pruned(DESIGN_EXAMPLE, invalid).cached == (
        (True, True, True, False),
        (False, True, False, True),
    )
    assert recovered_length(DESIGN_EXAMPLE, invalid) == 2


def test_each_wrong_rule_is_wrong_on_the_design_example() -> None:
    invalid = [[3], []]
    answers = {name: rule(DESIGN_EXAMPLE, invalid) for name, rule in WRONG_RECOVERY_RULES.items()}
    assert answers == {
        "truncate at the first invalid block": 3,
        "per-group truncation, then the min": 3,
        "full attention alone": 3,
        "replay from zero": 0,
    }
    assert all(a != recovered_length(DESIGN_EXAMPLE, invalid) for a in answers.values())


def test_full_attention_cannot_reach_past_a_hole() -> None:
    q = query([FULL], ["1111"], 4)
    assert recovered_length(q, [[1]]) == 1
    assert recovered_length(q, [[0]]) == 0


def test_later_blocks_of_a_window_stay_usable_past_a_hole() -> None:
    """Block 1 of the window is invalid; at L = 4 the window needs block 3 only."""
    q = query([WINDOW], ["1111"], 4)
    assert recovered_length(q, [[1]]) == 4
    assert truncate_at_first_invalid(q, [[1]]) == 1


def test_a_mamba_group_falls_back_to_an_earlier_state() -> None:
    """The state at 4 is invalid; the state at 2 is cached and still valid. Cutting
    at the invalid block (3 tokens) asks for a state at 3 that is not there."""
    q = query([MAMBA], ["0101"], 4)
    assert recovered_length(q, [[3]]) == 2
    assert truncate_at_first_invalid(q, [[3]]) == 3
    assert per_group_truncation_min(q, [[3]]) == 2


def test_per_group_truncation_checks_each_group_but_not_all_at_once() -> None:
    """Each group's own answer is valid for it, the min is not valid for the window."""
    q = query([FULL, WINDOW], ["11", "01"], 2)
    assert per_group_truncation_min(q, [[1], []]) == 1
    assert recovered_length(q, [[1], []]) == 0


def test_full_attention_alone_ignores_the_other_groups_invalid_blocks() -> None:
    q = query([FULL, MAMBA], ["111", "001"], 3)
    assert full_attention_truncation(q, [[], [2]]) == 3
    assert recovered_length(q, [[], [2]]) == 0
    assert full_attention_truncation(query([MAMBA], ["11"], 2), [[1]]) == 1


def test_replay_from_zero_loses_the_valid_prefix() -> None:
    q = query([FULL], ["11"], 2)
    assert replay_from_zero(q, [[1]]) == 0 < recovered_length(q, [[1]]) == 1


def test_a_hash_unit_prunes_every_unit_of_an_invalid_block() -> None:
    q = query([{"kind": "full", "block_size": 4}], [[True, {"upto": 6}]], 7, hash_unit=2)
    assert pruned(q, [[0]]).cached == ((False, False, True, False),)
    assert recovered_length(q, [[1]]) == 4
    assert recovered_length(q, [[]]) == 6


def test_an_invalid_block_is_gone_from_every_tier() -> None:
    q = query(
        [FULL],
        ["10"],
        2,
        tiers=[{"name": "cpu", "holds": ["full"], "cached": {"0": "11"}}],
    )
    assert pruned(q, [[0]]).cached == ((False, True),)
    assert recovered_length(q, [[1]]) == 1
    assert recovered_length(q, [[0]]) == 0


def test_an_index_outside_the_row_names_no_block() -> None:
    q = query([FULL], ["11"], 2)
    assert pruned(q, [[-1, 5]]).cached == q.cached
    assert truncate_at_first_invalid(q, [[-1, 5]]) == 2


def test_invalid_needs_one_entry_per_group() -> None:
    with pytest.raises(ValueError, match="1 entries for 2 groups"):
        pruned(DESIGN_EXAMPLE, [[3]])


@st.composite
def failures(draw: st.DrawFn, capabilities: Any = BASE) -> tuple[Query, list[list[int]]]:
    """A query and, per group, some block indices (one past the row too)."""
    q = draw(queries(max_groups=3, max_blocks=6, capabilities=capabilities))
    invalid = [sorted(draw(st.sets(st.integers(0, len(row)), max_size=3))) for row in q.cached]
    return q, invalid


def brute_recovered(q: Query, invalid: list[list[int]]) -> int:
    """The longest prefix of the pruned query valid for every group, by trying each."""
    rows = pruned(q, invalid)
    return max(L for L in range(0, q.max_length + 1, q.alignment) if valid_all(rows, L))


def intact(q: Query, invalid: list[list[int]], length: int) -> bool:
    """Valid on the query, and no block a group needs at ``length`` is invalid (read
    off the fine query's needed units, not through ``pruned``)."""
    fine = fine_query(q)
    for g, unit, blocks in zip(q.groups, fine.groups, invalid):
        per = g.block_size // unit.block_size
        if any(u // per in blocks for u in needed_blocks(unit, length)):
            return False
    return valid_all(q, length)


@PROPERTY
@given(failures(replace(BASE, tiers=True)))
def test_recovered_length_is_the_longest_pruned_prefix(case: tuple[Query, list[list[int]]]) -> None:
    q, invalid = case
    got = recovered_length(q, invalid)
    assert got == brute_recovered(q, invalid)
    assert got == max(L for L in range(0, q.max_length + 1, q.alignment) if intact(q, invalid, L))
    assert got <= fixed_point(q)


@settings(max_examples=100, deadline=None)
@given(failures(replace(BASE, tiers=True)))
def test_no_invalid_block_recovers_the_hit(case: tuple[Query, list[list[int]]]) -> None:
    q, _ = case
    assert recovered_length(q, [[] for _ in q.groups]) == fixed_point(q)


@PROPERTY
@given(failures(replace(BASE, tiers=True)), st.data())
def test_truncation_at_the_first_invalid_block_is_only_ever_unsafe(
    case: tuple[Query, list[list[int]]], data: st.DataObject
) -> None:
    """The invalid blocks are ones the request loaded (reused at its hit), so cutting
    at the first of them never answers less than the recovered length, whatever else
    is cached: it is unsafe or right."""
    q = case[0]
    loaded = answer_at(q, fixed_point(q)).blocks
    invalid = [
        sorted(data.draw(st.sets(st.sampled_from(b), max_size=2))) if b else [] for b in loaded
    ]
    assert truncate_at_first_invalid(q, invalid) >= recovered_length(q, invalid)


def test_in_place_the_design_example_recovers_nothing() -> None:
    """With only the blocks the request loaded at L0 = 4 (full 0 … 3, the window's
    block 3), the window's block 1 is not there to fall back on."""
    loaded = query([FULL, WINDOW], ["1111", "0001"], 4)
    assert fixed_point(loaded) == 4
    assert recovered_length(loaded, [[3], []]) == 0
    assert truncate_at_first_invalid(loaded, [[3], []]) == 3
