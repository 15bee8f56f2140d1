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

import json
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from kvhit.draw import explain
from kvhit.harness.runner import Reply
from kvhit.model.ops import PY
from kvhit.model.spec import Answer, Query, reused_blocks


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


class BadReturn(ValueError):
    """An answer that does not follow the target protocol."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def json_safe(value: Any) -> Any:
    """``value`` as plain JSON data (anything JSON cannot hold becomes its repr), so a
    target's odd answer can still be saved and shown.

    >>> json_safe({"length": (1, 2), "x": object})
    {'length': [1, 2], 'x': "<class 'object'>"}
    """
    return json.loads(json.dumps(value, default=repr))


def shown(value: Any) -> str:
    """A short JSON rendering of a target's answer, for messages."""
    return json.dumps(json_safe(value))[:80]


def decode_answer(q: Query, value: Any) -> tuple[int, list[list[int]] | None]:
    """The length and (if given) the blocks of an answer; :class:`BadReturn` if malformed."""
    blocks = None
    if isinstance(value, dict):
        if "length" not in value:
            raise BadReturn(f"an answer dict needs a 'length', got {shown(value)}")
        length, blocks = value["length"], value.get("blocks")
    else:
        length = value
    if not _is_int(length):
        raise BadReturn(f"the length must be an integer, got {shown(length)}")
    if length < 0 or length > q.max_length or length % q.alignment:
        raise BadReturn(
            f"length {length} is not a candidate: a multiple of A={q.alignment} "
            f"from 0 to M={q.max_length}"
        )
    if blocks is None:
        return length, None
    if not (
        isinstance(blocks, list)
        and len(blocks) == len(q.groups)
        and all(isinstance(b, list) and all(_is_int(j) for j in b) for b in blocks)
    ):
        raise BadReturn(f"blocks must be one list of block indices per group ({len(q.groups)})")
    return length, blocks


def blocks_problem(q: Query, length: int, blocks: list[list[int]]) -> str:
    """Why the listed blocks are wrong for a hit of ``length``, or '' when they are right."""
    for i, (g, row, listed) in enumerate(zip(q.groups, q.cached, blocks)):
        past = -(-length // g.block_size)
        for j in listed:
            if not PY.bit(row, j):
                return f"group {i} lists block {j}, which is not cached"
            if j >= past:
                return f"group {i} lists block {j}, past the hit of {length} tokens"
        missing = sorted(set(reused_blocks(g, length)) - set(listed))
        if missing:
            return f"group {i} needs block {missing[0]} at L={length}, not listed"
    return ""


def judge_reply(q: Query, reply: Reply, best: Answer) -> Outcome:
    """The class of ``reply`` to query ``q`` whose reference answer is ``best``."""
    if reply.status != "answer":
        return Outcome(ReplyClass(reply.status), reason=reply.detail)
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
