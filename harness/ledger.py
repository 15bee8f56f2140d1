"""The content ledger: what every physical block really holds, from the block tables
(docs/design.md §5.6).

An engine's index says which blocks are cached under which hash; the ledger keeps
the truth that index is supposed to describe. It learns it from the block tables a
stateful engine reports on ``admit`` (:mod:`kvhit.targets.stateful`): a
request of tokens t with a hit of L tokens computes every block from index L // b
on, so block j of group g's table now holds t's tokens up to the end of block j (up
to T for a partial last block). A block reallocated to another request holds that
request's tokens. Blocks below L // b are read, not written.

A hit is then valid under the ledger when, in every group, each block the hit
reads (the spec's reused blocks at L) is in the table and holds exactly this
request's prefix through that block. Anything else is a *stale block*: the engine
serves KV computed for other tokens.

    >>> from kvhit.model.spec import Group
    >>> from kvhit.targets.stateful import Admitted
    >>> groups = (Group("full", 2),)
    >>> ledger = Ledger()
    >>> ledger.record(groups, (1, 2, 3), Admitted(0, ((),), ((5, 6),)), request=0, op=1)
    >>> ledger.problem(groups, (1, 2, 4), Admitted(2, ((5,),), ((5, 7),)))
    ''
    >>> ledger.problem(groups, (9, 9, 4), Admitted(2, ((5,),), ((5, 7),)))
    'stale block: group 0 block 0 is physical block 5, which holds [1 2] (written by r0 at op 1); this request needs [9 9]'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvhit.model.spec import Group, reused_blocks
from kvhit.targets.stateful import Admitted


@dataclass(frozen=True)
class Content:
    """What a physical block holds: group ``group``'s KV of ``tokens`` (a whole
    prefix, through the block's end), written by request ``request`` at op ``op``."""

    group: int
    tokens: tuple[int, ...]
    request: int
    op: int


def tokens_text(tokens: Sequence[int]) -> str:
    """Tokens as ``[1 2 3]``."""
    return "[" + " ".join(map(str, tokens)) + "]"


class Ledger:
    """The content of every physical block the engine has reported writing."""

    def __init__(self) -> None:
        self.blocks: dict[int, Content] = {}

    def problem(self, groups: Sequence[Group], tokens: Sequence[int], admitted: Admitted) -> str:
        """Why the hit reads a block that does not hold this request's tokens, or ''."""
        tokens = tuple(tokens)
        for g, (group, table) in enumerate(zip(groups, admitted.tables)):
            b = group.block_size
            for j in reused_blocks(group, admitted.length):
                block = table[j] if j < len(table) else None
                if block is None:
                    return (
                        f"stale block: group {g} reads block {j} at L={admitted.length}, "
                        "but its table holds no block there"
                    )
            for j, block in enumerate(table[: admitted.length // b]):
                if block is None:
                    continue
                held = self.blocks.get(block)
                wanted = tokens[: (j + 1) * b]
                if held is None or (held.group, held.tokens) != (g, wanted):
                    return (
                        f"stale block: group {g} block {j} is physical block {block}, which "
                        f"{describe(held, g)}; this request needs {tokens_text(wanted)}"
                    )
        return ""

    def record(
        self,
        groups: Sequence[Group],
        tokens: Sequence[int],
        admitted: Admitted,
        request: int,
        op: int,
    ) -> None:
        """The request computed its blocks from the hit on: note what they hold now."""
        tokens = tuple(tokens)
        for g, (group, table) in enumerate(zip(groups, admitted.tables)):
            b = group.block_size
            for j in range(admitted.length // b, len(table)):
                block = table[j]
                if block is not None:
                    self.blocks[block] = Content(g, tokens[: (j + 1) * b], request, op)


def describe(held: Content | None, group: int) -> str:
    """What a block holds, for a message about group ``group``."""
    if held is None:
        return "no request has written"
    owner = "" if held.group == group else f"group {held.group}'s KV of "
    return f"holds {owner}{tokens_text(held.tokens)} (written by r{held.request} at op {held.op})"
