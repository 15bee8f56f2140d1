"""Every module's docstring examples run, and hold."""

from __future__ import annotations

import doctest
import importlib
import importlib.util
import sys

import pytest
from kvhit_modules import ROOT, modules

NEEDS = {  # modules that import an optional engine
    "kvhit.engines.vllm.target": "vllm",
    "kvhit.engines.vllm.manager": "vllm",
    "kvhit.engines.vllm.kv_connector": "vllm",
    "kvhit.engines.vllm.connector_lookup": "vllm",
    "kvhit.engines.vllm.connector_engine": "vllm",
    "kvhit.engines.vllm.scheduler_engine": "vllm",
    "kvhit.engines.sglang.target": "sglang",
    "kvhit.engines.sglang.cache": "sglang",
    "kvhit.engines.sglang.hicache": "sglang",
    "kvhit.engines.sglang.scheduler_engine": "sglang",
}


def module_names() -> list[str]:
    return list(modules())


def test_every_module_is_found() -> None:
    names = module_names()
    assert {
        "kvhit.cli.main",
        "kvhit.model.spec",
        "kvhit.proofs.runner",
        "kvhit.impl.formula",
    } <= set(names)


@pytest.mark.parametrize("name", [n for n in module_names() if n not in NEEDS])
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0


def test_the_benchmark_states_examples() -> None:
    """The benchmarks' shared states module is a script's neighbour, not in the package."""
    path = ROOT / "benchmarks" / "bench_states.py"
    spec = importlib.util.spec_from_file_location("bench_states", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_states"] = module
    spec.loader.exec_module(module)
    result = doctest.testmod(module)
    assert result.attempted > 0 and result.failed == 0
