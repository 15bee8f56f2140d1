"""The JSON query protocol (docs/design.md §5.1): parse, check and normalize queries.

    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 2}],
    ...                  "cached": ["110"], "max_length": 5})
    >>> q.cached, q.alignment, q.num_tokens
    (((True, True, False),), 2, 6)
    >>> parse_query({"groups": [{"kind": "sliding_window", "block_size": 2}],
    ...              "cached": [[]], "max_length": 5})
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: groups[0].window: missing: a sliding_window group needs a window

Every problem raises :class:`QueryError`, whose message starts with the field.
"""

from __future__ import annotations

import json
from typing import Any

from kvhit.model.spec import (
    DRAFTERS,
    EAGLE_KINDS,
    KINDS,
    LOCAL,
    PARAMETERS,
    WINDOW_CONVENTIONS,
    Drafter,
    Group,
    Kind,
    Query,
    Tier,
    Upto,
    WindowConvention,
    default_alignment,
)

QUERY_FIELDS = {"groups", "cached", "max_length", "num_tokens", "alignment", "hash_unit", "tiers"}
TIER_FIELDS = {"name", "holds", "cached"}
GROUP_FIELDS = {
    "kind",
    "block_size",
    "window",
    "chunk",
    "eagle",
    "drafter",
    "lookahead",
    "window_convention",
}


class QueryError(ValueError):
    """A query that is not a valid protocol query; the message names the field."""

    def __init__(self, field: str, reason: str):
        super().__init__(f"{field}: {reason}")
        self.field = field
        self.reason = reason


def _int(value: Any, field: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QueryError(field, f"must be an integer, got {json.dumps(value)}")
    if value < minimum:
        raise QueryError(field, f"must be at least {minimum}, got {value}")
    return value


def _object(value: Any, field: str, allowed: set[str]) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise QueryError(field, f"must be a JSON object, got {type(value).__name__}")
    unknown = sorted(set(value) - allowed)
    if unknown:
        raise QueryError(f"{field}.{unknown[0]}" if field else unknown[0], "unknown field")
    return value


def parse_group(obj: Any, field: str) -> Group:
    """Check one group object and build its :class:`Group`."""
    obj = _object(obj, field, GROUP_FIELDS)
    kind = obj.get("kind")
    if kind not in KINDS:
        shown = "missing" if kind is None else f"unknown kind {json.dumps(kind)}"
        raise QueryError(f"{field}.kind", f"{shown}; expected one of {', '.join(KINDS)}")
    if "block_size" not in obj:
        raise QueryError(f"{field}.block_size", "missing")
    block_size = _int(obj["block_size"], f"{field}.block_size", 1)
    kind = Kind(kind)
    params: dict[str, int] = {}
    key = PARAMETERS[kind]
    for other in PARAMETERS.values():
        if other is not None and other in obj and other != key:
            raise QueryError(f"{field}.{other}", f"not a parameter of a {kind} group")
    if key is not None:
        if key not in obj:
            raise QueryError(f"{field}.{key}", f"missing: a {kind} group needs a {key}")
        params[key] = _int(obj[key], f"{field}.{key}", 1)
    convention = parse_window_convention(obj, field, kind)
    drafter = parse_drafter(obj, field, kind)
    lookahead = parse_lookahead(obj, field, drafter)
    return Group(
        kind,
        block_size,
        drafter=drafter,
        lookahead=lookahead,
        window_convention=convention,
        **params,
    )


def parse_drafter(obj: dict[str, Any], field: str, kind: Kind) -> Drafter | None:
    """A group's drafter: ``drafter`` (drop, none or lookahead), or ``eagle: true``,
    which means ``drafter: drop``; None when the group has none.

    >>> parse_group({"kind": "mamba", "block_size": 2, "drafter": "drop"}, "g")
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: g.drafter: a mamba group cannot carry a drop drafter (only none, lookahead)
    """
    eagle = obj.get("eagle", False)
    if not isinstance(eagle, bool):
        raise QueryError(f"{field}.eagle", f"must be true or false, got {json.dumps(eagle)}")
    if eagle and kind not in EAGLE_KINDS:
        raise QueryError(
            f"{field}.eagle", f"only {' and '.join(EAGLE_KINDS)} groups can be eagle, not {kind}"
        )
    named = obj.get("drafter")
    if named is None:
        return Drafter.DROP if eagle else None
    if named not in tuple(Drafter):
        raise QueryError(
            f"{field}.drafter",
            f"expected one of {', '.join(Drafter)}, got {json.dumps(named)}",
        )
    drafter = Drafter(named)
    if eagle and drafter != Drafter.DROP:
        raise QueryError(f"{field}.eagle", f"true means drafter drop, but drafter is {drafter}")
    if drafter not in DRAFTERS[kind]:
        allowed = ", ".join(DRAFTERS[kind])
        raise QueryError(
            f"{field}.drafter", f"a {kind} group cannot carry a {drafter} drafter (only {allowed})"
        )
    return drafter


def parse_lookahead(obj: dict[str, Any], field: str, drafter: Drafter | None) -> int:
    """La, the tokens past its block a lookahead drafter's key covers (0 otherwise)."""
    if drafter != Drafter.LOOKAHEAD:
        if "lookahead" in obj:
            raise QueryError(f"{field}.lookahead", "only a lookahead drafter has one")
        return 0
    if "lookahead" not in obj:
        raise QueryError(f"{field}.lookahead", "missing: a lookahead drafter needs La")
    return _int(obj["lookahead"], f"{field}.lookahead", 0)


def parse_window_convention(obj: dict[str, Any], field: str, kind: Kind) -> WindowConvention:
    """A sliding window group's ``window_convention``: ``inclusive`` (the default,
    vLLM's: the window includes the token itself) or ``exclusive`` (SGLang's).

    >>> parse_query({"groups": [{"kind": "full", "block_size": 1,
    ...                          "window_convention": "exclusive"}], "cached": [[]], "max_length": 1})
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: groups[0].window_convention: only a sliding_window group has one
    """
    if "window_convention" not in obj:
        return WINDOW_CONVENTIONS[0]
    convention = obj["window_convention"]
    if kind != Kind.SLIDING_WINDOW:
        raise QueryError(f"{field}.window_convention", "only a sliding_window group has one")
    if convention not in WINDOW_CONVENTIONS:
        raise QueryError(
            f"{field}.window_convention",
            f"expected one of {', '.join(WINDOW_CONVENTIONS)}, got {json.dumps(convention)}",
        )
    return WindowConvention(convention)


def parse_row(row: Any, field: str, g: Group, hash_unit: int | None) -> tuple[bool | Upto, ...]:
    """A cached row from a list of booleans, a list of 0/1, or a string of '1'/'0'; with
    a hash unit, a list entry may also be a partial block, ``{"upto": p}``."""
    if isinstance(row, str):
        bad = next((ch for ch in row if ch not in "01"), None)
        if bad is not None:
            raise QueryError(field, f"a string row holds only '1' and '0', found {bad!r}")
        return tuple(ch == "1" for ch in row)
    if not isinstance(row, list):
        raise QueryError(
            field, f"must be a list of booleans, 0/1, or a '1'/'0' string, got {type(row).__name__}"
        )
    out: list[bool | Upto] = []
    for j, bit in enumerate(row):
        if isinstance(bit, bool):
            out.append(bit)
        elif isinstance(bit, int) and bit in (0, 1):
            out.append(bit == 1)
        elif isinstance(bit, dict):
            out.append(parse_partial(bit, f"{field}[{j}]", j, g, hash_unit))
        else:
            raise QueryError(
                f"{field}[{j}]", f'must be true/false, 0/1 or {{"upto": p}}, got {json.dumps(bit)}'
            )
    return tuple(out)


def parse_partial(obj: dict[str, Any], field: str, j: int, g: Group, hash_unit: int | None) -> Upto:
    """A partially filled block j: ``{"upto": p}``, a fine boundary inside it.

    >>> parse_partial({"upto": 5}, "cached[0][1]", 1, Group("full", 4), 2)
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: cached[0][1].upto: 5 is not a multiple of hash_unit (2)
    """
    obj = _object(obj, field, {"upto"})
    if hash_unit is None:
        raise QueryError(field, "a partial block needs the query's hash_unit")
    end = _int(obj.get("upto"), f"{field}.upto", 1)
    problem = partial_problem(end, j, g, hash_unit)
    if problem is not None:
        raise QueryError(f"{field}.upto", problem)
    return Upto(end)


def partial_problem(end: int, j: int, g: Group, hash_unit: int) -> str | None:
    """Why a partial block j of group g cannot end at ``end`` (a multiple of the hash
    unit strictly inside the block), or None.

    >>> partial_problem(6, 1, Group("full", 4), 2) is None, partial_problem(8, 1, Group("full", 4), 2)
    (True, '8 is not a fine boundary inside block 1 (tokens 4 … 7)')
    """
    if end % hash_unit:
        return f"{end} is not a multiple of hash_unit ({hash_unit})"
    start, stop = j * g.block_size, (j + 1) * g.block_size
    if not start < end < stop:
        return f"{end} is not a fine boundary inside block {j} (tokens {start} … {stop - 1})"
    return None


def parse_query(obj: Any) -> Query:
    """Check a protocol query (a decoded JSON object) and build its :class:`Query`."""
    obj = _object(obj, "", QUERY_FIELDS)
    if not isinstance(obj.get("groups"), list) or not obj["groups"]:
        raise QueryError("groups", "must be a non-empty list of group objects")
    groups = tuple(parse_group(g, f"groups[{i}]") for i, g in enumerate(obj["groups"]))
    for key in ("cached", "max_length"):
        if key not in obj:
            raise QueryError(key, "missing")
    cached = obj["cached"]
    if not isinstance(cached, list) or len(cached) != len(groups):
        shown = f"{len(cached)} rows" if isinstance(cached, list) else type(cached).__name__
        raise QueryError(
            "cached", f"must be a list with one row per group ({len(groups)}), got {shown}"
        )
    hash_unit = parse_hash_unit(obj, groups)
    rows = tuple(
        parse_row(r, f"cached[{i}]", g, hash_unit) for i, (g, r) in enumerate(zip(groups, cached))
    )
    max_length = _int(obj["max_length"], "max_length", 0)
    num_tokens = _int(obj.get("num_tokens", max_length + 1), "num_tokens", 1)
    if num_tokens <= max_length:
        raise QueryError(
            "num_tokens", f"must be greater than max_length ({max_length}), got {num_tokens}"
        )
    alignment = parse_alignment(obj, groups, hash_unit)
    tiers = parse_tiers(obj.get("tiers", []), groups, hash_unit)
    return Query(groups, rows, max_length, num_tokens, alignment, hash_unit, tiers)


def parse_tiers(value: Any, groups: tuple[Group, ...], hash_unit: int | None) -> tuple[Tier, ...]:
    """The query's external tiers (docs/design.md §1.7), each with a distinct name.

    >>> groups = (Group("full", 1), Group("mamba", 1))
    >>> parse_tiers([{"name": "lmcache", "holds": ["full"], "cached": {"1": "1"}}], groups, None)
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: tiers[0].cached.1: group 1 is a mamba group; this tier holds only full
    """
    if not isinstance(value, list):
        raise QueryError("tiers", f"must be a list of tier objects, got {type(value).__name__}")
    tiers = tuple(parse_tier(t, f"tiers[{i}]", groups, hash_unit) for i, t in enumerate(value))
    names = [t.name for t in tiers]
    for i, name in enumerate(names):
        if name in names[:i]:
            raise QueryError(f"tiers[{i}].name", f"{json.dumps(name)} names an earlier tier too")
    return tiers


def parse_tier_name(obj: dict[str, Any], field: str) -> tuple[str, frozenset[Kind]]:
    """A tier's (or a stateful engine's store's) ``name``, other than ``local``, and
    the kinds it ``holds``: a non-empty list naming each kind once.

    >>> parse_tier_name({"name": "cpu", "holds": ["full", "mamba", "full"]}, "tiers[0]")
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: tiers[0].holds[2]: names full a second time
    """
    name = obj.get("name")
    if not isinstance(name, str) or not name or name == LOCAL:
        raise QueryError(f"{field}.name", f"must be a non-empty string other than {LOCAL!r}")
    holds = obj.get("holds")
    if not isinstance(holds, list) or not holds or any(k not in KINDS for k in holds):
        raise QueryError(
            f"{field}.holds", f"must be a non-empty list of kinds ({', '.join(KINDS)})"
        )
    for i, kind in enumerate(holds):
        if kind in holds[:i]:
            raise QueryError(f"{field}.holds[{i}]", f"names {kind} a second time")
    return name, frozenset(Kind(k) for k in holds)


def parse_tier(obj: Any, field: str, groups: tuple[Group, ...], hash_unit: int | None) -> Tier:
    """One tier: a name other than ``local``, the kinds it holds, and its rows keyed by
    the index of a group of a kind it holds."""
    obj = _object(obj, field, TIER_FIELDS)
    name, kinds = parse_tier_name(obj, field)
    rows = obj.get("cached")
    if not isinstance(rows, dict):
        raise QueryError(f"{field}.cached", "must be an object of rows keyed by group index")
    out: list[Any] = [None] * len(groups)
    for key, row in rows.items():
        where = f"{field}.cached.{key}"
        if not key.isdigit() or int(key) >= len(groups):
            raise QueryError(where, f"no group {key}: the query has {len(groups)} groups")
        g = groups[int(key)]
        if g.kind not in kinds:
            held = ", ".join(k.value for k in Kind if k in kinds)
            raise QueryError(where, f"group {key} is a {g.kind} group; this tier holds only {held}")
        out[int(key)] = parse_row(row, where, g, hash_unit)
    return Tier(name, kinds, tuple(out))


def parse_hash_unit(obj: dict[str, Any], groups: tuple[Group, ...]) -> int | None:
    """The query's hash unit h, which divides every block size (None: not given)."""
    if "hash_unit" not in obj:
        return None
    unit = _int(obj["hash_unit"], "hash_unit", 1)
    for i, g in enumerate(groups):
        if g.block_size % unit:
            raise QueryError(
                "hash_unit", f"{unit} does not divide groups[{i}].block_size ({g.block_size})"
            )
    return unit


def parse_alignment(obj: dict[str, Any], groups: tuple[Group, ...], hash_unit: int | None) -> int:
    """A, which every hit is a multiple of: a multiple of the hash unit when there is
    one (default: the hash unit), else of every block size (default: their lcm)."""
    default = hash_unit if hash_unit is not None else default_alignment(groups)
    alignment = _int(obj.get("alignment", default), "alignment", 1)
    if hash_unit is not None:
        if alignment % hash_unit:
            raise QueryError(
                "alignment", f"{alignment} is not a multiple of hash_unit ({hash_unit})"
            )
        return alignment
    for i, g in enumerate(groups):
        if alignment % g.block_size:
            raise QueryError(
                "alignment",
                f"{alignment} is not a multiple of groups[{i}].block_size ({g.block_size})",
            )
    return alignment


def decode_json(text: str, where: str) -> Any:
    """Decode JSON text; :class:`QueryError` naming ``where`` if it is not JSON or is
    nested too deeply for the decoder.

    >>> decode_json("[" * 100_000, "line 1")
    Traceback (most recent call last):
    ...
    kvhit.model.protocol.QueryError: line 1: nested too deeply to decode
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise QueryError(
            where, f"not valid JSON ({err.msg} at line {err.lineno}, column {err.colno})"
        ) from None
    except RecursionError:
        raise QueryError(where, "nested too deeply to decode") from None


def load_queries(text: str) -> list[Any]:
    """Decode a file's text: one JSON object, or JSON lines (one query per line).

    Returns the decoded objects (not yet checked); raises :class:`QueryError` naming
    the line of a line that is not JSON.
    """
    try:
        whole = decode_json(text, "query")
    except QueryError:
        whole = None
    if isinstance(whole, dict):
        return [whole]
    if whole is not None:
        raise QueryError(
            "query", f"must be a JSON object or JSON lines, got {type(whole).__name__}"
        )
    out = [
        decode_json(line, f"line {number}")
        for number, line in enumerate(text.splitlines(), 1)
        if line.strip()
    ]
    if not out:
        raise QueryError("query", "the input holds no query")
    return out
