"""The reference algorithms over all groups (docs/design.md §2).

- :func:`fixed_point` — the correct one (vLLM's): start at the longest candidate and
  let every group's finder lower L in turn until a whole pass changes nothing.
- :func:`brute_force` — try every candidate from the top: the spec itself.
- :func:`min_of_groups` — the rejected PR: each group's hit from the top, take the
  min. Only ever too long (unsafe), never too short.
- :func:`single_pass` — the fixed point without the repeat; also wrong.

Over tiered queries (docs/design.md §1.7), the wrong combinations engines shipped
when the per-group hits diverge: :func:`max_of_groups` (vLLM #46453),
:func:`full_attention_alone`, :func:`dense_min_mamba_trimmed` (vLLM #45804) and
:func:`local_then_external` (LMCache #4674, vLLM PR #54302).

After a failed KV load (docs/design.md §1.8), the recovered hit and the known-wrong
recovery rules are :mod:`kvhit.model.recovery`'s (``WRONG_RECOVERY_RULES``).

The seed's minimal counterexample (two window-2 groups, b = 1, M = 2):

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
    ...                  "cached": ["01", "10"], "max_length": 2})
    >>> per_group(q), min_of_groups(q), fixed_point(q), brute_force(q)
    ([2, 1], 1, 0, 0)
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

from kvhit.model.finders import find
from kvhit.model.ops import PY, Ops
from kvhit.model.spec import (
    Group,
    Kind,
    Query,
    fine_query,
    local_query,
    longest_hit,
    top_length,
    valid,
)

Finder = Callable[[Any], Any]


def group_finders(q: Query, ops: Ops = PY) -> list[Finder]:
    """Each group's finder m -> f_g(m), in group order (over the :func:`fine_query`)."""
    q = fine_query(q, ops)
    return [
        partial(find, g, row, alignment=q.alignment, num_tokens=q.num_tokens, ops=ops)
        for g, row in zip(q.groups, q.cached)
    ]


def max_passes(q: Query, ops: Ops = PY) -> Any:
    """floor(M/A) + 1: a pass that changes L lowers it by at least A."""
    return ops.div(q.max_length, q.alignment) + 1


GroupFinder = Callable[[Any, Any], Any]
"""(group index, m) -> f_g(m): every group's finder behind one call."""

LoopState = tuple[Any, Any]
"""The fixed point's state between passes: (L, whether the last pass left L unchanged)."""


@dataclass(frozen=True)
class Loop:
    """The fixed point as two folds, in the finders' shape (a state, a step, a finish).

    A *pass* folds :meth:`visit` over the group indices 0 … ``groups``-1, starting
    from L. The loop folds :meth:`step` (one pass, then :meth:`settle`) over the
    passes, starting from :meth:`start`, and :meth:`finish` reads L off the state.
    Written this way the proof suite runs each step once on symbolic values, with
    ``finder`` uninterpreted and ``groups`` a z3 integer, to check a loop invariant
    (docs/design.md §3, theorems 1 and 2).

        >>> loop = Loop(lambda g, m: min(m, (4, 3)[g]), 2, PY)
        >>> loop.step(loop.start(6)), loop.step((3, False))
        ((3, False), (3, True))
    """

    finder: GroupFinder
    groups: Any
    ops: Ops

    def start(self, top: Any) -> LoopState:
        """L at the longest candidate; no pass yet."""
        return top, False

    def visit(self, length: Any, g: Any) -> Any:
        """One step of a pass: group g's finder lowers L."""
        return self.finder(g, length)

    def run_pass(self, length: Any) -> Any:
        """Every group's finder in turn, from L."""
        for g in self.ops.indices(self.groups):
            length = self.ops.ite(g < self.groups, self.visit(length, g), length)
        return length

    def settle(self, state: LoopState, after: Any) -> LoopState:
        """The state once a pass from ``state`` has ended at ``after``: settled when
        the pass changed nothing; a settled state stays as it is."""
        length, done = state
        ops = self.ops
        return ops.ite(done, length, after), ops.or_(done, after == length)

    def step(self, state: LoopState) -> LoopState:
        """One pass of the loop."""
        return self.settle(state, self.run_pass(state[0]))

    def finish(self, state: LoopState) -> Any:
        """The hit length: L."""
        return state[0]

    def turn(self, state: LoopState) -> tuple[LoopState, Any]:
        """One turn of the driver: a pass, and whether the driver stops after it (the
        pass left L unchanged, so the loop has settled)."""
        after = self.step(state)
        return after, after[1]

    def run(self, top: Any, passes: Any) -> Any:
        """The driver: turns from the longest candidate until one says stop, at most
        ``passes``; L at the end."""
        state = self.start(top)
        for _ in self.ops.passes(passes):
            state, stop = self.turn(state)
            if self.ops.settled(stop, True):
                break
        return self.finish(state)


def fixed_point_of(finders: Sequence[Finder], top: Any, passes: Any, ops: Ops = PY) -> Any:
    """Lower L through every finder in turn until a whole pass leaves it unchanged.

    ``passes`` bounds the number of passes; a settled state stays settled, so
    running extra passes is harmless and stopping once settled changes nothing.
    """
    return Loop(lambda g, m: finders[g](m), len(finders), ops).run(top, passes)


def fixed_point(q: Query, ops: Ops = PY) -> Any:
    """The fixed-point algorithm over the query's groups."""
    return fixed_point_of(group_finders(q, ops), top_length(q, ops), max_passes(q, ops), ops)


def single_pass(q: Query, ops: Ops = PY) -> Any:
    """One pass of the fixed point, no repeat (known wrong)."""
    return fixed_point_of(group_finders(q, ops), top_length(q, ops), 1, ops)


def per_group(q: Query, ops: Ops = PY) -> list[Any]:
    """Each group's own finder result from the longest candidate."""
    top = top_length(q, ops)
    return [f(top) for f in group_finders(q, ops)]


def fold_hits(q: Query, pick: Callable[[Any, Any], Any], ops: Ops = PY) -> Any:
    """The per-group hits folded by ``pick`` (``ops.min``, ``ops.max``)."""
    hits = per_group(q, ops)
    out = hits[0]
    for h in hits[1:]:
        out = pick(out, h)
    return out


def min_of_groups(q: Query, ops: Ops = PY) -> Any:
    """The min of the per-group hits (the rejected PR; known wrong)."""
    return fold_hits(q, ops.min, ops)


def max_of_groups(q: Query, ops: Ops = PY) -> Any:
    """The max of the per-group hits (vLLM #46453: full attention evicted, a deeper
    Mamba state survived, the scheduler took the deeper one; known wrong, unsafe)."""
    return fold_hits(q, ops.max, ops)


def full_attention_alone(q: Query, ops: Ops = PY) -> Any:
    """The first full-attention group's hit, the other groups unchecked (known wrong,
    unsafe); the fixed point when there is no full-attention group."""
    first = next((i for i, g in enumerate(q.groups) if g.kind == Kind.FULL), None)
    return fixed_point(q, ops) if first is None else per_group(q, ops)[first]


def dense_min_mamba_trimmed(q: Query, ops: Ops = PY) -> Any:
    """The min of the non-Mamba groups' hits, the Mamba groups' states trimmed to it
    unchecked (vLLM #45804; known wrong, unsafe); the longest candidate when every
    group is Mamba."""
    out = top_length(q, ops)
    for g, h in zip(q.groups, per_group(q, ops)):
        if g.kind != Kind.MAMBA:
            out = ops.min(out, h)
    return out


def only_groups(q: Query, keep: Sequence[int]) -> Query:
    """The query over the groups ``keep`` alone (its tiers' rows too)."""
    tiers = tuple(replace(t, cached=tuple(t.cached[i] for i in keep)) for t in q.tiers)
    groups = tuple(q.groups[i] for i in keep)
    return replace(q, groups=groups, cached=tuple(q.cached[i] for i in keep), tiers=tiers)


def local_then_external(q: Query, ops: Ops = PY) -> Any:
    """The local hit (the fixed point over the pool alone) extended by an external
    one: the fixed point of the non-Mamba groups over every tier, the Mamba groups not
    re-checked at the longer length (LMCache #4674, vLLM PR #54302: a connector handed
    a boundary deeper than the lagging group's state; known wrong, unsafe); the fixed
    point when every group is Mamba."""
    attention = [i for i, g in enumerate(q.groups) if g.kind != Kind.MAMBA]
    if not attention:
        return fixed_point(q, ops)
    return ops.max(fixed_point(local_query(q), ops), fixed_point(only_groups(q, attention), ops))


WRONG_TIER_COMBINATIONS: dict[str, Callable[[Query, Ops], Any]] = {
    "max of groups": max_of_groups,
    "full attention alone": full_attention_alone,
    "dense min, Mamba trimmed": dense_min_mamba_trimmed,
    "local then external": local_then_external,
}
"""The known-wrong ways engines combined per-group hits across tiers, by name."""


def spiral_finders(q: Query, ops: Ops = PY) -> list[Finder]:
    """The query's finders, with every eagle group's replaced by the known-wrong
    *spiral*: the base kind's hit at m, minus one block, rounded down to A, on every
    call, so every pass of the fixed point drops another block."""

    def spiral(g: Group, row: Any) -> Finder:
        base = replace(g, drafter=None)
        b, a = g.block_size, q.alignment

        def f(m: Any) -> Any:
            hit = find(base, row, m, a, q.num_tokens, ops)
            return ops.ite(hit >= b, ops.div(hit - b, a) * a, 0)

        return f

    right = group_finders(q, ops)
    q = fine_query(q, ops)
    return [spiral(g, row) if g.eagle else f for g, row, f in zip(q.groups, q.cached, right)]


def spiral_fixed_point(q: Query, ops: Ops = PY) -> Any:
    """The fixed point over :func:`spiral_finders` (known wrong: lost reuse)."""
    return fixed_point_of(spiral_finders(q, ops), top_length(q, ops), max_passes(q, ops), ops)


def brute_force(q: Query) -> int:
    """L* by trying every candidate from the top."""
    return longest_hit(q).length


def longest_of(q: Query, lengths: Iterable[Any], ops: Ops = PY) -> Any:
    """L* over the given candidate lengths (each counts only when at most M): the
    spec's ``valid`` for every group at each, the longest kept. With z3 terms for M
    and the rows this is L* as one term.

        >>> from kvhit.model.protocol import parse_query
        >>> q = parse_query({"groups": [{"kind": "mamba", "block_size": 1}],
        ...                  "cached": ["101"], "max_length": 2})
        >>> longest_of(q, range(0, 4))
        1
    """
    best: Any = 0
    q = fine_query(q, ops)
    for length in sorted(lengths):
        every = ops.and_(
            length <= q.max_length,
            *(valid(g, row, length, q.num_tokens, ops) for g, row in zip(q.groups, q.cached)),
        )
        best = ops.ite(every, length, best)
    return best
