"""Disagreements the release matrix met outside every documented class, each now named:
its query (as the matrix saved it) lies in the scope of the documented divergence that
explains it, on the release that answered it so. Only the scopes are read here (no
vLLM call), so every release's finding is checked whichever release is installed."""

from __future__ import annotations

from typing import Any

import pytest

from kvhit.engines.vllm.divergences import documented
from kvhit.model.protocol import parse_query

FOUND: list[tuple[str, str, dict[str, Any]]] = [
    (
        "0.29.0",
        "hybrid eagle lookup widened by the margin only up to max_length",
        {
            "groups": [
                {"kind": "full", "block_size": 2, "eagle": True},
                {"kind": "full", "block_size": 1},
            ],
            "cached": [[True, True], [True, True, True, True]],
            "max_length": 3,
            "num_tokens": 4,
            "alignment": 2,
            "hash_unit": 1,
        },
    ),
    (
        "0.29.0",
        "only the prompt's last hash boundary is registered: a whole block's inner "
        "boundaries are not found",
        {
            "groups": [
                {"kind": "mamba", "block_size": 4},
                {"kind": "full", "block_size": 4},
                {"kind": "mamba", "block_size": 2, "drafter": "none"},
                {"kind": "full", "block_size": 4},
            ],
            "cached": [[{"upto": 2}], [True], [True, False], [{"upto": 2}]],
            "max_length": 5,
            "num_tokens": 7,
            "alignment": 2,
            "hash_unit": 2,
        },
    ),
]


def case_id(release: str, name: str, query: dict[str, Any]) -> str:
    """A test id: the release and the start of the class's name."""
    return f"{release} {name[:48]}"


@pytest.mark.parametrize(("release", "name", "query"), FOUND, ids=[case_id(*f) for f in FOUND])
def test_the_matrix_finding_is_in_its_documented_class(release, name, query):
    assert name in documented(parse_query(query), release)
