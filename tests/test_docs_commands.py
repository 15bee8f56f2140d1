"""Every ``kvhit`` command in the README and docs/ parses with the real command line,
the short ones run and exit as the docs say, and every link to a repository file holds.

A fenced block preceded by ``<!-- docs-test: exit N -->`` is run: each of its ``kvhit``
commands must exit with N, and the drawn lines its output shows (``query:``, ``group``,
``... answered ...``, ``reference answer``) must be printed, in that order. The other
blocks are parsed only (they need vLLM or SGLang, or take minutes).
"""

from __future__ import annotations

import doctest
import functools
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
    r"(?:^<!-- docs-test: exit (?P<exit>\d+) -->\n)?^```(?P<lang>\w*)\n(?P<body>.*?)^```$",
    re.MULTILINE | re.DOTALL,
)
SHELL_LANGS = {"", "bash", "sh", "console"}
DRAWN = re.compile(r"^(query:|group \d|engine:|L\* =|reference answer|answers:)|\banswered\b")
WRITES_REPLAY_FILES = {"gate", "fuzz"}


@dataclass(frozen=True)
class DocCommand:
    """One ``kvhit`` command of a fenced block: where it is, how the docs run it, and
    what they say it prints and returns (``exit_code`` None: parsed only)."""

    page: Path
    line: int
    cwd: Path
    args: tuple[str, ...]
    exit_code: int | None
    shown: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}: kvhit {' '.join(self.args)}"


def kvhit_segments(line: str) -> list[tuple[Path, list[str]]]:
    """The ``kvhit`` commands of one shell line, each with the folder it runs in.

    >>> kvhit_segments("cd tests && kvhit gate --target x  # a comment")
    [(PosixPath('tests'), ['gate', '--target', 'x'])]
    >>> kvhit_segments("PYTHONPATH=a ~/venv/bin/kvhit check q.json | head")
    [(PosixPath('.'), ['check', 'q.json'])]
    """
    cwd, words, found = Path("."), [], []
    for token in [*shlex.split(line, comments=True), "&&"]:
        if token not in ("&&", ";", "|"):
            words.append(token)
            continue
        while words and re.fullmatch(r"\w+=\S*", words[0]):
            words.pop(0)
        if words[:1] == ["cd"]:
            cwd = cwd / words[1]
        elif words and Path(words[0]).name == "kvhit":
            found.append((cwd, words[1:]))
        words = []
    return found


def block_commands(page: Path, text: str, match: re.Match[str]) -> list[DocCommand]:
    """The ``kvhit`` commands of one fenced block, with the output lines shown after each
    (in a block of ``$ `` prompts)."""
    lines = match["body"].splitlines()
    prompted = any(line.startswith("$ ") for line in lines)
    first_line = text.count("\n", 0, match.start("body")) + 1
    exit_code = int(match["exit"]) if match["exit"] else None
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
        for cwd, args in kvhit_segments(line.removeprefix("$ ")):
            commands.append(
                DocCommand(page, first_line + number, cwd, tuple(args), exit_code, tuple(shown))
            )
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
RUN = [c for c in COMMANDS if c.exit_code is not None]


def test_this_files_examples() -> None:
    result = doctest.testmod(sys.modules[__name__])
    assert result.attempted >= 3 and result.failed == 0


def test_the_docs_have_commands() -> None:
    assert len(COMMANDS) > 20
    assert {c.args[0] for c in RUN} >= {"check", "prove", "gate", "fuzz", "replay"}


@pytest.mark.parametrize("command", COMMANDS, ids=str)
def test_command_parses(command: DocCommand, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command and its options exist and take these values. A path that a parse-only
    command expects an earlier step (an install, a run) to have made may be missing."""
    monkeypatch.chdir(ROOT / command.cwd)
    name, *rest = command.args
    parent = click.Context(main, info_name="kvhit")
    subcommand = main.get_command(parent, name)
    assert subcommand is not None, f"{command}: no command {name!r}"
    try:
        subcommand.make_context(name, list(rest), parent=parent)
    except click.BadParameter as err:
        missing_path = isinstance(err.param and err.param.type, click.Path)
        if command.exit_code is not None or not missing_path:
            raise


@functools.cache
def run(command: DocCommand) -> subprocess.CompletedProcess[str]:
    """Run a documented command as the docs do, its replay files in a temporary folder."""
    args = list(command.args)
    if args[0] in WRITES_REPLAY_FILES and "--out" not in args:
        args += ["--out", tempfile.mkdtemp(prefix="kvhit-docs-")]
    return subprocess.run(
        [sys.executable, "-m", "kvhit.cli", *args],
        cwd=ROOT / command.cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


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
