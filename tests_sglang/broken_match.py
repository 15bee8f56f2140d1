"""A pytest plugin (``-p broken_match``) that breaks SGLang's prefix match for the
export tests: ``UnifiedRadixCache.match_prefix`` is asked one page less than the key
it is given (a lost-reuse bug where the hit would reach the key's end). As a plugin
it breaks the match for the whole run; :func:`broken` breaks it for a block."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from kvhit.engines.sglang.target import MatchPrefixParams, UnifiedRadixCache  # SGLang's own

SOUND = UnifiedRadixCache.match_prefix


def short_match(cache: Any, params: MatchPrefixParams) -> Any:
    """SGLang's own match of the key cut by one page (a key of a page or less: as is)."""
    cut = len(params.key) - cache.page_size
    if cut > 0:
        params = MatchPrefixParams(key=params.key[:cut])
    return SOUND(cache, params)


@contextmanager
def broken() -> Iterator[None]:
    """SGLang's match broken in the block."""
    UnifiedRadixCache.match_prefix = short_match
    try:
        yield
    finally:
        UnifiedRadixCache.match_prefix = SOUND


def pytest_configure(config: Any) -> None:
    """Break the match for the whole run."""
    UnifiedRadixCache.match_prefix = short_match
