"""The reference answers of a query, in time in its rows and groups, not in M/A.

Each runs the model's own algorithm on the :func:`kvhit.model.spec.reduced` query
and shifts the length back, which is exact (see there). A query with
M = 10^12 and one cached block costs what a query with M = 1 costs:

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1},
    ...                             {"kind": "sliding_window", "block_size": 1, "window": 1}],
    ...                  "cached": ["1", ""], "max_length": 10**12})
    >>> fixed_point_answer(q), finder_results(q)
    (Answer(length=1, blocks=((0,), ())), [1, 1000000000000])
"""

from __future__ import annotations

from dataclasses import replace

from kvhit.model.algorithms import fixed_point, only_groups, per_group
from kvhit.model.spec import (
    Answer,
    Kind,
    Query,
    answer_at,
    coarse_answer,
    fine_query,
    local_query,
    reduced,
    top_length,
)


def fixed_point_answer(q: Query) -> Answer:
    """The fixed point's answer (L*, with the blocks reused there)."""
    small, shift = reduced(fine_query(q))
    length = fixed_point(small)
    return coarse_answer(q, Answer(length + shift, answer_at(small, length).blocks))


def finder_results(q: Query) -> list[int]:
    """Each group's own finder result from the longest candidate (``per_group``), each
    run on its own group's reduced query: a group's finder reads only its own row."""
    out = []
    fine = fine_query(q)
    for g, row in zip(fine.groups, fine.cached):
        alone, shift = reduced(replace(fine, groups=(g,), cached=(row,)))
        out.append(per_group(alone)[0] + shift)
    return out


def wrong_tier_answers(q: Query) -> dict[str, int]:
    """What each known-wrong tier combination (:data:`~kvhit.model.algorithms.WRONG_TIER_COMBINATIONS`)
    answers, each composed of :func:`finder_results` and :func:`fixed_point_answer` as
    the model composes it of the finders and the fixed point, so in time in the rows.

        >>> from kvhit.model.protocol import parse_query
        >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1},
        ...                             {"kind": "mamba", "block_size": 1}],
        ...                  "cached": ["1", "0" * 9 + "1"], "max_length": 10**12})
        >>> wrong_tier_answers(q)["max of groups"]
        10
    """
    hits = finder_results(q)
    kinds = [g.kind for g in q.groups]
    full = [h for h, k in zip(hits, kinds) if k == Kind.FULL]
    dense = [h for h, k in zip(hits, kinds) if k != Kind.MAMBA]
    attention = [i for i, k in enumerate(kinds) if k != Kind.MAMBA]
    best = fixed_point_answer(q).length
    extended = best
    if attention:
        local = fixed_point_answer(local_query(q)).length
        extended = max(local, fixed_point_answer(only_groups(q, attention)).length)
    return {
        "max of groups": max(hits),
        "full attention alone": full[0] if full else best,
        "dense min, Mamba trimmed": min(dense, default=top_length(q)),
        "local then external": extended,
    }


def min_of_groups_answer(q: Query) -> Answer:
    """The rejected algorithm's answer: the min of :func:`finder_results`."""
    return answer_at(q, min(finder_results(q)))
