"""Time to the first counterexample: the gate at its default settings against broken
engines, one after another in one run.

Run: ``python benchmarks/first_counterexample.py [--only NAME ...]`` from the
repository's root. Each row runs the command a user runs, ``kvhit gate --target X``
(``kvhit gate --stateful --target X`` for a stateful engine) as a fresh process, and
times it from the start until the first replay file appears in its ``--out`` folder
(the disagreement as first seen, saved before it is shrunk; a stateful campaign saves
its program once shrunk, so there shrinking is included), or until the process exits
when it saves none. The cases (or programs) checked come from the run's
``--json`` report: all jobs' cases when the run stopped, so a job may have checked a
few past the one that disagreed.

The engines are the tests' own broken ones: each lookup of ``tests/broken_targets.py``
(stateless), each bug of ``tests/broken_stateful.py`` and ``tests/broken_steps.py``
(stateful; the step-level ones driven through their loop), and
:func:`ignores_tiers` here (tiered): a lookup that declares tiers and answers the
fixed point of its own pool's rows, as if no tier held anything. The two lookups that
end the interpreter (a segfault, ``os._exit``) are gated with ``--isolate``: at the
defaults they end the gate itself, which then saves nothing (exit 2). The tiered
lookup gets tiers from its declaration alone (``kvhit.contract.declare(tiers=True)``),
with no ``--shape``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Any

import click
from rich.console import Console
from rich.table import Table

from kvhit.contract import declare
from kvhit.model.protocol import parse_query
from kvhit.model.spec import local_query, longest_hit

ROOT = Path(__file__).resolve().parent.parent
CLI = [sys.executable, "-m", "kvhit.cli"]
POLL = 0.01
"""Seconds between looks at the ``--out`` folder."""


@declare(tiers=True)
def ignores_tiers(query: dict[str, Any]) -> dict[str, Any]:
    """A lookup that takes tiers and reads its own pool only: L* (the fixed point) of
    the query without its tiers (lost reuse wherever a tier holds what the pool lacks)."""
    return longest_hit(local_query(parse_query(query))).to_json()


class Campaign(StrEnum):
    """The kind of campaign a broken engine is found by."""

    STATELESS = "stateless"
    TIERED = "tiered"
    STATEFUL = "stateful"


@dataclass(frozen=True)
class Engine:
    """A broken engine: its ``target`` (module:function) and the campaign that gates it."""

    target: str
    campaign: Campaign
    isolate: bool = False
    """Whether it ends the interpreter it runs in (``--isolate`` then keeps the gate)."""

    @property
    def name(self) -> str:
        """The function's name."""
        return self.target.rpartition(":")[2]

    @property
    def options(self) -> list[str]:
        """The gate's options beyond its defaults: ``--stateful``, ``--isolate``."""
        stateful = ["--stateful"] if self.campaign == Campaign.STATEFUL else []
        return stateful + (["--isolate"] if self.isolate else [])

    def command(self, out: str) -> list[str]:
        """The gate's command line, at its defaults, saving into ``out``."""
        return [*CLI, "gate", *self.options, "--target", self.target, "--out", out, "--json"]


STATELESS = (
    "always_top",
    "one_short",
    "whole_prefix_blocks",
    "crashes_on_mamba",
    "hangs_on_chunks",
    "returns_text",
    "window_counts_w_before",
    "no_short_prefix",
    "eagle_drops_every_pass",
    "mamba_state_after",
)
ENDS_PROCESS = ("segfaults_on_mamba", "exits_on_two_windows")
"""Lookups that end the interpreter: gated with ``--isolate``, as the gate's help says."""
STATEFUL = (  # fails_to_start and Interrupted are not bugs to find
    "forgetful_pool",
    "freed_after_prefill",
    "short_context_keys",
    "window_drop_keeps_hash",
    "first_full_truncated",
    "forgetful_and_falls_over",
)
STEPS = ("PublishesAtSchedule", "SameStepMamba", "EvictsReferencedMamba", "TruncationRecovery")
"""The step-level engines of ``tests/broken_steps.py`` (issue 42: each within a minute)."""
ENGINES = (
    *(Engine(f"tests.broken_targets:{name}", Campaign.STATELESS) for name in STATELESS),
    *(Engine(f"tests.broken_targets:{name}", Campaign.STATELESS, True) for name in ENDS_PROCESS),
    Engine(f"benchmarks.first_counterexample:{ignores_tiers.__name__}", Campaign.TIERED),
    *(Engine(f"tests.broken_stateful:{name}", Campaign.STATEFUL) for name in STATEFUL),
    *(Engine(f"tests.broken_steps:{name}", Campaign.STATEFUL) for name in STEPS),
)
GOALS = {Campaign.STATELESS: 5.0, Campaign.TIERED: 5.0, Campaign.STATEFUL: 20.0}
"""Seconds to the first counterexample the issue asks for, on a quiet machine."""


@dataclass(frozen=True)
class Found:
    """One run: seconds to the first saved file (or to the exit when none was saved),
    whether a file was saved, the process's exit code and its JSON report (None when it
    printed none)."""

    seconds: float
    saved: bool
    exit_code: int
    report: dict[str, Any] | None

    @property
    def cls(self) -> str:
        """The class of the first disagreement, or what happened instead."""
        found = (self.report or {}).get("disagreements") or []
        if found:
            return str(found[0]["class"])
        return f"none (exit {self.exit_code})"

    @property
    def phase(self) -> str:
        """The last phase that checked cases: the one it was found in."""
        phases = (self.report or {}).get("phases") or {}
        return next(reversed(phases), "-")

    @property
    def cases(self) -> str:
        """Cases (or programs) checked by all jobs when the run stopped."""
        return "-" if self.report is None else f"{self.report['cases']:,}"

    @property
    def load(self) -> str:
        """Seconds the run spent loading the target (its slowest job), as it reports."""
        seconds = (self.report or {}).get("load_seconds")
        return "-" if seconds is None else f"{seconds:.2f}"


def first_counterexample(engine: Engine) -> Found:
    """Run the gate against ``engine`` and time it to its first saved file."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "out")
        with open(Path(tmp, "report.json"), "w+") as report:
            start = time.perf_counter()
            process = subprocess.Popen(
                engine.command(str(out)),
                cwd=ROOT,
                stdout=report,
                stderr=subprocess.DEVNULL,
            )
            while process.poll() is None and not (out.is_dir() and any(out.iterdir())):
                time.sleep(POLL)
            seconds = time.perf_counter() - start
            saved = out.is_dir() and any(out.iterdir())
            exit_code = process.wait()
            report.seek(0)
            text = report.read()
    return Found(seconds, saved, exit_code, json.loads(text) if text.strip() else None)


def load_average() -> str:
    """The 1, 5 and 15 minute load averages."""
    return ", ".join(f"{load:.1f}" for load in os.getloadavg())


HEADER = """\
Seconds from starting `kvhit gate` (at its defaults) to its first replay file: starting
Python, kvhit's imports (torch among them), the jobs' start, loading the target, and
every phase before the disagreement (exhaustive scopes, solver corpus, random cases;
for --stateful, the programs), up to saving the disagreement as first seen; a stateful
campaign saves only the shrunk program, so its rows include shrinking (at most 30 s).
Left out: shrinking a stateless case, the report, and the process's exit. A row whose
process saved nothing is timed to its exit. Cases: all jobs' cases (programs) when the
run stopped."""


@click.command()
@click.option("--only", multiple=True, help="An engine's function name; repeatable.")
def main(only: tuple[str, ...]) -> None:
    """Run each engine's gate at its defaults and print the time to its first
    counterexample."""
    engines = [e for e in ENGINES if not only or e.name in only]
    before = load_average()
    title = f"first counterexample, {len(engines)} broken engines (load {before} at the start)"
    table = Table(title=title, caption=HEADER, caption_justify="left")
    columns = ("engine", "campaign", "seconds", "goal", "cases / programs", "phase", "class")
    for column in (*columns, "load (s)"):
        table.add_column(column, justify="left" if column in ("engine", "class") else "right")
    for engine in engines:
        found = first_counterexample(engine)
        goal = GOALS[engine.campaign]
        table.add_row(
            engine.name,
            " ".join([engine.campaign, *(o for o in engine.options if o != "--stateful")]),
            f"{found.seconds:.1f}",
            ("met" if found.saved and found.seconds <= goal else "over") + f" {goal:.0f}",
            found.cases,
            found.phase,
            found.cls,
            found.load,
        )
    console = Console(width=140)
    console.print(table)
    console.print(
        f"Load average (1, 5, 15 min): {before} at the start, {load_average()} at the end."
    )


if __name__ == "__main__":
    main()
