"""Shrinking a disagreement to a small query that still shows it.

Greedy: try each simpler query in turn (fewer groups, a smaller M, fewer blocks, no
hash unit, whole or absent blocks for partially filled ones, fewer cached blocks,
smaller windows and chunks, smaller block sizes, no drafter or one that needs
nothing, a shorter lookahead, an inclusive window for an exclusive one, the default
alignment), keep the first that still has the property, and start over until
nothing simpler has it. Every
candidate goes through the protocol's own checks, so a shrunk query is always a
valid one.

Each candidate is analysed once (:class:`~kvhit.analysis.Analysis`): the property is
asked of its analysis, and the analysis of the query kept is what shrinking returns.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}] * 3,
    ...                  "cached": ["1111", "1101", "1111"], "max_length": 4})
    >>> small = shrink(Analysis(q), lambda c: c.longest_hit.length < c.query.max_length)
    >>> small.query.to_json()["cached"], small.query.max_length
    ([[]], 1)
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterator
from typing import Any

from kvhit.analysis import Analysis
from kvhit.model.protocol import QueryError, parse_query
from kvhit.model.spec import Drafter, Query

Json = dict[str, Any]


def smaller_ints(value: int, floor: int) -> list[int]:
    """Values below ``value`` and at least ``floor`` to try, smallest first."""
    picks = [floor, value // 2, value - 1]
    return sorted({v for v in picks if floor <= v < value})


def without_groups(q: Json) -> Iterator[Json]:
    """The query with one group (and its row) left out."""
    if len(q["groups"]) < 2:
        return
    for i in range(len(q["groups"])):
        out = copy.deepcopy(q)
        del out["groups"][i], out["cached"][i]
        yield out


def smaller_limits(q: Json) -> Iterator[Json]:
    """A smaller M (and T), or a smaller T alone."""
    extra = q["num_tokens"] - q["max_length"]
    for m in smaller_ints(q["max_length"], 0):
        yield {**q, "max_length": m, "num_tokens": m + extra}
        yield {**q, "max_length": m, "num_tokens": m + 1}
    if extra > 1:
        yield {**q, "num_tokens": q["max_length"] + 1}


def without_span(q: Json) -> Iterator[Json]:
    """The query with the tokens ``[i·A, (i+1)·A)`` cut out: every group loses the
    blocks over them, later blocks (and partial blocks' ends) move down, and M and T
    are A shorter. Only when A is a multiple of every block size."""
    a = q["alignment"]
    if q["max_length"] < a or any(a % g["block_size"] for g in q["groups"]):
        return
    for i in range(q["max_length"] // a):
        out = copy.deepcopy(q)
        for g, row in zip(out["groups"], out["cached"]):
            per = a // g["block_size"]
            del row[i * per : (i + 1) * per]
            for entry in row[i * per :]:
                if isinstance(entry, dict):
                    entry["upto"] -= a
        out["max_length"] -= a
        out["num_tokens"] -= a
        yield out


def without_hash_unit(q: Json) -> Iterator[Json]:
    """The query without its hash unit: partial blocks absent, or all whole."""
    if "hash_unit" not in q:
        return
    for whole in (False, True):
        out = {k: v for k, v in q.items() if k != "hash_unit"}
        out["cached"] = [[whole if isinstance(e, dict) else e for e in row] for row in q["cached"]]
        yield out
        yield {**out, "alignment": None}


def whole_blocks(q: Json) -> Iterator[Json]:
    """One partially filled block made whole."""
    for i, row in enumerate(q["cached"]):
        for j, entry in enumerate(row):
            if isinstance(entry, dict):
                out = copy.deepcopy(q)
                out["cached"][i][j] = True
                yield out


def shorter_rows(q: Json) -> Iterator[Json]:
    """A row cut after the blocks M can reach, or one block shorter."""
    for i, row in enumerate(q["cached"]):
        g = q["groups"][i]
        reach = q["max_length"] // g["block_size"] + 1
        for length in sorted({min(len(row), reach), len(row) - 1}):
            if 0 <= length < len(row):
                out = copy.deepcopy(q)
                out["cached"][i] = row[:length]
                yield out


def fewer_cached(q: Json) -> Iterator[Json]:
    """One cached (or partially filled) block uncached."""
    for i, row in enumerate(q["cached"]):
        for j, bit in enumerate(row):
            if bit:
                out = copy.deepcopy(q)
                out["cached"][i][j] = False
                yield out


def simpler_drafters(g: Json) -> list[Json]:
    """Changes to group g's drafter, simplest first: none at all, one that needs
    nothing (``none``), a shorter lookahead. A key mapped to None is dropped."""
    if "drafter" not in g:
        return []
    changes: list[Json] = [{"eagle": False, "drafter": None, "lookahead": None}]
    if g["drafter"] != Drafter.NONE:
        changes.append({"eagle": False, "drafter": Drafter.NONE, "lookahead": None})
    if "lookahead" in g:
        changes += [{"lookahead": v} for v in smaller_ints(g["lookahead"], 0)]
    return changes


def simpler_groups(q: Json) -> Iterator[Json]:
    """A group with a simpler drafter (:func:`simpler_drafters`), a smaller window,
    chunk or block size, or with an exclusive window read as inclusive (one token
    shorter; the convention is kept unless the failure survives that)."""
    for i, g in enumerate(q["groups"]):
        changes = simpler_drafters(g)
        if "window_convention" in g:
            changes.append({"window_convention": "inclusive"})
        for key in ("window", "chunk", "block_size"):
            if key in g:
                changes += [{key: v} for v in smaller_ints(g[key], 1)]
        for change in changes:
            out = copy.deepcopy(q)
            group = out["groups"][i]
            group.update(change)
            for key in [k for k, v in change.items() if v is None]:
                del group[key]
            if "block_size" in change:
                out["alignment"] = None
            yield out


def default_aligned(q: Json) -> Iterator[Json]:
    """The query with the lcm of its block sizes as the alignment."""
    yield {**q, "alignment": None}


STEPS = (
    without_groups,
    smaller_limits,
    without_span,
    shorter_rows,
    without_hash_unit,
    simpler_groups,
    whole_blocks,
    fewer_cached,
    default_aligned,
)


def aligned(obj: Json) -> Json:
    """``obj`` with the protocol's default alignment where a step left it None."""
    return {k: v for k, v in obj.items() if k != "alignment" or v is not None}


def candidates(q: Query) -> Iterator[Query]:
    """Every simpler valid query one step away from ``q``."""
    base = q.to_json()
    for step in STEPS:
        for obj in step(base):
            try:
                cand = parse_query(aligned(obj))
            except QueryError:
                continue
            if cand != q:
                yield cand


def shrink(a: Analysis, keeps: Callable[[Analysis], bool], seconds: float = 10.0) -> Analysis:
    """The analysis of the smallest query found (within ``seconds``) from ``a``'s for
    which ``keeps`` holds; each candidate is analysed once, and ``keeps`` is asked of
    that analysis.

    ``keeps(a)`` is assumed to hold; every analysis returned has passed ``keeps``.
    """
    deadline = time.monotonic() + seconds
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for cand in candidates(a.query):
            if time.monotonic() >= deadline:
                break
            analysed = Analysis(cand)
            if keeps(analysed):
                a, improved = analysed, True
                break
    return a
