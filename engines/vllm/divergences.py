"""Where vLLM's ``find_longest_cache_hit`` differs from the spec, as found by the gate.

Each :class:`Divergence` names a class of cache states (its ``scope``), the verdict
against the spec, a shrunk counterexample with the answer vLLM gave on it, and the
first and last release that give that answer. The tests check that the installed
release still gives it (so an upgrade that changes it is noticed) and that outside
every scope of its release vLLM agrees with the model. docs/findings-vllm.md explains
each one and when it came and went.

The target ``vllm-undocumented`` (:func:`vllm_outside_divergences`) is not asked the
states inside a documented scope of the installed release: a scope that reads only the
configuration is one of its capability rules (kvhit draws nothing inside it), one that
reads the cached rows is answered ``unsupported``. So any disagreement the gate
reports against it is a new finding::

    kvhit gate --target vllm-undocumented --keep-going --seconds 300

Which classes a vLLM build has is read from its version: a release has the classes
whose first … last releases hold it; a dev build or pre-release (``0.35.0.dev3+g…``,
which sorts before 0.35.0) or a patch release has those of the newest documented
release it is not older than (:func:`documented_release`): a build of a branch is
expected to have what its base had until it is gated. Nothing else here depends on
the version (what a build can be asked is read from its code,
:mod:`kvhit.engines.vllm.release`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import partial, reduce
from math import gcd
from typing import Any

from kvhit.analysis import Verdict
from kvhit.contract import QueryTarget, Rule
from kvhit.engines.vllm.options import EAGLE, EaglePath
from kvhit.engines.vllm.release import spec_key
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Drafter, Group, Kind, Query, Upto, window_before

OLDEST = "0.14.0"
NEWEST = "0.34.0"
RELEASES = tuple(f"0.{minor}.0" for minor in range(14, 35))
"""The releases the findings document, oldest first."""


def release_key(release: str) -> tuple[int, ...]:
    """A version as a tuple that sorts as versions do: its numbers, then 1 for a
    release (a local label such as ``+cpu`` ignored) and 0 for a dev build or
    pre-release, which comes before its release.

    >>> release_key("0.9.1") < release_key("0.14.0") == release_key("0.14.0+cpu")
    True
    >>> release_key("0.34.0") < release_key("0.35.0.dev3+g0abc") < release_key("0.35.0")
    True
    """
    found = re.match(r"(\d+(?:\.\d+)*)(.*)", release)
    if found is None:
        raise ValueError(f"{release!r} is not a version number")
    numbers, rest = found.groups()
    return (*map(int, numbers.split(".")), 0 if rest.split("+")[0] else 1)


def documented_release(version: str) -> str | None:
    """The newest documented release ``version`` is not older than (None: older than
    every one); its classes are the ones ``version`` is expected to have.

    >>> documented_release("0.35.0.dev3+g0abc"), documented_release("0.21.0rc1")
    ('0.34.0', '0.20.0')
    """
    older = [r for r in RELEASES if release_key(r) <= release_key(version)]
    return older[-1] if older else None


def spans(first: str, last: str, version: str) -> bool:
    """Whether the documented release of ``version`` is one of first … last."""
    base = documented_release(version)
    return base is not None and release_key(first) <= release_key(base) <= release_key(last)


@dataclass(frozen=True)
class Divergence:
    """A documented difference between vLLM and the spec, in releases first … last."""

    name: str
    verdict: Verdict  # unsafe, lost_reuse, wrong_blocks or crash on the example
    scope: Callable[[Query], bool]
    example: dict[str, Any]
    vllm_length: int = 0
    vllm_blocks: list[list[int]] = field(default_factory=list)
    first: str = OLDEST
    last: str = NEWEST
    error: str | None = None
    """What vLLM raises on the example (a crash): the error's type and message."""
    reads_rows: bool = False
    """Whether the scope reads the cached rows (else only the configuration)."""

    @property
    def query(self) -> Query:
        """The example, parsed."""
        return parse_query(self.example)

    def in_release(self, release: str) -> bool:
        """Whether ``release`` is one of the releases that answer the example so
        (:func:`spans`).

        >>> DIVERGENCES[0].in_release("0.34.0"), DIVERGENCES[0].in_release("0.35.0.dev1")
        (True, True)
        """
        return spans(self.first, self.last, release)


def same_spec(a: Group, b: Group) -> bool:
    """Whether vLLM gives two groups equal KV cache specs (and so looks them up jointly)."""
    return spec_key(a) == spec_key(b)


def window_one(q: Query) -> bool:
    """A sliding window of 1 token, the token alone (t = 0: no block before the hit)."""
    return any(g.kind == Kind.SLIDING_WINDOW and window_before(g) == 0 for g in q.groups)


def chunk_off_blocks(q: Query) -> bool:
    """A chunked local group whose chunk is not a multiple of its block size."""
    return any(g.kind == Kind.CHUNKED_LOCAL and g.chunk % g.block_size for g in q.groups)


def lone_eagle(q: Query) -> bool:
    """A single group, an eagle one (vLLM's unitary coordinator)."""
    return len(q.groups) == 1 and q.groups[0].eagle


def eagle_window_off_alignment(q: Query) -> bool:
    """An eagle sliding window group whose block size is not the alignment."""
    return any(
        g.kind == Kind.SLIDING_WINDOW and g.eagle and g.block_size != q.alignment for g in q.groups
    )


def eagle_in_hybrid(q: Query) -> bool:
    """An eagle group among several groups (vLLM's hybrid coordinator)."""
    return len(q.groups) > 1 and any(g.eagle for g in q.groups)


def eagle_shares_spec(q: Query) -> bool:
    """An eagle group and a non-eagle group with equal specs."""
    return any(a.eagle and not b.eagle and same_spec(a, b) for a in q.groups for b in q.groups)


def eagle_windows(q: Query) -> bool:
    """Two eagle sliding window groups with different specs."""
    specs = {spec_key(g) for g in q.groups if g.kind == Kind.SLIDING_WINDOW and g.eagle}
    return len(specs) >= 2


def full_groups_apart(q: Query) -> bool:
    """Two full attention groups with different specs (vLLM looks them up apart)."""
    return len({spec_key(g) for g in q.groups if g.kind == Kind.FULL}) >= 2


def partial_hits(q: Query) -> bool:
    """Whether vLLM may look the query up with partial hash hits: it has a hash unit and
    a Mamba group whose block is larger (``partial_hash_hits_enabled``)."""
    h = q.hash_unit
    return h is not None and any(g.kind == Kind.MAMBA and g.block_size > h for g in q.groups)


def fine_full_rows(q: Query) -> list[tuple[Group, tuple[Any, ...]]]:
    """The full attention groups whose blocks hold several hash units, with their rows,
    when partial hash hits may be on (else none)."""
    if not partial_hits(q):
        return []
    return [
        (g, row)
        for g, row in zip(q.groups, q.cached)
        if g.kind == Kind.FULL and g.block_size > (q.hash_unit or 0)
    ]


def whole_run(row: tuple[Any, ...]) -> int:
    """How many blocks from block 0 on are cached whole."""
    return next((j for j, e in enumerate(row) if e is not True), len(row))


def lookup_caps(q: Query, g: Group) -> set[int]:
    """Where vLLM's full attention lookup of g may stop at the latest, in hash units:
    M, one hash unit more for a drafter that may drop it, each also cut where the
    request's hashes end (T, or T - La with lookahead hashes)."""
    h = q.hash_unit or 1
    drafts = g.drafter in (Drafter.DROP, Drafter.LOOKAHEAD)
    lookahead = max((x.lookahead for x in q.groups if x.drafter == Drafter.LOOKAHEAD), default=0)
    ends = {q.num_tokens, q.num_tokens - lookahead}
    reaches = {q.max_length, q.max_length + h * drafts}
    return {min(r, *ends) // h * h for r in reaches} | {r // h * h for r in reaches}


def interior_of_whole_block(q: Query) -> bool:
    """A full attention group (block larger than the hash unit) whose lookup may stop
    at a hash boundary inside a block cached whole, with every block before it cached:
    at a cap, or where a group of the same spec, looked up with it, stops being cached
    whole."""
    rows = fine_full_rows(q)
    for g, row in rows:
        run = whole_run(row)
        if any(c % g.block_size and c // g.block_size < run for c in lookup_caps(q, g)):
            return True
        if any(same_spec(g, x) and whole_run(other) < run for x, other in rows):
            return True
    return False


def below_partial_boundary(q: Query) -> bool:
    """A full attention group (block larger than the hash unit) whose cached run from
    block 0 ends in a partially filled block with a hash boundary inside it below the
    fine boundary."""
    h = q.hash_unit or 0
    for g, row in fine_full_rows(q):
        j = whole_run(row)
        if j < len(row) and isinstance(row[j], Upto) and j * g.block_size + h < row[j].end:
            return True
    return False


def drop_unit(q: Query, g: Group) -> int:
    """What an eagle drop takes from group g's hit: a hash unit where partial hash hits
    may let full attention stop inside a block (``eagle_proof_margin``), else a block."""
    h = q.hash_unit
    fine = partial_hits(q) and all(
        x.kind in (Kind.FULL, Kind.MAMBA) or x.block_size == h for x in q.groups
    )
    return min(g.block_size, h) if h is not None and fine and g.kind == Kind.FULL else g.block_size


def block_drop_finer_hash(q: Query) -> bool:
    """An eagle group whose drop takes a whole block where the query hashes finer
    (partial hash hits off for it)."""
    h = q.hash_unit
    return h is not None and any(
        g.eagle and g.kind != Kind.MAMBA and drop_unit(q, g) > h for g in q.groups
    )


def margin_past_max_length(q: Query) -> bool:
    """An eagle group among several whose drop margin (a block, or a hash unit) from the
    longest candidate reaches past M, outside the other eagle classes."""
    capped = any(g.eagle and q.top + drop_unit(q, g) > q.max_length for g in q.groups)
    others = eagle_window_off_alignment(q) or eagle_windows(q) or eagle_shares_spec(q)
    return eagle_in_hybrid(q) and capped and not others


def hash_block(q: Query) -> int:
    """vLLM's hash block size for the query: its hash unit, else the gcd of the block
    sizes."""
    return q.hash_unit or reduce(gcd, (g.block_size for g in q.groups))


def lookup_past_lookahead_hashes(q: Query) -> bool:
    """Lookahead block hashes with no full attention group (which would bound the hit by
    the hashed blocks), and a group whose lookup bound M reaches a block past the
    request's hashed tokens (those ending by T - La)."""
    lookahead = max((g.lookahead for g in q.groups if g.drafter == Drafter.LOOKAHEAD), default=0)
    if not lookahead or any(g.kind == Kind.FULL for g in q.groups):
        return False
    hashed = (q.num_tokens - lookahead) // hash_block(q) * hash_block(q)
    return any(q.max_length // g.block_size > hashed // g.block_size for g in q.groups)


def window_beside_partial_hits(q: Query) -> bool:
    """A sliding window group beside a Mamba group whose block is larger than the hash
    block (which turns partial hash hits on)."""
    h = hash_block(q)
    return any(g.kind == Kind.MAMBA and g.block_size > h for g in q.groups) and any(
        g.kind == Kind.SLIDING_WINDOW for g in q.groups
    )


def sw(window: int, block_size: int = 1, eagle: bool = False) -> dict[str, Any]:
    """A sliding window group object."""
    return {"kind": "sliding_window", "block_size": block_size, "window": window, "eagle": eagle}


EAGLE_WITH_MAMBA = {
    "groups": [sw(4, eagle=True), {"kind": "mamba", "block_size": 1}],
    "cached": ["11111", "11101"],
    "max_length": 3,
    "num_tokens": 5,
}
"""An eagle window and a Mamba group: L* = 3, which needs block 3 of the window
matched and dropped; the releases before 0.32 answer it short, each its own way."""

DIVERGENCES = (
    Divergence(
        "only the prompt's last hash boundary is registered: a whole block's inner "
        "boundaries are not found",
        Verdict.LOST_REUSE,
        interior_of_whole_block,
        {
            "groups": [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
            "cached": ["11", [True, {"upto": 6}]],
            "max_length": 7,
            "hash_unit": 2,
        },
        vllm_length=4,
        vllm_blocks=[[0], [0]],
        first="0.26.0",
        reads_rows=True,
    ),
    Divergence(
        "vLLM only finds exact fine hash entries: a partial block is not found below "
        "its fine boundary",
        Verdict.LOST_REUSE,
        below_partial_boundary,
        {
            "groups": [{"kind": "full", "block_size": 4}, {"kind": "mamba", "block_size": 4}],
            "cached": [[True, {"upto": 6}], [True, {"upto": 5}]],
            "max_length": 5,
            "hash_unit": 1,
        },
        vllm_length=4,
        vllm_blocks=[[0], [0]],
        first="0.26.0",
        reads_rows=True,
    ),
    Divergence(
        "with partial hash hits off, the eagle drop takes a whole block where the query "
        "hashes finer",
        Verdict.LOST_REUSE,
        block_drop_finer_hash,
        {
            "groups": [{"kind": "full", "block_size": 2, "eagle": True}, sw(4, 4)],
            "cached": [[True, True, {"upto": 5}], "11"],
            "max_length": 6,
            "num_tokens": 7,
            "alignment": 4,
            "hash_unit": 1,
        },
        vllm_length=0,
        vllm_blocks=[[], []],
        first="0.26.0",
    ),
    Divergence(
        "eagle drop not re-checked after another eagle group lowers the hit",
        Verdict.UNSAFE,
        eagle_windows,
        {
            "groups": [sw(2, eagle=True), sw(3, eagle=True)],
            "cached": ["1011", "1100"],
            "max_length": 3,
        },
        vllm_length=1,
        vllm_blocks=[[0], [0]],
        first="0.32.0",
    ),
    Divergence(
        "eagle drop not re-checked, at model sizes (windows 128 and 1024, block size 16)",
        Verdict.UNSAFE,
        eagle_windows,
        {
            "groups": [sw(128, 16, eagle=True), sw(1024, 16, eagle=True)],
            "cached": ["1" * 59 + "0" + "1" * 9, "1" * 60],
            "max_length": 1104,
        },
        vllm_length=944,
        vllm_blocks=[list(range(51, 59)), list(range(59))],
        first="0.20.0",
    ),
    Divergence(
        "eagle lookup not widened by the margin, and the drop repeated on every pass",
        Verdict.LOST_REUSE,
        eagle_in_hybrid,
        EAGLE_WITH_MAMBA,
        vllm_length=0,
        vllm_blocks=[[], []],
        last="0.19.0",
    ),
    Divergence(
        "hybrid eagle lookup widened by the margin only up to max_length",
        Verdict.LOST_REUSE,
        margin_past_max_length,
        EAGLE_WITH_MAMBA,
        vllm_length=2,
        vllm_blocks=[[0, 1], [1]],
        first="0.20.0",
        last="0.31.0",
    ),
    Divergence(
        "chunk start taken from the lookup bound, rounded down to a block",
        Verdict.UNSAFE,
        chunk_off_blocks,
        {
            "groups": [{"kind": "chunked_local", "block_size": 2, "chunk": 3}],
            "cached": ["0"],
            "max_length": 3,
        },
        vllm_length=2,
        vllm_blocks=[[]],
    ),
    Divergence(
        "eagle window prefix run aligned before the drop",
        Verdict.LOST_REUSE,
        eagle_window_off_alignment,
        {
            "groups": [sw(4, eagle=True), {"kind": "full", "block_size": 2}],
            "cached": ["111", "1"],
            "max_length": 2,
        },
        vllm_length=0,
        vllm_blocks=[[], []],
        first="0.20.0",
    ),
    Divergence(
        "unitary coordinator: eagle lookup capped at max_length",
        Verdict.LOST_REUSE,
        lone_eagle,
        {
            "groups": [{"kind": "full", "block_size": 2, "eagle": True}],
            "cached": ["11"],
            "max_length": 3,
        },
        vllm_length=0,
        vllm_blocks=[[]],
    ),
    Divergence(
        "eagle and non-eagle groups with equal specs are looked up jointly",
        Verdict.LOST_REUSE,
        eagle_shares_spec,
        {
            "groups": [
                {"kind": "full", "block_size": 1, "eagle": True},
                {"kind": "full", "block_size": 1},
                {"kind": "mamba", "block_size": 1},
            ],
            "cached": ["11", "1", "11"],
            "max_length": 1,
        },
        vllm_length=0,
        vllm_blocks=[[], [], []],
        first="0.20.0",
    ),
    Divergence(
        "only the first full attention group's blocks are cut to the hit",
        Verdict.WRONG_BLOCKS,
        full_groups_apart,
        {
            "groups": [
                {"kind": "full", "block_size": 1},
                {"kind": "full", "block_size": 2},
                sw(2, 2),
            ],
            "cached": ["11", "1", ""],
            "max_length": 2,
        },
        vllm_length=0,
        vllm_blocks=[[], [0], []],
        first="0.16.0",
        last="0.28.0",
    ),
    Divergence(
        "SlidingWindowManager asserts on the partial hash hits a Mamba group turns on",
        Verdict.CRASH,
        window_beside_partial_hits,
        {
            "groups": [sw(2, 2), {"kind": "mamba", "block_size": 2}],
            "cached": ["", ""],
            "max_length": 1,
            "alignment": 1,
            "hash_unit": 1,
        },
        first="0.26.0",
        last="0.27.0",
        error="AssertionError: SlidingWindowManager does not support fine-grained (partial) "
        "cache hits",
    ),
    Divergence(
        "with lookahead hashes, a lookup bounded by M reads past the request's hashes",
        Verdict.CRASH,
        lookup_past_lookahead_hashes,
        {
            "groups": [{"kind": "mamba", "block_size": 4, "drafter": "lookahead", "lookahead": 4}],
            "cached": ["1"],
            "max_length": 4,
        },
        first="0.33.0",
        error="IndexError: list index out of range",
    ),
    Divergence(
        "with lookahead hashes, a chunk start at M is a hit past the request's hashes",
        Verdict.UNSAFE,
        lookup_past_lookahead_hashes,
        {
            "groups": [
                {
                    "kind": "chunked_local",
                    "block_size": 2,
                    "chunk": 2,
                    "drafter": "lookahead",
                    "lookahead": 2,
                }
            ],
            "cached": [""],
            "max_length": 2,
        },
        vllm_length=2,
        vllm_blocks=[[]],
        first="0.33.0",
    ),
    Divergence(
        "window 1 still needs the block before the hit",
        Verdict.LOST_REUSE,
        window_one,
        {"groups": [sw(1)], "cached": [""], "max_length": 1},
        vllm_length=0,
        vllm_blocks=[[]],
    ),
    Divergence(
        "window 1 reuses the block before the hit",
        Verdict.WRONG_BLOCKS,
        window_one,
        {"groups": [sw(1)], "cached": ["1"], "max_length": 1},
        vllm_length=1,
        vllm_blocks=[[0]],
    ),
)


def in_release(release: str) -> list[Divergence]:
    """The divergences that ``release`` has."""
    return [d for d in DIVERGENCES if d.in_release(release)]


@dataclass(frozen=True)
class ConnectorClass:
    """A documented class of vLLM's KV connector path (docs/findings-vllm.md,
    "Connectors and divergent hits"): the verdicts it gives in releases first … last.
    Unlike a :class:`Divergence` it has no scope over states alone: whether a state
    shows it depends on the connector and its ``supports_divergent_local_hybrid_hits``."""

    name: str
    verdicts: tuple[Verdict, ...]
    first: str
    last: str = NEWEST

    def in_release(self, release: str) -> bool:
        """Whether ``release`` has it.

        >>> CONNECTOR_CLASSES[0].in_release("0.27.0")
        False
        """
        return spans(self.first, self.last, release)


CONNECTOR_CLASSES = (
    ConnectorClass(
        "C1 max of the per-group hits",
        (Verdict.UNSAFE, Verdict.WRONG_BLOCKS, Verdict.CRASH),
        "0.24.0",
        "0.26.0",
    ),
    ConnectorClass(
        "C2 the external count taken for every group",
        (Verdict.UNSAFE, Verdict.WRONG_BLOCKS),
        "0.24.0",
    ),
    ConnectorClass("C3 the hit_diverged fallback", (Verdict.LOST_REUSE,), "0.27.0"),
    ConnectorClass(
        "C4 pool blocks past the boundary never combined", (Verdict.LOST_REUSE,), "0.24.0"
    ),
    ConnectorClass("C5 fine alignment to the window manager", (Verdict.CRASH,), "0.26.0", "0.27.0"),
)
"""The connector path's classes, each found in that release's scheduler and manager code."""


def documented(q: Query, release: str = NEWEST) -> list[str]:
    """The names of the divergences of ``release`` whose scope holds the query."""
    return [d.name for d in in_release(release) if d.scope(q)]


def documented_rules(release: str) -> tuple[Rule, ...]:
    """One rule per scope of ``release``'s divergences that reads only the
    configuration: a query inside it is not asked of ``vllm-undocumented``.

    >>> [r.name for r in documented_rules("0.14.0")][:2]
    ['eagle_in_hybrid', 'chunk_off_blocks']
    """
    names: dict[Callable[[Query], bool], str] = {}
    for d in in_release(release):
        if not d.reads_rows:
            names.setdefault(d.scope, d.name)
    return tuple(Rule(scope.__name__, refusing(scope, name)) for scope, name in names.items())


def refusing(scope: Callable[[Query], bool], name: str) -> Callable[[Query], str | None]:
    """The refusal of the queries inside ``scope``, naming the divergence ``name``."""

    def refuses(q: Query) -> str | None:
        return f"documented divergence: {name}" if scope(q) else None

    return refuses


def outside_divergences_answer(q: Query, path: EaglePath = EaglePath.DEFAULT) -> dict[str, Any]:
    """vLLM's answer (its drafters on ``path``), or :class:`Unsupported` naming the
    installed release's documented divergence whose scope holds the query."""
    from kvhit.engines.vllm.target import RELEASE, vllm_answer

    names = documented(q, RELEASE.name)
    if names:
        raise Unsupported(f"documented divergence: {names[0]}")
    return vllm_answer(q, path)


def vllm_outside_divergences(options: Mapping[str, str]) -> QueryTarget:
    """The ``vllm-undocumented`` target with ``options`` (those of ``vllm``): what the
    ``vllm`` target declares on the path they name, less the documented scopes of
    the installed release that read only the configuration (:func:`documented_rules`)."""
    from kvhit.engines.vllm.target import LOOKUP_CAPABILITIES, RELEASE

    path = EaglePath(options[EAGLE.name])
    caps = LOOKUP_CAPABILITIES[path].with_rules(*documented_rules(RELEASE.name))
    return QueryTarget(partial(outside_divergences_answer, path=path), caps)
