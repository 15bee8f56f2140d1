"""What the command line shows while work runs: one progress bar (for campaigns of
cases or programs and for ``kvhit prove``), and counts by class.

    >>> from collections import Counter
    >>> counts_text(Counter({"rejected": 2, "unsafe": 1, "ok": 7}))
    'ok 7  unsafe 1  rejected 2'
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, Progress, ProgressColumn, TextColumn, TimeElapsedColumn

from kvhit.harness.compare import ReplyClass
from kvhit.harness.tally import OnProgress, Tally

REFRESH = 0.1  # seconds between two updates of a campaign's bar


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
    """Counts by class, in the order of :class:`ReplyClass` (ok, the disagreements
    worst first, unsupported, rejected), e.g. ``ok 120  unsafe 3``."""
    return "  ".join(f"{cls} {counts[cls]}" for cls in ReplyClass if counts[cls])


@contextmanager
def campaign_bar(
    console: Console, description: str, total: int | None
) -> Iterator[tuple[OnProgress, OnProgress]]:
    """A bar of ``total`` cases or programs (when known) with what was checked and the
    counts; yields the callback a run reports its tally to (at most every
    :data:`REFRESH` seconds shown) and the one that shows the final tally."""
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
