"""The gate finds nothing in vLLM outside the documented divergences."""

from __future__ import annotations

from kvhit.engines.vllm.divergences import vllm_outside_divergences
from kvhit.harness.checker import CaseChecker
from kvhit.harness.gate import gate_phases, run_phases
from kvhit.targets.runner import CallableRunner

RANDOM_CASES = 5000


def test_the_gate_finds_no_undocumented_disagreement():
    checker = CaseChecker(CallableRunner(vllm_outside_divergences, timeout=10.0), "vllm")
    tally = run_phases(checker, gate_phases(seconds=None, cases=RANDOM_CASES))
    assert tally.found == []
    assert tally.counts["ok"] > RANDOM_CASES // 2  # older releases refuse more
