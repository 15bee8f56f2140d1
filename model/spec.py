"""The exact spec of a windowed prefix-cache hit (docs/design.md §1).

A query is a cache state: for each KV cache group, which of its blocks are cached.
A hit of length L (a multiple of the alignment A, at most M) lets the engine skip
computing tokens 0 … L-1. Group g can serve it only if every block it needs at L is
cached. The needed blocks are always one contiguous run, ``[lo, hi)``:

    kind              blocks needed at L = n·b (none when L = 0)
    full              0 … n-1
    sliding_window w  max(0, n-k) … n-1,   k = ceil((w-1)/b)
    chunked_local c   floor(s/b) … n-1,    s = floor(L/c)·c
    mamba             n-1                  (the state at the boundary L)

An eagle group also needs its next block n (matched by hash, then dropped so the
drafter recomputes it), and the request must hold that whole block: L + b ≤ T.

    >>> g = Group("sliding_window", block_size=1, window=2)
    >>> reused_blocks(g, 4)
    [3]
    >>> valid(g, [False, False, False, True, True], 4, 5)
    True
"""

from __future__ import annotations

from dataclasses import dataclass
from math import lcm
from typing import Any

from kvhit.model.ops import PY, Ops

KINDS = ("full", "sliding_window", "chunked_local", "mamba")
EAGLE_KINDS = ("full", "sliding_window")


@dataclass(frozen=True)
class Group:
    """One KV cache group: its attention kind, block size and kind parameters.

    Fields may hold symbolic integers when the proof suite runs the model.
    """

    kind: str
    block_size: Any
    window: Any = None
    chunk: Any = None
    eagle: bool = False

    def describe(self) -> str:
        """A short label such as ``sliding_window w=2 b=1``."""
        params = {"sliding_window": f" w={self.window}", "chunked_local": f" c={self.chunk}"}
        eagle = " eagle" if self.eagle else ""
        return f"{self.kind}{params.get(self.kind, '')} b={self.block_size}{eagle}"

    def to_json(self) -> dict[str, Any]:
        """The group as a normalized protocol object."""
        out: dict[str, Any] = {"kind": self.kind, "block_size": self.block_size}
        if self.kind == "sliding_window":
            out["window"] = self.window
        if self.kind == "chunked_local":
            out["chunk"] = self.chunk
        out["eagle"] = self.eagle
        return out


@dataclass(frozen=True)
class Query:
    """A cache state and the limits of one lookup (docs/design.md §1.1).

    ``cached[g][j]`` tells whether block j of group g is cached; blocks past the end
    of a row are not. Build one with :func:`kvhit.model.protocol.parse_query` to get
    the input checked.
    """

    groups: tuple[Group, ...]
    cached: tuple[tuple[bool, ...], ...]
    max_length: int
    num_tokens: int
    alignment: int

    @property
    def top(self) -> int:
        """The longest candidate: the largest multiple of A that is at most M."""
        return self.max_length // self.alignment * self.alignment

    def candidates(self) -> range:
        """Every candidate hit length, longest first."""
        return range(self.top, -1, -self.alignment)

    def to_json(self) -> dict[str, Any]:
        """The query as a normalized protocol object (what targets receive)."""
        return {
            "groups": [g.to_json() for g in self.groups],
            "cached": [list(row) for row in self.cached],
            "max_length": self.max_length,
            "num_tokens": self.num_tokens,
            "alignment": self.alignment,
        }


def default_alignment(groups: tuple[Group, ...]) -> int:
    """The lcm of the block sizes (vLLM's scheduler block size)."""
    return lcm(*(g.block_size for g in groups)) if groups else 1


def window_span(g: Group, ops: Ops = PY) -> Any:
    """k = ceil((w-1)/b): how many blocks before the hit a sliding window reaches into.

    The window includes the token itself, so window 1 needs no earlier block.
    """
    return ops.div(g.window - 1 + g.block_size - 1, g.block_size)


def reused_range(g: Group, length: Any, ops: Ops = PY) -> tuple[Any, Any]:
    """The blocks ``[lo, hi)`` group g reuses at a hit of ``length`` > 0 tokens."""
    n = ops.div(length, g.block_size)
    if g.kind == "full":
        return 0, n
    if g.kind == "sliding_window":
        return ops.max(0, n - window_span(g, ops)), n
    if g.kind == "chunked_local":
        chunk_start = ops.div(length, g.chunk) * g.chunk
        return ops.div(chunk_start, g.block_size), n
    if g.kind == "mamba":
        return n - 1, n
    raise ValueError(f"unknown kind {g.kind!r}")


def reused_blocks(g: Group, length: int) -> list[int]:
    """The block indices group g reuses at a hit of ``length`` tokens."""
    if length == 0:
        return []
    lo, hi = reused_range(g, length)
    return list(range(lo, hi))


def needed_blocks(g: Group, length: int) -> list[int]:
    """The blocks that must be cached for the hit: the reused ones, and for an eagle
    group also block n, which is matched and then dropped."""
    blocks = reused_blocks(g, length)
    if g.eagle and length > 0:
        blocks.append(length // g.block_size)
    return blocks


def valid(g: Group, row: Any, length: Any, num_tokens: Any, ops: Ops = PY) -> Any:
    """valid_g(L): group g can serve a hit of ``length`` tokens from cache."""
    lo, hi = reused_range(g, length, ops)
    if g.eagle:
        served = ops.and_(ops.all_cached(row, lo, hi + 1), length + g.block_size <= num_tokens)
    else:
        served = ops.all_cached(row, lo, hi)
    return ops.or_(length == 0, served)


def valid_all(q: Query, length: int) -> bool:
    """Whether every group can serve a hit of ``length`` tokens."""
    return all(valid(g, row, length, q.num_tokens) for g, row in zip(q.groups, q.cached))


@dataclass(frozen=True)
class Answer:
    """A hit length and, per group, the block indices reused at it."""

    length: int
    blocks: tuple[tuple[int, ...], ...]

    def to_json(self) -> dict[str, Any]:
        """The answer in the target protocol's dict form."""
        return {"length": self.length, "blocks": [list(b) for b in self.blocks]}


def answer_at(q: Query, length: int) -> Answer:
    """The answer a correct engine gives when it settles on ``length``."""
    return Answer(length, tuple(tuple(reused_blocks(g, length)) for g in q.groups))


def longest_hit(q: Query) -> Answer:
    """L*, the longest valid hit, found by trying every candidate (the spec itself)."""
    return answer_at(q, next(L for L in q.candidates() if valid_all(q, L)))


@dataclass(frozen=True)
class Miss:
    """Why group ``group`` cannot serve a hit: the needed blocks that are not cached,
    or (eagle) that the request does not hold the block that would be dropped."""

    group: int
    missing: tuple[int, ...]
    past_request: bool = False


def misses(q: Query, length: int) -> list[Miss]:
    """For each group that cannot serve ``length``, why not (empty when valid)."""
    out = []
    for i, (g, row) in enumerate(zip(q.groups, q.cached)):
        if valid(g, row, length, q.num_tokens):
            continue
        missing = tuple(j for j in needed_blocks(g, length) if not PY.bit(row, j))
        out.append(Miss(i, missing, past_request=g.eagle and length + g.block_size > q.num_tokens))
    return out
