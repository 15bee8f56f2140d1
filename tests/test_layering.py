"""The package's import graph goes one way: errors and drawing at the bottom,
subsystems in the middle, commands on top; and the gate path loads no solver."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Each module's layer; a module may import only modules of its own layer or below.
LAYERS = [
    ("kvhit", 0),  # the package itself: its version, nothing else
    ("kvhit.model", 0),
    ("kvhit.errors", 1),
    ("kvhit.importing", 1),
    ("kvhit.draw", 1),
    ("kvhit.inputs", 1),
    ("kvhit.check", 1),
    ("kvhit.reference", 1),
    ("kvhit.targets", 1),
    ("kvhit.impl", 2),
    ("kvhit.proofs", 2),
    ("kvhit.harness", 2),
    ("kvhit.adapters", 2),
    ("kvhit.examples", 2),
    ("kvhit.proofs.command", 3),
    ("kvhit.harness.command", 3),
    ("kvhit.verify", 3),
    ("kvhit.cli", 4),
]


def layer(module: str) -> int:
    """The layer of the longest prefix in LAYERS that names ``module``'s package."""
    matches = [(len(p), n) for p, n in LAYERS if module == p or module.startswith(p + ".")]
    assert matches, f"{module} has no layer; add it to LAYERS"
    return max(matches)[1]


def modules() -> dict[str, Path]:
    """Every module of the distribution, by its kvhit.* name (from pyproject's package-dir)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    out = {}
    for package, folder in config["tool"]["setuptools"]["package-dir"].items():
        for path in sorted((ROOT / folder).glob("*.py")):
            name = package if path.stem == "__init__" else f"{package}.{path.stem}"
            out[name] = path
    return out


def imports(path: Path, known: set[str]) -> set[str]:
    """The kvhit modules ``path`` imports anywhere in its code (top level or inside a
    function); ``from kvhit.x import y`` counts as kvhit.x.y when that is a module."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {m for m in found if m in known}


def lazy_references(path: Path, known: set[str]) -> set[str]:
    """The kvhit modules ``path`` names as ``"kvhit.x:attr"`` strings, imported when
    used (the registries of commands, targets and verify sections)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            module, colon, attr = node.value.partition(":")
            if colon and attr.isidentifier():
                found.add(module)
    return {m for m in found if m in known}


def graph(lazy: bool = False) -> dict[str, set[str]]:
    """Each module's kvhit imports (and, with ``lazy``, the modules it names to load)."""
    found = modules()
    known = set(found)
    return {
        name: (imports(path, known) | (lazy_references(path, known) if lazy else set())) - {name}
        for name, path in found.items()
    }


def test_every_import_goes_down_or_sideways() -> None:
    wrong = [
        f"{a} (layer {layer(a)}) imports {b} (layer {layer(b)})"
        for a, deps in graph().items()
        for b in deps
        if layer(b) > layer(a)
    ]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("lazy", [False, True], ids=["imports", "imports-and-lazy-names"])
def test_import_graph_has_no_cycle(lazy: bool) -> None:
    """No cycle of imports, nor of imports and the modules registries name to load
    later (those may point up: the command line names its commands)."""
    edges = graph(lazy)
    assert sum(map(len, edges.values())) > 100
    try:
        list(TopologicalSorter(edges).static_order())
    except CycleError as err:
        raise AssertionError(f"import cycle: {' -> '.join(err.args[1])}") from None


def test_kvhit_gate_does_not_load_z3(tmp_path: Path) -> None:
    """A whole ``kvhit gate`` run (every phase) imports neither z3 nor cvc5; the
    interpreter's own import log says what it imported."""
    run = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "kvhit.cli", "gate", "--target", "model"]
        + ["--seconds", "0.2", "--jobs", "1", "--json", "--out", "found"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    assert set(json.loads(run.stdout)["phases"]) == {"exhaustive", "corpus", "random"}
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if "|" in line}
    assert "kvhit.harness.corpus" in imported and "torch" in imported
    assert not {m for m in imported if m.split(".")[0] in ("z3", "cvc5")}
