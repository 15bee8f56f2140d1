"""Every file the repository keeps that a generator writes is what that generator
writes today: each docs/upstream class's example and its exported test
(``python docs/upstream/evidence.py --regenerate``), and docs/upstream/README.md's
tables of the saved evidence (``--tables``). Regenerated in memory and compared, so
a change to a generator shows here until the files are written again. (The solver
corpus is checked by tests/test_harness_parts.py; running the upstream tests under
vLLM is tests_vllm/test_upstream.py's.)"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvhit.cli.main import main

UPSTREAM = Path(__file__).resolve().parents[1] / "docs" / "upstream"
sys.path.insert(0, str(UPSTREAM))

import evidence  # noqa: E402

GENERATED = evidence.generated()


def test_every_file_of_the_upstream_tests_folder_is_generated() -> None:
    kept = {p for p in evidence.TESTS.iterdir() if p.suffix in (".py", ".json")}
    assert kept == set(GENERATED)
    assert len(GENERATED) == 2 * len(evidence.FIXES) == 16


@pytest.mark.parametrize("path", sorted(GENERATED), ids=lambda p: p.name)
def test_the_committed_file_is_what_its_generator_writes(path: Path) -> None:
    assert path.read_text(encoding="utf-8") == GENERATED[path], (
        f"{path.name} is stale: run python docs/upstream/evidence.py --regenerate"
    )


@pytest.mark.parametrize("fix", evidence.FIXES, ids=lambda f: f.key)
def test_kvhit_export_in_the_folder_writes_the_committed_test(
    fix: evidence.Fix, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the README says made the test: ``kvhit export example-CLASS.json``."""
    monkeypatch.chdir(evidence.TESTS)
    result = CliRunner().invoke(main, ["export", f"example-{fix.key}.json", "--engine", "vllm"])
    assert result.exit_code == 0, result.output
    assert result.stdout == (evidence.TESTS / f"test_upstream_{fix.key}.py").read_text()


@pytest.mark.parametrize("fix", evidence.FIXES, ids=lambda f: f.key)
def test_the_readme_shows_each_class_table_as_printed_from_the_evidence(
    fix: evidence.Fix,
) -> None:
    readme = (UPSTREAM / "README.md").read_text(encoding="utf-8")
    assert f"#### {fix.key}\n\n{evidence.table(fix)}" in readme
