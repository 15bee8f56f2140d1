"""The wire form of a stateless answer: decoding what a target returned
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
from typing import Any

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
