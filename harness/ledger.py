"""The content ledger: what every physical block really holds, from the block tables
(docs/design.md §5.6).

An engine's index says which blocks are cached under which hash; the ledger keeps
the truth that index is supposed to describe. It learns it from the block tables a
stateful engine reports on ``admit`` (an :class:`~kvhit.targets.stateful.Admission`): a
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
the block must hold this request's next La tokens too. A block holds its tokens at
its position (from j · b on): one written at another index is stale too. Anything
else is a *stale block*: the engine serves KV computed for other tokens.

A request runs on after its admit until it finishes, reading the blocks of its
tables that its next tokens attend to (:func:`still_read`). :meth:`Ledger.hold`
notes what each must keep holding, and :meth:`Ledger.overwritten` says which one no
longer does: an *overwritten block*, handed to another request while this one runs.

    >>> from kvhit.model.spec import Group
    >>> from kvhit.contract import Admitted
    >>> from kvhit.targets.stateful import Admission
    >>> groups = (Group("full", 2),)
    >>> ledger = Ledger()
    >>> ledger.record(groups, (1, 2, 3), Admission(Admitted(0, ((),), ((5, 6),))), request=0, op=1)
    >>> ledger.problem(groups, (1, 2, 4), Admission(Admitted(2, ((5,),), ((5, 7),))))
    ''
    >>> ledger.problem(groups, (9, 9, 4), Admission(Admitted(2, ((5,),), ((5, 7),))))
    'stale block: group 0 block 0 is physical block 5, which holds [1 2] (written by r0 at op 1); this request needs [9 9]'

With a lookahead of 2 tokens, block 0 of [1 2 3] was written by a request that had
only one token past it, so a hit of 2 cannot have found it by its key:

    >>> groups = (Group("full", 2, drafter="lookahead", lookahead=2),)
    >>> ledger = Ledger()
    >>> ledger.record(groups, (1, 2, 3), Admission(Admitted(0, ((),), ((5, 6),))), request=0, op=1)
    >>> ledger.problem(groups, (1, 2, 3, 4, 5), Admission(Admitted(2, ((5,),), ((5, 7, 8),))))
    'stale block: group 0 block 0 is physical block 5, which holds [1 2 3] (written by r0 at op 1); this request needs [1 2 3 4] (2 tokens past the block for its lookahead key)'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from kvhit.contract import Direction, TierMove
from kvhit.model.spec import Drafter, Group, Kind, Query, answer_at, window_before
from kvhit.targets.stateful import Admission


@dataclass(frozen=True)
class Content:
    """What a physical block holds: group ``group``'s KV of the tokens from ``start``
    (the block's first position) up to ``end`` (a Mamba block: the state at ``end``)
    of the prefix ``tokens``, which runs through ``end`` and the group's lookahead
    past it (as far as the request had tokens), written by request ``request`` at op
    ``op``."""

    group: int
    tokens: tuple[int, ...]
    request: int
    op: int
    end: int
    start: int = 0


@dataclass(frozen=True)
class Need:
    """What a request needs of group ``group``'s block ``index`` (physical ``block``):
    the KV from the block's start through ``end`` of the prefix ``tokens`` (which may
    run on past ``end``: a lookahead key's tokens); with ``exact``, a Mamba state at
    exactly ``end``."""

    group: int
    index: int
    block: int
    start: int
    end: int
    tokens: tuple[int, ...]
    exact: bool = False

    def met_by(self, held: Content | None) -> bool:
        """Whether a block holding ``held`` gives what is needed."""
        return (
            held is not None
            and (held.group, held.start) == (self.group, self.start)
            and held.end >= self.end
            and (not self.exact or held.end == self.end)
            and held.tokens[: len(self.tokens)] == self.tokens
        )


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


def still_read(g: Group, num_tokens: int) -> range:
    """The block indices a running request of ``num_tokens`` tokens still reads for
    its next token: full attention every block, a sliding window the blocks of the
    tokens in its window, chunked local attention those of the current chunk, Mamba
    the block of its last state."""
    b = g.block_size
    last = -(-num_tokens // b)
    if g.kind == Kind.MAMBA:
        return range(last - 1, last)
    if g.kind == Kind.SLIDING_WINDOW:
        return range(max(0, num_tokens - window_before(g)) // b, last)
    if g.kind == Kind.CHUNKED_LOCAL:
        first = num_tokens // g.chunk * g.chunk
        return range(first // b, last if first < num_tokens else first // b)
    return range(last)


class Ledger:
    """The content of every physical block the engine has reported writing, and what
    each running request still needs of the blocks it holds."""

    def __init__(self, hash_unit: int | None = None) -> None:
        self.blocks: dict[int, Content] = {}
        self.slots: dict[tuple[int, int], Content] = {}
        self.needs: dict[int, tuple[Need, ...]] = {}
        self.hash_unit = hash_unit

    def move(self, moves: Sequence[TierMove]) -> None:
        """Follow an admit's moves, in order: a spill copies a block's content to a
        store's slot, a restore a slot's content to a block (a slot nothing was
        spilled to holds nothing, so a block restored from it holds nothing either).

            >>> ledger = Ledger()
            >>> ledger.blocks[3] = Content(0, (1, 2), request=0, op=1, end=2)
            >>> ledger.move([TierMove(Direction.SPILL, 3, 0, 7), TierMove(Direction.RESTORE, 5, 0, 7)])
            >>> ledger.blocks[5] == ledger.blocks[3], 4 in ledger.blocks
            (True, False)
        """
        for m in moves:
            if m.direction == Direction.SPILL:
                held = self.blocks.get(m.block)
                if held is None:
                    self.slots.pop((m.tier, m.slot), None)
                else:
                    self.slots[m.tier, m.slot] = held
            elif (m.tier, m.slot) in self.slots:
                self.blocks[m.block] = self.slots[m.tier, m.slot]
            else:
                self.blocks.pop(m.block, None)

    def problem(self, groups: Sequence[Group], tokens: Sequence[int], admitted: Admission) -> str:
        """Why the hit reads a block that does not hold this request's tokens, or ''."""
        tokens = tuple(tokens)
        length = admitted.admitted.length
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
        exact = g.kind == Kind.MAMBA and end == length
        need = Need(i, j, block, j * g.block_size, end, tokens[: end + ahead], exact)
        held = self.blocks.get(block)
        if need.met_by(held):
            return ""
        past = f" ({ahead} tokens past the block for its lookahead key)" if ahead else ""
        return (
            f"stale block: group {i} block {j} is physical block {block}, which "
            f"{describe(held, need)}; this request needs {tokens_text(need.tokens)}{past}"
        )

    def record(
        self,
        groups: Sequence[Group],
        tokens: Sequence[int],
        admission: Admission,
        request: int,
        op: int,
    ) -> None:
        """The request computed its blocks from the hit on: note what they hold now."""
        tokens, admitted = tuple(tokens), admission.admitted
        for i, (g, table) in enumerate(zip(groups, admitted.tables)):
            for j in range(admitted.length // g.block_size, len(table)):
                block = table[j]
                if block is not None:
                    end = written_end(g, j, len(tokens), self.hash_unit)
                    held = tokens[: end + lookahead_of(g)]
                    self.blocks[block] = Content(i, held, request, op, end, j * g.block_size)

    def hold(
        self, groups: Sequence[Group], tokens: Sequence[int], admission: Admission, request: int
    ) -> None:
        """The request runs on: until it finishes, every block of its tables that it
        still reads (:func:`still_read`) must keep its tokens' KV (a Mamba block the
        state the request left there)."""
        tokens, needs = tuple(tokens), []
        for i, (g, table) in enumerate(zip(groups, admission.admitted.tables)):
            for j in still_read(g, len(tokens)):
                block = table[j] if j < len(table) else None
                if block is None:
                    continue
                end = written_end(g, j, len(tokens), self.hash_unit)
                exact = g.kind == Kind.MAMBA
                needs.append(Need(i, j, block, j * g.block_size, end, tokens[:end], exact))
        self.needs[request] = tuple(needs)

    def release(self, request: int) -> None:
        """The request finished: it reads none of its blocks any more."""
        self.needs.pop(request, None)

    def overwritten(self) -> str:
        """Which block a running request still reads no longer holds what it needs
        (another request was handed it and wrote it), or ''."""
        for request, needs in self.needs.items():
            for need in needs:
                held = self.blocks.get(need.block)
                if not need.met_by(held):
                    return (
                        f"overwritten block: r{request}, still running, reads group "
                        f"{need.group} block {need.index}, physical block {need.block}, "
                        f"which {describe(held, need)}; r{request} needs "
                        f"{tokens_text(need.tokens)}"
                    )
        return ""


def describe(held: Content | None, need: Need) -> str:
    """What a block holds, for a message about what ``need`` wanted of it."""
    if held is None:
        return "no request has written"
    owner = "" if held.group == need.group else f"group {held.group}'s KV of "
    where = "" if held.start == need.start else f" from token {held.start}"
    return (
        f"holds {owner}{tokens_text(held.tokens)}{where} "
        f"(written by r{held.request} at op {held.op})"
    )
