"""Broken targets for the harness tests: one per class, and bugs engines really had.

Each takes a normalized protocol query and answers like a target. Most are the
spec's brute force with one rule changed, so each has exactly one bug.
"""

from __future__ import annotations

import ctypes
import os
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

from kvhit.errors import Unsupported
from kvhit.model.algorithms import spiral_fixed_point
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Query, answer_at, longest_hit, valid, window_span
from kvhit.targets.registry import model_target

Rule = Callable[[Group, tuple[bool, ...], int, int], bool]


def longest_under(q: Query, rule: Rule) -> int:
    """The longest candidate at which ``rule`` holds for every group (a rule reads
    whole blocks: a query with a hash unit is refused)."""
    if q.hash_unit is not None:
        raise Unsupported("a rule over whole blocks: no hash unit")
    return next(
        L
        for L in q.candidates()
        if all(rule(g, row, L, q.num_tokens) for g, row in zip(q.groups, q.cached))
    )


# One per class.


def always_top(query: dict[str, Any]) -> int:
    """unsafe: trusts the cache blindly and answers the longest candidate."""
    return parse_query(query).top


def one_short(query: dict[str, Any]) -> int:
    """lost_reuse: gives up the last aligned unit of every hit."""
    q = parse_query(query)
    return max(0, longest_hit(q).length - q.alignment)


def whole_prefix_blocks(query: dict[str, Any]) -> dict[str, Any]:
    """wrong_blocks: the right length, but claims every block before it for every group."""
    q = parse_query(query)
    best = longest_hit(q).length
    return {"length": best, "blocks": [list(range(best // g.block_size)) for g in q.groups]}


def crashes_on_mamba(query: dict[str, Any]) -> Any:
    """crash: a lookup that indexes past its state list when a mamba group has no state."""
    q = parse_query(query)
    for g, row in zip(q.groups, q.cached):
        if g.kind == "mamba" and not any(row):
            raise IndexError("list index out of range")
    return model_target(query)


def segfaults_on_mamba(query: dict[str, Any]) -> Any:
    """crash: native code that reads address 0 when a mamba group has no state."""
    q = parse_query(query)
    if any(g.kind == "mamba" and not any(row) for g, row in zip(q.groups, q.cached)):
        ctypes.string_at(0)
    return model_target(query)


def exits_on_two_windows(query: dict[str, Any]) -> Any:
    """crash: ends the process (``os._exit``) on queries with two sliding windows."""
    if sum(g["kind"] == "sliding_window" for g in query["groups"]) >= 2:
        os._exit(7)
    return model_target(query)


def hangs_on_chunks(query: dict[str, Any]) -> Any:
    """timeout: never returns when a chunked-local group is present."""
    if any(g["kind"] == "chunked_local" for g in query["groups"]):
        time.sleep(3600)
    return model_target(query)


def returns_text(query: dict[str, Any]) -> Any:
    """bad_return: the length as a string when there are two groups or more."""
    answer = model_target(query)
    return str(answer["length"]) if len(query["groups"]) > 1 else answer


# Bugs of the kinds engines really had.


def window_counts_w_before(query: dict[str, Any]) -> int:
    """Window rule off by one: keeps one token more before the hit than the window's
    convention says (w instead of w - 1 for an inclusive window, w + 1 instead of w
    for an exclusive one)."""
    q = parse_query(query)
    groups = tuple(
        replace(g, window=g.window + 1) if g.kind == "sliding_window" else g for g in q.groups
    )
    return longest_hit(replace(q, groups=groups)).length


def no_short_prefix(query: dict[str, Any]) -> int:
    """A short prefix not accepted: a sliding window hit needs a full window of blocks
    even when the hit is shorter than the window."""

    def rule(g: Group, row: tuple[bool, ...], length: int, tokens: int) -> bool:
        short = g.kind == "sliding_window" and 0 < length < window_span(g) * g.block_size
        return valid(g, row, length, tokens) and not short

    return longest_under(parse_query(query), rule)


def eagle_drops_every_pass(query: dict[str, Any]) -> int:
    """The eagle spiral: the drafter's last block dropped on every pass, not once."""
    return spiral_fixed_point(parse_query(query))


def mamba_state_after(query: dict[str, Any]) -> dict[str, Any]:
    """A mamba state taken from the wrong block: block n (the state after the next
    block) read in place of block n - 1 (the state at the hit)."""

    def rule(g: Group, row: tuple[bool, ...], length: int, tokens: int) -> bool:
        if g.kind != "mamba" or length == 0:
            return valid(g, row, length, tokens)
        n = length // g.block_size
        return n < len(row) and row[n]

    q = parse_query(query)
    return answer_at(q, longest_under(q, rule)).to_json()
