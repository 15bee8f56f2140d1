"""The torch cache on multi-request workloads, grounded in the tiny model.

Each workload is a few groups (every kind, eagle flags, mixed block sizes, sometimes
a larger alignment) and a stream of prompts that share prefixes and branch, served
through a small pool so that blocks are dropped and evicted. For every prompt:

- the hit's output equals the output from scratch, without NaN;
- the hit and the reused blocks equal the model's answer on the snapshot;
- for every candidate L, the model reads exactly the spec's blocks at L, and its
  output is right when every layer can serve L and NaN when one cannot.

Fine workloads add a hash unit h (hits inside a block, partially filled blocks
cached at their fine boundaries) and drafters of every behaviour, lookahead keys
included.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from math import lcm

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from test_impl_fine import spec_answer

from kvhit.harness.random_cases import make_group, palette
from kvhit.impl.engine import Engine
from kvhit.model.protocol import parse_query
from kvhit.model.spec import DRAFTERS, Drafter, Group, Query, answer_at, fine_query, valid

VOCAB = 4


@dataclass
class Workload:
    """Groups, the engine's pool size and alignment, and the prompts in order."""

    groups: list[Group]
    num_blocks: int
    alignment: int | None
    prompts: list[list[int]]
    hash_unit: int | None = None

    def engine(self, seed: int) -> Engine:
        """A fresh engine for this workload."""
        return Engine(
            self.groups, self.num_blocks, self.alignment, seed=seed, dim=4, hash_unit=self.hash_unit
        )


def random_group(rng: random.Random, kind: str) -> Group:
    """A group of ``kind`` with a small block size and window or chunk."""
    return make_group(
        palette(picked=(kind, "eagle")),
        rng.choice,
        lambda: rng.choice((1, 2, 2, 4)),
        lambda b: rng.randint(1, 12),
        lambda: rng.random() < 0.2,
    )


def fine_group(rng: random.Random, kind: str, unit: int) -> Group:
    """A group of ``kind`` whose block size is a multiple of ``unit``, with any drafter
    the kind allows (a lookahead of 0 to 4 tokens)."""
    g = random_group(rng, kind)
    drafter = rng.choice((None, *DRAFTERS[g.kind]))
    lookahead = rng.randint(0, 4) if drafter == Drafter.LOOKAHEAD else 0
    return replace(g, block_size=unit * rng.choice((1, 2, 4)), drafter=drafter, lookahead=lookahead)


def random_workload(rng: random.Random, requests: int = 6, fine: bool = False) -> Workload:
    """Prompts that branch off a few roots, and a pool just big enough to evict; a fine
    workload has a hash unit and drafters."""
    kinds = ["full", "sliding_window", "chunked_local", "mamba"]
    chosen = rng.sample(kinds, rng.randint(2, 4))
    unit = rng.choice((1, 2)) if fine else None
    if unit is None:
        groups = [random_group(rng, k) for k in chosen]
        step = lcm(*(g.block_size for g in groups))
    else:
        groups = [fine_group(rng, k, unit) for k in chosen]
        step = unit
    alignment = step * 2 if rng.random() < 0.2 else None
    roots = [[rng.randrange(VOCAB) for _ in range(24)] for _ in range(2)]
    prompts = []
    for _ in range(requests):
        root = rng.choice(prompts + roots) if prompts else rng.choice(roots)
        cut = rng.randint(0, len(root))
        prompts.append(root[:cut] + [rng.randrange(VOCAB) for _ in range(rng.randint(1, 8))])
    longest = max(map(len, prompts))
    need = sum(-(-longest // g.block_size) for g in groups) + 1
    return Workload(groups, need + rng.randint(0, need), alignment, prompts, unit)


def base(g: Group) -> Group:
    """The rule the model's layer for g follows (an eagle drafter's layer is its base kind)."""
    return replace(g, drafter=None)


def servable(q: Query, length: int) -> bool:
    """Whether every layer of the tiny model can serve ``length`` from what the cache
    holds (its drafters aside: the model has none)."""
    fine = fine_query(q)
    return all(
        valid(base(g), row, length, q.num_tokens) for g, row in zip(fine.groups, fine.cached)
    )


def check_every_candidate(engine: Engine, prompt: list[int], scratch: torch.Tensor) -> int:
    """Serve ``prompt`` from every candidate L in the current cache; return how many
    candidates were poisoned (some layer could not serve them)."""
    request = engine.coord.request(prompt)
    q = parse_query(engine.coord.snapshot(request))
    engine.coord.free(request)
    poisoned = 0
    for length in q.candidates():
        result = engine.serve_from(prompt, length)
        assert result.reads == [list(blocks) for blocks in answer_at(q, length).blocks]
        if servable(q, length):
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
        expected = spec_answer(parse_query(served.snapshot))
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


def test_fine_workloads_serve_sub_block_hits_from_the_cache() -> None:
    """With a hash unit: hits inside a block happen, are served from a copy of the
    partially filled block (and, for Mamba, the state at exactly L), and equal the
    output from scratch; every candidate reads the spec's units and is NaN when one
    is missing (a fine state, or tokens of a partial block)."""
    rng = random.Random(30)
    sub_block = poisoned = 0
    for seed in range(25):
        workload = random_workload(rng, requests=6, fine=True)
        poisoned += serve_and_check(workload, seed, every_candidate=True)
        engine = workload.engine(seed)
        for prompt in workload.prompts:
            served = engine.serve(prompt)
            sub_block += any(served.hit.length % g.block_size for g in workload.groups)
    assert sub_block > 10 and poisoned > 0


def test_a_partial_block_is_cached_at_its_fine_boundary_and_reused() -> None:
    """Full attention + Mamba, b = 4, h = 2: a prompt of 10 tokens leaves block 2
    partially filled (tokens 8, 9; the state at 10); the next prompt reuses it."""
    groups = [Group("full", 4), Group("mamba", 4)]
    engine = Engine(groups, num_blocks=16, hash_unit=2, dim=4)
    engine.serve([1, 2, 3, 1, 2, 3, 1, 2, 3, 1])
    prompt = [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 0, 0, 1]
    served = engine.serve(prompt)
    assert served.snapshot["cached"] == [[True, True, {"upto": 10}], [True, True, {"upto": 10}]]
    assert served.hit.length == 10 and served.hit.indices() == [[0, 1, 2], [2]]
    assert (served.prefill.logits - engine.scratch(prompt)[10:]).abs().max() <= 1e-12
    # The copy the second prompt filled is now cached whole, in place of the partial one.
    request = engine.coord.request(prompt)
    assert engine.coord.snapshot(request)["cached"] == [[True, True, True], [True, True, True]]
    # Without the state at 10, a prefill from 10 is NaN.
    engine.store.data[1][served.hit.blocks[1][0]] = float("nan")
    assert engine.serve_from(prompt[:11], 10).logits.isnan().all()


def test_lookahead_keys_stop_at_t_minus_la() -> None:
    """A lookahead drafter of La = 3: a prompt of 10 tokens has keys for the blocks
    ending by 7 only; a later prompt finds block 0 (its key covers tokens 0..6)."""
    groups = [Group("full", 4, drafter=Drafter.LOOKAHEAD, lookahead=3)]
    engine = Engine(groups, num_blocks=16, dim=4)
    first = list(range(10))
    engine.serve(first)
    assert engine.serve(first).hit.length == 4
    # Block 1 (tokens 4..7) is cached only now that a prompt held 8 + 3 tokens.
    longer = first + [10]
    assert engine.serve(longer).hit.length == 4
    assert engine.serve(longer + [11]).hit.length == 8
    # Another continuation of tokens 0..3 differs within the lookahead: no hit.
    assert engine.serve([0, 1, 2, 3, 4, 9, 9, 9, 9]).hit.length == 0


@settings(max_examples=40, deadline=None)
@given(st.randoms(use_true_random=False), st.integers(0, 1000))
def test_impl_matches_the_model_on_hypothesis_workloads(rng: random.Random, seed: int) -> None:
    serve_and_check(random_workload(rng, requests=5), seed, every_candidate=False)
