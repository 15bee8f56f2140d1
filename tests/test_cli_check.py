"""``kvhit check``: the drawing, the JSON form and ``--explain`` on the seed examples."""

import json
from pathlib import Path

from click.testing import CliRunner
from rich.console import Console

from kvhit.cli.main import main
from kvhit.cli.verify import SEED_FACTS, TIER_FACTS, examples_section, tiers_section

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def check(*args, stdin=None):
    return CliRunner().invoke(main, ["check", *args], input=stdin)


def test_check_draws_the_minimal_counterexample():
    result = check(str(EXAMPLES / "seed_minimal.json"))
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "query: M=2 A=1"
    assert lines[1].split("   ")[:3] == ["group 0  sliding_window w=2 b=1", ". #", "own finder: 2"]
    assert lines[2].split("   ")[:3] == ["group 1  sliding_window w=2 b=1", "# .", "own finder: 1"]
    assert "L* = 0" in lines[3]
    assert lines[4] == (
        "min of groups answered 1 (unsafe): group 0 needs block 0 at L=1, not cached"
    )


def test_check_marks_the_reused_blocks():
    result = check(str(EXAMPLES / "seed_reviewer_as_written.json"))
    assert ". . . @ #" in result.output and ". # @ @ ." in result.output
    assert "min of groups answered 4 (correct)" in result.output


MAMBA_STATE_IN_A_TIER = {
    "groups": [{"kind": "mamba", "block_size": 4}],
    "cached": [[{"upto": 2}]],
    "max_length": 4,
    "hash_unit": 2,
    "tiers": [{"name": "cpu", "holds": ["mamba"], "cached": {"0": [True]}}],
}
"""The pool holds the Mamba state at 2, a tier the state at 4 (block 0's end)."""


def test_check_marks_the_mamba_state_reused_not_the_pools_shorter_one():
    result = check("-", stdin=json.dumps(MAMBA_STATE_IN_A_TIER))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1] == "group 0  mamba b=4   # .   own finder: 4"  # the state at 2: not reused
    assert lines[2] == "  cpu                . @"  # L* = 4 reuses the tier's state at 4
    assert lines[3].startswith("L* = 4 ") and "block 0 from cpu" in lines[4]


def test_check_json_has_the_promised_fields():
    lines = check("--json", str(EXAMPLES / "seed_reviewer_exact.json")).output.splitlines()
    report = json.loads(lines[0])
    assert report["length"] == 0 and report["fixed_point"] == 0
    assert report["min_of_groups"] == 4 and report["min_of_groups_verdict"] == "unsafe"
    assert report["per_group"] == [5, 4] and report["blocks"] == [[], []]


def test_check_reads_json_lines_from_stdin():
    text = "\n".join((EXAMPLES / name).read_text().replace("\n", " ") for name in SEED_FACTS)
    result = check("--json", "-", stdin=text)
    assert result.exit_code == 0
    assert [json.loads(line)["length"] for line in result.output.splitlines()] == [4, 0, 0]


def test_explain_names_the_missing_block():
    result = check("--explain", "4", str(EXAMPLES / "seed_reviewer_exact.json"))
    assert result.output.splitlines()[-1] == "group 0 needs block 2 at L=4, not cached"
    result = check("--explain", "4", str(EXAMPLES / "seed_reviewer_as_written.json"))
    assert result.output.splitlines()[-1] == "L=4 is valid for every group"


def test_explain_rejects_a_length_that_is_not_a_candidate():
    result = check("--explain", "9", str(EXAMPLES / "seed_minimal.json"))
    assert result.exit_code == 2
    assert "not a candidate" in result.output


def test_verify_reproduces_the_seed_facts():
    console = Console(record=True, width=200)
    assert examples_section(console, quick=True)
    text = console.export_text()
    assert text.count("holds") == len(SEED_FACTS)


def test_verify_reproduces_the_tier_facts():
    console = Console(record=True, width=200)
    assert tiers_section(console, quick=True)
    text = console.export_text()
    assert text.count("\nholds") == len(TIER_FACTS)
    assert "max of groups answered 8 (unsafe)" in text


FINE = {
    "groups": [
        {"kind": "full", "block_size": 4},
        {"kind": "mamba", "block_size": 4, "drafter": "lookahead", "lookahead": 3},
    ],
    "cached": [[True, {"upto": 6}], [True, {"upto": 6}]],
    "max_length": 7,
    "hash_unit": 2,
}


def test_check_draws_units_partial_blocks_and_lookahead_keys():
    result = check("--explain", "6", "-", stdin=json.dumps(FINE))
    assert result.exit_code == 0
    lines = result.output.splitlines()
    assert lines[0] == "query: M=7 A=2 h=2"
    assert lines[1].endswith("full b=4                @ @ | # .   own finder: 6")
    assert lines[2].endswith("mamba b=4 lookahead=3   . @ | # .   own finder: 4")
    assert "L* = 4" in lines[3]
    assert lines[-1] == (
        "group 1 (lookahead=3) has its key at L=6 cover the next 3 tokens, "
        "past the request's 8 tokens"
    )
