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

from kvhit.harness.tally import Tally
from kvhit.targets.runner import CALL_TIMEOUT
from kvhit.targets.target_spec import TargetSpec

Gate = Callable[..., Tally]


def gate_or_fail(
    target: str | Callable[[dict[str, Any]], Any],
    out_dir: Path,
    seconds: float = 5.0,
    seed: int = 0,
    timeout: float = CALL_TIMEOUT,
) -> Tally:
    """Gate ``target`` (:func:`kvhit.harness.driver.gate`, the gate ``kvhit gate``
    runs); ``pytest.fail`` with the drawn counterexample if it disagrees."""
    # Imported here: the gate's sources load torch, which a suite that never asks for
    # the fixture should not pay for at start-up.
    from kvhit.harness.driver import gate

    if callable(target):
        name = getattr(target, "__name__", "target")
        tally = gate(target, seconds, seed, out_dir, timeout)
    else:
        name = target
        tally = gate(TargetSpec(target, timeout=timeout), seconds, seed, out_dir)
    if tally.found:
        d = tally.found[0]
        pytest.fail(
            f"kvhit gate: {name} disagrees with the reference ({d.cls}) after {tally.cases} "
            f"cases\n{d.render()}\nreplay file: {out_dir / d.saved().file_name()}",
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
