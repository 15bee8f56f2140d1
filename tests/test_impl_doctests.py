"""The worked examples in the impl's docstrings hold."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "kvhit.impl.formula",
    "kvhit.impl.hashing",
    "kvhit.impl.pool",
    "kvhit.impl.managers",
    "kvhit.impl.coordinator",
    "kvhit.impl.tiny_model",
    "kvhit.impl.engine",
    "kvhit.impl.target",
    "kvhit.impl.bench",
    "kvhit.proofs.impl_formula",
    "kvhit.proofs.cases",
    "kvhit.proofs.instantiate",
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name))
    assert result.attempted > 0 and result.failed == 0
