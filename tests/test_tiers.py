"""External tiers (docs/design.md §1.7): the protocol, the held rows, the engine's
plan at a hit, the known-wrong combinations, and how targets and the command line
take tiered queries."""

import json
import random
import subprocess

import pytest
from click.testing import CliRunner

from kvhit.analysis import Analysis
from kvhit.cli.main import main
from kvhit.contract import Capabilities, QueryTarget
from kvhit.errors import Unsupported
from kvhit.harness.random_cases import palette, random_queries, random_query
from kvhit.harness.stateful import run_program
from kvhit.model.algorithms import (
    WRONG_TIER_COMBINATIONS,
    brute_force,
    fixed_point,
    max_of_groups,
)
from kvhit.model.protocol import QueryError, parse_query
from kvhit.model.spec import LOCAL, held_query, local_query, longest_hit, valid_all
from kvhit.model.tiers import hit_plan
from kvhit.targets.registry import get
from kvhit.targets.runner import CommandRunner, Reply
from kvhit.targets.stateful import Program

FULL_MAMBA = {
    "groups": [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 2}],
    "cached": ["1000", "0001"],
    "max_length": 8,
}

TIERS = Capabilities(tiers=True)
"""A target that takes tiers: its random queries hold them four times in five."""


def tiered(*tiers):
    return parse_query({**FULL_MAMBA, "tiers": list(tiers)})


def test_a_block_held_by_a_tier_counts_and_the_pool_alone_does_not():
    q = tiered({"name": "lmcache", "holds": ["full"], "cached": {"0": "0111"}})
    assert longest_hit(q).length == 8
    assert longest_hit(local_query(q)).length == 0
    assert held_query(q).cached == ((True, True, True, True), (False, False, False, True))


def test_the_plan_takes_each_block_from_the_pool_first_then_the_first_tier_holding_it():
    q = tiered(
        {"name": "a", "holds": ["full"], "cached": {"0": "0100"}},
        {"name": "b", "holds": ["full", "mamba"], "cached": {"0": "0110", "1": "001"}},
    )
    work = hit_plan(q, 6)
    assert [(x.group, x.block, x.source) for x in work.loads] == [
        (0, 0, LOCAL),
        (0, 1, "a"),
        (0, 2, "b"),
        (1, 2, "b"),
    ]
    assert work.recompute == range(6, 9) and valid_all(q, 6)


def test_a_plan_at_an_invalid_length_is_refused():
    q = tiered({"name": "a", "holds": ["full"], "cached": {"0": "01"}})
    with pytest.raises(ValueError, match="not valid"):
        hit_plan(q, 6)


@pytest.mark.parametrize(
    ("tier", "field"),
    [
        ({"name": "x", "holds": ["full"], "cached": {"2": "1"}}, "tiers[0].cached.2"),
        ({"name": "x", "holds": ["full"], "cached": {"1": "1"}}, "tiers[0].cached.1"),
        ({"name": "local", "holds": ["full"], "cached": {}}, "tiers[0].name"),
        ({"name": "x", "holds": ["attention"], "cached": {}}, "tiers[0].holds"),
        ({"name": "x", "holds": [], "cached": {}}, "tiers[0].holds"),
        ({"name": "x", "holds": ["full", "mamba", "full"], "cached": {}}, "tiers[0].holds[2]"),
        ({"name": "x", "holds": ["full"], "cached": ["1"]}, "tiers[0].cached"),
        ({"name": "x", "holds": ["full"], "cached": {}, "size": 3}, "tiers[0].size"),
    ],
)
def test_a_malformed_tier_names_its_field(tier, field):
    with pytest.raises(QueryError) as err:
        tiered(tier)
    assert err.value.field == field


def test_two_tiers_with_one_name_are_refused():
    t = {"name": "x", "holds": ["full"], "cached": {}}
    with pytest.raises(QueryError, match="names an earlier tier"):
        tiered(t, t)


def test_tiered_queries_round_trip_through_json():
    for q in random_queries(3, 300, capabilities=TIERS):
        assert parse_query(json.loads(json.dumps(q.to_json()))) == q


def test_the_fixed_point_is_the_longest_valid_hit_on_tiered_queries():
    drawn = [q for q in random_queries(5, 1500, capabilities=TIERS) if q.tiers]
    assert len(drawn) > 1000
    for q in drawn:
        assert fixed_point(q) == brute_force(q) == Analysis(q).fixed_point.length


def test_each_wrong_combination_is_only_ever_too_long_and_sometimes_is():
    too_long = dict.fromkeys(WRONG_TIER_COMBINATIONS, 0)
    rng = random.Random(7)
    for _ in range(2000):
        q = random_query(rng, drawn=palette(TIERS))
        best = brute_force(q)
        for name, wrong in WRONG_TIER_COMBINATIONS.items():
            got = wrong(q)
            assert got >= best, (name, q)
            too_long[name] += got > best
    assert all(too_long.values()), too_long


def test_max_of_groups_takes_the_surviving_mamba_state_past_evicted_attention():
    q = parse_query({**FULL_MAMBA, "cached": ["1000", "0001"]})
    assert max_of_groups(q) == 8 and brute_force(q) == 0


def test_a_target_that_reads_its_pool_only_is_unsupported_on_tiers_and_the_model_answers():
    q = tiered({"name": "lmcache", "holds": ["full"], "cached": {"0": "0111"}})
    assert get("model")(q.to_json())["length"] == 8
    with pytest.raises(Unsupported, match="lmcache"):
        QueryTarget(lambda q: {"length": 0}).ask(q)


def test_check_draws_the_tiers_and_says_where_each_block_is_loaded_from(tmp_path):
    path = tmp_path / "q.json"
    q = {**FULL_MAMBA, "tiers": [{"name": "lmcache", "holds": ["full"], "cached": {"0": "0111"}}]}
    path.write_text(json.dumps(q))
    out = CliRunner().invoke(main, ["check", str(path)])
    assert out.exit_code == 0, out.output
    assert "\n  lmcache            . @ @ @\n" in out.output
    assert "group 0: block 0 from local, blocks 1, 2, 3 from lmcache" in out.output


@pytest.mark.parametrize(
    ("tier", "said"),
    [
        ({"name": "x", "holds": ["full"], "cached": {"5": "1"}}, "tiers[0].cached.5: no group 5"),
        (
            {"name": "x", "holds": ["full", "full"], "cached": {}},
            "tiers[0].holds[1]: names full a second time",
        ),
    ],
)
def test_check_refuses_a_malformed_tier_in_one_line(tmp_path, tier, said):
    path = tmp_path / "q.json"
    path.write_text(json.dumps({**FULL_MAMBA, "tiers": [tier]}))
    out = subprocess.run(["kvhit", "check", str(path)], capture_output=True, text=True)
    assert out.returncode == 2
    assert out.stderr.strip().count("\n") == 0
    assert said in out.stderr


# --- stateful engines with external stores ----------------------------------------

STORED = {
    "groups": [{"kind": "full", "block_size": 2}],
    "num_blocks": 4,
    "tiers": [{"name": "cpu", "holds": ["full"], "num_blocks": 2}],
}


class scripted:  # noqa: N801 (used as the runner it builds)
    """An engine of one store answering its admits and snapshots in turn with these
    answer lines, read back as a ``--target-cmd`` program's are."""

    def __init__(self, answers, snapshots):
        self.replies = {"admit": iter(answers), "snapshot": iter(snapshots)}

    def __call__(self, message):
        op = message.to_json()["op"]
        value = next(self.replies[op]) if op in self.replies else {}
        return CommandRunner.decoded(message, Reply("answer", value))

    def close(self):
        pass


def stored_program(*prompts):
    ops = [{"op": "admit", "request": i, "tokens": list(t)} for i, t in enumerate(prompts)]
    return Program.from_json({**STORED, "ops": ops})


def snapshot(local, tier):
    return {"cached": [local], "tiers": [{"name": "cpu", "holds": ["full"], "cached": {"0": tier}}]}


FIRST = {"length": 0, "reused": [[]], "tables": [[0, 1]], "moves": []}
# r1 evicts r0's block 0 to slot 0 of the store, then restores it into block 2
MOVES = [["spill", 0, [0, 0]], ["restore", [0, 0], 2]]
RESTORED = {"length": 2, "reused": [[2]], "tables": [[2, 3]], "moves": MOVES}


def test_a_block_restored_from_what_was_spilled_holds_the_request_tokens():
    steps = run_program(
        scripted([FIRST, RESTORED], [snapshot([], []), snapshot([], [True])]),
        stored_program((1, 2, 3), (1, 2, 4)),
    )
    assert [s.outcome.cls for s in steps] == ["ok", "ok"]
    assert steps[1].snapshot is not None and steps[1].snapshot.tiers[0].name == "cpu"


def test_a_block_restored_from_a_slot_nothing_was_spilled_to_is_stale():
    restored = {**RESTORED, "moves": MOVES[1:]}
    steps = run_program(
        scripted([FIRST, restored], [snapshot([], []), snapshot([], [True])]),
        stored_program((1, 2, 3), (1, 2, 4)),
    )
    assert steps[1].outcome.cls == "unsafe"
    assert steps[1].outcome.reason.startswith("stale block: group 0 block 0 is physical block 2")


def test_a_restore_of_other_tokens_is_stale():
    steps = run_program(
        scripted([FIRST, RESTORED], [snapshot([], []), snapshot([], [True])]),
        stored_program((1, 2, 3), (5, 6, 4)),
    )
    assert steps[1].outcome.cls == "unsafe"


@pytest.mark.parametrize(
    ("move", "why"),
    [
        (["spill", 0, [1, 0]], "names tier 1; the engine has 1"),
        (["copy", 0, [0, 0]], "a move is"),
        (["restore", 0, [0, 0]], "names a block id and a [tier, slot]"),
    ],
)
def test_a_malformed_move_is_a_bad_return(move, why):
    answer = {**FIRST, "moves": [move]}
    steps = run_program(scripted([answer], [snapshot([], [])]), stored_program((1, 2, 3)))
    assert steps[0].outcome.cls == "bad_return" and why in steps[0].outcome.reason


def test_a_snapshot_without_the_stores_is_a_bad_return():
    steps = run_program(scripted([FIRST], [{"cached": [[]]}]), stored_program((1, 2, 3)))
    assert steps[0].outcome.cls == "bad_return" and "tiers" in steps[0].outcome.reason


@pytest.mark.parametrize(
    ("store", "field"),
    [
        ({"name": "local", "holds": ["full"], "num_blocks": 2}, "tiers[0].name"),
        ({"name": "cpu", "holds": ["gpu"], "num_blocks": 2}, "tiers[0].holds"),
        ({"name": "cpu", "holds": ["full", "full"], "num_blocks": 2}, "tiers[0].holds[1]"),
        ({"name": "cpu", "holds": ["full"], "num_blocks": 0}, "tiers[0].num_blocks"),
        ({"name": "cpu", "holds": ["full"]}, "tiers[0]"),
    ],
)
def test_a_malformed_store_names_its_field(store, field):
    with pytest.raises(QueryError) as err:
        Program.from_json({**STORED, "tiers": [store]})
    assert err.value.field == field


def test_a_program_with_stores_round_trips_and_tells_the_engine_of_them():
    p = stored_program((1, 2, 3))
    assert Program.from_json(p.to_json()) == p
    assert p.config().to_json()["tiers"] == STORED["tiers"]


def test_the_stateful_impl_passes_a_campaign_of_engines_with_stores(tmp_path):
    out = CliRunner().invoke(
        main,
        [
            "gate",
            "--target",
            "impl",
            "--stateful",
            "--seconds",
            "6",
            "--json",
            "--out",
            str(tmp_path),
        ],
    )
    assert out.exit_code == 0, out.output


def test_the_reference_answers_each_wrong_combination_as_the_model_does():
    for q in random_queries(9, 1500, capabilities=TIERS):
        model = {name: wrong(q) for name, wrong in WRONG_TIER_COMBINATIONS.items()}
        assert Analysis(q).wrong_tier_answers == model, q


def test_check_answers_the_wrong_combinations_at_a_huge_max_length():
    q = parse_query({**FULL_MAMBA, "max_length": 10**12})
    out = CliRunner().invoke(main, ["check", "-"], input=json.dumps(q.to_json()))
    assert out.exit_code == 0, out.output
    assert "max of groups answered 8 (unsafe)" in out.output
