"""How SGLang's tree holds a query: what it can be asked (:func:`tree_capabilities`,
each configuration check a rule with its reason, and :func:`tree_rows`, the rows a
tree holds), which group is the tree, its windows and its Mamba group (:func:`shape`),
and how it holds the state (:func:`layout`). Plain Python, no SGLang import, so that ``kvhit export`` can lay a query out where SGLang is not
installed; the mapping is described in :mod:`kvhit.engines.sglang.target`."""

from __future__ import annotations

from dataclasses import dataclass

from kvhit.contract import Capabilities, Rule
from kvhit.model.spec import Drafter, Group, Kind, Query, window_before


@dataclass(frozen=True)
class TreeGroups:
    """The groups as one SGLang tree: its page size, the full group's index, the
    window groups' indices (the target's window, then perhaps its drafter's, which
    share one window pool) and the Mamba group's index if there is one."""

    page: int
    full: int
    windows: tuple[int, ...] = ()
    mamba_index: int | None = None


def full_group(q: Query) -> str | None:
    """SGLang's tree is one full group: every node holds full KV (``ComponentType.FULL``,
    ``mem_cache/unified_cache/component_type.py``), the other components hang off it."""
    count = [g.kind for g in q.groups].count(Kind.FULL)
    if count == 1:
        return None
    return f"SGLang's radix tree holds one full group (its FULL component); got {count}"


def one_mamba_group(q: Query) -> str | None:
    """The tree has one Mamba component (``ComponentType.MAMBA``)."""
    if [g.kind for g in q.groups].count(Kind.MAMBA) <= 1:
        return None
    return "SGLang's radix tree has one Mamba component: at most one mamba group"


def windows_at_most(most: int) -> Rule:
    """The tree's one window pool (``ComponentType.SWA``) serves the target's window
    and, where ``most`` is 2, its drafter's (``CacheInitParams.draft_swa_window``)."""
    held = "a window and its drafter's" if most > 1 else "one window"

    def refuses(q: Query) -> str | None:
        if [g.kind for g in q.groups].count(Kind.SLIDING_WINDOW) <= most:
            return None
        return f"SGLang's tree has one window pool: at most {held}"

    return Rule("one_window_pool", refuses)


def one_page_size(q: Query) -> str | None:
    """SGLang has one ``page_size`` for every component, and matches end on pages."""
    page = q.groups[0].block_size
    if all(g.block_size == page for g in q.groups) and q.alignment == page:
        return None
    return "SGLang has one page size: every block size and A must be equal"


def positive_window(q: Query) -> str | None:
    """``SWAComponent`` refuses a ``sliding_window_size`` below 1
    (``unified_cache/components/swa.py:86-87``): a window of the token alone."""
    if all(window_before(g) >= 1 for g in q.groups if g.kind == Kind.SLIDING_WINDOW):
        return None
    return "SGLang needs a positive sliding_window_size (exclusive window)"


def mamba_at_page_one(why: str) -> Rule:
    """A Mamba group only at page size 1, because ``why``."""

    def refuses(q: Query) -> str | None:
        paged = any(g.kind == Kind.MAMBA and g.block_size > 1 for g in q.groups)
        return f"Mamba at page size > 1: {why}" if paged else None

    return Rule("mamba_at_page_one", refuses)


def tree_capabilities(kinds: frozenset[Kind], windows: int) -> Capabilities:
    """What one SGLang radix tree can be asked: ``kinds`` (full, and the components it
    has beside it), at most ``windows`` sliding windows, groups without a drafter key
    (SGLang's EAGLE tree keys token pairs, ``RadixKey`` bigrams: not driven), windows
    of either convention (an inclusive w is SGLang's w - 1, as its model code passes
    it), no hash unit (SGLang's page is its finest unit), no tiers.

    >>> from kvhit.model.protocol import parse_query
    >>> groups = [{"kind": "full", "block_size": 2}, {"kind": "mamba", "block_size": 1}]
    >>> tree_capabilities(frozenset(Kind), 2).refusal(
    ...     parse_query({"groups": groups, "cached": ["", ""], "max_length": 1, "alignment": 2}))
    'SGLang has one page size: every block size and A must be equal'
    """
    return Capabilities(
        kinds=kinds,
        drafters=frozenset({Drafter.NONE}),
        hash_units=False,
        rules=(
            Rule("full_group", full_group),
            Rule("one_mamba_group", one_mamba_group),
            windows_at_most(windows),
            Rule("one_page_size", one_page_size),
            Rule("positive_window", positive_window),
        ),
    )


def shape(groups: tuple[Group, ...]) -> TreeGroups:
    """How SGLang's tree holds groups its capabilities allow (:data:`TREE`).

    >>> tree = shape((Group("sliding_window", 2, window=3), Group("full", 2)))
    >>> tree.page, tree.full, tree.windows, tree.mamba_index
    (2, 1, (0,), None)
    """
    kinds = [g.kind for g in groups]
    windows = tuple(i for i, k in enumerate(kinds) if k == Kind.SLIDING_WINDOW)
    mamba = kinds.index(Kind.MAMBA) if Kind.MAMBA in kinds else None
    return TreeGroups(groups[0].block_size, kinds.index(Kind.FULL), windows, mamba)


@dataclass(frozen=True)
class Layout:
    """The query as SGLang's tree holds it: ``full_blocks`` F (the tree is tokens
    0 … F·page-1), the windows (target's, then drafter's: SGLang's
    ``sliding_window_size`` and ``draft_swa_window``) and, per block, whether its
    window KV or Mamba state is cached."""

    page: int
    full_blocks: int
    windows: tuple[Group, ...]
    window_row: tuple[bool, ...]
    mamba_row: tuple[bool, ...] | None

    @property
    def tokens(self) -> int:
        """How many tokens the tree holds."""
        return self.full_blocks * self.page

    @property
    def window_sizes(self) -> tuple[int | None, int]:
        """SGLang's ``sliding_window_size`` and ``draft_swa_window`` (0: no drafter
        window), exclusive."""
        sizes = [window_before(g) for g in self.windows]
        return (sizes[0] if sizes else None), (sizes[1] if len(sizes) > 1 else 0)


def prefix_blocks(row: tuple[bool, ...]) -> int:
    """How many blocks ``row`` caches before its first hole.

    >>> prefix_blocks((True, True, False, True))
    2
    """
    return next((j for j, bit in enumerate(row) if not bit), len(row))


def cut(row: tuple[bool, ...], full: int) -> tuple[bool, ...]:
    """``row``'s first ``full`` blocks (padded with uncached ones)."""
    return tuple(row[:full]) + (False,) * (full - len(row[:full]))


def tree_rows(q: Query) -> str | None:
    """Why SGLang's tree cannot hold the rows of ``q`` (a query its configuration rules
    allow), or None: a node always holds full KV, so the full row is blocks 0 … F-1
    and the other bits lie within them; the window rows are one (a drafter's window KV
    shares the target's slots, ``UnifiedDraftSWAKVPool``); a Mamba state ends the last
    full block (evicting a leaf's state drops the leaf, full KV too).

    >>> from kvhit.model.protocol import parse_query
    >>> tree_rows(parse_query({"groups": [{"kind": "full", "block_size": 1}],
    ...                        "cached": ["101"], "max_length": 3}))
    "SGLang's tree holds full KV for a prefix only: full block 1 is missing but block 2 is cached"
    """
    kinds = [g.kind for g in q.groups]
    full_row = q.cached[kinds.index(Kind.FULL)]
    full = prefix_blocks(full_row)
    if any(full_row[full:]):
        return (
            f"SGLang's tree holds full KV for a prefix only: full block {full} is "
            f"missing but block {full_row.index(True, full)} is cached"
        )
    held = f"blocks 0 … {full - 1}" if full else "none"
    for g, row in zip(q.groups, q.cached):
        if any(row[full:]):
            what = "Mamba" if g.kind == Kind.MAMBA else "window"
            return (
                f"{what} block {row.index(True, full)} is cached past the full KV "
                f"({held}): a tree node always holds full KV"
            )
    windows = {
        cut(row, full) for g, row in zip(q.groups, q.cached) if g.kind == Kind.SLIDING_WINDOW
    }
    if len(windows) > 1:
        return (
            "a drafter's window KV shares the target's window slots in SGLang "
            "(UnifiedDraftSWAKVPool): both window rows must be equal"
        )
    if Kind.MAMBA in kinds and full and not cut(q.cached[kinds.index(Kind.MAMBA)], full)[-1]:
        return (
            f"SGLang keeps a Mamba state on every leaf: the last full block {full - 1} "
            "needs a cached state (evicting it drops the leaf's full KV too)"
        )
    return None


TREE_ROWS = Rule("tree_rows", tree_rows, reads_rows=True)
"""The rows one SGLang tree holds (:func:`tree_rows`)."""


def layout(q: Query) -> Layout:
    """How SGLang's tree holds the state of a query its capabilities allow (:data:`TREE`).

    >>> from kvhit.model.protocol import parse_query
    >>> lay = layout(parse_query({"groups": [{"kind": "full", "block_size": 1},
    ...                                      {"kind": "mamba", "block_size": 1}],
    ...                           "cached": ["111", "011"], "max_length": 3}))
    >>> lay.full_blocks, lay.mamba_row
    (3, (False, True, True))
    """
    tree = shape(q.groups)
    full = prefix_blocks(q.cached[tree.full])
    window_row = cut(q.cached[tree.windows[0]], full) if tree.windows else ()
    mamba_row = None if tree.mamba_index is None else cut(q.cached[tree.mamba_index], full)
    windows = tuple(q.groups[i] for i in tree.windows)
    return Layout(tree.page, full, windows, window_row, mamba_row)


TREE = tree_capabilities(frozenset({Kind.FULL, Kind.SLIDING_WINDOW, Kind.MAMBA}), 2).with_rules(
    TREE_ROWS
)
"""The widest a tree may be asked (SGLang 0.5.23's components and its drafter window,
and the rows a tree holds), read without importing SGLang (``kvhit export``); the
``sglang`` target narrows it to what the installed SGLang has
(:func:`kvhit.engines.sglang.target.installed_capabilities`)."""
