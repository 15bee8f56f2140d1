"""Kinds and reply classes are types: a name that is none of them is an error."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from hypothesis import find

from kvhit.analysis import DISAGREEMENTS, Verdict
from kvhit.cli.main import main
from kvhit.harness.random_cases import Choice, palette, random_queries
from kvhit.harness.strategies import group_configs
from kvhit.model.spec import Group, Kind


def test_a_group_of_no_kind_is_an_error() -> None:
    assert Group("mamba", 1).kind is Kind.MAMBA
    with pytest.raises(ValueError, match="'ful' is not a valid Kind"):
        Group("ful", 1)


@pytest.mark.parametrize("typo", ["ful", "sliding-window", "Mamba"])
def test_a_typo_in_kinds_is_an_error(typo: str) -> None:
    with pytest.raises(ValueError, match=f"unknown kind {typo!r}"):
        next(random_queries(seed=0, count=1, kinds=[typo]))
    with pytest.raises(ValueError, match=f"unknown kind {typo!r}"):
        find(group_configs(palette(picked=[typo])), lambda g: True)
    result = CliRunner().invoke(main, ["fuzz", "--target", "model", "--kinds", f"full,{typo}"])
    assert result.exit_code == 2
    assert f"--kinds: unknown kind {typo!r}; choose from full," in result.stderr


def test_only_the_picked_kinds_are_drawn() -> None:
    drawn = {g.kind for q in random_queries(1, 200, kinds=[Choice.MAMBA]) for g in q.groups}
    assert drawn == {Kind.MAMBA}


def test_verdicts_are_one_type_and_print_as_their_names() -> None:
    assert [v for v in Verdict if v not in DISAGREEMENTS] == [
        Verdict.OK,
        Verdict.UNSUPPORTED,
        Verdict.REJECTED,
    ]
    assert json.dumps({Verdict.LOST_REUSE: 1}) == '{"lost_reuse": 1}'
    assert f"{Verdict.BAD_RETURN}" == "bad_return"


def test_verdicts_are_ordered_worst_first() -> None:
    severities = [v.severity for v in DISAGREEMENTS]
    assert severities == sorted(severities, reverse=True) and min(severities) > 0
    assert DISAGREEMENTS[0] == Verdict.UNSAFE and DISAGREEMENTS[-1] == Verdict.BAD_RETURN
    assert {v.severity for v in Verdict if not v.disagrees} == {0}
