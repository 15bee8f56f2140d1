"""The drafter rows of the spec's pages (the README's table, docs/spec.md, docs/design.md
§1.3) state the rule the model applies: each row's ``L + x ≤ T`` is read from the page
and the longest hit it allows is compared with ``kvhit check --json``."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
from click.testing import CliRunner

from kvhit.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
SECTIONS = {  # page: the heading of the section holding its drafter table
    "README.md": "## The spec in one table",
    "docs/spec.md": "## The spec",
    "docs/design.md": "### 1.3 Drafters",
}
DRAFTER_ROW = re.compile(r"^\|[^|\n]*?`(drop|none|lookahead)`[^\n]*$", re.MULTILINE)
KEY_RULE = re.compile(r"L \+ (\w+) ≤ T")


def section(page: str) -> str:
    """The text of ``page`` from its spec section's heading to the next heading."""
    text = (ROOT / page).read_text(encoding="utf-8")
    start = text.index(SECTIONS[page] + "\n")
    end = text.find("\n#", start + len(SECTIONS[page]))
    return text[start : end if end >= 0 else len(text)]


def drafter_rows(page: str) -> dict[str, str]:
    """The rows of the page's drafter table, by drafter."""
    return {m[1]: m[0] for m in DRAFTER_ROW.finditer(section(page))}


@dataclass(frozen=True)
class Case:
    """A full group of block size 4 whose rows hold every block a hit up to M needs (the
    next unit included), so only the request's length T limits the hit."""

    drafter: str
    max_length: int
    num_tokens: int
    hash_unit: int | None = None
    lookahead: int = 0

    def query(self) -> dict[str, object]:
        group = {"kind": "full", "block_size": 4, "drafter": self.drafter}
        if self.drafter == "lookahead":
            group["lookahead"] = self.lookahead
        q = {"groups": [group], "cached": [[True] * 4], "max_length": self.max_length}
        q["num_tokens"] = self.num_tokens
        return q if self.hash_unit is None else {**q, "hash_unit": self.hash_unit}

    def documented(self, row: str) -> int:
        """The longest hit the row's rule allows: a multiple of A (h, else b) up to M
        with L + x ≤ T, x the row's term (u: the unit, h with a hash unit, else b)."""
        unit = self.hash_unit or 4
        found = KEY_RULE.findall(row)
        if self.drafter == "none":
            assert not found, row
            reach = 0
        else:
            [term] = found
            if term == "u":
                assert "u = h" in row and "u = b" in row, row
            reach = {"b": 4, "h": self.hash_unit, "u": unit, "La": self.lookahead}[term]
        return max(L for L in range(0, self.max_length + 1, unit) if L + reach <= self.num_tokens)


CASES = [
    Case("drop", max_length=4, num_tokens=6, hash_unit=2),  # the reference's query: 4
    Case("drop", max_length=8, num_tokens=10),  # 8 + b > 10: 4
    Case("lookahead", max_length=8, num_tokens=10, lookahead=3),  # design §1.3's: 4
    Case("lookahead", max_length=8, num_tokens=11, hash_unit=2, lookahead=3),  # 8
    Case("none", max_length=8, num_tokens=9),  # 8
]


def model_answer(query: dict[str, object]) -> int:
    """L* as ``kvhit check --json`` prints it."""
    out = CliRunner().invoke(main, ["check", "-", "--json"], input=json.dumps(query))
    assert out.exit_code == 0, out.output
    return json.loads(out.output)["length"]


def test_each_page_has_a_row_for_each_drafter() -> None:
    for page in SECTIONS:
        assert set(drafter_rows(page)) == {"drop", "none", "lookahead"}, page


@pytest.mark.parametrize("page", SECTIONS)
@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.drafter}-T{c.num_tokens}-h{c.hash_unit}")
def test_a_drafter_row_states_the_models_rule(page: str, case: Case) -> None:
    row = drafter_rows(page)[case.drafter]
    assert case.documented(row) == model_answer(case.query()), row


def test_the_hash_unit_case_tells_a_block_from_a_unit() -> None:
    """Read with the block (L + b ≤ T), the reference's query would answer 2, not 4: the
    case above separates the two readings."""
    case = CASES[0]
    assert model_answer(case.query()) == 4
    assert case.documented("| `drop` | L + b ≤ T |") == 2
