"""On whole-block queries the gate finds nothing in vLLM outside the documented
divergences (the queries of vLLM's defaults find more: docs/findings-vllm.md)."""

from __future__ import annotations

from typing import Any

from cases import WHOLE_BLOCKS, whole_block

from kvhit.engines.vllm.divergences import vllm_outside_divergences
from kvhit.engines.vllm.options import EAGLE
from kvhit.errors import Unsupported
from kvhit.harness.checker import CaseChecker
from kvhit.harness.gate import gate_phases, run_phases
from kvhit.model.protocol import parse_query
from kvhit.targets.runner import CallableRunner
from kvhit.targets.target_record import TargetRecord

RANDOM_CASES = 5000
UNDOCUMENTED = vllm_outside_divergences({EAGLE.name: EAGLE.default})


def whole_blocks_outside_divergences(query: dict[str, Any]) -> dict[str, Any]:
    """vLLM outside the documented divergences, on whole-block queries only."""
    if not whole_block(parse_query(query)):
        raise Unsupported("not a whole-block query")
    return UNDOCUMENTED(query)


def test_the_gate_finds_no_undocumented_disagreement():
    runner = CallableRunner(whole_blocks_outside_divergences, timeout=10.0)
    checker = CaseChecker(runner, TargetRecord("vllm"))
    phases = gate_phases(seconds=None, cases=RANDOM_CASES, kinds=WHOLE_BLOCKS)
    tally = run_phases(checker, phases)
    assert tally.found == []
    assert tally.counts["ok"] > RANDOM_CASES // 2  # older releases refuse more
