"""The query protocol: accepted forms, normalization, and every class of bad input."""

import json
import subprocess
import sys

import pytest

from kvhit.model import QueryError, load_queries, parse_query
from kvhit.model.spec import Upto, fine_query, longest_hit, valid_all

GOOD = {
    "groups": [
        {"kind": "full", "block_size": 2},
        {"kind": "sliding_window", "block_size": 2, "window": 4, "eagle": True},
        {"kind": "chunked_local", "block_size": 2, "chunk": 8},
        {"kind": "mamba", "block_size": 2},
    ],
    "cached": [[True, False], "10", [1, 0], []],
    "max_length": 5,
}


def with_changes(**changes):
    query = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        target = query
        *parents, last = path.split("__")
        for key in parents:
            target = target[int(key) if key.isdigit() else key]
        if value is KeyError:
            del target[int(last) if last.isdigit() else last]
        else:
            target[int(last) if last.isdigit() else last] = value
    return query


def test_rows_in_every_form_normalize_to_bools():
    q = parse_query(GOOD)
    assert q.cached == ((True, False), (True, False), (True, False), ())
    assert q.alignment == 2 and q.num_tokens == 6
    normalized = q.to_json()
    assert [g["eagle"] for g in normalized["groups"]] == [False, True, False, False]
    assert parse_query(normalized) == q


BAD = [
    ("groups[0].kind", with_changes(groups__0__kind="linear")),
    ("groups[0].kind", with_changes(groups__0__kind=KeyError)),
    ("groups[1].window", with_changes(groups__1__window=KeyError)),
    ("groups[1].window", with_changes(groups__1__window=0)),
    ("groups[1].window", with_changes(groups__1__window="4")),
    ("groups[2].chunk", with_changes(groups__2__chunk=KeyError)),
    ("groups[0].window", with_changes(groups__0__window=4)),
    ("groups[0].block_size", with_changes(groups__0__block_size=0)),
    ("groups[0].block_size", with_changes(groups__0__block_size=True)),
    ("groups[0].block_size", with_changes(groups__0__block_size=KeyError)),
    ("groups[3].eagle", with_changes(groups__3__eagle=True)),
    ("groups[2].eagle", with_changes(groups__2__eagle=True)),
    ("groups[0].eagle", with_changes(groups__0__eagle="yes")),
    ("groups[0].typo", with_changes(groups__0__typo=1)),
    ("groups[1]", with_changes(groups__1=[1, 2])),
    ("groups", with_changes(groups=[])),
    ("groups", with_changes(groups="full")),
    ("alignment", with_changes(alignment=3)),
    ("alignment", with_changes(alignment=0)),
    ("max_length", with_changes(max_length=-1)),
    ("max_length", with_changes(max_length=2.5)),
    ("max_length", with_changes(max_length=KeyError)),
    ("num_tokens", with_changes(num_tokens=5)),
    ("cached", with_changes(cached=[[], [], []])),
    ("cached", with_changes(cached=KeyError)),
    ("cached[1]", with_changes(cached__1="10x")),
    ("cached[0]", with_changes(cached__0=7)),
    ("cached[2][1]", with_changes(cached__2__1=2)),
    ("max_len", with_changes(max_len=3)),
    ("groups[3].drafter", with_changes(groups__3__drafter="drop")),
    ("groups[2].drafter", with_changes(groups__2__drafter="drop")),
    ("groups[0].drafter", with_changes(groups__0__drafter="medusa")),
    ("groups[1].eagle", with_changes(groups__1__drafter="none")),
    ("groups[0].lookahead", with_changes(groups__0__drafter="lookahead")),
    ("groups[0].lookahead", with_changes(groups__0__drafter="lookahead", groups__0__lookahead=-1)),
    ("groups[0].lookahead", with_changes(groups__0__lookahead=2)),
    ("hash_unit", with_changes(hash_unit=3)),
    ("hash_unit", with_changes(hash_unit=0)),
    ("alignment", with_changes(hash_unit=2, alignment=3)),
    ("cached[0][1]", with_changes(cached__0__1={"upto": 3})),
    ("cached[0][1].upto", with_changes(hash_unit=1, cached__0__1={"upto": 4})),
    ("cached[0][1].upto", with_changes(hash_unit=1, cached__0__1={"upto": 2})),
    ("cached[0][1].upto", with_changes(hash_unit=2, cached__0__1={"upto": 3})),
    ("cached[0][1].till", with_changes(hash_unit=1, cached__0__1={"till": 3})),
]

FINE = {
    "groups": [
        {"kind": "full", "block_size": 4},
        {"kind": "mamba", "block_size": 4, "drafter": "lookahead", "lookahead": 2},
        {"kind": "sliding_window", "block_size": 4, "window": 3, "drafter": "none"},
    ],
    "cached": [[True, {"upto": 6}], [True, {"upto": 6}], [False, True]],
    "max_length": 9,
    "num_tokens": 10,
    "hash_unit": 2,
}


@pytest.mark.parametrize(("field", "query"), BAD)
def test_bad_input_names_the_field(field, query):
    with pytest.raises(QueryError) as err:
        parse_query(query)
    assert err.value.field == field
    assert str(err.value).startswith(f"{field}: ")


def test_a_query_must_be_an_object():
    with pytest.raises(QueryError):
        parse_query([GOOD])


def test_json_lines_and_single_objects():
    one = json.dumps(GOOD, indent=2)
    assert load_queries(one) == [GOOD]
    lines = json.dumps(GOOD) + "\n\n" + json.dumps(GOOD) + "\n"
    assert load_queries(lines) == [GOOD, GOOD]
    with pytest.raises(QueryError) as err:
        load_queries(json.dumps(GOOD) + "\n{not json\n")
    assert err.value.field == "line 2"
    with pytest.raises(QueryError):
        load_queries("")


def run_cli(*args, stdin=""):
    return subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )


@pytest.mark.parametrize(("field", "query"), BAD[::4])
def test_cli_exits_2_with_one_line_naming_the_field(field, query):
    result = run_cli("check", "-", stdin=json.dumps(query))
    assert result.returncode == 2
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and field in lines[0] and "Traceback" not in result.stderr


def test_cli_reports_missing_file_and_bad_json():
    missing = run_cli("check", "/nonexistent/q.json")
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    garbage = run_cli("check", "-", stdin="{oops")
    assert garbage.returncode == 2 and "line 1" in garbage.stderr


def test_old_queries_mean_what_they_meant():
    """``eagle: true`` is ``drafter: drop``; no hash unit means whole blocks, as before."""
    q = parse_query(GOOD)
    assert q.hash_unit is None and [g.drafter for g in q.groups] == [None, "drop", None, None]
    assert parse_query(with_changes(groups__1__drafter="drop")) == q


def test_a_fine_query_round_trips_and_reads_partial_blocks_per_kind():
    q = parse_query(FINE)
    assert q.alignment == 2 and q.cached[0][1] == Upto(6)
    assert parse_query(q.to_json()) == q
    fine = fine_query(q)
    assert fine.cached[0] == (True, True, True, False)
    assert fine.cached[1] == (False, True, True, False)
    # L = 6: full holds tokens 0-5, mamba the state at 6, the window (t = 2) tokens 4-5;
    # L = 8 would need the full group's tokens 6-7, which the partial block lacks.
    assert [L for L in range(0, 10, 2) if valid_all(q, L)] == [0, 6]
    assert longest_hit(q).length == 6
    lookahead_too_long = parse_query({**FINE, "num_tokens": 7, "max_length": 6})
    assert longest_hit(lookahead_too_long).length == 0
