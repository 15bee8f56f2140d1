"""What the command line shows while work runs: one progress bar (for campaigns of
cases or programs and for ``kvhit prove``), and counts by class.

    >>> from collections import Counter
    >>> counts_text(Counter({"rejected": 2, "unsafe": 1, "ok": 7}))
    'ok 7  unsafe 1  rejected 2'
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn
from rich.text import Text

from kvhit.analysis import Verdict
from kvhit.harness.tally import OnProgress, Tally

REFRESH = 0.1  # seconds between two updates of a campaign's bar
HEARTBEAT = 15.0  # seconds between two lines of a campaign whose output is not a terminal


def progress_bar(
    console: Console, count: ProgressColumn, *extra: ProgressColumn, transient: bool = False
) -> Progress:
    """A bar: the task's description, the bar, ``count``, the time taken, then ``extra``."""
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        count,
        TimeElapsedColumn(),
        *extra,
        console=console,
        transient=transient,
    )


def counts_text(counts: Counter[str]) -> str:
    """Counts by class, in the order of :class:`~kvhit.analysis.Verdict` (ok, the disagreements
    worst first, unsupported, rejected), e.g. ``ok 120  unsafe 3``."""
    return "  ".join(f"{cls} {counts[cls]}" for cls in Verdict if counts[cls])


@contextmanager
def campaign_bar(
    console: Console, description: str, total: int | None, every: float = HEARTBEAT
) -> Iterator[tuple[OnProgress, OnProgress]]:
    """A bar of ``total`` cases or programs (when known) with what was checked and the
    counts; yields the callback a run reports its tally to (at most every
    :data:`REFRESH` seconds shown) and the one that shows the final tally. Output that
    is not a terminal gets :func:`heartbeat` lines instead, one ``every`` seconds."""
    if not console.is_terminal:
        with heartbeat(console, description, every) as tick:
            yield tick, tick
        return
    checked = TextColumn("{task.fields[checked]}")
    with progress_bar(console, checked, TextColumn("{task.fields[counts]}")) as progress:
        task = progress.add_task(description, total=total, checked="", counts="")
        shown = [0.0]

        def show(tally: Tally) -> None:
            progress.update(
                task,
                completed=tally.cases,
                checked=tally.checked(),
                counts=counts_text(tally.counts),
            )

        def tick(tally: Tally) -> None:
            now = time.monotonic()
            if now - shown[0] > REFRESH:
                shown[0] = now
                show(tally)

        def done(tally: Tally) -> None:
            progress.update(task, total=tally.cases)
            show(tally)

        yield tick, done


@contextmanager
def heartbeat(console: Console, description: str, every: float) -> Iterator[OnProgress]:
    """Plain lines for output that is not a terminal (a pipe, a file, CI): one when
    the run starts, then what was checked so far and its counts every ``every``
    seconds, also while the target loads or a call runs long. Yields the callback a
    run reports its tally to."""
    latest: list[Tally | None] = [None]
    start = time.monotonic()
    stop = threading.Event()

    def beat() -> None:
        while not stop.wait(every):
            tally, took = latest[0], time.monotonic() - start
            done = f"{tally.checked()}: {counts_text(tally.counts)}" if tally else "no case yet"
            console.print(Text(f"{description}: {took:.0f} s, {done}"))

    def tick(tally: Tally) -> None:
        latest[0] = tally

    console.print(Text(f"{description}: started (a line every {every:g} s)"))
    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield tick
    finally:
        stop.set()
        thread.join()
