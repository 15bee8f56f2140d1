"""The commands docs/engines/vllm.md runs against vLLM (blocks marked ``needs vllm``)
run here, at a test's budget, and exit as the docs say (tests/test_docs_commands.py)."""

from __future__ import annotations

import runpy
from pathlib import Path
from typing import Any

import pytest

DOCS = runpy.run_path(str(Path(__file__).resolve().parents[1] / "tests" / "test_docs_commands.py"))


@pytest.mark.parametrize("command", DOCS["engine_commands"]("vllm"), ids=str)
def test_documented_command_runs(command: Any, tmp_path_factory: pytest.TempPathFactory) -> None:
    DOCS["check_engine_command"](command, tmp_path_factory.getbasetemp())
