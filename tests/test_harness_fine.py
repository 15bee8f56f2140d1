"""The harness on hash units, partially filled blocks and drafters of every behaviour:
the generators, the exhaustive scopes, the corpus, the shrinker, the drawings."""

from __future__ import annotations

import json
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import find

from kvhit.analysis import Analysis, Verdict
from kvhit.draw import draw, explain
from kvhit.harness import corpus, exhaustive
from kvhit.harness.checker import CaseChecker, Phase
from kvhit.harness.compare import judge_reply
from kvhit.harness.random_cases import Choice, choices, random_queries
from kvhit.harness.shrink import shrink
from kvhit.harness.strategies import queries
from kvhit.model.protocol import parse_query
from kvhit.model.spec import (
    DRAFTERS,
    Answer,
    Drafter,
    Group,
    Kind,
    Query,
    Upto,
    fine_row,
    longest_hit,
)
from kvhit.targets.runner import Reply
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.target_spec import TargetSpec


def partial(q: Query) -> bool:
    return any(isinstance(e, Upto) for row in q.cached for e in row)


def drafters(q: Query) -> set[tuple[Kind, Drafter | None]]:
    return {(g.kind, g.drafter) for g in q.groups}


def test_random_queries_draw_hash_units_partial_blocks_and_every_drafter() -> None:
    drawn = list(random_queries(2, 3000))
    assert all(parse_query(json.loads(json.dumps(q.to_json()))) == q for q in drawn)
    fine = [q for q in drawn if q.hash_unit is not None]
    assert 0.15 < len(fine) / len(drawn) < 0.35
    assert all(g.block_size % q.hash_unit == 0 for q in fine for g in q.groups)
    assert all(any(g.block_size > q.hash_unit for g in q.groups) for q in fine)
    assert sum(map(partial, fine)) > len(fine) / 3
    seen = set().union(*map(drafters, drawn))
    assert seen >= {(k, d) for k in Kind for d in DRAFTERS[k]}
    lookaheads = {g.lookahead for q in drawn for g in q.groups if g.drafter == Drafter.LOOKAHEAD}
    assert {0, 1, 2, 3} <= lookaheads
    # A hit inside a block is L* of some of them.
    assert any(longest_hit(q).length % max(g.block_size for g in q.groups) for q in fine)


@pytest.mark.parametrize(
    ("picked", "units", "allowed"),
    [
        (["full", "mamba"], False, {None}),
        (["full", "mamba", "eagle"], False, {None, Drafter.DROP}),
        (["mamba", "drafter"], False, {None, Drafter.NONE, Drafter.LOOKAHEAD}),
        (["full", "hash_unit"], True, {None}),
    ],
)
def test_the_choices_say_what_is_drawn(picked: list[str], units: bool, allowed: set) -> None:
    drawn = list(random_queries(1, 600, kinds=choices(picked)))
    assert any(q.hash_unit for q in drawn) == units
    assert {g.drafter for q in drawn for g in q.groups} == allowed


def test_the_hypothesis_queries_draw_them_too() -> None:
    q = find(queries(), lambda q: partial(q) and any(g.drafter for g in q.groups))
    assert q.hash_unit is not None
    # shrinks towards none of it
    plain = find(queries(kinds=[Choice.FULL, Choice.HASH_UNIT]), lambda q: True)
    assert plain.hash_unit is None


def test_a_unit_scope_enumerates_every_level_of_every_block() -> None:
    scope = exhaustive.Scope.of((Group(Kind.MAMBA, 4), Group(Kind.FULL, 2)), 7, hash_unit=2)
    assert scope.blocks() == [2, 3] and scope.units() == [2, 1]
    assert scope.states == 3**2 * 2**3
    rows = {scope.query(code).cached[0] for code in range(scope.states)}
    assert len(rows) == 9 and (Upto(2), Upto(6)) in rows and (True, False) in rows
    for code in range(0, scope.states, 7):
        q = scope.query(code)
        lengths = exhaustive.reference_lengths(scope, exhaustive.torch.tensor([code]))
        assert int(lengths[0]) == longest_hit(q).length
        fine = scope.fine_codes(exhaustive.torch.tensor([code]))
        bits = [b for g, row in zip(q.groups, q.cached) for b in fine_row(g, row, 2)]
        assert int(fine[0]) == sum(bit << i for i, bit in enumerate(bits))


def test_the_gate_scopes_hold_drafters_and_hash_units() -> None:
    scopes = exhaustive.gate_scopes()
    groups = {g for s in scopes for g in s.groups}
    assert {g.drafter for g in groups} == {None, *Drafter}
    fine = [s for s in scopes if s.template.hash_unit is not None]
    assert fine and {g.kind for s in fine for g in s.groups} == set(Kind)


def test_the_corpus_holds_partial_blocks_at_every_fine_boundary() -> None:
    unit = list(corpus.unit_queries())
    assert all(parse_query(q.to_json()) == q for q in unit[::50])
    ends = {e.end for q in unit for e in q.cached[0] if isinstance(e, Upto)}
    assert ends >= {1, 3, 5, 2, 6}
    assert any(g.drafter == Drafter.LOOKAHEAD for g in corpus.boundary_groups())
    lengths = {longest_hit(q).length % q.groups[0].block_size for q in unit}
    assert lengths == {0, 1, 2}  # a hit inside a block of 2 (h = 1) and of 4 (h = 2)


def ignores_drafters(query: dict[str, Any]) -> dict[str, Any]:
    """A target that reads every group as if it had no drafter (wrong with lookahead)."""
    q = parse_query(query)
    bare = replace(q, groups=tuple(replace(g, drafter=None, lookahead=0) for g in q.groups))
    return Analysis(bare).fixed_point.to_json()


def test_shrinking_drops_the_unit_partial_blocks_and_shortens_lookahead() -> None:
    q = parse_query(
        {
            "groups": [
                {"kind": "full", "block_size": 4, "drafter": "lookahead", "lookahead": 5},
                {"kind": "mamba", "block_size": 4, "drafter": "none"},
                {"kind": "sliding_window", "block_size": 2, "window": 5},
            ],
            "cached": [[True, True, {"upto": 10}], [{"upto": 2}, True, True], "11111"],
            "max_length": 10,
            "num_tokens": 12,
            "hash_unit": 2,
        }
    )

    def unsafe(c: Analysis) -> bool:
        reply = Reply("answer", ignores_drafters(c.query.to_json()))
        return judge_reply(c, reply).cls == Verdict.UNSAFE

    assert unsafe(Analysis(q))
    shrunk = shrink(Analysis(q), unsafe)
    small = shrunk.query
    assert unsafe(shrunk) and small.hash_unit is None and not partial(small)
    (g,) = small.groups
    assert g.drafter == Drafter.LOOKAHEAD and g.lookahead <= 2 and small.max_length <= 2


def test_shrinking_keeps_a_hash_unit_the_failure_needs() -> None:
    def inside_a_block(c: Analysis) -> bool:
        return c.longest_hit.length % c.query.groups[0].block_size != 0

    q = next(q for q in random_queries(3, 2000) if q.hash_unit and inside_a_block(Analysis(q)))
    small = shrink(Analysis(q), inside_a_block).query
    assert small.hash_unit is not None and len(small.groups) == 1
    assert small.max_length <= 2 * small.groups[0].block_size


def test_a_checker_on_the_min_of_groups_finds_it_on_fine_queries() -> None:
    fine = (q for q in random_queries(6, None) if q.hash_unit is not None)
    checker = CaseChecker(TargetSpec("seed-min").open(), TargetRecord("seed-min"))
    checker.run(Phase("fine", ((q, None) for q in fine), limit=3000))
    (found,) = checker.tally.found
    assert found.cls == "unsafe" and len(found.query.groups) <= 2
    model = CaseChecker(TargetSpec("model").open(), TargetRecord("model"))
    model.run(Phase("fine", ((q, None) for q in random_queries(6, 2000))))
    assert not model.tally.found


def test_drawing_a_fine_query_shows_units_blocks_and_drafters() -> None:
    q = parse_query(
        {
            "groups": [
                {"kind": "full", "block_size": 4, "drafter": "drop"},
                {"kind": "sliding_window", "block_size": 2, "window": 3, "drafter": "none"},
            ],
            "cached": [[True, {"upto": 6}], [True, False, True]],
            "max_length": 6,
            "hash_unit": 1,
        }
    )
    lines = draw(q, Answer(6, ((0, 1), (2,)))).splitlines()
    assert lines[0] == "query: M=6 A=1 h=1"
    assert lines[1].endswith("eagle                        @ @ @ @ | @ @ . . | . . . .")
    assert lines[2].endswith("drafter=none   # # | . . | @ @")
    assert explain(Analysis(q), 6) == "group 0 needs unit 6 at L=6, not cached"  # the eagle's drop
    assert explain(Analysis(q), 4) == "group 1 needs units 2, 3 at L=4, not cached"


def test_a_scope_too_wide_for_one_word_asks_the_spec() -> None:
    scope = exhaustive.Scope.of((Group(Kind.FULL, 128),), 200, hash_unit=1)
    assert scope.states == 129**2  # 256 fine bits: no int64 holds them
    codes = [0, 5, 128, 129 + 60, 129**2 - 1]
    lengths = exhaustive.reference_lengths(scope, exhaustive.torch.tensor(codes))
    assert lengths.tolist() == [0, 5, 128, 60, 200]
