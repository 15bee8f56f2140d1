"""A fast seeded random generator of queries: the same seed and capabilities give the
same queries.

A target is drawn only what it declares (docs/design.md §5.2): its
:class:`~kvhit.contract.Capabilities`, narrowed by a user's ``--kinds`` choices, make a
:class:`Palette` (kinds, drafters, window conventions, hash units, tiers), and a query
its capability rules refuse is drawn again, counted by the rule's reason.

Windows, chunks, M and the cache density are drawn near the values where hits
change: windows and chunks around multiples of the block size, M around multiples
of the alignment, and rows that are mostly cached with a few holes. About 30% of the
windows are exclusive (SGLang's convention), the rest inclusive; about 30% of the
groups carry a drafter (any behaviour their kind can have, :data:`DRAFTERS`), and
about a quarter of the queries have a hash unit h finer than their blocks, with
some blocks partially filled (:class:`kvhit.model.spec.Upto`); for a target that
takes tiers, four queries in five have external tiers (:func:`random_tiers`).

    >>> a = [q.to_json() for q in random_queries(seed=3, count=5)]
    >>> b = [q.to_json() for q in random_queries(seed=3, count=5)]
    >>> a == b
    True
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from itertools import count as forever
from math import lcm
from typing import Any

from kvhit.contract import BASE, Capabilities, Rule
from kvhit.model.spec import (
    DRAFTERS,
    EAGLE_KINDS,
    KINDS,
    PARAMETERS,
    Drafter,
    Group,
    Kind,
    Query,
    Tier,
    Upto,
    WindowConvention,
    group_of,
)


class Choice(StrEnum):
    """What a generator may draw: a kind (one member per :class:`Kind`, of the same
    name and value), ``eagle`` (drop drafters, on the kinds that can drop),
    ``drafter`` (every drafter behaviour each kind can carry: drop, none, lookahead
    with its La) or ``hash_unit`` (a hash unit finer than the blocks, and partially
    filled blocks). Every choice is drawn by default."""

    FULL = "full"
    SLIDING_WINDOW = "sliding_window"
    CHUNKED_LOCAL = "chunked_local"
    MAMBA = "mamba"
    EAGLE = "eagle"
    DRAFTER = "drafter"
    HASH_UNIT = "hash_unit"


CHOICES = tuple(Choice)


def drafters_for(kinds: Sequence[str], kind: Kind) -> tuple[Drafter, ...]:
    """The drafters a group of ``kind`` may be drawn with under the choices ``kinds``.

    >>> drafters_for(["mamba", "eagle"], Kind.MAMBA), drafters_for(["drafter"], Kind.MAMBA)
    ((), (<Drafter.NONE: 'none'>, <Drafter.LOOKAHEAD: 'lookahead'>))
    """
    if Choice.DRAFTER in kinds:
        return DRAFTERS[kind]
    return (Drafter.DROP,) if Choice.EAGLE in kinds and kind in EAGLE_KINDS else ()


def choices(names: Iterable[str]) -> tuple[Choice, ...]:
    """``names`` as choices; ValueError naming the first that is none (the message
    says *kind*, what most choices are).

    >>> choices(["mamba", "eagle"])
    (<Choice.MAMBA: 'mamba'>, <Choice.EAGLE: 'eagle'>)
    >>> choices(["slidingwindow"])
    Traceback (most recent call last):
    ...
    ValueError: unknown kind 'slidingwindow'; choose from full, sliding_window, chunked_local, mamba, eagle, drafter, hash_unit
    """
    out = []
    for name in names:
        if name not in CHOICES:
            raise ValueError(f"unknown kind {name!r}; choose from {', '.join(CHOICES)}")
        out.append(Choice(name))
    return tuple(out)


def kinds_of(picked: Sequence[Choice]) -> list[Kind]:
    """The kinds among the choices (full when none is picked, only ``eagle`` say)."""
    return [Kind(k) for k in picked if k in KINDS] or [Kind.FULL]


@dataclass(frozen=True)
class Palette:
    """What a generator draws for one target: the kinds, the drafters each kind may
    carry, the window conventions, whether a hash unit and external tiers, all from the
    target's :class:`~kvhit.contract.Capabilities` narrowed by a user's choices
    (:func:`palette`); and the capability rules a drawn query must pass.

    >>> p = palette(Capabilities(kinds=["full", "mamba"], hash_units=False), ["mamba", "eagle"])
    >>> p.kinds, p.drafters_for(Kind.MAMBA), p.hash_units
    ((<Kind.MAMBA: 'mamba'>,), (), False)
    """

    kinds: tuple[Kind, ...]
    drafters: Mapping[Kind, tuple[Drafter, ...]]
    conventions: tuple[WindowConvention, ...]
    hash_units: bool
    tiers: bool
    rules: tuple[Rule, ...] = ()

    def drafters_for(self, kind: Kind) -> tuple[Drafter, ...]:
        """The drafters a group of ``kind`` may be drawn with."""
        return self.drafters.get(kind, ())

    def only(self, kinds: Iterable[Kind], drafters: bool = True) -> Palette:
        """This palette with groups of ``kinds`` alone (those it has), without drafters
        unless ``drafters``."""
        kept = tuple(k for k in self.kinds if k in set(kinds))
        carried = {k: self.drafters_for(k) for k in kept} if drafters else {}
        return replace(self, kinds=kept, drafters=carried)

    def refusal(self, q: Query) -> str | None:
        """Why a capability rule refuses ``q`` (the declared data it meets by
        construction), or None."""
        for rule in self.rules:
            why = rule.refuses(q)
            if why is not None:
                return why
        return None


def palette(capabilities: Capabilities = BASE, picked: Iterable[str] = CHOICES) -> Palette:
    """What may be drawn for a target of ``capabilities`` under the choices ``picked``
    (a user's ``--kinds``, a further narrowing): the kinds both allow (a sliding window
    only with a convention it takes), drafters as :func:`drafters_for` the choices
    allow and the capabilities take, a hash unit when both allow one, tiers when the
    capabilities take them. ValueError for a choice that is none, or when nothing is
    left to draw.

    >>> palette(Capabilities(kinds=["full"]), ["mamba"])
    Traceback (most recent call last):
    ...
    ValueError: the target takes none of the kinds picked (mamba); it takes full
    """
    chosen = choices(picked)
    conventions = tuple(c for c in WindowConvention if c in capabilities.conventions)
    takes = [k for k in Kind if k in capabilities.kinds]
    if not conventions and Kind.SLIDING_WINDOW in takes:
        takes.remove(Kind.SLIDING_WINDOW)
    wanted = kinds_of(chosen)
    kinds = tuple(k for k in wanted if k in takes)
    if not kinds:
        names = ", ".join(k.value for k in wanted)
        raise ValueError(
            f"the target takes none of the kinds picked ({names}); it takes {', '.join(takes)}"
        )
    drafters = {
        k: tuple(d for d in drafters_for(chosen, k) if d in capabilities.drafters) for k in kinds
    }
    return Palette(
        kinds,
        drafters,
        conventions,
        Choice.HASH_UNIT in chosen and capabilities.hash_units,
        capabilities.tiers,
        capabilities.rules,
    )


EVERY = palette()
"""The palette of the base language and every choice: what an undeclared target is drawn."""

DRAWN_BLOCK_SIZES = (1, 1, 1, 2, 4)


def near(rng: random.Random, unit: int, top: int) -> int:
    """A value >= 1 within one of a multiple of ``unit`` up to about ``top``."""
    return max(1, unit * rng.randint(0, max(1, top // unit)) + rng.randint(-1, 1))


def make_group(
    drawn: Palette,
    pick: Callable[[Sequence[Any]], Any],
    block_size: Callable[[], int],
    span: Callable[[int], int],
    coin: Callable[[], bool],
    lookahead: Callable[[int], int] = lambda b: b,
) -> Group:
    """One group: its kind picked from the palette ``drawn``, then its ``block_size()``
    b, then a window or chunk of ``span(b)`` tokens; when the palette has drafters for
    the kind and ``coin()`` says so, a drafter picked from those, with La =
    ``lookahead(b)`` for a lookahead one; a window is exclusive (SGLang's convention)
    when a last ``coin()`` says so, else inclusive (that coin is tossed only when the
    palette takes both conventions). Every generator builds its groups here, each
    drawing its own way (its coin's False, the common case, shrinks first).

    >>> make_group(palette(picked=["sliding_window", "eagle"]), min, lambda: 2, lambda b: b + 1, lambda: True)
    Group(kind=<Kind.SLIDING_WINDOW: 'sliding_window'>, block_size=2, window=3, chunk=None, drafter=<Drafter.DROP: 'drop'>, window_convention=<WindowConvention.EXCLUSIVE: 'exclusive'>)
    >>> last = lambda options: options[-1]
    >>> make_group(palette(picked=["mamba", "drafter"]), last, lambda: 2, min, lambda: True, lambda b: 3)
    Group(kind=<Kind.MAMBA: 'mamba'>, block_size=2, window=None, chunk=None, drafter=<Drafter.LOOKAHEAD: 'lookahead'>, lookahead=3)
    """
    kind = pick(drawn.kinds)
    b = block_size()
    parameter = span(b) if PARAMETERS[kind] is not None else None
    allowed = drawn.drafters_for(kind)
    drafter = pick(allowed) if allowed and coin() else None
    convention = WindowConvention.INCLUSIVE
    if kind == Kind.SLIDING_WINDOW:
        both = len(drawn.conventions) > 1
        exclusive = coin() if both else drawn.conventions == (WindowConvention.EXCLUSIVE,)
        convention = WindowConvention.EXCLUSIVE if exclusive else WindowConvention.INCLUSIVE
    group = group_of(kind, b, parameter, drafter, convention)
    return replace(group, lookahead=lookahead(b)) if drafter == Drafter.LOOKAHEAD else group


def random_group(
    rng: random.Random, drawn: Palette, max_blocks: int, b: int, least: int = 1
) -> Group:
    """One group of block size ``b``, windows and chunks near multiples of ``b`` (and
    at least ``least`` tokens), a lookahead drafter's La from 0 to b + 1."""
    return make_group(
        drawn,
        rng.choice,
        lambda: b,
        lambda b: max(least, near(rng, b, b * max_blocks)),
        lambda: rng.random() < 0.3,
        lambda b: rng.randint(0, b + 1),
    )


def random_row(rng: random.Random, blocks: int) -> tuple[bool, ...]:
    """A cache row of about ``blocks`` blocks, mostly cached or sparse."""
    density = rng.choice((0.5, 0.8, 0.95))
    length = max(0, blocks + rng.randint(-1, 1))
    return tuple(rng.random() < density for _ in range(length))


def partial_row(
    rng: random.Random, row: Sequence[bool], b: int, unit: int
) -> tuple[bool | Upto, ...]:
    """``row`` with a fifth of its blocks partially filled, each up to a fine boundary
    of ``unit`` inside it drawn at random (none when a block is one unit).

    >>> partial_row(random.Random(1), (True, False, True, True), 4, 1)
    (Upto(end=1), False, True, True)
    """
    if b == unit:
        return tuple(row)
    return tuple(
        Upto(j * b + unit * rng.randint(1, b // unit - 1)) if rng.random() < 0.2 else bit
        for j, bit in enumerate(row)
    )


DRAWN_UNITS = (1, 1, 2)
"""The hash units drawn; each block size is then a multiple of the unit."""


def unit_and_sizes(rng: random.Random, drawn: Palette, groups: int) -> tuple[int | None, list[int]]:
    """A hash unit (a quarter of the time, when the palette has one) and ``groups``
    block sizes, the first a common size that most others share: without a unit from
    :data:`DRAWN_BLOCK_SIZES`, with unit h multiples of h, the common one 2h or 4h."""
    unit = rng.choice(DRAWN_UNITS) if drawn.hash_units and rng.random() < 0.25 else None
    sizes = DRAWN_BLOCK_SIZES if unit is None else tuple(unit * m for m in (1, 2, 2, 4))
    common = rng.choice(sizes[1:] if unit is not None else sizes)
    others = [common if rng.random() < 0.7 else rng.choice(sizes) for _ in range(groups - 1)]
    return unit, [common, *others]


def random_query(rng: random.Random, max_blocks: int = 8, drawn: Palette = EVERY) -> Query:
    """One random query from the palette ``drawn`` with at most ``max_blocks`` blocks
    per group in reach of M; when the palette has tiers, with external tiers four
    times in five (:func:`random_tiers`).

    Built directly, valid by construction (the tests check it against the parser), as
    generating cases is the harness's own share of a campaign's time.
    """
    unit, sizes = unit_and_sizes(rng, drawn, rng.randint(1, 4))
    groups = tuple(random_group(rng, drawn, max_blocks, b) for b in sizes)
    step = lcm(*sizes) if unit is None else unit
    alignment = step * rng.choice((1, 1, 1, 2))
    reach = min(sizes) * max_blocks
    max_length = alignment * rng.randint(0, max(1, reach // alignment)) + rng.randint(-1, 1)
    max_length = max(0, min(max_length, reach))
    num_tokens = max_length + 1 + rng.choice((0, 0, 0, 1, sizes[0]))
    rows = [random_row(rng, max_length // b + 1) for b in sizes]
    cached = tuple(
        rows if unit is None else (partial_row(rng, r, b, unit) for r, b in zip(rows, sizes))
    )
    q = Query(groups, cached, max_length, num_tokens, alignment, unit)
    return replace(q, tiers=random_tiers(rng, q)) if drawn.tiers and rng.random() < 0.8 else q


TIER_NAMES = ("cpu", "remote")


def random_tiers(rng: random.Random, q: Query) -> tuple[Tier, ...]:
    """One or two external tiers for ``q`` (docs/design.md §1.7): each holds some of
    the query's kinds and rows for some groups of those kinds, drawn as local rows
    are.

    >>> q = random_query(random.Random(3))
    >>> tiers = random_tiers(random.Random(3), q)
    >>> all(t.cached[i] is None or g.kind in t.holds for t in tiers for i, g in enumerate(q.groups))
    True
    """
    kinds = sorted({g.kind for g in q.groups})
    tiers = []
    for name in TIER_NAMES[: rng.randint(1, 2)]:
        holds = frozenset(k for k in kinds if rng.random() < 0.7) or frozenset(kinds[:1])
        rows = []
        for g in q.groups:
            bits = random_row(rng, q.max_length // g.block_size + 1)
            row = bits if q.hash_unit is None else partial_row(rng, bits, g.block_size, q.hash_unit)
            rows.append(row if g.kind in holds and rng.random() < 0.8 else None)
        tiers.append(Tier(name, holds, tuple(rows)))
    return tuple(tiers)


class QueryShape(StrEnum):
    """Which rows a generator draws where capabilities cannot say it: ``any`` (every
    mix the palette allows), or only states one engine's structure can hold
    (``sglang``: :func:`sglang_query`; ``sglang-hicache``: the same split between
    SGLang's device and its host tier, :func:`sglang_hicache_query`). Whether tiers
    are drawn is the target's capabilities' to say (``tiers``)."""

    ANY = "any"
    SGLANG = "sglang"
    SGLANG_HICACHE = "sglang-hicache"


def prefix_blocks(row: Sequence[bool]) -> int:
    """How many blocks the row caches before its first hole.

    >>> prefix_blocks((True, True, False, True))
    2
    """
    return next((j for j, bit in enumerate(row) if not bit), len(row))


def sglang_partners(drawn: Palette, b: int) -> list[Kind]:
    """The kinds of the palette SGLang's tree holds beside its full group at block
    size ``b``: a sliding window, or Mamba (at b = 1 only)."""
    allowed = (Kind.SLIDING_WINDOW, Kind.MAMBA) if b == 1 else (Kind.SLIDING_WINDOW,)
    return [k for k in allowed if k in drawn.kinds]


def sglang_query(rng: random.Random, max_blocks: int = 8, drawn: Palette = EVERY) -> Query:
    """A random query SGLang's radix tree can hold (:mod:`kvhit.engines.sglang.target`): a
    full group and, from the palette, perhaps a sliding window (sometimes with a second
    one on the same row: its drafter's window) and perhaps a Mamba group, in any
    order; one block size b = A; a full row of F cached blocks from block 0 and
    nothing after; window and Mamba bits within those F blocks, the Mamba state after
    block F - 1 cached; windows of at least 2 tokens (SGLang needs t >= 1).

    >>> rng = random.Random(0)
    >>> all(len(q.groups) <= 4 for q in (sglang_query(rng) for _ in range(50)))
    True
    """
    b = rng.choice(DRAWN_BLOCK_SIZES)
    groups = [Group(Kind.FULL, b)]
    windows = 0
    if Kind.SLIDING_WINDOW in drawn.kinds and rng.random() < 0.6:
        windows = 2 if rng.random() < 0.2 else 1
    windowed = drawn.only([Kind.SLIDING_WINDOW], drafters=False)
    for _ in range(windows):
        groups.append(random_group(rng, windowed, max_blocks, b, least=2))
    if Kind.MAMBA in drawn.kinds and rng.random() < (0.5 if windows else 0.8):
        groups.append(Group(Kind.MAMBA, b))
    max_length = max(0, min(b * rng.randint(0, max_blocks) + rng.randint(-1, 1), b * max_blocks))
    full = prefix_blocks(random_row(rng, max_length // b + 1))
    window_row = (random_row(rng, full) + (False,) * full)[:full]
    states = (random_row(rng, full) + (False,) * full)[:full]
    rows = [(True,) * full] + [window_row] * windows
    if groups[-1].kind == Kind.MAMBA:
        rows.append(states[:-1] + (True,) if full else states)
    order = list(range(len(groups)))
    rng.shuffle(order)
    num_tokens = max_length + 1 + rng.choice((0, 0, 0, 1, b))
    return Query(
        tuple(groups[i] for i in order), tuple(rows[i] for i in order), max_length, num_tokens, b
    )


def sglang_hicache_query(rng: random.Random, max_blocks: int = 8, drawn: Palette = EVERY) -> Query:
    """A :func:`sglang_query` split between SGLang's device and one host tier as its
    HiCache holds it (:mod:`kvhit.engines.sglang.hicache`): the device (the local rows)
    holds full blocks 0 … D-1 and the window and Mamba bits below D; the tier ``host``
    holds the full blocks and the window and Mamba bits from D on, and some of those
    below D (backed-up copies of what the device holds). Its held rows are the
    :func:`sglang_query`'s.

    >>> q = sglang_hicache_query(random.Random(4))
    >>> [t.name for t in q.tiers], all(t.holds <= {"full", "sliding_window", "mamba"} for t in q.tiers)
    (['host'], True)
    """
    q = sglang_query(rng, max_blocks, drawn)
    full = prefix_blocks(q.cached[[g.kind for g in q.groups].index(Kind.FULL)])
    device = rng.randint(0, full)
    local = tuple(
        (True,) * device if g.kind == Kind.FULL else tuple(row[:device])
        for g, row in zip(q.groups, q.cached)
    )
    host = tuple(
        tuple(bit and (j >= device or rng.random() < 0.5) for j, bit in enumerate(row))
        for row in q.cached
    )
    tier = Tier("host", frozenset(g.kind for g in q.groups), host)
    return replace(q, cached=local, tiers=(tier,))


DRAWERS: dict[QueryShape, Callable[[random.Random, int, Palette], Query]] = {
    QueryShape.ANY: random_query,
    QueryShape.SGLANG: sglang_query,
    QueryShape.SGLANG_HICACHE: sglang_hicache_query,
}

MAX_REDRAWS = 1000
"""How many drawn queries in a row a target's rules may refuse before the generator
gives up (its rules refuse nearly all it declares)."""


def askable(
    draw: Callable[[], Query], drawn: Palette, redrawn: Counter[str] | None = None
) -> Query:
    """A query from ``draw()`` that the palette's rules allow: one they refuse is drawn
    again (at most :data:`MAX_REDRAWS` times; ValueError then), each refusal counted in
    ``redrawn`` by its reason."""
    why = None
    for _ in range(MAX_REDRAWS):
        q = draw()
        why = drawn.refusal(q)
        if why is None:
            return q
        if redrawn is not None:
            redrawn[why] += 1
    raise ValueError(f"the target's rules refused {MAX_REDRAWS} drawn queries in a row: {why}")


def random_queries(
    seed: int,
    count: int | None = None,
    max_blocks: int = 8,
    kinds: Iterable[str] = CHOICES,
    shape: str = QueryShape.ANY,
    capabilities: Capabilities = BASE,
    redrawn: Counter[str] | None = None,
) -> Iterator[Query]:
    """``count`` random queries of ``shape`` (endless when None) that a target of
    ``capabilities`` can be asked, of the ``kinds`` choices among them (:func:`palette`);
    the queries its rules refuse are drawn again and counted in ``redrawn`` by reason.
    The same for the same arguments.

    >>> full_only = Capabilities(kinds=["full"], hash_units=False)
    >>> drawn = list(random_queries(1, 200, capabilities=full_only))
    >>> {g.kind for q in drawn for g in q.groups}, {q.hash_unit for q in drawn}
    ({<Kind.FULL: 'full'>}, {None})
    """
    rng = random.Random(seed)
    drawer = DRAWERS[QueryShape(shape)]
    drawn = palette(capabilities, kinds)
    for _ in range(count) if count is not None else forever():
        if drawn.rules:
            yield askable(lambda: drawer(rng, max_blocks, drawn), drawn, redrawn)
        else:
            yield drawer(rng, max_blocks, drawn)
