"""Drawing cache states and explaining answers, for people (docs/design.md §5.4).

>>> from kvhit.model.protocol import parse_query
>>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
...                  "cached": ["01", "10"], "max_length": 2})
>>> print(draw(q))
query: M=2 A=1
group 0  sliding_window w=2 b=1   . #
group 1  sliding_window w=2 b=1   # .
>>> print(judge(q, "target", 1))
target answered 1 (unsafe): group 0 needs block 0 at L=1, not cached

With a hash unit h, each block is drawn as its units (``#`` a unit held, for Mamba
the state at the unit's end), blocks parted by ``|``; a partially filled block
shows the units it holds:

>>> q = parse_query({"groups": [{"kind": "full", "block_size": 4},
...                             {"kind": "mamba", "block_size": 4, "drafter": "lookahead",
...                              "lookahead": 3}],
...                  "cached": [[True, {"upto": 6}], [True, {"upto": 6}]],
...                  "max_length": 7, "hash_unit": 2})
>>> print(draw(q))
query: M=7 A=2 h=2
group 0  full b=4                # # | # .
group 1  mamba b=4 lookahead=3   . # | # .
>>> print(judge(q, "target", 6))
target answered 6 (unsafe): group 1 (lookahead=3) has its key at L=6 cover the next 3 tokens, past the request's 8 tokens

A tiered query draws each tier's row under its group's, named by the tier; ``@``
marks a reused block wherever it is held:

>>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}, {"kind": "mamba", "block_size": 1}],
...                  "cached": ["100", "001"], "max_length": 3,
...                  "tiers": [{"name": "lmcache", "holds": ["full"], "cached": {"0": "011"}}]})
>>> print(draw(q, longest_hit(q).blocks))
query: M=3 A=1
group 0  full b=1    @ . .
  lmcache            . @ @
group 1  mamba b=1   . . @
>>> print(judge(q, "the pool alone", 1))
the pool alone answered 1 (lost reuse): L=3 is valid for every group
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvhit.model.spec import (
    Drafter,
    Group,
    Query,
    fine_row,
    key_reach,
    longest_hit,
    misses,
    touched_blocks,
)

MAX_DRAWN_BLOCKS = 64


def shown_blocks(q: Query, i: int) -> int:
    """How many blocks of group i matter: those a hit of at most M can touch."""
    return max(touched_blocks(q, q.groups[i]), 1)


def draw_row(
    row: Sequence[Any],
    count: int,
    marked: Sequence[int] = (),
    g: Group | None = None,
    unit: int | None = None,
) -> str:
    """Blocks as ``#`` (cached) and ``.`` (not); a marked cached block is ``@``.
    With a hash ``unit`` (and the row's group g), each block is its units, one cell
    each (:func:`kvhit.model.spec.fine_row`), and blocks are parted by ``|``."""
    marks = set(marked)
    shown = min(count, MAX_DRAWN_BLOCKS)
    per = 1 if g is None or unit is None else g.block_size // unit
    bits = fine_row(g, row[:shown], unit) if g is not None and unit is not None else row
    cells = []
    for j in range(shown):
        units = [j * per + i < len(bits) and bool(bits[j * per + i]) for i in range(per)]
        mark = "@" if j in marks else "#"
        cells.append(" ".join(mark if bit else "." for bit in units))
    more = f" … ({count} blocks)" if count > MAX_DRAWN_BLOCKS else ""
    return (" | " if per > 1 else " ").join(cells) + more


def draw(
    q: Query,
    marked: Sequence[Sequence[int]] | None = None,
    notes: Sequence[str] | None = None,
) -> str:
    """The query's header and one row of blocks per group.

    ``marked`` gives per group the blocks to draw as ``@`` (the reused ones);
    ``notes`` adds a note at the end of each group's row.
    """
    header = f"query: M={q.max_length} A={q.alignment}"
    if q.num_tokens != q.max_length + 1:
        header += f" T={q.num_tokens}"
    if q.hash_unit is not None:
        header += f" h={q.hash_unit}"
    labels = [f"group {i}  {g.describe()}" for i, g in enumerate(q.groups)]
    width = max(len(label) for label in [*labels, *(f"  {t.name}" for t in q.tiers)])
    lines = [header]
    for i, label in enumerate(labels):
        note = f"   {notes[i]}" if notes else ""
        rows = [(label, q.cached[i], note)]
        rows += [(f"  {t.name}", t.cached[i], "") for t in q.tiers if t.cached[i] is not None]
        for name, row, text in rows:
            cells = draw_row(
                row, shown_blocks(q, i), marked[i] if marked else (), q.groups[i], q.hash_unit
            )
            lines.append(f"{name.ljust(width)}   {cells}{text}".rstrip())
    return "\n".join(lines)


def run_text(run: range) -> str:
    """A run of blocks as people write it: ``3``, ``3, 4`` or ``3 … 9``."""
    if len(run) <= 2:
        return ", ".join(map(str, run))
    return f"{run.start} … {run.stop - 1}"


def explain(q: Query, length: int) -> str:
    """Why a hit of ``length`` is invalid (which group needs which block, or with a
    hash unit which units), or that it is valid."""
    found = misses(q, length)
    if not found:
        return f"L={length} is valid for every group"
    what = "block" if q.hash_unit is None else "unit"
    parts = []
    for miss in found:
        if miss.missing:
            count = sum(len(run) for run in miss.missing)
            noun = what if count == 1 else f"{what}s"
            listed = ", ".join(map(run_text, miss.missing))
            parts.append(f"group {miss.group} needs {noun} {listed} at L={length}, not cached")
        if miss.past_request:
            parts.append(past_request_text(q.groups[miss.group], miss.group, length, q))
    return "; ".join(parts)


def past_request_text(g: Group, i: int, length: int, q: Query) -> str:
    """Why group i's key at ``length`` reaches past the request: an eagle group's
    dropped block (or unit), a lookahead key's La tokens."""
    past = f"past the request's {q.num_tokens} tokens"
    if g.drafter == Drafter.LOOKAHEAD:
        covered = f"has its key at L={length} cover the next {key_reach(g)} tokens"
        return f"group {i} (lookahead={g.lookahead}) {covered}, {past}"
    what = "block" if q.hash_unit is None else "unit"
    return f"group {i} (eagle) needs the {what} after L={length}, {past}"


def verdict(length: int, best: int) -> str:
    """``unsafe``, ``lost reuse`` or ``correct`` for an answer against L*."""
    if length > best:
        return "unsafe"
    if length < best:
        return "lost reuse"
    return "correct"


def judge(q: Query, who: str, length: int) -> str:
    """One line: what ``who`` answered, the verdict, and the reason."""
    best = longest_hit(q).length
    said = f"{who} answered {length} ({verdict(length, best)})"
    if length > best:
        return f"{said}: {explain(q, length)}"
    if length < best:
        return f"{said}: L={best} is valid for every group"
    return said
