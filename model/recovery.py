"""Recovery after a failed KV load (docs/design.md §1.8).

A request took a hit of L0 tokens and loaded the blocks each group reuses at it;
then some of those blocks are reported invalid, after the fact (a KV connector's
``invalid_block_ids``). The longest prefix still valid is L* over the rows with the
invalid blocks removed, :func:`pruned`, which the fixed point finds:
:func:`recovered_length`.

**What depends on an invalid block.** A block holds the KV (for Mamba, the state at
its end) computed from its tokens by whoever wrote it, and the key that finds it
chains through the earlier blocks' *tokens*, not their KV. So block j of group g
reported invalid makes row g's entry j uncached, and nothing else: a later block of
g keeps its content and its key. Whether a hit can still use it is validity's
question (§1.2), asked block by block, so the fixed point handles the hole: full
attention cannot reach past it (every longer hit needs block j), a sliding window
whose window starts after it can, and so can a Mamba state after it. KV computed by
*reading* an invalid block (the failed step's own tokens, from L0 on) is not among
the rows a recovered hit reads: pruning only removes blocks, so the recovered hit is
at most L0.

``invalid`` has one entry per group: the indices of its blocks reported invalid, in
the query's own blocks (an index outside the row names no block). The indices may
be z3 integers when the proofs run the model.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 1},
    ...                             {"kind": "sliding_window", "block_size": 1, "window": 2}],
    ...                  "cached": ["1111", "0101"], "max_length": 4})
    >>> invalid = [[3], []]
    >>> pruned(q, invalid).cached
    ((True, True, True, False), (False, True, False, True))
    >>> recovered_length(q, invalid)
    2
    >>> {name: rule(q, invalid) for name, rule in WRONG_RECOVERY_RULES.items()}
    {'truncate at the first invalid block': 3, 'per-group truncation, then the min': 3, 'full attention alone': 3, 'replay from zero': 0}
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from kvhit.model.algorithms import fixed_point, group_finders
from kvhit.model.ops import PY, Ops
from kvhit.model.spec import Kind, Query, fine_query

Invalid = Sequence[Sequence[Any]]
"""Per group, the indices of its blocks reported invalid."""


def named(indices: Sequence[Any], j: Any, ops: Ops = PY) -> Any:
    """Whether one of ``indices`` names block ``j``.

    >>> named([2, 5], 5), named([], 0)
    (True, False)
    """
    return ops.or_(*(i == j for i in indices))


def pruned(q: Query, invalid: Invalid, ops: Ops = PY) -> Query:
    """The query with every invalid block uncached: its :func:`fine_query` (tiers
    folded in, so a block reported invalid is gone wherever it was held; a hash unit
    expanded, so each unit of an invalid block is gone), with those units uncached.

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "mamba", "block_size": 4}],
    ...                  "cached": [[True, True]], "max_length": 7, "hash_unit": 2})
    >>> pruned(q, [[1]]).cached
    ((False, True, False, False),)
    """
    if len(invalid) != len(q.groups):
        raise ValueError(f"invalid has {len(invalid)} entries for {len(q.groups)} groups")
    fine = fine_query(q, ops)
    rows = []
    for g, unit, row, blocks in zip(q.groups, fine.groups, fine.cached, invalid):
        per = g.block_size // unit.block_size
        rows.append(
            tuple(
                ops.and_(ops.bit(row, u), ops.not_(named(blocks, u // per, ops)))
                for u in range(len(row))
            )
        )
    return replace(fine, cached=tuple(rows))


def recovered_length(q: Query, invalid: Invalid, ops: Ops = PY) -> Any:
    """The longest prefix still valid once ``invalid`` blocks are reported: the fixed
    point of the :func:`pruned` query (its L*)."""
    return fixed_point(pruned(q, invalid, ops), ops)


def truncated(q: Query, i: int, blocks: Sequence[Any], top: Any, ops: Ops = PY) -> Any:
    """``top`` cut at group i's first block named in ``blocks``, j·b tokens, rounded
    down to A (vLLM's cut, ``num_computed_tokens = idx * block_size``).

    >>> from kvhit.model.protocol import parse_query
    >>> q = parse_query({"groups": [{"kind": "full", "block_size": 2}], "cached": ["111"],
    ...                  "max_length": 6, "alignment": 2})
    >>> truncated(q, 0, [2, 1], 6), truncated(q, 0, [7], 6)
    (2, 6)
    """
    b, width = q.groups[i].block_size, len(q.cached[i])
    out = top
    for j in blocks:
        out = ops.min(out, ops.ite(ops.and_(j >= 0, j < width), j * b, top))
    return ops.div(out, q.alignment) * q.alignment


def truncate_at_first_invalid(q: Query, invalid: Invalid, ops: Ops = PY) -> Any:
    """vLLM's single-group rule applied to a hybrid: the hit before the failure cut at
    the first invalid block of any group (vLLM 0.34.0,
    ``vllm/v1/core/sched/scheduler.py``, ``Scheduler._update_requests_with_invalid_blocks``:
    "Truncate the computed tokens at the first failed block"; known wrong, unsafe)."""
    hit = fixed_point(q, ops)
    out = hit
    for i, blocks in enumerate(invalid):
        out = ops.min(out, truncated(q, i, blocks, hit, ops))
    return out


def per_group_truncation_min(q: Query, invalid: Invalid, ops: Ops = PY) -> Any:
    """Each group cut at its own first invalid block and its own finder run from
    there on its remaining blocks (so each group's answer is valid for that group),
    then the min over the groups: min of groups' flaw, a group that is not downward
    closed need not be valid at the min (known wrong, unsafe)."""
    hit = fixed_point(q, ops)
    finders = group_finders(pruned(q, invalid, ops), ops)
    out = hit
    for i, (blocks, find) in enumerate(zip(invalid, finders)):
        out = ops.min(out, find(truncated(q, i, blocks, hit, ops)))
    return out


def full_attention_truncation(q: Query, invalid: Invalid, ops: Ops = PY) -> Any:
    """The hit before the failure cut at the first invalid block of a full-attention
    group, the other groups' invalid blocks ignored (known wrong, unsafe); the
    recovered length when there is no full-attention group."""
    if all(g.kind != Kind.FULL for g in q.groups):
        return recovered_length(q, invalid, ops)
    hit = fixed_point(q, ops)
    out = hit
    for i, (g, blocks) in enumerate(zip(q.groups, invalid)):
        if g.kind == Kind.FULL:
            out = ops.min(out, truncated(q, i, blocks, hit, ops))
    return out


def replay_from_zero(q: Query, invalid: Invalid, ops: Ops = PY) -> Any:
    """Recompute the whole request (safe, known wrong: lost reuse)."""
    return 0


RecoveryRule = Callable[[Query, Invalid, Ops], Any]

WRONG_RECOVERY_RULES: dict[str, RecoveryRule] = {
    "truncate at the first invalid block": truncate_at_first_invalid,
    "per-group truncation, then the min": per_group_truncation_min,
    "full attention alone": full_attention_truncation,
    "replay from zero": replay_from_zero,
}
"""The known-wrong ways to recover a hybrid after a failed load, by name."""
