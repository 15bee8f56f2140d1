"""The impl on queries with hash units, partially filled blocks and drafters: the
``impl`` target answers exactly L* (the longest candidate every group can serve) and
the spec's blocks there."""

from __future__ import annotations

import random
from typing import Any

from kvhit.model.protocol import parse_query
from kvhit.model.spec import (
    DRAFTERS,
    KINDS,
    Drafter,
    Group,
    Kind,
    Query,
    Upto,
    answer_at,
    fine_query,
    longest_hit,
    valid_all,
)
from kvhit.targets.registry import get, model_target

impl_target = get("impl")


def random_group(rng: random.Random, unit: int) -> dict[str, Any]:
    """A group of a random kind, block size a multiple of ``unit``, and drafter."""
    kind = rng.choice(KINDS)
    group: dict[str, Any] = {"kind": kind, "block_size": unit * rng.choice((1, 2, 3, 4))}
    if kind == Kind.SLIDING_WINDOW:
        group["window"] = rng.randint(1, 10)
    if kind == Kind.CHUNKED_LOCAL:
        group["chunk"] = rng.randint(1, 10)
    drafter = rng.choice((None, *DRAFTERS[kind]))
    if drafter is not None:
        group["drafter"] = drafter
    if drafter == Drafter.LOOKAHEAD:
        group["lookahead"] = rng.randint(0, 5)
    return group


def random_entry(rng: random.Random, j: int, block_size: int, unit: int) -> Any:
    """A row entry for block j: cached, not, or partially filled at a fine boundary."""
    per = block_size // unit
    if per > 1 and rng.random() < 0.3:
        return {"upto": j * block_size + rng.randint(1, per - 1) * unit}
    return rng.random() < 0.7


def random_fine_query(rng: random.Random) -> dict[str, Any]:
    """A protocol query with a hash unit: up to 3 groups, rows of up to 8 blocks with
    partially filled ones, any drafter a kind allows, alignment a multiple of h."""
    unit = rng.choice((1, 2, 3))
    groups = [random_group(rng, unit) for _ in range(rng.randint(1, 3))]
    cached = [
        [random_entry(rng, j, g["block_size"], unit) for j in range(rng.randint(0, 8))]
        for g in groups
    ]
    max_length = rng.randint(0, 30)
    return {
        "groups": groups,
        "cached": cached,
        "max_length": max_length,
        "num_tokens": max_length + rng.randint(1, 6),
        "alignment": unit * rng.choice((1, 1, 2)),
        "hash_unit": unit,
    }


def spec_answer(q: Query) -> dict[str, Any]:
    """L* by its definition, every candidate tried (``longest_hit`` takes a shortcut,
    ``reduced``, which once went wrong on a lookahead: see docs/impl.md)."""
    return answer_at(q, next(L for L in q.candidates() if valid_all(q, L))).to_json()


def test_impl_target_matches_the_spec_on_random_fine_queries() -> None:
    rng = random.Random(30)
    queries = [parse_query(random_fine_query(rng)) for _ in range(1500)]
    sub_block = 0
    for q in queries:
        query = q.to_json()
        expected = spec_answer(q)
        assert impl_target(query) == expected, query
        assert longest_hit(q).to_json() == expected, query
        sub_block += any(expected["length"] % g.block_size for g in q.groups)
    # The draw reaches what is new: hits inside a block, partial blocks, every drafter.
    assert sub_block > 100
    assert any(isinstance(entry, Upto) for q in queries for row in q.cached for entry in row)
    drafters = {(g.kind, g.drafter) for q in queries for g in q.groups}
    assert {(k, d) for k in KINDS for d in DRAFTERS[k]} <= drafters


def test_hand_built_fine_queries() -> None:
    """Sub-block hits per kind, as docs/design.md §1.6 draws them."""
    full, mamba = {"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}
    base = {"max_length": 9, "num_tokens": 10, "alignment": 2, "hash_unit": 2}
    # Full attention reuses the partial block's first L mod b tokens.
    assert impl_target({"groups": [full], "cached": [[True, {"upto": 6}]], **base}) == {
        "length": 6,
        "blocks": [[0, 1]],
    }
    # Mamba needs the state at exactly L: at 6 (partial block 1), not at 8.
    assert impl_target({"groups": [mamba], "cached": [[True, {"upto": 6}]], **base}) == {
        "length": 6,
        "blocks": [[1]],
    }
    # Together: the state at 4 and the tokens through 6 only meet at 4 and 6.
    query = {"groups": [full, mamba], "cached": [[True, True], [True, {"upto": 6}]], **base}
    assert impl_target(query) == {"length": 6, "blocks": [[0, 1], [1]]}
    # A lookahead key of La = 3 exists only for hits of at most T - 3 = 7.
    ahead = {**full, "drafter": "lookahead", "lookahead": 3}
    query = {"groups": [ahead], "cached": [[True, True, True]], **base}
    assert impl_target(query) == model_target(query) == {"length": 6, "blocks": [[0, 1]]}
    # A drop drafter matches one more hash unit (tokens 6, 7) and drops it.
    drop = {**full, "drafter": "drop"}
    query = {"groups": [drop], "cached": [[True, {"upto": 6}]], **base}
    assert impl_target(query) == model_target(query) == {"length": 4, "blocks": [[0]]}


def test_the_target_builds_exactly_the_fine_rows() -> None:
    """The pool the target builds holds exactly the query's units: its snapshot is
    the query back."""
    from kvhit.impl.coordinator import Coordinator

    rng = random.Random(3)
    for _ in range(200):
        q = parse_query(random_fine_query(rng))
        coord = Coordinator(q.groups, sum(map(len, q.cached)) + 1, q.alignment, q.hash_unit)
        request = coord.request([0] * q.num_tokens)
        coord.preload(request, fine_query(q).cached)
        seen = fine_query(parse_query(coord.snapshot(request, q.max_length)))
        for g, hashes, want, got in zip(
            q.groups, request.hashes, fine_query(q).cached, seen.cached
        ):
            # Units without a key (past T - La, or past the request) are never found.
            keyed = min(len(hashes), len(want))
            assert got[:keyed] == want[:keyed] and not any(got[keyed:]), g.describe()


def test_the_stateful_impl_serves_a_partially_filled_block() -> None:
    from kvhit.contract import Admitted, EngineConfig, Snapshot
    from kvhit.impl.stateful_target import StatefulImpl

    groups = (Group("full", 4), Group("mamba", 4))
    engine = StatefulImpl(EngineConfig(groups, num_blocks=16, alignment=2, hash_unit=2))
    first = engine.admit(0, [1, 2, 3, 1, 2, 3, 1, 2, 3, 1])
    assert isinstance(first, Admitted) and first.length == 0 and first.outputs_match
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 0, 0, 1]
    assert engine.snapshot(prompt) == Snapshot(((True, True, Upto(10)), (True, True, Upto(10))))
    second = engine.admit(1, prompt)
    # The partially filled block 2 is reused through a copy: the request's own block.
    assert isinstance(second, Admitted) and second.length == 10 and second.outputs_match
    assert second.reused[0][2] not in second.tables[0]
