"""kvhit.model: the exact spec of windowed hit validity and the reference algorithms.

Start with :mod:`kvhit.model.spec` (what a valid hit is), then
:mod:`kvhit.model.finders` (one group's scan) and :mod:`kvhit.model.algorithms`
(all groups at once).
"""

from kvhit.model.algorithms import (
    brute_force,
    fixed_point,
    fixed_point_of,
    group_finders,
    min_of_groups,
    per_group,
    single_pass,
)
from kvhit.model.finders import find, run_scan, scan_for
from kvhit.model.ops import PY, Ops
from kvhit.model.protocol import QueryError, load_queries, parse_query
from kvhit.model.spec import (
    Answer,
    Group,
    Query,
    answer_at,
    longest_hit,
    misses,
    needed_blocks,
    reused_blocks,
    valid,
    valid_all,
)

__all__ = [
    "PY",
    "Answer",
    "Group",
    "Ops",
    "Query",
    "QueryError",
    "answer_at",
    "brute_force",
    "find",
    "fixed_point",
    "fixed_point_of",
    "group_finders",
    "load_queries",
    "longest_hit",
    "min_of_groups",
    "misses",
    "needed_blocks",
    "parse_query",
    "per_group",
    "reused_blocks",
    "run_scan",
    "scan_for",
    "single_pass",
    "valid",
    "valid_all",
]
