"""A corpus of hard states: where known-wrong algorithms differ from L*, and boundaries.

The solver states (cache states where an algorithm engines really shipped differs
from L*) are found once by :mod:`kvhit.proofs.corpus_states` (``python -m
kvhit.cli.corpus``) and kept in ``corpus.json`` next to this module, one entry
``{"wrong": algorithm, "query": ...}`` a line; reading them needs no solver, so the
gate does not load z3. The boundary states (windows, chunks, alignments and M at and around
block and alignment boundaries, with one hole at each block) are cheap and built on
the fly, and so are their tiered forms (the hole held by an external tier). A target is
asked only those its capabilities allow (:func:`corpus_queries`).

    >>> entry = stored()[0]
    >>> sorted(entry), entry["wrong"]
    (['query', 'wrong'], 'min_of_groups')
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from kvhit.contract import BASE, Capabilities
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Drafter, Group, Kind, Query, Tier, Upto, WindowConvention

CORPUS_FILE = "corpus.json"
SOURCE = Path(__file__).with_name(CORPUS_FILE)
"""Where the corpus is regenerated: this module's folder."""


def stored() -> list[dict[str, Any]]:
    """The entries kept in ``corpus.json``."""
    text = resources.files("kvhit.harness").joinpath(CORPUS_FILE).read_text(encoding="utf-8")
    return json.loads(text)


def write(entries: Sequence[dict[str, Any]], path: Path = SOURCE) -> None:
    """Keep ``entries`` (``{"wrong": ..., "query": ...}``) as the corpus, one a line."""
    lines = ",\n".join(json.dumps(entry) for entry in entries)
    path.write_text(f"[\n{lines}\n]\n", encoding="utf-8")


def solver_queries() -> Iterator[Query]:
    """The stored solver states, as queries."""
    for entry in stored():
        yield parse_query(entry["query"])


def near_multiples(unit: int, count: int) -> list[int]:
    """Values around the first ``count`` multiples of ``unit``: k·unit - 1, k·unit, k·unit + 1."""
    return sorted(
        {v for k in range(1, count + 1) for v in (k * unit - 1, k * unit, k * unit + 1)} - {0}
    )


def boundary_groups(block_sizes: Sequence[int] = (1, 2)) -> Iterator[Group]:
    """Groups of every kind whose windows and chunks sit on and next to block boundaries.
    Inclusive windows reach t = w - 1 tokens back; one exclusive window per block size
    reaches one token past the last of them (t = 2b + 1). Drafters: drop on full and
    windows, none on a window, a lookahead of b + 1 tokens on full and Mamba."""
    for b in block_sizes:
        yield Group(Kind.FULL, b)
        yield Group(Kind.FULL, b, drafter=Drafter.DROP)
        yield Group(Kind.FULL, b, drafter=Drafter.LOOKAHEAD, lookahead=b + 1)
        yield Group(Kind.MAMBA, b)
        yield Group(Kind.MAMBA, b, drafter=Drafter.LOOKAHEAD, lookahead=b + 1)
        yield Group(Kind.SLIDING_WINDOW, b, window=b + 1, drafter=Drafter.NONE)
        for w in near_multiples(b, 2):
            yield Group(Kind.SLIDING_WINDOW, b, window=w)
            yield Group(Kind.SLIDING_WINDOW, b, window=w, drafter=Drafter.DROP)
        yield Group(
            Kind.SLIDING_WINDOW, b, window=2 * b + 1, window_convention=WindowConvention.EXCLUSIVE
        )
        for c in near_multiples(b, 2):
            yield Group(Kind.CHUNKED_LOCAL, b, chunk=c)


def boundary_queries() -> Iterator[Query]:
    """Each boundary group beside a full group of block size 1, at alignments A and 2A
    and M next to multiples of the alignment, fully cached or with one hole."""
    for g in boundary_groups():
        groups = (g, Group(Kind.FULL, 1))
        for alignment in (g.block_size, 2 * g.block_size):
            for max_length in near_multiples(alignment, 2):
                for num_tokens in (max_length + 1, max_length + g.block_size):
                    yield from holes(groups, max_length, num_tokens, alignment)


def unit_queries() -> Iterator[Query]:
    """Each boundary group of block size 2 or 4 beside a full group of block size 1,
    with a hash unit of half a block, at alignments h and 2h and M next to their
    multiples: fully cached, or one block missing or partially filled up to each of
    its fine boundaries."""
    for g in boundary_groups((2, 4)):
        unit = g.block_size // 2
        groups = (g, Group(Kind.FULL, unit))
        for alignment in (unit, 2 * unit):
            for max_length in near_multiples(alignment, 2):
                for num_tokens in (max_length + 1, max_length + g.block_size):
                    yield from holes(groups, max_length, num_tokens, alignment, unit)


def holes(
    groups: tuple[Group, ...],
    max_length: int,
    num_tokens: int,
    alignment: int,
    hash_unit: int | None = None,
) -> Iterator[Query]:
    """The fully cached state, and each state with one block of group 0 missing or
    (with a hash unit) partially filled up to each of its fine boundaries."""
    b = groups[0].block_size
    reach = max_length // b + 1
    rows = [tuple(True for _ in range(max_length // g.block_size + 1)) for g in groups]
    step = b if hash_unit is None else hash_unit
    for hole in range(-1, reach):
        entries: list[bool | Upto] = [
            False,
            *map(Upto, range(hole * b + step, (hole + 1) * b, step)),
        ]
        for entry in entries if hole >= 0 else [True]:
            first = tuple(entry if j == hole else True for j in range(reach))
            tokens = max(num_tokens, max_length + 1)
            yield Query(groups, (first, *rows[1:]), max_length, tokens, alignment, hash_unit)


def tiered_boundary_queries() -> Iterator[Query]:
    """Each boundary state with a hole, the hole held by an external tier ``cpu`` that
    holds group 0's kind and nothing else: L* reads past the pool's hole, so a target
    that ignores the tier, or one that combines the pool's and the tier's hits wrongly
    (:data:`kvhit.model.algorithms.WRONG_TIER_COMBINATIONS`), answers short or long."""
    for q in boundary_queries():
        row = q.cached[0]
        if all(row):
            continue
        kept = tuple(not bit for bit in row)
        others = (None,) * (len(q.groups) - 1)
        yield replace(q, tiers=(Tier("cpu", frozenset({q.groups[0].kind}), (kept, *others)),))


def corpus_queries(capabilities: Capabilities = BASE) -> Iterator[Query]:
    """The whole corpus a target of ``capabilities`` can be asked: the solver states,
    then the boundary states, then those with a hash unit, then (when it takes tiers)
    the tiered boundary states (rules that read rows are the caller's, state by state)."""
    every = [solver_queries(), boundary_queries(), unit_queries()]
    if capabilities.tiers:
        every.append(tiered_boundary_queries())
    for source in every:
        yield from (q for q in source if capabilities.configuration_refusal(q) is None)
