"""Drawing cache states and explaining answers, for people (docs/design.md §5.4).

>>> from kvhit.model.protocol import parse_query
>>> q = parse_query({"groups": [{"kind": "sliding_window", "block_size": 1, "window": 2}] * 2,
...                  "cached": ["01", "10"], "max_length": 2})
>>> print(draw(q))
query: M=2 A=1
group 0  sliding_window w=2 b=1   . #
group 1  sliding_window w=2 b=1   # .
>>> print(judge(Analysis(q), "target", 1))
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
>>> print(judge(Analysis(q), "target", 6))
target answered 6 (unsafe): group 1 (lookahead=3) has its key at L=6 cover the next 3 tokens, past the request's 8 tokens

A tiered query draws each tier's row under its group's, named by the tier; ``@``
marks a reused block (or unit) wherever it is held:

>>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}, {"kind": "mamba", "block_size": 1}],
...                  "cached": ["100", "001"], "max_length": 3,
...                  "tiers": [{"name": "lmcache", "holds": ["full"], "cached": {"0": "011"}}]})
>>> a = Analysis(q)
>>> print(draw(q, a.longest_hit))
query: M=3 A=1
group 0  full b=1    @ . .
  lmcache            . @ @
group 1  mamba b=1   . . @
>>> print(judge(a, "the pool alone", 1))
the pool alone answered 1 (lost reuse): L=3 is valid for every group

A hit reads only some units of a block it reuses (a Mamba group one state, the one at
the hit), and only those are marked:

>>> q = parse_query({"groups": [{"kind": "mamba", "block_size": 4}], "cached": [[{"upto": 2}]],
...                  "max_length": 4, "hash_unit": 2,
...                  "tiers": [{"name": "cpu", "holds": ["mamba"], "cached": {"0": [True]}}]})
>>> print(draw(q, Analysis(q).longest_hit))
query: M=4 A=2 h=2
group 0  mamba b=4   # .
  cpu                . @
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from kvhit.analysis import Analysis, Verdict
from kvhit.model.spec import (
    Answer,
    Drafter,
    Group,
    Query,
    fine_row,
    key_reach,
    reused_range,
    touched_blocks,
)

MAX_DRAWN_BLOCKS = 64


def shown_blocks(q: Query, i: int) -> int:
    """How many blocks of group i matter: those a hit of at most M can touch."""
    return max(touched_blocks(q, q.groups[i]), 1)


def marked_units(g: Group, unit: int, blocks: Sequence[int], length: int) -> set[int]:
    """The units (of ``unit`` tokens, numbered from the row's start) to draw as reused
    when group g reuses ``blocks`` at a hit of ``length``: in each block, the units
    that hit reads (a Mamba group's one state, the one at the hit; attention's units
    before the hit), or every unit of a block the hit reads nothing of (a block listed
    past the hit, drawn where it is claimed).

    >>> sorted(marked_units(Group("mamba", 4), 2, [0], 4)), sorted(marked_units(Group("full", 4), 2, [1], 6))
    ([1], [2])
    >>> sorted(marked_units(Group("full", 2), 2, [3], 2))
    [3]
    """
    per = g.block_size // unit
    lo, hi = reused_range(replace(g, block_size=unit), length) if length else (0, 0)
    out: set[int] = set()
    for j in blocks:
        read = range(max(lo, j * per), min(hi, (j + 1) * per))
        out.update(read or range(j * per, (j + 1) * per))
    return out


def draw_row(row: Sequence[Any], count: int, marked: set[int], g: Group, unit: int) -> str:
    """Blocks as ``#`` (cached) and ``.`` (not), each block its units of ``unit`` tokens
    (:func:`kvhit.model.spec.fine_row`; a block is one unit when ``unit`` is its size),
    blocks parted by ``|`` when they have several; a ``marked`` unit held is ``@``."""
    shown = min(count, MAX_DRAWN_BLOCKS)
    per = g.block_size // unit
    bits = fine_row(g, row[:shown], unit)
    cells = []
    for j in range(shown):
        units = range(j * per, (j + 1) * per)
        held = [u < len(bits) and bits[u] for u in units]
        cells.append(
            " ".join(("@" if u in marked else "#") if bit else "." for u, bit in zip(units, held))
        )
    more = f" … ({count} blocks)" if count > MAX_DRAWN_BLOCKS else ""
    return (" | " if per > 1 else " ").join(cells) + more


def draw(q: Query, reused: Answer | None = None, notes: Sequence[str] | None = None) -> str:
    """The query's header and one row of blocks per group (and per tier that holds
    some of the group's), with a hash unit each block drawn as its units.

    ``reused`` is the answer drawn (L*'s, or a target's): its blocks are drawn as ``@``
    at the units its length reads (:func:`marked_units`); ``notes`` adds a note at the
    end of each group's row.
    """
    header = f"query: M={q.max_length} A={q.alignment}"
    if q.num_tokens != q.max_length + 1:
        header += f" T={q.num_tokens}"
    if q.hash_unit is not None:
        header += f" h={q.hash_unit}"
    labels = [f"group {i}  {g.describe()}" for i, g in enumerate(q.groups)]
    width = max(len(label) for label in [*labels, *(f"  {t.name}" for t in q.tiers)])
    lines = [header]
    for i, (label, g) in enumerate(zip(labels, q.groups)):
        unit = g.block_size if q.hash_unit is None else q.hash_unit
        marked = marked_units(g, unit, reused.blocks[i], reused.length) if reused else set()
        note = f"   {notes[i]}" if notes else ""
        rows = [(label, q.cached[i], note)]
        rows += [(f"  {t.name}", t.cached[i], "") for t in q.tiers if t.cached[i] is not None]
        for name, row, text in rows:
            cells = draw_row(row, shown_blocks(q, i), marked, g, unit)
            lines.append(f"{name.ljust(width)}   {cells}{text}".rstrip())
    return "\n".join(lines)


def run_text(run: range) -> str:
    """A run of blocks as people write it: ``3``, ``3, 4`` or ``3 … 9``."""
    if len(run) <= 2:
        return ", ".join(map(str, run))
    return f"{run.start} … {run.stop - 1}"


def explain(a: Analysis, length: int) -> str:
    """Why a hit of ``length`` is invalid for the analysed query (which group needs which
    block, or with a hash unit which units), or that it is valid."""
    q = a.query
    found = a.misses(length)
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


def length_reason(a: Analysis, length: int) -> str:
    """Why a hit of ``length`` is wrong against L* (:meth:`Analysis.verdict`): an unsafe
    one's missing blocks, a lost reuse's longer valid hit; '' when it is L*."""
    verdict = a.verdict(length)
    if verdict == Verdict.UNSAFE:
        return explain(a, length)
    if verdict == Verdict.LOST_REUSE:
        return f"L={a.longest_hit.length} is valid for every group"
    return ""


def judge(a: Analysis, who: str, length: int) -> str:
    """One line: what ``who`` answered, the verdict (:attr:`Verdict.label`), and the
    reason (:func:`length_reason`)."""
    said = f"{who} answered {length} ({a.verdict(length).label})"
    reason = length_reason(a, length)
    return f"{said}: {reason}" if reason else said
