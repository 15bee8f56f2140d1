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
"""

from __future__ import annotations

from collections.abc import Sequence

from kvhit.model.spec import Query, longest_hit, misses, touched_blocks

MAX_DRAWN_BLOCKS = 64


def shown_blocks(q: Query, i: int) -> int:
    """How many blocks of group i matter: those a hit of at most M can touch."""
    return max(touched_blocks(q, q.groups[i]), 1)


def draw_row(row: Sequence[bool], count: int, marked: Sequence[int] = ()) -> str:
    """Blocks as ``#`` (cached) and ``.`` (not); a marked cached block is ``@``."""
    marks = set(marked)
    cells = [
        ("@" if j in marks else "#") if j < len(row) and row[j] else "."
        for j in range(min(count, MAX_DRAWN_BLOCKS))
    ]
    more = f" … ({count} blocks)" if count > MAX_DRAWN_BLOCKS else ""
    return " ".join(cells) + more


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
    labels = [f"group {i}  {g.describe()}" for i, g in enumerate(q.groups)]
    width = max(len(label) for label in labels)
    lines = [header]
    for i, label in enumerate(labels):
        row = draw_row(q.cached[i], shown_blocks(q, i), marked[i] if marked else ())
        note = f"   {notes[i]}" if notes else ""
        lines.append(f"{label.ljust(width)}   {row}{note}".rstrip())
    return "\n".join(lines)


def run_text(run: range) -> str:
    """A run of blocks as people write it: ``3``, ``3, 4`` or ``3 … 9``."""
    if len(run) <= 2:
        return ", ".join(map(str, run))
    return f"{run.start} … {run.stop - 1}"


def explain(q: Query, length: int) -> str:
    """Why a hit of ``length`` is invalid (which group needs which block), or that it is valid."""
    found = misses(q, length)
    if not found:
        return f"L={length} is valid for every group"
    parts = []
    for miss in found:
        if miss.missing:
            count = sum(len(run) for run in miss.missing)
            noun = "block" if count == 1 else "blocks"
            listed = ", ".join(map(run_text, miss.missing))
            parts.append(f"group {miss.group} needs {noun} {listed} at L={length}, not cached")
        if miss.past_request:
            parts.append(
                f"group {miss.group} (eagle) needs the block after L={length}, "
                f"past the request's {q.num_tokens} tokens"
            )
    return "; ".join(parts)


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
