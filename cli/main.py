"""The ``kvhit`` command line.

Exit codes everywhere (docs/cli.md): 0 all good, 1 a disagreement or a failed proof,
2 bad usage or bad input, 130 interrupted (Ctrl-C). Commands that live with their
subsystem (``prove``, ``fuzz``, ``gate``, ``replay``, ``matrix``, ``export``:
:data:`LAZY_COMMANDS`) are imported only when run, so ``kvhit check`` does not load
z3 or torch.
"""

from __future__ import annotations

import json
import sys

import click

from kvhit.analysis import Analysis
from kvhit.cli.check import check_report, check_text, explain_text
from kvhit.errors import BadInput
from kvhit.harness.saved import read_queries
from kvhit.importing import import_attr

LAZY_COMMANDS = {
    "prove": "kvhit.cli.prove:prove",
    "fuzz": "kvhit.cli.campaign:fuzz",
    "gate": "kvhit.cli.campaign:gate",
    "replay": "kvhit.cli.campaign:replay",
    "matrix": "kvhit.cli.matrix:matrix",
    "export": "kvhit.cli.export_command:export",
}


class InputProblem(click.ClickException):
    """A :class:`~kvhit.errors.BadInput` as the command line shows it: one line,
    ``error: ...``, on stderr, and exit code 2."""

    exit_code = 2

    def show(self, file: object = None) -> None:
        """Print ``error: ...`` on stderr."""
        click.echo(f"error: {self.format_message()}", err=True)


class KvhitGroup(click.Group):
    """A group that imports a subsystem's command only when it is run."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted([*super().list_commands(ctx), *LAZY_COMMANDS])

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name in LAZY_COMMANDS:
            return import_attr(LAZY_COMMANDS[name])
        return super().get_command(ctx, name)

    def invoke(self, ctx: click.Context) -> object:
        """Run the command: bad input ends with one line and exit code 2; Ctrl-C that
        the command does not report itself (one that comes before a run has begun)
        ends with one line and exit code 130."""
        try:
            return super().invoke(ctx)
        except BadInput as err:
            raise InputProblem(str(err)) from None
        except KeyboardInterrupt:
            click.echo("interrupted", err=True)
            ctx.exit(130)


@click.group(cls=KvhitGroup)
@click.version_option(package_name="kvhit")
def main() -> None:
    """kvhit: the verified reference for hybrid-attention prefix-cache hits."""


@main.command()
@click.argument("file", type=click.Path(allow_dash=True, dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="One JSON object per query.")
@click.option("--explain", "explain_at", type=click.IntRange(min=0), help="Say why L is (in)valid.")
def check(file: str, as_json: bool, explain_at: int | None) -> None:
    """Draw each query in FILE (one JSON object or JSON lines; - for stdin) and its answer.

    Shows each group's blocks (# cached, . not, @ reused at L*), each group's own
    finder result, L*, and what min-of-groups would answer.
    """
    queries = read_queries(file)
    for number, (label, q) in enumerate(queries):
        analysis = Analysis(q)
        report = check_report(analysis)
        if explain_at is not None:
            report["explain"] = explain_text(analysis, explain_at, label)
        if as_json:
            click.echo(json.dumps(report))
            continue
        if number:
            click.echo()
        if len(queries) > 1:
            click.echo(f"# {label}")
        click.echo(check_text(analysis, report))
        if explain_at is not None:
            click.echo(report["explain"])


VERIFY_SECTIONS = [
    ("seed facts", "kvhit.cli.verify:examples_section"),
    ("tier facts", "kvhit.cli.verify:tiers_section"),
    ("proofs", "kvhit.cli.prove:verify_section"),
    ("gate", "kvhit.cli.campaign:verify_section"),
]


@main.command()
@click.option("--quick", is_flag=True, help="Smaller proof bounds and fuzz budgets.")
def verify(quick: bool) -> None:
    """The main job: the seed and tier facts, the proof suite, the gate on impl, seed-min caught."""
    from kvhit.cli.verify import run_sections

    sys.exit(0 if run_sections(VERIFY_SECTIONS, quick) else 1)


if __name__ == "__main__":
    main()
