"""Random cache states for the vLLM tests, and how to compare vLLM with the model.

Two sources: the harness's seeded generator (every kind, eagle, mixed block sizes),
and :func:`eagle_queries`, which puts several eagle groups in one query far more
often, since that is where vLLM's fixed point has the most to get right.
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice
from typing import Any

from kvhit.analysis import Analysis, Verdict
from kvhit.engines.vllm.target import Lookup, build_coordinator, lookup
from kvhit.errors import Unsupported
from kvhit.harness.random_cases import CHOICES, Choice, random_queries
from kvhit.model.protocol import parse_query
from kvhit.model.spec import DRAFTERS, Drafter, Kind, Query


def eagle_group(rng: random.Random, block_size: int) -> dict:
    """A full, sliding window or mamba group, the first two eagle more often than not;
    a window is exclusive (SGLang's convention) 30% of the time."""
    kind = rng.choice(("sliding_window", "sliding_window", "full", "mamba"))
    group: dict = {"kind": kind, "block_size": block_size}
    if kind == "sliding_window":
        group["window"] = rng.randint(2, 3 * block_size + 1)
        group["window_convention"] = "exclusive" if rng.random() < 0.3 else "inclusive"
    if kind != "mamba":
        group["eagle"] = rng.random() < 0.7
    return group


def eagle_queries(seed: int) -> Iterator[Query]:
    """Endless queries of 2-3 groups, most of them eagle, block sizes mostly equal."""
    rng = random.Random(seed)
    while True:
        common = rng.choice((1, 2))
        sizes = [
            common if rng.random() < 0.8 else rng.choice((1, 2, 4))
            for _ in range(rng.randint(2, 3))
        ]
        groups = [eagle_group(rng, b) for b in sizes]
        max_length = rng.randint(0, 10)
        rows = ["".join(rng.choice("1110") for _ in range(max_length // b + 2)) for b in sizes]
        yield parse_query(
            {
                "groups": groups,
                "cached": rows,
                "max_length": max_length,
                "num_tokens": max_length + 1 + rng.choice((0, 0, 1, 2)),
            }
        )


WHOLE_BLOCKS = [c for c in CHOICES if c not in (Choice.DRAFTER, Choice.HASH_UNIT)]
"""The generator's choices without hash units and new drafters: the space whose every
disagreement a documented class names (docs/findings-vllm.md lists what the rest finds)."""


def mixed_queries(seed: int, count: int) -> list[Query]:
    """``count`` whole-block queries from each source (:data:`WHOLE_BLOCKS`)."""
    return [
        *random_queries(seed=seed, count=count, kinds=WHOLE_BLOCKS),
        *islice(eagle_queries(seed), count),
    ]


def whole_block(q: Query) -> bool:
    """Whether q is in the space :data:`WHOLE_BLOCKS` draws: no hash unit, no drafter
    but the eagle drop."""
    return q.hash_unit is None and all(g.drafter in (None, Drafter.DROP) for g in q.groups)


def disagreement(q: Query, found: Lookup) -> Verdict | None:
    """How vLLM's lookup differs from the spec (``unsafe``, ``lost_reuse``,
    ``wrong_blocks``); None when it agrees."""
    a = Analysis(q)
    verdict = a.verdict(found.length)
    if verdict != Verdict.OK:
        return verdict
    if found.blocks != [list(b) for b in a.longest_hit.blocks]:
        return Verdict.WRONG_BLOCKS
    return None


def refused(q: Query) -> bool:
    """Whether the installed release refuses the configuration: the adapter's own list
    (vLLM's asserts, coordinators vLLM never builds), vLLM's own checks while building
    the coordinator, and hits vLLM would align elsewhere."""
    try:
        build_coordinator(q)
    except Unsupported:
        return True
    return False


def try_lookup(q: Query) -> Lookup | None:
    """vLLM's lookup, or None where vLLM refuses the configuration."""
    try:
        return lookup(q)
    except Unsupported:
        return None


def reordered(q: Query, order: list[int]) -> Query:
    """The same cache state with the groups in ``order``."""
    return Query(
        tuple(q.groups[i] for i in order),
        tuple(q.cached[i] for i in order),
        q.max_length,
        q.num_tokens,
        q.alignment,
    )


def fine_entry(rng: random.Random, j: int, block_size: int, unit: int) -> Any:
    """A row entry of block j: cached, not, or (when a unit fits inside) partial."""
    inside = [p for p in range(j * block_size + unit, (j + 1) * block_size, unit)]
    pick = rng.random()
    if inside and pick < 0.3:
        return {"upto": rng.choice(inside)}
    return pick < 0.75


def drafter_fields(rng: random.Random, kind: str) -> dict[str, Any]:
    """No drafter, or one of the behaviours the kind can carry (La 0-2)."""
    allowed = [str(d) for d in DRAFTERS[Kind(kind)]]
    pick = rng.choice([None, None, *allowed])
    if pick is None:
        return {}
    if pick == Drafter.LOOKAHEAD:
        return {"drafter": pick, "lookahead": rng.randint(0, 2)}
    return {"drafter": pick}


def fine_queries(seed: int) -> Iterator[Query]:
    """Endless hybrid queries with a hash unit, as vLLM's partial hash hits see them: a
    Mamba group whose block is 2-4 hash units, full attention (sometimes a sliding
    window at the hash unit), partially filled blocks, and drafters on any group."""
    rng = random.Random(seed)
    while True:
        unit = rng.choice((1, 2))
        groups: list[dict[str, Any]] = [
            {"kind": "mamba", "block_size": unit * rng.choice((2, 4))},
            {"kind": "full", "block_size": unit * rng.choice((1, 2, 4))},
        ]
        if rng.random() < 0.3:
            groups.append(
                {"kind": "sliding_window", "block_size": unit, "window": rng.randint(1, 6)}
            )
        rng.shuffle(groups)
        lookahead = rng.random() < 0.5
        for g in groups:
            g.update(drafter_fields(rng, g["kind"]))
            if not lookahead and g.get("drafter") == Drafter.LOOKAHEAD:
                g["drafter"] = Drafter.NONE
                del g["lookahead"]
        max_length = rng.randint(0, 16)
        rows = [
            [
                fine_entry(rng, j, g["block_size"], unit)
                for j in range(max_length // g["block_size"] + 2)
            ]
            for g in groups
        ]
        yield parse_query(
            {
                "groups": groups,
                "cached": rows,
                "max_length": max_length,
                "num_tokens": max_length + 1 + rng.choice((0, 0, 1, 2, 3)),
                "hash_unit": unit,
            }
        )
