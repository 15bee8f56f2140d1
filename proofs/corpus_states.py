"""Finding the corpus's solver states: cache states where a known-wrong algorithm
differs from L*.

It runs the model's own finders on Z3 terms (:class:`Z3Ops`, with one symbolic
:class:`SymRow` per group) and asks for cache states where an algorithm that engines
really shipped differs from L*:

- ``min_of_groups``: the min of the per-group hits (the rejected PR);
- ``single_pass``: the fixed point without the repeat;
- ``eagle_every_pass``: an eagle group that drops its last block on every pass
  instead of once per candidate (the spiral that sent hit rates to 0,
  :func:`kvhit.model.algorithms.spiral_fixed_point`).

Solving takes a while, so the states are generated once, over the gate's small
groups, by ``python -m kvhit.cli.corpus`` and kept in the file
:mod:`kvhit.harness.corpus` reads (the gate loads no solver); the tests check every
stored state still shows its disagreement and regenerate a part.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from itertools import product
from typing import Any

import z3

from kvhit.model.algorithms import longest_of, min_of_groups, single_pass, spiral_fixed_point
from kvhit.model.spec import Group, Query, default_alignment
from kvhit.proofs.symbolic import SymRow, Z3Ops

KNOWN_WRONG: dict[str, Callable[..., Any]] = {
    "min_of_groups": min_of_groups,
    "single_pass": single_pass,
    "eagle_every_pass": spiral_fixed_point,
}


def solve_state(groups: tuple[Group, ...], max_length: int, algorithm: str) -> Query | None:
    """A cache state of ``groups`` with M = ``max_length`` where ``algorithm`` differs
    from L*, using as few cached blocks as the solver finds first; None if there is none."""
    alignment = default_alignment(groups)
    blocks = [max_length // g.block_size + 1 for g in groups]
    rows: Any = tuple(SymRow.fresh(f"row{i}", n) for i, n in enumerate(blocks))
    q = Query(groups, rows, max_length, max_length + 1, alignment)
    ops = Z3Ops(bound=max(blocks))
    solver = z3.Solver()
    solver.add(KNOWN_WRONG[algorithm](q, ops) != longest_of(q, q.candidates(), ops))
    if solver.check() != z3.sat:
        return None
    model = solver.model()
    cached = tuple(tuple(r.values(model, n)) for r, n in zip(rows, blocks))
    return Query(groups, cached, max_length, max_length + 1, alignment)


def solver_configs(groups: Sequence[Group]) -> Iterator[tuple[str, tuple[Group, ...], int]]:
    """(algorithm, groups, M) for every search: pairs of ``groups`` at M = 5, and for
    the eagle spiral every pair with an eagle group."""
    for pair in product(groups, repeat=2):
        for algorithm in ("min_of_groups", "single_pass"):
            yield algorithm, pair, 5
        if any(g.eagle for g in pair):
            yield "eagle_every_pass", pair, 5


def generate(groups: Sequence[Group]) -> list[dict[str, Any]]:
    """Every corpus entry over pairs of ``groups``: the algorithm that is wrong on it
    and the query."""
    out = []
    for algorithm, pair, max_length in solver_configs(groups):
        q = solve_state(pair, max_length, algorithm)
        if q is not None:
            out.append({"wrong": algorithm, "query": q.to_json()})
    return out
