"""``kvhit export`` for SGLang: random states of SGLang's shapes, saved as the gate saves
a query, exported, and every generated test run with pytest in a process of its own.
Each passes where kvhit's own ``sglang`` target agrees with the spec and fails where it
does not: on SGLang as installed (it agrees on all of them), and on SGLang with its
match broken (``broken_match``), where the failures are exactly the states the broken
match answers wrongly through kvhit's target.

The generated files import SGLang, torch and pytest only; the process that runs them
imports kvhit's SGLang adapter first, for this machine's torchvision alone
(:func:`kvhit.engines.sglang.target._import_torchvision`: the only torchvision wheel on
the package index is a CUDA build, and every ``sglang.srt`` module imports it)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from broken_match import broken
from click.testing import CliRunner

from kvhit.cli.main import main
from kvhit.engines.sglang.target import sglang_target
from kvhit.errors import Unsupported
from kvhit.harness.random_cases import QueryShape, random_queries
from kvhit.model.spec import Query
from kvhit.targets.registry import model_target

HERE = Path(__file__).parent
RUN = (
    "import sys, pytest; import kvhit.engines.sglang.target; "
    "sys.exit(pytest.main(['-q', '-rs', '-p', 'no:cacheprovider', *sys.argv[1:]]))"
)
OUTCOME = re.compile(r"^(PASSED|FAILED|ERROR) (test_\d+)\.py", re.M)


def asked(count: int) -> list[Query]:
    """Random queries of SGLang's shapes that its tree can hold (some with a drafter's
    window, a Mamba group, pages above one token)."""
    found = []
    for q in random_queries(11, 400, shape=QueryShape.SGLANG):
        try:
            sglang_target.answer(q)
        except Unsupported:
            continue
        found.append(q)
        if len(found) == count:
            return found
    raise AssertionError(f"only {len(found)} of 400 random SGLang queries can be asked")


def exported(queries: list[Query], out: Path) -> list[Path]:
    """Each query saved as a file and exported as test_N.py (``kvhit export --engine
    sglang``)."""
    tests = []
    for n, q in enumerate(queries):
        source = out / f"case_{n}.json"
        source.write_text(json.dumps(q.to_json()))
        test = out / f"test_{n}.py"
        result = CliRunner().invoke(
            main, ["export", str(source), "--engine", "sglang", "-o", str(test)]
        )
        assert result.exit_code == 0, result.output
        tests.append(test)
    return tests


def outcomes(tests: list[Path], *plugins: str) -> dict[str, str]:
    """Each generated test's outcome (PASSED or FAILED) run in one pytest process."""
    options = [word for plugin in plugins for word in ("-p", plugin)]
    command = [sys.executable, "-c", RUN, "-rA", *options, *map(str, tests)]
    env = {**os.environ, "PYTHONPATH": str(HERE)}  # the plugin's folder
    done = subprocess.run(
        command, capture_output=True, text=True, timeout=900, cwd=tests[0].parent, env=env
    )
    found = {name: status for status, name in OUTCOME.findall(done.stdout)}
    assert len(found) == len(tests), done.stdout[-3000:] + done.stderr[-2000:]
    return found


def disagrees(q: Query) -> bool:
    """Whether kvhit's ``sglang`` target answers the query other than the spec."""
    return sglang_target.answer(q) != model_target.answer(q)


@pytest.fixture(scope="module")
def cases(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Query], list[Path]]:
    queries = asked(24)
    return queries, exported(queries, tmp_path_factory.mktemp("sglang-export"))


def test_every_exported_test_passes_on_sglang_as_installed(
    cases: tuple[list[Query], list[Path]],
) -> None:
    queries, tests = cases
    assert not any(map(disagrees, queries))
    assert set(outcomes(tests).values()) == {"PASSED"}


def test_exported_tests_fail_exactly_where_a_broken_match_disagrees(
    cases: tuple[list[Query], list[Path]],
) -> None:
    queries, tests = cases
    with broken():
        expected = {
            f"test_{n}": "FAILED" if disagrees(q) else "PASSED" for n, q in enumerate(queries)
        }
    assert "FAILED" in expected.values() and "PASSED" in expected.values()
    assert outcomes(tests, "broken_match") == expected


def test_what_sglang_cannot_be_asked_is_one_error_line(tmp_path: Path) -> None:
    source = tmp_path / "chunked.json"
    source.write_text(
        '{"groups": [{"kind": "chunked_local", "block_size": 1, "chunk": 2}], "cached": ["1"], "max_length": 1}'
    )
    result = CliRunner().invoke(main, ["export", str(source), "--engine", "sglang"])
    assert result.exit_code == 2
    assert "SGLang cannot be asked this: declares no chunked_local groups" in result.output
