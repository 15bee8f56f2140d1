"""Hand-worked cases of the spec, per kind (docs/design.md §1.2), and the three seed facts."""

import json
from pathlib import Path

import pytest

from kvhit.model import (
    brute_force,
    find,
    fixed_point,
    min_of_groups,
    needed_blocks,
    parse_query,
    per_group,
    reused_blocks,
    single_pass,
    valid,
)
from kvhit.model.spec import Group

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def query(groups, cached, max_length, **extra):
    return parse_query({"groups": groups, "cached": cached, "max_length": max_length, **extra})


def sw(window, b=1, **kw):
    return {"kind": "sliding_window", "block_size": b, "window": window, **kw}


def load(name):
    return parse_query(json.loads((EXAMPLES / name).read_text()))


def test_seed_as_written_is_not_a_counterexample():
    q = load("seed_reviewer_as_written.json")
    assert per_group(q) == [5, 4]
    assert min_of_groups(q) == brute_force(q) == fixed_point(q) == 4


def test_seed_with_windows_3_and_4_is_exact():
    q = load("seed_reviewer_exact.json")
    assert min_of_groups(q) == 4
    assert brute_force(q) == fixed_point(q) == 0


def test_smallest_counterexample_to_min():
    q = load("seed_minimal.json")
    assert per_group(q) == [2, 1]
    assert min_of_groups(q) == 1
    assert brute_force(q) == fixed_point(q) == 0


# (group, length, reused blocks, needed blocks)
NEEDED = [
    (Group("full", 4), 12, [0, 1, 2], [0, 1, 2]),
    (Group("full", 4), 0, [], []),
    # window 1 attends only to the token itself: no earlier block
    (Group("sliding_window", 4, window=1), 12, [], []),
    # window 5, b=4: the 4 tokens before L span exactly one block
    (Group("sliding_window", 4, window=5), 12, [2], [2]),
    # window 6 reaches one token into a second block
    (Group("sliding_window", 4, window=6), 12, [1, 2], [1, 2]),
    # a short prefix: fewer blocks than the window would need
    (Group("sliding_window", 4, window=100), 8, [0, 1], [0, 1]),
    # chunk boundary: at L = 8 with chunk 8 nothing before L is in L's chunk
    (Group("chunked_local", 4, chunk=8), 8, [], []),
    (Group("chunked_local", 4, chunk=8), 12, [2], [2]),
    # chunk not a multiple of the block size: the chunk starts inside block 1
    (Group("chunked_local", 4, chunk=6), 8, [1], [1]),
    (Group("mamba", 4), 12, [2], [2]),
    # eagle: the next block is needed too (matched, then dropped)
    (Group("full", 4, drafter="drop"), 8, [0, 1], [0, 1, 2]),
    (Group("sliding_window", 4, window=5, drafter="drop"), 8, [1], [1, 2]),
]


@pytest.mark.parametrize(("group", "length", "reused", "needed"), NEEDED)
def test_needed_blocks_table(group, length, reused, needed):
    assert reused_blocks(group, length) == reused
    assert needed_blocks(group, length) == needed


def test_window_boundary_one_token_more_needs_one_block_more():
    row = [False, True, True]
    assert valid(Group("sliding_window", 4, window=5), row, 12, 13)
    assert valid(Group("sliding_window", 4, window=9), row, 12, 13)
    assert not valid(Group("sliding_window", 4, window=10), row, 12, 13)


def test_short_prefix_is_accepted():
    q = query([sw(100, b=2)], ["11"], 4)
    assert fixed_point(q) == brute_force(q) == 4


def test_mamba_state_at_the_boundary():
    # the state after block 1 (tokens 0-7) is cached, the one after block 2 is not
    g = Group("mamba", 4)
    assert find(g, [False, True, False], 12, 4, 13) == 8
    assert find(g, [False, True, False], 12, 8, 13) == 8
    # alignment 8: the state after block 0 (L = 4) is not a candidate
    assert find(g, [True, False, False], 12, 8, 13) == 0


def test_eagle_at_the_requests_last_whole_block():
    # a request of 12 tokens has whole blocks 0, 1, 2 (b = 4); the hit may use 0, 1
    # and must have block 2 to drop: L = 8 is the longest, even though M = 11.
    q = query([{"kind": "full", "block_size": 4, "eagle": True}], ["1111"], 11, num_tokens=12)
    assert fixed_point(q) == brute_force(q) == 8
    # with 11 tokens block 2 is not whole: the drafter's block must lie in the request
    q = query([{"kind": "full", "block_size": 4, "eagle": True}], ["1111"], 10, num_tokens=11)
    assert fixed_point(q) == brute_force(q) == 4


def test_eagle_drops_once_not_every_pass():
    q = query(
        [{"kind": "full", "block_size": 1, "eagle": True}, sw(2)],
        ["11111", "11111"],
        4,
        num_tokens=6,
    )
    assert fixed_point(q) == brute_force(q) == 4


def test_mixed_block_sizes_align_to_the_lcm():
    q = query(
        [{"kind": "full", "block_size": 2}, {"kind": "full", "block_size": 3}], ["111", "11"], 6
    )
    assert q.alignment == 6
    assert fixed_point(q) == brute_force(q) == 6
    q = query(
        [{"kind": "full", "block_size": 2}, {"kind": "full", "block_size": 3}], ["11", "11"], 6
    )
    assert fixed_point(q) == brute_force(q) == 0


def test_explicit_alignment_skips_unaligned_hits():
    q = query([sw(2, b=2)], ["0110"], 8, alignment=4)
    # L = 6 would be valid (needs block 2) but is not a multiple of 4; L = 4 needs block 1
    assert brute_force(q) == fixed_point(q) == 4


def test_one_pass_is_not_enough_for_two_windows():
    # pass 1: group 0 keeps 3, group 1 lowers it to 2; group 0 is not valid at 2
    q = query([sw(2), sw(2)], ["001", "01"], 3)
    assert single_pass(q) == 2
    assert brute_force(q) == fixed_point(q) == 0
