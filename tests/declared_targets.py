"""Targets that declare what they can be asked, and fail loudly when asked anything
else: the gate must never draw it for them (tests/test_contract.py)."""

from __future__ import annotations

from typing import Any

from kvhit.contract import Rule, declare
from kvhit.model.spec import Query
from kvhit.targets.registry import model_target


def one_block_size(q: Query) -> str | None:
    """A rule: every group of one block size."""
    return None if len({g.block_size for g in q.groups}) == 1 else "one block size only"


@declare(kinds=["full", "sliding_window"], hash_units=False, rules=[Rule("sizes", one_block_size)])
def windows_of_one_size(query: dict[str, Any]) -> Any:
    """The reference, raising on anything it did not declare."""
    kinds = {g["kind"] for g in query["groups"]}
    sizes = {g["block_size"] for g in query["groups"]}
    if not kinds <= {"full", "sliding_window"} or len(sizes) > 1 or "hash_unit" in query:
        raise AssertionError(f"asked what it does not declare: {query}")
    if "tiers" in query:
        raise AssertionError("asked a tiered query without declaring tiers")
    return model_target(query)


@declare(tiers=True)
def pool_only(query: dict[str, Any]) -> Any:
    """Declares tiers and ignores them: the fixed point of its pool's rows alone."""
    return model_target({key: value for key, value in query.items() if key != "tiers"})
