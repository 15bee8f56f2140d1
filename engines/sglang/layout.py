"""How SGLang's tree holds a query: which group is the tree, its windows and its Mamba
group (:func:`shape`), and the state it can hold (:func:`layout`), or why not
(:class:`~kvhit.errors.Unsupported`). Plain Python, no SGLang import, so that
``kvhit export`` can lay a query out where SGLang is not installed; the mapping is
described in :mod:`kvhit.engines.sglang.target`."""

from __future__ import annotations

from dataclasses import dataclass

from kvhit.errors import Unsupported
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


def shape(groups: tuple[Group, ...], alignment: int) -> TreeGroups:
    """How SGLang's tree holds these groups; Unsupported if it cannot.

    >>> tree = shape((Group("sliding_window", 2, window=3), Group("full", 2)), 2)
    >>> tree.page, tree.full, tree.windows, tree.mamba_index
    (2, 1, (0,), None)
    """
    kinds = [g.kind for g in groups]
    if any(g.drafter not in (None, Drafter.NONE) for g in groups):
        raise Unsupported(
            "SGLang's EAGLE cache keys its tree by token pairs (RadixKey bigrams); "
            "only groups without a drafter key (none) are driven"
        )
    counts = {kind: kinds.count(kind) for kind in Kind}
    if counts[Kind.FULL] != 1 or counts[Kind.CHUNKED_LOCAL] or counts[Kind.MAMBA] > 1:
        raise Unsupported(
            "SGLang's hybrid radix caches hold one full group plus a sliding window "
            f"(and its drafter's) and a mamba group; got {', '.join(kinds)}"
        )
    if counts[Kind.SLIDING_WINDOW] > 2:
        raise Unsupported("SGLang's tree has one window pool: at most a window and its drafter's")
    page = groups[0].block_size
    if any(g.block_size != page for g in groups) or alignment != page:
        raise Unsupported("SGLang has one page size: every block size and A must be equal")
    windows = tuple(i for i, k in enumerate(kinds) if k == Kind.SLIDING_WINDOW)
    if any(window_before(groups[i]) < 1 for i in windows):
        raise Unsupported("SGLang needs a positive sliding_window_size (exclusive window)")
    mamba = kinds.index(Kind.MAMBA) if Kind.MAMBA in kinds else None
    return TreeGroups(page, kinds.index(Kind.FULL), windows, mamba)


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


def _row_prefix(row: tuple[bool, ...]) -> int:
    """F, if ``row`` is blocks 0 … F-1 and nothing after; else Unsupported."""
    full = next((j for j, bit in enumerate(row) if not bit), len(row))
    if any(row[full:]):
        raise Unsupported(
            f"SGLang's tree holds full KV for a prefix only: full block {full} is "
            f"missing but block {row.index(True, full)} is cached"
        )
    return full


def _within(row: tuple[bool, ...], full: int, what: str) -> tuple[bool, ...]:
    """``row`` cut to the tree's F blocks; Unsupported if a bit lies past them."""
    if any(row[full:]):
        raise Unsupported(
            f"{what} block {row.index(True, full)} is cached past the full KV "
            f"(blocks 0 … {full - 1}): a tree node always holds full KV"
        )
    return tuple(row[:full]) + (False,) * (full - len(row[:full]))


def layout(q: Query) -> Layout:
    """Check that SGLang's tree can hold the query's state (a query without a hash
    unit), and how."""
    tree = shape(q.groups, q.alignment)
    full = _row_prefix(q.cached[tree.full])
    rows = {_within(q.cached[i], full, "window") for i in tree.windows}
    if len(rows) > 1:
        raise Unsupported(
            "a drafter's window KV shares the target's window slots in SGLang "
            "(UnifiedDraftSWAKVPool): both window rows must be equal"
        )
    mamba_row: tuple[bool, ...] | None = None
    if tree.mamba_index is not None:
        mamba_row = _within(q.cached[tree.mamba_index], full, "Mamba")
        if full and not mamba_row[-1]:
            raise Unsupported(
                f"SGLang keeps a Mamba state on every leaf: the last full block {full - 1} "
                "needs a cached state (evicting it drops the leaf's full KV too)"
            )
    windows = tuple(q.groups[i] for i in tree.windows)
    return Layout(tree.page, full, windows, rows.pop() if rows else (), mamba_row)
