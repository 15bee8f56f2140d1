"""``kvhit matrix``: the gate against several vLLM releases, one process each, in one table.

Each release lives in its own folder (``scripts/install-vllm.sh VENV 0.20.0 0.34.0``
puts them in ``VENV/vllm/RELEASE``); the gate runs once per release with that folder
first on ``PYTHONPATH``, on the same cases (same seed and case count), and saves the
first shrunk counterexample of each class under ``--out/RELEASE``.

Exit codes: 0 every release gated, with or without disagreements (the table is the
result); 2 bad usage, a release folder missing, or a release the target cannot drive.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click

from kvhit.cli.options import timeout_option, vllm_eagle_option
from kvhit.engines.vllm.release import VLLM_TARGETS, EaglePath, target_label
from kvhit.errors import BadInput
from kvhit.harness.compare import CLASSES

COLUMNS = ("ok", *CLASSES, "unsupported")
DEFAULT_CASES = 20_000
MATRIX_OUT = "kvhit-matrix"
NO_TIME_BOUND = 86_400  # the random phase ends at --cases, not on a clock


@dataclass(frozen=True)
class Settings:
    """What every release's gate run shares, so all of them draw the same cases."""

    cases: int = DEFAULT_CASES
    seed: int = 0
    timeout: float = 10.0
    jobs: int = 1
    target: str = "vllm"
    eagle: EaglePath = EaglePath.DEFAULT

    @property
    def label(self) -> str:
        """The target as reports name it (``vllm[eagle=drop]`` on the drop path)."""
        return target_label(self.target, self.eagle)


@dataclass
class Row:
    """One release's gate run: counts by class, files saved, or why it could not run."""

    release: str
    counts: dict[str, int] = field(default_factory=dict)
    files: list[str] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None

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
        "--vllm-eagle": str(settings.eagle),
    }
    flat = [word for pair in options.items() for word in pair]
    return [sys.executable, "-c", CHILD, release, "gate", "--keep-going", "--json", *flat]


def run_release(folder: Path, release: str, out: Path, settings: Settings) -> Row:
    """Gate one release in its own process (its folder first on the path) and read
    its JSON report; a run that fails keeps the last line it wrote to stderr."""
    path = os.pathsep.join(filter(None, [str(folder), os.environ.get("PYTHONPATH")]))
    command = gate_command(release, out / release, settings)
    done = subprocess.run(
        command, env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True
    )
    if done.returncode not in (0, 1):
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return Row(release, error=lines[-1] if lines else f"exit code {done.returncode}")
    report = json.loads(done.stdout.splitlines()[-1])
    return Row(release, dict(report["counts"]), report["files"], report["seconds"])


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
    found = {str(c): [r.release for r in rows if r.counts.get(c, 0)] for c in CLASSES}
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
    type=click.Choice(VLLM_TARGETS),
    default="vllm",
    show_default=True,
    help="vllm-undocumented answers the states of the documented divergences of each "
    "release as unsupported, so what is left is new.",
)
@vllm_eagle_option()
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
    vllm_eagle: str,
    as_json: bool,
) -> None:
    """Gate each vLLM release in --vllm in its own process, on the same cases, and print
    one table: release × class. The first shrunk counterexample of each class is saved
    under --out/RELEASE, replayable under that release."""
    root = Path(releases_dir) if releases_dir else Path(sys.prefix) / "vllm"
    folders = [(r, release_folder(root, r)) for r in parse_releases(releases)]
    settings = Settings(cases, seed, timeout, jobs, target, EaglePath(vllm_eagle))
    rows = []
    for number, (release, folder) in enumerate(folders, 1):
        click.echo(
            f"[{number}/{len(folders)}] {settings.label} on vLLM {release} ...", err=True, nl=False
        )
        row = run_release(folder, release, Path(out), settings)
        click.echo(f" {row.error or f'{sum(row.counts.values())} cases'}", err=True)
        rows.append(row)
    if as_json:
        rows_json = [r.to_json() for r in rows]
        click.echo(json.dumps({"target": settings.label, "rows": rows_json, "spans": spans(rows)}))
    else:
        click.echo(table(rows))
        click.echo(f"target: {settings.label}")
        click.echo(spans_text(rows))
        saved = [r for r in rows if r.files]
        if saved:
            click.echo(
                f"counterexamples in {out}/RELEASE; replay one with: "
                f"PYTHONPATH={root}/RELEASE kvhit replay FILE --target {target} "
                f"--vllm-eagle {settings.eagle}"
            )
    if any(r.error for r in rows):
        sys.exit(2)
