"""The content ledger: what every physical block really holds, from the block tables
(docs/design.md §5.6).

An engine's index says which blocks are cached under which hash; the ledger keeps
the truth that index is supposed to describe. It learns it from the block tables a
stateful engine reports on ``admit`` (:mod:`kvhit.targets.stateful`): a
request of tokens t (T of them) with a hit of L tokens computes every block from
index L // b on, so block j of group g's table now holds t's KV up to the end of
block j, or up to T for a partial last block (:func:`written_end`; a Mamba block
holds the one state at that end, which with a hash unit h is the last multiple of h
the request's keys reach). A block reallocated to another request holds that
request's tokens. Blocks below L // b are read, not written.

A hit is then valid under the ledger when, in every group, each block the hit
reads (the spec's reused blocks at L, a block the hit ends inside read up to L) is
in the table (or copied into it), and each block of the table below L (and the one
the hit ends inside, when the group reads it) holds exactly this request's prefix
through what is read; a Mamba block holds the state at exactly L. A group with a lookahead
drafter of La tokens finds a block by a key that also covers the next La tokens, so
the block must hold this request's next La tokens too. Anything else is a *stale
block*: the engine serves KV computed for other tokens.

    >>> from kvhit.model.spec import Group
    >>> from kvhit.targets.stateful import Admitted
    >>> groups = (Group("full", 2),)
    >>> ledger = Ledger()
    >>> ledger.record(groups, (1, 2, 3), Admitted(0, ((),), ((5, 6),)), request=0, op=1)
    >>> ledger.problem(groups, (1, 2, 4), Admitted(2, ((5,),), ((5, 7),)))
    ''
    >>> ledger.problem(groups, (9, 9, 4), Admitted(2, ((5,),), ((5, 7),)))
    'stale block: group 0 block 0 is physical block 5, which holds [1 2] (written by r0 at op 1); this request needs [9 9]'

With a lookahead of 2 tokens, block 0 of [1 2 3] was written by a request that had
only one token past it, so a hit of 2 cannot have found it by its key:

    >>> groups = (Group("full", 2, drafter="lookahead", lookahead=2),)
    >>> ledger = Ledger()
    >>> ledger.record(groups, (1, 2, 3), Admitted(0, ((),), ((5, 6),)), request=0, op=1)
    >>> ledger.problem(groups, (1, 2, 3, 4, 5), Admitted(2, ((5,),), ((5, 7, 8),)))
    'stale block: group 0 block 0 is physical block 5, which holds [1 2 3] (written by r0 at op 1); this request needs [1 2 3 4] (2 tokens past the block for its lookahead key)'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvhit.model.spec import Drafter, Group, Kind, Query, answer_at
from kvhit.targets.stateful import Admitted


@dataclass(frozen=True)
class Content:
    """What a physical block holds: group ``group``'s KV up to token ``end`` (a Mamba
    block: the state at ``end``) of the prefix ``tokens``, which runs through ``end``
    and the group's lookahead past it (as far as the request had tokens), written by
    request ``request`` at op ``op``."""

    group: int
    tokens: tuple[int, ...]
    request: int
    op: int
    end: int


def tokens_text(tokens: Sequence[int]) -> str:
    """Tokens as ``[1 2 3]``."""
    return "[" + " ".join(map(str, tokens)) + "]"


def lookahead_of(g: Group) -> int:
    """How many tokens past what a block holds its key covers (La, or 0)."""
    return g.lookahead if g.drafter == Drafter.LOOKAHEAD else 0


def written_end(g: Group, j: int, num_tokens: int, hash_unit: int | None) -> int:
    """How far block j of group g holds KV once a request of ``num_tokens`` tokens
    wrote it: its end, or T for the last block. A Mamba block holds one state, at
    the last multiple of the hash unit (1 without one) up to there that the
    request's keys reach (T - La with a lookahead drafter)."""
    end = min((j + 1) * g.block_size, num_tokens)
    if g.kind != Kind.MAMBA:
        return end
    unit = hash_unit or 1
    return min(end, num_tokens - lookahead_of(g)) // unit * unit


class Ledger:
    """The content of every physical block the engine has reported writing."""

    def __init__(self, hash_unit: int | None = None) -> None:
        self.blocks: dict[int, Content] = {}
        self.hash_unit = hash_unit

    def problem(self, groups: Sequence[Group], tokens: Sequence[int], admitted: Admitted) -> str:
        """Why the hit reads a block that does not hold this request's tokens, or ''."""
        tokens = tuple(tokens)
        length = admitted.length
        q = Query(tuple(groups), tuple(() for _ in groups), length, length + 1, 1, self.hash_unit)
        reads = answer_at(q, length).blocks
        for i, (g, read) in enumerate(zip(groups, reads)):
            for j in read:
                if admitted.read_block(i, j) is None:
                    return (
                        f"stale block: group {i} reads block {j} at L={length}, "
                        "but its table holds no block there"
                    )
            whole = length // g.block_size
            inside = [whole] if length % g.block_size and whole in read else []
            for j in [*range(whole), *inside]:
                block = admitted.read_block(i, j)
                if block is None:
                    continue
                problem = self.block_problem(g, i, j, block, tokens, length)
                if problem:
                    return problem
        return ""

    def block_problem(
        self, g: Group, i: int, j: int, block: int, tokens: tuple[int, ...], length: int
    ) -> str:
        """Why block j of group g (physical ``block``) does not hold this request's
        prefix up to ``length`` (a Mamba block the hit reads: its state at exactly
        ``length``), or ''."""
        end = min((j + 1) * g.block_size, length)
        ahead = lookahead_of(g)
        wanted = tokens[: end + ahead]
        held = self.blocks.get(block)
        state_at = g.kind == Kind.MAMBA and end == length
        fits = held is not None and held.end >= end and (not state_at or held.end == end)
        if held is not None and fits and (held.group, held.tokens[: len(wanted)]) == (i, wanted):
            return ""
        past = f" ({ahead} tokens past the block for its lookahead key)" if ahead else ""
        return (
            f"stale block: group {i} block {j} is physical block {block}, which "
            f"{describe(held, i)}; this request needs {tokens_text(wanted)}{past}"
        )

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
        for i, (g, table) in enumerate(zip(groups, admitted.tables)):
            for j in range(admitted.length // g.block_size, len(table)):
                block = table[j]
                if block is not None:
                    end = written_end(g, j, len(tokens), self.hash_unit)
                    held = tokens[: end + lookahead_of(g)]
                    self.blocks[block] = Content(i, held, request, op, end)


def describe(held: Content | None, group: int) -> str:
    """What a block holds, for a message about group ``group``."""
    if held is None:
        return "no request has written"
    owner = "" if held.group == group else f"group {held.group}'s KV of "
    return f"holds {owner}{tokens_text(held.tokens)} (written by r{held.request} at op {held.op})"
