"""The gate finds nothing in vLLM outside the documented divergences."""

from __future__ import annotations

from kvhit.engines.vllm.divergences import vllm_outside_divergences
from kvhit.harness.engine import Engine
from kvhit.harness.gate import gate_phases, run_phases
from kvhit.targets.runner import CallableRunner

RANDOM_CASES = 5000


def test_the_gate_finds_no_undocumented_disagreement():
    engine = Engine(CallableRunner(vllm_outside_divergences, timeout=10.0), "vllm")
    run_phases(engine, gate_phases(seconds=None, cases=RANDOM_CASES))
    assert engine.found == []
    assert engine.counts["ok"] > RANDOM_CASES // 2  # older releases refuse more
