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

from kvhit.model.algorithms import fixed_point, per_group
from kvhit.model.spec import Answer, Query, answer_at, coarse_answer, fine_query, reduced


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


def min_of_groups_answer(q: Query) -> Answer:
    """The rejected algorithm's answer: the min of :func:`finder_results`."""
    return answer_at(q, min(finder_results(q)))
