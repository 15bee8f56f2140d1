"""The wire form of a stateless query and answer: a target written over parsed queries
(:class:`QueryTarget`), decoding what a target returned
(docs/design.md §5.2), and showing an odd answer in a message.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1}],
    ...                  "cached": ["10"], "max_length": 2})
    >>> decode_answer(q, {"length": 1, "blocks": [[0]]})
    (1, [[0]])
    >>> decode_answer(q, "1")
    Traceback (most recent call last):
    ...
    kvhit.targets.wire.BadReturn: the length must be an integer, got "1"
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Query


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


@dataclass(frozen=True)
class QueryTarget:
    """A lookup written over parsed queries, as the built-ins are. Called with a
    protocol message, as every target is, it parses the message first; a runner in this
    process hands it the :class:`~kvhit.model.spec.Query` itself (:attr:`answer`), so
    the query makes no round trip through JSON.

    >>> QueryTarget(lambda q: {"length": q.max_length})({"groups": [{"kind": "full", "block_size": 1}],
    ...                                                  "cached": ["1"], "max_length": 1})
    {'length': 1}
    """

    answer: Callable[[Query], dict[str, Any]]
    tiers: bool = False
    """Whether it answers queries with external tiers (docs/design.md §1.7); one that
    does not is :class:`~kvhit.errors.Unsupported` on them, never asked without them."""

    def __call__(self, message: dict[str, Any]) -> dict[str, Any]:
        return self.ask(parse_query(message))

    def ask(self, q: Query) -> dict[str, Any]:
        """Its answer to ``q``.

        >>> QueryTarget(lambda q: {"length": 0}).ask(parse_query(
        ...     {"groups": [{"kind": "full", "block_size": 1}], "cached": [""], "max_length": 1,
        ...      "tiers": [{"name": "cpu", "holds": ["full"], "cached": {"0": "1"}}]}))
        Traceback (most recent call last):
        ...
        kvhit.errors.Unsupported: this target reads its own pool only: a query with tiers (cpu) is asked of a target that restores from them (docs/protocol.md lists them)
        """
        if q.tiers and not self.tiers:
            names = ", ".join(t.name for t in q.tiers)
            raise Unsupported(
                f"this target reads its own pool only: a query with tiers ({names}) is asked "
                "of a target that restores from them (docs/protocol.md lists them)"
            )
        return self.answer(q)
