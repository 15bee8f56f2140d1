"""Exhaustive enumeration of small scopes, with the reference side vectorized in torch.

A :class:`Scope` fixes the groups, M, T and A; its states are every cache bitmap of
the blocks a hit can touch (the blocks up to M, plus the next one for an eagle
group). State number ``code`` caches block j of group g iff bit ``offset[g] + j``
of ``code`` is set, so all states are ``0 … 2^bits - 1``.

L* for a whole batch of states costs one mask test per candidate: a hit of L is
valid for every group iff all blocks any group needs at L are cached, which is
``code & need[L] == need[L]`` (and, for an eagle group, the request holds the next
block). The masks come from the spec's own ``needed_blocks``.

    >>> from kvhit.model.spec import Group
    >>> scope = Scope.of((Group(Kind.SLIDING_WINDOW, 1, window=2),) * 2, max_length=2)
    >>> scope.states
    16
    >>> int(reference_lengths(scope, torch.tensor([0b0110]))[0])  # rows ".#" and "#."
    0
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import product

import torch

from kvhit.model.spec import (
    Answer,
    Drafter,
    Group,
    Kind,
    Query,
    WindowConvention,
    answer_at,
    default_alignment,
    needed_blocks,
    past_request,
    touched_blocks,
)

STATES_PER_BATCH = 1 << 20


@dataclass(frozen=True)
class Scope:
    """Groups and limits whose every cache state is enumerated: ``template`` is the
    query with its rows left empty."""

    template: Query

    @staticmethod
    def of(
        groups: tuple[Group, ...],
        max_length: int,
        num_tokens: int | None = None,
        alignment: int | None = None,
    ) -> Scope:
        """The scope of ``groups`` at M = ``max_length`` (T and A default as in the
        protocol: M + 1 and the lcm of the block sizes)."""
        tokens = max_length + 1 if num_tokens is None else num_tokens
        align = default_alignment(groups) if alignment is None else alignment
        return Scope(Query(groups, tuple(() for _ in groups), max_length, tokens, align))

    @property
    def groups(self) -> tuple[Group, ...]:
        """The scope's groups."""
        return self.template.groups

    def blocks(self) -> list[int]:
        """How many blocks of each group a hit can touch."""
        return [touched_blocks(self.template, g) for g in self.groups]

    def offsets(self) -> list[int]:
        """The bit of ``code`` that holds block 0 of each group."""
        out, at = [], 0
        for count in self.blocks():
            out.append(at)
            at += count
        return out

    @property
    def states(self) -> int:
        """The number of cache states: 2 to the number of blocks."""
        return 1 << sum(self.blocks())

    def need_mask(self, length: int) -> int | None:
        """The bits that must be set for a hit of ``length``; None if the request is
        too short for an eagle group's next block."""
        mask = 0
        for g, at in zip(self.groups, self.offsets()):
            if past_request(g, length, self.template.num_tokens):
                return None
            for j in needed_blocks(g, length):
                mask |= 1 << (at + j)
        return mask

    def query(self, code: int) -> Query:
        """The query of state ``code``."""
        rows = tuple(
            tuple(bool(code >> (at + j) & 1) for j in range(count))
            for at, count in zip(self.offsets(), self.blocks())
        )
        return replace(self.template, cached=rows)


def reference_lengths(scope: Scope, codes: torch.Tensor) -> torch.Tensor:
    """L* of every state in ``codes`` (an int64 tensor), by one mask test per candidate."""
    best = torch.zeros_like(codes)
    for length in reversed(scope.template.candidates()):
        mask = scope.need_mask(length)
        if mask is not None and length > 0:
            best.masked_fill_(codes & mask == mask, length)  # longer valid lengths come later
    return best


def cases(scope: Scope) -> Iterator[tuple[Query, Answer]]:
    """Every state of ``scope`` with its reference answer, in code order."""
    answers = {L: answer_at(scope.template, L) for L in scope.template.candidates()}
    for start in range(0, scope.states, STATES_PER_BATCH):
        codes = torch.arange(start, min(start + STATES_PER_BATCH, scope.states), dtype=torch.int64)
        for code, length in zip(codes.tolist(), reference_lengths(scope, codes).tolist()):
            yield scope.query(code), answers[length]


def gate_groups() -> list[Group]:
    """Small groups of every kind, with windows and chunks on and off block boundaries.
    The window reaching 2 tokens back at b = 1 is stated in the exclusive convention
    (SGLang's w = 2, the KV of vLLM's w = 3), so both conventions are enumerated."""
    return [
        Group(Kind.FULL, 1),
        Group(Kind.SLIDING_WINDOW, 1, window=1),
        Group(Kind.SLIDING_WINDOW, 1, window=2),
        Group(Kind.SLIDING_WINDOW, 1, window=2, window_convention=WindowConvention.EXCLUSIVE),
        Group(Kind.SLIDING_WINDOW, 2, window=3),
        Group(Kind.CHUNKED_LOCAL, 1, chunk=2),
        Group(Kind.CHUNKED_LOCAL, 2, chunk=3),
        Group(Kind.MAMBA, 1),
        Group(Kind.FULL, 1, drafter=Drafter.DROP),
        Group(Kind.FULL, 2, drafter=Drafter.DROP),
        Group(Kind.SLIDING_WINDOW, 1, window=2, drafter=Drafter.DROP),
    ]


def gate_scopes(max_length: int = 4) -> list[Scope]:
    """The gate's scopes: each small group alone with M = ``max_length``, and every
    ordered pair with M one less (to keep the count of states small)."""
    groups = gate_groups()
    singles = [Scope.of((g,), max_length) for g in groups]
    pairs = [Scope.of(pair, max_length - 1) for pair in product(groups, repeat=2)]
    return singles + pairs
