"""Hypothesis strategies for queries, for tests of your own target.

    from hypothesis import given
    from kvhit.harness.strategies import queries
    from kvhit.model.spec import longest_hit

    @given(queries())
    def test_my_engine(q):
        assert my_engine(q.to_json()) == longest_hit(q).length

Hypothesis shrinks a failure to a small query and keeps it in its example
database, so the next run tries it first. :func:`falsify` does all of that for a
target and hands back the shrunk query.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, assume, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.configuration import set_hypothesis_home_dir
from hypothesis.database import DirectoryBasedExampleDatabase

from kvhit.contract import BASE, Capabilities
from kvhit.harness.random_cases import CHOICES, EVERY, TIER_NAMES, Palette, make_group, palette
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Query, default_alignment

COIN = st.sampled_from((False,) * 7 + (True,) * 3)
"""True 30% of the time; shrinks towards False."""

HASH_UNITS = (1, 2)
"""The hash units drawn."""


@st.composite
def group_configs(
    draw: st.DrawFn,
    drawn: Palette = EVERY,
    block_sizes: Sequence[int] = (1, 2, 4),
    max_span: int = 4,
    least: int = 1,
) -> Group:
    """One group: a kind from the palette ``drawn`` (with the drafters it has for the
    kind), a block size from ``block_sizes``, a window or chunk of ``least`` tokens to
    ``max_span`` blocks, a lookahead of 0 to b + 1 tokens, a window's convention. The
    drafter and exclusive coins come up 30% of the time, as in
    :mod:`kvhit.harness.random_cases`, and shrink towards no drafter, inclusive."""
    return make_group(
        drawn,
        lambda options: draw(st.sampled_from(options)),
        lambda: draw(st.sampled_from(block_sizes)),
        lambda b: draw(st.integers(least, max(least, max_span * b))),
        lambda: draw(COIN),
        lambda b: draw(st.integers(0, b + 1)),
    )


def cache_rows(max_blocks: int) -> st.SearchStrategy[tuple[bool, ...]]:
    """A cache row of up to ``max_blocks`` blocks, mostly cached (holes are where hits
    go wrong); shrinks towards fewer blocks and uncached ones."""
    bit = st.sampled_from((False, True, True, True))
    return st.lists(bit, min_size=max_blocks // 2, max_size=max_blocks).map(tuple)


@st.composite
def partial_rows(draw: st.DrawFn, g: Group, max_blocks: int, unit: int) -> list[Any]:
    """A :func:`cache_rows` row of group g, with some blocks (30%) partially filled up
    to a fine boundary of the hash ``unit``, in protocol form (``{"upto": p}``);
    shrinks towards whole blocks and the first boundary."""
    per, b = g.block_size // unit, g.block_size
    out: list[Any] = []
    for j, bit in enumerate(draw(cache_rows(max_blocks))):
        partial = per > 1 and draw(COIN)
        out.append({"upto": j * b + unit * draw(st.integers(1, per - 1))} if partial else bit)
    return out


@st.composite
def tiers_of(draw: st.DrawFn, groups: Sequence[Group], rows: Sequence[Any]) -> list[Any]:
    """One or two external tiers (docs/design.md §1.7) over ``groups``, in protocol
    form: each holds some of their kinds and, for some groups of those, a row drawn as
    ``rows`` (one strategy per group)."""
    present = sorted({g.kind for g in groups})
    out = []
    for name in TIER_NAMES[: draw(st.integers(1, 2))]:
        holds = draw(st.sets(st.sampled_from(present), min_size=1))
        cached = {
            str(i): list(draw(row))
            for i, (g, row) in enumerate(zip(groups, rows))
            if g.kind in holds and draw(st.booleans())
        }
        out.append({"name": name, "holds": sorted(holds), "cached": cached})
    return out


@st.composite
def queries(
    draw: st.DrawFn,
    max_groups: int = 4,
    max_blocks: int = 8,
    kinds: Sequence[str] = CHOICES,
    capabilities: Capabilities = BASE,
) -> Query:
    """A valid query a target of ``capabilities`` can be asked, of the ``kinds``
    choices among them (:func:`kvhit.harness.random_cases.palette`), with up to
    ``max_groups`` groups, each with at most ``max_blocks`` blocks in reach of M; when
    the palette has a hash unit, 30% of them have a hash unit h of 1 or 2 tokens,
    blocks of 2h or 4h and partially filled blocks; when it has tiers, 30% of them
    have external tiers. Shrinks towards no hash unit, no tiers, fewer groups, a
    smaller M and fewer blocks."""
    drawn = palette(capabilities, kinds)
    unit = draw(st.sampled_from(HASH_UNITS)) if drawn.hash_units and draw(COIN) else None
    sizes = (1, 2, 4) if unit is None else (2 * unit, 4 * unit)
    groups = draw(st.lists(group_configs(drawn, sizes), min_size=1, max_size=max_groups))
    step = default_alignment(tuple(groups)) if unit is None else unit
    alignment = step * draw(st.integers(1, 2))
    reach = min(g.block_size for g in groups) * max_blocks
    max_length = draw(st.integers(0, max(0, reach)))
    extra = draw(st.integers(1, max(g.block_size for g in groups) + 1))
    blocks = [max_length // g.block_size + 1 for g in groups]
    rows = [
        cache_rows(n) if unit is None else partial_rows(g, n, unit) for g, n in zip(groups, blocks)
    ]
    shown: dict[str, Any] = {} if unit is None else {"hash_unit": unit}
    if drawn.tiers and draw(COIN):
        shown["tiers"] = draw(tiers_of(groups, rows))
    q = parse_query(
        {
            "groups": [g.to_json() for g in groups],
            "cached": [list(draw(r)) for r in rows],
            "max_length": max_length,
            "num_tokens": max_length + extra,
            "alignment": alignment,
            **shown,
        }
    )
    assume(drawn.refusal(q) is None)
    return q


def falsify(
    holds: Callable[[Query], bool],
    max_examples: int = 500,
    seed: int = 0,
    database: Path | None = None,
    strategy: st.SearchStrategy[Query] | None = None,
) -> Query | None:
    """The shrunk query on which ``holds`` is false, or None if Hypothesis found none.

    ``database`` is a folder for Hypothesis's example database (None: no database).
    """
    failing: list[Query] = []

    @settings(
        max_examples=max_examples,
        database=DirectoryBasedExampleDatabase(str(database)) if database else None,
        deadline=None,
        suppress_health_check=list(HealthCheck),
        print_blob=False,
    )
    @hypothesis_seed(seed)
    @given(strategy if strategy is not None else queries())
    def check(q: Query) -> None:
        if not holds(q):
            failing.append(q)
            raise AssertionError

    try:
        check()
    except AssertionError:
        return failing[-1]
    return None


@contextmanager
def hypothesis_files_in(directory: Path) -> Iterator[None]:
    """While inside, Hypothesis keeps its own files (the constants it reads in source
    files, any example database without a path of its own) in ``directory``, not in
    ``.hypothesis`` in the working directory."""
    set_hypothesis_home_dir(directory)
    try:
        yield
    finally:
        set_hypothesis_home_dir(None)
