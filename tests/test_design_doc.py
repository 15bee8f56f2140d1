"""Every ``docs/design.md §N`` cited in the repository names a section that exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r"docs/design\.md §(\d+(?:\.\d+)*)")
HEADING = re.compile(r"^#{2,3} (\d+(?:\.\d+)*)\.? ", re.MULTILINE)
FOLDERS = (
    *("core", "model", "proofs", "impl", "targets", "harness", "engines", "cli", "examples"),
    *("docs", "tests", "tests_vllm", "tests_sglang", "tests_ray", "benchmarks", "scripts"),
)


def cited_files() -> list[Path]:
    files = [ROOT / "README.md"]
    for folder in FOLDERS:
        files += [p for p in (ROOT / folder).rglob("*") if p.suffix in (".py", ".md")]
    return files


def test_every_citation_names_a_section() -> None:
    sections = set(HEADING.findall((ROOT / "docs" / "design.md").read_text(encoding="utf-8")))
    cited = {
        (path.relative_to(ROOT), number)
        for path in cited_files()
        for number in CITATION.findall(path.read_text(encoding="utf-8"))
    }
    assert len(cited) > 10
    missing = sorted(f"{path}: §{number}" for path, number in cited if number not in sections)
    assert not missing, missing


def test_no_citation_points_outside_the_repository() -> None:
    """The old citations named a DESIGN.md that the repository does not hold."""
    stale = [
        str(path.relative_to(ROOT))
        for path in cited_files()
        if path != Path(__file__).resolve() and "DESIGN.md" in path.read_text(encoding="utf-8")
    ]
    assert not stale, stale
