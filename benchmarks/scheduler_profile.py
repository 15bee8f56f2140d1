"""Steps per second of vLLM's own scheduler step loop (the ``vllm-scheduler`` target),
and where its time goes, sampled by whose code runs.

Run (in the vLLM environment): ``python benchmarks/scheduler_profile.py [--steps N]
[--seed S] [--hybrid] [--asynchronous]``. One engine
(:class:`kvhit.engines.vllm.scheduler_engine.VllmSchedulerEngine`: one full attention
group of blocks of 4 tokens, or with ``--hybrid`` a full attention and a Mamba group
of 8, A and the hash unit 4; a pool of 64 blocks; a budget of 16 tokens per step) runs N steps of a
random loop, as a step campaign drives it: before each step a request may arrive (a
prompt of 4 to 40 tokens sharing a prefix with an earlier one half the time, 1 to 8
tokens to generate) and a live one may be aborted; then the step is scheduled and
reported (kvhit plays the executor: a token for each request whose step reaches its
prompt's end), one late with ``--asynchronous``. The loop runs in this thread while
the sampler of ``campaign_profile.py`` counts every millisecond the part of the
innermost frame that belongs to one (vLLM, kvhit's adapter, the harness, ...; this
loop, kvhit's executor, is "the rest"). Its vLLM parts are split by whether vLLM's
``find_longest_cache_hit`` is on the stack (the lookup), the rest of vLLM being the
scheduler's own work.

Printed: steps per second (unsampled, a second run of the same seed), the samples of
each part, and the share of vLLM's own code (the goal: at least half).
"""

from __future__ import annotations

import random
import sys
import threading
import time
from collections import deque

import click
from campaign_profile import INTERVAL, Sampler
from rich.console import Console
from rich.table import Table

from kvhit.contract import EngineConfig, Ran, StepPlan, StepResult
from kvhit.engines.vllm.scheduler_engine import VllmSchedulerEngine
from kvhit.engines.vllm.target import RELEASE
from kvhit.model.spec import Group

FULL = (Group("full", 4),)
HYBRID = (Group("full", 4), Group("mamba", 8))


class ProfiledLoop:
    """The random loop of arrivals, aborts and steps on one engine (module docstring)."""

    def __init__(self, seed: int, hybrid: bool, asynchronous: bool):
        groups = HYBRID if hybrid else FULL
        unit = 4 if hybrid else None  # vLLM's partial hash hits land Mamba hits on 4
        config = EngineConfig(groups, 64, 4, unit, budget=16, asynchronous=asynchronous)
        self.engine = VllmSchedulerEngine(config)
        self.rng = random.Random(seed)
        self.prompts: dict[int, list[int]] = {}
        self.live: set[int] = set()
        self.waiting: deque[StepPlan] = deque()
        self.late = 1 if asynchronous else 0

    def prompt(self) -> list[int]:
        """A new prompt: half the time an earlier one's prefix and new tokens."""
        rng = self.rng
        tail = [rng.randrange(1000) for _ in range(rng.randint(4, 40))]
        if self.prompts and rng.random() < 0.5:
            earlier = rng.choice(list(self.prompts.values()))
            return earlier[: rng.randint(1, len(earlier))] + tail[: rng.randint(1, len(tail))]
        return tail

    def step(self) -> None:
        """Perhaps an arrival and an abort, then one step scheduled and the oldest
        unreported one reported."""
        rng, engine = self.rng, self.engine
        if rng.random() < 0.4:
            request = len(self.prompts)
            self.prompts[request] = self.prompt()
            engine.arrive(request, self.prompts[request], rng.randint(1, 8))
            self.live.add(request)
        if self.live and rng.random() < 0.05:
            request = rng.choice(sorted(self.live))
            engine.abort(request)
            self.live.discard(request)
        self.waiting.append(engine.schedule())
        if len(self.waiting) > self.late:
            plan = self.waiting.popleft()
            ran = tuple(
                Ran(s.request, (1,) if s.end >= len(self.prompts[s.request]) else ())
                for s in plan.scheduled
            )
            self.live -= set(engine.executed(StepResult(ran)))


def timed(steps: int, seed: int, hybrid: bool, asynchronous: bool) -> float:
    """Seconds for ``steps`` steps of the loop (the engine built before the clock)."""
    loop = ProfiledLoop(seed, hybrid, asynchronous)
    start = time.perf_counter()
    for _ in range(steps):
        loop.step()
    return time.perf_counter() - start


def sampled(steps: int, seed: int, hybrid: bool, asynchronous: bool) -> Sampler:
    """The samples of ``steps`` steps of the loop."""
    loop = ProfiledLoop(seed, hybrid, asynchronous)
    sampler = Sampler(threading.get_ident())
    switch = sys.getswitchinterval()
    sys.setswitchinterval(INTERVAL / 4)  # let the sampler in on time
    sampler.start()
    for _ in range(steps):
        loop.step()
    sampler.done.set()
    sampler.join()
    sys.setswitchinterval(switch)
    return sampler


@click.command()
@click.option("--steps", default=2000, show_default=True, help="steps of the loop")
@click.option("--seed", default=0, show_default=True)
@click.option("--hybrid", is_flag=True, help="a full attention and a Mamba group")
@click.option("--asynchronous", is_flag=True, help="vLLM's AsyncScheduler, reported one late")
def main(steps: int, seed: int, hybrid: bool, asynchronous: bool) -> None:
    """Print steps per second and the share of samples in each part."""
    seconds = timed(steps, seed, hybrid, asynchronous)
    parts = sampled(steps, seed, hybrid, asynchronous).parts()
    total = sum(parts.values())
    console = Console()
    console.print(
        f"vLLM {RELEASE.name}, {'hybrid' if hybrid else 'full attention'}, "
        f"{'asynchronous' if asynchronous else 'synchronous'}: {steps} steps in "
        f"{seconds:.2f} s, {steps / seconds:.0f} steps/s"
    )
    table = Table("part", "samples", "share")
    for part, count in parts.most_common():
        table.add_row(part, str(count), f"{count / total:.1%}")
    console.print(table)
    vllm = sum(count for part, count in parts.items() if "(vLLM)" in part)
    console.print(f"vLLM's own code: {vllm / total:.1%} of {total} samples")


if __name__ == "__main__":
    main()
