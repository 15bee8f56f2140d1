"""Where a campaign's time goes: one job of ``kvhit fuzz``, sampled, by whose code runs.

Run: ``python benchmarks/campaign_profile.py [--target vllm] [--cases N] [--campaign
fuzz|gate]`` (the vLLM target in the vLLM environment). The campaign is ``kvhit
fuzz``'s N random queries, or with ``gate`` the gate's cases as ``kvhit matrix`` runs
them on each release (the exhaustive scopes, the solver corpus, then N random: there
the same shapes of query come back, and the vLLM target keeps their coordinators), or
with ``stateful`` N programs of requests on the target's stateful engine.
The campaign runs in this process, as one job does,
while a second thread looks at the job's stack every millisecond and counts the
sample for the innermost frame that belongs to one of these parts:

- *the target*: the engine under test. For vLLM, split into its
  ``find_longest_cache_hit`` (the lookup under test) and everything else of vLLM the
  adapter calls to build the query's state (configs, coordinator, block pool, cached
  blocks); for SGLang the same, its lookup being ``match_prefix``; for the impl, its
  block hashing apart from the rest;
- *adapter*: kvhit's own code that turns a query into the engine's state;
- *protocol*: reading the query from its JSON form, as every target is handed it;
- *reference*: the model (L*, validity, the finders) that judges each answer, and
  builds the queries of the exhaustive scopes;
- *harness*: drawing queries, calling the target (``kvhit.targets``: the time limit,
  the captured output), judging, counting, shrinking;
- *torch*.

Frames of none of these (Python's library, builtins, pydantic) count for the part
that called them, as they run on its behalf. Sampling does not slow small functions
more than large ones, as a tracing profiler does; the shares are of samples, and the
unsampled time of the same cases is printed above the table.

Below the table: how many replies were ``unsupported`` (with the commonest reasons),
as a share in the engine's code counts only for cases it can be asked; the lookup's
share of the engine's own samples (the share's ceiling); and with ``--functions N``
the N functions with the most samples, each with its part (where to cut).

Left out: starting Python and importing the target (see ``jobs_speedup.py``'s
start-up column).
"""

from __future__ import annotations

import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from functools import partial
from pathlib import Path
from types import FrameType, ModuleType

import click
from rich.console import Console
from rich.table import Table

import kvhit
import kvhit.engines
import kvhit.harness
import kvhit.impl
import kvhit.model
import kvhit.targets
from kvhit.harness.gate import gate_phases, random_phases
from kvhit.harness.jobs import CaseCampaign, run_job
from kvhit.harness.random_cases import CHOICES, QueryShape
from kvhit.harness.stateful_machine import ProgramPlan, run_programs
from kvhit.harness.tally import Tally
from kvhit.targets.registry import Mode, default_shape
from kvhit.targets.target_spec import TargetSpec


def folder(module: ModuleType) -> str:
    """The folder a package's files are in (kvhit's folders map to ``kvhit.*``)."""
    return str(Path(module.__file__ or "").parent) + os.sep


VLLM = os.sep + "vllm" + os.sep
PARTS = (  # the first marker in a file's path names its part (kvhit's engines/vllm/ before vLLM)
    (folder(kvhit.engines), "adapter"),
    (VLLM, "vLLM"),
    (os.sep + "sglang" + os.sep, "SGLang"),
    (folder(kvhit.impl) + "hashing.py", "the target (impl): block hashing"),
    (folder(kvhit.impl), "the target (impl): the rest"),
    (folder(kvhit.model) + "protocol.py", "protocol: the query read from JSON"),
    (folder(kvhit.model), "reference"),
    (folder(kvhit) + "analysis.py", "reference"),
    (folder(kvhit.harness), "harness"),
    (folder(kvhit.targets), "harness"),
    (folder(kvhit), "harness"),
    (os.sep + "torch" + os.sep, "torch"),
)
LOOKUPS = {"vLLM": "find_longest_cache_hit", "SGLang": "match_prefix"}
"""Each engine's lookup under test, counted apart from building the query's state."""
INTERVAL = 0.001
"""Seconds between samples."""


Where = tuple[str, str]
"""A sample's part and the function it counts for there (its innermost frame in a
part, as ``qualname (file)``)."""


def part_of(frame: FrameType | None) -> Where:
    """The part a sampled stack counts for: that of its innermost frame in a part (an
    engine's split by whether its lookup is on the stack), and that frame's function."""
    part, function = None, "-"
    while frame is not None:
        code = frame.f_code
        if part is None:
            part = next((name for marker, name in PARTS if marker in code.co_filename), None)
            if part is not None:
                function = f"{code.co_qualname} ({Path(code.co_filename).name})"
        if part in LOOKUPS and code.co_name == LOOKUPS[part]:
            return f"the target ({part}): {LOOKUPS[part]}", function
        frame = frame.f_back
    if part in LOOKUPS:
        return f"the target ({part}): building the query's state", function
    return part or "the rest", function


class Sampler(threading.Thread):
    """Counts, every ``INTERVAL`` seconds, where the watched thread is (:func:`part_of`)."""

    def __init__(self, watched: int):
        super().__init__(daemon=True)
        self.watched = watched
        self.counts: Counter[Where] = Counter()
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.wait(INTERVAL):
            self.counts[part_of(sys._current_frames().get(self.watched))] += 1

    def parts(self) -> Counter[str]:
        """The samples of each part."""
        out: Counter[str] = Counter()
        for (part, _), samples in self.counts.items():
            out[part] += samples
        return out


CAMPAIGNS = {
    "fuzz": lambda cases, shape: partial(random_phases, 0, 8, CHOICES, None, cases, shape),
    "gate": lambda cases, shape: partial(gate_phases, 86_400.0, 0, 8, CHOICES, cases, shape),
}
"""Each campaign's phases for ``cases`` random cases of a shape (the target's own:
SGLang's states for ``sglang``)."""


def campaign_run(target: str, cases: int, name: str) -> Callable[[], Tally]:
    """One run of campaign ``name`` against ``target`` in this thread, as one job runs
    it; the run returns its tally."""
    spec = TargetSpec(target, timeout=60.0)
    shape = QueryShape(default_shape(target))
    if name == "stateful":
        plan = ProgramPlan(shape=shape, stop_at_first=False)

        def programs() -> Tally:
            runner = spec.open(Mode.STATEFUL)
            try:
                return run_programs(runner, spec.record, plan, programs=cases)
            finally:
                runner.close()

        return programs
    campaign = CaseCampaign(spec, CAMPAIGNS[name](cases, shape))
    return lambda: run_job(campaign, 0, 1, lambda _: None)


def profile(target: str, cases: int, name: str = "fuzz") -> tuple[float, Tally, Sampler]:
    """Seconds of one run of campaign ``name`` with ``cases`` random cases (or
    programs), unsampled, its tally, and the samples of a second run of them."""
    run = campaign_run(target, cases, name)
    start = time.perf_counter()
    tally = run()
    seconds = time.perf_counter() - start
    sampler = Sampler(threading.get_ident())
    switch = sys.getswitchinterval()
    sys.setswitchinterval(INTERVAL / 4)  # let the sampler in on time
    sampler.start()
    run()
    sampler.done.set()
    sampler.join()
    sys.setswitchinterval(switch)
    return seconds, tally, sampler


def print_askable(console: Console, tally: Tally) -> None:
    """How many of the run's replies were ``unsupported``, and the commonest reasons:
    a share of a campaign in the engine's code means something only for cases it can
    be asked."""
    replies = sum(tally.counts.values())
    refused = sum(tally.refused.values())
    console.print(
        f"unsupported: {refused:,} of {replies:,} replies ({refused / max(1, replies):.0%})"
    )
    for reason, n in tally.refused.most_common(3):
        console.print(f"  {n:,}: {reason}")


def function_table(counts: Counter[Where], top: int, total: int) -> Table:
    """The ``top`` functions with the most samples: where each part's time is spent."""
    table = Table(title=f"the {top} functions with the most samples (innermost frame in a part)")
    for column in ("function", "part", "share"):
        table.add_column(column, justify="right" if column == "share" else "left")
    for (part, function), samples in counts.most_common(top):
        table.add_row(function, part, f"{samples / total:.1%}")
    return table


@click.command()
@click.option("--target", default="impl", show_default=True)
@click.option("--cases", default=5000, show_default=True, help="random cases")
@click.option(
    "--campaign",
    type=click.Choice([*sorted(CAMPAIGNS), "stateful"]),
    default="fuzz",
    show_default=True,
    help="stateful: --cases programs of requests on the target's stateful engine",
)
@click.option(
    "--functions",
    default=0,
    show_default=True,
    help="Also list the N functions with the most samples, with their parts.",
)
def main(target: str, cases: int, campaign: str, functions: int) -> None:
    """Print each part's share of one job's time."""
    seconds, tally, sampler = profile(target, cases, campaign)
    counts = sampler.parts()
    checked = tally.cases
    total = sum(counts.values())
    unit = "program" if campaign == "stateful" else "case"
    title = f"{campaign} --target {target} --cases {cases:,}, one job: {checked:,} {unit}s"
    table = Table(title=f"{title} in {seconds:.2f} s ({total:,} samples)")
    for column in ("part", "share", f"per {unit} (µs)"):
        table.add_column(column, justify="left" if column == "part" else "right")
    for part, samples in counts.most_common():
        share = samples / total
        table.add_row(part, f"{share:.0%}", f"{share * seconds / checked * 1e6:,.0f}")
    console = Console(width=120)
    console.print(table)
    print_askable(console, tally)
    if functions:
        console.print(function_table(sampler.counts, functions, total))
    for engine, name in LOOKUPS.items():
        looked = counts[f"the target ({engine}): {name}"]
        own = looked + counts[f"the target ({engine}): building the query's state"]
        if own:
            console.print(
                f"{engine}'s {name}: {looked / own:.0%} of {engine}'s own samples, the most "
                "its share could reach while each query builds its state with the engine's "
                "own calls and kvhit's own work took no time"
            )


if __name__ == "__main__":
    main()
