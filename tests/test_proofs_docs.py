"""The docs' theorem tables say what the registry says: every theorem, what it rests
on and over what range (README), and which numbered theorem it belongs to
(docs/design.md §3)."""

from __future__ import annotations

import re
from pathlib import Path

from kvhit.proofs.registry import Theorem, all_theorems

ROOT = Path(__file__).resolve().parent.parent


def table_after(text: str, heading: str) -> list[list[str]]:
    """The cells of the first markdown table after ``heading`` (header rows dropped)."""
    lines = text[text.index(heading) :].splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("|"))
    rows = []
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip("|").split(" | ")])
    return rows[2:]


def readme_range(t: Theorem) -> str:
    """How the proofs page's table writes a theorem's range."""
    reach = "unbounded" if not t.bounded else f"bounded (N={t.bound} by default)"
    return f"{reach}; {t.scope}" if t.scope else reach


def test_the_readme_table_is_the_registry() -> None:
    page = (ROOT / "docs" / "proofs.md").read_text(encoding="utf-8")
    rows = table_after(page, "## What each row rests on")
    expected = [
        [f"`{t.name}`", str(t.expected), t.rests_on, readme_range(t)] for t in all_theorems()
    ]
    assert rows == expected


def test_the_design_table_names_every_theorem() -> None:
    design = (ROOT / "docs" / "design.md").read_text(encoding="utf-8")
    rows = table_after(design, "## 3. What is proved")
    named = [name for row in rows for name in re.findall(r"`(\w+)`", row[1])]
    assert sorted(named) == sorted(t.name for t in all_theorems())
