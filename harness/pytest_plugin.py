"""A pytest plugin: gate a target from your own test suite.

    def test_my_engine_agrees_with_kvhit(kvhit_gate):
        kvhit_gate("my_engine.kvhit:lookup", seconds=5)

The ``kvhit_gate`` fixture runs the same gate as ``kvhit gate`` (exhaustive small
scopes, the solver corpus, random queries for ``seconds``) and fails the test with
the shrunk counterexample drawn, its replay file saved in the test's temporary
folder. The target is a built-in name, ``module:function`` or a callable.

Enable it with ``-p kvhit.harness.pytest_plugin`` (or it is loaded automatically
where kvhit's ``pytest11`` entry point is installed).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from kvhit.harness.checker import CaseChecker
from kvhit.harness.tally import Tally
from kvhit.targets.runner import CALL_TIMEOUT, CallableRunner, Runner
from kvhit.targets.spec import TargetSpec

Gate = Callable[..., Tally]


def gate_or_fail(
    target: str | Callable[[dict[str, Any]], Any],
    out_dir: Path,
    seconds: float = 5.0,
    seed: int = 0,
    timeout: float = CALL_TIMEOUT,
) -> Tally:
    """Gate ``target``; ``pytest.fail`` with the drawn counterexample if it disagrees."""
    # Imported here: the gate's sources load torch (never z3), which a suite that never
    # asks for the fixture should not pay for at start-up.
    from kvhit.harness.gate import run_gate

    runner: Runner
    if callable(target):
        runner, name = CallableRunner(target, timeout), getattr(target, "__name__", "target")
    else:
        runner, name = TargetSpec(target, timeout=timeout).open(), target
    try:
        tally = run_gate(CaseChecker(runner, name, out_dir, stop_at_first=True), seconds, seed)
    finally:
        runner.close()
    if tally.found:
        d = tally.found[0]
        pytest.fail(
            f"kvhit gate: {name} disagrees with the reference ({d.cls}) after {tally.cases} "
            f"cases\n{d.render()}\nreplay file: {out_dir / d.name()}",
            pytrace=False,
        )
    return tally


@pytest.fixture
def kvhit_gate(tmp_path: Path) -> Gate:
    """``kvhit_gate(target, seconds=5, seed=0, timeout=10)``: gate a target, fail the
    test with the drawn counterexample; returns the tally (``cases``, ``counts``)."""

    def gate(target: str | Callable[[dict[str, Any]], Any], **options: Any) -> Tally:
        return gate_or_fail(target, tmp_path / "kvhit-disagreements", **options)

    return gate
