"""``kvhit matrix``: the gate against several vLLM releases, one process each, in one table.

Each release lives in its own folder (``scripts/install-vllm.sh VENV 0.20.0 0.34.0``
puts them in ``VENV/vllm/RELEASE``); the gate runs once per release with that folder
first on ``PYTHONPATH``, on the same cases (same seed and case count), and saves the
first shrunk counterexample of each class under ``--out/RELEASE``. Releases run side
by side, ``--parallel`` at once (default: one per core); the table keeps the order of
``--vllm``.

Exit codes (:func:`exit_code`), the first that applies:

- 130: Ctrl-C. The running gates are stopped at once, ``interrupted`` is printed, and
  the table holds the releases that finished (what their gates saved stays saved).
- 1: a release has a disagreement outside its documented classes (``--fail-on new``,
  the default): a class none of the release's documented divergences
  (:mod:`kvhit.engines.vllm.divergences`) gives, say a crash, or an unsafe answer in a
  release whose documented divergences are never unsafe. Against
  ``vllm-undocumented`` the documented states are answered ``unsupported``, so there
  every disagreement is outside; against ``vllm-connector`` the connector path's
  classes (``CONNECTOR_CLASSES``) are documented too. With ``--fail-on any``: any
  disagreement at all.
- 2: bad usage, a release folder missing, or a release the target cannot drive.
- 0: otherwise (every release gated, nothing outside its documented classes).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import IO, Any

import click

from kvhit.analysis import DISAGREEMENTS, Verdict
from kvhit.cli.options import option_option, parse_options, timeout_option
from kvhit.engines.vllm.divergences import CONNECTOR_CLASSES, in_release
from kvhit.errors import BadInput, TargetError
from kvhit.targets.target_spec import TargetSpec

COLUMNS = (Verdict.OK, *(v for v in DISAGREEMENTS if v != Verdict.STUCK), Verdict.UNSUPPORTED)
"""A matrix's columns: a lookup is never stuck (a step-level engine's class)."""
DEFAULT_CASES = 20_000
MATRIX_OUT = "kvhit-matrix"
NO_TIME_BOUND = 86_400  # the random phase ends at --cases, not on a clock
POLL_SECONDS = 0.05
"""How often the parent looks for a finished gate (and so how soon Ctrl-C is heard)."""
UNDOCUMENTED = "vllm-undocumented"
"""The target that answers every documented state ``unsupported``."""
CONNECTOR_TARGET = "vllm-connector"
"""The target that drives vLLM's KV connector path (its classes: ``CONNECTOR_CLASSES``)."""
TARGETS = ("vllm", UNDOCUMENTED, CONNECTOR_TARGET)
"""The built-ins that drive vLLM, which the matrix gates."""


class FailOn(StrEnum):
    """Which disagreements make the matrix exit 1 (``--fail-on``): ``new``, those of a
    class outside the release's documented divergences; ``any``, every one."""

    NEW = "new"
    ANY = "any"


@dataclass(frozen=True)
class Settings:
    """What every release's gate run shares, so all of them draw the same cases."""

    cases: int = DEFAULT_CASES
    seed: int = 0
    timeout: float = 10.0
    jobs: int = 1
    target: str = "vllm"
    options: tuple[tuple[str, str], ...] = ()
    fail_on: FailOn = FailOn.NEW

    @property
    def spec(self) -> TargetSpec:
        """The target every release's gate runs."""
        return TargetSpec(self.target, options=self.options)

    @property
    def label(self) -> str:
        """The target as reports name it (``vllm[eagle=drop]`` on the drop path)."""
        return self.spec.label


@dataclass
class Row:
    """One release's gate run: counts by class, files saved, or why it could not run."""

    release: str
    counts: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

    def disagreements(self) -> set[Verdict]:
        """The disagreement classes this release's gate met."""
        return {c for c in DISAGREEMENTS if self.counts.get(c, 0)}

    def to_json(self) -> dict[str, Any]:
        """The row as JSON-ready data."""
        return {
            "release": self.release,
            "counts": {c: self.counts.get(c, 0) for c in COLUMNS},
            "files": self.files,
            "seconds": self.seconds,
            "error": self.error,
        }


def parse_releases(text: str) -> list[str]:
    """``0.14.0,0.34.0`` as a list; BadInput if empty or not release numbers.

    >>> parse_releases("0.14.0, 0.34.0")
    ['0.14.0', '0.34.0']
    """
    releases = [r.strip() for r in text.split(",") if r.strip()]
    bad = [r for r in releases if not all(part.isdigit() for part in r.split("."))]
    if not releases or bad:
        raise BadInput(f"--vllm: {bad[0] if bad else '(none)'!r} is not a release like 0.34.0")
    return releases


def release_folder(root: Path, release: str) -> Path:
    """The folder holding ``release``; BadInput saying how to install it if absent."""
    folder = root / release
    if not (folder / "vllm").is_dir():
        raise BadInput(
            f"vLLM {release} is not installed in {folder}; install it with "
            f"scripts/install-vllm.sh {root.parent} {release}"
        )
    return folder


# The child checks that the vLLM on its path is the release asked for, then gates it.
CHILD = """
import sys
import vllm
from kvhit.cli.main import main
wanted = sys.argv.pop(1)
if vllm.__version__.split("+")[0] != wanted:
    print(f"error: {vllm.__file__} is vLLM {vllm.__version__}, not {wanted}", file=sys.stderr)
    sys.exit(2)
main()
"""


def gate_command(release: str, out: Path, settings: Settings) -> list[str]:
    """The ``kvhit gate`` run for one release, in this interpreter."""
    options = {
        "--target": settings.target,
        "--seconds": str(NO_TIME_BOUND),
        "--cases": str(settings.cases),
        "--seed": str(settings.seed),
        "--timeout": str(settings.timeout),
        "--jobs": str(settings.jobs),
        "--out": str(out),
    }
    flat = [word for pair in options.items() for word in pair]
    flat += [word for key, value in settings.options for word in ("--option", f"{key}={value}")]
    return [sys.executable, "-c", CHILD, release, "gate", "--keep-going", "--json", *flat]


def report_in(out: str) -> dict[str, Any] | None:
    """The gate's JSON report: its output's last line, if that is one.

    >>> report_in('{"counts": {}}'), report_in("")
    ({'counts': {}}, None)
    """
    lines = out.splitlines()
    try:
        report = json.loads(lines[-1]) if lines else None
    except json.JSONDecodeError:
        return None
    return report if isinstance(report, dict) and "counts" in report else None


@dataclass
class Gating:
    """One release's gate, running in its own process group (so Ctrl-C reaches only
    the matrix, which stops it); its output goes to files, read once it ends."""

    release: str
    process: subprocess.Popen[str]
    stdout: IO[str]
    stderr: IO[str]

    @staticmethod
    def start(folder: Path, release: str, out: Path, settings: Settings) -> Gating:
        """Start gating ``release`` (its folder first on the path)."""
        path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
        stdout, stderr = tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")
        process = subprocess.Popen(
            gate_command(release, out / release, settings),
            env={**os.environ, "PYTHONPATH": path},
            stdout=stdout,
            stderr=stderr,
            text=True,
            process_group=0,
        )
        return Gating(release, process, stdout, stderr)

    def done(self) -> bool:
        """Whether the gate has ended."""
        return self.process.poll() is not None

    def read(self, stream: IO[str]) -> str:
        """All the gate wrote to ``stream``; the file is closed."""
        stream.seek(0)
        with stream:
            return stream.read()

    def row(self) -> Row:
        """The ended gate's row, from the JSON report it printed last; a gate that
        failed or printed none keeps the last line it wrote to stderr."""
        code, out, err = self.process.wait(), self.read(self.stdout), self.read(self.stderr)
        report = report_in(out) if code in (0, 1) else None
        if report is None:
            lines = [line for line in err.splitlines() if line.strip()]
            return Row(self.release, error=lines[-1] if lines else f"exit code {code}")
        return Row(self.release, dict(report["counts"]), report["files"], report["seconds"])

    def stop(self) -> None:
        """Kill the gate and every process it started."""
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()
        self.stdout.close()
        self.stderr.close()


def run_releases(
    folders: list[tuple[str, Path]],
    out: Path,
    settings: Settings,
    parallel: int,
    on_row: Callable[[Row], None],
) -> tuple[list[Row], bool]:
    """Gate the releases, ``parallel`` at once, calling ``on_row`` as each ends: the
    rows of those that ended, in the order given, and whether Ctrl-C stopped the run
    (every running gate is then killed at once)."""
    waiting, running, rows = list(folders), list[Gating](), dict[str, Row]()
    interrupted = False
    try:
        while waiting or running:
            while waiting and len(running) < parallel:
                release, folder = waiting.pop(0)
                running.append(Gating.start(folder, release, out, settings))
            for gating in [g for g in running if g.done()]:
                running.remove(gating)
                rows[gating.release] = gating.row()
                on_row(rows[gating.release])
            time.sleep(POLL_SECONDS)
    except KeyboardInterrupt:
        interrupted = True
    finally:  # Ctrl-C, or any error of the parent: no gate outlives the matrix
        for gating in running:
            gating.stop()
    return [rows[release] for release, _ in folders if release in rows], interrupted


def documented_classes(release: str, target: str) -> set[Verdict]:
    """The classes the documented divergences of ``release`` give against ``target``
    (none against ``vllm-undocumented``, which answers their states ``unsupported``).

    Against ``vllm-connector`` the connector path's own classes count too.

    >>> sorted(map(str, documented_classes("0.14.0", "vllm"))), documented_classes("0.14.0", UNDOCUMENTED)
    (['lost_reuse', 'unsafe', 'wrong_blocks'], set())
    >>> sorted(map(str, documented_classes("0.24.0", CONNECTOR_TARGET) - documented_classes("0.24.0", "vllm")))
    ['crash']
    """
    if target == UNDOCUMENTED:
        return set()
    found = {d.verdict for d in in_release(release)}
    if target == CONNECTOR_TARGET:
        found |= {v for c in CONNECTOR_CLASSES if c.in_release(release) for v in c.verdicts}
    return found


def failing(rows: list[Row], settings: Settings) -> list[str]:
    """The releases whose disagreements make the matrix fail under ``--fail-on``.

    >>> rows = [Row("0.14.0", {"unsafe": 2}), Row("0.34.0", {"timeout": 1})]
    >>> failing(rows, Settings()), failing(rows, Settings(fail_on=FailOn.ANY))
    (['0.34.0'], ['0.14.0', '0.34.0'])
    """
    return [row.release for row in rows if fails(row, settings)]


def fails(row: Row, settings: Settings) -> bool:
    """Whether ``row`` has a disagreement that ``--fail-on`` counts."""
    if settings.fail_on == FailOn.ANY:
        return bool(row.disagreements())
    return bool(row.disagreements() - documented_classes(row.release, settings.target))


def exit_code(rows: list[Row], settings: Settings, interrupted: bool) -> int:
    """130 after Ctrl-C; else 1 if a release fails under ``--fail-on`` (a disagreement
    is not hidden behind a release that could not be gated); else 2 if a release
    could not be gated; else 0."""
    if interrupted:
        return 130
    if failing(rows, settings):
        return 1
    return 2 if any(r.error for r in rows) else 0


def table(rows: list[Row]) -> str:
    """The release × class table, counts right-aligned under their class.

    >>> print(table([Row("0.33.0", {"ok": 12345, "unsafe": 1}), Row("0.34.0", error="no")]))
    release     ok  unsafe  lost_reuse  wrong_blocks  crash  timeout  bad_return  unsupported
    0.33.0   12345       1           0             0      0        0           0            0
    0.34.0   cannot be gated: no
    """
    cells = {r.release: [str(r.counts.get(c, 0)) for c in COLUMNS] for r in rows}
    widths = [
        max([len(c), *(len(cells[r.release][i]) for r in rows)]) for i, c in enumerate(COLUMNS)
    ]
    first = max([len("release"), *(len(r.release) for r in rows)])
    lines = ["  ".join(["release".ljust(first), *(c.rjust(w) for c, w in zip(COLUMNS, widths))])]
    for row in rows:
        if row.error:
            lines.append(f"{row.release.ljust(first)}  cannot be gated: {row.error}")
        else:
            counts = (c.rjust(w) for c, w in zip(cells[row.release], widths))
            lines.append("  ".join([row.release.ljust(first), *counts]))
    return "\n".join(lines)


def spans(rows: list[Row]) -> dict[str, list[str]]:
    """For each disagreement class, the releases (in the order given) that have it.

    >>> spans([Row("0.14.0", {"unsafe": 2}), Row("0.34.0", {"unsafe": 1, "crash": 3})])
    {'unsafe': ['0.14.0', '0.34.0'], 'crash': ['0.34.0']}
    """
    found = {str(c): [r.release for r in rows if r.counts.get(c, 0)] for c in DISAGREEMENTS}
    return {c: releases for c, releases in found.items() if releases}


def spans_text(rows: list[Row]) -> str:
    """One line per class: the first and last release that have it, and how many do."""
    gated = [r for r in rows if not r.error]
    lines = []
    for cls, releases in spans(gated).items():
        where = releases[0] if len(releases) == 1 else f"{releases[0]} … {releases[-1]}"
        lines.append(f"{cls}: {where} ({len(releases)} of {len(gated)} releases)")
    return "\n".join(lines) or "no disagreement in any release"


@click.command()
@click.option("--vllm", "releases", required=True, help="Comma-separated releases, oldest first.")
@click.option(
    "--releases-dir",
    type=click.Path(file_okay=False),
    help="Where the release folders are (default: the vllm/ folder of this environment, "
    "where scripts/install-vllm.sh puts them).",
)
@click.option(
    "--cases",
    type=click.IntRange(min=1),
    default=DEFAULT_CASES,
    show_default=True,
    help="Random cases per release, after the exhaustive scopes and the solver corpus.",
)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same cases.")
@timeout_option()
@click.option(
    "--jobs",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes per release (the cases depend on it: compare runs with equal --jobs).",
)
@click.option(
    "--out", default=MATRIX_OUT, show_default=True, help="Counterexamples go to OUT/RELEASE."
)
@click.option(
    "--target",
    type=click.Choice(TARGETS),
    default="vllm",
    show_default=True,
    help="vllm-undocumented answers the states of the documented divergences of each "
    "release as unsupported, so what is left is new.",
)
@option_option()
@click.option(
    "--parallel",
    type=click.IntRange(min=1),
    default=os.cpu_count() or 1,
    show_default="one per core",
    help="Releases gated at once (the cases do not depend on it).",
)
@click.option(
    "--fail-on",
    type=click.Choice([str(f) for f in FailOn]),
    default=str(FailOn.NEW),
    show_default=True,
    help="Exit 1 on a disagreement of a class outside the release's documented "
    "divergences (new), or on any disagreement (any).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the matrix as JSON.")
def matrix(
    releases: str,
    releases_dir: str | None,
    cases: int,
    seed: int,
    timeout: float,
    jobs: int,
    out: str,
    target: str,
    options: tuple[str, ...],
    parallel: int,
    fail_on: str,
    as_json: bool,
) -> None:
    """Gate each vLLM release in --vllm in its own process, on the same cases, and print
    one table: release × class. The first shrunk counterexample of each class is saved
    under --out/RELEASE, replayable under that release.

    Exit codes: 130 on Ctrl-C (the table holds the releases that finished); 1 if a
    release has a disagreement of a class outside its documented divergences (with
    --fail-on any: any disagreement); 2 on bad usage or a release that could not be
    gated; else 0."""
    root = Path(releases_dir) if releases_dir else Path(sys.prefix) / "vllm"
    folders = [(r, release_folder(root, r)) for r in parse_releases(releases)]
    try:
        settings = Settings(
            cases, seed, timeout, jobs, target, parse_options(options), FailOn(fail_on)
        )
        click.echo(f"{settings.spec.label}: ", nl=False, err=True)  # options checked here
    except TargetError as err:
        raise BadInput(str(err)) from None
    at_once = min(parallel, len(folders))
    click.echo(f"{len(folders)} releases, {at_once} at once", err=True)
    ended = iter(range(1, len(folders) + 1))

    def show(row: Row) -> None:
        done = row.error or f"{sum(row.counts.values())} cases in {row.seconds:.1f} s"
        click.echo(f"[{next(ended)}/{len(folders)}] vLLM {row.release}: {done}", err=True)

    rows, interrupted = run_releases(folders, Path(out), settings, at_once, show)
    if interrupted:
        click.echo("interrupted", err=True)
    report(rows, settings, root, out, interrupted, as_json)
    sys.exit(exit_code(rows, settings, interrupted))


def report(
    rows: list[Row], settings: Settings, root: Path, out: str, interrupted: bool, as_json: bool
) -> None:
    """Print the matrix: JSON, or the table, the spans and what made it fail."""
    if as_json:
        click.echo(
            json.dumps(
                {
                    "target": settings.label,
                    "rows": [r.to_json() for r in rows],
                    "spans": spans(rows),
                    "failing": failing(rows, settings),
                    "interrupted": interrupted,
                }
            )
        )
        return
    click.echo(table(rows))
    click.echo(f"target: {settings.label}")
    click.echo(spans_text(rows))
    failed = failing(rows, settings)
    if failed:
        click.echo(f"fails (--fail-on {settings.fail_on}): {', '.join(failed)}")
    if any(r.files for r in rows):
        click.echo(
            f"counterexamples in {out}/RELEASE; replay one with: "
            f"PYTHONPATH={root}/RELEASE kvhit replay FILE {settings.spec.replay_flag}"
        )
