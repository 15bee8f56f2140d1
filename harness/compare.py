"""Judging a target's reply against the reference answer L* (docs/design.md §5.3).

Classes of disagreement (:class:`~kvhit.analysis.Verdict`), worst first:

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
    >>> q = Analysis(parse_query({"groups": [{"kind": "full", "block_size": 1}],
    ...                           "cached": ["10"], "max_length": 2}))
    >>> judge_reply(q, Reply("answer", 2)).cls
    <Verdict.UNSAFE: 'unsafe'>
    >>> judge_reply(q, Reply("answer", {"length": 1, "blocks": [[1]]})).reason
    'group 0 lists block 1, which is not cached'
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from kvhit.analysis import Analysis, Verdict
from kvhit.draw import length_reason
from kvhit.model.ops import PY
from kvhit.model.spec import Upto
from kvhit.targets.runner import Reply
from kvhit.targets.wire import BadReturn, decode_answer


@dataclass(frozen=True)
class Outcome:
    """The class of one reply, the length the target gave (when it gave one) and the
    reason, for people."""

    cls: Verdict
    length: int | None = None
    reason: str = ""

    @property
    def disagrees(self) -> bool:
        """Whether this is a disagreement (neither ok, unsupported nor rejected)."""
        return self.cls.disagrees


class EndsInOutcome:
    """A run that ends at its ``last`` entry (an operation or a step, with an
    ``outcome``): its class and reason are that entry's."""

    @property
    def last(self) -> Any:
        """The entry the run ended at."""
        raise NotImplementedError

    @property
    def cls(self) -> Verdict:
        """The class of the disagreement."""
        return self.last.outcome.cls

    @property
    def reason(self) -> str:
        """Why it is a disagreement, for people."""
        return self.last.outcome.reason


def held(row: Sequence[Any], j: int) -> bool:
    """Whether block j of a row is cached, wholly or (:class:`Upto`) in part."""
    return 0 <= j < len(row) and (isinstance(row[j], Upto) or PY.bit(row, j))


def blocks_problem(a: Analysis, length: int, blocks: list[list[int]]) -> str:
    """Why the listed blocks are wrong for a hit of ``length``, or '' when they are right."""
    q = a.query
    needed = a.answer_at(length).blocks
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
        return Outcome(Verdict(reply.status), reason=reply.detail)
    return None


def judge_reply(a: Analysis, reply: Reply) -> Outcome:
    """The class of ``reply`` to the analysed query. L* is worked out (when the
    analysis does not hold it yet) only for a reply that holds an answer."""
    outcome = unanswered(reply)
    if outcome is not None:
        return outcome
    try:
        length, blocks = decode_answer(a.query, reply.value)
    except BadReturn as err:
        return Outcome(Verdict.BAD_RETURN, reason=str(err))
    verdict = a.verdict(length)
    if verdict != Verdict.OK:
        return Outcome(verdict, length, length_reason(a, length))
    problem = blocks_problem(a, length, blocks) if blocks is not None else ""
    if problem:
        return Outcome(Verdict.WRONG_BLOCKS, length, problem)
    return Outcome(Verdict.OK, length)
