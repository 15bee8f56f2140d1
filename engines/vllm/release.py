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
  up to 0.28 (vLLM's engine puts layers of one spec in one group);
- which managers take fine (hash-unit) lookups
  (``supports_fine_grained_hash_lookup``, where the coordinator consults it): with partial hash hits on, a hybrid coordinator aligns hits to the hash block
  size, else to the scheduler block size (``_cache_hit_alignment_tokens``);
- a lookahead longer than the scheduler block size: a ``ValueError`` of the
  coordinator (``KVCacheCoordinator.__init__``, "Multi-module MTP", 0.33+).

:func:`capabilities` turns these into what a target declares it can be asked
(:class:`kvhit.contract.Capabilities`: the drafters and hash units each release has, and
one :class:`kvhit.contract.Rule` per refusal, with its reason), read before vLLM is
called, so that any assert vLLM raises during a supported call is a crash. Nothing
here reads a version number: a vLLM checkout or dev build is gated like a release.
"""

from __future__ import annotations

import ast
import inspect
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from functools import reduce
from importlib.metadata import PackageNotFoundError, version
from math import gcd, lcm
from typing import Any

from kvhit.contract import Capabilities, Rule
from kvhit.engines.vllm.options import EaglePath
from kvhit.errors import UndrivableTarget, Unsupported
from kvhit.model.spec import EAGLE_KINDS, Drafter, Group, Kind, Query, inclusive_window

MAX_MODEL_LEN = 4096
"""The stateful target's ``max_model_len``: longer prompts are rejected."""


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

FINE_LOOKUP_FLAG = "supports_fine_grained_hash_lookup"
"""The class flag of a manager that can stop a lookup inside its block: where the hybrid
coordinator consults it (inline in its ``__init__``, 0.28.0; through
``partial_hash_hits_enabled``, ``kv_cache_utils.py``, 0.34.0), partial hash hits need it
of every group's manager or a block of one hash unit (0.27.0 consults no manager)."""

LOOKAHEAD_BLOCK_CHECK = "num_speculative_tokens"
"""What the coordinator's ``ValueError`` for a lookahead longer than the scheduler block
size names (``KVCacheCoordinator.__init__``, ``kv_cache_coordinator.py``, 0.34.0)."""


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
    fine_lookup_kinds: frozenset[Kind] | None = None
    """The kinds whose manager takes fine lookups, where vLLM asks it (None: every kind);
    found from the managers vLLM gives the specs
    (:func:`kvhit.engines.vllm.target.fine_lookup_kinds`)."""
    lookahead_within_scheduler_block: bool = False
    """Whether the coordinator refuses a lookahead longer than the scheduler block size."""

    @property
    def scheduler_alignment(self) -> bool:
        """Whether the coordinator takes ``scheduler_block_size``."""
        return "scheduler_block_size" in self.coordinator_params

    @property
    def partial_hits_switch(self) -> bool:
        """Whether the coordinator takes ``allow_partial_hash_hits`` (0.30+)."""
        return "allow_partial_hash_hits" in self.coordinator_params


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
        lookahead_within_scheduler_block=says(
            coordinators.KVCacheCoordinator.__init__, LOOKAHEAD_BLOCK_CHECK
        ),
    )


def passes_managers(func: object, callee: str) -> bool:
    """Whether ``func``'s code calls ``callee`` with the managers' classes (a fourth
    argument, or ``manager_classes=``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))  # type: ignore[arg-type]
    return any(
        isinstance(node, ast.Call)
        and getattr(node.func, "id", getattr(node.func, "attr", None)) == callee
        and (len(node.args) >= 4 or any(k.arg == "manager_classes" for k in node.keywords))
        for node in ast.walk(tree)
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


@dataclass(frozen=True)
class Asker:
    """Who asks vLLM ``release``: on which eagle ``path`` its drafters run, and whether
    a query without a hash unit is asked with partial hash hits off
    (``allow_partial_hash_hits=False``, where the release takes it: the ``vllm``
    target; vLLM's own scheduler and manager leave them at their default, on)."""

    release: Release
    path: EaglePath = EaglePath.DEFAULT
    partial_off_without_unit: bool = False

    def partial_hits(self, q: Query) -> bool:
        """Whether vLLM's hybrid coordinator turns partial hash hits on for ``q``
        (``partial_hash_hits_enabled``, ``kv_cache_utils.py``, 0.34.0; inline in the
        coordinator's ``__init__`` in 0.27.0): a Mamba group (``align`` mode) whose
        block is larger than the hash block size h, and every group's manager taking
        fine lookups or its block being h."""
        release, h = self.release, hash_block_size(q)
        if not release.partial_hash_hits or len(q.groups) < 2:
            return False
        if q.hash_unit is None and self.partial_off_without_unit and release.partial_hits_switch:
            return False
        if not any(g.kind == Kind.MAMBA and g.block_size > h for g in q.groups):
            return False
        fine = release.fine_lookup_kinds
        return fine is None or all(g.kind in fine or g.block_size == h for g in q.groups)

    def hit_alignment(self, q: Query) -> int:
        """What vLLM aligns a hybrid coordinator's hits to (``_cache_hit_alignment_tokens``):
        before 0.23 (no ``scheduler_block_size``, and no partial hash hits), the lcm of
        the block sizes; else the hash block size with partial hash hits on, the
        scheduler block size with them off."""
        if not self.release.scheduler_alignment:
            return lcm(*(g.block_size for g in q.groups))
        if self.partial_hits(q):
            return hash_block_size(q)
        return scheduler_block_size(q)


Check = Callable[[Query, Asker], str | None]


def two_specs(q: Query, asker: Asker) -> str | None:
    """Up to 0.28 the hybrid coordinator asserts two different specs."""
    specs = {spec_key(g) for g in q.groups}
    if len(q.groups) > 1 and len(specs) == 1:
        return (
            f"vLLM {asker.release.name}'s hybrid coordinator asserts that the groups have at "
            "least two different specs"
        )
    return None


def single_group_hash_unit(q: Query, asker: Asker) -> str | None:
    """A single group takes no hash unit finer than its block."""
    if len(q.groups) == 1 and q.hash_unit not in (None, q.groups[0].block_size):
        return (
            "vLLM rejects a prefix_match_unit other than the block size with a single KV "
            "cache group (resolve_kv_cache_block_sizes)"
        )
    return None


def single_group_alignment(q: Query, asker: Asker) -> str | None:
    """The unitary coordinator aligns hits to the block size."""
    if len(q.groups) == 1 and q.alignment != q.groups[0].block_size:
        return "vLLM aligns a single group's hits to its block size (scheduler block size = b)"
    return None


def chunked_local_alignment(q: Query, asker: Asker) -> str | None:
    """A chunked local group's block size is the alignment (vLLM's assert)."""
    if any(g.kind == Kind.CHUNKED_LOCAL and g.block_size != q.alignment for g in q.groups):
        return "vLLM asserts that a chunked local group's block size is the alignment"
    return None


def hit_alignment(q: Query, asker: Asker) -> str | None:
    """Several groups: vLLM's hits land on the alignment :meth:`Asker.hit_alignment`
    says, which must be A."""
    if len(q.groups) < 2:
        return None
    aligned = asker.hit_alignment(q)
    if aligned == q.alignment:
        return None
    if not asker.release.scheduler_alignment:
        return (
            f"vLLM {asker.release.name} has no scheduler_block_size: hits are aligned to "
            f"the lcm of the block sizes ({aligned}), not A={q.alignment}"
        )
    partial = "on" if asker.partial_hits(q) else "off"
    return (
        f"vLLM {asker.release.name} aligns these groups' hits to {aligned}, not "
        f"A={q.alignment} (partial hash hits {partial}: partial_hash_hits_enabled)"
    )


def one_drafter(q: Query, asker: Asker) -> str | None:
    """vLLM has one drafter per model: it drops (EAGLE/MTP without lookahead hashes),
    hashes lookahead tokens (EAGLE/MTP, 0.33+ by default), or neither (DFlash, DSpark:
    ``none``)."""
    lookahead = any(g.drafter == Drafter.LOOKAHEAD for g in q.groups)
    dropping = any(g.eagle for g in q.groups)
    if lookahead and dropping:
        return (
            "vLLM either drops an eagle block (use_eagle) or hashes lookahead tokens, "
            "for every drafter at once, never both"
        )
    if dropping and any(g.drafter == Drafter.NONE and g.kind in EAGLE_KINDS for g in q.groups):
        return "vLLM has one drafter per model: an eagle drop and a drafter that drops nothing never mix"
    return None


def chunked_local_drop(q: Query, asker: Asker) -> str | None:
    """A chunked local group never drops an eagle block (vLLM's assert)."""
    if any(g.kind == Kind.CHUNKED_LOCAL and g.eagle for g in q.groups):
        return "vLLM asserts that a chunked local group never drops an eagle block"
    return None


def eagle_everywhere(q: Query, asker: Asker) -> str | None:
    """Before 0.20 ``use_eagle`` makes every group drop."""
    if not any(g.eagle for g in q.groups):
        return None
    if any(not g.eagle for g in q.groups if g.kind in EAGLE_KINDS) or any(
        g.kind == Kind.CHUNKED_LOCAL for g in q.groups
    ):
        return (
            f"vLLM {asker.release.name} has no per-group eagle flag (KVCacheGroupSpec."
            "is_eagle_group): with use_eagle every group drops, as when no group is "
            "flagged later, so not a drafter on some full and sliding window groups "
            "only, nor with chunked local attention"
        )
    return None


def eagle_window_alignment(q: Query, asker: Asker) -> str | None:
    """Up to 0.22 an eagle sliding window's block size is the alignment (vLLM's assert)."""
    if any(
        g.kind == Kind.SLIDING_WINDOW and g.eagle and g.block_size != q.alignment for g in q.groups
    ):
        return (
            f"vLLM {asker.release.name} asserts that an eagle sliding window's block size is "
            "the alignment"
        )
    return None


def lookahead_within_block(q: Query, asker: Asker) -> str | None:
    """0.33+: the coordinator's ``ValueError`` for a lookahead longer than the scheduler
    block size (``KVCacheCoordinator.__init__``, ``kv_cache_coordinator.py``, 0.34.0)."""
    lookahead, block = prefill_lookahead(q), scheduler_block_size(q)
    if lookahead > block:
        return (
            f"vLLM {asker.release.name} refuses a lookahead of {lookahead} tokens past a "
            f"scheduler block of {block} (Multi-module MTP ... scheduler_block_size >= "
            "num_speculative_tokens)"
        )
    return None


def rules(asker: Asker) -> tuple[Rule, ...]:
    """The rules of what ``asker`` can ask vLLM, each where its release has it."""
    release = asker.release
    checks: list[Check] = [
        *([two_specs] if release.hybrid_needs_two_specs else []),
        single_group_hash_unit,
        single_group_alignment,
        chunked_local_alignment,
        hit_alignment,
        one_drafter,
        chunked_local_drop,
        *([eagle_everywhere] if not release.group_eagle_flag else []),
        *([eagle_window_alignment] if release.eagle_window_needs_block_alignment else []),
        *([lookahead_within_block] if release.lookahead_within_scheduler_block else []),
    ]
    return bound(asker, checks)


def bound(asker: Asker, checks: Sequence[Check]) -> tuple[Rule, ...]:
    """Each check as a rule of ``asker``, named after it."""
    return tuple(Rule(check.__name__, asked_by(check, asker)) for check in checks)


def asked_by(check: Check, asker: Asker) -> Callable[[Query], str | None]:
    """``check`` as a refusal of ``asker``'s queries."""

    def refuses(q: Query) -> str | None:
        return check(q, asker)

    return refuses


def drafters(asker: Asker) -> frozenset[Drafter]:
    """The drafters ``asker`` can ask: the eagle drop and ``none`` on every release;
    ``lookahead`` where the release has lookahead block hashes (0.33+,
    ``num_hash_lookahead_tokens``) and on the default path only."""
    lookahead = asker.release.lookahead_hashes and asker.path == EaglePath.DEFAULT
    return frozenset({Drafter.DROP, Drafter.NONE, *([Drafter.LOOKAHEAD] if lookahead else [])})


def capabilities(asker: Asker) -> Capabilities:
    """What ``asker`` can ask vLLM: every kind and window convention, the drafters of
    :func:`drafters`, hash units where the release has partial hash hits (0.26.0+), and
    the :func:`rules`.

    >>> old = Release("0.14.0", frozenset(), False, False, False, True, True)
    >>> caps = capabilities(Asker(old))
    >>> caps.hash_units, Drafter.LOOKAHEAD in caps.drafters
    (False, False)
    >>> from kvhit.model.protocol import parse_query
    >>> caps.refusal(parse_query({"groups": [{"kind": "full", "block_size": 2},
    ...                                      {"kind": "mamba", "block_size": 4}],
    ...                           "cached": ["", ""], "max_length": 8, "alignment": 8}))
    'vLLM 0.14.0 has no scheduler_block_size: hits are aligned to the lcm of the block sizes (4), not A=8'
    """
    return Capabilities(
        drafters=drafters(asker),
        hash_units=asker.release.partial_hash_hits,
        rules=rules(asker),
    )


def one_lookahead(q: Query, asker: Asker) -> str | None:
    """vLLM's manager keys every group with the request's lookahead hashes: one La
    for all groups (:func:`shared_lookahead`)."""
    try:
        shared_lookahead(q.groups)
    except Unsupported as err:
        return str(err)
    return None


def partial_hits_need_unit(q: Query, asker: Asker) -> str | None:
    """Where vLLM's manager turns partial hash hits on, a program without a hash unit
    cannot say where its hits land."""
    if q.hash_unit is None and asker.partial_hits(q):
        return (
            "vLLM lands hits inside a mamba block here (partial hash hits): "
            f"the program needs a hash unit ({hash_block_size(q)})"
        )
    return None


def manager_capabilities(release: Release) -> Capabilities:
    """What vLLM's ``KVCacheManager`` can be driven with (the stateful ``vllm``
    target): the lookup's capabilities as vLLM's scheduler asks (partial hash hits at
    their default), one La for every group, and a hash unit wherever partial hash hits
    are on."""
    asker = Asker(release)
    return capabilities(asker).with_rules(*bound(asker, (one_lookahead, partial_hits_need_unit)))
