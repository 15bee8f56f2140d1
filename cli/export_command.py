"""``kvhit export FILE``: a saved counterexample as a pytest file in the engine's terms.

The file (a saved disagreement, a plain query, or a saved stateful program) is read
by :func:`kvhit.harness.saved.decode`, as ``kvhit replay`` reads it; the engine's generator (:data:`GENERATORS`) writes the
test. Every problem is one
``error: ...`` line and exit code 2.
"""

from __future__ import annotations

from pathlib import Path

import click

from kvhit.analysis import Verdict
from kvhit.engines.pytest_writer import ExportEngine, SavedLookup, SavedProgram, engine_of
from kvhit.errors import BadInput
from kvhit.harness.saved import CaseFile, ProgramFile, StepsFile, decode
from kvhit.importing import import_attr
from kvhit.inputs import read_text
from kvhit.model.protocol import QueryError
from kvhit.targets.stateful import Admission, check_admit, decode_admit
from kvhit.targets.target_record import TargetRecord
from kvhit.targets.wire import BadReturn

GENERATORS = {
    ExportEngine.VLLM: "kvhit.engines.vllm.vllm_pytest:generate",
    ExportEngine.SGLANG: "kvhit.engines.sglang.sglang_pytest:generate",
}
"""Each engine's generator, imported when used (it needs no engine installed)."""


NO_TIERS = (
    "cannot be exported: the generated test drives the engine's own pool, which has no "
    "tiers (replay it with kvhit replay)"
)


def chosen_engine(source: str, given: str | None, target: TargetRecord | None) -> ExportEngine:
    """The engine given, else the one the file's recorded target drives."""
    if given is not None:
        if given not in tuple(ExportEngine):
            raise BadInput(f"--engine {given!r}: expected one of {', '.join(ExportEngine)}")
        return ExportEngine(given)
    found = engine_of(target)
    if found is None:
        recorded = f"records target {target.label!r}" if target else "records no target"
        raise BadInput(f"{source} {recorded}: give --engine ({', '.join(ExportEngine)})")
    return found


def saved_program(source: str, saved: ProgramFile, given: str | None) -> SavedProgram:
    """A saved stateful disagreement, to export."""
    if saved.cls is None:
        raise BadInput(f"{source}: a plain program, not a saved disagreement: nothing failed")
    if saved.program.tiers:
        raise BadInput(f"{source}: an engine with external stores {NO_TIERS}")
    return SavedProgram(
        source,
        saved.program,
        chosen_engine(source, given, saved.target),
        saved.cls,
        str(saved.reason),
        saved.snapshot,
        saved.target_answer,
    )


def saved_lookup(source: str, saved: CaseFile, given: str | None) -> SavedLookup:
    """A saved stateless disagreement (or a plain query), to export."""
    if saved.query.tiers:
        raise BadInput(f"{source}: a query with tiers {NO_TIERS}")
    return SavedLookup(
        source,
        saved.query,
        chosen_engine(source, given, saved.target),
        saved.cls,
        saved.target_answer,
        saved.reason,
    )


def hit_shows(saved: SavedProgram) -> None:
    """BadInput unless what disagreed shows in the engine's own calls: a crash, or an
    admit's hit other than the correct one (a stale or overwritten block the ledger
    found under a correct hit does not)."""
    if saved.cls == Verdict.CRASH:
        return
    if saved.cls not in HIT_CLASSES or saved.correct is None:
        raise BadInput(
            f"{saved.source}: a {saved.cls} is not exported: only a wrong hit or a crash "
            "shows in the engine's own calls"
        )
    admitted = check_admit(decode_admit(saved.answer), saved.program.config())
    correct = (saved.correct.length, [list(b) for b in saved.correct.blocks])
    listed = admitted.listed() if isinstance(admitted, Admission) else None
    if listed is None or (listed["length"], listed["blocks"]) == correct:
        raise BadInput(
            f"{saved.source}: the engine's hit is the correct one; what disagreed is in "
            f"the blocks' contents, which a hit does not show ({saved.reason})"
        )


HIT_CLASSES = (Verdict.UNSAFE, Verdict.LOST_REUSE, Verdict.WRONG_BLOCKS)


def read_saved(source: str, given: str | None) -> SavedLookup | SavedProgram:
    """What ``source`` holds, with the engine to export it for; BadInput naming the
    file on any problem."""
    text = read_text(source)
    try:
        saved = decode(text)
        if isinstance(saved, CaseFile):
            return saved_lookup(source, saved, given)
        if isinstance(saved, StepsFile):
            raise BadInput(
                f"{source}: a step program; kvhit export writes tests of lookups and of "
                "atomic programs (replay it with kvhit replay)"
            )
        program = saved_program(source, saved, given)
        hit_shows(program)
        return program
    except (QueryError, BadReturn) as err:
        raise BadInput(f"{source}: {err}") from None


@click.command()
@click.argument("file")
@click.option(
    "--engine",
    metavar="|".join(ExportEngine),
    help="The engine (default: the one the file's recorded target drives).",
)
@click.option("-o", "--out", metavar="OUT.py", help="Write the test here (default: stdout).")
def export(file: str, engine: str | None, out: str | None) -> None:
    """Write FILE (- for stdin), a saved counterexample, as one standalone pytest file
    in the engine's own terms, asserting the correct hit (kvhit's spec answer)."""
    saved = read_saved(file, engine)
    text = import_attr(GENERATORS[saved.engine])(saved)
    if out is None:
        click.echo(text, nl=False)
        return
    try:
        Path(out).write_text(text, encoding="utf-8")
    except OSError as err:
        raise BadInput(f"-o: cannot write {out}: {err.strerror or err}") from None
    click.echo(f"{file}: {saved.engine} test written to {out}", err=True)
