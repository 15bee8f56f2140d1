"""Bookkeeping of the torch cache: hashes, reference counts, eviction order, drops."""

from __future__ import annotations

import random
from collections import Counter

import torch
from hypothesis import given
from hypothesis import strategies as st

from kvhit.impl.coordinator import CacheHit, Coordinator
from kvhit.impl.hashing import ROOT, BlockHasher
from kvhit.impl.pool import NULL_BLOCK, BlockPool, Entry, PoolExhausted
from kvhit.model.spec import Group

tokens = st.lists(st.integers(0, 2), max_size=12)


@given(tokens, tokens)
def test_equal_hash_ids_iff_equal_prefixes(a: list[int], b: list[int]) -> None:
    hasher = BlockHasher(block_size=2)
    ha, hb = hasher.hashes(a).tolist(), hasher.hashes(b).tolist()
    assert len(ha) == len(a) // 2
    for j in range(min(len(ha), len(hb))):
        assert (ha[j] == hb[j]) == (a[: 2 * j + 2] == b[: 2 * j + 2])


def test_pool_hands_out_every_block_but_the_null_one_then_runs_out() -> None:
    pool = BlockPool(num_blocks=4, num_groups=1)
    taken = [pool.allocate() for _ in range(3)]
    assert sorted(taken) == [1, 2, 3]
    try:
        pool.allocate()
        raise AssertionError("a fourth block was handed out")
    except PoolExhausted:
        pass


def test_eviction_takes_the_least_recently_freed_block_and_forgets_its_hash() -> None:
    pool = BlockPool(num_blocks=4, num_groups=1)
    a, b, c = (pool.allocate() for _ in range(3))
    for hash_id, block in enumerate((a, b, c), 1):
        assert pool.cache(block, 0, [hash_id])
    pool.free([b])
    pool.free([c, a])
    assert pool.lookup(0, torch.tensor([1, 2, 3])).tolist() == [a, b, c]
    assert pool.allocate() == b
    assert pool.lookup(0, torch.tensor([1, 2, 3])).tolist() == [a, -1, c]
    assert pool.allocate() == c
    assert pool.lookup(0, torch.tensor([1, 2, 3])).tolist() == [a, -1, -1]


def test_touching_a_free_cached_block_saves_it_from_eviction() -> None:
    pool = BlockPool(num_blocks=3, num_groups=1)
    a, b = pool.allocate(), pool.allocate()
    pool.cache(a, 0, [7])
    pool.free([a, b])
    pool.touch([a])
    assert pool.ref_cnt[a] == 1
    assert pool.allocate() == b
    assert pool.lookup(0, torch.tensor([7])).tolist() == [a]


def test_a_hash_already_cached_keeps_its_first_block() -> None:
    pool = BlockPool(num_blocks=3, num_groups=2)
    a, b = pool.allocate(), pool.allocate()
    assert pool.cache(a, 0, [4])
    assert not pool.cache(b, 0, [4])
    assert pool.cache(b, 1, [4])
    assert pool.lookup(0, torch.tensor([4])).tolist() == [a]
    assert pool.lookup(1, torch.tensor([4])).tolist() == [b]


def test_shared_prefix_reference_counts_and_freeing() -> None:
    coord = Coordinator([Group("full", 2)], num_blocks=10)
    first = coord.request([1, 2, 3, 4, 5])
    coord.allocate(first, coord.find_longest_cache_hit(first, 4))
    coord.cache_full_blocks(first)
    assert [coord.pool.ref_cnt[j] for j in first.tables[0]] == [1, 1, 1]
    second = coord.request([1, 2, 3, 4, 9, 9])
    hit = coord.find_longest_cache_hit(second, 5)
    assert hit.length == 4 and hit.blocks == (tuple(first.tables[0][:2]),)
    coord.allocate(second, hit)
    shared = first.tables[0][:2]
    assert [coord.pool.ref_cnt[j] for j in shared] == [2, 2]
    coord.free(first)
    assert [coord.pool.ref_cnt[j] for j in shared] == [1, 1]
    tail = second.tables[0][2]
    coord.free(second)
    assert all(coord.pool.ref_cnt[j] == 0 for j in range(1, 10))
    assert len(coord.pool.free_queue) == 9 and NULL_BLOCK not in coord.pool.free_queue
    # The second request's tail went back last-block-first, after the first request.
    assert list(coord.pool.free_queue)[-3] == tail


def test_dropped_window_blocks_are_freed_but_still_hit_until_evicted() -> None:
    coord = Coordinator([Group("sliding_window", 1, window=2)], num_blocks=6)
    req = coord.request([1, 2, 3, 4, 5])
    coord.allocate(req, CacheHit(0, (0,), ((),)))
    coord.cache_full_blocks(req)
    blocks = list(req.tables[0])
    coord.drop_skipped(req)
    # The next token (position 5) sees positions 4 and 5: block 4 is kept.
    assert req.tables[0] == [NULL_BLOCK] * 4 + blocks[4:]
    assert list(coord.pool.free_queue) == blocks[:4]
    assert coord.snapshot(req)["cached"] == [[True] * 5]
    coord.pool.allocate()
    assert coord.snapshot(req)["cached"] == [[False, True, True, True, True]]


def test_each_kind_keeps_what_its_next_token_reads() -> None:
    coord = Coordinator(
        [
            Group("full", 2),
            Group("sliding_window", 2, window=4),
            Group("chunked_local", 2, chunk=6),
            Group("mamba", 2),
        ],
        num_blocks=40,
    )
    kept = [m.first_kept(num_computed=9) for m in coord.managers]
    # Position 9 reads: everything; 6..9; its chunk 6..9; the state at 8 (block 3).
    assert kept == [0, 3, 3, 3]


def live_closure(coord: Coordinator, block_size: int) -> set[int]:
    """The ids of every cached block of that block size, and of their ancestors."""
    hasher = coord.hashers[block_size]
    ids = set()
    for g, table in zip(coord.groups, coord.pool.tables):
        if g.block_size == block_size:
            ids |= {i for i, block in enumerate(table.tolist()) if block >= 0}
    todo = list(ids)
    while todo:
        key = hasher.key_of[todo.pop()]
        assert key is not None
        if key[0] and key[0] not in ids:
            ids.add(key[0])
            todo.append(key[0])
    return ids


def test_keys_kept_are_those_of_cached_prefixes_and_ids_are_reused() -> None:
    from test_impl_workloads import random_workload

    rng = random.Random(11)
    reused = 0
    for _ in range(20):
        workload = random_workload(rng, requests=12)
        engine = workload.engine(seed=0)
        seen: dict[int, set[tuple[int, ...]]] = {b: set() for b in engine.coord.hashers}
        for prompt in workload.prompts:
            engine.serve(prompt)
            for b, prefixes in seen.items():
                prefixes.update(tuple(prompt[:end]) for end in range(b, len(prompt) + 1, b))
        for b, hasher in engine.coord.hashers.items():
            live = live_closure(engine.coord, b)
            keys = {i: key for i, key in enumerate(hasher.key_of) if key is not None}
            assert (
                set(keys)
                == live
                == {hasher.children[parent][block] for parent, block in keys.values()}
            )
            holders: Counter[int] = Counter()
            for g, table in zip(engine.coord.groups, engine.coord.pool.tables):
                if g.block_size == b:
                    holders.update(i for i, block in enumerate(table.tolist()) if block >= 0)
            holders.update(parent for parent, _ in keys.values() if parent != ROOT)
            assert {i: hasher.holds[i] for i in live} == {i: holders[i] for i in live}
            reused += hasher.bound - 1 < len(seen[b])
    assert reused > 0


def test_no_group_takes_a_block_another_group_is_about_to_reuse() -> None:
    # Prompts off shared roots through a pool that is always full: the hit blocks of
    # the sliding-window group sit in the free queue when the full group takes its
    # new blocks.
    groups = [Group("full", 16), Group("sliding_window", 16, window=64)]
    rng = random.Random(0)
    roots = [[rng.randrange(50_000) for _ in range(512)] for _ in range(8)]
    coord = Coordinator(groups, 256)
    for _ in range(60):
        tokens = rng.choice(roots)[: rng.randrange(448)]
        tokens += [rng.randrange(50_000) for _ in range(rng.randint(64, 128))]
        request = coord.request(tokens)
        hit = coord.find_longest_cache_hit(request, request.num_tokens - 1)
        coord.allocate(request, hit)
        held = [b for table in request.tables for b in table if b != NULL_BLOCK]
        assert len(held) == len(set(held)), "a block is in two groups' tables"
        for g, (first, blocks) in enumerate(zip(hit.first, hit.blocks)):
            hashes = request.hashes[g].tolist()
            assert [coord.pool.key[b] for b in blocks] == [
                Entry(g, (hashes[j],), (hashes[j],)) for j in range(first, first + len(blocks))
            ]
        coord.cache_full_blocks(request)
        coord.drop_skipped(request)
        coord.free(request)
