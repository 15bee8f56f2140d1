"""The exact spec of a windowed prefix-cache hit (docs/design.md §1).

A query is a cache state: for each KV cache group, which of its blocks are cached.
A hit of length L (a multiple of the alignment A, at most M) lets the engine skip
computing tokens 0 … L-1. Group g can serve it only if every block it needs at L is
cached. The needed blocks are always one contiguous run, ``[lo, hi)``:

    kind              blocks needed at L = n·b (none when L = 0)
    full              0 … n-1
    sliding_window w  max(0, n-k) … n-1,   k = ceil(t/b), t = window_before(g)
    chunked_local c   floor(s/b) … n-1,    s = floor(L/c)·c
    mamba             n-1                  (the state at the boundary L)

A group may carry a speculative drafter (:class:`Drafter`): ``drop`` (an eagle group)
also needs its next unit u after L cached (block n, matched by hash, then dropped so
the drafter recomputes it; with a hash unit h, u = h), and the request must hold that
whole unit: L + u ≤ T; ``lookahead`` needs its
key at L to exist, L + La ≤ T; ``none`` needs nothing more.

With a hash unit h (a query's ``hash_unit``, dividing every block size), hits are
multiples of the alignment, which may be smaller than a block, and a cached block may
be *partial*, holding its tokens only up to a fine boundary (:class:`Upto`). Such a
query means what its :func:`fine_query` means: every group at block size h, one bit
per unit of h tokens (for Mamba, per state), so every rule above applies unchanged.

A query may name external *tiers* (:class:`Tier`: a KV connector's store, a host
cache) that hold blocks of some groups. A block is *held* when the local row or a
tier's row has it, and the query means what its :func:`held_query` means: the rows
folded together, so every rule above applies to tiered queries unchanged.

A window is read by its group's *window convention*: ``inclusive`` (vLLM's, the
default: a window of w tokens includes the token itself, so it reaches t = w-1 tokens
back) or ``exclusive`` (SGLang's ``sliding_window_size``: w counts only the tokens
before it, t = w). The same KV is needed either way: exclusive w is inclusive w+1.

    >>> g = Group("sliding_window", block_size=1, window=2)
    >>> reused_blocks(g, 4)
    [3]
    >>> valid(g, [False, False, False, True, True], 4, 5)
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from math import lcm
from typing import Any

from kvhit.model.ops import PY, Ops


class Kind(StrEnum):
    """The attention kind of a KV cache group (docs/design.md §1.1). A member equals
    its name as a string, so protocol objects compare and print as before.

    >>> Kind("sliding_window") is Kind.SLIDING_WINDOW, f"{Kind.MAMBA}"
    (True, 'mamba')
    """

    FULL = "full"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MAMBA = "mamba"


KINDS = tuple(Kind)


class Drafter(StrEnum):
    """What a group's speculative drafter needs of a hit (docs/design.md §1.3).

    ``drop`` (EAGLE/MTP with the eagle drop): match one more unit (a block, or a hash
    unit) and drop it, so the drafter recomputes the token whose KV depends on the
    next one. ``none``: a drafter whose KV needs nothing more (vLLM's DFlash, DSpark).
    ``lookahead``: keys cover the next La tokens too, so a key exists only for hits
    of at most T − La and nothing is dropped.
    """

    DROP = "drop"
    NONE = "none"
    LOOKAHEAD = "lookahead"


DRAFTERS: dict[Kind, tuple[Drafter, ...]] = {
    Kind.FULL: tuple(Drafter),
    Kind.SLIDING_WINDOW: tuple(Drafter),
    Kind.CHUNKED_LOCAL: (Drafter.NONE, Drafter.LOOKAHEAD),
    Kind.MAMBA: (Drafter.NONE, Drafter.LOOKAHEAD),
}
"""The drafter behaviours each kind can carry: a drop needs the next block's KV
matched and recomputed, which only attention over whole blocks (full, sliding
window) does; no engine drafts with Mamba or chunked layers."""

EAGLE_KINDS = tuple(k for k in KINDS if Drafter.DROP in DRAFTERS[k])
"""The kinds an eagle group (a ``drop`` drafter) can have."""

PARAMETERS: dict[Kind, str | None] = {
    Kind.FULL: None,
    Kind.SLIDING_WINDOW: "window",
    Kind.CHUNKED_LOCAL: "chunk",
    Kind.MAMBA: None,
}
"""The :class:`Group` field each kind reads besides its block size (None: none)."""


class WindowConvention(StrEnum):
    """How a sliding window's size is counted (docs/design.md §1.1).

    ``inclusive`` (vLLM's): the window of w tokens includes the token itself, which
    sees keys p-w+1 … p. ``exclusive`` (SGLang's ``sliding_window_size``): w counts
    the tokens before it, so the token sees keys p-w … p.
    """

    INCLUSIVE = "inclusive"
    EXCLUSIVE = "exclusive"


WINDOW_CONVENTIONS = tuple(WindowConvention)


@dataclass(frozen=True)
class Group:
    """One KV cache group: its attention kind, block size and kind parameters.

    Fields may hold symbolic integers when the proof suite runs the model. ``kind``
    may be given as a string; a string that names no kind is a ValueError.
    """

    kind: Kind  # a string naming a kind is converted
    block_size: Any
    window: Any = None
    chunk: Any = None
    drafter: Drafter | None = None
    lookahead: Any = field(default=0, repr=False)
    window_convention: WindowConvention = field(default=WindowConvention.INCLUSIVE, repr=False)

    def __post_init__(self) -> None:
        # Groups are rebuilt for every normal form of every query: convert only strings.
        if type(self.kind) is not Kind:
            object.__setattr__(self, "kind", Kind(self.kind))
        if self.drafter is not None and type(self.drafter) is not Drafter:
            object.__setattr__(self, "drafter", Drafter(self.drafter))
        if type(self.window_convention) is not WindowConvention:
            object.__setattr__(self, "window_convention", WindowConvention(self.window_convention))

    def __repr__(self) -> str:
        shown = ", ".join(f"{f.name}={getattr(self, f.name)!r}" for f in fields(self) if f.repr)
        lookahead = f", lookahead={self.lookahead!r}" if self.drafter == Drafter.LOOKAHEAD else ""
        convention = f", window_convention={self.window_convention!r}" if self.exclusive else ""
        return f"Group({shown}{lookahead}{convention})"

    @property
    def eagle(self) -> bool:
        """Whether the group's drafter drops one unit (an eagle group)."""
        return self.drafter == Drafter.DROP

    @property
    def exclusive(self) -> bool:
        """Whether the window follows the exclusive convention (SGLang's)."""
        return self.window_convention == WindowConvention.EXCLUSIVE

    def describe(self) -> str:
        """A short label such as ``sliding_window w=2 b=1``."""
        parameter = PARAMETERS[self.kind]
        shown = f" {parameter[0]}={getattr(self, parameter)}" if parameter else ""
        convention = " exclusive" if self.exclusive else ""
        return f"{self.kind}{shown}{convention} b={self.block_size}{self.drafter_label()}"

    def drafter_label(self) -> str:
        """`` eagle``, `` drafter=none`` or `` lookahead=La`` (empty: no drafter)."""
        if self.drafter is None:
            return ""
        if self.drafter == Drafter.DROP:
            return " eagle"
        if self.drafter == Drafter.LOOKAHEAD:
            return f" lookahead={self.lookahead}"
        return f" drafter={self.drafter}"

    def to_json(self) -> dict[str, Any]:
        """The group as a normalized protocol object."""
        out: dict[str, Any] = {"kind": self.kind, "block_size": self.block_size}
        parameter = PARAMETERS[self.kind]
        if parameter is not None:
            out[parameter] = getattr(self, parameter)
        if self.kind == Kind.SLIDING_WINDOW and self.exclusive:
            out["window_convention"] = self.window_convention
        out["eagle"] = self.eagle
        if self.drafter is not None:
            out["drafter"] = self.drafter
        if self.drafter == Drafter.LOOKAHEAD:
            out["lookahead"] = self.lookahead
        return out


def group_of(
    kind: Kind,
    block_size: Any,
    span: Any = None,
    drafter: Drafter | None = None,
    window_convention: WindowConvention = WindowConvention.INCLUSIVE,
) -> Group:
    """A group of ``kind`` whose parameter (:data:`PARAMETERS`: its window or chunk,
    if it reads one) is ``span``; ``span`` is dropped for a kind that reads none.

    >>> group_of(Kind.CHUNKED_LOCAL, 2, 6), group_of(Kind.FULL, 2, 6)
    (Group(kind=<Kind.CHUNKED_LOCAL: 'chunked_local'>, block_size=2, window=None, chunk=6, drafter=None), Group(kind=<Kind.FULL: 'full'>, block_size=2, window=None, chunk=None, drafter=None))
    """
    parameter = PARAMETERS[kind]
    params = {parameter: span} if parameter is not None else {}
    return Group(kind, block_size, drafter=drafter, window_convention=window_convention, **params)


@dataclass(frozen=True)
class Upto:
    """A partially filled cached block: it holds its tokens up to ``end``, a fine
    boundary inside the block (for a Mamba group: the state at ``end``). Only a query
    with a hash unit has one; it is not a bit, so code that reads rows as bits must
    read the :func:`fine_query` (asking for its truth is a TypeError)."""

    end: int

    def __bool__(self) -> bool:
        raise TypeError("a partial block is not a bit: read the query's fine_query")

    def to_json(self) -> dict[str, int]:
        """The protocol form, ``{"upto": end}``."""
        return {"upto": self.end}


LOCAL = "local"
"""The name of the engine's own pool among the places a block is loaded from."""


@dataclass(frozen=True)
class Tier:
    """An external store the engine can restore KV from (docs/design.md §1.7): a KV
    connector's store, a host cache. ``holds`` is the kinds it can hold; ``cached`` has
    one entry per group of the query: a row like a local one, or None where the tier
    holds nothing of that group."""

    name: str
    holds: frozenset[Kind]
    cached: tuple[Any, ...]

    def to_json(self) -> dict[str, Any]:
        """The protocol form: rows keyed by group index, kinds in a fixed order."""
        return {
            "name": self.name,
            "holds": [k.value for k in Kind if k in self.holds],
            "cached": {
                str(i): [shown_entry(e) for e in row]
                for i, row in enumerate(self.cached)
                if row is not None
            },
        }


@dataclass(frozen=True)
class Query:
    """A cache state and the limits of one lookup (docs/design.md §1.1).

    ``cached[g][j]`` tells whether block j of group g is cached; blocks past the end
    of a row are not. Build one with :func:`kvhit.model.protocol.parse_query` to get
    the input checked.
    """

    groups: tuple[Group, ...]
    cached: tuple[Any, ...]  # tuples of bits (symbolic rows when the proofs run the model)
    max_length: int
    num_tokens: int
    alignment: int
    hash_unit: int | None = None
    tiers: tuple[Tier, ...] = ()

    @property
    def top(self) -> int:
        """The longest candidate: the largest multiple of A that is at most M."""
        return top_length(self)

    def candidates(self) -> range:
        """Every candidate hit length, longest first."""
        return range(self.top, -1, -self.alignment)

    def to_json(self) -> dict[str, Any]:
        """The query as a normalized protocol object (what targets receive)."""
        out = {
            "groups": [g.to_json() for g in self.groups],
            "cached": [[shown_entry(e) for e in row] for row in self.cached],
            "max_length": self.max_length,
            "num_tokens": self.num_tokens,
            "alignment": self.alignment,
        }
        if self.hash_unit is not None:
            out["hash_unit"] = self.hash_unit
        if self.tiers:
            out["tiers"] = [t.to_json() for t in self.tiers]
        return out


def shown_entry(entry: Any) -> Any:
    """A row entry in protocol form: itself, or ``{"upto": end}`` for a partial block."""
    return entry.to_json() if isinstance(entry, Upto) else entry


def fine_row(g: Group, row: Any, unit: int) -> tuple[bool, ...]:
    """Group g's row at hash-unit granularity: one bit per ``unit`` tokens.

    For attention, bit i says the tokens [i·h, (i+1)·h) are held: a cached block
    sets all its units, a partial one those before its end. For Mamba, bit i says the
    state at (i+1)·h is held: a cached block's state is at its end, a partial one's
    at its fine boundary.

    >>> fine_row(Group("full", 4), (True, Upto(6)), 2), fine_row(Group("mamba", 4), (True, Upto(6)), 2)
    ((True, True, True, False), (False, True, True, False))
    """
    per = g.block_size // unit
    out: list[bool] = []
    for j, entry in enumerate(row):
        if isinstance(entry, Upto):
            held = (entry.end - j * g.block_size) // unit
        else:
            held = per if PY.bit(row, j) else 0
        if g.kind == Kind.MAMBA:
            out += [i == held - 1 for i in range(per)]
        else:
            out += [i < held for i in range(per)]
    return tuple(out)


def held_row(rows: list[Any], ops: Ops = PY) -> tuple[Any, ...]:
    """Bit rows folded into one: entry j is held when some row holds it.

    >>> held_row([(True, False), (False, False, True)])
    (True, False, True)
    """
    width = max(len(row) for row in rows)
    return tuple(
        ops.or_(*(ops.bit(row, j) if j < len(row) else False for row in rows)) for j in range(width)
    )


def local_query(q: Query) -> Query:
    """What the engine holds itself: the query without its tiers."""
    return replace(q, tiers=())


def held_query(q: Query, ops: Ops = PY) -> Query:
    """The query with every tier folded into its rows (docs/design.md §1.7): a block is
    held when the local row or some tier's row holds it (with a hash unit, unit by
    unit, so its result has no hash unit). Itself when it has no tiers. A hit is valid
    for the query iff it is valid for this one.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}], "cached": ["10"],
    ...                  "tiers": [{"name": "cpu", "holds": ["full"], "cached": {"0": "01"}}],
    ...                  "max_length": 2})
    >>> held_query(q).cached, longest_hit(q).length, longest_hit(local_query(q)).length
    (((True, True),), 2, 1)
    """
    if not q.tiers:
        return q
    local = fine_query(local_query(q))
    tiers = [fine_query(replace(q, cached=tier_rows(t), tiers=())).cached for t in q.tiers]
    rows = tuple(held_row([row, *(t[i] for t in tiers)], ops) for i, row in enumerate(local.cached))
    return replace(local, cached=rows)


def tier_rows(t: Tier) -> tuple[Any, ...]:
    """A tier's rows, one per group, with an empty row where it has none."""
    return tuple(() if row is None else row for row in t.cached)


def fine_query(q: Query, ops: Ops = PY) -> Query:
    """The query at hash-unit granularity (itself when it has no hash unit): every
    group at block size h with its :func:`fine_row`, every other field the same. A
    hit is valid for the query iff it is valid for this one (docs/design.md §1.6).
    A tiered query's tiers are folded in first (:func:`held_query`, over ``ops``).

    >>> q = Query((Group("full", 4),), ((True, Upto(6)),), 7, 8, 2, hash_unit=2)
    >>> fine_query(q).cached, longest_hit(q)
    (((True, True, True, False),), Answer(length=6, blocks=((0, 1),)))
    """
    if q.tiers:
        return held_query(q, ops)
    if q.hash_unit is None:
        return q
    h = q.hash_unit
    return replace(
        q,
        groups=tuple(replace(g, block_size=h) for g in q.groups),
        cached=tuple(fine_row(g, row, h) for g, row in zip(q.groups, q.cached)),
        hash_unit=None,
    )


def coarse_answer(q: Query, fine: Answer) -> Answer:
    """An answer of :func:`fine_query` in q's own blocks: each unit's block."""
    if q.hash_unit is None:
        return fine
    blocks = tuple(
        tuple(sorted({i * q.hash_unit // g.block_size for i in units}))
        for g, units in zip(q.groups, fine.blocks)
    )
    return Answer(fine.length, blocks)


def top_length(q: Query, ops: Ops = PY) -> Any:
    """The longest candidate, floor(M/A)·A (a term when M or A is one).

    >>> top_length(Query((Group("full", 2),), ((),), 7, 8, 2))
    6
    """
    return ops.div(q.max_length, q.alignment) * q.alignment


def default_alignment(groups: tuple[Group, ...]) -> int:
    """The lcm of the block sizes (vLLM's scheduler block size)."""
    return lcm(*(g.block_size for g in groups)) if groups else 1


def window_before(g: Group) -> Any:
    """t: how many tokens before a token its sliding window reaches back to: w-1 under
    the inclusive convention (window 1 is the token alone), w under the exclusive one.

    >>> window_before(Group("sliding_window", 1, window=4))
    3
    >>> window_before(Group("sliding_window", 1, window=4, window_convention="exclusive"))
    4
    """
    return g.window if g.exclusive else g.window - 1


def inclusive_window(g: Group) -> Any:
    """The inclusive window that needs the same KV as g's: w, or w+1 for an exclusive
    window (what an engine that counts windows as vLLM does must be given).

    >>> inclusive_window(Group("sliding_window", 1, window=4, window_convention="exclusive"))
    5
    """
    return window_before(g) + 1


def window_span(g: Group, ops: Ops = PY) -> Any:
    """k = ceil(t/b), t = :func:`window_before`: how many blocks before the hit a
    sliding window reaches into (ceil((w-1)/b) under the inclusive convention)."""
    return ops.div(window_before(g) + g.block_size - 1, g.block_size)


def full_first(g: Group, length: Any, n: Any, ops: Ops) -> Any:
    """Full attention reuses every block from block 0."""
    return 0


def sliding_window_first(g: Group, length: Any, n: Any, ops: Ops) -> Any:
    """A sliding window reuses the k blocks before the hit (:func:`window_span`)."""
    return ops.max(0, n - window_span(g, ops))


def chunked_local_first(g: Group, length: Any, n: Any, ops: Ops) -> Any:
    """Chunked local attention reuses the blocks from its chunk's start on."""
    return ops.div(ops.div(length, g.chunk) * g.chunk, g.block_size)


def mamba_first(g: Group, length: Any, n: Any, ops: Ops) -> Any:
    """Mamba reuses the state at the boundary: the last block only."""
    return n - 1


FIRST_REUSED: dict[Kind, Callable[[Group, Any, Any, Ops], Any]] = {
    Kind.FULL: full_first,
    Kind.SLIDING_WINDOW: sliding_window_first,
    Kind.CHUNKED_LOCAL: chunked_local_first,
    Kind.MAMBA: mamba_first,
}
"""Per kind, lo of :func:`reused_range`: the first block reused at a hit of ``length``
tokens, n = length/b blocks (the table in the module docstring)."""


def reused_range(g: Group, length: Any, ops: Ops = PY) -> tuple[Any, Any]:
    """The blocks ``[lo, hi)`` group g reuses at a hit of ``length`` > 0 tokens."""
    n = ops.div(length, g.block_size)
    return FIRST_REUSED[g.kind](g, length, n, ops), n


def reused_blocks(g: Group, length: int) -> list[int]:
    """The block indices group g reuses at a hit of ``length`` tokens."""
    if length == 0:
        return []
    lo, hi = reused_range(g, length)
    return list(range(lo, hi))


def needed_range(g: Group, length: int) -> tuple[int, int]:
    """The blocks ``[lo, hi)`` that must be cached for a hit of ``length`` > 0: the
    reused ones and, for an eagle group, the next one."""
    lo, hi = reused_range(g, length)
    return lo, hi + 1 if g.eagle else hi


def touched_blocks(q: Query, g: Group) -> int:
    """How many blocks of group g a hit of at most M can need: those up to the longest
    candidate (the last perhaps in part), and for an eagle group the next one."""
    return -(-q.top // g.block_size) + int(g.eagle)


def key_reach(g: Group) -> Any:
    """How many tokens past a hit the group's key must cover: an eagle group's next
    block (b), a lookahead drafter's La, else none."""
    if g.eagle:
        return g.block_size
    return g.lookahead if g.drafter == Drafter.LOOKAHEAD else 0


def holds_key(g: Group, length: Any, num_tokens: Any) -> Any:
    """Whether the request holds the tokens g's key at ``length`` covers (tokens
    L … L + :func:`key_reach` - 1): an eagle group's dropped block, a lookahead key."""
    return length + key_reach(g) <= num_tokens


def past_request(g: Group, length: int, num_tokens: int) -> bool:
    """Whether g's key at ``length`` > 0 reaches past the request (an eagle group's
    dropped block, a lookahead key), so it cannot serve that hit whatever is cached."""
    return length > 0 and not holds_key(g, length, num_tokens)


def needed_blocks(g: Group, length: int) -> list[int]:
    """The blocks that must be cached for the hit: the reused ones, and for an eagle
    group also block n, which is matched and then dropped."""
    return list(range(*needed_range(g, length))) if length else []


def valid(g: Group, row: Any, length: Any, num_tokens: Any, ops: Ops = PY) -> Any:
    """valid_g(L): group g can serve a hit of ``length`` tokens from cache."""
    lo, hi = reused_range(g, length, ops)
    served = ops.all_cached(row, lo, hi + 1 if g.eagle else hi)
    if g.drafter in (Drafter.DROP, Drafter.LOOKAHEAD):
        served = ops.and_(served, holds_key(g, length, num_tokens))
    return ops.or_(length == 0, served)


def valid_all(q: Query, length: int) -> bool:
    """Whether every group can serve a hit of ``length`` tokens."""
    fine = fine_query(q)
    return all(valid(g, row, length, q.num_tokens) for g, row in zip(fine.groups, fine.cached))


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
    fine = fine_query(q)
    return coarse_answer(
        q, Answer(length, tuple(tuple(reused_blocks(g, length)) for g in fine.groups))
    )


def last_cached(row: Any) -> int:
    """One past the last cached block of a row (0 when none is cached)."""
    return next((j + 1 for j in range(len(row) - 1, -1, -1) if row[j]), 0)


def reach(g: Group, row: Any) -> int | None:
    """The longest hit group g can be valid at with the blocks of ``row``, or None when
    hits past the row can still be valid for it.

    Every hit L > 0 of a full, mamba or sliding-window (window > 1) group needs block
    L/b - 1 and an eagle group also block L/b, so past its last cached block nothing is
    valid. A window of one token needs no block, and a chunked local group needs none
    at multiples of its chunk: those have no reach.

    >>> reach(Group("full", 2), (True, True, False)), reach(Group("full", 2, drafter="drop"), "11")
    (4, 2)
    >>> reach(Group("chunked_local", 1, chunk=4), "1") is None
    True
    """
    blocks = last_cached(row)
    if g.eagle:
        return max(0, blocks - 1) * g.block_size
    if g.kind == Kind.CHUNKED_LOCAL or (g.kind == Kind.SLIDING_WINDOW and window_span(g) == 0):
        return None
    return blocks * g.block_size


def reduced(q: Query) -> tuple[Query, int]:
    """A query with the same answer whose M is within the rows, and the shift s between
    them: L*(q) = L*(reduced) + s, the blocks reused at L* are the same, and so is each
    group's finder result from the top. So reference computations take time in the
    rows, not in M/A.

    When some group has a reach (:func:`reach`), no hit past the smallest reach is
    valid, so M is clamped there (s = 0). Otherwise every group is a chunked local
    group or a one-token window; past the rows, a candidate is valid iff it is a
    multiple of P = lcm(A, the chunks), and those reuse no block. Then M (and T) move
    down by a multiple of P to just above the rows, which shifts every answer by s.

    >>> q = Query((Group("full", 1),), ((True,),), 10**12, 10**12 + 1, 1)
    >>> small, shift = reduced(q)
    >>> small.max_length, shift
    (1, 0)
    >>> q = Query((Group("chunked_local", 2, chunk=6),), ((),), 10**12, 10**12 + 1, 2)
    >>> small, shift = reduced(q)
    >>> small.max_length, shift, longest_hit(q).length == longest_hit(small).length + shift
    (10, 999999999990, True)

    A lookahead key cuts the top at T − La before the shift, so the answer (18, a
    multiple of the chunk) is not taken from inside the rows (4 + 18 = 22):

    >>> g = Group("chunked_local", 1, chunk=9, drafter="lookahead", lookahead=4)
    >>> longest_hit(Query((g,), ((True,) * 4,), 28, 29, 1)).length
    18
    """
    assert q.hash_unit is None, "reduce the fine_query"
    # No hit past T minus a key's reach is valid; clamping first keeps the shift below
    # from moving the top under the rows' end (a lookahead group has no reach).
    keys_end = min(q.max_length, *(q.num_tokens - key_reach(g) for g in q.groups))
    q = replace(q, max_length=max(0, keys_end))
    reaches = [r for r in map(reach, q.groups, q.cached) if r is not None]
    if reaches:
        return replace(q, max_length=min(q.max_length, *reaches)), 0
    period = lcm(q.alignment, *(g.chunk for g in q.groups if g.kind == Kind.CHUNKED_LOCAL))
    rows_end = max(last_cached(row) * g.block_size for g, row in zip(q.groups, q.cached))
    first = (rows_end // period + 1) * period  # the first multiple of P past every row
    shift = max(0, (q.max_length - first) // period * period)
    return replace(q, max_length=q.max_length - shift, num_tokens=q.num_tokens - shift), shift


def longest_hit(q: Query) -> Answer:
    """L*, the longest valid hit, found by trying every candidate (the spec itself) of
    the :func:`reduced` query."""
    small, shift = reduced(fine_query(q))
    best = next(L for L in small.candidates() if valid_all(small, L))
    return coarse_answer(q, Answer(best + shift, answer_at(small, best).blocks))


@dataclass(frozen=True)
class Miss:
    """Why group ``group`` cannot serve a hit: the runs of needed blocks that are not
    cached, or (eagle) that the request does not hold the block that would be dropped."""

    group: int
    missing: tuple[range, ...]
    past_request: bool = False


def missing_runs(row: Any, lo: int, hi: int) -> tuple[range, ...]:
    """The runs of uncached blocks in ``[lo, hi)``, in time in the row's length.

    >>> missing_runs((True, False, False, True), 0, 10**9)
    (range(1, 3), range(4, 1000000000))
    """
    end = min(hi, len(row))
    runs: list[range] = []
    for j in range(lo, end):
        if not row[j]:
            if runs and runs[-1].stop == j:
                runs[-1] = range(runs[-1].start, j + 1)
            else:
                runs.append(range(j, j + 1))
    if hi > max(lo, end):
        start = max(lo, end)
        if runs and runs[-1].stop == start:
            start = runs.pop().start
        runs.append(range(start, hi))
    return tuple(runs)


def misses(q: Query, length: int) -> list[Miss]:
    """For each group that cannot serve ``length``, why not (empty when valid); with a
    hash unit, the missing runs are in units of it (:func:`fine_query`)."""
    out = []
    fine = fine_query(q)
    for i, (g, row) in enumerate(zip(fine.groups, fine.cached)):
        if valid(g, row, length, q.num_tokens):
            continue
        missing = missing_runs(row, *needed_range(g, length)) if length else ()
        out.append(Miss(i, missing, past_request(g, length, q.num_tokens)))
    return out
