"""Every case source draws only what the target declares (issue 41, "Declared
capabilities"), the gate's fixed phases hold tiered states and Mamba blocks of several
hash units ("Defaults that find what users would hit"), and a tiered disagreement
shrinks in its tiers too ("tiered disagreements shrink")."""

from __future__ import annotations

import json
from collections import Counter
from itertools import islice

import pytest
from hypothesis import HealthCheck, given, settings
from test_stateful import Recorder, open_stateful

from kvhit.analysis import Analysis
from kvhit.contract import BASE, Capabilities, QueryTarget, Rule
from kvhit.harness import corpus, exhaustive
from kvhit.harness.checker import CaseChecker
from kvhit.harness.gate import gate_phases, run_phases
from kvhit.harness.random_cases import palette, random_queries
from kvhit.harness.shrink import candidates, shrink
from kvhit.harness.stateful_machine import Budget, ProgramCampaign, ProgramPlan
from kvhit.harness.strategies import queries
from kvhit.harness.tally import Tally
from kvhit.model.algorithms import WRONG_TIER_COMBINATIONS
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Drafter, Kind, Query, WindowConvention, local_query, longest_hit
from kvhit.targets.runner import CALL_TIMEOUT, CallableRunner
from kvhit.targets.stateful import Program
from kvhit.targets.target_record import TargetRecord

NARROW = Capabilities(
    kinds=[Kind.FULL, Kind.SLIDING_WINDOW],
    drafters=[Drafter.DROP],
    conventions=[WindowConvention.EXCLUSIVE],
    hash_units=False,
)
TIERS = Capabilities(tiers=True)
NO_ODD_LENGTHS = Rule("even M", lambda q: "an odd M" if q.max_length % 2 else None)


# --- the seeded random generator ----------------------------------------------------


def test_random_queries_draw_only_what_the_capabilities_declare() -> None:
    drawn = list(random_queries(4, 2000, capabilities=NARROW))
    assert all(NARROW.allows(q) for q in drawn)
    groups = [g for q in drawn for g in q.groups]
    assert {g.kind for g in groups} == {Kind.FULL, Kind.SLIDING_WINDOW}
    assert {g.drafter for g in groups} == {None, Drafter.DROP}
    assert {g.window_convention for g in groups if g.kind == Kind.SLIDING_WINDOW} == {
        WindowConvention.EXCLUSIVE
    }
    assert not any(q.tiers or q.hash_unit for q in drawn)


def test_tiers_are_drawn_when_the_capabilities_take_them_and_never_otherwise() -> None:
    assert not any(q.tiers for q in random_queries(4, 2000))
    tiered = sum(bool(q.tiers) for q in random_queries(4, 2000, capabilities=TIERS))
    assert 1400 < tiered < 1800  # four in five


def test_kinds_narrow_the_capabilities_further() -> None:
    drawn = list(random_queries(2, 500, kinds=["sliding_window", "eagle"], capabilities=NARROW))
    assert {g.kind for q in drawn for g in q.groups} == {Kind.SLIDING_WINDOW}
    assert any(g.drafter == Drafter.DROP for q in drawn for g in q.groups)
    with pytest.raises(ValueError, match="takes none of the kinds picked"):
        palette(NARROW, ["mamba"])


def test_the_same_seed_and_capabilities_give_the_same_queries() -> None:
    caps = TIERS.with_rules(NO_ODD_LENGTHS)
    first = [q.to_json() for q in random_queries(9, 300, capabilities=caps)]
    assert first == [q.to_json() for q in random_queries(9, 300, capabilities=caps)]
    assert first != [q.to_json() for q in random_queries(9, 300, capabilities=TIERS)]


def test_a_query_the_rules_refuse_is_drawn_again_and_counted_by_reason() -> None:
    redrawn: Counter[str] = Counter()
    caps = BASE.with_rules(NO_ODD_LENGTHS)
    drawn = list(random_queries(1, 1000, capabilities=caps, redrawn=redrawn))
    assert len(drawn) == 1000 and all(q.max_length % 2 == 0 for q in drawn)
    assert set(redrawn) == {"an odd M"} and redrawn["an odd M"] > 200


def test_rules_that_refuse_everything_stop_the_generator() -> None:
    never = BASE.with_rules(Rule("nothing", lambda q: "asks nothing"))
    with pytest.raises(ValueError, match="refused 1000 drawn queries in a row: asks nothing"):
        next(random_queries(1, 1, capabilities=never))


# --- exhaustive scopes and the corpus -------------------------------------------------


def test_the_exhaustive_scopes_skip_what_the_capabilities_refuse() -> None:
    scopes = exhaustive.gate_scopes(capabilities=NARROW.with_rules(NO_ODD_LENGTHS))
    assert scopes and all(NARROW.allows(s.template) for s in scopes)
    assert all(s.template.max_length % 2 == 0 for s in scopes)
    assert len(scopes) < len(exhaustive.gate_scopes())


def test_the_tiered_scopes_separate_every_wrong_tier_combination_at_the_smallest_m() -> None:
    def separated(scopes: list[exhaustive.Scope]) -> set[str]:
        out = set()
        for scope in scopes:
            for q, answer in exhaustive.cases(scope):
                assert answer.length == longest_hit(q).length
                wrong = Analysis(q).wrong_tier_answers
                out |= {name for name, length in wrong.items() if length != answer.length}
                if Analysis(local_query(q)).fixed_point.length != answer.length:
                    out.add("the pool alone")
        return out

    every = {*WRONG_TIER_COMBINATIONS, "the pool alone"}
    assert separated(exhaustive.tiered_scopes()) == every
    assert not separated(exhaustive.tiered_scopes(exhaustive.TIER_MAX_LENGTH - 1))
    assert not any(s.template.tiers for s in exhaustive.gate_scopes())
    tiered = [s for s in exhaustive.gate_scopes(capabilities=TIERS) if s.template.tiers]
    assert tiered == exhaustive.tiered_scopes()


def test_the_tiered_scope_states_are_protocol_queries() -> None:
    for scope in exhaustive.tiered_scopes():
        for code in range(scope.states):
            q = scope.query(code)
            assert parse_query(q.to_json()) == q


def test_the_exhaustive_scopes_hold_a_mamba_block_of_several_hash_units() -> None:
    units = [
        g.block_size // s.template.hash_unit
        for s in exhaustive.gate_scopes()
        if s.template.hash_unit is not None
        for g in s.groups
        if g.kind == Kind.MAMBA
    ]
    assert max(units) >= 3


def test_the_corpus_holds_tiered_states_only_for_a_target_that_takes_tiers() -> None:
    assert not any(q.tiers for q in corpus.corpus_queries())
    tiered = [q for q in corpus.corpus_queries(TIERS) if q.tiers]
    assert tiered and all(longest_hit(q) == longest_hit(parse_query(q.to_json())) for q in tiered)
    assert any(Analysis(local_query(q)).fixed_point.length < longest_hit(q).length for q in tiered)
    narrow = list(corpus.corpus_queries(NARROW))
    assert narrow and all(NARROW.allows(q) for q in narrow)


# --- the gate with no random phase catches a target that ignores tiers ---------------


def gate_without_random(target: QueryTarget) -> CaseChecker:
    checker = CaseChecker(
        CallableRunner(target, CALL_TIMEOUT), TargetRecord("target"), stop_at_first=True
    )
    phases = gate_phases(seconds=0, capabilities=target.capabilities)
    run_phases(checker, phases)
    return checker


def test_a_target_answering_the_pool_alone_fails_the_gate_with_no_random_phase() -> None:
    pool_only = QueryTarget(lambda q: Analysis(local_query(q)).fixed_point.length, TIERS)
    checker = gate_without_random(pool_only)
    (found,) = checker.tally.found
    assert found.query.tiers and checker.tally.found_at[0][0] == 0  # the exhaustive phase
    assert checker.tally.by_phase["random"] == 0


@pytest.mark.parametrize("name", WRONG_TIER_COMBINATIONS)
def test_each_wrong_tier_combination_fails_the_gate_with_no_random_phase(name: str) -> None:
    wrong = QueryTarget(lambda q: Analysis(q).wrong_tier_answers[name], TIERS)
    checker = gate_without_random(wrong)
    assert checker.tally.found and checker.tally.by_phase["random"] == 0


# --- Hypothesis strategies and stateful programs ----------------------------------------


def test_the_hypothesis_queries_keep_to_the_capabilities() -> None:
    seen: list[Query] = []

    @settings(max_examples=300, database=None, suppress_health_check=list(HealthCheck))
    @given(queries(capabilities=NARROW.with_rules(NO_ODD_LENGTHS)))
    def collect(q: Query) -> None:
        seen.append(q)

    collect()
    assert all(NARROW.allows(q) and q.max_length % 2 == 0 for q in seen)


def test_the_hypothesis_queries_hold_tiers_when_the_capabilities_take_them() -> None:
    seen: list[Query] = []

    @settings(max_examples=200, database=None, suppress_health_check=list(HealthCheck))
    @given(queries(capabilities=TIERS))
    def collect(q: Query) -> None:
        seen.append(q)

    collect()
    assert any(q.tiers for q in seen)


class Declaring(Recorder):
    """The impl engine, declaring less than it can do: kinds, drafters and conventions
    of :data:`NARROW`, and a rule refusing a first group of blocks of 1 token."""

    capabilities = NARROW.with_rules(
        Rule("b > 1", lambda q: "blocks of 1" if q.groups[0].block_size == 1 else None)
    )


def test_programs_are_drawn_of_the_engines_capabilities() -> None:
    recorder = Declaring(open_stateful("impl"))
    plan = ProgramPlan(steps=4)
    budget, tally = Budget.of(None, 40), Tally("impl", operations=0)
    campaign = ProgramCampaign(recorder, TargetRecord("impl"), plan, budget, tally)
    tally = campaign.run()
    assert tally.cases == 40 and not tally.found
    created = [json.loads(m) for m in recorder.messages if json.loads(m)["op"] == "create"]
    configs = [Program.from_json(c) for c in created]
    groups = [g for p in configs for g in p.groups]
    assert {g.kind for g in groups} <= {Kind.FULL, Kind.SLIDING_WINDOW}
    assert all(g.drafter in (None, Drafter.DROP) for g in groups)
    assert all(g.exclusive for g in groups if g.kind == Kind.SLIDING_WINDOW)
    assert not any(p.hash_unit or p.tiers for p in configs)
    assert all(p.groups[0].block_size > 1 for p in configs)
    assert campaign.tally.withheld["blocks of 1"] > 0


# --- shrinking a tiered disagreement ------------------------------------------------------


def tier_entries(q: Query) -> int:
    return sum(len(row) for t in q.tiers for row in t.cached if row is not None)


def test_a_tiered_disagreement_shrinks_its_tiers_too() -> None:
    def ignored(a: Analysis) -> bool:
        return Analysis(local_query(a.query)).fixed_point.length != a.longest_hit.length

    drawn = (Analysis(q) for q in random_queries(2, None, capabilities=TIERS))
    big = max(islice((a for a in drawn if ignored(a)), 60), key=lambda a: tier_entries(a.query))
    assert tier_entries(big.query) > 20
    small = shrink(big, ignored).query
    assert ignored(Analysis(small)) and len(small.groups) == 1 and len(small.tiers) == 1
    assert tier_entries(small) <= 2


def test_leaving_a_group_out_moves_the_tiers_rows_with_it() -> None:
    q = parse_query(
        {
            "groups": [{"kind": "mamba", "block_size": 1}, {"kind": "full", "block_size": 1}],
            "cached": ["", "1"],
            "max_length": 2,
            "tiers": [{"name": "cpu", "holds": ["full", "mamba"], "cached": {"1": "11"}}],
        }
    )
    alone = [c for c in candidates(q) if len(c.groups) == 1 and c.groups[0].kind == Kind.FULL]
    assert alone and all(c.tiers[0].cached == ((True, True),) for c in alone[:1])
