"""``kvhit export`` against every vLLM release installed next to this environment (CI
installs 0.14.0 and 0.34.0): the documented divergences' examples and one stateful
program, exported once, each generated test run with pytest under each release, in
a process of its own that imports no kvhit. It fails exactly on the releases where
kvhit's own ``vllm`` target disagrees with the spec (so on every release of the
example's class, and only where a documented class holds the example), passes where
vLLM agrees, and skips itself, with the reason printed, where kvhit refuses the
query as unsupported."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from kvhit.analysis import Analysis
from kvhit.engines.vllm.divergences import DIVERGENCES, Divergence, documented, release_key
from kvhit.harness.report import Disagreement
from kvhit.harness.saved import save
from kvhit.model.protocol import parse_query
from kvhit.targets.target_record import TargetRecord

RELEASES_DIR = Path(sys.prefix) / "vllm"
FOUND = sorted((p.name for p in RELEASES_DIR.glob("*") if (p / "vllm").is_dir()), key=release_key)

PROGRAM = {
    "groups": [
        {"kind": "sliding_window", "block_size": 1, "window": 4, "eagle": True},
        {"kind": "mamba", "block_size": 1},
    ],
    "num_blocks": 32,
    "ops": [
        {"op": "admit", "request": 0, "tokens": [1, 2, 3, 4, 5, 6]},
        {"op": "finish", "request": 0},
        {"op": "admit", "request": 1, "tokens": [1, 2, 3, 4, 5, 6, 7]},
    ],
}
"""An eagle window beside a Mamba group: the second admit loses reuse where vLLM's
eagle lookup is not widened by the margin (a class of 0.14.0 … 0.19.0)."""

STATUS = re.compile(r"^(PASSED|FAILED|ERROR|SKIPPED \[\d+\]) (\S+?)(?:::|:\d+:)(.*)$")


def kvhit(*args: str, release: str) -> subprocess.CompletedProcess[str]:
    """Run this environment's kvhit with ``release`` first on the path."""
    return run([sys.executable, "-m", "kvhit.cli", *args], release)


def run(command: list[str], release: str) -> subprocess.CompletedProcess[str]:
    """Run ``command`` with vLLM ``release`` first on PYTHONPATH."""
    env = {**os.environ, "PYTHONPATH": str(RELEASES_DIR / release)}
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1800)


@dataclass(frozen=True)
class Exported:
    """A saved file, its exported test, and the divergences it is the example of
    (none: the program)."""

    source: str
    test: Path
    divergences: tuple[Divergence, ...] = ()


def example_files(out: Path) -> dict[str, tuple[Divergence, ...]]:
    """Each distinct divergence example saved as vLLM's disagreement (as the gate
    saves one), with the divergences it is the example of."""
    found: dict[str, tuple[Divergence, ...]] = {}
    for d in DIVERGENCES:
        answer = {"length": d.vllm_length, "blocks": d.vllm_blocks}
        d_found = Disagreement(TargetRecord("vllm"), d.verdict, Analysis(d.query), answer, d.name)
        path = str(save(d_found.saved(), out))
        found[path] = (*found.get(path, ()), d)
    return found


def saved_program(out: Path) -> str:
    """:data:`PROGRAM` saved as kvhit saves a stateful disagreement: replayed under the
    oldest release, where it disagrees."""
    program = out / "program-plain.json"
    program.write_text(json.dumps(PROGRAM))
    replayed = kvhit("replay", str(program), "--target", "vllm", "--json", release=FOUND[0])
    record = json.loads(replayed.stdout)
    assert record["class"] == "lost_reuse", replayed.stderr
    saved = out / "program.json"
    saved.write_text(json.dumps({k: v for k, v in record.items() if k != "file"}))
    return str(saved)


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> list[Exported]:
    """The saved files and their exported tests, the tests in one folder."""
    assert FOUND, f"no release folder in {RELEASES_DIR} (scripts/install-vllm.sh)"
    root = tmp_path_factory.mktemp("export")
    saved = {**example_files(root / "saved"), saved_program(root): ()}
    (root / "tests").mkdir()
    found = []
    for number, (source, divergences) in enumerate(saved.items()):
        test = root / "tests" / f"test_exported_{number}.py"
        done = kvhit("export", source, "-o", str(test), release=FOUND[0])
        assert done.returncode == 0, done.stderr
        found.append(Exported(source, test, divergences))
    return found


def outcomes(tests: Path, release: str) -> dict[str, tuple[str, str]]:
    """Each generated test file's outcome under ``release`` (PASSED, FAILED, SKIPPED)
    and what pytest printed with it (a skip's reason)."""
    command = [sys.executable, "-m", "pytest", "-rA", "-p", "no:cacheprovider", str(tests)]
    done = run(command, release)
    found = {}
    for line in done.stdout.splitlines():
        match = STATUS.match(line)
        if match:
            status, path, rest = match.groups()
            found[Path(path).name] = (status.split(" ")[0], rest.strip())
    return found


def expected_outcomes(files: list[str], release: str) -> dict[str, str]:
    """What each saved file's exported test must do under ``release``, from kvhit's own
    ``vllm`` target replaying it there: skip where it is unsupported, or where a
    program's last lookup meets another cache state than the saved one (the test
    knows the correct answer on that state only); fail where it disagrees; and where
    the gate finds a lookup ok, fail anyway if vLLM lists other blocks than the
    spec's (the gate accepts extra cached blocks, as in the documented class "window 1
    reuses the block before the hit"; the exported test does not)."""
    done = kvhit("replay", *files, "--target", "vllm", "--json", release=release)
    found = {}
    for r in map(json.loads, done.stdout.splitlines()):
        saved = json.loads(Path(r["file"]).read_text())
        moved = "snapshot" in saved and r["snapshot"] != saved["snapshot"]
        exact = r["class"] == "ok" and (r.get("target_answer") or {}).get("blocks") in (
            None,
            r["reference"]["blocks"],
        )
        skipped = r["class"] == "unsupported" or moved
        found[r["file"]] = "SKIPPED" if skipped else EXACT[exact]
    return found


EXACT = {True: "PASSED", False: "FAILED"}


@pytest.mark.parametrize("release", FOUND)
def test_an_exported_test_fails_exactly_where_vllm_disagrees(
    exported: list[Exported], release: str
) -> None:
    found = outcomes(exported[0].test.parent, release)
    expected = expected_outcomes([e.source for e in exported], release)
    for e in exported:
        status, said = found[e.test.name]
        assert status == expected[e.source], e.source
        if status == "SKIPPED":
            assert said.startswith(f"vLLM {release}"), said
        if any(d.in_release(release) for d in e.divergences):
            assert status == "FAILED", (e.source, [d.name for d in e.divergences])
        if status == "FAILED" and e.divergences:  # only under a documented class
            query = parse_query(json.loads(Path(e.source).read_text())["query"])
            assert documented(query, release), e.source
