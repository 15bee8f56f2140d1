"""Hash units: the fine query is faithful to what each kind needs (docs/design.md §1.6).

A query with a hash unit h means what its fine query means
(:func:`kvhit.model.spec.fine_query`): every group at block size h, each row the
model's own :func:`~kvhit.model.spec.fine_row` of the coarse row, whose entries are
``true``, ``false`` or ``{"upto": p}``. The theorems of §3 are about queries, so they
cover fine queries (the symbolic ones with b and A symbolic cover every h) *if* the
fine query says what the coarse one means. That is ``fine_row_faithful``:

    valid(fine group, fine row, L)  ⇔  the KV the kind needs at L is held

for every hit L that is a multiple of h (inside a block or not), where "needs" is
§1.6's table read off the coarse entries directly, token by token: a ``true`` block
holds its tokens (Mamba: its state at its end), ``{"upto": p}`` its tokens before p
(Mamba: the state at p), ``false`` nothing; full attention needs tokens [0, L), a
sliding window [L − t, L), chunked local [s, L) with s the start of L's chunk,
Mamba the state at exactly L; a drop drafter also needs the next unit's tokens
[L, L + h) and L + h ≤ T, a lookahead one L + La ≤ T.

The left side runs the model's own code: the groups are ``fine_query``'s, each
block's bits are ``fine_row``'s for each entry that block can have (a z3 choice
picks one, :func:`kvhit.proofs.common.fine_bits`), and ``valid`` runs on z3 terms.
The right side is written here from the design's table. Every row of up to N
blocks, every choice of entries, every L, window (both conventions), chunk, T and
La, for each finder of :data:`~kvhit.proofs.common.DISTINCT_FINDERS` (``none`` is
no drafter: ``drafter_none_same``) and each (h, k) of :data:`UNIT_SHAPES`, b = k·h.

    >>> [goal.name for goal in build(2)][:2]
    ['full h=1 b=1', 'full h=1 b=2']
"""

from __future__ import annotations

from typing import Any

import z3

from kvhit.model.protocol import parse_query
from kvhit.model.spec import (
    Drafter,
    Kind,
    Query,
    WindowConvention,
    fine_query,
    shown_entry,
    valid,
    valid_all,
    window_before,
)
from kvhit.proofs.common import (
    DISTINCT_FINDERS,
    block_entries,
    fine_bits,
    model_int,
    protocol_group,
    row_of,
)
from kvhit.proofs.registry import Counterexample, Goal, Status, Theorem
from kvhit.proofs.symbolic import Z3Ops
from kvhit.proofs.theorems.contracts import ContractFinder, conventions

UNIT_SHAPES: tuple[tuple[int, int], ...] = ((1, 1), (1, 2), (1, 3), (2, 2), (2, 3), (3, 2))
"""(h, k) pairs, b = k·h: one unit per block, and two or three units of 1, 2 or 3
tokens (partial blocks at every fine boundary)."""


class Held:
    """What a coarse row of ``choices`` holds (block j holds ``choices[j]`` units of
    h tokens from its start: 0 is ``false``, k is ``true``, others ``{"upto": p}``)."""

    def __init__(self, b: int, h: int, choices: list[Any]):
        self.b, self.h, self.choices = b, h, choices

    def token(self, x: int) -> Any:
        """Whether token x (concrete) is held: its block holds the units up to it."""
        j = x // self.b
        return self.choices[j] * self.h > x - j * self.b

    def tokens(self, lo: Any, hi: Any) -> Any:
        """Every token in [lo, hi) is held (none past the row is)."""
        end = len(self.choices) * self.b
        each = [z3.Implies(z3.And(lo <= x, x < hi), self.token(x)) for x in range(end)]
        return z3.Or(lo >= hi, z3.And(hi <= end, *each))

    def state(self, length: Any) -> Any:
        """Whether the Mamba state at ``length`` > 0 is held: a ``true`` block's at its
        end, a partial block's at its fine boundary."""
        k = self.b // self.h
        return z3.Or(
            *[
                z3.Or(
                    z3.And(c == k, length == (j + 1) * self.b),
                    z3.And(c > 0, c < k, length == j * self.b + c * self.h),
                )
                for j, c in enumerate(self.choices)
            ]
        )


def needs(g: Any, held: Held, length: Any, num_tokens: Any) -> Any:
    """§1.6's table (and §1.3's drafters), over what the coarse row holds."""
    h = held.h
    if g.kind == Kind.FULL:
        base = held.tokens(0, length)
    elif g.kind == Kind.SLIDING_WINDOW:
        base = held.tokens(z3.If(length >= window_before(g), length - window_before(g), 0), length)
    elif g.kind == Kind.CHUNKED_LOCAL:
        base = held.tokens(length - length % g.chunk, length)
    else:
        base = held.state(length)
    if g.drafter == Drafter.DROP:
        base = z3.And(base, held.tokens(length, length + h), length + h <= num_tokens)
    if g.drafter == Drafter.LOOKAHEAD:
        base = z3.And(base, length + g.lookahead <= num_tokens)
    return z3.Or(length == 0, base)


def goal_for(finder: ContractFinder, h: int, k: int, blocks: int) -> Goal:
    """valid on the fine row != needs, for one finder, h and b = k·h."""
    b = k * h
    tag = f"hu_{finder.label.replace(' ', '_')}_h{h}_k{k}"
    span, la, length, num_tokens, units = z3.Ints(f"{tag}_span {tag}_La {tag}_L {tag}_T {tag}_u")
    coarse = finder.group(b, span, la)
    fine = fine_query(Query((coarse,), ((),), 0, 1, h, hash_unit=h)).groups[0]
    choices = [z3.Int(f"{tag}_units{j}") for j in range(blocks)]
    row = row_of(fine_bits(coarse, h, choices))
    held = Held(b, h, choices)
    ops = Z3Ops(bound=blocks * k + 2)
    pre = [
        span >= 1,
        la >= 0,
        *[z3.And(c >= 0, c <= k) for c in choices],
        units >= 0,
        length == units * h,
        length <= (blocks + 1) * b,
        num_tokens > length,
    ]
    spec = valid(fine, row, length, num_tokens, ops)
    name = f"{finder.label} h={h} b={b}"

    def witness(model: z3.ModelRef) -> Counterexample:
        held_units = [model_int(model, c) for c in choices]
        at = model_int(model, length)
        q = parse_query(
            {
                "groups": [protocol_group(coarse, model)],
                "cached": [
                    [shown_entry(block_entries(coarse, h, j)[c]) for j, c in enumerate(held_units)]
                ],
                "max_length": at,
                "num_tokens": model_int(model, num_tokens),
                "alignment": h,
                "hash_unit": h,
            }
        )
        on_fine = valid_all(q, at)
        needed = z3.is_true(
            z3.simplify(needs(q.groups[0], Held(b, h, held_units), at, q.num_tokens))
        )
        answers = {"valid on the fine row": on_fine, "needed KV held": needed}
        return Counterexample(q, "fine_row", at, answers, broken=on_fine != needed, note=name)

    return Goal(name, pre, spec != needs(coarse, held, length, num_tokens), witness=witness)


FAITHFUL_FINDERS: tuple[ContractFinder, ...] = tuple(
    ContractFinder(kind, drafter, convention)
    for kind, drafter in DISTINCT_FINDERS
    for convention in conventions(kind)
    if convention == WindowConvention.INCLUSIVE or drafter is None
)
"""Every finder of :data:`~kvhit.proofs.common.DISTINCT_FINDERS`; the exclusive
window once, without a drafter (the window convention only moves t)."""


def build(bound: int | None) -> list[Goal]:
    """One goal per finder and (h, k), rows of ``bound`` blocks."""
    blocks = bound or 3
    return [goal_for(f, h, k, blocks) for f in FAITHFUL_FINDERS for h, k in UNIT_SHAPES]


THEOREMS = [
    Theorem(
        name="fine_row_faithful",
        statement=(
            "With a hash unit h, a hit of L (any multiple of h) is valid on the model's "
            "fine query (fine_query's groups, fine_row's bits) iff the KV its kind needs "
            "at L is held by the coarse row (docs/design.md §1.6: tokens [0, L), the "
            "window's or the chunk's tokens before L, the Mamba state at exactly L; a "
            "drop drafter's next unit, a lookahead drafter's L + La <= T), for every "
            "kind and drafter, every row of true, false and partial entries."
        ),
        expected=Status.PROVED,
        bounded=True,
        bound=3,
        quick_bound=2,
        build=build,
        rests_on="model code: fine_query, fine_row (every entry), valid at block size h",
        scope="rows of N blocks, every L, window, chunk, T, La; (h, k) "
        + " ".join(f"{h},{k}" for h, k in UNIT_SHAPES)
        + ", b = k*h",
    ),
]
