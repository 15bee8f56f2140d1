"""The ``vllm-connector`` target (kvhit.engines.vllm.connector_lookup): vLLM's scheduler and KV
connector path under the installed release, judged against the spec of tiered
queries (docs/design.md §1.7); the classes per path are those docs/findings-vllm.md
("Connectors and divergent hits") gives."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvhit.analysis import Analysis, Verdict
from kvhit.contract import Capabilities
from kvhit.engines.vllm.connector_lookup import PATH, ConnectorPath, connector_answer
from kvhit.engines.vllm.divergences import release_key
from kvhit.engines.vllm.options import DivergentHits
from kvhit.engines.vllm.target import RELEASE, vllm_answer
from kvhit.errors import UndrivableTarget, Unsupported
from kvhit.harness.compare import judge_reply
from kvhit.harness.random_cases import random_queries
from kvhit.harness.stateful import run_program
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Query, local_query, longest_hit
from kvhit.targets.registry import Mode
from kvhit.targets.runner import Reply
from kvhit.targets.stateful import Program
from kvhit.targets.target_spec import TargetSpec

RELEASES_DIR = Path(sys.prefix) / "vllm"
OLDER = sorted(
    (p.name for p in RELEASES_DIR.glob("*") if (p / "vllm").is_dir()),
    key=release_key,
)
BEFORE_PATH = [r for r in OLDER if release_key(r) < release_key("0.24.0")]

HYBRID = [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 2}]


def hybrid(cached: list[str], *tiers: tuple[str, list[str], dict[str, str]]) -> Query:
    """A full attention group and a Mamba group (b = 2, M = 7) with these tiers."""
    spec = [{"name": n, "holds": h, "cached": c} for n, h, c in tiers]
    return parse_query({"groups": HYBRID, "cached": cached, "max_length": 7, "tiers": spec})


def judged(q: Query, divergent: DivergentHits = DivergentHits.AUTO) -> Verdict:
    """The class of the target's reply to ``q``, its connector saying ``divergent``."""
    try:
        reply = Reply("answer", connector_answer(q, divergent))
    except Unsupported as err:
        reply = Reply("unsupported", detail=str(err))
    except AssertionError as err:  # vLLM's own asserts: a crash
        reply = Reply("crash", detail=str(err))
    return judge_reply(Analysis(q), reply).cls


OK, UNSAFE, LOST = Verdict.OK, Verdict.UNSAFE, Verdict.LOST_REUSE
UNSUPPORTED = Verdict.UNSUPPORTED
ALL_PATHS = (
    ConnectorPath.MAX_OF_GROUPS,
    ConnectorPath.FULL_ATTENTION_HIT,
    ConnectorPath.FLAGGED,
)

WITNESSES: dict[str, tuple[Query, dict[tuple[ConnectorPath, DivergentHits], Verdict]]] = {
    # the Mamba state at 6 survived, full attention's blocks 1-2 did not; no tier
    "mamba deeper than full attention": (
        hybrid(["100", "011"]),
        {
            (p, f): UNSAFE if p == ConnectorPath.MAX_OF_GROUPS else OK
            for p in ALL_PATHS
            for f in DivergentHits
        },
    ),
    # a tier of attention KV only extends a hit past the Mamba group's state
    "tier without the lagging group": (
        hybrid(["100", "100"], ("lmcache", ["full"], {"0": "011"})),
        {(p, f): UNSAFE for p in ALL_PATHS for f in DivergentHits},
    ),
    # full attention hits 6 locally, Mamba 2; a tier holds blocks 1-2 and the state at 4
    "diverged local hit, state in a tier": (
        hybrid(["111", "100"], ("host", ["full", "mamba"], {"0": "011", "1": "010"})),
        {
            **{(ConnectorPath.MAX_OF_GROUPS, f): UNSAFE for f in DivergentHits},
            **{(ConnectorPath.FULL_ATTENTION_HIT, f): LOST for f in DivergentHits},
            (ConnectorPath.FLAGGED, DivergentHits.AUTO): LOST,
            (ConnectorPath.FLAGGED, DivergentHits.ON): LOST,
            (ConnectorPath.FLAGGED, DivergentHits.OFF): OK,
        },
    ),
    # a tier completes both groups past full attention's local hit, 4; the reconciled
    # hit is 2, past which the tier lacks block 1
    "tier completing every group": (
        hybrid(["110", "100"], ("host", ["full", "mamba"], {"0": "001", "1": "001"})),
        {
            (p, f): LOST if (p, f) == (ConnectorPath.FLAGGED, DivergentHits.OFF) else OK
            for p in ALL_PATHS
            for f in DivergentHits
        },
    ),
}


@pytest.mark.parametrize("flag", list(DivergentHits))
@pytest.mark.parametrize("name", list(WITNESSES))
def test_each_path_classified_as_documented(name: str, flag: DivergentHits) -> None:
    q, expected = WITNESSES[name]
    if PATH == ConnectorPath.NONE:
        with pytest.raises(UndrivableTarget, match="has no connector path"):
            judged(q, flag)
        return
    assert judged(q, flag) == expected[(PATH, flag)]


FINE = {"max_length": 3, "alignment": 1, "hash_unit": 1}
CRASHES = {
    # C1 with a hash unit: max lands inside full attention's block 1 (0.26.0)
    "max inside a block": parse_query(
        {"groups": HYBRID, "cached": [[True], [False, {"upto": 3}]], **FINE}
    ),
    # C5: a sliding window asked for fine hits by the per-group lookup (0.26.0, 0.27.0)
    "per-group sliding window": parse_query(
        {
            "groups": [{"kind": "sliding_window", "block_size": 2, "window": 1}, HYBRID[1]],
            "cached": ["", ""],
            **FINE,
            "max_length": 0,
        }
    ),
}


def crash_expected(name: str) -> Verdict:
    """The documented class of a CRASHES state on the installed release: unsupported
    before partial hash hits (0.26.0) and, for the window, where vLLM turns them off
    beside a window (0.28.0+)."""
    if not RELEASE.partial_hash_hits:
        return UNSUPPORTED
    if name == "max inside a block":
        return Verdict.CRASH if PATH == ConnectorPath.MAX_OF_GROUPS else OK
    if PATH == ConnectorPath.FLAGGED:
        return UNSUPPORTED
    return Verdict.CRASH


@pytest.mark.parametrize("name", list(CRASHES))
def test_the_crashes_are_where_the_docs_say(name: str) -> None:
    if PATH == ConnectorPath.NONE:
        with pytest.raises(UndrivableTarget, match="has no connector path"):
            judged(CRASHES[name])
        return
    assert judged(CRASHES[name]) == crash_expected(name)


def test_the_tier_completing_every_group_is_loaded_from_it() -> None:
    q, _ = WITNESSES["tier completing every group"]
    if PATH == ConnectorPath.NONE:
        with pytest.raises(UndrivableTarget, match="has no connector path"):
            connector_answer(q)
        return
    answer = connector_answer(q)
    assert set(answer) == {"length", "blocks"}
    assert answer["length"] == longest_hit(q).length == 6
    assert 2 in answer["blocks"][0] and 2 in answer["blocks"][1]


def test_without_tiers_the_scheduler_answers_what_the_lookup_answers() -> None:
    """No tier: the connector finds nothing, so from 0.27 on vLLM's scheduler settles
    on the coordinator's own hit (the ``vllm`` target's answer); before, on the max
    of the per-group hits, never below it."""
    if PATH == ConnectorPath.NONE:
        return  # no connector path: test_a_release_before_the_connector_path_cannot_be_driven
    compared = 0
    for q in random_queries(5, 300, kinds=["full", "sliding_window", "mamba"]):
        try:
            scheduled, looked_up = connector_answer(q), vllm_answer(local_query(q))
        except Unsupported:
            continue
        compared += 1
        if PATH == ConnectorPath.MAX_OF_GROUPS:
            assert scheduled["length"] >= looked_up["length"], q
        else:
            assert scheduled == looked_up, q
    assert compared > 100


def test_drawn_tiered_states_meet_only_the_documented_classes() -> None:
    if PATH == ConnectorPath.NONE:
        return  # no connector path: test_a_release_before_the_connector_path_cannot_be_driven
    documented = {
        ConnectorPath.MAX_OF_GROUPS: {OK, UNSAFE, LOST, Verdict.WRONG_BLOCKS, Verdict.CRASH},
        ConnectorPath.FULL_ATTENTION_HIT: {OK, UNSAFE, LOST, Verdict.WRONG_BLOCKS},
        ConnectorPath.FLAGGED: {OK, UNSAFE, LOST, Verdict.WRONG_BLOCKS},
    }[PATH]
    seen: set[Verdict] = set()
    for q in random_queries(7, 400, kinds=["full", "mamba"], capabilities=Capabilities(tiers=True)):
        seen.add(judged(q))
    assert seen - {UNSUPPORTED} <= documented
    assert OK in seen


def run_under(release: str, code: str) -> subprocess.CompletedProcess[str]:
    """Python ``code`` run with vLLM ``release`` first on the path."""
    env = {**os.environ, "PYTHONPATH": str(RELEASES_DIR / release)}
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


ASK = """
from kvhit.engines.vllm.connector_lookup import vllm_connector_lookup
from kvhit.errors import UndrivableTarget
try:
    print(vllm_connector_lookup({"divergent": "auto"}))
except UndrivableTarget as err:
    print("undrivable:", err)
"""


def test_a_release_before_the_connector_path_cannot_be_driven() -> None:
    assert BEFORE_PATH, f"no release before 0.24.0 in {RELEASES_DIR} (scripts/install-vllm.sh)"
    release = BEFORE_PATH[-1]
    done = run_under(release, ASK)
    assert done.returncode == 0, done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith(f"undrivable: vLLM {release} has no connector path"), last


def spill_and_restore() -> Program:
    """r1 evicts all of r0's blocks (spilled to the store); r2, r0's prompt again,
    finds nothing in the pool and restores blocks 0-1 from the store."""
    first, other = [1, 2, 3, 4, 5, 6], [7, 8, 9, 10, 11, 12]
    ops = [
        {"op": "admit", "request": 0, "tokens": first},
        {"op": "finish", "request": 0},
        {"op": "admit", "request": 1, "tokens": other},
        {"op": "finish", "request": 1},
        {"op": "admit", "request": 2, "tokens": first},
    ]
    groups = [{"kind": "full", "block_size": 2}]
    store = {"name": "host", "holds": ["full"], "num_blocks": 4}
    return Program.from_json({"groups": groups, "num_blocks": 3, "tiers": [store], "ops": ops})


def test_a_program_spills_and_restores_through_the_ledger() -> None:
    if PATH == ConnectorPath.NONE:
        with pytest.raises(UndrivableTarget, match="has no connector path"):
            run_program(TargetSpec("vllm-connector").open(Mode.STATEFUL), spill_and_restore())
        return
    steps = run_program(TargetSpec("vllm-connector").open(Mode.STATEFUL), spill_and_restore())
    assert [s.outcome.cls for s in steps] == [OK] * 5
    spilling, restoring = steps[2].answer, steps[4].answer
    assert [m[0] for m in spilling["moves"]] == ["spill"] * 3
    assert restoring["length"] == 4
    assert [m[0] for m in restoring["moves"]].count("restore") == 2
