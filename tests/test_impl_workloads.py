"""The torch cache on multi-request workloads, grounded in the tiny model.

Each workload is a few groups (every kind, eagle flags, mixed block sizes, sometimes
a larger alignment) and a stream of prompts that share prefixes and branch, served
through a small pool so that blocks are dropped and evicted. For every prompt:

- the hit's output equals the output from scratch, without NaN;
- the hit and the reused blocks equal the model's answer on the snapshot;
- for every candidate L, the model reads exactly the spec's blocks at L, and its
  output is right when every layer can serve L and NaN when one cannot.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from math import lcm

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kvhit.harness.random_cases import make_group
from kvhit.impl.engine import Engine
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, reused_blocks, valid
from kvhit.targets.registry import model_target

VOCAB = 4


@dataclass
class Workload:
    """Groups, the engine's pool size and alignment, and the prompts in order."""

    groups: list[Group]
    num_blocks: int
    alignment: int | None
    prompts: list[list[int]]

    def engine(self, seed: int) -> Engine:
        """A fresh engine for this workload."""
        return Engine(self.groups, self.num_blocks, self.alignment, seed=seed, dim=4)


def random_group(rng: random.Random, kind: str) -> Group:
    """A group of ``kind`` with a small block size and window or chunk."""
    return make_group(
        (kind, "eagle"),
        rng.choice,
        lambda: rng.choice((1, 2, 2, 4)),
        lambda b: rng.randint(1, 12),
        lambda: rng.random() < 0.2,
    )


def random_workload(rng: random.Random, requests: int = 6) -> Workload:
    """Prompts that branch off a few roots, and a pool just big enough to evict."""
    kinds = ["full", "sliding_window", "chunked_local", "mamba"]
    groups = [random_group(rng, k) for k in rng.sample(kinds, rng.randint(2, 4))]
    step = lcm(*(g.block_size for g in groups))
    alignment = step * 2 if rng.random() < 0.2 else None
    roots = [[rng.randrange(VOCAB) for _ in range(24)] for _ in range(2)]
    prompts = []
    for _ in range(requests):
        root = rng.choice(prompts + roots) if prompts else rng.choice(roots)
        cut = rng.randint(0, len(root))
        prompts.append(root[:cut] + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))])
    longest = max(map(len, prompts))
    need = sum(-(-longest // g.block_size) for g in groups) + 1
    return Workload(groups, need + rng.randint(0, need), alignment, prompts)


def base(g: Group) -> Group:
    """The rule the model's layer for g follows (an eagle drafter's layer is its base kind)."""
    return replace(g, drafter=None)


def check_every_candidate(engine: Engine, prompt: list[int], scratch: torch.Tensor) -> int:
    """Serve ``prompt`` from every candidate L in the current cache; return how many
    candidates were poisoned (some layer could not serve them)."""
    q = parse_query(engine.coord.snapshot(engine.coord.request(prompt)))
    poisoned = 0
    for length in q.candidates():
        result = engine.serve_from(prompt, length)
        assert result.reads == [reused_blocks(g, length) for g in q.groups]
        servable = all(
            valid(base(g), row, length, q.num_tokens) for g, row in zip(q.groups, q.cached)
        )
        if servable:
            assert (result.logits - scratch[length:]).abs().max() <= 1e-12
        else:
            assert result.logits.isnan().any()
            poisoned += 1
    return poisoned


def serve_and_check(workload: Workload, seed: int, every_candidate: bool) -> int:
    """Serve every prompt of the workload, checking it; the number of poisoned
    candidates seen."""
    engine = workload.engine(seed)
    poisoned = 0
    for prompt in workload.prompts:
        scratch = engine.scratch(prompt)
        if every_candidate:
            poisoned += check_every_candidate(engine, prompt, scratch)
        served = engine.serve(prompt)
        assert served.hit.length % engine.coord.alignment == 0
        expected = model_target(served.snapshot)
        assert {"length": served.hit.length, "blocks": served.hit.indices()} == expected
        assert not served.prefill.logits.isnan().any()
        assert (served.prefill.logits - scratch[served.hit.length :]).abs().max() <= 1e-12
    return poisoned


def test_served_from_the_hit_equals_scratch_and_every_candidate_reads_the_spec() -> None:
    rng = random.Random(4)
    poisoned = sum(serve_and_check(random_workload(rng), seed, True) for seed in range(25))
    assert poisoned > 0


def test_workloads_reach_hits_drops_and_evictions() -> None:
    """The workloads above are not trivial: hits happen, and evictions leave holes."""
    rng = random.Random(4)
    hits = holes = 0
    for seed in range(25):
        workload = random_workload(rng)
        engine = workload.engine(seed)
        for prompt in workload.prompts:
            served = engine.serve(prompt)
            hits += served.hit.length > 0
            rows = [
                "".join("1" if bit else "0" for bit in row) for row in served.snapshot["cached"]
            ]
            # A cached block after a missing one: only eviction makes that.
            holes += any("01" in row for row in rows)
    assert hits > 20 and holes > 10


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 1000))
def test_impl_matches_the_model_on_hypothesis_workloads(rng: random.Random, seed: int) -> None:
    serve_and_check(random_workload(rng, requests=5), seed, every_candidate=False)
