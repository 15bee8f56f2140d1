"""Stateful engines made from the impl, each with one bug engines have shipped.

Each is a factory for ``kvhit gate --stateful --target tests.broken_stateful:NAME``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

from kvhit.contract import Admitted, EngineConfig, Rejected
from kvhit.errors import Unsupported
from kvhit.impl.coordinator import CacheHit, Request
from kvhit.impl.stateful_target import StatefulImpl
from kvhit.model.spec import reused_range


def forgetful_pool(config: EngineConfig) -> StatefulImpl:
    """The pool forgets to drop a block's hash when it reallocates the block: the
    old hash still finds the block after a new request has overwritten it."""
    engine = StatefulImpl(config)
    pool = engine.engine.coord.pool
    pool.uncache = lambda block: None  # type: ignore[method-assign]
    return engine


def freed_after_prefill(config: EngineConfig) -> StatefulImpl:
    """A request's blocks go back to the pool when its prefill is done, as if it had
    finished: the next allocation evicts them and hands them to another request while
    the first still runs on them. Eviction drops their hashes, so no lookup ever finds
    an overwritten block."""
    engine = StatefulImpl(config)
    coord = engine.engine.coord
    coord.drop_skipped = coord.free  # type: ignore[method-assign]
    engine.engine.finish = lambda request: None  # type: ignore[method-assign]
    return engine


CONTEXT_BLOCKS = 16


def short_context_keys(config: EngineConfig) -> StatefulImpl:
    """A block's key covers only the last 16 blocks of context (the block's own tokens
    and the 15 blocks before), not the whole prefix: prompts that differ only earlier
    find each other's blocks, and so does a prompt that repeats itself. (Blocks only:
    with a hash unit, keys are per unit.)"""
    if config.hash_unit is not None:
        raise Unsupported("whole blocks only")
    engine = StatefulImpl(config)
    for hasher in engine.engine.coord.hashers.values():
        hasher.hashes = functools.partial(keys_of_last_blocks, hasher.block_size, hasher.hashes)  # type: ignore[method-assign]
    return engine


def keys_of_last_blocks(
    size: int, hashes: Callable[[Sequence[int]], torch.Tensor], tokens: Sequence[int]
) -> torch.Tensor:
    """The key of every full block of ``tokens``: the whole-prefix key (``hashes``) of
    the block's tokens and the CONTEXT_BLOCKS - 1 blocks before it only."""
    keys = [
        int(hashes(tokens[max(0, k + 1 - CONTEXT_BLOCKS) * size : (k + 1) * size])[-1])
        for k in range(len(tokens) // size)
    ]
    return torch.tensor(keys, dtype=torch.int64)


def window_drop_keeps_hash(config: EngineConfig) -> StatefulImpl:
    """Blocks freed when they leave a window (or chunk) go back to the pool as plain
    free blocks, but their hash stays in the index: still findable after reuse."""
    engine = StatefulImpl(config)
    coord = engine.engine.coord
    drop = coord.drop_skipped

    def drop_forgetting(request: Request) -> None:
        before = [list(table) for table in request.tables]
        drop(request)
        for old, new in zip(before, request.tables):
            for block, kept in zip(old, new):
                if block != kept and coord.pool.ref_cnt[block] == 0:
                    coord.pool.key[block] = None  # the index entry is left behind

    coord.drop_skipped = drop_forgetting  # type: ignore[method-assign]
    return engine


def first_full_truncated(config: EngineConfig) -> StatefulImpl:
    """Of several full-attention groups, only the first is truncated to the common
    hit; the others keep every block of their own prefix hit. (Blocks only: with a
    hash unit its own hit is in units, a bug of another class.)"""
    if config.hash_unit is not None:
        raise Unsupported("whole blocks only")
    engine = StatefulImpl(config)
    coord = engine.engine.coord
    lookup = coord.find_longest_cache_hit

    def lookup_truncating_first(request: Request, max_length: int) -> CacheHit:
        hit = lookup(request, max_length)
        fulls = [i for i, g in enumerate(coord.groups) if g.kind == "full"]
        reused = list(hit.reused)
        for i in fulls[1:]:
            ids = coord.cached_ids(request)[i].tolist()
            top = coord.plan_for(request.num_tokens, max_length).lengths[-1].item()
            own = 0
            while own < top // coord.groups[i].block_size and ids[own] >= 0:
                own += 1
            reused[i] = ids[:own] if hit.length else []
        first = tuple(reused_range(g, hit.length)[0] if hit.length else 0 for g in coord.groups)
        return CacheHit(hit.length, first, reused)

    coord.find_longest_cache_hit = lookup_truncating_first  # type: ignore[method-assign]
    return engine


def forgetful_and_falls_over(config: EngineConfig) -> StatefulImpl:
    """:func:`forgetful_pool`'s bug, and every finish raises once it has freed the
    request's blocks: a program that ends in a stale block has usually crashed before."""
    engine = forgetful_pool(config)
    finish = engine.finish

    def finish_then_raise(request: int) -> None:
        finish(request)
        raise RuntimeError("fell over after finishing")

    engine.finish = finish_then_raise  # type: ignore[method-assign]
    return engine


def fails_to_start(config: EngineConfig) -> StatefulImpl:
    """An engine that cannot be created at all."""
    raise RuntimeError("no engine today")


class Interrupted(StatefulImpl):
    """An engine whose second admit is cut short by Ctrl-C."""

    def admit(self, request: int, tokens: Any) -> Admitted | Rejected:
        if self.requests:
            raise KeyboardInterrupt
        return super().admit(request, tokens)
