"""The patch for each vLLM bug class in docs/upstream/, and the evidence that it fixes it.

Each :class:`Fix` names a class kvhit found in vLLM's prefix-cache lookup (a bug, not
one of the conventions docs/findings-vllm.md lists), the newest release that has it,
its patch (touching only ``vllm/v1/core/kv_cache_coordinator.py`` and
``single_type_kv_cache_manager.py``), the class's scope and documented example.

Run from the repository root in a vLLM environment (scripts/install-vllm.sh)::

    python docs/upstream/evidence.py CLASS... [--releases-dir VENV/vllm]
        [--copies patched,shipped] [--steps exported,matrix_cases,...] [--save]
    python docs/upstream/evidence.py --tables
    python docs/upstream/evidence.py --regenerate

It copies the release folder, applies the patch with ``patch -p1`` and gathers the
evidence with kvhit's own commands, each under ``PYTHONPATH=<copy>``, against the
patched copy and against the release as shipped:

- (a) the class's example exported with ``kvhit export`` as a pytest file in vLLM's
  terms, run under each;
- (b) ``kvhit gate`` on the matrix's cases (every state of the small scopes, the
  solver corpus, 5,000 random cases, seed 0), a random campaign (``kvhit fuzz``) and a
  stateful one (``kvhit fuzz --stateful``), each against :func:`in_class` (or
  :func:`stateful_in_class`): vLLM asked only the queries inside the class's scope and
  outside every other documented class of the release, so that any disagreement is
  one the class explains; and ``kvhit matrix`` (target ``vllm``) for what else remains;
- (c) ``kvhit fuzz --every-state`` over :attr:`Fix.every_state`, bounded scopes inside
  the class (every cache state of those groups and limits).

Each run is printed; with ``--save`` the figures go to
``docs/upstream/evidence/CLASS-COPIES-STEPS.json``, which ``--tables`` reads back as
one markdown table per class (docs/upstream/README.md). ``--regenerate`` writes the
files of ``tests/`` (:func:`generated`); tests/test_generated_files.py checks that the
committed ones are what it writes.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvhit.engines.pytest_writer import ExportEngine, SavedLookup
from kvhit.engines.vllm.divergences import (
    DIVERGENCES,
    Divergence,
    in_release,
    release_key,
    sw,
)
from kvhit.engines.vllm.vllm_pytest import generate
from kvhit.errors import Unsupported
from kvhit.model.protocol import parse_query
from kvhit.model.spec import Query
from kvhit.targets.stateful import Program

HERE = Path(__file__).resolve().parent
TESTS = HERE / "tests"
"""Where each class's example and its exported test are kept."""
CLASS_ENV = "KVHIT_UPSTREAM_CLASS"
"""The environment variable naming the class :func:`in_class` asks vLLM about."""
MATRIX_CASES = 5000
"""Random cases after the scopes and the corpus, as docs/findings-vllm.md's matrix."""


def divergence(name: str) -> Divergence:
    """The documented divergence called ``name``."""
    return next(d for d in DIVERGENCES if d.name == name)


@dataclass(frozen=True)
class Fix:
    """A vLLM bug class (its documented divergence, ``documented``) and its patch
    against ``release``, the newest release that has it (``first`` the oldest).

    ``every_state``: queries whose groups and limits, every cache state of them, are
    the bounded scopes of (c); ``verdict``: the class of the example's reply on the
    release as shipped; ``patched``: on the patched copy; ``kinds``: what the random
    campaign draws.
    """

    key: str
    documented: str
    patch: str
    release: str
    kinds: str
    every_state: tuple[dict[str, Any], ...]
    verdict: str
    patched: str = "ok"

    @property
    def divergence(self) -> Divergence:
        """The class's documented divergence."""
        return divergence(self.documented)

    @property
    def first(self) -> str:
        """The oldest release that has the class."""
        return min((d.first for d in self.entries()), key=release_key)

    def entries(self) -> list[Divergence]:
        """The documented divergences of the class: its own and those of the same scope
        (several examples of one class)."""
        return [d for d in DIVERGENCES if d.scope is self.divergence.scope]

    @property
    def example(self) -> dict[str, Any]:
        """The class's documented example."""
        return self.divergence.example

    @property
    def query(self) -> Query:
        """The example, parsed."""
        return parse_query(self.example)

    @property
    def patch_path(self) -> Path:
        """The patch file."""
        return HERE / self.patch

    def in_release(self, release: str) -> bool:
        """Whether ``release`` has this class."""
        return release_key(self.first) <= release_key(release) <= release_key(self.release)

    def asks(self, q: Query, release: str) -> bool:
        """Whether :func:`in_class` asks vLLM ``q``: inside this class's scope and
        outside the scope of every other documented class of ``release``."""
        return self.asks_any([q], release)

    def asks_any(self, queries: list[Query], release: str) -> bool:
        """Whether one of ``queries`` is inside this class's scope and none inside the
        scope of another documented class of ``release``."""
        mine = self.divergence.scope
        others = {d.scope for d in in_release(release)} - {mine}
        return any(mine(q) for q in queries) and not any(
            scope(q) for scope in others for q in queries
        )


STATEFUL_TOKENS = 64
"""The request lengths a stateful engine's configuration is judged at: 1 … 64 tokens,
the hit bound one less (some scopes read M and T)."""


def lengths(groups: tuple[Any, ...], alignment: int) -> list[Query]:
    """Empty queries of these groups for every request length :data:`STATEFUL_TOKENS`
    covers."""
    empty = tuple(() for _ in groups)
    return [Query(groups, empty, t - 1, t, alignment) for t in range(1, STATEFUL_TOKENS + 1)]


def full(block_size: int, **more: Any) -> dict[str, Any]:
    """A full attention group object."""
    return {"kind": "full", "block_size": block_size, **more}


def mamba(block_size: int, **more: Any) -> dict[str, Any]:
    """A Mamba group object."""
    return {"kind": "mamba", "block_size": block_size, **more}


def chunked(chunk: int, block_size: int) -> dict[str, Any]:
    """A chunked local group object."""
    return {"kind": "chunked_local", "block_size": block_size, "chunk": chunk}


def looks_ahead(group: dict[str, Any], tokens: int) -> dict[str, Any]:
    """The group with a lookahead drafter of ``tokens``."""
    return {**group, "eagle": False, "drafter": "lookahead", "lookahead": tokens}


def scope(*groups: dict[str, Any], m: int, t: int | None = None) -> dict[str, Any]:
    """A query of these groups at M = m (T = t, default M + 1), rows empty: an
    every-state scope."""
    q: dict[str, Any] = {"groups": list(groups), "cached": [""] * len(groups), "max_length": m}
    return q if t is None else {**q, "num_tokens": t}


FIXES = (
    Fix(
        "1",
        "eagle drop not re-checked after another eagle group lowers the hit",
        "1-eagle-drop-recheck.patch",
        "0.34.0",
        "sliding_window,eagle",
        (
            scope(sw(2, eagle=True), sw(3, eagle=True), m=5, t=7),
            scope(sw(3, 2, eagle=True), sw(5, 2, eagle=True), full(2), m=6, t=9),
        ),
        "unsafe",
    ),
    Fix(
        "1a",
        "eagle lookup not widened by the margin, and the drop repeated on every pass",
        "1a-eagle-margin-once.patch",
        "0.19.0",
        "full,sliding_window,mamba,eagle",
        (
            scope(sw(4, eagle=True), mamba(1), m=5, t=7),
            scope(sw(2, eagle=True), sw(3, eagle=True), full(1, eagle=True), m=3, t=5),
        ),
        "lost_reuse",
    ),
    Fix(
        "2",
        "chunk start taken from the lookup bound, rounded down to a block",
        "2-chunk-start.patch",
        "0.34.0",
        "chunked_local,full,sliding_window",
        (
            scope(chunked(3, 2), m=21),
            scope(chunked(5, 2), full(2), m=13),
            scope(chunked(4, 3), m=30),
        ),
        "unsafe",
    ),
    Fix(
        "3",
        "eagle window prefix run aligned before the drop",
        "3-eagle-window-align.patch",
        "0.34.0",
        "full,sliding_window,eagle",
        (
            scope(sw(4, eagle=True), full(2), m=8, t=11),
            scope(sw(6, eagle=True), full(3), m=9, t=12),
        ),
        "lost_reuse",
    ),
    Fix(
        "4",
        "unitary coordinator: eagle lookup capped at max_length",
        "4-unitary-eagle-margin.patch",
        "0.34.0",
        "full,sliding_window,eagle",
        (
            scope(full(2, eagle=True), m=21, t=24),
            scope(sw(5, 2, eagle=True), m=21, t=24),
            scope(sw(2, 1, eagle=True), m=10, t=12),
        ),
        "lost_reuse",
    ),
    Fix(
        "7",
        "SlidingWindowManager asserts on the partial hash hits a Mamba group turns on",
        "7-partial-hits-sliding-window.patch",
        "0.27.0",
        "full,sliding_window,mamba,hash_unit",
        (
            scope(sw(3), mamba(2), sw(3, 2), m=6),
            scope(full(1), mamba(2), sw(4, 2), m=6),
        ),
        "crash",
        patched="unsupported",
    ),
    Fix(
        "9",
        "only the first full attention group's blocks are cut to the hit",
        "9-truncate-every-full-group.patch",
        "0.28.0",
        "full,sliding_window,mamba",
        (
            scope(full(1), full(2), sw(2, 2), m=6),
            scope(full(2), full(4), mamba(2), m=8),
        ),
        "wrong_blocks",
    ),
    Fix(
        "lookahead",
        "with lookahead hashes, a lookup bounded by M reads past the request's hashes",
        "lookahead-hashes.patch",
        "0.34.0",
        "sliding_window,chunked_local,mamba,drafter",
        (
            scope(mamba(2, drafter="lookahead", lookahead=2), m=20, t=21),
            scope(looks_ahead(sw(3, 2), 2), m=20, t=21),
            scope(mamba(2), looks_ahead(sw(3, 2), 2), m=10, t=11),
            scope(mamba(4), looks_ahead(sw(5, 2), 3), m=12, t=13),
            scope(looks_ahead(chunked(2, 2), 2), m=20, t=21),
        ),
        "crash",
    ),
)
"""Every vLLM bug class kvhit names, with its patch."""


def fix_named(key: str) -> Fix:
    """The fix of class ``key``; KeyError naming the classes if there is none."""
    for fix in FIXES:
        if fix.key == key:
            return fix
    raise KeyError(f"no class {key!r}; the classes: {', '.join(f.key for f in FIXES)}")


def generated() -> dict[Path, str]:
    """Every file this module generates in :data:`TESTS`, with its text: each class's
    example (``example-CLASS.json``) and its test, as ``kvhit export example-CLASS.json
    --engine vllm`` writes it in that folder (``test_upstream_CLASS.py``). Needs no vLLM."""
    files = {}
    for fix in FIXES:
        example = TESTS / f"example-{fix.key}.json"
        files[example] = json.dumps(fix.example) + "\n"
        saved = SavedLookup(example.name, fix.query, ExportEngine.VLLM)
        files[TESTS / f"test_upstream_{fix.key}.py"] = generate(saved)
    return files


def chosen() -> Fix:
    """The fix :data:`CLASS_ENV` names."""
    return fix_named(os.environ[CLASS_ENV])


def in_class(query: dict[str, Any]) -> dict[str, Any]:
    """A target: vLLM's answer to a query inside the chosen class (and no other
    documented class of the installed release), else :class:`Unsupported`."""
    from kvhit.engines.vllm.target import RELEASE, vllm_target

    fix, q = chosen(), parse_query(query)
    if not fix.asks(q, RELEASE.name):
        raise Unsupported(f"outside class {fix.key}, or inside another documented class")
    return vllm_target(query)


def stateful_in_class(config: dict[str, Any]) -> Any:
    """A stateful target: vLLM's KVCacheManager for an engine whose groups and
    alignment are inside the chosen class at some request length and inside no other
    documented class at any (:func:`lengths`), else :class:`Unsupported`."""
    from kvhit.engines.vllm.manager import VllmManagerEngine
    from kvhit.engines.vllm.target import RELEASE

    program = Program.from_json(config)
    if not chosen().asks_any(lengths(program.groups, program.alignment), RELEASE.name):
        raise Unsupported("outside the class, or inside another documented class")
    return VllmManagerEngine(config)


def release_folder(release: str, root: Path) -> Path:
    """The installed folder of ``release`` under ``root`` (it holds ``vllm/``)."""
    return root / release


def apply(patch: Path, folder: Path, fuzz: int = 0) -> subprocess.CompletedProcess[str]:
    """``patch -p1`` inside ``folder``; the completed process (its output says why
    when it fails). ``fuzz`` 0 applies only where every context line matches."""
    return subprocess.run(
        ["patch", "-p1", "--forward", "--batch", f"--fuzz={fuzz}", "-i", str(patch)],
        cwd=folder,
        capture_output=True,
        text=True,
        check=False,
    )


def copy_release(source: Path, into: Path) -> Path:
    """A copy of the release folder ``source`` as ``into``/RELEASE: hard links, but for
    the two files the patches change (patch replaces a file it changes, so the links
    would stay intact anyway)."""
    folder = into / source.name
    shutil.copytree(source, folder, copy_function=os.link, symlinks=True)
    for name in ("kv_cache_coordinator.py", "single_type_kv_cache_manager.py"):
        path = folder / "vllm" / "v1" / "core" / name
        text = path.read_bytes()
        path.unlink()
        path.write_bytes(text)
    return folder


def patched_copy(fix: Fix, source: Path, into: Path, fuzz: int = 0) -> Path:
    """:func:`copy_release` with the fix's patch applied; RuntimeError with patch's
    output if it does not apply."""
    folder = copy_release(source, into)
    done = apply(fix.patch_path, folder, fuzz)
    if done.returncode != 0:
        raise RuntimeError(f"{fix.patch} does not apply to {source}:\n{done.stdout}{done.stderr}")
    return folder


@dataclass
class Runner:
    """Runs kvhit under one vLLM folder (patched or not), class :data:`CLASS_ENV` set."""

    fix: Fix
    folder: Path
    work: Path
    label: str

    def env(self) -> dict[str, str]:
        """The environment: the folder first on the path, then this directory."""
        path = os.pathsep.join([str(self.folder), str(HERE)])
        return {**os.environ, "PYTHONPATH": path, CLASS_ENV: self.fix.key}

    def run(self, *args: str) -> dict[str, Any]:
        """``kvhit ARGS --json``: its exit code, seconds and JSON report."""
        start = time.monotonic()
        done = subprocess.run(
            [sys.executable, "-m", "kvhit.cli", *args, "--json"],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        lines = done.stdout.strip().splitlines()
        return {
            "command": "kvhit " + " ".join(args),
            "exit": done.returncode,
            "seconds": round(time.monotonic() - start, 1),
            "report": json.loads(lines[-1]) if lines else None,
            "stderr": done.stderr[-2000:] if done.returncode not in (0, 1) else "",
        }

    def out(self, name: str) -> str:
        """A folder for a run's counterexamples."""
        return str(self.work / self.label / name)

    def matrix_cases(self) -> dict[str, Any]:
        """(b) the gate on the matrix's cases, vLLM asked only inside the class."""
        return self.run(
            "gate",
            "--target",
            "evidence:in_class",
            "--keep-going",
            "--seconds",
            "86400",
            "--cases",
            str(MATRIX_CASES),
            "--seed",
            "0",
            "--jobs",
            "1",
            "--out",
            self.out("gate"),
        )

    def random(self, seconds: int) -> dict[str, Any]:
        """(b) a random campaign of ``seconds``, drawing the class's kinds."""
        return self.run(
            "fuzz",
            "--target",
            "evidence:in_class",
            "--seconds",
            str(seconds),
            "--kinds",
            self.fix.kinds,
            "--jobs",
            "1",
            "--out",
            self.out("fuzz"),
        )

    def stateful(self, seconds: int) -> dict[str, Any]:
        """(b) a stateful campaign of ``seconds``."""
        return self.run(
            "fuzz",
            "--stateful",
            "--target",
            "evidence:stateful_in_class",
            "--seconds",
            str(seconds),
            "--jobs",
            "1",
            "--out",
            self.out("stateful"),
        )

    def every_state(self) -> dict[str, Any]:
        """(c) every cache state of the class's scopes."""
        scopes = self.work / f"scopes-{self.fix.key}.json"
        scopes.write_text("".join(json.dumps(q) + "\n" for q in self.fix.every_state))
        return self.run(
            "fuzz",
            "--every-state",
            str(scopes),
            "--target",
            "evidence:in_class",
            "--jobs",
            "1",
            "--out",
            self.out("every-state"),
        )

    def matrix(self) -> dict[str, Any]:
        """What else remains: ``kvhit matrix`` (target vllm) on this folder."""
        return self.run(
            "matrix",
            "--vllm",
            self.fix.release,
            "--releases-dir",
            str(self.folder.parent),
            "--cases",
            str(MATRIX_CASES),
            "--jobs",
            "1",
            "--out",
            self.out("matrix"),
        )

    def exported(self) -> dict[str, Any]:
        """(a) the class's example exported as a vLLM test, run with pytest."""
        example = self.work / f"example-{self.fix.key}.json"
        example.write_text(json.dumps(self.fix.example))
        test = self.work / self.label / f"test_upstream_{self.fix.key.replace('-', '_')}.py"
        test.parent.mkdir(parents=True, exist_ok=True)
        made = subprocess.run(
            [
                sys.executable,
                "-m",
                "kvhit.cli",
                "export",
                str(example),
                "--engine",
                "vllm",
                "-o",
                str(test),
            ],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        if made.returncode != 0:
            return {"command": "kvhit export", "exit": made.returncode, "summary": [made.stderr]}
        done = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(test)],
            env=self.env(),
            capture_output=True,
            text=True,
            check=False,
        )
        return {
            "command": f"pytest {test.name}",
            "exit": done.returncode,
            "summary": done.stdout.strip().splitlines()[-1:],
        }


STEPS = ("exported", "matrix_cases", "every_state", "random", "stateful", "matrix")


def gather(
    fix: Fix, root: Path, steps: tuple[str, ...], seconds: dict[str, int], copies: tuple[str, ...]
) -> dict[str, Any]:
    """The steps of the evidence, against the patched copy and the release as shipped
    (``copies``: which of ``patched`` and ``shipped``)."""
    figures: dict[str, Any] = {"class": fix.key, "release": fix.release, "patch": fix.patch}
    with tempfile.TemporaryDirectory(prefix=f"upstream-{fix.key}-") as tmp:
        work = Path(tmp)
        shipped = release_folder(fix.release, root)
        patched = patched_copy(fix, shipped, work / "patched")
        folders = {"patched": patched, "shipped": shipped}
        for label in copies:
            folder = folders[label]
            runner = Runner(fix, folder, work, label)
            figures[label] = {}
            for step in steps:
                call = getattr(runner, step)
                result = call(seconds[step]) if step in seconds else call()
                figures[label][step] = result
                print(f"{fix.key} {label} {step}: {summary(result)}", flush=True)
    return figures


def counts_of(result: dict[str, Any]) -> Any:
    """The counts of a run's report (a matrix: its one row's)."""
    report = result.get("report") or {}
    if "rows" in report:
        report = report["rows"][0]
    return report.get("counts") or result.get("summary")


def summary(result: dict[str, Any]) -> str:
    """One line: exit code, seconds and counts."""
    counts = counts_of(result)
    return f"exit {result['exit']} in {result.get('seconds', '?')} s: {counts}"


COLUMNS = ("ok", "unsafe", "lost_reuse", "wrong_blocks", "crash", "timeout", "bad_return")
"""The classes a table shows (``unsupported`` is the rest)."""


def cell(result: dict[str, Any] | None) -> str:
    """A table cell: the counts that are not zero, and the exit code."""
    if result is None:
        return "not run"
    counts = counts_of(result)
    if not isinstance(counts, dict):
        return f"{'; '.join(counts or [])} (exit {result['exit']})"
    shown = ", ".join(
        f"{k} {counts[k]:,}" for k in (*COLUMNS, "unsupported", "rejected") if counts.get(k)
    )
    return f"{shown} (exit {result['exit']})"


def table(fix: Fix) -> str:
    """The markdown table of the class's saved evidence (``evidence/CLASS-*.json``)."""
    runs: dict[str, dict[str, Any]] = {"patched": {}, "shipped": {}}
    for path in sorted((HERE / "evidence").glob(f"{fix.key}-*.json")):
        saved = json.loads(path.read_text())
        for label in runs:
            runs[label].update(saved.get(label, {}))
    lines = [
        f"vLLM {fix.release} patched with `{fix.patch}`, and as shipped (random campaign: "
        f"`--kinds {fix.kinds}`):",
        "",
        "| step | patched | shipped |",
        "|---|---|---|",
    ]
    for step in STEPS:
        patched, shipped = runs["patched"].get(step), runs["shipped"].get(step)
        if patched is not None or shipped is not None:
            lines.append(f"| {step} | {cell(patched)} | {cell(shipped)} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    """Gather the evidence for the classes named on the command line, or print the
    tables of the saved evidence (``--tables``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("classes", nargs="*", help=", ".join(f.key for f in FIXES))
    parser.add_argument("--releases-dir", default=str(Path(sys.prefix) / "vllm"))
    parser.add_argument("--random-seconds", type=int, default=300)
    parser.add_argument("--stateful-seconds", type=int, default=60)
    parser.add_argument("--steps", default=",".join(STEPS))
    parser.add_argument("--copies", default="patched,shipped")
    parser.add_argument("--save", action="store_true", help="write evidence/CLASS-COPIES.json")
    parser.add_argument("--tables", action="store_true", help="print the saved evidence")
    parser.add_argument(
        "--regenerate", action="store_true", help="write each example and its test in tests/"
    )
    args = parser.parse_args()
    if args.regenerate:
        for path, text in generated().items():
            path.write_text(text, encoding="utf-8")
        return
    if args.tables:
        for fix in FIXES:
            print(f"{fix.key}:\n\n{table(fix)}")
        return
    seconds = {"random": args.random_seconds, "stateful": args.stateful_seconds}
    for key in args.classes:
        fix = fix_named(key)
        steps, copies = tuple(args.steps.split(",")), tuple(args.copies.split(","))
        figures = gather(fix, Path(args.releases_dir), steps, seconds, copies)
        if args.save:
            out = HERE / "evidence" / f"{fix.key}-{'-'.join(copies)}-{'-'.join(steps)}.json"
            out.parent.mkdir(exist_ok=True)
            out.write_text(json.dumps(figures, indent=1) + "\n")


if __name__ == "__main__":
    main()
