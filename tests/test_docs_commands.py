"""Every ``kvhit`` command in the README and docs/ parses with the real command line,
the short ones run and exit as the docs say, and every link to a repository file holds.

A fenced block preceded by ``<!-- docs-test: exit N -->`` is run: each of its ``kvhit``
commands must exit with N, and the drawn lines its output shows (``query:``, ``group``,
``... answered ...``, ``reference answer``) must be printed, in that order. A block
marked ``<!-- docs-test: exit N, needs vllm -->`` (or ``sglang``) is run the same way
by that engine's suite (tests_vllm/, tests_sglang/), at a test's budget
(:func:`bounded`). A proof marked ``<!-- docs-test: exit N, quick -->`` is run at its
theorems' quick bounds (``--quick``): at its full bounds it takes minutes. The other
blocks are parsed only (``kvhit verify``, which tests/test_main_job_piped.py runs as
the README says; campaigns of many minutes).

Each run has a hang guard, :data:`HANG`, far above what the slowest command run here
takes on a quiet machine: a busy machine makes a command slower, never a failure.
"""

from __future__ import annotations

import doctest
import functools
import glob
import os
import re
import shlex
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import click
import pytest

from kvhit.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(
    r"(?:^<!-- docs-test: exit (?P<exit>\d+)(?:, needs (?P<needs>\w+))?(?P<quick>, quick)? -->\n)?"
    r"^```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
SHELL_LANGS = {"", "bash", "sh", "console"}
DRAWN = re.compile(r"^(query:|group \d|engine:|L\* =|reference answer|answers:)|\banswered\b")
WRITES_REPLAY_FILES = {"gate", "fuzz"}
HANG = 600
"""Seconds a documented command may run before the test calls it hung. The slowest run
here, docs/proofs.md's three theorems, takes 15 s of CPU (about that on a quiet
machine) and took 195 s at load 16 on 2 cores."""


@dataclass(frozen=True)
class DocCommand:
    """One ``kvhit`` command of a fenced block: where it is, how the docs run it (the
    folder, the environment variables set before it), what they say it prints and
    returns (``exit_code`` None: parsed only), the engine it needs (None: none), and
    whether the test runs it at the quick proof bounds."""

    page: Path
    line: int
    cwd: Path
    env: tuple[tuple[str, str], ...]
    args: tuple[str, ...]
    exit_code: int | None
    shown: tuple[str, ...]
    needs: str | None = None
    quick: bool = False

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: kvhit {' '.join(self.args)}"


Segment = tuple[Path, tuple[tuple[str, str], ...], list[str]]


def kvhit_segments(line: str) -> list[Segment]:
    """The ``kvhit`` commands of one shell line, each with the folder it runs in and
    the variables set before it.

    >>> kvhit_segments("cd tests && kvhit gate --target x  # a comment")
    [(PosixPath('tests'), (), ['gate', '--target', 'x'])]
    >>> kvhit_segments("PYTHONPATH=a ~/venv/bin/kvhit check q.json | head")
    [(PosixPath('.'), (('PYTHONPATH', 'a'),), ['check', 'q.json'])]
    """
    cwd, words, found = Path("."), [], []
    for token in [*shlex.split(line, comments=True), "&&"]:
        if token not in ("&&", ";", "|"):
            words.append(token)
            continue
        env = []
        while words and re.fullmatch(r"\w+=\S*", words[0]):
            env.append(tuple(words.pop(0).split("=", 1)))
        if words[:1] == ["cd"]:
            cwd = cwd / words[1]
        elif words and Path(words[0]).name == "kvhit":
            found.append((cwd, tuple(env), words[1:]))
        words = []
    return found


def block_commands(page: Path, text: str, match: re.Match[str]) -> list[DocCommand]:
    """The ``kvhit`` commands of one fenced block, with the output lines shown after each
    (in a block of ``$ `` prompts)."""
    lines = match["body"].splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    first_line = text.count("\n", 0, match.start("body")) + 1
    exit_code = int(match["exit"]) if match["exit"] else None
    needs, quick = match["needs"], bool(match["quick"])
    commands = []
    for number, line in enumerate(lines):
        if prompted and not line.startswith("$ "):
            continue
        shown = []
        if prompted:
            for after in lines[number + 1 :]:
                if after.startswith("$ "):
                    break
                shown.append(after)
        for cwd, env, args in kvhit_segments(line.removeprefix("$ ")):
            where = (page, first_line + number, cwd, env)
            said = (exit_code, tuple(shown), needs, quick)
            commands.append(DocCommand(*where, tuple(args), *said))
    return commands


def doc_commands() -> list[DocCommand]:
    """Every ``kvhit`` command in a fenced shell block of the README and docs/."""
    commands = []
    for page in PAGES:
        text = page.read_text(encoding="utf-8")
        for match in FENCE.finditer(text):
            if match["lang"] in SHELL_LANGS and "kvhit" in match["body"]:
                commands += block_commands(page, text, match)
    return commands


COMMANDS = doc_commands()
RUN = [c for c in COMMANDS if c.exit_code is not None and c.needs is None]


def engine_commands(engine: str) -> list[DocCommand]:
    """The documented commands run by ``engine``'s own suite, in the docs' order."""
    return [c for c in COMMANDS if c.exit_code is not None and c.needs == engine]


def bounded(args: tuple[str, ...]) -> list[str]:
    """A documented command at a test's budget: campaigns of at most
    :data:`TEST_SECONDS` seconds, matrices of :data:`MATRIX_CASES` random cases a
    release, and per-call limits that leave room for importing an engine.

    >>> bounded(("gate", "--target", "vllm", "--seconds", "300"))
    ['gate', '--target', 'vllm', '--seconds', '5', '--timeout', '60']
    >>> bounded(("matrix", "--vllm", "0.14.0"))
    ['matrix', '--vllm', '0.14.0', '--cases', '300', '--timeout', '60']
    """
    out = list(args)
    if "--seconds" in out:
        at = out.index("--seconds") + 1
        out[at] = str(min(float(out[at]), TEST_SECONDS)).removesuffix(".0")
    elif out[0] in WRITES_REPLAY_FILES:
        out += ["--seconds", str(TEST_SECONDS)]
    if out[0] == "matrix" and "--cases" not in out:
        out += ["--cases", str(MATRIX_CASES)]
    if out[0] in (*WRITES_REPLAY_FILES, "matrix") and "--timeout" not in out:
        out += ["--timeout", "60"]
    return out


TEST_SECONDS = 5
MATRIX_CASES = 300


def test_this_files_examples() -> None:
    result = doctest.testmod(sys.modules[__name__])
    assert result.attempted >= 3 and result.failed == 0


def test_the_docs_have_commands() -> None:
    assert len(COMMANDS) > 20
    assert {c.args[0] for c in RUN} >= {"check", "prove", "gate", "fuzz", "replay"}


def test_only_proofs_are_run_at_quick_bounds() -> None:
    """The proof that takes minutes at its full bounds is run at its quick ones, and
    only ``kvhit prove`` has quick bounds."""
    quick = [c for c in RUN if c.quick]
    assert [c.page.name for c in quick] == ["proofs.md"]
    assert {c.args[0] for c in quick} == {"prove"}


def test_each_engine_has_commands_its_suite_runs() -> None:
    """Blocks that need an engine name one kvhit drives, and each engine's suite has
    its gates to run (vLLM's also a matrix and a replay of what the matrix saved)."""
    assert {c.needs for c in COMMANDS} == {None, "vllm", "sglang"}
    assert {c.args[0] for c in engine_commands("vllm")} == {"gate", "matrix", "replay"}
    assert {c.args[0] for c in engine_commands("sglang")} == {"gate"}


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_command_parses(command: DocCommand, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command and its options exist and take these values. A path that a command
    not run here expects an earlier step (an install, a run) to have made may be missing."""
    monkeypatch.chdir(ROOT / command.cwd)
    name, *rest = command.args
    parent = click.Context(main, info_name="kvhit")
    subcommand = main.get_command(parent, name)
    assert subcommand is not None, f"{command}: no command {name!r}"
    try:
        subcommand.make_context(name, list(rest), parent=parent)
    except click.BadParameter as err:
        missing_path = isinstance(err.param and err.param.type, click.Path)
        runs_here = command.exit_code is not None and command.needs is None
        if runs_here or not missing_path:
            raise


@functools.cache
def run(command: DocCommand) -> subprocess.CompletedProcess[str]:
    """Run a documented command as the docs do (a ``quick`` one at the quick proof
    bounds), its replay files in a temporary folder."""
    args = list(command.args)
    if args[0] in WRITES_REPLAY_FILES and "--out" not in args:
        args += ["--out", tempfile.mkdtemp(prefix="kvhit-docs-")]
    if command.quick:
        args.append("--quick")
    return subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *args],
        cwd=ROOT / command.cwd,
        capture_output=True,
        text=True,
        timeout=HANG,
    )


def run_in(command: DocCommand, workdir: Path) -> subprocess.CompletedProcess[str]:
    """Run an engine's documented command at a test's budget (:func:`bounded`) in
    ``workdir``, where the block's earlier commands left their files: its variables set
    (``~/venv-NAME`` read as this environment) and its file patterns expanded there."""
    args = [
        found
        for arg in bounded(command.args)
        for found in (sorted(glob.glob(arg, root_dir=workdir)) if "*" in arg else [arg])
    ]
    env = {**os.environ, **{k: re.sub(r"^~/venv-\w+", sys.prefix, v) for k, v in command.env}}
    return subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *args],
        cwd=workdir / command.cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def check_engine_command(command: DocCommand, root: Path) -> None:
    """Run an engine's documented command (:func:`run_in`) in its page's folder under
    ``root`` (shared by the page's commands, in order: a matrix, then a replay of what
    it saved) and check it exits as the docs say. The engine's suite calls this."""
    workdir = root / command.page.stem
    workdir.mkdir(exist_ok=True)
    result = run_in(command, workdir)
    assert result.returncode == command.exit_code, (result.stdout[-2000:], result.stderr[-2000:])


def drawn(lines: list[str] | tuple[str, ...]) -> list[str]:
    """The drawn lines of an output: the counterexamples and answers, not the timings."""
    return [line.rstrip() for line in lines if DRAWN.search(line)]


def is_subsequence(small: list[str], large: list[str]) -> bool:
    """Whether ``small`` appears in ``large`` in order (other lines between allowed)."""
    rest = iter(large)
    return all(line in rest for line in small)


@pytest.mark.parametrize("command", RUN, ids=str)
def test_command_runs_as_documented(command: DocCommand) -> None:
    result = run(command)
    assert result.returncode == command.exit_code, (result.stdout, result.stderr)
    shown = drawn(command.shown)
    assert is_subsequence(shown, drawn(result.stdout.splitlines())), result.stdout


def test_the_readme_gate_example_prints_its_counterexample() -> None:
    """The README's "gate your own function": the drawing it shows is what the gate
    prints, line for line, and the gate exits 1."""
    [command] = [c for c in RUN if "kvhit.examples.my_hit:find_hit" in c.args]
    assert command.page.name == "README.md" and command.exit_code == 1
    shown = drawn(command.shown)
    assert [line.split()[0] for line in shown] == [
        *("query:", "group", "group", "target", "reference"),
    ]
    printed = drawn(run(command).stdout.splitlines())
    assert printed == shown


LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
PATH_MENTION = re.compile(r"\bdocs/[\w/-]+\.md\b")


def heading_anchors(page: Path) -> set[str]:
    """The anchors GitHub gives a page's headings.

    >>> sorted(heading_anchors(ROOT / "docs" / "cli.md"))[:2]
    ['exit-codes', 'kvhit-check-file']
    """
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    anchors = set()
    for title in re.findall(r"^#+ (.+)$", text, re.MULTILINE):
        kept = re.sub(r"[^\w\- ]", "", title.strip().lower())
        anchors.add(kept.replace(" ", "-"))
    return anchors


def broken_links(page: Path) -> list[str]:
    """The links of a page (outside code blocks) to a repository file or heading that
    does not exist."""
    text = FENCE.sub("", page.read_text(encoding="utf-8"))
    broken = []
    for target in LINK.findall(text):
        if re.match(r"\w+:", target):
            continue  # https:, mailto:
        path, _, anchor = target.partition("#")
        file = (page.parent / path).resolve() if path else page
        if not file.exists():
            broken.append(target)
        elif anchor and file.suffix == ".md" and anchor not in heading_anchors(file):
            broken.append(target)
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_holds(page: Path) -> None:
    assert not broken_links(page)
    text = page.read_text(encoding="utf-8")
    assert not [m for m in PATH_MENTION.findall(text) if not (ROOT / m).exists()]
