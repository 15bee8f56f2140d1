"""Exhaustive enumeration of small scopes, with the reference side vectorized in torch.

A :class:`Scope` fixes the groups, M, T, A and perhaps a hash unit h; its states are
every cache state of the blocks a hit can touch (the blocks up to M, plus the next
one for an eagle group). Without a hash unit a block is cached or not; with one, a
block of b = k·h tokens has k + 1 *levels*: absent, partially filled up to each of
its k - 1 inner fine boundaries (:class:`kvhit.model.spec.Upto`), or cached. State
number ``code`` reads, digit by digit (group by group, block by block, the lowest
first), each block's level, so all states are ``0 … states - 1``; without a hash
unit the digits are bits, and block j of group g is bit ``offset[g] + j``.

L* for a whole batch of states costs one mask test per candidate on the states'
*fine* bitmaps (one bit per unit of h, :func:`kvhit.model.spec.fine_row`; the code
itself without a hash unit): a hit of L is valid for every group iff all units any
group needs at L are held, which is ``fine & need[L] == need[L]`` (and the request
holds every drafter's key at L). The masks come from the spec's own
``needed_blocks`` on the :func:`kvhit.model.spec.fine_query`.

    >>> from kvhit.model.spec import Group
    >>> scope = Scope.of((Group(Kind.SLIDING_WINDOW, 1, window=2),) * 2, max_length=2)
    >>> scope.states
    16
    >>> int(reference_lengths(scope, torch.tensor([0b0110]))[0])  # rows ".#" and "#."
    0
    >>> scope = Scope.of((Group(Kind.FULL, 2),), max_length=3, hash_unit=1)
    >>> scope.states, scope.query(5).cached  # levels 2 and 1: [True, Upto(3)]
    (9, ((True, Upto(end=3)),))
    >>> int(reference_lengths(scope, torch.tensor([5]))[0])
    3
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from itertools import combinations, product
from math import prod

import torch

from kvhit.contract import BASE, Capabilities
from kvhit.harness.random_cases import TIER_NAMES
from kvhit.model.spec import (
    Answer,
    Drafter,
    Group,
    Kind,
    Query,
    Tier,
    Upto,
    WindowConvention,
    answer_at,
    default_alignment,
    fine_query,
    fine_row,
    longest_hit,
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
        hash_unit: int | None = None,
        tiers: Sequence[frozenset[Kind]] = (),
    ) -> Scope:
        """The scope of ``groups`` at M = ``max_length`` (T and A default as in the
        protocol: M + 1, and the hash unit or else the lcm of the block sizes), with
        an external tier holding each of the kind sets ``tiers`` (a row for every group
        of a kind it holds)."""
        tokens = max_length + 1 if num_tokens is None else num_tokens
        default = default_alignment(groups) if hash_unit is None else hash_unit
        align = default if alignment is None else alignment
        rows = tuple(() for _ in groups)
        held = tuple(
            Tier(name, holds, tuple(() if g.kind in holds else None for g in groups))
            for name, holds in zip(TIER_NAMES, tiers)
        )
        return Scope(Query(groups, rows, max_length, tokens, align, hash_unit, held))

    @property
    def groups(self) -> tuple[Group, ...]:
        """The scope's groups."""
        return self.template.groups

    def blocks(self) -> list[int]:
        """How many blocks of each group a hit can touch."""
        return [touched_blocks(self.template, g) for g in self.groups]

    def units_of(self, g: Group) -> int:
        """How many hash units a block of group g holds (1 without a hash unit)."""
        h = self.template.hash_unit
        return 1 if h is None else g.block_size // h

    def units(self) -> list[int]:
        """:meth:`units_of` each group."""
        return [self.units_of(g) for g in self.groups]

    def rows(self) -> list[tuple[int | None, int]]:
        """The rows a state sets, in digit order: each group's local row (tier None),
        then each tier's row of each group it has one for (its index in the tiers)."""
        local: list[tuple[int | None, int]] = [(None, i) for i in range(len(self.groups))]
        return local + [
            (t, i)
            for t, tier in enumerate(self.template.tiers)
            for i, row in enumerate(tier.cached)
            if row is not None
        ]

    def offsets(self) -> list[int]:
        """The fine bit that holds unit 0 of each group's block 0 (in the held rows: a
        tier's row of a group shares the group's bits)."""
        out, at = [], 0
        for count, units in zip(self.blocks(), self.units()):
            out.append(at)
            at += count * units
        return out

    @property
    def states(self) -> int:
        """The number of cache states: the product of every block's levels, in every row."""
        blocks, units = self.blocks(), self.units()
        return prod((units[i] + 1) ** blocks[i] for _, i in self.rows())

    def need_mask(self, length: int) -> int | None:
        """The fine bits that must be set for a hit of ``length``; None if the request
        is too short for a drafter's key (an eagle group's next block, La tokens)."""
        fine = fine_query(self.template)
        mask = 0
        for g, at in zip(fine.groups, self.offsets()):
            if past_request(g, length, fine.num_tokens):
                return None
            for j in needed_blocks(g, length):
                mask |= 1 << (at + j)
        return mask

    def entry(self, g: Group, j: int, level: int) -> bool | Upto:
        """Block j of group g at ``level``: absent, partial up to ``level`` units, or
        cached."""
        units = self.units_of(g)
        if 0 < level < units:
            return Upto(j * g.block_size + level * (g.block_size // units))
        return level == units

    def digits(self, code: int) -> Iterator[tuple[int | None, int, int, int]]:
        """(tier or None, group, block, level) of every block of every row of state
        ``code``, in digit order."""
        blocks, units = self.blocks(), self.units()
        for t, i in self.rows():
            for j in range(blocks[i]):
                code, level = divmod(code, units[i] + 1)
                yield t, i, j, level

    def query(self, code: int) -> Query:
        """The query of state ``code``."""
        tiers = self.template.tiers
        rows: list[list[list[bool | Upto]]] = [[[] for _ in self.groups] for _ in (None, *tiers)]
        for t, i, j, level in self.digits(code):
            rows[0 if t is None else t + 1][i].append(self.entry(self.groups[i], j, level))
        held = tuple(
            replace(
                tier,
                cached=tuple(
                    tuple(r) if c is not None else None for r, c in zip(kept, tier.cached)
                ),
            )
            for tier, kept in zip(tiers, rows[1:])
        )
        return replace(self.template, cached=tuple(map(tuple, rows[0])), tiers=held)

    def fine_codes(self, codes: torch.Tensor) -> torch.Tensor:
        """The fine bitmaps of the *held* rows of the states ``codes`` (the codes
        themselves without a hash unit or tiers): each block's level, looked up as its
        units' bits, in every row that holds the group."""
        h = self.template.hash_unit
        if h is None and not self.template.tiers:
            return codes
        out, rest = torch.zeros_like(codes), codes.clone()
        blocks, units, offsets = self.blocks(), self.units(), self.offsets()
        for _, i in self.rows():
            g, levels = self.groups[i], units[i] + 1
            bits = [fine_row(g, (self.entry(g, 0, k),), h or g.block_size) for k in range(levels)]
            table = torch.tensor([sum(b << n for n, b in enumerate(row)) for row in bits])
            for j in range(blocks[i]):
                out |= table[rest % levels] << (offsets[i] + j * units[i])
                rest = rest // levels
        return out


FINE_BITS = 62
"""The most fine bits a state's bitmap may have to fit an int64."""


def reference_lengths(scope: Scope, codes: torch.Tensor) -> torch.Tensor:
    """L* of every state in ``codes`` (an int64 tensor), by one mask test per candidate;
    a scope whose fine bitmaps do not fit an int64 (a block of many hash units) asks
    the spec state by state instead."""
    if sum(b * u for b, u in zip(scope.blocks(), scope.units())) > FINE_BITS:
        return torch.tensor([longest_hit(scope.query(c)).length for c in codes.tolist()])
    fine = scope.fine_codes(codes)
    best = torch.zeros_like(codes)
    for length in reversed(scope.template.candidates()):
        mask = scope.need_mask(length)
        if mask is not None and length > 0:
            best.masked_fill_(fine & mask == mask, length)  # longer valid lengths come later
    return best


def cases(scope: Scope) -> Iterator[tuple[Query, Answer]]:
    """Every state of ``scope`` with its reference answer, in code order."""
    answers = {L: answer_at(scope.template, L) for L in scope.template.candidates()}
    for start in range(0, scope.states, STATES_PER_BATCH):
        codes = torch.arange(start, min(start + STATES_PER_BATCH, scope.states), dtype=torch.int64)
        for code, length in zip(codes.tolist(), reference_lengths(scope, codes).tolist()):
            yield scope.query(code), answers[length]


def gate_groups() -> list[Group]:
    """Small groups of every kind, with windows and chunks on and off block boundaries,
    and drafters of each behaviour (a lookahead of 2 tokens, so that T = M + 1 keeps
    the last candidate from some keys). The window reaching 2 tokens back at b = 1 is
    stated in the exclusive convention (SGLang's w = 2, the KV of vLLM's w = 3), so
    both conventions are enumerated."""
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
        Group(Kind.SLIDING_WINDOW, 2, window=3, drafter=Drafter.NONE),
        Group(Kind.FULL, 1, drafter=Drafter.LOOKAHEAD, lookahead=2),
        Group(Kind.MAMBA, 1, drafter=Drafter.LOOKAHEAD, lookahead=2),
    ]


def unit_groups() -> list[Group]:
    """Small groups of every kind whose blocks hold two hash units of 1 token (a full
    and a Mamba block hold four: a Mamba block whose states sit at several fine
    boundaries), with a drop and a lookahead drafter: where sub-block hits and
    partially filled blocks change L*."""
    return [
        Group(Kind.FULL, 2),
        Group(Kind.FULL, 4),
        Group(Kind.SLIDING_WINDOW, 2, window=2),
        Group(Kind.SLIDING_WINDOW, 2, window=4),
        Group(Kind.CHUNKED_LOCAL, 2, chunk=3),
        Group(Kind.MAMBA, 2),
        Group(Kind.MAMBA, 4),
        Group(Kind.FULL, 2, drafter=Drafter.DROP),
        Group(Kind.MAMBA, 2, drafter=Drafter.LOOKAHEAD, lookahead=2),
    ]


def tier_groups() -> list[Group]:
    """One group of each kind at b = 1, for the tiered scopes."""
    return [
        Group(Kind.FULL, 1),
        Group(Kind.SLIDING_WINDOW, 1, window=2),
        Group(Kind.CHUNKED_LOCAL, 1, chunk=2),
        Group(Kind.MAMBA, 1),
    ]


TIER_MAX_LENGTH = 1
"""M of the tiered scopes: the smallest at which their states separate L* from every
known-wrong tier combination (:data:`kvhit.model.algorithms.WRONG_TIER_COMBINATIONS`)
and from the answer of the pool alone (a test keeps it so)."""


def tiered_scopes(max_length: int = TIER_MAX_LENGTH) -> list[Scope]:
    """Each :func:`tier_groups` group alone and every ordered pair, at M =
    ``max_length``, with one external tier holding each non-empty set of their kinds:
    where a hit assembled across the pool and a tier goes wrong (docs/design.md §1.7)."""
    out = []
    for groups in [*((g,) for g in tier_groups()), *product(tier_groups(), repeat=2)]:
        kinds = sorted({g.kind for g in groups})
        for size in range(1, len(kinds) + 1):
            for holds in combinations(kinds, size):
                out.append(Scope.of(groups, max_length, tiers=[frozenset(holds)]))
    return out


def gate_scopes(max_length: int = 4, capabilities: Capabilities = BASE) -> list[Scope]:
    """The gate's scopes a target of ``capabilities`` can be asked (each checked once,
    on its configuration; rules that read rows are the caller's, state by state): each small group alone with M = ``max_length``, and every
    ordered pair with M one less (to keep the count of states small); then the same
    for the :func:`unit_groups` with a hash unit of 1 token, at M one more and with
    unordered pairs; then, when it takes tiers, the :func:`tiered_scopes`."""
    groups = gate_groups()
    singles = [Scope.of((g,), max_length) for g in groups]
    pairs = [Scope.of(pair, max_length - 1) for pair in product(groups, repeat=2)]
    fine = unit_groups()
    m = max_length + 1
    fine_singles = [Scope.of((g,), m, hash_unit=1) for g in fine]
    fine_pairs = [Scope.of(pair, m - 1, hash_unit=1) for pair in combinations(fine, 2)]
    tiered = tiered_scopes() if capabilities.tiers else []
    every = singles + pairs + fine_singles + fine_pairs + tiered
    return [scope for scope in every if capabilities.configuration_refusal(scope.template) is None]
