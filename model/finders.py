"""Per-group finders: f_g(m), the longest hit at most m that one group can serve.

Each finder is written the way engines write it, as a scan over the group's block
indices, and each scan is a *fold*: a start state, a step
``(state, block index, cached bit) -> state`` and a finish that reads the hit off the
final state. Written this way, the proof suite can unroll the very same steps on
symbolic cache bits (a bounded proof) or run one step on a symbolic state to check a
loop invariant (an unbounded proof). See :mod:`kvhit.model.ops` for the rules the
code keeps so it runs on both.

    kind              direction      what the scan does
    full              left to right  extend the run of cached blocks from block 0
    chunked_local     left to right  remember the last miss; a boundary is a hit
                                     when nothing from its chunk's first block on missed
    sliding_window    right to left  count contiguous cached blocks down from an
                                     aligned end; k of them (or a run reaching block 0)
                                     is a hit
    mamba             right to left  the last cached state at an aligned boundary

Eagle groups use the single-drop wrapper (:func:`frame_for`): the base scan looks
one block further, a sliding window one block wider, and the hit it finds is cut
by that block, once.

    >>> from kvhit.model.spec import Group
    >>> sw = Group("sliding_window", block_size=1, window=2)
    >>> find(sw, [False, True], m=2, alignment=1, num_tokens=3)
    2
    >>> find(sw, [False, True], m=1, alignment=1, num_tokens=3)
    0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvhit.model.ops import PY, Ops
from kvhit.model.spec import Drafter, Group, Kind, reused_range, window_span

State = tuple[Any, ...]


@dataclass(frozen=True)
class Frame:
    """Where a finder looks.

    A scan visits blocks ``0 … limit-1``. A boundary after block e-1 ("end e") is a
    candidate when its hit length ``e·b - shift`` is a non-negative multiple of the
    alignment. ``shift`` is 0, or b for an eagle group (its hit stops one block short
    of the blocks it matched).
    """

    alignment: Any
    block_size: Any
    shift: Any
    limit: Any

    def length(self, end: Any) -> Any:
        """The hit length, in tokens, of end ``end``."""
        return end * self.block_size - self.shift

    def is_candidate(self, end: Any, ops: Ops) -> Any:
        """Whether end ``end`` gives an aligned, non-negative hit length."""
        tokens = self.length(end)
        return ops.and_(tokens >= 0, tokens % self.alignment == 0)

    def round_down(self, end: Any, ops: Ops) -> Any:
        """The longest candidate hit length at or below end ``end`` (0 if none)."""
        tokens = self.length(end)
        return ops.ite(tokens >= 0, ops.div(tokens, self.alignment) * self.alignment, 0)


@dataclass(frozen=True)
class Scan:
    """A finder as a fold over block indices (see the module docstring)."""

    direction: str  # "up" (left to right) or "down" (right to left)
    limit: Any
    start: State
    step: Callable[[State, Any, Any], State]
    finish: Callable[[State], Any]


def frame_for(g: Group, m: Any, alignment: Any, num_tokens: Any, ops: Ops = PY) -> Frame:
    """The frame of group g's finder for hits of at most m tokens.

    For an eagle group this is the single-drop wrapper: look at blocks up to m + b
    (but only whole blocks of the request), so the hit found is one block past a
    candidate, then report it one block shorter. The drop is per candidate, inside
    the finder, so f(f(m)) = f(m) and the fixed point does not spiral down. A
    lookahead drafter's group looks no further than T − La, where its keys stop.
    """
    b = g.block_size
    if g.eagle:
        return Frame(alignment, b, b, ops.min(ops.div(m + b, b), ops.div(num_tokens, b)))
    if g.drafter == Drafter.LOOKAHEAD:
        m = ops.min(m, ops.max(0, num_tokens - g.lookahead))
    return Frame(alignment, b, 0, ops.div(m, b))


def full_scan(g: Group, fr: Frame, ops: Ops) -> Scan:
    """Left to right: the run of cached blocks from block 0; stop at the first miss."""

    def step(state: State, j: Any, cached: Any) -> State:
        run, alive = state
        alive = ops.and_(alive, cached)
        return ops.ite(alive, j + 1, run), alive

    return Scan("up", fr.limit, (0, True), step, lambda s: fr.round_down(s[0], ops))


def chunked_local_scan(g: Group, fr: Frame, ops: Ops) -> Scan:
    """Left to right: a boundary is a hit if no block from its chunk's first needed
    block up to it was missed. State: the block after the last miss, the best hit."""

    def step(state: State, j: Any, cached: Any) -> State:
        clean_from, hit = state
        clean_from = ops.ite(cached, clean_from, j + 1)
        end = j + 1
        first_needed, _ = reused_range(g, fr.length(end), ops)
        ok = ops.and_(fr.is_candidate(end, ops), clean_from <= first_needed)
        return clean_from, ops.ite(ok, fr.length(end), hit)

    return Scan("up", fr.limit, (0, 0), step, lambda s: s[1])


def sliding_window_scan(g: Group, fr: Frame, ops: Ops) -> Scan:
    """Right to left: count contiguous cached blocks down from a candidate end.

    k = ceil((w-1)/b) of them make the end a hit (k + 1 for an eagle group, whose
    next block must be cached too). A run that reaches block 0 with fewer than k is a
    hit as well: a short prefix needs only the blocks it has. Window 1 (k = 0) needs
    no block, so the longest candidate is the hit. State: run, found, hit.
    """
    k = window_span(g, ops) + (1 if g.eagle else 0)

    def step(state: State, j: Any, cached: Any) -> State:
        run, found, hit = state
        starts = ops.and_(run == 0, fr.is_candidate(j + 1, ops))
        grows = ops.and_(ops.not_(found), cached, ops.or_(run > 0, starts))
        new_run = ops.ite(grows, run + 1, ops.ite(found, run, 0))
        new_hit = ops.ite(ops.and_(grows, run == 0), fr.length(j + 1), hit)
        return new_run, ops.or_(found, ops.and_(grows, run + 1 >= k)), new_hit

    def finish(state: State) -> Any:
        run, found, hit = state
        return ops.ite(ops.or_(found, run > 0), hit, 0)

    start = (0, k <= 0, fr.round_down(fr.limit, ops))
    return Scan("down", fr.limit, start, step, finish)


def mamba_scan(g: Group, fr: Frame, ops: Ops) -> Scan:
    """Right to left: the last cached state at a candidate boundary."""

    def step(state: State, j: Any, cached: Any) -> State:
        found, hit = state
        take = ops.and_(ops.not_(found), cached, fr.is_candidate(j + 1, ops))
        return ops.or_(found, take), ops.ite(take, fr.length(j + 1), hit)

    return Scan("down", fr.limit, (False, 0), step, lambda s: s[1])


SCANS: dict[Kind, Callable[[Group, Frame, Ops], Scan]] = {
    Kind.FULL: full_scan,
    Kind.SLIDING_WINDOW: sliding_window_scan,
    Kind.CHUNKED_LOCAL: chunked_local_scan,
    Kind.MAMBA: mamba_scan,
}
"""Each kind's finder, as a scan in the frame :func:`frame_for` gives it."""


def scan_for(g: Group, m: Any, alignment: Any, num_tokens: Any, ops: Ops = PY) -> Scan:
    """Group g's finder for hits of at most m tokens, as a scan."""
    return SCANS[g.kind](g, frame_for(g, m, alignment, num_tokens, ops), ops)


def run_scan(scan: Scan, row: Any, ops: Ops = PY) -> Any:
    """Fold a scan over its block indices; the hit length it finds."""
    order = list(ops.indices(scan.limit))
    if scan.direction == "down":
        order.reverse()
    state = scan.start
    for j in order:
        stepped = scan.step(state, j, ops.bit(row, j))
        live = j < scan.limit
        state = tuple(ops.ite(live, new, old) for new, old in zip(stepped, state))
    return scan.finish(state)


def find(g: Group, row: Any, m: Any, alignment: Any, num_tokens: Any, ops: Ops = PY) -> Any:
    """f_g(m): the longest hit of at most m tokens that group g can serve."""
    return run_scan(scan_for(g, m, alignment, num_tokens, ops), row, ops)
