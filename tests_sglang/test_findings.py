"""Each finding of docs/findings-sglang.md, pinned on its shrunk counterexample."""

from __future__ import annotations

import pytest
from cases import query

from kvhit.engines.sglang.target import sglang_target
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.targets.registry import model_target

FULL1 = {"kind": "full", "block_size": 1}


def window(w: int, convention: str = "inclusive", b: int = 1) -> dict[str, object]:
    return {"kind": "sliding_window", "block_size": b, "window": w, "window_convention": convention}


def test_finding_1_sglang_window_is_exclusive_so_the_same_number_needs_one_more_token() -> None:
    """Read as vLLM's (inclusive) window, SGLang's sliding_window_size = 2 loses the
    hit at 2: it needs tokens 0 and 1, the inclusive window 2 only token 1."""
    inclusive = query([FULL1, window(2)], ["11", "01"], 2)
    exclusive = query([FULL1, window(2, "exclusive")], ["11", "01"], 2)
    assert model_target(inclusive)["length"] == 2
    assert sglang_target(exclusive) == model_target(exclusive) == {"length": 0, "blocks": [[], []]}
    # Stated in SGLang's own convention, the same KV: inclusive 2 is exclusive 1.
    assert (
        sglang_target(inclusive)
        == model_target(inclusive)
        == {
            "length": 2,
            "blocks": [[0, 1], [1]],
        }
    )


@pytest.mark.parametrize(
    ("groups", "rows", "reason"),
    [
        ([FULL1, window(1)], ["1", "1"], "positive sliding_window_size"),
        ([FULL1], ["101"], "full block 1 is missing but block 2 is cached"),
        ([FULL1, window(3)], ["1", "011"], "window block 1 is cached past the full KV"),
        (
            [FULL1, {"kind": "mamba", "block_size": 1}],
            ["11", "10"],
            "the last full block 1 needs a cached state",
        ),
        ([FULL1, window(3), window(5)], ["1", "1", "0"], "both window rows must be equal"),
        ([FULL1, window(3), window(5), window(2)], ["1", "1", "1", "1"], "one window pool"),
        ([FULL1, *[{"kind": "mamba", "block_size": 1}] * 2], ["1"] * 3, "one mamba group"),
        (
            [FULL1, {**window(3), "drafter": "lookahead", "lookahead": 1}],
            ["1", "1"],
            "declares no lookahead drafters",
        ),
        (
            [FULL1, {"kind": "chunked_local", "block_size": 1, "chunk": 2}],
            ["1", "1"],
            "chunked_local",
        ),
        ([window(3)], ["1"], "one full group"),
        ([FULL1, window(3, b=2)], ["11", "1"], "one page size"),
        ([FULL1, {**window(3), "eagle": True}], ["11", "11"], "declares no drop drafters"),
    ],
)
def test_finding_2_states_sglang_cannot_hold_are_declared_and_unsupported(
    groups: list[dict[str, object]], rows: list[str], reason: str
) -> None:
    """Each is refused by the target's declared capabilities (kvhit does not draw it)
    and, asked anyway, answered ``unsupported`` with the same reason."""
    q = query(groups, rows, 1)
    assert reason in (sglang_target.capabilities.refusal(parse_query(q)) or "")
    with pytest.raises(Unsupported, match=reason):
        sglang_target(q)


def test_finding_2_no_state_refused_for_its_rows_could_have_served_a_hit() -> None:
    """Full KV past a hole or past the last Mamba state serves no hit in the spec."""
    holes = query([FULL1], ["101"], 3)
    leaf = query([FULL1, {"kind": "mamba", "block_size": 1}], ["111", "010"], 3)
    assert model_target(holes)["length"] == 1 and model_target(leaf)["length"] == 2
    trimmed = query([FULL1, {"kind": "mamba", "block_size": 1}], ["11", "01"], 3)
    assert sglang_target(trimmed) == model_target(trimmed) == model_target(leaf)
