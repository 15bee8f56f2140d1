"""Every registry keyed by attention kind covers every member of ``Kind``.

A new kind is a member of :class:`kvhit.model.spec.Kind` and one entry in each map
below; a map that misses it fails here, not in a user's run. The engines' maps need
vLLM or SGLang installed and are checked beside their other tests
(tests_vllm/test_adapter.py, tests_sglang/test_agreement.py).
"""

from __future__ import annotations

from typing import Any

import pytest

from kvhit.harness.random_cases import Choice
from kvhit.impl.managers import MANAGERS, GroupManager
from kvhit.impl.tiny_model import FIRST_KEY
from kvhit.model.finders import SCANS
from kvhit.model.spec import DRAFTERS, FIRST_REUSED, PARAMETERS, Group, Kind
from kvhit.proofs.common import FINDERS, NOT_CLOSED
from kvhit.proofs.theorems.contracts import INVARIANTS

KIND_REGISTRIES: dict[str, dict[Kind, Any]] = {
    "kvhit.model.spec.FIRST_REUSED": FIRST_REUSED,
    "kvhit.model.spec.PARAMETERS": PARAMETERS,
    "kvhit.model.finders.SCANS": SCANS,
    "kvhit.impl.managers.MANAGERS": MANAGERS,
    "kvhit.proofs.theorems.contracts.INVARIANTS": INVARIANTS,
    "kvhit.impl.tiny_model.FIRST_KEY": FIRST_KEY,
}
"""Every map from kind to its per-kind behaviour that runs without an engine."""


@pytest.mark.parametrize("name", KIND_REGISTRIES)
def test_the_registry_has_one_entry_per_kind(name: str) -> None:
    registry = KIND_REGISTRIES[name]
    assert list(registry) == list(Kind), f"{name} does not follow Kind"
    assert all(type(key) is Kind for key in registry), f"{name} is keyed by strings"


def test_every_kind_has_its_manager_class() -> None:
    managers = set(MANAGERS.values())
    assert len(managers) == len(Kind)
    assert all(issubclass(m, GroupManager) and m is not GroupManager for m in managers)


def test_the_proofs_cover_every_finder() -> None:
    assert set(FINDERS) == {(k, None) for k in Kind} | {(k, d) for k in Kind for d in DRAFTERS[k]}
    assert set(NOT_CLOSED) == set(Kind) - {Kind.FULL}


def test_a_generator_can_draw_every_kind() -> None:
    assert {str(c) for c in Choice} == {str(k) for k in Kind} | {"eagle", "drafter", "hash_unit"}
    assert all(Choice[k.name] == k for k in Kind)


@pytest.mark.parametrize("kind", list(Kind))
def test_every_kind_round_trips_through_the_protocol(kind: Kind) -> None:
    """A group of each kind, its parameter set, is a protocol object and back."""
    from kvhit.model.protocol import parse_group

    parameter = PARAMETERS[kind]
    g = Group(kind, 2, **({parameter: 3} if parameter else {}))
    assert parse_group(g.to_json(), "g") == g
