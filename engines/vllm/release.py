"""What the installed vLLM release can do, found by looking at its API, not its number.

The ``vllm`` target runs against every release from 0.14.0, the first whose
``HybridKVCacheCoordinator.find_longest_cache_hit`` runs the fixed-point loop (vLLM
PR #31707), to 0.34.0. Releases differ in what they accept; each difference is
detected here from a signature, a dataclass field or the code of a method:

- ``scheduler_block_size`` (0.23+): an alignment other than the lcm of the block sizes;
- ``KVCacheGroupSpec.is_eagle_group`` (0.20+): eagle on some groups only (before, the
  coordinator's ``use_eagle`` applies to every group);
- ``KVCacheSpec.is_draft``, ``MambaSpec.mamba_cache_mode``: passed when accepted;
- ``max_num_batched_tokens`` (0.20-0.25), renamed ``max_in_flight_tokens`` (0.26+);
- partial (fine-grained) hash hits (0.26+, ``enable_partial_hash_hits`` of the hybrid
  coordinator): a query with a hash unit is asked only where vLLM has them;
  ``allow_partial_hash_hits`` (0.30+) turns them off for a query without one;
- lookahead block hashes (0.33+, ``num_hash_lookahead_tokens``): a ``lookahead``
  drafter is asked only where vLLM has them;
- eagle sliding windows whose block size is not the alignment: asserted against by
  the sliding window manager up to 0.22;
- several groups that all have one spec: asserted against by the hybrid coordinator
  up to 0.28 (vLLM's engine puts layers of one spec in one group).

:func:`refusal` turns these into the reason a query cannot be asked, before vLLM is
called, so that any assert vLLM raises during a supported call is a crash.
"""

from __future__ import annotations

import ast
import inspect
import os
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass, fields
from enum import StrEnum
from functools import cache, reduce
from importlib.metadata import PackageNotFoundError, version
from math import gcd, lcm
from typing import Any

from kvhit.errors import UndrivableTarget, Unsupported
from kvhit.model.spec import EAGLE_KINDS, Drafter, Group, Kind, Query, inclusive_window

VLLM_TARGETS = ("vllm", "vllm-undocumented", "vllm-connector")
"""The built-in targets that drive vLLM's lookup (``vllm-connector``: through its
scheduler and KV connector path, :mod:`kvhit.engines.vllm.tiered`)."""

EAGLE_ENV = "KVHIT_VLLM_EAGLE"
"""The environment variable that carries ``--vllm-eagle`` to the target (and so to every
worker process a run starts)."""


MAX_MODEL_LEN = 4096
"""The stateful target's ``max_model_len``: longer prompts are rejected."""


class EaglePath(StrEnum):
    """How the ``vllm`` target runs a query's drafters (``--vllm-eagle``).

    ``default``: a query's drafters as it states them: a ``drop`` drafter gets the
    eagle drop (what vLLM runs through 0.32, and from 0.33 with
    ``disable_lookahead_block_hashes``), a ``lookahead`` one lookahead block hashes
    (0.33+, vLLM's default for EAGLE/MTP there: ``_resolve_num_hash_lookahead_tokens``,
    ``config/vllm.py``, 0.34.0). ``drop``: the path of a model whose drafter drops on
    every release: a ``lookahead`` query is refused, since vLLM would answer it as
    another query (its drafters dropping), which the spec of this one does not judge.
    """

    DEFAULT = "default"
    DROP = "drop"


def eagle_path() -> EaglePath:
    """The path :data:`EAGLE_ENV` names (``default`` when unset); UndrivableTarget if it
    names none."""
    return path_named(os.environ.get(EAGLE_ENV, EaglePath.DEFAULT))


@cache
def path_named(named: str) -> EaglePath:
    """The path called ``named`` (read once per name: the target asks on every query);
    UndrivableTarget if there is none."""
    if named not in tuple(EaglePath):
        raise UndrivableTarget(f"{EAGLE_ENV}={named!r}: expected one of {', '.join(EaglePath)}")
    return EaglePath(named)


def target_label(name: str, path: EaglePath) -> str:
    """How reports name a vllm target run on ``path``.

    >>> target_label("vllm", EaglePath.DROP), target_label("vllm", EaglePath.DEFAULT)
    ('vllm[eagle=drop]', 'vllm')
    """
    return name if path == EaglePath.DEFAULT else f"{name}[eagle={path}]"


def installed_release() -> str:
    """The version of the vLLM that ``import vllm`` finds."""
    import vllm

    found = getattr(vllm, "__version__", None)
    if found:
        return str(found)
    try:
        return version("vllm")
    except PackageNotFoundError:
        return "(unknown release)"


def import_failure(err: ImportError) -> ImportError | UndrivableTarget:
    """What a failed import of vLLM's prefix-cache code means: vLLM missing (the
    ImportError itself), or vLLM present but one of its own imports missing."""
    if err.name is None or err.name == "vllm":
        return err
    if err.name.startswith("vllm."):
        return UndrivableTarget(
            f"vLLM {installed_release()} lacks what kvhit calls ({err}); "
            "kvhit drives vLLM 0.14.0 and later"
        )
    return UndrivableTarget(
        f"vLLM {installed_release()}: its prefix-cache code cannot be imported ({err}); "
        "install what it names into this environment (scripts/install-vllm.sh lists "
        "what 0.14.0 … 0.34.0 need)"
    )


EAGLE_WINDOW_ASSERT = "aligned_length is not compatible with eagle"
"""The sliding window manager's assert (up to 0.22) that an eagle window's block size
is the alignment: found in its ``find_longest_cache_hit``."""

TWO_SPECS_ASSERT = "requires at least two attention groups"
"""The hybrid coordinator's assert (up to 0.28) that the groups have two different
specs: found in its ``verify_and_split_kv_cache_groups``."""

PARTIAL_HITS_FLAG = "enable_partial_hash_hits"
"""The hybrid coordinator's flag of partial hash hits (0.26+): set in its ``__init__``."""


def has_loop(func: object) -> bool:
    """Whether a function's own code has a ``while`` loop."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))  # type: ignore[arg-type]
    return any(isinstance(node, ast.While) for node in ast.walk(tree))


def says(func: object, text: str) -> bool:
    """Whether a function's code contains ``text`` (an assert's message, say)."""
    return text in inspect.getsource(func)  # type: ignore[arg-type]


def field_names(cls: type) -> frozenset[str]:
    """The dataclass fields of a class."""
    return frozenset(f.name for f in fields(cls))


@dataclass(frozen=True)
class Release:
    """The features of one vLLM release that the target depends on."""

    name: str
    coordinator_params: frozenset[str]
    group_eagle_flag: bool
    draft_flag: bool
    mamba_cache_mode: bool
    eagle_window_needs_block_alignment: bool
    hybrid_needs_two_specs: bool
    partial_hash_hits: bool = False
    lookahead_hashes: bool = False

    @property
    def scheduler_alignment(self) -> bool:
        """Whether the coordinator takes ``scheduler_block_size``."""
        return "scheduler_block_size" in self.coordinator_params


def detect() -> Release:
    """The installed release's features; :class:`UndrivableTarget` if it has no
    fixed-point hybrid coordinator or lacks the API the target calls."""
    from vllm.v1.core import kv_cache_coordinator as coordinators
    from vllm.v1.core import single_type_kv_cache_manager as managers
    from vllm.v1.kv_cache_interface import KVCacheGroupSpec, KVCacheSpec, MambaSpec

    name = installed_release()
    hybrid = getattr(coordinators, "HybridKVCacheCoordinator", None)
    if hybrid is None or not has_loop(hybrid.find_longest_cache_hit):
        raise UndrivableTarget(
            f"vLLM {name}: its HybridKVCacheCoordinator has no fixed-point loop "
            "(vLLM PR #31707); kvhit drives vLLM 0.14.0 and later"
        )
    params = frozenset(inspect.signature(coordinators.get_kv_cache_coordinator).parameters)
    if "hash_block_size" not in params:
        raise UndrivableTarget(
            f"vLLM {name}: get_kv_cache_coordinator takes no hash_block_size; "
            "kvhit drives vLLM 0.14.0 and later"
        )
    return Release(
        name=name,
        coordinator_params=params,
        group_eagle_flag="is_eagle_group" in field_names(KVCacheGroupSpec),
        draft_flag="is_draft" in field_names(KVCacheSpec),
        mamba_cache_mode="mamba_cache_mode" in field_names(MambaSpec),
        eagle_window_needs_block_alignment=says(
            managers.SlidingWindowManager.find_longest_cache_hit, EAGLE_WINDOW_ASSERT
        ),
        hybrid_needs_two_specs=says(hybrid.verify_and_split_kv_cache_groups, TWO_SPECS_ASSERT),
        partial_hash_hits=says(hybrid.__init__, PARTIAL_HITS_FLAG),
        lookahead_hashes="num_hash_lookahead_tokens" in params,
    )


def spec_key(g: Group) -> tuple[Any, ...]:
    """What vLLM's KV cache spec of group g is made of: kind, block size, the window as
    vLLM counts it (inclusive, so an exclusive w and an inclusive w+1 are one spec) and
    the chunk. Two groups with equal keys have equal specs.

    >>> spec_key(Group("sliding_window", 1, window=2, window_convention="exclusive"))
    (<Kind.SLIDING_WINDOW: 'sliding_window'>, 1, 3, None)
    """
    window = inclusive_window(g) if g.kind == Kind.SLIDING_WINDOW else None
    return g.kind, g.block_size, window, g.chunk


def flagged(g: Group, groups: tuple[Group, ...]) -> bool:
    """Whether vLLM flags g ``is_eagle_group`` among ``groups``: a ``drop`` or
    ``lookahead`` drafter's group, and a Mamba group carrying ``none`` beside an eagle
    drop, which vLLM's "none flagged: all flagged" rule flags
    (``kv_cache_coordinator.py``, 0.34.0); 0.20-0.25 then give it the eagle margin
    (vLLM #45614), where the spec asks nothing more. A ``none`` drafter elsewhere
    (DFlash, DSpark) is never flagged: vLLM drops an eagle block in a flagged group."""
    if g.drafter in (Drafter.DROP, Drafter.LOOKAHEAD):
        return True
    return g.kind == Kind.MAMBA and g.drafter == Drafter.NONE and any(h.eagle for h in groups)


def is_draft(g: Group) -> bool:
    """Whether g's spec is a drafter's own (``is_draft``): a ``drop`` or ``lookahead``
    drafter's layers."""
    return g.drafter in (Drafter.DROP, Drafter.LOOKAHEAD)


def prefill_lookahead(q: Query) -> int:
    """The model's ``num_prefill_lookahead_tokens``: the largest La of its lookahead
    drafters (0: none). vLLM has one La for every group; since a hit must be valid for
    every group, the largest La bounds it exactly as the groups' own La do together."""
    return max((g.lookahead for g in q.groups if g.drafter == Drafter.LOOKAHEAD), default=0)


def hash_lookahead(q: Query, path: EaglePath) -> int:
    """``num_hash_lookahead_tokens``: La on the default path, 0 on the drop path
    (``_resolve_num_hash_lookahead_tokens``, ``config/vllm.py``, 0.34.0), where a
    lookahead query is refused."""
    return prefill_lookahead(q) if path == EaglePath.DEFAULT else 0


def hash_block_size(q: Query) -> int:
    """The hash granularity: the query's hash unit (vLLM's ``prefix_match_unit``), else
    the gcd of the block sizes (vLLM's default); it divides every block size."""
    if q.hash_unit is not None:
        return q.hash_unit
    return reduce(gcd, (g.block_size for g in q.groups))


def scheduler_block_size(q: Query) -> int:
    """vLLM's scheduler block size: A where every block size divides it, else the lcm
    of the block sizes (vLLM's own; hits then land on hash units or nowhere asked)."""
    sizes = [g.block_size for g in q.groups]
    return q.alignment if all(q.alignment % b == 0 for b in sizes) else lcm(*sizes)


def coordinator_keywords(q: Query, path: EaglePath) -> dict[str, Any]:
    """The keywords of ``get_kv_cache_coordinator`` for query ``q`` with its drafters on
    ``path``, under every name some release from 0.14.0 to 0.34.0 gives them (the
    scheduler's token budget under both of its names); the caller passes those the
    installed release takes."""
    options: dict[str, Any] = {
        "max_model_len": q.num_tokens,
        "max_in_flight_tokens": q.num_tokens,
        "max_num_batched_tokens": q.num_tokens,
        "use_eagle": any(g.eagle for g in q.groups),
        "enable_caching": True,
        "enable_kv_cache_events": False,
        "dcp_world_size": 1,
        "pcp_world_size": 1,
        "hash_block_size": hash_block_size(q),
        "scheduler_block_size": scheduler_block_size(q),
        "num_hash_lookahead_tokens": hash_lookahead(q, path),
        "num_prefill_lookahead": prefill_lookahead(q),
    }
    if q.hash_unit is None:
        options["allow_partial_hash_hits"] = False
    return options


def pool_size(q: Query) -> int:
    """A block for every entry of the rows (cached, partial or not), plus vLLM's null
    block: enough for any state of rows of these lengths, so the states of one shape
    share a coordinator.

    >>> pool_size(Query((Group(Kind.FULL, 1),), ((True, False, True),), 3, 4, 1))
    4
    """
    return sum(map(len, q.cached)) + 1


def shared_lookahead(groups: Sequence[Group]) -> int:
    """vLLM's ``num_hash_lookahead_tokens`` for a manager of these groups: La when every
    group has a lookahead drafter of La tokens (vLLM's lookahead hashes are the
    request's, so they key every group), 0 when none has; :class:`Unsupported`
    otherwise.

    >>> shared_lookahead([Group("full", 2, drafter="lookahead", lookahead=3)] * 2)
    3
    """
    spans = {g.lookahead if g.drafter == Drafter.LOOKAHEAD else 0 for g in groups}
    if len(spans) > 1:
        raise Unsupported(
            "vLLM's lookahead block hashes cover every group with one La: "
            "all groups need one lookahead drafter"
        )
    return spans.pop()


def refusal(q: Query, release: Release, path: EaglePath = EaglePath.DEFAULT) -> str | None:
    """Why vLLM ``release`` cannot be asked query ``q`` on eagle ``path``, or None if it can.

    >>> from kvhit.model.protocol import parse_query
    >>> old = Release("0.14.0", frozenset(), False, False, False, True, True)
    >>> refusal(parse_query({"groups": [{"kind": "full", "block_size": 2},
    ...                                 {"kind": "mamba", "block_size": 4}],
    ...                      "cached": ["", ""], "max_length": 8, "alignment": 8}), old)
    'vLLM 0.14.0 has no scheduler_block_size: hits are aligned to the lcm of the block sizes (4), not A=8'
    """
    sizes = [g.block_size for g in q.groups]
    specs = {spec_key(g) for g in q.groups}
    dropping = [g for g in q.groups if g.eagle]
    if len(q.groups) > 1 and len(specs) == 1 and release.hybrid_needs_two_specs:
        return (
            f"vLLM {release.name}'s hybrid coordinator asserts that the groups have at "
            "least two different specs"
        )
    if len(q.groups) == 1 and q.hash_unit not in (None, sizes[0]):
        return (
            "vLLM rejects a prefix_match_unit other than the block size with a single KV "
            "cache group (resolve_kv_cache_block_sizes)"
        )
    if len(q.groups) == 1 and q.alignment != sizes[0]:
        return "vLLM aligns a single group's hits to its block size (scheduler block size = b)"
    if q.hash_unit is not None and not release.partial_hash_hits:
        return (
            f"vLLM {release.name} has no partial hash hits (0.26.0 and later): a query "
            "with a hash unit cannot be asked"
        )
    if any(g.kind == Kind.CHUNKED_LOCAL and g.block_size != q.alignment for g in q.groups):
        return "vLLM asserts that a chunked local group's block size is the alignment"
    if not release.scheduler_alignment and q.alignment != lcm(*sizes):
        return (
            f"vLLM {release.name} has no scheduler_block_size: hits are aligned to the lcm "
            f"of the block sizes ({lcm(*sizes)}), not A={q.alignment}"
        )
    path_refusal = drafter_path_refusal(q, release, path)
    if path_refusal is not None:
        return path_refusal
    if any(g.kind == Kind.CHUNKED_LOCAL for g in dropping):
        return "vLLM asserts that a chunked local group never drops an eagle block"
    if dropping and not release.group_eagle_flag:
        if any(not g.eagle for g in q.groups if g.kind in EAGLE_KINDS) or any(
            g.kind == Kind.CHUNKED_LOCAL for g in q.groups
        ):
            return (
                f"vLLM {release.name} has no per-group eagle flag (KVCacheGroupSpec."
                "is_eagle_group): with use_eagle every group drops, as when no group is "
                "flagged later, so not a drafter on some full and sliding window groups "
                "only, nor with chunked local attention"
            )
    if release.eagle_window_needs_block_alignment and any(
        g.kind == Kind.SLIDING_WINDOW and g.block_size != q.alignment for g in dropping
    ):
        return (
            f"vLLM {release.name} asserts that an eagle sliding window's block size is "
            "the alignment"
        )
    return None


def drafter_path_refusal(q: Query, release: Release, path: EaglePath) -> str | None:
    """Why vLLM ``release`` does not run q's drafters on ``path`` (:class:`EaglePath`),
    or None. vLLM has one drafter per model: it drops (EAGLE/MTP without lookahead
    hashes), hashes lookahead tokens (EAGLE/MTP, 0.33+ by default), or neither (DFlash,
    DSpark: ``none``)."""
    lookahead = any(g.drafter == Drafter.LOOKAHEAD for g in q.groups)
    dropping = any(g.eagle for g in q.groups)
    if lookahead and dropping:
        return (
            "vLLM either drops an eagle block (use_eagle) or hashes lookahead tokens, "
            "for every drafter at once, never both"
        )
    if dropping and any(g.drafter == Drafter.NONE and g.kind in EAGLE_KINDS for g in q.groups):
        return "vLLM has one drafter per model: an eagle drop and a drafter that drops nothing never mix"
    if path == EaglePath.DROP and lookahead:
        return (
            "on the drop path vLLM hashes no lookahead tokens: a lookahead drafter is another query"
        )
    if lookahead and not release.lookahead_hashes:
        return (
            f"vLLM {release.name} has no lookahead block hashes "
            "(num_hash_lookahead_tokens, 0.33.0 and later)"
        )
    return None
