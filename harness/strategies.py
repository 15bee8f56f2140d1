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

from collections.abc import Callable, Sequence
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st
from hypothesis.database import DirectoryBasedExampleDatabase

from kvhit.harness.random_cases import CHOICES, make_group
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Group, Query, default_alignment

COIN = st.sampled_from((False,) * 7 + (True,) * 3)
"""True 30% of the time; shrinks towards False."""


@st.composite
def group_configs(
    draw: st.DrawFn,
    kinds: Sequence[str] = CHOICES,
    block_sizes: Sequence[int] = (1, 2, 4),
    max_span: int = 4,
    least: int = 1,
) -> Group:
    """One group: a kind from ``kinds`` (``eagle`` allows eagle flags), a block size
    from ``block_sizes``, a window or chunk of ``least`` tokens to ``max_span`` blocks,
    a window's convention. The eagle and exclusive coins come up 30% of the time, as in
    :mod:`kvhit.harness.random_cases`, and shrink towards no eagle, inclusive."""
    return make_group(
        kinds,
        lambda options: draw(st.sampled_from(options)),
        lambda: draw(st.sampled_from(block_sizes)),
        lambda b: draw(st.integers(least, max(least, max_span * b))),
        lambda: draw(COIN),
    )


def cache_rows(max_blocks: int) -> st.SearchStrategy[tuple[bool, ...]]:
    """A cache row of up to ``max_blocks`` blocks, mostly cached (holes are where hits
    go wrong); shrinks towards fewer blocks and uncached ones."""
    bit = st.sampled_from((False, True, True, True))
    return st.lists(bit, min_size=max_blocks // 2, max_size=max_blocks).map(tuple)


@st.composite
def queries(
    draw: st.DrawFn,
    max_groups: int = 4,
    max_blocks: int = 8,
    kinds: Sequence[str] = CHOICES,
) -> Query:
    """A valid query of up to ``max_groups`` groups, each with at most ``max_blocks``
    blocks in reach of M. Shrinks towards fewer groups, a smaller M and fewer blocks."""
    groups = draw(st.lists(group_configs(kinds), min_size=1, max_size=max_groups))
    alignment = default_alignment(tuple(groups)) * draw(st.integers(1, 2))
    reach = min(g.block_size for g in groups) * max_blocks
    max_length = draw(st.integers(0, max(0, reach)))
    extra = draw(st.integers(1, max(g.block_size for g in groups) + 1))
    rows = [draw(cache_rows(max_length // g.block_size + 1)) for g in groups]
    return parse_query(
        {
            "groups": [g.to_json() for g in groups],
            "cached": [list(r) for r in rows],
            "max_length": max_length,
            "num_tokens": max_length + extra,
            "alignment": alignment,
        }
    )


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
