"""Shrinking a disagreement to a small query that still shows it.

Greedy: try each simpler query in turn (fewer groups, fewer tiers, a smaller M,
fewer blocks in the pool's and the tiers' rows, no hash unit, tiers holding fewer
groups and kinds, whole or absent blocks for partially filled ones, fewer cached blocks,
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


Slot = tuple[int | None, int]
"""A row of a query in JSON form: (its tier's index, or None for the pool; its group)."""


def slots(q: Json) -> list[Slot]:
    """Every row of ``q``: the pool's, one per group, then each tier's.

    >>> slots({"cached": [[], []], "tiers": [{"cached": {"1": [True]}}]})
    [(None, 0), (None, 1), (0, 1)]
    """
    pool: list[Slot] = [(None, i) for i in range(len(q["cached"]))]
    return pool + [
        (t, int(key)) for t, tier in enumerate(q.get("tiers", [])) for key in tier["cached"]
    ]


def row_of(q: Json, slot: Slot) -> list[Any]:
    """The row at ``slot`` (the list itself, to change in place)."""
    t, i = slot
    rows = q["cached"] if t is None else q["tiers"][t]["cached"]
    return rows[i] if t is None else rows[str(i)]


def with_row(q: Json, slot: Slot, row: list[Any]) -> Json:
    """A copy of ``q`` with ``row`` at ``slot``."""
    out = copy.deepcopy(q)
    t, i = slot
    if t is None:
        out["cached"][i] = row
    else:
        out["tiers"][t]["cached"][str(i)] = row
    return out


def smaller_ints(value: int, floor: int) -> list[int]:
    """Values below ``value`` and at least ``floor`` to try, smallest first."""
    picks = [floor, value // 2, value - 1]
    return sorted({v for v in picks if floor <= v < value})


def without_groups(q: Json) -> Iterator[Json]:
    """The query with one group (and its rows, in the pool and every tier) left out."""
    if len(q["groups"]) < 2:
        return
    for i in range(len(q["groups"])):
        out = copy.deepcopy(q)
        del out["groups"][i], out["cached"][i]
        for tier in out.get("tiers", []):
            kept = {int(key): row for key, row in tier["cached"].items() if int(key) != i}
            tier["cached"] = {str(j - (j > i)): row for j, row in kept.items()}
        yield out


def without_tiers(q: Json) -> Iterator[Json]:
    """The query without its tiers, or with one tier left out."""
    tiers = q.get("tiers", [])
    if not tiers:
        return
    yield {k: v for k, v in q.items() if k != "tiers"}
    if len(tiers) > 1:
        for t in range(len(tiers)):
            yield {**q, "tiers": tiers[:t] + tiers[t + 1 :]}


def simpler_tiers(q: Json) -> Iterator[Json]:
    """A tier without its row of one group, or holding one kind fewer (its rows of
    groups of that kind dropped; a tier keeps one kind at least)."""
    kinds = [g["kind"] for g in q["groups"]]
    for t, tier in enumerate(q.get("tiers", [])):
        for key in tier["cached"]:
            out = copy.deepcopy(q)
            del out["tiers"][t]["cached"][key]
            yield out
        if len(tier["holds"]) < 2:
            continue
        for kind in tier["holds"]:
            out = copy.deepcopy(q)
            kept = out["tiers"][t]
            kept["holds"] = [k for k in tier["holds"] if k != kind]
            kept["cached"] = {i: r for i, r in tier["cached"].items() if kinds[int(i)] != kind}
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
    """The query with the tokens ``[i·A, (i+1)·A)`` cut out: every row (the pool's and
    the tiers') loses the blocks over them, later blocks (and partial blocks' ends)
    move down, and M and T are A shorter. Only when A is a multiple of every block
    size."""
    a = q["alignment"]
    if q["max_length"] < a or any(a % g["block_size"] for g in q["groups"]):
        return
    for i in range(q["max_length"] // a):
        out = copy.deepcopy(q)
        for slot in slots(out):
            row = row_of(out, slot)
            per = a // out["groups"][slot[1]]["block_size"]
            del row[i * per : (i + 1) * per]
            for entry in row[i * per :]:
                if isinstance(entry, dict):
                    entry["upto"] -= a
        out["max_length"] -= a
        out["num_tokens"] -= a
        yield out


def without_hash_unit(q: Json) -> Iterator[Json]:
    """The query without its hash unit: partial blocks (in every row) absent, or all
    whole."""
    if "hash_unit" not in q:
        return
    for whole in (False, True):
        out = copy.deepcopy({k: v for k, v in q.items() if k != "hash_unit"})
        for slot in slots(out):
            row = row_of(out, slot)
            row[:] = [whole if isinstance(e, dict) else e for e in row]
        yield out
        yield {**out, "alignment": None}


def whole_blocks(q: Json) -> Iterator[Json]:
    """One partially filled block (in any row) made whole."""
    for slot in slots(q):
        row = row_of(q, slot)
        for j, entry in enumerate(row):
            if isinstance(entry, dict):
                yield with_row(q, slot, [*row[:j], True, *row[j + 1 :]])


def shorter_rows(q: Json) -> Iterator[Json]:
    """A row (the pool's or a tier's) cut after the blocks M can reach, or one block
    shorter."""
    for slot in slots(q):
        row = row_of(q, slot)
        g = q["groups"][slot[1]]
        reach = q["max_length"] // g["block_size"] + 1
        for length in sorted({min(len(row), reach), len(row) - 1}):
            if 0 <= length < len(row):
                yield with_row(q, slot, row[:length])


def fewer_cached(q: Json) -> Iterator[Json]:
    """One cached (or partially filled) block, in any row, uncached."""
    for slot in slots(q):
        row = row_of(q, slot)
        for j, bit in enumerate(row):
            if bit:
                yield with_row(q, slot, [*row[:j], False, *row[j + 1 :]])


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
    without_tiers,
    smaller_limits,
    without_span,
    shorter_rows,
    without_hash_unit,
    simpler_tiers,
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


SHRINK_SECONDS = 60.0
"""How long shrinking may take: a guard against a target slow to answer, far above
what shrinking a drawn case takes (it ends by itself when no candidate keeps the
class), so a busy machine shrinks to the same case."""


def shrink(
    a: Analysis, keeps: Callable[[Analysis], bool], seconds: float = SHRINK_SECONDS
) -> Analysis:
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
