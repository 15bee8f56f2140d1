"""Judging a target's reply against the reference answer L* (docs/design.md §5.3).

Classes of disagreement, worst first:

    unsafe        the length is longer than L* (the engine would read missing KV)
    lost_reuse    the length is shorter than L*
    wrong_blocks  the length is right, the blocks are not: a listed block is not
                  cached or is past the hit, or a block the hit needs is missing
    crash         the target raised
    timeout       no answer within the per-call limit
    bad_return    not an int or a {"length", "blocks"} dict, or a length that is no
                  candidate (negative, past M, not a multiple of A)

``unsupported`` (the target refused the configuration) is counted, never a disagreement;
nor is ``rejected`` (a stateful engine whose pool cannot hold a request now).

    >>> from kvhit.model.protocol import parse_query
    >>> from kvhit.model.spec import longest_hit
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}],
    ...                  "cached": ["10"], "max_length": 2})
    >>> judge_reply(q, Reply("answer", 2), longest_hit(q)).cls
    <ReplyClass.UNSAFE: 'unsafe'>
    >>> judge_reply(q, Reply("answer", {"length": 1, "blocks": [[1]]}), longest_hit(q)).reason
    'group 0 lists block 1, which is not cached'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvhit.draw import explain
from kvhit.model.ops import PY
from kvhit.model.spec import Answer, Query, Upto, answer_at
from kvhit.targets.runner import Reply
from kvhit.targets.wire import BadReturn, decode_answer


class ReplyClass(StrEnum):
    """The class of a reply (the table above); a member equals its name as a string."""

    OK = "ok"
    UNSAFE = "unsafe"
    LOST_REUSE = "lost_reuse"
    WRONG_BLOCKS = "wrong_blocks"
    CRASH = "crash"
    TIMEOUT = "timeout"
    BAD_RETURN = "bad_return"
    UNSUPPORTED = "unsupported"
    REJECTED = "rejected"


NOT_DISAGREEMENTS = (ReplyClass.OK, ReplyClass.UNSUPPORTED, ReplyClass.REJECTED)
CLASSES = tuple(c for c in ReplyClass if c not in NOT_DISAGREEMENTS)
"""The disagreement classes, worst first."""


@dataclass(frozen=True)
class Outcome:
    """The class of one reply (``ok``, ``unsupported`` or one of :data:`CLASSES`),
    the length the target gave (when it gave one) and the reason, for people."""

    cls: ReplyClass
    length: int | None = None
    reason: str = ""

    @property
    def disagrees(self) -> bool:
        """Whether this is a disagreement (neither ok nor unsupported)."""
        return self.cls not in NOT_DISAGREEMENTS


def held(row: Sequence[Any], j: int) -> bool:
    """Whether block j of a row is cached, wholly or (:class:`Upto`) in part."""
    return 0 <= j < len(row) and (isinstance(row[j], Upto) or PY.bit(row, j))


def blocks_problem(q: Query, length: int, blocks: list[list[int]]) -> str:
    """Why the listed blocks are wrong for a hit of ``length``, or '' when they are right."""
    needed = answer_at(q, length).blocks
    for i, (g, listed, reused) in enumerate(zip(q.groups, blocks, needed)):
        past = -(-length // g.block_size)
        rows = [q.cached[i], *(t.cached[i] or () for t in q.tiers)]
        for j in listed:
            if not any(held(row, j) for row in rows):
                return f"group {i} lists block {j}, which is not cached"
            if j >= past:
                return f"group {i} lists block {j}, past the hit of {length} tokens"
        missing = sorted(set(reused) - set(listed))
        if missing:
            return f"group {i} needs block {missing[0]} at L={length}, not listed"
    return ""


def unanswered(reply: Reply) -> Outcome | None:
    """The class of a reply that holds no answer (a crash, a timeout, a refusal ...),
    which needs no reference answer to judge; None for an answer."""
    if reply.status != "answer":
        return Outcome(ReplyClass(reply.status), reason=reply.detail)
    return None


def judge_reply(q: Query, reply: Reply, best: Answer) -> Outcome:
    """The class of ``reply`` to query ``q`` whose reference answer is ``best``."""
    outcome = unanswered(reply)
    if outcome is not None:
        return outcome
    try:
        length, blocks = decode_answer(q, reply.value)
    except BadReturn as err:
        return Outcome(ReplyClass.BAD_RETURN, reason=str(err))
    if length > best.length:
        return Outcome(ReplyClass.UNSAFE, length, explain(q, length))
    if length < best.length:
        return Outcome(ReplyClass.LOST_REUSE, length, f"L={best.length} is valid for every group")
    problem = blocks_problem(q, length, blocks) if blocks is not None else ""
    if problem:
        return Outcome(ReplyClass.WRONG_BLOCKS, length, problem)
    return Outcome(ReplyClass.OK, length)
